//! Binlogs read from a server over the network, as a replica client: `mariadb-binlog
//! --read-from-remote-server --raw` copies the server's binlog files into a local spool
//! directory, and the ordinary archiver ([`crate::archive::archive_pass`]) ships the closed
//! ones. Nothing on the database's machine changes; the spool can be thrown away (files are
//! fetched again from the first one not archived yet).
//!
//! # Following the primary
//! The server behind the connection options may change (a Service that follows the
//! primary's role label, after a failover). The spool records which server its files came
//! from; a fetch from another server clears it first, and starts where that server's
//! timeline needs ([`RemoteServer::first_to_fetch`]): after the last file archived from it,
//! or — a server the archive has no timeline of — at its newest file whose start the
//! archive already holds, found with `BINLOG_GTID_POS`. So nothing it wrote is skipped
//! because the old primary used the same file names.
//!
//! The connection options (`--host`, `--port`, `--user`, and `--defaults-extra-file` for the
//! password — never `--password` on a command line) are given once and passed to both
//! `mariadb` (to ask `SHOW BINARY LOGS`) and `mariadb-binlog`. Error messages name the
//! program and show the end of its output, never its arguments.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tidemark_store::index::SegmentIndex;
use tidemark_store::{ClusterStore, Progress};

use crate::archive::{ArchiveError, ArchiveReport, Primary, archive_pass_as};

/// Where the spool's own index (the archiver's input) is written.
pub const SPOOL_INDEX: &str = "tidemark-spool.index";
/// The server id the spooled files came from.
pub const SPOOL_SERVER: &str = "tidemark-spool.server";

/// A server read over the network.
#[derive(Debug, Clone)]
pub struct RemoteServer {
    /// Connection options for `mariadb` and `mariadb-binlog` (first: an option file).
    pub client_args: Vec<String>,
    /// Where fetched files are kept until shipped.
    pub spool: PathBuf,
    pub mariadb: PathBuf,
    pub mariadb_binlog: PathBuf,
    /// Which server may start a timeline: the one this archiver reads, unless the cluster
    /// confirmed another (`--primary-server-id`).
    pub primary: Primary,
    /// The server is MySQL (`--engine mysql`): `mariadb` and `mariadb_binlog` are then
    /// MySQL's `mysql` and `mysqlbinlog`, and a new server's first file is found by its
    /// `Previous_gtids`.
    pub mysql: bool,
    /// The replication server id it reads the binlog as: [`connection_server_id`].
    pub connection_server_id: u32,
}

/// How many of a new MySQL server's newest files are asked their `Previous_gtids` (the
/// oldest listed is fetched from when none of them fits).
const MYSQL_FILES_ASKED: usize = 64;

