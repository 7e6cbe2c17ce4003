//! What the planner sees: the backups and log segments of one cluster, as read from the
//! store (and, in the operator, enriched with holds and in-progress state from Kubernetes).

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::duration::RetentionDuration;
use crate::gtid::GtidPos;
use crate::records::{SegmentGtids, Timeline};

/// `<UTC start YYYYMMDDTHHMMSSZ>-<8 lowercase hex or alphanumeric chars>` (DESIGN.md §3).
pub type BackupId = String;

/// Whether `s` has the backup-id form. Directories named otherwise are foreign.
pub fn is_backup_id(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 25 {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    digits(0..8)
        && b[8] == b'T'
        && digits(9..15)
        && b[15] == b'Z'
        && b[16] == b'-'
        && b[17..]
            .iter()
            .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase())
}

/// Full or incremental; an incremental names its parent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type", content = "parentId")]
pub enum BackupKind {
    Full,
    Incremental(BackupId),
}

impl BackupKind {
    pub fn parent(&self) -> Option<&BackupId> {
        match self {
            BackupKind::Full => None,
            BackupKind::Incremental(p) => Some(p),
        }
    }
}

/// Where an attempt stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// Committed with `phase: completed`: a recovery point.
    Completed,
    /// Committed with `phase: failed`: never a recovery point, never counted.
    Failed,
    /// Known to be running (from Kubernetes status): kept, with its ancestors.
    InProgress,
    /// Payload objects without `metadata.json`: a crashed or interrupted attempt, or one
    /// whose deletion was interrupted. Never a recovery point. One whose in-flight marker
    /// is fresh ([`Backup::heartbeat_at`]) is still being written and counts as
    /// [`Phase::InProgress`].
    Uncommitted,
    /// Its `metadata.json` exists but cannot be read. Never deleted and never counted; it
    /// holds the binlogs from its start, since a repaired file may make it a recovery point.
    Malformed,
}

/// One backup attempt (one `<backup-id>` directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    pub id: BackupId,
    /// The `<backup-name>` directory it lives under.
    pub name: String,
    pub kind: BackupKind,
    pub phase: Phase,
    pub started_at: Timestamp,
    pub completed_at: Option<Timestamp>,
    /// Newest last-modified time of its objects: the age of an uncommitted attempt.
    pub last_modified: Timestamp,
    /// Object lock (seed 002 "immutable backups").
    pub immutable_until: Option<Timestamp>,
    /// Per-backup time to live, counted from `started_at` (seed 004).
    pub ttl: Option<RetentionDuration>,
    /// A hold: the `tidemark.io/protect` annotation or label, a restore that uses it, or a
    /// `--protect` flag.
    pub protected: bool,
    /// Its `metadata.json` has a `formatVersion` newer than this Tidemark understands; it is
    /// counted like any recovery point but never deleted.
    pub newer_format: bool,
    /// The last deletion pass meant to delete it but was interrupted: it is finished off
    /// whatever `failedBackupsTTL` says.
    pub interrupted_delete: bool,
    /// Binlog file that holds the backup's consistent point, when recorded.
    pub log_file: Option<String>,
    /// Total payload size in bytes, for reports.
    pub size: u64,
    /// A synthetic full (seed 002): the chain it merged, base first. It stands in for the
    /// last one, whose descendants build on it from then on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consolidated_from: Vec<BackupId>,
    /// Whether its method can merge a chain into a synthetic full (`mariabackup`).
    #[serde(default)]
    pub consolidatable: bool,
    /// A payload object its `metadata.json` records is missing, or has another size: the
    /// backup cannot be restored (nor can anything built on it).
    #[serde(default)]
    pub payload_missing: bool,
    /// The last sign of life of an attempt being written (its in-flight marker's last
    /// write). An uncommitted attempt with a recent heartbeat is in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_at: Option<Timestamp>,
    /// Its deletion was asked for (a Backup object deleted with `deletionPolicy: Delete`)
    /// while a recovery depended on it: no rule keeps it any more, as if its TTL had run
    /// out; the floor, chains, locks and holds still do, and a pass removes it (or
    /// consolidates its chain) once that is safe (seed 002).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deletion_requested: bool,
    /// The GTID position its data holds (on a replica, what it had applied): replay starts
    /// after it. `None`: not recorded (binary logging off, or an older backup without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid: Option<GtidPos>,
    /// A MySQL backup's GTID set (the `gtid_executed` of its data, issue 47): replay skips
    /// what it holds, by GTID, and so crosses a failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid_set: Option<crate::gtidset::GtidSet>,
    /// The server it was taken on, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<u32>,
    /// Taken on a Galera node: it restores to its own point only (binlog replay past it
    /// is not supported yet).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub galera: bool,
    /// The restores that need it (the operator's Restore objects, by name): kept, with its
    /// chain and the binlogs after it, while they do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_for: Vec<String>,
    /// The copies (second stores, by name) that still need it and have not received it:
    /// kept, with its chain and the binlogs after it, until they have.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_copy: Vec<String>,
    /// The deletion guard holds it (reason `deletionGuard`): a pass planned to delete it in
    /// a wave no acknowledgement covers yet ([`crate::guard`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub guarded: bool,
}

