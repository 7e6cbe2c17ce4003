//! `BackupPolicy`: one per protected cluster (DESIGN.md §6).

// kube's `printcolumn(name = …, type_ = …)` repeats keys by design.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tidemark_core::PolicyInput;

/// CEL for a retention duration (`<n>d|<n>w|<n>mo`, tidemark_core's `RetentionDuration`;
/// seed 000's ambiguous `<n>m` is still accepted, and warned about by the operator).
pub(crate) const DURATION_RULE: &str = "self.matches('^[0-9]+(d|w|mo?)$')";
pub(crate) const DURATION_MESSAGE: &str =
    "expected <n>d, <n>w or <n>mo (days, weeks, or months of 30 days), e.g. 30d, 4w, 12mo";

/// Name and labels, as in any Kubernetes object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// A `BackupPolicy` document (a file read by `tidemark run`; the operator reads the same
/// fields as [`BackupPolicyCrd`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackupPolicy {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: BackupPolicySpec,
    /// Written by the operator; ignored on input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// What to protect, where the backups live, and how long they are kept.
#[derive(CustomResource, KubeSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "tidemark.io",
    version = "v1alpha1",
    kind = "BackupPolicy",
    root = "BackupPolicyCrd",
    namespaced,
    status = "BackupPolicyStatus",
    shortname = "tbp",
    category = "tidemark",
    validation = Rule::new("self.metadata.name.size() <= 63").message("metadata.name: at most 63 characters (it labels the archiver and consolidation objects the operator creates)"),
    doc = "One per protected cluster: where its backups are stored, how long they are kept, and how the operator reaches the database.",
    printcolumn(
        name = "Window start",
        type_ = "string",
        json_path = ".status.recoveryWindow.start"
    ),
    printcolumn(name = "Kept", type_ = "integer", json_path = ".status.backupsKept"),
    printcolumn(
        name = "Last pass",
        type_ = "date",
        json_path = ".status.lastRetentionRunTime"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("!has(self.retention) || has(self.objectStore)").message("a retention policy requires spec.objectStore (where the backups are)"))]
#[serde(rename_all = "camelCase")]
pub struct BackupPolicySpec {
    /// The cluster directory inside the store (`<path>/<cluster>/…`). Defaults to
    /// `metadata.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Where backups are stored. Required when `retention` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_store: Option<ObjectStoreSpec>,
    /// What to keep. Rules are a union: a backup is kept if any rule keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionSpec>,
    /// How often the retention pass runs: `<n>s`, `<n>m` (minutes) or `<n>h`; default `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::interval::RETENTION_INTERVAL_RULE).message(crate::interval::RETENTION_INTERVAL_MESSAGE))]
    #[schemars(length(max = 24))]
    pub retention_interval: Option<String>,
    /// What deleting a Backup object does to its remote data. Default `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<DeletionPolicy>,
    /// The default time to live of the backups this policy takes (seed 004's
    /// `backupSpec.ttl`): `<n>d`, `<n>w` or `<n>mo`. A ScheduledBackup without its own
    /// `ttl`, and `kubectl tidemark backup` without `--ttl`, give their Backups this one
    /// (written into each Backup's `spec.ttl` when it is created); a Backup applied by hand
    /// takes only its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub ttl: Option<String>,
    /// IANA time zone for calendar buckets (keepDaily…) and schedules. Default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// Ship the server's binlogs: from its binlog index file (`tidemark run` on the
    /// database's machine) or over the network as a replica client (the operator runs an
    /// archiver Deployment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binlog_archive: Option<BinlogArchiveSpec>,
    /// How the operator reaches the database: its pods, container and data volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceSpec>,
    /// Compute resources of the containers the operator runs for this policy (operator
    /// only), e.g. for a namespace whose ResourceQuota requires requests or limits. None
    /// is set unless given here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<PodResources>,
    /// The default `backupHistory` of the ScheduledBackups that name this policy (operator
    /// only): how many of the Backups a schedule generated stay once retention removed
    /// their data. A schedule's own `backupHistory` wins. Backups created by hand are
    /// never deleted by Tidemark (seed 000). Default: 10 successful, 3 failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_history: Option<BackupHistory>,
    /// Restore tests (issue 19 §4): on this schedule, the newest (or a random) point of the
    /// recovery window is restored into scratch space, MariaDB is started on it, `CHECK
    /// TABLE` runs on every table and `query` (if given) must print `expect`; the outcome
    /// is recorded beside the backup restored (`_restoretest.json`). `tidemark run` runs it
    /// in-process; the operator as a Job in the database image, reporting in
    /// `status.restoreTest`, the Backup's status, an event and a metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_test: Option<RestoreTestSpec>,
    /// Verification (operator): on `schedule`, and whenever the annotation
    /// `tidemark.io/verify` takes a value not yet acted on, the newest backup, its chain and
    /// the binlogs a restore from it replays are read back whole and checked against their
    /// recorded sizes and checksums (what `tidemark verify` does), reported in
    /// `status.verification`, an event and a metric. The annotation works without this
    /// field too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifySpec>,
    /// Copies of the backups and binlog segments in other stores (another region, provider
    /// or account), each with its own retention and lock (issue 44): committed objects are
    /// copied as stored (ciphertext stays ciphertext), whole chains in order, committed
    /// last; nothing deleted from this store is deleted from a copy because of it, and this
    /// store's retention keeps what a copy has not received yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub copies: Vec<CopySpec>,
    /// Hold this store's transfers (backups pushed, binlogs archived, fetches) to this
    /// rate, e.g. `50MiB/s` (B, KB, MB, GB, KiB, MiB, GiB per second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(tidemark_core::rate::RATE_RULE).message(tidemark_core::rate::RATE_FORM))]
    pub bandwidth: Option<String>,
}

/// A second store holding a copy of the policy's backups and binlog segments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopySpec {
    /// The copy's name, unique in the policy (`restore --from-copy NAME`, a Restore's
    /// `from`, metrics): lower-case letters, digits and `-`.
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), length(max = 63))]
    pub name: String,
    /// Where the copy is: any backend (`s3`, `gs`, `az`, `file`), with its own
    /// credentials Secret. The cluster directory is the policy's.
    pub object_store: ObjectStoreSpec,
    /// The copy's own retention rules; absent: the policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionSpec>,
    /// The copy's own object lock (else `objectStore.objectLock`); its period defaults to
    /// the copy's retention window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_lock: Option<ObjectLockSpec>,
    /// How far the copy may fall behind the policy's store before it is loud (condition
    /// `CopiesCurrent=False` with reason `CopyBehind`, a `CopyBehind` event, the alert
    /// `TidemarkCopyBehind`): default `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::interval::COPY_MAX_LAG_RULE).message(crate::interval::COPY_MAX_LAG_MESSAGE))]
    pub max_lag: Option<String>,
    /// Hold the copy's transfers to this rate, e.g. `50MiB/s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(tidemark_core::rate::RATE_RULE).message(tidemark_core::rate::RATE_FORM))]
    pub bandwidth: Option<String>,
    /// Verification of the copy (operator), as `spec.verify` is of the policy's store: on
    /// this schedule, and whenever the policy's `tidemark.io/verify` annotation takes a
    /// new value (which asks every store), the copy's newest backup, its chain and the
    /// binlogs a restore from it replays are read back from the copy and checked, reported
    /// in `status.verification.copies`, an event and the metric
    /// `tidemark_copy_verification_passed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifySpec>,
    /// Restore tests of the copy (operator), as `spec.restoreTest` of the policy's store:
    /// on this schedule a Job in the database image restores the copy's newest (or a
    /// random) point from the copy's store, starts MariaDB on it and checks every table
    /// and the query, reported in `status.restoreTest.copies`, an event and the metric
    /// `tidemark_copy_restore_test_passed`. One test at a time per policy, whichever store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_test: Option<RestoreTestSpec>,
}

/// Most copies one policy names.
pub const MAX_COPIES: usize = 4;

impl CopySpec {
    /// The copy's lock (`objectLock`, else `objectStore.objectLock`), its period defaulting
    /// to the copy's window (else the policy's).
    ///
    /// # Errors
    /// As [`BackupPolicySpec::object_lock`].
    pub fn object_lock(
        &self,
        policy: &BackupPolicySpec,
    ) -> Result<Option<tidemark_core::lock::ObjectLock>, PolicyFileError> {
        let lock = self
            .object_lock
            .as_ref()
            .or(self.object_store.object_lock.as_ref());
        let window = self
            .retention
            .as_ref()
            .or(policy.retention.as_ref())
            .and_then(|r| r.window.as_ref());
        lock_of(lock, window, "spec.copies[].objectLock")
    }

    /// The copy's retention rules: its own, else the policy's.
    pub fn retention<'a>(&'a self, policy: &'a BackupPolicySpec) -> Option<&'a RetentionSpec> {
        self.retention.as_ref().or(policy.retention.as_ref())
    }

    /// `maxLag`, or its default.
    ///
    /// # Errors
    /// A value outside the grammar or the bounds.
    pub fn max_lag(&self) -> Result<jiff::SignedDuration, PolicyFileError> {
        crate::interval::COPY_MAX_LAG
            .parse(self.max_lag.as_deref())
            .map_err(PolicyFileError::Interval)
    }

    /// `bandwidth`, when set.
    ///
    /// # Errors
    /// Not a rate.
    pub fn bandwidth(&self) -> Result<Option<tidemark_core::rate::Rate>, PolicyFileError> {
        rate("spec.copies[].bandwidth", self.bandwidth.as_deref())
    }
}

/// A rate field, when set.
fn rate(
    field: &'static str,
    value: Option<&str>,
) -> Result<Option<tidemark_core::rate::Rate>, PolicyFileError> {
    value
        .map(|v| {
            v.parse().map_err(
                |e: tidemark_core::rate::RateError| PolicyFileError::Invalid {
                    field,
                    problem: e.to_string(),
                },
            )
        })
        .transpose()
}

/// When a policy's store is read back and how much of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerifySpec {
    /// Six-field cron, seconds first, in the policy's `timeZone`, e.g. `0 30 3 * * *`, or
    /// a macro (`@daily`, …); five fields are refused.
    /// Without it, verification runs on demand only (the `tidemark.io/verify` annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new(crate::cron::CRON_RULE).message(crate::cron::CRON_MESSAGE))]
    pub schedule: Option<String>,
    /// The percentage of the other backups and binlog segments also read each time, drawn
    /// anew each time (`tidemark verify --sample`): 0 (the default) to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub sample_percent: Option<u8>,
}

impl VerifySpec {
    /// The schedule (if any) and the fraction sampled.
    ///
    /// # Errors
    /// A schedule that is not cron (six fields or a macro), or a percentage over 100.
    pub fn settings(
        &self,
    ) -> Result<(Option<tidemark_core::schedule::Cron>, f64), PolicyFileError> {
        let cron = self
            .schedule
            .as_deref()
            .map(|s| {
                s.parse::<tidemark_core::schedule::Cron>()
                    .map_err(|e| PolicyFileError::Invalid {
                        field: "spec.verify.schedule",
                        problem: e.to_string(),
                    })
            })
            .transpose()?;
        let percent = self.sample_percent.unwrap_or(0);
        if percent > 100 {
            return Err(PolicyFileError::Invalid {
                field: "spec.verify.samplePercent",
                problem: format!("{percent} is out of range; expected 0 to 100"),
            });
        }
        Ok((cron, f64::from(percent) / 100.0))
    }
}

/// The most bytes of a restore test's query or expected result.
pub const MAX_RESTORE_TEST_TEXT: usize = 65_536;

/// On a BackupPolicy, an RFC 3339 instant: the archive's branch segments (off the main
/// line, left by a new timeline) whose last event is at or before it were looked at and
/// may go by the ordinary rule; later ones are kept for `retention.window`, or, without
/// one, until acknowledged (`tidemark plan|gc --acknowledge-branches`). Read by the
/// operator, `tidemark run` and `plan|gc --policy`.
pub const ACKNOWLEDGE_BRANCHES_ANNOTATION: &str = "tidemark.io/acknowledge-branches";

/// The instant [`ACKNOWLEDGE_BRANCHES_ANNOTATION`] gives in `annotations`, if any.
///
/// # Errors
/// Not an RFC 3339 instant (the value cut, the accepted form).
pub fn branches_acknowledged(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<Option<jiff::Timestamp>, String> {
    instant_annotation(annotations, ACKNOWLEDGE_BRANCHES_ANNOTATION)
}

/// The acknowledgement of mass deletions (DESIGN.md §5.5): the deletion guard releases the
/// deletions it first held at or before this instant, and no later wave. Read by the
/// operator and `plan|gc --policy` (beside `--allow-mass-deletion`).
pub const ALLOW_DELETIONS_BEFORE_ANNOTATION: &str = "tidemark.io/allow-deletions-before";

/// The instant [`ALLOW_DELETIONS_BEFORE_ANNOTATION`] gives in `annotations`, if any.
///
/// # Errors
/// Not an RFC 3339 instant (the value cut, the accepted form).
pub fn deletions_allowed_before(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<Option<jiff::Timestamp>, String> {
    instant_annotation(annotations, ALLOW_DELETIONS_BEFORE_ANNOTATION)
}

fn instant_annotation(
    annotations: &std::collections::BTreeMap<String, String>,
    key: &str,
) -> Result<Option<jiff::Timestamp>, String> {
    annotations
        .get(key)
        .map(|at| {
            at.parse().map_err(|_| {
                format!(
                    "metadata.annotations[{key:?}]: {:?} is not an instant; expected RFC 3339, e.g. 2026-11-29T12:00:00Z",
                    at.chars().take(64).collect::<String>()
                )
            })
        })
        .transpose()
}

/// When and how a policy's backups are proven restorable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreTestSpec {
    /// Six-field cron, seconds first, in the policy's `timeZone`, e.g. `0 0 4 * * SUN`, or
    /// a macro (`@weekly`, …); five fields are refused.
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new(crate::cron::CRON_RULE).message(crate::cron::CRON_MESSAGE))]
    pub schedule: String,
    /// `newest` (the default: the latest restorable instant) or `random` (an instant of the
    /// recovery window chosen at random each time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(newest|random)$"))]
    pub target: Option<String>,
    /// A query run on the restored server, e.g. `SELECT COUNT(*) > 0 FROM shop.orders`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub query: Option<String>,
    /// The query's expected output (tab-separated columns, a line per row); without it the
    /// query only has to succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub expect: Option<String>,
    /// How the restore replays binlogs (MariaDB): `applier` (the default: row transactions
    /// through the private server's replication applier, the rest through `mariadb-binlog
    /// | mariadb`) or `client` (everything through `mariadb-binlog | mariadb`, the
    /// fallback): `tidemark restore-test --replay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(applier|client)$"))]
    pub replay: Option<String>,
}

