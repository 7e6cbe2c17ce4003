//! `tidemark push` and `tidemark fetch`: backup bytes in and out of the store.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use jiff::Timestamp;
use object_store::ObjectStoreExt;
use serde::Serialize;
use tidemark_core::RetentionDuration;
use tidemark_store::format::{BackupType, Metadata, MetadataPhase};
use tidemark_store::mariadb;
use tidemark_store::transfer::{
    self, BackupSpec, Outcome, TransferError, new_backup_id, valid_backup_name,
};
use tidemark_store::{ClusterStore, NoProgress, Progress};
use tokio::io::AsyncRead;

use crate::args::{BackupKindArg, FetchArgs, OutputFormat, PushArgs};
use crate::exit::{CliError, Exit};
use crate::progress::TerminalProgress;
use crate::resolve;

/// What `push --output json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PushOut {
    pub backup_id: String,
    pub backup_name: String,
    pub cluster: String,
    pub phase: MetadataPhase,
    /// The payload's key relative to the store URL.
    pub key: Option<String>,
    pub size: u64,
    pub sha256: Option<String>,
    pub started_at: Timestamp,
    pub completed_at: Option<Timestamp>,
    pub error: Option<String>,
}

impl PushOut {
    fn from_metadata(store: &ClusterStore, m: &Metadata) -> Self {
        let p = m.payload.first();
        PushOut {
            backup_id: m.backup_id.clone(),
            backup_name: m.backup_name.clone(),
            cluster: m.cluster.clone(),
            phase: m.phase,
            key: p.map(|p| {
                format!(
                    "{}/{}/{}/{}",
                    store.cluster, m.backup_name, m.backup_id, p.name
                )
            }),
            size: p.map_or(0, |p| p.size),
            sha256: p.map(|p| p.sha256.clone()),
            started_at: m.started_at,
            completed_at: m.completed_at,
            error: m.error.clone(),
        }
    }
}

fn transfer_error(e: TransferError) -> CliError {
    let exit = match &e {
        TransferError::InvalidName(_)
        | TransferError::InvalidId(_)
        | TransferError::AlreadyCommitted { .. }
        | TransferError::NotFound { .. } => Exit::Input,
        TransferError::Source { .. } => Exit::SourceFailed,
        TransferError::Failed { .. }
        | TransferError::MissingPayload { .. }
        | TransferError::MissingSegment { .. }
        | TransferError::Checksum { .. }
        | TransferError::Metadata { .. } => Exit::Data,
        TransferError::Sink(_) => Exit::Internal,
        TransferError::Store(_) => Exit::Store,
    };
    match e {
        TransferError::Store(s) => CliError::from(s),
        other => CliError::new(exit, other),
    }
}

/// Parses the push flags into a backup spec.
fn spec(args: &PushArgs, started_at: Timestamp) -> Result<BackupSpec, CliError> {
    if !valid_backup_name(&args.backup_name) {
        return Err(transfer_error(TransferError::InvalidName(
            args.backup_name.clone(),
        )));
    }
    let backup_id = match &args.backup_id {
        Some(id) if tidemark_core::inventory::is_backup_id(id) => id.clone(),
        Some(id) => return Err(transfer_error(TransferError::InvalidId(id.clone()))),
        None => new_backup_id(started_at),
    };
    let kind = match (args.kind, &args.parent) {
        (BackupKindArg::Full, None) => BackupType::Full,
        (BackupKindArg::Full, Some(p)) => {
            return Err(CliError::input(format!(
                "--parent {p} given for a full backup; use --type incremental --parent ID"
            )));
        }
        (BackupKindArg::Incremental, Some(_)) => BackupType::Incremental,
        (BackupKindArg::Incremental, None) => {
            return Err(CliError::input(
                "--type incremental needs --parent ID, the backup-id it builds on",
            ));
        }
    };
    let mariabackup = args.method.as_deref() == Some(mariadb::METHOD);
    let ext = args
        .ext
        .as_deref()
        .unwrap_or(if mariabackup { mariadb::EXT } else { "bin" });
    if ext.is_empty()
        || !ext
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
        || ext.starts_with('.')
    {
        return Err(CliError::input(format!(
            "invalid --ext {ext:?}: expected letters, digits, '.', '-' or '_', e.g. xbstream or tar.gz"
        )));
    }
    let mut labels = BTreeMap::new();
    for l in &args.label {
        let Some((k, v)) = l.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            return Err(CliError::input(format!(
                "invalid --label {l:?}: expected KEY=VALUE, e.g. team=payments"
            )));
        };
        labels.insert(k.to_owned(), v.to_owned());
    }
    let ttl = args
        .ttl
        .as_deref()
        .map(|t| {
            t.parse::<RetentionDuration>()
                .map_err(|e| CliError::input(format!("--ttl: {e}")))
        })
        .transpose()?;
    let method = args.method.clone().unwrap_or_else(|| {
        if args.command.is_empty() {
            "stdin".into()
        } else {
            "exec".into()
        }
    });
    Ok(BackupSpec {
        backup_name: args.backup_name.clone(),
        backup_id,
        kind,
        parent_id: args.parent.clone(),
        method,
        payload_name: format!("backup.{ext}"),
        started_at,
        labels,
        ttl,
    })
}

