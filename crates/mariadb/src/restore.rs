//! `tidemark restore`: a MariaDB data directory at a point in time, from a mariabackup
//! chain and the archived binlogs.
//!
//! Observe → plan → execute, like a retention pass: [`resolve`] reads the store and asks
//! `tidemark_core::choose_restore` what the target needs (reading index shards on the way);
//! [`restore`] downloads, extracts (`mbstream -x`), prepares (`mariabackup --prepare`, then
//! each increment with `--incremental-dir`), starts a private `mariadbd` on the result and
//! replays the binlogs up to the target (`mariadb-binlog … --stop-datetime … | mariadb`),
//! then shuts it down cleanly.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use serde::Serialize;
use tidemark_core::{RestoreChoice, choose_restore_to};
use tokio::process::{Child, Command};

use crate::backup as mariadb;
use crate::binlog;
pub(crate) use crate::server::PrivateServer;
use crate::server::{Account, Login};
pub use crate::tools::{REPLAY_SETTINGS, RestoreError, Tools};
pub(crate) use crate::tools::{hermetic, no_plugin_dir, spawn, tail};
use tidemark_store::ClusterStore;
use tidemark_store::Progress;
use tidemark_store::catalog::{Catalog, SegmentListing};
use tidemark_store::format::{LogPosition, Metadata};
use tidemark_store::layout;
use tidemark_store::transfer::{self, TransferError};

/// One segment a restore replays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplaySegment {
    pub name: String,
    pub size: u64,
    pub sha256: Option<String>,
    /// How the segment object is compressed (its index entry's), when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// How the segment object is encrypted (its index entry's), when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encryption: Option<tidemark_store::format::Encryption>,
    pub first_event_at: Option<Timestamp>,
    pub last_event_at: Option<Timestamp>,
    /// Its timeline (0: the archive's first).
    pub timeline: u32,
    /// The server that wrote it, when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_id: Option<u32>,
    /// Its name on that server, where it differs from `name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

impl ReplaySegment {
    /// How the segment object was written, for reading it.
    pub fn form(&self) -> tidemark_store::codec::Form<'_> {
        tidemark_store::codec::Form {
            compression: self.compression.as_deref(),
            encryption: self.encryption.as_ref(),
        }
    }
}

/// Everything a restore to one target uses: what `--dry-run` prints.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestorePlan {
    pub target: Timestamp,
    /// The chain, base full first; the last one is the backup restored.
    pub backups: Vec<Metadata>,
    pub segments: Vec<ReplaySegment>,
    /// Replay starts in the first segment at this file offset (the backup's recorded one):
    /// only for a backup that records no GTID position; otherwise replay skips by GTID what
    /// the backup holds ([`RestorePlan::runs`]).
    pub start_position: Option<LogPosition>,
    /// The segments in one pass per timeline: replay applies the transactions after
    /// `startAfter` and stops after `stopAt` (the switch to the next timeline).
    pub runs: Vec<tidemark_core::restore::ReplayRun>,
    /// `mariadb-binlog --stop-datetime` (UTC): events stamped at or after it are not
    /// applied, so replay includes the target's whole second.
    pub stop_datetime: Option<Timestamp>,
    pub recovery_window: tidemark_core::RecoveryWindow,
}

impl RestorePlan {
    /// The replay's passes over `files` downloaded segments: the plan's runs, or one run
    /// of them all for an archive that records no GTID positions.
    fn replay_runs(
        &self,
        files: usize,
    ) -> std::borrow::Cow<'_, [tidemark_core::restore::ReplayRun]> {
        if self.runs.is_empty() {
            std::borrow::Cow::Owned(vec![tidemark_core::restore::ReplayRun::whole(files)])
        } else {
            std::borrow::Cow::Borrowed(&self.runs[..])
        }
    }
}

/// How the step that downloads a restore's binlogs (beside the backups' steps) ends: its
/// bytes are [`RestoreReport::binlog_bytes`].
pub const BINLOG_STEP: &str = "binlog(s) meanwhile";

/// What a restore did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreReport {
    pub datadir: PathBuf,
    pub bytes_downloaded: u64,
    /// Of which binlog segments (downloaded while the backups are prepared).
    pub binlog_bytes: u64,
    pub backups_applied: usize,
    pub segments_replayed: usize,
    /// The instant reached: the last transaction replayed, or the restored backup's point.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reached: Option<Timestamp>,
    /// The GTID position the restored data holds (issue 46 §3): what the server's binlog
    /// starts from and `gtid_slave_pos` says, so new writes continue the history.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gtid_position: Option<String>,
    /// The binlog state file written beside the data (`<basename>.state`), from which a
    /// server whose `log_bin` has that base name starts its binlog at
    /// [`RestoreReport::gtid_position`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binlog_state_file: Option<PathBuf>,
    /// The restore oracle (issue 48), where the replayed data holds it: the chunks
    /// compared, and each whose data is not the primary's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oracle: Option<crate::oracle::Comparison>,
}

