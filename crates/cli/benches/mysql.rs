//! MySQL backups and restores (issue 47): `tidemark push --method mysql-clone` and its
//! `tidemark restore`, and `--method mysqldump` and its restore, against the way a script
//! does it — `mysqldump --single-transaction | zstd | aws s3 cp -`, and `aws s3 cp - | zstd
//! -d | mysql` into a new server — on the same database, in one run.
//!
//! The data: a MySQL 9.7 server (the root file system `scripts/mysql-root.sh` builds)
//! filled with `TIDEMARK_BENCH_MYSQL_MIB` (default 2048) MiB of rows; the store is a local
//! SeaweedFS, and every stream is compressed with zstd (level 3). `cargo bench -p tidemark
//! --bench mysql` (after `bench/install-peers.sh`, for `aws`; `TIDEMARK_WEED` and
//! `TIDEMARK_MYSQL_ROOT` as `scripts/test.sh` sets them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::env_usize;
use tidemark_store::testkit::mysql::{self, MySql};
use tidemark_store::testkit::{ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedFs};

/// The store's environment, and MySQL's programs first in `PATH`.
fn env(c: &mut Command) -> &mut Command {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![mysql::bin()];
    dirs.extend(std::env::split_paths(&path));
    c.env("PATH", std::env::join_paths(dirs).unwrap())
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("TIDEMARK_SERVER_USER", tidemark_store::testkit::SERVER_USER)
        .env("TIDEMARK_COMPRESSION", "zstd")
        .env_remove("TIDEMARK_RECIPIENTS")
}

/// `tidemark SUB …` (the store flags after the subcommand); must succeed.
fn tidemark(server: &SeaweedFs, sub: &str, args: &[&str]) -> Vec<u8> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tidemark"));
    env(&mut c)
        .arg(sub)
        .args(["--store", &format!("s3://{BUCKET}"), "--cluster", "mysql"])
        .args(["--endpoint", &server.endpoint])
        .args(args)
        .stderr(Stdio::inherit());
    let out = c.output().unwrap();
    assert!(out.status.success(), "tidemark {sub} {args:?} failed");
    out.stdout
}

fn sh(script: &str) {
    let mut c = Command::new("bash");
    let ok = env(&mut c)
        .args(["-c", &format!("set -euo pipefail; {script}")])
        .status()
        .unwrap()
        .success();
    assert!(ok, "{script}");
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    let took = t.elapsed();
    // As it goes: a later step's failure keeps the earlier figures.
    eprintln!("step: {:.1} s", took.as_secs_f64());
    took
}

/// Fills `db` with about `mib` MiB of rows (an orders table: words, numbers, dates).
fn fill(db: &MySql, mib: usize) {
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         customer VARCHAR(64), item VARCHAR(64), note VARCHAR(400), qty INT, price DECIMAL(10,2), \
         at DATETIME) ENGINE=InnoDB",
    );
    db.sql(
        "USE shop; SET SESSION cte_max_recursion_depth = 20000; \
         INSERT INTO shop.orders (customer, item, note, qty, price, at) \
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10000) \
         SELECT CONCAT('customer-', i % 997), ELT(1 + i % 8, 'blue-crate', 'green-bolt', 'valve', 'north', 'bulk', 'retail', 'express', 'standard'), \
         CONCAT(ELT(1 + i % 5, 'paid', 'pending', 'shipped', 'fragile', 'return'), ' order ', i, ' for ', LPAD(HEX(i * 2654435761), 16, '0')), \
         i % 9 + 1, (i % 500) + 0.99, '2026-01-01' + INTERVAL (i % 300) DAY FROM n",
    );
    loop {
        let size: f64 = db
            .sql("SELECT (data_length + index_length) / 1048576 FROM information_schema.tables WHERE table_schema = 'shop' AND table_name = 'orders'")
            .parse()
            .unwrap_or(0.0);
        if size >= mib as f64 {
            break;
        }
        db.sql(
            "INSERT INTO shop.orders (customer, item, note, qty, price, at) \
             SELECT CONCAT('customer-', FLOOR(RAND() * 5000)), item, \
             CONCAT(note, ' ', FLOOR(RAND() * 100000)), qty, price * 1.1, at + INTERVAL FLOOR(RAND() * 900) DAY \
             FROM shop.orders; ANALYZE TABLE shop.orders",
        );
    }
}

/// A new directory in the MySQL root for a restored data directory.
fn place() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("bench-")
        .tempdir_in(mysql::root().join("srv"))
        .unwrap();
    let datadir = dir.path().join("data");
    (dir, datadir)
}

fn du_mib(dir: &Path) -> f64 {
    let out = Command::new("du").arg("-sb").arg(dir).output().unwrap();
    let bytes: f64 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("0")
        .parse()
        .unwrap_or(0.0);
    bytes / 1048576.0
}

