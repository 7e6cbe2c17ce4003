//! `ScheduledBackup` and `Backup` (DESIGN.md §4, §6; seed 001): a schedule creates ordinary
//! Backups on a cron cadence, and generated Backups inherit its policy, method, target,
//! online setting and command.

// kube's `printcolumn(name = …, type_ = …)` repeats keys by design.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tidemark_core::schedule::{Cron, ScheduleSpec};

use crate::policy::{DURATION_MESSAGE, DURATION_RULE};

use crate::policy::ObjectMeta;

/// Label on every generated Backup: the schedule that owns it.
pub const SCHEDULED_BACKUP_LABEL: &str = "tidemark.io/scheduled-backup";
/// Label on the Backup of an `immediate` run.
pub const IMMEDIATE_BACKUP_LABEL: &str = "tidemark.io/immediate-backup";

/// A reference to a BackupPolicy by name (same namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRef {
    /// The BackupPolicy's `metadata.name`.
    #[x_kube(validation = Rule::new("self != ''").message("name the BackupPolicy that says where backups go"))]
    #[schemars(pattern(crate::names::SUBDOMAIN_PATTERN), length(max = 253))]
    pub name: String,
}

/// Who owns a generated Backup (seed 001).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum OwnerReferenceMode {
    /// Owned by the ScheduledBackup: deleting the schedule can garbage-collect its Backups.
    #[default]
    SelfOwned,
    /// Owned by the protected cluster.
    Cluster,
    /// No owner: Backups outlive the schedule.
    None,
    /// A value this version does not know (a newer CRD's); refused by `validate`.
    Unknown(String),
}

/// `full` or `incremental`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum BackupType {
    #[default]
    Full,
    Incremental,
    /// A value this version does not know (a newer CRD's); the Backup is refused.
    Unknown(String),
}

/// What a Backup runs; shared by Backup and ScheduledBackup.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupTemplate {
    /// The BackupPolicy that says where backups go and how long they are kept.
    pub policy: PolicyRef,
    /// `mariabackup`, `xtrabackup`, `exec`, `job` (default `mariabackup`; `mysql-clone` for
    /// a policy whose `source.engine` is `mysql`), `mysql-clone` (MySQL's clone plugin) or
    /// `mysqldump` (MySQL's logical dump).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = METHODS))]
    pub method: Option<String>,
    /// Which database pod to back up: `primary`, or `prefer-standby` (a running standby when
    /// there is one, else the primary). Default `prefer-standby`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = TARGETS))]
    pub target: Option<String>,
    /// Back up a running server (the default); `false` is refused by physical methods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online: Option<bool>,
    /// The command whose stdout is the backup. Method `exec`: in the operator, run in the
    /// database container through `pods/exec` (e.g. `[mariadb-dump, --all-databases]`);
    /// in standalone mode, run locally. Standalone `mariabackup`: the program and its
    /// connection options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = 4096)))]
    pub command: Vec<String>,
    /// For method `job`: the pod template of the Job that makes the backup. Every
    /// container gets the destination in its environment (`TIDEMARK_STORE`,
    /// `TIDEMARK_CLUSTER`, `TIDEMARK_BACKUP_NAME`, `TIDEMARK_BACKUP_ID`, the store's
    /// credentials) and `tidemark` at `/tidemark-bin/tidemark`; it is expected to run
    /// `tidemark push --backup-name "$TIDEMARK_BACKUP_NAME" --backup-id "$TIDEMARK_BACKUP_ID" -- …`.
    /// At most 64 KiB as JSON: a larger one fails the Backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::lifecycle::opaque_object")]
    pub job_template: Option<serde_json::Value>,
    /// What deleting the Backup object does to its remote data: `Retain` (nothing; the
    /// default) or `Delete` (the finalizer `tidemark.io/remote-cleanup` deletes it, unless
    /// a recovery depends on it). Overrides the BackupPolicy's `deletionPolicy`; a
    /// ScheduledBackup's template passes it to the Backups it creates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<crate::policy::DeletionPolicy>,
    /// How this backup's payload is written, overriding the BackupPolicy's
    /// `objectStore.compression`: `none`, `zstd` (level 3) or `zstd:<level>` (1–19).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(tidemark_core::compression::COMPRESSION_RULE).message(tidemark_core::compression::COMPRESSION_FORM))]
    pub compression: Option<String>,
}

impl BackupTemplate {
    /// The template's own compression setting, when it gives one.
    ///
    /// # Errors
    /// A value that is not a compression setting, with the accepted form.
    pub fn compression(
        &self,
    ) -> Result<Option<tidemark_core::compression::Compression>, ScheduleFileError> {
        self.compression
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(
                |e: tidemark_core::compression::CompressionError| ScheduleFileError::Invalid {
                    field: "spec.compression",
                    problem: e.to_string(),
                },
            )
    }
}

