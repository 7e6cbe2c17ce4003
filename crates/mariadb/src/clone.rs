//! MySQL's physical backups without XtraBackup (issue 47, `method: mysql-clone`): MySQL's
//! own CLONE plugin copies the source server's data into a private recipient server that
//! Tidemark runs, so the source's own volume needs no room for the copy. The clone is a
//! data directory; its consistent point is read from the clone itself (MySQL 9.7 records
//! no binlog file or GTID set in `performance_schema.clone_status` for a clone into a
//! directory: the clone's own `gtid_executed` is exact). It is streamed into the store as
//! one tar payload, and a restore extracts it back into a data directory.
//!
//! # What it costs the source
//! A full read of its InnoDB data (the clone plugin's page and redo copy), sent over one
//! connection; no lock that stops writes (DDL is blocked for the copy before MySQL 8.0.27,
//! and from then on only with `clone_block_ddl=ON`). The scratch space is the
//! recipient's: the size of the data, beside Tidemark (docs/mysql.md).
//!
//! # Hostile input
//! The source's data is the user's, but a server can lie, and a payload in the bucket may
//! be a bucket writer's. Neither runs code or writes a file outside Tidemark's directories:
//! the servers Tidemark starts on a clone run as the server user, with no network, no
//! plugin and no file access through SQL ([`crate::server`]); a payload's entries are
//! plain files and directories under the data directory only ([`extract`]).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tidemark_core::gtidset::GtidSet;
use tidemark_store::format::Metadata;
use tidemark_store::transfer;
use tidemark_store::{ClusterStore, Progress};
use tokio::io::AsyncRead;
use tokio::process::Command;

use crate::server::{PrivateServer, hand_over, server_user, write_private};
use crate::tools::{Flavor, RestoreError, Tools, spawn, tail};

/// The method's name, in `metadata.json` and in a schedule's `method`.
pub const METHOD: &str = "mysql-clone";
/// The payload's extension: a tar of the clone's data directory.
pub const EXT: &str = "tar";

/// The oldest MySQL whose clone plugin clones into a directory (`CLONE INSTANCE FROM …
/// DATA DIRECTORY`): 8.0.17.
pub const OLDEST: (u32, u32, u32) = (8, 0, 17);

/// How long the source may take to answer a question (not the clone itself).
const ASK_TIMEOUT: Duration = Duration::from_secs(60);
/// The most a question's answer may hold.
const ANSWER_MAX: usize = 64 * 1024;
/// The most entries a payload may hold (a data directory of a million tables has
/// about that many files).
const MAX_ENTRIES: u64 = 4_000_000;
/// The deepest path a payload may hold.
const MAX_DEPTH: usize = 16;

/// The source server: where it listens and the account that clones from it (with
/// `BACKUP_ADMIN`).
#[derive(Clone)]
pub struct Donor {
    /// The client that asks the source its version and state.
    pub client: OsString,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    /// The CA the source's certificate must be signed by (PEM, from `--ssl-ca`): the
    /// client verifies it (`VERIFY_CA`), and so does a clone's recipient
    /// (`clone_ssl_ca`). Without it the connection is encrypted but the source unverified.
    pub ssl_ca: Option<String>,
}

impl std::fmt::Debug for Donor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} --host={} --port={} --user={}",
            self.client.to_string_lossy(),
            self.host,
            self.port,
            self.user
        )
    }
}

