//! `tidemark restore`: a data directory at a point in time.

use std::path::PathBuf;

use tidemark_engine::restore::{
    MariaDbTools, RestorePoint, RestoreRequest, RestoreTestRequest, TimedSteps, restore_instant,
};
use tidemark_mariadb::check::{self, CheckSpec};
use tidemark_mariadb::restore::RestorePlan;
use tidemark_store::format::BackupType;
use tidemark_store::{NoProgress, Progress};

use crate::args::{OutputFormat, RestoreArgs, RestoreTestArgs};
use crate::exit::{CliError, Exit};
use crate::output::{
    JSON_FORMAT_VERSION, RestoreBackupOut, RestoreOut, human_bytes, table, window_line,
};
use crate::resolve;

/// Prints each step of a restore on stderr as a line: a restore takes minutes, and its
/// steps are few. Where a long step stands (a replay's transactions) is printed at most
/// every [`STATUS_EVERY`].
#[derive(Debug, Default)]
struct Steps {
    /// When a status line was last printed.
    said: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How often a step's status is printed.
const STATUS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl Progress for Steps {
    fn step(&self, name: &str, _total: usize) {
        eprintln!("restore: {name}");
        // A new step's status waits its own interval.
        *self
            .said
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(std::time::Instant::now());
    }

    fn status(&self, what: &str) {
        let mut said = self
            .said
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if said.is_none_or(|t| t.elapsed() >= STATUS_EVERY) {
            eprintln!("restore: {what}");
            *said = Some(std::time::Instant::now());
        }
    }
}

/// `--to`, read.
fn to_of(args: &RestoreArgs) -> Result<Option<jiff::Timestamp>, CliError> {
    args.to
        .as_deref()
        .map(|to| {
            to.parse().map_err(|_| {
                CliError::input(format!(
                    "invalid --to {to:?}: expected an RFC 3339 time such as 2026-11-20T14:05:00Z"
                ))
            })
        })
        .transpose()
}

/// Whether `flag` (`--store`) was given on the command line, not through the environment.
fn on_command_line(flag: &str) -> bool {
    std::env::args_os().skip(1).any(|a| {
        let a = a.to_string_lossy();
        a == flag
            || a.strip_prefix(flag)
                .is_some_and(|rest| rest.starts_with('='))
    })
}

/// The long flags of an argument group (`--endpoint`, `--identity`, …).
pub(crate) fn flags_of<A: clap::Args>() -> Vec<String> {
    A::augment_args(clap::Command::new("flags"))
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect()
}

/// The store's flags a cluster POLICY does not use when its store is read from here: its
/// BackupPolicy names the store (all but `--from-copy`, which picks one of its copies, and
/// `--endpoint`, another way to reach the same store, e.g. a port-forward).
pub(crate) fn store_flags_beside_policy() -> Vec<String> {
    flags_of::<crate::args::StoreArgs>()
        .into_iter()
        .filter(|f| f != "--from-copy" && f != "--endpoint")
        .collect()
}

/// With a cluster POLICY, the flags of `unused` would be ignored (the policy names its
/// store, the operator's Job runs the tools): one given on the command line is refused,
/// named — the environment's TIDEMARK_STORE and the like do not conflict.
pub(crate) fn refuse_beside_policy(policy: &str, unused: &[String]) -> Result<(), CliError> {
    match unused.iter().find(|f| on_command_line(f)) {
        Some(flag) => Err(CliError::input(format!(
            "POLICY ({policy}) names its store and the operator does the work: {flag} is not used with it (remove it)"
        ))),
        None => Ok(()),
    }
}

/// What `restore POLICY` does not use: the store's flags, the local tools, and the report
/// file of a local restore (the Restore's status holds its report).
fn unused_by_restore_of_policy(dry_run: bool) -> Vec<String> {
    let mut unused = store_flags_beside_policy();
    // The Restore's Job reaches the store the policy's way; only a plan is read from here.
    if !dry_run {
        unused.push("--endpoint".into());
    }
    unused.extend(flags_of::<crate::args::MariaDbTools>());
    unused.push("--report-file".into());
    unused
}

/// What `restore-test POLICY` does not use: it asks the operator for its policy's own
/// restore test, so the store's flags and the tools (the local test's settings conflict
/// with POLICY in the parser already).
fn unused_by_restore_test_of_policy() -> Vec<String> {
    let mut unused = flags_of::<crate::args::StoreArgs>();
    unused.extend(flags_of::<crate::args::MariaDbTools>());
    unused
}

pub async fn restore(args: &RestoreArgs) -> Result<Exit, CliError> {
    if let Some(policy) = &args.policy_name {
        refuse_beside_policy(policy, &unused_by_restore_of_policy(args.dry_run))?;
    }
    let to = to_of(args)?;
    // Before the store is read.
    let tools = args.tools.tools()?;
    let (store, target) = match &args.policy_name {
        Some(policy) if !args.dry_run => return crate::cluster::restore(args, policy, to).await,
        // The plan of a Restore, from the policy's store as the operator reads it.
        Some(policy) => {
            let store = crate::cluster::policy(
                &args.kube,
                policy,
                args.store.from_copy.as_deref(),
                args.store.endpoint.as_deref(),
            )
            .await?
            .store;
            let point = to.map_or(RestorePoint::Newest, RestorePoint::At);
            let target = restore_instant(&store, &point).await?;
            (store, target)
        }
        None => {
            let store = resolve::store_target(&args.store, args.policy.as_deref())?.store;
            let target = to.ok_or_else(|| CliError::input("--to TIME is needed"))?;
            (store, target)
        }
    };
    let store = &store;
    let json = args.output.structured();
    let request = RestoreRequest {
        target,
        datadir: if args.dry_run {
            None
        } else {
            args.datadir.clone()
        },
        timeline: args.timeline,
    };
    let db = MariaDbTools { tools };
    let steps = Steps::default();
    let shown: &dyn Progress = if json { &NoProgress } else { &steps };
    let timed = TimedSteps::new(shown);
    let restored = tidemark_engine::restore::restore(&db, store, &request, &timed).await?;
    if !args.dry_run && request.datadir.is_none() {
        // (After the plan: a target that cannot be restored is said first.)
        return Err(CliError::input("--datadir DIR is needed unless --dry-run"));
    }
    if let (Some(path), Some(r)) = (&args.report_file, &restored.report) {
        let summary =
            serde_json::to_vec(&timed.summary(r)).map_err(|e| CliError::new(Exit::Internal, e))?;
        std::fs::write(path, summary)
            .map_err(|e| CliError::input(format!("--report-file {}: {e}", path.display())))?;
    }
    if let (Some(dir), Some(r)) = (&request.datadir, &restored.report) {
        if let Some(c) = &r.oracle {
            for d in &c.differences {
                eprintln!(
                    "warning: the restore oracle: {d} (the restored data is not the primary's there)"
                );
            }
        }
        if args.require_oracle {
            let refused = match &r.oracle {
                Some(c) if !c.differences.is_empty() => Some(format!(
                    "{} of {} chunk(s) of the restore oracle differ from the primary's: {}",
                    c.differences.len(),
                    c.chunks,
                    c.differences.join("; ")
                )),
                Some(c) if c.chunks > 0 => None,
                _ => Some(
                    "no chunk of the restore oracle was replayed and compared (no checksum run between the backup and the target: binlogArchive.checksums, archive-binlogs --checksums-every)".to_owned(),
                ),
            };
            if let Some(why) = refused {
                tidemark_mariadb::restore::remove_half_restored(dir).await;
                return Err(CliError::new(
                    Exit::RestoreFailed,
                    anyhow::anyhow!(
                        "--require-oracle: {why}; the data directory {} was removed",
                        dir.display()
                    ),
                ));
            }
        }
    }
    let done = match (&request.datadir, &restored.report) {
        (Some(dir), Some(r)) => Some(Done {
            datadir: dir.clone(),
            bytes: r.bytes_downloaded,
            reached: r.reached,
            gtid_position: r.gtid_position.clone(),
            state_file: r.binlog_state_file.clone(),
            mysql: matches!(
                tidemark_mariadb::restore::mysql_of(&restored.plan),
                Ok(Some(_))
            ),
            oracle: r.oracle.clone(),
        }),
        _ => None,
    };
    report(&restored.plan, done, args.output)?;
    Ok(Exit::Success)
}

/// What a restore that ran wrote.
struct Done {
    datadir: PathBuf,
    bytes: u64,
    reached: Option<jiff::Timestamp>,
    gtid_position: Option<String>,
    state_file: Option<PathBuf>,
    /// A MySQL backup's (clone or dump): its server keeps its GTID set in the data.
    mysql: bool,
    /// The restore oracle's comparison, where the replayed data holds it.
    oracle: Option<tidemark_mariadb::oracle::Comparison>,
}

fn report(plan: &RestorePlan, done: Option<Done>, output: OutputFormat) -> Result<(), CliError> {
    let json = output.structured();
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
            server: m.server.clone(),
        })
        .collect();
    if json {
        return crate::output::emit_as(
            output,
            &RestoreOut {
                format_version: JSON_FORMAT_VERSION,
                target: plan.target,
                recovery_window: plan.recovery_window.clone(),
                backups,
                segments: plan.segments.clone(),
                start_position: plan.start_position.clone(),
                runs: plan.runs.clone(),
                stop_datetime: plan.stop_datetime,
                dry_run: done.is_none(),
                bytes_downloaded: done.as_ref().map(|d| d.bytes),
                reached: done.as_ref().and_then(|d| d.reached),
                gtid_position: done.as_ref().and_then(|d| d.gtid_position.clone()),
                binlog_state_file: done.as_ref().and_then(|d| d.state_file.clone()),
                oracle: done.as_ref().and_then(|d| d.oracle.clone()),
                datadir: done.map(|d| d.datadir),
            },
        );
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
                b.log_position.as_ref().map_or_else(
                    || "-".into(),
                    |p| match &p.gtid {
                        Some(g) => g.clone(),
                        None => format!("{}:{}", p.file, p.position),
                    },
                ),
                b.server.as_ref().map_or_else(
                    || "-".into(),
                    |s| {
                        let id = s.server_id.map_or_else(|| "?".into(), |i| i.to_string());
                        match &s.role {
                            Some(r) => format!("{id} ({r})"),
                            None => id,
                        }
                    },
                ),
            ]
        })
        .collect();
    out.push_str(&table(
        &["TYPE", "BACKUP", "COMPLETED", "SIZE", "POSITION", "SERVER"],
        &rows,
    ));
    if plan.segments.is_empty() {
        out.push_str("\nno binlog replay: the target is the backup's own restore point\n");
    } else {
        let from = match (
            &plan.start_position,
            plan.runs.first().and_then(|r| r.start_after.as_ref()),
        ) {
            (Some(p), _) => format!("{} position {}", p.file, p.position),
            (None, Some(g)) => format!("after GTID {g}"),
            (None, None) => format!("the start of {}", plan.segments[0].name),
        };
        let stop = plan.stop_datetime.map_or_else(String::new, |s| {
            format!(", stopping before events stamped {s}")
        });
        out.push_str(&format!("\nreplay from {from}{stop}:\n"));
        if plan.runs.len() > 1 {
            for r in &plan.runs {
                let server = r
                    .server_id
                    .map_or_else(|| "unknown server".into(), |s| format!("server {s}"));
                let stop = r
                    .stop_at
                    .as_ref()
                    .map_or_else(String::new, |g| format!(", up to the switch at {g}"));
                let start = r
                    .start_after
                    .as_ref()
                    .map_or_else(String::new, |g| format!(" after {g}"));
                let start = match r.switched_at {
                    Some(at) => format!("{start} (the switch at {at})"),
                    None => start,
                };
                out.push_str(&format!(
                    "  timeline {} ({server}): {} segment(s){start}{stop}\n",
                    r.timeline, r.count
                ));
            }
        }
        let rows: Vec<Vec<String>> = plan
            .segments
            .iter()
            .map(|s| {
                let t = |t: Option<jiff::Timestamp>| {
                    t.map_or_else(|| "unknown".into(), |t| t.to_string())
                };
                vec![
                    s.name.clone(),
                    s.timeline.to_string(),
                    s.server_id.map_or_else(|| "-".into(), |i| i.to_string()),
                    t(s.first_event_at),
                    t(s.last_event_at),
                    human_bytes(s.size),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "SEGMENT",
                "TIMELINE",
                "SERVER",
                "FIRST EVENT",
                "LAST EVENT",
                "SIZE",
            ],
            &rows,
        ));
    }
    // Where the restored server's binlog continues from (issue 46 §3).
    let done_gtid = done.as_ref().and_then(|d| {
        let p = d.gtid_position.as_ref()?;
        if d.mysql {
            return Some(format!(
                "its GTID set is {p}, kept in the data directory (mysql.gtid_executed): the server continues from it\n"
            ));
        }
        Some(match &d.state_file {
            Some(f) => format!(
                "its GTID position is {p}: with log_bin = {}, its binlog continues from it ({} is read at its first start), so new writes continue the history\n",
                f.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned()),
                f.display()
            ),
            None => format!(
                "its GTID position is {p}; the backup records no binlog name, so set it before writing: RESET MASTER; SET GLOBAL gtid_binlog_state = '{p}'\n"
            ),
        })
    });
    if let Some(c) = done.as_ref().and_then(|d| d.oracle.as_ref()) {
        out.push_str(&if c.differences.is_empty() {
            format!(
                "\nthe restore oracle: {} chunk(s) replayed and compared, each the primary's\n",
                c.chunks
            )
        } else {
            format!(
                "\nthe restore oracle: {} of {} chunk(s) differ from the primary's (above)\n",
                c.differences.len(),
                c.chunks
            )
        });
    }
    match done {
        None => out.push_str("\ndry run: nothing was written\n"),
        Some(d) => out.push_str(&format!(
            "\nrestored into {} ({} downloaded){}; start {} with --datadir={}\n",
            d.datadir.display(),
            human_bytes(d.bytes),
            d.reached
                .map_or_else(String::new, |t| format!(", up to the transaction of {t}")),
            if d.mysql { "mysqld" } else { "mariadbd" },
            d.datadir.display()
        )),
    }
    if let Some(d) = &done_gtid {
        out.push_str(d);
    }
    crate::output::emit(&out)
}

