//! Planner scaling: time and peak memory of `plan` for growing histories.
//!
//!     cargo bench -p tidemark-core --bench planner
//!
//! Each size runs in its own process (this binary re-executed), so the peak resident set
//! (`VmHWM`) is that size's alone. History: hourly backups, a full every 24th and
//! incrementals between, 1 in 50 failed; ten binlog segments per backup. Policy: window 30d,
//! keepDaily 7, keepWeekly 4, keepMonthly 12, failedBackupsTTL 7d.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use jiff::{SignedDuration, Timestamp};
use tidemark_core::{Backup, BackupKind, Inventory, Phase, PolicyInput, Segment, plan};

const SIZES: [usize; 4] = [1_000, 10_000, 100_000, 200_000];
const SEGMENTS_PER_BACKUP: usize = 10;

fn history(n: usize) -> (Inventory, Timestamp) {
    let start: Timestamp = "2010-01-01T00:00:00Z".parse().unwrap();
    let mut backups = Vec::with_capacity(n);
    let mut last_good: Option<String> = None;
    for i in 0..n {
        let started_at = start + SignedDuration::from_hours(i as i64);
        let id = format!("{}-{:08x}", started_at.strftime("%Y%m%dT%H%M%SZ"), i);
        let failed = i % 50 == 49;
        let kind = match (&last_good, i % 24) {
            (Some(p), k) if k != 0 => BackupKind::Incremental(p.clone()),
            _ => BackupKind::Full,
        };
        backups.push(Backup {
            kind,
            phase: if failed {
                Phase::Failed
            } else {
                Phase::Completed
            },
            ..Backup::completed_full(
                id.clone(),
                "nightly",
                started_at,
                started_at + SignedDuration::from_mins(10),
                1 << 30,
            )
        });
        if !failed {
            last_good = Some(id);
        }
    }
    let m = n * SEGMENTS_PER_BACKUP;
    let every = SignedDuration::from_secs(3600 / SEGMENTS_PER_BACKUP as i64);
    let segments = (0..m)
        .map(|k| {
            let first = start + every * (k as i32);
            Segment::new(
                format!("mysql-bin.{:07}", k + 1),
                k as u64 + 1,
                Some(first),
                Some(first + every),
                1 << 20,
            )
        })
        .collect();
    let now = start + SignedDuration::from_hours(n as i64);
    (
        Inventory {
            backups,
            segments,
            ..Default::default()
        },
        now,
    )
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn one(n: usize) {
    let (inv, now) = history(n);
    let base = peak_rss_kib();
    let policy = PolicyInput {
        window: Some("30d".into()),
        keep_daily: Some(7),
        keep_weekly: Some(4),
        keep_monthly: Some(12),
        failed_backups_ttl: Some("7d".into()),
        ..Default::default()
    }
    .validate()
    .unwrap();
    // Best of three: the machine is shared.
    let mut best = f64::MAX;
    let mut result = None;
    for _ in 0..3 {
        let t = Instant::now();
        let p = plan(&policy, &inv, now);
        best = best.min(t.elapsed().as_secs_f64());
        result = Some(p);
    }
    let p = result.unwrap();
    let peak = peak_rss_kib();
    let deleted = p.deletions().count();
    let segs = p.segments.delete.len();
    let items = (n + n * SEGMENTS_PER_BACKUP) as f64;
    println!(
        "{n:>8} backups {:>9} segments  plan {:>8.1} ms  {:>6.1} ns/(item·log2 item)  peak RSS {:>6} MiB (inventory alone {:>6} MiB)  deletes {deleted} backups, {segs} segments",
        n * SEGMENTS_PER_BACKUP,
        best * 1e3,
        best * 1e9 / (items * items.log2()),
        peak / 1024,
        base / 1024,
    );
}

fn main() {
    if let Ok(n) = std::env::var("TIDEMARK_BENCH_SIZE") {
        one(n.parse().unwrap());
        return;
    }
    // `cargo bench` passes --bench; a filter argument limits sizes.
    let filter: Option<usize> = std::env::args().skip(1).find_map(|a| a.parse().ok());
    let exe = std::env::current_exe().unwrap();
    for n in SIZES.into_iter().filter(|n| filter.is_none_or(|f| f == *n)) {
        let status = std::process::Command::new(&exe)
            .env("TIDEMARK_BENCH_SIZE", n.to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }
}
