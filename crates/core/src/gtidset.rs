//! MySQL's GTID sets (issue 47): a server's history as `source_uuid:intervals`, e.g.
//! `3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100:200,4f22fa47-…:1-7` — what
//! `gtid_executed`, a binlog file's `Previous_gtids` and `mysqlbinlog --exclude-gtids` speak.
//! MariaDB's positions (`domain-server-seq`) are [`crate::gtid`]'s.
//!
//! A set is kept normal: uuids in order, each one's intervals inclusive, sorted, disjoint and
//! not adjacent, so two sets of the same GTIDs are equal and print the same. MySQL 8.4's
//! tagged GTIDs (`uuid:tag:n`) are refused by name, not read as another uuid's.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Most uuids a parsed set may name (a real history names one per server that ever wrote).
pub const MAX_UUIDS: usize = 4096;
/// Most intervals a parsed set may hold in all.
pub const MAX_INTERVALS: usize = 65_536;

/// A server's uuid, as MySQL names it in GTIDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    /// Reads `8-4-4-4-12` hexadecimal digits (either case).
    ///
    /// # Errors
    /// Not that form.
    pub fn parse(text: &str) -> Result<Self, GtidSetError> {
        let groups: Vec<&str> = text.split('-').collect();
        let shape = groups.iter().map(|g| g.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12];
        let digits: String = groups.concat();
        let mut out = [0u8; 16];
        if !shape
            || !digits.bytes().all(|b| b.is_ascii_hexdigit())
            || hex_into(&digits, &mut out).is_none()
        {
            return Err(GtidSetError::Uuid(text.chars().take(64).collect()));
        }
        Ok(Uuid(out))
    }
}

fn hex_into(digits: &str, out: &mut [u8; 16]) -> Option<()> {
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(digits.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(())
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Why a GTID set's text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GtidSetError {
    #[error(
        "{0:?} is not a server uuid; expected 8-4-4-4-12 hexadecimal digits, e.g. 3e11fa47-71ca-11e1-9e33-c80aa9429562"
    )]
    Uuid(String),
    #[error("{0:?} is not an interval; expected N or N-M with 1 <= N <= M, e.g. 1-100")]
    Interval(String),
    #[error("{0:?} names a tagged GTID (uuid:tag:N, MySQL 8.4+), which Tidemark does not read yet")]
    Tagged(String),
    #[error("a GTID set of more than {MAX_UUIDS} uuids or {MAX_INTERVALS} intervals")]
    TooLarge,
}

/// A set of MySQL GTIDs, normal (see the module's text).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GtidSet(BTreeMap<Uuid, Vec<(u64, u64)>>);

impl GtidSet {
    /// Reads `uuid:1-5:7,uuid2:1-3` as MySQL prints it (spaces and line breaks between
    /// parts allowed; the empty text is the empty set).
    ///
    /// # Errors
    /// A malformed uuid or interval, a tagged GTID, or more than the bounds.
    pub fn parse(text: &str) -> Result<Self, GtidSetError> {
        let mut set = GtidSet::default();
        let mut intervals = 0usize;
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut pieces = part.split(':');
            let uuid = Uuid::parse(pieces.next().unwrap_or_default().trim())?;
            for piece in pieces {
                let piece = piece.trim();
                if piece.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                    return Err(GtidSetError::Tagged(part.chars().take(80).collect()));
                }
                let bad = || GtidSetError::Interval(piece.chars().take(64).collect());
                let (a, b) = match piece.split_once('-') {
                    Some((a, b)) => (a.parse::<u64>(), b.parse::<u64>()),
                    None => (piece.parse::<u64>(), piece.parse::<u64>()),
                };
                let (a, b) = (a.map_err(|_| bad())?, b.map_err(|_| bad())?);
                if a == 0 || b < a {
                    return Err(bad());
                }
                intervals += 1;
                if intervals > MAX_INTERVALS {
                    return Err(GtidSetError::TooLarge);
                }
                set.insert(uuid, a, b);
            }
            if set.0.len() > MAX_UUIDS {
                return Err(GtidSetError::TooLarge);
            }
        }
        Ok(set)
    }

    /// Adds `uuid:first-last` (inclusive; nothing when `last < first`).
    pub fn insert(&mut self, uuid: Uuid, first: u64, last: u64) {
        if last < first {
            return;
        }
        let list = self.0.entry(uuid).or_default();
        list.push((first, last));
        list.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(list.len());
        for &(a, b) in list.iter() {
            match merged.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        *list = merged;
    }

    /// Every GTID of both.
    #[must_use]
    pub fn union(&self, other: &GtidSet) -> GtidSet {
        let mut out = self.clone();
        for (uuid, intervals) in &other.0 {
            for &(a, b) in intervals {
                out.insert(*uuid, a, b);
            }
        }
        out
    }

    /// The GTIDs of this set that `other` lacks (what a history misses of another).
    #[must_use]
    pub fn difference(&self, other: &GtidSet) -> GtidSet {
        let mut out = GtidSet::default();
        for (uuid, intervals) in &self.0 {
            let holes = other.0.get(uuid).map_or(&[][..], Vec::as_slice);
            for &(a, b) in intervals {
                let mut from = a;
                for &(c, d) in holes {
                    if d < from || c > b {
                        continue;
                    }
                    if c > from {
                        out.insert(*uuid, from, c - 1);
                    }
                    from = d.saturating_add(1);
                    if d >= b {
                        break;
                    }
                }
                if from <= b && from >= a {
                    out.insert(*uuid, from, b);
                }
            }
        }
        out
    }

    /// Whether every GTID of this set is in `other`.
    pub fn is_subset(&self, other: &GtidSet) -> bool {
        self.difference(other).is_empty()
    }

    /// Whether it holds `uuid:n`.
    pub fn contains(&self, uuid: &Uuid, n: u64) -> bool {
        self.0
            .get(uuid)
            .is_some_and(|list| list.iter().any(|&(a, b)| a <= n && n <= b))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many GTIDs it holds.
    pub fn count(&self) -> u64 {
        self.0
            .values()
            .flatten()
            .map(|&(a, b)| b - a + 1)
            .fold(0u64, u64::saturating_add)
    }

    /// Each uuid with its intervals, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&Uuid, &[(u64, u64)])> {
        self.0.iter().map(|(u, l)| (u, l.as_slice()))
    }
}

