//! What a MariaDB/MySQL binary log file holds, read from its event headers: event times,
//! the server that wrote it, and (MariaDB) its GTIDs.
//!
//! A binlog (format v4) starts with the magic `\xfebin`; each event starts with a 19-byte
//! header: timestamp (u32, seconds since the epoch), type (u8), server id (u32), event
//! size (u32, header included), next position (u32), flags (u16), all little-endian. Only
//! the headers are read, seeking over bodies, so a 1 GiB file costs a few thousand reads;
//! the few bytes of a GTID event's body and the `Gtid_list` at the file's start are read
//! too. The format description event's server id is the file's writer (a replica's file
//! carries the replicated events with their original server ids, and its own in the
//! format description).

use std::io::{Read, Seek, SeekFrom};

use jiff::Timestamp;
use tidemark_core::gtid::{Gtid, GtidPos, GtidRun, RunBuilder};

const MAGIC: [u8; 4] = [0xfe, b'b', b'i', b'n'];
const HEADER: usize = 19;
const FORMAT_DESCRIPTION_EVENT: u8 = 15;
/// MariaDB's GTID_EVENT: a transaction's GTID (sequence u64, domain u32 in its body; the
/// server id is the header's).
const GTID_EVENT: u8 = 162;
/// MariaDB's GTID_LIST_EVENT: the binlog state at the file's start.
const GTID_LIST_EVENT: u8 = 163;
/// MariaDB's START_ENCRYPTION_EVENT: the events after it are encrypted.
const START_ENCRYPTION_EVENT: u8 = 164;
/// Most entries a `Gtid_list` may hold before the file is taken as unreadable by GTID (one
/// per domain and server: a real one holds a handful).
const MAX_GTID_LIST: usize = 4096;
/// Most runs recorded for one file: a file whose servers alternate more often is recorded
/// without GTIDs (replay then positions by time and lets `mariadb-binlog` skip by GTID).
pub const MAX_RUNS: usize = 1024;

/// What the file says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    /// The first event's time (the format description, written when the file was opened).
    pub first: Option<Timestamp>,
    /// The latest event time; `None` when it cannot be known (encrypted events follow).
    pub last: Option<Timestamp>,
    pub events: u64,
    /// The file ends inside an event (still being written, or cut short).
    pub truncated: bool,
    /// The server that wrote the file (its format description's server id).
    pub server_id: Option<u32>,
    /// The position at its start (MariaDB's `Gtid_list`); `None` without one.
    pub gtid_list: Option<GtidPos>,
    /// Its transactions, in order; `None` when they cannot all be read (encrypted events,
    /// more than [`MAX_RUNS`] runs, a malformed GTID event).
    pub runs: Option<Vec<GtidRun>>,
}

