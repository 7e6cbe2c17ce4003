//! Copies: a second store with its own plan (DESIGN.md §7.2, issue 44). Pure decisions:
//! what a copy pass sends (what the copy's own plan would keep of the source's history and
//! does not hold yet), and what a retention pass on the source keeps for a copy that has
//! not received it yet.
//!
//! A copy's plan is made over the union of what it holds and what the source holds, as if
//! everything were already copied: what that plan keeps and the copy lacks is sent; what it
//! deletes is declined (never sent — it would be deleted by the copy's next pass). That
//! plan keeps no more than the copy's own plan does of what the copy holds (the union only
//! adds backups and segments, which can take a keepLast place or a calendar bucket, never
//! give one back), so what the copy's retention deleted is not sent again — unless a
//! backup the copy still lacks builds on it. A copy that lost its data (a bucket emptied)
//! is sent again what the source still has.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

use crate::inventory::{Backup, BackupKind, Inventory, Phase, Segment};
use crate::plan::{Action, Plan, SegmentReason};
use crate::timeline::timeline_of;

/// How far a copy has come, as the source records it (`_state/copies/<name>.json`): the
/// backups it has dealt with (received, or declined by its plan) and, per timeline, the
/// segment sequence through which every indexed segment was dealt with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyFloor {
    /// The copy's name (`copies[].name`).
    pub name: String,
    /// Backup-ids the copy received or declined.
    #[serde(default)]
    pub handled: BTreeSet<String>,
    /// Per timeline: every indexed segment up to this sequence was received or declined.
    #[serde(default)]
    pub segments_through: BTreeMap<u32, u64>,
    /// Per timeline: the runs of sequences (first, last) below `segments_through` the
    /// source had not indexed when the floor was set (a hole in its index); one indexed
    /// later is still awaited.
    #[serde(default)]
    pub segments_missing: BTreeMap<u32, Vec<[u64; 2]>>,
    /// Per timeline: the first sequence the source had indexed when the floor was set;
    /// one indexed later below it is still awaited.
    #[serde(default)]
    pub segments_from: BTreeMap<u32, u64>,
}

impl CopyFloor {
    /// Whether the copy still needs segment `sequence` (not dealt with yet).
    pub fn awaits_segment(&self, sequence: u64) -> bool {
        let timeline = timeline_of(sequence);
        self.segments_through
            .get(&timeline)
            .is_none_or(|&through| sequence > through)
            || self
                .segments_from
                .get(&timeline)
                .is_some_and(|&from| sequence < from)
            || self
                .segments_missing
                .get(&timeline)
                .is_some_and(|runs| runs.iter().any(|[a, b]| (*a..=*b).contains(&sequence)))
    }
}

/// Most runs of missing sequences a floor records, over all timelines: beyond them a
/// timeline's floor stops below the next hole (the source keeps more, never less), and the
/// record stays small.
pub const MAX_MISSING_RUNS: usize = 1024;

/// Where a copy's segments stand after a pass ([`segments_through`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentFloor {
    /// Per timeline: every indexed segment up to this sequence was dealt with.
    pub through: BTreeMap<u32, u64>,
    /// Per timeline: the runs (first, last) below `through` the source's index did not hold.
    pub missing: BTreeMap<u32, Vec<[u64; 2]>>,
    /// Per timeline: the first sequence the source's index held.
    pub from: BTreeMap<u32, u64>,
}

/// Marks the completed backups each copy has not dealt with yet (they are then kept, with
/// their chain and the binlogs after them: [`crate::Reason::Copy`]).
pub fn mark_awaiting(backups: &mut [Backup], floors: &[CopyFloor]) {
    for b in backups.iter_mut() {
        b.awaiting_copy = floors
            .iter()
            .filter(|f| b.phase == Phase::Completed && !f.handled.contains(&b.id))
            .map(|f| f.name.clone())
            .collect();
    }
}

/// Keeps the segments a plan would delete that a copy has not dealt with yet. Returns how
/// many it kept.
pub fn keep_segments_for_copies(plan: &mut Plan, floors: &[CopyFloor]) -> usize {
    if floors.is_empty() {
        return 0;
    }
    let before = plan.segments.delete.len();
    plan.segments.delete.retain(|d| {
        d.reason != SegmentReason::BehindHorizon
            || !floors.iter().any(|f| f.awaits_segment(d.sequence))
    });
    let kept = before - plan.segments.delete.len();
    plan.segments.keep += kept;
    plan.segments.kept_for_copies += kept;
    kept
}

