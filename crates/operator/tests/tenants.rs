//! The operator is shared by every namespace (issue 17): one tenant's hostile object fails
//! that object alone — never the process, never another tenant's work. Against the real API
//! server (v1.20: no CEL, so the operator's own checks are what stands) and SeaweedFS.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPolicy, DeleteHook};
use tidemark_operator::testkit::{
    KubeCluster, Operator, completed_backup, events, eventually, s3_secret,
};
use tidemark_store::synth::{self, SynthBackup};
use tidemark_store::testkit::{BUCKET, SeaweedFs};

fn policy(ns: &str, name: &str, endpoint: &str, extra: serde_json::Value) -> BackupPolicy {
    let mut obj = json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": endpoint, "credentialsSecret": "s3"},
            "cluster": ns,
        },
    });
    tidemark_operator::testkit::merge(&mut obj, json!({"spec": extra}));
    serde_json::from_value(obj).unwrap()
}

async fn create_policy(client: &Client, p: &BackupPolicy) {
    Api::<BackupPolicy>::namespaced(client.clone(), &p.namespace().unwrap())
        .create(&PostParams::default(), p)
        .await
        .unwrap();
}

async fn metadata_ids(store: &tidemark_store::ClusterStore) -> Vec<String> {
    let mut ids: Vec<String> = synth::all_keys(store)
        .await
        .unwrap()
        .into_iter()
        .filter(|k| k.ends_with("/metadata.json"))
        .filter_map(|k| k.split('/').nth(1).map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

/// Durations a schema with CEL refuses reach the operator on an API server without CEL:
/// a retention interval of 70000000h (which overflowed `now + interval` and panicked the
/// process), a DeleteHook timeout as large (its Job's deadline panicked the next
/// reconcile), and an error message longer than an event's 1 KiB note. Each fails its own
/// object with the value and the accepted form; the neighbours' passes and deletions go on,
/// and the operator is still running at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_fail_their_object_not_the_operator() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let now = Timestamp::now();
    for ns in ["hostile", "hostile-hook", "good"] {
        cluster.namespace(ns).await;
        s3_secret(&admin, ns, "s3").await;
    }
    // A good tenant: two backups, keep one.
    let good = weed.cluster_store("good");
    let old = SynthBackup::full("old", now - SignedDuration::from_hours(3), 1);
    let new = SynthBackup::full("new", now - SignedDuration::from_hours(1), 2);
    synth::write_backups(&good, &[old.clone(), new.clone()])
        .await
        .unwrap();
    // The hostile tenant's policies.
    let overflow = policy(
        "hostile",
        "overflow",
        &weed.endpoint,
        json!({"retention": {"keepLast": 1}, "retentionInterval": "70000000h"}),
    );
    let zone = "Z".repeat(3000);
    let long_zone = policy(
        "hostile",
        "long-zone",
        &weed.endpoint,
        json!({"retention": {"keepLast": 1}, "timeZone": zone}),
    );
    // A hook whose timeout overflows, on a Backup deleted with its data.
    let hooked = weed.cluster_store("hostile-hook");
    let gone = SynthBackup::full("gone", now - SignedDuration::from_hours(3), 3);
    let kept = SynthBackup::full("kept", now - SignedDuration::from_hours(1), 4);
    synth::write_backups(&hooked, &[gone.clone(), kept.clone()])
        .await
        .unwrap();
    create_policy(
        &admin,
        &policy(
            "hostile-hook",
            "db",
            &weed.endpoint,
            json!({"deletionPolicy": "Delete"}),
        ),
    )
    .await;
    let hook: DeleteHook = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "DeleteHook",
        "metadata": {"name": "forever", "namespace": "hostile-hook"},
        "spec": {
            "job": {"spec": {"containers": [{"name": "c", "image": "busybox:1.36", "command": ["true"]}]}},
            "timeout": "70000000h",
        },
    }))
    .unwrap();
    Api::<DeleteHook>::namespaced(admin.clone(), "hostile-hook")
        .create(&PostParams::default(), &hook)
        .await
        .unwrap();
    let hook_backups: Api<Backup> = Api::namespaced(admin.clone(), "hostile-hook");
    completed_backup(&hook_backups, &gone, json!({})).await;
    create_policy(&admin, &overflow).await;
    create_policy(&admin, &long_zone).await;

    let op = Operator::start(&cluster, "operator-tenants");
    // The good tenant is served: its pass deletes the older backup.
    create_policy(
        &admin,
        &policy(
            "good",
            "db",
            &weed.endpoint,
            json!({"retention": {"keepLast": 1}}),
        ),
    )
    .await;
    eventually("the good tenant's pass", || async {
        (metadata_ids(&good).await == vec![new.id.clone()]).then_some(())
    })
    .await;

    // The overflowing interval: refused with the value and the bound.
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), "hostile");
    let cond = eventually("overflow refused", || async {
        let p = policies.get("overflow").await.unwrap();
        let c = p.status?.conditions.into_iter().next()?;
        (c.reason == "InvalidSpec").then_some(c)
    })
    .await;
    assert_eq!(cond.status, "False");
    assert!(
        cond.message.contains("spec.retentionInterval")
            && cond.message.contains("70000000h")
            && cond.message.contains("168h"),
        "{}",
        cond.message
    );
    // The long message still makes an event (its note cut to the API's 1 KiB).
    let note = eventually("the long-zone event", || async {
        events(&admin, "hostile", "InvalidSpec")
            .await
            .into_iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("long-zone"))
            .and_then(|e| e.note)
    })
    .await;
    assert!(
        note.len() <= 1024 && note.contains("timeZone") && note.ends_with('…'),
        "{note}"
    );

    // The hook's timeout fails the hook, not the process; the deletion goes on.
    eventually("the finalizer", || async {
        let b = hook_backups.get("gone").await.unwrap();
        b.finalizers()
            .contains(&"tidemark.io/remote-cleanup".to_owned())
            .then_some(())
    })
    .await;
    hook_backups
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    eventually("gone deleted with its data", || async {
        let object_gone = hook_backups.get_opt("gone").await.unwrap().is_none();
        (object_gone && metadata_ids(&hooked).await == vec![kept.id.clone()]).then_some(())
    })
    .await;
    let failed = events(&admin, "hostile-hook", "DeleteHookFailed").await;
    let note = failed[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("spec.timeout") && note.contains("70000000h") && note.contains("1h"),
        "{note}"
    );
    assert!(op.is_running(), "the operator stopped on a tenant's object");
    op.stop().await;
}

