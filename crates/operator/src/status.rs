//! Every status write of the operator. Each writer owns its own fields under its own
//! field manager (server-side apply), so a writer whose copy of an object is behind never
//! drops what another wrote (issue 18 §5): the attempt's fields under [`FIELD_MANAGER`],
//! hook outcomes under [`HOOKS_MANAGER`], the deletion's conditions each under their own,
//! `dataRemoved` under [`DATA_REMOVED_MANAGER`].

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupStatus};

use crate::error::Error;

/// The field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "tidemark-operator";

/// The field manager of `status.dataRemoved`: its own writer, so no other status write
/// of the Backup drops it.
pub const DATA_REMOVED_MANAGER: &str = "tidemark-operator-retention";

/// The conditions the deletion writes, each under its own field manager (the key).
pub const DELETION_CONDITIONS: [&str; 2] = ["RemoteCleanup", "Expired"];

/// The field manager of `status.hooks`.
pub const HOOKS_MANAGER: &str = "tidemark-operator-hooks";

/// The field manager of a DeleteHook's `status.lastRun` (its runs; the hook's controller
/// writes `Ready` under [`FIELD_MANAGER`]).
pub const HOOK_RUNS_MANAGER: &str = "tidemark-operator-hook-runs";

/// The field manager of `status.restoreTest` (a BackupPolicy's and a Backup's).
pub const RESTORE_TEST_MANAGER: &str = "tidemark-operator-restore-test";
/// The field manager of a BackupPolicy's `status.verification` (`crate::verification`).
pub const VERIFICATION_MANAGER: &str = "tidemark-operator-verification";
/// The field manager of a BackupPolicy's `status.binlogArchive` and its
/// [`BINLOG_ARCHIVE_CONDITION`] (the archive's watch, `crate::archivewatch`).
pub const BINLOG_ARCHIVE_MANAGER: &str = "tidemark-operator-binlog-archive";
/// The condition the archive's watch writes.
pub const BINLOG_ARCHIVE_CONDITION: &str = "BinlogArchiveCurrent";
/// The condition the archive's watch writes about its timelines: `False` while a switch of
/// primary lies before the end of its parent's archive (a branch) and is not acknowledged.
pub const MAIN_LINE_CONDITION: &str = "BinlogMainLine";
/// `binlogArchive.purge`: True while a server's binlogs near `maxDiskUsage` and some are
/// not archived (written by the binlog archive's manager).
pub const POINT_IN_TIME_RISK_CONDITION: &str = "PointInTimeAtRisk";
/// The field manager of a BackupPolicy's `status.copies` and [`COPIES_CONDITION`].
pub const COPIES_MANAGER: &str = "tidemark-operator-copies";
/// The condition of a policy's copies: every copy within its `maxLag`.
pub const COPIES_CONDITION: &str = "CopiesCurrent";
/// The field manager of a BackupPolicy's [`QUEUED_CONDITION`]: the queue of background
/// work (`crate::policy`) adds it when a pass waits for its turn, and removes it (an
/// empty apply) when the turn comes; the pass's own status never touches it.
pub const QUEUE_MANAGER: &str = "tidemark-operator-queue";
/// The condition of a policy whose pass waits for its turn.
pub const QUEUED_CONDITION: &str = "Queued";
/// The field manager of a BackupPolicy's `status.policyChange` (a change of its retention,
/// previewed before a pass acts on it).
pub const POLICY_CHANGE_MANAGER: &str = "tidemark-operator-policy-change";

/// Writes a BackupPolicy's `status.policyChange`, under its own manager.
///
/// # Errors
/// The API refused the patch.
pub async fn policy_change(
    api: &Api<tidemark_api::crd::BackupPolicy>,
    name: &str,
    value: &tidemark_api::policy::PolicyChangeStatus,
) -> Result<(), Error> {
    apply(
        api,
        name,
        POLICY_CHANGE_MANAGER,
        json!({ "policyChange": value }),
    )
    .await
}