impl Donor {
    /// The source from a method's command: the client and its connection options, e.g.
    /// `[mysql, --host=db, --port=3306, --user=tidemark, --password=…]` (`-h`, `-P`, `-u`,
    /// `-p` too, a value attached or, but for `-p`, as the next word). First, an options
    /// file may give the user and password (`--defaults-extra-file=FILE`, its `[client]`
    /// `user=` and `password=`; later options win), so no password is on a command line.
    /// `--ssl-ca=FILE` (PEM) has the source's certificate verified. The clone goes over
    /// TCP, so a socket is refused; so is any other option.
    ///
    /// # Errors
    /// No client, no user, an option not understood, a port that is not one, or an
    /// options file that cannot be read.
    pub fn from_command(command: &[String]) -> Result<Donor, String> {
        const FORM: &str = "expected the client and its connection options, e.g. [mysql, --defaults-extra-file=/etc/tidemark/source.cnf, --host=db.example, --port=3306]";
        let Some((client, options)) = command.split_first() else {
            return Err(format!("method {METHOD} needs a command: {FORM}"));
        };
        let (mut host, mut port, mut user, mut password) =
            ("127.0.0.1".to_owned(), 3306u16, None, String::new());
        let mut ssl_ca = None;
        let options = match options.split_first() {
            Some((first, rest)) if first.starts_with("--defaults-extra-file=") => {
                let file = &first["--defaults-extra-file=".len()..];
                let login = read_login(Path::new(file))?;
                user = login.0;
                password = login.1.unwrap_or_default();
                rest
            }
            _ => options,
        };
        let mut words = options.iter();
        while let Some(word) = words.next() {
            let (name, attached) = match word.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
                _ if word.starts_with("--") => (word.clone(), None),
                _ if word.starts_with('-') && word.len() > 2 && word.is_char_boundary(2) => {
                    (word[..2].to_owned(), Some(word[2..].to_owned()))
                }
                _ => (word.clone(), None),
            };
            let mut value = |what: &str| -> Result<String, String> {
                match &attached {
                    Some(v) => Ok(v.clone()),
                    None => words
                        .next()
                        .cloned()
                        .ok_or_else(|| format!("{name} needs {what}: {FORM}")),
                }
            };
            match name.as_str() {
                "--host" | "-h" => host = value("a host")?,
                "--port" | "-P" => {
                    let v = value("a port")?;
                    port = v
                        .parse()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| format!("{name} {v:?} is not a port (1 to 65535)"))?;
                }
                "--user" | "-u" => user = Some(value("a user")?),
                "--password" | "-p" => {
                    password = attached.clone().ok_or_else(|| {
                        format!("{name} needs its value attached ({name}=…): {FORM}")
                    })?;
                }
                "--ssl-ca" => ssl_ca = Some(read_ca(Path::new(&value("a CA file")?))?),
                "--socket" | "-S" => {
                    return Err(format!(
                        "{name}: a clone reaches its source over TCP; give --host and --port instead"
                    ));
                }
                // (Only an option's name is shown: its value may be a password.)
                _ if name.starts_with('-') => {
                    let shown: String = name.chars().take(40).collect();
                    return Err(format!("option {shown:?} is not understood here: {FORM}"));
                }
                _ => return Err(format!("a word that is not an option: {FORM}")),
            }
        }
        let user = user.ok_or_else(|| format!("no --user: {FORM}"))?;
        let printable =
            |v: &str| !v.is_empty() && v.len() <= 255 && v.chars().all(|c| !c.is_control());
        if !printable(&host) || !printable(&user) || password.chars().any(char::is_control) {
            return Err(format!(
                "a host or user that is empty, longer than 255 bytes or holds a control character: {FORM}"
            ));
        }
        Ok(Donor {
            client: client.into(),
            host,
            port,
            user,
            password,
            ssl_ca,
        })
    }

    /// The connection's TLS options for a client options file: the CA written into `work`
    /// and `VERIFY_CA` when one was given, else `REQUIRED`.
    fn tls_options(&self, work: &Path) -> Result<String, RestoreError> {
        let Some(pem) = &self.ssl_ca else {
            return Ok("ssl-mode=REQUIRED\n".into());
        };
        let file = work.join("source-ca.pem");
        write_private(&file, pem).map_err(|source| RestoreError::Io {
            action: "writing the source's CA".into(),
            dir: file.clone(),
            source,
        })?;
        Ok(format!(
            "ssl-mode=VERIFY_CA\nssl-ca={}\n",
            option_value(&file.to_string_lossy())
        ))
    }

    /// `host:port`, as `clone_valid_donor_list` wants it.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Asks the source `sql` (one row, tab-separated), through a client options file
    /// (mode 0600) in `work`: the password is on no command line.
    pub(crate) async fn ask(&self, work: &Path, sql: &str) -> Result<Vec<String>, RestoreError> {
        self.ask_at_most(work, sql, ANSWER_MAX).await
    }

    /// The source's client options file in `work` (mode 0600, written once): the
    /// password is on no command line.
    pub(crate) fn login(&self, work: &Path) -> Result<PathBuf, RestoreError> {
        let file = work.join("source.cnf");
        if !file.exists() {
            let tls = self.tls_options(work)?;
            write_private(
                &file,
                &format!(
                    "[client]\nhost={}\nport={}\nuser={}\npassword={}\nprotocol=TCP\n{tls}",
                    option_value(&self.host),
                    self.port,
                    option_value(&self.user),
                    option_value(&self.password)
                ),
            )
            .map_err(|source| RestoreError::Io {
                action: "writing the source's login".into(),
                dir: file.clone(),
                source,
            })?;
        }
        Ok(file)
    }

    /// [`Donor::ask`], with an answer of at most `answer_max` bytes.
    pub(crate) async fn ask_at_most(
        &self,
        work: &Path,
        sql: &str,
        answer_max: usize,
    ) -> Result<Vec<String>, RestoreError> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let file = self.login(work)?;
        let mut child = spawn(
            Command::new(&self.client)
                .arg(format!("--defaults-file={}", file.display()))
                .args(["-N", "-B"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
            &self.client,
        )?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(sql.as_bytes()).await;
        }
        let (Some(stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(crate::tools::no_pipe("the source's client"));
        };
        let step = format!("asking the source ({self:?})");
        let answered = tokio::time::timeout(ASK_TIMEOUT, async {
            let mut out = Vec::new();
            let mut err = Vec::new();
            let mut limited = stdout.take(answer_max as u64 + 1);
            let (a, b) = tokio::join!(limited.read_to_end(&mut out), async {
                let mut e = (&mut stderr).take(ANSWER_MAX as u64);
                e.read_to_end(&mut err).await
            });
            a.and(b).map(|_| (out, err))
        })
        .await;
        let (out, err) = match answered {
            Ok(Ok(v)) => v,
            Ok(Err(source)) => {
                return Err(RestoreError::Spawn {
                    program: self.client.to_string_lossy().into_owned(),
                    source,
                });
            }
            Err(_) => {
                let _ = child.start_kill();
                return Err(RestoreError::Tool {
                    step,
                    status: format!("no answer within {} s", ASK_TIMEOUT.as_secs()),
                    tail: String::new(),
                });
            }
        };
        let status = child.wait().await.map_err(|source| RestoreError::Spawn {
            program: self.client.to_string_lossy().into_owned(),
            source,
        })?;
        if !status.success() {
            return Err(RestoreError::Tool {
                step,
                status: status.to_string(),
                tail: tail(&String::from_utf8_lossy(&err)),
            });
        }
        if out.len() > answer_max {
            return Err(RestoreError::Tool {
                step,
                status: format!("an answer longer than {answer_max} bytes"),
                tail: String::new(),
            });
        }
        let text = String::from_utf8_lossy(&out);
        Ok(text
            .lines()
            .next()
            .unwrap_or_default()
            .split('\t')
            .map(str::to_owned)
            .collect())
    }
}

/// The most an options file may hold.
const LOGIN_FILE_MAX: u64 = 64 * 1024;

/// A CA file given with `--ssl-ca`: a regular file of at most 64 KiB holding PEM
/// certificates. Only the certificates are kept (a private key beside them is not copied
/// anywhere).
fn read_ca(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("--ssl-ca={shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("--ssl-ca={shown}: not a regular file"));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(LOGIN_FILE_MAX + 1).read_to_string(&mut text))
        .map_err(|e| format!("--ssl-ca={shown}: {e}"))?;
    let mut certificates = String::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim_end();
        if line == "-----BEGIN CERTIFICATE-----" {
            inside = true;
        }
        if inside {
            certificates.push_str(line);
            certificates.push('\n');
        }
        if line == "-----END CERTIFICATE-----" {
            inside = false;
        }
    }
    if text.len() as u64 > LOGIN_FILE_MAX || inside || certificates.is_empty() {
        return Err(format!(
            "--ssl-ca={shown}: expected PEM certificates (-----BEGIN CERTIFICATE----- … -----END CERTIFICATE-----), at most {LOGIN_FILE_MAX} bytes"
        ));
    }
    Ok(certificates)
}

