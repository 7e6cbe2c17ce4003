//! The BackupPolicy controller end to end: the real operator (as its ServiceAccount) runs
//! the engine's retention pass against a real S3 server (SeaweedFS) with credentials from
//! a Secret, records the outcome in status and a `BackupRetention` event, honours
//! `tidemark.io/protect` holds, and backs off and recovers when its Secret is missing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPolicy};
use tidemark_operator::testkit::{KubeCluster, Operator, eventually};
use tidemark_store::synth::{self, SynthBackup};
use tidemark_store::testkit::{ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedFs};

async fn status(api: &Api<BackupPolicy>, name: &str) -> serde_json::Value {
    serde_json::to_value(api.get(name).await.unwrap().status).unwrap_or_default()
}

async fn metadata_ids(store: &tidemark_store::ClusterStore) -> Vec<String> {
    synth::metadata_ids(store).await.unwrap()
}

/// Changes `name`'s spec (its retentionInterval, to 59m): the next pass is due at once.
async fn pass_now(policies: &Api<BackupPolicy>, name: &str) {
    policies
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retentionInterval": "59m"}})),
        )
        .await
        .unwrap();
}

/// Waits up to a minute for the store to hold exactly the backups `ids`; fails saying
/// `what`, with the policy's status.
async fn until_ids(
    store: &tidemark_store::ClusterStore,
    ids: &[String],
    policies: &Api<BackupPolicy>,
    what: &str,
) {
    let reached = tokio::time::timeout(Duration::from_secs(60), async {
        while metadata_ids(store).await != ids {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    assert!(reached.is_ok(), "{what}: {}", status(policies, "db").await);
}

fn policy(name: &str, ns: &str, endpoint: &str, secret: &str) -> BackupPolicy {
    serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1",
        "kind": "BackupPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": endpoint, "credentialsSecret": secret},
            "retention": {"keepLast": 1},
            "retentionInterval": "1h",
        },
    }))
    .unwrap()
}

async fn secret(client: &Client, ns: &str, name: &str) {
    secret_with(client, ns, name, SECRET_KEY).await;
}

