//! `tidemark push`, `fetch` and `archive-binlogs`: flags → a validated request → the engine.

use std::collections::BTreeMap;
use std::path::Path;

use jiff::Timestamp;
use tidemark_core::RetentionDuration;
use tidemark_engine::archive::BinlogSource;
use tidemark_engine::{BackupRequest, BackupRunner, EngineError, LocalProcess};
use tidemark_mariadb::backup as mariadb;
use tidemark_store::format::{BackupType, Metadata, MetadataPhase};
use tidemark_store::transfer::{
    self, AttemptSpec, TransferError, new_backup_id, valid_backup_name,
};
use tidemark_store::{ClusterStore, NoProgress, Progress, layout};

use crate::args::{BackupKindArg, FetchArgs, OutputFormat, PushArgs};
use crate::exit::{CliError, Exit};
use crate::output::{ArchivePassOut, PushOut};
use crate::progress::TerminalProgress;
use crate::resolve;

fn transfer_error(e: TransferError) -> CliError {
    EngineError::from(e).into()
}

/// Parses the push flags into a backup spec.
fn spec(args: &PushArgs, started_at: Timestamp) -> Result<AttemptSpec, CliError> {
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
    let ext = args.ext.as_deref().unwrap_or(match args.method.as_deref() {
        Some(mariadb::METHOD) => mariadb::EXT,
        Some(tidemark_mariadb::clone::METHOD) => tidemark_mariadb::clone::EXT,
        Some(tidemark_mariadb::dump::METHOD) => tidemark_mariadb::dump::EXT,
        _ => "bin",
    });
    let payload_name = format!("backup.{ext}");
    if ext.is_empty() || ext.starts_with('.') || !layout::is_payload_name(&payload_name) {
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
    crate::resolve::warn_ambiguous_flag("--ttl", args.ttl.as_deref());
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
    let lock_until = args
        .lock_until
        .as_deref()
        .map(|t| {
            t.parse::<Timestamp>().map_err(|e| {
                CliError::input(format!(
                    "invalid --lock-until {t:?}: {e}; expected an RFC 3339 instant, e.g. 2026-12-31T00:00:00Z"
                ))
            })
        })
        .transpose()?;
    Ok(AttemptSpec {
        backup_name: args.backup_name.clone(),
        backup_id,
        kind,
        parent_id: args.parent.clone(),
        method,
        payload_name,
        started_at,
        labels,
        ttl,
        lock_until,
    })
}

pub async fn push(args: &PushArgs) -> Result<Exit, CliError> {
    let started_at = Timestamp::now();
    let spec = spec(args, started_at)?;
    let mut spec = spec;
    let target = resolve::store_target(&args.store, args.policy.as_deref())?;
    spec.lock_until = match (spec.lock_until, target.object_lock) {
        (Some(t), Some(_)) if t <= started_at => {
            return Err(CliError::input(format!(
                "--lock-until {t} is not in the future; a lock must end after the backup starts"
            )));
        }
        (Some(t), Some(_)) => Some(t),
        (Some(_), None) => {
            return Err(CliError::input(
                "--lock-until needs an object lock mode: --lock-mode governance|compliance (or TIDEMARK_LOCK_MODE, or the policy's objectStore.objectLock)",
            ));
        }
        (None, Some(l)) => Some(l.period.map(|p| p.after(started_at)).ok_or_else(|| {
            CliError::input(
                "--lock-mode needs --lock-until TIME, or a --policy whose objectStore.objectLock (or retention.window) gives the period",
            )
        })?),
        (None, None) => None,
    };
    let store = &args.compress.apply(&target.store);
    let parent = match &spec.parent_id {
        None => None,
        Some(id) => Some(
            tidemark_engine::parent::named_parent(store, id)
                .await
                .map_err(|e| {
                    use tidemark_engine::parent::NamedParentError as E;
                    match e {
                        E::NotFound { .. } | E::NotCompleted { .. } => {
                            CliError::input(format!("--parent {e}"))
                        }
                        E::Transfer(t) => transfer_error(t),
                    }
                })?,
        ),
    };
    let json = args.output.structured();
    let bar = TerminalProgress::for_bytes(json, "uploading");
    let progress: &dyn Progress = match &bar {
        Some(b) => b,
        None => &NoProgress,
    };
    let request = BackupRequest {
        spec: spec.clone(),
        command: args.command.clone(),
        parent,
        // In the terminal's process group: Ctrl-C stops the command with tidemark.
        detach: false,
        tools: args.mysql.tools(),
    };
    let taken = LocalProcess.run(store, &request, progress).await;
    if let Some(b) = &bar {
        b.finish();
    }
    match taken {
        Ok(m) => {
            report(store, &m, args.output)?;
            Ok(Exit::Success)
        }
        Err(failure) => {
            if let Some(m) = &failure.recorded {
                report(store, m, args.output)?;
                eprintln!(
                    "recorded {}/{} as failed; failedBackupsTTL collects it",
                    spec.backup_name, spec.backup_id
                );
            }
            Err(failure.error.into())
        }
    }
}

fn report(store: &ClusterStore, m: &Metadata, output: OutputFormat) -> Result<(), CliError> {
    if output.structured() {
        crate::output::emit_as(output, &PushOut::from_metadata(store, m))
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
        crate::output::emit(&format!("{}\n", m.backup_id))
    }
}

pub async fn fetch(args: &FetchArgs) -> Result<Exit, CliError> {
    if !tidemark_core::inventory::is_backup_id(&args.backup_id) {
        return Err(transfer_error(TransferError::InvalidId(
            args.backup_id.clone(),
        )));
    }
    // Where the bytes go is checked before anything is read.
    let destination = args.out.as_deref().map(Destination::of).transpose()?;
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
    let result = match &destination {
        None => {
            let mut out = tokio::io::stdout();
            transfer::download(store, &m, &mut out, progress)
                .await
                .map(|_| ())
        }
        Some(d) => d.write(store, &m, progress).await,
    };
    if let Some(b) = &bar {
        b.finish();
    }
    match result {
        Ok(()) => Ok(Exit::Success),
        // `fetch | head`: the reader went away; that is its choice, not a failure.
        Err(TransferError::Sink(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            Ok(Exit::Success)
        }
        Err(TransferError::Sink(e)) => Err(CliError::new(
            Exit::Input,
            anyhow::anyhow!(
                "writing {} failed: {e}",
                args.out
                    .as_deref()
                    .map_or_else(|| "stdout".to_owned(), |p| p.display().to_string())
            ),
        )),
        Err(e) => Err(transfer_error(e)),
    }
}

/// Where `fetch --out` writes, decided from what is there now.
#[derive(Debug)]
enum Destination {
    /// Nothing there, or a regular file: a temporary file beside it, renamed over it only
    /// when the whole payload checks out (a failed fetch leaves what was there).
    Replace(std::path::PathBuf),
    /// A device, FIFO or socket: written in place (renaming over it would replace it with a
    /// regular file); a checksum error comes after the bytes.
    InPlace(std::path::PathBuf),
}

/// The directory a path's file is in (`.` for a bare name).
fn parent_dir(path: &Path) -> std::path::PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    }
}

