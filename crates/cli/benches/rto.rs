//! Recovery time (issue 19 §4): `tidemark restore` of a full, an incremental and the
//! binlogs written after it, pipelined as it runs — each payload streamed from the store
//! into `mbstream -x`, the base prepared while the increments and the binlogs download —
//! against the sum of its unavoidable steps measured alone on the same data: downloading
//! the payloads and binlogs, extracting them, preparing the chain, replaying the binlogs.
//!
//! The data: a MariaDB server (the Debian packages the tests use) filled with
//! `TIDEMARK_BENCH_RTO_MIB` (default 2048) MiB of rows, a full backup, a tenth of the rows
//! changed and an incremental, then as many changes again in the binlogs only — or, with
//! `TIDEMARK_BENCH_RTO_OLTP=N`, N small transactions of the OLTP load of the replay bench
//! (issue 49) in ROW format instead. The restore replays with `--replay applier`, the
//! default (`TIDEMARK_BENCH_RTO_REPLAY_THREADS`, default 0), or with
//! `TIDEMARK_BENCH_RTO_REPLAY=client` through `mariadb-binlog | mariadb`. The store is a
//! local SeaweedFS. `TIDEMARK_BENCH_ROUNDS` sets the runs (default 3; the median is
//! shown). `cargo bench -p tidemark --bench rto` (after `bench/install-peers.sh`, for
//! `aws`, which downloads the binlogs alone).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{env_usize, median, replay_alone, sh, timed};
use tidemark_store::testkit::{BUCKET, MariaDb, SeaweedFs};

/// `tidemark SUB …` on the bench's cluster; must succeed.
fn run(server: &SeaweedFs, sub: &str, args: &[&str]) -> Vec<u8> {
    common::tidemark(server, "rto", sub, args)
}

/// The settings the replay alone runs with: none (as a user would script it), or, with
/// `TIDEMARK_BENCH_RTO_TUNED=1`, the restore's own replay server's, to compare overlap
/// alone.
fn tuned() -> bool {
    std::env::var("TIDEMARK_BENCH_RTO_TUNED").is_ok_and(|v| v == "1")
}

