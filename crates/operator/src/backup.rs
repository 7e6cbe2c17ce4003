//! The Backup controller: runs one backup attempt as DESIGN.md §7 describes, and follows
//! it to `completed` or `failed`.
//!
//! For `mariabackup` / `xtrabackup` the attempt is a Job pinned to the chosen database
//! pod's node, mounting that pod's data volume, in the database container's own image, with
//! the static `tidemark` binary copied in by an init container. Its container runs
//! `tidemark push --method mariabackup -- mariabackup …`: push starts the backup tool,
//! streams its `--stream=xbstream` output straight to the store with a running sha256,
//! reads the LSNs, and commits `metadata.json` last. Credentials reach the Job as
//! environment only (the database's through an option file the container writes), never as
//! arguments.
//!
//! Phases: `pending` (nothing started; a `Blocked` condition says why, e.g. the database pod
//! is not running) → `running` (the Job exists) → `completed` (the Job succeeded and the
//! committed `metadata.json` says completed) | `failed`. The store decides: a Job that
//! succeeded without a committed backup is a failure.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::events::Recorder;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolumeClaim, Pod, PodSpec, PodTemplateSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPhase, BackupPolicy, BackupStatus, SourceSpec};
use tidemark_api::schedule::{BackupType, SCHEDULED_BACKUP_LABEL};
use tidemark_core::{Candidate, FullBecause, NextBackup};
use tidemark_store::format::{Metadata, MetadataPhase};
use tidemark_store::{Catalog, ClusterStore, NoProgress, layout};

use crate::error::Error;
use crate::pod::{self, SecretKeys};
use crate::retention::condition;
use crate::{Context, FIELD_MANAGER};

/// The default role label on database pods: `primary`, or anything else for a standby.
pub const DEFAULT_ROLE_LABEL: &str = "tidemark.io/role";
/// Where a MariaDB container keeps its data when `source.dataVolume` is not given.
const DEFAULT_DATA_PATH: &str = "/var/lib/mysql";

/// Advances one Backup.
/// The BackupPolicy a Backup names, checked as a Kubernetes name: the schema's pattern
/// refuses others, and an object admitted before it must not put its value into a request
/// path (`../../other-team/…`).
fn policy_name(backup: &Backup) -> Result<&str, tidemark_api::names::NameError> {
    let name = backup.spec.template.policy.name.as_str();
    tidemark_api::names::dns_subdomain("spec.policy.name", name).map(|()| name)
}

/// The Backup's BackupPolicy; `None` when it does not exist or the name is not a name.
async fn policy_of(
    policies: &Api<BackupPolicy>,
    backup: &Backup,
) -> Result<Option<BackupPolicy>, Error> {
    match policy_name(backup) {
        Ok(name) => Ok(policies.get_opt(name).await?),
        Err(_) => Ok(None),
    }
}

