//! What a point-in-time restore uses: the backup (with its chain) and the log segments that
//! bring it to a target instant — or why the target cannot be reached.
//!
//! The choice follows the restore model of [`crate::coverage`]: the newest restorable
//! backup on the main line ([`crate::timeline`]) that completed at or before the target and
//! whose replay reaches it. Replay follows the main line: it starts after the backup's
//! GTID position, in the segment holding the next transaction (read from the segments'
//! GTIDs, or — for segments archived without them — the segment before the one the
//! backup's start reaches by time, the replay skipping by GTID what the backup holds);
//! a backup that records only a file and offset replays from that offset, on the timeline
//! it was taken on. Replay takes every linked segment holding events up to the target, in
//! one run per timeline: the parent's up to the switch, then the next timeline's after it.

use jiff::Timestamp;
use serde::Serialize;

use crate::coverage::{Begin, Interval, Replay};
use crate::gtid::{GtidPos, GtidRun};
use crate::inventory::{Backup, BackupId, Inventory, Segment, segment_sequence};
use crate::plan::{RecoveryWindow, parents, restorable, sorted, window_of};
use crate::timeline::{History, MainSegment, timeline_of};

/// What a restore to `target` uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreChoice {
    pub target: Timestamp,
    /// The backup restored and its ancestors, base full first, restored backup last.
    pub chain: Vec<Backup>,
    /// Segments to replay, in replay order; empty when the target is the backup's own
    /// restore point and no archived segment holds events after its position.
    pub segments: Vec<Segment>,
    /// Whether replay begins at the restored backup's recorded binlog file offset in
    /// `segments[0]` (a backup without a GTID position; otherwise by GTID, or at the start
    /// of `segments[0]`).
    pub from_log_position: bool,
    /// The segments in one run per timeline, in order.
    pub runs: Vec<ReplayRun>,
    pub window: RecoveryWindow,
    /// Summaries (unread index shards) among `segments`: the caller reads their shards and
    /// chooses again. Empty in a final choice.
    pub unread: Vec<Segment>,
}

/// Consecutive segments of one timeline that replay reads in one pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayRun {
    pub timeline: u32,
    /// The server that wrote them, when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_id: Option<u32>,
    /// Positions in [`RestoreChoice::segments`]: `first..first + count`.
    pub first: usize,
    pub count: usize,
    /// Replay applies the transactions after this position (`None`: from the backup's
    /// file offset, or from the first segment's start).
    pub start_after: Option<GtidPos>,
    /// Replay stops after this position: the switch to the next timeline.
    pub stop_at: Option<GtidPos>,
    /// When this timeline took over from the run before (the switch's time), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switched_at: Option<Timestamp>,
}

impl ReplayRun {
    /// One run of `count` segments without GTID positions (an archive of one timeline that
    /// records none).
    pub fn whole(count: usize) -> Self {
        ReplayRun {
            timeline: 0,
            server_id: None,
            first: 0,
            count,
            start_after: None,
            stop_at: None,
            switched_at: None,
        }
    }
}

