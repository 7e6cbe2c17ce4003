//! The backup attempt: claim the backup-id (the in-flight marker, written before the first
//! byte), stream the source into the store, commit `metadata.json` — or record the attempt
//! as failed. Where the source runs is a [`BackupRunner`]: a local process here, a
//! Kubernetes Job in the operator (whose container runs this same attempt through
//! `tidemark push`).

use std::process::Stdio;

use async_trait::async_trait;
use tidemark_mariadb::backup as mariadb;
use tidemark_store::format::{LogPosition, Metadata, PayloadObject};
use tidemark_store::transfer::{self, Attempt, BackupSpec, Outcome, TransferError};
use tidemark_store::{ClusterStore, Progress};
use tokio::io::AsyncRead;

use crate::error::{EngineError, chain};
use crate::redact::shell_words;

/// One backup to take.
#[derive(Debug, Clone)]
pub struct BackupRequest {
    pub spec: BackupSpec,
    /// The command whose stdout is the backup; with method `mariabackup`, the program and
    /// its connection options (default `mariabackup`). Empty, for another method: stdin.
    pub command: Vec<String>,
    /// The parent's `metadata.json` (an incremental).
    pub parent: Option<Metadata>,
    /// Run the command in its own process group, so that a Ctrl-C meant for tidemark does
    /// not kill a backup that is given a grace period.
    pub detach: bool,
}

/// An attempt that did not complete: the error, and the failed record if one was written.
#[derive(Debug)]
pub struct AttemptFailure {
    pub recorded: Option<Metadata>,
    pub error: EngineError,
}

impl From<EngineError> for AttemptFailure {
    fn from(error: EngineError) -> Self {
        AttemptFailure {
            recorded: None,
            error,
        }
    }
}

/// Where a backup runs.
#[async_trait]
pub trait BackupRunner: Send + Sync {
    /// Takes the backup `request` asks for into `store`.
    ///
    /// # Errors
    /// The attempt failed (and is recorded as failed when the record could be written).
    async fn run(
        &self,
        store: &ClusterStore,
        request: &BackupRequest,
        progress: &dyn Progress,
    ) -> Result<Metadata, AttemptFailure>;
}

/// Runs the backup command as a local process and streams its stdout.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalProcess;

#[async_trait]
impl BackupRunner for LocalProcess {
    async fn run(
        &self,
        store: &ClusterStore,
        request: &BackupRequest,
        progress: &dyn Progress,
    ) -> Result<Metadata, AttemptFailure> {
        take_backup(store, request, progress).await
    }
}

/// Takes one backup on this machine: the attempt lifecycle around a local command (or
/// stdin).
///
/// # Errors
/// Bad input (a mariabackup parent without LSNs, a taken backup-id) before anything is
/// recorded; a failed source or upload, recorded as a failed attempt.
#[tracing::instrument(skip_all, fields(cluster = %store.cluster, backup = %format!("{}/{}", request.spec.backup_name, request.spec.backup_id)))]
pub async fn take_backup(
    store: &ClusterStore,
    request: &BackupRequest,
    progress: &dyn Progress,
) -> Result<Metadata, AttemptFailure> {
    let spec = &request.spec;
    // A parent without LSNs is bad input: refused before anything is recorded.
    let mariabackup = if spec.method == mariadb::METHOD {
        Some(MariabackupRun::new(
            &request.command,
            request.parent.as_ref(),
        )?)
    } else {
        None
    };
    let command = match &mariabackup {
        Some(run) => run.command.clone(),
        None => request.command.clone(),
    };
    let attempt = Attempt::begin(store, spec)
        .await
        .map_err(EngineError::from)?;
    let streamed = stream_source(&attempt, &command, request.detach, progress).await;
    // What mariabackup recorded beside the stream; without it the backup is unusable as a
    // parent, so its absence fails the attempt.
    let result = match (streamed, &mariabackup) {
        (Ok(payload), Some(run)) => match run.recorded() {
            Ok((extra, position)) => Ok((payload, extra, position)),
            Err(e) => {
                transfer::remove_payload(store, spec, &payload.name).await;
                Err(EngineError::Source(chain(&e)))
            }
        },
        (Ok(payload), None) => Ok((payload, serde_json::Map::new(), None)),
        (Err(e), _) => Err(e),
    };
    let (outcome, failure) = match result {
        Ok((payload, extra, log_position)) => (
            Outcome {
                payload: vec![payload],
                log_position,
                extra,
                ..Default::default()
            },
            None,
        ),
        Err(e) => (
            Outcome {
                error: Some(chain(&e)),
                ..Default::default()
            },
            Some(e),
        ),
    };
    match (attempt.finish(outcome).await, failure) {
        (Ok(m), None) => Ok(m),
        (Ok(m), Some(error)) => Err(AttemptFailure {
            recorded: Some(m),
            error,
        }),
        (Err(u), None) => Err(AttemptFailure {
            recorded: u.recorded,
            error: u.error.into(),
        }),
        (Err(u), Some(error)) => {
            tracing::error!(error = %chain(&u.error), "could not record the failed attempt either");
            Err(error.into())
        }
    }
}

