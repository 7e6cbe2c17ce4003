//! Property tests of DESIGN.md §5.4 over random histories and policies: safety (nothing the
//! recovery window needs is deleted) and liveness (what a rule keeps is kept, what no rule
//! keeps is deleted, segments behind the horizon go). Restorability, the horizon and every
//! rule are recomputed here naively (quadratic, no shared code with the planner) so a bug
//! in the planner cannot hide itself. A planner that keeps everything fails the liveness
//! checks; one that takes the horizon from `completedAt` fails the segment checks.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, HashSet};

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use tidemark_core::{
    Action, Backup, BackupKind, Inventory, Phase, Plan, Policy, PolicyInput, Reason, ReasonKind,
    RetentionDuration, Segment, plan,
};

const HOUR: i64 = 3600;
/// Minutes a generated backup takes.
const TAKES_MIN: i64 = 20;
/// Hours each generated segment spans.
const SEGMENT_H: i64 = 6;

fn base_time() -> Timestamp {
    common::ts("2026-06-01T00:00:00Z")
}

fn at(hours: i64) -> Timestamp {
    base_time() + SignedDuration::from_secs(hours * HOUR)
}

#[derive(Debug, Clone)]
struct Spec {
    start_h: i64,
    parent: Option<usize>,
    phase: u8,
    lock_h: Option<i64>,
    protected: bool,
    ttl_days: Option<u32>,
    newer: bool,
    /// Which backup name (directory) it lives under.
    name: u8,
    payload_missing: bool,
    /// Records the binlog file holding its consistent point (a pinned segment).
    log_pinned: bool,
    /// Uncommitted: its last deletion was interrupted.
    interrupted: bool,
    /// Uncommitted: minutes between its marker's last write and `now`.
    heartbeat_min: Option<i64>,
    /// Completed incremental: a committed synthetic full stands in for it.
    consolidated: bool,
    /// Its deletion was requested (`_deletion-requested.json`).
    deletion_requested: bool,
    /// A copy (a second store) needs it and has not received it yet.
    awaiting_copy: bool,
}

fn backup_spec() -> impl Strategy<Value = Spec> {
    (
        (
            0i64..2400,
            prop::option::weighted(0.6, 0usize..64),
            0u8..22,
            prop::option::weighted(0.1, 0i64..3000),
            prop::bool::weighted(0.05),
            prop::option::weighted(0.15, 0u32..60),
            prop::bool::weighted(0.03),
        ),
        (
            0u8..3,
            prop::bool::weighted(0.06),
            prop::bool::weighted(0.3),
            prop::bool::weighted(0.3),
            prop::option::weighted(0.5, 0i64..20),
            prop::bool::weighted(0.08),
            prop::bool::weighted(0.06),
            prop::bool::weighted(0.05),
        ),
    )
        .prop_map(
            |(
                (start_h, parent, phase, lock_h, protected, ttl_days, newer),
                (
                    name,
                    payload_missing,
                    log_pinned,
                    interrupted,
                    heartbeat_min,
                    consolidated,
                    deletion_requested,
                    awaiting_copy,
                ),
            )| Spec {
                start_h,
                parent,
                phase,
                lock_h,
                protected,
                ttl_days,
                newer,
                name,
                payload_missing,
                log_pinned,
                interrupted,
                heartbeat_min,
                consolidated,
                deletion_requested,
                awaiting_copy,
            },
        )
}

/// The segment whose span holds instant `t` (segments are `SEGMENT_H` long from hour 0).
fn segment_name_at(t: Timestamp) -> String {
    let h = (t.as_second() - base_time().as_second()) / HOUR;
    format!("mysql-bin.{:06}", h / SEGMENT_H + 1)
}

fn build_backups(specs: &[Spec], now: Timestamp) -> Vec<Backup> {
    let mut sorted = specs.to_vec();
    sorted.sort_by_key(|s| s.start_h);
    let mut out: Vec<Backup> = Vec::new();
    for (i, s) in sorted.iter().enumerate() {
        let started_at = at(s.start_h);
        let id = format!("b{i:03}");
        // Parents are earlier backups only (as real incrementals are).
        let kind = match s.parent {
            Some(p) if i > 0 => BackupKind::Incremental(format!("b{:03}", p % i)),
            _ => BackupKind::Full,
        };
        let phase = match s.phase {
            0..=15 => Phase::Completed,
            16 | 17 => Phase::Failed,
            18 => Phase::InProgress,
            19 | 20 => Phase::Uncommitted,
            _ => Phase::Malformed,
        };
        let completed_at = match phase {
            Phase::Completed | Phase::Failed => {
                Some(started_at + SignedDuration::from_mins(TAKES_MIN))
            }
            _ => None,
        };
        let kind = match phase {
            // What the catalog reads of an uncommitted or malformed directory.
            Phase::Uncommitted | Phase::Malformed => BackupKind::Full,
            _ => kind,
        };
        let uncommitted = phase == Phase::Uncommitted;
        out.push(Backup {
            id,
            name: format!("name-{}", s.name),
            kind,
            phase,
            started_at,
            completed_at,
            last_modified: started_at + SignedDuration::from_mins(TAKES_MIN),
            immutable_until: s.lock_h.map(at),
            ttl: s.ttl_days.map(|d| {
                RetentionDuration::new(d, tidemark_core::duration::DurationUnit::Days).unwrap()
            }),
            protected: s.protected,
            newer_format: s.newer,
            interrupted_delete: uncommitted && s.interrupted,
            log_file: (s.log_pinned && completed_at.is_some())
                .then(|| segment_name_at(completed_at.unwrap())),
            size: 10,
            consolidated_from: Vec::new(),
            // Mixed methods: some chains can be merged, some cannot.
            consolidatable: s.start_h % 3 != 0,
            payload_missing: s.payload_missing,
            heartbeat_at: s
                .heartbeat_min
                .filter(|_| uncommitted)
                .map(|m| now - SignedDuration::from_mins(m)),
            deletion_requested: s.deletion_requested,
            gtid: None,
            gtid_set: None,
            server_id: None,
            galera: false,
            held_for: Vec::new(),
            awaiting_copy: if s.awaiting_copy {
                vec!["dr".to_owned()]
            } else {
                Vec::new()
            },
            guarded: false,
        });
    }
    // Committed synthetic fulls standing in for some completed increments (seed 002).
    let by_id: HashMap<String, Backup> = out.iter().map(|b| (b.id.clone(), b.clone())).collect();
    for (s, b) in sorted.iter().zip(out.clone()) {
        if !s.consolidated || b.phase != Phase::Completed || b.kind == BackupKind::Full {
            continue;
        }
        let mut line = vec![b.id.clone()];
        let mut cur = b.kind.parent().cloned();
        while let Some(p) = cur.filter(|_| line.len() <= out.len()) {
            cur = by_id.get(&p).and_then(|x| x.kind.parent().cloned());
            line.push(p);
        }
        line.reverse();
        out.push(Backup {
            id: format!("{}s", b.id),
            kind: BackupKind::Full,
            consolidated_from: line,
            payload_missing: false,
            ..b
        });
    }
    out
}

