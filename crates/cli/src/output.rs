//! The `--output json` contract (docs/cli.md). Fields are added, never renamed or removed;
//! `formatVersion` changes only if a field's meaning would.

use jiff::Timestamp;
use serde::Serialize;
use std::io::Write;
use tidemark_core::{Action, BackupDecision, BackupKind, Phase, Plan, RecoveryWindow};
use tidemark_store::{ExecutionReport, Malformed, Survey};

use crate::exit::{CliError, Exit};

/// Version of this JSON contract.
pub const JSON_FORMAT_VERSION: u32 = 1;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupOut {
    pub backup_id: String,
    pub backup_name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub parent_id: Option<String>,
    pub phase: &'static str,
    pub started_at: Timestamp,
    pub completed_at: Option<Timestamp>,
    pub size: u64,
    /// S3 Object Lock: the backup cannot be deleted before then (absent: not locked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub immutable_until: Option<Timestamp>,
    /// `keep`, `delete` or `consolidate` (plan and gc only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// Every reason for the action (plan and gc only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<String>>,
    /// Whether it can be restored: completed, every payload object present with its
    /// recorded size, and the same for its whole chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restorable: Option<bool>,
    /// Why it cannot be restored (a payload object missing or of another size), or why its
    /// metadata.json cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// How its payload is compressed, e.g. `zstd` (ls only; absent: not compressed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// How its payload is encrypted: `scheme` and the `recipients`' fingerprints, i.e.
    /// which identity a fetch or restore needs (ls only; absent: not encrypted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encryption: Option<tidemark_store::format::Encryption>,
    /// Where the binlog stood: its GTID position (`gtid`), and the file and offset on the
    /// server it was taken on (ls only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_position: Option<tidemark_store::format::LogPosition>,
    /// The server it was taken on: `serverId`, `role` (`primary`, `replica`), a replica's
    /// `lagSeconds` (ls only, when recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<tidemark_store::format::SourceServer>,
    /// Its position lies on a branch of the log archive (transactions a failover lost): it
    /// restores to its own point only, never with the main line's binlogs.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub on_branch: bool,
}

pub fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Completed => "completed",
        Phase::Failed => "failed",
        Phase::InProgress => "inProgress",
        Phase::Uncommitted => "uncommitted",
        Phase::Malformed => "malformed",
    }
}

impl BackupOut {
    pub fn from_backup(b: &tidemark_core::Backup) -> Self {
        BackupOut {
            backup_id: b.id.clone(),
            backup_name: b.name.clone(),
            kind: match b.kind {
                BackupKind::Full => "full",
                BackupKind::Incremental(_) => "incremental",
            },
            parent_id: b.kind.parent().cloned(),
            phase: phase_name(b.phase),
            started_at: b.started_at,
            completed_at: b.completed_at,
            size: b.size,
            immutable_until: b.immutable_until,
            action: None,
            reasons: None,
            restorable: None,
            problem: None,
            compression: None,
            encryption: None,
            log_position: None,
            server: None,
            on_branch: false,
        }
    }

