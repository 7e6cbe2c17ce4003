//! Event times of a MariaDB/MySQL binary log file, read from its event headers.
//!
//! A binlog (format v4) starts with the magic `\xfebin`; each event starts with a 19-byte
//! header: timestamp (u32, seconds since the epoch), type (u8), server id (u32), event
//! size (u32, header included), next position (u32), flags (u16), all little-endian. Only
//! the headers are read, seeking over bodies, so a 1 GiB file costs a few thousand reads.

use std::io::{Read, Seek, SeekFrom};

use jiff::Timestamp;

const MAGIC: [u8; 4] = [0xfe, b'b', b'i', b'n'];
const HEADER: usize = 19;
/// MariaDB's START_ENCRYPTION_EVENT: the events after it are encrypted.
const START_ENCRYPTION_EVENT: u8 = 164;

/// What the headers say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventTimes {
    /// The first event's time (the format description, written when the file was opened).
    pub first: Option<Timestamp>,
    /// The latest event time; `None` when it cannot be known (encrypted events follow).
    pub last: Option<Timestamp>,
    pub events: u64,
    /// The file ends inside an event (still being written, or cut short).
    pub truncated: bool,
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

/// Reads the event times of a binlog file.
///
/// # Errors
/// Not a binlog; a corrupt event header; an I/O error.
pub fn event_times(f: &mut (impl Read + Seek)) -> Result<EventTimes, BinlogError> {
    let len = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    let mut magic = [0u8; 4];
    if read_full(f, &mut magic)? < 4 || magic != MAGIC {
        return Err(BinlogError::NotBinlog);
    }
    let mut out = EventTimes::default();
    let mut position: u64 = 4;
    let mut header = [0u8; HEADER];
    let mut encrypted = false;
    loop {
        let got = read_full(f, &mut header)?;
        if got == 0 {
            break;
        }
        if got < HEADER {
            out.truncated = true;
            break;
        }
        let ts = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let kind = header[4];
        let size = u32::from_le_bytes([header[9], header[10], header[11], header[12]]);
        if (size as usize) < HEADER {
            return Err(BinlogError::BadEvent { position, size });
        }
        out.events += 1;
        // Some generated events (e.g. a fake rotate) carry a zero timestamp.
        if ts != 0 {
            let t = Timestamp::from_second(i64::from(ts)).ok();
            out.first = out.first.or(t);
            out.last = out.last.max(t);
        }
        if kind == START_ENCRYPTION_EVENT {
            encrypted = true;
            break;
        }
        position += u64::from(size);
        if position > len {
            out.truncated = true;
            break;
        }
        f.seek(SeekFrom::Start(position))?;
    }
    if encrypted {
        out.last = None;
    }
    Ok(out)
}

fn read_full(f: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
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
    let mut out = MAGIC.to_vec();
    let event = |out: &mut Vec<u8>, ts: i64, kind: u8, len: usize| {
        let size = (HEADER + len) as u32;
        let next = out.len() as u32 + size;
        out.extend_from_slice(&(ts as u32).to_le_bytes());
        out.push(kind);
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&next.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend(std::iter::repeat_n(0u8, len));
    };
    let first = times.first().copied().unwrap_or(0);
    event(&mut out, first, 15, 100); // FORMAT_DESCRIPTION_EVENT
    for &t in times {
        event(&mut out, t, 2, body); // QUERY_EVENT
    }
    event(&mut out, 0, 4, 24); // ROTATE_EVENT (timestamp 0, as a fake rotate may carry)
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
        let t = event_times(&mut Cursor::new(b)).unwrap();
        assert_eq!(t.first.unwrap().as_second(), 1_763_600_000);
        assert_eq!(t.last.unwrap().as_second(), 1_763_600_100);
        assert_eq!(t.events, 5);
        assert!(!t.truncated);
    }

    #[test]
    fn truncated_and_foreign_files() {
        let mut b = synthetic(&[1_763_600_000], 40);
        b.truncate(b.len() - 10);
        let t = event_times(&mut Cursor::new(b)).unwrap();
        assert!(t.truncated);
        assert!(matches!(
            event_times(&mut Cursor::new(b"hello world".to_vec())),
            Err(BinlogError::NotBinlog)
        ));
        let mut bad = MAGIC.to_vec();
        bad.extend_from_slice(&[0u8; 19]);
        assert!(matches!(
            event_times(&mut Cursor::new(bad)),
            Err(BinlogError::BadEvent {
                position: 4,
                size: 0
            })
        ));
    }
}