/// Segments covering [0, 2600] hours in 6-hour pieces, with random holes, unknown last
/// events and unindexed or index-only entries.
fn segments() -> impl Strategy<Value = Vec<Segment>> {
    prop::collection::vec((0u8..40, 0u8..30, 0u8..40), 430..=440).prop_map(|flags| {
        flags
            .into_iter()
            .enumerate()
            .filter(|(_, (hole, _, _))| *hole != 0)
            .map(|(k, (_, unknown, odd))| {
                let k = k as i64;
                Segment {
                    indexed: odd != 1,
                    present: odd != 2,
                    ..Segment::new(
                        format!("mysql-bin.{:06}", k + 1),
                        (k + 1) as u64,
                        Some(at(k * SEGMENT_H)),
                        (unknown != 0).then(|| at(k * SEGMENT_H + SEGMENT_H)),
                        100,
                    )
                }
            })
            .collect()
    })
}

fn policy() -> impl Strategy<Value = PolicyInput> {
    (
        prop::option::of(1u32..120),
        prop::option::of(0i64..10),
        prop::option::of(0i64..10),
        prop::option::of(0i64..6),
        prop::option::of(0i64..6),
        prop::option::of(0i64..3),
        prop::option::of(0u32..30),
        (any::<bool>(), any::<bool>()),
        prop::option::weighted(0.3, 0i64..8),
        prop::option::weighted(0.35, 1u32..60),
        prop::sample::select(vec![
            "UTC",
            "Europe/Paris",
            "Asia/Kolkata",
            "America/New_York",
        ]),
    )
        .prop_map(
            |(w, last, d, wk, m, y, ft, (cover, consolidate), cap, pitr, tz)| PolicyInput {
                window: w.map(|n| format!("{n}d")),
                keep_last: last,
                keep_daily: d,
                keep_weekly: wk,
                keep_monthly: m,
                keep_yearly: y,
                failed_backups_ttl: ft.map(|n| format!("{n}d")),
                cover_window: Some(cover && w.is_some()),
                consolidate: Some(consolidate),
                max_deletions_per_pass: cap,
                // Not the planner's: the engine checks the newest backup before executing.
                require_verified: None,
                time_zone: Some(tz.to_owned()),
                point_in_time_window: pitr.map(|n| format!("{n}d")),
                // Not the planner's: the engine holds a tripped pass.
                deletion_guard_threshold: None,
                deletion_guard_window: None,
            },
        )
}

// ------------------------------------------------------------ the naive model

/// What the test knows about each backup, computed without the planner.
struct Model<'a> {
    inv: &'a Inventory,
    policy: &'a Policy,
    now: Timestamp,
    by_id: HashMap<&'a str, &'a Backup>,
    /// Replaced backup-id → the synthetic full standing in for it.
    stand_in: HashMap<&'a str, &'a Backup>,
}

impl<'a> Model<'a> {
    fn new(inv: &'a Inventory, policy: &'a Policy, now: Timestamp) -> Self {
        let mut by_id = HashMap::new();
        for b in &inv.backups {
            by_id.entry(b.id.as_str()).or_insert(b);
        }
        let mut stand_in = HashMap::new();
        for b in &inv.backups {
            if b.phase == Phase::Completed
                && b.kind == BackupKind::Full
                && let Some(last) = b.consolidated_from.last()
                && *last != b.id
            {
                stand_in.entry(last.as_str()).or_insert(b);
            }
        }
        Model {
            inv,
            policy,
            now,
            by_id,
            stand_in,
        }
    }

