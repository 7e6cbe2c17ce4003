//! MySQL's GTIDs in a binary log file (issue 47): what the archive will key MySQL's
//! segments by. A MySQL GTID is `source_uuid:number` (MySQL 8.4 adds `source_uuid:tag:number`),
//! and a server's history a set of them, `uuid:1-100,uuid2:1-7`.
//!
//! The file is the same format v4 as MariaDB's ([`crate::binlog`] walks its headers); its
//! GTID events are MySQL's own, checked against files the real MySQL 9.7 wrote:
//! - `Previous_gtids` (type 35), at the file's start: the set executed before it. Untagged,
//!   its body is the count of uuids (u64), then for each the uuid (16 bytes), the count of
//!   intervals (u64) and each interval as start and end (u64 each, the end exclusive).
//!   When the set holds a tagged GTID the count's first and last bytes are 1 (the tagged
//!   encoding), which is not read here.
//! - `Gtid` (type 33), before each transaction: flags (u8), the uuid (16 bytes), the number
//!   (u64).
//! - `Gtid_tagged` (type 42), before a transaction with a tagged GTID: not read here.
//!
//! A file with a tagged GTID is read as one whose GTIDs are unknown (`None`), never as one
//! without them; all numbers are little-endian, and a count past the event's size is
//! refused the same way.

use std::io::{Read, Seek};

use crate::binlog::{BinlogError, Header, Walk, read_full, walk};

const FORMAT_DESCRIPTION_EVENT: u8 = 15;
const GTID_LOG_EVENT: u8 = 33;
const ANONYMOUS_GTID_LOG_EVENT: u8 = 34;
const PREVIOUS_GTIDS_LOG_EVENT: u8 = 35;
const GTID_TAGGED_LOG_EVENT: u8 = 42;
/// Most uuids and intervals a `Previous_gtids` may hold before the file is taken as
/// unreadable by GTID: the bounds of a parsed set.
const MAX_UUIDS: u64 = tidemark_core::gtidset::MAX_UUIDS as u64;
const MAX_INTERVALS: u64 = tidemark_core::gtidset::MAX_INTERVALS as u64;
/// Most runs recorded for one file (as [`crate::binlog::MAX_RUNS`]).
const MAX_RUNS: usize = crate::binlog::MAX_RUNS;

pub use tidemark_core::gtidset::{GtidSet, Uuid};

/// One uuid's transactions `first..=last`, in the order the file holds them, and the
/// server that wrote them (their events' server id: a replica keeps its primary's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub uuid: Uuid,
    pub first: u64,
    pub last: u64,
    pub server: u32,
}

/// What a MySQL binlog file says of its GTIDs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MySqlGtids {
    /// The server that wrote the file (its format description's server id).
    pub server_id: Option<u32>,
    /// The set executed before the file; `None` without a readable one.
    pub previous: Option<GtidSet>,
    /// Its transactions, in order; `None` when they cannot all be read (a tagged GTID, an
    /// anonymous transaction, a malformed event, more than [`MAX_RUNS`] runs).
    pub runs: Option<Vec<Run>>,
}

impl MySqlGtids {
    /// The transactions the file holds, as a set; `None` when they cannot all be read.
    pub fn held(&self) -> Option<GtidSet> {
        let runs = self.runs.as_ref()?;
        let mut set = GtidSet::default();
        for r in runs {
            set.insert(r.uuid, r.first, r.last);
        }
        Some(set)
    }

    /// What the server had executed when the file ended: its previous set and its own
    /// transactions; `None` when either is unknown.
    pub fn through(&self) -> Option<GtidSet> {
        Some(self.previous.as_ref()?.union(&self.held()?))
    }
}

/// Reads the GTIDs of a MySQL binlog file.
///
/// # Errors
/// Not a binlog; a corrupt event header; an I/O error.
pub fn gtids(f: &mut (impl Read + Seek)) -> Result<MySqlGtids, BinlogError> {
    let mut out = MySqlGtids::default();
    let mut runs: Option<Vec<Run>> = Some(Vec::new());
    walk(f, |h: &Header, f| {
        match h.kind {
            FORMAT_DESCRIPTION_EVENT => {
                out.server_id.get_or_insert(h.server);
            }
            PREVIOUS_GTIDS_LOG_EVENT if out.previous.is_none() => {
                out.previous = read_previous(f, h.body)?;
            }
            GTID_LOG_EVENT => match read_gtid(f, h.body)? {
                None => runs = None,
                Some((uuid, number)) => {
                    if let Some(r) = runs.as_mut() {
                        match r.last_mut() {
                            Some(last)
                                if last.uuid == uuid
                                    && last.server == h.server
                                    && last.last.checked_add(1) == Some(number) =>
                            {
                                last.last = number;
                            }
                            _ => r.push(Run {
                                uuid,
                                first: number,
                                last: number,
                                server: h.server,
                            }),
                        }
                        if r.len() > MAX_RUNS {
                            runs = None;
                        }
                    }
                }
            },
            GTID_TAGGED_LOG_EVENT | ANONYMOUS_GTID_LOG_EVENT => runs = None,
            _ => {}
        }
        Ok(Walk::Next)
    })?;
    out.runs = runs;
    Ok(out)
}

