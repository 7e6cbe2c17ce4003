//! A private MySQL server for end-to-end tests (issue 47): Debian unstable's MySQL 9.7 from
//! the root file system `scripts/mysql-root.sh` builds (`TIDEMARK_MYSQL_ROOT`; the machines'
//! own C library is too old for it), run in that root with `chroot` as its `mysql` user.
//! Each server has its own directory under the root's `/srv` — data directory, socket,
//! log, `secure-file-priv` and tmpdir — and a loopback port; binary logging and GTIDs on.

use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The uid and gid of the root's `mysql` user (scripts/mysql-root.sh makes it 999:999, as
/// the official image has it).
const MYSQL_ID: u32 = 999;

/// How long a server may take to answer after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The MySQL root file system: `TIDEMARK_MYSQL_ROOT`, else the place scripts/mysql-root.sh
/// builds it in.
///
/// # Panics
/// It is not there (with how to build it).
pub fn root() -> PathBuf {
    let root = std::env::var_os("TIDEMARK_MYSQL_ROOT").map_or_else(
        || PathBuf::from("/var/cache/tidemark/mysql-9.7/rootfs"),
        PathBuf::from,
    );
    assert!(
        root.join("usr/sbin/mysqld").exists(),
        "no MySQL root file system at {}: run scripts/mysql-root.sh (scripts/test.sh does), or set TIDEMARK_MYSQL_ROOT",
        root.display()
    );
    root
}

