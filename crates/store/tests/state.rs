//! `_state/run.json` against a local directory and a real S3 server (SeaweedFS on
//! 127.0.0.1): round trip, and a second writer is refused rather than overwritten.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use tidemark_core::schedule::ScheduleStatus;

use object_store::ObjectStoreExt;
use tidemark_store::fault::{FaultMode, FaultStore};
use tidemark_store::state::{self, LeaseError, StoredState};
use tidemark_store::testkit::{SeaweedFs, local_store};
use tidemark_store::{ClusterStore, StoreError};

async fn round_trip_and_contention(store: &ClusterStore) {
    let mut first = StoredState::load(store).await.unwrap();
    assert!(first.state.schedules.is_empty());
    let status = ScheduleStatus {
        last_check_time: Some("2026-11-20T02:00:01Z".parse().unwrap()),
        last_schedule_time: Some("2026-11-20T02:00:00Z".parse().unwrap()),
        next_schedule_time: Some("2026-11-21T02:00:00Z".parse().unwrap()),
        last_handled_slot: None,
    };
    first
        .state
        .schedules
        .insert("nightly".into(), status.clone());
    first.save(store).await.unwrap();

    let mut second = StoredState::load(store).await.unwrap();
    assert_eq!(second.state.schedules["nightly"], status);

    // The first writer goes on; the second, holding a stale read, is refused.
    first.state.last_retention_run_time = Some("2026-11-20T03:00:00Z".parse().unwrap());
    first.save(store).await.unwrap();
    second.state.schedules.clear();
    let e = second.save(store).await.unwrap_err();
    assert!(matches!(e, StoreError::StateContention { .. }), "{e}");
    assert!(e.to_string().contains("another `tidemark run`"), "{e}");

    // A fresh writer that never read it cannot create it over the existing one either.
    let reread = StoredState::load(store).await.unwrap();
    assert_eq!(reread.state.schedules["nightly"], status);
    assert!(reread.state.last_retention_run_time.is_some());
}

/// A write that fails leaves the state as it was; one whose answer was lost after it took
/// effect is found out by reading again — either way the next write is not refused as a
/// stale one (the slot-losing defect).
async fn writes_advance_only_when_known(store: &ClusterStore) {
    let mut s = StoredState::load(store).await.unwrap();
    s.save(store).await.unwrap();
    let base = s.state.clone();
    let probe = |t: &str| {
        let mut next = base.clone();
        next.last_retention_run_time = Some(t.parse().unwrap());
        next
    };
    // The write fails before it reaches the store: nothing advances.
    let failing = Arc::new(FaultStore::new(
        Arc::clone(store.object_store()),
        FaultMode::Once(0),
    ));
    let broken = store.map_inner(|_| failing);
    let before = s.state.clone();
    let next = probe("2026-11-20T04:00:00Z");
    assert!(s.save_as(&broken, next).await.is_err());
    assert_eq!(s.state, before);
    // The write takes effect but its answer is lost: the state is what was written.
    let losing = Arc::new(FaultStore::new(
        Arc::clone(store.object_store()),
        FaultMode::LoseAnswer(0),
    ));
    let lossy = store.map_inner(|_| losing);
    let next = probe("2026-11-20T05:00:00Z");
    s.save_as(&lossy, next.clone()).await.unwrap();
    assert_eq!(s.state, next);
    // And the next write goes through (its version is the one in the store).
    let after = probe("2026-11-20T06:00:00Z");
    s.save_as(store, after.clone()).await.unwrap();
    assert_eq!(StoredState::load(store).await.unwrap().state, after);
}

