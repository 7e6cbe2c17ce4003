//! Immutable backups (seed 002): how long S3 Object Lock keeps a backup.
//!
//! "Each full backup has a maximum number of incremental backups, with the expiration of
//! any backup corresponding to the expiration of the last backup in the entire chain":
//! a full is locked until the slot of its chain's last increment (from the schedule and
//! `maxIncrementsPerFull`) plus the lock period, and each increment of the chain takes the
//! same date (never earlier than its parent's, never earlier than its own start plus the
//! period).

use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use jiff::tz::TimeZone;

use crate::duration::RetentionDuration;
use crate::schedule::Cron;

/// The retention mode of S3 Object Lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Users with `s3:BypassGovernanceRetention` may delete or shorten it; Tidemark never
    /// does.
    Governance,
    /// Nobody may delete the object or shorten its retention, the root account included.
    Compliance,
}

/// What happens to a locked chain once its lock has ended and no rule keeps it (seed 002:
/// "The retention job will not remove backups from the target storage …; it will only
/// delete the backup CR … Deletion of the actual backups from the target storage will be
/// managed by the retention period set on the S3 bucket").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockExpiry {
    /// The default: the pass records the chain as expired in the store (no plan, restore
    /// or window uses it again) and leaves its objects to the bucket's lifecycle rule.
    #[default]
    Lifecycle,
    /// Opt-in: the pass deletes its objects, every version, itself.
    Delete,
}

/// The accepted spellings of [`LockExpiry`], quoted in errors.
pub const LOCK_EXPIRIES: &str = "lifecycle (the default: the bucket's lifecycle rule removes an expired chain) or delete (Tidemark deletes it)";

impl fmt::Display for LockExpiry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LockExpiry::Lifecycle => "lifecycle",
            LockExpiry::Delete => "delete",
        })
    }
}

impl FromStr for LockExpiry {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "lifecycle" => Ok(LockExpiry::Lifecycle),
            "delete" => Ok(LockExpiry::Delete),
            _ => Err(format!(
                "invalid afterExpiry {:?}: expected {LOCK_EXPIRIES}",
                s.chars().take(80).collect::<String>()
            )),
        }
    }
}

/// The accepted spellings of a lock mode, quoted in errors.
pub const LOCK_MODES: &str = "governance or compliance";

impl LockMode {
    /// The mode as S3 spells it.
    pub fn as_s3(self) -> &'static str {
        match self {
            LockMode::Governance => "GOVERNANCE",
            LockMode::Compliance => "COMPLIANCE",
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LockMode::Governance => "governance",
            LockMode::Compliance => "compliance",
        })
    }
}

impl FromStr for LockMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "governance" => Ok(LockMode::Governance),
            "compliance" => Ok(LockMode::Compliance),
            _ => Err(format!(
                "invalid object lock mode {:?}: expected {LOCK_MODES}",
                s.chars().take(80).collect::<String>()
            )),
        }
    }
}

/// A policy's object lock: the mode, and how long a chain's last backup stays locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectLock {
    pub mode: LockMode,
    pub period: RetentionDuration,
}

/// Chains longer than this are not walked slot by slot (`maxIncrementsPerFull` is at most
/// 10,000; this bounds the work of a hostile value all the same).
const MAX_SLOTS: u32 = 100_000;

impl ObjectLock {
    /// The date a backup started at `started` asks to be locked until: `period` after the
    /// later of `started` and `chain_end` (the slot of its chain's last increment, for a
    /// full of a schedule with incrementals; [`chain_end`]).
    pub fn until(&self, started: Timestamp, chain_end: Option<Timestamp>) -> Timestamp {
        self.period
            .after(chain_end.map_or(started, |end| end.max(started)))
    }
}

/// The slot of the last increment of a chain whose full ran at `full_slot`: the
/// `increments`-th slot of `cron` after it. `None` when the schedule ends before (a cron
/// with no more slots).
pub fn chain_end(
    cron: &Cron,
    tz: &TimeZone,
    full_slot: Timestamp,
    increments: u32,
) -> Option<Timestamp> {
    let mut at = full_slot;
    for _ in 0..increments.min(MAX_SLOTS) {
        at = cron.next_after(at, tz)?;
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_chain_is_locked_until_its_last_increment_expires() {
        // Daily at 02:00, a full and up to 6 increments, 30 days: the full of Monday the
        // 23rd is locked until 30 days after Sunday the 29th's increment.
        let cron: Cron = "0 0 2 * * *".parse().unwrap();
        let lock = ObjectLock {
            mode: LockMode::Governance,
            period: "30d".parse().unwrap(),
        };
        let full = ts("2026-11-23T02:00:00Z");
        let end = chain_end(&cron, &TimeZone::UTC, full, 6).unwrap();
        assert_eq!(end, ts("2026-11-29T02:00:00Z"));
        assert_eq!(lock.until(full, Some(end)), ts("2026-12-29T02:00:00Z"));
        // An increment alone asks for its own start plus the period (its chain's date is
        // the parent's, when later).
        let third = ts("2026-11-26T02:00:05Z");
        assert_eq!(lock.until(third, None), ts("2026-12-26T02:00:05Z"));
        // No increments: the full's own start.
        assert_eq!(chain_end(&cron, &TimeZone::UTC, full, 0), Some(full));
        // A full that ran late (after its chain's end was computed) is never locked for
        // less than the period from its start.
        assert_eq!(
            lock.until(ts("2026-12-01T00:00:00Z"), Some(end)),
            ts("2026-12-31T00:00:00Z")
        );
    }

    #[test]
    fn modes() {
        assert_eq!(
            "GOVERNANCE".parse::<LockMode>().unwrap(),
            LockMode::Governance
        );
        assert_eq!(
            "compliance".parse::<LockMode>().unwrap(),
            LockMode::Compliance
        );
        let e = "legal-hold".parse::<LockMode>().unwrap_err();
        assert!(
            e.contains("\"legal-hold\"") && e.contains(LOCK_MODES),
            "{e}"
        );
        assert_eq!(LockMode::Compliance.as_s3(), "COMPLIANCE");
    }
}