/// The `user` and `password` of an options file's `[client]` group (MySQL's syntax: a
/// value double-quoted with `\`, `\"`, `\n`, `\t`, `\s` escapes, or bare up to a `#`).
fn read_login(path: &Path) -> Result<(Option<String>, Option<String>), String> {
    use std::io::Read as _;
    let shown = path.display();
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(LOGIN_FILE_MAX + 1).read_to_string(&mut text))
        .map_err(|e| format!("--defaults-extra-file={shown}: {e}"))?;
    if text.len() as u64 > LOGIN_FILE_MAX {
        return Err(format!(
            "--defaults-extra-file={shown}: longer than {LOGIN_FILE_MAX} bytes"
        ));
    }
    let (mut user, mut password) = (None, None);
    let mut client = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(group) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            client = group.trim() == "client";
            continue;
        }
        if !client || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        let value = match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            Some(quoted) => {
                let mut out = String::new();
                let mut chars = quoted.chars();
                while let Some(c) = chars.next() {
                    if c != '\\' {
                        out.push(c);
                        continue;
                    }
                    match chars.next() {
                        Some('n') => out.push('\n'),
                        Some('t') => out.push('\t'),
                        Some('r') => out.push('\r'),
                        Some('b') => out.push('\u{8}'),
                        Some('s') => out.push(' '),
                        Some(other) => out.push(other),
                        None => out.push('\\'),
                    }
                }
                out
            }
            None => value
                .split('#')
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned(),
        };
        match name.trim() {
            "user" => user = Some(value),
            "password" => password = Some(value),
            _ => {}
        }
    }
    Ok((user, password))
}

/// A value of a client options file, quoted: `"…"` with `\` and `"` escaped.
fn option_value(v: &str) -> String {
    format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A string literal of SQL: `'…'` with `\` and `'` escaped.
fn sql_literal(v: &str) -> String {
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// What the source said about itself before the clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFacts {
    pub version: String,
    pub server_uuid: String,
    pub server_id: u32,
    /// `gtid_mode` is `ON`: its binlogs can be replayed onto a clone by GTID.
    pub gtids: bool,
    /// It writes a binary log (`log_bin`).
    pub log_bin: bool,
    /// Its clone plugin is active.
    pub clone_plugin: bool,
    pub geometry: crate::tools::MySqlGeometry,
    /// It replicated from another server (a replica's clone); `None` when the account
    /// may not ask.
    pub replica: Option<bool>,
}

/// A clone taken: its data directory (in `work`, removed with it) and its point.
#[derive(Debug)]
pub struct Cloned {
    pub datadir: PathBuf,
    /// The transactions the clone holds: its own `gtid_executed`.
    pub gtid_executed: GtidSet,
    pub source: SourceFacts,
    /// When the clone statement returned: its data is consistent at or before then.
    pub consistent_at: jiff::Timestamp,
}

/// Parses `8.0.17`, `9.7.4-2` into numbers.
pub(crate) fn version_of(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next()?.parse().ok();
    Some((next()?, next()?, next()?))
}

/// Asks the source what it is, and refuses one older than 8.0.17 or with a geometry out of
/// range.
///
/// # Errors
/// The source does not answer, is older than 8.0.17, or answers values out of range.
pub async fn facts(donor: &Donor, work: &Path) -> Result<SourceFacts, RestoreError> {
    let row = donor
        .ask(
            work,
            "SELECT @@version, @@server_uuid, @@server_id, @@innodb_page_size, \
             @@lower_case_table_names, @@gtid_mode, @@log_bin, \
             (SELECT COALESCE(MAX(PLUGIN_STATUS), 'NONE') FROM information_schema.PLUGINS \
              WHERE PLUGIN_NAME = 'clone')",
        )
        .await?;
    let refused = |problem: String| RestoreError::Source {
        source_server: format!("{donor:?}"),
        problem,
    };
    let [
        version,
        uuid,
        id,
        page,
        lower_case,
        gtid_mode,
        log_bin,
        plugin,
    ] = &row[..]
    else {
        return Err(refused(format!(
            "answered {} fields where 8 were asked for: {row:?}",
            row.len()
        )));
    };
    match version_of(version) {
        Some(v) if v >= OLDEST => {}
        _ => {
            return Err(refused(format!(
                "version {version:?}: cloning into a directory needs MySQL {}.{}.{} or newer",
                OLDEST.0, OLDEST.1, OLDEST.2
            )));
        }
    }
    let number = |what: &str, v: &str| {
        v.parse::<u32>()
            .map_err(|_| refused(format!("{what} {v:?} is not a number")))
    };
    let page_size = number("innodb_page_size", page)?;
    if !matches!(page_size, 4096 | 8192 | 16384 | 32768 | 65536) {
        return Err(refused(format!(
            "innodb_page_size {page_size} is not one of 4096, 8192, 16384, 32768, 65536"
        )));
    }
    let lower_case_table_names = number("lower_case_table_names", lower_case)?;
    if lower_case_table_names > 2 {
        return Err(refused(format!(
            "lower_case_table_names {lower_case_table_names} is not 0, 1 or 2"
        )));
    }
    if uuid.len() != 36 || !uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(refused(format!("server_uuid {uuid:?} is not a uuid")));
    }
    // Whether it replicates needs a right a clone does not (SELECT on
    // performance_schema, or REPLICATION CLIENT): without it the role is unknown.
    let replica = donor
        .ask(
            work,
            "SELECT COUNT(*) FROM performance_schema.replication_connection_status \
             WHERE SERVICE_STATE = 'ON'",
        )
        .await
        .ok()
        .and_then(|row| row.first()?.parse::<u64>().ok())
        .map(|n| n > 0);
    Ok(SourceFacts {
        version: version.clone(),
        server_uuid: uuid.clone(),
        server_id: number("server_id", id)?,
        gtids: gtid_mode == "ON",
        log_bin: log_bin == "1",
        clone_plugin: plugin == "ACTIVE",
        geometry: crate::tools::MySqlGeometry {
            page_size,
            lower_case_table_names,
        },
        replica,
    })
}

