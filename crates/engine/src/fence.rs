//! The store's fence: `_state/lease.json`, held by whoever deletes from a cluster's store —
//! `tidemark run`, `tidemark gc` and `tidemark delete`, the operator's retention passes and
//! finalizers — so that two of them never delete from one store at once.
//!
//! A [`Fence`] is taken with a conditional create (or, once the holder let it expire, a
//! conditional update), renewed every third of its TTL, and counts as lost when another
//! holder took it or when a renewal could not be answered before the lease runs out (less a
//! margin): from then on another runner may take the store. Work run under
//! [`Fence::guard`] is stopped at that moment — dropped mid-way, which every use case
//! survives (crash safety, DESIGN.md 5.3) — so nothing is deleted by a holder that may no
//! longer hold the store.

use std::sync::Arc;
use std::time::Duration;

use jiff::SignedDuration;
use tidemark_store::state::{self, HeldLease, Lease, LeaseError};
use tidemark_store::{ClusterStore, StoreError};
use tokio::sync::{Mutex, watch};

use crate::clock::Clock;
use crate::error::{EngineError, chain};

/// The environment variable that sets the TTL of the leases this process takes.
pub const LEASE_TTL_ENV: &str = "TIDEMARK_LEASE_TTL";

/// How long a lease lasts without renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceOptions {
    ttl: SignedDuration,
}

impl Default for FenceOptions {
    fn default() -> Self {
        FenceOptions {
            ttl: FenceOptions::DEFAULT_TTL,
        }
    }
}

impl FenceOptions {
    /// A minute: a holder that died is replaced within it; a store must answer a renewal
    /// within its last twelfth.
    pub const DEFAULT_TTL: SignedDuration = SignedDuration::from_secs(60);
    /// Below 3 s the renewals (every second) would be most of a slow store's traffic.
    pub const MIN_TTL: SignedDuration = SignedDuration::from_secs(3);

    /// `TIDEMARK_LEASE_TTL` (a duration such as `60s` or `5m`, 3 s to 1 h), or the default.
    ///
    /// # Errors
    /// The variable is set to something else ([`EngineError::Input`], naming the value
    /// and the accepted form).
    pub fn from_env() -> Result<Self, EngineError> {
        Self::parse(std::env::var(LEASE_TTL_ENV).ok().as_deref())
    }

    /// Parses a TTL as [`FenceOptions::from_env`] reads it (`None`: the default).
    ///
    /// # Errors
    /// Not a duration from 3 s to 1 h.
    pub fn parse(text: Option<&str>) -> Result<Self, EngineError> {
        let field = tidemark_api::interval::LEASE_TTL;
        let ttl = field
            .parse(text)
            .map_err(|e| EngineError::Input(e.to_string()))?;
        if ttl < Self::MIN_TTL {
            return Err(EngineError::Input(format!(
                "{LEASE_TTL_ENV}={:?}: shorter than 3s; expected 3s to 1h, such as 60s or 5m",
                text.unwrap_or_default()
            )));
        }
        Ok(FenceOptions { ttl })
    }

    /// The TTL.
    pub fn ttl(self) -> SignedDuration {
        self.ttl
    }

    /// How often the lease is renewed.
    fn every(self) -> Duration {
        Duration::try_from(self.ttl / 3).unwrap_or(Duration::from_secs(20))
    }

    /// How long before its expiry a lease that could not be renewed counts as lost.
    fn margin(self) -> Duration {
        Duration::try_from(self.ttl / 12).unwrap_or(Duration::from_secs(5))
    }

    /// Until when a lease written by a request started at `asked` is surely held.
    fn valid_until(self, asked: tokio::time::Instant) -> tokio::time::Instant {
        let ttl = Duration::try_from(self.ttl).unwrap_or(Duration::ZERO);
        asked + ttl.saturating_sub(self.margin())
    }
}

/// How long [`Fence::acquire`] waits for another holder to let go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Not at all: a held lease is an error ([`EngineError::LeaseHeld`]).
    No,
    /// Up to this long.
    For(Duration),
    /// Until it is free.
    Forever,
}

/// Why a fence was lost.
#[derive(Debug, Clone)]
enum FenceLoss {
    Taken { holder: String },
    Expired { expired: String, cause: String },
}

