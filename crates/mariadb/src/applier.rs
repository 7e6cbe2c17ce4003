//! Binlog replay through the server's own replication applier (issue 49): the archived
//! segments become the private server's relay logs, and its SQL thread applies them —
//! events read as they are stored, in parallel where the binlog allows — instead of
//! `mariadb-binlog` decoding them to text and `mariadb` sending that text back to be parsed.
//!
//! The applier runs with every right and checks none, so what reaches it is chosen here,
//! by reading each transaction first ([`scan`]): only a transaction made of row events on
//! tables outside the server's own schemas (`mysql`, `performance_schema`, `sys`,
//! `information_schema`) goes to it — data, never a statement. A transaction that holds a
//! statement (a DDL, a statement-logged DML, an account statement, `LOAD DATA`, an XA
//! step), an event this module does not know, or a row of the server's schemas goes the
//! way it always went: decoded by `mariadb-binlog` and sent by a `mariadb` client logged in
//! as the replay account, which holds no global right ([`crate::server`]). Both ways apply
//! the transactions in the binlog's order, one after the other: a stretch of row
//! transactions through the applier, the statement after it through the client, and so on
//! ([`Piece`]).
//!
//! The scan also decides where replay starts and stops, as `mariadb-binlog` does with the
//! client path's options (the GTID start, the switch to the next timeline, `--stop-datetime`,
//! strict GTID order), so both paths apply the same transactions: the applier is stopped
//! by byte position (`START SLAVE SQL_THREAD UNTIL RELAY_LOG_FILE/RELAY_LOG_POS`) at the end
//! of the last transaction to apply, and where it stopped is checked against the scan.

use std::collections::BTreeMap;
use std::io::{Read, Seek};
use std::path::PathBuf;

use jiff::Timestamp;
use tidemark_core::gtid::{Gtid, GtidPos};

use crate::binlog::{BinlogError, Header, Walk, read_full, walk};

const QUERY_EVENT: u8 = 2;
const FORMAT_DESCRIPTION_EVENT: u8 = 15;
const XID_EVENT: u8 = 16;
const EXECUTE_LOAD_QUERY_EVENT: u8 = 18;
const TABLE_MAP_EVENT: u8 = 19;
const XA_PREPARE_LOG_EVENT: u8 = 38;
const ANNOTATE_ROWS_EVENT: u8 = 160;
const GTID_EVENT: u8 = 162;
const GTID_LIST_EVENT: u8 = 163;
const START_ENCRYPTION_EVENT: u8 = 164;
const QUERY_COMPRESSED_EVENT: u8 = 165;
/// Row events: v1 (23–25), v2 (30–32), MariaDB's compressed ones (166–171).
const ROWS_EVENTS: [u8; 12] = [23, 24, 25, 30, 31, 32, 166, 167, 168, 169, 170, 171];
/// Events between transactions that apply nothing: stop, rotate, format description,
/// heartbeat, binlog checkpoint, `Gtid_list`.
const FRAME_EVENTS: [u8; 6] = [3, 4, 15, 27, 161, 163];

/// `Gtid_log_event` flags (MariaDB's `log_event.h`).
const FL_STANDALONE: u8 = 1;
const FL_DDL: u8 = 32;
const FL_PREPARED_XA: u8 = 64;
const FL_COMPLETED_XA: u8 = 128;

/// Schemas whose rows never go to the applier: the server's own (accounts, grants,
/// routines, its replication state).
const SYSTEM_SCHEMAS: [&str; 4] = ["mysql", "performance_schema", "sys", "information_schema"];

/// How the replay applies a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Through the server's replication applier (row events on user tables).
    Applier,
    /// Decoded by `mariadb-binlog`, sent by the replay account's client.
    Client,
}

/// A place in a run's files: the file (its index in the run) and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct At {
    pub file: usize,
    pub offset: u64,
}

/// Consecutive transactions a replay applies one way, from `start` (the first one's first
/// event) to `end` (just after the last one's last event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub route: Route,
    pub start: At,
    pub end: At,
    pub transactions: u64,
    /// The end of every [`SAMPLE_EVERY`]th transaction, with how many the piece holds up to
    /// it and its time: what progress tells.
    pub samples: Vec<(At, u64, Option<Timestamp>)>,
    /// It starts where the piece before ends: no transaction the replay skips lies between
    /// (what may join them into one).
    pub follows: bool,
}

/// Fewest transactions a stretch of row transactions needs to go to the applier: each
/// piece through it costs a `CHANGE MASTER`, a start, a stop and the polls between (a fifth
/// of a second at least), where the client applies a few transactions in milliseconds.
/// Shorter stretches go the client's way ([`Scan::settle`]).
pub const MIN_APPLIER_PIECE: u64 = 100;

/// How often a piece records where it is (transactions).
pub const SAMPLE_EVERY: u64 = 1000;

/// Where a run's replay starts.
#[derive(Debug, Clone)]
pub enum Start {
    /// After these transactions, per domain (what the backup or the parent timeline holds);
    /// a domain not named starts at its beginning.
    AfterGtid(GtidPos),
    /// At this byte offset in the first file (a backup that records no GTID).
    Offset(u64),
    /// At the first file's start.
    Beginning,
}

/// What a replay of one run of files applies, and how.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    pub pieces: Vec<Piece>,
    pub transactions: u64,
    /// Per domain, the last transaction applied.
    pub applied: GtidPos,
    /// The time of the last transaction applied.
    pub last_at: Option<Timestamp>,
    /// Every server id the events read carry (the replaying server takes another).
    pub servers: std::collections::BTreeSet<u32>,
    /// The first transaction the replay applies that writes rows of a server's own table
    /// ([`SYSTEM_SCHEMAS`]): the restore refuses it, whichever way it replays.
    pub system_rows: Option<SystemRows>,
}

/// Row events on a table of the server's own schemas, found in the binlogs a replay reads:
/// neither way of replaying may apply them. The applier checks no right; the client's
/// `BINLOG` statements need `BINLOG REPLAY` and no right on the tables they write
/// (MariaDB's `Rows_log_event` checks none), so a row forged into `mysql.global_priv`
/// would give the restored server an account of the forger's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemRows {
    /// The file (its index in the run) and the table map's byte offset.
    pub at: At,
    pub gtid: Option<Gtid>,
    /// `schema.table`, its characters escaped (read from the binlog).
    pub table: String,
}

impl Scan {
    /// Gives the client every applier piece of fewer than `min` transactions, and joins
    /// the pieces of one way that follow each other.
    pub fn settle(&mut self, min: u64) {
        let mut out: Vec<Piece> = Vec::with_capacity(self.pieces.len());
        for mut p in std::mem::take(&mut self.pieces) {
            if p.route == Route::Applier && p.transactions < min {
                p.route = Route::Client;
            }
            match out.last_mut() {
                Some(last) if p.follows && last.route == p.route => {
                    let before = last.transactions;
                    last.samples
                        .extend(p.samples.into_iter().map(|(at, n, t)| (at, before + n, t)));
                    last.end = p.end;
                    last.transactions += p.transactions;
                }
                _ => out.push(p),
            }
        }
        self.pieces = out;
    }

    /// Transactions that go through the applier.
    pub fn through_applier(&self) -> u64 {
        self.pieces
            .iter()
            .filter(|p| p.route == Route::Applier)
            .map(|p| p.transactions)
            .sum()
    }
}

/// Why a run cannot be replayed (what `mariadb-binlog --gtid-strict-mode` refuses too), or
/// cannot be read this way.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error(
        "{file}, byte {offset}: GTID {gtid} comes after {previous} in its domain (strict GTID \
         order: sequence numbers grow in each domain)"
    )]
    OutOfOrder {
        file: String,
        offset: u64,
        gtid: Gtid,
        previous: Gtid,
    },
    #[error("{file}: {source}")]
    Binlog {
        file: String,
        #[source]
        source: BinlogError,
    },
    /// The applier path reads events; encrypted ones go the client's way whole.
    #[error("{file}: its events are encrypted")]
    Encrypted { file: String },
    /// What the scan cannot be sure it reads as `mariadb-binlog` does: the run goes the
    /// client's way whole (and `mariadb-binlog` judges it).
    #[error("{file}, byte {offset}: {what}")]
    Unreadable {
        file: String,
        offset: u64,
        what: String,
    },
    /// A transaction that ends without its commit while more follows: the scan does not
    /// know where it ends, so the run goes the client's way whole.
    #[error("{file}, byte {offset}: a transaction ends without a commit the scan recognises")]
    Unended { file: String, offset: u64 },
}

