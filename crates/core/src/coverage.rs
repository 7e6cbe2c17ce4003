//! What can be restored: the restore model shared by the planner, `tidemark ls` and the
//! invariant tests.
//!
//! # The model
//! - A restorable backup (completed, with every ancestor completed and present) restores to
//!   its `completedAt`.
//! - From there, replay needs the events from the first segment (by sequence) whose
//!   `lastEventAt` is known and not before that instant. It can begin only if that segment
//!   began at or before the instant, or the archived segments just before it reach back,
//!   without a missing sequence number, to one that did (or to one that ended before it):
//!   otherwise events may be missing in between. It continues while sequence numbers are
//!   contiguous and reaches the latest known `lastEventAt` of that run.
//! - Segments whose events all precede a backup's completion are not needed by it.
//!
//! So each restorable backup contributes one closed interval `[completedAt, replayEnd]`
//! (a single instant when no segment reaches past it), and the recoverable set is their
//! union.

use jiff::Timestamp;
use serde::Serialize;

use crate::gtid::GtidPos;
use crate::inventory::{Backup, Segment};
use crate::timeline::{History, Lineage, Timeline, timeline_of};

/// A closed interval of instants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interval {
    pub from: Timestamp,
    pub to: Timestamp,
}

/// A union of closed intervals, kept sorted and merged (touching intervals merge).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    intervals: Vec<Interval>,
}

impl Coverage {
    pub fn from_intervals(mut v: Vec<Interval>) -> Self {
        v.sort();
        let mut out: Vec<Interval> = Vec::with_capacity(v.len());
        for i in v {
            match out.last_mut() {
                Some(last) if i.from <= last.to => last.to = last.to.max(i.to),
                _ => out.push(i),
            }
        }
        Coverage { intervals: out }
    }

    pub fn intervals(&self) -> &[Interval] {
        &self.intervals
    }

    /// Adds one interval, keeping the set merged.
    pub fn insert(&mut self, i: Interval) {
        // First interval that could touch `i`: the last one starting at or before i.to.
        let end = self.intervals.partition_point(|x| x.from <= i.to);
        let start = self.intervals[..end].partition_point(|x| x.to < i.from);
        let mut merged = i;
        for x in &self.intervals[start..end] {
            merged.from = merged.from.min(x.from);
            merged.to = merged.to.max(x.to);
        }
        self.intervals.splice(start..end, [merged]);
    }

    /// Whether every instant of the half-open `(from, to]` is covered.
    pub fn covers_open_closed(&self, from: Timestamp, to: Timestamp) -> bool {
        if to <= from {
            return true;
        }
        let idx = self.intervals.partition_point(|x| x.from <= from);
        idx > 0 && self.intervals[idx - 1].to >= to
    }

    /// Whether the instant `t` is covered.
    pub fn covers_point(&self, t: Timestamp) -> bool {
        let idx = self.intervals.partition_point(|x| x.from <= t);
        idx > 0 && self.intervals[idx - 1].to >= t
    }

    pub fn first(&self) -> Option<Timestamp> {
        self.intervals.first().map(|i| i.from)
    }

    pub fn last(&self) -> Option<Timestamp> {
        self.intervals.last().map(|i| i.to)
    }

    /// The holes between covered intervals.
    pub fn gaps(&self) -> Vec<Interval> {
        self.intervals
            .windows(2)
            .map(|w| Interval {
                from: w[0].to,
                to: w[1].from,
            })
            .collect()
    }
}