    fn parent(&self, b: &Backup) -> Option<&'a Backup> {
        let p = b.kind.parent()?.as_str();
        self.stand_in.get(p).or_else(|| self.by_id.get(p)).copied()
    }

    fn superseded(&self, b: &Backup) -> bool {
        self.stand_in
            .get(b.id.as_str())
            .is_some_and(|s| s.id != b.id)
    }

    /// Completed with its payload present, up to a full.
    fn restorable(&self, b: &Backup) -> bool {
        let mut cur = b;
        for _ in 0..=self.inv.backups.len() {
            if cur.phase != Phase::Completed || cur.payload_missing {
                return false;
            }
            match &cur.kind {
                BackupKind::Full => return true,
                BackupKind::Incremental(_) => match self.parent(cur) {
                    Some(p) => cur = p,
                    None => return false,
                },
            }
        }
        false
    }

    fn ttl_expired(&self, b: &Backup) -> bool {
        !self.in_progress(b)
            && !self.superseded(b)
            && (b.deletion_requested || b.ttl.is_some_and(|t| self.now > t.after(b.started_at)))
    }

    /// Running: known so, or a marker written less than ten minutes before the earlier of
    /// `now` and when the store was read.
    fn in_progress(&self, b: &Backup) -> bool {
        let at = self.inv.observed_at.map_or(self.now, |o| o.min(self.now));
        b.phase == Phase::InProgress
            || (b.phase == Phase::Uncommitted
                && b.heartbeat_at
                    .is_some_and(|h| at < h + SignedDuration::from_secs(600)))
    }

    /// The recovery points the rules rank, newest first.
    fn ranked(&self) -> Vec<&'a Backup> {
        let mut v: Vec<&Backup> = self
            .inv
            .backups
            .iter()
            .filter(|b| self.restorable(b) && !self.superseded(b) && !self.ttl_expired(b))
            .collect();
        v.sort_by(|a, b| (b.restore_point(), &b.id).cmp(&(a.restore_point(), &a.id)));
        v
    }

    /// The newest restorable backup that no synthetic full replaced.
    fn floor(&self) -> Option<&'a Backup> {
        self.inv
            .backups
            .iter()
            .filter(|b| self.restorable(b) && !self.superseded(b))
            .max_by(|a, b| (a.restore_point(), &a.id).cmp(&(b.restore_point(), &b.id)))
    }

    /// `[restore point, replay end]` of each restorable backup among `backups`, by a
    /// linear scan of `segments`.
    fn intervals(&self, backups: &[&Backup], segments: &[&Segment]) -> Vec<(Timestamp, Timestamp)> {
        let mut segs: Vec<&Segment> = segments.iter().copied().filter(|s| s.present).collect();
        segs.sort_by_key(|s| s.sequence);
        segs.dedup_by_key(|s| s.sequence);
        let here: HashSet<&str> = backups.iter().map(|b| b.id.as_str()).collect();
        backups
            .iter()
            .filter(|b| self.restorable(b) && self.chain_within(b, &here))
            .map(|b| {
                let c = b.restore_point();
                let mut end = c;
                if let Some(start) = segs
                    .iter()
                    .position(|s| s.last_event_at.is_some_and(|l| l >= c))
                    .and_then(|k| replay_begins(&segs, k, c))
                {
                    let mut prev = segs[start].sequence - 1;
                    for s in &segs[start..] {
                        if s.sequence != prev + 1 {
                            break;
                        }
                        prev = s.sequence;
                        if let Some(l) = s.last_event_at {
                            end = end.max(l);
                        }
                    }
                }
                (c, end)
            })
            .collect()
    }

    /// Whether every ancestor of `b` is among `here`.
    fn chain_within(&self, b: &Backup, here: &HashSet<&str>) -> bool {
        let mut cur = b;
        for _ in 0..=self.inv.backups.len() {
            if !here.contains(cur.id.as_str()) {
                return false;
            }
            match self.parent(cur) {
                Some(p) => cur = p,
                None => return true,
            }
        }
        false
    }

    /// `now − pointInTime.window`.
    /// (With coverWindow too, the earlier of the two starts.)
    fn pitr_start(&self) -> Option<Timestamp> {
        let start = self.policy.point_in_time_window?.before(self.now);
        Some(
            match self.policy.window.filter(|_| self.policy.cover_window) {
                Some(w) => start.min(w.before(self.now)),
                None => start,
            },
        )
    }

    /// The backup the point-in-time window replays from: the newest ranked one restoring
    /// at or before its start.
    fn pitr_cover(&self) -> Option<&'a Backup> {
        let start = self.pitr_start()?;
        self.ranked()
            .into_iter()
            .find(|b| b.restore_point() <= start)
    }

    /// Whether binlogs after `b` are kept for it: without a point-in-time window, every
    /// backup; with one, those from its cover on, and any a restore replays from.
    fn replays(&self, b: &Backup) -> bool {
        self.pitr_cover().is_none_or(|c| {
            b.restore_point() >= c.restore_point() || !b.held_for.is_empty() || b.guarded
        })
    }

    /// Start of the oldest retained committed backup (restorable or not) or malformed one
    /// that replays.
    fn horizon(&self, deleted: &HashSet<&str>) -> Option<Timestamp> {
        self.inv
            .backups
            .iter()
            .filter(|b| !deleted.contains(b.id.as_str()))
            .filter(|b| b.phase == Phase::Completed || b.phase == Phase::Malformed)
            .filter(|b| self.replays(b))
            .map(|b| b.started_at)
            .min()
    }

    /// Segments a retained restorable backup needs besides the time rule: the one holding
    /// its recorded position, and the one before its replay start when that start began
    /// after its restore point.
    fn pinned(&self, deleted: &HashSet<&str>) -> (HashSet<String>, HashSet<u64>) {
        let mut segs: Vec<&Segment> = self.inv.segments.iter().filter(|s| s.present).collect();
        segs.sort_by_key(|s| s.sequence);
        segs.dedup_by_key(|s| s.sequence);
        let mut files = HashSet::new();
        let mut sequences = HashSet::new();
        for b in &self.inv.backups {
            if deleted.contains(b.id.as_str()) || !self.restorable(b) || !self.replays(b) {
                continue;
            }
            files.extend(b.log_file.clone());
            let c = b.restore_point();
            if let Some(k) = segs
                .iter()
                .position(|s| s.last_event_at.is_some_and(|l| l >= c))
            {
                match replay_begins(&segs, k, c) {
                    Some(j) => sequences.extend(segs[j..k].iter().map(|s| s.sequence)),
                    None => {
                        sequences.insert(segs[k].sequence - 1);
                    }
                }
            }
        }
        (files, sequences)
    }

    fn gfs_reasons(&self) -> HashMap<&'a str, Vec<String>> {
        let mut out: HashMap<&str, Vec<String>> = HashMap::new();
        let tz = &self.policy.time_zone;
        type BucketKey = fn(&jiff::Zoned) -> String;
        let rules: [(u32, &str, BucketKey); 4] = [
            (self.policy.keep_daily, "daily", |z| z.date().to_string()),
            (self.policy.keep_weekly, "weekly", |z| {
                let w = z.date().iso_week_date();
                format!("{:04}-W{:02}", w.year(), w.week())
            }),
            (self.policy.keep_monthly, "monthly", |z| {
                format!("{:04}-{:02}", z.year(), z.month())
            }),
            (self.policy.keep_yearly, "yearly", |z| {
                format!("{:04}", z.year())
            }),
        ];
        for (count, label, key) in rules {
            let mut seen: Vec<String> = Vec::new();
            for b in self.ranked() {
                let k = key(&b.restore_point().to_zoned(tz.clone()));
                if seen.contains(&k) {
                    continue;
                }
                if seen.len() == count as usize {
                    break;
                }
                seen.push(k.clone());
                out.entry(b.id.as_str())
                    .or_default()
                    .push(format!("{label}:{k}"));
            }
        }
        out
    }
}

/// Where replay for a backup restored to `c` begins, given `k`, the first segment with a
/// known last event at or after `c`: `k` if it began by `c`, else the earliest of the
/// contiguous segments before it back to one that began by `c` (or ended before it).
fn replay_begins(segs: &[&Segment], k: usize, c: Timestamp) -> Option<usize> {
    let mut j = k;
    loop {
        if segs[j].first_event_at.is_some_and(|f| f <= c) {
            return Some(j);
        }
        if j == 0 || segs[j - 1].sequence + 1 != segs[j].sequence {
            return None;
        }
        j -= 1;
        if segs[j].last_event_at.is_some() {
            return Some(j + 1);
        }
    }
}

/// Every decision, compactly, for failure messages.
fn dump(p: &Plan) -> Vec<String> {
    p.backups
        .iter()
        .map(|d| {
            let reasons: Vec<String> = d.reasons.iter().map(ToString::to_string).collect();
            format!(
                "{} parent={:?} {:?} completed={:?} {:?} [{}]",
                d.backup.id,
                d.backup.kind.parent(),
                d.backup.phase,
                d.backup.completed_at.map(|c| c.to_string()),
                d.action,
                reasons.join(", ")
            )
        })
        .collect()
}

fn covered(intervals: &[(Timestamp, Timestamp)], t: Timestamp) -> bool {
    intervals.iter().any(|(a, b)| *a <= t && t <= *b)
}

/// The instants worth probing: every interval's ends and their neighbours, every segment
/// boundary. (`lost_instant` adds the instant just after its floor.)
fn probes(inv: &Inventory, intervals: &[(Timestamp, Timestamp)]) -> Vec<Timestamp> {
    let mut probes: Vec<Timestamp> = intervals
        .iter()
        .flat_map(|(a, b)| {
            [
                *a,
                *b,
                *a - SignedDuration::from_secs(1),
                *a + SignedDuration::from_secs(1),
                *b - SignedDuration::from_secs(1),
            ]
        })
        .collect();
    for s in &inv.segments {
        probes.extend(s.last_event_at);
        probes.extend(s.first_event_at);
    }
    probes.sort();
    probes.dedup();
    probes
}

