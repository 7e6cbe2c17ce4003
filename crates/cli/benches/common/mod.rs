//! Helpers shared by the benchmarks: sizes from the environment, and the peer tools that
//! `bench/install-peers.sh` puts in `.bench-tools/`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tidemark_store::testkit::{ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedFs};

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

/// `tidemark SUB --store s3://BUCKET --cluster CLUSTER …` against a local SeaweedFS (the
/// store flags after the subcommand); must succeed. Its stdout.
pub fn tidemark(server: &SeaweedFs, cluster: &str, sub: &str, args: &[&str]) -> Vec<u8> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tidemark"));
    c.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("TIDEMARK_SERVER_USER", tidemark_store::testkit::SERVER_USER)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env_remove("TIDEMARK_COMPRESSION")
        .env_remove("TIDEMARK_RECIPIENTS")
        .arg(sub)
        .args(["--store", &format!("s3://{BUCKET}"), "--cluster", cluster])
        .args(["--endpoint", &server.endpoint])
        .args(args)
        .stderr(Stdio::inherit());
    let out = c.output().unwrap();
    assert!(out.status.success(), "tidemark {sub} {args:?} failed");
    out.stdout
}

/// Runs a bash script (`set -euo pipefail`) with the local store's keys; must succeed.
pub fn sh(script: &str) {
    let ok = Command::new("bash")
        .args(["-c", &format!("set -euo pipefail; {script}")])
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .status()
        .unwrap()
        .success();
    assert!(ok, "{script}");
}

pub fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

pub fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

/// The peers' replay: starts a server on the prepared `datadir` as a user's script would
/// (no network, no binlog; with the restore's own replay settings when `tuned`), pipes
/// `mariadb-binlog` of `files` from `position` (a byte offset or a quoted GTID position)
/// up to `stop` into `mariadb`, and shuts the server down.
pub fn replay_alone(
    datadir: &Path,
    work: &Path,
    files: &[PathBuf],
    position: &str,
    stop: &str,
    tuned: bool,
) {
    let socket = work.join("r.sock");
    let cnf = datadir.join("backup-my.cnf");
    let mut server = Command::new("mariadbd");
    server
        .arg(format!("--defaults-file={}", cnf.display()))
        .arg(format!("--datadir={}", datadir.display()))
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--pid-file={}", work.join("r.pid").display()))
        .arg(format!("--tmpdir={}", work.display()))
        .arg(format!("--log-error={}", work.join("r.log").display()))
        .args([
            "--skip-networking",
            "--skip-grant-tables",
            "--skip-log-bin",
            "--user=root",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if tuned {
        server.args(tidemark_mariadb::restore::REPLAY_SETTINGS);
    }
    let mut child = server.spawn().unwrap();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "mariadbd exited");
        std::thread::sleep(Duration::from_millis(100));
    }
    let list: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    sh(&format!(
        "TZ=UTC mariadb-binlog --start-position={position} --stop-datetime='{stop}' {} | mariadb --socket={} --binary-mode",
        list.join(" "),
        socket.display()
    ));
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "mariadbd did not stop cleanly"
    );
}