/// A new hidden file in `dir` (removed when dropped unless persisted).
fn staging_file(dir: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(".tidemark-fetch-")
        .tempfile_in(dir)
}

impl Destination {
    /// Follows a symbolic link to what it names (like `cp`), refuses a directory and a
    /// parent that is missing or not writable — before anything is downloaded.
    fn of(path: &Path) -> Result<Self, CliError> {
        let bad = |why: String| CliError::input(format!("--out {}: {why}", path.display()));
        let resolved = match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path).map_err(|e| {
                bad(format!(
                    "a symbolic link whose target cannot be reached ({e})"
                ))
            })?,
            _ => path.to_path_buf(),
        };
        // A file is written beside its final name, then renamed over it: the directory
        // must take a new file, which is tried now rather than after the download.
        let writable = |resolved: std::path::PathBuf| {
            let dir = parent_dir(&resolved);
            match std::fs::metadata(&dir) {
                Ok(m) if m.is_dir() => staging_file(&dir)
                    .map(|_| Destination::Replace(resolved))
                    .map_err(|e| bad(format!("cannot write in {}: {e}", dir.display()))),
                Ok(_) => Err(bad(format!("{} is not a directory", dir.display()))),
                Err(e) => Err(bad(format!("directory {}: {e}", dir.display()))),
            }
        };
        match std::fs::metadata(&resolved) {
            Ok(m) if m.is_dir() => Err(bad("is a directory; name a file".into())),
            Ok(m) if m.is_file() => writable(resolved),
            Ok(_) => Ok(Destination::InPlace(resolved)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => writable(resolved),
            Err(e) => Err(bad(e.to_string())),
        }
    }

    async fn write(
        &self,
        store: &ClusterStore,
        m: &Metadata,
        progress: &dyn Progress,
    ) -> Result<(), TransferError> {
        match self {
            Destination::Replace(path) => {
                let tmp = staging_file(&parent_dir(path)).map_err(TransferError::Sink)?;
                let std_file = tmp.reopen().map_err(TransferError::Sink)?;
                let mut file = tokio::fs::File::from_std(std_file);
                transfer::download(store, m, &mut file, progress).await?;
                file.sync_all().await.map_err(TransferError::Sink)?;
                // Only a regular file (or nothing) is replaced: look again right before.
                if std::fs::symlink_metadata(path).is_ok_and(|md| !md.is_file()) {
                    // Kept, as the message says: the download is not thrown away.
                    let kept = tmp
                        .keep()
                        .map(|(_, p)| p.display().to_string())
                        .unwrap_or_else(|e| format!("nowhere ({})", e.error));
                    return Err(TransferError::Sink(std::io::Error::other(format!(
                        "{} changed into something other than a regular file meanwhile; the payload is left in {kept}",
                        path.display(),
                    ))));
                }
                tmp.persist(path)
                    .map_err(|e| TransferError::Sink(e.error))?;
                Ok(())
            }
            Destination::InPlace(path) => {
                let mut file = tokio::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .await
                    .map_err(TransferError::Sink)?;
                transfer::download(store, m, &mut file, progress).await?;
                Ok(())
            }
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
    let max_lag: jiff::SignedDuration = args
        .max_lag
        .parse()
        .ok()
        .filter(|d: &jiff::SignedDuration| d.is_positive())
        .ok_or_else(|| {
            CliError::input(format!(
                "invalid --max-lag {:?}: expected a positive duration such as 5m or 1h",
                args.max_lag
            ))
        })?;
    let purge = match &args.purge_keep {
        None => None,
        Some(text) => Some(tidemark_mariadb::purge::PurgePolicy {
            keep: text
                .parse::<jiff::SignedDuration>()
                .ok()
                .filter(|d| !d.is_negative())
                .ok_or_else(|| {
                    CliError::input(format!(
                        "invalid --purge-keep {text:?}: expected a duration such as 2h, 30m or 0s"
                    ))
                })?,
            max_disk: args
                .purge_max_disk
                .as_deref()
                .map(|m| {
                    crate::simulate::parse_size(m).filter(|n| *n > 0).ok_or_else(|| {
                        CliError::input(format!(
                            "invalid --purge-max-disk {m:?}: expected a number and a unit, e.g. 50GiB or 500MiB"
                        ))
                    })
                })
                .transpose()?,
        }),
    };
    let mut archiver = tidemark_engine::archive::Archiver::new(max_lag);
    let target = resolve::store_target(&args.store, args.policy.as_deref())?;
    let store = &args.compress.apply(&target.store);
    let json = args.output.structured();
    let remote = remote_server(args, store)?;
    let replicas = purge_replicas(&args.purge_replica)?;
    let mut checksums = crate::checksums::Schedule::from_args(args)?;
    let mut follower: Option<tidemark_mariadb::remote::Follower> = None;
    if let Some(r) = &remote
        && args.once
    {
        let first = r
            .first_to_fetch(store)
            .await
            .map_err(|e| CliError::from(EngineError::from(e)))?;
        r.fetch(&first)
            .await
            .map_err(|e| CliError::from(EngineError::from(e)))?;
    }
    // A SIGTERM (or Ctrl-C) during a pass ends the watch after it — or STOP_GRACE after
    // the signal, when the pass does not end (a server or a store that stopped
    // answering): the watch is then dropped in the middle of it. Nothing a pass left half
    // done counts (an object is committed last; the reader is killed with the watch), and
    // the next run fetches and ships it again. A Deployment's rollout (the archiver's,
    // after a failover) waits no longer than that for the old pod.
    // (With --once a signal lets the one pass finish, as before: its report is the output.)
    let cut_short = (!args.once).then(shutdown_signal);
    let watch = async {
        // One listener for the whole watch: a signal during a pass ends it after the pass.
        let shutdown = shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            if let Some(r) = &remote
                && !args.once
            {
                follow(r, store, &mut follower).await;
            }
            // The oracle's checksums: with --once one run, before the pass (its statements
            // go to the file the server is writing); watching, the run that ended meanwhile.
            let checksummed = match &mut checksums {
                Some(c) if args.once => Some(c.run_now().await),
                Some(c) => c.tick().await,
                None => None,
            };
            let source = match (&remote, &args.binlog_index) {
                (Some(r), _) => Ok(BinlogSource::Remote(r)),
                (None, Some(index)) => Ok(BinlogSource::Index(index, primary(args))),
                (None, None) => Err(CliError::input(
                    "give --binlog-index FILE, or --from-server with the connection options after --",
                )),
            };
            let report = match source {
                Ok(source) => archiver.pass(store, source).await.map_err(CliError::from),
                Err(e) => Err(e),
            };
            let report = report.map(|a| {
                if !args.once
                    && let Some((behind, message)) = &a.lag
                {
                    let level = if *behind { "warning: " } else { "" };
                    eprintln!("{} {level}{message} (--max-lag)", jiff::Timestamp::now());
                }
                a.report
            });
            // The server's binlogs purged as far as the archive holds them verified, pass or
            // no pass (a store that cannot be read holds nothing verified: nothing goes); then
            // each replica's by the same rule.
            let (purged, purged_replicas) = match (&remote, purge) {
                (Some(r), Some(p)) => purge_servers(r, &replicas, store, p).await,
                _ => (None, Vec::new()),
            };
            match report {
                Ok(r) if json => {
                    let mut out = ArchivePassOut::from(r);
                    out.checksums = checksummed;
                    out.purge = purged;
                    out.purge_replicas = purged_replicas;
                    // Watching, one YAML document per pass: a stream, each opened by `---`.
                    if !args.once && args.output == crate::args::OutputFormat::Yaml {
                        crate::output::emit("---\n")?;
                    }
                    crate::output::emit_as(args.output, &out)?;
                }
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
                    if let Some(t) = &r.new_timeline {
                        line.push_str(&format!("; {}", crate::output::timeline_started(t)));
                        if args.primary_server_id.is_none() {
                            line.push_str(
                                " (taken as primary: the server this archiver reads; no cluster \
                             confirms it — --primary-server-id does)",
                            );
                        }
                    } else if r.timeline > 0 {
                        line.push_str(&format!("; timeline {}", r.timeline));
                    }
                    if !r.vanished.is_empty() {
                        line.push_str(&format!(
                            "; purged by the server before they could be archived: {}",
                            r.vanished.join(", ")
                        ));
                    }
                    if let Some(open) = &r.open {
                        line.push_str(&format!("; {open} is still being written"));
                    }
                    if let Some(p) = &purged {
                        match &p.purged_to {
                            Some(to) => line.push_str(&format!(
                                "; purged {} binlog(s) on the server, up to {to}",
                                p.purged.len()
                            )),
                            None => line.push_str("; purged nothing on the server"),
                        }
                        if let Some(why) = &p.kept_because {
                            line.push_str(&format!(" ({why})"));
                        }
                    }
                    for r in &purged_replicas {
                        match (&r.report, &r.error) {
                            (Some(p), _) => line.push_str(&format!(
                                "; replica {}: purged {} binlog(s){}",
                                r.server,
                                p.purged.len(),
                                p.purged_to
                                    .as_deref()
                                    .map(|to| format!(", up to {to}"))
                                    .unwrap_or_default()
                            )),
                            (None, Some(e)) => {
                                line.push_str(&format!("; replica {}: not purged ({e})", r.server));
                            }
                            (None, None) => {}
                        }
                    }
                    if args.once {
                        if let Some(c) = &checksummed {
                            line.push_str(&format!("; {}", c.line()));
                        }
                        crate::output::emit(&format!("{line}\n"))?;
                    } else {
                        if !r.uploaded.is_empty() || !r.adopted.is_empty() {
                            eprintln!("{} {line}", jiff::Timestamp::now());
                        }
                        if let Some(c) = &checksummed {
                            eprintln!("{} {}", jiff::Timestamp::now(), c.line());
                        }
                    }
                }
                // Watching: a failed pass is retried at the next tick.
                Err(e) if !args.once => {
                    eprintln!("{}", crate::exit::render(&e.error));
                    if let Some(c) = &checksummed {
                        eprintln!("{} {}", jiff::Timestamp::now(), c.line());
                    }
                }
                Err(e) => return Err(e),
            }
            if args.once {
                return Ok(Exit::Success);
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = &mut shutdown => return Ok(Exit::Success),
            }
        }
    };
    tokio::select! {
        ended = watch => ended,
        () = async {
            match cut_short {
                Some(signal) => signal.await,
                None => std::future::pending().await,
            }
            tokio::time::sleep(STOP_GRACE).await;
        } => {
            eprintln!(
                "{} the pass in progress had not ended {} s after the signal: stopped in the middle of it (what it had not committed, the next run ships)",
                jiff::Timestamp::now(),
                STOP_GRACE.as_secs()
            );
            Ok(Exit::Success)
        }
    }
}

