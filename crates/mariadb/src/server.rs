//! The private `mariadbd` a restore replays binlogs on and a restore test checks.
//!
//! What it runs is not trusted: a binlog segment or a backup in the bucket may be a bucket
//! writer's, and a primary may lie. So the server is walled in three ways (issue 42 §1):
//!
//! - **It never runs as root.** As root, Tidemark starts it as the user named by
//!   `--server-user` (refused without one) and hands that user the data directory and a
//!   directory of the server's own; whatever a statement could make the server write, the
//!   file system only lets that user write.
//! - **Nothing replayed holds a global right.** The grant tables are loaded; Tidemark
//!   logs in with an administrator account of its own (made by `--init-file`, random name
//!   and password), and replays as an account made before each timeline's run with only
//!   what a binlog's statements and rows need on the databases ([`REPLAY_GRANTS`]): no
//!   `SUPER` (no `SET GLOBAL general_log_file`, `slow_query_log_file`, …), no `SET USER`
//!   (no routine, view or trigger running as another account), no `FILE`, no write to the
//!   `mysql` schema (no account forged in the grant tables, then reloaded). A restore
//!   test's checks run as a read-only account.
//! - **No option opens a file.** No options file, an empty plugin directory, symbolic links
//!   off (`DATA DIRECTORY`/`INDEX DIRECTORY` are ignored), no file read or written through
//!   SQL (`secure_file_priv`, no `LOCAL`), no event scheduler, no replication started from
//!   a restored replica's `master.info`, no network.
//!
//! Both accounts are dropped before the server stops, so the restored data holds none of
//! them; a restore whose accounts cannot be dropped (a replayed statement removed the
//! administrator's rights) fails.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

pub use crate::tools::SERVER_USER_ENV;
use crate::tools::{Flavor, REPLAY_SETTINGS, RestoreError, Tools, no_plugin_dir, spawn, tail};

/// A `mariadbd` of Tidemark's own on a restored data directory: no network, no binary
/// log, its socket, pid file, tmpdir and log in a directory of its own.
#[derive(Debug)]
pub(crate) struct PrivateServer {
    child: Child,
    pub(crate) socket: PathBuf,
    log: PathBuf,
    /// Where Tidemark's logins are (`<work>/logins`, never the server's).
    logins: PathBuf,
    /// Tidemark's administrator login (made by the server's `--init-file`).
    admin: Login,
    /// The accounts made so far, dropped at [`PrivateServer::stop`].
    made: Vec<String>,
    /// The short directory holding the socket when `work` is too deep for one.
    _socket_dir: Option<tempfile::TempDir>,
    /// The client that logs in (MariaDB's or MySQL's).
    client: std::ffi::OsString,
    /// MySQL's (whose accounts and grants differ), or MariaDB's.
    mysql: bool,
}

/// What a client logs in with: a client options file (mode 0600) naming the account and
/// its password, passed as `--defaults-file` so no password is on a command line.
#[derive(Debug, Clone)]
pub(crate) struct Login {
    file: PathBuf,
    user: String,
}

impl Login {
    #[cfg(test)]
    pub(crate) fn new(file: PathBuf, user: &str) -> Self {
        Login {
            file,
            user: user.to_owned(),
        }
    }

    /// The client's first arguments: the options file, and the server's socket.
    pub(crate) fn args(&self, socket: &Path) -> [String; 2] {
        [
            format!("--defaults-file={}", self.file.display()),
            format!("--socket={}", socket.display()),
        ]
    }
}

/// The accounts a client works as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Account {
    /// Applies a binlog: [`REPLAY_GRANTS`].
    Replay,
    /// Runs a restore test's checks (`CHECK TABLE`, the user's query): reads only.
    Check,
    /// Loads a MySQL dump: [`MYSQL_LOAD_GRANTS`].
    Load,
}

