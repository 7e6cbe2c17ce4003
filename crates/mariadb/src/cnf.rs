//! A backup's `backup-my.cnf`, read as hostile input (issue 28 finding 1).
//!
//! `mariabackup --backup` writes the InnoDB geometry the files were written with into
//! `backup-my.cnf`, and `mariabackup --prepare` reads that file from the directory it
//! prepares, whatever else it says: `plugin_dir=/proc/self/cwd` and `plugin_load=evil.so`
//! beside an `evil.so` in the backup run that library in `mariabackup`, and in `mariadbd`
//! started with `--defaults-file` on it. The file comes from the bucket, so whoever can
//! write the bucket could run code where backups are restored — with the identity that
//! decrypts every backup in reach.
//!
//! So no tool ever reads the file as it came: once a payload is extracted, the file is
//! parsed here against an allow-list of the geometry settings `mariabackup` writes, each
//! value checked against its form, and rewritten with those settings only (the data
//! directory a restore leaves holds the rewritten file). Anything else — another setting, a
//! value outside its form, another option group, an `!include` — refuses the backup, named,
//! before any tool runs on it.

use std::path::{Path, PathBuf};

/// The file's name inside a backup.
pub const FILE: &str = "backup-my.cnf";

/// Largest `backup-my.cnf` read (`mariabackup` writes a few hundred bytes).
pub const MAX_BYTES: u64 = 64 << 10;

/// A `backup-my.cnf` refused: what it says that no tool may be handed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "backup {backup_id}: its {FILE} {problem}; tidemark hands a tool only the InnoDB geometry \
     mariabackup writes there ({}), so the backup was not prepared (a backup of a server using \
     plugins such as encryption keys cannot be restored by tidemark, or the file was planted \
     by someone who can write the bucket)",
    ALLOWED.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
)]
pub struct Refused {
    pub backup_id: String,
    pub problem: String,
}

/// The settings `mariabackup` writes into `backup-my.cnf`, with the form of each value.
struct Allowed {
    name: &'static str,
    valid: fn(&str) -> bool,
}

const ALLOWED: [Allowed; 8] = [
    Allowed {
        name: "innodb_checksum_algorithm",
        valid: |v| {
            [
                "crc32",
                "strict_crc32",
                "full_crc32",
                "strict_full_crc32",
                "innodb",
                "strict_innodb",
                "none",
                "strict_none",
            ]
            .contains(&v)
        },
    },
    Allowed {
        name: "innodb_data_file_path",
        valid: data_file_path,
    },
    Allowed {
        name: "innodb_log_file_size",
        valid: |v| number(v, 1 << 20, 1 << 40),
    },
    Allowed {
        name: "innodb_page_size",
        valid: |v| ["4096", "8192", "16384", "32768", "65536"].contains(&v),
    },
    // The undo tablespaces are copied into the backup's own directory.
    Allowed {
        name: "innodb_undo_directory",
        valid: |v| v == "./" || v == ".",
    },
    Allowed {
        name: "innodb_undo_tablespaces",
        valid: |v| number(v, 0, 127),
    },
    Allowed {
        name: "innodb_compression_level",
        valid: |v| number(v, 0, 9),
    },
    Allowed {
        name: "innodb_buffer_pool_filename",
        valid: file_name,
    },
];

/// A decimal number in `lo..=hi`, without sign or leading zeros.
fn number(v: &str, lo: u64, hi: u64) -> bool {
    !v.is_empty()
        && v.len() <= 20
        && v.bytes().all(|b| b.is_ascii_digit())
        && (v == "0" || !v.starts_with('0'))
        && v.parse::<u64>().is_ok_and(|n| (lo..=hi).contains(&n))
}

