//! Method `exec`: the Backup's command runs in the database container through
//! `pods/exec`, and the operator streams its stdout into the store itself, through the
//! engine's attempt (in-flight marker first, sha256 on the fly, `metadata.json` last). It
//! needs no Job and no second pod on the node, so it is the method for a ReadWriteOncePod
//! volume and for logical dumps (`mariadb-dump`, `pg_dump`, `tar`).
//!
//! The stream lives in this process. When the process stops or loses the lease, its
//! streams are stopped; the next leader finds the Backup `running` with no stream of its
//! own and fences the attempt: it records it as failed with a conditional create of its
//! `metadata.json`, so an old stream that is somehow still going can no longer commit —
//! and if that stream committed first, the Backup is completed from what it committed.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams, AttachedProcess};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::{Backup, BackupPhase, BackupPolicy, BackupStatus};
use tidemark_api::schedule::BackupType;
use tidemark_engine::redact::shell_words;
use tidemark_engine::{EngineError, Source};
use tidemark_store::transfer::AttemptSpec;
use tidemark_store::{ClusterStore, NoProgress};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::attempt::{blocked, fail, running_status};
use super::source::target_pod;
use crate::context::Context;
use crate::error::Error;
use crate::status::condition;
use crate::streams::{EXEC_PART_SIZE, EXEC_PARTS_IN_FLIGHT};

/// How much of the command's stderr an error message keeps (its end).
const STDERR_TAIL: usize = 2048;
/// How long the exit status may take to arrive once stdout ended.
const STATUS_WAIT: Duration = Duration::from_secs(60);

/// What an exec backup runs, and where.
#[derive(Debug, Clone)]
pub struct ExecPlan {
    pub pod: String,
    pub container: String,
    pub command: Vec<String>,
}

impl ExecPlan {
    /// The command line as messages show it (secrets redacted).
    pub fn describe(&self) -> String {
        format!(
            "`{}` in pod {} (container {}) through pods/exec",
            shell_words(&self.command),
            self.pod,
            self.container
        )
    }
}

/// The attempt an exec backup makes in the store.
pub fn attempt_spec(backup: &Backup, name: &str, id: &str, started_at: Timestamp) -> AttemptSpec {
    AttemptSpec {
        backup_name: name.to_owned(),
        backup_id: id.to_owned(),
        kind: tidemark_store::format::BackupType::Full,
        parent_id: None,
        method: "exec".into(),
        payload_name: "backup.bin".into(),
        started_at,
        labels: crate::names::stored_labels(backup),
        ttl: backup.spec.ttl.as_deref().and_then(|t| t.parse().ok()),
        lock_until: None,
    }
}

/// Starts streaming `plan` into `store` in the background; when it ends, the Backup's
/// status is settled from what the store holds.
pub fn spawn(
    ctx: &Context,
    backup: Arc<Backup>,
    store: ClusterStore,
    spec: AttemptSpec,
    plan: ExecPlan,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let store = store.with_upload_buffer(EXEC_PART_SIZE, EXEC_PARTS_IN_FLIGHT);
    let max_duration = ctx.exec_limits.max_duration;
    let Some(uid) = backup.meta().uid.clone() else {
        return;
    };
    let ns = backup.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let api: Api<Backup> = Api::namespaced(ctx.client.clone(), &ns);
    let metrics = ctx.metrics.clone();
    let recorder = ctx.recorder.clone();
    let handle = tokio::spawn(async move {
        // Held for the stream's life: the next queued Backup starts when it ends.
        let _slot = slot;
        let source = Box::new(ExecSource {
            pods,
            plan,
            attached: None,
            stderr: None,
            said: None,
        });
        let taken = tokio::time::timeout(
            max_duration,
            tidemark_engine::take_backup_from(&store, &spec, source, &NoProgress),
        )
        .await;
        let failure = match &taken {
            Ok(Ok(_)) => None,
            Ok(Err(f)) => Some(tidemark_engine::error::chain(&f.error)),
            Err(_) => {
                // Stopped (its attempt dropped: the marker's heartbeat ends with it), and
                // recorded as failed so the backup-id is settled.
                let message = format!(
                    "the exec stream ran longer than {max_duration:?} (tidemark operator --exec-max-duration) and was stopped"
                );
                if let Err(e) =
                    tidemark_engine::attempt::record_failed(&store, &spec, &message).await
                {
                    tracing::warn!(backup = %backup.name_any(), "recording the stopped exec stream: {}", tidemark_engine::error::chain(&e));
                }
                Some(message)
            }
        };
        if let Some(f) = &failure {
            tracing::warn!(backup = %backup.name_any(), "exec backup failed: {f}");
        }
        // The status is written from the store; if the API refuses for a while, the next
        // reconcile settles it (the attempt is committed either way).
        for pause in [1, 2, 4, 8, 16] {
            let current = match api.get_opt(&backup.name_any()).await {
                Ok(Some(b)) => b,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(backup = %backup.name_any(), "reading the Backup after its exec stream: {e}");
                    tokio::time::sleep(Duration::from_secs(pause)).await;
                    continue;
                }
            };
            let status = current.status.clone().unwrap_or_default();
            match crate::backup::attempt::settle(
                &metrics,
                &recorder,
                &api,
                &current,
                &status,
                &store,
                &spec.backup_name,
                &spec.backup_id,
                failure.clone(),
            )
            .await
            {
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(backup = %backup.name_any(), "recording the exec backup's outcome: {e}");
                    tokio::time::sleep(Duration::from_secs(pause)).await;
                }
            }
        }
    });
    ctx.streams.insert(uid, handle);
}

