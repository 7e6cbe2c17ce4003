//! Listing a cluster's prefix into the planner's inventory. Foreign objects and malformed
//! metadata are reported with their keys and never become deletable.

use std::collections::{BTreeMap, HashMap, HashSet};

use futures::{FutureExt, StreamExt, TryStreamExt};
use jiff::Timestamp;
use object_store::ObjectMeta;
use object_store::path::Path;
use tidemark_core::{Backup, BackupKind, Inventory, Leftover, LeftoverKind, Phase, Segment};

use crate::error::{StoreError, is_not_found};
use crate::format::{
    AuditRecord, BackupType, CONSOLIDATABLE_METHODS, METADATA_FORMAT_VERSION, Metadata,
    MetadataPhase,
};
use crate::index::SegmentIndex;
use crate::layout::{self, KeyKind};
use crate::metacache::{self, CacheUse};
use crate::open::ClusterStore;
use crate::progress::Progress;

/// Ranges the listing outside `binlogs/` is split into when the metadata cache tells
/// where its keys lie (an ordered backend).
const OUTSIDE_LIST_RANGES: usize = 8;

/// Metadata documents fetched at once (the store-wide limit still applies).
const METADATA_FETCH_CONCURRENCY: usize = 64;

/// Bytes of `metadata.json` bodies being read and parsed at once (parsing one can hold
/// up to about 16 times its text for a moment); a larger one is read alone.
const METADATA_BYTES_IN_FLIGHT: u64 = 2 << 20;

/// The largest `metadata.json` read: Tidemark writes a few KiB (its labels are
/// Kubernetes labels); a larger one is malformed, kept and named.
pub const MAX_METADATA_OBJECT: u64 = 1 << 20;

/// How much of a `metadata.json` listed at `listed` bytes is read: twice that (it may be
/// rewritten between the listing and the read), at least 64 KiB, at most
/// [`MAX_METADATA_OBJECT`]. A server answering with more than it listed is cut there
/// (that backup is malformed for the pass), so the bytes in flight stay bounded.
fn metadata_read_limit(listed: u64) -> u64 {
    listed
        .saturating_mul(2)
        .clamp(64 << 10, MAX_METADATA_OBJECT)
}

/// Object locks read at once before a pass deletes ([`Catalog::read_server_locks`]).
const LOCK_READ_CONCURRENCY: usize = 16;

/// Payload objects whose lock is read per backup: Tidemark writes one; a directory holding
/// many more was not written by it, and costs no more than this.
pub const LOCK_READS_PER_BACKUP: usize = 8;

/// The label (in `metadata.json`) or annotation (on a Backup) that places a hold.
pub const PROTECT_LABEL: &str = "tidemark.io/protect";

/// One backup directory as found in the store.
#[derive(Debug, Clone)]
pub struct StoredBackup {
    pub backup: Backup,
    /// `metadata.json`, when the attempt is committed.
    pub metadata_key: Option<Path>,
    /// Every other object directly in the directory (payload objects, the in-flight
    /// marker, leftovers of the attempt): all go when the backup is deleted.
    pub payload_keys: Vec<Path>,
    pub metadata: Option<Metadata>,
    /// Why a committed backup cannot be restored (a payload object missing or of another
    /// size), or why its `metadata.json` cannot be read.
    pub problem: Option<String>,
}

/// A `metadata.json` (or audit record) that could not be used: reported, never deleted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Malformed {
    /// Key relative to the store URL.
    pub key: String,
    pub problem: String,
}

/// A listed segment object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentObject {
    pub name: String,
    pub sequence: u64,
    pub size: u64,
}

/// The part of `binlogs/` that was listed.
#[derive(Debug, Clone, Default)]
pub struct SegmentListing {
    pub objects: Vec<SegmentObject>,
    /// Segments with a sequence below this were listed; `None`: nothing was listed.
    pub listed_below: Option<u64>,
    /// Non-segment objects under `binlogs/` (besides the index).
    pub foreign: Vec<String>,
    /// Staging files of unfinished segment uploads (a local store).
    pub leftovers: Vec<Leftover>,
}

/// How much of a cluster [`Catalog::load_scoped`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Everything,
    Backups,
}

/// How much larger than its stored bytes a compressed segment is taken to be (binlogs
/// compress about 3 to 5 times), and a segment in an unread shard (its form is unknown
/// without reading the shard).
pub const COMPRESSED_SEGMENT_FACTOR: u64 = 5;

/// Room beyond the estimate of [`Catalog::restore_scratch_bytes`]: the private server's
/// own files, temporary tables, logs.
pub const SCRATCH_MARGIN: u64 = 512 << 20;

/// Everything the store says about one cluster.
#[derive(Debug)]
pub struct Catalog {
    pub backups: Vec<StoredBackup>,
    /// Objects and entries outside the layout (symlinks, names that are not UTF-8, keys of
    /// another shape): never deleted, never read, reported.
    pub foreign: Vec<String>,
    /// `metadata.json` files that cannot be used: their backups are kept, and `gc` stops
    /// until they are fixed (or `--ignore-malformed`).
    pub malformed: Vec<Malformed>,
    /// Index entries outside the layout's grammar (a name that is not a segment name, or a
    /// sequence that is not its name's): left alone, reported.
    pub ignored: Vec<Malformed>,
    pub index: Option<SegmentIndex>,
    /// Objects under `binlogs/_index/` (index shards, referenced or not).
    pub shard_objects: Vec<ObjectMeta>,
    /// Debris of interrupted work: staging files, incomplete uploads (unreferenced shards
    /// are derived from `shard_objects` and the index when the inventory is built).
    pub leftovers: Vec<Leftover>,
    /// Things that went wrong without stopping the load (e.g. uploads could not be listed).
    pub warnings: Vec<String>,
    /// When the listing began, by the wall clock: what running means is judged at it.
    pub observed_at: Timestamp,
    /// Objects listed (for progress and reports).
    pub objects_listed: usize,
    /// `metadata.json` bodies taken from the metadata cache rather than read
    /// ([`crate::metacache`]).
    pub metadata_from_cache: usize,
    /// Locked backups a pass recorded as expired (`_state/expired/<name>/<id>.json`, seed
    /// 002): no plan, restore or window uses them again; their objects are the bucket's
    /// lifecycle rule's to remove. Not in `backups`.
    pub expired: Vec<ExpiredBackup>,
}

/// A locked backup recorded as expired, whose objects are still in the store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExpiredBackup {
    pub backup_name: String,
    pub backup_id: String,
    pub started_at: Option<Timestamp>,
    /// When its lock ended.
    pub immutable_until: Timestamp,
    /// Bytes its objects still hold.
    pub size: u64,
}

/// Whether an expiry record for `stored` is honoured at `now`: only for a committed
/// backup that was locked and whose lock has ended by the wall clock — what `delete` mode
/// could have deleted. A record for anything else (planted, or written by a pass whose
/// clock was ahead) is ignored, and said.
fn expiry_holds(stored: &StoredBackup, now: Timestamp) -> Result<Timestamp, String> {
    let Some(m) = stored.metadata.as_ref() else {
        return Err("it is not a committed backup".to_owned());
    };
    match m.immutable_until {
        None => Err(
            "it was never locked (only a locked chain expires into the bucket's lifecycle)"
                .to_owned(),
        ),
        Some(until) if until > now => Err(format!("its lock lasts until {until}")),
        Some(until) => Ok(until),
    }
}

/// One `metadata.json` as a load got it.
struct Fetched {
    parsed: Result<Option<Metadata>, String>,
    /// Its cache entry, when the cache is to be written.
    entry: Option<metacache::Entry>,
    /// Taken from the cache.
    cached: bool,
}