/// One file name inside the data directory: letters, digits, `_`, `-`, `.`; not starting
/// with `.`.
fn file_name(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 64
        && !v.starts_with('.')
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// `ibdata1:12M:autoextend`, or several `;`-separated (`name:size[:autoextend[:max:size]]`);
/// no raw partitions, no paths.
fn data_file_path(v: &str) -> bool {
    let size = |s: &str| {
        let digits = s.strip_suffix(['K', 'M', 'G', 'k', 'm', 'g']).unwrap_or(s);
        number(digits, 1, 1 << 40)
    };
    let spec = |s: &str| {
        let parts: Vec<&str> = s.split(':').collect();
        match parts.as_slice() {
            [name, sz] => file_name(name) && size(sz),
            [name, sz, "autoextend"] => file_name(name) && size(sz),
            [name, sz, "autoextend", "max", max] => file_name(name) && size(sz) && size(max),
            _ => false,
        }
    };
    !v.is_empty() && v.len() <= 1024 && v.split(';').count() <= 16 && v.split(';').all(spec)
}

/// The geometry read from a `backup-my.cnf`: allowed settings with valid values, in the
/// order of [`ALLOWED`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Geometry {
    settings: Vec<(&'static str, String)>,
}

impl Geometry {
    /// Parses the text of a `backup-my.cnf` of backup `backup_id`.
    ///
    /// # Errors
    /// Anything outside the allow-list, named (the first one).
    pub fn parse(text: &str, backup_id: &str) -> Result<Self, Refused> {
        let refused = |problem: String| Refused {
            backup_id: backup_id.chars().take(253).collect(),
            problem,
        };
        let shown = |s: &str| format!("{:?}", s.chars().take(80).collect::<String>());
        let mut values: Vec<Option<String>> = vec![None; ALLOWED.len()];
        let mut in_mysqld = false;
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if line.starts_with('!') {
                return Err(refused(format!("has the directive {}", shown(line))));
            }
            if let Some(group) = line.strip_prefix('[') {
                let group = group.strip_suffix(']').map(str::trim);
                in_mysqld = group == Some("mysqld");
                if group.is_none() {
                    return Err(refused(format!("has the line {}", shown(line))));
                }
                continue;
            }
            let (key, value) = line.split_once('=').unwrap_or((line, ""));
            // The server's own spellings of one option: `-` or `_`, any `loose-` prefix.
            let key = key.trim().replace('-', "_");
            let key = key.strip_prefix("loose_").unwrap_or(&key);
            let value = value.trim();
            if !in_mysqld {
                return Err(refused(format!(
                    "sets {} outside the [mysqld] group",
                    shown(key)
                )));
            }
            let Some(i) = ALLOWED.iter().position(|a| a.name == key) else {
                return Err(refused(format!("sets {}", shown(line))));
            };
            if !(ALLOWED[i].valid)(value) {
                return Err(refused(format!(
                    "sets {} to {}, outside its form",
                    ALLOWED[i].name,
                    shown(value)
                )));
            }
            // As the server reads it: the last setting wins.
            values[i] = Some(value.to_owned());
        }
        Ok(Geometry {
            settings: ALLOWED
                .iter()
                .zip(values)
                .filter_map(|(a, v)| Some((a.name, v?)))
                .collect(),
        })
    }

    /// Reads and checks `dir`'s `backup-my.cnf` (none: the server's defaults).
    ///
    /// # Errors
    /// It is refused (`Ok(Err)`), or cannot be read.
    pub fn read(dir: &Path, backup_id: &str) -> std::io::Result<Result<Self, Refused>> {
        let path = dir.join(FILE);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Ok(Geometry::default()));
            }
            Err(e) => return Err(e),
        };
        let refused = |problem: String| {
            Ok(Err(Refused {
                backup_id: backup_id.chars().take(253).collect(),
                problem,
            }))
        };
        if !meta.is_file() {
            return refused("is not a regular file".into());
        }
        if meta.len() > MAX_BYTES {
            return refused(format!(
                "is {} bytes long (at most {MAX_BYTES} are read)",
                meta.len()
            ));
        }
        let bytes = std::fs::read(&path)?;
        match String::from_utf8(bytes) {
            Ok(text) => Ok(Geometry::parse(&text, backup_id)),
            Err(_) => refused("is not UTF-8 text".into()),
        }
    }

    /// Reads, checks and rewrites `dir`'s `backup-my.cnf` with the geometry only, before any
    /// tool reads it. Returns the geometry.
    ///
    /// # Errors
    /// It is refused (`Ok(Err)`), or cannot be read or written.
    pub fn sanitize(dir: &Path, backup_id: &str) -> std::io::Result<Result<Self, Refused>> {
        let geometry = match Geometry::read(dir, backup_id)? {
            Ok(g) => g,
            Err(refused) => return Ok(Err(refused)),
        };
        let path = dir.join(FILE);
        if path.exists() {
            // A new file in its place (never written through whatever was there).
            let tmp: PathBuf = dir.join(format!(".{FILE}.tidemark"));
            std::fs::write(&tmp, geometry.render())?;
            std::fs::rename(&tmp, &path)?;
        }
        Ok(Ok(geometry))
    }

    /// The file's text, as written back.
    #[must_use]
    pub fn render(&self) -> String {
        let mut text = String::from(
            "# The InnoDB geometry of this backup, as mariabackup recorded it; rewritten by\n\
             # tidemark, which keeps only these settings.\n[mysqld]\n",
        );
        for (k, v) in &self.settings {
            text.push_str(&format!("{k}={v}\n"));
        }
        text
    }

    /// The same settings as `mariadbd` command-line options.
    #[must_use]
    pub fn args(&self) -> Vec<String> {
        self.settings
            .iter()
            .map(|(k, v)| format!("--{}={v}", k.replace('_', "-")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const WRITTEN: &str = "# This options file was generated by innobackupex.\n\n# The server\n\
        [mysqld]\ninnodb_checksum_algorithm=crc32\ninnodb_data_file_path=ibdata1:12M:autoextend\n\
        innodb_log_file_size=100663296\ninnodb_page_size=16384\ninnodb_undo_directory=./\n\
        innodb_undo_tablespaces=0\ninnodb_compression_level=6\n\n\n";

    #[test]
    fn what_mariabackup_writes_is_kept_whole() {
        let g = Geometry::parse(WRITTEN, "b1").unwrap();
        assert_eq!(g.settings.len(), 7);
        assert_eq!(Geometry::parse(&g.render(), "b1").unwrap(), g);
        assert!(g.args().contains(&"--innodb-page-size=16384".to_owned()));
        assert!(
            g.args()
                .contains(&"--innodb-data-file-path=ibdata1:12M:autoextend".to_owned())
        );
        let two = "[mysqld]\ninnodb_data_file_path=ibdata1:12M;ibdata2:1G:autoextend:max:2G\n";
        assert!(Geometry::parse(two, "b").is_ok());
    }

    #[test]
    fn everything_else_is_refused_and_named() {
        for (extra, named) in [
            (
                "plugin_dir=/proc/self/cwd\nplugin_load=evil.so",
                "plugin_dir",
            ),
            ("plugin-load-add=evil.so", "plugin-load-add"),
            ("loose-plugin-load=evil.so", "plugin-load"),
            // A prefix of an option the server would accept as the whole name.
            ("plugin-lo=evil.so", "plugin-lo"),
            ("!include /etc/shadow", "!include"),
            ("!includedir /proc/self/cwd", "!includedir"),
            (
                "[mariabackup]\ninnodb_page_size=16384",
                "outside the [mysqld]",
            ),
            ("innodb_page_size=12345", "innodb_page_size"),
            ("innodb_undo_directory=/etc", "innodb_undo_directory"),
            (
                "innodb_data_file_path=/dev/sda:10G",
                "innodb_data_file_path",
            ),
            (
                "innodb_data_file_path=../ibdata1:12M",
                "innodb_data_file_path",
            ),
            (
                "innodb_data_file_path=ibdata1:10Gnewraw",
                "innodb_data_file_path",
            ),
            (
                "innodb_buffer_pool_filename=/root/x",
                "innodb_buffer_pool_filename",
            ),
            ("innodb_log_file_size=0100663296", "innodb_log_file_size"),
            ("[mysqld", "[mysqld"),
            ("init_file=/proc/self/cwd/x.sql", "init_file"),
        ] {
            let text = format!("{WRITTEN}{extra}\n");
            let e = Geometry::parse(&text, "b7").unwrap_err();
            let said = e.to_string();
            assert!(said.contains(named), "{extra}: {said}");
            assert!(said.contains("backup b7"), "{said}");
        }
    }

    #[test]
    fn the_file_is_rewritten_before_any_tool_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(FILE),
            format!("{WRITTEN}# a comment\nloose-innodb-page-size=16384\n"),
        )
        .unwrap();
        let g = Geometry::sanitize(dir.path(), "b").unwrap().unwrap();
        let now = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert_eq!(now, g.render());
        assert!(!now.contains("comment"), "{now}");
        // Refused: left as it came (nothing reads it).
        std::fs::write(dir.path().join(FILE), "[mysqld]\nplugin_load=x.so\n").unwrap();
        assert!(Geometry::sanitize(dir.path(), "b").unwrap().is_err());
        // Not a file, or too long.
        let big = tempfile::tempdir().unwrap();
        std::fs::write(big.path().join(FILE), vec![b'#'; MAX_BYTES as usize + 1]).unwrap();
        assert!(Geometry::read(big.path(), "b").unwrap().is_err());
        let link = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", link.path().join(FILE)).unwrap();
        let e = Geometry::read(link.path(), "b").unwrap().unwrap_err();
        assert!(e.problem.contains("not a regular file"), "{e}");
        // None at all: the server's defaults.
        let none = tempfile::tempdir().unwrap();
        assert_eq!(
            Geometry::read(none.path(), "b").unwrap().unwrap(),
            Geometry::default()
        );
    }
}
