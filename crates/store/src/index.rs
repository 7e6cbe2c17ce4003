//! The segment index: `binlogs/_index.json` and the shards it names.
//!
//! One document listing a million segments is about 200 MB, and a pass that read and
//! rewrote it would cost in proportion to the archive, not to what it deletes. So the index
//! is split: `_index.json` (the *head*) holds the newest entries in `segments` and, in
//! `shards`, a summary of each *shard* — an immutable object
//! `binlogs/_index/<first>-<last>-<nonce>.json` holding up to [`SHARD_SIZE`] older
//! entries. A pass reads the head, plans with the summaries standing for unread shards,
//! reads only the shards its horizon reaches (and those a summary cannot stand for), and
//! rewrites only those.
//!
//! # Crash safety
//! A shard is never overwritten: a changed shard is written under a new key, then the head
//! is replaced by a conditional write, then the shards it no longer names are deleted. A
//! crash leaves either the old head (whose shards all exist) or the new one (likewise); the
//! only debris is unreferenced shard objects, which a later pass deletes once they are old
//! enough that no writer can still be about to commit them.

use std::collections::{HashMap, HashSet};

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use crate::bounded::MAX_INDEX_OBJECT;
use crate::error::{StoreError, is_not_found};
use crate::format::{INDEX_FORMAT_VERSION, IndexEntry, IndexFile, ShardSummary};
use crate::layout;
use crate::open::ClusterStore;
use crate::open::write_err;
use tidemark_core::{EntryRef, Timeline};

/// Entries per shard; the head keeps at most this many before sealing a shard.
pub const SHARD_SIZE: usize = 4096;
/// Shards read at once.
const SHARD_READ_CONCURRENCY: usize = 16;
/// Attempts to replace the head when another writer changes it under us.
const INDEX_ATTEMPTS: u32 = 8;

/// The index as read: the head with the version a conditional rewrite needs, and the
/// shards read so far.
#[derive(Debug, Clone)]
pub struct SegmentIndex {
    pub head: IndexFile,
    pub version: UpdateVersion,
    read: HashMap<String, IndexFile>,
    /// Whether `_index.json` exists (an absent one is created, not replaced).
    exists: bool,
}

/// A run of consecutive index entries: one entry, or an unread shard's summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub first_sequence: u64,
    pub last_sequence: u64,
    pub first_name: String,
    pub last_name: String,
    pub count: u64,
    pub size: u64,
    pub unknown_last_event: u64,
}

impl SegmentIndex {
    /// The index of a store that has none yet.
    fn absent() -> Self {
        SegmentIndex {
            head: IndexFile::empty(),
            version: UpdateVersion {
                e_tag: None,
                version: None,
            },
            read: HashMap::new(),
            exists: false,
        }
    }

    /// Reads the head, and the shards whose summaries cannot stand for them (not ordered,
    /// or overlapping other entries). `None` when there is no index.
    ///
    /// # Errors
    /// A failed request; a malformed or newer head or shard; a shard the head names that
    /// does not exist.
    pub async fn load(store: &ClusterStore) -> Result<Option<Self>, StoreError> {
        let key = layout::index_key();
        let Some((bytes, version)) = store
            .read_versioned_charged(&key, MAX_INDEX_OBJECT, |n| store.spent.index(n))
            .await?
        else {
            return Ok(None);
        };
        let t = std::time::Instant::now();
        let head = parse(store, &key, &bytes)?;
        for s in &head.shards {
            if layout::shard_key(&s.key).is_none() {
                return Err(StoreError::MalformedIndex {
                    url: store.url.clone(),
                    key: store.display_key(&key),
                    source: crate::format::IndexError::ShardKey(s.key.clone()),
                });
            }
        }
        tracing::info!(
            bytes = bytes.len(),
            entries = head.entries.len(),
            shards = head.shards.len(),
            parse_ms = t.elapsed().as_millis() as u64,
            "segment index read"
        );
        let mut index = SegmentIndex {
            head,
            version,
            read: HashMap::new(),
            exists: true,
        };
        let must_read = index.unsummarisable();
        index.read_shards(store, must_read).await?;
        Ok(Some(index))
    }

