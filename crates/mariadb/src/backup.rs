//! MariaDB physical backups with `mariabackup`: the command line of a streamed backup, and
//! what it leaves in `--extra-lsndir` (LSNs and the binlog position) for `metadata.json`.
//!
//! An incremental starts from its parent's `toLsn`, read from the parent's
//! `metadata.json`, so a backup needs no local state from the previous one.

use std::path::Path;

use serde::{Deserialize, Serialize};

use tidemark_store::format::{LogPosition, Metadata};

/// The `method` of backups taken with `mariabackup`.
pub const METHOD: &str = "mariabackup";
/// The payload extension of a mariabackup stream.
pub const EXT: &str = "xbstream";
/// The `metadata.json` field that holds [`Lsns`].
pub const EXTRA_FIELD: &str = "mariabackup";
/// Files `mariabackup --extra-lsndir` writes.
pub const CHECKPOINTS_FILE: &str = "xtrabackup_checkpoints";
pub const INFO_FILE: &str = "xtrabackup_info";

/// The LSN range a backup covers, from `xtrabackup_checkpoints`; recorded in
/// `metadata.json` as `"mariabackup": {"fromLsn", "toLsn", "lastLsn"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lsns {
    pub from_lsn: u64,
    /// The checkpoint LSN: an incremental on top of this backup starts here.
    pub to_lsn: u64,
    pub last_lsn: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum MariaDbError {
    #[error("{file}: {problem}")]
    Malformed { file: String, problem: String },
    #[error("cannot read {file}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "backup {id} has no mariabackup LSNs in its metadata.json (method {method:?}); an incremental with --method mariabackup needs a parent taken with --method mariabackup"
    )]
    NoLsns { id: String, method: String },
    #[error(
        "the server's checkpoint LSN {to_lsn} {LSN_BEHIND} {from_lsn}: it is not the data directory the parent was taken from (a rebuilt or restored server), so this incremental would miss changes; take a full backup"
    )]
    LsnBehind { from_lsn: u64, to_lsn: u64 },
    #[error(
        "the data directory {path} ({ours}) {OTHER_DATA_DIRECTORY} {id} ({parent}): a server rebuilt or restored since, whose pages an incremental would mix with the parent's (its LSNs may well be ahead of the parent's), so it is not taken; take a full backup"
    )]
    OtherDataDirectory {
        path: String,
        id: String,
        parent: String,
        ours: String,
    },
}

/// The field of the `mariabackup` object of `metadata.json` naming the data directory the
/// backup was taken of ([`data_directory_identity`]).
pub const DATA_DIRECTORY_FIELD: &str = "dataDirectory";

/// Which data directory `datadir` is, as the file system tells: when its system
/// tablespace `ibdata1` was made (its birth time, to the nanosecond). InnoDB never makes
/// `ibdata1` again in a data directory it runs on; a data directory initialised anew (a
/// replica rebuilt from nothing) or restored file by file (a copy) has another one,
/// whatever its LSNs. The same directory keeps it wherever it is mounted (the inode
/// number, which some network file systems do not keep across mounts, is not part of
/// it). A block-level rollback of the volume (a snapshot reverted in place) keeps it too:
/// only the LSN check guards that. `None` when unknown (no `ibdata1` there, or a file
/// system that keeps no birth time).
pub fn data_directory_identity(datadir: &Path) -> Option<String> {
    let born = std::fs::metadata(datadir.join("ibdata1"))
        .ok()?
        .created()
        .ok()?;
    let born = jiff::Timestamp::try_from(born).ok()?;
    Some(format!("ibdata1 made {born}"))
}

/// The data directory a backup recorded ([`DATA_DIRECTORY_FIELD`]), if it did.
pub fn data_directory_of(m: &Metadata) -> Option<&str> {
    m.extra
        .get(EXTRA_FIELD)?
        .get(DATA_DIRECTORY_FIELD)?
        .as_str()
}

/// The data directory of a `mariabackup` command line (`--datadir=DIR`, `--datadir DIR`,
/// or mariabackup's short `-h DIR` / `-hDIR`; the last one, which is the one it takes).
pub fn datadir_of_command(command: &[String]) -> Option<&Path> {
    let mut found = None;
    let mut args = command.iter();
    while let Some(a) = args.next() {
        if let Some(dir) = a.strip_prefix("--datadir=") {
            found = Some(Path::new(dir));
        } else if a == "--datadir" || a == "-h" {
            found = args.next().map(Path::new);
        } else if let Some(dir) = a.strip_prefix("-h").filter(|d| !d.is_empty()) {
            found = Some(Path::new(dir));
        }
    }
    found
}

