//! Replay by GTID against an oracle (issue 27): random archives of one server and of a
//! failover (transactions with times, cut into segments, some segments missing, a branch
//! the old primary alone wrote), random backups at GTID positions. For every instant the
//! recovery window promises, the restore the core chooses — the backup, the segments,
//! each run's start and stop — applied as `mariadb-binlog` would (skip what the start
//! position holds, stop at the stop position and at the target's second) gives exactly the
//! main line's transactions up to that instant: none missing, none twice, none from the
//! branch. And an instant the window refuses is one no backup could reach.
//!
//! The mutations that break it (each tried): starting replay one segment later (in
//! `Replay::begin_for`, `Begin::At(i + 1)`: transactions missing), ignoring the stop at a
//! switch (`stop_at` never set: the branch replayed), linking a switch that records
//! missing GTIDs (the window claims instants whose transactions are gone).
//!
//! And a failover never makes the branch it leaves deletable by itself (issue 42 §3): no
//! segment of the old timeline past the switch is planned for deletion unless
//! acknowledged. Mutation tried: `held_branch` always false in `plan` (the branch went
//! with the horizon).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use tidemark_core::gtid::{Gtid, GtidPos, GtidRun};
use tidemark_core::policy::PolicyInput;
use tidemark_core::timeline::timeline_of;
use tidemark_core::timeline::{SegmentGtids, Switch, Timeline, archive_name, archive_sequence};
use tidemark_core::{Backup, Inventory, Segment, choose_restore, plan};

const T0: i64 = 1_763_600_000;

/// One transaction: its number (domain 0), its writer, its commit time (seconds).
#[derive(Debug, Clone, Copy)]
struct Txn {
    seq: u64,
    server: u32,
    at: i64,
}

fn at(t: i64) -> Timestamp {
    Timestamp::from_second(t).unwrap()
}

/// A timeline's segments from transactions cut after each index in `cuts` (sorted).
fn segments_of(
    timeline: u32,
    writer: u32,
    txns: &[Txn],
    start: GtidPos,
    cuts: &[usize],
    missing: &BTreeSet<usize>,
    first_number: u64,
) -> (Vec<Segment>, Vec<(u64, GtidPos)>) {
    let mut out = Vec::new();
    let mut ends = Vec::new();
    let mut pos = start;
    let mut from = 0;
    let mut bounds: Vec<usize> = cuts.iter().copied().filter(|c| *c < txns.len()).collect();
    bounds.push(txns.len());
    bounds.dedup();
    for (k, &to) in bounds.iter().enumerate() {
        if to <= from {
            continue;
        }
        let part = &txns[from..to];
        let number = first_number + k as u64;
        let seq = archive_sequence(timeline, number).unwrap();
        let mut runs: Vec<GtidRun> = Vec::new();
        for t in part {
            match runs.last_mut() {
                Some(r) if r.server == t.server && r.last + 1 == t.seq => r.last = t.seq,
                _ => runs.push(GtidRun {
                    domain: 0,
                    server: t.server,
                    first: t.seq,
                    last: t.seq,
                }),
            }
        }
        let mut s = Segment::new(
            archive_name(&format!("mysql-bin.{number:06}"), timeline).unwrap(),
            seq,
            Some(at(part[0].at)),
            Some(at(part[part.len() - 1].at)),
            1,
        );
        s.gtids = Some(Box::new(SegmentGtids {
            server_id: writer,
            start: pos.clone(),
            runs: runs.clone(),
        }));
        for t in part {
            pos.advance(Gtid::new(0, t.server, t.seq));
        }
        ends.push((seq, pos.clone()));
        if !missing.contains(&k) {
            out.push(s);
        }
        from = to;
    }
    (out, ends)
}

/// What replaying the choice gives: the backup's transactions (of the main line: it was
/// taken there), then each run's segments' transactions after its start, up to its stop
/// and the target's second.
fn replayed(
    all: &[Txn],
    main: &[Txn],
    c: &tidemark_core::RestoreChoice,
    backup: &GtidPos,
    target: Timestamp,
) -> Vec<(u32, u64)> {
    let mut got: Vec<(u32, u64)> = main
        .iter()
        .filter(|t| backup.get(0).is_some_and(|g| t.seq <= g.seq))
        .map(|t| (t.server, t.seq))
        .collect();
    let stop_second = target.as_second() + 1;
    for r in &c.runs {
        let start = r.start_after.clone().unwrap_or_default().seq(0);
        let stop = r.stop_at.as_ref().map_or(u64::MAX, |s| s.seq(0));
        for s in &c.segments[r.first..r.first + r.count] {
            let g = s.gtids.as_ref().unwrap();
            for run in &g.runs {
                for q in run.first..=run.last {
                    if q <= start || q > stop {
                        continue;
                    }
                    let t = all
                        .iter()
                        .find(|t| t.seq == q && t.server == run.server)
                        .unwrap();
                    // mariadb-binlog stops at the first event stamped at or after the stop.
                    if t.at >= stop_second {
                        break;
                    }
                    got.push((t.server, q));
                }
            }
        }
    }
    got
}

