//! The operator is shared by every namespace (issue 17): one tenant's hostile object fails
//! that object alone — never the process, never another tenant's work. Against the real API
//! server (v1.20: no CEL, so the operator's own checks are what stands) and SeaweedFS.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPolicy, DeleteHook};
use tidemark_operator::testkit::{
    KubeCluster, Operator, Webhook, cleanup_finalizer, completed_backup, events, eventually,
    s3_secret,
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

/// Waits until the BackupPolicy `name`'s `Ready` condition is one `ok` accepts, and gives
/// it; fails saying `what` was awaited.
async fn ready_condition(
    policies: &Api<BackupPolicy>,
    name: &str,
    what: &str,
    ok: impl Fn(&Condition) -> bool,
) -> Condition {
    eventually(what, || async {
        let c = policies
            .get(name)
            .await
            .ok()?
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        ok(&c).then_some(c)
    })
    .await
}

/// Creates the object `value` of kind `K` in `ns` as JSON, unread by `K`'s type: what a
/// newer CRD, or the looser schema of an old API server, lets a tenant write.
async fn create_raw<K>(client: &Client, ns: &str, value: serde_json::Value)
where
    K: kube::Resource<DynamicType = ()>,
{
    Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        ns,
        &kube::discovery::ApiResource::erase::<K>(&()),
    )
    .create(
        &PostParams::default(),
        &serde_json::from_value(value).unwrap(),
    )
    .await
    .unwrap();
}

/// Creates the DeleteHook `name` in `ns` with `spec`.
async fn create_hook(client: &Client, ns: &str, name: &str, spec: serde_json::Value) {
    let hook: DeleteHook = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "DeleteHook",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .unwrap();
    Api::<DeleteHook>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &hook)
        .await
        .unwrap();
}

/// A DeleteHook spec calling `path` of the test webhook server.
fn webhook(server: &Webhook, path: &str, timeout: &str) -> serde_json::Value {
    json!({"webhook": {"url": format!("{}{path}", server.url), "caBundle": server.ca_bundle}, "timeout": timeout})
}

