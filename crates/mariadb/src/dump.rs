//! MySQL's logical backups (issue 47, `method: mysqldump`): `mysqldump --single-transaction`
//! of every database but the server's own, with the GTID set and binlog coordinates of its
//! snapshot read from the dump's head, streamed into the store as one payload
//! (`backup.sql`). A restore loads it into a new data directory on a private MySQL server
//! ([`load`]); binlogs then replay onto it as onto a clone (`crate::clone::replay`).
//!
//! # What it costs the source
//! A full read of every table through one connection, and a global read lock for the
//! moment it takes to start the snapshot (`FLUSH TABLES WITH READ LOCK`, which waits for
//! running statements: a long query on the source holds every write back until it ends).
//! So the lock is not asked for while a statement holding a table (a granted table lock in
//! `performance_schema.metadata_locks`) has run on the source for [`LONG_STATEMENT`] or
//! more: the dump waits up to [`LOCK_WAIT`] for such statements to end, else fails naming
//! one (this needs the `PROCESS` right: without it the account sees only its own
//! statements). One that starts after that check can still hold the lock's `FLUSH TABLES`
//! back: when mysqldump is still flushing after [`LOCK_WAIT`], its statement is killed
//! (`KILL QUERY`, on its own connection — this account's, a mysqldump's, with this
//! process's pid: no right needed; mysqldump itself when the source cannot be asked) and
//! the backup fails, naming the wait. The source's writes then still wait for the long
//! statement to end: MySQL keeps the tables it flushed marked until then.
//! The account needs `SELECT`, `SHOW VIEW`, `TRIGGER`, `EVENT`, `RELOAD` and `REPLICATION
//! CLIENT`.
//!
//! # Hostile input
//! A dump in the bucket may be a bucket writer's: it is loaded by an account with the
//! replay's rights only ([`crate::server::MYSQL_REPLAY_GRANTS`]: no global setting, no
//! file, no object with another definer, no write to the `mysql` schema) through a client
//! that runs no client command (`--binary-mode`: no `\!`, `system`, `source` or `tee`),
//! on a private server that never runs as root and has no network, no plugin and no file
//! access through SQL.

use std::path::Path;
use std::process::Stdio;

use tidemark_core::gtidset::GtidSet;
use tidemark_store::format::{LogPosition, Metadata};
use tidemark_store::transfer;
use tidemark_store::{ClusterStore, Progress};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

use crate::clone::{Donor, SourceFacts};
use crate::server::{Account, PrivateServer, hand_over, open_to_server, server_user};
use crate::tools::{Flavor, RestoreError, Tools, spawn, tail};

/// The method's name, in `metadata.json` and in a schedule's `method`.
pub const METHOD: &str = "mysqldump";
/// The payload's extension: SQL text.
pub const EXT: &str = "sql";

/// The most of a dump's beginning read for its point (the head is a few hundred bytes
/// and a GTID set: a set of a hundred thousand uuids still fits).
const HEAD_MAX: usize = 8 << 20;
/// The most the list of the source's databases may hold (hex names, comma-separated).
const DATABASES_MAX: usize = 16 << 20;
/// What a restore's error shows of the client's or the dump's complaints.
const STDERR_MAX: usize = 64 * 1024;
/// The longest mysqldump may wait to take its global read lock (its `FLUSH TABLES`, behind
/// a long statement, with every write on the source queued behind it) before the wait is
/// killed and the backup fails.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// A statement that has run this long may run much longer: the dump's global read lock is
/// not asked for behind it.
pub const LONG_STATEMENT: std::time::Duration = std::time::Duration::from_secs(10);
/// The server's own schemas: not dumped (a restore makes its own).
const SYSTEM_SCHEMAS: [&str; 4] = ["mysql", "sys", "performance_schema", "information_schema"];

/// Where a dump's data is consistent, as its head says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpPoint {
    /// The transactions the dump holds (`GTID_PURGED`), when the source has GTIDs.
    pub gtid_executed: Option<GtidSet>,
    /// The source's binlog file and position at the snapshot, when it writes one.
    pub position: Option<LogPosition>,
}