/// A transaction (or a lone event outside one) being read.
struct Txn {
    gtid: Option<Gtid>,
    start: At,
    standalone: bool,
    /// Everything in it so far may go to the applier.
    applier: bool,
    /// Its last event was read (a commit, an XID, a standalone statement).
    complete: bool,
    /// The replay applies it (the start and switch rules).
    wanted: bool,
    at: Option<Timestamp>,
    /// Its first row event on a server's own table.
    system: Option<(At, String)>,
}

struct Scanner<'a> {
    start: Start,
    until: Option<&'a GtidPos>,
    stop: Timestamp,
    out: Scan,
    current: Option<Txn>,
    /// Per domain, the last GTID read (strict order).
    last: BTreeMap<u32, Gtid>,
    /// An unwanted transaction came after the last piece: the next one starts anew.
    broken: bool,
    /// An event at or after `stop` was read: nothing after it is applied.
    stopped: bool,
    /// The last GTID group read is applied (or no group was read in this file yet): an
    /// event between groups counts as its group does, as `mariadb-binlog` reads it.
    active: bool,
    /// The run's first `Gtid_list` that names a transaction was read.
    listed: bool,
    /// Per domain, the highest sequence the files reach (their first `Gtid_list`, the
    /// GTIDs read).
    reached: BTreeMap<u32, u64>,
    refused: Option<ScanError>,
    /// An event starts at the byte offset replay starts at ([`Start::Offset`]).
    at_offset: bool,
    // The file being read.
    file: usize,
    name: String,
    /// Bytes of checksum at each event's end (the format description's algorithm).
    checksum: u64,
}

/// Reads a run's files in order and says which transactions a replay applies and how.
///
/// - `start`: see [`Start`]; `until`: the switch to the next timeline, per domain (a
///   transaction of a domain it does not name, or past it, is not applied); `stop`: no
///   event stamped at or after it is applied, and replay ends at the first one
///   (`--stop-datetime`).
/// - Sequence numbers must grow in each domain ([`ScanError::OutOfOrder`]).
/// - A transaction the file ends inside is not applied (as a client that sees no commit
///   rolls it back).
///
/// # Errors
/// See [`ScanError`].
pub fn scan(
    files: &[PathBuf],
    start: Start,
    until: Option<&GtidPos>,
    stop: Timestamp,
) -> Result<Scan, ScanError> {
    let mut s = Scanner {
        start,
        until,
        stop,
        out: Scan::default(),
        current: None,
        last: BTreeMap::new(),
        broken: false,
        stopped: false,
        active: true,
        listed: false,
        reached: BTreeMap::new(),
        refused: None,
        at_offset: false,
        file: 0,
        name: String::new(),
        checksum: 0,
    };
    for (i, path) in files.iter().enumerate() {
        s.file = i;
        s.name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        s.checksum = 0;
        s.active = true;
        let mut f = Sequential::open(path).map_err(|e| ScanError::Binlog {
            file: s.name.clone(),
            source: e.into(),
        })?;
        let walked = walk(&mut f, |h, f| s.event(h, f));
        if let Some(e) = s.refused.take() {
            return Err(e);
        }
        walked.map_err(|source| ScanError::Binlog {
            file: s.name.clone(),
            source,
        })?;
        if s.stopped {
            break;
        }
        // A transaction the last file ends inside is still being written: it is not
        // applied (a client that sees no commit rolls it back). One inside an earlier file
        // is one the scan could not follow.
        if let Some(t) = s.current.take()
            && i + 1 < files.len()
        {
            return Err(ScanError::Unended {
                file: s.name.clone(),
                offset: t.start.offset,
            });
        }
    }
    // mariadb-binlog (strict) refuses files that never reach the start in a domain.
    if let Start::AfterGtid(p) = &s.start
        && !s.stopped
        && let Some(g) = p
            .gtids()
            .find(|g| g.seq > 0 && s.reached.get(&g.domain).is_none_or(|r| *r < g.seq))
    {
        return Err(ScanError::Unreadable {
            file: s.name.clone(),
            offset: 0,
            what: format!("the binlogs never reach the start {g} in its domain"),
        });
    }
    Ok(s.out)
}

