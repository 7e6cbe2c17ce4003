//! Opt-in remote cleanup (seed 000's finalizer, issue 11) against a real API server,
//! controller-manager (namespace deletion, garbage collection) and SeaweedFS: the five
//! finalizer steps with a real deletion held by the finalizer; a store failure (condition,
//! Warning event, finalizer kept, retry succeeds); the bypass; a backup a recovery depends
//! on is kept while its object waits; and `Retain` surviving an owner-reference cascade
//! and a namespace deletion with every remote object still there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPolicy, DeleteHook};
use tidemark_operator::testkit::{
    KubeCluster, Operator, ShiftedClock, Webhook, cleanup_finalizer, completed_backup, events,
    eventually, s3_secret,
};
use tidemark_store::synth::{self, SynthBackup};
use tidemark_store::testkit::{BUCKET, SeaweedFs};

async fn secret(client: &Client, ns: &str) {
    s3_secret(client, ns, "s3").await;
}

fn policy(ns: &str, endpoint: &str, deletion: Option<&str>) -> BackupPolicy {
    let mut spec = json!({
        "objectStore": {"bucket": BUCKET, "endpoint": endpoint, "credentialsSecret": "s3"},
        "cluster": ns,
    });
    if let Some(d) = deletion {
        spec["deletionPolicy"] = json!(d);
    }
    serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "db", "namespace": ns},
        "spec": spec,
    }))
    .unwrap()
}

async fn backup_object(api: &Api<Backup>, b: &SynthBackup, extra: serde_json::Value) {
    completed_backup(api, b, extra).await;
}

/// Every key in the cluster's prefix, relative to it, but the directory's owner record
/// (written when the operator first opens the store for its policy, whenever that is) and
/// the holds it records at its passes.
async fn keys(store: &tidemark_store::ClusterStore) -> Vec<String> {
    let mut k: Vec<String> = synth::all_keys(store)
        .await
        .unwrap()
        .into_iter()
        .filter(|k| k != "_state/owner.json" && k != "_state/holds.json")
        .collect();
    k.sort();
    k
}

/// The audit records among `keys` (relative to the cluster, as `read` takes them).
async fn audit_records(
    store: &tidemark_store::ClusterStore,
    keys: &[String],
) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for k in keys.iter().filter(|k| k.starts_with("_audit/")) {
        let bytes = store
            .read(&object_store::path::Path::from(k.as_str()))
            .await
            .unwrap()
            .unwrap();
        out.push(serde_json::from_slice(&bytes).unwrap());
    }
    out
}

fn of(keys: &[String], b: &SynthBackup) -> Vec<String> {
    let prefix = format!("{}/{}/", b.name, b.id);
    keys.iter()
        .filter(|k| k.starts_with(&prefix))
        .cloned()
        .collect()
}

