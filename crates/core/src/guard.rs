//! The breaker on mass deletion (DESIGN.md §5.5, issue 45 §3): a pure judgement of one
//! plan against what the store held before it and what the last pass left, with the
//! acknowledgements given. The caller keeps [`GuardRecord`] between passes (the store's
//! `_state/guard.json`), plans again with the held backups marked `guarded`, and holds the
//! segment deletions when [`Verdict::hold_segments`] says so.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::inventory::BackupId;
use crate::plan::{Action, Plan, RecoveryWindow};
use crate::policy::DeletionGuard;
use crate::reason::Reason;

/// What the guard remembers between passes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuardRecord {
    /// Each held backup, with when a pass first held it: an acknowledgement at or after
    /// that instant releases it.
    #[serde(default)]
    pub held: BTreeMap<BackupId, Timestamp>,
    /// Since when segment deletions have been held: the earliest wave's (what a record
    /// without `segmentWaves` says, for every segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments_held_since: Option<Timestamp>,
    /// Each wave of held segment deletions: per timeline, when a pass first held them and
    /// the newest sequence held then. An acknowledgement at or after `since` releases the
    /// segments up to `throughSequence`; a later wave (newer segments) is held anew.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segment_waves: Vec<SegmentWave>,
    /// Since when the listing has shown far fewer recovery points than the last pass left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listing_short_since: Option<Timestamp>,
    /// What the last executed pass left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<LastPass>,
}

/// One wave of held segment deletions on one timeline: a run of consecutive sequences
/// first held at `since`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentWave {
    pub timeline: u32,
    pub since: Timestamp,
    /// The run's first sequence (absent in a record of the first version: from the
    /// timeline's first).
    #[serde(default)]
    pub first_sequence: u64,
    pub through_sequence: u64,
}

impl GuardRecord {
    /// When the deletion of segment `sequence` was first held, if it was.
    fn segment_held_since(&self, sequence: u64) -> Option<Timestamp> {
        if self.segment_waves.is_empty() {
            return self.segments_held_since;
        }
        let timeline = crate::timeline::timeline_of(sequence);
        self.segment_waves
            .iter()
            .filter(|w| {
                w.timeline == timeline
                    && w.first_sequence <= sequence
                    && sequence <= w.through_sequence
            })
            .map(|w| w.since)
            .min()
    }
}

/// What a pass left in the store, as the next pass compares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastPass {
    pub at: Timestamp,
    /// Restorable backups after it.
    pub restorable: usize,
}

/// Why a pass is held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Trip {
    /// It would delete `deleting` recovery points of `restorable`: more than the threshold
    /// and more than half.
    Count {
        deleting: usize,
        restorable: usize,
        threshold: u32,
    },
    /// It would move the start of a window (`recovery` or `pointInTime`) later by more
    /// than `deletionGuard.window`.
    Window {
        which: &'static str,
        before: Timestamp,
        after: Timestamp,
        bound: String,
    },
    /// The store lists `listed` recovery points where the last pass left `left`: an
    /// emptied bucket, a wrong prefix or a lagging listing — nothing is deleted on its word.
    Listing { listed: usize, left: usize },
}

impl std::fmt::Display for Trip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trip::Count {
                deleting,
                restorable,
                threshold,
            } => write!(
                f,
                "it would delete {deleting} of {restorable} restorable backups (more than deletionGuard.threshold {threshold}, and more than half)"
            ),
            Trip::Window {
                which,
                before,
                after,
                bound,
            } => write!(
                f,
                "it would move the start of the {} window from {before} to {after} (more than deletionGuard.window {bound})",
                if *which == "recovery" {
                    "recovery"
                } else {
                    "point-in-time"
                }
            ),
            Trip::Listing { listed, left } => write!(
                f,
                "the store lists {listed} restorable backups where the last pass left {left} (an emptied bucket, a wrong prefix or a lagging listing?)"
            ),
        }
    }
}