/// `spec.restoreTest.replay` and a Restore's `spec.replay`: `None` (the default, the
/// applier) or the value checked, for `--replay`.
///
/// # Errors
/// A value other than `applier` or `client`, named with the accepted forms.
pub fn replay_of<'a>(
    field: &'static str,
    value: Option<&'a str>,
) -> Result<Option<&'a str>, PolicyFileError> {
    match value {
        None => Ok(None),
        Some(v @ ("applier" | "client")) => Ok(Some(v)),
        Some(other) => Err(PolicyFileError::Invalid {
            field,
            problem: format!(
                "{:?} is not a way to replay; expected applier or client",
                other.chars().take(40).collect::<String>()
            ),
        }),
    }
}

impl RestoreTestSpec {
    /// The schedule, and whether the point is chosen at random.
    ///
    /// # Errors
    /// A schedule that is not cron (six fields or a macro), an unknown target, a text too long, or
    /// `expect` without `query`.
    pub fn settings(&self) -> Result<(tidemark_core::schedule::Cron, bool), PolicyFileError> {
        let cron = self
            .schedule
            .parse::<tidemark_core::schedule::Cron>()
            .map_err(|e| PolicyFileError::Invalid {
                field: "spec.restoreTest.schedule",
                problem: e.to_string(),
            })?;
        let random = match self.target.as_deref() {
            None | Some("newest") => false,
            Some("random") => true,
            Some(other) => {
                return Err(PolicyFileError::Invalid {
                    field: "spec.restoreTest.target",
                    problem: format!(
                        "{:?} is not a target; expected newest or random",
                        other.chars().take(40).collect::<String>()
                    ),
                });
            }
        };
        replay_of("spec.restoreTest.replay", self.replay.as_deref())?;
        for (field, text) in [
            ("spec.restoreTest.query", &self.query),
            ("spec.restoreTest.expect", &self.expect),
        ] {
            if text
                .as_ref()
                .is_some_and(|t| t.len() > MAX_RESTORE_TEST_TEXT)
            {
                return Err(PolicyFileError::Invalid {
                    field,
                    problem: format!("longer than {MAX_RESTORE_TEST_TEXT} bytes"),
                });
            }
        }
        if self.expect.is_some() && self.query.is_none() {
            return Err(PolicyFileError::Invalid {
                field: "spec.restoreTest.expect",
                problem: "an expected result needs spec.restoreTest.query".into(),
            });
        }
        Ok((cron, random))
    }
}

/// Which Backup objects a ScheduledBackup generated stay once they only record the past
/// (seed 000: "It does not delete Backup Kubernetes objects, only object-store artifacts.
/// Pruning expired Backup CRs stays the scheduler/owner-ref's job"): the scheduler deletes
/// its own Backups whose data retention removed (`status.dataRemoved`), and its failed
/// ones, beyond these limits — successful and failed counted apart,
/// as a CronJob's `successfulJobsHistoryLimit` and `failedJobsHistoryLimit`. On a
/// BackupPolicy it is the default of the ScheduledBackups naming it. A Backup created by
/// hand is never deleted by Tidemark.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupHistory {
    /// At most this many successful ones, the most recently removed (0–10000; default 10;
    /// 0 deletes each once its data is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 10000))]
    pub limit: Option<u32>,
    /// At most this many failed ones, the most recent (0–10000; default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 10000))]
    pub failed_limit: Option<u32>,
    /// None whose data was removed (or, failed, that ended) longer ago than this
    /// (`<n>d|<n>w|<n>mo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub max_age: Option<String>,
}

/// The default [`BackupHistory::limit`].
pub const DEFAULT_HISTORY_LIMIT: u32 = 10;
/// The default [`BackupHistory::failed_limit`].
pub const DEFAULT_FAILED_HISTORY_LIMIT: u32 = 3;
/// The largest [`BackupHistory::limit`] and [`BackupHistory::failed_limit`].
pub const MAX_HISTORY_LIMIT: u32 = 10_000;

/// A [`BackupHistory`] read: how many successful and failed objects stay, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    pub succeeded: u32,
    pub failed: u32,
    pub max_age: Option<tidemark_core::RetentionDuration>,
}

impl HistoryLimits {
    /// Without a `backupHistory`: 10 successful, 3 failed, no age.
    pub const DEFAULT: HistoryLimits = HistoryLimits {
        succeeded: DEFAULT_HISTORY_LIMIT,
        failed: DEFAULT_FAILED_HISTORY_LIMIT,
        max_age: None,
    };
}

impl BackupHistory {
    /// The limits, and the age parsed.
    ///
    /// # Errors
    /// The field (`spec.backupHistory.…`, on a policy and a schedule alike) and what is
    /// wrong with it.
    pub fn settings(&self) -> Result<HistoryLimits, (&'static str, String)> {
        let bounded = |field: &'static str, value: Option<u32>, default: u32| {
            let n = value.unwrap_or(default);
            if n > MAX_HISTORY_LIMIT {
                return Err((
                    field,
                    format!("{n} is out of range; expected 0 to {MAX_HISTORY_LIMIT}"),
                ));
            }
            Ok(n)
        };
        let succeeded = bounded(
            "spec.backupHistory.limit",
            self.limit,
            DEFAULT_HISTORY_LIMIT,
        )?;
        let failed = bounded(
            "spec.backupHistory.failedLimit",
            self.failed_limit,
            DEFAULT_FAILED_HISTORY_LIMIT,
        )?;
        let max_age = self
            .max_age
            .as_deref()
            .map(|a| {
                a.parse::<tidemark_core::RetentionDuration>()
                    .map_err(|e| ("spec.backupHistory.maxAge", e.to_string()))
            })
            .transpose()?;
        Ok(HistoryLimits {
            succeeded,
            failed,
            max_age,
        })
    }
}

/// The resources of each kind of container the operator creates (`requests`, `limits`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodResources {
    /// The init container that copies `tidemark` into every pod below (and into a method
    /// `job` template's pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<Resources>,
    /// The container of a backup Job (methods mariabackup and xtrabackup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Resources>,
    /// The container of a consolidation Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidation: Option<Resources>,
    /// The binlog archiver Deployment's container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archiver: Option<Resources>,
}

/// A container's `requests` and `limits` (`cpu`, `memory`, `ephemeral-storage`), as
/// Kubernetes quantities (`100m`, `512Mi`, `2`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "any_quantities"
    )]
    pub requests: Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "any_quantities"
    )]
    pub limits: Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
}

/// A map of quantities, read from any JSON values: a number or a string is the quantity
/// it spells, anything else (an object, a list, `true`, `null`) its JSON text, cut to 65
/// bytes — never a quantity, so that `validate` refuses it with its field. The CRDs for
/// API servers before 1.25 ([`crate::crd::without_cel`]) let any value through (v1.20's
/// server-side apply cannot model an int-or-string field); one tenant's such value must fail
/// its own object, not the watch of every object of the kind.
fn any_quantities<'de, D>(
    deserializer: D,
) -> Result<
    Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
    D::Error,
>
where
    D: serde::Deserializer<'de>,
{
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let values =
        Option::<std::collections::BTreeMap<String, serde_json::Value>>::deserialize(deserializer)?;
    Ok(values.map(|values| {
        values
            .into_iter()
            .map(|(name, value)| {
                let text = match value {
                    serde_json::Value::String(s) => s,
                    serde_json::Value::Number(n) => n.to_string(),
                    other => cut(&other.to_string(), 65).to_owned(),
                };
                (name, Quantity(text))
            })
            .collect()
    }))
}

/// `s` cut to at most `max` bytes (at a character's boundary): longer than any quantity or
/// resource name, so what is shown of a value is still refused, and bounded.
fn cut(s: &str, max: usize) -> &str {
    &s[..s.floor_char_boundary(max)]
}

/// The resource names a container may ask for.
const RESOURCE_NAMES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// Whether `q` is a Kubernetes quantity: a decimal number with an optional binary (`Ki`
/// … `Ei`), decimal (`m`, `k`, `M` … `E`) or exponent (`e3`) suffix.
fn is_quantity(q: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let unsigned = q.strip_prefix(['+', '-']).unwrap_or(q);
    let end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(end);
    let number_ok = match number.split_once('.') {
        None => digits(number),
        Some((a, b)) => {
            (digits(a) || a.is_empty())
                && (digits(b) || b.is_empty())
                && !(a.is_empty() && b.is_empty())
        }
    };
    let suffix_ok = matches!(
        suffix,
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "m" | "k" | "M" | "G" | "T" | "P" | "E"
    ) || suffix
        .strip_prefix(['e', 'E'])
        .is_some_and(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)));
    q.len() <= 64 && number_ok && suffix_ok
}

impl Resources {
    /// As a container's resources.
    pub fn to_requirements(&self) -> k8s_openapi::api::core::v1::ResourceRequirements {
        k8s_openapi::api::core::v1::ResourceRequirements {
            requests: self.requests.clone(),
            limits: self.limits.clone(),
            claims: None,
        }
    }