impl fmt::Display for GtidSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (uuid, intervals)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{uuid}")?;
            for &(a, b) in intervals {
                if a == b {
                    write!(f, ":{a}")?;
                } else {
                    write!(f, ":{a}-{b}")?;
                }
            }
        }
        Ok(())
    }
}

impl Serialize for GtidSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GtidSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        GtidSet::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    const A: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    const B: &str = "4f22fa47-71ca-11e1-9e33-c80aa9429562";

    /// As MySQL prints it (a line break after each comma, parts in any order, adjacent
    /// intervals apart) it reads to the normal set, which prints the normal text.
    #[test]
    fn reads_and_prints_what_mysql_writes() {
        let set = GtidSet::parse(&format!("{B}:1-3,\n{A}:7:1-5:6, ")).unwrap();
        assert_eq!(set.to_string(), format!("{A}:1-7,{B}:1-3"));
        assert_eq!(set.count(), 10);
        assert!(set.contains(&Uuid::parse(A).unwrap(), 7));
        assert!(!set.contains(&Uuid::parse(B).unwrap(), 4));
        assert_eq!(GtidSet::parse("").unwrap(), GtidSet::default());
        let upper = GtidSet::parse(&format!("{}:1", A.to_uppercase())).unwrap();
        assert_eq!(upper.to_string(), format!("{A}:1"));
        let json = serde_json::to_string(&set).unwrap();
        assert_eq!(serde_json::from_str::<GtidSet>(&json).unwrap(), set);
    }

    /// Each malformed part is refused with what it was and the accepted form.
    #[test]
    fn refuses_what_is_not_a_set() {
        for (text, says) in [
            ("3e11fa47:1-5", "not a server uuid"),
            (&format!("{A}:0-5") as &str, "not an interval"),
            (&format!("{A}:5-1"), "not an interval"),
            (&format!("{A}:x"), "tagged GTID"),
            (&format!("{A}:tag1:7"), "tagged GTID"),
            (&format!("{A}:1-"), "not an interval"),
            (&format!("{A}:18446744073709551616"), "not an interval"),
        ] {
            let e = GtidSet::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
        let many: Vec<String> = (0..=MAX_INTERVALS)
            .map(|i| format!("{}", 2 * i + 1))
            .collect();
        assert_eq!(
            GtidSet::parse(&format!("{A}:{}", many.join(":"))),
            Err(GtidSetError::TooLarge)
        );
    }

    fn arbitrary_set() -> impl Strategy<Value = GtidSet> {
        proptest::collection::vec((0u8..3, 1u64..60, 0u64..8), 0..12).prop_map(|parts| {
            let mut set = GtidSet::default();
            for (u, a, len) in parts {
                set.insert(Uuid([u; 16]), a, a + len);
            }
            set
        })
    }

    /// Membership of each GTID, checked one by one against the set operations.
    fn members(set: &GtidSet) -> std::collections::BTreeSet<(u8, u64)> {
        (0u8..3)
            .flat_map(|u| (1u64..70).map(move |n| (u, n)))
            .filter(|(u, n)| set.contains(&Uuid([*u; 16]), *n))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The operations are the set operations on the GTIDs they hold, and the text
        /// reads back to the same set. Mutation tried: `difference` keeping a hole's first
        /// GTID (`c - 1` as `c`) — fails.
        #[test]
        fn operations_are_those_of_sets(a in arbitrary_set(), b in arbitrary_set()) {
            let (ma, mb) = (members(&a), members(&b));
            prop_assert_eq!(members(&a.union(&b)), ma.union(&mb).copied().collect());
            prop_assert_eq!(members(&a.difference(&b)), ma.difference(&mb).copied().collect());
            prop_assert_eq!(a.is_subset(&b), ma.is_subset(&mb));
            prop_assert_eq!(a.count(), ma.len() as u64);
            prop_assert_eq!(GtidSet::parse(&a.to_string()).unwrap(), a.clone());
            // Normal: the same GTIDs, built another way, are equal.
            let mut rebuilt = GtidSet::default();
            for (u, n) in &ma {
                rebuilt.insert(Uuid([*u; 16]), *n, *n);
            }
            prop_assert_eq!(rebuilt, a);
        }
    }
}
