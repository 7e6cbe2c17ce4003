//! Issue 47's first facts, on the real MySQL 9.7 (Debian unstable's, from the root file
//! system scripts/mysql-root.sh builds). The binlog files name their GTIDs as
//! `tidemark_mariadb::mysql` reads them: each file's `Previous_gtids` is the server's
//! `gtid_executed` when the file was opened, and its transactions are the runs it holds; a
//! tagged GTID makes them unknown, never empty. And a `mysql-clone` backup can take its
//! consistent point only from the clone itself. `CLONE LOCAL DATA DIRECTORY` leaves
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

use tidemark_mariadb::mysql::{MySqlGtids, Run, gtids};
use tidemark_store::testkit::mysql::{MySql, gtid_count};

#[test]
fn binlog_files_name_their_gtids() {
    let server = MySql::start();
    let uuid = server.sql("SELECT @@server_uuid");
    let other = "bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb";
    let executed = || server.sql("SELECT @@gtid_executed").replace("\\n", "");
    let mut at_open = vec![executed()];
    // Each step's statements, then a new file.
    let steps = [
        "CREATE DATABASE shop; CREATE TABLE shop.t (id INT PRIMARY KEY); INSERT INTO shop.t VALUES (1)".to_owned(),
        "INSERT INTO shop.t VALUES (2); INSERT INTO shop.t VALUES (3); INSERT INTO shop.t VALUES (4)".to_owned(),
        format!(
            "SET gtid_next = '{other}:10'; INSERT INTO shop.t VALUES (5); SET gtid_next = AUTOMATIC; INSERT INTO shop.t VALUES (6); INSERT INTO shop.t VALUES (7)"
        ),
        "SET gtid_next = 'aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa:tag1:7'; INSERT INTO shop.t VALUES (8); SET gtid_next = AUTOMATIC".to_owned(),
    ];
    for step in &steps {
        server.sql(&format!("{step}; FLUSH BINARY LOGS"));
        at_open.push(executed());
    }
    let file = |n: usize| -> MySqlGtids {
        let path = server.path(&format!("{}/binlog.{n:06}", server.datadir));
        gtids(&mut std::fs::File::open(&path).unwrap()).unwrap()
    };
    let run = |u: &str, first: u64, last: u64| Run {
        uuid: tidemark_mariadb::mysql::Uuid(
            hex::decode(u.replace('-', "")).unwrap().try_into().unwrap(),
        ),
        first,
        last,
        server: 1,
    };
    let expected_runs = [
        vec![run(&uuid, 1, 3)],
        vec![run(&uuid, 4, 6)],
        vec![run(other, 10, 10), run(&uuid, 7, 8)],
    ];
    for (i, runs) in expected_runs.iter().enumerate() {
        let read = file(i + 1);
        assert_eq!(read.server_id, Some(1));
        assert_eq!(read.runs.as_ref(), Some(runs), "binlog.{:06}", i + 1);
        let previous = read.previous.expect("an untagged Previous_gtids");
        assert_eq!(
            previous,
            tidemark_core::gtidset::GtidSet::parse(&at_open[i]).unwrap(),
            "binlog.{:06}'s Previous_gtids is gtid_executed when it was opened",
            i + 1
        );
    }
    // A tagged GTID: its file's transactions, and the next file's Previous_gtids, are
    // unknown — never read as none.
    assert_eq!(file(4).runs, None);
    assert!(file(4).previous.is_some());
    assert_eq!(file(5).previous, None);
    assert_eq!(file(5).runs, Some(vec![]));
}

fn rows(server: &MySql) -> u64 {
    server
        .sql("SELECT COUNT(*) FROM shop.orders")
        .parse()
        .unwrap()
}

/// A donor with the clone plugin and `shop.orders`, its uuid and its GTID count before any
/// load.
fn donor() -> (MySql, String, u64) {
    let donor = MySql::start();
    let version = donor.sql("SELECT @@version");
    assert!(version.starts_with("9."), "{version}");
    donor.sql("INSTALL PLUGIN clone SONAME 'mysql_clone.so'");
    donor.sql("CREATE DATABASE shop; CREATE TABLE shop.orders (id BIGINT PRIMARY KEY)");
    let uuid = donor.sql("SELECT @@server_uuid");
    let before = gtid_count(&donor.sql("SELECT @@gtid_executed"), &uuid);
    (donor, uuid, before)
}