async fn finalizers(api: &Api<Backup>, name: &str) -> Option<Vec<String>> {
    api.get_opt(name)
        .await
        .unwrap()
        .map(|b| b.finalizers().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_cleanup_is_opt_in_and_crash_safe() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(true).await;
    let admin = cluster.admin_client();
    let now = Timestamp::now();
    let ago = |h: i64| now - SignedDuration::from_mins(h);

    // --- Delete: the policy opts in.
    let ns = "cleanup";
    cluster.namespace(ns).await;
    secret(&admin, ns).await;
    let store = weed.cluster_store(ns);
    let old = SynthBackup::full("old", ago(300), 1);
    let flaky = SynthBackup::full("flaky", ago(280), 2);
    let skipped = SynthBackup::full("skipped", ago(260), 3);
    let kept = SynthBackup::full("kept", ago(240), 4);
    let base = SynthBackup::full("base", ago(220), 5);
    let inc = SynthBackup::incremental("inc", &base.id, ago(200), 6);
    let newest = SynthBackup::full("newest", ago(100), 7);
    let all = [&old, &flaky, &skipped, &kept, &base, &inc, &newest];
    synth::write_backups(
        &store,
        &all.iter().map(|b| (*b).clone()).collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    policies
        .create(
            &PostParams::default(),
            &policy(ns, &weed.endpoint, Some("Delete")),
        )
        .await
        .unwrap();
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    for b in [&old, &flaky, &base] {
        backup_object(&backups, b, json!({})).await;
    }
    backup_object(
        &backups,
        &skipped,
        json!({"metadata": {"annotations": {"tidemark.io/skip-remote-cleanup": "true"}}}),
    )
    .await;
    // The Backup's own Retain overrides the policy's Delete.
    backup_object(
        &backups,
        &kept,
        json!({"spec": {"deletionPolicy": "Retain"}}),
    )
    .await;
    let op = Operator::start(&cluster, "operator-cleanup");

    // 1. The finalizer is on every Backup whose effective policy is Delete, and only there.
    for name in ["old", "flaky", "skipped", "base"] {
        cleanup_finalizer(&backups, name).await;
    }
    assert_eq!(
        finalizers(&backups, "kept").await.unwrap(),
        Vec::<String>::new()
    );

    // 2–3, 5. Deleting `old`: the finalizer holds the object while the engine deletes its
    // data (audit record first), then lets it go.
    let before = keys(&store).await;
    assert!(!of(&before, &old).is_empty());
    backups
        .delete("old", &DeleteParams::default())
        .await
        .unwrap();
    eventually("old gone", || async {
        finalizers(&backups, "old").await.is_none().then_some(())
    })
    .await;
    let after = keys(&store).await;
    assert_eq!(
        of(&after, &old),
        Vec::<String>::new(),
        "old's data is deleted"
    );
    for b in [&flaky, &skipped, &kept, &base, &inc, &newest] {
        assert_eq!(of(&after, b), of(&before, b), "{} untouched", b.name);
    }
    let audit = audit_records(&store, &after).await;
    assert_eq!(audit.len(), 1, "{after:?}");
    let record = audit[0].clone();
    assert_eq!(
        record["backups"][0]["backupId"],
        old.id.as_str(),
        "{record}"
    );
    assert_eq!(
        record["backups"][0]["reasons"],
        json!(["deletionRequested"]),
        "{record}"
    );
    assert_eq!(
        record["policy"]["deletionRequestedBy"], "Backup cleanup/old",
        "{record}"
    );
    assert!(!events(&admin, ns, "RemoteDataDeleted").await.is_empty());

    // 4. A store failure: a condition and a Warning event, the finalizer kept; fixed, the
    // retry deletes the data and lets the object go.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    policies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"objectStore": {"endpoint": dead}}})),
        )
        .await
        .unwrap();
    backups
        .delete("flaky", &DeleteParams::default())
        .await
        .unwrap();
    let st = eventually("RemoteCleanupFailed on flaky", || async {
        let b = backups.get("flaky").await.unwrap();
        let s = serde_json::to_value(&b.status).unwrap();
        s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "RemoteCleanup" && c["reason"] == "RemoteCleanupFailed")
            .then_some(s)
    })
    .await;
    assert_eq!(
        st["phase"], "completed",
        "the rest of the status is kept: {st}"
    );
    assert!(
        backups
            .get("flaky")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    assert!(
        finalizers(&backups, "flaky")
            .await
            .unwrap()
            .contains(&"tidemark.io/remote-cleanup".to_owned())
    );
    assert!(!events(&admin, ns, "RemoteCleanupFailed").await.is_empty());
    assert_eq!(of(&keys(&store).await, &flaky), of(&before, &flaky));
    policies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"objectStore": {"endpoint": weed.endpoint}}})),
        )
        .await
        .unwrap();
    eventually("flaky gone after the retry", || async {
        finalizers(&backups, "flaky").await.is_none().then_some(())
    })
    .await;
    assert_eq!(of(&keys(&store).await, &flaky), Vec::<String>::new());

    // The bypass: the object goes, the data stays.
    backups
        .delete("skipped", &DeleteParams::default())
        .await
        .unwrap();
    eventually("skipped gone", || async {
        finalizers(&backups, "skipped")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(of(&keys(&store).await, &skipped), of(&before, &skipped));
    assert!(!events(&admin, ns, "RemoteCleanupSkipped").await.is_empty());

    // A backup a committed increment builds on is never deleted directly: the object
    // waits, saying why, and the data stays.
    backups
        .delete("base", &DeleteParams::default())
        .await
        .unwrap();
    let st = eventually("base waits", || async {
        let s = serde_json::to_value(backups.get("base").await.unwrap().status).unwrap();
        s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "RemoteCleanup" && c["reason"] == "WaitingForRetention")
            .cloned()
    })
    .await;
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains(&format!("chain:{}", inc.id)),
        "{st}"
    );
    // Marked, not deleted: its data and a mark beside it (seed 002).
    let mut marked = of(&before, &base);
    marked.push(format!("base/{}/_deletion-requested.json", base.id));
    marked.sort();
    assert_eq!(of(&keys(&store).await, &base), marked);

    // Retain (the Backup's own): no finalizer, so deleting the object touches nothing.
    backups
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    eventually("kept gone", || async {
        finalizers(&backups, "kept").await.is_none().then_some(())
    })
    .await;
    assert_eq!(of(&keys(&store).await, &kept), of(&before, &kept));

    // --- Retain (the default): an owner-reference cascade by the real garbage collector
    // and a namespace deletion leave every remote object in place.
    let ns2 = "keepsake";
    cluster.namespace(ns2).await;
    secret(&admin, ns2).await;
    let store2 = weed.cluster_store(ns2);
    let owned = SynthBackup::full("owned", ago(120), 8);
    let plain = SynthBackup::full("plain", ago(60), 9);
    synth::write_backups(&store2, &[owned.clone(), plain.clone()])
        .await
        .unwrap();
    let before2 = keys(&store2).await;
    Api::<BackupPolicy>::namespaced(admin.clone(), ns2)
        .create(&PostParams::default(), &policy(ns2, &weed.endpoint, None))
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), ns2);
    let owner = configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner", "namespace": ns2}}))
                .unwrap(),
        )
        .await
        .unwrap();
    let backups2: Api<Backup> = Api::namespaced(admin.clone(), ns2);
    backup_object(
        &backups2,
        &owned,
        json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.uid().unwrap()}]}}),
    )
    .await;
    backup_object(&backups2, &plain, json!({})).await;
    // The operator has seen them (and put no finalizer on them).
    eventually("plain reconciled", || async {
        let b = backups2.get("plain").await.unwrap();
        (b.finalizers().is_empty() && b.status.is_some()).then_some(())
    })
    .await;
    configmaps
        .delete("owner", &DeleteParams::default())
        .await
        .unwrap();
    eventually("owned collected by the garbage collector", || async {
        finalizers(&backups2, "owned").await.is_none().then_some(())
    })
    .await;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .delete(ns2, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the namespace deleted", || async {
        namespaces
            .get_opt(ns2)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        keys(&store2).await,
        before2,
        "every remote object is still there"
    );
    op.stop().await;
}

