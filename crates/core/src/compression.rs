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
/// The highest level of a stream compressed inside the shared operator (method `exec`),
/// which compresses in the stream's own thread (no zstd workers): an encoder at level 6
/// holds under 10 MiB (its tables and a 2 MiB window; `tidemark_store::compress` tests
/// it), so a compressed exec stream costs about 24 + 10 MiB. Level 19 with 4 workers took
/// 693 MB for one stream (issue 28). A higher level asked for is lowered, and the
/// Backup's status says so; `tidemark push` and backup Jobs compress at the level asked.
pub const EXEC_MAX_LEVEL: i32 = 6;
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
    /// zstd at `level`, with one worker thread per core (up to 4), as `zstd -T0` runs: the
    /// stream's own thread mostly waits for them (reading, hashing and sending cost little
    /// beside compression), so a worker fewer than the cores leaves a core idle — on 2 cores
    /// that was half the compression speed (issue 32). `available_parallelism` counts the
    /// cores this process may use (affinity, the cgroup's CPU limit).
    pub fn zstd(level: i32) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let workers = u32::try_from(cores.min(4)).unwrap_or(0);
        Compression::Zstd { level, workers }
    }

    /// The same setting within `max_level`, compressed in the calling thread (no workers):
    /// what a stream the operator compresses in its own process may cost (issue 28: one
    /// `zstd:19` stream with 4 workers took 693 MB). `None` when nothing changed.
    pub fn bounded(self, max_level: i32) -> Option<Self> {
        match self {
            Compression::None => None,
            Compression::Zstd { level, workers } => {
                let within = Compression::Zstd {
                    level: level.min(max_level),
                    workers: 0,
                };
                (level > max_level || workers > 0).then_some(within)
            }
        }
    }

    /// The name recorded for objects written so (`None`: as they come).
    pub fn recorded(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Zstd { .. } => Some(ZSTD),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One zstd worker per core the process may use, up to 4 (a worker fewer left one of
    /// two cores idle: issue 32).
    #[test]
    fn zstd_gets_a_worker_per_core() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        assert_eq!(
            Compression::zstd(3),
            Compression::Zstd {
                level: 3,
                workers: u32::try_from(cores.min(4)).unwrap()
            }
        );
    }

    #[test]
    fn bounded_lowers_the_level_and_drops_workers() {
        let asked = Compression::Zstd {
            level: 19,
            workers: 4,
        };
        assert_eq!(
            asked.bounded(6),
            Some(Compression::Zstd {
                level: 6,
                workers: 0
            })
        );
        // Within the level, threads still go.
        let asked = Compression::Zstd {
            level: 3,
            workers: 1,
        };
        assert_eq!(
            asked.bounded(6),
            Some(Compression::Zstd {
                level: 3,
                workers: 0
            })
        );
        let within = Compression::Zstd {
            level: 6,
            workers: 0,
        };
        assert_eq!(within.bounded(6), None);
        assert_eq!(Compression::None.bounded(6), None);
    }
}
