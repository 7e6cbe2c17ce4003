//! Progress on a terminal: a spinner while listing, a bar while deleting. Silent when
//! stderr is not a terminal (CI logs, pipes) and in JSON mode.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tidemark_store::Progress;

/// Draws progress on stderr.
#[derive(Debug)]
pub struct TerminalProgress {
    bar: ProgressBar,
}

impl TerminalProgress {
    /// A progress display if a person is watching, else `None`.
    pub fn for_humans(json: bool) -> Option<Self> {
        watching(json).then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(spinner());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar.set_message("listing the store");
            TerminalProgress { bar }
        })
    }

    /// A byte counter for push and fetch, if a person is watching.
    pub fn for_bytes(quiet: bool, what: &str) -> Option<Self> {
        watching(quiet).then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} {msg} {bytes} ({binary_bytes_per_sec}, {elapsed})",
                )
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar.set_message(what.to_owned());
            TerminalProgress { bar }
        })
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Whether a person watches stderr (and output is not asked to be quiet).
fn watching(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal() && std::env::var_os("CI").is_none()
}

fn spinner() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {msg} ({pos} objects, {elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

impl Progress for TerminalProgress {
    fn listed(&self, n: usize) {
        self.bar.inc(n as u64);
    }

    fn metadata_read(&self, n: usize) {
        if self.bar.length().is_none() {
            self.bar.set_message("reading metadata");
        }
        self.bar.inc(n as u64);
    }

    fn deleted(&self, n: usize) {
        self.bar.inc(n as u64);
    }

    fn bytes(&self, n: u64) {
        self.bar.inc(n);
    }

    fn step(&self, name: &str, total: usize) {
        self.bar.set_position(0);
        self.bar.set_length(total as u64);
        self.bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({per_sec}, eta {eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        self.bar.set_message(name.to_owned());
    }

    fn status(&self, what: &str) {
        self.bar.set_message(what.to_owned());
    }
}
