//! Timelines: the log archive of a replicated cluster as a tree of histories.
//!
//! A *timeline* is the run of binlog segments one server wrote as primary, in its own file
//! numbering. The archive's first timeline is 0; when the primary changes (a failover, or a
//! server whose binlog started over), the archiver starts a new timeline whose *switch*
//! names the last transaction it shares with its parent. Replay along the *main line* — the
//! newest timeline and its ancestors — takes the parent's events up to the switch, then the
//! new timeline's. What the parent holds after the switch (transactions the old primary
//! wrote that never reached the new one) is a *branch*: kept while a restorable backup needs
//! it, never replayed into the main line. PostgreSQL's timeline history files are the model.
//!
//! # Archive sequences
//! A segment is identified in the archive by its *archive sequence*: on timeline 0 its
//! file's own number (`mysql-bin.000042` is 42, so stores written before timelines existed
//! read unchanged), on timeline `k` `k * TIMELINE_STRIDE + <file number>`, and its object
//! is named with that number (`mysql-bin.2000000000007` is timeline 2's `mysql-bin.000007`).
//! So two servers' `mysql-bin.000003` never share a key, and everything that identifies a
//! segment by its sequence (the index and its shards, listings, deletions) keeps working:
//! sequences are contiguous within a timeline and never between two.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use serde::Serialize;

use crate::gtid::{GtidPos, GtidRun};
use crate::inventory::Segment;
pub use crate::records::{LEGACY, SegmentGtids, Switch, Timeline};

/// Archive sequences per timeline: file numbers stay below it.
pub const TIMELINE_STRIDE: u64 = 1_000_000_000_000;
/// The highest timeline id an archive may record (every id's sequences fit in a u64).
pub const MAX_TIMELINE: u32 = 1_000_000;

/// The timeline of an archive sequence.
pub fn timeline_of(sequence: u64) -> u32 {
    u32::try_from(sequence / TIMELINE_STRIDE).unwrap_or(u32::MAX)
}

/// The file number an archive sequence stands for.
pub fn file_number(sequence: u64) -> u64 {
    sequence % TIMELINE_STRIDE
}

/// The archive sequence of file number `file` on `timeline` (`None`: a file number too
/// large to fit, or a timeline beyond the sequence space).
pub fn archive_sequence(timeline: u32, file: u64) -> Option<u64> {
    if file >= TIMELINE_STRIDE {
        return None;
    }
    u64::from(timeline)
        .checked_mul(TIMELINE_STRIDE)?
        .checked_add(file)
}

/// The object name of a server's binlog file `<base>.<digits>` on `timeline`: the file
/// name itself on timeline 0, `<base>.<archive sequence>` on later ones.
pub fn archive_name(file: &str, timeline: u32) -> Option<String> {
    let (base, digits) = file.rsplit_once('.')?;
    let number: u64 = digits.parse().ok()?;
    if timeline == 0 {
        return (number < TIMELINE_STRIDE).then(|| file.to_owned());
    }
    Some(format!("{base}.{}", archive_sequence(timeline, number)?))
}

/// One segment of the main line, in replay order.
#[derive(Debug, Clone)]
pub struct MainSegment<'a> {
    pub segment: &'a Segment,
    /// Its last event on the main line: the switch's time for the parent segment holding a
    /// switch (its later events are a branch).
    pub last_event_at: Option<Timestamp>,
    /// Whether replay continues into it from the one before without a missing event.
    pub linked: bool,
    /// The main line's switch into its timeline, on the first segment of a timeline after
    /// the first.
    pub switch_in: Option<&'a Switch>,
    /// For the parent segment holding a switch: the switch's position, where replay of
    /// this timeline stops.
    pub stop_at: Option<&'a GtidPos>,
}

impl MainSegment<'_> {
    /// What it holds by GTID, when recorded one by one (a summary stands for a shard).
    pub fn gtids(&self) -> Option<&SegmentGtids> {
        self.segment
            .gtids
            .as_deref()
            .filter(|_| !self.segment.summary)
    }
}