    fn validate(&self, field: &'static str) -> Result<(), PolicyFileError> {
        for map in [&self.requests, &self.limits].into_iter().flatten() {
            for (name, q) in map {
                if !RESOURCE_NAMES.contains(&name.as_str()) {
                    return Err(PolicyFileError::Invalid {
                        field,
                        problem: format!(
                            "unknown resource {:?}; expected {}",
                            cut(name, 65),
                            RESOURCE_NAMES.join(", ")
                        ),
                    });
                }
                if !is_quantity(&q.0) {
                    return Err(PolicyFileError::Invalid {
                        field,
                        problem: format!(
                            "{name}: {:?} is not a quantity; expected e.g. 100m, 0.5, 512Mi, 2Gi",
                            cut(&q.0, 65)
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

impl PodResources {
    /// Every resource a known one and every value a quantity.
    ///
    /// # Errors
    /// The first that is not, with its field.
    pub fn validate(&self) -> Result<(), PolicyFileError> {
        for (field, r) in [
            ("spec.resources.install", &self.install),
            ("spec.resources.backup", &self.backup),
            ("spec.resources.consolidation", &self.consolidation),
            ("spec.resources.archiver", &self.archiver),
        ] {
            if let Some(r) = r {
                r.validate(field)?;
            }
        }
        Ok(())
    }
}

/// A key of a Secret of the object's namespace, as a pod's `secretKeyRef` names one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(pattern(crate::names::SUBDOMAIN_PATTERN), length(max = 253))]
    pub name: String,
    /// The key of its data.
    #[schemars(pattern(crate::names::SECRET_KEY_PATTERN), length(max = 253))]
    pub key: String,
}

impl SecretKeyRef {
    pub fn new(name: &str, key: &str) -> Self {
        Self {
            name: name.to_owned(),
            key: key.to_owned(),
        }
    }

    /// Its name and key are a Secret's name and a key (`name_field` and `key_field` name
    /// them in an error).
    ///
    /// # Errors
    /// Either is not.
    pub fn validate(
        &self,
        name_field: &'static str,
        key_field: &'static str,
    ) -> Result<(), crate::names::NameError> {
        crate::names::dns_subdomain(name_field, &self.name)?;
        crate::names::secret_key(key_field, &self.key)
    }
}

impl std::fmt::Display for SecretKeyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "key {:?} of Secret {}", self.key, self.name)
    }
}

/// Where the database login is: each of the user and the password by reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    pub user: SecretKeyRef,
    pub password: SecretKeyRef,
    /// The fields they come from (`spec.source.usernameFrom`, or
    /// `spec.source.credentialsSecret` for its default key), for messages.
    pub user_field: &'static str,
    pub password_field: &'static str,
}

/// The database pods a Backup runs against (operator only).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.credentialsSecret) || has(self.usernameFrom) == has(self.passwordFrom)").message("set passwordFrom with usernameFrom (or credentialsSecret for the other)"))]
pub struct SourceSpec {
    /// Selects the database pods (same namespace).
    pub selector: LabelSelector,
    /// The database container, whose image runs the backup tool. Default: the pod's first
    /// container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::LABEL_PATTERN), length(max = 63))]
    pub container: Option<String>,
    /// The pod volume holding the data directory. Default: the volume mounted at
    /// `/var/lib/mysql` in the database container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::LABEL_PATTERN), length(max = 63))]
    pub data_volume: Option<String>,
    /// The port the database listens on in its pod (default 3306); the backup tool
    /// connects to the chosen pod's IP on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Pod label whose value `primary` marks the primary; any other value marks a standby.
    /// Default `tidemark.io/role`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::LABEL_KEY_PATTERN), length(max = 317))]
    pub role_label: Option<String>,
    /// Secret with the database credentials the backup tool uses (`username`, `password`
    /// keys); passed to the Job as environment, never as arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SUBDOMAIN_PATTERN), length(max = 253))]
    pub credentials_secret: Option<String>,
    /// The database user by reference (`{name, key}`), e.g. the Secret another operator
    /// made: instead of `credentialsSecret`'s key `username`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username_from: Option<SecretKeyRef>,
    /// The database password by reference (`{name, key}`): instead of
    /// `credentialsSecret`'s key `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_from: Option<SecretKeyRef>,
    /// Retention deletes only while the cluster has an established primary: a selected pod
    /// labelled primary (or the only selected pod, when none carries the role label) that
    /// has been Running and Ready for this long (`<n>s|<n>m|<n>h`, 1s to 24h; default
    /// `5m`). Otherwise — an outage, a failover, a bootstrap — no pass runs
    /// (`Ready=False`, `NoEstablishedPrimary`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::interval::PRIMARY_READY_FOR_RULE).message(crate::interval::PRIMARY_READY_FOR_MESSAGE))]
    #[schemars(length(max = 24))]
    pub primary_ready_for: Option<String>,
    /// With target `prefer-standby`: the most a standby may lag behind its primary to be
    /// backed up (`<n>s|<n>m|<n>h`, 1s to 24h). Each Ready standby is asked (`mariadb` in
    /// its database container through `pods/exec`, logging in with the source's login):
    /// one that does not replicate (stopped or broken) or lags more is skipped, and when
    /// none is fit the primary is backed up — the Backup's status says which and why.
    /// Without it, standbys are still asked when they can be (a login set, exec allowed)
    /// and one that does not replicate is skipped, whatever its lag; without a login
    /// (`credentialsSecret`, or `usernameFrom` and `passwordFrom`), standbys are chosen by
    /// their role label and readiness alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::interval::BINLOG_MAX_LAG_RULE).message(crate::interval::BINLOG_MAX_LAG_MESSAGE))]
    #[schemars(length(max = 24))]
    pub standby_max_lag: Option<String>,
    /// The database: `mariadb` (default) or `mysql` (MySQL 8.0.17 or newer): a MySQL
    /// source is backed up with method `mysql-clone` (its default) or `mysqldump`, over TCP
    /// from the chosen pod, in the database container's image (which must hold MySQL's
    /// `mysqld` and `mysql`); its binlogs are read with MySQL's programs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ENGINES))]
    pub engine: Option<String>,
}

/// The databases a source may be (`source.engine`).
pub const ENGINES: [&str; 2] = ["mariadb", "mysql"];

impl SourceSpec {
    /// `engine: mysql`.
    pub fn is_mysql(&self) -> bool {
        self.engine.as_deref() == Some("mysql")
    }

    /// `standbyMaxLag`, when set.
    ///
    /// # Errors
    /// Not a duration from 1s to 24h.
    pub fn standby_max_lag(&self) -> Result<Option<jiff::SignedDuration>, PolicyFileError> {
        self.standby_max_lag
            .as_deref()
            .map(|v| {
                crate::interval::STANDBY_MAX_LAG
                    .parse(Some(v))
                    .map_err(PolicyFileError::Interval)
            })
            .transpose()
    }

    /// How long the primary must have been Ready before retention deletes.
    ///
    /// # Errors
    /// Not an interval from 1s to 24h.
    pub fn primary_ready_for(&self) -> Result<jiff::SignedDuration, PolicyFileError> {
        crate::interval::PRIMARY_READY_FOR
            .parse(self.primary_ready_for.as_deref())
            .map_err(PolicyFileError::Interval)
    }
}

/// What the last retention pass found and did (operator).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupPolicyStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the last retention pass finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_retention_run_time: Option<Time>,
    /// When the next retention pass is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_retention_run_time: Option<Time>,
    /// The span any instant of which can be restored, as of the last pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_window: Option<RecoveryWindowStatus>,
    /// Restorable backups kept by the last pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backups_kept: Option<u64>,
    /// Backups deleted by the last pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backups_deleted: Option<u64>,
    /// Binlog segments deleted by the last pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments_deleted: Option<u64>,
    /// Deletions and consolidations the last pass could not do (`Ready=False`,
    /// `PassPartlyFailed`; retried with backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u64>,
    /// Bytes the last pass freed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_freed: Option<u64>,
    /// `Ready` (the last retention pass succeeded); `BinlogArchiveCurrent` (the binlog
    /// archive is within `spec.binlogArchive.maxLag` of the server); `CopiesCurrent` (every
    /// copy within its `maxLag`). A map by `type`: each writer owns its own (server-side
    /// apply).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::maplist::nullable"
    )]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"], "nullable" = true))]
    pub conditions: Vec<Condition>,
    /// Restore tests (`spec.restoreTest`), written by their own controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_test: Option<RestoreTestStatus>,
    /// Verification (`spec.verify`, the `tidemark.io/verify` annotation), written by its
    /// own writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<VerificationStatus>,
    /// The log archive's timelines as of the last pass: one per primary, each switch
    /// (when, from which server to which), what a failover lost (a branch) and any GTIDs
    /// missing at a switch. Absent while the archive has one timeline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timelines: Vec<TimelineStatus>,
    /// The binlog archive against the server it reads, as its archiver last reported
    /// (written by its own watch, with the `BinlogArchiveCurrent` condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binlog_archive: Option<BinlogArchiveStatus>,
    /// Each copy (`spec.copies`): its last pass, its recovery window and how far it is
    /// behind this store (written by the copies' own writer, with the `CopiesCurrent`
    /// condition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<CopyStatus>,
    /// `spec.retention` as the last whole pass applied it: a spec that differs from it is
    /// a change, previewed (`policyChange`) before the next pass acts on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_retention: Option<RetentionSpec>,
    /// The last change of `spec.retention`, previewed before a pass acted on it (issue 45
    /// §2; its own field manager `tidemark-operator-policy-change`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_change: Option<PolicyChangeStatus>,
}

/// A change of `spec.retention`, as previewed against the retention the last pass applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyChangeStatus {
    /// The spec's generation previewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    pub previewed_at: Time,
    /// Backups the new retention deletes that the applied one keeps, and the first of them
    /// (`<backup-name>/<backup-id>`).
    pub newly_deleted: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backups: Vec<String>,
    /// Backups the new retention keeps that the applied one deletes.
    pub newly_kept: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_window_before: Option<RecoveryWindowStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_window_after: Option<RecoveryWindowStatus>,
    /// Spans that restore at every instant now and will not (the first few).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<GapStatus>,
    /// The same, for people (also the `PolicyChangePreview` event's note).
    pub message: String,
}

/// Where one copy stands.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopyStatus {
    pub name: String,
    /// When the last copy pass ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_copy_time: Option<Time>,
    /// The newest restorable instant in the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_through: Option<Time>,
    /// How far the copy is behind this store, in seconds (also the
    /// `tidemark_copy_lag_seconds` metric).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<i64>,
    /// Whether the copy is more than `maxLag` behind, or its last pass failed.
    pub behind: bool,
    /// The copy's own recovery window, as of its last pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_window: Option<RecoveryWindowStatus>,
    /// What the last pass sent.
    #[serde(default)]
    pub backups_sent: u64,
    #[serde(default)]
    pub segments_sent: u64,
    #[serde(default)]
    pub bytes_sent: u64,
    /// When the copy's own retention pass last ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_retention_run_time: Option<Time>,
    /// Why the last pass failed, or what it could not send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where the binlog archive stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BinlogArchiveStatus {
    /// The server the archiver reads (its server id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<u32>,
    /// The timeline that server's binlog goes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    /// The newest archived event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived_through: Option<Time>,
    /// Whether the archive is behind by more than `spec.binlogArchive.maxLag` (or its
    /// archiver has stopped reporting). The lag itself is the
    /// `tidemark_binlog_archive_lag_seconds` metric.
    pub behind: bool,
}

/// One timeline of the log archive: the binlog one server wrote as primary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimelineStatus {
    pub id: u32,
    /// The server that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<u32>,
    /// The timeline it continues (the previous primary's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<u32>,
    /// The last transaction it shares with its parent (GTID position): the switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_gtid: Option<String>,
    /// When the parent's history ends on the main line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switched_at: Option<Time>,
    /// GTIDs missing from the archive at the switch (a gap in the recovery window).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// The switch joins nothing: the histories share no transaction (a binlog that
    /// started over), so the recovery window has a gap there until the next backup.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unrelated: bool,
    /// The parent's transactions after the switch, lost in the failover and never
    /// replayed on this timeline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branch: Vec<String>,
    /// Whether replay to the newest instants passes through it.
    pub main_line: bool,
    pub segments: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event_at: Option<Time>,
}

/// Where a policy's restore tests are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreTestStatus {
    /// The slot of the last test started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,
    /// The Job of the test running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The last outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<RestoreTestResult>,
    /// The last value of the `tidemark.io/restore-test` annotation acted on: a new value
    /// runs one test of the policy's own store now, with or without `spec.restoreTest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Each copy's restore tests (`spec.copies[].restoreTest`), restored from the copy's
    /// own store.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<CopyRestoreTestStatus>,
}

/// Where one copy's restore tests are: the fields of [`RestoreTestStatus`], for the copy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopyRestoreTestStatus {
    /// The copy (`spec.copies[].name`).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<RestoreTestResult>,
}

impl RestoreTestStatus {
    /// The restore tests of one store: the policy's own (`None`) or its copy `copy`, as a
    /// status of its own (no copies).
    pub fn of(&self, copy: Option<&str>) -> RestoreTestStatus {
        match copy {
            None => RestoreTestStatus {
                copies: Vec::new(),
                ..self.clone()
            },
            Some(name) => self
                .copies
                .iter()
                .find(|c| c.name == name)
                .map(|c| RestoreTestStatus {
                    last_schedule_time: c.last_schedule_time.clone(),
                    next_schedule_time: c.next_schedule_time.clone(),
                    job: c.job.clone(),
                    last: c.last.clone(),
                    request: None,
                    copies: Vec::new(),
                })
                .unwrap_or_default(),
        }
    }

    /// This status with the restore tests of one store (`copy`: `None` for the policy's
    /// own) replaced by `one`; copies not in `named` (the policy's copies now) are dropped.
    pub fn with(&self, copy: Option<&str>, one: RestoreTestStatus, named: &[&str]) -> Self {
        let (mut out, entry) = match copy {
            None => (
                RestoreTestStatus {
                    copies: self.copies.clone(),
                    ..one
                },
                None,
            ),
            Some(name) => (
                self.clone(),
                Some(CopyRestoreTestStatus {
                    name: name.to_owned(),
                    last_schedule_time: one.last_schedule_time,
                    next_schedule_time: one.next_schedule_time,
                    job: one.job,
                    last: one.last,
                }),
            ),
        };
        per_copy(&mut out.copies, entry, |c| &c.name, named);
        out
    }
}

/// A per-copy status list with `entry` in place of the one of its name (or added), the
/// entries of copies not in `named` dropped, in name order.
fn per_copy<T>(list: &mut Vec<T>, entry: Option<T>, name: fn(&T) -> &String, named: &[&str]) {
    if let Some(entry) = entry {
        match list.iter_mut().find(|c| name(c) == name(&entry)) {
            Some(c) => *c = entry,
            None => list.push(entry),
        }
    }
    list.retain(|c| named.contains(&name(c).as_str()));
    list.sort_by(|a, b| name(a).cmp(name(b)));
}

/// Where a policy's verification is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerificationStatus {
    /// The slot of the last scheduled verification started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,
    /// The last value of the `tidemark.io/verify` annotation acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// The last outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<VerificationResult>,
    /// Each copy's verification (`spec.copies[].verify`, and the annotation), read from
    /// the copy's own store.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<CopyVerificationStatus>,
}

/// Where one copy's verification is: the fields of [`VerificationStatus`], for the copy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopyVerificationStatus {
    /// The copy (`spec.copies[].name`).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<VerificationResult>,
}

impl VerificationStatus {
    /// The verification of one store: the policy's own (`None`) or its copy `copy`, as a
    /// status of its own (no copies).
    pub fn of(&self, copy: Option<&str>) -> VerificationStatus {
        match copy {
            None => VerificationStatus {
                copies: Vec::new(),
                ..self.clone()
            },
            Some(name) => self
                .copies
                .iter()
                .find(|c| c.name == name)
                .map(|c| VerificationStatus {
                    last_schedule_time: c.last_schedule_time.clone(),
                    next_schedule_time: c.next_schedule_time.clone(),
                    request: c.request.clone(),
                    last: c.last.clone(),
                    copies: Vec::new(),
                })
                .unwrap_or_default(),
        }
    }

    /// This status with the verification of one store (`copy`: `None` for the policy's
    /// own) replaced by `one`; copies not in `named` (the policy's copies now) are dropped.
    pub fn with(&self, copy: Option<&str>, one: VerificationStatus, named: &[&str]) -> Self {
        let (mut out, entry) = match copy {
            None => (
                VerificationStatus {
                    copies: self.copies.clone(),
                    ..one
                },
                None,
            ),
            Some(name) => (
                self.clone(),
                Some(CopyVerificationStatus {
                    name: name.to_owned(),
                    last_schedule_time: one.last_schedule_time,
                    next_schedule_time: one.next_schedule_time,
                    request: one.request,
                    last: one.last,
                }),
            ),
        };
        per_copy(&mut out.copies, entry, |c| &c.name, named);
        out
    }
}

/// What one verification found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerificationResult {
    /// When it finished.
    pub verified_at: Time,
    /// Everything read back whole, and the store answered.
    pub passed: bool,
    /// The newest completed backup, read with its chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    /// Backups read back.
    pub backups_checked: u64,
    /// Binlog segments read back.
    pub segments_checked: u64,
    /// Objects not read back whole (missing, damaged, unreadable, unreachable).
    pub problem_count: u64,
    /// The first problems, each naming its object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// A recovery window: restorable from `start` to `end`, except in `gaps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryWindowStatus {
    pub start: Time,
    pub end: Time,
    /// Where the stretch that restores at every instant starts ("point in time from"):
    /// `start` unless `retention.pointInTime.window` keeps snapshots from before it, which
    /// restore to their own points only ("snapshots back to" `start`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point_in_time_start: Option<Time>,
    /// Spans inside the window that cannot be restored (a missing binlog, say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<GapStatus>,
}

impl From<&tidemark_core::RecoveryWindow> for RecoveryWindowStatus {
    fn from(w: &tidemark_core::RecoveryWindow) -> Self {
        RecoveryWindowStatus {
            start: Time(w.from),
            end: Time(w.to),
            point_in_time_start: Some(Time(w.point_in_time_from)),
            gaps: w
                .gaps
                .iter()
                .map(|g| GapStatus {
                    start: Time(g.from),
                    end: Time(g.to),
                })
                .collect(),
        }
    }
}

/// One span that cannot be restored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GapStatus {
    pub start: Time,
    pub end: Time,
}