async fn secret_with(client: &Client, ns: &str, name: &str, secret_key: &str) {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let mut data = BTreeMap::new();
    data.insert(
        "accessKeyId".to_owned(),
        ByteString(ACCESS_KEY.as_bytes().to_vec()),
    );
    data.insert(
        "secretAccessKey".to_owned(),
        ByteString(secret_key.as_bytes().to_vec()),
    );
    api.create(
        &PostParams::default(),
        &Secret {
            metadata: tidemark_operator::testkit::policy_secret_meta(name, ns),
            data: Some(data),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_pass_through_the_operator() {
    // SeaweedFs::start blocks (it runs its own runtime to create the bucket).
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "retention";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;

    // Four fulls of "db", an hour apart.
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let backups: Vec<SynthBackup> = (0..4)
        .map(|i| SynthBackup::full("nightly", now - SignedDuration::from_hours(4 - i), i as u32))
        .collect();
    synth::write_backups(&store, &backups).await.unwrap();
    let ids: Vec<String> = backups.iter().map(|b| b.id.clone()).collect();

    // The second oldest is on hold through a Backup object.
    let backup_api: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let held: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1",
        "kind": "Backup",
        "metadata": {"name": "held", "namespace": ns, "annotations": {"tidemark.io/protect": "true"}},
        "spec": {"policy": {"name": "db"}},
    }))
    .unwrap();
    backup_api
        .create(&PostParams::default(), &held)
        .await
        .unwrap();
    backup_api
        .patch_status(
            "held",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "completed", "backupId": ids[1], "completedAt": "2026-11-20T02:00:00Z"}}),
            ),
        )
        .await
        .unwrap();

    // The newest has an object too, without a hold (one is placed later).
    let newest: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1",
        "kind": "Backup",
        "metadata": {"name": "newest", "namespace": ns},
        "spec": {"policy": {"name": "db"}},
    }))
    .unwrap();
    backup_api
        .create(&PostParams::default(), &newest)
        .await
        .unwrap();
    backup_api
        .patch_status(
            "newest",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "completed", "backupId": ids[3], "completedAt": "2026-11-20T03:00:00Z"}}),
            ),
        )
        .await
        .unwrap();

    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    // Its Secret does not exist yet: the policy waits (Ready=False), retrying with backoff.
    policies
        .create(
            &PostParams::default(),
            &policy("db", ns, &weed.endpoint, "s3-late"),
        )
        .await
        .unwrap();
    let op = Operator::start(&cluster, "operator-retention");
    let st = eventually("Ready=False for the missing Secret", || async {
        let s = status(&policies, "db").await;
        (s["conditions"][0]["status"] == "False").then_some(s)
    })
    .await;
    let message = st["conditions"][0]["message"].as_str().unwrap();
    assert!(message.contains("Secret retention/s3-late"), "{st}");
    assert_eq!(
        metadata_ids(&store).await.len(),
        4,
        "deleted without credentials"
    );
    secret(&admin, ns, "s3-late").await;

    let st = eventually("a successful pass", || async {
        let s = status(&policies, "db").await;
        (s["conditions"][0]["status"] == "True").then_some(s)
    })
    .await;
    // keepLast 1 keeps the newest; the hold keeps ids[1]; the other two go.
    assert_eq!(metadata_ids(&store).await, {
        let mut v = vec![ids[1].clone(), ids[3].clone()];
        v.sort();
        v
    });
    assert_eq!(st["backupsDeleted"], 2, "{st}");
    assert_eq!(st["backupsKept"], 2, "{st}");
    assert!(st["bytesFreed"].as_u64().unwrap() > 0, "{st}");
    assert!(st["lastRetentionRunTime"].is_string(), "{st}");
    assert!(st["nextRetentionRunTime"].is_string(), "{st}");
    assert!(st["recoveryWindow"]["start"].is_string(), "{st}");
    let keys = synth::all_keys(&store).await.unwrap();
    assert!(
        keys.iter().any(|k| k.starts_with("_audit/")),
        "no audit record: {keys:?}"
    );
    // Seed 000: the hold is recorded in the store, and a deleter that has only the store
    // (here the engine's pass as `tidemark gc --store` makes it, given no hold) keeps the
    // held backup too. Mutation tried: the pass not reading the record — ids[1] planned
    // for deletion.
    let recorded = tidemark_store::state::load_holds(&store)
        .await
        .unwrap()
        .expect("_state/holds.json");
    assert_eq!(recorded.protect, vec![ids[1].clone()], "{recorded:?}");
    let request = tidemark_engine::PassRequest {
        policy: tidemark_core::PolicyInput {
            keep_last: Some(1),
            ..Default::default()
        }
        .validate()
        .unwrap(),
        policy_as_given: json!({"keepLast": 1}),
        now: Timestamp::now(),
        started_at: Timestamp::now(),
        protect: Default::default(),
        restores: Vec::new(),
        execute: false,
        ignore_malformed: false,
        hooks: None,
        recorded_hooks: tidemark_engine::RecordedHooks::RunByCaller,
        override_primary_gate: false,
        allow_deletions_before: None,
        compare_with: None,
    };
    let outcome = tidemark_engine::retention_pass(
        &store,
        &request,
        None,
        None,
        &tidemark_store::progress::NoProgress,
    )
    .await
    .unwrap();
    let decision = outcome
        .survey
        .plan
        .backups
        .iter()
        .find(|d| d.backup.id == ids[1])
        .unwrap();
    assert_eq!(decision.action, tidemark_core::Action::Keep, "{decision:?}");
    assert!(
        decision.reasons.contains(&tidemark_core::Reason::Protected),
        "{decision:?}"
    );

    let events: Api<K8sEvent> = Api::namespaced(admin.clone(), ns);
    let ev = eventually("the BackupRetention event", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("BackupRetention"))
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    let note = ev.note.unwrap_or_default();
    assert!(note.contains(&ids[0]) && note.contains(&ids[2]), "{note}");

    // Throttled: within retentionInterval nothing runs again, even with new expired data.
    let last = st["lastRetentionRunTime"].clone();
    let older = SynthBackup::full("nightly", now - SignedDuration::from_hours(10), 9);
    synth::write_backups(&store, std::slice::from_ref(&older))
        .await
        .unwrap();
    // A change that is not the spec (an annotation: no new generation) makes the operator
    // reconcile the policy, and it must still wait for the interval.
    let reconciles = |text: &str| {
        text.lines()
            .find(|l| l.starts_with(r#"tidemark_reconciles_total{controller="BackupPolicy"}"#))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = reconciles(&op.get("/metrics").await.1);
    policies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "yes"}}})),
        )
        .await
        .unwrap();
    eventually("a reconcile after the annotation", || async {
        (reconciles(&op.get("/metrics").await.1) > before).then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(status(&policies, "db").await["lastRetentionRunTime"], last);
    assert!(metadata_ids(&store).await.contains(&older.id));
    // A hold placed between passes is in the store at once (issue 43 §2), not at the
    // next pass: a deleter with only the store keeps it from now. Mutation tried: the
    // Backup controller not recording it — the record still named only ids[1].
    backup_api
        .patch(
            "newest",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"tidemark.io/protect": "true"}}})),
        )
        .await
        .unwrap();
    eventually("the new hold recorded", || async {
        let h = tidemark_store::state::load_holds(&store).await.ok()??;
        h.protect.contains(&ids[3]).then_some(())
    })
    .await;
    assert_eq!(status(&policies, "db").await["lastRetentionRunTime"], last);
    // A spec change runs the pass now.
    policies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retentionInterval": "2h"}})),
        )
        .await
        .unwrap();
    // The pass deletes, then writes its status: both awaited (the status read between the
    // two once showed the pass before, 2 deleted).
    let st = eventually("the pass after the spec change", || async {
        if metadata_ids(&store).await.contains(&older.id) {
            return None;
        }
        let st = status(&policies, "db").await;
        (st["lastRetentionRunTime"] != last).then_some(st)
    })
    .await;
    assert_eq!(st["backupsDeleted"], 1, "{st}");
    assert_eq!(
        policies
            .get("db")
            .await
            .unwrap()
            .status
            .unwrap()
            .observed_generation,
        policies.get("db").await.unwrap().metadata.generation
    );
    let _ = ResourceExt::name_any(&held);

    // A store that cannot be reached: Ready=False (StoreUnavailable), retried with growing
    // pauses; fixed, the next pass succeeds.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let mut unreachable = policy("far", ns, &dead, "s3");
    unreachable.spec.cluster = Some("far".into());
    policies
        .create(&PostParams::default(), &unreachable)
        .await
        .unwrap();
    let st = eventually("Ready=False for the unreachable store", || async {
        let s = status(&policies, "far").await;
        (s["conditions"][0]["reason"] == "StoreUnavailable").then_some(s)
    })
    .await;
    assert_eq!(st["conditions"][0]["status"], "False", "{st}");
    // Retried with growing pauses. Each failure's message names its attempt and the pause
    // before the next (1 s doubling); the time from one attempt's message to the next is
    // at least that pause less its 10 % jitter — a lower bound that a slow machine cannot
    // break (it only lengthens the gaps), while a pause that does not grow (1 s each time)
    // fails it by the fourth attempt (8 s).
    let attempt = |message: &str| -> Option<(u32, u64)> {
        let rest = &message[message.rfind("; attempt ")? + "; attempt ".len()..];
        let (n, rest) = rest.split_once(" failed, next in about ")?;
        Some((n.parse().ok()?, rest.strip_suffix('s')?.parse().ok()?))
    };
    let mut seen: Vec<(u32, u64, std::time::Instant)> = Vec::new();
    let started = std::time::Instant::now();
    while seen.last().is_none_or(|s| s.0 < 5) {
        let message = status(&policies, "far").await["conditions"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if let Some((n, pause)) = attempt(&message)
            && seen.last().is_none_or(|s| n > s.0)
        {
            seen.push((n, pause, std::time::Instant::now()));
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "retries stopped: {seen:?}, last message {message:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("attempts (number, announced pause, seen at): {seen:?}");
    for (n, pause, _) in &seen {
        assert_eq!(
            *pause,
            1 << (n - 1),
            "announced pause of attempt {n}: {seen:?}"
        );
    }
    let checked = seen
        .windows(2)
        .filter(|w| w[1].0 == w[0].0 + 1)
        .map(|w| {
            let gap = w[1].2 - w[0].2;
            assert!(
                gap >= Duration::from_secs(w[0].1).mul_f64(0.9),
                "attempt {} came {gap:?} after attempt {}, whose pause was {} s: {seen:?}",
                w[1].0,
                w[0].0,
                w[0].1
            );
        })
        .count();
    assert!(checked >= 2, "too few consecutive attempts seen: {seen:?}");
    policies
        .patch(
            "far",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"objectStore": {"endpoint": weed.endpoint}}})),
        )
        .await
        .unwrap();
    eventually("the pass once the store is reachable", || async {
        (status(&policies, "far").await["conditions"][0]["status"] == "True").then_some(())
    })
    .await;

    // Credentials the store refuses (403): not an outage, the reason says what to fix;
    // once the Secret is fixed, the next retry succeeds.
    secret_with(&admin, ns, "s3-wrong", "not-the-secret-key").await;
    let mut denied = policy("denied", ns, &weed.endpoint, "s3-wrong");
    denied.spec.cluster = Some("denied".into());
    policies
        .create(&PostParams::default(), &denied)
        .await
        .unwrap();
    let st = eventually("Ready=False for refused credentials", || async {
        let s = status(&policies, "denied").await;
        eprintln!("denied: {s}");
        (s["conditions"][0]["reason"] == "StoreAccessDenied").then_some(s)
    })
    .await;
    assert_eq!(st["conditions"][0]["status"], "False", "{st}");
    assert!(
        !st.to_string().contains("not-the-secret-key"),
        "a secret in the status: {st}"
    );
    Api::<Secret>::namespaced(admin.clone(), ns)
        .patch(
            "s3-wrong",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"secretAccessKey": SECRET_KEY}})),
        )
        .await
        .unwrap();
    eventually("the pass once the Secret is fixed", || async {
        (status(&policies, "denied").await["conditions"][0]["status"] == "True").then_some(())
    })
    .await;

    // A Secret made for another tool (CloudNativePG's key names), not labelled for
    // BackupPolicies: refused, naming the label (issue 42 §5: the right to create a policy
    // is not the right to read any Secret of the namespace). Once labelled: refused,
    // naming the keys looked for; once credentialsKeys names its keys, read from them.
    Api::<Secret>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "s3-other-tool", "namespace": ns},
                "stringData": {"ACCESS_KEY_ID": ACCESS_KEY, "ACCESS_SECRET_KEY": SECRET_KEY},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut renamed = policy("renamed", ns, &weed.endpoint, "s3-other-tool");
    renamed.spec.cluster = Some("renamed".into());
    policies
        .create(&PostParams::default(), &renamed)
        .await
        .unwrap();
    let st = eventually("Ready=False for the Secret not labelled", || async {
        let s = status(&policies, "renamed").await;
        (s["conditions"][0]["status"] == "False").then_some(s)
    })
    .await;
    let message = st["conditions"][0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("s3-other-tool") && message.contains("tidemark.io/policy-secret=true"),
        "{st}"
    );
    assert_eq!(st["conditions"][0]["reason"], "InvalidSpec", "{st}");
    Api::<Secret>::namespaced(admin.clone(), ns)
        .patch(
            "s3-other-tool",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tidemark.io/policy-secret": "true"}}})),
        )
        .await
        .unwrap();
    // (A label is not a spec change: the policy is looked at again when its own spec is.)
    policies
        .patch(
            "renamed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retentionInterval": "59m"}})),
        )
        .await
        .unwrap();
    let st = eventually("Ready=False for the keys not found", || async {
        let s = status(&policies, "renamed").await;
        (s["conditions"][0]["status"] == "False"
            && s["conditions"][0]["message"]
                .as_str()
                .is_some_and(|m| m.contains("lacks")))
        .then_some(s)
    })
    .await;
    let message = st["conditions"][0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("lacks accessKeyId and secretAccessKey"),
        "{st}"
    );
    policies
        .patch(
            "renamed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"objectStore": {"credentialsKeys": {
                "accessKeyId": "ACCESS_KEY_ID", "secretAccessKey": "ACCESS_SECRET_KEY"}}}})),
        )
        .await
        .unwrap();
    eventually("the pass with the keys named", || async {
        (status(&policies, "renamed").await["conditions"][0]["status"] == "True").then_some(())
    })
    .await;

    // The metrics say the same, with bounded labels.
    assert_eq!(op.get("/healthz").await.0, 200);
    assert_eq!(op.get("/readyz").await.0, 200);
    let (code, text) = op.get("/metrics").await;
    assert_eq!(code, 200);
    for line in [
        r#"tidemark_retention_passes_total{namespace="retention",policy="db",result="ok"} 2"#,
        r#"tidemark_reconcile_errors_total{controller="BackupPolicy",class="contention"}"#,
        "tidemark_leader 1",
    ] {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
    let deleted = text
        .lines()
        .find(|l| {
            l.starts_with(r#"tidemark_objects_deleted_total{namespace="retention",policy="db"}"#)
        })
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        deleted.ends_with(" 6"),
        "3 backups of 2 objects each: {deleted}"
    );
    assert!(text.contains("tidemark_recovery_window_seconds{"), "{text}");
    for series in [
        r#"tidemark_recovery_window_start_timestamp_seconds{namespace="retention",policy="db"}"#,
        r#"tidemark_recovery_window_end_timestamp_seconds{namespace="retention",policy="db"}"#,
        r#"tidemark_recovery_window_promised_seconds{namespace="retention",policy="db"} 0"#,
        r#"tidemark_store_bytes{namespace="retention",policy="db"}"#,
        r#"tidemark_backups_kept{namespace="retention",policy="db"}"#,
    ] {
        assert!(text.contains(series), "{series} not in:\n{text}");
    }
    // The gaps are the status's.
    let gaps = status(&policies, "db").await["recoveryWindow"]["gaps"]
        .as_array()
        .map_or(0, Vec::len);
    let series =
        format!(r#"tidemark_recovery_window_gaps{{namespace="retention",policy="db"}} {gaps}"#);
    assert!(text.contains(&series), "{series} not in:\n{text}");
    // Prometheus's own linter on the real output (text format: no Accept header).
    tidemark_operator::testkit::check_metrics(&text);
    op.stop().await;
}

/// The leader dies in the middle of a pass (after its audit record, while it deletes); the
/// other replica takes the lease once it expires and finishes the work: the store ends as
/// the policy says, with nothing half-deleted left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_in_the_middle_of_a_pass() {
    use futures::TryStreamExt;

    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "leader";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let backups: Vec<SynthBackup> = (0..1500)
        .map(|i| {
            SynthBackup::full(
                "nightly",
                now - SignedDuration::from_mins(1500 - i),
                i as u32,
            )
        })
        .collect();
    synth::write_backups(&store, &backups).await.unwrap();
    let newest = backups.last().unwrap().id.clone();

    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    let first = Operator::start(&cluster, "replica-a");
    // All but one of 1,500 go at once: the deletion guard would hold that (its own test).
    let mut p = policy("db", ns, &weed.endpoint, "s3");
    p.spec.retention = Some(
        serde_json::from_value(json!({"keepLast": 1, "deletionGuard": {"threshold": 0}})).unwrap(),
    );
    policies.create(&PostParams::default(), &p).await.unwrap();
    let raw = weed.raw_store();
    let audit_prefix = object_store::path::Path::from("db/_audit");
    eventually(
        "replica-a's audit record (its pass is deleting)",
        || async {
            let found: Vec<_> = raw.list(Some(&audit_prefix)).try_collect().await.unwrap();
            (!found.is_empty()).then_some(())
        },
    )
    .await;
    first.kill();
    let left = metadata_ids(&store).await.len();
    assert!(
        left > 1,
        "the pass finished before the crash ({left} left); make it longer"
    );

    let second = Operator::start(&cluster, "replica-b");
    let st = eventually("replica-b's pass", || async {
        let s = status(&policies, "db").await;
        (s["conditions"][0]["status"] == "True").then_some(s)
    })
    .await;
    assert_eq!(metadata_ids(&store).await, vec![newest.clone()], "{st}");
    // Nothing half-deleted: only the newest backup's directory is left.
    let keys = synth::all_keys(&store).await.unwrap();
    let dirs: std::collections::BTreeSet<&str> = keys
        .iter()
        .filter(|k| k.starts_with("nightly/"))
        .filter_map(|k| k.split('/').nth(1))
        .collect();
    assert_eq!(dirs.into_iter().collect::<Vec<_>>(), vec![newest.as_str()]);
    let lease: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(
        admin.clone(),
        tidemark_operator::testkit::OPERATOR_NAMESPACE,
    );
    let holder = lease
        .get("tidemark-operator")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_eq!(holder.as_deref(), Some("replica-b"));
    second.stop().await;
}