    /// Shards whose summary cannot stand for them: not ordered, or sharing sequence
    /// numbers with another shard or with the head's entries.
    fn unsummarisable(&self) -> Vec<String> {
        let mut heads: Vec<u64> = self.head.entries.iter().map(|e| e.sequence).collect();
        heads.sort_unstable();
        let mut ranges: Vec<&ShardSummary> = self.head.shards.iter().collect();
        ranges.sort_by_key(|s| (s.first_sequence, s.last_sequence));
        let mut out = Vec::new();
        for (i, s) in ranges.iter().enumerate() {
            let touches_head = {
                let k = heads.partition_point(|&q| q < s.first_sequence);
                k < heads.len() && heads[k] <= s.last_sequence
            };
            let overlaps_prev = i > 0 && ranges[i - 1].last_sequence >= s.first_sequence;
            let overlaps_next =
                i + 1 < ranges.len() && ranges[i + 1].first_sequence <= s.last_sequence;
            if !s.ordered || touches_head || overlaps_prev || overlaps_next {
                out.push(s.key.clone());
            }
        }
        out
    }

    /// Reads the named shards (those not read yet), concurrently.
    ///
    /// # Errors
    /// A failed request; a malformed shard; a shard that does not exist (the index changed
    /// under this pass).
    pub async fn read_shards(
        &mut self,
        store: &ClusterStore,
        keys: impl IntoIterator<Item = String>,
    ) -> Result<(), StoreError> {
        let wanted: Vec<String> = keys
            .into_iter()
            .filter(|k| !self.read.contains_key(k))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        // Counted before any is read: a head naming thousands of shards marked unordered
        // costs one refusal, not thousands of reads.
        store
            .spent
            .shards(wanted.len() as u64)
            .map_err(|e| StoreError::Request {
                url: store.url.clone(),
                action: format!("reading {} index shards", wanted.len()),
                answer: crate::budget::as_store_error(e),
            })?;
        let t = std::time::Instant::now();
        let got: Vec<(String, IndexFile)> = futures::stream::iter(wanted)
            .map(|rel| async move {
                let key = layout::shard_key(&rel).ok_or_else(|| StoreError::MalformedIndex {
                    url: store.url.clone(),
                    key: store.display_key(&layout::index_key()),
                    source: crate::format::IndexError::ShardKey(rel.clone()),
                })?;
                let (body, _) = store
                    .read_versioned_charged(&key, MAX_INDEX_OBJECT, |n| store.spent.index(n))
                    .await?
                    .ok_or_else(|| StoreError::MissingShard {
                        url: store.url.clone(),
                        key: store.display_key(&key),
                    })?;
                let file = parse(store, &key, &body)?;
                Ok((rel, file))
            })
            .buffer_unordered(SHARD_READ_CONCURRENCY)
            .try_collect()
            .await?;
        let n = got.len();
        for (rel, file) in got {
            if let Some(s) = self.head.shards.iter().find(|s| s.key == rel) {
                let mut sorted = file.entries.clone();
                sorted.sort_by_key(|e| e.sequence);
                let actual = ShardSummary::of(rel.clone(), &sorted);
                if actual.as_ref().is_none_or(|a| !same_facts(a, s)) {
                    tracing::warn!(
                        shard = rel,
                        "index shard differs from its summary in _index.json; using the shard's entries"
                    );
                }
            }
            self.read.insert(rel, file);
        }
        tracing::info!(
            shards = n,
            elapsed_ms = t.elapsed().as_millis() as u64,
            "index shards read"
        );
        Ok(())
    }

    /// Whether the shard has been read.
    pub fn is_read(&self, key: &str) -> bool {
        self.read.contains_key(key)
    }

    /// Every entry known one by one: the head's and those of the shards read.
    pub fn entries(&self) -> impl Iterator<Item = &IndexEntry> {
        let read = &self.read;
        self.head.entries.iter().chain(
            self.head
                .shards
                .iter()
                .filter_map(move |s| read.get(&s.key))
                .flat_map(|f| f.entries.iter()),
        )
    }

    /// Summaries of the shards not read.
    pub fn unread(&self) -> impl Iterator<Item = &ShardSummary> {
        self.head
            .shards
            .iter()
            .filter(|s| !self.read.contains_key(&s.key))
    }

