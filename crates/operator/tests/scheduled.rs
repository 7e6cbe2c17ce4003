//! Seed 001 end to end: the real operator (controllers, watches, leader election) against a
//! real kube-apiserver + etcd + kube-controller-manager on 127.0.0.1, running as the
//! ServiceAccount that `deploy/rbac.yaml` binds — a verb missing there fails here.
//!
//! One control plane serves every scenario (starting one takes seconds); each scenario
//! has its own namespace.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPolicy, ScheduledBackup};
use tidemark_api::schedule::{IMMEDIATE_BACKUP_LABEL, SCHEDULED_BACKUP_LABEL};
use tidemark_operator::testkit::{KubeCluster, Operator, eventually};

async fn policy(client: &Client, ns: &str, name: &str) -> BackupPolicy {
    let api: Api<BackupPolicy> = Api::namespaced(client.clone(), ns);
    let p: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1",
        "kind": "BackupPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"objectStore": {"bucket": "unused", "endpoint": "http://127.0.0.1:9", "credentialsSecret": "unused"}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &p).await.unwrap()
}

async fn schedule(
    client: &Client,
    ns: &str,
    name: &str,
    spec: serde_json::Value,
) -> ScheduledBackup {
    let api: Api<ScheduledBackup> = Api::namespaced(client.clone(), ns);
    let s: ScheduledBackup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1",
        "kind": "ScheduledBackup",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &s).await.unwrap()
}

async fn children(client: &Client, ns: &str, schedule: &str) -> Vec<Backup> {
    let api: Api<Backup> = Api::namespaced(client.clone(), ns);
    let mut v = api
        .list(&ListParams::default().labels(&format!("{SCHEDULED_BACKUP_LABEL}={schedule}")))
        .await
        .unwrap()
        .items;
    v.sort_by_key(ResourceExt::name_any);
    v
}

/// Plays the Backup controller: marks `name` completed.
async fn complete(client: &Client, ns: &str, name: &str) {
    let api: Api<Backup> = Api::namespaced(client.clone(), ns);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "completed"}})),
    )
    .await
    .unwrap();
}