/// How long a watch's pass may go on after a SIGTERM or Ctrl-C before the watch stops in
/// the middle of it: well within a pod's default grace period (30 s).
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The server to read from with `--from-server`; its connection options may not carry a
/// password (it would be visible to every process on the machine, and in error messages).
fn remote_server(
    args: &crate::args::ArchiveArgs,
    store: &tidemark_store::ClusterStore,
) -> Result<Option<tidemark_mariadb::remote::RemoteServer>, CliError> {
    refuse_password_options(&args.client)?;
    if !args.from_server {
        if !args.client.is_empty() && args.checksums_every.is_none() {
            return Err(CliError::input(
                "connection options after -- are for --from-server or --checksums-every; with --binlog-index alone give none",
            ));
        }
        if args.client.is_empty() && args.checksums_every.is_some() {
            return Err(CliError::input(
                "--checksums-every logs in to the server: give its connection options after --, e.g. -- --defaults-extra-file=/etc/tidemark/oracle.cnf",
            ));
        }
        // Refused, not ignored (clap's `requires` cannot say it: --from-server requires
        // --spool already).
        if let Some(spool) = &args.spool {
            return Err(CliError::input(format!(
                "--spool {} is for --from-server (where fetched files wait); with --binlog-index give none",
                spool.display()
            )));
        }
        return Ok(None);
    }
    let Some(spool) = args.spool.clone() else {
        return Err(CliError::input("--from-server needs --spool DIR"));
    };
    let mysql = args.engine == crate::args::Engine::Mysql;
    if mysql && args.purge_keep.is_some() {
        return Err(CliError::input(
            "--purge-keep with --engine mysql: purging a MySQL server's binlogs is not built yet (its archive is; purge with the server's binlog_expire_logs_seconds)",
        ));
    }
    let (client, decoder) = if mysql {
        (args.mysql.clone(), args.mysqlbinlog.clone())
    } else {
        (args.mariadb.clone(), args.mariadb_binlog.clone())
    };
    Ok(Some(tidemark_mariadb::remote::RemoteServer {
        client_args: args.client.clone(),
        spool,
        mariadb: client,
        mariadb_binlog: decoder,
        primary: primary(args),
        mysql,
        connection_server_id: tidemark_mariadb::remote::connection_server_id(
            &store.url,
            &store.cluster,
        ),
    }))
}