/// Reads a dump's point from its head: the commented `SET @@GLOBAL.GTID_PURGED='+…'` of
/// `--set-gtid-purged=COMMENTED` and the commented `CHANGE REPLICATION SOURCE TO
/// SOURCE_LOG_FILE='…', SOURCE_LOG_POS=…` of `--source-data=2`.
///
/// # Errors
/// A GTID set or position that is there but does not parse.
pub fn read_head(head: &str) -> Result<DumpPoint, String> {
    let mut point = DumpPoint::default();
    const GTIDS: &str = "/* SET @@GLOBAL.GTID_PURGED='+";
    if let Some(start) = head.find(GTIDS) {
        let rest = &head[start + GTIDS.len()..];
        let end = rest
            .find("';*/")
            .ok_or("the dump's GTID set does not end (';*/)")?;
        let text: String = rest[..end].chars().filter(|c| *c != '\n').collect();
        point.gtid_executed = Some(
            GtidSet::parse(text.trim())
                .map_err(|e| format!("the dump's GTID set does not parse: {e}"))?,
        );
    }
    const POSITION: &str = "\n-- CHANGE REPLICATION SOURCE TO SOURCE_LOG_FILE='";
    if let Some(start) = head.find(POSITION) {
        let rest = &head[start + POSITION.len()..];
        let line = rest.lines().next().unwrap_or_default();
        let problem = || format!("the dump's binlog position does not parse: {line:?}");
        let (file, after) = line.split_once("', SOURCE_LOG_POS=").ok_or_else(problem)?;
        let position = after
            .strip_suffix(';')
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(problem)?;
        if !tidemark_store::layout::is_segment_name(file) {
            return Err(problem());
        }
        point.position = Some(LogPosition {
            file: file.to_owned(),
            position,
            gtid: None,
        });
    }
    Ok(point)
}

/// A dump running: its stream's copy task (which reads the head on the way) and the
/// program, for [`Dumping::finish`].
#[derive(Debug)]
pub struct Dumping {
    pub source: SourceFacts,
    /// The source and its databases when the dump started: asked again at its end.
    donor: Donor,
    work: std::path::PathBuf,
    names: Vec<String>,
    child: Child,
    copy: tokio::task::JoinHandle<std::io::Result<(String, jiff::Timestamp)>>,
    stderr: tokio::task::JoinHandle<Vec<u8>>,
    /// [`watch_lock`], and why it stopped the dump, if it did.
    watchdog: AbortOnDrop,
    stalled: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

/// What a finished dump recorded.
#[derive(Debug, Clone)]
pub struct Dumped {
    pub point: DumpPoint,
    pub source: SourceFacts,
    /// When its head (its point) was read: the data is consistent at or before then.
    pub consistent_at: jiff::Timestamp,
}

/// The source's own databases (all but [`SYSTEM_SCHEMAS`]), by name.
async fn databases(donor: &Donor, work: &Path) -> Result<Vec<String>, RestoreError> {
    let quoted: Vec<String> = SYSTEM_SCHEMAS.iter().map(|s| format!("'{s}'")).collect();
    // In hex: a name may hold any character, and the client's batch output escapes some.
    let row = donor
        .ask_at_most(
            work,
            &format!(
                "SET SESSION group_concat_max_len = {DATABASES_MAX}; \
                 SELECT COALESCE(GROUP_CONCAT(HEX(SCHEMA_NAME) ORDER BY SCHEMA_NAME SEPARATOR ','), '') \
                 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME NOT IN ({})",
                quoted.join(", ")
            ),
            DATABASES_MAX,
        )
        .await?;
    let text = row.first().map(String::as_str).unwrap_or_default();
    text.split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            hex::decode(h)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| RestoreError::Source {
                    source_server: format!("{donor:?}"),
                    problem: format!("a database name that is not hex of UTF-8: {h:?}"),
                })
        })
        .collect()
}