/// The schedule's `Ready` condition, once it has one.
async fn ready(client: &Client, ns: &str, name: &str) -> Option<serde_json::Value> {
    let s = status(client, ns, name).await;
    s["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
}

/// Waits until the schedule's `Ready` condition has `reason`; returns it.
async fn ready_with(client: &Client, ns: &str, name: &str, reason: &str) -> serde_json::Value {
    eventually(&format!("{name} Ready with reason {reason}"), || async {
        ready(client, ns, name)
            .await
            .filter(|c| c["reason"] == reason)
    })
    .await
}

async fn status(client: &Client, ns: &str, name: &str) -> serde_json::Value {
    let api: Api<ScheduledBackup> = Api::namespaced(client.clone(), ns);
    serde_json::to_value(api.get(name).await.unwrap().status).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_001_scheduled_backups() {
    let cluster = KubeCluster::start(true).await;
    let admin = cluster.admin_client();
    let op = Operator::start(&cluster, "operator-1");

    immediate_backup_then_adoption_after_restart(&cluster, &admin, op).await;
    let op = Operator::start(&cluster, "operator-2");
    tokio::join!(
        concurrency_guard_and_cadence(&admin),
        name_collision_is_refused_with_a_warning(&admin),
        suspend_stops_new_backups_only(&admin),
        invalid_spec_is_reported(&admin),
        forever_incrementals_are_named(&admin),
        a_policy_ttl_reaches_what_its_schedules_create(&admin),
    );
    owner_reference_modes(&admin).await;
    rbac_is_what_the_operator_can_do(&admin).await;
    op.stop().await;
}

/// `immediate: true` creates one Backup at the first evaluation; when the status patch is
/// lost (the operator restarted in between), the next operator adopts it by its label and
/// fires no second one.
async fn immediate_backup_then_adoption_after_restart(
    cluster: &KubeCluster,
    admin: &Client,
    op: Operator,
) {
    let ns = "immediate";
    cluster.namespace(ns).await;
    policy(admin, ns, "db").await;
    schedule(
        admin,
        ns,
        "nightly",
        json!({"schedule": "0 0 2 * * *", "immediate": true, "policy": {"name": "db"}, "method": "mariabackup", "target": "prefer-standby", "online": true,
               "backupLabels": {"team": "payments", "tier": "gold"}}),
    )
    .await;
    let first = eventually("the immediate Backup", || async {
        let c = children(admin, ns, "nightly").await;
        (c.len() == 1).then(|| c[0].clone())
    })
    .await;
    assert_eq!(
        first
            .labels()
            .get(IMMEDIATE_BACKUP_LABEL)
            .map(String::as_str),
        Some("true")
    );
    // The schedule's backupLabels (seed 003: what DeleteHooks select by).
    assert_eq!(
        first.labels().get("team").map(String::as_str),
        Some("payments")
    );
    assert_eq!(first.labels().get("tier").map(String::as_str), Some("gold"));
    assert!(
        first.name_any().starts_with("nightly-"),
        "{}",
        first.name_any()
    );
    // Inherited fields.
    assert_eq!(first.spec.template.policy.name, "db");
    assert_eq!(first.spec.template.method.as_deref(), Some("mariabackup"));
    assert_eq!(
        first.spec.template.target.as_deref(),
        Some("prefer-standby")
    );
    assert_eq!(first.spec.template.online, Some(true));
    let st = eventually("status after the immediate Backup", || async {
        let s = status(admin, ns, "nightly").await;
        s.get("lastScheduleTime").is_some().then_some(s)
    })
    .await;
    assert!(st.get("lastCheckTime").is_some(), "{st}");
    assert!(st.get("nextScheduleTime").is_some(), "{st}");
    // Issue 46 §4: kubectl, Argo and Flux read its health from Ready.
    let r = ready_with(admin, ns, "nightly", "Scheduled").await;
    assert_eq!(r["status"], "True", "{r}");

    // The operator stops; the status patch is "lost"; a new operator starts.
    op.stop().await;
    let api: Api<ScheduledBackup> = Api::namespaced(admin.clone(), ns);
    api.patch_status(
        "nightly",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": null})),
    )
    .await
    .unwrap();
    assert_eq!(status(admin, ns, "nightly").await, json!(null));
    let op = Operator::start(cluster, "operator-restarted");
    let st = eventually("the adopted immediate Backup in status", || async {
        let s = status(admin, ns, "nightly").await;
        s.get("lastScheduleTime").is_some().then_some(s)
    })
    .await;
    let c = children(admin, ns, "nightly").await;
    assert_eq!(c.len(), 1, "a second immediate Backup: {:?}", names(&c));
    assert_eq!(c[0].name_any(), first.name_any());
    // The adopted slot is the one in the Backup's name.
    let stamp = first.name_any().trim_start_matches("nightly-").to_owned();
    let last = st["lastScheduleTime"].as_str().unwrap().to_owned();
    // Issue 46 §4: the generation the status was written for (kstatus).
    assert_eq!(st["observedGeneration"], 1, "{st}");
    assert_eq!(
        last.replace(['-', ':', 'T', 'Z'], ""),
        stamp,
        "lastScheduleTime {last} vs name {}",
        first.name_any()
    );
    op.stop().await;
}

fn names(v: &[Backup]) -> Vec<String> {
    v.iter().map(ResourceExt::name_any).collect()
}

/// Seed 004's `backupSpec.ttl` (issue 43 §3): a BackupPolicy's `ttl` is written into each
/// Backup its schedules create when the schedule has none of its own; a schedule's own
/// wins. Mutation tried: the default not applied — the first child had no ttl.
async fn a_policy_ttl_reaches_what_its_schedules_create(admin: &Client) {
    let ns = "ttl-default";
    create_ns(admin, ns).await;
    let api: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    let p: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1",
        "kind": "BackupPolicy",
        "metadata": {"name": "db", "namespace": ns},
        "spec": {"objectStore": {"bucket": "unused", "endpoint": "http://127.0.0.1:9", "credentialsSecret": "unused"},
                 "ttl": "7d"},
    }))
    .unwrap();
    api.create(&PostParams::default(), &p).await.unwrap();
    for (name, own) in [("inherits", None), ("own", Some("2d"))] {
        let mut spec =
            json!({"schedule": "0 0 2 * * *", "immediate": true, "policy": {"name": "db"}});
        if let Some(ttl) = own {
            spec["ttl"] = json!(ttl);
        }
        schedule(admin, ns, name, spec).await;
    }
    for (name, want) in [("inherits", "7d"), ("own", "2d")] {
        let child = eventually("the immediate Backup", || async {
            children(admin, ns, name).await.into_iter().next()
        })
        .await;
        assert_eq!(child.spec.ttl.as_deref(), Some(want), "{name}");
    }
}

