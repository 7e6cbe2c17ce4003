//! An attempt's in-flight marker is refreshed while the attempt lives and never after:
//! an exec stream stopped mid-flight (its task aborted: the operator stopping, a lost
//! lease, `--exec-max-duration`) leaves a marker that goes stale, so the next leader's
//! fence and retention see it as what it is (issue 17 §3).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use tidemark_store::fault::{FaultMode, FaultStore};
use tidemark_store::format::BackupType;
use tidemark_store::transfer::{Attempt, AttemptSpec};
use tidemark_store::{Backend, ClusterStore};

#[tokio::test(start_paused = true)]
async fn an_aborted_attempt_stops_refreshing_its_marker() {
    let memory: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let counted = Arc::new(FaultStore::new(memory, FaultMode::Never));
    let store = ClusterStore::from_object_store(counted.clone(), "c", Backend::Memory).unwrap();
    let spec = AttemptSpec {
        backup_name: "dump".into(),
        backup_id: "20261124T224702Z-00000008".into(),
        kind: BackupType::Full,
        parent_id: None,
        method: "exec".into(),
        payload_name: "backup.bin".into(),
        started_at: "2026-11-24T22:47:02Z".parse().unwrap(),
        labels: Default::default(),
        ttl: None,
        lock_until: None,
    };
    let (began, mut begun) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn({
        let store = store.clone();
        async move {
            let _attempt = Attempt::begin(&store, &spec).await.unwrap();
            let _ = began.send(());
            std::future::pending::<()>().await;
        }
    });
    (&mut begun).await.unwrap();
    let at_begin = counted.requests();
    // While it lives, the heartbeat rewrites the marker every 30 s.
    tokio::time::sleep(Duration::from_secs(31)).await;
    let alive = counted.requests();
    assert!(alive > at_begin, "no heartbeat while the attempt lives");
    // Aborted mid-flight: its heartbeat ends with it.
    holder.abort();
    assert!(holder.await.unwrap_err().is_cancelled());
    let at_abort = counted.requests();
    tokio::time::sleep(Duration::from_secs(125)).await;
    assert_eq!(
        counted.requests(),
        at_abort,
        "the aborted attempt's heartbeat kept refreshing its marker"
    );
}