/// `_state/lease.json`: a second runner is refused, naming the first; a lease runs out;
/// a holder on this machine whose process is gone is replaced at once.
async fn lease(store: &ClusterStore) {
    let now: jiff::Timestamp = "2026-11-20T02:00:00Z".parse().unwrap();
    let ttl = jiff::SignedDuration::from_secs(60);
    let mut a = state::acquire_lease(store, "runner-a", now, ttl)
        .await
        .unwrap();
    let e = state::acquire_lease(store, "runner-b", now, ttl)
        .await
        .unwrap_err();
    let LeaseError::Held(held) = &e else {
        panic!("{e}")
    };
    assert_eq!(held.holder, "runner-a");
    assert!(e.to_string().contains("runner-a"), "{e}");
    // Renewed, it stays A's past the first expiry.
    state::renew_lease(store, &mut a, now + ttl / 2, ttl)
        .await
        .unwrap();
    assert!(matches!(
        state::acquire_lease(store, "runner-b", now + ttl, ttl).await,
        Err(LeaseError::Held(_))
    ));
    // Not renewed, it runs out: B takes it, and A finds out at its next renewal.
    let later = now + ttl * 3;
    let b = state::acquire_lease(store, "runner-b", later, ttl)
        .await
        .unwrap();
    assert!(matches!(
        state::renew_lease(store, &mut a, later, ttl).await,
        Err(LeaseError::Held(_))
    ));
    state::release_lease(store, &b).await;
    // A runner of this machine killed with its lease: a restart takes it over at once.
    let dead = serde_json::json!({
        "formatVersion": 1, "holder": "killed", "host": state::host_name(), "pid": 999_999_999u32,
        "processScope": state::process_scope(),
        "acquiredAt": now, "renewedAt": now, "expiresAt": now + ttl
    });
    store
        .object_store()
        .put(
            &object_store::path::Path::from("_state/lease.json"),
            serde_json::to_vec(&dead).unwrap().into(),
        )
        .await
        .unwrap();
    state::acquire_lease(store, "restarted", now, ttl)
        .await
        .unwrap();
    // The same host name in another process table (another container) is not enough.
    let elsewhere = serde_json::json!({
        "formatVersion": 1, "holder": "other-container", "host": state::host_name(),
        "pid": 999_999_999u32, "processScope": "another-boot/pid:[1]",
        "acquiredAt": now, "renewedAt": now, "expiresAt": now + ttl
    });
    store
        .object_store()
        .put(
            &object_store::path::Path::from("_state/lease.json"),
            serde_json::to_vec(&elsewhere).unwrap().into(),
        )
        .await
        .unwrap();
    assert!(matches!(
        state::acquire_lease(store, "restarted-again", now, ttl).await,
        Err(LeaseError::Held(_))
    ));
}

fn owner(kind: &str, ns: Option<&str>, name: &str, uid: Option<&str>) -> state::Owner {
    state::Owner {
        format_version: state::STATE_FORMAT_VERSION,
        kind: kind.into(),
        namespace: ns.map(str::to_owned),
        name: name.into(),
        uid: uid.map(str::to_owned),
        host: None,
        since: "2026-11-24T00:00:00Z".parse().unwrap(),
        extra: Default::default(),
    }
}

/// One directory, one owner: the first claim wins (a conditional create); the same owner
/// again, or the same policy created anew (a new uid), goes on; anyone else is refused,
/// named.
async fn owners(store: &ClusterStore) {
    let a = owner("BackupPolicy", Some("team-a"), "db", Some("uid-1"));
    state::claim_owner(store, &a).await.unwrap();
    state::claim_owner(store, &a).await.unwrap();
    let recreated = owner("BackupPolicy", Some("team-a"), "db", Some("uid-2"));
    state::claim_owner(store, &recreated).await.unwrap();
    for other in [
        owner("BackupPolicy", Some("team-b"), "db", Some("uid-3")),
        owner("tidemark run", None, "db", None),
    ] {
        let e = state::claim_owner(store, &other)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("belongs to BackupPolicy team-a/db (uid uid-2)"),
            "{e}"
        );
    }
}

#[tokio::test]
async fn state_on_a_local_directory() {
    let (_dir4, store4) = local_store("c4");
    owners(&store4).await;
    let (_dir, store) = local_store("c1");
    round_trip_and_contention(&store).await;
    let (_dir2, store2) = local_store("c2");
    writes_advance_only_when_known(&store2).await;
    let (_dir3, store3) = local_store("c3");
    lease(&store3).await;
}

#[test]
fn state_on_s3() {
    // The server starts outside any runtime: its readiness check runs its own.
    let server = SeaweedFs::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        round_trip_and_contention(&server.cluster_store("c1")).await;
        writes_advance_only_when_known(&server.cluster_store("c2")).await;
        lease(&server.cluster_store("c3")).await;
        owners(&server.cluster_store("c4")).await;
    });
}
