//! Property tests of DESIGN.md §5.4 over random histories and policies. Restorability is
//! recomputed here naively (quadratic, no shared code with the planner) so a bug in the
//! planner's restore model cannot hide itself.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, HashSet};

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use tidemark_core::{
    Action, Backup, BackupKind, Inventory, Phase, Plan, PolicyInput, RetentionDuration, Segment,
    plan,
};

const HOUR: i64 = 3600;

fn base_time() -> Timestamp {
    common::ts("2026-06-01T00:00:00Z")
}

fn at(hours: i64) -> Timestamp {
    base_time() + SignedDuration::from_secs(hours * HOUR)
}

#[derive(Debug, Clone)]
struct Spec {
    start_h: i64,
    parent: Option<usize>,
    phase: u8,
    lock_h: Option<i64>,
    protected: bool,
    ttl_days: Option<u32>,
    newer: bool,
}

fn backup_spec() -> impl Strategy<Value = Spec> {
    (
        0i64..2400,
        prop::option::weighted(0.6, 0usize..64),
        0u8..20,
        prop::option::weighted(0.1, 0i64..3000),
        prop::bool::weighted(0.05),
        prop::option::weighted(0.15, 0u32..60),
        prop::bool::weighted(0.03),
    )
        .prop_map(
            |(start_h, parent, phase, lock_h, protected, ttl_days, newer)| Spec {
                start_h,
                parent,
                phase,
                lock_h,
                protected,
                ttl_days,
                newer,
            },
        )
}

fn build_backups(specs: &[Spec]) -> Vec<Backup> {
    let mut sorted = specs.to_vec();
    sorted.sort_by_key(|s| s.start_h);
    let mut out: Vec<Backup> = Vec::new();
    for (i, s) in sorted.iter().enumerate() {
        let started_at = at(s.start_h);
        let id = format!("b{i:03}");
        // Parents are earlier backups only (as real incrementals are).
        let kind = match s.parent {
            Some(p) if i > 0 => BackupKind::Incremental(format!("b{:03}", p % i)),
            _ => BackupKind::Full,
        };
        let phase = match s.phase {
            0..=15 => Phase::Completed,
            16 | 17 => Phase::Failed,
            18 => Phase::InProgress,
            _ => Phase::Uncommitted,
        };
        let completed_at = match phase {
            Phase::Completed | Phase::Failed => Some(started_at + SignedDuration::from_mins(20)),
            _ => None,
        };
        out.push(Backup {
            id,
            name: "nightly".into(),
            kind,
            phase,
            started_at,
            completed_at,
            last_modified: started_at + SignedDuration::from_mins(20),
            immutable_until: s.lock_h.map(at),
            ttl: s.ttl_days.map(|d| {
                RetentionDuration::new(d, tidemark_core::duration::DurationUnit::Days).unwrap()
            }),
            protected: s.protected,
            newer_format: s.newer,
            interrupted_delete: false,
            log_file: None,
            size: 10,
            consolidated_from: Vec::new(),
            // Mixed methods: some chains can be merged, some cannot.
            consolidatable: s.start_h % 3 != 0,
            payload_missing: false,
            heartbeat_at: None,
        });
    }
    out
}

/// Segments covering [0, 2600] hours in 6-hour pieces, with random holes, unknown last
/// events and unindexed or index-only entries.
fn segments() -> impl Strategy<Value = Vec<Segment>> {
    prop::collection::vec((0u8..40, 0u8..30, 0u8..40), 430..=440).prop_map(|flags| {
        flags
            .into_iter()
            .enumerate()
            .filter(|(_, (hole, _, _))| *hole != 0)
            .map(|(k, (_, unknown, odd))| {
                let k = k as i64;
                Segment {
                    indexed: odd != 1,
                    present: odd != 2,
                    ..Segment::new(
                        format!("mysql-bin.{:06}", k + 1),
                        (k + 1) as u64,
                        Some(at(k * 6)),
                        (unknown != 0).then(|| at(k * 6 + 6)),
                        100,
                    )
                }
            })
            .collect()
    })
}

