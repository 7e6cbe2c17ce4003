//! Standalone mode (`tidemark run`): the schedules, binlog archiving and retention of each
//! BackupPolicy on one machine, each as its own task — a long pass or consolidation never
//! delays a scheduled backup — with all durable state in the store:
//!
//! - `_state/lease.json`: which runner works on the cluster (a second one is refused,
//!   naming the first);
//! - `_state/run.json`: each schedule's status, the last retention pass, and a journal of
//!   attempts in flight (written before a backup starts, so a runner that dies during one
//!   leaves a record the next start finds and records as failed — only those).
//!
//! A task that fails backs off by the error's class (exponential for a store that is away,
//! a long pause for what a person must fix) instead of retrying at once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use tidemark_api::schedule::{IMMEDIATE_BACKUP_LABEL, SCHEDULED_BACKUP_LABEL};
use tidemark_core::Policy;
use tidemark_core::schedule::{Child, ScheduleSpec, ScheduleStatus};
use tidemark_store::catalog::Catalog;
use tidemark_store::format::{BackupType, Metadata, MetadataPhase};
use tidemark_store::state::{self, RunState, StoredState};
use tidemark_store::transfer::{AttemptSpec, new_backup_id};
use tidemark_store::{ClusterStore, NoProgress, StoreError};
use tokio::sync::{Mutex, watch};
use tracing::Instrument;

use crate::attempt::{BackupRequest, BackupRunner, record_failed};
use crate::clock::Clock;
use crate::error::{EngineError, chain};
use crate::fence::{Fence, FenceOptions, Wait};
use crate::pass::{Consolidator, PassRequest, unattended_pass};
use crate::schedule::{self, ScheduleState, Started, Tick};

/// The error recorded for an attempt a previous run died during.
const INTERRUPTED: &str =
    "interrupted: tidemark run stopped during this backup (found in its journal at start-up)";
/// Longest sleep between looks at a schedule: a clock that jumps is noticed within it.
const MAX_NAP: Duration = Duration::from_secs(60);

/// What runs under one BackupPolicy.
#[derive(Debug, Clone)]
pub struct PolicyRun {
    /// The BackupPolicy's name.
    pub name: String,
    pub store: ClusterStore,
    pub retention: Option<RetentionRun>,
    pub archive: Option<ArchiveRun>,
    pub schedules: Vec<ScheduleRun>,
    /// S3 Object Lock of committed backups (the store is opened with its mode).
    pub object_lock: Option<tidemark_core::lock::ObjectLock>,
    /// Restore tests on a schedule (`spec.restoreTest`).
    pub restore_test: Option<RestoreTestRun>,
    /// Verification on a schedule (`spec.verify.schedule`).
    pub verify: Option<VerifyRun>,
    /// Copies of the store (`spec.copies`), sent and kept by the runner.
    pub copies: Vec<CopyRun>,
}

/// A copy of the policy's store (`spec.copies[]`): sent every `every`, under the copy's own
/// lease (held for the whole run), and kept by its own retention.
#[derive(Debug, Clone)]
pub struct CopyRun {
    pub name: String,
    pub store: ClusterStore,
    /// What the copy keeps (its own rules, else the policy's, else everything).
    pub policy: Policy,
    /// The copy's retention pass, when it has rules (its own or the policy's).
    pub retention: Option<RetentionRun>,
    /// How far the copy may fall behind before the run says so (`maxLag`).
    pub max_lag: SignedDuration,
    /// How often a copy pass runs.
    pub every: Duration,
    /// The copy's transfer rate limit (`bandwidth`).
    pub bandwidth: Option<Arc<tidemark_store::bandwidth::Bandwidth>>,
    /// The copy's own scheduled verification (`copies[].verify`), read from the copy.
    pub verify: Option<VerifyRun>,
    /// The copy's own restore tests (`copies[].restoreTest`), restored from the copy.
    pub restore_test: Option<RestoreTestRun>,
}

/// A policy's scheduled verification: when, and how much besides the newest chain.
#[derive(Debug, Clone)]
pub struct VerifyRun {
    pub cron: tidemark_core::schedule::Cron,
    pub time_zone: jiff::tz::TimeZone,
    /// The fraction of the other backups and segments read (0 to 1).
    pub sample: f64,
}

/// A policy's restore tests: when, which point, what to check, and with what.
#[derive(Debug, Clone)]
pub struct RestoreTestRun {
    pub cron: tidemark_core::schedule::Cron,
    pub time_zone: jiff::tz::TimeZone,
    /// `Newest` or `Random`.
    pub point: tidemark_mariadb::check::Point,
    pub check: tidemark_mariadb::check::CheckSpec,
    pub tools: tidemark_mariadb::restore::Tools,
    /// Where the scratch data directory goes.
    pub scratch: PathBuf,
}

#[derive(Debug, Clone)]
pub struct RetentionRun {
    pub policy: Policy,
    /// The policy as written, for the audit record.
    pub as_given: serde_json::Value,
    pub interval: SignedDuration,
    /// The DeleteHooks run before the pass deletes backups.
    pub hooks: Option<Arc<dyn crate::pass::DeleteHooks>>,
    /// The policy file's `tidemark.io/allow-deletions-before`: the deletion guard's
    /// acknowledgement.
    pub allow_deletions_before: Option<Timestamp>,
}