impl Fetched {
    fn read(parsed: Result<Option<Metadata>, String>, entry: Option<metacache::Entry>) -> Self {
        Fetched {
            parsed,
            entry,
            cached: false,
        }
    }
}

impl Catalog {
    /// The scratch space the largest restore from this store takes, estimated from what is
    /// recorded (issue 28: a restore test's scratch volume is sized by it): the largest
    /// chain's content — a committed backup with its ancestors, each payload's
    /// `originalSize` (else its size) — twice over (the extracted files, then what preparing
    /// them adds), plus every indexed binlog segment (a restore to the window's end replays
    /// from the oldest kept backup), a compressed one counted [`COMPRESSED_SEGMENT_FACTOR`]
    /// times its stored size, plus [`SCRATCH_MARGIN`]. `None` when nothing is committed.
    pub fn restore_scratch_bytes(&self) -> Option<u64> {
        use std::collections::HashMap;
        let content: HashMap<&str, (u64, Option<&str>)> = self
            .backups
            .iter()
            .filter_map(|b| b.metadata.as_ref())
            .map(|m| {
                let bytes = m
                    .payload
                    .iter()
                    .map(|p| p.original_size.unwrap_or(p.size))
                    .fold(0u64, u64::saturating_add);
                (m.backup_id.as_str(), (bytes, m.parent_id.as_deref()))
            })
            .collect();
        let chain = |id: &str| {
            let (mut total, mut next) = (0u64, Some(id));
            // A chain is short; a cycle in forged metadata ends here.
            for _ in 0..=content.len() {
                let Some((bytes, parent)) = next.and_then(|i| content.get(i)) else {
                    break;
                };
                total = total.saturating_add(*bytes);
                next = *parent;
            }
            total
        };
        let largest = content.keys().map(|id| chain(id)).max()?;
        let segments = self.index.as_ref().map_or(0u64, |index| {
            let entries = index.entries().map(|e| {
                if e.compression.is_some() {
                    e.size.saturating_mul(COMPRESSED_SEGMENT_FACTOR)
                } else {
                    e.size
                }
            });
            let shards = index
                .unread()
                .map(|s| s.size.saturating_mul(COMPRESSED_SEGMENT_FACTOR));
            entries.chain(shards).fold(0u64, u64::saturating_add)
        });
        Some(
            largest
                .saturating_mul(2)
                .saturating_add(segments)
                .saturating_add(SCRATCH_MARGIN),
        )
    }

    /// Lists every backup directory, fetches each `metadata.json`, reads `_index.json` and
    /// the latest audit record. Segment objects are listed separately
    /// ([`list_segments`]), only as far as a pass needs.
    ///
    /// # Errors
    /// A failed store request, a malformed or newer `_index.json`. Malformed metadata is
    /// not an error: it is reported in [`Catalog::malformed`], and its backup is kept.
    pub async fn load(store: &ClusterStore, progress: &dyn Progress) -> Result<Self, StoreError> {
        Self::load_scoped(store, progress, Scope::Everything).await
    }

    /// The backups alone (directories and their metadata): what a schedule needs to know
    /// which of its backups exist. The binlog index, its shards, incomplete uploads and
    /// the audit records are not read, so a damaged index stops retention, not backups.
    ///
    /// # Errors
    /// A failed store request.
    pub async fn load_backups(
        store: &ClusterStore,
        progress: &dyn Progress,
    ) -> Result<Self, StoreError> {
        Self::load_scoped(store, progress, Scope::Backups).await
    }

    async fn load_scoped(
        store: &ClusterStore,
        progress: &dyn Progress,
        scope: Scope,
    ) -> Result<Self, StoreError> {
        let everything = scope == Scope::Everything;
        let observed_at = Timestamp::now();
        store.spent.reset();
        // Listing, metadata reads and the index read overlap: each metadata.json is fetched
        // as soon as the listing yields it.
        // The metadata cache, read before the listing: each body is taken from it when the
        // listing shows its object unchanged (`crate::metacache`). A local directory's
        // listing has no entity tags, so it is not read there; nor in a store with object
        // lock (no cache is written there, so one found was planted). The cache read and
        // the one to write each hold at most a quarter of the pass's metadata budget.
        let cache_use = store.metadata_cache;
        let cache_bytes = metacache::bound(store.spent.limits().metadata_bytes);
        let cache = async move {
            if cache_use == CacheUse::Off
                || store.local_dir().is_some()
                || store.object_lock.is_some()
            {
                std::sync::Arc::new(metacache::Cached::default())
            } else {
                // Its JSON (escaped bodies, keys and tags) is at most about twice the bodies.
                let text = cache_bytes.saturating_mul(2);
                std::sync::Arc::new(metacache::read(store, text).await)
            }
        }
        .shared();
        let kept = metacache::Keeper::new(cache_bytes);
        let keep = |entry| kept.keep(entry);
        // The cache's keys also split the listing into ranges listed at once (a store that
        // lists in order); without a cache it is one listing.
        let (tx, rx) = futures::channel::mpsc::unbounded::<metacache::Listed>();
        let listing = {
            let cache = cache.clone();
            async move {
                // (Only an ordered listing uses them; a local store's cache is empty.)
                let cuts = cache.await.cuts(OUTSIDE_LIST_RANGES);
                let r = list_outside_binlogs(store, progress, &tx, &cuts).await;
                drop(tx);
                r
            }
        };
        // Each body is parsed as it arrives and only the parsed metadata is kept (issue 28):
        // the bytes being read are bounded by `METADATA_BYTES_IN_FLIGHT`, those kept by the
        // pass's budget (`crate::budget`).
        let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(
            (METADATA_BYTES_IN_FLIGHT >> 10) as usize,
        ));
        // Not in a store with object lock: its bucket is versioned, and each rewrite would
        // keep the older cache as a version.
        let keep_entries = cache_use == CacheUse::Write && store.object_lock.is_none();
        // What a body parses to, counted against the pass's budget.
        let digest = |key: &Path, bytes: &[u8]| {
            let parsed = match layout::classify(key.as_ref()) {
                KeyKind::Metadata { name, id } => parse_metadata(bytes, name, id),
                _ => Err("not a metadata key".to_owned()),
            };
            // What it holds parsed (or, malformed, its text for the problem).
            let held = parsed
                .as_ref()
                .map_or(0, Metadata::footprint)
                .max(bytes.len() as u64);
            store
                .spent
                .metadata(held)
                .map_err(|e| StoreError::Request {
                    url: store.url.clone(),
                    action: format!("reading {}", store.display_key(key)),
                    answer: crate::budget::as_store_error(e),
                })?;
            Ok::<_, StoreError>(parsed)
        };
        let fetching = rx
            .map(|listed| {
                let (in_flight, cache) = (in_flight.clone(), cache.clone());
                async move {
                    let key = listed.key.clone();
                    if let Some(entry) = cache.await.body(&listed) {
                        progress.metadata_read(1);
                        let parsed = digest(&key, entry.body.as_bytes())?;
                        let entry = keep((keep_entries && parsed.is_ok()).then(|| entry.clone()));
                        let fetched = Fetched {
                            parsed: parsed.map(Some),
                            entry,
                            cached: true,
                        };
                        return Ok((key, fetched));
                    }
                    let limit = metadata_read_limit(listed.size);
                    // A read larger than the whole allowance takes all of it (reads alone).
                    let share = limit.min(METADATA_BYTES_IN_FLIGHT) >> 10;
                    let _turn = in_flight
                        .acquire_many_owned(u32::try_from(share).unwrap_or(u32::MAX))
                        .await
                        .map_err(|e| StoreError::Internal {
                            url: store.url.clone(),
                            problem: format!("metadata reads: {e}"),
                        })?;
                    // One deleted since it was listed (another pass got there first) is
                    // `None`; one too large to read is malformed, not a failed listing.
                    let fetched = match store.read_limited_with_meta(&key, limit).await {
                        Ok(f) => f,
                        Err(e @ StoreError::TooLarge { .. }) => {
                            return Ok((key, Fetched::read(Err(e.to_string()), None)));
                        }
                        Err(e) => return Err(e),
                    };
                    progress.metadata_read(1);
                    let Some((served, bytes)) = fetched else {
                        return Ok((key, Fetched::read(Ok(None), None)));
                    };
                    let parsed = digest(&key, &bytes)?;
                    let entry = if keep_entries && parsed.is_ok() {
                        keep(listed.entry(&served, &bytes))
                    } else {
                        None
                    };
                    drop(bytes);
                    Ok::<_, StoreError>((key, Fetched::read(parsed.map(Some), entry)))
                }
            })
            .buffer_unordered(METADATA_FETCH_CONCURRENCY)
            .try_collect::<HashMap<Path, Fetched>>();
        let (listed, bodies, index, shard_objects, uploads) = futures::join!(
            listing,
            fetching,
            async {
                if everything {
                    SegmentIndex::load(store).await
                } else {
                    Ok(None)
                }
            },
            async {
                if everything {
                    list_shard_objects(store).await
                } else {
                    Ok(Vec::new())
                }
            },
            async {
                if everything {
                    list_uploads(store).await
                } else {
                    Ok(Vec::new())
                }
            }
        );
        let (listed, fetched, index, shard_objects) = (listed?, bodies?, index?, shard_objects?);
        let metadata_from_cache = fetched.values().filter(|f| f.cached).count();
        let mut entries = std::collections::BTreeMap::new();
        let mut bodies = HashMap::with_capacity(fetched.len());
        for (key, f) in fetched {
            if let Some(entry) = f.entry {
                entries.insert(key.as_ref().to_owned(), entry);
            }
            bodies.insert(key, f.parsed);
        }
        // A cache larger than its bound is not written (the store is read as without one).
        let fits = kept.fits();
        if keep_entries && fits && !cache.await.holds(&entries) {
            metacache::write(store, entries).await;
        } else if keep_entries && !fits {
            tracing::info!(
                bound = cache_bytes,
                "the metadata.json bodies are more than the metadata cache holds; it is not written"
            );
        }