fn policy() -> impl Strategy<Value = PolicyInput> {
    (
        prop::option::of(0u32..120),
        prop::option::of(0i64..10),
        prop::option::of(0i64..10),
        prop::option::of(0i64..6),
        prop::option::of(0i64..6),
        prop::option::of(0i64..3),
        prop::option::of(0u32..30),
        (any::<bool>(), any::<bool>()),
        prop::option::weighted(0.3, 0i64..8),
        prop::sample::select(vec![
            "UTC",
            "Europe/Paris",
            "Asia/Kolkata",
            "America/New_York",
        ]),
    )
        .prop_map(
            |(w, last, d, wk, m, y, ft, (cover, consolidate), cap, tz)| PolicyInput {
                window: w.map(|n| format!("{n}d")),
                keep_last: last,
                keep_daily: d,
                keep_weekly: wk,
                keep_monthly: m,
                keep_yearly: y,
                failed_backups_ttl: ft.map(|n| format!("{n}d")),
                cover_window: Some(cover && w.is_some()),
                consolidate: Some(consolidate),
                max_deletions_per_pass: cap,
                time_zone: Some(tz.to_owned()),
            },
        )
}

// ------------------------------------------------------------ naive restore model

fn naive_restorable(backups: &[Backup]) -> HashSet<String> {
    let by_id: HashMap<&str, &Backup> = backups.iter().map(|b| (b.id.as_str(), b)).collect();
    backups
        .iter()
        .filter(|b| {
            let mut cur = *b;
            for _ in 0..=backups.len() {
                if cur.phase != Phase::Completed {
                    return false;
                }
                match &cur.kind {
                    BackupKind::Full => return true,
                    BackupKind::Incremental(p) => match by_id.get(p.as_str()) {
                        Some(pb) => cur = pb,
                        None => return false,
                    },
                }
            }
            false
        })
        .map(|b| b.id.clone())
        .collect()
}

/// `[completed, replay end]` of each restorable backup, by a linear scan of the segments.
fn naive_intervals(backups: &[Backup], segments: &[&Segment]) -> Vec<(Timestamp, Timestamp)> {
    let mut segs: Vec<&Segment> = segments.iter().copied().filter(|s| s.present).collect();
    segs.sort_by_key(|s| s.sequence);
    let ok = naive_restorable(backups);
    backups
        .iter()
        .filter(|b| ok.contains(&b.id))
        .map(|b| {
            let c = b.completed_at.unwrap();
            let mut end = c;
            if let Some(start) = segs
                .iter()
                .position(|s| s.last_event_at.is_some_and(|l| l >= c))
                .filter(|&k| {
                    segs[k].first_event_at.is_some_and(|f| f <= c)
                        || (k > 0 && segs[k - 1].sequence + 1 == segs[k].sequence)
                })
            {
                let mut prev = segs[start].sequence - 1;
                for s in &segs[start..] {
                    if s.sequence != prev + 1 {
                        break;
                    }
                    prev = s.sequence;
                    if let Some(l) = s.last_event_at {
                        end = end.max(l);
                    }
                }
            }
            (c, end)
        })
        .collect()
}

/// Every decision, compactly, for failure messages.
fn dump(p: &Plan) -> Vec<String> {
    p.backups
        .iter()
        .map(|d| {
            let reasons: Vec<String> = d.reasons.iter().map(ToString::to_string).collect();
            format!(
                "{} parent={:?} {:?} completed={:?} {:?} [{}]",
                d.backup.id,
                d.backup.kind.parent(),
                d.backup.phase,
                d.backup.completed_at.map(|c| c.to_string()),
                d.action,
                reasons.join(", ")
            )
        })
        .collect()
}

fn covered(intervals: &[(Timestamp, Timestamp)], t: Timestamp) -> bool {
    intervals.iter().any(|(a, b)| *a <= t && t <= *b)
}

