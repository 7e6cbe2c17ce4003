//! `Restore` (issue 30): a declarative restore of a BackupPolicy's backups into a
//! PersistentVolumeClaim — the newest point, a Backup, or an instant — done by a Job in the
//! database image, with the backups and binlogs it needs held from retention meanwhile.

// kube's `printcolumn(name = …, type_ = …)` repeats keys by design.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::policy::PolicyFileError;
use crate::schedule::PolicyRef;

/// The label on a claim a Restore created: the Restore's name.
pub const RESTORE_LABEL: &str = "tidemark.io/restore";
/// On a PersistentVolumeClaim, set by whoever owns it: the BackupPolicy whose Restores may
/// write it (besides the claims of a StatefulSet the policy's source selects).
pub const RESTORE_INTO_LABEL: &str = "tidemark.io/restore-into";
/// The annotation on a claim a failed restore left: why it holds no usable data.
pub const UNUSABLE_ANNOTATION: &str = "tidemark.io/restore-failed";

/// A restore of a BackupPolicy's backups into a PersistentVolumeClaim.
#[derive(CustomResource, KubeSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "tidemark.io",
    version = "v1alpha1",
    kind = "Restore",
    root = "RestoreCrd",
    namespaced,
    status = "RestoreStatus",
    shortname = "trs",
    category = "tidemark",
    doc = "A restore of a BackupPolicy's backups (the newest point, a Backup, or an instant) into a PersistentVolumeClaim, done by a Job in the database image.",
    printcolumn(name = "Policy", type_ = "string", json_path = ".spec.policy.name"),
    printcolumn(name = "Claim", type_ = "string", json_path = ".status.claim"),
    printcolumn(name = "Target", type_ = "string", json_path = ".status.target"),
    printcolumn(name = "Reached", type_ = "string", json_path = ".status.reached"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Backups",
        type_ = "string",
        json_path = ".status.backups",
        priority = 1
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
pub struct RestoreSpec {
    /// The BackupPolicy whose store holds the backups (same namespace).
    pub policy: PolicyRef,
    /// What to restore; empty: the newest restorable instant.
    #[serde(default)]
    pub target: RestoreTarget,
    /// Where the data directory goes.
    pub into: RestoreInto,
    /// Restore from the policy's copy of this name (`spec.copies[].name`) instead of its
    /// own store: the copy's store, Secret and window (`tidemark restore --from-copy`).
    /// The backups it needs are held in the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), length(max = 63))]
    pub from: Option<String>,
    /// Keep the restored data only if the restore oracle proves it (issue 48): at least one
    /// chunk of the checksums `binlogArchive.checksums` writes replayed and compared, none
    /// differing from the primary's; otherwise the Restore fails and the claim keeps what
    /// it held (`tidemark restore --require-oracle`). Without it, the chunks compared and
    /// any difference are reported in status, and the data is kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_oracle: bool,
    /// How the restore replays binlogs (MariaDB): `applier` (the default) or `client`
    /// (everything through `mariadb-binlog | mariadb`, the fallback): `tidemark restore
    /// --replay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(applier|client)$"))]
    pub replay: Option<String>,
}

/// What a Restore brings back: at most one of these; none is the newest restorable instant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreTarget {
    /// An instant of the recovery window (RFC 3339, e.g. `2026-11-27T10:03:00Z`), as
    /// `tidemark restore --to`: refused outside the window, in a gap, or on a branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub to: Option<String>,
    /// A Backup object (same namespace) by name: its restore point. Held from the start,
    /// until the Restore has ended or is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SUBDOMAIN_PATTERN), length(max = 253))]
    pub backup: Option<String>,
    /// A backup by its id in the store: its restore point. Held from the start, until the
    /// Restore has ended or is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub backup_id: Option<String>,
}

/// The claim a Restore writes: exactly one of `claim` and `newClaim`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreInto {
    /// An existing claim (same namespace) that no running pod mounts, and that is one of
    /// the claims of a StatefulSet the policy's source selects
    /// (`<template>-<statefulset>-<ordinal>`) or is labelled
    /// `tidemark.io/restore-into: <policy>` by its owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SUBDOMAIN_PATTERN), length(max = 253))]
    pub claim: Option<String>,
    /// A claim the Restore creates (labelled `tidemark.io/restore`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_claim: Option<NewClaim>,
    /// An existing claim that holds data (a database's, say) has it replaced: without this,
    /// such a claim is refused. The new data directory is made aside first; the old data
    /// goes only once it is complete.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replace_data: bool,
}

/// A claim to create.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewClaim {
    /// Its name, e.g. `data-db-0` for pod 0 of StatefulSet `db` with the claim template
    /// `data`.
    #[schemars(pattern(crate::names::SUBDOMAIN_PATTERN), length(max = 253))]
    pub name: String,
    /// Its storage class; default: the cluster's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::names::SUBDOMAIN_PATTERN), length(max = 253))]
    pub storage_class_name: Option<String>,
    /// Its size (a quantity, e.g. `20Gi`); default: what the chain's recorded sizes need,
    /// with room to spare — at most 2 TiB (beyond, give a size: the recorded sizes are the
    /// store's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub size: Option<String>,
}

/// What a Restore's spec asks for, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Newest,
    At(jiff::Timestamp),
    /// A Backup object's name.
    Backup(String),
    BackupId(String),
}