/// Refuses a password among the connection options (every process can read a command line).
fn refuse_password_options(client: &[String]) -> Result<(), CliError> {
    if let Some(bad) = client
        .iter()
        .find(|a| a.starts_with("--password") || a.starts_with("-p") || a.starts_with("--passwd"))
    {
        let name = bad.split('=').next().unwrap_or(bad);
        return Err(CliError::input(format!(
            "{name}: a password on the command line is visible to every process; put it in an option file ([client] password=…) and pass --defaults-extra-file=FILE first"
        )));
    }
    Ok(())
}

/// At most this many `--purge-replica`.
const MAX_PURGE_REPLICAS: usize = 16;

/// `--purge-replica HOST[:PORT]` (`[IPv6]:PORT` too), checked: each becomes `--host=HOST
/// --port=PORT` after the connection options, which the client takes over theirs.
fn purge_replicas(given: &[String]) -> Result<Vec<(String, String, u16)>, CliError> {
    if given.len() > MAX_PURGE_REPLICAS {
        return Err(CliError::input(format!(
            "{} --purge-replica given: at most {MAX_PURGE_REPLICAS}",
            given.len()
        )));
    }
    given
        .iter()
        .map(|text| {
            let bad = || {
                CliError::input(format!(
                    "invalid --purge-replica {:?}: expected HOST or HOST:PORT, e.g. db-1.db:3306 or [fd00::5]:3306",
                    text.chars().take(80).collect::<String>()
                ))
            };
            let (host, port) = if let Some(rest) = text.strip_prefix('[') {
                let (host, after) = rest.split_once(']').ok_or_else(bad)?;
                match after.strip_prefix(':') {
                    Some(p) => (host, Some(p)),
                    None if after.is_empty() => (host, None),
                    None => return Err(bad()),
                }
            } else {
                match text.split_once(':') {
                    Some((h, p)) if !p.contains(':') => (h, Some(p)),
                    _ => (text.as_str(), None),
                }
            };
            let port = match port {
                None => 3306,
                Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?,
            };
            let fine = if host.contains(':') || text.starts_with('[') {
                host.parse::<std::net::Ipv6Addr>().is_ok()
            } else {
                !host.is_empty()
                    && host.len() <= 253
                    && !host.starts_with('-')
                    && host
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            };
            if !fine {
                return Err(bad());
            }
            Ok((text.clone(), host.to_owned(), port))
        })
        .collect()
}