impl Scanner<'_> {
    fn event(&mut self, h: &Header, f: &mut Sequential) -> Result<Walk, BinlogError> {
        let at = (h.ts != 0)
            .then(|| Timestamp::from_second(i64::from(h.ts)).ok())
            .flatten();
        let here = At {
            file: self.file,
            offset: h.position,
        };
        let end = At {
            file: self.file,
            offset: h.position + 19 + h.body,
        };
        if h.kind == FORMAT_DESCRIPTION_EVENT {
            match read_format(f, h.body)? {
                Ok(checksum) => self.checksum = checksum,
                Err(what) => {
                    self.refused = Some(ScanError::Unreadable {
                        file: self.name.clone(),
                        offset: h.position,
                        what,
                    });
                    return Ok(Walk::Stop);
                }
            }
        }
        // Replay from a byte offset starts at an event: one that straddles it would be
        // read otherwise by mariadb-binlog, which starts at that byte.
        if let Start::Offset(o) = self.start
            && self.file == 0
            && !self.at_offset
            && h.position >= o
        {
            if h.position != o {
                self.refused = Some(ScanError::Unreadable {
                    file: self.name.clone(),
                    offset: h.position,
                    what: format!("no event starts at byte {o}, where the replay starts"),
                });
                return Ok(Walk::Stop);
            }
            self.at_offset = true;
        }
        // Before the byte offset replay starts at, nothing is read (nor compared with the
        // stop).
        if !self.wanted_at(here) {
            return Ok(Walk::Next);
        }
        self.out.servers.insert(h.server);
        // --stop-datetime: the first event at or after the stop that mariadb-binlog reads
        // (in a wanted group, or between groups while the last was wanted) ends the replay;
        // a transaction it falls in is not applied.
        let past = |wanted: bool| wanted && at.is_some_and(|t| t >= self.stop);
        match h.kind {
            START_ENCRYPTION_EVENT => {
                self.refused = Some(ScanError::Encrypted {
                    file: self.name.clone(),
                });
                return Ok(Walk::Stop);
            }
            GTID_EVENT => {
                if let Some(t) = self.current.take() {
                    self.unended(&t);
                    return Ok(Walk::Stop);
                }
                let Some((gtid, flags)) = read_gtid(f, h)? else {
                    self.refused = Some(ScanError::Unreadable {
                        file: self.name.clone(),
                        offset: h.position,
                        what: "a GTID event too short to hold one".into(),
                    });
                    return Ok(Walk::Stop);
                };
                if let Some(previous) = self.last.get(&gtid.domain).copied()
                    && gtid.seq <= previous.seq
                {
                    self.refused = Some(ScanError::OutOfOrder {
                        file: self.name.clone(),
                        offset: h.position,
                        gtid,
                        previous,
                    });
                    return Ok(Walk::Stop);
                }
                self.last.insert(gtid.domain, gtid);
                let r = self.reached.entry(gtid.domain).or_default();
                *r = (*r).max(gtid.seq);
                let wanted = self.wanted_gtid(gtid);
                self.active = wanted;
                if past(wanted) {
                    self.stopped = true;
                    return Ok(Walk::Stop);
                }
                self.current = Some(Txn {
                    gtid: Some(gtid),
                    start: here,
                    standalone: flags & FL_STANDALONE != 0,
                    applier: flags & (FL_STANDALONE | FL_DDL | FL_PREPARED_XA | FL_COMPLETED_XA)
                        == 0,
                    complete: false,
                    wanted,
                    at,
                    system: None,
                });
                return Ok(Walk::Next);
            }
            k if FRAME_EVENTS.contains(&k) => {
                // Between transactions; one inside a transaction is one the scan could not
                // follow.
                if let Some(t) = self.current.take() {
                    self.unended(&t);
                    return Ok(Walk::Stop);
                }
                if past(self.active) {
                    self.stopped = true;
                    return Ok(Walk::Stop);
                }
                if k == GTID_LIST_EVENT && !self.listed {
                    let Some(list) = crate::binlog::read_gtid_list(f, h.body)? else {
                        self.refused = Some(ScanError::Unreadable {
                            file: self.name.clone(),
                            offset: h.position,
                            what: "a Gtid_list event that does not read".into(),
                        });
                        return Ok(Walk::Stop);
                    };
                    if !list.is_empty() {
                        self.listed = true;
                        self.check_list(&list, h.position);
                        if self.refused.is_some() {
                            return Ok(Walk::Stop);
                        }
                    }
                }
                return Ok(Walk::Next);
            }
            _ => {}
        }
        let Some(mut t) = self.current.take() else {
            // An event outside any transaction (an incident, an event of a binlog without
            // GTIDs): the client's way, on its own, as the last group was.
            if past(self.active) {
                self.stopped = true;
                return Ok(Walk::Stop);
            }
            // A table map outside a transaction is judged as in one, wanted or not:
            // mariadb-binlog prints it, and the rows after it, as it reads them.
            let system = match h.kind {
                TABLE_MAP_EVENT => system_table(f, h.body)?,
                _ => None,
            };
            if let Some(table) = system {
                self.out.system_rows.get_or_insert(SystemRows {
                    at: here,
                    gtid: None,
                    table,
                });
            }
            let t = Txn {
                gtid: None,
                start: here,
                standalone: true,
                applier: false,
                complete: true,
                wanted: self.active,
                at,
                system: None,
            };
            self.finish(t, end);
            return Ok(Walk::Next);
        };
        if past(t.wanted) {
            self.stopped = true;
            return Ok(Walk::Stop);
        }
        t.at = t.at.max(at);
        match h.kind {
            ANNOTATE_ROWS_EVENT => {}
            k if ROWS_EVENTS.contains(&k) => {}
            TABLE_MAP_EVENT => {
                if let Some(table) = system_table(f, h.body)? {
                    t.applier = false;
                    t.system.get_or_insert((here, table));
                }
            }
            XID_EVENT | XA_PREPARE_LOG_EVENT => {
                if h.kind == XA_PREPARE_LOG_EVENT {
                    t.applier = false;
                }
                t.complete = true;
            }
            QUERY_EVENT => {
                let query = read_query(f, h.body, self.checksum)?;
                let commit = query.as_deref() == Some(b"COMMIT".as_slice());
                if !commit {
                    t.applier = false;
                }
                if t.standalone || commit || query.as_deref() == Some(b"ROLLBACK".as_slice()) {
                    t.complete = true;
                }
            }
            QUERY_COMPRESSED_EVENT | EXECUTE_LOAD_QUERY_EVENT => {
                t.applier = false;
                if t.standalone {
                    t.complete = true;
                }
            }
            // Anything else (statement context, LOAD DATA blocks, events this module does
            // not know): the client's way.
            _ => t.applier = false,
        }
        if t.complete {
            self.finish(t, end);
        } else {
            self.current = Some(t);
        }
        Ok(Walk::Next)
    }

    /// The checks `mariadb-binlog` makes of the first `Gtid_list` it reads: a GTID start
    /// names every domain the list holds, at or after the list's position (else the files
    /// miss transactions after the start); without one, the switch is after the list's
    /// position.
    fn check_list(&mut self, list: &GtidPos, position: u64) {
        for g in list.gtids() {
            let r = self.reached.entry(g.domain).or_default();
            *r = (*r).max(g.seq);
        }
        let problem = match &self.start {
            Start::AfterGtid(p) => list.gtids().find_map(|g| match p.get(g.domain) {
                None => Some(format!(
                    "the binlogs hold domain {} ({g}), which the start position {p} does not name",
                    g.domain
                )),
                Some(s) if s.seq < g.seq => Some(format!(
                    "the binlogs start after {g}, past the start position {s}: transactions \
                     between are missing"
                )),
                Some(_) => None,
            }),
            _ => self.until.and_then(|u| {
                u.gtids()
                    .find(|s| list.get(s.domain).is_some_and(|g| g.seq >= s.seq))
                    .map(|s| format!("the switch position {s} comes before the binlogs start"))
            }),
        };
        if let Some(what) = problem {
            self.refused = Some(ScanError::Unreadable {
                file: self.name.clone(),
                offset: position,
                what,
            });
        }
    }

    /// Whether a transaction starting at `here` is after the byte offset replay starts at.
    fn wanted_at(&self, here: At) -> bool {
        match &self.start {
            Start::Offset(o) => here.file > 0 || here.offset >= *o,
            _ => true,
        }
    }

    /// Whether a transaction is after the GTID start and within the switch.
    fn wanted_gtid(&self, g: Gtid) -> bool {
        if let Start::AfterGtid(p) = &self.start
            && p.get(g.domain).is_some_and(|s| g.seq <= s.seq)
        {
            return false;
        }
        self.until
            .is_none_or(|u| u.get(g.domain).is_some_and(|last| g.seq <= last.seq))
    }

    /// A transaction cut short by the next one or a frame event.
    fn unended(&mut self, t: &Txn) {
        self.refused = Some(ScanError::Unended {
            file: self.name.clone(),
            offset: t.start.offset,
        });
    }

    /// A complete transaction: added to the pieces when wanted.
    fn finish(&mut self, t: Txn, end: At) {
        if !t.wanted {
            self.broken = true;
            return;
        }
        if let Some((at, table)) = t.system
            && self.out.system_rows.is_none()
        {
            self.out.system_rows = Some(SystemRows {
                at,
                gtid: t.gtid,
                table,
            });
        }
        let route = if t.applier {
            Route::Applier
        } else {
            Route::Client
        };
        let follows = !self.broken && !self.out.pieces.is_empty();
        let extend = follows && self.out.pieces.last().is_some_and(|p| p.route == route);
        self.broken = false;
        if !extend {
            self.out.pieces.push(Piece {
                route,
                start: t.start,
                end,
                transactions: 0,
                samples: Vec::new(),
                follows,
            });
        }
        let Some(p) = self.out.pieces.last_mut() else {
            return;
        };
        p.end = end;
        p.transactions += 1;
        if p.transactions % SAMPLE_EVERY == 0 {
            p.samples.push((end, p.transactions, t.at));
        }
        self.out.transactions += 1;
        if let Some(g) = t.gtid {
            self.out.applied.advance(g);
        }
        self.out.last_at = self.out.last_at.max(t.at);
    }
}

/// A file read front to back through a buffer: [`walk`] seeks to each event's start, which
/// here moves within the buffer (a binlog of small transactions is millions of events).
struct Sequential {
    inner: std::io::BufReader<std::fs::File>,
    pos: u64,
}

impl Sequential {
    fn open(path: &std::path::Path) -> std::io::Result<Self> {
        Ok(Sequential {
            inner: std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?),
            pos: 0,
        })
    }
}

impl Read for Sequential {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for Sequential {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        match to {
            std::io::SeekFrom::Start(n) => {
                let by = i64::try_from(n).unwrap_or(i64::MAX)
                    - i64::try_from(self.pos).unwrap_or(i64::MAX);
                self.inner.seek_relative(by)?;
                self.pos = n;
            }
            other => self.pos = self.inner.seek(other)?,
        }
        Ok(self.pos)
    }
}

/// A GTID event's GTID and flags.
fn read_gtid(f: &mut impl Read, h: &Header) -> Result<Option<(Gtid, u8)>, BinlogError> {
    let mut b = [0u8; 13];
    if h.body < 13 || read_full(f, &mut b)? < 13 {
        return Ok(None);
    }
    let seq = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    let domain = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    Ok(Some((Gtid::new(domain, h.server, seq), b[12])))
}

