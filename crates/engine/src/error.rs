//! One error type for the use cases, with a small fixed set of classes: the CLI maps a
//! class to an exit code, the operator to a requeue policy and an event reason. Callers
//! match on the class, never on the text.

use std::time::Duration;

use tidemark_mariadb::archive::ArchiveError;
use tidemark_mariadb::consolidate::ConsolidateError;
use tidemark_mariadb::restore::RestoreError;
use tidemark_store::transfer::TransferError;
use tidemark_store::{ErrorCategory, StoreError};

/// What kind of failure an error is, and so what to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// The user's input or configuration is wrong: wait for it to change.
    Input,
    /// The store could not be reached or refused a request: transient, retry with backoff.
    Store,
    /// Data in the store blocks the work (malformed, newer format, a checksum mismatch):
    /// a person must look; retry rarely.
    Data,
    /// Another writer holds what this needs (a lease, a backup-id): retry later.
    Contention,
    /// The backup source failed (the command exited non-zero, its stream broke): the
    /// attempt is recorded as failed; the next slot tries again.
    Source,
    /// A restore target cannot be reached.
    NotRestorable,
    /// A restore's MariaDB tool failed.
    RestoreFailed,
    /// An encrypted object needs an identity that was not given: give it.
    Key,
    /// A bug.
    Internal,
}

impl Class {
    /// A bounded name for metrics labels and event reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Input => "input",
            Class::Store => "store",
            Class::Data => "data",
            Class::Contention => "contention",
            Class::Source => "source",
            Class::NotRestorable => "notRestorable",
            Class::RestoreFailed => "restoreFailed",
            Class::Key => "key",
            Class::Internal => "internal",
        }
    }

    /// How long to wait before the `failures`-th retry in a row (1-based): exponential
    /// for transient classes, capped; a fixed long pause for those a person must fix.
    pub fn backoff(self, failures: u32) -> Duration {
        /// First pause after a transient failure.
        const FIRST: Duration = Duration::from_secs(1);
        /// Longest pause between retries of a transient failure: a store back after an
        /// outage is noticed within it.
        const CAP: Duration = Duration::from_secs(300);
        /// Pause after a failure only a person can fix (bad data, bad input, a bug): often
        /// enough to notice the fix, rarely enough not to flood the log.
        const SLOW: Duration = Duration::from_secs(600);
        match self {
            Class::Store | Class::Contention | Class::Source => {
                tidemark_core::retry::delay(FIRST, CAP, failures)
            }
            Class::Input
            | Class::Data
            | Class::NotRestorable
            | Class::RestoreFailed
            | Class::Key
            | Class::Internal => SLOW,
        }
    }
}

impl From<ErrorCategory> for Class {
    fn from(c: ErrorCategory) -> Self {
        match c {
            ErrorCategory::Input => Class::Input,
            ErrorCategory::Store => Class::Store,
            ErrorCategory::Data => Class::Data,
            ErrorCategory::Contention => Class::Contention,
            ErrorCategory::Internal => Class::Internal,
        }
    }
}

/// The errors of the use cases. The edges' errors are boxed: they are large, and an
/// error travels through every `?` on its way up.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(Box<StoreError>),
    #[error(transparent)]
    Transfer(Box<TransferError>),
    #[error(transparent)]
    Archive(Box<ArchiveError>),
    #[error(transparent)]
    Restore(Box<RestoreError>),
    #[error(transparent)]
    Consolidate(Box<ConsolidateError>),
    #[error(transparent)]
    MariaDb(Box<tidemark_mariadb::MariaDbError>),
    /// The backup command failed; the text is already free of secrets.
    #[error("{0}")]
    Source(String),
    #[error("{0}")]
    Input(String),
    #[error(
        "{cluster}: another deleter holds this cluster's lease ({holder}, last renewed {renewed}); it is free when that one stops, or when the lease expires at {expires}"
    )]
    LeaseHeld {
        cluster: String,
        holder: String,
        renewed: String,
        expires: String,
    },
    #[error(
        "{cluster}: the lease on this cluster was taken by {holder}; stopping before anything more is deleted"
    )]
    LeaseLost { cluster: String, holder: String },
    #[error(
        "{cluster}: the lease on this cluster could not be renewed in time (it expires at {expired}: {cause}); stopping before anything more is deleted, since another may take it then"
    )]
    LeaseExpired {
        cluster: String,
        expired: String,
        cause: String,
    },
    /// `requireVerified`: the newest backup (or its chain) did not read back whole, so the
    /// pass deletes nothing.
    #[error(
        "retention deletes nothing until the newest backup {backup} reads back whole (requireVerified): {problem}"
    )]
    Unverified { backup: String, problem: String },
    /// An edge the engine does not know failed (the operator's Kubernetes API, where a
    /// schedule's status lives): its class is the edge's judgement.
    #[error("{message}")]
    Edge { class: Class, message: String },
    #[error("{0}")]
    Internal(String),
}

macro_rules! boxed_from {
    ($($variant:ident($t:ty)),*) => {$(
        impl From<$t> for EngineError {
            fn from(e: $t) -> Self {
                EngineError::$variant(Box::new(e))
            }
        }
    )*};
}

