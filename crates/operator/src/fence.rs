//! The store's own lease (`_state/lease.json`, the one `tidemark run` holds) around every
//! deletion the operator makes: a retention pass, a finalizer's deletion. Two operator
//! leaders in a handover, two policies on one store directory, or the operator beside a
//! standalone `tidemark run` then never delete from one store at once: the second waits
//! (`Waiting`, naming the holder) and is retried.

use std::sync::Arc;
use std::time::Duration;

use tidemark_engine::EngineError;
use tidemark_store::ClusterStore;
use tidemark_store::state::{self, HeldLease, LeaseError};
use tokio::sync::{Mutex, watch};

use crate::context::Context;
use crate::error::Error;

/// How long the lease is taken for; it is renewed every third of that while the work runs.
pub const TTL: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

/// The store's lease, held by this operator until [`StoreLease::release`] (or drop).
#[derive(Debug)]
pub struct StoreLease {
    store: ClusterStore,
    held: Arc<Mutex<HeldLease>>,
    renewer: tokio::task::JoinHandle<()>,
    lost: watch::Receiver<Option<String>>,
    released: bool,
}

/// Takes `store`'s lease for this operator.
///
/// # Errors
/// Another runner holds it ([`EngineError::LeaseHeld`], class contention: retried), or
/// the store failed.
pub async fn acquire(ctx: &Context, store: &ClusterStore) -> Result<StoreLease, Error> {
    let holder = format!("operator/{}/{:08x}", ctx.identity, rand::random::<u32>());
    let held = state::acquire_lease(store, &holder, ctx.clock.now(), TTL)
        .await
        .map_err(|e| lease_error(store, e))?;
    let held = Arc::new(Mutex::new(held));
    let (tell, lost) = watch::channel(None);
    let renewer = tokio::spawn({
        let store = store.clone();
        let held = held.clone();
        let clock = ctx.clock.clone();
        async move {
            let every = Duration::try_from(TTL / 3).unwrap_or(Duration::from_secs(20));
            loop {
                tokio::time::sleep(every).await;
                let mut h = held.lock().await;
                match state::renew_lease(&store, &mut h, clock.now(), TTL).await {
                    Ok(()) => {}
                    Err(LeaseError::Held(l)) => {
                        let _ = tell.send(Some(l.describe()));
                        return;
                    }
                    // Still ours until it expires: try again at the next turn.
                    Err(LeaseError::Store(e)) => {
                        tracing::warn!("renewing the lease of {}: {e}", store.url);
                    }
                }
            }
        }
    });
    Ok(StoreLease {
        store: store.clone(),
        held,
        renewer,
        lost,
        released: false,
    })
}

impl StoreLease {
    /// Runs `work` under the lease: if the lease is lost meanwhile (this process stalled
    /// past its expiry and another runner took it), `work` is stopped and this fails.
    ///
    /// # Errors
    /// `work`'s error, or the lease lost.
    pub async fn guard<T>(
        &mut self,
        work: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let mut lost = self.lost.clone();
        let cluster = format!("{}/{}", self.store.url, self.store.cluster);
        tokio::select! {
            r = work => r,
            Ok(()) = lost.changed() => {
                let holder = lost.borrow().clone().unwrap_or_default();
                Err(Error::Engine(EngineError::LeaseLost { cluster, holder }))
            }
        }
    }

    /// Gives the lease up.
    pub async fn release(mut self) {
        self.renewer.abort();
        self.released = true;
        let held = self.held.lock().await.clone();
        state::release_lease(&self.store, &held).await;
    }
}

impl Drop for StoreLease {
    fn drop(&mut self) {
        self.renewer.abort();
        if !self.released {
            // Best effort; unreleased, it expires after TTL.
            let store = self.store.clone();
            let held = self.held.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let held = held.lock().await.clone();
                    state::release_lease(&store, &held).await;
                });
            }
        }
    }
}

fn lease_error(store: &ClusterStore, e: LeaseError) -> Error {
    match e {
        LeaseError::Held(l) => Error::Engine(EngineError::LeaseHeld {
            cluster: format!("{}/{}", store.url, store.cluster),
            holder: l.describe(),
            renewed: l.renewed_at.to_string(),
            expires: l.expires_at.to_string(),
        }),
        LeaseError::Store(s) => Error::Engine(s.into()),
    }
}