/// Purges one server's binlogs (`name`: the replica as given); warns when its point in
/// time is at risk, or why it could not purge.
async fn purge_one(
    r: &tidemark_mariadb::remote::RemoteServer,
    name: Option<&str>,
    store: &tidemark_store::ClusterStore,
    policy: tidemark_mariadb::purge::PurgePolicy,
) -> Result<tidemark_mariadb::purge::PurgeReport, String> {
    let name = name.map_or_else(|| "the server".to_owned(), |n| format!("replica {n}"));
    match r.purge(store, policy, jiff::Timestamp::now()).await {
        Ok(report) => {
            if report.point_in_time_at_risk {
                eprintln!(
                    "{} warning: point in time at risk: {name} holds {} bytes of binlogs (limit {}) and the archive lacks some of them ({}); none of those is purged, and the disk may fill",
                    jiff::Timestamp::now(),
                    report.disk_bytes,
                    report.max_disk.unwrap_or_default(),
                    report.kept_because.as_deref().unwrap_or("not archived yet")
                );
            }
            Ok(report)
        }
        Err(e) => {
            let e = tidemark_engine::error::chain(&EngineError::from(e));
            eprintln!(
                "{} warning: {name}'s binlogs were not purged: {e}",
                jiff::Timestamp::now(),
            );
            Err(e)
        }
    }
}

