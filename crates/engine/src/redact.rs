//! Secrets never reach a record or a log. A backup command line is shown in errors and
//! recorded in `metadata.json` when an attempt fails; an argument that looks like it holds
//! a secret (`--password=…`, `-pSECRET`, `--password SECRET`, `MYSQL_PWD=…`,
//! `scheme://user:secret@host`) is shown as `***` instead. Credentials belong in an option
//! file (`--defaults-extra-file`) or the environment, which are never recorded.

use std::ops::Range;

/// What a secret is shown as.
pub const HIDDEN: &str = "***";

/// Fragments of option or variable names that carry secrets.
const SECRET_NAMES: [&str; 9] = [
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "credential",
    "apikey",
    "api-key",
    "api_key",
];

fn secret_name(name: &str) -> bool {
    let name = name.trim_start_matches('-').to_ascii_lowercase();
    SECRET_NAMES.iter().any(|s| name.contains(s)) || name.ends_with("-key") || name == "key"
}

/// The arguments with every secret-looking value replaced by [`HIDDEN`]. An argument is
/// judged whole first (`--password=two words`, `mysql://u:p&ss@h`); one that holds no
/// secret as a whole but is itself a command line (`sh -c "mariabackup --password=…"`,
/// `ssh db 'mysqldump -p…'`) is read word by word as a shell would split it, at every
/// level of quoting, and shown as written with the secret words hidden.
pub fn redact(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut hide_next = false;
    for arg in args {
        if hide_next {
            hide_next = false;
            if !arg.starts_with('-') {
                out.push(HIDDEN.to_owned());
                continue;
            }
        }
        let whole = redact_one(arg, &mut hide_next);
        if whole != *arg {
            out.push(whole);
            continue;
        }
        let words = shell_split(arg);
        if words.len() < 2 {
            out.push(whole);
            continue;
        }
        // A command line in one argument: its own words (each shorter than the line, so
        // this ends), its own "next" secrets, kept as written but for the hidden words.
        let plain: Vec<String> = words.iter().map(|(w, _)| w.clone()).collect();
        let mut shown = String::with_capacity(arg.len());
        let mut from = 0;
        for ((word, span), hidden) in words.iter().zip(redact(&plain)) {
            if *word != hidden {
                shown.push_str(&arg[from..span.start]);
                shown.push_str(&hidden);
                from = span.end;
            }
        }
        shown.push_str(&arg[from..]);
        out.push(shown);
    }
    out
}

/// Splits a command line into words as a POSIX shell would (quotes and backslashes),
/// well enough to find secrets in it: each word with the byte range it was written in.
fn shell_split(line: &str) -> Vec<(String, Range<usize>)> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut start = None;
    let mut chars = line.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            c if c.is_ascii_whitespace()
                || matches!(c, ';' | '|' | '&' | '(' | ')' | '<' | '>') =>
            {
                if let Some(start) = start.take() {
                    words.push((std::mem::take(&mut word), start..at));
                }
                continue;
            }
            _ => {
                start.get_or_insert(at);
            }
        }
        match c {
            '\'' => {
                for (_, q) in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                while let Some((_, q)) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => word.extend(chars.next().map(|(_, c)| c)),
                        _ => word.push(q),
                    }
                }
            }
            '\\' => word.extend(chars.next().map(|(_, c)| c)),
            c => word.push(c),
        }
    }
    if let Some(start) = start {
        words.push((word, start..line.len()));
    }
    words
}

/// One word's secret, hidden with everything after it in the word (a value may hold
/// spaces or shell separators). A word whose name or scheme holds a blank is a command
/// line, left to [`redact`]'s split.
fn redact_one(arg: &str, hide_next: &mut bool) -> String {
    let blank = |s: &str| s.bytes().any(|b| b.is_ascii_whitespace());
    // NAME=value and --name=value.
    if let Some((name, _)) = arg.split_once('=')
        && !name.contains("://")
        && !blank(name)
        && secret_name(name)
    {
        return format!("{name}={HIDDEN}");
    }
    // --password VALUE
    if arg.starts_with('-') && !arg.contains('=') && !blank(arg) && secret_name(arg) {
        *hide_next = true;
        return arg.to_owned();
    }
    // The MySQL short form -pSECRET (a lone -p prompts, and is harmless).
    if let Some(rest) = arg.strip_prefix("-p")
        && !rest.is_empty()
        && !arg.starts_with("--")
    {
        return format!("-p{HIDDEN}");
    }
    // scheme://user:secret@host (the last `@`: a password may hold one)
    if let Some((scheme, rest)) = arg.split_once("://")
        && !blank(scheme)
        && let Some((userinfo, host)) = rest.rsplit_once('@')
        && let Some((user, _)) = userinfo.split_once(':')
    {
        return format!("{scheme}://{user}:{HIDDEN}@{host}");
    }
    arg.to_owned()
}