/// Scheduled incrementals (seed 002): the first backup of a data directory is full, then
/// each is an incremental on the newest restorable backup of the same data directory, with
/// a full again once that backup's chain holds `maxIncrementsPerFull` increments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IncrementalSpec {
    /// A full once the chain holds this many increments (seed 002's
    /// MaxIncrBackupsPerFullBackup; the seed's "a full after every N backups" is N − 1),
    /// 1–10000. Omitted: forever incremental — a full only when there is nothing to build
    /// on; with the policy's `consolidate`, chains are merged into synthetic fulls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_increments_per_full: Option<u32>,
}

/// The largest `maxIncrementsPerFull`.
pub const MAX_INCREMENTS_PER_FULL: u32 = 10_000;

impl IncrementalSpec {
    /// Checks the bound, and that `method` (default `mariabackup`) takes incrementals.
    ///
    /// # Errors
    /// The field, the value and the accepted form.
    pub fn validate(&self, method: Option<&str>) -> Result<(), ScheduleFileError> {
        if let Some(n) = self.max_increments_per_full
            && !(1..=MAX_INCREMENTS_PER_FULL).contains(&n)
        {
            return Err(ScheduleFileError::Invalid {
                field: "spec.incremental.maxIncrementsPerFull",
                problem: format!("{n} is out of range; expected 1 to {MAX_INCREMENTS_PER_FULL}"),
            });
        }
        let method = method.unwrap_or("mariabackup");
        if !INCREMENTAL_METHODS.contains(&method) {
            return Err(ScheduleFileError::Invalid {
                field: "spec.incremental",
                problem: format!(
                    "method {method} takes whole backups only; incrementals need {}",
                    INCREMENTAL_METHODS.join(" or ")
                ),
            });
        }
        Ok(())
    }
}

/// The methods that take incrementals.
pub const INCREMENTAL_METHODS: [&str; 2] = ["mariabackup", "xtrabackup"];

/// The methods a Backup may name.
pub const METHODS: [&str; 6] = [
    "mariabackup",
    "xtrabackup",
    "exec",
    "job",
    "mysql-clone",
    "mysqldump",
];
/// The targets a Backup may name.
pub const TARGETS: [&str; 2] = ["primary", "prefer-standby"];