/// The archive's history as timelines: the main line replay follows, and what is off it.
#[derive(Debug, Clone, Default)]
pub struct History<'a> {
    /// The main line, in replay order.
    pub main: Vec<MainSegment<'a>>,
    /// Present segments off the main line: a parent's segments after its switch, and every
    /// segment of a timeline the main line does not pass through.
    pub branch: Vec<&'a Segment>,
    /// The timelines, by id (timeline 0 implied when the archive records none).
    pub timelines: Vec<Timeline>,
    /// Ids of the timelines the main line passes through, oldest first.
    pub path: Vec<u32>,
    /// Who wrote what, on the main line and off it.
    pub lineage: Lineage,
}

/// Which server wrote each transaction of the main line (per domain, runs clipped at the
/// switches, in sequence order), and the transactions off it, where segments say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lineage {
    writers: HashMap<u32, Vec<GtidRun>>,
    branch: Vec<GtidRun>,
}

impl Lineage {
    /// Whether a position lies on the main line: every domain's last transaction was
    /// written, on the main line, by the server the position names. A position the
    /// segments say nothing about (a number before the archive, or segments without GTIDs)
    /// is taken as on it.
    pub fn on_main_line(&self, pos: &GtidPos) -> bool {
        pos.gtids().all(|g| {
            let main = self.writers.get(&g.domain).and_then(|runs| {
                let k = runs.partition_point(|r| r.last < g.seq);
                runs.get(k).filter(|r| r.first <= g.seq)
            });
            match main {
                Some(r) => r.server == g.server,
                // Not a transaction of the main line's segments: off it when a branch
                // holds it.
                None => !self.branch.iter().any(|r| {
                    r.domain == g.domain
                        && r.server == g.server
                        && r.first <= g.seq
                        && g.seq <= r.last
                }),
            }
        })
    }
}

/// The runs of `runs` after `stop` (in the domains `stop` names).
fn runs_after(runs: &[GtidRun], stop: &GtidPos) -> impl Iterator<Item = GtidRun> {
    runs.iter().filter_map(move |r| {
        stop.get(r.domain)?;
        let after = stop.seq(r.domain);
        (r.last > after).then(|| GtidRun {
            first: r.first.max(after + 1),
            ..*r
        })
    })
}

impl<'a> History<'a> {
    /// The server that wrote the archive's first timeline, when recorded.
    pub fn first_writer(&self) -> Option<u32> {
        self.timelines
            .iter()
            .find(|t| t.id == 0)
            .and_then(|t| t.server_id)
    }

