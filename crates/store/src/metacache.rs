//! The metadata cache (issue 32 §2): `<cluster>/_state/metadata-cache.json.zst` holds the
//! bodies of committed `metadata.json` files, each with the entity tag and size the store
//! gave it, so that a steady pass reads only the metadata of new or changed backups.
//!
//! The cache is a hint, never a source of truth:
//!
//! - A body is taken from it only for a key the listing of this very load yields, with the
//!   same entity tag and size as the listing gives, of exactly that many bytes, and whose
//!   MD5 *is* that entity tag (issue 42 §4): the tag the store computed from the object it
//!   holds (S3's for a single-part upload, as Tidemark writes `metadata.json`; GCS's XML
//!   API gives the same for a simple upload). So a forged cache — the listing's keys, tags
//!   and sizes with other bodies — cannot stand in for an object: its bodies do not hash to
//!   the tags. A tag that is not an MD5 (a multipart upload's `…-N`, Azure's `0x8D…`,
//!   whose listed Content-MD5 object_store does not give) is never matched: that object is
//!   read, on Azure every one (the cache saves nothing there). An edited `metadata.json`
//!   has another tag, a deleted one is not listed, a new one is not in the cache: each is
//!   read from the store, as without a cache.
//! - A body taken from it goes through the same parse and checks as one read from the
//!   store, so the pass sees what a read of the listed object would have returned.
//! - A body read from the store enters the cache only when the read's entity tag is the
//!   listing's (an object rewritten between the listing and the read is not cached under
//!   the older tag).
//! - Stores whose listings carry no entity tag (a local directory) never use it: their
//!   reads are what a cache would save, and size and time alone would not tell a
//!   same-size edit. Nor does a store with object lock (its versioned bucket would keep
//!   every cache written, and a planted one there is no less planted).
//!
//! So whoever writes the cache — even a runner that lost the lease, or a forged file —
//! cannot make a pass see anything but the listed objects' contents: a forged cache costs
//! reads, not a different plan. A file that cannot be read (malformed, of a newer format,
//! over its bounds) is ignored. It is written only by a pass that deletes
//! ([`CacheUse::Write`]), never by `plan`, `ls` or a restore, and only when it changed —
//! its bodies too, so a cache with a body the objects do not hold is rewritten.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;

use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::layout;
use crate::open::ClusterStore;

/// Version of `_state/metadata-cache.json.zst`.
pub const CACHE_FORMAT_VERSION: u32 = 1;

/// The file's name under `_state/`.
pub const CACHE_FILE: &str = "metadata-cache.json.zst";

/// The largest compressed cache read or written (a store's control objects are bounded
/// so; about 100,000 backups' metadata compress below it).
const MAX_CACHE_OBJECT: u64 = crate::bounded::MAX_CONTROL_OBJECT;

/// The fewest cached keys per range of a split listing (each backup has a few objects
/// beside its `metadata.json`: a range is then a few listing pages).
const KEYS_PER_RANGE: usize = 500;

/// The zstd level the cache is written with.
const CACHE_LEVEL: i32 = 3;

/// The most bytes of `metadata.json` bodies the cache holds, given a pass's metadata budget
/// ([`crate::budget::Budget::metadata_bytes`]): a quarter of it, so the cache read and the
/// one to write stay a fraction of what the pass may hold (the operator's 16 MiB budget
/// caches 4 MiB of bodies, some 4,000 backups; `tidemark` commands' 1 GiB, 256 MiB).
pub(crate) fn bound(metadata_budget: u64) -> u64 {
    metadata_budget / 4
}

pub use crate::open::CacheUse;

/// One cached `metadata.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Entry {
    /// The entity tag the store listed and served the body with.
    pub e_tag: String,
    pub size: u64,
    /// The object's bytes, as read (UTF-8: JSON).
    pub body: String,
}

/// Collects the entries of the cache to write, up to its bound in bodies.
#[derive(Debug)]
pub(crate) struct Keeper {
    kept: std::sync::atomic::AtomicU64,
    bound: u64,
}