/// A pass that partly failed is not a success (issue 18): a consolidation Job that failed
/// makes the pass `Ready=False` `PassPartlyFailed` with the count in `status.failures`, a
/// `RetentionPartlyFailed` event and `result="partial"` in the metric — and it is retried
/// with backoff, not after a full `retentionInterval` (1h here): a new Job runs within
/// seconds. (Before, it read `Ready=True PassSucceeded` and waited the hour.) A Job that
/// is still running is not a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_that_partly_failed_is_not_a_success() {
    use k8s_openapi::api::batch::v1::Job;
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "partial";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let mut full = SynthBackup::full("nightly", now - SignedDuration::from_hours(3), 1);
    full.method = "mariabackup".into();
    let mut inc =
        SynthBackup::incremental("nightly", &full.id, now - SignedDuration::from_hours(1), 2);
    inc.method = "mariabackup".into();
    synth::write_backups(&store, &[full.clone(), inc.clone()])
        .await
        .unwrap();
    // The established primary retention needs (the only pod, Ready for an hour).
    tidemark_operator::testkit::running_pod(
        &admin,
        ns,
        json!({
            "metadata": {"name": "db-0", "namespace": ns, "labels": {"app": "db"}},
            "spec": {"containers": [{"name": "mariadb", "image": "mariadb:11.4"}]},
        }),
    )
    .await;
    let mut p = policy("db", ns, &weed.endpoint, "s3");
    p.spec.retention.as_mut().unwrap().consolidate = Some(true);
    p.spec.source =
        Some(serde_json::from_value(json!({"selector": {"matchLabels": {"app": "db"}}})).unwrap());
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    policies.create(&PostParams::default(), &p).await.unwrap();
    let op = Operator::start(&cluster, "operator-partial");
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let name = tidemark_operator::consolidation::job_name("db", &inc.id);
    let first = eventually("the consolidation Job", || async {
        jobs.get_opt(&name).await.unwrap()
    })
    .await;
    // Running is not failing: the pass succeeded, the chain is kept.
    let st = eventually("the first pass", || async {
        let s = status(&policies, "db").await;
        (s["conditions"][0]["reason"] == "PassSucceeded").then_some(s)
    })
    .await;
    assert_eq!(st["failures"], 0, "{st}");
    // The Job fails; a spec change makes the next pass due at once.
    jobs.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"failed": 1}})),
    )
    .await
    .unwrap();
    pass_now(&policies, "db").await;
    let st = eventually("the partial failure", || async {
        let s = status(&policies, "db").await;
        (s["conditions"][0]["reason"] == "PassPartlyFailed").then_some(s)
    })
    .await;
    assert_eq!(st["conditions"][0]["status"], "False", "{st}");
    assert_eq!(st["failures"], 1, "{st}");
    let message = st["conditions"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("consolidation Job") && message.contains("failed"),
        "{message}"
    );
    // The event is posted after the status is written (events are folded and sent on
    // their own): wait for it rather than read once.
    eventually("the RetentionPartlyFailed event", || async {
        Api::<K8sEvent>::namespaced(admin.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("RetentionPartlyFailed"))
    })
    .await;
    let (_, metrics) = op.get("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tidemark_retention_passes_total")
                && l.contains("result=\"partial\"")),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tidemark_retention_failures_total") && l.ends_with(" 1")),
        "{metrics}"
    );
    // Retried with backoff: a new Job within seconds, not after the hour.
    eventually("a new consolidation Job", || async {
        let j = jobs.get_opt(&name).await.unwrap()?;
        (j.metadata.uid != first.metadata.uid).then_some(())
    })
    .await;
    eventually("the pass succeeds again", || async {
        let s = status(&policies, "db").await;
        (s["conditions"][0]["reason"] == "PassSucceeded" && s["observedGeneration"] == 2)
            .then_some(())
    })
    .await;
    // Nothing of the chain went meanwhile.
    let mut ids = metadata_ids(&store).await;
    ids.sort();
    assert_eq!(ids, [full.id.clone(), inc.id.clone()]);
    op.stop().await;
}

/// Encrypted chains (issue 19 §2): consolidating reads a chain, so without
/// `objectStore.encryption.identitySecret` no Job is started — the pass reports why,
/// naming the setting, and the chain is kept whole; with it, the Job gets the identities by
/// Secret reference (`TIDEMARK_IDENTITY`, never a value) and the recipients it encrypts
/// the synthetic full to (`TIDEMARK_RECIPIENTS`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_chains_consolidate_only_with_their_identity() {
    use k8s_openapi::api::batch::v1::Job;
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "sealed";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let mut full = SynthBackup::full("nightly", now - SignedDuration::from_hours(3), 1);
    full.method = "mariabackup".into();
    let mut inc =
        SynthBackup::incremental("nightly", &full.id, now - SignedDuration::from_hours(1), 2);
    inc.method = "mariabackup".into();
    synth::write_backups(&store, &[full.clone(), inc.clone()])
        .await
        .unwrap();
    let (_, public) = tidemark_store::crypt::generate();
    let recipients = tidemark_store::crypt::Recipients::parse(&[&public])
        .unwrap()
        .unwrap();
    // The full's payload as an encrypted backup records it.
    let mut m = serde_json::to_value(full.metadata("db")).unwrap();
    m["formatVersion"] = 2.into();
    m["payload"][0]["encryption"] = serde_json::to_value(recipients.record()).unwrap();
    synth::write_raw(
        &store,
        &format!("nightly/{}/metadata.json", full.id),
        &serde_json::to_vec(&m).unwrap(),
    )
    .await
    .unwrap();
    tidemark_operator::testkit::running_pod(
        &admin,
        ns,
        json!({
            "metadata": {"name": "db-0", "namespace": ns, "labels": {"app": "db"}},
            "spec": {"containers": [{"name": "mariadb", "image": "mariadb:11.4"}]},
        }),
    )
    .await;
    let mut p = policy("db", ns, &weed.endpoint, "s3");
    p.spec.retention.as_mut().unwrap().consolidate = Some(true);
    p.spec.source =
        Some(serde_json::from_value(json!({"selector": {"matchLabels": {"app": "db"}}})).unwrap());
    p.spec.object_store.as_mut().unwrap().encryption =
        Some(serde_json::from_value(json!({"recipients": [public]})).unwrap());
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    policies.create(&PostParams::default(), &p).await.unwrap();
    let op = Operator::start(&cluster, "operator-sealed");
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let name = tidemark_operator::consolidation::job_name("db", &inc.id);
    let st = eventually("the pass refusing to consolidate", || async {
        let s = status(&policies, "db").await;
        (s["conditions"][0]["reason"] == "PassPartlyFailed").then_some(s)
    })
    .await;
    let message = st["conditions"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("encrypted") && message.contains("identitySecret"),
        "{message}"
    );
    assert!(
        jobs.get_opt(&name).await.unwrap().is_none(),
        "a Job started"
    );
    let mut ids = metadata_ids(&store).await;
    ids.sort();
    assert_eq!(ids, [full.id.clone(), inc.id.clone()]);

    // With the Secret named: the Job, with the identities by reference.
    policies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"objectStore": {"encryption": {
                "recipients": [public], "identitySecret": "backup-key"}}}})),
        )
        .await
        .unwrap();
    let job = eventually("the consolidation Job", || async {
        jobs.get_opt(&name).await.unwrap()
    })
    .await;
    let env = job.spec.unwrap().template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    let var = |n: &str| env.iter().find(|e| e.name == n).cloned();
    let identity = var("TIDEMARK_IDENTITY").expect("TIDEMARK_IDENTITY");
    assert!(identity.value.is_none());
    let key = identity.value_from.unwrap().secret_key_ref.unwrap();
    assert_eq!(
        (key.name.as_str(), key.key.as_str()),
        ("backup-key", "identity")
    );
    assert_eq!(
        var("TIDEMARK_RECIPIENTS").and_then(|e| e.value),
        Some(public.clone())
    );
    op.stop().await;
}

/// `requireVerified` in the operator (issue 19 §4): while the newest backup does not read
/// back whole, the pass deletes nothing and says so (`Ready=False`,
/// `NewestBackupUnverified`, naming it); repaired, the pass deletes as planned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_waits_for_the_newest_backup_to_read_back() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "verified";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let old = SynthBackup::full("nightly", now - SignedDuration::from_hours(2), 1);
    let newest = SynthBackup::full("nightly", now - SignedDuration::from_hours(1), 2);
    synth::write_backups(&store, &[old.clone(), newest.clone()])
        .await
        .unwrap();
    let payload_key = format!("nightly/{}/backup.tar", newest.id);
    let mut damaged = newest.payload.clone();
    damaged[0] ^= 1;
    synth::write_raw(&store, &payload_key, &damaged)
        .await
        .unwrap();
    let mut p = policy("db", ns, &weed.endpoint, "s3");
    p.spec.retention =
        Some(serde_json::from_value(json!({"keepLast": 1, "requireVerified": true})).unwrap());
    // Verification on demand: the annotation's value is a request.
    p.metadata.annotations = Some([("tidemark.io/verify".to_owned(), "1".to_owned())].into());
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    policies.create(&PostParams::default(), &p).await.unwrap();
    let op = Operator::start(&cluster, "operator-verified");
    let st = eventually("the pass refusing", || async {
        let s = status(&policies, "db").await;
        (s["conditions"][0]["reason"] == "NewestBackupUnverified").then_some(s)
    })
    .await;
    let message = st["conditions"][0]["message"].as_str().unwrap();
    assert!(
        message.contains(&newest.id) && message.contains("sha256"),
        "{message}"
    );
    let mut ids = metadata_ids(&store).await;
    ids.sort();
    let mut both = vec![old.id.clone(), newest.id.clone()];
    both.sort();
    assert_eq!(ids, both, "nothing may go while the newest is damaged");

    // The operator's verification (`tidemark verify`'s use case) finds the same damage,
    // naming the object, in status, an event and a metric.
    let v = eventually("the verification asked for", || async {
        let s = status(&policies, "db").await;
        (s["verification"]["request"] == "1").then_some(s)
    })
    .await;
    let last = &v["verification"]["last"];
    assert_eq!(last["passed"], false, "{v}");
    assert_eq!(last["backupId"], newest.id.as_str(), "{v}");
    let first = last["problems"][0].as_str().unwrap();
    assert!(
        first.contains(&payload_key) && first.contains("damaged"),
        "{first}"
    );
    let failed = tidemark_operator::testkit::events(&admin, ns, "VerificationFailed").await;
    assert!(
        failed
            .iter()
            .any(|e| e.note.as_deref().unwrap_or("").contains(&payload_key)),
        "{failed:?}"
    );
    let (_, metrics) = op.get("/metrics").await;
    assert!(
        metrics.contains(r#"tidemark_verification_passed{namespace="verified",policy="db"} 0"#),
        "{metrics}"
    );

    // Repaired; a spec change makes the next pass due at once, and puts verification on a
    // schedule, which now finds the chain whole.
    synth::write_raw(&store, &payload_key, &newest.payload)
        .await
        .unwrap();
    policies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retentionInterval": "59m",
                "verify": {"schedule": "*/2 * * * * *"}}})),
        )
        .await
        .unwrap();
    let v = eventually("a scheduled verification that passes", || async {
        let s = status(&policies, "db").await;
        (s["verification"]["last"]["passed"] == true).then_some(s)
    })
    .await;
    assert!(v["verification"]["lastScheduleTime"].is_string(), "{v}");
    assert_eq!(v["verification"]["request"], "1", "{v}");
    until_ids(
        &store,
        std::slice::from_ref(&newest.id),
        &policies,
        "the old backup was not deleted",
    )
    .await;
    op.stop().await;
}