/// Writes a BackupPolicy's retention fields (everything but `restoreTest`, which the
/// restore tests write under [`RESTORE_TEST_MANAGER`], `verification`, written under
/// [`VERIFICATION_MANAGER`], and the archive watch's and the queue's).
///
/// # Errors
/// The API refused the patch.
pub async fn policy(
    api: &Api<tidemark_api::crd::BackupPolicy>,
    name: &str,
    status: &tidemark_api::crd::BackupPolicyStatus,
) -> Result<(), Error> {
    let mut own = status.clone();
    own.restore_test = None;
    own.verification = None;
    // The archive's watch and the copies write these under their own managers.
    own.binlog_archive = None;
    own.copies = Vec::new();
    own.policy_change = None;
    own.conditions.retain(|c| {
        c.type_ != BINLOG_ARCHIVE_CONDITION
            && c.type_ != MAIN_LINE_CONDITION
            && c.type_ != POINT_IN_TIME_RISK_CONDITION
            && c.type_ != QUEUED_CONDITION
            && c.type_ != COPIES_CONDITION
    });
    self::own(api, name, &own).await
}

/// Writes `status.restoreTest` of a BackupPolicy or a Backup, under its own manager.
///
/// # Errors
/// The API refused the patch.
pub async fn restore_test<K>(
    api: &Api<K>,
    name: &str,
    value: serde_json::Value,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    apply(
        api,
        name,
        RESTORE_TEST_MANAGER,
        json!({ "restoreTest": value }),
    )
    .await
}

/// Writes a BackupPolicy's `status.verification`, under its own manager.
///
/// # Errors
/// The API refused the patch.
pub async fn verification(
    api: &Api<tidemark_api::crd::BackupPolicy>,
    name: &str,
    value: &tidemark_api::policy::VerificationStatus,
) -> Result<(), Error> {
    apply(
        api,
        name,
        VERIFICATION_MANAGER,
        json!({ "verification": value }),
    )
    .await
}

/// Writes the attempt's fields of a Backup's status (phase, ids, sizes, times, error, the
/// `Ready` and `Blocked` conditions) under the operator's field manager. Each other writer
/// has its own fields and manager ([`apply`]), so a copy of the status that is
/// behind never drops what another wrote (issue 18 §5).
pub async fn backup(
    api: &Api<Backup>,
    backup: &Backup,
    status: &BackupStatus,
) -> Result<(), Error> {
    let name = &backup.name_any();
    let mut own = status.clone();
    own.observed_generation = backup.meta().generation;
    own.hooks.clear();
    own.data_removed = None;
    own.restore_test = None;
    own.conditions
        .retain(|c| !DELETION_CONDITIONS.contains(&c.type_.as_str()));
    apply(
        api,
        name,
        FIELD_MANAGER,
        serde_json::to_value(&own).unwrap_or_default(),
    )
    .await
}

/// Server-side applies `status` (the fields `manager` owns) to the object `name` of `api`:
/// fields it owned and no longer names are removed, fields of other managers stay.
///
/// # Errors
/// The API refused the patch.
pub async fn apply<K>(
    api: &Api<K>,
    name: &str,
    manager: &str,
    status: serde_json::Value,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({
        "apiVersion": tidemark_api::API_VERSION,
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// [`apply`] with the operator's own manager ([`FIELD_MANAGER`]) and the whole status of
/// a kind that only the operator's controller of it writes (BackupPolicy, ScheduledBackup,
/// VolumeClaimRetention).
///
/// # Errors
/// The API refused the patch.
pub async fn own<K, S>(api: &Api<K>, name: &str, status: &S) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: serde::Serialize,
{
    apply(
        api,
        name,
        FIELD_MANAGER,
        serde_json::to_value(status).unwrap_or_default(),
    )
    .await
}

/// JSON-merges `status` into the object `name`'s status under `manager` (fields it does not
/// name stay; `null` removes one).
///
/// # Errors
/// The API refused the patch.
pub async fn merge<K>(
    api: &Api<K>,
    name: &str,
    manager: &str,
    status: serde_json::Value,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = PatchParams {
        field_manager: Some(manager.to_owned()),
        ..PatchParams::default()
    };
    api.patch_status(name, &params, &Patch::Merge(&json!({ "status": status })))
        .await?;
    Ok(())
}

/// A condition, keeping its transition time when its status did not change.
pub fn condition(
    previous: &[Condition],
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Condition {
    condition_at(
        previous,
        type_,
        ok,
        reason,
        message,
        generation,
        Timestamp::now(),
    )
}

/// [`condition`] with the transition at `now` (pure).
pub fn condition_at(
    previous: &[Condition],
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.chars().take(4096).collect(),
        last_transition_time: since,
        observed_generation: generation,
    }
}