        let objects_listed = listed.objects.len();
        let mut foreign = listed.foreign;
        let mut leftovers = listed.leftovers;
        let mut warnings = Vec::new();
        match uploads {
            Ok(u) => leftovers.extend(u),
            Err(e) => warnings.push(format!(
                "incomplete multipart uploads could not be listed, so none is collected this pass: {e}"
            )),
        }
        let mut dirs: BTreeMap<(String, String), Dir> = BTreeMap::new();
        let mut audits = Vec::new();
        let mut expiry_records: HashSet<(String, String)> = HashSet::new();
        for meta in listed.objects {
            let key = meta.location.as_ref().to_owned();
            match layout::classify(&key) {
                KeyKind::Metadata { name, id } => {
                    dirs.entry((name.to_owned(), id.to_owned()))
                        .or_default()
                        .metadata = Some(meta);
                }
                KeyKind::Marker { name, id } => {
                    let dir = dirs.entry((name.to_owned(), id.to_owned())).or_default();
                    dir.heartbeat = Some(to_ts(meta.last_modified));
                    dir.payload.push(meta);
                }
                KeyKind::Payload { name, id } => {
                    let dir = dirs.entry((name.to_owned(), id.to_owned())).or_default();
                    if meta.location.filename() == Some(layout::DELETION_MARK) {
                        dir.deletion_requested = true;
                    }
                    dir.payload.push(meta);
                }
                KeyKind::Audit => audits.push(meta.location),
                KeyKind::State => {
                    if let Some((name, id)) = layout::expiry_of(&key) {
                        expiry_records.insert((name.to_owned(), id.to_owned()));
                    }
                }
                KeyKind::Segment { .. }
                | KeyKind::Index
                | KeyKind::IndexShard
                | KeyKind::Foreign => {
                    foreign.push(store.display_key(&meta.location));
                }
            }
        }

        if !everything {
            audits.clear();
        }
        let interrupted = match latest_audit_deletions(store, audits, observed_at).await? {
            Ok(ids) => ids,
            Err(problem) => {
                warnings.push(problem);
                HashSet::new()
            }
        };

        let mut backups = Vec::with_capacity(dirs.len());
        let mut malformed: Vec<Malformed> = Vec::new();
        for ((name, id), dir) in dirs {
            let last_modified = dir
                .payload
                .iter()
                .chain(dir.metadata.iter())
                .map(|m| to_ts(m.last_modified))
                .max()
                .unwrap_or(Timestamp::UNIX_EPOCH);
            let size: u64 = dir.payload.iter().map(|m| m.size).sum();
            let sizes: HashMap<&str, u64> = dir
                .payload
                .iter()
                .filter_map(|m| Some((m.location.filename()?, m.size)))
                .collect();
            let body = dir
                .metadata
                .as_ref()
                .and_then(|m| bodies.remove(&m.location));
            let parsed = match (&dir.metadata, body) {
                (Some(meta), Some(Ok(Some(m)))) => Some((meta.location.clone(), Ok(m))),
                (Some(meta), Some(Err(problem))) => Some((meta.location.clone(), Err(problem))),
                _ => None,
            };
            let mut stored = StoredBackup {
                backup: uncommitted(&name, &id, last_modified, size),
                metadata_key: None,
                payload_keys: Vec::new(),
                metadata: None,
                problem: None,
            };
            match parsed {
                Some((key, Ok(m))) => {
                    let missing = missing_payload(&m, &sizes);
                    stored.backup = backup_from_metadata(&m, &name, last_modified, size);
                    stored.backup.payload_missing = missing.is_some();
                    stored.backup.deletion_requested = dir.deletion_requested;
                    stored.problem = missing;
                    stored.metadata_key = Some(key);
                    stored.metadata = Some(m);
                }
                Some((key, Err(problem))) => {
                    malformed.push(Malformed {
                        key: store.display_key(&key),
                        problem: problem.clone(),
                    });
                    // Kept, never counted, and holding the binlogs from its start.
                    stored.backup.phase = Phase::Malformed;
                    stored.problem = Some(problem);
                    stored.metadata_key = Some(key);
                }
                None => {
                    stored.backup.interrupted_delete = interrupted.contains(&id);
                    stored.backup.heartbeat_at = dir.heartbeat;
                }
            }
            stored.payload_keys = dir.payload.into_iter().map(|m| m.location).collect();
            backups.push(stored);
        }