/// No new slot while a child is neither completed nor failed; once it completes, the
/// cadence resumes with deterministic names.
async fn concurrency_guard_and_cadence(admin: &Client) {
    let ns = "guard";
    create_ns(admin, ns).await;
    policy(admin, ns, "db").await;
    schedule(
        admin,
        ns,
        "often",
        json!({"schedule": "*/2 * * * * *", "policy": {"name": "db"}}),
    )
    .await;
    let first = eventually("the first Backup", || async {
        let c = children(admin, ns, "often").await;
        (!c.is_empty()).then(|| c[0].clone())
    })
    .await;
    assert!(first.labels().get(IMMEDIATE_BACKUP_LABEL).is_none());
    // Several slots pass while it runs: nothing new.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let c = children(admin, ns, "often").await;
    assert_eq!(names(&c), vec![first.name_any()], "overlapping backups");
    complete(admin, ns, &first.name_any()).await;
    let second = eventually("the next Backup after completion", || async {
        let c = children(admin, ns, "often").await;
        (c.len() == 2).then(|| c[1].clone())
    })
    .await;
    assert!(second.name_any() > first.name_any());
    let stamp = second.name_any().trim_start_matches("often-").to_owned();
    assert_eq!(stamp.len(), 14, "{}", second.name_any());
    // Its slot is an even second (the cron's), in UTC.
    let secs: u32 = stamp[12..].parse().unwrap();
    assert_eq!(secs % 2, 0, "{}", second.name_any());
}

/// A Backup holding the slot's name that is not labelled as ours: refused, a Warning event
/// `BackupAdoptionRefused`, the slot skipped, the next one taken; lastScheduleTime is not
/// the skipped slot.
async fn name_collision_is_refused_with_a_warning(admin: &Client) {
    let ns = "collision";
    create_ns(admin, ns).await;
    policy(admin, ns, "db").await;
    // Occupy the slots of the next 20 seconds at 5 s steps, then let the schedule start.
    let now = jiff::Timestamp::now();
    let first_slot = (now.as_second() / 5 + 2) * 5;
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    // Three consecutive slots: a late first evaluation on a loaded machine still meets one.
    let squatters: Vec<String> = (0..3)
        .map(|i| {
            let slot = jiff::Timestamp::from_second(first_slot + 5 * i).unwrap();
            format!("five-{}", slot.strftime("%Y%m%d%H%M%S"))
        })
        .collect();
    for squatter in &squatters {
        let foreign: Backup = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1",
            "kind": "Backup",
            "metadata": {"name": squatter, "namespace": ns, "labels": {"team": "someone-else"}},
            "spec": {"policy": {"name": "db"}},
        }))
        .unwrap();
        backups
            .create(&PostParams::default(), &foreign)
            .await
            .unwrap();
    }
    // Created just before the squatted slot, so that slot is the first one owed.
    let wait = first_slot - jiff::Timestamp::now().as_second() - 2;
    if wait > 0 {
        tokio::time::sleep(Duration::from_secs(wait.unsigned_abs())).await;
    }
    schedule(
        admin,
        ns,
        "five",
        json!({"schedule": "*/5 * * * * *", "policy": {"name": "db"}}),
    )
    .await;
    let events: Api<K8sEvent> = Api::namespaced(admin.clone(), ns);
    let ev = eventually("the BackupAdoptionRefused event", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("BackupAdoptionRefused"))
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let note = ev.note.clone().unwrap_or_default();
    assert!(
        squatters.iter().any(|s| note.contains(s.as_str())),
        "{ev:?}"
    );
    assert_eq!(
        ev.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("five")
    );
    // The next slot is taken by a Backup of ours.
    let ours = eventually("the Backup of the slot after the collision", || async {
        let c = children(admin, ns, "five").await;
        (!c.is_empty()).then(|| c[0].clone())
    })
    .await;
    assert!(
        !squatters.contains(&ours.name_any()),
        "{} vs {squatters:?}",
        ours.name_any()
    );
    // The squatters are untouched and still not ours.
    for squatter in &squatters {
        let s = backups.get(squatter).await.unwrap();
        assert!(s.labels().get(SCHEDULED_BACKUP_LABEL).is_none());
        assert!(s.owner_references().is_empty());
    }
    let st = status(admin, ns, "five").await;
    let last = st["lastScheduleTime"]
        .as_str()
        .unwrap()
        .replace(['-', ':', 'T', 'Z'], "");
    assert!(
        !squatters
            .iter()
            .any(|s| s.trim_start_matches("five-") == last),
        "lastScheduleTime {last} is a skipped slot"
    );
}