async fn metadata_ids(store: &tidemark_store::ClusterStore) -> Vec<String> {
    synth::metadata_ids(store).await.unwrap()
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
    let (_old, new) = synth::older_and_newer(&good, "old", "new", now)
        .await
        .unwrap();
    // The hostile tenant's policies.
    let overflow = policy(
        "hostile",
        "overflow",
        &weed.endpoint,
        json!({"retention": {"keepLast": 1}, "retentionInterval": "70000000h"}),
    );
    // On an API server before 1.25 a quantity may be any value (crd::without_cel).
    let mut not_a_quantity = serde_json::to_value(policy(
        "hostile",
        "not-a-quantity",
        &weed.endpoint,
        json!({"retention": {"keepLast": 1}}),
    ))
    .unwrap();
    not_a_quantity["spec"]["resources"] =
        json!({"backup": {"limits": {"cpu": {"not": "a quantity"}}}});
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
    create_hook(&admin, "hostile-hook", "forever", json!({
            "job": {"spec": {"containers": [{"name": "c", "image": "busybox:1.36", "command": ["true"]}]}},
            "timeout": "70000000h",
        })).await;
    // A webhook whose error answer never ends: read up to its cap, not until the timeout.
    let server = Webhook::start().await;
    create_hook(
        &admin,
        "hostile-hook",
        "endless",
        webhook(&server, "/endless", "30s"),
    )
    .await;
    let hook_backups: Api<Backup> = Api::namespaced(admin.clone(), "hostile-hook");
    completed_backup(&hook_backups, &gone, json!({})).await;
    create_policy(&admin, &overflow).await;
    create_policy(&admin, &long_zone).await;
    create_raw::<BackupPolicy>(&admin, "hostile", not_a_quantity).await;

    let op = Operator::start(&cluster, "operator-tenants");
    // The good tenant is served: its pass deletes the older backup.
    create_policy(
        &admin,
        &policy(
            "good",
            "db",
            &weed.endpoint,
            json!({"retention": {"keepLast": 1}, "backupHistory": {"maxAge": "2m"}}),
        ),
    )
    .await;
    eventually("the good tenant's pass", || async {
        (metadata_ids(&good).await == vec![new.id.clone()]).then_some(())
    })
    .await;
    // A month written `m` keeps its meaning (the pass ran) and is warned about, naming both
    // readings and the unambiguous spellings.
    let note = eventually("the AmbiguousDuration event", || async {
        events(&admin, "good", "AmbiguousDuration")
            .await
            .into_iter()
            .find_map(|e| e.note)
    })
    .await;
    assert!(
        note.contains("spec.backupHistory.maxAge \"2m\" is read as 2 months of 30 days (60 days), not 2 minutes")
            && note.contains("\"2mo\""),
        "{note}"
    );

    // The overflowing interval: refused with the value and the bound.
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), "hostile");
    let cond = ready_condition(&policies, "overflow", "overflow refused", |c| {
        c.reason == "InvalidSpec"
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
    let cond = ready_condition(&policies, "not-a-quantity", "not-a-quantity refused", |c| {
        c.reason == "InvalidSpec"
    })
    .await;
    assert!(
        cond.message.contains("spec.resources.backup")
            && cond
                .message
                .contains(r#"cpu: "{\"not\":\"a quantity\"}" is not a quantity"#),
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
    cleanup_finalizer(&hook_backups, "gone").await;
    hook_backups
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    eventually("gone deleted with its data", || async {
        let object_gone = hook_backups.get_opt("gone").await.unwrap().is_none();
        (object_gone && metadata_ids(&hooked).await == vec![kept.id.clone()]).then_some(())
    })
    .await;
    // Both outcomes, as the audit record keeps them (events on one object with one reason
    // are folded into a series by the recorder).
    let mut outcomes = Vec::new();
    for key in synth::all_keys(&hooked).await.unwrap() {
        if !key.starts_with("_audit/") {
            continue;
        }
        let bytes = hooked
            .read(&object_store::path::Path::from(key.as_str()))
            .await
            .unwrap()
            .unwrap();
        let record: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        for h in record["hooks"][0]["hooks"].as_array().into_iter().flatten() {
            outcomes.push((
                h["name"].as_str().unwrap_or_default().to_owned(),
                h["outcome"].as_str().unwrap_or_default().to_owned(),
                h["message"].as_str().unwrap_or_default().to_owned(),
            ));
        }
    }
    let of = |name: &str| {
        outcomes
            .iter()
            .find(|o| o.0 == name)
            .cloned()
            .unwrap_or_default()
    };
    let (_, outcome, message) = of("forever");
    assert!(
        outcome == "failed"
            && message.contains("spec.timeout")
            && message.contains("70000000h")
            && message.contains("1h"),
        "{outcomes:?}"
    );
    let (_, outcome, message) = of("endless");
    assert!(
        outcome == "failed" && message.starts_with("HTTP 500") && message.len() < 1024,
        "{outcomes:?}"
    );
    assert!(
        events(&admin, "hostile-hook", "DeleteHookTimedOut")
            .await
            .is_empty(),
        "the endless answer was read until the timeout"
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

/// No tenant reaches data through the operator's own identity or a store only the operator
/// process can see: a `file://` store, an S3 store without a credentialsSecret (the
/// operator's environment, IRSA or pod identity would answer), a `gs://` store without
/// one (the operator's cloud identity would), and a URL
/// with a password each fail their policy with the reason, and the password is never
/// repeated in status or events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_need_the_tenants_own_credentials() {
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "stores";
    cluster.namespace(ns).await;
    s3_secret(&admin, ns, "s3").await;
    let with = |name: &str, store: serde_json::Value| {
        let mut p = policy(
            ns,
            name,
            "http://127.0.0.1:9",
            json!({"retention": {"keepLast": 1}}),
        );
        p.spec.object_store = Some(serde_json::from_value(store).unwrap());
        p
    };
    let cases = [
        (
            "local",
            json!({"url": "file:///var/lib/tidemark", "credentialsSecret": "s3"}),
            "file:// is a directory or the memory of one process",
        ),
        (
            "ambient",
            json!({"bucket": "team-b", "endpoint": "http://127.0.0.1:9"}),
            "--allow-ambient-credentials",
        ),
        (
            "gcs",
            json!({"url": "gs://team-b"}),
            "with serviceAccountKey (a service-account key file), or have the cluster admin start the operator with --allow-ambient-credentials",
        ),
        (
            "userinfo",
            json!({"url": "s3://AKIAEXAMPLE:hunter2secret@team-b/x", "endpoint": "http://127.0.0.1:9", "credentialsSecret": "s3"}),
            "carries credentials",
        ),
    ];
    for (name, store, _) in &cases {
        create_policy(&admin, &with(name, store.clone())).await;
    }
    let op = Operator::start(&cluster, "operator-stores");
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    for (name, _, expected) in &cases {
        let cond = ready_condition(&policies, name, &format!("{name} refused"), |c| {
            c.status == "False"
        })
        .await;
        assert_eq!(cond.reason, "InvalidSpec", "{name}: {cond:?}");
        assert!(cond.message.contains(expected), "{name}: {}", cond.message);
    }
    let everything = serde_json::to_string(&(
        policies
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|p| &p.status)
            .collect::<Vec<_>>(),
        events(&admin, ns, "InvalidSpec").await,
    ))
    .unwrap();
    assert!(!everything.contains("hunter2secret"), "{everything}");
    op.stop().await;
}

/// Each writer of a status list that is a map (conditions by `type`, a Backup's hooks by
/// `name`) owns its own entries on the API server the tests run (v1.20): one field
/// manager's apply never removes another's entry. v1.20 treats every list of a kind as one
/// field when it cannot build the kind's model (an int-or-string field, Kubernetes issue
/// 90902) — then the queue's `Queued` took the pass's `Ready` with it and a refused policy
/// never said why. So the server must model every kind, and the entries must stay apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writers_keep_their_own_entries_on_every_kind() {
    use kube::api::{DynamicObject, Patch, PatchParams};
    use kube::discovery::ApiResource;
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "writers";
    cluster.namespace(ns).await;
    let object = |kind: &str, spec: serde_json::Value| {
        json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": kind,
            "metadata": {"name": "x", "namespace": ns}, "spec": spec,
        })
    };
    let mut bad_resources = serde_json::to_value(policy(
        ns,
        "x",
        "http://127.0.0.1:9",
        json!({"retention": {"keepLast": 1}}),
    ))
    .unwrap();
    // A value that is no quantity is the operator's to refuse (the tenants test), not the
    // server's: on v1.20 the quantities are any value.
    bad_resources["spec"]["resources"] =
        json!({"backup": {"limits": {"cpu": {"not": "a quantity"}, "memory": 2}}});
    let condition = |type_: &str| {
        json!({"type": type_, "status": "True", "reason": "Test", "message": "m",
               "lastTransitionTime": "2026-11-28T00:00:00Z"})
    };
    let hook = |name: &str| json!({"name": name, "outcome": "succeeded"});
    // Each kind, with the map lists of its status: (field, its entry by key).
    type Entry = fn(&str) -> serde_json::Value;
    type MapLists = Vec<(&'static str, &'static str, Entry)>;
    let kinds: Vec<(ApiResource, serde_json::Value, MapLists)> = vec![
        (
            ApiResource::erase::<BackupPolicy>(&()),
            bad_resources,
            vec![("conditions", "type", condition)],
        ),
        (
            ApiResource::erase::<Backup>(&()),
            object("Backup", json!({"policy": {"name": "x"}, "type": "full"})),
            vec![("conditions", "type", condition), ("hooks", "name", hook)],
        ),
        (
            ApiResource::erase::<tidemark_api::crd::Restore>(&()),
            object(
                "Restore",
                json!({"policy": {"name": "x"}, "target": {"to": "2026-11-28T00:00:00Z"}, "into": {"claim": "data"}}),
            ),
            vec![("conditions", "type", condition)],
        ),
        (
            ApiResource::erase::<tidemark_api::crd::ScheduledBackup>(&()),
            object(
                "ScheduledBackup",
                json!({"schedule": "0 0 2 * * *", "policy": {"name": "x"}}),
            ),
            vec![],
        ),
        (
            ApiResource::erase::<tidemark_api::crd::VolumeClaimRetention>(&()),
            object(
                "VolumeClaimRetention",
                json!({"selector": {"matchLabels": {"app": "x"}}, "ttl": "1d"}),
            ),
            vec![],
        ),
        (
            ApiResource::erase::<DeleteHook>(&()),
            object(
                "DeleteHook",
                json!({"job": {"spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}}),
            ),
            vec![],
        ),
    ];
    for (resource, value, lists) in kinds {
        let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, &resource);
        api.create(
            &PostParams::default(),
            &serde_json::from_value(value).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("creating a {}: {e}", resource.kind));
        for (field, key, entry) in lists {
            let apply = |manager: &'static str, entries: Vec<serde_json::Value>| {
                let api = api.clone();
                let kind = resource.kind.clone();
                async move {
                    let patch = json!({
                        "apiVersion": "tidemark.io/v1alpha1", "kind": kind,
                        "status": if entries.is_empty() { json!({}) } else { json!({field: entries}) },
                    });
                    api.patch_status(
                        "x",
                        &PatchParams::apply(manager).force(),
                        &Patch::Apply(&patch),
                    )
                    .await
                    .unwrap()
                }
            };
            let keys = |o: &DynamicObject| -> Vec<String> {
                o.data["status"][field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| e[key].as_str().unwrap_or_default().to_owned())
                    .collect()
            };
            apply("one", vec![entry("One")]).await;
            let both = apply("two", vec![entry("Two")]).await;
            assert_eq!(keys(&both), ["One", "Two"], "{} {field}", resource.kind);
            let after = apply("two", vec![]).await;
            assert_eq!(keys(&after), ["One"], "{} {field}", resource.kind);
            // The last entry's writer removes it (the queue's `Queued` when no pass has
            // written `Ready` yet).
            let none = apply("one", vec![]).await;
            assert!(keys(&none).is_empty(), "{} {field}", resource.kind);
        }
    }
    let log = cluster.log("kube-apiserver");
    let unmodelled: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("error building openapi models"))
        .collect();
    assert!(unmodelled.is_empty(), "{unmodelled:#?}");
}

