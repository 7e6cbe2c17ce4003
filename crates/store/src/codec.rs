//! What happens to an object's bytes between the source and the store, and back: content →
//! zstd (when compressed) → age (when encrypted) → stored bytes on the way up; the reverse
//! on the way down. The work is CPU-bound, so it runs off the async runtime: an upload
//! hands each chunk to a blocking task, and a read runs one blocking thread per object fed
//! through bounded channels (at most a few MiB in flight whatever the object's size).
//!
//! A payload's or segment's record says how it was stored (`compression`, `encryption`);
//! reads follow the record, never the store's current settings, so rotating keys or
//! changing compression leaves every older object readable.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::compress::{Compression, Decompressor, OUT_CHUNK};
use crate::crypt::{AGE, Identities, Recipients};

pub use crate::format::Form;

/// Why an object cannot be decoded here, found before any byte is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// A compression or encryption scheme this version does not read.
    Scheme(String),
    /// Encrypted, and no identity given matches a recipient it was encrypted to.
    NoIdentity {
        recipients: Vec<String>,
        have: Vec<String>,
    },
}

/// Checks that an object written as `form` can be decoded with `identities`.
///
/// # Errors
/// An unknown scheme; encrypted to nobody whose identity is here.
pub fn check(form: Form<'_>, identities: Option<&Identities>) -> Result<(), Unreadable> {
    if let Some(c) = form.compression {
        Decompressor::for_recorded(Some(c)).map_err(|e| Unreadable::Scheme(e.to_string()))?;
    }
    if let Some(e) = form.encryption {
        if e.scheme != AGE {
            return Err(Unreadable::Scheme(format!(
                "encrypted with {:?}, which this version of tidemark cannot read (it reads age)",
                e.scheme.chars().take(64).collect::<String>()
            )));
        }
        if !identities.is_some_and(|i| i.opens(e)) {
            return Err(Unreadable::NoIdentity {
                recipients: e.recipients.iter().take(16).cloned().collect(),
                have: identities
                    .map(|i| i.fingerprints().to_vec())
                    .unwrap_or_default(),
            });
        }
    }
    Ok(())
}

/// zstd encoders with worker threads alive in this process. Each holds its workers' job
/// buffers (a few MiB at the levels accepted); past one per core, more threads only add
/// memory, so further encoders compress in the uploading task's blocking thread.
static THREADED_ENCODERS: AtomicUsize = AtomicUsize::new(0);

fn threaded_encoder_limit() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// A slot among [`THREADED_ENCODERS`], given back when the encoder goes.
#[derive(Debug)]
struct ThreadSlot;

impl ThreadSlot {
    fn take() -> Option<Self> {
        THREADED_ENCODERS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < threaded_encoder_limit()).then_some(n + 1)
            })
            .ok()
            .map(|_| ThreadSlot)
    }
}

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        THREADED_ENCODERS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where the last stage writes: taken after each chunk.
#[derive(Debug, Clone, Default)]
struct Tap(Arc<Mutex<Vec<u8>>>);

impl Tap {
    fn take(&self) -> Vec<u8> {
        match self.0.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }
}

impl Write for Tap {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.0.lock() {
            Ok(mut v) => v.extend_from_slice(buf),
            Err(poisoned) => poisoned.into_inner().extend_from_slice(buf),
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

enum Sealed {
    Plain(Tap),
    Age(age::stream::StreamWriter<Tap>),
}

impl Write for Sealed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sealed::Plain(t) => t.write(buf),
            Sealed::Age(w) => w.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sealed::Plain(t) => t.flush(),
            Sealed::Age(w) => w.flush(),
        }
    }
}

impl Sealed {
    fn finish(self) -> std::io::Result<()> {
        match self {
            Sealed::Plain(_) => Ok(()),
            Sealed::Age(w) => w.finish().map(drop),
        }
    }
}

enum Stages {
    Direct(Sealed),
    Zstd(zstd::stream::write::Encoder<'static, Sealed>),
}

/// Turns one object's content into its stored bytes (compressing, encrypting).
pub struct Encoder {
    stages: Stages,
    tap: Tap,
    _slot: Option<ThreadSlot>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").finish_non_exhaustive()
    }
}