/// The checksum bytes at each event's end, from a format description's body: its
/// algorithm byte comes before its own 4-byte checksum (1: CRC32, 4 bytes; 0: none).
/// `Err` with what is wrong when it describes events laid out otherwise than MariaDB
/// writes them and this module reads them: the server would read another table name, or
/// another statement, from the same bytes (a forged format description).
fn read_format(f: &mut impl Read, body: u64) -> Result<Result<u64, String>, BinlogError> {
    // binlog version (2), server version (50), creation time (4), header length (1), the
    // post-header lengths (one per event type, from type 1), then the algorithm and its
    // checksum.
    const LENGTHS: usize = 57;
    let post = |b: &[u8], kind: u8| b.get(LENGTHS + usize::from(kind) - 1).copied();
    if !(LENGTHS as u64 + u64::from(TABLE_MAP_EVENT) + 5..=4096).contains(&body) {
        return Ok(Err(format!("a format description of {body} bytes")));
    }
    let mut b = vec![0u8; usize::try_from(body).unwrap_or(0)];
    if read_full(f, &mut b)? < b.len() {
        return Ok(Err("a format description cut short".into()));
    }
    let header = b[LENGTHS - 1];
    if header != 19 {
        return Ok(Err(format!(
            "a format description of {header}-byte event headers (MariaDB's are 19)"
        )));
    }
    for (kind, name, want) in [
        (QUERY_EVENT, "query", 13),
        (TABLE_MAP_EVENT, "table map", 8),
    ] {
        let got = post(&b, kind);
        if got != Some(want) {
            return Ok(Err(format!(
                "a format description giving {name} events a post-header of {got:?} bytes \
                 (MariaDB's is {want})"
            )));
        }
    }
    let alg = b[b.len() - 5];
    Ok(Ok(if alg == 1 { 4 } else { 0 }))
}

/// A query event's statement (its body: thread id 4, time 4, schema length 1, error code
/// 2, status length 2, the status, the schema and a NUL, then the text up to the
/// checksum). `None` when the body does not hold one.
fn read_query(f: &mut impl Read, body: u64, checksum: u64) -> Result<Option<Vec<u8>>, BinlogError> {
    // Only short statements matter here (`COMMIT`, `ROLLBACK`): longer ones are read no
    // further than that.
    let mut head = [0u8; 13];
    if body < 13 + checksum || read_full(f, &mut head)? < 13 {
        return Ok(None);
    }
    let schema = u64::from(head[8]);
    let status = u64::from(u16::from_le_bytes([head[11], head[12]]));
    let Some(text) = body.checked_sub(13 + status + schema + 1 + checksum) else {
        return Ok(None);
    };
    if text > 16 {
        return Ok(Some(b"(a statement)".to_vec()));
    }
    let mut rest = vec![0u8; usize::try_from(status + schema + 1 + text).unwrap_or(0)];
    if read_full(f, &mut rest)? < rest.len() {
        return Ok(None);
    }
    Ok(Some(rest[rest.len() - text as usize..].to_vec()))
}

/// A schema's and a table's names, as a binlog holds them.
type TableName = (Vec<u8>, Vec<u8>);

/// A table map event's schema and table (body: table id 6, flags 2, schema length 1, the
/// schema, a NUL, table length 1, the table, a NUL, …). `None` when the body does not hold
/// them.
fn read_table_map_name(f: &mut impl Read, body: u64) -> Result<Option<TableName>, BinlogError> {
    let mut head = [0u8; 9];
    if body < 9 || read_full(f, &mut head)? < 9 {
        return Ok(None);
    }
    let len = usize::from(head[8]);
    // The schema, its NUL and the table's length.
    let mut schema = vec![0u8; len + 2];
    if body < 9 + len as u64 + 2 || read_full(f, &mut schema)? < schema.len() || schema[len] != 0 {
        return Ok(None);
    }
    let table_len = usize::from(schema[len + 1]);
    schema.truncate(len);
    let mut table = vec![0u8; table_len + 1];
    if body < 9 + len as u64 + 2 + table_len as u64 + 1
        || read_full(f, &mut table)? < table.len()
        || table[table_len] != 0
    {
        return Ok(None);
    }
    table.truncate(table_len);
    Ok(Some((schema, table)))
}

/// The table a table map event names, as `schema.table` (escaped), when it is a table of
/// the server's own schemas, or one the event does not name readably (such an event never
/// goes to the applier either).
fn system_table(f: &mut impl Read, body: u64) -> Result<Option<String>, BinlogError> {
    let Some((schema, table)) = read_table_map_name(f, body)? else {
        return Ok(Some("(a table map that does not read)".into()));
    };
    let (Ok(schema), Ok(table)) = (String::from_utf8(schema), String::from_utf8(table)) else {
        return Ok(Some("(a table name that is not UTF-8)".into()));
    };
    // The server reads a name up to a NUL, and `#mysql50#name` as the directory `name`.
    if schema.contains('\0') || table.contains('\0') {
        return Ok(Some(format!(
            "{}.{} (a name with a NUL)",
            schema.escape_debug(),
            table.escape_debug()
        )));
    }
    let bare = schema
        .get(..9)
        .filter(|p| p.eq_ignore_ascii_case("#mysql50#"))
        .map_or(schema.as_str(), |_| &schema[9..]);
    if !SYSTEM_SCHEMAS
        .iter()
        .any(|sys| bare.eq_ignore_ascii_case(sys))
    {
        return Ok(None);
    }
    Ok(Some(format!(
        "{}.{}",
        schema.escape_debug(),
        table.escape_debug()
    )))
}

/// The first table map event of `files` (from byte `offset` of the first) that names a
/// table of the server's own schemas, with where it is: what a run the scan cannot follow
/// is checked by, every event counted (a transaction the replay would skip too).
///
/// # Errors
/// A file cannot be read.
pub fn find_system_rows(files: &[PathBuf], offset: u64) -> Result<Option<SystemRows>, ScanError> {
    for (i, path) in files.iter().enumerate() {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        let mut f = Sequential::open(path).map_err(|e| ScanError::Binlog {
            file: name.clone(),
            source: e.into(),
        })?;
        let mut found = None;
        let mut unreadable = None;
        let mut gtid = None;
        let mut at_offset = offset == 0;
        let walked = walk(&mut f, |h, f| {
            if h.kind == FORMAT_DESCRIPTION_EVENT
                && let Err(what) = read_format(f, h.body)?
            {
                unreadable = Some((h.position, what));
                return Ok(Walk::Stop);
            }
            if i == 0 && h.position < offset {
                return Ok(Walk::Next);
            }
            if i == 0 && !at_offset {
                if h.position != offset {
                    unreadable = Some((h.position, format!("no event starts at byte {offset}")));
                    return Ok(Walk::Stop);
                }
                at_offset = true;
            }
            match h.kind {
                GTID_EVENT => gtid = read_gtid(f, h)?.map(|(g, _)| g),
                TABLE_MAP_EVENT => {
                    if let Some(table) = system_table(f, h.body)? {
                        found = Some(SystemRows {
                            at: At {
                                file: i,
                                offset: h.position,
                            },
                            gtid,
                            table,
                        });
                        return Ok(Walk::Stop);
                    }
                }
                _ => {}
            }
            Ok(Walk::Next)
        });
        if found.is_some() {
            return Ok(found);
        }
        if let Some((offset, what)) = unreadable {
            return Err(ScanError::Unreadable {
                file: name,
                offset,
                what,
            });
        }
        walked.map_err(|source| ScanError::Binlog { file: name, source })?;
    }
    Ok(None)
}

// ---- Driving the private server ------------------------------------------------------

/// The restore's segments as the private server's relay logs: every file hard-linked as
/// `relay.NNNNNN` (in the restore's order) in a directory of its own, listed in
/// `relay.index`. The server's user gets the directory and the index (it adds a relay log
/// of its own), never the files: it reads them (mode 0644 whatever the umask was).
#[derive(Debug)]
pub(crate) struct Relay {
    dir: PathBuf,
}

