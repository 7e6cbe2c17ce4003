//! `tidemark run --config DIR`: standalone mode. Schedules, binlog archiving and the
//! throttled retention pass of every BackupPolicy in the directory, on one machine, with
//! all durable state in the store (`_state/run.json`, the backups themselves), so a restart
//! resumes without a duplicate or a lost slot.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use tidemark_api::config::{Document, parse_documents};
use tidemark_api::schedule::{IMMEDIATE_BACKUP_LABEL, SCHEDULED_BACKUP_LABEL};
use tidemark_api::{BackupPolicy, ScheduledBackup};
use tidemark_core::Policy;
use tidemark_core::schedule::{Child, Decision, ScheduleSpec, evaluate};
use tidemark_store::catalog::id_time;
use tidemark_store::format::{BackupType, Metadata, MetadataPhase};
use tidemark_store::state::{Attempt, StoredState};
use tidemark_store::transfer::{self, BackupSpec, Outcome, new_backup_id};
use tidemark_store::{
    Catalog, ClusterStore, ExecOptions, NoProgress, StoreError, SurveyOptions, mariadb,
};
use tokio::task::JoinHandle;

use crate::args::{RunArgs, StoreArgs};
use crate::exit::{CliError, Exit};
use crate::resolve;
use crate::transfer::{Detach, Failed, take_backup};

/// The error recorded for an attempt a previous run died during.
const INTERRUPTED: &str =
    "interrupted: tidemark run stopped during this backup (found at start-up)";

/// How often the loop wakes when nothing is due sooner.
const TICK: Duration = Duration::from_millis(500);

/// One BackupPolicy and what runs under it.
struct Job {
    file: PathBuf,
    policy: BackupPolicy,
    store: ClusterStore,
    retention: Option<Policy>,
    retention_interval: SignedDuration,
    archive: Option<(PathBuf, SignedDuration)>,
    last_archive: Option<Timestamp>,
    schedules: Vec<Schedule>,
    state: StoredState,
}

struct Schedule {
    doc: ScheduledBackup,
    spec: ScheduleSpec,
    running: Option<Running>,
}

struct Running {
    spec: BackupSpec,
    handle: JoinHandle<Result<Metadata, Failed>>,
}