/// `tidemark restore-test`: restores a point into scratch space, checks it, records the
/// outcome beside the backup restored, and removes the scratch data.
pub async fn restore_test(args: &RestoreTestArgs) -> Result<Exit, CliError> {
    if let Some(policy) = &args.policy_name {
        refuse_beside_policy(policy, &unused_by_restore_test_of_policy())?;
        return crate::cluster::restore_test(args, policy).await;
    }
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
    let point = match &args.to {
        Some(t) => check::Point::At(t.parse::<jiff::Timestamp>().map_err(|_| {
            CliError::input(format!(
                "invalid --to {t:?}: expected an RFC 3339 time such as 2026-11-20T14:05:00Z"
            ))
        })?),
        None if args.random || policy_random => check::Point::Random,
        None => check::Point::Newest,
    };
    let scratch = args.scratch.clone().unwrap_or_else(std::env::temp_dir);
    let json = args.output.structured();
    let steps = Steps::default();
    let progress: &dyn Progress = if json { &NoProgress } else { &steps };
    let request = RestoreTestRequest {
        point,
        scratch,
        check: spec,
        by: "tidemark restore-test".into(),
        run_id: args.run_id.clone(),
    };
    let db = MariaDbTools {
        tools: args.tools.tools()?,
    };
    let record = tidemark_engine::restore::restore_test(&db, store, &request, progress).await?;
    let outcome = &record.outcome;
    if json {
        crate::output::emit_as(args.output, &record)?;
    } else {
        let mut out = format!(
            "restore test of {} ({}/{}, {} backup(s), {} binlog(s)): {}\n{} table(s) checked\n",
            record.target,
            record.backup_name,
            record.backup_id,
            record.chain.len(),
            record.segments_replayed,
            if outcome.passed { "passed" } else { "FAILED" },
            outcome.tables_checked
        );
        if let Some(r) = &outcome.query_result {
            out.push_str(&format!("query result: {r}\n"));
        }
        for p in &outcome.problems {
            out.push_str(&format!("problem: {p}\n"));
        }
        crate::output::emit(&out)?;
    }
    Ok(if outcome.passed {
        Exit::Success
    } else {
        Exit::Data
    })
}