/// Safety 3: an instant that was restorable by replay before the pass, after the oldest
/// retained restore point (after `floor` instead, the start of a point-in-time window) and
/// up to the last restorable instant, is restorable after it. Returns the first instant
/// lost.
fn lost_instant(
    before: &[(Timestamp, Timestamp)],
    after: &[(Timestamp, Timestamp)],
    probes: &[Timestamp],
    floor: Option<Timestamp>,
) -> Option<Timestamp> {
    let t_end = before
        .iter()
        .filter(|(a, b)| b > a)
        .map(|(_, b)| *b)
        .max()?;
    let t0 = after.iter().map(|(a, _)| *a).min()?;
    // (A point-in-time window promises its instants even before the oldest retained point.)
    let t0 = floor.unwrap_or(t0);
    // The instants just after a point-in-time window's start may be covered by no interval
    // end: the window may start between two backups.
    let after_floor = floor.map(|f| f + SignedDuration::from_secs(1));
    probes.iter().copied().chain(after_floor).find(|&t| {
        t > t0
            && t <= t_end
            && before.iter().any(|(a, b)| b > a && *a < t && t <= *b)
            && !covered(after, t)
    })
}

/// The index cut into shards of `size` entries (by sequence), as the store keeps it; each
/// shard that qualifies for a summary (contiguous, present, times known and growing) is
/// replaced by one. Returns the summarised inventory and each summary's segments.
fn summarise(inv: &Inventory, size: usize) -> (Inventory, HashMap<u64, Vec<Segment>>) {
    let mut indexed: Vec<&Segment> = inv.segments.iter().filter(|s| s.indexed).collect();
    indexed.sort_by_key(|s| s.sequence);
    let mut out = Inventory {
        backups: inv.backups.clone(),
        segments: inv
            .segments
            .iter()
            .filter(|s| !s.indexed)
            .cloned()
            .collect(),
        leftovers: inv.leftovers.clone(),
        observed_at: inv.observed_at,
        timelines: inv.timelines.clone(),
    };
    let mut members = HashMap::new();
    for chunk in indexed.chunks(size) {
        let ordered = chunk.iter().all(|s| {
            s.present
                && s.first_event_at.is_some()
                && s.last_event_at.is_some()
                && s.first_event_at <= s.last_event_at
        }) && chunk.windows(2).all(|w| {
            w[1].sequence == w[0].sequence + 1 && w[0].last_event_at <= w[1].first_event_at
        });
        if !ordered {
            out.segments.extend(chunk.iter().map(|s| (*s).clone()));
            continue;
        }
        let (first, last) = (chunk[0], chunk[chunk.len() - 1]);
        out.segments.push(Segment {
            span: chunk.len() as u64,
            summary: true,
            ..Segment::new(
                first.name.clone(),
                first.sequence,
                first.first_event_at,
                last.last_event_at,
                chunk.iter().map(|s| s.size).sum(),
            )
        });
        members.insert(first.sequence, chunk.iter().map(|s| (*s).clone()).collect());
    }
    (out, members)
}

/// Plans over summaries the way the store does — read the shards a plan's horizon
/// reaches, plan again — and checks the result is the plan of the fully read index.
fn check_summaries_plan_like_the_full_index(
    inv: &Inventory,
    policy: &Policy,
    now: Timestamp,
    full: &Plan,
    shard_size: usize,
) -> Result<(), TestCaseError> {
    let (mut summarised, mut members) = summarise(inv, shard_size);
    let mut p = plan(policy, &summarised, now);
    loop {
        let read: Vec<u64> = p
            .summaries_to_read(&summarised.segments)
            .iter()
            .map(|s| s.sequence)
            .collect();
        if read.is_empty() {
            break;
        }
        summarised
            .segments
            .retain(|s| !(s.summary && read.contains(&s.sequence)));
        for seq in read {
            summarised.segments.extend(members.remove(&seq).unwrap());
        }
        p = plan(policy, &summarised, now);
    }
    prop_assert_eq!(&p.backups, &full.backups);
    prop_assert_eq!(p.horizon, full.horizon);
    prop_assert_eq!(&p.recovery_window, &full.recovery_window);
    prop_assert_eq!(&p.segments, &full.segments);
    Ok(())
}