    /// Builds the history of the present segments (the first of two with one sequence
    /// counts) under the recorded `timelines`.
    pub fn new(segments: impl IntoIterator<Item = &'a Segment>, timelines: &'a [Timeline]) -> Self {
        let mut segs: Vec<&Segment> = segments.into_iter().filter(|s| s.present).collect();
        segs.sort_by(|a, b| (a.sequence, &a.name).cmp(&(b.sequence, &b.name)));
        segs.dedup_by_key(|s| s.sequence);
        // Ids beyond the sequence space, and parents that are not older, are not believed.
        let mut table: BTreeMap<u32, &'a Timeline> = timelines
            .iter()
            .filter(|t| t.id <= MAX_TIMELINE && t.parent.is_none_or(|p| p < t.id))
            .map(|t| (t.id, t))
            .collect();
        table.entry(0).or_insert(&LEGACY);
        // The main line ends at the newest timeline and follows parents back. A parent must
        // be older (a lower id), so a corrupt table cannot loop.
        let mut path = Vec::new();
        let mut cur = table.keys().next_back().copied();
        while let Some(id) = cur {
            path.push(id);
            cur = table
                .get(&id)
                .and_then(|t| t.parent)
                .filter(|p| *p < id && table.contains_key(p));
        }
        path.reverse();
        // A timeline's segments are one slice of the sorted segments (its sequences).
        let slice = |id: u32| {
            let lo = u64::from(id).saturating_mul(TIMELINE_STRIDE);
            let hi = lo.saturating_add(TIMELINE_STRIDE);
            segs.partition_point(|s| s.sequence < lo)..segs.partition_point(|s| s.sequence < hi)
        };
        let mut on_main = vec![false; segs.len()];
        let mut main: Vec<MainSegment<'a>> = Vec::with_capacity(segs.len());
        for (k, &id) in path.iter().enumerate() {
            let t = table[&id];
            let first = if k == 0 { None } else { t.first_sequence };
            let switch_in = if k == 0 { None } else { t.switch.as_ref() };
            let cut = path.get(k + 1).and_then(|c| table[c].switch.as_ref());
            // The parent's segments up to the one holding the switch; without a recorded
            // segment, those that began by the switch's time; without either, none (what
            // the parent holds past the switch must never be replayed).
            let within = |s: &Segment| -> bool {
                if first.is_some_and(|f| s.sequence < f) {
                    return false;
                }
                match cut {
                    None => true,
                    Some(sw) => match (sw.parent_sequence, sw.at) {
                        (Some(p), _) => s.sequence <= p,
                        (None, Some(at)) => s.first_event_at.is_none_or(|f| f <= at),
                        (None, None) => false,
                    },
                }
            };
            let mut entered = false;
            for i in slice(id) {
                let s = segs[i];
                if !within(s) {
                    continue;
                }
                let linked = match main.last() {
                    // The next file of the same binlog: numbered on, and — where both record
                    // their transactions — starting where the one before ended (a file of
                    // another binlog that took the number, or one missing between, is a
                    // gap, not a link).
                    Some(prev) if entered => {
                        s.sequence == prev.segment.last_sequence() + 1
                            && match (prev.gtids(), s.gtids.as_deref().filter(|_| !s.summary)) {
                                (Some(p), Some(n)) => p.end().covers(&n.start),
                                _ => true,
                            }
                    }
                    // Into a timeline: its first recorded segment, from a parent segment
                    // holding the switch, with nothing missing in between.
                    Some(prev) => {
                        let reached = k > 0
                            && timeline_of(prev.segment.sequence) == path[k - 1]
                            && switch_in.is_some_and(|sw| {
                                sw.missing.is_empty()
                                    && !sw.unrelated
                                    && sw.parent_sequence.is_none_or(|p| {
                                        prev.segment.sequence <= p
                                            && p <= prev.segment.last_sequence()
                                    })
                            });
                        reached && t.first_sequence == Some(s.sequence)
                    }
                    None => false,
                };
                let stop_here = cut.filter(|sw| {
                    sw.parent_sequence
                        .is_some_and(|p| s.sequence <= p && p <= s.last_sequence())
                });
                let last_event_at = match stop_here.and_then(|sw| sw.at) {
                    Some(at) => s.last_event_at.map(|l| l.min(at)).or(Some(at)),
                    None => s.last_event_at,
                };
                main.push(MainSegment {
                    segment: s,
                    last_event_at,
                    linked,
                    switch_in: if entered { None } else { switch_in },
                    stop_at: stop_here.map(|sw| &sw.gtid),
                });
                on_main[i] = true;
                entered = true;
            }
        }
        let branch: Vec<&Segment> = segs
            .iter()
            .zip(&on_main)
            .filter(|(_, on)| !**on)
            .map(|(s, _)| *s)
            .collect();
        let mut lineage = Lineage::default();
        for m in &main {
            let Some(g) = &m.segment.gtids else { continue };
            for r in &g.runs {
                let mut r = *r;
                if let Some(stop) = m.stop_at
                    && stop.get(r.domain).is_some()
                {
                    let limit = stop.seq(r.domain);
                    if r.first > limit {
                        continue;
                    }
                    r.last = r.last.min(limit);
                }
                lineage.writers.entry(r.domain).or_default().push(r);
            }
            if let Some(stop) = m.stop_at {
                lineage.branch.extend(runs_after(&g.runs, stop));
            }
        }
        for runs in lineage.writers.values_mut() {
            runs.sort_by_key(|r| (r.first, r.last));
        }
        for s in &branch {
            if let Some(g) = &s.gtids {
                lineage.branch.extend(g.runs.iter().copied());
            }
        }
        History {
            main,
            branch,
            timelines: table.into_values().cloned().collect(),
            path,
            lineage,
        }
    }

    /// Whether a position lies on the main line ([`Lineage::on_main_line`]).
    pub fn on_main_line(&self, pos: &GtidPos) -> bool {
        self.lineage.on_main_line(pos)
    }

    /// What `parent`'s archived segments hold after `switch`: the transactions only the
    /// old primary had (a branch).
    pub fn branch_runs(&self, parent: u32, switch: &GtidPos) -> Vec<GtidRun> {
        let holding = self
            .main
            .iter()
            .filter(|m| m.stop_at == Some(switch))
            .map(|m| m.segment);
        let mut out: Vec<GtidRun> = self
            .branch
            .iter()
            .copied()
            .chain(holding)
            .filter(|s| timeline_of(s.sequence) == parent)
            .filter_map(|s| s.gtids.as_ref())
            .flat_map(|g| runs_after(&g.runs, switch).collect::<Vec<_>>())
            .collect();
        out.sort_by_key(|r| (r.domain, r.first));
        out
    }
}