/// What one copy pass sends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyChoice {
    /// Backups to send, parents before their increments.
    pub backups: Vec<String>,
    /// Backups the copy's plan would not keep: never sent.
    pub declined: Vec<String>,
    /// Why each declined backup is not sent: the copy's plan's reasons for deleting it
    /// (`expired`, …), or `broken` (its payload is missing, or its chain cannot land
    /// whole), or `newerFormat`.
    pub declined_why: std::collections::BTreeMap<String, Vec<crate::reason::Reason>>,
    /// Segments (by sequence) to send, in sequence order.
    pub segments: Vec<u64>,
    /// Segments the copy's plan would not keep: never sent.
    pub declined_segments: Vec<u64>,
}

/// Chooses what a copy pass sends: `union` is the copy's inventory with the source's
/// completed backups and indexed segments it lacks added (as if already copied), `plan`
/// the copy's plan over it; `in_copy` the backup-ids and segment sequences the copy holds.
///
/// Only completed, restorable backups are sent (a broken one is declined), and an
/// increment only with its whole chain (its parent sent before it, or in the copy).
pub fn choose(
    union: &Inventory,
    plan: &Plan,
    in_copy: &HashSet<String>,
    segments_in_copy: &HashSet<u64>,
) -> CopyChoice {
    let mut out = CopyChoice::default();
    let mut kept: Vec<&Backup> = Vec::new();
    for d in &plan.backups {
        let id = d.backup.id.as_str();
        if in_copy.contains(id) || d.backup.phase != Phase::Completed {
            continue;
        }
        let wanted =
            d.action != Action::Delete && !d.backup.payload_missing && !d.backup.newer_format;
        if wanted {
            kept.push(&d.backup);
        } else {
            let why = if d.backup.newer_format {
                vec![crate::reason::Reason::NewerFormat]
            } else if d.backup.payload_missing {
                vec![crate::reason::Reason::Broken]
            } else {
                d.reasons
                    .iter()
                    .filter(|r| r.kind() == crate::reason::ReasonKind::Delete)
                    .cloned()
                    .collect()
            };
            out.declined.push(d.backup.id.clone());
            out.declined_why.insert(d.backup.id.clone(), why);
        }
    }
    // Parents first: by start, and an increment after its parent whatever the clocks say.
    kept.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
    let sending: HashSet<&str> = kept.iter().map(|b| b.id.as_str()).collect();
    let mut placed: HashSet<String> = HashSet::new();
    let mut pending = kept;
    while !pending.is_empty() {
        let before = pending.len();
        pending.retain(|b| {
            let ready = match &b.kind {
                BackupKind::Full => true,
                BackupKind::Incremental(parent) => {
                    placed.contains(parent)
                        || (in_copy.contains(parent) && !sending.contains(parent.as_str()))
                }
            };
            if ready {
                placed.insert(b.id.clone());
                out.backups.push(b.id.clone());
            }
            !ready
        });
        if pending.len() == before {
            // A chain whose parent is neither in the copy nor sent: cannot land whole.
            for b in &pending {
                out.declined.push(b.id.clone());
                out.declined_why
                    .insert(b.id.clone(), vec![crate::reason::Reason::Broken]);
            }
            break;
        }
    }
    let deleted: HashSet<u64> = plan.segments.delete.iter().map(|d| d.sequence).collect();
    let mut segs: Vec<&Segment> = union
        .segments
        .iter()
        .filter(|s| s.indexed && s.present && !s.summary && !segments_in_copy.contains(&s.sequence))
        .collect();
    segs.sort_by_key(|s| s.sequence);
    for s in segs {
        if deleted.contains(&s.sequence) {
            out.declined_segments.push(s.sequence);
        } else {
            out.segments.push(s.sequence);
        }
    }
    out.declined.sort();
    out.declined.dedup();
    out
}