/// A `ScheduledBackup` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduledBackup {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ScheduledBackupSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// Creates Backups on a cron cadence (seed 001): six fields, seconds first, or a macro.
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[kube(
    group = "tidemark.io",
    version = "v1alpha1",
    kind = "ScheduledBackup",
    root = "ScheduledBackupCrd",
    namespaced,
    status = "ScheduledBackupStatus",
    shortname = "tsb",
    category = "tidemark",
    validation = Rule::new("self.metadata.name.size() <= 63").message("metadata.name: at most 63 characters (it labels the Backups the schedule creates)"),
    doc = "Creates ordinary Backups on a cron cadence (six fields, seconds first, or a macro such as @daily): deterministic names, an optional immediate first backup, never two running at once.",
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(name = "Last", type_ = "date", json_path = ".status.lastScheduleTime"),
    printcolumn(
        name = "Next",
        type_ = "string",
        json_path = ".status.nextScheduleTime"
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
#[serde(rename_all = "camelCase")]
pub struct ScheduledBackupSpec {
    /// Cron with six fields, seconds first: `second minute hour day-of-month month
    /// day-of-week` (e.g. `0 0 2 * * *`, every day at 02:00:00); or a macro (`@hourly`,
    /// `@daily`/`@midnight`, `@weekly`, `@monthly`, `@yearly`/`@annually`). Five fields are
    /// refused (seed 001): `0 2 * * *` is written `0 0 2 * * *`. Day-of-week 0–7 (Sunday
    /// is 0 or 7) or MON–SUN; when both day fields are restricted, a day matching either
    /// fires.
    #[x_kube(validation = Rule::new(crate::cron::CRON_RULE).message(crate::cron::CRON_MESSAGE))]
    pub schedule: String,
    /// One backup at the first evaluation, besides the cadence.
    #[serde(default)]
    pub immediate: bool,
    /// No new backups while true (running ones finish, completed ones stay).
    #[serde(default)]
    pub suspend: bool,
    /// Who owns generated Backups: `self` (this schedule), `cluster` (the BackupPolicy) or
    /// `none`.
    #[serde(default)]
    pub backup_owner_reference: OwnerReferenceMode,
    /// IANA zone the cron is read in (default: the policy's `timeZone`, else UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// The `ttl` of every Backup it creates (`<n>d|<n>w|<n>mo`; seed 004): in the operator
    /// such a Backup expires that long after its creation and is deleted with its data
    /// (never the newest restorable backup); on one machine its `metadata.json` records it
    /// and retention passes delete the backup once it is that old.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub ttl: Option<String>,
    /// Labels every Backup it creates carries, besides Tidemark's own (seed 003:
    /// DeleteHooks select Backups by label). Keys under `tidemark.io/` are Tidemark's. At
    /// most 64.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_BACKUP_LABELS))]
    pub backup_labels: BTreeMap<String, String>,
    /// Scheduled incrementals (seed 002; methods mariabackup and xtrabackup): each Backup
    /// it creates is an incremental on the newest restorable backup of the chosen pod's
    /// data directory, or a full when there is none or its chain is full. Omitted: every
    /// Backup is a full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incremental: Option<IncrementalSpec>,
    /// How many of the Backups it generated stay once retention removed their data, and
    /// of its failed ones (operator only): the scheduler deletes the
    /// others (seed 000: pruning Backup objects is the scheduler's job, never the
    /// retention pass's). Default: the policy's `backupHistory`, else 10 successful and 3
    /// failed. Never while `suspend` is true (seed 001).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_history: Option<crate::policy::BackupHistory>,
    #[serde(flatten)]
    pub template: BackupTemplate,
}

/// A `Backup` document: one backup attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackupDocument {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: BackupSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// One backup attempt.
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[kube(
    group = "tidemark.io",
    version = "v1alpha1",
    kind = "Backup",
    root = "BackupCrd",
    namespaced,
    status = "BackupStatus",
    shortname = "tbk",
    category = "tidemark",
    doc = "One backup of a BackupPolicy's database, streamed to its object store.",
    printcolumn(name = "Policy", type_ = "string", json_path = ".spec.policy.name"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Backup id", type_ = "string", json_path = ".status.backupId"),
    printcolumn(
        name = "Size",
        type_ = "integer",
        json_path = ".status.size",
        priority = 1
    ),
    printcolumn(
        name = "Type",
        type_ = "string",
        json_path = ".status.type",
        priority = 1
    ),
    printcolumn(
        name = "Data removed",
        type_ = "date",
        json_path = ".status.dataRemoved.at"
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
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    #[serde(flatten)]
    pub template: BackupTemplate,
    /// `full` (default) or `incremental` (from the newest restorable backup's end LSN).
    #[serde(default, rename = "type")]
    pub kind: BackupType,
    /// The type is chosen when the backup starts (seed 002; ScheduledBackups with
    /// `incremental` set it): an incremental on the newest restorable backup of the chosen
    /// pod's data directory, a full when there is none or its chain holds
    /// `maxIncrementsPerFull` increments. `status.type` and `status.parentId` say what was
    /// taken. `type` is then ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incremental: Option<IncrementalSpec>,
    /// Delete this backup once this old (`<n>d|<n>w|<n>mo`), whatever the policy says. In
    /// the operator the Backup expires that long after its creation and is deleted with its
    /// data, whatever `deletionPolicy` says (never the newest restorable backup; a chain's
    /// base is marked and goes when safe); the store also records it, so retention passes
    /// honour it (except the floor, locks, holds and chains).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub ttl: Option<String>,
}

impl BackupSpec {
    /// Its `ttl` when written with seed 000's ambiguous `<n>m`.
    pub fn ambiguous_durations(&self) -> Vec<tidemark_core::AmbiguousDuration> {
        tidemark_core::AmbiguousDuration::check("spec.ttl", self.ttl.as_deref())
            .into_iter()
            .collect()
    }
}

/// The most `backupLabels` a ScheduledBackup may give (issue 28: each Backup it makes
/// carries them, in the operator's caches).
pub const MAX_BACKUP_LABELS: usize = 64;

/// The largest `jobTemplate` (as JSON) a Backup may give: a pod template that runs `tidemark
/// push` is a few KiB. The schema cannot bound an object it keeps whole (a free-form pod
/// template), so the operator refuses a larger one when the Backup starts, and its caches
/// never hold the field (issue 28).
pub const MAX_JOB_TEMPLATE_BYTES: usize = 64 << 10;

/// Why a pod template (`field`, as JSON) is refused for its size: more than
/// [`MAX_JOB_TEMPLATE_BYTES`], named with `hint` after the bound; `None` when it is within.
pub fn template_too_large(template: &serde_json::Value, field: &str, hint: &str) -> Option<String> {
    let size = serde_json::to_vec(template).map_or(usize::MAX, |b| b.len());
    (size > MAX_JOB_TEMPLATE_BYTES).then(|| {
        format!("{field} is {size} bytes; at most {MAX_JOB_TEMPLATE_BYTES} are accepted{hint}")
    })
}

/// Scheduler progress (seed 001).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledBackupStatus {
    /// The `metadata.generation` this status was written for (kstatus, Argo and Flux
    /// health checks compare the two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The last time the schedule was evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check_time: Option<Time>,
    /// The last scheduled time that produced or adopted a Backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// The next expected cron slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,
    /// The last slot handled in any way (created, adopted or skipped on a name collision):
    /// where the scheduler resumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_slot: Option<Time>,
    /// Whether the immediate backup was created or adopted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub immediate_done: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A Backup's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BackupPhase {
    Pending,
    Running,
    Completed,
    Failed,
    /// A phase a newer operator wrote: this one leaves the Backup alone.
    #[serde(other)]
    Unknown,
}

impl BackupPhase {
    /// Completed or failed: the concurrency guard lets the next slot run.
    pub fn is_done(self) -> bool {
        matches!(self, BackupPhase::Completed | BackupPhase::Failed)
    }
}

/// Where a backup's bytes went and how its attempt ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// The `metadata.generation` this status was written for (kstatus, Argo and Flux
    /// health checks compare the two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `pending`, `running`, `completed` or `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,
    /// The backup's id in the store (its directory under the cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    /// The Job that runs (or ran) the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// The bucket (or store URL) the backup is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// The key of its committed `metadata.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `sha256:<hex>` of the payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// Payload bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// What was taken, `full` or `incremental` (with `spec.incremental` chosen when the
    /// backup started).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The backup-id an incremental builds on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// Why the attempt failed (secrets redacted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The end of the backup Job's log (its last lines, at most 4 KiB, secrets redacted),
    /// kept when the Job ends: `kubectl tidemark logs backup NAME` shows it once the Job is
    /// gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub log_tail: Option<String>,
    /// `Ready`, and while the attempt cannot start, `Blocked` with the reason (a volume that
    /// cannot be shared, a database pod that is not running); `RemoteCleanup` and `Expired`
    /// from the deletion. A map by `type`: each writer owns its own (server-side apply).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::maplist::nullable"
    )]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"], "nullable" = true))]
    pub conditions: Vec<Condition>,
    /// The DeleteHooks that ran when the backup was deleted, in the order they ran.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::maplist::nullable"
    )]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"], "nullable" = true))]
    pub hooks: Vec<HookResult>,
    /// Set when a retention pass deleted the backup's data while this object stays (the
    /// object stays until the backup history limit or age lets it go).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_removed: Option<DataRemoved>,
    /// The last restore test that restored this backup (its policy's `restoreTest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_test: Option<RestoreTestResult>,
}