/// A CRD newer than the operator (a field this operator does not know, or a value of an
/// enum it does not know, in one tenant's objects) does not stop the watch: every tenant's
/// object is still reconciled, those included — by the fields the operator knows, and an
/// unknown value refused on its own object with the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_crd_does_not_stop_the_watch() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    // A newer Tidemark's CRDs: a new field, a new deletionPolicy and a new backup type.
    for (name, change) in [
        (
            "backuppolicies.tidemark.io",
            &(|spec: &mut serde_json::Value| {
                spec["properties"]["futureField"] = json!({"type": "string"});
                spec["properties"]["deletionPolicy"]["enum"] =
                    json!(["Retain", "Delete", "Archive"]);
            }) as &dyn Fn(&mut serde_json::Value),
        ),
        ("backups.tidemark.io", &|spec: &mut serde_json::Value| {
            spec["properties"]["type"]["enum"] = json!(["full", "incremental", "differential"]);
        }),
    ] {
        let mut crd = serde_json::to_value(crds.get(name).await.unwrap()).unwrap();
        change(&mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]);
        crds.replace(
            name,
            &PostParams::default(),
            &serde_json::from_value(crd).unwrap(),
        )
        .await
        .unwrap();
    }
    for ns in ["newer", "older"] {
        cluster.namespace(ns).await;
    }
    // An interval the operator refuses: a condition says it was looked at.
    let newer = policy(
        "newer",
        "db",
        "http://127.0.0.1:9",
        json!({"retention": {"keepLast": 1}, "retentionInterval": "0s"}),
    );
    let older = policy(
        "older",
        "db",
        "http://127.0.0.1:9",
        json!({"retention": {"keepLast": 1}, "retentionInterval": "0s"}),
    );
    let mut value = serde_json::to_value(&newer).unwrap();
    value["spec"]["futureField"] = json!("from a newer Tidemark");
    value["spec"]["deletionPolicy"] = json!("Archive");
    create_raw::<BackupPolicy>(&admin, "newer", value).await;
    create_policy(&admin, &older).await;
    // Backups of each namespace; the newer one of a type this operator does not know.
    for (ns, kind) in [("newer", "differential"), ("older", "full")] {
        let backup = json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": "b", "namespace": ns},
            "spec": {"policy": {"name": "db"}, "type": kind},
        });
        create_raw::<Backup>(&admin, ns, backup).await;
    }
    let op = Operator::start(&cluster, "operator-newer");
    for ns in ["older", "newer"] {
        let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
        let cond = eventually(&format!("{ns} reconciled"), || async {
            let p = policies.get("db").await.ok()?;
            p.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")
        })
        .await;
        assert_eq!(cond.reason, "InvalidSpec", "{ns}: {cond:?}");
        if ns == "newer" {
            assert!(
                cond.message.contains("spec.deletionPolicy: \"Archive\"")
                    && cond.message.contains("Retain, Delete"),
                "{}",
                cond.message
            );
        }
        let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
        let status = eventually(&format!("{ns}'s Backup reconciled"), || async {
            backups
                .get("b")
                .await
                .ok()?
                .status
                .filter(|s| s.phase.is_some())
        })
        .await;
        if ns == "newer" {
            assert_eq!(status.phase, Some(tidemark_api::crd::BackupPhase::Failed));
            assert!(
                status
                    .error
                    .as_deref()
                    .unwrap_or_default()
                    .contains("spec.type: \"differential\""),
                "{status:?}"
            );
        }
    }
    let stored = Api::<kube::api::DynamicObject>::namespaced_with(
        admin.clone(),
        "newer",
        &kube::discovery::ApiResource::erase::<BackupPolicy>(&()),
    )
    .get("db")
    .await
    .unwrap();
    assert_eq!(stored.data["spec"]["futureField"], "from a newer Tidemark");
    assert_eq!(stored.data["spec"]["deletionPolicy"], "Archive");
    op.stop().await;
}

/// A Backup whose store cannot be opened (its Secret missing or rotated away) waits with
/// the reason, and fails after the documented limit instead of staying pending forever
/// (which would hold its schedule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_that_cannot_reach_its_store_fails_after_the_limit() {
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "stuck";
    cluster.namespace(ns).await;
    let mut p = policy(
        ns,
        "db",
        "http://127.0.0.1:9",
        json!({"source": {"selector": {"matchLabels": {"app": "db"}}}}),
    );
    p.spec.object_store.as_mut().unwrap().credentials_secret = Some("rotated-away".into());
    create_policy(&admin, &p).await;
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let b: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "nightly", "namespace": ns},
        "spec": {"policy": {"name": "db"}},
    }))
    .unwrap();
    backups.create(&PostParams::default(), &b).await.unwrap();
    let op = Operator::start(&cluster, "operator-stuck");
    let st = eventually("blocked with the reason", || async {
        let st = backups.get("nightly").await.unwrap().status?;
        st.conditions
            .iter()
            .any(|c| c.type_ == "Blocked" && c.reason == "StoreCredentialsMissing")
            .then_some(st)
    })
    .await;
    assert!(
        st.conditions[0].message.contains("rotated-away"),
        "{:?}",
        st.conditions
    );
    op.stop().await;
    // An hour later it has failed, with the same reason.
    let later = std::sync::Arc::new(tidemark_operator::testkit::ShiftedClock::new(
        SignedDuration::from_mins(61),
    ));
    let op = Operator::start_with_clock(&cluster, "operator-stuck-later", later);
    let st = eventually("failed after the limit", || async {
        let st = backups.get("nightly").await.unwrap().status?;
        (st.phase == Some(tidemark_api::crd::BackupPhase::Failed)).then_some(st)
    })
    .await;
    let error = st.error.unwrap_or_default();
    assert!(
        error.contains("could not start within 1h") && error.contains("rotated-away"),
        "{error}"
    );
    op.stop().await;
}