/// `suspend: true` creates nothing new and leaves existing Backups alone.
/// Sets the schedule `paused`'s `spec.suspend`.
async fn suspend(api: &Api<ScheduledBackup>, on: bool) {
    api.patch(
        "paused",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": on}})),
    )
    .await
    .unwrap();
}

async fn suspend_stops_new_backups_only(admin: &Client) {
    let ns = "suspend";
    create_ns(admin, ns).await;
    policy(admin, ns, "db").await;
    schedule(
        admin,
        ns,
        "paused",
        json!({"schedule": "*/2 * * * * *", "policy": {"name": "db"}}),
    )
    .await;
    let first = eventually("a first Backup", || async {
        let c = children(admin, ns, "paused").await;
        (!c.is_empty()).then(|| c[0].clone())
    })
    .await;
    let api: Api<ScheduledBackup> = Api::namespaced(admin.clone(), ns);
    suspend(&api, true).await;
    // Wait until the operator has evaluated the suspended schedule, then complete the
    // running one.
    let patched = jiff::Timestamp::now();
    eventually("an evaluation after suspend", || async {
        let s = status(admin, ns, "paused").await;
        let checked: jiff::Timestamp = s["lastCheckTime"].as_str()?.parse().ok()?;
        (checked > patched).then_some(())
    })
    .await;
    complete(admin, ns, &first.name_any()).await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    let c = children(admin, ns, "paused").await;
    assert_eq!(
        names(&c),
        vec![first.name_any()],
        "a suspended schedule created a Backup"
    );
    let r = ready_with(admin, ns, "paused", "Suspended").await;
    assert_eq!(r["status"], "True", "{r}");
    suspend(&api, false).await;
    let second = eventually("a Backup after resuming", || async {
        let c = children(admin, ns, "paused").await;
        (c.len() == 2).then(|| c[1].clone())
    })
    .await;
    // Its newest Backup failed (suspended first, so no newer one follows it): not Ready,
    // naming it and why — suspended or not.
    suspend(&api, true).await;
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    backups
        .patch_status(
            &second.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "failed", "conditions": [{
                "type": "Ready", "status": "False", "reason": "BackupFailed",
                "message": "mariabackup exited with status 1",
                "lastTransitionTime": "2026-11-30T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
    let r = ready_with(admin, ns, "paused", "LastBackupFailed").await;
    assert_eq!(r["status"], "False", "{r}");
    let said = r["message"].as_str().unwrap();
    assert!(
        said.contains(&second.name_any()) && said.contains("status 1"),
        "{said}"
    );
}

/// A spec the API server accepts (v1.20 has no CEL) but Tidemark refuses: a Warning event
/// naming the field, and no Backup.
async fn invalid_spec_is_reported(admin: &Client) {
    let ns = "invalid";
    create_ns(admin, ns).await;
    policy(admin, ns, "db").await;
    schedule(
        admin,
        ns,
        "seven-fields",
        json!({"schedule": "0 0 2 * * * 2030", "policy": {"name": "db"}}),
    )
    .await;
    let events: Api<K8sEvent> = Api::namespaced(admin.clone(), ns);
    let ev = eventually("the InvalidSpec event", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("InvalidSpec"))
    })
    .await;
    let note = ev.note.unwrap_or_default();
    assert!(note.contains("spec.schedule"), "{note}");
    assert!(children(admin, ns, "seven-fields").await.is_empty());
    let r = ready_with(admin, ns, "seven-fields", "InvalidSpec").await;
    assert_eq!(r["status"], "False", "{r}");
    assert!(
        r["message"].as_str().unwrap().contains("spec.schedule"),
        "{r}"
    );
    // Seed 001: five fields are refused, with the six-field form of what was typed (read
    // as six, "0 2 * * *" would fire at 00:00 on the 2nd of each month).
    schedule(
        admin,
        ns,
        "five-fields",
        json!({"schedule": "0 2 * * *", "policy": {"name": "db"}, "immediate": true}),
    )
    .await;
    let ev = eventually("the five-field InvalidSpec event", || async {
        tidemark_operator::testkit::events(admin, ns, "InvalidSpec")
            .await
            .into_iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("five-fields"))
    })
    .await;
    let note = ev.note.unwrap_or_default();
    assert!(
        note.contains("spec.schedule") && note.contains("did you mean \"0 0 2 * * *\"?"),
        "{note}"
    );
    assert!(children(admin, ns, "five-fields").await.is_empty());
}

