//! The backup attempt: claim the backup-id (the in-flight marker, written before the first
//! byte), stream the source into the store, commit `metadata.json` — or record the attempt
//! as failed. Where the source runs is a [`BackupRunner`]: a local process here, a
//! Kubernetes Job in the operator (whose container runs this same attempt through
//! `tidemark push`).

use std::process::Stdio;

use async_trait::async_trait;
use tidemark_mariadb::backup as mariadb;
use tidemark_store::format::{LogPosition, Metadata, PayloadObject};
use tidemark_store::transfer::{self, Attempt, AttemptRecord, AttemptSpec, TransferError};
use tidemark_store::{ClusterStore, Progress};
use tokio::io::AsyncRead;

use crate::error::{EngineError, chain};
use crate::redact::shell_words;

/// One backup to take.
#[derive(Debug, Clone)]
pub struct BackupRequest {
    pub spec: AttemptSpec,
    /// The command whose stdout is the backup; with method `mariabackup`, the program and
    /// its connection options (default `mariabackup`). Empty, for another method: stdin.
    pub command: Vec<String>,
    /// The parent's `metadata.json` (an incremental).
    pub parent: Option<Metadata>,
    /// Run the command in its own process group, so that a Ctrl-C meant for tidemark does
    /// not kill a backup that is given a grace period.
    pub detach: bool,
    /// The programs a `mysql-clone` backup runs (its recipient server, its client) and the
    /// user its servers run as.
    pub tools: tidemark_mariadb::restore::Tools,
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
/// # Guarantees
/// On failure, deletes only this attempt's own payload and marker, never a committed object.
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
    let mut mariabackup = if spec.method == mariadb::METHOD {
        Some(MariabackupRun::new(
            &request.command,
            request.parent.as_ref(),
        )?)
    } else {
        None
    };
    // A run refused already (another data directory) asks the server nothing.
    if let Some(run) = mariabackup.as_mut().filter(|r| r.refused.is_none()) {
        run.probe().await;
    }
    let command = match &mariabackup {
        Some(run) => run.command.clone(),
        None => request.command.clone(),
    };
    if spec.method == tidemark_mariadb::clone::METHOD
        || spec.method == tidemark_mariadb::dump::METHOD
    {
        // A command that names no source is bad input: refused before anything is recorded.
        let mut donor = tidemark_mariadb::clone::Donor::from_command(&request.command)
            .map_err(EngineError::Input)?;
        let record = std::sync::Arc::new(std::sync::Mutex::new(None));
        let source: Box<dyn Source> = if spec.method == tidemark_mariadb::dump::METHOD {
            // The command's program is mysqldump; the source is asked through the client.
            let program = std::mem::replace(&mut donor.client, request.tools.mysql.clone());
            Box::new(DumpSource {
                donor,
                program,
                work: None,
                record: record.clone(),
                run: None,
            })
        } else {
            Box::new(CloneSource {
                donor,
                tools: request.tools.clone(),
                work: None,
                record: record.clone(),
                task: None,
            })
        };
        let recorder = MySqlRecord(record);
        return run_attempt(
            store,
            spec,
            source,
            Some(&recorder),
            request.parent.as_ref(),
            progress,
        )
        .await;
    }
    let refused = mariabackup.as_ref().and_then(|r| r.refused.clone());
    let source: Box<dyn Source> = if let Some(why) = refused {
        Box::new(Refused(why))
    } else if command.is_empty() {
        Box::new(Stdin)
    } else {
        let mut local = LocalCommand::new(command, request.detach);
        if let Some(run) = &mariabackup {
            local.slave_position = Some(run.slave_position.clone());
        }
        Box::new(local)
    };
    run_attempt(
        store,
        spec,
        source,
        mariabackup.as_ref().map(|r| r as &dyn Recorder),
        request.parent.as_ref(),
        progress,
    )
    .await
}

/// Takes one backup from `source` (started once the backup-id is claimed): the attempt
/// lifecycle without anything method-specific, for a source that runs elsewhere (the
/// operator's `exec` through `pods/exec`).
///
/// # Guarantees
/// On failure, deletes only this attempt's own payload and marker, never a committed object.
///
/// # Errors
/// A taken backup-id before anything is recorded; a failed source or upload, recorded as a
/// failed attempt.
pub async fn take_backup_from(
    store: &ClusterStore,
    spec: &AttemptSpec,
    source: Box<dyn Source>,
    progress: &dyn Progress,
) -> Result<Metadata, AttemptFailure> {
    run_attempt(store, spec, source, None, None, progress).await
}