///
/// # Errors
/// The API or the store failed; the policy is missing.
pub async fn reconcile(backup: Arc<Backup>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = backup.namespace().unwrap_or_default();
    let api: Api<Backup> = Api::namespaced(ctx.client.clone(), &ns);
    let policies: Api<BackupPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    let deleting = backup.meta().deletion_timestamp.is_some();
    if deleting {
        if !crate::cleanup::has_finalizer(&backup) {
            return Ok(Action::await_change());
        }
        if crate::cleanup::settled(&backup) {
            // In the background: its DeleteHooks may take up to their timeouts, which must
            // not hold one of the controller's reconcile slots.
            let key = crate::key(backup.as_ref());
            match ctx.background.poll(&key) {
                crate::background::Polled::Running => {
                    return Ok(Action::requeue(crate::background::POLL));
                }
                crate::background::Polled::Done(outcome) => return outcome,
                crate::background::Polled::Idle => {}
            }
            let policy = policy_of(&policies, &backup).await?;
            let (c, a, b) = (ctx.clone(), api.clone(), backup.clone());
            ctx.background.start(key, async move {
                crate::cleanup::on_delete(&c, &a, &b, policy.as_ref()).await
            });
            return Ok(Action::requeue(crate::background::POLL));
        }
        // A running attempt is followed to its end first (below; nothing new starts).
    }
    let status = backup.status.clone().unwrap_or_default();
    if status.phase == Some(BackupPhase::Unknown) {
        // Written by a newer operator (a rollback, or two versions side by side): what
        // it means is not known here, so nothing is started, finished or deleted for it.
        tracing::warn!(backup = %crate::key(backup.as_ref()), "status.phase is one this operator does not know; leaving the Backup alone");
        return Ok(Action::await_change());
    }
    if status.phase.is_some_and(BackupPhase::is_done) {
        // The finalizer follows the effective deletion policy (the policy is read only
        // when the Backup does not say).
        // From the watch cache: at start-up every finished Backup is reconciled, and a
        // GET each would be most of the API traffic. One not in the cache (not filled
        // yet, or really gone) is read from the API; an expiry always reads it.
        let cached = ctx.policies.get(
            &kube::runtime::reflector::ObjectRef::new(&backup.spec.template.policy.name)
                .within(&ns),
        );
        let policy = match (
            &backup.spec.template.deletion_policy,
            &backup.spec.ttl,
            cached,
        ) {
            (Some(_), None, _) => None,
            (_, None, Some(p)) => Some(p.as_ref().clone()),
            _ => policy_of(&policies, &backup).await?,
        };
        // A policy that is gone says nothing: the finalizer stays as it was (deleting the
        // policy must not quietly turn a Delete into a Retain, nor the reverse).
        if policy.is_some() || backup.spec.template.deletion_policy.is_some() {
            let delete = crate::cleanup::effective(&backup, policy.as_ref())
                == tidemark_api::DeletionPolicy::Delete;
            crate::cleanup::set_finalizer(&api, &backup, delete).await?;
        }
        // Every Backup is reconciled once at start-up: the gauge of the newest completed
        // backup is right from then on, not only after the next backup.
        if status.phase == Some(BackupPhase::Completed)
            && let Some(at) = status.completed_at.as_ref()
        {
            let gauge =
                ctx.metrics
                    .last_successful_backup
                    .get_or_create(&crate::metrics::Metrics::policy(
                        &ns,
                        &backup.spec.template.policy.name,
                    ));
            if gauge.get() < at.0.as_second() {
                gauge.set(at.0.as_second());
            }
        }
        if let Some(ttl) = backup.spec.ttl.as_deref() {
            return crate::cleanup::expire(&ctx, &api, &backup, policy.as_ref(), ttl).await;
        }
        return Ok(Action::await_change());
    }
    if let Err(e) = policy_name(&backup) {
        return blocked(&ctx, &api, &backup, "InvalidSpec", &e.to_string()).await;
    }
    let Some(policy) = policy_of(&policies, &backup).await? else {
        let message = format!(
            "BackupPolicy {ns}/{} (spec.policy.name) does not exist",
            backup.spec.template.policy.name
        );
        return blocked(&ctx, &api, &backup, "PolicyMissing", &message).await;
    };
    // What the Job is made of must be valid before it is built (an API server refusing the
    // Job would be retried forever); a fixed policy lets it go on.
    if let Some(Err(e)) = policy
        .spec
        .resources
        .as_ref()
        .map(tidemark_api::PodResources::validate)
    {
        let message = format!("BackupPolicy {ns}/{}: {e}", policy.name_any());
        return blocked(&ctx, &api, &backup, "InvalidSpec", &message).await;
    }
    if !deleting {
        // Before anything is written: a Backup that opts into remote cleanup carries the
        // finalizer from the start.
        let delete = crate::cleanup::effective(&backup, Some(&policy))
            == tidemark_api::DeletionPolicy::Delete;
        crate::cleanup::set_finalizer(&api, &backup, delete).await?;
    }
    let method = backup
        .spec
        .template
        .method
        .as_deref()
        .unwrap_or("mariabackup");
    if !matches!(method, "mariabackup" | "xtrabackup" | "exec" | "job") {
        let message =
            format!("unknown method {method:?}; expected mariabackup, xtrabackup, exec or job");
        fail(&ctx.recorder, &api, &backup, &status, &message).await?;
        return Ok(Action::await_change());
    }
    if let t @ BackupType::Unknown(_) = &backup.spec.kind {
        let message = format!("spec.type: {}", t.unknown());
        fail(&ctx.recorder, &api, &backup, &status, &message).await?;
        return Ok(Action::await_change());
    }
    if let Some(Err(e)) = backup
        .spec
        .incremental
        .as_ref()
        .map(|i| i.validate(Some(method)))
    {
        fail(&ctx.recorder, &api, &backup, &status, &e.to_string()).await?;
        return Ok(Action::await_change());
    }
    let needs = if method == "exec" {
        (ctx.capabilities.exec, "exec")
    } else {
        (ctx.capabilities.jobs, "jobs")
    };
    if !needs.0 {
        let message = crate::rbac::refused(&format!("method {method}"), needs.1);
        fail(&ctx.recorder, &api, &backup, &status, &message).await?;
        return Ok(Action::await_change());
    }
    if method != "job" && backup.spec.template.online == Some(false) {
        let message = format!(
            "online: false is not supported by {method}: it backs up a running server (remove online, or use method job with your own offline procedure)"
        );
        fail(&ctx.recorder, &api, &backup, &status, &message).await?;
        return Ok(Action::await_change());
    }
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let job_name = status.job_name.clone().unwrap_or_else(|| job_name(&backup));
    let store = match crate::retention::open(&ctx, &policy).await {
        Ok(s) => s,
        // Nothing started yet: it waits with the reason (a Secret created or fixed is
        // noticed within a minute) and fails after PENDING_LIMIT, never holding its
        // schedule forever. One already running is followed as soon as the store opens.
        Err(e) if matches!(status.phase, None | Some(BackupPhase::Pending)) => {
            let reason = match &e {
                Error::Missing(_) => "StoreCredentialsMissing",
                Error::Invalid(_) => "InvalidSpec",
                _ => "StoreUnavailable",
            };
            let message = tidemark_engine::error::chain(&e);
            return blocked(&ctx, &api, &backup, reason, &message).await;
        }
        Err(e) => return Err(e),
    };
    let backup_id = backup_id(&backup);
    let backup_name = store_name(&backup);
    if method == "exec" {
        return exec_backup(
            &ctx,
            &api,
            backup.clone(),
            &status,
            &policy,
            store,
            &backup_name,
            &backup_id,
        )
        .await;
    }
    if let Some(job) = jobs.get_opt(&job_name).await? {
        let ours = job
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == backup.meta().uid.as_ref());
        if !ours {
            let message = format!("a Job named {job_name} exists and is not this Backup's");
            fail(&ctx.recorder, &api, &backup, &status, &message).await?;
            return Ok(Action::await_change());
        }
        if status.phase != Some(BackupPhase::Running) {
            // Created by a reconcile that stopped before recording it.
            mark_running(
                &ctx,
                &api,
                &backup,
                &status,
                &job_name,
                &store,
                &backup_name,
                &backup_id,
                "its Job",
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        return follow(
            &ctx.metrics,
            &ctx.recorder,
            &api,
            &backup,
            &status,
            &job,
            &store,
            &backup_name,
            &backup_id,
        )
        .await;
    }
    if status.phase == Some(BackupPhase::Running) {
        // Its Job is gone (deleted by hand) before an outcome was seen: the store decides.
        return settle(
            &ctx.metrics,
            &ctx.recorder,
            &api,
            &backup,
            &status,
            &store,
            &backup_name,
            &backup_id,
            None,
        )
        .await;
    }

    let store_secret = pod::policy_secret_keys(&ctx.client, &policy).await?;
    if method == "job" {
        let job = match user_job(
            &backup,
            &policy,
            &job_name,
            &ctx.image,
            &backup_name,
            &backup_id,
            store_secret.as_ref(),
        ) {
            Ok(j) => j,
            Err(message) => {
                fail(&ctx.recorder, &api, &backup, &status, &message).await?;
                return Ok(Action::await_change());
            }
        };
        let what = "the user's pod template";
        return start(
            &ctx,
            &api,
            &jobs,
            &backup,
            &status,
            job,
            &store,
            &backup_name,
            &backup_id,
            what,
        )
        .await;
    }

    // Pending: choose the pod, check the volume, create the Job.
    let (pod, source) = match target_pod(&ctx, &api, &backup, &policy).await? {
        Ok(found) => found,
        Err(action) => return Ok(action),
    };
    let data = match data_volume(&pod, source) {
        Ok(d) => d,
        Err(message) => {
            return blocked(&ctx, &api, &backup, "NoDataVolume", &message).await;
        }
    };
    // Which data directory this is: the claim's uid, else the pod's (an emptyDir lives
    // as long as its pod). InnoDB LSNs are a server's own; an incremental builds only on
    // a backup of the same data directory.
    let mut volume_id = format!("pod:{}", pod.meta().uid.as_deref().unwrap_or_default());
    if let Some(claim) = data
        .volume
        .persistent_volume_claim
        .as_ref()
        .map(|c| c.claim_name.clone())
    {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
        if let Some(pvc) = claims.get_opt(&claim).await? {
            if pvc
                .spec
                .as_ref()
                .and_then(|s| s.access_modes.as_ref())
                .is_some_and(|m| m.iter().any(|m| m == "ReadWriteOncePod"))
            {
                let message = format!(
                    "the data volume's claim {claim} is ReadWriteOncePod: no second pod may mount it; use method exec (the command runs in the database container) or job"
                );
                return blocked(&ctx, &api, &backup, "ReadWriteOncePod", &message).await;
            }
            volume_id = format!("pvc:{}", pvc.meta().uid.as_deref().unwrap_or_default());
        }
    }
    let parent = match parent_of(&store, &backup, &volume_id).await? {
        Ok(parent) => parent,
        Err(why) => {
            let message = match why {
                FullBecause::OtherSource(id) => format!(
                    "an incremental builds on a backup of the same data directory (InnoDB LSNs are a server's own), and pod {} holds none: the newest restorable one, {id}, was taken from another server; take a full backup of this one first, set target to the pod it came from, or set spec.incremental to take a full when there is no parent",
                    pod.name_any()
                ),
                FullBecause::Diverged(_) | FullBecause::ChainFull { .. } => format!(
                    "{why}: take a full backup of pod {} first, or set spec.incremental to take one when needed",
                    pod.name_any()
                ),
                FullBecause::NoParent => "an incremental needs a restorable mariabackup backup in the store to start from; there is none (spec.incremental takes a full then)".to_owned(),
            };
            return blocked(&ctx, &api, &backup, "NoParent", &message).await;
        }
    };
    let plan = JobPlan {
        job_name: job_name.clone(),
        backup: &backup,
        policy: &policy,
        source,
        pod: &pod,
        data,
        image: ctx.image.clone(),
        backup_name: backup_name.clone(),
        backup_id: backup_id.clone(),
        parent,
        volume_id,
        store_secret,
    };
    let job = plan.job().map_err(Error::Invalid)?;
    let what = format!(
        "pod {} on node {}",
        pod.name_any(),
        node_of(&pod).unwrap_or_default()
    );
    start(
        &ctx,
        &api,
        &jobs,
        &backup,
        &status,
        job,
        &store,
        &backup_name,
        &backup_id,
        &what,
    )
    .await
}

/// Records the attempt as running, then creates its Job (status first: a crash after it
/// finds the Job by its recorded name).
#[allow(clippy::too_many_arguments)]
async fn start(
    ctx: &Context,
    api: &Api<Backup>,
    jobs: &Api<Job>,
    backup: &Backup,
    status: &BackupStatus,
    job: Job,
    store: &ClusterStore,
    backup_name: &str,
    backup_id: &str,
    what: &str,
) -> Result<Action, Error> {
    let job_name = job.name_any();
    // The Job first: its name is the Backup's, so a crash after this finds it; a status
    // of `running` without a Job would be read as a Job that vanished.
    match jobs.create(&PostParams::default(), &job).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    tracing::info!(backup = %backup.name_any(), job = %job_name, "backup Job created ({what})");
    mark_running(
        ctx,
        api,
        backup,
        status,
        &job_name,
        store,
        backup_name,
        backup_id,
        what,
    )
    .await?;
    Ok(Action::requeue(Duration::from_secs(30)))
}

/// Records the attempt as running in its Job.
#[allow(clippy::too_many_arguments)]
async fn mark_running(
    ctx: &Context,
    api: &Api<Backup>,
    backup: &Backup,
    status: &BackupStatus,
    job_name: &str,
    store: &ClusterStore,
    backup_name: &str,
    backup_id: &str,
    what: &str,
) -> Result<(), Error> {
    let running = running_status(
        backup,
        status,
        Some(job_name),
        store,
        backup_name,
        backup_id,
        ctx.clock.now(),
        &format!("Job {job_name} backs up {what}"),
    );
    apply_status(api, &backup.name_any(), &running).await
}

/// The status of an attempt that started at `started_at`.
#[allow(clippy::too_many_arguments)]
fn running_status(
    backup: &Backup,
    status: &BackupStatus,
    job_name: Option<&str>,
    store: &ClusterStore,
    backup_name: &str,
    backup_id: &str,
    started_at: Timestamp,
    message: &str,
) -> BackupStatus {
    BackupStatus {
        phase: Some(BackupPhase::Running),
        backup_id: Some(backup_id.to_owned()),
        job_name: job_name.map(str::to_owned),
        bucket: Some(store.url.clone()),
        key: Some(layout::metadata_key(backup_name, backup_id).to_string()),
        started_at: Some(Time(started_at)),
        conditions: vec![condition(
            &status.conditions,
            "Ready",
            false,
            "Running",
            message,
            backup.meta().generation,
        )],
        ..Default::default()
    }
}

/// Chooses the database pod for `backup`; `Err(action)` when none can be used yet (the
/// Backup is blocked, and says why).
async fn target_pod<'p>(
    ctx: &Context,
    api: &Api<Backup>,
    backup: &Backup,
    policy: &'p BackupPolicy,
) -> Result<Result<(Pod, &'p SourceSpec), Action>, Error> {
    let Some(source) = policy.spec.source.as_ref() else {
        let message = "the BackupPolicy has no spec.source (which pods hold the database)";
        return Ok(Err(blocked(ctx, api, backup, "NoSource", message).await?));
    };
    let pods: Api<Pod> =
        Api::namespaced(ctx.client.clone(), &backup.namespace().unwrap_or_default());
    let candidates = pods
        .list(&ListParams::default().labels(&selector(&source.selector)?))
        .await?
        .items;
    let target = backup
        .spec
        .template
        .target
        .as_deref()
        .unwrap_or("prefer-standby");
    let Some(pod) = choose_pod(&candidates, source, target) else {
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
    Ok(Ok((pod, source)))
}

/// Method `exec` (see [`crate::exec`]): the command runs in the database container and
/// this process streams its stdout into the store.
#[allow(clippy::too_many_arguments)]
async fn exec_backup(
    ctx: &Arc<Context>,
    api: &Api<Backup>,
    backup: Arc<Backup>,
    status: &BackupStatus,
    policy: &BackupPolicy,
    store: ClusterStore,
    backup_name: &str,
    backup_id: &str,
) -> Result<Action, Error> {
    let uid = backup.meta().uid.clone().unwrap_or_default();
    // Whatever the (possibly stale) cached phase says: a stream of ours is the truth.
    if ctx.streams.running(&uid) {
        return Ok(Action::requeue(Duration::from_secs(30)));
    }
    if status.phase == Some(BackupPhase::Running) {
        let started = status
            .started_at
            .as_ref()
            .map_or_else(|| ctx.clock.now(), |t| t.0);
        let spec = crate::exec::attempt_spec(&backup, backup_name, backup_id, started);
        return crate::exec::fence(ctx, api, &backup, status, &store, &spec).await;
    }
    let command = backup.spec.template.command.clone();
    if command.is_empty() {
        let message = "method exec needs spec.command: the command whose stdout is the backup, run in the database container (e.g. [mariadb-dump, --all-databases, --single-transaction])";
        fail(&ctx.recorder, api, &backup, status, message).await?;
        return Ok(Action::await_change());
    }
    if backup.spec.kind == BackupType::Incremental {
        let message =
            "type incremental needs method mariabackup or xtrabackup; exec takes whole backups";
        fail(&ctx.recorder, api, &backup, status, message).await?;
        return Ok(Action::await_change());
    }
    let (pod, source) = match target_pod(ctx, api, &backup, policy).await? {
        Ok(found) => found,
        Err(action) => return Ok(action),
    };
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    let container = match &source.container {
        Some(c) if containers.iter().any(|x| &x.name == c) => c.clone(),
        Some(c) => {
            let message = format!(
                "pod {} has no container {c:?} (spec.source.container)",
                pod.name_any()
            );
            return blocked(ctx, api, &backup, "NoContainer", &message).await;
        }
        None => match containers.first() {
            Some(c) => c.name.clone(),
            None => {
                let message = format!("pod {} has no containers", pod.name_any());
                return blocked(ctx, api, &backup, "NoContainer", &message).await;
            }
        },
    };
    let plan = crate::exec::ExecPlan {
        pod: pod.name_any(),
        container,
        command,
    };
    // At most `exec_limits.streams` at once: the others wait their turn (a queue, never
    // a failure; a queued Backup is not failed by the pending limit).
    let Ok(slot) = ctx.exec_slots.clone().try_acquire_owned() else {
        let message = format!(
            "queued: at most {} exec streams run at once (tidemark operator --exec-streams); it starts when one ends",
            ctx.exec_limits.streams
        );
        let mut queued = status.clone();
        queued.phase = Some(BackupPhase::Pending);
        queued.conditions = vec![condition(
            &status.conditions,
            "Blocked",
            true,
            "Queued",
            &message,
            backup.meta().generation,
        )];
        if queued != *status {
            apply_status(api, &backup.name_any(), &queued).await?;
        }
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    let started = ctx.clock.now();
    let spec = crate::exec::attempt_spec(&backup, backup_name, backup_id, started);
    let running = running_status(
        &backup,
        status,
        None,
        &store,
        backup_name,
        backup_id,
        started,
        &format!("streams {}", plan.describe()),
    );
    // Running first: a crash after it is fenced by the next reconcile (no stream of ours),
    // never a second attempt under the same backup-id.
    apply_status(api, &backup.name_any(), &running).await?;
    tracing::info!(backup = %backup.name_any(), "exec backup started: {}", plan.describe());
    crate::exec::spawn(ctx, backup, store, spec, plan, slot);
    Ok(Action::requeue(Duration::from_secs(30)))
}

/// Follows a Job: done when it succeeded or failed, then the store says what happened.
#[allow(clippy::too_many_arguments)]
async fn follow(
    metrics: &crate::metrics::Metrics,
    recorder: &Recorder,
    api: &Api<Backup>,
    backup: &Backup,
    status: &BackupStatus,
    job: &Job,
    store: &ClusterStore,
    name: &str,
    id: &str,
) -> Result<Action, Error> {
    let js = job.status.clone().unwrap_or_default();
    let finished = |t: &str| {
        js.conditions
            .as_ref()
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == t && c.status == "True"))
    };
    if finished("Complete") || js.succeeded.unwrap_or(0) > 0 {
        return settle(
            metrics, recorder, api, backup, status, store, name, id, None,
        )
        .await;
    }
    if finished("Failed") || js.failed.unwrap_or(0) > 0 {
        let job_says = js
            .conditions
            .as_ref()
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Failed"))
            .and_then(|c| c.message.clone());
        // The pod's own words say why; the Job's condition only that it gave up.
        let pod_says = pod::job_failure(&api.clone().into_client(), job).await;
        let why = match (pod_says, job_says) {
            (Some(p), _) => p,
            (None, Some(j)) => j,
            (None, None) => "its container exited with an error".into(),
        };
        let why = format!("the backup Job failed: {why}");
        return settle(
            metrics,
            recorder,
            api,
            backup,
            status,
            store,
            name,
            id,
            Some(why),
        )
        .await;
    }
    Ok(Action::requeue(Duration::from_secs(30)))
}

