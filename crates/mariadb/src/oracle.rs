//! The restore oracle (issue 48 §1): chunked table checksums written on the primary, so
//! that a restored server proves its own data right.
//!
//! # How the checksums travel
//! For each chunk of each table (a range of its integer primary key, [`CHUNK_ROWS`] rows
//! unless [`Settings`] say otherwise),
//! one client session on the primary runs, with `binlog_format=STATEMENT`:
//! 1. `REPLACE INTO tidemark_oracle.chunks … SELECT COUNT(*), <checksum> FROM <table>
//!    WHERE <range>`: logged as the statement, so whatever applies the binlog — a replica,
//!    or a restore's replay — computes the chunk's count and checksum again **on its own
//!    data, at exactly that point of the history** (`this_cnt`, `this_crc`);
//! 2. `UPDATE tidemark_oracle.chunks SET source_cnt = @cnt, source_crc = @crc …`, the
//!    primary's own values in user variables: logged with their values, so the replay
//!    writes the primary's numbers beside its own.
//!
//! A restored server then holds, for every chunk written before its target, both: any
//! chunk where they differ ([`differences`]) names the table and range where the restored
//! data is not the primary's — a replayed event lost, applied twice or out of order.
//! (pt-table-checksum's technique, for replicas.) Every instant of the window can be
//! checked this way, not only the checksums' own.
//!
//! # What it costs the primary
//! Each chunk reads [`CHUNK_ROWS`] rows by its primary key (shared locks on them for the
//! statement's duration: the checksum is of committed data, in binlog order) and writes
//! two small transactions. Tables without an integer primary key are checked whole, up to
//! [`WHOLE_TABLE_ROWS`] rows; larger ones are skipped and said so.

use std::fmt::Write as _;

/// The schema Tidemark owns on the primary.
pub const SCHEMA: &str = "tidemark_oracle";
/// Rows per chunk, by default.
pub const CHUNK_ROWS: u64 = 10_000;
/// The range of rows per chunk a user may set.
pub const CHUNK_ROWS_RANGE: std::ops::RangeInclusive<u64> = 100..=1_000_000;
/// Runs kept in the oracle's table on the primary: each new run deletes the older ones
/// (a restore to an instant holds the runs that were kept then).
pub const KEEP_RUNS: usize = 3;
/// The rights a checksum run needs on MariaDB (`mysql`: on MySQL), said with any failure.
pub fn rights(mysql: bool) -> &'static str {
    if mysql {
        "the account needs SESSION_VARIABLES_ADMIN, SELECT on the tables checked, and CREATE, INSERT, UPDATE, DELETE on tidemark_oracle"
    } else {
        "the account needs BINLOG ADMIN, SELECT on the tables checked, and CREATE, INSERT, UPDATE, DELETE on tidemark_oracle"
    }
}
/// How long a chunk's statements wait for a lock on the primary (a row another
/// transaction writes, a table an `ALTER` holds) before the table is skipped this run.
pub const LOCK_WAIT_SECS: u32 = 10;
/// The longest statement a chunk may be (a very wide table's): longer ones are skipped, as
/// a command line holds at most 128 KiB in one argument.
const MAX_CHUNK_SQL: usize = 100 * 1024;
/// At most this many tables a run checks; the rest are said skipped.
pub const MAX_TABLES: usize = 10_000;
/// Tables failing one after the other that end a run (the server stopped answering).
const FAILURES_IN_A_ROW: usize = 3;
/// At most this many skipped tables are named in a report.
const MAX_SKIPPED_NAMED: usize = 50;
/// At most this many table patterns.
pub const MAX_PATTERNS: usize = 64;
/// The most rows of a table without an integer primary key checked in one statement.
pub const WHOLE_TABLE_ROWS: u64 = 100_000;
/// Schemas never checked: the server's own, and ours.
const SYSTEM_SCHEMAS: [&str; 5] = [
    "mysql",
    "sys",
    "performance_schema",
    "information_schema",
    SCHEMA,
];

/// The statements that make the oracle's schema (idempotent).
pub fn schema_sql() -> String {
    format!(
        "CREATE DATABASE IF NOT EXISTS `{SCHEMA}`; \
         CREATE TABLE IF NOT EXISTS `{SCHEMA}`.`chunks` ( \
           run BIGINT UNSIGNED NOT NULL, \
           db VARBINARY(256) NOT NULL, \
           tbl VARBINARY(256) NOT NULL, \
           chunk INT UNSIGNED NOT NULL, \
           lower_key BIGINT NULL, \
           upper_key BIGINT NULL, \
           lower_text VARBINARY(1024) NULL, \
           upper_text VARBINARY(1024) NULL, \
           this_cnt BIGINT UNSIGNED NOT NULL, \
           this_crc BIGINT UNSIGNED NOT NULL, \
           source_cnt BIGINT UNSIGNED NULL, \
           source_crc BIGINT UNSIGNED NULL, \
           at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
           PRIMARY KEY (run, db, tbl, chunk) \
         ) ENGINE=InnoDB"
    )
}

/// A table to check: its schema and name, its columns in order, and its primary key when
/// that is one integer column (`key`), or else its primary key's columns when each can be
/// written back as a literal (`tuple`: chunks are ranges of the key in its order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub db: String,
    pub name: String,
    pub columns: Vec<String>,
    pub key: Option<String>,
    pub tuple: Vec<KeyColumn>,
}

/// A column of a primary key that is not one integer column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyColumn {
    pub name: String,
    pub kind: KeyKind,
}