/// The directory of the root's programs as the host runs them (`mysqld`, `mysql`,
/// `mysqlbinlog`, `mysqldump`, `mysqladmin`: scripts/mysql-root.sh's wrappers, beside the
/// root), for Tidemark's own use of MySQL's tools.
///
/// # Panics
/// As [`root`], or the wrappers are missing.
pub fn bin() -> PathBuf {
    let root = root();
    let bin = root.parent().unwrap_or(&root).join("bin");
    assert!(
        bin.join("mysqld").exists(),
        "no MySQL wrappers in {}: run scripts/mysql-root.sh (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// A running `mysqld` (stopped when dropped).
#[derive(Debug)]
pub struct MySql {
    child: Child,
    root: PathBuf,
    /// Its directory, as the server sees it (`/srv/…`).
    pub dir: String,
    /// Its data directory, as the server sees it.
    pub datadir: String,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl MySql {
    /// A new server (`--initialize-insecure`: root without a password on the socket), with
    /// server id 1.
    ///
    /// # Panics
    /// The root file system is missing, or the server does not come up (with its log).
    pub fn start() -> Self {
        Self::start_in(1, None)
    }

    /// A new server with `server_id` (a replica's, or another primary's).
    ///
    /// # Panics
    /// As [`MySql::start`].
    pub fn start_with_id(server_id: u32) -> Self {
        Self::start_in(server_id, None)
    }

    /// A server on an existing data directory of the root (`/srv/…`, e.g. a clone's).
    ///
    /// # Panics
    /// As [`MySql::start`].
    pub fn start_on(datadir: &str, server_id: u32) -> Self {
        Self::start_in(server_id, Some(datadir))
    }

    fn start_in(server_id: u32, existing: Option<&str>) -> Self {
        let root = root();
        let srv = root.join("srv");
        std::fs::create_dir_all(&srv).expect("the root's /srv");
        let dir = tempfile::Builder::new()
            .prefix("mysql-")
            .tempdir_in(&srv)
            .expect("a directory in the root");
        let inside = format!(
            "/srv/{}",
            dir.path().file_name().unwrap_or_default().to_string_lossy()
        );
        for sub in ["files", "tmp"] {
            std::fs::create_dir(dir.path().join(sub)).expect("a server directory");
        }
        for path in [
            dir.path().to_path_buf(),
            dir.path().join("files"),
            dir.path().join("tmp"),
        ] {
            std::os::unix::fs::chown(&path, Some(MYSQL_ID), Some(MYSQL_ID))
                .expect("chown to the root's mysql user");
        }
        let datadir = existing.map_or_else(|| format!("{inside}/data"), str::to_owned);
        if existing.is_none() {
            let out = Command::new("chroot")
                .arg(&root)
                .args([
                    "/usr/sbin/mysqld",
                    "--no-defaults",
                    "--initialize-insecure",
                    "--user=mysql",
                ])
                .arg(format!("--datadir={datadir}"))
                .output()
                .expect("chroot mysqld --initialize-insecure");
            assert!(
                out.status.success(),
                "mysqld --initialize-insecure: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let port = super::free_port();
        let child = Command::new("chroot")
            .arg(&root)
            .args(["/usr/sbin/mysqld", "--no-defaults", "--user=mysql"])
            .arg(format!("--datadir={datadir}"))
            .arg(format!("--socket={inside}/mysqld.sock"))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--mysqlx=OFF")
            // Replication starts only when a test starts it: a restored replica's data
            // names its old source, and would fetch from it on its own.
            .arg("--skip-replica-start")
            // Relative: the index names `./binlog.000001`, which the host reads too.
            .arg("--log-bin=binlog")
            .arg(format!("--server-id={server_id}"))
            .args(["--gtid-mode=ON", "--enforce-gtid-consistency=ON"])
            .arg(format!("--log-error={inside}/mysqld.log"))
            .arg(format!("--pid-file={inside}/mysqld.pid"))
            .arg(format!("--secure-file-priv={inside}/files"))
            .arg(format!("--tmpdir={inside}/tmp"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chroot mysqld");
        let mut server = MySql {
            child,
            root,
            dir: inside,
            datadir,
            port,
            _dir: dir,
        };
        let socket = server.path(&format!("{}/mysqld.sock", server.dir));
        let deadline = Instant::now() + START_TIMEOUT;
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("mysqld exited ({status}): {}", server.log());
            }
            assert!(
                Instant::now() < deadline,
                "mysqld did not start: {}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// Where `inside` (a path as the server sees it) is on this machine.
    pub fn path(&self, inside: &str) -> PathBuf {
        self.root.join(inside.trim_start_matches('/'))
    }

    /// The end of its error log.
    pub fn log(&self) -> String {
        let log = std::fs::read_to_string(self.path(&format!("{}/mysqld.log", self.dir)))
            .unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The `mysql` client of the root, as root on this server's socket, with `args`.
    fn client(&self, args: &[&str]) -> Command {
        let mut c = Command::new("chroot");
        c.arg(&self.root)
            .arg("/usr/bin/mysql")
            .arg(format!("--socket={}/mysqld.sock", self.dir))
            .arg("--user=root")
            .args(args);
        c
    }

    /// Runs SQL and returns its output (tab-separated, no column names).
    ///
    /// # Panics
    /// The statement fails.
    pub fn sql(&self, sql: &str) -> String {
        self.sql_with(&[], sql)
    }

    /// [`MySql::sql`] with the client's `options` first.
    fn sql_with(&self, options: &[&str], sql: &str) -> String {
        let out = self
            .client(&[options, &["-N", "-B", "-e", sql]].concat())
            .output()
            .expect("chroot mysql");
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Runs SQL as root whose password has expired (a restored dump's: the first statement
    /// sets one), and returns its output.
    ///
    /// # Panics
    /// The statement fails.
    pub fn sql_expired(&self, sql: &str) -> String {
        self.sql_with(&["--connect-expired-password"], sql)
    }

    /// A client session reading statements from the returned stdin (one transaction per
    /// statement in autocommit), for a steady write load.
    ///
    /// # Panics
    /// The client cannot start.
    pub fn session(&self) -> (Child, ChildStdin) {
        let mut child = self
            .client(&["-N", "-B"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chroot mysql");
        let stdin = child.stdin.take().expect("the session's stdin");
        (child, stdin)
    }
}

impl Drop for MySql {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The number of transactions of `uuid` in a GTID set written as MySQL writes it
/// (`uuid:1-5:7,uuid2:1-3`).
///
/// # Panics
/// Not a GTID set, or `uuid` not a uuid.
pub fn gtid_count(set: &str, uuid: &str) -> u64 {
    use tidemark_core::gtidset::{GtidSet, Uuid};
    let uuid = Uuid::parse(uuid).expect("a server uuid");
    GtidSet::parse(&set.replace("\\n", ""))
        .expect("a GTID set")
        .iter()
        .filter(|(u, _)| **u == uuid)
        .flat_map(|(_, intervals)| intervals)
        .map(|&(a, b)| b - a + 1)
        .sum()
}