/// The guard's judgement of one plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// Why the pass is held (empty: it is not).
    pub trips: Vec<Trip>,
    /// Backups held, with when they were first held.
    pub held: BTreeMap<BackupId, Timestamp>,
    /// Backups an acknowledgement released.
    pub released: Vec<BackupId>,
    /// Some segment deletion or index change of the pass is held.
    pub hold_segments: bool,
    /// The segment deletions (and index entries to drop) held, by sequence, with when
    /// each was first held.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub held_segments: BTreeMap<u64, Timestamp>,
    /// The segment deletions (by sequence) an acknowledgement released: while the pass is
    /// held, only these go — a segment the judged plan did not show (a listing that
    /// changed since) is not deleted on its word.
    #[serde(skip)]
    pub released_segments: BTreeSet<u64>,
    /// Hold every deletion of the pass (a listing far shorter than the last pass left):
    /// failed and uncommitted attempts and leftovers too — nothing on its word.
    pub hold_all: bool,
    /// An acknowledgement later than now was given: it is ignored (it would release every
    /// wave to come).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub acknowledgement_in_future: bool,
    /// The acknowledgement given (`tidemark.io/allow-deletions-before`,
    /// `--allow-mass-deletion`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acknowledged: Option<Timestamp>,
    /// The instant that releases all of it: the latest `since` held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_with: Option<Timestamp>,
}

impl Verdict {
    pub fn holds(&self) -> bool {
        !self.held.is_empty() || self.hold_segments || self.hold_all
    }

    /// What is held and why, in one sentence (without how to release it).
    pub fn summary(&self) -> String {
        let why: Vec<String> = self.trips.iter().map(ToString::to_string).collect();
        format!(
            "{} backup deletion(s){} held: {}",
            self.held.len(),
            if self.hold_all {
                " and every binlog segment deletion".to_owned()
            } else if self.held_segments.is_empty() {
                String::new()
            } else {
                format!(
                    " and {} binlog segment deletion(s)",
                    self.held_segments.len()
                )
            },
            why.join("; ")
        ) + if self.acknowledgement_in_future {
            "; the acknowledgement given is later than now and is ignored (it would release every wave to come)"
        } else {
            ""
        }
    }

    /// The record to keep after this pass, which leaves `restorable_after` recovery points.
    pub fn record(
        &self,
        now: Timestamp,
        restorable_after: usize,
        before: &GuardRecord,
    ) -> GuardRecord {
        let listing_short = self.trips.iter().any(|t| matches!(t, Trip::Listing { .. }));
        // Each wave: per timeline and first-held instant, runs of consecutive sequences
        // (held_segments is ordered by sequence).
        let mut waves: Vec<SegmentWave> = Vec::new();
        for (q, since) in &self.held_segments {
            let timeline = crate::timeline::timeline_of(*q);
            match waves.iter_mut().find(|w| {
                w.timeline == timeline && w.since == *since && w.through_sequence + 1 == *q
            }) {
                Some(w) => w.through_sequence = *q,
                None => waves.push(SegmentWave {
                    timeline,
                    since: *since,
                    first_sequence: *q,
                    through_sequence: *q,
                }),
            }
        }
        GuardRecord {
            held: self.held.clone(),
            segments_held_since: self.held_segments.values().min().copied(),
            segment_waves: waves,
            listing_short_since: (listing_short && self.holds())
                .then(|| before.listing_short_since.unwrap_or(now)),
            // While the listing is held as short, the last good count stands.
            last: if listing_short && self.holds() {
                before.last.clone()
            } else {
                Some(LastPass {
                    at: now,
                    restorable: restorable_after,
                })
            },
        }
    }
}

/// The fewest restorable backups a last pass must have left for a listing that lacks most
/// of them to hold a pass.
pub const LISTING_FLOOR: usize = 3;