impl Keeper {
    pub(crate) fn new(bound: u64) -> Self {
        Keeper {
            kept: std::sync::atomic::AtomicU64::new(0),
            bound,
        }
    }

    /// `entry`, while the bodies kept fit the bound; `None` after.
    pub(crate) fn keep(&self, entry: Option<Entry>) -> Option<Entry> {
        let entry = entry?;
        let size = entry.body.len() as u64;
        let total = self
            .kept
            .fetch_add(size, std::sync::atomic::Ordering::Relaxed)
            .saturating_add(size);
        (total <= self.bound).then_some(entry)
    }

    /// Whether every body offered fit (else the cache is not written: it would lack some).
    pub(crate) fn fits(&self) -> bool {
        self.kept.load(std::sync::atomic::Ordering::Relaxed) <= self.bound
    }
}

/// The file's form.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheFile {
    format_version: u32,
    /// By key relative to the cluster (`<name>/<id>/metadata.json`).
    entries: BTreeMap<String, Entry>,
}

/// The cache as read at the start of a load.
#[derive(Debug, Default)]
pub(crate) struct Cached {
    entries: HashMap<String, Entry>,
}

impl Cached {
    /// The cached body of `listed`, when it is the listed object: same key, entity tag and
    /// size, and that many bytes.
    pub(crate) fn body(&self, listed: &Listed) -> Option<&Entry> {
        let e_tag = opaque(listed.e_tag.as_deref()?);
        let entry = self.entries.get(listed.key.as_ref())?;
        (entry.e_tag == e_tag
            && entry.size == listed.size
            && entry.body.len() as u64 == listed.size
            && is_md5_of(e_tag, entry.body.as_bytes()))
        .then_some(entry)
    }

    /// Up to `ranges - 1` keys that split the cached keys into about equal parts, in
    /// increasing order, each part of at least [`KEYS_PER_RANGE`] keys (none when the
    /// cache is smaller): where to split a listing of the cluster. Any keys would list
    /// every object once; these make the ranges about equal.
    pub(crate) fn cuts(&self, ranges: usize) -> Vec<Path> {
        let parts = (self.entries.len() / KEYS_PER_RANGE).clamp(1, ranges.max(1));
        if parts < 2 {
            return Vec::new();
        }
        let mut keys: Vec<&String> = self.entries.keys().collect();
        keys.sort_unstable();
        let step = keys.len().div_ceil(parts);
        keys.into_iter()
            .step_by(step)
            .skip(1)
            .filter_map(|k| Path::parse(k).ok())
            .collect()
    }

    /// Whether `entries` is what this cache already holds, bodies too (a cache whose body
    /// differs from the object's, under the same tag and size, is rewritten).
    pub(crate) fn holds(&self, entries: &BTreeMap<String, Entry>) -> bool {
        self.entries.len() == entries.len()
            && entries
                .iter()
                .all(|(k, e)| self.entries.get(k).is_some_and(|c| c == e))
    }
}

/// A `metadata.json` as the listing gave it.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub key: Path,
    pub size: u64,
    pub e_tag: Option<String>,
}

impl Listed {
    pub(crate) fn of(meta: &ObjectMeta) -> Self {
        Listed {
            key: meta.location.clone(),
            size: meta.size,
            e_tag: meta.e_tag.clone(),
        }
    }

    /// The cache entry for `body`, read with `read` (the answer's own metadata): only when
    /// the read served the listed object (same entity tag and size).
    pub(crate) fn entry(&self, read: &ObjectMeta, body: &[u8]) -> Option<Entry> {
        let e_tag = opaque(self.e_tag.as_deref()?);
        if read.e_tag.as_deref().map(opaque) != Some(e_tag) || read.size != self.size {
            return None;
        }
        // Only what a later load can check: a body whose tag is its MD5.
        if body.len() as u64 != self.size || !is_md5_of(e_tag, body) {
            return None;
        }
        let body = std::str::from_utf8(body).ok()?.to_owned();
        Some(Entry {
            e_tag: e_tag.to_owned(),
            size: self.size,
            body,
        })
    }
}