    fn from_decision(d: &BackupDecision, restorable: bool, problem: Option<String>) -> Self {
        BackupOut {
            action: Some(d.action),
            reasons: Some(d.reasons.iter().map(ToString::to_string).collect()),
            restorable: Some(restorable),
            problem,
            ..BackupOut::from_backup(&d.backup)
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentsOut {
    /// Keys relative to the store URL, e.g. `<cluster>/binlogs/mysql-bin.000041`.
    pub delete: Vec<String>,
    /// Index entries whose object is already gone.
    pub drop_from_index: Vec<String>,
    pub delete_bytes: u64,
    pub keep: usize,
    pub kept_unknown_last_event: usize,
    /// Segments behind the horizon kept because they are on a branch (off the main line)
    /// within the window or not acknowledged (`--acknowledge-branches`).
    pub kept_branch: usize,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SummaryOut {
    pub backups: usize,
    pub keep: usize,
    pub delete: usize,
    pub delete_bytes: u64,
    pub segments_delete: usize,
    /// Kept only because a retained increment builds on them (reason `chain:<id>` alone):
    /// a forever-incremental chain without `consolidate` keeps these for ever (seed 002).
    pub kept_only_for_chains: usize,
    pub kept_only_for_chains_bytes: u64,
}

/// The debris of interrupted work a pass collects.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftoversOut {
    /// Keys relative to the store URL (an upload's with its upload id).
    pub delete: Vec<String>,
    pub delete_bytes: u64,
    /// Leftovers kept: too young, or owned by a running attempt.
    pub keep: usize,
}

/// `tidemark plan` / `tidemark gc` output.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanOut {
    pub format_version: u32,
    pub store: String,
    pub cluster: String,
    pub now: Timestamp,
    pub dry_run: bool,
    pub policy: serde_json::Value,
    pub backups: Vec<BackupOut>,
    pub segments: SegmentsOut,
    pub horizon: Option<Timestamp>,
    /// After the pass.
    pub recovery_window: Option<RecoveryWindow>,
    pub foreign: Vec<String>,
    pub malformed: Vec<Malformed>,
    /// Index entries outside the layout's grammar: left alone.
    pub ignored: Vec<Malformed>,
    pub leftovers: LeftoversOut,
    pub summary: SummaryOut,
    /// The log archive's timelines.
    pub timelines: Vec<TimelineOut>,
    /// Locked chains recorded as expired, whose objects the bucket's lifecycle rule is to
    /// remove (seed 002): in no plan, restore or window.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub expired: Vec<tidemark_store::catalog::ExpiredBackup>,
    /// The bucket's lifecycle rules and what they mean for expired chains, when the store
    /// leaves them to the bucket (`afterExpiry: lifecycle`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<LifecycleOut>,
    /// The operator recorded that its cluster has no established primary (seed 000):
    /// gc deletes nothing meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_primary: Option<GateOut>,
    /// What gc did (absent for plan).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub executed: Option<ExecutionReport>,
    /// The deletion guard's judgement (DESIGN.md §5.5): what it holds and why.
    pub deletion_guard: tidemark_core::guard::Verdict,
    /// `plan --against` / `--with`: the policy change previewed (the plan above is the new
    /// policy's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<tidemark_core::preview::PolicyChange>,
}

/// Seed 000's gate, closed, as the store records it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GateOut {
    /// Who recorded it (`tidemark-operator <namespace>/<policy>`).
    pub writer: String,
    pub since: jiff::Timestamp,
    pub message: String,
}

/// The bucket's lifecycle rules as `plan` reports them.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleOut {
    pub rules: Vec<tidemark_store::lifecycle::Rule>,
    #[serde(flatten)]
    pub verdict: tidemark_store::lifecycle::Verdict,
    /// What is wrong, for people; absent when a rule removes expired chains in time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

impl LifecycleOut {
    pub fn new(
        (rules, verdict): (
            Vec<tidemark_store::lifecycle::Rule>,
            tidemark_store::lifecycle::Verdict,
        ),
    ) -> Self {
        LifecycleOut {
            problem: verdict.problem(),
            rules,
            verdict,
        }
    }
}

impl PlanOut {
    pub fn new(
        store: &tidemark_store::ClusterStore,
        survey: &Survey,
        policy: serde_json::Value,
        executed: Option<ExecutionReport>,
    ) -> Self {
        let plan: &Plan = &survey.plan;
        let seg_key = |name: &str| format!("{}/binlogs/{name}", store.cluster);
        let deletions: Vec<&BackupDecision> = plan.deletions().collect();
        PlanOut {
            format_version: JSON_FORMAT_VERSION,
            store: store.url.clone(),
            cluster: store.cluster.clone(),
            now: plan.now,
            dry_run: executed.is_none(),
            policy,
            backups: {
                let restorable = tidemark_core::standing(&survey.inventory).restorable;
                plan.backups
                    .iter()
                    .map(|d| {
                        let stored = survey.catalog.backup(&d.backup.name, &d.backup.id);
                        BackupOut::from_decision(
                            d,
                            restorable.contains(&d.backup.id),
                            stored.and_then(|b| b.problem.clone()),
                        )
                    })
                    .collect()
            },
            segments: SegmentsOut {
                delete: plan
                    .segments
                    .delete
                    .iter()
                    .map(|d| seg_key(&d.name))
                    .collect(),
                drop_from_index: plan
                    .segments
                    .drop_from_index
                    .iter()
                    .map(|e| e.name.clone())
                    .collect(),
                delete_bytes: plan.segments.delete.iter().map(|d| d.size).sum(),
                keep: plan.segments.keep,
                kept_unknown_last_event: plan.segments.kept_unknown_last_event,
                kept_branch: plan.segments.kept_branch,
            },
            horizon: plan.horizon,
            recovery_window: plan.recovery_window.clone(),
            foreign: survey.catalog.foreign.clone(),
            malformed: survey.catalog.malformed.clone(),
            ignored: survey.catalog.ignored.clone(),
            leftovers: LeftoversOut {
                delete: plan
                    .leftovers
                    .delete
                    .iter()
                    .map(|d| match &d.leftover.upload_id {
                        Some(id) => format!("{}/{} (upload {id})", store.cluster, d.leftover.key),
                        None => format!("{}/{}", store.cluster, d.leftover.key),
                    })
                    .collect(),
                delete_bytes: plan.leftovers.delete.iter().map(|d| d.leftover.size).sum(),
                keep: plan.leftovers.keep,
            },
            summary: SummaryOut {
                backups: plan.backups.len(),
                keep: plan.backups.len() - deletions.len(),
                delete: deletions.len(),
                delete_bytes: deletions.iter().map(|d| d.backup.size).sum(),
                segments_delete: plan.segments.delete.len(),
                kept_only_for_chains: plan.kept_only_for_chains().count(),
                kept_only_for_chains_bytes: plan
                    .kept_only_for_chains()
                    .map(|d| d.backup.size)
                    .sum(),
            },
            timelines: timelines_out(&survey.inventory),
            expired: survey.catalog.expired.clone(),
            lifecycle: None,
            no_primary: None,
            deletion_guard: Default::default(),
            change: None,
            executed,
        }
    }
}

/// A run of missing segment sequence numbers.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MissingRange {
    pub from: u64,
    pub to: u64,
    /// Whether a restorable backup's replay would need these segments (a hole before
    /// every backup's replay start is harmless, e.g. next to an old segment kept because
    /// its last event time is unknown).
    pub affects_recovery: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveOut {
    pub segments: usize,
    pub first: Option<String>,
    pub last: Option<String>,
    pub bytes: u64,
    /// Sequence numbers absent from the index between the first and the last segment of
    /// one timeline.
    pub missing: Vec<MissingRange>,
    pub unknown_last_event: usize,
    /// The archive's timelines: one per primary (and per binlog that started over).
    pub timelines: Vec<TimelineOut>,
    /// What the binlog archiver saw at its last pass (absent: none has run).
    pub archiver: Option<ArchiverOut>,
}

/// The binlog archiver's last pass, and how far the archive is behind the server.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiverOut {
    pub observed_at: Timestamp,
    pub server_id: Option<u32>,
    pub timeline: u32,
    pub primary_last_event_at: Option<Timestamp>,
    pub archived_last_event_at: Option<Timestamp>,
    /// The server's newest event against the newest archived; when the last pass is older
    /// than [`ARCHIVER_SILENT_AFTER`], now against the newest archived.
    pub lag_seconds: i64,
    /// The last pass is older than [`ARCHIVER_SILENT_AFTER`]: the archiver is not running.
    pub silent: bool,
}