/// Runs `during` while `donor` takes one transaction per row (ids 1, 2, 3… in order), with
/// at least 500 rows written before it and 500 after; returns what it returned and the
/// rows written in all.
fn under_load<T>(donor: &MySql, during: impl FnOnce() -> T) -> (T, u64) {
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
    while rows(donor) < 500 {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = during();
    let after = rows(donor);
    while rows(donor) < after + 500 {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let ended = session.wait().unwrap();
    assert!(ended.success(), "the write session failed");
    let total = rows(donor);
    assert_eq!(total, written.load(Ordering::Relaxed));
    (out, total)
}

/// A server on the cloned data directory `clone` holds rows 1..=n of the load, mid-stream,
/// and exactly the donor's GTIDs of them: its GTID set is its data's. Returns n.
fn clone_holds_its_point(clone: &str, uuid: &str, before: u64, total: u64) -> u64 {
    let restored = MySql::start_on(clone, 2);
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
    // The donor's own GTIDs, one interval: its data's, nothing of another server.
    assert_eq!(
        gtids,
        format!("{uuid}:1-{}", before + held),
        "the clone's GTID set is its data's: {before} before the load and {held} rows"
    );
    held
}

#[test]
fn a_local_clone_carries_its_consistent_point() {
    let (donor, uuid, before) = donor();
    let clone = format!("{}/clone", donor.dir);
    let (status, total) = under_load(&donor, || {
        donor.sql(&format!("CLONE LOCAL DATA DIRECTORY = '{clone}'"));
        donor.sql(
            "SELECT STATE, BINLOG_FILE, BINLOG_POSITION, GTID_EXECUTED FROM performance_schema.clone_status",
        )
    });
    // The status of a local clone has no point to give.
    let fields: Vec<&str> = status.split('\t').collect();
    assert_eq!(fields[..3], ["Completed", "", "0"], "{status}");
    assert_eq!(fields.get(3).copied().unwrap_or(""), "", "{status}");
    clone_holds_its_point(&clone, &uuid, before, total);
}

/// `CLONE INSTANCE FROM` the donor into a directory of a private recipient server — the
/// way a backup Job can clone without room on the database's own volume. Here too the
/// recipient's `clone_status` names no point (MySQL 9.7 fills it only for a clone that
/// replaces the recipient's own data, after its restart), and the cloned data directory
/// carries the donor's GTID set at the clone's point: the backup's point is read from the
/// clone itself, whichever way it is made.
#[test]
fn a_remote_clone_carries_its_consistent_point_too() {
    let (donor, uuid, _) = donor();
    donor.sql(
        "CREATE USER 'tidemark'@'127.0.0.1' IDENTIFIED BY 'clone-secret'; GRANT BACKUP_ADMIN ON *.* TO 'tidemark'@'127.0.0.1'",
    );
    // The account's two transactions are before the load too.
    let before = gtid_count(&donor.sql("SELECT @@gtid_executed"), &uuid);
    let recipient = MySql::start();
    recipient.sql("INSTALL PLUGIN clone SONAME 'mysql_clone.so'");
    recipient.sql(&format!(
        "SET GLOBAL clone_valid_donor_list = '127.0.0.1:{}'",
        donor.port
    ));
    let clone = format!("{}/clone", recipient.dir);
    let (status, total) = under_load(&donor, || {
        recipient.sql(&format!(
            "CLONE INSTANCE FROM 'tidemark'@'127.0.0.1':{} IDENTIFIED BY 'clone-secret' DATA DIRECTORY = '{clone}'",
            donor.port
        ));
        recipient.sql(
            "SELECT STATE, BINLOG_FILE, BINLOG_POSITION, GTID_EXECUTED FROM performance_schema.clone_status",
        )
    });
    let fields: Vec<&str> = status.split('\t').collect();
    assert_eq!(fields[..3], ["Completed", "", "0"], "{status}");
    clone_holds_its_point(&clone, &uuid, before, total);
}

#[test]
fn gtid_sets_are_counted_per_server() {
    let a = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    let b = "4f22fa47-71ca-11e1-9e33-c80aa9429562";
    assert_eq!(gtid_count(&format!("{a}:1-5:7:9-10,\n{b}:1-3"), a), 8);
    assert_eq!(gtid_count(&format!("{a}:1-5:7:9-10,\n{b}:1-3"), b), 3);
    assert_eq!(gtid_count("", a), 0);
}

/// `method: mysql-clone`'s clone (issue 47): taken under load through Tidemark's own
/// recipient (MySQL's programs from the host, as the server user), its point read from the
/// clone, streamed as a tar and unpacked again: a server on the result holds exactly the
/// rows the point names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_through_a_private_recipient_holds_its_point() {
    use tidemark_mariadb::clone::{Donor, stream, take, unpack};
    let (donor, uuid, _) = donor();
    donor.sql(
        "CREATE USER 'tidemark'@'127.0.0.1' IDENTIFIED BY 'cl\\'one\"secret'; GRANT BACKUP_ADMIN ON *.* TO 'tidemark'@'127.0.0.1'",
    );
    let before = gtid_count(&donor.sql("SELECT @@gtid_executed"), &uuid);
    let bin = tidemark_store::testkit::mysql::bin();
    let tools = tidemark_mariadb::restore::Tools {
        mysqld: bin.join("mysqld").into(),
        mysql: bin.join("mysql").into(),
        server_user: tidemark_store::testkit::running_as_root()
            .then(|| tidemark_store::testkit::SERVER_USER.into()),
        ..Default::default()
    };
    let command: Vec<String> = [
        bin.join("mysql").to_string_lossy().into_owned(),
        "--host=127.0.0.1".into(),
        format!("--port={}", donor.port),
        "--user=tidemark".into(),
        "--password=cl'one\"secret".into(),
    ]
    .into();
    let source = Donor::from_command(&command).unwrap();
    let work = tempfile::tempdir().unwrap();
    let handle = tokio::runtime::Handle::current();
    let (cloned, total) = tokio::task::block_in_place(|| {
        under_load(&donor, || {
            handle
                .block_on(take(
                    &source,
                    &tools,
                    work.path(),
                    &tidemark_store::NoProgress,
                ))
                .map_err(|e| e.to_string())
        })
    });
    let cloned = cloned.unwrap();
    assert_eq!(cloned.source.server_uuid, uuid);
    assert_eq!(cloned.source.replica, None, "the clone account may not ask");
    assert_eq!(cloned.source.geometry.page_size, 16384);
    let held = cloned.gtid_executed.count() - before;
    assert!(held > 0 && held < total, "mid-stream: {held} of {total}");
    assert!(
        !cloned.datadir.join("auto.cnf").exists(),
        "the recipient's uuid is not kept"
    );

    let (mut tar, task) = stream(cloned.datadir.clone());
    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut tar, &mut bytes)
        .await
        .unwrap();
    task.await.unwrap().unwrap();
    let root = tidemark_store::testkit::mysql::root();
    let place = tempfile::Builder::new()
        .prefix("restored-")
        .tempdir_in(root.join("srv"))
        .unwrap();
    let datadir = place.path().join("data");
    std::fs::create_dir(&datadir).unwrap();
    unpack(&bytes[..], &datadir).unwrap();
    let status = std::process::Command::new("chown")
        .args(["-R", "999:999"])
        .arg(place.path())
        .status()
        .unwrap();
    assert!(status.success());
    let inside = format!(
        "/srv/{}/data",
        place.path().file_name().unwrap().to_string_lossy()
    );
    let restored = clone_holds_its_point(&inside, &uuid, before, total);
    assert_eq!(restored, held, "the recorded point is the data's");
}