/// A hold a restore places on a backup it needs: the backup is kept (reason
/// `restore:<by>`) with its chain and the binlogs after it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RestoreHold {
    pub backup_id: BackupId,
    /// The restore's name.
    pub by: String,
}

impl Backup {
    /// A completed full backup with nothing special about it (no lock, hold, TTL or
    /// recorded binlog position): the base that simulations, benchmarks and tests vary.
    pub fn completed_full(
        id: impl Into<String>,
        name: impl Into<String>,
        started_at: Timestamp,
        completed_at: Timestamp,
        size: u64,
    ) -> Self {
        Backup {
            id: id.into(),
            name: name.into(),
            kind: BackupKind::Full,
            phase: Phase::Completed,
            started_at,
            completed_at: Some(completed_at),
            last_modified: completed_at,
            immutable_until: None,
            ttl: None,
            protected: false,
            newer_format: false,
            interrupted_delete: false,
            log_file: None,
            size,
            consolidated_from: Vec::new(),
            consolidatable: false,
            payload_missing: false,
            heartbeat_at: None,
            deletion_requested: false,
            gtid: None,
            gtid_set: None,
            server_id: None,
            galera: false,
            held_for: Vec::new(),
            awaiting_copy: Vec::new(),
            guarded: false,
        }
    }

    pub fn is_successful(&self) -> bool {
        self.phase == Phase::Completed
    }

    /// The instant it restores to: completion, or start when completion is unknown.
    pub fn restore_point(&self) -> Timestamp {
        self.completed_at.unwrap_or(self.started_at)
    }
}

/// One archived binlog segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Segment {
    /// Object name inside `binlogs/`, e.g. `mysql-bin.000041`.
    pub name: String,
    pub sequence: u64,
    pub first_event_at: Option<Timestamp>,
    /// `None` is the seed's "zero" time: unknown, so the segment is never deleted by time.
    pub last_event_at: Option<Timestamp>,
    pub size: u64,
    /// Whether `_index.json` lists it. An unindexed segment has no event times.
    pub indexed: bool,
    /// Whether the object exists in the store (an index entry may outlive its object).
    pub present: bool,
    /// How many consecutive sequence numbers this entry stands for, from `sequence`: 1 for
    /// a segment, more for a [`summary`](Segment::summary).
    #[serde(default = "one")]
    pub span: u64,
    /// The entry stands for an index shard that was not read: `span` segments with
    /// contiguous sequences whose event times grow with the sequence (`first_event_at` is
    /// the first segment's, `last_event_at` the last one's), so replay over it is the same
    /// as over its segments. A summary is never deleted: when a plan's horizon reaches it,
    /// the store reads the shard and plans again ([`crate::Plan::summaries_to_read`]).
    #[serde(default)]
    pub summary: bool,
    /// Who wrote it and which transactions it holds, when the index records it (segments
    /// archived before GTIDs were recorded, and summaries, say nothing).
    /// (Boxed: most archives hold segments by the million, and older ones record none.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtids: Option<Box<SegmentGtids>>,
}

fn one() -> u64 {
    1
}

impl Segment {
    /// A segment object with its index entry (or without, when `indexed` is false).
    pub fn new(
        name: impl Into<String>,
        sequence: u64,
        first_event_at: Option<Timestamp>,
        last_event_at: Option<Timestamp>,
        size: u64,
    ) -> Self {
        Segment {
            name: name.into(),
            sequence,
            first_event_at,
            last_event_at,
            size,
            indexed: true,
            present: true,
            span: 1,
            summary: false,
            gtids: None,
        }
    }

    /// The last sequence number it stands for.
    pub fn last_sequence(&self) -> u64 {
        self.sequence + self.span.max(1) - 1
    }
}

/// What kind of debris a [`Leftover`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LeftoverKind {
    /// An index shard that `_index.json` does not name (an interrupted index rewrite).
    UnreferencedShard,
    /// A multipart upload that was started and never completed or aborted (a killed push
    /// or archiver). Invisible to listings, billed all the same.
    IncompleteUpload,
    /// A local store's staging file (`<object>#<n>`) of an upload that never finished.
    StagingFile,
}

/// An object that belongs to no backup and no index entry: the debris of interrupted work,
/// collected by the planner's age rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Leftover {
    /// Key relative to the cluster prefix.
    pub key: String,
    pub kind: LeftoverKind,
    /// When it was last written (an upload: when it was started).
    pub last_modified: Timestamp,
    pub size: u64,
    /// The backup attempt whose directory holds it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<BackupId>,
    /// The store's handle of an incomplete upload (its upload id), passed back to abort it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<String>,
}

