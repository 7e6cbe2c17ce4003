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

pub use tidemark_core::compression::{
    COMPRESSION_FORM, Compression, CompressionError, DEFAULT_LEVEL, MAX_LEVEL, ZSTD, ZSTD_SUFFIX,
};

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

/// The largest window (as a power of two) a zstd frame may ask a reader for: what
/// Tidemark's encoder writes at [`MAX_LEVEL`] (zstd's level 19 uses 2^23 = 8 MiB; lower
/// levels less). zstd's own default is 2^27, and a few hundred stored bytes may declare it:
/// every frame asking for more is refused before its window is allocated (issue 28).
pub const MAX_WINDOW_LOG: u32 = 23;

/// Output buffer per call into zstd.
pub const OUT_CHUNK: usize = 256 << 10;

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
                .and_then(|mut raw| {
                    raw.set_parameter(zstd::stream::raw::DParameter::WindowLogMax(MAX_WINDOW_LOG))?;
                    Ok(Some(Decompressor { raw, hint: 0 }))
                })
                .map_err(|e| UnknownCompression(format!("zstd ({e})"))),
            Some(other) => Err(UnknownCompression(other.chars().take(64).collect())),
        }
    }

    /// Decompresses from `input` into `out`: how much of `input` it used and how much of
    /// `out` it filled. Call again with the rest of `input` while it used less than all of
    /// it or filled `out` whole — the content of a small input can be huge (a run of zeros),
    /// so it is handed over a bounded buffer at a time.
    ///
    /// # Errors
    /// The bytes are not a valid zstd stream (or fail its checksum).
    pub fn step(&mut self, input: &[u8], out: &mut [u8]) -> std::io::Result<(usize, usize)> {
        use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
        let mut inb = InBuffer::around(input);
        let mut outb = OutBuffer::around(out);
        let hint = self.raw.run(&mut inb, &mut outb).map_err(|e| {
            // zstd's words for a frame over `WindowLogMax`; say what it means here.
            if e.to_string().contains("too much memory") {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "the zstd frame asks for a window over {} MiB, more than tidemark \
                         ever writes (an object tidemark did not compress?): refused unread",
                        (1u32 << MAX_WINDOW_LOG) >> 20
                    ),
                )
            } else {
                e
            }
        })?;
        let (used, written) = (inb.pos(), outb.pos());
        // A call that moved nothing (more output wanted after a frame ended) says nothing
        // new about where the stream stands.
        if used > 0 || written > 0 {
            self.hint = hint;
        }
        Ok((used, written))
    }

    /// Whether the stored bytes so far end on a whole frame; an error when they stop inside
    /// one (the object is cut short).
    ///
    /// # Errors
    /// The stream was cut short.
    pub fn check_end(&self) -> std::io::Result<()> {
        if self.hint != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the zstd stream ends inside a frame (the object is cut short)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The codec's encoder for `c`, unencrypted.
    fn compressor(c: Compression) -> crate::codec::Encoder {
        crate::codec::Encoder::new(c, None).unwrap().unwrap()
    }

    /// All of `stored` decompressed at once (readers of objects use `step`).
    fn decompress(d: &mut Decompressor, stored: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut content = Vec::new();
        let mut out = vec![0u8; OUT_CHUNK];
        let mut pos = 0;
        loop {
            let (used, written) = d.step(&stored[pos..], &mut out)?;
            pos += used;
            content.extend_from_slice(&out[..written]);
            if pos == stored.len() && written < OUT_CHUNK {
                return Ok(content);
            }
        }
    }

    /// What one stream encoder holds once it has seen a few MiB, at `level`, single-threaded.
    fn encoder_bytes(level: i32) -> usize {
        use zstd::zstd_safe::{CCtx, CParameter, InBuffer, OutBuffer, zstd_sys};
        let mut c = CCtx::create();
        c.set_parameter(CParameter::CompressionLevel(level))
            .unwrap();
        c.set_parameter(CParameter::ChecksumFlag(true)).unwrap();
        let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
        let mut out = vec![0u8; 1 << 20];
        let mut input = InBuffer::around(&data);
        while input.pos < data.len() {
            let mut o = OutBuffer::around(&mut out[..]);
            c.compress_stream2(
                &mut o,
                &mut input,
                zstd_sys::ZSTD_EndDirective::ZSTD_e_continue,
            )
            .unwrap();
        }
        c.sizeof()
    }

    /// Issue 28 finding 3: a stream compressed inside the operator, at the highest level it
    /// allows, adds under 10 MiB to the stream's 24 MiB; the levels it lowers would not.
    #[test]
    fn an_encoder_at_the_operators_level_fits_its_budget() {
        let at_exec = encoder_bytes(tidemark_core::compression::EXEC_MAX_LEVEL);
        assert!(
            at_exec < 10 << 20,
            "level {}: {at_exec} bytes",
            tidemark_core::compression::EXEC_MAX_LEVEL
        );
        let at_max = encoder_bytes(MAX_LEVEL);
        assert!(at_max > 32 << 20, "level {MAX_LEVEL}: {at_max} bytes");
    }

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
            let mut comp = compressor(c);
            let mut stored = Vec::new();
            for chunk in data.chunks(100_000) {
                stored.extend(comp.push(chunk).unwrap());
            }
            stored.extend(comp.finish().unwrap());
            assert!(stored.len() < data.len() / 4, "{}", stored.len());
            let mut d = Decompressor::for_recorded(c.recorded()).unwrap().unwrap();
            let mut back = Vec::new();
            for chunk in stored.chunks(77_777) {
                back.extend(decompress(&mut d, chunk).unwrap());
            }
            back.extend(decompress(&mut d, &[]).unwrap());
            d.check_end().unwrap();
            assert!(back == data, "{c}: the content differs");
        }
    }

    /// A few KiB of stored bytes can hold GiB of content (runs of zeros, as in InnoDB's
    /// preallocated files): a reader gets it a bounded buffer at a time.
    #[test]
    fn huge_content_comes_a_buffer_at_a_time() {
        let mut comp = compressor(Compression::Zstd {
            level: 3,
            workers: 0,
        });
        let zeros = vec![0u8; 1 << 20];
        let mut stored = Vec::new();
        for _ in 0..256 {
            stored.extend(comp.push(&zeros).unwrap());
        }
        stored.extend(comp.finish().unwrap());
        assert!(stored.len() < 64 << 10, "{}", stored.len());
        let mut d = Decompressor::for_recorded(Some(ZSTD)).unwrap().unwrap();
        let mut out = vec![0u8; OUT_CHUNK];
        let (mut total, mut calls) = (0usize, 0usize);
        let mut pos = 0;
        loop {
            let (used, written) = d.step(&stored[pos..], &mut out).unwrap();
            pos += used;
            total += written;
            calls += 1;
            assert!(out[..written].iter().all(|&b| b == 0));
            if pos == stored.len() && written < out.len() {
                break;
            }
        }
        d.check_end().unwrap();
        assert_eq!(total, 256 << 20);
        assert!(calls >= (256 << 20) / OUT_CHUNK, "{calls}");
    }

    /// zstd input as another encoder writes it: `window_log` set explicitly, the content
    /// size left out of the frame header (as a stream's is).
    fn foreign_frame(level: i32, window_log: u32, content: &[u8]) -> Vec<u8> {
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), level).unwrap();
        e.window_log(window_log).unwrap();
        e.include_checksum(true).unwrap();
        std::io::Write::write_all(&mut e, content).unwrap();
        e.finish().unwrap()
    }

    /// Finding 4 of issue 28: a frame may declare any window up to zstd's own limit (128
    /// MiB by default, 2 GiB when asked), and the decoder allocates it whole before the first
    /// byte of content. A bucket writer's small object must not cost more to check than
    /// Tidemark's own encoder ever asks for.
    #[test]
    fn a_window_larger_than_tidemark_writes_is_refused() {
        // Tidemark's own encoder, at its largest level, with workers and a large input:
        // within the bound.
        let data: Vec<u8> = (0..24_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for c in [
            Compression::zstd(MAX_LEVEL),
            Compression::Zstd {
                level: MAX_LEVEL,
                workers: 2,
            },
        ] {
            let mut comp = compressor(c);
            let mut stored = Vec::new();
            for chunk in data.chunks(1 << 20) {
                stored.extend(comp.push(chunk).unwrap());
            }
            stored.extend(comp.finish().unwrap());
            let mut d = Decompressor::for_recorded(Some(ZSTD)).unwrap().unwrap();
            let back = decompress(&mut d, &stored).unwrap();
            d.check_end().unwrap();
            assert!(back == data, "{c}: the content differs");
        }
        // The same bound, reached by hand, is still read.
        let zeros = vec![0u8; 4 << 20];
        let at_bound = foreign_frame(1, MAX_WINDOW_LOG, &zeros);
        let mut d = Decompressor::for_recorded(Some(ZSTD)).unwrap().unwrap();
        assert_eq!(decompress(&mut d, &at_bound).unwrap().len(), zeros.len());
        // One past it, a few hundred bytes long: refused before the window is allocated.
        let bomb = foreign_frame(1, MAX_WINDOW_LOG + 1, &zeros);
        assert!(bomb.len() < 4096, "{}", bomb.len());
        let mut d = Decompressor::for_recorded(Some(ZSTD)).unwrap().unwrap();
        let e = decompress(&mut d, &bomb).unwrap_err();
        assert!(e.to_string().contains("window"), "{e}");
    }

    #[test]
    fn damaged_or_unknown_streams_are_errors() {
        assert_eq!(
            Decompressor::for_recorded(Some("lz4")).unwrap_err(),
            UnknownCompression("lz4".into())
        );
        assert!(Decompressor::for_recorded(None).unwrap().is_none());
        let mut comp = compressor(Compression::zstd(3));
        let mut stored = comp.push(&[7u8; 100_000]).unwrap();
        stored.extend(comp.finish().unwrap());
        // A flipped byte in the middle: zstd's frame checksum (or its block format) says so.
        let mut flipped = stored.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0xff;
        let mut d = Decompressor::for_recorded(Some(ZSTD)).unwrap().unwrap();
        let r = decompress(&mut d, &flipped).and_then(|_| d.check_end());
        assert!(r.is_err(), "a damaged stream decompressed");
        // Cut short: the frame never ends.
        let mut d = Decompressor::for_recorded(Some(ZSTD)).unwrap().unwrap();
        let r = decompress(&mut d, &stored[..stored.len() - 6]).and_then(|_| d.check_end());
        assert!(r.is_err(), "a truncated stream decompressed");
    }
}
