//! Restore and restore test: one use case for every edge — `tidemark restore` and
//! `restore-test`, `tidemark run`'s scheduled tests, and the operator's restore-test Jobs
//! (which run `tidemark restore-test`). The database is a port ([`Database`]): what
//! prepares backups into a data directory, replays binlogs and checks the result.
//! MariaDB's tools ([`MariaDbTools`]) are the one implementation today.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use jiff::Timestamp;
use tidemark_mariadb::check::{CheckSpec, Point, RestoreTestRecord};
use tidemark_mariadb::restore::{RestorePlan, RestoreReport, Tools};
use tidemark_store::{ClusterStore, Progress};

use crate::error::EngineError;

/// The database a restore brings back.
#[async_trait]
pub trait Database: Send + Sync + std::fmt::Debug {
    /// What a restore to `target` uses (along `timeline`, or the main line): backups,
    /// segments and where the replay starts.
    async fn plan(
        &self,
        store: &ClusterStore,
        target: Timestamp,
        timeline: Option<u32>,
        progress: &dyn Progress,
    ) -> Result<RestorePlan, EngineError>;

    /// Carries `plan` out into the empty (or absent) `datadir`.
    async fn restore(
        &self,
        store: &ClusterStore,
        plan: &RestorePlan,
        datadir: &Path,
        progress: &dyn Progress,
    ) -> Result<RestoreReport, EngineError>;

    /// Restores `request.point` into scratch space, checks it and records the outcome
    /// beside the backup restored.
    async fn restore_test(
        &self,
        store: &ClusterStore,
        request: &RestoreTestRequest,
        progress: &dyn Progress,
    ) -> Result<RestoreTestRecord, EngineError>;
}

/// MariaDB's tools (`mariabackup`, `mbstream`, `mariadbd`, `mariadb-binlog`, `mariadb`).
#[derive(Debug, Clone, Default)]
pub struct MariaDbTools {
    pub tools: Tools,
}

#[async_trait]
impl Database for MariaDbTools {
    async fn plan(
        &self,
        store: &ClusterStore,
        target: Timestamp,
        timeline: Option<u32>,
        progress: &dyn Progress,
    ) -> Result<RestorePlan, EngineError> {
        Ok(tidemark_mariadb::restore::resolve(store, target, timeline, progress).await?)
    }

    async fn restore(
        &self,
        store: &ClusterStore,
        plan: &RestorePlan,
        datadir: &Path,
        progress: &dyn Progress,
    ) -> Result<RestoreReport, EngineError> {
        Ok(tidemark_mariadb::restore::restore(store, plan, datadir, &self.tools, progress).await?)
    }

    async fn restore_test(
        &self,
        store: &ClusterStore,
        request: &RestoreTestRequest,
        progress: &dyn Progress,
    ) -> Result<RestoreTestRecord, EngineError> {
        Ok(tidemark_mariadb::check::restore_test(
            store,
            request.point,
            &request.scratch,
            &self.tools,
            &request.check,
            &request.by,
            request.run_id.as_deref(),
            progress,
        )
        .await?)
    }
}

/// A restore to ask for.
#[derive(Debug, Clone)]
pub struct RestoreRequest {
    /// The instant to restore (`--to`).
    pub target: Timestamp,
    /// Where the data directory goes; `None`: only the plan (a dry run).
    pub datadir: Option<PathBuf>,
    /// Restore along this timeline (`--timeline`): an instant of a history a restore or a
    /// failover abandoned. `None`: the main line.
    pub timeline: Option<u32>,
}

/// What a restore chose, and did.
#[derive(Debug)]
pub struct Restored {
    pub plan: RestorePlan,
    /// `None` for a dry run.
    pub report: Option<RestoreReport>,
}

