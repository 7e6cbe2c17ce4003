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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams, AttachedProcess};
use kube::{Resource, ResourceExt};
use tidemark_api::crd::{Backup, BackupStatus};
use tidemark_engine::redact::shell_words;
use tidemark_engine::{EngineError, Source};
use tidemark_store::transfer::BackupSpec;
use tidemark_store::{ClusterStore, NoProgress};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The label every exec backup records in its `metadata.json`, like a Job's.
pub(crate) const BACKUP_LABEL: &str = "tidemark.io/backup";
/// How much of the command's stderr an error message keeps (its end).
const STDERR_TAIL: usize = 2048;
/// How long the exit status may take to arrive once stdout ended.
const STATUS_WAIT: Duration = Duration::from_secs(60);

/// Bytes per multipart part of an exec stream's upload, and parts in flight: one stream
/// holds at most `EXEC_PART_SIZE * (EXEC_PARTS_IN_FLIGHT + 1)` = 24 MiB of its payload.
pub const EXEC_PART_SIZE: usize = 8 << 20;
pub const EXEC_PARTS_IN_FLIGHT: usize = 2;
/// Exec streams at once by default (more wait, `Queued`).
pub const DEFAULT_STREAMS: usize = 4;
/// How long one exec stream may run by default, as a backup Job.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// How many exec streams run at once, and for how long each may run.
#[derive(Debug, Clone)]
pub struct Limits {
    pub streams: usize,
    pub max_duration: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            streams: DEFAULT_STREAMS,
            max_duration: DEFAULT_MAX_DURATION,
        }
    }
}

/// The exec streams this process runs, by Backup uid; stopped when dropped (the
/// controllers stopped: shutdown or a lost lease).
#[derive(Debug, Default)]
pub struct Streams {
    running: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
}

impl Streams {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::task::JoinHandle<()>>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this process streams the Backup `uid` now.
    pub fn running(&self, uid: &str) -> bool {
        self.lock().get(uid).is_some_and(|h| !h.is_finished())
    }

    /// How many streams run now.
    pub fn len(&self) -> usize {
        self.lock().values().filter(|h| !h.is_finished()).count()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps `handle` as the stream of `uid`, unless one runs already (then `handle` is
    /// stopped: never two streams for one Backup).
    fn insert(&self, uid: String, handle: tokio::task::JoinHandle<()>) {
        let mut running = self.lock();
        running.retain(|_, h| !h.is_finished());
        if running.contains_key(&uid) {
            handle.abort();
            return;
        }
        running.insert(uid, handle);
    }

    /// Stops every stream (their attempts are fenced by the next leader).
    pub fn stop_all(&self) {
        for (_, h) in self.lock().drain() {
            h.abort();
        }
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        self.stop_all();
    }
}

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
pub fn attempt_spec(backup: &Backup, name: &str, id: &str, started_at: Timestamp) -> BackupSpec {
    BackupSpec {
        backup_name: name.to_owned(),
        backup_id: id.to_owned(),
        kind: tidemark_store::format::BackupType::Full,
        parent_id: None,
        method: "exec".into(),
        payload_name: "backup.bin".into(),
        started_at,
        labels: crate::backup::stored_labels(backup),
        ttl: backup.spec.ttl.as_deref().and_then(|t| t.parse().ok()),
    }
}

/// Starts streaming `plan` into `store` in the background; when it ends, the Backup's
/// status is settled from what the store holds.
pub fn spawn(
    ctx: &crate::Context,
    backup: Arc<Backup>,
    store: ClusterStore,
    spec: BackupSpec,
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
            match crate::backup::settle(
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
    ctx: &crate::Context,
    api: &Api<Backup>,
    backup: &Backup,
    status: &BackupStatus,
    store: &ClusterStore,
    spec: &BackupSpec,
) -> Result<kube::runtime::controller::Action, crate::Error> {
    let message = "the operator stopped (restart or leadership change) while it streamed this backup through pods/exec; the attempt was abandoned";
    tidemark_engine::attempt::record_failed(store, spec, message).await?;
    crate::backup::settle(
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
