//! End to end with a real MariaDB server, mariabackup and the `tidemark` binary, against a
//! real S3 server (SeaweedFS on 127.0.0.1): backups, binlog archiving, a retention pass,
//! point-in-time restores with exact row counts, and a consolidated chain.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{bin, on_bucket, stop_run};

use std::path::Path;
use std::process::{Command, Output};
use std::thread::sleep;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use tidemark_store::testkit::{
    MariaDb, SERVER_USER, SeaweedFs, query_restored, running_as_root, uid_of,
};

struct Env {
    s3: SeaweedFs,
    db: MariaDb,
    /// `TIDEMARK_COMPRESSION` for every command (push and archive-binlogs compress by it;
    /// everything else reads what each object records).
    compression: &'static str,
    /// The bucket, when not the server's auto-created one (a lock-enabled bucket).
    bucket: Option<&'static str>,
}

impl Env {
    fn tidemark(&self, args: &[&str]) -> Output {
        self.tidemark_in(args, &std::env::temp_dir())
    }

    /// `tidemark` with `TMPDIR` set to `tmp`.
    fn tidemark_in(&self, args: &[&str], tmp: &std::path::Path) -> Output {
        self.command(args, tmp).output().unwrap()
    }

    /// The `tidemark` command on this store, with `TMPDIR` set to `tmp`.
    fn command(&self, args: &[&str], tmp: &std::path::Path) -> Command {
        let mut c = bin();
        c.env("TMPDIR", tmp);
        c.env("TIDEMARK_COMPRESSION", self.compression);
        // The subcommand, the store flags, then the rest (which may end in `-- COMMAND`).
        let (sub, rest) = args.split_first().unwrap();
        let url = self
            .bucket
            .map_or_else(|| self.s3.url(), |b| format!("s3://{b}"));
        c.envs(self.s3.env())
            .arg(sub)
            .args(["--store", &url, "--cluster", "e2e"])
            .args(["--endpoint", &self.s3.endpoint])
            .args(rest);
        c
    }

    /// A store and a server with GTID replication's settings and id `server_id` (a primary,
    /// or a replica once told whom to follow), payloads uncompressed.
    fn replicating(server_id: u32) -> Self {
        Env {
            s3: SeaweedFs::start(),
            db: MariaDb::start_replicating(server_id),
            compression: "none",
            bucket: None,
        }
    }