/// Reads the store and decides what a restore to `target` uses.
///
/// # Errors
/// The target is outside the recovery window, in a gap, or needs a segment that is not
/// archived; the backups are not mariabackup ones; a store request failed.
pub async fn resolve(
    store: &ClusterStore,
    target: Timestamp,
    timeline: Option<u32>,
    progress: &dyn Progress,
) -> Result<RestorePlan, RestoreError> {
    let mut catalog = Catalog::load(store, progress).await?;
    let unlisted = SegmentListing::default();
    let choice = loop {
        let inventory = along(catalog.inventory(&unlisted), timeline)?;
        let choice = choose_restore_to(&inventory, target)?;
        match &mut catalog.index {
            Some(index) if !choice.unread.is_empty() => {
                let keys: Vec<String> = choice.unread.iter().map(|s| s.name.clone()).collect();
                index.read_shards(store, keys).await?;
            }
            _ => break choice,
        }
    };
    plan_of(&catalog, choice)
}

/// The inventory as a restore along `timeline` sees it: that timeline is the newest, so
/// its lineage is the main line and every later timeline a branch — how an instant of a
/// history abandoned by a restore (or a failover) is restored (issue 46 §3).
///
/// # Errors
/// The archive records no such timeline.
fn along(
    mut inventory: tidemark_core::Inventory,
    timeline: Option<u32>,
) -> Result<tidemark_core::Inventory, RestoreError> {
    let Some(n) = timeline else {
        return Ok(inventory);
    };
    let known: Vec<u32> = inventory.timelines.iter().map(|t| t.id).collect();
    if n != 0 && !known.contains(&n) {
        return Err(RestoreError::NoTimeline {
            timeline: n,
            known: if known.is_empty() { vec![0] } else { known },
        });
    }
    inventory.timelines.retain(|t| t.id <= n);
    Ok(inventory)
}