/// The arguments Tidemark appends to the user's `mariabackup` command line: a streamed
/// backup whose LSNs and binlog position land in `lsndir`, incremental from
/// `incremental_lsn` when given.
pub fn backup_args(lsndir: &Path, incremental_lsn: Option<u64>) -> Vec<String> {
    let dir = lsndir.display();
    let mut args = vec![
        "--backup".to_owned(),
        "--stream=xbstream".to_owned(),
        // On a replica, the position it applied at the consistent point (in its stderr):
        // a position in the primary's history, which the replica's own binlog offset is not.
        "--slave-info".to_owned(),
        // mariabackup wants a target dir even when streaming; nothing large is written.
        format!("--target-dir={dir}"),
        format!("--extra-lsndir={dir}"),
    ];
    if let Some(lsn) = incremental_lsn {
        args.push(format!("--incremental-lsn={lsn}"));
    }
    args
}

/// The LSNs recorded in a backup's `metadata.json`.
///
/// # Errors
/// The backup was not taken with `--method mariabackup` (or its field is malformed).
pub fn lsns_of(m: &Metadata) -> Result<Lsns, MariaDbError> {
    m.extra
        .get(EXTRA_FIELD)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .ok_or_else(|| MariaDbError::NoLsns {
            id: m.backup_id.clone(),
            method: m.method.clone(),
        })
}

/// The `metadata.json` field for `lsns`.
pub fn lsns_field(lsns: &Lsns) -> (String, serde_json::Value) {
    (
        EXTRA_FIELD.to_owned(),
        serde_json::json!({
            "fromLsn": lsns.from_lsn,
            "toLsn": lsns.to_lsn,
            "lastLsn": lsns.last_lsn,
        }),
    )
}

/// The words of a [`MariaDbError::LsnBehind`] that its recorded error keeps.
const LSN_BEHIND: &str = "is behind the parent's";
/// The words of a [`MariaDbError::OtherDataDirectory`] that its recorded error keeps.
const OTHER_DATA_DIRECTORY: &str = "is not the one the parent was taken of";

/// Whether a failed attempt's recorded error says the server was behind its parent, or is
/// another data directory than its parent's: the next scheduled backup of that data
/// directory starts a new chain with a full.
pub fn is_lsn_behind(error: &str) -> bool {
    error.contains(LSN_BEHIND) || error.contains(OTHER_DATA_DIRECTORY)
}

/// Parses `xtrabackup_checkpoints` (`key = value` lines).
///
/// # Errors
/// A missing or non-numeric LSN.
pub fn parse_checkpoints(text: &str) -> Result<Lsns, MariaDbError> {
    let get = |key: &str| -> Result<u64, MariaDbError> {
        let value = key_values(text)
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
            .ok_or_else(|| MariaDbError::Malformed {
                file: CHECKPOINTS_FILE.into(),
                problem: format!("no {key} line"),
            })?;
        value.parse().map_err(|_| MariaDbError::Malformed {
            file: CHECKPOINTS_FILE.into(),
            problem: format!("{key} = {value:?} is not a number"),
        })
    };
    Ok(Lsns {
        from_lsn: get("from_lsn")?,
        to_lsn: get("to_lsn")?,
        last_lsn: get("last_lsn")?,
    })
}

fn key_values(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
}

/// The binlog position in `xtrabackup_info`'s `binlog_pos` line, e.g.
/// `filename 'mysql-bin.000002', position '1032', GTID of the last change '0-1-4'`.
/// `None` when binary logging is off (no such line, or an empty one).
///
/// # Errors
/// A `binlog_pos` line of another shape.
pub fn parse_binlog_pos(info: &str) -> Result<Option<LogPosition>, MariaDbError> {
    let Some(value) = key_values(info)
        .find(|(k, _)| *k == "binlog_pos")
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
    else {
        return Ok(None);
    };
    let malformed = || MariaDbError::Malformed {
        file: INFO_FILE.into(),
        problem: format!(
            "binlog_pos = {value:?}: expected filename 'F', position 'N'[, GTID of the last change 'G']"
        ),
    };
    // The quoted fields in order: file, position, GTID (GTIDs and file names hold no quote).
    let quoted: Vec<&str> = value.split('\'').skip(1).step_by(2).collect();
    let (file, position) = match quoted.as_slice() {
        [file, position, ..] => (*file, *position),
        _ => return Err(malformed()),
    };
    let position = position.parse().map_err(|_| malformed())?;
    if file.is_empty() {
        return Err(malformed());
    }
    let gtid = quoted
        .get(2)
        .filter(|g| !g.is_empty())
        .map(|g| (*g).to_owned());
    Ok(Some(LogPosition {
        file: file.to_owned(),
        position,
        gtid,
    }))
}

