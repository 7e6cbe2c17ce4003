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
//!   would recreate (a bare pod's, a Deployment's, one named in a pod template) is
//!   **renewed**: deleted, and once it is gone created anew, empty, under the same name
//!   with its labels and the safe part of its spec (`status.replaced[].renewal`), so the
//!   pending pod starts on a fresh claim. A pod that mounted an expired claim before it
//!   could be collected gets an `ExpiredClaimMounted` Warning event.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{
    ClaimRenewal, ReplacedClaim, VolumeClaimRetention, VolumeClaimRetentionStatus,
};

use crate::context::Context;
use crate::error::Error;
use crate::status::condition_at;

/// When no running pod was last seen mounting the claim.
pub const LAST_UNMOUNTED: &str = "tidemark.io/last-unmounted-on";
/// The pod the claim belongs to (the last one seen referencing it).
pub const POD_NAME: &str = "tidemark.io/pod-name";
/// Longest pause between two looks.
const RECHECK: Duration = Duration::from_secs(300);

/// What one claim is, as the reaper judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimVerdict {
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
) -> ClaimVerdict {
    match (mounted_by, stamp) {
        (Some(pod), _) => ClaimVerdict::Mounted {
            pod: pod.to_owned(),
        },
        (None, Some(since)) if now > ttl.after(since) => ClaimVerdict::Expired { since },
        (None, since) => ClaimVerdict::Waiting { since },
    }
}

/// The claim annotations a look changes (`null` removes one): the pod it belongs to, and
/// when it was last seen unmounted (set when first seen so, removed once mounted).
pub(crate) fn annotation_patch(
    annotations: &BTreeMap<String, String>,
    owner: Option<&str>,
    verdict: &ClaimVerdict,
    now: Timestamp,
) -> serde_json::Map<String, serde_json::Value> {
    let mut patch = serde_json::Map::new();
    if let Some(pod) = owner
        && annotations.get(POD_NAME).map(String::as_str) != Some(pod)
    {
        patch.insert(POD_NAME.into(), json!(pod));
    }
    match verdict {
        ClaimVerdict::Mounted { .. } if annotations.contains_key(LAST_UNMOUNTED) => {
            patch.insert(LAST_UNMOUNTED.into(), serde_json::Value::Null);
        }
        ClaimVerdict::Waiting { since: None } => {
            patch.insert(LAST_UNMOUNTED.into(), json!(now.to_string()));
        }
        _ => {}
    }
    patch
}

/// What one look found and did.
#[derive(Debug, Clone, Default)]
pub(crate) struct Look {
    pub selected: usize,
    pub unmounted: u64,
    /// Claims deleted (a dry run: that would be).
    pub deleted: Vec<String>,
    pub retained: Vec<String>,
    pub replaced: Vec<ReplacedClaim>,
}

/// The status a look leaves: a pure function of what it did, the status before, `now`
/// and when it is written (`written`, the time of a condition that changes).
/// What the last deleting look deleted stays shown (the deletion itself triggers another
/// look, which deletes nothing).
pub(crate) fn reaper_status(
    previous: &VolumeClaimRetentionStatus,
    look: Look,
    dry_run: bool,
    generation: Option<i64>,
    now: Timestamp,
    written: Timestamp,
) -> VolumeClaimRetentionStatus {
    let Look {
        selected,
        unmounted,
        mut deleted,
        retained,
        replaced,
    } = look;
    if !dry_run && deleted.is_empty() {
        deleted = previous.deleted.clone();
    }
    let summary = if dry_run {
        format!(
            "{selected} claim(s) selected, {unmounted} unmounted; dry run: {} would be deleted",
            deleted.len()
        )
    } else {
        format!(
            "{selected} claim(s) selected, {unmounted} unmounted, {} deleted",
            deleted.len()
        )
    };
    VolumeClaimRetentionStatus {
        last_run_time: Some(Time(now)),
        unmounted: Some(unmounted),
        deleted,
        retained_volumes: retained,
        replaced,
        conditions: vec![condition_at(
            &previous.conditions,
            "Ready",
            true,
            "Reaped",
            &summary,
            generation,
            written,
        )],
        observed_generation: generation,
    }
}