fn plan_of(catalog: &Catalog, choice: RestoreChoice) -> Result<RestorePlan, RestoreError> {
    let backups = choice
        .chain
        .iter()
        .map(|b| {
            let m = catalog
                .backup(&b.name, &b.id)
                .and_then(|s| s.metadata.clone())
                .ok_or_else(|| RestoreError::NoMetadata { id: b.id.clone() })?;
            if ![mariadb::METHOD, crate::clone::METHOD, crate::dump::METHOD]
                .contains(&m.method.as_str())
            {
                return Err(RestoreError::Method {
                    id: m.backup_id,
                    method: m.method,
                });
            }
            Ok(m)
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Checksums of the chosen segments only: the index may hold a million entries.
    let wanted: std::collections::HashSet<&str> =
        choice.segments.iter().map(|s| s.name.as_str()).collect();
    let entries: std::collections::HashMap<&str, &tidemark_store::format::IndexEntry> = catalog
        .index
        .iter()
        .flat_map(|i| i.entries())
        .filter(|e| wanted.contains(e.name.as_str()))
        .map(|e| (e.name.as_str(), e))
        .collect();
    let segments: Vec<ReplaySegment> = choice
        .segments
        .iter()
        .map(|s| ReplaySegment {
            name: s.name.clone(),
            size: s.size,
            sha256: entries.get(s.name.as_str()).and_then(|e| e.sha256.clone()),
            compression: entries
                .get(s.name.as_str())
                .and_then(|e| e.compression.clone()),
            encryption: entries
                .get(s.name.as_str())
                .and_then(|e| e.encryption.clone()),
            first_event_at: s.first_event_at,
            last_event_at: s.last_event_at,
            timeline: tidemark_core::timeline::timeline_of(s.sequence),
            server_id: entries.get(s.name.as_str()).and_then(|e| e.server_id),
            file: entries.get(s.name.as_str()).and_then(|e| e.file.clone()),
        })
        .collect();
    let restored = backups.last();
    let start_position = if choice.from_log_position {
        restored.and_then(|m| m.log_position.clone())
    } else {
        None
    };
    // Without a recorded position, where the backup's own events end in the binlog is
    // unknown: replaying from a segment's start could apply some of them twice.
    if let Some(m) = restored.filter(|m| {
        m.log_position.is_none()
            && m.gtid_position().is_none()
            && m.gtid_set().is_none()
            && !segments.is_empty()
    }) {
        return Err(RestoreError::NoPosition {
            id: m.backup_id.clone(),
            completed: choice.chain.last().map(|b| b.restore_point()),
        });
    }
    let stop_datetime = if segments.is_empty() {
        None
    } else {
        Timestamp::from_second(choice.target.as_second() + 1).ok()
    };
    Ok(RestorePlan {
        target: choice.target,
        backups,
        segments,
        start_position,
        runs: choice.runs,
        stop_datetime,
        recovery_window: choice.window,
    })
}

/// Builds a data directory at `plan.target` in `datadir` (created; must be empty).
///
/// # Guarantees
/// Reads the store only. On failure the data directory is removed again (it was empty),
/// so a half-restored directory is never left to be mistaken for a good one.
///
/// # Errors
/// A download fails its checksum; a MariaDB tool fails (the error carries the end of its
/// output); the server does not start.
pub async fn restore(
    store: &ClusterStore,
    plan: &RestorePlan,
    datadir: &Path,
    tools: &Tools,
    progress: &dyn Progress,
) -> Result<RestoreReport, RestoreError> {
    readable(store, plan)?;
    if plan.stop_datetime.is_some() {
        // Refused before anything is downloaded: binlogs are replayed on a server that
        // never runs as root.
        crate::server::check_server_user(tools, datadir).await?;
    }
    prepare_datadir(datadir)?;
    let result = restore_into(store, plan, datadir, tools, progress).await;
    if result.is_err() {
        remove_half_restored(datadir).await;
    }
    result
}

/// Removes a data directory a failed (or refused) restore leaves. A tool of a branch the failure
/// cancelled was killed as it was dropped, and may still be writing for a moment: the
/// removal is tried again until nothing is left (a few times, briefly).
pub async fn remove_half_restored(datadir: &Path) {
    for _ in 0..10 {
        let _ = std::fs::remove_dir_all(datadir);
        if !datadir.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::warn!(dir = %datadir.display(), "could not remove the half-restored data directory");
}

/// Whether every payload and segment of `plan` can be read here (format version,
/// compression, encryption and identity), before anything is written.
///
/// # Errors
/// The first object that cannot be, named.
pub fn readable(store: &ClusterStore, plan: &RestorePlan) -> Result<(), RestoreError> {
    for m in &plan.backups {
        transfer::backup_readable(store, m)?;
    }
    for s in &plan.segments {
        transfer::segment_readable(store, &s.name, s.form(), s.last_event_at)?;
    }
    Ok(())
}

fn prepare_datadir(datadir: &Path) -> Result<(), RestoreError> {
    let io = |action: &str, source| RestoreError::Io {
        action: action.into(),
        dir: datadir.to_path_buf(),
        source,
    };
    match std::fs::read_dir(datadir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(RestoreError::DatadirNotEmpty(datadir.to_path_buf()));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(datadir).map_err(|e| io("creating the data directory", e))
        }
        Err(e) => Err(io("reading the data directory", e)),
    }
}

/// Binlog segments downloaded at once by a restore.
const SEGMENT_DOWNLOADS: usize = 4;

async fn restore_into(
    store: &ClusterStore,
    plan: &RestorePlan,
    datadir: &Path,
    tools: &Tools,
    progress: &dyn Progress,
) -> Result<RestoreReport, RestoreError> {
    // Scratch space beside the data directory: same file system, so no surprise about space.
    let parent = datadir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let work = tempfile::Builder::new()
        .prefix(".tidemark-restore-")
        .tempdir_in(parent)
        .map_err(|source| RestoreError::Io {
            action: "creating a scratch directory".into(),
            dir: parent.to_path_buf(),
            source,
        })?;
    let work = work.path();
    if plan.stop_datetime.is_some() {
        crate::server::open_to_server(tools, work).await?;
    }
    // A MySQL clone or dump (issue 47): unpacked or loaded, replayed with MySQL's tools.
    let mysql = mysql_of(plan)?;
    let applier = matches!(tools.replay, crate::tools::Replay::Applier { .. });
    // The chain is downloaded, extracted and prepared while the binlogs download and are
    // read: the two share nothing until the replay.
    let binlogs = async {
        let Some(stop) = plan.stop_datetime else {
            return Ok((Vec::new(), 0u64, None, Vec::new()));
        };
        let dir = work.join("binlogs");
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|source| RestoreError::Io {
                action: "creating the binlog directory".into(),
                dir: dir.clone(),
                source,
            })?;
        // Names come from the store: one outside the grammar never becomes a path.
        if let Some(s) = plan
            .segments
            .iter()
            .find(|s| !layout::is_segment_name(&s.name))
        {
            return Err(RestoreError::Transfer(TransferError::Metadata {
                key: store.display_key(&layout::index_key()),
                problem: format!("{:?} is not a binlog segment name", s.name),
            }));
        }
        // Several segments at once, each to its own file (issue 32 §3); in order. The
        // downloads are made first and then run (a stream of closures over borrowed
        // segments would not be `Send` for every lifetime, which callers' tasks need).
        let downloads: Vec<_> = plan
            .segments
            .iter()
            .map(|s| download_segment(store, s, dir.join(&s.name)))
            .collect();
        let files: Vec<PathBuf> = futures::stream::iter(downloads)
            .buffered(SEGMENT_DOWNLOADS)
            .try_collect()
            .await?;
        let bytes = plan.segments.iter().map(|s| s.size).sum();
        // MariaDB's binlogs are read as soon as they are here, whichever way the replay
        // goes: rows of the server's own tables are refused before the chain is even
        // prepared (the first failure stops the other), and the applier's server is told
        // which server id none of the events carries.
        let scans = match mysql {
            Some(_) => Vec::new(),
            None => scan_runs(&files, plan, stop, applier).await?,
        };
        Ok::<_, RestoreError>((files, bytes, Some(stop), scans))
    };
    if !plan.segments.is_empty() {
        progress.step(
            &format!("downloading {} {BINLOG_STEP}", plan.segments.len()),
            0,
        );
    }
    let backups = async {
        match mysql {
            Some(dump) if dump.method == crate::dump::METHOD => {
                crate::dump::load(store, dump, datadir, work, tools, progress).await
            }
            Some(clone) => crate::clone::extract(store, clone, datadir, progress).await,
            None => build_prepared(store, &plan.backups, datadir, work, tools, progress).await,
        }
    };
    // The first failure stops the other.
    let (chain_bytes, (files, binlog_bytes, stop, scans)) = tokio::try_join!(backups, binlogs)?;
    let bytes = chain_bytes + binlog_bytes;
    let (reached_at, position) = reached(plan, &files, stop);
    if let Some(clone) = mysql {
        let mut reached_at = reached_at;
        let mut oracle = None;
        let holds = match stop {
            Some(stop) => {
                progress.step(
                    &format!("replaying {} binlog(s) up to {stop}", files.len()),
                    0,
                );
                let runs: Vec<(usize, usize)> = plan
                    .replay_runs(files.len())
                    .iter()
                    .map(|r| (r.first, r.count))
                    .collect();
                let (holds, last, compared) =
                    crate::clone::replay(clone, datadir, work, tools, &files, &runs, stop).await?;
                reached_at = reached_at.max(last);
                oracle = compared;
                Some(holds)
            }
            None => clone.gtid_set(),
        };
        return Ok(RestoreReport {
            datadir: datadir.to_path_buf(),
            bytes_downloaded: bytes,
            binlog_bytes,
            backups_applied: plan.backups.len(),
            segments_replayed: plan.segments.len(),
            reached: reached_at,
            gtid_position: holds.map(|g| g.to_string()),
            binlog_state_file: None,
            oracle,
        });
    }
    let mut oracle = None;
    if let Some(stop) = stop {
        progress.step(
            &format!("replaying {} binlog(s) up to {stop}", files.len()),
            0,
        );
        oracle = replay(
            datadir,
            work,
            tools,
            &files,
            &scans,
            plan,
            stop,
            position.as_ref(),
            progress,
        )
        .await?;
    }
    let binlog_state_file = match &position {
        Some(p) => write_binlog_state(datadir, plan, p)?,
        None => None,
    };
    Ok(RestoreReport {
        datadir: datadir.to_path_buf(),
        bytes_downloaded: bytes,
        binlog_bytes,
        backups_applied: plan.backups.len(),
        segments_replayed: plan.segments.len(),
        reached: reached_at,
        gtid_position: position.map(|p| p.to_string()),
        binlog_state_file,
        oracle,
    })
}

/// The base name of the binlog of the server the restored backup was taken on
/// (`mysql-bin` of `mysql-bin.000012`), when recorded and plain.
fn binlog_basename(plan: &RestorePlan) -> Option<String> {
    let file = plan.backups.last()?.log_position.as_ref()?.file.clone();
    let (base, number) = file.rsplit_once('.')?;
    let plain = !base.is_empty()
        && base.len() <= 64
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit());
    plain.then(|| base.to_owned())
}

