//! Work that must not hold one of a controller's reconcile slots (16 per controller): a
//! retention pass with slow DeleteHooks or consolidations would otherwise keep every other
//! tenant's objects waiting. A reconcile starts the work here and returns; the next
//! reconcile of the object finds it running (and looks again later) or collects its
//! outcome. Stopped with the controllers.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use futures::FutureExt;
use kube::runtime::controller::Action;

use crate::error::Error;

type Outcome = Result<Action, Error>;

/// How soon a reconcile looks again at work it started or found running: the look is an
/// in-memory check, and a short one keeps a failure's backoff (1 s, 2 s, 4 s…) what it
/// says.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// Background work by object key (`Kind/namespace/name`).
#[derive(Debug, Default)]
pub struct Background {
    running: Mutex<HashMap<String, tokio::task::JoinHandle<Outcome>>>,
}

/// Where an object's background work stands.
#[derive(Debug)]
pub enum Polled {
    /// None started (or its outcome was collected).
    Idle,
    Running,
    /// It ended with this outcome (collected now: the next poll says `Idle`).
    Done(Outcome),
}

impl Background {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::task::JoinHandle<Outcome>>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where `key`'s work stands; a finished one's outcome is handed over once.
    pub fn poll(&self, key: &str) -> Polled {
        let mut running = self.lock();
        match running.get(key) {
            None => Polled::Idle,
            Some(h) if !h.is_finished() => Polled::Running,
            Some(_) => match running.remove(key).map(FutureExt::now_or_never) {
                Some(Some(Ok(outcome))) => Polled::Done(outcome),
                Some(Some(Err(e))) => Polled::Done(Err(Error::Internal(format!(
                    "background work of {key} ended abnormally: {e}"
                )))),
                _ => Polled::Idle,
            },
        }
    }

    /// Starts `work` for `key` (unless some runs for it already).
    pub fn start(
        &self,
        key: String,
        work: impl std::future::Future<Output = Outcome> + Send + 'static,
    ) {
        let mut running = self.lock();
        if running.get(&key).is_some_and(|h| !h.is_finished()) {
            return;
        }
        running.insert(key, tokio::spawn(work));
    }

    /// Whether `key` has work here, running or with an outcome not collected yet.
    pub fn tracks(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    /// How many run now.
    pub fn len(&self) -> usize {
        self.lock().values().filter(|h| !h.is_finished()).count()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops all (a pass stopped mid-way is safe: deletions are crash-safe and the store
    /// lease is released or expires).
    pub fn stop_all(&self) {
        for (_, h) in self.lock().drain() {
            h.abort();
        }
    }
}