fn kept<'a>(inv: &'a Inventory, p: &Plan) -> (Vec<Backup>, Vec<&'a Segment>) {
    let deleted: HashSet<&str> = p.deletions().map(|d| d.backup.id.as_str()).collect();
    let gone: HashSet<&str> = p.segments.delete.iter().map(|d| d.name.as_str()).collect();
    (
        inv.backups
            .iter()
            .filter(|b| !deleted.contains(b.id.as_str()))
            .cloned()
            .collect(),
        inv.segments
            .iter()
            .filter(|s| !gone.contains(s.name.as_str()))
            .collect(),
    )
}

/// The index cut into shards of `size` entries (by sequence), as the store keeps it; each
/// shard that qualifies for a summary (contiguous, present, times known and growing) is
/// replaced by one. Returns the summarised inventory and each summary's segments.
fn summarise(inv: &Inventory, size: usize) -> (Inventory, HashMap<u64, Vec<Segment>>) {
    let mut indexed: Vec<&Segment> = inv.segments.iter().filter(|s| s.indexed).collect();
    indexed.sort_by_key(|s| s.sequence);
    let mut out = Inventory {
        backups: inv.backups.clone(),
        segments: inv
            .segments
            .iter()
            .filter(|s| !s.indexed)
            .cloned()
            .collect(),
        ..Default::default()
    };
    let mut members = HashMap::new();
    for chunk in indexed.chunks(size) {
        let ordered = chunk.iter().all(|s| {
            s.present
                && s.first_event_at.is_some()
                && s.last_event_at.is_some()
                && s.first_event_at <= s.last_event_at
        }) && chunk.windows(2).all(|w| {
            w[1].sequence == w[0].sequence + 1 && w[0].last_event_at <= w[1].first_event_at
        });
        if !ordered {
            out.segments.extend(chunk.iter().map(|s| (*s).clone()));
            continue;
        }
        let (first, last) = (chunk[0], chunk[chunk.len() - 1]);
        out.segments.push(Segment {
            span: chunk.len() as u64,
            summary: true,
            ..Segment::new(
                first.name.clone(),
                first.sequence,
                first.first_event_at,
                last.last_event_at,
                chunk.iter().map(|s| s.size).sum(),
            )
        });
        members.insert(first.sequence, chunk.iter().map(|s| (*s).clone()).collect());
    }
    (out, members)
}

/// Plans over summaries the way the store does — read the shards a plan's horizon
/// reaches, plan again — and checks the result is the plan of the fully read index.
fn check_summaries_plan_like_the_full_index(
    inv: &Inventory,
    policy: &tidemark_core::Policy,
    now: Timestamp,
    full: &Plan,
    shard_size: usize,
) -> Result<(), TestCaseError> {
    let (mut summarised, mut members) = summarise(inv, shard_size);
    let mut p = plan(policy, &summarised, now);
    loop {
        let read: Vec<u64> = p
            .summaries_to_read(&summarised.segments)
            .iter()
            .map(|s| s.sequence)
            .collect();
        if read.is_empty() {
            break;
        }
        summarised
            .segments
            .retain(|s| !(s.summary && read.contains(&s.sequence)));
        for seq in read {
            summarised.segments.extend(members.remove(&seq).unwrap());
        }
        p = plan(policy, &summarised, now);
    }
    prop_assert_eq!(&p.backups, &full.backups);
    prop_assert_eq!(p.horizon, full.horizon);
    prop_assert_eq!(&p.recovery_window, &full.recovery_window);
    prop_assert_eq!(&p.segments, &full.segments);
    Ok(())
}