    /// The whole index as runs, in sequence order: one per entry known one by one, one
    /// per unread shard.
    pub fn runs(&self) -> Vec<Run> {
        let mut seen = HashSet::new();
        let mut runs: Vec<Run> = self
            .entries()
            // Entries outside the grammar are not segments of ours (the catalog reports them).
            .filter(|e| {
                crate::format::is_index_entry(e) && seen.insert((e.sequence, e.name.as_str()))
            })
            .map(|e| Run {
                first_sequence: e.sequence,
                last_sequence: e.sequence,
                first_name: e.name.clone(),
                last_name: e.name.clone(),
                count: 1,
                size: e.size,
                unknown_last_event: u64::from(e.last_event_at.is_none()),
            })
            .chain(self.unread().map(|s| Run {
                first_sequence: s.first_sequence,
                last_sequence: s.last_sequence,
                first_name: s.first_name.clone(),
                last_name: s.last_name.clone(),
                count: s.count,
                size: s.size,
                unknown_last_event: s.unknown_last_event,
            }))
            .collect();
        runs.sort_by(|a, b| {
            (a.first_sequence, &a.first_name).cmp(&(b.first_sequence, &b.first_name))
        });
        runs
    }

    /// Unread shards that may hold one of `sequences` (sorted).
    pub fn shards_holding(&self, sequences: &[u64]) -> Vec<String> {
        self.unread()
            .filter(|s| {
                let k = sequences.partition_point(|&q| q < s.first_sequence);
                k < sequences.len() && sequences[k] <= s.last_sequence
            })
            .map(|s| s.key.clone())
            .collect()
    }

    /// The new head and shards after removing the entries in `gone` (by sequence and name:
    /// a stale duplicate of a name never takes the real entry with it), adding those of
    /// `add` whose sequence is not indexed yet (the shards that could hold them must have
    /// been read), and sealing head entries beyond `shard_size` into new shards.
    fn edit(
        &self,
        gone: &HashSet<EntryRef>,
        add: &[IndexEntry],
        timelines: &[Timeline],
        shard_size: usize,
    ) -> Result<Edit, Box<Timeline>> {
        let is_gone = |e: &IndexEntry| {
            gone.contains(&EntryRef {
                sequence: e.sequence,
                name: e.name.clone(),
            })
        };
        let mut head = self.head.clone();
        // A timeline is added once: one recorded with the same id stays (re-recording it is
        // a no-op), unless it is the first timeline learning its writer; one that differs
        // in anything else is another writer's claim, returned.
        let mut claimed = 0;
        for t in timelines {
            match head.timelines.iter_mut().find(|h| h.id == t.id) {
                None => {
                    head.timelines.push(t.clone());
                    claimed += 1;
                }
                Some(h) if h.id == 0 && h.server_id.is_none() && h.parent.is_none() => {
                    *h = t.clone();
                    claimed += 1;
                }
                Some(h)
                    if (h.server_id, h.parent, h.first_sequence)
                        == (t.server_id, t.parent, t.first_sequence) => {}
                Some(h) => return Err(Box::new(h.clone())),
            }
        }
        head.timelines.sort_by_key(|t| t.id);
        let mut removed = head.remove_where(is_gone);
        let known: HashSet<u64> = self
            .entries()
            .filter(|e| !is_gone(e))
            .map(|e| e.sequence)
            .collect();
        let mut added = 0;
        for e in add {
            if !known.contains(&e.sequence) && !is_gone(e) {
                // Plain data: serialising cannot fail; an entry that did would be skipped and
                // added by the next run.
                if head.push(e.clone()).is_ok() {
                    added += 1;
                }
            }
        }
        let mut write = Vec::new();
        let mut replaced = Vec::new();
        let mut shards = Vec::with_capacity(head.shards.len());
        for s in std::mem::take(&mut head.shards) {
            let Some(file) = self.read.get(&s.key) else {
                shards.push(s);
                continue;
            };
            let mut rest = file.clone();
            let n = rest.remove_where(is_gone);
            if n == 0 {
                shards.push(s);
                continue;
            }
            removed += n;
            replaced.push(s.key.clone());
            let count = rest.entries.len();
            if let Some((summary, body)) = seal(rest.take_lowest(count)) {
                shards.push(summary);
                write.push(body);
            }
        }
        let shard_size = shard_size.max(1);
        while head.entries.len() > shard_size {
            if let Some((summary, body)) = seal(head.take_lowest(shard_size)) {
                shards.push(summary);
                write.push(body);
            }
        }
        shards.sort_by_key(|s| (s.first_sequence, s.last_sequence));
        head.shards = shards;
        Ok(Edit {
            head,
            write,
            replaced,
            removed,
            added,
            claimed,
        })
    }
}