/// How a key column's value is read (`token`) and written back as a literal that compares
/// as the column does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    /// Numbers (`CAST(… AS CHAR)`).
    Number,
    /// Binary strings (hex).
    Bytes,
    /// Character strings (hex), compared in their character set and collation.
    Text { charset: String, collation: String },
    /// Dates and times (hex of their text in UTC), cast back to this type.
    Temporal(&'static str),
}

impl KeyKind {
    /// The kind of a column of `data_type` (information_schema's), or `None` when its values
    /// cannot be written back faithfully (ENUM and SET order by index, not by text; BIT,
    /// JSON, spatial, UUID and INET types).
    fn of(data_type: &str, charset: &str, collation: &str) -> Option<Self> {
        let plain = |n: &str| {
            !n.is_empty()
                && n.len() <= 64
                && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        };
        Some(match data_type {
            // Not FLOAT or DOUBLE: their text does not read back as the same value.
            "tinyint" | "smallint" | "mediumint" | "int" | "bigint" | "decimal" | "year" => {
                Self::Number
            }
            // Not BLOB or TEXT: a key holds only their prefix.
            "binary" | "varbinary" => Self::Bytes,
            "char" | "varchar" if plain(charset) && plain(collation) => Self::Text {
                charset: charset.to_owned(),
                collation: collation.to_owned(),
            },
            "date" => Self::Temporal("DATE"),
            "datetime" | "timestamp" => Self::Temporal("DATETIME(6)"),
            "time" => Self::Temporal("TIME(6)"),
            _ => return None,
        })
    }

    /// The expression that reads a value of column `c` as a token.
    fn token(&self, c: &str) -> String {
        match self {
            Self::Number => format!("CAST({c} AS CHAR)"),
            _ => format!("HEX({c})"),
        }
    }

    /// `token` as a literal, and as shown to people.
    fn literal(&self, token: &str) -> Result<(String, String), String> {
        let bytes =
            || hex::decode(token).map_err(|_| format!("a key value {token:?} that is not hex"));
        let shown = |b: Vec<u8>| {
            String::from_utf8_lossy(&b)
                .chars()
                .take(64)
                .collect::<String>()
        };
        Ok(match self {
            Self::Number => {
                // -?digits(.digits)?: an integer, a DECIMAL, a YEAR.
                let unsigned = token.strip_prefix('-').unwrap_or(token);
                let (int, frac) = match unsigned.split_once('.') {
                    Some((i, f)) => (i, Some(f)),
                    None => (unsigned, None),
                };
                let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
                if !digits(int) || frac.is_some_and(|f| !digits(f)) {
                    return Err(format!("a key value {token:?} that is not a number"));
                }
                (token.to_owned(), token.to_owned())
            }
            Self::Bytes => {
                bytes()?;
                (
                    format!("X'{token}'"),
                    format!("0x{}", &token[..token.len().min(64)]),
                )
            }
            Self::Text { charset, collation } => {
                let b = bytes()?;
                (
                    format!("_{charset} X'{token}' COLLATE {collation}"),
                    shown(b),
                )
            }
            Self::Temporal(t) => {
                let b = bytes()?;
                (format!("CAST(X'{token}' AS {t})"), shown(b))
            }
        })
    }
}

/// A bound of a chunk of a [`Table::tuple`] key: its literals, and how it is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TupleBound {
    pub literals: Vec<String>,
    pub shown: String,
}

/// Reads [`next_upper_sql`]'s answer for a tuple key: `None` when no row is that far.
///
/// # Errors
/// A value that does not read as its kind.
pub fn parse_tuple_bound(table: &Table, answer: &str) -> Result<Option<TupleBound>, String> {
    if answer.is_empty() {
        return Ok(None);
    }
    let line = answer.strip_suffix('\n').unwrap_or(answer);
    let tokens: Vec<&str> = line.split('\t').collect();
    if tokens.len() != table.tuple.len() {
        return Err(format!(
            "a key of {} values, for {} columns",
            tokens.len(),
            table.tuple.len()
        ));
    }
    let mut literals = Vec::new();
    let mut shown = Vec::new();
    for (c, t) in table.tuple.iter().zip(tokens) {
        let (l, s) = c.kind.literal(t)?;
        literals.push(l);
        shown.push(s);
    }
    let shown = if shown.len() == 1 {
        shown.remove(0)
    } else {
        format!("({})", shown.join(", "))
    };
    // Within the column that keeps it (VARBINARY(1024)), whatever the characters.
    let shown: String = shown.chars().take(200).collect();
    Ok(Some(TupleBound { literals, shown }))
}

/// The condition that a [`Table::tuple`] key is after `b` (`after`) or at most `b`, in the
/// key's order — a range on its first column, which every optimizer uses.
fn tuple_condition(table: &Table, b: &TupleBound, after: bool) -> String {
    fn step(cols: &[String], lits: &[String], after: bool) -> String {
        let (c, l) = (&cols[0], &lits[0]);
        if cols.len() == 1 {
            return format!("{c} {} {l}", if after { ">" } else { "<=" });
        }
        format!(
            "({c} {} {l} OR ({c} = {l} AND {}))",
            if after { ">" } else { "<" },
            step(&cols[1..], &lits[1..], after)
        )
    }
    let cols: Vec<String> = table.tuple.iter().map(|c| ident(&c.name)).collect();
    format!(
        "{} {} {} AND {}",
        cols[0],
        if after { ">=" } else { "<=" },
        b.literals[0],
        step(&cols, &b.literals, after)
    )
}

/// `name` quoted as an identifier.
pub fn ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// `text` as a string literal that survives any byte (hex).
fn literal(text: &str) -> String {
    if text.is_empty() {
        "''".into()
    } else {
        format!("X'{}'", hex::encode(text.as_bytes()))
    }
}