impl Summary {
    /// The file's GTIDs for the archive's index, when complete.
    pub fn gtids(&self) -> Option<tidemark_core::SegmentGtids> {
        Some(tidemark_core::SegmentGtids {
            server_id: self.server_id?,
            start: self.gtid_list.clone()?,
            runs: self.runs.clone()?,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BinlogError {
    #[error("not a binary log: it does not start with the magic bytes fe 62 69 6e")]
    NotBinlog,
    #[error("event at byte {position} declares a size of {size} bytes, less than its own header")]
    BadEvent { position: u64, size: u32 },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Reads what a binlog file holds.
///
/// # Errors
/// Not a binlog; a corrupt event header; an I/O error.
pub fn summary(f: &mut (impl Read + Seek)) -> Result<Summary, BinlogError> {
    read(f, false)
}

/// Reads only the start of a binlog file: its writer and its `Gtid_list` (the events up to
/// the first transaction), so choosing where a timeline starts costs a few reads per file.
///
/// # Errors
/// As [`summary`].
pub fn head(f: &mut (impl Read + Seek)) -> Result<Summary, BinlogError> {
    read(f, true)
}

/// Events [`head`] reads at most before giving up on finding a `Gtid_list`.
const HEAD_EVENTS: u64 = 16;

/// One event's header: the file is positioned at its body when a visitor sees it.
pub(crate) struct Header {
    pub(crate) ts: u32,
    pub(crate) kind: u8,
    pub(crate) server: u32,
    /// Bytes of body after the header.
    pub(crate) body: u64,
    /// Where the event starts in the file.
    pub(crate) position: u64,
}

/// What a visitor wants next.
pub(crate) enum Walk {
    Next,
    Stop,
}

/// Walks a binlog's events from the start, handing each header to `visit` (which may read
/// the body). Returns whether the file ends inside an event.
///
/// # Errors
/// Not a binlog; a corrupt event header; an I/O error; what `visit` returns.
pub(crate) fn walk<F: Read + Seek>(
    f: &mut F,
    mut visit: impl FnMut(&Header, &mut F) -> Result<Walk, BinlogError>,
) -> Result<bool, BinlogError> {
    let len = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    let mut magic = [0u8; 4];
    if read_full(f, &mut magic)? < 4 || magic != MAGIC {
        return Err(BinlogError::NotBinlog);
    }
    let mut position: u64 = 4;
    let mut header = [0u8; HEADER];
    loop {
        let got = read_full(f, &mut header)?;
        if got == 0 {
            return Ok(false);
        }
        if got < HEADER {
            return Ok(true);
        }
        let size = u32::from_le_bytes([header[9], header[10], header[11], header[12]]);
        if (size as usize) < HEADER {
            return Err(BinlogError::BadEvent { position, size });
        }
        let h = Header {
            ts: u32::from_le_bytes([header[0], header[1], header[2], header[3]]),
            kind: header[4],
            server: u32::from_le_bytes([header[5], header[6], header[7], header[8]]),
            body: u64::from(size) - HEADER as u64,
            position,
        };
        if let Walk::Stop = visit(&h, f)? {
            return Ok(false);
        }
        position += u64::from(size);
        if position > len {
            return Ok(true);
        }
        f.seek(SeekFrom::Start(position))?;
    }
}

/// A GTID event's body: its GTID (the server is the header's).
fn read_gtid(f: &mut impl Read, h: &Header) -> Result<Option<Gtid>, BinlogError> {
    let mut b = [0u8; 12];
    if h.body < 12 || read_full(f, &mut b)? < 12 {
        return Ok(None);
    }
    let seq = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    let domain = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    Ok(Some(Gtid::new(domain, h.server, seq)))
}

fn read(f: &mut (impl Read + Seek), head_only: bool) -> Result<Summary, BinlogError> {
    let mut out = Summary::default();
    let mut encrypted = false;
    let mut runs = Some(RunBuilder::default());
    out.truncated = walk(f, |h, f| {
        out.events += 1;
        // Some generated events (e.g. a fake rotate) carry a zero timestamp.
        if h.ts != 0 {
            let t = Timestamp::from_second(i64::from(h.ts)).ok();
            out.first = out.first.or(t);
            out.last = out.last.max(t);
        }
        match h.kind {
            FORMAT_DESCRIPTION_EVENT => {
                out.server_id.get_or_insert(h.server);
            }
            GTID_LIST_EVENT if out.gtid_list.is_none() => {
                out.gtid_list = read_gtid_list(f, h.body)?;
                if out.gtid_list.is_none() {
                    runs = None;
                }
            }
            GTID_EVENT => match read_gtid(f, h)? {
                None => runs = None,
                Some(g) => {
                    if let Some(r) = runs.as_mut() {
                        r.push(g);
                        if r.len() > MAX_RUNS {
                            runs = None;
                        }
                    }
                }
            },
            START_ENCRYPTION_EVENT => {
                encrypted = true;
                return Ok(Walk::Stop);
            }
            _ => {}
        }
        let enough = out.gtid_list.is_some() || h.kind == GTID_EVENT || out.events >= HEAD_EVENTS;
        Ok(if head_only && enough {
            Walk::Stop
        } else {
            Walk::Next
        })
    })?;
    if encrypted {
        out.last = None;
        runs = None;
    }
    out.runs = runs.map(RunBuilder::finish);
    Ok(out)
}

/// The time of the GTID event of `gtid` in the file, when it holds it.
///
/// # Errors
/// As [`summary`].
pub fn gtid_time(f: &mut (impl Read + Seek), gtid: Gtid) -> Result<Option<Timestamp>, BinlogError> {
    let mut found = None;
    walk(f, |h, f| {
        if h.kind == START_ENCRYPTION_EVENT {
            return Ok(Walk::Stop);
        }
        if h.kind == GTID_EVENT && h.server == gtid.server && read_gtid(f, h)? == Some(gtid) {
            found = Timestamp::from_second(i64::from(h.ts)).ok();
            return Ok(Walk::Stop);
        }
        Ok(Walk::Next)
    })?;
    Ok(found)
}

/// The time of the last transaction a replay of this file applies: the newest GTID event
/// stamped before `stop` (`mariadb-binlog --stop-datetime`, which ends at the first event
/// at or after it) and, with `until` (`--stop-position`, a switch), within it in its
/// domain. `None` when the file holds none (or its events are encrypted).
///
/// # Errors
/// As [`summary`].
pub fn last_applied(
    f: &mut (impl Read + Seek),
    stop: Timestamp,
    until: Option<&GtidPos>,
) -> Result<Option<Timestamp>, BinlogError> {
    Ok(applied(f, stop, until)?.last_at)
}

/// What a replay of one file applies (as [`last_applied`] reads it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// The time of its last transaction applied.
    pub last_at: Option<Timestamp>,
    /// Every transaction applied, as a position: per domain, the furthest.
    pub position: GtidPos,
    /// It met an event at or after `stop`: the replay ends there, later files included.
    pub stopped: bool,
}

/// What a replay of this file applies: the transactions before `stop` and within `until`.
///
/// # Errors
/// As [`summary`].
pub fn applied(
    f: &mut (impl Read + Seek),
    stop: Timestamp,
    until: Option<&GtidPos>,
) -> Result<Applied, BinlogError> {
    let mut out = Applied::default();
    walk(f, |h, f| {
        if h.kind == START_ENCRYPTION_EVENT {
            return Ok(Walk::Stop);
        }
        if h.kind != GTID_EVENT {
            return Ok(Walk::Next);
        }
        let at = (h.ts != 0)
            .then(|| Timestamp::from_second(i64::from(h.ts)).ok())
            .flatten();
        if at.is_some_and(|t| t >= stop) {
            out.stopped = true;
            return Ok(Walk::Stop);
        }
        let Some(g) = read_gtid(f, h)? else {
            return Ok(Walk::Next);
        };
        if until.is_some_and(|u| u.get(g.domain).is_none_or(|last| g.seq > last.seq)) {
            return Ok(Walk::Next);
        }
        out.position.advance(g);
        out.last_at = out.last_at.max(at);
        Ok(Walk::Next)
    })?;
    Ok(out)
}

/// Reads a `Gtid_list` event's body (a count, then domain, server and sequence per entry)
/// as a position; `None` when it is malformed or too long to be real.
pub(crate) fn read_gtid_list(f: &mut impl Read, body: u64) -> Result<Option<GtidPos>, BinlogError> {
    let mut head = [0u8; 4];
    if body < 4 || read_full(f, &mut head)? < 4 {
        return Ok(None);
    }
    // The low 28 bits count; the high 4 are flags.
    let count = (u32::from_le_bytes(head) & 0x0fff_ffff) as usize;
    if count > MAX_GTID_LIST || body < 4 + 16 * count as u64 {
        return Ok(None);
    }
    let mut bytes = vec![0u8; 16 * count];
    if read_full(f, &mut bytes)? < bytes.len() {
        return Ok(None);
    }
    let state = bytes.chunks_exact(16).map(|c| {
        Gtid::new(
            u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            u64::from_le_bytes([c[8], c[9], c[10], c[11], c[12], c[13], c[14], c[15]]),
        )
    });
    Ok(Some(GtidPos::from_state(state)))
}

pub(crate) fn read_full(f: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Builds a binlog with events at the given times (tests, benchmarks, examples): a format
/// description event, one query-like event per time, and a rotate event.
pub fn synthetic(times: &[i64], body: usize) -> Vec<u8> {
    let events: Vec<(i64, Option<Gtid>)> = times.iter().map(|&t| (t, None)).collect();
    synthetic_gtid(1, None, &events, body)
}

/// Appends one event to a binlog being built (tests, benchmarks): the header, `payload`,
/// then `pad` zero bytes (a body's rest, or a checksum's place).
pub(crate) fn write_event(
    out: &mut Vec<u8>,
    ts: i64,
    kind: u8,
    server: u32,
    payload: &[u8],
    pad: usize,
) {
    let size = (HEADER + payload.len() + pad) as u32;
    let next = out.len() as u32 + size;
    out.extend_from_slice(&(ts as u32).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(&server.to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&next.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(payload);
    out.extend(std::iter::repeat_n(0u8, pad));
}

/// [`synthetic`] as server `server_id` writes it with GTIDs: a `Gtid_list` of `start`
/// (when given) after the format description, and before each event with a GTID a GTID
/// event (its server id the GTID's).
pub fn synthetic_gtid(
    server_id: u32,
    start: Option<&[Gtid]>,
    events: &[(i64, Option<Gtid>)],
    body: usize,
) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    let event = write_event;
    let first = events.first().map_or(0, |e| e.0);
    event(
        &mut out,
        first,
        FORMAT_DESCRIPTION_EVENT,
        server_id,
        &[],
        100,
    );
    if let Some(start) = start {
        let mut list = (start.len() as u32).to_le_bytes().to_vec();
        for g in start {
            list.extend_from_slice(&g.domain.to_le_bytes());
            list.extend_from_slice(&g.server.to_le_bytes());
            list.extend_from_slice(&g.seq.to_le_bytes());
        }
        event(&mut out, first, GTID_LIST_EVENT, server_id, &list, 4);
    }
    for &(t, g) in events {
        if let Some(g) = g {
            let mut b = g.seq.to_le_bytes().to_vec();
            b.extend_from_slice(&g.domain.to_le_bytes());
            b.push(0);
            event(&mut out, t, GTID_EVENT, g.server, &b, 4);
        }
        event(&mut out, t, 2, g.map_or(server_id, |g| g.server), &[], body); // QUERY_EVENT
    }
    event(&mut out, 0, 4, server_id, &[], 24); // ROTATE_EVENT (timestamp 0, as a fake rotate may carry)
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Cursor;

    #[test]
    fn first_and_last_event_times() {
        let b = synthetic(&[1_763_600_000, 1_763_600_100, 1_763_600_050], 40);
        let t = summary(&mut Cursor::new(b)).unwrap();
        assert_eq!(t.first.unwrap().as_second(), 1_763_600_000);
        assert_eq!(t.last.unwrap().as_second(), 1_763_600_100);
        assert_eq!(t.events, 5);
        assert!(!t.truncated);
    }

    #[test]
    fn truncated_and_foreign_files() {
        let mut b = synthetic(&[1_763_600_000], 40);
        b.truncate(b.len() - 10);
        let t = summary(&mut Cursor::new(b)).unwrap();
        assert!(t.truncated);
        assert!(matches!(
            summary(&mut Cursor::new(b"hello world".to_vec())),
            Err(BinlogError::NotBinlog)
        ));
        let mut bad = MAGIC.to_vec();
        bad.extend_from_slice(&[0u8; 19]);
        assert!(matches!(
            summary(&mut Cursor::new(bad)),
            Err(BinlogError::BadEvent {
                position: 4,
                size: 0
            })
        ));
    }

    #[test]
    fn the_writer_and_gtids_of_a_replicas_file() {
        // A replica (server 2) wrote this file: its own format description, a Gtid_list,
        // a replicated transaction of server 1, then its own after a promotion.
        let b = synthetic_gtid(
            2,
            Some(&[Gtid::new(0, 1, 9)]),
            &[
                (1_763_600_000, Some(Gtid::new(0, 1, 10))),
                (1_763_600_010, Some(Gtid::new(0, 2, 11))),
                (1_763_600_020, Some(Gtid::new(0, 2, 12))),
            ],
            40,
        );
        let t = summary(&mut Cursor::new(b.clone())).unwrap();
        assert_eq!(t.server_id, Some(2));
        assert_eq!(t.gtid_list.as_ref().unwrap().to_string(), "0-1-9");
        let g = t.gtids().unwrap();
        assert_eq!(
            tidemark_core::gtid::runs_text(&g.runs),
            "0-1-10, 0-2-11..12"
        );
        assert_eq!(g.end().to_string(), "0-2-12");
        assert_eq!(
            gtid_time(&mut Cursor::new(b.clone()), Gtid::new(0, 2, 11))
                .unwrap()
                .map(|t| t.as_second()),
            Some(1_763_600_010)
        );
        assert_eq!(
            gtid_time(&mut Cursor::new(b.clone()), Gtid::new(0, 1, 11)).unwrap(),
            None
        );
        // A Gtid_list that claims more entries than its event holds is not believed.
        let mut bad = synthetic_gtid(3, Some(&[Gtid::new(0, 1, 9)]), &[], 8);
        let at = 4 + HEADER + 100 + HEADER; // the Gtid_list's body
        bad[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        let t = summary(&mut Cursor::new(bad)).unwrap();
        assert_eq!(
            (t.server_id, t.gtid_list.clone(), t.gtids()),
            (Some(3), None, None)
        );
    }

    #[test]
    fn the_last_transaction_a_replay_applies() {
        let at = |t: i64| Timestamp::from_second(t).unwrap();
        let b = synthetic_gtid(
            1,
            Some(&[Gtid::new(0, 1, 9)]),
            &[
                (1_763_600_000, Some(Gtid::new(0, 1, 10))),
                (1_763_600_010, Some(Gtid::new(0, 1, 11))),
                (1_763_600_020, Some(Gtid::new(0, 1, 12))),
            ],
            40,
        );
        let last = |stop: i64, until: Option<&str>| {
            let until = until.map(|u| GtidPos::parse(u).unwrap());
            last_applied(&mut Cursor::new(b.clone()), at(stop), until.as_ref())
                .unwrap()
                .map(|t| t.as_second())
        };
        // --stop-datetime ends at the first event at or after it.
        assert_eq!(last(1_763_600_021, None), Some(1_763_600_020));
        assert_eq!(last(1_763_600_020, None), Some(1_763_600_010));
        assert_eq!(last(1_763_600_000, None), None);
        // --stop-position at a switch: what follows it in its domain is not applied.
        assert_eq!(last(1_763_600_021, Some("0-1-11")), Some(1_763_600_010));
        assert_eq!(last(1_763_600_021, Some("1-1-50")), None);
    }
}
