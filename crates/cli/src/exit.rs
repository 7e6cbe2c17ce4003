//! Exit codes (documented in docs/cli.md) and the error type that carries one.

use std::fmt;
use std::process::ExitCode;

use tidemark_store::{ErrorCategory, StoreError};

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
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
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

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        let exit = match e.category() {
            ErrorCategory::Input => Exit::Input,
            ErrorCategory::Store => Exit::Store,
            ErrorCategory::Data => Exit::Data,
            ErrorCategory::Internal => Exit::Internal,
        };
        CliError::new(exit, e)
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