/// Judges `plan`, made over a store in which `restorable_before` backups were restorable
/// and whose recovery window was `window_before`, against the guard's `record` and the
/// acknowledgement `ack` (deletions first held at or before it go ahead; an `ack` later
/// than `now` is ignored).
pub fn assess(
    guard: &DeletionGuard,
    plan: &Plan,
    restorable_before: &HashSet<BackupId>,
    window_before: Option<&RecoveryWindow>,
    record: &GuardRecord,
    ack: Option<Timestamp>,
    now: Timestamp,
) -> Verdict {
    let acknowledgement_in_future = ack.is_some_and(|a| a > now);
    let ack = ack.filter(|a| *a <= now);
    // Recovery points deleted; a chain merged into a synthetic full loses none.
    let deleting: Vec<&BackupId> = plan
        .backups
        .iter()
        .filter(|d| d.action == Action::Delete && restorable_before.contains(&d.backup.id))
        .filter(|d| {
            !d.reasons
                .iter()
                .any(|r| matches!(r, Reason::Consolidated(_)))
        })
        .map(|d| &d.backup.id)
        .collect();
    let mut trips = Vec::new();
    let threshold = guard.threshold as usize;
    let more_than_half = |n: usize, of: usize| n * 2 > of;
    if threshold > 0
        && deleting.len() > threshold
        && more_than_half(deleting.len(), restorable_before.len())
    {
        trips.push(Trip::Count {
            deleting: deleting.len(),
            restorable: restorable_before.len(),
            threshold: guard.threshold,
        });
    }
    if let (Some(bound), Some(before), Some(after)) =
        (guard.window, window_before, plan.recovery_window.as_ref())
    {
        for (which, b, a) in [
            ("recovery", before.from, after.from),
            (
                "pointInTime",
                before.point_in_time_from,
                after.point_in_time_from,
            ),
        ] {
            if bound.after(b) < a {
                trips.push(Trip::Window {
                    which,
                    before: b,
                    after: a,
                    bound: bound.to_string(),
                });
            }
        }
    }
    // Whatever the threshold: a store that lists most of what the last pass left is not
    // believed.
    if let Some(last) = &record.last {
        let listed = restorable_before.len();
        let gone = last.restorable.saturating_sub(listed);
        if last.restorable >= LISTING_FLOOR && more_than_half(gone, last.restorable) {
            trips.push(Trip::Listing {
                listed,
                left: last.restorable,
            });
        }
    }
    let mut verdict = Verdict {
        acknowledged: ack,
        acknowledgement_in_future,
        ..Verdict::default()
    };
    if trips.is_empty() {
        return verdict;
    }
    let released = |since: Timestamp| ack.is_some_and(|a| since <= a);
    // A short listing holds the whole pass until acknowledged: nothing it lacks may be
    // taken for gone.
    let listing_since = record.listing_short_since.unwrap_or(now);
    let listing_held =
        trips.iter().any(|t| matches!(t, Trip::Listing { .. })) && !released(listing_since);
    for id in deleting {
        let since = record.held.get(id).copied().unwrap_or(now);
        if released(since) && !listing_held {
            verdict.released.push(id.clone());
        } else {
            verdict.held.insert(id.clone(), since);
        }
    }
    // Segment deletions, each with the wave that first held it: an acknowledgement
    // releases the waves it covers, never a newer one.
    let segments = plan
        .segments
        .delete
        .iter()
        .map(|d| d.sequence)
        .chain(plan.segments.drop_from_index.iter().map(|e| e.sequence));
    for q in segments {
        let since = record.segment_held_since(q).unwrap_or(now);
        if listing_held || !released(since) {
            verdict.held_segments.insert(q, since);
        } else {
            verdict.released_segments.insert(q);
        }
    }
    verdict.hold_segments = listing_held || !verdict.held_segments.is_empty();
    verdict.hold_all = listing_held;
    if listing_held {
        // Every deletion, of any phase.
        for d in plan.backups.iter().filter(|d| d.action == Action::Delete) {
            verdict
                .held
                .entry(d.backup.id.clone())
                .or_insert_with(|| record.held.get(&d.backup.id).copied().unwrap_or(now));
        }
    }
    let mut sinces: Vec<Timestamp> = verdict.held.values().copied().collect();
    sinces.extend(verdict.held_segments.values().copied());
    if listing_held {
        sinces.push(listing_since);
    }
    verdict.release_with = sinces.into_iter().max();
    verdict.trips = trips;
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{Backup, Inventory};
    use crate::policy::PolicyInput;

    fn at(h: i64) -> Timestamp {
        Timestamp::from_second(1_790_000_000 + h * 3600).unwrap()
    }

    fn daily(n: i64) -> Inventory {
        Inventory {
            backups: (0..n)
                .map(|d| {
                    Backup::completed_full(
                        format!("b{d:03}"),
                        "nightly",
                        at(24 * d),
                        at(24 * d + 1),
                        10,
                    )
                })
                .collect(),
            ..Inventory::default()
        }
    }

    fn plan_of(keep_last: i64, inv: &Inventory, now: Timestamp) -> (Plan, HashSet<BackupId>) {
        let policy = PolicyInput {
            keep_last: Some(keep_last),
            ..Default::default()
        }
        .validate()
        .unwrap();
        let p = crate::plan::plan(&policy, inv, now);
        (p, crate::plan::standing(inv).restorable)
    }

    #[test]
    fn a_wave_is_held_until_acknowledged_and_the_next_wave_again() {
        let guard = DeletionGuard::default();
        let inv = daily(30);
        let now = at(24 * 30);
        let (p, before) = plan_of(3, &inv, now);
        let v = assess(
            &guard,
            &p,
            &before,
            None,
            &GuardRecord::default(),
            None,
            now,
        );
        assert_eq!(v.held.len(), 27, "{v:?}");
        assert!(matches!(
            v.trips[0],
            Trip::Count {
                deleting: 27,
                restorable: 30,
                ..
            }
        ));
        assert_eq!(v.release_with, Some(now));
        let record = v.record(now, 30, &GuardRecord::default());
        // An acknowledgement from before the wave was held releases nothing.
        let later = now + jiff::SignedDuration::from_hours(1);
        let early = assess(
            &guard,
            &p,
            &before,
            None,
            &record,
            Some(now - jiff::SignedDuration::from_secs(1)),
            later,
        );
        assert_eq!(early.held.len(), 27);
        // One in the future releases nothing (it would release every wave to come).
        let future = assess(
            &guard,
            &p,
            &before,
            None,
            &record,
            Some(later + jiff::SignedDuration::from_hours(24)),
            later,
        );
        assert_eq!(future.held.len(), 27);
        assert!(future.acknowledgement_in_future && future.summary().contains("ignored"));
        // One at or after it releases that wave.
        let ok = assess(&guard, &p, &before, None, &record, Some(now), later);
        assert!(!ok.holds(), "{ok:?}");
        assert_eq!(ok.released.len(), 27);
        // A new wave planned after the acknowledgement is held again.
        let inv2 = daily(60);
        let (p2, before2) = plan_of(3, &inv2, at(24 * 60));
        let record2 = ok.record(later, 3, &record);
        let again = assess(
            &guard,
            &p2,
            &before2,
            None,
            &record2,
            Some(now),
            at(24 * 60),
        );
        assert!(again.holds());
        assert!(again.released.is_empty(), "{again:?}");
    }

    /// The review's finding: one instant covered every wave of segment deletions while
    /// any hold went on. Each segment now keeps the wave that first held it: the
    /// acknowledgement of the first wave releases its segments only, and the segments a
    /// later pass would delete past them are held anew.
    #[test]
    fn an_acknowledgement_releases_its_wave_of_segments_only() {
        use crate::plan::{SegmentDeletion, SegmentReason};
        let guard = DeletionGuard::default();
        let inv = daily(30);
        let now = at(24 * 30);
        let segments = |n: u64| -> Vec<SegmentDeletion> {
            (1..=n)
                .map(|q| SegmentDeletion {
                    name: format!("mysql-bin.{q:06}"),
                    sequence: q,
                    size: 1,
                    reason: SegmentReason::BehindHorizon,
                })
                .collect()
        };
        let (mut p, before) = plan_of(3, &inv, now);
        p.segments.delete = segments(5);
        let first = assess(
            &guard,
            &p,
            &before,
            None,
            &GuardRecord::default(),
            None,
            now,
        );
        assert_eq!(first.held_segments.len(), 5);
        assert!(
            first.summary().contains("and 5 binlog segment deletion(s)"),
            "{}",
            first.summary()
        );
        let record = first.record(now, 30, &GuardRecord::default());
        assert_eq!(
            record.segment_waves,
            [SegmentWave {
                timeline: 0,
                since: now,
                first_sequence: 1,
                through_sequence: 5
            }]
        );
        // Still held an hour later, the pass would delete three segments more.
        let later = now + jiff::SignedDuration::from_hours(1);
        p.segments.delete = segments(8);
        let second = assess(&guard, &p, &before, None, &record, None, later);
        assert_eq!(second.held_segments[&5], now);
        assert_eq!(second.held_segments[&6], later);
        assert_eq!(second.release_with, Some(later));
        let record = second.record(later, 30, &record);
        // The first wave's acknowledgement releases segments 1–5, not 6–8.
        let acked = assess(&guard, &p, &before, None, &record, Some(now), later);
        assert_eq!(
            acked.held_segments.keys().copied().collect::<Vec<_>>(),
            [6, 7, 8],
            "{acked:?}"
        );
        let mut applied = p.clone();
        applied
            .segments
            .delete
            .retain(|d| !acked.held_segments.contains_key(&d.sequence));
        assert_eq!(applied.segments.delete.len(), 5);
        // A wave covers the segments it held, not older ones that became deletable later
        // (a copy caught up, a branch acknowledged): those are held anew.
        let mut p3 = p.clone();
        p3.segments.delete = segments(5);
        let narrow = GuardRecord {
            held: record.held.clone(),
            segment_waves: vec![SegmentWave {
                timeline: 0,
                since: now,
                first_sequence: 3,
                through_sequence: 5,
            }],
            ..GuardRecord::default()
        };
        let v = assess(&guard, &p3, &before, None, &narrow, Some(now), later);
        assert_eq!(v.held_segments.keys().copied().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(
            v.released_segments.iter().copied().collect::<Vec<_>>(),
            [3, 4, 5]
        );
        // A record written before the waves (one instant for every segment) still reads.
        let legacy = GuardRecord {
            segments_held_since: Some(now),
            ..GuardRecord::default()
        };
        let old = assess(&guard, &p, &before, None, &legacy, Some(now), later);
        assert!(old.held_segments.is_empty(), "{old:?}");
    }

    #[test]
    fn small_passes_and_a_zero_threshold_are_not_held() {
        let inv = daily(12);
        let now = at(24 * 12);
        let (p, before) = plan_of(10, &inv, now);
        let v = assess(
            &DeletionGuard::default(),
            &p,
            &before,
            None,
            &GuardRecord::default(),
            None,
            now,
        );
        assert!(!v.holds());
        let (p, before) = plan_of(1, &inv, now);
        let off = DeletionGuard {
            threshold: 0,
            window: None,
        };
        assert!(!assess(&off, &p, &before, None, &GuardRecord::default(), None, now).holds());
        // Eleven of twelve: more than ten and more than half.
        assert!(
            assess(
                &DeletionGuard::default(),
                &p,
                &before,
                None,
                &GuardRecord::default(),
                None,
                now
            )
            .holds()
        );
    }

    #[test]
    fn a_listing_far_shorter_than_the_last_pass_left_holds_everything() {
        let inv = daily(3);
        let now = at(24 * 40);
        let (p, before) = plan_of(1, &inv, now);
        let record = GuardRecord {
            last: Some(LastPass {
                at: now,
                restorable: 40,
            }),
            ..GuardRecord::default()
        };
        let v = assess(
            &DeletionGuard::default(),
            &p,
            &before,
            None,
            &record,
            None,
            now,
        );
        assert!(v.hold_segments && v.held.len() == 2, "{v:?}");
        assert!(matches!(
            v.trips[0],
            Trip::Listing {
                listed: 3,
                left: 40
            }
        ));
        // The last good count stands while held; an acknowledgement accepts the listing.
        let kept = v.record(now, 1, &record);
        assert_eq!(kept.last, record.last);
        let ok = assess(
            &DeletionGuard::default(),
            &p,
            &before,
            None,
            &kept,
            Some(now),
            now,
        );
        assert!(!ok.holds(), "{ok:?}");
    }
}