/// Purges `remote`'s binlogs, then each replica's, as `policy` allows; says so when a
/// point in time is at risk or a purge failed, and records it all beside the archiver's
/// status (for the operator's watch).
async fn purge_servers(
    remote: &tidemark_mariadb::remote::RemoteServer,
    replicas: &[(String, String, u16)],
    store: &tidemark_store::ClusterStore,
    policy: tidemark_mariadb::purge::PurgePolicy,
) -> (
    Option<tidemark_mariadb::purge::PurgeReport>,
    Vec<crate::output::ReplicaPurgeOut>,
) {
    let primary = purge_one(remote, None, store, policy).await;
    let mut out = Vec::new();
    for (given, host, port) in replicas {
        let mut replica = remote.clone();
        replica.client_args.push(format!("--host={host}"));
        replica.client_args.push(format!("--port={port}"));
        // Over the network whatever the options say (`localhost` or --protocol=socket
        // would reach the local server instead).
        replica.client_args.push("--protocol=TCP".into());
        let result = purge_one(&replica, Some(given), store, policy).await;
        out.push(crate::output::ReplicaPurgeOut {
            server: given.clone(),
            error: result.as_ref().err().cloned(),
            report: result.ok(),
        });
    }
    let now = jiff::Timestamp::now();
    let status =
        |r: &tidemark_mariadb::purge::PurgeReport| tidemark_store::state::BinlogPurgeStatus {
            at: now,
            disk_bytes: r.disk_bytes_after,
            max_disk: r.max_disk,
            point_in_time_at_risk: r.point_in_time_at_risk,
            kept_because: r.kept_because.clone(),
            purged_to: r.purged_to.clone(),
            replicas: Vec::new(),
            server: None,
            error: None,
        };
    // A purge that did not run: the disk as last seen, and why.
    let failed =
        |disk_bytes: u64, error: Option<String>| tidemark_store::state::BinlogPurgeStatus {
            at: now,
            disk_bytes,
            max_disk: policy.max_disk,
            point_in_time_at_risk: false,
            kept_because: None,
            purged_to: None,
            replicas: Vec::new(),
            server: None,
            error,
        };
    // Beside the pass's record, for the operator's watch and `ls`; a purge that failed
    // too (with the disk as last seen), so that it is not taken for one that went well.
    if let Ok(Some(mut record)) = tidemark_store::state::load_archiver_status(store).await {
        let mut st = match &primary {
            Ok(p) => status(p),
            Err(e) => failed(
                record.purge.as_ref().map_or(0, |p| p.disk_bytes),
                Some(e.clone()),
            ),
        };
        st.replicas = out
            .iter()
            .map(|r| {
                let mut s = r
                    .report
                    .as_ref()
                    .map_or_else(|| failed(0, r.error.clone()), status);
                s.server = Some(r.server.clone());
                s
            })
            .collect();
        record.purge = Some(st);
        if let Err(e) = tidemark_store::state::save_archiver_status(store, &record).await {
            tracing::warn!("the purge could not be recorded: {e}");
        }
    }
    (primary.ok(), out)
}