/// `words` as a shell would read them, quoted where needed, secrets hidden.
pub fn shell_words(words: &[String]) -> String {
    redact(words)
        .iter()
        .map(|w| {
            if !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+*".contains(&b))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(args: &[&str]) -> Vec<String> {
        redact(&args.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn secrets_are_hidden_and_the_rest_is_kept() {
        assert_eq!(
            r(&[
                "mariabackup",
                "--user=root",
                "--password=hunter2",
                "--socket=/s"
            ]),
            [
                "mariabackup",
                "--user=root",
                "--password=***",
                "--socket=/s"
            ]
        );
        assert_eq!(r(&["mysql", "-phunter2", "-p"]), ["mysql", "-p***", "-p"]);
        assert_eq!(
            r(&["x", "--password", "hunter2", "--port", "3306"]),
            ["x", "--password", "***", "--port", "3306"]
        );
        assert_eq!(
            r(&["env", "MYSQL_PWD=hunter2", "AWS_SECRET_ACCESS_KEY=abc", "x"]),
            ["env", "MYSQL_PWD=***", "AWS_SECRET_ACCESS_KEY=***", "x"]
        );
        assert_eq!(
            r(&["pg_dump", "postgres://u:hunter2@db/x"]),
            ["pg_dump", "postgres://u:***@db/x"]
        );
        assert_eq!(
            r(&["--encrypt-key=k", "--api-token", "t"]),
            ["--encrypt-key=***", "--api-token", "***"]
        );
        assert_eq!(
            r(&["tar", "-C", "/data", "-cf", "-", "."]),
            ["tar", "-C", "/data", "-cf", "-", "."]
        );
        assert!(
            !shell_words(&["sh".into(), "-c".into(), "x --password=hunter2".into()])
                .contains("hunter2")
        );
        // A command line inside one argument is read word by word.
        for script in [
            "mariabackup --user=root --password=hunter2 --backup",
            "mariabackup --user root --password hunter2",
            "mysqldump -uroot -phunter2 db | gzip",
            "mysqldump --password='hunter2' db",
            "MYSQL_PWD=hunter2 mysqldump db",
            "pg_dump postgres://u:hunter2@h/db",
        ] {
            let shown = r(&["sh", "-c", script]);
            assert!(!shown.concat().contains("hunter2"), "{script}: {shown:?}");
            assert!(shown[2].contains("***"), "{shown:?}");
        }
        assert_eq!(r(&["sh", "-c", "tar -cf - /data"])[2], "tar -cf - /data");
        // Nested quoting is read at every level.
        for script in [
            "ssh db 'mysqldump -phunter2 x'",
            "ssh db 'mysqldump --password hunter2 x'",
            "ssh db \"sh -c 'mysql --password=hunter2'\"",
        ] {
            let shown = r(&["sh", "-c", script]);
            assert!(!shown.concat().contains("hunter2"), "{script}: {shown:?}");
        }
        // An argument holding a secret as a whole is hidden whole, separators and all.
        assert_eq!(
            r(&[
                "x",
                "--password=correct horse battery",
                "-pab&cd",
                "mysql://root:p&ss@db/x"
            ]),
            ["x", "--password=***", "-p***", "mysql://root:***@db/x"]
        );
        assert_eq!(r(&["mysql://root:p@ss@db/x"]), ["mysql://root:***@db/x"]);
        // Separators and quoting survive; only the secret words change.
        assert_eq!(
            r(&[
                "sh",
                "-c",
                "echo 'half a' backup; mysqldump --password='x y' db | gzip"
            ])[2],
            "echo 'half a' backup; mysqldump --password=*** db | gzip"
        );
    }
}