/// Writes `<datadir>/<basename>.state`: the binlog state a server reads when its binlog
/// holds no file yet (a restored data directory never does), so its first binlog starts
/// at `position` (its `Gtid_list`) and its next transaction continues the history. The
/// archive then records the restored server as a new timeline whose switch is that
/// position, and what the old history holds after it as a branch. Without a recorded base
/// name nothing is written (the report says so by its absence).
///
/// # Errors
/// The file cannot be written.
fn write_binlog_state(
    datadir: &Path,
    plan: &RestorePlan,
    position: &tidemark_core::GtidPos,
) -> Result<Option<PathBuf>, RestoreError> {
    use std::os::unix::fs::MetadataExt as _;
    let Some(base) = binlog_basename(plan) else {
        return Ok(None);
    };
    let path = datadir.join(format!("{base}.state"));
    let text: String = position.gtids().map(|g| format!("{g}\n")).collect();
    std::fs::write(&path, text).map_err(|source| RestoreError::Io {
        action: format!("writing the binlog state {}", path.display()),
        dir: datadir.to_path_buf(),
        source,
    })?;
    // The server that reads it owns the data directory.
    if let Ok(meta) = std::fs::metadata(datadir) {
        let _ = std::os::unix::fs::lchown(&path, Some(meta.uid()), Some(meta.gid()));
    }
    Ok(Some(path))
}

/// Downloads one binlog segment into `path` (created), checked against its recorded size
/// and checksum.
async fn download_segment(
    store: &ClusterStore,
    s: &ReplaySegment,
    path: PathBuf,
) -> Result<PathBuf, RestoreError> {
    let mut f = tokio::fs::File::create(&path)
        .await
        .map_err(TransferError::Sink)?;
    transfer::copy_verified(
        store,
        &layout::segment_key(&s.name),
        s.size,
        s.sha256.as_deref(),
        s.form(),
        &mut f,
        &tidemark_store::NoProgress,
    )
    .await?;
    Ok(path)
}

/// The instant a restore reached — the last transaction its replay applied (each run's
/// files up to its switch, before `stop`), or, without one, the restored backup's own
/// point — and the GTID position its data then holds: the backup's (where the first run
/// starts), advanced by every transaction replayed.
fn reached(
    plan: &RestorePlan,
    files: &[PathBuf],
    stop: Option<Timestamp>,
) -> (Option<Timestamp>, Option<tidemark_core::GtidPos>) {
    let backup = plan.backups.last();
    let backup_at = backup.and_then(|m| m.completed_at);
    let mut position = plan
        .runs
        .first()
        .and_then(|r| r.start_after.clone())
        .or_else(|| backup.and_then(Metadata::gtid_position));
    let Some(stop) = stop else {
        return (backup_at, position);
    };
    let runs = plan.replay_runs(files.len());
    let mut last = None;
    // A file that cannot be read leaves the position unknown: no state is written rather
    // than one short of what was replayed (the server would reuse numbers).
    let mut known = true;
    for run in runs.iter() {
        for f in files.iter().skip(run.first).take(run.count) {
            let Ok(applied) = std::fs::File::open(f)
                .map_err(binlog::BinlogError::from)
                .and_then(|mut file| binlog::applied(&mut file, stop, run.stop_at.as_ref()))
            else {
                known = false;
                continue;
            };
            last = last.max(applied.last_at);
            if !applied.position.is_empty() {
                position = Some(position.unwrap_or_default().merged(&applied.position));
            }
            // mariadb-binlog ends the run at the first event at or after the stop.
            if applied.stopped {
                break;
            }
        }
    }
    (
        last.max(backup_at),
        position.filter(|p| known && !p.is_empty()),
    )
}