/// The query listing the tables to check, one line each: hex of the schema, of the name,
/// of the columns (NUL-separated, in order), and of the primary key's column when it is one
/// integer column (else empty).
pub fn tables_sql() -> String {
    let system: Vec<String> = SYSTEM_SCHEMAS.iter().map(|s| format!("'{s}'")).collect();
    format!(
        "SET SESSION group_concat_max_len = 1048576; \
         SELECT HEX(t.TABLE_SCHEMA), HEX(t.TABLE_NAME), \
           (SELECT HEX(GROUP_CONCAT(c.COLUMN_NAME ORDER BY c.ORDINAL_POSITION SEPARATOR 0x00)) \
              FROM information_schema.COLUMNS c \
              WHERE c.TABLE_SCHEMA = t.TABLE_SCHEMA AND c.TABLE_NAME = t.TABLE_NAME), \
           COALESCE((SELECT HEX(MIN(k.COLUMN_NAME)) FROM information_schema.KEY_COLUMN_USAGE k \
              JOIN information_schema.COLUMNS c ON c.TABLE_SCHEMA = k.TABLE_SCHEMA \
                AND c.TABLE_NAME = k.TABLE_NAME AND c.COLUMN_NAME = k.COLUMN_NAME \
              WHERE k.TABLE_SCHEMA = t.TABLE_SCHEMA AND k.TABLE_NAME = t.TABLE_NAME \
                AND k.CONSTRAINT_NAME = 'PRIMARY' \
                AND c.DATA_TYPE IN ('tinyint', 'smallint', 'mediumint', 'int', 'bigint') \
              HAVING COUNT(*) = 1 AND (SELECT COUNT(*) FROM information_schema.KEY_COLUMN_USAGE k2 \
                WHERE k2.TABLE_SCHEMA = t.TABLE_SCHEMA AND k2.TABLE_NAME = t.TABLE_NAME \
                AND k2.CONSTRAINT_NAME = 'PRIMARY') = 1), ''), \
           COALESCE((SELECT HEX(GROUP_CONCAT(CONCAT_WS(0x01, k.COLUMN_NAME, c.DATA_TYPE, \
                COALESCE(c.CHARACTER_SET_NAME, ''), COALESCE(c.COLLATION_NAME, '')) \
                ORDER BY k.ORDINAL_POSITION SEPARATOR 0x00)) \
              FROM information_schema.KEY_COLUMN_USAGE k \
              JOIN information_schema.COLUMNS c ON c.TABLE_SCHEMA = k.TABLE_SCHEMA \
                AND c.TABLE_NAME = k.TABLE_NAME AND c.COLUMN_NAME = k.COLUMN_NAME \
              WHERE k.TABLE_SCHEMA = t.TABLE_SCHEMA AND k.TABLE_NAME = t.TABLE_NAME \
                AND k.CONSTRAINT_NAME = 'PRIMARY'), '') \
         FROM information_schema.TABLES t \
         WHERE t.TABLE_TYPE = 'BASE TABLE' AND t.ENGINE = 'InnoDB' \
           AND t.TABLE_SCHEMA NOT IN ({}) \
         ORDER BY t.TABLE_SCHEMA, t.TABLE_NAME",
        system.join(", ")
    )
}

/// Parses [`tables_sql`]'s answer.
///
/// # Errors
/// A line that is not five hex fields of UTF-8.
pub fn parse_tables(answer: &str) -> Result<Vec<Table>, String> {
    let text = |h: &str| -> Result<String, String> {
        hex::decode(h)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| format!("not hex of UTF-8: {h:?}"))
    };
    answer
        .lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            let [db, name, columns, key, primary] = f[..] else {
                return Err(format!("a table line of {} fields", f.len()));
            };
            let key = Some(text(key)?).filter(|k| !k.is_empty());
            // Another primary key: its columns, when each can be written back.
            let parts: Vec<Option<KeyColumn>> = text(primary)?
                .split('\0')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let f: Vec<&str> = p.split('\u{1}').collect();
                    let get = |i: usize| f.get(i).copied().unwrap_or_default();
                    KeyKind::of(get(1), get(2), get(3)).map(|kind| KeyColumn {
                        name: get(0).to_owned(),
                        kind,
                    })
                })
                .collect();
            let tuple = if key.is_none() && parts.iter().all(Option::is_some) {
                parts.into_iter().flatten().collect()
            } else {
                Vec::new()
            };
            Ok(Table {
                db: text(db)?,
                name: text(name)?,
                columns: text(columns)?
                    .split('\0')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect(),
                key,
                tuple,
            })
        })
        .collect()
}

/// A row's 64-bit digest, and the chunk's: the XOR of its rows' (order does not matter).
/// Each column's value (its bytes, length first: no separator can be confused with a
/// value, and no mix of character sets or collations meets in one string), and whether it
/// is NULL, is in the digest.
pub fn checksum_expr(columns: &[String]) -> String {
    let values: Vec<String> = columns
        .iter()
        .map(|c| {
            let b = format!("CAST({} AS BINARY)", ident(c));
            format!("CONCAT(LENGTH({b}), ':', {b})")
        })
        .collect();
    let nulls: Vec<String> = columns
        .iter()
        .map(|c| format!("ISNULL({})", ident(c)))
        .collect();
    format!(
        "COALESCE(BIT_XOR(CAST(CONV(LEFT(SHA2(CONCAT_WS('#', {}, CONCAT({})), 256), 16), 16, 10) AS UNSIGNED)), 0)",
        values.join(", "),
        nulls.join(", ")
    )
}

