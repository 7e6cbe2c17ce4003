//! Restore tests (issue 19 §4): a backup is proven by restoring it. The chosen point is
//! restored into scratch space, a private `mariadbd` is started on it, `CHECK TABLE` runs
//! on every table (and an optional query of the user's, compared with the result they
//! expect), the server is stopped and the scratch space removed, whatever happened.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tidemark_store::{ClusterStore, Progress};
use tokio::process::Command;

use crate::restore::{self, PrivateServer, RestoreError, RestorePlan, RestoreReport, Tools};
use crate::server::{self, Account, Login};

/// What a restore test checks besides `CHECK TABLE` on every table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckSpec {
    /// A query run on the restored server (`mariadb -N -B -e`).
    pub query: Option<String>,
    /// Its expected output (tab-separated columns, a line per row); without it the query
    /// only has to succeed.
    pub expect: Option<String>,
}

/// The most problems a test records (a badly damaged database reports one per table).
pub const MAX_PROBLEMS: usize = 50;
/// The most of the query's output a test records.
pub const MAX_RESULT: usize = 4096;
/// Tables per `CHECK TABLE` statement.
const CHECK_BATCH: usize = 64;
/// The longest a test's checks — the `CHECK TABLE` batches and the user's query together —
/// may run; what is left when it passes is not checked (a problem of the test).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
/// The most output one statement may answer.
pub const MAX_OUTPUT: u64 = 16 << 20;

/// How a restore test came out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckOutcome {
    pub passed: bool,
    /// Tables `CHECK TABLE` ran on (system schemas but `mysql` excluded).
    pub tables_checked: usize,
    /// What failed, at most [`MAX_PROBLEMS`]: a table's `CHECK TABLE` error or status, the
    /// query's error or its unexpected result, a server that died.
    pub problems: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_result: Option<String>,
    /// Chunks the restore oracle compared (issue 48: the primary's checksums against those
    /// the replay computed on the restored data); absent when the data holds none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_chunks: Option<u64>,
}

impl CheckOutcome {
    fn problem(&mut self, p: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        }
    }
}

/// Restores `plan` into a scratch directory under `scratch`, checks it as `spec` says, and
/// removes the scratch directory.
///
/// # Errors
/// The restore itself failed (a download, a tool, the server did not start): that is an
/// error, not an outcome. What the checks find is the outcome.
pub async fn restore_and_check(
    store: &ClusterStore,
    plan: &RestorePlan,
    scratch: &Path,
    tools: &Tools,
    spec: &CheckSpec,
    progress: &dyn Progress,
) -> Result<(RestoreReport, CheckOutcome), RestoreError> {
    let work = tempfile::Builder::new()
        .prefix(".tidemark-restore-test-")
        .tempdir_in(scratch)
        .map_err(|source| RestoreError::Io {
            action: "creating the scratch directory".into(),
            dir: scratch.to_path_buf(),
            source,
        })?;
    // The data directory is in it: the server's user goes through.
    server::open_to_server(tools, work.path()).await?;
    let datadir = work.path().join("data");
    let report = restore::restore(store, plan, &datadir, tools, progress).await?;
    // A MySQL clone or dump (issue 47) is checked on MySQL's server, through MySQL's client.
    let (flavor, checks) = match restore::mysql_of(plan)? {
        Some(m) => (
            crate::tools::Flavor::MySql(crate::clone::geometry(m)),
            Tools {
                mariadb: tools.mysql.clone(),
                ..tools.clone()
            },
        ),
        None => (crate::tools::Flavor::MariaDb, tools.clone()),
    };
    let name = if flavor == crate::tools::Flavor::MariaDb {
        "MariaDB"
    } else {
        "MySQL"
    };
    progress.step(&format!("starting {name} on the restored data"), 0);
    let mut server = PrivateServer::start_flavor(&flavor, &datadir, work.path(), tools).await?;
    progress.step("checking every table", 0);
    let mut outcome = match server.account(tools, Account::Check).await {
        Ok(login) => check(&server.socket, &login, &checks, spec).await,
        Err(e) => {
            let mut outcome = CheckOutcome::default();
            outcome.problem(e.to_string());
            outcome
        }
    };
    // The restore oracle, as the replay compared it: every chunk it computed again must be
    // the primary's.
    if let Some(c) = &report.oracle {
        outcome.oracle_chunks = Some(c.chunks);
        for d in &c.differences {
            outcome.problem(format!(
                "the restore oracle: {d} (the restored data is not the primary's there)"
            ));
        }
    }
    if let Err(e) = server
        .stop(tools, &format!("{name} shutdown after the checks"))
        .await
    {
        outcome.problem(e.to_string());
    }
    outcome.passed = outcome.problems.is_empty();
    drop(work); // the restored data goes, whatever the outcome
    Ok((report, outcome))
}