/// Streams stdin, or the stdout of `command`, into the attempt; a command that exits
/// non-zero fails it (and its bytes are removed).
async fn stream_source(
    attempt: &Attempt,
    command: &[String],
    detach: bool,
    progress: &dyn Progress,
) -> Result<PayloadObject, EngineError> {
    let Some((program, rest)) = command.split_first() else {
        let mut stdin = tokio::io::stdin();
        return Ok(attempt.upload(&mut stdin, progress).await?);
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if detach {
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().map_err(|e| {
        let shown = crate::redact::redact(&command[..1]);
        EngineError::Source(format!("cannot run {:?}: {e}", shown[0]))
    })?;
    let Some(stdout) = child.stdout.take() else {
        return Err(EngineError::Internal(format!(
            "no stdout pipe from {}",
            shell_words(&command[..1])
        )));
    };
    let mut source: Box<dyn AsyncRead + Unpin + Send> = Box::new(stdout);
    let uploaded = attempt.upload(&mut source, progress).await;
    drop(source);
    let status = match &uploaded {
        // The stream ended (maybe empty): the command's verdict decides.
        Ok(_) | Err(TransferError::EmptyStream) => child.wait().await,
        // The upload failed first: stop the command.
        Err(_) => {
            let _ = child.start_kill();
            child.wait().await
        }
    }
    .map_err(|e| EngineError::Internal(format!("waiting for the backup command: {e}")))?;
    match uploaded {
        // A command that failed without output failed: say that, not "empty".
        Err(TransferError::EmptyStream) if !status.success() => Err(EngineError::Source(format!(
            "{} {} without output",
            shell_words(command),
            describe_exit(status)
        ))),
        Err(e) => Err(e.into()),
        Ok(payload) if status.success() => Ok(payload),
        Ok(payload) => {
            // The bytes are of a failed run: remove them now rather than after the TTL.
            transfer::remove_payload(attempt.store(), attempt.spec(), &payload.name).await;
            Err(EngineError::Source(format!(
                "{} {} after writing {} bytes",
                shell_words(command),
                describe_exit(status),
                payload.size
            )))
        }
    }
}

/// A `mariabackup` attempt: the command line Tidemark completes, and the directory where
/// mariabackup leaves its LSNs and binlog position.
struct MariabackupRun {
    command: Vec<String>,
    lsndir: tempfile::TempDir,
}

impl MariabackupRun {
    fn new(user_command: &[String], parent: Option<&Metadata>) -> Result<Self, EngineError> {
        let incremental_lsn = parent
            .map(|p| mariadb::lsns_of(p).map(|l| l.to_lsn))
            .transpose()?;
        let lsndir = tempfile::Builder::new()
            .prefix("tidemark-lsn-")
            .tempdir()
            .map_err(|e| EngineError::Internal(format!("creating a scratch directory: {e}")))?;
        let mut command = if user_command.is_empty() {
            vec![mariadb::METHOD.to_owned()]
        } else {
            user_command.to_vec()
        };
        command.extend(mariadb::backup_args(lsndir.path(), incremental_lsn));
        Ok(MariabackupRun { command, lsndir })
    }

    /// The `metadata.json` fields of a finished run.
    fn recorded(
        &self,
    ) -> Result<
        (
            serde_json::Map<String, serde_json::Value>,
            Option<LogPosition>,
        ),
        mariadb::MariaDbError,
    > {
        let (lsns, position) = mariadb::read_lsndir(self.lsndir.path())?;
        let mut extra = serde_json::Map::new();
        let (k, v) = mariadb::lsns_field(&lsns);
        extra.insert(k, v);
        Ok((extra, position))
    }
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        (None, None) => format!("ended with {status}"),
    }
}

/// Records an attempt that will not finish (its runner died or was stopped) as failed,
/// and removes its marker. One already committed stays as it is.
///
/// # Errors
/// The record could not be written.
pub async fn record_failed(
    store: &ClusterStore,
    spec: &BackupSpec,
    error: &str,
) -> Result<Option<Metadata>, EngineError> {
    let recorded = match transfer::commit(
        store,
        spec,
        Outcome {
            error: Some(error.to_owned()),
            ..Default::default()
        },
    )
    .await
    {
        Ok(m) => Some(m),
        Err(tidemark_store::transfer::TransferError::AlreadyCommitted { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    transfer::release_marker(store, spec).await;
    Ok(recorded)
}
