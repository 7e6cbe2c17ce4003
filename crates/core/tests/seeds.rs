//! Table tests: each worked example of seeds 000 and 002, and each rule of DESIGN.md §5.2.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use tidemark_core::{Action, Backup, Inventory, Phase, PolicyInput, Reason, SegmentReason, plan};

/// `(id, action, reasons as strings)` for every backup in the plan, oldest first.
fn decisions(p: &tidemark_core::Plan) -> Vec<(String, Action, Vec<String>)> {
    p.backups
        .iter()
        .map(|d| {
            (
                d.backup.id.clone(),
                d.action,
                d.reasons.iter().map(ToString::to_string).collect(),
            )
        })
        .collect()
}

fn row(id: &str, action: Action, reasons: &[&str]) -> (String, Action, Vec<String>) {
    (
        id.to_owned(),
        action,
        reasons.iter().map(|s| (*s).to_owned()).collect(),
    )
}

use Action::{Consolidate, Delete, Keep};

// ---------------------------------------------------------------- seed 000

#[test]
fn seed000_time_window_expires_old_base_backups() {
    let inv = Inventory {
        backups: vec![
            full("d40", "2026-10-11T02:00:00Z"),
            full("d35", "2026-10-16T02:00:00Z"),
            full("d20", "2026-10-31T02:00:00Z"),
            full("d05", "2026-11-15T02:00:00Z"),
        ],
        segments: vec![],
        ..Default::default()
    };
    let policy = window("30d").validate().unwrap();
    let p = plan(&policy, &inv, ts("2026-11-20T02:00:00Z"));
    assert_eq!(
        decisions(&p),
        vec![
            row("d40", Delete, &["expired"]),
            row("d35", Delete, &["expired"]),
            row("d20", Keep, &["window"]),
            row("d05", Keep, &["window", "floor"]),
        ]
    );
}

#[test]
fn seed000_window_boundary_is_completed_at_not_older_than_now_minus_window() {
    // completedAt = started + 5 min. Exactly now - window is kept; one second older is not.
    let inv = Inventory {
        backups: vec![
            full("edge", "2026-10-21T01:55:00Z"),
            full("older", "2026-10-21T01:54:59Z"),
            full("new", "2026-11-19T01:55:00Z"),
        ],
        segments: vec![],
        ..Default::default()
    };
    let p = plan(
        &window("30d").validate().unwrap(),
        &inv,
        ts("2026-11-20T02:00:00Z"),
    );
    let d = decisions(&p);
    assert_eq!(d[0], row("older", Delete, &["expired"]));
    assert_eq!(d[1], row("edge", Keep, &["window"]));
}

#[test]
fn seed000_newest_backup_is_a_floor_even_outside_the_window() {
    let inv = Inventory {
        backups: vec![
            full("a", "2026-08-01T02:00:00Z"),
            full("b", "2026-09-01T02:00:00Z"),
            full("c", "2026-09-20T02:00:00Z"),
        ],
        segments: vec![],
        ..Default::default()
    };
    let p = plan(
        &window("30d").validate().unwrap(),
        &inv,
        ts("2026-11-20T02:00:00Z"),
    );
    assert_eq!(
        decisions(&p),
        vec![
            row("a", Delete, &["expired"]),
            row("b", Delete, &["expired"]),
            row("c", Keep, &["floor"]),
        ]
    );
}

#[test]
fn seed000_binlog_horizon_is_the_oldest_retained_start_and_unknown_times_are_kept() {
    let inv = Inventory {
        backups: vec![
            full("old", "2026-10-01T02:00:00Z"),
            full("kept", "2026-11-10T02:00:00Z"),
        ],
        segments: vec![
            segment(
                1,
                ts("2026-10-01T00:00:00Z"),
                Some(ts("2026-10-20T00:00:00Z")),
            ),
            segment(2, ts("2026-10-20T00:00:00Z"), None), // "zero" last event: kept
            segment(
                3,
                ts("2026-10-25T00:00:00Z"),
                Some(ts("2026-11-10T01:59:59Z")),
            ),
            segment(
                4,
                ts("2026-11-10T01:59:59Z"),
                Some(ts("2026-11-10T02:00:00Z")),
            ),
            segment(
                5,
                ts("2026-11-10T02:00:00Z"),
                Some(ts("2026-11-19T00:00:00Z")),
            ),
        ],
        ..Default::default()
    };
    let p = plan(
        &window("30d").validate().unwrap(),
        &inv,
        ts("2026-11-20T02:00:00Z"),
    );
    assert_eq!(p.horizon, Some(ts("2026-11-10T02:00:00Z")));
    let deleted: Vec<_> = p.segments.delete.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(deleted, ["mysql-bin.000001", "mysql-bin.000003"]);
    assert!(
        p.segments
            .delete
            .iter()
            .all(|d| d.reason == SegmentReason::BehindHorizon)
    );
    assert_eq!(p.segments.keep, 3);
    assert_eq!(p.segments.kept_unknown_last_event, 1);
    assert!(p.segments.changes_index());
}