/// How old the archiver's last pass may be before `ls` calls it silent.
pub const ARCHIVER_SILENT_AFTER: jiff::SignedDuration = jiff::SignedDuration::from_secs(300);

impl ArchiverOut {
    pub fn of(s: &tidemark_store::state::ArchiverStatus, now: Timestamp) -> Self {
        ArchiverOut {
            observed_at: s.observed_at,
            server_id: s.server_id,
            timeline: s.timeline,
            primary_last_event_at: s.primary_last_event_at,
            archived_last_event_at: s.archived_last_event_at,
            lag_seconds: s.lag(now, ARCHIVER_SILENT_AFTER).as_secs(),
            silent: s.silent(now, ARCHIVER_SILENT_AFTER),
        }
    }
}

/// One timeline of the log archive.
pub type TimelineOut = tidemark_core::timeline::TimelineSummary;

/// The archive's timelines as an inventory holds them.
pub fn timelines_out(inventory: &tidemark_core::Inventory) -> Vec<TimelineOut> {
    tidemark_core::timeline::summaries(inventory)
}

/// The lines `ls` and `plan` print about timelines, when there is more than one.
pub fn timeline_lines(timelines: &[TimelineOut]) -> String {
    if timelines.len() < 2 {
        return String::new();
    }
    let mut s = String::from("Timelines (one per primary; replay follows the main line):\n");
    let server =
        |id: Option<u32>| id.map_or_else(|| "unknown server".to_owned(), |i| format!("server {i}"));
    for t in timelines {
        let span = match (&t.first, &t.last) {
            (Some(f), Some(l)) if f == l => format!("{} segment(s), {f}", t.segments),
            (Some(f), Some(l)) => format!("{} segment(s), {f} … {l}", t.segments),
            _ => "no segments yet".to_owned(),
        };
        let role = if t.main_line {
            ""
        } else {
            " [off the main line]"
        };
        s.push_str(&format!(
            "  timeline {} ({}): {span}{role}\n",
            t.id,
            server(t.server_id)
        ));
        if let (Some(sw), Some(p)) = (&t.switch, t.parent) {
            let from = timelines
                .iter()
                .find(|x| x.id == p)
                .and_then(|x| x.server_id);
            let at = sw.at.map_or_else(String::new, |a| format!(" at {a}"));
            s.push_str(&format!(
                "    switch from {} (timeline {p}) to {} after {}{at}\n",
                server(from),
                server(t.server_id),
                sw.gtid
            ));
            if sw.unrelated {
                s.push_str(
                    "    unrelated: the histories share no transaction (a binlog that started over), so replay does not join them: a gap until the next backup\n",
                );
            }
            if !sw.missing.is_empty() {
                s.push_str(&format!(
                    "    MISSING at the switch (a gap): {}\n",
                    tidemark_core::gtid::runs_text(&sw.missing)
                ));
            }
            if !t.branch.is_empty() {
                s.push_str(&format!(
                    "    branch of timeline {p}, lost in the failover and never replayed: {}\n",
                    t.branch.join(", ")
                ));
            }
        }
    }
    s
}