impl Relay {
    /// Links `files` into `<work>/relay`.
    ///
    /// # Errors
    /// The directory, the index or a link cannot be made; the server user is refused.
    pub(crate) async fn prepare(
        tools: &crate::tools::Tools,
        work: &std::path::Path,
        files: &[PathBuf],
    ) -> Result<Relay, crate::tools::RestoreError> {
        let io = crate::tools::io_error;
        let dir = work.join("relay");
        std::fs::create_dir(&dir).map_err(io("creating the relay log directory", &dir))?;
        // The server reads relative paths from its data directory, and writes the index's
        // entries as its relay log's directory and the name: the index is written so.
        let dir =
            std::fs::canonicalize(&dir).map_err(io("finding the relay log directory", &dir))?;
        let relay = Relay { dir };
        let index: String = (0..files.len())
            .map(|i| format!("{}\n", relay.path(i).display()))
            .collect();
        let index_file = relay.dir.join("relay.index");
        std::fs::write(&index_file, index)
            .map_err(io("writing the relay log index", &index_file))?;
        if let Some(user) = crate::server::server_user(tools, &relay.dir).await? {
            crate::server::hand_over(&relay.dir, &user)?;
        }
        for (i, f) in files.iter().enumerate() {
            let link = relay.path(i);
            std::fs::hard_link(f, &link)
                .map_err(io("linking a segment as a relay log", &relay.dir))?;
            // Readable whatever the umask the segment was written under (a unit's
            // `UMask=0077`): the scratch directory above keeps everyone else out.
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&link, std::fs::Permissions::from_mode(0o644))
                .map_err(io("making a relay log readable", &link))?;
        }
        Ok(relay)
    }

    /// The relay log of the restore's `i`th file.
    fn name(i: usize) -> String {
        format!("relay.{:06}", i + 1)
    }

    /// The source binlog the applier is told it reads from (`MASTER_LOG_FILE`): a name of
    /// the form `base.number`. Without one the parallel workers compare two empty names
    /// as binlog names, and MariaDB 10.11 crashes on that (`compare_log_name` reads past
    /// a name without a dot); the SQL thread alone never compares them. Made here, never
    /// read from the store: it goes into a statement.
    fn source_name(i: usize) -> String {
        format!("replay.{:06}", i + 1)
    }

    fn path(&self, i: usize) -> PathBuf {
        self.dir.join(Self::name(i))
    }

    /// The server's options: these relay logs, kept (no purge, no recovery that would
    /// discard them), replication state files beside them (never in the data directory),
    /// events of every server id applied, `threads` parallel workers (0: the SQL thread
    /// alone), optimistic (transactions of one domain in parallel, in-order commits), and a
    /// server id none of `servers` (the events' ids) is: the applier's `UNTIL` is not
    /// checked at events of its own server id.
    pub(crate) fn server_args(
        &self,
        threads: u16,
        servers: impl Iterator<Item = u32>,
    ) -> Vec<String> {
        let servers: std::collections::BTreeSet<u32> = servers.collect();
        let id = (1..=u32::MAX)
            .rev()
            .find(|id| !servers.contains(id))
            .unwrap_or(1);
        let d = self.dir.display();
        let mut args = vec![
            format!("--server-id={id}"),
            format!("--relay-log={d}/relay"),
            format!("--relay-log-index={d}/relay.index"),
            format!("--relay-log-info-file={d}/relay-log.info"),
            format!("--master-info-file={d}/master.info"),
            "--relay-log-purge=0".into(),
            "--relay-log-recovery=0".into(),
            "--replicate-same-server-id=1".into(),
            "--slave-sql-verify-checksum=1".into(),
            "--slave-exec-mode=STRICT".into(),
            format!("--slave-parallel-threads={threads}"),
        ];
        if threads > 0 {
            args.push("--slave-parallel-mode=optimistic".into());
        }
        args
    }
}

/// Where the applier stands: `SHOW SLAVE STATUS`'s group position, as a relay log number
/// (its index in the restore's files; the server's own new relay log comes after them)
/// and a byte offset, whether the SQL thread runs, and its error.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Standing {
    file: Option<usize>,
    offset: u64,
    running: bool,
    error: Option<String>,
}

fn standing(row: &BTreeMap<String, String>) -> Standing {
    let get = |k: &str| row.get(k).map(String::as_str).unwrap_or_default();
    let file = get("Relay_Log_File")
        .rsplit('.')
        .next()
        .and_then(|n| n.parse::<usize>().ok())
        .and_then(|n| n.checked_sub(1));
    let errno = get("Last_SQL_Errno");
    Standing {
        file,
        offset: get("Relay_Log_Pos").parse().unwrap_or(0),
        running: get("Slave_SQL_Running") == "Yes",
        error: (!errno.is_empty() && errno != "0")
            .then(|| format!("error {errno}: {}", get("Last_SQL_Error"))),
    }
}

/// How often the applier is asked where it stands.
const POLL: std::time::Duration = std::time::Duration::from_millis(200);
/// How often progress is logged (the progress display is told at every poll).
const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Applies one piece through the applier: from `piece.start` to `piece.end` of the run
/// whose first file is the restore's `first`, stopping there (`UNTIL`), and checks it
/// stopped there.
///
/// # Errors
/// The server refuses a statement; the SQL thread stops on an error (its message), or
/// somewhere else than the piece's end.
pub(crate) async fn apply_piece(
    server: &crate::server::PrivateServer,
    tools: &crate::tools::Tools,
    first: usize,
    piece: &Piece,
    timeline: u32,
    progress: &dyn tidemark_store::Progress,
) -> Result<(), crate::tools::RestoreError> {
    let (from, to) = (first + piece.start.file, first + piece.end.file);
    server
        .admin_sql(
            tools,
            &format!(
                "CHANGE MASTER TO MASTER_HOST='localhost', MASTER_USE_GTID=no, \
                 MASTER_LOG_FILE='{}', MASTER_LOG_POS={}, \
                 RELAY_LOG_FILE='{}', RELAY_LOG_POS={}; \
                 START SLAVE SQL_THREAD UNTIL RELAY_LOG_FILE='{}', RELAY_LOG_POS={};",
                Relay::source_name(from),
                piece.start.offset,
                Relay::name(from),
                piece.start.offset,
                Relay::name(to),
                piece.end.offset,
            ),
        )
        .await?;
    let reached = |s: &Standing| {
        s.file
            .is_some_and(|f| f > to || (f == to && s.offset >= piece.end.offset))
    };
    let mut logged = std::time::Instant::now();
    loop {
        tokio::time::sleep(POLL).await;
        let s = match server.admin_row("SHOW SLAVE STATUS").await {
            Ok(row) => standing(&row),
            // The server went away: its log says why.
            Err(e) => {
                return Err(crate::tools::RestoreError::Tool {
                    step: format!("the replication applier (timeline {timeline}): {e}"),
                    status: "the private server stopped answering".into(),
                    tail: server.log_tail(),
                });
            }
        };
        let done = piece_progress(piece, first, &s);
        let told = format!(
            "timeline {timeline} through the applier: {} of {} transaction(s) applied, at {} \
             byte {}{}",
            done.0,
            piece.transactions,
            s.file.map_or_else(|| "?".into(), Relay::name),
            s.offset,
            done.1
                .map(|t| format!(", last event {t}"))
                .unwrap_or_default()
        );
        progress.status(&told);
        if logged.elapsed() >= LOG_EVERY {
            tracing::info!("{told}");
            logged = std::time::Instant::now();
        }
        if let Some(e) = s.error {
            let _ = server.admin_sql(tools, "STOP SLAVE SQL_THREAD").await;
            return Err(crate::tools::RestoreError::Tool {
                step: format!("the replication applier (timeline {timeline})"),
                status: e,
                tail: String::new(),
            });
        }
        if reached(&s) || !s.running {
            if s.running {
                // At the end of the last relay log the thread waits for more: done.
                server.admin_sql(tools, "STOP SLAVE SQL_THREAD").await?;
            }
            // Stopped, the applier must stand exactly at the piece's end: before it, events
            // of the window were not applied; past it, events after the stop were.
            let exact = s.file == Some(to) && s.offset == piece.end.offset;
            if !exact {
                return Err(crate::tools::RestoreError::Tool {
                    step: format!("the replication applier (timeline {timeline})"),
                    status: format!(
                        "stopped at relay log {} byte {}, {} {} byte {}",
                        s.file.map_or_else(|| "?".into(), Relay::name),
                        s.offset,
                        if reached(&s) { "past" } else { "before" },
                        Relay::name(to),
                        piece.end.offset
                    ),
                    tail: String::new(),
                });
            }
            return Ok(());
        }
    }
}

