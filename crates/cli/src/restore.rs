//! `tidemark restore`: a data directory at a point in time.

use std::path::PathBuf;

use tidemark_mariadb::check::{self, CheckSpec};
use tidemark_mariadb::restore::{self, RestorePlan};
use tidemark_store::format::BackupType;
use tidemark_store::{NoProgress, Progress};

use crate::args::{OutputFormat, RestoreArgs, RestoreTestArgs};
use crate::exit::{CliError, Exit};
use crate::output::{
    JSON_FORMAT_VERSION, RestoreBackupOut, RestoreOut, human_bytes, table, window_line,
};
use crate::resolve;

/// Prints each step of a restore on stderr as a line: a restore takes minutes, and its
/// steps are few.
#[derive(Debug)]
struct Steps;

impl Progress for Steps {
    fn step(&self, name: &str, _total: usize) {
        eprintln!("restore: {name}");
    }
}

fn restore_error(e: tidemark_mariadb::restore::RestoreError) -> CliError {
    tidemark_engine::EngineError::from(e).into()
}

pub async fn restore(args: &RestoreArgs) -> Result<Exit, CliError> {
    let target: jiff::Timestamp = args.to.parse().map_err(|_| {
        CliError::input(format!(
            "invalid --to {:?}: expected an RFC 3339 time such as 2026-11-20T14:05:00Z",
            args.to
        ))
    })?;
    let store_target = resolve::store_target(&args.store, args.policy.as_deref())?;
    let store = &store_target.store;
    let json = args.output == OutputFormat::Json;
    let plan = restore::resolve(store, target, &NoProgress)
        .await
        .map_err(restore_error)?;
    if args.dry_run {
        report(&plan, None, json)?;
        return Ok(Exit::Success);
    }
    let Some(datadir) = &args.datadir else {
        return Err(CliError::input("--datadir DIR is needed unless --dry-run"));
    };
    let tools = args.tools.tools();
    let progress: &dyn Progress = if json { &NoProgress } else { &Steps };
    let done = restore::restore(store, &plan, datadir, &tools, progress)
        .await
        .map_err(restore_error)?;
    report(&plan, Some((datadir.clone(), done.bytes_downloaded)), json)?;
    Ok(Exit::Success)
}

fn report(plan: &RestorePlan, done: Option<(PathBuf, u64)>, json: bool) -> Result<(), CliError> {
    let backups: Vec<RestoreBackupOut> = plan
        .backups
        .iter()
        .map(|m| RestoreBackupOut {
            backup_id: m.backup_id.clone(),
            backup_name: m.backup_name.clone(),
            kind: match m.kind {
                BackupType::Full => "full",
                BackupType::Incremental => "incremental",
            },
            completed_at: m.completed_at,
            size: m.payload.iter().map(|p| p.size).sum(),
            log_position: m.log_position.clone(),
        })
        .collect();
    if json {
        return crate::commands::emit_json(&RestoreOut {
            format_version: JSON_FORMAT_VERSION,
            target: plan.target,
            recovery_window: plan.recovery_window.clone(),
            backups,
            segments: plan.segments.clone(),
            start_position: plan.start_position.clone(),
            stop_datetime: plan.stop_datetime,
            dry_run: done.is_none(),
            bytes_downloaded: done.as_ref().map(|d| d.1),
            datadir: done.map(|d| d.0),
        });
    }
    let mut out = String::new();
    out.push_str(&format!(
        "restore to {}\nrecovery window: {}\n\n",
        plan.target,
        window_line(&Some(plan.recovery_window.clone()))
    ));
    let rows: Vec<Vec<String>> = backups
        .iter()
        .map(|b| {
            vec![
                b.kind.to_owned(),
                format!("{}/{}", b.backup_name, b.backup_id),
                b.completed_at.map_or_else(|| "-".into(), |t| t.to_string()),
                human_bytes(b.size),
                b.log_position
                    .as_ref()
                    .map_or_else(|| "-".into(), |p| format!("{}:{}", p.file, p.position)),
            ]
        })
        .collect();
    out.push_str(&table(
        &["TYPE", "BACKUP", "COMPLETED", "SIZE", "BINLOG POSITION"],
        &rows,
    ));
    if plan.segments.is_empty() {
        out.push_str("\nno binlog replay: the target is the backup's own restore point\n");
    } else {
        let from = match &plan.start_position {
            Some(p) => format!("{} position {}", p.file, p.position),
            None => format!("the start of {}", plan.segments[0].name),
        };
        let stop = plan.stop_datetime.map_or_else(String::new, |s| {
            format!(", stopping before events stamped {s}")
        });
        out.push_str(&format!("\nreplay from {from}{stop}:\n"));
        let rows: Vec<Vec<String>> = plan
            .segments
            .iter()
            .map(|s| {
                let t = |t: Option<jiff::Timestamp>| {
                    t.map_or_else(|| "unknown".into(), |t| t.to_string())
                };
                vec![
                    s.name.clone(),
                    t(s.first_event_at),
                    t(s.last_event_at),
                    human_bytes(s.size),
                ]
            })
            .collect();
        out.push_str(&table(
            &["SEGMENT", "FIRST EVENT", "LAST EVENT", "SIZE"],
            &rows,
        ));
    }
    match done {
        None => out.push_str("\ndry run: nothing was written\n"),
        Some((dir, bytes)) => out.push_str(&format!(
            "\nrestored into {} ({} downloaded); start mariadbd with --datadir={}\n",
            dir.display(),
            human_bytes(bytes),
            dir.display()
        )),
    }
    crate::commands::emit(&out)
}

