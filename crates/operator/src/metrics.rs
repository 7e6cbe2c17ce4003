//! Prometheus metrics, and the `/metrics`, `/healthz` and `/readyz` endpoints.
//!
//! Labels are bounded: namespace and policy names (as many as there are policies), the
//! controller, and the engine's error class — never a backup-id or a message.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Duration;

use tokio::net::TcpListener;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub namespace: String,
    pub policy: String,
}

/// A policy's passes or backups by outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassLabels {
    pub namespace: String,
    pub policy: String,
    /// Passes: `ok`, `partial` or the error class. Backups: `succeeded` or `failed`.
    pub result: String,
}

/// One ScheduledBackup (as many as there are schedules).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScheduleLabels {
    pub namespace: String,
    pub policy: String,
    pub schedule: String,
}

/// One copy of a policy's store (`spec.copies[]`, at most four a policy).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CopyLabels {
    pub namespace: String,
    pub policy: String,
    pub copy: String,
}

/// The running build (`tidemark_build_info`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
}

/// The buckets of backup durations, in seconds: 30 s to 12 h.
pub const BACKUP_DURATION_BUCKETS: [f64; 12] = [
    30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 43200.0,
];

/// Completed backups' durations, by policy: a histogram family (its constructor is the
/// buckets, so it cannot be `Default` by derivation).
#[derive(Debug, Clone)]
pub struct BackupDurations(pub Family<PolicyLabels, Histogram, fn() -> Histogram>);

