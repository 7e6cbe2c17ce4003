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
            (Some(r), _) => format!("checksums {}", r.line()),
            (None, e) => format!("checksums failed: {}", e.as_deref().unwrap_or_default()),
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
    /// The last run's number, shared with the task that writes it.
    last_run: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Whether the first run waits for its turn after the newest on the server.
    first: bool,
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
            last_run: std::sync::Arc::default(),
            first: true,
            running: None,
        }))
    }

    /// A run, in a task of its own.
    fn start(&mut self) -> JoinHandle<Result<RunReport, String>> {
        let (client, args, settings, last) = (
            self.client.clone(),
            self.client_args.clone(),
            self.settings.clone(),
            std::sync::Arc::clone(&self.last_run),
        );
        let now = || u64::try_from(jiff::Timestamp::now().as_second()).unwrap_or_default();
        tokio::spawn(async move {
            use tidemark_mariadb::oracle;
            // The time in seconds, after the last: runs sort as written.
            let run = oracle::run_number(now(), last.load(std::sync::atomic::Ordering::Relaxed));
            last.store(run, std::sync::atomic::Ordering::Relaxed);
            oracle::write_run(client.as_os_str(), &args, run, &settings).await
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

    /// One run, to its end (--once: now, whatever the newest run).
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
        // The first run of a restarted archiver waits for its turn after the newest run
        // on the server.
        if std::mem::replace(&mut self.first, false) {
            let newest =
                tidemark_mariadb::oracle::newest_run(self.client.as_os_str(), &self.client_args)
                    .await;
            let now = u64::try_from(jiff::Timestamp::now().as_second()).unwrap_or_default();
            self.next = tokio::time::Instant::now()
                + tidemark_mariadb::oracle::first_wait(newest, now, self.every);
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