/// Which server may start a timeline: `--primary-server-id`, else the one read.
fn primary(args: &crate::args::ArchiveArgs) -> tidemark_mariadb::archive::Primary {
    use tidemark_mariadb::archive::Primary;
    args.primary_server_id
        .map_or(Primary::PointedAt, Primary::Confirmed)
}

/// Keeps `mariadb-binlog --stop-never` running: (re)started from the newest spooled file,
/// or from the first file the archive lacks; started again when it reads another server
/// than the connection options reach now, or stands still behind the server.
async fn follow(
    r: &tidemark_mariadb::remote::RemoteServer,
    store: &tidemark_store::ClusterStore,
    follower: &mut Option<tidemark_mariadb::remote::Follower>,
) {
    if let Some(f) = follower {
        match f.try_wait() {
            // Still reading: from the server the connection options reach now? After a
            // failover they reach the new primary while this connection may still read the
            // old one.
            Ok(None) => {
                let again = match r.check(false).await {
                    Ok(now) if Some(now) != r.spool_server() => format!(
                        "the connection options now reach server {now} (the spool holds server {}'s files): following it",
                        r.spool_server()
                            .map_or_else(|| "unknown".to_owned(), |s| s.to_string())
                    ),
                    // A grant revoked or binary logging turned off while reading: said
                    // every pass until it is fixed (the reader stops on its own when it is
                    // cut off).
                    Err(e @ tidemark_mariadb::remote::RemoteError::Unfit(_)) => {
                        eprintln!("{}", crate::exit::render(&EngineError::from(e).into()));
                        return;
                    }
                    Err(_) => return,
                    // The same server: is the reader keeping up with it? A connection that
                    // died without it hearing of it leaves it waiting for good.
                    Ok(_) => match r.stalled(f).await {
                        Ok(Some(why)) => format!(
                            "mariadb-binlog stands still behind the server ({why}): starting it again"
                        ),
                        _ => return,
                    },
                };
                eprintln!("{} {again}", jiff::Timestamp::now());
                if let Some(f) = follower.take() {
                    let said = f.stop(3).await;
                    if !said.is_empty() {
                        eprintln!("{} mariadb-binlog said: {said}", jiff::Timestamp::now());
                    }
                }
            }
            Ok(Some(status)) => {
                let said = follower.take().map(|f| f.stop(3));
                let said = match said {
                    Some(s) => s.await,
                    None => String::new(),
                };
                eprintln!(
                    "{} mariadb-binlog stopped ({status}): {said}; starting it again",
                    jiff::Timestamp::now(),
                );
            }
            Err(e) => {
                eprintln!("mariadb-binlog: {e}");
                *follower = None;
            }
        }
    }
    let first = match r.first_to_fetch(store).await {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{}", crate::exit::render(&EngineError::from(e).into()));
            return;
        }
    };
    match r.follow(&first) {
        Ok(f) => *follower = Some(f),
        Err(e) => eprintln!("{}", crate::exit::render(&EngineError::from(e).into())),
    }
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM. The handlers are installed when this is called,
/// not when it is first awaited: a signal that arrives while the caller is busy elsewhere
/// (an archive pass between two waits) is kept for the next await of the same future.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).ok();
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    async move {
        tokio::select! {
            () = received(terminate.as_mut()) => {}
            () = received(interrupt.as_mut()) => {}
        }
    }
}