impl Default for BackupDurations {
    fn default() -> Self {
        BackupDurations(Family::new_with_constructor(|| {
            Histogram::new(BACKUP_DURATION_BUCKETS)
        }))
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: String,
    /// The engine's class: input, store, data, contention, source, internal…
    pub class: String,
}

/// Every metric the operator exports.
#[derive(Debug, Default)]
pub struct Metrics {
    pub retention_passes: Family<PassLabels, Counter>,
    pub objects_deleted: Family<PolicyLabels, Counter>,
    pub bytes_freed: Family<PolicyLabels, Counter>,
    /// Deletions and consolidations retention passes could not do.
    pub retention_failures: Family<PolicyLabels, Counter>,
    pub recovery_window_seconds: Family<PolicyLabels, Gauge>,
    /// The first and last recoverable instants after the last pass.
    pub recovery_window_start: Family<PolicyLabels, Gauge>,
    pub recovery_window_end: Family<PolicyLabels, Gauge>,
    /// Spans inside the window that cannot be restored.
    pub recovery_window_gaps: Family<PolicyLabels, Gauge>,
    /// Bytes of backups and binlogs in the store, and backups kept, after the last pass.
    pub store_bytes: Family<PolicyLabels, Gauge>,
    pub backups_kept: Family<PolicyLabels, Gauge>,
    /// `spec.retention.window`: how far back the policy promises to restore.
    pub recovery_window_promised: Family<PolicyLabels, Gauge>,
    /// Where the stretch restorable at every instant starts (with `pointInTime.window`,
    /// after the snapshots kept longer), and that window's promise.
    pub point_in_time_start: Family<PolicyLabels, Gauge>,
    pub point_in_time_promised: Family<PolicyLabels, Gauge>,
    /// Backup deletions the deletion guard holds (1 when it holds only segments).
    pub deletions_held: Family<PolicyLabels, Gauge>,
    pub last_successful_backup: Family<PolicyLabels, Gauge>,
    /// Backups that ended, by policy and result.
    pub backups: Family<PassLabels, Counter>,
    /// Restores that ended, by policy and result, and how long the newest successful one
    /// took.
    pub restores: Family<PassLabels, Counter>,
    pub last_restore_duration: Family<PolicyLabels, Gauge>,
    /// The newest completed backup's duration and payload size.
    pub last_backup_duration: Family<PolicyLabels, Gauge>,
    pub last_backup_size: Family<PolicyLabels, Gauge>,
    /// When the newest failed backup ended.
    pub last_failed_backup: Family<PolicyLabels, Gauge>,
    /// The longest time between a schedule's slots over the next 35 days.
    pub schedule_interval: Family<ScheduleLabels, Gauge>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconciles: Family<ControllerLabels, Counter>,
    /// 1 when the policy's last restore test passed, 0 when it failed.
    pub restore_test_passed: Family<PolicyLabels, Gauge>,
    /// When the policy's last restore test ended.
    pub restore_test_last_run: Family<PolicyLabels, Gauge>,
    /// How long the policy's last restore test took (its record's seconds).
    pub restore_test_duration: Family<PolicyLabels, Gauge>,
    /// When the policy's next restore test is due.
    pub restore_test_next_run: Family<PolicyLabels, Gauge>,
    /// The longest time between the policy's restore tests over the next 35 days.
    pub restore_test_interval: Family<PolicyLabels, Gauge>,
    /// When the policy was created (alerts on a promise wait until the policy is as old).
    pub policy_created: Family<PolicyLabels, Gauge>,
    /// 1 when the policy's last verification read everything back whole, 0 when not.
    pub verification_passed: Family<PolicyLabels, Gauge>,
    /// When the policy's last verification ended.
    pub verification_last_run: Family<PolicyLabels, Gauge>,
    /// How far the policy's binlog archive is behind the server it reads, in seconds.
    pub binlog_archive_lag: Family<PolicyLabels, Gauge>,
    /// `binlogArchive.purge`: bytes of binlogs on the server after the archiver's last
    /// purge, and 1 while the point in time is at risk (the limit nears, files unarchived).
    pub binlog_disk_bytes: Family<PolicyLabels, Gauge>,
    pub point_in_time_at_risk: Family<PolicyLabels, Gauge>,
    /// How far a copy is behind the policy's store, in seconds.
    pub copy_lag: Family<CopyLabels, Gauge>,
    /// When a copy's last pass ended.
    pub copy_last_run: Family<CopyLabels, Gauge>,
    /// Bytes copied to a copy.
    pub copy_bytes: Family<CopyLabels, Counter>,
    /// The length of a copy's own recovery window after its last pass.
    pub copy_window: Family<CopyLabels, Gauge>,
    /// A copy's `maxLag` (what the `TidemarkCopyBehind` alert compares the lag with).
    pub copy_max_lag: Family<CopyLabels, Gauge>,
    /// 1 when the copy's last verification read everything back whole, 0 when not.
    pub copy_verification_passed: Family<CopyLabels, Gauge>,
    /// When the copy's last verification ended.
    pub copy_verification_last_run: Family<CopyLabels, Gauge>,
    /// 1 when the copy's last restore test passed, 0 when not.
    pub copy_restore_test_passed: Family<CopyLabels, Gauge>,
    /// When the copy's last restore test ended.
    pub copy_restore_test_last_run: Family<CopyLabels, Gauge>,
    /// Set once this replica has talked to the API server (readiness).
    pub ready: AtomicBool,
    /// 1 while this replica leads.
    pub leader: Gauge,
    /// Each completed backup's duration, observed once when it completes.
    pub backup_duration: BackupDurations,
    /// 1, labelled with the version running.
    pub build_info: Family<BuildLabels, Gauge>,
}

impl Metrics {
    /// A registry exposing these metrics.
    pub fn registry(self: &Arc<Self>) -> Registry {
        let mut r = Registry::with_prefix("tidemark");
        r.register(
            "retention_passes",
            "Retention passes, by policy and result",
            self.retention_passes.clone(),
        );
        r.register(
            "retention_failures",
            "Deletions and consolidations retention passes could not do (retried)",
            self.retention_failures.clone(),
        );
        r.register(
            "objects_deleted",
            "Objects deleted from the store by retention",
            self.objects_deleted.clone(),
        );
        r.register(
            "bytes_freed",
            "Bytes freed in the store by retention",
            self.bytes_freed.clone(),
        );
        r.register(
            "recovery_window_seconds",
            "Length of the recovery window after the last pass",
            self.recovery_window_seconds.clone(),
        );
        r.register(
            "recovery_window_start_timestamp_seconds",
            "The first recoverable instant after the last pass",
            self.recovery_window_start.clone(),
        );
        r.register(
            "recovery_window_end_timestamp_seconds",
            "The last recoverable instant after the last pass",
            self.recovery_window_end.clone(),
        );
        r.register(
            "recovery_window_gaps",
            "Spans inside the recovery window that cannot be restored, after the last pass",
            self.recovery_window_gaps.clone(),
        );
        r.register(
            "store_bytes",
            "Bytes of backups and binlog segments in the store after the last pass",
            self.store_bytes.clone(),
        );
        r.register(
            "backups_kept",
            "Backups the last pass kept",
            self.backups_kept.clone(),
        );
        r.register(
            "recovery_window_promised_seconds",
            "The policy's retention window: how far back it promises to restore",
            self.recovery_window_promised.clone(),
        );
        r.register(
            "point_in_time_window_start_timestamp_seconds",
            "The first instant from which every instant restores, after the last pass",
            self.point_in_time_start.clone(),
        );
        r.register(
            "point_in_time_window_promised_seconds",
            "The policy's retention.pointInTime.window (0 without one)",
            self.point_in_time_promised.clone(),
        );
        r.register(
            "deletions_held",
            "Deletions the deletion guard holds until acknowledged (tidemark.io/allow-deletions-before)",
            self.deletions_held.clone(),
        );
        r.register(
            "last_successful_backup_timestamp_seconds",
            "Completion time of the newest completed Backup",
            self.last_successful_backup.clone(),
        );
        r.register(
            "backups",
            "Backups that ended, by policy and result (succeeded, failed)",
            self.backups.clone(),
        );
        r.register(
            "restores",
            "Restores that ended, by policy and result (succeeded, failed)",
            self.restores.clone(),
        );
        r.register(
            "last_restore_duration_seconds",
            "Duration of the newest successful Restore, from its start to the claim restored",
            self.last_restore_duration.clone(),
        );
        r.register(
            "last_backup_duration_seconds",
            "Duration of the newest completed Backup",
            self.last_backup_duration.clone(),
        );
        r.register(
            "last_backup_size_bytes",
            "Payload bytes of the newest completed Backup",
            self.last_backup_size.clone(),
        );
        r.register(
            "last_failed_backup_timestamp_seconds",
            "When the newest failed Backup ended",
            self.last_failed_backup.clone(),
        );
        r.register(
            "schedule_interval_seconds",
            "Longest time between a ScheduledBackup's slots over the next 35 days",
            self.schedule_interval.clone(),
        );
        r.register(
            "reconcile_errors",
            "Failed reconciles, by controller and error class",
            self.reconcile_errors.clone(),
        );
        r.register(
            "reconciles",
            "Reconciles finished (successfully or not), by controller",
            self.reconciles.clone(),
        );
        r.register(
            "restore_test_passed",
            "1 when the policy's last restore test passed, 0 when it failed",
            self.restore_test_passed.clone(),
        );
        r.register(
            "restore_test_last_run_timestamp_seconds",
            "When the policy's last restore test ended",
            self.restore_test_last_run.clone(),
        );
        r.register(
            "restore_test_duration_seconds",
            "How long the policy's last restore test took",
            self.restore_test_duration.clone(),
        );
        r.register(
            "restore_test_next_run_timestamp_seconds",
            "When the policy's next restore test is due",
            self.restore_test_next_run.clone(),
        );
        r.register(
            "restore_test_interval_seconds",
            "Longest time between the policy's restore tests over the next 35 days",
            self.restore_test_interval.clone(),
        );
        r.register(
            "policy_created_timestamp_seconds",
            "When the BackupPolicy was created",
            self.policy_created.clone(),
        );
        r.register(
            "verification_passed",
            "1 when the policy's last verification read the newest backup, its chain and their binlogs back whole, 0 when not",
            self.verification_passed.clone(),
        );
        r.register(
            "verification_last_run_timestamp_seconds",
            "When the policy's last verification ended",
            self.verification_last_run.clone(),
        );
        r.register(
            "binlog_disk_bytes",
            "Bytes of binlogs on the database server after the archiver's last purge (binlogArchive.purge)",
            self.binlog_disk_bytes.clone(),
        );
        r.register(
            "point_in_time_at_risk",
            "1 while the server's binlogs near binlogArchive.purge.maxDiskUsage with files the archive lacks",
            self.point_in_time_at_risk.clone(),
        );
        r.register(
            "binlog_archive_lag_seconds",
            "How far the binlog archive is behind the server it reads: the server's newest event against the newest archived (or now, when the archiver stopped reporting)",
            self.binlog_archive_lag.clone(),
        );
        r.register(
            "copy_lag_seconds",
            "How far a copy (spec.copies) is behind the policy's store: the store's newest restorable instant against the copy's (or now, when its last pass failed)",
            self.copy_lag.clone(),
        );
        r.register(
            "copy_last_run_timestamp_seconds",
            "When the copy's last pass ended",
            self.copy_last_run.clone(),
        );
        r.register(
            "copy_bytes",
            "Bytes sent to the copy, as stored",
            self.copy_bytes.clone(),
        );
        r.register(
            "copy_recovery_window_seconds",
            "The length of the copy's own recovery window after its last pass",
            self.copy_window.clone(),
        );
        r.register(
            "copy_max_lag_seconds",
            "The copy's maxLag: how far it may fall behind the policy's store",
            self.copy_max_lag.clone(),
        );
        r.register(
            "copy_verification_passed",
            "1 when the copy's last verification read its newest backup, its chain and their binlogs back whole from the copy, 0 when not",
            self.copy_verification_passed.clone(),
        );
        r.register(
            "copy_verification_last_run_timestamp_seconds",
            "When the copy's last verification ended",
            self.copy_verification_last_run.clone(),
        );
        r.register(
            "copy_restore_test_passed",
            "1 when the copy's last restore test (restored from the copy) passed, 0 when not",
            self.copy_restore_test_passed.clone(),
        );
        r.register(
            "copy_restore_test_last_run_timestamp_seconds",
            "When the copy's last restore test ended",
            self.copy_restore_test_last_run.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the leader lease",
            self.leader.clone(),
        );
        r.register(
            "backup_duration_seconds",
            "Durations of completed Backups, from start to commit, by policy",
            self.backup_duration.0.clone(),
        );
        self.build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        r.register(
            "build_info",
            "1, labelled with the operator's version",
            self.build_info.clone(),
        );
        r
    }