/// Which point of the recovery window a restore test restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// The latest restorable instant (the window's end).
    Newest,
    /// A whole second of the window chosen at random.
    Random,
    At(jiff::Timestamp),
}

/// What a restore test records beside the backup it restored (`_restoretest.json`), and
/// prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreTestRecord {
    pub format_version: u32,
    pub tested_at: jiff::Timestamp,
    /// The instant restored.
    pub target: jiff::Timestamp,
    /// The backup restored (the last of `chain`), where the record is.
    pub backup_name: String,
    pub backup_id: String,
    /// The backup-ids restored, base full first.
    pub chain: Vec<String>,
    pub segments_replayed: usize,
    pub bytes_downloaded: u64,
    pub seconds: u64,
    pub outcome: CheckOutcome,
    /// What ran it (`tidemark restore-test`, `tidemark run`).
    pub by: String,
    /// The caller's name for this run (`--run-id`; the operator's Job), so it finds its own
    /// record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// A whole restore test: chooses the point, restores it into scratch space under
/// `scratch`, checks it ([`restore_and_check`]), and records the outcome beside the backup
/// restored.
///
/// # Errors
/// Nothing to restore, or the restore failed ([`RestoreError`]); the record could not be
/// written. A check that fails is an outcome, not an error.
#[allow(clippy::too_many_arguments)]
pub async fn restore_test(
    store: &ClusterStore,
    point: Point,
    scratch: &Path,
    tools: &Tools,
    spec: &CheckSpec,
    by: &str,
    run_id: Option<&str>,
    progress: &dyn Progress,
) -> Result<RestoreTestRecord, RestoreError> {
    let started = std::time::Instant::now();
    let target = match point {
        Point::At(t) => t,
        Point::Newest => recovery_window(store).await?.to,
        Point::Random => random_instant(&recovery_window(store).await?),
    };
    let plan = restore::resolve(store, target, None, progress).await?;
    let Some(restored) = plan.backups.last() else {
        return Err(RestoreError::Refused(
            tidemark_core::RestoreRefusal::NoRecoveryPoint,
        ));
    };
    let record = |outcome: CheckOutcome, replayed: usize, downloaded: u64| RestoreTestRecord {
        format_version: 1,
        tested_at: jiff::Timestamp::now(),
        target: plan.target,
        backup_name: restored.backup_name.clone(),
        backup_id: restored.backup_id.clone(),
        chain: plan.backups.iter().map(|m| m.backup_id.clone()).collect(),
        segments_replayed: replayed,
        bytes_downloaded: downloaded,
        seconds: started.elapsed().as_secs(),
        outcome,
        by: by.to_owned(),
        run_id: run_id.map(str::to_owned),
    };
    let write = |r: &RestoreTestRecord| {
        let value = serde_json::to_value(r).unwrap_or_default();
        async move {
            tidemark_store::transfer::record_restore_test(
                store,
                &restored.backup_name,
                &restored.backup_id,
                &value,
            )
            .await
        }
    };
    match restore_and_check(store, &plan, scratch, tools, spec, progress).await {
        Ok((done, outcome)) => {
            let passed = outcome.passed;
            let r = record(outcome, plan.segments.len(), done.bytes_downloaded);
            write(&r).await?;
            if passed {
                record_chain_verified(store, &plan, r.tested_at).await;
            }
            Ok(r)
        }
        Err(e) => {
            // A restore that cannot be made is the most important outcome: recorded on the
            // backup too, then reported as the error it is.
            let mut outcome = CheckOutcome {
                query: spec.query.clone(),
                ..Default::default()
            };
            outcome.problem(format!("the restore failed: {e}"));
            let _ = write(&record(outcome, 0, 0)).await;
            Err(e)
        }
    }
}