/// What the replay account is granted: what a replica's applier needs for the statements
/// and rows of a binlog, on every database but `mysql`, which it may read only.
///
/// - Global: `BINLOG REPLAY` (the `BINLOG` statements of row events, and the session's
///   `gtid_seq_no`, `server_id`, `pseudo_thread_id` that `mariadb-binlog` sets), `CREATE
///   USER` (account statements), `RELOAD` (a replayed `FLUSH PRIVILEGES`). Not `SUPER`,
///   `SET USER`, `FILE`, `SHUTDOWN`, `PROCESS`, or any admin right: a global setting
///   (`general_log_file`, `slow_query_log_file`) is refused, and so is a routine, view,
///   trigger or event with another account as its definer.
/// - On the databases (a pattern, so databases the binlog creates are covered): every
///   database right — without `GRANT OPTION`: a role of its own (`CREATE ROLE`, `GRANT …
///   ON \`%\`.* TO` it, `SET ROLE`) or a grant `TO PUBLIC` would add the pattern's rights
///   on `mysql` too.
/// - On `mysql`: `SELECT` only. The grant tables can be changed through account
///   statements, never written directly: a row forged there and reloaded by `FLUSH
///   PRIVILEGES` would give the replay account's own routines any right.
///
/// A binlog that creates an object with another definer, grants a right, or writes the
/// `mysql` schema fails the replay, naming the right it lacks.
pub const REPLAY_GRANTS: [&str; 3] = [
    "GRANT BINLOG REPLAY, CREATE USER, RELOAD ON *.* TO {account}",
    "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, REFERENCES, INDEX, ALTER, \
     CREATE TEMPORARY TABLES, LOCK TABLES, EXECUTE, CREATE VIEW, SHOW VIEW, CREATE ROUTINE, \
     ALTER ROUTINE, EVENT, TRIGGER, DELETE HISTORY ON `%`.* TO {account}",
    "GRANT SELECT ON `mysql`.* TO {account}",
];

/// Every data right on every database (a pattern: those a binlog or a dump creates too),
/// without `GRANT OPTION`: MySQL's replay and load accounts hold it.
macro_rules! mysql_data_rights {
    () => {
        "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, REFERENCES, INDEX, ALTER, \
         CREATE TEMPORARY TABLES, LOCK TABLES, EXECUTE, CREATE VIEW, SHOW VIEW, CREATE ROUTINE, \
         ALTER ROUTINE, EVENT, TRIGGER ON `%`.* TO {account}"
    };
}

/// What the replay account may do on MySQL: what `mysqlbinlog`'s output of a binlog needs,
/// on every database but `mysql`, which it may read only (an exact database grant outranks
/// the pattern). `REPLICATION_APPLIER` runs the `BINLOG` statements of row events — each
/// event still checked against the account's table rights, so a row forged into
/// `mysql.user` is refused — and `SESSION_VARIABLES_ADMIN` the session settings and
/// `gtid_next` it sets. Not `SUPER`, `SYSTEM_VARIABLES_ADMIN` (no global setting), `FILE`,
/// `SET_ANY_DEFINER` (no object with another definer) or `GRANT OPTION`.
pub const MYSQL_REPLAY_GRANTS: [&str; 3] = [
    "GRANT REPLICATION_APPLIER, SESSION_VARIABLES_ADMIN, CREATE USER, RELOAD ON *.* TO {account}",
    mysql_data_rights!(),
    "GRANT SELECT ON `mysql`.* TO {account}",
];

/// What the account that loads a MySQL dump may do: the data rights of
/// [`MYSQL_REPLAY_GRANTS`] and the session settings a dump makes (`SQL_LOG_BIN`), and no
/// more — a dump holds no account statement (a forged `CREATE USER` would outlive the load)
/// and no `BINLOG` statement.
pub const MYSQL_LOAD_GRANTS: [&str; 3] = [
    "GRANT SESSION_VARIABLES_ADMIN ON *.* TO {account}",
    mysql_data_rights!(),
    "GRANT SELECT ON `mysql`.* TO {account}",
];

