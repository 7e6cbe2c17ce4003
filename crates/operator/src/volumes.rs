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
//!   `dryRun` reports (`status.deleted`) and deletes nothing;
//! - an expired claim is never mounted again (seed 004): when a pending pod of a
//!   StatefulSet references one of its template claims that expired, the claim and then
//!   the pod are deleted, and the StatefulSet recreates both — the pod on a fresh claim
//!   (`status.replaced`, an `ExpiredClaimReplaced` Warning event). A claim no StatefulSet
//!   would recreate is kept while a pod will mount it, with an `ExpiredClaimPending`
//!   Warning event; a pod that mounted an expired claim before it could be collected gets
//!   an `ExpiredClaimMounted` one.

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
use tidemark_api::crd::{ReplacedClaim, VolumeClaimRetention, VolumeClaimRetentionStatus};

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
    // The status as the API has it now, not the watch cache's copy: the deletion a look
    // just made triggers the next look at once, whose cached object may not show the
    // status that look wrote yet — a forced write from it erased the report.
    let api: Api<VolumeClaimRetention> = Api::namespaced(ctx.client.clone(), &ns);
    let previous = match api.get_opt(&vcr.name_any()).await? {
        Some(fresh) => fresh.status.unwrap_or_default(),
        None => return Ok(Action::await_change()),
    };
    let mut replaced = follow_up(&ctx, &vcr, &previous.replaced, &pods, now).await?;
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
            Verdict::Mounted { pod } => {
                if let Some(since) = stamp.filter(|s| now > ttl.after(*s)) {
                    // Started before the reaper could replace it (a pod that was never
                    // pending long enough to be seen so): said, not hidden.
                    ctx.warn(
                        &reference,
                        "ExpiredClaimMounted",
                        &format!(
                            "pod {pod} mounted PersistentVolumeClaim {name}, unmounted since {since} — past the ttl {} — before it could be collected; its data is from then",
                            vcr.spec.ttl
                        ),
                    )
                    .await;
                }
            }
            Verdict::Waiting { since } => {
                unmounted += 1;
                let until = ttl.after(since.unwrap_or(now));
                let wait = now.duration_until(until).unsigned_abs() + Duration::from_secs(1);
                next = next.min(wait);
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
                if let Some(pod_name) = live.get(&name) {
                    // A pod that will mount it exists (pending, say). Seed 004: an expired
                    // claim is never mounted again — a StatefulSet's pod and claim are
                    // replaced, so that the pod comes up on a fresh claim.
                    let Some(pod) = pods.iter().find(|p| &p.name_any() == pod_name) else {
                        continue;
                    };
                    if vcr.spec.dry_run {
                        deleted.push(name.clone());
                        continue;
                    }
                    if replace(&ctx, &vcr, claim, pod, since).await? {
                        deleted.push(name.clone());
                        replaced.push(ReplacedClaim {
                            claim: name.clone(),
                            claim_uid: claim.uid().unwrap_or_default(),
                            pod: pod.name_any(),
                            pod_uid: pod.uid().unwrap_or_default(),
                            at: Time(now),
                        });
                    }
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
                if delete_exact(&claims_api, &name, claim.uid()).await? {
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
            }
        }
    }
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
        replaced,
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

/// How long a replaced claim is followed (its pod recreated once more if it came back
/// while the old claim was still being deleted).
const FOLLOW: jiff::SignedDuration = jiff::SignedDuration::from_hours(1);

/// The StatefulSet that controls `pod`, when the claim `claim` is one of its
/// volumeClaimTemplates' (`<template>-<pod>`): the StatefulSet creates such a claim anew
/// when it is missing as it creates the pod.
fn statefulset_of(pod: &Pod, claim: &str) -> Option<String> {
    let set = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "StatefulSet")?;
    let suffix = format!("-{}", pod.name_any());
    (claim.len() > suffix.len() && claim.ends_with(&suffix)).then(|| set.name.clone())
}

