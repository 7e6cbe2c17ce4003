//! Positions in a replicated history by global transaction id (GTID), not by file and
//! offset: a file offset means something on one server only, a GTID on every server of a
//! cluster.
//!
//! # MariaDB's GTIDs
//! A GTID is `domain-server-sequence` (`0-1-4242`): the replication domain, the server that
//! wrote the transaction, and its number in the domain. A server allocates the next
//! number of a domain after the highest it holds, whoever wrote that one; so after a
//! failover the new primary continues the numbering (`0-1-100` then `0-2-101`) and a
//! transaction only the old primary had (`0-1-101`) shares a number with one of the new
//! history: the two histories branched. A *position* ([`GtidPos`]) names, per domain, the
//! last transaction applied — what `gtid_binlog_pos`, `gtid_slave_pos` and
//! `mariadb-binlog --start-position` use.
//!
//! # Other engines
//! These types are MariaDB's. MySQL's GTIDs (`source_uuid:1-100`) are sets of intervals per
//! source, without shared numbering; they would be a second position type answering the
//! same questions (does one position hold another, which transactions lie between two),
//! which is all the planner and the restore ask of a position. Stores record positions as
//! text in the engine's own syntax, so a second engine adds a parser, not a format.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One MariaDB GTID: `domain-server-sequence`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
}

/// Why a GTID or a position does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GtidError {
    #[error("{0:?} is not a GTID: expected domain-server-sequence (three numbers, e.g. 0-1-4242)")]
    Gtid(String),
    #[error(
        "{text:?} names domain {domain} twice: a position holds one GTID per domain (e.g. 0-1-4242,1-2-17)"
    )]
    DuplicateDomain { text: String, domain: u32 },
    #[error(
        "{0:?} is not a GTID run: expected domain-server-first..last (e.g. 0-1-10..42) or one GTID"
    )]
    Run(String),
}

impl Gtid {
    pub fn new(domain: u32, server: u32, seq: u64) -> Self {
        Gtid {
            domain,
            server,
            seq,
        }
    }

    /// Parses `domain-server-sequence`.
    ///
    /// # Errors
    /// Anything else (with the text and the accepted form).
    pub fn parse(text: &str) -> Result<Self, GtidError> {
        let bad = || GtidError::Gtid(text.to_owned());
        let mut parts = text.trim().split('-');
        let (Some(d), Some(s), Some(q), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let num = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        if !(num(d) && num(s) && num(q)) {
            return Err(bad());
        }
        Ok(Gtid {
            domain: d.parse().map_err(|_| bad())?,
            server: s.parse().map_err(|_| bad())?,
            seq: q.parse().map_err(|_| bad())?,
        })
    }
}

impl fmt::Display for Gtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.seq)
    }
}

/// A position: per domain, the last transaction applied. Every transaction of the domain
/// with a lower sequence number is taken as applied too (MariaDB's model of a position).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GtidPos {
    domains: BTreeMap<u32, Gtid>,
}

impl GtidPos {
    /// Parses a comma-separated list of GTIDs, one per domain (`0-1-10,1-2-5`); the empty
    /// text is the empty position (nothing applied).
    ///
    /// # Errors
    /// A GTID that does not parse, or a domain named twice.
    pub fn parse(text: &str) -> Result<Self, GtidError> {
        let mut out = GtidPos::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let g = Gtid::parse(part)?;
            if out.domains.insert(g.domain, g).is_some() {
                return Err(GtidError::DuplicateDomain {
                    text: text.to_owned(),
                    domain: g.domain,
                });
            }
        }
        Ok(out)
    }

    /// The position a binlog state stands for (`Gtid_list`, `gtid_binlog_state`: the last
    /// GTID of every domain and server): per domain, the GTID with the highest sequence.
    pub fn from_state(state: impl IntoIterator<Item = Gtid>) -> Self {
        let mut out = GtidPos::default();
        for g in state {
            out.advance(g);
        }
        out
    }

    /// Applies `g`: it becomes its domain's position unless the domain is already further.
    pub fn advance(&mut self, g: Gtid) {
        match self.domains.get(&g.domain) {
            Some(cur) if cur.seq >= g.seq => {}
            _ => {
                self.domains.insert(g.domain, g);
            }
        }
    }

    /// Each domain at the further of the two positions.
    pub fn merged(&self, other: &GtidPos) -> GtidPos {
        let mut out = self.clone();
        for g in other.domains.values() {
            out.advance(*g);
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The domain's last applied GTID.
    pub fn get(&self, domain: u32) -> Option<Gtid> {
        self.domains.get(&domain).copied()
    }

    /// The domain's last applied sequence number (0: none).
    pub fn seq(&self, domain: u32) -> u64 {
        self.domains.get(&domain).map_or(0, |g| g.seq)
    }

    pub fn gtids(&self) -> impl Iterator<Item = Gtid> + '_ {
        self.domains.values().copied()
    }

    /// Whether everything `other` applied is applied here too (by sequence, per domain).
    pub fn covers(&self, other: &GtidPos) -> bool {
        other.domains.values().all(|g| self.seq(g.domain) >= g.seq)
    }
}