/// `tidemark ls` output.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LsOut {
    pub format_version: u32,
    pub store: String,
    pub cluster: String,
    pub backups: Vec<BackupOut>,
    pub recovery_window: Option<RecoveryWindow>,
    pub archive: ArchiveOut,
    pub foreign: Vec<String>,
    pub malformed: Vec<Malformed>,
    /// Index entries outside the layout's grammar: left alone.
    pub ignored: Vec<Malformed>,
    /// The copies of this store (issue 44), as their copiers recorded them here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<CopyOut>,
}

/// One copy of the store, from its record in the store (`_state/copies/<name>.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyOut {
    pub name: String,
    /// Where the copy is, as its copier wrote it.
    pub destination: String,
    /// When its last pass ended.
    pub last_pass_at: jiff::Timestamp,
    /// The newest restorable instant in the copy at that pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copied_through: Option<jiff::Timestamp>,
    /// How far the copy is behind this store's newest restorable instant now.
    pub lag_seconds: i64,
    /// What its last pass could not send.
    pub failures: usize,
}

impl CopyOut {
    /// The copy `r` against this store's newest restorable instant `newest` (else the one
    /// the record saw).
    pub fn of(
        r: &tidemark_store::state::CopyRecord,
        newest: Option<jiff::Timestamp>,
        now: jiff::Timestamp,
    ) -> CopyOut {
        let lag = tidemark_engine::copy::lag(newest.or(r.source_newest_at), r.copy_newest_at, now);
        CopyOut {
            name: r.name.clone(),
            destination: r.destination.clone(),
            last_pass_at: r.observed_at,
            copied_through: r.copy_newest_at,
            lag_seconds: lag.as_secs(),
            failures: r.failures.len(),
        }
    }
}

