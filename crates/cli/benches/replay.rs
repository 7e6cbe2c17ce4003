//! Replay throughput (issue 49): how fast a point-in-time restore applies an OLTP binlog —
//! `TIDEMARK_BENCH_REPLAY_TXNS` (default 1,000,000) small transactions, a mix of inserts,
//! updates and deletes over four tables, some of one statement and some of three, written
//! by one session in ROW format — against the peers' way on the same files and the same
//! prepared backup, in one run.
//!
//! The rows:
//! - the peers' replay, `mariadb-binlog | mariadb` into a server started on the prepared
//!   backup as a user's script would: with the server's defaults, and with the restore's
//!   own replay settings (`REPLAY_SETTINGS`), to tell what settings give from what the
//!   applier path gives; timed from the server's start to its clean shutdown;
//! - `tidemark restore --replay client`, `--replay applier` (the SQL thread alone) and
//!   `--replay applier --replay-threads N` (`TIDEMARK_BENCH_REPLAY_THREADS`, default 4):
//!   the restore's replay steps, from the start of its private server to its shutdown (its
//!   report's `replaying …` steps), beside the whole restore.
//!
//! Transactions per second count the GTIDs the load wrote; MiB/s the binlog files' bytes.
//! `cargo bench -p tidemark --bench replay` (MariaDB's Debian packages, SeaweedFS: what
//! `scripts/test.sh` installs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{env_usize, replay_alone, sh, timed};
use tidemark_store::testkit::{MariaDb, SeaweedFs};

/// One row of the table.
struct Row {
    what: String,
    replay: Duration,
    whole: Option<Duration>,
}

fn main() {
    let txns = env_usize("TIDEMARK_BENCH_REPLAY_TXNS", 1_000_000);
    let threads = env_usize("TIDEMARK_BENCH_REPLAY_THREADS", 4);
    let db = MariaDb::start_with_options(&[
        "--binlog-format=ROW",
        "--sync-binlog=0",
        "--innodb-flush-log-at-trx-commit=2",
        "--max-binlog-size=1073741824",
    ]);
    common::oltp_prepare(&db);
    db.sql("FLUSH BINARY LOGS");
    let server = SeaweedFs::start();
    let run = |sub: &str, args: &[&str]| common::tidemark(&server, "replay", sub, args);
    let mut push = vec![
        "--backup-name",
        "replay",
        "--method",
        "mariabackup",
        "--output",
        "json",
        "--",
        "mariabackup",
    ];
    let client = db.client_args();
    push.extend(client.iter().map(String::as_str));
    let full: serde_json::Value = serde_json::from_slice(&run("push", &push)).unwrap();
    // The binlog files the replay reads: from the one the backup was taken in.
    let first_file = db.sql("SHOW MASTER STATUS");
    let first_file = first_file.split('\t').next().unwrap().to_owned();
    let t = Instant::now();
    let written = common::oltp_load(&db, txns);
    let load = t.elapsed();
    // The target: after the load, before one last write (binlog times are seconds).
    std::thread::sleep(Duration::from_millis(1500));
    let target = jiff::Timestamp::now();
    std::thread::sleep(Duration::from_millis(1500));
    db.sql("UPDATE oltp.stock SET qty = 0 WHERE item = 1");
    db.sql("FLUSH BINARY LOGS");
    run(
        "archive-binlogs",
        &[
            "--once",
            "--binlog-index",
            db.binlog_index().to_str().unwrap(),
        ],
    );
    let dir = db.binlog_index().parent().unwrap().to_path_buf();
    let files: Vec<PathBuf> = db
        .sql("SHOW BINARY LOGS")
        .lines()
        .map(|l| l.split('\t').next().unwrap().to_owned())
        .filter(|n| *n >= first_file)
        .map(|n| dir.join(n))
        .collect();
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    eprintln!(
        "wrote {written} transactions in {load:.0?} ({:.0}/s); {} binlog file(s), {} MiB; \
         full backup {} MiB; target {target}",
        written as f64 / load.as_secs_f64(),
        files.len(),
        bytes >> 20,
        full["size"].as_u64().unwrap() >> 20
    );
    let plan: serde_json::Value = serde_json::from_slice(&run(
        "restore",
        &["--to", &target.to_string(), "--dry-run", "--output", "json"],
    ))
    .unwrap();
    let (position, stop) = common::plan_start_stop(&plan);

    let scratch = tempfile::tempdir().unwrap();
    // The prepared backup the peers start from, once (a copy for each).
    let prepared = scratch.path().join("prepared");
    let payload = scratch.path().join("full.xb");
    run(
        "fetch",
        &[
            "--backup-id",
            full["backupId"].as_str().unwrap(),
            "--out",
            payload.to_str().unwrap(),
        ],
    );
    std::fs::create_dir(&prepared).unwrap();
    sh(&format!(
        "mbstream -x -C {p} < {f} && mariabackup --prepare --target-dir={p} >/dev/null 2>&1",
        p = prepared.display(),
        f = payload.display()
    ));
    let mut rows = Vec::new();
    for tuned in [false, true] {
        let base = scratch.path().join("base");
        let work = scratch.path().join("work");
        sh(&format!("cp -a {} {}", prepared.display(), base.display()));
        std::fs::create_dir(&work).unwrap();
        let replay = timed(|| replay_alone(&base, &work, &files, &position, &stop, tuned));
        rows.push(Row {
            what: if tuned {
                "`mariadb-binlog \\| mariadb`, the restore's server settings".into()
            } else {
                "`mariadb-binlog \\| mariadb`, the server's defaults (the peers)".into()
            },
            replay,
            whole: None,
        });
        std::fs::remove_dir_all(&base).unwrap();
        std::fs::remove_dir_all(&work).unwrap();
    }
    let threads = threads.to_string();
    for (what, how) in [
        ("`tidemark restore --replay client`", vec!["client"]),
        ("`tidemark restore --replay applier`", vec!["applier"]),
        (
            "`tidemark restore --replay applier --replay-threads N`",
            vec!["applier", "--replay-threads", &threads],
        ),
    ] {
        let restored = scratch.path().join("restored");
        let report = scratch.path().join("report.json");
        let mut args = vec![
            "--to",
            &target.to_string(),
            "--datadir",
            restored.to_str().unwrap(),
            "--report-file",
            report.to_str().unwrap(),
            "--replay",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
        args.extend(how.iter().map(|s| (*s).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let whole = timed(|| {
            run("restore", &args);
        });
        let steps: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        let replay: u64 = steps["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["name"].as_str().unwrap_or("").starts_with("replaying"))
            .map(|s| s["milliseconds"].as_u64().unwrap())
            .sum();
        rows.push(Row {
            what: what.replace('N', &threads),
            replay: Duration::from_millis(replay),
            whole: Some(whole),
        });
        std::fs::remove_dir_all(&restored).unwrap();
    }
    let peer = rows[0].replay.as_secs_f64();
    println!(
        "{written} transactions, {} MiB of binlog ({} file(s))",
        bytes >> 20,
        files.len()
    );
    println!("| replay | seconds | transactions/s | MiB/s | × the peers | whole restore (s) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        let s = r.replay.as_secs_f64();
        println!(
            "| {} | {s:.1} | {:.0} | {:.1} | {:.2} | {} |",
            r.what,
            written as f64 / s,
            (bytes as f64 / 1048576.0) / s,
            peer / s,
            r.whole
                .map_or_else(|| "–".to_owned(), |w| format!("{:.1}", w.as_secs_f64()))
        );
    }
}
