//! `archive-binlogs`: ships the closed binlog files a server's binlog index names to
//! `binlogs/`, and indexes them with their event times, their writer and their GTIDs.
//!
//! # Timelines
//! Files go to the timeline ([`tidemark_core::timeline`]) their server writes: the one
//! whose last segment the server's files continue (its files carry the recorded server id
//! and continue its `Gtid_list`s). A server that continues none — a replica promoted after
//! a failover, or a server whose binlog started over — starts a new timeline, recorded in
//! `_index.json` before its first file is shipped: it continues the newest timeline from
//! the server's newest file whose `Gtid_list` the archive already holds (the first GTID
//! not archived), and its switch names the last transaction the two histories share (from
//! the transactions the file holds and those the archive holds). So a new primary's
//! `mysql-bin.000003` never passes for the old one's, and nothing it wrote is skipped.
//!
//! # Idempotence and crash safety
//! A file already in `_index.json` is skipped. A file uploaded but not indexed (the
//! archiver died in between) is adopted — its object is checked against the local file's
//! size and sha256 and indexed without a second upload; a mismatch is uploaded again. The
//! index is updated last, with a conditional write, so two archivers cannot corrupt it.

use std::collections::{HashMap, HashSet};
use std::path::{Path as FsPath, PathBuf};

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::binlog;
use jiff::Timestamp;
use tidemark_core::gtid::{GtidPos, GtidRun, history_holds, missing_between};
use tidemark_core::timeline::{
    Switch, Timeline, archive_name, archive_sequence, file_number, timeline_of,
};
use tidemark_store::ClusterStore;
use tidemark_store::Progress;
use tidemark_store::StoreError;
use tidemark_store::format::IndexEntry;
use tidemark_store::index::{self, SegmentIndex};
use tidemark_store::layout;
use tidemark_store::transfer::{self, TransferError, Upload};

/// Small files (below one multipart part, sent in one request) shipped at once.
const SMALL_CONCURRENCY: usize = 32;
/// Large files shipped at once: each holds up to `PART_SIZE * (PARTS_IN_FLIGHT + 1)` bytes
/// of memory, so this bounds the archiver's memory near 250 MiB.
const LARGE_CONCURRENCY: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("cannot read the binlog index {}: {source}", path.display())]
    IndexFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: line {line} names {name:?}, which is not a binlog file name (<base>.<digits>, e.g. mysql-bin.000042)", path.display())]
    NotBinlogName {
        path: PathBuf,
        line: usize,
        name: String,
    },
    #[error(
        "{}: {first} and {second} have the same sequence number {sequence}; the archive identifies segments by it, so neither is shipped until one is renamed or removed",
        path.display()
    )]
    DuplicateSequence {
        path: PathBuf,
        sequence: u64,
        first: String,
        second: String,
    },
    #[error(
        "{name} has sequence number {sequence}, which binlogs/_index.json already gives to {indexed}; a segment is identified by its sequence, so {name} is not shipped"
    )]
    SequenceTaken {
        name: String,
        sequence: u64,
        indexed: String,
    },
    #[error("{}: {source}", path.display())]
    Binlog {
        path: PathBuf,
        #[source]
        source: binlog::BinlogError,
    },
    #[error("uploading {}", path.display())]
    Upload {
        path: PathBuf,
        #[source]
        source: Box<TransferError>,
    },
    #[error(
        "{name} is file number {number} on its server, beyond what an archive sequence holds (below {})",
        tidemark_core::timeline::TIMELINE_STRIDE
    )]
    NumberTooLarge { name: String, number: u64 },
    #[error(
        "server {server}'s binlog holds nothing of timeline {timeline}, which server {tip_server} wrote as primary (the archive is at {at}): an old primary still writing the branch the cluster left? Not archived; point the archiver at the current primary"
    )]
    StaleBranch {
        server: String,
        at: String,
        timeline: u32,
        tip_server: String,
    },
    #[error(
        "server {server}'s binlog holds no transaction of its own since the archive's timeline {timeline} (server {tip_server}): a replica, or a new primary that has not written yet. Not archived, so replicas never start timelines; point the archiver at the primary (a new primary's files are archived once it writes)"
    )]
    NotPrimary {
        server: u32,
        timeline: u32,
        tip_server: String,
    },
    #[error(
        "server {server} would start a new timeline, but {primary} is the primary ({confirmed_by}): a new timeline is only ever started by the primary, so an old primary (or a server claiming another's transactions) never takes over the archive's main line. Not archived; point the archiver at the primary"
    )]
    NotThePrimary {
        server: String,
        primary: u32,
        confirmed_by: &'static str,
    },
    #[error(
        "binlog file {file} was written by server {server}, and {newest} (the newest) by server {newest_server}: one archiver run takes one server's files. Not archived; give it that server's files alone (a server whose server_id changed: purge the files from before the change once they are archived, PURGE BINARY LOGS TO '{newest}')"
    )]
    MixedWriters {
        file: String,
        server: String,
        newest: String,
        newest_server: String,
    },
    #[error("the archive already records {max} timelines: no more can be started")]
    TooManyTimelines { max: u32 },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Internal: the file vanished before it was read (reported, not an error).
    #[error("{0} vanished")]
    Vanished(String),
}

/// What one pass did. (`archive-binlogs --output json` prints it through the CLI's own
/// output type, which names every field: a field added here is a decision there.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArchiveReport {
    /// Closed files uploaded and indexed.
    pub uploaded: Vec<String>,
    /// Closed files found already uploaded (an earlier run died before indexing), indexed.
    pub adopted: Vec<String>,
    /// Closed files already indexed.
    pub already_indexed: usize,
    /// The file the server is writing (never shipped).
    pub open: Option<String>,
    /// Closed files the server purged before this pass could read them.
    pub vanished: Vec<String>,
    pub bytes: u64,
    /// The timeline the server's files went to.
    pub timeline: u32,
    /// The timeline this pass started (a new primary, or a binlog that started over).
    pub new_timeline: Option<Timeline>,
    /// The server whose files these are.
    pub server_id: Option<u32>,
    /// The newest event the server had written: the last write to the file it is writing.
    pub primary_last_event_at: Option<Timestamp>,
    /// The newest event archived on the timeline, after this pass.
    pub archived_last_event_at: Option<Timestamp>,
}