/// What the check account is granted: reading every table and view, and calling routines.
const CHECK_GRANTS: [&str; 1] = ["GRANT SELECT, SHOW VIEW, EXECUTE ON *.* TO {account}"];

/// The user the server runs as, when Tidemark runs as root.
#[derive(Debug, Clone)]
pub(crate) struct ServerUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl ServerUser {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

/// Who the private server would run as: `None` when Tidemark does not run as root (the
/// server runs as this process's user), else the user `tools` names.
///
/// # Errors
/// Root without a server user ([`RestoreError::ServerAsRoot`]); a user that does not exist
/// or is root itself.
pub(crate) async fn server_user(
    tools: &Tools,
    datadir: &Path,
) -> Result<Option<ServerUser>, RestoreError> {
    if !rustix::process::geteuid().is_root() {
        return Ok(None);
    }
    let Some(name) = &tools.server_user else {
        return Err(RestoreError::ServerAsRoot {
            dir: datadir.to_path_buf(),
        });
    };
    let name = name.to_string_lossy().into_owned();
    let refused = |problem: String| RestoreError::ServerUser {
        user: name.clone(),
        problem,
    };
    let id = |flag: &'static str| {
        let name = name.clone();
        async move {
            let out = Command::new("id")
                .arg(flag)
                .arg("--")
                .arg(&name)
                .stdin(Stdio::null())
                .output()
                .await
                .map_err(|e| format!("cannot run id: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "no such user ({})",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u32>()
                .map_err(|e| format!("id {flag} printed no number: {e}"))
        }
    };
    let uid = id("-u").await.map_err(refused)?;
    let gid = id("-g").await.map_err(refused)?;
    if uid == 0 {
        return Err(refused(
            "it is root: the private server never runs as root".into(),
        ));
    }
    Ok(Some(ServerUser { name, uid, gid }))
}

/// Refuses, before anything is downloaded, a server that could not be started as it must:
/// Tidemark runs as root and no `--server-user` is named, or the one named is unknown or
/// root.
///
/// # Errors
/// As [`server_user`].
pub async fn check_server_user(tools: &Tools, datadir: &Path) -> Result<(), RestoreError> {
    server_user(tools, datadir).await.map(|_| ())
}

/// Lets the server's user (its group) through `dir`, a directory of Tidemark's between the
/// file system and the server's own (mode 0710: others still see nothing).
///
/// # Errors
/// The change is refused.
pub(crate) async fn open_to_server(tools: &Tools, dir: &Path) -> Result<(), RestoreError> {
    let Some(user) = server_user(tools, dir).await? else {
        return Ok(());
    };
    use std::os::unix::fs::PermissionsExt as _;
    let io = |source| RestoreError::Io {
        action: format!("letting {} through the directory", user.name),
        dir: dir.to_path_buf(),
        source,
    };
    std::os::unix::fs::lchown(dir, None, Some(user.gid)).map_err(io)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710)).map_err(io)
}

/// Hands `path` and everything under it to `user`, following no symbolic link.
pub(crate) fn hand_over(path: &Path, user: &ServerUser) -> Result<(), RestoreError> {
    let io = |source| RestoreError::Io {
        action: format!("handing the file over to {}", user.name),
        dir: path.to_path_buf(),
        source,
    };
    std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid)).map_err(io)?;
    if std::fs::symlink_metadata(path).map_err(io)?.is_dir() {
        for entry in std::fs::read_dir(path).map_err(io)? {
            hand_over(&entry.map_err(io)?.path(), user)?;
        }
    }
    Ok(())
}

/// Longest socket path used: `sun_path` holds 108 bytes with its NUL, and `mariadbd`
/// refuses a little less.
const SOCKET_PATH_MAX: usize = 100;