#[test]
fn seed000_no_successful_backup_means_no_binlog_is_deleted() {
    let inv = Inventory {
        backups: vec![failed(full("f", "2026-10-01T02:00:00Z"))],
        segments: vec![segment(
            1,
            ts("2026-09-01T00:00:00Z"),
            Some(ts("2026-09-02T00:00:00Z")),
        )],
        ..Default::default()
    };
    let p = plan(
        &window("7d").validate().unwrap(),
        &inv,
        ts("2026-11-20T00:00:00Z"),
    );
    assert_eq!(p.horizon, None);
    assert!(p.segments.delete.is_empty());
    // Without failedBackupsTTL, a failed attempt is retained (retain by default).
    assert_eq!(decisions(&p), vec![row("f", Keep, &["failedBackupsTTL"])]);
}

// ---------------------------------------------------------------- seed 002

#[test]
fn seed002_retain_three_forever_incremental_day_by_day() {
    let days = [
        full("day1", "2026-11-01T02:00:00Z"),
        incr("day2", "day1", "2026-11-02T02:00:00Z"),
        incr("day3", "day2", "2026-11-03T02:00:00Z"),
        incr("day4", "day3", "2026-11-04T02:00:00Z"),
    ];
    let policy = keep_last(3).validate().unwrap();
    let expected: [Vec<_>; 4] = [
        vec![row("day1", Keep, &["keepLast", "floor"])],
        vec![
            row("day1", Keep, &["keepLast", "chain:day2"]),
            row("day2", Keep, &["keepLast", "floor"]),
        ],
        vec![
            row("day1", Keep, &["keepLast", "chain:day2"]),
            row("day2", Keep, &["keepLast", "chain:day3"]),
            row("day3", Keep, &["keepLast", "floor"]),
        ],
        // Day 4: day1 is beyond the count but day2 is built on it: kept for the chain
        // (consolidation into a synthetic full comes with `consolidate: true`).
        vec![
            row("day1", Keep, &["chain:day2"]),
            row("day2", Keep, &["keepLast", "chain:day3"]),
            row("day3", Keep, &["keepLast", "chain:day4"]),
            row("day4", Keep, &["keepLast", "floor"]),
        ],
    ];
    for (day, want) in expected.iter().enumerate() {
        let inv = Inventory {
            backups: days[..=day].to_vec(),
            segments: vec![],
            ..Default::default()
        };
        let p = plan(&policy, &inv, ts("2026-11-05T00:00:00Z"));
        assert_eq!(&decisions(&p), want, "day {}", day + 1);
    }
}

/// Seed 002's synthetic full: with `consolidate: true`, day1 (kept only for day2's chain)
/// is merged with day2 into a full that takes day2's place; once that full is committed,
/// day1 and day2 go, and day3 builds on the full.
#[test]
fn seed002_consolidate_merges_the_chain_only_ancestors_into_a_synthetic_full() {
    let mergeable = |mut b: Backup| {
        b.consolidatable = true;
        b
    };
    let days = vec![
        mergeable(full("day1", "2026-11-01T02:00:00Z")),
        mergeable(incr("day2", "day1", "2026-11-02T02:00:00Z")),
        mergeable(incr("day3", "day2", "2026-11-03T02:00:00Z")),
        mergeable(incr("day4", "day3", "2026-11-04T02:00:00Z")),
    ];
    let policy = PolicyInput {
        consolidate: Some(true),
        ..keep_last(3)
    }
    .validate()
    .unwrap();
    let now = ts("2026-11-05T00:00:00Z");
    let before = plan(
        &policy,
        &Inventory {
            backups: days.clone(),
            segments: vec![],
            ..Default::default()
        },
        now,
    );
    assert_eq!(
        decisions(&before),
        vec![
            row("day1", Consolidate, &["consolidateInto:day2"]),
            row("day2", Consolidate, &["keepLast", "chain:day3"]),
            row("day3", Keep, &["keepLast", "chain:day4"]),
            row("day4", Keep, &["keepLast", "floor"]),
        ]
    );
    assert!(
        before.deletions().next().is_none(),
        "nothing goes before the full exists"
    );

    // The executor committed the synthetic full (day2's times, a new id) and was
    // interrupted before deleting the merged backups: the next pass finishes the job.
    let synthetic = Backup {
        name: "b-day2".into(),
        consolidated_from: vec!["day1".into(), "day2".into()],
        ..mergeable(full("day2s", "2026-11-02T02:00:00Z"))
    };
    let mut after_commit = days.clone();
    after_commit.push(synthetic.clone());
    let after = plan(
        &policy,
        &Inventory {
            backups: after_commit,
            segments: vec![],
            ..Default::default()
        },
        now,
    );
    assert_eq!(
        decisions(&after),
        vec![
            row("day1", Delete, &["expired"]),
            row("day2", Delete, &["consolidated:day2s"]),
            row("day2s", Keep, &["keepLast", "chain:day3"]),
            row("day3", Keep, &["keepLast", "chain:day4"]),
            row("day4", Keep, &["keepLast", "floor"]),
        ]
    );
    // Without consolidate, a committed synthetic full is honoured the same way.
    let plain = keep_last(3).validate().unwrap();
    let mut inv = days.clone();
    inv.push(synthetic);
    let p = plan(
        &plain,
        &Inventory {
            backups: inv,
            segments: vec![],
            ..Default::default()
        },
        now,
    );
    assert_eq!(p.deletions().count(), 2);

    // An ancestor kept for its own sake (here: a hold) stays, and stops the merge above it.
    let mut held = days.clone();
    held[0].protected = true;
    let p = plan(
        &policy,
        &Inventory {
            backups: held,
            segments: vec![],
            ..Default::default()
        },
        now,
    );
    assert_eq!(
        decisions(&p)[..2],
        [
            row("day1", Keep, &["chain:day2", "protected"]),
            row("day2", Keep, &["keepLast", "chain:day3"]),
        ]
    );
    // A restore's hold does the same, under the restore's name.
    let mut held = days.clone();
    held[0].held_for = vec!["db2-from-1003".into()];
    let p = plan(
        &policy,
        &Inventory {
            backups: held,
            segments: vec![],
            ..Default::default()
        },
        now,
    );
    assert_eq!(
        decisions(&p)[..2],
        [
            row("day1", Keep, &["chain:day2", "restore:db2-from-1003"]),
            row("day2", Keep, &["keepLast", "chain:day3"]),
        ]
    );
    // Backups of a method that cannot merge are never consolidated.
    let tar: Vec<Backup> = days
        .iter()
        .map(|b| Backup {
            consolidatable: false,
            ..b.clone()
        })
        .collect();
    let p = plan(
        &policy,
        &Inventory {
            backups: tar,
            segments: vec![],
            ..Default::default()
        },
        now,
    );
    assert!(p.backups.iter().all(|d| d.action == Keep));
}