/// Increments of a chain downloaded and extracted at once, beside the base (issue 32 §3).
/// Each holds its scratch directory until it is applied, so the scratch space holds at most
/// this many increments.
const INCREMENTS_AHEAD: usize = 2;
// `buffered(0)` would never start one.
const _: () = assert!(INCREMENTS_AHEAD > 0);

/// Downloads a mariabackup chain (base full first), extracts the base into `datadir` and
/// the increments under `work`, and prepares them into one consistent data directory.
/// Returns the bytes downloaded.
///
/// The base and the first increments download at once (at most [`INCREMENTS_AHEAD`]
/// increments wait in scratch space); the base is prepared as soon as it is extracted, and
/// each increment is applied, in order, as soon as the one before it was.
///
/// # Errors
/// A download fails its checksum, or a tool fails (with the end of its output).
pub(crate) async fn build_prepared(
    store: &ClusterStore,
    chain: &[Metadata],
    datadir: &Path,
    work: &Path,
    tools: &Tools,
    progress: &dyn Progress,
) -> Result<u64, RestoreError> {
    let Some((base, increments)) = chain.split_first() else {
        return Ok(0);
    };
    let log = work.join("tools.log");
    let datadir_arg = format!("--target-dir={}", datadir.display());
    // No library is ever loaded from a backup (its backup-my.cnf is rewritten as it is
    // extracted; this pins the directory a setting could name besides).
    let no_plugins = format!("--plugin-dir={}", no_plugin_dir(work)?.display());
    // The base's step is reported first: the increments' steps follow it as they start
    // (a step's bytes are those reported while it is the latest one).
    progress.step(
        &format!("downloading {} into {}", base.backup_id, datadir.display()),
        0,
    );
    // The base is prepared as soon as it is extracted: its redo log applies to its own
    // files only.
    let base_ready = async {
        let bytes = extract(store, base, datadir, tools, progress).await?;
        progress.step("preparing the base backup", 0);
        run_logged(
            &tools.mariabackup,
            &["--prepare".into(), datadir_arg.clone(), no_plugins.clone()],
            &log,
            "mariabackup --prepare",
        )
        .await?;
        Ok::<_, RestoreError>(bytes)
    };
    // Room in scratch space: increment `i` (from 0) starts to download once fewer than
    // `INCREMENTS_AHEAD` increments before it wait to be applied (`applied` counts those
    // applied and removed), so the scratch space never holds more, and the next one the
    // applier needs has always started. The downloads are made first and then run (a
    // stream of closures over borrowed backups would not be `Send` for every lifetime).
    let (applied, room) = tokio::sync::watch::channel(0usize);
    let (extracted, mut ready) = tokio::sync::mpsc::unbounded_channel();
    let downloads: Vec<_> = increments
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let dir = work.join(format!("increment-{}", i + 1));
            download_increment(store, m, dir, tools, progress, room.clone(), i)
        })
        .collect();
    drop(room);
    // Moves the sender in: the applier's loop ends when this ends.
    let download_increments = async move {
        let mut bytes = 0u64;
        let mut downloads = futures::stream::iter(downloads).buffered(INCREMENTS_AHEAD);
        while let Some(done) = downloads.next().await {
            let (m, dir, n) = done?;
            bytes += n;
            // The receiver lives in `build_prepared`'s frame, so this holds while the
            // applier runs; if it ever ended first, nothing more would be needed.
            if extracted.send((m, dir)).is_err() {
                break;
            }
        }
        Ok::<_, RestoreError>(bytes)
    };
    let apply_increments = async {
        let bytes = base_ready.await?;
        while let Some((m, inc)) = ready.recv().await {
            progress.step(&format!("applying increment {}", m.backup_id), 0);
            run_logged(
                &tools.mariabackup,
                &[
                    "--prepare".into(),
                    datadir_arg.clone(),
                    format!("--incremental-dir={}", inc.display()),
                    no_plugins.clone(),
                ],
                &log,
                &format!(
                    "mariabackup --prepare --incremental-dir (backup {})",
                    m.backup_id
                ),
            )
            .await?;
            if let Err(e) = tokio::fs::remove_dir_all(&inc).await {
                tracing::warn!(dir = %inc.display(), error = %e, "could not remove an applied increment");
            }
            applied.send_modify(|n| *n += 1);
        }
        Ok::<_, RestoreError>(bytes)
    };
    // The first failure stops the other.
    let (increment_bytes, base_bytes) = tokio::try_join!(download_increments, apply_increments)?;
    Ok(base_bytes + increment_bytes)
}

