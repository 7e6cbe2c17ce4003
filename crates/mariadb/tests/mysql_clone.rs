//! Issue 47's first fact, on the real MySQL 9.7 (Debian unstable's, from the root file
//! system scripts/mysql-root.sh builds): a `mysql-clone` backup can take its consistent
//! point from the clone itself. `CLONE LOCAL DATA DIRECTORY` leaves
//! `performance_schema.clone_status`'s binlog file, position and GTID set empty, and
//! `performance_schema.log_status` read after it is later than the copy; but the cloned
//! data directory persists the donor's `gtid_executed` at the clone's consistent point, so
//! a server started on it reports exactly the GTIDs of the transactions its data holds —
//! under a steady write load, with the clone taken mid-stream.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tidemark_store::testkit::mysql::{MySql, gtid_count};

#[test]
fn a_local_clone_carries_its_consistent_point() {
    let donor = MySql::start();
    let version = donor.sql("SELECT @@version");
    assert!(version.starts_with("9."), "{version}");
    donor.sql("INSTALL PLUGIN clone SONAME 'mysql_clone.so'");
    donor.sql("CREATE DATABASE shop; CREATE TABLE shop.orders (id BIGINT PRIMARY KEY)");
    let uuid = donor.sql("SELECT @@server_uuid");
    let before = gtid_count(&donor.sql("SELECT @@gtid_executed"), &uuid);

    // One transaction per row, ids 1, 2, 3… in order, until told to stop.
    let (mut session, mut stdin) = donor.session();
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, written) = (stop.clone(), written.clone());
        std::thread::spawn(move || {
            let mut id = 0u64;
            while !stop.load(Ordering::Relaxed) {
                id += 1;
                writeln!(stdin, "INSERT INTO shop.orders VALUES ({id});").unwrap();
                stdin.flush().unwrap();
                written.store(id, Ordering::Relaxed);
                if id.is_multiple_of(50) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            drop(stdin);
        })
    };
    let rows = |server: &MySql| -> u64 {
        server
            .sql("SELECT COUNT(*) FROM shop.orders")
            .parse()
            .unwrap()
    };
    while rows(&donor) < 500 {
        std::thread::sleep(Duration::from_millis(50));
    }
    let clone = format!("{}/clone", donor.dir);
    donor.sql(&format!("CLONE LOCAL DATA DIRECTORY = '{clone}'"));
    // The status of a local clone has no point to give.
    let status = donor.sql(
        "SELECT STATE, BINLOG_FILE, BINLOG_POSITION, GTID_EXECUTED FROM performance_schema.clone_status",
    );
    let fields: Vec<&str> = status.split('\t').collect();
    assert_eq!(fields[..3], ["Completed", "", "0"], "{status}");
    assert_eq!(fields.get(3).copied().unwrap_or(""), "", "{status}");
    // Writes went on after the clone.
    let at_clone = rows(&donor);
    while rows(&donor) < at_clone + 500 {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let ended = session.wait().unwrap();
    assert!(ended.success(), "the write session failed");
    let total = rows(&donor);
    assert_eq!(total, written.load(Ordering::Relaxed));

    // A server on the clone: its data and its GTID set are the same point, mid-stream.
    let restored = MySql::start_on(&clone, 2);
    let held = rows(&restored);
    let max: u64 = restored
        .sql("SELECT COALESCE(MAX(id), 0) FROM shop.orders")
        .parse()
        .unwrap();
    let gtids = restored.sql("SELECT @@gtid_executed");
    assert!(
        held > 0 && held < total,
        "the clone was taken mid-stream: {held} of {total} rows"
    );
    assert_eq!(max, held, "rows 1..={held}, in order");
    assert_eq!(
        gtid_count(&gtids, &uuid),
        before + held,
        "the clone's GTID set ({gtids}) is its data's: {before} before the load and {held} rows"
    );
    // Its GTIDs are the donor's own, one interval: nothing of another server.
    assert_eq!(gtids, format!("{uuid}:1-{}", before + held), "{gtids}");
}

#[test]
fn gtid_sets_are_counted_per_server() {
    let a = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    let b = "4f22fa47-71ca-11e1-9e33-c80aa9429562";
    assert_eq!(gtid_count(&format!("{a}:1-5:7:9-10,\n{b}:1-3"), a), 8);
    assert_eq!(gtid_count(&format!("{a}:1-5:7:9-10,\n{b}:1-3"), b), 3);
    assert_eq!(gtid_count("", a), 0);
}