impl From<tidemark_mariadb::remote::RemoteError> for EngineError {
    fn from(e: tidemark_mariadb::remote::RemoteError) -> Self {
        use tidemark_mariadb::remote::RemoteError;
        match e {
            RemoteError::Archive(a) => a.into(),
            RemoteError::Spool { .. } => EngineError::Input(e.to_string()),
            // Already says which server task it refuses, and why.
            RemoteError::Unfit(why) => EngineError::Source(why),
            other => EngineError::Source(format!("reading binlogs from the server: {other}")),
        }
    }
}

boxed_from!(
    Store(StoreError),
    Transfer(TransferError),
    Archive(ArchiveError),
    Restore(RestoreError),
    Consolidate(ConsolidateError),
    MariaDb(tidemark_mariadb::MariaDbError)
);

impl EngineError {
    pub fn class(&self) -> Class {
        match self {
            EngineError::Store(e) => e.category().into(),
            EngineError::Transfer(e) => transfer_class(e),
            EngineError::Archive(e) => match e.as_ref() {
                ArchiveError::Store(s) => s.category().into(),
                ArchiveError::Upload { source, .. } => transfer_class(source),
                ArchiveError::IndexFile { .. }
                | ArchiveError::NotBinlogName { .. }
                | ArchiveError::DuplicateSequence { .. }
                | ArchiveError::SequenceTaken { .. }
                | ArchiveError::NumberTooLarge { .. }
                | ArchiveError::StaleBranch { .. }
                | ArchiveError::NotPrimary { .. }
                | ArchiveError::NotThePrimary { .. }
                | ArchiveError::MixedWriters { .. } => Class::Input,
                ArchiveError::TooManyTimelines { .. } => Class::Data,
                ArchiveError::Binlog { .. } | ArchiveError::Vanished(_) => Class::Source,
            },
            EngineError::Restore(e) => match e.as_ref() {
                RestoreError::Refused(_)
                | RestoreError::NoPosition { .. }
                | RestoreError::MySqlGap { .. }
                | RestoreError::SystemRows { .. } => Class::NotRestorable,
                RestoreError::Method { .. }
                | RestoreError::NoTimeline { .. }
                | RestoreError::DatadirNotEmpty(_)
                | RestoreError::ServerAsRoot { .. }
                | RestoreError::ServerUser { .. } => Class::Input,
                // A backup whose files say what no tool is handed: the data is not what
                // Tidemark wrote (or not a backup it can restore).
                RestoreError::NoMetadata { .. } | RestoreError::Options(_) => Class::Data,
                RestoreError::Transfer(t) => match transfer_class(t) {
                    // A download that fails its checksum is data; a sink that fails is the
                    // restore's own failure.
                    Class::Internal => Class::RestoreFailed,
                    c => c,
                },
                RestoreError::Io { .. }
                | RestoreError::Spawn { .. }
                | RestoreError::Tool { .. }
                | RestoreError::ServerStart { .. } => Class::RestoreFailed,
                RestoreError::Store(s) => s.category().into(),
                RestoreError::Source { .. } => Class::Source,
            },
            EngineError::Consolidate(e) => match e.as_ref() {
                ConsolidateError::Transfer(t) => transfer_class(t),
                ConsolidateError::NoChain { .. } | ConsolidateError::NoMetadata { .. } => {
                    Class::Data
                }
                ConsolidateError::Mariadb(_) => Class::Data,
                ConsolidateError::WouldDecrypt { .. } => Class::Input,
                ConsolidateError::Restore(_) => Class::RestoreFailed,
            },
            EngineError::MariaDb(_) => Class::Input,
            EngineError::Source(_) => Class::Source,
            EngineError::Input(_) => Class::Input,
            EngineError::LeaseHeld { .. }
            | EngineError::LeaseLost { .. }
            | EngineError::LeaseExpired { .. } => Class::Contention,
            EngineError::Internal(_) => Class::Internal,
            EngineError::Unverified { .. } => Class::Data,
            EngineError::Edge { class, .. } => *class,
        }
    }
}

fn transfer_class(e: &TransferError) -> Class {
    match e {
        TransferError::InvalidName(_)
        | TransferError::InvalidId(_)
        | TransferError::AlreadyCommitted { .. }
        | TransferError::NotFound { .. }
        | TransferError::Expired { .. } => Class::Input,
        TransferError::AttemptExists { .. } => Class::Contention,
        TransferError::Source { .. } | TransferError::EmptyStream => Class::Source,
        TransferError::PayloadGone { .. }
        | TransferError::Failed { .. }
        | TransferError::MissingPayload { .. }
        | TransferError::MissingSegment { .. }
        | TransferError::Checksum { .. }
        | TransferError::Content { .. }
        | TransferError::Metadata { .. } => Class::Data,
        TransferError::NoIdentity { .. } => Class::Key,
        // An object this store would never have written: data, as a checksum mismatch is.
        TransferError::Plaintext { .. } => Class::Data,
        TransferError::Sink(_) => Class::Internal,
        TransferError::Store(s) => s.category().into(),
    }
}

/// `outer: cause: root cause`, each cause once.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_backoff_doubles_and_is_capped() {
        assert_eq!(Class::Store.backoff(1), Duration::from_secs(1));
        assert_eq!(Class::Store.backoff(2), Duration::from_secs(2));
        assert_eq!(Class::Store.backoff(5), Duration::from_secs(16));
        assert_eq!(Class::Store.backoff(40), Duration::from_secs(300));
        assert_eq!(Class::Data.backoff(1), Duration::from_secs(600));
    }
}