/// Reads the attempt's `metadata.json` and records the outcome; `failure` says why the
/// runner failed, when the store has no error of its own.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn settle(
    metrics: &crate::metrics::Metrics,
    recorder: &Recorder,
    api: &Api<Backup>,
    backup: &Backup,
    status: &BackupStatus,
    store: &ClusterStore,
    name: &str,
    id: &str,
    failure: Option<String>,
) -> Result<Action, Error> {
    let key = layout::metadata_key(name, id);
    let mut unreadable = None;
    let meta = match store.read(&key).await {
        Ok(Some(bytes)) => serde_json::from_slice::<Metadata>(&bytes).ok(),
        Ok(None) => None,
        // The runner failed, so it committed nothing, and the store cannot be read (a
        // store the runner could not reach either, say): the runner's failure is the
        // outcome, rather than a Backup running for ever.
        Err(e) if failure.is_some() => {
            unreadable = Some(tidemark_engine::error::chain(&e));
            None
        }
        Err(e) => return Err(Error::Engine(e.into())),
    };
    match meta {
        Some(m) if m.phase == MetadataPhase::Completed && m.backup_id == id => {
            let mut done = status.clone();
            done.phase = Some(BackupPhase::Completed);
            done.completed_at = m.completed_at.map(Time);
            done.started_at = Some(Time(m.started_at));
            done.size = Some(m.payload.iter().map(|p| p.size).sum());
            done.checksum = m.payload.first().map(|p| format!("sha256:{}", p.sha256));
            done.kind = Some(
                match m.kind {
                    tidemark_store::format::BackupType::Full => "full",
                    tidemark_store::format::BackupType::Incremental => "incremental",
                }
                .to_owned(),
            );
            done.parent_id = m.parent_id.clone();
            done.key = Some(key.to_string());
            done.error = None;
            done.conditions = vec![condition(
                &status.conditions,
                "Ready",
                true,
                "Completed",
                "the backup is committed in the store",
                backup.meta().generation,
            )];
            apply_status(api, &backup.name_any(), &done).await?;
            if let Some(at) = m.completed_at {
                metrics
                    .last_successful_backup
                    .get_or_create(&crate::metrics::Metrics::policy(
                        &backup.namespace().unwrap_or_default(),
                        &backup.spec.template.policy.name,
                    ))
                    .set(at.as_second());
            }
            tracing::info!(backup = %backup.name_any(), id, "backup completed");
        }
        other => {
            let recorded = other.and_then(|m| m.error);
            let message = match (recorded, failure) {
                (Some(e), _) => e,
                (None, Some(j)) => match unreadable {
                    Some(e) => format!("{j} (and the store could not be read: {e})"),
                    None => j,
                },
                (None, None) => {
                    "the backup Job succeeded but no completed metadata.json was committed".into()
                }
            };
            fail(recorder, api, backup, status, &message).await?;
        }
    }
    Ok(Action::await_change())
}