/// Restores `store` to `request.target` into `request.datadir` (or only plans it).
///
/// # Guarantees
/// Reads the store only. A restore that fails leaves no half-restored data directory
/// (the database's [`Database::restore`] removes what it wrote).
///
/// # Errors
/// The target cannot be restored (outside the window, in a gap, on a branch), a
/// download or a database tool failed.
pub async fn restore(
    db: &dyn Database,
    store: &ClusterStore,
    request: &RestoreRequest,
    progress: &dyn Progress,
) -> Result<Restored, EngineError> {
    // A restore's steps are few and long, each shown; the listing behind the plan is not.
    let plan = db
        .plan(
            store,
            request.target,
            request.timeline,
            &tidemark_store::NoProgress,
        )
        .await?;
    let report = match &request.datadir {
        None => None,
        Some(dir) => Some(db.restore(store, &plan, dir, progress).await?),
    };
    Ok(Restored { plan, report })
}

/// The most steps a [`RestoreSummary`] carries (a chain's steps are few; the summary must
/// fit a pod's termination message, 4 KiB).
pub const MAX_SUMMARY_STEPS: usize = 24;
/// The longest step name a [`RestoreSummary`] carries.
pub const MAX_STEP_NAME: usize = 96;

/// What a restore did, in brief: what the operator's Restore Job reports back (its
/// termination message, `tidemark restore --report-file`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSummary {
    pub bytes_downloaded: u64,
    pub backups_applied: u64,
    pub segments_replayed: u64,
    /// The instant reached: the last transaction replayed, or the restored backup's point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reached: Option<Timestamp>,
    /// The GTID position the restored data holds, which its binlog continues from (at most
    /// [`MAX_GTID_POSITION`] characters; absent when longer or unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid_position: Option<String>,
    /// The restore oracle's chunks compared (issue 48), where the replayed data holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_chunks: Option<u64>,
    /// Those whose data is not the primary's: the first [`MAX_ORACLE_DIFFERENCES`], each at
    /// most [`MAX_STEP_NAME`] characters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oracle_differences: Vec<String>,
    /// The whole restore.
    pub milliseconds: u64,
    /// Each step, from its start to the next one's (the binlogs download while the
    /// backups are prepared, and the increments beside the base: those steps overlap the
    /// next).
    pub steps: Vec<StepTime>,
}

/// `text` in at most `bytes` bytes (whole characters), control characters dropped: what a
/// termination message of 4 KiB can carry.
pub fn bounded_text(text: &str, bytes: usize) -> String {
    let mut out = String::new();
    for c in text.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > bytes {
            break;
        }
        out.push(c);
    }
    out
}

/// The most oracle differences a restore's summary carries.
pub const MAX_ORACLE_DIFFERENCES: usize = 3;

/// The longest GTID position a restore's summary carries (a termination message is 4 KiB).
pub const MAX_GTID_POSITION: usize = 512;

/// Whether `text` is a GTID position short enough for a summary: MariaDB's `D-S-N`
/// entries, comma separated, digits only, or a MySQL GTID set (`uuid:1-5,…`).
pub fn is_gtid_position(text: &str) -> bool {
    text.len() <= MAX_GTID_POSITION
        && !text.is_empty()
        && (text
            .split(',')
            .all(|g| tidemark_core::Gtid::parse(g.trim()).is_ok())
            || tidemark_core::gtidset::GtidSet::parse(text).is_ok())
}

/// One step of a restore and how long it took.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepTime {
    pub name: String,
    pub milliseconds: u64,
    /// The bytes it moved (downloaded, or extracted), when it moves any.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A [`Progress`] that passes everything on to `inner` and times each step.
#[derive(Debug)]
pub struct TimedSteps<P> {
    pub inner: P,
    started: std::time::Instant,
    /// Each step: its name, its start, the bytes reported while it was the latest.
    steps: std::sync::Mutex<Vec<(String, std::time::Instant, u64)>>,
}

impl<P> TimedSteps<P> {
    pub fn new(inner: P) -> Self {
        TimedSteps {
            inner,
            started: std::time::Instant::now(),
            steps: std::sync::Mutex::default(),
        }
    }