#[derive(Debug, Clone)]
pub struct ArchiveRun {
    /// The server's binlog index file.
    pub binlog_index: PathBuf,
    pub interval: SignedDuration,
    /// How far the archive may fall behind the server before the run says so
    /// (`spec.binlogArchive.maxLag`).
    pub max_lag: SignedDuration,
    /// The restore oracle's checksums (`spec.binlogArchive.checksums`; issue 48).
    pub checksums: Option<ChecksumsRun>,
}

/// The restore oracle's checksum runs on the server (`spec.binlogArchive.checksums`).
#[derive(Debug, Clone)]
pub struct ChecksumsRun {
    pub every: Duration,
    pub settings: tidemark_mariadb::oracle::Settings,
    /// The client program (`mariadb`, or `mysql` for a MySQL source).
    pub client: PathBuf,
    /// Its connection options.
    pub client_args: Vec<String>,
}

/// A ScheduledBackup and what its backups run.
#[derive(Debug, Clone)]
pub struct ScheduleRun {
    pub spec: ScheduleSpec,
    /// `exec` (default), `mariabackup`, …
    pub method: String,
    /// The local command whose stdout is the backup.
    pub command: Vec<String>,
    /// Each backup's own time to live (recorded in its `metadata.json`).
    pub ttl: Option<tidemark_core::RetentionDuration>,
    /// Scheduled incrementals (seed 002, method `mariabackup`): `Some(max)` makes each
    /// backup an incremental on the newest restorable backup of this schedule, a full when
    /// there is none or its chain holds `max` increments (`None`: forever incremental).
    pub incremental: Option<Option<u32>>,
    /// The schedule's own compression, overriding the policy's (`None`: the policy's).
    pub compression: Option<tidemark_core::compression::Compression>,
}

/// How the runner behaves.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// On shutdown, how long a running backup may take to finish.
    pub grace: Duration,
    /// The TTL of the store leases the runner holds.
    pub fence: FenceOptions,
}

/// One policy's shared pieces.
struct Ctx {
    name: String,
    store: ClusterStore,
    state: Mutex<StoredState>,
    runner: Arc<dyn BackupRunner>,
    consolidator: Arc<dyn Consolidator>,
    clock: Arc<dyn Clock>,
    object_lock: Option<tidemark_core::lock::ObjectLock>,
    /// The store's lease, held for the whole run; retention deletes only under it.
    fence: Arc<Fence>,
    /// One restore test at a time per policy, whichever store it restores (its own or a
    /// copy's): each one runs a MariaDB server on a full restore in scratch space.
    restore_test_turn: tokio::sync::Semaphore,
}

impl Ctx {
    /// Applies `change` to the state and writes it; the state changes only if the write is
    /// known to have reached the store.
    async fn update(&self, change: impl FnOnce(&mut RunState)) -> Result<(), StoreError> {
        let mut state = self.state.lock().await;
        let mut next = state.state.clone();
        change(&mut next);
        state.save_as(&self.store, next).await
    }
}