/// Everything one planning pass looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    pub backups: Vec<Backup>,
    pub segments: Vec<Segment>,
    /// Debris of interrupted work (unreferenced shards, incomplete uploads, staging files).
    #[serde(default)]
    pub leftovers: Vec<Leftover>,
    /// When the store was read, by the wall clock. Whether an attempt is still running is a
    /// fact of that moment, not of the instant a plan is evaluated at: a pass evaluated in
    /// the future (`--now`) still sees a fresh marker as fresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<Timestamp>,
    /// The log archive's timelines (`_index.json`'s `timelines`); none recorded: one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timelines: Vec<Timeline>,
}

/// What keeps a chain's base while committed increments build on it: how many do (all
/// generations), and when the last of them expires by its ttl — `None` when one of them
/// has no ttl (then only retention's rules, a deletion or consolidation end the chain).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainWait {
    pub increments: usize,
    pub until: Option<Timestamp>,
}

impl Inventory {
    /// The committed increments built on `id`, directly or through others, and when the
    /// last of them expires by its ttl ([`ChainWait`]); `None` when none builds on it.
    pub fn chain_wait(&self, id: &str) -> Option<ChainWait> {
        let mut parents: Vec<&str> = vec![id];
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut until = Some(Timestamp::MIN);
        let mut increments = 0;
        while let Some(parent) = parents.pop() {
            for b in self.backups.iter().filter(|b| {
                b.phase == Phase::Completed && b.kind.parent().map(String::as_str) == Some(parent)
            }) {
                if !seen.insert(b.id.as_str()) {
                    continue;
                }
                increments += 1;
                until = match (until, b.ttl) {
                    (Some(u), Some(ttl)) => Some(u.max(ttl.after(b.started_at))),
                    _ => None,
                };
                parents.push(b.id.as_str());
            }
        }
        (increments > 0).then_some(ChainWait { increments, until })
    }
}

/// The sequence number of a binlog file name: the digits after its last dot
/// (`mysql-bin.000041` → 41).
pub fn segment_sequence(name: &str) -> Option<u64> {
    let (_, digits) = name.rsplit_once('.')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain's base waits for every committed increment built on it, through all
    /// generations, until the last one's ttl ends; one increment without a ttl leaves no
    /// date; a failed attempt and another chain count for nothing.
    #[test]
    fn a_chain_base_waits_for_its_last_increment() {
        let at = |d: u32| -> Timestamp { format!("2026-11-{d:02}T02:00:00Z").parse().unwrap() };
        let ttl: RetentionDuration = "7d".parse().unwrap();
        let full = |id: &str, d: u32| Backup {
            ttl: Some(ttl),
            ..Backup::completed_full(id.to_owned(), "n", at(d), at(d), 1)
        };
        let incr = |id: &str, parent: &str, d: u32| Backup {
            kind: BackupKind::Incremental(parent.to_owned()),
            ..full(id, d)
        };
        let mut failed = incr("f", "c", 9);
        failed.phase = Phase::Failed;
        let mut inv = Inventory {
            backups: vec![
                full("a", 1),
                incr("b", "a", 2),
                incr("c", "b", 3),
                failed,
                full("x", 4),
                incr("y", "x", 5),
            ],
            segments: Vec::new(),
            leftovers: Vec::new(),
            observed_at: None,
            timelines: Vec::new(),
        };
        assert_eq!(
            inv.chain_wait("a"),
            Some(ChainWait {
                increments: 2,
                until: Some(ttl.after(at(3)))
            })
        );
        assert_eq!(
            inv.chain_wait("b").map(|w| w.increments),
            Some(1),
            "only what builds on it"
        );
        assert_eq!(inv.chain_wait("c"), None, "a leaf, a failed child");
        inv.backups[2].ttl = None;
        assert_eq!(inv.chain_wait("a").unwrap().until, None);
    }

    #[test]
    fn backup_id_form() {
        assert!(is_backup_id("20261120T020000Z-3f2a9c1d"));
        assert!(!is_backup_id("20261120T020000Z-3f2a9c1"));
        assert!(!is_backup_id("20261120T020000-3f2a9c1d0"));
        assert!(!is_backup_id("20261120T020000Z-3F2A9C1D"));
        assert!(!is_backup_id("latest"));
    }

    #[test]
    fn segment_sequences() {
        assert_eq!(segment_sequence("mysql-bin.000041"), Some(41));
        assert_eq!(segment_sequence("mariadb-bin.1000000"), Some(1_000_000));
        assert_eq!(segment_sequence("mysql-bin.index"), None);
        assert_eq!(segment_sequence("nodot"), None);
    }
}
