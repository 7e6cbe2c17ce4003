//! Exit codes (documented in docs/cli.md) and the error type that carries one.

use std::fmt;
use std::process::ExitCode;

use tidemark_engine::{Class, EngineError};
use tidemark_store::StoreError;

/// Every exit status the command can end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success = 0,
    /// A bug or an unexpected condition.
    Internal = 1,
    /// Invalid flags, policy, time, URL, cluster name or credentials setup.
    Input = 2,
    /// The store could not be reached, or refused a request after retries.
    Store = 3,
    /// Data in the store blocks the pass: malformed or newer metadata.json / _index.json.
    Data = 4,
    /// gc ran, but some objects could not be deleted; running it again finishes the job.
    Partial = 5,
    /// push: the backup source failed (the command exited non-zero, or reading its stream
    /// failed); the attempt is recorded as failed.
    SourceFailed = 6,
    /// restore: the target cannot be restored (outside the recovery window, in a gap, or
    /// past an unarchived binlog); nothing was written.
    NotRestorable = 7,
    /// restore: a MariaDB tool failed (the error shows the end of its output); the data
    /// directory was removed again.
    RestoreFailed = 8,
    /// Another writer holds what this needs: another `tidemark run` holds the cluster's
    /// lease, another push the backup-id, or another writer kept changing the binlog index
    /// or the run state.
    Contention = 9,
    /// An encrypted payload or segment needs an identity that was not given, or none
    /// given is one of its recipients (the error names them); nothing was written.
    Key = 10,
    /// gc: the deletion guard held deletions (none of them made); acknowledge with
    /// `--allow-mass-deletion TIME` if that is what you want.
    Held = 11,
}

impl Exit {
    /// Every code, for `--help`.
    pub const ALL: [Exit; 12] = [
        Exit::Success,
        Exit::Internal,
        Exit::Input,
        Exit::Store,
        Exit::Data,
        Exit::Partial,
        Exit::SourceFailed,
        Exit::NotRestorable,
        Exit::RestoreFailed,
        Exit::Contention,
        Exit::Key,
        Exit::Held,
    ];

    /// One line for `--help`.
    pub fn summary(self) -> &'static str {
        match self {
            Exit::Success => "success",
            Exit::Internal => "internal error",
            Exit::Input => "invalid input",
            Exit::Store => "store unreachable or a request failed",
            Exit::Data => {
                "data in the store blocks the work (malformed or newer metadata.json/_index.json, a checksum mismatch)"
            }
            Exit::Partial => {
                "gc finished but some objects could not be deleted or a consolidation failed (run it again)"
            }
            Exit::SourceFailed => "push: the backup command failed (recorded as failed)",
            Exit::NotRestorable => "restore: the target cannot be restored",
            Exit::RestoreFailed => "restore: a MariaDB tool failed",
            Exit::Contention => {
                "another tidemark holds the cluster's lease or the backup-id, or kept changing the index"
            }
            Exit::Key => {
                "an encrypted backup or binlog needs an identity that was not given (--identity); nothing was written"
            }
            Exit::Held => {
                "gc: the deletion guard held deletions (stderr says why and how to acknowledge them)"
            }
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}

impl From<Class> for Exit {
    fn from(c: Class) -> Self {
        match c {
            Class::Input => Exit::Input,
            Class::Store => Exit::Store,
            Class::Data => Exit::Data,
            Class::Contention => Exit::Contention,
            Class::Key => Exit::Key,
            Class::Source => Exit::SourceFailed,
            Class::NotRestorable => Exit::NotRestorable,
            Class::RestoreFailed => Exit::RestoreFailed,
            Class::Internal => Exit::Internal,
        }
    }
}

/// An error with the exit code it ends the process with.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub error: anyhow::Error,
}

impl CliError {
    pub fn new(exit: Exit, error: impl Into<anyhow::Error>) -> Self {
        CliError {
            exit,
            error: error.into(),
        }
    }

    pub fn input(msg: impl fmt::Display) -> Self {
        CliError::new(Exit::Input, anyhow::anyhow!("{msg}"))
    }
}

impl From<EngineError> for CliError {
    fn from(e: EngineError) -> Self {
        CliError::new(e.class().into(), e)
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        EngineError::from(e).into()
    }
}

/// `error: outer: cause: root cause`. Some library errors already print their sources;
/// a cause whose text is already shown is not repeated.
pub fn render(e: &anyhow::Error) -> String {
    let mut s = format!("error: {e}");
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
    }
    s
}

/// The exit codes as `--help` lists them.
pub fn help_text() -> String {
    let codes: Vec<String> = Exit::ALL
        .iter()
        .map(|e| format!("{} {}", *e as u8, e.summary()))
        .collect();
    format!("Exit codes: {}. See docs/cli.md.", codes.join("; "))
}