/// The store's recovery window (a restore to the Unix epoch is refused with it).
async fn recovery_window(
    store: &ClusterStore,
) -> Result<tidemark_core::plan::RecoveryWindow, RestoreError> {
    match restore::resolve(
        store,
        jiff::Timestamp::UNIX_EPOCH,
        None,
        &tidemark_store::NoProgress,
    )
    .await
    {
        Err(RestoreError::Refused(tidemark_core::RestoreRefusal::OutsideWindow {
            window, ..
        })) => Ok(*window),
        Err(e) => Err(e),
        Ok(plan) => Ok(plan.recovery_window),
    }
}

/// A whole second of `window` chosen at random among those it restores (never in a gap):
/// an offset into the restorable seconds, mapped back onto the window's pieces.
fn random_instant(window: &tidemark_core::plan::RecoveryWindow) -> jiff::Timestamp {
    random_instant_with(window, rand::random::<u64>())
}

fn random_instant_with(window: &tidemark_core::plan::RecoveryWindow, r: u64) -> jiff::Timestamp {
    // The restorable pieces, as whole seconds [from, to].
    let mut pieces: Vec<(i64, i64)> = Vec::new();
    let mut start = window.from;
    let mut gaps = window.gaps.clone();
    gaps.sort_by_key(|g| g.from);
    for g in gaps.iter().chain(std::iter::once(&tidemark_core::Interval {
        from: window.to,
        to: window.to,
    })) {
        let from = start.as_second() + i64::from(start.subsec_nanosecond() > 0);
        // A gap's own start is not restorable; the piece ends the second before.
        let to = if g.from == window.to && g.to == window.to {
            window.to.as_second()
        } else {
            let t = g.from.as_second();
            if g.from.subsec_nanosecond() > 0 {
                t
            } else {
                t - 1
            }
        };
        if to >= from {
            pieces.push((from, to));
        }
        start = g.to;
    }
    let total: u64 = pieces
        .iter()
        .map(|(f, t)| u64::try_from(t - f).unwrap_or(0) + 1)
        .sum();
    if total == 0 {
        return window.to;
    }
    let mut pick = r % total;
    for (f, t) in pieces {
        let len = u64::try_from(t - f).unwrap_or(0) + 1;
        if pick < len {
            let at = f + i64::try_from(pick).unwrap_or(0);
            return jiff::Timestamp::from_second(at).unwrap_or(window.to);
        }
        pick -= len;
    }
    window.to
}