async fn fail(
    recorder: &Recorder,
    api: &Api<Backup>,
    backup: &Backup,
    status: &BackupStatus,
    message: &str,
) -> Result<(), Error> {
    // `push` records its error already redacted; the Job's own messages carry no secret.
    let message = message.to_owned();
    let mut failed = status.clone();
    failed.phase = Some(BackupPhase::Failed);
    failed.completed_at = Some(Time(Timestamp::now()));
    failed.error = Some(message.clone());
    failed.conditions = vec![condition(
        &status.conditions,
        "Ready",
        false,
        "Failed",
        &message,
        backup.meta().generation,
    )];
    tracing::warn!(backup = %backup.name_any(), "backup failed: {message}");
    apply_status(api, &backup.name_any(), &failed).await?;
    // The same words as an event (the API keeps notes up to 1 KiB): `kubectl describe`
    // and event pipelines see why, not only that.
    let event = Event {
        type_: EventType::Warning,
        reason: "BackupFailed".into(),
        note: Some(pod::tail(&message, pod::FAILURE_LIMIT).to_owned()),
        action: "Backup".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &backup.object_ref(&())).await {
        tracing::warn!(backup = %backup.name_any(), "could not publish event: {e}");
    }
    Ok(())
}

/// Whether `blocked` gave up (it then waits for a change instead of a minute).
fn backup_failed(a: &Action) -> bool {
    *a == Action::await_change()
}