/// Deletions are fenced by the store's lease (the one `tidemark run` holds): while another
/// runner holds it, the operator's pass waits (`Waiting`, naming the holder) and deletes
/// nothing; once it is released, the pass runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletions_wait_for_the_store_lease() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "fenced";
    cluster.namespace(ns).await;
    s3_secret(&admin, ns, "s3").await;
    let store = weed.cluster_store(ns);
    let now = Timestamp::now();
    let (_old, new) = synth::older_and_newer(&store, "old", "new", now)
        .await
        .unwrap();
    // A standalone `tidemark run` works on this store.
    let held = tidemark_store::state::acquire_lease(
        &store,
        "standalone-run",
        now,
        SignedDuration::from_mins(10),
    )
    .await
    .unwrap();
    create_policy(
        &admin,
        &policy(
            ns,
            "db",
            &weed.endpoint,
            json!({"retention": {"keepLast": 1}}),
        ),
    )
    .await;
    let op = Operator::start(&cluster, "operator-fenced");
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    let cond = ready_condition(&policies, "db", "the pass waits for the lease", |c| {
        c.reason == "Waiting"
    })
    .await;
    assert!(cond.message.contains("standalone-run"), "{}", cond.message);
    assert_eq!(
        metadata_ids(&store).await.len(),
        2,
        "deleted under another's lease"
    );
    tidemark_store::state::release_lease(&store, &held).await;
    eventually("the pass after the release", || async {
        (metadata_ids(&store).await == vec![new.id.clone()]).then_some(())
    })
    .await;
    // The operator gives the lease up when its pass ends (the deletions above come before
    // the pass's audit record and its end), not when the lease expires (60 s).
    tidemark_operator::testkit::eventually_within(
        "lease given up after the pass",
        std::time::Duration::from_secs(30),
        || async {
            store
                .read(&object_store::path::Path::from("_state/lease.json"))
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    op.stop().await;
}

/// On a graceful stop the leader keeps renewing its Lease while reconciles in flight
/// finish (here one waiting on a slow DeleteHook), so no successor acts beside them; it
/// releases the Lease only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_renewed_until_work_in_flight_ends() {
    use k8s_openapi::api::coordination::v1::Lease;
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let server = Webhook::start().await;
    let ns = "handover";
    cluster.namespace(ns).await;
    s3_secret(&admin, ns, "s3").await;
    let store = weed.cluster_store(ns);
    let now = Timestamp::now();
    let (gone, _kept) = synth::older_and_newer(&store, "gone", "kept", now)
        .await
        .unwrap();
    create_policy(
        &admin,
        &policy(
            ns,
            "db",
            &weed.endpoint,
            json!({"deletionPolicy": "Delete"}),
        ),
    )
    .await;
    create_hook(&admin, ns, "slow", webhook(&server, "/slow", "15s")).await;
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    completed_backup(&backups, &gone, json!({})).await;
    let op = Operator::start(&cluster, "operator-handover");
    cleanup_finalizer(&backups, "gone").await;
    backups
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the slow hook called", || async {
        server
            .calls
            .lock()
            .unwrap()
            .iter()
            .any(|(p, _)| p == "/slow")
            .then_some(())
    })
    .await;
    // Stop while the reconcile waits on the hook (10 s): the Lease keeps being renewed.
    let leases: Api<Lease> = Api::namespaced(
        admin.clone(),
        tidemark_operator::testkit::OPERATOR_NAMESPACE,
    );
    let renewed = |l: Lease| l.spec.and_then(|s| s.renew_time).map(|t| t.0);
    let at_stop = renewed(leases.get("tidemark-operator").await.unwrap());
    let stopping = tokio::spawn(op.stop());
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let lease = leases.get("tidemark-operator").await.unwrap();
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
    assert_eq!(holder.as_deref(), Some("operator-handover"));
    assert!(
        renewed(lease) > at_stop,
        "the Lease was not renewed while a reconcile was still running"
    );
    stopping.await.unwrap();
    // Released once the work ended.
    let lease = leases.get("tidemark-operator").await.unwrap();
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None);
}

/// Exec streams are bounded: with one slot, a second exec Backup waits its turn (pending,
/// `Queued`, never failed for it) and runs when the first ends; a stream that runs past the
/// maximum duration is stopped and recorded as failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_streams_queue_and_stop_at_their_limit() {
    use tidemark_operator::testkit::{ExecRequest, Kubelet, running_pod};
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    // The container's commands: `slow` writes for 4 s, `forever` never ends.
    let kubelet = Kubelet::start(std::sync::Arc::new(|r: &ExecRequest| {
        let script = match r.command.first().map(String::as_str) {
            Some("slow") => "for i in 1 2 3 4; do echo part $i; sleep 1; done",
            Some("forever") => "echo start; sleep 600",
            _ => "echo quick",
        };
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", script]);
        Some(cmd)
    }))
    .await;
    kubelet.register(&admin, "node-1").await;
    let ns = "streams";
    cluster.namespace(ns).await;
    s3_secret(&admin, ns, "s3").await;
    create_policy(
        &admin,
        &policy(
            ns,
            "db",
            &weed.endpoint,
            json!({"source": {"selector": {"matchLabels": {"app": "db"}}, "container": "db"}}),
        ),
    )
    .await;
    running_pod(&admin, ns, json!({
        "metadata": {"name": "db-0", "namespace": ns, "labels": {"app": "db", "tidemark.io/role": "primary"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "db", "image": "mariadb:11.4"}]},
    })).await;
    let op = Operator::start_with(
        &cluster,
        "operator-streams",
        std::sync::Arc::new(tidemark_engine::SystemClock),
        |o| {
            o.exec_limits.streams = 1;
            o.exec_limits.max_duration = std::time::Duration::from_secs(6);
        },
    );
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let create = |name: &'static str, command: &'static str| {
        let backups = backups.clone();
        async move {
            let b: Backup = serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"policy": {"name": "db"}, "method": "exec", "target": "primary", "command": [command]},
            }))
            .unwrap();
            backups.create(&PostParams::default(), &b).await.unwrap();
        }
    };
    let phase = |name: &'static str| {
        let backups = backups.clone();
        async move {
            backups
                .get(name)
                .await
                .unwrap()
                .status
                .and_then(|s| s.phase)
                .map(|p| format!("{p:?}"))
                .unwrap_or_default()
        }
    };
    create("first", "slow").await;
    eventually("first running", || async {
        (phase("first").await == "Running").then_some(())
    })
    .await;
    create("second", "quick").await;
    let st = eventually("second queued", || async {
        let st = backups.get("second").await.unwrap().status?;
        st.conditions
            .iter()
            .any(|c| c.reason == "Queued")
            .then_some(st)
    })
    .await;
    assert_eq!(format!("{:?}", st.phase), "Some(Pending)", "{st:?}");
    assert!(
        st.conditions[0].message.contains("at most 1 exec streams"),
        "{:?}",
        st.conditions
    );
    eventually("both completed in turn", || async {
        (phase("first").await == "Completed" && phase("second").await == "Completed").then_some(())
    })
    .await;
    // Past the maximum duration: stopped, recorded as failed.
    create("endless", "forever").await;
    let st = eventually("endless stopped", || async {
        let st = backups.get("endless").await.unwrap().status?;
        (format!("{:?}", st.phase) == "Some(Failed)").then_some(st)
    })
    .await;
    assert!(
        st.error
            .clone()
            .unwrap_or_default()
            .contains("ran longer than 6s"),
        "{st:?}"
    );
    op.stop().await;
}