/// `tidemark restore-test`: restores a point into scratch space, checks it, records the
/// outcome beside the backup restored, and removes the scratch data.
pub async fn restore_test(args: &RestoreTestArgs) -> Result<Exit, CliError> {
    let file = args
        .policy
        .as_deref()
        .map(resolve::read_policy_file)
        .transpose()?;
    let store_target = resolve::target(&args.store, file.as_ref(), args.policy.as_deref())?;
    let store = &store_target.store;
    let from_policy = file.as_ref().and_then(|p| p.spec.restore_test.clone());
    let policy_random = match &from_policy {
        Some(t) => t.settings().map_err(|e| CliError::input(e.to_string()))?.1,
        None => false,
    };
    let spec = CheckSpec {
        query: args
            .query
            .clone()
            .or_else(|| from_policy.as_ref().and_then(|t| t.query.clone())),
        expect: if args.query.is_some() {
            args.expect.clone()
        } else {
            from_policy.as_ref().and_then(|t| t.expect.clone())
        },
    };
    let target = match &args.to {
        Some(t) => t.parse::<jiff::Timestamp>().map_err(|_| {
            CliError::input(format!(
                "invalid --to {t:?}: expected an RFC 3339 time such as 2026-11-20T14:05:00Z"
            ))
        })?,
        None => {
            let window = recovery_window(store).await?;
            if args.random || policy_random {
                random_instant(&window)
            } else {
                window.to
            }
        }
    };
    let started = std::time::Instant::now();
    let plan = restore::resolve(store, target, &NoProgress)
        .await
        .map_err(restore_error)?;
    let scratch = args.scratch.clone().unwrap_or_else(std::env::temp_dir);
    let json = args.output == OutputFormat::Json;
    let progress: &dyn Progress = if json { &NoProgress } else { &Steps };
    let (done, outcome) =
        check::restore_and_check(store, &plan, &scratch, &args.tools.tools(), &spec, progress)
            .await
            .map_err(restore_error)?;
    let Some(restored) = plan.backups.last() else {
        return Err(CliError::input("the restore plan holds no backup"));
    };
    let record = serde_json::json!({
        "formatVersion": 1,
        "testedAt": jiff::Timestamp::now(),
        "target": plan.target,
        "chain": plan.backups.iter().map(|m| m.backup_id.clone()).collect::<Vec<_>>(),
        "segmentsReplayed": plan.segments.len(),
        "bytesDownloaded": done.bytes_downloaded,
        "seconds": started.elapsed().as_secs(),
        "outcome": outcome,
        "by": "tidemark restore-test",
    });
    tidemark_store::transfer::record_restore_test(
        store,
        &restored.backup_name,
        &restored.backup_id,
        &record,
    )
    .await
    .map_err(|e| CliError::from(tidemark_engine::EngineError::from(e)))?;
    if json {
        crate::commands::emit_json(&record)?;
    } else {
        let mut out = format!(
            "restore test of {} ({}/{}, {} backup(s), {} binlog(s)): {}\n{} table(s) checked\n",
            plan.target,
            restored.backup_name,
            restored.backup_id,
            plan.backups.len(),
            plan.segments.len(),
            if outcome.passed { "passed" } else { "FAILED" },
            outcome.tables_checked
        );
        if let Some(r) = &outcome.query_result {
            out.push_str(&format!("query result: {r}\n"));
        }
        for p in &outcome.problems {
            out.push_str(&format!("problem: {p}\n"));
        }
        crate::commands::emit(&out)?;
    }
    Ok(if outcome.passed {
        Exit::Success
    } else {
        Exit::Data
    })
}

/// The store's recovery window (a restore to the Unix epoch is refused with it).
async fn recovery_window(
    store: &tidemark_store::ClusterStore,
) -> Result<tidemark_core::plan::RecoveryWindow, CliError> {
    match restore::resolve(store, jiff::Timestamp::UNIX_EPOCH, &NoProgress).await {
        Err(restore::RestoreError::Refused(tidemark_core::RestoreRefusal::OutsideWindow {
            window,
            ..
        })) => Ok(window),
        Err(e) => Err(restore_error(e)),
        Ok(plan) => Ok(plan.recovery_window),
    }
}

/// A whole second of `window` chosen at random (the restore moves one in a gap to where
/// the window resumes).
fn random_instant(window: &tidemark_core::plan::RecoveryWindow) -> jiff::Timestamp {
    let from = window.from.as_second() + i64::from(window.from.subsec_nanosecond() > 0);
    let to = window.to.as_second();
    if to <= from {
        return window.to;
    }
    let span = u64::try_from(to - from).unwrap_or(0) + 1;
    let pick = from + i64::try_from(rand::random::<u64>() % span).unwrap_or(0);
    jiff::Timestamp::from_second(pick).unwrap_or(window.to)
}
