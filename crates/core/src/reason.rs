//! Why a backup is kept or deleted. The string forms are part of the `--output json`
//! contract (`backups[].reasons`) and are documented in `docs/retention.md`.

use std::fmt;

use jiff::Timestamp;
use serde::{Serialize, Serializer};

use crate::inventory::BackupId;

/// One recorded reason. Keep reasons and delete reasons never mix on one backup; the one
/// status reason, [`Reason::Broken`], goes with either.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    // --- keep ---
    /// Completed inside the time window.
    Window,
    /// The newest backup completed before the window, so the whole window restores.
    CoverWindow,
    /// `pointInTime.window`: the newest backup completed at or before the window's start,
    /// which every instant of the window replays from.
    PointInTime,
    /// Among the newest `keepLast` successful backups.
    KeepLast,
    /// Newest backup of its calendar day (in the policy's zone), e.g. `daily:2026-11-20`.
    Daily(String),
    /// Newest of its ISO week, e.g. `weekly:2026-W47`.
    Weekly(String),
    /// Newest of its month, e.g. `monthly:2026-11`.
    Monthly(String),
    /// Newest of its year, e.g. `yearly:2026`.
    Yearly(String),
    /// The newest successful (or newest restorable) backup: always kept.
    Floor,
    /// A retained backup (named) is built on this one.
    Chain(BackupId),
    /// Object-locked until then (a chain's lock is that of its last increment).
    Locked(Timestamp),
    /// A hold: `tidemark.io/protect`, or `--protect`.
    Protected,
    /// A restore (named: the operator's Restore object) needs it, e.g. `restore:nightly-fix`.
    Restore(String),
    /// A copy (named: the policy's `copies[].name`) still needs it and has not received it
    /// yet, e.g. `copy:dr`.
    Copy(String),
    /// Its own `ttl` has not expired.
    Ttl,
    /// Still running.
    InProgress,
    /// A failed or uncommitted attempt younger than `failedBackupsTTL` (or none is set).
    FailedBackupsTtl,
    /// Written by a newer Tidemark (`formatVersion` above ours): never deleted by us.
    NewerFormat,
    /// Deleting it would open a hole in the point-in-time window (the log archive has a gap
    /// that only this backup bridges).
    Gap,
    /// Would be deleted, but `maxDeletionsPerPass` was reached; a later pass takes it.
    Deferred,
    /// `consolidate`: merged into a synthetic full that takes the place of the named
    /// retained increment; deleted once that full is committed.
    ConsolidateInto(BackupId),
    /// Its `metadata.json` cannot be read: never deleted, never counted.
    Malformed,
    /// The deletion guard holds it: this pass would delete more than
    /// `deletionGuard.threshold` recovery points, or shrink a window by more than
    /// `deletionGuard.window`, and no acknowledgement covers it yet.
    DeletionGuard,
    // --- status ---
    /// Kept outside the point-in-time window (`pointInTime.window`): it restores to its
    /// own point, with no binlogs after it.
    Standalone,
    /// Committed but not restorable: a payload object it records is missing or has another
    /// size, or its chain is incomplete. It counts for no rule and is kept or collected like
    /// a failed attempt; shown beside the reasons for what happens to it.
    Broken,
    // --- delete ---
    /// No rule keeps it.
    Expired,
    /// Its own `ttl` has expired.
    TtlExpired,
    /// A failed attempt older than `failedBackupsTTL`.
    Failed,
    /// Payload without `metadata.json`, older than `failedBackupsTTL`.
    Uncommitted,
    /// A previous pass un-committed it for deletion and was interrupted.
    InterruptedDelete,
    /// A committed synthetic full (named) took its place.
    Consolidated(BackupId),
    /// Its Backup object was deleted with `deletionPolicy: Delete` (the operator's
    /// `tidemark.io/remote-cleanup` finalizer).
    DeletionRequested,
}

/// Whether a reason keeps, deletes, or only describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasonKind {
    Keep,
    Delete,
    /// Says what the backup is, whatever happens to it ([`Reason::Broken`],
    /// [`Reason::Standalone`]).
    Status,
}

impl Reason {
    pub fn kind(&self) -> ReasonKind {
        match self {
            Reason::Expired
            | Reason::TtlExpired
            | Reason::Failed
            | Reason::Uncommitted
            | Reason::InterruptedDelete
            | Reason::Consolidated(_)
            | Reason::DeletionRequested => ReasonKind::Delete,
            Reason::Broken | Reason::Standalone => ReasonKind::Status,
            _ => ReasonKind::Keep,
        }
    }

    pub fn is_keep(&self) -> bool {
        self.kind() == ReasonKind::Keep
    }

    /// Reasons granted by the retention rules, which an expired per-backup `ttl` overrides.
    pub fn is_policy_rule(&self) -> bool {
        matches!(
            self,
            Reason::Window
                | Reason::CoverWindow
                | Reason::PointInTime
                | Reason::KeepLast
                | Reason::Daily(_)
                | Reason::Weekly(_)
                | Reason::Monthly(_)
                | Reason::Yearly(_)
                | Reason::Ttl
                | Reason::FailedBackupsTtl
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Window => f.write_str("window"),
            Reason::CoverWindow => f.write_str("coverWindow"),
            Reason::PointInTime => f.write_str("pointInTime"),
            Reason::KeepLast => f.write_str("keepLast"),
            Reason::Daily(k) => write!(f, "daily:{k}"),
            Reason::Weekly(k) => write!(f, "weekly:{k}"),
            Reason::Monthly(k) => write!(f, "monthly:{k}"),
            Reason::Yearly(k) => write!(f, "yearly:{k}"),
            Reason::Floor => f.write_str("floor"),
            Reason::Chain(id) => write!(f, "chain:{id}"),
            Reason::Locked(t) => write!(f, "locked:{t}"),
            Reason::Protected => f.write_str("protected"),
            Reason::Restore(by) => write!(f, "restore:{by}"),
            Reason::Copy(name) => write!(f, "copy:{name}"),
            Reason::Ttl => f.write_str("ttl"),
            Reason::InProgress => f.write_str("inProgress"),
            Reason::FailedBackupsTtl => f.write_str("failedBackupsTTL"),
            Reason::NewerFormat => f.write_str("newerFormat"),
            Reason::Gap => f.write_str("gap"),
            Reason::Deferred => f.write_str("deferred"),
            Reason::ConsolidateInto(id) => write!(f, "consolidateInto:{id}"),
            Reason::Expired => f.write_str("expired"),
            Reason::TtlExpired => f.write_str("ttlExpired"),
            Reason::Failed => f.write_str("failed"),
            Reason::Uncommitted => f.write_str("uncommitted"),
            Reason::InterruptedDelete => f.write_str("interruptedDelete"),
            Reason::Consolidated(id) => write!(f, "consolidated:{id}"),
            Reason::DeletionRequested => f.write_str("deletionRequested"),
            Reason::Malformed => f.write_str("malformed"),
            Reason::Broken => f.write_str("broken"),
            Reason::Standalone => f.write_str("standalone"),
            Reason::DeletionGuard => f.write_str("deletionGuard"),
        }
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