/// Whether `e_tag` (opaque) is the MD5 of `body`, in hex: what S3 and GCS's XML API give a
/// single-part upload. Any other tag (a multipart upload's, Azure's) is not.
fn is_md5_of(e_tag: &str, body: &[u8]) -> bool {
    use md5::Digest as _;
    e_tag.len() == 32 && e_tag.eq_ignore_ascii_case(&hex::encode(md5::Md5::digest(body)))
}

/// An entity tag's opaque value: the quotes (and a weak tag's `W/`) as the store gives them
/// differ between listings and reads (Azure lists `0x8D…` and serves `"0x8D…"`).
fn opaque(e_tag: &str) -> &str {
    let e_tag = e_tag.strip_prefix("W/").unwrap_or(e_tag);
    e_tag
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(e_tag)
}

pub(crate) fn key() -> Path {
    Path::from_iter([layout::STATE, CACHE_FILE])
}

/// Reads the cache; an absent, unreadable or oversized one is empty (reported at debug
/// level: the load then reads every `metadata.json`, as without one). `max_bytes` bounds
/// the decompressed file (the metadata a pass may hold).
pub(crate) async fn read(store: &ClusterStore, max_bytes: u64) -> Cached {
    let key = key();
    let bytes = match store.read_limited(&key, MAX_CACHE_OBJECT).await {
        Ok(Some(b)) => b,
        Ok(None) => return Cached::default(),
        Err(e) => {
            tracing::debug!(error = %e, "the metadata cache could not be read; reading every metadata.json");
            return Cached::default();
        }
    };
    let decoded = tokio::task::spawn_blocking(move || decode(&bytes, max_bytes)).await;
    match decoded {
        Ok(Ok(entries)) => Cached { entries },
        Ok(Err(problem)) => {
            tracing::debug!(%problem, "the metadata cache is not used; reading every metadata.json");
            Cached::default()
        }
        Err(e) => {
            tracing::debug!(error = %e, "the metadata cache is not used");
            Cached::default()
        }
    }
}

fn decode(bytes: &[u8], max_bytes: u64) -> Result<HashMap<String, Entry>, String> {
    let mut decoder = zstd::stream::read::Decoder::new(bytes).map_err(|e| e.to_string())?;
    // As every other decoder: a frame asking for a larger window than Tidemark writes is
    // refused before the window is allocated (a few stored bytes cannot cost 128 MiB).
    decoder
        .window_log_max(crate::compress::MAX_WINDOW_LOG)
        .map_err(|e| e.to_string())?;
    let mut text = Vec::new();
    decoder
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut text)
        .map_err(|e| format!("not zstd: {e}"))?;
    if text.len() as u64 > max_bytes {
        return Err(format!("larger than {max_bytes} bytes once decompressed"));
    }
    let file: CacheFile = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    if file.format_version != CACHE_FORMAT_VERSION {
        return Err(format!(
            "format version {} (this build reads {CACHE_FORMAT_VERSION})",
            file.format_version
        ));
    }
    Ok(file.entries.into_iter().collect())
}

fn encode(entries: BTreeMap<String, Entry>) -> Result<Vec<u8>, String> {
    let file = CacheFile {
        format_version: CACHE_FORMAT_VERSION,
        entries,
    };
    let text = serde_json::to_vec(&file).map_err(|e| e.to_string())?;
    zstd::bulk::compress(&text, CACHE_LEVEL).map_err(|e| e.to_string())
}