/// Every deleting pass has an event of its own (issue 18): two passes a few seconds apart
/// that each delete a backup leave two `BackupRetention` events, each naming its backup
/// and audit record — not one event that still names the first pass's after the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_deleting_pass_has_its_own_event() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "passes";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let first = SynthBackup::full("nightly", now - SignedDuration::from_hours(3), 1);
    let second = SynthBackup::full("nightly", now - SignedDuration::from_hours(2), 2);
    synth::write_backups(&store, &[first.clone(), second.clone()])
        .await
        .unwrap();
    let mut p = policy("db", ns, &weed.endpoint, "s3");
    p.spec.retention_interval = Some("1s".into());
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    let op = Operator::start(&cluster, "operator-passes");
    eventually("the first deleting pass", || async {
        (metadata_ids(&store).await == [second.id.clone()]).then_some(())
    })
    .await;
    let third = SynthBackup::full("nightly", now - SignedDuration::from_hours(1), 3);
    synth::write_backups(&store, std::slice::from_ref(&third))
        .await
        .unwrap();
    eventually("the second deleting pass", || async {
        (metadata_ids(&store).await == [third.id.clone()]).then_some(())
    })
    .await;
    let notes = eventually("two BackupRetention events", || async {
        let notes: Vec<String> = Api::<K8sEvent>::namespaced(admin.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("BackupRetention"))
            .filter_map(|e| e.note)
            .collect();
        (notes.len() >= 2).then_some(notes)
    })
    .await;
    assert_eq!(notes.len(), 2, "{notes:?}");
    for id in [&first.id, &second.id] {
        assert_eq!(
            notes.iter().filter(|n| n.contains(id.as_str())).count(),
            1,
            "{id}: {notes:?}"
        );
    }
    assert_ne!(notes[0], notes[1]);
    op.stop().await;
}

/// A Backup whose data retention removed says so (issue 18, seed 000): the object stays
/// (retention never deletes Backup objects), `completed`, with `status.dataRemoved` —
/// when, the plan's reasons and the audit record — shown by `kubectl get` in the column
/// "Data removed". The Backup whose data stays has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_whose_data_retention_removed_says_so() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "removed";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let (old, new) = synth::older_and_newer(&store, "old", "new", now)
        .await
        .unwrap();
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    for b in [&old, &new] {
        tidemark_operator::testkit::completed_backup(&backups, b, json!({})).await;
    }
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &policy("db", ns, &weed.endpoint, "s3"),
        )
        .await
        .unwrap();
    let op = Operator::start(&cluster, "operator-removed");
    let removed = eventually("old's data removed, recorded", || async {
        backups.get("old").await.ok()?.status?.data_removed
    })
    .await;
    assert_eq!(metadata_ids(&store).await, std::slice::from_ref(&new.id));
    assert!(!removed.reasons.is_empty(), "{removed:?}");
    let audit = removed.audit_record.clone().unwrap_or_default();
    assert!(audit.contains("_audit/"), "{removed:?}");
    // (`Time` is written to the second.)
    assert!(
        removed.at.0 >= now - SignedDuration::from_secs(1),
        "{removed:?}"
    );
    // The object stays, completed; the record is not erased by later status writes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = backups.get("old").await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_none());
    let status = kept.status.unwrap();
    assert_eq!(
        status.phase,
        Some(tidemark_api::crd::BackupPhase::Completed)
    );
    assert_eq!(status.data_removed, Some(removed));
    assert!(
        backups
            .get("new")
            .await
            .unwrap()
            .status
            .unwrap()
            .data_removed
            .is_none()
    );
    let crd = Api::<CustomResourceDefinition>::all(admin.clone())
        .get("backups.tidemark.io")
        .await
        .unwrap();
    let columns = &crd.spec.versions[0].additional_printer_columns;
    assert!(
        columns
            .iter()
            .flatten()
            .any(|c| c.name == "Data removed" && c.json_path == ".status.dataRemoved.at"),
        "{columns:?}"
    );
    op.stop().await;
}

/// Backup objects do not grow without bound, and only their scheduler prunes them (seed
/// 000: "It does not delete Backup Kubernetes objects, only object-store artifacts.
/// Pruning expired Backup CRs stays the scheduler/owner-ref's job"). The retention pass
/// removes the data of every backup but the newest and records it (`dataRemoved`); then
/// the ScheduledBackup "nightly" (`backupHistory: {limit: 1, failedLimit: 0}`) deletes the
/// Backups it generated beyond its history — successful and failed apart: of its two whose
/// data is gone the most recent stays, and its failed one that stored nothing goes. Backups
/// made by hand (even under a policy `backupHistory.limit: 0`, even labelled as the
/// schedule's without one of its names) are never deleted. The pruned one has
/// `deletionPolicy: Delete`: it goes without a second deletion (nor its hooks), its
/// finalizer seeing the data was removed by retention. Mutation tried: the pass pruning
/// as before (per policy) — the hand-made "a" and "b" go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_scheduler_prunes_the_backups_it_generated() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "history";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let hours = |h: i64| now - SignedDuration::from_hours(h);
    let (n1, n2, failed) = (
        "nightly-20261101020000",
        "nightly-20261102020000",
        "nightly-20261103020000",
    );
    let synthetic = [
        SynthBackup::full("a", hours(5), 1),
        SynthBackup::full("b", hours(5), 2),
        SynthBackup::full("labelled", hours(5), 3),
        SynthBackup::full(n1, hours(4), 4),
        SynthBackup::full(n2, hours(3), 5),
        SynthBackup::full("new", hours(1), 6),
    ];
    synth::write_backups(&store, &synthetic).await.unwrap();
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let nightly = json!({"metadata": {"labels": {"tidemark.io/scheduled-backup": "nightly"}}});
    for b in &synthetic {
        let extra = match b.name.as_str() {
            "b" => json!({"spec": {"deletionPolicy": "Delete"}}),
            "labelled" | "nightly-20261101020000" => nightly.clone(),
            "nightly-20261102020000" => json!({
                "metadata": {"labels": {"tidemark.io/scheduled-backup": "nightly"}},
                "spec": {"deletionPolicy": "Delete"},
            }),
            _ => json!({}),
        };
        tidemark_operator::testkit::completed_backup(&backups, b, extra).await;
    }
    // A failed attempt of the schedule that never stored anything.
    let attempt: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": failed, "labels": {"tidemark.io/scheduled-backup": "nightly"}},
        "spec": {"policy": {"name": "db"}},
    }))
    .unwrap();
    backups
        .create(&PostParams::default(), &attempt)
        .await
        .unwrap();
    backups
        .patch_status(
            failed,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "failed", "error": "the pod was evicted",
                "completedAt": hours(2).to_string()}}),
            ),
        )
        .await
        .unwrap();
    let schedule: tidemark_api::crd::ScheduledBackup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "ScheduledBackup",
        "metadata": {"name": "nightly", "namespace": ns},
        "spec": {"schedule": "0 0 2 1 1 *", "policy": {"name": "db"},
            "backupHistory": {"limit": 1, "failedLimit": 0}},
    }))
    .unwrap();
    Api::<tidemark_api::crd::ScheduledBackup>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &schedule)
        .await
        .unwrap();
    let op = Operator::start(&cluster, "operator-history");
    tidemark_operator::testkit::cleanup_finalizer(&backups, n2).await;
    let mut p = policy("db", ns, &weed.endpoint, "s3");
    p.spec.backup_history = Some(tidemark_api::policy::BackupHistory {
        limit: Some(0),
        failed_limit: Some(0),
        max_age: None,
    });
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    // Of the schedule's two removed in one pass (same time; by name): n1 stays, n2 goes.
    eventually("the schedule's history pruned", || async {
        let n2_gone = backups.get_opt(n2).await.ok()?.is_none();
        let failed_gone = backups.get_opt(failed).await.ok()?.is_none();
        (n2_gone && failed_gone).then_some(())
    })
    .await;
    assert_eq!(metadata_ids(&store).await, vec![synthetic[5].id.clone()]);
    let names = |list: Vec<Backup>| list.iter().map(ResourceExt::name_any).collect::<Vec<_>>();
    // Settled: nothing else goes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let left = names(backups.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(left, vec!["a", "b", "labelled", "new", n1]);
    for name in ["a", "b", "labelled", n1] {
        let st = backups.get(name).await.unwrap().status.unwrap();
        assert!(st.data_removed.is_some(), "{name}: {st:?}");
    }
    let pruned = tidemark_operator::testkit::events(&admin, ns, "BackupHistoryPruned").await;
    assert!(!pruned.is_empty());
    for event in &pruned {
        assert_eq!(
            event.regarding.as_ref().and_then(|r| r.kind.as_deref()),
            Some("ScheduledBackup"),
            "{event:?}"
        );
    }
    let notes: String = pruned.iter().filter_map(|e| e.note.clone()).collect();
    assert!(notes.contains(n2) && notes.contains(failed), "{notes}");
    let finalized = tidemark_operator::testkit::events(&admin, ns, "RemoteDataDeleted").await;
    let note = finalized[0].note.clone().unwrap_or_default();
    assert!(note.contains("removed by retention"), "{note}");
    // Suspended, the schedule deletes nothing (seed 001): limit 0 now, n1 stays.
    Api::<tidemark_api::crd::ScheduledBackup>::namespaced(admin.clone(), ns)
        .patch(
            "nightly",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true, "backupHistory": {"limit": 0}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(backups.get_opt(n1).await.unwrap().is_some());
    // Resumed, it does.
    Api::<tidemark_api::crd::ScheduledBackup>::namespaced(admin.clone(), ns)
        .patch(
            "nightly",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": false}})),
        )
        .await
        .unwrap();
    eventually("n1 pruned once resumed", || async {
        backups.get_opt(n1).await.ok()?.is_none().then_some(())
    })
    .await;
    op.stop().await;
}

