//! How new payloads and binlog segments are compressed (issue 19 §1): the setting users
//! give (`none`, `zstd`, `zstd:<level>`) and the name recorded per object. The codec itself
//! is the store's (`tidemark_store::compress`).

use std::fmt;
use std::str::FromStr;

/// The name recorded for zstd (`"compression": "zstd"`).
pub const ZSTD: &str = "zstd";
/// The zstd level when none is given: zstd's own default, fast enough to keep up with a
/// backup stream on one core.
pub const DEFAULT_LEVEL: i32 = 3;
/// The highest level accepted (zstd's "ultra" levels above it need large windows to
/// decompress, which a restore must not depend on).
pub const MAX_LEVEL: i32 = 19;
/// The suffix a compressed payload's object name gets (`backup.xbstream.zst`), so that one
/// reading the bucket with other tools sees what it holds. Segment names keep their
/// grammar (`mysql-bin.000042`); their index entry says it.
pub const ZSTD_SUFFIX: &str = ".zst";

/// How new objects are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// As they come.
    #[default]
    None,
    /// zstd at `level` (1–19), with `workers` threads of zstd's own (0: in the calling
    /// thread).
    Zstd { level: i32, workers: u32 },
}

/// The CEL rule of a compression setting in a resource (the same grammar as the code's).
pub const COMPRESSION_RULE: &str = "self.matches('^(none|zstd(:([1-9]|1[0-9]))?)$')";

/// What `--compression` accepts.
pub const COMPRESSION_FORM: &str = "none, zstd or zstd:<level> (level 1–19, default 3)";

/// A compression setting that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("compression {value:?}: expected {COMPRESSION_FORM}")]
pub struct CompressionError {
    pub value: String,
}

impl FromStr for Compression {
    type Err = CompressionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CompressionError {
            value: s.chars().take(64).collect(),
        };
        let (name, level) = match s.split_once(':') {
            Some((n, l)) => (n, Some(l)),
            None => (s, None),
        };
        match (name, level) {
            ("none", None) => Ok(Compression::None),
            ("zstd", level) => {
                let level = match level {
                    None => DEFAULT_LEVEL,
                    Some(l)
                        if l.len() <= 2
                            && !l.starts_with('0')
                            && l.bytes().all(|b| b.is_ascii_digit()) =>
                    {
                        l.parse().map_err(|_| err())?
                    }
                    Some(_) => return Err(err()),
                };
                if !(1..=MAX_LEVEL).contains(&level) {
                    return Err(err());
                }
                Ok(Compression::zstd(level))
            }
            _ => Err(err()),
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Zstd { level, .. } => write!(f, "zstd:{level}"),
        }
    }
}

impl Compression {
    /// zstd at `level`, with one worker thread per core beyond the first (up to 4): the
    /// stream's own thread keeps reading and sending meanwhile.
    pub fn zstd(level: i32) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let workers = u32::try_from(cores.saturating_sub(1).min(4)).unwrap_or(0);
        Compression::Zstd { level, workers }
    }

    /// The name recorded for objects written so (`None`: as they come).
    pub fn recorded(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Zstd { .. } => Some(ZSTD),
        }
    }
}