/// Where the private server's socket goes: in `dir` when its path is short enough, else in
/// a new private directory (mode 0700) under `TMPDIR` or `/tmp` — so a deep scratch or data
/// directory never stops a restore.
fn socket_place(dir: &Path) -> Result<(PathBuf, Option<tempfile::TempDir>), RestoreError> {
    const NAME: &str = "mysqld.sock";
    let inside = dir.join(NAME);
    if inside.as_os_str().len() <= SOCKET_PATH_MAX {
        return Ok((inside, None));
    }
    let mut tried = Vec::new();
    for base in [std::env::temp_dir(), PathBuf::from("/tmp")] {
        // `<base>/tidemark-XXXXXX/mysqld.sock`
        if base.as_os_str().len() + 1 + 15 + 1 + NAME.len() > SOCKET_PATH_MAX {
            tried.push(format!("{} (too deep)", base.display()));
            continue;
        }
        match tempfile::Builder::new()
            .prefix("tidemark-")
            .tempdir_in(&base)
        {
            Ok(tmp) => {
                let socket = tmp.path().join(NAME);
                return Ok((socket, Some(tmp)));
            }
            Err(e) => tried.push(format!("{}: {e}", base.display())),
        }
    }
    Err(RestoreError::Io {
        action: format!(
            "finding a directory for the private server's socket (a path of at most \
             {SOCKET_PATH_MAX} bytes; tried {})",
            tried.join(", ")
        ),
        dir: dir.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "path too long"),
    })
}

/// A new account name or password: 16 random bytes in hex.
pub(crate) fn random_word() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// Writes a file only its owner reads (mode 0600), new.
pub(crate) fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