#[test]
fn seed002_retain_three_with_a_full_after_every_two_backups() {
    let days = [
        full("day1", "2026-11-01T02:00:00Z"),
        incr("day2", "day1", "2026-11-02T02:00:00Z"),
        full("day3", "2026-11-03T02:00:00Z"),
        incr("day4", "day3", "2026-11-04T02:00:00Z"),
        full("day5", "2026-11-05T02:00:00Z"),
    ];
    let policy = keep_last(3).validate().unwrap();
    let now = ts("2026-11-06T00:00:00Z");
    let day4 = plan(
        &policy,
        &Inventory {
            backups: days[..4].to_vec(),
            segments: vec![],
            ..Default::default()
        },
        now,
    );
    assert_eq!(
        decisions(&day4),
        vec![
            row("day1", Keep, &["chain:day2"]),
            row("day2", Keep, &["keepLast"]),
            row("day3", Keep, &["keepLast", "chain:day4"]),
            row("day4", Keep, &["keepLast", "floor"]),
        ]
    );
    let day5 = plan(
        &policy,
        &Inventory {
            backups: days.to_vec(),
            segments: vec![],
            ..Default::default()
        },
        now,
    );
    assert_eq!(
        decisions(&day5),
        vec![
            row("day1", Delete, &["expired"]),
            row("day2", Delete, &["expired"]),
            row("day3", Keep, &["keepLast", "chain:day4"]),
            row("day4", Keep, &["keepLast"]),
            row("day5", Keep, &["keepLast", "floor"]),
        ]
    );
}

#[test]
fn seed002_full_after_every_three_backups_f_i_i() {
    // F ← I ← I  F ← I ← I  F ← I ← I, retain 3: only the last chain survives.
    let mut backups = Vec::new();
    for k in 0..9 {
        let id = format!("b{k}");
        let start = format!("2026-11-{:02}T02:00:00Z", k + 1);
        backups.push(if k % 3 == 0 {
            full(&id, &start)
        } else {
            incr(&id, &format!("b{}", k - 1), &start)
        });
    }
    let p = plan(
        &keep_last(3).validate().unwrap(),
        &Inventory {
            backups,
            segments: vec![],
            ..Default::default()
        },
        ts("2026-11-10T00:00:00Z"),
    );
    let kept: Vec<_> = p
        .backups
        .iter()
        .filter(|d| d.action == Keep)
        .map(|d| d.backup.id.as_str())
        .collect();
    assert_eq!(kept, ["b6", "b7", "b8"]);
}