/// `1.5 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Renders rows as aligned columns.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_owned()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// The recovery window in one line: `FROM → TO (no gaps)`, or with its gaps; under a
/// point-in-time window that starts after the oldest snapshot, `point in time from FROM →
/// TO …; snapshots back to OLDEST`.
pub fn window_line(w: &Option<RecoveryWindow>) -> String {
    let Some(w) = w else {
        return "no restorable backup".to_owned();
    };
    let span = if w.gaps.is_empty() {
        format!("{} → {} (no gaps)", w.point_in_time_from, w.to)
    } else {
        let gaps: Vec<String> = w
            .gaps
            .iter()
            .map(|g| format!("{} → {}", g.from, g.to))
            .collect();
        format!(
            "{} → {} with {} gap(s): {}",
            w.point_in_time_from,
            w.to,
            w.gaps.len(),
            gaps.join(", ")
        )
    };
    if w.point_in_time_from > w.from {
        format!("point in time from {span}; snapshots back to {}", w.from)
    } else {
        span
    }
}

/// What `restore --output json` prints (with `--dry-run`, before anything is written).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreOut {
    pub format_version: u32,
    pub target: Timestamp,
    pub recovery_window: RecoveryWindow,
    /// The chain, base full first; the last one is the backup restored.
    pub backups: Vec<RestoreBackupOut>,
    /// Binlog segments replayed, in order.
    pub segments: Vec<tidemark_mariadb::restore::ReplaySegment>,
    /// Replay starts in the first segment at this file offset (a backup that records no
    /// GTID position); otherwise `null`, and replay skips by GTID (`runs[].startAfter`).
    pub start_position: Option<tidemark_store::format::LogPosition>,
    /// The segments in one pass per timeline: `first`/`count` index `segments`; replay
    /// applies the transactions after `startAfter` and stops after `stopAt` (a switch).
    pub runs: Vec<tidemark_core::restore::ReplayRun>,
    /// Events stamped at or after this instant are not replayed.
    pub stop_datetime: Option<Timestamp>,
    pub dry_run: bool,
    /// The data directory written (absent with --dry-run).
    pub datadir: Option<std::path::PathBuf>,
    pub bytes_downloaded: Option<u64>,
    /// The instant the restore reached: the last transaction replayed, or the restored
    /// backup's point (absent with --dry-run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reached: Option<Timestamp>,
    /// The GTID position the restored data holds; its binlog and `gtid_slave_pos`
    /// continue from it (absent with --dry-run, or when the backup records none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gtid_position: Option<String>,
    /// `<datadir>/<basename>.state`: the binlog state the restored server starts from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binlog_state_file: Option<std::path::PathBuf>,
    /// The restore oracle (issue 48), where the replayed data holds it: `chunks`
    /// compared and `differences` (each chunk whose data is not the primary's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oracle: Option<tidemark_mariadb::oracle::Comparison>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreBackupOut {
    pub backup_id: String,
    pub backup_name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub completed_at: Option<Timestamp>,
    pub size: u64,
    pub log_position: Option<tidemark_store::format::LogPosition>,
    /// The server it was taken on, when recorded.
    pub server: Option<tidemark_store::format::SourceServer>,
}

/// What `push --output json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PushOut {
    pub backup_id: String,
    pub backup_name: String,
    pub cluster: String,
    pub phase: tidemark_store::format::MetadataPhase,
    /// The payload's key relative to the store URL.
    pub key: Option<String>,
    /// The stored object's size and sha256 (compressed, when it is).
    pub size: u64,
    pub sha256: Option<String>,
    /// `zstd` when compressed (absent otherwise), and the content's size before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_size: Option<u64>,
    /// When encrypted: `{"scheme": "age", "recipients": [fingerprints]}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encryption: Option<tidemark_store::format::Encryption>,
    pub started_at: Timestamp,
    pub completed_at: Option<Timestamp>,
    /// S3 Object Lock: locked until then (absent: not locked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub immutable_until: Option<Timestamp>,
    pub error: Option<String>,
}