impl fmt::Display for GtidPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.domains.values().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{g}")?;
        }
        Ok(())
    }
}

impl Serialize for GtidPos {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GtidPos {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        GtidPos::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Consecutive transactions of one domain written by one server, as a binlog file holds
/// them: `domain-server-first..last`. A file's runs, in order, are its history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GtidRun {
    pub domain: u32,
    pub server: u32,
    pub first: u64,
    pub last: u64,
}

impl GtidRun {
    pub fn first_gtid(&self) -> Gtid {
        Gtid::new(self.domain, self.server, self.first)
    }

    pub fn last_gtid(&self) -> Gtid {
        Gtid::new(self.domain, self.server, self.last)
    }

    /// Parses `domain-server-first..last`, or one GTID (a run of one).
    ///
    /// # Errors
    /// Anything else.
    pub fn parse(text: &str) -> Result<Self, GtidError> {
        let bad = || GtidError::Run(text.to_owned());
        let (head, last) = match text.split_once("..") {
            Some((h, l)) => (h, Some(l)),
            None => (text, None),
        };
        let g = Gtid::parse(head).map_err(|_| bad())?;
        let last = match last {
            None => g.seq,
            Some(l) if !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()) => {
                l.parse().map_err(|_| bad())?
            }
            Some(_) => return Err(bad()),
        };
        if last < g.seq {
            return Err(bad());
        }
        Ok(GtidRun {
            domain: g.domain,
            server: g.server,
            first: g.seq,
            last,
        })
    }
}

impl fmt::Display for GtidRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first_gtid())
        } else {
            write!(f, "{}..{}", self.first_gtid(), self.last)
        }
    }
}