/// Clones the source into `<work>/out/clone` through a private recipient server, then
/// reads the clone's point on a private server of its own (which also leaves the clone
/// cleanly shut down, so a restore starts at once).
///
/// # Errors
/// The source refuses ([`facts`]), a server does not start, the clone fails (with the
/// end of the recipient's answer), or the clone's `gtid_executed` does not parse.
pub async fn take(
    donor: &Donor,
    tools: &Tools,
    work: &Path,
    progress: &dyn Progress,
) -> Result<Cloned, RestoreError> {
    let io = crate::tools::io_error;
    let source = facts(donor, work).await?;
    if !source.clone_plugin {
        return Err(RestoreError::Source {
            source_server: format!("{donor:?}"),
            problem: "its clone plugin is not active: install it on the source (INSTALL PLUGIN clone SONAME 'mysql_clone.so'), and grant the account BACKUP_ADMIN".into(),
        });
    }
    progress.step(
        &format!(
            "cloning MySQL {} ({}, {})",
            source.version,
            donor.address(),
            match source.replica {
                Some(true) => "a replica",
                Some(false) => "a primary",
                None => "role unknown",
            }
        ),
        0,
    );
    // The servers' own directory: theirs to write (the recipient creates the clone's
    // directory in it).
    let out = work.join("out");
    std::fs::create_dir_all(&out).map_err(io("creating the clone's directory", &out))?;
    let user = server_user(tools, &out).await?;
    if let Some(user) = &user {
        crate::server::open_to_server(tools, work).await?;
        hand_over(&out, user)?;
    }
    let recipient = out.join("recipient");
    initialize(
        tools,
        &recipient,
        &out,
        user.as_ref().map(|u| u.name()),
        source.geometry,
    )
    .await?;
    let clone = out.join("clone");
    let consistent_at = {
        // The source's CA, where the recipient (the server user) reads it.
        let ca = match &donor.ssl_ca {
            Some(pem) => {
                use std::io::Write as _;
                use std::os::unix::fs::OpenOptionsExt as _;
                // A new file (nothing planted there is followed), readable by the server.
                let file = out.join("donor-ca.pem");
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(&file)
                    .and_then(|mut f| f.write_all(pem.as_bytes()))
                    .map_err(io("writing the source's CA", &file))?;
                Some(file)
            }
            None => None,
        };
        let flavor = Flavor::CloneRecipient {
            donor: donor.address(),
            geometry: source.geometry,
            ca,
        };
        let server =
            PrivateServer::start_flavor(&flavor, &recipient, &work.join("recipient"), tools)
                .await?;
        // Over TLS, always: the source's data and the account's password cross the network.
        let statement = format!(
            "CLONE INSTANCE FROM {}@{}:{} IDENTIFIED BY {} DATA DIRECTORY = {} REQUIRE SSL",
            sql_literal(&donor.user),
            sql_literal(&donor.host),
            donor.port,
            sql_literal(&donor.password),
            sql_literal(&clone.to_string_lossy()),
        );
        let cloned = server.admin_sql(tools, &statement).await;
        let at = jiff::Timestamp::now();
        let stopped = server.stop(tools, "stopping the clone's recipient").await;
        cloned.map_err(|e| RestoreError::Source {
            source_server: format!("{donor:?}"),
            // (The statement names the password: the error names the step only.)
            problem: format!(
                "the clone failed: {}",
                e.to_string().replace(&donor.password, "…")
            ),
        })?;
        stopped?;
        at
    };
    let _ = std::fs::remove_dir_all(&recipient);
    progress.step("reading the clone's point", 0);
    let before: std::collections::HashSet<OsString> = std::fs::read_dir(&clone)
        .map_err(io("reading the clone", &clone))?
        .filter_map(|e| Some(e.ok()?.file_name()))
        .collect();
    let server = PrivateServer::start_flavor(
        &Flavor::MySql(source.geometry),
        &clone,
        &work.join("point"),
        tools,
    )
    .await?;
    let answer = server
        .admin_query(tools, "SELECT @@GLOBAL.gtid_executed")
        .await;
    server
        .stop(tools, "stopping the server on the clone")
        .await?;
    // What that server made at the top of the directory (its uuid, certificates) is not
    // the source's data: a restored server makes its own.
    for entry in std::fs::read_dir(&clone).map_err(io("reading the clone", &clone))? {
        let entry = entry.map_err(io("reading the clone", &clone))?;
        let made = !before.contains(&entry.file_name());
        if made && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let text = answer?.replace("\\n", "");
    let gtid_executed = GtidSet::parse(text.trim()).map_err(|e| RestoreError::Source {
        source_server: format!("{donor:?}"),
        problem: format!("the clone's gtid_executed does not parse: {e}"),
    })?;
    // Back to this process's user before it is read: nothing the server's user runs can
    // swap a file for a link while it is streamed.
    if user.is_some() {
        take_back(&out)?;
    }
    Ok(Cloned {
        datadir: clone,
        gtid_executed,
        source,
        consistent_at,
    })
}

/// Gives `path` and everything under it back to this process's user (and group), following
/// no link; only it may then write there (mode bits stay).
pub(crate) fn take_back(path: &Path) -> Result<(), RestoreError> {
    let (uid, gid) = (rustix::process::geteuid(), rustix::process::getegid());
    let io = |source| RestoreError::Io {
        action: "taking the clone back from the server's user".into(),
        dir: path.to_path_buf(),
        source,
    };
    std::os::unix::fs::lchown(path, Some(uid.as_raw()), Some(gid.as_raw())).map_err(io)?;
    if std::fs::symlink_metadata(path).map_err(io)?.is_dir() {
        for entry in std::fs::read_dir(path).map_err(io)? {
            take_back(&entry.map_err(io)?.path())?;
        }
    }
    Ok(())
}

/// `mysqld --initialize-insecure` into `datadir` (the recipient's own, empty data: its
/// root has no password and logs in only through the socket, which is Tidemark's), with
/// the source's geometry.
pub(crate) async fn initialize(
    tools: &Tools,
    datadir: &Path,
    out: &Path,
    user: Option<&str>,
    geometry: crate::tools::MySqlGeometry,
) -> Result<(), RestoreError> {
    let log = out.join("initialize.log");
    let mut cmd = Command::new(&tools.mysqld);
    cmd.arg("--no-defaults")
        .args(geometry.args())
        .arg("--initialize-insecure")
        .arg(format!("--datadir={}", datadir.display()))
        .arg(format!("--log-error={}", log.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(user) = user {
        cmd.arg(format!("--user={user}"));
    }
    let child = spawn(&mut cmd, &tools.mysqld)?;
    let done = child
        .wait_with_output()
        .await
        .map_err(|source| RestoreError::Spawn {
            program: tools.mysqld.to_string_lossy().into_owned(),
            source,
        })?;
    if !done.status.success() {
        return Err(RestoreError::Tool {
            step: "mysqld --initialize-insecure (the clone's recipient)".into(),
            status: done.status.to_string(),
            tail: tail(&std::fs::read_to_string(&log).unwrap_or_default()),
        });
    }
    Ok(())
}

/// A tar of `dir`'s contents (directories and plain files, names relative to `dir`),
/// written on a thread of its own; the handle tells how it ended. Anything else in the
/// directory (a link, a socket) fails the stream, and each file is opened without
/// following a link.
pub fn stream(
    dir: PathBuf,
) -> (
    impl AsyncRead + Send + Unpin + 'static,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (read, write) = tokio::io::duplex(1 << 20);
    let task = tokio::task::spawn_blocking(move || {
        let sink = tokio_util::io::SyncIoBridge::new(write);
        let mut tar = tar::Builder::new(sink);
        tar.mode(tar::HeaderMode::Deterministic);
        tar.follow_symlinks(false);
        // Holes are written out (zeros compress to nothing): a plain tar, read by any tar.
        tar.sparse(false);
        append_dir(&mut tar, &dir, Path::new(""))?;
        let mut sink = tar.into_inner()?;
        sink.flush()?;
        sink.shutdown()
    });
    (read, task)
}

fn append_dir<W: Write>(tar: &mut tar::Builder<W>, dir: &Path, rel: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let name = rel.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            tar.append_dir(&name, entry.path())?;
            append_dir(tar, &entry.path(), &name)?;
        } else if kind.is_file() {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                .open(entry.path())?;
            let meta = file.metadata()?;
            if !meta.is_file() {
                return Err(bad_entry(format!(
                    "{} changed into something else while it was read",
                    entry.path().display()
                )));
            }
            let mut header = tar::Header::new_gnu();
            header.set_metadata_in_mode(&meta, tar::HeaderMode::Deterministic);
            header.set_size(meta.len());
            tar.append_data(&mut header, &name, file.take(meta.len()))?;
        } else {
            return Err(bad_entry(format!(
                "{} is neither a directory nor a plain file: a clone holds only those",
                entry.path().display()
            )));
        }
    }
    Ok(())
}

/// Why a payload's entry is refused.
fn bad_entry(problem: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, problem)
}