/// Gaps between transactions; segment cuts of the old and the new timeline; missing old
/// segments; a failover (after how many, how many lost); backups (at which, how late).
type History = (
    Vec<u64>,
    Vec<usize>,
    Vec<usize>,
    Vec<usize>,
    Option<(usize, usize)>,
    Vec<(usize, i64)>,
);

fn history() -> impl Strategy<Value = History> {
    (
        // Gaps between transactions, seconds.
        prop::collection::vec(1u64..40, 8..40),
        // Cuts after transaction indexes (segment ends), old timeline and new.
        prop::collection::vec(0usize..40, 0..8),
        prop::collection::vec(0usize..40, 0..6),
        // Missing segment indexes (old timeline).
        prop::collection::vec(0usize..8, 0..2),
        // A failover: after how many old transactions the new primary took over, and how
        // many the old primary alone wrote after (a branch).
        prop::option::of((2usize..30, 0usize..4)),
        // Backups: at which transaction (index into the main line), seconds after it.
        prop::collection::vec((0usize..60, 0i64..3), 1..4),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(400)
    ))]

    #[test]
    fn replay_by_gtid_gives_exactly_the_main_line((gaps, cuts_old, cuts_new, missing, failover, backups) in history()) {
        // The main line's transactions, one per gap; with a failover, the old primary's up
        // to the switch (plus its branch), then the new primary's with the next numbers.
        let mut times = Vec::new();
        let mut t = T0;
        for g in &gaps {
            t += *g as i64 * 2;
            times.push(t);
        }
        let n = times.len();
        let (switch_after, lost) = failover.map_or((n, 0), |(s, l)| (s.min(n - 1), l));
        let old: Vec<Txn> = (0..switch_after)
            .map(|i| Txn { seq: i as u64 + 1, server: 1, at: times[i] })
            .collect();
        // The branch: numbers after the switch by server 1, timed between the old and the
        // new primary's writes (an odd second: never on a main-line transaction's).
        let branch: Vec<Txn> = (0..lost)
            .map(|i| Txn {
                seq: switch_after as u64 + 1 + i as u64,
                server: 1,
                at: times[switch_after - 1] + 1,
            })
            .collect();
        let new: Vec<Txn> = (switch_after..n)
            .map(|i| Txn { seq: i as u64 + 1, server: 2, at: times[i] })
            .collect();
        let mut old_archived = old.clone();
        old_archived.extend(branch.iter().copied());
        let missing: BTreeSet<usize> = missing.into_iter().collect();
        let (mut segments, old_ends) = segments_of(0, 1, &old_archived, GtidPos::default(), &cuts_old, &missing, 1);
        let mut timelines = vec![Timeline { server_id: Some(1), ..Timeline::legacy() }];
        let mut main: Vec<Txn> = old.clone();
        // Timeline 0's segments after this one are the branch the failover left.
        let mut branch_after: Option<u64> = None;
        if failover.is_some() && !new.is_empty() {
            // The new primary's binlog: what it replicated from the last segment start the
            // old archive holds at or before the switch, then its own.
            let switch = GtidPos::from_state([Gtid::new(0, 1, switch_after as u64)]);
            let (held_from, start) = old_ends
                .iter()
                .rev()
                .find(|(_, e)| switch.covers(e))
                .map_or((0, GtidPos::default()), |(_, e)| (e.seq(0) as usize, e.clone()));
            let mut replicated: Vec<Txn> = old[held_from.min(old.len())..].to_vec();
            replicated.extend(new.iter().copied());
            let (new_segs, _) = segments_of(1, 2, &replicated, start, &cuts_new, &BTreeSet::new(), 1);
            // As the archiver records it: the parent's segment holding the switch, or — its
            // archive ending before — its last segment, with the GTIDs missing in between.
            let holding = old_ends
                .iter()
                .find(|(_, e)| e.covers(&switch))
                .map(|(s, _)| *s)
                .filter(|p| segments.iter().any(|s| s.sequence == *p));
            let last = segments.last().map(|s| (s.sequence, s.gtids.as_ref().unwrap().end().seq(0)));
            let (parent_sequence, missing_at_switch) = match (holding, last) {
                (Some(p), _) => (Some(p), Vec::new()),
                (None, Some((p, end))) if end < switch_after as u64 => (
                    Some(p),
                    vec![GtidRun { domain: 0, server: 1, first: end + 1, last: switch_after as u64 }],
                ),
                (None, last) => (last.map(|l| l.0), Vec::new()),
            };
            branch_after = parent_sequence;
            timelines.push(Timeline {
                id: 1,
                server_id: Some(2),
                parent: Some(0),
                first_sequence: new_segs.first().map(|s| s.sequence),
                switch: Some(Switch {
                    gtid: switch,
                    at: Some(at(times[switch_after - 1])),
                    parent_sequence,
                    missing: missing_at_switch,
                    unrelated: false,
                }),
                created_at: None,
            });
            segments.extend(new_segs);
            main.extend(new.iter().copied());
        }
        let all: Vec<Txn> = old_archived.iter().chain(&new).copied().collect();
        // Backups on the main line, each holding its transactions up to one of them.
        let inv_backups: Vec<(Backup, GtidPos)> = backups
            .iter()
            .enumerate()
            .map(|(k, (i, after))| {
                let i = (*i).min(main.len() - 1);
                let txn = main[i];
                let completed = txn.at + after.min(&1); // before the next transaction
                let mut b = Backup::completed_full(
                    format!("20251120T{:06}Z-{k:08x}", k),
                    "nightly",
                    at(completed - 1),
                    at(completed),
                    1,
                );
                let g = GtidPos::from_state([Gtid::new(0, txn.server, txn.seq)]);
                b.gtid = Some(g.clone());
                (b, g)
            })
            .collect();
        let inv = Inventory {
            backups: inv_backups.iter().map(|(b, _)| b.clone()).collect(),
            segments,
            timelines,
            ..Default::default()
        };
        // Issue 42 §3: a new timeline never makes a segment deletable by itself. A year on,
        // keeping the newest backup only, no branch segment goes unless acknowledged (then
        // none is held).
        if let Some(after) = branch_after {
            let mut policy = PolicyInput { keep_last: Some(1), ..Default::default() }.validate().unwrap();
            let now = at(t + 365 * 86_400);
            let p = plan(&policy, &inv, now);
            for d in &p.segments.delete {
                prop_assert!(
                    !(timeline_of(d.sequence) == 0 && d.sequence > after),
                    "branch segment {} deleted, unacknowledged", d.name
                );
            }
            policy.branches_acknowledged = Some(now);
            prop_assert_eq!(plan(&policy, &inv, now).segments.kept_branch, 0);
        }
        // Every instant of the window, to the second (and half past), restores exactly.
        let Ok(c0) = choose_restore(&inv, at(main[0].at)) else {
            // No window may start there; take the window from any choice.
            let Some(w) = tidemark_core::standing(&inv).window else { return Ok(()) };
            return check_window(&inv, &all, &main, &inv_backups, w);
        };
        check_window(&inv, &all, &main, &inv_backups, c0.window)?;
    }
}

fn check_window(
    inv: &Inventory,
    all: &[Txn],
    main: &[Txn],
    backups: &[(Backup, GtidPos)],
    w: tidemark_core::RecoveryWindow,
) -> Result<(), TestCaseError> {
    let mut t = w.from;
    while t <= w.to {
        let in_gap = w.gaps.iter().any(|g| g.from < t && t < g.to);
        if !in_gap {
            let c = choose_restore(inv, t).map_err(|e| TestCaseError::fail(format!("{t}: {e}")))?;
            let chosen = c.chain.last().unwrap();
            let g = &backups.iter().find(|(b, _)| b.id == chosen.id).unwrap().1;
            let mut got = replayed(all, main, &c, g, t);
            got.sort_unstable();
            let mut want: Vec<(u32, u64)> = main
                .iter()
                .filter(|x| x.at < t.as_second() + 1)
                .map(|x| (x.server, x.seq))
                .collect();
            want.sort_unstable();
            prop_assert_eq!(
                got,
                want,
                "restore to {} from {} with {:?}",
                t,
                chosen.id,
                c.runs
            );
        }
        t = t.checked_add(SignedDuration::from_millis(500)).unwrap();
    }
    Ok(())
}