/// Where the server's binlogs are, and how often to look for closed ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.binlogIndex) != has(self.server)").message("set exactly one of binlogIndex (tidemark run on the database's machine) and server (read over the network)"))]
#[serde(rename_all = "camelCase")]
pub struct BinlogArchiveSpec {
    /// The server's binlog index file, e.g. `/var/lib/mysql/mysql-bin.index` (`tidemark
    /// run` on the database's machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binlog_index: Option<String>,
    /// Read the binlogs over the network as a replica client (`mariadb-binlog
    /// --read-from-remote-server`); the operator runs one archiver Deployment per policy,
    /// logging in with `spec.source.credentialsSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<BinlogServerSpec>,
    /// Pause between passes, e.g. `10s`, `1m` (default `10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::interval::BINLOG_INTERVAL_RULE).message(crate::interval::BINLOG_INTERVAL_MESSAGE))]
    #[schemars(length(max = 24))]
    pub interval: Option<String>,
    /// How far the archive may fall behind the server — the server's newest event against
    /// the newest archived (a file is archived once the server closes it) — before the
    /// policy says so: `BinlogArchiveCurrent=False`, a `BinlogArchiveBehind` event, and the
    /// `tidemark_binlog_archive_lag_seconds` metric an alert can use (default `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::interval::BINLOG_MAX_LAG_RULE).message(crate::interval::BINLOG_MAX_LAG_MESSAGE))]
    #[schemars(length(max = 24))]
    pub max_lag: Option<String>,
    /// Purge the server's binlogs once archived (issue 45 §4; `server` only): `PURGE BINARY
    /// LOGS TO` the newest file the store holds verified, never further. The login needs
    /// `BINLOG ADMIN`. Absent: Tidemark purges nothing (the server's own expiry decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge: Option<BinlogPurgeSpec>,
    /// The restore oracle (issue 48; `server` only): the archiver writes chunked table
    /// checksums on the server on a schedule, which a restore's replay computes again on
    /// its own data, so every restore test compares the restored data with the primary's,
    /// chunk by chunk. The login needs `BINLOG ADMIN`, `SELECT` on the tables checked, and
    /// `CREATE, INSERT, UPDATE, DELETE` on `tidemark_oracle` (docs/database.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksums: Option<BinlogChecksumsSpec>,
}

impl BinlogChecksumsSpec {
    /// The interval between runs.
    ///
    /// # Errors
    /// `every` out of its grammar or bounds.
    pub fn every(&self) -> Result<jiff::SignedDuration, PolicyFileError> {
        crate::interval::CHECKSUMS_EVERY
            .parse(self.every.as_deref())
            .map_err(PolicyFileError::Interval)
    }

    /// Checks every field (API servers before 1.25 have no CEL), naming it.
    ///
    /// # Errors
    /// A field out of bounds, a pattern without `SCHEMA.TABLE`, or no `server`.
    pub fn validate(&self, server: bool) -> Result<(), PolicyFileError> {
        let invalid = |field, problem: String| PolicyFileError::Invalid { field, problem };
        if server && !self.client.is_empty() {
            return Err(invalid(
                "spec.binlogArchive.checksums.client",
                "is for tidemark run (with binlogIndex); with server, the archiver logs in with spec.source".into(),
            ));
        }
        if !server && self.client.is_empty() {
            return Err(invalid(
                "spec.binlogArchive.checksums.client",
                "required with binlogIndex (tidemark run): the mariadb client's connection options, e.g. [--defaults-extra-file=/etc/tidemark/oracle.cnf]".into(),
            ));
        }
        if self.client.len() > 16 {
            return Err(invalid(
                "spec.binlogArchive.checksums.client",
                format!("{} options: at most 16", self.client.len()),
            ));
        }
        if let Some(bad) = self.client.iter().find(|a| {
            !a.starts_with("--")
                || a.len() > 512
                || a.chars().any(char::is_control)
                || a.starts_with("--password")
                || a.starts_with("--passwd")
        }) {
            let name = bad.split('=').next().unwrap_or(bad);
            return Err(invalid(
                "spec.binlogArchive.checksums.client",
                format!(
                    "{:?}: expected --option=value connection options, without a password (put it in an option file: --defaults-extra-file=FILE)",
                    name.chars().take(64).collect::<String>()
                ),
            ));
        }
        self.every()?;
        if self.tables.len() + self.skip.len() > 64 {
            return Err(invalid(
                "spec.binlogArchive.checksums.tables",
                format!(
                    "{} patterns with skip: at most 64",
                    self.tables.len() + self.skip.len()
                ),
            ));
        }
        for (field, patterns) in [
            ("spec.binlogArchive.checksums.tables", &self.tables),
            ("spec.binlogArchive.checksums.skip", &self.skip),
        ] {
            if let Some(p) = patterns
                .iter()
                .find(|p| !p.contains('.') || p.len() > 256 || p.chars().any(char::is_control))
            {
                return Err(invalid(
                    field,
                    format!(
                        "{:?}: expected SCHEMA.TABLE, where * matches any characters (e.g. shop.* or *.audit_log)",
                        p.chars().take(64).collect::<String>()
                    ),
                ));
            }
        }
        if let Some(n) = self.chunk_rows
            && !(100..=1_000_000).contains(&n)
        {
            return Err(invalid(
                "spec.binlogArchive.checksums.chunkRows",
                format!("{n}: expected 100 to 1000000 rows"),
            ));
        }
        if let Some(ms) = self.pause_milliseconds
            && ms > 60_000
        {
            return Err(invalid(
                "spec.binlogArchive.checksums.pauseMilliseconds",
                format!("{ms}: expected 0 to 60000"),
            ));
        }
        Ok(())
    }
}

/// `binlogArchive.checksums`: how often, which tables, and at what cost on the server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BinlogChecksumsSpec {
    /// How often a run starts, e.g. `1h` (default), `30m`; from 1s to 168h. A run never
    /// overlaps the one before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::interval::CHECKSUMS_EVERY_RULE).message(crate::interval::CHECKSUMS_EVERY_MESSAGE))]
    #[schemars(length(max = 24))]
    pub every: Option<String>,
    /// The tables checked, as `SCHEMA.TABLE` patterns where `*` matches any characters
    /// (e.g. `shop.*`); default every table. With `skip`, at most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 3, max = 256)))]
    pub tables: Vec<String>,
    /// Tables never checked (the same patterns, over `tables`), e.g. `*.audit_log`: how a
    /// table is turned off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 3, max = 256)))]
    pub skip: Vec<String>,
    /// Rows per chunk, each read by one statement (100 to 1000000; default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 1_000_000))]
    pub chunk_rows: Option<u64>,
    /// The pause after each chunk, in milliseconds (0 to 60000; default 50): the rate of
    /// reads on the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 60_000))]
    pub pause_milliseconds: Option<u32>,
    /// `tidemark run` only (with `binlogIndex`): the `mariadb` client's connection options,
    /// e.g. `[--defaults-extra-file=/etc/tidemark/oracle.cnf]` (the password in the option
    /// file, never here). The operator logs in with `spec.source` and refuses this field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 3, max = 512)))]
    pub client: Vec<String>,
}

/// `binlogArchive.purge`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BinlogPurgeSpec {
    /// Files whose transactions are younger than this stay on the server, archived or not,
    /// e.g. `2h` (default `1h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 24))]
    pub keep: Option<String>,
    /// Past this much binlog on the server (a quantity, e.g. `50Gi`), `keep` yields — the
    /// archive never does; from 80 % of it with files not archived, the point in time is at
    /// risk (the archiver's log, `tidemark_point_in_time_at_risk`, the alert
    /// `TidemarkPointInTimeAtRisk`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 24))]
    pub max_disk_usage: Option<String>,
    /// Replicas whose binlogs are purged by the same rule (their files matched to the
    /// archive by GTID), with the same login: each a host reaching one pod, e.g. a
    /// StatefulSet pod's name under its headless Service (`shop-db-1.shop-db`). At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub replicas: Vec<BinlogPurgeReplica>,
}

/// One replica of `binlogArchive.purge.replicas`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BinlogPurgeReplica {
    /// A DNS name or an IP address.
    #[schemars(length(min = 1, max = 253))]
    pub host: String,
    /// Default 3306.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

impl BinlogPurgeReplica {
    /// `HOST:PORT` as `archive-binlogs --purge-replica` reads it (`[IPv6]:PORT`).
    pub fn address(&self) -> String {
        let port = self.port.unwrap_or(3306);
        if self.host.contains(':') {
            format!("[{}]:{port}", self.host)
        } else {
            format!("{}:{port}", self.host)
        }
    }
}

/// The server the archiver reads from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BinlogServerSpec {
    /// Host name of the primary (a Service), e.g. `shop-db-primary`.
    pub host: String,
    /// Default 3306.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The image with `mariadb-binlog` and `mariadb` (default: the image of the database
    /// container of a pod `spec.source` selects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// `Retain` keeps remote data when a Backup object is deleted; `Delete` removes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletionPolicy {
    Retain,
    Delete,
    /// A value this version does not know (a newer CRD's): read, so that one object does
    /// not stop a watch, then refused by `validate` (and never acted on as `Delete`).
    Unknown(String),
}

/// An object store location: either a full `url` (any scheme Tidemark accepts, such as
/// `file:///var/backups`) or an S3 `bucket` with an optional `path` prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.url) != has(self.bucket)").message("set exactly one of url (e.g. file:///var/backups) and bucket (with an optional path)"))]
#[x_kube(validation = Rule::new("!has(self.credentialsKeys) || has(self.credentialsSecret)").message("credentialsKeys names keys of credentialsSecret, which is not set"))]
#[serde(rename_all = "camelCase")]
pub struct ObjectStoreSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// S3-compatible endpoint, e.g. `http://minio:9000` (plain HTTP is allowed when given);
    /// for `az://`, the blob endpoint (e.g. an emulator's `http://127.0.0.1:10000/<account>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Name of the Secret of the policy's namespace holding the store's credentials
    /// (operator only): S3 `accessKeyId` and `secretAccessKey` (optional `sessionToken`);
    /// `gs://` `serviceAccountKey` (the JSON key file); `az://` `accountName` with
    /// `accountKey` or `sasToken`. Each may also be under its environment variable's name
    /// (`AWS_ACCESS_KEY_ID`, …), or under a key `credentialsKeys` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SUBDOMAIN_PATTERN), length(max = 253))]
    pub credentials_secret: Option<String>,
    /// Other keys of `credentialsSecret` to read the credentials from, for a Secret made
    /// for another tool (e.g. `accessKeyId: ACCESS_KEY_ID`). A credential named here is
    /// read from that key only; the others keep their default keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_keys: Option<CredentialsKeys>,
    /// Path-style requests (the default whenever an endpoint is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_style: Option<bool>,
    /// PEM of a private certificate authority the store's HTTPS certificate chains to,
    /// trusted beside the public roots (the machine's, or those built into `tidemark`
    /// where an image has none). Backup Jobs, the binlog archiver and consolidation Jobs
    /// get it as `TIDEMARK_CA_BUNDLE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
    /// How backups' payloads and binlog segments are written: `none` (the default),
    /// `zstd` (level 3) or `zstd:<level>` (1–19). Recorded per object; every reader
    /// decompresses what is recorded. A Backup's or ScheduledBackup's `compression`
    /// overrides it for its backups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(tidemark_core::compression::COMPRESSION_RULE).message(tidemark_core::compression::COMPRESSION_FORM))]
    pub compression: Option<String>,
    /// Client-side encryption of payloads and binlog segments (age, X25519): the store
    /// only ever sees ciphertext. `metadata.json` and the binlog index stay readable, so
    /// retention works without keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionSpec>,
    /// S3 Object Lock on committed backups (seed 002's immutable chains): every backup of
    /// a chain stays locked until the chain's last backup's lock ends, so neither Tidemark
    /// nor a stolen key can delete it before. The bucket must have object lock enabled
    /// (S3 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_lock: Option<ObjectLockSpec>,
}

/// The keys of a store Secret that hold each credential, where they are not the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsKeys {
    /// S3: the access key id (default `accessKeyId` or `AWS_ACCESS_KEY_ID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SECRET_KEY_PATTERN), length(max = 253))]
    pub access_key_id: Option<String>,
    /// S3: the secret access key (default `secretAccessKey` or `AWS_SECRET_ACCESS_KEY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SECRET_KEY_PATTERN), length(max = 253))]
    pub secret_access_key: Option<String>,
    /// S3: the session token (default `sessionToken` or `AWS_SESSION_TOKEN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SECRET_KEY_PATTERN), length(max = 253))]
    pub session_token: Option<String>,
    /// GCS: the service-account key file (default `serviceAccountKey` or
    /// `GOOGLE_SERVICE_ACCOUNT_KEY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SECRET_KEY_PATTERN), length(max = 253))]
    pub service_account_key: Option<String>,
    /// Azure: the account name (default `accountName` or `AZURE_STORAGE_ACCOUNT_NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SECRET_KEY_PATTERN), length(max = 253))]
    pub account_name: Option<String>,
    /// Azure: the account key (default `accountKey` or `AZURE_STORAGE_ACCOUNT_KEY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SECRET_KEY_PATTERN), length(max = 253))]
    pub account_key: Option<String>,
    /// Azure: a SAS token (default `sasToken` or `AZURE_STORAGE_SAS_TOKEN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SECRET_KEY_PATTERN), length(max = 253))]
    pub sas_token: Option<String>,
}

impl CredentialsKeys {
    /// The key named for the credential whose default key is `default` (`accessKeyId`,
    /// `serviceAccountKey`, …), if one is.
    pub fn key_for(&self, default: &str) -> Option<&str> {
        self.named()
            .find_map(|(name, key)| (name == default).then_some(key))
    }