/// The words mariabackup's `--slave-info` logs on a replica, before the applied position:
/// `MySQL slave binlog position: gtid_slave_pos '0-1-42'; master '' master_use_gtid = …`.
const SLAVE_POSITION: &str = "MySQL slave binlog position:";

/// The replica's applied position from a line mariabackup logged, if it is that line.
pub fn slave_position_line(line: &str) -> Option<String> {
    let rest = line.split_once(SLAVE_POSITION)?.1;
    let quoted = rest.split_once("gtid_slave_pos '")?.1;
    let gtid = quoted.split_once('\'')?.0.trim();
    Some(gtid.to_owned())
}

/// What a server says about itself: the server a backup is taken on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerProbe {
    pub server_id: Option<u32>,
    /// It replicates from another server (a replication connection is configured).
    pub replica: bool,
    /// `Seconds_Behind_Master` (none while replication is stopped).
    pub lag_seconds: Option<u64>,
    /// Both replication threads run.
    pub replicating: bool,
    /// A Galera node (`wsrep_on` is `ON`).
    pub galera: bool,
}

/// What the probe asks: who the server is, whether it is a Galera node (`NULL` on a server
/// built without it), and its replication connections. The operator's standby check asks
/// the same.
pub const PROBE_SQL: &str = "SELECT @@server_id AS server_id, (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_VARIABLES WHERE VARIABLE_NAME = 'WSREP_ON') AS wsrep_on; SHOW ALL SLAVES STATUS";
/// How long the probe may take.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// The options of a `mariabackup` command line that say how to reach the server (the same
/// for the `mariadb` client): host, port, socket, user, password, option files. An option
/// file comes first, as the client wants it. mariabackup's `-H` is the client's `-h`;
/// its `-h` is the data directory, no connection option.
pub fn client_options(mariabackup_args: &[String]) -> Vec<String> {
    const WITH_VALUE: [&str; 7] = [
        "--host",
        "--port",
        "--socket",
        "--user",
        "--password",
        "--defaults-file",
        "--defaults-extra-file",
    ];
    const SHORT: [&str; 5] = ["-H", "-P", "-S", "-u", "-p"];
    let mut files = Vec::new();
    let mut rest = Vec::new();
    let mut it = mariabackup_args.iter().peekable();
    while let Some(a) = it.next() {
        // The data directory, with its value when apart.
        if a == "-h" {
            it.next();
            continue;
        }
        // The host, as the client spells it.
        if let Some(host) = a.strip_prefix("-H") {
            let host = if host.is_empty() {
                it.next().map(String::as_str)
            } else {
                Some(host)
            };
            if let Some(h) = host {
                rest.push(format!("-h{h}"));
            }
            continue;
        }
        let name = a.split_once('=').map_or(a.as_str(), |(n, _)| n);
        let long = WITH_VALUE.contains(&name);
        let target = if name.starts_with("--defaults") {
            &mut files
        } else {
            &mut rest
        };
        if long {
            if a.contains('=') || name == "--password" {
                target.push(a.clone());
            } else if let Some(v) = it.next() {
                target.push(format!("{a}={v}"));
            }
        } else if let Some(short) = SHORT.iter().find(|s| a.starts_with(**s)) {
            if a.len() > short.len() || *short == "-p" {
                target.push(a.clone());
            } else if let Some(v) = it.next() {
                target.push(format!("{a}{v}"));
            }
        }
    }
    files.extend(rest);
    files
}

/// Asks a server who it is and whether (and how far behind) it replicates, with the
/// `mariadb` client and the connection options `client`.
///
/// # Errors
/// The client cannot run, cannot connect, or answers something else (as text).
pub async fn probe_server(
    mariadb: &std::ffi::OsStr,
    client: &[String],
) -> Result<ServerProbe, String> {
    Ok(parse_probe(
        &ask(mariadb, client, &["-B"], PROBE_SQL).await?,
    ))
}

