//! What a server must provide for each of Tidemark's tasks (issue 46 §1), asked at the start
//! of every backup and every archive pass, so a missing grant, `log_bin` off or
//! `server_id` 0 is named at once — with the statement that fixes it — instead of failing
//! minutes later inside `mariabackup` or `mariadb-binlog`. `docs/database.md` is the page
//! for users; its `GRANT` statements are the ones built here.
//!
//! The privileges are those MariaDB 10.5+ names (10.11 tested): `SUPER` still carries
//! `BINLOG MONITOR`, `SLAVE MONITOR` and `BINLOG ADMIN` there, never `RELOAD`, `PROCESS` or
//! `REPLICATION SLAVE`; the old names (`REPLICATION CLIENT`, `REPLICA MONITOR`,
//! `REPLICATION REPLICA`) count as the new. Grants are read from `SHOW GRANTS`, which lists
//! the account's own, its current role's and `PUBLIC`'s: all of them are in force.

use std::collections::BTreeSet;

/// What is asked: the settings, the account (`user@host`), then its grants, a line each.
pub const SETTINGS_SQL: &str = "SELECT @@server_id, @@log_bin, @@log_slave_updates, @@gtid_strict_mode, CURRENT_USER(), @@version; SHOW GRANTS";
/// [`SETTINGS_SQL`] for MySQL 8.0.26 and newer (issue 47), whose GTIDs are on or off
/// rather than strict: `gtid_mode = ON` stands in the place of `gtid_strict_mode`.
pub const MYSQL_SETTINGS_SQL: &str = "SELECT @@server_id, @@log_bin, @@log_replica_updates, @@gtid_mode = 'ON', CURRENT_USER(), @@version; SHOW GRANTS";
/// [`MYSQL_SETTINGS_SQL`] before 8.0.26, which named the setting for replicas' updates
/// otherwise.
pub const MYSQL_OLD_SETTINGS_SQL: &str = "SELECT @@server_id, @@log_bin, @@log_slave_updates, @@gtid_mode = 'ON', CURRENT_USER(), @@version; SHOW GRANTS";

/// The global privileges a `mariabackup --backup --slave-info` run needs (10.11: `BACKUP
/// STAGE` wants `RELOAD`, the redo log `PROCESS`, `SHOW MASTER STATUS` `BINLOG MONITOR`,
/// `SHOW ALL SLAVES STATUS` `SLAVE MONITOR`); the standby probe asks with the same account.
pub const BACKUP_GRANTS: [&str; 4] = ["RELOAD", "PROCESS", "BINLOG MONITOR", "SLAVE MONITOR"];
/// Reading binlogs over the network (`mariadb-binlog --read-from-remote-server`) and
/// listing them (`SHOW BINARY LOGS`, `BINLOG_GTID_POS`).
pub const ARCHIVE_GRANTS: [&str; 2] = ["REPLICATION SLAVE", "BINLOG MONITOR"];
/// `PURGE BINARY LOGS`, besides [`ARCHIVE_GRANTS`].
pub const PURGE_GRANTS: [&str; 1] = ["BINLOG ADMIN"];

/// What a server said of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub server_id: u64,
    pub log_bin: bool,
    pub log_slave_updates: bool,
    pub gtid_strict_mode: bool,
    /// The account logged in as, quoted for a statement (`'backup'@'%'`).
    pub account: String,
    /// Every global privilege in force (`ALL PRIVILEGES` as itself).
    pub privileges: BTreeSet<String>,
    /// The server's major and minor version (`10.11` of `10.11.19-MariaDB-log`), when read.
    pub version: Option<(u32, u32)>,
    /// It is MySQL (its version names no MariaDB): its rights have MySQL's names.
    pub mysql: bool,
}

/// What a task is refused for, and what it is only warned of.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// Each a clause: what is missing and what fixes it.
    pub missing: Vec<String>,
    pub warnings: Vec<String>,
}

impl Findings {
    /// The message a refused task fails with, naming every missing thing; none when
    /// nothing is.
    pub fn refusal(&self, task: &str) -> Option<String> {
        (!self.missing.is_empty()).then(|| {
            format!(
                "the server cannot serve {task}: {} (docs/database.md lists what each task needs)",
                self.missing.join("; ")
            )
        })
    }
}

/// The name a privilege is listed under now.
fn canonical(privilege: &str) -> &str {
    match privilege {
        "REPLICATION CLIENT" => "BINLOG MONITOR",
        "REPLICA MONITOR" => "SLAVE MONITOR",
        "REPLICATION REPLICA" => "REPLICATION SLAVE",
        // MySQL's dynamic privilege.
        "BINLOG_ADMIN" => "BINLOG ADMIN",
        p => p,
    }
}

