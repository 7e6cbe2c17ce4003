//! The MariaDB programs a restore, a restore test and a consolidation run, how they are
//! started (an environment without credentials, killed if dropped), and what goes wrong
//! with them: below both the restore and its private server.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use tidemark_core::RestoreRefusal;
use tidemark_store::StoreError;
use tidemark_store::transfer::TransferError;
use tokio::process::{Child, Command};

/// The environment variable that names the private server's user (`--server-user`).
pub const SERVER_USER_ENV: &str = "TIDEMARK_SERVER_USER";

/// The server user from the environment, for callers without a flag.
pub fn server_user_from_env() -> Option<OsString> {
    std::env::var_os(SERVER_USER_ENV).filter(|v| !v.is_empty())
}

/// The MariaDB programs a restore runs (names looked up in `PATH`, or paths).
#[derive(Debug, Clone)]
pub struct Tools {
    pub mariabackup: OsString,
    pub mbstream: OsString,
    pub mariadbd: OsString,
    pub mariadb_binlog: OsString,
    pub mariadb: OsString,
    /// MySQL's server (`method: mysql-clone`: the clone's recipient, and the server that
    /// reads a clone's point).
    pub mysqld: OsString,
    /// MySQL's client.
    pub mysql: OsString,
    /// MySQL's binlog decoder (a MySQL restore's replay).
    pub mysqlbinlog: OsString,
    /// The user the private server runs as when Tidemark runs as root (`--server-user`;
    /// refused without one then): see [`crate::server`].
    pub server_user: Option<OsString>,
    /// How a MariaDB restore replays binlogs ([`Replay`]).
    pub replay: Replay,
}

/// How a MariaDB restore replays its binlogs (issue 49; `--replay`). The applier by
/// default ([`Replay::applier`]); `Client` is the user's fallback (see docs/cli.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Row transactions through the private server's replication applier with `threads`
    /// parallel workers (0: its SQL thread alone); statements, and a run the applier path
    /// cannot read, through `mariadb-binlog | mariadb` ([`crate::applier`]).
    Applier { threads: u16 },
    /// Everything through `mariadb-binlog | mariadb`.
    Client,
}

impl Default for Replay {
    fn default() -> Self {
        Replay::applier()
    }
}

/// The environment variable `--replay` reads, and `tidemark run`'s restore tests.
pub const REPLAY_ENV: &str = "TIDEMARK_REPLAY";

impl Replay {
    /// [`REPLAY_ENV`]: `applier` (or unset: the default) or `client`.
    ///
    /// # Errors
    /// Any other value, named with the accepted forms.
    pub fn from_env() -> Result<Self, String> {
        let Some(v) = std::env::var_os(REPLAY_ENV) else {
            return Ok(Replay::default());
        };
        match v.to_str() {
            Some("applier") => Ok(Replay::applier()),
            Some("client") => Ok(Replay::Client),
            _ => Err(format!(
                "{REPLAY_ENV}={v:?}: expected `applier` or `client`"
            )),
        }
    }

    /// The applier's SQL thread alone (measured faster than parallel workers on two cores:
    /// docs/benchmarks.md).
    pub fn applier() -> Self {
        Replay::Applier { threads: 0 }
    }

    /// Most parallel workers the applier is given.
    pub const MAX_THREADS: u16 = 64;
}

impl Default for Tools {
    /// The programs by name, and the server user of [`crate::server::SERVER_USER_ENV`].
    fn default() -> Self {
        Tools {
            mariabackup: "mariabackup".into(),
            mbstream: "mbstream".into(),
            mariadbd: "mariadbd".into(),
            mariadb_binlog: "mariadb-binlog".into(),
            mariadb: "mariadb".into(),
            mysqld: "mysqld".into(),
            mysql: "mysql".into(),
            mysqlbinlog: "mysqlbinlog".into(),
            server_user: server_user_from_env(),
            replay: Replay::default(),
        }
    }
}

/// Which server a private server is, and on what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flavor {
    /// MariaDB's server on a mariabackup data directory (its geometry from
    /// `backup-my.cnf`).
    MariaDb,
    /// MySQL's server on a clone's data directory, with the geometry of the server it was
    /// cloned from.
    MySql(MySqlGeometry),
    /// MySQL's server receiving a clone from `donor` (`host:port`), the clone plugin loaded
    /// from the server's own plugin directory (its data directory is a new, empty one, made
    /// with the donor's geometry: a clone needs them equal).
    CloneRecipient {
        donor: String,
        geometry: MySqlGeometry,
        /// The CA the donor's certificate must be signed by (`clone_ssl_ca`).
        ca: Option<std::path::PathBuf>,
    },
}

