//! `tidemark push` and `tidemark fetch` with the real binary, against a local directory
//! and a real S3 server (SeaweedFS on 127.0.0.1).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{bin, find, json, stderr};

use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};

use serde_json::Value;
use sha2::{Digest, Sha256};
use tidemark_store::testkit::SeaweedFs;

/// Runs tidemark with `stdin` fed in.
fn run_with_input(args: &[&str], env: &[(&str, String)], stdin: &[u8]) -> Output {
    let mut child = bin()
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

fn run(args: &[&str], env: &[(&str, String)]) -> Output {
    run_with_input(args, env, b"")
}

/// `tidemark push` of `data` to `url`'s cluster `db1` as backup `name` with `args`; must
/// succeed. Its JSON output.
fn push_json(url: &str, name: &str, args: &[&str], data: &[u8]) -> Value {
    let mut all = vec![
        "push",
        "--store",
        url,
        "--cluster",
        "db1",
        "--backup-name",
        name,
        "--output",
        "json",
    ];
    all.extend_from_slice(args);
    let out = run_with_input(&all, &[], data);
    assert!(out.status.success(), "{}", stderr(&out));
    json(&out)
}

/// A backup's `status` in `verify`'s JSON report, if it is there.
fn verify_status(v: &Value, id: &str) -> Option<String> {
    v["backups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["backupId"] == id)
        .map(|b| b["status"].as_str().unwrap().to_owned())
}

/// Deterministic pseudo-random bytes (incompressible enough, no RNG dependency).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// push (stdin) → metadata as documented → fetch (stdout and file) gives the same bytes.
fn round_trip(url: &str, env: &[(&str, String)], size: usize) {
    let data = bytes(size, 7);
    let out = run_with_input(
        &[
            "push",
            "--store",
            url,
            "--cluster",
            "db1",
            "--backup-name",
            "nightly",
            "--ext",
            "xbstream",
            "--label",
            "team=payments",
            "--ttl",
            "30d",
            "--output",
            "json",
        ],
        env,
        &data,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    let id = v["backupId"].as_str().unwrap().to_owned();
    assert!(tidemark_core::inventory::is_backup_id(&id), "{id}");
    assert_eq!(v["phase"], "completed");
    assert_eq!(v["size"], size as u64);
    assert_eq!(v["sha256"], sha(&data));
    assert_eq!(
        v["key"],
        format!("db1/nightly/{id}/backup.xbstream").as_str()
    );

    // stdout
    let out = run(
        &[
            "fetch",
            "--store",
            url,
            "--cluster",
            "db1",
            "--backup-id",
            &id,
        ],
        env,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout == data, "fetched bytes differ");

    // a file, with the backup name given
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("restore.xbstream");
    let out = run(
        &[
            "fetch",
            "--store",
            url,
            "--cluster",
            "db1",
            "--backup-id",
            &id,
            "--backup-name",
            "nightly",
            "--out",
            file.to_str().unwrap(),
        ],
        env,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(&file).unwrap() == data);

    // An incremental on top, from a command's stdout; table mode prints only the id.
    let out = run(
        &[
            "push",
            "--store",
            url,
            "--cluster",
            "db1",
            "--backup-name",
            "nightly",
            "--type",
            "incremental",
            "--parent",
            &id,
            "--",
            "sh",
            "-c",
            "printf increment",
        ],
        env,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let inc = String::from_utf8(out.stdout).unwrap();
    assert!(
        tidemark_core::inventory::is_backup_id(inc.trim()),
        "{inc:?}"
    );
    let ls = run(
        &["ls", "--store", url, "--cluster", "db1", "--output", "json"],
        env,
    );
    let v = json(&ls);
    let backups = v["backups"].as_array().unwrap();
    assert_eq!(backups.len(), 2);
    assert!(backups.iter().all(|b| b["restorable"] == true), "{v}");
    assert!(backups.iter().any(|b| b["parentId"] == id.as_str()), "{v}");
}

#[test]
fn push_and_fetch_round_trip_on_a_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    round_trip(&url, &[], 3 << 20);
    // The full backup's metadata (the incremental's id may sort first within a second).
    let metas: Vec<Value> = find(dir.path(), "metadata.json")
        .iter()
        .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
        .collect();
    let m = metas.iter().find(|m| m["type"] == "full").unwrap();
    assert_eq!(m["formatVersion"], 1);
    assert_eq!(m["labels"]["team"], "payments");
    assert_eq!(m["ttl"], "30d");
    assert_eq!(m["method"], "stdin");
}

#[test]
fn push_and_fetch_round_trip_on_s3_with_multipart() {
    let server = SeaweedFs::start();
    // 40 MiB: three parts of 16 MiB.
    round_trip(&server.url(), &server.env(), 40 << 20);
}

/// `az://` with the real binary (issue 19 §5): Azurite, reached as a pod reaches Azure
/// (`AZURE_STORAGE_ACCOUNT_NAME|KEY`, `AZURE_STORAGE_ENDPOINT`), 40 MiB in blocks.
#[test]
fn push_and_fetch_round_trip_on_azurite() {
    let server = tidemark_store::testkit::Azurite::start();
    round_trip(&server.url(), &server.env(), 40 << 20);
}

/// `gs://` with the real binary (issue 19 §5): a GCS emulator, reached as a pod reaches
/// GCS (`GOOGLE_SERVICE_ACCOUNT_KEY`, its requests signed with the key), 40 MiB in XML
/// multipart parts; the key also as a file (`GOOGLE_SERVICE_ACCOUNT_PATH`). A key of
/// another private key is refused (401), naming the store.
#[test]
fn push_and_fetch_round_trip_on_gcs() {
    let server = tidemark_store::testkit::GcsEmulator::start();
    round_trip(&server.url(), &server.env(), 40 << 20);
    let ls = |key: String| {
        run(
            &["ls", "--store", &server.url(), "--cluster", "db1"],
            &[("GOOGLE_SERVICE_ACCOUNT_KEY", key)],
        )
    };
    let out = ls(server.key());
    assert!(out.status.success(), "{}", stderr(&out));
    // The key as a file (GOOGLE_SERVICE_ACCOUNT_PATH), read once, bounded, regular files
    // only.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key.json");
    std::fs::write(&file, server.key()).unwrap();
    let ls_file = |path: &Path| {
        run(
            &["ls", "--store", &server.url(), "--cluster", "db1"],
            &[("GOOGLE_SERVICE_ACCOUNT_PATH", path.display().to_string())],
        )
    };
    let out = ls_file(&file);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ls_file(dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is not a regular file"),
        "{}",
        stderr(&out)
    );
    let out = ls(server.foreign_key());
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("gs://tidemark") && err.contains("401"),
        "{err}"
    );
}

#[test]
fn a_failing_command_is_recorded_as_failed_and_leaves_no_payload() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let out = run(
        &[
            "push",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-name",
            "nightly",
            "--output",
            "json",
            "--",
            "sh",
            "-c",
            "echo half a backup; exit 3",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["phase"], "failed");
    let err = v["error"].as_str().unwrap();
    assert!(err.contains("exited with status 3"), "{err}");
    assert!(err.contains("sh -c 'echo half a backup; exit 3'"), "{err}");
    let id = v["backupId"].as_str().unwrap();
    let backup_dir = dir.path().join("db1/nightly").join(id);
    let names: Vec<String> = std::fs::read_dir(&backup_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["metadata.json"], "the payload is cleaned up");

    // A command that cannot start is a failure too.
    let out = run(
        &[
            "push",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-name",
            "nightly",
            "--",
            "/nonexistent/backup-tool",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot run \"/nonexistent/backup-tool\""));

    // Fetching a failed backup is refused.
    let out = run(
        &[
            "fetch",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-id",
            id,
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("recorded as failed"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_corrupt_payload_is_an_error_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let data = bytes(100_000, 3);
    let out = run_with_input(
        &[
            "push",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-name",
            "nightly",
        ],
        &[],
        &data,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let payload = dir.path().join("db1/nightly").join(&id).join("backup.bin");
    let mut bad = data.clone();
    bad[5000] ^= 1;
    std::fs::write(&payload, &bad).unwrap();

    let target = dir.path().join("out.bin");
    let out = run(
        &[
            "fetch",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-id",
            &id,
            "--out",
            target.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("sha256"), "{}", stderr(&out));
    assert!(!target.exists(), "no partial file");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with(".tidemark-fetch"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A missing payload is an error too.
    std::fs::remove_file(&payload).unwrap();
    let out = run(
        &[
            "fetch",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-id",
            &id,
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("its payload is gone"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_push_input_names_the_value_and_the_form() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let base = ["push", "--store", url.as_str(), "--cluster", "db1"];
    let cases: &[(&[&str], &str)] = &[
        (&["--backup-name", "_x"], "invalid backup name \"_x\""),
        (&["--backup-name", "a/b"], "invalid backup name \"a/b\""),
        (
            &["--backup-name", "n", "--backup-id", "yesterday"],
            "invalid backup-id \"yesterday\": expected <UTC start YYYYMMDDTHHMMSSZ>-<8 lowercase hex>",
        ),
        (
            &["--backup-name", "n", "--type", "incremental"],
            "--type incremental needs --parent ID",
        ),
        (
            &[
                "--backup-name",
                "n",
                "--type",
                "incremental",
                "--parent",
                "20261120T020000Z-3f2a9c1d",
            ],
            "--parent 20261120T020000Z-3f2a9c1d: no committed backup with this id",
        ),
        (&["--backup-name", "n", "--ttl", "7"], "--ttl"),
        (
            &["--backup-name", "n", "--label", "novalue"],
            "expected KEY=VALUE",
        ),
        (
            &["--backup-name", "n", "--ext", "../x"],
            "invalid --ext \"../x\"",
        ),
    ];
    for (extra, want) in cases {
        let mut args: Vec<&str> = base.to_vec();
        args.extend_from_slice(extra);
        let out = run_with_input(&args, &[], b"data");
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{extra:?}: {}", stderr(&out));
    }
    assert!(
        find(dir.path(), "metadata.json").is_empty(),
        "nothing written"
    );
}

/// `n` synthetic binlogs of ten minutes each in `dir` and their index
/// (`mysql-bin.index`, returned): the last is the one a server would still be writing.
fn binlogs(dir: &Path, n: i64) -> std::path::PathBuf {
    let t0 = 1_763_600_000i64;
    let mut index = String::new();
    for k in 1..=n {
        let name = format!("mysql-bin.{k:06}");
        let start = t0 + (k - 1) * 600;
        std::fs::write(
            dir.join(&name),
            tidemark_mariadb::binlog::synthetic(&[start, start + 599], 32),
        )
        .unwrap();
        index.push_str(&format!("{}\n", dir.join(&name).display()));
    }
    let index_path = dir.join("mysql-bin.index");
    std::fs::write(&index_path, index).unwrap();
    index_path
}

#[test]
fn archive_binlogs_once_ships_closed_files_and_ls_shows_them() {
    let store_dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store_dir.path().display());
    let server = tempfile::tempdir().unwrap();
    let index_path = binlogs(server.path(), 4);
    let args = [
        "archive-binlogs",
        "--store",
        url.as_str(),
        "--cluster",
        "db1",
        "--binlog-index",
        index_path.to_str().unwrap(),
        "--once",
    ];
    let out = run(&args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("archived 3 binlog(s)")
            && text.contains("mysql-bin.000004 is still being written"),
        "{text}"
    );
    let mut again: Vec<&str> = args.to_vec();
    again.extend(["--output", "json"]);
    let v = json(&run(&again, &[]));
    assert_eq!(v["uploaded"].as_array().unwrap().len(), 0);
    assert_eq!(v["alreadyIndexed"], 3);

    let ls = json(&run(
        &[
            "ls",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--output",
            "json",
        ],
        &[],
    ));
    assert_eq!(ls["archive"]["segments"], 3);
    assert_eq!(ls["archive"]["last"], "mysql-bin.000003");

    // Bad input: a missing index file, a bad interval.
    let out = run(
        &[
            "archive-binlogs",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--binlog-index",
            "/nonexistent/mysql-bin.index",
            "--once",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("/nonexistent/mysql-bin.index"));
    let out = run(
        &[
            "archive-binlogs",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--binlog-index",
            index_path.to_str().unwrap(),
            "--interval",
            "often",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("invalid --interval \"often\""));
}

/// `archive-binlogs` watching: a SIGTERM that arrives while a pass runs ends the watch as
/// soon as that pass is done — it was lost (the listener lived only between passes), so the
/// process went on until killed: the archiver Deployment's rollouts waited out the whole
/// grace period for it.
#[test]
fn archive_binlogs_stops_on_a_sigterm_sent_during_a_pass() {
    let s3 = SeaweedFs::start();
    let (mut child, _server) = watching_archiver(&s3, "sig");
    // The store stops answering: the next pass (within a second) hangs in it; the signal
    // comes while it does; then the store answers again and the pass ends.
    s3.pause();
    std::thread::sleep(std::time::Duration::from_secs(3));
    terminate(&child);
    std::thread::sleep(std::time::Duration::from_millis(500));
    s3.resume();
    let status = ended_within(&mut child, 60);
    let out = child.wait_with_output().unwrap();
    assert!(status.success(), "exit {status:?}");
    // The pass finished: it was not cut short.
    assert!(!stderr(&out).contains("had not ended"), "{}", stderr(&out));
}

/// A pass that does not end after a SIGTERM (a store that stays silent; its retries take
/// minutes) is cut short 10 s after the signal: the watch stops in the middle of it and
/// says so, so a pod's rollout never waits out its grace period (30 s) for it.
#[test]
fn archive_binlogs_cuts_a_hung_pass_short_after_a_sigterm() {
    let s3 = SeaweedFs::start();
    let (mut child, _server) = watching_archiver(&s3, "hung");
    s3.pause();
    std::thread::sleep(std::time::Duration::from_secs(3));
    terminate(&child);
    // Well before the store's own retries give up; the store stays silent throughout.
    let status = ended_within(&mut child, 25);
    s3.resume();
    let out = child.wait_with_output().unwrap();
    assert!(status.success(), "exit {status:?}");
    assert!(
        stderr(&out).contains("had not ended 10 s after the signal"),
        "{}",
        stderr(&out)
    );
}

/// An `archive-binlogs` watch of a binlog index (every second) on `s3` for `cluster`, once
/// its first pass has shipped the closed file; the directory of the index with it.
fn watching_archiver(s3: &SeaweedFs, cluster: &str) -> (std::process::Child, tempfile::TempDir) {
    let server = tempfile::tempdir().unwrap();
    let index_path = binlogs(server.path(), 2);
    let store = [
        "--store",
        &s3.url(),
        "--cluster",
        cluster,
        "--endpoint",
        &s3.endpoint,
    ]
    .map(str::to_owned);
    let child = bin()
        .envs(s3.env())
        .arg("archive-binlogs")
        .args(&store)
        .args(["--binlog-index", index_path.to_str().unwrap()])
        .args(["--interval", "1s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let ls = json(
            &bin()
                .envs(s3.env())
                .arg("ls")
                .args(&store)
                .args(["--output", "json"])
                .output()
                .unwrap(),
        );
        if ls["archive"]["segments"] == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no pass archived: {ls}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    (child, server)
}

fn terminate(child: &std::process::Child) {
    let pid = child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
}

/// How `child` ended, once it has, within `secs` seconds (else it is killed and the test
/// fails with its stderr).
fn ended_within(child: &mut std::process::Child, secs: u64) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read as _;
                let _ = e.read_to_string(&mut err);
            }
            panic!("archive-binlogs still running {secs} s after SIGTERM: {err}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Compression on the stream (issue 19 §1): `push --compression zstd:5` stores
/// `backup.xbstream.zst` with `compression` and `originalSize` in `metadata.json` (size and
/// sha256 are the stored object's); `fetch` gives back the exact bytes; a byte changed in
/// the store is a checksum error, a compression this version does not read is named;
/// a bad setting exits 2 naming the value and the accepted form.
#[test]
fn compressed_payloads_round_trip_and_damage_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    // Compressible: a small alphabet.
    let data: Vec<u8> = bytes(6 << 20, 11).iter().map(|b| b'a' + b % 16).collect();
    let push = |args: &[&str], env: &[(&str, String)]| {
        let mut all = vec![
            "push",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-name",
            "nightly",
            "--ext",
            "xbstream",
            "--output",
            "json",
        ];
        all.extend_from_slice(args);
        run_with_input(&all, env, &data)
    };
    let out = push(&["--compression", "zstd:5"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    let id = v["backupId"].as_str().unwrap().to_owned();
    assert_eq!(v["compression"], "zstd", "{v}");
    assert_eq!(v["originalSize"], data.len() as u64, "{v}");
    assert_eq!(
        v["key"],
        format!("db1/nightly/{id}/backup.xbstream.zst").as_str()
    );
    let stored_path = dir
        .path()
        .join(format!("db1/nightly/{id}/backup.xbstream.zst"));
    let stored = std::fs::read(&stored_path).unwrap();
    assert!(stored.len() < data.len() * 2 / 3, "{} bytes", stored.len());
    assert_eq!(v["size"], stored.len() as u64);
    assert_eq!(v["sha256"], sha(&stored));
    let meta: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join(format!("db1/nightly/{id}/metadata.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(meta["payload"][0]["compression"], "zstd", "{meta}");
    assert_eq!(meta["payload"][0]["originalSize"], data.len() as u64);
    let fetch = |id: &str| {
        run(
            &[
                "fetch",
                "--store",
                &url,
                "--cluster",
                "db1",
                "--backup-id",
                id,
            ],
            &[],
        )
    };
    let out = fetch(&id);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout == data, "the fetched content differs");

    // The environment sets it too; an uncompressed backup beside it reads as before.
    let out = push(&[], &[("TIDEMARK_COMPRESSION", "zstd".into())]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["compression"], "zstd");
    let out = push(&["--compression", "none"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plain = json(&out);
    assert!(plain.get("compression").is_none(), "{plain}");
    let out = fetch(plain["backupId"].as_str().unwrap());
    assert!(
        out.status.success() && out.stdout == data,
        "{}",
        stderr(&out)
    );

    // A byte changed in the store: the stored bytes' checksum says so.
    let mut damaged = stored.clone();
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0x5a;
    std::fs::write(&stored_path, &damaged).unwrap();
    let out = fetch(&id);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("backup.xbstream.zst") && err.contains("sha256"),
        "{err}"
    );
    std::fs::write(&stored_path, &stored).unwrap();

    // A compression this version does not read is named, not guessed at.
    let meta_path = dir.path().join(format!("db1/nightly/{id}/metadata.json"));
    let mut m = meta.clone();
    m["payload"][0]["compression"] = "lz4".into();
    std::fs::write(&meta_path, serde_json::to_vec(&m).unwrap()).unwrap();
    let out = fetch(&id);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("\"lz4\"") && err.contains("cannot read"),
        "{err}"
    );

    // Bad settings.
    for bad in ["zstd:20", "gzip", "zstd:"] {
        let out = push(&["--compression", bad], &[]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = stderr(&out);
        assert!(
            err.contains(bad) && err.contains("zstd:<level>"),
            "{bad}: {err}"
        );
    }
}

/// Client-side encryption (issue 19 §2) with the real binary: `keygen` makes identities;
/// `push --recipient` stores only ciphertext (age), records the recipients' fingerprints
/// and `formatVersion` 2; `fetch` without an identity, or with one that is not a
/// recipient, exits 10 naming the fingerprints and writes nothing; with the identity it
/// gives back the exact bytes; keys rotate (new backups to the new key, old ones still read
/// with the old identity); ciphertext changed in the store — even with its sha256 rewritten
/// to match — is refused by age's authentication; retention plans and deletes without keys;
/// bad keys exit 2 naming the recipient or the identity file's line (never the secret).
#[test]
fn encrypted_backups_need_their_identity() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("store")).unwrap();
    let url = format!("file://{}", dir.path().join("store").display());
    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let old_key = keys.join("old.txt");
    let out = run(&["keygen", "--output", old_key.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let old_public = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(old_public.starts_with("age1"), "{old_public}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&old_key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // Never overwritten.
    let again = run(&["keygen", "--output", old_key.to_str().unwrap()], &[]);
    assert_eq!(again.status.code(), Some(2), "{again:?}");
    // The stdout form: the identity on stdout, the public key on stderr.
    let out = run(&["keygen"], &[]);
    assert!(out.status.success());
    let new_key = keys.join("new.txt");
    std::fs::write(&new_key, &out.stdout).unwrap();
    let new_public = stderr(&out)
        .trim()
        .strip_prefix("Public key: ")
        .unwrap()
        .to_owned();
    let fingerprint = |public: &str| sha(public.as_bytes())[..16].to_owned();

    let marker = b"CUSTOMER-RECORD-";
    let data: Vec<u8> = marker
        .iter()
        .copied()
        .cycle()
        .take(3 << 20)
        .zip(bytes(3 << 20, 5))
        .map(|(m, r)| if r % 4 == 0 { r } else { m })
        .collect();
    let push = |args: &[&str], env: &[(&str, String)]| {
        let mut all = vec![
            "push",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-name",
            "nightly",
            "--output",
            "json",
        ];
        all.extend_from_slice(args);
        let out = run_with_input(&all, env, &data);
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)
    };
    let old = push(&["--recipient", &old_public, "--compression", "zstd"], &[]);
    let old_id = old["backupId"].as_str().unwrap().to_owned();
    assert_eq!(
        old["encryption"],
        serde_json::json!({"scheme": "age", "recipients": [fingerprint(&old_public)]}),
        "{old}"
    );
    let stored_path = dir
        .path()
        .join(format!("store/db1/nightly/{old_id}/backup.bin.zst"));
    let stored = std::fs::read(&stored_path).unwrap();
    assert!(stored.starts_with(b"age-encryption.org/v1\n"));
    assert!(!stored.windows(marker.len()).any(|w| w == marker));
    let meta_path = dir
        .path()
        .join(format!("store/db1/nightly/{old_id}/metadata.json"));
    let meta: Value = serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    assert_eq!(meta["formatVersion"], 2, "{meta}");
    assert_eq!(meta["payload"][0]["encryption"]["scheme"], "age");
    assert!(!meta.to_string().contains(&old_public), "a key in {meta}");

    let fetch = |id: &str, args: &[&str], env: &[(&str, String)]| {
        let mut all = vec![
            "fetch",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-id",
            id,
        ];
        all.extend_from_slice(args);
        run(&all, env)
    };
    // No identity; the wrong one: exit 10, the fingerprints named, no file.
    let out_file = dir.path().join("fetched.bin");
    let out_arg = out_file.to_str().unwrap();
    let out = fetch(&old_id, &["--out", out_arg], &[]);
    assert_eq!(out.status.code(), Some(10), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains(&fingerprint(&old_public)) && err.contains("no identity was given"),
        "{err}"
    );
    assert!(!out_file.exists());
    let out = fetch(
        &old_id,
        &["--out", out_arg, "--identity", new_key.to_str().unwrap()],
        &[],
    );
    assert_eq!(out.status.code(), Some(10), "{out:?}");
    assert!(stderr(&out).contains(&fingerprint(&new_public)), "{out:?}");
    assert!(!out_file.exists());
    // The right one, from a flag or from the environment (a Secret's value).
    let out = fetch(&old_id, &["--identity", old_key.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout == data, "the fetched content differs");
    let text = std::fs::read_to_string(&old_key).unwrap();
    let out = fetch(&old_id, &[], &[("TIDEMARK_IDENTITY", text)]);
    assert!(out.status.success() && out.stdout == data, "{out:?}");

    // Rotation: new backups to the new key (environment form); both read with both
    // identities, the old one still with the old identity alone.
    let new = push(&[], &[("TIDEMARK_RECIPIENTS", new_public.clone())]);
    let new_id = new["backupId"].as_str().unwrap().to_owned();
    assert_eq!(
        new["encryption"]["recipients"],
        serde_json::json!([fingerprint(&new_public)])
    );
    let both = [
        "--identity",
        old_key.to_str().unwrap(),
        "--identity",
        new_key.to_str().unwrap(),
    ];
    for id in [&old_id, &new_id] {
        let out = fetch(id, &both, &[]);
        assert!(out.status.success() && out.stdout == data, "{id}: {out:?}");
    }
    let out = fetch(&new_id, &["--identity", old_key.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(10), "{out:?}");

    // A policy's recipients stand against an empty setting: never silently plaintext.
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(
        &policy_file,
        format!(
            "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {{name: db1}}\nspec:\n  objectStore:\n    url: {url}\n    encryption: {{recipients: [{new_public}]}}\n"
        ),
    )
    .unwrap();
    let out = run_with_input(
        &[
            "push",
            "--policy",
            policy_file.to_str().unwrap(),
            "--backup-name",
            "nightly",
            "--output",
            "json",
        ],
        &[("TIDEMARK_RECIPIENTS", " ".into())],
        &data,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let from_policy = json(&out);
    assert_eq!(
        from_policy["encryption"]["recipients"],
        serde_json::json!([fingerprint(&new_public)]),
        "{from_policy}"
    );

    // `ls` says, without any key, which recipients each backup needs and how it is stored.
    let ls = run(
        &[
            "ls",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--output",
            "json",
        ],
        &[],
    );
    assert!(ls.status.success(), "{}", stderr(&ls));
    let ls = json(&ls);
    let listed = |id: &str| {
        ls["backups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["backupId"] == id)
            .unwrap_or_else(|| panic!("{id} not listed: {ls:#}"))
            .clone()
    };
    let old_listed = listed(&old_id);
    assert_eq!(old_listed["compression"], "zstd", "{old_listed}");
    assert_eq!(old_listed["encryption"], old["encryption"], "{old_listed}");
    let new_listed = listed(&new_id);
    assert_eq!(
        new_listed["encryption"]["recipients"],
        serde_json::json!([fingerprint(&new_public)]),
        "{new_listed}"
    );

    // Ciphertext changed, and the record rewritten to match: age refuses it.
    let mut forged = stored.clone();
    let at = forged.len() / 2;
    forged[at] ^= 0x01;
    std::fs::write(&stored_path, &forged).unwrap();
    let mut m = meta.clone();
    m["payload"][0]["sha256"] = sha(&forged).into();
    std::fs::write(&meta_path, serde_json::to_vec(&m).unwrap()).unwrap();
    let out = fetch(&old_id, &["--identity", old_key.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(stderr(&out).contains("age"), "{}", stderr(&out));

    // Retention without any key: the plan reads the metadata, gc deletes the oldest.
    let gc = run(
        &[
            "gc",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--keep-last",
            "2",
            "--output",
            "json",
        ],
        &[],
    );
    assert!(gc.status.success(), "{}", stderr(&gc));
    assert_eq!(
        json(&gc)["executed"]["backupsDeleted"],
        serde_json::json!([old_id])
    );
    assert!(!stored_path.exists());

    // Bad keys.
    let out = run_with_input(
        &[
            "push",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-name",
            "nightly",
            "--recipient",
            "age1notakey",
        ],
        &[],
        &data,
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("age1notakey"), "{}", stderr(&out));
    let bad = keys.join("bad.txt");
    let secret_looking = "AGE-SECRET-KEY-1SOMETHINGTHATISNOTAKEYATALL";
    std::fs::write(&bad, format!("# a comment\n{secret_looking}\n")).unwrap();
    let out = fetch(&new_id, &["--identity", bad.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("line 2") && !err.contains("SOMETHING"),
        "{err}"
    );
}

/// `tidemark verify` (issue 19 §4): every payload and segment read back and checked. A clean
/// store exits 0 (an encrypted payload is checked as stored bytes without an identity, to
/// its content with one); a flipped byte, a cut segment and a missing payload are each
/// found and named (exit 4), the incremental on the missing full is `brokenChain`;
/// `--sample` always keeps the newest backup; a bad fraction exits 2.
#[test]
fn verify_reads_everything_back_and_names_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    std::fs::create_dir(&store_dir).unwrap();
    let url = format!("file://{}", store_dir.display());
    let key = dir.path().join("key.txt");
    let out = run(&["keygen", "--output", key.to_str().unwrap()], &[]);
    let public = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let data: Vec<u8> = bytes(2 << 20, 3).iter().map(|b| b'a' + b % 8).collect();
    let push = |args: &[&str]| push_json(&url, "nightly", args, &data);
    let lost = push(&[]);
    let lost_id = lost["backupId"].as_str().unwrap().to_owned();
    let full = push(&["--compression", "zstd:1"]);
    let full_id = full["backupId"].as_str().unwrap().to_owned();
    let inc = push(&[
        "--type",
        "incremental",
        "--parent",
        &full_id,
        "--compression",
        "zstd",
        "--recipient",
        &public,
    ]);
    let inc_id = inc["backupId"].as_str().unwrap().to_owned();
    let newest = push(&[]);
    let newest_id = newest["backupId"].as_str().unwrap().to_owned();
    let server = tempfile::tempdir().unwrap();
    let index_path = binlogs(server.path(), 4);
    let out = run(
        &[
            "archive-binlogs",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--binlog-index",
            index_path.to_str().unwrap(),
            "--once",
            "--compression",
            "zstd",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));

    let verify = |args: &[&str]| {
        let mut all = vec![
            "verify",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--output",
            "json",
        ];
        all.extend_from_slice(args);
        let out = run(&all, &[]);
        (out.status.code(), json(&out))
    };
    let (code, v) = verify(&[]);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["problems"], 0);
    assert_eq!(v["backups"].as_array().unwrap().len(), 4);
    assert!(v["recoveryWindow"]["from"].is_string(), "{v:#}");
    assert_eq!(v["segments"]["checked"], 3, "{v:#}");
    assert_eq!(v["segments"]["ok"], 3);
    assert_eq!(v["segments"]["unindexed"], 0, "{v:#}");
    // A segment stored but not indexed (an archiver stopped between upload and index) is
    // named — no restore replays it — but is no damage.
    let stray = store_dir.join("db1/binlogs/mysql-bin.000009");
    std::fs::write(&stray, b"not indexed").unwrap();
    let (code, v) = verify(&[]);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["segments"]["unindexed"], 1, "{v:#}");
    assert_eq!(
        v["segments"]["unindexedNames"],
        serde_json::json!(["mysql-bin.000009"])
    );
    let out = run(&["verify", "--store", &url, "--cluster", "db1"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("unindexed") && text.contains("mysql-bin.000009"),
        "{text}"
    );
    std::fs::remove_file(&stray).unwrap();
    let inc_payload = |v: &Value| {
        v["backups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["backupId"] == inc_id.as_str())
            .unwrap()["payload"][0]["checked"]
            .clone()
    };
    assert_eq!(inc_payload(&v), "stored", "no identity: the stored bytes");
    let (code, v) = verify(&["--identity", key.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(inc_payload(&v), "content", "with the identity: the content");

    // Damage of every kind: a payload gone, bytes changed in a compressed and in a plain
    // payload, a segment cut short and one gone, a metadata.json that cannot be read.
    let payload_of = |id: &str, name: &str| store_dir.join(format!("db1/nightly/{id}/{name}"));
    let flip = |path: &Path| {
        let mut b = std::fs::read(path).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 0x10;
        std::fs::write(path, &b).unwrap();
    };
    std::fs::remove_file(payload_of(&lost_id, "backup.bin")).unwrap();
    flip(&payload_of(&full_id, "backup.bin.zst"));
    flip(&payload_of(&newest_id, "backup.bin"));
    let segment = store_dir.join("db1/binlogs/mysql-bin.000002");
    let seg = std::fs::read(&segment).unwrap();
    std::fs::write(&segment, &seg[..seg.len() - 3]).unwrap();
    std::fs::remove_file(store_dir.join("db1/binlogs/mysql-bin.000003")).unwrap();
    let manual = store_dir.join("db1/manual/20261120T000000Z-deadbeef");
    std::fs::create_dir_all(&manual).unwrap();
    std::fs::write(manual.join("metadata.json"), b"{\"formatVersion\": 1, ").unwrap();
    let (code, v) = verify(&[]);
    assert_eq!(code, Some(4), "{v:#}");
    assert_eq!(
        verify_status(&v, &lost_id).as_deref(),
        Some("missing"),
        "{v:#}"
    );
    assert_eq!(
        verify_status(&v, &full_id).as_deref(),
        Some("damaged"),
        "{v:#}"
    );
    assert_eq!(
        verify_status(&v, &newest_id).as_deref(),
        Some("damaged"),
        "{v:#}"
    );
    // Its own payload reads fine; the full under it does not (found by reading it: the
    // listing alone sees nothing wrong with the full).
    assert_eq!(
        verify_status(&v, &inc_id).as_deref(),
        Some("brokenChain"),
        "{v:#}"
    );
    // Nothing restorable is left, and the window says so.
    assert!(v["recoveryWindow"].is_null(), "{v:#}");
    let seg_problems: Vec<(String, String)> = v["segments"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let key = p["key"].as_str().unwrap();
            (
                key.rsplit('/').next().unwrap().to_owned(),
                p["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        seg_problems,
        [
            ("mysql-bin.000002".to_owned(), "damaged".to_owned()),
            ("mysql-bin.000003".to_owned(), "missing".to_owned())
        ],
        "{v:#}"
    );
    assert_eq!(v["malformed"].as_array().unwrap().len(), 1, "{v:#}");
    assert_eq!(v["problems"], 7);
    // The table names them too.
    let out = run(&["verify", "--store", &url, "--cluster", "db1"], &[]);
    assert_eq!(out.status.code(), Some(4));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("damaged")
            && text.contains("mysql-bin.000002")
            && text.contains("malformed")
            && text.contains("7 problem"),
        "{text}"
    );

    // A sample always holds the newest backup and its chain.
    let (code, v) = verify(&["--sample", "0.01"]);
    assert_eq!(code, Some(4), "{v:#}");
    assert_eq!(v["sample"], 0.01);
    assert!(verify_status(&v, &newest_id).is_some(), "{v:#}");
    // A cluster with nothing in it is not "everything checked out".
    let out = run(&["verify", "--store", &url, "--cluster", "typo"], &[]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(
        stderr(&out).contains("nothing to verify"),
        "{}",
        stderr(&out)
    );
    for bad in ["0", "1.5", "x"] {
        let out = run(
            &[
                "verify",
                "--store",
                &url,
                "--cluster",
                "db1",
                "--sample",
                bad,
            ],
            &[],
        );
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(stderr(&out).contains("fraction"), "{}", stderr(&out));
    }
}

/// `verify --sample` always reads what a restore of the newest backup reads: after a
/// consolidation that is the synthetic full standing in for the increments it merged
/// (gone from the store), not the chain its `metadata.json` names. Damage in that full is
/// found however small the sample, and the newest backup is then `brokenChain`.
#[test]
fn a_sample_reads_the_synthetic_full_a_restore_of_the_newest_needs() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    std::fs::create_dir(&store_dir).unwrap();
    let url = format!("file://{}", store_dir.display());
    let data = bytes(1 << 20, 5);
    let push = |args: &[&str]| {
        push_json(&url, "nightly", args, &data)["backupId"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let full = push(&[]);
    let inc = push(&["--type", "incremental", "--parent", &full]);
    let newest = push(&["--type", "incremental", "--parent", &inc]);
    // What a consolidation leaves: a full recording that it merged `full` and `inc` (so
    // it stands in for `inc`, with its start and restore point), and the merged chain
    // deleted.
    let synthetic = push(&[]);
    let dir_of = |id: &str| store_dir.join(format!("db1/nightly/{id}"));
    let read =
        |path: &Path| -> Value { serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap() };
    let replaced = read(&dir_of(&inc).join("metadata.json"));
    let meta_path = dir_of(&synthetic).join("metadata.json");
    let mut meta = read(&meta_path);
    meta["consolidatedFrom"] = serde_json::json!([full, inc]);
    meta["startedAt"] = replaced["startedAt"].clone();
    meta["completedAt"] = replaced["completedAt"].clone();
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    std::fs::remove_dir_all(dir_of(&full)).unwrap();
    std::fs::remove_dir_all(dir_of(&inc)).unwrap();

    let verify = || {
        let out = run(
            &[
                "verify",
                "--store",
                &url,
                "--cluster",
                "db1",
                "--output",
                "json",
                "--sample",
                "0.0001",
            ],
            &[],
        );
        (out.status.code(), json(&out))
    };
    let (code, v) = verify();
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(verify_status(&v, &newest).as_deref(), Some("ok"), "{v:#}");
    assert_eq!(
        verify_status(&v, &synthetic).as_deref(),
        Some("ok"),
        "{v:#}"
    );

    let payload = dir_of(&synthetic).join("backup.bin");
    let mut b = std::fs::read(&payload).unwrap();
    b[1000] ^= 0x01;
    std::fs::write(&payload, &b).unwrap();
    let (code, v) = verify();
    assert_eq!(code, Some(4), "{v:#}");
    assert_eq!(
        verify_status(&v, &synthetic).as_deref(),
        Some("damaged"),
        "{v:#}"
    );
    assert_eq!(
        verify_status(&v, &newest).as_deref(),
        Some("brokenChain"),
        "{v:#}"
    );
}

/// `retention.requireVerified` (issue 19 §4): `gc --require-verified` deletes no backup
/// while the newest one does not read back whole — a flipped byte in it: exit 4 naming
/// it, nothing deleted; once it reads back (repaired), the pass reads it, records
/// `_verified.json` beside it and deletes as planned; the record goes with the backup.
#[test]
fn retention_waits_for_the_newest_backup_to_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let data = bytes(1 << 20, 9);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let out = run_with_input(
            &[
                "push",
                "--store",
                &url,
                "--cluster",
                "db1",
                "--backup-name",
                "nightly",
                "--output",
                "json",
            ],
            &[],
            &data,
        );
        assert!(out.status.success(), "{}", stderr(&out));
        ids.push(json(&out)["backupId"].as_str().unwrap().to_owned());
    }
    let newest = dir
        .path()
        .join(format!("db1/nightly/{}/backup.bin", ids[2]));
    let good = std::fs::read(&newest).unwrap();
    let mut bad = good.clone();
    bad[1000] ^= 1;
    std::fs::write(&newest, &bad).unwrap();
    let gc = || {
        run(
            &[
                "gc",
                "--store",
                &url,
                "--cluster",
                "db1",
                "--keep-last",
                "1",
                "--require-verified",
                "--output",
                "json",
            ],
            &[],
        )
    };
    let out = gc();
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("requireVerified") && err.contains(&ids[2]) && err.contains("sha256"),
        "{err}"
    );
    let count = || {
        std::fs::read_dir(dir.path().join("db1/nightly"))
            .unwrap()
            .count()
    };
    assert_eq!(count(), 3, "nothing may go while the newest is damaged");
    let verified = dir
        .path()
        .join(format!("db1/nightly/{}/_verified.json", ids[2]));
    assert!(!verified.exists());

    std::fs::write(&newest, &good).unwrap();
    let out = gc();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut deleted: Vec<String> = json(&out)["executed"]["backupsDeleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    deleted.sort();
    let mut older = ids[..2].to_vec();
    older.sort();
    assert_eq!(deleted, older);
    let record: Value = serde_json::from_slice(&std::fs::read(&verified).unwrap()).unwrap();
    assert_eq!(record["checked"], "content", "{record}");
    // Bound to the chain as read: the payload's sha256.
    let sha = sha(&good);
    assert_eq!(
        record["chain"],
        serde_json::json!([format!("{}:{sha}", ids[2])]),
        "{record}"
    );
    // The record is part of the backup: ls still sees one whole backup.
    let ls = json(&run(
        &[
            "ls",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--output",
            "json",
        ],
        &[],
    ));
    assert_eq!(ls["backups"].as_array().unwrap().len(), 1, "{ls:#}");
    assert_eq!(ls["backups"][0]["restorable"], true, "{ls:#}");

    // A chain: the newest is an incremental; the pass that deletes the old full reads and
    // records each member of its chain, once.
    let push = |args: &[&str]| {
        push_json(&url, "chain", args, &data)["backupId"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let base = push(&[]);
    let top = push(&["--type", "incremental", "--parent", &base]);
    let out = gc();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        json(&out)["executed"]["backupsDeleted"],
        serde_json::json!([ids[2]]),
        "the single full before the chain goes"
    );
    for id in [&base, &top] {
        let record = dir.path().join(format!("db1/chain/{id}/_verified.json"));
        assert!(record.is_file(), "{} missing", record.display());
    }
}

/// Object lock (issue 19 §3) with the real binary on a lock-enabled SeaweedFS bucket:
/// `push --lock-mode governance --lock-until T` commits a backup the server will not let
/// anyone delete before T (`immutableUntil` recorded, `locked:T` in the plan); a failed
/// attempt under lock does not stand in the way of the next backup and is collected like
/// any other; a `gc` whose clock says the lock has ended (`--now`) is refused by the server
/// itself — exit 5, nothing lost, the backup still fetches; once T has really passed, `gc`
/// deletes the backup with every version of its objects.
#[test]
fn locked_backups_outlast_early_deletes_and_go_when_their_lock_ends() {
    let s3 = SeaweedFs::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(s3.locked_bucket("vault", "shop"));
    let env = s3.env();
    let on = |sub: &str, rest: &[&str], input: &[u8]| {
        let mut args = vec![
            sub,
            "--store",
            "s3://vault",
            "--cluster",
            "shop",
            "--endpoint",
            &s3.endpoint,
        ];
        args.extend_from_slice(rest);
        run_with_input(&args, &env, input)
    };
    let until = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + 20).unwrap();
    let until_s = until.to_string();
    let old_bytes = bytes(300_000, 3);

    // A bucket without object lock cannot hold one: refused before anything is written.
    let plain = run_with_input(
        &[
            "push",
            "--store",
            &s3.url(),
            "--cluster",
            "shop",
            "--endpoint",
            &s3.endpoint,
            "--backup-name",
            "n",
            "--lock-mode",
            "governance",
            "--lock-until",
            &until_s,
        ],
        &env,
        b"x",
    );
    assert_eq!(plain.status.code(), Some(2), "{}", stderr(&plain));
    assert!(
        stderr(&plain).contains("Object Lock enabled"),
        "{}",
        stderr(&plain)
    );
    let ls = run(
        &[
            "ls",
            "--store",
            &s3.url(),
            "--cluster",
            "shop",
            "--endpoint",
            &s3.endpoint,
            "--output",
            "json",
        ],
        &env,
    );
    assert_eq!(
        json(&ls)["backups"],
        serde_json::json!([]),
        "nothing written"
    );

    // A lock date needs a mode, and a mode needs a date (no policy gives a period here).
    let out = on(
        "push",
        &["--backup-name", "n", "--lock-until", &until_s],
        b"x",
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--lock-mode"), "{}", stderr(&out));
    let out = on(
        "push",
        &["--backup-name", "n", "--lock-mode", "governance"],
        b"x",
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--lock-until"), "{}", stderr(&out));
    let out = on(
        "push",
        &[
            "--backup-name",
            "n",
            "--lock-mode",
            "legal-hold",
            "--lock-until",
            &until_s,
        ],
        b"x",
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("\"legal-hold\"")
            && stderr(&out).contains("governance or compliance"),
        "{}",
        stderr(&out)
    );

    let lock = [
        "--lock-mode",
        "governance",
        "--lock-until",
        &until_s,
        "--output",
        "json",
    ];
    let old = on(
        "push",
        &[&["--backup-name", "nightly"][..], &lock].concat(),
        &old_bytes,
    );
    assert!(old.status.success(), "{}", stderr(&old));
    let old = json(&old);
    assert_eq!(old["immutableUntil"], until_s.as_str(), "{old}");
    let old_id = old["backupId"].as_str().unwrap().to_owned();
    let payload = object_store::path::Path::from(format!("nightly/{old_id}/backup.bin"));
    let r = rt.block_on(store.retention(&payload)).unwrap().unwrap();
    assert_eq!(r.until, until);

    // A failed attempt under lock, then the next backup all the same.
    let failed = on(
        "push",
        &[
            &["--backup-name", "nightly"][..],
            &lock,
            &["--", "sh", "-c", "echo partial; exit 3"],
        ]
        .concat(),
        b"",
    );
    assert_eq!(failed.status.code(), Some(6), "{}", stderr(&failed));
    let failed = json(&failed);
    assert!(failed.get("immutableUntil").is_none(), "{failed}");
    let new = on(
        "push",
        &[&["--backup-name", "nightly"][..], &lock].concat(),
        b"the newest backup",
    );
    assert!(new.status.success(), "{}", stderr(&new));
    let new_id = json(&new)["backupId"].as_str().unwrap().to_owned();

    // Retention keeps the old backup for its lock, and collects the failed attempt.
    let gc = on(
        "gc",
        &[
            "--keep-last",
            "1",
            "--failed-ttl",
            "0d",
            "--lock-mode",
            "governance",
            "--output",
            "json",
        ],
        b"",
    );
    assert!(gc.status.success(), "{}", stderr(&gc));
    // Seed 002: expired chains are the bucket's to remove, and this bucket has no rule
    // that would: said on stderr and in JSON.
    assert!(
        stderr(&gc)
            .contains("no enabled lifecycle rule of the bucket expires this cluster's objects"),
        "{}",
        stderr(&gc)
    );
    let gc = json(&gc);
    assert_eq!(gc["lifecycle"]["verdict"], "noRule", "{gc}");
    let decision = |gc: &Value, id: &str| {
        gc["backups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["backupId"] == id)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let d = decision(&gc, &old_id);
    assert_eq!(d["action"], "keep", "{gc}");
    assert_eq!(d["immutableUntil"], until_s.as_str(), "{d}");
    assert!(
        d["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().starts_with("locked:")),
        "{d}"
    );
    let ls = json(&on("ls", &["--output", "json"], b""));
    let ids: Vec<&str> = ls["backups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backupId"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "the failed attempt is gone: {ls}");

    // A pass that believes the lock is over (its clock is a day ahead): the server refuses.
    let tomorrow = until
        .checked_add(jiff::SignedDuration::from_hours(24))
        .unwrap()
        .to_string();
    // Left to the bucket (the default), such a pass records nothing before the lock ends
    // by this machine's clock.
    let early = on(
        "gc",
        &["--keep-last", "1", "--now", &tomorrow, "--allow-future-now"],
        b"",
    );
    assert_eq!(early.status.code(), Some(5), "{}", stderr(&early));
    assert!(
        stderr(&early).contains(&format!(
            "is locked until {until_s}: not expired before its lock ends"
        )),
        "{}",
        stderr(&early)
    );
    // Deleting it itself (the opt-in): the server refuses.
    let early = on(
        "gc",
        &[
            "--keep-last",
            "1",
            "--lock-mode",
            "governance",
            "--after-lock-expiry",
            "delete",
            "--now",
            &tomorrow,
            "--allow-future-now",
        ],
        b"",
    );
    assert_eq!(early.status.code(), Some(5), "{}", stderr(&early));
    assert!(
        stderr(&early).contains("AccessDenied"),
        "{}",
        stderr(&early)
    );
    assert!(
        stderr(&early).contains(&format!("locked (governance) until {until_s}")),
        "{}",
        stderr(&early)
    );
    let fetched = on("fetch", &["--backup-id", &old_id], b"");
    assert!(fetched.status.success(), "{}", stderr(&fetched));
    assert_eq!(
        sha(&fetched.stdout),
        sha(&old_bytes),
        "the locked backup is whole"
    );

    // After the date (seed 002): the chain is recorded as expired — in no plan, restore
    // or window again — and its objects are left to the bucket's lifecycle rule; by a gc
    // given no lock mode too: the backup records its lock.
    let wait = until.duration_since(jiff::Timestamp::now()) + jiff::SignedDuration::from_secs(2);
    std::thread::sleep(std::time::Duration::try_from(wait).unwrap_or_default());
    let gc = on("gc", &["--keep-last", "1", "--output", "json"], b"");
    assert!(gc.status.success(), "{}", stderr(&gc));
    let gc = json(&gc);
    assert_eq!(decision(&gc, &old_id)["action"], "delete");
    assert_eq!(
        gc["executed"]["backupsExpired"],
        serde_json::json!([old_id]),
        "{gc}"
    );
    assert!(
        gc["executed"]["backupsDeleted"]
            .as_array()
            .is_none_or(|d| !d.iter().any(|id| id == &old_id)),
        "{gc}"
    );
    assert!(!rt.block_on(store.versions(&payload)).unwrap().is_empty());
    let meta = object_store::path::Path::from(format!("nightly/{old_id}/metadata.json"));
    assert!(!rt.block_on(store.versions(&meta)).unwrap().is_empty());
    let ls = json(&on("ls", &["--output", "json"], b""));
    let ids: Vec<&str> = ls["backups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backupId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [new_id.as_str()], "{ls}");
    let plan = on("plan", &["--keep-last", "1", "--output", "json"], b"");
    let plan = json(&plan);
    assert_eq!(plan["expired"][0]["backupId"], old_id.as_str(), "{plan}");
    assert!(decision(&plan, &old_id).is_null(), "{plan}");
    let text = on("plan", &["--keep-last", "1"], b"");
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("Expired: 1 locked backup(s)"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    // A restore cannot pick it.
    let fetched = on("fetch", &["--backup-id", &old_id], b"");
    assert!(!fetched.status.success(), "{}", stderr(&fetched));
    // A rule that removes the cluster's objects after 30 days: enough for this policy, too
    // short for a window of 60 days.
    rt.block_on(store.put_lifecycle(
        r#"<LifecycleConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Rule><ID>backups</ID><Status>Enabled</Status><Filter><Prefix>shop/</Prefix></Filter><Expiration><Days>30</Days></Expiration><NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays></NoncurrentVersionExpiration></Rule></LifecycleConfiguration>"#,
    ))
    .unwrap();
    let plan = json(&on("plan", &["--keep-last", "1", "--output", "json"], b""));
    assert_eq!(plan["lifecycle"]["verdict"], "removes", "{plan}");
    assert_eq!(plan["lifecycle"]["days"], 30, "{plan}");
    let short = on(
        "plan",
        &["--keep-last", "1", "--window", "60d", "--output", "json"],
        b"",
    );
    assert!(
        stderr(&short).contains("expires objects after 30 days, but backups the recovery window needs are (or will be) 60 days old"),
        "{}",
        stderr(&short)
    );
    assert_eq!(json(&short)["lifecycle"]["verdict"], "tooShort");
    // The policy switched to deleting expired chains itself: the one left to the bucket
    // is seen again and deleted, every version.
    let gc = on(
        "gc",
        &[
            "--keep-last",
            "1",
            "--after-lock-expiry",
            "delete",
            "--output",
            "json",
        ],
        b"",
    );
    assert!(gc.status.success(), "{}", stderr(&gc));
    let gc = json(&gc);
    assert_eq!(
        gc["executed"]["backupsDeleted"],
        serde_json::json!([old_id]),
        "{gc}"
    );
    assert!(rt.block_on(store.versions(&payload)).unwrap().is_empty());
    assert!(rt.block_on(store.versions(&meta)).unwrap().is_empty());
}

/// Issue 28: under encryption (a recipient given), a payload that is not encrypted is not
/// read — someone who can write the bucket but holds no key could have planted it — unless
/// it was written before the instant the user names as the start of encryption
/// (`--allow-plaintext-before`); one written after that instant is refused, named with
/// both instants.
#[test]
fn plaintext_under_encryption_needs_its_history_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("store")).unwrap();
    let url = format!("file://{}", dir.path().join("store").display());
    let key = dir.path().join("key.txt");
    let out = run(&["keygen", "--output", key.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let public = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let data = bytes(1 << 20, 28);
    let push = |args: &[&str]| {
        let mut all = vec![
            "push",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-name",
            "nightly",
            "--output",
            "json",
        ];
        all.extend_from_slice(args);
        let out = run_with_input(&all, &[], &data);
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)["backupId"].as_str().unwrap().to_owned()
    };
    let fetch = |id: &str, args: &[&str]| {
        let target = dir.path().join(format!("{id}.bin"));
        let _ = std::fs::remove_file(&target);
        let mut all = vec![
            "fetch",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-id",
            id,
            "--out",
            target.to_str().unwrap(),
            "--recipient",
            &public,
            "--identity",
            key.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        (run(&all, &[]), target)
    };
    // Before encryption: plaintext.
    let history = push(&[]);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let turned_on = jiff::Timestamp::now().to_string();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let encrypted = push(&["--recipient", &public]);
    // Planted later by someone without the key: plaintext again.
    let planted = push(&[]);

    let (out, target) = fetch(&history, &[]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("is not encrypted") && err.contains("--allow-plaintext-before"),
        "{err}"
    );
    assert!(err.contains(&history), "{err}");
    assert!(!target.exists(), "written before it was refused");
    let (out, target) = fetch(&history, &["--allow-plaintext-before", &turned_on]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(&target).unwrap() == data);
    let (out, _) = fetch(&encrypted, &["--allow-plaintext-before", &turned_on]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (out, target) = fetch(&planted, &["--allow-plaintext-before", &turned_on]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&planted) && err.contains(&format!("not before {turned_on}")),
        "{err}"
    );
    assert!(!target.exists());
    // The instant is checked.
    let (out, _) = fetch(&history, &["--allow-plaintext-before", "last week"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("RFC 3339"), "{}", stderr(&out));
    // A store that does not encrypt reads what it holds.
    let plain = run(
        &[
            "fetch",
            "--store",
            &url,
            "--cluster",
            "db1",
            "--backup-id",
            &planted,
            "--out",
            dir.path().join("plain.bin").to_str().unwrap(),
        ],
        &[],
    );
    assert!(plain.status.success(), "{}", stderr(&plain));
}