/// Issue 47: mysqldump's global read lock (`FLUSH TABLES WITH READ LOCK`) waits behind a
/// long statement, and every write on the source queues behind it.
/// - A long statement that holds no table (a `SLEEP`, a `GET_LOCK` wait) is not waited for.
/// - An account with `PROCESS` sees the long statement first: the dump waits for it (3 s
///   here, `dump::LOCK_WAIT` in use), then fails without asking for the lock, and the
///   writes go on while the statement still runs.
/// - One without it cannot: mysqldump's flush is killed after the wait and the backup
///   fails naming it (the writes wait for the statement: MySQL keeps the flush pending).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_behind_a_long_statement_takes_no_lock_and_waits_bounded() {
    use tidemark_mariadb::clone::Donor;
    let (db, _, _) = donor();
    db.sql(
        "INSERT INTO shop.orders VALUES (1); \
         CREATE USER 'dumper'@'127.0.0.1' IDENTIFIED BY 'dump-secret'; \
         GRANT SELECT, SHOW VIEW, TRIGGER, EVENT, RELOAD, REPLICATION CLIENT ON *.* TO 'dumper'@'127.0.0.1'; \
         CREATE USER 'watcher'@'127.0.0.1' IDENTIFIED BY 'dump-secret'; \
         GRANT SELECT, SHOW VIEW, TRIGGER, EVENT, RELOAD, REPLICATION CLIENT, PROCESS ON *.* TO 'watcher'@'127.0.0.1'",
    );
    let bin = tidemark_store::testkit::mysql::bin();
    let source = |user: &str| {
        let command: Vec<String> = [
            bin.join("mysql").to_string_lossy().into_owned(),
            "--host=127.0.0.1".into(),
            format!("--port={}", db.port),
            format!("--user={user}"),
            "--password=dump-secret".into(),
        ]
        .into();
        Donor::from_command(&command).unwrap()
    };
    let running =
        "SELECT ID, TIME FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP(600)%'";
    // A long statement, running for at least `secs`: its connection id.
    let long = |secs: u64, statement: &str| {
        let (session, mut stdin) = db.session();
        writeln!(stdin, "{statement};").unwrap();
        stdin.flush().unwrap();
        for _ in 0..200 {
            let row = db.sql(running);
            if let Some((id, time)) = row.split_once('\t')
                && time.parse::<u64>().unwrap() >= secs
            {
                return (id.to_owned(), session, stdin);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the long statement never ran");
    };
    let mysqldump = bin.join("mysqldump").into_os_string();
    let dump = |donor: Donor| {
        let mysqldump = mysqldump.clone();
        async move {
            let work = tempfile::tempdir().unwrap();
            let (mut stream, run) = tidemark_mariadb::dump::start(
                &donor,
                &mysqldump,
                work.path(),
                Duration::from_secs(3),
            )
            .await
            .map_err(|e| e.to_string())?;
            let mut sink = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut sink).await;
            run.finish(false).await.map(|_| ())
        }
    };

    // A statement that holds no table does not hold the lock back: not waited for.
    let (sleeper, mut session, _stdin) = long(3, "SELECT SLEEP(600)");
    dump(source("watcher"))
        .await
        .expect("a dump beside a statement that holds no table");
    db.sql(&format!("KILL QUERY {sleeper}"));
    let _ = session.kill();
    let _ = session.wait();

    // With PROCESS: no lock asked for, the writes go on.
    let (sleeper, mut session, _stdin) = long(3, "SELECT SLEEP(600) FROM shop.orders");
    let e = dump(source("watcher"))
        .await
        .expect_err("a dump behind a long statement");
    assert!(
        e.contains("a statement has run for")
            && e.contains("SELECT SLEEP(600)")
            && e.contains("was not asked for"),
        "{e}"
    );
    db.sql("INSERT INTO shop.orders VALUES (2)");
    assert!(
        db.sql(running).starts_with(&sleeper),
        "the long statement ended before the write"
    );
    db.sql(&format!("KILL QUERY {sleeper}"));
    let _ = session.kill();
    let _ = session.wait();

    // Without: the flush waits, and is killed after the wait.
    let (sleeper, mut session, _stdin) = long(0, "SELECT SLEEP(600) FROM shop.orders");
    let e = dump(source("dumper"))
        .await
        .expect_err("a dump behind the lock");
    assert!(
        e.contains("waited more than 3 s for its global read lock"),
        "{e}"
    );
    db.sql(&format!("KILL QUERY {sleeper}"));
    let _ = session.kill();
    let _ = session.wait();
    db.sql("INSERT INTO shop.orders VALUES (3)");
}