/// The OLTP load (issue 49): one call writes `n` transactions (each `WHEN` one; the deletes reach rows the
/// load inserted, so none is empty).
const PROCEDURE: &str = "CREATE PROCEDURE oltp.oltp(n INT, base INT)
BEGIN
  DECLARE i INT DEFAULT 0;
  DECLARE k INT;
  DECLARE last_order BIGINT DEFAULT 0;
  WHILE i < n DO
    SET k = base + i;
    CASE k % 10
      WHEN 0 THEN
        INSERT INTO oltp.orders (customer, item, qty, price, at)
          VALUES (k % 10000 + 1, k % 1000 + 1, k % 5 + 1, k % 100 + 0.99, NOW());
        SET last_order = LAST_INSERT_ID();
      WHEN 1 THEN UPDATE oltp.stock SET qty = qty - 1 WHERE item = k % 1000 + 1;
      WHEN 2 THEN INSERT INTO oltp.events (kind, ref, at) VALUES ('view', k, NOW());
      WHEN 3 THEN
        START TRANSACTION;
        INSERT INTO oltp.orders (customer, item, qty, price, at)
          VALUES (k % 10000 + 1, k % 1000 + 1, 1, 19.99, NOW());
        SET last_order = LAST_INSERT_ID();
        UPDATE oltp.stock SET reserved = reserved + 1 WHERE item = k % 1000 + 1;
        UPDATE oltp.customers SET balance = balance + 19.99, updated = NOW()
          WHERE id = k % 10000 + 1;
        COMMIT;
      WHEN 4 THEN UPDATE oltp.customers SET balance = balance - 1 WHERE id = (k * 7) % 10000 + 1;
      WHEN 5 THEN DELETE FROM oltp.orders WHERE id = last_order - 1;
      WHEN 6 THEN
        INSERT INTO oltp.orders (customer, item, qty, price, at)
          VALUES (k % 10000 + 1, k % 1000 + 1, 2, 5.49, NOW());
        SET last_order = LAST_INSERT_ID();
      WHEN 7 THEN UPDATE oltp.orders SET qty = qty + 1 WHERE id = last_order;
      WHEN 8 THEN INSERT INTO oltp.events (kind, ref, at) VALUES ('cart', k, NOW());
      ELSE
        START TRANSACTION;
        UPDATE oltp.stock SET qty = qty + 5 WHERE item = (k * 3) % 1000 + 1;
        INSERT INTO oltp.events (kind, ref, at) VALUES ('restock', k, NOW());
        COMMIT;
    END CASE;
    SET i = i + 1;
  END WHILE;
END";

/// Makes the OLTP load's schema `oltp` (customers, stock, orders, events, a few thousand
/// rows) and its procedure.
pub fn oltp_prepare(db: &tidemark_store::testkit::MariaDb) {
    db.sql(
        "SET SESSION max_recursive_iterations = 100000;
         CREATE DATABASE oltp;
         CREATE TABLE oltp.customers (id INT PRIMARY KEY, name VARCHAR(64),
           balance DECIMAL(14,2) NOT NULL DEFAULT 0, updated DATETIME);
         CREATE TABLE oltp.stock (item INT PRIMARY KEY, qty INT NOT NULL, reserved INT NOT NULL);
         CREATE TABLE oltp.orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, customer INT, item INT,
           qty INT, price DECIMAL(10,2), at DATETIME, KEY (customer));
         CREATE TABLE oltp.events (id BIGINT AUTO_INCREMENT PRIMARY KEY, kind VARCHAR(16),
           ref BIGINT, at DATETIME);
         INSERT INTO oltp.customers (id, name, updated)
           WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 10000)
           SELECT n, CONCAT('customer-', n), NOW() FROM s;
         INSERT INTO oltp.stock
           WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 1000)
           SELECT n, 100000, 0 FROM s;",
    );
    db.sql(&format!("DELIMITER //\n{PROCEDURE}//\nDELIMITER ;"));
}

/// Writes `txns` transactions of the OLTP load (one session, autocommit: each its own GTID
/// in the binlog); how many the binlog got (domain 0's sequence numbers).
pub fn oltp_load(db: &tidemark_store::testkit::MariaDb, txns: usize) -> u64 {
    let before = seq(&db.sql("SELECT @@gtid_binlog_pos"));
    let calls = txns.div_ceil(100_000);
    for c in 0..calls {
        let n = (txns - c * 100_000).min(100_000);
        db.sql(&format!("CALL oltp.oltp({n}, {})", c * 100_000));
    }
    seq(&db.sql("SELECT @@gtid_binlog_pos")) - before
}

/// The domain-0 sequence number of a GTID position (`0-1-N`).
fn seq(position: &str) -> u64 {
    position
        .trim()
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a one-domain GTID position: {position:?}"))
}

/// Where the peers' replay starts and stops, as the restore's own plan (`restore --dry-run
/// --output json`) says: the backup's GTID position quoted (a file offset for a backup
/// that records none), and the stop time as `mariadb-binlog --stop-datetime` reads it.
pub fn plan_start_stop(plan: &serde_json::Value) -> (String, String) {
    let position = match plan["startPosition"]["position"].as_u64() {
        Some(offset) => offset.to_string(),
        None => format!("'{}'", plan["runs"][0]["startAfter"].as_str().unwrap()),
    };
    let stop = plan["stopDatetime"]
        .as_str()
        .unwrap()
        .parse::<jiff::Timestamp>()
        .unwrap()
        .strftime("%Y-%m-%d %H:%M:%S")
        .to_string();
    (position, stop)
}
