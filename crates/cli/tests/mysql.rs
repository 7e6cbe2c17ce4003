//! End to end with a real MySQL 9.7 server (scripts/mysql-root.sh) and the `tidemark`
//! binary (issue 47): `push --method mysql-clone` into a real S3 server (SeaweedFS),
//! compressed and encrypted, and `restore --to` its point with exact rows and GTIDs; a
//! clone payload forged in a store writes nothing outside the data directory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{find, json, on_store, stderr};

use std::path::{Path, PathBuf};

use tidemark_store::testkit::SeaweedFs;
use tidemark_store::testkit::mysql::{self, MySql};

/// A source with the clone plugin, a table of `rows` rows, and the account Tidemark clones
/// with (BACKUP_ADMIN only).
fn source(rows: u64) -> MySql {
    let db = MySql::start();
    db.sql("INSTALL PLUGIN clone SONAME 'mysql_clone.so'");
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id BIGINT PRIMARY KEY, note VARCHAR(64))",
    );
    db.sql(&format!(
        "INSERT INTO shop.orders WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows}) SELECT i, CONCAT('order ', i) FROM n"
    ));
    db.sql(
        "CREATE USER 'tidemark'@'127.0.0.1' IDENTIFIED BY 'clone-secret'; GRANT BACKUP_ADMIN ON *.* TO 'tidemark'@'127.0.0.1'",
    );
    db
}

/// `--` and the source's client options (MySQL's programs are found in `PATH`:
/// [`bin`]).
fn clone_args(db: &MySql) -> Vec<String> {
    vec![
        "--".into(),
        "mysql".into(),
        "--host=127.0.0.1".into(),
        format!("--port={}", db.port),
        "--user=tidemark".into(),
        "--password=clone-secret".into(),
    ]
}

/// The `tidemark` binary with the MySQL root's programs first in `PATH` (so the defaults
/// of `--mysqld`, `--mysql` and `--mysqlbinlog` are MySQL's, not the host's MariaDB links).
fn bin() -> std::process::Command {
    let mut c = common::bin();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![mysql::bin()];
    dirs.extend(std::env::split_paths(&path));
    c.env("PATH", std::env::join_paths(dirs).unwrap());
    c
}

/// A new directory in the MySQL root (`/srv/…`) for a restored data directory: the host
/// path, and the path the root's server sees.
fn place() -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::Builder::new()
        .prefix("restored-")
        .tempdir_in(mysql::root().join("srv"))
        .unwrap();
    let inside = format!(
        "/srv/{}/data",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let datadir = dir.path().join("data");
    (dir, datadir, inside)
}

/// Hands `dir` to the root's mysql user and starts a server on it.
fn start_restored(host_dir: &Path, inside: &str) -> MySql {
    let status = std::process::Command::new("chown")
        .args(["-R", "999:999"])
        .arg(host_dir)
        .status()
        .unwrap();
    assert!(status.success());
    MySql::start_on(inside, 7)
}

