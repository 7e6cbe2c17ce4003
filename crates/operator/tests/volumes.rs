//! The PVC reaper (VolumeClaimRetention, seed 004) against a real API server, as the
//! operator's ServiceAccount. There is no kubelet: the test sets pod phases, and moves the
//! operator's clock to make the TTL (whose grammar counts days) run out.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tidemark_api::crd::VolumeClaimRetention;
use tidemark_operator::testkit::{KubeCluster, Operator, ShiftedClock, eventually};

const LAST_UNMOUNTED: &str = "tidemark.io/last-unmounted-on";

async fn claim(client: &Client, ns: &str, name: &str, app: &str, volume: Option<&str>) {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
    });
    if let Some(v) = volume {
        spec["volumeName"] = json!(v);
    }
    let c: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": spec,
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &c)
        .await
        .unwrap();
}

async fn pod(client: &Client, ns: &str, name: &str, claim: &str) {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "containers": [{"name": "db", "image": "mariadb:11.4"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
}

async fn phase(client: &Client, ns: &str, name: &str, phase: &str) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": phase}})),
        )
        .await
        .unwrap();
}

/// The claim's `last-unmounted-on` stamp, `Err` when the claim is deleted: gone, or held
/// only by Kubernetes' `pvc-protection` finalizer (whose controller does not run here).
async fn stamp(client: &Client, ns: &str, name: &str) -> Result<Option<String>, ()> {
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .map(|c| c.annotations().get(LAST_UNMOUNTED).cloned())
        .ok_or(())
}

/// Makes the reaper look again (a change in the namespace it watches).
async fn poke(client: &Client, ns: &str, pod: &str, n: u32) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch(
            pod,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"poke": n.to_string()}}})),
        )
        .await
        .unwrap();
}

