//! `_state/run.json` against a local directory and a real S3 server (SeaweedFS on
//! 127.0.0.1): round trip, and a second writer is refused rather than overwritten.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use tidemark_core::schedule::ScheduleStatus;
use tidemark_store::state::StoredState;
use tidemark_store::testkit::{SeaweedFs, local_store};
use tidemark_store::{ClusterStore, StoreError};

async fn round_trip_and_contention(store: &ClusterStore) {
    let mut first = StoredState::load(store).await.unwrap();
    assert!(first.state.schedules.is_empty());
    let status = ScheduleStatus {
        last_check_time: Some("2026-11-20T02:00:01Z".parse().unwrap()),
        last_schedule_time: Some("2026-11-20T02:00:00Z".parse().unwrap()),
        next_schedule_time: Some("2026-11-21T02:00:00Z".parse().unwrap()),
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

#[tokio::test]
async fn state_on_a_local_directory() {
    let (_dir, store) = local_store("c1");
    round_trip_and_contention(&store).await;
}

#[test]
fn state_on_s3() {
    // The server starts outside any runtime: its readiness check runs its own.
    let server = SeaweedFs::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(round_trip_and_contention(&server.cluster_store("c1")));
}
