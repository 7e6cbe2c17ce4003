//! Helpers shared by the benchmarks: sizes from the environment, and the peer tools that
//! `bench/install-peers.sh` puts in `.bench-tools/`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A size from the environment, or the default.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.bench-tools")
}

/// A peer tool: from `.bench-tools/bin`, `.bench-tools/venv/bin`, or `PATH`.
pub fn tool(name: &str) -> Option<PathBuf> {
    let t = tools_dir();
    [t.join("bin").join(name), t.join("venv/bin").join(name)]
        .into_iter()
        .chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|d| d.join(name)),
        )
        .find(|p| p.is_file())
}

/// Fills the server with about `mib` MiB of rows: words from a small vocabulary with
/// numbers and dates, as an orders table holds.
pub fn fill(db: &tidemark_store::testkit::MariaDb, mib: usize) {
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         customer VARCHAR(64), item VARCHAR(64), note VARCHAR(400), qty INT, price DECIMAL(10,2), \
         at DATETIME) ENGINE=InnoDB",
    );
    // One seed batch of 10,000 rows, then doubling by INSERT … SELECT with new values.
    let words = [
        "blue", "green", "crate", "bolt", "valve", "north", "order", "return", "express",
        "standard", "paid", "pending", "shipped", "fragile", "bulk", "retail",
    ];
    let mut rows = Vec::new();
    for i in 0..10_000u64 {
        let w = |k: u64| words[((i * 7 + k * 13) % words.len() as u64) as usize];
        rows.push(format!(
            "('customer-{}','{}-{}-{}','{} {} {} {} order {} for {}',{},{}.{:02},'2026-{:02}-{:02} {:02}:{:02}:00')",
            i % 997,
            w(1),
            w(2),
            i % 53,
            w(3),
            w(4),
            w(5),
            w(6),
            i,
            w(7),
            i % 9 + 1,
            i % 500,
            i % 100,
            i % 12 + 1,
            i % 28 + 1,
            i % 24,
            i % 60
        ));
    }
    // In batches: one client argument must stay under the kernel's limit.
    for batch in rows.chunks(400) {
        db.sql(&format!(
            "INSERT INTO shop.orders (customer,item,note,qty,price,at) VALUES {}",
            batch.join(",")
        ));
    }
    loop {
        let size: f64 = db
            .sql("SELECT (data_length+index_length)/1048576 FROM information_schema.tables WHERE table_schema='shop' AND table_name='orders'")
            .trim()
            .parse()
            .unwrap_or(0.0);
        if size >= mib as f64 {
            break;
        }
        db.sql(
            "INSERT INTO shop.orders (customer,item,note,qty,price,at) \
             SELECT CONCAT('customer-', FLOOR(RAND()*5000)), item, \
             CONCAT(note, ' ', FLOOR(RAND()*100000)), qty, price*1.1, at + INTERVAL FLOOR(RAND()*900) DAY \
             FROM shop.orders",
        );
    }
}

/// Peak resident memory (VmHWM) of `pid`, in KiB.
pub fn peak_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