/// The longest name a payload's entry may have (a GNU long-name entry's body).
const MAX_NAME: u64 = 4096;

/// Names a payload may not hold at the top of the data directory: files a MySQL server
/// reads as its own settings (`mysqld-auto.cnf`, whose persisted values outrank options)
/// or identity (`auto.cnf`), which a clone never carries.
const REFUSED_NAMES: [&str; 3] = ["mysqld-auto.cnf", "auto.cnf", "mysqld.my"];

/// The entries of a tar read from `from` into `datadir` (which exists, empty): plain files
/// and directories only, at relative paths of plain names — no link of either kind, no
/// device, no `..`, no absolute path, at most [`MAX_DEPTH`] deep and [`MAX_ENTRIES`] in
/// all, no extended header, a long name of at most [`MAX_NAME`] bytes. Every directory on
/// the way is opened without following a link (each step from the one before), so a link
/// planted in the data directory leads nowhere; files are made new (never through an
/// existing one), mode 0640, directories 0750; no owner, mode or time of the payload's is
/// applied. Returns the entries written.
///
/// # Errors
/// The first entry refused (named), or a read or write failed. What was written stays:
/// the caller removes the directory.
pub fn unpack(from: impl Read, datadir: &Path) -> std::io::Result<u64> {
    use rustix::fs::{Mode, OFlags};
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let root = rustix::fs::open(datadir, dir_flags, Mode::empty())?;
    let mut archive = tar::Archive::new(from);
    let mut count = 0u64;
    let mut long_name: Option<Vec<u8>> = None;
    for entry in archive.entries()?.raw(true) {
        let mut entry = entry?;
        count += 1;
        if count > MAX_ENTRIES {
            return Err(bad_entry(format!(
                "more than {MAX_ENTRIES} entries: not a clone"
            )));
        }
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::GNULongName {
            let size = entry.size();
            if size > MAX_NAME {
                return Err(bad_entry(format!(
                    "a long name of {size} bytes: at most {MAX_NAME}"
                )));
            }
            let mut name = Vec::new();
            entry.read_to_end(&mut name)?;
            while name.last() == Some(&0) {
                name.pop();
            }
            long_name = Some(name);
            continue;
        }
        let bytes = long_name
            .take()
            .unwrap_or_else(|| entry.path_bytes().into_owned());
        let path =
            PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(bytes));
        let shown = path.display().to_string();
        let mut names = Vec::new();
        for c in path.components() {
            match c {
                Component::Normal(n) => names.push(n.to_owned()),
                Component::CurDir => {}
                _ => {
                    return Err(bad_entry(format!(
                        "entry {shown:?} leaves the data directory: only relative paths of plain names"
                    )));
                }
            }
        }
        let Some((last, parents)) = names.split_last() else {
            return Err(bad_entry(format!("entry {shown:?}: an empty path")));
        };
        if names.len() > MAX_DEPTH {
            return Err(bad_entry(format!(
                "entry {shown:?}: a path of 1 to {MAX_DEPTH} names"
            )));
        }
        if parents.is_empty() && REFUSED_NAMES.iter().any(|r| last == r) {
            return Err(bad_entry(format!(
                "entry {shown:?}: a clone carries no such file, and a server would read it as its own"
            )));
        }
        let is_dir = match kind {
            tar::EntryType::Directory => true,
            tar::EntryType::Regular | tar::EntryType::Continuous => false,
            other => {
                return Err(bad_entry(format!(
                    "entry {shown:?} is a {other:?}: a clone holds only directories and plain files"
                )));
            }
        };
        let refused = |e: std::io::Error| bad_entry(format!("entry {shown:?}: {e}"));
        // Each directory on the way, made when missing and opened without following a link.
        let mut at = root.try_clone()?;
        let walk: &[std::ffi::OsString] = if is_dir { &names } else { parents };
        for name in walk {
            match rustix::fs::mkdirat(&at, name.as_os_str(), Mode::from_raw_mode(0o750)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(refused(e.into())),
            }
            at = rustix::fs::openat(&at, name.as_os_str(), dir_flags, Mode::empty())
                .map_err(|e| refused(e.into()))?;
        }
        if is_dir {
            continue;
        }
        let fd = rustix::fs::openat(
            &at,
            last.as_os_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o640),
        )
        .map_err(|e| refused(e.into()))?;
        let mut file = std::fs::File::from(fd);
        std::io::copy(&mut entry, &mut file)?;
    }
    Ok(count)
}