/// A Backup `running` by `exec` whose stream is not in this process: records the attempt
/// as failed unless it committed, and settles the status from the store.
///
/// # Errors
/// The store or the API failed.
pub async fn fence(
    ctx: &Context,
    api: &Api<Backup>,
    backup: &Backup,
    status: &BackupStatus,
    store: &ClusterStore,
    spec: &AttemptSpec,
) -> Result<kube::runtime::controller::Action, Error> {
    let message = "the operator stopped (restart or leadership change) while it streamed this backup through pods/exec; the attempt was abandoned";
    tidemark_engine::attempt::record_failed(store, spec, message).await?;
    crate::backup::attempt::settle(
        &ctx.metrics,
        &ctx.recorder,
        api,
        backup,
        status,
        store,
        &spec.backup_name,
        &spec.backup_id,
        Some(message.to_owned()),
    )
    .await
}

/// The command's stdout over `pods/exec`; its exit status from the status channel.
struct ExecSource {
    pods: Api<Pod>,
    plan: ExecPlan,
    attached: Option<AttachedProcess>,
    stderr: Option<tokio::task::JoinHandle<String>>,
    said: Option<String>,
}

#[async_trait]
impl Source for ExecSource {
    async fn start(&mut self) -> Result<Box<dyn AsyncRead + Unpin + Send>, EngineError> {
        let params = AttachParams::default()
            .container(self.plan.container.clone())
            .stdin(false)
            .stdout(true)
            .stderr(true)
            .max_stdout_buf_size(1 << 20);
        let mut attached = self
            .pods
            .exec(&self.plan.pod, self.plan.command.clone(), &params)
            .await
            .map_err(|e| EngineError::Source(format!("cannot start {}: {e}", self.describe())))?;
        let stdout = attached
            .stdout()
            .ok_or_else(|| EngineError::Internal("pods/exec gave no stdout stream".to_owned()))?;
        // stderr must be drained or the stream stalls; its end explains a failure.
        if let Some(mut err) = attached.stderr() {
            self.stderr = Some(tokio::spawn(async move {
                let mut tail = Vec::new();
                let mut buf = [0u8; 8192];
                while let Ok(n) = err.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    tail.extend_from_slice(&buf[..n]);
                    if tail.len() > 2 * STDERR_TAIL {
                        tail.drain(..tail.len() - STDERR_TAIL);
                    }
                }
                let start = tail.len().saturating_sub(STDERR_TAIL);
                String::from_utf8_lossy(&tail[start..]).trim().to_owned()
            }));
        }
        self.attached = Some(attached);
        Ok(Box::new(stdout))
    }

    async fn finish(&mut self, stop: bool) -> Result<Result<(), String>, EngineError> {
        let Some(mut attached) = self.attached.take() else {
            return Ok(Ok(()));
        };
        if stop {
            attached.abort();
            return Ok(Err("was stopped".into()));
        }
        let status = match attached.take_status() {
            Some(s) => tokio::time::timeout(STATUS_WAIT, s).await.ok().flatten(),
            None => None,
        };
        let stderr = match self.stderr.take() {
            Some(h) => tokio::time::timeout(Duration::from_secs(5), h)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default(),
            None => String::new(),
        };
        let _ = attached.join().await;
        if !stderr.is_empty() {
            // The command's own words may quote its options: redacted as a command line is.
            let shown = tidemark_engine::redact::redact(std::slice::from_ref(&stderr)).remove(0);
            self.said = Some(format!("its stderr ends with: {shown}"));
        }
        Ok(match status {
            Some(s) if s.status.as_deref() == Some("Success") => Ok(()),
            Some(s) => Err(exit_of(&s)),
            None => Err("ended without an exit status (the exec stream was cut)".into()),
        })
    }

    fn said(&self) -> Option<String> {
        self.said.clone()
    }

    fn describe(&self) -> String {
        self.plan.describe()
    }
}