/// The replication server id an archiver reads a server's binlog as (`mariadb-binlog
/// --stop-never-slave-server-id`, `mysqlbinlog --connection-server-id`), derived from the
/// store's URL and the cluster: in 1879048192..=2147483647, far from the small ids servers
/// are given. Both programs' default is 1, often a replica's own id: the primary then drops
/// one of the two connections each time the other connects (`A slave with the same
/// server_uuid/server_id as this slave has connected to the master`), and the archive
/// stalls while the replica keeps reconnecting (found by the chaos soak: the window's end
/// stood still for three minutes after a failover). Archivers of one store and cluster
/// share it (the newest connection wins, as a rollout wants); others do not collide.
pub fn connection_server_id(store_url: &str, cluster: &str) -> u32 {
    // FNV-1a: stable across builds and platforms.
    let mut h: u32 = 0x811c_9dc5;
    for b in store_url.bytes().chain([b'\n']).chain(cluster.bytes()) {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    0x7000_0000 | (h & 0x0FFF_FFFF)
}

/// How long a follower may stand still (no file of its spool grows, none is added) while
/// the server has more than its newest file, before it is started again: a
/// connection that died without the reader hearing of it (no FIN or RST reached it)
/// otherwise stalls the archive for good, and the lag alarm, which reads the spool, with
/// it. The readers write each event as it comes (MariaDB's and MySQL's, measured), so a
/// follower that keeps up never lags for long.
pub const FOLLOWER_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// The bytes of a follower's standard error kept for its message when it stops.
const FOLLOWER_STDERR_KEPT: usize = 8192;

/// How long one query to the server may take (the client is killed then): a server or a
/// network that stopped answering would otherwise hold an archive pass, and every one
/// after it, for good.
const QUERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A running `mariadb-binlog --stop-never` ([`RemoteServer::follow`]).
#[derive(Debug)]
pub struct Follower {
    child: tokio::process::Child,
    /// The end of its standard error, read as it is written.
    stderr: Option<tokio::task::JoinHandle<Vec<u8>>>,
    /// The spool's files and their lengths when a check found it behind the server, and
    /// since when they have been so.
    seen: Option<(Vec<(String, u64)>, std::time::Instant)>,
}

impl Follower {
    /// Whether it exited, without waiting.
    ///
    /// # Errors
    /// The process cannot be asked.
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child.try_wait()
    }

    /// Stops it (when running) and returns the last `lines` lines it wrote to its standard
    /// error, joined by ` | `.
    pub async fn stop(mut self, lines: usize) -> String {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        let Some(task) = self.stderr.take() else {
            return String::new();
        };
        let kept = tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&kept);
        let last: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .rev()
            .take(lines)
            .collect();
        last.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

/// Why reading from the server failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed ({status}): {output}")]
    Failed {
        program: String,
        status: String,
        output: String,
    },
    #[error(
        "{program} had no answer to {query} within {secs} s (stopped): is the server hung, or the network to it cut?"
    )]
    NoAnswer {
        program: String,
        query: String,
        secs: u64,
    },
    #[error("the server lists no binary logs (SHOW BINARY LOGS is empty): is log_bin on?")]
    NoBinlogs,
    /// The server lacks a setting or the account a grant (issue 46 §1): each named, with
    /// the statement that fixes it.
    #[error("{0}")]
    Unfit(String),
    #[error("the server's answer to {query} is not what was asked for: {answer:?}")]
    Answer { query: String, answer: String },
    #[error("spool directory {}: {source}", path.display())]
    Spool {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Archive(#[from] ArchiveError),
}

/// The last lines of a tool's output, for an error message.
/// Runs `cmd` to its end; its output when it exited 0, else the error naming `program`
/// with the end of its stderr.
async fn succeeded(
    program: String,
    cmd: &mut tokio::process::Command,
) -> Result<std::process::Output, RemoteError> {
    cmd.env_remove(tidemark_store::crypt::IDENTITY_ENV);
    let out = cmd.output().await.map_err(|source| RemoteError::Spawn {
        program: program.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(RemoteError::Failed {
            program,
            status: out.status.to_string(),
            output: tail(&out.stderr),
        });
    }
    Ok(out)
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

impl RemoteServer {
    fn program(p: &Path) -> String {
        p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }

    /// The server's binlog files, oldest first.
    ///
    /// # Errors
    /// `mariadb` cannot run or fails; the server has no binlogs.
    pub async fn server_files(&self) -> Result<Vec<String>, RemoteError> {
        Ok(self
            .binary_logs()
            .await?
            .into_iter()
            .map(|(name, _)| name)
            .collect())
    }

    /// Runs one query and returns its answer (batch, no column names), within
    /// [`QUERY_TIMEOUT`].
    pub(crate) async fn query(&self, sql: &str) -> Result<String, RemoteError> {
        let program = Self::program(&self.mariadb);
        let mut cmd = tokio::process::Command::new(&self.mariadb);
        cmd.args(&self.client_args)
            .args(["-N", "-B", "-e", sql])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(QUERY_TIMEOUT, succeeded(program.clone(), &mut cmd))
            .await
            .map_err(|_| RemoteError::NoAnswer {
                program,
                query: sql.chars().take(200).collect(),
                secs: QUERY_TIMEOUT.as_secs(),
            })??;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// What the server says of its settings and of the account's grants.
    ///
    /// # Errors
    /// `mariadb` cannot run or fails; the server is not of the engine named
    /// ([`RemoteError::Unfit`]); the answer is not the settings asked for.
    pub async fn settings(&self) -> Result<crate::requirements::Server, RemoteError> {
        // Which server it is, first: each has settings the other lacks.
        let version = self.query("SELECT @@version").await?;
        let mysql = !version.contains("MariaDB");
        if mysql != self.mysql {
            return Err(RemoteError::Unfit(if mysql {
                format!(
                    "the server is MySQL {version}: pass --engine mysql (MySQL's mysql and mysqlbinlog read it)"
                )
            } else {
                format!("the server is {version}: leave out --engine mysql")
            }));
        }
        let query = if self.mysql {
            let newer = crate::clone::version_of(version.trim()).is_none_or(|v| v >= (8, 0, 26));
            if newer {
                crate::requirements::MYSQL_SETTINGS_SQL
            } else {
                crate::requirements::MYSQL_OLD_SETTINGS_SQL
            }
        } else {
            crate::requirements::SETTINGS_SQL
        };
        let answer = self.query(query).await?;
        crate::requirements::parse(&answer).map_err(|_| RemoteError::Answer {
            query: query.into(),
            answer,
        })
    }

    /// Checks what an archive pass needs of the server (and, with `purge`, what purging its
    /// binlogs needs); the server's id.
    ///
    /// # Errors
    /// As [`RemoteServer::settings`]; [`RemoteError::Unfit`] naming every setting and grant
    /// missing.
    pub async fn check(&self, purge: bool) -> Result<u32, RemoteError> {
        let server = self.settings().await?;
        let task = if purge {
            "a purge of binlogs"
        } else {
            "a binlog archive pass"
        };
        if let Some(why) = server.for_archive(purge).refusal(task) {
            return Err(RemoteError::Unfit(why));
        }
        u32::try_from(server.server_id).map_err(|_| RemoteError::Answer {
            query: "SELECT @@server_id".into(),
            answer: server.server_id.to_string(),
        })
    }

    /// The server id the spooled files came from, if recorded.
    pub fn spool_server(&self) -> Option<u32> {
        std::fs::read_to_string(self.spool.join(SPOOL_SERVER))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Makes the spool `server_id`'s: files another server wrote are removed (they carry
    /// the same names as its own, and are archived already or part of another timeline).
    /// A closed file of the old server not shipped yet goes with them: what it holds the
    /// new primary replicated (its timeline starts at its own newest file the archive
    /// holds the start of), or is a branch the failover lost.
    fn claim_spool(&self, server_id: u32) -> Result<(), RemoteError> {
        self.make_spool()?;
        if self.spool_server() == Some(server_id) {
            return Ok(());
        }
        if let Ok(names) = self.spooled() {
            for n in names {
                let _ = std::fs::remove_file(self.spool.join(n));
            }
        }
        let marker = self.spool.join(SPOOL_SERVER);
        std::fs::write(&marker, format!("{server_id}\n")).map_err(|source| RemoteError::Spool {
            path: marker,
            source,
        })
    }

    /// The file to fetch from. For a server the archive has a timeline of: the first file
    /// after the last archived from it (or its newest, which is being written, when
    /// everything else is archived). For another server (a new primary): its newest file
    /// whose starting GTID position the archive's newest timeline already holds — the
    /// first GTID not archived is in it — or its oldest. The spool becomes that server's.
    ///
    /// # Errors
    /// As [`RemoteServer::server_files`]; the store's index cannot be read.
    pub async fn first_to_fetch(&self, store: &ClusterStore) -> Result<String, RemoteError> {
        use tidemark_core::timeline::{file_number, timeline_of};
        // What the pass needs of the server, before anything is read from it.
        let server_id = self.check(false).await?;
        let files = self.server_files().await?;
        self.claim_spool(server_id)?;
        let index = SegmentIndex::load(store)
            .await
            .map_err(|e| RemoteError::Archive(e.into()))?;
        let Some(index) = index else {
            return Ok(files.first().cloned().unwrap_or_default());
        };
        let seq = |n: &str| tidemark_core::inventory::segment_sequence(n).unwrap_or(0);
        let timelines = &index.head.timelines;
        let runs = index.runs();
        let newest_timeline = timelines.iter().map(|t| t.id).max().unwrap_or(0);
        // This server's timeline: recorded with its id, or the first timeline of an archive
        // that records no writer.
        let mine = timelines
            .iter()
            .filter(|t| t.server_id == Some(server_id))
            .map(|t| t.id)
            .max()
            .or_else(|| {
                timelines
                    .iter()
                    .all(|t| t.id == 0 && t.server_id.is_none())
                    .then_some(0)
            });
        if let Some(t) = mine {
            let archived = runs
                .iter()
                .filter(|r| timeline_of(r.last_sequence) == t)
                .map(|r| file_number(r.last_sequence))
                .max();
            let newest = files.last().map(|f| seq(f));
            // A server whose numbering is behind what was archived from it started over.
            if archived.is_none_or(|a| newest.is_some_and(|n| n >= a)) {
                return Ok(files
                    .iter()
                    .find(|f| archived.is_none_or(|a| seq(f) > a))
                    .or(files.last())
                    .cloned()
                    .unwrap_or_default());
            }
        }
        if self.mysql {
            return self.mysql_first(&index, newest_timeline, &files).await;
        }
        // Another server: its newest file whose start the archive's newest timeline holds
        // (that server wrote those numbers: after a failover the new primary's own
        // transactions share numbers with the old one's last ones).
        let mut newest: Vec<&tidemark_store::format::IndexEntry> = index
            .entries()
            .filter(|e| timeline_of(e.sequence) == newest_timeline && e.gtid_list.is_some())
            .collect();
        newest.sort_by_key(|e| e.sequence);
        if let Some(first) = newest.first() {
            let base = first.gtid_list.clone().unwrap_or_default();
            let runs: Vec<tidemark_core::GtidRun> = newest
                .iter()
                .flat_map(|e| e.gtids.iter().copied())
                .collect();
            for f in files.iter().rev() {
                let answer = self
                    .query(&format!("SELECT BINLOG_GTID_POS('{f}', 4)"))
                    .await?;
                let Ok(start) = tidemark_core::GtidPos::parse(&answer) else {
                    continue;
                };
                if tidemark_core::gtid::history_holds(&base, &runs, &start) {
                    return Ok(f.clone());
                }
            }
        }
        Ok(files.first().cloned().unwrap_or_default())
    }

    /// A MySQL server the archive has no timeline of (a new primary): its newest file whose
    /// `Previous_gtids` (its history when the file was opened, read with `SHOW BINLOG
    /// EVENTS`) the archive's newest timeline holds — so its first transaction not archived
    /// is in it or later — else its oldest. The archive pass then starts the timeline
    /// where the local archiver would.
    async fn mysql_first(
        &self,
        index: &SegmentIndex,
        newest_timeline: u32,
        files: &[String],
    ) -> Result<String, RemoteError> {
        use tidemark_core::timeline::timeline_of;
        let held = index
            .entries()
            .filter(|e| timeline_of(e.sequence) == newest_timeline)
            .max_by_key(|e| e.sequence)
            .and_then(|e| Some(e.previous_gtids.as_ref()?.union(e.gtid_set.as_ref()?)));
        let oldest = files.first().cloned().unwrap_or_default();
        let Some(held) = held else {
            return Ok(oldest);
        };
        // The newest files only: each is one question, and a server may list thousands.
        for f in files.iter().rev().take(MYSQL_FILES_ASKED) {
            // A name from the server's answer goes into a statement: only a segment name.
            if !tidemark_store::layout::is_segment_name(f) {
                continue;
            }
            let answer = self
                .query(&format!("SHOW BINLOG EVENTS IN '{f}' LIMIT 2"))
                .await?;
            let previous = answer.lines().find_map(|line| {
                let columns: Vec<&str> = line.split('\t').collect();
                (columns.get(2) == Some(&"Previous_gtids")).then(|| {
                    columns
                        .get(5)
                        .copied()
                        .unwrap_or_default()
                        .replace("\\n", "")
                })
            });
            let Some(Ok(previous)) =
                previous.map(|p| tidemark_core::gtidset::GtidSet::parse(p.trim()))
            else {
                continue;
            };
            if previous.is_subset(&held) {
                return Ok(f.clone());
            }
        }
        Ok(oldest)
    }

    /// `mariadb-binlog --read-from-remote-server --raw --to-last-log` from `first` into the
    /// spool; with `follow`, `--stop-never` (it keeps reading as the server writes).
    fn command(&self, first: &str, follow: bool) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.mariadb_binlog);
        c.args(&self.client_args)
            .args(["--read-from-remote-server", "--raw", "--to-last-log"])
            .arg(format!("--result-file={}/", self.spool.display()));
        if follow {
            c.arg("--stop-never");
            let id = self.connection_server_id;
            c.arg(if self.mysql {
                format!("--connection-server-id={id}")
            } else {
                format!("--stop-never-slave-server-id={id}")
            });
        }
        c.arg(first).stdin(Stdio::null());
        c
    }

    fn make_spool(&self) -> Result<(), RemoteError> {
        std::fs::create_dir_all(&self.spool).map_err(|source| RemoteError::Spool {
            path: self.spool.clone(),
            source,
        })
    }

    /// Makes the spool, and drops a stale copy before a fetch from `first`: the spool's
    /// newest file, when numbered before `first`, was the server's open file at the last
    /// fetch — possibly cut short — and the archive has it whole from elsewhere (`first` goes
    /// past only what the archive holds). Kept, it would be shipped as a closed file of a
    /// binlog that seems to start over, on a timeline of its own. Older spool files were
    /// whole when fetched and stay, for an upload that failed.
    fn prepare_spool(&self, first: &str) -> Result<(), RemoteError> {
        self.make_spool()?;
        let seq = |n: &str| tidemark_core::inventory::segment_sequence(n);
        if let (Some(newest), Some(first)) = (self.spooled()?.pop(), seq(first))
            && seq(&newest).is_some_and(|n| n < first)
        {
            let path = self.spool.join(&newest);
            std::fs::remove_file(&path).map_err(|source| RemoteError::Spool { path, source })?;
        }
        Ok(())
    }

    /// Fetches everything from `first` to the end of the server's newest file, and exits.
    ///
    /// # Errors
    /// `mariadb-binlog` cannot run or fails.
    pub async fn fetch(&self, first: &str) -> Result<(), RemoteError> {
        self.prepare_spool(first)?;
        succeeded(
            Self::program(&self.mariadb_binlog),
            &mut self.command(first, false),
        )
        .await?;
        Ok(())
    }

    /// Starts fetching from `first` and keeps reading as the server writes.
    ///
    /// # Errors
    /// `mariadb-binlog` cannot run.
    pub fn follow(&self, first: &str) -> Result<Follower, RemoteError> {
        self.prepare_spool(first)?;
        let mut child = self
            .command(first, true)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env_remove(tidemark_store::crypt::IDENTITY_ENV)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| RemoteError::Spawn {
                program: Self::program(&self.mariadb_binlog),
                source,
            })?;
        // Read as it is written: a pipe nobody reads stops the reader once full.
        let stderr = child.stderr.take().map(|mut e| {
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut kept = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n) = e.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    kept.extend_from_slice(&buf[..n]);
                    let over = kept.len().saturating_sub(FOLLOWER_STDERR_KEPT);
                    kept.drain(..over);
                }
                kept
            })
        });
        Ok(Follower {
            child,
            stderr,
            seen: None,
        })
    }

    /// Whether `follower` stands still behind the server (see [`FOLLOWER_STALL`]): what
    /// the server has and the spool's newest file, when it does.
    ///
    /// # Errors
    /// The server cannot be asked.
    pub async fn stalled(&self, follower: &mut Follower) -> Result<Option<String>, RemoteError> {
        let Some((name, size)) = self.binary_logs().await?.pop() else {
            return Ok(None);
        };
        // Every spooled file and its length: a follower fetching older files again (after
        // a restart, with closed files not shipped yet) moves on though the newest stays.
        let spooled: Vec<(String, u64)> = self
            .spooled()?
            .into_iter()
            .map(|n| {
                let len = std::fs::metadata(self.spool.join(&n)).map_or(0, |m| m.len());
                (n, len)
            })
            .collect();
        let seq = |n: &str| tidemark_core::inventory::segment_sequence(n).unwrap_or(0);
        let behind = spooled
            .last()
            .is_none_or(|(n, len)| (seq(&name), size) > (seq(n), *len));
        let now = std::time::Instant::now();
        // Standing still counts from the first check that found it behind with the spool
        // as it is now: any move of the spool, or a check that found it level, starts over.
        let since = match &follower.seen {
            Some((seen, since)) if behind && *seen == spooled => *since,
            _ => {
                follower.seen = Some((spooled, now));
                return Ok(None);
            }
        };
        let stood = now.duration_since(since);
        Ok((stood >= FOLLOWER_STALL).then(|| {
            format!(
                "the server has {name} up to byte {size}, the spool {} for {} s",
                spooled.last().map_or_else(
                    || "nothing".to_owned(),
                    |(n, len)| format!("{n} up to byte {len}")
                ),
                stood.as_secs()
            )
        }))
    }

    /// The spool's binlog files, by sequence.
    fn spooled(&self) -> Result<Vec<String>, RemoteError> {
        let entries = std::fs::read_dir(&self.spool).map_err(|source| RemoteError::Spool {
            path: self.spool.clone(),
            source,
        })?;
        let mut names: Vec<(u64, String)> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| tidemark_store::layout::is_segment_name(n))
            .filter_map(|n| tidemark_core::inventory::segment_sequence(&n).map(|s| (s, n)))
            .collect();
        names.sort();
        Ok(names.into_iter().map(|(_, n)| n).collect())
    }

    /// Ships the spool's closed files (all but the newest, which the server may still be
    /// writing) with the ordinary archiver, then removes the shipped ones from the spool.
    ///
    /// # Guarantees
    /// Deletes a spool file only after the archive holds it (uploaded and indexed).
    ///
    /// # Errors
    /// The spool cannot be read or written; as [`crate::archive::archive_pass_as`].
    pub async fn ship(
        &self,
        store: &ClusterStore,
        progress: &dyn Progress,
    ) -> Result<ArchiveReport, RemoteError> {
        let mut files = self.spooled()?;
        // A file another server wrote (the address reached another server between the
        // check and the fetch) is not that server's to ship here: it goes, and is fetched
        // again from its own server when the archiver reads that one.
        if let Some(spool_server) = self.spool_server() {
            let mut kept = Vec::with_capacity(files.len());
            for f in files {
                let path = self.spool.join(&f);
                let writer = std::fs::File::open(&path)
                    .ok()
                    .and_then(|mut file| crate::binlog::head(&mut file).ok())
                    .and_then(|h| h.server_id);
                if writer.is_some_and(|w| w != spool_server) {
                    tracing::warn!(
                        file = f,
                        server = ?writer,
                        spool_server,
                        "a spooled binlog is another server's: dropped, not archived"
                    );
                    let _ = std::fs::remove_file(&path);
                } else {
                    kept.push(f);
                }
            }
            files = kept;
        }
        let index = self.spool.join(SPOOL_INDEX);
        let text: String = files.iter().map(|f| format!("{f}\n")).collect();
        std::fs::write(&index, text).map_err(|source| RemoteError::Spool {
            path: index.clone(),
            source,
        })?;
        if files.is_empty() {
            return Ok(ArchiveReport::default());
        }
        let report = archive_pass_as(store, &index, self.primary, progress).await?;
        // Everything but the newest is in the archive now (shipped now or before).
        for f in &files[..files.len() - 1] {
            let _ = std::fs::remove_file(self.spool.join(f));
        }
        Ok(report)
    }
}
