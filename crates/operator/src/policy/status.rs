//! Step 7 of the policy's reconcile: the status a pass leaves, as pure functions of its
//! outcome and the status before it.

use std::collections::HashSet;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tidemark_api::crd::{BackupPolicyStatus, RecoveryWindowStatus, TimelineStatus};
use tidemark_core::Action;
use tidemark_engine::PassOutcome;

use crate::status::condition_at;

/// What a pass leaves in its policy's status, and the message of what it could not do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PassStatus {
    pub status: BackupPolicyStatus,
    /// Some deletions or consolidations failed: the pass counts as not run.
    pub partly_failed: Option<String>,
}

/// The status a pass leaves: a pure function of its outcome, the status before it (of the
/// policy at `generation`), the pass's `now` and when the status is written (`written`,
/// the time of a condition that changes).
pub(crate) fn policy_status(
    outcome: &PassOutcome,
    status: &BackupPolicyStatus,
    generation: Option<i64>,
    interval: jiff::SignedDuration,
    now: Timestamp,
    written: Timestamp,
) -> PassStatus {
    let summary = PassSummary::of(outcome);
    let failures = outcome
        .executed
        .as_ref()
        .map_or(&[][..], |r| r.failures.as_slice());
    let next = tidemark_core::saturating_add(now, interval);
    // What it could not do fails the pass: reported, and retried with backoff — so the
    // pass is not recorded as run (observedGeneration and lastRetentionRunTime stay those
    // of the last whole pass).
    let partly_failed = (!failures.is_empty()).then(|| {
        let first = &failures[0];
        format!(
            "{} deletion(s) or consolidation(s) failed (retried with backoff): {}: {}{}; {}",
            failures.len(),
            first.key,
            first.error,
            if failures.len() > 1 { " …" } else { "" },
            summary.note()
        )
    });
    let (observed_generation, last, next) = if partly_failed.is_some() {
        (
            status.observed_generation,
            status.last_retention_run_time.clone(),
            None,
        )
    } else {
        (generation, Some(Time(now)), Some(Time(next)))
    };
    let new = BackupPolicyStatus {
        observed_generation,
        last_retention_run_time: last,
        next_retention_run_time: next,
        recovery_window: outcome
            .survey
            .plan
            .recovery_window
            .as_ref()
            .map(RecoveryWindowStatus::from),
        backups_kept: Some(summary.kept),
        backups_deleted: Some(summary.deleted),
        segments_deleted: Some(summary.segments_deleted),
        bytes_freed: Some(summary.bytes_freed),
        failures: Some(failures.len() as u64),
        conditions: vec![
            match &partly_failed {
                Some(message) => condition_at(
                    &status.conditions,
                    "Ready",
                    false,
                    "PassPartlyFailed",
                    message,
                    generation,
                    written,
                ),
                None => condition_at(
                    &status.conditions,
                    "Ready",
                    true,
                    "PassSucceeded",
                    &summary.note(),
                    generation,
                    written,
                ),
            },
            guard_condition(&outcome.guard, &status.conditions, generation, written),
        ],
        restore_test: None,
        verification: None,
        timelines: timeline_status(&outcome.survey.inventory),
        binlog_archive: None,
        copies: Vec::new(),
        // The caller records the retention a whole pass applied; the preview its own.
        applied_retention: status.applied_retention.clone(),
        policy_change: None,
    };
    PassStatus {
        status: new,
        partly_failed,
    }
}

/// The condition `DeletionGuard`: `True` while the deletion guard holds deletions of this
/// policy's store (DESIGN.md §5.5), with the count, why, and the annotation that releases
/// them.
pub(crate) fn guard_condition(
    verdict: &tidemark_core::guard::Verdict,
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    generation: Option<i64>,
    written: Timestamp,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    if !verdict.holds() {
        return condition_at(
            conditions,
            "DeletionGuard",
            false,
            "NothingHeld",
            "no deletion is held",
            generation,
            written,
        );
    }
    let release = verdict.release_with.map_or(String::new(), |at| {
        format!(
            "; if that is what you want, annotate the policy {}: \"{at}\" (it releases these deletions only, not a later wave)",
            tidemark_api::policy::ALLOW_DELETIONS_BEFORE_ANNOTATION
        )
    });
    condition_at(
        conditions,
        "DeletionGuard",
        true,
        "MassDeletionHeld",
        &format!("{}{release}", verdict.summary()),
        generation,
        written,
    )
}