async fn run_attempt(
    store: &ClusterStore,
    spec: &AttemptSpec,
    source: Box<dyn Source>,
    recorder: Option<&dyn Recorder>,
    parent: Option<&Metadata>,
    progress: &dyn Progress,
) -> Result<Metadata, AttemptFailure> {
    let attempt = Attempt::begin(store, spec)
        .await
        .map_err(EngineError::from)?;
    let streamed = stream_source(&attempt, source, progress).await;
    // What the method recorded beside the stream (mariabackup's LSNs, a clone's point);
    // without it the backup is unusable, so its absence fails the attempt.
    let result = match (streamed, recorder) {
        (Ok(payload), Some(run)) => match run.recorded() {
            Ok((extra, position)) => {
                Ok((payload, extra, position, run.server(), run.completed_at()))
            }
            Err(e) => {
                transfer::remove_payload(store, spec, &payload.name).await;
                Err(EngineError::Source(e))
            }
        },
        (Ok(payload), None) => Ok((payload, serde_json::Map::new(), None, None, None)),
        (Err(e), _) => Err(e),
    };
    // Object lock: the chain's date, with older backups of the chain locked longer first
    // when this one outlives them. Failing that, the attempt fails (recorded, unlocked).
    let result = match result {
        Ok(done) => match transfer::chain_lock(store, spec.lock_until, parent).await {
            Ok((until, _)) => Ok((done, until)),
            Err(e) => Err(EngineError::from(e)),
        },
        Err(e) => Err(e),
    };
    let (outcome, failure) = match result {
        Ok(((payload, extra, log_position, server, completed_at), immutable_until)) => (
            AttemptRecord {
                payload: vec![payload],
                log_position,
                server,
                extra,
                immutable_until,
                completed_at,
                ..Default::default()
            },
            None,
        ),
        Err(e) => (
            AttemptRecord {
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

/// Where a backup's bytes come from: started once the backup-id is claimed, its stream
/// drained into the store, then asked how it ended.
#[async_trait]
pub trait Source: Send {
    /// Starts the source and gives its stream.
    ///
    /// # Errors
    /// It could not be started.
    async fn start(&mut self) -> Result<Box<dyn AsyncRead + Unpin + Send>, EngineError>;

    /// How it ended, once its stream was read to the end — or, with `stop`, after the
    /// upload failed (it is stopped first): `Ok(Err(how))` when it failed, e.g. "exited
    /// with status 2".
    ///
    /// # Errors
    /// Its end could not be observed.
    async fn finish(&mut self, stop: bool) -> Result<Result<(), String>, EngineError>;

    /// What it is, for messages (already redacted).
    fn describe(&self) -> String;

    /// What it said about its failure (e.g. the end of its stderr, redacted), appended to
    /// the error.
    fn said(&self) -> Option<String> {
        None
    }
}

/// This process's standard input.
struct Stdin;

#[async_trait]
impl Source for Stdin {
    async fn start(&mut self) -> Result<Box<dyn AsyncRead + Unpin + Send>, EngineError> {
        Ok(Box::new(tokio::io::stdin()))
    }

    async fn finish(&mut self, _stop: bool) -> Result<Result<(), String>, EngineError> {
        Ok(Ok(()))
    }

    fn describe(&self) -> String {
        "standard input".into()
    }
}

/// A local command whose stdout is the backup.
struct LocalCommand {
    command: Vec<String>,
    detach: bool,
    child: Option<tokio::process::Child>,
    /// Where to put the replica position mariabackup logs (`--slave-info`): its stderr is
    /// read line by line (and passed on) instead of inherited.
    slave_position: Option<SharedLine>,
    stderr_task: Option<tokio::task::JoinHandle<()>>,
}

/// A line of a command's output, filled in while it runs.
type SharedLine = std::sync::Arc<std::sync::Mutex<Option<String>>>;

impl LocalCommand {
    fn new(command: Vec<String>, detach: bool) -> Self {
        LocalCommand {
            command,
            detach,
            child: None,
            slave_position: None,
            stderr_task: None,
        }
    }
}

/// Passes a command's stderr on to ours, line by line, keeping the replica position
/// mariabackup logs.
async fn scan_stderr(stderr: tokio::process::ChildStderr, found: SharedLine) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut out = tokio::io::stderr();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(g) = mariadb::slave_position_line(&line)
            && let Ok(mut slot) = found.lock()
        {
            *slot = Some(g);
        }
        let _ = out.write_all(line.as_bytes()).await;
        let _ = out.write_all(b"\n").await;
    }
}

#[async_trait]
impl Source for LocalCommand {
    async fn start(&mut self) -> Result<Box<dyn AsyncRead + Unpin + Send>, EngineError> {
        let command = &self.command;
        let mut cmd = tokio::process::Command::new(&command[0]);
        cmd.args(&command[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if self.slave_position.is_some() {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .env_remove(tidemark_store::crypt::IDENTITY_ENV)
            .kill_on_drop(true);
        if self.detach {
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
        if let (Some(found), Some(stderr)) = (&self.slave_position, child.stderr.take()) {
            self.stderr_task = Some(tokio::spawn(scan_stderr(stderr, found.clone())));
        }
        self.child = Some(child);
        Ok(Box::new(stdout))
    }

    async fn finish(&mut self, stop: bool) -> Result<Result<(), String>, EngineError> {
        let Some(child) = self.child.as_mut() else {
            return Ok(Ok(()));
        };
        if stop {
            let _ = child.start_kill();
        }
        let status = child
            .wait()
            .await
            .map_err(|e| EngineError::Internal(format!("waiting for the backup command: {e}")))?;
        if let Some(task) = self.stderr_task.take() {
            let _ = task.await;
        }
        Ok(if status.success() {
            Ok(())
        } else {
            Err(describe_exit(status))
        })
    }

    fn describe(&self) -> String {
        shell_words(&self.command)
    }
}

/// Streams `source` into the attempt; a source that fails fails it (and its bytes are
/// removed).
async fn stream_source(
    attempt: &Attempt,
    mut source: Box<dyn Source>,
    progress: &dyn Progress,
) -> Result<PayloadObject, EngineError> {
    let mut stream = source.start().await?;
    let uploaded = attempt.upload(&mut stream, progress).await;
    drop(stream);
    // The stream ended (maybe empty): the source's verdict decides. The upload failed
    // first: stop the source.
    let stop = !matches!(&uploaded, Ok(_) | Err(TransferError::EmptyStream));
    let verdict = source.finish(stop).await?;
    let said = source.said().map(|s| format!("; {s}")).unwrap_or_default();
    match (uploaded, verdict) {
        // A source that failed without output failed: say that, not "empty".
        (Err(TransferError::EmptyStream), Err(how)) => Err(EngineError::Source(format!(
            "{} {how} without output{said}",
            source.describe()
        ))),
        (Err(e), _) => Err(e.into()),
        (Ok(payload), Ok(())) => Ok(payload),
        (Ok(payload), Err(how)) => {
            // The bytes are of a failed run: remove them now rather than after the TTL.
            transfer::remove_payload(attempt.store(), attempt.spec(), &payload.name).await;
            Err(EngineError::Source(format!(
                "{} {how} after writing {} bytes{said}",
                source.describe(),
                payload.size
            )))
        }
    }
}

/// A source refused before it ran (the server lacks what it needs): the attempt is
/// recorded as failed with the reason, and nothing is started.
struct Refused(String);

#[async_trait]
impl Source for Refused {
    async fn start(&mut self) -> Result<Box<dyn AsyncRead + Unpin + Send>, EngineError> {
        Err(EngineError::Source(self.0.clone()))
    }

    async fn finish(&mut self, _stop: bool) -> Result<Result<(), String>, EngineError> {
        Ok(Err("was refused before it ran".into()))
    }

    fn describe(&self) -> String {
        "mariabackup (not started)".into()
    }
}

/// `metadata.json`'s `extra` fields and binlog position of a finished run.
type Recorded = (
    serde_json::Map<String, serde_json::Value>,
    Option<LogPosition>,
);

/// What a method records beside its stream: `metadata.json`'s fields of a finished run.
trait Recorder: Sync {
    /// `extra` fields and the binlog position.
    fn recorded(&self) -> Result<Recorded, String>;

    /// The server the backup was taken on, as far as known.
    fn server(&self) -> Option<tidemark_store::format::SourceServer>;

    /// The instant the backup restores to, when it is not the commit's (a clone's data is
    /// consistent before its upload begins).
    fn completed_at(&self) -> Option<jiff::Timestamp> {
        None
    }
}

impl Recorder for MariabackupRun {
    fn recorded(&self) -> Result<Recorded, String> {
        MariabackupRun::recorded(self).map_err(|e| chain(&e))
    }

    fn server(&self) -> Option<tidemark_store::format::SourceServer> {
        MariabackupRun::server(self)
    }
}

/// A `mysql-clone` attempt (issue 47): the clone is taken when the stream starts, into a
/// scratch directory removed when the attempt ends, and streamed as a tar.
struct CloneSource {
    donor: tidemark_mariadb::clone::Donor,
    tools: tidemark_mariadb::restore::Tools,
    work: Option<tempfile::TempDir>,
    record: MySqlSlot,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

/// Where a MySQL backup's data is consistent, once taken: its GTID set, the source's
/// binlog position (a dump's), what the source said of itself, and when.
struct MySqlPoint {
    gtids: Option<tidemark_core::gtidset::GtidSet>,
    position: Option<LogPosition>,
    source: tidemark_mariadb::clone::SourceFacts,
    at: jiff::Timestamp,
}

/// What a MySQL backup found, once taken.
type MySqlSlot = std::sync::Arc<std::sync::Mutex<Option<MySqlPoint>>>;

#[async_trait]
impl Source for CloneSource {
    async fn start(&mut self) -> Result<Box<dyn AsyncRead + Unpin + Send>, EngineError> {
        let work = tempfile::Builder::new()
            .prefix("tidemark-clone-")
            .tempdir()
            .map_err(|e| {
                EngineError::Source(format!("creating the clone's scratch directory: {e}"))
            })?;
        let cloned = tidemark_mariadb::clone::take(
            &self.donor,
            &self.tools,
            work.path(),
            &tidemark_store::NoProgress,
        )
        .await
        .map_err(|e| EngineError::Source(chain(&e)))?;
        if let Ok(mut slot) = self.record.lock() {
            *slot = Some(MySqlPoint {
                gtids: Some(cloned.gtid_executed.clone()),
                position: None,
                source: cloned.source.clone(),
                at: cloned.consistent_at,
            });
        }
        let (stream, task) = tidemark_mariadb::clone::stream(cloned.datadir.clone());
        self.task = Some(task);
        self.work = Some(work);
        Ok(Box::new(stream))
    }

    async fn finish(&mut self, _stop: bool) -> Result<Result<(), String>, EngineError> {
        // A failed upload drops the stream: the writer then fails on its own.
        let ended = match self.task.take() {
            None => Ok(()),
            Some(task) => match task.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("failed: {e}")),
                Err(e) => Err(format!("failed: {e}")),
            },
        };
        self.work = None;
        Ok(ended)
    }

    fn describe(&self) -> String {
        format!("the clone of MySQL ({:?})", self.donor)
    }
}

/// A `mysqldump` attempt (issue 47): the dump streams as it runs, its point read from
/// its head on the way.
struct DumpSource {
    donor: tidemark_mariadb::clone::Donor,
    program: std::ffi::OsString,
    work: Option<tempfile::TempDir>,
    record: MySqlSlot,
    run: Option<tidemark_mariadb::dump::Dumping>,
}

#[async_trait]
impl Source for DumpSource {
    async fn start(&mut self) -> Result<Box<dyn AsyncRead + Unpin + Send>, EngineError> {
        let work = tempfile::Builder::new()
            .prefix("tidemark-dump-")
            .tempdir()
            .map_err(|e| {
                EngineError::Source(format!("creating the dump's scratch directory: {e}"))
            })?;
        let (stream, run) = tidemark_mariadb::dump::start(
            &self.donor,
            &self.program,
            work.path(),
            tidemark_mariadb::dump::LOCK_WAIT,
        )
        .await
        .map_err(|e| EngineError::Source(chain(&e)))?;
        self.run = Some(run);
        self.work = Some(work);
        Ok(Box::new(stream))
    }

    async fn finish(&mut self, stop: bool) -> Result<Result<(), String>, EngineError> {
        let ended = match self.run.take() {
            None => Ok(()),
            Some(run) => run.finish(stop).await.map(|dumped| {
                if let Ok(mut slot) = self.record.lock() {
                    *slot = Some(MySqlPoint {
                        gtids: dumped.point.gtid_executed,
                        position: dumped.point.position,
                        source: dumped.source,
                        at: dumped.consistent_at,
                    });
                }
            }),
        };
        self.work = None;
        Ok(ended)
    }

    fn describe(&self) -> String {
        format!(
            "the dump of MySQL ({} {:?})",
            self.program.to_string_lossy(),
            self.donor
        )
    }
}

/// A MySQL backup's point, as `metadata.json` records it.
struct MySqlRecord(MySqlSlot);

impl Recorder for MySqlRecord {
    fn completed_at(&self) -> Option<jiff::Timestamp> {
        Some(self.0.lock().ok()?.as_ref()?.at)
    }

    fn recorded(&self) -> Result<Recorded, String> {
        let slot = self.0.lock().map_err(|e| e.to_string())?;
        let Some(point) = slot.as_ref() else {
            return Err("the backup recorded no point".into());
        };
        let mut extra = serde_json::Map::new();
        if let Some(gtids) = &point.gtids {
            extra.insert(
                tidemark_mariadb::clone::GTID_EXECUTED_FIELD.into(),
                gtids.to_string().into(),
            );
        }
        Ok((extra, point.position.clone()))
    }

    fn server(&self) -> Option<tidemark_store::format::SourceServer> {
        let slot = self.0.lock().ok()?;
        let facts = &slot.as_ref()?.source;
        let mut extra = serde_json::Map::new();
        extra.insert("serverUuid".into(), facts.server_uuid.clone().into());
        extra.insert("version".into(), facts.version.clone().into());
        extra.insert("innodbPageSize".into(), facts.geometry.page_size.into());
        extra.insert(
            tidemark_mariadb::clone::GTID_MODE_FIELD.into(),
            if facts.gtids { "ON" } else { "OFF" }.into(),
        );
        extra.insert(
            "lowerCaseTableNames".into(),
            facts.geometry.lower_case_table_names.into(),
        );
        Some(tidemark_store::format::SourceServer {
            server_id: Some(facts.server_id),
            role: facts
                .replica
                .map(|r| if r { "replica" } else { "primary" }.to_owned()),
            extra,
            ..Default::default()
        })
    }
}

/// A `mariabackup` attempt: the command line Tidemark completes, and the directory where
/// mariabackup leaves its LSNs and binlog position.
struct MariabackupRun {
    command: Vec<String>,
    lsndir: tempfile::TempDir,
    /// An incremental's start: the parent's `toLsn`.
    incremental_lsn: Option<u64>,
    /// What the server said of itself before the backup.
    probe: Option<mariadb::ServerProbe>,
    /// Why the server cannot serve the backup (a grant missing), asked before it starts.
    refused: Option<String>,
    /// The replica position mariabackup logged at the consistent point.
    slave_position: SharedLine,
    /// The data directory backed up (its `--datadir`), as far as known: recorded, and
    /// an incremental is refused when its parent recorded another.
    data_directory: Option<String>,
}

impl MariabackupRun {
    fn new(user_command: &[String], parent: Option<&Metadata>) -> Result<Self, EngineError> {
        let incremental_lsn = parent
            .map(|p| mariadb::lsns_of(p).map(|l| l.to_lsn))
            .transpose()?;
        let datadir = tidemark_mariadb::backup::datadir_of_command(user_command);
        let data_directory = datadir.and_then(tidemark_mariadb::backup::data_directory_identity);
        // An incremental of another data directory than its parent's (a replica rebuilt
        // from nothing on the same volume, a restore into it) would mix the two's pages:
        // its LSNs may be ahead of the parent's, so only this tells (the chaos soak: an
        // increment of the old primary's volume, rebuilt, that no restore could prepare).
        // Refused before it runs, recorded as failed: the next scheduled backup is a full.
        let refused = match (
            parent,
            parent.and_then(tidemark_mariadb::backup::data_directory_of),
            &data_directory,
        ) {
            (Some(p), Some(theirs), Some(ours)) if theirs != ours => Some(
                mariadb::MariaDbError::OtherDataDirectory {
                    path: datadir.map_or_else(String::new, |d| d.display().to_string()),
                    id: p.backup_id.clone(),
                    parent: theirs.to_owned(),
                    ours: ours.clone(),
                }
                .to_string(),
            ),
            (Some(p), theirs, ours) if theirs.is_none() || ours.is_none() => {
                tracing::warn!(
                    parent = %p.backup_id,
                    "this incremental cannot be checked to be of its parent's data directory ({}): only the LSNs are; name the data directory with --datadir on the mariabackup command line, on a file system that keeps birth times",
                    if ours.is_none() {
                        "this one's is unknown"
                    } else {
                        "the parent recorded none"
                    }
                );
                None
            }
            _ => None,
        };
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
        Ok(MariabackupRun {
            command,
            lsndir,
            incremental_lsn,
            probe: None,
            refused,
            slave_position: SharedLine::default(),
            data_directory,
        })
    }

    /// Asks the server who it is and how far behind it replicates, with the connection
    /// options of the mariabackup command line; a server that cannot be asked is recorded
    /// without it (warned). First, what the backup needs of it (issue 46 §1): a grant
    /// missing refuses the backup before mariabackup streams anything, `log_bin` off is
    /// warned of. A server that cannot be asked is left to mariabackup, which says why.
    async fn probe(&mut self) {
        let client = mariadb::client_options(&self.command[1..]);
        match tidemark_mariadb::requirements::ask(std::ffi::OsStr::new("mariadb"), &client).await {
            Ok(server) => {
                let findings = server.for_backup();
                for w in &findings.warnings {
                    tracing::warn!("{w}");
                }
                // A refusal made before (another data directory) stands.
                self.refused = self
                    .refused
                    .take()
                    .or_else(|| findings.refusal("a mariabackup backup"));
            }
            Err(e) => tracing::warn!(
                error = %e,
                "could not ask the server its settings and the account's grants; mariabackup will say what is missing"
            ),
        }
        match mariadb::probe_server(std::ffi::OsStr::new("mariadb"), &client).await {
            Ok(p) => self.probe = Some(p),
            Err(e) => tracing::warn!(
                error = %e,
                "could not ask the server its id and replication state; the backup records its GTID position without them"
            ),
        }
    }

    /// The server the backup was taken on, as far as known.
    fn server(&self) -> Option<tidemark_store::format::SourceServer> {
        let slave = self.slave_position.lock().ok().and_then(|s| s.clone());
        if self.probe.is_none() && slave.is_none() {
            return None;
        }
        let replica = slave.is_some() || self.probe.as_ref().is_some_and(|p| p.replica);
        Some(tidemark_store::format::SourceServer {
            server_id: self.probe.as_ref().and_then(|p| p.server_id),
            role: Some(if replica { "replica" } else { "primary" }.to_owned()),
            lag_seconds: self.probe.as_ref().and_then(|p| p.lag_seconds),
            gtid_slave_pos: slave,
            galera: self.probe.as_ref().is_some_and(|p| p.galera),
            extra: serde_json::Map::new(),
        })
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
        // mariabackup copies the pages newer than the parent's LSN; on a server whose LSN
        // is behind it (another data directory) that is silently too few.
        if let Some(from_lsn) = self.incremental_lsn
            && lsns.to_lsn < from_lsn
        {
            return Err(mariadb::MariaDbError::LsnBehind {
                from_lsn,
                to_lsn: lsns.to_lsn,
            });
        }
        let mut extra = serde_json::Map::new();
        let (k, mut v) = mariadb::lsns_field(&lsns);
        if let (Some(dir), Some(fields)) = (&self.data_directory, v.as_object_mut()) {
            fields.insert(
                tidemark_mariadb::backup::DATA_DIRECTORY_FIELD.to_owned(),
                dir.clone().into(),
            );
        }
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
    spec: &AttemptSpec,
    error: &str,
) -> Result<Option<Metadata>, EngineError> {
    let recorded = match transfer::commit(
        store,
        spec,
        AttemptRecord {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn run_on(parent_to_lsn: u64, server_to_lsn: u64) -> Result<(), mariadb::MariaDbError> {
        let parent: Metadata = serde_json::from_value(serde_json::json!({
            "formatVersion": 1, "backupId": "20261120T020000Z-00000001", "backupName": "nightly",
            "cluster": "c", "type": "full", "method": "mariabackup", "phase": "completed",
            "startedAt": "2026-11-20T02:00:00Z",
            "mariabackup": {"fromLsn": 0, "toLsn": parent_to_lsn, "lastLsn": parent_to_lsn},
        }))
        .unwrap();
        let run = MariabackupRun::new(&[], Some(&parent)).unwrap();
        // What mariabackup leaves in the lsndir after an incremental.
        std::fs::write(
            run.lsndir.path().join(mariadb::CHECKPOINTS_FILE),
            format!(
                "backup_type = incremental\nfrom_lsn = {parent_to_lsn}\nto_lsn = {server_to_lsn}\nlast_lsn = {server_to_lsn}\n"
            ),
        )
        .unwrap();
        std::fs::write(
            run.lsndir.path().join(mariadb::INFO_FILE),
            "tool_name = mariabackup\n",
        )
        .unwrap();
        run.recorded().map(|_| ())
    }

    /// An incremental is refused before it runs when its parent recorded another data
    /// directory (its `ibdata1` made anew: a rebuild, a restore), whatever the LSNs; the
    /// refusal reads as a divergence (the next scheduled backup is a full); a backup
    /// records the data directory it was taken of.
    #[test]
    fn an_incremental_of_another_data_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ibdata1"), b"system tablespace").unwrap();
        let ours = tidemark_mariadb::backup::data_directory_identity(dir.path())
            .expect("the temporary directory's file system keeps no birth time (ext4, xfs, btrfs and tmpfs do): run the tests on one that does");
        let command = vec![
            "mariabackup".to_owned(),
            format!("--datadir={}", dir.path().display()),
        ];
        let parent_of = |identity: Option<&str>| -> Metadata {
            let mut fields = serde_json::json!({"fromLsn": 0, "toLsn": 1000, "lastLsn": 1000});
            if let Some(i) = identity {
                fields["dataDirectory"] = i.into();
            }
            serde_json::from_value(serde_json::json!({
                "formatVersion": 1, "backupId": "20261120T020000Z-00000001", "backupName": "nightly",
                "cluster": "c", "type": "full", "method": "mariabackup", "phase": "completed",
                "startedAt": "2026-11-20T02:00:00Z", "mariabackup": fields,
            }))
            .unwrap()
        };
        // The same directory, or a parent that recorded none (taken before): as before.
        for parent in [parent_of(Some(&ours)), parent_of(None)] {
            let run = MariabackupRun::new(&command, Some(&parent)).unwrap();
            assert_eq!(run.refused, None);
            assert_eq!(run.data_directory.as_deref(), Some(ours.as_str()));
        }
        // `ibdata1` made again in the same place (a rebuild): another directory.
        std::fs::remove_file(dir.path().join("ibdata1")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(dir.path().join("ibdata1"), b"system tablespace").unwrap();
        let run = MariabackupRun::new(&command, Some(&parent_of(Some(&ours)))).unwrap();
        let why = run.refused.clone().expect("refused");
        assert!(
            why.contains(&ours)
                && why.contains(&dir.path().display().to_string())
                && why.contains("20261120T020000Z-00000001")
                && why.contains("take a full backup"),
            "{why}"
        );
        assert!(tidemark_mariadb::is_lsn_behind(&why), "{why}");
        // A full records its directory beside its LSNs.
        std::fs::write(
            run.lsndir.path().join(mariadb::CHECKPOINTS_FILE),
            "backup_type = full-backuped\nfrom_lsn = 0\nto_lsn = 2000\nlast_lsn = 2000\n",
        )
        .unwrap();
        std::fs::write(
            run.lsndir.path().join(mariadb::INFO_FILE),
            "tool_name = mariabackup\n",
        )
        .unwrap();
        let (extra, _) = run.recorded().unwrap();
        assert_eq!(
            extra["mariabackup"]["dataDirectory"].as_str(),
            run.data_directory.as_deref()
        );
        assert_ne!(run.data_directory.as_deref(), Some(ours.as_str()));
    }

    #[test]
    fn an_incremental_from_a_server_behind_its_parent_fails() {
        run_on(1000, 1000).unwrap();
        run_on(1000, 5000).unwrap();
        let e = run_on(5000, 1000).unwrap_err();
        assert!(
            matches!(
                e,
                mariadb::MariaDbError::LsnBehind {
                    from_lsn: 5000,
                    to_lsn: 1000
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("take a full backup"), "{e}");
    }
}