/// The store's lease, held by this process until [`Fence::release`] (or drop) and renewed
/// meanwhile.
#[derive(Debug)]
pub struct Fence {
    store: ClusterStore,
    held: Arc<Mutex<HeldLease>>,
    renewer: tokio::task::JoinHandle<()>,
    lost: watch::Receiver<Option<FenceLoss>>,
    /// Until when (by this process's monotonic clock) the lease is surely this process's:
    /// the start of the request that last wrote it, plus its TTL, less the margin. Work
    /// under [`Fence::guard`] stops there unless a renewal moved it.
    until: watch::Receiver<tokio::time::Instant>,
    released: bool,
}

/// How long giving a lease up may take: a store that does not answer leaves it to expire.
const RELEASE_WITHIN: Duration = Duration::from_secs(5);

fn cluster_of(store: &ClusterStore) -> String {
    format!("{}/{}", store.url, store.cluster)
}

fn held_error(store: &ClusterStore, l: &Lease) -> EngineError {
    EngineError::LeaseHeld {
        cluster: cluster_of(store),
        holder: l.describe(),
        renewed: l.renewed_at.to_string(),
        expires: l.expires_at.to_string(),
    }
}

impl Fence {
    /// Takes `store`'s lease for `holder` (what it is and a random part, e.g. `tidemark
    /// gc/1f2e3d4c`: it names this process to whoever finds the lease held), waiting for
    /// another holder as `wait` says; `waiting` is told each time the lease is found held.
    ///
    /// # Errors
    /// Another holder kept it ([`EngineError::LeaseHeld`], class contention), or the store
    /// failed.
    pub async fn acquire(
        store: &ClusterStore,
        holder: &str,
        clock: Arc<dyn Clock>,
        options: FenceOptions,
        wait: Wait,
        mut waiting: impl FnMut(&Lease) + Send,
    ) -> Result<Fence, EngineError> {
        let started = tokio::time::Instant::now();
        let (held, asked) = loop {
            let asked = tokio::time::Instant::now();
            match state::acquire_lease(store, holder, clock.now(), options.ttl).await {
                Ok(held) => break (held, asked),
                Err(LeaseError::Store(e)) => return Err(e.into()),
                Err(LeaseError::Held(l)) => {
                    let left = match wait {
                        Wait::No => return Err(held_error(store, &l)),
                        Wait::For(d) => d.saturating_sub(started.elapsed()),
                        Wait::Forever => Duration::MAX,
                    };
                    if left.is_zero() {
                        return Err(held_error(store, &l));
                    }
                    waiting(&l);
                    // Until it may have expired, polled no more often than a renewal.
                    let expiry = Duration::try_from(l.expires_at.duration_since(clock.now()))
                        .unwrap_or(Duration::ZERO);
                    let poll = expiry
                        .min(options.every())
                        .max(Duration::from_millis(500))
                        .min(left);
                    tokio::time::sleep(poll).await;
                }
            }
        };
        let held = Arc::new(Mutex::new(held));
        let (tell, lost) = watch::channel(None);
        let (extend, until) = watch::channel(options.valid_until(asked));
        let renewer = tokio::spawn(renew(
            store.clone(),
            held.clone(),
            clock,
            options,
            tell,
            extend,
        ));
        Ok(Fence {
            store: store.clone(),
            held,
            renewer,
            lost,
            until,
            released: false,
        })
    }

    /// The store this fence is on.
    pub fn store(&self) -> &ClusterStore {
        &self.store
    }

    /// Whether the fence still holds: [`EngineError::LeaseLost`] or
    /// [`EngineError::LeaseExpired`] once it does not.
    ///
    /// # Errors
    /// The fence was lost.
    pub fn check(&self) -> Result<(), EngineError> {
        if let Some(l) = self.lost.borrow().clone() {
            return Err(self.error(l));
        }
        if tokio::time::Instant::now() >= *self.until.borrow() {
            return Err(self.error(FenceLoss::Expired {
                expired: "now".into(),
                cause: "no renewal was answered before the lease's end (less its margin)".into(),
            }));
        }
        Ok(())
    }

    fn error(&self, lost: FenceLoss) -> EngineError {
        let cluster = cluster_of(&self.store);
        match lost {
            FenceLoss::Taken { holder } => EngineError::LeaseLost { cluster, holder },
            FenceLoss::Expired { expired, cause } => EngineError::LeaseExpired {
                cluster,
                expired,
                cause,
            },
        }
    }

    /// Resolves when the fence is lost, with why.
    pub async fn lost(&self) -> EngineError {
        let mut lost = self.lost.clone();
        loop {
            if let Some(l) = lost.borrow_and_update().clone() {
                return self.error(l);
            }
            if lost.changed().await.is_err() {
                // The renewer ended without a word: it was aborted by release or drop,
                // after which nothing may run under this fence.
                return self.error(FenceLoss::Expired {
                    expired: String::from("now"),
                    cause: "the lease was given up".into(),
                });
            }
        }
    }