/// Replays one run (a timeline's files, the restore's `run.first..`) by its scan: each
/// piece through the applier or through one client session of `login`, in order.
///
/// # Errors
/// As [`apply_piece`] and [`Session::apply`].
#[allow(clippy::too_many_arguments)]
pub(crate) async fn apply_run(
    server: &crate::server::PrivateServer,
    tools: &crate::tools::Tools,
    run: &tidemark_core::restore::ReplayRun,
    files: &[PathBuf],
    scan: &Scan,
    login: &crate::server::Login,
    stop: Timestamp,
    work: &std::path::Path,
    progress: &dyn tidemark_store::Progress,
) -> Result<(), crate::tools::RestoreError> {
    let mut session: Option<Session> = None;
    for (i, piece) in scan.pieces.iter().enumerate() {
        match piece.route {
            Route::Applier => {
                progress.step(
                    &format!(
                        "replaying timeline {} through the replication applier: {} \
                         transaction(s), part {} of {}",
                        run.timeline,
                        piece.transactions,
                        i + 1,
                        scan.pieces.len()
                    ),
                    0,
                );
                apply_piece(server, tools, run.first, piece, run.timeline, progress).await?;
            }
            Route::Client => {
                progress.step(
                    &format!(
                        "replaying timeline {} through mariadb-binlog | mariadb: {} \
                         transaction(s), part {} of {}",
                        run.timeline,
                        piece.transactions,
                        i + 1,
                        scan.pieces.len()
                    ),
                    0,
                );
                let session = match &mut session {
                    Some(s) => s,
                    None => session.insert(Session::open(&tools.mariadb, login, &server.socket)?),
                };
                let mut decoder = crate::server::decoder(&tools.mariadb_binlog, work, stop)?;
                decoder
                    .arg(format!("--start-position={}", piece.start.offset))
                    .arg(format!("--stop-position={}", piece.end.offset))
                    .args(
                        files
                            .get(piece.start.file..=piece.end.file)
                            .unwrap_or_default(),
                    );
                session
                    .apply(
                        &mut decoder,
                        &tools.mariadb_binlog,
                        &format!("mariadb-binlog (timeline {})", run.timeline),
                    )
                    .await?;
            }
        }
    }
    match session {
        Some(s) => s.close().await,
        None => Ok(()),
    }
}

/// How far a piece is: transactions applied (by its samples) and the time of the last.
fn piece_progress(piece: &Piece, first: usize, s: &Standing) -> (u64, Option<Timestamp>) {
    let Some(file) = s.file.and_then(|f| f.checked_sub(first)) else {
        return (0, None);
    };
    let here = At {
        file,
        offset: s.offset,
    };
    if here >= piece.end {
        return (piece.transactions, None);
    }
    piece
        .samples
        .iter()
        .rev()
        .find(|(at, _, _)| *at <= here)
        .map_or((0, None), |(_, n, t)| (*n, *t))
}

/// One `mariadb` client session of the replay account for a run: the client pieces are
/// decoded into it one after the other, so what one leaves in the session (a temporary
/// table, a variable) is there for the next, as in one `mariadb-binlog | mariadb`.
pub(crate) struct Session {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    /// Lines the client printed that end a piece (see [`Session::apply`]).
    marks: tokio::sync::mpsc::UnboundedReceiver<String>,
    stderr: tokio::task::JoinHandle<Vec<u8>>,
    program: std::ffi::OsString,
}

impl Session {
    /// Logs in as `login`: no client command from the text (`--binary-mode`), no local
    /// file sent (`--local-infile=0`).
    ///
    /// # Errors
    /// The client cannot be started.
    pub(crate) fn open(
        client: &std::ffi::OsString,
        login: &crate::server::Login,
        socket: &std::path::Path,
    ) -> Result<Session, crate::tools::RestoreError> {
        use std::process::Stdio;
        use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _};
        let mut child = crate::tools::spawn(
            tokio::process::Command::new(client)
                .args(login.args(socket))
                // Unbuffered: each mark is printed as its statement ends, not at exit.
                .args([
                    "--binary-mode",
                    "--local-infile=0",
                    "--unbuffered",
                    "-N",
                    "-B",
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
            client,
        )?;
        let name = client.to_string_lossy().into_owned();
        let (Some(stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(crate::tools::no_pipe(&name));
        };
        let (tx, marks) = tokio::sync::mpsc::unbounded_channel();
        // Everything it prints is read (a client that cannot write stops reading); only
        // the marks are kept.
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if l.starts_with(MARK) && tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr = tokio::spawn(async move {
            let mut b = Vec::new();
            let _ = stderr.read_to_end(&mut b).await;
            b
        });
        Ok(Session {
            child,
            stdin: Some(stdin),
            marks,
            stderr,
            program: client.clone(),
        })
    }

    /// Sends what `decoder` prints, then a mark of its own, and waits until the client
    /// printed the mark: everything before it was applied.
    ///
    /// # Errors
    /// The decoder fails or reports an error; the client exits (a statement failed).
    pub(crate) async fn apply(
        &mut self,
        decoder: &mut tokio::process::Command,
        program: &std::ffi::OsString,
        step: &str,
    ) -> Result<(), crate::tools::RestoreError> {
        use std::process::Stdio;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut d = crate::tools::spawn(
            decoder
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
            program,
        )?;
        let (Some(mut out), Some(mut err)) = (d.stdout.take(), d.stderr.take()) else {
            return Err(crate::tools::no_pipe(step));
        };
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(crate::tools::no_pipe(step));
        };
        let mut said = Vec::new();
        let (copied, _) =
            tokio::join!(tokio::io::copy(&mut out, stdin), err.read_to_end(&mut said));
        let status = d
            .wait()
            .await
            .map_err(|source| crate::tools::RestoreError::Spawn {
                program: program.to_string_lossy().into_owned(),
                source,
            })?;
        let said = String::from_utf8_lossy(&said);
        if !status.success() || said.lines().any(|l| l.starts_with("ERROR:")) {
            return Err(crate::tools::RestoreError::Tool {
                step: step.into(),
                status: status.to_string(),
                tail: crate::tools::tail(&said),
            });
        }
        let mark = format!("{MARK}{}", crate::server::random_word());
        let sent = match copied {
            Ok(_) => {
                stdin
                    .write_all(format!("\nSELECT '{mark}';\n").as_bytes())
                    .await
            }
            Err(e) => Err(e),
        };
        let seen = match sent {
            Ok(()) => loop {
                match self.marks.recv().await {
                    Some(l) if l == mark => break true,
                    Some(_) => {}
                    None => break false,
                }
            },
            Err(_) => false,
        };
        if seen {
            return Ok(());
        }
        // The client went away: a statement failed.
        Err(self.failure().await)
    }

    async fn failure(&mut self) -> crate::tools::RestoreError {
        self.stdin = None;
        let status = self.child.wait().await;
        let said = (&mut self.stderr).await.unwrap_or_default();
        crate::tools::RestoreError::Tool {
            step: "mariadb (applying the binlog events)".into(),
            status: status.map_or_else(|e| e.to_string(), |s| s.to_string()),
            tail: crate::tools::tail(&String::from_utf8_lossy(&said)),
        }
    }

    /// Ends the session.
    ///
    /// # Errors
    /// The client exits with an error.
    pub(crate) async fn close(mut self) -> Result<(), crate::tools::RestoreError> {
        self.stdin = None;
        let status =
            self.child
                .wait()
                .await
                .map_err(|source| crate::tools::RestoreError::Spawn {
                    program: self.program.to_string_lossy().into_owned(),
                    source,
                })?;
        if status.success() {
            return Ok(());
        }
        let said = (&mut self.stderr).await.unwrap_or_default();
        Err(crate::tools::RestoreError::Tool {
            step: "mariadb (applying the binlog events)".into(),
            status: status.to_string(),
            tail: crate::tools::tail(&String::from_utf8_lossy(&said)),
        })
    }
}

/// What a session's marks start with.
const MARK: &str = "tidemark-applied-";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const T0: i64 = 1_763_600_000;