impl Serialize for GtidRun {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GtidRun {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        GtidRun::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Builds the runs of a sequence of GTIDs (a file's transactions in order): a GTID extends
/// the current run of its domain when the same server wrote the next number; otherwise it
/// starts a new run.
#[derive(Debug, Clone, Default)]
pub struct RunBuilder {
    runs: Vec<GtidRun>,
    /// Index of each domain's open run.
    open: BTreeMap<u32, usize>,
}

impl RunBuilder {
    pub fn push(&mut self, g: Gtid) {
        if let Some(&i) = self.open.get(&g.domain) {
            let r = &mut self.runs[i];
            if r.server == g.server && r.last.checked_add(1) == Some(g.seq) {
                r.last = g.seq;
                return;
            }
        }
        self.open.insert(g.domain, self.runs.len());
        self.runs.push(GtidRun {
            domain: g.domain,
            server: g.server,
            first: g.seq,
            last: g.seq,
        });
    }

    pub fn len(&self) -> usize {
        self.runs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    pub fn finish(self) -> Vec<GtidRun> {
        self.runs
    }
}

/// The position after applying `runs` (in order) to `start`.
pub fn end_of(start: &GtidPos, runs: &[GtidRun]) -> GtidPos {
    let mut out = start.clone();
    for r in runs {
        out.advance(r.last_gtid());
    }
    out
}

/// Which server wrote sequence `seq` of `domain`, according to `runs`.
pub fn writer_of(runs: &[GtidRun], domain: u32, seq: u64) -> Option<u32> {
    runs.iter()
        .find(|r| r.domain == domain && r.first <= seq && seq <= r.last)
        .map(|r| r.server)
}

/// Whether every domain's last transaction in `pos` is one of the history that starts at
/// `base` (a file's `Gtid_list`) and continues with `runs` (its transactions, in order):
/// the same server wrote that number there. Comparing numbers alone is not enough after a
/// failover, where the old and the new primary each wrote a `0-…-15`. A number at or
/// before `base` is taken as held (the history before it is not known one by one), unless
/// it is `base`'s own number by another server; a number past the history is not held.
pub fn history_holds(base: &GtidPos, runs: &[GtidRun], pos: &GtidPos) -> bool {
    pos.gtids().all(|g| {
        if g.seq == 0 {
            return true;
        }
        if let Some(w) = writer_of(runs, g.domain, g.seq) {
            return w == g.server;
        }
        match base.get(g.domain) {
            Some(b) if g.seq == b.seq => b.server == g.server,
            Some(b) => g.seq < b.seq,
            None => false,
        }
    })
}

/// The transactions from `from` (exclusive) to `to` (inclusive), per domain, as runs
/// without a server (0): what a GTID gap is missing, for messages.
pub fn missing_between(from: &GtidPos, to: &GtidPos) -> Vec<GtidRun> {
    to.gtids()
        .filter(|g| g.seq > from.seq(g.domain))
        .map(|g| GtidRun {
            domain: g.domain,
            server: g.server,
            first: from.seq(g.domain) + 1,
            last: g.seq,
        })
        .collect()
}

/// Runs as text: `0-1-10..42, 1-2-5`.
pub fn runs_text(runs: &[GtidRun]) -> String {
    runs.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn gtids_and_positions_parse_and_print() {
        assert_eq!(Gtid::parse("0-1-4242").unwrap(), Gtid::new(0, 1, 4242));
        for bad in ["", "0-1", "0-1-2-3", "a-1-2", "0--2", "-1-2-3", "0-1-+2"] {
            let e = Gtid::parse(bad).unwrap_err();
            assert!(e.to_string().contains("domain-server-sequence"), "{e}");
        }
        let p = GtidPos::parse("1-2-5, 0-1-10").unwrap();
        assert_eq!(p.to_string(), "0-1-10,1-2-5");
        assert_eq!(p.seq(0), 10);
        assert_eq!(p.seq(7), 0);
        assert!(GtidPos::parse("").unwrap().is_empty());
        assert!(matches!(
            GtidPos::parse("0-1-10,0-2-11"),
            Err(GtidError::DuplicateDomain { domain: 0, .. })
        ));
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, "\"0-1-10,1-2-5\"");
        assert_eq!(serde_json::from_str::<GtidPos>(&json).unwrap(), p);
    }

    #[test]
    fn a_binlog_state_is_the_highest_gtid_of_each_domain() {
        let state = [Gtid::new(0, 1, 10), Gtid::new(0, 2, 12), Gtid::new(1, 3, 4)];
        let p = GtidPos::from_state(state);
        assert_eq!(p.to_string(), "0-2-12,1-3-4");
        assert!(p.covers(&GtidPos::parse("0-1-11").unwrap()));
        assert!(!p.covers(&GtidPos::parse("0-1-11,2-1-1").unwrap()));
        assert_eq!(
            p.merged(&GtidPos::parse("0-1-3,2-1-1").unwrap())
                .to_string(),
            "0-2-12,1-3-4,2-1-1"
        );
    }

    #[test]
    fn runs_follow_servers_and_numbers() {
        let mut b = RunBuilder::default();
        for g in [
            Gtid::new(0, 1, 9),
            Gtid::new(0, 1, 10),
            Gtid::new(1, 1, 3),
            Gtid::new(0, 2, 11),
            Gtid::new(0, 2, 12),
            Gtid::new(0, 2, 14), // a number skipped: a new run
        ] {
            b.push(g);
        }
        let runs = b.finish();
        assert_eq!(runs_text(&runs), "0-1-9..10, 1-1-3, 0-2-11..12, 0-2-14");
        assert_eq!(writer_of(&runs, 0, 10), Some(1));
        assert_eq!(writer_of(&runs, 0, 12), Some(2));
        assert_eq!(writer_of(&runs, 0, 13), None);
        let end = end_of(&GtidPos::parse("0-1-8").unwrap(), &runs);
        assert_eq!(end.to_string(), "0-2-14,1-1-3");
        for r in &runs {
            assert_eq!(GtidRun::parse(&r.to_string()).unwrap(), *r);
        }
        assert!(GtidRun::parse("0-1-10..9").is_err());
        assert!(GtidRun::parse("0-1-10..").is_err());
        let base = GtidPos::parse("0-1-8").unwrap();
        let history = [GtidRun::parse("0-1-9..15").unwrap()];
        assert!(history_holds(
            &base,
            &history,
            &GtidPos::parse("0-1-15").unwrap()
        ));
        assert!(history_holds(
            &base,
            &history,
            &GtidPos::parse("0-1-3").unwrap()
        ));
        // After a failover: the same number by the new primary is not the archive's.
        assert!(!history_holds(
            &base,
            &history,
            &GtidPos::parse("0-2-15").unwrap()
        ));
        assert!(!history_holds(
            &base,
            &history,
            &GtidPos::parse("0-1-16").unwrap()
        ));
        assert!(!history_holds(
            &base,
            &history,
            &GtidPos::parse("0-7-8").unwrap()
        ));
        assert!(history_holds(&base, &history, &GtidPos::default()));
        let gap = missing_between(
            &GtidPos::parse("0-1-10").unwrap(),
            &GtidPos::parse("0-1-14,1-2-2").unwrap(),
        );
        assert_eq!(runs_text(&gap), "0-1-11..14, 1-2-1..2");
    }
}