/// A chunk: its number and the key range it covers (`lower < key <= upper`; `None`: open),
/// of an integer key or of a [`Table::tuple`] key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunk {
    pub number: u32,
    pub lower: Option<i64>,
    pub upper: Option<i64>,
    pub lower_tuple: Option<TupleBound>,
    pub upper_tuple: Option<TupleBound>,
}

/// The statements that check `chunk` of `table` in run `run`, in one session: the
/// statement the replay recomputes, then the primary's own values.
pub fn chunk_sql(run: u64, table: &Table, chunk: &Chunk) -> String {
    let from = format!("{}.{}", ident(&table.db), ident(&table.name));
    let mut range = String::new();
    let mut conds = Vec::new();
    if let Some(key) = &table.key {
        if let Some(l) = chunk.lower {
            conds.push(format!("{} > {l}", ident(key)));
        }
        if let Some(u) = chunk.upper {
            conds.push(format!("{} <= {u}", ident(key)));
        }
    } else if !table.tuple.is_empty() {
        if let Some(l) = &chunk.lower_tuple {
            conds.push(tuple_condition(table, l, true));
        }
        if let Some(u) = &chunk.upper_tuple {
            conds.push(tuple_condition(table, u, false));
        }
    }
    if !conds.is_empty() {
        let _ = write!(range, " WHERE {}", conds.join(" AND "));
    }
    let shown = |b: &Option<TupleBound>| {
        b.as_ref()
            .map_or_else(|| "NULL".to_owned(), |b| literal(&b.shown))
    };
    let opt = |v: Option<i64>| v.map_or_else(|| "NULL".to_owned(), |v| v.to_string());
    let at = format!(
        "run = {run} AND db = {} AND tbl = {} AND chunk = {}",
        literal(&table.db),
        literal(&table.name),
        chunk.number
    );
    // The session the statement is logged with, and replayed with: statement logging
    // (which InnoDB refuses below REPEATABLE READ), times in UTC whatever either server's
    // zone; and bounded waits for locks on the primary.
    format!(
        "SET SESSION binlog_format = 'STATEMENT'; \
         SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ; \
         SET SESSION time_zone = '+00:00'; \
         SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_SECS}; \
         SET SESSION lock_wait_timeout = {LOCK_WAIT_SECS}; \
         REPLACE INTO `{SCHEMA}`.`chunks` (run, db, tbl, chunk, lower_key, upper_key, lower_text, upper_text, this_cnt, this_crc) \
           SELECT {run}, {}, {}, {}, {}, {}, {}, {}, COUNT(*), {} FROM {from}{range}; \
         SELECT this_cnt, this_crc INTO @tidemark_cnt, @tidemark_crc FROM `{SCHEMA}`.`chunks` WHERE {at}; \
         UPDATE `{SCHEMA}`.`chunks` SET source_cnt = @tidemark_cnt, source_crc = @tidemark_crc WHERE {at}",
        literal(&table.db),
        literal(&table.name),
        chunk.number,
        opt(chunk.lower),
        opt(chunk.upper),
        shown(&chunk.lower_tuple),
        shown(&chunk.upper_tuple),
        checksum_expr(&table.columns),
    )
}

/// The query for the upper key of the chunk after `lower` (the key `rows` rows on), or
/// nothing when the rest fits in one chunk.
pub fn next_upper_sql(table: &Table, key: &str, lower: Option<i64>, rows: u64) -> String {
    let from = format!("{}.{}", ident(&table.db), ident(&table.name));
    let k = ident(key);
    let after = lower.map_or_else(String::new, |l| format!(" WHERE {k} > {l}"));
    format!(
        "SELECT {k} FROM {from}{after} ORDER BY {k} LIMIT 1 OFFSET {}",
        rows.max(1) - 1
    )
}

/// The query for the upper bound of the chunk after `lower` of a [`Table::tuple`] key (the
/// key `rows` rows on, as tokens: [`parse_tuple_bound`]), or nothing when the rest fits in
/// one chunk. In UTC, as the chunk's statement reads times.
pub fn next_tuple_upper_sql(table: &Table, lower: Option<&TupleBound>, rows: u64) -> String {
    let from = format!("{}.{}", ident(&table.db), ident(&table.name));
    let tokens: Vec<String> = table
        .tuple
        .iter()
        .map(|c| c.kind.token(&ident(&c.name)))
        .collect();
    let order: Vec<String> = table.tuple.iter().map(|c| ident(&c.name)).collect();
    let after = lower.map_or_else(String::new, |l| {
        format!(" WHERE {}", tuple_condition(table, l, true))
    });
    format!(
        "SET SESSION time_zone = '+00:00'; SELECT {} FROM {from}{after} ORDER BY {} LIMIT 1 OFFSET {}",
        tokens.join(", "),
        order.join(", "),
        rows.max(1) - 1
    )
}

/// The query for how many rows have exactly the key `b` (one, when its literals read back).
fn round_trip_sql(table: &Table, b: &TupleBound) -> String {
    let from = format!("{}.{}", ident(&table.db), ident(&table.name));
    let equal: Vec<String> = table
        .tuple
        .iter()
        .zip(&b.literals)
        .map(|(c, l)| format!("{} = {l}", ident(&c.name)))
        .collect();
    format!(
        "SET SESSION time_zone = '+00:00'; SELECT COUNT(*) FROM {from} WHERE {}",
        equal.join(" AND ")
    )
}

/// Which tables a run checks, and what it may cost the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Rows per chunk (one statement reads them; [`CHUNK_ROWS_RANGE`]).
    pub chunk_rows: u64,
    /// Waited after each chunk: the rate on the primary.
    pub pause: std::time::Duration,
    /// `schema.table` patterns (`*` matches any characters) of the tables checked; empty:
    /// every table.
    pub tables: Vec<String>,
    /// Patterns of tables never checked, over `tables`.
    pub skip: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            chunk_rows: CHUNK_ROWS,
            pause: std::time::Duration::ZERO,
            tables: Vec::new(),
            skip: Vec::new(),
        }
    }
}

