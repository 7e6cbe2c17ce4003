//! The `exec` streams this process runs (method `exec` of a Backup), and their limits:
//! how many at once and for how long.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Bytes per multipart part of an exec stream's upload, and parts in flight: one stream
/// holds at most `EXEC_PART_SIZE * (EXEC_PARTS_IN_FLIGHT + 1)` = 24 MiB of its payload.
pub const EXEC_PART_SIZE: usize = 8 << 20;

pub const EXEC_PARTS_IN_FLIGHT: usize = 2;

/// The highest zstd level of a stream compressed inside the operator (see
/// [`tidemark_core::compression::EXEC_MAX_LEVEL`]).
pub const EXEC_MAX_ZSTD_LEVEL: i32 = tidemark_core::compression::EXEC_MAX_LEVEL;

/// Exec streams at once by default (more wait, `Queued`).
pub const DEFAULT_STREAMS: usize = 4;

/// How long one exec stream may run by default, as a backup Job.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// How many exec streams run at once, and for how long each may run.
#[derive(Debug, Clone)]
pub struct Limits {
    pub streams: usize,
    pub max_duration: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            streams: DEFAULT_STREAMS,
            max_duration: DEFAULT_MAX_DURATION,
        }
    }
}

/// The exec streams this process runs, by Backup uid; stopped when dropped (the
/// controllers stopped: shutdown or a lost lease).
#[derive(Debug, Default)]
pub struct Streams {
    running: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
}

impl Streams {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::task::JoinHandle<()>>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this process streams the Backup `uid` now.
    pub fn running(&self, uid: &str) -> bool {
        self.lock().get(uid).is_some_and(|h| !h.is_finished())
    }

    /// How many streams run now.
    pub fn len(&self) -> usize {
        self.lock().values().filter(|h| !h.is_finished()).count()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps `handle` as the stream of `uid`, unless one runs already (then `handle` is
    /// stopped: never two streams for one Backup).
    pub(crate) fn insert(&self, uid: String, handle: tokio::task::JoinHandle<()>) {
        let mut running = self.lock();
        running.retain(|_, h| !h.is_finished());
        if running.contains_key(&uid) {
            handle.abort();
            return;
        }
        running.insert(uid, handle);
    }

    /// Stops every stream (their attempts are fenced by the next leader).
    pub fn stop_all(&self) {
        for (_, h) in self.lock().drain() {
            h.abort();
        }
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        self.stop_all();
    }
}
