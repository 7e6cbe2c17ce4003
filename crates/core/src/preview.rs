//! A policy change, previewed (DESIGN.md §5.5, issue 45 §2): the plans of the current and
//! the new policy over the same store, compared — what the new one deletes that the
//! current one keeps, both windows before and after, and the point-in-time instants that
//! stop being restorable.

use std::collections::HashMap;

use jiff::Timestamp;
use serde::Serialize;

use crate::coverage::Interval;
use crate::plan::{Action, Plan, RecoveryWindow};
use crate::reason::Reason;

/// One backup the two policies treat differently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangedBackup {
    pub backup_id: String,
    pub backup_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
    /// Its reasons under the current policy, and under the new one.
    pub current: Vec<Reason>,
    pub new: Vec<Reason>,
}

/// A value before and after the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change<T> {
    pub before: T,
    pub after: T,
}

/// What changing the policy does to one store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyChange {
    /// Deleted under the new policy, kept under the current one (oldest first).
    pub newly_deleted: Vec<ChangedBackup>,
    /// Kept under the new policy, deleted under the current one.
    pub newly_kept: Vec<ChangedBackup>,
    /// The recovery window after a pass of each (`from`: snapshots back to;
    /// `pointInTimeFrom`: every instant from).
    pub recovery_window: Change<Option<RecoveryWindow>>,
    /// Binlog segments each pass deletes.
    pub segments_deleted: Change<usize>,
    /// Instants that restore at every point under the current policy and no more under
    /// the new one (bounds may themselves stay restorable: a kept backup's own point).
    pub lost: Vec<Interval>,
}

impl PolicyChange {
    /// Whether the new policy loses anything the current one keeps.
    pub fn loses(&self) -> bool {
        !self.newly_deleted.is_empty() || !self.lost.is_empty()
    }
}

/// Compares `current` and `new`, two plans of the same store at the same `now`.
pub fn compare(current: &Plan, new: &Plan) -> PolicyChange {
    let by_id: HashMap<(&str, &str), &crate::plan::BackupDecision> = current
        .backups
        .iter()
        .map(|d| ((d.backup.name.as_str(), d.backup.id.as_str()), d))
        .collect();
    let mut newly_deleted = Vec::new();
    let mut newly_kept = Vec::new();
    for d in &new.backups {
        let Some(c) = by_id.get(&(d.backup.name.as_str(), d.backup.id.as_str())) else {
            continue;
        };
        let deletes = |a: Action| a == Action::Delete;
        if deletes(d.action) == deletes(c.action) {
            continue;
        }
        let changed = ChangedBackup {
            backup_id: d.backup.id.clone(),
            backup_name: d.backup.name.clone(),
            completed_at: d.backup.completed_at,
            current: c.reasons.clone(),
            new: d.reasons.clone(),
        };
        if deletes(d.action) {
            newly_deleted.push(changed);
        } else {
            newly_kept.push(changed);
        }
    }
    PolicyChange {
        newly_deleted,
        newly_kept,
        lost: lost(
            current.recovery_window.as_ref(),
            new.recovery_window.as_ref(),
        ),
        recovery_window: Change {
            before: current.recovery_window.clone(),
            after: new.recovery_window.clone(),
        },
        segments_deleted: Change {
            before: current.segments.delete.len(),
            after: new.segments.delete.len(),
        },
    }
}

/// The stretches of `w` restorable at every instant: `[pointInTimeFrom, to]` without its
/// gaps.
pub fn pieces(w: Option<&RecoveryWindow>) -> Vec<Interval> {
    let Some(w) = w else { return Vec::new() };
    let mut out = Vec::new();
    let mut from = w.point_in_time_from;
    for g in w.gaps.iter().filter(|g| g.to > w.point_in_time_from) {
        if g.from > from {
            out.push(Interval { from, to: g.from });
        }
        from = from.max(g.to);
    }
    if w.to >= from {
        out.push(Interval { from, to: w.to });
    }
    out
}

/// What of `before`'s point-in-time stretches `after`'s do not cover.
fn lost(before: Option<&RecoveryWindow>, after: Option<&RecoveryWindow>) -> Vec<Interval> {
    let kept = pieces(after);
    let mut out = Vec::new();
    for piece in pieces(before) {
        let mut from = piece.from;
        for k in kept
            .iter()
            .filter(|k| k.to >= piece.from && k.from <= piece.to)
        {
            if k.from > from {
                out.push(Interval { from, to: k.from });
            }
            from = from.max(k.to);
        }
        if piece.to > from {
            out.push(Interval { from, to: piece.to });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(h: i64) -> Timestamp {
        Timestamp::from_second(1_790_000_000 + h * 3600).unwrap()
    }

    fn w(from: i64, pitr: i64, to: i64, gaps: &[(i64, i64)]) -> RecoveryWindow {
        RecoveryWindow {
            from: t(from),
            to: t(to),
            point_in_time_from: t(pitr),
            gaps: gaps
                .iter()
                .map(|&(a, b)| Interval {
                    from: t(a),
                    to: t(b),
                })
                .collect(),
        }
    }

    #[test]
    fn lost_is_what_before_restores_and_after_does_not() {
        // A shorter point-in-time window loses its first days.
        assert_eq!(
            lost(Some(&w(0, 0, 100, &[])), Some(&w(0, 60, 100, &[]))),
            vec![Interval {
                from: t(0),
                to: t(60)
            }]
        );
        // A gap opened in the middle.
        assert_eq!(
            lost(Some(&w(0, 0, 100, &[])), Some(&w(0, 0, 100, &[(40, 50)]))),
            vec![Interval {
                from: t(40),
                to: t(50)
            }]
        );
        // A gap closed loses nothing; nothing before, nothing lost.
        assert!(lost(Some(&w(0, 0, 100, &[(40, 50)])), Some(&w(0, 0, 100, &[]))).is_empty());
        assert!(lost(None, Some(&w(0, 0, 100, &[]))).is_empty());
        assert_eq!(
            lost(Some(&w(0, 0, 100, &[])), None),
            vec![Interval {
                from: t(0),
                to: t(100)
            }]
        );
    }
}