impl Encoder {
    /// The encoder for a new object compressed as `compression` and encrypted to
    /// `recipients`; `None` when it is stored as it comes.
    ///
    /// # Errors
    /// zstd refused its parameters; age could not start (no randomness).
    pub fn new(
        compression: Compression,
        recipients: Option<&Recipients>,
    ) -> std::io::Result<Option<Self>> {
        if compression == Compression::None && recipients.is_none() {
            return Ok(None);
        }
        let tap = Tap::default();
        let sealed = match recipients {
            Some(r) => Sealed::Age(r.encryptor()?.wrap_output(tap.clone())?),
            None => Sealed::Plain(tap.clone()),
        };
        let (stages, slot) = match compression {
            Compression::None => (Stages::Direct(sealed), None),
            Compression::Zstd { level, workers } => {
                let mut e = zstd::stream::write::Encoder::new(sealed, level)?;
                e.include_checksum(true)?;
                let slot = if workers > 0 {
                    ThreadSlot::take()
                } else {
                    None
                };
                if slot.is_some() {
                    e.multithread(workers)?;
                }
                (Stages::Zstd(e), slot)
            }
        };
        Ok(Some(Encoder {
            stages,
            tap,
            _slot: slot,
        }))
    }

    /// Takes `chunk`; returns the stored bytes ready so far (often none: zstd gathers a
    /// block, age a 64 KiB chunk).
    ///
    /// # Errors
    /// zstd or age failed.
    pub fn push(&mut self, chunk: &[u8]) -> std::io::Result<Vec<u8>> {
        match &mut self.stages {
            Stages::Direct(s) => s.write_all(chunk)?,
            Stages::Zstd(e) => e.write_all(chunk)?,
        }
        Ok(self.tap.take())
    }

    /// The rest of the stored bytes: zstd's frame end, age's last chunk.
    ///
    /// # Errors
    /// zstd or age failed.
    pub fn finish(self) -> std::io::Result<Vec<u8>> {
        match self.stages {
            Stages::Direct(s) => s.finish()?,
            Stages::Zstd(e) => e.finish()?.finish()?,
        }
        Ok(self.tap.take())
    }
}

/// Stored chunks in flight to a decoding thread, and content chunks back.
const CHANNEL_DEPTH: usize = 4;

/// A decoding thread for one object: stored bytes go in, content comes out.
#[derive(Debug)]
pub(crate) struct Decoding {
    pub input: mpsc::Sender<Bytes>,
    pub output: mpsc::Receiver<Bytes>,
    pub thread: tokio::task::JoinHandle<Result<(), String>>,
}

/// Starts decoding an object written as `form` (checked with [`check`] first).
pub(crate) fn decoding(form: Form<'_>, identities: Option<Arc<Identities>>) -> Decoding {
    let (input, rx) = mpsc::channel(CHANNEL_DEPTH);
    let (tx, output) = mpsc::channel(CHANNEL_DEPTH);
    let compression = form.compression.map(str::to_owned);
    let encrypted = form.encryption.is_some();
    let thread = tokio::task::spawn_blocking(move || {
        decode(compression.as_deref(), encrypted, identities, rx, &tx)
    });
    Decoding {
        input,
        output,
        thread,
    }
}

/// Reads the chunks sent to a decoding thread.
struct Incoming {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl Read for Incoming {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.current = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        bytes::Buf::advance(&mut self.current, n);
        Ok(n)
    }
}

/// The most an age header may take (a stanza per recipient, 16 recipients: a few KiB).
const MAX_AGE_HEADER: u64 = 1 << 20;

/// Reads at most [`MAX_AGE_HEADER`] bytes until `done` says the header was read. (Bytes
/// buffered past the header count too: the cap is far above both.)
struct HeaderCap {
    inner: Incoming,
    read: u64,
    done: Arc<std::sync::atomic::AtomicBool>,
}