impl Settings {
    /// Checks the patterns and the chunk size.
    ///
    /// # Errors
    /// A pattern without `.` between schema and table, too many patterns, or a chunk size
    /// out of [`CHUNK_ROWS_RANGE`]; the message names the value and the accepted form.
    pub fn validate(&self) -> Result<(), String> {
        if !CHUNK_ROWS_RANGE.contains(&self.chunk_rows) {
            return Err(format!(
                "a chunk of {} rows: expected {} to {} rows",
                self.chunk_rows,
                CHUNK_ROWS_RANGE.start(),
                CHUNK_ROWS_RANGE.end()
            ));
        }
        if self.tables.len() + self.skip.len() > MAX_PATTERNS {
            return Err(format!(
                "{} table patterns: at most {MAX_PATTERNS}",
                self.tables.len() + self.skip.len()
            ));
        }
        for p in self.tables.iter().chain(&self.skip) {
            if !p.contains('.') || p.len() > 256 || p.chars().any(char::is_control) {
                return Err(format!(
                    "table pattern {p:?}: expected SCHEMA.TABLE, where * matches any characters (e.g. shop.* or *.audit_log)"
                ));
            }
        }
        Ok(())
    }

    /// Whether `table` is checked.
    pub fn checks(&self, table: &Table) -> bool {
        let name = format!("{}.{}", table.db, table.name);
        (self.tables.is_empty() || self.tables.iter().any(|p| matches(p, &name)))
            && !self.skip.iter().any(|p| matches(p, &name))
    }
}