pub use crate::policy::RestoreTestResult;

/// When and why retention removed a backup's data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataRemoved {
    pub at: Time,
    /// The plan's reasons (`beyondWindow`, `ttlExpired`, `failedExpired`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// The key of the pass's audit record in the store (what it deleted, and why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_record: Option<String>,
    /// The synthetic full that consolidation merged this backup into (seed 002).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged_into: Option<StoredBackup>,
    /// The synthetic full that holds this backup's restore point now (it stands in for the
    /// last backup of the chain it merged): deleting this object (`deletionPolicy:
    /// Delete`) deletes that backup, under the same rules; history pruning leaves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_by: Option<StoredBackup>,
}

/// A backup in the store: its `<backup-name>/<backup-id>` directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoredBackup {
    pub backup_name: String,
    pub backup_id: String,
}

/// What one DeleteHook did (seed 003): hooks cannot veto a deletion, so every outcome is
/// only recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookResult {
    /// The DeleteHook's name.
    pub name: String,
    /// `running` (a Job still going), `succeeded`, `failed` or `timedOut`.
    pub outcome: String,
    /// Why it failed, or what it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}

/// Why a ScheduledBackup was refused: the field, the value and the accepted form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleFileError {
    #[error("not a ScheduledBackup document: {0}")]
    Syntax(String),
    #[error("kind is {found:?}; expected ScheduledBackup")]
    Kind { found: String },
    #[error("apiVersion is {found:?}; expected {}", crate::version::API_VERSION)]
    ApiVersion { found: String },
    #[error("{field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },
}

impl ScheduledBackup {
    /// Parses one YAML document and validates it.
    ///
    /// # Errors
    /// YAML syntax or an unknown field, another kind or version, or an invalid field.
    pub fn from_yaml(text: &str) -> Result<Self, ScheduleFileError> {
        let value = crate::fields::yaml_document(text)
            .map_err(|e| ScheduleFileError::Syntax(e.to_string()))?;
        Self::parse(value, Some(text))
    }

    /// [`ScheduledBackup::from_yaml`] for a document already read as YAML.
    ///
    /// # Errors
    /// As [`ScheduledBackup::from_yaml`].
    pub fn from_value(value: serde_json::Value) -> Result<Self, ScheduleFileError> {
        Self::parse(value, None)
    }

    fn parse(value: serde_json::Value, text: Option<&str>) -> Result<Self, ScheduleFileError> {
        crate::fields::known_fields(
            &<ScheduledBackupCrd as kube::CustomResourceExt>::crd(),
            &value,
            text,
        )
        .map_err(|problem| ScheduleFileError::Invalid {
            field: "spec",
            problem,
        })?;
        serde_json::from_value::<ScheduledBackup>(value)
            .map_err(|e| ScheduleFileError::Syntax(e.to_string()))?
            .checked()
    }