impl ArchiveReport {
    /// How far the archive is behind the server after the pass: the server's newest event
    /// against the newest archived (zero when either is unknown).
    pub fn lag(&self) -> jiff::SignedDuration {
        match (self.primary_last_event_at, self.archived_last_event_at) {
            (Some(p), Some(a)) if p > a => p.duration_since(a),
            _ => jiff::SignedDuration::ZERO,
        }
    }
}

/// Says when the archive falls further behind the server than a bound, and when it is back:
/// one message per change, for a watching archiver's log.
#[derive(Debug, Clone, Copy, Default)]
pub struct LagAlarm {
    behind: bool,
}

impl LagAlarm {
    /// The message for this pass, when the archive crossed `max_lag` (`true`: now behind).
    pub fn observe(
        &mut self,
        report: &ArchiveReport,
        max_lag: jiff::SignedDuration,
    ) -> Option<(bool, String)> {
        let lag = report.lag();
        let behind = lag > max_lag;
        let changed = behind != self.behind;
        self.behind = behind;
        changed.then(|| {
            let text = if behind {
                format!(
                    "the archive is {}s behind the server, more than {max_lag:#} (a file is archived once the server closes it)",
                    lag.as_secs()
                )
            } else {
                format!("the archive caught up ({}s behind the server)", lag.as_secs())
            };
            (behind, text)
        })
    }
}

/// One file the binlog index names.
#[derive(Debug, Clone)]
struct Local {
    path: PathBuf,
    /// Its name on the server (`mysql-bin.000042`).
    name: String,
    /// Its number on the server.
    sequence: u64,
}

/// A file on its timeline: its archive name and sequence.
#[derive(Debug, Clone)]
struct Placed {
    local: Local,
    name: String,
    sequence: u64,
}

/// Reads the server's binlog index (`mysql-bin.index`): one path per line, relative to the
/// index's directory unless absolute; the last one is the file being written.
fn read_binlog_index(path: &FsPath) -> Result<Vec<Local>, ArchiveError> {
    let text = std::fs::read_to_string(path).map_err(|source| ArchiveError::IndexFile {
        path: path.to_path_buf(),
        source,
    })?;
    let dir = path.parent().unwrap_or(FsPath::new("."));
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let p = FsPath::new(line);
        let full = if p.is_absolute() {
            p.to_path_buf()
        } else {
            dir.join(p)
        };
        let name = full
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let sequence = tidemark_core::inventory::segment_sequence(&name)
            .filter(|_| tidemark_store::layout::is_segment_name(&name));
        let Some(sequence) = sequence else {
            return Err(ArchiveError::NotBinlogName {
                path: path.to_path_buf(),
                line: i + 1,
                name,
            });
        };
        if let Some(other) = out.iter().find(|l: &&Local| l.sequence == sequence) {
            return Err(ArchiveError::DuplicateSequence {
                path: path.to_path_buf(),
                sequence,
                first: other.name.clone(),
                second: name,
            });
        }
        out.push(Local {
            path: full,
            name,
            sequence,
        });
    }
    Ok(out)
}

/// Which server may start a timeline (issue 42 §3): a new timeline makes the archive's
/// main line that server's history, and the history it leaves a branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primary {
    /// The server whose files these are, as the archiver was pointed at it: nothing else
    /// says which server is primary (a report says so).
    PointedAt,
    /// The server the cluster says is primary (its `@@server_id`: the operator's labelled
    /// pod, or `--primary-server-id`): no other starts a timeline.
    Confirmed(u32),
}

impl Primary {
    /// Refuses a new timeline of `server` unless it is the confirmed primary.
    fn admits(self, server: Option<u32>) -> Result<(), ArchiveError> {
        match self {
            Primary::Confirmed(p) if server != Some(p) => Err(ArchiveError::NotThePrimary {
                server: server.map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
                primary: p,
                confirmed_by: "as confirmed to this archiver",
            }),
            _ => Ok(()),
        }
    }
}

/// Ships the closed files of `binlog_index` not yet archived, then indexes them; a new
/// timeline is taken from the server the archiver was pointed at ([`Primary::PointedAt`]).
///
/// # Errors
/// As [`archive_pass_as`].
pub async fn archive_pass(
    store: &ClusterStore,
    binlog_index: &FsPath,
    progress: &dyn Progress,
) -> Result<ArchiveReport, ArchiveError> {
    archive_pass_as(store, binlog_index, Primary::PointedAt, progress).await
}