/// The main line's segments prepared for replay queries ([`crate::timeline::History`]):
/// in replay order, each knowing whether replay continues into it from the one before.
#[derive(Debug, Clone, Default)]
pub struct Replay {
    sequences: Vec<u64>,
    /// Whether replay continues into each entry from the one before without a missing
    /// event (contiguous sequences within a timeline; a switch that joins, between two).
    linked: Vec<bool>,
    first_event: Vec<Option<Timestamp>>,
    last_event: Vec<Option<Timestamp>>,
    /// Running maximum of known `lastEventAt`, in replay order. Monotone, so a binary
    /// search finds the first segment reaching a given instant.
    prefix_max_last: Vec<Option<Timestamp>>,
    /// For each position, the latest known `lastEventAt` from there to the end of its run.
    run_end_from: Vec<Option<Timestamp>>,
    /// Each segment's GTID position at its start and (on the main line) its end, when
    /// recorded; a switch into a timeline starts at the switch.
    starts: Vec<Option<GtidPos>>,
    ends: Vec<Option<GtidPos>>,
    /// Who wrote what: a backup whose position lies on a branch restores to its own point
    /// only, never with the main line's events.
    lineage: Lineage,
    /// The server that wrote the archive's first timeline, when recorded: a backup that
    /// records only a file offset, taken on another server, cannot be placed in it.
    first_writer: Option<u32>,
}

/// Where replay begins for a backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Begin {
    /// At this main-line position.
    At(usize),
    /// Nothing archived after the backup's position: it holds every transaction of the
    /// linked segments through this main-line position (so no transaction happened up to
    /// their last event either).
    Through(usize),
    /// The archive starts after the backup's position (GTIDs missing in between): from
    /// this main-line position's start.
    After(usize),
}