impl Read for HeaderCap {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.done.load(Ordering::Acquire) && self.read >= MAX_AGE_HEADER {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("no age header within its first {MAX_AGE_HEADER} bytes"),
            ));
        }
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// The body of a decoding thread. Returns the first problem with the content; a reader that
/// went away ends it quietly.
fn decode(
    compression: Option<&str>,
    encrypted: bool,
    identities: Option<Arc<Identities>>,
    rx: mpsc::Receiver<Bytes>,
    tx: &mpsc::Sender<Bytes>,
) -> Result<(), String> {
    let incoming = Incoming {
        rx,
        current: Bytes::new(),
    };
    let mut reader: Box<dyn Read> = if encrypted {
        let ids = identities.ok_or("no identity to decrypt with")?;
        // age reads its header line by line with no bound: a stored object with no end of
        // line would be read into memory whole. The header is cut at MAX_AGE_HEADER.
        let header_read = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let capped = HeaderCap {
            inner: incoming,
            read: 0,
            done: header_read.clone(),
        };
        let d = age::Decryptor::new_buffered(std::io::BufReader::with_capacity(64 << 10, capped))
            .map_err(|e| format!("not a readable age file: {e}"))?;
        header_read.store(true, Ordering::Release);
        Box::new(
            d.decrypt(ids.as_age())
                .map_err(|e| format!("age could not decrypt it: {e}"))?,
        )
    } else {
        Box::new(incoming)
    };
    let mut decompressor = Decompressor::for_recorded(compression).map_err(|e| e.to_string())?;
    let mut inbuf = vec![0u8; OUT_CHUNK];
    let mut out = vec![0u8; OUT_CHUNK];
    let send = |bytes: &[u8]| -> bool {
        bytes.is_empty() || tx.blocking_send(Bytes::copy_from_slice(bytes)).is_ok()
    };
    loop {
        let n = match reader.read(&mut inbuf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(if encrypted {
                    format!("age could not decrypt it (damaged or cut short): {e}")
                } else {
                    e.to_string()
                });
            }
        };
        let Some(d) = decompressor.as_mut() else {
            if !send(&inbuf[..n]) {
                return Ok(());
            }
            continue;
        };
        let mut pos = 0;
        loop {
            let (used, written) = d
                .step(&inbuf[pos..n], &mut out)
                .map_err(|e| e.to_string())?;
            pos += used;
            if !send(&out[..written]) {
                return Ok(());
            }
            if pos == n && written < out.len() {
                break;
            }
        }
    }
    if let Some(d) = decompressor.as_mut() {
        loop {
            let (_, written) = d.step(&[], &mut out).map_err(|e| e.to_string())?;
            if !send(&out[..written]) {
                return Ok(());
            }
            if written < out.len() {
                break;
            }
        }
        d.check_end().map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn roundtrip(
        compression: Compression,
        recipients: Option<&Recipients>,
        ids: Option<Arc<Identities>>,
        content: &[u8],
        damage: impl FnOnce(&mut Vec<u8>),
    ) -> Result<Vec<u8>, String> {
        let mut stored = Vec::new();
        let mut enc = Encoder::new(compression, recipients).unwrap().unwrap();
        for c in content.chunks(100_000) {
            stored.extend(enc.push(c).unwrap());
        }
        stored.extend(enc.finish().unwrap());
        damage(&mut stored);
        let record = recipients.map(Recipients::record);
        let form = Form {
            compression: compression.recorded(),
            encryption: record.as_ref(),
        };
        let Decoding {
            input,
            mut output,
            thread,
        } = decoding(form, ids);
        let feed = async move {
            for c in stored.chunks(7_777) {
                if input.send(Bytes::copy_from_slice(c)).await.is_err() {
                    break;
                }
            }
        };
        let drain = async {
            let mut got = Vec::new();
            while let Some(b) = output.recv().await {
                got.extend_from_slice(&b);
            }
            got
        };
        let ((), got) = tokio::join!(feed, drain);
        thread.await.unwrap().map(|()| got)
    }

    fn content() -> Vec<u8> {
        (0..3_000_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 13) as u8)
            .collect()
    }

    #[tokio::test]
    async fn every_form_round_trips_and_damage_is_found() {
        let (id_text, public) = crate::crypt::generate();
        let r = Recipients::parse(&[public]).unwrap().unwrap();
        let ids = Arc::new(Identities::parse(&id_text, "t").unwrap());
        let data = content();
        for (c, rec) in [
            (Compression::zstd(3), None),
            (Compression::None, Some(&r)),
            (Compression::zstd(1), Some(&r)),
            (
                Compression::Zstd {
                    level: 3,
                    workers: 0,
                },
                Some(&r),
            ),
        ] {
            let got = roundtrip(c, rec, Some(ids.clone()), &data, |_| {})
                .await
                .unwrap();
            assert!(got == data, "{c:?} encrypted={}", rec.is_some());
            let cut = roundtrip(c, rec, Some(ids.clone()), &data, |s| {
                s.truncate(s.len() - 20);
            })
            .await;
            assert!(cut.is_err(), "{c:?}: a cut object decoded");
            if rec.is_some() {
                let flipped = roundtrip(c, rec, Some(ids.clone()), &data, |s| {
                    let at = s.len() / 2;
                    s[at] ^= 1;
                })
                .await
                .unwrap_err();
                assert!(flipped.contains("age"), "{flipped}");
            }
        }
    }

    #[tokio::test]
    async fn a_wrong_identity_is_refused_before_reading() {
        let (_, public) = crate::crypt::generate();
        let (other_text, _) = crate::crypt::generate();
        let r = Recipients::parse(&[public]).unwrap().unwrap();
        let other = Identities::parse(&other_text, "t").unwrap();
        let e = r.record();
        let form = Form {
            compression: None,
            encryption: Some(&e),
        };
        match check(form, Some(&other)) {
            Err(Unreadable::NoIdentity { recipients, have }) => {
                assert_eq!(recipients, e.recipients);
                assert_eq!(have, other.fingerprints());
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            check(form, None),
            Err(Unreadable::NoIdentity { .. })
        ));
        // And age agrees: decoding with it fails.
        let got = roundtrip(
            Compression::None,
            Some(&r),
            Some(Arc::new(other)),
            b"secret",
            |_| {},
        )
        .await;
        assert!(got.unwrap_err().contains("decrypt"));
    }

    /// A stored object that never ends its first line is refused after a bounded read, not
    /// gathered into memory.
    #[tokio::test]
    async fn an_endless_age_header_is_cut() {
        let (id_text, public) = crate::crypt::generate();
        let r = Recipients::parse(&[public]).unwrap().unwrap();
        let e = r.record();
        let ids = Arc::new(Identities::parse(&id_text, "t").unwrap());
        let Decoding {
            input,
            mut output,
            thread,
        } = decoding(
            Form {
                compression: None,
                encryption: Some(&e),
            },
            Some(ids),
        );
        let feed = async move {
            let line = Bytes::from(vec![b'a'; 1 << 20]);
            let mut sent = 0u64;
            // 64 MiB offered; the decoder stops taking long before.
            while sent < 64 << 20 && input.send(line.clone()).await.is_ok() {
                sent += line.len() as u64;
            }
            sent
        };
        let drain = async { while output.recv().await.is_some() {} };
        let (sent, ()) = tokio::join!(feed, drain);
        let err = thread.await.unwrap().unwrap_err();
        assert!(err.contains("age header"), "{err}");
        assert!(sent < 16 << 20, "{sent} bytes taken");
    }

    #[test]
    fn ciphertext_holds_no_plaintext() {
        let (_, public) = crate::crypt::generate();
        let r = Recipients::parse(&[public]).unwrap().unwrap();
        let marker = b"PLAINTEXT-MARKER-1234567890";
        let content: Vec<u8> = marker.iter().copied().cycle().take(1 << 20).collect();
        let mut enc = Encoder::new(Compression::None, Some(&r)).unwrap().unwrap();
        let mut stored = enc.push(&content).unwrap();
        stored.extend(enc.finish().unwrap());
        assert!(stored.len() > content.len());
        assert!(!stored.windows(marker.len()).any(|w| w == marker));
    }

    #[test]
    fn threaded_encoders_are_bounded() {
        let many: Vec<_> = (0..threaded_encoder_limit() + 3)
            .map(|_| Encoder::new(Compression::zstd(3), None).unwrap().unwrap())
            .collect();
        let threaded = many.iter().filter(|e| e._slot.is_some()).count();
        assert!(threaded <= threaded_encoder_limit(), "{threaded}");
        assert!(many.iter().filter(|e| e._slot.is_none()).count() >= 3);
    }
}