/// Why a target cannot be restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreRefusal {
    #[error("nothing to restore: the store holds no restorable backup")]
    NoRecoveryPoint,
    #[error(
        "{target} is outside the recovery window {} … {}{}",
        window.from, window.to, gaps_note(window)
    )]
    OutsideWindow {
        target: Timestamp,
        window: Box<RecoveryWindow>,
    },
    #[error(
        "{target} falls in a gap of the recovery window: nothing restores between {} and {} (window {} … {}){}",
        gap.from, gap.to, window.from, window.to, missing_note(missing)
    )]
    InGap {
        target: Timestamp,
        gap: Interval,
        window: Box<RecoveryWindow>,
        /// Transactions missing from the archive at a switch of timelines in the gap.
        missing: Box<[GtidRun]>,
    },
    #[error(
        "backup {backup} is at binlog {file}, which is not in the archive, and {target} lies after its completion; choose its completion {completed} or archive the binlogs"
    )]
    PositionNotArchived {
        target: Timestamp,
        backup: BackupId,
        file: String,
        completed: Timestamp,
    },
    #[error(
        "backup {backup} was taken on a Galera node: point-in-time replay past it is not supported yet, so {target} cannot be reached from it; restore to its completion {completed}"
    )]
    GaleraReplay {
        target: Timestamp,
        backup: BackupId,
        completed: Timestamp,
    },
    #[error(
        "backup {backup} records only an offset in {file} of server {taken_on}'s binlog (no GTID), and the archive holds server {wrote}'s: replay from it cannot be placed, so {target} cannot be reached; choose its completion {completed}, or take backups with GTIDs"
    )]
    OffsetOnAnotherServer {
        target: Timestamp,
        backup: BackupId,
        file: String,
        taken_on: u32,
        wrote: u32,
        completed: Timestamp,
    },
    #[error(
        "binlog segment {missing} is missing from the archive: replay from backup {backup} stops after {after} and cannot reach {target}"
    )]
    MissingSegment {
        target: Timestamp,
        backup: BackupId,
        after: String,
        missing: u64,
    },
    #[error(
        "backup {backup} holds GTID position {position}, but the archive's segments on its timeline start at {archive_from}: the transactions between are missing, so {target} (after its completion {completed}) cannot be reached; choose its completion or a later backup"
    )]
    GtidNotArchived {
        target: Timestamp,
        backup: BackupId,
        position: GtidPos,
        archive_from: GtidPos,
        completed: Timestamp,
    },
    #[error(
        "backup {backup} records no GTID position, only a binlog file and offset, so replay from it cannot cross the switch to timeline {timeline} (server {server}); {target} lies after it: choose a backup taken with GTIDs, or a target before the switch"
    )]
    NoGtidAcrossSwitch {
        target: Timestamp,
        backup: BackupId,
        timeline: u32,
        server: String,
    },
}

fn missing_note(missing: &[GtidRun]) -> String {
    if missing.is_empty() {
        return String::new();
    }
    format!(
        "; the archive is missing GTIDs {} at a switch of primary there",
        crate::gtid::runs_text(missing)
    )
}

fn gaps_note(w: &RecoveryWindow) -> String {
    if w.gaps.is_empty() {
        return String::new();
    }
    let gaps: Vec<String> = w
        .gaps
        .iter()
        .map(|g| format!("{} … {}", g.from, g.to))
        .collect();
    format!(" (with gaps {})", gaps.join(", "))
}

/// Chooses what a restore to `target` uses.
///
/// # Errors
/// The target lies outside the recovery window or in one of its gaps, or the segments
/// replay needs are not all archived.
pub fn choose_restore(
    inventory: &Inventory,
    target: Timestamp,
) -> Result<RestoreChoice, RestoreRefusal> {
    let backups = sorted(inventory);
    let parent = parents(&backups);
    let ok = restorable(&backups, &parent);
    let history = History::new(&inventory.segments, &inventory.timelines);
    let replay = Replay::of(&history);
    let window = window_of(&backups, &replay, |i| ok[i]).ok_or(RestoreRefusal::NoRecoveryPoint)?;
    // Past the newest backup before it, which restores to its own point only (taken on a
    // Galera node, or recording only an offset in another server's binlog): said as such.
    let offset_elsewhere = || {
        let i = (0..backups.len())
            .filter(|&i| ok[i] && backups[i].restore_point() <= target)
            .max_by_key(|&i| (backups[i].restore_point(), &backups[i].id))?;
        let b = backups[i];
        if target <= b.restore_point() {
            return None;
        }
        if b.galera {
            return Some(RestoreRefusal::GaleraReplay {
                target,
                backup: b.id.clone(),
                completed: b.restore_point(),
            });
        }
        replay
            .offset_elsewhere(b)
            .then(|| RestoreRefusal::OffsetOnAnotherServer {
                target,
                backup: b.id.clone(),
                file: b.log_file.clone().unwrap_or_default(),
                taken_on: b.server_id.unwrap_or_default(),
                wrote: history.first_writer().unwrap_or_default(),
                completed: b.restore_point(),
            })
    };
    if target < window.from || target > window.to {
        return Err(offset_elsewhere().unwrap_or(RestoreRefusal::OutsideWindow {
            target,
            window: Box::new(window),
        }));
    }
    if let Some(gap) = window
        .gaps
        .iter()
        .find(|g| g.from < target && target < g.to)
        .copied()
    {
        // A switch into a timeline that the archive does not join, in the gap: name the
        // transactions missing there.
        let missing = history
            .main
            .iter()
            .filter_map(|m| m.switch_in.as_ref().filter(|_| !m.linked))
            .filter(|sw| sw.at.is_none_or(|at| gap.from <= at && at <= gap.to))
            .flat_map(|sw| sw.missing.iter().copied())
            .collect::<Vec<_>>()
            .into_boxed_slice();
        return Err(offset_elsewhere().unwrap_or(RestoreRefusal::InGap {
            target,
            gap,
            window: Box::new(window),
            missing,
        }));
    }
    // Inside the window, some restorable backup reaches the target; take the newest.
    let chosen = (0..backups.len())
        .filter(|&i| ok[i])
        .filter(|&i| {
            // The window's own rule (a backup on a branch has none).
            replay
                .interval_of(backups[i])
                .is_some_and(|iv| iv.from <= target && target <= iv.to)
        })
        .max_by(|&a, &b| {
            (backups[a].restore_point(), &backups[a].id)
                .cmp(&(backups[b].restore_point(), &backups[b].id))
        })
        .ok_or_else(|| RestoreRefusal::OutsideWindow {
            target,
            window: Box::new(window.clone()),
        })?;
    let mut chain = Vec::new();
    let mut cur = Some(chosen);
    while let Some(i) = cur {
        chain.push(backups[i].clone());
        cur = parent[i];
    }
    chain.reverse();
    let backup = backups[chosen];
    let (segments, from_log_position, runs) = replay_segments(&history, backup, &replay, target)?;
    let unread = segments.iter().filter(|s| s.summary).cloned().collect();
    Ok(RestoreChoice {
        target,
        chain,
        segments,
        from_log_position,
        runs,
        window,
        unread,
    })
}