fn log(msg: impl std::fmt::Display) {
    eprintln!("{} {msg}", Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ"));
}

/// Parses `10s`, `5m` (minutes), `1h`.
fn interval(text: &str, field: &str, file: &Path) -> Result<SignedDuration, CliError> {
    text.parse::<SignedDuration>()
        .ok()
        .filter(|d| d.is_positive())
        .ok_or_else(|| {
            CliError::input(format!(
                "{}: {field}: invalid interval {text:?}; expected e.g. 30s, 10m or 1h",
                file.display()
            ))
        })
}

/// Reads every `*.yaml` / `*.yml` file of `dir` and builds the jobs.
fn load(dir: &Path) -> Result<Vec<Job>, CliError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| CliError::input(format!("--config {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut policies: Vec<(PathBuf, BackupPolicy)> = Vec::new();
    let mut schedules: Vec<(PathBuf, ScheduledBackup)> = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f)
            .map_err(|e| CliError::input(format!("{}: {e}", f.display())))?;
        for doc in
            parse_documents(&text).map_err(|e| CliError::input(format!("{}: {e}", f.display())))?
        {
            match doc {
                Document::Policy(p) => policies.push((f.clone(), *p)),
                Document::Schedule(s) => schedules.push((f.clone(), *s)),
            }
        }
    }
    if policies.is_empty() {
        return Err(CliError::input(format!(
            "--config {}: no BackupPolicy found in {} YAML file(s); tidemark run needs at least one (see examples/local/)",
            dir.display(),
            files.len()
        )));
    }
    let now = Timestamp::now();
    let mut jobs = Vec::new();
    for (file, policy) in &policies {
        let name = &policy.metadata.name;
        if policy.spec.object_store.is_none() {
            return Err(CliError::input(format!(
                "{}: BackupPolicy {name}: spec.objectStore: required by tidemark run (where the backups go), e.g. objectStore: {{url: file:///var/backups}}",
                file.display()
            )));
        }
        let open = || {
            resolve::target(
                &StoreArgs {
                    store: None,
                    cluster: None,
                    endpoint: None,
                },
                Some(policy),
                Some(file),
            )
        };
        // A local store directory is created on first use: standalone mode starts empty.
        let store = match open() {
            Err(e) => match e.error.downcast_ref::<StoreError>() {
                Some(StoreError::MissingDirectory { dir, .. }) => {
                    std::fs::create_dir_all(dir).map_err(|io| {
                        CliError::input(format!("cannot create {}: {io}", dir.display()))
                    })?;
                    open()?
                }
                _ => return Err(e),
            },
            ok => ok?,
        }
        .store;
        let retention = policy
            .spec
            .retention
            .as_ref()
            .map(|r| {
                r.to_input(policy.spec.time_zone.as_deref())
                    .validate()
                    .map_err(|e| {
                        CliError::input(format!(
                            "{}: BackupPolicy {name}: spec.retention: {e}",
                            file.display()
                        ))
                    })
            })
            .transpose()?;
        let retention_interval = interval(
            policy.spec.retention_interval.as_deref().unwrap_or("1h"),
            "spec.retentionInterval",
            file,
        )?;
        let archive = policy
            .spec
            .binlog_archive
            .as_ref()
            .map(|a| {
                let every = interval(
                    a.interval.as_deref().unwrap_or("10s"),
                    "spec.binlogArchive.interval",
                    file,
                )?;
                let index = file
                    .parent()
                    .unwrap_or(Path::new("."))
                    .join(&a.binlog_index);
                Ok::<_, CliError>((index, every))
            })
            .transpose()?;
        let mut mine = Vec::new();
        for (sfile, s) in schedules
            .iter()
            .filter(|(_, s)| s.spec.template.policy.name == *name)
        {
            let spec = s
                .schedule_spec(policy.spec.time_zone.as_deref(), now)
                .map_err(|e| {
                    CliError::input(format!(
                        "{}: ScheduledBackup {}: {e}",
                        sfile.display(),
                        s.metadata.name
                    ))
                })?;
            mine.push(Schedule {
                doc: s.clone(),
                spec,
                running: None,
            });
        }
        jobs.push(Job {
            file: file.clone(),
            policy: policy.clone(),
            store,
            retention,
            retention_interval,
            archive,
            last_archive: None,
            schedules: mine,
            state: StoredState::empty(),
        });
    }
    for (file, s) in &schedules {
        if !policies
            .iter()
            .any(|(_, p)| p.metadata.name == s.spec.template.policy.name)
        {
            let known: Vec<&str> = policies
                .iter()
                .map(|(_, p)| p.metadata.name.as_str())
                .collect();
            return Err(CliError::input(format!(
                "{}: ScheduledBackup {}: spec.policy.name: no BackupPolicy named {:?} in {}; found: {}",
                file.display(),
                s.metadata.name,
                s.spec.template.policy.name,
                dir.display(),
                known.join(", ")
            )));
        }
    }
    Ok(jobs)
}

pub async fn run(args: &RunArgs) -> Result<Exit, CliError> {
    let grace = interval(&args.grace, "--grace", Path::new("(command line)"))?;
    let mut jobs = load(&args.config)?;
    for job in &mut jobs {
        job.state = StoredState::load(&job.store).await?;
        log(format!(
            "policy {} ({}): store {} cluster {}; {} schedule(s){}{}",
            job.policy.metadata.name,
            job.file.display(),
            job.store.url,
            job.store.cluster,
            job.schedules.len(),
            if job.retention.is_some() {
                format!(", retention every {:#}", job.retention_interval)
            } else {
                String::new()
            },
            job.archive
                .as_ref()
                .map(|(i, e)| format!(", binlogs from {} every {e:#}", i.display()))
                .unwrap_or_default()
        ));
        recover_interrupted(job).await?;
    }
    let mut stop = Box::pin(crate::transfer::shutdown_signal());
    loop {
        for job in &mut jobs {
            if let Err(e) = step(job).await {
                log(format!(
                    "policy {}: {}; retrying",
                    job.policy.metadata.name,
                    crate::exit::render(&e.error)
                ));
            }
        }
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(TICK) => {}
        }
    }
    log("stopping: no new backups");
    for job in &mut jobs {
        shut_down(job, grace).await;
    }
    Ok(Exit::Success)
}