/// One timeline as `ls`, `plan` and a policy's status show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineSummary {
    pub id: u32,
    /// The server that wrote it (absent: archived before writers were recorded).
    pub server_id: Option<u32>,
    /// The timeline it continues.
    pub parent: Option<u32>,
    /// Where it leaves its parent: `gtid` (the last transaction both hold), `at`,
    /// `parentSequence`, `missing` (GTIDs neither holds: a gap).
    pub switch: Option<Switch>,
    /// The parent's transactions after the switch: what only the old primary had, never
    /// replayed on this timeline (`domain-server-first..last`).
    pub branch: Vec<String>,
    /// Whether replay to the newest instants passes through it.
    pub main_line: bool,
    pub segments: usize,
    pub first: Option<String>,
    pub last: Option<String>,
    pub first_event_at: Option<Timestamp>,
    pub last_event_at: Option<Timestamp>,
}

/// The timelines of an inventory's log archive (an unread shard counts by its summary).
pub fn summaries(inventory: &crate::inventory::Inventory) -> Vec<TimelineSummary> {
    let history = History::new(&inventory.segments, &inventory.timelines);
    history
        .timelines
        .iter()
        .map(|t| {
            let mut own: Vec<&Segment> = inventory
                .segments
                .iter()
                .filter(|s| s.present && timeline_of(s.sequence) == t.id)
                .collect();
            own.sort_by_key(|s| s.sequence);
            let branch = match (&t.switch, t.parent) {
                (Some(sw), Some(p)) => history
                    .branch_runs(p, &sw.gtid)
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                _ => Vec::new(),
            };
            TimelineSummary {
                id: t.id,
                server_id: t.server_id.or_else(|| {
                    own.iter()
                        .find_map(|s| s.gtids.as_ref().map(|g| g.server_id))
                }),
                parent: t.parent,
                switch: t.switch.clone(),
                branch,
                main_line: history.path.contains(&t.id),
                segments: own.iter().map(|s| s.span.max(1) as usize).sum(),
                first: own.first().map(|s| s.name.clone()),
                last: own.last().map(|s| s.name.clone()),
                first_event_at: own.iter().filter_map(|s| s.first_event_at).min(),
                last_event_at: own.iter().filter_map(|s| s.last_event_at).max(),
            }
        })
        .collect()
}

/// A failover for tests: timeline 0 (server 1) and its replica's timeline 1.
#[cfg(test)]
pub(crate) mod fixtures {
    #![allow(clippy::unwrap_used)]
    use super::*;

    pub(crate) fn ts(s: &str) -> Timestamp {
        format!("2026-11-{s}:00Z").parse().unwrap()
    }

    pub(crate) fn seg(
        seq: u64,
        first: &str,
        last: &str,
        server: u32,
        start: &str,
        runs: &[&str],
    ) -> Segment {
        let mut s = Segment::new(
            archive_name(
                &format!("mysql-bin.{:06}", file_number(seq)),
                timeline_of(seq),
            )
            .unwrap(),
            seq,
            Some(ts(first)),
            Some(ts(last)),
            1,
        );
        s.gtids = Some(Box::new(SegmentGtids {
            server_id: server,
            start: GtidPos::parse(start).unwrap(),
            runs: runs.iter().map(|r| GtidRun::parse(r).unwrap()).collect(),
        }));
        s
    }