/// Seed 002's forever incremental without consolidation never frees anything: the schedule
/// says so where it is accepted — `ChainsEnd=False` (`ForeverIncrementalWithoutConsolidate`)
/// and a `ChainsNeverEnd` Warning — and `True` (`FullEveryN`) once chains end.
async fn forever_incrementals_are_named(admin: &Client) {
    let ns = "forever";
    create_ns(admin, ns).await;
    policy(admin, ns, "db").await;
    schedule(
        admin,
        ns,
        "chain",
        json!({"schedule": "0 0 2 1 1 *", "policy": {"name": "db"}, "incremental": {}}),
    )
    .await;
    let chains_end = |want: &'static str| async move {
        eventually("the ChainsEnd condition", || async {
            let st = status(admin, ns, "chain").await;
            st["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "ChainsEnd" && c["status"] == want)
                .cloned()
        })
        .await
    };
    let c = chains_end("False").await;
    assert_eq!(c["reason"], "ForeverIncrementalWithoutConsolidate", "{c}");
    let message = c["message"].as_str().unwrap();
    assert!(
        message.contains("maxIncrementsPerFull") && message.contains("retention.consolidate"),
        "{message}"
    );
    eventually("the ChainsNeverEnd event", || async {
        let found = tidemark_operator::testkit::events(admin, ns, "ChainsNeverEnd").await;
        (!found.is_empty()).then_some(())
    })
    .await;
    Api::<ScheduledBackup>::namespaced(admin.clone(), ns)
        .patch(
            "chain",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"incremental": {"maxIncrementsPerFull": 6}}})),
        )
        .await
        .unwrap();
    let c = chains_end("True").await;
    assert_eq!(c["reason"], "FullEveryN", "{c}");
    // The scheduler's own status writes keep the condition.
    let st = status(admin, ns, "chain").await;
    assert!(st["lastCheckTime"].is_string(), "{st}");
    // Back to forever, then the policy consolidates: the condition follows the policy's
    // change at once (its next slot is a year away). Mutation tried: the schedule
    // controller not watching policies — the condition stayed False.
    Api::<ScheduledBackup>::namespaced(admin.clone(), ns)
        .patch(
            "chain",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"incremental": {"maxIncrementsPerFull": null}}})),
        )
        .await
        .unwrap();
    chains_end("False").await;
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retention": {"consolidate": true, "keepLast": 3}}})),
        )
        .await
        .unwrap();
    let c = chains_end("True").await;
    assert_eq!(c["reason"], "Consolidated", "{c}");
}