/// Runs every policy until `shutdown` resolves (or a lease is lost).
///
/// # Guarantees
/// Each policy's retention runs only under its store's lease, held for the whole run: a
/// second runner is refused, and a lease lost stops the run and its pass before anything more
/// is deleted.
///
/// # Errors
/// A cluster's lease is held by another runner (nothing is started), a lease was lost
/// while running, or the state could not be read.
pub async fn run(
    policies: Vec<PolicyRun>,
    runner: Arc<dyn BackupRunner>,
    consolidator: Arc<dyn Consolidator>,
    clock: Arc<dyn Clock>,
    options: RunOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), EngineError> {
    let holder = crate::fence::holder("tidemark run");
    let mut fences: Vec<Arc<Fence>> = Vec::new();
    async fn release_all(fences: Vec<Arc<Fence>>) {
        for f in fences {
            // Every task that shared it has ended; a fence still shared is dropped (and
            // released in the background).
            if let Ok(f) = Arc::try_unwrap(f) {
                f.release().await;
            }
        }
    }
    for p in &policies {
        // The directory is this configuration's alone: never an operator policy's or
        // another machine's `tidemark run`.
        let me = state::Owner {
            format_version: state::STATE_FORMAT_VERSION,
            kind: "tidemark run".into(),
            namespace: None,
            name: p.name.clone(),
            uid: None,
            // Not the host: a container re-created under another name is the same runner.
            host: None,
            since: clock.now(),
            extra: [("lastHost".to_owned(), state::host_name().into())]
                .into_iter()
                .collect(),
        };
        if let Err(e) = state::claim_owner(&p.store, &me).await {
            release_all(fences).await;
            return Err(match e {
                state::OwnerError::Taken { .. } => EngineError::Input(e.to_string()),
                state::OwnerError::Store(s) => s.into(),
            });
        }
        // The store's lease, and each copy's, held for the run: one runner (and one deleter,
        // one copier) there.
        for store in std::iter::once(&p.store).chain(p.copies.iter().map(|c| &c.store)) {
            let taken = Fence::acquire(
                store,
                &holder,
                Arc::clone(&clock),
                options.fence,
                Wait::No,
                |_| {},
            )
            .await;
            match taken {
                Ok(f) => fences.push(Arc::new(f)),
                Err(e) => {
                    release_all(fences).await;
                    return Err(e);
                }
            }
        }
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let (fatal_tx, mut fatal_rx) = tokio::sync::mpsc::unbounded_channel::<EngineError>();
    let mut tasks = tokio::task::JoinSet::new();
    let mut held = fences.iter().cloned();
    for p in policies {
        let Some(fence) = held.next() else {
            break;
        };
        let copy_fences: Vec<Arc<Fence>> = held.by_ref().take(p.copies.len()).collect();
        let loaded = StoredState::load(&p.store).await?;
        let ctx = Arc::new(Ctx {
            name: p.name.clone(),
            store: p.store.clone(),
            state: Mutex::new(loaded),
            runner: Arc::clone(&runner),
            consolidator: Arc::clone(&consolidator),
            clock: Arc::clone(&clock),
            object_lock: p.object_lock,
            fence: Arc::clone(&fence),
            restore_test_turn: tokio::sync::Semaphore::new(1),
        });
        tracing::info!(
            "policy {}: store {} cluster {}; {} schedule(s){}{}",
            p.name,
            p.store.url,
            p.store.cluster,
            p.schedules.len(),
            p.retention
                .as_ref()
                .map(|r| format!(", retention every {:#}", r.interval))
                .unwrap_or_default(),
            p.archive
                .as_ref()
                .map(|a| format!(
                    ", binlogs from {} every {:#}",
                    a.binlog_index.display(),
                    a.interval
                ))
                .unwrap_or_default()
        );
        recover_journal(&ctx, &p.schedules).await?;
        for s in p.schedules {
            let span = tracing::info_span!("schedule", name = %s.spec.name);
            tasks.spawn(
                schedule_task(Arc::clone(&ctx), s, stop_rx.clone(), options.grace).instrument(span),
            );
        }
        if let Some(r) = p.retention {
            let span = tracing::info_span!("retention", policy = %p.name);
            tasks.spawn(retention_task(Arc::clone(&ctx), r, stop_rx.clone()).instrument(span));
        }
        if let Some(t) = p.restore_test {
            let span = tracing::info_span!("restore-test", policy = %p.name);
            tasks.spawn(
                restore_test_task(Arc::clone(&ctx), p.store.clone(), t, stop_rx.clone())
                    .instrument(span),
            );
        }
        if let Some(v) = p.verify {
            let span = tracing::info_span!("verify", policy = %p.name);
            tasks.spawn(
                verify_task(Arc::clone(&ctx), p.store.clone(), v, stop_rx.clone()).instrument(span),
            );
        }
        if let Some(c) = p.archive.as_ref().and_then(|a| a.checksums.clone()) {
            let span = tracing::info_span!("checksums", policy = %ctx.name);
            tasks.spawn(checksums_task(Arc::clone(&ctx), c, stop_rx.clone()).instrument(span));
        }
        if let Some(a) = p.archive {
            let span = tracing::info_span!("binlogs", policy = %p.name);
            tasks.spawn(archive_task(Arc::clone(&ctx), a, stop_rx.clone()).instrument(span));
        }
        // Records of copies this configuration no longer names go: the store keeps
        // nothing for them any more (the configuration, like a policy's spec, says which
        // copies there are; a copy's data is never touched by this).
        // (Under the lease, as every listing: a server that pages without end is stopped
        // with it.)
        let recorded = fence
            .guard(async {
                state::load_copies(&p.store)
                    .await
                    .map_err(EngineError::from)
            })
            .await;
        match recorded {
            Ok(records) => {
                for r in records
                    .iter()
                    .filter(|r| !p.copies.iter().any(|c| c.name == r.name))
                {
                    tracing::info!(
                        "policy {}: the configuration no longer names the copy {:?} ({}): its record goes",
                        p.name,
                        r.name,
                        r.destination
                    );
                    state::forget_copy(&p.store, &r.name).await?;
                }
            }
            Err(e) => return Err(e),
        }
        for c in &p.copies {
            // Before the first retention pass: the store keeps what the copy has not
            // received from now on.
            let destination = format!("{}/{}", c.store.url, c.store.cluster);
            crate::copy::declare(&p.store, &c.name, &destination, clock.now()).await?;
        }
        for (mut c, copy_fence) in p.copies.into_iter().zip(copy_fences) {
            // The copy's own checks read the copy's store, never the policy's.
            if let Some(t) = c.restore_test.take() {
                let span = tracing::info_span!("restore-test", policy = %p.name, copy = %c.name);
                tasks.spawn(
                    restore_test_task(Arc::clone(&ctx), c.store.clone(), t, stop_rx.clone())
                        .instrument(span),
                );
            }
            if let Some(v) = c.verify.take() {
                let span = tracing::info_span!("verify", policy = %p.name, copy = %c.name);
                tasks.spawn(
                    verify_task(Arc::clone(&ctx), c.store.clone(), v, stop_rx.clone())
                        .instrument(span),
                );
            }
            let span = tracing::info_span!("copy", policy = %p.name, copy = %c.name);
            tasks.spawn(
                copy_task(
                    Arc::clone(&ctx),
                    c,
                    Arc::clone(&copy_fence),
                    stop_rx.clone(),
                )
                .instrument(span),
            );
            tasks.spawn(watch_fence(copy_fence, stop_rx.clone(), fatal_tx.clone()));
        }
        tasks.spawn(watch_fence(fence, stop_rx.clone(), fatal_tx.clone()));
    }
    drop(fatal_tx);
    let fatal = tokio::select! {
        () = shutdown => None,
        e = fatal_rx.recv() => e,
    };
    tracing::info!("stopping: no new backups");
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    release_all(fences).await;
    match fatal {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Records the attempts the journal says a previous run died during as failed (only
/// those: an uncommitted directory that is not in the journal is not this runner's).
async fn recover_journal(ctx: &Ctx, schedules: &[ScheduleRun]) -> Result<(), EngineError> {
    let journal = ctx.state.lock().await.state.running.clone();
    if journal.is_empty() {
        return Ok(());
    }
    for (schedule, a) in &journal {
        let Some(sched) = schedules.iter().find(|s| s.spec.name == *schedule) else {
            continue;
        };
        let spec = child_spec(
            sched,
            &a.backup_name,
            &a.backup_id,
            a.started_at,
            a.immediate,
        );
        if record_failed(&ctx.store, &spec, INTERRUPTED)
            .await?
            .is_some()
        {
            tracing::warn!(
                "{schedule}: backup {}/{} was interrupted by a previous run; recorded as failed",
                a.backup_name,
                a.backup_id
            );
        }
    }
    ctx.update(|s| s.running.clear()).await?;
    Ok(())
}

/// The spec of a generated backup.
fn child_spec(
    sched: &ScheduleRun,
    name: &str,
    id: &str,
    started_at: Timestamp,
    immediate: bool,
) -> AttemptSpec {
    let ext = match sched.method.as_str() {
        tidemark_mariadb::METHOD => tidemark_mariadb::EXT,
        tidemark_mariadb::clone::METHOD => tidemark_mariadb::clone::EXT,
        tidemark_mariadb::dump::METHOD => tidemark_mariadb::dump::EXT,
        _ => "bin",
    };
    let mut labels = BTreeMap::new();
    labels.insert(SCHEDULED_BACKUP_LABEL.to_owned(), sched.spec.name.clone());
    if immediate {
        labels.insert(IMMEDIATE_BACKUP_LABEL.to_owned(), "true".to_owned());
    }
    AttemptSpec {
        backup_name: name.to_owned(),
        backup_id: id.to_owned(),
        kind: BackupType::Full,
        parent_id: None,
        method: sched.method.clone(),
        payload_name: format!("backup.{ext}"),
        started_at,
        labels,
        ttl: sched.ttl,
        lock_until: None,
    }
}

/// Sleeps `d` or until told to stop; `false` when told to stop.
async fn nap(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return false;
    }
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        _ = stop.changed() => !*stop.borrow(),
    }
}

fn until(clock: &dyn Clock, at: Option<Timestamp>) -> Duration {
    let Some(at) = at else { return Duration::ZERO };
    let d = at.duration_since(clock.now());
    Duration::try_from(d).unwrap_or(Duration::ZERO).min(MAX_NAP)
}

async fn schedule_task(
    ctx: Arc<Ctx>,
    sched: ScheduleRun,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) {
    let mut failures = 0u32;
    loop {
        let status = ctx
            .state
            .lock()
            .await
            .state
            .schedules
            .get(&sched.spec.name)
            .cloned()
            .unwrap_or_default();
        let now = ctx.clock.now();
        let wait = if status.next_schedule_time.is_none_or(|n| n <= now) {
            match tick(&ctx, &sched, &mut stop, grace).await {
                Ok(()) => {
                    failures = 0;
                    Duration::ZERO
                }
                Err(e) => {
                    failures += 1;
                    let pause = e.class().backoff(failures);
                    tracing::warn!(
                        "{}: {}; retrying in {}s",
                        sched.spec.name,
                        chain(&e),
                        pause.as_secs()
                    );
                    pause
                }
            }
        } else {
            until(ctx.clock.as_ref(), status.next_schedule_time)
        };
        if !nap(wait.max(Duration::from_millis(100)), &mut stop).await {
            return;
        }
    }
}

/// `_state/run.json` as the schedules' [`ScheduleState`].
#[async_trait::async_trait]
impl ScheduleState for Ctx {
    async fn status(&self, schedule: &str) -> ScheduleStatus {
        self.state
            .lock()
            .await
            .state
            .schedules
            .get(schedule)
            .cloned()
            .unwrap_or_default()
    }

    async fn record(
        &self,
        schedule: &str,
        status: &ScheduleStatus,
        starting: Option<&Started>,
    ) -> Result<(), EngineError> {
        self.update(|s| {
            s.schedules.insert(schedule.to_owned(), status.clone());
            if let Some(a) = starting {
                s.running.insert(
                    schedule.to_owned(),
                    state::JournaledAttempt {
                        backup_name: a.backup_name.clone(),
                        backup_id: a.backup_id.clone(),
                        started_at: a.started_at,
                        immediate: a.immediate,
                    },
                );
            }
        })
        .await
        .map_err(EngineError::from)
    }

    async fn ended(&self, schedule: &str) -> Result<(), EngineError> {
        self.update(|s| {
            s.running.remove(schedule);
        })
        .await
        .map_err(EngineError::from)
    }
}

/// One evaluation of a schedule, and the backup it starts (awaited here: the next slot
/// of this schedule waits for it, nothing else does).
async fn tick(
    ctx: &Ctx,
    sched: &ScheduleRun,
    stop: &mut watch::Receiver<bool>,
    grace: Duration,
) -> Result<(), EngineError> {
    let catalog = Catalog::load_backups(&ctx.store, &NoProgress).await?;
    let name = &sched.spec.name;
    let now = ctx.clock.now();
    match schedule::tick(
        &sched.spec,
        &children(&catalog, name),
        ctx,
        now,
        new_backup_id,
    )
    .await?
    {
        Tick::Start { slot, attempt } => {
            let mut spec = child_spec(
                sched,
                &attempt.backup_name,
                &attempt.backup_id,
                attempt.started_at,
                attempt.immediate,
            );
            let parent = parent_of(&catalog, sched);
            let kind = match &parent {
                Ok(p) => {
                    spec.kind = BackupType::Incremental;
                    spec.parent_id = Some(p.backup_id.clone());
                    format!("incremental on {}", p.backup_id)
                }
                Err(Some(why)) => format!("full: {why}"),
                Err(None) => "full".to_owned(),
            };
            // Seed 002: a full is locked until its chain's last increment's slot plus the
            // period; an increment asks for its own start plus the period and takes its
            // chain's date when that is later (transfer::chain_lock).
            spec.lock_until = ctx.object_lock.map(|lock| {
                let chain_end = match (parent.is_ok(), sched.incremental) {
                    (false, Some(Some(max))) => tidemark_core::lock::chain_end(
                        &sched.spec.cron,
                        &sched.spec.time_zone,
                        slot,
                        max,
                    ),
                    _ => None,
                };
                // An increment counts from its slot, as its chain's date does.
                let from = if parent.is_ok() {
                    slot
                } else {
                    spec.started_at
                };
                lock.until(from, chain_end)
            });
            tracing::info!(
                "{name}: slot {slot}{} → backup {}/{} started ({kind})",
                if attempt.immediate {
                    " (immediate)"
                } else {
                    ""
                },
                spec.backup_name,
                spec.backup_id
            );
            take(ctx, sched, spec, parent.ok().cloned(), stop, grace).await;
            if let Err(e) = ScheduleState::ended(ctx, name).await {
                // The journal keeps the attempt; the next start finds it committed.
                tracing::warn!("{name}: could not clear the journal entry: {}", chain(&e));
            }
        }
        Tick::Adopted { name: child, slot } => tracing::info!(
            "{name}: slot {slot}: backup {child} already exists and is ours; adopted"
        ),
        Tick::Skipped { name: child, slot } => tracing::warn!(
            "{name}: slot {slot} skipped: the name {child} is taken by a backup not labelled {SCHEDULED_BACKUP_LABEL}={name}; resuming at the next slot"
        ),
        Tick::Nothing => {}
    }
    Ok(())
}

/// With scheduled incrementals, the parent's `metadata.json` (seed 002): the newest
/// restorable `mariabackup` backup of this schedule, unless its chain is full. `Err` for
/// a full, with the reason when incrementals are on.
fn parent_of<'a>(
    catalog: &'a Catalog,
    sched: &ScheduleRun,
) -> Result<&'a Metadata, Option<tidemark_core::FullBecause>> {
    let Some(max) = sched.incremental else {
        return Err(None);
    };
    let lineage = crate::parent::ParentLineage {
        label: SCHEDULED_BACKUP_LABEL,
        value: &sched.spec.name,
        others_are_other_sources: false,
    };
    crate::parent::next_parent(catalog, &lineage, max).map_err(Some)
}