/// Runs `sql` with the `mariadb` client, the connection options `client` and `flags`, within
/// [`PROBE_TIMEOUT`]; its output.
///
/// # Errors
/// The client cannot run, cannot connect, or fails (its last line of stderr).
pub(crate) async fn ask(
    mariadb: &std::ffi::OsStr,
    client: &[String],
    flags: &[&str],
    sql: &str,
) -> Result<String, String> {
    let asked = tokio::process::Command::new(mariadb)
        .args(client)
        .args(flags)
        .args(["-e", sql])
        .stdin(std::process::Stdio::null())
        .env_remove(tidemark_store::crypt::IDENTITY_ENV)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PROBE_TIMEOUT, asked)
        .await
        .map_err(|_| format!("no answer within {} s", PROBE_TIMEOUT.as_secs()))?
        .map_err(|e| format!("cannot run {}: {e}", mariadb.to_string_lossy()))?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stderr);
        return Err(text.lines().last().unwrap_or("failed").to_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Parses the batch output of [`PROBE_SQL`]: a header (`server_id`, `wsrep_on`) and its
/// values, then (on a replica) `SHOW ALL SLAVES STATUS`'s header line and one line per
/// connection.
pub fn parse_probe(text: &str) -> ServerProbe {
    let mut lines = text.lines();
    let mut probe = ServerProbe::default();
    if let Some(head) = lines.next().filter(|h| h.starts_with("server_id")) {
        let names: Vec<&str> = head.split('\t').map(str::trim).collect();
        let values: Vec<String> = lines
            .next()
            .unwrap_or_default()
            .split('\t')
            .map(|v| v.trim().to_owned())
            .collect();
        let value = |n: &str| {
            names
                .iter()
                .position(|x| *x == n)
                .and_then(|i| values.get(i))
        };
        probe.server_id = value("server_id").and_then(|v| v.parse().ok());
        probe.galera = value("wsrep_on").is_some_and(|v| v.eq_ignore_ascii_case("ON"));
    }
    let Some(header) = lines.next() else {
        return probe;
    };
    let columns: Vec<&str> = header.split('\t').collect();
    let col = |row: &[&str], name: &str| {
        columns
            .iter()
            .position(|c| *c == name)
            .and_then(|i| row.get(i).map(|v| v.to_string()))
    };
    for line in lines {
        let row: Vec<&str> = line.split('\t').collect();
        probe.replica = true;
        let running = col(&row, "Slave_IO_Running").as_deref() == Some("Yes")
            && col(&row, "Slave_SQL_Running").as_deref() == Some("Yes");
        probe.replicating |= running;
        let lag = col(&row, "Seconds_Behind_Master").and_then(|v| v.parse::<u64>().ok());
        probe.lag_seconds = match (probe.lag_seconds, lag) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    probe
}

/// Reads what `mariabackup --extra-lsndir=dir` left: the LSNs and the binlog position.
///
/// # Errors
/// A file is missing or malformed.
pub fn read_lsndir(dir: &Path) -> Result<(Lsns, Option<LogPosition>), MariaDbError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|source| MariaDbError::Read {
            file: path.display().to_string(),
            source,
        })
    };
    let lsns = parse_checkpoints(&read(CHECKPOINTS_FILE)?)?;
    let position = parse_binlog_pos(&read(INFO_FILE)?)?;
    Ok((lsns, position))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--datadir` in any form; the last one wins, as mariabackup reads options.
    #[test]
    fn the_datadir_is_read_off_the_command_line() {
        let cmd = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            datadir_of_command(&cmd(&[
                "mariabackup",
                "--host=h",
                "--datadir=/var/lib/mysql"
            ])),
            Some(Path::new("/var/lib/mysql"))
        );
        assert_eq!(
            datadir_of_command(&cmd(&["mariabackup", "--datadir", "/d", "--datadir=/e"])),
            Some(Path::new("/e"))
        );
        assert_eq!(
            datadir_of_command(&cmd(&["mariabackup", "--datadir"])),
            None
        );
        assert_eq!(
            datadir_of_command(&cmd(&["mariabackup", "--user=root"])),
            None
        );
    }

    #[test]
    fn checkpoints_parse() {
        let text = "backup_type = incremental\nfrom_lsn = 44404\nto_lsn = 44410\nlast_lsn = 48630\nrecover_binlog_info = 0\n";
        assert_eq!(
            parse_checkpoints(text).unwrap(),
            Lsns {
                from_lsn: 44404,
                to_lsn: 44410,
                last_lsn: 48630
            }
        );
        let e = parse_checkpoints("from_lsn = 1\nto_lsn = x\nlast_lsn = 2").unwrap_err();
        assert!(e.to_string().contains("to_lsn = \"x\""), "{e}");
        assert!(parse_checkpoints("from_lsn = 1\n").is_err());
    }

    #[test]
    fn binlog_position_parses() {
        let info = "tool_name = mariabackup\nbinlog_pos = filename 'mysql-bin.000001', position '826', GTID of the last change '0-1-3,1-2-9'\ninnodb_from_lsn = 0\n";
        assert_eq!(
            parse_binlog_pos(info).unwrap(),
            Some(LogPosition {
                file: "mysql-bin.000001".into(),
                position: 826,
                gtid: Some("0-1-3,1-2-9".into()),
            })
        );
        let no_gtid = "binlog_pos = filename 'b.000002', position '4', GTID of the last change ''";
        assert_eq!(parse_binlog_pos(no_gtid).unwrap().unwrap().gtid, None);
        assert_eq!(parse_binlog_pos("tool_name = mariabackup\n").unwrap(), None);
        assert_eq!(parse_binlog_pos("binlog_pos = \n").unwrap(), None);
        assert!(parse_binlog_pos("binlog_pos = filename 'x', position 'y'").is_err());
    }

    #[test]
    fn incremental_args_carry_the_lsn() {
        let args = backup_args(Path::new("/tmp/l"), Some(44404));
        assert!(args.contains(&"--stream=xbstream".to_owned()));
        assert!(args.contains(&"--extra-lsndir=/tmp/l".to_owned()));
        assert_eq!(args.last().unwrap(), "--incremental-lsn=44404");
        assert!(
            !backup_args(Path::new("/tmp/l"), None)
                .iter()
                .any(|a| a.starts_with("--incremental"))
        );
    }

    #[test]
    fn what_a_replica_says() {
        assert_eq!(
            slave_position_line(
                "[00] 2026-11-27 13:29:59 MySQL slave binlog position: gtid_slave_pos '0-2-12'; master '' master_use_gtid = slave_pos"
            )
            .as_deref(),
            Some("0-2-12")
        );
        assert_eq!(slave_position_line("[00] Streaming ./ibdata1"), None);
        let probe = parse_probe(
            "server_id\twsrep_on\n2\tOFF\nConnection_name\tSlave_IO_Running\tSlave_SQL_Running\tSeconds_Behind_Master\n\tYes\tYes\t3\n",
        );
        assert_eq!(
            probe,
            ServerProbe {
                server_id: Some(2),
                replica: true,
                lag_seconds: Some(3),
                replicating: true,
                galera: false,
            }
        );
        assert!(parse_probe("server_id\twsrep_on\n5\tON\n").galera);
        assert!(!parse_probe("server_id\twsrep_on\n5\tNULL\n").galera);
        let primary = parse_probe("server_id\n1\n");
        assert_eq!((primary.server_id, primary.replica), (Some(1), false));
        let stopped = parse_probe(
            "server_id\n3\nSlave_IO_Running\tSlave_SQL_Running\tSeconds_Behind_Master\nNo\tYes\tNULL\n",
        );
        assert_eq!((stopped.replicating, stopped.lag_seconds), (false, None));
    }

    #[test]
    fn connection_options_come_from_the_mariabackup_command_line() {
        let args: Vec<String> = [
            "--host=10.0.0.5",
            "--port",
            "3306",
            "--parallel=4",
            "-u",
            "backup",
            "--defaults-extra-file=/secret/my.cnf",
            "--target-dir=/x",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            client_options(&args),
            [
                "--defaults-extra-file=/secret/my.cnf",
                "--host=10.0.0.5",
                "--port=3306",
                "-ubackup"
            ]
        );
        // mariabackup's short options: -H the host, -h the data directory.
        let short: Vec<String> = [
            "-H",
            "db.local",
            "-h",
            "/var/lib/mysql",
            "-P3307",
            "-Hother",
            "-h/d",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(client_options(&short), ["-hdb.local", "-P3307", "-hother"]);
    }
}
