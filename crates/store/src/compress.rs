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

pub use tidemark_core::compression::{
    COMPRESSION_FORM, Compression, CompressionError, DEFAULT_LEVEL, MAX_LEVEL, ZSTD, ZSTD_SUFFIX,
};

/// A compressor for one object written as `compression` (`None`: as it comes).
///
/// # Errors
/// zstd refused the parameters.
pub fn compressor(compression: Compression) -> std::io::Result<Option<Compressor>> {
    match compression {
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
            "zstd:03",
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
            let mut comp = compressor(c).unwrap().unwrap();
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
        let mut comp = compressor(Compression::zstd(3)).unwrap().unwrap();
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