/// Ships the closed files of `binlog_index` not yet archived, then indexes them; only
/// `primary` starts a timeline.
///
/// # Errors
/// The binlog index cannot be read or names a non-binlog; a closed file cannot be read or
/// parsed, or was written by another server than the newest; a server other than the
/// confirmed primary would start a timeline; the store fails. Files shipped before an
/// error are indexed by the next run.
pub async fn archive_pass_as(
    store: &ClusterStore,
    binlog_index: &FsPath,
    primary: Primary,
    progress: &dyn Progress,
) -> Result<ArchiveReport, ArchiveError> {
    // Each pass reads within its own budget (a watch or an archiver runs for months).
    store.begin_pass();
    let mut files = read_binlog_index(binlog_index)?;
    let open = files.pop();
    let mut report = ArchiveReport {
        open: open.as_ref().map(|f| f.name.clone()),
        // The server's newest event: when it last wrote its open file.
        primary_last_event_at: open
            .as_ref()
            .and_then(|f| std::fs::metadata(&f.path).ok()?.modified().ok())
            .and_then(|m| Timestamp::try_from(m).ok()),
        ..Default::default()
    };
    if files.is_empty() {
        // Nothing closed to ship (a spool keeps only the file being written): the server
        // still writes, so what the last pass recorded is brought up to date.
        refresh_status(store, open.as_ref(), &mut report).await;
        return Ok(report);
    }
    let mut loaded = SegmentIndex::load(store).await?;
    let choice = match choose_timeline(store, &mut loaded, &files, primary).await {
        Ok(c) => c,
        Err(ArchiveError::Vanished(name)) => {
            report.vanished.push(name);
            return Ok(report);
        }
        Err(e) => return Err(e),
    };
    if let Some(claim) = &choice.claim {
        index::update(
            store,
            loaded.as_ref(),
            &HashSet::new(),
            &[],
            std::slice::from_ref(claim),
            index::SHARD_SIZE,
        )
        .await?;
        loaded = SegmentIndex::load(store).await?;
        if claim.parent.is_some() {
            tracing::warn!(
                timeline = claim.id,
                server = ?claim.server_id,
                "a new server writes the binlog: started a new timeline"
            );
            report.new_timeline = Some(claim.clone());
        }
    }
    report.timeline = choice.id;
    report.server_id = choice.server_id;
    let archived_before = match loaded.as_mut() {
        Some(idx) => last_entry(store, idx, choice.id)
            .await?
            .and_then(|e| e.last_event_at),
        None => None,
    };
    let files: Vec<Placed> = files
        .into_iter()
        .filter(|f| f.sequence >= choice.from_number)
        .map(|f| place(f, choice.id))
        .collect::<Result<_, _>>()?;
    // What the index holds for each sequence of ours.
    let known: HashMap<u64, String> = match &loaded {
        None => HashMap::new(),
        Some(idx) => {
            let mut idx = idx.clone();
            let mut seqs: Vec<u64> = files.iter().map(|f| f.sequence).collect();
            seqs.sort_unstable();
            let holding = idx.shards_holding(&seqs);
            idx.read_shards(store, holding).await?;
            idx.entries()
                .map(|e| (e.sequence, e.name.clone()))
                .collect()
        }
    };
    let mut todo = Vec::new();
    for f in files {
        match known.get(&f.sequence) {
            Some(name) if *name == f.name => report.already_indexed += 1,
            Some(name) => {
                return Err(ArchiveError::SequenceTaken {
                    name: f.name,
                    sequence: f.sequence,
                    indexed: name.clone(),
                });
            }
            None => todo.push(f),
        }
    }
    let (large, small): (Vec<Placed>, Vec<Placed>) = todo.into_iter().partition(|f| {
        std::fs::metadata(&f.local.path).is_ok_and(|m| m.len() >= transfer::PART_SIZE as u64)
    });
    // The futures are made before they become a stream: a stream of closures borrowing
    // `store` and `progress` would not be `Send` for every lifetime, which tasks need.
    let ship_all = |files: Vec<Placed>, concurrency: usize| {
        let shipping: Vec<_> = files
            .into_iter()
            .map(|f| ship(store, f, progress))
            .collect();
        futures::stream::iter(shipping)
            .buffer_unordered(concurrency)
            .collect::<Vec<_>>()
    };
    let (small, large) = futures::join!(
        ship_all(small, SMALL_CONCURRENCY),
        ship_all(large, LARGE_CONCURRENCY)
    );
    let results: Vec<Result<(IndexEntry, bool), ArchiveError>> =
        small.into_iter().chain(large).collect();
    let mut entries = Vec::new();
    let mut first_error = None;
    for r in results {
        match r {
            Ok((entry, adopted)) => {
                report.bytes += entry.size;
                if adopted {
                    report.adopted.push(entry.name.clone());
                } else {
                    report.uploaded.push(entry.name.clone());
                }
                entries.push(entry);
            }
            Err(ArchiveError::Vanished(name)) => report.vanished.push(name),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    entries.sort_by_key(|e| e.sequence);
    report.uploaded.sort();
    report.adopted.sort();
    // Index what was shipped even when another file failed: it is in the store.
    if !entries.is_empty() {
        index::update(
            store,
            loaded.as_ref(),
            &HashSet::new(),
            &entries,
            &[],
            index::SHARD_SIZE,
        )
        .await?;
    }
    report.archived_last_event_at = entries
        .iter()
        .filter_map(|e| e.last_event_at)
        .chain(archived_before)
        .max();
    match first_error {
        Some(e) => Err(e),
        None => {
            record_status(store, &report).await;
            Ok(report)
        }
    }
}

/// A pass with nothing closed: the last recorded status, when it is of the server writing
/// `open`, with this pass's time and the server's newest event.
async fn refresh_status(store: &ClusterStore, open: Option<&Local>, report: &mut ArchiveReport) {
    let Some(open) = open else { return };
    let Ok(Some(last)) = tidemark_store::state::load_archiver_status(store).await else {
        return;
    };
    let Ok(head) = read_local(&open.path, &open.name, false).await else {
        return;
    };
    if head.server_id.is_none() || head.server_id != last.server_id {
        return;
    }
    report.server_id = last.server_id;
    report.timeline = last.timeline;
    report.archived_last_event_at = last.archived_last_event_at;
    record_status(store, report).await;
}

/// Writes what the pass saw (`_state/archiver.json`) for whoever watches the archive's
/// lag; a failure to write it is logged, never the pass's.
async fn record_status(store: &ClusterStore, report: &ArchiveReport) {
    use tidemark_store::state::{ArchiverStatus, load_archiver_status, save_archiver_status};
    // The last purge's record stands until the purge after this pass replaces it: a
    // watcher reading in between sees it, not nothing.
    let purge = load_archiver_status(store)
        .await
        .ok()
        .flatten()
        .and_then(|s| s.purge);
    let status = ArchiverStatus {
        format_version: 1,
        observed_at: Timestamp::now(),
        server_id: report.server_id,
        timeline: report.timeline,
        primary_last_event_at: report.primary_last_event_at,
        archived_last_event_at: report.archived_last_event_at,
        writer: format!(
            "{} pid {}",
            tidemark_store::state::host_name(),
            std::process::id()
        ),
        purge,
        extra: Default::default(),
    };
    if let Err(e) = save_archiver_status(store, &status).await {
        tracing::warn!(error = %e, "could not record the archiver's status");
    }
}

/// A file's archive name and sequence on `timeline`.
fn place(local: Local, timeline: u32) -> Result<Placed, ArchiveError> {
    let too_large = || ArchiveError::NumberTooLarge {
        name: local.name.clone(),
        number: local.sequence,
    };
    let sequence = archive_sequence(timeline, local.sequence).ok_or_else(too_large)?;
    let name = archive_name(&local.name, timeline).ok_or_else(too_large)?;
    Ok(Placed {
        local,
        name,
        sequence,
    })
}

/// Where a server's files go.
#[derive(Debug)]
struct TimelineChoice {
    id: u32,
    /// The server whose files these are.
    server_id: Option<u32>,
    /// A timeline to record before shipping (a new one, or the first learning its writer).
    claim: Option<Timeline>,
    /// The server's files from this number on belong to it.
    from_number: u64,
}

/// What a local file's start says (its writer and `Gtid_list`), or its whole summary.
async fn read_local(
    path: &FsPath,
    name: &str,
    whole: bool,
) -> Result<binlog::Summary, ArchiveError> {
    Ok(read_local_gtids(path, name, whole).await?.0)
}

/// [`read_local`], and with `whole`, a MySQL file's GTIDs (issue 47): its
/// `Previous_gtids` and transactions, when the file is MySQL's (no MariaDB `Gtid_list`, a
/// `Previous_gtids` event).
async fn read_local_gtids(
    path: &FsPath,
    name: &str,
    whole: bool,
) -> Result<(binlog::Summary, Option<crate::mysql::MySqlGtids>), ArchiveError> {
    let p = path.to_path_buf();
    let read = tokio::task::spawn_blocking(move || {
        let mut file = std::fs::File::open(&p)?;
        let got = if whole {
            binlog::summary(&mut file)
        } else {
            binlog::head(&mut file)
        };
        let io = |e| match e {
            binlog::BinlogError::Io(io) => io,
            other => std::io::Error::other(other),
        };
        let got = got.map_err(io)?;
        // A MySQL file (issue 47): no MariaDB Gtid_list; its GTIDs are MySQL's.
        let mut mysql = None;
        if whole && got.gtid_list.is_none() {
            use std::io::Seek as _;
            file.rewind()?;
            let m = crate::mysql::gtids(&mut file).map_err(io)?;
            if m.previous.is_some() {
                mysql = Some(m);
            }
        }
        Ok::<_, std::io::Error>((got, mysql))
    })
    .await;
    match read {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(file = %path.display(), "binlog purged before it was archived");
            Err(ArchiveError::Vanished(name.to_owned()))
        }
        Ok(Err(e)) => {
            let source = match e.downcast::<binlog::BinlogError>() {
                Ok(b) => b,
                Err(io) => binlog::BinlogError::Io(io),
            };
            Err(ArchiveError::Binlog {
                path: path.to_path_buf(),
                source,
            })
        }
        Err(join) => Err(ArchiveError::Binlog {
            path: path.to_path_buf(),
            source: binlog::BinlogError::Io(std::io::Error::other(join)),
        }),
    }
}

/// The last indexed entry of `timeline` (reading the shard that holds it).
async fn last_entry(
    store: &ClusterStore,
    index: &mut SegmentIndex,
    timeline: u32,
) -> Result<Option<IndexEntry>, ArchiveError> {
    let in_timeline = |seq: u64| timeline_of(seq) == timeline;
    let last_summarised = index
        .unread()
        .filter(|s| in_timeline(s.last_sequence))
        .map(|s| s.last_sequence)
        .max();
    if let Some(seq) = last_summarised {
        let holding = index.shards_holding(&[seq]);
        index.read_shards(store, holding).await?;
    }
    Ok(index
        .entries()
        .filter(|e| in_timeline(e.sequence) && tidemark_store::format::is_index_entry(e))
        .max_by_key(|e| e.sequence)
        .cloned())
}

/// Chooses the timeline the server's closed `files` (oldest first, not empty) belong to.
async fn choose_timeline(
    store: &ClusterStore,
    loaded: &mut Option<SegmentIndex>,
    files: &[Local],
    primary: Primary,
) -> Result<TimelineChoice, ArchiveError> {
    let Some(newest) = files.last() else {
        return Ok(TimelineChoice {
            id: 0,
            server_id: None,
            claim: None,
            from_number: 0,
        });
    };
    let origin = read_local(&newest.path, &newest.name, false)
        .await?
        .server_id;
    // Every file is the same server's: the timeline is chosen by the newest one's writer,
    // and a file of another server (a spool that changed servers, a forged file) would go
    // where that server's history does not.
    for f in &files[..files.len() - 1] {
        let writer = read_local(&f.path, &f.name, false).await?.server_id;
        if writer != origin {
            let show = |s: Option<u32>| s.map_or_else(|| "unknown".to_owned(), |s| s.to_string());
            return Err(ArchiveError::MixedWriters {
                file: f.name.clone(),
                server: show(writer),
                newest: newest.name.clone(),
                newest_server: show(origin),
            });
        }
    }
    let first = |server_id| Timeline {
        server_id,
        created_at: Some(Timestamp::now()),
        ..Timeline::legacy()
    };
    let Some(index) = loaded.as_mut() else {
        // A new archive: its first timeline is this server's (the primary's).
        primary.admits(origin)?;
        return Ok(TimelineChoice {
            id: 0,
            server_id: origin,
            claim: origin.map(|o| first(Some(o))),
            from_number: 0,
        });
    };
    // Only the newest timeline (the tip) is continued: a server that wrote an older one
    // and is primary again (a failback, once rebuilt as a replica of the new primary)
    // starts a new timeline from the tip's history.
    let tip = index
        .head
        .timelines
        .iter()
        .max_by_key(|t| t.id)
        .cloned()
        .unwrap_or_else(Timeline::legacy);
    let legacy = tip.id == 0 && tip.server_id.is_none();
    if legacy || (origin.is_some() && tip.server_id == origin) {
        let last = last_entry(store, index, tip.id).await?;
        if continues(store, last.as_ref(), files, legacy).await? {
            return Ok(TimelineChoice {
                id: tip.id,
                server_id: origin,
                claim: (legacy && origin.is_some()).then(|| first(origin)),
                from_number: tip.first_sequence.map_or(0, file_number),
            });
        }
    }
    primary.admits(origin)?;
    new_timeline(store, index, &tip, files, origin).await
}

/// Whether the server's files continue the timeline whose last indexed entry is `last`.
/// A timeline archived before writers were recorded (`legacy`) is continued only on proof:
/// the server still has the file it ends with, byte for byte.
async fn continues(
    store: &ClusterStore,
    last: Option<&IndexEntry>,
    files: &[Local],
    legacy: bool,
) -> Result<bool, ArchiveError> {
    // A timeline recorded before any file reached it: whoever recorded it continues it.
    let Some(last) = last else { return Ok(true) };
    let number = file_number(last.sequence);
    let server_name = last.file.as_deref().unwrap_or(&last.name);
    if let Some(same) = files.iter().find(|f| f.sequence == number) {
        // The file the timeline ends with: the same file, by its Gtid_list, or (archived
        // as it came, without GTIDs) by its bytes.
        if same.name != server_name {
            return Ok(false);
        }
        if let Some(list) = &last.gtid_list {
            let local = read_local(&same.path, &same.name, false).await?;
            return Ok(local.gtid_list.as_ref() == Some(list));
        }
        // The stored object as it came (decoded when compressed or encrypted, with the
        // store's identities) against the server's file.
        let Some(local) = local_sha256(&same.path).await else {
            return Ok(!legacy);
        };
        return Ok(match decoded_sha256(store, last).await {
            Some(stored) => stored == local,
            None => !legacy,
        });
    }
    let Some(after) = files.iter().find(|f| f.sequence > number) else {
        // The server's numbering is behind the timeline's: another binlog.
        return Ok(false);
    };
    // Its next file continues the timeline's last position (files purged in between leave
    // a gap, not another history). Without GTIDs to compare, only a timeline whose writer
    // is recorded (this server) is taken as continued.
    match last.segment_gtids() {
        Some(g) => {
            let local = read_local(&after.path, &after.name, false).await?;
            Ok(local.gtid_list.is_none_or(|l| l.covers(&g.end())))
        }
        None => Ok(!legacy),
    }
}

/// Starts a timeline for a server that continues none: from its newest file whose start the
/// archive holds, with the switch where its history and the newest timeline's part.
async fn new_timeline(
    store: &ClusterStore,
    index: &mut SegmentIndex,
    tip: &Timeline,
    files: &[Local],
    origin: Option<u32>,
) -> Result<TimelineChoice, ArchiveError> {
    let current = tip.id;
    let plast = last_entry(store, index, current).await?;
    if let Some(newest) = files.last()
        && mysql_file(&newest.path).await
    {
        // What the tip's parent held: the tip's own transactions are what it added.
        let before_tip = match tip.parent {
            Some(p) => last_entry(store, index, p).await?,
            None => None,
        };
        return mysql_timeline(
            index,
            tip,
            plast.as_ref(),
            before_tip.as_ref(),
            files,
            origin,
        )
        .await;
    }
    let parent_end = plast.as_ref().and_then(|e| Some(e.segment_gtids()?.end()));
    // The parent's transactions, as its indexed entries say.
    let parent_entries: Vec<IndexEntry> = {
        let mut v: Vec<IndexEntry> = index
            .entries()
            .filter(|e| timeline_of(e.sequence) == current && e.gtid_list.is_some())
            .cloned()
            .collect();
        v.sort_by_key(|e| e.sequence);
        v
    };
    let parent_runs: Vec<GtidRun> = parent_entries
        .iter()
        .flat_map(|e| e.gtids.iter().copied())
        .collect();
    let parent_base = parent_entries
        .first()
        .and_then(|e| e.gtid_list.clone())
        .unwrap_or_default();
    // The newest file whose start the archive already holds (by time, without GTIDs).
    let mut start = 0;
    for (i, f) in files.iter().enumerate().rev() {
        let head = read_local(&f.path, &f.name, false).await?;
        let holds = match (&parent_end, &head.gtid_list) {
            (Some(_), Some(list)) => history_holds(&parent_base, &parent_runs, list),
            _ => match (plast.as_ref().and_then(|e| e.last_event_at), head.first) {
                (Some(last), Some(first)) => first <= last,
                _ => false,
            },
        };
        if holds {
            start = i;
            break;
        }
    }
    // The same server with a binlog that started over reuses numbers: its transactions
    // cannot be told from the archived ones by GTID, so they never join by numbers. It
    // joins only where its binlog says it starts — a server restored to an instant starts
    // its binlog at the position restored (`<basename>.state`, issue 46 §3) — and only
    // where that says one thing: its oldest file's start, within the tip's own history
    // (not before the tip's first file), held there, and held by no other timeline (a
    // number of the same server on two histories — the tip and a future a restore
    // abandoned — names neither). Everything the tip has after it is then a branch. A
    // binlog that started from nothing (`RESET MASTER`), or one whose oldest file is gone,
    // stays unrelated: a gap, never a guess.
    let restarted = origin.is_some() && tip.server_id == origin;
    let rejoin = if restarted && parent_end.is_some() {
        let oldest = read_local(&files[0].path, &files[0].name, false).await?;
        oldest.gtid_list.filter(|at| {
            let elsewhere = index.entries().any(|e| {
                timeline_of(e.sequence) != current
                    && at.gtids().any(|g| {
                        g.seq > parent_base.seq(g.domain)
                            && e.gtids.iter().any(|r| {
                                r.domain == g.domain
                                    && r.server == g.server
                                    && r.first <= g.seq
                                    && g.seq <= r.last
                            })
                    })
            });
            !at.is_empty()
                && at.covers(&parent_base)
                && history_holds(&parent_base, &parent_runs, at)
                && !elsewhere
        })
    } else {
        None
    };
    if rejoin.is_some() {
        start = 0;
    }
    // Only a primary starts a timeline: its files from there on hold a transaction of its
    // own. A replica's hold only its primary's (archived, by mistake, it would start a
    // timeline, and its primary the next, turn about). Files whose transactions cannot all
    // be read are given the benefit of the doubt.
    if let Some(me) = origin {
        let mut own = false;
        let mut unknown = false;
        for f in &files[start..] {
            let s = read_local(&f.path, &f.name, true).await?;
            match &s.runs {
                Some(runs) => own |= runs.iter().any(|r| r.server == me),
                None => unknown = true,
            }
            if own {
                break;
            }
        }
        if !own && !unknown {
            return Err(ArchiveError::NotPrimary {
                server: me,
                timeline: tip.id,
                tip_server: tip
                    .server_id
                    .map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
            });
        }
    }
    let f = &files[start];
    let summary = read_local(&f.path, &f.name, true).await?;
    let child_start = summary.gtid_list.clone().unwrap_or_default();
    let child_runs = summary.runs.clone().unwrap_or_default();
    let joined = match &parent_end {
        Some(_) if restarted => rejoin.map(|at| (at, Vec::new())),
        Some(end) => switch_point(&parent_runs, &parent_base, end, &child_start, &child_runs),
        None => None,
    };
    let (gtid, missing, unrelated) = match joined {
        Some((gtid, missing)) => (gtid, missing, false),
        None => (parent_end.clone().unwrap_or_default(), Vec::new(), true),
    };
    // After a failover, the tip's primary wrote transactions of its own; a successor holds
    // them (replicated, before it was promoted). A server whose files hold none of them —
    // an old primary still writing the branch the cluster left — is refused: archived, its
    // history would become the newest. (The tip's own server whose binlog started over is
    // a successor of itself.)
    let tip_wrote = parent_runs.iter().any(|r| Some(r.server) == tip.server_id);
    let holds_tip = child_start
        .gtids()
        .chain(child_runs.iter().map(|r| r.last_gtid()))
        .any(|g| Some(g.server) == tip.server_id);
    if tip.parent.is_some() && tip_wrote && !restarted && !holds_tip {
        return Err(ArchiveError::StaleBranch {
            server: origin.map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
            at: parent_end
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            timeline: tip.id,
            tip_server: tip
                .server_id
                .map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
        });
    }
    let parent_sequence = parent_entries
        .iter()
        .find(|e| e.segment_gtids().is_some_and(|g| g.end().covers(&gtid)))
        .or(plast.as_ref())
        .map(|e| e.sequence);
    // When the switch's transaction was written: its event in the file (replicated events
    // keep their times), else the end of the parent's segment holding it.
    let mut at = None;
    for g in gtid.gtids() {
        let p = f.path.clone();
        let t = tokio::task::spawn_blocking(move || {
            std::fs::File::open(&p)
                .ok()
                .and_then(|mut file| binlog::gtid_time(&mut file, g).ok().flatten())
        })
        .await
        .ok()
        .flatten();
        at = at.max(t);
    }
    if at.is_none() {
        // Not in the file (it starts at the switch): no later than the parent segment's
        // last event, nor than the file's first (opened at or after the switch).
        let parent_last = parent_entries
            .iter()
            .chain(plast.iter())
            .find(|e| Some(e.sequence) == parent_sequence)
            .and_then(|e| e.last_event_at);
        at = match (parent_last, summary.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let id = next_timeline_id(index, current)?;
    let claim = Timeline {
        id,
        server_id: origin,
        parent: Some(current),
        first_sequence: archive_sequence(id, f.sequence),
        switch: Some(Switch {
            gtid,
            at,
            parent_sequence,
            missing,
            unrelated,
        }),
        created_at: Some(Timestamp::now()),
    };
    Ok(TimelineChoice {
        id,
        server_id: origin,
        claim: Some(claim),
        from_number: f.sequence,
    })
}

/// Whether the server's file is MySQL's (its start only is read); a file that cannot be read
/// is not.
async fn mysql_file(path: &FsPath) -> bool {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::fs::File::open(&p)
            .ok()
            .and_then(|mut f| crate::mysql::is_mysql(&mut f).ok())
    })
    .await
    .ok()
    .flatten()
    .unwrap_or(false)
}

/// [`new_timeline`] for a MySQL server (issue 47). MySQL numbers each server's transactions
/// under its own uuid, and every file opens with the set its server had executed
/// (`Previous_gtids`), so the histories are compared as sets. With `S` what the parent's
/// archive holds through its last entry (that entry's previous set and transactions):
/// the new timeline starts at the server's newest file whose previous set `S` holds; the
/// switch is what that file's history shares with `S` (replay takes the parent's events
/// up to the parent's segment holding it, then this server's, skipping by GTID what it
/// already applied and what the parent wrote that this server never had). No file
/// whose start the archive holds, or no sets recorded: the timelines do not join (a gap).
async fn mysql_timeline(
    index: &SegmentIndex,
    tip: &Timeline,
    plast: Option<&IndexEntry>,
    before_tip: Option<&IndexEntry>,
    files: &[Local],
    origin: Option<u32>,
) -> Result<TimelineChoice, ArchiveError> {
    let current = tip.id;
    let held = plast.and_then(|e| Some(e.previous_gtids.as_ref()?.union(e.gtid_set.as_ref()?)));
    let mut summaries = Vec::with_capacity(files.len());
    for f in files {
        summaries.push(read_local_gtids(&f.path, &f.name, true).await?.1);
    }
    let start = held.as_ref().and_then(|s| {
        (0..files.len()).rev().find(|&i| {
            summaries[i]
                .as_ref()
                .and_then(|m| m.previous.as_ref())
                .is_some_and(|p| p.is_subset(s))
        })
    });
    // Only a primary starts a timeline: its files from there on hold a transaction it
    // wrote (a replica's events keep their writer's server id).
    if let Some(me) = origin {
        let from = start.unwrap_or(0);
        let runs: Vec<Option<&Vec<crate::mysql::Run>>> = summaries[from..]
            .iter()
            .map(|m| m.as_ref().and_then(|m| m.runs.as_ref()))
            .collect();
        let own = runs
            .iter()
            .flatten()
            .any(|rs| rs.iter().any(|r| r.server == me));
        let unknown = runs.iter().any(Option::is_none);
        if !own && !unknown {
            return Err(ArchiveError::NotPrimary {
                server: me,
                timeline: tip.id,
                tip_server: tip
                    .server_id
                    .map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
            });
        }
    }
    // After a failover, the tip's primary wrote under a uuid its parent's history never
    // had; a successor holds some of those transactions (replicated before it was
    // promoted). A server whose files hold none — an old primary still writing the branch
    // the cluster left — is refused: archived, its history would become the newest.
    let through = |e: Option<&IndexEntry>| {
        e.and_then(|e| Some(e.previous_gtids.as_ref()?.union(e.gtid_set.as_ref()?)))
    };
    if let (Some(_), Some(tip_holds)) = (tip.parent, through(plast)) {
        let before: std::collections::HashSet<_> = through(before_tip)
            .map(|s| s.iter().map(|(u, _)| *u).collect())
            .unwrap_or_default();
        let tip_own: Vec<_> = tip_holds
            .iter()
            .map(|(u, _)| *u)
            .filter(|u| !before.contains(u))
            .collect();
        let holds_tip = summaries.iter().flatten().any(|m| {
            m.through()
                .is_some_and(|t| t.iter().any(|(u, _)| tip_own.contains(u)))
        });
        if !tip_own.is_empty() && !holds_tip {
            return Err(ArchiveError::StaleBranch {
                server: origin.map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
                at: tip_holds.to_string(),
                timeline: tip.id,
                tip_server: tip
                    .server_id
                    .map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
            });
        }
    }
    let i = start.unwrap_or(0);
    let f = &files[i];
    let joined = match (
        &held,
        start,
        summaries[i].as_ref().and_then(|m| m.through()),
    ) {
        (Some(s), Some(_), Some(child)) => Some(child.difference(&child.difference(s))),
        _ => None,
    };
    // The parent's segment holding the switch: the first whose history covers it.
    let mut parent: Vec<&IndexEntry> = index
        .entries()
        .filter(|e| timeline_of(e.sequence) == current)
        .collect();
    parent.sort_by_key(|e| e.sequence);
    let holding = joined.as_ref().and_then(|switch| {
        parent.iter().copied().find(|e| {
            e.previous_gtids
                .as_ref()
                .zip(e.gtid_set.as_ref())
                .is_some_and(|(p, g)| switch.is_subset(&p.union(g)))
        })
    });
    let holding = holding.or(plast);
    // When the histories part: the end of that segment when this server had all of it,
    // else within it — no later than this file's first event, nor before the segment's
    // own. (A replay does not depend on it: it skips by GTID.)
    let whole = match (holding, &joined) {
        (Some(e), Some(switch)) => e.gtid_set.as_ref().is_some_and(|g| g.is_subset(switch)),
        _ => false,
    };
    let first = read_local(&f.path, &f.name, false).await?.first;
    let at = match (holding.and_then(|e| e.last_event_at), first) {
        (Some(a), _) if whole => Some(a),
        (Some(a), Some(b)) => Some(
            a.min(b)
                .max(holding.and_then(|e| e.first_event_at).unwrap_or(b)),
        ),
        (a, b) => a.or(b),
    };
    let id = next_timeline_id(index, current)?;
    let claim = Timeline {
        id,
        server_id: origin,
        parent: Some(current),
        first_sequence: archive_sequence(id, f.sequence),
        switch: Some(Switch {
            gtid: GtidPos::default(),
            at,
            parent_sequence: holding.map(|e| e.sequence),
            missing: Vec::new(),
            unrelated: joined.is_none(),
        }),
        created_at: Some(Timestamp::now()),
    };
    Ok(TimelineChoice {
        id,
        server_id: origin,
        claim: Some(claim),
        from_number: f.sequence,
    })
}

/// The id of a new timeline after `current`.
fn next_timeline_id(index: &SegmentIndex, current: u32) -> Result<u32, ArchiveError> {
    index
        .head
        .timelines
        .iter()
        .map(|t| t.id)
        .max()
        .unwrap_or(0)
        .max(current)
        .checked_add(1)
        .filter(|id| *id <= tidemark_core::timeline::MAX_TIMELINE)
        .ok_or(ArchiveError::TooManyTimelines {
            max: tidemark_core::timeline::MAX_TIMELINE,
        })
}

/// Where a new timeline leaves its parent: per domain, the last transaction the parent's
/// archived history (`parent_runs` from `parent_base`, up to `parent_end`) and the new
/// server's (its file from `child_start`, then `child_runs`) provably share; and the
/// transactions neither holds between the parent's archive end and the new file's start.
/// `None` when they share no proven transaction in a domain the parent has (the file
/// starts at a number the parent wrote with another server, or at nothing the parent
/// wrote): the timelines do not join.
fn switch_point(
    parent_runs: &[GtidRun],
    parent_base: &GtidPos,
    parent_end: &GtidPos,
    child_start: &GtidPos,
    child_runs: &[GtidRun],
) -> Option<(GtidPos, Vec<GtidRun>)> {
    let mut domains: Vec<u32> = parent_end
        .gtids()
        .chain(child_start.gtids())
        .map(|g| g.domain)
        .chain(child_runs.iter().map(|r| r.domain))
        .collect();
    domains.sort_unstable();
    domains.dedup();
    let mut switch = GtidPos::default();
    let mut missing_to = GtidPos::default();
    for d in domains {
        let pe = parent_end.seq(d);
        let cs = child_start.seq(d);
        if pe == 0 {
            continue; // the parent holds nothing of this domain: nothing to join
        }
        if cs > pe {
            // The new file starts after the parent's archive ends: a gap, the switch at
            // the parent's end — provided the new start is the parent's history's sequel
            // (the parent's writer of its last number wrote on, as far as anyone knows).
            switch.advance(parent_end.get(d)?);
            missing_to.advance(child_start.get(d)?);
            continue;
        }
        // The file's start must be a transaction the parent wrote, by the same server.
        if cs > 0 {
            let start = child_start.get(d)?;
            let held = tidemark_core::gtid::history_holds(
                parent_base,
                parent_runs,
                &GtidPos::from_state([start]),
            );
            if !held {
                return None;
            }
        }
        // Then while the parent wrote the same numbers with the same servers, run by run.
        let mut common = cs;
        let mut writer = child_start.get(d).map(|g| g.server);
        // A file that starts before the parent's own first file (a replica rebuilt from
        // nothing keeps its whole history in one binlog) shares what lies before the
        // parent's base — its ancestors' history, not known here one by one — when it holds
        // the base's own transaction (the same server wrote that number), as
        // `history_holds` takes it. Without this, a second failover to such a replica
        // joined nothing: a gap until the next backup (found by the chaos soak).
        if let Some(b) = parent_base.get(d)
            && b.seq > common
            && b.seq <= pe
            && tidemark_core::gtid::writer_of(child_runs, d, b.seq) == Some(b.server)
        {
            common = b.seq;
            writer = Some(b.server);
        }
        'runs: for r in child_runs.iter().filter(|r| r.domain == d) {
            if r.last <= common {
                continue;
            }
            let mut q = common.checked_add(1)?;
            if r.first > q {
                break; // the child skips numbers: what follows is not provably shared
            }
            while q <= r.last && q <= pe {
                let Some(p) = parent_run_at(parent_runs, d, q) else {
                    break 'runs;
                };
                if p.server != r.server {
                    break 'runs;
                }
                let to = p.last.min(r.last).min(pe);
                common = to;
                writer = Some(r.server);
                q = match to.checked_add(1) {
                    Some(n) => n,
                    None => break 'runs,
                };
            }
            if q <= r.last {
                break;
            }
        }
        let server = writer.filter(|_| common > 0)?;
        switch.advance(tidemark_core::Gtid::new(d, server, common));
    }
    let missing = missing_between(parent_end, &missing_to);
    Some((switch, missing))
}