        // Locked chains a pass recorded as expired leave every plan, restore and window —
        // while the store leaves them to the bucket (`afterExpiry: lifecycle`). A store
        // opened to delete them itself (`afterExpiry: delete`, a policy switched since)
        // sees them again, so that its pass deletes what the bucket was left.
        let mut expired = Vec::new();
        if !expiry_records.is_empty()
            && store.lock_expiry() == tidemark_core::lock::LockExpiry::Lifecycle
        {
            // A record counts only with its whole chain above it: a backup some live
            // backup builds on is locked as long as that one (its lock on the server was
            // raised with it), whatever its own metadata says.
            let mut honoured: HashSet<String> = backups
                .iter()
                .filter(|b| {
                    expiry_records.contains(&(b.backup.name.clone(), b.backup.id.clone()))
                        && expiry_holds(b, observed_at).is_ok()
                })
                .map(|b| b.backup.id.clone())
                .collect();
            loop {
                let built_on: HashSet<String> = backups
                    .iter()
                    .filter(|b| !honoured.contains(&b.backup.id))
                    .filter_map(|b| b.backup.kind.parent().cloned())
                    .collect();
                let before = honoured.len();
                honoured.retain(|id| !built_on.contains(id));
                if honoured.len() == before {
                    break;
                }
            }
            let mut live = Vec::with_capacity(backups.len());
            for stored in backups {
                let record = (stored.backup.name.clone(), stored.backup.id.clone());
                if !expiry_records.remove(&record) {
                    live.push(stored);
                    continue;
                }
                let holds = if honoured.contains(&stored.backup.id) {
                    expiry_holds(&stored, observed_at)
                } else {
                    expiry_holds(&stored, observed_at).and(Err(
                        "a backup that is not expired builds on it (its chain is locked as long as that one)".to_owned(),
                    ))
                };
                match holds {
                    Ok(until) => expired.push(ExpiredBackup {
                        backup_name: record.0,
                        backup_id: record.1,
                        started_at: Some(stored.backup.started_at),
                        immutable_until: until,
                        size: stored.backup.size,
                    }),
                    Err(why) => {
                        warnings.push(format!(
                            "the expiry record {} is ignored: {why}",
                            store.display_key(&layout::expiry_key(&record.0, &record.1))
                        ));
                        live.push(stored);
                    }
                }
            }
            backups = live;
        }

        // Staging files and uploads are ours only where the layout says so (inside a backup
        // directory they belong to that attempt); any other is foreign, and stays.
        let (ours, theirs): (Vec<Leftover>, Vec<Leftover>) = leftovers
            .into_iter()
            .partition(|l| leftover_kind(l).is_some());
        foreign.extend(
            theirs
                .iter()
                .map(|l| format!("{}/{} (unfinished upload)", store.cluster, l.key)),
        );
        let mut leftovers = ours;
        for l in &mut leftovers {
            if let Some(KeyKind::Payload { id, .. }) = leftover_kind(l) {
                l.attempt = Some(id.to_owned());
            }
        }
        foreign.sort();
        let mut catalog = Catalog {
            backups,
            foreign,
            malformed,
            ignored: Vec::new(),
            index,
            shard_objects,
            leftovers,
            warnings,
            observed_at,
            objects_listed,
            metadata_from_cache,
            expired,
        };
        catalog.check_index_entries(store);
        Ok(catalog)
    }

    /// In a store that locks (a lock mode is set), the locks the server holds on what
    /// `plan` deletes, where they may outlast what is recorded: an uncommitted attempt or a
    /// failed record (no date on record), or a backup whose recorded date has passed. A
    /// commit locks the payloads before it writes the locked `metadata.json`, and an
    /// increment that outlives its chain locks the older backups longer first; a crash
    /// between such steps leaves objects the server holds longer than any record says, and
    /// without this every pass would plan their deletion and be refused until the lock
    /// ends. The latest date found in the future becomes the backup's `immutable_until`
    /// (the planner then keeps it, `locked:<date>`); returns whether any did, so the caller
    /// plans again. Only deletion candidates are read (a pass deletes them anyway, which
    /// costs more requests than this), at most [`LOCK_READS_PER_BACKUP`] payload objects
    /// each. A lock that cannot be read is a warning: the delete is then refused by the
    /// server, and nothing is lost.
    pub async fn read_server_locks(
        &mut self,
        store: &ClusterStore,
        plan: &tidemark_core::Plan,
    ) -> bool {
        if store.object_lock().is_none() {
            return false;
        }
        let now = plan.now;
        // One lookup table, not a scan per deletion: a pass may delete thousands.
        let at: HashMap<(&str, &str), usize> = self
            .backups
            .iter()
            .enumerate()
            .map(|(i, b)| ((b.backup.name.as_str(), b.backup.id.as_str()), i))
            .collect();
        let candidates: Vec<usize> = plan
            .deletions()
            .filter_map(|d| {
                at.get(&(d.backup.name.as_str(), d.backup.id.as_str()))
                    .copied()
            })
            .filter(|&i| {
                self.backups[i]
                    .backup
                    .immutable_until
                    .is_none_or(|t| t <= now)
            })
            .collect();
        let keys: Vec<(usize, Path)> = candidates
            .into_iter()
            .flat_map(|i| {
                self.backups[i]
                    .payload_keys
                    .iter()
                    .filter(|k| k.filename().is_some_and(layout::is_payload_name))
                    .take(LOCK_READS_PER_BACKUP)
                    .map(move |k| (i, k.clone()))
            })
            .collect();
        let found: Vec<(
            usize,
            Result<Option<crate::objectlock::Retention>, StoreError>,
        )> = futures::stream::iter(keys)
            .map(|(i, key)| async move { (i, store.retention(&key).await) })
            .buffer_unordered(LOCK_READ_CONCURRENCY)
            .collect()
            .await;
        let mut changed = false;
        let mut warned: HashSet<usize> = HashSet::new();
        for (i, r) in found {
            match r {
                Ok(Some(r)) if r.until > now => {
                    let b = &mut self.backups[i].backup;
                    b.immutable_until = b.immutable_until.max(Some(r.until));
                    changed = true;
                }
                Ok(_) => {}
                Err(StoreError::Request { answer, .. }) if is_not_found(&answer) => {}
                Err(e) => {
                    if warned.insert(i) {
                        let b = &self.backups[i].backup;
                        let why =
                            std::error::Error::source(&e).map_or(e.to_string(), |s| s.to_string());
                        self.warnings.push(format!(
                            "the lock of {}/{} could not be read ({why}); should the server hold it, its delete is refused until then",
                            b.name, b.id
                        ));
                    }
                }
            }
        }
        changed
    }

    /// Reports the index entries read so far that are outside the layout's grammar (they
    /// are left out of the inventory). Called again after more shards are read.
    pub fn check_index_entries(&mut self, store: &ClusterStore) {
        let Some(index) = &self.index else { return };
        let key = store.display_key(&layout::index_key());
        let mut seen: HashSet<(u64, &str)> = HashSet::new();
        let mut ignored = Vec::new();
        for e in index.entries() {
            let problem = if !layout::is_segment_name(&e.name) {
                Some(format!(
                    "entry {:?} (sequence {}): not a binlog segment name (<base>.<digits>: letters, digits, '-', '_', '.'); ignored",
                    e.name, e.sequence
                ))
            } else if tidemark_core::inventory::segment_sequence(&e.name) != Some(e.sequence) {
                Some(format!(
                    "entry {:?} says sequence {}, but its name says {}; ignored",
                    e.name,
                    e.sequence,
                    tidemark_core::inventory::segment_sequence(&e.name).unwrap_or_default()
                ))
            } else if !seen.insert((e.sequence, e.name.as_str())) {
                Some(format!(
                    "entry {:?} (sequence {}) appears more than once; the first counts",
                    e.name, e.sequence
                ))
            } else {
                None
            };
            if let Some(problem) = problem {
                ignored.push(Malformed {
                    key: key.clone(),
                    problem,
                });
            }
        }
        self.ignored = ignored;
    }

    /// Unread index shards that a listing below `below` reaches (whose segments must be
    /// known one by one to be matched with listed objects).
    pub fn shards_below(&self, below: u64) -> Vec<String> {
        self.index
            .iter()
            .flat_map(|i| i.unread())
            .filter(|s| s.first_sequence < below)
            .map(|s| s.key.clone())
            .collect()
    }

    /// The planner's view. Index entries at or above `listing.listed_below` were not
    /// listed and are taken as present (deleting a missing object is harmless).
    pub fn inventory(&self, listing: &SegmentListing) -> Inventory {
        let listed: HashMap<&str, &SegmentObject> = listing
            .objects
            .iter()
            .map(|o| (o.name.as_str(), o))
            .collect();
        let below = listing.listed_below.unwrap_or(0);
        let mut segments = Vec::new();
        let mut indexed = HashSet::new();
        // Sequence ranges of unread shards: a listed object inside one is indexed there.
        let mut summarised: Vec<(u64, u64)> = Vec::new();
        let mut seen: HashSet<(u64, &str)> = HashSet::new();
        if let Some(idx) = &self.index {
            for e in idx.entries() {
                // Outside the grammar (reported in `ignored`): never a segment of ours.
                if !crate::format::is_index_entry(e) || !seen.insert((e.sequence, e.name.as_str()))
                {
                    continue;
                }
                indexed.insert(e.name.as_str());
                segments.push(Segment {
                    present: e.sequence >= below || listed.contains_key(e.name.as_str()),
                    gtids: e.segment_gtids().map(Box::new),
                    ..Segment::new(
                        e.name.clone(),
                        e.sequence,
                        e.first_event_at,
                        e.last_event_at,
                        e.size,
                    )
                });
            }
            for s in idx.unread() {
                summarised.push((s.first_sequence, s.last_sequence));
                segments.push(Segment {
                    span: s.last_sequence - s.first_sequence + 1,
                    summary: true,
                    ..Segment::new(
                        s.key.clone(),
                        s.first_sequence,
                        s.first_event_at,
                        s.last_event_at,
                        s.size,
                    )
                });
            }
        }
        summarised.sort_unstable();
        let in_summary = |seq: u64| {
            let k = summarised.partition_point(|r| r.1 < seq);
            k < summarised.len() && summarised[k].0 <= seq
        };
        for o in &listing.objects {
            if !indexed.contains(o.name.as_str()) && !in_summary(o.sequence) {
                segments.push(Segment {
                    indexed: false,
                    ..Segment::new(o.name.clone(), o.sequence, None, None, o.size)
                });
            }
        }
        let named: HashSet<&str> = self
            .index
            .iter()
            .flat_map(|i| i.head.shards.iter().map(|s| s.key.as_str()))
            .collect();
        let prefix = format!("{}/", layout::BINLOGS);
        let unreferenced = self.shard_objects.iter().filter_map(|m| {
            let rel = m.location.as_ref().strip_prefix(&prefix)?;
            (!named.contains(rel)).then(|| Leftover {
                key: m.location.to_string(),
                kind: LeftoverKind::UnreferencedShard,
                last_modified: to_ts(m.last_modified),
                size: m.size,
                attempt: None,
                upload_id: None,
            })
        });
        Inventory {
            timelines: self
                .index
                .as_ref()
                .map(|i| i.head.timelines.clone())
                .unwrap_or_default(),
            observed_at: Some(self.observed_at),
            backups: self.backups.iter().map(|b| b.backup.clone()).collect(),
            segments,
            leftovers: self
                .leftovers
                .iter()
                .chain(&listing.leftovers)
                .cloned()
                .chain(unreferenced)
                .collect(),
        }
    }

    /// The stored backup `<name>/<id>/`. Both parts: a directory copied under another
    /// name keeps its id, and must not be mistaken for the original.
    pub fn backup(&self, name: &str, id: &str) -> Option<&StoredBackup> {
        self.backups
            .iter()
            .find(|b| b.backup.id == id && b.backup.name == name)
    }

    /// Whether any backup has this id (for `--protect`).
    pub fn has_id(&self, id: &str) -> bool {
        self.backups.iter().any(|b| b.backup.id == id)
    }
}