/// The archive's timelines for the policy's status; none while it has one.
pub(crate) fn timeline_status(inventory: &tidemark_core::Inventory) -> Vec<TimelineStatus> {
    /// Timelines a status shows at most: the newest (the object's size is bounded).
    const SHOWN: usize = 16;
    let all = tidemark_core::timeline::summaries(inventory);
    if all.len() < 2 {
        return Vec::new();
    }
    let skip = all.len().saturating_sub(SHOWN);
    all.into_iter()
        .skip(skip)
        .map(|t| TimelineStatus {
            id: t.id,
            server_id: t.server_id,
            parent: t.parent,
            switch_gtid: t.switch.as_ref().map(|s| s.gtid.to_string()),
            switched_at: t.switch.as_ref().and_then(|s| s.at).map(Time),
            missing: t
                .switch
                .as_ref()
                .map(|s| s.missing.iter().map(ToString::to_string).collect())
                .unwrap_or_default(),
            unrelated: t.switch.as_ref().is_some_and(|s| s.unrelated),
            branch: t.branch,
            main_line: t.main_line,
            segments: t.segments as u64,
            last_event_at: t.last_event_at.map(Time),
        })
        .collect()
}

/// What a pass did, for status and the event.
pub(crate) struct PassSummary {
    pub kept: u64,
    pub deleted: u64,
    pub deleted_ids: Vec<String>,
    pub segments_deleted: u64,
    pub bytes_freed: u64,
    /// Bytes of the backups and binlog segments left in the store after the pass.
    pub bytes_stored: u64,
    pub audit: Option<String>,
}