/// Downloads and extracts the chain's increment `i` (from 0) into `dir` once `applied`
/// leaves room for it (see [`build_prepared`]); returns it, its directory and its bytes.
async fn download_increment<'a>(
    store: &ClusterStore,
    m: &'a Metadata,
    dir: PathBuf,
    tools: &Tools,
    progress: &dyn Progress,
    mut applied: tokio::sync::watch::Receiver<usize>,
    i: usize,
) -> Result<(&'a Metadata, PathBuf, u64), RestoreError> {
    // An error means the sender is gone, which outlives every download (it lives in
    // `build_prepared`'s frame): it cannot happen while this future runs.
    let _ = applied.wait_for(|n| i < n + INCREMENTS_AHEAD).await;
    progress.step(
        &format!("downloading {} into {}", m.backup_id, dir.display()),
        0,
    );
    let n = extract(store, m, &dir, tools, progress).await?;
    Ok((m, dir, n))
}

/// Streams a backup's payload through `mbstream -x` into `dir`; returns the bytes read.
async fn extract(
    store: &ClusterStore,
    m: &Metadata,
    dir: &Path,
    tools: &Tools,
    progress: &dyn Progress,
) -> Result<u64, RestoreError> {
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|source| RestoreError::Io {
            action: "creating an extraction directory".into(),
            dir: dir.to_path_buf(),
            source,
        })?;
    let mut child = spawn(
        Command::new(&tools.mbstream)
            .arg("-x")
            .arg("-C")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        &tools.mbstream,
    )?;
    let Some(mut stdin) = child.stdin.take() else {
        return Err(no_pipe("mbstream -x"));
    };
    let copied = transfer::download(store, m, &mut stdin, progress).await;
    drop(stdin);
    let payload = finish_piped(
        child,
        copied,
        &tools.mbstream,
        &format!("mbstream -x of backup {}", m.backup_id),
    )
    .await?;
    // Before any tool reads the directory: its options file keeps the geometry only.
    crate::cnf::Geometry::sanitize(dir, &m.backup_id).map_err(|source| RestoreError::Io {
        action: format!(
            "rewriting the {} of backup {}",
            crate::cnf::FILE,
            m.backup_id
        ),
        dir: dir.to_path_buf(),
        source,
    })??;
    Ok(payload.size)
}

pub(crate) use crate::tools::no_pipe;

/// Waits for a tool whose pipe the caller fed or drained, stopping it when the transfer
/// failed. The transfer's error comes first, then the tool's exit status (with the end of
/// its stderr).
pub(crate) async fn finish_piped<T>(
    mut child: Child,
    moved: Result<T, TransferError>,
    program: &OsString,
    step: &str,
) -> Result<T, RestoreError> {
    if moved.is_err() {
        let _ = child.start_kill();
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|source| RestoreError::Spawn {
            program: program.to_string_lossy().into_owned(),
            source,
        })?;
    let value = moved?;
    if !out.status.success() {
        return Err(RestoreError::Tool {
            step: step.into(),
            status: out.status.to_string(),
            tail: tail(&String::from_utf8_lossy(&out.stderr)),
        });
    }
    Ok(value)
}

/// Starts a private server on the prepared directory ([`PrivateServer`]: no network, no
/// binlog, never root), replays — row transactions through its replication applier
/// ([`crate::applier`], unless `--replay client`), the rest as an account without global
/// rights — and shuts it down.
#[allow(clippy::too_many_arguments)]
async fn replay(
    datadir: &Path,
    work: &Path,
    tools: &Tools,
    files: &[PathBuf],
    scans: &[Option<crate::applier::Scan>],
    plan: &RestorePlan,
    stop: Timestamp,
    position: Option<&tidemark_core::GtidPos>,
    progress: &dyn Progress,
) -> Result<Option<crate::oracle::Comparison>, RestoreError> {
    // The runs were read as they were downloaded ([`scan_runs`]).
    let threads = match tools.replay {
        crate::tools::Replay::Applier { threads } => Some(threads),
        crate::tools::Replay::Client => None,
    };
    // Several GTID domains apply side by side with parallel workers, and a stop at a
    // piece's end (UNTIL, or STOP SLAVE at the last relay log's end) may then leave
    // transactions of one domain queued and never applied while the position read says
    // done: the SQL thread alone applies such binlogs, in their order.
    let threads = threads.map(|t| {
        let domains = scans
            .iter()
            .flatten()
            .map(|s| s.applied.gtids().count())
            .max()
            .unwrap_or(0);
        if t > 0 && domains > 1 {
            tracing::warn!(
                "the binlogs hold {domains} GTID domains: the applier replays them with its \
                 SQL thread alone, not {t} parallel workers"
            );
            0
        } else {
            t
        }
    });
    let relay = match threads {
        Some(threads) if scans.iter().flatten().any(|s| s.through_applier() > 0) => {
            let servers = scans
                .iter()
                .flatten()
                .flat_map(|s| s.servers.iter().copied());
            Some(
                crate::applier::Relay::prepare(tools, work, files)
                    .await?
                    .server_args(threads, servers),
            )
        }
        _ => None,
    };
    let mut server = PrivateServer::start_with(
        &crate::tools::Flavor::MariaDb,
        datadir,
        work,
        tools,
        relay.as_deref().unwrap_or_default(),
    )
    .await?;
    // The backup's own checksum runs: those the replay computes again come after.
    let since = server.oracle_base_run(tools).await;
    // What the data said it had replicated: the applier writes its own progress there.
    let before = match relay {
        Some(_) => Some(slave_pos(&server, tools).await),
        None => None,
    };
    let mut replayed = replay_into(
        &mut server,
        tools,
        files,
        plan,
        stop,
        work,
        relay.as_ref().map(|_| scans),
        progress,
    )
    .await;
    if relay.is_some() {
        // No replication state of the replay stays in the restored data.
        let reset = server.admin_sql(tools, "STOP SLAVE; RESET SLAVE ALL").await;
        replayed = replayed.and(reset);
    }
    // The restore oracle (issue 48), where the data holds it: what the replay recomputed
    // against the primary's values.
    let oracle = match &replayed {
        Ok(()) => server.oracle_compare(tools, since).await,
        Err(_) => None,
    };
    // What the data now holds is what the server says it applied (`gtid_slave_pos`, in
    // `mysql.gtid_slave_pos`): a replica made of it, or the server made a replica, starts
    // there.
    let said = match (position, before) {
        (Some(p), _) => Some(Ok(p.clone())),
        (None, Some(b)) => Some(b),
        (None, None) => None,
    };
    if let (Ok(()), Some(p)) = (&replayed, said) {
        replayed = match p {
            Ok(p) => {
                server
                    .admin_sql(tools, &format!("SET GLOBAL gtid_slave_pos = '{p}'"))
                    .await
            }
            Err(e) => Err(e),
        };
    }
    let stopped = server.stop(tools, "mariadbd shutdown after replay").await;
    replayed?;
    stopped?;
    Ok(oracle)
}