/// Slow DeleteHooks do not hold the controllers' reconcile slots, nor the store's lease:
/// seventeen Backups whose deletion waits on a hook that answers after 40 s (more than the
/// 16 slots) do not keep another tenant's new Backup from being looked at, and their hooks
/// run side by side (outside the lease), right before each one's data goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_hooks_do_not_hold_the_reconcile_slots() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let server = Webhook::start().await;
    for ns in ["slow", "other"] {
        cluster.namespace(ns).await;
        s3_secret(&admin, ns, "s3").await;
        create_policy(
            &admin,
            &policy(
                ns,
                "db",
                &weed.endpoint,
                json!({"deletionPolicy": "Delete"}),
            ),
        )
        .await;
    }
    create_hook(&admin, "slow", "slower", webhook(&server, "/slower", "50s")).await;
    let slow: Api<Backup> = Api::namespaced(admin.clone(), "slow");
    let now = Timestamp::now();
    let many: Vec<SynthBackup> = (0..17)
        .map(|i| SynthBackup::full(&format!("b{i:02}"), now - SignedDuration::from_hours(2), i))
        .collect();
    // Their data is in the store (hooks run only for data that goes), and a newer backup
    // stays restorable, so that none of them is the last one.
    let newest = SynthBackup::full("newest", now - SignedDuration::from_hours(1), 100);
    let mut stored = many.clone();
    stored.push(newest);
    tidemark_store::synth::write_backups(&weed.cluster_store("slow"), &stored)
        .await
        .unwrap();
    for b in &many {
        completed_backup(&slow, b, json!({})).await;
    }
    let op = Operator::start(&cluster, "operator-slots");
    for b in &many {
        cleanup_finalizer(&slow, &b.name).await;
    }
    for b in &many {
        slow.delete(&b.name, &DeleteParams::default())
            .await
            .unwrap();
    }
    eventually("the hooks called", || async {
        (server.calls.lock().unwrap().len() >= 16).then_some(())
    })
    .await;
    // Another tenant's Backup, while every hook still waits: looked at at once.
    let other: Api<Backup> = Api::namespaced(admin.clone(), "other");
    let fresh = SynthBackup::full("fresh", now, 99);
    completed_backup(&other, &fresh, json!({})).await;
    tidemark_operator::testkit::eventually_within(
        "the other tenant's Backup reconciled while the hooks wait",
        std::time::Duration::from_secs(20),
        || async {
            other
                .get("fresh")
                .await
                .unwrap()
                .finalizers()
                .contains(&"tidemark.io/remote-cleanup".to_owned())
                .then_some(())
        },
    )
    .await;
    // All seventeen hooks run side by side, none waiting for a slot or for another's
    // hook to end (each answers after 40 s).
    tidemark_operator::testkit::eventually_within(
        "all seventeen hooks called",
        std::time::Duration::from_secs(20),
        || async { (server.calls.lock().unwrap().len() == 17).then_some(()) },
    )
    .await;
    op.stop().await;
}

/// A hold placed while a retention pass's hooks run is honoured: the pass plans again
/// after its hooks and keeps the held backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_placed_while_hooks_run_is_honoured() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let server = Webhook::start().await;
    let ns = "held";
    cluster.namespace(ns).await;
    s3_secret(&admin, ns, "s3").await;
    let store = weed.cluster_store(ns);
    let now = Timestamp::now();
    let (old, new) = synth::older_and_newer(&store, "old", "new", now)
        .await
        .unwrap();
    create_hook(&admin, ns, "slow", webhook(&server, "/slow", "20s")).await;
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    completed_backup(&backups, &old, json!({})).await;
    let op = Operator::start(&cluster, "operator-held");
    create_policy(
        &admin,
        &policy(
            ns,
            "db",
            &weed.endpoint,
            json!({"retention": {"keepLast": 1}}),
        ),
    )
    .await;
    eventually("the pass's hook called", || async {
        (!server.calls.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    // While the hook runs (10 s), the backup is put on hold.
    backups
        .patch(
            &old.name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {"tidemark.io/protect": "true"}}}),
            ),
        )
        .await
        .unwrap();
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    ready_condition(&policies, "db", "the pass ended", |c| {
        c.reason == "PassSucceeded"
    })
    .await;
    assert_eq!(
        metadata_ids(&store).await,
        {
            let mut v = vec![old.id.clone(), new.id.clone()];
            v.sort();
            v
        },
        "the held backup was deleted"
    );
    op.stop().await;
}

/// One store directory, one owner: two teams with a shared bucket and a policy named `db`
/// (the default directory is the policy's name) do not plan over each other's backups —
/// the second is refused with the owner named, and the first's backups stay whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_store_directory_one_owner() {
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    for ns in ["team-a", "team-b"] {
        cluster.namespace(ns).await;
        s3_secret(&admin, ns, "s3").await;
    }
    let store = weed.cluster_store("db");
    let now = Timestamp::now();
    let (a1, a2) = synth::older_and_newer(&store, "nightly", "nightly", now)
        .await
        .unwrap();
    // Both policies in the default directory ("db"): team A keeps two, team B one.
    let shared = |ns: &str, keep: i64| {
        let mut p = policy(
            ns,
            "db",
            &weed.endpoint,
            json!({"retention": {"keepLast": keep}}),
        );
        p.spec.cluster = None;
        p
    };
    let op = Operator::start(&cluster, "operator-owners");
    create_policy(&admin, &shared("team-a", 2)).await;
    let a: Api<BackupPolicy> = Api::namespaced(admin.clone(), "team-a");
    eventually("team A's pass", || async {
        let c = a
            .get("db")
            .await
            .unwrap()
            .status?
            .conditions
            .into_iter()
            .next()?;
        (c.reason == "PassSucceeded").then_some(())
    })
    .await;
    create_policy(&admin, &shared("team-b", 1)).await;
    let b: Api<BackupPolicy> = Api::namespaced(admin.clone(), "team-b");
    let cond = eventually("team B refused", || async {
        let c = b
            .get("db")
            .await
            .unwrap()
            .status?
            .conditions
            .into_iter()
            .next()?;
        (c.status == "False").then_some(c)
    })
    .await;
    assert!(
        cond.message.contains("belongs to BackupPolicy team-a/db")
            && cond.message.contains("spec.cluster"),
        "{}",
        cond.message
    );
    let mut both = vec![a1.id.clone(), a2.id.clone()];
    both.sort();
    assert_eq!(
        metadata_ids(&store).await,
        both,
        "team B deleted team A's backup"
    );
    op.stop().await;
}