impl PushOut {
    pub fn from_metadata(
        store: &tidemark_store::ClusterStore,
        m: &tidemark_store::format::Metadata,
    ) -> Self {
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
            compression: p.and_then(|p| p.compression.clone()),
            original_size: p.and_then(|p| p.original_size),
            encryption: p.and_then(|p| p.encryption.clone()),
            started_at: m.started_at,
            completed_at: m.completed_at,
            immutable_until: m.immutable_until,
            error: m.error.clone(),
        }
    }
}

/// What `archive-binlogs --output json` prints for each pass.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchivePassOut {
    /// Closed files uploaded and indexed.
    pub uploaded: Vec<String>,
    /// Closed files found already uploaded (an earlier run died before indexing), indexed.
    pub adopted: Vec<String>,
    pub already_indexed: usize,
    /// The file the server is writing (never shipped).
    pub open: Option<String>,
    /// Closed files the server purged before they could be read.
    pub vanished: Vec<String>,
    pub bytes: u64,
    /// The timeline the server's files went to (0: the archive's first).
    pub timeline: u32,
    /// The timeline this pass started, when the server continues none (a promoted replica,
    /// a binlog that started over): its server, parent and switch.
    pub new_timeline: Option<tidemark_core::Timeline>,
    /// The server whose files these are.
    pub server_id: Option<u32>,
    /// The newest event the server had written (the last write to its open file).
    pub primary_last_event_at: Option<Timestamp>,
    /// The newest event archived on the timeline.
    pub archived_last_event_at: Option<Timestamp>,
    /// How far the archive is behind the server: the two above apart (0: caught up).
    pub lag_seconds: Option<i64>,
    /// `--purge-keep`: the server's binlogs purged after the pass (issue 45 §4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purge: Option<tidemark_mariadb::purge::PurgeReport>,
    /// `--purge-replica`: each replica's purge, by the same rule.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub purge_replicas: Vec<ReplicaPurgeOut>,
    /// `--checksums-every`: the restore oracle's run that ended since the last pass
    /// (issue 48 §1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checksums: Option<crate::checksums::ChecksumsOut>,
}

/// One replica's purge (`--purge-replica`): its report, or why it could not purge.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaPurgeOut {
    /// As given to `--purge-replica`.
    pub server: String,
    #[serde(flatten)]
    pub report: Option<tidemark_mariadb::purge::PurgeReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<tidemark_mariadb::archive::ArchiveReport> for ArchivePassOut {
    fn from(r: tidemark_mariadb::archive::ArchiveReport) -> Self {
        let lag = r.lag().as_secs();
        let tidemark_mariadb::archive::ArchiveReport {
            uploaded,
            adopted,
            already_indexed,
            open,
            vanished,
            bytes,
            timeline,
            new_timeline,
            server_id,
            primary_last_event_at,
            archived_last_event_at,
        } = r;
        let lag_seconds = primary_last_event_at.map(|_| lag);
        ArchivePassOut {
            uploaded,
            adopted,
            already_indexed,
            open,
            vanished,
            bytes,
            timeline,
            new_timeline,
            server_id,
            primary_last_event_at,
            archived_last_event_at,
            lag_seconds,
            purge: None,
            checksums: None,
            purge_replicas: Vec::new(),
        }
    }
}

/// One line about a timeline an archive pass started: the new server, and where it
/// continues its parent.
pub fn timeline_started(t: &tidemark_core::Timeline) -> String {
    let server = t
        .server_id
        .map_or_else(|| "an unknown server".to_owned(), |s| format!("server {s}"));
    let mut line = format!(
        "a new server writes the binlog: timeline {} ({server}) continues timeline {}",
        t.id,
        t.parent.unwrap_or(0)
    );
    if let Some(sw) = &t.switch {
        line.push_str(&format!(" after {}", sw.gtid));
        if let Some(at) = sw.at {
            line.push_str(&format!(" ({at})"));
        }
        if !sw.missing.is_empty() {
            line.push_str(&format!(
                "; MISSING from the archive: {}",
                tidemark_core::gtid::runs_text(&sw.missing)
            ));
        }
    }
    line
}

