//! What a point-in-time restore uses: the backup (with its chain) and the log segments that
//! bring it to a target instant — or why the target cannot be reached.
//!
//! The choice follows the restore model of [`crate::coverage`]: the newest restorable
//! backup that completed at or before the target and whose replay reaches it. Replay starts
//! in the segment holding the backup's recorded binlog position (at that position), or,
//! when no position is recorded, at the first segment whose events reach the backup's
//! completion; it takes every contiguous segment holding events up to the target.

use jiff::Timestamp;
use serde::Serialize;

use crate::coverage::{Interval, Replay};
use crate::inventory::{Backup, BackupId, Inventory, Segment, segment_sequence};
use crate::plan::{RecoveryWindow, parents, restorable, sorted, window_of};

/// What a restore to `target` uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreChoice {
    pub target: Timestamp,
    /// The backup restored and its ancestors, base full first, restored backup last.
    pub chain: Vec<Backup>,
    /// Segments to replay, in sequence order; empty when the target is the backup's own
    /// restore point and no archived segment holds events after its position.
    pub segments: Vec<Segment>,
    /// Whether replay begins at the restored backup's recorded binlog position in
    /// `segments[0]` (otherwise at the start of `segments[0]`).
    pub from_log_position: bool,
    pub window: RecoveryWindow,
    /// Summaries (unread index shards) among `segments`: the caller reads their shards and
    /// chooses again. Empty in a final choice.
    pub unread: Vec<Segment>,
}

/// Why a target cannot be restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreRefusal {
    #[error("nothing to restore: the store holds no restorable backup")]
    NoRecoveryPoint,
    #[error(
        "{target} is outside the recovery window {} … {}{}",
        window.from, window.to, gaps_note(window)
    )]
    OutsideWindow {
        target: Timestamp,
        window: RecoveryWindow,
    },
    #[error(
        "{target} falls in a gap of the recovery window: nothing restores between {} and {} (window {} … {})",
        gap.from, gap.to, window.from, window.to
    )]
    InGap {
        target: Timestamp,
        gap: Interval,
        window: RecoveryWindow,
    },
    #[error(
        "backup {backup} is at binlog {file}, which is not in the archive, and {target} lies after its completion; choose its completion {completed} or archive the binlogs"
    )]
    PositionNotArchived {
        target: Timestamp,
        backup: BackupId,
        file: String,
        completed: Timestamp,
    },
    #[error(
        "binlog segment {missing} is missing from the archive: replay from backup {backup} stops after {after} and cannot reach {target}"
    )]
    MissingSegment {
        target: Timestamp,
        backup: BackupId,
        after: String,
        missing: u64,
    },
}

fn gaps_note(w: &RecoveryWindow) -> String {
    if w.gaps.is_empty() {
        return String::new();
    }
    let gaps: Vec<String> = w
        .gaps
        .iter()
        .map(|g| format!("{} … {}", g.from, g.to))
        .collect();
    format!(" (with gaps {})", gaps.join(", "))
}

/// Chooses what a restore to `target` uses.
///
/// # Errors
/// The target lies outside the recovery window or in one of its gaps, or the segments
/// replay needs are not all archived.
pub fn choose_restore(
    inventory: &Inventory,
    target: Timestamp,
) -> Result<RestoreChoice, RestoreRefusal> {
    let backups = sorted(inventory);
    let parent = parents(&backups);
    let ok = restorable(&backups, &parent);
    let replay = Replay::new(&inventory.segments);
    let window = window_of(&backups, &replay, |i| ok[i]).ok_or(RestoreRefusal::NoRecoveryPoint)?;
    if target < window.from || target > window.to {
        return Err(RestoreRefusal::OutsideWindow { target, window });
    }
    if let Some(gap) = window
        .gaps
        .iter()
        .find(|g| g.from < target && target < g.to)
        .copied()
    {
        return Err(RestoreRefusal::InGap {
            target,
            gap,
            window,
        });
    }
    // Inside the window, some restorable backup reaches the target; take the newest.
    let chosen = (0..backups.len())
        .filter(|&i| ok[i])
        .filter(|&i| {
            let rp = backups[i].restore_point();
            rp <= target && replay.replay_end(rp) >= target
        })
        .max_by(|&a, &b| {
            (backups[a].restore_point(), &backups[a].id)
                .cmp(&(backups[b].restore_point(), &backups[b].id))
        })
        .ok_or_else(|| RestoreRefusal::OutsideWindow {
            target,
            window: window.clone(),
        })?;
    let mut chain = Vec::new();
    let mut cur = Some(chosen);
    while let Some(i) = cur {
        chain.push(backups[i].clone());
        cur = parent[i];
    }
    chain.reverse();
    let backup = backups[chosen];
    let (segments, from_log_position) = replay_segments(inventory, backup, &replay, target)?;
    let unread = segments.iter().filter(|s| s.summary).cloned().collect();
    Ok(RestoreChoice {
        target,
        chain,
        segments,
        from_log_position,
        window,
        unread,
    })
}