/// Whether the file is MySQL's: a `Previous_gtids` event among its first events (read up
/// to it only, so a file still being written, or torn at its end, answers too).
///
/// # Errors
/// Not a binlog; a corrupt event header before it; an I/O error.
pub fn is_mysql(f: &mut (impl Read + Seek)) -> Result<bool, BinlogError> {
    let mut found = false;
    let mut seen = 0;
    walk(f, |h: &Header, _| {
        seen += 1;
        found = h.kind == PREVIOUS_GTIDS_LOG_EVENT;
        Ok(if found || seen >= 4 {
            Walk::Stop
        } else {
            Walk::Next
        })
    })?;
    Ok(found)
}

/// The time of the last transaction a replay of this file applies — stamped before `stop`
/// and not in `skip` (what the data already holds, or excluded) — and whether the file
/// holds an event at or after `stop` (where `mysqlbinlog --stop-datetime` ends the whole
/// replay). `None`: none.
///
/// # Errors
/// As [`gtids`].
pub fn last_applied(
    f: &mut (impl Read + Seek),
    stop: jiff::Timestamp,
    skip: &GtidSet,
) -> Result<(Option<jiff::Timestamp>, bool), BinlogError> {
    let mut last = None;
    let mut stopped = false;
    walk(f, |h: &Header, f| {
        let at = jiff::Timestamp::from_second(i64::from(h.ts)).ok();
        if h.ts != 0 && at.is_none_or(|t| t >= stop) {
            stopped = true;
            return Ok(Walk::Stop);
        }
        if h.kind != GTID_LOG_EVENT {
            return Ok(Walk::Next);
        }
        if let Some((uuid, n)) = read_gtid(f, h.body)?
            && !skip.contains(&uuid, n)
        {
            last = last.max(at);
        }
        Ok(Walk::Next)
    })?;
    Ok((last, stopped))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A Gtid event's uuid and number.
fn read_gtid(f: &mut impl Read, body: u64) -> Result<Option<(Uuid, u64)>, BinlogError> {
    let mut b = [0u8; 25];
    if body < 25 || read_full(f, &mut b)? < 25 {
        return Ok(None);
    }
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&b[1..17]);
    let number = u64_at(&b, 17).unwrap_or(0);
    Ok((number > 0).then_some((Uuid(uuid), number)))
}