/// What `simulate --output json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimulateOut<'a> {
    pub format_version: u32,
    pub schedule: &'a str,
    pub policy: serde_json::Value,
    pub backup_size: u64,
    pub days: &'a [tidemark_core::simulate::SimDay],
    /// `--against CURRENT.yaml`: the same simulation under that policy, and the two side
    /// by side per day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub against: Option<SimulateAgainst<'a>>,
}

/// `simulate --against`: the current policy's simulation and the comparison.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimulateAgainst<'a> {
    pub policy: serde_json::Value,
    pub days: &'a [tidemark_core::simulate::SimDay],
    pub comparison: Vec<SimCompared>,
}

/// One day under the current policy (`now`) and the new one (`new`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimCompared {
    pub day: u32,
    pub date: jiff::civil::Date,
    pub kept_now: usize,
    pub kept_new: usize,
    pub window_seconds_now: i64,
    pub window_seconds_new: i64,
    pub stored_bytes_now: u64,
    pub stored_bytes_new: u64,
    /// Restore points the current policy keeps that day and the new one does not.
    pub newly_deleted: usize,
    /// Restore points the new policy keeps and the current one does not.
    pub newly_kept: usize,
    /// The instants the current policy's window restores that day and the new one's does
    /// not (it starts later), as `plan --against` says `lost`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<tidemark_core::Interval>,
}

impl SimCompared {
    /// Day by day, `now` beside `new` (the same schedule and days).
    pub fn of(
        now: &[tidemark_core::simulate::SimDay],
        new: &[tidemark_core::simulate::SimDay],
    ) -> Vec<Self> {
        now.iter()
            .zip(new)
            .map(|(a, b)| SimCompared {
                newly_deleted: a.kept.iter().filter(|t| !b.kept.contains(t)).count(),
                newly_kept: b.kept.iter().filter(|t| !a.kept.contains(t)).count(),
                lost: match (a.window_from, b.window_from) {
                    (Some(from), to) if a.window_seconds > 0 => {
                        let end = from + jiff::SignedDuration::from_secs(a.window_seconds);
                        let to = to.map_or(end, |t| t.min(end));
                        if to > from {
                            vec![tidemark_core::Interval { from, to }]
                        } else {
                            Vec::new()
                        }
                    }
                    _ => Vec::new(),
                },
                day: b.day,
                date: b.date,
                kept_now: a.kept.len(),
                kept_new: b.kept.len(),
                window_seconds_now: a.window_seconds,
                window_seconds_new: b.window_seconds,
                stored_bytes_now: a.stored_bytes,
                stored_bytes_new: b.stored_bytes,
            })
            .collect()
    }
}

/// Writes to stdout; a closed pipe (`| head`) ends quietly with success.
pub(crate) fn emit(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::new(Exit::Internal, e)),
    }
}

/// `value` as `format` asks: JSON (docs/cli.md's contract) or the same document as YAML.
pub(crate) fn emit_as(
    format: crate::args::OutputFormat,
    value: &impl serde::Serialize,
) -> Result<(), CliError> {
    emit(&rendered_as(format, value)?)
}

/// The text [`emit_as`] prints.
pub(crate) fn rendered_as(
    format: crate::args::OutputFormat,
    value: &impl serde::Serialize,
) -> Result<String, CliError> {
    let internal =
        |e: &dyn std::fmt::Display| CliError::new(Exit::Internal, anyhow::anyhow!("{e}"));
    Ok(match format {
        crate::args::OutputFormat::Yaml => {
            let json = serde_json::to_value(value).map_err(|e| internal(&e))?;
            serde_saphyr::to_string(&json).map_err(|e| internal(&e))?
        }
        _ => {
            let mut text = serde_json::to_string_pretty(value).map_err(|e| internal(&e))?;
            text.push('\n');
            text
        }
    })
}

/// `text` without control characters (an event's note is anyone's text who may create
/// events there; a record in a store is its writer's: no escape sequence reaches the
/// terminal).
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}