    fn checked(self) -> Result<Self, ScheduleFileError> {
        if self.kind != "ScheduledBackup" {
            return Err(ScheduleFileError::Kind { found: self.kind });
        }
        if self.api_version != crate::version::API_VERSION {
            return Err(ScheduleFileError::ApiVersion {
                found: self.api_version,
            });
        }
        self.validate()?;
        Ok(self)
    }

    /// Single-object validation.
    ///
    /// # Errors
    /// The schedule is not cron (six fields or a macro); the time zone is unknown; the method is not
    /// one Tidemark knows; the policy reference is empty.
    pub fn validate(&self) -> Result<(), ScheduleFileError> {
        self.spec.validate()
    }

    /// The schedule as the core decisions see it. `policy_zone` is the policy's
    /// `timeZone`, used when the schedule names none.
    ///
    /// # Errors
    /// As [`ScheduledBackup::validate`].
    pub fn schedule_spec(
        &self,
        policy_zone: Option<&str>,
        created_at: jiff::Timestamp,
    ) -> Result<ScheduleSpec, ScheduleFileError> {
        self.spec
            .schedule_spec(&self.metadata.name, policy_zone, created_at)
    }

    /// The Backup this schedule creates under `name`: it inherits the policy, method,
    /// target, online setting and command, and carries the ownership labels.
    pub fn child(&self, name: &str, immediate: bool) -> BackupDocument {
        BackupDocument {
            api_version: crate::version::API_VERSION.to_owned(),
            kind: "Backup".to_owned(),
            metadata: ObjectMeta {
                name: name.to_owned(),
                namespace: self.metadata.namespace.clone(),
                labels: self.spec.labels_of_child(&self.metadata.name, immediate),
                annotations: BTreeMap::new(),
            },
            spec: self.spec.child_spec(),
            status: None,
        }
    }
}

impl ScheduledBackupSpec {
    /// Whether the chains of its incrementals end, and what retention can free of them:
    /// `(ok, reason, message)`; `None` when it takes fulls only. Seed 002's forever
    /// incremental — no `maxIncrementsPerFull` — without the policy's
    /// `retention.consolidate` is one chain for ever: retention frees nothing of it, and
    /// nothing else would say so (the operator's `ChainsEnd` condition, `tidemark run`'s
    /// warning).
    pub fn chains_end(
        &self,
        policy_name: &str,
        policy: &crate::policy::BackupPolicySpec,
    ) -> Option<(bool, &'static str, String)> {
        let incremental = self.incremental.as_ref()?;
        let consolidate = policy
            .retention
            .as_ref()
            .and_then(|r| r.consolidate)
            .unwrap_or(false);
        Some(match (incremental.max_increments_per_full, consolidate) {
            (Some(n), _) => (
                true,
                "FullEveryN",
                format!(
                    "a full after every {n} increment(s): a chain ends, and goes whole once no rule keeps its last backup"
                ),
            ),
            (None, true) => (
                true,
                "Consolidated",
                format!(
                    "forever incremental; BackupPolicy {policy_name} consolidates: retention merges what no rule keeps into synthetic fulls"
                ),
            ),
            (None, false) => (
                false,
                "ForeverIncrementalWithoutConsolidate",
                format!(
                    "spec.incremental has no maxIncrementsPerFull and BackupPolicy {policy_name} has no retention.consolidate: this schedule's chain never ends, so retention frees nothing of it and the store grows with every backup (seed 002). Set spec.incremental.maxIncrementsPerFull (a full after every N increments) or the policy's retention.consolidate: true (docs/retention.md#forever-incrementals)"
                ),
            ),
        })
    }