/// Runs the checks on the server at `socket`, as `login` (reads only).
async fn check(socket: &Path, login: &Login, tools: &Tools, spec: &CheckSpec) -> CheckOutcome {
    let mut outcome = CheckOutcome {
        query: spec.query.clone(),
        ..Default::default()
    };
    let deadline = tokio::time::Instant::now() + CHECK_TIMEOUT;
    let sql = |statement: String| async move {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        sql_within(socket, login, tools, &statement, left).await
    };
    // Names in hex: the client's batch output escapes tabs, newlines and backslashes, and
    // a name must come back to CHECK TABLE exactly as it is.
    let tables = match sql(
        "SELECT HEX(TABLE_SCHEMA), HEX(TABLE_NAME) FROM information_schema.TABLES \
         WHERE TABLE_TYPE IN ('BASE TABLE', 'SYSTEM VERSIONED') \
         AND TABLE_SCHEMA NOT IN ('information_schema', 'performance_schema', 'sys') \
         ORDER BY TABLE_SCHEMA, TABLE_NAME"
            .to_owned(),
    )
    .await
    {
        Ok(out) => out.lines().filter_map(quoted_table).collect::<Vec<_>>(),
        Err(e) => {
            outcome.problem(format!("listing the tables: {e}"));
            return outcome;
        }
    };
    for (i, batch) in tables.chunks(CHECK_BATCH).enumerate() {
        match sql(format!("CHECK TABLE {}", batch.join(", "))).await {
            Ok(out) => {
                for p in check_problems(&out) {
                    outcome.problem(p);
                }
            }
            Err(e @ SqlError::OutOfTime(_)) => {
                let left = tables.len() - i * CHECK_BATCH;
                outcome.problem(format!(
                    "CHECK TABLE {}: {e}; {left} tables not checked{}",
                    batch.join(", "),
                    if spec.query.is_some() {
                        ", nor the query"
                    } else {
                        ""
                    }
                ));
                return outcome;
            }
            Err(e) => {
                outcome.problem(format!("CHECK TABLE {}: {e}", batch.join(", ")));
                continue;
            }
        }
        outcome.tables_checked += batch.len();
    }
    if let Some(q) = &spec.query {
        match sql(q.clone()).await {
            Ok(out) => {
                let got = out.trim_end_matches('\n').to_owned();
                if let Some(want) = &spec.expect
                    && got != want.trim_end_matches('\n')
                {
                    outcome.problem(format!(
                        "the query returned {:?}, expected {:?}",
                        cut(&got),
                        cut(want)
                    ));
                }
                outcome.query_result = Some(cut(&got));
            }
            Err(e) => outcome.problem(format!("the query failed: {e}")),
        }
    }
    outcome
}

/// After a passed test: every payload of the chain was read whole (sha256, and decoded)
/// and made a database that checks out — what `retention.requireVerified` asks of the
/// newest backup — so each backup of it gets the record a pass would write
/// (`_verified.json`), and the pass need not read it again. Best effort (it only saves a
/// later read): a backup already recorded so is left alone, one with other than one payload
/// (a restore reads one) is not recorded, and a record whose backup went meanwhile (a
/// concurrent pass deleted it) is taken back, so no directory is left without its backup.
async fn record_chain_verified(store: &ClusterStore, plan: &RestorePlan, at: jiff::Timestamp) {
    use tidemark_store::transfer::{self, Checked};
    for m in plan.backups.iter().filter(|m| m.payload.len() == 1) {
        let (name, id) = (&m.backup_name, &m.backup_id);
        let own = transfer::verified_payloads(m);
        if let Err(e) = transfer::record_verified_while_committed(
            store,
            name,
            id,
            &own,
            Checked::Content,
            at,
            "restore test",
        )
        .await
        {
            tracing::warn!(backup = %format!("{name}/{id}"), "not recorded as verified: {e}");
        }
    }
}

/// `` `schema`.`table` `` from a line of two hex columns (backticks doubled inside).
fn quoted_table(line: &str) -> Option<String> {
    let (schema, table) = line.split_once('\t')?;
    let name = |h: &str| -> Option<String> {
        let bytes = hex::decode(h.trim()).ok()?;
        Some(String::from_utf8_lossy(&bytes).replace('`', "``"))
    };
    Some(format!("`{}`.`{}`", name(schema)?, name(table)?))
}