impl PrivateServer {
    /// The newest run a restore's data holds before its replay (the backup's own): the chunks
    /// the replay computes again are those of later runs. 0 without the oracle.
    pub(crate) async fn oracle_base_run(&self, tools: &Tools) -> u64 {
        let server = self;
        let sql = |q: String| async move {
            server
                .admin_query(tools, &q)
                .await
                .map_err(|e| e.to_string())
        };
        let read = async {
            if !crate::oracle::present(&sql).await.ok()? {
                return None;
            }
            sql(format!(
                "SELECT COALESCE(MAX(run), 0) FROM `{}`.`chunks`",
                crate::oracle::SCHEMA
            ))
            .await
            .ok()?
            .trim()
            .parse()
            .ok()
        };
        tokio::time::timeout(crate::oracle::COMPARE_TIMEOUT, read)
            .await
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// [`compare`] on a restore's private server, as its administrator, of the runs after
    /// `since`: a failure to read is a difference of its own (the restore itself stands).
    pub(crate) async fn oracle_compare(
        &self,
        tools: &Tools,
        since: u64,
    ) -> Option<crate::oracle::Comparison> {
        let server = self;
        let compared = crate::oracle::compare(
            |q| async move {
                server
                    .admin_query(tools, &q)
                    .await
                    .map_err(|e| e.to_string())
            },
            since,
        );
        tokio::time::timeout(crate::oracle::COMPARE_TIMEOUT, compared)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no answer within {} s",
                    crate::oracle::COMPARE_TIMEOUT.as_secs()
                ))
            })
            .unwrap_or_else(|e| {
                Some(crate::oracle::Comparison {
                    chunks: 0,
                    differences: vec![format!("its chunks could not be read: {e}")],
                })
            })
    }

    /// Starts the server on `datadir` and waits until it accepts connections, with its
    /// own files in `<work>/server`. It sees none of this process's environment (store
    /// credentials, identities) but [`crate::tools::KEPT_ENV`], reads no options file (the
    /// geometry of the data directory's `backup-my.cnf`, checked again, is passed as
    /// options), loads no library (an empty plugin directory), and no file can be read or
    /// written through SQL (`LOAD_FILE`, `SELECT … INTO OUTFILE`, `LOAD DATA [LOCAL]`,
    /// `DATA DIRECTORY`). As root, it runs as the server user (see the module's doc), which
    /// is handed the data directory and `<work>/server`; `work` must let it through
    /// ([`open_to_server`]).
    ///
    /// # Errors
    /// Its options are refused; root without a server user; it cannot be started, or does
    /// not come up (with the end of its log).
    ///
    /// MySQL's reads no options file from the data directory (a clone carries none): its
    /// page size is given.
    pub(crate) async fn start_flavor(
        flavor: &Flavor,
        datadir: &Path,
        work: &Path,
        tools: &Tools,
    ) -> Result<Self, RestoreError> {
        Self::start_with(flavor, datadir, work, tools, &[]).await
    }

    /// [`PrivateServer::start_flavor`] with more options (Tidemark's own: the relay logs
    /// of a replay through the applier, [`crate::applier`]).
    ///
    /// # Errors
    /// As [`PrivateServer::start_flavor`].
    pub(crate) async fn start_with(
        flavor: &Flavor,
        datadir: &Path,
        work: &Path,
        tools: &Tools,
        extra: &[String],
    ) -> Result<Self, RestoreError> {
        let user = server_user(tools, datadir).await?;
        let io = crate::tools::io_error;
        let dir = work.join("server");
        std::fs::create_dir_all(&dir)
            .map_err(io("creating the private server's directory", &dir))?;
        let (socket, socket_dir) = socket_place(&dir)?;
        let log = dir.join("mysqld.log");
        // A server deletes every `#sql*` file in its tmpdir when it starts: with the default
        // (/tmp) it would remove the temporary tables of a live server on the same host.
        let tmpdir = dir.join("tmp");
        std::fs::create_dir_all(&tmpdir)
            .map_err(io("creating the private server's tmpdir", &tmpdir))?;
        let none = dir.join("no-files");
        std::fs::create_dir_all(&none)
            .map_err(io("creating the private server's file directory", &none))?;
        let plugins = no_plugin_dir(&dir)?;
        // Client options files in a directory the server's user cannot change: a client
        // reading one the server had rewritten would load any library it names.
        let logins = work.join("logins");
        std::fs::create_dir_all(&logins).map_err(io(
            "creating the directory of the private server's logins",
            &logins,
        ))?;
        // Tidemark's administrator, made as the server starts (its only way in: the grant
        // tables are the restored ones).
        let admin = Login {
            file: logins.join("admin.cnf"),
            user: format!("tidemark_admin_{}", &random_word()[..16]),
        };
        let password = random_word();
        let init = dir.join("init.sql");
        write_private(
            &init,
            &format!(
                "DROP USER IF EXISTS '{u}'@'localhost';\n\
                 CREATE USER '{u}'@'localhost' IDENTIFIED BY '{password}';\n\
                 GRANT ALL PRIVILEGES ON *.* TO '{u}'@'localhost' WITH GRANT OPTION;\n",
                u = admin.user
            ),
        )
        .map_err(io("writing the private server's init file", &init))?;
        write_private(
            &admin.file,
            &format!("[client]\nuser={}\npassword={password}\n", admin.user),
        )
        .map_err(io("writing the administrator's login", &admin.file))?;
        if let Some(user) = &user {
            hand_over(&dir, user)?;
            if let Some(s) = &socket_dir {
                hand_over(s.path(), user)?;
            }
            hand_over(datadir, user)?;
        }
        let program = flavor.server(tools);
        let mut server = Command::new(program);
        server.arg("--no-defaults");
        match flavor {
            Flavor::MariaDb => {
                let geometry = crate::cnf::Geometry::read(datadir, &datadir.display().to_string())
                    .map_err(io("reading the restored options file", datadir))??;
                server
                    .args(geometry.args())
                    .arg(format!("--plugin-dir={}", plugins.display()))
                    .args(["--skip-symbolic-links", "--skip-slave-start"]);
            }
            // (MySQL has symbolic links off by default, and no X protocol here.) GTIDs on,
            // so a replay keeps each transaction's own (`gtid_next`).
            // Values persisted in the data directory (`mysqld-auto.cnf`) outrank options:
            // none is read.
            Flavor::MySql(geometry) => {
                server
                    .args(geometry.args())
                    .arg("--persisted-globals-load=OFF")
                    .arg(format!("--plugin-dir={}", plugins.display()))
                    .args([
                        "--skip-replica-start",
                        "--mysqlx=OFF",
                        "--gtid-mode=ON",
                        "--enforce-gtid-consistency=ON",
                        // A dump's or a binlog's row as large as mysqldump writes.
                        "--max-allowed-packet=1G",
                    ]);
            }
            Flavor::CloneRecipient {
                donor,
                geometry,
                ca,
            } => {
                server
                    .args(geometry.args())
                    .arg("--persisted-globals-load=OFF")
                    .arg("--plugin-load-add=mysql_clone.so")
                    .arg(format!("--clone-valid-donor-list={donor}"))
                    .args(["--skip-replica-start", "--mysqlx=OFF"]);
                if let Some(ca) = ca {
                    server.arg(format!("--clone-ssl-ca={}", ca.display()));
                }
            }
        }
        server
            .arg(format!("--datadir={}", datadir.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
            .arg(format!("--tmpdir={}", tmpdir.display()))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--init-file={}", init.display()))
            .args([
                "--skip-networking",
                "--skip-log-bin",
                "--event-scheduler=DISABLED",
            ])
            // Nothing is flushed to disk per transaction and pages are written once (issue
            // 32 §3): the data directory counts only after `stop` shut the server down
            // cleanly, which writes everything; a crash before that fails the restore.
            .args(REPLAY_SETTINGS)
            .arg(format!("--secure-file-priv={}", none.display()))
            .arg("--local-infile=0")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(user) = &user {
            server.arg(format!("--user={}", user.name));
        }
        let child = spawn(&mut server, program)?;
        let mut server = PrivateServer {
            child,
            socket,
            log,
            logins,
            admin,
            made: Vec::new(),
            _socket_dir: socket_dir,
            client: flavor.client(tools).clone(),
            mysql: *flavor != Flavor::MariaDb,
        };
        let up = async {
            wait_for_socket(
                &mut server.child,
                &server.socket,
                &server.log,
                user.as_ref(),
            )
            .await?;
            // The socket opens before the server takes logins (it may reset the first ones,
            // and the init file may still run): the administrator is tried until it gets in.
            let deadline = std::time::Instant::now() + Duration::from_secs(START_SECS);
            loop {
                match server.admin_sql(tools, "SELECT 1").await {
                    Ok(()) => break,
                    Err(e) => {
                        let exited = matches!(server.child.try_wait(), Ok(Some(_)));
                        if exited || std::time::Instant::now() > deadline {
                            return Err(e);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // The init file has run; its password is not left about.
            let _ = std::fs::remove_file(&init);
            Ok(())
        };
        if let Err(e) = up.await {
            let _ = server.child.start_kill();
            let _ = server.child.wait().await;
            return Err(e);
        }
        Ok(server)
    }

    /// Makes `account` anew (dropped first if it exists: whatever a replayed statement did
    /// to it is undone) and returns its login.
    ///
    /// # Errors
    /// The administrator's statements fail (a replayed statement took its rights away).
    pub(crate) async fn account(
        &mut self,
        tools: &Tools,
        account: Account,
    ) -> Result<Login, RestoreError> {
        let (kind, grants) = match account {
            Account::Replay if self.mysql => ("replay", &MYSQL_REPLAY_GRANTS[..]),
            Account::Replay => ("replay", &REPLAY_GRANTS[..]),
            Account::Check => ("check", &CHECK_GRANTS[..]),
            Account::Load => ("load", &MYSQL_LOAD_GRANTS[..]),
        };
        let user = format!("tidemark_{kind}_{}", &random_word()[..16]);
        let password = random_word();
        let name = format!("'{user}'@'localhost'");
        let mut sql =
            format!("DROP USER IF EXISTS {name}; CREATE USER {name} IDENTIFIED BY '{password}';");
        for g in grants {
            sql.push_str(&g.replace("{account}", &name));
            sql.push(';');
        }
        // The previous account of this kind goes: one login per run.
        let prefix = format!("tidemark_{kind}_");
        for old in self.made.iter().filter(|m| m.starts_with(&prefix)) {
            sql.push_str(&format!("DROP USER IF EXISTS '{old}'@'localhost';"));
        }
        self.made.retain(|m| !m.starts_with(&prefix));
        self.made.push(user.clone());
        self.admin_sql(tools, &sql).await?;
        let file = self.logins.join(format!("{kind}.cnf"));
        let _ = std::fs::remove_file(&file);
        write_private(
            &file,
            &format!("[client]\nuser={user}\npassword={password}\n"),
        )
        .map_err(|source| RestoreError::Io {
            action: format!("writing the {kind} account's login"),
            dir: file.clone(),
            source,
        })?;
        Ok(Login { file, user })
    }

    /// The end of the server's error log.
    pub(crate) fn log_tail(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Runs `sql` as Tidemark's administrator.
    /// The statements go on the client's standard input, never its command line: they
    /// carry the accounts' passwords, and a command line is every local user's to read.
    pub(crate) async fn admin_sql(&self, tools: &Tools, sql: &str) -> Result<(), RestoreError> {
        self.admin_query(tools, sql).await.map(|_| ())
    }

    /// Runs `sql` as Tidemark's administrator and returns what it printed (`-N -B`: no
    /// column names, tab-separated).
    pub(crate) async fn admin_query(
        &self,
        _tools: &Tools,
        sql: &str,
    ) -> Result<String, RestoreError> {
        self.admin_client(sql, true).await
    }

    /// Runs `sql` (one statement that returns one row, e.g. `SHOW SLAVE STATUS`) as
    /// Tidemark's administrator: its columns by name, empty when it returned no row.
    ///
    /// # Errors
    /// As [`PrivateServer::admin_query`].
    pub(crate) async fn admin_row(
        &self,
        sql: &str,
    ) -> Result<std::collections::BTreeMap<String, String>, RestoreError> {
        let out = self.admin_client(sql, false).await?;
        let mut lines = out.lines();
        let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
            return Ok(std::collections::BTreeMap::new());
        };
        Ok(names
            .split('\t')
            .map(str::to_owned)
            .zip(values.split('\t').map(str::to_owned))
            .collect())
    }

    async fn admin_client(&self, sql: &str, bare: bool) -> Result<String, RestoreError> {
        use tokio::io::AsyncWriteExt as _;
        let spawn_err = |source| RestoreError::Spawn {
            program: self.client.to_string_lossy().into_owned(),
            source,
        };
        let mut child = spawn(
            Command::new(&self.client)
                .args(self.admin.args(&self.socket))
                .args(if bare { &["-N", "-B"][..] } else { &["-B"][..] })
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
            &self.client,
        )?;
        if let Some(mut stdin) = child.stdin.take() {
            // A client that died early says why on stderr; its exit status tells.
            let _ = stdin.write_all(sql.as_bytes()).await;
        }
        let out = child.wait_with_output().await.map_err(spawn_err)?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        Err(RestoreError::Tool {
            step: format!(
                "the private server's administrator ({})",
                sql.split(' ').take(3).collect::<Vec<_>>().join(" ")
            ),
            status: out.status.to_string(),
            tail: tail(&String::from_utf8_lossy(&out.stderr)),
        })
    }

    /// Drops the accounts Tidemark made, then shuts the server down cleanly (SIGTERM); one
    /// that does not stop is killed.
    ///
    /// # Errors
    /// The accounts could not be dropped (the restored data would keep them), or the
    /// server did not stop cleanly (`step` names the moment, with the end of its log).
    pub(crate) async fn stop(mut self, tools: &Tools, step: &str) -> Result<(), RestoreError> {
        let mut sql: String = self
            .made
            .iter()
            .map(|m| format!("DROP USER IF EXISTS '{m}'@'localhost';"))
            .collect();
        sql.push_str(&format!("DROP USER '{}'@'localhost';", self.admin.user));
        let dropped = self.admin_sql(tools, &sql).await;
        // The signal itself, not a `kill` program: an image may have none (MySQL's minimal
        // one has no procps), and the server would then wait out the timeout.
        if let Some(pid) = self
            .child
            .id()
            .and_then(|p| rustix::process::Pid::from_raw(i32::try_from(p).ok()?))
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let stopped = tokio::time::timeout(Duration::from_secs(300), self.child.wait()).await;
        let clean = matches!(&stopped, Ok(Ok(s)) if s.success());
        if !clean {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
            return Err(RestoreError::Tool {
                step: step.into(),
                status: format!("{stopped:?}"),
                tail: tail(&std::fs::read_to_string(&self.log).unwrap_or_default()),
            });
        }
        dropped
    }
}

/// How long the server may take to come up.
const START_SECS: u64 = 120;

async fn wait_for_socket(
    server: &mut Child,
    socket: &Path,
    log: &Path,
    user: Option<&ServerUser>,
) -> Result<(), RestoreError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(START_SECS);
    let failed = |secs| RestoreError::ServerStart {
        socket: socket.to_path_buf(),
        secs,
        user: user.map(|u| u.name.clone()),
        tail: tail(&std::fs::read_to_string(log).unwrap_or_default()),
    };
    loop {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        if let Ok(Some(_)) = server.try_wait() {
            return Err(failed(0));
        }
        if std::time::Instant::now() > deadline {
            return Err(failed(START_SECS));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A binlog decoder's command (`mariadb-binlog`, `mysqlbinlog`): no options file, the
/// data of a `LOAD DATA` event into `<work>/load` only ([`crate::tools::local_load`]),
/// and no event stamped at or after `stop` (`--stop-datetime`, read in UTC).
///
/// # Errors
/// The `LOAD DATA` directory cannot be made.
pub(crate) fn decoder(
    program: &OsString,
    work: &Path,
    stop: jiff::Timestamp,
) -> Result<Command, RestoreError> {
    let stop_text = stop
        .to_zoned(jiff::tz::TimeZone::UTC)
        .strftime("%Y-%m-%d %H:%M:%S")
        .to_string();
    let mut binlog = Command::new(program);
    binlog
        .arg("--no-defaults")
        .arg(crate::tools::local_load(work)?)
        // --stop-datetime is read in the client's local time zone.
        .env("TZ", "UTC")
        .arg(format!("--stop-datetime={stop_text}"));
    Ok(binlog)
}

/// Runs a binlog decoder (`binlog`, program `decoder`) into a client (`client`, logged in
/// as `login` on `socket`) and waits for both; their outputs, for the caller to judge.
/// The client runs no client command from the event text (`--binary-mode`: no `\!`, no
/// `source`) and sends no file of its own (`--local-infile=0`; the server refuses `LOAD
/// DATA LOCAL` as well).
///
/// # Errors
/// Either cannot be started or waited for.
pub(crate) async fn decode_into(
    binlog: &mut Command,
    decoder: &OsString,
    client: &OsString,
    login: &Login,
    socket: &Path,
    work: &Path,
) -> Result<(std::process::Output, std::process::Output), RestoreError> {
    let mut binlog = spawn(
        binlog
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        decoder,
    )?;
    let Some(events) = binlog.stdout.take() else {
        return Err(crate::tools::no_pipe(&decoder.to_string_lossy()));
    };
    let events: Stdio = events.try_into().map_err(|source| RestoreError::Io {
        action: "connecting the binlog decoder to the client".into(),
        dir: work.to_path_buf(),
        source,
    })?;
    let applier = spawn(
        Command::new(client)
            .args(login.args(socket))
            .arg("--binary-mode")
            .arg("--local-infile=0")
            .stdin(events)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        client,
    )?;
    let (b, c) = tokio::join!(binlog.wait_with_output(), applier.wait_with_output());
    let spawn_err = |program: &OsString| {
        let program = program.to_string_lossy().into_owned();
        move |source| RestoreError::Spawn { program, source }
    };
    Ok((
        b.map_err(spawn_err(decoder))?,
        c.map_err(spawn_err(client))?,
    ))
}