/// Attempts of this runner's schedules that have bytes but no `metadata.json`, found at
/// start-up: a previous run died during them. Each is recorded as failed (so it is never
/// offered for restore, counts for nothing, and `failedBackupsTTL` collects it).
async fn recover_interrupted(job: &mut Job) -> Result<(), CliError> {
    let catalog = Catalog::load(&job.store, &NoProgress).await?;
    // The journal: attempts started and never finished, even those that left no bytes.
    let journal = std::mem::take(&mut job.state.state.running);
    for (schedule, a) in &journal {
        if catalog
            .backup(&a.backup_name, &a.backup_id)
            .is_some_and(|b| b.metadata.is_some())
        {
            continue;
        }
        let Some(sched) = job.schedules.iter().find(|s| s.spec.name == *schedule) else {
            continue;
        };
        let spec = child_spec(
            sched,
            &a.backup_name,
            &a.backup_id,
            a.started_at,
            a.immediate,
        );
        record_interrupted(&job.store, schedule, &spec).await?;
    }
    if !journal.is_empty() {
        job.state.save(&job.store).await?;
    }
    for sched in &job.schedules {
        let prefix = format!("{}-", sched.spec.name);
        for b in catalog.backups.iter().filter(|b| {
            b.metadata.is_none()
                && !journal.values().any(|a| a.backup_id == b.backup.id)
                && b.backup.name.starts_with(&prefix)
                && b.backup.name.len() == prefix.len() + 14
        }) {
            let spec = child_spec(
                sched,
                &b.backup.name,
                &b.backup.id,
                b.backup.started_at,
                false,
            );
            let started = id_time(&b.backup.id).unwrap_or(b.backup.started_at);
            let spec = BackupSpec {
                started_at: started,
                ..spec
            };
            record_interrupted(&job.store, &sched.spec.name, &spec).await?;
        }
    }
    Ok(())
}

/// Records an attempt a previous run died during as failed.
async fn record_interrupted(
    store: &ClusterStore,
    schedule: &str,
    spec: &BackupSpec,
) -> Result<(), CliError> {
    transfer::commit(
        store,
        spec,
        Outcome {
            error: Some(INTERRUPTED.into()),
            ..Default::default()
        },
    )
    .await?;
    log(format!(
        "{schedule}: backup {}/{} was interrupted by a previous run; recorded as failed",
        spec.backup_name, spec.backup_id
    ));
    Ok(())
}

/// The spec of a generated backup.
fn child_spec(
    sched: &Schedule,
    name: &str,
    id: &str,
    started_at: Timestamp,
    immediate: bool,
) -> BackupSpec {
    let method = sched
        .doc
        .spec
        .template
        .method
        .clone()
        .unwrap_or_else(|| "exec".to_owned());
    let ext = if method == mariadb::METHOD {
        mariadb::EXT
    } else {
        "bin"
    };
    let mut labels = BTreeMap::new();
    labels.insert(SCHEDULED_BACKUP_LABEL.to_owned(), sched.spec.name.clone());
    if immediate {
        labels.insert(IMMEDIATE_BACKUP_LABEL.to_owned(), "true".to_owned());
    }
    BackupSpec {
        backup_name: name.to_owned(),
        backup_id: id.to_owned(),
        kind: BackupType::Full,
        parent_id: None,
        method,
        payload_name: format!("backup.{ext}"),
        started_at,
        labels,
        ttl: None,
    }
}