/// The problems in `CHECK TABLE`'s answer (`Table`, `Op`, `Msg_type`, `Msg_text`, tab
/// separated): every `error` row, and a final `status` that is not `OK`.
fn check_problems(out: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for line in out.lines() {
        let cols: Vec<&str> = line.splitn(4, '\t').collect();
        let [table, _op, kind, text] = cols[..] else {
            continue;
        };
        let bad = match kind.to_ascii_lowercase().as_str() {
            "error" => true,
            "status" => !(text == "OK" || text.contains("up to date")),
            _ => false,
        };
        if bad {
            problems.push(format!("{table}: {kind}: {}", cut(text)));
        }
    }
    problems
}

fn cut(s: &str) -> String {
    if s.len() <= MAX_RESULT {
        return s.to_owned();
    }
    format!("{}…", &s[..s.floor_char_boundary(MAX_RESULT)])
}

/// Why a statement gave no answer.
#[derive(Debug)]
enum SqlError {
    /// It failed: the client's error output, or why it could not run.
    Failed(String),
    /// The checks' time ([`CHECK_TIMEOUT`]) ran out.
    OutOfTime(Duration),
}

impl std::fmt::Display for SqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SqlError::Failed(e) => f.write_str(e),
            SqlError::OutOfTime(d) => write!(f, "no answer within {}", humanize(*d)),
        }
    }
}

/// One statement through `mariadb -N -B`, given `timeout`; its output, or its error
/// output. Bounded: a statement that runs out of time or answers more than
/// [`MAX_OUTPUT`] bytes (a user's `SELECT *` of a large table) fails, and the client is
/// killed — a test never waits without end nor fills memory.
async fn sql_within(
    socket: &Path,
    login: &Login,
    tools: &Tools,
    statement: &str,
    timeout: Duration,
) -> Result<String, SqlError> {
    if timeout.is_zero() {
        return Err(SqlError::OutOfTime(CHECK_TIMEOUT));
    }
    use tokio::io::AsyncReadExt as _;
    let mut child = restore::hermetic(&mut Command::new(&tools.mariadb))
        .args(login.args(socket))
        .arg("--default-character-set=utf8mb4")
        .args(["-N", "-B", "-e", statement])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            SqlError::Failed(format!(
                "cannot run {}: {e}",
                tools.mariadb.to_string_lossy()
            ))
        })?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(SqlError::Failed("the client's output is not piped".into()));
    };
    let reading = |e: std::io::Error| format!("reading the client's output: {e}");
    // Too much output ends the reading at once (the client, blocked writing, would never
    // close its error output).
    let read_out = async {
        let mut out = Vec::new();
        stdout
            .take(MAX_OUTPUT + 1)
            .read_to_end(&mut out)
            .await
            .map_err(reading)?;
        if out.len() as u64 > MAX_OUTPUT {
            return Err(format!(
                "it answered more than {} MiB (a check's query should answer a little)",
                MAX_OUTPUT >> 20
            ));
        }
        Ok(out)
    };
    let read_err = async {
        let mut err = Vec::new();
        stderr
            .take(MAX_OUTPUT + 1)
            .read_to_end(&mut err)
            .await
            .map_err(reading)?;
        if err.len() as u64 > MAX_OUTPUT {
            return Err(format!("its error output passed {} MiB", MAX_OUTPUT >> 20));
        }
        Ok(err)
    };
    let run = async {
        let (out, err) = tokio::try_join!(read_out, read_err)?;
        let status = child
            .wait()
            .await
            .map_err(|e| format!("waiting for the client: {e}"))?;
        if status.success() {
            Ok(String::from_utf8_lossy(&out).into_owned())
        } else {
            Err(restore::tail(&String::from_utf8_lossy(&err)))
        }
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(answer) => answer.map_err(SqlError::Failed),
        Err(_) => Err(SqlError::OutOfTime(CHECK_TIMEOUT)),
    }
}

