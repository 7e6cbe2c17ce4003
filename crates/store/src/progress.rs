//! Progress of long store work, reported to whoever drives it (a terminal bar in the CLI,
//! nothing in JSON mode or CI logs).

/// Receives counts as work proceeds. Every method defaults to doing nothing.
pub trait Progress: Send + Sync {
    /// Objects listed.
    fn listed(&self, _n: usize) {}
    /// `metadata.json` documents read.
    fn metadata_read(&self, _n: usize) {}
    /// Objects deleted (or found already gone).
    fn deleted(&self, _n: usize) {}
    /// A new step began, e.g. "deleting segments", with the number of items it will handle.
    fn step(&self, _name: &str, _total: usize) {}
    /// Payload bytes moved (push, fetch).
    fn bytes(&self, _n: u64) {}
    /// Where the current step stands, said again and again as it moves (a replay's
    /// transactions applied, its position, the time of its last event): shown while it
    /// holds, never a step of its own.
    fn status(&self, _what: &str) {}
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}