/// A namespaced install (`tidemark rbac --namespace team-a --disable exec,jobs,archiver`,
/// `tidemark operator --namespace team-a --disable ...`): the operator, bound by Roles in
/// team-a only, serves team-a — a retention pass deletes there — and never looks at team-b,
/// whose policy keeps both backups and gets no status. What needs a right the install
/// left out is refused with the reason: an exec Backup, a Job Backup, a binlog archiver.
/// Before the operator could watch a namespace list, every watch was cluster-wide and
/// forbidden under these Roles: nothing in team-a was served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_install_serves_only_its_namespaces() {
    use tidemark_operator::rbac::{Capabilities, Install};
    let weed = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let now = Timestamp::now();
    let install = Install {
        service_account: "tidemark-scoped".into(),
        namespaces: vec!["team-a".into()],
        capabilities: Capabilities::without(&["exec".into(), "jobs".into(), "archiver".into()])
            .unwrap(),
        ..Install::default()
    };
    for ns in ["team-a", "team-b"] {
        cluster.namespace(ns).await;
    }
    cluster
        .install_rbac(&tidemark_operator::rbac::manifests(&install))
        .await;
    let mut ids = std::collections::HashMap::new();
    for ns in ["team-a", "team-b"] {
        s3_secret(&admin, ns, "s3").await;
        let store = weed.cluster_store(ns);
        let (old, new) = synth::older_and_newer(&store, "old", "new", now)
            .await
            .unwrap();
        ids.insert(ns, (old.id.clone(), new.id.clone()));
        create_policy(
            &admin,
            &policy(
                ns,
                "db",
                &weed.endpoint,
                json!({"retention": {"keepLast": 1}}),
            ),
        )
        .await;
    }
    create_policy(
        &admin,
        &policy(
            "team-a",
            "logs",
            &weed.endpoint,
            json!({"cluster": "team-a-logs", "binlogArchive": {"server": {"host": "127.0.0.1", "port": 3306, "image": "mariadb:11.4"}}}),
        ),
    )
    .await;
    let backups: Api<Backup> = Api::namespaced(admin.clone(), "team-a");
    for (name, method) in [("by-exec", "exec"), ("by-job", "mariabackup")] {
        let b: Backup = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"policy": {"name": "db"}, "method": method, "command": ["true"]},
        }))
        .unwrap();
        backups.create(&PostParams::default(), &b).await.unwrap();
    }
    let b_backup: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "untouched", "namespace": "team-b"},
        "spec": {"policy": {"name": "db"}},
    }))
    .unwrap();
    Api::<Backup>::namespaced(admin.clone(), "team-b")
        .create(&PostParams::default(), &b_backup)
        .await
        .unwrap();

    let op = Operator::start_as(
        cluster.client_as("tidemark-system", "tidemark-scoped"),
        "operator-scoped",
        std::sync::Arc::new(tidemark_engine::SystemClock),
        |o| {
            o.namespaces = install.namespaces.clone();
            o.capabilities = install.capabilities;
        },
    );
    // team-a is served: its pass deletes the older backup.
    let a_store = weed.cluster_store("team-a");
    let (old_a, new_a) = ids["team-a"].clone();
    eventually("team-a's pass", || async {
        (metadata_ids(&a_store).await == [new_a.clone()]).then_some(())
    })
    .await;
    assert!(!metadata_ids(&a_store).await.contains(&old_a));
    // What the install left out is refused, each with the reason.
    for (name, right) in [("by-exec", "--disable exec"), ("by-job", "--disable jobs")] {
        let error = eventually(&format!("{name} refused"), || async {
            let s = backups.get(name).await.ok()?.status?;
            (s.phase == Some(tidemark_api::crd::BackupPhase::Failed)).then_some(s.error?)
        })
        .await;
        assert!(error.contains(right), "{name}: {error}");
    }
    let refused = eventually("the archiver refused", || async {
        let e = events(&admin, "team-a", "BinlogArchiverFailed").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert!(
        serde_json::to_string(&refused)
            .unwrap()
            .contains("--disable archiver"),
        "{refused:?}"
    );
    // team-b was never looked at (a pass there would have run by now: team-a's did).
    let b_store = weed.cluster_store("team-b");
    let (old_b, new_b) = ids["team-b"].clone();
    let mut both = vec![old_b, new_b];
    both.sort();
    let mut left = metadata_ids(&b_store).await;
    left.sort();
    assert_eq!(left, both, "team-b's backups were planned over");
    let b_policy = Api::<BackupPolicy>::namespaced(admin.clone(), "team-b")
        .get("db")
        .await
        .unwrap();
    assert!(b_policy.status.is_none(), "{:?}", b_policy.status);
    let untouched = Api::<Backup>::namespaced(admin.clone(), "team-b")
        .get("untouched")
        .await
        .unwrap();
    assert!(untouched.status.is_none() && untouched.finalizers().is_empty());
    op.stop().await;
}

/// A server that records each request's head and refuses it (403): where a store's
/// requests went, and with what authorization.
async fn recording_server() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                record
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).into_owned());
                let _ = conn
                    .write_all(
                        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    )
                    .await;
            });
        }
    });
    (url, seen)
}