/// Resolves when `signal` arrives; never without one.
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// `--purge-replica`: host and port, IPv6 in brackets, the default port; anything that
    /// could be read as an option, or is not a host, is refused with the value.
    #[test]
    fn purge_replicas_are_hosts_and_ports() {
        let given = |v: &[&str]| {
            purge_replicas(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .map(|r| {
                    r.into_iter()
                        .map(|(_, h, p)| format!("{h} {p}"))
                        .collect::<Vec<_>>()
                })
                .map_err(|e| format!("{e:?}"))
        };
        assert_eq!(
            given(&["db-1.db:3307", "10.0.0.5", "[fd00::5]:3308", "fd00::6"]).unwrap(),
            [
                "db-1.db 3307",
                "10.0.0.5 3306",
                "fd00::5 3308",
                "fd00::6 3306"
            ]
        );
        for bad in [
            "--host=evil",
            "db:0",
            "db:x",
            "db 1",
            "",
            "[fd00::5",
            "a;b",
            "db:3306:",
            "[db]:3306",
        ] {
            let e = given(&[bad]).unwrap_err();
            assert!(e.contains("invalid --purge-replica"), "{bad}: {e}");
        }
        let many: Vec<String> = (0..17).map(|i| format!("db-{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(given(&refs).unwrap_err().contains("at most 16"));
    }
}