/// The segment floor after a pass: per timeline, the highest sequence through which every
/// indexed segment of the source was sent (or is in the copy) or declined, the first
/// sequence the source indexed, and the runs of sequences between them the source's index
/// did not hold (a segment indexed later below the floor — an archiver filling a hole, or
/// reaching further back — is still awaited). `failed` are the sequences that could not be
/// sent this time; the floor stops below the first of them.
pub fn segments_through(
    source_segments: impl IntoIterator<Item = u64>,
    failed: &HashSet<u64>,
) -> SegmentFloor {
    let mut by_timeline: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for s in source_segments {
        by_timeline.entry(timeline_of(s)).or_default().push(s);
    }
    let mut out = SegmentFloor::default();
    let mut budget = MAX_MISSING_RUNS;
    for (t, mut seqs) in by_timeline {
        seqs.sort_unstable();
        seqs.dedup();
        let mut through: Option<u64> = None;
        let mut missing: Vec<[u64; 2]> = Vec::new();
        for s in seqs {
            if failed.contains(&s) {
                break;
            }
            if let Some(prev) = through.filter(|&p| s > p + 1) {
                if budget == 0 {
                    // Too many holes to name: the floor stops below this one.
                    break;
                }
                budget -= 1;
                missing.push([prev + 1, s - 1]);
            }
            if through.is_none() {
                out.from.insert(t, s);
            }
            through = Some(s);
        }
        if let Some(th) = through {
            out.through.insert(t, th);
            if !missing.is_empty() {
                out.missing.insert(t, missing);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;
    use crate::plan::plan;
    use jiff::{SignedDuration, Timestamp};

    fn t(h: i64) -> Timestamp {
        "2026-11-01T00:00:00Z".parse::<Timestamp>().unwrap() + SignedDuration::from_hours(h)
    }

    fn full(id: &str, h: i64) -> Backup {
        Backup::completed_full(id, "daily", t(h), t(h) + SignedDuration::from_mins(5), 10)
    }

    fn inc(id: &str, parent: &str, h: i64) -> Backup {
        Backup {
            kind: BackupKind::Incremental(parent.to_owned()),
            ..full(id, h)
        }
    }

    fn id(n: u32) -> String {
        format!("20261101T{n:02}0000Z-0000000{}", n % 10)
    }

    fn window(days: u32) -> Policy {
        crate::policy::PolicyInput {
            window: Some(format!("{days}d")),
            ..Default::default()
        }
        .validate()
        .unwrap()
    }

    #[test]
    fn sends_what_the_copy_keeps_parents_first() {
        let (a, b, c, old) = (id(1), id(2), id(3), id(4));
        let union = Inventory {
            backups: vec![
                inc(&c, &b, 30),
                inc(&b, &a, 20),
                full(&a, 10),
                full(&old, -24 * 40),
            ],
            ..Inventory::default()
        };
        let now = t(40);
        let p = plan(&window(7), &union, now);
        let none = HashSet::new();
        let got = choose(&union, &p, &none, &HashSet::new());
        assert_eq!(got.backups, vec![a.clone(), b.clone(), c.clone()]);
        assert_eq!(got.declined, vec![old.clone()], "outside the copy's window");
        assert_eq!(got.declined_why[&old], vec![crate::Reason::Expired]);
        // The parent in the copy: its increments go.
        let in_copy: HashSet<String> = [a.clone()].into();
        let got = choose(&union, &p, &in_copy, &HashSet::new());
        assert_eq!(got.backups, vec![b.clone(), c.clone()]);
        // An increment whose parent is neither in the copy nor sent cannot land whole.
        let orphan = Inventory {
            backups: vec![inc(&c, &b, 30)],
            ..Inventory::default()
        };
        let p = plan(&window(7), &orphan, now);
        let got = choose(&orphan, &p, &HashSet::new(), &HashSet::new());
        assert!(got.backups.is_empty(), "{got:?}");
        assert_eq!(got.declined, vec![c.clone()]);
        assert_eq!(got.declined_why[&c], vec![crate::reason::Reason::Broken]);
    }

    /// What the copy's own retention deleted, the copy's plan over the union deletes again:
    /// it is not sent back (mutation: sending what the copy lacks whatever its plan says —
    /// the old backup comes back).
    #[test]
    fn what_the_copy_deleted_stays_deleted() {
        let (old, mid, new) = (id(1), id(2), id(3));
        let keep2 = crate::policy::PolicyInput {
            keep_last: Some(2),
            ..Default::default()
        }
        .validate()
        .unwrap();
        // The copy held old and mid, its retention (keepLast 2) deleted old when new came;
        // the source still has all three.
        let copy_now = Inventory {
            backups: vec![full(&mid, 20), full(&new, 30)],
            ..Inventory::default()
        };
        let union = Inventory {
            backups: vec![full(&mid, 20), full(&new, 30), full(&old, 10)],
            ..Inventory::default()
        };
        let p = plan(&keep2, &union, t(40));
        let in_copy: HashSet<String> = copy_now.backups.iter().map(|b| b.id.clone()).collect();
        let got = choose(&union, &p, &in_copy, &HashSet::new());
        assert!(got.backups.is_empty(), "{got:?}");
        assert_eq!(got.declined, vec![old]);
    }

    #[test]
    fn a_copy_that_has_not_received_a_backup_keeps_it_in_the_source() {
        let (a, b) = (id(1), id(2));
        let mut backups = vec![full(&a, -24 * 40), full(&b, 0)];
        let floor = CopyFloor {
            name: "dr".into(),
            handled: [b.clone()].into(),
            ..CopyFloor::default()
        };
        mark_awaiting(&mut backups, std::slice::from_ref(&floor));
        let inv = Inventory {
            backups,
            ..Inventory::default()
        };
        let p = plan(&window(7), &inv, t(1));
        let old = p.backups.iter().find(|d| d.backup.id == a).unwrap();
        assert_eq!(old.action, Action::Keep);
        assert_eq!(old.reasons, vec![crate::Reason::Copy("dr".into())]);
        // Once handled, the source's own rules decide.
        let mut backups = inv.backups.clone();
        let floor = CopyFloor {
            handled: [a.clone(), b].into(),
            ..floor
        };
        mark_awaiting(&mut backups, &[floor]);
        let p = plan(&window(7), &Inventory { backups, ..inv }, t(1));
        let old = p.backups.iter().find(|d| d.backup.id == a).unwrap();
        assert_eq!(old.action, Action::Delete);
    }

    #[test]
    fn segments_wait_for_the_copy_and_the_floor_stops_at_a_failure() {
        let floor = CopyFloor {
            name: "dr".into(),
            segments_through: [(0, 5)].into(),
            ..CopyFloor::default()
        };
        assert!(!floor.awaits_segment(5));
        assert!(floor.awaits_segment(6));
        assert!(floor.awaits_segment(crate::timeline::TIMELINE_STRIDE + 1));
        let got = segments_through(
            [1, 2, 3, 4, crate::timeline::TIMELINE_STRIDE + 7],
            &[3].into(),
        );
        assert_eq!(
            got.through,
            [(0, 2), (1, crate::timeline::TIMELINE_STRIDE + 7)].into()
        );
        assert!(got.missing.is_empty(), "{got:?}");
    }

    /// A hole in the source's index below the floor, or a segment below its first: one
    /// indexed there later (an archiver filling it, or reaching further back) is still
    /// awaited, so the source keeps it for the copy (mutation: `awaits_segment` reading only
    /// `segments_through` — 4 not awaited).
    #[test]
    fn a_segment_indexed_late_below_the_floor_is_still_awaited() {
        let floor_of = |got: SegmentFloor| CopyFloor {
            name: "dr".into(),
            segments_through: got.through,
            segments_missing: got.missing,
            segments_from: got.from,
            ..CopyFloor::default()
        };
        let got = segments_through([3, 5, 6, 9], &HashSet::new());
        assert_eq!(got.through, [(0, 9)].into());
        assert_eq!(got.missing, [(0, vec![[4, 4], [7, 8]])].into());
        assert_eq!(got.from, [(0, 3)].into());
        let floor = floor_of(got);
        assert!(floor.awaits_segment(4) && floor.awaits_segment(8) && floor.awaits_segment(2));
        assert!(!floor.awaits_segment(3) && !floor.awaits_segment(5) && !floor.awaits_segment(9));
        // Too many holes to name: the floor stops below the first one it cannot name.
        let odd: Vec<u64> = (0..=MAX_MISSING_RUNS as u64 + 5)
            .map(|k| 2 * k + 1)
            .collect();
        let got = segments_through(odd.iter().copied(), &HashSet::new());
        let last_named = 2 * MAX_MISSING_RUNS as u64 + 1;
        assert_eq!(got.through, [(0, last_named)].into());
        assert_eq!(got.missing[&0].len(), MAX_MISSING_RUNS);
        let floor = floor_of(got);
        assert!(
            (1..=odd[odd.len() - 1])
                .all(|s| floor.awaits_segment(s) == (s % 2 == 0 || s > last_named))
        );
    }
}