#[derive(Default)]
struct Dir {
    metadata: Option<ObjectMeta>,
    payload: Vec<ObjectMeta>,
    /// The in-flight marker's last write.
    heartbeat: Option<Timestamp>,
    /// It holds [`layout::DELETION_MARK`].
    deletion_requested: bool,
}

/// What the object an unfinished upload was writing would be, if it is one of Tidemark's.
fn leftover_kind(l: &Leftover) -> Option<KeyKind<'_>> {
    let target = match l.kind {
        LeftoverKind::StagingFile => l.key.rsplit_once('#').map_or(l.key.as_str(), |(k, _)| k),
        LeftoverKind::IncompleteUpload | LeftoverKind::UnreferencedShard => l.key.as_str(),
    };
    match layout::classify(target) {
        KeyKind::Foreign => None,
        kind => Some(kind),
    }
}

/// An attempt directory without (readable) `metadata.json`.
fn uncommitted(name: &str, id: &str, last_modified: Timestamp, size: u64) -> Backup {
    Backup {
        phase: Phase::Uncommitted,
        completed_at: None,
        last_modified,
        ..Backup::completed_full(
            id,
            name,
            id_time(id).unwrap_or(last_modified),
            last_modified,
            size,
        )
    }
}

/// Why the payload `metadata.json` records is not all there: the first object missing or
/// of another size. An attempt recorded as failed has nothing to miss.
fn missing_payload(m: &Metadata, sizes: &HashMap<&str, u64>) -> Option<String> {
    if m.phase != MetadataPhase::Completed {
        return None;
    }
    if m.payload.is_empty() {
        return Some("metadata.json records no payload object".to_owned());
    }
    m.payload
        .iter()
        .find_map(|p| match sizes.get(p.name.as_str()) {
            None => Some(format!("payload {} is missing", p.name)),
            Some(&size) if size != p.size => Some(format!(
                "payload {} has {size} bytes; metadata.json records {}",
                p.name, p.size
            )),
            Some(_) => None,
        })
}

/// object_store reports times as chrono values.
pub fn to_ts(t: chrono::DateTime<chrono::Utc>) -> Timestamp {
    Timestamp::new(t.timestamp(), t.timestamp_subsec_nanos() as i32)
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// `YYYYMMDDTHHMMSSZ` at the start of a backup-id.
pub fn id_time(id: &str) -> Option<Timestamp> {
    let s = id.get(..16)?;
    let text = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &s[0..4],
        &s[4..6],
        &s[6..8],
        &s[9..11],
        &s[11..13],
        &s[13..15]
    );
    text.parse().ok()
}

fn parse_metadata(bytes: &[u8], name: &str, id: &str) -> Result<Metadata, String> {
    let m: Metadata = serde_json::from_slice(bytes).map_err(|e| {
        format!(
            "not valid metadata: {e}; expected the metadata.json format (formatVersion, backupId, backupName, cluster, type, method, phase, startedAt, …; see docs/retention.md)"
        )
    })?;
    m.check(name, id).map_err(|e| e.to_string())?;
    Ok(m)
}

fn backup_from_metadata(m: &Metadata, name: &str, last_modified: Timestamp, size: u64) -> Backup {
    let payload_size: u64 = m.payload.iter().map(|p| p.size).sum();
    Backup {
        id: m.backup_id.clone(),
        name: name.to_owned(),
        kind: match (m.kind, &m.parent_id) {
            (BackupType::Incremental, Some(p)) => BackupKind::Incremental(p.clone()),
            _ => BackupKind::Full,
        },
        phase: match m.phase {
            MetadataPhase::Completed => Phase::Completed,
            MetadataPhase::Failed => Phase::Failed,
        },
        started_at: m.started_at,
        completed_at: m.completed_at,
        last_modified,
        immutable_until: m.immutable_until,
        ttl: m.ttl,
        protected: m.labels.get(PROTECT_LABEL).is_some_and(|v| v == "true"),
        newer_format: m.format_version > METADATA_FORMAT_VERSION,
        interrupted_delete: false,
        log_file: m.log_position.as_ref().map(|p| p.file.clone()),
        size: if payload_size > 0 { payload_size } else { size },
        consolidated_from: m.consolidated_from(),
        consolidatable: CONSOLIDATABLE_METHODS.contains(&m.method.as_str()),
        payload_missing: false,
        heartbeat_at: None,
        deletion_requested: false,
        gtid: m.gtid_position(),
        gtid_set: m.gtid_set(),
        server_id: m.server.as_ref().and_then(|s| s.server_id),
        galera: m.server.as_ref().is_some_and(|s| s.galera),
        held_for: Vec::new(),
        awaiting_copy: Vec::new(),
        guarded: false,
    }
}