/// Seed 002's immutable chains: "The retention job will not remove backups from the target
/// storage …; it will only delete the backup CR … once the expiration date is reached.
/// Deletion of the actual backups … will be managed by the retention period set on the S3
/// bucket". On a lock-enabled bucket, a chain whose lock has ended and that no rule keeps
/// is recorded as expired (`_state/expired/…`) — its objects stay for the bucket's rule —
/// and its Backup object is deleted; the bucket has no lifecycle rule, which a
/// `BucketLifecycle` Warning says. Mutation tried: the executor deleting as before
/// (`afterExpiry: delete` by default) — the metadata is gone and no record is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_locked_chain_is_left_to_the_bucket() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "expiry";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.locked_bucket("immutable", "db").await;
    let now = Timestamp::now();
    let hours = |h: i64| now - SignedDuration::from_hours(h);
    let mut old = SynthBackup::full("old", hours(30), 1);
    old.immutable_until = Some(hours(1));
    let mut new = SynthBackup::full("new", hours(2), 2);
    new.immutable_until = Some(now + SignedDuration::from_hours(24));
    synth::write_backups(&store, &[old.clone(), new.clone()])
        .await
        .unwrap();
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    for b in [&old, &new] {
        tidemark_operator::testkit::completed_backup(&backups, b, json!({})).await;
    }
    let op = Operator::start(&cluster, "operator-expiry");
    let p: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1",
        "kind": "BackupPolicy",
        "metadata": {"name": "db", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": "immutable", "endpoint": weed.endpoint, "credentialsSecret": "s3",
                "objectLock": {"mode": "governance", "period": "1d"}},
            "retention": {"keepLast": 1},
            "retentionInterval": "1h",
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    eventually("the expired chain's Backup deleted", || async {
        backups.get_opt("old").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(backups.get_opt("new").await.unwrap().is_some());
    // Its objects stay for the bucket; the record says it expired.
    let keys = synth::all_keys(&store).await.unwrap();
    let record = format!("_state/expired/old/{}.json", old.id);
    assert!(keys.contains(&record), "{keys:?}");
    assert!(
        keys.contains(&format!("old/{}/metadata.json", old.id)),
        "{keys:?}"
    );
    let lifecycle = eventually("the BucketLifecycle warning", || async {
        let e = tidemark_operator::testkit::events(&admin, ns, "BucketLifecycle").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    let note = lifecycle[0].note.clone().unwrap_or_default();
    assert!(note.contains("no enabled lifecycle rule"), "{note}");
    op.stop().await;
}

/// Retention only with an established primary (issue 18, seed 000): a policy that selects
/// database pods deletes nothing while no selected pod is the primary, nor until the
/// primary has been Running and Ready for `primaryReadyFor` — `Ready=False`
/// `NoEstablishedPrimary` with an event — and runs as soon as it has. A store-only policy
/// (no `source`) has no pods to wait for and runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_waits_for_an_established_primary() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "primary";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let now = Timestamp::now();
    let mut stores = Vec::new();
    for dir in ["db", "files"] {
        let store = weed.cluster_store(dir);
        let (old, new) = synth::older_and_newer(&store, "nightly", "nightly", now)
            .await
            .unwrap();
        stores.push((store, old, new));
    }
    let mut gated = policy("db", ns, &weed.endpoint, "s3");
    gated.spec.source = Some(
        serde_json::from_value(
            json!({"selector": {"matchLabels": {"app": "db"}}, "primaryReadyFor": "8s"}),
        )
        .unwrap(),
    );
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    policies
        .create(&PostParams::default(), &gated)
        .await
        .unwrap();
    policies
        .create(
            &PostParams::default(),
            &policy("files", ns, &weed.endpoint, "s3"),
        )
        .await
        .unwrap();
    let op = Operator::start(&cluster, "operator-primary");
    // The store-only policy runs at once.
    let (files, _, files_new) = &stores[1];
    eventually("the store-only pass", || async {
        (metadata_ids(files).await == std::slice::from_ref(&files_new.id)).then_some(())
    })
    .await;
    // No pod: no pass.
    let reason = |s: serde_json::Value| {
        (
            s["conditions"][0]["reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            s["conditions"][0]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    let (_, message) = eventually("no primary", || async {
        let r = reason(status(&policies, "db").await);
        (r.0 == "NoEstablishedPrimary").then_some(r)
    })
    .await;
    assert!(message.contains("no pod matches"), "{message}");
    let (db, old, new) = &stores[0];
    assert_eq!(metadata_ids(db).await.len(), 2, "deleted without a primary");
    // Recorded in the store for every deleter with only the store (seed 000; a
    // `tidemark gc` then refuses, tested in cli/cli.rs); the store-only policy of another
    // store records no gate.
    let gate = tidemark_store::state::load_holds(db)
        .await
        .unwrap()
        .and_then(|h| h.no_primary)
        .expect("the gate in _state/holds.json");
    assert!(gate.message.contains("no pod matches"), "{gate:?}");
    assert!(
        tidemark_store::state::load_holds(files)
            .await
            .unwrap()
            .and_then(|h| h.no_primary)
            .is_none()
    );
    // A primary that has just become Ready: still no pass, until it has been for 8s.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), ns);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "db-0", "labels": {"app": "db", "tidemark.io/role": "primary"}},
            "spec": {"containers": [{"name": "mariadb", "image": "mariadb:11.4"}]},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let ready_at = Timestamp::now();
    pods.patch_status(
        "db-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ready_at.to_string()}]}})),
    )
    .await
    .unwrap();
    let (_, message) = eventually("a primary not yet established", || async {
        let r = reason(status(&policies, "db").await);
        (r.0 == "NoEstablishedPrimary" && r.1.contains("db-0 has been Ready since")).then_some(r)
    })
    .await;
    assert!(message.contains("primaryReadyFor"), "{message}");
    if Timestamp::now() < ready_at + SignedDuration::from_secs(7) {
        assert_eq!(metadata_ids(db).await.len(), 2, "deleted too early");
    }
    eventually("the pass once the primary is established", || async {
        (metadata_ids(db).await == std::slice::from_ref(&new.id)).then_some(())
    })
    .await;
    // (The condition's time is written to the second: at most 1 s before `ready_at`.)
    assert!(
        Timestamp::now() >= ready_at + SignedDuration::from_secs(7),
        "deleted before the primary had been Ready for 8s"
    );
    assert!(!metadata_ids(db).await.contains(&old.id));
    // The pass recorded the gate open.
    assert!(
        tidemark_store::state::load_holds(db)
            .await
            .unwrap()
            .and_then(|h| h.no_primary)
            .is_none(),
        "the gate still recorded closed after the pass"
    );
    let events: Vec<K8sEvent> = Api::<K8sEvent>::namespaced(admin.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("NoEstablishedPrimary")),
        "{events:?}"
    );
    op.stop().await;
}

/// A synthetic full that stood in for a merged chain's last backup, deleted later by
/// retention, belongs to that backup's object (`dataRemoved.replacedBy`): the object's
/// DeleteHooks, which ran when its own data was merged (`status.hooks`), do not run again
/// — before, the full matched no object and the labels it copied from the chain's last
/// backup selected the same hooks a second time. The object's record then says the
/// replacement is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synthetic_full_that_stood_in_runs_no_hook_twice() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let hook_server = tidemark_operator::testkit::Webhook::start().await;
    let ns = "stood-in";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let hours = |h: i64| now - SignedDuration::from_hours(h);
    let (full_id, incr_id) = (synth::backup_id(hours(5), 1), synth::backup_id(hours(4), 2));
    let mut synthetic = SynthBackup::full("nightly", hours(3), 3);
    synthetic.method = "mariabackup".into();
    synthetic.consolidated_from = vec![full_id.clone(), incr_id.clone()];
    // As consolidation does: the chain's last backup's labels.
    synthetic.labels = vec![
        ("tidemark.io/backup".into(), "incr-obj".into()),
        ("team".into(), "pay".into()),
    ];
    let newest = SynthBackup::full("nightly", hours(1), 4);
    synth::write_backups(&store, &[synthetic.clone(), newest.clone()])
        .await
        .unwrap();
    let stored = |id: &str| json!({"backupName": "nightly", "backupId": id});
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let object: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "incr-obj", "labels": {"team": "pay", "tidemark.io/scheduled-backup": "nightly"}},
        "spec": {"policy": {"name": "db"}},
    }))
    .unwrap();
    backups
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    backups
        .patch_status(
            "incr-obj",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "completed", "backupId": incr_id,
                "hooks": [{"name": "notify", "outcome": "succeeded", "finishedAt": hours(2).to_string()}],
                "dataRemoved": {"at": hours(2).to_string(), "reasons": ["consolidated"],
                    "auditRecord": "_audit/earlier.json",
                    "mergedInto": stored(&synthetic.id), "replacedBy": stored(&synthetic.id)},
            }})),
        )
        .await
        .unwrap();
    let hook: tidemark_api::crd::DeleteHook = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "DeleteHook",
        "metadata": {"name": "notify", "namespace": ns},
        "spec": {"selector": {"matchLabels": {"team": "pay"}}, "timeout": "10s",
                 "webhook": {"url": format!("{}/ok", hook_server.url), "caBundle": hook_server.ca_bundle}},
    }))
    .unwrap();
    Api::<tidemark_api::crd::DeleteHook>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &hook)
        .await
        .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &policy("db", ns, &weed.endpoint, "s3"),
        )
        .await
        .unwrap();
    let op = Operator::start(&cluster, "operator-stood-in");
    // keepLast 1: the synthetic full goes.
    let removed = eventually(
        "the synthetic full deleted, the object's record updated",
        || async {
            let r = backups.get("incr-obj").await.ok()?.status?.data_removed?;
            (r.replaced_by.is_none() && metadata_ids(&store).await == [newest.id.clone()])
                .then_some(r)
        },
    )
    .await;
    assert_eq!(
        removed.merged_into.as_ref().map(|m| m.backup_id.as_str()),
        Some(synthetic.id.as_str()),
        "{removed:?}"
    );
    assert_ne!(
        removed.audit_record.as_deref(),
        Some("_audit/earlier.json"),
        "this pass's audit record: {removed:?}"
    );
    assert!(
        !removed.reasons.is_empty() && !removed.reasons.contains(&"consolidated".to_owned()),
        "this deletion's reasons: {removed:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = hook_server.calls.lock().unwrap().clone();
    assert!(calls.is_empty(), "the hook ran again: {calls:?}");
    op.stop().await;
}