/// TTL expiry (seed 004): Backups whose `ttl` ran out since their creation are deleted
/// with their data (whatever `deletionPolicy` says), with `ttlExpired` in the audit
/// record; the newest restorable backup never expires; without the policy's Secret the
/// expiry is a warning (event and condition) and the data stays, until the Secret exists.
/// The operator runs two days ahead, so a `1d` TTL has run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expiry_deletes_backups_with_their_data_but_never_the_floor() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let now = Timestamp::now();
    let ago = |m: i64| now - SignedDuration::from_mins(m);

    let ns = "expiry";
    cluster.namespace(ns).await;
    secret(&admin, ns).await;
    let store = weed.cluster_store(ns);
    let expired = SynthBackup::full("expired", ago(300), 1);
    let young = SynthBackup::full("young", ago(200), 2);
    let floor = SynthBackup::full("floor", ago(100), 3);
    let held = SynthBackup::full("held", ago(250), 6);
    // A chain's base whose ttl ran out while an increment (ttl 30d) builds on it.
    let base = SynthBackup::full("base", ago(290), 7);
    let mut child = SynthBackup::incremental("base", &base.id, ago(280), 8);
    child.ttl = Some("30d".parse().unwrap());
    synth::write_backups(
        &store,
        &[
            expired.clone(),
            young.clone(),
            floor.clone(),
            held.clone(),
            base.clone(),
            child.clone(),
        ],
    )
    .await
    .unwrap();
    let before = keys(&store).await;
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy(ns, &weed.endpoint, None))
        .await
        .unwrap();
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    backup_object(&backups, &expired, json!({"spec": {"ttl": "1d"}})).await;
    backup_object(&backups, &young, json!({"spec": {"ttl": "30d"}})).await;
    backup_object(&backups, &floor, json!({"spec": {"ttl": "1d"}})).await;
    backup_object(&backups, &base, json!({"spec": {"ttl": "1d"}})).await;
    // Expired too, but on hold.
    backup_object(
        &backups,
        &held,
        json!({"metadata": {"annotations": {"tidemark.io/protect": "true"}}, "spec": {"ttl": "1d"}}),
    )
    .await;

    // Without its Secret, the expiry is blocked: a warning, the data and object kept.
    let ns2 = "expiry-nosecret";
    cluster.namespace(ns2).await;
    let store2 = weed.cluster_store(ns2);
    let stranded = SynthBackup::full("stranded", ago(300), 4);
    let newer = SynthBackup::full("newer", ago(100), 5);
    synth::write_backups(&store2, &[stranded.clone(), newer.clone()])
        .await
        .unwrap();
    let before2 = keys(&store2).await;
    Api::<BackupPolicy>::namespaced(admin.clone(), ns2)
        .create(&PostParams::default(), &policy(ns2, &weed.endpoint, None))
        .await
        .unwrap();
    let backups2: Api<Backup> = Api::namespaced(admin.clone(), ns2);
    backup_object(&backups2, &stranded, json!({"spec": {"ttl": "1d"}})).await;

    let op = Operator::start_with_clock(
        &cluster,
        "operator-expiry",
        std::sync::Arc::new(ShiftedClock::new(SignedDuration::from_hours(48))),
    );
    eventually("expired gone", || async {
        finalizers(&backups, "expired")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    let after = keys(&store).await;
    assert_eq!(
        of(&after, &expired),
        Vec::<String>::new(),
        "its data went with it"
    );
    assert_eq!(of(&after, &young), of(&before, &young));
    assert_eq!(of(&after, &floor), of(&before, &floor));
    let audit = audit_records(&store, &after).await;
    assert_eq!(audit.len(), 1, "{after:?}");
    let record = audit[0].clone();
    assert_eq!(record["backups"][0]["backupId"], expired.id.as_str());
    assert_eq!(
        record["backups"][0]["reasons"],
        json!(["ttlExpired"]),
        "{record}"
    );
    assert!(!events(&admin, ns, "BackupExpired").await.is_empty());

    // The chain's base: its status says why its data stays, and until when (issue 43 §3).
    let st = eventually("the base's reason", || async {
        let s = serde_json::to_value(backups.get("base").await.ok()?.status).unwrap();
        s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Expired" && c["reason"] == "ChainBase")
            .cloned()
    })
    .await;
    let until = (child.started_at + SignedDuration::from_hours(30 * 24)).to_string();
    let message = st["message"].as_str().unwrap();
    assert!(
        message.contains("base of 1 committed increment")
            && message.contains(&format!("not before {until}")),
        "{st}"
    );
    let now_keys = of(&keys(&store).await, &base);
    for k in of(&before, &base) {
        assert!(now_keys.contains(&k), "{k} gone: {now_keys:?}");
    }

    // The floor's TTL ran out too, but it never expires.
    let st = eventually("the floor waits", || async {
        let s = serde_json::to_value(backups.get("floor").await.unwrap().status).unwrap();
        s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Expired" && c["reason"] == "NewestRestorable")
            .cloned()
    })
    .await;
    assert_eq!(st["status"], "False");
    assert!(
        backups
            .get("floor")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
    assert!(
        backups
            .get("young")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );

    // No Secret: a Warning and a condition; nothing deleted.
    let st = eventually("the expiry blocked", || async {
        let s = serde_json::to_value(backups2.get("stranded").await.unwrap().status).unwrap();
        s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Expired" && c["reason"] == "StoreUnreachable")
            .cloned()
    })
    .await;
    assert!(st["message"].as_str().unwrap().contains("Secret"), "{st}");
    assert!(!events(&admin, ns2, "BackupExpiryBlocked").await.is_empty());
    assert_eq!(keys(&store2).await, before2, "the data stays");
    assert!(
        backups2
            .get("stranded")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
    // With the Secret, the retry expires it.
    secret(&admin, ns2).await;
    eventually("stranded expired once the Secret exists", || async {
        finalizers(&backups2, "stranded")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(of(&keys(&store2).await, &stranded), Vec::<String>::new());
    assert_eq!(of(&keys(&store2).await, &newer), of(&before2, &newer));

    // The held Backup's ttl ran out, but the hold wins: it waits, its data whole.
    let st = eventually("the held one waits", || async {
        let s = serde_json::to_value(backups.get("held").await.unwrap().status).unwrap();
        s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Expired" && c["reason"] == "Held")
            .cloned()
    })
    .await;
    assert_eq!(st["status"], "False");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("tidemark.io/protect"),
        "{st}"
    );
    assert!(
        backups
            .get("held")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
    assert_eq!(of(&keys(&store).await, &held), of(&before, &held));
    // Released: it expires with its data.
    backups
        .patch(
            "held",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {"tidemark.io/protect": null}}}),
            ),
        )
        .await
        .unwrap();
    eventually("held expired once released", || async {
        finalizers(&backups, "held").await.is_none().then_some(())
    })
    .await;
    assert_eq!(of(&keys(&store).await, &held), Vec::<String>::new());
    op.stop().await;
}

/// DeleteHooks (seed 003): every hook that selects the Backup runs before its data goes,
/// in name order — a webhook that answers, one that fails, one that times out, and a Job
/// (the test plays the node) — and none can stop the deletion; every outcome is in the
/// Backup's status and events while it exists, and in the audit record. A hook whose
/// selector does not match never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_hooks_run_in_name_order_and_never_veto() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let hook_server = Webhook::start().await;
    let ns = "hooks";
    cluster.namespace(ns).await;
    secret(&admin, ns).await;
    let store = weed.cluster_store(ns);
    let now = Timestamp::now();
    let (gone, _newest) = synth::older_and_newer(&store, "gone", "newest", now)
        .await
        .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &policy(ns, &weed.endpoint, Some("Delete")),
        )
        .await
        .unwrap();
    let hooks: Api<DeleteHook> = Api::namespaced(admin.clone(), ns);
    let webhook = |path: &str, timeout: &str| json!({"webhook": {"url": format!("{}{path}", hook_server.url), "caBundle": hook_server.ca_bundle}, "timeout": timeout});
    // Created out of order: they run by name.
    for (name, team, action) in [
        ("c-slow", "pay", webhook("/slow", "2s")),
        ("a-notify", "pay", webhook("/ok", "10s")),
        ("e-other-team", "ops", webhook("/ok", "10s")),
        (
            "d-job",
            "pay",
            json!({"job": {"spec": {"containers": [{"name": "cleanup", "image": "busybox:1.36", "command": ["sh", "-c", "echo \"$TIDEMARK_BACKUP\""]}]}}, "timeout": "5m"}),
        ),
        ("b-ticket", "pay", webhook("/fail", "10s")),
        // Never run (they select nothing): their Ready says why they could not.
        ("f-local", "nobody", json!({"command": ["true"]})),
        (
            "g-bad-ca",
            "nobody",
            json!({"webhook": {"url": "https://hooks.example/x", "caBundle": "not a certificate"}}),
        ),
        (
            "h-privileged",
            "nobody",
            json!({"job": {"spec": {"containers": [{"name": "x", "image": "busybox:1.36", "securityContext": {"privileged": true}}]}}}),
        ),
    ] {
        let mut spec = action;
        spec["selector"] = json!({"matchLabels": {"team": team}});
        let h: DeleteHook = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "DeleteHook",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        }))
        .unwrap();
        hooks.create(&PostParams::default(), &h).await.unwrap();
    }
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    backup_object(
        &backups,
        &gone,
        json!({"metadata": {"labels": {"team": "pay"}}}),
    )
    .await;
    // For the retention-pass part below: its Backup object exists (completed) before
    // the operator starts, as a reconcile racing the test's status patch would see it
    // pending.
    let ns2 = "hooks-pass";
    cluster.namespace(ns2).await;
    secret(&admin, ns2).await;
    let store2 = weed.cluster_store(ns2);
    let old = SynthBackup::full("old", now - SignedDuration::from_hours(3), 3);
    let new = SynthBackup::full("new", now - SignedDuration::from_hours(1), 4);
    synth::write_backups(&store2, &[old.clone(), new.clone()])
        .await
        .unwrap();
    let h: DeleteHook = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "DeleteHook",
        "metadata": {"name": "notify", "namespace": ns2},
        "spec": webhook("/ok", "10s"),
    }))
    .unwrap();
    Api::<DeleteHook>::namespaced(admin.clone(), ns2)
        .create(&PostParams::default(), &h)
        .await
        .unwrap();
    let backups2: Api<Backup> = Api::namespaced(admin.clone(), ns2);
    backup_object(&backups2, &old, json!({})).await;
    let op = Operator::start(&cluster, "operator-hooks");
    cleanup_finalizer(&backups, "gone").await;
    let before = keys(&store).await;
    backups
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();

    // The webhooks ran in order; the Job hook waits for its Job; nothing is deleted yet.
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let job = eventually("the hook's Job", || async {
        jobs.list(&ListParams::default().labels("tidemark.io/delete-hook=d-job"))
            .await
            .unwrap()
            .items
            .into_iter()
            .next()
    })
    .await;
    let st = serde_json::to_value(backups.get("gone").await.unwrap().status).unwrap();
    let outcomes: Vec<(String, String)> = st["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["name"].as_str().unwrap().to_owned(),
                h["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    assert_eq!(
        outcomes,
        pairs(&[
            ("a-notify", "succeeded"),
            ("b-ticket", "failed"),
            ("c-slow", "timedOut"),
            ("d-job", "running")
        ]),
        "{st}"
    );
    assert!(
        st["hooks"][1]["message"].as_str().unwrap().contains("500"),
        "{st}"
    );
    assert_eq!(
        of(&keys(&store).await, &gone),
        of(&before, &gone),
        "data kept while hooks run"
    );
    let calls = hook_server.calls.lock().unwrap().clone();
    let paths: Vec<&str> = calls.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        ["/ok", "/fail", "/slow"],
        "in name order, the other team's never"
    );
    assert_eq!(calls[0].1["backup"]["name"], "gone");
    assert_eq!(calls[0].1["backup"]["backupId"], gone.id.as_str());
    assert_eq!(calls[0].1["reason"], "deletionRequested");
    let env = serde_json::to_string(&job.spec.as_ref().unwrap().template).unwrap();
    assert!(
        env.contains("TIDEMARK_BACKUP") && env.contains(&gone.id),
        "{env}"
    );

    // The node runs the Job: it succeeds, and the deletion goes on.
    jobs.patch_status(
        &job.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}})),
    )
    .await
    .unwrap();
    eventually("gone deleted", || async {
        finalizers(&backups, "gone").await.is_none().then_some(())
    })
    .await;
    let after = keys(&store).await;
    assert_eq!(of(&after, &gone), Vec::<String>::new());
    let audit = audit_records(&store, &after).await;
    let record = audit[0].clone();
    assert_eq!(record["hooks"][0]["backupId"], gone.id.as_str(), "{record}");
    let recorded: Vec<(String, String)> = record["hooks"][0]["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["name"].as_str().unwrap().to_owned(),
                h["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        recorded,
        pairs(&[
            ("a-notify", "succeeded"),
            ("b-ticket", "failed"),
            ("c-slow", "timedOut"),
            ("d-job", "succeeded")
        ]),
        "{record}"
    );
    for reason in [
        "DeleteHookSucceeded",
        "DeleteHookFailed",
        "DeleteHookTimedOut",
    ] {
        assert!(
            !events(&admin, ns, reason).await.is_empty(),
            "no {reason} event"
        );
    }
    // Every outcome is an event of its own: the two hooks that succeeded are two events,
    // each naming its hook (a recorder that folds events by reason kept only the first).
    let succeeded: Vec<String> = events(&admin, ns, "DeleteHookSucceeded")
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .collect();
    assert_eq!(succeeded.len(), 2, "{succeeded:?}");
    for hook in ["a-notify", "d-job"] {
        assert!(
            succeeded.iter().any(|n| n.contains(hook)),
            "no event for {hook}: {succeeded:?}"
        );
    }

    // Each hook's Ready says whether the operator can run it, and how its last run ended.
    let ready = |name: &'static str| {
        let hooks = hooks.clone();
        async move {
            let h = hooks.get(name).await.unwrap();
            let st = serde_json::to_value(h.status).unwrap();
            let c = st["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready")?
                .clone();
            (st["observedGeneration"] == json!(h.metadata.generation)).then_some((
                c["status"].as_str()?.to_owned(),
                c["reason"].as_str()?.to_owned(),
                c["message"].as_str()?.to_owned(),
                st["lastRun"].clone(),
            ))
        }
    };
    for (name, status, reason, says) in [
        ("a-notify", "True", "LastRunSucceeded", "for gone"),
        ("b-ticket", "False", "LastRunFailed", "500"),
        ("c-slow", "False", "LastRunFailed", "timedOut"),
        ("d-job", "True", "LastRunSucceeded", "for gone"),
        ("e-other-team", "True", "Valid", "runs before"),
        ("f-local", "False", "StandaloneOnly", "tidemark run"),
        ("g-bad-ca", "False", "InvalidSpec", "caBundle"),
        ("h-privileged", "False", "InvalidSpec", "privileged"),
    ] {
        let (s, r, m, last) = eventually(&format!("{name} {reason}"), || async {
            ready(name).await.filter(|(_, r, _, _)| r == reason)
        })
        .await;
        assert_eq!((s.as_str(), r.as_str()), (status, reason), "{name}: {m}");
        assert!(m.contains(says), "{name}: {m}");
        if reason.starts_with("LastRun") {
            assert_eq!(last["backup"], "gone", "{name}: {last}");
        }
    }
    // A new spec is judged afresh: the failure of the old one says nothing of it.
    hooks
        .patch(
            "b-ticket",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"timeout": "11s"}})),
        )
        .await
        .unwrap();
    eventually("b-ticket Valid after its change", || async {
        ready("b-ticket")
            .await
            .filter(|(s, r, _, _)| s == "True" && r == "Valid")
    })
    .await;

    // A retention pass that deletes a backup by its rules runs the hooks of its Backup
    // object first too (reason "retention"); the object stays and shows the outcome.
    let mut keep_one = policy(ns2, &weed.endpoint, None);
    keep_one.spec.retention = Some(serde_json::from_value(json!({"keepLast": 1})).unwrap());
    Api::<BackupPolicy>::namespaced(admin.clone(), ns2)
        .create(&PostParams::default(), &keep_one)
        .await
        .unwrap();
    eventually("old's data deleted by the pass", || async {
        of(&keys(&store2).await, &old).is_empty().then_some(())
    })
    .await;
    let st = serde_json::to_value(backups2.get("old").await.unwrap().status).unwrap();
    assert_eq!(st["hooks"][0]["name"], "notify", "{st}");
    assert_eq!(st["hooks"][0]["outcome"], "succeeded", "{st}");
    let last = hook_server.calls.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last.1["reason"], "retention");
    assert_eq!(last.1["backup"]["backupId"], old.id.as_str());
    // Seed 003: the hook receives the Backup object itself.
    let object = &last.1["object"];
    assert_eq!(object["kind"], "Backup", "{object}");
    assert_eq!(object["metadata"]["name"], "old", "{object}");
    assert_eq!(object["status"]["backupId"], old.id.as_str(), "{object}");
    assert!(
        object["metadata"].get("managedFields").is_none(),
        "{object}"
    );
    let keys2 = keys(&store2).await;
    let audit = audit_records(&store2, &keys2).await;
    let record = audit[0].clone();
    assert_eq!(record["hooks"][0]["backupId"], old.id.as_str(), "{record}");
    assert_eq!(
        record["hooks"][0]["hooks"][0]["outcome"], "succeeded",
        "{record}"
    );
    op.stop().await;
}