/// Takes one backup, letting it finish within `grace` when told to stop.
async fn take(
    ctx: &Ctx,
    sched: &ScheduleRun,
    spec: AttemptSpec,
    parent: Option<Metadata>,
    stop: &mut watch::Receiver<bool>,
    grace: Duration,
) {
    let request = BackupRequest {
        spec: spec.clone(),
        command: sched.command.clone(),
        parent,
        detach: true,
        tools: tidemark_mariadb::restore::Tools::default(),
    };
    let name = &sched.spec.name;
    // A boxed future (async_trait): dropping it below stops the attempt for real.
    let store = match sched.compression {
        Some(c) => ctx.store.clone().with_compression(c),
        None => ctx.store.clone(),
    };
    let mut run = ctx.runner.run(&store, &request, &NoProgress);
    let stopped = async {
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    let result = tokio::select! {
        r = &mut run => Some(r),
        () = stopped => None,
    };
    let result = match result {
        Some(r) => Some(r),
        None => {
            tracing::info!(
                "{name}: waiting up to {}s for backup {}/{} to finish",
                grace.as_secs(),
                spec.backup_name,
                spec.backup_id
            );
            tokio::time::timeout(grace, &mut run).await.ok()
        }
    };
    match result {
        Some(Ok(m)) => tracing::info!(
            "{name}: backup {}/{} completed ({} bytes)",
            m.backup_name,
            m.backup_id,
            m.payload.iter().map(|p| p.size).sum::<u64>()
        ),
        Some(Err(f)) => tracing::warn!(
            "{name}: backup {}/{} failed{}: {}",
            spec.backup_name,
            spec.backup_id,
            if f.recorded.is_some() {
                " (recorded as failed)"
            } else {
                ""
            },
            chain(&f.error)
        ),
        None => {
            // Dropping the attempt kills the command (kill_on_drop) and abandons the upload.
            drop(run);
            let why = format!(
                "stopped: tidemark run was asked to stop and the backup did not finish within {}s",
                grace.as_secs()
            );
            match record_failed(&ctx.store, &spec, &why).await {
                Ok(_) => tracing::warn!(
                    "{name}: backup {}/{} did not finish in time; recorded as failed",
                    spec.backup_name,
                    spec.backup_id
                ),
                Err(e) => tracing::warn!(
                    "{name}: backup {}/{} did not finish in time; it stays in the journal and is recorded as failed at the next start ({})",
                    spec.backup_name,
                    spec.backup_id,
                    chain(&e)
                ),
            }
        }
    }
}

/// The backups that concern a schedule: those labelled as its own, and any under one of
/// its deterministic names.
fn children(catalog: &Catalog, schedule: &str) -> Vec<Child> {
    let prefix = format!("{schedule}-");
    catalog
        .backups
        .iter()
        .filter_map(|b| {
            let labels = b.metadata.as_ref().map(|m| &m.labels);
            let ours = labels
                .and_then(|l| l.get(SCHEDULED_BACKUP_LABEL))
                .is_some_and(|v| v == schedule);
            if !ours && !b.backup.name.starts_with(&prefix) {
                return None;
            }
            Some(Child {
                name: b.backup.name.clone(),
                ours,
                immediate: labels
                    .and_then(|l| l.get(IMMEDIATE_BACKUP_LABEL))
                    .is_some_and(|v| v == "true"),
                // A schedule's backups run in its own task, so none of its children can be
                // running while it evaluates: an uncommitted one is a past attempt.
                done: b.metadata.as_ref().is_none_or(|m| {
                    matches!(m.phase, MetadataPhase::Completed | MetadataPhase::Failed)
                }),
                slot: Some(b.backup.started_at),
            })
        })
        .collect()
}

async fn retention_task(ctx: Arc<Ctx>, r: RetentionRun, mut stop: watch::Receiver<bool>) {
    let mut failures = 0u32;
    loop {
        let last = ctx.state.lock().await.state.last_retention_run_time;
        let now = ctx.clock.now();
        let due_at = last.map(|t| tidemark_core::saturating_add(t, r.interval));
        let wait = if due_at.is_none_or(|d| now >= d) {
            match retention(&ctx, &r, now).await {
                Ok(()) => {
                    failures = 0;
                    until(
                        ctx.clock.as_ref(),
                        Some(tidemark_core::saturating_add(now, r.interval)),
                    )
                }
                Err(e) => {
                    failures += 1;
                    let pause = e.class().backoff(failures);
                    tracing::warn!("retention: {}; retrying in {}s", chain(&e), pause.as_secs());
                    pause
                }
            }
        } else {
            until(ctx.clock.as_ref(), due_at)
        };
        if !nap(wait.max(Duration::from_millis(100)), &mut stop).await {
            return;
        }
    }
}

async fn retention(ctx: &Ctx, r: &RetentionRun, now: Timestamp) -> Result<(), EngineError> {
    let request = PassRequest {
        hooks: r.hooks.clone(),
        policy: r.policy.clone(),
        policy_as_given: r.as_given.clone(),
        now,
        started_at: now,
        protect: Default::default(),
        restores: Vec::new(),
        execute: true,
        ignore_malformed: false,
        recorded_hooks: crate::pass::RecordedHooks::RunByCaller,
        override_primary_gate: false,
        allow_deletions_before: r.allow_deletions_before,
        compare_with: None,
    };
    unattended_pass(
        &ctx.store,
        &request,
        Some(&ctx.fence),
        Some(ctx.consolidator.as_ref()),
    )
    .await?;
    ctx.update(|s| s.last_retention_run_time = Some(now))
        .await?;
    Ok(())
}

/// Waits for the next slot of `cron` after now; `false` when told to stop or the schedule
/// has no more slots (`what` names the work in the log).
async fn next_slot(
    ctx: &Ctx,
    cron: &tidemark_core::schedule::Cron,
    tz: &jiff::tz::TimeZone,
    what: &str,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let Some(slot) = cron.next_after(ctx.clock.now(), tz) else {
        tracing::info!("{what}: the schedule has no more slots");
        return false;
    };
    while ctx.clock.now() < slot {
        if !nap(
            until(ctx.clock.as_ref(), Some(slot)).max(Duration::from_millis(100)),
            stop,
        )
        .await
        {
            return false;
        }
    }
    true
}

/// Ends when the runner is told to stop.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Verifies `store` (the policy's, or a copy's) at each slot of its schedule while the
/// runner runs (a slot missed while it was stopped is not made up): the newest backup, its
/// chain and the binlogs a restore from it replays, and the sample of the rest. Each
/// outcome is logged; a problem is a warning, never a stop.
async fn verify_task(
    ctx: Arc<Ctx>,
    store: ClusterStore,
    v: VerifyRun,
    mut stop: watch::Receiver<bool>,
) {
    while next_slot(&ctx, &v.cron, &v.time_zone, "verification", &mut stop).await {
        tracing::info!("verification started");
        let request = crate::verify::VerifyRequest { sample: v.sample };
        let verified = tokio::select! {
            r = crate::verify::verify(&store, &request) => r,
            () = stopped(&mut stop) => {
                tracing::info!("verification stopped: shutting down");
                return;
            }
        };
        match verified {
            Ok(Some(found)) if found.problems == 0 => tracing::info!(
                "verification: {} backup(s) and {} binlog segment(s) read back whole{}",
                found.backups.len(),
                found.segments.checked,
                found
                    .newest
                    .as_deref()
                    .map(|id| format!(" (the newest, {id}, with its chain)"))
                    .unwrap_or_default()
            ),
            Ok(Some(found)) => tracing::warn!(
                "verification FAILED: {} problem(s) among {} backup(s) and {} binlog segment(s); `tidemark verify` names them",
                found.problems,
                found.backups.len(),
                found.segments.checked
            ),
            Ok(None) => tracing::warn!("verification: no committed backup in the store"),
            Err(e) => tracing::warn!("verification could not read the store: {}", chain(&e)),
        }
    }
}

/// Runs a restore test of `store` (the policy's, or a copy's) at each slot of its schedule
/// while the runner runs (a slot missed while it was stopped is not made up). Each outcome
/// is logged and recorded beside the backup restored; a failed check is a warning, never a
/// stop.
async fn restore_test_task(
    ctx: Arc<Ctx>,
    store: ClusterStore,
    t: RestoreTestRun,
    mut stop: watch::Receiver<bool>,
) {
    while next_slot(&ctx, &t.cron, &t.time_zone, "restore tests", &mut stop).await {
        tracing::info!("restore test of the {:?} point started", t.point);
        let db = crate::restore::MariaDbTools {
            tools: t.tools.clone(),
        };
        let request = crate::restore::RestoreTestRequest {
            point: t.point,
            scratch: t.scratch.clone(),
            check: t.check.clone(),
            by: "tidemark run".into(),
            run_id: None,
        };
        let test = async {
            // One at a time per policy: a copy's test waits for the store's, and the other
            // way round.
            let _turn = ctx.restore_test_turn.acquire().await;
            crate::restore::restore_test(&db, &store, &request, &NoProgress).await
        };
        // Told to stop: the test goes (its server and tools are killed, its scratch
        // directory removed), it does not hold the shutdown.
        let tested = tokio::select! {
            r = test => r,
            () = stopped(&mut stop) => {
                tracing::info!("restore test stopped: shutting down");
                return;
            }
        };
        match tested {
            Ok(r) if r.outcome.passed => tracing::info!(
                "restore test of {} ({}/{}): passed, {} table(s) checked{} in {} s",
                r.target,
                r.backup_name,
                r.backup_id,
                r.outcome.tables_checked,
                r.outcome
                    .oracle_chunks
                    .map(|n| format!(", {n} chunk(s) of the restore oracle compared"))
                    .unwrap_or_default(),
                r.seconds
            ),
            Ok(r) => tracing::warn!(
                "restore test of {} ({}/{}): FAILED: {}",
                r.target,
                r.backup_name,
                r.backup_id,
                r.outcome.problems.join("; ")
            ),
            Err(e) => tracing::warn!("restore test could not restore: {}", chain(&e)),
        }
    }
}

async fn archive_task(ctx: Arc<Ctx>, a: ArchiveRun, mut stop: watch::Receiver<bool>) {
    let every = Duration::try_from(a.interval).unwrap_or(Duration::from_secs(10));
    let mut failures = 0u32;
    let mut archiver = crate::archive::Archiver::new(a.max_lag);
    loop {
        let source = crate::archive::BinlogSource::Index(
            &a.binlog_index,
            tidemark_mariadb::archive::Primary::PointedAt,
        );
        let wait = match archiver.pass(&ctx.store, source).await {
            Ok(crate::archive::Archived { report: r, lag }) => {
                failures = 0;
                // Loud when the archive falls behind the server, and when it is back.
                match lag {
                    Some((true, m)) => {
                        tracing::warn!("binlogs ({}): {m} (spec.binlogArchive.maxLag)", ctx.name)
                    }
                    Some((false, m)) => tracing::info!("binlogs ({}): {m}", ctx.name),
                    None => {}
                }
                if !r.uploaded.is_empty() || !r.adopted.is_empty() {
                    tracing::info!(
                        "binlogs: archived {} ({} bytes)",
                        r.uploaded.len() + r.adopted.len(),
                        r.bytes
                    );
                }
                every
            }
            Err(e) => {
                failures += 1;
                let pause = e.class().backoff(failures).max(every);
                tracing::warn!(
                    "binlogs ({}): {}; retrying in {}s",
                    ctx.name,
                    chain(&e),
                    pause.as_secs()
                );
                pause
            }
        };
        if !nap(wait, &mut stop).await {
            return;
        }
    }
}

/// Writes the restore oracle's checksums every `c.every` (a run never overlaps the one
/// before); a run that fails is said, with the rights it needs, and the next is tried on
/// time. A stop ends a run in progress (its chunks so far stay: each is whole).
async fn checksums_task(ctx: Arc<Ctx>, c: ChecksumsRun, mut stop: watch::Receiver<bool>) {
    use tidemark_mariadb::oracle;
    let now = || u64::try_from(ctx.clock.now().as_second()).unwrap_or_default();
    // A restarted runner waits for its turn after the newest run on the server.
    let newest = oracle::newest_run(c.client.as_os_str(), &c.client_args).await;
    if !nap(oracle::first_wait(newest, now(), c.every), &mut stop).await {
        return;
    }
    let mut last = 0u64;
    loop {
        let started = tokio::time::Instant::now();
        last = oracle::run_number(now(), last);
        let run = tidemark_mariadb::oracle::write_run(
            c.client.as_os_str(),
            &c.client_args,
            last,
            &c.settings,
        );
        tokio::select! {
            r = run => match r {
                Ok(r) => tracing::info!("checksums ({}): {}", ctx.name, r.line()),
                Err(e) => tracing::warn!(
                    "checksums ({}): {e} ({})",
                    ctx.name,
                    tidemark_mariadb::oracle::rights(c.client.as_os_str() == "mysql")
                ),
            },
            _ = stop.changed() => return,
        }
        if !nap(c.every.saturating_sub(started.elapsed()), &mut stop).await {
            return;
        }
    }
}

/// Sends the policy's store to a copy every `every`, then runs the copy's own retention
/// when it is due; loud (a warning) while the copy is more than `maxLag` behind, and when
/// it has caught up again. A failure backs off and never stops the runner.
async fn copy_task(ctx: Arc<Ctx>, c: CopyRun, fence: Arc<Fence>, mut stop: watch::Receiver<bool>) {
    let mut failures = 0u32;
    let mut behind = false;
    let mut last_retention: Option<Timestamp> = None;
    loop {
        let request = crate::copy::CopyRequest {
            name: c.name.clone(),
            policy: c.policy.clone(),
            now: ctx.clock.now(),
            bandwidth: c.bandwidth.clone(),
            dry_run: false,
        };
        let pass =
            crate::copy::copy_pass(&ctx.store, &c.store, &request, Some(&fence), &NoProgress);
        let copied = tokio::select! {
            r = pass => r,
            () = stopped(&mut stop) => return,
        };
        let wait = match copied {
            Ok(o) => {
                failures = 0;
                if !o.backups_sent.is_empty() || o.segments_sent > 0 {
                    tracing::info!(
                        "copy {}: sent {} backup(s) and {} segment(s), {} bytes",
                        c.name,
                        o.backups_sent.len(),
                        o.segments_sent,
                        o.bytes
                    );
                }
                for f in &o.failures {
                    tracing::warn!("copy {}: {f}", c.name);
                }
                let lag = o.lag(ctx.clock.now());
                match (lag > c.max_lag, behind) {
                    (true, _) => tracing::warn!(
                        "copy {} is {:#} behind the store (maxLag {:#})",
                        c.name,
                        lag.round(jiff::Unit::Second).unwrap_or(lag),
                        c.max_lag
                    ),
                    (false, true) => tracing::info!("copy {} has caught up", c.name),
                    _ => {}
                }
                behind = lag > c.max_lag;
                c.every
            }
            Err(e) => {
                failures += 1;
                let pause = e.class().backoff(failures).max(c.every);
                tracing::warn!(
                    "copy {}: {}; retrying in {}s",
                    c.name,
                    chain(&e),
                    pause.as_secs()
                );
                pause
            }
        };
        if let Some(r) = &c.retention {
            let now = ctx.clock.now();
            if last_retention.is_none_or(|t| now >= tidemark_core::saturating_add(t, r.interval)) {
                let request = crate::copy::retention_request(
                    &r.policy,
                    r.as_given.clone(),
                    now,
                    r.allow_deletions_before,
                );
                match unattended_pass(&c.store, &request, Some(&fence), None).await {
                    Ok(_) => last_retention = Some(now),
                    Err(e) => tracing::warn!("copy {}: retention: {}", c.name, chain(&e)),
                }
            }
        }
        if !nap(wait.max(Duration::from_millis(100)), &mut stop).await {
            return;
        }
    }
}

/// Stops the runner when `fence` is lost (its retention pass is stopped by the fence
/// itself).
async fn watch_fence(
    fence: Arc<Fence>,
    mut stop: watch::Receiver<bool>,
    fatal: tokio::sync::mpsc::UnboundedSender<EngineError>,
) {
    tokio::select! {
        e = fence.lost() => {
            let _ = fatal.send(e);
        }
        _ = stop.wait_for(|s| *s) => {}
    }
}
