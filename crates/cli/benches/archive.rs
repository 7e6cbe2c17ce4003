//! `tidemark archive-binlogs` of many small segments to a local SeaweedFS: segments per
//! second for the first pass, the cost of a re-run that finds nothing new, and what a
//! restore's planning costs on the archive (`restore --dry-run` to its end, 30 backups).
//! The segments carry MariaDB GTID events (a `Gtid_list`, three transactions each), so the
//! GTID bookkeeping (issue 27) is part of what is measured.
//!
//! `cargo bench -p tidemark --bench archive`; `TIDEMARK_BENCH_SEGMENTS` sets the count
//! (10,000); `TIDEMARK_BENCH_PEER_BIN=<another tidemark binary>` runs the same on it, to
//! its own cluster of the same server, in the same run (e.g. the build before GTIDs, to
//! measure what they cost).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use jiff::Timestamp;
use tidemark_core::gtid::Gtid;
use tidemark_mariadb::binlog::synthetic_gtid;
use tidemark_store::synth::{SynthBackup, write_backups};
use tidemark_store::testkit::SeaweedFs;

const T0: i64 = 1_763_600_000;
const BACKUPS: i64 = 30;

fn main() {
    let n: i64 = std::env::var("TIDEMARK_BENCH_SEGMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let peer = std::env::var("TIDEMARK_BENCH_PEER_BIN").ok();
    let server = SeaweedFs::start();
    let dir = tempfile::tempdir().unwrap();
    let mut index = String::new();
    for k in 1..=n + 1 {
        let name = format!("mysql-bin.{k:06}");
        let s = T0 + k * 60;
        let first = 3 * (k as u64 - 1);
        let start = [Gtid::new(0, 1, first)];
        let events: Vec<(i64, Option<Gtid>)> = [0, 30, 59]
            .iter()
            .enumerate()
            .map(|(i, dt)| (s + dt, Some(Gtid::new(0, 1, first + 1 + i as u64))))
            .collect();
        std::fs::write(
            dir.path().join(&name),
            synthetic_gtid(1, Some(&start), &events, 200),
        )
        .unwrap();
        index.push_str(&format!("./{name}\n"));
    }
    let index_path = dir.path().join("mysql-bin.index");
    std::fs::write(&index_path, index).unwrap();

    println!("\narchive-binlogs of {n} closed segments (GTID events) to SeaweedFS (127.0.0.1)");
    println!(
        "{:<28} {:>9} {:>12} {:>9} {:>14}",
        "binary", "first s", "segments/s", "re-run s", "restore plan s"
    );
    let ours = env!("CARGO_BIN_EXE_tidemark").to_owned();
    let mut rows = vec![("tidemark (this build)", ours, "bench")];
    if let Some(p) = peer {
        rows.push(("peer (TIDEMARK_BENCH_PEER_BIN)", p, "bench-peer"));
    }
    for (label, bin, cluster) in rows {
        let (first, rerun, plan) = measure(&server, &bin, cluster, &index_path, n);
        println!(
            "{label:<28} {first:>9.2} {:>12.0} {rerun:>9.2} {plan:>14.3}",
            n as f64 / first
        );
    }
}

/// Archives the segments with `bin` to `cluster`, runs it again, writes the backups and
/// times `restore --dry-run` (the median of five).
fn measure(server: &SeaweedFs, bin: &str, cluster: &str, index: &Path, n: i64) -> (f64, f64, f64) {
    let url = server.url();
    let run = |args: &[&str]| {
        let t = Instant::now();
        let out = Command::new(bin)
            .args([args[0], "--store", &url, "--cluster", cluster])
            .args(&args[1..])
            .args(["--output", "json"])
            .envs(server.env())
            .output()
            .unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert!(
            out.status.success(),
            "{bin} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (secs, v)
    };
    let archive = [
        "archive-binlogs",
        "--binlog-index",
        index.to_str().unwrap(),
        "--once",
    ];
    let (first, v) = run(&archive);
    assert_eq!(v["uploaded"].as_array().unwrap().len() as i64, n);
    let (rerun, v) = run(&archive);
    assert!(v["uploaded"].as_array().unwrap().is_empty());
    // Thirty mariabackup fulls across the archive, each recording its binlog file and
    // GTID position.
    let store = server.cluster_store(cluster);
    let backups: Vec<SynthBackup> = (0..BACKUPS)
        .map(|b| {
            let k = 1 + b * (n / BACKUPS);
            let mut full = SynthBackup::full(
                "nightly",
                Timestamp::from_second(T0 + k * 60 + 10).unwrap(),
                b as u32,
            );
            full.duration = jiff::SignedDuration::from_secs(5);
            full.method = "mariabackup".into();
            full.log_file = Some(format!("mysql-bin.{k:06}"));
            full.gtid = Some(format!("0-1-{}", 3 * (k - 1) + 1));
            full
        })
        .collect();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(write_backups(&store, &backups))
        .unwrap();
    let target = Timestamp::from_second(T0 + n * 60 + 30)
        .unwrap()
        .to_string();
    let mut plans: Vec<f64> = (0..5)
        .map(|_| {
            let (secs, v) = run(&["restore", "--to", &target, "--dry-run"]);
            assert!(!v["segments"].as_array().unwrap().is_empty(), "{v}");
            secs
        })
        .collect();
    plans.sort_by(f64::total_cmp);
    (first, rerun, plans[2])
}