    /// Runs `work` under the fence: when the fence is lost meanwhile, `work` is dropped
    /// where it stands and this fails with why.
    ///
    /// # Guarantees
    /// `work` is polled only while the fence holds: not once it is known lost (taken by
    /// another, or a renewal not answered in time), and not past the end of the lease as
    /// last written less its margin (by this process's monotonic clock) — whatever the
    /// renewer found, a stall included. Those checks come first at every poll.
    ///
    /// # Errors
    /// `work`'s error, or the fence lost ([`EngineError::LeaseLost`],
    /// [`EngineError::LeaseExpired`]).
    pub async fn guard<T, E: From<EngineError>>(
        &self,
        work: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        tokio::pin!(work);
        let mut until = self.until.clone();
        loop {
            // First at every turn: lost, or past the end of the lease as last written (a
            // process that stalled past it finds out here before its work goes on).
            self.check()?;
            let deadline = *until.borrow_and_update();
            tokio::select! {
                biased;
                e = self.lost() => return Err(e.into()),
                _ = tokio::time::sleep_until(deadline) => {}
                _ = until.changed() => {}
                r = &mut work => return r,
            }
        }
    }

    /// Gives the lease up: best effort (unreleased, it expires after its TTL), within
    /// [`RELEASE_WITHIN`], and not at all once lost (it is not this process's any more).
    pub async fn release(mut self) {
        self.renewer.abort();
        self.released = true;
        if self.check().is_err() {
            return;
        }
        let held = self.held.lock().await.clone();
        let _ =
            tokio::time::timeout(RELEASE_WITHIN, state::release_lease(&self.store, &held)).await;
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        self.renewer.abort();
        if !self.released && self.check().is_ok() {
            let store = self.store.clone();
            let held = self.held.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let held = held.lock().await.clone();
                    let _ =
                        tokio::time::timeout(RELEASE_WITHIN, state::release_lease(&store, &held))
                            .await;
                });
            }
        }
    }
}

/// Renews the lease every third of its TTL until it is lost (then says why on `tell`);
/// each renewal moves `extend` (until when the lease is surely held).
async fn renew(
    store: ClusterStore,
    held: Arc<Mutex<HeldLease>>,
    clock: Arc<dyn Clock>,
    options: FenceOptions,
    tell: watch::Sender<Option<FenceLoss>>,
    extend: watch::Sender<tokio::time::Instant>,
) {
    let every = options.every();
    // What is left of the lease, less the margin in which it could be taken.
    let left = |lease: &HeldLease| {
        Duration::try_from(lease.lease.expires_at.duration_since(clock.now()))
            .unwrap_or(Duration::ZERO)
            .saturating_sub(options.margin())
    };
    // A slow acquisition may have left less than a renewal period.
    let mut wait = every.min(left(&*held.lock().await) / 2);
    loop {
        tokio::time::sleep(wait).await;
        let mut lease = held.lock().await;
        // A renewal must be answered before the lease runs out (less the margin): a
        // request retrying past it would let this holder work on after another took it.
        let budget = left(&lease);
        let asked = tokio::time::Instant::now();
        let renewed = tokio::time::timeout(
            budget,
            state::renew_lease(&store, &mut lease, clock.now(), options.ttl),
        )
        .await;
        let expired = |lease: &HeldLease, cause: String| FenceLoss::Expired {
            expired: lease.lease.expires_at.to_string(),
            cause,
        };
        match renewed {
            Err(_) => {
                let _ = tell.send(Some(expired(
                    &lease,
                    format!("the store did not answer within {budget:?}"),
                )));
                return;
            }
            Ok(Ok(())) => {
                let _ = extend.send(options.valid_until(asked));
                wait = every;
            }
            Ok(Err(LeaseError::Held(l))) => {
                let _ = tell.send(Some(FenceLoss::Taken {
                    holder: l.describe(),
                }));
                return;
            }
            // Gone from the store: anyone may create it now.
            Ok(Err(LeaseError::Store(StoreError::StateContention { .. }))) => {
                let _ = tell.send(Some(FenceLoss::Taken {
                    holder: "nobody: the lease was removed from the store".into(),
                }));
                return;
            }
            // Not renewed in time, it may be another's soon: lost rather than work on a
            // store this process may no longer hold.
            Ok(Err(LeaseError::Store(e))) if left(&lease).is_zero() => {
                let _ = tell.send(Some(expired(&lease, chain(&e))));
                return;
            }
            Ok(Err(LeaseError::Store(e))) => {
                tracing::warn!(
                    "could not renew the lease on {} (it is held until {}): {}",
                    cluster_of(&store),
                    lease.lease.expires_at,
                    chain(&e)
                );
                // Try again sooner, while time is left.
                wait = every.min(left(&lease) / 2);
            }
        }
    }
}