/// `self`: owned by the schedule, collected with it; `cluster`: owned by the BackupPolicy,
/// collected with it; `none`: outlives both. The real garbage collector cascades.
async fn owner_reference_modes(admin: &Client) {
    let ns = "owners";
    create_ns(admin, ns).await;
    policy(admin, ns, "db").await;
    for (name, mode) in [
        ("by-self", "self"),
        ("by-cluster", "cluster"),
        ("by-none", "none"),
    ] {
        schedule(
            admin,
            ns,
            name,
            json!({"schedule": "0 0 2 * * *", "immediate": true, "backupOwnerReference": mode, "policy": {"name": "db"}}),
        )
        .await;
    }
    let mut made = Vec::new();
    for (name, kind) in [
        ("by-self", Some("ScheduledBackup")),
        ("by-cluster", Some("BackupPolicy")),
        ("by-none", None),
    ] {
        let b = eventually(&format!("the Backup of {name}"), || async {
            children(admin, ns, name).await.into_iter().next()
        })
        .await;
        let owners = b.owner_references();
        match kind {
            Some(k) => {
                assert_eq!(owners.len(), 1, "{name}: {owners:?}");
                assert_eq!(owners[0].kind, k);
                assert_eq!(owners[0].controller, Some(true));
            }
            None => assert!(owners.is_empty(), "{name}: {owners:?}"),
        }
        made.push(b.name_any());
    }
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let schedules: Api<ScheduledBackup> = Api::namespaced(admin.clone(), ns);
    schedules
        .delete("by-self", &DeleteParams::background())
        .await
        .unwrap();
    schedules
        .delete("by-none", &DeleteParams::background())
        .await
        .unwrap();
    eventually(
        "the garbage collector deleting by-self's Backup",
        || async {
            backups
                .get_opt(&made[0])
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    policies
        .delete("db", &DeleteParams::background())
        .await
        .unwrap();
    eventually(
        "the garbage collector deleting by-cluster's Backup",
        || async {
            backups
                .get_opt(&made[1])
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    // `none` survives its schedule (deleted above) and the policy.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        backups.get_opt(&made[2]).await.unwrap().is_some(),
        "by-none's Backup was deleted"
    );
}

async fn create_ns(admin: &Client, name: &str) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
    )
    .await
    .unwrap();
}

/// The operator acts as the ServiceAccount `deploy/rbac.yaml` binds: without the rule that
/// lets it create Backups, a schedule creates none; with it back, the Backup appears.
async fn rbac_is_what_the_operator_can_do(admin: &Client) {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let ns = "rbac";
    create_ns(admin, ns).await;
    policy(admin, ns, "db").await;
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let full = roles.get("tidemark-operator").await.unwrap();
    let mut reduced = full.clone();
    let mut taken = 0;
    for r in reduced.rules.as_mut().unwrap() {
        if r.resources.as_deref() == Some(&["backups".to_owned()][..])
            && r.verbs.iter().any(|v| v == "create")
        {
            r.verbs.retain(|v| v != "create");
            taken += 1;
        }
    }
    assert_eq!(
        taken, 1,
        "deploy/rbac.yaml has one rule granting create on backups"
    );
    roles
        .replace("tidemark-operator", &PostParams::default(), &reduced)
        .await
        .unwrap();
    schedule(
        admin,
        ns,
        "forbidden",
        json!({"schedule": "0 0 2 * * *", "immediate": true, "policy": {"name": "db"}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        children(admin, ns, "forbidden").await.is_empty(),
        "a Backup was created without the RBAC rule"
    );
    let mut restored = roles.get("tidemark-operator").await.unwrap();
    restored.rules = full.rules.clone();
    roles
        .replace("tidemark-operator", &PostParams::default(), &restored)
        .await
        .unwrap();
    eventually("the Backup once the rule is back", || async {
        (!children(admin, ns, "forbidden").await.is_empty()).then_some(())
    })
    .await;
}