/// Restore tests in the operator (issue 19 §4): at each slot of `spec.restoreTest` the
/// operator starts a Job running `tidemark restore-test` in the database image; when it
/// ends it reads the outcome the Job recorded in the store and reports it — the policy's
/// `status.restoreTest`, the restored Backup's `status.restoreTest`, an event and the
/// `tidemark_restore_test_passed` metric. The node is played here: the test writes the
/// record a Job would (failed, then passed) and sets the Job's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_tests_run_as_jobs_and_report_their_outcome() {
    use k8s_openapi::api::batch::v1::Job;
    use tidemark_mariadb::check::{CheckOutcome, RestoreTestRecord};
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "restoretest";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let full = SynthBackup::full(
        "nightly",
        Timestamp::now() - SignedDuration::from_hours(1),
        1,
    );
    synth::write_backups(&store, std::slice::from_ref(&full))
        .await
        .unwrap();
    tidemark_operator::testkit::running_pod(
        &admin,
        ns,
        json!({
            "metadata": {"name": "db-0", "namespace": ns, "labels": {"app": "db"}},
            "spec": {"containers": [{"name": "mariadb", "image": "mariadb:11.4"}]},
        }),
    )
    .await;
    // The Backup object of the backup the tests restore (completed: nothing to take).
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let b: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "nightly-1", "namespace": ns},
        "spec": {"policy": {"name": "db"}},
    }))
    .unwrap();
    backups.create(&PostParams::default(), &b).await.unwrap();
    backups
        .patch_status(
            "nightly-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "completed", "backupId": full.id}})),
        )
        .await
        .unwrap();
    let mut p = policy("db", ns, &weed.endpoint, "s3");
    p.spec.source =
        Some(serde_json::from_value(json!({"selector": {"matchLabels": {"app": "db"}}})).unwrap());
    p.spec.restore_test = Some(
        serde_json::from_value(json!({
            "schedule": "*/2 * * * * *",
            "query": "SELECT COUNT(*) FROM shop.orders",
            "expect": "8",
        }))
        .unwrap(),
    );
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    policies.create(&PostParams::default(), &p).await.unwrap();
    let op = Operator::start(&cluster, "operator-restoretest");
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);

    // Plays one test: waits for its Job, records the outcome a Job would, ends the Job.
    let play = |passed: bool, after: Option<String>| {
        let (jobs, policies, store, full) =
            (jobs.clone(), policies.clone(), store.clone(), full.clone());
        async move {
            let job = eventually("a restore test Job", || async {
                let st = status(&policies, "db").await;
                let name = st["restoreTest"]["job"].as_str()?.to_owned();
                if Some(&name) == after.as_ref() {
                    return None;
                }
                jobs.get_opt(&name).await.unwrap()
            })
            .await;
            let c = &job
                .spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0];
            assert_eq!(c.image.as_deref(), Some("mariadb:11.4"));
            let args = c.args.clone().unwrap().join(" ");
            assert!(args.contains("tidemark restore-test --store"), "{args}");
            assert!(
                args.contains("--query=SELECT COUNT(*) FROM shop.orders --expect=8"),
                "{args}"
            );
            let record = RestoreTestRecord {
                format_version: 1,
                tested_at: Timestamp::now(),
                target: full.started_at + SignedDuration::from_secs(60),
                backup_name: full.name.clone(),
                backup_id: full.id.clone(),
                chain: vec![full.id.clone()],
                segments_replayed: 0,
                bytes_downloaded: 1,
                seconds: 1,
                outcome: CheckOutcome {
                    passed,
                    tables_checked: 31,
                    problems: if passed {
                        Vec::new()
                    } else {
                        vec![r#"the query returned "7", expected "8""#.to_owned()]
                    },
                    query: Some("SELECT COUNT(*) FROM shop.orders".into()),
                    query_result: Some(if passed { "8" } else { "7" }.into()),
                    oracle_chunks: None,
                },
                by: "tidemark restore-test".into(),
                run_id: Some(job.name_any()),
            };
            tidemark_store::transfer::record_restore_test(
                &store,
                &full.name,
                &full.id,
                &serde_json::to_value(&record).unwrap(),
            )
            .await
            .unwrap();
            let ended = if passed {
                json!({"succeeded": 1})
            } else {
                json!({"failed": 1})
            };
            jobs.patch_status(
                &job.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": ended})),
            )
            .await
            .unwrap();
            job.name_any()
        }
    };
    let first = play(false, None).await;
    let st = eventually("the failed test reported", || async {
        let s = status(&policies, "db").await;
        (s["restoreTest"]["last"]["passed"] == false).then_some(s)
    })
    .await;
    let last = &st["restoreTest"]["last"];
    assert_eq!(last["backupId"], full.id.as_str(), "{st}");
    assert_eq!(last["tablesChecked"], 31, "{st}");
    assert!(
        last["problems"][0]
            .as_str()
            .unwrap()
            .contains("expected \"8\""),
        "{st}"
    );
    let b = eventually("the Backup's restoreTest", || async {
        let b = backups.get("nightly-1").await.unwrap();
        b.status.and_then(|s| s.restore_test)
    })
    .await;
    assert!(!b.passed);
    let events = |reason: &'static str| {
        let admin = admin.clone();
        async move {
            Api::<K8sEvent>::namespaced(admin, ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
        }
    };
    let e = eventually("a RestoreTestFailed event", || events("RestoreTestFailed")).await;
    assert!(e.note.unwrap_or_default().contains("expected \"8\""));
    let (_, metrics) = op.get("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tidemark_restore_test_passed{") && l.ends_with(" 0")),
        "{metrics}"
    );
    // The next slot: a new Job, which passes.
    play(true, Some(first)).await;
    eventually("the passed test reported", || async {
        let s = status(&policies, "db").await;
        (s["restoreTest"]["last"]["passed"] == true).then_some(())
    })
    .await;
    eventually("a RestoreTestPassed event", || events("RestoreTestPassed")).await;
    eventually("the Backup's passed restoreTest", || async {
        let b = backups.get("nightly-1").await.unwrap();
        b.status.and_then(|s| s.restore_test).filter(|r| r.passed)
    })
    .await;
    let (_, metrics) = op.get("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tidemark_restore_test_passed{") && l.ends_with(" 1")),
        "{metrics}"
    );
    // The retention fields and the restore test's live side by side in status.
    let st = status(&policies, "db").await;
    assert!(st["conditions"][0]["reason"] == "PassSucceeded", "{st}");
    op.stop().await;
}