/// A new shard of `entries` (sorted by sequence): its summary and (key, body); `None` for
/// no entries.
fn seal(entries: IndexFile) -> Option<(ShardSummary, (String, Vec<u8>))> {
    let mut file = entries;
    // A shard is a version-2 file (`to_bytes` raises it for coded entries).
    file.format_version = 2;
    let (first, last) = (
        file.entries.first()?.sequence,
        file.entries.last()?.sequence,
    );
    let key = layout::new_shard_name(first, last);
    let summary = ShardSummary::of(key.clone(), &file.entries)?;
    Some((summary, (key, file.to_bytes())))
}

fn same_facts(a: &ShardSummary, b: &ShardSummary) -> bool {
    (
        a.first_sequence,
        a.last_sequence,
        a.count,
        a.first_event_at,
        a.last_event_at,
        a.ordered,
    ) == (
        b.first_sequence,
        b.last_sequence,
        b.count,
        b.first_event_at,
        b.last_event_at,
        b.ordered,
    )
}

struct Edit {
    head: IndexFile,
    /// New shards: (key relative to `binlogs/`, body).
    write: Vec<(String, Vec<u8>)>,
    /// Shards the new head no longer names.
    replaced: Vec<String>,
    removed: usize,
    added: usize,
    /// Timelines recorded.
    claimed: usize,
}

/// Parses a head or a shard read whole, charging the pass's budget for what it holds
/// parsed beyond its text (the text was charged as it was read): its text once more before
/// parsing (the items' verbatim copies), so a file the budget cannot hold is refused
/// unparsed, then each parsed item.
fn parse(store: &ClusterStore, key: &Path, bytes: &[u8]) -> Result<IndexFile, StoreError> {
    let charge = |n: u64| {
        store.spent.index(n).map_err(|e| StoreError::Request {
            url: store.url.clone(),
            action: format!("reading {}", store.display_key(key)),
            answer: crate::budget::as_store_error(e),
        })
    };
    let text = bytes.len() as u64;
    charge(text)?;
    let file = IndexFile::parse(bytes).map_err(|source| StoreError::MalformedIndex {
        url: store.url.clone(),
        key: store.display_key(key),
        source,
    })?;
    charge(file.footprint().saturating_sub(2 * text))?;
    if file.format_version > INDEX_FORMAT_VERSION {
        return Err(StoreError::NewerIndex {
            url: store.url.clone(),
            key: store.display_key(key),
            version: file.format_version,
            supported: INDEX_FORMAT_VERSION,
        });
    }
    Ok(file)
}

/// Removes the entries in `gone` (segments confirmed deleted) from the index, and
/// seals head entries beyond `shard_size` into shards. Returns how many were removed.
///
/// # Guarantees
/// As [`update`]: only the entries in `gone`, and shards only once no head names them.
///
/// # Errors
/// As [`update`].
pub async fn remove_entries(
    store: &ClusterStore,
    loaded: &SegmentIndex,
    gone: &HashSet<EntryRef>,
    shard_size: usize,
) -> Result<usize, StoreError> {
    update(store, Some(loaded), gone, &[], &[], shard_size)
        .await
        .map(|c| c.removed)
}

/// What an index update changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Change {
    pub removed: usize,
    pub added: usize,
    /// Timelines recorded.
    pub claimed: usize,
}