    /// The summary of `report`, with the steps timed until now (bounded: the first
    /// [`MAX_SUMMARY_STEPS`] steps, names cut to [`MAX_STEP_NAME`] characters).
    pub fn summary(&self, report: &RestoreReport) -> RestoreSummary {
        let now = std::time::Instant::now();
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let steps = self
            .steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let timed = steps
            .iter()
            .enumerate()
            .take(MAX_SUMMARY_STEPS)
            .map(|(i, (name, at, bytes))| {
                let end = steps.get(i + 1).map_or(now, |(_, next, _)| *next);
                // The binlogs download beside the backups' steps, reported at the end.
                let beside = if name.ends_with(tidemark_mariadb::restore::BINLOG_STEP) {
                    report.binlog_bytes
                } else {
                    0
                };
                StepTime {
                    name: name.chars().take(MAX_STEP_NAME).collect(),
                    milliseconds: ms(end.duration_since(*at)),
                    bytes: bytes.saturating_add(beside),
                }
            })
            .collect();
        RestoreSummary {
            bytes_downloaded: report.bytes_downloaded,
            backups_applied: report.backups_applied as u64,
            segments_replayed: report.segments_replayed as u64,
            reached: report.reached,
            gtid_position: report.gtid_position.clone().filter(|p| is_gtid_position(p)),
            oracle_chunks: report.oracle.as_ref().map(|c| c.chunks),
            oracle_differences: report
                .oracle
                .iter()
                .flat_map(|c| c.differences.iter())
                .take(MAX_ORACLE_DIFFERENCES)
                .map(|d| bounded_text(d, MAX_STEP_NAME))
                .collect(),
            milliseconds: ms(now.duration_since(self.started)),
            steps: timed,
        }
    }
}

impl<P: Progress + ?Sized> Progress for TimedSteps<&P> {
    fn listed(&self, n: usize) {
        self.inner.listed(n);
    }
    fn metadata_read(&self, n: usize) {
        self.inner.metadata_read(n);
    }
    fn deleted(&self, n: usize) {
        self.inner.deleted(n);
    }
    fn step(&self, name: &str, total: usize) {
        self.steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((name.to_owned(), std::time::Instant::now(), 0));
        self.inner.step(name, total);
    }
    fn bytes(&self, n: u64) {
        if let Some(last) = self
            .steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .last_mut()
        {
            last.2 = last.2.saturating_add(n);
        }
        self.inner.bytes(n);
    }
    fn status(&self, what: &str) {
        self.inner.status(what);
    }
}

/// What a restore is asked to bring back, before it is an instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestorePoint {
    /// The newest restorable instant (the end of the recovery window).
    Newest,
    /// A backup's restore point, by id.
    Backup(String),
    /// An instant (`--to`).
    At(Timestamp),
}

/// The instant `point` names in `store` now: the end of the recovery window, a backup's
/// restore point, or the instant given.
///
/// # Errors
/// The store holds no restorable point, or no committed backup of that id; the store
/// failed.
pub async fn restore_instant(
    store: &ClusterStore,
    point: &RestorePoint,
) -> Result<Timestamp, EngineError> {
    let name = |what: &str| format!("{what} in {}/{}", store.url, store.cluster);
    let at = match point {
        RestorePoint::At(t) => return Ok(*t),
        RestorePoint::Newest | RestorePoint::Backup(_) => {
            let catalog = tidemark_store::Catalog::load(store, &tidemark_store::NoProgress).await?;
            let inventory = catalog.inventory(&tidemark_store::SegmentListing::default());
            match point {
                RestorePoint::Backup(id) => inventory
                    .backups
                    .iter()
                    .find(|b| &b.id == id && b.phase == tidemark_core::Phase::Completed)
                    .map(tidemark_core::Backup::restore_point)
                    .ok_or_else(|| {
                        EngineError::Input(name(&format!("no committed backup {id:?}")))
                    })?,
                _ => tidemark_core::plan::standing(&inventory)
                    .window
                    .map(|w| w.to)
                    .ok_or_else(|| EngineError::Input(name("no restorable point")))?,
            }
        }
    };
    Ok(at)
}

/// A restore test to make.
#[derive(Debug, Clone)]
pub struct RestoreTestRequest {
    pub point: Point,
    /// Where the scratch data directory goes (removed afterwards).
    pub scratch: PathBuf,
    pub check: CheckSpec,
    /// What runs it (`tidemark restore-test`, `tidemark run`), in the record.
    pub by: String,
    /// The caller's name for this run (the operator's Job), in the record.
    pub run_id: Option<String>,
}

