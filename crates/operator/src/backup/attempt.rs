//! One attempt of a Backup, recorded in its status: started, running in its Job, settled
//! by what the store holds (completed or failed), or blocked with the reason.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tidemark_api::crd::{Backup, BackupPhase, BackupStatus};
use tidemark_store::format::{Metadata, MetadataPhase};
use tidemark_store::{ClusterStore, layout};

use crate::context::Context;
use crate::error::Error;
use crate::events::Recorder;
use crate::pod;
use crate::status::condition;

/// Records the attempt as running, then creates its Job (status first: a crash after it
/// finds the Job by its recorded name).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn start(
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
pub(crate) async fn mark_running(
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
    crate::status::backup(api, backup, &running).await
}

/// The status of an attempt that started at `started_at`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn running_status(
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

/// Follows a Job: done when it succeeded or failed, then the store says what happened.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn follow(
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
    let succeeded = finished("Complete") || js.succeeded.unwrap_or(0) > 0;
    let failed = finished("Failed") || js.failed.unwrap_or(0) > 0;
    // Kept, for when the Job is gone (`kubectl tidemark logs backup NAME`).
    let mut status = status.clone();
    if succeeded || failed {
        status.log_tail = pod::job_log_tail(&api.clone().into_client(), job).await;
    }
    let status = &status;
    if succeeded {
        return settle(
            metrics, recorder, api, backup, status, store, name, id, None,
        )
        .await;
    }
    if failed {
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
    // Decided from the cache, which may not hold the status an earlier settle wrote yet:
    // an attempt that already ended is neither written nor counted again.
    if already_ended(api, backup).await? {
        return Ok(Action::await_change());
    }
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
            crate::status::backup(api, backup, &done).await?;
            let labels = crate::metrics::Metrics::policy(
                &backup.namespace().unwrap_or_default(),
                &backup.spec.template.policy.name,
            );
            metrics.backup_ended(&labels, true);
            if let Some(at) = m.completed_at {
                metrics.backup_completed(&labels, Some(m.started_at), at, done.size);
                metrics.backup_took(&labels, at.duration_since(m.started_at).as_secs_f64());
            }
            tracing::info!(backup = %backup.name_any(), id, "backup completed");
            // A Normal event, as `kubectl describe` and event pipelines expect of an end.
            let note = format!(
                "{} backup {id} committed in the store ({} bytes){}",
                done.kind.as_deref().unwrap_or("a"),
                done.size.unwrap_or_default(),
                done.parent_id
                    .as_deref()
                    .map(|p| format!(", on {p}"))
                    .unwrap_or_default()
            );
            let event = Event {
                type_: EventType::Normal,
                reason: "BackupCompleted".into(),
                note: Some(note),
                action: "Backup".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, &backup.object_ref(&())).await {
                tracing::warn!(backup = %backup.name_any(), "could not publish event: {e}");
            }
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
            fail(metrics, recorder, api, backup, status, &message).await?;
        }
    }
    Ok(Action::await_change())
}

pub(crate) async fn fail(
    metrics: &crate::metrics::Metrics,
    recorder: &Recorder,
    api: &Api<Backup>,
    backup: &Backup,
    status: &BackupStatus,
    message: &str,
) -> Result<(), Error> {
    // As in `settle`: an attempt that ended meanwhile keeps its outcome, counted once.
    if already_ended(api, backup).await? {
        return Ok(());
    }
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
    crate::status::backup(api, backup, &failed).await?;
    let labels = crate::metrics::Metrics::policy(
        &backup.namespace().unwrap_or_default(),
        &backup.spec.template.policy.name,
    );
    metrics.backup_ended(&labels, false);
    metrics.backup_failed(&labels, Timestamp::now());
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

/// Whether the API server's copy of `backup` (not the cache's) has ended, completed or
/// failed.
async fn already_ended(api: &Api<Backup>, backup: &Backup) -> Result<bool, Error> {
    Ok(api
        .get_opt(&backup.name_any())
        .await?
        .and_then(|b| b.status)
        .and_then(|s| s.phase)
        .is_some_and(BackupPhase::is_done))
}

/// Whether `blocked` gave up (it then waits for a change instead of a minute).
pub(crate) fn backup_failed(a: &Action) -> bool {
    *a == Action::await_change()
}

/// How long a Backup may stay blocked before it is recorded as failed: a pending Backup
/// holds its schedule's concurrency guard, so it must not stay pending for ever.
pub const PENDING_LIMIT: jiff::SignedDuration = jiff::SignedDuration::from_hours(1);

/// Records why nothing started yet (phase stays `pending`), and asks to look again in a
/// minute (a fixed policy or a pod coming up is noticed then); after [`PENDING_LIMIT`] the
/// Backup is failed with the same reason instead.
pub(crate) async fn blocked(
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
            &ctx.metrics,
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
    crate::status::backup(api, backup, &status).await?;
    Ok(Action::requeue(Duration::from_secs(60)))
}