/// Removes the entries in `gone`, adds the entries of `add` whose sequence is not
/// indexed yet, records the `timelines` not recorded yet, and seals head entries beyond
/// `shard_size` into shards. New shards are written first, the head is replaced by a
/// conditional write (re-reading and re-applying when another writer — an archiver, a pass
/// — changed it), then replaced shards are deleted. `loaded` is the index as already read
/// (`None`: read it here, or create it).
///
/// # Guarantees
/// Every segment entry removed was asked for in `gone`; replaced shards are deleted only after
/// the head that no longer names them is written (a crash leaves unreferenced shards, which a
/// later pass deletes); shards of its own that a failed update wrote are removed again.
///
/// # Errors
/// A failed request, a malformed or newer index, a head that kept changing, or a timeline
/// another writer recorded differently under the same id.
pub async fn update(
    store: &ClusterStore,
    loaded: Option<&SegmentIndex>,
    gone: &HashSet<EntryRef>,
    add: &[IndexEntry],
    timelines: &[Timeline],
    shard_size: usize,
) -> Result<Change, StoreError> {
    let key = layout::index_key();
    let mut index = match loaded {
        Some(l) => l.clone(),
        None => SegmentIndex::load(store)
            .await?
            .unwrap_or_else(SegmentIndex::absent),
    };
    let mut sequences: Vec<u64> = gone
        .iter()
        .map(|e| e.sequence)
        .chain(add.iter().map(|e| e.sequence))
        .collect();
    sequences.sort_unstable();
    for _ in 0..INDEX_ATTEMPTS {
        let holding = index.shards_holding(&sequences);
        index.read_shards(store, holding).await?;
        let edit = index
            .edit(gone, add, timelines, shard_size)
            .map_err(|taken| StoreError::TimelineTaken {
                url: store.url.clone(),
                key: store.display_key(&key),
                id: taken.id,
                server: taken
                    .server_id
                    .map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
            })?;
        let change = Change {
            removed: edit.removed,
            added: edit.added,
            claimed: edit.claimed,
        };
        if change == Change::default() {
            return Ok(change);
        }
        if let Err(e) = put_shards(store, &edit.write).await {
            delete_shards(store, edit.write.iter().map(|(k, _)| k)).await;
            return Err(e);
        }
        let written = if index.exists {
            replace_head(store, &key, &index.version, edit.head.to_bytes()).await
        } else {
            create_head(store, &key, edit.head.to_bytes()).await
        };
        match written {
            Ok(_) => {
                delete_shards(store, edit.replaced.iter()).await;
                return Ok(change);
            }
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => {
                delete_shards(store, edit.write.iter().map(|(k, _)| k)).await;
                // Re-read with the same reader (so a newer formatVersion still stops us);
                // shards are immutable, so those already read stay valid.
                let mut fresh = match SegmentIndex::load(store).await? {
                    Some(f) => f,
                    // Deleted meanwhile: nothing left to remove; additions start a new one.
                    None if add.is_empty() => return Ok(Change::default()),
                    None => SegmentIndex::absent(),
                };
                for (k, f) in std::mem::take(&mut index.read) {
                    if fresh.head.shards.iter().any(|s| s.key == k) {
                        fresh.read.entry(k).or_insert(f);
                    }
                }
                index = fresh;
            }
            Err(source) => {
                delete_shards(store, edit.write.iter().map(|(k, _)| k)).await;
                return Err(write_err(store, &key, source));
            }
        }
    }
    Err(StoreError::IndexContention {
        url: store.url.clone(),
        key: store.display_key(&key),
        attempts: INDEX_ATTEMPTS,
    })
}

/// Creates the head where there was none; `AlreadyExists` when another writer did first
/// (where the backend can tell). Returns the version written, for the next conditional
/// update.
pub(crate) async fn create_head(
    store: &ClusterStore,
    key: &Path,
    body: Vec<u8>,
) -> Result<UpdateVersion, object_store::Error> {
    let payload = PutPayload::from(body);
    let create = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    let put = match store.inner.put_opts(key, payload.clone(), create).await {
        Err(object_store::Error::NotImplemented { .. }) => match store.inner.head(key).await {
            Ok(_) => Err(object_store::Error::AlreadyExists {
                path: key.to_string(),
                source: "the index was created meanwhile".into(),
            }),
            Err(e) if is_not_found(&e) => store.inner.put(key, payload).await,
            Err(e) => Err(e),
        },
        other => other,
    }?;
    written_version(store, key, put).await
}

/// The version a put created: from its answer (a later read could see another writer's),
/// or read back from a backend that answers without one.
async fn written_version(
    store: &ClusterStore,
    key: &Path,
    put: object_store::PutResult,
) -> Result<UpdateVersion, object_store::Error> {
    if put.e_tag.is_some() || put.version.is_some() {
        return Ok(UpdateVersion {
            e_tag: put.e_tag,
            version: put.version,
        });
    }
    let meta = store.inner.head(key).await?;
    Ok(UpdateVersion {
        e_tag: meta.e_tag,
        version: meta.version,
    })
}