/// [`choose_restore`] for a target as people give it: a target with no fraction of a second
/// (as Tidemark, `kubectl` and Kubernetes' own times print it) names that whole second,
/// which replay already includes (binlog events carry whole seconds). So when the
/// recovery window, or its part after a gap, begins inside that second — a Backup's
/// `completedAt` shown to the second, the store holding nanoseconds — the target is that
/// beginning, and restoring to a printed completion time restores that backup. A target
/// with a fraction is exact.
///
/// # Errors
/// As [`choose_restore`], for the target as given.
pub fn choose_restore_to(
    inventory: &Inventory,
    target: Timestamp,
) -> Result<RestoreChoice, RestoreRefusal> {
    let refused = match choose_restore(inventory, target) {
        Ok(c) => return Ok(c),
        Err(e) => e,
    };
    if target.subsec_nanosecond() != 0 {
        return Err(refused);
    }
    let begins = match &refused {
        RestoreRefusal::OutsideWindow { window, .. } if window.from > target => window.from,
        RestoreRefusal::InGap { gap, .. } => gap.to,
        _ => return Err(refused),
    };
    if begins.as_second() != target.as_second() {
        return Err(refused);
    }
    choose_restore(inventory, begins).map_err(|_| refused)
}

/// Where replay starts on the main line for `backup`: the position of the first segment,
/// and whether it starts at the backup's file offset there.
///
/// # Errors
/// The backup's position is not in the archive and the target lies after its completion.
fn replay_start(
    main: &[MainSegment<'_>],
    backup: &Backup,
    replay: &Replay,
    target: Timestamp,
) -> Result<Option<(usize, bool)>, RestoreRefusal> {
    // Taken on a Galera node: its own point only (its window is that instant).
    if backup.galera {
        return Ok(None);
    }
    let completed = backup.restore_point();
    let at = |seq: u64| main.iter().position(|m| m.segment.sequence == seq);
    let Some(g) = &backup.gtid else {
        // A MySQL GTID set (a clone's, a dump's): replay starts by time, and skips by GTID
        // what the backup holds — the file it names (a dump's) is its server's own.
        if backup.gtid_set.is_some() {
            return Ok(replay
                .start_sequence(completed)
                .and_then(at)
                .map(|i| (i, false)));
        }
        // Only a file and offset: on the timeline it names (the archive's first, whose
        // objects carry the servers' own file names) — and only when that timeline is the
        // server's it was taken on, as far as either records — else by time.
        if replay.offset_elsewhere(backup) {
            // An offset in another server's binlog: replay from a segment's start would
            // apply transactions the backup holds; it restores to its completion only (its
            // interval in the window is that instant).
            return Ok(None);
        }
        let position_file = backup.log_file.as_deref();
        return match position_file.and_then(segment_sequence) {
            Some(seq) => {
                let holding = main.iter().position(|m| {
                    timeline_of(m.segment.sequence) == 0
                        && m.segment.sequence <= seq
                        && seq <= m.segment.last_sequence()
                });
                match holding {
                    Some(i) => Ok(Some((
                        i,
                        main[i].segment.sequence == seq && !main[i].segment.summary,
                    ))),
                    None if target > completed => Err(RestoreRefusal::PositionNotArchived {
                        target,
                        backup: backup.id.clone(),
                        file: position_file.unwrap_or_default().to_owned(),
                        completed,
                    }),
                    None => Ok(None),
                }
            }
            None => Ok(replay
                .start_sequence(completed)
                .and_then(at)
                .map(|i| (i, false))),
        };
    };
    // By GTID, where the segments record theirs.
    match replay.begin_for(backup) {
        Some(Begin::At(i)) => return Ok(Some((i, false))),
        Some(Begin::Through(_)) => return Ok(None),
        Some(Begin::After(i)) if target > completed => {
            let from = main[i]
                .switch_in
                .as_ref()
                .map(|sw| sw.gtid.clone())
                .or_else(|| main[i].segment.gtids.as_ref().map(|sg| sg.start.clone()))
                .unwrap_or_default();
            return Err(RestoreRefusal::GtidNotArchived {
                target,
                backup: backup.id.clone(),
                position: g.clone(),
                archive_from: from,
                completed,
            });
        }
        Some(Begin::After(_)) => return Ok(None),
        None => {}
    }
    // Segments without GTIDs: from where the backup's start lies by time, one segment
    // earlier so that a position taken just before a rotation is not missed; replay skips
    // by GTID what the backup holds.
    let from_time = replay
        .start_sequence(backup.started_at.min(completed))
        .or_else(|| replay.start_sequence(completed))
        .and_then(at);
    let Some(mut i) = from_time else {
        return Ok(None);
    };
    if i > 0 && main[i].linked {
        i -= 1;
    }
    Ok(Some((i, false)))
}

/// The linked main-line segments from the backup's replay start that hold events up to
/// `target`, and their runs.
fn replay_segments(
    history: &History<'_>,
    backup: &Backup,
    replay: &Replay,
    target: Timestamp,
) -> Result<(Vec<Segment>, bool, Vec<ReplayRun>), RestoreRefusal> {
    let main = &history.main;
    let completed = backup.restore_point();
    let Some((start, from_log_position)) = replay_start(main, backup, replay, target)? else {
        return Ok((Vec::new(), false, Vec::new()));
    };
    let by_gtid = backup.gtid.is_some() || backup.gtid_set.is_some();
    let mut taken: Vec<&MainSegment<'_>> = Vec::new();
    let mut blocked_switch = None;
    for (k, m) in main[start..].iter().enumerate() {
        if k > 0 && !m.linked {
            break;
        }
        if m.segment.first_event_at.is_some_and(|f| f > target) && !taken.is_empty() {
            break;
        }
        if k > 0 && m.switch_in.is_some() && !by_gtid {
            blocked_switch = Some(m);
            break;
        }
        taken.push(m);
    }
    // Replay reaches the target when some taken segment ends at or after it, or the next
    // segment of the main line begins after it (so no event up to the target is missing).
    let reached = taken
        .iter()
        .any(|m| m.last_event_at.is_some_and(|l| l >= target));
    let next = taken.last().and_then(|l| {
        let i = start + taken.len();
        main.get(i)
            .filter(|n| n.linked && n.segment.sequence != l.segment.sequence)
    });
    let next_starts_later =
        next.is_some_and(|s| s.segment.first_event_at.is_some_and(|f| f > target));
    if target > completed && !reached && !next_starts_later {
        if let Some(m) = blocked_switch {
            let timeline = timeline_of(m.segment.sequence);
            let server = history
                .timelines
                .iter()
                .find(|t| t.id == timeline)
                .and_then(|t| t.server_id)
                .map_or_else(|| "unknown".to_owned(), |s| s.to_string());
            return Err(RestoreRefusal::NoGtidAcrossSwitch {
                target,
                backup: backup.id.clone(),
                timeline,
                server,
            });
        }
        let after = taken
            .last()
            .map_or_else(String::new, |m| m.segment.name.clone());
        let missing = taken.last().map_or(0, |m| m.segment.last_sequence() + 1);
        return Err(RestoreRefusal::MissingSegment {
            target,
            backup: backup.id.clone(),
            after,
            missing,
        });
    }
    // One run per timeline.
    let mut runs: Vec<ReplayRun> = Vec::new();
    for (i, m) in taken.iter().enumerate() {
        let timeline = timeline_of(m.segment.sequence);
        let same = runs.last().is_some_and(|r| r.timeline == timeline);
        if !same {
            let start_after = match (&backup.gtid, m.switch_in) {
                (Some(g), Some(sw)) if i > 0 => Some(g.merged(&sw.gtid)),
                (Some(g), _) => Some(g.clone()),
                (None, Some(sw)) if i > 0 => Some(sw.gtid.clone()),
                (None, _) => None,
            };
            runs.push(ReplayRun {
                timeline,
                server_id: m.segment.gtids.as_ref().map(|g| g.server_id).or_else(|| {
                    history
                        .timelines
                        .iter()
                        .find(|t| t.id == timeline)
                        .and_then(|t| t.server_id)
                }),
                first: i,
                count: 0,
                start_after,
                stop_at: None,
                switched_at: m.switch_in.filter(|_| i > 0).and_then(|sw| sw.at),
            });
        }
        if let Some(r) = runs.last_mut() {
            r.count += 1;
            if let Some(stop) = m.stop_at {
                r.stop_at = Some(stop.clone());
            }
        }
    }
    let segments = taken.iter().map(|m| m.segment.clone()).collect();
    Ok((segments, from_log_position, runs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{BackupKind, Phase};

    fn ts(s: &str) -> Timestamp {
        format!("2026-11-{s}:00Z").parse().unwrap()
    }

    fn backup(id: &str, kind: BackupKind, started: &str, completed: &str, log: &str) -> Backup {
        Backup {
            id: id.into(),
            name: "nightly".into(),
            kind,
            phase: Phase::Completed,
            started_at: ts(started),
            completed_at: Some(ts(completed)),
            last_modified: ts(completed),
            immutable_until: None,
            ttl: None,
            protected: false,
            newer_format: false,
            interrupted_delete: false,
            log_file: Some(log.into()),
            size: 1,
            consolidated_from: Vec::new(),
            consolidatable: false,
            payload_missing: false,
            heartbeat_at: None,
            deletion_requested: false,
            gtid: None,
            gtid_set: None,
            server_id: None,
            galera: false,
            held_for: Vec::new(),
            awaiting_copy: Vec::new(),
            guarded: false,
        }
    }

    fn seg(seq: u64, first: &str, last: &str) -> Segment {
        Segment::new(
            format!("mysql-bin.{seq:06}"),
            seq,
            Some(ts(first)),
            Some(ts(last)),
            1,
        )
    }

    const FULL: &str = "20261101T000000Z-aaaaaaaa";
    const INC: &str = "20261101T120000Z-bbbbbbbb";

    fn inventory() -> Inventory {
        Inventory {
            backups: vec![
                backup(
                    FULL,
                    BackupKind::Full,
                    "01T00:00",
                    "01T00:10",
                    "mysql-bin.000001",
                ),
                backup(
                    INC,
                    BackupKind::Incremental(FULL.into()),
                    "01T12:00",
                    "01T12:10",
                    "mysql-bin.000003",
                ),
            ],
            segments: vec![
                seg(1, "01T00:00", "01T06:00"),
                seg(2, "01T06:00", "01T11:00"),
                seg(3, "01T11:00", "01T18:00"),
                seg(4, "01T18:00", "02T00:00"),
            ],
            ..Default::default()
        }
    }

    fn names(c: &RestoreChoice) -> (Vec<&str>, Vec<u64>) {
        (
            c.chain.iter().map(|b| b.id.as_str()).collect(),
            c.segments.iter().map(|s| s.sequence).collect(),
        )
    }

    #[test]
    fn picks_the_newest_backup_before_the_target_and_the_segments_up_to_it() {
        let inv = inventory();
        let c = choose_restore(&inv, ts("01T07:00")).unwrap();
        assert_eq!(names(&c), (vec![FULL], vec![1, 2]));
        assert!(c.from_log_position);
        let c = choose_restore(&inv, ts("01T13:00")).unwrap();
        assert_eq!(names(&c), (vec![FULL, INC], vec![3]));
        let c = choose_restore(&inv, ts("01T19:00")).unwrap();
        assert_eq!(names(&c), (vec![FULL, INC], vec![3, 4]));
        // Exactly the incremental's completion: its position's segment, nothing later.
        let c = choose_restore(&inv, ts("01T12:10")).unwrap();
        assert_eq!(names(&c), (vec![FULL, INC], vec![3]));
    }

    #[test]
    fn refuses_outside_the_window_and_in_gaps_naming_them() {
        let inv = inventory();
        let e = choose_restore(&inv, ts("03T00:00")).unwrap_err();
        assert!(matches!(e, RestoreRefusal::OutsideWindow { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("2026-11-01T00:10:00Z … 2026-11-02T00:00:00Z"),
            "{e}"
        );
        let e = choose_restore(&inv, ts("01T00:05")).unwrap_err();
        assert!(matches!(e, RestoreRefusal::OutsideWindow { .. }), "{e}");

        let mut gap = inventory();
        gap.segments.retain(|s| s.sequence != 2);
        let e = choose_restore(&gap, ts("01T08:00")).unwrap_err();
        let RestoreRefusal::InGap { gap: g, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!((g.from, g.to), (ts("01T06:00"), ts("01T12:10")));
        assert!(
            e.to_string()
                .contains("between 2026-11-01T06:00:00Z and 2026-11-01T12:10:00Z")
        );
        // The incremental still restores past the gap.
        assert_eq!(
            names(&choose_restore(&gap, ts("01T13:00")).unwrap()).1,
            vec![3]
        );
    }

    #[test]
    fn a_target_given_to_the_second_names_the_whole_second() {
        let mut inv = inventory();
        inv.backups.truncate(1);
        inv.segments.clear();
        // The store holds the completion to the nanosecond; people see it to the second.
        let completed: Timestamp = "2026-11-01T00:10:00.329851779Z".parse().unwrap();
        inv.backups[0].completed_at = Some(completed);
        let printed = ts("01T00:10");
        assert!(matches!(
            choose_restore(&inv, printed),
            Err(RestoreRefusal::OutsideWindow { .. })
        ));
        let c = choose_restore_to(&inv, printed).unwrap();
        assert_eq!((names(&c).0, c.target), (vec![FULL], completed));
        // An exact target before it stays refused, and so does the second before.
        let exact: Timestamp = "2026-11-01T00:10:00.1Z".parse().unwrap();
        assert!(choose_restore_to(&inv, exact).is_err());
        assert!(choose_restore_to(&inv, ts("01T00:09")).is_err());
    }

    #[test]
    fn a_position_that_was_never_archived_limits_replay() {
        let mut inv = inventory();
        inv.backups.truncate(1);
        inv.segments.retain(|s| s.sequence != 1);
        // Time model: segment 2 began after the completion and 1 is missing: only the
        // completion itself restores.
        let e = choose_restore(&inv, ts("01T07:00")).unwrap_err();
        assert!(matches!(e, RestoreRefusal::OutsideWindow { .. }), "{e}");
        let c = choose_restore(&inv, ts("01T00:10")).unwrap();
        assert_eq!(names(&c), (vec![FULL], vec![]));
    }

    #[test]
    fn summaries_on_the_way_are_reported_unread() {
        let mut inv = inventory();
        let mut summary = Segment::new(
            "mysql-bin.000001",
            1,
            Some(ts("01T00:00")),
            Some(ts("01T11:00")),
            2,
        );
        summary.span = 2;
        summary.summary = true;
        inv.segments.retain(|s| s.sequence > 2);
        inv.segments.push(summary);
        let c = choose_restore(&inv, ts("01T07:00")).unwrap();
        assert_eq!(c.unread.len(), 1);
        assert!(!c.from_log_position);
    }

    /// A backup taken on a Galera node restores to its own point only: the window is that
    /// instant, a target after it is refused saying why, and at it nothing is replayed.
    #[test]
    fn a_galera_backup_restores_to_its_own_point_only() {
        use crate::timeline::fixtures::failover;
        let (segments, timelines) = failover();
        let mut full = backup(
            FULL,
            BackupKind::Full,
            "01T00:20",
            "01T00:30",
            "mysql-bin.000004",
        );
        full.gtid = Some(GtidPos::parse("0-1-5").unwrap());
        full.server_id = Some(1);
        full.galera = true;
        let inv = Inventory {
            backups: vec![full.clone()],
            segments,
            timelines,
            ..Default::default()
        };
        let e = choose_restore(&inv, ts("01T01:30")).unwrap_err();
        assert!(
            matches!(&e, RestoreRefusal::GaleraReplay { backup, .. } if backup == FULL),
            "{e}"
        );
        assert!(e.to_string().contains("Galera"), "{e}");
        let c = choose_restore(&inv, full.restore_point()).unwrap();
        assert!(c.segments.is_empty() && c.runs.is_empty(), "{c:?}");
        assert_eq!(
            (c.window.from, c.window.to),
            (full.restore_point(), full.restore_point())
        );
        // Not on a Galera node, the same backup replays on.
        full.galera = false;
        let inv = Inventory {
            backups: vec![full],
            ..inv
        };
        assert!(
            !choose_restore(&inv, ts("01T01:30"))
                .unwrap()
                .segments
                .is_empty()
        );
    }

    #[test]
    fn replay_crosses_a_failover_by_gtid_and_never_replays_a_branch() {
        use crate::timeline::fixtures::failover;
        let (segments, timelines) = failover();
        // A full taken on the replica: its own file name means nothing to the archive.
        let mut full = backup(
            FULL,
            BackupKind::Full,
            "01T00:20",
            "01T00:30",
            "mysql-bin.000001",
        );
        full.gtid = Some(GtidPos::parse("0-1-5").unwrap());
        full.server_id = Some(2);
        // Taken on the old primary after the switch point: it holds 0-1-11, a branch.
        let mut branch = backup(
            INC,
            BackupKind::Full,
            "01T02:20",
            "01T02:30",
            "mysql-bin.000005",
        );
        branch.gtid = Some(GtidPos::parse("0-1-11").unwrap());
        let inv = Inventory {
            backups: vec![full.clone(), branch],
            segments: segments.clone(),
            timelines: timelines.clone(),
            ..Default::default()
        };
        let c = choose_restore(&inv, ts("01T04:30")).unwrap();
        assert_eq!(names(&c).0, vec![FULL], "the branch backup is never chosen");
        assert_eq!(
            names(&c).1,
            vec![4, 5, 1_000_000_000_002, 1_000_000_000_003]
        );
        let runs: Vec<(u32, usize, usize, String, String)> = c
            .runs
            .iter()
            .map(|r| {
                (
                    r.timeline,
                    r.first,
                    r.count,
                    r.start_after
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                    r.stop_at
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            runs,
            [
                (0, 0, 2, "0-1-5".into(), "0-1-10".into()),
                (1, 2, 2, "0-1-10".into(), String::new()),
            ]
        );
        assert!(!c.from_log_position);
        // The run after the switch says when it took over.
        assert_eq!(
            c.runs.iter().map(|r| r.switched_at).collect::<Vec<_>>(),
            [None, Some(ts("01T02:00"))]
        );
        assert!(c.window.gaps.is_empty(), "{:?}", c.window);
        // Between the switch and the old primary's last (branch) event: the new timeline.
        let c = choose_restore(&inv, ts("01T02:40")).unwrap();
        assert_eq!(c.runs.len(), 2);
        // A backup with only a file offset, taken on a replica: its offset means nothing in
        // the primary's file of that name, and replay from a segment's start would apply
        // what it holds: past its completion, refused naming both servers; at it, no replay.
        let mut offset = full.clone();
        offset.gtid = None;
        offset.log_file = Some("mysql-bin.000004".into());
        let on_replica = Inventory {
            backups: vec![offset.clone()],
            segments: segments.clone(),
            timelines: timelines.clone(),
            ..Default::default()
        };
        let e = choose_restore(&on_replica, ts("01T01:30")).unwrap_err();
        assert!(
            matches!(
                e,
                RestoreRefusal::OffsetOnAnotherServer {
                    taken_on: 2,
                    wrote: 1,
                    ..
                }
            ),
            "{e}"
        );
        let c = choose_restore(&on_replica, offset.restore_point()).unwrap();
        assert!(!c.from_log_position && c.segments.is_empty(), "{c:?}");
        // The same with a MySQL GTID set (a dump of a replica records its file too): placed
        // by time and skipped by GTID, so it restores past its completion.
        let mut dump = offset.clone();
        dump.gtid_set = Some(
            crate::gtidset::GtidSet::parse("aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa:1-5").unwrap(),
        );
        let mysql = Inventory {
            backups: vec![dump],
            segments: segments.clone(),
            timelines: timelines.clone(),
            ..Default::default()
        };
        let c = choose_restore(&mysql, ts("01T01:30")).unwrap();
        assert!(!c.from_log_position && !c.segments.is_empty(), "{c:?}");
        // Taken on the primary: from its offset, and it cannot cross the switch.
        offset.server_id = Some(1);
        let inv = Inventory {
            backups: vec![offset],
            segments,
            timelines,
            ..Default::default()
        };
        let e = choose_restore(&inv, ts("01T04:30")).unwrap_err();
        assert!(
            matches!(e, RestoreRefusal::NoGtidAcrossSwitch { timeline: 1, .. }),
            "{e}"
        );
        let c = choose_restore(&inv, ts("01T01:30")).unwrap();
        assert!(c.from_log_position);
        assert_eq!(names(&c).1, vec![4, 5]);
    }

    #[test]
    fn a_position_the_archive_does_not_reach_back_to_is_refused() {
        use crate::timeline::fixtures::failover;
        let (mut segments, timelines) = failover();
        segments.remove(0); // segment 4: 0-1-1..8
        let mut full = backup(FULL, BackupKind::Full, "01T00:50", "01T01:00", "x.000001");
        full.gtid = Some(GtidPos::parse("0-1-5").unwrap());
        let inv = Inventory {
            backups: vec![full],
            segments,
            timelines,
            ..Default::default()
        };
        // The archive starts at 0-1-8: 0-1-6..8 are missing, so the window (by GTID, not by
        // the segments' times, which would reach) is the completion alone.
        let e = choose_restore(&inv, ts("01T02:30")).unwrap_err();
        let RestoreRefusal::OutsideWindow { window, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!((window.from, window.to), (ts("01T01:00"), ts("01T01:00")));
        assert!(
            choose_restore(&inv, ts("01T01:00"))
                .unwrap()
                .segments
                .is_empty()
        );
    }

    #[test]
    fn a_backup_holding_the_whole_archive_restores_up_to_its_last_event() {
        use crate::timeline::fixtures::failover;
        let (segments, timelines) = failover();
        // Taken at 04:30 holding 0-2-20: the archive's every transaction; its last segment
        // ends at 05:00 with nothing after 0-2-20, so every instant up to 05:00 is it.
        let mut b = backup(
            FULL,
            BackupKind::Full,
            "01T04:20",
            "01T04:30",
            "mysql-bin.000003",
        );
        b.gtid = Some(GtidPos::parse("0-2-20").unwrap());
        let inv = Inventory {
            backups: vec![b],
            segments,
            timelines,
            ..Default::default()
        };
        let c = choose_restore(&inv, ts("01T04:50")).unwrap();
        assert_eq!(
            (c.window.from, c.window.to),
            (ts("01T04:30"), ts("01T05:00"))
        );
        assert!(c.segments.is_empty(), "nothing to replay");
        assert!(choose_restore(&inv, ts("01T05:10")).is_err());
    }
}