/// Refuses a source whose databases hold a view, trigger, routine or event: each carries its
/// definer, and a restore's load may not create an object as another account (a forged
/// dump could otherwise run code as root on the restore's server), so its dump could
/// not be restored. Better said now than found at the restore.
async fn refuse_definers(donor: &Donor, work: &Path) -> Result<(), RestoreError> {
    let not_system = |column: &str| {
        let quoted: Vec<String> = SYSTEM_SCHEMAS.iter().map(|s| format!("'{s}'")).collect();
        format!("{column} NOT IN ({})", quoted.join(", "))
    };
    let row = donor
        .ask(
            work,
            &format!(
                "SELECT (SELECT COUNT(*) FROM information_schema.VIEWS WHERE {}), \
                 (SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE {}), \
                 (SELECT COUNT(*) FROM information_schema.ROUTINES WHERE {}), \
                 (SELECT COUNT(*) FROM information_schema.EVENTS WHERE {})",
                not_system("TABLE_SCHEMA"),
                not_system("TRIGGER_SCHEMA"),
                not_system("ROUTINE_SCHEMA"),
                not_system("EVENT_SCHEMA"),
            ),
        )
        .await?;
    let found: Vec<String> = ["view", "trigger", "routine", "event"]
        .iter()
        .zip(&row)
        .filter(|(_, n)| n.as_str() != "0")
        .map(|(kind, n)| format!("{n} {kind}(s)"))
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    Err(RestoreError::Source {
        source_server: format!("{donor:?}"),
        problem: format!(
            "its databases hold {}, each defined by an account: a restore loads a dump as \
             an account that may not create objects as another (a forged dump could run code \
             as root), so this dump could not be restored; back this source up with method \
             mysql-clone",
            found.join(", ")
        ),
    })
}

/// Starts `mysqldump` (`program`) on the source: one consistent snapshot of its own
/// databases, the GTID set and binlog position commented in its head. Returns the dump's
/// stream and the run. Its global read lock may be waited for `lock_wait` ([`LOCK_WAIT`]),
/// then the wait is killed ([`watch_lock`]).
///
/// # Errors
/// The source refuses ([`crate::clone::facts`]), its databases cannot be listed or hold
/// objects with a definer ([`refuse_definers`]), or the program cannot be started.
pub async fn start(
    donor: &Donor,
    program: &std::ffi::OsString,
    work: &Path,
    lock_wait: std::time::Duration,
) -> Result<(impl AsyncRead + Send + Unpin + 'static, Dumping), RestoreError> {
    let source = crate::clone::facts(donor, work).await?;
    let names = databases(donor, work).await?;
    refuse_definers(donor, work).await?;
    if source.log_bin || source.gtids {
        // The head's point takes the lock (`--source-data`, `--set-gtid-purged`).
        no_long_statements(donor, work, lock_wait).await?;
    }
    let login = donor.login(work)?;
    let mut cmd = Command::new(program);
    cmd.arg(format!("--defaults-file={}", login.display()))
        .args([
            "--single-transaction",
            "--routines",
            "--events",
            "--triggers",
            "--hex-blob",
            "--no-tablespaces",
            "--default-character-set=utf8mb4",
            "--max-allowed-packet=1G",
        ])
        .arg(if source.gtids {
            "--set-gtid-purged=COMMENTED"
        } else {
            "--set-gtid-purged=OFF"
        });
    if source.log_bin {
        cmd.arg("--source-data=2");
    }
    if names.is_empty() {
        // Nothing of the source's own: the head (its point) alone, from a schema every
        // server has.
        cmd.args([
            "--no-create-db",
            "--no-create-info",
            "--no-data",
            "--skip-routines",
            "--skip-events",
            "--skip-triggers",
            "--databases",
            "--",
            "sys",
        ]);
    } else {
        cmd.args(["--databases", "--"]).args(names.iter());
    }
    let mut child = spawn(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        program,
    )?;
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(crate::tools::no_pipe("mysqldump"));
    };
    let stderr = tokio::spawn(async move {
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        while let Ok(n) = err.read(&mut buf).await {
            if n == 0 {
                break;
            }
            kept.extend_from_slice(&buf[..n]);
            if kept.len() > STDERR_MAX {
                kept.drain(..kept.len() - STDERR_MAX);
            }
        }
        kept
    });
    let past_lock = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stalled = std::sync::Arc::new(std::sync::Mutex::new(None));
    let watchdog = AbortOnDrop(tokio::spawn(watch_lock(
        donor.clone(),
        work.to_path_buf(),
        child.id(),
        (past_lock.clone(), stalled.clone()),
        lock_wait,
    )));
    let (read, mut write) = tokio::io::duplex(1 << 20);
    let copy = tokio::spawn(async move {
        // The head ends once the snapshot is taken and the lock released.
        let passed = || past_lock.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut head = Vec::new();
        let mut seen: Option<(String, jiff::Timestamp)> = None;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = out.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            if seen.is_none() {
                head.extend_from_slice(&buf[..n]);
                let end = find(&head, b"\n-- Current Database: ")
                    .or((head.len() >= HEAD_MAX).then_some(HEAD_MAX));
                if let Some(end) = end {
                    passed();
                    head.truncate(end);
                    seen = Some((
                        String::from_utf8_lossy(&head).into_owned(),
                        jiff::Timestamp::now(),
                    ));
                    head = Vec::new();
                }
            }
            write.write_all(&buf[..n]).await?;
        }
        passed();
        write.shutdown().await?;
        Ok(seen.unwrap_or_else(|| {
            (
                String::from_utf8_lossy(&head).into_owned(),
                jiff::Timestamp::now(),
            )
        }))
    });
    Ok((
        read,
        Dumping {
            source,
            donor: donor.clone(),
            work: work.to_path_buf(),
            names,
            child,
            copy,
            stderr,
            watchdog,
            stalled,
        },
    ))
}