    /// One event of a test binlog.
    enum Ev {
        /// A row transaction on `schema`: GTID, table map, write rows, XID.
        Rows(Gtid, i64, &'static str),
        /// A MyISAM-style row transaction ended by a `COMMIT` query.
        RowsCommit(Gtid, i64),
        /// A standalone statement (a DDL).
        Ddl(Gtid, i64, &'static str),
        /// A statement-logged DML in a transaction.
        Statement(Gtid, i64),
        /// A row transaction whose XID never comes (the file ends).
        Open(Gtid, i64),
        /// A table map on `schema` and a row event, outside any transaction.
        Loose(&'static str),
        Rotate,
    }

    /// A binlog as MariaDB writes it, with CRC32 checksums (zeros: nothing here checks
    /// them) when `crc`.
    fn binlog(crc: bool, events: &[Ev]) -> Vec<u8> {
        let sum = if crc { 4 } else { 0 };
        let mut out = vec![0xfe, b'b', b'i', b'n'];
        let mut event = |ts: i64, kind: u8, server: u32, body: &[u8]| {
            crate::binlog::write_event(&mut out, ts, kind, server, body, sum);
        };
        // Format description: version 4, server version, time, header length, 40 post-
        // header lengths, the checksum algorithm (its own checksum follows, as `sum`).
        let mut fd = 4u16.to_le_bytes().to_vec();
        fd.extend_from_slice(&[0u8; 50]);
        fd.extend_from_slice(&0u32.to_le_bytes());
        fd.push(19);
        // MariaDB's post-header lengths where this module reads them (query, table map).
        let mut post = [0u8; 40];
        post[usize::from(QUERY_EVENT) - 1] = 13;
        post[usize::from(TABLE_MAP_EVENT) - 1] = 8;
        fd.extend_from_slice(&post);
        fd.push(u8::from(crc));
        if !crc {
            fd.extend_from_slice(&[0u8; 4]);
        }
        event(T0, FORMAT_DESCRIPTION_EVENT, 1, &fd);
        let gtid = |g: Gtid, flags: u8| {
            let mut b = g.seq.to_le_bytes().to_vec();
            b.extend_from_slice(&g.domain.to_le_bytes());
            b.push(flags);
            b
        };
        let query = |schema: &str, text: &str| {
            let mut b = vec![0u8; 8];
            b.push(schema.len() as u8);
            b.extend_from_slice(&0u16.to_le_bytes());
            b.extend_from_slice(&3u16.to_le_bytes());
            b.extend_from_slice(&[9, 9, 9]);
            b.extend_from_slice(schema.as_bytes());
            b.push(0);
            b.extend_from_slice(text.as_bytes());
            b
        };
        let table_map = |schema: &str| {
            let mut b = vec![7, 0, 0, 0, 0, 0, 1, 0];
            b.push(schema.len() as u8);
            b.extend_from_slice(schema.as_bytes());
            b.push(0);
            b.push(1);
            b.extend_from_slice(b"t\0");
            b.extend_from_slice(&[1, 3, 0, 0]);
            b
        };
        for e in events {
            match *e {
                Ev::Rows(g, t, schema) => {
                    event(t, GTID_EVENT, g.server, &gtid(g, 0));
                    event(
                        t,
                        ANNOTATE_ROWS_EVENT,
                        g.server,
                        b"INSERT INTO t VALUES (1)",
                    );
                    event(t, TABLE_MAP_EVENT, g.server, &table_map(schema));
                    event(
                        t,
                        30,
                        g.server,
                        &[7, 0, 0, 0, 0, 0, 1, 0, 2, 0, 1, 1, 0, 1, 0, 0, 0],
                    );
                    event(t, XID_EVENT, g.server, &42u64.to_le_bytes());
                }
                Ev::RowsCommit(g, t) => {
                    event(t, GTID_EVENT, g.server, &gtid(g, 0));
                    event(t, TABLE_MAP_EVENT, g.server, &table_map("shop"));
                    event(t, 30, g.server, &[7, 0, 0, 0, 0, 0, 1, 0]);
                    event(t, QUERY_EVENT, g.server, &query("shop", "COMMIT"));
                }
                Ev::Ddl(g, t, text) => {
                    event(t, GTID_EVENT, g.server, &gtid(g, FL_STANDALONE | FL_DDL));
                    event(t, QUERY_EVENT, g.server, &query("shop", text));
                }
                Ev::Statement(g, t) => {
                    event(t, GTID_EVENT, g.server, &gtid(g, 0));
                    event(
                        t,
                        QUERY_EVENT,
                        g.server,
                        &query("shop", "INSERT INTO t VALUES (2)"),
                    );
                    event(t, XID_EVENT, g.server, &43u64.to_le_bytes());
                }
                Ev::Open(g, t) => {
                    event(t, GTID_EVENT, g.server, &gtid(g, 0));
                    event(t, TABLE_MAP_EVENT, g.server, &table_map("shop"));
                    event(t, 30, g.server, &[7, 0, 0, 0, 0, 0, 1, 0]);
                }
                Ev::Loose(schema) => {
                    event(T0, TABLE_MAP_EVENT, 1, &table_map(schema));
                    event(T0, 30, 1, &[7, 0, 0, 0, 0, 0, 1, 0]);
                }
                Ev::Rotate => event(0, 4, 1, &[4, 0, 0, 0, 0, 0, 0, 0, b'x']),
            }
        }
        out
    }

    fn files(dir: &tempfile::TempDir, binlogs: &[Vec<u8>]) -> Vec<PathBuf> {
        binlogs
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let p = dir.path().join(format!("bin.{:06}", i + 1));
                std::fs::write(&p, b).unwrap();
                p
            })
            .collect()
    }

    fn g(seq: u64) -> Gtid {
        Gtid::new(0, 1, seq)
    }

    fn at(t: i64) -> Timestamp {
        Timestamp::from_second(t).unwrap()
    }

    /// The pieces as `route first-offset..last-offset ×n` per piece.
    fn shape(s: &Scan) -> Vec<(Route, usize, usize, u64)> {
        s.pieces
            .iter()
            .map(|p| (p.route, p.start.file, p.end.file, p.transactions))
            .collect()
    }

    #[test]
    fn row_transactions_go_to_the_applier_and_statements_to_the_client() {
        let dir = tempfile::tempdir().unwrap();
        for crc in [true, false] {
            let f = files(
                &dir,
                &[
                    binlog(
                        crc,
                        &[
                            Ev::Ddl(g(1), T0, "CREATE TABLE t (a INT)"),
                            Ev::Rows(g(2), T0 + 1, "shop"),
                            Ev::RowsCommit(g(3), T0 + 1),
                            Ev::Rotate,
                        ],
                    ),
                    binlog(
                        crc,
                        &[
                            Ev::Rows(g(4), T0 + 2, "Shop"),
                            Ev::Statement(g(5), T0 + 3),
                            Ev::Rows(g(6), T0 + 4, "MySQL"),
                            Ev::Rows(g(7), T0 + 5, "shop"),
                        ],
                    ),
                ],
            );
            let s = scan(&f, Start::Beginning, None, at(T0 + 100)).unwrap();
            assert_eq!(
                shape(&s),
                [
                    (Route::Client, 0, 0, 1),
                    (Route::Applier, 0, 1, 3),
                    (Route::Client, 1, 1, 2),
                    (Route::Applier, 1, 1, 1),
                ],
                "crc {crc}"
            );
            assert_eq!(s.transactions, 7);
            assert_eq!(s.through_applier(), 4);
            assert_eq!(s.applied.to_string(), "0-1-7");
            assert_eq!(s.last_at, Some(at(T0 + 5)));
            // Pieces follow each other: each starts at a GTID event, where the one before
            // ends (or in the next file).
            let b = std::fs::read(&f[0]).unwrap();
            let p = &s.pieces[1];
            assert_eq!(b[p.start.offset as usize + 4], GTID_EVENT);
            assert_eq!(p.start, s.pieces[0].end);
            assert_eq!(s.pieces[2].start, s.pieces[1].end);
            assert_eq!(s.pieces[3].start, s.pieces[2].end);
            // Settled: the lone row transaction at the end joins the statements before it;
            // with a higher floor everything is one client piece, in the same span.
            let mut settled = s.clone();
            settled.settle(2);
            assert_eq!(
                shape(&settled),
                [
                    (Route::Client, 0, 0, 1),
                    (Route::Applier, 0, 1, 3),
                    (Route::Client, 1, 1, 3),
                ]
            );
            assert_eq!(settled.pieces[2].end, s.pieces[3].end);
            let mut settled = s.clone();
            settled.settle(4);
            assert_eq!(shape(&settled), [(Route::Client, 0, 1, 7)]);
            assert_eq!(settled.pieces[0].start, s.pieces[0].start);
            assert_eq!(settled.transactions, s.transactions);
        }
    }

