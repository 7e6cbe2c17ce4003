//! Work that must not hold one of a controller's reconcile slots (16 per controller): a
//! retention pass with slow DeleteHooks or consolidations would otherwise keep every other
//! tenant's objects waiting. A reconcile starts the work here and returns; the next
//! reconcile of the object finds it queued or running (and looks again later) or collects
//! its outcome. Stopped with the controllers.
//!
//! At most [`Background::limit`] run at once (`--background-passes`): a pass holds a
//! store's catalog in memory, so at operator start, when every policy is due, memory is
//! that many passes, not the sum over every store (issue 28). The others wait in order
//! of arrival (tokio's semaphore is fair), queued, never failed for waiting. Work that
//! waits on something slow and holds no catalog — a pass following its DeleteHooks —
//! gives its turn back meanwhile ([`without_turn`]), so one tenant's slow hooks never keep
//! another's pass waiting.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use kube::runtime::controller::Action;

use crate::error::Error;

type ReconcileResult = Result<Action, Error>;

/// How soon a reconcile looks again at work it started or found running: the look is an
/// in-memory check, and a short one keeps a failure's backoff (1 s, 2 s, 4 s…) what it
/// says.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// Background works at once by default: two passes at their budget's most
/// (`tidemark_store::budget::Budget::SHARED`) fit the Deployment's memory limit beside the
/// exec streams.
pub const DEFAULT_LIMIT: usize = 2;

/// The turn the current background task holds (see [`without_turn`]).
#[derive(Debug)]
struct Turn {
    turns: Arc<tokio::sync::Semaphore>,
    held: Mutex<Option<tokio::sync::OwnedSemaphorePermit>>,
}

tokio::task_local! {
    static TURN: Arc<Turn>;
}

/// Runs `f` without the current background task's turn (others take it meanwhile), and
/// waits for a turn again after. For waits that hold no catalog: the memory the turns
/// bound must be released before (a pass drops its survey while its hooks run). Outside
/// background work it is `f`.
pub async fn without_turn<F: std::future::Future>(f: F) -> F::Output {
    let turn = TURN.try_with(Arc::clone).ok();
    if let Some(t) = &turn {
        drop(t.held.lock().unwrap_or_else(PoisonError::into_inner).take());
    }
    let out = f.await;
    if let Some(t) = &turn
        && let Ok(permit) = t.turns.clone().acquire_owned().await
    {
        *t.held.lock().unwrap_or_else(PoisonError::into_inner) = Some(permit);
    }
    out
}

/// One key's work: its task, and whether it got its turn.
#[derive(Debug)]
struct Work {
    task: tokio::task::JoinHandle<ReconcileResult>,
    started: Arc<AtomicBool>,
}

/// Background work by object key (`Kind/namespace/name`).
#[derive(Debug)]
pub struct Background {
    running: Mutex<HashMap<String, Work>>,
    turns: Arc<tokio::sync::Semaphore>,
    limit: usize,
}

impl Default for Background {
    fn default() -> Self {
        Background::new(DEFAULT_LIMIT)
    }
}

/// Where an object's background work stands.
#[derive(Debug)]
pub enum Polled {
    /// None started (or its outcome was collected).
    Idle,
    /// Waiting for its turn: `limit` others run.
    Queued,
    Running,
    /// It ended with this outcome (collected now: the next poll says `Idle`).
    Done(ReconcileResult),
}

impl Background {
    /// At most `limit` (at least 1) works at once.
    pub fn new(limit: usize) -> Self {
        let limit = limit.max(1);
        Background {
            running: Mutex::default(),
            turns: Arc::new(tokio::sync::Semaphore::new(limit)),
            limit,
        }
    }

    /// How many run at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Work>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where `key`'s work stands; a finished one's outcome is handed over once.
    pub fn poll(&self, key: &str) -> Polled {
        let mut running = self.lock();
        match running.get(key) {
            None => Polled::Idle,
            Some(w) if !w.task.is_finished() && !w.started.load(Ordering::Acquire) => {
                Polled::Queued
            }
            Some(w) if !w.task.is_finished() => Polled::Running,
            Some(_) => match running.remove(key).map(|w| w.task.now_or_never()) {
                Some(Some(Ok(outcome))) => Polled::Done(outcome),
                Some(Some(Err(e))) => Polled::Done(Err(Error::Internal(format!(
                    "background work of {key} ended abnormally: {e}"
                )))),
                _ => Polled::Idle,
            },
        }
    }