    /// Its durations written with seed 000's ambiguous `<n>m` (see
    /// [`BackupPolicySpec::ambiguous_durations`](crate::policy::BackupPolicySpec::ambiguous_durations)).
    pub fn ambiguous_durations(&self) -> Vec<tidemark_core::AmbiguousDuration> {
        use tidemark_core::AmbiguousDuration as A;
        [
            A::check("spec.ttl", self.ttl.as_deref()),
            A::check(
                "spec.backupHistory.maxAge",
                self.backup_history
                    .as_ref()
                    .and_then(|h| h.max_age.as_deref()),
            ),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Single-object validation (the CRD's rules, and what a schema cannot say).
    ///
    /// # Errors
    /// The schedule is not cron (six fields or a macro); the time zone is unknown; the method is not
    /// one Tidemark knows; the policy reference is empty.
    pub fn validate(&self) -> Result<(), ScheduleFileError> {
        self.schedule
            .parse::<Cron>()
            .map_err(|e| ScheduleFileError::Invalid {
                field: "spec.schedule",
                problem: e.to_string(),
            })?;
        if let Some(tz) = &self.time_zone {
            zone(tz, "spec.timeZone")?;
        }
        if let Some(ttl) = &self.ttl {
            ttl.parse::<tidemark_core::RetentionDuration>()
                .map_err(|e| ScheduleFileError::Invalid {
                    field: "spec.ttl",
                    problem: e.to_string(),
                })?;
        }
        if self.backup_labels.len() > MAX_BACKUP_LABELS {
            return Err(ScheduleFileError::Invalid {
                field: "spec.backupLabels",
                problem: format!(
                    "{} labels; at most {MAX_BACKUP_LABELS} (every Backup made carries them, and the operator keeps them in memory)",
                    self.backup_labels.len()
                ),
            });
        }
        for (k, v) in &self.backup_labels {
            let invalid = |problem: String| ScheduleFileError::Invalid {
                field: "spec.backupLabels",
                problem,
            };
            crate::names::label_key("spec.backupLabels", k)
                .map_err(|e| invalid(format!("{:?} is not {}", e.value, e.form)))?;
            if k.starts_with("tidemark.io/") {
                return Err(invalid(format!(
                    "{k:?}: keys under tidemark.io/ are Tidemark's own; choose another prefix"
                )));
            }
            let ok = v.len() <= 63
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && v.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
                && v.chars().last().is_none_or(|c| c.is_ascii_alphanumeric());
            if !ok {
                return Err(invalid(format!(
                    "{k}: {v:?} is not a label value; expected at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
                )));
            }
        }
        if let m @ OwnerReferenceMode::Unknown(_) = &self.backup_owner_reference {
            return Err(ScheduleFileError::Invalid {
                field: "spec.backupOwnerReference",
                problem: m.unknown(),
            });
        }
        if let Some(i) = &self.incremental {
            i.validate(self.template.method.as_deref())?;
        }
        if let Some(Err((field, problem))) = self.backup_history.as_ref().map(|h| h.settings()) {
            return Err(ScheduleFileError::Invalid { field, problem });
        }
        validate_template(&self.template)
    }

    /// The schedule named `name` as the core decisions see it. `policy_zone` is the
    /// policy's `timeZone`, used when the schedule names none.
    ///
    /// # Errors
    /// As [`ScheduledBackupSpec::validate`].
    pub fn schedule_spec(
        &self,
        name: &str,
        policy_zone: Option<&str>,
        created_at: jiff::Timestamp,
    ) -> Result<ScheduleSpec, ScheduleFileError> {
        let cron = self
            .schedule
            .parse::<Cron>()
            .map_err(|e| ScheduleFileError::Invalid {
                field: "spec.schedule",
                problem: e.to_string(),
            })?;
        let time_zone = match (&self.time_zone, policy_zone) {
            (Some(tz), _) => zone(tz, "spec.timeZone")?,
            (None, Some(tz)) => zone(tz, "BackupPolicy spec.timeZone")?,
            (None, None) => jiff::tz::TimeZone::UTC,
        };
        Ok(ScheduleSpec {
            name: name.to_owned(),
            cron,
            time_zone,
            immediate: self.immediate,
            suspend: self.suspend,
            created_at,
        })
    }

    /// The spec of a Backup this schedule creates: the policy, method, target, online
    /// setting and command are inherited.
    /// The labels of a Backup it creates: `backupLabels`, then Tidemark's own.
    pub fn labels_of_child(&self, schedule: &str, immediate: bool) -> BTreeMap<String, String> {
        let mut labels = self.backup_labels.clone();
        labels.extend(child_labels(schedule, immediate));
        labels
    }

    pub fn child_spec(&self) -> BackupSpec {
        BackupSpec {
            template: self.template.clone(),
            kind: BackupType::Full,
            incremental: self.incremental.clone(),
            ttl: self.ttl.clone(),
        }
    }
}

/// The labels of a Backup that the schedule `schedule` creates (seed 001): the schedule's
/// name, and for the immediate one `tidemark.io/immediate-backup=true`.
pub fn child_labels(schedule: &str, immediate: bool) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert(SCHEDULED_BACKUP_LABEL.to_owned(), schedule.to_owned());
    if immediate {
        labels.insert(IMMEDIATE_BACKUP_LABEL.to_owned(), "true".to_owned());
    }
    labels
}

fn zone(name: &str, field: &'static str) -> Result<jiff::tz::TimeZone, ScheduleFileError> {
    jiff::tz::TimeZone::get(name).map_err(|_| ScheduleFileError::Invalid {
        field,
        problem: format!(
            "unknown time zone {name:?}; expected an IANA name such as UTC or Europe/Paris"
        ),
    })
}

fn validate_template(t: &BackupTemplate) -> Result<(), ScheduleFileError> {
    if t.policy.name.is_empty() {
        return Err(ScheduleFileError::Invalid {
            field: "spec.policy.name",
            problem: "empty; name the BackupPolicy that says where backups go".into(),
        });
    }
    crate::names::dns_subdomain("spec.policy.name", &t.policy.name).map_err(|e| {
        ScheduleFileError::Invalid {
            field: e.field,
            problem: format!("{:?} is not {}", e.value, e.form),
        }
    })?;
    if let Some(p @ crate::policy::DeletionPolicy::Unknown(_)) = &t.deletion_policy {
        return Err(ScheduleFileError::Invalid {
            field: "spec.deletionPolicy",
            problem: p.unknown(),
        });
    }
    t.compression()?;
    if let Some(m) = &t.method
        && !METHODS.contains(&m.as_str())
    {
        return Err(ScheduleFileError::Invalid {
            field: "spec.method",
            problem: format!(
                "unknown method {m:?}; expected one of {}",
                METHODS.join(", ")
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
apiVersion: tidemark.io/v1alpha1
kind: ScheduledBackup
metadata:
  name: cluster-sample-daily
spec:
  schedule: "0 0 2 * * *"
  policy:
    name: cluster-sample
  immediate: true
  backupOwnerReference: self
  method: mariabackup
  target: prefer-standby
  online: true
"#;

    #[test]
    fn seed_example_parses_with_its_fields() {
        let s = ScheduledBackup::from_yaml(EXAMPLE).unwrap();
        assert_eq!(s.spec.schedule, "0 0 2 * * *");
        assert!(s.spec.immediate);
        assert_eq!(s.spec.backup_owner_reference, OwnerReferenceMode::SelfOwned);
        assert_eq!(s.spec.template.target.as_deref(), Some("prefer-standby"));
    }

    #[test]
    fn defaults() {
        let minimal = r#"
apiVersion: tidemark.io/v1alpha1
kind: ScheduledBackup
metadata: {name: nightly}
spec: {schedule: "0 0 2 * * *", policy: {name: db}}
"#;
        let s = ScheduledBackup::from_yaml(minimal).unwrap();
        assert!(!s.spec.immediate);
        assert!(!s.spec.suspend);
        assert_eq!(s.spec.backup_owner_reference, OwnerReferenceMode::SelfOwned);
        let spec = s
            .schedule_spec(None, "2026-11-20T00:00:00Z".parse().unwrap())
            .unwrap();
        assert_eq!(spec.time_zone, jiff::tz::TimeZone::UTC);
        // The policy's zone applies when the schedule names none.
        let paris = s
            .schedule_spec(
                Some("Europe/Paris"),
                "2026-11-20T00:00:00Z".parse().unwrap(),
            )
            .unwrap();
        assert_eq!(
            paris.time_zone,
            jiff::tz::TimeZone::get("Europe/Paris").unwrap()
        );
    }

    #[test]
    fn backup_labels_are_checked_and_tidemarks_own_win() {
        let with = |labels: &str| {
            ScheduledBackup::from_yaml(&EXAMPLE.replace(
                "backupOwnerReference: self",
                &format!("backupOwnerReference: self\n  backupLabels: {labels}"),
            ))
        };
        let s = with("{team: payments}").unwrap();
        let b = s.child("cluster-sample-daily-20261120020000", false);
        assert_eq!(
            b.metadata.labels.get("team").map(String::as_str),
            Some("payments")
        );
        assert_eq!(
            b.metadata
                .labels
                .get(SCHEDULED_BACKUP_LABEL)
                .map(String::as_str),
            Some("cluster-sample-daily")
        );
        let many = format!(
            "{{{}}}",
            (0..65)
                .map(|i| format!("l{i}: x"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for (bad, says) in [
            ("{\"tidemark.io/scheduled-backup\": x}", "Tidemark's own"),
            ("{team: \"a b\"}", "not a label value"),
            ("{\"bad key!\": x}", "spec.backupLabels"),
            (many.as_str(), "65 labels; at most 64"),
        ] {
            let e = with(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn scheduled_incrementals_are_checked_and_passed_to_the_backups() {
        let with = |incremental: &str, method: &str| {
            ScheduledBackup::from_yaml(
                &EXAMPLE
                    .replace("method: mariabackup", &format!("method: {method}"))
                    .replace(
                        "online: true",
                        &format!("online: true\n  incremental: {incremental}"),
                    ),
            )
        };
        let s = with("{maxIncrementsPerFull: 2}", "mariabackup").unwrap();
        let b = s.child("cluster-sample-daily-20261120020000", false);
        assert_eq!(
            b.spec.incremental,
            Some(IncrementalSpec {
                max_increments_per_full: Some(2)
            })
        );
        // Forever incremental.
        assert!(with("{}", "xtrabackup").is_ok());
        for (incremental, method, says) in [
            (
                "{maxIncrementsPerFull: 0}",
                "mariabackup",
                "0 is out of range; expected 1 to 10000",
            ),
            (
                "{maxIncrementsPerFull: 10001}",
                "mariabackup",
                "expected 1 to 10000",
            ),
            ("{}", "exec", "method exec takes whole backups only"),
            ("{}", "job", "incrementals need mariabackup or xtrabackup"),
        ] {
            let e = with(incremental, method).unwrap_err().to_string();
            assert!(e.contains(says), "{incremental} {method}: {e}");
        }
    }

    #[test]
    fn backup_history_is_checked() {
        let with = |history: &str| {
            ScheduledBackup::from_yaml(&EXAMPLE.replace(
                "online: true",
                &format!("online: true\n  backupHistory: {history}"),
            ))
        };
        assert!(with("{limit: 0, failedLimit: 0, maxAge: 30d}").is_ok());
        for (history, says) in [
            (
                "{limit: 10001}",
                "spec.backupHistory.limit: 10001 is out of range; expected 0 to 10000",
            ),
            (
                "{failedLimit: 10001}",
                "spec.backupHistory.failedLimit: 10001 is out of range; expected 0 to 10000",
            ),
            ("{maxAge: 3x}", "spec.backupHistory.maxAge"),
        ] {
            let e = with(history).unwrap_err().to_string();
            assert!(e.contains(says), "{history}: {e}");
        }
    }

    #[test]
    fn owner_reference_modes() {
        for (text, mode) in [
            ("self", OwnerReferenceMode::SelfOwned),
            ("cluster", OwnerReferenceMode::Cluster),
            ("none", OwnerReferenceMode::None),
        ] {
            let s = ScheduledBackup::from_yaml(&EXAMPLE.replace(
                "backupOwnerReference: self",
                &format!("backupOwnerReference: {text}"),
            ))
            .unwrap();
            assert_eq!(s.spec.backup_owner_reference, mode);
        }
        let e = ScheduledBackup::from_yaml(
            &EXAMPLE.replace("backupOwnerReference: self", "backupOwnerReference: parent"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("parent") && e.contains("self") && e.contains("none"),
            "{e}"
        );
    }

    #[test]
    fn generated_backups_inherit_fields_and_carry_labels() {
        let s = ScheduledBackup::from_yaml(EXAMPLE).unwrap();
        let b = s.child("cluster-sample-daily-20261120020000", false);
        assert_eq!(b.spec.template, s.spec.template);
        assert_eq!(
            b.metadata
                .labels
                .get(SCHEDULED_BACKUP_LABEL)
                .map(String::as_str),
            Some("cluster-sample-daily")
        );
        assert!(!b.metadata.labels.contains_key(IMMEDIATE_BACKUP_LABEL));
        assert_eq!(b.spec.ttl, None);
        // The schedule's ttl goes to every Backup it creates (seed 004).
        let with_ttl = ScheduledBackup::from_yaml(&format!("{EXAMPLE}  ttl: 30d\n")).unwrap();
        assert_eq!(with_ttl.child("x", false).spec.ttl.as_deref(), Some("30d"));
        let e = ScheduledBackup::from_yaml(&format!("{EXAMPLE}  ttl: 30 days\n"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("spec.ttl: "), "{e}");
        let i = s.child("cluster-sample-daily-20261120101542", true);
        assert_eq!(
            i.metadata
                .labels
                .get(IMMEDIATE_BACKUP_LABEL)
                .map(String::as_str),
            Some("true")
        );
    }

    #[test]
    fn bad_fields_are_named_with_the_accepted_form() {
        let e = ScheduledBackup::from_yaml(&EXAMPLE.replace("\"0 0 2 * * *\"", "\"0 2 * *\""))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("spec.schedule: "), "{e}");
        assert!(e.contains("\"0 0 2 * * *\""), "{e}");
        let e = ScheduledBackup::from_yaml(&format!("{EXAMPLE}  timeZone: Mars/Olympus\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("spec.timeZone: ") && e.contains("Europe/Paris"),
            "{e}"
        );
        let e =
            ScheduledBackup::from_yaml(&EXAMPLE.replace("method: mariabackup", "method: rsync"))
                .unwrap_err()
                .to_string();
        assert!(
            e.contains("spec.method") && e.contains("mariabackup, xtrabackup"),
            "{e}"
        );
        let e =
            ScheduledBackup::from_yaml(&EXAMPLE.replace("kind: ScheduledBackup", "kind: Schedule"))
                .unwrap_err()
                .to_string();
        assert_eq!(e, "kind is \"Schedule\"; expected ScheduledBackup");
    }

    #[test]
    fn a_misspelt_field_is_refused_with_its_name() {
        let text = r#"
apiVersion: tidemark.io/v1alpha1
kind: ScheduledBackup
metadata: {name: nightly}
spec: {schedule: "0 0 2 * * *", policy: {name: db}, imediate: true}
"#;
        let e = ScheduledBackup::from_yaml(text).unwrap_err().to_string();
        assert!(e.contains("imediate"), "{e}");
    }
}

crate::lenient_enum!(OwnerReferenceMode { SelfOwned = "self", Cluster = "cluster", None = "none" });

crate::lenient_enum!(BackupType { Full = "full", Incremental = "incremental" });

crate::known_values_schema!(BackupPhase, ["pending", "running", "completed", "failed"]);