    #[test]
    fn where_replay_starts_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(
            &dir,
            &[binlog(
                true,
                &[
                    Ev::Rows(g(1), T0, "shop"),
                    Ev::Rows(Gtid::new(1, 1, 1), T0 + 1, "shop"),
                    Ev::Rows(g(2), T0 + 2, "shop"),
                    Ev::Rows(g(3), T0 + 3, "shop"),
                    Ev::Rows(g(4), T0 + 4, "shop"),
                ],
            )],
        );
        let stop = at(T0 + 100);
        let after = GtidPos::parse("0-1-2").unwrap();
        // After 0-1-2: domain 1 (not named) from its start, domain 0 from 0-1-3.
        let s = scan(&f, Start::AfterGtid(after.clone()), None, stop).unwrap();
        assert_eq!(s.applied.to_string(), "0-1-4,1-1-1");
        assert_eq!(
            shape(&s),
            [(Route::Applier, 0, 0, 1), (Route::Applier, 0, 0, 2)]
        );
        // A skipped transaction between keeps them apart: joined, it would be applied.
        let mut settled = s.clone();
        settled.settle(1);
        assert_eq!(shape(&settled), shape(&s));
        settled.settle(3);
        assert_eq!(
            shape(&settled),
            [(Route::Client, 0, 0, 1), (Route::Client, 0, 0, 2)]
        );
        // The switch: domain 0 up to 0-1-3, no other domain.
        let until = GtidPos::parse("0-1-3").unwrap();
        let s = scan(&f, Start::Beginning, Some(&until), stop).unwrap();
        assert_eq!(s.applied.to_string(), "0-1-3");
        assert_eq!(s.transactions, 3);
        // --stop-datetime: nothing at or after it.
        let s = scan(&f, Start::Beginning, None, at(T0 + 3)).unwrap();
        assert_eq!(s.applied.to_string(), "0-1-2,1-1-1");
        assert_eq!(s.last_at, Some(at(T0 + 2)));
        // A byte offset: from the transaction there (the second).
        let one = scan(&f, Start::Beginning, None, at(T0 + 1)).unwrap();
        let s = scan(&f, Start::Offset(one.pieces[0].end.offset), None, stop).unwrap();
        assert_eq!(s.transactions, 4);
        assert_eq!(s.pieces[0].start, one.pieces[0].end);
    }

    #[test]
    fn refusals_and_open_transactions() {
        let dir = tempfile::tempdir().unwrap();
        let stop = at(T0 + 100);
        // A sequence number going back in its domain.
        let f = files(
            &dir,
            &[binlog(
                true,
                &[Ev::Rows(g(5), T0, "shop"), Ev::Rows(g(5), T0, "shop")],
            )],
        );
        let e = scan(&f, Start::Beginning, None, stop).unwrap_err();
        assert!(matches!(e, ScanError::OutOfOrder { .. }), "{e}");
        assert!(e.to_string().contains("0-1-5 comes after 0-1-5"), "{e}");
        // The last file ends inside a transaction: it is not applied.
        let f = files(
            &dir,
            &[binlog(
                true,
                &[Ev::Rows(g(1), T0, "shop"), Ev::Open(g(2), T0)],
            )],
        );
        let s = scan(&f, Start::Beginning, None, stop).unwrap();
        assert_eq!(s.applied.to_string(), "0-1-1");
        // An earlier file does: the scan cannot follow it.
        let f = files(
            &dir,
            &[
                binlog(true, &[Ev::Open(g(1), T0)]),
                binlog(true, &[Ev::Rows(g(2), T0, "shop")]),
            ],
        );
        let e = scan(&f, Start::Beginning, None, stop).unwrap_err();
        assert!(matches!(e, ScanError::Unended { .. }), "{e}");
        // A transaction followed by another before its commit.
        let f = files(
            &dir,
            &[binlog(
                true,
                &[Ev::Open(g(1), T0), Ev::Rows(g(2), T0, "shop")],
            )],
        );
        assert!(matches!(
            scan(&f, Start::Beginning, None, stop),
            Err(ScanError::Unended { .. })
        ));
    }

    #[test]
    fn rows_of_the_servers_own_tables_are_found_however_they_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let stop = at(T0 + 100);
        let found = |events: &[Ev], start: Start| {
            let f = files(&dir, &[binlog(true, events)]);
            let scanned = scan(&f, start, None, stop).unwrap().system_rows;
            let whole = find_system_rows(&f, 0).unwrap();
            (scanned.map(|r| r.table), whole.map(|r| r.table))
        };
        let user = [Ev::Rows(g(1), T0, "shop"), Ev::Rows(g(2), T0, "Shop")];
        assert_eq!(found(&user, Start::Beginning), (None, None));
        for (schema, table) in [
            ("mysql", "mysql.t"),
            ("MySQL", "MySQL.t"),
            ("#mysql50#mysql", "#mysql50#mysql.t"),
            ("mysql\0x", "mysql\\0x.t (a name with a NUL)"),
            ("performance_schema", "performance_schema.t"),
        ] {
            let events = [Ev::Rows(g(1), T0, "shop"), Ev::Rows(g(2), T0, schema)];
            let (scanned, whole) = found(&events, Start::Beginning);
            assert_eq!(scanned.as_deref(), Some(table), "{schema:?}");
            assert_eq!(whole.as_deref(), Some(table), "{schema:?}");
            // Before the start: not applied, so not the scan's; the whole check counts it.
            let after = Start::AfterGtid(GtidPos::parse("0-1-2").unwrap());
            let (scanned, whole) = found(&events, after);
            assert_eq!(scanned, None, "{schema:?}");
            assert_eq!(whole.as_deref(), Some(table), "{schema:?}");
        }
        // A table map outside any transaction is found too, applied or not.
        let loose = [Ev::Rows(g(1), T0, "shop"), Ev::Loose("mysql")];
        assert_eq!(
            found(&loose, Start::Beginning),
            (Some("mysql.t".into()), Some("mysql.t".into()))
        );
    }

    #[test]
    fn a_format_description_read_otherwise_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let stop = at(T0 + 100);
        let good = binlog(true, &[Ev::Rows(g(1), T0, "shop")]);
        // The format description's body starts at byte 4 + 19: its header length at 56,
        // its post-header lengths from 57 (type 1 first).
        let body = 4 + 19;
        for (at, value, said) in [
            (body + 56, 23u8, "23-byte event headers"),
            (
                body + 57 + usize::from(TABLE_MAP_EVENT) - 1,
                6,
                "table map events",
            ),
            (body + 57 + usize::from(QUERY_EVENT) - 1, 11, "query events"),
        ] {
            let mut forged = good.clone();
            forged[at] = value;
            let f = files(&dir, &[forged]);
            let e = scan(&f, Start::Beginning, None, stop).unwrap_err();
            assert!(e.to_string().contains(said), "{e}");
            let e = find_system_rows(&f, 0).unwrap_err();
            assert!(e.to_string().contains(said), "{e}");
        }
        // A byte offset inside an event: refused, not read from the next one.
        let f = files(&dir, &[good]);
        let s = scan(&f, Start::Beginning, None, stop).unwrap();
        let inside = s.pieces[0].start.offset + 3;
        let e = scan(&f, Start::Offset(inside), None, stop).unwrap_err();
        assert!(e.to_string().contains("no event starts at byte"), "{e}");
        assert!(find_system_rows(&f, inside).is_err());
        assert!(scan(&f, Start::Offset(s.pieces[0].start.offset), None, stop).is_ok());
    }
}