/// The parent's run that holds `seq` of `domain`.
fn parent_run_at(runs: &[GtidRun], domain: u32, seq: u64) -> Option<&GtidRun> {
    runs.iter()
        .find(|r| r.domain == domain && r.first <= seq && seq <= r.last)
}

/// Uploads one closed file (or adopts its object), returning its index entry and whether
/// it was adopted. [`ArchiveError::Vanished`]: the server purged it before it was read.
async fn ship(
    store: &ClusterStore,
    f: Placed,
    progress: &dyn Progress,
) -> Result<(IndexEntry, bool), ArchiveError> {
    let (summary, mysql) = read_local_gtids(&f.local.path, &f.local.name, true).await?;
    let path = f.local.path.clone();
    let key = layout::segment_key(&f.name);
    let local_size = tokio::fs::metadata(&path)
        .await
        .map_err(|e| ArchiveError::Binlog {
            path: path.clone(),
            source: binlog::BinlogError::Io(e),
        })?
        .len();
    // Already uploaded (as it is: a compressed or encrypted upload is simply sent again) by
    // a run that died before indexing? Not taken when this store encrypts: a plaintext copy
    // left by an earlier run is replaced, never indexed.
    let existing = store.head(&key).await?.map(|m| m.size);
    let gtids = summary.gtids();
    let entry = |sent: tidemark_store::format::PayloadObject| IndexEntry {
        name: f.name.clone(),
        sequence: f.sequence,
        first_event_at: summary.first,
        last_event_at: summary.last,
        size: sent.size,
        sha256: Some(sent.sha256),
        compression: sent.compression,
        encryption: sent.encryption,
        server_id: summary.server_id,
        file: (f.name != f.local.name).then(|| f.local.name.clone()),
        gtid_list: gtids.as_ref().map(|g| g.start.clone()),
        gtids: gtids.as_ref().map(|g| g.runs.clone()).unwrap_or_default(),
        previous_gtids: mysql.as_ref().and_then(|m| m.previous.clone()),
        gtid_set: mysql.as_ref().and_then(crate::mysql::MySqlGtids::held),
    };
    if store.recipients().is_none()
        && existing == Some(local_size)
        && let Some(local_sha) = local_sha256(&path).await
        && stored_sha256(store, &key).await.as_deref() == Some(local_sha.as_str())
    {
        return Ok((
            entry(tidemark_store::format::PayloadObject {
                name: f.name.clone(),
                size: local_size,
                sha256: local_sha,
                compression: None,
                original_size: None,
                encryption: None,
            }),
            true,
        ));
    }
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ArchiveError::Vanished(f.local.name.clone()));
        }
        Err(e) => {
            return Err(ArchiveError::Binlog {
                path: path.clone(),
                source: binlog::BinlogError::Io(e),
            });
        }
    };
    let up = Upload::to_key(store, key, &f.name).map_err(|source| ArchiveError::Upload {
        path: path.clone(),
        source: Box::new(source.into()),
    })?;
    let sent = transfer::send(store, up, &mut file, progress)
        .await
        .map_err(|source| ArchiveError::Upload {
            path: path.clone(),
            source: Box::new(source),
        })?;
    Ok((entry(sent), false))
}