/// `gs://` and `az://` stores are reached with credentials from the tenant's own Secret,
/// never the operator's identity: a GCS service-account key (its `gcs_base_url` sends the
/// requests to a recording server, so they can only have come from the Secret's key), an
/// Azure account key (requests signed `SharedKey <the Secret's account>`), an Azure SAS
/// token (sent as its query). A Secret lacking the keys of its store's kind is refused
/// naming them; a gs:// policy without a Secret still needs --allow-ambient-credentials.
/// And a gs:// store on a GCS emulator and an az:// store on Azurite, each with the key
/// from the tenant's Secret, are passed over: Ready, the store's owner record written there
/// (a conditional create).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_and_azure_credentials_come_from_the_tenants_secret() {
    use k8s_openapi::api::core::v1::Secret;
    let gcs = tokio::task::spawn_blocking(tidemark_store::testkit::GcsEmulator::start)
        .await
        .unwrap();
    let azurite = tokio::task::spawn_blocking(tidemark_store::testkit::Azurite::start)
        .await
        .unwrap();
    let (server, seen) = recording_server().await;
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "clouds";
    cluster.namespace(ns).await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    let key = json!({
        "private_key": "", "private_key_id": "", "client_email": "tenant@example.iam",
        "gcs_base_url": server, "disable_oauth": true,
    })
    .to_string();
    for (name, data) in [
        ("gcs-key", json!({"serviceAccountKey": key})),
        (
            "az-key",
            json!({"accountName": "tenantaccount", "accountKey": "a2V5"}),
        ),
        (
            "az-sas",
            json!({"AZURE_STORAGE_ACCOUNT_NAME": "tenantaccount", "sasToken": "?sv=2024-01-01&sig=tenant-sas"}),
        ),
        (
            "gcs-emulator",
            json!({"GOOGLE_SERVICE_ACCOUNT_KEY": gcs.key()}),
        ),
        (
            "azurite",
            json!({"accountName": tidemark_store::testkit::AZURITE_ACCOUNT,
                   "accountKey": tidemark_store::testkit::AZURITE_KEY}),
        ),
        // Made for other tools: read where credentialsKeys says.
        ("gcs-other", json!({"key.json": key})),
        (
            "az-other",
            json!({"ACCOUNT": "tenantaccount", "TOKEN": "?sv=2024-01-01&sig=renamed-sas"}),
        ),
        // An account name that would make another host of the request.
        (
            "az-hostile",
            json!({"accountName": "evil.example/x#", "accountKey": "a2V5"}),
        ),
    ] {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns,
                         "labels": {tidemark_operator::stores::POLICY_SECRET_LABEL: "true"}},
            "stringData": data,
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let with = |name: &str, store: serde_json::Value| {
        let mut p = policy(
            ns,
            name,
            "http://127.0.0.1:9",
            json!({"retention": {"keepLast": 1}}),
        );
        p.spec.object_store = Some(serde_json::from_value(store).unwrap());
        p
    };
    let az_endpoint = format!("{server}/tenantaccount");
    let cases = [
        (
            "gcs",
            json!({"url": "gs://tenant-bucket/db", "credentialsSecret": "gcs-key"}),
        ),
        (
            "azure",
            json!({"url": "az://keyed", "endpoint": az_endpoint, "credentialsSecret": "az-key"}),
        ),
        (
            "sas",
            json!({"url": "az://signed", "endpoint": az_endpoint, "credentialsSecret": "az-sas"}),
        ),
        (
            "wrong-kind",
            json!({"url": "gs://tenant-bucket/x", "credentialsSecret": "az-key"}),
        ),
        (
            "gcs-renamed",
            json!({"url": "gs://tenant-bucket/renamed", "credentialsSecret": "gcs-other",
                   "credentialsKeys": {"serviceAccountKey": "key.json"}}),
        ),
        (
            "sas-renamed",
            json!({"url": "az://renamed", "endpoint": az_endpoint, "credentialsSecret": "az-other",
                   "credentialsKeys": {"accountName": "ACCOUNT", "sasToken": "TOKEN"}}),
        ),
        (
            "az-hostile",
            json!({"url": "az://hostile", "credentialsSecret": "az-hostile"}),
        ),
        ("ambient", json!({"url": "gs://tenant-bucket/y"})),
        (
            "gcs-real",
            json!({"url": format!("{}/db", gcs.url()), "credentialsSecret": "gcs-emulator"}),
        ),
        (
            "azure-real",
            json!({"url": format!("{}/db", azurite.url()), "endpoint": azurite.endpoint,
                   "credentialsSecret": "azurite"}),
        ),
    ];
    for (name, store) in &cases {
        create_policy(&admin, &with(name, store.clone())).await;
    }
    let op = Operator::start(&cluster, "operator-clouds");
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    let condition = |name: &'static str| {
        let policies = policies.clone();
        async move {
            ready_condition(&policies, name, &format!("{name} looked at"), |c| {
                c.status == "False"
            })
            .await
        }
    };
    // The emulators: passed over, the owner record in the bucket where the key sends it.
    for (name, url, options) in [
        ("gcs-real", gcs.url(), gcs.options()),
        ("azure-real", azurite.url(), azurite.options()),
    ] {
        // (Its pass may wait for a turn first: `Queued` comes and goes beside `Ready`.)
        let ready = ready_condition(&policies, name, &format!("{name} ready"), |c| {
            c.status == "True"
        })
        .await;
        assert_eq!(ready.type_, "Ready", "{name}: {ready:?}");
        let on_server =
            tidemark_store::ClusterStore::open(&format!("{url}/db"), ns, &options).unwrap();
        let keys = tidemark_store::synth::all_keys(&on_server).await.unwrap();
        assert!(
            keys.iter().any(|k| k == "_state/owner.json"),
            "{name}: no owner record on the emulator: {keys:?}"
        );
    }
    // Reached, with the Secret's credentials, and refused by the server.
    for name in ["gcs", "azure", "sas", "gcs-renamed", "sas-renamed"] {
        let c = condition(name).await;
        assert_eq!(c.reason, "StoreAccessDenied", "{name}: {c:?}");
    }
    let heads = seen.lock().unwrap().clone();
    let any = |f: &dyn Fn(&str) -> bool| heads.iter().any(|h| f(h));
    assert!(
        // object_store percent-encodes the bucket's `-` in the path.
        any(&|h| h.contains("/tenant-bucket/") || h.contains("/tenant%2Dbucket/")),
        "no GCS request reached the key's base URL: {heads:#?}"
    );
    assert!(
        any(&|h| h.contains("/tenantaccount/keyed")
            && h.to_ascii_lowercase()
                .contains("authorization: sharedkey tenantaccount:")),
        "no Azure request signed with the Secret's account: {heads:#?}"
    );
    assert!(
        any(&|h| h.contains("/tenantaccount/signed") && h.contains("sig=tenant-sas")),
        "no Azure request with the Secret's SAS token: {heads:#?}"
    );
    assert!(
        any(&|h| h.contains("/tenantaccount/renamed") && h.contains("sig=renamed-sas")),
        "no Azure request with the renamed keys' SAS token: {heads:#?}"
    );
    assert!(
        any(&|h| h.contains("renamed")
            && (h.contains("/tenant-bucket/") || h.contains("/tenant%2Dbucket/"))),
        "no GCS request with the renamed key's base URL: {heads:#?}"
    );
    let c = condition("az-hostile").await;
    assert_eq!(c.reason, "InvalidSpec", "{c:?}");
    assert!(
        c.message.contains("not an Azure storage account name") && !c.message.contains("evil"),
        "{}",
        c.message
    );
    let c = condition("wrong-kind").await;
    assert_eq!(c.reason, "InvalidSpec", "{c:?}");
    assert!(
        c.message.contains("lacks serviceAccountKey"),
        "{}",
        c.message
    );
    let c = condition("ambient").await;
    assert_eq!(c.reason, "InvalidSpec", "{c:?}");
    assert!(
        c.message.contains("serviceAccountKey")
            && c.message.contains("--allow-ambient-credentials"),
        "{}",
        c.message
    );
    // No secret value is repeated in status or events.
    let everything = serde_json::to_string(&(
        policies.list(&Default::default()).await.unwrap().items,
        events(&admin, ns, "InvalidSpec").await,
    ))
    .unwrap();
    assert!(
        !everything.contains("a2V5")
            && !everything.contains("tenant-sas")
            && !everything.contains("renamed-sas"),
        "{everything}"
    );
    op.stop().await;
}