fn check_invariants(
    inv: &Inventory,
    input: &PolicyInput,
    now: Timestamp,
    shard_size: usize,
) -> Result<(), TestCaseError> {
    let policy = match input.validate() {
        Ok(p) => p,
        Err(_) => return Ok(()),
    };
    let p = plan(&policy, inv, now);
    let by_id: HashMap<&str, &Backup> = inv.backups.iter().map(|b| (b.id.as_str(), b)).collect();
    let action: HashMap<&str, Action> = p
        .backups
        .iter()
        .map(|d| (d.backup.id.as_str(), d.action))
        .collect();
    prop_assert_eq!(p.backups.len(), inv.backups.len());

    // Every decision carries reasons; deletions exactly one delete reason.
    for d in &p.backups {
        prop_assert!(!d.reasons.is_empty(), "{} has no reason", d.backup.id);
        // `consolidate` keeps a backup until its synthetic full is committed.
        let keep = d.action != Action::Delete;
        prop_assert!(d.reasons.iter().all(|r| r.is_keep() == keep), "{:?}", d);
    }

    // 1. The newest successful backup, and its chain, is never deleted.
    if let Some(newest) = inv
        .backups
        .iter()
        .filter(|b| b.phase == Phase::Completed)
        .max_by_key(|b| (b.completed_at, &b.id))
    {
        let mut cur = Some(newest);
        while let Some(b) = cur {
            prop_assert_ne!(
                action[b.id.as_str()],
                Action::Delete,
                "floor chain {}",
                b.id
            );
            cur = b.kind.parent().and_then(|p| by_id.get(p.as_str()).copied());
        }
    }

    // 2. Every retained successful incremental keeps its whole (present) chain.
    let (after_backups, after_segments) = kept(inv, &p);
    for b in &after_backups {
        if b.phase != Phase::Completed {
            continue;
        }
        let mut cur = b;
        for _ in 0..inv.backups.len() {
            let Some(parent) = cur.kind.parent().and_then(|p| by_id.get(p.as_str())) else {
                break;
            };
            prop_assert_ne!(
                action[parent.id.as_str()],
                Action::Delete,
                "{} needs {}: {:?}",
                b.id,
                parent.id,
                dump(&p)
            );
            cur = parent;
        }
    }

    // 4. Nothing locked, protected, in progress or of a newer format is deleted.
    for d in p.deletions() {
        let b = &d.backup;
        prop_assert!(
            b.immutable_until.is_none_or(|u| u <= now),
            "locked {}",
            b.id
        );
        prop_assert!(
            !b.protected && !b.newer_format && b.phase != Phase::InProgress,
            "{}",
            b.id
        );
    }
    // Segments: only behind the horizon; an indexed segment with unknown last event stays.
    for s in &p.segments.delete {
        let seg = inv.segments.iter().find(|x| x.name == s.name).unwrap();
        if seg.indexed {
            prop_assert!(
                seg.last_event_at.is_some()
                    && Some(seg.last_event_at.unwrap()) < p.horizon.map(Some).unwrap_or(None)
            );
        }
    }
    if policy.max_deletions_per_pass > 0 {
        prop_assert!(p.deletions().count() <= policy.max_deletions_per_pass as usize);
    }

    // 3. No gap inside the retained range.
    let all_segments: Vec<&Segment> = inv.segments.iter().collect();
    let before = naive_intervals(&inv.backups, &all_segments);
    let after = naive_intervals(&after_backups, &after_segments);
    let t_end = before.iter().filter(|(a, b)| b > a).map(|(_, b)| *b).max();
    let t0 = after.iter().map(|(a, _)| *a).min();
    let mut probes: Vec<Timestamp> = before
        .iter()
        .flat_map(|(a, b)| {
            [
                *a,
                *b,
                *a + SignedDuration::from_secs(1),
                *b - SignedDuration::from_secs(1),
            ]
        })
        .collect();
    for s in &inv.segments {
        probes.extend(s.last_event_at);
        probes.extend(s.first_event_at);
    }
    if let (Some(t0), Some(t_end)) = (t0, t_end) {
        for &t in &probes {
            if t > t0 && t <= t_end && before.iter().any(|(a, b)| b > a && *a < t && t <= *b) {
                prop_assert!(
                    covered(&after, t),
                    "instant {t} lost (window {t0}..{t_end}); before {:?}; after {:?}; decisions {:?}; segs {:?}",
                    before
                        .iter()
                        .filter(|(a, b)| *a < t && t <= *b)
                        .collect::<Vec<_>>(),
                    after,
                    dump(&p),
                    inv.segments
                        .iter()
                        .filter(|s| s
                            .last_event_at
                            .is_none_or(|l| l >= t0 - SignedDuration::from_hours(48)
                                && l <= t + SignedDuration::from_hours(48)))
                        .map(|s| (
                            s.sequence,
                            s.first_event_at.map(|x| x.to_string()),
                            s.last_event_at.map(|x| x.to_string()),
                            s.indexed,
                            s.present
                        ))
                        .collect::<Vec<_>>(),
                );
            }
        }
    }
    // With coverWindow, every restorable instant of [now - window, now] stays restorable.
    if policy.cover_window
        && let Some(w) = policy.window
    {
        // A backup deleted by its own expired `ttl` takes its restore point with it (the
        // user asked for that); instants reached by replay stay protected by the gap rule.
        let ttl_expired: HashSet<&str> = p
            .deletions()
            .filter(|d| d.reasons == [tidemark_core::Reason::TtlExpired])
            .map(|d| d.backup.id.as_str())
            .collect();
        let others: Vec<Backup> = inv
            .backups
            .iter()
            .filter(|b| !ttl_expired.contains(b.id.as_str()))
            .cloned()
            .collect();
        let before_cover = naive_intervals(&others, &all_segments);
        let from = w.before(now);
        for &t in &probes {
            if t >= from && t <= now && covered(&before_cover, t) {
                prop_assert!(
                    covered(&after, t),
                    "window instant {t} lost; {:?}",
                    dump(&p)
                );
            }
        }
    }

    // 7. Carrying out the consolidations opens no hole and strands no increment: each
    // target is replaced by a full with its times, its merged ancestors are deleted.
    let mut merged: HashMap<&str, &str> = HashMap::new();
    let mut targets: Vec<&Backup> = Vec::new();
    for d in p.backups.iter().filter(|d| d.action == Action::Consolidate) {
        match d.reasons.as_slice() {
            [tidemark_core::Reason::ConsolidateInto(t)] => {
                merged.insert(d.backup.id.as_str(), t.as_str());
            }
            _ => targets.push(&d.backup),
        }
    }
    prop_assert_eq!(
        merged.values().collect::<HashSet<_>>().len(),
        targets.len(),
        "every merge names a target: {:?}",
        dump(&p)
    );
    if !targets.is_empty() {
        let synthetic = |id: &str| format!("{id}-s");
        let mut next: Vec<Backup> = after_backups
            .iter()
            .filter(|b| !merged.contains_key(b.id.as_str()))
            .cloned()
            .collect();
        for t in &targets {
            prop_assert!(t.consolidatable && t.phase == Phase::Completed);
            next.retain(|b| b.id != t.id);
            next.push(Backup {
                id: synthetic(&t.id),
                kind: BackupKind::Full,
                ..(*t).clone()
            });
        }
        for b in &mut next {
            // A failed attempt is never part of a chain (seed 002).
            if b.phase == Phase::Failed {
                continue;
            }
            if let BackupKind::Incremental(parent) = &b.kind {
                prop_assert!(
                    !merged.contains_key(parent.as_str()),
                    "{} builds on merged {parent}: {:?}",
                    b.id,
                    dump(&p)
                );
                if targets.iter().any(|t| t.id == *parent) {
                    b.kind = BackupKind::Incremental(synthetic(parent));
                }
            }
        }
        let consolidated = naive_intervals(&next, &after_segments);
        let t_end = after.iter().filter(|(a, b)| b > a).map(|(_, b)| *b).max();
        let t0 = consolidated.iter().map(|(a, _)| *a).min();
        if let (Some(t0), Some(t_end)) = (t0, t_end) {
            for &t in &probes {
                // As in 3: instants reached by replay (a backup's own restore point is the
                // policy's to keep or not).
                if t > t0 && t <= t_end && after.iter().any(|(a, b)| b > a && *a < t && t <= *b) {
                    prop_assert!(
                        covered(&consolidated, t),
                        "consolidation loses {t}: {:?}",
                        dump(&p)
                    );
                }
            }
        }
        // The store after a crash between the commit of the fulls and the deletions: the
        // next pass deletes the replaced targets, and no chain holds a merged ancestor any
        // more (a rule may still keep one: this pass's deletions free keepLast places).
        let mut crashed = inv.clone();
        crashed
            .backups
            .retain(|b| !p.deletions().any(|d| d.backup.id == b.id));
        for t in &targets {
            let mut line = vec![t.id.clone()];
            let mut cur = t.kind.parent().cloned();
            while let Some(id) = cur {
                cur = by_id
                    .get(id.as_str())
                    .and_then(|b| b.kind.parent().cloned());
                line.push(id);
            }
            line.reverse();
            crashed.backups.push(Backup {
                id: synthetic(&t.id),
                kind: BackupKind::Full,
                consolidated_from: line,
                ..(*t).clone()
            });
        }
        let p2 = plan(&policy, &crashed, now);
        // (With a deletion cap, a replaced target may be deferred, holding its line.)
        for d in p2
            .backups
            .iter()
            .filter(|_| policy.max_deletions_per_pass == 0)
        {
            let id = d.backup.id.as_str();
            if targets.iter().any(|t| t.id == id) {
                prop_assert_eq!(
                    &d.reasons,
                    &vec![tidemark_core::Reason::Consolidated(synthetic(id))],
                    "{} after the commit: {:?}",
                    id,
                    dump(&p2)
                );
            }
            if merged.contains_key(id) {
                prop_assert!(
                    !d.reasons
                        .iter()
                        .any(|r| matches!(r, tidemark_core::Reason::Chain(_))),
                    "{} after the commit: {:?}",
                    id,
                    dump(&p2)
                );
            }
        }
    }

    // 8. A restore to any instant of the window (outside its gaps) finds a chain and the
    // contiguous segments up to it; any other instant is refused.
    let standing = tidemark_core::standing(inv);
    // About 40 probes a case: each restore choice reads the whole inventory.
    for &t in probes.iter().step_by((probes.len() / 40).max(1)) {
        let inside = standing.window.as_ref().is_some_and(|w| {
            w.from <= t && t <= w.to && !w.gaps.iter().any(|g| g.from < t && t < g.to)
        });
        match tidemark_core::choose_restore(inv, t) {
            Ok(c) => {
                prop_assert!(
                    inside,
                    "restore to {t} outside the window: {:?}",
                    standing.window
                );
                let last = c.chain.last().unwrap();
                prop_assert!(last.restore_point() <= t);
                prop_assert_eq!(&c.chain[0].kind, &BackupKind::Full);
                prop_assert!(c.chain.iter().all(|b| b.phase == Phase::Completed));
                prop_assert!(standing.restorable.contains(&last.id));
                for w in c.segments.windows(2) {
                    prop_assert_eq!(w[1].sequence, w[0].last_sequence() + 1);
                }
                prop_assert!(c.segments.iter().all(|s| s.present));
                if t > last.restore_point() {
                    prop_assert!(!c.segments.is_empty(), "replay to {t} needs segments");
                }
            }
            Err(e) => prop_assert!(!inside, "{t} is inside the window but refused: {e}"),
        }
    }

    // 5. Deterministic whatever the listing order.
    let mut shuffled = inv.clone();
    shuffled.backups.reverse();
    shuffled.segments.reverse();
    let p2 = plan(&policy, &shuffled, now);
    prop_assert_eq!(&p, &p2);

    // 6. Planning over index shard summaries gives the same plan.
    check_summaries_plan_like_the_full_index(inv, &policy, now, &p, shard_size)
}

/// 600 cases by default; `PROPTEST_CASES=N` for a longer hunt.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn planner_invariants(
        specs in prop::collection::vec(backup_spec(), 0..48),
        segs in segments(),
        policy in policy(),
        now_h in 2400i64..3200,
        shard_size in 1usize..48,
    ) {
        let inv = Inventory { backups: build_backups(&specs), segments: segs , ..Default::default() };
        check_invariants(&inv, &policy, at(now_h), shard_size)?;
    }
}
