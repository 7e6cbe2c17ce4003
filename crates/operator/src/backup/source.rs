//! Where a Backup comes from: the database pod (by target and role), its data volume,
//! and for an incremental the parent backup of the same data directory.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Volume, VolumeMount};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use tidemark_api::crd::{Backup, BackupPolicy, SourceSpec};
use tidemark_api::schedule::BackupType;
use tidemark_core::FullBecause;
use tidemark_store::ClusterStore;

use super::attempt::{backup_failed, blocked};
use crate::context::Context;
use crate::error::Error;
use crate::names::{DATA_VOLUME_LABEL, DEFAULT_ROLE_LABEL, selector};

/// How far a standby may lag when `source.standbyMaxLag` is not set but the standbys can
/// be asked (a login, exec allowed): any lag, only replication must run.
const DEFAULT_STANDBY_MAX_LAG: jiff::SignedDuration = jiff::SignedDuration::from_hours(24);

/// Where a MariaDB container keeps its data when `source.dataVolume` is not given.
const DEFAULT_DATA_PATH: &str = "/var/lib/mysql";

/// Chooses the database pod for `backup`, with a note on the choice when a standby was
/// passed over (`spec.source.standbyMaxLag`); `Err(action)` when none can be used yet (the
/// Backup is blocked, and says why).
pub(crate) async fn target_pod<'p>(
    ctx: &Context,
    api: &Api<Backup>,
    backup: &Backup,
    policy: &'p BackupPolicy,
) -> Result<Result<(Pod, &'p SourceSpec, Option<String>), Action>, Error> {
    let Some(source) = policy.spec.source.as_ref() else {
        let message = "the BackupPolicy has no spec.source (which pods hold the database)";
        return Ok(Err(blocked(ctx, api, backup, "NoSource", message).await?));
    };
    // Checked here too (API servers before 1.25 have no CEL): a half login never becomes
    // a Job without one.
    source
        .validate()
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let pods: Api<Pod> =
        Api::namespaced(ctx.client.clone(), &backup.namespace().unwrap_or_default());
    let candidates = crate::lean::list(
        &pods,
        &ListParams::default().labels(&selector(&source.selector)?),
        crate::lean::meta_of,
    )
    .await?;
    let target = backup
        .spec
        .template
        .target
        .as_deref()
        .unwrap_or("prefer-standby");
    let max_lag = source
        .standby_max_lag()
        .map_err(|e| Error::Invalid(e.to_string()))?;
    // Without standbyMaxLag, a standby that can be asked still is: one whose replication
    // is stopped or broken is never backed up, whatever its readiness says.
    let standbys = ready_standbys(&candidates, source);
    // A MySQL source's standbys are not asked yet (issue 47): chosen by role label and
    // readiness, and a bound on their lag is not applied (said in the Backup's status).
    let mysql = source.is_mysql();
    let askable =
        !mysql && source.login().is_some() && ctx.capabilities.exec && !standbys.is_empty();
    // Asked without a bound of the policy's: a standby that cannot be asked is trusted on
    // its readiness, as without asking.
    let unasked_ok = max_lag.is_none();
    let mut note = (mysql && max_lag.is_some() && target != "primary").then(|| {
        "spec.source.standbyMaxLag is not applied to a MySQL source yet: its standbys are chosen by role label and readiness".to_owned()
    });
    let max_lag = if mysql {
        None
    } else {
        max_lag.or(askable.then_some(DEFAULT_STANDBY_MAX_LAG))
    };
    let chosen = match max_lag.filter(|_| target != "primary") {
        None => choose_pod(&candidates, source, target),
        Some(max) => match super::standby::first_fit(ctx, source, &standbys, max, unasked_ok).await
        {
            Ok((pod, skipped)) => {
                if !skipped.is_empty() {
                    note = Some(skipped.join("; "));
                }
                Some(pod.clone())
            }
            Err(why) => {
                let primary = choose_pod(&candidates, source, "primary");
                if primary.is_some() {
                    note = Some(format!("{}: the primary is backed up", why.join("; ")));
                }
                primary
            }
        },
    };
    let Some(pod) = chosen else {
        let message = format!(
            "no running database pod for target {target} among {} pod(s) matching spec.source.selector",
            candidates.len()
        );
        let next = blocked(ctx, api, backup, "DatabasePodNotRunning", &message).await?;
        // A pod starting up is usually running within seconds.
        return Ok(Err(if backup_failed(&next) {
            next
        } else {
            Action::requeue(Duration::from_secs(10))
        }));
    };
    Ok(Ok((pod, source, note)))
}

fn running(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && node_of(p).is_some()
}