    /// `(default key, named key)` of each credential given another key.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.fields()
            .into_iter()
            .filter_map(|(name, _, key)| Some((name, key?)))
    }

    /// `(default key, field path, named key)` of each credential.
    fn fields(&self) -> [(&'static str, &'static str, Option<&str>); 7] {
        [
            (
                "accessKeyId",
                "spec.objectStore.credentialsKeys.accessKeyId",
                self.access_key_id.as_deref(),
            ),
            (
                "secretAccessKey",
                "spec.objectStore.credentialsKeys.secretAccessKey",
                self.secret_access_key.as_deref(),
            ),
            (
                "sessionToken",
                "spec.objectStore.credentialsKeys.sessionToken",
                self.session_token.as_deref(),
            ),
            (
                "serviceAccountKey",
                "spec.objectStore.credentialsKeys.serviceAccountKey",
                self.service_account_key.as_deref(),
            ),
            (
                "accountName",
                "spec.objectStore.credentialsKeys.accountName",
                self.account_name.as_deref(),
            ),
            (
                "accountKey",
                "spec.objectStore.credentialsKeys.accountKey",
                self.account_key.as_deref(),
            ),
            (
                "sasToken",
                "spec.objectStore.credentialsKeys.sasToken",
                self.sas_token.as_deref(),
            ),
        ]
    }

    /// Each named key is a Secret key.
    ///
    /// # Errors
    /// One is not.
    pub fn validate(&self) -> Result<(), crate::names::NameError> {
        for (_, field, key) in self.fields() {
            if let Some(k) = key {
                crate::names::secret_key(field, k)?;
            }
        }
        Ok(())
    }
}

/// How committed backups are locked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectLockSpec {
    /// `governance` (users granted `s3:BypassGovernanceRetention` can still remove a
    /// backup) or `compliance` (nobody can, before the date).
    #[schemars(regex(pattern = r"^(governance|compliance)$"))]
    pub mode: String,
    /// How long a chain's last backup stays locked (`<n>d`, `<n>w` or `<n>mo`; default:
    /// `spec.retention.window`). A full is locked until its chain's last increment's slot
    /// (from its schedule and `maxIncrementsPerFull`) plus this, a backup without a chain
    /// until its start plus this; every increment takes its chain's date.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub period: Option<String>,
    /// What a retention pass does with a chain whose lock has ended and that no rule keeps
    /// (seed 002): `lifecycle` (the default) records it as expired in the store — no plan,
    /// restore or window uses it again, and the operator deletes its Backup objects — and
    /// leaves its objects to the bucket's lifecycle rule (Tidemark says when the bucket has
    /// none, or one that would remove what the window needs); `delete` deletes its objects,
    /// every version, itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(lifecycle|delete)$"))]
    pub after_expiry: Option<String>,
}

/// The bech32 form of an age X25519 recipient (`age1` and 58 characters).
pub const RECIPIENT_PATTERN: &str = "^age1[02-9ac-hj-np-z]{58}$";
/// Most recipients one store encrypts to.
pub const MAX_RECIPIENTS: usize = 16;

/// The key of `identitySecret` that holds the age identities.
pub const IDENTITY_KEY: &str = "identity";

/// Who new objects are encrypted to, and where the keys to read them are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.identitySecret) && has(self.identityFrom))").message("set one of identitySecret (its key `identity`) and identityFrom ({name, key})"))]
pub struct EncryptionSpec {
    /// age X25519 public keys (`age1…`, as `age-keygen` or `tidemark keygen` prints them)
    /// new payloads and segments are encrypted to; any one of their identities reads them.
    /// Changing the list affects new objects only: older ones keep theirs (recorded by
    /// fingerprint), so rotate by adding the new key, and drop the old identity only once
    /// nothing encrypted to it is kept.
    #[serde(default)]
    #[schemars(length(max = 16), inner(pattern(RECIPIENT_PATTERN)))]
    pub recipients: Vec<String>,
    /// A file of age identities (`AGE-SECRET-KEY-1…` lines) for reading encrypted objects:
    /// restores and consolidation (`tidemark` command and `tidemark run` only; relative to
    /// the policy file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub identity_file: Option<String>,
    /// The Secret of the policy's namespace whose key `identity` holds the age identities
    /// (operator only): consolidation Jobs read encrypted chains with it. Without it (or
    /// `identityFrom`), encrypted chains are not consolidated (they are kept whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SUBDOMAIN_PATTERN), length(max = 253))]
    pub identity_secret: Option<String>,
    /// The age identities by reference (`{name, key}`), instead of `identitySecret`'s key
    /// `identity` (operator only; set one of the two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_from: Option<SecretKeyRef>,
    /// The instant encryption was turned on (RFC 3339, e.g. `2026-11-01T00:00:00Z`):
    /// backups completed and binlogs ending before it may be unencrypted. Under a policy with
    /// recipients every other unencrypted payload or segment is refused by restores,
    /// restore tests and consolidation — someone who can write the bucket but holds no key
    /// could have planted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub plaintext_before: Option<String>,
}

impl EncryptionSpec {
    /// Where the age identities are: `identityFrom`, or `identitySecret`'s key `identity`.
    pub fn identity(&self) -> Option<SecretKeyRef> {
        self.identity_from.clone().or_else(|| {
            self.identity_secret
                .as_deref()
                .map(|s| SecretKeyRef::new(s, IDENTITY_KEY))
        })
    }

    /// [`EncryptionSpec::plaintext_before`], parsed.
    ///
    /// # Errors
    /// Not an RFC 3339 instant (with the accepted form).
    pub fn plaintext_before(&self) -> Result<Option<jiff::Timestamp>, PolicyFileError> {
        self.plaintext_before
            .as_deref()
            .map(|t| {
                t.parse::<jiff::Timestamp>()
                    .map_err(|_| PolicyFileError::Invalid {
                        field: "spec.objectStore.encryption.plaintextBefore",
                        problem: format!(
                            "{:?} is not an instant: give RFC 3339, e.g. 2026-11-01T00:00:00Z",
                            t.chars().take(64).collect::<String>()
                        ),
                    })
            })
            .transpose()
    }

    /// Checks the recipients' form and count, and the Secret's name.
    ///
    /// # Errors
    /// The first value that is not accepted, with the accepted form.
    pub fn validate(&self) -> Result<(), PolicyFileError> {
        if self.recipients.len() > MAX_RECIPIENTS {
            return Err(PolicyFileError::Invalid {
                field: "spec.objectStore.encryption.recipients",
                problem: format!(
                    "{} recipients: at most {MAX_RECIPIENTS}",
                    self.recipients.len()
                ),
            });
        }
        for r in &self.recipients {
            if !is_recipient(r) {
                return Err(PolicyFileError::Invalid {
                    field: "spec.objectStore.encryption.recipients",
                    problem: if r
                        .trim_start()
                        .to_ascii_uppercase()
                        .starts_with("AGE-SECRET-KEY-")
                    {
                        "an age identity (a secret key, not shown) where a public key (age1…) belongs; never put a secret key in a policy".to_owned()
                    } else {
                        format!(
                            "{:?} is not an age X25519 public key (age1 and 58 bech32 characters)",
                            r.chars().take(80).collect::<String>()
                        )
                    },
                });
            }
        }
        if let Some(secret) = &self.identity_secret {
            crate::names::dns_subdomain("spec.objectStore.encryption.identitySecret", secret)?;
        }
        if let Some(r) = &self.identity_from {
            if self.identity_secret.is_some() {
                return Err(PolicyFileError::Invalid {
                    field: "spec.objectStore.encryption.identityFrom",
                    problem: "set one of identitySecret (its key `identity`) and identityFrom ({name, key})".into(),
                });
            }
            r.validate(
                "spec.objectStore.encryption.identityFrom.name",
                "spec.objectStore.encryption.identityFrom.key",
            )?;
        }
        self.plaintext_before()?;
        Ok(())
    }
}

/// Whether `value` has the form of an age X25519 recipient ([`RECIPIENT_PATTERN`]; the
/// checksum is checked where the key is used).
pub fn is_recipient(value: &str) -> bool {
    const BECH32: &[u8] = b"qpzry9x8gf2tvdw0s3jn54khce6mua7l";
    value.len() == 62
        && value.starts_with("age1")
        && value.as_bytes()[4..].iter().all(|c| BECH32.contains(c))
}

impl ObjectStoreSpec {
    /// How new objects are written (`compression`, default none).
    ///
    /// # Errors
    /// A value that is not a compression setting, with the accepted form.
    pub fn compression(&self) -> Result<tidemark_core::compression::Compression, PolicyFileError> {
        self.compression
            .as_deref()
            .map_or(Ok(Default::default()), str::parse)
            .map_err(
                |e: tidemark_core::compression::CompressionError| PolicyFileError::Invalid {
                    field: "spec.objectStore.compression",
                    problem: e.to_string(),
                },
            )
    }

    /// The store URL this spec names.
    ///
    /// # Errors
    /// Neither or both of `url` and `bucket` are set.
    pub fn store_url(&self) -> Result<String, PolicyFileError> {
        match (&self.url, &self.bucket) {
            (Some(url), None) => Ok(url.clone()),
            (None, Some(bucket)) => Ok(match self.path.as_deref().map(|p| p.trim_matches('/')) {
                Some(p) if !p.is_empty() => format!("s3://{bucket}/{p}"),
                _ => format!("s3://{bucket}"),
            }),
            _ => Err(PolicyFileError::Invalid {
                field: "spec.objectStore",
                problem: "set exactly one of url (e.g. file:///var/backups) and bucket (with an optional path)".into(),
            }),
        }
    }
}

impl ObjectStoreSpec {
    /// The store URL for the operator, which serves every namespace with one identity:
    /// refused are stores only one process can see (`file://`, `memory://`), URLs carrying
    /// credentials, a query or a fragment (never repeated in the message), and — unless
    /// the cluster admin allowed it (`ambient`) — any store that would be reached with the
    /// operator's own identity: any store without `credentialsSecret` (S3 keys, a GCS
    /// service-account key, an Azure account key or SAS token).
    ///
    /// # Errors
    /// Any of the above, naming the field and what to do.
    pub fn shared_url(&self, ambient: bool) -> Result<String, PolicyFileError> {
        let url = self.store_url()?;
        let invalid =
            |field: &'static str, problem: String| Err(PolicyFileError::Invalid { field, problem });
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url.as_str()));
        let authority = rest.split('/').next().unwrap_or_default();
        if authority.contains('@') || rest.contains('?') || rest.contains('#') {
            return invalid(
                "spec.objectStore.url",
                "carries credentials (user@ or user:password@), a query or a fragment: refused, and not repeated here; put credentials in spec.objectStore.credentialsSecret".into(),
            );
        }
        match scheme {
            "file" | "memory" => {
                return invalid(
                    "spec.objectStore.url",
                    format!(
                        "{scheme}:// is a directory or the memory of one process; the operator and its Jobs need a store they all reach (s3://, or bucket with endpoint)"
                    ),
                );
            }
            _ => {}
        }
        if self.credentials_secret.is_none() && !ambient {
            let keys = match scheme {
                "gs" => "serviceAccountKey (a service-account key file)",
                "az" | "azure" => "accountName, and accountKey or sasToken",
                _ => "accessKeyId and secretAccessKey",
            };
            return invalid(
                "spec.objectStore.credentialsSecret",
                format!(
                    "required: the operator does not lend its own identity (environment, IRSA, pod identity) to a policy; name a Secret of this namespace with {keys}, or have the cluster admin start the operator with --allow-ambient-credentials"
                ),
            );
        }
        Ok(url)
    }
}

/// Retention rules (DESIGN.md §5.1). Counts are whole numbers; durations are
/// `<n>d`, `<n>w` or `<n>mo` (a month is 30 days; `<n>m`, seed 000's spelling, is accepted with a warning).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetentionSpec {
    /// Keep every backup completed within this span of now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[x_kube(validation = Rule::new("!self.matches('^0+(d|w|mo?)$')").message("a window of 0 keeps only the newest backup; remove window or give a positive span"))]
    pub window: Option<String>,
    /// Keep the newest N successful backups (failed ones never count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("keepLast must be at least 1 (the newest backup is always kept)"))]
    pub keep_last: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub keep_daily: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub keep_weekly: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub keep_monthly: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub keep_yearly: Option<i64>,
    /// Delete failed and never-committed attempts older than this.
    #[serde(
        default,
        rename = "failedBackupsTTL",
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub failed_backups_ttl: Option<String>,
    /// Merge old increments into a synthetic full (seed 002).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidate: Option<bool>,
    /// Also keep the newest backup completed before the window, so every instant of the
    /// window stays restorable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cover_window: Option<bool>,
    /// Cap on backups deleted in one pass; 0 = no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_deletions_per_pass: Option<i64>,
    /// Delete no backup until the newest one has been read back whole: before its first
    /// deletion after a new backup, a pass reads the newest backup and its chain (sizes,
    /// sha256, content where it can decode it) and records it (`_verified.json`); if
    /// anything is damaged or missing, nothing is deleted and the pass says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_verified: Option<bool>,
    /// The point-in-time promise, apart from how long snapshots are kept (DESIGN.md §5.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point_in_time: Option<PointInTimeSpec>,
    /// The breaker on mass deletion (DESIGN.md §5.5): on by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_guard: Option<DeletionGuardSpec>,
}

/// `retention.pointInTime`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PointInTimeSpec {
    /// Every instant of this span before now restores (binlogs are kept from the start of
    /// the newest backup completed before it); backups kept longer by other rules restore
    /// to their own point (`standalone`). Unset: binlogs are kept for every retained
    /// backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[x_kube(validation = Rule::new("!self.matches('^0+(d|w|mo?)$')").message("a point-in-time window of 0 promises nothing; remove pointInTime or give a positive span"))]
    pub window: Option<String>,
}

/// `retention.deletionGuard`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeletionGuardSpec {
    /// A pass deleting more than this many backups, and more than half of the restorable
    /// ones, is held until acknowledged (`tidemark.io/allow-deletions-before`). Default 10;
    /// 0: the count never trips the guard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub threshold: Option<i64>,
    /// A pass moving the start of the recovery window or of the point-in-time window later
    /// by more than this is held too. Unset: not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub window: Option<String>,
}

