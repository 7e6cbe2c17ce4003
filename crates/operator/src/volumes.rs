//! VolumeClaimRetention: garbage collection of PersistentVolumeClaims by TTL (seed 004,
//! generalised from aerospike-operator's design to any claims a selector picks).
//!
//! On every look (a claim or pod change in the namespace, or every few minutes):
//! - a claim that a **running** pod mounts loses `tidemark.io/last-unmounted-on`, and
//!   `tidemark.io/pod-name` records that pod;
//! - a claim no running pod mounts is stamped `tidemark.io/last-unmounted-on=<time>` (once;
//!   the first time it is seen so), and `tidemark.io/pod-name` keeps the pod that last
//!   referenced it;
//! - a claim is deleted only when all three hold: the stamp is there, the TTL has passed
//!   since it, and no running pod mounts it — judged again on a fresh listing of the pods
//!   right before the delete, which is conditional on the claim's uid (a claim created
//!   anew under the name is not the one judged). In a cluster, Kubernetes' own
//!   `kubernetes.io/pvc-protection` finalizer also keeps a claim a pod uses. A claim bound
//!   to a PersistentVolume whose reclaim policy is `Retain` is
//!   reported (`status.retainedVolumes`), not deleted, unless `deleteRetainedVolumes`;
//!   `dryRun` reports (`status.deleted`) and deletes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{VolumeClaimRetention, VolumeClaimRetentionStatus};

use crate::context::Context;
use crate::error::Error;
use crate::status::condition;

/// When no running pod was last seen mounting the claim.
pub const LAST_UNMOUNTED: &str = "tidemark.io/last-unmounted-on";
/// The pod the claim belongs to (the last one seen referencing it).
pub const POD_NAME: &str = "tidemark.io/pod-name";
/// Longest pause between two looks.
const RECHECK: Duration = Duration::from_secs(300);

/// What one claim is, as the reaper judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A running pod mounts it.
    Mounted { pod: String },
    /// Unmounted, its TTL not passed yet (or it has no stamp yet).
    Waiting { since: Option<Timestamp> },
    /// Unmounted for longer than the TTL.
    Expired { since: Timestamp },
}

/// The pure decision for one claim: `mounted_by` is the running pod that mounts it, if
/// any; `stamp` its `last-unmounted-on` annotation.
pub fn judge(
    mounted_by: Option<&str>,
    stamp: Option<Timestamp>,
    ttl: tidemark_core::RetentionDuration,
    now: Timestamp,
) -> Verdict {
    match (mounted_by, stamp) {
        (Some(pod), _) => Verdict::Mounted {
            pod: pod.to_owned(),
        },
        (None, Some(since)) if now > ttl.after(since) => Verdict::Expired { since },
        (None, since) => Verdict::Waiting { since },
    }
}

/// Who uses which claim.
#[derive(Debug, Default)]
struct Mounts {
    /// Claim → a running pod that mounts it (stamps come and go by this).
    running: BTreeMap<String, String>,
    /// Claim → a pod that is not finished (pending, running or unknown) and references
    /// it: such a claim is never deleted — a pod scheduled again after the TTL is Pending
    /// before it runs.
    live: BTreeMap<String, String>,
    /// Claim → any pod that references it, for `pod-name`.
    referenced: BTreeMap<String, String>,
}

/// The claims `pods` reference: by `persistentVolumeClaim`, and the claim of a generic
/// ephemeral volume (`<pod>-<volume>`).
fn mounts(pods: &[Pod]) -> Mounts {
    let mut m = Mounts::default();
    let mut sorted: Vec<&Pod> = pods.iter().collect();
    sorted.sort_by_key(|p| p.name_any());
    for p in sorted {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        let running = phase == Some("Running");
        let finished = matches!(phase, Some("Succeeded" | "Failed"));
        for v in p
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
        {
            let claim = match (&v.persistent_volume_claim, &v.ephemeral) {
                (Some(c), _) => c.claim_name.clone(),
                (None, Some(_)) => format!("{}-{}", p.name_any(), v.name),
                (None, None) => continue,
            };
            m.referenced
                .entry(claim.clone())
                .or_insert_with(|| p.name_any());
            if !finished {
                m.live.entry(claim.clone()).or_insert_with(|| p.name_any());
            }
            if running {
                m.running.entry(claim).or_insert_with(|| p.name_any());
            }
        }
    }
    m
}