async fn status(client: &Client, ns: &str, name: &str) -> serde_json::Value {
    serde_json::to_value(
        Api::<VolumeClaimRetention>::namespaced(client.clone(), ns)
            .get(name)
            .await
            .unwrap()
            .status,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_stamps_unmounted_claims_and_deletes_them_after_the_ttl() {
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "volumes";
    cluster.namespace(ns).await;
    // A volume kept on release: its claim is reported, never deleted.
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-keep"},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": "/tmp/pv-keep"},
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(admin.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    claim(&admin, ns, "data-db-0", "db", None).await;
    claim(&admin, ns, "data-db-1", "db", Some("pv-keep")).await;
    claim(&admin, ns, "data-db-2", "db", None).await;
    // Its pod is scheduled again but not running yet (Pending): stamped; once expired,
    // renewed for it (deleted, created anew empty), never mounted again.
    claim(&admin, ns, "data-db-3", "db", None).await;
    pod(&admin, ns, "db-3", "data-db-3").await;
    claim(&admin, ns, "unrelated", "web", None).await;
    claim(&admin, ns, "cache-0", "cache", None).await;
    for (p, c) in [
        ("db-0", "data-db-0"),
        ("db-1", "data-db-1"),
        ("db-2", "data-db-2"),
    ] {
        pod(&admin, ns, p, c).await;
        phase(&admin, ns, p, "Running").await;
    }
    let vcrs: Api<VolumeClaimRetention> = Api::namespaced(admin.clone(), ns);
    for (name, app, dry) in [("db", "db", false), ("cache", "cache", true)] {
        let v: VolumeClaimRetention = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "VolumeClaimRetention",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"matchLabels": {"app": app}}, "ttl": "1d", "dryRun": dry},
        }))
        .unwrap();
        vcrs.create(&PostParams::default(), &v).await.unwrap();
    }
    let clock = ShiftedClock::default();
    let op = Operator::start_with_clock(&cluster, "operator-volumes", Arc::new(clock.clone()));

    // Mounted: the pod is recorded, no stamp. The unmounted cache claim is stamped.
    eventually("pod-name on data-db-0", || async {
        let c = Api::<PersistentVolumeClaim>::namespaced(admin.clone(), ns)
            .get("data-db-0")
            .await
            .unwrap();
        (c.annotations()
            .get("tidemark.io/pod-name")
            .map(String::as_str)
            == Some("db-0"))
        .then_some(())
    })
    .await;
    assert_eq!(stamp(&admin, ns, "data-db-0").await, Ok(None));
    eventually("cache-0 stamped", || async {
        stamp(&admin, ns, "cache-0").await.unwrap()
    })
    .await;
    assert_eq!(
        stamp(&admin, ns, "unrelated").await,
        Ok(None),
        "not selected"
    );

    // Unmount: stamped. Remount: the stamp goes. Unmount again: stamped again.
    phase(&admin, ns, "db-0", "Succeeded").await;
    let first = eventually("data-db-0 stamped", || async {
        stamp(&admin, ns, "data-db-0").await.unwrap()
    })
    .await;
    assert!(first.parse::<Timestamp>().is_ok(), "{first}");
    phase(&admin, ns, "db-0", "Running").await;
    eventually("the stamp removed on remount", || async {
        stamp(&admin, ns, "data-db-0")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    phase(&admin, ns, "db-0", "Failed").await;
    phase(&admin, ns, "db-1", "Succeeded").await;
    eventually("data-db-0 and data-db-1 stamped", || async {
        (stamp(&admin, ns, "data-db-0").await.unwrap().is_some()
            && stamp(&admin, ns, "data-db-1").await.unwrap().is_some())
        .then_some(())
    })
    .await;

    // Before the TTL: nothing deleted.
    poke(&admin, ns, "db-2", 1).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(stamp(&admin, ns, "data-db-0").await.is_ok());

    // Two days later: the unmounted claim goes; the mounted one stays; the one on a
    // Retain volume is reported; the dry run reports and deletes nothing.
    // Every status.deleted a watch sees from now on: once a deletion is reported, no later
    // look may erase it (a forced write of a stale status did, a moment after).
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<serde_json::Value>::new()));
    let watch = {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let seen = seen.clone();
        let api: Api<tidemark_api::crd::VolumeClaimRetention> = Api::namespaced(admin.clone(), ns);
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(
                watcher(api, watcher::Config::default().fields("metadata.name=db"))
                    .applied_objects()
            );
            while let Some(Ok(v)) = stream.next().await {
                let s = serde_json::to_value(&v.status).unwrap_or_default();
                seen.lock().unwrap().push(s["deleted"].clone());
            }
        })
    };
    clock.set(SignedDuration::from_hours(48));
    poke(&admin, ns, "db-2", 2).await;
    eventually("data-db-0 deleted", || async {
        stamp(&admin, ns, "data-db-0").await.is_err().then_some(())
    })
    .await;
    // More looks after the deleting one (pod changes trigger them).
    for n in 3..6 {
        poke(&admin, ns, "db-2", n).await;
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    }
    let reported = json!(["data-db-0", "data-db-3"]);
    eventually("the deletion reported", || async {
        (status(&admin, ns, "db").await["deleted"] == reported).then_some(())
    })
    .await;
    watch.abort();
    let seen = seen.lock().unwrap().clone();
    let first = seen
        .iter()
        .position(|d| *d == reported)
        .expect("the watch saw the deletion reported");
    assert!(
        seen[first..].iter().all(|d| *d == reported),
        "status.deleted was erased after it was reported: {seen:?}"
    );
    let st = eventually("the Retain claim reported", || async {
        let s = status(&admin, ns, "db").await;
        (s["retainedVolumes"] == json!(["data-db-1"])).then_some(s)
    })
    .await;
    assert_eq!(st["conditions"][0]["status"], "True", "{st}");
    assert_eq!(
        stamp(&admin, ns, "data-db-1").await.map(|s| s.is_some()),
        Ok(true)
    );
    assert_eq!(
        stamp(&admin, ns, "data-db-2").await,
        Ok(None),
        "mounted: never deleted"
    );
    // The pending pod's expired claim: deleted (Kubernetes' pvc-protection finalizer,
    // whose controller does not run here, is lifted by the test), then created anew.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
    let old = claims.get("data-db-3").await.unwrap();
    assert!(old.metadata.deletion_timestamp.is_some(), "{old:?}");
    claims
        .patch(
            "data-db-3",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    eventually("data-db-3 created anew for its pending pod", || async {
        claims
            .get_opt("data-db-3")
            .await
            .unwrap()
            .filter(|c| c.uid() != old.uid())
    })
    .await;
    let dry = eventually("the dry run's report", || async {
        let s = status(&admin, ns, "cache").await;
        (s["deleted"] == json!(["cache-0"])).then_some(s)
    })
    .await;
    assert!(
        dry["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("dry run"),
        "{dry}"
    );
    assert!(
        stamp(&admin, ns, "cache-0").await.is_ok(),
        "a dry run deletes nothing"
    );
    op.stop().await;
}

/// The StatefulSet `name` with the claim template `data` and no replicas (no controller
/// runs here; the test makes its pods); its uid.
async fn statefulset(client: &Client, ns: &str, name: &str) -> String {
    let set: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "serviceName": name, "replicas": 0,
            "selector": {"matchLabels": {"set": name}},
            "template": {"metadata": {"labels": {"set": name}},
                "spec": {"containers": [{"name": "db", "image": "mariadb:11.4"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
        },
    }))
    .unwrap();
    Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &set)
        .await
        .unwrap()
        .uid()
        .unwrap()
}