/// Downloads backup `m`'s payload (checked against its checksum as it streams) and
/// unpacks it into `datadir` ([`unpack`]). Returns the payload's bytes.
///
/// # Errors
/// The download or its checksum failed, or an entry was refused.
pub async fn extract(
    store: &ClusterStore,
    m: &Metadata,
    datadir: &Path,
    progress: &dyn Progress,
) -> Result<u64, RestoreError> {
    let (read, mut write) = tokio::io::duplex(1 << 20);
    let dir = datadir.to_path_buf();
    let unpacking = tokio::task::spawn_blocking(move || {
        let source = tokio_util::io::SyncIoBridge::new(read);
        unpack(source, &dir)
    });
    let copied = transfer::download(store, m, &mut write, progress).await;
    drop(write);
    let unpacked = unpacking.await.map_err(|e| RestoreError::Io {
        action: "unpacking the clone".into(),
        dir: datadir.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let payload = copied?;
    unpacked.map_err(|source| RestoreError::Io {
        action: format!("unpacking backup {}", m.backup_id),
        dir: datadir.to_path_buf(),
        source,
    })?;
    Ok(payload.size)
}

pub use tidemark_store::format::GTID_EXECUTED_FIELD;

/// `metadata.json`'s `server` field holding the source's `gtid_mode` when cloned.
pub const GTID_MODE_FIELD: &str = "gtidMode";

/// The geometry a clone backup records (MySQL's defaults where it does not, or records a
/// value out of range).
pub(crate) fn geometry(m: &Metadata) -> crate::tools::MySqlGeometry {
    let field = |name: &str| {
        m.server
            .as_ref()
            .and_then(|s| s.extra.get(name))
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    let default = crate::tools::MySqlGeometry::default();
    crate::tools::MySqlGeometry {
        page_size: field("innodbPageSize")
            .filter(|n| matches!(n, 4096 | 8192 | 16384 | 32768 | 65536))
            .unwrap_or(default.page_size),
        lower_case_table_names: field("lowerCaseTableNames")
            .filter(|n| *n <= 2)
            .unwrap_or(default.lower_case_table_names),
    }
}

/// A downloaded segment's GTIDs.
fn read_gtids(path: &PathBuf) -> Result<crate::mysql::MySqlGtids, RestoreError> {
    let mut f = std::fs::File::open(path).map_err(|source| RestoreError::Io {
        action: "reading a binlog's GTIDs".into(),
        dir: path.clone(),
        source,
    })?;
    crate::mysql::gtids(&mut f).map_err(|e| RestoreError::Tool {
        step: format!("reading the GTIDs of {}", path.display()),
        status: e.to_string(),
        tail: String::new(),
    })
}

/// What a replay across timelines must not apply: what each earlier timeline's files
/// hold that the later history does not (the old primary's transactions after the
/// switch, which the new primary never had). The later history of a timeline is its
/// first file's `Previous_gtids` and every later file's transactions. A file whose GTIDs
/// cannot all be read fails the replay: its transactions could not be told apart.
///
/// # Errors
/// A file cannot be read, or holds transactions that cannot be read by GTID.
fn branches(files: &[PathBuf], runs: &[(usize, usize)]) -> Result<GtidSet, RestoreError> {
    let read = read_gtids;
    let unreadable = |path: &PathBuf| RestoreError::Tool {
        step: format!("reading the GTIDs of {}", path.display()),
        status: "a transaction without a readable GTID (tagged, anonymous or malformed): \
                 a replay across a failover needs every transaction's"
            .into(),
        tail: String::new(),
    };
    let mut later = GtidSet::default();
    let mut out = GtidSet::default();
    for (k, &(first, count)) in runs.iter().enumerate().rev() {
        let mut held = GtidSet::default();
        for path in files.iter().skip(first).take(count) {
            let g = read(path)?;
            held = held.union(&g.held().ok_or_else(|| unreadable(path))?);
            if path == &files[first] {
                later = later.union(g.previous.as_ref().unwrap_or(&GtidSet::default()));
            }
        }
        if k + 1 < runs.len() {
            out = out.union(&held.difference(&later));
        }
        later = later.union(&held);
    }
    Ok(out)
}

/// Replays `files` onto the unpacked clone `m` in `datadir` up to `stop` (exclusive:
/// events stamped at or after it are not applied), on a private server ([`PrivateServer`],
/// MySQL's: no network, no binlog, never root), as an account with [`REPLAY_GRANTS`]:
/// `mysqlbinlog --exclude-gtids=<what the clone holds> --stop-datetime … | mysql`, every
/// timeline's files in one pass (a transaction the new primary replicated is applied once,
/// from the old primary's file: the server skips a GTID it holds; what the old primary
/// wrote after the switch is excluded, [`branches`]). Returns the GTID set the data then
/// the GTID set the data then holds, and the time of the last transaction applied.
///
/// # Errors
/// The clone records no GTID set (nothing tells which events it holds), a tool failed, or
/// the server did not start or stop cleanly.
pub async fn replay(
    m: &Metadata,
    datadir: &Path,
    work: &Path,
    tools: &Tools,
    files: &[PathBuf],
    runs: &[(usize, usize)],
    stop: jiff::Timestamp,
) -> Result<
    (
        GtidSet,
        Option<jiff::Timestamp>,
        Option<crate::oracle::Comparison>,
    ),
    RestoreError,
> {
    // A source without GTIDs: nothing tells which events the clone holds.
    let gtids_off = m
        .server
        .as_ref()
        .and_then(|s| s.extra.get(GTID_MODE_FIELD))
        .is_some_and(|v| v != "ON");
    let Some(holds) = m.gtid_set().filter(|_| !gtids_off) else {
        return Err(RestoreError::NoPosition {
            id: m.backup_id.clone(),
            completed: m.completed_at,
        });
    };
    // The first file replayed starts after its server's `Previous_gtids`: what the clone
    // lacks of it is in no file the replay takes.
    if let Some(first) = files.first() {
        let g = read_gtids(first)?;
        if let Some(missing) = g
            .previous
            .map(|p| p.difference(&holds))
            .filter(|m| !m.is_empty())
        {
            return Err(RestoreError::MySqlGap {
                id: m.backup_id.clone(),
                segment: first
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                missing: missing.to_string(),
                completed: m.completed_at,
            });
        }
    }
    let holds = if runs.len() > 1 {
        holds.union(&branches(files, runs)?)
    } else {
        holds
    };
    let mut server =
        PrivateServer::start_flavor(&Flavor::MySql(geometry(m)), datadir, work, tools).await?;
    // The clone's own checksum runs: those the replay computes again come after.
    let since = server.oracle_base_run(tools).await;
    let replayed = async {
        // One pass per timeline, in order: mysqlbinlog stops at the first event at or after
        // the stop and skips every later file, so the old primary's events after it (its
        // lost transactions, its shutdown) must not end the new primary's.
        for &(first, count) in runs {
            let Some(run) = files.get(first..first + count) else {
                return Err(RestoreError::Tool {
                    step: "planning the replay".into(),
                    status: format!("a run names segments {first}..{}", first + count),
                    tail: String::new(),
                });
            };
            // Made anew for each run: whatever the run before did to its account is undone.
            let login = server
                .account(tools, crate::server::Account::Replay)
                .await?;
            replay_run(&server, &login, tools, run, &holds, stop, work).await?;
        }
        let text = server
            .admin_query(tools, "SELECT @@GLOBAL.gtid_executed")
            .await?;
        let executed =
            GtidSet::parse(text.replace("\\n", "").trim()).map_err(|e| RestoreError::Tool {
                step: "reading the restored GTID set".into(),
                status: e.to_string(),
                tail: String::new(),
            })?;
        // The restore oracle (issue 48), where the data holds it.
        Ok((executed, server.oracle_compare(tools, since).await))
    }
    .await;
    let stopped = server.stop(tools, "mysqld shutdown after replay").await;
    let (after, oracle) = replayed?;
    stopped?;
    // The last transaction applied: in each run's files up to the first event at or after
    // the stop, not skipped (what the clone held, or excluded).
    let mut reached = None;
    for &(first, count) in runs {
        for path in files.iter().skip(first).take(count) {
            let Some((last, stopped)) = std::fs::File::open(path)
                .ok()
                .and_then(|mut f| crate::mysql::last_applied(&mut f, stop, &holds).ok())
            else {
                break;
            };
            reached = reached.max(last);
            if stopped {
                break;
            }
        }
    }
    Ok((after, reached, oracle))
}

async fn replay_run(
    server: &PrivateServer,
    login: &crate::server::Login,
    tools: &Tools,
    files: &[PathBuf],
    holds: &GtidSet,
    stop: jiff::Timestamp,
    work: &Path,
) -> Result<(), RestoreError> {
    let mut binlog = crate::server::decoder(&tools.mysqlbinlog, work, stop)?;
    binlog.arg(format!("--exclude-gtids={holds}")).args(files);
    let (b, c) = crate::server::decode_into(
        &mut binlog,
        &tools.mysqlbinlog,
        &tools.mysql,
        login,
        &server.socket,
        work,
    )
    .await?;
    if !b.status.success() {
        return Err(RestoreError::Tool {
            step: "mysqlbinlog".into(),
            status: b.status.to_string(),
            tail: tail(&String::from_utf8_lossy(&b.stderr)),
        });
    }
    if !c.status.success() {
        return Err(RestoreError::Tool {
            step: "mysql (applying the binlog events)".into(),
            status: c.status.to_string(),
            tail: tail(&String::from_utf8_lossy(&c.stderr)),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn the_source_comes_from_the_clients_options() {
        let d = Donor::from_command(&cmd(&[
            "mysql",
            "--host=db",
            "-P",
            "3307",
            "-utm",
            "--password=p'\"w",
        ]))
        .unwrap();
        assert_eq!(
            (
                d.host.as_str(),
                d.port,
                d.user.as_str(),
                d.password.as_str()
            ),
            ("db", 3307, "tm", "p'\"w")
        );
        assert_eq!(d.address(), "db:3307");
        assert!(
            !format!("{d:?}").contains("p'"),
            "the password is never shown"
        );
        for (words, says) in [
            (&["mysql"][..], "no --user"),
            (&["mysql", "-u", "x", "--socket=/s"], "over TCP"),
            (&["mysql", "-u", "x", "--port=0"], "not a port"),
            (&["mysql", "-u", "x", "-p"], "attached"),
            (&["mysql", "-u", "x", "--init-command=x"], "not understood"),
            (&["mysql", "-u", "x\n"], "control character"),
            (&[][..], "needs a command"),
        ] {
            let e = Donor::from_command(&cmd(words)).unwrap_err();
            assert!(e.contains(says), "{words:?}: {e}");
        }
    }

    #[test]
    fn the_login_may_come_from_an_options_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("my.cnf");
        std::fs::write(
            &file,
            "[mysqld]\nuser=mysql\n[client]\n# the operator's login\nuser=\"backup\"\npassword=\"p#w\\\\x\\\"y\"\n",
        )
        .unwrap();
        let arg = format!("--defaults-extra-file={}", file.display());
        let d = Donor::from_command(&cmd(&["mysql", &arg, "--host=db", "--port=3307"])).unwrap();
        assert_eq!(
            (
                d.host.as_str(),
                d.port,
                d.user.as_str(),
                d.password.as_str()
            ),
            ("db", 3307, "backup", "p#w\\x\"y")
        );
        // Later options win.
        let d = Donor::from_command(&cmd(&["mysql", &arg, "-u", "other"])).unwrap();
        assert_eq!(
            (d.user.as_str(), d.password.as_str()),
            ("other", "p#w\\x\"y")
        );
        let missing = format!(
            "--defaults-extra-file={}",
            dir.path().join("none").display()
        );
        let e = Donor::from_command(&cmd(&["mysql", &missing])).unwrap_err();
        assert!(e.contains("none"), "{e}");
        // Only first: elsewhere it is an option like any other, refused.
        let e = Donor::from_command(&cmd(&["mysql", "-u", "x", &arg])).unwrap_err();
        assert!(e.contains("not understood"), "{e}");
        // A CA: PEM certificates, read once; anything else is refused by name.
        let ca = dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let d = Donor::from_command(&cmd(&[
            "mysql",
            "-u",
            "x",
            "--ssl-ca",
            ca.to_str().unwrap(),
        ]))
        .unwrap();
        assert_eq!(
            d.ssl_ca.unwrap(),
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
            "the certificates only"
        );
        for bad in [
            file.clone(),
            dir.path().join("none"),
            dir.path().to_path_buf(),
        ] {
            let arg = format!("--ssl-ca={}", bad.display());
            let e = Donor::from_command(&cmd(&["mysql", "-u", "x", &arg])).unwrap_err();
            assert!(e.starts_with("--ssl-ca="), "{e}");
        }
    }

    #[test]
    fn literals_are_quoted() {
        assert_eq!(sql_literal(r"a'b\c"), r"'a\'b\\c'");
        assert_eq!(option_value(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(version_of("9.7.4-2"), Some((9, 7, 4)));
        assert_eq!(version_of("8.0.17"), Some((8, 0, 17)));
        assert!(version_of("8.0.16").unwrap() < OLDEST);
        assert_eq!(version_of("x"), None);
    }

    /// A payload whose entries leave the directory, link, or are devices writes nothing
    /// outside it and is refused, naming the entry; a clean one unpacks.
    #[test]
    fn a_forged_payload_writes_nothing_outside_the_data_directory() {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "kept").unwrap();
        let raw = |name: &str, kind: tar::EntryType, link: Option<&Path>| {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(if kind == tar::EntryType::Regular {
                4
            } else {
                0
            });
            h.set_mode(0o4755);
            if let Some(l) = link {
                h.set_link_name(l).unwrap();
            }
            // Written raw: the builder's own checks would refuse some of these names.
            let bytes = name.as_bytes();
            h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            h.set_cksum();
            let data: &[u8] = if kind == tar::EntryType::Regular {
                b"evil"
            } else {
                b""
            };
            b.append(&h, data).unwrap();
            b.into_inner().unwrap()
        };
        let up = format!(
            "../{}/victim",
            outside.path().file_name().unwrap().to_string_lossy()
        );
        let cases = [
            (
                raw(&up, tar::EntryType::Regular, None),
                "leaves the data directory",
            ),
            (
                raw(&victim.to_string_lossy(), tar::EntryType::Regular, None),
                "leaves",
            ),
            (
                raw("link", tar::EntryType::Symlink, Some(&victim)),
                "Symlink",
            ),
            (raw("hard", tar::EntryType::Link, Some(&victim)), "Link"),
            (raw("dev", tar::EntryType::Char, None), "Char"),
            (raw("fifo", tar::EntryType::Fifo, None), "Fifo"),
        ];
        for (payload, says) in cases {
            let data = tempfile::tempdir().unwrap();
            let datadir = data.path().join("d");
            std::fs::create_dir(&datadir).unwrap();
            let e = unpack(&payload[..], &datadir).unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
            assert_eq!(std::fs::read_to_string(&victim).unwrap(), "kept");
            assert_eq!(std::fs::read_dir(&datadir).unwrap().count(), 0, "{says}");
            assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
        }
        // A symbolic link already in the way is not followed either.
        let data = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&victim, data.path().join("f")).unwrap();
        let e = unpack(&raw("f", tar::EntryType::Regular, None)[..], data.path()).unwrap_err();
        assert!(e.to_string().contains("\"f\""), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "kept");

        // Nor one planted as a directory on the way.
        let data = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), data.path().join("mysql")).unwrap();
        let e = unpack(
            &raw("mysql/victim", tar::EntryType::Regular, None)[..],
            data.path(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("mysql/victim"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "kept");
        // A server's own settings file, an extended header, a long name too long.
        for (payload, says) in [
            (
                raw("mysqld-auto.cnf", tar::EntryType::Regular, None),
                "no such file",
            ),
            (raw("pax", tar::EntryType::XHeader, None), "XHeader"),
        ] {
            let data = tempfile::tempdir().unwrap();
            let e = unpack(&payload[..], data.path()).unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
        }
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(MAX_NAME + 1);
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_cksum();
        b.append(&h, &vec![b'a'; usize::try_from(MAX_NAME).unwrap() + 1][..])
            .unwrap();
        let data = tempfile::tempdir().unwrap();
        let e = unpack(&b.into_inner().unwrap()[..], data.path()).unwrap_err();
        assert!(e.to_string().contains("long name"), "{e}");

        // A clean payload, streamed from a directory, unpacks to the same files.
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("shop")).unwrap();
        std::fs::write(src.path().join("shop/t.ibd"), b"pages").unwrap();
        // A name longer than a plain tar header holds (a GNU long name).
        let long = format!("shop/{}.ibd", "t".repeat(150));
        std::fs::write(src.path().join(&long), b"long").unwrap();
        std::fs::write(src.path().join("ibdata1"), b"system").unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let bytes = rt.block_on(async {
            use tokio::io::AsyncReadExt as _;
            let (mut r, task) = stream(src.path().to_path_buf());
            let mut v = Vec::new();
            r.read_to_end(&mut v).await.unwrap();
            task.await.unwrap().unwrap();
            v
        });
        let data = tempfile::tempdir().unwrap();
        assert_eq!(
            unpack(&bytes[..], data.path()).unwrap(),
            5,
            "4 entries, 1 long name"
        );
        assert_eq!(std::fs::read(data.path().join(&long)).unwrap(), b"long");
        assert_eq!(
            std::fs::read(data.path().join("shop/t.ibd")).unwrap(),
            b"pages"
        );
        assert_eq!(
            std::fs::read(data.path().join("ibdata1")).unwrap(),
            b"system"
        );
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(data.path().join("ibdata1"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o640);
        // A link in the directory fails the stream.
        std::os::unix::fs::symlink("/etc/passwd", src.path().join("shop/l")).unwrap();
        let failed = rt.block_on(async {
            use tokio::io::AsyncReadExt as _;
            let (mut r, task) = stream(src.path().to_path_buf());
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v).await;
            task.await.unwrap()
        });
        assert!(failed.unwrap_err().to_string().contains("neither"));
    }
}