/// Safety: nothing the recovery window needs is deleted.
fn check_safety(m: &Model, p: &Plan) -> Result<(), TestCaseError> {
    let (inv, now) = (m.inv, m.now);
    let action: HashMap<&str, Action> = p
        .backups
        .iter()
        .map(|d| (d.backup.id.as_str(), d.action))
        .collect();
    let deleted: HashSet<&str> = p.deletions().map(|d| d.backup.id.as_str()).collect();

    // 1. The newest restorable backup, and its chain, is never deleted.
    let mut cur = m.floor();
    while let Some(b) = cur {
        prop_assert_ne!(
            action[b.id.as_str()],
            Action::Delete,
            "floor chain {}",
            b.id
        );
        cur = m.parent(b);
    }

    // 2. Every retained restorable (or running) incremental keeps its whole chain.
    for b in inv
        .backups
        .iter()
        .filter(|b| !deleted.contains(b.id.as_str()))
    {
        if !(m.restorable(b) || m.in_progress(b)) {
            continue;
        }
        let mut cur = b;
        for _ in 0..inv.backups.len() {
            let Some(parent) = m.parent(cur) else { break };
            prop_assert_ne!(
                action[parent.id.as_str()],
                Action::Delete,
                "{} needs {}: {:?}",
                b.id,
                parent.id,
                dump(p)
            );
            cur = parent;
        }
    }

    // 4. Nothing locked, protected, running, malformed or of a newer format is deleted;
    // nothing that cannot be restored counts for a rule.
    for d in &p.backups {
        let b = &d.backup;
        if d.action == Action::Delete {
            prop_assert!(
                b.immutable_until.is_none_or(|u| u <= now),
                "locked {}",
                b.id
            );
            prop_assert!(
                !b.protected && !b.newer_format && !m.in_progress(b) && b.phase != Phase::Malformed,
                "{}: {:?}",
                b.id,
                dump(p)
            );
            // A completed backup a copy has not received yet stays (a broken one cannot
            // be copied, and goes as a broken one does).
            prop_assert!(
                b.awaiting_copy.is_empty() || b.phase != Phase::Completed || !m.restorable(b),
                "{} deleted before its copy: {:?}",
                b.id,
                dump(p)
            );
        }
        if !m.restorable(b) {
            prop_assert!(
                !d.reasons.iter().any(|r| r.is_policy_rule()
                    && !matches!(r, Reason::FailedBackupsTtl | Reason::Ttl)
                    || *r == Reason::Floor),
                "{} is not restorable but counts: {:?}",
                b.id,
                d.reasons
            );
        }
    }
    if m.policy.max_deletions_per_pass > 0 {
        prop_assert!(p.deletions().count() <= m.policy.max_deletions_per_pass as usize);
    }

    // Segments: only behind the horizon — the *start* of the oldest retained committed
    // backup — and never one a retained backup's replay starts from.
    let horizon = m.horizon(&deleted);
    prop_assert_eq!(p.horizon, horizon);
    let (pinned_files, pinned_seqs) = m.pinned(&deleted);
    let cut = inv
        .segments
        .iter()
        .filter(|s| {
            s.indexed
                && s.last_event_at
                    .is_some_and(|l| horizon.is_some_and(|h| l < h))
        })
        .map(|s| s.sequence)
        .max();
    for d in &p.segments.delete {
        let seg = inv
            .segments
            .iter()
            .find(|x| x.name == d.name && x.sequence == d.sequence)
            .unwrap();
        prop_assert!(!pinned_files.contains(&seg.name) && !pinned_seqs.contains(&seg.sequence));
        if seg.indexed {
            prop_assert!(
                seg.last_event_at
                    .is_some_and(|l| horizon.is_some_and(|h| l < h)),
                "{} (last event {:?}) is not behind {:?}",
                seg.name,
                seg.last_event_at,
                horizon
            );
        } else {
            prop_assert!(cut.is_some_and(|c| seg.sequence < c), "{}", seg.name);
        }
    }

    // 3. No gap inside the retained range.
    let all: Vec<&Backup> = inv.backups.iter().collect();
    let all_segments: Vec<&Segment> = inv.segments.iter().collect();
    let gone: HashSet<(u64, &str)> = p
        .segments
        .delete
        .iter()
        .map(|d| (d.sequence, d.name.as_str()))
        .collect();
    let after_segments: Vec<&Segment> = inv
        .segments
        .iter()
        .filter(|s| !gone.contains(&(s.sequence, s.name.as_str())))
        .collect();
    let after_backups: Vec<&Backup> = all
        .iter()
        .copied()
        .filter(|b| !deleted.contains(b.id.as_str()))
        .collect();
    let before = m.intervals(&all, &all_segments);
    let after = m.intervals(&after_backups, &after_segments);
    let probes = probes(inv, &before);
    if let Some(t) = lost_instant(&before, &after, &probes, m.pitr_start()) {
        prop_assert!(
            false,
            "instant {t} lost; after {:?}; decisions {:?}",
            after,
            dump(p)
        );
    }
    // Every kept backup restores to its own point, binlogs or not.
    for b in after_backups.iter().filter(|b| m.restorable(b)) {
        prop_assert!(
            covered(&after, b.restore_point()),
            "{} kept but its own point is lost; {:?}",
            b.id,
            dump(p)
        );
    }
    // With coverWindow, every restorable instant of [now - window, now] stays restorable
    // (but a backup deleted by its own expired `ttl`, or marked for deletion, takes its
    // restore point with it); with pointInTime.window, every one of [now - it, now].
    let promised = [
        m.policy.window.filter(|_| m.policy.cover_window),
        m.policy.point_in_time_window,
    ];
    for w in promised.into_iter().flatten() {
        // (A replaced backup shares its synthetic full's TTL: its own counts here.)
        let others: Vec<&Backup> = all
            .iter()
            .copied()
            .filter(|b| !b.deletion_requested && b.ttl.is_none_or(|t| now <= t.after(b.started_at)))
            .collect();
        let before_cover = m.intervals(&others, &all_segments);
        let from = w.before(now);
        for &t in &probes {
            if t >= from && t <= now && covered(&before_cover, t) {
                prop_assert!(covered(&after, t), "window instant {t} lost; {:?}", dump(p));
            }
        }
    }
    Ok(())
}