/// Makes one restore test.
///
/// # Errors
/// Nothing to restore, or the restore failed; the record could not be written. A check
/// that fails is an outcome (`record.outcome.passed`), not an error.
pub async fn restore_test(
    db: &dyn Database,
    store: &ClusterStore,
    request: &RestoreTestRequest,
    progress: &dyn Progress,
) -> Result<RestoreTestRecord, EngineError> {
    db.restore_test(store, request, progress).await
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A database that records what it was asked.
    #[derive(Debug, Default)]
    struct Recording(Mutex<Vec<String>>);

    fn plan(target: Timestamp) -> RestorePlan {
        RestorePlan {
            target,
            backups: Vec::new(),
            segments: Vec::new(),
            start_position: None,
            runs: Vec::new(),
            stop_datetime: None,
            recovery_window: tidemark_core::RecoveryWindow {
                from: target,
                to: target,
                gaps: Vec::new(),
                point_in_time_from: target,
            },
        }
    }

    #[async_trait]
    impl Database for Recording {
        async fn plan(
            &self,
            _: &ClusterStore,
            target: Timestamp,
            _: Option<u32>,
            _: &dyn Progress,
        ) -> Result<RestorePlan, EngineError> {
            self.0.lock().unwrap().push(format!("plan {target}"));
            Ok(plan(target))
        }
        async fn restore(
            &self,
            _: &ClusterStore,
            _: &RestorePlan,
            datadir: &Path,
            _: &dyn Progress,
        ) -> Result<RestoreReport, EngineError> {
            self.0
                .lock()
                .unwrap()
                .push(format!("restore into {}", datadir.display()));
            Ok(RestoreReport {
                datadir: datadir.to_owned(),
                bytes_downloaded: 7,
                binlog_bytes: 0,
                backups_applied: 1,
                segments_replayed: 0,
                reached: None,
                gtid_position: None,
                binlog_state_file: None,
                oracle: None,
            })
        }
        async fn restore_test(
            &self,
            _: &ClusterStore,
            _: &RestoreTestRequest,
            _: &dyn Progress,
        ) -> Result<RestoreTestRecord, EngineError> {
            Err(EngineError::Internal("not asked here".into()))
        }
    }

    /// What a Job reports as the restored position reaches the Restore's status only as a
    /// short list of GTIDs.
    #[test]
    fn a_reported_gtid_position_is_gtids_and_short() {
        assert!(is_gtid_position("0-1-4"));
        assert!(is_gtid_position("0-1-4,1-2-9"));
        assert!(is_gtid_position(
            "7bdd2010-eceb-11f1-abcd-02fc00000001:1-6,aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa:5"
        ));
        assert!(!is_gtid_position("7bdd2010-eceb-11f1:1-6"));
        assert!(!is_gtid_position(""));
        assert!(!is_gtid_position("0-1-4; DROP TABLE x"));
        assert!(!is_gtid_position(&vec!["0-1-4"; 200].join(",")));
    }

    #[tokio::test]
    async fn a_dry_run_plans_and_writes_nothing_a_restore_carries_the_plan_out() {
        let (_dir, store) = tidemark_store::testkit::local_store("c");
        let target: Timestamp = "2026-11-20T14:05:00Z".parse().unwrap();
        let db = Recording::default();
        let dry = RestoreRequest {
            target,
            datadir: None,
            timeline: None,
        };
        let r = restore(&db, &store, &dry, &tidemark_store::NoProgress)
            .await
            .unwrap();
        assert!(r.report.is_none());
        assert_eq!(r.plan.target, target);
        let wet = RestoreRequest {
            target,
            datadir: Some("/restore/here".into()),
            timeline: None,
        };
        let r = restore(&db, &store, &wet, &tidemark_store::NoProgress)
            .await
            .unwrap();
        assert_eq!(r.report.unwrap().bytes_downloaded, 7);
        assert_eq!(
            *db.0.lock().unwrap(),
            [
                format!("plan {target}"),
                format!("plan {target}"),
                "restore into /restore/here".to_owned()
            ]
        );
    }
}