    /// A Backup of `labels`' policy completed now, after `seconds` (observed once, at its
    /// end: not again when the Backup is seen at start-up).
    pub fn backup_took(&self, labels: &PolicyLabels, seconds: f64) {
        self.backup_duration
            .0
            .get_or_create(labels)
            .observe(seconds.max(0.0));
    }

    /// A Backup of `labels`' policy ended now (counted once, when its status says so).
    pub fn backup_ended(&self, labels: &PolicyLabels, succeeded: bool) {
        self.backups
            .get_or_create(&PassLabels {
                namespace: labels.namespace.clone(),
                policy: labels.policy.clone(),
                result: if succeeded { "succeeded" } else { "failed" }.into(),
            })
            .inc();
    }

    /// A Restore of `labels`' policy ended; `took`, when it succeeded, its duration.
    pub fn restore_ended(&self, labels: &PolicyLabels, took: Option<i64>) {
        self.restores
            .get_or_create(&PassLabels {
                namespace: labels.namespace.clone(),
                policy: labels.policy.clone(),
                result: if took.is_some() {
                    "succeeded"
                } else {
                    "failed"
                }
                .into(),
            })
            .inc();
        if let Some(secs) = took {
            self.last_restore_duration
                .get_or_create(labels)
                .set(secs.max(0));
        }
    }

