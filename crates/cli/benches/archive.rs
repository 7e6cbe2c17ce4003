//! `tidemark archive-binlogs` of many small segments to a local SeaweedFS: segments per
//! second for the first pass, and the cost of a re-run that finds nothing new.
//! `cargo bench -p tidemark --bench archive` (TIDEMARK_BENCH_SEGMENTS sets the count).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::Instant;

use tidemark_mariadb::binlog::synthetic;
use tidemark_store::testkit::SeaweedFs;

fn main() {
    let n: i64 = std::env::var("TIDEMARK_BENCH_SEGMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let server = SeaweedFs::start();
    let dir = tempfile::tempdir().unwrap();
    let t0 = 1_763_600_000i64;
    let mut index = String::new();
    for k in 1..=n + 1 {
        let name = format!("mysql-bin.{k:06}");
        let s = t0 + k * 60;
        std::fs::write(dir.path().join(&name), synthetic(&[s, s + 30, s + 59], 200)).unwrap();
        index.push_str(&format!("./{name}\n"));
    }
    let index_path = dir.path().join("mysql-bin.index");
    std::fs::write(&index_path, index).unwrap();
    let url = server.url();
    let run = || {
        let t = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args([
                "archive-binlogs",
                "--store",
                &url,
                "--cluster",
                "bench",
                "--binlog-index",
                index_path.to_str().unwrap(),
                "--once",
                "--output",
                "json",
            ])
            .envs(server.env())
            .output()
            .unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (secs, v["uploaded"].as_array().unwrap().len())
    };
    let (first, uploaded) = run();
    assert_eq!(uploaded as i64, n);
    let (rerun, again) = run();
    assert_eq!(again, 0);
    println!("\narchive-binlogs of {n} closed segments to SeaweedFS (127.0.0.1)");
    println!(
        "first pass  {first:>7.2} s  {:>8.0} segments/s",
        n as f64 / first
    );
    println!("re-run      {rerun:>7.2} s  (nothing new)");
}