/// Where a Restore's spec writes, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Into {
    Existing { claim: String, replace_data: bool },
    New(NewClaim),
}

impl RestoreSpec {
    /// The target and the claim, checked: names, the instant's form, one of each.
    ///
    /// # Errors
    /// The field at fault and the accepted form.
    pub fn checked(&self) -> Result<(Target, Into), PolicyFileError> {
        let invalid =
            |field: &'static str, problem: String| PolicyFileError::Invalid { field, problem };
        crate::names::dns_subdomain("spec.policy.name", &self.policy.name)?;
        crate::policy::replay_of("spec.replay", self.replay.as_deref())?;
        if let Some(from) = &self.from {
            crate::names::dns_label("spec.from", from)?;
        }
        let t = &self.target;
        let target = match (&t.to, &t.backup, &t.backup_id) {
            (None, None, None) => Target::Newest,
            (Some(to), None, None) => Target::At(to.parse().map_err(|_| {
                invalid(
                    "spec.target.to",
                    format!(
                        "{:?} is not an instant; expected RFC 3339, e.g. 2026-11-27T10:03:00Z",
                        to.chars().take(64).collect::<String>()
                    ),
                )
            })?),
            (None, Some(b), None) => {
                crate::names::dns_subdomain("spec.target.backup", b)?;
                Target::Backup(b.clone())
            }
            (None, None, Some(id)) => {
                if id.is_empty()
                    || id.len() > 128
                    || !id
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                    || id.starts_with('.')
                {
                    return Err(invalid(
                        "spec.target.backupId",
                        "expected a backup id as `tidemark ls` shows it (letters, digits, - _ .)"
                            .into(),
                    ));
                }
                Target::BackupId(id.clone())
            }
            _ => {
                return Err(invalid(
                    "spec.target",
                    "give at most one of to, backup and backupId (none: the newest point)".into(),
                ));
            }
        };
        let into = match (&self.into.claim, &self.into.new_claim) {
            (Some(c), None) => {
                crate::names::dns_subdomain("spec.into.claim", c)?;
                Into::Existing {
                    claim: c.clone(),
                    replace_data: self.into.replace_data,
                }
            }
            (None, Some(n)) => {
                crate::names::dns_subdomain("spec.into.newClaim.name", &n.name)?;
                if let Some(c) = &n.storage_class_name {
                    crate::names::dns_subdomain("spec.into.newClaim.storageClassName", c)?;
                }
                if let Some(size) = &n.size
                    && crate::quantity::bytes(size).is_none_or(|b| b == 0)
                {
                    return Err(invalid(
                        "spec.into.newClaim.size",
                        format!(
                            "{:?} is not a size; expected a quantity such as 20Gi or 500M",
                            size.chars().take(64).collect::<String>()
                        ),
                    ));
                }
                Into::New(n.clone())
            }
            _ => {
                return Err(invalid(
                    "spec.into",
                    "give exactly one of claim (an existing claim) and newClaim".into(),
                ));
            }
        };
        Ok((target, into))
    }
}

/// Where a Restore is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// The `metadata.generation` this status was written for (kstatus, Argo and Flux
    /// health checks compare the two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Pending` (planning, or waiting for its claim), `Running` (its Job runs),
    /// `Succeeded`, `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The instant restored to, as resolved (the newest point, the Backup's restore point,
    /// or `spec.target.to`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Time>,
    /// The backups restored, by id, the base full first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backups: Vec<String>,
    /// The binlog segments replayed after them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<u64>,
    /// The timelines those segments are on (after a failover, more than one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timelines: Vec<u32>,
    /// The instant the restore reached, as the Job reported: the time of the last
    /// transaction replayed (at or before `target`; binlog times are whole seconds), or the
    /// restored backup's own point when nothing was replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reached: Option<Time>,
    /// The GTID position the restored data holds, as the Job reported: the restored
    /// server's binlog continues from it (its `<basename>.state`) and its
    /// `gtid_slave_pos` is it, so new writes continue the history (docs/operator.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid_position: Option<String>,
    /// Bytes the Job downloads (stored sizes of the backups and segments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Bytes the Job downloaded, as it reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_downloaded: Option<u64>,
    /// The Job's steps (download, prepare, apply each increment, replay) and how long each
    /// took, as it reported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<RestoreStep>,
    /// The restore oracle's chunks replayed and compared (issue 48), as the Job reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_chunks: Option<u64>,
    /// Those whose data is not the primary's (at most 3), as the Job reported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oracle_differences: Vec<String>,
    /// The claim written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// The Job doing the work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The end of the restore Job's log (its last lines, at most 4 KiB, secrets redacted),
    /// kept when the Job ends: `kubectl tidemark logs restore NAME` shows it once the Job
    /// is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub log_tail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// `Ready`: `True` once the claim holds the restored data directory; `False` with the
    /// reason while it does not (`Planning`, `ClaimInUse`, `Restoring`, `NotRestorable`,
    /// `InvalidSpec`, `RestoreFailed`, …).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::maplist::nullable"
    )]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"], "nullable" = true))]
    pub conditions: Vec<Condition>,
}

/// One step of a restore's Job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStep {
    pub name: String,
    pub milliseconds: u64,
    /// The bytes the step moved (downloaded and extracted), when it moves any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl RestoreStatus {
    /// Whether the restore has ended (`Succeeded` or `Failed`): it holds nothing any more
    /// but the Backup it names.
    pub fn finished(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}