/// What the listing outside `binlogs/` found.
#[derive(Debug, Default)]
struct Listed {
    objects: Vec<ObjectMeta>,
    /// Entries no key can name (a local store's symlinks and non-UTF-8 names).
    foreign: Vec<String>,
    /// Staging files of a local store.
    leftovers: Vec<Leftover>,
}

/// Staging files found by a local walk, as leftovers (keys relative to the cluster).
fn staged(walked: Vec<crate::local::Staged>) -> Vec<Leftover> {
    walked
        .into_iter()
        .map(|s| Leftover {
            key: s.key,
            kind: LeftoverKind::StagingFile,
            last_modified: s.last_modified,
            size: s.size,
            attempt: None,
            upload_id: None,
        })
        .collect()
}

/// Walks a local store's cluster directory (or part of it) on a blocking thread.
async fn walk_local(
    store: &ClusterStore,
    dir: &std::path::Path,
    prefix: &str,
    skip: &'static [&'static str],
) -> Result<crate::local::Walk, StoreError> {
    let (dir, prefix_owned) = (dir.to_path_buf(), prefix.to_owned());
    let walked =
        tokio::task::spawn_blocking(move || crate::local::walk(&dir, &prefix_owned, skip)).await;
    let err = |source: Box<dyn std::error::Error + Send + Sync>| StoreError::Request {
        url: store.url.clone(),
        action: format!("listing {}/{prefix}", store.cluster),
        answer: object_store::Error::Generic {
            store: "LocalFileSystem",
            source,
        },
    };
    match walked {
        Ok(Ok(w)) => Ok(w),
        Ok(Err(e)) => Err(err(Box::new(e))),
        Err(e) => Err(err(Box::new(e))),
    }
}

/// The objects under `prefix` after `offset`. The offset is checked here too: a server
/// may ignore it (Azurite ignores Azure's `startFrom` and lists from the start, which read
/// every key twice and took `binlogs/` for foreign objects) — then this is only slower.
fn list_after(
    store: &ClusterStore,
    prefix: Option<&Path>,
    offset: &Path,
) -> futures::stream::BoxStream<'static, object_store::Result<ObjectMeta>> {
    let after = offset.clone();
    store
        .inner
        .list_with_offset(prefix, offset)
        .try_filter(move |m| futures::future::ready(m.location > after))
        .boxed()
}

/// Lists every object of the cluster except `binlogs/`, which can hold millions of
/// segments. Ordered backends skip it with a start-after listing, in ranges split at `cuts`
/// listed at once (any keys in increasing order: the ranges cover every key once whatever
/// they are); a local directory is walked, skipping it, without following links.
async fn list_outside_binlogs(
    store: &ClusterStore,
    progress: &dyn Progress,
    metadata_keys: &futures::channel::mpsc::UnboundedSender<metacache::Listed>,
    cuts: &[Path],
) -> Result<Listed, StoreError> {
    let announce = |meta: &ObjectMeta| {
        if matches!(
            layout::classify(meta.location.as_ref()),
            KeyKind::Metadata { .. }
        ) {
            // The receiver lives as long as the load; a send can only fail after it ended.
            let _ = metadata_keys.unbounded_send(metacache::Listed::of(meta));
        }
    };
    let err = |source| StoreError::Request {
        url: store.url.clone(),
        action: format!("listing {}/", store.cluster),
        answer: source,
    };
    let mut out = Listed::default();
    if let Some(dir) = store.local_dir() {
        let walked = walk_local(store, dir, "", &[layout::BINLOGS]).await?;
        progress.listed(walked.objects.len());
        for meta in &walked.objects {
            announce(meta);
        }
        out.objects = walked.objects;
        out.foreign = walked
            .foreign
            .into_iter()
            .map(|f| format!("{}/{f}", store.cluster))
            .collect();
        out.leftovers = staged(walked.staging);
    } else if store.backend.lists_in_order() {
        let seen = |meta: &ObjectMeta| {
            progress.listed(1);
            announce(meta);
        };
        let cuts: Vec<&Path> = cuts.iter().collect();
        let parts = futures::future::try_join_all(
            ranges(&cuts)
                .into_iter()
                .map(|(after, through)| list_outside_range(store, after, through, &seen)),
        )
        .await
        .map_err(err)?;
        for mut part in parts {
            out.objects.append(&mut part);
        }
    } else {
        let top = store.inner.list_with_delimiter(None).await;
        let top = match top {
            Ok(t) => t,
            Err(e) if is_not_found(&e) => return Ok(out),
            Err(e) => return Err(err(e)),
        };
        out.objects.extend(top.objects);
        for dir in top.common_prefixes {
            if dir.as_ref() == layout::BINLOGS {
                continue;
            }
            let mut s = store.inner.list(Some(&dir));
            while let Some(meta) = s.try_next().await.map_err(err)? {
                progress.listed(1);
                announce(&meta);
                out.objects.push(meta);
            }
        }
    }
    Ok(out)
}

/// The ranges increasing `cuts` split a listing into: (after, through] pairs, the first
/// from the start, the last to the end (one whole range without cuts).
fn ranges<T: Copy>(cuts: &[T]) -> Vec<(Option<T>, Option<T>)> {
    let starts = std::iter::once(None).chain(cuts.iter().copied().map(Some));
    let ends = cuts.iter().copied().map(Some).chain(std::iter::once(None));
    starts.zip(ends).collect()
}

/// One range of [`list_outside_binlogs`] on an ordered backend: the keys after `after`
/// (exclusive) up to `through` (inclusive), skipping `binlogs/`.
async fn list_outside_range(
    store: &ClusterStore,
    after: Option<&Path>,
    through: Option<&Path>,
    seen: &(dyn Fn(&ObjectMeta) + Sync),
) -> object_store::Result<Vec<ObjectMeta>> {
    let binlogs_start = format!("{}/", layout::BINLOGS);
    // '0' is the byte after '/', so this resumes right after every `binlogs/` key.
    let binlogs_end = Path::from(format!("{}0", layout::BINLOGS));
    let mut out = Vec::new();
    let mut s = match after {
        None => store.inner.list(None),
        Some(a) => list_after(store, None, a),
    };
    while let Some(meta) = s.try_next().await? {
        if through.is_some_and(|t| meta.location > *t) {
            break;
        }
        let key = meta.location.as_ref();
        if key >= binlogs_start.as_str() && key < binlogs_end.as_ref() {
            if through.is_some_and(|t| *t < binlogs_end) {
                break;
            }
            s = list_after(store, None, &binlogs_end);
            continue;
        }
        seen(&meta);
        out.push(meta);
    }
    Ok(out)
}

/// Incomplete multipart uploads under the cluster (S3; none elsewhere).
async fn list_uploads(store: &ClusterStore) -> Result<Vec<Leftover>, StoreError> {
    let Some(s3) = store.s3() else {
        return Ok(Vec::new());
    };
    let uploads = s3
        .list_incomplete()
        .await
        .map_err(|source| StoreError::Request {
            url: store.url.clone(),
            action: format!("listing incomplete uploads under {}/", store.cluster),
            answer: source,
        })?;
    Ok(uploads
        .into_iter()
        .map(|u| Leftover {
            key: u.key,
            kind: LeftoverKind::IncompleteUpload,
            last_modified: u.initiated,
            size: 0,
            attempt: None,
            upload_id: Some(u.upload_id),
        })
        .collect())
}