/// "exited with status N" from a `pods/exec` failure status, or its message.
fn exit_of(s: &Status) -> String {
    let code = s
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
        .and_then(|c| c.message.clone());
    match (code, s.message.as_deref()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(m)) if !m.is_empty() => format!("failed: {m}"),
        _ => "failed".into(),
    }
}

/// Method `exec` (this module): the command runs in the database container and
/// this process streams its stdout into the store.
#[allow(clippy::too_many_arguments)]
pub async fn advance(
    ctx: &Arc<Context>,
    api: &Api<Backup>,
    backup: Arc<Backup>,
    status: &BackupStatus,
    policy: &BackupPolicy,
    store: ClusterStore,
) -> Result<Action, Error> {
    let backup_name = &crate::names::store_name(&backup);
    let backup_id = &crate::names::backup_id(&backup);
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
        let spec = attempt_spec(&backup, backup_name, backup_id, started);
        return fence(ctx, api, &backup, status, &store, &spec).await;
    }
    let command = backup.spec.template.command.clone();
    if command.is_empty() {
        let message = "method exec needs spec.command: the command whose stdout is the backup, run in the database container (e.g. [mariadb-dump, --all-databases, --single-transaction])";
        fail(&ctx.metrics, &ctx.recorder, api, &backup, status, message).await?;
        return Ok(Action::await_change());
    }
    if backup.spec.kind == BackupType::Incremental {
        let message =
            "type incremental needs method mariabackup or xtrabackup; exec takes whole backups";
        fail(&ctx.metrics, &ctx.recorder, api, &backup, status, message).await?;
        return Ok(Action::await_change());
    }
    let (pod, source, note) = match target_pod(ctx, api, &backup, policy).await? {
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
    let plan = ExecPlan {
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
            crate::status::backup(api, &backup, &queued).await?;
        }
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    // The Backup's own compression overrides the policy's (refused above when invalid),
    // within what a stream compressed in this process may cost.
    let asked = match backup.spec.template.compression() {
        Ok(Some(c)) => c,
        _ => store.compression(),
    };
    let (store, lowered) = match asked.bounded(crate::streams::EXEC_MAX_ZSTD_LEVEL) {
        Some(within) => (
            store.with_compression(within),
            // Said when the level changed (the threads are not the user's to see).
            (within.to_string() != asked.to_string()).then(|| {
                format!(
                    "compression {asked} lowered to {within}: streams the operator compresses are bounded",
                )
            }),
        ),
        None => (store.with_compression(asked), None),
    };
    let started = ctx.clock.now();
    let mut spec = attempt_spec(&backup, backup_name, backup_id, started);
    spec.lock_until = super::lock::lock_until(ctx, &backup, policy, true, started).await?;
    let running = running_status(
        &backup,
        status,
        None,
        &store,
        backup_name,
        backup_id,
        started,
        &format!(
            "streams {}{}",
            plan.describe(),
            match [note, lowered].into_iter().flatten().collect::<Vec<_>>() {
                notes if notes.is_empty() => String::new(),
                notes => format!(" ({})", notes.join("; ")),
            }
        ),
    );
    // Running first: a crash after it is fenced by the next reconcile (no stream of ours),
    // never a second attempt under the same backup-id.
    crate::status::backup(api, &backup, &running).await?;
    tracing::info!(backup = %backup.name_any(), "exec backup started: {}", plan.describe());
    spawn(ctx, backup, store, spec, plan, slot);
    Ok(Action::requeue(Duration::from_secs(30)))
}