/// Parses the batch answer (`-N -B`) to [`SETTINGS_SQL`].
///
/// # Errors
/// The first line is not the five values asked for (as text, for the message).
pub fn parse(answer: &str) -> Result<Server, String> {
    let mut lines = answer.lines();
    let first = lines.next().unwrap_or_default();
    let values: Vec<&str> = first.split('\t').map(str::trim).collect();
    let [
        server_id,
        log_bin,
        log_slave_updates,
        gtid_strict_mode,
        user,
        version,
    ] = values[..]
    else {
        return Err(format!("not the settings asked for: {first:?}"));
    };
    let mysql = !version.contains("MariaDB");
    let version = {
        let mut parts = version.split(['.', '-']);
        let major = parts.next().and_then(|p| p.parse().ok());
        let minor = parts.next().and_then(|p| p.parse().ok());
        major.zip(minor)
    };
    let flag = |v: &str| v == "1" || v.eq_ignore_ascii_case("ON");
    let server_id = server_id
        .parse()
        .map_err(|_| format!("server_id {server_id:?} is not a number"))?;
    let account = match user.rsplit_once('@') {
        Some((u, h)) => format!("'{u}'@'{h}'"),
        None => format!("'{user}'"),
    };
    let mut privileges = BTreeSet::new();
    for line in lines {
        // `GRANT <privileges> ON *.* TO …`: role grants (`GRANT \`r\` TO …`) and grants on
        // one database or table carry no global privilege.
        let Some(list) = line
            .strip_prefix("GRANT ")
            .and_then(|rest| rest.split_once(" ON *.* TO "))
            .map(|(list, _)| list)
        else {
            continue;
        };
        // (MySQL lists its dynamic privileges with no space after the comma.)
        for p in list.split(',') {
            privileges.insert(canonical(p.trim()).to_owned());
        }
    }
    Ok(Server {
        server_id,
        log_bin: flag(log_bin),
        log_slave_updates: flag(log_slave_updates),
        gtid_strict_mode: flag(gtid_strict_mode),
        account,
        privileges,
        version,
        mysql,
    })
}

impl Server {
    /// Whether `privilege` (a name of [`BACKUP_GRANTS`] and the others) is in force.
    /// `SUPER` carries the binlog and replica monitors and `BINLOG ADMIN` before MariaDB
    /// 11.0 only (MDEV-29668 took them from it); a server whose version is unknown is
    /// taken as 11 (the stricter reading).
    pub fn has(&self, privilege: &str) -> bool {
        const CARRIED_BY_SUPER: [&str; 3] = ["BINLOG MONITOR", "SLAVE MONITOR", "BINLOG ADMIN"];
        let super_carries = !self.mysql && self.version.is_some_and(|v| v < (11, 0));
        self.privileges.contains("ALL PRIVILEGES")
            || self.privileges.contains(privilege)
            || (super_carries
                && CARRIED_BY_SUPER.contains(&privilege)
                && self.privileges.contains("SUPER"))
    }

    /// The missing ones of `wanted`, as the statement that grants them.
    fn grant_missing(&self, wanted: &[&str], findings: &mut Findings) {
        let missing: Vec<&str> = wanted
            .iter()
            .copied()
            .filter(|p| !self.has(p))
            // MySQL's names for what MariaDB split out.
            .map(|p| match p {
                "BINLOG MONITOR" if self.mysql => "REPLICATION CLIENT",
                "BINLOG ADMIN" if self.mysql => "BINLOG_ADMIN",
                p => p,
            })
            .collect();
        if !missing.is_empty() {
            findings.missing.push(format!(
                "the account {} lacks {} (GRANT {} ON *.* TO {})",
                self.account,
                missing.join(", "),
                missing.join(", "),
                self.account
            ));
        }
    }

    /// What a `mariabackup` backup needs of this server: the grants (refused without);
    /// `log_bin` and a `server_id` only warned of, since the backup is still whole without
    /// them — it just records no binlog position, so nothing restores past it.
    pub fn for_backup(&self) -> Findings {
        let mut f = Findings::default();
        self.grant_missing(&BACKUP_GRANTS, &mut f);
        if !self.log_bin {
            f.warnings.push(
                "log_bin is OFF: the backup records no binlog position, so no point-in-time restore starts from it (set log_bin, docs/database.md)".into(),
            );
        } else if self.server_id == 0 {
            f.warnings.push(
                "server_id is 0: no replica or binlog reader can connect to this server (set server_id to a number unique in the cluster, docs/database.md)".into(),
            );
        }
        f
    }

    /// What reading this server's binlogs needs (and purging them, with `purge`): refused
    /// without binary logging, with `server_id` 0 (the server refuses binlog readers) or
    /// without the grants.
    pub fn for_archive(&self, purge: bool) -> Findings {
        let mut f = Findings::default();
        if !self.log_bin {
            f.missing
                .push("log_bin is OFF, so there are no binlogs to archive (start the server with log_bin, docs/database.md)".into());
        }
        if self.server_id == 0 {
            f.missing.push(
                "server_id is 0, and such a server refuses binlog readers (set server_id to a number unique in the cluster)".into(),
            );
        }
        let mut wanted: Vec<&str> = ARCHIVE_GRANTS.to_vec();
        if purge {
            wanted.extend(PURGE_GRANTS);
        }
        self.grant_missing(&wanted, &mut f);
        f
    }
}