/// Concurrent listings of the segment range on ordered backends.
const SEGMENT_LIST_RANGES: usize = 8;

/// Lists segment objects with a sequence below `below`. On ordered backends, when segment
/// names sort in sequence order (same digit count, checked by the caller), the listing
/// stops at the first key past the bound — so a pass costs what it deletes, not the
/// archive's size — and runs as several concurrent range listings split at `split_names`
/// (names of indexed segments below the bound, ascending).
pub async fn list_segments(
    store: &ClusterStore,
    below: u64,
    same_width_names: bool,
    split_names: &[&str],
    progress: &dyn Progress,
) -> Result<SegmentListing, StoreError> {
    if let Some(dir) = store.local_dir() {
        let walked = walk_local(store, dir, layout::BINLOGS, &[]).await?;
        progress.listed(walked.objects.len());
        let mut listing = SegmentListing {
            listed_below: Some(below),
            ..Default::default()
        };
        for meta in walked.objects {
            match layout::classify(meta.location.as_ref()) {
                KeyKind::Segment { name } => {
                    if let Some(sequence) = tidemark_core::inventory::segment_sequence(name)
                        && sequence < below
                    {
                        listing.objects.push(SegmentObject {
                            name: name.to_owned(),
                            sequence,
                            size: meta.size,
                        });
                    }
                }
                KeyKind::Index | KeyKind::IndexShard => {}
                _ => listing.foreign.push(store.display_key(&meta.location)),
            }
        }
        listing.foreign.extend(
            walked
                .foreign
                .into_iter()
                .map(|f| format!("{}/{f}", store.cluster)),
        );
        listing.leftovers = staged(walked.staging);
        listing.objects.sort_by_key(|o| o.sequence);
        return Ok(listing);
    }
    let can_stop = store.backend.lists_in_order() && same_width_names;
    let cuts: Vec<&str> = if can_stop && split_names.len() > 1 {
        let step = split_names.len().div_ceil(SEGMENT_LIST_RANGES);
        split_names.iter().step_by(step).skip(1).copied().collect()
    } else {
        Vec::new()
    };
    let parts = futures::future::try_join_all(ranges(&cuts).into_iter().map(|(after, through)| {
        list_segment_range(store, after, through, below, can_stop, progress)
    }))
    .await?;
    let mut listing = SegmentListing {
        listed_below: Some(below),
        ..Default::default()
    };
    for mut part in parts {
        listing.objects.append(&mut part.objects);
        listing.foreign.append(&mut part.foreign);
    }
    listing.objects.sort_by_key(|o| o.sequence);
    listing.objects.dedup_by(|a, b| a.name == b.name);
    Ok(listing)
}

/// One range of [`list_segments`]: segment keys after `after` (exclusive) up to `through`
/// (inclusive), or to the bound when `through` is `None`.
async fn list_segment_range(
    store: &ClusterStore,
    after: Option<&str>,
    through: Option<&str>,
    below: u64,
    can_stop: bool,
    progress: &dyn Progress,
) -> Result<SegmentListing, StoreError> {
    let prefix = Path::from(layout::BINLOGS);
    let mut listing = SegmentListing::default();
    let through_key = through.map(layout::segment_key);
    let mut s = match after {
        None => store.inner.list(Some(&prefix)),
        Some(name) => list_after(store, Some(&prefix), &layout::segment_key(name)),
    };
    loop {
        let meta = match s.try_next().await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) if is_not_found(&e) => break,
            Err(source) => {
                return Err(StoreError::Request {
                    url: store.url.clone(),
                    action: format!("listing {}/{}/", store.cluster, layout::BINLOGS),
                    answer: source,
                });
            }
        };
        if through_key.as_ref().is_some_and(|t| meta.location > *t) {
            break;
        }
        progress.listed(1);
        let key = meta.location.as_ref().to_owned();
        match layout::classify(&key) {
            KeyKind::Segment { name } => {
                let Some(sequence) = tidemark_core::inventory::segment_sequence(name) else {
                    continue;
                };
                if sequence < below {
                    listing.objects.push(SegmentObject {
                        name: name.to_owned(),
                        sequence,
                        size: meta.size,
                    });
                } else if can_stop {
                    break;
                }
            }
            KeyKind::Index | KeyKind::IndexShard => {}
            _ => listing.foreign.push(store.display_key(&meta.location)),
        }
    }
    Ok(listing)
}

/// Lists `binlogs/_index/` (index shards).
async fn list_shard_objects(store: &ClusterStore) -> Result<Vec<ObjectMeta>, StoreError> {
    let prefix = layout::index_shards_prefix();
    match store
        .inner
        .list(Some(&prefix))
        .try_collect::<Vec<_>>()
        .await
    {
        Ok(v) => Ok(v),
        Err(e) if is_not_found(&e) => Ok(Vec::new()),
        Err(source) => Err(StoreError::Request {
            url: store.url.clone(),
            action: format!("listing {}/{}/", store.cluster, prefix),
            answer: source,
        }),
    }
}