/// Deleting the newest backup (issue 18, seed 002): an explicit deletion is not retention,
/// so a Backup deleted with `deletionPolicy: Delete` takes the newest backup's data while
/// another restorable backup remains (before, it was refused as the floor and the object
/// hung Terminating); only the last restorable backup is refused, with its own condition,
/// its data whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_newest_backup_is_not_retention() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let hook_server = Webhook::start().await;
    let ns = "newest";
    cluster.namespace(ns).await;
    secret(&admin, ns).await;
    let store = weed.cluster_store(ns);
    let now = Timestamp::now();
    let (older, newest) = synth::older_and_newer(&store, "older", "newest", now)
        .await
        .unwrap();
    let before = keys(&store).await;
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &policy(ns, &weed.endpoint, Some("Delete")),
        )
        .await
        .unwrap();
    let hook: DeleteHook = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "DeleteHook",
        "metadata": {"name": "notify", "namespace": ns},
        "spec": {"webhook": {"url": format!("{}/ok", hook_server.url), "caBundle": hook_server.ca_bundle}, "timeout": "10s"},
    }))
    .unwrap();
    Api::<DeleteHook>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &hook)
        .await
        .unwrap();
    let calls = || -> Vec<serde_json::Value> {
        hook_server
            .calls
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| b.clone())
            .collect()
    };
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    for b in [&older, &newest] {
        backup_object(&backups, b, json!({})).await;
    }
    let op = Operator::start(&cluster, "operator-newest");
    for name in ["older", "newest"] {
        cleanup_finalizer(&backups, name).await;
    }
    backups
        .delete("newest", &DeleteParams::default())
        .await
        .unwrap();
    eventually("newest gone with its data", || async {
        finalizers(&backups, "newest").await.is_none().then_some(())
    })
    .await;
    let after = keys(&store).await;
    assert_eq!(of(&after, &newest), Vec::<String>::new());
    assert_eq!(of(&after, &older), of(&before, &older));
    let audit = audit_records(&store, &after).await;
    assert_eq!(audit[0]["backups"][0]["backupId"], newest.id.as_str());
    assert_eq!(
        audit[0]["backups"][0]["reasons"],
        json!(["deletionRequested"])
    );
    // `older` is now the last restorable backup: refused, saying so; the data stays.
    backups
        .delete("older", &DeleteParams::default())
        .await
        .unwrap();
    let st = eventually("older waits", || async {
        let s = serde_json::to_value(backups.get("older").await.ok()?.status).ok()?;
        s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "RemoteCleanup" && c["reason"] == "LastRestorableBackup")
            .cloned()
    })
    .await;
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("last restorable backup"),
        "{st}"
    );
    // Its data whole (beside the deletion mark a later pass acts on).
    let now_keys = of(&keys(&store).await, &older);
    for k in of(&before, &older) {
        assert!(now_keys.contains(&k), "{k} gone: {now_keys:?}");
    }
    // Seed 003: hooks run when the data goes, and only then — once for `newest`, none
    // for `older`, whose data stays.
    let seen = calls();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(seen[0]["reason"], "deletionRequested");
    assert_eq!(seen[0]["backup"]["backupId"], newest.id.as_str());
    let st = serde_json::to_value(backups.get("older").await.unwrap().status).unwrap();
    assert!(st["hooks"].as_array().is_none_or(Vec::is_empty), "{st}");
    // Another backup lands; a pass (at once after the policy's spec changes) deletes the
    // marked one now that it is not the last restorable: its hooks run then, once, with
    // the reason its deletion had, and the object goes.
    let later = SynthBackup::full("later", now - SignedDuration::from_mins(5), 7);
    synth::write_backups(&store, std::slice::from_ref(&later))
        .await
        .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retention": {"window": "90d"}}})),
        )
        .await
        .unwrap();
    eventually("older gone with its data", || async {
        finalizers(&backups, "older").await.is_none().then_some(())
    })
    .await;
    assert_eq!(of(&keys(&store).await, &older), Vec::<String>::new());
    let seen = calls();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    assert_eq!(seen[1]["reason"], "deletionRequested");
    assert_eq!(seen[1]["backup"]["backupId"], older.id.as_str());
    op.stop().await;
}