/// One turn of the loop for one policy: finished backups, due slots, binlogs, retention.
async fn step(job: &mut Job) -> Result<(), CliError> {
    let now = Timestamp::now();
    let mut changed = false;
    // Finished backups.
    for sched in &mut job.schedules {
        let finished = sched
            .running
            .as_ref()
            .is_some_and(|r| r.handle.is_finished());
        if !finished {
            continue;
        }
        let Some(r) = sched.running.take() else {
            continue;
        };
        job.state.state.running.remove(&sched.spec.name);
        match r.handle.await {
            Ok(Ok(m)) => log(format!(
                "{}: backup {}/{} completed ({} bytes)",
                sched.spec.name,
                m.backup_name,
                m.backup_id,
                m.payload.iter().map(|p| p.size).sum::<u64>()
            )),
            Ok(Err(f)) => log(format!(
                "{}: backup {}/{} failed{}: {}",
                sched.spec.name,
                r.spec.backup_name,
                r.spec.backup_id,
                if f.recorded.is_some() {
                    " (recorded as failed)"
                } else {
                    ""
                },
                crate::exit::render(&f.error.error)
            )),
            Err(e) => log(format!(
                "{}: backup task ended abnormally: {e}",
                sched.spec.name
            )),
        }
        changed = true;
    }
    if changed {
        job.state.save(&job.store).await?;
    }
    // Due slots: evaluated when the next slot is due, after a backup ends, and at start.
    let due: Vec<usize> = job
        .schedules
        .iter()
        .enumerate()
        .filter(|(_, s)| s.running.is_none())
        .filter(|(_, s)| {
            // Never evaluated (no status, so no next slot) counts as due.
            changed
                || job
                    .state
                    .state
                    .schedules
                    .get(&s.spec.name)
                    .and_then(|st| st.next_schedule_time)
                    .is_none_or(|next| next <= now)
        })
        .map(|(i, _)| i)
        .collect();
    if !due.is_empty() {
        let catalog = Catalog::load(&job.store, &NoProgress).await?;
        for i in due {
            let sched = &mut job.schedules[i];
            let children = children(&catalog, sched);
            let status = job
                .state
                .state
                .schedules
                .get(&sched.spec.name)
                .cloned()
                .unwrap_or_default();
            let eval = evaluate(&sched.spec, &status, &children, now);
            job.state
                .state
                .schedules
                .insert(sched.spec.name.clone(), eval.status.clone());
            // Recorded before the backup starts: a crash during it cannot repeat the slot.
            job.state.save(&job.store).await?;
            match eval.decision {
                Decision::Create {
                    name,
                    slot,
                    immediate,
                } => {
                    let started = Timestamp::now();
                    let spec =
                        child_spec(sched, &name, &new_backup_id(started), started, immediate);
                    job.state.state.running.insert(
                        sched.spec.name.clone(),
                        Attempt {
                            backup_name: spec.backup_name.clone(),
                            backup_id: spec.backup_id.clone(),
                            started_at: started,
                            immediate,
                        },
                    );
                    job.state.save(&job.store).await?;
                    log(format!(
                        "{}: slot {slot}{} → backup {}/{} started",
                        sched.spec.name,
                        if immediate { " (immediate)" } else { "" },
                        spec.backup_name,
                        spec.backup_id
                    ));
                    let store = job.store.clone();
                    let command = sched.doc.spec.template.command.clone();
                    let task_spec = spec.clone();
                    let handle = tokio::spawn(async move {
                        take_backup(&store, &task_spec, &command, None, Detach::Yes, &NoProgress)
                            .await
                    });
                    sched.running = Some(Running { spec, handle });
                }
                Decision::Adopt { name, slot } => log(format!(
                    "{}: slot {slot}: backup {name} already exists and is ours; adopted",
                    sched.spec.name
                )),
                Decision::SkipCollision { name, slot } => log(format!(
                    "warning: {}: slot {slot} skipped: the name {name} is taken by a backup not labelled {SCHEDULED_BACKUP_LABEL}={}; resuming at the next slot",
                    sched.spec.name, sched.spec.name
                )),
                Decision::Wait { .. } | Decision::Suspended | Decision::Idle => {}
            }
        }
    }
    // Binlogs.
    if let Some((index, every)) = &job.archive
        && job.last_archive.is_none_or(|t| now >= t + *every)
    {
        job.last_archive = Some(now);
        match tidemark_store::archive::archive_pass(&job.store, index, &NoProgress).await {
            Ok(r) if !r.uploaded.is_empty() || !r.adopted.is_empty() => log(format!(
                "binlogs: archived {} ({} bytes)",
                r.uploaded.len() + r.adopted.len(),
                r.bytes
            )),
            Ok(_) => {}
            Err(e) => log(format!("binlogs: {e}; retrying at the next interval")),
        }
    }
    // Retention.
    if let Some(policy) = &job.retention
        && job
            .state
            .state
            .last_retention_run_time
            .is_none_or(|t| now >= t + job.retention_interval)
    {
        // Backups still being written are held, whatever failedBackupsTTL says.
        let protect = job
            .schedules
            .iter()
            .filter_map(|s| s.running.as_ref().map(|r| r.spec.backup_id.clone()))
            .collect();
        let survey = tidemark_store::survey(
            &job.store,
            policy,
            now,
            &SurveyOptions { protect },
            &NoProgress,
        )
        .await?;
        let as_given = serde_json::to_value(&job.policy.spec.retention).unwrap_or_default();
        let report = tidemark_store::execute(
            &job.store,
            &survey,
            &ExecOptions::new(now, as_given),
            &NoProgress,
        )
        .await?;
        if report.audit_key.is_some() {
            log(format!(
                "retention: deleted {} backup(s) and {} binlog segment(s); audit record {}",
                report.backups_deleted.len(),
                report.segments_deleted,
                report.audit_key.as_deref().unwrap_or("-")
            ));
        }
        for f in &report.failures {
            log(format!(
                "retention: could not delete {}: {}",
                f.key, f.error
            ));
        }
        job.state.state.last_retention_run_time = Some(now);
        job.state.save(&job.store).await?;
    }
    Ok(())
}