/// A Restore holds what it needs (issue 30 §4): while it runs (here its Job never ends: the
/// API server has no node), the backups of its plan stay whatever the rules say; once the
/// Restore is deleted, the next pass takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_holds_what_it_needs_from_retention() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "restore-holds";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let backups: Vec<SynthBackup> = (0..3)
        .map(|i| {
            let mut b =
                SynthBackup::full("nightly", now - SignedDuration::from_hours(3 - i), i as u32);
            b.method = "mariabackup".into();
            b
        })
        .collect();
    synth::write_backups(&store, &backups).await.unwrap();
    let ids: Vec<String> = backups.iter().map(|b| b.id.clone()).collect();
    // An established primary: retention may run.
    tidemark_operator::testkit::running_pod(
        &admin,
        ns,
        json!({"metadata": {"name": "db-0", "labels": {"app": "db", "tidemark.io/role": "primary"}},
               "spec": {"containers": [{"name": "mariadb", "image": "mariadb:10.11"}]}}),
    )
    .await;
    // The claim it restores into (no pod uses it).
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(admin.clone(), ns);
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "data-db2-0",
                    "labels": {tidemark_api::restore::RESTORE_INTO_LABEL: "db"}},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    // To the oldest backup's completion: its restore point.
    let oldest_done = backups[0].started_at + backups[0].duration;
    let restores: Api<tidemark_api::crd::Restore> = Api::namespaced(admin.clone(), ns);
    restores
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "Restore",
                "metadata": {"name": "from-the-oldest"},
                "spec": {"policy": {"name": "db"}, "target": {"to": oldest_done.to_string()},
                         "into": {"claim": "data-db2-0"}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut p = policy("db", ns, &weed.endpoint, "s3");
    p.spec.source = Some(
        serde_json::from_value(json!({"selector": {"matchLabels": {"app": "db"}},
                                      "primaryReadyFor": "1s"}))
        .unwrap(),
    );
    // No retention yet: a restore to an instant is held once planned, and a pass that
    // came first could take its backup (it would then be refused as not restorable).
    p.spec.retention = None;
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    policies.create(&PostParams::default(), &p).await.unwrap();
    let op = Operator::start(&cluster, "operator-restore-holds");
    // The Restore planned and runs; its plan names the oldest backup.
    let st = eventually("the Restore running", || async {
        let s = serde_json::to_value(restores.get("from-the-oldest").await.ok()?.status).ok()?;
        (s["phase"] == "Running").then_some(s)
    })
    .await;
    assert_eq!(st["backups"], json!([ids[0]]), "{st}");
    assert_eq!(st["conditions"][0]["reason"], "Restoring", "{st}");
    // Its hold is in the store's record as it plans (no retention pass has run: the policy
    // has no rules), for deleters that have only the store (seed 000).
    let recorded = tidemark_store::state::load_holds(&store)
        .await
        .unwrap()
        .expect("_state/holds.json written by the Restore's plan");
    assert!(
        recorded
            .restores
            .iter()
            .any(|r| r.backup_id == ids[0] && r.by.contains("from-the-oldest")),
        "{recorded:?}"
    );
    // A second Restore into the same claim waits for the first (two Jobs never write one
    // claim at once); deleted, it goes at once (its Job never started).
    restores
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "Restore",
                "metadata": {"name": "second"},
                "spec": {"policy": {"name": "db"}, "target": {"to": oldest_done.to_string()},
                         "into": {"claim": "data-db2-0", "replaceData": true}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // A claim of the namespace that is not the policy's database's (no StatefulSet the
    // policy selects has it, its owner did not label it): a Restore may not wipe it.
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "not-ours"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    restores
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "Restore",
                "metadata": {"name": "wipe"},
                "spec": {"policy": {"name": "db"}, "into": {"claim": "not-ours", "replaceData": true}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let wipe = eventually("the Restore into another's claim refused", || async {
        let s = serde_json::to_value(restores.get("wipe").await.ok()?.status).ok()?;
        (s["phase"] == "Failed").then_some(s)
    })
    .await;
    assert_eq!(
        wipe["conditions"][0]["reason"], "ClaimNotThePolicys",
        "{wipe}"
    );
    assert!(wipe["job"].is_null(), "{wipe}");
    // The policy's database, scaled so its pod 1 mounts the claim (a GitOps sync scaled
    // it back up, say): a Restore in place is refused, naming the set and what to pause.
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(admin.clone(), ns);
    sets.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "live"},
            "spec": {"replicas": 2, "serviceName": "live",
                     "selector": {"matchLabels": {"app": "db"}},
                     "template": {"metadata": {"labels": {"app": "db"}},
                                  "spec": {"containers": [{"name": "mariadb", "image": "mariadb:10.11"}]}},
                     "volumeClaimTemplates": [{"metadata": {"name": "data"},
                         "spec": {"accessModes": ["ReadWriteOnce"],
                                  "resources": {"requests": {"storage": "1Gi"}}}}]}}))
        .unwrap(),
    )
    .await
    .unwrap();
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "data-live-1"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    restores
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "Restore",
                "metadata": {"name": "scaled-up"},
                "spec": {"policy": {"name": "db"}, "into": {"claim": "data-live-1", "replaceData": true}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let scaled = eventually(
        "the Restore into a scaled-up set's claim refused",
        || async {
            let s = serde_json::to_value(restores.get("scaled-up").await.ok()?.status).ok()?;
            (s["phase"] == "Failed").then_some(s)
        },
    )
    .await;
    assert_eq!(
        scaled["conditions"][0]["reason"], "StatefulSetScaledUp",
        "{scaled}"
    );
    let said = scaled["conditions"][0]["message"].as_str().unwrap();
    assert!(
        said.contains("StatefulSet restore-holds/live asks for 2 replica(s)")
            && said.contains("scale it to 1 or fewer")
            && said.contains("Argo CD"),
        "{said}"
    );
    assert!(scaled["job"].is_null(), "{scaled}");
    let second = eventually("the second Restore waiting", || async {
        let s = serde_json::to_value(restores.get("second").await.ok()?.status).ok()?;
        (s["conditions"][0]["reason"] == "ClaimBusy").then_some(s)
    })
    .await;
    assert_eq!(second["phase"], "Pending", "{second}");
    assert!(second["job"].is_null(), "{second}");
    assert!(
        second["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("from-the-oldest"),
        "{second}"
    );
    restores
        .delete("second", &Default::default())
        .await
        .unwrap();
    eventually("the second Restore gone", || async {
        restores
            .get_opt("second")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    // Now keep only the newest.
    policies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retention": {"keepLast": 1}}})),
        )
        .await
        .unwrap();
    // The pass keeps the newest (keepLast 1) and the held one; the middle goes.
    eventually("the pass", || async {
        let s = status(&policies, "db").await;
        s["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["reason"] == "PassSucceeded")
            .then_some(())
    })
    .await;
    let mut left = metadata_ids(&store).await;
    left.sort();
    assert_eq!(
        left,
        vec![ids[0].clone(), ids[2].clone()],
        "the held backup must stay"
    );
    // The pass's audit record gives the reason: the Restore's hold.
    let mut reasons = Vec::new();
    for key in synth::all_keys(&store).await.unwrap() {
        if !key.starts_with("_audit/") {
            continue;
        }
        let body = store
            .read(&object_store::path::Path::from(key.as_str()))
            .await
            .unwrap()
            .unwrap();
        let audit: serde_json::Value = serde_json::from_slice(&body).unwrap();
        for b in audit["backups"].as_array().unwrap() {
            if b["backupId"] == ids[0].as_str() {
                reasons.push(b["reasons"].clone());
            }
        }
    }
    assert!(
        reasons.iter().any(|r| r
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x == "restore:from-the-oldest")),
        "{reasons:?}"
    );

    // Deleted, the Restore holds nothing: the next pass (due at once after a spec change)
    // deletes the backup it held.
    restores
        .delete("from-the-oldest", &Default::default())
        .await
        .unwrap();
    // Its finalizer stops its Job first; it holds until it is gone.
    eventually("the Restore gone", || async {
        restores
            .get_opt("from-the-oldest")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    pass_now(&policies, "db").await;
    until_ids(&store, &[ids[2].clone()], &policies, "not released").await;

    // A target in a gap of the window (the example store without segment 100): refused
    // when planned, naming the gap, with an event, and no claim made.
    let demo = weed.cluster_store("gapdemo");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/store/demo");
    let mut gap = None;
    let mut files = vec![src.clone()];
    while let Some(dir) = files.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                files.push(path);
                continue;
            }
            let key = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let mut body = std::fs::read(&path).unwrap();
            if key == "binlogs/mysql-bin.000100" || key == "NOTES.txt" {
                continue;
            }
            if key == "binlogs/_index.json" {
                let mut index: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let segments = index["segments"].as_array_mut().unwrap();
                let missing = segments.iter().find(|e| e["sequence"] == 100).unwrap();
                let (a, b): (Timestamp, Timestamp) = (
                    missing["firstEventAt"].as_str().unwrap().parse().unwrap(),
                    missing["lastEventAt"].as_str().unwrap().parse().unwrap(),
                );
                gap = Some(a + a.duration_until(b) / 2);
                segments.retain(|e| e["sequence"] != 100);
                body = serde_json::to_vec(&index).unwrap();
            }
            synth::write_raw(&demo, &key, &body).await.unwrap();
        }
    }
    let gap = gap.expect("segment 100 in the example's index");
    let mut p = policy("gapdemo", ns, &weed.endpoint, "s3");
    p.spec.retention = None;
    p.spec.cluster = Some("gapdemo".into());
    p.spec.source =
        Some(serde_json::from_value(json!({"selector": {"matchLabels": {"app": "db"}}})).unwrap());
    policies.create(&PostParams::default(), &p).await.unwrap();
    restores
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "Restore",
                "metadata": {"name": "in-the-gap"},
                "spec": {"policy": {"name": "gapdemo"}, "target": {"to": gap.to_string()},
                         "into": {"newClaim": {"name": "data-gap"}}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let st = eventually("the Restore in the gap refused", || async {
        let s = serde_json::to_value(restores.get("in-the-gap").await.ok()?.status).ok()?;
        (s["phase"] == "Failed").then_some(s)
    })
    .await;
    assert_eq!(st["conditions"][0]["reason"], "NotRestorable", "{st}");
    assert!(
        st["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("gap"),
        "{st}"
    );
    assert!(
        claims.get_opt("data-gap").await.unwrap().is_none(),
        "no claim made"
    );
    assert!(
        !tidemark_operator::testkit::events(&admin, ns, "NotRestorable")
            .await
            .is_empty()
    );
    op.stop().await;
}

/// Issue 44: a policy's copy through the operator, to a second bucket with the copy's own
/// retention: every backup reaches the copy before the policy's own retention lets it go
/// (the first pass declares the copy in the store), status, condition and metrics show
/// the copy's lag and window, and a copy the spec no longer names is forgotten by the next
/// pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_through_the_operator() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "copies";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let backups: Vec<SynthBackup> = (0..3)
        .map(|i| {
            let mut b =
                SynthBackup::full("nightly", now - SignedDuration::from_hours(3 - i), i as u32);
            b.method = "mariabackup".into();
            b
        })
        .collect();
    synth::write_backups(&store, &backups).await.unwrap();
    let mut ids: Vec<String> = backups.iter().map(|b| b.id.clone()).collect();
    ids.sort();
    let dr = weed.locked_bucket("dr-backups", "db").await;
    // An established primary (retention may run; a Restore knows the database's image).
    tidemark_operator::testkit::running_pod(
        &admin,
        ns,
        json!({"metadata": {"name": "db-0", "labels": {"app": "db", "tidemark.io/role": "primary"}},
               "spec": {"containers": [{"name": "mariadb", "image": "mariadb:10.11"}]}}),
    )
    .await;

    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    let mut p = policy("db", ns, &weed.endpoint, "s3");
    p.spec.source = Some(
        serde_json::from_value(json!({"selector": {"matchLabels": {"app": "db"}},
                                      "primaryReadyFor": "1s"}))
        .unwrap(),
    );
    p.spec.copies = vec![
        serde_json::from_value(json!({
            "name": "dr",
            "objectStore": {"bucket": "dr-backups", "endpoint": weed.endpoint, "credentialsSecret": "s3"},
            "retention": {"keepLast": 5},
            "maxLag": "1h",
        }))
        .unwrap(),
    ];
    policies.create(&PostParams::default(), &p).await.unwrap();
    let op = Operator::start(&cluster, "operator-copies");

    // Every backup reaches the copy, whichever of the pass and the copy came first.
    let reached = tokio::time::timeout(Duration::from_secs(90), async {
        while metadata_ids(&dr).await != ids {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "the copy: {}",
        status(&policies, "db").await
    );
    let st = eventually("the copy's status", || async {
        let s = status(&policies, "db").await;
        (s["copies"][0]["backupsSent"]
            .as_u64()
            .is_some_and(|n| n > 0)
            || s["copies"][0]["lagSeconds"] == 0)
            .then_some(s)
    })
    .await;
    let copy = &st["copies"][0];
    assert_eq!(copy["name"], "dr", "{st:#}");
    assert_eq!(copy["behind"], false, "{st:#}");
    assert_eq!(copy["lagSeconds"], 0, "{st:#}");
    assert!(copy["recoveryWindow"]["start"].is_string(), "{st:#}");
    let current = st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "CopiesCurrent")
        .unwrap_or_else(|| panic!("no CopiesCurrent: {st:#}"));
    assert_eq!(current["status"], "True", "{st:#}");
    let (_, metrics) = op.get("/metrics").await;
    assert!(
        metrics
            .contains(r#"tidemark_copy_lag_seconds{namespace="copies",policy="db",copy="dr"} 0"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"tidemark_copy_max_lag_seconds{namespace="copies",policy="db",copy="dr"} 3600"#
        ),
        "{metrics}"
    );
    // Verification on request reads every store: the policy's and the copy, each
    // reported on its own (`status.verification` and its `copies`).
    let verify_both = |request: &'static str| {
        let policies = policies.clone();
        async move {
            policies
                .patch(
                    "db",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {"tidemark.io/verify": request}}}),
                    ),
                )
                .await
                .unwrap();
            eventually("both stores verified", || async {
                let v = status(&policies, "db").await["verification"].clone();
                (v["request"] == request && v["copies"][0]["request"] == request).then_some(v)
            })
            .await
        }
    };
    let verified = verify_both("first").await;
    assert_eq!(verified["last"]["passed"], true, "{verified:#}");
    let in_copy = &verified["copies"][0];
    assert_eq!(in_copy["name"], "dr", "{verified:#}");
    assert_eq!(in_copy["last"]["passed"], true, "{verified:#}");
    assert_eq!(in_copy["last"]["backupId"], ids[2].as_str(), "{verified:#}");
    let (_, metrics) = op.get("/metrics").await;
    assert!(
        metrics.contains(
            r#"tidemark_copy_verification_passed{namespace="copies",policy="db",copy="dr"} 1"#
        ),
        "{metrics}"
    );
    // The copy's newest payload damaged in the copy only: the copy fails, the store passes.
    synth::write_raw(&dr, &format!("nightly/{}/backup.tar", ids[2]), b"damaged")
        .await
        .unwrap();
    let verified = verify_both("second").await;
    assert_eq!(verified["last"]["passed"], true, "{verified:#}");
    assert_eq!(
        verified["copies"][0]["last"]["passed"], false,
        "{verified:#}"
    );
    assert!(
        verified["copies"][0]["last"]["problems"]
            .to_string()
            .contains(&ids[2]),
        "{verified:#}"
    );
    let (_, metrics) = op.get("/metrics").await;
    assert!(
        metrics.contains(
            r#"tidemark_copy_verification_passed{namespace="copies",policy="db",copy="dr"} 0"#
        ),
        "{metrics}"
    );
    // The policy's own retention (keepLast 1) now lets the two older go; the copy keeps
    // them (its keepLast 5).
    pass_now(&policies, "db").await;
    until_ids(&store, &ids[2..], &policies, "keepLast 1 after the copy").await;
    assert_eq!(metadata_ids(&dr).await, ids, "the copy mirrored a deletion");
    let record = tidemark_store::state::load_copy(&store, "dr")
        .await
        .unwrap();
    assert!(record.is_some(), "no record of the copy in the store");

    // A Restore from the copy (`from: dr`) to a backup only the copy still has: planned
    // against the copy, its backup held in the copy's record of holds, not the store's.
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(admin.clone(), ns);
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "data-db2-0",
                    "labels": {tidemark_api::restore::RESTORE_INTO_LABEL: "db"}},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let restores: Api<tidemark_api::crd::Restore> = Api::namespaced(admin.clone(), ns);
    restores
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "Restore",
                "metadata": {"name": "from-dr"},
                "spec": {"policy": {"name": "db"}, "from": "dr",
                         "target": {"backupId": ids[0]}, "into": {"claim": "data-db2-0"}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let rs = eventually("the Restore from the copy running", || async {
        let s = serde_json::to_value(restores.get("from-dr").await.ok()?.status).ok()?;
        (s["phase"] == "Running").then_some(s)
    })
    .await;
    assert_eq!(rs["backups"], json!([ids[0]]), "{rs}");
    assert!(
        rs["conditions"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("from copy dr")),
        "{rs}"
    );
    let in_copy = tidemark_store::state::load_holds(&dr)
        .await
        .unwrap()
        .unwrap();
    assert!(
        in_copy
            .restores
            .iter()
            .any(|r| r.backup_id == ids[0] && r.by.contains("from-dr")),
        "{in_copy:?}"
    );
    let in_store = tidemark_store::state::load_holds(&store).await.unwrap();
    assert!(
        in_store.is_none_or(|h| h.restores.iter().all(|r| !r.by.contains("from-dr"))),
        "a restore from the copy held in the policy's store"
    );
    // A Restore naming a copy the policy does not have is refused, naming the copies.
    restores
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "Restore",
                "metadata": {"name": "from-nowhere"},
                "spec": {"policy": {"name": "db"}, "from": "elsewhere",
                         "into": {"claim": "data-db2-0"}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let refused = eventually("the Restore from no copy refused", || async {
        let s = serde_json::to_value(restores.get("from-nowhere").await.ok()?.status).ok()?;
        (s["phase"] == "Failed").then_some(s)
    })
    .await;
    assert!(
        refused.to_string().contains("CopyMissing")
            && refused.to_string().contains("spec.copies: dr"),
        "{refused}"
    );
    restores
        .delete("from-dr", &Default::default())
        .await
        .unwrap();

    // The copy no longer named: the next pass forgets it.
    policies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"copies": null, "retentionInterval": "58m"}})),
        )
        .await
        .unwrap();
    eventually("the copy's record forgotten", || async {
        tidemark_store::state::load_copy(&store, "dr")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(metadata_ids(&dr).await, ids, "forgetting touched the copy");
}

/// The deletion guard through the operator (issue 45 §3): a policy edit — previewed first
/// in `status.policyChange` and a `PolicyChangePreview` event (§2) — that would delete
/// most of the history deletes nothing — the condition `DeletionGuard` says how many and
/// why and names the annotation that releases them, with a `DeletionsHeld` event — until
/// the policy is annotated `tidemark.io/allow-deletions-before` with that instant; the
/// annotation left in place does not release the next wave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_edit_that_would_delete_most_backups_is_held() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "guard";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let hourly = |from: i64, n: i64| -> Vec<SynthBackup> {
        (from..from + n)
            .map(|h| {
                SynthBackup::full("hourly", now - SignedDuration::from_hours(60 - h), h as u32)
            })
            .collect()
    };
    let first = hourly(0, 20);
    synth::write_backups(&store, &first).await.unwrap();
    let mut p = policy("db", ns, &weed.endpoint, "s3");
    p.spec.retention = Some(serde_json::from_value(json!({"keepLast": 20})).unwrap());
    p.spec.retention_interval = Some("1s".into());
    let policies = Api::<BackupPolicy>::namespaced(admin.clone(), ns);
    policies.create(&PostParams::default(), &p).await.unwrap();
    let op = Operator::start(&cluster, "operator-guard");
    let guard_condition = || async {
        let s = status(&policies, "db").await;
        s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "DeletionGuard")
            .cloned()
    };
    eventually("a first pass with nothing held", || async {
        guard_condition()
            .await
            .filter(|c| c["reason"] == "NothingHeld")
            .map(|_| ())
    })
    .await;
    // The edit: keep one of twenty.
    policies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retention": {"keepLast": 1}}})),
        )
        .await
        .unwrap();
    let held = eventually("the edit held", || async {
        guard_condition()
            .await
            .filter(|c| c["reason"] == "MassDeletionHeld" && c["status"] == "True")
    })
    .await;
    let message = held["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with("19 backup deletion(s) held: it would delete 19 of 20"),
        "{message}"
    );
    let at = message
        .split("tidemark.io/allow-deletions-before: \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no instant in {message}"))
        .to_owned();
    // The change was previewed before a pass acted on it (issue 45 §2).
    let change = status(&policies, "db").await["policyChange"].clone();
    assert_eq!(change["newlyDeleted"], 19, "{change}");
    assert_eq!(change["backups"].as_array().unwrap().len(), 19, "{change}");
    assert!(
        change["message"]
            .as_str()
            .unwrap()
            .contains("deletes 19 backup(s) the applied retention keeps"),
        "{change}"
    );
    eventually("a PolicyChangePreview event", || async {
        Api::<K8sEvent>::namespaced(admin.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("PolicyChangePreview"))
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .map(|_| ())
    })
    .await;
    // Passes go on every second: none deletes anything.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(metadata_ids(&store).await.len(), 20);
    eventually("a DeletionsHeld event", || async {
        Api::<K8sEvent>::namespaced(admin.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("DeletionsHeld"))
            .map(|_| ())
    })
    .await;
    // The acknowledgement releases that wave.
    policies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"tidemark.io/allow-deletions-before": at}}}),
            ),
        )
        .await
        .unwrap();
    until_ids(
        &store,
        &[first.last().unwrap().id.clone()],
        &policies,
        "the acknowledged wave deleted",
    )
    .await;
    eventually("nothing held after it", || async {
        guard_condition()
            .await
            .filter(|c| c["reason"] == "NothingHeld")
            .map(|_| ())
    })
    .await;
    // The next wave — fifteen newer backups kept by keepLast 20, then keepLast 1 again —
    // is held although the annotation is still there.
    let keep_last = |n: i64| {
        let policies = policies.clone();
        async move {
            policies
                .patch(
                    "db",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"retention": {"keepLast": n}}})),
                )
                .await
                .unwrap();
        }
    };
    keep_last(20).await;
    let second = hourly(20, 15);
    synth::write_backups(&store, &second).await.unwrap();
    eventually("a pass that sees them", || async {
        let s = status(&policies, "db").await;
        (s["backupsKept"] == 16).then_some(())
    })
    .await;
    keep_last(1).await;
    eventually("the next wave held", || async {
        guard_condition()
            .await
            .filter(|c| c["reason"] == "MassDeletionHeld")
            .map(|_| ())
    })
    .await;
    assert_eq!(metadata_ids(&store).await.len(), 16);
    op.stop().await;
}