/// A `Previous_gtids` body (untagged encoding), each interval made inclusive.
fn read_previous(f: &mut impl Read, body: u64) -> Result<Option<GtidSet>, BinlogError> {
    let mut head = [0u8; 8];
    if body < 8 || read_full(f, &mut head)? < 8 {
        return Ok(None);
    }
    // The tagged encoding marks its count's first and last bytes.
    if head[7] != 0 {
        return Ok(None);
    }
    let uuids = u64::from_le_bytes(head);
    let mut left = body - 8;
    if uuids > MAX_UUIDS {
        return Ok(None);
    }
    let mut set = GtidSet::default();
    for _ in 0..uuids {
        let mut sid = [0u8; 24];
        if left < 24 || read_full(f, &mut sid)? < 24 {
            return Ok(None);
        }
        left -= 24;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&sid[..16]);
        let n = u64_at(&sid, 16).unwrap_or(u64::MAX);
        if n > MAX_INTERVALS || left < 16 * n {
            return Ok(None);
        }
        left -= 16 * n;
        for _ in 0..n {
            let mut iv = [0u8; 16];
            if read_full(f, &mut iv)? < 16 {
                return Ok(None);
            }
            let (start, end) = (u64_at(&iv, 0).unwrap_or(0), u64_at(&iv, 8).unwrap_or(0));
            if start == 0 || end <= start {
                return Ok(None);
            }
            set.insert(Uuid(uuid), start, end - 1);
        }
    }
    Ok(Some(set))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A binlog of the given events (type, body), each with a 19-byte header.
    fn file(events: &[(u8, Vec<u8>)]) -> std::io::Cursor<Vec<u8>> {
        let mut out = vec![0xfe, b'b', b'i', b'n'];
        let mut all = vec![(FORMAT_DESCRIPTION_EVENT, vec![0u8; 10])];
        all.extend(events.iter().cloned());
        for (kind, body) in all {
            let size = u32::try_from(19 + body.len()).unwrap();
            let next = u32::try_from(out.len()).unwrap() + size;
            out.extend(1_700_000_000u32.to_le_bytes());
            out.push(kind);
            out.extend(7u32.to_le_bytes());
            out.extend(size.to_le_bytes());
            out.extend(next.to_le_bytes());
            out.extend(0u16.to_le_bytes());
            out.extend(body);
        }
        std::io::Cursor::new(out)
    }

    fn gtid(uuid: u8, number: u64) -> (u8, Vec<u8>) {
        let mut body = vec![0u8];
        body.extend([uuid; 16]);
        body.extend(number.to_le_bytes());
        (GTID_LOG_EVENT, body)
    }

    fn previous(count: u64, sets: &[(u8, &[(u64, u64)])]) -> (u8, Vec<u8>) {
        let mut body = count.to_le_bytes().to_vec();
        for (uuid, intervals) in sets {
            body.extend([*uuid; 16]);
            body.extend((intervals.len() as u64).to_le_bytes());
            for (a, b) in *intervals {
                body.extend(a.to_le_bytes());
                body.extend(b.to_le_bytes());
            }
        }
        (PREVIOUS_GTIDS_LOG_EVENT, body)
    }

    /// Runs follow the order of the file: consecutive numbers of one uuid join, another
    /// uuid or a gap starts a new run; intervals are read end-exclusive.
    #[test]
    fn runs_and_the_previous_set() {
        let read = gtids(&mut file(&[
            previous(1, &[(0xaa, &[(1, 4), (6, 8)])]),
            gtid(0xaa, 8),
            gtid(0xaa, 9),
            gtid(0xbb, 1),
            gtid(0xaa, 11),
        ]))
        .unwrap();
        assert_eq!(read.server_id, Some(7));
        let a = Uuid([0xaa; 16]);
        let b = Uuid([0xbb; 16]);
        let mut expected = GtidSet::default();
        expected.insert(a, 1, 3);
        expected.insert(a, 6, 7);
        assert_eq!(read.previous, Some(expected));
        assert_eq!(
            read.runs,
            Some(vec![
                Run {
                    uuid: a,
                    first: 8,
                    last: 9,
                    server: 7,
                },
                Run {
                    uuid: b,
                    first: 1,
                    last: 1,
                    server: 7,
                },
                Run {
                    uuid: a,
                    first: 11,
                    last: 11,
                    server: 7,
                },
            ])
        );
        assert_eq!(
            read.previous.unwrap().to_string(),
            "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa:1-3:6-7"
        );
    }

    /// Counts a hostile writer inflates, intervals that end before they start, a cut Gtid
    /// event, a tagged or anonymous transaction: unknown (`None`), never a wrong set and
    /// never a large allocation.
    #[test]
    fn a_forged_or_foreign_event_makes_the_gtids_unknown() {
        let unknown_previous = [
            previous(1 << 40, &[]),
            previous(1, &[]),
            {
                let (k, mut body) = previous(1, &[(0xaa, &[])]);
                body[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
                (k, body)
            },
            previous(1, &[(0xaa, &[(5, 5)])]),
            previous(1, &[(0xaa, &[(0, 3)])]),
            // The tagged encoding.
            (PREVIOUS_GTIDS_LOG_EVENT, vec![1, 1, 0, 0, 0, 0, 0, 1]),
        ];
        for event in unknown_previous {
            let read = gtids(&mut file(std::slice::from_ref(&event))).unwrap();
            assert_eq!(read.previous, None, "{event:?}");
        }
        let cut = (GTID_LOG_EVENT, vec![0u8; 20]);
        for event in [
            cut,
            gtid(0xaa, 0),
            (GTID_TAGGED_LOG_EVENT, vec![2, 0x84]),
            (ANONYMOUS_GTID_LOG_EVENT, vec![0u8; 25]),
        ] {
            let read = gtids(&mut file(&[gtid(0xaa, 1), event.clone()])).unwrap();
            assert_eq!(read.runs, None, "{event:?}");
        }
    }
}