impl PassSummary {
    pub fn of(outcome: &PassOutcome) -> Self {
        let plan = &outcome.survey.plan;
        let report = outcome.executed.as_ref();
        let gone: HashSet<&str> = report
            .map(|r| r.backups_deleted.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let backup_bytes: u64 = plan
            .deletions()
            .filter(|d| gone.contains(d.backup.id.as_str()))
            .map(|d| d.backup.size)
            .sum();
        let segments_deleted = report.map_or(0, |r| r.segments_deleted as u64);
        let segment_bytes: u64 = if segments_deleted > 0 {
            let deleted: HashSet<&str> = plan
                .segments
                .delete
                .iter()
                .map(|d| d.name.as_str())
                .collect();
            outcome
                .survey
                .inventory
                .segments
                .iter()
                .filter(|s| deleted.contains(s.name.as_str()))
                .map(|s| s.size)
                .sum()
        } else {
            0
        };
        let bytes_seen: u64 = plan.backups.iter().map(|d| d.backup.size).sum::<u64>()
            + outcome
                .survey
                .inventory
                .segments
                .iter()
                .map(|s| s.size)
                .sum::<u64>();
        PassSummary {
            bytes_stored: bytes_seen.saturating_sub(backup_bytes + segment_bytes),
            kept: plan
                .backups
                .iter()
                .filter(|d| d.action != Action::Delete)
                .count() as u64,
            deleted: gone.len() as u64,
            deleted_ids: gone.iter().map(|s| (*s).to_owned()).collect(),
            segments_deleted,
            bytes_freed: backup_bytes + segment_bytes,
            audit: report.and_then(|r| r.audit_key.clone()),
        }
    }

    pub fn note(&self) -> String {
        let mut ids = self.deleted_ids.clone();
        ids.sort();
        format!(
            "kept {} backup(s); deleted {} backup(s){}, {} binlog segment(s), {} bytes freed{}",
            self.kept,
            self.deleted,
            if ids.is_empty() {
                String::new()
            } else {
                format!(" ({})", ids.join(", "))
            },
            self.segments_deleted,
            self.bytes_freed,
            self.audit
                .as_deref()
                .map(|a| format!("; audit record {a}"))
                .unwrap_or_default()
        )
    }
}

/// The status a failed pass leaves: what the last good pass found, and `Ready=False` with
/// `reason` and `message` (pure). observedGeneration moves only with a pass that
/// succeeded: after a spec change, a failed pass is retried (by backoff), not held back by
/// retentionInterval.
pub(crate) fn failed_status(
    previous: &BackupPolicyStatus,
    generation: Option<i64>,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> BackupPolicyStatus {
    let mut status = previous.clone();
    status.conditions = vec![condition_at(
        &previous.conditions,
        "Ready",
        false,
        reason,
        message,
        generation,
        now,
    )];
    status
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tidemark_core::gtid::{GtidPos, GtidRun};
    use tidemark_core::{Inventory, Segment, SegmentGtids, Switch, Timeline};

    fn seg(seq: u64, name: &str, server: u32, start: &str, runs: &str, last: &str) -> Segment {
        let t: Timestamp = last.parse().unwrap();
        let mut s = Segment::new(name, seq, Some(t), Some(t), 1);
        s.gtids = Some(Box::new(SegmentGtids {
            server_id: server,
            start: GtidPos::parse(start).unwrap(),
            runs: runs
                .split(", ")
                .map(|r| GtidRun::parse(r).unwrap())
                .collect(),
        }));
        s
    }

    #[test]
    fn status_names_each_switch_and_what_it_lost() {
        let mut inv = Inventory {
            segments: vec![seg(
                1,
                "mysql-bin.000001",
                1,
                "",
                "0-1-1..12",
                "2026-11-27T10:00:00Z",
            )],
            ..Default::default()
        };
        assert!(
            timeline_status(&inv).is_empty(),
            "one timeline: nothing to show"
        );
        inv.segments.push(seg(
            1_000_000_000_001,
            "mysql-bin.1000000000001",
            2,
            "",
            "0-1-1..10, 0-2-11..20",
            "2026-11-27T11:00:00Z",
        ));
        inv.timelines = vec![
            Timeline {
                server_id: Some(1),
                ..Timeline::legacy()
            },
            Timeline {
                id: 1,
                server_id: Some(2),
                parent: Some(0),
                first_sequence: Some(1_000_000_000_001),
                switch: Some(Switch {
                    gtid: GtidPos::parse("0-1-10").unwrap(),
                    at: Some("2026-11-27T09:59:00Z".parse().unwrap()),
                    parent_sequence: Some(1),
                    missing: Vec::new(),
                    unrelated: false,
                }),
                created_at: None,
            },
        ];
        let status = timeline_status(&inv);
        assert_eq!(status.len(), 2);
        let t1 = &status[1];
        assert_eq!(
            (t1.id, t1.server_id, t1.parent, t1.switch_gtid.as_deref()),
            (1, Some(2), Some(0), Some("0-1-10"))
        );
        assert_eq!(t1.branch, ["0-1-11..12"]);
        assert!(t1.main_line && status[0].main_line);
        assert!(!t1.unrelated);
        // A switch that joins nothing (a binlog that started over) says so.
        if let Some(sw) = inv.timelines[1].switch.as_mut() {
            sw.unrelated = true;
        }
        assert!(timeline_status(&inv)[1].unrelated);
    }
}

#[cfg(test)]
mod status_tests {
    #![allow(clippy::unwrap_used)]
    use jiff::{SignedDuration, Timestamp};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use tidemark_api::crd::BackupPolicyStatus;
    use tidemark_engine::{PassOutcome, PassRequest};
    use tidemark_store::executor::{DeleteFailure, ExecutionReport};
    use tidemark_store::synth;

    use super::{PassStatus, failed_status, policy_status};

    fn at(hours: i64) -> Timestamp {
        Timestamp::from_second(1_795_000_000).unwrap() + SignedDuration::from_hours(hours)
    }

    /// A real pass's plan over two backups, keep one; `executed` as each case says.
    async fn outcome(executed: Option<ExecutionReport>) -> (PassOutcome, String, String) {
        let (_dir, store) = tidemark_store::testkit::local_store("c");
        let (old, new) = synth::older_and_newer(&store, "old", "new", at(10))
            .await
            .unwrap();
        let policy = tidemark_core::PolicyInput {
            keep_last: Some(1),
            ..Default::default()
        }
        .validate()
        .unwrap();
        let request = PassRequest {
            policy,
            policy_as_given: serde_json::json!({"keepLast": 1}),
            now: at(10),
            started_at: at(10),
            protect: Default::default(),
            restores: Vec::new(),
            execute: false,
            ignore_malformed: false,
            hooks: None,
            recorded_hooks: tidemark_engine::RecordedHooks::RunByCaller,
            override_primary_gate: false,
            allow_deletions_before: None,
            compare_with: None,
        };
        let mut o = tidemark_engine::retention_pass(
            &store,
            &request,
            None,
            None,
            &tidemark_store::NoProgress,
        )
        .await
        .unwrap();
        o.executed = executed;
        (o, old.id, new.id)
    }

    fn previous() -> BackupPolicyStatus {
        let mut p = BackupPolicyStatus {
            observed_generation: Some(3),
            last_retention_run_time: Some(Time(at(9))),
            next_retention_run_time: Some(Time(at(10))),
            ..Default::default()
        };
        p.conditions = vec![crate::status::condition_at(
            &[],
            "Ready",
            true,
            "PassSucceeded",
            "earlier",
            Some(3),
            at(1),
        )];
        p
    }

    /// The status of a pass, as a table: what moves and what stays, by outcome.
    #[tokio::test]
    async fn a_pass_status_is_a_function_of_its_outcome_the_previous_status_and_now() {
        let interval = SignedDuration::from_hours(1);
        let now = at(10);
        let (whole, old, _) = outcome(None).await;
        let deleted = ExecutionReport {
            audit_key: Some("c/_audit/a.json".into()),
            backups_deleted: vec![old.clone()],
            objects_deleted: 2,
            ..Default::default()
        };
        let (done, _, _) = outcome(Some(deleted.clone())).await;
        let partly = ExecutionReport {
            failures: vec![DeleteFailure {
                key: "c/old/x".into(),
                error: "503".into(),
            }],
            ..deleted
        };
        let (failed, _, _) = outcome(Some(partly)).await;
        struct Case<'a> {
            name: &'a str,
            outcome: &'a PassOutcome,
            ready: (&'a str, &'a str),
            observed: Option<i64>,
            last: Option<Timestamp>,
            next: Option<Timestamp>,
            since: Timestamp,
            deleted: u64,
            partly: bool,
        }
        let cases = [
            Case {
                name: "a plan that deleted nothing",
                outcome: &whole,
                ready: ("True", "PassSucceeded"),
                observed: Some(4),
                last: Some(now),
                next: Some(at(11)),
                since: at(1),
                deleted: 0,
                partly: false,
            },
            Case {
                name: "a pass that deleted",
                outcome: &done,
                ready: ("True", "PassSucceeded"),
                observed: Some(4),
                last: Some(now),
                next: Some(at(11)),
                since: at(1),
                deleted: 1,
                partly: false,
            },
            Case {
                name: "a pass that partly failed counts as not run",
                outcome: &failed,
                ready: ("False", "PassPartlyFailed"),
                observed: Some(3),
                last: Some(at(9)),
                next: None,
                since: now,
                deleted: 1,
                partly: true,
            },
        ];
        for c in cases {
            let PassStatus {
                status,
                partly_failed,
            } = policy_status(c.outcome, &previous(), Some(4), interval, now, now);
            let ready = &status.conditions[0];
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                c.ready,
                "{}",
                c.name
            );
            assert_eq!(ready.last_transition_time.0, c.since, "{}", c.name);
            assert_eq!(status.observed_generation, c.observed, "{}", c.name);
            assert_eq!(
                status.last_retention_run_time.as_ref().map(|t| t.0),
                c.last,
                "{}",
                c.name
            );
            assert_eq!(
                status.next_retention_run_time.as_ref().map(|t| t.0),
                c.next,
                "{}",
                c.name
            );
            assert_eq!(status.backups_deleted, Some(c.deleted), "{}", c.name);
            assert_eq!(status.backups_kept, Some(1), "{}", c.name);
            assert_eq!(partly_failed.is_some(), c.partly, "{}", c.name);
            if let Some(m) = &partly_failed {
                assert!(m.contains("c/old/x: 503"), "{m}");
                assert_eq!(&ready.message, m);
            }
            // Deterministic: the same inputs give the same patch.
            assert_eq!(
                policy_status(c.outcome, &previous(), Some(4), interval, now, now).status,
                status
            );
        }
        let _ = old;
    }

    #[test]
    fn a_failed_pass_keeps_what_the_last_good_one_found() {
        let before = previous();
        let after = failed_status(&before, Some(4), "Waiting", "held by x", at(10));
        assert_eq!(after.observed_generation, Some(3));
        assert_eq!(
            after.last_retention_run_time,
            before.last_retention_run_time
        );
        let c = &after.conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Waiting"));
        assert_eq!(c.observed_generation, Some(4));
        assert_eq!(c.last_transition_time.0, at(10));
        // Still failing later: the transition stays where it was.
        let again = failed_status(&after, Some(4), "Waiting", "held by y", at(11));
        assert_eq!(again.conditions[0].last_transition_time.0, at(10));
        assert_eq!(again.conditions[0].message, "held by y");
    }
}