/// A retention pass and the finalizer racing on one Backup (issue 18 §5): both reach its
/// DeleteHooks at once; each hook is called exactly once, and its outcome recorded once.
/// (Before, each runner read the status before the other's outcome was written, and the
/// slow webhook was called twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_and_the_finalizer_racing_run_each_hook_once() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let hook_server = Webhook::start().await;
    let ns = "race";
    cluster.namespace(ns).await;
    secret(&admin, ns).await;
    let store = weed.cluster_store(ns);
    let now = Timestamp::now();
    let (old, _new) = synth::older_and_newer(&store, "old", "new", now)
        .await
        .unwrap();
    // A webhook that answers after 10 s: long enough for both runners to be in it.
    let hook: DeleteHook = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "DeleteHook",
        "metadata": {"name": "slow", "namespace": ns},
        "spec": {"webhook": {"url": format!("{}/slow", hook_server.url), "caBundle": hook_server.ca_bundle}, "timeout": "30s"},
    }))
    .unwrap();
    Api::<DeleteHook>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &hook)
        .await
        .unwrap();
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    backup_object(
        &backups,
        &old,
        json!({"spec": {"deletionPolicy": "Delete"}}),
    )
    .await;
    let op = Operator::start(&cluster, "operator-race");
    cleanup_finalizer(&backups, "old").await;
    // The policy (whose first pass deletes `old` by keepLast) and the deletion at once.
    let mut keep_one = policy(ns, &weed.endpoint, None);
    keep_one.spec.retention = Some(serde_json::from_value(json!({"keepLast": 1})).unwrap());
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &keep_one)
        .await
        .unwrap();
    backups
        .delete("old", &DeleteParams::default())
        .await
        .unwrap();
    eventually("old gone with its data", || async {
        (finalizers(&backups, "old").await.is_none() && of(&keys(&store).await, &old).is_empty())
            .then_some(())
    })
    .await;
    // Give a second runner time to call it too, were it going to.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let calls: Vec<serde_json::Value> = hook_server
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(path, _)| path == "/slow")
        .map(|(_, body)| body.clone())
        .collect();
    assert_eq!(calls.len(), 1, "the hook ran more than once: {calls:#?}");
    assert_eq!(calls[0]["backup"]["backupId"], old.id.as_str());
    op.stop().await;
}

