//! `tidemark run` (standalone mode) with the real binary: schedules, retention, a restart
//! after SIGKILL in the middle of a backup, and bad configurations.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::bin;

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

fn config(dir: &Path, schedule: &str, command: &str, retention: &str) -> PathBuf {
    let cfg = dir.join("config");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(
        cfg.join("policy.yaml"),
        format!(
            r#"apiVersion: tidemark.io/v1alpha1
kind: BackupPolicy
metadata: {{name: local}}
spec:
  objectStore: {{url: "file://../store"}}
  retention: {retention}
  retentionInterval: 1s
"#
        ),
    )
    .unwrap();
    std::fs::write(
        cfg.join("schedule.yaml"),
        format!(
            r#"apiVersion: tidemark.io/v1alpha1
kind: ScheduledBackup
metadata: {{name: data}}
spec:
  schedule: "{schedule}"
  immediate: true
  policy: {{name: local}}
  command: [sh, -c, "{command}"]
"#
        ),
    )
    .unwrap();
    cfg
}

/// Starts `tidemark run` in its own process group, its log in `log`.
fn start(cfg: &Path, log: &Path) -> Child {
    bin()
        .args(["run", "--config", cfg.to_str().unwrap(), "--grace", "20s"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .process_group(0)
        .spawn()
        .unwrap()
}

fn signal(child: &Child, sig: &str) {
    let group = format!("-{}", child.id());
    let ok = Command::new("kill")
        .args([sig, "--", &group])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {group}");
}

fn wait_for(log: &Path, text: &str, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = std::fs::read_to_string(log).unwrap_or_default();
        if s.contains(text) {
            return s;
        }
        assert!(Instant::now() < deadline, "no {text:?} in the log:\n{s}");
        sleep(Duration::from_millis(100));
    }
}

fn ls(store: &Path) -> Value {
    let out = bin()
        .args(["ls", "--store", &format!("file://{}", store.display())])
        .args(["--cluster", "local", "--output", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn phases(v: &Value) -> HashMap<String, String> {
    v["backups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["backupId"].as_str().unwrap().to_owned(),
                b["phase"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn schedules_back_up_and_retention_collects() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "*/2 * * * * *", "date +%s%N", "{keepLast: 2}");
    let log = dir.path().join("run.log");
    let mut run = start(&cfg, &log);
    wait_for(&log, "retention: deleted", 30);
    signal(&run, "-TERM");
    let status = run.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}\n{text}");
    assert!(text.contains("(immediate) → backup data-"), "{text}");
    assert!(text.contains("stopping: no new backups"), "{text}");
    let v = ls(&dir.path().join("store"));
    let completed = phases(&v).values().filter(|p| *p == "completed").count();
    // keepLast 2, plus at most one taken after the last pass.
    assert!((2..=3).contains(&completed), "{v:#}");
    let state: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("store/local/_state/run.json")).unwrap(),
    )
    .unwrap();
    assert!(
        state["schedules"]["data"]["lastScheduleTime"].is_string(),
        "{state:#}"
    );
    assert!(state["lastRetentionRunTime"].is_string(), "{state:#}");
    assert_eq!(state["running"], serde_json::json!({}), "{state:#}");
}

#[test]
fn sigkill_during_a_backup_then_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "*/5 * * * * *",
        "sleep 2; echo payload",
        "{keepLast: 5, failedBackupsTTL: 1d}",
    );
    let log1 = dir.path().join("run1.log");
    let mut first = start(&cfg, &log1);
    let text = wait_for(&log1, "(immediate) → backup ", 30);
    signal(&first, "-KILL");
    let _ = first.wait();
    // The attempt's id, from "→ backup <name>/<id> started".
    let line = text.lines().find(|l| l.contains("(immediate)")).unwrap();
    let id = line
        .split("→ backup ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .split('/')
        .nth(1)
        .unwrap()
        .to_owned();

    let log2 = dir.path().join("run2.log");
    let mut second = start(&cfg, &log2);
    wait_for(&log2, "recorded as failed", 30);
    wait_for(&log2, "completed", 30);
    signal(&second, "-TERM");
    assert!(second.wait().unwrap().success());
    let text = std::fs::read_to_string(&log2).unwrap();
    // Not repeated: the immediate run happened; the restart does not take it again.
    assert!(!text.contains("(immediate)"), "{text}");

    let v = ls(&dir.path().join("store"));
    let p = phases(&v);
    assert_eq!(p[&id], "failed", "{v:#}");
    // One attempt per slot name: no duplicate.
    let mut names: Vec<&str> = v["backups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backupName"].as_str().unwrap())
        .collect();
    let n = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), n, "{v:#}");

    // failedBackupsTTL collects the interrupted attempt later; what restores stays.
    let later = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(48);
    let gc = bin()
        .args([
            "gc",
            "--store",
            &format!("file://{}", dir.path().join("store").display()),
        ])
        .args([
            "--cluster",
            "local",
            "--keep-last",
            "5",
            "--failed-ttl",
            "1d",
        ])
        .args([
            "--now",
            &later.to_string(),
            "--allow-future-now",
            "--output",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        gc.status.success(),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
    let gc: Value = serde_json::from_slice(&gc.stdout).unwrap();
    let deleted: Vec<&str> = gc["backups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["action"] == "delete")
        .map(|b| b["backupId"].as_str().unwrap())
        .collect();
    assert!(deleted.contains(&id.as_str()), "{gc:#}");
    assert!(
        !phases(&ls(&dir.path().join("store")))
            .values()
            .all(|p| p != "completed"),
        "a completed backup stays"
    );
}

fn refused(files: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let out: Output = bin()
        .args(["run", "--config", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const POLICY: &str = r#"apiVersion: tidemark.io/v1alpha1
kind: BackupPolicy
metadata: {name: local}
spec:
  objectStore: {url: "file:///tmp"}
  retention: {keepLast: 2}
"#;

const SCHEDULE: &str = r#"apiVersion: tidemark.io/v1alpha1
kind: ScheduledBackup
metadata: {name: data}
spec:
  schedule: "0 */5 * * * *"
  policy: {name: local}
  command: ["true"]
"#;

#[test]
fn bad_configuration_stops_at_start_up_naming_file_field_and_form() {
    let e = refused(&[
        ("p.yaml", POLICY),
        (
            "s.yaml",
            &SCHEDULE.replace("0 */5 * * * *", "0 */5 * * * * 2030"),
        ),
    ]);
    assert!(e.contains("s.yaml") && e.contains("spec.schedule"), "{e}");
    assert!(e.contains("\"0 */5 * * * *\""), "{e}");

    // Seed 001: five fields are refused, in a schedule and in a restore test's schedule.
    let e = refused(&[
        ("p.yaml", POLICY),
        ("s.yaml", &SCHEDULE.replace("0 */5 * * * *", "0 2 * * *")),
    ]);
    assert!(
        e.contains("s.yaml")
            && e.contains("spec.schedule")
            && e.contains("did you mean \"0 0 2 * * *\"?"),
        "{e}"
    );
    let e = refused(&[(
        "p.yaml",
        &format!("{POLICY}  restoreTest: {{schedule: \"0 4 * * SUN\"}}\n"),
    )]);
    assert!(
        e.contains("spec.restoreTest.schedule") && e.contains("did you mean \"0 0 4 * * SUN\"?"),
        "{e}"
    );

    let e = refused(&[(
        "p.yaml",
        &POLICY.replace("kind: BackupPolicy", "kind: BackupPolcy"),
    )]);
    assert!(
        e.contains("p.yaml") && e.contains("unknown kind \"BackupPolcy\""),
        "{e}"
    );
    assert!(e.contains("BackupPolicy, ScheduledBackup"), "{e}");

    // Object lock is an S3 feature: a local store cannot hold it.
    let e = refused(&[(
        "p.yaml",
        &POLICY.replace(
            "{url: \"file:///tmp\"}",
            "{url: \"file:///tmp\", objectLock: {mode: governance, period: 1d}}",
        ),
    )]);
    assert!(e.contains("object lock needs an s3:// store"), "{e}");

    let e = refused(&[(
        "p.yaml",
        &POLICY.replace("  objectStore: {url: \"file:///tmp\"}\n", ""),
    )]);
    assert!(e.contains("p.yaml") && e.contains("spec.retention"), "{e}");
    assert!(e.contains("spec.objectStore"), "{e}");

    let e = refused(&[
        ("p.yaml", POLICY),
        ("s.yaml", &format!("{SCHEDULE}  timeZone: Europe/Pariss\n")),
    ]);
    assert!(e.contains("s.yaml") && e.contains("spec.timeZone"), "{e}");
    assert!(e.contains("IANA name such as UTC or Europe/Paris"), "{e}");

    let e = refused(&[
        ("p.yaml", POLICY),
        (
            "s.yaml",
            &SCHEDULE.replace("name: local}", "name: elsewhere}"),
        ),
    ]);
    assert!(
        e.contains("spec.policy.name") && e.contains("\"elsewhere\""),
        "{e}"
    );
    assert!(e.contains("found: local"), "{e}");

    // An interval the time arithmetic cannot hold, and one past its documented maximum.
    for (interval, problem) in [
        ("70000000h", "more than 5 digits"),
        ("200h", "longer than the maximum"),
    ] {
        let e = refused(&[(
            "p.yaml",
            &format!("{POLICY}  retentionInterval: {interval}\n"),
        )]);
        assert!(
            e.contains("p.yaml")
                && e.contains("spec.retentionInterval")
                && e.contains(interval)
                && e.contains(problem)
                && e.contains("168h"),
            "{e}"
        );
    }

    let e = refused(&[("empty.yaml", "")]);
    assert!(e.contains("no BackupPolicy"), "{e}");

    let e = refused(&[("a.yaml", POLICY), ("b.yaml", POLICY)]);
    assert!(
        e.contains("b.yaml") && e.contains("metadata.name") && e.contains("a.yaml"),
        "{e}"
    );

    // Two policies on one cluster, spelt two ways, would each schedule and collect it.
    let e = refused(&[
        ("a.yaml", POLICY),
        (
            "b.yaml",
            &POLICY
                .replace("{name: local}", "{name: other}")
                .replace("file:///tmp", "file:///tmp/../tmp")
                .replace("spec:\n", "spec:\n  cluster: local\n"),
        ),
    ]);
    assert!(
        e.contains("b.yaml") && e.contains("BackupPolicy local") && e.contains("one policy per"),
        "{e}"
    );
}

/// Only the journal's own attempts are recovered at a restart: a directory a pass left
/// half deleted (payload, no metadata.json) under one of the schedule's names is not
/// revived as a fresh failed attempt. And retention stops at malformed metadata as gc
/// does: that backup, and everything else, stays.
#[test]
fn a_restart_recovers_only_its_journal_and_retention_stops_at_malformed_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "0 0 0 1 1 *", "echo payload", "{keepLast: 1}");
    let store = dir.path().join("store/local");
    let half = store.join("data-20200101000000/20200101T000000Z-0000beef");
    std::fs::create_dir_all(&half).unwrap();
    std::fs::write(half.join("backup.bin"), b"left by an interrupted deletion").unwrap();
    let bad = store.join("manual/20200102T000000Z-0000dead");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("metadata.json"), b"{\"formatVersion\": 1,").unwrap();
    let log = dir.path().join("run.log");
    let mut run = start(&cfg, &log);
    wait_for(&log, "completed", 30);
    let text = wait_for(&log, "malformed", 30);
    signal(&run, "-TERM");
    assert!(run.wait().unwrap().success(), "{text}");
    assert!(!half.join("metadata.json").exists(), "revived: {text}");
    assert!(half.join("backup.bin").exists());
    assert!(bad.join("metadata.json").exists());
    assert!(
        text.contains("retention deletes nothing until they are fixed"),
        "{text}"
    );
}

/// A damaged binlog index stops retention (nothing is deleted while it cannot be read),
/// not the schedule's backups.
#[test]
fn a_damaged_binlog_index_stops_retention_not_backups() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "*/2 * * * * *", "echo payload", "{keepLast: 1}");
    let store = dir.path().join("store/local");
    std::fs::create_dir_all(store.join("binlogs")).unwrap();
    std::fs::write(store.join("binlogs/_index.json"), b"not an index").unwrap();
    let log = dir.path().join("run.log");
    let mut run = start(&cfg, &log);
    wait_for(&log, "_index.json is malformed", 30);
    // The immediate backup and the next slot's, while retention waits.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.matches(" completed (").count() >= 2 {
            break text;
        }
        assert!(Instant::now() < deadline, "two backups expected:\n{text}");
        sleep(Duration::from_millis(100));
    };
    signal(&run, "-TERM");
    assert!(run.wait().unwrap().success(), "{text}");
    // `ls` lists the backups anyway, without a recovery window, and exits 4.
    let out = bin()
        .args([
            "ls",
            "--store",
            &format!("file://{}", dir.path().join("store").display()),
        ])
        .args(["--cluster", "local", "--output", "json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("_index.json is malformed"), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["recoveryWindow"].is_null(), "{v:#}");
    let completed = phases(&v).values().filter(|p| *p == "completed").count();
    assert!(
        completed >= 2,
        "keepLast 1 applied despite the index: {text}"
    );
}

/// DeleteHooks on one machine (seed 003): before a retention pass deletes a backup, the
/// hooks whose selector matches its labels run their commands in name order, with the
/// backup in their environment; a failing hook does not stop the deletion; the outcomes
/// are logged and in the audit record.
#[test]
fn delete_hooks_run_before_retention_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "*/2 * * * * *", "date +%s%N", "{keepLast: 1}");
    let calls = dir.path().join("calls.txt");
    let c = calls.display();
    std::fs::write(
        cfg.join("hooks.yaml"),
        format!(
            r#"apiVersion: tidemark.io/v1alpha1
kind: DeleteHook
metadata: {{name: b-fails}}
spec:
  selector: {{matchLabels: {{tidemark.io/scheduled-backup: data}}}}
  command: [sh, -c, "echo b >> {c}; echo 'no ticket' >&2; exit 4"]
---
apiVersion: tidemark.io/v1alpha1
kind: DeleteHook
metadata: {{name: a-records}}
spec:
  command: [sh, -c, "echo \"a $TIDEMARK_DELETE_REASON $TIDEMARK_BACKUP\" >> {c}"]
  timeout: 10s
---
apiVersion: tidemark.io/v1alpha1
kind: DeleteHook
metadata: {{name: c-other}}
spec:
  selector: {{matchLabels: {{team: nobody}}}}
  command: [sh, -c, "echo c >> {c}"]
"#
        ),
    )
    .unwrap();
    let log = dir.path().join("run.log");
    let mut run = start(&cfg, &log);
    let text = wait_for(&log, "retention: deleted", 30);
    signal(&run, "-TERM");
    run.wait().unwrap();
    assert!(text.contains("delete hook failed"), "{text}");
    let lines = std::fs::read_to_string(&calls).unwrap();
    let first: Vec<&str> = lines.lines().take(2).collect();
    assert!(first[0].starts_with("a retention {"), "{lines}");
    assert_eq!(first[1], "b", "{lines}");
    assert!(
        !lines.lines().any(|l| l == "c"),
        "another selector's hook ran: {lines}"
    );
    // The first line names the deleted backup, which is gone from the store.
    let described: Value =
        serde_json::from_str(first[0].trim_start_matches("a retention ")).unwrap();
    let id = described["backup"]["backupId"].as_str().unwrap().to_owned();
    assert!(!phases(&ls(&dir.path().join("store"))).contains_key(&id));
    // And the audit record lists both outcomes.
    let audit_dir = dir.path().join("store/local/_audit");
    let record: Value = std::fs::read_dir(&audit_dir)
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
        .filter_map(|b| serde_json::from_slice::<Value>(&b).ok())
        .find(|r| r["hooks"][0]["backupId"] == id.as_str())
        .unwrap();
    let outcomes: Vec<&str> = record["hooks"][0]["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["succeeded", "failed"], "{record}");
    assert!(
        record["hooks"][0]["hooks"][1]["message"]
            .as_str()
            .unwrap()
            .contains("exited with status 4; its stderr ends with: no ticket"),
        "{record}"
    );
}

/// Object lock in standalone mode (issue 19 §3): a policy with `objectStore.objectLock`
/// on a lock-enabled S3 bucket locks every backup `tidemark run` commits until its start
/// plus the period (a schedule without incrementals: each backup is its own chain), and the
/// server holds the lock.
#[test]
fn tidemark_run_locks_what_it_commits() {
    let s3 = tidemark_store::testkit::SeaweedFs::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(s3.locked_bucket("vault", "local"));
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(
        cfg.join("policy.yaml"),
        format!(
            r#"apiVersion: tidemark.io/v1alpha1
kind: BackupPolicy
metadata: {{name: local}}
spec:
  objectStore:
    bucket: vault
    endpoint: {}
    objectLock: {{mode: governance, period: 2d}}
  retention: {{keepLast: 1}}
  retentionInterval: 1s
"#,
            s3.endpoint
        ),
    )
    .unwrap();
    std::fs::write(
        cfg.join("schedule.yaml"),
        r#"apiVersion: tidemark.io/v1alpha1
kind: ScheduledBackup
metadata: {name: data}
spec:
  schedule: "0 0 0 1 1 *"
  immediate: true
  policy: {name: local}
  command: [sh, -c, "echo locked"]
"#,
    )
    .unwrap();
    let log = dir.path().join("run.log");
    let mut run = bin()
        .envs(s3.env())
        .args(["run", "--config", cfg.to_str().unwrap(), "--grace", "20s"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    wait_for(&log, "completed (", 60);
    signal(&run, "-TERM");
    let status = run.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}\n{text}");
    let v = common::json(&common::on_bucket(
        &s3,
        "s3://vault",
        "local",
        &["ls", "--output", "json"],
    ));
    let backups = v["backups"].as_array().unwrap();
    assert_eq!(backups.len(), 1, "{v:#}");
    let b = &backups[0];
    assert_eq!(b["phase"], "completed", "{v:#}");
    let started: jiff::Timestamp = b["startedAt"].as_str().unwrap().parse().unwrap();
    let until: jiff::Timestamp = b["immutableUntil"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        until,
        tidemark_store::objectlock::whole_second(started + jiff::SignedDuration::from_hours(48)),
        "{b}"
    );
    let key = object_store::path::Path::from(format!(
        "{}/{}/metadata.json",
        b["backupName"].as_str().unwrap(),
        b["backupId"].as_str().unwrap()
    ));
    let held = rt.block_on(store.retention(&key)).unwrap().unwrap();
    assert_eq!(held.mode, tidemark_store::objectlock::LockMode::Governance);
    assert_eq!(held.until, until, "{held:?}");
}

/// Seed 002's forever incremental without consolidation frees nothing: `tidemark run` says
/// so at start-up, naming both fields that would end the chain; a schedule with
/// `maxIncrementsPerFull` gets no warning.
#[test]
fn a_forever_incremental_without_consolidation_is_named_at_start_up() {
    for (incremental, warned) in [("{}", true), ("{maxIncrementsPerFull: 6}", false)] {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        std::fs::write(
            dir.path().join("p.yaml"),
            POLICY.replace("file:///tmp", &format!("file://{}", store.display())),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("s.yaml"),
            SCHEDULE.replace(
                "  command: [\"true\"]\n",
                &format!("  method: mariabackup\n  incremental: {incremental}\n"),
            ),
        )
        .unwrap();
        let log = dir.path().join("run.log");
        let mut run = start(dir.path(), &log);
        let text = wait_for(&log, "schedule(s), retention every", 30);
        signal(&run, "-TERM");
        run.wait().unwrap();
        let says = "s.yaml: ScheduledBackup data: spec.incremental has no maxIncrementsPerFull and BackupPolicy local has no retention.consolidate: this schedule's chain never ends";
        assert_eq!(text.contains(says), warned, "{incremental}: {text}");
    }
}

/// Issue 44: `tidemark run` sends the store to the policy's copy and keeps the copy by
/// the copy's own retention: the copy keeps more than the source (keepLast 8 against 2),
/// so backups the source's retention deleted are still in the copy, whole.
#[test]
fn the_runner_copies_the_store_and_the_copy_keeps_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "*/2 * * * * *", "date +%s%N", "{keepLast: 2}");
    let policy = cfg.join("policy.yaml");
    let mut text = std::fs::read_to_string(&policy).unwrap();
    text.push_str(
        "  copies:\n    - name: dr\n      objectStore: {url: \"file://../dr\"}\n      retention: {keepLast: 8}\n      maxLag: 20s\n      verify: {schedule: \"*/5 * * * * *\", samplePercent: 100}\n",
    );
    std::fs::write(&policy, text).unwrap();
    std::fs::create_dir_all(dir.path().join("dr")).unwrap();
    let log = dir.path().join("run.log");
    let mut run = start(&cfg, &log);
    wait_for(&log, "retention: deleted", 30);
    // A second copy pass (every 10 s) after the source deleted something.
    let first = wait_for(&log, "copy dr: sent", 30);
    let sent = first.matches("copy dr: sent").count();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let s = std::fs::read_to_string(&log).unwrap();
        if s.matches("copy dr: sent").count() > sent + 1 {
            break;
        }
        assert!(Instant::now() < deadline, "one copy pass only:\n{s}");
        sleep(Duration::from_millis(200));
    }
    signal(&run, "-TERM");
    let status = run.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}\n{text}");
    let source = phases(&ls(&dir.path().join("store")));
    let copy = phases(&ls(&dir.path().join("dr")));
    assert!(copy.values().all(|p| p == "completed"), "{copy:?}");
    // The copy's own verification read the copy (its span names it), not the source:
    // more backups than the source keeps.
    let read: Vec<usize> = text
        .lines()
        .filter(|l| l.contains("verify{policy=local copy=dr}: verification:"))
        .filter_map(|l| {
            l.split("verification: ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(
        read.iter().max().is_some_and(|&n| n > source.len()),
        "{read:?} against {} in the source:\n{text}",
        source.len()
    );
    // The source keeps its 2 and what the copy has not received yet; the copy keeps its
    // own 8, among them backups the source's retention deleted.
    assert!(
        copy.keys().any(|id| !source.contains_key(id)),
        "nothing in the copy that the source deleted:\n{copy:?}\n{source:?}\n{text}"
    );
    assert!(
        copy.len() <= 9,
        "the copy's own retention ran: {copy:?}\n{text}"
    );
    let record: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("store/local/_state/copies/dr.json")).unwrap(),
    )
    .unwrap();
    assert!(record["copyNewestAt"].is_string(), "{record:#}");
}