impl RetentionSpec {
    /// The unvalidated planner input, with the policy's time zone.
    pub fn to_input(&self, time_zone: Option<&str>) -> PolicyInput {
        PolicyInput {
            window: self.window.clone(),
            keep_last: self.keep_last,
            keep_daily: self.keep_daily,
            keep_weekly: self.keep_weekly,
            keep_monthly: self.keep_monthly,
            keep_yearly: self.keep_yearly,
            failed_backups_ttl: self.failed_backups_ttl.clone(),
            cover_window: self.cover_window,
            consolidate: self.consolidate,
            max_deletions_per_pass: self.max_deletions_per_pass,
            require_verified: self.require_verified,
            time_zone: time_zone.map(str::to_owned),
            point_in_time_window: self.point_in_time.as_ref().and_then(|p| p.window.clone()),
            deletion_guard_threshold: self.deletion_guard.as_ref().and_then(|g| g.threshold),
            deletion_guard_window: self.deletion_guard.as_ref().and_then(|g| g.window.clone()),
        }
    }
}

/// Why a policy document was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    #[error("not a BackupPolicy document: {0}")]
    Syntax(String),
    #[error("kind is {found:?}; expected BackupPolicy")]
    Kind { found: String },
    #[error("apiVersion is {found:?}; expected {}", crate::version::API_VERSION)]
    ApiVersion { found: String },
    #[error("{field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },
    #[error(transparent)]
    Interval(#[from] crate::interval::IntervalError),
    #[error(transparent)]
    Name(#[from] crate::names::NameError),
}

impl SourceSpec {
    /// The names it carries are Kubernetes names.
    ///
    /// # Errors
    /// A container, volume, label key or Secret name that is not one.
    pub fn validate(&self) -> Result<(), PolicyFileError> {
        use crate::names::{dns_label, dns_subdomain, label_key};
        if let Some(c) = &self.container {
            dns_label("spec.source.container", c)?;
        }
        if let Some(v) = &self.data_volume {
            dns_label("spec.source.dataVolume", v)?;
        }
        if let Some(k) = &self.role_label {
            label_key("spec.source.roleLabel", k)?;
        }
        if let Some(s) = &self.credentials_secret {
            dns_subdomain("spec.source.credentialsSecret", s)?;
        }
        if let Some(r) = &self.username_from {
            r.validate(
                "spec.source.usernameFrom.name",
                "spec.source.usernameFrom.key",
            )?;
        }
        if let Some(r) = &self.password_from {
            r.validate(
                "spec.source.passwordFrom.name",
                "spec.source.passwordFrom.key",
            )?;
        }
        if self.credentials_secret.is_none()
            && self.username_from.is_some() != self.password_from.is_some()
        {
            let (field, other) = if self.username_from.is_some() {
                ("spec.source.passwordFrom", "usernameFrom")
            } else {
                ("spec.source.usernameFrom", "passwordFrom")
            };
            return Err(PolicyFileError::Invalid {
                field,
                problem: format!(
                    "required with {other} (or credentialsSecret, whose key `username`/`password` is the default)"
                ),
            });
        }
        Ok(())
    }

    /// The database login: `usernameFrom` and `passwordFrom`, each defaulting to
    /// `credentialsSecret`'s key `username` or `password`; none without either.
    pub fn login(&self) -> Option<Login> {
        const SECRET: &str = "spec.source.credentialsSecret";
        let pick = |from: &Option<SecretKeyRef>, field: &'static str, key: &str| match from {
            Some(r) => Some((r.clone(), field)),
            None => self
                .credentials_secret
                .as_deref()
                .map(|s| (SecretKeyRef::new(s, key), SECRET)),
        };
        let (user, user_field) = pick(&self.username_from, "spec.source.usernameFrom", "username")?;
        let (password, password_field) =
            pick(&self.password_from, "spec.source.passwordFrom", "password")?;
        Some(Login {
            user,
            password,
            user_field,
            password_field,
        })
    }
}

