//! The operator's error: what went wrong in a reconcile, and how soon to try again.

use std::time::Duration;

use tidemark_engine::{Class, EngineError};

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or could not be reached.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The engine failed (the store, data in it, contention…).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The object's spec is invalid: nothing to do until it changes.
    #[error("{0}")]
    Invalid(String),
    /// Something the object needs does not exist yet (its BackupPolicy, a Secret).
    #[error("{0}")]
    Missing(String),
    /// A retention pass ran but some of its deletions or consolidations failed: retried
    /// with backoff, like a store error.
    #[error("{0}")]
    PartlyFailed(String),
    /// A bug: the reconcile panicked. The object fails (and is retried slowly); the
    /// process and every other object go on.
    #[error("internal error (a bug; please report it): {0}")]
    Internal(String),
}

impl Error {
    /// The engine's class of this error: it chooses the backoff, and is the bounded label of
    /// the `tidemark_reconcile_errors_total` metric.
    pub fn class(&self) -> Class {
        match self {
            // Conflicts (409) are another writer; the rest is the API being unavailable.
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => Class::Contention,
            Error::Kube(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => Class::Input,
            Error::Kube(_) | Error::PartlyFailed(_) => Class::Store,
            Error::Engine(e) => e.class(),
            Error::Invalid(_) => Class::Input,
            Error::Missing(_) => Class::Contention,
            Error::Internal(_) => Class::Internal,
        }
    }

    /// How long to wait before the `failures`-th retry (1-based), with ±10 % jitter so that
    /// objects failing together do not retry together; `None`: wait for the object to change.
    pub fn retry_after(&self, failures: u32) -> Option<Duration> {
        self.retry_base(failures).map(jitter)
    }

    /// [`Error::retry_after`] before its jitter: what a status message announces.
    pub fn retry_base(&self, failures: u32) -> Option<Duration> {
        match self {
            Error::Invalid(_) => None,
            // A missing dependency is usually created moments later.
            Error::Missing(_) => Some(Duration::from_secs(5).min(self.class().backoff(failures))),
            _ => Some(self.class().backoff(failures)),
        }
    }

    /// `message` with when the `failures`-th consecutive failure (this one) is retried,
    /// e.g. `…; attempt 3 failed, next in about 4s` — so that `kubectl describe` tells how
    /// long an outage has lasted and when the operator looks again.
    pub fn with_retry_note(&self, message: &str, failures: u32) -> String {
        match self.retry_base(failures) {
            Some(d) => format!(
                "{message}; attempt {failures} failed, next in about {}s",
                d.as_secs_f64().round()
            ),
            None => message.to_owned(),
        }
    }
}

/// `d` ± 10 %.
pub(crate) fn jitter(d: Duration) -> Duration {
    tidemark_core::retry::jitter(d, 0.1, 0.1)
}