impl Replay {
    /// Builds the replay index over the segments that exist in the store, as one timeline
    /// (an archive that records no timelines).
    pub fn new<'a>(segments: impl IntoIterator<Item = &'a Segment>) -> Self {
        Self::of(&History::new(segments, &[]))
    }

    /// Builds the replay index over the main line of `segments` under `timelines`.
    pub fn with_timelines<'a>(
        segments: impl IntoIterator<Item = &'a Segment>,
        timelines: &'a [Timeline],
    ) -> Self {
        Self::of(&History::new(segments, timelines))
    }

    /// The replay index of a history's main line.
    pub fn of(history: &History<'_>) -> Self {
        let main = &history.main;
        let mut prefix_max_last = Vec::with_capacity(main.len());
        let mut running: Option<Timestamp> = None;
        for m in main {
            running = running.max(m.last_event_at);
            prefix_max_last.push(running);
        }
        let mut run_end_from = vec![None; main.len()];
        let mut acc: Option<Timestamp> = None;
        for i in (0..main.len()).rev() {
            if !main.get(i + 1).is_some_and(|next| next.linked) {
                acc = None;
            }
            acc = acc.max(main[i].last_event_at);
            run_end_from[i] = acc;
        }
        // GTID positions only when some segment records them (an archive of one server
        // written before GTIDs were recorded keeps its memory and time).
        let with_gtids = main.iter().any(|m| m.gtids().is_some());
        Replay {
            starts: if with_gtids {
                main.iter()
                    .map(|m| {
                        let g = m.gtids()?;
                        Some(match m.switch_in {
                            Some(sw) if sw.gtid.covers(&g.start) => sw.gtid.clone(),
                            _ => g.start.clone(),
                        })
                    })
                    .collect()
            } else {
                Vec::new()
            },
            ends: if with_gtids {
                main.iter()
                    .map(|m| m.stop_at.cloned().or_else(|| Some(m.gtids()?.end())))
                    .collect()
            } else {
                Vec::new()
            },
            sequences: main.iter().map(|m| m.segment.sequence).collect(),
            linked: main.iter().map(|m| m.linked).collect(),
            first_event: main.iter().map(|m| m.segment.first_event_at).collect(),
            last_event: main.iter().map(|m| m.last_event_at).collect(),
            prefix_max_last,
            run_end_from,
            lineage: history.lineage.clone(),
            first_writer: history.first_writer(),
        }
    }

    /// Position of the first segment (in replay order) whose last event is known and not
    /// before `completed`: the first one replay needs events from.
    fn start(&self, completed: Timestamp) -> Option<usize> {
        // `None < Some(_)`, so this finds the first position with a known time ≥ completed.
        let i = self
            .prefix_max_last
            .partition_point(|m| *m < Some(completed));
        (i < self.sequences.len()).then_some(i)
    }

    /// Position replay begins at for a backup completed at `completed`: the start segment
    /// if it began at or before `completed`; else the earliest of the linked segments
    /// before it back to one that began by then (or that ended before it, so the next one
    /// holds the first event after it). `None` when the run back breaks first: events
    /// between `completed` and the start segment may be missing.
    fn begin(&self, completed: Timestamp) -> Option<usize> {
        let i = self.start(completed)?;
        let mut j = i;
        loop {
            if self.first_event[j].is_some_and(|f| f <= completed) {
                return Some(j);
            }
            if j == 0 || !self.linked[j] {
                return None;
            }
            j -= 1;
            // Before the start segment, a known last event is before `completed`: the
            // segment after this one holds the first event replay needs.
            if self.last_event[j].is_some() {
                return Some(j + 1);
            }
        }
    }

    /// Sequence number of the segment replay begins at for a backup completed at
    /// `completed`, if replay from it can reach past `completed`.
    pub fn start_sequence(&self, completed: Timestamp) -> Option<u64> {
        self.begin(completed).map(|i| self.sequences[i])
    }

    /// Sequence numbers of the segments before the start segment that replay for a backup
    /// completed at `completed` begins in (those that began after it, or whose last event
    /// is unknown): the planner keeps them, so that whether replay may begin is judged the
    /// same before and after a pass.
    pub fn predecessors_needed(&self, completed: Timestamp) -> Vec<u64> {
        match (self.begin(completed), self.start(completed)) {
            (Some(b), Some(i)) if b < i => self.sequences[b..i].to_vec(),
            // The start segment began after `completed` with no run back: keep the one
            // just before it, so replay is judged the same if it is archived later.
            (None, Some(i)) => {
                let seq = self.sequences[i];
                if i > 0 && self.linked[i] {
                    vec![self.sequences[i - 1]]
                } else if timeline_of(seq) == timeline_of(seq.saturating_sub(1)) {
                    vec![seq.saturating_sub(1)]
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        }
    }

    /// The latest instant reachable by replaying from a backup completed at `completed`.
    pub fn replay_end(&self, completed: Timestamp) -> Timestamp {
        match self.begin(completed).and_then(|b| self.run_end_from[b]) {
            Some(end) => end.max(completed),
            None => completed,
        }
    }

    /// The interval a restorable backup completed at `completed` contributes.
    pub fn interval(&self, completed: Timestamp) -> Interval {
        Interval {
            from: completed,
            to: self.replay_end(completed),
        }
    }

    /// The interval a restorable backup contributes to the main line's window: none when
    /// its recorded position lies on a branch (it restores a history the main line left).
    /// With a GTID position and segments that record theirs, replay begins where the
    /// segments say; otherwise by time ([`Replay::interval`]).
    pub fn interval_of(&self, backup: &Backup) -> Option<Interval> {
        if self.on_branch(backup) {
            return None;
        }
        let completed = backup.restore_point();
        if backup.galera || self.offset_elsewhere(backup) {
            return Some(Interval {
                from: completed,
                to: completed,
            });
        }
        match self.begin_for(backup) {
            None => Some(self.interval(completed)),
            Some(Begin::At(b)) => Some(Interval {
                from: completed,
                to: self.run_end_from[b].map_or(completed, |e| e.max(completed)),
            }),
            Some(Begin::Through(i)) => Some(Interval {
                from: completed,
                to: self.run_end_from[i].map_or(completed, |e| e.max(completed)),
            }),
            Some(Begin::After(_)) => Some(Interval {
                from: completed,
                to: completed,
            }),
        }
    }

    /// Where replay begins for a backup by its GTID position, when it records one and the
    /// main-line segments around it record theirs; `None`: decide by time.
    pub(crate) fn begin_for(&self, backup: &Backup) -> Option<Begin> {
        let g = backup.gtid.as_ref()?;
        let completed = backup.restore_point();
        // From where the backup's start lies by time (its position was taken after it).
        let mut i = self
            .start(backup.started_at.min(completed))
            .or_else(|| self.start(completed))?;
        self.starts.get(i)?.as_ref()?;
        // Back while the segment starts after the position.
        while i > 0
            && self.linked[i]
            && self.starts[i].as_ref().is_some_and(|s| !g.covers(s))
            && self.starts[i - 1].is_some()
        {
            i -= 1;
        }
        // Forward while the backup holds everything the segment has.
        loop {
            let end = self.ends[i].as_ref()?;
            if !g.covers(end) {
                break;
            }
            if i + 1 >= self.sequences.len() || !self.linked[i + 1] {
                return Some(Begin::Through(i));
            }
            i += 1;
        }
        match &self.starts[i] {
            Some(s) if !g.covers(s) => Some(Begin::After(i)),
            Some(_) => Some(Begin::At(i)),
            None => None,
        }
    }

    /// Sequences of the segments a retained backup's replay depends on before its start
    /// segment by time ([`Replay::predecessors_needed`], or from where its GTID position
    /// says replay begins).
    pub fn needed_before(&self, backup: &Backup) -> Vec<u64> {
        let completed = backup.restore_point();
        match (self.begin_for(backup), self.start(completed)) {
            (Some(Begin::At(b)), Some(i)) if b < i => self.sequences[b..i].to_vec(),
            (Some(Begin::At(_)), _) => Vec::new(),
            _ => self.predecessors_needed(completed),
        }
    }

    /// Whether a backup records only a file offset, taken on a server other than the one
    /// that wrote the archive's first timeline (as far as both are recorded): replay cannot
    /// be placed after it, so it restores to its own point only. A MySQL backup that
    /// records its GTID set is placed by it, whatever file it names.
    pub fn offset_elsewhere(&self, backup: &Backup) -> bool {
        backup.gtid.is_none()
            && backup.gtid_set.is_none()
            && backup.log_file.is_some()
            && matches!((backup.server_id, self.first_writer), (Some(a), Some(b)) if a != b)
    }

    /// Whether a backup's recorded position lies on a branch.
    pub fn on_branch(&self, backup: &Backup) -> bool {
        backup
            .gtid
            .as_ref()
            .is_some_and(|g| !self.lineage.on_main_line(g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        format!("2026-11-{s}:00Z").parse().unwrap()
    }

    fn seg(seq: u64, first: &str, last: Option<&str>) -> Segment {
        Segment::new(
            format!("mysql-bin.{seq:06}"),
            seq,
            Some(ts(first)),
            last.map(ts),
            1,
        )
    }

    #[test]
    fn replay_runs_stop_at_sequence_gaps() {
        let segs = [
            seg(1, "01T00:00", Some("01T06:00")),
            seg(2, "01T06:00", Some("01T12:00")),
            // 3 is missing
            seg(4, "01T18:00", Some("02T00:00")),
            seg(5, "02T00:00", None),
        ];
        let r = Replay::new(&segs);
        assert_eq!(r.replay_end(ts("01T01:00")), ts("01T12:00"));
        // Segment 4 began after 13:00 and segment 3 is missing: events may be lost.
        assert_eq!(r.replay_end(ts("01T13:00")), ts("01T13:00"));
        assert_eq!(r.replay_end(ts("01T19:00")), ts("02T00:00"));
        assert_eq!(r.replay_end(ts("02T01:00")), ts("02T01:00"));
    }

    #[test]
    fn coverage_merges_and_answers() {
        let mut c = Coverage::from_intervals(vec![
            Interval {
                from: ts("01T00:00"),
                to: ts("01T02:00"),
            },
            Interval {
                from: ts("01T05:00"),
                to: ts("01T06:00"),
            },
        ]);
        assert!(c.covers_open_closed(ts("01T00:30"), ts("01T02:00")));
        assert!(!c.covers_open_closed(ts("01T01:00"), ts("01T05:30")));
        assert_eq!(c.gaps().len(), 1);
        c.insert(Interval {
            from: ts("01T02:00"),
            to: ts("01T05:00"),
        });
        assert_eq!(c.intervals().len(), 1);
        assert!(c.covers_open_closed(ts("01T01:00"), ts("01T05:30")));
    }
}