/// Names a spec carries are Kubernetes names before they reach a request: the schema's
/// patterns refuse a Secret or policy name that walks out of its namespace (every API
/// server version enforces them), and a ScheduledBackup whose name cannot label its
/// Backups (over 63 characters, which only CEL refuses at admission) creates none and says
/// why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_from_specs_are_checked_before_any_request() {
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "names";
    cluster.namespace(ns).await;
    let escape = policy(
        ns,
        "db",
        "http://127.0.0.1:1",
        json!({"objectStore": {"credentialsSecret": "../../team-b/secrets/store-creds"}}),
    );
    let refused = Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &escape)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("credentialsSecret") && refused.contains("should match"),
        "{refused}"
    );
    create_policy(&admin, &policy(ns, "db", "http://127.0.0.1:1", json!({}))).await;
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let walk: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "walk", "namespace": ns},
        "spec": {"policy": {"name": "../../team-b/backuppolicies/db"}},
    }))
    .unwrap();
    let refused = backups
        .create(&PostParams::default(), &walk)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("spec.policy.name"), "{refused}");

    let long = format!("{}x", "nightly-".repeat(9));
    let schedule: tidemark_api::crd::ScheduledBackup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "ScheduledBackup",
        "metadata": {"name": long, "namespace": ns},
        "spec": {"schedule": "0 0 2 * * *", "immediate": true, "policy": {"name": "db"}, "method": "exec", "command": ["true"]},
    }))
    .unwrap();
    Api::<tidemark_api::crd::ScheduledBackup>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &schedule)
        .await
        .unwrap();
    let op = Operator::start(&cluster, "operator-names");
    let note = eventually("the long schedule's InvalidSpec event", || async {
        events(&admin, ns, "InvalidSpec")
            .await
            .into_iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&long))
            .and_then(|e| e.note)
    })
    .await;
    assert!(
        note.contains("metadata.name") && note.contains("63 characters"),
        "{note}"
    );
    let made = backups
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(
        made.is_empty(),
        "{:?}",
        made.iter().map(|b| b.name_any()).collect::<Vec<_>>()
    );
    op.stop().await;
}