/// Deletes `obj` `name` of `api` if its uid is still `uid`; whether it was deleted (gone or
/// replaced meanwhile: `false`).
async fn delete_exact<K>(api: &Api<K>, name: &str, uid: Option<String>) -> Result<bool, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// An expired `claim` that the not-running `pod` references: for a StatefulSet's claim,
/// the claim and then the pod are deleted (each only as judged: same uid, no running pod
/// mounts the claim, the pod still pending), and the StatefulSet recreates both — the pod
/// on a fresh claim. Anything else (another owner, the pod not pending, `--disable
/// recreate`) keeps the claim, with a Warning event saying why and what it means. Whether
/// the claim was replaced.
async fn replace(
    ctx: &Context,
    vcr: &VolumeClaimRetention,
    claim: &PersistentVolumeClaim,
    pod: &Pod,
    since: Timestamp,
) -> Result<bool, Error> {
    let ns = vcr.namespace().unwrap_or_default();
    let reference = vcr.object_ref(&());
    let (name, pod_name) = (claim.name_any(), pod.name_any());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let expired = format!(
        "PersistentVolumeClaim {name} expired (no running pod mounted it since {since}, ttl {})",
        vcr.spec.ttl
    );
    let keep = |why: String| {
        let reference = reference.clone();
        async move {
            ctx.warn(&reference, "ExpiredClaimPending", &why).await;
            Ok(false)
        }
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(false);
    }
    if phase != Some("Pending") {
        return keep(format!(
            "{expired}, and pod {pod_name} (phase {}) references it: kept until the pod is pending or gone",
            phase.unwrap_or("unknown")
        ))
        .await;
    }
    let Some(set) = statefulset_of(pod, &name) else {
        return keep(format!(
            "{expired}, and pending pod {pod_name} references it; no StatefulSet would create the claim anew, so it is kept and mounted again if the pod starts — delete the pod and the claim to start fresh"
        ))
        .await;
    };
    if !ctx.capabilities.recreate {
        return keep(format!(
            "{expired}, and pending pod {pod_name} of StatefulSet {set} references it; replacing them needs pod deletion, which this operator was installed without (--disable recreate), so the claim is kept and mounted again if the pod starts"
        ))
        .await;
    }
    // A fresh look right before: never a claim a running pod mounts, never a pod that
    // started meanwhile.
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let fresh = pods_api.list(&ListParams::default()).await?.items;
    let still_pending = fresh.iter().any(|p| {
        p.uid() == pod.uid()
            && p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
    });
    if mounts(&fresh).running.contains_key(&name) || !still_pending {
        return Ok(false);
    }
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    // The claim first: a pod recreated before it is gone finds it being deleted (the
    // kubelet does not start a pod on such a claim), never mounted.
    if !delete_exact(&claims_api, &name, claim.uid()).await? {
        return Ok(false);
    }
    let pod_deleted = delete_exact(&pods_api, &pod_name, pod.uid()).await?;
    ctx.warn(
        &reference,
        "ExpiredClaimReplaced",
        &format!(
            "{expired}, and pending pod {pod_name} of StatefulSet {set} referenced it: deleted the claim{} so that the StatefulSet recreates {} on a fresh claim; an expired claim is never mounted again",
            if pod_deleted { " and the pod" } else { "" },
            if pod_deleted { "both" } else { "it" },
        ),
    )
    .await;
    tracing::info!(claim = %format!("{ns}/{name}"), pod = %pod_name, "expired claim of a pending pod: replaced");
    Ok(true)
}

/// The replaced claims still followed: a pod recreated while its old claim was still
/// being deleted references a claim that is gone or going, and a StatefulSet does not
/// create the claim of a pod that exists — such a pod is deleted once more (the
/// StatefulSet then creates the claim, then the pod) until a fresh claim of the name
/// exists. Entries are kept (as the record of what was replaced) for [`FOLLOW`].
async fn follow_up(
    ctx: &Context,
    vcr: &VolumeClaimRetention,
    previous: &[ReplacedClaim],
    pods: &[Pod],
    now: Timestamp,
) -> Result<Vec<ReplacedClaim>, Error> {
    let ns = vcr.namespace().unwrap_or_default();
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let mut kept = Vec::new();
    for r in previous {
        if now > tidemark_core::saturating_add(r.at.0, FOLLOW) {
            continue;
        }
        let claim = claims_api.get_opt(&r.claim).await?;
        let fresh = claim.as_ref().is_some_and(|c| {
            c.metadata.deletion_timestamp.is_none()
                && c.uid().as_deref() != Some(r.claim_uid.as_str())
        });
        let stuck = pods.iter().find(|p| {
            !fresh
                && p.name_any() == r.pod
                && p.uid().as_deref() != Some(r.pod_uid.as_str())
                && p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
        });
        if let Some(p) = stuck
            && ctx.capabilities.recreate
            && delete_exact(&pods_api, &r.pod, p.uid()).await?
        {
            tracing::info!(claim = %format!("{ns}/{}", r.claim), pod = %r.pod, "recreated once more: its claim was still being deleted");
        }
        kept.push(r.clone());
    }
    Ok(kept)
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