/// Whether `name` matches `pattern`, where `*` matches any characters (none included).
fn matches(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // The classic linear matcher: on a mismatch, the last `*` takes one more character.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && p[i] != '*' && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// The query for the newest run to delete before a new one (it and every older one): all
/// but the newest `KEEP_RUNS - 1` go (with the new one, [`KEEP_RUNS`] stay).
pub fn old_runs_sql() -> String {
    format!(
        "SELECT run FROM `{SCHEMA}`.`chunks` GROUP BY run ORDER BY run DESC LIMIT 1 OFFSET {}",
        KEEP_RUNS - 1
    )
}

/// The query a restored server answers with every chunk whose recomputed values differ
/// from the primary's: hex of schema and table, chunk, range, and both counts and digests.
pub fn differences_sql() -> String {
    format!(
        "SELECT HEX(LEFT(db, 256)), HEX(LEFT(tbl, 256)), CAST(chunk AS UNSIGNED), \
           HEX(LEFT(COALESCE(lower_key, lower_text, ''), 256)), HEX(LEFT(COALESCE(upper_key, upper_text, ''), 256)), \
           CAST(this_cnt AS UNSIGNED), CAST(source_cnt AS UNSIGNED), this_crc, source_crc FROM `{SCHEMA}`.`chunks` \
         WHERE source_crc IS NOT NULL AND (this_cnt <> source_cnt OR this_crc <> source_crc) \
         ORDER BY run, db, tbl, chunk LIMIT 50"
    )
}

/// The query for how many chunks a restored server can check (both values present), of
/// the runs after `since` (a backup's own chunks were copied, not computed again).
pub fn checked_sql(since: u64) -> String {
    format!(
        "SELECT COUNT(*) FROM `{SCHEMA}`.`chunks` WHERE source_crc IS NOT NULL AND run > {since}"
    )
}

/// Text read from a server, for people: control characters (a terminal's escapes) shown
/// escaped.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Reads [`differences_sql`]'s answer as one line per chunk, for people:
/// `shop.orders chunk 3 (keys 20000 < id <= 30000): 10000 rows, the primary had 10001`.
pub fn describe_differences(answer: &str) -> Vec<String> {
    let text = |h: &str| {
        printable(
            &hex::decode(h)
                .ok()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_else(|| h.to_owned()),
        )
    };
    answer
        .lines()
        .filter(|l| !l.is_empty())
        .take(50)
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            let get = |i: usize| printable(f.get(i).copied().unwrap_or_default());
            let (lower, upper) = (text(&get(3)), text(&get(4)));
            let range = match (lower.as_str(), upper.as_str()) {
                ("", "") => "the whole table".to_owned(),
                (l, "") => format!("keys above {l}"),
                ("", u) => format!("keys up to {u}"),
                (l, u) => format!("keys above {l} up to {u}"),
            };
            let what = if get(5) == get(6) {
                format!("{} rows, their content differs", get(5))
            } else {
                format!("{} rows, the primary had {}", get(5), get(6))
            };
            format!(
                "{}.{} chunk {} ({range}): {what}",
                text(&get(0)),
                text(&get(1)),
                get(2)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_are_quoted_and_any_byte_survives() {
        assert_eq!(ident("a`b"), "`a``b`");
        assert_eq!(literal("sh'op"), "X'7368276f70'");
        let t = parse_tables(&format!(
            "{}\t{}\t{}\t{}\t{}\n",
            hex::encode("sh`op"),
            hex::encode("o'rders"),
            hex::encode("id\0note"),
            hex::encode("id"),
            hex::encode("id\u{1}int\u{1}\u{1}")
        ))
        .unwrap();
        assert_eq!(
            t,
            vec![Table {
                db: "sh`op".into(),
                name: "o'rders".into(),
                columns: vec!["id".into(), "note".into()],
                key: Some("id".into()),
                tuple: vec![],
            }]
        );
        assert!(parse_tables("zz\t00\t00\t\t").is_err());
        let sql = chunk_sql(
            7,
            &t[0],
            &Chunk {
                number: 2,
                lower: Some(10),
                upper: Some(20),
                ..Chunk::default()
            },
        );
        assert!(
            sql.contains("FROM `sh``op`.`o'rders` WHERE `id` > 10 AND `id` <= 20"),
            "{sql}"
        );
        assert!(sql.starts_with("SET SESSION binlog_format = 'STATEMENT'"));
    }

    /// A primary key of several columns, or of one that is not an integer, chunks by
    /// ranges in the key's order: each value read as a token and written back as a
    /// literal of its kind, and the range a condition on the first column first.
    #[test]
    fn other_primary_keys_chunk_in_their_order() {
        let primary = [
            "order_id\u{1}int\u{1}\u{1}",
            "sku\u{1}varchar\u{1}utf8mb4\u{1}utf8mb4_unicode_ci",
            "at\u{1}datetime\u{1}\u{1}",
        ]
        .join("\0");
        let line = [
            hex::encode("shop"),
            hex::encode("lines"),
            hex::encode("order_id\0sku\0at\0qty"),
            String::new(),
            hex::encode(&primary),
        ]
        .join("\t");
        let t = parse_tables(&line).unwrap().remove(0);
        assert_eq!(t.key, None);
        assert_eq!(t.tuple.len(), 3);
        let sql = next_tuple_upper_sql(&t, None, 100);
        assert!(
            sql.ends_with("SELECT CAST(`order_id` AS CHAR), HEX(`sku`), HEX(`at`) FROM `shop`.`lines` ORDER BY `order_id`, `sku`, `at` LIMIT 1 OFFSET 99"),
            "{sql}"
        );
        let b = parse_tuple_bound(
            &t,
            &format!(
                "42\t{}\t{}\n",
                hex::encode("ü'1"),
                hex::encode("2026-11-30 10:00:00.000")
            ),
        )
        .unwrap()
        .unwrap();
        assert_eq!(b.shown, "(42, ü'1, 2026-11-30 10:00:00.000)");
        let c = tuple_condition(&t, &b, true);
        assert_eq!(
            c,
            format!(
                "`order_id` >= 42 AND (`order_id` > 42 OR (`order_id` = 42 AND (`sku` > _utf8mb4 X'{s}' COLLATE utf8mb4_unicode_ci OR (`sku` = _utf8mb4 X'{s}' COLLATE utf8mb4_unicode_ci AND `at` > CAST(X'{a}' AS DATETIME(6))))))",
                s = hex::encode("ü'1"),
                a = hex::encode("2026-11-30 10:00:00.000")
            )
        );
        assert!(
            tuple_condition(&t, &b, false).starts_with("`order_id` <= 42 AND (`order_id` < 42 OR")
        );
        assert_eq!(parse_tuple_bound(&t, "").unwrap(), None);
        assert!(parse_tuple_bound(&t, "4; DROP TABLE x\t00\t00\n").is_err());
        assert!(parse_tuple_bound(&t, "4\tzz\t00\n").is_err());
        // ENUM orders by index, not by its text: such a key is not chunked.
        let enum_key = line.replace(
            &hex::encode(&primary),
            &hex::encode("kind\u{1}enum\u{1}utf8mb4\u{1}utf8mb4_general_ci"),
        );
        let t = parse_tables(&enum_key).unwrap().remove(0);
        assert!(t.key.is_none() && t.tuple.is_empty());
    }

    #[test]
    fn a_restarted_schedule_waits_for_its_turn() {
        let hour = std::time::Duration::from_secs(3600);
        assert_eq!(first_wait(None, 10_000, hour), std::time::Duration::ZERO);
        assert_eq!(
            first_wait(Some(10_000 - 600), 10_000, hour),
            std::time::Duration::from_secs(3000)
        );
        assert_eq!(first_wait(Some(1), 10_000, hour), std::time::Duration::ZERO);
        // A run numbered in the future (a clock stepped back) does not hold the schedule.
        assert_eq!(
            first_wait(Some(20_000), 10_000, hour),
            std::time::Duration::ZERO
        );
        assert_eq!(run_number(100, 50), 100);
        assert_eq!(run_number(100, 100), 101);
    }

    #[test]
    fn patterns_choose_the_tables() {
        let t = |db: &str, name: &str| Table {
            db: db.into(),
            name: name.into(),
            columns: vec![],
            key: None,
            tuple: vec![],
        };
        let s = Settings {
            tables: vec!["shop.*".into(), "*.ledger".into()],
            skip: vec!["shop.audit*".into()],
            ..Settings::default()
        };
        assert!(s.validate().is_ok());
        assert!(s.checks(&t("shop", "orders")));
        assert!(s.checks(&t("bank", "ledger")));
        assert!(!s.checks(&t("shop", "audit_log")));
        assert!(!s.checks(&t("bank", "ledgers")));
        assert!(Settings::default().checks(&t("a", "b")));
        assert!(matches("a*b*c", "aXbYbZc"));
        assert!(!matches("a*b*c", "aXbYbZ"));
        assert!(matches("*", ""));
        let bad = Settings {
            skip: vec!["orders".into()],
            ..Settings::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .contains("\"orders\": expected SCHEMA.TABLE")
        );
        let small = Settings {
            chunk_rows: 10,
            ..Settings::default()
        };
        assert!(
            small
                .validate()
                .unwrap_err()
                .contains("expected 100 to 1000000 rows")
        );
    }

    #[test]
    fn differences_are_said_by_table_and_range() {
        let line = format!(
            "{}\t{}\t3\t20000\t30000\t9999\t10000\t1\t2\n{}\t{}\t0\t\t\t5\t5\t1\t2\n",
            hex::encode("shop"),
            hex::encode("orders"),
            hex::encode("shop"),
            hex::encode("notes")
        );
        assert_eq!(
            describe_differences(&line),
            vec![
                "shop.orders chunk 3 (keys above 20000 up to 30000): 9999 rows, the primary had 10000",
                "shop.notes chunk 0 (the whole table): 5 rows, their content differs",
            ]
        );
    }
}

/// The newest run written on the server (its number: the second it started), if any.
pub async fn newest_run(mariadb: &std::ffi::OsStr, client: &[String]) -> Option<u64> {
    crate::backup::ask(
        mariadb,
        client,
        &["-N", "-B"],
        &format!("SELECT MAX(run) FROM `{SCHEMA}`.`chunks`"),
    )
    .await
    .ok()?
    .trim()
    .parse()
    .ok()
}

/// How long a schedule of `every` waits before its first run, `now` seconds since the
/// epoch: until `every` after the newest run written, so that an archiver that restarts
/// (a rollout, a crash loop) does not run again early.
pub fn first_wait(
    newest: Option<u64>,
    now: u64,
    every: std::time::Duration,
) -> std::time::Duration {
    match newest {
        Some(n) if n <= now => every.saturating_sub(std::time::Duration::from_secs(now - n)),
        _ => std::time::Duration::ZERO,
    }
}

/// A run's number: the second it starts, after `last`.
pub fn run_number(now: u64, last: u64) -> u64 {
    now.max(last + 1)
}

/// What a server that applied the binlog says of the oracle's chunks.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    /// Chunks compared (both values present).
    pub chunks: u64,
    /// Each chunk whose data is not the primary's ([`describe_differences`]; at most 50).
    pub differences: Vec<String>,
}

/// Compares the oracle's chunks on a server through `sql` (a query's `-N -B` output):
/// `None` where the data holds no oracle.
///
/// # Errors
/// A query failed (its message).
pub async fn compare<F, Fut>(sql: F, since: u64) -> Result<Option<Comparison>, String>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    if !present(&sql).await? {
        return Ok(None);
    }
    let chunks = sql(checked_sql(since))
        .await?
        .trim()
        .parse()
        .map_err(|e| format!("counting its chunks: {e}"))?;
    let differences = describe_differences(&sql(differences_sql()).await?);
    Ok(Some(Comparison {
        chunks,
        differences,
    }))
}