/// Writes `entries` as the cache, best effort: a failure is a warning (the next pass reads
/// the metadata again, and tries again). Returns whether it was written.
///
/// A plain put, not a conditional one: every entry is checked against the listing before
/// it is used, so a cache written by a runner that lost the lease, or an older one written
/// over a newer, costs reads, never a wrong view.
pub(crate) async fn write(store: &ClusterStore, entries: BTreeMap<String, Entry>) -> bool {
    let count = entries.len();
    let encoded = match tokio::task::spawn_blocking(move || encode(entries)).await {
        Ok(Ok(b)) => b,
        Ok(Err(problem)) => {
            tracing::warn!(%problem, "the metadata cache could not be encoded");
            return false;
        }
        Err(e) => {
            tracing::warn!(error = %e, "the metadata cache could not be encoded");
            return false;
        }
    };
    if encoded.len() as u64 > MAX_CACHE_OBJECT {
        tracing::info!(
            bytes = encoded.len(),
            "the metadata cache would be larger than {MAX_CACHE_OBJECT} bytes; not written"
        );
        return false;
    }
    let key = key();
    match store.inner.put(&key, PutPayload::from(encoded)).await {
        Ok(_) => {
            tracing::debug!(entries = count, "metadata cache written");
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "the metadata cache could not be written; the next pass reads every metadata.json");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(e_tag: &str, body: &str) -> Entry {
        Entry {
            e_tag: e_tag.to_owned(),
            size: body.len() as u64,
            body: body.to_owned(),
        }
    }

    fn listed(key: &str, size: u64, e_tag: Option<&str>) -> Listed {
        Listed {
            key: Path::from(key),
            size,
            e_tag: e_tag.map(str::to_owned),
        }
    }

    /// The MD5 of `body`, in hex: the tag S3 gives a single-part upload of it.
    fn md5(body: &str) -> String {
        use md5::Digest as _;
        hex::encode(md5::Md5::digest(body.as_bytes()))
    }

    #[test]
    fn a_body_is_taken_only_for_the_listed_object() {
        let body = "{\"a\":1}";
        let x = md5(body);
        let quoted = format!("\"{x}\"");
        let cached = Cached {
            entries: [("a/1/metadata.json".to_owned(), entry(&x, body))]
                .into_iter()
                .collect(),
        };
        assert!(
            cached
                .body(&listed("a/1/metadata.json", 7, Some(&quoted)))
                .is_some()
        );
        // Quoted or not (Azure lists tags bare and serves them quoted), any case.
        assert!(
            cached
                .body(&listed("a/1/metadata.json", 7, Some(&x)))
                .is_some()
        );
        assert!(
            cached
                .body(&listed("a/1/metadata.json", 7, Some(&x.to_uppercase())))
                .is_none(),
            "an entry is taken for its own tag only"
        );
        // Another tag (an edit of the same size), another size, no tag, another key.
        assert!(
            cached
                .body(&listed("a/1/metadata.json", 7, Some("\"y\"")))
                .is_none()
        );
        assert!(
            cached
                .body(&listed("a/1/metadata.json", 8, Some(&quoted)))
                .is_none()
        );
        assert!(cached.body(&listed("a/1/metadata.json", 7, None)).is_none());
        assert!(
            cached
                .body(&listed("a/2/metadata.json", 7, Some(&quoted)))
                .is_none()
        );
        // Issue 42 §4: a body that is not what the tag digests — the listing's key, tag
        // and size, another content of that size (a forged cache) — is never taken; nor a
        // tag that is no MD5 (a multipart upload's, Azure's), whatever the body.
        let forged = Cached {
            entries: [("a/1/metadata.json".to_owned(), entry(&x, "{\"a\":2}"))]
                .into_iter()
                .collect(),
        };
        assert!(
            forged
                .body(&listed("a/1/metadata.json", 7, Some(&quoted)))
                .is_none()
        );
        for tag in ["0x8DCAFE0123456789", "d41d8cd98f00b204e9800998ecf8427e-2"] {
            let other = Cached {
                entries: [("a/1/metadata.json".to_owned(), entry(tag, body))]
                    .into_iter()
                    .collect(),
            };
            assert!(
                other
                    .body(&listed("a/1/metadata.json", 7, Some(tag)))
                    .is_none(),
                "{tag}"
            );
        }
    }

    #[test]
    fn a_read_enters_the_cache_only_as_the_listed_object() {
        let body = b"{\"a\":1}";
        let x = format!("\"{}\"", md5("{\"a\":1}"));
        let l = listed("a/1/metadata.json", 7, Some(&x));
        let served = |e_tag: Option<&str>, size: u64| ObjectMeta {
            location: Path::from("a/1/metadata.json"),
            last_modified: chrono::DateTime::default(),
            size,
            e_tag: e_tag.map(str::to_owned),
            version: None,
        };
        assert!(l.entry(&served(Some(&x), 7), body).is_some());
        assert!(
            l.entry(&served(Some(x.trim_matches('"')), 7), body)
                .is_some()
        );
        // Rewritten between the listing and the read.
        assert!(l.entry(&served(Some("\"y\""), 7), b"{\"a\":2}").is_none());
        assert!(l.entry(&served(Some(&x), 8), b"{\"a\":1} ").is_none());
        // A body cut short.
        assert!(l.entry(&served(Some(&x), 7), b"{\"a\"").is_none());
        // A body the tag does not digest (served with the listed tag) is not cached: a
        // later load could not take it.
        assert!(l.entry(&served(Some(&x), 7), b"{\"a\":2}").is_none());
        assert!(listed("k", 7, None).entry(&served(None, 7), body).is_none());
    }

    #[test]
    fn a_cache_over_its_bound_is_not_kept() {
        let keeper = Keeper::new(10);
        assert!(keeper.keep(Some(entry("t", "{\"a\":1}"))).is_some());
        assert!(keeper.keep(None).is_none());
        assert!(keeper.fits());
        assert!(keeper.keep(Some(entry("t", "{\"b\":1}"))).is_none());
        assert!(!keeper.fits());
        assert_eq!(bound(16 << 20), 4 << 20);
    }

    #[test]
    fn cuts_split_the_keys_into_equal_ranges() {
        let cached = |n: usize| Cached {
            entries: (0..n)
                .map(|i| (format!("n/{i:05}/metadata.json"), entry("t", "{}")))
                .collect(),
        };
        assert!(cached(999).cuts(8).is_empty());
        let cuts = cached(4_000).cuts(8);
        assert_eq!(cuts.len(), 7);
        assert_eq!(cuts[0].as_ref(), "n/00500/metadata.json");
        assert!(cuts.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(cached(100_000).cuts(8).len(), 7);
        assert_eq!(cached(1_000).cuts(8).len(), 1);
    }

    #[test]
    fn the_file_round_trips_and_bounds_hold() {
        let entries: BTreeMap<String, Entry> = (0..100)
            .map(|i| {
                (
                    format!("n/{i}/metadata.json"),
                    entry("\"t\"", "{\"x\":\"ééé\"}"),
                )
            })
            .collect();
        let bytes = encode(entries.clone()).unwrap();
        let back = decode(&bytes, 1 << 20).unwrap();
        assert_eq!(back.len(), 100);
        assert_eq!(back["n/7/metadata.json"], entries["n/7/metadata.json"]);
        assert!(decode(&bytes, 100).unwrap_err().contains("larger than 100"));
        assert!(decode(b"not zstd at all", 1 << 20).is_err());
        let newer = zstd::bulk::compress(br#"{"formatVersion":2,"entries":{}}"#, 3).unwrap();
        assert!(
            decode(&newer, 1 << 20)
                .unwrap_err()
                .contains("format version 2")
        );
        // A frame whose window is over the bound is refused, as by every other decoder.
        let framed = |window_log| {
            let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
            e.window_log(window_log).unwrap();
            std::io::Write::write_all(&mut e, br#"{"formatVersion":1,"entries":{}}"#).unwrap();
            e.finish().unwrap()
        };
        assert!(decode(&framed(crate::compress::MAX_WINDOW_LOG), 1 << 20).is_ok());
        let e = decode(&framed(crate::compress::MAX_WINDOW_LOG + 1), 1 << 20).unwrap_err();
        assert!(e.contains("not zstd") || e.contains("indow"), "{e}");
    }
}