/// Liveness: what a rule keeps is kept with that reason; every reason a kept backup has
/// is true of it; segments behind the horizon are deleted.
fn check_liveness(m: &Model, p: &Plan) -> Result<(), TestCaseError> {
    let (inv, now, policy) = (m.inv, m.now, m.policy);
    let deleted: HashSet<&str> = p.deletions().map(|d| d.backup.id.as_str()).collect();
    let ranked = m.ranked();
    let keep_last: HashSet<&str> = ranked
        .iter()
        .take(policy.keep_last as usize)
        .map(|b| b.id.as_str())
        .collect();
    let gfs = m.gfs_reasons();
    let cutoff = policy.window.map(|w| w.before(now));
    let cover = cutoff
        .filter(|_| policy.cover_window)
        .and_then(|c| ranked.iter().find(|b| b.restore_point() <= c));
    let floor = m.floor();
    let children: HashMap<&str, Vec<&Backup>> = {
        let mut c: HashMap<&str, Vec<&Backup>> = HashMap::new();
        for b in &inv.backups {
            if let Some(parent) = m.parent(b) {
                c.entry(parent.id.as_str()).or_default().push(b);
            }
        }
        c
    };
    let decision: HashMap<&str, &tidemark_core::BackupDecision> = p
        .backups
        .iter()
        .map(|d| (d.backup.id.as_str(), d))
        .collect();
    let kept_only_as_failed = |d: &tidemark_core::BackupDecision| {
        d.reasons
            .iter()
            .filter(|r| r.kind() == ReasonKind::Keep)
            .all(|r| *r == Reason::FailedBackupsTtl)
    };

    // L1 window, L2 keepLast (and GFS): kept, with the reason.
    for b in &ranked {
        let d = decision[b.id.as_str()];
        let want = |r: &Reason| d.reasons.contains(r) && d.action != Action::Delete;
        if cutoff.is_some_and(|c| b.restore_point() >= c) {
            prop_assert!(want(&Reason::Window), "{} is in the window: {:?}", b.id, d);
        }
        if keep_last.contains(b.id.as_str()) {
            prop_assert!(
                want(&Reason::KeepLast),
                "{} is among keepLast: {:?}",
                b.id,
                d
            );
        }
    }

    // L3 every reason is true of its backup, so whatever no rule keeps is deleted.
    // Under maxDeletionsPerPass: when the pass without a cap deletes no more than it, the
    // cap changes nothing; when it deletes more, this pass defers only backups that pass
    // deletes. (Which ones go is a choice: deferring a backup can pull others back in —
    // its chain, or a bridge over a hole — and no one order is best. A cap smaller than
    // the oldest chain can leave every candidate deferred: deleting from the middle of the
    // history would open a hole.)
    let cap = policy.max_deletions_per_pass as usize;
    let uncapped = (cap > 0).then(|| {
        let mut free = policy.clone();
        free.max_deletions_per_pass = 0;
        plan(&free, inv, now)
    });
    let capped = uncapped
        .as_ref()
        .is_some_and(|u| u.deletions().count() > cap);
    if let Some(u) = &uncapped {
        if capped {
            for d in p
                .backups
                .iter()
                .filter(|d| d.reasons.contains(&Reason::Deferred))
            {
                prop_assert!(
                    u.deletions().any(|x| x.backup.id == d.backup.id),
                    "{} deferred but not deleted without the cap",
                    d.backup.id
                );
            }
        } else {
            prop_assert_eq!(&p.backups, &u.backups, "a cap not reached changes the plan");
        }
    }
    let all: Vec<&Backup> = inv.backups.iter().collect();
    let all_segments: Vec<&Segment> = inv.segments.iter().collect();
    let before = m.intervals(&all, &all_segments);
    let probes = probes(inv, &before);
    for d in &p.backups {
        let b = &d.backup;
        prop_assert!(!d.reasons.is_empty(), "{} has no reason", b.id);
        match d.action {
            Action::Delete => prop_assert!(
                d.reasons.iter().all(|r| r.kind() != ReasonKind::Keep),
                "{:?}",
                d
            ),
            Action::Keep | Action::Consolidate => prop_assert!(
                d.reasons.iter().any(|r| r.kind() == ReasonKind::Keep)
                    && d.reasons.iter().all(|r| r.kind() != ReasonKind::Delete),
                "{:?}",
                d
            ),
        }
        prop_assert_eq!(
            d.reasons.contains(&Reason::Broken),
            b.phase == Phase::Completed && !m.restorable(b),
            "{:?}",
            d
        );
        for r in &d.reasons {
            let ok = match r {
                Reason::Window => m.restorable(b) && cutoff.is_some_and(|c| b.restore_point() >= c),
                Reason::KeepLast => keep_last.contains(b.id.as_str()),
                Reason::Daily(_) | Reason::Weekly(_) | Reason::Monthly(_) | Reason::Yearly(_) => {
                    gfs.get(b.id.as_str())
                        .is_some_and(|v| v.contains(&r.to_string()))
                }
                Reason::Floor => floor.is_some_and(|f| f.id == b.id),
                Reason::CoverWindow => cover.is_some_and(|c| c.id == b.id),
                Reason::PointInTime => policy.point_in_time_window.is_some_and(|w| {
                    ranked
                        .iter()
                        .find(|x| x.restore_point() <= w.before(now))
                        .is_some_and(|c| c.id == b.id)
                }),
                // Kept before the backup the point-in-time window replays from, with no
                // restore replaying from it.
                Reason::Standalone => {
                    m.restorable(b)
                        && d.action != Action::Delete
                        && !d
                            .reasons
                            .iter()
                            .any(|r| matches!(r, Reason::ConsolidateInto(_)))
                        && !m.replays(b)
                }
                Reason::DeletionGuard => false,
                // A kept child pins its ancestors, unless it is a failed attempt or kept
                // only as one — and then still when a descendant needs it.
                Reason::Chain(child) => children.get(b.id.as_str()).is_some_and(|cs| {
                    cs.iter().any(|c| {
                        let dc = decision[c.id.as_str()];
                        c.id == *child
                            && dc.action != Action::Delete
                            && (dc.reasons.iter().any(|r| matches!(r, Reason::Chain(_)))
                                || (c.phase != Phase::Failed && !kept_only_as_failed(dc)))
                    })
                }),
                Reason::Locked(t) => {
                    *t > now && {
                        // Its own lock, or a descendant's.
                        let mut stack = vec![b.id.as_str()];
                        let mut found = false;
                        let mut steps = 0;
                        while let Some(id) = stack.pop() {
                            steps += 1;
                            if steps > 4 * inv.backups.len() {
                                break;
                            }
                            if m.by_id
                                .get(id)
                                .is_some_and(|x| x.immutable_until == Some(*t))
                            {
                                found = true;
                                break;
                            }
                            stack.extend(
                                children
                                    .get(id)
                                    .into_iter()
                                    .flatten()
                                    .map(|c| c.id.as_str()),
                            );
                        }
                        found
                    }
                }
                Reason::Protected => b.protected,
                Reason::Restore(by) => b.held_for.contains(by),
                Reason::Copy(name) => b.awaiting_copy.contains(name),
                Reason::NewerFormat => b.newer_format,
                Reason::InProgress => m.in_progress(b),
                Reason::Malformed => b.phase == Phase::Malformed,
                Reason::Ttl => b.ttl.is_some() && !m.ttl_expired(b),
                Reason::FailedBackupsTtl => {
                    let from = match b.phase {
                        Phase::Failed => Some(b.restore_point()),
                        Phase::Uncommitted if !m.in_progress(b) => Some(b.last_modified),
                        Phase::Completed if !m.restorable(b) => Some(b.restore_point()),
                        _ => None,
                    };
                    from.is_some_and(|f| {
                        !b.interrupted_delete
                            && policy.failed_backups_ttl.is_none_or(|t| now <= t.after(f))
                    })
                }
                Reason::Deferred => capped,
                Reason::ConsolidateInto(_) => policy.consolidate,
                // Deleting it too would lose an instant. (Under a reached deletion cap a
                // bridge may have become redundant by a later deferral: it could not be
                // deleted in this pass anyway, and the next pass looks again.)
                Reason::Gap if capped => true,
                Reason::Gap => {
                    let without: Vec<&Backup> = all
                        .iter()
                        .copied()
                        .filter(|x| !deleted.contains(x.id.as_str()) && x.id != b.id)
                        .collect();
                    let gone: HashSet<(u64, &str)> = p
                        .segments
                        .delete
                        .iter()
                        .map(|d| (d.sequence, d.name.as_str()))
                        .collect();
                    let segs: Vec<&Segment> = inv
                        .segments
                        .iter()
                        .filter(|s| !gone.contains(&(s.sequence, s.name.as_str())))
                        .collect();
                    let after = m.intervals(&without, &segs);
                    lost_instant(&before, &after, &probes, m.pitr_start()).is_some()
                        // Under a point-in-time window, its own point inside it.
                        || m.pitr_start().is_some_and(|s| {
                            b.restore_point() >= s && !covered(&after, b.restore_point())
                        })
                }
                Reason::Broken => b.phase == Phase::Completed && !m.restorable(b),
                // Delete reasons are checked by the action above.
                Reason::Expired
                | Reason::TtlExpired
                | Reason::Failed
                | Reason::Uncommitted
                | Reason::InterruptedDelete
                | Reason::Consolidated(_) => true,
                // A pass gives it only to a backup marked for deletion, and (like an
                // expired TTL) only when nothing else keeps it.
                Reason::DeletionRequested => b.deletion_requested && m.ttl_expired(b),
            };
            prop_assert!(ok, "{} has the unfounded reason {}: {:?}", b.id, r, dump(p));
        }
    }

    // L4 every segment behind the horizon is deleted, unless a retained backup's replay
    // needs it or its last event time is unknown.
    let horizon = m.horizon(&deleted);
    let (pinned_files, pinned_seqs) = m.pinned(&deleted);
    let gone: HashSet<(u64, &str)> = p
        .segments
        .delete
        .iter()
        .map(|d| (d.sequence, d.name.as_str()))
        .collect();
    for s in &inv.segments {
        let behind = s
            .last_event_at
            .is_some_and(|l| horizon.is_some_and(|h| l < h));
        if s.indexed
            && s.present
            && !s.summary
            && behind
            && !pinned_files.contains(&s.name)
            && !pinned_seqs.contains(&s.sequence)
        {
            prop_assert!(
                gone.contains(&(s.sequence, s.name.as_str())),
                "{} is behind the horizon {:?} and kept",
                s.name,
                horizon
            );
        }
    }
    Ok(())
}