/// Hooks for every deletion (issue 18 §3, issue 43 §2, seed 003): a backup whose Retain
/// Backup object was deleted (by hand, by a cascade) and whose data a retention pass then
/// deletes runs the hooks its recorded labels select — a webhook is called with the stored
/// description (`object` null); a job action runs as a Job owned by the policy, with that
/// description, and the data waits for it; the outcomes are in the audit record and the
/// policy's events. A backup no object ever made (pushed from the command line) is
/// selected by no hook. Mutation tried: the job action recorded as not run (before issue
/// 43) — no Job appeared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_run_for_backups_whose_object_is_gone() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let hook_server = Webhook::start().await;
    let ns = "orphans";
    cluster.namespace(ns).await;
    secret(&admin, ns).await;
    let store = weed.cluster_store(ns);
    let now = Timestamp::now();
    let mut orphan = SynthBackup::full("nightly", now - SignedDuration::from_hours(4), 1);
    orphan.labels = vec![
        ("tidemark.io/backup".into(), "nightly-20261124".into()),
        ("team".into(), "pay".into()),
    ];
    let mut pushed = SynthBackup::full("cli", now - SignedDuration::from_hours(3), 2);
    pushed.labels = vec![("team".into(), "pay".into())];
    let newest = SynthBackup::full("nightly", now - SignedDuration::from_hours(1), 3);
    synth::write_backups(&store, &[orphan.clone(), pushed.clone(), newest.clone()])
        .await
        .unwrap();
    let hooks: Api<DeleteHook> = Api::namespaced(admin.clone(), ns);
    for (name, action) in [
        (
            "a-ticket",
            json!({"webhook": {"url": format!("{}/ok", hook_server.url), "caBundle": hook_server.ca_bundle}, "timeout": "10s"}),
        ),
        (
            "b-job",
            json!({"job": {"spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}, "timeout": "5m"}),
        ),
    ] {
        let mut spec = action;
        spec["selector"] = json!({"matchLabels": {"team": "pay"}});
        let h: DeleteHook = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "DeleteHook",
            "metadata": {"name": name, "namespace": ns}, "spec": spec,
        }))
        .unwrap();
        hooks.create(&PostParams::default(), &h).await.unwrap();
    }
    let mut keep_one = policy(ns, &weed.endpoint, None);
    keep_one.spec.retention = Some(serde_json::from_value(json!({"keepLast": 1})).unwrap());
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &keep_one)
        .await
        .unwrap();
    let op = Operator::start(&cluster, "operator-orphans");
    // The job action runs without the Backup object: a Job owned by the policy, told
    // about the stored backup; the data waits for it (the test plays the node).
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let job = eventually("the hook's Job", || async {
        jobs.list(&ListParams::default().labels("tidemark.io/delete-hook=b-job"))
            .await
            .unwrap()
            .items
            .into_iter()
            .next()
    })
    .await;
    let owners = job.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].kind, "BackupPolicy");
    assert_eq!(owners[0].name, "db");
    let env = serde_json::to_string(&job.spec.as_ref().unwrap().template).unwrap();
    assert!(
        env.contains("TIDEMARK_BACKUP") && env.contains(&orphan.id),
        "{env}"
    );
    assert!(
        !of(&keys(&store).await, &orphan).is_empty(),
        "data kept while its Job runs"
    );
    jobs.patch_status(
        &job.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}})),
    )
    .await
    .unwrap();
    eventually("both older backups deleted", || async {
        let after = keys(&store).await;
        (of(&after, &orphan).is_empty() && of(&after, &pushed).is_empty()).then_some(())
    })
    .await;
    let calls: Vec<serde_json::Value> = hook_server
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, body)| body.clone())
        .collect();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let body = &calls[0];
    assert_eq!(body["reason"], "retention");
    assert_eq!(body["backup"]["backupId"], orphan.id.as_str(), "{body}");
    assert_eq!(body["backup"]["name"], "nightly-20261124", "{body}");
    assert_eq!(body["backup"]["labels"]["team"], "pay", "{body}");
    assert!(body["object"].is_null(), "{body}");
    let after = keys(&store).await;
    // Seed 003 on every path: the hooks are recorded in the store for deleters without
    // the cluster — names, actions and selectors, never the webhook's URL.
    let recorded = tidemark_store::state::load_hooks(&store)
        .await
        .unwrap()
        .expect("_state/hooks.json");
    let names: Vec<(&str, &str)> = recorded
        .hooks
        .iter()
        .map(|h| (h.name.as_str(), h.action.as_str()))
        .collect();
    assert_eq!(names, [("a-ticket", "webhook"), ("b-job", "job")]);
    assert_eq!(recorded.hooks[0].selector["matchLabels"]["team"], "pay");
    assert!(
        !serde_json::to_string(&recorded)
            .unwrap()
            .contains(&hook_server.url),
        "{recorded:?}"
    );
    let audit = audit_records(&store, &after).await;
    let record = audit
        .iter()
        .find(|r| r["hooks"].is_array())
        .unwrap_or_else(|| panic!("no hooks in {audit:#?}"));
    let ran = &record["hooks"][0];
    assert_eq!(ran["backupId"], orphan.id.as_str(), "{record}");
    assert_eq!(ran["objectGone"], "nightly-20261124", "{record}");
    assert_eq!(ran["hooks"][0]["name"], "a-ticket", "{record}");
    assert_eq!(ran["hooks"][0]["outcome"], "succeeded", "{record}");
    assert_eq!(ran["hooks"][1]["name"], "b-job", "{record}");
    assert_eq!(ran["hooks"][1]["outcome"], "succeeded", "{record}");
    assert_eq!(record["hooks"].as_array().unwrap().len(), 1, "{record}");
    assert!(!events(&admin, ns, "DeleteHookSucceeded").await.is_empty());
    // The hook's own status names the stored backup it ran for.
    let expected = format!("{}/{}", orphan.name, orphan.id);
    for name in ["a-ticket", "b-job"] {
        let last = eventually(&format!("{name}'s lastRun"), || async {
            let st = serde_json::to_value(hooks.get(name).await.unwrap().status).unwrap();
            (st["lastRun"]["backup"] == expected.as_str()).then_some(st)
        })
        .await;
        assert_eq!(last["lastRun"]["outcome"], "succeeded", "{last}");
    }
    op.stop().await;
}