pub async fn push(args: &PushArgs) -> Result<Exit, CliError> {
    let started_at = Timestamp::now();
    let spec = spec(args, started_at)?;
    let target = resolve::store_target(&args.store, args.policy.as_deref())?;
    let store = &target.store;
    let mut parent_meta = None;
    if let Some(parent) = &spec.parent_id {
        let p = transfer::find_backup(store, None, parent)
            .await
            .map_err(|e| match e {
                TransferError::NotFound { .. } => CliError::input(format!(
                    "--parent {parent}: no committed backup with this id in {} (cluster {})",
                    store.url, store.cluster
                )),
                other => transfer_error(other),
            })?;
        if p.phase != MetadataPhase::Completed {
            return Err(CliError::input(format!(
                "--parent {parent} is a failed backup; an incremental needs a completed parent"
            )));
        }
        parent_meta = Some(p);
    }
    let json = args.output == OutputFormat::Json;
    let bar = TerminalProgress::for_bytes(json, "uploading");
    let progress: &dyn Progress = match &bar {
        Some(b) => b,
        None => &NoProgress,
    };
    // In the terminal's process group: Ctrl-C stops the command with tidemark.
    let taken = take_backup(
        store,
        &spec,
        &args.command,
        parent_meta.as_ref(),
        Detach::No,
        progress,
    )
    .await;
    if let Some(b) = &bar {
        b.finish();
    }
    match taken {
        Ok(m) => {
            report(store, &m, json)?;
            Ok(Exit::Success)
        }
        Err(Failed { recorded, error }) => {
            if let Some(m) = recorded {
                report(store, &m, json)?;
                eprintln!(
                    "recorded {}/{} as failed; failedBackupsTTL collects it",
                    spec.backup_name, spec.backup_id
                );
            }
            Err(error)
        }
    }
}

/// Whether the backup command runs in its own process group: `run` detaches it so that a
/// Ctrl-C meant for tidemark does not kill a backup that is given a grace period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detach {
    No,
    Yes,
}

/// A backup attempt that did not complete: the error, and the failed record if it could
/// be written.
#[derive(Debug)]
pub(crate) struct Failed {
    pub recorded: Option<Metadata>,
    pub error: CliError,
}

