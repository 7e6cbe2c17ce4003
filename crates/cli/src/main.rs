//! The `tidemark` command (also installed as `kubectl-tidemark`).

mod args;
mod commands;
mod exit;
mod output;
mod progress;
mod resolve;
mod restore;
mod run;
mod simulate;
mod transfer;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    init_logging();
    let cli = args::Cli::parse();
    match commands::run(cli) {
        Ok(code) => code.into(),
        Err(e) => {
            eprintln!("{}", exit::render(&e.error));
            e.exit.into()
        }
    }
}

/// Logs go to stderr; `TIDEMARK_LOG` (e.g. `debug`, `tidemark_store=trace`) sets the level.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIDEMARK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
