//! Compression on the stream (issue 19 §1): a payload or a binlog segment is compressed
//! as it is uploaded and decompressed as it is read, never staged whole. What an object
//! holds is recorded beside its size and sha256 (`payload[].compression` in
//! `metadata.json`, `compression` in a segment's index entry); size and sha256 are those of
//! the stored bytes, so a pass or a check reads no more than it did. An object without the
//! field is stored as it came (every backup written before compression existed).
//!
//! zstd frames carry their own checksum (set here), so a decompressed stream is checked
//! twice: the stored bytes against the recorded sha256, the content against the frame's.

use std::fmt;
use std::io::Write;
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
                    Some(l) if l.len() <= 2 && l.bytes().all(|b| b.is_ascii_digit()) => {
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

    /// A compressor for one object (`None`: as they come).
    ///
    /// # Errors
    /// zstd refused the parameters.
    pub fn compressor(self) -> std::io::Result<Option<Compressor>> {
        match self {
            Compression::None => Ok(None),
            Compression::Zstd { level, workers } => {
                let mut e = zstd::stream::write::Encoder::new(Vec::new(), level)?;
                e.include_checksum(true)?;
                if workers > 0 {
                    e.multithread(workers)?;
                }
                Ok(Some(Compressor { encoder: e }))
            }
        }
    }
}

/// Compresses one object's bytes as they pass.
pub struct Compressor {
    encoder: zstd::stream::write::Encoder<'static, Vec<u8>>,
}

impl fmt::Debug for Compressor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compressor").finish_non_exhaustive()
    }
}

impl Compressor {
    /// Takes `chunk`; returns the compressed bytes ready so far (often none: zstd
    /// gathers a block, or its workers a job, first).
    ///
    /// # Errors
    /// zstd failed.
    pub fn push(&mut self, chunk: &[u8]) -> std::io::Result<Vec<u8>> {
        self.encoder.write_all(chunk)?;
        Ok(std::mem::take(self.encoder.get_mut()))
    }

    /// The rest of the compressed bytes: the frame's end and checksum.
    ///
    /// # Errors
    /// zstd failed.
    pub fn finish(self) -> std::io::Result<Vec<u8>> {
        self.encoder.finish()
    }
}

/// Decompresses one object's bytes as they pass, for an object recorded as `compression`.
pub struct Decompressor {
    raw: zstd::stream::raw::Decoder<'static>,
    /// zstd's hint after the last call: 0 once a frame is whole and flushed.
    hint: usize,
}

impl fmt::Debug for Decompressor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decompressor").finish_non_exhaustive()
    }
}

/// Output buffer per call into zstd.
const OUT_CHUNK: usize = 256 << 10;

/// An object recorded with a compression this version does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("compressed with {0:?}, which this version of tidemark cannot read (it reads zstd)")]
pub struct UnknownCompression(pub String);

impl Decompressor {
    /// The decompressor for an object recorded as `compression` (`None`: as it came).
    ///
    /// # Errors
    /// A compression this version does not read.
    pub fn for_recorded(compression: Option<&str>) -> Result<Option<Self>, UnknownCompression> {
        match compression {
            None => Ok(None),
            Some(ZSTD) => zstd::stream::raw::Decoder::new()
                .map(|raw| Some(Decompressor { raw, hint: 0 }))
                .map_err(|e| UnknownCompression(format!("zstd ({e})"))),
            Some(other) => Err(UnknownCompression(other.chars().take(64).collect())),
        }
    }

    /// Takes stored bytes; returns the content decompressed so far.
    ///
    /// # Errors
    /// The bytes are not a valid zstd stream (or fail its checksum).
    pub fn push(&mut self, chunk: &[u8]) -> std::io::Result<Vec<u8>> {
        use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
        let mut input = InBuffer::around(chunk);
        let mut content = Vec::new();
        let mut out = vec![0u8; OUT_CHUNK];
        loop {
            let before = input.pos();
            let mut output = OutBuffer::around(&mut out[..]);
            let hint = self.raw.run(&mut input, &mut output)?;
            let (written, full) = (output.pos(), output.pos() == OUT_CHUNK);
            // A call that moved nothing (more output wanted after a frame ended) says
            // nothing new about where the stream stands.
            if written > 0 || input.pos() > before {
                self.hint = hint;
            }
            content.extend_from_slice(&out[..written]);
            // Done with this chunk once it is consumed and zstd had room to spare.
            if input.pos() == chunk.len() && !full {
                return Ok(content);
            }
        }
    }

    /// The rest of the content; an error when the stored bytes ended inside a frame.
    ///
    /// # Errors
    /// The stream was cut short.
    pub fn finish(mut self) -> std::io::Result<Vec<u8>> {
        let rest = self.push(&[])?;
        if self.hint != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the zstd stream ends inside a frame (the object is cut short)",
            ));
        }
        Ok(rest)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn settings_parse_and_print() {
        assert_eq!("none".parse::<Compression>().unwrap(), Compression::None);
        assert_eq!("zstd".parse::<Compression>().unwrap(), Compression::zstd(3));
        assert_eq!(
            "zstd:19".parse::<Compression>().unwrap(),
            Compression::zstd(19)
        );
        assert_eq!(Compression::zstd(7).to_string(), "zstd:7");
        for bad in [
            "", "gzip", "zstd:", "zstd:0", "zstd:20", "zstd:-1", "zstd:3x", "none:1", "zstd:003",
        ] {
            let e = bad.parse::<Compression>().unwrap_err();
            assert!(e.to_string().contains(COMPRESSION_FORM), "{bad}: {e}");
        }
    }

    #[test]
    fn a_stream_survives_the_round_trip_chunk_by_chunk() {
        let data: Vec<u8> = (0..3_000_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        for c in [
            Compression::zstd(1),
            Compression::Zstd {
                level: 3,
                workers: 0,
            },
        ] {
            let mut comp = c.compressor().unwrap().unwrap();
            let mut stored = Vec::new();
            for chunk in data.chunks(100_000) {
                stored.extend(comp.push(chunk).unwrap());
            }
            stored.extend(comp.finish().unwrap());
            assert!(stored.len() < data.len() / 4, "{}", stored.len());
            let mut d = Decompressor::for_recorded(c.recorded()).unwrap().unwrap();
            let mut back = Vec::new();
            for chunk in stored.chunks(77_777) {
                back.extend(d.push(chunk).unwrap());
            }
            back.extend(d.finish().unwrap());
            assert!(back == data, "{c}: the content differs");
        }
    }

    #[test]
    fn damaged_or_unknown_streams_are_errors() {
        assert_eq!(
            Decompressor::for_recorded(Some("lz4")).unwrap_err(),
            UnknownCompression("lz4".into())
        );
        assert!(Decompressor::for_recorded(None).unwrap().is_none());
        let mut comp = Compression::zstd(3).compressor().unwrap().unwrap();
        let mut stored = comp.push(&[7u8; 100_000]).unwrap();
        stored.extend(comp.finish().unwrap());
        // A flipped byte in the middle: zstd's frame checksum (or its block format) says so.
        let mut flipped = stored.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0xff;
        let mut d = Decompressor::for_recorded(Some(ZSTD)).unwrap().unwrap();
        let r = d.push(&flipped).and_then(|_| d.finish());
        assert!(r.is_err(), "a damaged stream decompressed");
        // Cut short: the frame never ends.
        let mut d = Decompressor::for_recorded(Some(ZSTD)).unwrap().unwrap();
        let r = d.push(&stored[..stored.len() - 6]).and_then(|_| d.finish());
        assert!(r.is_err(), "a truncated stream decompressed");
    }
}