fn main() {
    let mib = env_usize("TIDEMARK_BENCH_MYSQL_MIB", 2048);
    let aws = common::tool("aws").expect("aws (bench/install-peers.sh)");
    let aws = aws.display().to_string();
    let s3 = SeaweedFs::start();
    let db = MySql::start();
    db.sql("INSTALL PLUGIN clone SONAME 'mysql_clone.so'");
    let filled = timed(|| fill(&db, mib));
    db.sql(
        "CREATE USER 'tidemark'@'127.0.0.1' IDENTIFIED BY 'bench-secret'; \
         GRANT BACKUP_ADMIN, SELECT, SHOW VIEW, TRIGGER, EVENT, RELOAD, REPLICATION CLIENT ON *.* TO 'tidemark'@'127.0.0.1'",
    );
    let rows = db.sql("SELECT COUNT(*) FROM shop.orders");
    let data = du_mib(&db.path(&db.datadir));
    eprintln!(
        "filled {rows} rows ({data:.0} MiB data directory) in {:.0} s",
        filled.as_secs_f64()
    );
    let port = format!("--port={}", db.port);
    let conn = [
        "--host=127.0.0.1",
        port.as_str(),
        "--user=tidemark",
        "--password=bench-secret",
    ];
    let endpoint = s3.endpoint.clone();
    let mut table = Vec::new();

    // Tidemark: a clone, and its restore.
    let mut push = vec![
        "--backup-name",
        "clone",
        "--method",
        "mysql-clone",
        "-o",
        "json",
        "--",
        "mysql",
    ];
    push.extend(conn);
    let mut out = Vec::new();
    let clone_push = timed(|| out = tidemark(&s3, "push", &push));
    let m: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let clone_at = m["completedAt"].as_str().unwrap().to_owned();
    let clone_stored = m["size"].as_u64().unwrap_or(0) as f64 / 1048576.0;
    let (dir, datadir) = place();
    let clone_restore = timed(|| {
        tidemark(
            &s3,
            "restore",
            &["--to", &clone_at, "--datadir", datadir.to_str().unwrap()],
        );
    });
    drop(dir);
    table.push((
        "tidemark push --method mysql-clone",
        clone_push,
        clone_stored,
    ));
    table.push(("tidemark restore (the clone)", clone_restore, 0.0));

    // Tidemark: a dump, and its restore (a new data directory, loaded).
    let mut push = vec![
        "--backup-name",
        "dump",
        "--method",
        "mysqldump",
        "-o",
        "json",
        "--",
        "mysqldump",
    ];
    push.extend(conn);
    let dump_push = timed(|| out = tidemark(&s3, "push", &push));
    let m: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let dump_at = m["completedAt"].as_str().unwrap().to_owned();
    let dump_stored = m["size"].as_u64().unwrap_or(0) as f64 / 1048576.0;
    let (dir, datadir) = place();
    let dump_restore = timed(|| {
        // (The dump is the newest backup at its own instant, and no binlog follows it.)
        tidemark(
            &s3,
            "restore",
            &["--to", &dump_at, "--datadir", datadir.to_str().unwrap()],
        );
    });
    drop(dir);
    table.push(("tidemark push --method mysqldump", dump_push, dump_stored));
    table.push((
        "tidemark restore (the dump: initialize, load)",
        dump_restore,
        0.0,
    ));

    // The script: mysqldump | zstd | aws s3 cp -, and back into a new server.
    let login = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        login.path(),
        format!(
            "[client]\nhost=127.0.0.1\nport={}\nuser=tidemark\npassword=bench-secret\n",
            db.port
        ),
    )
    .unwrap();
    let key = format!("s3://{BUCKET}/peer/dump.sql.zst");
    let peer_push = timed(|| {
        sh(&format!(
            "mysqldump --defaults-file={} --single-transaction --set-gtid-purged=COMMENTED --source-data=2 \
             --routines --events --triggers --hex-blob --no-tablespaces --databases shop \
             | zstd -T0 -3 -q | {aws} s3 cp - {key} --endpoint-url {endpoint} --only-show-errors",
            login.path().display()
        ));
    });
    let peer_stored = {
        let out = Command::new(&aws)
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .args(["s3", "ls", &key, "--endpoint-url", &endpoint])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(2)
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1048576.0
    };
    eprintln!("the peer stored {peer_stored:.0} MiB");
    let target = MySql::start_with_id(9);
    let socket = target.path(&format!("{}/mysqld.sock", target.dir));
    let peer_restore = timed(|| {
        sh(&format!(
            "{aws} s3 cp {key} - --endpoint-url {endpoint} --only-show-errors | zstd -d -q \
             | mysql --user=root --socket={}",
            socket.display()
        ));
    });
    let restored = target.sql("SELECT COUNT(*) FROM shop.orders");
    assert_eq!(restored, rows, "the peer's restore holds every row");
    table.push(("mysqldump \\| zstd \\| aws s3 cp -", peer_push, peer_stored));
    table.push((
        "aws s3 cp - \\| zstd -d \\| mysql (into a running new server)",
        peer_restore,
        0.0,
    ));

    println!(
        "\nMySQL 9.7, {rows} rows, a {data:.0} MiB data directory (TIDEMARK_BENCH_MYSQL_MIB={mib})\n"
    );
    println!("| | seconds | stored MiB |");
    println!("|---|---:|---:|");
    for (name, took, stored) in table {
        let stored = if stored > 0.0 {
            format!("{stored:.0}")
        } else {
            String::new()
        };
        println!("| {name} | {:.1} | {stored} |", took.as_secs_f64());
    }
}