/// What becomes of a claim unmounted past its TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// Its volume is `Retain` (and `deleteRetainedVolumes` is off): kept, and said.
    Retained,
    /// A pod that will mount it exists: the claim goes only with that pod (replaced).
    ReplaceWithItsPod,
    /// `dryRun`: reported as what would be deleted.
    WouldDelete,
    /// Deleted (after a fresh look at the pods).
    Delete,
}

/// The pure decision for an expired claim, from the facts read for it.
pub(crate) fn decide_expired(volume_retained: bool, live_pod: bool, dry_run: bool) -> Expired {
    match (volume_retained, live_pod, dry_run) {
        (true, _, _) => Expired::Retained,
        (false, true, _) => Expired::ReplaceWithItsPod,
        (false, false, true) => Expired::WouldDelete,
        (false, false, false) => Expired::Delete,
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

/// The pod that uses `claim` (one not finished references it: running, or about to),
/// if any: a restore writes only a claim no pod uses.
pub(crate) fn live_user(pods: &[Pod], claim: &str) -> Option<String> {
    mounts(pods).live.get(claim).cloned()
}

/// The claims `pods` reference: by `persistentVolumeClaim`, and the claim of a generic
/// ephemeral volume (`<pod>-<volume>`).
fn mounts(pods: &[Pod]) -> Mounts {
    let mut m = Mounts::default();
    let mut sorted: Vec<&Pod> = pods.iter().collect();
    sorted.sort_by_key(|p| p.name_any());
    for p in sorted {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        // A pending pod whose containers (or init containers) the kubelet started uses
        // the claim as a running one does.
        let running = phase == Some("Running") || (phase == Some("Pending") && started(p));
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
/// # Guarantees
/// Deletes only claims the VolumeClaimRetention selects, unmounted by any running pod for
/// longer than its `ttl` (at least a day), looked at again right before the delete and
/// deleted by uid (never a claim recreated under the name); never one whose volume is
/// `Retain` unless `deleteRetainedVolumes`; nothing under `dryRun`.
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
    if ttl.days() < 1 {
        // Between a pod's restart and its successor's start a claim is unmounted: a zero
        // TTL would delete a StatefulSet's data on every restart.
        return Err(Error::Invalid(format!(
            "spec.ttl: {} is shorter than the minimum, 1d",
            vcr.spec.ttl
        )));
    }
    ctx.warn_ambiguous(&vcr.object_ref(&()), &vcr.spec.ambiguous_durations())
        .await;
    let selector = crate::names::selector(&vcr.spec.selector)?;
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let volumes_api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let claims = crate::lean::list(
        &claims_api,
        &ListParams::default().labels(&selector),
        crate::lean::meta_of,
    )
    .await?;
    let pods = crate::lean::list(&pods_api, &ListParams::default(), crate::lean::meta_of).await?;
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
        let patch = annotation_patch(annotations, owner.map(String::as_str), &verdict, now);
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
            ClaimVerdict::Mounted { pod } => {
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
            ClaimVerdict::Waiting { since } => {
                unmounted += 1;
                let until = ttl.after(since.unwrap_or(now));
                let wait = now.duration_until(until).unsigned_abs() + Duration::from_secs(1);
                next = next.min(wait);
            }
            ClaimVerdict::Expired { since } => {
                unmounted += 1;
                // The facts the decision needs, read first (the volume only when it matters).
                let volume_retained =
                    match claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
                        Some(pv) if !vcr.spec.delete_retained_volumes => {
                            volumes_api
                                .get_opt(pv)
                                .await?
                                .and_then(|v| v.spec)
                                .and_then(|s| s.persistent_volume_reclaim_policy)
                                .as_deref()
                                == Some("Retain")
                        }
                        _ => false,
                    };
                let live_pod = live
                    .get(&name)
                    .map(|n| pods.iter().find(|p| &p.name_any() == n));
                match decide_expired(volume_retained, live_pod.is_some(), vcr.spec.dry_run) {
                    Expired::Retained => {
                        retained.push(name.clone());
                        continue;
                    }
                    Expired::WouldDelete => {
                        deleted.push(name.clone());
                        continue;
                    }
                    Expired::Delete => {}
                    Expired::ReplaceWithItsPod => {
                        // A pod that will mount it exists (pending, say). Seed 004: an
                        // expired claim is never mounted again — a StatefulSet's pod and
                        // claim are replaced, so that the pod comes up on a fresh claim.
                        let Some(Some(pod)) = live_pod else {
                            continue;
                        };
                        match eligibility(&ctx, &vcr, claim, pod, since).await? {
                            Eligible::Later => {}
                            Eligible::Keep(why) if !vcr.spec.dry_run => {
                                ctx.warn(&reference, "ExpiredClaimPending", &why).await;
                            }
                            Eligible::Keep(_) => {}
                            Eligible::Replace { .. } | Eligible::Renew(_) if vcr.spec.dry_run => {
                                deleted.push(name.clone());
                            }
                            Eligible::Renew(why) => {
                                if let Some(r) = renew(&ctx, claim, pod, &why, now).await? {
                                    ctx.warn(&reference, "ExpiredClaimReplaced", &format!(
                                        "{why}: deleted the claim; once it is gone Tidemark creates it anew, empty (same name, labels, size and class), so that the pod starts on a fresh claim; an expired claim is never mounted again (a claim that stays Terminating is held by its pod: delete the pod)"
                                    )).await;
                                    deleted.push(name.clone());
                                    replaced.push(r);
                                }
                            }
                            Eligible::Replace { set } => {
                                if let Some(r) =
                                    replace(&ctx, &vcr, claim, pod, since, set, now).await?
                                {
                                    deleted.push(name.clone());
                                    replaced.push(r);
                                }
                            }
                        }
                        continue;
                    }
                }
                // A fresh look right before the delete: never a claim a pod now uses or
                // is about to.
                let fresh =
                    crate::lean::list(&pods_api, &ListParams::default(), crate::lean::meta_of)
                        .await?;
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
    let status = reaper_status(
        &previous,
        Look {
            selected: claims.len(),
            unmounted,
            deleted,
            retained,
            replaced,
        },
        vcr.spec.dry_run,
        vcr.meta().generation,
        now,
        Timestamp::now(),
    );
    crate::status::own(&api, &vcr.name_any(), &status).await?;
    Ok(Action::requeue(next))
}

/// How long a replaced claim is followed (its pod deleted once more if it came back
/// while the old claim was still being deleted).
const FOLLOW: jiff::SignedDuration = jiff::SignedDuration::from_hours(1);
/// How many times a replaced claim's pod is deleted once more, at most.
const MAX_RECREATIONS: u32 = 5;

/// Whether the kubelet started any of `pod`'s containers (init containers included):
/// from then on the pod uses its volumes' data, whatever its phase says.
fn started(pod: &Pod) -> bool {
    let Some(s) = pod.status.as_ref() else {
        return false;
    };
    let began = |st: Option<&k8s_openapi::api::core::v1::ContainerState>| {
        st.is_some_and(|st| st.running.is_some() || st.terminated.is_some())
    };
    s.init_container_statuses
        .iter()
        .flatten()
        .chain(s.container_statuses.iter().flatten())
        .any(|c| began(c.state.as_ref()) || began(c.last_state.as_ref()))
}

fn pending(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
        && !started(pod)
}

/// How the events name an expired claim.
fn expired_note(vcr: &VolumeClaimRetention, claim: &str, since: Timestamp) -> String {
    format!(
        "PersistentVolumeClaim {claim} expired (no running pod mounted it since {since}, ttl {})",
        vcr.spec.ttl
    )
}

/// What to do with an expired claim a not-finished pod references.
#[derive(Debug)]
enum Eligible {
    /// Replace it with the pod: the StatefulSet `set` creates both anew.
    Replace { set: String },
    /// Nothing recreates it: delete it and create it anew, empty, for the pod (why).
    Renew(String),
    /// Keep it, for the reason given (a Warning event).
    Keep(String),
    /// Not now (the pod is going).
    Later,
}

/// Whether the expired `claim` that `pod` references may be replaced: the pod is pending
/// and never started a container, its controller is a StatefulSet of this namespace (read
/// from the API, its uid the owner reference's) of which `claim` is a template's claim
/// (`<template>-<pod>`), the install allows pod deletion, and the API server would let it
/// (a dry run). Anything else keeps the claim, with the reason.
async fn eligibility(
    ctx: &Context,
    vcr: &VolumeClaimRetention,
    claim: &PersistentVolumeClaim,
    pod: &Pod,
    since: Timestamp,
) -> Result<Eligible, Error> {
    let ns = vcr.namespace().unwrap_or_default();
    let (name, pod_name) = (claim.name_any(), pod.name_any());
    let expired = expired_note(vcr, &name, since);
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(Eligible::Later);
    }
    if !pending(pod) {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        return Ok(Eligible::Keep(format!(
            "{expired}, and pod {pod_name} (phase {}) references it: kept until the pod is pending without having started, or gone",
            phase.unwrap_or("unknown")
        )));
    }
    // A generic ephemeral volume's claim belongs to its pod (created by the pod's own
    // controller, checked by the kubelet): not one to create anew here.
    if claim
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind == "Pod")
    {
        return Ok(Eligible::Keep(format!(
            "{expired}, and pending pod {pod_name} owns it (a generic ephemeral volume); it is kept — delete the pod to start fresh"
        )));
    }
    // On a node already: the kubelet may have mounted it while the pod waits (an image
    // pull, say); deleting the claim under it would lose what the pod then writes.
    let on_node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    let nothing_recreates = || {
        if let Some(node) = &on_node {
            return Eligible::Keep(format!(
                "{expired}, and pending pod {pod_name} references it from node {node}, where it may be mounted already; nothing would recreate the pod, so the claim is kept — delete the pod and the claim to start fresh"
            ));
        }
        Eligible::Renew(format!(
            "{expired}, and pending pod {pod_name} references it; no StatefulSet would create the claim anew"
        ))
    };
    let Some(owner) = pod.owner_references().iter().find(|o| {
        o.controller == Some(true) && o.kind == "StatefulSet" && o.api_version.starts_with("apps/")
    }) else {
        return Ok(nothing_recreates());
    };
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(ctx.client.clone(), &ns);
    let set = match sets.get_opt(&owner.name).await {
        Ok(Some(s)) if s.uid().as_deref() == Some(owner.uid.as_str()) => s,
        Ok(_) => return Ok(nothing_recreates()),
        Err(e) => {
            return Ok(Eligible::Keep(format!(
                "{expired}, and pending pod {pod_name} of StatefulSet {} references it; reading the StatefulSet failed ({e}), so the claim is kept",
                owner.name
            )));
        }
    };
    let from_template = set
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_ref())
        .into_iter()
        .flatten()
        .any(|t| {
            t.metadata
                .name
                .as_deref()
                .is_some_and(|t| name == format!("{t}-{pod_name}"))
        });
    if !from_template {
        return Ok(nothing_recreates());
    }
    let set = owner.name.clone();
    if !ctx.capabilities.recreate {
        return Ok(Eligible::Keep(format!(
            "{expired}, and pending pod {pod_name} of StatefulSet {set} references it; replacing them needs pod deletion, which this operator was installed without (--disable recreate), so the claim is kept and mounted again if the pod starts"
        )));
    }
    // Whether the API server lets the pod go (RBAC from an older install may not): the
    // claim is deleted only when the pod can follow.
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let dry = DeleteParams {
        dry_run: true,
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pods.delete(&pod_name, &dry).await {
        Ok(_) => Ok(Eligible::Replace { set }),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Eligible::Later),
        Err(e) => Ok(Eligible::Keep(format!(
            "{expired}, and pending pod {pod_name} of StatefulSet {set} references it; the pod may not be deleted ({e}), so the claim is kept (give the operator delete on pods: tidemark rbac)"
        ))),
    }
}

/// On a fresh listing of `ns`'s pods: `pod` is still pending (never started) and no running
/// pod mounts `claim` — what replacing or renewing an expired claim is checked against
/// right before the delete.
///
/// # Errors
/// The API failed.
async fn still_pending_alone(
    ctx: &Context,
    ns: &str,
    claim: &str,
    pod: &Pod,
) -> Result<bool, Error> {
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let fresh = crate::lean::list(&pods_api, &ListParams::default(), crate::lean::meta_of).await?;
    let still_pending = fresh.iter().any(|p| p.uid() == pod.uid() && pending(p));
    Ok(still_pending && !mounts(&fresh).running.contains_key(claim))
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

/// Replaces an eligible expired `claim` and its pending `pod` (see [`eligibility`]): after a
/// fresh listing shows the pod still pending and no running pod on the claim, the claim is
/// deleted, then the pod (each only with its uid); the StatefulSet `set` recreates both.
/// The replacement is recorded once the claim is gone, whatever happens to the pod: a pod
/// whose deletion failed is deleted by a later look ([`follow_up`]).
async fn replace(
    ctx: &Context,
    vcr: &VolumeClaimRetention,
    claim: &PersistentVolumeClaim,
    pod: &Pod,
    since: Timestamp,
    set: String,
    now: Timestamp,
) -> Result<Option<ReplacedClaim>, Error> {
    let ns = vcr.namespace().unwrap_or_default();
    let (name, pod_name) = (claim.name_any(), pod.name_any());
    if !still_pending_alone(ctx, &ns, &name, pod).await? {
        return Ok(None);
    }
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    // The claim first: a pod recreated before it is gone finds it being deleted (the
    // kubelet does not start a pod on such a claim), never mounted.
    if !delete_exact(&claims_api, &name, claim.uid()).await? {
        return Ok(None);
    }
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod_deleted = delete_exact(&pods_api, &pod_name, pod.uid()).await;
    let pod_note = match &pod_deleted {
        Ok(true) => " and the pod".to_owned(),
        Ok(false) => " (the pod had gone already)".to_owned(),
        Err(e) => format!(" — deleting the pod failed ({e}); a later look tries again"),
    };
    ctx.warn(
        &vcr.object_ref(&()),
        "ExpiredClaimReplaced",
        &format!(
            "{}, and pending pod {pod_name} of StatefulSet {set} referenced it: deleted the claim{pod_note}, so that the StatefulSet recreates the pod on a fresh claim; an expired claim is never mounted again",
            expired_note(vcr, &name, since)
        ),
    )
    .await;
    tracing::info!(claim = %format!("{ns}/{name}"), pod = %pod_name, "expired claim of a pending pod: replaced");
    Ok(Some(ReplacedClaim {
        claim: name,
        claim_uid: claim.uid().unwrap_or_default(),
        pod: pod_name,
        pod_uid: pod.uid().unwrap_or_default(),
        stateful_set: Some(set),
        renewal: None,
        recreations: 0,
        at: Time(now),
    }))
}

/// Renews an expired `claim` that nothing would recreate and its pending `pod` references
/// (see [`eligibility`]): after a fresh listing shows the pod still pending and no running
/// pod on the claim, the claim is deleted (with its uid) and what its fresh copy is made
/// of recorded; [`follow_up`] creates that once the old one is gone.
async fn renew(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    pod: &Pod,
    why: &str,
    now: Timestamp,
) -> Result<Option<ReplacedClaim>, Error> {
    let ns = claim.namespace().unwrap_or_default();
    let (name, pod_name) = (claim.name_any(), pod.name_any());
    if !still_pending_alone(ctx, &ns, &name, pod).await? {
        return Ok(None);
    }
    let renewal = renewal_of(claim);
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    if !delete_exact(&claims_api, &name, claim.uid()).await? {
        return Ok(None);
    }
    tracing::info!(claim = %format!("{ns}/{name}"), pod = %pod_name, "{why}: renewed");
    Ok(Some(ReplacedClaim {
        claim: name,
        claim_uid: claim.uid().unwrap_or_default(),
        pod: pod_name,
        pod_uid: pod.uid().unwrap_or_default(),
        stateful_set: None,
        renewal: Some(renewal),
        recreations: 0,
        at: Time(now),
    }))
}

/// The spec fields a renewed claim keeps.
const RENEWED_FIELDS: [&str; 4] = ["accessModes", "resources", "storageClassName", "volumeMode"];

/// What the fresh copy of `claim` is made of: its labels, and its spec's access modes,
/// resources, storage class and volume mode — no volume, no data source, no selector.
fn renewal_of(claim: &PersistentVolumeClaim) -> ClaimRenewal {
    let spec = claim.spec.clone().unwrap_or_default();
    let mut fresh = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        if !v.is_null() {
            fresh.insert(k.to_owned(), v);
        }
    };
    put("accessModes", json!(spec.access_modes));
    put("resources", json!(spec.resources));
    put("storageClassName", json!(spec.storage_class_name));
    put("volumeMode", json!(spec.volume_mode));
    ClaimRenewal {
        labels: claim.labels().clone(),
        spec: serde_json::Value::Object(fresh),
        created: None,
    }
}

/// The replaced claims still followed ([`FOLLOW`]; kept as the record of what was
/// replaced). Until a fresh claim of the name exists: the pod whose deletion failed is
/// deleted again; a pod of the same StatefulSet recreated while the old claim was still
/// being deleted — it references a claim that is gone or going, and a StatefulSet may not
/// create the claim of a pod that exists — is deleted once more (at most
/// [`MAX_RECREATIONS`] times), so that the StatefulSet creates the claim, then the pod.
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
        let mut r = r.clone();
        let claim = claims_api.get_opt(&r.claim).await?;
        let fresh = claim.as_ref().is_some_and(|c| {
            c.metadata.deletion_timestamp.is_none()
                && c.uid().as_deref() != Some(r.claim_uid.as_str())
        });
        let pod = pods.iter().find(|p| p.name_any() == r.pod && pending(p));
        if let Some(renewal) = r.renewal.as_mut() {
            // The old claim gone and nothing under its name: the fresh one, for the pod.
            // Only for the pod it was renewed for, still waiting.
            let waiting = pods.iter().any(|p| {
                p.name_any() == r.pod
                    && p.uid().as_deref() == Some(r.pod_uid.as_str())
                    && pending(p)
            });
            if renewal.created.is_none() && claim.is_none() && waiting {
                // The recorded spec, read again through the fields a fresh claim may have
                // (status is writable by others: no volume, no data source from it).
                let spec: serde_json::Map<String, serde_json::Value> = renewal
                    .spec
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| RENEWED_FIELDS.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let fresh: PersistentVolumeClaim = serde_json::from_value(json!({
                    "metadata": {"name": r.claim, "namespace": ns, "labels": renewal.labels},
                    "spec": spec,
                }))
                .map_err(|e| Error::Invalid(format!("the fresh claim {}: {e}", r.claim)))?;
                match claims_api.create(&PostParams::default(), &fresh).await {
                    Ok(_) => {
                        renewal.created = Some(Time(now));
                        tracing::info!(claim = %format!("{ns}/{}", r.claim), "the fresh claim created");
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        renewal.created = Some(Time(now));
                    }
                    Err(e) => return Err(e.into()),
                }
            } else if renewal.created.is_none() && fresh {
                // Created by someone else meanwhile: nothing more to do.
                renewal.created = Some(Time(now));
            }
            kept.push(r);
            continue;
        }
        if let Some(p) = pod
            && !fresh
            && ctx.capabilities.recreate
        {
            let original = p.uid().as_deref() == Some(r.pod_uid.as_str());
            let same_set = p.owner_references().iter().any(|o| {
                o.controller == Some(true)
                    && o.kind == "StatefulSet"
                    && Some(&o.name) == r.stateful_set.as_ref()
            });
            if (original || (same_set && r.recreations < MAX_RECREATIONS))
                && delete_exact(&pods_api, &r.pod, p.uid()).await?
            {
                if !original {
                    r.recreations += 1;
                }
                tracing::info!(claim = %format!("{ns}/{}", r.claim), pod = %r.pod, "deleted once more: its claim was still being deleted");
            }
        }
        kept.push(r);
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
            ClaimVerdict::Mounted { pod: "db-0".into() }
        );
        // Never stamped: it is stamped now, not deleted.
        assert_eq!(
            judge(None, None, ttl, now),
            ClaimVerdict::Waiting { since: None }
        );
        // Exactly the TTL ago: not yet (strictly after, as every TTL).
        let edge = t("2026-11-22T12:00:00Z");
        assert_eq!(
            judge(None, Some(edge), ttl, now),
            ClaimVerdict::Waiting { since: Some(edge) }
        );
        let old = t("2026-11-22T11:59:59Z");
        assert_eq!(
            judge(None, Some(old), ttl, now),
            ClaimVerdict::Expired { since: old }
        );
    }

    /// The annotations a look writes, as a table: owner and stamp by verdict.
    #[test]
    fn a_look_stamps_unmounted_claims_and_clears_mounted_ones() {
        let now: Timestamp = "2026-11-23T12:00:00Z".parse().unwrap();
        let since: Timestamp = "2026-11-22T12:00:00Z".parse().unwrap();
        let stamped: BTreeMap<String, String> = [
            (LAST_UNMOUNTED.to_owned(), since.to_string()),
            (POD_NAME.to_owned(), "db-0".to_owned()),
        ]
        .into_iter()
        .collect();
        let none = BTreeMap::new();
        let mounted = ClaimVerdict::Mounted { pod: "db-0".into() };
        type Case<'a> = (
            &'a BTreeMap<String, String>,
            Option<&'a str>,
            ClaimVerdict,
            serde_json::Value,
        );
        let cases: [Case<'_>; 5] = [
            (
                &stamped,
                Some("db-0"),
                mounted.clone(),
                json!({LAST_UNMOUNTED: null}),
            ),
            (&none, Some("db-1"), mounted, json!({POD_NAME: "db-1"})),
            (
                &none,
                None,
                ClaimVerdict::Waiting { since: None },
                json!({LAST_UNMOUNTED: now.to_string()}),
            ),
            (
                &stamped,
                Some("db-0"),
                ClaimVerdict::Waiting { since: Some(since) },
                json!({}),
            ),
            (
                &stamped,
                Some("db-0"),
                ClaimVerdict::Expired { since },
                json!({}),
            ),
        ];
        for (annotations, owner, verdict, want) in cases {
            let got = annotation_patch(annotations, owner, &verdict, now);
            assert_eq!(serde_json::Value::Object(got), want, "{verdict:?}");
        }
    }

    /// The status a look leaves, as a table.
    #[test]
    fn a_look_status_is_a_function_of_what_it_did() {
        let now: Timestamp = "2026-11-23T12:00:00Z".parse().unwrap();
        let previous = VolumeClaimRetentionStatus {
            deleted: vec!["old-claim".into()],
            ..Default::default()
        };
        let look = |deleted: &[&str]| Look {
            selected: 3,
            unmounted: 2,
            deleted: deleted.iter().map(|d| (*d).to_owned()).collect(),
            ..Default::default()
        };
        let cases = [
            (
                look(&["c1"]),
                false,
                vec!["c1"],
                "3 claim(s) selected, 2 unmounted, 1 deleted",
            ),
            // The look the deletion triggers keeps showing what the last one deleted.
            (
                look(&[]),
                false,
                vec!["old-claim"],
                "3 claim(s) selected, 2 unmounted, 1 deleted",
            ),
            (
                look(&[]),
                true,
                vec![],
                "3 claim(s) selected, 2 unmounted; dry run: 0 would be deleted",
            ),
            (
                look(&["c2"]),
                true,
                vec!["c2"],
                "3 claim(s) selected, 2 unmounted; dry run: 1 would be deleted",
            ),
        ];
        for (l, dry_run, deleted, summary) in cases {
            let st = reaper_status(&previous, l, dry_run, Some(2), now, now);
            assert_eq!(st.deleted, deleted, "{summary}");
            assert_eq!(st.conditions[0].message, summary);
            assert_eq!(st.conditions[0].last_transition_time.0, now);
            assert_eq!(st.last_run_time.map(|t| t.0), Some(now));
            assert_eq!(st.unmounted, Some(2));
        }
    }

    /// An expired claim's fate, as a table.
    #[test]
    fn an_expired_claim_is_kept_replaced_reported_or_deleted() {
        for (retained, live, dry, want) in [
            (true, true, false, Expired::Retained),
            (true, false, true, Expired::Retained),
            (false, true, false, Expired::ReplaceWithItsPod),
            (false, true, true, Expired::ReplaceWithItsPod),
            (false, false, true, Expired::WouldDelete),
            (false, false, false, Expired::Delete),
        ] {
            assert_eq!(
                decide_expired(retained, live, dry),
                want,
                "{retained} {live} {dry}"
            );
        }
    }
}