    /// A failed Backup of `labels`' policy, seen at its end or at start-up: the newest
    /// failure's time.
    pub fn backup_failed(&self, labels: &PolicyLabels, at: jiff::Timestamp) {
        newest(&self.last_failed_backup.get_or_create(labels), at);
    }

    /// A completed Backup of `labels`' policy, seen at its end or at start-up: when it is
    /// the newest, its time, duration and size become the last backup's.
    pub fn backup_completed(
        &self,
        labels: &PolicyLabels,
        started: Option<jiff::Timestamp>,
        completed: jiff::Timestamp,
        size: Option<u64>,
    ) {
        if !newest(
            &self.last_successful_backup.get_or_create(labels),
            completed,
        ) {
            return;
        }
        if let Some(started) = started {
            self.last_backup_duration
                .get_or_create(labels)
                .set(completed.duration_since(started).as_secs().max(0));
        }
        if let Some(size) = size {
            self.last_backup_size
                .get_or_create(labels)
                .set(i64::try_from(size).unwrap_or(i64::MAX));
        }
    }

    /// Removes the series of what is gone, so that no alert fires on a deleted policy or
    /// schedule, and a name no policy has (a tenant's Backup naming one that does not
    /// exist) leaves no series behind: every series of a policy `owner` does not know, a
    /// schedule's interval when `schedule` does not know it (or it moved to another policy
    /// or was suspended), and a policy's restore-test, verification and binlog-archive
    /// series when its spec no longer asks for them. Run every [`SWEEP_EVERY`].
    pub fn sweep(
        self: &Arc<Self>,
        owner: impl Fn(&str, &str) -> Option<Owned>,
        schedule: impl Fn(&str, &str, &str) -> bool,
    ) {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry()).is_err() {
            return;
        }
        let mut policies = std::collections::BTreeSet::new();
        let mut schedules = Vec::new();
        let mut copies = std::collections::BTreeSet::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, rest)) = line.split_once('{') else {
                continue;
            };
            let labels = parse_labels(rest);
            let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            if let (Some(ns), Some(policy)) = (get("namespace"), get("policy")) {
                if let (true, Some(s)) = (
                    name == "tidemark_schedule_interval_seconds",
                    get("schedule"),
                ) {
                    schedules.push(ScheduleLabels {
                        namespace: ns.clone(),
                        policy: policy.clone(),
                        schedule: s,
                    });
                }
                if let (true, Some(c)) = (name.starts_with("tidemark_copy_"), get("copy")) {
                    copies.insert((ns.clone(), policy.clone(), c));
                }
                policies.insert((ns, policy));
            }
        }
        for s in schedules {
            if !schedule(&s.namespace, &s.schedule, &s.policy) {
                self.schedule_interval.remove(&s);
            }
        }
        for (ns, policy, copy) in copies {
            let owned = owner(&ns, &policy);
            let named = owned.as_ref().is_some_and(|o| o.copies.contains(&copy));
            let l = CopyLabels {
                namespace: ns,
                policy,
                copy,
            };
            // A copy's check no longer asked for: its gauges go (no alert fires on them).
            if !owned
                .as_ref()
                .is_some_and(|o| o.copies_verified.contains(&l.copy))
            {
                self.copy_verification_passed.remove(&l);
                self.copy_verification_last_run.remove(&l);
            }
            if !owned
                .as_ref()
                .is_some_and(|o| o.copies_restore_tested.contains(&l.copy))
            {
                self.copy_restore_test_passed.remove(&l);
                self.copy_restore_test_last_run.remove(&l);
            }
            if !named {
                self.copy_lag.remove(&l);
                self.copy_last_run.remove(&l);
                self.copy_bytes.remove(&l);
                self.copy_window.remove(&l);
                self.copy_max_lag.remove(&l);
            }
        }
        for (ns, policy) in policies {
            let labels = Metrics::policy(&ns, &policy);
            match owner(&ns, &policy) {
                None => self.forget(&labels),
                Some(owned) => {
                    if !owned.restore_test {
                        for f in [
                            &self.restore_test_passed,
                            &self.restore_test_last_run,
                            &self.restore_test_duration,
                            &self.restore_test_next_run,
                            &self.restore_test_interval,
                        ] {
                            f.remove(&labels);
                        }
                    }
                    if !owned.verification {
                        self.verification_passed.remove(&labels);
                        self.verification_last_run.remove(&labels);
                    }
                    if !owned.binlog_archive {
                        self.binlog_archive_lag.remove(&labels);
                        self.binlog_disk_bytes.remove(&labels);
                        self.point_in_time_at_risk.remove(&labels);
                    }
                }
            }
        }
    }

    /// Removes every series of the policy `labels` names.
    fn forget(&self, labels: &PolicyLabels) {
        for f in [
            &self.objects_deleted,
            &self.bytes_freed,
            &self.retention_failures,
        ] {
            f.remove(labels);
        }
        for f in [
            &self.recovery_window_seconds,
            &self.recovery_window_start,
            &self.recovery_window_end,
            &self.recovery_window_gaps,
            &self.recovery_window_promised,
            &self.point_in_time_start,
            &self.point_in_time_promised,
            &self.deletions_held,
            &self.store_bytes,
            &self.backups_kept,
            &self.last_successful_backup,
            &self.last_backup_duration,
            &self.last_backup_size,
            &self.last_failed_backup,
            &self.last_restore_duration,
            &self.restore_test_passed,
            &self.restore_test_last_run,
            &self.restore_test_duration,
            &self.restore_test_next_run,
            &self.restore_test_interval,
            &self.policy_created,
            &self.verification_passed,
            &self.verification_last_run,
            &self.binlog_archive_lag,
            &self.binlog_disk_bytes,
            &self.point_in_time_at_risk,
        ] {
            f.remove(labels);
        }
        for result in RESULTS
            .iter()
            .copied()
            .chain(CLASSES.iter().map(|c| c.as_str()))
        {
            let l = PassLabels {
                namespace: labels.namespace.clone(),
                policy: labels.policy.clone(),
                result: result.to_owned(),
            };
            self.retention_passes.remove(&l);
            self.backups.remove(&l);
            self.restores.remove(&l);
        }
        self.backup_duration.0.remove(labels);
    }

    /// A policy's outcome counters at 0 (`ok` passes, `succeeded` and `failed` backups), so
    /// that the first failure is an increase `increase()` sees, not a new series at 1.
    pub fn policy_seen(&self, labels: &PolicyLabels) {
        for (family, result) in [
            (&self.retention_passes, "ok"),
            (&self.backups, "succeeded"),
            (&self.backups, "failed"),
        ] {
            let _ = family.get_or_create(&PassLabels {
                namespace: labels.namespace.clone(),
                policy: labels.policy.clone(),
                result: result.to_owned(),
            });
        }
    }

    pub fn policy(namespace: &str, policy: &str) -> PolicyLabels {
        PolicyLabels {
            namespace: namespace.to_owned(),
            policy: policy.to_owned(),
        }
    }
}