/// [`choose_restore`] for a target as people give it: a target with no fraction of a second
/// (as Tidemark, `kubectl` and Kubernetes' own times print it) names that whole second,
/// which replay already includes (binlog events carry whole seconds). So when the
/// recovery window, or its part after a gap, begins inside that second — a Backup's
/// `completedAt` shown to the second, the store holding nanoseconds — the target is that
/// beginning, and restoring to a printed completion time restores that backup. A target
/// with a fraction is exact.
///
/// # Errors
/// As [`choose_restore`], for the target as given.
pub fn choose_restore_to(
    inventory: &Inventory,
    target: Timestamp,
) -> Result<RestoreChoice, RestoreRefusal> {
    let refused = match choose_restore(inventory, target) {
        Ok(c) => return Ok(c),
        Err(e) => e,
    };
    if target.subsec_nanosecond() != 0 {
        return Err(refused);
    }
    let begins = match &refused {
        RestoreRefusal::OutsideWindow { window, .. } if window.from > target => window.from,
        RestoreRefusal::InGap { gap, .. } => gap.to,
        _ => return Err(refused),
    };
    if begins.as_second() != target.as_second() {
        return Err(refused);
    }
    choose_restore(inventory, begins).map_err(|_| refused)
}

/// The contiguous segments from the backup's replay start that hold events up to `target`.
fn replay_segments(
    inventory: &Inventory,
    backup: &Backup,
    replay: &Replay,
    target: Timestamp,
) -> Result<(Vec<Segment>, bool), RestoreRefusal> {
    let mut present: Vec<&Segment> = inventory.segments.iter().filter(|s| s.present).collect();
    present.sort_by(|a, b| (a.sequence, &a.name).cmp(&(b.sequence, &b.name)));
    present.dedup_by_key(|s| s.sequence);
    let completed = backup.restore_point();
    let holding = |seq: u64| {
        present
            .iter()
            .position(|s| s.sequence <= seq && seq <= s.last_sequence())
    };
    let position_file = backup.log_file.as_deref();
    let (start, from_log_position) = match position_file.and_then(segment_sequence) {
        Some(seq) => match holding(seq) {
            Some(i) => (Some(i), present[i].sequence == seq && !present[i].summary),
            None if target > completed => {
                return Err(RestoreRefusal::PositionNotArchived {
                    target,
                    backup: backup.id.clone(),
                    file: position_file.unwrap_or_default().to_owned(),
                    completed,
                });
            }
            None => (None, false),
        },
        None => (replay.start_sequence(completed).and_then(holding), false),
    };
    let Some(start) = start else {
        return Ok((Vec::new(), false));
    };
    let mut out: Vec<Segment> = Vec::new();
    for s in &present[start..] {
        if out
            .last()
            .is_some_and(|prev| s.sequence != prev.last_sequence() + 1)
        {
            break;
        }
        if s.first_event_at.is_some_and(|f| f > target) && !out.is_empty() {
            break;
        }
        out.push((*s).clone());
    }
    // Replay reaches the target when some taken segment ends at or after it, or the next
    // archived segment begins after it (so no event up to the target is missing).
    let reached = out
        .iter()
        .any(|s| s.last_event_at.is_some_and(|l| l >= target));
    let next = out
        .last()
        .and_then(|l| present.iter().find(|s| s.sequence == l.last_sequence() + 1));
    let next_starts_later = next.is_some_and(|s| s.first_event_at.is_some_and(|f| f > target));
    if target > completed && !reached && !next_starts_later {
        let after = out.last().map_or_else(String::new, |s| s.name.clone());
        let missing = out.last().map_or(0, |s| s.last_sequence() + 1);
        return Err(RestoreRefusal::MissingSegment {
            target,
            backup: backup.id.clone(),
            after,
            missing,
        });
    }
    Ok((out, from_log_position))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{BackupKind, Phase};

    fn ts(s: &str) -> Timestamp {
        format!("2026-11-{s}:00Z").parse().unwrap()
    }

    fn backup(id: &str, kind: BackupKind, started: &str, completed: &str, log: &str) -> Backup {
        Backup {
            id: id.into(),
            name: "nightly".into(),
            kind,
            phase: Phase::Completed,
            started_at: ts(started),
            completed_at: Some(ts(completed)),
            last_modified: ts(completed),
            immutable_until: None,
            ttl: None,
            protected: false,
            newer_format: false,
            interrupted_delete: false,
            log_file: Some(log.into()),
            size: 1,
            consolidated_from: Vec::new(),
            consolidatable: false,
            payload_missing: false,
            heartbeat_at: None,
            deletion_requested: false,
        }
    }

    fn seg(seq: u64, first: &str, last: &str) -> Segment {
        Segment::new(
            format!("mysql-bin.{seq:06}"),
            seq,
            Some(ts(first)),
            Some(ts(last)),
            1,
        )
    }

    const FULL: &str = "20261101T000000Z-aaaaaaaa";
    const INC: &str = "20261101T120000Z-bbbbbbbb";

    fn inventory() -> Inventory {
        Inventory {
            backups: vec![
                backup(
                    FULL,
                    BackupKind::Full,
                    "01T00:00",
                    "01T00:10",
                    "mysql-bin.000001",
                ),
                backup(
                    INC,
                    BackupKind::Incremental(FULL.into()),
                    "01T12:00",
                    "01T12:10",
                    "mysql-bin.000003",
                ),
            ],
            segments: vec![
                seg(1, "01T00:00", "01T06:00"),
                seg(2, "01T06:00", "01T11:00"),
                seg(3, "01T11:00", "01T18:00"),
                seg(4, "01T18:00", "02T00:00"),
            ],
            ..Default::default()
        }
    }

    fn names(c: &RestoreChoice) -> (Vec<&str>, Vec<u64>) {
        (
            c.chain.iter().map(|b| b.id.as_str()).collect(),
            c.segments.iter().map(|s| s.sequence).collect(),
        )
    }

    #[test]
    fn picks_the_newest_backup_before_the_target_and_the_segments_up_to_it() {
        let inv = inventory();
        let c = choose_restore(&inv, ts("01T07:00")).unwrap();
        assert_eq!(names(&c), (vec![FULL], vec![1, 2]));
        assert!(c.from_log_position);
        let c = choose_restore(&inv, ts("01T13:00")).unwrap();
        assert_eq!(names(&c), (vec![FULL, INC], vec![3]));
        let c = choose_restore(&inv, ts("01T19:00")).unwrap();
        assert_eq!(names(&c), (vec![FULL, INC], vec![3, 4]));
        // Exactly the incremental's completion: its position's segment, nothing later.
        let c = choose_restore(&inv, ts("01T12:10")).unwrap();
        assert_eq!(names(&c), (vec![FULL, INC], vec![3]));
    }

    #[test]
    fn refuses_outside_the_window_and_in_gaps_naming_them() {
        let inv = inventory();
        let e = choose_restore(&inv, ts("03T00:00")).unwrap_err();
        assert!(matches!(e, RestoreRefusal::OutsideWindow { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("2026-11-01T00:10:00Z … 2026-11-02T00:00:00Z"),
            "{e}"
        );
        let e = choose_restore(&inv, ts("01T00:05")).unwrap_err();
        assert!(matches!(e, RestoreRefusal::OutsideWindow { .. }), "{e}");

        let mut gap = inventory();
        gap.segments.retain(|s| s.sequence != 2);
        let e = choose_restore(&gap, ts("01T08:00")).unwrap_err();
        let RestoreRefusal::InGap { gap: g, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!((g.from, g.to), (ts("01T06:00"), ts("01T12:10")));
        assert!(
            e.to_string()
                .contains("between 2026-11-01T06:00:00Z and 2026-11-01T12:10:00Z")
        );
        // The incremental still restores past the gap.
        assert_eq!(
            names(&choose_restore(&gap, ts("01T13:00")).unwrap()).1,
            vec![3]
        );
    }

    #[test]
    fn a_target_given_to_the_second_names_the_whole_second() {
        let mut inv = inventory();
        inv.backups.truncate(1);
        inv.segments.clear();
        // The store holds the completion to the nanosecond; people see it to the second.
        let completed: Timestamp = "2026-11-01T00:10:00.329851779Z".parse().unwrap();
        inv.backups[0].completed_at = Some(completed);
        let printed = ts("01T00:10");
        assert!(matches!(
            choose_restore(&inv, printed),
            Err(RestoreRefusal::OutsideWindow { .. })
        ));
        let c = choose_restore_to(&inv, printed).unwrap();
        assert_eq!((names(&c).0, c.target), (vec![FULL], completed));
        // An exact target before it stays refused, and so does the second before.
        let exact: Timestamp = "2026-11-01T00:10:00.1Z".parse().unwrap();
        assert!(choose_restore_to(&inv, exact).is_err());
        assert!(choose_restore_to(&inv, ts("01T00:09")).is_err());
    }

    #[test]
    fn a_position_that_was_never_archived_limits_replay() {
        let mut inv = inventory();
        inv.backups.truncate(1);
        inv.segments.retain(|s| s.sequence != 1);
        // Time model: segment 2 began after the completion and 1 is missing: only the
        // completion itself restores.
        let e = choose_restore(&inv, ts("01T07:00")).unwrap_err();
        assert!(matches!(e, RestoreRefusal::OutsideWindow { .. }), "{e}");
        let c = choose_restore(&inv, ts("01T00:10")).unwrap();
        assert_eq!(names(&c), (vec![FULL], vec![]));
    }

    #[test]
    fn summaries_on_the_way_are_reported_unread() {
        let mut inv = inventory();
        let mut summary = Segment::new(
            "mysql-bin.000001",
            1,
            Some(ts("01T00:00")),
            Some(ts("01T11:00")),
            2,
        );
        summary.span = 2;
        summary.summary = true;
        inv.segments.retain(|s| s.sequence > 2);
        inv.segments.push(summary);
        let c = choose_restore(&inv, ts("01T07:00")).unwrap();
        assert_eq!(c.unread.len(), 1);
        assert!(!c.from_log_position);
    }
}
