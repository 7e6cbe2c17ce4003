//! `archive-binlogs --checksums-every` (issue 48 §1): the restore oracle's checksum runs
//! on the server the archiver reads, on a schedule, beside its passes.

use std::path::PathBuf;
use std::time::Duration;

use tidemark_mariadb::oracle::{RunReport, Settings};
use tokio::task::JoinHandle;

use crate::exit::CliError;

/// What a finished run printed: its report, or why it failed.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChecksumsOut {
    #[serde(flatten)]
    pub report: Option<RunReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ChecksumsOut {
    /// The run, for a person.
    pub fn line(&self) -> String {
        match (&self.report, &self.error) {
            (Some(r), _) => {
                let mut line = format!(
                    "checksums run {} written: {} table(s), {} chunk(s)",
                    r.run, r.tables, r.chunks
                );
                for s in &r.skipped {
                    line.push_str(&format!("; not checked: {s}"));
                }
                line
            }
            (None, Some(e)) => format!("checksums failed: {e}"),
            (None, None) => "checksums: nothing".to_owned(),
        }
    }
}

/// The schedule of checksum runs, and the one running.
pub struct Schedule {
    every: Duration,
    settings: Settings,
    client: PathBuf,
    client_args: Vec<String>,
    mysql: bool,
    next: tokio::time::Instant,
    last_run: u64,
    running: Option<JoinHandle<Result<RunReport, String>>>,
}

impl Schedule {
    /// The schedule `args` ask for, checked; `None` without --checksums-every.
    pub fn from_args(args: &crate::args::ArchiveArgs) -> Result<Option<Self>, CliError> {
        let Some(every) = &args.checksums_every else {
            return Ok(None);
        };
        let positive = |flag: &str, text: &str, example: &str| {
            text.parse::<jiff::SignedDuration>()
                .ok()
                .filter(|d| !d.is_negative())
                .and_then(|d| Duration::try_from(d).ok())
                .ok_or_else(|| {
                    CliError::input(format!(
                        "invalid {flag} {text:?}: expected a duration such as {example}"
                    ))
                })
        };
        let every_d = positive("--checksums-every", every, "1h or 30m")?;
        if every_d.is_zero() {
            return Err(CliError::input(format!(
                "invalid --checksums-every {every:?}: expected a positive duration such as 1h or 30m"
            )));
        }
        let settings = Settings {
            chunk_rows: args.checksum_chunk_rows,
            pause: positive("--checksum-pause", &args.checksum_pause, "50ms or 0s")?,
            tables: args.checksum_tables.clone(),
            skip: args.checksum_skip.clone(),
        };
        settings
            .validate()
            .map_err(|e| CliError::input(format!("--checksum-*: {e}")))?;
        let mysql = args.engine == crate::args::Engine::Mysql;
        let client = if mysql {
            args.mysql.clone()
        } else {
            args.mariadb.clone()
        };
        Ok(Some(Self {
            every: every_d,
            settings,
            client,
            client_args: args.client.clone(),
            mysql,
            next: tokio::time::Instant::now(),
            last_run: 0,
            running: None,
        }))
    }

    /// A run number after the last one: the time in seconds, so runs sort as written.
    fn run_number(&mut self) -> u64 {
        let now = u64::try_from(jiff::Timestamp::now().as_second()).unwrap_or_default();
        self.last_run = now.max(self.last_run + 1);
        self.last_run
    }

    fn start(&mut self) -> JoinHandle<Result<RunReport, String>> {
        let run = self.run_number();
        let (client, args, settings) = (
            self.client.clone(),
            self.client_args.clone(),
            self.settings.clone(),
        );
        tokio::spawn(async move {
            tidemark_mariadb::oracle::write_run(client.as_os_str(), &args, run, &settings).await
        })
    }

    fn out(
        &self,
        result: Result<Result<RunReport, String>, tokio::task::JoinError>,
    ) -> ChecksumsOut {
        match result {
            Ok(Ok(report)) => ChecksumsOut {
                report: Some(report),
                error: None,
            },
            Ok(Err(e)) => ChecksumsOut {
                report: None,
                error: Some(format!(
                    "{e} ({})",
                    tidemark_mariadb::oracle::rights(self.mysql)
                )),
            },
            Err(e) => ChecksumsOut {
                report: None,
                error: Some(format!("the run stopped: {e}")),
            },
        }
    }

    /// One run, to its end (--once).
    pub async fn run_now(&mut self) -> ChecksumsOut {
        let task = self.start();
        self.out(task.await)
    }

    /// Watching: the run that finished since the last call, if any; then a new run when
    /// one is due and none runs (the next is due `every` after this one starts).
    pub async fn tick(&mut self) -> Option<ChecksumsOut> {
        let mut finished = None;
        if self.running.as_ref().is_some_and(JoinHandle::is_finished)
            && let Some(task) = self.running.take()
        {
            finished = Some(self.out(task.await));
        }
        if self.running.is_none() && tokio::time::Instant::now() >= self.next {
            self.next = tokio::time::Instant::now() + self.every;
            self.running = Some(self.start());
        }
        finished
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        if let Some(task) = &self.running {
            task.abort();
        }
    }
}