/// Safety 7: carrying out the consolidations opens no hole and strands no increment, and
/// the pass after a crash between the commit of the fulls and the deletions finishes it.
fn check_consolidation(m: &Model, p: &Plan) -> Result<(), TestCaseError> {
    let (inv, now, policy) = (m.inv, m.now, m.policy);
    let deleted: HashSet<&str> = p.deletions().map(|d| d.backup.id.as_str()).collect();
    let mut merged: HashMap<&str, &str> = HashMap::new();
    let mut targets: Vec<&Backup> = Vec::new();
    for d in p.backups.iter().filter(|d| d.action == Action::Consolidate) {
        match d.reasons.as_slice() {
            [Reason::ConsolidateInto(t)] => {
                merged.insert(d.backup.id.as_str(), t.as_str());
            }
            _ => targets.push(&d.backup),
        }
    }
    prop_assert_eq!(
        merged.values().collect::<HashSet<_>>().len(),
        targets.len(),
        "every merge names a target: {:?}",
        dump(p)
    );
    if targets.is_empty() {
        return Ok(());
    }
    let synthetic = |id: &str| format!("{id}-c");
    // The store after the consolidations and this pass's deletions.
    let mut next = inv.clone();
    next.backups
        .retain(|b| !deleted.contains(b.id.as_str()) && !merged.contains_key(b.id.as_str()));
    for t in &targets {
        prop_assert!(t.consolidatable && t.phase == Phase::Completed);
        next.backups.retain(|b| b.id != t.id);
        let mut line = vec![t.id.clone()];
        let mut cur = m.parent(t);
        while let Some(b) = cur.filter(|_| line.len() <= inv.backups.len()) {
            line.push(b.id.clone());
            cur = m.parent(b);
        }
        line.reverse();
        next.backups.push(Backup {
            id: synthetic(&t.id),
            kind: BackupKind::Full,
            consolidated_from: line,
            ..(*t).clone()
        });
    }
    let next_model = Model::new(&next, policy, now);
    for b in &next.backups {
        // A restorable backup stays restorable (one already broken may lose its parent).
        if m.by_id.get(b.id.as_str()).is_some_and(|x| m.restorable(x)) {
            prop_assert!(
                b.kind.parent().is_none_or(
                    |p| !merged.contains_key(p.as_str()) || next_model.parent(b).is_some()
                ),
                "{} builds on merged {:?}: {:?}",
                b.id,
                b.kind.parent(),
                dump(p)
            );
        }
    }
    let gone: HashSet<(u64, &str)> = p
        .segments
        .delete
        .iter()
        .map(|d| (d.sequence, d.name.as_str()))
        .collect();
    let segs: Vec<&Segment> = inv
        .segments
        .iter()
        .filter(|s| !gone.contains(&(s.sequence, s.name.as_str())))
        .collect();
    let after_backups: Vec<&Backup> = inv
        .backups
        .iter()
        .filter(|b| !deleted.contains(b.id.as_str()))
        .collect();
    let after = m.intervals(&after_backups, &segs);
    let next_refs: Vec<&Backup> = next.backups.iter().collect();
    let consolidated = next_model.intervals(&next_refs, &segs);
    if let Some(t) = lost_instant(&after, &consolidated, &probes(inv, &after), m.pitr_start()) {
        prop_assert!(false, "consolidation loses {t}: {:?}", dump(p));
    }
    // The pass after a crash between the commits and the deletions: the replaced targets
    // go, and no chain holds a merged ancestor any more.
    let mut crashed = inv.clone();
    crashed.backups.retain(|b| !deleted.contains(b.id.as_str()));
    for t in &targets {
        crashed.backups.push(
            next.backups
                .iter()
                .find(|b| b.id == synthetic(&t.id))
                .unwrap()
                .clone(),
        );
    }
    let p2 = plan(policy, &crashed, now);
    for d in p2
        .backups
        .iter()
        .filter(|_| policy.max_deletions_per_pass == 0)
    {
        let id = d.backup.id.as_str();
        if targets.iter().any(|t| t.id == id) {
            prop_assert_eq!(
                &d.reasons,
                &vec![Reason::Consolidated(synthetic(id))],
                "{} after the commit: {:?}",
                id,
                dump(&p2)
            );
        }
        if merged.contains_key(id) {
            prop_assert!(
                !d.reasons.iter().any(|r| matches!(r, Reason::Chain(_))),
                "{} after the commit: {:?}",
                id,
                dump(&p2)
            );
        }
    }
    Ok(())
}

/// Safety 8: a restore to any instant of the window (outside its gaps) finds a chain and
/// the contiguous segments up to it; any other instant is refused.
fn check_restore(m: &Model) -> Result<(), TestCaseError> {
    let inv = m.inv;
    let standing = tidemark_core::standing(inv);
    let all: Vec<&Backup> = inv.backups.iter().collect();
    let segs: Vec<&Segment> = inv.segments.iter().collect();
    let probes = probes(inv, &m.intervals(&all, &segs));
    // About 40 probes a case: each restore choice reads the whole inventory.
    for &t in probes.iter().step_by((probes.len() / 40).max(1)) {
        let inside = standing.window.as_ref().is_some_and(|w| {
            w.from <= t && t <= w.to && !w.gaps.iter().any(|g| g.from < t && t < g.to)
        });
        match tidemark_core::choose_restore(inv, t) {
            Ok(c) => {
                prop_assert!(
                    inside,
                    "restore to {t} outside the window: {:?}",
                    standing.window
                );
                let last = c.chain.last().unwrap();
                prop_assert!(last.restore_point() <= t);
                prop_assert_eq!(&c.chain[0].kind, &BackupKind::Full);
                prop_assert!(c.chain.iter().all(|b| m.restorable(b)));
                prop_assert!(standing.restorable.contains(&last.id));
                for w in c.segments.windows(2) {
                    prop_assert_eq!(w[1].sequence, w[0].last_sequence() + 1);
                }
                prop_assert!(c.segments.iter().all(|s| s.present));
                if t > last.restore_point() {
                    prop_assert!(!c.segments.is_empty(), "replay to {t} needs segments");
                }
            }
            Err(e) => prop_assert!(!inside, "{t} is inside the window but refused: {e}"),
        }
    }
    Ok(())
}