/// One look at a VolumeClaimRetention.
///
/// # Errors
/// The API failed; the spec is invalid (waits for a change).
pub async fn reconcile(vcr: Arc<VolumeClaimRetention>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = vcr.namespace().unwrap_or_default();
    let ttl: tidemark_core::RetentionDuration = vcr
        .spec
        .ttl
        .parse()
        .map_err(|e| Error::Invalid(format!("spec.ttl: {e}")))?;
    let selector = crate::names::selector(&vcr.spec.selector)?;
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let volumes_api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let claims = claims_api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    let pods = pods_api.list(&ListParams::default()).await?.items;
    let Mounts {
        running,
        live,
        referenced,
    } = mounts(&pods);
    let now = ctx.clock.now();
    let reference = vcr.object_ref(&());
    let mut unmounted = 0u64;
    let mut deleted = Vec::new();
    let mut retained = Vec::new();
    let mut next = RECHECK;
    for claim in claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
    {
        let name = claim.name_any();
        let annotations = claim.annotations();
        let stamp = annotations
            .get(LAST_UNMOUNTED)
            .and_then(|s| s.parse::<Timestamp>().ok());
        let owner = running.get(&name).or_else(|| referenced.get(&name));
        let verdict = judge(running.get(&name).map(String::as_str), stamp, ttl, now);
        // The annotations first: what is known is recorded even if the rest fails.
        let mut patch = serde_json::Map::new();
        if let Some(pod) = owner
            && annotations.get(POD_NAME) != Some(pod)
        {
            patch.insert(POD_NAME.into(), json!(pod));
        }
        match &verdict {
            Verdict::Mounted { .. } if annotations.contains_key(LAST_UNMOUNTED) => {
                patch.insert(LAST_UNMOUNTED.into(), serde_json::Value::Null);
            }
            Verdict::Waiting { since: None } => {
                patch.insert(LAST_UNMOUNTED.into(), json!(now.to_string()));
            }
            _ => {}
        }
        if !patch.is_empty() {
            claims_api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": patch}})),
                )
                .await?;
        }
        match verdict {
            Verdict::Mounted { .. } => {}
            Verdict::Waiting { since } => {
                unmounted += 1;
                let until = ttl.after(since.unwrap_or(now));
                let wait = now.duration_until(until).unsigned_abs() + Duration::from_secs(1);
                next = next.min(wait);
            }
            Verdict::Expired { .. } if live.contains_key(&name) => {
                // A pod that will mount it exists (pending, say): not now.
                unmounted += 1;
            }
            Verdict::Expired { since } => {
                unmounted += 1;
                if let Some(pv) = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref())
                    && !vcr.spec.delete_retained_volumes
                    && volumes_api
                        .get_opt(pv)
                        .await?
                        .and_then(|v| v.spec)
                        .and_then(|s| s.persistent_volume_reclaim_policy)
                        .as_deref()
                        == Some("Retain")
                {
                    retained.push(name.clone());
                    continue;
                }
                if vcr.spec.dry_run {
                    deleted.push(name.clone());
                    continue;
                }
                // A fresh look right before the delete: never a claim a pod now uses or
                // is about to.
                let fresh = pods_api.list(&ListParams::default()).await?.items;
                if mounts(&fresh).live.contains_key(&name) {
                    continue;
                }
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: claim.uid(),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match claims_api.delete(&name, &params).await {
                    Ok(_) => {
                        ctx.event(
                            &reference,
                            EventType::Normal,
                            "VolumeClaimDeleted",
                            &format!(
                                "deleted PersistentVolumeClaim {name}: no running pod mounted it since {since} (ttl {})",
                                vcr.spec.ttl
                            ),
                        )
                        .await;
                        tracing::info!(claim = %format!("{ns}/{name}"), "unmounted since {since}: deleted");
                        deleted.push(name.clone());
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    // The status as the API has it now, not the watch cache's copy: the deletion a look
    // just made triggers the next look at once, whose cached object may not show the
    // status that look wrote yet — a forced write from it erased the report.
    let api: Api<VolumeClaimRetention> = Api::namespaced(ctx.client.clone(), &ns);
    let previous = match api.get_opt(&vcr.name_any()).await? {
        Some(fresh) => fresh.status.unwrap_or_default(),
        None => return Ok(Action::await_change()),
    };
    // What the last deleting look deleted stays shown (the deletion itself triggers
    // another look, which deletes nothing).
    if !vcr.spec.dry_run && deleted.is_empty() {
        deleted = previous.deleted.clone();
    }
    let summary = if vcr.spec.dry_run {
        format!(
            "{} claim(s) selected, {unmounted} unmounted; dry run: {} would be deleted",
            claims.len(),
            deleted.len()
        )
    } else {
        format!(
            "{} claim(s) selected, {unmounted} unmounted, {} deleted",
            claims.len(),
            deleted.len()
        )
    };
    let status = VolumeClaimRetentionStatus {
        last_run_time: Some(Time(now)),
        unmounted: Some(unmounted),
        deleted,
        retained_volumes: retained,
        conditions: vec![condition(
            &previous.conditions,
            "Ready",
            true,
            "Reaped",
            &summary,
            vcr.meta().generation,
        )],
    };
    crate::status::own(&api, &vcr.name_any(), &status).await?;
    Ok(Action::requeue(next))
}

/// Every VolumeClaimRetention of `ns` in `cache`: a pod or claim change there is looked at
/// by each.
pub fn in_namespace(
    cache: &kube::runtime::reflector::Store<VolumeClaimRetention>,
    ns: Option<String>,
) -> Vec<kube::runtime::reflector::ObjectRef<VolumeClaimRetention>> {
    cache
        .state()
        .iter()
        .filter(|v| v.namespace() == ns)
        .map(|v| kube::runtime::reflector::ObjectRef::from_obj(v.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_claim_goes_only_when_stamped_expired_and_unmounted() {
        let ttl: tidemark_core::RetentionDuration = "1d".parse().unwrap();
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        let now = t("2026-11-23T12:00:00Z");
        // Mounted: whatever the stamp says.
        assert_eq!(
            judge(Some("db-0"), Some(t("2026-11-01T00:00:00Z")), ttl, now),
            Verdict::Mounted { pod: "db-0".into() }
        );
        // Never stamped: it is stamped now, not deleted.
        assert_eq!(
            judge(None, None, ttl, now),
            Verdict::Waiting { since: None }
        );
        // Exactly the TTL ago: not yet (strictly after, as every TTL).
        let edge = t("2026-11-22T12:00:00Z");
        assert_eq!(
            judge(None, Some(edge), ttl, now),
            Verdict::Waiting { since: Some(edge) }
        );
        let old = t("2026-11-22T11:59:59Z");
        assert_eq!(
            judge(None, Some(old), ttl, now),
            Verdict::Expired { since: old }
        );
    }
}
