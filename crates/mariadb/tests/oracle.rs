//! Issue 48 §1, the oracle's first proof: checksums written on a real MariaDB primary
//! travel to a replica as the statements that compute them and the primary's values; a
//! replica that lost one transaction is named by table and chunk, and the primary, where
//! both values are its own, by nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tidemark_mariadb::oracle;
use tidemark_store::testkit::MariaDb;

/// Checksum run `run` on `server` with `settings`.
async fn run_on(
    server: &MariaDb,
    run: u64,
    settings: &oracle::Settings,
) -> Result<oracle::RunReport, String> {
    oracle::write_run(
        std::ffi::OsStr::new("mariadb"),
        &server.client_args(),
        run,
        settings,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_lost_a_transaction_is_named_by_table_and_chunk() {
    let primary = MariaDb::start_replicating(1);
    let replica = MariaDb::start_replicating(2);
    primary.sql(
        "CREATE DATABASE shop; \
         CREATE TABLE shop.orders (id INT PRIMARY KEY, note VARCHAR(64), qty INT NULL); \
         INSERT INTO shop.orders SELECT seq, CONCAT('order ', seq), IF(seq % 7 = 0, NULL, seq % 9) FROM shop.seq_1_to_25000; \
         CREATE TABLE shop.notes (note VARCHAR(64)); \
         INSERT INTO shop.notes VALUES ('a'), (NULL), ('b')",
    );
    replica.replicate_from(&primary);
    // The replica loses one transaction, as a replay that dropped an event would.
    replica.sql("STOP SLAVE");
    primary.sql("UPDATE shop.orders SET note = 'changed' WHERE id = 12345");
    let skipped = primary.sql("SELECT @@gtid_binlog_pos");
    replica.sql(&format!(
        "SET GLOBAL gtid_slave_pos = '{skipped}'; START SLAVE"
    ));

    let report = run_on(&primary, 1, &oracle::Settings::default())
        .await
        .unwrap();
    assert_eq!((report.tables, report.chunks), (2, 4), "{report:?}");
    assert!(report.skipped.is_empty(), "{report:?}");
    replica.wait_caught_up(&primary);

    assert_eq!(primary.sql(&oracle::checked_sql(0)), "4");
    assert_eq!(primary.sql(&oracle::differences_sql()), "");
    assert_eq!(replica.sql(&oracle::checked_sql(0)), "4");
    assert_eq!(
        oracle::describe_differences(&replica.sql(&oracle::differences_sql())),
        vec![
            "shop.orders chunk 1 (keys above 10000 up to 20000): 10000 rows, their content differs"
        ]
    );

    // The cost settings: chunks of 5,000 rows, one table skipped by pattern; each run
    // deletes all but the newest runs, so the table on the primary stays small.
    let settings = oracle::Settings {
        chunk_rows: 5_000,
        pause: Duration::from_millis(1),
        tables: vec!["shop.*".into()],
        skip: vec!["*.notes".into()],
    };
    for run in 2..=5 {
        let report = run_on(&primary, run, &settings).await.unwrap();
        assert_eq!((report.tables, report.chunks), (1, 6), "{report:?}");
    }
    replica.wait_caught_up(&primary);
    assert_eq!(
        primary.sql("SELECT GROUP_CONCAT(DISTINCT run ORDER BY run) FROM tidemark_oracle.chunks"),
        "3,4,5",
        "the newest {} runs stay",
        oracle::KEEP_RUNS
    );
    // The replica's chunks of runs 3 to 5 name the same lost row, in smaller ranges.
    let lost = oracle::describe_differences(&replica.sql(&oracle::differences_sql()));
    assert_eq!(lost.len(), 3, "{lost:?}");
    assert!(
        lost.iter()
            .all(|l| l == "shop.orders chunk 2 (keys above 10000 up to 15000): 5000 rows, their content differs"),
        "{lost:?}"
    );
}

/// What either server's session settings are cannot make a correct copy differ: the
/// primary runs at READ COMMITTED (statement logging needs REPEATABLE READ, which the
/// checksum's session sets), the replica in another time zone (TIMESTAMP values are
/// digested in UTC), a table mixes character sets (each column is digested as its bytes),
/// and holds fractions and doubles. A table that cannot be checked (a key past a signed
/// 64-bit integer) is skipped by name, and the others are checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_of_either_server_change_no_checksum() {
    let primary = MariaDb::start_replicating(1);
    let replica = MariaDb::start_replicating(2);
    replica.replicate_from(&primary);
    replica.sql("STOP SLAVE; SET GLOBAL time_zone = '+05:30'; START SLAVE");
    primary.sql("SET GLOBAL TRANSACTION ISOLATION LEVEL READ COMMITTED");
    primary.sql(
        "CREATE DATABASE shop; \
         CREATE TABLE shop.events (id INT PRIMARY KEY, at TIMESTAMP(6) NULL, f DOUBLE, \
           l VARCHAR(32) CHARACTER SET latin1, u VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci); \
         INSERT INTO shop.events SELECT seq, FROM_UNIXTIME(1700000000 + seq * 3600.25), seq / 7, \
           CONCAT('l', seq), CONCAT('ü#', seq) FROM shop.seq_1_to_300; \
         CREATE TABLE shop.huge_keys (id BIGINT UNSIGNED PRIMARY KEY); \
         INSERT INTO shop.huge_keys SELECT 18446744073709551615 - seq FROM shop.seq_0_to_199",
    );
    replica.wait_caught_up(&primary);
    let settings = oracle::Settings {
        chunk_rows: 100,
        ..oracle::Settings::default()
    };
    let report = run_on(&primary, 1, &settings).await.unwrap();
    assert_eq!((report.tables, report.chunks), (1, 4), "{report:?}");
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert!(
        report.skipped[0].starts_with(
            "shop.huge_keys: its key \"18446744073709551515\" is not a 64-bit integer"
        ),
        "{report:?}"
    );
    replica.wait_caught_up(&primary);
    assert_eq!(replica.sql(&oracle::checked_sql(0)), "4");
    assert_eq!(replica.sql(&oracle::differences_sql()), "");
    // And a replica is not written to: the run refuses a read-only server.
    replica.sql("SET GLOBAL read_only = 1");
    let refused = run_on(&replica, 2, &settings).await.unwrap_err();
    assert!(refused.contains("the server is read-only"), "{refused}");
}

/// Tables whose primary key is several columns, or text, are chunked in their key's order:
/// every row is in exactly one chunk (the counts add up to the table's), and a replica
/// that lost one update is named by the chunk's key range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_primary_keys_are_chunked_and_every_row_counted() {
    let primary = MariaDb::start_replicating(1);
    let replica = MariaDb::start_replicating(2);
    primary.sql(
        "CREATE DATABASE shop; \
         CREATE TABLE shop.lines (order_id INT, sku VARCHAR(16) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci, \
           at DATETIME(3), qty INT, PRIMARY KEY (order_id, sku, at)); \
         INSERT INTO shop.lines SELECT seq DIV 10, CONCAT(IF(seq % 3 = 0, 'Ü', 'u'), seq % 10), \
           FROM_UNIXTIME(1700000000 + (seq % 4) * 0.5), seq FROM shop.seq_1_to_250; \
         CREATE TABLE shop.sessions (id CHAR(36) PRIMARY KEY, v INT); \
         INSERT INTO shop.sessions SELECT UUID(), seq FROM shop.seq_1_to_150",
    );
    replica.replicate_from(&primary);
    replica.sql("STOP SLAVE");
    primary.sql("UPDATE shop.lines SET qty = 0 WHERE order_id = 20 AND sku = 'u1'");
    let skipped = primary.sql("SELECT @@gtid_binlog_pos");
    replica.sql(&format!(
        "SET GLOBAL gtid_slave_pos = '{skipped}'; START SLAVE"
    ));
    let settings = oracle::Settings {
        chunk_rows: 100,
        ..oracle::Settings::default()
    };
    let report = run_on(&primary, 1, &settings).await.unwrap();
    // 250 rows by 100: 3 chunks; 150 by 100: 2.
    assert_eq!((report.tables, report.chunks), (2, 5), "{report:?}");
    assert!(report.skipped.is_empty(), "{report:?}");
    replica.wait_caught_up(&primary);
    assert_eq!(
        primary.sql(
            "SELECT tbl, SUM(this_cnt), COUNT(*) FROM tidemark_oracle.chunks GROUP BY tbl ORDER BY tbl"
        ),
        "lines\t250\t3\nsessions\t150\t2"
    );
    let lost = oracle::describe_differences(&replica.sql(&oracle::differences_sql()));
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert!(
        lost[0].starts_with("shop.lines chunk 2 (keys above (20, ")
            && lost[0].ends_with("): 50 rows, their content differs"),
        "{lost:?}"
    );
    assert_eq!(primary.sql(&oracle::differences_sql()), "");
}