/// Whether the data holds the oracle's table (a table: a view of the same name is not it).
pub(crate) async fn present<F, Fut>(sql: &F) -> Result<bool, String>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    Ok(sql(format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{SCHEMA}' AND TABLE_NAME = 'chunks' AND TABLE_TYPE = 'BASE TABLE'"
    ))
    .await?
    .trim()
        == "1")
}

/// How long a restore's comparison may take (its queries read one small table).
pub(crate) const COMPARE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Checks one table in chunks: how many it wrote.
async fn check_table<F, Fut>(
    ask: &F,
    run: u64,
    table: &Table,
    settings: &Settings,
) -> Result<usize, String>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let chunk = |c: Chunk| {
        let sql = chunk_sql(run, table, &c);
        if sql.len() > MAX_CHUNK_SQL {
            Err(format!(
                "its checksum statement is {} KiB (more than {} KiB: too many columns)",
                sql.len() / 1024,
                MAX_CHUNK_SQL / 1024
            ))
        } else {
            Ok(sql)
        }
    };
    if table.key.is_some() || !table.tuple.is_empty() {
        return walk(ask, table, settings, &chunk).await;
    }
    let from = format!("{}.{}", ident(&table.db), ident(&table.name));
    let whole_max = WHOLE_TABLE_ROWS.max(settings.chunk_rows);
    // Counted no further than the limit: a large table is not read whole to say so.
    let rows: u64 = ask(format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM {from} LIMIT {}) AS t",
        whole_max + 1
    ))
    .await?
    .trim()
    .parse()
    .map_err(|e| format!("counting its rows: {e}"))?;
    if rows > whole_max {
        return Err(format!(
            "no primary key to chunk by, and more than {whole_max} rows (checked whole up to that)"
        ));
    }
    ask(chunk(Chunk::default())?).await?;
    tokio::time::sleep(settings.pause).await;
    Ok(1)
}

/// A chunk's bound: an integer key's value, or a tuple key's.
#[derive(Debug, Clone)]
enum Bound {
    Int(i64),
    Tuple(TupleBound),
}

/// The bound `rows` rows after `lower` of `table`'s key, or `None` when the rest fits in one
/// chunk.
async fn next_bound<F, Fut>(
    ask: &F,
    table: &Table,
    lower: Option<&Bound>,
    rows: u64,
) -> Result<Option<Bound>, String>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    if let Some(key) = &table.key {
        let lower = match lower {
            Some(Bound::Int(l)) => Some(*l),
            _ => None,
        };
        let answer = ask(next_upper_sql(table, key, lower, rows)).await?;
        return match answer.trim() {
            "" => Ok(None),
            u => u
                .parse::<i64>()
                .map(|u| Some(Bound::Int(u)))
                .map_err(|e| format!("its key {u:?} is not a 64-bit integer: {e}")),
        };
    }
    let lower = match lower {
        Some(Bound::Tuple(t)) => Some(t),
        _ => None,
    };
    let answer = ask(next_tuple_upper_sql(table, lower, rows)).await?;
    Ok(parse_tuple_bound(table, &answer)?.map(Bound::Tuple))
}