#[test]
fn a_mysql_clone_backup_restores_exactly() {
    let s3 = SeaweedFs::start();
    let db = source(1000);
    let uuid = db.sql("SELECT @@server_uuid");
    let at_backup = db.sql("SELECT @@gtid_executed").replace("\\n", "");
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("key.txt");
    let made = bin()
        .args(["keygen", "--output", key.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", stderr(&made));
    let recipient = String::from_utf8(made.stdout).unwrap().trim().to_owned();

    let mut push = vec![
        "push",
        "--backup-name",
        "nightly",
        "--method",
        "mysql-clone",
        "--recipient",
        &recipient,
        "--output",
        "json",
    ];
    let args = clone_args(&db);
    push.extend(args.iter().map(String::as_str));
    let out = bin()
        .envs(s3.env())
        .env("TIDEMARK_COMPRESSION", "zstd")
        .arg(push[0])
        .args(["--store", &s3.url(), "--cluster", "my"])
        .args(["--endpoint", &s3.endpoint])
        .args(&push[1..])
        .output()
        .unwrap();
    assert!(out.status.success(), "push: {}", stderr(&out));
    let pushed = json(&out);
    // Written after the backup: not in it.
    db.sql("INSERT INTO shop.orders VALUES (1001, 'after'), (1002, 'after')");
    assert_eq!(pushed["phase"], "completed", "{pushed}");
    assert_eq!(pushed["compression"], "zstd", "{pushed}");
    assert!(pushed["encryption"].is_object(), "{pushed}");
    let id = pushed["backupId"].as_str().unwrap().to_owned();
    let m: serde_json::Value = {
        let store = s3.raw_store();
        let key = object_store::path::Path::from(format!("my/nightly/{id}/metadata.json"));
        use object_store::ObjectStoreExt as _;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let bytes = rt.block_on(async { store.get(&key).await.unwrap().bytes().await.unwrap() });
        serde_json::from_slice(&bytes).unwrap()
    };
    assert_eq!(m["method"], "mysql-clone", "{m}");
    assert_eq!(m["gtidExecuted"], at_backup.as_str(), "{m}");
    assert_eq!(m["server"]["serverUuid"], uuid.as_str(), "{m}");
    assert_eq!(m["server"]["innodbPageSize"], 16384, "{m}");
    assert_eq!(m["server"]["gtidMode"], "ON", "{m}");
    assert_eq!(m["server"]["lowerCaseTableNames"], 0, "{m}");
    assert_eq!(m["payload"][0]["name"], "backup.tar.zst", "{m}");
    let completed = m["completedAt"].as_str().unwrap().to_owned();

    let ls = json(&on_store(&s3, "my", &["ls", "--output", "json"]));
    assert!(ls.to_string().contains(&id), "{ls}");

    let (dir, datadir, inside) = place();
    let restored = bin()
        .envs(s3.env())
        .args(["restore", "--store", &s3.url(), "--cluster", "my"])
        .args(["--endpoint", &s3.endpoint])
        .args(["--identity", key.to_str().unwrap()])
        .args(["--to", &completed, "--datadir", datadir.to_str().unwrap()])
        .args(["--output", "json"])
        .output()
        .unwrap();
    assert!(restored.status.success(), "restore: {}", stderr(&restored));
    let report = json(&restored);
    assert_eq!(report["gtidPosition"], at_backup.as_str(), "{report}");
    assert_eq!(
        report["backups"][0]["server"]["serverUuid"],
        uuid.as_str(),
        "{report}"
    );
    let server = start_restored(dir.path(), &inside);
    assert_eq!(
        server.sql("SELECT COUNT(*), MAX(id) FROM shop.orders"),
        "1000\t1000"
    );
    assert_eq!(
        server.sql("SELECT note FROM shop.orders WHERE id = 777"),
        "order 777"
    );
    assert_eq!(
        server.sql("SELECT @@gtid_executed").replace("\\n", ""),
        at_backup,
        "the restored data holds exactly the recorded transactions"
    );
    assert_ne!(
        server.sql("SELECT @@server_uuid"),
        uuid,
        "a restored server is a new server"
    );
}

/// A payload forged in the store (a bucket writer's: a tar whose entries climb out of the
/// data directory or link outside it, under a metadata.json that names mysql-clone and the
/// forged bytes' checksum) fails the restore naming the entry, and writes nothing outside.
#[test]
fn a_forged_clone_payload_writes_nothing_outside() {
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let work = tempfile::tempdir().unwrap();
    let victim = work.path().join("victim");
    std::fs::write(&victim, "kept").unwrap();
    for (name, kind, link) in [
        ("../victim", tar::EntryType::Regular, None),
        ("ibdata1", tar::EntryType::Symlink, Some(victim.clone())),
        ("ibdata1", tar::EntryType::Link, Some(victim.clone())),
    ] {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(if kind == tar::EntryType::Regular {
            6
        } else {
            0
        });
        h.set_mode(0o644);
        if let Some(l) = &link {
            h.set_link_name(l).unwrap();
        }
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        let data: &[u8] = if kind == tar::EntryType::Regular {
            b"forged"
        } else {
            b""
        };
        b.append(&h, data).unwrap();
        let id = format!(
            "20261130T12000{}Z-0000000{}",
            kind.as_byte() % 10,
            kind.as_byte() % 10
        );
        let (completed, meta) = forge(
            store.path(),
            work.path(),
            &id,
            &b.into_inner().unwrap(),
            "mysql-clone",
        );

        let datadir = work.path().join("restore/data");
        let out = bin()
            .args(["restore", "--store", &url, "--cluster", "my"])
            .args(["--to", &completed, "--datadir", datadir.to_str().unwrap()])
            .output()
            .unwrap();
        let said = stderr(&out);
        assert!(!out.status.success(), "{name} {kind:?} restored");
        assert!(said.contains(name), "{name} {kind:?}: {said}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "kept");
        assert!(!datadir.exists(), "the half-restored directory is removed");
        let left: Vec<_> = std::fs::read_dir(work.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 3, "nothing new beside the victim: {left:?}");
        std::fs::remove_file(meta).unwrap();
    }
}

/// A bucket writer's backup `forged`/`id` in the file store at `store`: `bytes` pushed as
/// they are (from a file in `work`), then its record rewritten to name `method` — the only
/// change (the checksum is already the forged bytes'). Returns its completion and the
/// record's path.
fn forge(store: &Path, work: &Path, id: &str, bytes: &[u8], method: &str) -> (String, PathBuf) {
    let forged = work.join("forged");
    std::fs::write(&forged, bytes).unwrap();
    let ext = if method == "mysqldump" { "sql" } else { "tar" };
    let url = format!("file://{}", store.display());
    let pushed = bin()
        .args(["push", "--store", &url, "--cluster", "my"])
        .args(["--backup-name", "forged", "--backup-id", id, "--ext", ext])
        .args(["--output", "json", "--", "cat", forged.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(pushed.status.success(), "{}", stderr(&pushed));
    let completed = json(&pushed)["completedAt"].as_str().unwrap().to_owned();
    let meta = find(store, "metadata.json")
        .into_iter()
        .find(|p| p.to_string_lossy().contains(id))
        .unwrap();
    let text = std::fs::read_to_string(&meta).unwrap();
    let rewritten = text.replace("\"method\": \"exec\"", &format!("\"method\": \"{method}\""));
    assert_ne!(text, rewritten, "{text}");
    std::fs::write(&meta, rewritten).unwrap();
    (completed, meta)
}

/// Sleeps into the next second (binlog events are stamped in whole seconds), and a little
/// past its start.
fn next_second() {
    let now = jiff::Timestamp::now();
    let into = now.subsec_nanosecond();
    std::thread::sleep(std::time::Duration::from_nanos(
        1_000_000_000 - u64::try_from(into).unwrap() + 50_000_000,
    ));
}

/// Issue 47: a clone backup and the binlogs archived after it restore to three instants
/// with exactly the rows committed by then, and the GTIDs of those transactions (replayed
/// by `mysqlbinlog --exclude-gtids … | mysql` on a private MySQL server).
#[test]
fn binlogs_replay_a_clone_to_any_instant() {
    let db = source(100);
    let uuid = db.sql("SELECT @@server_uuid");
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let tidemark = |args: &[&str]| {
        let out = bin()
            .arg(args[0])
            .args(["--store", &url, "--cluster", "my"])
            .args(&args[1..])
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        out
    };
    let mut push = vec![
        "push",
        "--backup-name",
        "nightly",
        "--method",
        "mysql-clone",
    ];
    let args = clone_args(&db);
    push.extend(args.iter().map(String::as_str));
    tidemark(&push);
    let index = db.path(&format!("{}/binlog.index", db.datadir));
    let index = index.to_str().unwrap();
    let mut instants = Vec::new();
    for batch in 1..=3u64 {
        next_second();
        let first = 100 * batch + 1;
        db.sql(&format!(
            "INSERT INTO shop.orders WITH RECURSIVE n(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM n WHERE i < {}) SELECT i, 'later' FROM n; UPDATE shop.orders SET note = 'batch {batch}' WHERE id = 1",
            first + 99
        ));
        if batch == 2 {
            db.sql("FLUSH BINARY LOGS");
        }
        next_second();
        instants.push((jiff::Timestamp::now(), 100 * (batch + 1)));
        next_second();
    }
    db.sql("INSERT INTO shop.orders VALUES (9999, 'after the last instant'); FLUSH BINARY LOGS");
    tidemark(&["archive-binlogs", "--binlog-index", index, "--once"]);
    let ls = json(&tidemark(&["ls", "-o", "json"]));
    assert_eq!(ls["archive"]["missing"], serde_json::json!([]), "{ls}");

    for (i, (at, rows)) in instants.iter().enumerate() {
        let (dir, datadir, inside) = place();
        let at = at.to_string();
        let out = tidemark(&[
            "restore",
            "--to",
            &at,
            "--datadir",
            datadir.to_str().unwrap(),
            "-o",
            "json",
        ]);
        let report = json(&out);
        assert!(
            report["segments"].as_array().is_some_and(|s| !s.is_empty()),
            "{report}"
        );
        let holds = report["gtidPosition"].as_str().unwrap().to_owned();
        // The last transaction replayed: its batch's, a second or two before the instant.
        let reached: jiff::Timestamp = report["reached"].as_str().unwrap().parse().unwrap();
        let target: jiff::Timestamp = at.parse().unwrap();
        assert!(
            reached <= target && target.duration_since(reached).as_secs() <= 3,
            "{report}"
        );
        let server = start_restored(dir.path(), &inside);
        assert_eq!(
            server.sql("SELECT COUNT(*), MAX(id), (SELECT note FROM shop.orders WHERE id = 1) FROM shop.orders"),
            format!("{rows}\t{rows}\tbatch {}", i + 1),
            "at {at}"
        );
        let executed = server.sql("SELECT @@gtid_executed").replace("\\n", "");
        assert_eq!(executed, holds, "the report says what the data holds");
        // Five transactions of setup, then two per batch.
        assert_eq!(executed, format!("{uuid}:1-{}", 5 + 2 * (i + 1)), "at {at}");
    }
    // A restore test of the middle instant: restored, every table checked, the query
    // answering what was committed by then; recorded beside the clone.
    let (at, rows) = instants[1];
    let scratch = tempfile::tempdir_in(mysql::root().join("srv")).unwrap();
    let at = at.to_string();
    let tested = json(&tidemark(&[
        "restore-test",
        "--to",
        &at,
        "--query",
        "SELECT COUNT(*) FROM shop.orders",
        "--expect",
        &rows.to_string(),
        "--scratch",
        scratch.path().to_str().unwrap(),
        "-o",
        "json",
    ]));
    assert_eq!(tested["outcome"]["passed"], true, "{tested}");
    assert!(tested["segmentsReplayed"].as_u64().unwrap() > 0, "{tested}");
    let wrong = bin()
        .args(["restore-test", "--store", &url, "--cluster", "my"])
        .args(["--to", &at, "--query", "SELECT COUNT(*) FROM shop.orders"])
        .args([
            "--expect",
            "1",
            "--scratch",
            scratch.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!wrong.status.success(), "a wrong answer fails the test");
    assert!(
        String::from_utf8_lossy(&wrong.stdout).contains(&rows.to_string())
            || stderr(&wrong).contains(&rows.to_string()),
        "the answer is named: {}{}",
        String::from_utf8_lossy(&wrong.stdout),
        stderr(&wrong)
    );

    // Retention and verification on a MySQL store, unchanged in meaning: a newer clone,
    // then a pass two days on that keeps the newest only deletes the older clone and the
    // binlogs before the newer one; the store then verifies, and the newer clone restores.
    let newer = json(&tidemark(
        &[&push[..5], &["-o", "json"], &push[5..]].concat(),
    ));
    let (old_id, new_id) = (
        ls["backups"][0]["backupId"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        newer["backupId"].as_str().unwrap().to_owned(),
    );
    let later = (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(48)).to_string();
    let pass = |cmd: &str| {
        let mut args = vec![
            cmd,
            "--now",
            &later,
            "--window",
            "1d",
            "--keep-last",
            "1",
            "-o",
            "json",
        ];
        if cmd == "gc" {
            args.push("--allow-future-now");
        }
        json(&tidemark(&args))
    };
    let plan = pass("plan");
    let action = |id: &str| {
        plan["backups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["backupId"] == id)
            .map(|b| b["action"].clone())
            .unwrap_or_default()
    };
    assert_eq!(action(&new_id), "keep", "{plan}");
    assert_eq!(action(&old_id), "delete", "{plan}");
    assert!(
        !plan["segments"]["delete"].as_array().unwrap().is_empty(),
        "the binlogs before the newer clone go: {plan}"
    );
    pass("gc");
    let after = json(&tidemark(&["ls", "-o", "json"]));
    let ids: Vec<&str> = after["backups"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["backupId"].as_str())
        .collect();
    assert_eq!(ids, [new_id.as_str()], "{after}");
    tidemark(&["verify"]);
    let (_dir, datadir, _) = place();
    let out = tidemark(&[
        "restore",
        "--to",
        newer["completedAt"].as_str().unwrap(),
        "--datadir",
        datadir.to_str().unwrap(),
    ]);
    assert!(datadir.join("mysql.ibd").exists());
    // What to do next, in MySQL's words (it said mariadbd and MariaDB's gtid_binlog_state).
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("start mysqld with --datadir=")
            && said.contains("kept in the data directory (mysql.gtid_executed)")
            && !said.contains("mariadbd"),
        "{said}"
    );

    // The restore oracle on MySQL (issue 48): the archiver writes checksums with MySQL's
    // client (the session's binlog_format needs SESSION_VARIABLES_ADMIN there) after a
    // change the binlog never got, and a restore test of the newest instant names its
    // chunk — the row count and CHECK TABLE pass.
    db.sql(
        "SET SESSION sql_log_bin = 0; \
         GRANT REPLICATION SLAVE, REPLICATION CLIENT, SESSION_VARIABLES_ADMIN, SELECT ON *.* TO 'tidemark'@'127.0.0.1'; \
         GRANT CREATE, INSERT, UPDATE, DELETE ON tidemark_oracle.* TO 'tidemark'@'127.0.0.1'",
    );
    // The change the binlog never got, before the checksums: the primary's values have it.
    db.sql("SET SESSION sql_log_bin = 0; UPDATE shop.orders SET note = 'lost' WHERE id = 250");
    let login = store.path().join("oracle.cnf");
    std::fs::write(&login, "[client]\nuser=tidemark\npassword=clone-secret\n").unwrap();
    let spool = tempfile::tempdir().unwrap();
    let oracle = json(&tidemark(&[
        "archive-binlogs",
        "--from-server",
        "--engine",
        "mysql",
        "--spool",
        spool.path().to_str().unwrap(),
        "--once",
        "--checksums-every",
        "1h",
        "--checksum-pause",
        "0s",
        "--checksum-chunk-rows",
        "150",
        "--output",
        "json",
        "--",
        &format!("--defaults-extra-file={}", login.display()),
        "--host=127.0.0.1",
        &format!("--port={}", db.port),
    ]))["checksums"]
        .clone();
    assert_eq!(oracle["tables"], 1, "{oracle:#}");
    assert_eq!(
        oracle["chunks"], 3,
        "shop.orders' 401 rows by 150: {oracle:#}"
    );
    db.sql("INSERT INTO shop.orders VALUES (10000, 'last'); FLUSH BINARY LOGS");
    tidemark(&["archive-binlogs", "--binlog-index", index, "--once"]);
    let scratch = tempfile::tempdir_in(mysql::root().join("srv")).unwrap();
    let failed = bin()
        .args(["restore-test", "--store", &url, "--cluster", "my"])
        .args([
            "--query",
            "SELECT COUNT(*) FROM shop.orders",
            "--expect",
            "402",
        ])
        .args(["--scratch", scratch.path().to_str().unwrap(), "-o", "json"])
        .output()
        .unwrap();
    let failed = json(&failed);
    assert_eq!(failed["outcome"]["passed"], false, "{failed:#}");
    assert_eq!(failed["outcome"]["oracleChunks"], 3, "{failed:#}");
    assert_eq!(
        failed["outcome"]["problems"],
        serde_json::json!([
            "the restore oracle: shop.orders chunk 1 (keys above 150 up to 300): 150 rows, their content differs (the restored data is not the primary's there)"
        ]),
        "{failed:#}"
    );
}

/// Issue 47: with `--ssl-ca`, the source's certificate is verified — by the client that
/// asks it (`VERIFY_CA`), by a clone's recipient (`clone_ssl_ca`) and by mysqldump. Its own
/// CA (MySQL's generated `ca.pem`) lets the clone through; another CA is refused before
/// anything is copied, by a clone and by a dump.
#[test]
fn the_sources_certificate_is_verified_against_its_ca() {
    let db = source(10);
    db.sql(
        "CREATE USER 'dumper'@'127.0.0.1' IDENTIFIED BY 'clone-secret'; \
         GRANT SELECT, SHOW VIEW, TRIGGER, EVENT, RELOAD, REPLICATION CLIENT ON *.* TO 'dumper'@'127.0.0.1'",
    );
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let own = db.path(&format!("{}/ca.pem", db.datadir));
    let other = store.path().join("other-ca.pem");
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=another CA", "-keyout"])
        .arg(store.path().join("other-ca.key"))
        .arg("-out")
        .arg(&other)
        .output()
        .expect("openssl (Debian's openssl)");
    assert!(made.status.success(), "{}", stderr(&made));
    let push = |method: &str, ca: &Path| {
        let (client, user) = match method {
            "mysqldump" => ("mysqldump", "dumper"),
            _ => ("mysql", "tidemark"),
        };
        bin()
            .args(["push", "--store", &url, "--cluster", "my"])
            .args(["--backup-name", method, "--method", method, "--", client])
            .args(["--host=127.0.0.1", &format!("--port={}", db.port)])
            .args([&format!("--user={user}"), "--password=clone-secret"])
            .arg(format!("--ssl-ca={}", ca.display()))
            .output()
            .unwrap()
    };
    let out = push("mysql-clone", &own);
    assert!(out.status.success(), "{}", stderr(&out));
    for method in ["mysql-clone", "mysqldump"] {
        let out = push(method, &other);
        let said = stderr(&out);
        assert!(!out.status.success(), "{method} with another CA: {said}");
        assert!(
            said.to_ascii_lowercase().contains("certificate") || said.contains("SSL"),
            "{method}: {said}"
        );
    }
}

/// Issue 47: binlogs that would reach past the replay's rights — a `LOAD DATA` logged as a
/// statement (its data written by the decoder), a grant of every right — fail the restore
/// naming what was refused, and write nothing outside its scratch directory (no
/// `SQL_LOAD_MB-*` in the temporary directory).
#[test]
fn a_hostile_binlog_runs_nothing_and_writes_nothing_outside() {
    let tmp = tempfile::tempdir().unwrap();
    let hostile = [
        (
            "SET SESSION binlog_format = STATEMENT; LOAD DATA INFILE '{files}/rows.csv' INTO TABLE shop.orders FIELDS TERMINATED BY ','",
            "Loading local data is disabled",
        ),
        (
            "CREATE USER 'evil'@'%' IDENTIFIED BY 'x'; GRANT ALL ON *.* TO 'evil'@'%'",
            "denied",
        ),
    ];
    for (statement, says) in hostile {
        let db = source(10);
        std::fs::write(
            db.path(&format!("{}/files/rows.csv", db.dir)),
            "5001,loaded\n5002,loaded\n",
        )
        .unwrap();
        let store = tempfile::tempdir().unwrap();
        let url = format!("file://{}", store.path().display());
        let run = |args: &[&str]| {
            bin()
                .env("TMPDIR", tmp.path())
                .arg(args[0])
                .args(["--store", &url, "--cluster", "my"])
                .args(&args[1..])
                .output()
                .unwrap()
        };
        let mut push = vec![
            "push",
            "--backup-name",
            "nightly",
            "--method",
            "mysql-clone",
        ];
        let args = clone_args(&db);
        push.extend(args.iter().map(String::as_str));
        let out = run(&push);
        assert!(out.status.success(), "{}", stderr(&out));
        next_second();
        db.sql(&statement.replace("{files}", &format!("{}/files", db.dir)));
        next_second();
        let at = jiff::Timestamp::now().to_string();
        next_second();
        db.sql("INSERT INTO shop.orders VALUES (9999, 'after'); FLUSH BINARY LOGS");
        let index = db.path(&format!("{}/binlog.index", db.datadir));
        let out = run(&[
            "archive-binlogs",
            "--binlog-index",
            index.to_str().unwrap(),
            "--once",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let (_dir, datadir, _) = place();
        let out = run(&[
            "restore",
            "--to",
            &at,
            "--datadir",
            datadir.to_str().unwrap(),
        ]);
        let said = stderr(&out);
        assert!(!out.status.success(), "{statement}: restored");
        assert!(said.contains(says), "{statement}: {said}");
        assert!(!datadir.exists(), "no half-restored directory");
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().contains("SQL_LOAD"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(
            !Path::new("/tmp/SQL_LOAD_MB-1-0").exists(),
            "the decoder wrote into /tmp"
        );
    }
}

/// Waits until `replica` has applied everything `primary` has.
fn caught_up(primary: &MySql, replica: &MySql) {
    let want = primary.sql("SELECT @@gtid_executed").replace("\\n", "");
    for _ in 0..600 {
        let have = replica.sql("SELECT @@gtid_executed").replace("\\n", "");
        if have == want {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!(
        "the replica did not catch up with {want}: {}",
        replica.sql("SHOW REPLICA STATUS\\G")
    );
}

/// Issue 47: a clone of the primary, GTID replication to a replica, and a failover — the
/// old primary wrote a transaction the replica never got, then the replica was promoted
/// and wrote on. The archive follows the new primary onto a new timeline (MySQL's GTID sets
/// compared: its binlog's start is held, and what it shares with the old history is the
/// switch); restores before and after the failover hold exactly the rows committed on the
/// main line by then, never the old primary's lost transaction.
#[test]
fn a_failover_between_mysql_servers_keeps_the_window_whole() {
    let a = source(100);
    let b = MySql::start_with_id(2);
    a.sql("CREATE USER 'repl'@'127.0.0.1' IDENTIFIED BY 'repl-secret'; GRANT REPLICATION SLAVE ON *.* TO 'repl'@'127.0.0.1'");
    // The account the new primary's binlogs are read with over the network (replicated).
    a.sql("CREATE USER 'archiver'@'127.0.0.1' IDENTIFIED BY 'archive-secret'; GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'archiver'@'127.0.0.1'");
    b.sql(&format!(
        "CHANGE REPLICATION SOURCE TO SOURCE_HOST = '127.0.0.1', SOURCE_PORT = {}, SOURCE_USER = 'repl', SOURCE_PASSWORD = 'repl-secret', SOURCE_AUTO_POSITION = 1, GET_SOURCE_PUBLIC_KEY = 1; START REPLICA",
        a.port
    ));
    caught_up(&a, &b);
    let (uuid_a, uuid_b) = (a.sql("SELECT @@server_uuid"), b.sql("SELECT @@server_uuid"));
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let tidemark = |args: &[&str]| {
        bin()
            .arg(args[0])
            .args(["--store", &url, "--cluster", "my"])
            .args(&args[1..])
            .output()
            .unwrap()
    };
    let ok = |args: &[&str]| {
        let out = tidemark(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        out
    };
    let mut push = vec![
        "push",
        "--backup-name",
        "nightly",
        "--method",
        "mysql-clone",
    ];
    let args = clone_args(&a);
    push.extend(args.iter().map(String::as_str));
    ok(&push);
    let batch = |db: &MySql, n: u64| {
        let first = 100 * n + 1;
        db.sql(&format!(
            "INSERT INTO shop.orders WITH RECURSIVE n(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM n WHERE i < {}) SELECT i, 'batch {n}' FROM n",
            first + 99
        ));
    };
    let mut instants = Vec::new();
    for n in 1..=2 {
        next_second();
        batch(&a, n);
        next_second();
        instants.push((jiff::Timestamp::now().to_string(), 100 * (n + 1)));
        if n == 1 {
            // The replica's binlog rotates after the backup: the new timeline starts at
            // its newer file, and a replay from the backup takes the old primary's file
            // (with the transaction the replica never got) up to the switch.
            caught_up(&a, &b);
            b.sql("FLUSH BINARY LOGS");
            // A clone of the replica: it restores past its completion with the primary's
            // binlogs, by GTID (its set is the primary's transactions it applied).
            b.sql("INSTALL PLUGIN clone SONAME 'mysql_clone.so'");
            let mut push = vec![
                "push",
                "--backup-name",
                "replica",
                "--method",
                "mysql-clone",
            ];
            let args = clone_args(&b);
            push.extend(args.iter().map(String::as_str));
            ok(&push);
        }
    }
    caught_up(&a, &b);
    // The old primary's last transaction, which the replica never receives.
    b.sql("STOP REPLICA");
    next_second();
    a.sql("INSERT INTO shop.orders VALUES (999, 'lost with the old primary')");
    // The failover: the replica is promoted and writes on.
    b.sql("RESET REPLICA ALL");
    next_second();
    batch(&b, 3);
    next_second();
    instants.push((jiff::Timestamp::now().to_string(), 400));
    next_second();
    // The old primary, not yet fenced, writes once more, after that instant, in the same
    // file: a replay that stopped at that event for good would never reach the new
    // primary's batch.
    a.sql("INSERT INTO shop.orders VALUES (998, 'split brain'); FLUSH BINARY LOGS");
    let index = |db: &MySql| {
        db.path(&format!("{}/binlog.index", db.datadir))
            .to_string_lossy()
            .into_owned()
    };
    ok(&["archive-binlogs", "--binlog-index", &index(&a), "--once"]);
    b.sql("INSERT INTO shop.orders VALUES (9999, 'after the last instant'); FLUSH BINARY LOGS");
    // The new primary's binlogs are read over the network, as a replica client: its first
    // file is found by its Previous_gtids, and its timeline starts where the local
    // archiver's would.
    let spool = tempfile::tempdir().unwrap();
    let login = spool.path().join("archiver.cnf");
    std::fs::write(&login, "[client]\npassword=archive-secret\n").unwrap();
    let login_arg = format!("--defaults-extra-file={}", login.display());
    let port = format!("--port={}", b.port);
    let spooled = spool.path().join("spool");
    let from_server = [
        "archive-binlogs",
        "--from-server",
        "--engine",
        "mysql",
        "--spool",
        spooled.to_str().unwrap(),
        "--once",
        "--",
        &login_arg,
        "--host=127.0.0.1",
        &port,
        "--user=archiver",
    ];
    // Not MariaDB: refused by name without --engine mysql.
    let wrong: Vec<&str> = from_server
        .iter()
        .copied()
        .filter(|a| *a != "--engine" && *a != "mysql")
        .collect();
    let out = tidemark(&wrong);
    assert!(!out.status.success(), "a MySQL server read as MariaDB");
    assert!(stderr(&out).contains("--engine mysql"), "{}", stderr(&out));
    ok(&from_server);

    // The old primary, still writing, is not archived: its binlog holds nothing the new
    // primary wrote, so its history would take the main line from the one the cluster
    // follows.
    a.sql("INSERT INTO shop.orders VALUES (997, 'split brain, later'); FLUSH BINARY LOGS");
    let stale = tidemark(&["archive-binlogs", "--binlog-index", &index(&a), "--once"]);
    assert!(!stale.status.success(), "the old primary was archived");
    assert!(
        stderr(&stale).contains("holds nothing of timeline 1"),
        "{}",
        stderr(&stale)
    );
    let ls = json(&ok(&["ls", "-o", "json"]));
    let timelines = ls["archive"]["timelines"].as_array().unwrap();
    assert_eq!(timelines.len(), 2, "{ls}");
    assert_eq!(timelines[1]["serverId"], 2, "{ls}");
    assert_eq!(timelines[1]["parent"], 0, "{ls}");
    assert_ne!(
        timelines[1]["switch"]["unrelated"], true,
        "the histories join: {ls}"
    );
    assert_eq!(ls["recoveryWindow"]["gaps"], serde_json::json!([]), "{ls}");

    let check = |i: usize, at: &str, rows: u64| {
        let (dir, datadir, inside) = place();
        let report = json(&ok(&[
            "restore",
            "--to",
            at,
            "--datadir",
            datadir.to_str().unwrap(),
            "-o",
            "json",
        ]));
        let server = start_restored(dir.path(), &inside);
        assert_eq!(
            server.sql("SELECT COUNT(*), MAX(id), SUM(id IN (998, 999)) FROM shop.orders"),
            format!("{rows}\t{rows}\t0"),
            "at {at} (instant {i}): {report}"
        );
        let executed = server.sql("SELECT @@gtid_executed").replace("\\n", "");
        assert_eq!(
            executed,
            report["gtidPosition"].as_str().unwrap(),
            "{report}"
        );
        assert_eq!(
            executed.contains(&uuid_b),
            i == 2,
            "the new primary's transactions only after the failover: {executed}"
        );
        assert!(executed.contains(&uuid_a), "{executed}");
        report
    };
    for (i, (at, rows)) in instants.iter().enumerate() {
        let report = check(i, at, *rows);
        if i > 0 {
            assert_eq!(
                report["backups"][0]["backupName"], "replica",
                "the replica's clone, restored past its completion: {report}"
            );
            assert!(
                report["segments"].as_array().is_some_and(|s| !s.is_empty()),
                "{report}"
            );
        }
    }
    // Without the replica's clone, the instant after the failover is restored from the
    // old primary's: its file up to the switch (the lost transaction excluded), then the
    // new primary's.
    let replica = store.path().join("my/replica");
    assert!(replica.is_dir(), "{}", replica.display());
    std::fs::remove_dir_all(&replica).unwrap();
    let (at, rows) = &instants[2];
    let report = check(2, at, *rows);
    assert_eq!(report["backups"][0]["backupName"], "nightly", "{report}");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "across the switch: {report}");
}

/// `--` and mysqldump's options for the source, as the account `dumper` (the rights a
/// consistent dump needs, and no more).
fn dump_args(db: &MySql) -> Vec<String> {
    db.sql(
        "CREATE USER IF NOT EXISTS 'dumper'@'127.0.0.1' IDENTIFIED BY 'dump-secret'; \
         GRANT SELECT, SHOW VIEW, TRIGGER, EVENT, RELOAD, REPLICATION CLIENT ON *.* TO 'dumper'@'127.0.0.1'",
    );
    vec![
        "--".into(),
        "mysqldump".into(),
        "--host=127.0.0.1".into(),
        format!("--port={}", db.port),
        "--user=dumper".into(),
        "--password=dump-secret".into(),
    ]
}

/// Issue 47: `push --method mysqldump` under a steady write load records the snapshot's
/// GTID set (exactly the load's rows it holds) and binlog position;
/// the dump restores to its own point and, with the binlogs archived after it, to two later
/// instants, each with exactly the rows committed by then (a blob of every byte, a name
/// that needs quoting, a second database) and the GTIDs of those transactions; the
/// restored server's root must set a password first; a restore test passes on it.
#[test]
fn a_mysqldump_backup_restores_to_any_instant() {
    let db = source(100);
    db.sql(
        "CREATE DATABASE `crm-eu`; CREATE TABLE `crm-eu`.`odd name` (id INT PRIMARY KEY, b BLOB); \
         INSERT INTO `crm-eu`.`odd name` VALUES (1, UNHEX(CONCAT('00FF0A0D5C27', REPEAT('41', 3000))))",
    );
    let blob = db.sql("SELECT HEX(b) FROM `crm-eu`.`odd name`");
    let uuid = db.sql("SELECT @@server_uuid");
    let args = dump_args(&db);
    // A steady write load through the dump: one transaction per row of shop.load.
    db.sql("CREATE TABLE shop.load (id BIGINT PRIMARY KEY)");
    let setup = 13;
    let (mut session, mut stdin) = db.session();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            use std::io::Write as _;
            let mut id = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                id += 1;
                writeln!(stdin, "INSERT INTO shop.load VALUES ({id});").unwrap();
                stdin.flush().unwrap();
                if id.is_multiple_of(50) {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
        })
    };
    let load_rows = || -> u64 { db.sql("SELECT COUNT(*) FROM shop.load").parse().unwrap() };
    while load_rows() < 200 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let tidemark = |args: &[&str]| {
        let out = bin()
            .env("TIDEMARK_COMPRESSION", "zstd")
            .arg(args[0])
            .args(["--store", &url, "--cluster", "my"])
            .args(&args[1..])
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        out
    };
    let mut push = vec![
        "push",
        "--backup-name",
        "nightly",
        "--method",
        "mysqldump",
        "-o",
        "json",
    ];
    push.extend(args.iter().map(String::as_str));
    // A view names its definer: a restore could not load it, so the backup is refused.
    db.sql("CREATE VIEW shop.v AS SELECT id FROM shop.orders");
    let refused = bin()
        .args([push[0], "--store", &url, "--cluster", "my"])
        .args(&push[1..])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "a source with a view was dumped");
    assert!(
        stderr(&refused).contains("1 view(s)"),
        "{}",
        stderr(&refused)
    );
    db.sql("DROP VIEW shop.v");
    let pushed = json(&tidemark(&push));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        session.wait().unwrap().success(),
        "the write session failed"
    );
    let loaded = load_rows();
    assert_eq!(pushed["phase"], "completed", "{pushed}");
    let id = pushed["backupId"].as_str().unwrap().to_owned();
    // (The refused attempt left its record too.)
    let record = find(store.path(), "metadata.json")
        .into_iter()
        .find(|p| p.to_string_lossy().contains(&id))
        .unwrap();
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert_eq!(m["backupId"], id.as_str(), "{m}");
    assert_eq!(m["method"], "mysqldump", "{m}");
    // The dump holds the transactions up to a point mid-load: rows 1..=n of shop.load.
    let at_backup = m["gtidExecuted"].as_str().unwrap().to_owned();
    let dumped: u64 = at_backup
        .strip_prefix(&format!("{uuid}:1-"))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{m}"))
        - setup;
    assert!(
        (200..=loaded).contains(&dumped),
        "{dumped} of {loaded}: {m}"
    );
    assert_eq!(m["server"]["serverUuid"], uuid.as_str(), "{m}");
    assert_eq!(m["payload"][0]["name"], "backup.sql.zst", "{m}");
    let binlog = db.sql("SHOW BINARY LOG STATUS");
    assert_eq!(
        m["logPosition"]["file"],
        binlog.split('\t').next().unwrap(),
        "{m}"
    );
    assert!(m["logPosition"]["position"].as_u64().unwrap() > 4, "{m}");
    let completed = m["completedAt"].as_str().unwrap().to_owned();

    // Restores to `at`, and checks the rows of shop.orders and the blob; returns the rows
    // of the load the data holds, once they are checked against its GTIDs: exactly the
    // load's first n transactions, for n rows.
    let restore_to = |at: &str, rows: u64, note: &str| -> u64 {
        let (dir, datadir, inside) = place();
        let report = json(&tidemark(&[
            "restore",
            "--to",
            at,
            "--datadir",
            datadir.to_str().unwrap(),
            "-o",
            "json",
        ]));
        let holds = report["gtidPosition"].as_str().unwrap().to_owned();
        let server = start_restored(dir.path(), &inside);
        // root's empty password has expired: the first statement sets one.
        server.sql_expired("ALTER USER 'root'@'localhost' IDENTIFIED BY ''");
        assert_eq!(
            server.sql("SELECT COUNT(*), MAX(id), (SELECT note FROM shop.orders WHERE id = 1) FROM shop.orders"),
            format!("{rows}\t{rows}\t{note}"),
            "at {at}: {report}"
        );
        assert_eq!(
            server.sql("SELECT HEX(b) FROM `crm-eu`.`odd name`"),
            blob,
            "every byte of the blob"
        );
        // (Less the restored server's own transaction: the password it was given.)
        let own = server.sql("SELECT @@server_uuid");
        let executed = server
            .sql("SELECT @@gtid_executed")
            .replace("\\n", "")
            .split(',')
            .filter(|g| !g.starts_with(&own))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(executed, holds, "the report says what the data holds");
        let load: u64 = server
            .sql("SELECT COUNT(*) FROM shop.load")
            .parse()
            .unwrap();
        assert_eq!(
            server.sql("SELECT COALESCE(MAX(id), 0) FROM shop.load"),
            load.to_string()
        );
        let batches = (rows - 100) / 50;
        assert_eq!(
            executed,
            format!("{uuid}:1-{}", setup + load + batches),
            "at {at}: the data holds exactly the transactions its GTIDs say"
        );
        let accounts = server.sql("SELECT GROUP_CONCAT(user ORDER BY user) FROM mysql.user");
        assert!(!accounts.contains("tidemark"), "{accounts}");
        assert!(!accounts.contains("dumper"), "{accounts}");
        load
    };
    // The dump alone: its own point.
    assert_eq!(restore_to(&completed, 100, "order 1"), dumped);

    let index = db.path(&format!("{}/binlog.index", db.datadir));
    let index = index.to_str().unwrap();
    let mut instants = Vec::new();
    for batch in 1..=2u64 {
        next_second();
        let first = 100 * batch + 1;
        db.sql(&format!(
            "INSERT INTO shop.orders WITH RECURSIVE n(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM n WHERE i < {}) SELECT i, 'later' FROM n; UPDATE shop.orders SET note = 'batch {batch}' WHERE id = 1",
            first + 99
        ));
        next_second();
        instants.push((jiff::Timestamp::now(), 100 * (batch + 1)));
        next_second();
    }
    db.sql("INSERT INTO shop.orders VALUES (9999, 'after the last instant'); FLUSH BINARY LOGS");
    tidemark(&["archive-binlogs", "--binlog-index", index, "--once"]);
    // With the binlogs: the same instant holds what was committed by then (the load went
    // on while the dump's head was written), and every later instant all of the load.
    let at_completion = restore_to(&completed, 100, "order 1");
    assert!(
        (dumped..=loaded).contains(&at_completion),
        "{at_completion} of {dumped}..={loaded}"
    );
    for (i, (at, rows)) in instants.iter().enumerate() {
        let load = restore_to(&at.to_string(), *rows, &format!("batch {}", i + 1));
        assert_eq!(load, loaded, "at {at}");
    }
    let scratch = tempfile::tempdir_in(mysql::root().join("srv")).unwrap();
    let (at, rows) = instants[0];
    let tested = json(&tidemark(&[
        "restore-test",
        "--to",
        &at.to_string(),
        "--query",
        "SELECT COUNT(*) FROM shop.orders",
        "--expect",
        &rows.to_string(),
        "--scratch",
        scratch.path().to_str().unwrap(),
        "-o",
        "json",
    ]));
    assert_eq!(tested["outcome"]["passed"], true, "{tested}");
}

/// A dump forged in the store (a bucket writer's, under a metadata.json that names
/// mysqldump and the forged bytes' checksum) runs no client command and holds no right
/// beyond the load's: each statement fails the restore naming what was refused, and no
/// file appears — not in a directory every user may write, where the private server could.
#[test]
fn a_forged_dump_runs_nothing_and_writes_nothing_outside() {
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let work = tempfile::tempdir().unwrap();
    let open = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let at = |name: &str| open.path().join(name).display().to_string();
    let cases = [
        // Client commands: a shell, a file written, a file read.
        (format!("\\! touch {}\n", at("shell")), "Unknown command '\\!'"),
        (
            format!(
                "system touch {}\ntee {}\nsource /etc/passwd\nSELECT 1;\n",
                at("system"),
                at("tee")
            ),
            "ERROR 1064",
        ),
        (
            format!("SELECT 'x' INTO OUTFILE '{}';\n", at("outfile")),
            "FILE privilege",
        ),
        (
            format!(
                "SET GLOBAL general_log_file = '{}'; SET GLOBAL general_log = ON;\n",
                at("general")
            ),
            "SYSTEM_VARIABLES_ADMIN",
        ),
        (
            "CREATE DATABASE shop; CREATE DEFINER = 'root'@'localhost' PROCEDURE shop.p() SELECT 1;\n"
                .to_owned(),
            "SET_ANY_DEFINER",
        ),
        (
            "CREATE TABLE mysql.forged (id INT);\n".to_owned(),
            "denied",
        ),
        // An account that would outlive the load: a dump holds none.
        (
            "CREATE USER 'forged'@'%' IDENTIFIED BY 'pw';\n".to_owned(),
            "CREATE USER",
        ),
        (
            "CREATE DATABASE shop; CREATE TABLE shop.t (l TEXT); LOAD DATA LOCAL INFILE '/etc/passwd' INTO TABLE shop.t;\n"
                .to_owned(),
            "local",
        ),
    ];
    for (i, (sql, says)) in cases.iter().enumerate() {
        let id = format!("20261130T12000{i}Z-0000000{i}");
        let (completed, meta) = forge(store.path(), work.path(), &id, sql.as_bytes(), "mysqldump");

        let (_dir, datadir, _) = place();
        let out = bin()
            .args(["restore", "--store", &url, "--cluster", "my"])
            .args(["--to", &completed, "--datadir", datadir.to_str().unwrap()])
            .output()
            .unwrap();
        let said = stderr(&out);
        assert!(!out.status.success(), "{sql}: restored");
        assert!(said.contains(says), "{sql}: {said}");
        assert!(!datadir.exists(), "the half-restored directory is removed");
        let left: Vec<_> = std::fs::read_dir(open.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{sql}: {left:?}");
        std::fs::remove_file(meta).unwrap();
    }
}