/// A fence on `store` with the default TTL, for tests.
#[cfg(test)]
pub(crate) async fn test_fence(store: &ClusterStore) -> Fence {
    Fence::acquire(
        store,
        "test",
        Arc::new(crate::clock::SystemClock),
        FenceOptions::default(),
        Wait::No,
        |_| {},
    )
    .await
    .expect("a fence on a store nobody holds")
}

/// A holder name: `what` and a random part.
pub fn holder(what: &str) -> String {
    format!("{what}/{:08x}", rand::random::<u32>())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use object_store::memory::InMemory;
    use object_store::{ObjectStore, ObjectStoreExt as _};
    use tidemark_store::fault::{FaultMode, FaultStore};
    use tidemark_store::open::Backend;
    use tidemark_store::{ClusterStore, state};

    use super::*;
    use crate::SystemClock;

    fn memory() -> ClusterStore {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        ClusterStore::from_object_store(inner, "c", Backend::Memory).unwrap()
    }

    fn short() -> FenceOptions {
        FenceOptions::parse(Some("3s")).unwrap()
    }

    async fn take(store: &ClusterStore, who: &str, wait: Wait) -> Result<Fence, EngineError> {
        Fence::acquire(store, who, Arc::new(SystemClock), short(), wait, |_| {}).await
    }

    /// What `work` left undone when the fence was lost: it would have "deleted" (set the
    /// flag) after `after`.
    fn work(
        after: Duration,
        deleted: &Arc<AtomicBool>,
    ) -> impl Future<Output = Result<(), EngineError>> {
        let deleted = deleted.clone();
        async move {
            tokio::time::sleep(after).await;
            deleted.store(true, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn the_ttl_is_bounded_and_named_when_refused() {
        assert_eq!(
            FenceOptions::parse(None).unwrap().ttl,
            SignedDuration::from_secs(60)
        );
        assert_eq!(
            FenceOptions::parse(Some("5m")).unwrap().ttl,
            SignedDuration::from_mins(5)
        );
        for bad in ["2s", "2h", "soon", "0s"] {
            let e = FenceOptions::parse(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("TIDEMARK_LEASE_TTL"), "{e}");
        }
    }

    #[tokio::test]
    async fn a_second_holder_is_refused_or_waits_for_the_first() {
        let store = memory();
        let first = take(&store, "tidemark run/1", Wait::No).await.unwrap();
        match take(&store, "tidemark gc/2", Wait::No).await {
            Err(EngineError::LeaseHeld { holder, .. }) => {
                assert!(holder.contains("tidemark run/1"), "{holder}")
            }
            other => panic!("{other:?}"),
        }
        match take(&store, "tidemark gc/2", Wait::For(Duration::from_secs(1))).await {
            Err(EngineError::LeaseHeld { .. }) => {}
            other => panic!("{other:?}"),
        }
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let waiter = tokio::spawn({
            let store = store.clone();
            let seen = seen.clone();
            async move {
                Fence::acquire(
                    &store,
                    "tidemark gc/3",
                    Arc::new(SystemClock),
                    short(),
                    Wait::Forever,
                    |l| seen.lock().unwrap().push(l.holder.clone()),
                )
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        first.release().await;
        let second = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(seen.lock().unwrap()[0], "tidemark run/1");
        second.check().unwrap();
        second.release().await;
    }

    /// Another holder took the lease (this process stalled past its expiry): the work
    /// under the fence stops before it deletes.
    #[tokio::test]
    async fn work_stops_when_another_takes_the_lease() {
        let store = memory();
        let fence = take(&store, "mine", Wait::No).await.unwrap();
        // Another runner's lease, as if this one had expired.
        let thief = tidemark_store::state::Lease {
            holder: "thief".into(),
            expires_at: jiff::Timestamp::now() + SignedDuration::from_hours(1),
            ..fence.held.lock().await.lease.clone()
        };
        store
            .object_store()
            .put(
                &object_store::path::Path::from("_state/lease.json"),
                serde_json::to_vec(&thief).unwrap().into(),
            )
            .await
            .unwrap();
        let deleted = Arc::new(AtomicBool::new(false));
        match fence.guard(work(Duration::from_secs(10), &deleted)).await {
            Err(EngineError::LeaseLost { holder, .. }) => assert!(holder.contains("thief")),
            other => panic!("{other:?}"),
        }
        assert!(
            !deleted.load(Ordering::SeqCst),
            "deleted after the lease was lost"
        );
        assert!(fence.check().is_err());
        // Still the thief's: releasing a lost fence leaves it alone.
        fence.release().await;
        let l = state::acquire_lease(
            &store,
            "third",
            jiff::Timestamp::now(),
            SignedDuration::from_secs(3),
        )
        .await;
        assert!(matches!(l, Err(state::LeaseError::Held(h)) if h.holder == "thief"));
    }

    /// The store stopped answering renewals: before the lease can expire (and another take
    /// the store), the work stops.
    #[tokio::test]
    async fn work_stops_before_an_unrenewed_lease_expires() {
        let memory = memory();
        // Reading and creating the lease succeed; every request after fails.
        let failing = Arc::new(FaultStore::new(
            Arc::clone(memory.object_store()),
            FaultMode::From(2),
        ));
        let store = memory.map_inner(|_| failing.clone());
        let fence = take(&store, "mine", Wait::No).await.unwrap();
        let expires = fence.held.lock().await.lease.expires_at;
        let deleted = Arc::new(AtomicBool::new(false));
        match fence.guard(work(Duration::from_secs(10), &deleted)).await {
            Err(EngineError::LeaseExpired { .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(
            jiff::Timestamp::now() < expires,
            "stopped only after the lease expired"
        );
        assert!(!deleted.load(Ordering::SeqCst));
    }

    /// Renewed on time, the fence holds past its TTL (another is still refused then), and
    /// the work finishes.
    #[tokio::test]
    async fn a_renewed_fence_outlives_its_ttl() {
        let store = memory();
        let fence = take(&store, "mine", Wait::No).await.unwrap();
        let deleted = Arc::new(AtomicBool::new(false));
        let other = async {
            tokio::time::sleep(Duration::from_secs(4)).await;
            take(&store, "other", Wait::No).await.map(|_| ())
        };
        let (done, other) =
            tokio::join!(fence.guard(work(Duration::from_secs(5), &deleted)), other);
        done.unwrap();
        assert!(
            matches!(other, Err(EngineError::LeaseHeld { .. })),
            "past its first TTL the lease was not renewed: {other:?}"
        );
        assert!(deleted.load(Ordering::SeqCst));
        fence.release().await;
        take(&store, "next", Wait::No)
            .await
            .unwrap()
            .release()
            .await;
    }

    /// Whatever the renewer says (here: nothing, as if it stalled with the process), work
    /// under the fence stops when the lease as last written ends, less its margin.
    #[tokio::test]
    async fn work_stops_at_the_end_of_the_lease_even_unreported() {
        let store = memory();
        let started = tokio::time::Instant::now();
        let fence = take(&store, "mine", Wait::No).await.unwrap();
        // The renewer waits for the lease it renews, held here: it neither renews nor says
        // anything (a stalled renewer).
        let _stalled = fence.held.lock().await;
        let deleted = Arc::new(AtomicBool::new(false));
        match fence.guard(work(Duration::from_secs(10), &deleted)).await {
            Err(EngineError::LeaseExpired { .. }) => {}
            other => panic!("{other:?}"),
        }
        // 3 s less its twelfth: stopped before the lease ends, not before it must.
        let at = started.elapsed();
        assert!(
            at >= Duration::from_millis(2500) && at < Duration::from_secs(3),
            "{at:?}"
        );
        assert!(!deleted.load(Ordering::SeqCst));
    }

    /// The lease removed from the store (by a stale holder's release, by hand): anyone may
    /// create it, so the fence is lost at the next renewal.
    #[tokio::test]
    async fn a_removed_lease_is_lost() {
        let store = memory();
        let fence = take(&store, "mine", Wait::No).await.unwrap();
        store
            .object_store()
            .delete(&object_store::path::Path::from("_state/lease.json"))
            .await
            .unwrap();
        let deleted = Arc::new(AtomicBool::new(false));
        match fence.guard(work(Duration::from_secs(10), &deleted)).await {
            Err(EngineError::LeaseLost { holder, .. }) => assert!(holder.contains("removed")),
            other => panic!("{other:?}"),
        }
        assert!(!deleted.load(Ordering::SeqCst));
    }
}