/// The sha256 of a segment's content as the server wrote it: its object, decoded when it is
/// stored compressed or encrypted. `None` when it cannot be read.
async fn decoded_sha256(store: &ClusterStore, e: &IndexEntry) -> Option<String> {
    if !e.is_coded() {
        return e.sha256.clone(); // stored as it came: the index has its sha256
    }
    let key = layout::segment_key(&e.name);
    let scratch = tempfile::NamedTempFile::new().ok()?;
    let mut sink = tokio::fs::File::create(scratch.path()).await.ok()?;
    transfer::copy_verified(
        store,
        &key,
        e.size,
        e.sha256.as_deref(),
        e.form(),
        &mut sink,
        &tidemark_store::NoProgress,
    )
    .await
    .ok()?;
    drop(sink);
    local_sha256(scratch.path()).await
}

async fn local_sha256(path: &FsPath) -> Option<String> {
    let mut f = tokio::fs::File::open(path).await.ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).await.ok()?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Some(hex::encode(h.finalize()))
}

async fn stored_sha256(store: &ClusterStore, key: &object_store::path::Path) -> Option<String> {
    let got = store.object_store().get(key).await.ok()?;
    let mut h = Sha256::new();
    let mut s = got.into_stream();
    while let Some(chunk) = s.try_next().await.ok()? {
        h.update(&chunk);
    }
    Some(hex::encode(h.finalize()))
}