    fn ok(&self, args: &[&str]) -> Output {
        let out = self.tidemark(args);
        assert!(
            out.status.success(),
            "tidemark {args:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(&[args, &["--output", "json"]].concat());
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{args:?}: not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// `push --method mariabackup`, full or incremental; returns the backup-id.
    fn backup(&self, parent: Option<&str>) -> String {
        self.backup_with(parent, &[])
    }

    /// [`Env::backup`] with more `push` flags.
    fn backup_with(&self, parent: Option<&str>, extra: &[&str]) -> String {
        self.backup_on(&self.db, parent, extra)
    }

    /// [`Env::backup_with`] on another server (a replica).
    fn backup_on(&self, db: &MariaDb, parent: Option<&str>, extra: &[&str]) -> String {
        let mut args = vec![
            "push",
            "--backup-name",
            "nightly",
            "--method",
            "mariabackup",
        ];
        if let Some(p) = parent {
            args.extend(["--type", "incremental", "--parent", p]);
        }
        args.extend_from_slice(extra);
        let client = db.client_args();
        let mut full: Vec<&str> = args;
        full.extend(["--output", "json", "--", "mariabackup"]);
        full.extend(client.iter().map(String::as_str));
        let out = self.ok(&full);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        if self.compression.starts_with("zstd") {
            assert_eq!(v["compression"], "zstd", "{v}");
            assert!(
                v["size"].as_u64().unwrap() < v["originalSize"].as_u64().unwrap(),
                "{v}"
            );
        }
        v["backupId"].as_str().unwrap().to_owned()
    }

    /// Closes the current binlog and ships every closed one.
    fn archive(&self) {
        self.archive_from(&self.db);
    }

    /// [`Env::archive`] from another server (the primary after a failover); the pass's
    /// JSON report.
    fn archive_from(&self, db: &MariaDb) -> Value {
        db.sql("FLUSH BINARY LOGS");
        self.json(&[
            "archive-binlogs",
            "--once",
            "--binlog-index",
            db.binlog_index().to_str().unwrap(),
        ])
    }

    fn insert(&self, n: usize) {
        insert_into(&self.db, n);
    }

    /// Restores to `to` into a new directory and counts the rows there. The host's TMPDIR
    /// holds a live server's temporary table, which the restore's private server must not
    /// touch (a starting server deletes every `#sql*` file in its tmpdir).
    fn restored_rows(&self, to: Timestamp, name: &str) -> String {
        self.restored_rows_with(to, name, &[])
    }

    /// [`Env::restored_rows`] with more `restore` flags.
    fn restored_rows_with(&self, to: Timestamp, name: &str, extra: &[&str]) -> String {
        let dir = self.db.scratch().join(name);
        let host_tmp = self.db.scratch().join(format!("{name}-host-tmp"));
        std::fs::create_dir(&host_tmp).unwrap();
        let live = host_tmp.join("#sql-temptable-1-2-3.MAI");
        std::fs::write(&live, b"a live server's temporary table").unwrap();
        let to = to.to_string();
        let report = self.db.scratch().join(format!("{name}-report.json"));
        let mut args = vec![
            "restore",
            "--to",
            &to,
            "--datadir",
            dir.to_str().unwrap(),
            "--report-file",
            report.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = self.tidemark_in(&args, &host_tmp);
        assert!(
            out.status.success(),
            "tidemark {args:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        // What it did in brief (what the operator's Restore Job reports back).
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        assert!(
            summary["bytesDownloaded"].as_u64().unwrap() > 0,
            "{summary}"
        );
        assert!(
            summary["backupsApplied"].as_u64().unwrap() >= 1,
            "{summary}"
        );
        let steps = summary["steps"].as_array().unwrap();
        assert!(
            steps
                .iter()
                .any(|s| s["name"] == "preparing the base backup"),
            "{summary}"
        );
        assert!(
            summary.to_string().len() < 4096,
            "fits a termination message"
        );
        assert!(
            live.exists(),
            "the restore's server deleted {}",
            live.display()
        );
        query_restored(&dir, "SELECT COUNT(*) FROM shop.orders")
    }
}

fn insert_into(db: &MariaDb, n: usize) {
    let values: Vec<String> = (0..n).map(|i| format!("({i})")).collect();
    db.sql(&format!(
        "INSERT INTO shop.orders (v) VALUES {}",
        values.join(",")
    ));
}

/// An instant strictly between two writes: binlog event times have whole seconds, so a
/// write is kept a full second away from any instant the test restores to.
fn pause_and_mark() -> Timestamp {
    sleep(Duration::from_millis(1100));
    let t = Timestamp::now();
    sleep(Duration::from_millis(1100));
    t
}

fn backup_ids(v: &Value) -> Vec<String> {
    v["backups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backupId"].as_str().unwrap().to_owned())
        .collect()
}

/// Run with compression (issue 19 §1): payloads and binlog segments are zstd in the store
/// (`TIDEMARK_COMPRESSION=zstd` for push and archive-binlogs), and restores, point-in-time
/// replay and consolidation read them as they are; the other scenarios keep writing
/// uncompressed objects.
#[test]
fn backups_binlogs_retention_and_point_in_time_restores() {
    let env = Env {
        s3: SeaweedFs::start(),
        db: MariaDb::start(),
        compression: "zstd",
        bucket: None,
    };
    let db = &env.db;
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
    );
    env.insert(5);
    // The oldest recovery point, which the retention pass expires.
    let oldest = env.backup(None);
    let before_full = pause_and_mark();
    env.insert(5); // 10
    db.sql("FLUSH BINARY LOGS");
    let full = env.backup(None);
    env.insert(5); // 15
    let before_incremental = pause_and_mark();
    let incremental = env.backup(Some(&full));
    env.insert(3); // 18
    let between = pause_and_mark();
    env.insert(2); // 20
    let after = pause_and_mark();
    env.archive();

    // The metadata records what an incremental and a restore need.
    let ls = env.json(&["ls"]);
    assert_eq!(
        backup_ids(&ls),
        vec![oldest.clone(), full.clone(), incremental.clone()]
    );

    // Keep the two newest: the oldest full goes, and the binlogs only it needed.
    let gc = env.json(&["gc", "--keep-last", "2"]);
    let deleted: Vec<&str> = gc["backups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["action"] == "delete")
        .map(|b| b["backupId"].as_str().unwrap())
        .collect();
    assert_eq!(deleted, vec![oldest.as_str()], "{gc:#}");
    assert_eq!(
        gc["segments"]["delete"].as_array().unwrap().len(),
        1,
        "the binlog written before the kept full is collected: {gc:#}"
    );

    // Before the oldest kept backup: refused, naming the window.
    let refused = env.tidemark(&["restore", "--to", &before_full.to_string(), "--dry-run"]);
    assert_eq!(refused.status.code(), Some(7), "{refused:?}");
    let msg = String::from_utf8_lossy(&refused.stderr);
    assert!(msg.contains("outside the recovery window"), "{msg}");

    // The dry run names the chain and the binlogs.
    let plan = env.json(&["restore", "--to", &between.to_string(), "--dry-run"]);
    assert_eq!(backup_ids(&plan), vec![full.clone(), incremental.clone()]);
    assert_eq!(plan["dryRun"], true);
    assert!(!plan["segments"].as_array().unwrap().is_empty(), "{plan:#}");
    // Replay starts after the backup's GTID position, not at a file offset.
    assert!(plan["startPosition"].is_null(), "{plan:#}");
    assert!(plan["runs"][0]["startAfter"].is_string(), "{plan:#}");
    // The archived segments are compressed in the store (their index entries say so).
    assert!(
        plan["segments"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["compression"] == "zstd"),
        "{plan:#}"
    );

    assert_eq!(
        env.restored_rows(before_incremental, "before-incremental"),
        "15"
    );
    assert_eq!(env.restored_rows(between, "between"), "18");
    assert_eq!(env.restored_rows(after, "after"), "20");

    // An existing, non-empty data directory is refused and left alone.
    let taken = db.scratch().join("after");
    let again = env.tidemark(&[
        "restore",
        "--to",
        &after.to_string(),
        "--datadir",
        taken.to_str().unwrap(),
    ]);
    assert_eq!(again.status.code(), Some(2), "{again:?}");
    assert!(Path::new(&taken).join("shop").exists());

    // Consolidation: keeping only the newest, the full is kept just for the chain; it is
    // merged with the incremental into a synthetic full that takes the incremental's
    // place, and both go once the full is committed.
    let plan = env.json(&["plan", "--keep-last", "1", "--consolidate"]);
    let actions: Vec<(&str, &str)> = plan["backups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["backupId"].as_str().unwrap(),
                b["action"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        vec![
            (full.as_str(), "consolidate"),
            (incremental.as_str(), "consolidate")
        ],
        "{plan:#}"
    );
    // A consolidation that cannot run deletes nothing of its chain (exit 5).
    let failed = env.tidemark(&[
        "gc",
        "--keep-last",
        "1",
        "--consolidate",
        "--work-dir",
        "/nonexistent/tidemark",
    ]);
    assert_eq!(failed.status.code(), Some(5), "{failed:?}");
    let msg = String::from_utf8_lossy(&failed.stderr);
    assert!(
        msg.contains("consolidation failed, the chain stays"),
        "{msg}"
    );
    assert_eq!(
        backup_ids(&env.json(&["ls"])),
        vec![full.clone(), incremental.clone()]
    );

    let gc = env.json(&["gc", "--keep-last", "1", "--consolidate"]);
    let done = &gc["executed"]["consolidated"][0];
    assert_eq!(done["target"], incremental.as_str(), "{gc:#}");
    assert_eq!(
        done["consolidatedFrom"],
        serde_json::json!([full, incremental])
    );
    let synthetic = done["synthetic"].as_str().unwrap().to_owned();
    let mut deleted = gc["executed"]["backupsDeleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect::<Vec<_>>();
    deleted.sort();
    assert_eq!(deleted, vec![full.clone(), incremental.clone()], "{gc:#}");
    let ls = env.json(&["ls"]);
    assert_eq!(backup_ids(&ls), vec![synthetic.clone()], "{ls:#}");
    assert_eq!(ls["backups"][0]["type"], "full");

    // The synthetic full restores by itself, to the same instants.
    let plan = env.json(&["restore", "--to", &after.to_string(), "--dry-run"]);
    assert_eq!(backup_ids(&plan), vec![synthetic.clone()], "{plan:#}");
    assert_eq!(env.restored_rows(between, "synthetic-between"), "18");
    assert_eq!(env.restored_rows(after, "synthetic-after"), "20");
    // Before it: refused now that the full it came from is gone.
    let refused = env.tidemark(&[
        "restore",
        "--to",
        &before_incremental.to_string(),
        "--dry-run",
    ]);
    assert_eq!(refused.status.code(), Some(7), "{refused:?}");

    // An incremental on top of the synthetic full starts from its LSN and restores.
    env.insert(4); // 24
    let on_top = env.backup(Some(&synthetic));
    let latest = pause_and_mark();
    env.archive();
    let plan = env.json(&["restore", "--to", &latest.to_string(), "--dry-run"]);
    assert_eq!(backup_ids(&plan), vec![synthetic.clone(), on_top.clone()]);
    assert_eq!(env.restored_rows(latest, "on-top"), "24");

    // A chain longer than the increments a restore downloads ahead (issue 32 §3: they
    // download beside the base and wait for their turn): every one applied, in order.
    env.insert(3); // 27
    let second = env.backup(Some(&on_top));
    env.insert(2); // 29
    let third = env.backup(Some(&second));
    let latest = pause_and_mark();
    env.archive();
    let chain = vec![synthetic, on_top, second, third];
    let plan = env.json(&["restore", "--to", &latest.to_string(), "--dry-run"]);
    assert_eq!(backup_ids(&plan), chain);
    assert_eq!(env.restored_rows(latest, "long-chain"), "29");
    let summary: Value = serde_json::from_slice(
        &std::fs::read(env.db.scratch().join("long-chain-report.json")).unwrap(),
    )
    .unwrap();
    let steps: Vec<&str> = summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    let applied: Vec<&str> = steps
        .iter()
        .filter_map(|s| s.strip_prefix("applying increment "))
        .collect();
    assert_eq!(applied, chain[1..], "{summary}");
    // Two increments download ahead: the third starts only once the first is applied.
    let at = |prefix: &str| {
        steps
            .iter()
            .position(|s| s.starts_with(prefix))
            .unwrap_or_else(|| panic!("no step {prefix:?}: {summary}"))
    };
    assert!(
        at(&format!("downloading {}", chain[3])) > at(&format!("applying increment {}", chain[1])),
        "{summary}"
    );
}

/// Issue 42 §3: after a failover, the old primary lives on and lies — one transaction
/// written under the new primary's server id puts that GTID in its next file's
/// `Gtid_list`, which passes the "old primary still writing" check (its files claim to
/// hold the new primary's history). With the cluster's primary confirmed
/// (`--primary-server-id`, what the operator passes from its labelled pod), its files are
/// refused, nothing is recorded, and the real primary's archiving goes on; pointed at it
/// without confirmation, the archiver takes it as primary and says so.
#[test]
fn a_lying_old_primary_never_takes_the_main_line() {
    let env = Env::replicating(1);
    let replica = MariaDb::start_replicating(2);
    replica.replicate_from(&env.db);
    env.db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
    );
    env.insert(5);
    replica.wait_caught_up(&env.db);
    env.archive_from(&env.db);
    // The failover: the replica is promoted and writes.
    replica.promote();
    insert_into(&replica, 5);
    let archive_as = |db: &MariaDb, confirmed: Option<&str>| {
        db.sql("FLUSH BINARY LOGS");
        let index = db.binlog_index();
        let mut args = vec![
            "archive-binlogs",
            "--once",
            "--binlog-index",
            index.to_str().unwrap(),
        ];
        if let Some(id) = confirmed {
            args.extend(["--primary-server-id", id]);
        }
        env.tidemark(&args)
    };
    let out = archive_as(&replica, Some("2"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let timelines = |env: &Env| {
        env.json(&["ls"])["archive"]["timelines"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(timelines(&env), 2, "the new primary's timeline");
    // The old primary lies: a transaction under the new primary's id, then its own.
    env.db.sql(
        "SET SESSION server_id = 2; INSERT INTO shop.orders (v) VALUES (-1); \
         SET SESSION server_id = 1; INSERT INTO shop.orders (v) VALUES (-2)",
    );
    let out = archive_as(&env.db, Some("2"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("server 1 would start a new timeline, but 2 is the primary"),
        "{said}"
    );
    assert_eq!(timelines(&env), 2, "nothing recorded: {said}");
    // The real primary goes on, on its timeline.
    insert_into(&replica, 2);
    let out = archive_as(&replica, Some("2"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(timelines(&env), 2);
    // Pointed at the old primary with nothing to confirm which server is primary, its lie
    // passes the check on what its files hold: it is taken as primary, and said so.
    let out = archive_as(&env.db, None);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("taken as primary: the server this archiver reads"),
        "{said}"
    );
}

/// Issue 27: a primary (server 1) and its GTID replica (server 2), the primary's binlog
/// numbering a few files ahead. Backups are taken on the replica, binlogs archived from the
/// primary; then the primary dies with a transaction the replica never got, the replica is
/// promoted and takes writes, and the archive follows it onto a new timeline. Every restore
/// gives the exact row count, the lost transaction is in none after the switch and is shown
/// as a branch, a killed archiver converges, and retention keeps the window across the
/// switch.
#[test]
fn replica_backups_and_a_failover_restore_to_every_instant() {
    let mut env = Env::replicating(1);
    let replica = MariaDb::start_replicating(2);
    // A long-lived primary: its file numbers are ahead of the replica's.
    env.db
        .sql("FLUSH BINARY LOGS; FLUSH BINARY LOGS; FLUSH BINARY LOGS");
    replica.replicate_from(&env.db);
    env.db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT); \
         CREATE USER 'arch'@'%' IDENTIFIED BY 'arch-pw'; GRANT ALL ON *.* TO 'arch'@'%'; \
         CREATE USER 'arch'@'localhost' IDENTIFIED BY 'arch-pw'; GRANT ALL ON *.* TO 'arch'@'localhost'",
    );
    // A second cluster's archive, read over the network as a replica client would (the
    // operator's archiver): first from the primary, after the failover from the new one,
    // through one spool.
    let options = replica.scratch().join("arch.cnf");
    std::fs::write(&options, "[client]\nuser=arch\npassword=arch-pw\n").unwrap();
    let spool = replica.scratch().join("spool");
    let (s3_env, s3_url, endpoint) = (env.s3.env(), env.s3.url(), env.s3.endpoint.clone());
    let net_archive = |port: u16| -> Value {
        let out = common::bin()
            .envs(s3_env.clone())
            .args([
                "archive-binlogs",
                "--store",
                &s3_url,
                "--cluster",
                "e2e-net",
            ])
            .args(["--endpoint", &endpoint, "--from-server", "--once"])
            .args(["--output", "json", "--spool", spool.to_str().unwrap(), "--"])
            .arg(format!("--defaults-extra-file={}", options.display()))
            .args(["--host=127.0.0.1", &format!("--port={port}")])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let primary_port = env.db.port;
    env.insert(5); // 5
    replica.wait_caught_up(&env.db);
    let full = env.backup_on(&replica, None, &[]);
    env.insert(5); // 10
    let after_full = pause_and_mark();
    env.archive();
    net_archive(primary_port);
    replica.wait_caught_up(&env.db);
    let incremental = env.backup_on(&replica, Some(&full), &[]);
    env.insert(3); // 13
    replica.wait_caught_up(&env.db);
    let after_incremental = pause_and_mark();
    env.archive();

    // The backups record the replica's position in the primary's history, by GTID.
    let ls = env.json(&["ls"]);
    let recorded = &ls["backups"][0];
    assert_eq!(recorded["server"]["serverId"], 2, "{ls:#}");
    assert_eq!(recorded["server"]["role"], "replica", "{ls:#}");
    assert!(
        recorded["logPosition"]["gtid"]
            .as_str()
            .is_some_and(|g| g.starts_with("0-1-")),
        "{ls:#}"
    );
    // Restores from the replica's backups replay the primary's binlogs (mutation: replay
    // from the replica's file offset fails with "Error in log format", or starts at the
    // wrong transaction).
    assert_eq!(env.restored_rows(after_full, "replica-after-full"), "10");
    assert_eq!(
        env.restored_rows(after_incremental, "replica-after-incremental"),
        "13"
    );

    // One more row reaches the replica; then it stops receiving, and the primary commits
    // 7 rows only it will ever have, in the same binlog file, which is archived; then it
    // dies and the replica is promoted.
    env.insert(1); // 14
    replica.wait_caught_up(&env.db);
    replica.sql("STOP SLAVE IO_THREAD");
    env.insert(7); // 21 on the old primary only: a branch
    env.archive();
    net_archive(primary_port);
    let lost_gtid = env.db.sql("SELECT @@gtid_binlog_pos");
    sleep(Duration::from_millis(1100));
    env.db.kill();
    let last_replicated = replica.sql("SELECT @@gtid_slave_pos");
    replica.promote();
    let after_switch = pause_and_mark();
    insert_into(&replica, 4); // 18 on the new primary
    let after_failover_writes = pause_and_mark();

    // archive-binlogs on the new primary, killed somewhere in its first pass (whatever
    // it had done: recorded the timeline, shipped some files), converges on a rerun.
    replica.sql("FLUSH BINARY LOGS");
    let mut killed = common::bin();
    killed
        .envs(env.s3.env())
        .args([
            "archive-binlogs",
            "--store",
            &env.s3.url(),
            "--cluster",
            "e2e",
        ])
        .args(["--endpoint", &env.s3.endpoint, "--once", "--binlog-index"])
        .arg(replica.binlog_index())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = killed.spawn().unwrap();
    sleep(Duration::from_millis(150));
    let _ = child.kill();
    let _ = child.wait();
    let pass = env.archive_from(&replica);
    let pass_again = env.archive_from(&replica);
    assert_eq!(pass_again["timeline"], 1, "{pass_again:#}");
    assert_eq!(pass_again["serverId"], 2, "{pass_again:#}");
    assert!(pass_again["lagSeconds"].is_i64(), "{pass_again:#}");
    assert!(pass_again["newTimeline"].is_null(), "{pass_again:#}");
    assert_eq!(
        pass_again["uploaded"].as_array().unwrap().len(),
        1,
        "only the file the flush closed: {pass_again:#}"
    );
    // The new timeline is recorded once, whichever pass recorded it.
    let ls = env.json(&["ls"]);
    let timelines = ls["archive"]["timelines"].as_array().unwrap();
    assert_eq!(timelines.len(), 2, "{ls:#}");
    // The archiver's last pass, as a watch reads it.
    assert_eq!(ls["archive"]["archiver"]["serverId"], 2, "{ls:#}");
    assert_eq!(ls["archive"]["archiver"]["timeline"], 1, "{ls:#}");
    assert_eq!(ls["archive"]["archiver"]["silent"], false, "{ls:#}");
    let t1 = &timelines[1];
    assert_eq!(
        (t1["id"].as_u64(), t1["serverId"].as_u64()),
        (Some(1), Some(2)),
        "{ls:#}"
    );
    assert_eq!(t1["parent"], 0, "{ls:#}");
    // The switch is the last transaction the replica had received.
    let switch = t1["switch"]["gtid"].as_str().unwrap().to_owned();
    assert_eq!(switch, last_replicated, "{ls:#}");
    // The transaction only the old primary had is shown as the branch it is.
    assert_eq!(t1["branch"], serde_json::json!([lost_gtid]), "{ls:#}");
    assert!(
        pass["timeline"] == 1 || pass["newTimeline"]["id"] == 1,
        "{pass:#}"
    );
    // Over the network: the spool, holding the old primary's files, becomes the new
    // primary's, which starts timeline 1 at the same switch (mutation: fetching after the
    // highest sequence archived skips what the new primary wrote).
    let net = net_archive(replica.port);
    assert_eq!(net["newTimeline"]["id"], 1, "{net:#}");
    assert_eq!(
        net["newTimeline"]["switch"]["gtid"],
        switch.as_str(),
        "{net:#}"
    );
    let net_ls: Value = serde_json::from_slice(
        &common::on_store(&env.s3, "e2e-net", &["ls", "--output", "json"]).stdout,
    )
    .unwrap();
    let net_timelines = net_ls["archive"]["timelines"].as_array().unwrap();
    assert_eq!(net_timelines.len(), 2, "{net_ls:#}");
    assert_eq!(net_timelines[1]["serverId"], 2, "{net_ls:#}");
    assert!(
        net_timelines[1]["segments"].as_u64().unwrap() >= 1,
        "{net_ls:#}"
    );
    let text = String::from_utf8_lossy(&env.ok(&["ls"]).stdout).into_owned();
    assert!(text.contains("timeline 1 (server 2)"), "{text}");
    assert!(text.contains("branch"), "{text}");
    assert!(
        ls["recoveryWindow"]["gaps"].as_array().unwrap().is_empty(),
        "{ls:#}"
    );

    // Before the failover, just after it (the state at the switch: the lost rows absent),
    // and after the new primary's writes.
    assert_eq!(
        env.restored_rows(after_incremental, "failover-before"),
        "13"
    );
    // (Mutation: without the stop at the switch, the lost rows are replayed: 21, 25.)
    assert_eq!(env.restored_rows(after_switch, "failover-just-after"), "14");
    assert_eq!(
        env.restored_rows(after_failover_writes, "failover-after-writes"),
        "18"
    );
    let plan = env.json(&[
        "restore",
        "--to",
        &after_failover_writes.to_string(),
        "--dry-run",
    ]);
    let runs = plan["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{plan:#}");
    assert_eq!(runs[0]["stopAt"], switch.as_str(), "{plan:#}");
    assert_eq!(runs[1]["timeline"], 1, "{plan:#}");
    assert_eq!(runs[1]["serverId"], 2, "{plan:#}");

    // A new full on the new primary, and writes after it.
    let new_full = env.backup_on(&replica, None, &[]);
    insert_into(&replica, 2); // 20
    let after_new_full = pause_and_mark();
    env.archive_from(&replica);
    assert_eq!(env.restored_rows(after_new_full, "new-primary-full"), "20");

    // Copies (issue 44): the policy's store copied to a local directory, the GCS
    // emulator and Azurite, as stored; then the source loses everything, by retention and
    // behind Tidemark's back, and each copy still restores every instant, across the
    // failover's timelines.
    let copies = Copies::start(&env);
    for name in ["local", "gcs", "azure"] {
        let sent = copies.copy(&env, name);
        assert_eq!(
            sent["backupsSent"].as_array().unwrap().len(),
            3,
            "{name}: {sent:#}"
        );
        assert!(
            sent["segmentsSent"].as_u64().unwrap() >= 3,
            "{name}: {sent:#}"
        );
        assert!(sent["failures"].as_array().unwrap().is_empty(), "{sent:#}");
        // Idempotent: a second pass sends nothing.
        let again = copies.copy(&env, name);
        assert_eq!(again["bytes"], 0, "{name}: {again:#}");
    }

    // Retention with a one-day window that begins at the switch (evaluated a day after
    // it): with coverWindow the newest backup before the window (the incremental, with its
    // chain) stays, so every instant of the window restores, across the switch; the
    // segments of both timelines it needs stay.
    let now = after_switch
        .checked_add(jiff::SignedDuration::from_hours(24))
        .unwrap()
        .to_string();
    let gc = env.json(&[
        "gc",
        "--window",
        "1d",
        "--cover-window",
        "--now",
        &now,
        "--allow-future-now",
    ]);
    let window = &gc["recoveryWindow"];
    assert!(window["gaps"].as_array().unwrap().is_empty(), "{gc:#}");
    assert!(
        window["from"]
            .as_str()
            .unwrap()
            .parse::<Timestamp>()
            .unwrap()
            <= after_switch,
        "{gc:#}"
    );
    assert_eq!(
        backup_ids(&env.json(&["ls"])),
        vec![full.clone(), incremental.clone(), new_full.clone()]
    );
    assert_eq!(
        env.restored_rows(after_failover_writes, "after-gc-failover"),
        "18"
    );
    // Keeping only the newest: the chain before the switch goes, and what the kept full
    // needs of the archive stays.
    let gc = env.json(&["gc", "--keep-last", "1"]);
    assert_eq!(backup_ids(&env.json(&["ls"])), vec![new_full], "{gc:#}");
    assert_eq!(env.restored_rows(after_new_full, "after-gc-newest"), "20");

    // The source bucket emptied behind Tidemark's back: a copy pass deletes nothing from
    // the copies, and each restores the chain the source's retention deleted, before, at
    // and after the switch.
    let raw = env.s3.cluster_store("e2e");
    let keys: Vec<String> = block_on(async {
        use futures::TryStreamExt;
        raw.object_store()
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap()
    });
    for k in &keys {
        block_on(object_store::ObjectStoreExt::delete(
            raw.object_store().as_ref(),
            &k.as_str().into(),
        ))
        .unwrap();
    }
    for name in ["local", "gcs", "azure"] {
        let pass = copies.copy(&env, name);
        assert_eq!(pass["bytes"], 0, "{name}: {pass:#}");
        for (to, rows) in [
            (after_incremental, "13"),
            (after_switch, "14"),
            (after_failover_writes, "18"),
        ] {
            assert_eq!(copies.restored_rows(&env, name, to), rows, "{name} at {to}");
        }
    }
}

/// Three copies of the `e2e` cluster's store — a local directory, the GCS emulator,
/// Azurite — named in one policy file.
struct Copies {
    policy: std::path::PathBuf,
    _local: tempfile::TempDir,
    gcs: tidemark_store::testkit::GcsEmulator,
    azure: tidemark_store::testkit::Azurite,
}

impl Copies {
    fn start(env: &Env) -> Self {
        let local = tempfile::tempdir().unwrap();
        let gcs = tidemark_store::testkit::GcsEmulator::start();
        let azure = tidemark_store::testkit::Azurite::start();
        let policy = env.db.scratch().join("copies.yaml");
        std::fs::write(
            &policy,
            format!(
                "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {{name: e2e}}\n\
                 spec:\n  objectStore: {{url: \"{}\", endpoint: \"{}\"}}\n  copies:\n\
                 \x20   - name: local\n      objectStore: {{url: \"file://{}\"}}\n\
                 \x20   - name: gcs\n      objectStore: {{url: \"{}\"}}\n\
                 \x20   - name: azure\n      objectStore: {{url: \"{}\", endpoint: \"{}\"}}\n",
                env.s3.url(),
                env.s3.endpoint,
                local.path().display(),
                gcs.url(),
                azure.url(),
                azure.endpoint
            ),
        )
        .unwrap();
        Copies {
            policy,
            _local: local,
            gcs,
            azure,
        }
    }

    /// `tidemark` with the source's and the copies' credentials (the GCS copy's key under
    /// its own name, as a second account's would be).
    fn bin(&self, env: &Env) -> std::process::Command {
        let mut c = bin();
        c.envs(env.s3.env()).envs(self.azure.env()).env(
            "TIDEMARK_COPY_GCS_GOOGLE_SERVICE_ACCOUNT_KEY",
            self.gcs.key(),
        );
        c
    }

    /// One copy pass to `name`; its JSON report.
    fn copy(&self, env: &Env, name: &str) -> Value {
        let out = self
            .bin(env)
            .args(["copy", "--policy", self.policy.to_str().unwrap()])
            .args(["--copy", name, "--output", "json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "copy {name}: {}",
            common::stderr(&out)
        );
        common::json(&out)
    }

    /// Restores from the copy `name` to `to` and counts the rows.
    fn restored_rows(&self, env: &Env, name: &str, to: Timestamp) -> String {
        let dir = env
            .db
            .scratch()
            .join(format!("from-{name}-{}", to.as_second()));
        let out = self
            .bin(env)
            .args(["restore", "--policy", self.policy.to_str().unwrap()])
            .args(["--from-copy", name, "--to", &to.to_string()])
            .args(["--datadir", dir.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "restore --from-copy {name}: {}",
            common::stderr(&out)
        );
        query_restored(&dir, "SELECT COUNT(*) FROM shop.orders")
    }
}

/// `tidemark run` against a real server: a mariabackup schedule every 10 seconds, binlog
/// archiving and retention for most of a minute, then a point-in-time restore.
#[test]
fn standalone_run_with_mariadb_then_point_in_time_restore() {
    let db = MariaDb::start();
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config");
    std::fs::create_dir_all(&cfg).unwrap();
    let client: Vec<String> = db.client_args();
    // Encrypted at rest (issue 19 §2): the identity file sits beside the config.
    let keygen = bin()
        .args(["keygen", "--output", cfg.join("key.txt").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(keygen.status.success(), "{keygen:?}");
    let recipient = String::from_utf8(keygen.stdout).unwrap().trim().to_owned();
    std::fs::write(
        cfg.join("tidemark.yaml"),
        format!(
            r#"apiVersion: tidemark.io/v1alpha1
kind: BackupPolicy
metadata: {{name: shop}}
spec:
  objectStore:
    url: "file://{store}"
    encryption: {{recipients: ["{recipient}"], identityFile: key.txt}}
  retention: {{keepLast: 3}}
  retentionInterval: 5s
  binlogArchive:
    binlogIndex: "{index}"
    interval: 2s
    checksums: {{every: 3s, pauseMilliseconds: 0, client: ["{c0}", "{c1}"]}}
  restoreTest:
    schedule: "*/20 * * * * *"
    query: "SELECT COUNT(*) > 0 FROM shop.orders"
    expect: "1"
  verify: {{schedule: "*/15 * * * * *"}}
---
apiVersion: tidemark.io/v1alpha1
kind: ScheduledBackup
metadata: {{name: shop-10s}}
spec:
  schedule: "*/10 * * * * *"
  immediate: true
  policy: {{name: shop}}
  method: mariabackup
  incremental: {{maxIncrementsPerFull: 2}}
  compression: "zstd:1"
  command: [mariabackup, "{c0}", "{c1}"]
"#,
            store = dir.path().join("store").display(),
            index = db.binlog_index().display(),
            recipient = recipient,
            c0 = client[0],
            c1 = client[1],
        ),
    )
    .unwrap();
    let log = dir.path().join("run.log");
    let mut run = bin()
        .args(["run", "--config", cfg.to_str().unwrap(), "--grace", "60s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();

    // A row every ~2.4 s; marks sit 1.2 s away from any write (binlog times are seconds).
    let mut marks: Vec<(Timestamp, usize)> = Vec::new();
    let started = std::time::Instant::now();
    let mut rows = 0;
    while started.elapsed() < Duration::from_secs(50) {
        db.sql("INSERT INTO shop.orders (v) VALUES (1)");
        rows += 1;
        if rows % 3 == 0 {
            db.sql("FLUSH BINARY LOGS");
        }
        sleep(Duration::from_millis(1200));
        marks.push((Timestamp::now(), rows));
        sleep(Duration::from_millis(1200));
    }
    db.sql("FLUSH BINARY LOGS");
    // Let the archiver and the last retention pass see everything, then stop.
    sleep(Duration::from_secs(6));
    let text = stop_run(&mut run, &log);
    assert!(text.contains("retention: deleted"), "{text}");
    assert!(text.contains("binlogs: archived"), "{text}");
    // Restore tests on the policy's schedule (issue 19 §4): the newest point, encrypted
    // chain and binlogs included, restored, checked and recorded — with the restore
    // oracle's checksums, written every 3 s (issue 48), compared.
    assert!(
        text.lines()
            .any(|l| l.contains("restore test of") && l.contains("): passed")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("checksums (shop): run ") && l.contains("1 table(s), 1 chunk(s)")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("): passed")
                && l.contains("chunk(s) of the restore oracle compared")),
        "{text}"
    );
    assert!(!text.contains("FAILED"), "{text}");
    // Verification on the policy's schedule: the newest chain read back whole.
    assert!(
        text.lines()
            .any(|l| l.contains("verification: ") && l.contains("read back whole (the newest")),
        "{text}"
    );

    let store = format!("file://{}", dir.path().join("store").display());
    let identity = cfg.join("key.txt");
    let try_tidemark = |args: &[&str]| {
        bin()
            .args(args)
            .args(["--store", &store, "--cluster", "shop"])
            .output()
            .unwrap()
    };
    let tidemark = |args: &[&str]| {
        let out = try_tidemark(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let ls: Value = serde_json::from_slice(&tidemark(&["ls", "--output", "json"]).stdout).unwrap();
    let completed: Vec<&Value> = ls["backups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["phase"] == "completed")
        .collect();
    // keepLast 3 with the chains they need (at most two more), plus one since the pass.
    assert!(
        (3..=6).contains(&completed.len()),
        "keepLast 3 and their chains: {ls:#}"
    );
    // Scheduled incrementals (seed 002): F ← I ← I, F ← I ← I, … — every incremental builds
    // on the backup before it, at most two increments per full, and both kinds were taken.
    let by_id = |id: &str| completed.iter().find(|b| b["backupId"] == id).copied();
    let mut kinds = String::new();
    for (i, b) in completed.iter().enumerate() {
        if b["type"] == "incremental" {
            kinds.push('I');
            let parent = b["parentId"].as_str().unwrap();
            assert!(
                i > 0 && completed[i - 1]["backupId"] == parent,
                "an incremental on the one before it: {ls:#}"
            );
            let p = by_id(parent).unwrap();
            let grandparent_full = p["type"] == "full"
                || by_id(p["parentId"].as_str().unwrap()).unwrap()["type"] == "full";
            assert!(grandparent_full, "at most two increments per full: {ls:#}");
        } else {
            kinds.push('F');
        }
    }
    assert!(kinds.contains("FI"), "{kinds}: {ls:#}");
    // The schedule's `compression` (issue 19 §1): every payload it wrote is zstd, and the
    // restores below read them.
    let payloads: Vec<String> = walk(&dir.path().join("store"))
        .into_iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .filter(|n| n.starts_with("backup."))
        .collect();
    assert!(
        !payloads.is_empty() && payloads.iter().all(|n| n == "backup.xbstream.zst"),
        "{payloads:?}"
    );
    // The policy's encryption: every payload and archived segment in the store is an age
    // file, and the records name the recipient by fingerprint.
    let stored: Vec<std::path::PathBuf> = walk(&dir.path().join("store"))
        .into_iter()
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n == "backup.xbstream.zst" || (n.contains("-bin.") && !n.ends_with(".json"))
            })
        })
        .collect();
    assert!(
        stored
            .iter()
            .any(|p| p.to_string_lossy().contains("/binlogs/")),
        "{stored:?}"
    );
    for p in &stored {
        let head = std::fs::read(p).unwrap();
        assert!(
            head.starts_with(b"age-encryption.org/v1\n"),
            "{} is not an age file",
            p.display()
        );
    }
    let fingerprints = tidemark_store::crypt::Recipients::parse(&[&recipient])
        .unwrap()
        .unwrap()
        .record()
        .recipients;
    for p in walk(&dir.path().join("store")) {
        if p.file_name().is_some_and(|n| n == "metadata.json") {
            let m: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            if m["phase"] == "completed" {
                assert_eq!(m["formatVersion"], 2, "{m}");
                assert_eq!(
                    m["payload"][0]["encryption"]["recipients"],
                    serde_json::json!(fingerprints),
                    "{m}"
                );
            }
        }
    }
    assert!(text.contains("(incremental on "), "{text}");
    assert!(
        text.contains("the maximum per full"),
        "a full because the chain was full: {text}"
    );

    // Consolidating an encrypted chain with its identity but no recipient would write the
    // synthetic full in clear: refused before any tool runs (exit 2), the chain kept.
    let incremental = completed
        .iter()
        .find(|b| b["type"] == "incremental")
        .unwrap()["backupId"]
        .as_str()
        .unwrap()
        .to_owned();
    let refused = try_tidemark(&[
        "consolidate",
        "--backup-id",
        &incremental,
        "--identity",
        identity.to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let msg = String::from_utf8_lossy(&refused.stderr);
    assert!(msg.contains("in clear"), "{msg}");
    // With a recipient too, the synthetic full is written encrypted: the store never sees
    // the merged chain in clear. (The restore below may start from it.)
    let merged: Value = serde_json::from_slice(
        &tidemark(&[
            "consolidate",
            "--backup-id",
            &incremental,
            "--identity",
            identity.to_str().unwrap(),
            "--recipient",
            &recipient,
            "--output",
            "json",
        ])
        .stdout,
    )
    .unwrap();
    let synthetic = merged["synthetic"].as_str().unwrap();
    let synthetic_files: Vec<std::path::PathBuf> = walk(&dir.path().join("store"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(synthetic))
        .collect();
    let payload = synthetic_files
        .iter()
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("backup.")
        })
        .unwrap_or_else(|| panic!("no payload of {synthetic}: {synthetic_files:?}"));
    assert!(
        std::fs::read(payload)
            .unwrap()
            .starts_with(b"age-encryption.org/v1\n"),
        "{} is not an age file",
        payload.display()
    );
    let m: Value =
        serde_json::from_slice(&std::fs::read(payload.with_file_name("metadata.json")).unwrap())
            .unwrap();
    assert_eq!(m["consolidatedFrom"], merged["consolidatedFrom"], "{m}");
    assert_eq!(
        m["payload"][0]["encryption"]["recipients"],
        serde_json::json!(fingerprints),
        "{m}"
    );

    // A mark inside the window: the newest whose instant the archive reaches.
    let window = &ls["recoveryWindow"];
    let window_from: Timestamp = window["from"].as_str().unwrap().parse().unwrap();
    let window_to: Timestamp = window["to"].as_str().unwrap().parse().unwrap();
    let (target, expected) = *marks
        .iter()
        .rev()
        .find(|(t, _)| window_from < *t && *t <= window_to)
        .unwrap_or_else(|| panic!("no mark after {window_from}: {ls:#}"));
    let datadir = dir.path().join("restored");
    // Without the identity: exit 10 naming the recipients, and no data directory.
    let refused = try_tidemark(&[
        "restore",
        "--to",
        &target.to_string(),
        "--datadir",
        datadir.to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(10), "{refused:?}");
    assert!(
        !datadir.exists(),
        "a refused restore wrote {}",
        datadir.display()
    );
    tidemark(&[
        "restore",
        "--to",
        &target.to_string(),
        "--datadir",
        datadir.to_str().unwrap(),
        "--identity",
        identity.to_str().unwrap(),
    ]);
    assert_eq!(
        query_restored(&datadir, "SELECT COUNT(*) FROM shop.orders"),
        expected.to_string()
    );
}

/// `archive-binlogs --from-server`: binlogs read over the network as a replica client
/// (`mariadb-binlog --read-from-remote-server --raw`), with the password in an option file;
/// a point-in-time restore from them gives the exact row count; a password on the command
/// line is refused.
#[test]
fn binlogs_read_from_the_server_over_the_network() {
    const PASSWORD: &str = "repl-pw-9c1f-never-printed";
    let env = orders_env();
    let db = &env.db;
    let connection = network_login(db, "repl", PASSWORD);
    let spool = db.scratch().join("spool");
    let from_server = |extra: &[&str]| env.archive_over_network(&spool, &connection, extra);

    env.insert(5);
    let full = env.backup(None);
    env.insert(10); // 15
    let target = pause_and_mark();
    env.insert(4); // 19
    db.sql("FLUSH BINARY LOGS");
    let out = from_server(&[]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("archived"), "{said}");
    assert!(!said.contains(PASSWORD), "{said}");
    // Shipped files leave the spool; the newest (still being written) stays.
    let spooled: Vec<String> = std::fs::read_dir(&spool)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("mysql-bin."))
        .collect();
    assert_eq!(spooled.len(), 1, "{spooled:?}");
    // A second pass ships nothing twice.
    let again = from_server(&["--output", "json"]);
    let v: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(v["uploaded"], serde_json::json!([]), "{v}");

    assert_eq!(env.restored_rows(target, "from-server"), "15");
    let ls = env.json(&["ls"]);
    assert_eq!(backup_ids(&ls), vec![full]);

    // A password on the command line is refused before anything runs.
    let refused = env.tidemark(&[
        "archive-binlogs",
        "--from-server",
        "--spool",
        spool.to_str().unwrap(),
        "--once",
        "--",
        "--user=repl",
        "--password=hunter2",
    ]);
    assert_eq!(refused.status.code(), Some(2));
    let e = String::from_utf8_lossy(&refused.stderr);
    assert!(
        e.contains("--defaults-extra-file") && !e.contains("hunter2"),
        "{e}"
    );
}

/// One store archived by both archivers of one server — from the server first (its spool
/// keeps the file the server was writing, cut short), then from the index file, then from
/// the server again — keeps one history: the cut copy is dropped, not shipped as a binlog
/// that started over on a timeline of its own, and every instant restores exactly.
#[test]
fn a_spools_cut_copy_never_becomes_a_timeline() {
    let env = orders_env();
    let db = &env.db;
    let connection = network_login(db, "repl", "spool-pw-7a2b");
    let spool = db.scratch().join("spool");
    let from_server = || env.archive_over_network(&spool, &connection, &[]);
    env.insert(3);
    env.backup(None);
    env.insert(2); // 5, in the file being written
    from_server();
    env.insert(4); // 9
    let target = pause_and_mark();
    env.archive();
    env.insert(1); // 10
    env.archive();
    from_server();
    let ls = env.json(&["ls"]);
    assert_eq!(
        ls["archive"]["timelines"].as_array().map(Vec::len),
        Some(1),
        "one server, one history: {ls:#}"
    );
    assert_eq!(env.restored_rows(target, "after-both-archivers"), "9");
}

/// Found by the chaos soak (issue 48 §2): `mariadb-binlog --stop-never` reads as replica
/// server id 1 unless told otherwise, and a replica whose id is 1 (a StatefulSet's first pod,
/// as every example numbers them) connected to the same primary made the primary drop one
/// connection each time the other connected — the archive stood still for minutes after a
/// failover. The archiver now reads with an id of its own: it and such a replica both follow
/// the primary, and the archive reaches every instant.
#[test]
fn the_archiver_and_a_replica_with_server_id_1_both_follow_the_primary() {
    let env = Env::replicating(2);
    let db = &env.db;
    let replica = MariaDb::start_replicating(1);
    replica.replicate_from(db);
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT);",
    );
    // The login before the backup: a restore replays no GRANT (docs/database.md).
    let connection = network_login(db, "follower", "follow-pw-3c9e");
    env.insert(3);
    env.backup(None);
    let (mut archiver, log, _) = watch_over_network(&env, &connection);
    let dumps = || {
        db.sql(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE command LIKE 'Binlog Dump%'",
        )
    };
    let mut rows = 3;
    for round in 0..3 {
        env.insert(2);
        rows += 2;
        let target = pause_and_mark();
        env.insert(1);
        db.sql("FLUSH BINARY LOGS");
        // The replica keeps up: its connection is never dropped for the archiver's.
        replica.wait_caught_up(db);
        // And the archive reaches the instant.
        window_reaches(&env, target, Duration::from_secs(60));
        assert_eq!(
            env.restored_rows(target, &format!("round-{round}")),
            rows.to_string()
        );
        rows += 1;
        // Both read the binlog at once, under ids of their own.
        assert_eq!(
            dumps(),
            "2",
            "the replica's and the archiver's dump threads"
        );
    }
    let err = std::fs::read_to_string(db.scratch().join("archiver.err")).unwrap_or_default();
    assert!(
        !err.contains("same server_uuid/server_id"),
        "the archiver's connection was dropped for another's: {err}"
    );
    stop_run(&mut archiver, &log);
    // The id it reads as: derived from the store and the cluster, far from servers' ids.
    let id = tidemark_mariadb::remote::connection_server_id(&env.s3.url(), "e2e");
    assert!((0x7000_0000..=0x7FFF_FFFF).contains(&id), "{id}");
    assert_ne!(
        id,
        tidemark_mariadb::remote::connection_server_id(&env.s3.url(), "other"),
        "another cluster's archiver reads under another id"
    );
}

/// A follower whose connection stops carrying anything without closing — a network path
/// that died with no FIN or RST reaching it; the node's MySQL scenario once waited 180 s in
/// CI for an archive that never moved, cause not seen — is started again once it stands
/// still behind the server (`FOLLOWER_STALL`), and the archive reaches past the instant.
#[test]
fn a_follower_on_a_connection_that_died_silently_is_started_again() {
    let env = orders_env();
    let db = &env.db;
    let proxy = SilencingProxy::start(db.port);
    let connection = network_login_through(db, "stall", "stall-pw-51d0", proxy.port);
    env.insert(3);
    env.backup(None);
    let (mut archiver, log, err) = watch_over_network(&env, &connection);
    let reached = |target: Timestamp, within: Duration| window_reaches(&env, target, within);
    // Following, through the proxy.
    env.insert(2); // 5
    let first = pause_and_mark();
    env.insert(1); // 6
    db.sql("FLUSH BINARY LOGS");
    reached(first, Duration::from_secs(60));
    // Every connection open now carries nothing more; new ones do.
    proxy.silence();
    env.insert(2); // 8
    let target = pause_and_mark();
    env.insert(1); // 9
    db.sql("FLUSH BINARY LOGS");
    // A question to the server in flight when the proxy fell silent waits out its 60 s
    // first; then the stall, the restart, a pass.
    reached(
        target,
        tidemark_mariadb::remote::FOLLOWER_STALL + Duration::from_secs(120),
    );
    let said = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(
        said.contains("mariadb-binlog stands still behind the server"),
        "{said}"
    );
    stop_run(&mut archiver, &log);
    assert_eq!(env.restored_rows(target, "after-the-silence"), "8");
}

/// `archive-binlogs --from-server` watching (a pass every second) with `connection`, its
/// spool, stdout and stderr in the server's scratch directory; the process, and the paths
/// of its stdout and stderr.
fn watch_over_network(
    env: &Env,
    connection: &[String],
) -> (std::process::Child, std::path::PathBuf, std::path::PathBuf) {
    let db = &env.db;
    let spool = db.scratch().join("spool");
    let log = db.scratch().join("archiver.log");
    let err = db.scratch().join("archiver.err");
    let mut args = vec![
        "archive-binlogs",
        "--from-server",
        "--spool",
        spool.to_str().unwrap(),
        "--interval",
        "1s",
        "--",
    ];
    args.extend(connection.iter().map(String::as_str));
    let archiver = env
        .command(&args, db.scratch())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    (archiver, log, err)
}

/// Waits until the recovery window reaches past `target`, `within` at most; else fails
/// with the archive `ls` shows and what the archiver of [`watch_over_network`] said.
fn window_reaches(env: &Env, target: Timestamp, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let ls = env.json(&["ls"]);
        let to = ls["recoveryWindow"]["to"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok());
        if to.is_some_and(|to| to > target) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the archive did not reach {target} within {within:?}: {:#}\n{}",
            ls["archive"],
            std::fs::read_to_string(env.db.scratch().join("archiver.err")).unwrap_or_default()
        );
        sleep(Duration::from_millis(500));
    }
}

/// A TCP proxy to a port of 127.0.0.1 whose connections open so far can be made to carry
/// nothing more, without closing either side (a network path that died silently).
struct SilencingProxy {
    port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    silenced_below: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl SilencingProxy {
    fn start(to: u16) -> Self {
        use std::io::{Read as _, Write as _};
        use std::sync::atomic::Ordering::SeqCst;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let silenced_below = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (count, silenced) = (accepted.clone(), silenced_below.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let n = count.fetch_add(1, SeqCst);
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let ways = [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ];
                for (mut from, mut into) in ways {
                    let silenced = silenced.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(k) = from.read(&mut buf) {
                            // Silenced: what comes is never passed on, and nothing closes.
                            while n < silenced.load(SeqCst) {
                                sleep(Duration::from_secs(1));
                            }
                            if k == 0 {
                                let _ = into.shutdown(std::net::Shutdown::Write);
                                break;
                            }
                            if into.write_all(&buf[..k]).is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        SilencingProxy {
            port,
            accepted,
            silenced_below,
        }
    }

    /// Every connection open now carries nothing from here on.
    fn silence(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.silenced_below
            .store(self.accepted.load(SeqCst), SeqCst);
    }
}

/// An account `user` on `db` with every privilege, and the connection options that log
/// in as it over the network: its password in an option file, never on a command line.
fn network_login(db: &MariaDb, user: &str, password: &str) -> Vec<String> {
    network_login_through(db, user, password, db.port)
}

/// As [`network_login`], reaching the server at `port` of 127.0.0.1 (a proxy's).
fn network_login_through(db: &MariaDb, user: &str, password: &str, port: u16) -> Vec<String> {
    db.sql(&format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'; GRANT ALL ON *.* TO '{user}'@'%'; \
         CREATE USER '{user}'@'localhost' IDENTIFIED BY '{password}'; GRANT ALL ON *.* TO '{user}'@'localhost';"
    ));
    login_file(
        db,
        user,
        password,
        &["--host=127.0.0.1".to_owned(), format!("--port={port}")],
    )
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A MariaDB server with an empty `shop.orders`, and a store.
fn orders_env() -> Env {
    let env = Env {
        s3: SeaweedFs::start(),
        db: MariaDb::start(),
        compression: "none",
        bucket: None,
    };
    env.db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
    );
    env
}

impl Env {
    /// One `archive-binlogs --from-server --once` pass through `spool`, logging in with
    /// `connection`, with `extra` flags; must succeed.
    fn archive_over_network(&self, spool: &Path, connection: &[String], extra: &[&str]) -> Output {
        let mut args = vec![
            "archive-binlogs",
            "--from-server",
            "--spool",
            spool.to_str().unwrap(),
            "--once",
        ];
        args.extend(extra);
        args.push("--");
        args.extend(connection.iter().map(String::as_str));
        self.ok(&args)
    }
}

/// A MariaDB server and store for restore tests: `shop.orders` with 5 rows in a full
/// backup (returned) and 3 more in the binlogs only, after `first_after` (SQL run right
/// after the backup).
fn five_in_a_full_and_three_after(first_after: Option<&str>) -> (Env, String) {
    let env = orders_env();
    env.insert(5);
    env.db.sql("FLUSH BINARY LOGS");
    let full = env.backup(None);
    if let Some(sql) = first_after {
        env.db.sql(sql);
    }
    env.insert(3);
    (env, full)
}

/// Issue 48 §1, the restore oracle through a restore test: `archive-binlogs
/// --checksums-every`, logged in with the account docs/database.md gives, writes checksums
/// on the primary (the statement that computes them, and the primary's values); a
/// restore's replay computes them again on the restored data, and the test compares every
/// chunk. A write the binlog never got (made with `sql_log_bin` off: the replay misses it,
/// as it would a lost event) is named by table and chunk — while `CHECK TABLE` and a row
/// count pass. Without the grant, the run fails naming the rights it needs, and archiving
/// goes on.
#[test]
fn the_restore_oracle_names_a_chunk_the_replay_got_wrong() {
    // The first transaction after the full changes a row and no count: a replay that
    // skips it (mutation: start the replay one GTID later) leaves 8 rows and sound tables,
    // and only the oracle sees it.
    let (env, _full) =
        five_in_a_full_and_three_after(Some("UPDATE shop.orders SET v = v + 10 WHERE id = 3"));
    let db = &env.db;
    // A restore's replay cannot apply a GRANT (docs/cli.md): the accounts are made outside
    // the binlog here, as the docs say to do after the last backup.
    let unlogged = |sql: &str| db.sql(&format!("SET SESSION sql_log_bin = 0; {sql}"));
    unlogged("DROP USER ''@'localhost'");
    unlogged(&documented_sql("command-line accounts"));
    let network = vec!["--host=127.0.0.1".to_owned(), format!("--port={}", db.port)];
    let login = login_file(db, "tidemark_archive", "change-me-archive", &network);
    let index = db.binlog_index();
    let checksums = || {
        let mut args = vec![
            "archive-binlogs",
            "--binlog-index",
            index.to_str().unwrap(),
            "--once",
            "--checksums-every",
            "1h",
            "--checksum-pause",
            "0s",
            "--checksum-skip",
            "*.notes",
            "--output",
            "json",
            "--",
        ];
        args.extend(login.iter().map(String::as_str));
        let out = env.ok(&args);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["checksums"].clone()
    };
    let refused = checksums();
    assert!(refused["run"].is_null(), "{refused:#}");
    let said = refused["error"].as_str().unwrap_or_default();
    assert!(
        said.contains("needs BINLOG ADMIN, SELECT on the tables checked"),
        "{refused:#}"
    );
    unlogged(&documented_sql("restore oracle"));
    db.sql(
        "CREATE TABLE shop.notes (note TEXT); INSERT INTO shop.notes VALUES ('skipped'); \
         ALTER TABLE shop.orders ADD COLUMN at TIMESTAMP(3) NULL; \
         UPDATE shop.orders SET at = FROM_UNIXTIME(1700000000.125 + id * 86400)",
    );
    let first = checksums();
    assert_eq!(
        (&first["tables"], &first["chunks"]),
        (&1.into(), &1.into()),
        "{first:#}"
    );
    pause_and_mark();
    env.archive();
    let scratch = db.scratch().join("oracle");
    std::fs::create_dir(&scratch).unwrap();
    let scratch = scratch.to_str().unwrap();
    // The restore's server runs in another time zone than the primary (UTC): the digest
    // of a TIMESTAMP (shop.orders' `at`) does not change with it.
    let test = |expect_passed: bool| {
        let out = env
            .command(
                &[
                    "restore-test",
                    "--scratch",
                    scratch,
                    "--query",
                    "SELECT COUNT(*) FROM shop.orders",
                    "--expect",
                    "8",
                    "--output",
                    "json",
                ],
                &std::env::temp_dir(),
            )
            .env("TZ", "Asia/Kolkata")
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        assert_eq!(
            out.status.success(),
            expect_passed,
            "{v:#} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        v
    };
    let passed = test(true);
    assert_eq!(passed["outcome"]["oracleChunks"], 1, "{passed:#}");
    // A restore that asks for the oracle's proof (the Restore kind's requireOracle).
    let restore = |to: Timestamp, require: bool| {
        let datadir = db
            .scratch()
            .join(format!("restored-{require}-{}", to.as_second()));
        let mut args = vec![
            "restore".to_owned(),
            "--to".to_owned(),
            to.to_string(),
            "--datadir".to_owned(),
            datadir.to_str().unwrap().to_owned(),
            "--output".to_owned(),
            "json".to_owned(),
        ];
        if require {
            args.push("--require-oracle".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        (env.tidemark(&args), datadir)
    };
    // An instant is restorable once a later event is archived: a row of the table the
    // checksums skip.
    let mark = || {
        let at = pause_and_mark();
        db.sql("INSERT INTO shop.notes VALUES ('after the mark')");
        env.archive();
        at
    };
    // A restore that kept its data: its JSON, and what it said on stderr.
    let kept = |(out, datadir): (Output, std::path::PathBuf)| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(datadir.join("ibdata1").exists());
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (v, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let proven = mark();
    let (v, _) = kept(restore(proven, true));
    assert_eq!(
        v["oracle"],
        serde_json::json!({"chunks": 1, "differences": []}),
        "{v:#}"
    );

    db.sql("SET SESSION sql_log_bin = 0; UPDATE shop.orders SET v = v + 1 WHERE id = 2");
    assert_eq!(checksums()["chunks"], 1);
    let wrong = mark();
    // Without --require-oracle the data is kept and the difference said; with it, the
    // data directory goes (exit 8), naming the chunk.
    let (v, said) = kept(restore(wrong, false));
    assert_eq!(v["oracle"]["chunks"], 2, "{v:#}");
    assert_eq!(
        v["oracle"]["differences"],
        serde_json::json!(["shop.orders chunk 0 (the whole table): 8 rows, their content differs"]),
        "{v:#}"
    );
    assert!(
        said.contains("warning: the restore oracle: shop.orders chunk 0"),
        "{said}"
    );
    let (out, datadir) = restore(wrong, true);
    assert_eq!(
        out.status.code(),
        Some(8),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--require-oracle: 1 of 2 chunk(s) of the restore oracle differ from the primary's: shop.orders chunk 0"),
        "{said}"
    );
    assert!(!datadir.exists(), "{said}");
    let failed = test(false);
    assert_eq!(failed["outcome"]["oracleChunks"], 2, "{failed:#}");
    assert_eq!(
        failed["outcome"]["problems"],
        serde_json::json!([
            "the restore oracle: shop.orders chunk 0 (the whole table): 8 rows, their content differs (the restored data is not the primary's there)"
        ]),
        "{failed:#}"
    );
    assert_eq!(failed["outcome"]["queryResult"], "8", "{failed:#}");

    // A full after the last run: a restore from it replays no chunk (the backup's own were
    // copied, not computed again), so nothing proves it.
    env.backup(None);
    let (out, datadir) = restore(mark(), true);
    assert_eq!(
        out.status.code(),
        Some(8),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no chunk of the restore oracle was replayed and compared"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!datadir.exists());
}

/// Restore tests (issue 19 §4): `tidemark restore-test` restores the newest point (a full
/// plus replayed binlogs) into scratch space, starts MariaDB on it, runs `CHECK TABLE` on
/// every table and the user's query, records the outcome beside the backup restored, and
/// removes the scratch data. A query answering other than expected fails (exit 4, naming
/// both), and so does a table the backup holds damaged (a MyISAM index overwritten on the
/// source before the backup copied it): `CHECK TABLE` names it.
#[test]
fn restore_tests_prove_the_newest_point_and_name_what_fails() {
    let (env, full) = five_in_a_full_and_three_after(None);
    let db = &env.db;
    pause_and_mark();
    env.archive();
    // Longer than a Unix socket's path may be (issue 28): the private server's socket
    // does not depend on it.
    let scratch = db
        .scratch()
        .join("restore-tests-in-a-directory-whose-path-alone-is-longer-than-a-socket-path");
    std::fs::create_dir(&scratch).unwrap();
    let scratch_s = scratch.to_str().unwrap();

    let count = "SELECT COUNT(*) FROM shop.orders";
    let passed = env.json(&[
        "restore-test",
        "--scratch",
        scratch_s,
        "--query",
        count,
        "--expect",
        "8",
    ]);
    assert_eq!(passed["outcome"]["passed"], true, "{passed:#}");
    assert_eq!(passed["outcome"]["queryResult"], "8", "{passed:#}");
    assert_eq!(passed["chain"], serde_json::json!([full]), "{passed:#}");
    assert!(
        passed["segmentsReplayed"].as_u64().unwrap() >= 1,
        "{passed:#}"
    );
    // shop.orders and the mysql schema's tables.
    assert!(
        passed["outcome"]["tablesChecked"].as_u64().unwrap() > 5,
        "{passed:#}"
    );
    assert_eq!(
        std::fs::read_dir(&scratch).unwrap().count(),
        0,
        "the scratch data is removed"
    );
    // The newest point: the window's end.
    let window = env.json(&[
        "restore",
        "--to",
        passed["target"].as_str().unwrap(),
        "--dry-run",
    ]);
    assert_eq!(
        window["recoveryWindow"]["to"], passed["target"],
        "{window:#}"
    );
    // Recorded beside the backup restored.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let record = rt
        .block_on(
            env.s3
                .cluster_store("e2e")
                .read(&object_store::path::Path::from(format!(
                    "nightly/{full}/_restoretest.json"
                ))),
        )
        .unwrap()
        .expect("_restoretest.json");
    let record: Value = serde_json::from_slice(&record).unwrap();
    assert_eq!(record["outcome"]["passed"], true, "{record:#}");
    // A passed test read the chain whole: it counts as the read-back
    // `retention.requireVerified` asks of the newest backup.
    let verified = rt
        .block_on(
            env.s3
                .cluster_store("e2e")
                .read(&object_store::path::Path::from(format!(
                    "nightly/{full}/_verified.json"
                ))),
        )
        .unwrap()
        .expect("_verified.json");
    let verified: Value = serde_json::from_slice(&verified).unwrap();
    assert_eq!(verified["by"], "restore test", "{verified:#}");
    assert_eq!(verified["checked"], "content", "{verified:#}");
    assert!(
        verified["chain"][0]
            .as_str()
            .unwrap()
            .starts_with(&format!("{full}:")),
        "{verified:#}"
    );

    // An unexpected answer fails the test, naming what came and what was expected.
    let out = env.tidemark(&[
        "restore-test",
        "--scratch",
        scratch_s,
        "--query",
        count,
        "--expect",
        "9",
        "--output",
        "json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let problems = failed["outcome"]["problems"].to_string();
    assert!(
        problems.contains(r#"returned \"8\", expected \"9\""#),
        "{failed:#}"
    );

    // A random point of the window restores too (5 to 8 rows).
    let random = env.json(&[
        "restore-test",
        "--scratch",
        scratch_s,
        "--random",
        "--query",
        count,
    ]);
    assert_eq!(random["outcome"]["passed"], true, "{random:#}");
    let rows: u32 = random["outcome"]["queryResult"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((5..=8).contains(&rows), "{random:#}");

    // A table the backup holds damaged.
    db.sql("CREATE TABLE shop.notes (id INT PRIMARY KEY, v INT) ENGINE=MyISAM; INSERT INTO shop.notes VALUES (1, 1), (2, 2); FLUSH TABLES");
    let index = db.datadir.join("shop").join("notes.MYI");
    let size = std::fs::metadata(&index).unwrap().len() as usize;
    std::fs::write(&index, vec![0xA5u8; size]).unwrap();
    env.backup(None);
    let out = env.tidemark(&["restore-test", "--scratch", scratch_s, "--output", "json"]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let damaged: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(damaged["outcome"]["passed"], false, "{damaged:#}");
    let problems = damaged["outcome"]["problems"].to_string();
    assert!(
        problems.contains("shop.notes") || problems.contains("`shop`.`notes`"),
        "{damaged:#}"
    );
    assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0);
}

/// Consolidation of a locked chain (issue 19 §3, seed 002), on a lock-enabled bucket: a
/// full and an incremental locked for a few seconds. While locked, a pass with
/// `--consolidate` keeps both (`locked:`; merging what cannot go gains nothing). Once their
/// date has passed, the pass under the lock merges them into a synthetic full locked from
/// birth until now plus the period (1d), and deletes the chain with every version; the
/// synthetic full alone restores.
#[test]
fn a_locked_chain_consolidates_into_a_locked_full() {
    let env = Env {
        s3: SeaweedFs::start(),
        db: MariaDb::start(),
        compression: "none",
        bucket: Some("lockedchain"),
    };
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(env.s3.locked_bucket("lockedchain", "e2e"));
    env.db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
    );
    env.insert(5);
    let until = Timestamp::from_second(Timestamp::now().as_second() + 40).unwrap();
    let lock = [
        "--lock-mode",
        "governance",
        "--lock-until",
        &until.to_string(),
    ];
    let full = env.backup_with(None, &lock);
    env.insert(3);
    let incremental = env.backup_with(Some(&full), &lock);
    let after = pause_and_mark();
    env.archive();
    let locked = ["--lock-mode", "governance", "--lock-period", "1d"];
    let consolidate = [&["gc", "--keep-last", "1", "--consolidate"][..], &locked].concat();

    // Locked: kept, not merged (planned at a moment before the date, whatever the
    // machine's speed).
    let before = (until - jiff::SignedDuration::from_secs(5)).to_string();
    let gc = env.json(&[&consolidate[..], &["--now", &before]].concat());
    assert_eq!(
        gc["executed"]["consolidated"],
        serde_json::json!([]),
        "{gc:#}"
    );
    let reasons = |v: &Value, id: &str| {
        v["backups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["backupId"] == id)
            .map(|b| b["reasons"].to_string())
            .unwrap_or_default()
    };
    assert!(
        reasons(&gc, &full).contains(&format!("locked:{until}")),
        "{gc:#}"
    );
    assert_eq!(
        backup_ids(&env.json(&["ls"])),
        vec![full.clone(), incremental.clone()]
    );

    // After the chain's date: merged into a locked synthetic full, the chain deleted.
    while Timestamp::now() <= until + jiff::SignedDuration::from_secs(1) {
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let started = Timestamp::now();
    let gc = env.json(&consolidate);
    let done = &gc["executed"]["consolidated"][0];
    assert_eq!(
        done["consolidatedFrom"],
        serde_json::json!([full, incremental]),
        "{gc:#}"
    );
    let synthetic = done["synthetic"].as_str().unwrap().to_owned();
    let mut deleted: Vec<String> = gc["executed"]["backupsDeleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    deleted.sort();
    assert_eq!(deleted, vec![full, incremental], "{gc:#}");
    let ls = env.json(&["ls"]);
    assert_eq!(backup_ids(&ls), vec![synthetic.clone()], "{ls:#}");
    let synthetic_until: Timestamp = ls["backups"][0]["immutableUntil"]
        .as_str()
        .unwrap_or_else(|| panic!("the synthetic full is not locked: {ls:#}"))
        .parse()
        .unwrap();
    assert!(
        synthetic_until >= started + jiff::SignedDuration::from_hours(24),
        "locked a period from its birth: {synthetic_until}"
    );
    // As the server holds it.
    let store =
        tidemark_store::ClusterStore::open("s3://lockedchain", "e2e", &env.s3.options()).unwrap();
    let key = tidemark_store::layout::metadata_key(
        ls["backups"][0]["backupName"].as_str().unwrap(),
        &synthetic,
    );
    let held = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(store.retention(&key))
        .unwrap()
        .unwrap_or_else(|| panic!("{key} is not locked on the server"));
    assert_eq!(held.until, synthetic_until);
    let plan = env.json(&["restore", "--to", &after.to_string(), "--dry-run"]);
    assert_eq!(backup_ids(&plan), vec![synthetic]);
    assert_eq!(env.restored_rows(after, "locked-synthetic"), "8");
}

/// Seed 002's immutable chains in standalone mode (issue 19 §3): `tidemark run` with a
/// mariabackup schedule every 10 s and `maxIncrementsPerFull: 2`, on a lock-enabled bucket
/// with a 1-day lock. The first full is locked until its chain's end — the schedule's second
/// slot after its own (a 10-second boundary, 9–21 s after it started) — plus the day; both
/// increments take that date; the server holds it.
#[test]
fn tidemark_run_locks_a_chain_until_its_end() {
    let s3 = SeaweedFs::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(s3.locked_bucket("chains", "shop"));
    let db = MariaDb::start();
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config");
    std::fs::create_dir_all(&cfg).unwrap();
    let client: Vec<String> = db.client_args();
    std::fs::write(
        cfg.join("tidemark.yaml"),
        format!(
            r#"apiVersion: tidemark.io/v1alpha1
kind: BackupPolicy
metadata: {{name: shop}}
spec:
  objectStore:
    bucket: chains
    endpoint: {endpoint}
    objectLock: {{mode: governance, period: 1d}}
  retention: {{keepLast: 10}}
---
apiVersion: tidemark.io/v1alpha1
kind: ScheduledBackup
metadata: {{name: shop-10s}}
spec:
  schedule: "*/10 * * * * *"
  immediate: true
  policy: {{name: shop}}
  method: mariabackup
  incremental: {{maxIncrementsPerFull: 2}}
  command: [mariabackup, "{c0}", "{c1}"]
"#,
            endpoint = s3.endpoint,
            c0 = client[0],
            c1 = client[1],
        ),
    )
    .unwrap();
    let log = dir.path().join("run.log");
    let mut run = bin()
        .envs(s3.env())
        .args(["run", "--config", cfg.to_str().unwrap(), "--grace", "60s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let ls = || {
        common::json(&on_bucket(
            &s3,
            "s3://chains",
            "shop",
            &["ls", "--output", "json"],
        ))
    };
    let completed = |v: &Value| -> Vec<Value> {
        v["backups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["phase"] == "completed")
            .cloned()
            .collect()
    };
    let started = std::time::Instant::now();
    let backups = loop {
        let v = ls();
        let done = completed(&v);
        if done.len() >= 3 {
            break done;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "three backups not taken in 90 s: {v:#}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        sleep(Duration::from_secs(1));
    };
    stop_run(&mut run, &log);

    let at = |b: &Value, field: &str| -> Timestamp {
        b[field]
            .as_str()
            .unwrap_or_else(|| panic!("no {field}: {b:#}"))
            .parse()
            .unwrap()
    };
    let (full, increments) = backups.split_first().unwrap();
    assert_eq!(full["type"], "full", "{backups:#?}");
    let until = at(full, "immutableUntil");
    let chain_end = until - jiff::SignedDuration::from_hours(24);
    assert_eq!(
        chain_end.as_second() % 10,
        0,
        "a slot of the schedule: {chain_end}"
    );
    let after_start = chain_end.duration_since(at(full, "startedAt"));
    assert!(
        after_start >= jiff::SignedDuration::from_secs(9)
            && after_start <= jiff::SignedDuration::from_secs(21),
        "the second slot after the full's: {chain_end}, started {}",
        at(full, "startedAt")
    );
    for inc in &increments[..2] {
        assert_eq!(inc["type"], "incremental", "{backups:#?}");
        assert_eq!(at(inc, "immutableUntil"), until, "{inc:#}");
    }
    for b in &backups[..3] {
        let key = object_store::path::Path::from(format!(
            "{}/{}/metadata.json",
            b["backupName"].as_str().unwrap(),
            b["backupId"].as_str().unwrap()
        ));
        let held = rt.block_on(store.retention(&key)).unwrap().unwrap();
        assert_eq!(held.until, until, "{key}");
    }
}

/// A shared library that, loaded anywhere, appends to `marker` who loaded it and what it
/// could read of its parent's environment (`TIDEMARK_IDENTITY`, the store's keys).
fn marker_library(dir: &Path, marker: &Path) -> std::path::PathBuf {
    let src = dir.join("evil.c");
    std::fs::write(
        &src,
        format!(
            r#"#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {{
  FILE *m = fopen("{}", "a");
  if (!m) return;
  fprintf(m, "ran in pid %d; own identity=%s\n", getpid(), getenv("TIDEMARK_IDENTITY") ? "yes" : "no");
  char path[64]; snprintf(path, sizeof path, "/proc/%d/environ", getppid());
  FILE *p = fopen(path, "r");
  if (p) {{ char buf[4096]; size_t n = fread(buf, 1, sizeof buf, p); fprintf(m, "read %zu bytes of the parent's environment\n", n); fclose(p); }}
  fclose(m);
}}
"#,
            marker.display()
        ),
    )
    .unwrap();
    let lib = dir.join("evil.so");
    let out = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run gcc ({e}): scripts/test.sh installs it"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Runtime::new().unwrap().block_on(f)
}

fn get_object(store: &tidemark_store::ClusterStore, key: &str) -> Vec<u8> {
    use object_store::ObjectStoreExt as _;
    block_on(async {
        store
            .object_store()
            .get(&object_store::path::Path::from(key))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec()
    })
}

fn put_object(store: &tidemark_store::ClusterStore, key: &str, body: Vec<u8>) {
    use object_store::ObjectStoreExt as _;
    block_on(
        store
            .object_store()
            .put(&object_store::path::Path::from(key), body.into()),
    )
    .unwrap();
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// As someone who can write the bucket and nothing else: the payload of backup `id` gets
/// `lib` and the plugin trick in its `backup-my.cnf`, and its `metadata.json` the new size
/// and checksum.
fn plant_backup(env: &Env, id: &str, lib: &Path, work: &Path) {
    let store = env.s3.cluster_store("e2e");
    let meta_key = format!("nightly/{id}/metadata.json");
    let mut meta: Value = serde_json::from_slice(&get_object(&store, &meta_key)).unwrap();
    let object = meta["payload"][0]["name"].as_str().unwrap().to_owned();
    let payload_key = format!("nightly/{id}/{object}");
    let tree = work.join(format!("planted-{id}"));
    std::fs::create_dir_all(&tree).unwrap();
    let mut x = std::process::Command::new("mbstream")
        .args(["-x", "-C"])
        .arg(&tree)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(x.stdin.as_mut().unwrap(), &get_object(&store, &payload_key))
        .unwrap();
    drop(x.stdin.take());
    assert!(x.wait().unwrap().success());
    std::fs::copy(lib, tree.join("evil.so")).unwrap();
    let cnf = tree.join("backup-my.cnf");
    let mut text = std::fs::read_to_string(&cnf).unwrap();
    text.push_str(
        "[mysqld]\nplugin_dir=/proc/self/cwd\nplugin_load=evil.so\nplugin-load-add=evil.so\n",
    );
    std::fs::write(&cnf, text).unwrap();
    let files: Vec<String> = walk(&tree)
        .iter()
        .map(|p| p.strip_prefix(&tree).unwrap().to_str().unwrap().to_owned())
        .collect();
    let out = std::process::Command::new("mbstream")
        .arg("-c")
        .args(&files)
        .current_dir(&tree)
        .output()
        .unwrap();
    assert!(out.status.success());
    meta["payload"][0]["size"] = out.stdout.len().into();
    meta["payload"][0]["sha256"] = sha256_hex(&out.stdout).into();
    put_object(&store, &payload_key, out.stdout);
    put_object(&store, &meta_key, serde_json::to_vec(&meta).unwrap());
}

/// CRC-32 (IEEE), as a binlog event's checksum.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// As a bucket writer: the archived segment holding `needle` (a whole statement) gets
/// `statement` (padded to the same length) in its place, the event's checksum recomputed
/// and the index entry's sha256 rewritten. Returns what to write back to undo it.
fn forge_segment(env: &Env, needle: &str, statement: &str) -> Vec<(String, Vec<u8>)> {
    let store = env.s3.cluster_store("e2e");
    let index_key = "binlogs/_index.json";
    let original_index = get_object(&store, index_key);
    let mut index: Value = serde_json::from_slice(&original_index).unwrap();
    let names: Vec<String> = index["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect();
    for name in names {
        let key = format!("binlogs/{name}");
        let original = get_object(&store, &key);
        let mut bytes = original.clone();
        let Some(at) = bytes
            .windows(needle.len())
            .position(|w| w == needle.as_bytes())
        else {
            continue;
        };
        let mut forged = format!("{statement} /*");
        assert!(forged.len() + 2 <= needle.len());
        forged.push_str(&" ".repeat(needle.len() - forged.len() - 2));
        forged.push_str("*/");
        bytes[at..at + needle.len()].copy_from_slice(forged.as_bytes());
        // The event around it: walk from the magic number.
        let mut start = 4usize;
        loop {
            let size =
                u32::from_le_bytes(bytes[start + 9..start + 13].try_into().unwrap()) as usize;
            if at < start + size {
                let crc = crc32(&bytes[start..start + size - 4]);
                bytes[start + size - 4..start + size].copy_from_slice(&crc.to_le_bytes());
                break;
            }
            start += size;
        }
        for e in index["segments"].as_array_mut().unwrap() {
            if e["name"] == name.as_str() {
                e["sha256"] = sha256_hex(&bytes).into();
            }
        }
        put_object(&store, &key, bytes);
        put_object(&store, index_key, serde_json::to_vec(&index).unwrap());
        return vec![(key, original), (index_key.to_owned(), original_index)];
    }
    panic!("no archived segment holds {needle:?}");
}

/// Issue 28 finding 1: someone who can write the bucket (a leaked key) plants a backup and
/// a binlog segment. Nothing they carry runs — no library from the backup in `mariabackup`
/// or `mariadbd`, no file written or read by a replayed statement — in `restore`,
/// `restore-test` or a consolidation, and each command reports what it refused.
#[test]
fn a_bucket_writer_runs_no_code_where_backups_are_restored() {
    let env = Env {
        s3: SeaweedFs::start(),
        db: MariaDb::start(),
        compression: "none",
        bucket: None,
    };
    let db = &env.db;
    let work = db.scratch().join("attacker");
    std::fs::create_dir(&work).unwrap();
    let marker = work.join("MARKER");
    let lib = marker_library(&work, &marker);
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT); \
         CREATE TABLE shop.notes (note TEXT)",
    );
    env.insert(5);
    db.sql("FLUSH BINARY LOGS");
    let full = env.backup(None);
    env.insert(3);
    let incremental = env.backup(Some(&full));
    let encrypted_from = pause_and_mark();
    // Statements a forger rewrites: long enough to hold what they put there.
    let needle = |i: usize| {
        format!(
            "INSERT INTO shop.notes VALUES ('note {i} {}')",
            "x".repeat(160)
        )
    };
    for i in 0..3 {
        db.sql(&needle(i));
    }
    let after = pause_and_mark();
    env.archive();
    let store = env.s3.cluster_store("e2e");
    // `how`: the replay's way (issue 49): the forged segments are tried against both.
    let restore_with = |name: &str, how: &str| {
        let dir = db.scratch().join(name);
        let out = env.tidemark(&[
            "restore",
            "--to",
            &after.to_string(),
            "--datadir",
            dir.to_str().unwrap(),
            "--replay",
            how,
        ]);
        (out, dir)
    };
    let restore_to = |name: &str| restore_with(name, "client");
    let no_marker = |when: &str| {
        assert!(
            !marker.exists(),
            "{when}: planted code ran:\n{}",
            std::fs::read_to_string(&marker).unwrap_or_default()
        );
    };
    // Intact, the restore holds every note.
    let (out, dir) = restore_to("intact");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(query_restored(&dir, "SELECT COUNT(*) FROM shop.notes"), "3");

    // The restored data directory is the server user's (the replay ran as it, never as
    // root), and the accounts the replay made are gone from it.
    if running_as_root() {
        let owner = std::fs::metadata(dir.join("shop")).unwrap().uid();
        assert_eq!(owner, uid_of(SERVER_USER), "the restored data is root's");
    }
    assert_eq!(
        query_restored(
            &dir,
            "SELECT COUNT(*) FROM mysql.global_priv WHERE User LIKE 'tidemark%'"
        ),
        "0"
    );
    // As root, no replay without a user to run the server as: refused before a download.
    if running_as_root() {
        let dir = db.scratch().join("as-root");
        let mut c = bin();
        c.env_remove("TIDEMARK_SERVER_USER")
            .envs(env.s3.env())
            .args(["restore", "--store", &env.s3.url(), "--cluster", "e2e"])
            .args(["--endpoint", &env.s3.endpoint, "--to", &after.to_string()])
            .args(["--datadir", dir.to_str().unwrap()]);
        let out = c.output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{said}");
        assert!(said.contains("--server-user"), "{said}");
        assert!(!dir.exists(), "{said}");
    }

    // Forged segments: each statement is refused by the locked-down replay, the restore
    // fails naming it, and nothing is left. The files they name are where the server's
    // user could write them: only the replay's rights and options stop them.
    let outfile = work.join("written-by-replay");
    let writable = work.join("writable");
    std::fs::create_dir(&writable).unwrap();
    std::fs::set_permissions(&writable, std::fs::Permissions::from_mode(0o777)).unwrap();
    let w = writable.display();
    let mut tried = 0;
    for (i, statement, refused) in [
        (
            0,
            format!("SELECT 'pwned' INTO OUTFILE '{}'", outfile.display()),
            "FILE privilege",
        ),
        (
            1,
            "INSTALL SONAME 'ha_federatedx'".to_owned(),
            "ha_federatedx",
        ),
        (
            2,
            "LOAD DATA LOCAL INFILE '/proc/self/environ' INTO TABLE shop.notes".to_owned(),
            "local infile",
        ),
        (
            0,
            format!("SET GLOBAL general_log_file='{w}/general.log'; SET GLOBAL general_log=ON"),
            "SUPER",
        ),
        (
            1,
            format!("SET GLOBAL slow_query_log_file='{w}/slow.log'"),
            "SUPER",
        ),
        (
            2,
            "CREATE DEFINER=root@localhost PROCEDURE shop.p() SET GLOBAL general_log=ON".to_owned(),
            "SET USER",
        ),
        (
            0,
            "INSERT INTO mysql.global_priv VALUES ('localhost', 'evil', '{}')".to_owned(),
            "INSERT command denied",
        ),
        // A role of its own with the pattern's rights would reach `mysql` too.
        (
            1,
            "CREATE ROLE r1; GRANT INSERT ON `%`.* TO r1; GRANT r1 TO CURRENT_USER; \
             SET ROLE r1; INSERT INTO mysql.global_priv VALUES ('localhost', 'evil', '{}')"
                .to_owned(),
            "Access denied",
        ),
        (
            2,
            "GRANT INSERT ON `%`.* TO PUBLIC".to_owned(),
            "Access denied",
        ),
    ] {
        let undo = forge_segment(&env, &needle(i), &statement);
        // Every other one through the applier path (which gives statements to the client).
        tried += 1;
        let how = if tried % 2 == 0 { "applier" } else { "client" };
        let (out, dir) = restore_with(&format!("forged-{i}"), how);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{statement} (--replay {how}): the restore succeeded"
        );
        assert!(
            said.contains(refused),
            "{statement} (--replay {how}): {said}"
        );
        assert!(
            !dir.exists(),
            "{statement}: a half-restored directory is left"
        );
        assert!(
            !outfile.exists(),
            "{statement}: the replay wrote {}",
            outfile.display()
        );
        assert_eq!(
            std::fs::read_dir(&writable).unwrap().count(),
            0,
            "{statement}: the replay wrote in {w}"
        );
        no_marker(&statement);
        for (key, body) in undo {
            put_object(&store, &key, body);
        }
    }
    // A table's files named outside the data directory are made inside it (symbolic links
    // are off): the restore holds the table, and nothing is written where it said.
    for (i, statement, table) in [
        (
            0,
            format!("CREATE TABLE shop.placed (i INT) DATA DIRECTORY='{w}'"),
            "placed.ibd",
        ),
        (
            1,
            format!(
                "CREATE TABLE shop.mine (i INT) ENGINE=MyISAM DATA DIRECTORY='{w}' \
                 INDEX DIRECTORY='{w}'"
            ),
            "mine.MYD",
        ),
    ] {
        let undo = forge_segment(&env, &needle(i), &statement);
        let (out, dir) = restore_to(&format!("placed-{i}"));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{statement}: {said}");
        assert!(dir.join("shop").join(table).is_file(), "{statement}");
        assert_eq!(
            std::fs::read_dir(&writable).unwrap().count(),
            0,
            "{statement}: the replay wrote in {w}"
        );
        for (key, body) in undo {
            put_object(&store, &key, body);
        }
    }

    // Under encryption every plaintext object could be the bucket writer's: refused unless
    // named as history from before encryption, and a segment written after the instant
    // named is refused by name.
    let keygen = common::bin().arg("keygen").output().unwrap();
    let public = String::from_utf8_lossy(&keygen.stderr)
        .trim()
        .strip_prefix("Public key: ")
        .unwrap()
        .to_owned();
    let encrypting = |extra: &[&str]| {
        let dir = db.scratch().join("encrypting");
        let to = after.to_string();
        let args = [
            &[
                "restore",
                "--to",
                &to,
                "--datadir",
                dir.to_str().unwrap(),
                "--recipient",
                &public,
            ][..],
            extra,
        ]
        .concat();
        let out = env.tidemark(&args);
        assert_eq!(out.status.code(), Some(4), "{out:?}");
        assert!(!dir.exists());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = encrypting(&[]);
    assert!(
        said.contains("is not encrypted") && said.contains(&full),
        "{said}"
    );
    let said = encrypting(&["--allow-plaintext-before", &encrypted_from.to_string()]);
    assert!(
        said.contains("is not encrypted") && said.contains("binlogs/"),
        "{said}"
    );

    // A planted full: its library never loads, in a restore, a restore test or a
    // consolidation, and each says why it refused the backup.
    plant_backup(&env, &full, &lib, &work);
    let (out, dir) = restore_to("planted");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the planted backup was restored");
    assert!(
        said.contains("backup-my.cnf") && said.contains("plugin_dir"),
        "{said}"
    );
    assert!(said.contains(&full), "{said}");
    assert!(!dir.exists());
    no_marker("restore");
    let scratch = db.scratch().join("restore-tests");
    std::fs::create_dir(&scratch).unwrap();
    let out = env.tidemark(&["restore-test", "--scratch", scratch.to_str().unwrap()]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "the restore test passed: {said}");
    assert!(said.contains("backup-my.cnf"), "{said}");
    no_marker("restore-test");
    let out = env.tidemark(&[
        "gc",
        "--keep-last",
        "1",
        "--consolidate",
        "--output",
        "json",
    ]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("backup-my.cnf"), "{said}");
    no_marker("gc --consolidate");
    assert_eq!(
        backup_ids(&env.json(&["ls"])),
        vec![full.clone(), incremental.clone()],
        "the chain is kept: {said}"
    );
}

/// Issue 45 §4: `archive-binlogs --from-server --purge-keep` purges the server's binlogs only
/// once the store holds them verified. A store that cannot be reached (an outage) purges
/// nothing — every file stays on the server; once it is back, one pass archives them and
/// purges up to the file being written, and a restore to an instant inside the outage is
/// exact: no binlog was lost. Files younger than `keep` stay. A replica (`--purge-replica`),
/// its files numbered apart from the primary's, is purged by the same rule, found by GTID.
#[test]
fn the_servers_binlogs_are_purged_only_once_archived() {
    const PASSWORD: &str = "purge-pw-4e1d";
    let env = Env::replicating(1);
    let db = &env.db;
    // A replica whose files are numbered apart from the primary's: its purge follows the
    // archive by GTID, not by name.
    let replica = MariaDb::start_replicating(2);
    replica.sql("FLUSH BINARY LOGS; FLUSH BINARY LOGS");
    replica.replicate_from(db);
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT);",
    );
    let connection = network_login(db, "arch", PASSWORD);
    let replica_at = format!("127.0.0.1:{}", replica.port);
    // Both servers close a file at the same transaction, and each has written its binlog
    // checkpoint past the closed files (until then the server keeps a file for crash
    // recovery whatever PURGE says).
    let checkpointed = |db: &MariaDb| {
        let newest = db.sql("SHOW MASTER STATUS");
        let newest = newest.split('\t').next().unwrap_or_default().to_owned();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let events = db.sql(&format!("SHOW BINLOG EVENTS IN '{newest}'"));
            let last = events
                .lines()
                .rfind(|l| l.contains("Binlog_checkpoint"))
                .unwrap_or_default()
                .to_owned();
            if last.contains(&newest) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint in {newest}: {events}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let flush = || {
        replica.wait_caught_up(db);
        db.sql("FLUSH BINARY LOGS");
        replica.sql("FLUSH BINARY LOGS");
        checkpointed(db);
        checkpointed(&replica);
    };
    let spool = db.scratch().join("spool");
    let args_with = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["archive-binlogs", "--from-server", "--spool"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        args.push(spool.to_str().unwrap().to_owned());
        args.push("--once".into());
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args.push("--".into());
        args.extend(connection.iter().cloned());
        args
    };
    let files_of = |db: &MariaDb| -> Vec<String> {
        db.sql("SHOW BINARY LOGS")
            .lines()
            .filter_map(|l| l.split('\t').next())
            .map(str::to_owned)
            .filter(|n| n.starts_with("mysql-bin."))
            .collect()
    };
    let server_files = || files_of(db);
    let replica_files = || files_of(&replica);
    // Where a file starts in the history: the same on both servers for files cut at the
    // same transaction.
    let start_of =
        |db: &MariaDb, file: &str| db.sql(&format!("SELECT BINLOG_GTID_POS('{file}', 4)"));

    env.insert(5);
    env.backup(None);
    env.insert(10); // 15
    flush();
    env.insert(3); // 18
    let target = pause_and_mark();
    env.insert(4); // 22
    flush();
    env.insert(2); // 24
    flush();
    let before = server_files();
    assert!(before.len() >= 4, "{before:?}");
    let replica_before = replica_files();

    // The store is down (nothing listens at its endpoint): the pass fails, nothing is purged.
    let args = args_with(&[
        "--purge-keep",
        "0s",
        "--purge-replica",
        &replica_at,
        "--output",
        "json",
    ]);
    let mut down = bin();
    down.envs(env.s3.env())
        .arg(&args[0])
        .args(["--store", &env.s3.url(), "--cluster", "e2e"])
        .args(["--endpoint", "http://127.0.0.1:9"])
        .args(&args[1..]);
    let out = down.output().unwrap();
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(server_files(), before, "an outage purged binlogs");
    assert_eq!(
        replica_files(),
        replica_before,
        "an outage purged a replica's binlogs"
    );

    // Back: one pass archives them and purges what it holds verified, up to the open file.
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let v: Value = serde_json::from_slice(&env.ok(&refs).stdout).unwrap();
    let purge = &v["purge"];
    let after = server_files();
    assert_eq!(after.len(), 1, "{purge} {after:?}");
    assert_eq!(purge["purgedTo"], after[0].as_str(), "{purge}");
    assert_eq!(
        purge["purged"].as_array().unwrap().len(),
        before.len() - 1,
        "{purge}"
    );
    assert!(
        purge["diskBytesAfter"].as_u64() < purge["diskBytes"].as_u64(),
        "{purge}"
    );
    // The replica's too, up to its own open file, by the same rule.
    let on_replica = &v["purgeReplicas"][0];
    assert_eq!(on_replica["server"], replica_at.as_str(), "{v}");
    let replica_after = replica_files();
    assert_eq!(replica_after.len(), 1, "{on_replica} {replica_after:?}");
    assert_eq!(
        on_replica["purgedTo"],
        replica_after[0].as_str(),
        "{on_replica}"
    );
    assert_ne!(replica_after, after, "the replica's files are named apart");
    // Nothing of the outage was lost: an instant inside it restores exactly.
    assert_eq!(env.restored_rows(target, "after-outage"), "18");

    // Files younger than keep stay on the server, archived or not.
    env.insert(1);
    flush();
    let keep = args_with(&[
        "--purge-keep",
        "1h",
        "--purge-replica",
        &replica_at,
        "--output",
        "json",
    ]);
    let refs: Vec<&str> = keep.iter().map(String::as_str).collect();
    let v: Value = serde_json::from_slice(&env.ok(&refs).stdout).unwrap();
    assert_eq!(server_files().len(), 2, "{}", v["purge"]);
    assert_eq!(replica_files().len(), 2, "{}", v["purgeReplicas"]);
    assert!(
        v["purge"]["keptBecause"]
            .as_str()
            .unwrap_or_default()
            .contains("younger than keep"),
        "{}",
        v["purge"]
    );

    // With the store readable, a file whose segment is not there (deleted by hand) is not
    // verified: the purge stops before it, whatever `keep` allows.
    env.insert(1);
    flush();
    env.insert(1);
    flush();
    let plain = args_with(&[]);
    env.ok(&plain.iter().map(String::as_str).collect::<Vec<_>>());
    let files = server_files();
    assert_eq!(files.len(), 4, "{files:?}");
    let missing = files[1].clone();
    use object_store::ObjectStoreExt as _;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let raw = env.s3.raw_store();
    let key = object_store::path::Path::from(format!("e2e/binlogs/{missing}"));
    let body = rt
        .block_on(async { raw.get(&key).await?.bytes().await })
        .unwrap();
    rt.block_on(raw.delete(&key)).unwrap();
    let replica_held = replica_files();
    assert_eq!(replica_held.len(), 4, "{replica_held:?}");
    assert_eq!(
        start_of(&replica, &replica_held[1]),
        start_of(db, &missing),
        "the replica's second file starts where the primary's does"
    );
    let now = args.clone();
    let v: Value = serde_json::from_slice(
        &env.ok(&now.iter().map(String::as_str).collect::<Vec<_>>())
            .stdout,
    )
    .unwrap();
    let left = server_files();
    assert_eq!(left, files[1..].to_vec(), "{}", v["purge"]);
    assert_eq!(v["purge"]["purgedTo"], missing.as_str(), "{}", v["purge"]);
    // The replica's file holding those transactions stays as well.
    assert_eq!(
        replica_files(),
        replica_held[1..].to_vec(),
        "{}",
        v["purgeReplicas"]
    );
    assert!(
        v["purge"]["keptBecause"]
            .as_str()
            .unwrap_or_default()
            .contains(missing.as_str()),
        "{}",
        v["purge"]
    );
    // The segment back: both servers purge up to their open file.
    rt.block_on(raw.put(&key, body.into())).unwrap();
    let v: Value = serde_json::from_slice(
        &env.ok(&now.iter().map(String::as_str).collect::<Vec<_>>())
            .stdout,
    )
    .unwrap();
    assert_eq!(server_files().len(), 1, "{}", v["purge"]);
    assert_eq!(replica_files().len(), 1, "{}", v["purgeReplicas"]);

    // A hole: the primary's own expiry purges two files the archive never got (the
    // archiver was not running), while the replica holds their transactions inside one
    // file that also holds what comes before and after them. The primary purges as before
    // — its files begin after the hole — and the replica keeps that file: the archive
    // holds what precedes and follows it, not all of it (mutation: the chain not checked
    // for holes — the replica's file goes).
    env.insert(1);
    db.sql("FLUSH BINARY LOGS");
    // That one archived; the next two not.
    env.ok(&plain.iter().map(String::as_str).collect::<Vec<_>>());
    env.insert(2);
    db.sql("FLUSH BINARY LOGS");
    env.insert(2);
    db.sql("FLUSH BINARY LOGS");
    checkpointed(db);
    let lost_on_primary = server_files();
    assert_eq!(lost_on_primary.len(), 4, "{lost_on_primary:?}");
    db.sql(&format!("PURGE BINARY LOGS TO '{}'", lost_on_primary[3]));
    env.insert(1);
    flush();
    let replica_with_hole = replica_files();
    assert_eq!(replica_with_hole.len(), 2, "{replica_with_hole:?}");
    let v: Value = serde_json::from_slice(
        &env.ok(&now.iter().map(String::as_str).collect::<Vec<_>>())
            .stdout,
    )
    .unwrap();
    assert_eq!(server_files().len(), 1, "{}", v["purge"]);
    assert_eq!(
        replica_files(),
        replica_with_hole,
        "the replica's only copy of the hole: {}",
        v["purgeReplicas"]
    );
}

/// The SQL block of docs/database.md that opens with `-- tidemark: {marker}`, as written.
fn documented_sql(marker: &str) -> String {
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/database.md"),
    )
    .unwrap();
    let opening = format!("```sql\n-- tidemark: {marker}\n");
    let at = page
        .find(&opening)
        .unwrap_or_else(|| panic!("docs/database.md has no block {opening:?}"));
    let rest = &page[at + opening.len()..];
    rest[..rest.find("```").unwrap()].to_owned()
}

/// An option file logging in as `user` with `password`; the connection options with it.
fn login_file(db: &MariaDb, user: &str, password: &str, rest: &[String]) -> Vec<String> {
    let options = db.scratch().join(format!("{user}.cnf"));
    std::fs::write(
        &options,
        format!("[client]\nuser={user}\npassword={password}\n"),
    )
    .unwrap();
    let mut args = vec![format!("--defaults-extra-file={}", options.display())];
    args.extend_from_slice(rest);
    args
}

/// Issue 46 §1: the accounts docs/database.md gives, created with its statements as written,
/// back up, archive and purge; the server is asked what each task needs before it runs, and
/// a missing grant or setting is named with the statement that fixes it — a backup refused
/// before mariabackup runs (recorded as failed), an archive pass refused, a purge refused
/// while archiving goes on. Without binary logging a backup is taken and warned of, and an
/// archive pass refused.
#[test]
fn each_task_asks_the_server_for_what_it_needs_first() {
    let env = Env {
        s3: SeaweedFs::start(),
        db: MariaDb::start(),
        compression: "none",
        bucket: None,
    };
    let db = &env.db;
    // The test server's install made the anonymous accounts the page says to drop.
    db.sql("DROP USER ''@'localhost'");
    db.sql(&documented_sql("command-line accounts"));
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT);",
    );
    env.insert(3);
    let socket = vec![format!("--socket={}", db.socket.display())];
    let backup_login = login_file(db, "tidemark_backup", "change-me-backup", &socket);
    let network = vec!["--host=127.0.0.1".to_owned(), format!("--port={}", db.port)];
    let archive_login = login_file(db, "tidemark_archive", "change-me-archive", &network);
    let spool = db.scratch().join("spool");
    let push = |login: &[String]| {
        let mut args = vec![
            "push",
            "--backup-name",
            "nightly",
            "--method",
            "mariabackup",
            "--output",
            "json",
            "--",
            "mariabackup",
        ];
        args.extend(login.iter().map(String::as_str));
        env.tidemark(&args)
    };
    let archive = |login: &[String]| {
        db.sql("FLUSH BINARY LOGS");
        let mut args = vec![
            "archive-binlogs",
            "--from-server",
            "--spool",
            spool.to_str().unwrap(),
            "--once",
            "--purge-keep",
            "0s",
            "--output",
            "json",
            "--",
        ];
        args.extend(login.iter().map(String::as_str));
        env.tidemark(&args)
    };
    let said = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };

    // The documented grants are enough for every task.
    let ok = push(&backup_login);
    assert!(ok.status.success(), "{}", said(&ok));
    env.insert(2); // 5
    let target = pause_and_mark();
    env.insert(1); // 6
    let ok = archive(&archive_login);
    assert!(ok.status.success(), "{}", said(&ok));
    let v: Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert!(v["purge"]["purgedTo"].is_string(), "{v}");
    assert_eq!(env.restored_rows(target, "documented"), "5");

    // One grant fewer: the backup is refused before mariabackup streams a byte, named with
    // the statement that fixes it, and recorded as a failed attempt.
    db.sql("REVOKE SLAVE MONITOR ON *.* FROM 'tidemark_backup'@'localhost'");
    let refused = push(&backup_login);
    assert_eq!(refused.status.code(), Some(6), "{}", said(&refused));
    let fix = "lacks SLAVE MONITOR (GRANT SLAVE MONITOR ON *.* TO 'tidemark_backup'@'localhost')";
    assert!(said(&refused).contains(fix), "{}", said(&refused));
    assert!(
        said(&refused).contains("docs/database.md"),
        "{}",
        said(&refused)
    );
    let ls = env.json(&["ls"]);
    let failed: Vec<&Value> = ls["backups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["phase"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "{ls}");
    assert_eq!(failed[0]["size"].as_u64().unwrap_or(0), 0, "{ls}");
    let key =
        tidemark_store::layout::metadata_key("nightly", failed[0]["backupId"].as_str().unwrap());
    let recorded: Value =
        serde_json::from_slice(&get_object(&env.s3.cluster_store("e2e"), key.as_ref())).unwrap();
    assert!(
        recorded["error"].as_str().unwrap().contains(fix),
        "{recorded}"
    );

    // No BINLOG ADMIN: the pass archives, the purge is refused by name.
    env.insert(2);
    db.sql("REVOKE BINLOG ADMIN ON *.* FROM 'tidemark_archive'@'%'");
    let first_file = |db: &MariaDb| {
        let files = db.sql("SHOW BINARY LOGS");
        files.split('\t').next().unwrap().to_owned()
    };
    let before = first_file(db);
    let out = archive(&archive_login);
    assert!(out.status.success(), "{}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!v["uploaded"].as_array().unwrap().is_empty(), "{v}");
    assert!(
        said(&out)
            .contains("lacks BINLOG ADMIN (GRANT BINLOG ADMIN ON *.* TO 'tidemark_archive'@'%')"),
        "{}",
        said(&out)
    );
    assert_eq!(
        first_file(db),
        before,
        "a purge without BINLOG ADMIN purged"
    );

    // No REPLICATION SLAVE: the archive pass is refused before it reads anything.
    db.sql("REVOKE REPLICATION SLAVE ON *.* FROM 'tidemark_archive'@'%'");
    let refused = archive(&archive_login);
    assert_eq!(refused.status.code(), Some(6), "{}", said(&refused));
    assert!(
        said(&refused).contains("the server cannot serve a binlog archive pass: the account 'tidemark_archive'@'%' lacks REPLICATION SLAVE"),
        "{}",
        said(&refused)
    );

    // Binary logging off: a backup is whole and warned of; an archive pass is refused.
    let plain = MariaDb::start_with_options(&["--skip-log-bin"]);
    let root = plain.client_args();
    let mut args = vec![
        "push",
        "--backup-name",
        "plain",
        "--method",
        "mariabackup",
        "--",
        "mariabackup",
    ];
    args.extend(root.iter().map(String::as_str));
    let warned = env.tidemark(&args);
    assert!(warned.status.success(), "{}", said(&warned));
    assert!(
        said(&warned).contains("log_bin is OFF"),
        "{}",
        said(&warned)
    );
    let mut args = vec![
        "archive-binlogs",
        "--from-server",
        "--spool",
        spool.to_str().unwrap(),
        "--once",
        "--",
    ];
    args.extend(root.iter().map(String::as_str));
    let refused = env.tidemark(&args);
    assert!(!refused.status.success(), "{}", said(&refused));
    assert!(
        said(&refused).contains("log_bin is OFF, so there are no binlogs to archive"),
        "{}",
        said(&refused)
    );
}

/// Issue 46 §3: a point-in-time restore leaves the server where the history continues. The
/// restore reports the GTID position reached — the primary's own position at that instant —
/// and leaves it as the server's binlog state (`mysql-bin.state`) and `gtid_slave_pos`; the
/// server started on the restored data in place of the old one writes on from there, and
/// the archive records it as a new timeline whose switch is that position — its oldest
/// file's start, although a later file (it rotated) starts at a number the abandoned
/// future also has. Then both histories restore exactly: an instant after the restore (the
/// new timeline), an instant of the abandoned future along its own timeline (`--timeline
/// 0`), and the same instant on the main line, which holds nothing of that future. Restored
/// once more into that future, the server's numbers stand on two histories: the archive
/// joins it nowhere (unrelated, a gap) rather than guess.
#[test]
fn a_restored_server_continues_the_history_on_a_new_timeline() {
    use std::os::unix::fs::PermissionsExt as _;
    let place = tempfile::tempdir().unwrap();
    // The restore's private server runs as another user when the tests run as root.
    std::fs::set_permissions(place.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let mut env = Env::replicating(1);
    env.db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT);",
    );
    env.insert(5);
    env.backup(None);
    env.insert(10); // 15
    let position_then = env.db.sql("SELECT @@gtid_binlog_pos");
    let to = pause_and_mark();
    env.insert(4); // 19: the future the restore abandons
    let in_future = pause_and_mark();
    for _ in 0..3 {
        env.insert(1); // 20, 21, 22
    }
    env.archive();

    // A restore into `dir` (along `extra`'s timeline), as JSON.
    let restore_into = |env: &Env, at: Timestamp, dir: &Path, extra: &[&str]| {
        let at = at.to_string();
        let mut args = vec!["restore", "--to", &at, "--datadir", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        env.json(&args)
    };
    // In place: the data replaced by the restore's, the server started on it.
    let dir = place.path().join("data");
    let done = restore_into(&env, to, &dir, &[]);
    assert_eq!(done["gtidPosition"], position_then.as_str(), "{done}");
    let state = dir.join("mysql-bin.state");
    assert_eq!(done["binlogStateFile"], state.to_str().unwrap(), "{done}");
    env.db.kill();
    env.db = MariaDb::start_on(&dir, 1);
    assert_eq!(
        env.db.sql("SELECT @@gtid_binlog_pos, @@gtid_slave_pos"),
        format!("{position_then}\t{position_then}"),
        "the restored server does not stand where the history was restored to"
    );
    assert_eq!(env.db.sql("SELECT COUNT(*) FROM shop.orders"), "15");
    env.insert(7); // 22
    // Its second file starts at a number (0-1-5) the abandoned future holds too.
    env.db.sql("FLUSH BINARY LOGS");
    let after = pause_and_mark();
    env.insert(2); // 24

    // A replica re-seeded from the same restore (docs/operator.md's runbook): it stands at
    // the position restored, and replication from the restored primary resumes by GTID
    // from there, taking what the primary wrote since.
    let replica_dir = place.path().join("replica");
    let again = restore_into(&env, to, &replica_dir, &[]);
    assert_eq!(again["gtidPosition"], position_then.as_str(), "{again}");
    let replica = MariaDb::start_on(&replica_dir, 2);
    assert_eq!(replica.sql("SELECT @@gtid_slave_pos"), position_then);
    replica.resume_replication_from(&env.db);
    assert_eq!(replica.sql("SELECT COUNT(*) FROM shop.orders"), "24");
    let pass = env.archive_from(&env.db);
    let timeline = &pass["newTimeline"];
    assert_eq!(timeline["parent"], 0, "{pass}");
    assert_eq!(timeline["switch"]["gtid"], position_then.as_str(), "{pass}");
    assert!(timeline["switch"].get("unrelated").is_none(), "{pass}");
    assert!(timeline["switch"].get("missing").is_none(), "{pass}");

    assert_eq!(env.restored_rows(after, "after-the-restore"), "22");
    assert_eq!(
        env.restored_rows_with(in_future, "abandoned-future", &["--timeline", "0"]),
        "19"
    );
    assert_eq!(env.restored_rows(in_future, "main-line-then"), "15");
    let unknown = env.tidemark(&[
        "restore",
        "--to",
        &after.to_string(),
        "--timeline",
        "7",
        "--dry-run",
    ]);
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
    let said = String::from_utf8_lossy(&unknown.stderr);
    assert!(said.contains("no timeline 7; it has 0, 1"), "{said}");

    // Into the abandoned future, in place once more, and written on.
    drop(replica);
    let future_dir = place.path().join("future");
    let done = restore_into(&env, in_future, &future_dir, &["--timeline", "0"]);
    let future_position = done["gtidPosition"].as_str().unwrap().to_owned();
    assert_ne!(future_position, position_then, "{done}");
    env.db.kill();
    env.db = MariaDb::start_on(&future_dir, 1);
    assert_eq!(env.db.sql("SELECT COUNT(*) FROM shop.orders"), "19");
    assert_eq!(env.db.sql("SELECT @@gtid_binlog_pos"), future_position);
    env.insert(1);
    let pass = env.archive_from(&env.db);
    let timeline = &pass["newTimeline"];
    assert_eq!(timeline["parent"], 1, "{pass}");
    assert_eq!(timeline["switch"]["unrelated"], true, "{pass}");
}

/// A `LOAD DATA` logged as a statement: `mariadb-binlog` writes its data into the restore's
/// own scratch directory (`--local-load`), never into the system's temporary directory —
/// as root, at a name the binlog sets (`SQL_LOAD_MB-…`), through any link a local user left
/// there — and the client refuses to send it: the restore fails, naming the refusal.
#[test]
fn a_load_data_event_writes_nothing_outside_the_restores_scratch() {
    let env = Env {
        s3: SeaweedFs::start(),
        db: MariaDb::start(),
        compression: "none",
        bucket: None,
    };
    let db = &env.db;
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
    );
    env.insert(2);
    db.sql("FLUSH BINARY LOGS");
    env.backup(None);
    let rows = db.scratch().join("rows.csv");
    std::fs::write(&rows, "100,1\n101,2\n").unwrap();
    std::fs::set_permissions(&rows, std::fs::Permissions::from_mode(0o644)).unwrap();
    let loads = || -> Vec<String> {
        std::fs::read_dir("/tmp")
            .unwrap()
            .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
            .filter(|n| n.starts_with("SQL_LOAD"))
            .collect()
    };
    let before = loads();
    db.sql(&format!(
        "SET SESSION binlog_format = STATEMENT; LOAD DATA INFILE '{}' INTO TABLE shop.orders FIELDS TERMINATED BY ','",
        rows.display()
    ));
    let after = pause_and_mark();
    env.insert(1);
    env.archive();
    let dir = db.scratch().join("restored");
    let out = env.tidemark(&[
        "restore",
        "--to",
        &after.to_string(),
        "--datadir",
        dir.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "restored: {said}");
    assert!(
        said.contains("LOAD DATA") || said.contains("local"),
        "{said}"
    );
    assert_eq!(loads(), before, "the decoder wrote into /tmp");
    assert!(!dir.exists(), "no half-restored directory");
}

/// The issue 49 tests' start: a server in ROW format with `shop.orders` (5 rows) and a full
/// backup of it after a binlog rotation.
fn row_format_env() -> Env {
    let env = Env {
        s3: SeaweedFs::start(),
        db: MariaDb::start_with_options(&["--binlog-format=ROW"]),
        compression: "none",
        bucket: None,
    };
    env.db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
    );
    env.insert(5);
    env.db.sql("FLUSH BINARY LOGS");
    env.backup(None);
    env
}

/// 120 row transactions (one insert each, `v` from `v0`): a stretch long enough for the
/// applier (shorter ones go the client's way: `applier::MIN_APPLIER_PIECE`).
fn stretch(v0: &str) -> String {
    (0..120)
        .map(|i| format!("INSERT INTO shop.orders (v) VALUES ({v0} + {i});"))
        .collect()
}

/// Issue 49 (preview): `restore --replay applier` gives the row transactions of a ROW-format
/// binlog to the private server's replication applier and the rest to `mariadb-binlog |
/// mariadb`, in order — a DDL, a statement-logged change and a MyISAM table between row
/// transactions — and restores exactly what `--replay client` restores, and what the
/// server held at the instant.
#[test]
fn the_applier_restores_what_the_client_restores() {
    let env = row_format_env();
    env.insert(3);
    env.db.sql(&stretch("1000"));
    env.db.sql("BEGIN; UPDATE shop.orders SET v = v + 10 WHERE id <= 2; DELETE FROM shop.orders WHERE id = 3; COMMIT");
    env.db
        .sql("ALTER TABLE shop.orders ADD COLUMN w INT NOT NULL DEFAULT 7");
    env.insert(2);
    env.db.sql(&stretch("2000"));
    env.db.sql("SET SESSION binlog_format = STATEMENT; INSERT INTO shop.orders (v, w) VALUES (100, 1), (101, 2)");
    env.db.sql("CREATE TABLE shop.m (a INT PRIMARY KEY, b TEXT) ENGINE=MyISAM; INSERT INTO shop.m VALUES (1, 'one'), (2, 'two')");
    env.db.sql("FLUSH BINARY LOGS");
    env.db.sql(
        "UPDATE shop.m SET b = 'deux' WHERE a = 2; UPDATE shop.orders SET w = w * 3 WHERE id > 4",
    );
    let at = pause_and_mark();
    let last = env.db.sql("SELECT MAX(id) FROM shop.orders");
    env.insert(4); // after the instant: restored by neither
    let summary = "SELECT (SELECT CONCAT(COUNT(*), ':', SUM(id), ':', SUM(v), ':', SUM(w)) FROM shop.orders), \
                   (SELECT GROUP_CONCAT(a, b ORDER BY a) FROM shop.m)";
    env.archive();
    let to = at.to_string();
    let mut restored = Vec::new();
    for how in ["client", "applier"] {
        let dir = env.db.scratch().join(format!("restored-{how}"));
        let mut c = env.command(
            &[
                "restore",
                "--to",
                &to,
                "--datadir",
                dir.to_str().unwrap(),
                "--replay",
                how,
            ],
            &std::env::temp_dir(),
        );
        c.env("TIDEMARK_LOG", "warn,tidemark_mariadb=info");
        let out = c.output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "restore --replay {how}:\n{said}");
        if how == "applier" {
            // Most of it went through the applier, the rest through the client.
            let line = said
                .lines()
                .find(|l| l.contains("through the applier, in"))
                .unwrap_or_else(|| panic!("no replay line:\n{said}"));
            assert!(!line.contains(", 0 through the applier"), "{line}");
            assert!(!line.contains("in 1 part(s)"), "{line}");
        }
        restored.push(query_restored(&dir, summary));
    }
    assert_eq!(restored[0], restored[1], "client, then applier");
    // What the server held then: the rows inserted after the instant taken out.
    let live = env.db.sql(&format!(
        "SELECT (SELECT CONCAT(COUNT(*), ':', SUM(id), ':', SUM(v), ':', SUM(w)) FROM shop.orders WHERE id <= {}), \
         (SELECT GROUP_CONCAT(a, b ORDER BY a) FROM shop.m)",
        last.trim()
    ));
    assert_eq!(restored[1].trim(), live.trim());
}

/// Issue 49: the replication applier applies rows with every right and checks none. A row
/// transaction on the server's own tables — an account written straight into
/// `mysql.global_priv`, as whoever writes the bucket could plant one in a segment (here the
/// source's root writes it, in ROW format) — never reaches it, and is refused the client's
/// way too (the replay account may only read `mysql`): with `--replay applier` as with
/// `--replay client` the restore fails naming what was refused, and leaves no directory,
/// so no restored server holds the account.
#[test]
fn a_forged_row_event_on_the_accounts_never_reaches_the_applier() {
    let env = row_format_env();
    // Row transactions before and after it, enough for the applier.
    env.db.sql(&stretch("1000"));
    env.db.sql(
        "INSERT INTO mysql.global_priv VALUES ('%', 'planted', \
         '{\"access\": 1073741823, \"plugin\": \"mysql_native_password\", \
         \"authentication_string\": \"\"}')",
    );
    env.db.sql(&stretch("2000"));
    let at = pause_and_mark();
    env.archive();
    // The segment holds the account's row as row events (not a statement the replay
    // account's rights would refuse anyway).
    let binlogs = env.db.sql("SHOW BINARY LOGS");
    let dir = env.db.binlog_index().parent().unwrap().to_path_buf();
    let decoded = binlogs
        .lines()
        .map(|l| {
            let out = Command::new("mariadb-binlog")
                .arg(dir.join(l.split('\t').next().unwrap()))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect::<String>();
    assert!(
        decoded.contains("Table_map: `mysql`.`global_priv`"),
        "no row event on mysql.global_priv in the binlogs"
    );
    for how in ["applier", "client"] {
        let restored = env.db.scratch().join(format!("restored-{how}"));
        let out = env.tidemark(&[
            "restore",
            "--to",
            &at.to_string(),
            "--datadir",
            restored.to_str().unwrap(),
            "--replay",
            how,
        ]);
        let said = String::from_utf8_lossy(&out.stderr);
        let planted = if restored.exists() {
            query_restored(
                &restored,
                "SELECT COUNT(*) FROM mysql.global_priv WHERE User = 'planted'",
            )
        } else {
            "no directory".into()
        };
        assert!(
            !out.status.success(),
            "--replay {how}: the restore succeeded (planted accounts: {planted}):\n{said}"
        );
        assert_eq!(out.status.code(), Some(7), "--replay {how}: {said}");
        assert!(said.contains("mysql.global_priv"), "--replay {how}: {said}");
        assert!(!restored.exists(), "--replay {how}: a directory is left");
    }
}

/// An incremental of another data directory than its parent's is refused before it runs
/// (issue 48: the chaos soak's old primary, rebuilt from nothing on its volume, took an
/// increment of the old one's full that no restore could prepare). Another server whose
/// LSN is past the parent's passes the LSN check, and is refused by its `ibdata1`; the
/// attempt is recorded failed, saying why (which the schedule reads as a divergence: its
/// next backup is a full). Each backup records the data directory it was taken of.
#[test]
fn an_incremental_of_another_data_directory_is_refused() {
    let env = orders_env();
    insert_into(&env.db, 5);
    let push = |db: &MariaDb, parent: Option<&str>| -> Output {
        let datadir = format!("--datadir={}", db.datadir.display());
        let client = db.client_args();
        let mut args = vec![
            "push",
            "--backup-name",
            "nightly",
            "--method",
            "mariabackup",
        ];
        if let Some(p) = parent {
            args.extend(["--type", "incremental", "--parent", p]);
        }
        args.extend(["--output", "json", "--", "mariabackup"]);
        args.extend(client.iter().map(String::as_str));
        args.push(&datadir);
        env.tidemark(&args)
    };
    let id_of = |out: &Output| -> String {
        assert!(
            out.status.success(),
            "push failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["backupId"].as_str().unwrap().to_owned()
    };
    let store = env.s3.cluster_store("e2e");
    let metadata = |id: &str| -> Value {
        serde_json::from_slice(&get_object(&store, &format!("nightly/{id}/metadata.json"))).unwrap()
    };
    let full = id_of(&push(&env.db, None));
    let recorded = metadata(&full)["mariabackup"]["dataDirectory"].clone();
    assert!(
        recorded
            .as_str()
            .is_some_and(|d| d.starts_with("ibdata1 made ")),
        "{}",
        metadata(&full)
    );
    // The same server: its incremental, as ever.
    insert_into(&env.db, 3);
    let inc = id_of(&push(&env.db, Some(&full)));
    assert_eq!(metadata(&inc)["mariabackup"]["dataDirectory"], recorded);
    // Another data directory, written until its LSN is past the parent's.
    let parent_lsn = metadata(&inc)["mariabackup"]["toLsn"].as_u64().unwrap();
    let other = MariaDb::start();
    other.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
    );
    let lsn = || -> u64 {
        other
            .sql("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_LSN_CURRENT'")
            .trim()
            .parse()
            .unwrap()
    };
    while lsn() <= parent_lsn {
        insert_into(&other, 200);
    }
    let refused = push(&other, Some(&inc));
    assert_eq!(
        refused.status.code(),
        Some(6),
        "an increment of another data directory was taken, or failed otherwise: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("is not the one the parent was taken of")
            && stderr.contains("take a full backup"),
        "{stderr}"
    );
    let ls = env.json(&["ls"]);
    let failed: Vec<&Value> = ls["backups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["phase"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "{ls:#}");
    let why = metadata(failed[0]["backupId"].as_str().unwrap())["error"].clone();
    assert!(
        why.as_str()
            .is_some_and(|e| e.contains("is not the one the parent was taken of")),
        "{why}"
    );
}