/// Checks a keyed table chunk by chunk, each bound read from the server, with the pause
/// after each: how many chunks it wrote.
async fn walk<F, Fut>(
    ask: &F,
    table: &Table,
    settings: &Settings,
    chunk: &(dyn Fn(Chunk) -> Result<String, String> + Sync),
) -> Result<usize, String>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let mut lower: Option<Bound> = None;
    let mut chunks = 0;
    for number in 0u32.. {
        let upper = next_bound(ask, table, lower.as_ref(), settings.chunk_rows).await?;
        if let Some(Bound::Tuple(u)) = &upper {
            // The bound must be a row's key, read back exactly, and past the last: else
            // rows would fall in no chunk (a value whose text is not itself) or the walk
            // would not advance.
            let same =
                |l: &Option<Bound>| matches!(l, Some(Bound::Tuple(l)) if l.literals == u.literals);
            let found = ask(round_trip_sql(table, u)).await?;
            if found.trim() != "1" || same(&lower) {
                return Err(format!(
                    "its key value {} does not read back as itself",
                    u.shown
                ));
            }
        }
        let int = |b: &Option<Bound>| match b {
            Some(Bound::Int(v)) => Some(*v),
            _ => None,
        };
        let tuple = |b: &Option<Bound>| match b {
            Some(Bound::Tuple(t)) => Some(t.clone()),
            _ => None,
        };
        let c = Chunk {
            number,
            lower: int(&lower),
            upper: int(&upper),
            lower_tuple: tuple(&lower),
            upper_tuple: tuple(&upper),
        };
        ask(chunk(c)?).await?;
        chunks += 1;
        tokio::time::sleep(settings.pause).await;
        match upper {
            Some(u) => lower = Some(u),
            None => break,
        }
    }
    Ok(chunks)
}

/// What one checksum run wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunReport {
    pub run: u64,
    pub tables: usize,
    pub chunks: usize,
    /// Tables not checked, and why (no integer primary key and too many rows, a lock held
    /// past the wait, dropped meanwhile); at most 50 named.
    pub skipped: Vec<String>,
}

impl RunReport {
    /// The run, for a person (the archiver's log and output): `run N written: …`.
    pub fn line(&self) -> String {
        let mut line = format!(
            "run {} written: {} table(s), {} chunk(s)",
            self.run, self.tables, self.chunks
        );
        for s in &self.skipped {
            line.push_str(&format!("; not checked: {s}"));
        }
        line
    }

    fn skip(&mut self, why: String) {
        if self.skipped.len() < MAX_SKIPPED_NAMED {
            self.skipped.push(why);
        }
    }
}

/// Writes checksum run `run` on the primary reached by `client` (the `mariadb` client's
/// connection options): the schema if missing, the oldest runs deleted (all but the newest
/// [`KEEP_RUNS`] with this one), then every chunk of every table `settings` checks, each in
/// its own two transactions, with `settings.pause` after each.
///
/// # Errors
/// The client fails (its last line): a missing right (`SELECT` on the tables, `CREATE`,
/// `INSERT`, `UPDATE` and `DELETE` on `tidemark_oracle`, `BINLOG ADMIN` for the session's
/// `binlog_format`), or an answer that does not parse.
pub async fn write_run(
    mariadb: &std::ffi::OsStr,
    client: &[String],
    run: u64,
    settings: &Settings,
) -> Result<RunReport, String> {
    settings.validate()?;
    let ask =
        |sql: String| async move { crate::backup::ask(mariadb, client, &["-N", "-B"], &sql).await };
    // Written on the primary only: a replica's (or a demoted primary's) writes would be
    // transactions of its own, which a failover then carries. Galera refuses statements
    // logged as such.
    if ask("SELECT @@read_only".into()).await?.trim() == "1" {
        return Err("the server is read-only (a replica, or a primary being demoted): the checksums are written on the primary only".into());
    }
    if ask("SHOW VARIABLES LIKE 'wsrep_on'".into())
        .await?
        .to_ascii_uppercase()
        .contains("\tON")
    {
        return Err("the server is a Galera node (wsrep_on): its replication refuses statements logged as statements, which the restore oracle needs".into());
    }
    ask(schema_sql()).await?;
    if let Ok(newest_old) = ask(old_runs_sql()).await?.trim().parse::<u64>() {
        ask(format!(
            "DELETE FROM `{SCHEMA}`.`chunks` WHERE run <= {newest_old}"
        ))
        .await?;
    }
    let tables = parse_tables(&ask(tables_sql()).await?)?;
    let mut report = RunReport {
        run,
        ..RunReport::default()
    };
    let mut failed_in_a_row = 0usize;
    let chosen: Vec<&Table> = tables.iter().filter(|t| settings.checks(t)).collect();
    for (i, table) in chosen.iter().enumerate() {
        if i >= MAX_TABLES {
            report.skip(format!(
                "{} more table(s): at most {MAX_TABLES} are checked in a run",
                chosen.len() - MAX_TABLES
            ));
            break;
        }
        // A table that cannot be checked (dropped meanwhile, a lock held past the wait, a
        // key too large) is skipped and said; the others are checked.
        match check_table(&ask, run, table, settings).await {
            Ok(chunks) => {
                failed_in_a_row = 0;
                report.tables += 1;
                report.chunks += chunks;
            }
            Err(e) => {
                failed_in_a_row += 1;
                report.skip(format!("{}.{}: {e}", table.db, table.name));
                // A right the account lacks, or a server that stopped answering: the run
                // fails, and says why.
                if e.contains("denied") || failed_in_a_row >= FAILURES_IN_A_ROW {
                    return Err(e);
                }
            }
        }
    }
    Ok(report)
}