/// The server's `gtid_slave_pos`, read as a position (its text is the data's: never put
/// in a statement as read).
async fn slave_pos(
    server: &PrivateServer,
    tools: &Tools,
) -> Result<tidemark_core::GtidPos, RestoreError> {
    let text = server
        .admin_query(tools, "SELECT @@GLOBAL.gtid_slave_pos")
        .await?;
    tidemark_core::GtidPos::parse(text.trim()).map_err(|e| RestoreError::Tool {
        step: "reading the restored server's gtid_slave_pos".into(),
        status: e.to_string(),
        tail: String::new(),
    })
}

#[allow(clippy::too_many_arguments)]
async fn replay_into(
    server: &mut PrivateServer,
    tools: &Tools,
    files: &[PathBuf],
    plan: &RestorePlan,
    stop: Timestamp,
    work: &Path,
    scans: Option<&[Option<crate::applier::Scan>]>,
    progress: &dyn Progress,
) -> Result<(), RestoreError> {
    // One pass per timeline, in order: the parent's events up to the switch, then the next
    // timeline's after it (mariadb-binlog refuses, rightly, one stream of two servers'
    // files whose numbers go back).
    let runs = plan.replay_runs(files.len());
    for (i, run) in runs.iter().enumerate() {
        let files = run_files(files, run, i)?;
        // Made anew for each run: whatever the run before did to its account is undone.
        let login = server.account(tools, Account::Replay).await?;
        if let Some(scan) = scans.and_then(|s| s.get(i)).and_then(Option::as_ref) {
            tracing::info!(
                timeline = run.timeline,
                "replaying {} transaction(s), {} through the applier, in {} part(s)",
                scan.transactions,
                scan.through_applier(),
                scan.pieces.len()
            );
            crate::applier::apply_run(
                server, tools, run, files, scan, &login, stop, work, progress,
            )
            .await?;
            continue;
        }
        let offset = if i == 0 {
            plan.start_position.as_ref()
        } else {
            None
        };
        replay_run(
            &server.socket,
            &login,
            tools,
            files,
            run,
            offset,
            stop,
            work,
        )
        .await?;
    }
    Ok(())
}

/// The downloaded files of run `i`.
fn run_files<'a>(
    files: &'a [PathBuf],
    run: &tidemark_core::restore::ReplayRun,
    i: usize,
) -> Result<&'a [PathBuf], RestoreError> {
    files
        .get(run.first..run.first + run.count)
        .ok_or_else(|| RestoreError::Tool {
            step: "planning the replay".into(),
            status: format!(
                "run {i} names segments {}..{}",
                run.first,
                run.first + run.count
            ),
            tail: String::new(),
        })
}