/// The backups that concern a schedule: those labelled as its own, and any under one of
/// its deterministic names.
fn children(catalog: &Catalog, sched: &Schedule) -> Vec<Child> {
    let prefix = format!("{}-", sched.spec.name);
    catalog
        .backups
        .iter()
        .filter_map(|b| {
            let labels = b.metadata.as_ref().map(|m| &m.labels);
            let ours = labels
                .and_then(|l| l.get(SCHEDULED_BACKUP_LABEL))
                .is_some_and(|v| *v == sched.spec.name);
            if !ours && !b.backup.name.starts_with(&prefix) {
                return None;
            }
            let running_here = sched
                .running
                .as_ref()
                .is_some_and(|r| r.spec.backup_id == b.backup.id);
            Some(Child {
                name: b.backup.name.clone(),
                ours,
                immediate: labels
                    .and_then(|l| l.get(IMMEDIATE_BACKUP_LABEL))
                    .is_some_and(|v| v == "true"),
                // Uncommitted attempts of a previous run were recorded as failed at
                // start-up; any other one is not ours to wait for.
                done: !running_here
                    && b.metadata.as_ref().is_none_or(|m| {
                        matches!(m.phase, MetadataPhase::Completed | MetadataPhase::Failed)
                    }),
                slot: Some(b.backup.started_at),
            })
        })
        .collect()
}

/// Lets running backups finish within `grace`; records the others as failed.
async fn shut_down(job: &mut Job, grace: SignedDuration) {
    let grace = Duration::try_from(grace).unwrap_or(Duration::from_secs(60));
    let mut finished_any = false;
    for sched in &mut job.schedules {
        let Some(mut r) = sched.running.take() else {
            continue;
        };
        finished_any = true;
        log(format!(
            "{}: waiting up to {}s for backup {}/{} to finish",
            sched.spec.name,
            grace.as_secs(),
            r.spec.backup_name,
            r.spec.backup_id
        ));
        match tokio::time::timeout(grace, &mut r.handle).await {
            Ok(Ok(Ok(m))) => log(format!(
                "{}: backup {}/{} completed",
                sched.spec.name, m.backup_name, m.backup_id
            )),
            Ok(_) => log(format!(
                "{}: backup {}/{} failed while stopping",
                sched.spec.name, r.spec.backup_name, r.spec.backup_id
            )),
            Err(_) => {
                // Dropping the task kills the command (kill_on_drop) and abandons the upload.
                r.handle.abort();
                let _ = r.handle.await;
                let recorded = transfer::commit(
                    &job.store,
                    &r.spec,
                    Outcome {
                        error: Some(format!(
                            "stopped: tidemark run was asked to stop and the backup did not finish within {}s",
                            grace.as_secs()
                        )),
                        ..Default::default()
                    },
                )
                .await;
                log(format!(
                    "{}: backup {}/{} did not finish in time; {}",
                    sched.spec.name,
                    r.spec.backup_name,
                    r.spec.backup_id,
                    if recorded.is_ok() {
                        "recorded as failed"
                    } else {
                        "it will be found and recorded as failed at the next start"
                    }
                ));
                if recorded.is_err() {
                    // Left in the journal: the next start records it.
                    continue;
                }
            }
        }
        job.state.state.running.remove(&sched.spec.name);
    }
    if finished_any && let Err(e) = job.state.save(&job.store).await {
        log(format!(
            "could not record the shutdown in the store state: {e}"
        ));
    }
}