fn main() {
    let mib = env_usize("TIDEMARK_BENCH_RTO_MIB", 2048);
    let rounds = env_usize("TIDEMARK_BENCH_ROUNDS", 3);
    let aws = common::tool("aws").expect("aws is missing: run bench/install-peers.sh first");
    let oltp = env_usize("TIDEMARK_BENCH_RTO_OLTP", 0);
    let how = std::env::var("TIDEMARK_BENCH_RTO_REPLAY").unwrap_or_else(|_| "applier".into());
    let threads = env_usize("TIDEMARK_BENCH_RTO_REPLAY_THREADS", 0).to_string();
    let db = if oltp > 0 {
        MariaDb::start_with_options(&["--binlog-format=ROW"])
    } else {
        MariaDb::start()
    };
    let t = Instant::now();
    common::fill(&db, mib);
    if oltp > 0 {
        common::oltp_prepare(&db);
    }
    eprintln!("filled {mib} MiB in {:.0?}", t.elapsed());
    let server = SeaweedFs::start();
    let push = |parent: Option<&str>| -> serde_json::Value {
        let mut args = vec![
            "--backup-name",
            "rto",
            "--method",
            "mariabackup",
            "--output",
            "json",
        ];
        if let Some(p) = parent {
            args.extend(["--type", "incremental", "--parent", p]);
        }
        args.push("--");
        args.push("mariabackup");
        let client = db.client_args();
        args.extend(client.iter().map(String::as_str));
        serde_json::from_slice(&run(&server, "push", &args)).unwrap()
    };
    db.sql("FLUSH BINARY LOGS");
    let full = push(None);
    let change =
        "UPDATE shop.orders SET qty = qty + 1, note = CONCAT(note, ' x') WHERE id % 10 = 0";
    db.sql(change);
    let inc = push(full["backupId"].as_str());
    if oltp > 0 {
        let t = Instant::now();
        let written = common::oltp_load(&db, oltp);
        eprintln!(
            "the OLTP load: {written} transactions in {:.0?}",
            t.elapsed()
        );
    } else {
        db.sql(change);
    }
    // The target: after the changes, before one last write (binlog times are seconds).
    std::thread::sleep(Duration::from_millis(1500));
    let target = jiff::Timestamp::now();
    std::thread::sleep(Duration::from_millis(1500));
    db.sql("UPDATE shop.orders SET qty = qty + 1 WHERE id = 1");
    db.sql("FLUSH BINARY LOGS");
    run(
        &server,
        "archive-binlogs",
        &[
            "--once",
            "--binlog-index",
            db.binlog_index().to_str().unwrap(),
        ],
    );
    let plan: serde_json::Value = serde_json::from_slice(&run(
        &server,
        "restore",
        &["--to", &target.to_string(), "--dry-run", "--output", "json"],
    ))
    .unwrap();
    let segments: Vec<String> = plan["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    let (position, stop) = common::plan_start_stop(&plan);
    let sizes: u64 = [&full, &inc]
        .iter()
        .map(|b| b["size"].as_u64().unwrap())
        .sum::<u64>()
        + plan["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["size"].as_u64().unwrap())
            .sum::<u64>();
    eprintln!(
        "chain: full {} MiB, incremental {} MiB, {} binlog(s); {} MiB in all; target {target}",
        full["size"].as_u64().unwrap() >> 20,
        inc["size"].as_u64().unwrap() >> 20,
        segments.len(),
        sizes >> 20
    );
    let scratch = tempfile::tempdir().unwrap();
    let (mut pipelined, mut download, mut extract, mut prepare, mut replayed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let dir = scratch.path().join(format!("r{round}"));
        std::fs::create_dir_all(&dir).unwrap();
        // The restore as it runs (first on even rounds, last on odd: neither always gets
        // the warmer page cache).
        let restored = dir.join("restored");
        let report = dir.join("report.json");
        let restore = || {
            let t = timed(|| {
                let to = target.to_string();
                run(
                    &server,
                    "restore",
                    &[
                        "--to",
                        &to,
                        "--datadir",
                        restored.to_str().unwrap(),
                        "--report-file",
                        report.to_str().unwrap(),
                        "--replay",
                        &how,
                        "--replay-threads",
                        &threads,
                    ],
                );
            });
            // Where the restore's time went, step by step (its own report).
            let steps: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
            for step in steps["steps"].as_array().into_iter().flatten() {
                eprintln!(
                    "round {round} restore step {:>8} ms  {}",
                    step["milliseconds"],
                    step["name"].as_str().unwrap_or("")
                );
            }
            std::fs::remove_dir_all(&restored).unwrap();
            t
        };
        if round % 2 == 0 {
            pipelined.push(restore());
        }
        // The steps alone: download (the payloads with their checksums, the binlogs in one
        // process: a start-up each would inflate the step)…
        let files = dir.join("files");
        std::fs::create_dir_all(files.join("binlogs")).unwrap();
        download.push(timed(|| {
            for (b, f) in [(&full, "full.xb"), (&inc, "inc.xb")] {
                let out = files.join(f);
                let id = b["backupId"].as_str().unwrap();
                run(&server, "fetch", &["--backup-id", id, "--out", out.to_str().unwrap()]);
            }
            let includes: Vec<String> = segments.iter().map(|s| format!("--include {s}")).collect();
            sh(&format!(
                "{} --endpoint-url {} s3 cp --quiet --recursive --exclude '*' {} s3://{BUCKET}/rto/binlogs/ {}",
                aws.display(),
                server.endpoint,
                includes.join(" "),
                files.join("binlogs").display()
            ));
        }));
        // …extract…
        let base = dir.join("base");
        let incdir = dir.join("inc");
        extract.push(timed(|| {
            for (f, d) in [("full.xb", &base), ("inc.xb", &incdir)] {
                std::fs::create_dir_all(d).unwrap();
                sh(&format!(
                    "mbstream -x -C {} < {}",
                    d.display(),
                    files.join(f).display()
                ));
            }
        }));
        // …prepare…
        prepare.push(timed(|| {
            sh(&format!(
                "mariabackup --prepare --target-dir={} >/dev/null 2>&1",
                base.display()
            ));
            sh(&format!(
                "mariabackup --prepare --target-dir={} --incremental-dir={} >/dev/null 2>&1",
                base.display(),
                incdir.display()
            ));
        }));
        // …replay.
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let binlogs: Vec<_> = segments
            .iter()
            .map(|s| files.join("binlogs").join(s))
            .collect();
        replayed.push(timed(|| {
            replay_alone(&base, &work, &binlogs, &position, &stop, tuned());
        }));
        std::fs::remove_dir_all(&base).unwrap();
        std::fs::remove_dir_all(&files).unwrap();
        if round % 2 == 1 {
            pipelined.push(restore());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
    let (p, d, e, r, y) = (
        median(pipelined),
        median(download),
        median(extract),
        median(prepare),
        median(replayed),
    );
    let sum = d + e + r + y;
    if tuned() {
        println!(
            "(the replay alone with the restore's server settings: TIDEMARK_BENCH_RTO_TUNED=1)"
        );
    }
    if oltp > 0 {
        println!("(the binlogs: {oltp} transactions of the OLTP load: TIDEMARK_BENCH_RTO_OLTP)");
    }
    println!("(the restore: `tidemark restore --replay {how} --replay-threads {threads}`)");
    println!("| step | seconds |");
    println!("|---|---:|");
    println!(
        "| download alone (`tidemark fetch` ×2, one `aws s3 cp` of the binlogs) | {:.1} |",
        d.as_secs_f64()
    );
    println!(
        "| extract alone (`mbstream -x` ×2) | {:.1} |",
        e.as_secs_f64()
    );
    println!(
        "| prepare alone (`mariabackup --prepare`, base and increment) | {:.1} |",
        r.as_secs_f64()
    );
    println!(
        "| replay alone (`mariadb-binlog \\| mariadb` on a private server) | {:.1} |",
        y.as_secs_f64()
    );
    println!("| **sum of the steps** | **{:.1}** |", sum.as_secs_f64());
    println!(
        "| **`tidemark restore --to`** (pipelined) | **{:.1}** ({:.2}× the sum) |",
        p.as_secs_f64(),
        p.as_secs_f64() / sum.as_secs_f64()
    );
}