/// Takes one backup: streams the command's stdout (stdin without one; with `mariabackup`
/// the completed mariabackup command line) into the store and commits it, or records the
/// attempt as failed. Shared by `push` and `run`.
pub(crate) async fn take_backup(
    store: &ClusterStore,
    spec: &BackupSpec,
    user_command: &[String],
    parent: Option<&Metadata>,
    detach: Detach,
    progress: &dyn Progress,
) -> Result<Metadata, Failed> {
    // A parent without LSNs is bad input: refused before anything is recorded.
    let mariabackup = if spec.method == mariadb::METHOD {
        Some(
            MariabackupRun::new(user_command, parent).map_err(|error| Failed {
                recorded: None,
                error,
            })?,
        )
    } else {
        None
    };
    let command = match &mariabackup {
        Some(run) => run.command.clone(),
        None => user_command.to_vec(),
    };
    let streamed = stream_source(store, spec, &command, detach, progress).await;
    // What mariabackup recorded beside the stream; without it the backup is unusable as a
    // parent, so its absence fails the attempt.
    let result = match (streamed, &mariabackup) {
        (Ok(payload), Some(run)) => match run.recorded() {
            Ok((extra, position)) => Ok((payload, extra, position)),
            Err(e) => {
                remove_payload(store, spec, &payload.name).await;
                Err(CliError::new(Exit::SourceFailed, e))
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
        Err(e) => {
            let text = crate::exit::render(&e.error);
            let text = text.trim_start_matches("error: ").to_owned();
            (
                Outcome {
                    error: Some(text),
                    ..Default::default()
                },
                Some(e),
            )
        }
    };
    let committed = transfer::commit(store, spec, outcome).await;
    match (committed, failure) {
        (Ok(m), None) => Ok(m),
        (Ok(m), Some(error)) => Err(Failed {
            recorded: Some(m),
            error,
        }),
        (Err(commit_err), None) => Err(Failed {
            recorded: None,
            error: commit_err.into(),
        }),
        (Err(commit_err), Some(error)) => {
            eprintln!(
                "error: could not record the failed attempt either: {}",
                crate::exit::render(&anyhow::Error::new(commit_err))
            );
            Err(Failed {
                recorded: None,
                error,
            })
        }
    }
}

fn report(store: &ClusterStore, m: &Metadata, json: bool) -> Result<(), CliError> {
    if json {
        crate::commands::emit_json(&PushOut::from_metadata(store, m))
    } else {
        if m.phase == MetadataPhase::Completed {
            let p = m.payload.first();
            eprintln!(
                "committed {}/{}/{}: {} bytes, sha256 {}",
                store.cluster,
                m.backup_name,
                m.backup_id,
                p.map_or(0, |p| p.size),
                p.map_or("-", |p| p.sha256.as_str())
            );
        }
        crate::commands::emit(&format!("{}\n", m.backup_id))
    }
}

/// Uploads stdin, or the stdout of `command`; a command that exits non-zero fails the
/// push (and its upload is aborted).
async fn stream_source(
    store: &ClusterStore,
    spec: &BackupSpec,
    command: &[String],
    detach: Detach,
    progress: &dyn Progress,
) -> Result<tidemark_store::format::PayloadObject, CliError> {
    let Some((program, rest)) = command.split_first() else {
        let mut stdin = tokio::io::stdin();
        return transfer::upload(store, spec, &mut stdin, progress)
            .await
            .map_err(transfer_error);
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if detach == Detach::Yes {
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().map_err(|e| {
        CliError::new(
            Exit::SourceFailed,
            anyhow::anyhow!("cannot run {program:?}: {e}"),
        )
    })?;
    let Some(stdout) = child.stdout.take() else {
        return Err(CliError::new(
            Exit::Internal,
            anyhow::anyhow!("no stdout pipe from {program:?}"),
        ));
    };
    let mut source: Box<dyn AsyncRead + Unpin + Send> = Box::new(stdout);
    let uploaded = transfer::upload(store, spec, &mut source, progress).await;
    drop(source);
    let status = match &uploaded {
        // The stream ended: the command's verdict decides.
        Ok(_) => child.wait().await,
        // The upload failed first: stop the command.
        Err(_) => {
            let _ = child.start_kill();
            child.wait().await
        }
    }
    .map_err(|e| CliError::new(Exit::Internal, e))?;
    match uploaded {
        Err(e) => Err(transfer_error(e)),
        Ok(payload) if status.success() => Ok(payload),
        Ok(payload) => {
            // The bytes are of a failed run: remove them now rather than after the TTL.
            remove_payload(store, spec, &payload.name).await;
            Err(CliError::new(
                Exit::SourceFailed,
                anyhow::anyhow!(
                    "{} {} after writing {} bytes",
                    shell_words(command),
                    describe_exit(status),
                    payload.size
                ),
            ))
        }
    }
}

/// Removes the payload of a failed attempt now rather than after `failedBackupsTTL`
/// (best effort: the TTL collects it if this fails).
async fn remove_payload(store: &ClusterStore, spec: &BackupSpec, name: &str) {
    let key = object_store::path::Path::from_iter([
        spec.backup_name.as_str(),
        spec.backup_id.as_str(),
        name,
    ]);
    let _ = store.object_store().delete(&key).await;
}

/// A `push --method mariabackup`: the command line Tidemark completes, and the directory
/// where mariabackup leaves its LSNs and binlog position.
struct MariabackupRun {
    command: Vec<String>,
    lsndir: tempfile::TempDir,
}

impl MariabackupRun {
    fn new(user_command: &[String], parent: Option<&Metadata>) -> Result<Self, CliError> {
        let incremental_lsn = parent
            .map(|p| mariadb::lsns_of(p).map(|l| l.to_lsn))
            .transpose()
            .map_err(|e| CliError::input(format!("--parent: {e}")))?;
        let lsndir = tempfile::Builder::new()
            .prefix("tidemark-lsn-")
            .tempdir()
            .map_err(|e| CliError::new(Exit::Internal, e))?;
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
            Option<tidemark_store::format::LogPosition>,
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

fn shell_words(command: &[String]) -> String {
    command
        .iter()
        .map(|w| {
            if w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub async fn fetch(args: &FetchArgs) -> Result<Exit, CliError> {
    if !tidemark_core::inventory::is_backup_id(&args.backup_id) {
        return Err(transfer_error(TransferError::InvalidId(
            args.backup_id.clone(),
        )));
    }
    let target = resolve::store_target(&args.store, args.policy.as_deref())?;
    let store = &target.store;
    let m = transfer::find_backup(store, args.backup_name.as_deref(), &args.backup_id)
        .await
        .map_err(transfer_error)?;
    let bar = TerminalProgress::for_bytes(args.out.is_none(), "downloading");
    let progress: &dyn Progress = match &bar {
        Some(b) => b,
        None => &NoProgress,
    };
    let result = match &args.out {
        None => {
            let mut out = tokio::io::stdout();
            transfer::download(store, &m, &mut out, progress)
                .await
                .map(|_| ())
        }
        Some(path) => fetch_to_file(store, &m, path, progress).await,
    };
    if let Some(b) = &bar {
        b.finish();
    }
    result.map_err(transfer_error)?;
    Ok(Exit::Success)
}

/// Downloads into a temporary file beside `path` and renames it into place only when the
/// checksum matches: a failed fetch leaves no file.
async fn fetch_to_file(
    store: &ClusterStore,
    m: &Metadata,
    path: &Path,
    progress: &dyn Progress,
) -> Result<(), TransferError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".tidemark-fetch-")
        .tempfile_in(&dir)
        .map_err(TransferError::Sink)?;
    let std_file = tmp.reopen().map_err(TransferError::Sink)?;
    let mut file = tokio::fs::File::from_std(std_file);
    transfer::download(store, m, &mut file, progress).await?;
    file.sync_all().await.map_err(TransferError::Sink)?;
    tmp.persist(path)
        .map_err(|e| TransferError::Sink(e.error))?;
    Ok(())
}

fn archive_error(e: tidemark_store::archive::ArchiveError) -> CliError {
    use tidemark_store::archive::ArchiveError as A;
    match e {
        A::Store(s) => CliError::from(s),
        A::Upload { source, .. } if matches!(*source, TransferError::Store(_)) => match *source {
            TransferError::Store(s) => CliError::from(s),
            other => CliError::new(Exit::SourceFailed, other),
        },
        e @ (A::IndexFile { .. } | A::NotBinlogName { .. }) => CliError::new(Exit::Input, e),
        e @ (A::Binlog { .. } | A::Upload { .. } | A::Vanished(_)) => {
            CliError::new(Exit::SourceFailed, e)
        }
    }
}

pub async fn archive_binlogs(args: &crate::args::ArchiveArgs) -> Result<Exit, CliError> {
    let interval: jiff::SignedDuration = args.interval.parse().map_err(|_| {
        CliError::input(format!(
            "invalid --interval {:?}: expected a duration such as 10s, 1m or 500ms",
            args.interval
        ))
    })?;
    let interval = interval
        .try_into()
        .ok()
        .filter(|d: &std::time::Duration| !d.is_zero())
        .ok_or_else(|| {
            CliError::input(format!(
                "invalid --interval {:?}: expected a positive duration such as 10s",
                args.interval
            ))
        })?;
    let target = resolve::store_target(&args.store, args.policy.as_deref())?;
    let store = &target.store;
    let json = args.output == OutputFormat::Json;
    loop {
        let report = tidemark_store::archive::archive_pass(store, &args.binlog_index, &NoProgress)
            .await
            .map_err(archive_error);
        match report {
            Ok(r) if json => crate::commands::emit_json(&r)?,
            Ok(r) => {
                let mut line = format!(
                    "archived {} binlog(s) ({} bytes)",
                    r.uploaded.len() + r.adopted.len(),
                    r.bytes
                );
                if !r.adopted.is_empty() {
                    line.push_str(&format!(
                        ", {} of them found already uploaded",
                        r.adopted.len()
                    ));
                }
                line.push_str(&format!("; {} already archived", r.already_indexed));
                if !r.vanished.is_empty() {
                    line.push_str(&format!(
                        "; purged by the server before they could be archived: {}",
                        r.vanished.join(", ")
                    ));
                }
                if let Some(open) = &r.open {
                    line.push_str(&format!("; {open} is still being written"));
                }
                if args.once {
                    crate::commands::emit(&format!("{line}\n"))?;
                } else if !r.uploaded.is_empty() || !r.adopted.is_empty() {
                    eprintln!("{} {line}", jiff::Timestamp::now());
                }
            }
            // Watching: a failed pass is retried at the next tick.
            Err(e) if !args.once => eprintln!("{}", crate::exit::render(&e.error)),
            Err(e) => return Err(e),
        }
        if args.once {
            return Ok(Exit::Success);
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = shutdown_signal() => return Ok(Exit::Success),
        }
    }
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let terminated = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminated => {}
    }
}