/// Status written by its owner (issue 18 §5): the attempt's writer, the hooks' and the
/// deletion's conditions each own their fields (server-side apply, one field manager
/// each), so the attempt's writer applying a copy of the status from before the hooks ran
/// drops neither the hooks' outcomes nor the `RemoteCleanup` condition. Before, one manager
/// force-applied the whole status and such a write erased both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_status_writer_keeps_its_own_fields() {
    use tidemark_operator::status::{HOOKS_MANAGER, apply as apply_fields, backup as apply_status};
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "owners";
    cluster.namespace(ns).await;
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let b: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "b"}, "spec": {"policy": {"name": "db"}},
    }))
    .unwrap();
    let b = backups.create(&PostParams::default(), &b).await.unwrap();
    let condition = |type_: &str, reason: &str| {
        json!({"type": type_, "status": "False", "reason": reason, "message": reason,
               "lastTransitionTime": "2026-11-25T00:00:00Z"})
    };
    // The attempt completed; the copy the attempt's writer holds is this one.
    let stale: tidemark_api::crd::BackupStatus = serde_json::from_value(json!({
        "phase": "completed", "backupId": "20261125T000000Z-00000001",
        "conditions": [condition("Ready", "Completed")],
    }))
    .unwrap();
    apply_status(&backups, &b, &stale).await.unwrap();
    // Then the deletion's writers: a hook's outcome and the cleanup's condition.
    apply_fields(
        &backups,
        "b",
        HOOKS_MANAGER,
        json!({"hooks": [{"name": "h1", "outcome": "succeeded"}]}),
    )
    .await
    .unwrap();
    apply_fields(
        &backups,
        "b",
        "tidemark-operator-remotecleanup",
        json!({"conditions": [condition("RemoteCleanup", "WaitingForRetention")]}),
    )
    .await
    .unwrap();
    // The attempt's writer again, from its old copy (a retry, a stale cache).
    let mut again = stale.clone();
    again.error = None;
    again.size = Some(42);
    apply_status(&backups, &b, &again).await.unwrap();
    let st = backups.get("b").await.unwrap().status.unwrap();
    // Issue 46 §4: the status says which generation it was written for.
    assert_eq!(st.observed_generation, b.metadata.generation);
    assert_eq!(st.size, Some(42));
    assert_eq!(st.hooks.len(), 1, "{st:?}");
    assert_eq!(st.hooks[0].name, "h1");
    let types: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert!(
        types.contains(&"RemoteCleanup") && types.contains(&"Ready"),
        "{types:?}"
    );
    // And a hooks write does not drop the attempt's condition.
    apply_fields(
        &backups,
        "b",
        HOOKS_MANAGER,
        json!({"hooks": [{"name": "h1", "outcome": "succeeded"}, {"name": "h2", "outcome": "failed"}]}),
    )
    .await
    .unwrap();
    let st = backups.get("b").await.unwrap().status.unwrap();
    assert_eq!(st.hooks.len(), 2);
    assert_eq!(st.conditions.len(), 2, "{:?}", st.conditions);
}
