//! The real `tidemark` binary against the example store (copied), a local directory, and a
//! real S3 server (SeaweedFS on 127.0.0.1).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{bin, json, stderr};

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use jiff::SignedDuration;
use serde_json::Value;
use tidemark_store::synth::{self, SynthBackup};
use tidemark_store::testkit::SeaweedFs;

const NOW: &str = "2026-11-20T12:00:00Z";

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run tidemark")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path().strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// A private copy of `examples/store`.
fn example_store() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/store");
    copy_dir(&src, dir.path());
    let url = format!("file://{}", dir.path().display());
    (dir, url)
}

/// `n` nightly fulls (02:00) from `start`, the first with salt `from`.
fn nightly(start: jiff::Timestamp, from: i64, n: i64) -> Vec<SynthBackup> {
    (from..from + n)
        .map(|d| {
            SynthBackup::full(
                "nightly",
                start + SignedDuration::from_hours(24 * d),
                d as u32,
            )
        })
        .collect()
}

/// Writes `backups`, `segments` and their index into `store`.
fn write_history(
    rt: &tokio::runtime::Runtime,
    store: &tidemark_store::ClusterStore,
    backups: &[SynthBackup],
    segments: &[tidemark_store::format::IndexEntry],
) {
    rt.block_on(async {
        synth::write_backups(store, backups).await.unwrap();
        synth::write_segments(store, segments).await.unwrap();
        synth::write_index(store, segments).await.unwrap();
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

const POLICY: [&str; 7] = [
    "--window",
    "7d",
    "--keep-weekly",
    "2",
    "--failed-ttl",
    "3d",
    "--cover-window",
];

fn pass_args<'a>(cmd: &'a str, url: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![cmd, "--store", url, "--cluster", "demo", "--now", NOW];
    v.extend(POLICY);
    v.extend(extra);
    v
}

#[test]
fn plan_json_follows_the_documented_contract() {
    let (dir, url) = example_store();
    let before = files(dir.path());
    let o = run(&pass_args("plan", &url, &["--output", "json"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let backups = v["backups"].as_array().unwrap();
    assert_eq!(backups.len(), 22);
    for b in backups {
        assert!(b["backupId"].is_string());
        assert!(matches!(b["action"].as_str(), Some("keep" | "delete")));
        assert!(!b["reasons"].as_array().unwrap().is_empty(), "{b}");
    }
    let deleted: Vec<&str> = backups
        .iter()
        .filter(|b| b["action"] == "delete")
        .map(|b| b["backupId"].as_str().unwrap())
        .collect();
    assert_eq!(deleted.len(), 8);
    let held = backups
        .iter()
        .find(|b| b["backupName"] == "pre-upgrade")
        .unwrap();
    assert_eq!(held["reasons"], serde_json::json!(["protected"]));
    let seg = v["segments"]["delete"].as_array().unwrap();
    assert_eq!(seg[0], "demo/binlogs/mysql-bin.000001");
    assert_eq!(v["horizon"], "2026-11-05T11:00:00Z");
    assert!(v["recoveryWindow"]["from"].is_string());
    assert_eq!(v["foreign"], serde_json::json!(["demo/NOTES.txt"]));
    assert_eq!(v["dryRun"], true);
    // `-o yaml` (kubectl's habit) is the same document.
    let yaml = run(&pass_args("plan", &url, &["-o", "yaml"]));
    assert!(yaml.status.success(), "{}", stderr(&yaml));
    let as_yaml: Value = serde_saphyr::from_slice(&yaml.stdout).unwrap();
    assert_eq!(as_yaml, v);
    // `-o wide`: the table with the columns it adds, for plan and ls.
    for cmd in ["plan", "ls"] {
        let args = if cmd == "plan" {
            pass_args(cmd, &url, &["-o", "wide"])
        } else {
            vec!["ls", "--store", &url, "--cluster", "demo", "-o", "wide"]
        };
        let wide = run(&args);
        assert!(wide.status.success(), "{}", stderr(&wide));
        let text = String::from_utf8(wide.stdout).unwrap();
        let header = text.lines().find(|l| l.contains("BACKUP-ID")).unwrap();
        for column in [
            "STARTED",
            "BYTES",
            "COMPRESSION",
            "ENCRYPTION",
            "LOCKED-UNTIL",
            "LOG-POSITION",
        ] {
            assert!(header.contains(column), "{cmd}: {header}");
        }
        let row = text
            .lines()
            .find(|l| l.contains("20261101T020000Z-00001000"))
            .unwrap();
        assert!(
            row.contains("2026-11-01T02:00:00Z"),
            "{cmd}: started in {row}"
        );
    }
    // A dry run deletes nothing.
    assert_eq!(files(dir.path()), before);
}

#[test]
fn gc_deletes_what_plan_showed_then_has_nothing_to_do() {
    let (dir, url) = example_store();
    let plan = json(&run(&pass_args("plan", &url, &["--output", "json"])));
    let o = run(&pass_args("gc", &url, &["--output", "json"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let executed = &v["executed"];
    assert_eq!(executed["backupsDeleted"].as_array().unwrap().len(), 8);
    assert_eq!(
        executed["segmentsDeleted"],
        plan["segments"]["delete"].as_array().unwrap().len()
    );
    let audit = executed["auditKey"].as_str().unwrap();
    assert!(
        dir.path().join(audit).is_file(),
        "audit record {audit} missing"
    );

    let remaining = files(dir.path());
    for b in plan["backups"].as_array().unwrap() {
        let id = b["backupId"].as_str().unwrap();
        let present = remaining.iter().any(|p| p.to_string_lossy().contains(id));
        assert_eq!(present, b["action"] == "keep", "{id}");
    }
    for k in plan["segments"]["delete"].as_array().unwrap() {
        assert!(!dir.path().join(k.as_str().unwrap()).exists(), "{k}");
    }
    assert!(dir.path().join("demo/NOTES.txt").is_file());

    let again = run(&pass_args("gc", &url, &[]));
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(String::from_utf8_lossy(&again.stdout).contains("Nothing to do."));

    let ls = run(&[
        "ls",
        "--store",
        &url,
        "--cluster",
        "demo",
        "--output",
        "json",
    ]);
    assert!(ls.status.success(), "{}", stderr(&ls));
    let v = json(&ls);
    assert_eq!(v["backups"].as_array().unwrap().len(), 14);
    assert!(
        v["backups"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["restorable"] == true)
    );
    // Segment 4 (unknown last event) is kept by rule, so 5–26 are absent, harmlessly:
    // replay from the oldest kept backup starts at 27, which began before it completed.
    assert_eq!(
        v["archive"]["missing"],
        serde_json::json!([{"from": 5, "to": 26, "affectsRecovery": false}])
    );
}

#[test]
fn bad_input_is_refused_with_value_form_and_exit_code_and_nothing_is_deleted() {
    let (dir, url) = example_store();
    let before = files(dir.path());
    let base = |extra: &[&str]| {
        let mut v = vec!["gc", "--store", url.as_str(), "--cluster", "demo"];
        v.extend(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let cases: Vec<(Vec<String>, i32, Vec<&str>)> = vec![
        (
            base(&["--window", "30"]),
            2,
            vec!["\"30\"", "it has no unit", "<n>d, <n>w or <n>mo"],
        ),
        (
            base(&["--window", "30h"]),
            2,
            vec!["\"30h\"", "unit is not d, w or mo"],
        ),
        (
            base(&["--keep-last", "-1"]),
            2,
            vec!["--keep-last", "-1", "whole number"],
        ),
        (
            base(&["--keep-daily", "3", "--time-zone", "Mars/Olympus"]),
            2,
            vec!["\"Mars/Olympus\"", "IANA"],
        ),
        (base(&[]), 2, vec!["no retention rule", "--keep-last"]),
        (
            base(&["--keep-last", "1", "--now", "noon"]),
            2,
            vec!["\"noon\"", "RFC 3339"],
        ),
        (
            vec![
                "gc",
                "--store",
                "ftp://x",
                "--cluster",
                "demo",
                "--keep-last",
                "1",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            2,
            vec!["\"ftp://x\"", "s3://bucket"],
        ),
        (
            vec![
                "gc",
                "--store",
                "s3://b",
                "--endpoint",
                "http://127.0.0.1:9",
                "--cluster",
                "demo",
                "--keep-last",
                "1",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            2,
            vec!["no S3 credentials", "AWS_ACCESS_KEY_ID"],
        ),
    ];
    for (args, code, needles) in cases {
        let o = bin().args(&args).output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: {err:?} lacks {n:?}");
        }
    }
    assert_eq!(files(dir.path()), before);
}

#[test]
fn unreachable_store_exits_3() {
    // `verify` too: a store that does not answer is not damaged data (4).
    for command in [&["plan", "--keep-last", "1"][..], &["verify"]] {
        let o = bin()
            .args(command)
            .args([
                "--store",
                "s3://b",
                "--endpoint",
                "http://127.0.0.1:9",
                "--cluster",
                "demo",
            ])
            .env("AWS_ACCESS_KEY_ID", "x")
            .env("AWS_SECRET_ACCESS_KEY", "y")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(3), "{command:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("Connection refused"), "{}", stderr(&o));
    }
}

#[test]
fn malformed_metadata_blocks_gc_unless_told_and_is_never_deleted() {
    let (dir, url) = example_store();
    let bad = dir
        .path()
        .join("demo/nightly/20261101T020000Z-00001000/metadata.json");
    std::fs::write(&bad, b"{\"formatVersion\": 1,").unwrap();
    let before = files(dir.path());

    let plan = run(&pass_args("plan", &url, &[]));
    assert_eq!(plan.status.code(), Some(4), "{}", stderr(&plan));
    assert!(stderr(&plan).contains("20261101T020000Z-00001000/metadata.json"));

    let gc = run(&pass_args("gc", &url, &[]));
    assert_eq!(gc.status.code(), Some(4));
    assert!(
        stderr(&gc).contains("nothing was deleted"),
        "{}",
        stderr(&gc)
    );
    assert_eq!(files(dir.path()), before);

    let gc = run(&pass_args("gc", &url, &["--ignore-malformed"]));
    assert_eq!(gc.status.code(), Some(0), "{}", stderr(&gc));
    assert!(bad.is_file(), "malformed metadata must never be deleted");
    assert!(
        dir.path()
            .join("demo/nightly/20261101T020000Z-00001000/backup.tar")
            .is_file()
    );
}

#[test]
fn malformed_index_exits_4_and_deletes_nothing() {
    let (dir, url) = example_store();
    std::fs::write(dir.path().join("demo/binlogs/_index.json"), b"[1, 2").unwrap();
    let before = files(dir.path());
    let o = run(&pass_args("gc", &url, &[]));
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("demo/binlogs/_index.json") && err.contains("expected {\"formatVersion\": 1"),
        "{err}"
    );
    assert_eq!(files(dir.path()), before);
}

/// `m` in a retention duration is a 30-day month (as before) and warns, naming both readings
/// and the unambiguous spellings, from a flag and from a policy file; `mo` plans the same and
/// is quiet.
#[test]
fn months_written_m_plan_as_before_and_warn() {
    let (_dir, url) = example_store();
    let plan = |window: &str| {
        run(&[
            "plan",
            "--store",
            &url,
            "--cluster",
            "demo",
            "--now",
            NOW,
            "--window",
            window,
            "--output",
            "json",
        ])
    };
    let (m, mo, days) = (plan("1m"), plan("1mo"), plan("30d"));
    for o in [&m, &mo, &days] {
        assert!(o.status.success(), "{}", stderr(o));
    }
    assert_eq!(json(&m)["backups"], json(&days)["backups"]);
    assert_eq!(json(&mo)["backups"], json(&days)["backups"]);
    let warned = stderr(&m);
    assert!(
        warned.contains(
            "warning: --window \"1m\" is read as 1 month of 30 days (30 days), not 1 minute"
        ) && warned.contains("write \"1mo\" (or \"30d\")"),
        "{warned}"
    );
    // Seed 000 spells months "<n>m": a warning, never a refusal, nor a promise of one.
    assert!(
        !warned.contains("refused") && !warned.contains("deprecated"),
        "{warned}"
    );
    assert!(!stderr(&mo).contains("warning"), "{}", stderr(&mo));

    let (dir, _url) = example_store();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {name: demo}\nspec:\n  objectStore: {url: file://.}\n  retention: {window: 90m}\n",
    )
    .unwrap();
    let o = run(&["plan", "--policy", policy.to_str().unwrap(), "--now", NOW]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "policy.yaml: spec.retention.window \"90m\" is read as 90 months of 30 days (2700 days)"
        ),
        "{}",
        stderr(&o)
    );
}

#[test]
fn policy_file_supplies_store_cluster_and_rules() {
    let (dir, _url) = example_store();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {name: demo}\nspec:\n  objectStore: {url: file://.}\n  retention: {window: 7d, keepWeekly: 2, failedBackupsTTL: 3d, coverWindow: true}\n",
    )
    .unwrap();
    let p = policy.to_str().unwrap();
    let o = run(&["plan", "--policy", p, "--now", NOW, "--output", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let from_file = json(&o);
    let (_d2, url) = example_store();
    let from_flags = json(&run(&pass_args("plan", &url, &["--output", "json"])));
    assert_eq!(from_file["backups"], from_flags["backups"]);

    let both = run(&["plan", "--policy", p, "--keep-last", "3"]);
    assert_eq!(both.status.code(), Some(2));
    assert!(stderr(&both).contains("not both"));

    std::fs::write(&policy, "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {name: demo}\nspec:\n  objectStore: {url: file://.}\n  retention: {keeplast: 3}\n").unwrap();
    let typo = run(&["plan", "--policy", p]);
    assert_eq!(typo.status.code(), Some(2));
    assert!(
        stderr(&typo).contains("unknown field `keeplast`"),
        "{}",
        stderr(&typo)
    );
}

#[test]
fn closed_pipe_exits_quietly() {
    let (_dir, url) = example_store();
    let mut child = bin()
        .args(pass_args("plan", &url, &[]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn plan_and_gc_against_a_real_s3_server() {
    let server = SeaweedFs::start();
    let store = server.cluster_store("prod");
    let rt = runtime();
    let start: jiff::Timestamp = "2026-11-01T02:00:00Z".parse().unwrap();
    let backups = nightly(start, 0, 10);
    let segments = synth::segments("mysql-bin", 1, 40, start, SignedDuration::from_hours(6));
    write_history(&rt, &store, &backups, &segments);
    let url = server.url();
    let args = [
        "--store",
        url.as_str(),
        "--cluster",
        "prod",
        "--keep-last",
        "3",
        "--now",
        NOW,
        "--output",
        "json",
    ];
    let mut plan = bin();
    plan.arg("plan").args(args).envs(server.env());
    let o = plan.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["summary"]["delete"], 7);
    assert_eq!(v["horizon"], "2026-11-08T02:00:00Z");

    let mut gc = bin();
    gc.arg("gc").args(args).envs(server.env());
    let o = gc.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let keys = rt.block_on(synth::all_keys(&store)).unwrap();
    assert_eq!(
        keys.iter().filter(|k| k.ends_with("metadata.json")).count(),
        3
    );
    let segs = keys
        .iter()
        .filter(|k| k.starts_with("binlogs/mysql-bin."))
        .count();
    assert_eq!(segs, 40 - v["segments"]["delete"].as_array().unwrap().len());
    assert_eq!(keys.iter().filter(|k| k.starts_with("_audit/")).count(), 1);
}

#[test]
fn ls_reports_a_hole_that_recovery_needs() {
    let (dir, url) = example_store();
    // Remove segment 100 (object and index entry): replay from every backup before it
    // stops there, so the window gets a gap and the hole affects recovery.
    let index_path = dir.path().join("demo/binlogs/_index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    index["segments"]
        .as_array_mut()
        .unwrap()
        .retain(|e| e["sequence"] != 100);
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::remove_file(dir.path().join("demo/binlogs/mysql-bin.000100")).unwrap();

    let o = run(&[
        "ls",
        "--store",
        &url,
        "--cluster",
        "demo",
        "--output",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(
        v["archive"]["missing"],
        serde_json::json!([{"from": 100, "to": 100, "affectsRecovery": true}])
    );
    assert_eq!(
        v["recoveryWindow"]["gaps"].as_array().unwrap().len(),
        1,
        "{}",
        v["recoveryWindow"]
    );

    let table = run(&["ls", "--store", &url, "--cluster", "demo"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("MISSING sequence numbers: 100"), "{text}");
    assert!(text.contains("1 gap(s)"), "{text}");
}

/// `tidemark rbac`: the default is deploy/rbac.yaml's content; `--namespace` makes Roles in
/// those namespaces and a ClusterRole that only reads PersistentVolumes; `--disable` leaves
/// the rights out; a bad namespace or capability is refused with the value and the form.
#[test]
fn rbac_prints_the_install_asked_for() {
    let docs = |o: &Output| -> Vec<Value> {
        assert!(o.status.success(), "{}", stderr(o));
        serde_saphyr::from_slice_multiple::<Value>(&o.stdout)
            .unwrap()
            .into_iter()
            .filter(|v| !v.is_null())
            .collect()
    };
    let default = docs(&run(&["rbac"]));
    let deploy = format!("{}/../../deploy/rbac.yaml", env!("CARGO_MANIFEST_DIR"));
    let plain: Vec<Value> =
        serde_saphyr::from_multiple::<Value>(&std::fs::read_to_string(deploy).unwrap())
            .unwrap()
            .into_iter()
            .filter(|v| !v.is_null())
            .collect();
    assert_eq!(default, plain);

    let scoped = docs(&run(&[
        "rbac",
        "--namespace",
        "team-a,team-b",
        "--disable",
        "exec",
        "--disable",
        "jobs",
    ]));
    let kinds: Vec<(String, String)> = scoped
        .iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap().to_owned(),
                d["metadata"]["namespace"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    for ns in ["team-a", "team-b"] {
        assert!(kinds.contains(&("Role".into(), ns.into())), "{kinds:?}");
        assert!(
            kinds.contains(&("RoleBinding".into(), ns.into())),
            "{kinds:?}"
        );
    }
    let cluster = scoped.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    assert_eq!(
        cluster["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        ])
    );
    let role = scoped.iter().find(|d| d["kind"] == "Role").unwrap();
    let rules = role["rules"].as_array().unwrap();
    assert!(
        !rules.iter().any(|r| r["resources"][0] == "pods/exec"),
        "{rules:?}"
    );
    let jobs = rules.iter().find(|r| r["resources"][0] == "jobs").unwrap();
    assert_eq!(jobs["verbs"], serde_json::json!(["get", "list", "watch"]));

    let bad = run(&["rbac", "--namespace", "Team_A"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("Team_A"), "{}", stderr(&bad));
    let bad = run(&["rbac", "--disable", "pods"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("pods") && stderr(&bad).contains("archiver"),
        "{}",
        stderr(&bad)
    );
}

/// `tidemark delete --backup-id` (issue 18 §6): the operator's requested deletion as a
/// command. A leaf increment goes (audit record first); the base of a committed increment
/// is marked instead (seed 002), naming what keeps it; bad and unknown ids are refused
/// (exit 2) and nothing is deleted.
#[test]
fn delete_removes_a_backup_or_marks_one_a_recovery_needs() {
    let (dir, url) = example_store();
    let ls = || {
        let out = run(&[
            "ls",
            "--store",
            &url,
            "--cluster",
            "demo",
            "--output",
            "json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)
    };
    let before = ls();
    let backups = before["backups"].as_array().unwrap().clone();
    let completed: Vec<&Value> = backups
        .iter()
        .filter(|b| b["phase"] == "completed")
        .collect();
    let parents: Vec<&str> = completed
        .iter()
        .filter_map(|b| b["parentId"].as_str())
        .collect();
    let newest = completed.last().unwrap()["backupId"].as_str().unwrap();
    let leaf = completed
        .iter()
        .map(|b| b["backupId"].as_str().unwrap())
        .find(|id| !parents.contains(id) && *id != newest)
        .unwrap();
    let base = parents[0];
    let delete = |id: &str| {
        run(&[
            "delete",
            "--store",
            &url,
            "--cluster",
            "demo",
            "--backup-id",
            id,
            "--output",
            "json",
        ])
    };

    let out = delete(leaf);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["outcome"], "deleted", "{v}");
    assert!(v["objectsDeleted"].as_u64().unwrap() >= 2, "{v}");
    let audit = v["auditRecord"].as_str().unwrap();
    assert!(dir.path().join(audit).exists(), "{audit}");
    let after = ls();
    assert!(!after.to_string().contains(leaf), "{after}");
    assert_eq!(
        after["backups"].as_array().unwrap().len(),
        backups.len() - 1
    );

    let out = delete(base);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["outcome"], "marked", "{v}");
    let kept = v["keptBy"].to_string();
    assert!(kept.contains("chain:"), "{v}");
    let name = v["backupName"].as_str().unwrap();
    assert!(
        dir.path()
            .join("demo")
            .join(name)
            .join(base)
            .join("_deletion-requested.json")
            .exists()
    );
    assert!(ls().to_string().contains(base));

    // A hold the operator recorded in the store (seed 000: every deleter sees it): marked,
    // not deleted.
    let other_leaf = completed
        .iter()
        .map(|b| b["backupId"].as_str().unwrap())
        .find(|id| !parents.contains(id) && *id != newest && *id != leaf)
        .unwrap();
    std::fs::create_dir_all(dir.path().join("demo/_state")).unwrap();
    std::fs::write(
        dir.path().join("demo/_state/holds.json"),
        serde_json::json!({"formatVersion": 1, "writtenAt": "2026-11-20T00:00:00Z",
            "writer": "test", "protect": [], "restores": [{"backupId": other_leaf, "by": "fix-orders"}]})
        .to_string(),
    )
    .unwrap();
    let out = delete(other_leaf);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["outcome"], "marked", "{v}");
    assert!(
        v["keptBy"].to_string().contains("restore:fix-orders"),
        "{v}"
    );
    assert!(ls().to_string().contains(other_leaf));
    std::fs::remove_file(dir.path().join("demo/_state/holds.json")).unwrap();

    for (id, says) in [
        ("nope", "not a backup-id"),
        (
            "20200101T000000Z-00000000",
            "no backup 20200101T000000Z-00000000",
        ),
    ] {
        let out = delete(id);
        assert_eq!(out.status.code(), Some(2), "{id}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{id}: {}", stderr(&out));
    }
    assert_eq!(ls()["backups"].as_array().unwrap().len(), backups.len() - 1);
}

/// `restore POLICY` takes the store from the policy: TIDEMARK_STORE and TIDEMARK_CLUSTER
/// in the environment (set for standalone use) do not stop it, while `--store` or
/// `--cluster` given with it are refused, naming the flag.
#[test]
fn restore_of_a_policy_ignores_the_environments_store() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["restore", "shop", "-n", "shop", "--dry-run"])
        .env("TIDEMARK_STORE", "file:///nowhere")
        .env("TIDEMARK_CLUSTER", "demo")
        .env("KUBECONFIG", dir.path().join("none"))
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!err.contains("is not used with it"), "{err}");
    // Past its arguments: it went for the cluster (there is none here).
    assert!(err.contains("no Kubernetes configuration"), "{err}");
    // --replay-threads with --replay client (which has no applier threads) is refused, as
    // the environment's TIDEMARK_REPLAY=client too, before the store is read.
    for (flags, env) in [
        (&["--replay", "client", "--replay-threads", "2"][..], None),
        (&["--replay-threads", "2"][..], Some("client")),
    ] {
        let mut cmd = bin();
        cmd.args([
            "restore",
            "--store",
            "file:///nonexistent-store",
            "--to",
            "2026-11-20T10:00:00Z",
            "--datadir",
        ])
        .arg(dir.path().join("restored"))
        .args(flags);
        if let Some(v) = env {
            cmd.env("TIDEMARK_REPLAY", v);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("--replay-threads 2 sets the applier's workers"),
            "{flags:?}: {}",
            stderr(&out)
        );
    }
    let bogus = bin()
        .args([
            "restore",
            "--store",
            "file:///nonexistent-store",
            "--to",
            "2026-11-20T10:00:00Z",
        ])
        .arg("--datadir")
        .arg(dir.path().join("restored"))
        .env("TIDEMARK_REPLAY", "parallel")
        .output()
        .unwrap();
    assert_eq!(bogus.status.code(), Some(2), "{}", stderr(&bogus));
    assert!(stderr(&bogus).contains("parallel"), "{}", stderr(&bogus));
    // Every flag a POLICY would ignore (issue 46 §4) is refused, named, before anything.
    let cases: &[(&[&str], &str)] = &[
        (
            &["restore", "shop", "--dry-run", "--store=file:///x"],
            "--store",
        ),
        (
            &["restore", "shop", "--dry-run", "--cluster", "demo"],
            "--cluster",
        ),
        (
            // A Restore's Job reaches the store the policy's way (a dry run reads it
            // from here, and may name another way there: --endpoint).
            &[
                "restore",
                "shop",
                "--into",
                "data-db-0",
                "--endpoint",
                "http://x",
            ],
            "--endpoint",
        ),
        (
            &[
                "restore",
                "shop",
                "--to",
                "2026-11-20T10:00:00Z",
                "--identity",
                "k.txt",
            ],
            "--identity",
        ),
        (
            &[
                "restore",
                "shop",
                "--to",
                "2026-11-20T10:00:00Z",
                "--report-file",
                "r.json",
            ],
            "--report-file",
        ),
        (
            &[
                "restore",
                "shop",
                "--to",
                "2026-11-20T10:00:00Z",
                "--mariabackup",
                "/bin/mb",
            ],
            "--mariabackup",
        ),
        (
            &["restore-test", "shop", "--mariadbd", "/bin/x"],
            "--mariadbd",
        ),
        (
            &["restore-test", "shop", "--bandwidth", "10MiB"],
            "--bandwidth",
        ),
        (&["ls", "shop", "--ca-bundle", "ca.pem"], "--ca-bundle"),
        (&["plan", "shop", "--identity=k.txt"], "--identity"),
        (&["gc", "shop", "--lock-period", "7d"], "--lock-period"),
    ];
    for (args, flag) in cases {
        let out = bin()
            .args(*args)
            .args(["-n", "shop"])
            .env("KUBECONFIG", dir.path().join("none"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("POLICY (shop) names its store and the operator does the work: {flag} is not used with it")),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // --from-copy is a POLICY's own: past the arguments, to the cluster.
    let out = bin()
        .args(["ls", "shop", "-n", "shop", "--from-copy", "dr"])
        .env("KUBECONFIG", dir.path().join("none"))
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("no Kubernetes configuration"),
        "{}",
        stderr(&out)
    );
}

/// A shell of the machine (scripts/test.sh installs zsh and fish): a missing one fails the
/// test, naming it.
fn shell(name: &str) -> std::process::Command {
    let found = std::process::Command::new(name)
        .args(["-c", "exit 0"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{name} is needed to check its completions (apt-get install {name}; scripts/test.sh does)"
    );
    std::process::Command::new(name)
}

/// `tidemark completions bash|zsh|fish` is parsed by each shell, and completes for real:
/// a command from its prefix, a flag of `plan` from its prefix.
#[test]
fn completions_load_and_complete_in_every_shell() {
    let dir = tempfile::tempdir().unwrap();
    let script = |sh: &str| {
        let o = run(&["completions", sh]);
        assert!(o.status.success(), "{}", stderr(&o));
        let path = dir.path().join(format!("tidemark.{sh}"));
        std::fs::write(&path, &o.stdout).unwrap();
        path
    };
    let complete = |sh: &str, code: String| {
        let o = shell(sh).args(["-c", &code]).output().unwrap();
        assert!(o.status.success(), "{sh}: {}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let bash = script("bash");
    let got = complete(
        "bash",
        format!(
            r#"source {0}; COMP_WORDS=(tidemark sta); COMP_CWORD=1; _tidemark tidemark sta tidemark; echo "${{COMPREPLY[@]}}"; COMP_WORDS=(tidemark plan --lock); COMP_CWORD=2; _tidemark tidemark --lock plan; echo "${{COMPREPLY[@]}}""#,
            bash.display()
        ),
    );
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(lines[0], "status", "bash: {got:?}");
    assert!(
        lines[1].split(' ').any(|f| f == "--lock-period"),
        "bash: {got:?}"
    );
    let fish = script("fish");
    let got = complete(
        "fish",
        format!("source {}; complete -C'tidemark sta'", fish.display()),
    );
    assert!(got.starts_with("status\t"), "fish: {got:?}");
    let zsh = script("zsh");
    let o = shell("zsh").arg("-n").arg(&zsh).output().unwrap();
    assert!(o.status.success(), "zsh -n: {}", stderr(&o));
    complete(
        "zsh",
        format!(
            "autoload -U compinit; compinit -u; source {}; whence -w _tidemark",
            zsh.display()
        ),
    );
}

/// `tidemark man --dir DIR` writes tidemark.1 and a page per command, each of which groff
/// formats without a warning; without --dir it prints tidemark.1.
#[test]
fn man_pages_are_written_and_format_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut pages: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    for page in [
        "tidemark.1",
        "tidemark-plan.1",
        "tidemark-status.1",
        "tidemark-restore.1",
    ] {
        assert!(pages.iter().any(|p| p == page), "{page} in {pages:?}");
    }
    let help = String::from_utf8(run(&["--help"]).stdout).unwrap();
    let commands = help
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("  ") && !l.trim_start().starts_with("help"))
        .filter(|l| l.chars().nth(2).is_some_and(|c| c.is_ascii_lowercase()))
        .count();
    assert_eq!(pages.len(), commands + 1, "{pages:?}");
    for page in &pages {
        let o = std::process::Command::new("groff")
            .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
            .arg(dir.path().join(page))
            .output()
            .expect("groff (Debian's groff-base) formats the man pages");
        assert!(
            o.status.success() && o.stderr.is_empty(),
            "{page}: {}",
            stderr(&o)
        );
    }
    let printed = run(&["man"]);
    assert!(printed.status.success());
    assert!(String::from_utf8_lossy(&printed.stdout).starts_with(".ie \\n(.g .ds Aq"));
}

/// Seed 002's forever incrementals: a chain that never ends keeps every backup of it, and
/// the plan says so — how many are kept only because a retained increment builds on them,
/// in the text and in JSON (`summary.keptOnlyForChains`) — and says nothing when rules
/// keep the whole chain.
#[test]
fn plan_says_what_is_kept_only_for_a_chain() {
    let (_dir, url) = example_store();
    let plan = |keep_last: &str, output: &str| {
        run(&[
            "plan",
            "--store",
            &url,
            "--cluster",
            "demo",
            "--now",
            NOW,
            "--keep-last",
            keep_last,
            "--output",
            output,
        ])
    };
    let o = plan("1", "json");
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let chain_only = v["backups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| {
            b["action"] == "keep"
                && b["reasons"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|r| r.as_str().unwrap().starts_with("chain:"))
        })
        .count();
    assert!(chain_only > 0, "{v}");
    assert_eq!(v["summary"]["keptOnlyForChains"], chain_only, "{v}");
    assert!(v["summary"]["keptOnlyForChainsBytes"].as_u64().unwrap() > 0);
    let text = String::from_utf8_lossy(&plan("1", "table").stdout).into_owned();
    assert!(
        text.contains(&format!(
            "Chains: {chain_only} backup(s) ({} B) kept only because a retained increment builds on them",
            v["summary"]["keptOnlyForChainsBytes"]
        )) && text.contains("docs/retention.md#forever-incrementals"),
        "{text}"
    );
    // The whole chain kept by keepLast: nothing kept only for it, no line.
    let o = plan("6", "json");
    assert_eq!(json(&o)["summary"]["keptOnlyForChains"], 0);
    let text = String::from_utf8_lossy(&plan("6", "table").stdout).into_owned();
    assert!(!text.contains("Chains:"), "{text}");
}

/// Seed 003 on the command line: DeleteHooks the operator recorded in the store
/// (`_state/hooks.json`) run only in the cluster, so `gc` refuses to delete what they
/// select (exit 2, naming them, nothing deleted), goes ahead with `--skip-hooks` (each
/// skipped hook in the audit record), and is not stopped by one that selects nothing it
/// deletes. Mutation tried: the pass not reading the record — the first gc deleted.
#[test]
fn gc_refuses_what_recorded_hooks_select_unless_told_to_skip_them() {
    let (dir, url) = example_store();
    let record = |selector: serde_json::Value| {
        std::fs::create_dir_all(dir.path().join("demo/_state")).unwrap();
        std::fs::write(
            dir.path().join("demo/_state/hooks.json"),
            serde_json::json!({"formatVersion": 1, "writtenAt": "2026-11-20T00:00:00Z",
                "writer": "tidemark-operator shop/db",
                "hooks": [{"name": "notify-dr", "action": "job", "selector": selector}]})
            .to_string(),
        )
        .unwrap();
    };
    let gc = |keep: &str, extra: &[&str]| {
        let mut args = vec![
            "gc",
            "--store",
            &url,
            "--cluster",
            "demo",
            "--now",
            NOW,
            "--keep-last",
            keep,
            "--output",
            "json",
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let metadata_count = || common::find(&dir.path().join("demo"), "metadata.json").len();
    // One that selects nothing the pass deletes stops nothing.
    record(serde_json::json!({"matchLabels": {"team": "nobody"}}));
    let before = metadata_count();
    let out = gc("12", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(metadata_count() < before, "nothing deleted");
    let before = metadata_count();
    // Every backup selected: refused, nothing deleted.
    record(serde_json::json!({}));
    let out = gc("3", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("notify-dr (job)")
            && err.contains("--skip-hooks")
            && err.contains("Nothing was deleted"),
        "{err}"
    );
    assert_eq!(metadata_count(), before);
    // Told to skip them: deleted, each skipped hook in the audit record.
    let out = gc("3", &["--skip-hooks"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert!(metadata_count() < before);
    let audit = v["executed"]["auditKey"].as_str().unwrap();
    let record: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(audit)).unwrap()).unwrap();
    let hooks = record["hooks"].to_string();
    assert!(
        hooks.contains("notify-dr") && hooks.contains("skipped"),
        "{record:#}"
    );
    // `delete` the same: refused without --skip-hooks, done with it.
    let ls = run(&[
        "ls",
        "--store",
        &url,
        "--cluster",
        "demo",
        "--output",
        "json",
    ]);
    let newest = json(&ls)["backups"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|b| b["phase"] == "completed")
        .unwrap()["backupId"]
        .as_str()
        .unwrap()
        .to_owned();
    let delete = |extra: &[&str]| {
        let mut args = vec![
            "delete",
            "--store",
            &url,
            "--cluster",
            "demo",
            "--backup-id",
            &newest,
            "--output",
            "json",
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let out = delete(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("notify-dr (job)"), "{}", stderr(&out));
    let out = delete(&["--skip-hooks"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["outcome"], "deleted", "{}", stderr(&out));
}

/// Seed 003 on the command line, one path for every deleter: `gc` and `delete` run the
/// webhooks and commands of the DeleteHooks they are given (`--hooks`, the definitions
/// applied to the cluster) right before a backup's data goes — a hook the operator
/// recorded in the store runs from its definition instead of refusing the pass — and not
/// when `delete` only marks a backup a recovery needs. A job hook given in the file cannot
/// run here: refused unless `--skip-hooks`. Mutations tried: hooks run for a deletion that
/// only marks (the marked deletion called the webhook); `runs` answering false (the
/// recorded webhook refused the pass).
#[test]
fn gc_and_delete_run_the_hooks_they_are_given_right_before_the_data_goes() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(tidemark_operator::testkit::Webhook::start());
    let (dir, url) = example_store();
    std::fs::create_dir_all(dir.path().join("demo/_state")).unwrap();
    // The operator recorded a webhook for this store: its definition is given below.
    std::fs::write(
        dir.path().join("demo/_state/hooks.json"),
        serde_json::json!({"formatVersion": 1, "writtenAt": "2026-11-20T00:00:00Z",
            "writer": "tidemark-operator shop/db",
            "hooks": [{"name": "a-notify", "action": "webhook", "selector": {}}]})
        .to_string(),
    )
    .unwrap();
    let log = dir.path().join("hook.log");
    let hooks = dir.path().join("hooks.yaml");
    std::fs::write(
        &hooks,
        format!(
            "apiVersion: tidemark.io/v1alpha1\nkind: DeleteHook\nmetadata: {{name: a-notify, namespace: shop}}\nspec:\n  webhook:\n    url: {}/ok\n    caBundle: {}\n  timeout: 10s\n---\napiVersion: tidemark.io/v1alpha1\nkind: DeleteHook\nmetadata: {{name: b-log}}\nspec:\n  command: [sh, -c, 'echo \"$TIDEMARK_DELETE_REASON $TIDEMARK_BACKUP\" >> {}']\n",
            server.url,
            serde_json::to_string(&server.ca_bundle).unwrap(),
            log.display()
        ),
    )
    .unwrap();
    let hooks_arg = hooks.display().to_string();
    // The test's webhook listens on loopback, which gc and delete deny by default.
    let allow_loopback = ["--deny-endpoints", ""];
    let gc = |keep: &str, extra: &[&str]| {
        let mut args = vec![
            "gc",
            "--store",
            &url,
            "--cluster",
            "demo",
            "--now",
            NOW,
            "--keep-last",
            keep,
            "--output",
            "json",
            // Most of the example store goes: not what this test is about.
            "--deletion-guard-threshold",
            "0",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&allow_loopback);
        run(&args)
    };
    let calls = || server.calls.lock().unwrap().clone();
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let out = gc("3", &["--hooks", &hooks_arg]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    let deleted: Vec<String> = v["executed"]["backupsDeleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_owned())
        .collect();
    assert!(!deleted.is_empty(), "{v}");
    let called: Vec<String> = calls()
        .iter()
        .map(|(_, body)| {
            assert_eq!(body["reason"], "retention", "{body}");
            body["backup"]["backupId"].as_str().unwrap().to_owned()
        })
        .collect();
    let mut sorted = called.clone();
    sorted.sort();
    let mut expected = deleted.clone();
    expected.sort();
    assert_eq!(sorted, expected, "one call per deleted backup");
    assert_eq!(logged().lines().count(), deleted.len(), "{}", logged());
    assert!(logged().lines().all(|l| l.starts_with("retention {")));
    let audit = v["executed"]["auditKey"].as_str().unwrap();
    let record: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(audit)).unwrap()).unwrap();
    let ran = record["hooks"].to_string();
    assert!(
        ran.contains("a-notify") && ran.contains("b-log") && !ran.contains("skipped"),
        "{record:#}"
    );

    // `delete` of a backup a recovery needs marks it: no hook runs.
    let ls = run(&[
        "ls",
        "--store",
        &url,
        "--cluster",
        "demo",
        "--output",
        "json",
    ]);
    let completed: Vec<Value> = json(&ls)["backups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["phase"] == "completed")
        .cloned()
        .collect();
    let parents: Vec<&str> = completed
        .iter()
        .filter_map(|b| b["parentId"].as_str())
        .collect();
    let ids: Vec<&str> = completed
        .iter()
        .map(|b| b["backupId"].as_str().unwrap())
        .collect();
    // Held: the newest (deleted without its hold); deleted: a leaf that is not the newest.
    let held = ids[ids.len() - 1];
    let free = *ids[..ids.len() - 1]
        .iter()
        .find(|id| !parents.contains(id))
        .unwrap();
    std::fs::write(
        dir.path().join("demo/_state/holds.json"),
        serde_json::json!({"formatVersion": 1, "writtenAt": "2026-11-20T00:00:00Z",
            "writer": "test", "protect": [held], "restores": []})
        .to_string(),
    )
    .unwrap();
    let delete = |id: &str, extra: &[&str]| {
        let mut args = vec![
            "delete",
            "--store",
            &url,
            "--cluster",
            "demo",
            "--backup-id",
            id,
            "--output",
            "json",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&allow_loopback);
        run(&args)
    };
    let (calls_before, log_before) = (calls().len(), logged().lines().count());
    let out = delete(held, &["--hooks", &hooks_arg]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["outcome"], "marked", "{}", stderr(&out));
    assert_eq!(
        calls().len(),
        calls_before,
        "a hook ran for a marked backup"
    );
    assert_eq!(logged().lines().count(), log_before);
    // One whose data goes: its hooks run first, reason deletionRequested.
    let out = delete(free, &["--hooks", &hooks_arg]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["outcome"], "deleted", "{}", stderr(&out));
    let last = calls().last().cloned().unwrap();
    assert_eq!(calls().len(), calls_before + 1);
    assert_eq!(last.1["reason"], "deletionRequested");
    assert_eq!(last.1["backup"]["backupId"], free);
    assert!(
        logged()
            .lines()
            .last()
            .unwrap()
            .starts_with("deletionRequested {"),
        "{}",
        logged()
    );

    // A job hook in the file cannot run here: refused, named, unless --skip-hooks.
    std::fs::write(
        &hooks,
        "apiVersion: tidemark.io/v1alpha1\nkind: DeleteHook\nmetadata: {name: c-job}\nspec:\n  job: {spec: {containers: [{name: c, image: busybox}]}}\n",
    )
    .unwrap();
    std::fs::remove_file(dir.path().join("demo/_state/holds.json")).unwrap();
    let out = delete(held, &["--hooks", &hooks_arg]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("c-job (job)") && err.contains("a-notify (webhook)"),
        "{err}"
    );
    let out = delete(held, &["--hooks", &hooks_arg, "--skip-hooks"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["outcome"], "deleted", "{}", stderr(&out));
    assert_eq!(calls().len(), calls_before + 1, "nothing else ran");

    // Without --deny-endpoints "", loopback (like cloud metadata) is never called: the hook
    // fails, named in the audit record, and cannot stop the deletion.
    std::fs::write(
        &hooks,
        format!(
            "apiVersion: tidemark.io/v1alpha1\nkind: DeleteHook\nmetadata: {{name: a-notify}}\nspec:\n  webhook: {{url: {}/ok}}\n",
            server.url
        ),
    )
    .unwrap();
    let leaf = ids[ids.len() - 2];
    let out = run(&[
        "delete",
        "--store",
        &url,
        "--cluster",
        "demo",
        "--backup-id",
        leaf,
        "--hooks",
        &hooks_arg,
        "--output",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["outcome"], "deleted", "{v}");
    assert_eq!(
        calls().len(),
        calls_before + 1,
        "a denied address was called"
    );
    let record: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join(v["auditRecord"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    assert_eq!(
        record["hooks"][0]["hooks"][0]["outcome"], "failed",
        "{record:#}"
    );
    drop(rt);
}

/// Seed 000's established-primary gate for deleters with only the store (issue 43 §2): the
/// operator records in `_state/holds.json` that its cluster has no established primary,
/// and `gc` from the command line then deletes nothing (exit 2, naming the record) — `plan`
/// shows the record — until the record says otherwise, or `--override-primary-gate`.
/// Mutation tried: the engine not reading `noPrimary` — the first gc deleted.
#[test]
fn gc_deletes_nothing_while_the_store_records_no_established_primary() {
    let (dir, url) = example_store();
    std::fs::create_dir_all(dir.path().join("demo/_state")).unwrap();
    std::fs::write(
        dir.path().join("demo/_state/holds.json"),
        serde_json::json!({"formatVersion": 1, "writtenAt": "2026-11-20T00:00:00Z",
            "writer": "tidemark-operator shop/db", "protect": [], "restores": [],
            "noPrimary": {"since": "2026-11-20T01:00:00Z",
                "message": "no established primary: no pod matches spec.source.selector (app=db)"}})
        .to_string(),
    )
    .unwrap();
    let pass = |cmd: &str, extra: &[&str]| {
        let mut args = vec![
            cmd,
            "--store",
            &url,
            "--cluster",
            "demo",
            "--now",
            NOW,
            "--keep-last",
            "3",
            // Most of the example store goes: not what this test is about.
            "--deletion-guard-threshold",
            "0",
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let metadata_count = || common::find(&dir.path().join("demo"), "metadata.json").len();
    let before = metadata_count();
    let out = pass("gc", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("tidemark-operator shop/db")
            && err.contains("no pod matches")
            && err.contains("--override-primary-gate")
            && err.contains("Nothing was deleted"),
        "{err}"
    );
    assert_eq!(metadata_count(), before);
    let out = pass("plan", &["--output", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["noPrimary"]["writer"], "tidemark-operator shop/db", "{v}");
    assert_eq!(v["noPrimary"]["since"], "2026-11-20T01:00:00Z", "{v}");
    let out = pass("plan", &[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("Primary: none established since 2026-11-20T01:00:00Z"),
        "{text}"
    );
    let out = pass("gc", &["--override-primary-gate"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(metadata_count() < before);
}

/// Issue 44: the source's retention keeps what a copy has not received yet (reason
/// `copy:<name>`), and lets it go once the copy has it; the copy keeps what the source
/// deletes (mutation: the copy records ignored by the pass — the unsent backup is deleted
/// by `--keep-last 1`).
#[test]
fn the_source_keeps_what_a_copy_has_not_received() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let src_url = format!("file://{}", src.path().display());
    let dst_url = format!("file://{}", dst.path().display());
    let push = || {
        let out = bin()
            .args(["push", "--store", &src_url, "--cluster", "c1"])
            .args(["--backup-name", "nightly"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write as _;
                c.stdin.take().unwrap().write_all(&[5u8; 10_000])?;
                c.wait_with_output()
            })
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let copy = || {
        let out = bin()
            .args([
                "copy",
                "--from",
                &src_url,
                "--cluster",
                "c1",
                "--to",
                &dst_url,
            ])
            .args(["--name", "dr", "--output", "json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let ids = |url: &str| -> Vec<String> {
        let out = bin()
            .args(["ls", "--store", url, "--cluster", "c1", "--output", "json"])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["backups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["backupId"].as_str().unwrap().to_owned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let (a, b) = (push(), push());
    assert_eq!(copy()["backupsSent"].as_array().unwrap().len(), 2);
    // The source's `ls` shows the copy, caught up.
    let out = run(&["ls", "--store", &src_url, "--cluster", "c1", "-o", "json"]);
    let listed = json(&out);
    assert_eq!(listed["copies"][0]["name"], "dr", "{listed:#}");
    assert_eq!(listed["copies"][0]["lagSeconds"], 0, "{listed:#}");
    assert!(
        listed["copies"][0]["copiedThrough"].is_string(),
        "{listed:#}"
    );
    let (c, d) = (push(), push());
    let out = run(&["ls", "--store", &src_url, "--cluster", "c1", "-o", "json"]);
    let listed = json(&out);
    assert!(
        listed["copies"][0]["copiedThrough"].is_string()
            && listed["recoveryWindow"]["to"].is_string(),
        "{listed:#}"
    );
    assert_ne!(
        listed["copies"][0]["copiedThrough"], listed["recoveryWindow"]["to"],
        "two newer backups not in the copy yet: {listed:#}"
    );
    let out = run(&["ls", "--store", &src_url, "--cluster", "c1"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Copy dr: "),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // c and d are not in the copy yet: keepLast 1 keeps d, and c for the copy.
    let gc = bin()
        .args([
            "gc",
            "--store",
            &src_url,
            "--cluster",
            "c1",
            "--keep-last",
            "1",
        ])
        .args(["--output", "json"])
        .output()
        .unwrap();
    assert!(
        gc.status.success(),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
    let gc: Value = serde_json::from_slice(&gc.stdout).unwrap();
    let kept_c = gc["backups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["backupId"] == c.as_str())
        .unwrap();
    assert_eq!(kept_c["action"], "keep", "{gc:#}");
    assert_eq!(kept_c["reasons"], serde_json::json!(["copy:dr"]), "{gc:#}");
    assert_eq!(ids(&src_url), sorted(vec![c.clone(), d.clone()]));
    // Once the copy has them, the source's rules alone decide; the copy keeps all four.
    assert_eq!(copy()["backupsSent"].as_array().unwrap().len(), 2);
    let gc = run(&[
        "gc",
        "--store",
        &src_url,
        "--cluster",
        "c1",
        "--keep-last",
        "1",
    ]);
    assert!(gc.status.success());
    assert_eq!(ids(&src_url), vec![d.clone()]);
    assert_eq!(ids(&dst_url), sorted(vec![a, b, c, d.clone()]));
    // A deletion by hand of a backup the copy has not received only marks it; once the
    // copy has it, the next pass deletes it (a rule that would keep it notwithstanding).
    let (e, f) = (push(), push());
    let out = run(&[
        "delete",
        "--store",
        &src_url,
        "--cluster",
        "c1",
        "--backup-id",
        &e,
        "--output",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["outcome"], "marked", "{v:#}");
    assert_eq!(v["keptBy"], serde_json::json!(["copy:dr"]), "{v:#}");
    assert_eq!(copy()["backupsSent"].as_array().unwrap().len(), 2);
    let gc = run(&[
        "gc",
        "--store",
        &src_url,
        "--cluster",
        "c1",
        "--keep-last",
        "3",
    ]);
    assert!(gc.status.success(), "{}", stderr(&gc));
    assert_eq!(ids(&src_url), sorted(vec![d, f]));
    assert!(ids(&dst_url).contains(&e));
}

/// Issue 46 §4: `keygen -o json` (every other command's -o is a format) is refused and
/// writes no file named json; `./json` is a file name.
#[test]
fn keygen_never_takes_a_format_name_for_a_file() {
    let dir = tempfile::tempdir().unwrap();
    for format in ["json", "yaml", "table", "wide"] {
        let out = bin()
            .current_dir(dir.path())
            .args(["keygen", "-o", format])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("not a format"), "{}", stderr(&out));
        assert!(!dir.path().join(format).exists());
    }
    let out = bin()
        .current_dir(dir.path())
        .args(["keygen", "-o", "./json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("age1"));
    assert!(dir.path().join("json").exists());
}

/// Issue 46 §4: commands list only the flags they use. A flag a shared group brings to a
/// command that ignores it is not in its help, and given on the command line it is
/// refused (exit 2, named); set in the environment it is let be. The commands that use
/// it still list and take it.
#[test]
fn commands_list_only_the_flags_they_use() {
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let help = |command: &str| {
        let out = run(&[command, "--help"]);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let unused: [(&str, &[&str]); 5] = [
        (
            "ls",
            &[
                "--recipient",
                "--bandwidth",
                "--lock-period",
                "--allow-plaintext-before",
            ],
        ),
        (
            "plan",
            &[
                "--recipient",
                "--bandwidth",
                "--lock-period",
                "--allow-plaintext-before",
            ],
        ),
        (
            "delete",
            &[
                "--recipient",
                "--bandwidth",
                "--lock-period",
                "--allow-plaintext-before",
            ],
        ),
        ("gc", &["--against", "--with"]),
        (
            "simulate",
            &[
                "--failed-ttl",
                "--require-verified",
                "--acknowledge-branches",
                "--deletion-guard-threshold",
                "--deletion-guard-window",
            ],
        ),
    ];
    for (command, flags) in unused {
        let text = help(command);
        for flag in flags {
            assert!(
                !text.contains(&format!("{flag} ")),
                "{command} lists {flag}:\n{text}"
            );
        }
    }
    assert!(help("push").contains("--recipient"));
    assert!(help("restore").contains("--allow-plaintext-before"));
    assert!(help("plan").contains("--against"));
    assert!(help("gc").contains("--failed-ttl"));
    // Its passes stop at the cap as real ones do.
    assert!(help("simulate").contains("--max-deletions"));

    let ls = ["ls", "--store", &url, "--cluster", "c1"];
    let out = run(&[&ls[..], &["--bandwidth", "1MiB/s"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--bandwidth is not used by `tidemark ls`"),
        "{}",
        stderr(&out)
    );
    let out = run(&[&ls[..], &["--bandwidth=1MiB/s"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = bin()
        .args(ls)
        .env("TIDEMARK_BANDWIDTH", "1MiB/s")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&[
        "simulate",
        "--schedule",
        "0 0 2 * * *",
        "--keep-last",
        "3",
        "--failed-ttl",
        "3d",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--failed-ttl is not used by `tidemark simulate`"),
        "{}",
        stderr(&out)
    );
}

/// Issue 44: a copy holds the stored bytes — a compressed, encrypted payload is copied as
/// ciphertext, `metadata.json` unchanged — and reads back with the source's identity; a
/// backup deleted from the source by hand stays in the copy (no deletion is mirrored).
#[test]
fn a_copy_holds_the_stored_bytes_and_outlives_a_deletion_by_hand() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (src_url, dst_url) = (
        format!("file://{}", src.path().display()),
        format!("file://{}", dst.path().display()),
    );
    let identity = keys.path().join("key.txt");
    let out = run(&["keygen", "--output", identity.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let recipient = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let content: Vec<u8> = (0..200_000u32)
        .flat_map(|i| (i % 251).to_le_bytes())
        .collect();
    let push = || {
        let mut child = bin()
            .args(["push", "--store", &src_url, "--cluster", "c1"])
            .args(["--backup-name", "nightly", "--compression", "zstd"])
            .args(["--recipient", &recipient])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(&content).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let (older, newer) = (push(), push());
    let copy = || {
        let out = run(&[
            "copy",
            "--from",
            &src_url,
            "--cluster",
            "c1",
            "--to",
            &dst_url,
            "--name",
            "dr",
            "--output",
            "json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)
    };
    assert_eq!(copy()["backupsSent"].as_array().unwrap().len(), 2);
    // The same objects, byte for byte: the payload stays compressed and encrypted.
    for id in [&older, &newer] {
        let dir = |root: &Path| root.join("c1/nightly").join(id);
        for file in ["metadata.json", "backup.bin.zst"] {
            assert_eq!(
                std::fs::read(dir(src.path()).join(file)).unwrap(),
                std::fs::read(dir(dst.path()).join(file)).unwrap(),
                "{id}/{file}"
            );
        }
        let m: Value =
            serde_json::from_slice(&std::fs::read(dir(dst.path()).join("metadata.json")).unwrap())
                .unwrap();
        assert_eq!(m["payload"][0]["compression"], "zstd", "{m:#}");
        assert!(m["payload"][0]["encryption"].is_object(), "{m:#}");
    }
    // The older deleted from the source by hand: the copy keeps it, and a second pass
    // sends nothing and deletes nothing.
    let out = run(&[
        "delete",
        "--store",
        &src_url,
        "--cluster",
        "c1",
        "--backup-id",
        &older,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !src.path()
            .join("c1/nightly")
            .join(&older)
            .join("metadata.json")
            .exists()
    );
    let again = copy();
    assert_eq!(again["bytes"], 0, "{again:#}");
    // It reads back from the copy with the source's identity (and not without it).
    let fetched = run(&[
        "fetch",
        "--store",
        &dst_url,
        "--cluster",
        "c1",
        "--backup-id",
        &older,
        "--identity",
        identity.to_str().unwrap(),
    ]);
    assert!(fetched.status.success(), "{}", stderr(&fetched));
    assert!(
        fetched.stdout == content,
        "the copy's payload reads back as pushed"
    );
    let without = run(&[
        "fetch",
        "--store",
        &dst_url,
        "--cluster",
        "c1",
        "--backup-id",
        &older,
    ]);
    assert!(!without.status.success(), "read without the identity");
}

/// A real `tidemark copy` killed (SIGKILL) at random points of its pass, over and over,
/// into a real S3 server: after every cut the copy holds only whole backups (each listed
/// one reads back against its record, with its chain) and only indexed segments that read
/// back; the next pass — after the killed copier's lease expired — takes over and the
/// copy converges to the source, after which a pass sends nothing.
#[test]
fn a_copy_killed_at_random_points_converges() {
    let s3 = SeaweedFs::start();
    let src = tempfile::tempdir().unwrap();
    let src_url = format!("file://{}", src.path().display());
    let source = tidemark_store::ClusterStore::open(&src_url, "c1", &Default::default()).unwrap();
    let start: jiff::Timestamp = "2026-11-20T00:00:00Z".parse().unwrap();
    // Two chains (a full and two increments each), 3 MiB apiece, and 40 hourly segments
    // from the first backup on.
    let mut backups = Vec::new();
    for chain in 0..2u32 {
        let at = |k: u32| start + SignedDuration::from_hours(i64::from(chain * 12 + k));
        let log = |k: u32| Some(format!("mysql-bin.{:06}", chain * 12 + k + 1));
        let mut full = SynthBackup::full("nightly", at(0), chain * 10);
        full.payload = vec![chain as u8; 3 << 20];
        full.log_file = log(0);
        let mut parent = full.id.clone();
        backups.push(full);
        for k in 1..3 {
            let mut inc = SynthBackup::incremental("nightly", &parent, at(k), chain * 10 + k);
            inc.payload = vec![(chain * 10 + k) as u8; 3 << 20];
            inc.log_file = log(k);
            parent = inc.id.clone();
            backups.push(inc);
        }
    }
    let segments = synth::segments("mysql-bin", 1, 40, start, SignedDuration::from_hours(1));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        synth::write_backups(&source, &backups).await.unwrap();
        synth::write_segments(&source, &segments).await.unwrap();
        synth::write_index(&source, &segments).await.unwrap();
    });
    let dst = s3.url();
    let tidemark = |args: &[&str]| {
        let mut c = bin();
        c.args(args).envs(s3.env()).env("TIDEMARK_LEASE_TTL", "3s");
        c
    };
    let copy_args = [
        "copy",
        "--from",
        &src_url,
        "--cluster",
        "c1",
        "--to",
        &dst,
        "--name",
        "dr",
        "--bandwidth",
        "2MiB/s",
        "--wait=1m",
        "--output",
        "json",
    ];
    let listed = |url: &str| -> Vec<(String, String, Option<String>)> {
        let o = tidemark(&["ls", "--store", url, "--cluster", "c1", "-o", "json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let mut out: Vec<_> = json(&o)["backups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["backupId"].as_str().unwrap().to_owned(),
                    b["phase"].as_str().unwrap().to_owned(),
                    b["parentId"].as_str().map(str::to_owned),
                )
            })
            .collect();
        out.sort();
        out
    };
    // Whatever a cut left: every backup listed is whole, with its chain; every indexed
    // segment reads back.
    let whole = |when: &str| {
        let mut copy = listed(&dst);
        // A cut attempt is listed for what it is, and a later pass takes it over.
        copy.retain(|(id, phase, _)| {
            assert!(
                ["completed", "uncommitted"].contains(&phase.as_str()),
                "{when}: {id} listed as {phase}"
            );
            phase == "completed"
        });
        let ids: Vec<&str> = copy.iter().map(|(id, _, _)| id.as_str()).collect();
        for (id, _, parent) in &copy {
            if let Some(p) = parent {
                assert!(
                    ids.contains(&p.as_str()),
                    "{when}: {id} without its parent {p}"
                );
            }
        }
        if !copy.is_empty() {
            let o = tidemark(&[
                "verify",
                "--store",
                &dst,
                "--cluster",
                "c1",
                "--sample",
                "1",
            ])
            .output()
            .unwrap();
            assert!(o.status.success(), "{when}: {}", stderr(&o));
        }
        copy.len()
    };
    // TIDEMARK_TEST_SEED replays a run's kill points.
    let seed = std::env::var("TIDEMARK_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("kill points drawn from seed {seed} (TIDEMARK_TEST_SEED)");
    let mut rng = seed | 1;
    let mut next = || {
        // xorshift64
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut seen = Vec::new();
    for round in 0..6 {
        let mut child = tidemark(&copy_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // A whole pass takes about 8 s at this rate: each cut leaves it part done.
        let after = std::time::Duration::from_millis(100 + next() % 2_500);
        std::thread::sleep(after);
        let finished = child.try_wait().unwrap().is_some();
        child.kill().unwrap();
        child.wait().unwrap();
        let n = whole(&format!("round {round}, cut after {after:?}"));
        seen.push((after, n, finished));
        // The killed copier's lease expires: the next one takes over its attempts.
        std::thread::sleep(std::time::Duration::from_millis(3_200));
    }
    eprintln!("cuts (after, backups in the copy, pass had ended): {seen:?}");
    // The first cut comes at most 2.6 s into a pass of about 8 s: it cuts a pass midway.
    assert!(
        seen.iter().any(|(_, _, ended)| !ended),
        "no pass was cut midway: {seen:?}"
    );
    let o = tidemark(&copy_args).output().unwrap();
    assert!(
        o.status.success(),
        "{:?}: {}{}",
        o.status,
        stderr(&o),
        String::from_utf8_lossy(&o.stdout)
    );
    let v = json(&o);
    assert!(v["failures"].as_array().unwrap().is_empty(), "{v:#}");
    assert_eq!(whole("after the last pass"), backups.len());
    assert_eq!(listed(&dst), listed(&src_url));
    let o = tidemark(&[
        "verify",
        "--store",
        &dst,
        "--cluster",
        "c1",
        "--sample",
        "1",
        "-o",
        "json",
    ])
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["segments"]["checked"], 40, "{v:#}");
    // Converged: nothing left to send.
    let o = tidemark(&copy_args).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["backupsSent"], serde_json::json!([]), "{v:#}");
    assert_eq!(v["segmentsSent"], 0, "{v:#}");
    // A copy whose own window is 3 days declines the older chain, saying why.
    let other = tempfile::tempdir().unwrap();
    let other_url = format!("file://{}", other.path().display());
    let o = tidemark(&[
        "copy",
        "--from",
        &src_url,
        "--cluster",
        "c1",
        "--to",
        &other_url,
        "--name",
        "dr2",
        "--window",
        "3d",
        "--dry-run",
        "-o",
        "json",
    ])
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let older: Vec<&str> = backups[..3].iter().map(|b| b.id.as_str()).collect();
    assert_eq!(v["backupsDeclined"], serde_json::json!(older), "{v:#}");
    for d in v["declined"].as_array().unwrap() {
        assert_eq!(d["reasons"], serde_json::json!(["expired"]), "{v:#}");
    }
    assert_eq!(v["declined"].as_array().unwrap().len(), 3, "{v:#}");
}

/// `retention.pointInTime.window` (issue 45 §1): binlogs are kept from the start of the
/// newest backup completed before `now − window`, no further; backups kept longer by other
/// rules are `standalone` and restore to their own points; the holes between them are
/// intended, so neither `plan`, `gc` nor `ls --policy` calls them gaps ("point in time from
/// … snapshots back to …"), while `ls` without the policy still shows them.
#[test]
fn a_point_in_time_window_keeps_binlogs_for_its_span_only() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let store = tidemark_store::ClusterStore::open(&url, "db", &Default::default()).unwrap();
    // 60 nightly fulls (02:00, five minutes each) up to NOW, and segments every 6 hours over
    // the whole span.
    let start: jiff::Timestamp = "2026-09-22T02:00:00Z".parse().unwrap();
    let backups = nightly(start, 0, 60);
    let segments = synth::segments("mysql-bin", 1, 60 * 4, start, SignedDuration::from_hours(6));
    let rt = runtime();
    write_history(&rt, &store, &backups, &segments);
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {name: db}\nspec:\n  objectStore: {url: file://.}\n  retention:\n    keepDaily: 7\n    keepMonthly: 3\n    pointInTime: {window: 14d}\n    deletionGuard: {threshold: 0}\n",
    )
    .unwrap();
    let p = policy.to_str().unwrap();
    let o = run(&["plan", "--policy", p, "--now", NOW, "--output", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let reasons = |id: &str| -> Vec<String> {
        v["backups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["backupId"].as_str().unwrap().starts_with(id))
            .map(|b| {
                b["reasons"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_else(|| panic!("no backup {id}"))
    };
    // NOW − 14d = 11-06T12:00: the 11-06 backup is the one the window replays from.
    assert_eq!(reasons("20261106T020000Z"), ["pointInTime"]);
    assert_eq!(v["horizon"], "2026-11-06T02:00:00Z");
    // Monthlies from before restore to their own points only.
    for monthly in ["20260930T020000Z", "20261031T020000Z"] {
        let r = reasons(monthly);
        assert!(r.contains(&"standalone".to_owned()), "{monthly}: {r:?}");
        assert!(
            r.iter().any(|r| r.starts_with("monthly:")),
            "{monthly}: {r:?}"
        );
    }
    assert!(!reasons("20261114T020000Z").contains(&"standalone".to_owned()));
    // Every segment ending before the horizon goes; none after.
    let deleted = v["segments"]["delete"].as_array().unwrap().len();
    let behind = segments
        .iter()
        .filter(|s| s.last_event_at.unwrap() < "2026-11-06T02:00:00Z".parse().unwrap())
        .count();
    assert_eq!(deleted, behind);
    let w = &v["recoveryWindow"];
    assert_eq!(w["from"], "2026-09-30T02:05:00Z", "{w}");
    assert_eq!(w["pointInTimeFrom"], "2026-11-06T02:05:00Z", "{w}");
    assert_eq!(w["gaps"], serde_json::json!([]), "{w}");
    let table = run(&["plan", "--policy", p, "--now", NOW]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("point in time from 2026-11-06T02:05:00Z")
            && text.contains("snapshots back to 2026-09-30T02:05:00Z"),
        "{text}"
    );

    // The change previewed against the same rules without the window (issue 45 §2): the
    // instants before its start stop being restorable, and no backup is deleted for it.
    let before = dir.path().join("before.yaml");
    std::fs::write(
        &before,
        "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {name: db}\nspec:\n  objectStore: {url: file://.}\n  retention:\n    keepDaily: 7\n    keepMonthly: 3\n    deletionGuard: {threshold: 0}\n",
    )
    .unwrap();
    let o = run(&[
        "plan",
        "--policy",
        p,
        "--against",
        before.to_str().unwrap(),
        "--now",
        NOW,
        "-o",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c = json(&o)["change"].clone();
    assert_eq!(
        c["lost"],
        serde_json::json!([{"from": "2026-09-30T02:05:00Z", "to": "2026-11-06T02:05:00Z"}]),
        "{c}"
    );
    assert_eq!(
        c["recoveryWindow"]["after"]["pointInTimeFrom"], "2026-11-06T02:05:00Z",
        "{c}"
    );
    assert_eq!(
        c["recoveryWindow"]["before"]["pointInTimeFrom"], "2026-09-30T02:05:00Z",
        "{c}"
    );

    let o = run(&["gc", "--policy", p, "--now", NOW, "--output", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let keys = rt.block_on(synth::all_keys(&store)).unwrap();
    let left = keys
        .iter()
        .filter(|k| k.starts_with("binlogs/mysql-bin."))
        .count();
    assert_eq!(left, segments.len() - behind);
    // Today (the clock, later than NOW) the window starts after the horizon of that pass:
    // the holes before it are the snapshots', not gaps — with the policy.
    let o = run(&["ls", "--policy", p, "--output", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let w = json(&o)["recoveryWindow"].clone();
    assert_eq!(w["gaps"], serde_json::json!([]), "{w}");
    assert_eq!(w["from"], "2026-09-30T02:05:00Z", "{w}");
    assert_eq!(w["pointInTimeFrom"], "2026-11-06T02:05:00Z", "{w}");
    let o = run(&["ls", "--store", &url, "--cluster", "db", "--output", "json"]);
    let w = json(&o)["recoveryWindow"].clone();
    assert_eq!(w["gaps"].as_array().unwrap().len(), 2, "{w}");
    assert_eq!(w["pointInTimeFrom"], w["from"], "{w}");
}

/// The deletion guard (issue 45 §3) through the real binary: a policy edit that would
/// delete most of the history is held — nothing deleted, not even binlogs — until
/// acknowledged with an instant at or after the hold; that acknowledgement does not release
/// the next wave. A listing that suddenly shows most backups gone deletes nothing either.
#[test]
fn a_mass_deletion_is_held_until_acknowledged_and_the_next_wave_again() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let store = tidemark_store::ClusterStore::open(&url, "db", &Default::default()).unwrap();
    let start: jiff::Timestamp = "2026-09-25T02:00:00Z".parse().unwrap();
    let nightly = |from: i64, n: i64| nightly(start, from, n);
    let segments = synth::segments("mysql-bin", 1, 30 * 4, start, SignedDuration::from_hours(6));
    let rt = runtime();
    write_history(&rt, &store, &nightly(0, 30), &segments);
    let count = |prefix: &str| {
        rt.block_on(synth::all_keys(&store))
            .unwrap()
            .iter()
            .filter(|k| k.starts_with(prefix) || k.ends_with(prefix))
            .count()
    };
    let gc = |keep: &str, now: &str, ack: Option<&str>| {
        let mut args = vec![
            "gc",
            "--store",
            &url,
            "--cluster",
            "db",
            "--keep-last",
            keep,
            "--now",
            now,
            "-o",
            "json",
        ];
        if let Some(a) = ack {
            args.extend(["--allow-mass-deletion", a]);
        }
        let o = run(&args);
        let v = json(&o);
        // 11 when the guard held something, else success.
        let held = v["deletionGuard"]["held"]
            .as_object()
            .is_some_and(|h| !h.is_empty())
            || v["deletionGuard"]["holdSegments"] == true;
        assert_eq!(
            o.status.code(),
            Some(if held { 11 } else { 0 }),
            "{}",
            stderr(&o)
        );
        (v, stderr(&o))
    };
    let now = "2026-10-25T12:00:00Z";
    // The policy as it was: nothing to delete.
    let (v, _) = gc("30", now, None);
    assert_eq!(v["deletionGuard"]["held"], serde_json::json!({}));
    // The edit: 27 of 30 would go. Held, binlogs too.
    let (v, err) = gc("3", now, None);
    let g = &v["deletionGuard"];
    assert_eq!(g["held"].as_object().unwrap().len(), 27, "{g}");
    assert_eq!(g["trips"][0]["kind"], "count", "{g}");
    assert_eq!(g["holdSegments"], true);
    assert_eq!(count("metadata.json"), 30);
    assert_eq!(count("binlogs/mysql-bin."), segments.len());
    let held = v["backups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["reasons"] == serde_json::json!(["deletionGuard"]))
        .count();
    assert_eq!(held, 27);
    let since = g["releaseWith"].as_str().unwrap().to_owned();
    assert!(
        err.contains(&format!("--allow-mass-deletion {since}")),
        "{err}"
    );
    // An acknowledgement in the future is refused: it would release every wave to come.
    let o = run(&[
        "gc",
        "--store",
        &url,
        "--cluster",
        "db",
        "--keep-last",
        "3",
        "--now",
        now,
        "--allow-mass-deletion",
        "2099-01-01T00:00:00Z",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(count("metadata.json"), 30);
    // An acknowledgement from before the hold releases nothing …
    let before: jiff::Timestamp = since.parse().unwrap();
    let early = (before - SignedDuration::from_secs(1)).to_string();
    let (v, _) = gc("3", now, Some(&early));
    assert_eq!(v["deletionGuard"]["held"].as_object().unwrap().len(), 27);
    assert_eq!(count("metadata.json"), 30);
    // … the instant it printed releases the wave.
    let (v, _) = gc("3", now, Some(&since));
    assert_eq!(v["deletionGuard"]["released"].as_array().unwrap().len(), 27);
    assert_eq!(count("metadata.json"), 3);
    assert!(count("binlogs/mysql-bin.") < segments.len());
    // A new wave after it: 30 more nights, then keepLast 3 again with the old
    // acknowledgement still given — held.
    rt.block_on(synth::write_backups(&store, &nightly(30, 30)))
        .unwrap();
    let later = "2026-11-24T12:00:00Z";
    let (v, _) = gc("33", later, Some(&since));
    assert_eq!(v["deletionGuard"]["held"], serde_json::json!({}));
    let (v, _) = gc("3", later, Some(&since));
    assert_eq!(
        v["deletionGuard"]["held"].as_object().unwrap().len(),
        30,
        "{}",
        v["deletionGuard"]
    );
    assert_eq!(count("metadata.json"), 33);

    // A listing that suddenly lacks most backups (here: 30 metadata.json gone by hand)
    // deletes nothing, not a segment, not an index entry.
    let segs_before = count("binlogs/mysql-bin.");
    for b in nightly(30, 30) {
        std::fs::remove_file(
            dir.path()
                .join("db")
                .join(&b.name)
                .join(&b.id)
                .join("metadata.json"),
        )
        .unwrap();
    }
    let (v, _) = gc("33", later, None);
    let g = &v["deletionGuard"];
    assert!(
        g["trips"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["kind"] == "listing"),
        "{g}"
    );
    assert_eq!(g["holdSegments"], true);
    assert_eq!(count("binlogs/mysql-bin."), segs_before);
}

/// The review's finding: a pass whose guard holds only segment deletions (a point-in-time
/// window shortened from the whole history to two days, past `deletionGuard.window`)
/// reports the recovery window that stands — every instant still replays — not the one of
/// deletions that are not happening.
#[test]
fn a_held_pass_reports_the_window_that_stands() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let store = tidemark_store::ClusterStore::open(&url, "db", &Default::default()).unwrap();
    let start: jiff::Timestamp = "2026-09-25T02:00:00Z".parse().unwrap();
    let segments = synth::segments("mysql-bin", 1, 30 * 4, start, SignedDuration::from_hours(6));
    let rt = runtime();
    write_history(&rt, &store, &nightly(start, 0, 30), &segments);
    let now = "2026-10-25T03:00:00Z";
    let gc = |extra: &[&str]| {
        let mut args = vec![
            "gc",
            "--store",
            &url,
            "--cluster",
            "db",
            "--keep-last",
            "30",
            "--now",
            now,
            "-o",
            "json",
        ];
        args.extend(extra);
        run(&args)
    };
    let o = gc(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let whole = json(&o)["recoveryWindow"].clone();
    let o = gc(&["--pitr-window", "2d", "--deletion-guard-window", "1d"]);
    assert_eq!(o.status.code(), Some(11), "{}", stderr(&o));
    let v = json(&o);
    let g = &v["deletionGuard"];
    assert_eq!(g["trips"][0]["kind"], "window", "{g}");
    assert!(g["held"].as_object().unwrap().is_empty(), "{g}");
    assert!(!g["heldSegments"].as_object().unwrap().is_empty(), "{g}");
    let w = &v["recoveryWindow"];
    assert_eq!(w["from"], whole["from"], "{w}");
    assert_eq!(
        w["pointInTimeFrom"], whole["from"],
        "every instant still replays: {w}"
    );
    assert_eq!(w["gaps"], serde_json::json!([]), "{w}");
    let left = rt
        .block_on(synth::all_keys(&store))
        .unwrap()
        .iter()
        .filter(|k| k.starts_with("binlogs/mysql-bin."))
        .count();
    assert_eq!(left, segments.len());
}

/// `plan --policy NEW --against CURRENT` (issue 45 §2): the preview's deletions are what
/// the new policy's plan deletes and the current one's keeps, with both windows and the
/// instants lost; as JSON and as a table. `gc` refuses the flag.
#[test]
fn plan_against_previews_a_policy_change() {
    let (dir, _url) = example_store();
    let file = |name: &str, retention: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!("apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {{name: demo}}\nspec:\n  objectStore: {{url: file://.}}\n  retention: {retention}\n"),
        )
        .unwrap();
        path.to_str().unwrap().to_owned()
    };
    let current = file(
        "current.yaml",
        "{window: 7d, keepWeekly: 2, failedBackupsTTL: 3d, coverWindow: true}",
    );
    // (The guard off, so that each plan alone shows its deletions, not the guard's holds.)
    let new = file(
        "new.yaml",
        "{keepLast: 2, failedBackupsTTL: 3d, deletionGuard: {threshold: 0}}",
    );
    let deleted = |policy: &str| -> std::collections::BTreeSet<String> {
        let o = run(&["plan", "--policy", policy, "--now", NOW, "-o", "json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["backups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["action"] == "delete")
            .map(|b| b["backupId"].as_str().unwrap().to_owned())
            .collect()
    };
    let (now_deleted, new_deleted) = (deleted(&current), deleted(&new));
    let o = run(&[
        "plan",
        "--policy",
        &new,
        "--against",
        &current,
        "--now",
        NOW,
        "-o",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let c = &v["change"];
    let ids = |key: &str| -> std::collections::BTreeSet<String> {
        c[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["backupId"].as_str().unwrap().to_owned())
            .collect()
    };
    let expected: std::collections::BTreeSet<String> =
        new_deleted.difference(&now_deleted).cloned().collect();
    assert!(!expected.is_empty());
    assert_eq!(ids("newlyDeleted"), expected, "{c}");
    assert_eq!(
        ids("newlyKept"),
        now_deleted.difference(&new_deleted).cloned().collect(),
        "{c}"
    );
    // The protected backup from before keeps the window's start: nothing is lost.
    assert_eq!(
        c["recoveryWindow"]["before"], c["recoveryWindow"]["after"],
        "{c}"
    );
    assert_eq!(c["lost"], serde_json::json!([]), "{c}");
    let table = run(&[
        "plan",
        "--policy",
        &new,
        "--against",
        &current,
        "--now",
        NOW,
    ]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("Policy change")
            && text.contains(&format!(
                "deletes {} backup(s) the current policy keeps",
                expected.len()
            ))
            && text.contains("no instant restorable now stops being restorable"),
        "{text}"
    );
    let gc = run(&["gc", "--policy", &new, "--against", &current, "--now", NOW]);
    assert_eq!(gc.status.code(), Some(2), "{}", stderr(&gc));
}

/// Issue 46 §5: the README's first command — Tidemark's main job on the bundled example —
/// as written (`cargo run -p tidemark --` is this binary), from a copy of the
/// repository's examples/local: the immediate backup and one every 10 s of
/// examples/local/data into examples/local/backups/, the newest 3 kept by the retention
/// passes; SIGTERM stops it (exit 0); the newest backup holds the data directory.
#[test]
fn the_readmes_run_command_works_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let command = "cargo run -p tidemark -- run --config examples/local";
    assert!(
        readme.contains(command),
        "the README no longer says {command}"
    );
    let repo = tempfile::tempdir().unwrap();
    let local = repo.path().join("examples/local");
    copy_dir(&root.join("examples/local/data"), &local.join("data"));
    for file in ["policy.yaml", "schedule.yaml"] {
        std::fs::copy(root.join("examples/local").join(file), local.join(file)).unwrap();
    }
    let log = repo.path().join("run.log");
    let mut child = bin()
        .current_dir(repo.path())
        .args(command.split(' ').skip(5).collect::<Vec<_>>())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let backups = local.join("backups");
    let url = format!("file://{}", backups.display());
    let listed = |cluster: &str| -> Vec<String> {
        let out = run(&["ls", "--store", &url, "--cluster", cluster, "-o", "json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)["backups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["phase"] == "completed")
            .map(|b| b["backupId"].as_str().unwrap().to_owned())
            .collect()
    };
    // Every backup made, and the retention pass seen keeping the newest 3 of more.
    let mut seen = std::collections::BTreeSet::new();
    let mut pruned = false;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut cluster = String::new();
    while !pruned {
        assert!(
            std::time::Instant::now() < deadline,
            "no retention pass within 120 s; backups seen: {seen:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_secs(1));
        if cluster.is_empty() {
            cluster = std::fs::read_dir(&backups)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|n| !n.starts_with('.') && !n.starts_with('_'))
                .unwrap_or_default();
            continue;
        }
        let now = listed(&cluster);
        seen.extend(now.iter().cloned());
        // A pass that deleted what keepLast 3 does not keep. (Not "exactly 3 listed": the
        // passes and the slots run 10 s apart at a phase set by the start, and 3 may show
        // for 50 ms only, before the next slot's backup.)
        pruned = seen.len() > 3
            && std::fs::read_to_string(&log).is_ok_and(|l| l.contains("retention: deleted"));
        assert!(now.len() <= 4, "more than one past keepLast 3: {now:?}");
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "{status}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // The newest backup is the data directory, as tar made it.
    let newest = listed(&cluster).into_iter().max().unwrap();
    let out = local.join("newest.tar");
    let fetched = run(&[
        "fetch",
        "--store",
        &url,
        "--cluster",
        &cluster,
        "--backup-id",
        &newest,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(fetched.status.success(), "{}", stderr(&fetched));
    let listing = std::process::Command::new("tar")
        .arg("-tf")
        .arg(&out)
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&listing.stdout);
    for file in ["./README.txt", "./created-at.txt"] {
        assert!(names.lines().any(|l| l == file), "{file} not in:\n{names}");
    }
}

/// Issue 46 §5: the README's sample `plan` output is the real command's, as the README says
/// to run it: each of its lines is a line of the output, in order (`…` stands for lines
/// left out).
#[test]
fn the_readme_sample_plan_is_the_real_output() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let command =
        "cargo run -p tidemark -- plan --policy examples/policy.yaml --now 2026-11-20T12:00:00Z";
    assert!(
        readme.contains(command),
        "the README no longer says {command}"
    );
    let at = readme
        .find("```\nACTION  BACKUP-ID")
        .expect("the README's sample plan");
    let sample = &readme[at + 4..];
    let sample = &sample[..sample.find("```").unwrap()];
    let out = bin()
        .current_dir(&root)
        .args(["plan", "--policy", "examples/policy.yaml", "--now", NOW])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let real = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = real.lines().map(str::trim_end);
    for want in sample.lines().map(str::trim_end).filter(|l| *l != "…") {
        assert!(
            lines.any(|l| l == want),
            "README line {want:?} is not (in order) in the output:\n{real}"
        );
    }
}

/// Issue 46 §4: a flag that only means something with another is refused without it (exit
/// 2, naming the one missing) rather than ignored.
#[test]
fn a_flag_of_another_mode_is_refused_not_ignored() {
    for (args, needs) in [
        (vec!["backup", "shop", "--timeout", "5m"], "--wait"),
        (
            vec![
                "archive-binlogs",
                "--binlog-index",
                "/nonexistent/i",
                "--once",
                "--mariadb-binlog",
                "/usr/bin/mariadb-binlog",
            ],
            "--from-server",
        ),
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needs), "{args:?}: {}", stderr(&out));
    }
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let index = store.path().join("mysql-bin.index");
    std::fs::write(&index, "").unwrap();
    let out = run(&[
        "archive-binlogs",
        "--store",
        &url,
        "--cluster",
        "c",
        "--binlog-index",
        index.to_str().unwrap(),
        "--once",
        "--spool",
        "/tmp/spool",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--spool /tmp/spool is for --from-server"),
        "{}",
        stderr(&out)
    );
}

/// The krew manifest (issue 46 §4): `scripts/krew-manifest.sh` packs this binary and names
/// the archive's sha256; the archive holds the binary, runnable, and the licence; the same
/// binary packs to the same bytes; a version not in krew's form is refused.
#[test]
fn the_krew_manifest_names_the_archive_it_packs() {
    use sha2::Digest;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tempfile::tempdir().unwrap();
    let pack = |dir: &Path, version: &str| {
        std::process::Command::new(root.join("scripts/krew-manifest.sh"))
            .arg(env!("CARGO_BIN_EXE_tidemark"))
            .args([version, "https://example.invalid/releases/v0.1.0/"])
            .arg(dir)
            .output()
            .unwrap()
    };
    let made = pack(out.path(), "v0.1.0");
    assert!(made.status.success(), "{}", common::stderr(&made));
    let manifest: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(out.path().join("tidemark.yaml")).unwrap())
            .unwrap();
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "tidemark");
    assert_eq!(manifest["spec"]["version"], "v0.1.0");
    let platform = &manifest["spec"]["platforms"][0];
    assert_eq!(platform["selector"]["matchLabels"]["os"], "linux");
    assert_eq!(platform["bin"], "tidemark");
    let archive = out.path().join("tidemark-v0.1.0-linux-amd64.tar.gz");
    assert_eq!(
        platform["uri"],
        "https://example.invalid/releases/v0.1.0/tidemark-v0.1.0-linux-amd64.tar.gz"
    );
    let bytes = std::fs::read(&archive).unwrap();
    assert_eq!(
        platform["sha256"],
        hex::encode(sha2::Sha256::digest(&bytes))
    );
    // What krew unpacks: the binary (mode 755, it runs) and the licence.
    let unpacked = tempfile::tempdir().unwrap();
    let tar = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(unpacked.path())
        .output()
        .unwrap();
    assert!(tar.status.success(), "{}", common::stderr(&tar));
    assert!(unpacked.path().join("LICENSE").is_file());
    let version = std::process::Command::new(unpacked.path().join("tidemark"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("tidemark "));
    // Reproducible.
    let again = tempfile::tempdir().unwrap();
    assert!(pack(again.path(), "v0.1.0").status.success());
    assert_eq!(
        std::fs::read(again.path().join("tidemark-v0.1.0-linux-amd64.tar.gz")).unwrap(),
        bytes
    );
    let refused = pack(again.path(), "0.1");
    assert_eq!(refused.status.code(), Some(2));
    assert!(common::stderr(&refused).contains("VERSION must be vMAJOR.MINOR.PATCH"));
}
