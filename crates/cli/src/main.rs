//! The `tidemark` command (also installed as `kubectl-tidemark`, and as
//! `kubectl_complete-tidemark` for kubectl's completion of the plugin).

mod args;
mod checksums;
mod cluster;
mod commands;
mod complete;
mod copy;
mod exit;
mod inspect;
mod output;
mod progress;
mod resolve;
mod restore;
mod run;
mod simulate;
mod transfer;
mod verify;

use std::process::ExitCode;

fn main() -> ExitCode {
    // Nothing this process starts (a backup command, mariabackup on a backup from the
    // bucket, a hook) may read its environment or memory back through /proc — the store's
    // keys and the age identity are there. Not dumpable: only a process with
    // CAP_SYS_PTRACE, CAP_SYS_ADMIN or CAP_PERFMON can, none of which a container runtime
    // gives by default, and Tidemark's own pods drop every capability (issue 28).
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        eprintln!("warning: cannot make the process non-dumpable: {e}");
    }
    // As `kubectl_complete-tidemark`: kubectl asks for the completions of its plugin.
    if complete::invoked() {
        let words: Vec<String> = std::env::args().skip(1).collect();
        complete::run(&words);
    }
    let cli = args::parse();
    init_logging(&cli.command, cli.log_format == "json");
    match commands::run(cli) {
        Ok(code) => code.into(),
        Err(e) => {
            eprintln!("{}", exit::render(&e.error));
            e.exit.into()
        }
    }
}

/// Logs go to stderr, coloured only on a terminal; `TIDEMARK_LOG` (e.g. `debug`,
/// `tidemark_store=trace`) sets the level. `run` narrates what it does (backups started
/// and finished, what retention deleted and why) at `info`; the other commands print
/// their own output and log only warnings.
fn init_logging(command: &args::Command, json: bool) {
    use std::io::IsTerminal;
    let default = match command {
        args::Command::Run(_) => "warn,tidemark_engine=info",
        args::Command::Operator(_) => "warn,tidemark_engine=info,tidemark_operator=info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIDEMARK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    if json {
        // One object per line; the spans (a reconcile's object) as fields of each line.
        logs.json()
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
}