fn check_invariants(
    inv: &Inventory,
    input: &PolicyInput,
    now: Timestamp,
    shard_size: usize,
    shuffle: &[usize],
) -> Result<(), TestCaseError> {
    let Ok(policy) = input.validate() else {
        return Ok(());
    };
    let p = plan(&policy, inv, now);
    prop_assert_eq!(p.backups.len(), inv.backups.len());
    let m = Model::new(inv, &policy, now);
    check_safety(&m, &p)?;
    check_liveness(&m, &p)?;
    check_consolidation(&m, &p)?;
    check_restore(&m)?;

    // 5. Deterministic whatever the listing order.
    let mut shuffled = inv.clone();
    let n = shuffled.backups.len();
    for (i, &j) in shuffle.iter().enumerate().take(n) {
        shuffled.backups.swap(i, j % n);
    }
    shuffled.segments.reverse();
    let p2 = plan(&policy, &shuffled, now);
    prop_assert_eq!(&p, &p2);

    // 6. Planning over index shard summaries gives the same plan.
    check_summaries_plan_like_the_full_index(inv, &policy, now, &p, shard_size)
}

/// 600 cases by default; `PROPTEST_CASES=N` for a longer hunt.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn planner_invariants(
        specs in prop::collection::vec(backup_spec(), 0..48),
        segs in segments(),
        policy in policy(),
        now_h in 2400i64..3200,
        on_the_edge in prop::option::weighted(0.3, any::<prop::sample::Index>()),
        shard_size in 1usize..48,
        shuffle in prop::collection::vec(any::<usize>(), 48),
        observed_before in prop::option::weighted(0.3, 0i64..60),
    ) {
        let mut now = at(now_h);
        // Sometimes put a restore point exactly on the window's edge.
        if let (Some(pick), Some(w)) = (on_the_edge, policy.window.as_deref()) {
            let backups = build_backups(&specs, now);
            let completed: Vec<Timestamp> =
                backups.iter().filter_map(|b| b.completed_at).collect();
            if !completed.is_empty() {
                let w: RetentionDuration = w.parse().unwrap();
                now = w.after(completed[pick.index(completed.len())]);
            }
        }
        // Sometimes the store was read before `now` (a pass evaluated in the future): a
        // marker fresh then is fresh.
        let observed_at = observed_before.map(|m| now - SignedDuration::from_mins(m));
        let inv = Inventory {
            backups: build_backups(&specs, observed_at.unwrap_or(now)),
            segments: segs,
            observed_at,
            ..Default::default()
        };
        check_invariants(&inv, &policy, now, shard_size, &shuffle)?;
    }
}

/// Issue 45 §2: a policy change's preview is the difference of the two plans — what the new
/// one deletes and the current one keeps, and back — and its lost instants are exactly the
/// point-in-time instants the current plan's window restores and the new one's does not.
fn check_preview(
    inv: &Inventory,
    current: &PolicyInput,
    new: &PolicyInput,
    now: Timestamp,
) -> Result<(), TestCaseError> {
    let (Ok(a), Ok(b)) = (current.validate(), new.validate()) else {
        return Ok(());
    };
    let (pa, pb) = (plan(&a, inv, now), plan(&b, inv, now));
    let change = tidemark_core::preview::compare(&pa, &pb);
    let deleted =
        |p: &Plan| -> HashSet<String> { p.deletions().map(|d| d.backup.id.clone()).collect() };
    let (da, db) = (deleted(&pa), deleted(&pb));
    let ids = |v: &[tidemark_core::preview::ChangedBackup]| -> HashSet<String> {
        v.iter().map(|c| c.backup_id.clone()).collect()
    };
    prop_assert_eq!(ids(&change.newly_deleted), &db - &da);
    prop_assert_eq!(ids(&change.newly_kept), &da - &db);
    let pieces_a = tidemark_core::preview::pieces(pa.recovery_window.as_ref());
    let pieces_b = tidemark_core::preview::pieces(pb.recovery_window.as_ref());
    let inside =
        |v: &[tidemark_core::Interval], t: Timestamp| v.iter().any(|i| i.from <= t && t <= i.to);
    let mut probes: Vec<Timestamp> = Vec::new();
    for i in pieces_a.iter().chain(&pieces_b).chain(&change.lost) {
        for t in [i.from, i.to] {
            probes.extend([
                t,
                t - SignedDuration::from_secs(1),
                t + SignedDuration::from_secs(1),
            ]);
        }
    }
    for t in probes {
        let lost_here = change.lost.iter().any(|l| l.from < t && t < l.to);
        if inside(&pieces_a, t) && !inside(&pieces_b, t) {
            prop_assert!(
                inside(&change.lost, t),
                "{t} lost but not reported: {:?}",
                change.lost
            );
        }
        if lost_here {
            prop_assert!(
                inside(&pieces_a, t) && !inside(&pieces_b, t),
                "{t} reported lost: {:?}",
                change.lost
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases() / 2))]

    #[test]
    fn a_preview_is_the_difference_of_the_two_plans(
        specs in prop::collection::vec(backup_spec(), 0..48),
        segs in segments(),
        current in policy(),
        new in policy(),
        now_h in 2400i64..3200,
    ) {
        let now = at(now_h);
        let inv = Inventory {
            backups: build_backups(&specs, now),
            segments: segs,
            ..Default::default()
        };
        check_preview(&inv, &current, &new, now)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases() / 2))]

    /// `window_after` (what a pass whose guard held segment deletions reports) is the
    /// plan's own window when nothing is held: the same rules, computed from what stays.
    #[test]
    fn the_window_after_a_plan_is_the_plans_own(
        specs in prop::collection::vec(backup_spec(), 0..48),
        segs in segments(),
        policy in policy(),
        now_h in 2400i64..3200,
    ) {
        let now = at(now_h);
        let inv = Inventory {
            backups: build_backups(&specs, now),
            segments: segs,
            ..Default::default()
        };
        let Ok(policy) = policy.validate() else {
            return Ok(());
        };
        let p = tidemark_core::plan(&policy, &inv, now);
        let after = tidemark_core::window_after(
            &inv,
            &p,
            tidemark_core::point_in_time_start(&policy, now),
        );
        prop_assert_eq!(after, p.recovery_window);
    }
}