pub(crate) fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The standbys that may be backed up, by name: running and Ready (readiness is how a
/// database's probes say its replication works), labelled with a role other than primary.
fn ready_standbys<'p>(pods: &'p [Pod], source: &SourceSpec) -> Vec<&'p Pod> {
    let label = source.role_label.as_deref().unwrap_or(DEFAULT_ROLE_LABEL);
    let mut out: Vec<&Pod> = pods
        .iter()
        .filter(|p| running(p) && ready(p))
        .filter(|p| {
            p.labels()
                .get(label)
                .is_some_and(|r| r.as_str() != "primary")
        })
        .collect();
    out.sort_by_key(|p| p.name_any());
    out
}

/// The pod to back up: for `primary`, the running pod labelled primary; for
/// `prefer-standby`, a running, Ready standby (the first by name), else the primary.
pub fn choose_pod(pods: &[Pod], source: &SourceSpec, target: &str) -> Option<Pod> {
    let label = source.role_label.as_deref().unwrap_or(DEFAULT_ROLE_LABEL);
    let mut live: Vec<&Pod> = pods.iter().filter(|p| running(p)).collect();
    live.sort_by_key(|p| p.name_any());
    let is_primary = |p: &Pod| p.labels().get(label).map(String::as_str) == Some("primary");
    let primary = live.iter().find(|p| is_primary(p)).copied();
    let chosen = match target {
        "primary" => primary,
        // Without a primary: a pod without a role (a single server), never a standby
        // that is not Ready.
        _ => ready_standbys(pods, source)
            .first()
            .copied()
            .or(primary)
            .or_else(|| {
                live.iter()
                    .find(|p| !p.labels().contains_key(label))
                    .copied()
            }),
    };
    chosen.cloned()
}

/// The database container and its data volume, as the Job will mount it.
#[derive(Debug, Clone)]
pub struct DataVolume {
    pub container: Container,
    pub volume: Volume,
    pub mount: VolumeMount,
}

/// Finds the database container and the volume holding its data directory.
///
/// # Errors
/// No such container or volume: the message names what was looked for.
pub fn data_volume(pod: &Pod, source: &SourceSpec) -> Result<DataVolume, String> {
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    let container = match &source.container {
        Some(c) => spec
            .containers
            .iter()
            .find(|x| &x.name == c)
            .ok_or_else(|| {
                format!(
                    "pod {} has no container {c:?} (spec.source.container)",
                    pod.name_any()
                )
            })?,
        None => spec
            .containers
            .first()
            .ok_or_else(|| format!("pod {} has no containers", pod.name_any()))?,
    };
    let mounts = container.volume_mounts.clone().unwrap_or_default();
    let mount = match &source.data_volume {
        Some(v) => mounts.iter().find(|m| &m.name == v),
        None => mounts
            .iter()
            .find(|m| m.mount_path.trim_end_matches('/') == DEFAULT_DATA_PATH),
    }
    .ok_or_else(|| {
        format!(
            "container {} of pod {} mounts no {}; set spec.source.dataVolume",
            container.name,
            pod.name_any(),
            source.data_volume.as_deref().map_or_else(
                || format!("volume at {DEFAULT_DATA_PATH}"),
                |v| format!("volume {v:?}")
            )
        )
    })?;
    let volume = spec
        .volumes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == mount.name)
        .ok_or_else(|| format!("pod {} declares no volume {:?}", pod.name_any(), mount.name))?;
    Ok(DataVolume {
        container: container.clone(),
        volume,
        mount: mount.clone(),
    })
}

/// What the Backup builds on: `None` for a full. With `spec.incremental` (seed 002) the
/// type is chosen here: an incremental on the newest restorable backup of this data
/// directory, else a full. `type: incremental` without it needs a parent: `Err` says why
/// there is none.
pub(crate) async fn parent_of(
    store: &ClusterStore,
    backup: &Backup,
    volume_id: &str,
) -> Result<Result<Option<String>, FullBecause>, Error> {
    let max = match (&backup.spec.incremental, &backup.spec.kind) {
        (Some(i), _) => i.max_increments_per_full,
        (None, BackupType::Incremental) => None,
        // Unknown types are refused above.
        (None, BackupType::Full | BackupType::Unknown(_)) => return Ok(Ok(None)),
    };
    // Made by mariabackup from this data directory, or from another.
    let lineage = tidemark_engine::parent::ParentLineage {
        label: DATA_VOLUME_LABEL,
        value: volume_id,
        others_are_other_sources: true,
    };
    let next = tidemark_engine::parent::load_next_parent(store, &lineage, max)
        .await
        .map_err(|e| Error::Engine(e.into()))?;
    Ok(match next {
        Ok(parent) => Ok(Some(parent.backup_id)),
        Err(why) if backup.spec.incremental.is_some() => {
            tracing::info!(backup = %backup.name_any(), "a full backup: {why}");
            Ok(None)
        }
        Err(why) => Err(why),
    })
}