/// Waits up to `wait` while a statement has run on the source for [`LONG_STATEMENT`] (or
/// `wait`, when shorter) or more — a client's, not a replica's applier or a daemon's —
/// checking every 2 s.
///
/// # Errors
/// One still runs after `wait` (named, with its connection and start); the source could
/// not be asked.
async fn no_long_statements(
    donor: &Donor,
    work: &Path,
    wait: std::time::Duration,
) -> Result<(), RestoreError> {
    let long = LONG_STATEMENT.min(wait).as_secs().max(1);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let row = donor
            .ask(
                work,
                &format!(
                    "SELECT p.ID, p.TIME, HEX(LEFT(p.INFO, 80)) FROM information_schema.PROCESSLIST p \
                     WHERE p.COMMAND = 'Query' AND p.TIME >= {long} AND p.ID <> CONNECTION_ID() \
                     AND p.INFO IS NOT NULL AND p.USER <> 'system user' \
                     AND EXISTS (SELECT 1 FROM performance_schema.metadata_locks m \
                       JOIN performance_schema.threads t ON t.THREAD_ID = m.OWNER_THREAD_ID \
                       WHERE t.PROCESSLIST_ID = p.ID AND m.OBJECT_TYPE = 'TABLE' \
                       AND m.LOCK_STATUS = 'GRANTED') \
                     ORDER BY p.TIME DESC LIMIT 1"
                ),
            )
            .await?;
        let Some(id) = row.first().filter(|i| !i.is_empty()) else {
            return Ok(());
        };
        if tokio::time::Instant::now() >= deadline {
            let statement = row
                .get(2)
                .and_then(|h| hex::decode(h).ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            return Err(RestoreError::Source {
                source_server: format!("{donor:?}"),
                problem: format!(
                    "a statement has run for {} s (connection {id}: {statement:?}), and still ran \
                     after {} s: mysqldump's global read lock (FLUSH TABLES WITH READ LOCK) would \
                     wait behind it with every write on the source queued behind the lock, so it \
                     was not asked for; the next backup tries again",
                    row.get(1).map_or("?", String::as_str),
                    wait.as_secs()
                ),
            });
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}

/// Bounds mysqldump's wait for its global read lock: after `wait`, while its head has not
/// come (`past_lock`), asks the source every 2 s for mysqldump's own connection (the
/// connection attribute `_pid` of process `pid`) running a `FLUSH`, and kills that
/// statement (or, if the source refuses, mysqldump), saying why in `stalled` first.
async fn watch_lock(
    donor: Donor,
    work: std::path::PathBuf,
    pid: Option<u32>,
    (past_lock, stalled): (
        std::sync::Arc<std::sync::atomic::AtomicBool>,
        std::sync::Arc<std::sync::Mutex<Option<String>>>,
    ),
    wait: std::time::Duration,
) {
    let Some(pid) = pid else {
        return;
    };
    tokio::time::sleep(wait).await;
    let stop = |why: String| {
        if let Ok(mut slot) = stalled.lock() {
            *slot = Some(why);
        }
    };
    // mysqldump itself, when its statement cannot be killed (the task is aborted before
    // the run reaps it: the pid is still mysqldump's).
    let kill_dump = || {
        if let Some(pid) = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    };
    let mut unanswered = 0;
    while !past_lock.load(std::sync::atomic::Ordering::SeqCst) {
        // Its connection: this account's, a mysqldump's, of this process.
        let asked = donor
            .ask(
                &work,
                &format!(
                    "SELECT t.PROCESSLIST_ID, LEFT(t.PROCESSLIST_INFO, 64) \
                     FROM performance_schema.threads t \
                     JOIN performance_schema.session_connect_attrs a \
                     ON a.PROCESSLIST_ID = t.PROCESSLIST_ID AND a.ATTR_NAME = '_pid' AND a.ATTR_VALUE = '{pid}' \
                     JOIN performance_schema.session_connect_attrs p \
                     ON p.PROCESSLIST_ID = t.PROCESSLIST_ID AND p.ATTR_NAME = 'program_name' AND p.ATTR_VALUE = 'mysqldump' \
                     WHERE t.PROCESSLIST_INFO LIKE 'FLUSH %' \
                     AND t.PROCESSLIST_USER = SUBSTRING_INDEX(USER(), '@', 1) LIMIT 1"
                ),
            )
            .await;
        let why = |statement: &str| {
            format!(
                "mysqldump waited more than {} s for its global read lock ({statement:?}, behind \
                 a long statement on the source, with the source's writes queued behind it): \
                 stopped; the next backup tries again",
                wait.as_secs()
            )
        };
        match asked {
            Ok(row) => {
                unanswered = 0;
                if let Some(id) = row.first().and_then(|i| i.parse::<u64>().ok())
                    && !past_lock.load(std::sync::atomic::Ordering::SeqCst)
                {
                    stop(why(&row.get(1).cloned().unwrap_or_default()));
                    if donor.ask(&work, &format!("KILL QUERY {id}")).await.is_err() {
                        kill_dump();
                    }
                    return;
                }
            }
            // The source cannot be asked (no performance_schema, no connection left while
            // writes queue): the wait is ended from here.
            Err(_) => {
                unanswered += 1;
                if unanswered >= 3 {
                    stop(why("its connection could not be asked about"));
                    kill_dump();
                    return;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}

/// A task stopped when its owner goes (a dump dropped without [`Dumping::finish`] leaves
/// no watchdog asking the source).
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Dumping {
    /// Waits for the dump to end (stops it first when `stop`), and reads its point.
    ///
    /// # Errors
    /// The program failed (with the end of what it said), the stream broke, or its head
    /// lacks the point the source promised (a GTID set with GTIDs on, a position with a
    /// binlog).
    pub async fn finish(mut self, stop: bool) -> Result<Dumped, String> {
        if stop {
            let _ = self.child.start_kill();
        }
        let copied = self.copy.await;
        // Its stream is over: a watchdog still asking has nothing left to stop (and may not
        // signal the pid once it is reaped).
        self.watchdog.0.abort();
        let status = self.child.wait().await;
        let said = self.stderr.await.unwrap_or_default();
        let said = tail(&String::from_utf8_lossy(&said));
        let stalled = self.stalled.lock().ok().and_then(|mut s| s.take());
        // (A flush that ended just before its kill: the dump went on and succeeded.)
        if let Some(why) = stalled
            && !status.as_ref().is_ok_and(std::process::ExitStatus::success)
        {
            return Err(format!("{why}. mysqldump said: {said}"));
        }
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => return Err(format!("mysqldump failed ({s}): {said}")),
            Err(e) => return Err(format!("mysqldump could not be waited for: {e}")),
        }
        let (head, consistent_at) = match copied {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(format!("the dump's stream broke: {e}")),
            Err(e) => return Err(format!("the dump's stream broke: {e}")),
        };
        let point = read_head(&head)?;
        if self.source.gtids && point.gtid_executed.is_none() {
            return Err(
                "the dump's head holds no GTID set (GTID_PURGED), though the source has GTIDs on"
                    .into(),
            );
        }
        if self.source.log_bin && point.position.is_none() {
            return Err(
                "the dump's head holds no binlog position, though the source writes a binlog"
                    .into(),
            );
        }
        // The databases were listed, and their objects counted, before the snapshot: one
        // made between the two would be missing from the dump while its creation is in the
        // dump's GTID set (never replayed), and an object with a definer would make the
        // dump unloadable. Asked again: any change fails this backup (the next one runs).
        let now = databases(&self.donor, &self.work)
            .await
            .map_err(|e| e.to_string())?;
        if now != self.names {
            let made: Vec<&String> = now.iter().filter(|n| !self.names.contains(n)).collect();
            let gone: Vec<&String> = self.names.iter().filter(|n| !now.contains(n)).collect();
            return Err(format!(
                "the source's databases changed while it was dumped (made: {made:?}, dropped: {gone:?}): the dump may lack one its GTID set claims; the next backup takes them as they are"
            ));
        }
        refuse_definers(&self.donor, &self.work)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Dumped {
            point,
            source: self.source,
            consistent_at,
        })
    }
}

/// Loads backup `m` (a dump) into a new data directory `datadir` (empty): `mysqld
/// --initialize-insecure` with the source's geometry, then the dump streamed from the
/// store (checked against its checksum as it streams) into MySQL's client as an account
/// with the replay's rights, on a private server. The data then holds exactly the dump's
/// GTID set, and one account: `root@localhost`, with an empty password that has expired
/// (the first login must set one). Returns the payload's bytes.
///
/// # Errors
/// A server did not start or stop cleanly, the load failed (the client's error names the
/// line and what was refused), or the download or its checksum failed.
pub async fn load(
    store: &ClusterStore,
    m: &Metadata,
    datadir: &Path,
    work: &Path,
    tools: &Tools,
    progress: &dyn Progress,
) -> Result<u64, RestoreError> {
    let io = crate::tools::io_error;
    let geometry = crate::clone::geometry(m);
    let out = work.join("initialize");
    std::fs::create_dir_all(&out).map_err(io("creating the initialize directory", &out))?;
    let user = server_user(tools, datadir).await?;
    if let Some(user) = &user {
        open_to_server(tools, work).await?;
        hand_over(&out, user)?;
        hand_over(datadir, user)?;
    }
    crate::clone::initialize(
        tools,
        datadir,
        &out,
        user.as_ref().map(|u| u.name()),
        geometry,
    )
    .await?;
    let mut server =
        PrivateServer::start_flavor(&Flavor::MySql(geometry), datadir, &work.join("load"), tools)
            .await?;
    let loaded = async {
        let login = server.account(tools, Account::Load).await?;
        progress.step(&format!("loading the dump of backup {}", m.backup_id), 0);
        let mut client = spawn(
            Command::new(&tools.mysql)
                .args(login.args(&server.socket))
                .arg("--binary-mode")
                .arg("--local-infile=0")
                .arg("--max-allowed-packet=1G")
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
            &tools.mysql,
        )?;
        let (Some(mut stdin), Some(mut err)) = (client.stdin.take(), client.stderr.take()) else {
            return Err(crate::tools::no_pipe("the dump's client"));
        };
        let said = tokio::spawn(async move {
            let mut kept = Vec::new();
            let _ = (&mut err)
                .take(STDERR_MAX as u64)
                .read_to_end(&mut kept)
                .await;
            kept
        });
        let copied = transfer::download(store, m, &mut stdin, progress).await;
        let _ = stdin.shutdown().await;
        drop(stdin);
        let status = client.wait().await.map_err(|source| RestoreError::Spawn {
            program: tools.mysql.to_string_lossy().into_owned(),
            source,
        })?;
        let said = String::from_utf8_lossy(&said.await.unwrap_or_default()).into_owned();
        // A read from the store that failed on its own cut the dump mid-statement: the
        // client's complaint (a syntax error) is its consequence, so the store's error
        // comes first. Else the client's refusal: it ends the download with a broken pipe.
        let copied = match copied {
            Err(e) if !matches!(e, transfer::TransferError::Sink(_)) => return Err(e.into()),
            other => other,
        };
        if !status.success() {
            return Err(RestoreError::Tool {
                step: format!("loading the dump of backup {}", m.backup_id),
                status: status.to_string(),
                tail: tail(&said),
            });
        }
        let payload = copied?;
        // Exactly the dump's transactions (the load's own are not any server's), in the
        // words of the private server's version (MySQL 8.2 renamed RESET MASTER).
        let version = server.admin_query(tools, "SELECT @@version").await?;
        let renamed = crate::clone::version_of(version.trim()).is_some_and(|v| v >= (8, 2, 0));
        let mut sql = if renamed {
            "RESET BINARY LOGS AND GTIDS;"
        } else {
            "RESET MASTER;"
        }
        .to_owned();
        if let Some(set) = m.gtid_set() {
            sql.push_str(&format!("SET GLOBAL gtid_purged = '{set}';"));
        }
        sql.push_str("ALTER USER 'root'@'localhost' PASSWORD EXPIRE;");
        server.admin_sql(tools, &sql).await?;
        Ok(payload.size)
    }
    .await;
    let stopped = server.stop(tools, "mysqld shutdown after the load").await;
    let size = loaded?;
    stopped?;
    // What the new server made at the top of the directory that no restored server should
    // share (its uuid, its keys and certificates): made anew where it starts.
    for entry in std::fs::read_dir(datadir).map_err(io("reading the data directory", datadir))? {
        let entry = entry.map_err(io("reading the data directory", datadir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "auto.cnf" || name.ends_with(".pem") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dumps_head_gives_its_point() {
        let head = "-- MySQL dump 10.13\nSET @@SESSION.SQL_LOG_BIN= 0;\n\n--\n-- GTID state at the beginning of the backup \n--\n\n/* SET @@GLOBAL.GTID_PURGED='+7bdd2010-eceb-11f1-abcd-02fc00000001:1-6,\naaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa:5';*/\n\n--\n-- Position to start replication or point-in-time recovery from\n--\n\n-- CHANGE REPLICATION SOURCE TO SOURCE_LOG_FILE='binlog.000001', SOURCE_LOG_POS=1942;\n\n";
        let point = read_head(head).unwrap();
        assert_eq!(
            point.gtid_executed.unwrap().to_string(),
            "7bdd2010-eceb-11f1-abcd-02fc00000001:1-6,aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa:5"
        );
        let p = point.position.unwrap();
        assert_eq!((p.file.as_str(), p.position), ("binlog.000001", 1942));
        assert_eq!(read_head("-- MySQL dump\n").unwrap(), DumpPoint::default());
        for bad in [
            "/* SET @@GLOBAL.GTID_PURGED='+not a set';*/",
            "/* SET @@GLOBAL.GTID_PURGED='+7bdd2010-eceb-11f1-abcd-02fc00000001:1-6",
            "\n-- CHANGE REPLICATION SOURCE TO SOURCE_LOG_FILE='../x', SOURCE_LOG_POS=4;",
            "\n-- CHANGE REPLICATION SOURCE TO SOURCE_LOG_FILE='b.1', SOURCE_LOG_POS=x;",
        ] {
            assert!(read_head(bad).is_err(), "{bad}");
        }
    }
}