/// Issue 28 findings 2 and 5: past `--background-passes`, a due pass waits its turn and its
/// policy says so (`Queued`, removed when the turn comes); a store that lists keys without
/// end fails its own policy's pass on the budget, naming it, and the operator goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_past_the_limit_wait_and_hostile_stores_fail_on_their_budget() {
    use tidemark_store::testkit::{HostileS3, Hostility};
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let stalled = HostileS3::start(Hostility::Stalled);
    let endless = HostileS3::start(Hostility::EndlessKeys { per_page: 1000 });
    for ns in ["stalled", "endless"] {
        cluster.namespace(ns).await;
        s3_secret(&admin, ns, "s3").await;
    }
    let retention = json!({"retention": {"keepLast": 1}});
    create_policy(
        &admin,
        &policy("stalled", "db", &stalled.endpoint, retention.clone()),
    )
    .await;
    let op = Operator::start_with(
        &cluster,
        "operator-queue",
        std::sync::Arc::new(tidemark_engine::SystemClock),
        |o| {
            o.background_passes = 1;
            // A stalled request ends at its 30 s timeout, and is not tried again.
            o.store_retry_timeout = std::time::Duration::from_secs(5);
        },
    );
    let condition = |ns: &'static str, type_: &'static str| {
        let api: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
        async move {
            api.get("db")
                .await
                .unwrap()
                .status
                .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == type_))
        }
    };
    // The stalled store's pass holds the one turn (its requests wait for an answer)…
    eventually("the stalled store asked", || async {
        (stalled.requests.load(std::sync::atomic::Ordering::Relaxed) > 0).then_some(())
    })
    .await;
    // …so the other tenant's due pass waits, and says so.
    create_policy(
        &admin,
        &policy("endless", "db", &endless.endpoint, retention),
    )
    .await;
    let queued = eventually("the second pass queued", || async {
        condition("endless", "Queued").await
    })
    .await;
    assert_eq!(queued.status, "True", "{queued:?}");
    assert_eq!(queued.reason, "WaitingForTurn", "{queued:?}");
    assert!(queued.message.contains("--background-passes"), "{queued:?}");
    // The endless store's pass fails on its budget, and its Queued condition is gone.
    let t0 = std::time::Instant::now();
    let failed = loop {
        if let Some(c) = condition("endless", "Ready")
            .await
            .filter(|c| c.status == "False" && c.message.contains("listed keys"))
        {
            break c;
        }
        if t0.elapsed() > std::time::Duration::from_secs(300) {
            let statuses = [
                condition("stalled", "Ready").await,
                condition("endless", "Ready").await,
                condition("endless", "Queued").await,
            ];
            panic!(
                "the endless store's pass did not fail on its budget: {statuses:?}; {} requests to the endless store",
                endless.requests.load(std::sync::atomic::Ordering::Relaxed)
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert!(
        failed.message.contains("over 100000 listed keys")
            && failed.message.contains("TIDEMARK_MAX_LISTED_KEYS"),
        "{failed:?}"
    );
    assert!(condition("endless", "Queued").await.is_none());
    op.stop().await;
}

/// (Issue 29) A store lease lost while the operator deletes stops the deletion: a
/// retention pass whose renewals go unanswered stops before its lease expires (and another
/// may take the store), and a finalizer whose lease another holder took stops before it
/// deletes. The stores' listings never end, so only the fence can stop them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_store_lease_stops_the_operators_deletions() {
    use tidemark_store::testkit::{HostileS3, Hostility};
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let unanswered = HostileS3::start(Hostility::LeaseLost { taken: false });
    let taken = HostileS3::start(Hostility::LeaseLost { taken: true });
    for ns in ["lease-unanswered", "lease-taken"] {
        cluster.namespace(ns).await;
        s3_secret(&admin, ns, "s3").await;
    }
    create_policy(
        &admin,
        &policy(
            "lease-unanswered",
            "db",
            &unanswered.endpoint,
            json!({"retention": {"keepLast": 1}}),
        ),
    )
    .await;
    // No retention: the finalizer is the only deleter of this store.
    create_policy(
        &admin,
        &policy(
            "lease-taken",
            "db",
            &taken.endpoint,
            json!({"deletionPolicy": "Delete"}),
        ),
    )
    .await;
    let op = Operator::start_with(
        &cluster,
        "operator-fence",
        std::sync::Arc::new(tidemark_engine::SystemClock),
        |o| {
            o.store_lease = tidemark_engine::FenceOptions::parse(Some("3s")).unwrap();
            // Only the fence may stop these listings (the budget would, much later).
            o.pass_budget.pages = 10_000_000;
        },
    );
    let backups: Api<Backup> = Api::namespaced(admin.clone(), "lease-taken");
    let gone = SynthBackup::full("gone", Timestamp::now() - SignedDuration::from_hours(1), 3);
    completed_backup(&backups, &gone, json!({})).await;
    cleanup_finalizer(&backups, "gone").await;
    backups
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), "lease-unanswered");
    let stopped = ready_condition(
        &policies,
        "db",
        "the pass stopped by its unrenewed lease",
        |c| c.message.contains("could not be renewed in time"),
    )
    .await;
    assert_eq!(stopped.status, "False", "{stopped:?}");
    assert!(
        stopped
            .message
            .contains("stopping before anything more is deleted"),
        "{stopped:?}"
    );
    let note = eventually("the finalizer stopped by the lease taken", || async {
        events(&admin, "lease-taken", "RemoteCleanupFailed")
            .await
            .into_iter()
            .filter_map(|e| e.note)
            .find(|n| n.contains("taken by elsewhere:1 (thief)"))
    })
    .await;
    assert!(
        note.contains("stopping before anything more is deleted"),
        "{note}"
    );
    // The object waits with its finalizer; nothing was deleted from either store.
    let b = backups.get("gone").await.unwrap();
    assert!(b.metadata.deletion_timestamp.is_some());
    for server in [&unanswered, &taken] {
        assert_eq!(
            server.deletes.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "deleted after the lease was lost"
        );
    }
    op.stop().await;
}