/// How often [`Metrics::sweep`] runs.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// What a policy that exists asks for, as far as its series go.
#[derive(Debug, Clone, Default)]
pub struct Owned {
    pub restore_test: bool,
    pub verification: bool,
    pub binlog_archive: bool,
    /// The copies it names.
    pub copies: Vec<String>,
    /// Those of its copies with a `verify`, and with a `restoreTest`.
    pub copies_verified: Vec<String>,
    pub copies_restore_tested: Vec<String>,
}

/// The results of [`PassLabels`] besides the error classes.
const RESULTS: [&str; 4] = ["ok", "partial", "succeeded", "failed"];

/// Every error class, a pass's `result` when it failed.
const CLASSES: [tidemark_engine::Class; 9] = [
    tidemark_engine::Class::Input,
    tidemark_engine::Class::Store,
    tidemark_engine::Class::Data,
    tidemark_engine::Class::Contention,
    tidemark_engine::Class::Source,
    tidemark_engine::Class::NotRestorable,
    tidemark_engine::Class::RestoreFailed,
    tidemark_engine::Class::Key,
    tidemark_engine::Class::Internal,
];

/// The `name="value"` pairs of a sample's labels (after its `{`), unescaped.
fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let name = name.trim_start_matches([',', ' ']).to_owned();
        if name.is_empty() || name.contains('}') || chars.next() != Some('"') {
            return out;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => return out,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.push((name, value));
    }
}