/// How each run goes through the applier ([`crate::applier::scan`]); `None` for a run the
/// scan cannot read as `mariadb-binlog` would — it goes through `mariadb-binlog | mariadb`
/// whole, which judges it as it always did.
async fn scan_runs(
    files: &[PathBuf],
    plan: &RestorePlan,
    stop: Timestamp,
    applier: bool,
) -> Result<Vec<Option<crate::applier::Scan>>, RestoreError> {
    let runs = plan.replay_runs(files.len()).into_owned();
    let mut jobs = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let start = match (&run.start_after, plan.start_position.as_ref()) {
            (Some(g), _) => crate::applier::Start::AfterGtid(g.clone()),
            (None, Some(p)) if i == 0 => crate::applier::Start::Offset(p.position),
            (None, _) => crate::applier::Start::Beginning,
        };
        if files.is_empty() {
            continue;
        }
        jobs.push((
            run_files(files, run, i)?.to_vec(),
            start,
            run.stop_at.clone(),
            run.timeline,
        ));
    }
    tokio::task::spawn_blocking(move || {
        jobs.into_iter()
            .map(|(paths, start, until, timeline)| {
                let offset = match &start {
                    crate::applier::Start::Offset(o) => *o,
                    _ => 0,
                };
                let found = match crate::applier::scan(&paths, start, until.as_ref(), stop) {
                    Ok(mut s) => {
                        s.settle(crate::applier::MIN_APPLIER_PIECE);
                        match s.system_rows.take() {
                            Some(rows) => Err(rows),
                            None => Ok(Some(s)),
                        }
                    }
                    Err(e) => {
                        if applier {
                            tracing::warn!(
                                timeline,
                                "the applier path cannot replay this timeline ({e}): \
                                 through mariadb-binlog | mariadb"
                            );
                        }
                        // What the scan cannot follow is checked whole, every event.
                        match crate::applier::find_system_rows(&paths, offset) {
                            Ok(Some(rows)) => Err(rows),
                            Ok(None) => Ok(None),
                            Err(e) => {
                                return Err(RestoreError::Tool {
                                    step: format!("reading the binlogs of timeline {timeline}"),
                                    status: e.to_string(),
                                    tail: String::new(),
                                });
                            }
                        }
                    }
                };
                found.map_err(|rows| RestoreError::SystemRows {
                    segment: paths
                        .get(rows.at.file)
                        .and_then(|p| p.file_name())
                        .map(|n| n.to_string_lossy().escape_debug().to_string())
                        .unwrap_or_default(),
                    offset: rows.at.offset,
                    gtid: rows.gtid.map(|g| g.to_string()),
                    table: rows.table,
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| RestoreError::Tool {
        step: "reading the binlogs before the replay".into(),
        status: e.to_string(),
        tail: String::new(),
    })?
}

/// Replays one run of segments (`mariadb-binlog … | mariadb`) as `login`.
#[allow(clippy::too_many_arguments)]
async fn replay_run(
    socket: &Path,
    login: &Login,
    tools: &Tools,
    files: &[PathBuf],
    run: &tidemark_core::restore::ReplayRun,
    offset: Option<&LogPosition>,
    stop: Timestamp,
    work: &Path,
) -> Result<(), RestoreError> {
    let mut binlog = crate::server::decoder(&tools.mariadb_binlog, work, stop)?;
    match (&run.start_after, offset) {
        // By GTID: what the backup (or the parent timeline) holds is skipped, whatever the
        // file it is in; mariadb-binlog checks that the files hold every transaction after.
        (Some(g), _) => {
            // Strict (the default since 10.8, said so it stays): sequence numbers must
            // grow in each domain, and the start must come before the stop.
            binlog
                .arg("--gtid-strict-mode")
                .arg(format!("--start-position={g}"));
        }
        (None, Some(p)) => {
            binlog.arg(format!("--start-position={}", p.position));
        }
        (None, None) => {}
    }
    if let Some(g) = &run.stop_at {
        binlog.arg(format!("--stop-position={g}"));
    }
    binlog.args(files);
    let step = format!("mariadb-binlog (timeline {})", run.timeline);
    let (b, c) = crate::server::decode_into(
        &mut binlog,
        &tools.mariadb_binlog,
        &tools.mariadb,
        login,
        socket,
        work,
    )
    .await?;
    // mariadb-binlog reports a GTID gap or a number going back on stderr, and sometimes
    // exits 0 after it: an ERROR line fails the replay as well.
    let said = String::from_utf8_lossy(&b.stderr);
    if !b.status.success() || said.lines().any(|l| l.starts_with("ERROR:")) {
        return Err(RestoreError::Tool {
            step,
            status: b.status.to_string(),
            tail: tail(&said),
        });
    }
    if !c.status.success() {
        return Err(RestoreError::Tool {
            step: "mariadb (applying the binlog events)".into(),
            status: c.status.to_string(),
            tail: tail(&String::from_utf8_lossy(&c.stderr)),
        });
    }
    Ok(())
}

/// Runs a tool with its output appended to `log`; on failure the error carries the end of
/// that output.
async fn run_logged(
    program: &OsString,
    args: &[String],
    log: &Path,
    step: &str,
) -> Result<(), RestoreError> {
    let out = spawn(
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        program,
    )?
    .wait_with_output()
    .await
    .map_err(|source| RestoreError::Spawn {
        program: program.to_string_lossy().into_owned(),
        source,
    })?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = f.write_all(text.as_bytes());
        }
    }
    if out.status.success() {
        Ok(())
    } else {
        Err(RestoreError::Tool {
            step: step.into(),
            status: out.status.to_string(),
            tail: tail(&text),
        })
    }
}

/// The MySQL backup (a clone or a dump) a restore plan restores, when it is one: `None`
/// for mariabackup chains.
///
/// # Errors
/// A chain that mixes a MySQL backup with other backups (one is always a full).
pub fn mysql_of(plan: &RestorePlan) -> Result<Option<&Metadata>, RestoreError> {
    let mysql = |m: &Metadata| m.method == crate::clone::METHOD || m.method == crate::dump::METHOD;
    let clones = plan.backups.iter().filter(|m| mysql(m)).count();
    match (clones, &plan.backups[..]) {
        (0, _) => Ok(None),
        (1, [m]) => Ok(Some(m)),
        _ => Err(RestoreError::Method {
            id: plan.backups[0].backup_id.clone(),
            method: format!(
                "{} in a chain of {}",
                plan.backups
                    .iter()
                    .find(|m| mysql(m))
                    .map_or(crate::clone::METHOD, |m| m.method.as_str()),
                plan.backups.len()
            ),
        }),
    }
}