/// A pod of the StatefulSet `set` (uid `set_uid`), pending on `claim`; its uid.
async fn statefulset_pod(
    client: &Client,
    ns: &str,
    name: &str,
    (set, set_uid): (&str, &str),
    claim: &str,
) -> String {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "StatefulSet", "name": set,
            "uid": set_uid, "controller": true}]},
        "spec": {
            "containers": [{"name": "db", "image": "mariadb:11.4"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &p)
        .await
        .unwrap()
        .uid()
        .unwrap()
}

/// Seed 004: an expired claim is never mounted again. A StatefulSet's pod pending on its
/// expired template claim: the claim and the pod are deleted (the StatefulSet recreates
/// both), `status.replaced` and an `ExpiredClaimReplaced` event say so; a pod recreated
/// while the old claim is still being deleted is deleted once more. A bare pod's claim,
/// and a StatefulSet pod's claim that is none of its templates' — nothing would recreate
/// them — are renewed (issue 43 §3): deleted, then created anew, empty, under the same
/// name with their labels and size, so the pending pod starts on a fresh claim. A pod that
/// starts on an expired claim the reaper keeps (a retained volume) gets
/// `ExpiredClaimMounted`. (The real StatefulSet and kubelet: the node suite's
/// `an_expired_claim_is_never_mounted_again`.) Mutation tried: the renewal not followed up
/// — no fresh claim appeared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_statefulset_pod_never_mounts_an_expired_claim() {
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "expired";
    cluster.namespace(ns).await;
    claim(&admin, ns, "data-web-0", "web", None).await;
    claim(&admin, ns, "solo-data", "web", None).await;
    // A claim on a retained volume: never deleted by the reaper, so a pod may start on it.
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-late"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": "/tmp/pv-late"}},
    }))
    .unwrap();
    Api::<PersistentVolume>::all(admin.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    claim(&admin, ns, "late-data", "web", Some("pv-late")).await;
    // A StatefulSet's pod on a claim none of its templates makes (named in its pod
    // template, say): the StatefulSet would not create it anew.
    claim(&admin, ns, "shared", "web", None).await;
    let set_uid = statefulset(&admin, ns, "web").await;
    let set = ("web", set_uid.as_str());
    let old_pod = statefulset_pod(&admin, ns, "web-0", set, "data-web-0").await;
    statefulset_pod(&admin, ns, "web-1", set, "shared").await;
    pod(&admin, ns, "solo", "solo-data").await;
    pod(&admin, ns, "late", "late-data").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
    let old_claim = claims.get("data-web-0").await.unwrap().uid().unwrap();
    let old_solo = claims.get("solo-data").await.unwrap().uid().unwrap();
    let old_shared = claims.get("shared").await.unwrap().uid().unwrap();
    let v: VolumeClaimRetention = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "VolumeClaimRetention",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "ttl": "1d"},
    }))
    .unwrap();
    Api::<VolumeClaimRetention>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &v)
        .await
        .unwrap();
    let clock = ShiftedClock::default();
    let op = Operator::start_with_clock(&cluster, "operator-expired", Arc::new(clock.clone()));
    eventually("both claims stamped", || async {
        (!stamp(&admin, ns, "data-web-0").await.ok()??.is_empty()
            && !stamp(&admin, ns, "solo-data").await.ok()??.is_empty())
        .then_some(())
    })
    .await;
    // Within the TTL: kept for their pending pods.
    poke(&admin, ns, "solo", 1).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(stamp(&admin, ns, "data-web-0").await.is_ok());

    clock.set(SignedDuration::from_hours(48));
    poke(&admin, ns, "solo", 2).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    eventually("the expired claim and its pending pod deleted", || async {
        let pod_gone = pods
            .get_opt("web-0")
            .await
            .unwrap()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
        (stamp(&admin, ns, "data-web-0").await.is_err() && pod_gone).then_some(())
    })
    .await;
    let replaced = eventually("status.replaced", || async {
        let s = status(&admin, ns, "web").await;
        s["replaced"].as_array().filter(|r| !r.is_empty()).cloned()
    })
    .await;
    assert_eq!(replaced[0]["claim"], "data-web-0", "{replaced:?}");
    assert_eq!(replaced[0]["claimUid"], old_claim.as_str(), "{replaced:?}");
    assert_eq!(replaced[0]["podUid"], old_pod.as_str(), "{replaced:?}");
    assert_eq!(replaced[0]["statefulSet"], "web", "{replaced:?}");
    let replaced_note = eventually("ExpiredClaimReplaced", || async {
        tidemark_operator::testkit::events(&admin, ns, "ExpiredClaimReplaced")
            .await
            .first()
            .and_then(|e| e.note.clone())
    })
    .await;
    assert!(
        replaced_note.contains("data-web-0")
            && replaced_note.contains("StatefulSet web")
            && replaced_note.contains("never mounted again"),
        "{replaced_note}"
    );
    // The bare pod's claim, and the StatefulSet pod's claim no template makes: nothing
    // would recreate them, so they are renewed. Deleted first (Kubernetes' pvc-protection
    // finalizer, whose controller does not run here, is what the test lifts)…
    for name in ["solo-data", "shared"] {
        eventually("the expired claim deleted", || async {
            stamp(&admin, ns, name).await.is_err().then_some(())
        })
        .await;
        if claims.get_opt(name).await.unwrap().is_some() {
            claims
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await
                .unwrap();
        }
    }
    // …then created anew, empty, with the same name, labels and size.
    let fresh = eventually("the fresh solo-data", || async {
        claims
            .get_opt("solo-data")
            .await
            .unwrap()
            .filter(|c| c.uid().as_deref() != Some(old_solo.as_str()))
    })
    .await;
    assert_eq!(
        fresh.labels().get("app").map(String::as_str),
        Some("web"),
        "{fresh:?}"
    );
    let spec = fresh.spec.clone().unwrap();
    assert!(spec.volume_name.is_none(), "{spec:?}");
    assert_eq!(
        serde_json::to_value(&spec.resources).unwrap()["requests"]["storage"],
        "1Gi"
    );
    eventually("the fresh shared", || async {
        claims
            .get_opt("shared")
            .await
            .unwrap()
            .filter(|c| c.uid().as_deref() != Some(old_shared.as_str()))
    })
    .await;
    let st = status(&admin, ns, "web").await;
    let renewed: Vec<&serde_json::Value> = st["replaced"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["renewal"].is_object())
        .collect();
    assert_eq!(renewed.len(), 2, "{st}");
    let note = tidemark_operator::testkit::events(&admin, ns, "ExpiredClaimReplaced")
        .await
        .into_iter()
        .find_map(|e| e.note.filter(|n| n.contains("solo-data")))
        .unwrap();
    assert!(
        note.contains("pending pod solo") && note.contains("anew, empty"),
        "{note}"
    );
    assert!(
        pods.get_opt("web-1").await.unwrap().is_some(),
        "its pod stays"
    );

    // The StatefulSet recreates its pod while the old claim is still being deleted (here
    // the pvc-protection finalizer keeps it so for good): that pod is deleted once more.
    let recreated = statefulset_pod(&admin, ns, "web-0", set, "data-web-0").await;
    eventually(
        "the recreated pod on a claim being deleted, deleted once more",
        || async {
            pods.get_opt("web-0")
                .await
                .unwrap()
                .is_none_or(|p| p.uid().as_deref() != Some(recreated.as_str()))
                .then_some(())
        },
    )
    .await;

    // A pod starts on an expired claim the reaper keeps (its volume is retained): said.
    phase(&admin, ns, "late", "Running").await;
    let mounted = eventually("ExpiredClaimMounted", || async {
        tidemark_operator::testkit::events(&admin, ns, "ExpiredClaimMounted")
            .await
            .first()
            .and_then(|e| e.note.clone())
    })
    .await;
    assert!(
        mounted.contains("pod late") && mounted.contains("late-data"),
        "{mounted}"
    );
    op.stop().await;
}