/// How long a Backup may stay blocked before it is recorded as failed: a pending Backup
/// holds its schedule's concurrency guard, so it must not stay pending for ever.
pub const PENDING_LIMIT: jiff::SignedDuration = jiff::SignedDuration::from_hours(1);
/// How long a backup Job may run (`activeDeadlineSeconds`) before it is stopped and the
/// Backup recorded as failed.
pub const JOB_DEADLINE_SECONDS: i64 = 24 * 3600;
/// How long a finished backup Job (and its pod) is kept (`ttlSecondsAfterFinished`, where
/// the cluster's TTL controller runs: Kubernetes 1.21+) — its outcome is in the Backup's
/// status by then — so finished Jobs do not pile up beside their Backups.
pub const FINISHED_JOB_TTL_SECONDS: i32 = 24 * 3600;

/// Records why nothing started yet (phase stays `pending`), and asks to look again in a
/// minute (a fixed policy or a pod coming up is noticed then); after [`PENDING_LIMIT`] the
/// Backup is failed with the same reason instead.
async fn blocked(
    ctx: &Context,
    api: &Api<Backup>,
    backup: &Backup,
    reason: &str,
    message: &str,
) -> Result<Action, Error> {
    let created = backup.meta().creation_timestamp.as_ref().map(|t| t.0);
    if created.is_some_and(|c| ctx.clock.now() > tidemark_core::saturating_add(c, PENDING_LIMIT)) {
        let status = backup.status.clone().unwrap_or_default();
        fail(
            &ctx.recorder,
            api,
            backup,
            &status,
            &format!("could not start within {PENDING_LIMIT:#}: {message}"),
        )
        .await?;
        return Ok(Action::await_change());
    }
    let mut status = backup.status.clone().unwrap_or_default();
    status.phase = Some(BackupPhase::Pending);
    let previous = status.conditions.clone();
    status.conditions = vec![condition(
        &previous,
        "Blocked",
        true,
        reason,
        message,
        backup.meta().generation,
    )];
    apply_status(api, &backup.name_any(), &status).await?;
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// Writes the attempt's fields of a Backup's status (phase, ids, sizes, times, error, the
/// `Ready` and `Blocked` conditions) under the operator's field manager. Each other writer
/// has its own fields and manager ([`apply_fields`]), so a copy of the status that is
/// behind never drops what another wrote (issue 18 §5).
pub async fn apply_status(
    api: &Api<Backup>,
    name: &str,
    status: &BackupStatus,
) -> Result<(), Error> {
    let mut own = status.clone();
    own.hooks.clear();
    own.data_removed = None;
    own.conditions
        .retain(|c| !DELETION_CONDITIONS.contains(&c.type_.as_str()));
    apply_fields(
        api,
        name,
        FIELD_MANAGER,
        serde_json::to_value(&own).unwrap_or_default(),
    )
    .await
}

/// The conditions the deletion writes, each under its own field manager (the key).
pub const DELETION_CONDITIONS: [&str; 2] = ["RemoteCleanup", "Expired"];
/// The field manager of `status.hooks`.
pub const HOOKS_MANAGER: &str = "tidemark-operator-hooks";

/// Server-side applies `status` (the fields `manager` owns) to the Backup `name`: fields
/// it owned and no longer names are removed, fields of other managers stay.
pub async fn apply_fields(
    api: &Api<Backup>,
    name: &str,
    manager: &str,
    status: serde_json::Value,
) -> Result<(), Error> {
    let patch = json!({
        "apiVersion": tidemark_api::API_VERSION,
        "kind": "Backup",
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

/// The Job's name: `<backup>-<uid>-backup` (the Backup's name cut to fit 63 characters,
/// and the first 8 hex digits of its uid), so two Backups — two slots of a long-named
/// schedule, or a Backup deleted and created again under its name — never share a Job.
pub fn job_name(backup: &Backup) -> String {
    let mut base: String = backup.name_any().chars().take(46).collect();
    while base.ends_with('-') || base.ends_with('.') {
        base.pop();
    }
    format!("{base}-{}-backup", short_uid(backup))
}

/// The first 8 hex digits of an object's uid (`00000000` before it has one): short,
/// stable names for what the operator creates for it.
pub(crate) fn short_uid<K: Resource>(o: &K) -> String {
    let uid: String = o
        .meta()
        .uid
        .as_deref()
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_hexdigit)
        .map(|c| c.to_ascii_lowercase())
        .take(8)
        .collect();
    format!("{uid:0<8}")
}

/// The label every Job of a Backup carries: its uid (a name may be longer than a label
/// value allows).
pub const BACKUP_UID_LABEL: &str = "tidemark.io/backup-uid";

/// The backup-id: the Backup's creation time and its uid, so every reconcile of one Backup
/// names the same attempt.
pub fn backup_id(b: &Backup) -> String {
    let at = b
        .meta()
        .creation_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    format!("{}-{}", at.strftime("%Y%m%dT%H%M%SZ"), short_uid(b))
}

/// The backup name in the store: its schedule's name for a scheduled Backup (so one
/// schedule's backups share a directory), else the Backup's own name.
pub fn store_name(b: &Backup) -> String {
    b.labels()
        .get(SCHEDULED_BACKUP_LABEL)
        .cloned()
        .unwrap_or_else(|| b.name_any())
}

pub(crate) fn selector(
    s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Result<String, Error> {
    let mut parts: Vec<String> = s
        .match_labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in s.match_expressions.clone().unwrap_or_default() {
        let values = e.values.unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            other => {
                return Err(Error::Invalid(format!(
                    "spec.source.selector: unknown operator {other:?}; expected In, NotIn, Exists or DoesNotExist"
                )));
            }
        });
    }
    if parts.is_empty() {
        return Err(Error::Invalid(
            "spec.source.selector selects nothing; give matchLabels of the database pods".into(),
        ));
    }
    Ok(parts.join(","))
}

fn running(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && node_of(p).is_some()
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

/// The pod to back up: for `primary`, the running pod labelled primary; for
/// `prefer-standby`, a running standby (the first by name), else the primary.
pub fn choose_pod(pods: &[Pod], source: &SourceSpec, target: &str) -> Option<Pod> {
    let label = source.role_label.as_deref().unwrap_or(DEFAULT_ROLE_LABEL);
    let mut live: Vec<&Pod> = pods.iter().filter(|p| running(p)).collect();
    live.sort_by_key(|p| p.name_any());
    let is_primary = |p: &Pod| p.labels().get(label).map(String::as_str) == Some("primary");
    let primary = live.iter().find(|p| is_primary(p)).copied();
    let chosen = match target {
        "primary" => primary,
        _ => live
            .iter()
            .find(|p| !is_primary(p) && p.labels().contains_key(label))
            .copied()
            .or(primary)
            .or_else(|| live.first().copied()),
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
async fn parent_of(
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
    let catalog = Catalog::load_backups(store, &NoProgress)
        .await
        .map_err(|e| Error::Engine(e.into()))?;
    // Made by mariabackup from this data directory, or from another.
    let candidates: std::collections::HashMap<&str, Candidate> = catalog
        .backups
        .iter()
        .filter_map(|c| {
            let m = c.metadata.as_ref().filter(|m| m.method == "mariabackup")?;
            let same = m.labels.get(DATA_VOLUME_LABEL).map(String::as_str) == Some(volume_id);
            let diverged = m
                .error
                .as_deref()
                .is_some_and(tidemark_mariadb::is_lsn_behind);
            let candidate = match (same, diverged) {
                (true, true) => Candidate::Diverged,
                (true, false) => Candidate::Yes,
                (false, _) => Candidate::OtherSource,
            };
            Some((c.backup.id.as_str(), candidate))
        })
        .collect();
    let next = tidemark_core::next_backup(
        &catalog.inventory(&Default::default()),
        |b| {
            candidates
                .get(b.id.as_str())
                .copied()
                .unwrap_or(Candidate::No)
        },
        max,
    );
    Ok(match next {
        NextBackup::Incremental { parent, .. } => Ok(Some(parent)),
        NextBackup::Full(why) if backup.spec.incremental.is_some() => {
            tracing::info!(backup = %backup.name_any(), "a full backup: {why}");
            Ok(None)
        }
        NextBackup::Full(why) => Err(why),
    })
}

/// Everything the Job is made of.
#[derive(Debug)]
pub struct JobPlan<'a> {
    pub job_name: String,
    pub backup: &'a Backup,
    pub policy: &'a BackupPolicy,
    pub source: &'a SourceSpec,
    pub pod: &'a Pod,
    pub data: DataVolume,
    /// The operator's image: it holds the static `tidemark` binary at `/tidemark`.
    pub image: String,
    pub backup_name: String,
    pub backup_id: String,
    pub parent: Option<String>,
    /// The data directory's identity (`pvc:<uid>` or `pod:<uid>`), recorded as the label
    /// [`DATA_VOLUME_LABEL`]: an incremental's parent must carry the same.
    pub volume_id: String,
    pub store_secret: Option<SecretKeys>,
}

/// The labels a backup records in its `metadata.json`: its Backup object's own (so that
/// what selects the object — a DeleteHook — can be known from the store once the object
/// is gone), and `tidemark.io/backup` naming the object.
pub fn stored_labels(backup: &Backup) -> std::collections::BTreeMap<String, String> {
    let mut labels: std::collections::BTreeMap<String, String> = backup
        .labels()
        .iter()
        .filter(|(k, _)| k.as_str() != DATA_VOLUME_LABEL)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(crate::exec::BACKUP_LABEL.to_owned(), backup.name_any());
    labels
}

/// The label recording which data directory a physical backup was taken from.
pub const DATA_VOLUME_LABEL: &str = "tidemark.io/data-volume";

impl JobPlan<'_> {
    /// The Job.
    ///
    /// # Errors
    /// The policy's store or the pod lacks what the Job needs.
    pub fn job(&self) -> Result<Job, String> {
        let os = self
            .policy
            .spec
            .object_store
            .as_ref()
            .ok_or("the BackupPolicy has no spec.objectStore")?;
        let url = os.store_url().map_err(|e| e.to_string())?;
        let node = node_of(self.pod).ok_or("the database pod is not scheduled on a node")?;
        let pod_ip = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .ok_or("the database pod has no IP yet")?;
        let cluster = self
            .policy
            .spec
            .cluster_or(&self.policy.name_any())
            .to_owned();
        let data_path = self.data.mount.mount_path.clone();

        // `tidemark push … -- mariabackup …`: push runs the tool and streams its output.
        let mut push = vec![
            "push".to_owned(),
            "--store".into(),
            url,
            "--cluster".into(),
            cluster,
            "--backup-name".into(),
            self.backup_name.clone(),
            "--backup-id".into(),
            self.backup_id.clone(),
            "--method".into(),
            "mariabackup".into(),
            "--label".into(),
            format!("{DATA_VOLUME_LABEL}={}", self.volume_id),
        ];
        for (k, v) in stored_labels(self.backup) {
            push.extend(["--label".into(), format!("{k}={v}")]);
        }
        if let Some(p) = &self.parent {
            push.extend([
                "--type".into(),
                "incremental".into(),
                "--parent".into(),
                p.clone(),
            ]);
        }
        if let Some(ttl) = &self.backup.spec.ttl {
            push.extend(["--ttl".into(), ttl.clone()]);
        }
        let tool = if self.backup.spec.template.method.as_deref() == Some("xtrabackup") {
            "xtrabackup"
        } else {
            "mariabackup"
        };
        push.push("--".into());
        push.push(tool.into());
        let with_login = self.source.credentials_secret.is_some();
        if with_login {
            // Must come first; written by the container from its environment.
            push.push(format!("--defaults-extra-file={}/my.cnf", pod::TOOLS_DIR));
        }
        push.extend([
            format!("--host={pod_ip}"),
            format!("--port={}", self.source.port.unwrap_or(3306)),
            format!("--datadir={data_path}"),
        ]);
        // The option file is written with the shell's printf from the environment, so the
        // password is in no argument of any process.
        let script = if with_login {
            pod::login_script()
        } else {
            pod::tidemark_script()
        };
        let mut args = vec![script, "tidemark".to_owned()];
        args.extend(push);

        let mut env = vec![pod::plain("TIDEMARK_LOG", "info")];
        env.extend(pod::store_env(os, self.store_secret.as_ref()));
        if let Some(db) = &self.source.credentials_secret {
            env.extend(pod::login_env(db));
        }
        let mut data_mount = self.data.mount.clone();
        // mariabackup only reads the data directory.
        data_mount.read_only = None;
        let image = self
            .data
            .container
            .image
            .clone()
            .ok_or("the database container has no image")?;
        let pod_spec = self.pod.spec.clone().unwrap_or_default();
        let labels = pod::labels(
            BACKUP_UID_LABEL,
            self.backup.meta().uid.as_deref().unwrap_or_default(),
        );
        let owner = crate::owner_ref(self.backup).ok_or("the Backup has no uid yet")?;
        Ok(Job {
            metadata: ObjectMeta {
                name: Some(self.job_name.clone()),
                namespace: self.backup.namespace(),
                labels: Some(labels.clone()),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            spec: Some(JobSpec {
                // A retry would be a second attempt at the same backup-id (refused by the
                // store's conditional commit): the next slot tries again instead.
                backoff_limit: Some(0),
                active_deadline_seconds: Some(JOB_DEADLINE_SECONDS),
                ttl_seconds_after_finished: Some(FINISHED_JOB_TTL_SECONDS),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        restart_policy: Some("Never".into()),
                        affinity: Some(Affinity {
                            node_affinity: Some(NodeAffinity {
                                required_during_scheduling_ignored_during_execution: Some(
                                    NodeSelector {
                                        node_selector_terms: vec![NodeSelectorTerm {
                                            match_expressions: Some(vec![
                                                NodeSelectorRequirement {
                                                    key: "kubernetes.io/hostname".into(),
                                                    operator: "In".into(),
                                                    values: Some(vec![node]),
                                                },
                                            ]),
                                            ..Default::default()
                                        }],
                                    },
                                ),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                        tolerations: pod_spec.tolerations.clone(),
                        security_context: pod_spec.security_context.clone(),
                        service_account_name: pod_spec.service_account_name.clone(),
                        image_pull_secrets: pod_spec.image_pull_secrets.clone(),
                        init_containers: Some(vec![pod::install_container(
                            &self.image,
                            pod_spec.security_context.as_ref(),
                            self.policy,
                        )]),
                        containers: vec![Container {
                            name: "backup".into(),
                            resources: pod::resources(self.policy, |r| r.backup.as_ref()),
                            image: Some(image),
                            image_pull_policy: self.data.container.image_pull_policy.clone(),
                            command: Some(vec!["sh".into(), "-c".into()]),
                            args: Some(args),
                            env: Some(env),
                            volume_mounts: Some(vec![
                                data_mount,
                                pod::tools_mount(),
                                pod::tmp_mount(),
                            ]),
                            security_context: self.data.container.security_context.clone(),
                            termination_message_policy: Some(
                                pod::TERMINATION_MESSAGE_POLICY.into(),
                            ),
                            ..Default::default()
                        }],
                        volumes: Some(vec![
                            self.data.volume.clone(),
                            pod::tools_volume(),
                            pod::tmp_volume(),
                        ]),
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            status: None,
        })
    }
}

/// The Job of method `job`: the user's pod template, with the destination in every
/// container's environment and `tidemark` copied in.
///
/// # Errors
/// No or an unreadable `jobTemplate`, or no object store.
pub fn user_job(
    backup: &Backup,
    policy: &BackupPolicy,
    job_name: &str,
    image: &str,
    backup_name: &str,
    backup_id: &str,
    store_secret: Option<&SecretKeys>,
) -> Result<Job, String> {
    let template = backup
        .spec
        .template
        .job_template
        .clone()
        .ok_or("method job needs spec.jobTemplate (the pod template that makes the backup)")?;
    let mut template: PodTemplateSpec = serde_json::from_value(template)
        .map_err(|e| format!("spec.jobTemplate is not a pod template: {e}"))?;
    let os = policy
        .spec
        .object_store
        .as_ref()
        .ok_or("the BackupPolicy has no spec.objectStore")?;
    let mut env = vec![
        pod::plain(
            "TIDEMARK_STORE",
            &os.store_url().map_err(|e| e.to_string())?,
        ),
        pod::plain(
            "TIDEMARK_CLUSTER",
            policy.spec.cluster_or(&policy.name_any()),
        ),
        pod::plain("TIDEMARK_BACKUP_NAME", backup_name),
        pod::plain("TIDEMARK_BACKUP_ID", backup_id),
    ];
    env.extend(pod::store_env(os, store_secret));
    let spec = template.spec.get_or_insert_with(Default::default);
    if spec.containers.is_empty() {
        return Err("spec.jobTemplate has no containers".into());
    }
    for c in &mut spec.containers {
        let mut e = c.env.take().unwrap_or_default();
        // Ours win: a template cannot point the backup elsewhere by accident.
        e.retain(|v| !env.iter().any(|ours| ours.name == v.name));
        e.extend(env.iter().cloned());
        c.env = Some(e);
        c.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(pod::tools_mount());
        // Unless the template says otherwise, a failure's log tail reaches the status.
        c.termination_message_policy
            .get_or_insert_with(|| pod::TERMINATION_MESSAGE_POLICY.into());
    }
    let install = pod::install_container(image, spec.security_context.as_ref(), policy);
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .insert(0, install);
    spec.volumes
        .get_or_insert_with(Vec::new)
        .push(pod::tools_volume());
    spec.restart_policy = Some("Never".into());
    let labels = pod::labels(
        BACKUP_UID_LABEL,
        backup.meta().uid.as_deref().unwrap_or_default(),
    );
    template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend(labels.clone());
    let owner = crate::owner_ref(backup).ok_or("the Backup has no uid yet")?;
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(job_name.to_owned()),
            namespace: backup.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(JOB_DEADLINE_SECONDS),
            ttl_seconds_after_finished: Some(FINISHED_JOB_TTL_SECONDS),
            template,
            ..Default::default()
        }),
        status: None,
    })
}

/// Which Backup a Job belongs to (its controller owner reference).
pub fn backup_of(job: &Job) -> Option<kube::runtime::reflector::ObjectRef<Backup>> {
    let ns = job.namespace()?;
    job.owner_references()
        .iter()
        .find(|o| o.kind == "Backup" && o.controller == Some(true))
        .map(|o| kube::runtime::reflector::ObjectRef::new(&o.name).within(&ns))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(name: &str, role: Option<&str>, running: bool) -> Pod {
        let mut labels = serde_json::Map::new();
        labels.insert("app".into(), json!("db"));
        if let Some(r) = role {
            labels.insert(DEFAULT_ROLE_LABEL.into(), json!(r));
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {
                "nodeName": format!("node-of-{name}"),
                "containers": [{"name": "mariadb", "image": "mariadb:11.4",
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/mysql", "subPath": "mysql"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{name}")}}],
                "tolerations": [{"key": "db", "operator": "Exists"}],
            },
            "status": {"phase": if running { "Running" } else { "Pending" }, "podIP": "10.0.0.7"},
        }))
        .unwrap()
    }

    fn source() -> SourceSpec {
        serde_json::from_value(json!({
            "selector": {"matchLabels": {"app": "db"}},
            "credentialsSecret": "db-login",
        }))
        .unwrap()
    }

    #[test]
    fn the_target_chooses_the_pod() {
        let pods = vec![
            pod("db-0", Some("primary"), true),
            pod("db-1", Some("replica"), true),
            pod("db-2", Some("replica"), false),
        ];
        let s = source();
        assert_eq!(choose_pod(&pods, &s, "primary").unwrap().name_any(), "db-0");
        assert_eq!(
            choose_pod(&pods, &s, "prefer-standby").unwrap().name_any(),
            "db-1"
        );
        // No standby running: the primary.
        let only_primary = vec![pods[0].clone(), pods[2].clone()];
        assert_eq!(
            choose_pod(&only_primary, &s, "prefer-standby")
                .unwrap()
                .name_any(),
            "db-0"
        );
        // Nothing running: nothing (a condition, not a hung Job).
        assert!(choose_pod(&[pods[2].clone()], &s, "primary").is_none());
        assert!(choose_pod(&[pods[1].clone()], &s, "primary").is_none());
    }

    #[test]
    fn names_are_deterministic_and_valid() {
        let b: Backup = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": "nightly-20261122020000", "namespace": "ns",
                "uid": "4F3A9C1E-0000-4000-8000-000000000000",
                "creationTimestamp": "2026-11-22T02:00:01Z",
                "labels": {"tidemark.io/scheduled-backup": "nightly"}},
            "spec": {"policy": {"name": "db"}},
        }))
        .unwrap();
        let id = backup_id(&b);
        assert_eq!(id, "20261122T020001Z-4f3a9c1e");
        assert!(tidemark_core::inventory::is_backup_id(&id));
        assert_eq!(store_name(&b), "nightly");
        assert_eq!(job_name(&b), "nightly-20261122020000-4f3a9c1e-backup");
        let mut long = b.clone();
        long.metadata.name = Some(format!("{}-20261122020000", "x".repeat(47)));
        let other_slot = {
            let mut o = long.clone();
            o.metadata.name = Some(format!("{}-20261122030000", "x".repeat(47)));
            o.metadata.uid = Some("5e000000-0000".into());
            o
        };
        assert!(job_name(&long).len() <= 63, "{}", job_name(&long));
        assert_ne!(
            job_name(&long),
            job_name(&other_slot),
            "two slots share a Job"
        );
    }

    /// The backup Job of an incremental Backup `m` of policy `shop` from pod `p`.
    fn job_of(p: &Pod) -> Job {
        let s = source();
        let policy: BackupPolicy = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
            "metadata": {"name": "shop", "namespace": "ns"},
            "spec": {"objectStore": {"bucket": "b", "path": "prod", "endpoint": "http://s3:9000", "credentialsSecret": "s3"}},
        }))
        .unwrap();
        let b: Backup = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": "m", "namespace": "ns", "uid": "abcdef12-0000", "creationTimestamp": "2026-11-22T02:00:01Z"},
            "spec": {"policy": {"name": "shop"}, "type": "incremental", "ttl": "7d"},
        }))
        .unwrap();
        let plan = JobPlan {
            job_name: job_name(&b),
            backup: &b,
            policy: &policy,
            source: &s,
            pod: p,
            data: data_volume(p, &s).unwrap(),
            image: "tidemark:test".into(),
            backup_name: "m".into(),
            backup_id: backup_id(&b),
            parent: Some("20261121T020001Z-00000001".into()),
            volume_id: "pvc:0123-4567".into(),
            store_secret: Some(SecretKeys {
                name: "s3".into(),
                env: vec![
                    ("AWS_ACCESS_KEY_ID".into(), "accessKeyId".into()),
                    ("AWS_SECRET_ACCESS_KEY".into(), "secretAccessKey".into()),
                ],
            }),
        };
        plan.job().unwrap()
    }

    #[test]
    fn the_job_carries_secrets_only_by_reference() {
        let p = pod("db-1", Some("replica"), true);
        let job = job_of(&p);
        // Bounded in time, and gone a day after it finished (its outcome is in status).
        let job_spec = job.spec.clone().unwrap();
        assert_eq!(job_spec.active_deadline_seconds, Some(JOB_DEADLINE_SECONDS));
        assert_eq!(
            job_spec.ttl_seconds_after_finished,
            Some(FINISHED_JOB_TTL_SECONDS)
        );
        let spec = job.spec.unwrap().template.spec.unwrap();
        let c = &spec.containers[0];
        let args = c.args.clone().unwrap();
        // Pinned, tolerated, in the database image, the claim mounted with its subPath.
        let affinity = serde_json::to_string(&spec.affinity).unwrap();
        assert!(affinity.contains("node-of-db-1"), "{affinity}");
        assert_eq!(spec.tolerations.as_ref().unwrap().len(), 1);
        assert_eq!(c.image.as_deref(), Some("mariadb:11.4"));
        let mount = &c.volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (mount.mount_path.as_str(), mount.sub_path.as_deref()),
            ("/var/lib/mysql", Some("mysql"))
        );
        assert_eq!(
            spec.volumes.as_ref().unwrap()[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "data-db-1"
        );
        // push to the store, incremental from the parent, then the tool with the option
        // file first and the pod's address.
        let joined = args.join(" ");
        for part in [
            "push --store s3://b/prod --cluster shop --backup-name m --backup-id 20261122T020001Z-abcdef12",
            "--type incremental --parent 20261121T020001Z-00000001",
            "--ttl 7d",
            "--label tidemark.io/data-volume=pvc:0123-4567",
            "-- mariabackup --defaults-extra-file=/tidemark-bin/my.cnf --host=10.0.0.7 --port=3306 --datadir=/var/lib/mysql",
        ] {
            assert!(joined.contains(part), "{part} not in {joined}");
        }
        // Credentials by reference only.
        let env = c.env.clone().unwrap();
        let by_ref = |n: &str| {
            env.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value_from.as_ref())
                .and_then(|v| v.secret_key_ref.as_ref())
                .map(|r| (r.name.clone(), r.key.clone()))
        };
        assert_eq!(
            by_ref("AWS_SECRET_ACCESS_KEY"),
            Some(("s3".into(), "secretAccessKey".into()))
        );
        assert_eq!(
            by_ref("DB_PASSWORD"),
            Some(("db-login".into(), "password".into()))
        );
        assert!(!joined.contains("--password"), "{joined}");
        // The init container installs tidemark from the operator image.
        let init = &spec.init_containers.unwrap()[0];
        assert_eq!(init.image.as_deref(), Some("tidemark:test"));
        assert_eq!(
            init.command.clone().unwrap(),
            vec!["/tidemark", "install", "/tidemark-bin/tidemark"]
        );
        assert_eq!(job.metadata.owner_references.unwrap()[0].kind, "Backup");
    }

    #[test]
    fn a_database_pod_a_restricted_namespace_admits_gives_a_job_it_admits() {
        use crate::testkit::restricted_violations;
        let mut p = pod("db-1", Some("replica"), true);
        let spec = p.spec.as_mut().unwrap();
        spec.security_context = Some(
            serde_json::from_value(json!({"runAsNonRoot": true, "runAsUser": 999,
                "seccompProfile": {"type": "RuntimeDefault"}}))
            .unwrap(),
        );
        spec.containers[0].security_context = Some(
            serde_json::from_value(json!({"allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]}}))
            .unwrap(),
        );
        assert_eq!(restricted_violations(spec), Vec::<String>::new());
        let job = job_of(&p).spec.unwrap().template.spec.unwrap();
        assert_eq!(restricted_violations(&job), Vec::<String>::new());
        // Our own init container meets the level on its own, even in a pod that does not.
        let plain = job_of(&pod("db-1", Some("replica"), true));
        let mut init = plain.spec.unwrap().template.spec.unwrap();
        init.containers.clear();
        init.volumes = None;
        init.security_context = None;
        assert_eq!(restricted_violations(&init), Vec::<String>::new());
        // In a pod that runs as root it does not claim non-root (the kubelet would refuse it).
        let root: k8s_openapi::api::core::v1::PodSecurityContext =
            serde_json::from_value(json!({"runAsUser": 0})).unwrap();
        let none = BackupPolicy::new("p", Default::default());
        let c = pod::install_container("tidemark:test", Some(&root), &none);
        assert_eq!(c.security_context.unwrap().run_as_non_root, None);
    }

    #[test]
    fn a_missing_data_volume_is_named() {
        let p = pod("db-0", None, true);
        let mut s = source();
        s.data_volume = Some("nope".into());
        let e = data_volume(&p, &s).unwrap_err();
        assert!(
            e.contains("\"nope\"") && e.contains("spec.source.dataVolume"),
            "{e}"
        );
        s.data_volume = None;
        s.container = Some("sidecar".into());
        let e = data_volume(&p, &s).unwrap_err();
        assert!(e.contains("no container \"sidecar\""), "{e}");
    }
}