    /// Timeline 0 (server 1) archived through 0-1-12; the replica (server 2) was promoted
    /// after 0-1-10 (at 02:00); its timeline 1 starts with its file 2 (0-1-9.., then its
    /// own 0-2-11..).
    pub(crate) fn failover() -> (Vec<Segment>, Vec<Timeline>) {
        let segments = vec![
            seg(4, "01T00:00", "01T01:00", 1, "", &["0-1-1..8"]),
            seg(5, "01T01:00", "01T03:00", 1, "0-1-8", &["0-1-9..12"]),
            seg(
                archive_sequence(1, 2).unwrap(),
                "01T01:30",
                "01T04:00",
                2,
                "0-1-9",
                &["0-1-10", "0-2-11..12"],
            ),
            seg(
                archive_sequence(1, 3).unwrap(),
                "01T04:00",
                "01T05:00",
                2,
                "0-2-12",
                &["0-2-13..20"],
            ),
        ];
        let timelines = vec![
            Timeline {
                server_id: Some(1),
                ..Timeline::legacy()
            },
            Timeline {
                id: 1,
                server_id: Some(2),
                parent: Some(0),
                first_sequence: Some(archive_sequence(1, 2).unwrap()),
                switch: Some(Switch {
                    gtid: GtidPos::parse("0-1-10").unwrap(),
                    at: Some(ts("01T02:00")),
                    parent_sequence: Some(5),
                    missing: Vec::new(),
                    unrelated: false,
                }),
                created_at: None,
            },
        ];
        (segments, timelines)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::fixtures::{failover, ts};
    use super::*;
    use crate::gtid::GtidRun;

    #[test]
    fn archive_names_and_sequences() {
        assert_eq!(
            archive_name("mysql-bin.000042", 0).unwrap(),
            "mysql-bin.000042"
        );
        assert_eq!(
            archive_name("mysql-bin.000007", 2).unwrap(),
            "mysql-bin.2000000000007"
        );
        let seq = crate::inventory::segment_sequence("mysql-bin.2000000000007").unwrap();
        assert_eq!((timeline_of(seq), file_number(seq)), (2, 7));
        assert_eq!(archive_sequence(1, TIMELINE_STRIDE), None);
        assert_eq!(archive_name("nodigits", 1), None);
    }

    #[test]
    fn the_main_line_leaves_the_parent_at_the_switch() {
        let (segments, timelines) = failover();
        let h = History::new(&segments, &timelines);
        assert_eq!(h.path, [0, 1]);
        let seqs: Vec<u64> = h.main.iter().map(|m| m.segment.sequence).collect();
        assert_eq!(seqs, [4, 5, 1_000_000_000_002, 1_000_000_000_003]);
        let linked: Vec<bool> = h.main.iter().map(|m| m.linked).collect();
        assert_eq!(linked, [false, true, true, true]);
        // Segment 5's events after the switch are a branch: on the main line it ends there.
        assert_eq!(h.main[1].last_event_at, Some(ts("01T02:00")));
        assert_eq!(h.main[1].stop_at.unwrap().to_string(), "0-1-10");
        assert!(h.main[2].switch_in.is_some());
        let branch = h.branch_runs(0, &GtidPos::parse("0-1-10").unwrap());
        assert_eq!(crate::gtid::runs_text(&branch), "0-1-11..12");
        assert!(h.on_main_line(&GtidPos::parse("0-1-10").unwrap()));
        assert!(h.on_main_line(&GtidPos::parse("0-2-15").unwrap()));
        assert!(!h.on_main_line(&GtidPos::parse("0-1-11").unwrap()));
    }

    /// A file numbered on from the one before, but starting past where it ended (a file of
    /// another binlog that took the number: a copy cut short, a binlog that started over),
    /// is not linked: replay would skip what lies between.
    #[test]
    fn a_gap_between_files_of_one_timeline_unlinks_them() {
        let (mut segments, timelines) = failover();
        segments[1].gtids.as_mut().unwrap().start = GtidPos::parse("0-1-9").unwrap();
        let h = History::new(&segments, &timelines);
        let linked: Vec<bool> = h.main.iter().map(|m| m.linked).collect();
        assert_eq!(linked[..2], [false, false], "{linked:?}");
        // Without the recorded GTIDs, numbering alone links them (older archives).
        segments[1].gtids = None;
        let h = History::new(&segments, &timelines);
        assert!(h.main[1].linked);
    }

    #[test]
    fn a_gap_at_the_switch_unlinks_the_timelines() {
        let (segments, mut timelines) = failover();
        timelines[1].switch.as_mut().unwrap().missing = vec![GtidRun::parse("0-1-11..12").unwrap()];
        let h = History::new(&segments, &timelines);
        assert!(!h.main[2].linked);
        // Without a table, later timelines are off the main line.
        let h = History::new(&segments, &[]);
        assert_eq!(h.path, [0]);
        assert_eq!(h.main.len(), 2);
        assert_eq!(h.branch.len(), 2);
    }
}