/// What a MySQL data directory must be opened with, as the server it came from had it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MySqlGeometry {
    /// `innodb_page_size`: 4096 to 65536.
    pub page_size: u32,
    /// `lower_case_table_names`: 0, 1 or 2 (set when a data directory is made, and kept).
    pub lower_case_table_names: u32,
}

impl Default for MySqlGeometry {
    fn default() -> Self {
        MySqlGeometry {
            page_size: 16384,
            lower_case_table_names: 0,
        }
    }
}

impl MySqlGeometry {
    /// The server's options for it.
    pub fn args(&self) -> [String; 2] {
        [
            format!("--innodb-page-size={}", self.page_size),
            format!("--lower-case-table-names={}", self.lower_case_table_names),
        ]
    }
}

impl Flavor {
    /// The server program.
    pub fn server<'t>(&self, tools: &'t Tools) -> &'t OsString {
        match self {
            Flavor::MariaDb => &tools.mariadbd,
            _ => &tools.mysqld,
        }
    }

    /// The client program.
    pub fn client<'t>(&self, tools: &'t Tools) -> &'t OsString {
        match self {
            Flavor::MariaDb => &tools.mariadb,
            _ => &tools.mysql,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Refused(#[from] RestoreRefusal),
    #[error(
        "backup {id} was taken with method {method:?}; restore prepares mariabackup and mysql-clone backups only (fetch other payloads with tidemark fetch)"
    )]
    Method { id: String, method: String },
    #[error(
        "backup {id} records no binlog position (binary logging, or for MySQL gtid_mode, was off when it was taken), so binlogs cannot be replayed onto it; restore to its completion{}",
        completed.map(|c| format!(" ({c})")).unwrap_or_default()
    )]
    NoPosition {
        id: String,
        completed: Option<Timestamp>,
    },
    #[error(
        "the archive has no timeline {timeline}; it has {}: `tidemark ls` lists them",
        known.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )]
    NoTimeline { timeline: u32, known: Vec<u32> },
    #[error("backup {id} is in the plan but its metadata.json could not be read")]
    NoMetadata { id: String },
    #[error(
        "data directory {} is not empty; restore into a new or empty directory", .0.display()
    )]
    DatadirNotEmpty(PathBuf),
    #[error("{action} in {}", dir.display())]
    Io {
        action: String,
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{step} failed ({status}); last lines of its output:\n{tail}")]
    Tool {
        step: String,
        status: String,
        tail: String,
    },
    #[error(
        "mariadbd did not accept connections on {} within {secs} s{}; last lines of its log:\n{tail}",
        socket.display(),
        user.as_ref().map(|u| format!(" (it runs as {u}, who must be able to reach the data directory and the scratch directory beside it)")).unwrap_or_default()
    )]
    ServerStart {
        socket: PathBuf,
        secs: u64,
        user: Option<String>,
        tail: String,
    },
    #[error(
        "tidemark runs as root, and the private MariaDB server that replays binlogs and runs restore tests never does: name the user it runs as with --server-user USER (or {}=USER), a user of its own that owns nothing else (not mysql on a database host); that user is handed the restored data directory ({}) and must be able to reach it",
        SERVER_USER_ENV,
        dir.display()
    )]
    ServerAsRoot { dir: PathBuf },
    #[error(
        "MySQL backup {id} does not hold all that binlog segment {segment} starts after: {missing} are in no segment the replay takes (a clone of a replica far behind its primary?), so the restore would miss them; restore to the backup's own point{}, or from another backup",
        completed.map(|c| format!(" ({c})")).unwrap_or_default()
    )]
    MySqlGap {
        id: String,
        segment: String,
        missing: String,
        completed: Option<Timestamp>,
    },
    #[error("the MySQL source {source_server}: {problem}")]
    Source {
        source_server: String,
        problem: String,
    },
    #[error("server user {user:?}: {problem}")]
    ServerUser { user: String, problem: String },
    #[error(
        "binlog segment {segment}, byte {offset}{}: a row event writes {table}, a table of the server's own (accounts, grants, its replication state), which a restore's replay never writes: rows written straight into it, or a segment forged by whoever can write the bucket, would reach the restored server with no right checked. Restore to an instant before it (`tidemark ls` shows the window), or make that change again after the restore",
        gtid.as_ref().map(|g| format!(" (GTID {g})")).unwrap_or_default()
    )]
    SystemRows {
        segment: String,
        offset: u64,
        gtid: Option<String>,
        table: String,
    },
    #[error(transparent)]
    Options(#[from] crate::cnf::Refused),
    #[error(transparent)]
    Transfer(#[from] TransferError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the private server that replays runs with: nothing is
/// flushed per transaction and pages are written once (issue 32 §3), since the data
/// directory counts only after a clean shutdown, which writes everything.
pub const REPLAY_SETTINGS: [&str; 2] = [
    "--innodb-flush-log-at-trx-commit=2",
    "--innodb-doublewrite=0",
];

/// The environment every tool a restore, a check or a consolidation runs keeps (besides
/// what the caller sets for it): what finds programs and reads text, nothing that holds a
/// credential. The tools read files from the bucket; none of them is handed the store's
/// keys or an identity, whatever it is made to run.
pub(crate) const KEPT_ENV: [&str; 4] = ["PATH", "LANG", "LC_ALL", "TZ"];

/// Gives `cmd` this process's [`KEPT_ENV`] and what was set on it explicitly, nothing else.
pub(crate) fn hermetic(cmd: &mut Command) -> &mut Command {
    let explicit: Vec<(OsString, OsString)> = cmd
        .as_std()
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    cmd.env_clear()
        .envs(
            KEPT_ENV
                .iter()
                .filter_map(|k| Some((*k, std::env::var_os(k)?))),
        )
        .envs(explicit)
}

/// Starts a tool with [`hermetic`] environment, killed if dropped.
pub(crate) fn spawn(cmd: &mut Command, program: &OsString) -> Result<Child, RestoreError> {
    hermetic(cmd)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| RestoreError::Spawn {
            program: program.to_string_lossy().into_owned(),
            source,
        })
}

/// An empty directory under `work` for `--plugin-dir`: no library is found there.
pub(crate) fn no_plugin_dir(work: &Path) -> Result<PathBuf, RestoreError> {
    let dir = work.join("no-plugins");
    std::fs::create_dir_all(&dir).map_err(|source| RestoreError::Io {
        action: "creating an empty plugin directory".into(),
        dir: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// `--local-load=<work>/load` for a binlog decoder, the directory made (mode 0700): where
/// `mariadb-binlog` and `mysqlbinlog` write the data of a `LOAD DATA` event they decode.
/// Their default is the system's temporary directory, under a name the binlog sets
/// (`SQL_LOAD_MB-1-0`): a forged segment would write a file there, as root, through any
/// link a local user left at that name. (The client then refuses the `LOAD DATA LOCAL`.)
///
/// # Errors
/// The directory cannot be made.
pub(crate) fn local_load(work: &Path) -> Result<String, RestoreError> {
    use std::os::unix::fs::DirBuilderExt as _;
    let dir = work.join("load");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() {
                Ok(())
            } else {
                Err(e)
            }
        })
        .map_err(|source| RestoreError::Io {
            action: "creating the decoder's LOAD DATA directory".into(),
            dir: dir.clone(),
            source,
        })?;
    Ok(format!("--local-load={}", dir.display()))
}

/// The last lines of a tool's output, for an error message.
pub(crate) fn tail(text: &str) -> String {
    const LINES: usize = 15;
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LINES)..].join("\n")
}

/// The error of `action` on `dir`, for `map_err`: `io_error("reading the clone", &dir)`.
pub(crate) fn io_error(action: &str, dir: &Path) -> impl FnOnce(std::io::Error) -> RestoreError {
    let (action, dir) = (action.to_owned(), dir.to_path_buf());
    move |source| RestoreError::Io {
        action,
        dir,
        source,
    }
}

/// The error of a tool whose pipe could not be had.
pub(crate) fn no_pipe(step: &str) -> RestoreError {
    RestoreError::Tool {
        step: step.into(),
        status: "no pipe to the process".into(),
        tail: String::new(),
    }
}