/// `6h`, `90s`.
fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A random point is never in a gap: every restorable second can come out, and only
    /// those.
    /// A statement that answers too much, or does not answer, fails with the bound named
    /// and its client killed; one within bounds answers. (A script stands in for the
    /// `mariadb` client: this is about the runner, not the server.)
    #[tokio::test]
    async fn statements_are_bounded_in_time_and_output() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let client = |name: &str, body: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            Tools {
                mariadb: path.into_os_string(),
                ..Tools::default()
            }
        };
        let sock = dir.path().join("sock");
        let login = Login::new(dir.path().join("login.cnf"), "check");
        let sql = |tools: Tools, statement: &'static str| {
            let (sock, login) = (sock.clone(), login.clone());
            async move {
                sql_within(&sock, &login, &tools, statement, CHECK_TIMEOUT)
                    .await
                    .map_err(|e| e.to_string())
            }
        };
        let ok = client("ok", "printf '8\\n'");
        assert_eq!(sql(ok, "SELECT 8").await.unwrap(), "8\n");
        let flood = client("flood", "exec head -c 20000000 /dev/zero");
        let e = sql(flood, "SELECT *").await.unwrap_err();
        assert!(e.contains("more than 16 MiB"), "{e}");
        let flood_err = client("flood-err", "exec head -c 20000000 /dev/zero >&2");
        let e = sql(flood_err, "SELECT *").await.unwrap_err();
        assert!(e.contains("error output passed 16 MiB"), "{e}");
        let hang = client("hang", "exec sleep 30");
        let started = std::time::Instant::now();
        let e = sql_within(
            &sock,
            &login,
            &hang,
            "SELECT SLEEP(30)",
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, SqlError::OutOfTime(_)), "{e}");
        assert!(e.to_string().contains("no answer within 6h"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let failing = client("failing", "echo 'ERROR 1146: no such table' >&2; exit 1");
        let e = sql(failing, "SELECT 1 FROM nope").await.unwrap_err();
        assert!(e.contains("ERROR 1146"), "{e}");
    }

    #[test]
    fn random_points_avoid_the_gaps() {
        let t = |s: &str| s.parse::<jiff::Timestamp>().unwrap();
        let window = tidemark_core::plan::RecoveryWindow {
            from: t("2026-11-25T10:00:00.5Z"),
            point_in_time_from: t("2026-11-25T10:00:00.5Z"),
            to: t("2026-11-25T10:00:09Z"),
            gaps: vec![tidemark_core::Interval {
                from: t("2026-11-25T10:00:03Z"),
                to: t("2026-11-25T10:00:07Z"),
            }],
        };
        let seen: std::collections::BTreeSet<i64> = (0..200)
            .map(|r| {
                random_instant_with(&window, r).as_second() - t("2026-11-25T10:00:00Z").as_second()
            })
            .collect();
        // 1, 2 before the gap; 7, 8, 9 after it (its end restores again).
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [1, 2, 7, 8, 9]);
    }

    #[test]
    fn table_names_come_back_exactly() {
        let line = format!("{}\t{}", hex::encode("shop"), hex::encode("we`ird\tname"));
        assert_eq!(quoted_table(&line).unwrap(), "`shop`.`we``ird\tname`");
        assert_eq!(quoted_table("zz\t00"), None);
    }

    #[test]
    fn check_table_answers_are_read() {
        let out = "shop.orders\tcheck\tstatus\tOK\n\
                   shop.items\tcheck\twarning\tSize of datafile is: 4096\n\
                   shop.items\tcheck\tError\tCorrupt\n\
                   shop.items\tcheck\tstatus\tOperation failed\n\
                   mysql.db\tcheck\tstatus\tTable is already up to date\n";
        assert_eq!(
            check_problems(out),
            [
                "shop.items: Error: Corrupt",
                "shop.items: status: Operation failed"
            ]
        );
        assert!(check_problems("").is_empty());
        assert_eq!(
            cut(&"é".repeat(MAX_RESULT)).chars().count(),
            MAX_RESULT / 2 + 1
        );
    }
}