    /// Starts `work` for `key` when its turn comes (unless some is there for it already);
    /// `false` when it waits for its turn.
    pub fn start(
        &self,
        key: String,
        work: impl std::future::Future<Output = ReconcileResult> + Send + 'static,
    ) -> bool {
        let mut running = self.lock();
        if let Some(w) = running.get(&key).filter(|w| !w.task.is_finished()) {
            return w.started.load(Ordering::Acquire);
        }
        let started = Arc::new(AtomicBool::new(false));
        // A turn free now is taken here, so the answer is true at once.
        let now = self.turns.clone().try_acquire_owned().ok();
        let begun = now.is_some();
        started.store(begun, Ordering::Release);
        let (turns, flag) = (self.turns.clone(), started.clone());
        // Its lines carry the object of the reconcile that started it.
        let task = tokio::spawn(tracing::Instrument::in_current_span(async move {
            let permit = match now {
                Some(t) => t,
                None => match turns.clone().acquire_owned().await {
                    Ok(t) => t,
                    Err(_) => {
                        return Err(Error::Internal("the background queue is closed".into()));
                    }
                },
            };
            flag.store(true, Ordering::Release);
            let turn = Arc::new(Turn {
                turns,
                held: Mutex::new(Some(permit)),
            });
            TURN.scope(turn, work).await
        }));
        running.insert(key, Work { task, started });
        begun
    }

    /// How many wait for their turn.
    pub fn queued(&self) -> usize {
        self.lock()
            .values()
            .filter(|w| !w.task.is_finished() && !w.started.load(Ordering::Acquire))
            .count()
    }

    /// Whether `key` has work here, running or with an outcome not collected yet.
    pub fn tracks(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    /// How many run now.
    pub fn len(&self) -> usize {
        self.lock()
            .values()
            .filter(|w| !w.task.is_finished() && w.started.load(Ordering::Acquire))
            .count()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts no more: what waits for its turn ends without running (at shutdown, so the
    /// work in flight is only what already runs).
    pub fn close_queue(&self) {
        self.turns.close();
    }

    /// Stops all (a pass stopped mid-way is safe: deletions are crash-safe and the store
    /// lease is released or expires).
    pub fn stop_all(&self) {
        for (_, w) in self.lock().drain() {
            w.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Issue 28 finding 5: past the limit, work waits for its turn (queued, in order), and
    /// runs when one ends; a closed queue starts nothing more.
    #[tokio::test]
    async fn work_past_the_limit_waits_for_its_turn() {
        let bg = Background::new(1);
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        assert!(bg.start("a".into(), async move {
            let _ = held.await;
            Ok(Action::await_change())
        }));
        assert!(!bg.start("b".into(), async { Ok(Action::await_change()) }));
        assert!(!bg.start("c".into(), async { Ok(Action::await_change()) }));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(matches!(bg.poll("a"), Polled::Running));
        assert!(matches!(bg.poll("b"), Polled::Queued));
        assert_eq!((bg.len(), bg.queued()), (1, 2));
        release.send(()).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !matches!(bg.poll("b"), Polled::Done(Ok(_))) {
            assert!(tokio::time::Instant::now() < deadline, "b never ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(matches!(bg.poll("a"), Polled::Done(Ok(_))));
        // c is next; once the queue is closed, what still waits ends without running.
        let bg = Background::new(1);
        let (_keep, held) = tokio::sync::oneshot::channel::<()>();
        bg.start("a".into(), async move {
            let _ = held.await;
            Ok(Action::await_change())
        });
        let (ran, ran_rx) = tokio::sync::oneshot::channel::<()>();
        bg.start("b".into(), async move {
            let _ = ran.send(());
            Ok(Action::await_change())
        });
        bg.close_queue();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(matches!(bg.poll("b"), Polled::Done(Err(_))));
        assert!(
            ran_rx.await.is_err(),
            "queued work ran after the queue closed"
        );
    }

    /// Work waiting without its turn (a pass following slow hooks) lets the next one run.
    #[tokio::test]
    async fn a_wait_without_the_turn_lets_others_run() {
        let bg = Background::new(1);
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        bg.start("slow".into(), async move {
            without_turn(async move {
                let _ = held.await;
            })
            .await;
            Ok(Action::await_change())
        });
        bg.start("next".into(), async { Ok(Action::await_change()) });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !matches!(bg.poll("next"), Polled::Done(Ok(_))) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the next work waited for the slow one's hooks"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        release.send(()).unwrap();
        while !matches!(bg.poll("slow"), Polled::Done(Ok(_))) {
            assert!(tokio::time::Instant::now() < deadline, "slow never ended");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