impl BackupPolicySpec {
    /// Its retention durations written with seed 000's ambiguous `<n>m` (months, where intervals
    /// read minutes), each with its field: the warnings of `tidemark` and the operator.
    pub fn ambiguous_durations(&self) -> Vec<tidemark_core::AmbiguousDuration> {
        use tidemark_core::AmbiguousDuration as A;
        let retention = self.retention.as_ref();
        let lock = self
            .object_store
            .as_ref()
            .and_then(|s| s.object_lock.as_ref());
        [
            A::check(
                "spec.retention.window",
                retention.and_then(|r| r.window.as_deref()),
            ),
            A::check(
                "spec.retention.failedBackupsTTL",
                retention.and_then(|r| r.failed_backups_ttl.as_deref()),
            ),
            A::check(
                "spec.backupHistory.maxAge",
                self.backup_history
                    .as_ref()
                    .and_then(|h| h.max_age.as_deref()),
            ),
            A::check(
                "spec.objectStore.objectLock.period",
                lock.and_then(|l| l.period.as_deref()),
            ),
            A::check("spec.ttl", self.ttl.as_deref()),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Single-object validation (the CRD carries the same rules as CEL; the operator checks
    /// them again, since API servers before 1.25 do not).
    ///
    /// # Errors
    /// A retention policy without an object store (seed 000); an object store naming both
    /// or neither of `url` and `bucket`; an invalid retention rule or interval.
    pub fn validate(&self) -> Result<(), PolicyFileError> {
        if self.retention.is_some() && self.object_store.is_none() {
            return Err(PolicyFileError::Invalid {
                field: "spec.retention",
                problem: "a retention policy requires spec.objectStore (where the backups are)"
                    .into(),
            });
        }
        if let Some(os) = &self.object_store {
            os.store_url()?;
            os.compression()?;
            if let Some(e) = &os.encryption {
                e.validate()?;
            }
            self.object_lock()?;
            self.lock_expiry()?;
        }
        if let Some(ttl) = &self.ttl {
            ttl.parse::<tidemark_core::RetentionDuration>()
                .map_err(|e| PolicyFileError::Invalid {
                    field: "spec.ttl",
                    problem: e.to_string(),
                })?;
        }
        if let Some(p) = self.binlog_archive.as_ref().and_then(|a| a.purge.as_ref()) {
            if let Some(k) = &p.keep
                && !k
                    .parse::<jiff::SignedDuration>()
                    .is_ok_and(|d| !d.is_negative())
            {
                return Err(PolicyFileError::Invalid {
                    field: "spec.binlogArchive.purge.keep",
                    problem: format!(
                        "{:?} is not a duration: expected e.g. 2h, 30m or 0s",
                        k.chars().take(24).collect::<String>()
                    ),
                });
            }
            if let Some(m) = &p.max_disk_usage
                && crate::quantity::bytes(m).is_none_or(|b| b == 0)
            {
                return Err(PolicyFileError::Invalid {
                    field: "spec.binlogArchive.purge.maxDiskUsage",
                    problem: format!(
                        "{:?} is not a size: expected a quantity such as 50Gi or 500M",
                        m.chars().take(24).collect::<String>()
                    ),
                });
            }
            if p.replicas.len() > 16 {
                return Err(PolicyFileError::Invalid {
                    field: "spec.binlogArchive.purge.replicas",
                    problem: format!("{} replicas: at most 16", p.replicas.len()),
                });
            }
            if let Some(r) = p.replicas.iter().find(|r| {
                let host_ok = if r.host.contains(':') {
                    r.host.parse::<std::net::Ipv6Addr>().is_ok()
                } else {
                    !r.host.is_empty()
                        && r.host.len() <= 253
                        && !r.host.starts_with('-')
                        && r.host
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
                };
                !host_ok || r.port == Some(0)
            }) {
                return Err(PolicyFileError::Invalid {
                    field: "spec.binlogArchive.purge.replicas",
                    problem: format!(
                        "{:?} (port {:?}) is not a host: expected a DNS name or an IP address, e.g. shop-db-1.shop-db, and a port from 1",
                        r.host.chars().take(64).collect::<String>(),
                        r.port
                    ),
                });
            }
            if self
                .binlog_archive
                .as_ref()
                .is_some_and(|a| a.server.is_none())
            {
                return Err(PolicyFileError::Invalid {
                    field: "spec.binlogArchive.purge",
                    problem: "needs binlogArchive.server (the archiver that logs in to the server); with binlogIndex, set the server's own expiry".into(),
                });
            }
        }
        if let Some(archive) = &self.binlog_archive
            && let Some(c) = &archive.checksums
        {
            c.validate(archive.server.is_some())?;
        }
        if let Some(os) = &self.object_store {
            if let Some(secret) = &os.credentials_secret {
                crate::names::dns_subdomain("spec.objectStore.credentialsSecret", secret)?;
            }
            if let Some(keys) = &os.credentials_keys {
                if os.credentials_secret.is_none() {
                    return Err(PolicyFileError::Invalid {
                        field: "spec.objectStore.credentialsKeys",
                        problem:
                            "names keys of spec.objectStore.credentialsSecret, which is not set"
                                .into(),
                    });
                }
                keys.validate()?;
            }
        }
        if let Some(source) = &self.source {
            source.validate()?;
            source.primary_ready_for()?;
            source.standby_max_lag()?;
        }
        if let Some(r) = &self.resources {
            r.validate()?;
        }
        if let Some(t) = &self.restore_test {
            t.settings()?;
        }
        if let Some(v) = &self.verify {
            v.settings()?;
        }
        if let Some(Err((field, problem))) = self.backup_history.as_ref().map(|h| h.settings()) {
            return Err(PolicyFileError::Invalid { field, problem });
        }
        if let Some(p @ DeletionPolicy::Unknown(_)) = &self.deletion_policy {
            return Err(PolicyFileError::Invalid {
                field: "spec.deletionPolicy",
                problem: p.unknown(),
            });
        }
        self.retention_interval()?;
        self.binlog_interval()?;
        self.binlog_max_lag()?;
        self.bandwidth()?;
        self.validate_copies()?;
        Ok(())
    }

    /// Each copy: a unique name, a store of its own, its lock, lag and rate.
    ///
    /// # Errors
    /// More than [`MAX_COPIES`]; a name that is not a DNS label or is taken twice; a copy
    /// without a store of the policy, or whose store is the policy's own; an invalid store,
    /// retention, lock, `maxLag` or `bandwidth`.
    fn validate_copies(&self) -> Result<(), PolicyFileError> {
        let invalid = |problem: String| PolicyFileError::Invalid {
            field: "spec.copies",
            problem,
        };
        if self.copies.is_empty() {
            return Ok(());
        }
        if self.copies.len() > MAX_COPIES {
            return Err(invalid(format!(
                "{} copies; a policy names at most {MAX_COPIES}",
                self.copies.len()
            )));
        }
        let Some(own) = &self.object_store else {
            return Err(invalid(
                "copies need spec.objectStore (the store they copy from)".into(),
            ));
        };
        let own_url = own.store_url()?;
        let mut seen = std::collections::HashSet::new();
        for c in &self.copies {
            crate::names::dns_label("spec.copies[].name", &c.name)?;
            if !seen.insert(c.name.as_str()) {
                return Err(invalid(format!(
                    "the copy name {:?} is used twice; each copy needs its own",
                    c.name
                )));
            }
            let url = c.object_store.store_url()?;
            if url == own_url && c.object_store.endpoint == own.endpoint {
                return Err(invalid(format!(
                    "copy {:?}: its objectStore is the policy's own ({url}); a copy goes to another bucket, region or provider",
                    c.name
                )));
            }
            if let Some(e) = &c.object_store.encryption {
                e.validate()?;
            }
            if let Some(secret) = &c.object_store.credentials_secret {
                crate::names::dns_subdomain("spec.copies[].objectStore.credentialsSecret", secret)?;
            }
            if let Some(keys) = &c.object_store.credentials_keys {
                keys.validate()?;
            }
            if c.object_lock.is_some() && c.object_store.object_lock.is_some() {
                return Err(invalid(format!(
                    "copy {:?}: objectLock is set both on the copy and in its objectStore; set one",
                    c.name
                )));
            }
            if let Some(r) = &c.retention {
                r.to_input(self.time_zone.as_deref())
                    .validate()
                    .map_err(|e| invalid(format!("copy {:?}: retention: {e}", c.name)))?;
            }
            c.object_lock(self)?;
            c.max_lag()?;
            c.bandwidth()?;
            if let Some(v) = &c.verify {
                v.settings()
                    .map_err(|e| invalid(format!("copy {:?}: verify: {e}", c.name)))?;
            }
            if let Some(t) = &c.restore_test {
                t.settings()
                    .map_err(|e| invalid(format!("copy {:?}: restoreTest: {e}", c.name)))?;
            }
        }
        Ok(())
    }

    /// The object lock of committed backups (`spec.objectStore.objectLock`), with its
    /// period (`period`, else `spec.retention.window`).
    ///
    /// # Errors
    /// An unknown mode; a period that is not a duration, or none at all.
    pub fn object_lock(&self) -> Result<Option<tidemark_core::lock::ObjectLock>, PolicyFileError> {
        lock_of(
            self.object_store
                .as_ref()
                .and_then(|o| o.object_lock.as_ref()),
            self.retention.as_ref().and_then(|r| r.window.as_ref()),
            "spec.objectStore.objectLock",
        )
    }

    /// `spec.bandwidth`, when set.
    ///
    /// # Errors
    /// Not a rate.
    pub fn bandwidth(&self) -> Result<Option<tidemark_core::rate::Rate>, PolicyFileError> {
        rate("spec.bandwidth", self.bandwidth.as_deref())
    }

    /// The copy named `name`.
    pub fn copy(&self, name: &str) -> Option<&CopySpec> {
        self.copies.iter().find(|c| c.name == name)
    }

    /// The names of the copies, for a message: `dr, archive`, or `none`.
    pub fn copy_names(&self) -> String {
        if self.copies.is_empty() {
            return "none".to_owned();
        }
        self.copies
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The spec as its copy `name` sees it (see [`BackupPolicy::as_copy`]); `cluster` is the
    /// policy's cluster directory, which the copy keeps.
    pub fn as_copy(&self, name: &str, cluster: &str) -> Option<BackupPolicySpec> {
        let c = self.copy(name)?;
        let mut out = self.clone();
        let mut store = c.object_store.clone();
        if c.object_lock.is_some() {
            store.object_lock.clone_from(&c.object_lock);
        }
        // Objects are copied as stored: the copy is read with the source's keys.
        if store.encryption.is_none() {
            store.encryption = self
                .object_store
                .as_ref()
                .and_then(|o| o.encryption.clone());
        }
        out.cluster = Some(cluster.to_owned());
        out.object_store = Some(store);
        out.retention = c.retention(self).cloned();
        out.bandwidth.clone_from(&c.bandwidth);
        out.verify.clone_from(&c.verify);
        out.restore_test.clone_from(&c.restore_test);
        out.copies = Vec::new();
        out.binlog_archive = None;
        Some(out)
    }

    /// What a pass does with a locked chain whose lock ended
    /// (`spec.objectStore.objectLock.afterExpiry`; default `lifecycle`).
    ///
    /// # Errors
    /// A value other than `lifecycle` and `delete`.
    pub fn lock_expiry(&self) -> Result<tidemark_core::lock::LockExpiry, PolicyFileError> {
        self.object_store
            .as_ref()
            .and_then(|o| o.object_lock.as_ref())
            .and_then(|l| l.after_expiry.as_deref())
            .map_or(Ok(tidemark_core::lock::LockExpiry::default()), |v| {
                v.parse().map_err(|problem| PolicyFileError::Invalid {
                    field: "spec.objectStore.objectLock.afterExpiry",
                    problem,
                })
            })
    }

    /// How often the retention pass runs (`spec.retentionInterval`, default 1 h).
    ///
    /// # Errors
    /// Not a positive interval such as `30s`, `10m` or `1h`.
    pub fn retention_interval(&self) -> Result<jiff::SignedDuration, PolicyFileError> {
        crate::interval::RETENTION_INTERVAL
            .parse(self.retention_interval.as_deref())
            .map_err(PolicyFileError::Interval)
    }

    /// The pause between binlog archiver passes (`spec.binlogArchive.interval`, default
    /// 10 s).
    ///
    /// # Errors
    /// Not an interval from 1 s to 1 h.
    /// `spec.binlogArchive.maxLag`, or its default.
    ///
    /// # Errors
    /// A value outside the grammar or the bounds.
    pub fn binlog_max_lag(&self) -> Result<jiff::SignedDuration, PolicyFileError> {
        crate::interval::BINLOG_MAX_LAG
            .parse(
                self.binlog_archive
                    .as_ref()
                    .and_then(|a| a.max_lag.as_deref()),
            )
            .map_err(PolicyFileError::Interval)
    }

    pub fn binlog_interval(&self) -> Result<jiff::SignedDuration, PolicyFileError> {
        crate::interval::BINLOG_INTERVAL
            .parse(
                self.binlog_archive
                    .as_ref()
                    .and_then(|a| a.interval.as_deref()),
            )
            .map_err(PolicyFileError::Interval)
    }

    /// The cluster directory for a policy named `name`: `spec.cluster`, else the name.
    pub fn cluster_or<'a>(&'a self, name: &'a str) -> &'a str {
        self.cluster.as_deref().unwrap_or(name)
    }
}

/// A lock setting with its period (`period`, else `window`); `at` names the lock's field
/// (`spec.objectStore.objectLock` or `spec.copies[].objectLock`).
fn lock_of(
    lock: Option<&ObjectLockSpec>,
    window: Option<&String>,
    at: &'static str,
) -> Result<Option<tidemark_core::lock::ObjectLock>, PolicyFileError> {
    let Some(lock) = lock else {
        return Ok(None);
    };
    let (mode_field, period_field): (&'static str, &'static str) = match at {
        "spec.copies[].objectLock" => (
            "spec.copies[].objectLock.mode",
            "spec.copies[].objectLock.period",
        ),
        _ => (
            "spec.objectStore.objectLock.mode",
            "spec.objectStore.objectLock.period",
        ),
    };
    // Lower case, as the CRD's pattern says (the command line accepts any case).
    let mode = match lock.mode.as_str() {
        "governance" | "compliance" => lock.mode.parse(),
        other => other
            .parse::<tidemark_core::lock::LockMode>()
            .and(Err(format!(
                "invalid object lock mode {other:?}: expected {}",
                tidemark_core::lock::LOCK_MODES
            ))),
    }
    .map_err(|problem| PolicyFileError::Invalid {
        field: mode_field,
        problem,
    })?;
    let (field, text) = match (&lock.period, window) {
        (Some(p), _) => (period_field, p),
        (None, Some(w)) => ("spec.retention.window", w),
        (None, None) => {
            return Err(PolicyFileError::Invalid {
                field: period_field,
                problem: "required when spec.retention.window is not set (how long a chain's last backup stays locked, e.g. 30d)".into(),
            });
        }
    };
    let period: tidemark_core::RetentionDuration =
        text.parse()
            .map_err(|e: tidemark_core::DurationError| PolicyFileError::Invalid {
                field,
                problem: e.to_string(),
            })?;
    if period.as_signed_duration().is_zero() {
        return Err(PolicyFileError::Invalid {
            field,
            problem: "a lock of 0 days locks nothing; give a positive span, e.g. 30d".into(),
        });
    }
    Ok(Some(tidemark_core::lock::ObjectLock { mode, period }))
}

impl BackupPolicy {
    /// Parses one YAML document and checks what a single object can be checked for.
    ///
    /// # Errors
    /// YAML syntax or an unknown field (with line and column), another kind or version, or
    /// a retention policy without an object store.
    pub fn from_yaml(text: &str) -> Result<Self, PolicyFileError> {
        let value = crate::fields::yaml_document(text).map_err(|e| match e {
            crate::fields::YamlError::Syntax(m) => PolicyFileError::Syntax(m),
            bound => PolicyFileError::Invalid {
                field: "(file)",
                problem: bound.to_string(),
            },
        })?;
        Self::parse(value, Some(text))
    }

    /// [`BackupPolicy::from_yaml`] for a document already read as YAML (one of several in
    /// a file).
    ///
    /// # Errors
    /// As [`BackupPolicy::from_yaml`].
    pub fn from_value(value: serde_json::Value) -> Result<Self, PolicyFileError> {
        Self::parse(value, None)
    }

    fn parse(value: serde_json::Value, text: Option<&str>) -> Result<Self, PolicyFileError> {
        crate::fields::known_fields(
            &<BackupPolicyCrd as kube::CustomResourceExt>::crd(),
            &value,
            text,
        )
        .map_err(|problem| PolicyFileError::Invalid {
            field: "spec",
            problem,
        })?;
        serde_json::from_value::<BackupPolicy>(value)
            .map_err(|e| PolicyFileError::Syntax(e.to_string()))?
            .checked()
    }

    fn checked(self) -> Result<Self, PolicyFileError> {
        if self.kind != "BackupPolicy" {
            return Err(PolicyFileError::Kind { found: self.kind });
        }
        if self.api_version != crate::version::API_VERSION {
            return Err(PolicyFileError::ApiVersion {
                found: self.api_version,
            });
        }
        self.validate()?;
        Ok(self)
    }

    /// Single-object validation (the operator's CRD carries the same rules).
    ///
    /// # Errors
    /// As [`BackupPolicySpec::validate`].
    pub fn validate(&self) -> Result<(), PolicyFileError> {
        self.spec.validate()
    }

    /// The cluster directory: `spec.cluster`, else `metadata.name`.
    pub fn cluster(&self) -> &str {
        self.spec
            .cluster
            .as_deref()
            .unwrap_or(self.metadata.name.as_str())
    }

    /// The policy as its copy `name` sees it: the copy's store (with the copy's lock) in
    /// place of its own, the copy's retention (else its own) and bandwidth, the same
    /// cluster directory, no copies of its own. What reads or keeps the copy — its
    /// retention pass, `restore --from-copy`, `ls`, `verify` — works on this policy as on any.
    /// `None` when the policy names no such copy.
    pub fn as_copy(&self, name: &str) -> Option<BackupPolicy> {
        let mut out = self.clone();
        out.spec = self.spec.as_copy(name, self.cluster())?;
        Some(out)
    }
}

impl BackupPolicyCrd {
    /// The policy object as its copy `name` sees it ([`BackupPolicySpec::as_copy`], the
    /// cluster directory its own or its name): what reads or keeps the copy in the cluster
    /// — the copy's pass and retention, a Restore's `from`, `kubectl tidemark … --from-copy`
    /// — opens and plans it as any policy. `None` when the policy names no such copy.
    pub fn as_copy(&self, name: &str) -> Option<BackupPolicyCrd> {
        let own = self.metadata.name.as_deref().unwrap_or_default();
        let cluster = self.spec.cluster_or(own).to_owned();
        let mut out = self.clone();
        out.spec = self.spec.as_copy(name, &cluster)?;
        Some(out)
    }
}

/// How a restore test came out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreTestResult {
    pub tested_at: Time,
    pub passed: bool,
    /// The instant restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Time>,
    /// The backup restored (the last of its chain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables_checked: Option<u64>,
    /// Chunks of the restore oracle compared (`binlogArchive.checksums`; issue 48).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_chunks: Option<u64>,
    /// What failed (at most 5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `restoreTest.replay`: applier, client or nothing; anything else is refused, named.
    #[test]
    fn a_restore_tests_replay_is_applier_or_client() {
        let spec = |replay: Option<&str>| RestoreTestSpec {
            schedule: "0 0 4 * * *".into(),
            replay: replay.map(str::to_owned),
            ..Default::default()
        };
        for ok in [None, Some("applier"), Some("client")] {
            assert!(spec(ok).settings().is_ok(), "{ok:?}");
        }
        let e = spec(Some("Client")).settings().unwrap_err().to_string();
        assert!(
            e.contains("spec.restoreTest.replay") && e.contains("applier or client"),
            "{e}"
        );
    }

    /// `binlogArchive.checksums` (issue 48): each field bounded, patterns of the form the
    /// archiver takes, and a server to log in to; each refusal names its field.
    #[test]
    fn the_oracles_checksums_are_checked_field_by_field() {
        let doc = |checksums: &str, source: &str| {
            BackupPolicy::from_yaml(&format!(
                "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {{name: p}}\nspec:\n  objectStore: {{url: 'file:///b'}}\n  binlogArchive: {{{source}, checksums: {checksums}}}\n"
            ))
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        let server = "server: {host: db}";
        assert_eq!(
            doc(
                "{every: 30m, tables: ['shop.*'], skip: ['*.audit_log'], chunkRows: 5000, pauseMilliseconds: 10}",
                server
            ),
            Ok(())
        );
        assert_eq!(doc("{}", server), Ok(()));
        for (bad, field) in [
            ("{every: soon}", "spec.binlogArchive.checksums.every"),
            ("{every: 200h}", "spec.binlogArchive.checksums.every"),
            ("{tables: [orders]}", "spec.binlogArchive.checksums.tables"),
            (
                "{skip: ['a.b', audit]}",
                "spec.binlogArchive.checksums.skip",
            ),
            ("{chunkRows: 10}", "spec.binlogArchive.checksums.chunkRows"),
            (
                "{pauseMilliseconds: 60001}",
                "spec.binlogArchive.checksums.pauseMilliseconds",
            ),
        ] {
            let e = doc(bad, server).unwrap_err();
            assert!(e.contains(field), "{bad}: {e}");
        }
        let index = "binlogIndex: /var/lib/mysql/mysql-bin.index";
        let e = doc("{}", index).unwrap_err();
        assert!(
            e.contains("spec.binlogArchive.checksums.client: required"),
            "{e}"
        );
        assert_eq!(
            doc(
                "{client: ['--defaults-extra-file=/etc/tidemark/oracle.cnf']}",
                index
            ),
            Ok(())
        );
        let e = doc("{client: ['--password=hunter2']}", index).unwrap_err();
        assert!(
            e.contains("without a password") && !e.contains("hunter2"),
            "{e}"
        );
        let e = doc("{client: ['--socket=/run/mysqld.sock']}", server).unwrap_err();
        assert!(e.contains("is for tidemark run"), "{e}");
    }

    /// `binlogArchive.purge` (issue 45 §4): a duration and a quantity, with a server to log
    /// in to; each refusal names its field.
    #[test]
    fn a_binlog_purge_is_checked_field_by_field() {
        let doc = |purge: &str, source: &str| {
            BackupPolicy::from_yaml(&format!(
                "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {{name: p}}\nspec:\n  objectStore: {{url: 'file:///b'}}\n  binlogArchive: {{{source}, purge: {purge}}}\n"
            ))
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        let server = "server: {host: db}";
        assert_eq!(doc("{keep: 2h, maxDiskUsage: 50Gi}", server), Ok(()));
        let e = doc("{keep: soon}", server).unwrap_err();
        assert!(
            e.contains("spec.binlogArchive.purge.keep") && e.contains("\"soon\""),
            "{e}"
        );
        let e = doc("{maxDiskUsage: lots}", server).unwrap_err();
        assert!(e.contains("spec.binlogArchive.purge.maxDiskUsage"), "{e}");
        assert_eq!(
            doc(
                "{keep: 2h, replicas: [{host: shop-db-1.shop-db}, {host: 'fd00::5', port: 3307}]}",
                server
            ),
            Ok(())
        );
        let e = doc("{replicas: [{host: 'db; rm -rf /'}]}", server).unwrap_err();
        assert!(
            e.contains("spec.binlogArchive.purge.replicas") && e.contains("rm -rf"),
            "{e}"
        );
        let e = doc("{replicas: [{host: 'db:3306'}]}", server).unwrap_err();
        assert!(e.contains("spec.binlogArchive.purge.replicas"), "{e}");
        let e = doc("{replicas: [{host: '--help'}]}", server).unwrap_err();
        assert!(e.contains("spec.binlogArchive.purge.replicas"), "{e}");
        let e = doc("{keep: 2h}", "binlogIndex: /var/lib/mysql/mysql-bin.index").unwrap_err();
        assert!(e.contains("needs binlogArchive.server"), "{e}");
    }

    /// Every retention duration of a policy written `<n>m` is named, with its field; `mo`,
    /// `d`, `w` and intervals' minutes are not.
    #[test]
    fn months_written_m_are_named_field_by_field() {
        let p = BackupPolicy::from_yaml(
            "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {name: p}\nspec:\n  retentionInterval: 90m\n  objectStore: {url: 'file:///b', objectLock: {mode: governance, period: 2m}}\n  retention: {window: 90m, failedBackupsTTL: 3mo}\n  backupHistory: {maxAge: 1m}\n",
        )
        .unwrap();
        let found: Vec<String> = p
            .spec
            .ambiguous_durations()
            .iter()
            .map(|a| format!("{} {}", a.field, a.value))
            .collect();
        assert_eq!(
            found,
            [
                "spec.retention.window 90m",
                "spec.backupHistory.maxAge 1m",
                "spec.objectStore.objectLock.period 2m"
            ]
        );
    }

    /// The login and the identities by reference: each defaults to the fixed key of its
    /// Secret, a half login or two identities is refused, and names and keys are checked.
    #[test]
    fn secret_keys_by_reference() {
        let source = |y: &str| -> SourceSpec {
            serde_json::from_value(serde_json::from_str::<serde_json::Value>(y).unwrap()).unwrap()
        };
        let sel = r#""selector": {}"#;
        let fixed = source(&format!(r#"{{{sel}, "credentialsSecret": "db"}}"#));
        let login = fixed.login().unwrap();
        assert_eq!(
            (login.user, login.password, login.user_field),
            (
                SecretKeyRef::new("db", "username"),
                SecretKeyRef::new("db", "password"),
                "spec.source.credentialsSecret"
            )
        );
        let mixed = source(&format!(
            r#"{{{sel}, "credentialsSecret": "db", "passwordFrom": {{"name": "root", "key": "root-password"}}}}"#
        ));
        assert_eq!(
            mixed
                .login()
                .map(|l| (l.user, l.password, l.password_field)),
            Some((
                SecretKeyRef::new("db", "username"),
                SecretKeyRef::new("root", "root-password"),
                "spec.source.passwordFrom"
            ))
        );
        assert!(mixed.validate().is_ok());
        let half = source(&format!(
            r#"{{{sel}, "usernameFrom": {{"name": "root", "key": "user"}}}}"#
        ));
        assert_eq!(half.login(), None);
        let e = half.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("spec.source.passwordFrom: required with usernameFrom"),
            "{e}"
        );
        for (bad, field) in [
            (
                r#"{"name": "../team-b/x", "key": "k"}"#,
                "spec.source.usernameFrom.name",
            ),
            (
                r#"{"name": "root", "key": "../k"}"#,
                "spec.source.usernameFrom.key",
            ),
        ] {
            let e = source(&format!(
                r#"{{{sel}, "usernameFrom": {bad}, "passwordFrom": {{"name": "r", "key": "p"}}}}"#
            ))
            .validate()
            .unwrap_err()
            .to_string();
            assert!(e.starts_with(field), "{e}");
        }
        assert_eq!(source(&format!("{{{sel}}}")).login(), None);

        let enc = |v: serde_json::Value| -> EncryptionSpec { serde_json::from_value(v).unwrap() };
        let by_secret = enc(serde_json::json!({"identitySecret": "age"}));
        assert_eq!(
            by_secret.identity(),
            Some(SecretKeyRef::new("age", "identity"))
        );
        let by_ref = enc(serde_json::json!({"identityFrom": {"name": "age", "key": "key.txt"}}));
        assert_eq!(by_ref.identity(), Some(SecretKeyRef::new("age", "key.txt")));
        assert!(by_ref.validate().is_ok());
        let both = enc(
            serde_json::json!({"identitySecret": "a", "identityFrom": {"name": "age", "key": "k"}}),
        );
        assert!(
            both.validate()
                .unwrap_err()
                .to_string()
                .contains("set one of")
        );

        let keys = CredentialsKeys {
            access_key_id: Some("ACCESS_KEY_ID".into()),
            sas_token: Some("bad key".into()),
            ..Default::default()
        };
        assert_eq!(keys.key_for("accessKeyId"), Some("ACCESS_KEY_ID"));
        assert_eq!(keys.key_for("secretAccessKey"), None);
        let e = keys.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("spec.objectStore.credentialsKeys.sasToken"),
            "{e}"
        );
    }

    /// The schema's recipient pattern (what every API server enforces) and the code's check
    /// agree.
    #[test]
    fn recipient_pattern_and_code_agree() {
        let re = regex::Regex::new(RECIPIENT_PATTERN).unwrap();
        let good = format!(
            "age1{}",
            "qpzry9x8gf2tvdw0s3jn54khce6mua7l".repeat(2)[..58].to_owned()
        );
        for (v, ok) in [
            (good.clone(), true),
            (good.to_uppercase(), false),
            (good.replace('q', "b"), false),
            (good[..61].to_owned(), false),
            (format!("{good}q"), false),
            ("age1".to_owned(), false),
            (format!("age2{}", &good[4..]), false),
        ] {
            assert_eq!(re.is_match(&v), ok, "{v}");
            assert_eq!(is_recipient(&v), ok, "{v}");
        }
        let spec = EncryptionSpec {
            recipients: vec!["age1nope".into()],
            ..Default::default()
        };
        let e = spec.validate().unwrap_err().to_string();
        assert!(e.contains("age1nope") && e.contains("recipients"), "{e}");
    }

    #[test]
    fn an_unknown_enum_value_is_read_then_refused_by_name() {
        let spec: BackupPolicySpec =
            serde_json::from_value(serde_json::json!({"deletionPolicy": "Archive"})).unwrap();
        assert_eq!(
            spec.deletion_policy,
            Some(DeletionPolicy::Unknown("Archive".into()))
        );
        let e = spec.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("spec.deletionPolicy: \"Archive\"") && e.contains("Retain, Delete"),
            "{e}"
        );
        for (text, value) in [
            ("Retain", DeletionPolicy::Retain),
            ("Delete", DeletionPolicy::Delete),
        ] {
            let spec: BackupPolicySpec =
                serde_json::from_value(serde_json::json!({ "deletionPolicy": text })).unwrap();
            assert_eq!(spec.deletion_policy, Some(value));
            assert_eq!(serde_json::to_value(&spec).unwrap()["deletionPolicy"], text);
            spec.validate().unwrap();
        }
    }

    #[test]
    fn resources_are_quantities_of_known_names() {
        for q in [
            "1", "100m", "0.5", ".5", "512Mi", "2Gi", "1e3", "1E-2", "+3k",
        ] {
            assert!(is_quantity(q), "{q}");
        }
        for q in ["", "1.5.2", "12 Mi", "Mi", "1Gb", "-", ".", "1e", "x"] {
            assert!(!is_quantity(q), "{q}");
        }
        let spec = |r: serde_json::Value| -> BackupPolicySpec {
            serde_json::from_value(serde_json::json!({ "resources": r })).unwrap()
        };
        spec(serde_json::json!({"backup": {"requests": {"cpu": 2, "memory": "1Gi"}}}))
            .validate()
            .unwrap();
        let e = spec(serde_json::json!({"archiver": {"limits": {"memory": "1 GB"}}}))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("spec.resources.archiver") && e.contains("\"1 GB\"") && e.contains("512Mi"),
            "{e}"
        );
        // Values the schema of old API servers lets through: refused with the field, never
        // a failure to read the object.
        for (value, shown) in [
            (serde_json::json!({"a": 1}), r#""{\"a\":1}""#),
            (serde_json::json!([1]), r#""[1]""#),
            (serde_json::json!(true), r#""true""#),
            (serde_json::json!(null), r#""null""#),
            (
                serde_json::json!({"k": "x".repeat(100_000)}),
                r#""{\"k\":\"xxx"#,
            ),
            // A string too long to be a quantity is shown cut.
            (serde_json::json!("9".repeat(100_000)), "\"999"),
        ] {
            let e = spec(serde_json::json!({"backup": {"limits": {"cpu": value}}}))
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("spec.resources.backup") && e.contains(shown) && e.len() < 300,
                "{e}"
            );
        }
        let e = spec(serde_json::json!({"install": {"requests": {"g".repeat(100_000): "1"}}}))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"ggg") && e.len() < 300, "{e}");
        let e = spec(serde_json::json!({"install": {"requests": {"gpu": "1"}}}))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"gpu\"") && e.contains("ephemeral-storage"),
            "{e}"
        );
    }

    const EXAMPLE: &str = r#"
apiVersion: tidemark.io/v1alpha1
kind: BackupPolicy
metadata:
  name: cluster-sample
spec:
  objectStore:
    bucket: my-backups
    path: prod
    endpoint: http://127.0.0.1:8333
  timeZone: Europe/Paris
  retention:
    window: 30d
    keepLast: 7
    keepDaily: 7
    failedBackupsTTL: 7d
    coverWindow: true
"#;

    /// `objectStore.objectLock`: the mode as the CRD spells it, the period from the setting
    /// or else the retention window, and an error naming the field otherwise.
    #[test]
    fn object_lock_takes_its_period_from_the_window_unless_given() {
        let with = |lock: &str| {
            BackupPolicy::from_yaml(&EXAMPLE.replace(
                "    endpoint: http://127.0.0.1:8333\n",
                &format!("    endpoint: http://127.0.0.1:8333\n    objectLock: {lock}\n"),
            ))
        };
        let p = with("{mode: governance}").unwrap();
        let l = p.spec.object_lock().unwrap().unwrap();
        assert_eq!(l.mode, tidemark_core::lock::LockMode::Governance);
        assert_eq!(l.period, "30d".parse().unwrap());
        let p = with("{mode: compliance, period: 8w}").unwrap();
        let l = p.spec.object_lock().unwrap().unwrap();
        assert_eq!(l.mode, tidemark_core::lock::LockMode::Compliance);
        assert_eq!(l.period, "8w".parse().unwrap());
        for (lock, says) in [
            ("{mode: GOVERNANCE}", "spec.objectStore.objectLock.mode"),
            ("{mode: legal-hold}", "\"legal-hold\""),
            (
                "{mode: governance, period: 30s}",
                "spec.objectStore.objectLock.period",
            ),
            ("{mode: governance, period: 0d}", "locks nothing"),
        ] {
            let e = with(lock).unwrap_err().to_string();
            assert!(e.contains(says), "{lock}: {e}");
        }
        let no_window = EXAMPLE.replace("    window: 30d\n", "").replace(
            "    endpoint: http://127.0.0.1:8333\n",
            "    endpoint: http://127.0.0.1:8333\n    objectLock: {mode: governance}\n",
        );
        let e = BackupPolicy::from_yaml(&no_window).unwrap_err().to_string();
        assert!(
            e.contains("required when spec.retention.window is not set"),
            "{e}"
        );
    }

    #[test]
    fn parses_the_documented_example() {
        let p = BackupPolicy::from_yaml(EXAMPLE).unwrap();
        assert_eq!(p.cluster(), "cluster-sample");
        let os = p.spec.object_store.as_ref().unwrap();
        assert_eq!(os.store_url().unwrap(), "s3://my-backups/prod");
        let input = p
            .spec
            .retention
            .as_ref()
            .unwrap()
            .to_input(p.spec.time_zone.as_deref());
        let policy = input.validate().unwrap();
        assert_eq!(policy.keep_last, 7);
        assert!(policy.cover_window);
        assert_eq!(policy.time_zone.iana_name(), Some("Europe/Paris"));
    }

    #[test]
    fn unknown_fields_are_refused_with_their_place() {
        let typo = EXAMPLE.replace("keepLast", "keeplast");
        let e = BackupPolicy::from_yaml(&typo).unwrap_err().to_string();
        assert!(
            e.contains("unknown field `keeplast`") && e.contains("line"),
            "{e}"
        );
    }

    #[test]
    fn retention_without_object_store_is_refused() {
        let text = EXAMPLE
            .replace("  objectStore:\n    bucket: my-backups\n    path: prod\n    endpoint: http://127.0.0.1:8333\n", "");
        let e = BackupPolicy::from_yaml(&text).unwrap_err().to_string();
        assert!(
            e.starts_with("spec.retention: a retention policy requires spec.objectStore"),
            "{e}"
        );
    }

    #[test]
    fn the_operator_uses_only_shared_stores_with_the_tenants_credentials() {
        let spec = |v: serde_json::Value| -> ObjectStoreSpec { serde_json::from_value(v).unwrap() };
        let ok = spec(serde_json::json!({"bucket": "b", "path": "p", "credentialsSecret": "s3"}));
        assert_eq!(ok.shared_url(false).unwrap(), "s3://b/p");
        let refused = |v: serde_json::Value, ambient: bool| {
            spec(v).shared_url(ambient).unwrap_err().to_string()
        };
        let e = refused(serde_json::json!({"bucket": "b"}), false);
        assert!(
            e.starts_with("spec.objectStore.credentialsSecret: required")
                && e.contains("--allow-ambient-credentials"),
            "{e}"
        );
        assert!(
            spec(serde_json::json!({"bucket": "b"}))
                .shared_url(true)
                .is_ok()
        );
        for url in ["file:///var/backups", "memory://"] {
            let e = refused(
                serde_json::json!({"url": url, "credentialsSecret": "s"}),
                true,
            );
            assert!(e.contains("one process"), "{e}");
        }
        for (url, keys) in [
            ("gs://b", "serviceAccountKey"),
            ("az://c", "sasToken"),
            ("azure://c", "accountKey"),
        ] {
            let e = refused(serde_json::json!({ "url": url }), false);
            assert!(
                e.contains("--allow-ambient-credentials") && e.contains(keys),
                "{e}"
            );
            assert!(
                spec(serde_json::json!({"url": url, "credentialsSecret": "s"}))
                    .shared_url(false)
                    .is_ok()
            );
            assert!(
                spec(serde_json::json!({"url": url}))
                    .shared_url(true)
                    .is_ok()
            );
        }
        for url in [
            "s3://key:pa55word@b/p",
            "s3://key@b",
            "s3://b/p?token=pa55word",
            "s3://b/p#pa55word",
        ] {
            let e = refused(
                serde_json::json!({"url": url, "credentialsSecret": "s"}),
                true,
            );
            assert!(
                e.contains("refused, and not repeated")
                    && !e.contains("pa55word")
                    && !e.contains("key"),
                "{e}"
            );
        }
    }

    #[test]
    fn wrong_kind_is_named() {
        let e = BackupPolicy::from_yaml(&EXAMPLE.replace("kind: BackupPolicy", "kind: Backup"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "kind is \"Backup\"; expected BackupPolicy");
    }
}

crate::lenient_enum!(DeletionPolicy { Retain = "Retain", Delete = "Delete" });