/// Sets `gauge` to `at` (seconds) unless it already holds a later time; whether `at` is
/// the newest (two Backups ending at once: the later time wins).
fn newest(gauge: &Gauge, at: jiff::Timestamp) -> bool {
    let at = at.as_second();
    gauge
        .inner()
        .fetch_max(at, std::sync::atomic::Ordering::Relaxed)
        <= at
}

/// OpenMetrics text as Prometheus's text format 0.0.4, for clients that do not ask for
/// OpenMetrics (`curl`, `promtool check metrics`): a counter's `# HELP` and `# TYPE` name
/// its samples (`x_total`, not `x`), and `# EOF` and `# UNIT` go. Prometheus itself asks for
/// OpenMetrics and gets it unchanged.
pub fn text_format(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Connections served at once; more wait in the listen queue.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send its request headers, and how long one connection may
/// last in all.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause after a failed accept (out of file descriptors, say), so a failing listener
/// never spins.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` with hyper (HTTP/1.1, GET
/// only, one request per connection) until the task is dropped: at most
/// [`MAX_CONNECTIONS`] at once, each bounded by [`REQUEST_TIMEOUT`], and a pause after an
/// accept error.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    let registry = Arc::new(metrics.registry());
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(e) => {
                tracing::debug!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let registry = registry.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let answer = answer(&req, &registry, &metrics);
                async move { Ok::<_, std::convert::Infallible>(answer) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(REQUEST_TIMEOUT)
                .keep_alive(false)
                .max_buf_size(16 * 1024)
                .serve_connection(hyper_util::rt::TokioIo::new(conn), service);
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, connection).await;
        });
    }
}