/// The review's finding: right after an upgrade the status has no `appliedRetention`, and
/// the first edit was not previewed. The operator records it as soon as it sees that the
/// last whole pass was of the spec's generation (not an interval later), so the first
/// edit is previewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_edit_after_an_upgrade_is_previewed() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "upgraded";
    cluster.namespace(ns).await;
    secret(&admin, ns, "s3").await;
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let backups: Vec<SynthBackup> = (0..3)
        .map(|h| SynthBackup::full("hourly", now - SignedDuration::from_hours(10 - h), h as u32))
        .collect();
    synth::write_backups(&store, &backups).await.unwrap();
    let mut p = policy("db", ns, &weed.endpoint, "s3");
    p.spec.retention = Some(serde_json::from_value(json!({"keepLast": 3})).unwrap());
    p.spec.retention_interval = Some("1h".into());
    let policies = Api::<BackupPolicy>::namespaced(admin.clone(), ns);
    policies.create(&PostParams::default(), &p).await.unwrap();
    let op = Operator::start(&cluster, "operator-upgraded");
    let first = eventually("a first pass", || async {
        let s = status(&policies, "db").await;
        (s["appliedRetention"] == json!({"keepLast": 3})).then_some(s)
    })
    .await;
    op.stop().await;
    // The status an older operator left: no appliedRetention.
    policies
        .patch_status(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"appliedRetention": null}})),
        )
        .await
        .unwrap();
    assert_eq!(
        status(&policies, "db").await["appliedRetention"],
        json!(null)
    );
    let op = Operator::start(&cluster, "operator-upgraded-2");
    let recorded = eventually("appliedRetention recorded without a pass", || async {
        let s = status(&policies, "db").await;
        (s["appliedRetention"] == json!({"keepLast": 3})).then_some(s)
    })
    .await;
    assert_eq!(
        recorded["lastRetentionRunTime"], first["lastRetentionRunTime"],
        "no pass ran: the interval is an hour"
    );
    policies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retention": {"keepLast": 1}}})),
        )
        .await
        .unwrap();
    let change = eventually("the edit previewed", || async {
        let s = status(&policies, "db").await;
        Some(s["policyChange"].clone()).filter(|c| !c.is_null())
    })
    .await;
    assert_eq!(change["newlyDeleted"], 2, "{change}");
    op.stop().await;
}
