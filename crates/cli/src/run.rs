//! `tidemark run --config DIR`: standalone mode. The directory's BackupPolicy and
//! ScheduledBackup documents become the engine's standalone runner: schedules, binlog
//! archiving and retention of every policy as independent tasks, with all durable state in
//! the store (see `tidemark_engine::standalone`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use jiff::SignedDuration;
use tidemark_api::config::{Document, parse_documents};
use tidemark_api::{BackupPolicy, ScheduledBackup};
use tidemark_engine::standalone::{
    self, ArchiveRun, PolicyRun, RetentionRun, RunOptions, ScheduleRun,
};
use tidemark_engine::{LocalConsolidator, LocalProcess, SystemClock};
use tidemark_store::StoreError;

use crate::args::{RunArgs, StoreArgs};
use crate::exit::{CliError, Exit};
use crate::resolve;

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

/// Reads every `*.yaml` / `*.yml` file of `dir` and builds what runs.
fn load(dir: &Path) -> Result<Vec<PolicyRun>, CliError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| CliError::input(format!("--config {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut policies: Vec<(PathBuf, BackupPolicy)> = Vec::new();
    let mut schedules: Vec<(PathBuf, ScheduledBackup)> = Vec::new();
    let mut hooks: Vec<tidemark_engine::hooks::LocalHook> = Vec::new();
    for f in &files {
        let text = resolve::read_config_file(f)?;
        for doc in
            parse_documents(&text).map_err(|e| CliError::input(format!("{}: {e}", f.display())))?
        {
            match doc {
                Document::Policy(p) => {
                    resolve::warn_ambiguous(
                        &format!("{}: BackupPolicy {}", f.display(), p.metadata.name),
                        p.spec.ambiguous_durations(),
                    );
                    policies.push((f.clone(), *p));
                }
                Document::Schedule(s) => {
                    resolve::warn_ambiguous(
                        &format!("{}: ScheduledBackup {}", f.display(), s.metadata.name),
                        s.spec.ambiguous_durations(),
                    );
                    schedules.push((f.clone(), *s));
                }
                Document::Hook(h) => {
                    if hooks.iter().any(|x| x.name == h.metadata.name) {
                        return Err(CliError::input(format!(
                            "{}: DeleteHook {}: metadata.name: already defined; each hook needs its own name",
                            f.display(),
                            h.metadata.name
                        )));
                    }
                    let hook =
                        tidemark_engine::hooks::LocalHook::from_document(&h).map_err(|e| {
                            CliError::input(format!(
                                "{}: DeleteHook {}: {e}",
                                f.display(),
                                h.metadata.name
                            ))
                        })?;
                    if matches!(hook.action, tidemark_engine::hooks::HookAction::Job) {
                        return Err(CliError::input(format!(
                            "{}: DeleteHook {}: spec.job: a job runs only in the cluster; tidemark run runs a command or calls a webhook, e.g. command: [sh, -c, \"notify $TIDEMARK_BACKUP\"]",
                            f.display(),
                            h.metadata.name
                        )));
                    }
                    hooks.push(hook);
                }
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
    let hooks: Option<Arc<dyn tidemark_engine::DeleteHooks>> = (!hooks.is_empty())
        .then(|| Arc::new(tidemark_engine::hooks::LocalHooks::new(hooks)) as Arc<_>);
    let now = jiff::Timestamp::now();
    let mut runs: Vec<PolicyRun> = Vec::new();
    let mut seen: Vec<(&Path, &str, String)> = Vec::new();
    for (file, policy) in &policies {
        let name = &policy.metadata.name;
        if let Some((other, _, _)) = seen.iter().find(|(_, n, _)| n == name) {
            return Err(CliError::input(format!(
                "{}: BackupPolicy {name}: metadata.name: already defined in {}; each policy needs its own name",
                file.display(),
                other.display()
            )));
        }
        if policy.spec.object_store.is_none() {
            return Err(CliError::input(format!(
                "{}: BackupPolicy {name}: spec.objectStore: required by tidemark run (where the backups go), e.g. objectStore: {{url: file:///var/backups}}",
                file.display()
            )));
        }
        let store = open_store(policy, file, None)?;
        let identity = store.identity().to_owned();
        if let Some((other, other_name, _)) = seen.iter().find(|(_, _, i)| *i == identity) {
            // Each policy's lease, schedules and retention assume they alone write there.
            return Err(CliError::input(format!(
                "{}: BackupPolicy {name}: spec.objectStore: same store and cluster ({identity}) as BackupPolicy {other_name} in {}; one policy per cluster (spec.cluster names it, metadata.name by default)",
                file.display(),
                other.display()
            )));
        }
        seen.push((file, name, identity));
        let bounded = |e: tidemark_api::policy::PolicyFileError| {
            CliError::input(format!("{}: BackupPolicy {name}: {e}", file.display()))
        };
        let retention_interval = policy.spec.retention_interval().map_err(bounded)?;
        let retention = policy
            .spec
            .retention
            .as_ref()
            .map(|r| {
                let checked = r.to_input(policy.spec.time_zone.as_deref()).validate();
                let acknowledged =
                    tidemark_api::policy::branches_acknowledged(&policy.metadata.annotations)
                        .map_err(|e| {
                            CliError::input(format!("{}: BackupPolicy {name}: {e}", file.display()))
                        })?;
                let allow_deletions_before =
                    tidemark_api::policy::deletions_allowed_before(&policy.metadata.annotations)
                        .map_err(|e| {
                            CliError::input(format!("{}: BackupPolicy {name}: {e}", file.display()))
                        })?;
                checked
                    .map(|mut p| {
                        p.branches_acknowledged = acknowledged;
                        p
                    })
                    .map(|p| RetentionRun {
                        policy: p,
                        as_given: serde_json::to_value(r).unwrap_or_default(),
                        interval: retention_interval,
                        hooks: hooks.clone(),
                        allow_deletions_before,
                    })
                    .map_err(|e| {
                        let at = match e.field() {
                            Some(tidemark_core::PolicyField::TimeZone) => {
                                "spec.timeZone".to_owned()
                            }
                            Some(f) => format!("spec.retention.{}", f.name()),
                            None => "spec.retention".to_owned(),
                        };
                        CliError::input(format!(
                            "{}: BackupPolicy {name}: {at}: {}",
                            file.display(),
                            e.problem()
                        ))
                    })
            })
            .transpose()?;
        let archive = policy
            .spec
            .binlog_archive
            .as_ref()
            .map(|a| {
                let every = policy.spec.binlog_interval().map_err(bounded)?;
                let Some(relative) = &a.binlog_index else {
                    return Err(CliError::input(format!(
                        "{}: spec.binlogArchive.binlogIndex: required by tidemark run (the server's binlog index file, e.g. /var/lib/mysql/mysql-bin.index); spec.binlogArchive.server is for the operator",
                        file.display()
                    )));
                };
                let index = file.parent().unwrap_or(Path::new(".")).join(relative);
                let checksums = a
                    .checksums
                    .as_ref()
                    .map(|c| {
                        let every = c.every().map_err(bounded)?;
                        let settings = tidemark_mariadb::oracle::Settings {
                            chunk_rows: c
                                .chunk_rows
                                .unwrap_or(tidemark_mariadb::oracle::CHUNK_ROWS),
                            pause: std::time::Duration::from_millis(u64::from(
                                c.pause_milliseconds.unwrap_or(50),
                            )),
                            tables: c.tables.clone(),
                            skip: c.skip.clone(),
                        };
                        let mysql = policy
                            .spec
                            .source
                            .as_ref()
                            .is_some_and(tidemark_api::policy::SourceSpec::is_mysql);
                        Ok::<_, CliError>(tidemark_engine::standalone::ChecksumsRun {
                            every: std::time::Duration::try_from(every).unwrap_or_default(),
                            settings,
                            client: if mysql { "mysql" } else { "mariadb" }.into(),
                            client_args: c.client.clone(),
                        })
                    })
                    .transpose()?;
                Ok::<_, CliError>(ArchiveRun {
                    binlog_index: index,
                    interval: every,
                    max_lag: policy.spec.binlog_max_lag().map_err(bounded)?,
                    checksums,
                })
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
            let method = s
                .spec
                .template
                .method
                .clone()
                .unwrap_or_else(|| "exec".to_owned());
            if s.spec.incremental.is_some() && method != tidemark_mariadb::METHOD {
                return Err(CliError::input(format!(
                    "{}: ScheduledBackup {}: spec.incremental needs method: mariabackup in tidemark run (the method is {method})",
                    sfile.display(),
                    s.metadata.name
                )));
            }
            if let Some((false, _, message)) =
                s.spec.chains_end(&policy.metadata.name, &policy.spec)
            {
                eprintln!(
                    "warning: {}: ScheduledBackup {}: {message}",
                    sfile.display(),
                    s.metadata.name
                );
            }
            mine.push(ScheduleRun {
                spec,
                incremental: s
                    .spec
                    .incremental
                    .as_ref()
                    .map(|i| i.max_increments_per_full),
                method,
                command: s.spec.template.command.clone(),
                // Seed 004: the policy's ttl is the default of the backups it takes.
                ttl: s
                    .spec
                    .ttl
                    .as_deref()
                    .or(policy.spec.ttl.as_deref())
                    .map(str::parse)
                    .transpose()
                    .map_err(|e| {
                        CliError::input(format!(
                            "{}: ScheduledBackup {}: spec.ttl: {e}",
                            sfile.display(),
                            s.metadata.name
                        ))
                    })?,
                compression: s.spec.template.compression().map_err(|e| {
                    CliError::input(format!(
                        "{}: ScheduledBackup {}: {e}",
                        sfile.display(),
                        s.metadata.name
                    ))
                })?,
            });
        }
        runs.push(PolicyRun {
            name: name.clone(),
            store,
            retention,
            archive,
            schedules: mine,
            object_lock: policy
                .spec
                .object_lock()
                .map_err(|e| CliError::input(format!("{}: {e}", file.display())))?,
            restore_test: restore_test_run(policy, file)?,
            verify: verify_run(policy, file)?,
            copies: copy_runs(policy, file, retention_interval)?,
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
    Ok(runs)
}

/// The policy's copies (`spec.copies`): each copy's store (its credentials from
/// `TIDEMARK_COPY_<NAME>_…` or the usual variables), what it keeps, how often it is sent
/// (half its `maxLag`, from 10 s to 10 min) and its rate.
fn copy_runs(
    policy: &BackupPolicy,
    file: &Path,
    retention_interval: jiff::SignedDuration,
) -> Result<Vec<tidemark_engine::standalone::CopyRun>, CliError> {
    let bad = |e: String| {
        CliError::input(format!(
            "{}: BackupPolicy {}: {e}",
            file.display(),
            policy.metadata.name
        ))
    };
    let mut out = Vec::new();
    for c in &policy.spec.copies {
        let store = open_store(policy, file, Some(&c.name))?;
        let seen = policy
            .as_copy(&c.name)
            .ok_or_else(|| bad(format!("no copy {:?}", c.name)))?;
        let retention = match &seen.spec.retention {
            Some(r) => {
                let p = r
                    .to_input(policy.spec.time_zone.as_deref())
                    .validate()
                    .map_err(|e| bad(format!("spec.copies[{}].retention: {e}", c.name)))?;
                Some(tidemark_engine::standalone::RetentionRun {
                    policy: p,
                    as_given: serde_json::to_value(r).unwrap_or_default(),
                    interval: retention_interval,
                    hooks: None,
                    // The copy's deletion guard takes the policy's acknowledgement.
                    allow_deletions_before: tidemark_api::policy::deletions_allowed_before(
                        &policy.metadata.annotations,
                    )
                    .map_err(bad)?,
                })
            }
            None => None,
        };
        let max_lag = c.max_lag().map_err(|e| bad(e.to_string()))?;
        let every = std::time::Duration::try_from(max_lag / 2)
            .unwrap_or(std::time::Duration::from_secs(60))
            .clamp(
                std::time::Duration::from_secs(10),
                std::time::Duration::from_secs(600),
            );
        out.push(tidemark_engine::standalone::CopyRun {
            name: c.name.clone(),
            store,
            policy: retention
                .as_ref()
                .map_or_else(tidemark_engine::copy::keep_everything, |r| r.policy.clone()),
            retention,
            max_lag,
            every,
            bandwidth: c
                .bandwidth()
                .map_err(|e| bad(e.to_string()))?
                .map(|r| Arc::new(tidemark_store::bandwidth::Bandwidth::new(&r))),
            // The copy's view carries its own `verify` and `restoreTest`.
            verify: verify_run(&seen, file)?,
            restore_test: restore_test_run(&seen, file)?,
        });
    }
    Ok(out)
}

/// The policy's restore tests, with the machine's MariaDB tools and temporary directory.
fn restore_test_run(
    policy: &BackupPolicy,
    file: &Path,
) -> Result<Option<tidemark_engine::standalone::RestoreTestRun>, CliError> {
    let Some(t) = &policy.spec.restore_test else {
        return Ok(None);
    };
    let bad = |e: String| CliError::input(format!("{}: {e}", file.display()));
    let (cron, random) = t.settings().map_err(|e| bad(e.to_string()))?;
    let time_zone = time_zone(policy, file)?;
    Ok(Some(tidemark_engine::standalone::RestoreTestRun {
        cron,
        time_zone,
        point: if random {
            tidemark_mariadb::check::Point::Random
        } else {
            tidemark_mariadb::check::Point::Newest
        },
        check: tidemark_mariadb::check::CheckSpec {
            query: t.query.clone(),
            expect: t.expect.clone(),
        },
        tools: tidemark_mariadb::restore::Tools {
            // The policy's `restoreTest.replay` (checked by `settings`), else TIDEMARK_REPLAY.
            replay: match t.replay.as_deref() {
                Some("client") => tidemark_mariadb::tools::Replay::Client,
                Some(_) => tidemark_mariadb::tools::Replay::applier(),
                None => tidemark_mariadb::tools::Replay::from_env().map_err(CliError::input)?,
            },
            ..Default::default()
        },
        scratch: std::env::temp_dir(),
    }))
}

/// The policy's scheduled verification (`spec.verify.schedule`); without a schedule,
/// verification is `tidemark verify`'s, on demand.
fn verify_run(
    policy: &BackupPolicy,
    file: &Path,
) -> Result<Option<tidemark_engine::standalone::VerifyRun>, CliError> {
    let Some(v) = &policy.spec.verify else {
        return Ok(None);
    };
    let bad = |e: String| CliError::input(format!("{}: {e}", file.display()));
    let (cron, sample) = v.settings().map_err(|e| bad(e.to_string()))?;
    let Some(cron) = cron else {
        return Ok(None);
    };
    Ok(Some(tidemark_engine::standalone::VerifyRun {
        cron,
        time_zone: time_zone(policy, file)?,
        sample,
    }))
}

/// The policy's `timeZone` (UTC by default).
fn time_zone(policy: &BackupPolicy, file: &Path) -> Result<jiff::tz::TimeZone, CliError> {
    match policy.spec.time_zone.as_deref() {
        Some(z) => jiff::tz::TimeZone::get(z).map_err(|_| {
            CliError::input(format!(
                "{}: spec.timeZone: unknown time zone {z:?}",
                file.display()
            ))
        }),
        None => Ok(jiff::tz::TimeZone::UTC),
    }
}

pub async fn run(args: &RunArgs) -> Result<Exit, CliError> {
    let grace = interval(&args.grace, "--grace", Path::new("(command line)"))?;
    let grace = std::time::Duration::try_from(grace).unwrap_or(std::time::Duration::from_secs(60));
    let policies = load(&args.config)?;
    let consolidator = LocalConsolidator {
        tools: Default::default(),
        work_dir: std::env::temp_dir(),
    };
    standalone::run(
        policies,
        Arc::new(LocalProcess),
        Arc::new(consolidator),
        Arc::new(SystemClock),
        RunOptions {
            grace,
            fence: tidemark_engine::FenceOptions::from_env()?,
        },
        crate::transfer::shutdown_signal(),
    )
    .await?;
    Ok(Exit::Success)
}

/// Opens the store of a policy, creating a missing local directory: standalone mode
/// starts empty.
fn open_store(
    policy: &BackupPolicy,
    file: &Path,
    copy: Option<&str>,
) -> Result<tidemark_store::ClusterStore, CliError> {
    let open = || {
        resolve::target(
            &StoreArgs {
                from_copy: copy.map(str::to_owned),
                ..StoreArgs::default()
            },
            Some(policy),
            Some(file),
        )
    };
    match open() {
        Err(e) => match e
            .error
            .downcast_ref::<tidemark_engine::EngineError>()
            .and_then(|e| match e {
                tidemark_engine::EngineError::Store(s) => Some(s.as_ref()),
                _ => None,
            }) {
            Some(StoreError::MissingDirectory { dir, .. }) => {
                std::fs::create_dir_all(dir).map_err(|io| {
                    CliError::input(format!("cannot create {}: {io}", dir.display()))
                })?;
                Ok(open()?.store)
            }
            _ => Err(e),
        },
        ok => Ok(ok?.store),
    }
}