type Body = http_body_util::Full<bytes::Bytes>;

fn answer(
    req: &hyper::Request<hyper::body::Incoming>,
    registry: &Registry,
    metrics: &Metrics,
) -> hyper::Response<Body> {
    let reply = |code: hyper::StatusCode, kind: &str, body: String| {
        let mut r = hyper::Response::new(Body::new(body.into()));
        *r.status_mut() = code;
        if let Ok(v) = hyper::header::HeaderValue::from_str(kind) {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        r
    };
    use hyper::StatusCode;
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match req.uri().path() {
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if metrics.ready.load(Ordering::Relaxed) => {
            reply(StatusCode::OK, "text/plain", "ok\n".into())
        }
        "/readyz" => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "the API server has not answered yet\n".into(),
        ),
        "/metrics" => {
            let mut text = String::new();
            let openmetrics = req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|a| a.to_str().ok())
                .is_some_and(|a| a.contains("application/openmetrics-text"));
            match prometheus_client::encoding::text::encode(&mut text, registry) {
                Ok(()) if openmetrics => reply(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Ok(()) => reply(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    text_format(&text),
                ),
                Err(_) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    "encoding failed\n".into(),
                ),
            }
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_read_back_unescaped() {
        assert_eq!(
            parse_labels(r#"namespace="a",policy="d\"b\\x",result="ok"} 3"#),
            [
                ("namespace".to_owned(), "a".to_owned()),
                ("policy".to_owned(), "d\"b\\x".to_owned()),
                ("result".to_owned(), "ok".to_owned())
            ]
        );
        assert!(parse_labels("} 1").is_empty());
    }

    /// A gone policy loses every series; a living one only those its spec no longer asks
    /// for; a schedule no longer known loses its interval.
    #[test]
    fn the_sweep_removes_what_is_gone() {
        let m = Arc::new(Metrics::default());
        let (gone, kept) = (Metrics::policy("t", "gone"), Metrics::policy("t", "kept"));
        for l in [&gone, &kept] {
            m.policy_seen(l);
            m.backup_ended(l, false);
            m.backup_took(l, 90.0);
            m.last_successful_backup.get_or_create(l).set(1);
            m.restore_test_passed.get_or_create(l).set(1);
            m.binlog_archive_lag.get_or_create(l).set(1);
            for copy in ["dr", "old"] {
                let c = CopyLabels {
                    namespace: l.namespace.clone(),
                    policy: l.policy.clone(),
                    copy: copy.into(),
                };
                m.copy_lag.get_or_create(&c).set(5);
                m.copy_verification_passed.get_or_create(&c).set(0);
                m.copy_restore_test_passed.get_or_create(&c).set(0);
            }
            m.schedule_interval
                .get_or_create(&ScheduleLabels {
                    namespace: l.namespace.clone(),
                    policy: l.policy.clone(),
                    schedule: "s".into(),
                })
                .set(60);
        }
        m.sweep(
            |_, p| {
                (p == "kept").then(|| Owned {
                    restore_test: false,
                    verification: false,
                    binlog_archive: true,
                    copies: vec!["dr".into()],
                    copies_verified: vec!["dr".into()],
                    copies_restore_tested: Vec::new(),
                })
            },
            |_, _, p| p == "kept",
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &m.registry()).unwrap();
        assert!(!text.contains(r#"policy="gone""#), "{text}");
        for kept in [
            r#"tidemark_backups_total{namespace="t",policy="kept",result="failed"} 1"#,
            r#"tidemark_backups_total{namespace="t",policy="kept",result="succeeded"} 0"#,
            r#"tidemark_last_successful_backup_timestamp_seconds{namespace="t",policy="kept"} 1"#,
            r#"tidemark_binlog_archive_lag_seconds{namespace="t",policy="kept"} 1"#,
            r#"tidemark_schedule_interval_seconds{namespace="t",policy="kept",schedule="s"} 60"#,
            r#"tidemark_copy_lag_seconds{namespace="t",policy="kept",copy="dr"} 5"#,
            // 90 s: in the 120 s bucket, not the 60 s one.
            r#"tidemark_backup_duration_seconds_bucket{le="60.0",namespace="t",policy="kept"} 0"#,
            r#"tidemark_backup_duration_seconds_bucket{le="120.0",namespace="t",policy="kept"} 1"#,
            r#"tidemark_backup_duration_seconds_count{namespace="t",policy="kept"} 1"#,
            r#"tidemark_build_info{version=""#,
        ] {
            assert!(text.contains(kept), "{kept} in {text}");
        }
        assert!(
            !text.contains(r#"copy="old""#),
            "a copy no longer named: {text}"
        );
        // The copy's verification is still asked for, its restore test no longer.
        assert!(
            text.contains(
                r#"tidemark_copy_verification_passed{namespace="t",policy="kept",copy="dr"} 0"#
            ),
            "{text}"
        );
        assert!(
            !text.contains("tidemark_copy_restore_test_passed{"),
            "{text}"
        );
        assert!(!text.contains("tidemark_restore_test_passed{"), "{text}");
    }
}