#[test]
fn seed002_errored_backups_are_not_counted_and_break_no_chain() {
    let backups = vec![
        full("day1", "2026-11-01T02:00:00Z"),
        incr("day2", "day1", "2026-11-02T02:00:00Z"),
        failed(incr("day3", "day2", "2026-11-03T02:00:00Z")),
        // The next backup is taken against the last known good one.
        incr("day4", "day2", "2026-11-04T02:00:00Z"),
    ];
    let policy = PolicyInput {
        keep_last: Some(3),
        failed_backups_ttl: Some("7d".into()),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let inv = Inventory {
        backups,
        segments: vec![],
        ..Default::default()
    };
    let soon = plan(&policy, &inv, ts("2026-11-05T00:00:00Z"));
    assert_eq!(
        decisions(&soon),
        vec![
            row("day1", Keep, &["keepLast", "chain:day2"]),
            row("day2", Keep, &["keepLast", "chain:day4"]),
            row("day3", Keep, &["failedBackupsTTL"]),
            row("day4", Keep, &["keepLast", "floor"]),
        ]
    );
    let later = plan(&policy, &inv, ts("2026-11-20T00:00:00Z"));
    assert_eq!(decisions(&later)[2], row("day3", Delete, &["failed"]));
    // "Older than" 7 days, as a backup's own TTL: exactly 7 days is kept, a second more is not.
    let reached = "7d"
        .parse::<tidemark_core::RetentionDuration>()
        .unwrap()
        .after(inv.backups[2].restore_point());
    let at = plan(&policy, &inv, reached);
    assert_eq!(decisions(&at)[2], row("day3", Keep, &["failedBackupsTTL"]));
    let past = plan(&policy, &inv, reached + jiff::SignedDuration::from_secs(1));
    assert_eq!(decisions(&past)[2], row("day3", Delete, &["failed"]));
}

#[test]
fn seed002_immutable_chain_expires_with_its_last_increment() {
    let mut f1 = full("f1", "2026-11-01T02:00:00Z");
    f1.immutable_until = Some(ts("2026-11-11T00:00:00Z"));
    let mut i2 = incr("i2", "f1", "2026-11-02T02:00:00Z");
    i2.immutable_until = Some(ts("2026-11-12T00:00:00Z"));
    let mut i3 = incr("i3", "i2", "2026-11-03T02:00:00Z");
    i3.immutable_until = Some(ts("2026-11-13T00:00:00Z"));
    let f4 = full("f4", "2026-11-04T02:00:00Z");
    let inv = Inventory {
        backups: vec![f1, i2, i3, f4],
        segments: vec![],
        ..Default::default()
    };
    let policy = keep_last(1).validate().unwrap();

    // Past f1's and i2's own locks, before i3's: the whole chain is still locked.
    let p = plan(&policy, &inv, ts("2026-11-12T12:00:00Z"));
    assert_eq!(
        decisions(&p),
        vec![
            row("f1", Keep, &["chain:i2", "locked:2026-11-13T00:00:00Z"]),
            row("i2", Keep, &["chain:i3", "locked:2026-11-13T00:00:00Z"]),
            row("i3", Keep, &["locked:2026-11-13T00:00:00Z"]),
            row("f4", Keep, &["keepLast", "floor"]),
        ]
    );
    // After the last increment's lock: the chain goes at once.
    let p = plan(&policy, &inv, ts("2026-11-13T00:00:01Z"));
    let deleted: Vec<_> = p.deletions().map(|d| d.backup.id.as_str()).collect();
    assert_eq!(deleted, ["f1", "i2", "i3"]);
}

// ---------------------------------------------------------------- DESIGN §5.2 rules

#[test]
fn gfs_buckets_use_the_policy_time_zone() {
    // 23:30 UTC on the 19th is already the 20th in Europe/Paris (UTC+1 in November).
    let backups = vec![
        full("a", "2026-11-19T20:00:00Z"),
        full("b", "2026-11-19T23:30:00Z"),
        full("c", "2026-11-20T20:00:00Z"),
    ];
    let inv = Inventory {
        backups,
        segments: vec![],
        ..Default::default()
    };
    let now = ts("2026-11-21T00:00:00Z");
    let utc = PolicyInput {
        keep_daily: Some(2),
        ..Default::default()
    };
    let p = plan(&utc.clone().validate().unwrap(), &inv, now);
    assert_eq!(
        decisions(&p),
        vec![
            row("a", Delete, &["expired"]),
            row("b", Keep, &["daily:2026-11-19"]),
            row("c", Keep, &["daily:2026-11-20", "floor"]),
        ]
    );
    let paris = PolicyInput {
        time_zone: Some("Europe/Paris".into()),
        ..utc
    };
    let p = plan(&paris.validate().unwrap(), &inv, now);
    assert_eq!(
        decisions(&p),
        vec![
            row("a", Keep, &["daily:2026-11-19"]),
            row("b", Delete, &["expired"]),
            row("c", Keep, &["daily:2026-11-20", "floor"]),
        ]
    );
}

#[test]
fn gfs_weekly_monthly_yearly_keys() {
    let inv = Inventory {
        backups: vec![
            full("y25", "2025-06-01T00:00:00Z"),
            full("m10", "2026-10-15T00:00:00Z"),
            full("w46", "2026-11-10T00:00:00Z"),
            full("w47", "2026-11-17T00:00:00Z"),
        ],
        segments: vec![],
        ..Default::default()
    };
    let policy = PolicyInput {
        keep_weekly: Some(2),
        keep_monthly: Some(2),
        keep_yearly: Some(2),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let p = plan(&policy, &inv, ts("2026-11-20T00:00:00Z"));
    assert_eq!(
        decisions(&p),
        vec![
            row("y25", Keep, &["yearly:2025"]),
            row("m10", Keep, &["monthly:2026-10"]),
            row("w46", Keep, &["weekly:2026-W46"]),
            row(
                "w47",
                Keep,
                &["weekly:2026-W47", "monthly:2026-11", "yearly:2026", "floor"]
            ),
        ]
    );
}

#[test]
fn cover_window_keeps_the_newest_backup_before_the_window() {
    let inv = Inventory {
        backups: vec![
            full("a", "2026-10-10T00:00:00Z"),
            full("b", "2026-10-15T00:00:00Z"),
            full("c", "2026-11-01T00:00:00Z"),
        ],
        segments: vec![],
        ..Default::default()
    };
    let policy = PolicyInput {
        window: Some("30d".into()),
        cover_window: Some(true),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let p = plan(&policy, &inv, ts("2026-11-20T00:00:00Z"));
    assert_eq!(
        decisions(&p),
        vec![
            row("a", Delete, &["expired"]),
            row("b", Keep, &["coverWindow"]),
            row("c", Keep, &["window", "floor"]),
        ]
    );
}

#[test]
fn per_backup_ttl_overrides_rules_but_not_floor_holds_or_chains() {
    let ttl = |mut b: tidemark_core::Backup| {
        b.ttl = Some("7d".parse().unwrap());
        b
    };
    let mut held = ttl(full("held", "2026-11-01T00:00:00Z"));
    held.protected = true;
    let inv = Inventory {
        backups: vec![
            held,
            ttl(full("base", "2026-11-02T00:00:00Z")),
            incr("inc", "base", "2026-11-03T00:00:00Z"),
            ttl(full("expired", "2026-11-04T00:00:00Z")),
            ttl(full("young", "2026-11-15T00:00:00Z")),
            ttl(full("newest", "2026-11-05T00:00:00Z")),
        ],
        segments: vec![],
        ..Default::default()
    };
    // The window would keep everything; the 7-day TTLs say otherwise.
    let p = plan(
        &window("30d").validate().unwrap(),
        &inv,
        ts("2026-11-20T00:00:00Z"),
    );
    let got = decisions(&p);
    assert_eq!(
        got,
        vec![
            row("held", Keep, &["protected"]),
            row("base", Keep, &["chain:inc"]),
            row("inc", Keep, &["window"]),
            row("expired", Delete, &["ttlExpired"]),
            row("newest", Delete, &["ttlExpired"]),
            row("young", Keep, &["window", "floor", "ttl"]),
        ]
    );
}

#[test]
fn in_progress_newer_format_and_protected_are_never_deleted() {
    let mut running = incr("running", "base", "2026-11-19T00:00:00Z");
    running.phase = Phase::InProgress;
    running.completed_at = None;
    let mut newer = full("newer", "2026-01-02T00:00:00Z");
    newer.newer_format = true;
    let inv = Inventory {
        backups: vec![
            full("base", "2026-01-01T00:00:00Z"),
            newer,
            full("latest", "2026-11-18T00:00:00Z"),
            running,
        ],
        segments: vec![],
        ..Default::default()
    };
    let p = plan(
        &keep_last(1).validate().unwrap(),
        &inv,
        ts("2026-11-20T00:00:00Z"),
    );
    assert_eq!(
        decisions(&p),
        vec![
            row("base", Keep, &["chain:running"]),
            row("newer", Keep, &["newerFormat"]),
            row("latest", Keep, &["keepLast", "floor"]),
            row("running", Keep, &["inProgress"]),
        ]
    );
}

#[test]
fn uncommitted_attempts_age_from_last_modified() {
    let mut stale = full("stale", "2026-11-01T00:00:00Z");
    stale.phase = Phase::Uncommitted;
    stale.completed_at = None;
    let mut fresh = stale.clone();
    fresh.id = "fresh".into();
    fresh.last_modified = ts("2026-11-19T00:00:00Z");
    let mut interrupted = stale.clone();
    interrupted.id = "interrupted".into();
    interrupted.last_modified = ts("2026-11-19T23:00:00Z");
    interrupted.interrupted_delete = true;
    let inv = Inventory {
        backups: vec![
            stale,
            fresh,
            interrupted,
            full("ok", "2026-11-19T00:00:00Z"),
        ],
        segments: vec![],
        ..Default::default()
    };
    let policy = PolicyInput {
        keep_last: Some(1),
        failed_backups_ttl: Some("7d".into()),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let p = plan(&policy, &inv, ts("2026-11-20T00:00:00Z"));
    let got: Vec<_> = decisions(&p)
        .into_iter()
        .map(|(id, a, r)| (id, a, r.join(",")))
        .collect();
    assert!(got.contains(&("stale".into(), Delete, "uncommitted".into())));
    assert!(got.contains(&("fresh".into(), Keep, "failedBackupsTTL".into())));
    assert!(got.contains(&("interrupted".into(), Delete, "interruptedDelete".into())));
}

#[test]
fn max_deletions_defers_descendants_before_ancestors() {
    // Oldest chain a ← a1 ← a2 expires with b; cap 2 takes b whole, then the newest leaf
    // of the chain, so the kept remainder stays a valid chain.
    let inv = Inventory {
        backups: vec![
            full("a", "2026-11-01T00:00:00Z"),
            incr("a1", "a", "2026-11-02T00:00:00Z"),
            incr("a2", "a1", "2026-11-03T00:00:00Z"),
            full("b", "2026-11-04T00:00:00Z"),
            full("c", "2026-11-05T00:00:00Z"),
        ],
        segments: vec![],
        ..Default::default()
    };
    let policy = PolicyInput {
        keep_last: Some(1),
        max_deletions_per_pass: Some(2),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let p = plan(&policy, &inv, ts("2026-11-20T00:00:00Z"));
    assert_eq!(
        decisions(&p),
        vec![
            row("a", Keep, &["chain:a1", "deferred"]),
            row("a1", Keep, &["deferred"]),
            row("a2", Delete, &["expired"]),
            row("b", Delete, &["expired"]),
            row("c", Keep, &["keepLast", "floor"]),
        ]
    );
}

#[test]
fn a_backup_that_bridges_a_hole_in_the_log_archive_is_kept() {
    // Segment 3 is missing: only backup "bridge" (completed inside segment 4) can restore
    // the instants after the hole. keepMonthly keeps "old"; keepLast keeps "new".
    let h = |s: &str| ts(&format!("2026-11-{s}:00Z"));
    let inv = Inventory {
        backups: vec![
            full("old", "2026-11-01T00:00:00Z"),
            full("bridge", "2026-11-03T01:00:00Z"),
            full("mid", "2026-11-03T12:00:00Z"),
            full("new", "2026-11-05T00:00:00Z"),
        ],
        segments: vec![
            segment(1, h("01T00:00"), Some(h("02T00:00"))),
            segment(2, h("02T00:00"), Some(h("03T00:00"))),
            segment(4, h("03T00:10"), Some(h("04T00:00"))),
            segment(5, h("04T00:00"), Some(h("05T06:00"))),
        ],
        ..Default::default()
    };
    let policy = PolicyInput {
        keep_last: Some(1),
        keep_monthly: Some(1),
        keep_yearly: Some(1),
        ..Default::default()
    }
    .validate()
    .unwrap();
    // keepMonthly/Yearly keep "new" only (same month); make "old" kept via protect.
    let mut inv2 = inv.clone();
    inv2.backups[0].protected = true;
    let p = plan(&policy, &inv2, ts("2026-11-20T00:00:00Z"));
    let d = decisions(&p);
    assert_eq!(d[1], row("bridge", Keep, &["gap"]));
    assert_eq!(d[2], row("mid", Delete, &["expired"]));
    assert!(p.recovery_window.as_ref().unwrap().gaps.len() == 1);
    // Without the hole (segment 3 present) "bridge" is not needed.
    let mut inv3 = inv2.clone();
    inv3.segments
        .push(segment(3, h("03T00:00"), Some(h("03T00:10"))));
    let p = plan(&policy, &inv3, ts("2026-11-20T00:00:00Z"));
    assert_eq!(decisions(&p)[1], row("bridge", Delete, &["expired"]));
    let _ = Reason::Gap;
}

// ------------------------------------------------------- defects found by trying to break it

/// Three fulls; the newest one's payload object is gone. It is broken: it counts for no
/// rule (not keepLast, not the floor), so the two good ones are not deleted for it.
#[test]
fn a_committed_backup_whose_payload_is_missing_counts_for_nothing() {
    let mut broken = full("c", "2026-11-19T00:00:00Z");
    broken.payload_missing = true;
    let inv = Inventory {
        backups: vec![
            full("a", "2026-11-17T00:00:00Z"),
            full("b", "2026-11-18T00:00:00Z"),
            broken,
        ],
        ..Default::default()
    };
    let p = plan(
        &keep_last(1).validate().unwrap(),
        &inv,
        ts("2026-11-20T00:00:00Z"),
    );
    assert_eq!(
        decisions(&p),
        vec![
            row("a", Delete, &["expired"]),
            row("b", Keep, &["keepLast", "floor"]),
            row("c", Keep, &["failedBackupsTTL", "broken"]),
        ]
    );
    // An increment on a broken base is broken too; after failedBackupsTTL both go.
    let mut base = full("base", "2026-11-01T00:00:00Z");
    base.payload_missing = true;
    let inv = Inventory {
        backups: vec![
            base,
            incr("inc", "base", "2026-11-02T00:00:00Z"),
            full("good", "2026-11-03T00:00:00Z"),
        ],
        ..Default::default()
    };
    let policy = PolicyInput {
        keep_last: Some(5),
        failed_backups_ttl: Some("7d".into()),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let p = plan(&policy, &inv, ts("2026-11-20T00:00:00Z"));
    assert_eq!(
        decisions(&p),
        vec![
            row("base", Delete, &["broken"]),
            row("inc", Delete, &["broken"]),
            row("good", Keep, &["keepLast", "floor"]),
        ]
    );
}

/// A TTL-expired backup takes no keepLast place: keepLast 2 still keeps two.
#[test]
fn keep_last_skips_ttl_expired_backups_and_ttls_expire_strictly_after() {
    let ttl = |mut b: Backup, t: &str| {
        b.ttl = Some(t.parse().unwrap());
        b
    };
    let inv = Inventory {
        backups: vec![
            full("a", "2026-11-10T00:00:00Z"),
            full("b", "2026-11-12T00:00:00Z"),
            ttl(full("c", "2026-11-13T00:00:00Z"), "1d"),
            // Started exactly 7 days before now: its 7d TTL is reached, not exceeded.
            ttl(full("d", "2026-11-13T12:00:00Z"), "7d"),
        ],
        ..Default::default()
    };
    let p = plan(
        &keep_last(2).validate().unwrap(),
        &inv,
        ts("2026-11-20T12:00:00Z"),
    );
    assert_eq!(
        decisions(&p),
        vec![
            row("a", Delete, &["expired"]),
            row("b", Keep, &["keepLast"]),
            row("c", Delete, &["ttlExpired"]),
            row("d", Keep, &["keepLast", "floor", "ttl"]),
        ]
    );
    // One second later the TTL is exceeded; the floor still holds it.
    let p = plan(
        &keep_last(2).validate().unwrap(),
        &inv,
        ts("2026-11-20T12:00:01Z"),
    );
    assert_eq!(p.backups[3].reasons, vec![Reason::Floor]);
}

/// A directory whose metadata.json cannot be read stays, counts for nothing, and holds the
/// binlogs from its start: it may be a recovery point once repaired.
#[test]
fn a_malformed_backup_is_kept_and_holds_the_binlog_horizon() {
    let mut bad = full("bad", "2026-11-01T00:00:00Z");
    bad.phase = Phase::Malformed;
    bad.completed_at = None;
    let inv = Inventory {
        backups: vec![bad, full("new", "2026-11-19T00:00:00Z")],
        segments: vec![
            segment(
                1,
                ts("2026-10-31T00:00:00Z"),
                Some(ts("2026-10-31T12:00:00Z")),
            ),
            segment(
                2,
                ts("2026-10-31T12:00:00Z"),
                Some(ts("2026-11-01T06:00:00Z")),
            ),
            segment(
                3,
                ts("2026-11-01T06:00:00Z"),
                Some(ts("2026-11-19T06:00:00Z")),
            ),
        ],
        ..Default::default()
    };
    let p = plan(
        &keep_last(1).validate().unwrap(),
        &inv,
        ts("2026-11-20T00:00:00Z"),
    );
    assert_eq!(
        decisions(&p),
        vec![
            row("bad", Keep, &["malformed"]),
            row("new", Keep, &["keepLast", "floor"]),
        ]
    );
    assert_eq!(p.horizon, Some(ts("2026-11-01T00:00:00Z")));
    let deleted: Vec<u64> = p.segments.delete.iter().map(|d| d.sequence).collect();
    assert_eq!(deleted, vec![1]);
}

/// An attempt whose in-flight marker is fresh is in progress, whatever failedBackupsTTL
/// says; once the marker is stale it is an ordinary uncommitted attempt.
#[test]
fn an_attempt_with_a_fresh_marker_is_never_collected() {
    let mut writing = full("writing", "2026-11-19T23:50:00Z");
    writing.phase = Phase::Uncommitted;
    writing.completed_at = None;
    writing.last_modified = ts("2026-11-19T23:55:00Z");
    writing.heartbeat_at = Some(ts("2026-11-19T23:59:40Z"));
    let inv = Inventory {
        backups: vec![full("ok", "2026-11-19T00:00:00Z"), writing],
        ..Default::default()
    };
    let policy = PolicyInput {
        keep_last: Some(3),
        failed_backups_ttl: Some("0d".into()),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let p = plan(&policy, &inv, ts("2026-11-20T00:00:00Z"));
    assert_eq!(p.backups[1].action, Keep);
    assert_eq!(p.backups[1].reasons, vec![Reason::InProgress]);
    // Ten minutes after its last heartbeat it is abandoned.
    let p = plan(&policy, &inv, ts("2026-11-20T00:09:40Z"));
    assert_eq!(p.backups[1].reasons, vec![Reason::Uncommitted]);
    // A pass evaluated a day ahead (`gc --now … --allow-future-now`) over a store read at
    // midnight still sees it running: running is a fact of when the store was read.
    let read_at_midnight = Inventory {
        observed_at: Some(ts("2026-11-20T00:00:00Z")),
        ..inv.clone()
    };
    let p = plan(&policy, &read_at_midnight, ts("2026-11-21T00:00:00Z"));
    assert_eq!(p.backups[1].reasons, vec![Reason::InProgress]);
}

/// Debris is collected by age, decided here with `now`: unreferenced shards after an hour;
/// uploads no running attempt owns after failedBackupsTTL (and an hour outside a backup
/// directory); an upload of a running attempt never.
#[test]
fn leftovers_are_collected_by_age_and_never_under_a_running_attempt() {
    use tidemark_core::{Leftover, LeftoverKind};
    let now = ts("2026-11-20T12:00:00Z");
    let leftover = |key: &str, kind, age_min: i64, attempt: Option<&str>| Leftover {
        key: key.into(),
        kind,
        last_modified: now - jiff::SignedDuration::from_mins(age_min),
        size: 10,
        attempt: attempt.map(str::to_owned),
        upload_id: (kind == LeftoverKind::IncompleteUpload).then(|| "u1".to_owned()),
    };
    let mut running = full("running", "2026-11-20T11:00:00Z");
    running.phase = Phase::Uncommitted;
    running.completed_at = None;
    running.heartbeat_at = Some(now - jiff::SignedDuration::from_secs(20));
    let mut dead = full("dead", "2026-11-20T10:00:00Z");
    dead.phase = Phase::Uncommitted;
    dead.completed_at = None;
    dead.last_modified = now - jiff::SignedDuration::from_mins(90);
    let inv = Inventory {
        backups: vec![full("ok", "2026-11-19T00:00:00Z"), dead, running],
        leftovers: vec![
            leftover(
                "binlogs/_index/old.json",
                LeftoverKind::UnreferencedShard,
                61,
                None,
            ),
            leftover(
                "binlogs/_index/new.json",
                LeftoverKind::UnreferencedShard,
                59,
                None,
            ),
            leftover(
                "n/running/backup.bin",
                LeftoverKind::IncompleteUpload,
                600,
                Some("running"),
            ),
            leftover(
                "n/dead/backup.bin#1",
                LeftoverKind::StagingFile,
                90,
                Some("dead"),
            ),
            leftover(
                "binlogs/mysql-bin.000009",
                LeftoverKind::IncompleteUpload,
                30,
                None,
            ),
            leftover(
                "binlogs/mysql-bin.000008",
                LeftoverKind::IncompleteUpload,
                61,
                None,
            ),
        ],
        ..Default::default()
    };
    let policy = PolicyInput {
        keep_last: Some(3),
        failed_backups_ttl: Some("0d".into()),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let p = plan(&policy, &inv, now);
    let mut gone: Vec<&str> = p
        .leftovers
        .delete
        .iter()
        .map(|d| d.leftover.key.as_str())
        .collect();
    gone.sort_unstable();
    assert_eq!(
        gone,
        vec![
            "binlogs/_index/old.json",
            "binlogs/mysql-bin.000008",
            "n/dead/backup.bin#1"
        ]
    );
    assert_eq!(p.leftovers.keep, 3);
    // Without failedBackupsTTL no upload is collected (as no failed attempt is).
    let keep_all = keep_last(3).validate().unwrap();
    let p = plan(&keep_all, &inv, now);
    assert_eq!(p.leftovers.delete.len(), 1, "{:?}", p.leftovers);
}

// ---------------------------------------------------------------- requested deletion

fn name_of(inv: &Inventory, id: &str) -> String {
    inv.backups
        .iter()
        .find(|b| b.id == id)
        .map(|b| b.name.clone())
        .unwrap_or_default()
}

/// Seed 000's finalizer and seed 002's "delete a backup": deleting a Backup object with
/// `deletionPolicy: Delete` deletes its data only when no recovery depends on it: never
/// the last restorable backup nor a committed increment's base (an expiry also keeps the
/// newest).
#[test]
fn requested_deletion_never_takes_the_floor_or_a_chain_parent() {
    let inv = Inventory {
        backups: vec![
            full("old", "2026-11-01T02:00:00Z"),
            full("base", "2026-11-02T02:00:00Z"),
            incr("inc", "base", "2026-11-03T02:00:00Z"),
            failed(incr("broken-inc", "old", "2026-11-03T03:00:00Z")),
        ],
        segments: vec![],
        ..Default::default()
    };
    let now = ts("2026-11-05T00:00:00Z");
    let name = |id: &str| {
        inv.backups
            .iter()
            .find(|b| b.id == id)
            .unwrap()
            .name
            .clone()
    };
    let reasons = |id: &str| match tidemark_core::requested_deletion(
        &inv,
        &name(id),
        id,
        Reason::DeletionRequested,
        now,
    )
    .unwrap()
    {
        Ok(p) => {
            assert_eq!(p.backups.len(), 1, "only the requested backup");
            assert_eq!(p.backups[0].backup.id, id);
            assert_eq!(p.backups[0].action, Delete);
            assert!(p.segments.delete.is_empty() && p.leftovers.delete.is_empty());
            p.backups[0].reasons.clone()
        }
        Err(keep) => keep,
    };
    // Nothing depends on `old` (a failed increment does not): deleted on request.
    assert_eq!(reasons("old"), vec![Reason::DeletionRequested]);
    // `inc` is the newest restorable, but an explicit deletion is not retention: others
    // remain restorable, so it goes (an expiry would keep it).
    assert_eq!(reasons("inc"), vec![Reason::DeletionRequested]);
    match tidemark_core::requested_deletion(&inv, &name("inc"), "inc", Reason::TtlExpired, now) {
        Some(Err(keep)) => assert_eq!(keep, vec![Reason::Floor]),
        other => panic!("an expiry took the newest restorable backup: {other:?}"),
    }
    // The last restorable backup is never deleted, however asked.
    let alone = Inventory {
        backups: vec![full("only", "2026-11-01T02:00:00Z")],
        segments: vec![],
        ..Default::default()
    };
    match tidemark_core::requested_deletion(
        &alone,
        &name_of(&alone, "only"),
        "only",
        Reason::DeletionRequested,
        now,
    ) {
        Some(Err(keep)) => assert_eq!(keep, vec![Reason::Floor]),
        other => panic!("the last restorable backup was deleted: {other:?}"),
    }
    // `base` carries the retained increment.
    assert_eq!(reasons("base"), vec![Reason::Chain("inc".into())]);
    assert_eq!(reasons("broken-inc"), vec![Reason::DeletionRequested]);
    let r = Reason::DeletionRequested;
    assert!(
        tidemark_core::requested_deletion(&inv, &name("old"), "nope", r.clone(), now).is_none()
    );
    // An id under another backup name is not this one.
    assert!(tidemark_core::requested_deletion(&inv, "elsewhere", "old", r, now).is_none());
}