/// Asks a server for [`SETTINGS_SQL`] with the `mariadb` client and the connection
/// options `client` (those of the task's own command line: the same account).
///
/// # Errors
/// The client cannot run, cannot connect or fails, or answers something else (as text).
pub async fn ask(mariadb: &std::ffi::OsStr, client: &[String]) -> Result<Server, String> {
    parse(&crate::backup::ask(mariadb, client, &["-N", "-B"], SETTINGS_SQL).await?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn server(grants: &str) -> Server {
        parse(&format!(
            "7\t1\t0\t0\tbackup@%\t10.11.19-MariaDB-log\n{grants}"
        ))
        .unwrap()
    }

    /// Grants of the account, its role and PUBLIC count; database-level ones and role
    /// grants do not; old names count as the new; SUPER carries only what 10.11 lets it.
    #[test]
    fn grants_in_force_are_read_from_show_grants() {
        let s = server(
            "GRANT `r1` TO `backup`@`%`\n\
             GRANT RELOAD, PROCESS, REPLICATION CLIENT ON *.* TO `backup`@`%`\n\
             GRANT REPLICA MONITOR ON *.* TO `r1`\n\
             GRANT SELECT, INSERT ON `test`.* TO PUBLIC\n",
        );
        assert_eq!(s.account, "'backup'@'%'");
        assert_eq!(s.server_id, 7);
        assert!(s.log_bin && !s.log_slave_updates);
        assert_eq!(s.for_backup(), Findings::default());
        assert!(!s.has("SELECT"));
        let f = s.for_archive(true);
        assert_eq!(
            f.missing,
            vec![
                "the account 'backup'@'%' lacks REPLICATION SLAVE, BINLOG ADMIN (GRANT REPLICATION SLAVE, BINLOG ADMIN ON *.* TO 'backup'@'%')"
            ]
        );
        let sup = server("GRANT SUPER ON *.* TO `s`@`localhost`\n");
        assert_eq!(
            sup.for_backup().missing,
            vec![
                "the account 'backup'@'%' lacks RELOAD, PROCESS (GRANT RELOAD, PROCESS ON *.* TO 'backup'@'%')"
            ]
        );
        assert!(sup.has("BINLOG ADMIN") && !sup.has("REPLICATION SLAVE"));
        assert_eq!(sup.version, Some((10, 11)));
        // From 11.0, SUPER carries none of them.
        let eleven =
            parse("7\t1\t0\t0\ts@localhost\t11.4.2-MariaDB\nGRANT SUPER ON *.* TO `s`@`localhost`")
                .unwrap();
        assert!(!eleven.has("BINLOG ADMIN") && !eleven.has("SLAVE MONITOR"));
        let all = server("GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION\n");
        assert_eq!(all.for_archive(true), Findings::default());
    }

    #[test]
    fn settings_that_stop_a_task_are_named() {
        let off =
            parse("0\t0\t0\t0\tarch@127.0.0.1\t10.11.19-MariaDB\nGRANT ALL PRIVILEGES ON *.* TO `arch`@`127.0.0.1`")
                .unwrap();
        let f = off.for_archive(false);
        assert_eq!(f.missing.len(), 2, "{f:?}");
        let said = f.refusal("a binlog archive pass").unwrap();
        assert!(
            said.contains("log_bin is OFF") && said.contains("server_id is 0"),
            "{said}"
        );
        // A backup is still whole: warned of, not refused.
        let b = off.for_backup();
        assert!(b.missing.is_empty() && b.refusal("a backup").is_none());
        assert!(b.warnings[0].contains("log_bin is OFF"), "{b:?}");
        assert!(parse("x\t1").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn a_mysql_servers_rights_are_read_by_mysqls_names() {
        let s = parse(
            "2\t1\t1\t1\tarchiver@127.0.0.1\t9.7.4-2\n\
             GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `archiver`@`127.0.0.1`\n\
             GRANT APPLICATION_PASSWORD_ADMIN,BACKUP_ADMIN ON *.* TO `archiver`@`127.0.0.1`",
        )
        .unwrap();
        assert!(s.mysql);
        assert!(s.has("REPLICATION SLAVE") && s.has("BINLOG MONITOR") && s.has("BACKUP_ADMIN"));
        assert_eq!(s.for_archive(false), Findings::default());
        assert_eq!(
            s.for_archive(true).missing,
            vec![
                "the account 'archiver'@'127.0.0.1' lacks BINLOG_ADMIN (GRANT BINLOG_ADMIN ON *.* TO 'archiver'@'127.0.0.1')"
            ]
        );
        let bare = parse("2\t1\t1\t1\ta@%\t8.0.40\nGRANT SUPER ON *.* TO `a`@`%`").unwrap();
        assert_eq!(
            bare.for_archive(false).missing,
            vec![
                "the account 'a'@'%' lacks REPLICATION SLAVE, REPLICATION CLIENT (GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'a'@'%')"
            ],
            "MySQL's SUPER carries neither"
        );
    }
}