/// Backup-ids the newest audit record meant to delete: an uncommitted directory among
/// them is the remains of an interrupted deletion.
async fn latest_audit_deletions(
    store: &ClusterStore,
    mut audits: Vec<Path>,
    observed_at: Timestamp,
) -> Result<Result<HashSet<String>, String>, StoreError> {
    // A record is written at the time in its name: one from beyond any clock's skew is not
    // a pass's, and must not hide the latest real one.
    let latest_possible = observed_at
        .checked_add(jiff::SignedDuration::from_hours(24))
        .unwrap_or(Timestamp::MAX);
    audits.retain(|p| {
        p.filename()
            .and_then(layout::audit_time)
            .is_some_and(|t| t <= latest_possible)
    });
    audits.sort();
    let Some(latest) = audits.pop() else {
        return Ok(Ok(HashSet::new()));
    };
    let Some(bytes) = store.read(&latest).await? else {
        return Ok(Ok(HashSet::new()));
    };
    Ok(match serde_json::from_slice::<AuditRecord>(&bytes) {
        Ok(record) => Ok(record
            .backups
            .into_iter()
            .filter(|b| b.action == "delete")
            .map(|b| b.backup_id)
            .collect()),
        Err(e) => Err(format!(
            "the latest audit record {} is not valid ({e}): a deletion it records as interrupted is left to failedBackupsTTL",
            store.display_key(&latest)
        )),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::open::Backend;

    /// Issue 32 §2: the listing outside `binlogs/` split at any increasing keys — the
    /// cache's, or a forged cache's (inside `binlogs/`, before or after every key) — lists
    /// exactly what one listing does, in the same order, and never a segment.
    /// Seed 002's expiry records hide a chain only when honest: a record for a backup that
    /// was never locked, whose lock lasts, or that a live increment builds on is ignored
    /// and said (what a bucket writer could plant); with its whole chain recorded, the
    /// chain leaves the catalog. Mutation tried: no chain check — the full left alone.
    #[tokio::test]
    async fn expiry_records_hide_only_ended_locked_whole_chains() {
        use crate::synth::SynthBackup;
        let inner: std::sync::Arc<dyn object_store::ObjectStore> =
            std::sync::Arc::new(object_store::memory::InMemory::new());
        let store = ClusterStore::from_object_store(inner, "c", Backend::Memory).unwrap();
        let now = Timestamp::now();
        let ago = |h: i64| now - jiff::SignedDuration::from_hours(h);
        let mut full = SynthBackup::full("n", ago(50), 1);
        full.immutable_until = Some(ago(2));
        let mut inc = SynthBackup::incremental("n", &full.id, ago(40), 2);
        inc.immutable_until = Some(ago(2));
        let never = SynthBackup::full("n", ago(30), 3);
        let mut lasting = SynthBackup::full("n", ago(20), 4);
        lasting.immutable_until = Some(now + jiff::SignedDuration::from_hours(2));
        crate::synth::write_backups(
            &store,
            &[full.clone(), inc.clone(), never.clone(), lasting.clone()],
        )
        .await
        .unwrap();
        let record = |b: &SynthBackup| {
            let key = crate::layout::expiry_key(&b.name, &b.id);
            let store = store.clone();
            async move {
                crate::synth::write_raw(&store, key.as_ref(), b"{}")
                    .await
                    .unwrap()
            }
        };
        for b in [&full, &never, &lasting] {
            record(b).await;
        }
        let ids = |c: &Catalog| {
            c.backups
                .iter()
                .map(|b| b.backup.id.clone())
                .collect::<Vec<_>>()
        };
        let c = Catalog::load(&store, &crate::progress::NoProgress)
            .await
            .unwrap();
        assert!(c.expired.is_empty(), "{:?}", c.expired);
        assert_eq!(ids(&c).len(), 4);
        let warned = c.warnings.join("\n");
        for why in ["builds on it", "never locked", "its lock lasts until"] {
            assert!(warned.contains(why), "{why}: {warned}");
        }
        // The increment recorded too: the whole chain leaves.
        record(&inc).await;
        let c = Catalog::load(&store, &crate::progress::NoProgress)
            .await
            .unwrap();
        let mut gone: Vec<String> = c.expired.iter().map(|e| e.backup_id.clone()).collect();
        gone.sort();
        let mut chain = vec![full.id.clone(), inc.id.clone()];
        chain.sort();
        assert_eq!(gone, chain);
        assert_eq!(ids(&c), vec![never.id.clone(), lasting.id.clone()]);
        // A store that deletes expired chains itself (a policy switched to `afterExpiry:
        // delete`) sees them again: its pass deletes what was left to the bucket.
        // Mutation tried: records honoured in both modes — the chain stayed hidden.
        let deleting = store
            .clone()
            .with_lock_expiry(tidemark_core::lock::LockExpiry::Delete);
        let c = Catalog::load(&deleting, &crate::progress::NoProgress)
            .await
            .unwrap();
        assert!(c.expired.is_empty(), "{:?}", c.expired);
        assert_eq!(ids(&c).len(), 4);
    }

    #[tokio::test]
    async fn a_split_listing_lists_every_key_once() {
        let inner: std::sync::Arc<dyn object_store::ObjectStore> =
            std::sync::Arc::new(object_store::memory::InMemory::new());
        let store = ClusterStore::from_object_store(inner, "c", Backend::Memory).unwrap();
        let mut keys: Vec<String> = (0..40)
            .flat_map(|i| {
                let dir = format!("nightly/20261120T0200{i:02}Z-00000000");
                [format!("{dir}/metadata.json"), format!("{dir}/backup.tar")]
            })
            .collect();
        keys.extend(
            [
                "README",
                "_audit/x.json",
                "_state/metadata-cache.json.zst",
                "binlogs",
                // (An object named exactly `binlogs0` is not listed: the listing resumes
                // after that key. It would be foreign, and is never deleted.)
                "binlogs00",
                "binlogsz/x",
                "zzz",
            ]
            .map(str::to_owned),
        );
        for k in &keys {
            crate::synth::write_raw(&store, k, b"x").await.unwrap();
        }
        for n in 0..30 {
            let name = format!("binlogs/mysql-bin.{n:06}");
            crate::synth::write_raw(&store, &name, b"s").await.unwrap();
        }
        let list = |cuts: Vec<&'static str>| {
            let store = store.clone();
            async move {
                let cuts: Vec<Path> = cuts.into_iter().map(Path::from).collect();
                let (tx, rx) = futures::channel::mpsc::unbounded();
                let listed = list_outside_binlogs(&store, &crate::NoProgress, &tx, &cuts)
                    .await
                    .unwrap();
                drop(tx);
                let announced: Vec<metacache::Listed> = rx.collect().await;
                let got: Vec<String> = listed
                    .objects
                    .iter()
                    .map(|m| m.location.as_ref().to_owned())
                    .collect();
                (got, announced.len())
            }
        };
        let (whole, announced) = list(vec![]).await;
        keys.sort();
        assert_eq!(whole, keys);
        assert_eq!(announced, 40);
        for cuts in [
            vec!["nightly/20261120T020010Z-00000000/metadata.json"],
            vec![
                "README",
                "nightly/20261120T020005Z-00000000/backup.tar",
                "nightly/20261120T020031Z-00000000/metadata.json",
                "zzz",
            ],
            vec!["binlogs/mysql-bin.000010"],
            vec![
                "a",
                "binlogs/mysql-bin.000003",
                "binlogs/mysql-bin.000020",
                "binlogs0",
            ],
            vec!["0", "binlogs", "binlogs/", "binlogsz", "zzzz"],
        ] {
            let (split, announced) = list(cuts.clone()).await;
            assert_eq!(split, whole, "split at {cuts:?}");
            assert_eq!(announced, 40, "split at {cuts:?}");
        }
    }

    #[test]
    fn id_times_parse() {
        assert_eq!(
            id_time("20261120T020000Z-3f2a9c1d").unwrap().to_string(),
            "2026-11-20T02:00:00Z"
        );
    }

    /// The largest chain (with its ancestors), twice, plus the indexed segments (compressed
    /// ones counted [`COMPRESSED_SEGMENT_FACTOR`] times), plus the margin.
    #[tokio::test]
    async fn the_largest_restore_is_estimated_from_recorded_sizes() {
        use crate::synth::{SynthBackup, segments, write_backups, write_index, write_segments};
        let dir = tempfile::tempdir().unwrap();
        let store = ClusterStore::open(
            &format!("file://{}", dir.path().display()),
            "c",
            &Default::default(),
        )
        .unwrap();
        let t0: Timestamp = "2026-11-01T00:00:00Z".parse().unwrap();
        let day = jiff::SignedDuration::from_hours(24);
        let mut full = SynthBackup::full("n", t0, 1);
        full.payload = vec![0; 1000];
        let mut inc = SynthBackup::incremental("n", &full.id, t0 + day, 2);
        inc.payload = vec![0; 300];
        let mut other = SynthBackup::full("n", t0 + day * 2, 3);
        other.payload = vec![0; 1200];
        write_backups(&store, &[full, inc, other]).await.unwrap();
        let empty = Catalog::load(&store, &crate::NoProgress).await.unwrap();
        // full + inc = 1300 > 1200.
        assert_eq!(
            empty.restore_scratch_bytes(),
            Some(2 * 1300 + SCRATCH_MARGIN)
        );
        // Each synthetic segment is 19 bytes.
        let mut segs = segments("mysql-bin", 1, 3, t0, day);
        segs[2].compression = Some("zstd".into());
        write_segments(&store, &segs).await.unwrap();
        write_index(&store, &segs).await.unwrap();
        let c = Catalog::load(&store, &crate::NoProgress).await.unwrap();
        assert_eq!(
            c.restore_scratch_bytes(),
            Some(2 * 1300 + 19 + 19 + 19 * COMPRESSED_SEGMENT_FACTOR + SCRATCH_MARGIN)
        );
    }

    #[test]
    fn backend_order() {
        assert!(!Backend::Local.lists_in_order());
        assert!(Backend::S3.lists_in_order());
    }
}