/// Writes an index of `entries` from scratch, sealed into shards of `shard_size` (the
/// archiver's first write; tests and benchmarks).
///
/// # Errors
/// A failed request.
pub async fn write_new(
    store: &ClusterStore,
    entries: &[IndexEntry],
    shard_size: usize,
) -> Result<(), StoreError> {
    let mut head = IndexFile::empty();
    for e in entries {
        head.push(e.clone()).map_err(|source| StoreError::Encode {
            url: store.url.clone(),
            what: "_index.json",
            source,
        })?;
    }
    let index = SegmentIndex {
        head,
        ..SegmentIndex::absent()
    };
    let Ok(edit) = index.edit(&HashSet::new(), &[], &[], shard_size) else {
        return Ok(()); // no timelines to record: cannot conflict
    };
    put_shards(store, &edit.write).await?;
    let key = layout::index_key();
    store
        .inner
        .put(&key, PutPayload::from(edit.head.to_bytes()))
        .await
        .map(|_| ())
        .map_err(|source| write_err(store, &key, source))
}

async fn put_shards(store: &ClusterStore, shards: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
    // Owned keys and bodies: a stream of closures over borrowed items is not `Send` for
    // every lifetime, which the tasks calling this need.
    let writes: Vec<_> = shards
        .iter()
        .map(|(rel, body)| {
            let key = layout::shard_key(rel).unwrap_or_else(|| Path::from(rel.as_str()));
            put_one(store, key, PutPayload::from(body.clone()))
        })
        .collect();
    futures::stream::iter(writes)
        .buffer_unordered(SHARD_READ_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}

async fn put_one(store: &ClusterStore, key: Path, body: PutPayload) -> Result<(), StoreError> {
    store
        .inner
        .put(&key, body)
        .await
        .map(|_| ())
        .map_err(|source| write_err(store, &key, source))
}

/// Deletes shard objects, best effort: one left behind is an unreferenced shard, which a
/// later pass deletes. Returns how many are gone.
///
/// # Guarantees
/// Deletes exactly the keys it is given (shards no head names any more).
pub(crate) async fn delete_shards<'a>(
    store: &ClusterStore,
    keys: impl Iterator<Item = &'a String>,
) -> usize {
    let paths: Vec<Path> = keys.filter_map(|k| layout::shard_key(k)).collect();
    if paths.is_empty() {
        return 0;
    }
    let mut gone = 0;
    let results: Vec<_> = store
        .inner
        .delete_stream(futures::stream::iter(paths.into_iter().map(Ok)).boxed())
        .collect()
        .await;
    for r in results {
        match r {
            Err(e) if !is_not_found(&e) => {
                tracing::warn!(error = %e, "could not delete an index shard; a later pass will");
            }
            _ => gone += 1,
        }
    }
    gone
}

/// Replaces the head if it is still at `version`; returns the version written.
pub(crate) async fn replace_head(
    store: &ClusterStore,
    key: &Path,
    version: &UpdateVersion,
    body: Vec<u8>,
) -> Result<UpdateVersion, object_store::Error> {
    let payload = PutPayload::from(body);
    let conditional = version.e_tag.is_some() || version.version.is_some();
    if conditional {
        let opts = PutOptions {
            mode: PutMode::Update(version.clone()),
            ..Default::default()
        };
        match store.inner.put_opts(key, payload.clone(), opts).await {
            // No conditional writes here (a local directory): check the version just
            // before writing. The window is the two requests' gap.
            Err(object_store::Error::NotImplemented { .. }) => {}
            Ok(put) => return written_version(store, key, put).await,
            Err(e) => return Err(e),
        }
    }
    let head = store.inner.head(key).await?;
    let same = head.e_tag == version.e_tag && head.version == version.version;
    if !same {
        return Err(object_store::Error::Precondition {
            path: key.to_string(),
            source: "the index changed since it was read".into(),
        });
    }
    let put = store.inner.put(key, payload).await?;
    written_version(store, key, put).await
}
