//! The retention planner (DESIGN.md §5.2): a pure function of policy, inventory and `now`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

use crate::coverage::{Coverage, Interval, Replay};
use crate::inventory::{
    Backup, BackupId, BackupKind, Inventory, Leftover, LeftoverKind, Phase, Segment,
};
use crate::policy::Policy;
use crate::reason::Reason;
use crate::timeline::timeline_of;

/// What happens to one backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    Keep,
    Delete,
    /// Merged into a synthetic full (seed 002): kept until the full is committed, then
    /// deleted (the target increment is replaced by the full).
    Consolidate,
}

/// The decision for one backup, with every reason for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupDecision {
    pub backup: Backup,
    pub action: Action,
    pub reasons: Vec<Reason>,
}

/// Why a segment is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SegmentReason {
    /// Its last event precedes the horizon.
    BehindHorizon,
    /// Not in the index, and a later segment is behind the horizon (an orphan left by an
    /// interrupted archiver or deletion).
    UnindexedBehindHorizon,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentDeletion {
    pub name: String,
    pub sequence: u64,
    pub size: u64,
    pub reason: SegmentReason,
}

/// One index entry, as the index identifies it: two entries may share a name (a stale
/// duplicate) or a sequence, never both.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryRef {
    pub sequence: u64,
    pub name: String,
}

/// What happens to the log archive.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentPlan {
    /// Segment objects to delete, in sequence order.
    pub delete: Vec<SegmentDeletion>,
    /// Index entries whose object is already gone: dropped when the index is rewritten.
    pub drop_from_index: Vec<EntryRef>,
    /// Segments that stay.
    pub keep: usize,
    /// Segments kept only because their last event time is unknown.
    pub kept_unknown_last_event: usize,
    /// Segments behind the horizon kept only because they are on a branch (off the main
    /// line) within the window or not yet acknowledged.
    pub kept_branch: usize,
    /// Segments behind the horizon kept only because a copy has not received them yet.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kept_for_copies: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl SegmentPlan {
    /// Whether `_index.json` must be rewritten.
    pub fn changes_index(&self) -> bool {
        !self.drop_from_index.is_empty()
            || self
                .delete
                .iter()
                .any(|d| d.reason == SegmentReason::BehindHorizon)
    }
}

/// Why a leftover is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum LeftoverReason {
    /// An index shard no index names, older than [`UNREFERENCED_SHARD_AGE`].
    Unreferenced,
    /// An upload no running attempt owns, older than `failedBackupsTTL` (and, outside a
    /// backup directory, than [`LEFTOVER_MIN_AGE`]).
    Abandoned,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftoverDeletion {
    pub leftover: Leftover,
    pub reason: LeftoverReason,
}

/// What happens to the debris of interrupted work.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftoverPlan {
    pub delete: Vec<LeftoverDeletion>,
    /// Leftovers that stay (too young, or owned by a running attempt).
    pub keep: usize,
}

/// How old an index shard that no index names must be before it is deleted: a younger one
/// may belong to a writer about to commit the index that names it.
pub const UNREFERENCED_SHARD_AGE: SignedDuration = SignedDuration::from_secs(3600);
/// How old an abandoned upload outside any backup directory (a binlog segment's) must be
/// before it is aborted, whatever `failedBackupsTTL` says: no marker tells whether its
/// writer still runs.
pub const LEFTOVER_MIN_AGE: SignedDuration = SignedDuration::from_secs(3600);
/// How long an attempt's in-flight marker stays a sign of life after its last write. Its
/// writer refreshes it far more often ([`HEARTBEAT_INTERVAL`]); the margin absorbs clock
/// skew between the writer, the store and the pass.
pub const IN_FLIGHT_TIMEOUT: SignedDuration = SignedDuration::from_secs(600);
/// How often a running attempt refreshes its in-flight marker.
pub const HEARTBEAT_INTERVAL: SignedDuration = SignedDuration::from_secs(30);

/// The recoverable instants after the pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryWindow {
    /// Earliest restorable instant.
    pub from: Timestamp,
    /// Latest restorable instant (a backup's completion or the last replayable event).
    pub to: Timestamp,
    /// Holes inside `[point_in_time_from, to]`: no backup plus contiguous segments reaches
    /// them.
    pub gaps: Vec<Interval>,
    /// Where the stretch that restores at every instant starts ("point in time from").
    /// Without `pointInTime.window`, `from`: every hole after it is a gap. With one, the
    /// end of the last hole that lies wholly before the window's start: before it, backups
    /// restore to their own points only (`from` is then "snapshots back to"), which is
    /// intended and not a gap.
    pub point_in_time_from: Timestamp,
}

impl RecoveryWindow {
    /// The window as a point-in-time promise that starts at `start` (`now −
    /// pointInTime.window`) sees it: holes wholly before `start` are intended, and the
    /// point-in-time stretch begins after the last of them. `None`: unchanged.
    pub fn with_point_in_time(mut self, start: Option<Timestamp>) -> Self {
        let Some(start) = start else { return self };
        let (before, after): (Vec<Interval>, Vec<Interval>) =
            self.gaps.into_iter().partition(|g| g.to <= start);
        self.point_in_time_from = before
            .iter()
            .map(|g| g.to)
            .max()
            .map_or(self.from, |t| t.max(self.from));
        self.gaps = after;
        self
    }
}

/// A complete, explained retention plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub now: Timestamp,
    /// Every backup, oldest first (by start, then id).
    pub backups: Vec<BackupDecision>,
    pub segments: SegmentPlan,
    /// Start of the oldest retained successful backup (with `pointInTime.window`: of the
    /// oldest one the window replays from): segments whose last event precedes it are not
    /// replayed onto any retained backup.
    pub horizon: Option<Timestamp>,
    pub recovery_window: Option<RecoveryWindow>,
    pub leftovers: LeftoverPlan,
}

impl Plan {
    pub fn deletions(&self) -> impl Iterator<Item = &BackupDecision> {
        self.backups.iter().filter(|d| d.action == Action::Delete)
    }

    /// Backups kept for no reason but that a retained increment builds on them
    /// (`chain:<id>` only): no rule keeps them, and they go only with their chain's last
    /// increment. A chain that never ends — forever incremental (no `maxIncrementsPerFull`)
    /// without `consolidate` (seed 002) — keeps them, and every new increment, forever:
    /// what `plan` and the operator say.
    pub fn kept_only_for_chains(&self) -> impl Iterator<Item = &BackupDecision> {
        self.backups.iter().filter(|d| {
            d.action == Action::Keep
                && !d.reasons.is_empty()
                && d.reasons.iter().all(|r| matches!(r, Reason::Chain(_)))
        })
    }

    /// Summaries of unread index shards that this plan's horizon reaches: some of their
    /// segments may be behind it. The store reads those shards and plans again; a plan in
    /// which this is empty is the plan of the fully read index (the summaries' runs are
    /// contiguous and ordered, so replay over them is the same — property-tested).
    pub fn summaries_to_read<'a>(&self, segments: &'a [Segment]) -> Vec<&'a Segment> {
        let Some(horizon) = self.horizon else {
            return Vec::new();
        };
        segments
            .iter()
            .filter(|s| s.summary && s.first_event_at.is_none_or(|f| f < horizon))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.deletions().next().is_none()
            && !self.backups.iter().any(|d| d.action == Action::Consolidate)
            && self.segments.delete.is_empty()
            && !self.segments.changes_index()
            && self.leftovers.delete.is_empty()
    }
}

/// Plans one retention pass.
///
/// # Guarantees
/// The invariants of DESIGN.md §5.4 (property-tested in `tests/invariants.rs`): the newest
/// restorable backup and its chain are kept; every kept incremental keeps its ancestors; no
/// hole is opened in the point-in-time window; nothing locked, protected, in progress,
/// malformed or written by a newer format is deleted; a backup that cannot be restored
/// counts for no rule; the result does not depend on input order. And the liveness the
/// rules promise: what a rule keeps is kept, what nothing keeps is deleted (within
/// `maxDeletionsPerPass`), and segments behind the horizon are deleted.
///
/// # Assumptions
/// Binlog event times grow with sequence numbers, as MariaDB writes them.
pub fn plan(policy: &Policy, inventory: &Inventory, now: Timestamp) -> Plan {
    let mut nodes = nodes(inventory, now);
    apply_rules(policy, &mut nodes, now);
    close_chains(&mut nodes);
    let replay = Replay::with_timelines(&inventory.segments, &inventory.timelines);
    // With `pointInTime.window`, the promise by replay starts there: earlier holes are
    // intended (backups kept from before restore to their own points).
    let pitr_start = point_in_time_start(policy, now);
    bridge_gaps(&mut nodes, &replay, pitr_start);
    decide_deletions(&mut nodes);
    if policy.max_deletions_per_pass > 0 {
        nodes = within_cap(
            policy.max_deletions_per_pass as usize,
            nodes,
            &replay,
            pitr_start,
        );
    }

    // With `pointInTime.window`, the window replays from the backup it keeps for its start
    // (`pointInTime`); retained backups before that one restore to their own points, with
    // no binlogs after them (`standalone`) — unless a restore in progress replays from one.
    // (That is the newest recovery point at or before its start, which `pointInTime` — or,
    // when it starts earlier, `coverWindow` — keeps.)
    let cover_point = pitr_start.and_then(|start| {
        nodes
            .iter()
            .filter(|n| n.counts() && !n.ttl_expired && n.delete.is_none())
            .map(Node::restore_point)
            .filter(|&t| t <= start)
            .max()
    });
    // (A backup the deletion guard holds keeps its binlogs too: released or reverted, it
    // is what it was.)
    let replays_from = |n: &Node| {
        cover_point.is_none_or(|c| n.restore_point() >= c)
            || !n.backup.held_for.is_empty()
            || n.backup.guarded
    };
    // Binlogs are needed from the start of the oldest retained committed backup (a broken
    // one may be repaired; a malformed one may be a recovery point once it is readable)
    // that replays.
    let horizon = nodes
        .iter()
        .filter(|n| n.delete.is_none() && (n.completed() || n.phase == Phase::Malformed))
        .filter(|n| replays_from(n))
        .map(|n| n.backup.started_at)
        .min();
    // Segments a retained backup's replay depends on beyond the time rule: those before its
    // start segment that replay begins in, and the one holding its recorded position.
    let retained = nodes
        .iter()
        .filter(|n| n.restorable && n.delete.is_none() && replays_from(n));
    let mut pinned_sequences: Vec<u64> = retained
        .clone()
        .flat_map(|n| replay.needed_before(n.backup))
        .collect();
    pinned_sequences.sort_unstable();
    pinned_sequences.dedup();
    // (A backup with a GTID position replays by it, not from its file.)
    let pinned_files: HashSet<&str> = retained
        .filter(|n| n.backup.gtid.is_none())
        .filter_map(|n| n.backup.log_file.as_deref())
        .collect();
    // A new timeline makes the history it leaves a branch; its segments (what the old
    // primary wrote after the switch, or what the real primary wrote, should a lying server
    // have taken the main line) are never made deletable by that alone: they stay for the
    // window, or, without one, until acknowledged (issue 42 §3). Behind the horizon of a
    // point-in-time window they go like the main line's: no instant promised needs them.
    let history = crate::timeline::History::new(&inventory.segments, &inventory.timelines);
    let branch: HashSet<u64> = history.branch.iter().map(|s| s.sequence).collect();
    let window_start = policy.window.map(|w| w.before(now));
    let held_branch = |s: &Segment| {
        if !branch.contains(&s.sequence) {
            return false;
        }
        let Some(last) = s.last_event_at else {
            return true;
        };
        let acknowledged = policy.branches_acknowledged.is_some_and(|a| last <= a);
        let outside_window = window_start.is_some_and(|w| last < w);
        let behind_pitr = cover_point.is_some() && horizon.is_some_and(|h| last < h);
        !(acknowledged || outside_window || behind_pitr)
    };
    let segments = plan_segments(
        &inventory.segments,
        horizon,
        |s| {
            pinned_sequences.binary_search(&s.sequence).is_ok()
                || pinned_files.contains(s.name.as_str())
        },
        held_branch,
    );
    let leftovers = plan_leftovers(policy, &inventory.leftovers, &nodes, now);

    let recovery_window = {
        let kept_segments = kept_segments(&inventory.segments, &segments);
        let replay = Replay::with_timelines(kept_segments.iter().copied(), &inventory.timelines);
        let backups: Vec<&Backup> = nodes.iter().map(|n| n.backup).collect();
        window_of(&backups, &replay, |i| {
            nodes[i].restorable && nodes[i].delete.is_none()
        })
        .map(|w| w.with_point_in_time(pitr_start))
    };

    let mut merged: Vec<Option<usize>> = vec![None; nodes.len()];
    let mut targets = vec![false; nodes.len()];
    if policy.consolidate {
        let groups = consolidations(&nodes);
        for (target, members) in without_gaps(groups, &nodes, &replay, pitr_start) {
            targets[target] = true;
            for m in members {
                merged[m] = Some(target);
            }
        }
    }
    let ids: Vec<BackupId> = nodes.iter().map(|n| n.backup.id.clone()).collect();
    let decisions = nodes
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let broken = n.broken();
            let standalone = n.restorable && !replays_from(&n);
            let (action, mut rs) = match (n.delete, merged[i]) {
                (Some(r), _) => (Action::Delete, vec![r]),
                (None, Some(target)) => (
                    Action::Consolidate,
                    vec![Reason::ConsolidateInto(ids[target].clone())],
                ),
                (None, None) if targets[i] => (Action::Consolidate, n.reasons),
                (None, None) => (Action::Keep, n.reasons),
            };
            if broken {
                rs.push(Reason::Broken);
            }
            // (A merged member goes once its full is committed: it is no point of its own.)
            if action != Action::Delete && merged[i].is_none() && standalone {
                rs.push(Reason::Standalone);
            }
            rs.sort();
            rs.dedup();
            BackupDecision {
                backup: n.backup.clone(),
                action,
                reasons: rs,
            }
        })
        .collect();

    Plan {
        now,
        backups: decisions,
        segments,
        horizon,
        recovery_window,
        leftovers,
    }
}

/// The plan for deleting the one backup `id` on request (its Backup object was deleted
/// with `deletionPolicy: Delete`, or expired by its `ttl`): it alone, with `reason`
/// ([`Reason::DeletionRequested`] or [`Reason::TtlExpired`]) — unless a
/// recovery depends on it. Then nothing is planned and the reasons it stays are returned:
/// [`Reason::Floor`] (for an expiry, the newest restorable backup; for an explicit
/// deletion, which is not retention, only the last restorable one), [`Reason::Chain`] (a committed backup
/// builds on it), [`Reason::Gap`] (it alone bridges a hole in the binlog archive), or what
/// the store itself forbids ([`Reason::Locked`], [`Reason::NewerFormat`],
/// [`Reason::InProgress`], [`Reason::Malformed`]). `None`: no backup `id` under `name`.
pub fn requested_deletion(
    inventory: &Inventory,
    name: &str,
    id: &str,
    reason: Reason,
    now: Timestamp,
) -> Option<Result<Plan, Vec<Reason>>> {
    let target = inventory
        .backups
        .iter()
        .find(|b| b.id == id && b.name == name)?;
    let standing = standing(inventory);
    let mut keep = Vec::new();
    if target.immutable_until.is_some_and(|t| t > now) {
        keep.push(Reason::Locked(target.immutable_until.unwrap_or(now)));
    }
    if target.newer_format {
        keep.push(Reason::NewerFormat);
    }
    match target.phase {
        Phase::Malformed => keep.push(Reason::Malformed),
        Phase::InProgress => keep.push(Reason::InProgress),
        Phase::Uncommitted if in_flight(target, now, inventory.observed_at) => {
            keep.push(Reason::InProgress);
        }
        _ => {}
    }
    if standing.restorable.contains(&target.id) {
        let restorable = || {
            inventory
                .backups
                .iter()
                .filter(|b| standing.restorable.contains(&b.id))
        };
        // An explicit deletion is not retention: it may take the newest backup while
        // another restorable one remains, never the last. An expiry keeps the floor.
        let floor = if reason == Reason::DeletionRequested {
            restorable().all(|b| b.id == target.id)
        } else {
            restorable()
                .max_by_key(|b| (b.completed_at, b.id.clone()))
                .is_some_and(|n| n.id == target.id)
        };
        if floor {
            keep.push(Reason::Floor);
        }
    }
    // A committed increment, and one being written, build on it.
    for child in inventory.backups.iter().filter(|b| {
        b.kind.parent() == Some(&target.id)
            && (matches!(
                b.phase,
                Phase::Completed | Phase::Malformed | Phase::InProgress
            ) || (b.phase == Phase::Uncommitted && in_flight(b, now, inventory.observed_at)))
    }) {
        keep.push(Reason::Chain(child.id.clone()));
    }
    let without = Inventory {
        backups: inventory
            .backups
            .iter()
            .filter(|b| b.id != target.id)
            .cloned()
            .collect(),
        ..inventory.clone()
    };
    let after = standing_window(&without);
    let gaps = |w: &Option<RecoveryWindow>| w.as_ref().map_or(0, |w| w.gaps.len());
    if standing.restorable.contains(&target.id) && gaps(&after) > gaps(&standing.window) {
        keep.push(Reason::Gap);
    }
    if !keep.is_empty() {
        keep.sort();
        keep.dedup();
        return Some(Err(keep));
    }
    Some(Ok(Plan {
        now,
        backups: vec![BackupDecision {
            backup: target.clone(),
            action: Action::Delete,
            reasons: vec![reason],
        }],
        segments: SegmentPlan::default(),
        horizon: None,
        recovery_window: after,
        leftovers: LeftoverPlan::default(),
    }))
}

/// Where a policy's point-in-time window starts at `now` (`None`: it has none, and the
/// window of the retained backups is the promise). With `coverWindow` too, the earlier of
/// the two starts: both promises hold.
pub fn point_in_time_start(policy: &Policy, now: Timestamp) -> Option<Timestamp> {
    let start = policy.point_in_time_window?.before(now);
    Some(match policy.window.filter(|_| policy.cover_window) {
        Some(w) => start.min(w.before(now)),
        None => start,
    })
}

fn standing_window(inventory: &Inventory) -> Option<RecoveryWindow> {
    standing(inventory).window
}

/// One backup as the planner works on it.
#[derive(Debug, Clone)]
struct Node<'a> {
    backup: &'a Backup,
    /// The phase the rules see: an uncommitted attempt whose marker is fresh is in progress.
    phase: Phase,
    /// Its parent's position, when the parent is in the inventory (a synthetic full stands
    /// in for the backup it replaced).
    parent: Option<usize>,
    /// Completed with its payload present, and so is its whole chain.
    restorable: bool,
    /// The committed synthetic full that took its place.
    superseded: Option<usize>,
    /// Its own `ttl` is exceeded.
    ttl_expired: bool,
    /// Why it is kept; empty while nothing keeps it.
    reasons: Vec<Reason>,
    /// Why it is deleted, once decided.
    delete: Option<Reason>,
}

impl Node<'_> {
    fn kept(&self) -> bool {
        !self.reasons.is_empty()
    }

    fn completed(&self) -> bool {
        self.phase == Phase::Completed
    }

    /// Committed as completed, yet not restorable.
    fn broken(&self) -> bool {
        self.completed() && !self.restorable
    }

    /// A recovery point of its own, as the rules count them.
    fn counts(&self) -> bool {
        self.restorable && self.superseded.is_none()
    }

    fn restore_point(&self) -> Timestamp {
        self.backup.restore_point()
    }

    /// Newest first, by restore point then id.
    fn newest_first(&self, other: &Self) -> std::cmp::Ordering {
        (other.restore_point(), &other.backup.id).cmp(&(self.restore_point(), &self.backup.id))
    }
}

/// The planner's view of every backup, oldest first.
fn nodes(inventory: &Inventory, now: Timestamp) -> Vec<Node<'_>> {
    let backups = sorted(inventory);
    let parent = parents(&backups);
    let restorable = restorable(&backups, &parent);
    let superseded = superseded_by(&backups);
    backups
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            let phase = match b.phase {
                Phase::Uncommitted if in_flight(b, now, inventory.observed_at) => Phase::InProgress,
                p => p,
            };
            // A TTL is exceeded strictly after start + ttl, like the window (seed 004).
            // A backup marked for deletion is treated as if its TTL ran out just now.
            let ttl_expired = phase != Phase::InProgress
                && superseded[i].is_none()
                && (b.deletion_requested || b.ttl.is_some_and(|ttl| now > ttl.after(b.started_at)));
            Node {
                backup: b,
                phase,
                parent: parent[i],
                restorable: restorable[i],
                superseded: superseded[i],
                ttl_expired,
                reasons: Vec::new(),
                delete: None,
            }
        })
        .collect()
}

/// Whether an uncommitted attempt's in-flight marker was written recently enough that its
/// writer counts as running: judged at the earlier of `now` and when the store was read, so
/// that neither a pass evaluated in the past nor one evaluated in the future collects a
/// running attempt.
fn in_flight(b: &Backup, now: Timestamp, observed_at: Option<Timestamp>) -> bool {
    let at = observed_at.map_or(now, |o| o.min(now));
    b.heartbeat_at.is_some_and(|h| {
        h.checked_add(IN_FLIGHT_TIMEOUT)
            .is_ok_and(|until| at < until)
    })
}

/// The delete reason of every backup no rule keeps.
fn decide_deletions(nodes: &mut [Node]) {
    let ids: Vec<&BackupId> = nodes.iter().map(|n| &n.backup.id).collect();
    let reasons: Vec<Option<Reason>> = nodes
        .iter()
        .map(|n| {
            if n.kept() {
                return None;
            }
            Some(match n.phase {
                _ if n.superseded.is_some() => Reason::Consolidated(ids[n.superseded?].clone()),
                _ if n.ttl_expired && n.backup.deletion_requested => Reason::DeletionRequested,
                _ if n.ttl_expired => Reason::TtlExpired,
                Phase::Uncommitted if n.backup.interrupted_delete => Reason::InterruptedDelete,
                Phase::Uncommitted => Reason::Uncommitted,
                Phase::Failed => Reason::Failed,
                Phase::Completed if !n.restorable => Reason::Broken,
                Phase::Completed | Phase::InProgress | Phase::Malformed => Reason::Expired,
            })
        })
        .collect();
    for (n, r) in nodes.iter_mut().zip(reasons) {
        n.delete = r;
    }
}

/// Completed with its payload present and every ancestor completed and present (cycles
/// are not restorable).
pub(crate) fn restorable(backups: &[&Backup], parent: &[Option<usize>]) -> Vec<bool> {
    #[derive(Clone, Copy, PartialEq)]
    enum S {
        Unknown,
        Visiting,
        Yes,
        No,
    }
    let n = backups.len();
    let mut state = vec![S::Unknown; n];
    for start in 0..n {
        let mut path = Vec::new();
        let mut cur = start;
        // Walk up until a known answer, a root, or a cycle.
        let verdict = loop {
            match state[cur] {
                S::Yes => break true,
                S::No | S::Visiting => break false,
                S::Unknown => {}
            }
            let b = backups[cur];
            if !b.is_successful() || b.payload_missing {
                state[cur] = S::No;
                break false;
            }
            match (&b.kind, parent[cur]) {
                (BackupKind::Full, _) => {
                    state[cur] = S::Yes;
                    break true;
                }
                (BackupKind::Incremental(_), None) => {
                    state[cur] = S::No;
                    break false;
                }
                (BackupKind::Incremental(_), Some(p)) => {
                    state[cur] = S::Visiting;
                    path.push(cur);
                    cur = p;
                }
            }
        };
        for i in path {
            state[i] = if verdict { S::Yes } else { S::No };
        }
    }
    state.into_iter().map(|s| s == S::Yes).collect()
}

/// One grandfather-father-son rule: keep the newest backup of each of `count` buckets.
struct GfsRule {
    count: u32,
    /// The calendar bucket of an instant, e.g. `2026-W47`.
    key: fn(&jiff::Zoned) -> String,
    reason: fn(String) -> Reason,
}

/// The retention rules proper, then the reasons that no rule may override, then per-backup
/// TTLs and `coverWindow`.
fn apply_rules(policy: &Policy, nodes: &mut [Node], now: Timestamp) {
    let n = nodes.len();
    // The recovery points the rules rank, newest first: restorable, not replaced by a
    // synthetic full, and not past their own TTL (an expired one takes no keepLast place).
    let mut ranked: Vec<usize> = (0..n)
        .filter(|&i| nodes[i].counts() && !nodes[i].ttl_expired)
        .collect();
    ranked.sort_by(|&a, &b| nodes[a].newest_first(&nodes[b]));

    if let Some(window) = policy.window {
        let cutoff = window.before(now);
        for &i in &ranked {
            if nodes[i].restore_point() >= cutoff {
                nodes[i].reasons.push(Reason::Window);
            }
        }
    }
    for &i in ranked.iter().take(policy.keep_last as usize) {
        nodes[i].reasons.push(Reason::KeepLast);
    }
    let gfs = [
        GfsRule {
            count: policy.keep_daily,
            key: |z| z.date().to_string(),
            reason: Reason::Daily,
        },
        GfsRule {
            count: policy.keep_weekly,
            key: |z| {
                let w = z.date().iso_week_date();
                format!("{:04}-W{:02}", w.year(), w.week())
            },
            reason: Reason::Weekly,
        },
        GfsRule {
            count: policy.keep_monthly,
            key: |z| format!("{:04}-{:02}", z.year(), z.month()),
            reason: Reason::Monthly,
        },
        GfsRule {
            count: policy.keep_yearly,
            key: |z| format!("{:04}", z.year()),
            reason: Reason::Yearly,
        },
    ];
    for rule in gfs {
        if rule.count == 0 {
            continue;
        }
        // Restic/borg semantics: the newest backup of each of the newest `count` buckets
        // that hold a backup (not calendar buckets counted back from now).
        let mut taken = 0;
        let mut last_key: Option<String> = None;
        for &i in &ranked {
            let key = (rule.key)(&nodes[i].restore_point().to_zoned(policy.time_zone.clone()));
            if last_key.as_deref() == Some(key.as_str()) {
                continue;
            }
            last_key = Some(key.clone());
            nodes[i].reasons.push((rule.reason)(key));
            taken += 1;
            if taken == rule.count {
                break;
            }
        }
    }
    // Floor: the newest restorable backup, whatever its TTL says.
    if let Some(i) = (0..n)
        .filter(|&i| nodes[i].counts())
        .min_by(|&a, &b| nodes[a].newest_first(&nodes[b]))
    {
        nodes[i].reasons.push(Reason::Floor);
    }
    for node in nodes.iter_mut() {
        let b = node.backup;
        if let Some(until) = b.immutable_until
            && until > now
        {
            node.reasons.push(Reason::Locked(until));
        }
        if b.protected {
            node.reasons.push(Reason::Protected);
        }
        if b.guarded {
            node.reasons.push(Reason::DeletionGuard);
        }
        for by in &b.held_for {
            node.reasons.push(Reason::Restore(by.clone()));
        }
        // (A broken backup cannot be copied: it goes as a broken one does.)
        if node.phase == Phase::Completed && node.restorable {
            for name in &b.awaiting_copy {
                node.reasons.push(Reason::Copy(name.clone()));
            }
        }
        if b.newer_format {
            node.reasons.push(Reason::NewerFormat);
        }
        // Failed attempts, uncommitted ones and broken backups are kept until
        // failedBackupsTTL (forever without one), and count for nothing.
        let age_from = match node.phase {
            Phase::InProgress => {
                node.reasons.push(Reason::InProgress);
                None
            }
            Phase::Malformed => {
                node.reasons.push(Reason::Malformed);
                None
            }
            Phase::Failed => Some(b.restore_point()),
            Phase::Uncommitted => Some(b.last_modified),
            Phase::Completed if !node.restorable => Some(b.restore_point()),
            Phase::Completed => None,
        };
        if let Some(from) = age_from {
            let expired = b.interrupted_delete
                || policy
                    .failed_backups_ttl
                    .is_some_and(|ttl| now > ttl.after(from));
            if !expired {
                node.reasons.push(Reason::FailedBackupsTtl);
            }
        }
        // A per-backup TTL overrides the retention rules (not the floor, locks, holds or
        // chains); until it is exceeded it keeps the backup.
        if (b.ttl.is_some() || b.deletion_requested)
            && node.phase != Phase::InProgress
            && node.superseded.is_none()
        {
            if node.ttl_expired {
                node.reasons.retain(|r| !r.is_policy_rule());
            } else {
                node.reasons.push(Reason::Ttl);
            }
        }
    }
    // coverWindow after TTLs: the backup that covers the window's start must be one whose
    // own TTL has not expired.
    if policy.cover_window
        && let Some(window) = policy.window
    {
        let cutoff = window.before(now);
        if let Some(&i) = ranked.iter().find(|&&i| nodes[i].restore_point() <= cutoff) {
            nodes[i].reasons.push(Reason::CoverWindow);
        }
    }
    // pointInTime.window likewise: every instant of it replays from this backup on.
    if let Some(window) = policy.point_in_time_window {
        let start = window.before(now);
        if let Some(&i) = ranked.iter().find(|&&i| nodes[i].restore_point() <= start) {
            nodes[i].reasons.push(Reason::PointInTime);
        }
    }
}

/// Keeps every ancestor of a kept backup, naming the kept child in `chain:<id>`. A failed
/// attempt is never part of a chain (seed 002), and neither is an attempt kept only until
/// `failedBackupsTTL` (an uncommitted or broken one): they pin nothing. A chain's lock
/// expiry is that of its last increment, so locks also flow to ancestors.
fn close_chains(nodes: &mut [Node]) {
    let pins = |n: &Node| {
        n.kept()
            && n.phase != Phase::Failed
            && !n.reasons.iter().all(|r| *r == Reason::FailedBackupsTtl)
    };
    let mut queue: VecDeque<usize> = (0..nodes.len()).filter(|&i| pins(&nodes[i])).collect();
    let mut seen = vec![false; nodes.len()];
    for &i in &queue {
        seen[i] = true;
    }
    while let Some(i) = queue.pop_front() {
        let Some(p) = nodes[i].parent else { continue };
        let child = nodes[i].backup.id.clone();
        nodes[p].reasons.push(Reason::Chain(child));
        if !seen[p] {
            seen[p] = true;
            queue.push_back(p);
        }
    }
    // Locks: an ancestor is locked at least as long as any locked descendant.
    for i in 0..nodes.len() {
        let Some(until) = nodes[i].reasons.iter().find_map(|r| match r {
            Reason::Locked(t) => Some(*t),
            _ => None,
        }) else {
            continue;
        };
        let mut cur = nodes[i].parent;
        let mut steps = 0;
        while let Some(p) = cur {
            if steps > nodes.len() {
                break; // a parent cycle in corrupt metadata
            }
            steps += 1;
            let has_later = nodes[p]
                .reasons
                .iter()
                .any(|r| matches!(r, Reason::Locked(t) if *t >= until));
            if !has_later {
                nodes[p].reasons.retain(|r| !matches!(r, Reason::Locked(_)));
                nodes[p].reasons.push(Reason::Locked(until));
            }
            cur = nodes[p].parent;
        }
    }
}

/// The interval each restorable backup restores (its restore point, then replay).
fn intervals(nodes: &[Node], replay: &Replay) -> Vec<Option<Interval>> {
    nodes
        .iter()
        .map(|n| {
            if n.restorable {
                replay.interval_of(n.backup)
            } else {
                None
            }
        })
        .collect()
}

/// Keeps backups whose deletion would open a hole in the point-in-time window: the
/// instants a deleted backup could restore (by replay) that lie between the oldest retained
/// restore point and the last restorable instant must stay restorable.
///
/// With a point-in-time window (`pitr_start`), instants before its start are not the
/// window's: holes there stay.
fn bridge_gaps(nodes: &mut [Node], replay: &Replay, pitr_start: Option<Timestamp>) {
    let n = nodes.len();
    let intervals = intervals(nodes, replay);
    let Some(t_end) = intervals.iter().flatten().map(|i| i.to).max() else {
        return;
    };
    loop {
        let mut cov = Coverage::from_intervals(
            (0..n)
                .filter(|&i| nodes[i].kept())
                .filter_map(|i| intervals[i])
                .collect(),
        );
        let Some(mut t0) = cov.first() else { break };
        let mut added = Vec::new();
        // A replaced backup's synthetic full restores the same instants: it bridges instead.
        let mut candidates: Vec<usize> = (0..n)
            .filter(|&i| nodes[i].superseded.is_none() && !nodes[i].kept())
            .filter(|&i| {
                intervals[i]
                    .is_some_and(|iv| iv.to > iv.from || pitr_start.is_some_and(|s| iv.from >= s))
            })
            .collect();
        candidates.sort_by_key(|&i| (nodes[i].restore_point(), &nodes[i].backup.id));
        for i in candidates {
            let Some(iv) = intervals[i] else { continue };
            if !still_restored(&cov, iv, t0, t_end, pitr_start) {
                added.push(i);
                cov.insert(iv);
                t0 = t0.min(iv.from);
            }
        }
        if added.is_empty() {
            break;
        }
        for &i in &added {
            nodes[i].reasons.push(Reason::Gap);
        }
        // Chains of the newly kept backups, then check again: an ancestor may have moved
        // the oldest retained restore point earlier.
        let mut changed = false;
        for &i in &added {
            let mut cur = i;
            let mut steps = 0;
            while let Some(p) = nodes[cur].parent {
                if steps > n {
                    break; // a parent cycle in corrupt metadata
                }
                steps += 1;
                let was_kept = nodes[p].kept();
                let child = nodes[cur].backup.id.clone();
                nodes[p].reasons.push(Reason::Chain(child));
                if was_kept {
                    break;
                }
                changed = true;
                cur = p;
            }
        }
        if !changed {
            break;
        }
    }
    drop_redundant_bridges(nodes, &intervals, t_end, pitr_start);
}

/// Whether `cov` restores every instant that `iv` restores and the promise covers up to
/// `t_end`: without a point-in-time window, those after the oldest retained restore point
/// `t0`; with one (`pitr_start`), those from its start on, a lone restore point included.
fn still_restored(
    cov: &Coverage,
    iv: Interval,
    t0: Timestamp,
    t_end: Timestamp,
    pitr_start: Option<Timestamp>,
) -> bool {
    let start = pitr_start.unwrap_or(t0);
    if iv.to > iv.from && !cov.covers_open_closed(iv.from.max(start), iv.to.min(t_end)) {
        return false;
    }
    match pitr_start {
        Some(s) if iv.from >= s && iv.from <= t_end => cov.covers_point(iv.from),
        _ => true,
    }
}

/// Bridges are added oldest first, so a later one (or an ancestor its chain pulled in) can
/// cover what an earlier one was kept for. A backup kept only as a bridge goes again, with
/// the ancestors kept only for its chain (its removal unit), when the other kept backups
/// cover every instant the unit restores within the window.
fn drop_redundant_bridges(
    nodes: &mut [Node],
    intervals: &[Option<Interval>],
    t_end: Timestamp,
    pitr_start: Option<Timestamp>,
) {
    let n = nodes.len();
    let mut bridges: Vec<usize> = (0..n)
        .filter(|&i| nodes[i].reasons == [Reason::Gap])
        .collect();
    bridges.sort_by_key(|&i| std::cmp::Reverse((nodes[i].restore_point(), &nodes[i].backup.id)));
    for i in bridges {
        if nodes[i].reasons != [Reason::Gap] {
            continue;
        }
        // The bridge and the ancestors kept only for the chain through it: deleting the
        // bridge leaves them no reason, so they go with it.
        let mut unit = vec![i];
        let mut cur = i;
        while let Some(p) = nodes[cur].parent.filter(|_| unit.len() <= n) {
            let child = &nodes[cur].backup.id;
            let only_chain = !nodes[p].reasons.is_empty()
                && nodes[p]
                    .reasons
                    .iter()
                    .all(|r| matches!(r, Reason::Chain(c) if c == child));
            if !only_chain || unit.contains(&p) {
                break;
            }
            unit.push(p);
            cur = p;
        }
        let others = Coverage::from_intervals(
            (0..n)
                .filter(|&j| !unit.contains(&j) && nodes[j].kept())
                .filter_map(|j| intervals[j])
                .collect(),
        );
        let Some(t0) = others.first() else { continue };
        let needed = unit
            .iter()
            .filter_map(|&u| intervals[u])
            .any(|iv| !still_restored(&others, iv, t0, t_end, pitr_start));
        if needed {
            continue;
        }
        let top = unit[unit.len() - 1];
        let above = nodes[top].backup.id.clone();
        for &u in &unit {
            nodes[u].reasons.clear();
        }
        // The topmost member's parent keeps its other reasons, not the chain through it.
        if let Some(p) = nodes[top].parent {
            nodes[p]
                .reasons
                .retain(|r| !matches!(r, Reason::Chain(c) if *c == above));
        }
    }
}

/// Chains to merge into a synthetic full (seed 002, `consolidate: true`): for the oldest
/// retained increment of a chain, the ancestors kept only for that chain. Returns
/// (target, merged ancestors); the target is replaced by the full, the ancestors deleted,
/// once the full is committed — until then everything stays.
///
/// A target must be a completed, consolidatable increment kept in its own right (not only
/// for a chain), with nothing pinning it as it is (lock, hold, newer format), and every
/// ancestor completed and consolidatable. Merged ancestors are the run above it whose
/// every reason is `chain` through this line; an ancestor kept for anything else (or for
/// another branch) stays, and so does everything above it.
fn consolidations(nodes: &[Node]) -> Vec<(usize, Vec<usize>)> {
    let own_right = |i: usize| {
        nodes[i]
            .reasons
            .iter()
            .any(|r| !matches!(r, Reason::Chain(_)))
    };
    let pinned = |i: usize| {
        nodes[i].reasons.iter().any(|r| {
            matches!(
                r,
                Reason::Locked(_)
                    | Reason::Protected
                    | Reason::DeletionGuard
                    | Reason::Restore(_)
                    | Reason::Copy(_)
                    | Reason::NewerFormat
                    | Reason::InProgress
            )
        })
    };
    let mergeable = |i: usize| {
        nodes[i].delete.is_none() && nodes[i].restorable && nodes[i].backup.consolidatable
    };
    let mut out = Vec::new();
    for r in 0..nodes.len() {
        if !mergeable(r) || nodes[r].backup.kind == BackupKind::Full || !own_right(r) || pinned(r) {
            continue;
        }
        // The whole line up to its base full must be mergeable, and no ancestor may be an
        // increment retained in its own right (that one is the oldest retained).
        let mut line = Vec::new();
        let mut cur = nodes[r].parent;
        let mut ok = true;
        while let Some(a) = cur {
            if line.len() > nodes.len() || !mergeable(a) {
                ok = false; // a parent cycle in corrupt metadata, or an unmergeable ancestor
                break;
            }
            if nodes[a].backup.kind != BackupKind::Full && own_right(a) {
                ok = false;
                break;
            }
            line.push(a);
            cur = nodes[a].parent;
        }
        if !ok
            || line
                .last()
                .is_none_or(|&root| nodes[root].backup.kind != BackupKind::Full)
        {
            continue;
        }
        let mut members = Vec::new();
        let mut child = r;
        for &a in &line {
            let only_this_line = nodes[a]
                .reasons
                .iter()
                .all(|x| matches!(x, Reason::Chain(c) if *c == nodes[child].backup.id));
            if !only_this_line {
                break;
            }
            members.push(a);
            child = a;
        }
        if !members.is_empty() {
            out.push((r, members));
        }
    }
    out
}

/// Trims each consolidation so that deleting its merged ancestors opens no hole in the
/// point-in-time window (the gap rule's criterion: every instant a removed backup reaches
/// by replay, after the oldest backup still kept, stays covered). The replaced target keeps
/// its instants through the synthetic full, which restores to the same point. Ancestors
/// are tried from the target upwards; the first one that must stay ends the merge (those
/// above it are its chain).
fn without_gaps(
    mut groups: Vec<(usize, Vec<usize>)>,
    nodes: &[Node],
    replay: &Replay,
    pitr_start: Option<Timestamp>,
) -> Vec<(usize, Vec<usize>)> {
    let n = nodes.len();
    let intervals = intervals(nodes, replay);
    let Some(t_end) = intervals.iter().flatten().map(|i| i.to).max() else {
        return Vec::new();
    };
    let mut removed = vec![false; n];
    for (_, members) in &mut groups {
        let mut take = 0;
        for &m in members.iter() {
            removed[m] = true;
            let cov = Coverage::from_intervals(
                (0..n)
                    .filter(|&i| nodes[i].delete.is_none() && !removed[i])
                    .filter_map(|i| intervals[i])
                    .collect(),
            );
            let holds = (0..n).filter(|&i| removed[i]).all(|i| {
                let (Some(iv), Some(t0)) = (intervals[i], cov.first()) else {
                    return true;
                };
                still_restored(&cov, iv, t0, t_end, pitr_start)
            });
            if !holds {
                removed[m] = false;
                break;
            }
            take += 1;
        }
        members.truncate(take);
    }
    groups.retain(|(_, members)| !members.is_empty());
    groups
}

/// Caps deletions at `cap`, deferring the other candidates (kept for a later pass) so the
/// kept set stays closed under ancestry.
///
/// Candidates go in removal units — a candidate with its candidate descendants — in
/// [`removal_units`] order, whole while they fit what is left of the cap, then in part
/// (descendants first). A deferred backup can pull another one back in (its chain; a
/// planned deletion that now lies inside the window and bridges a hole), so a unit is
/// taken only if, with everything after it deferred, all of it still goes; one that is
/// pulled back stays for a later pass and the next unit is tried.
fn within_cap<'a>(
    cap: usize,
    nodes: Vec<Node<'a>>,
    replay: &Replay,
    pitr_start: Option<Timestamp>,
) -> Vec<Node<'a>> {
    /// Units tried one by one beyond the first batch: bounds the work of a pass whose
    /// deferrals keep pulling candidates back (each try replans the backups).
    const MAX_TRIES: usize = 64;
    let units = removal_units(&nodes);
    let total: usize = units.iter().map(Vec::len).sum();
    if total <= cap {
        return nodes;
    }
    let attempt = |take: &[usize]| {
        let mut ns = nodes.clone();
        let taken: HashSet<usize> = take.iter().copied().collect();
        for i in units
            .iter()
            .flatten()
            .copied()
            .filter(|i| !taken.contains(i))
        {
            ns[i].delete = None;
            ns[i].reasons.push(Reason::Deferred);
        }
        close_chains(&mut ns);
        bridge_gaps(&mut ns, replay, pitr_start);
        decide_deletions(&mut ns);
        // Only what was taken goes: a bridge the deferred backups made redundant stays as
        // it was (it was not counted against the cap).
        let mut restored = Vec::new();
        for (i, n) in ns.iter_mut().enumerate() {
            if n.delete.is_some() && !taken.contains(&i) {
                n.delete = None;
                n.reasons = nodes[i].reasons.clone();
                restored.push(i);
            }
        }
        // A restored backup needs its chain again: the replan may have taken the chain
        // reasons it gave its ancestors (which could then be merged or deleted under it).
        for i in restored {
            let mut cur = i;
            let mut steps = 0;
            while let Some(p) = ns[cur].parent {
                if steps > ns.len() {
                    break; // a parent cycle in corrupt metadata
                }
                steps += 1;
                let child = ns[cur].backup.id.clone();
                let had = ns[p]
                    .reasons
                    .iter()
                    .any(|r| matches!(r, Reason::Chain(c) if *c == child));
                if !had {
                    ns[p].reasons.push(Reason::Chain(child));
                }
                // (One taken under it cannot go now: the attempt does not count as whole.)
                ns[p].delete = None;
                if had {
                    break;
                }
                cur = p;
            }
        }
        let all_go = take.iter().all(|&i| ns[i].delete.is_some());
        (ns, all_go)
    };
    // First the whole units that fit, in one try: usually nothing is pulled back.
    let mut batch: Vec<usize> = Vec::new();
    let mut rest: Vec<&[usize]> = Vec::new();
    for u in &units {
        if batch.len() + u.len() <= cap {
            batch.extend(u.iter().copied());
        } else {
            rest.push(u);
        }
    }
    let (first, all_go) = attempt(&batch);
    if all_go && batch.len() == cap {
        return first;
    }
    // Keep the units that went whole, then try the others one by one, and then parts of
    // those too large to fit, descendants first.
    let mut taken: Vec<usize> = Vec::new();
    let mut tries: Vec<Vec<usize>> = Vec::new();
    for u in &units {
        if u.iter()
            .all(|&i| batch.contains(&i) && first[i].delete.is_some())
        {
            taken.extend(u.iter().copied());
        } else if batch.contains(&u[0]) {
            tries.push(u.clone());
        }
    }
    tries.extend(rest.iter().map(|u| u.to_vec()));
    let (mut best, ok) = attempt(&taken);
    if !ok {
        // The survivors pulled one another back: start from nothing.
        taken.clear();
        best = attempt(&[]).0;
    }
    for u in tries.into_iter().take(MAX_TRIES) {
        let room = cap - taken.len();
        if room == 0 {
            break;
        }
        let mut trial = taken.clone();
        trial.extend(u.iter().copied().take(room));
        let (ns, all_go) = attempt(&trial);
        if all_go {
            taken = trial;
            best = ns;
        }
    }
    best
}

/// Deletion candidates in removal units (a candidate with its candidate descendants; chains
/// are closed, so those are all candidates), in the order units go under a cap: by their
/// newest restore point, oldest first — what stays is the newer end of the history,
/// without holes. Within a unit, descendants come before their ancestors.
fn removal_units(nodes: &[Node]) -> Vec<Vec<usize>> {
    let candidates: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].delete.is_some())
        .collect();
    let mut members: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
    for &i in &candidates {
        let mut root = i;
        let mut depth = 0;
        while let Some(p) = nodes[root].parent {
            if nodes[p].delete.is_none() || depth > nodes.len() {
                break;
            }
            root = p;
            depth += 1;
        }
        members.entry(root).or_default().push((depth, i));
    }
    let mut units: Vec<(Timestamp, usize, Vec<usize>)> = members
        .into_iter()
        .map(|(root, mut m)| {
            m.sort_by(|&(da, a), &(db, b)| {
                (
                    std::cmp::Reverse(da),
                    nodes[a].backup.started_at,
                    &nodes[a].backup.id,
                )
                    .cmp(&(
                        std::cmp::Reverse(db),
                        nodes[b].backup.started_at,
                        &nodes[b].backup.id,
                    ))
            });
            let newest = m
                .iter()
                .map(|&(_, i)| nodes[i].restore_point())
                .max()
                .unwrap_or(Timestamp::MIN);
            (newest, root, m.into_iter().map(|(_, i)| i).collect())
        })
        .collect();
    units.sort_by(|a, b| {
        (a.0, nodes[a.1].backup.started_at, &nodes[a.1].backup.id).cmp(&(
            b.0,
            nodes[b.1].backup.started_at,
            &nodes[b.1].backup.id,
        ))
    });
    units.into_iter().map(|(_, _, m)| m).collect()
}

fn plan_segments(
    segments: &[Segment],
    horizon: Option<Timestamp>,
    pinned: impl Fn(&Segment) -> bool,
    held_branch: impl Fn(&Segment) -> bool,
) -> SegmentPlan {
    let mut segs: Vec<&Segment> = segments.iter().collect();
    segs.sort_by(|a, b| (a.sequence, &a.name).cmp(&(b.sequence, &b.name)));
    let mut out = SegmentPlan::default();
    let behind = |s: &Segment| match (horizon, s.last_event_at) {
        (Some(h), Some(last)) => last < h,
        _ => false,
    };
    // Per timeline, the highest sequence provably behind the horizon: unindexed segments
    // of that timeline below it are orphans.
    let mut cut: HashMap<u32, u64> = HashMap::new();
    for s in segs
        .iter()
        .filter(|s| s.indexed && behind(s) && !held_branch(s))
    {
        let c = cut.entry(timeline_of(s.sequence)).or_insert(s.sequence);
        *c = (*c).max(s.sequence);
    }
    for s in segs {
        if s.indexed && !s.present {
            out.drop_from_index.push(EntryRef {
                sequence: s.sequence,
                name: s.name.clone(),
            });
            continue;
        }
        let reason = if s.summary || pinned(s) {
            None
        } else if held_branch(s) {
            if s.indexed && behind(s) {
                out.kept_branch += 1;
            }
            None
        } else if s.indexed && behind(s) {
            Some(SegmentReason::BehindHorizon)
        } else if !s.indexed
            && cut
                .get(&timeline_of(s.sequence))
                .is_some_and(|&c| s.sequence < c)
        {
            Some(SegmentReason::UnindexedBehindHorizon)
        } else {
            None
        };
        match reason {
            Some(reason) => out.delete.push(SegmentDeletion {
                name: s.name.clone(),
                sequence: s.sequence,
                size: s.size,
                reason,
            }),
            None => {
                out.keep += s.span.max(1) as usize;
                if s.indexed && s.last_event_at.is_none() {
                    out.kept_unknown_last_event += 1;
                }
            }
        }
    }
    out
}

/// Which leftovers go: unreferenced shards once old enough that no writer can still be
/// about to commit them; uploads no running attempt owns once older than
/// `failedBackupsTTL` (never without one), and, outside any backup directory, than
/// [`LEFTOVER_MIN_AGE`]. Uploads of an attempt this pass deletes go with it.
fn plan_leftovers(
    policy: &Policy,
    leftovers: &[Leftover],
    nodes: &[Node],
    now: Timestamp,
) -> LeftoverPlan {
    let by_id: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.backup.id.as_str(), i))
        .collect();
    let aged = |from: Timestamp, age: SignedDuration| {
        from.checked_add(age).is_ok_and(|until| now >= until)
    };
    let mut sorted: Vec<&Leftover> = leftovers.iter().collect();
    sorted.sort_by(|a, b| (&a.key, &a.upload_id).cmp(&(&b.key, &b.upload_id)));
    let mut out = LeftoverPlan::default();
    for l in sorted {
        let reason = match l.kind {
            LeftoverKind::UnreferencedShard => aged(l.last_modified, UNREFERENCED_SHARD_AGE)
                .then_some(LeftoverReason::Unreferenced),
            LeftoverKind::IncompleteUpload | LeftoverKind::StagingFile => {
                let owner = l.attempt.as_deref().and_then(|id| by_id.get(id)).copied();
                match owner.map(|o| &nodes[o]) {
                    Some(o) if o.phase == Phase::InProgress => None,
                    Some(o) if o.delete.is_some() => Some(LeftoverReason::Abandoned),
                    owner => {
                        let ttl = policy
                            .failed_backups_ttl
                            .is_some_and(|ttl| now > ttl.after(l.last_modified));
                        let old = owner.is_some() || aged(l.last_modified, LEFTOVER_MIN_AGE);
                        (ttl && old).then_some(LeftoverReason::Abandoned)
                    }
                }
            }
        };
        match reason {
            Some(reason) => out.delete.push(LeftoverDeletion {
                leftover: l.clone(),
                reason,
            }),
            None => out.keep += 1,
        }
    }
    out
}

/// The segments that remain after `plan` is carried out.
pub fn kept_segments<'a>(segments: &'a [Segment], plan: &SegmentPlan) -> Vec<&'a Segment> {
    // Deletions are in sequence order; a binary search beats hashing a million names.
    let gone: Vec<(u64, &str)> = plan
        .delete
        .iter()
        .map(|d| (d.sequence, d.name.as_str()))
        .collect();
    segments
        .iter()
        .filter(|s| s.present && gone.binary_search(&(s.sequence, s.name.as_str())).is_err())
        .collect()
}

/// Each backup's parent position, when the parent is in the inventory. A committed
/// synthetic full stands in for the backup it replaced (the last of its
/// `consolidatedFrom`), so that backup's descendants build on the full from then on. The
/// first backup with a given id wins, so duplicates cannot make the answer depend on input
/// order beyond the sort callers apply.
pub(crate) fn parents(backups: &[&Backup]) -> Vec<Option<usize>> {
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(backups.len());
    for (i, b) in backups.iter().enumerate() {
        index.entry(b.id.as_str()).or_insert(i);
    }
    let stand_in = stand_ins(backups);
    backups
        .iter()
        .map(|b| {
            let p = b.kind.parent()?.as_str();
            stand_in.get(p).or_else(|| index.get(p)).copied()
        })
        .collect()
}

/// Replaced backup-id → the committed synthetic full that took its place.
fn stand_ins<'a>(backups: &[&'a Backup]) -> HashMap<&'a str, usize> {
    let mut out = HashMap::new();
    for (i, b) in backups.iter().enumerate() {
        if b.is_successful()
            && b.kind == BackupKind::Full
            && let Some(last) = b.consolidated_from.last()
            && *last != b.id
        {
            out.entry(last.as_str()).or_insert(i);
        }
    }
    out
}

/// Where a backup's data went when a committed synthetic full merged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedInto<'a> {
    /// The synthetic full.
    pub full: &'a Backup,
    /// Whether the full stands in for it (it was the merged chain's last: its restore
    /// point is the full's, and its descendants build on the full).
    pub stands_in: bool,
}

/// Each backup a committed synthetic full merged (its `consolidatedFrom`, the full itself
/// aside) → that full. When two fulls merged one backup, the one the planner resolves its
/// chain through ([`chain_of`]) wins (it stands in), else the first in the planner's
/// order — so whoever records a replacement names the backup the planner uses.
pub fn merged_into(inventory: &Inventory) -> HashMap<&str, MergedInto<'_>> {
    let backups = sorted(inventory);
    // The full the planner resolves a backup to first; then, for a backup no full stands
    // in for, the first full that merged it.
    let mut out: HashMap<&str, MergedInto<'_>> = stand_ins(&backups)
        .into_iter()
        .map(|(merged, i)| {
            (
                merged,
                MergedInto {
                    full: backups[i],
                    stands_in: true,
                },
            )
        })
        .collect();
    for full in &backups {
        if !(full.is_successful() && full.kind == BackupKind::Full) {
            continue;
        }
        for merged in full.consolidated_from.iter().filter(|m| **m != full.id) {
            out.entry(merged.as_str()).or_insert(MergedInto {
                full,
                stands_in: false,
            });
        }
    }
    out
}

/// For each backup, the synthetic full that replaced it, if one is committed.
fn superseded_by(backups: &[&Backup]) -> Vec<Option<usize>> {
    let stand_in = stand_ins(backups);
    backups
        .iter()
        .enumerate()
        .map(|(i, b)| stand_in.get(b.id.as_str()).copied().filter(|&s| s != i))
        .collect()
}

/// The chain of backup `id` as the planner resolves it (a synthetic full standing in for
/// the backup it replaced), base first; `None` when `id` is unknown or its chain is broken
/// or cyclic.
pub fn chain_of(inventory: &Inventory, id: &str) -> Option<Vec<Backup>> {
    let backups = sorted(inventory);
    let parent = parents(&backups);
    let mut cur = backups.iter().position(|b| b.id == id)?;
    let mut out = vec![backups[cur].clone()];
    while let BackupKind::Incremental(_) = backups[cur].kind {
        cur = parent[cur]?;
        if out.len() > backups.len() {
            return None;
        }
        out.push(backups[cur].clone());
    }
    out.reverse();
    Some(out)
}

/// Inventory backups sorted as the planner sees them.
pub(crate) fn sorted(inventory: &Inventory) -> Vec<&Backup> {
    let mut backups: Vec<&Backup> = inventory.backups.iter().collect();
    backups.sort_by(|a, b| (a.started_at, &a.id, &a.name).cmp(&(b.started_at, &b.id, &b.name)));
    backups
}

/// The recovery window over the backups `include` selects, replaying `replay`.
pub(crate) fn window_of(
    backups: &[&Backup],
    replay: &Replay,
    include: impl Fn(usize) -> bool,
) -> Option<RecoveryWindow> {
    let cov = Coverage::from_intervals(
        (0..backups.len())
            .filter(|&i| include(i))
            .filter_map(|i| replay.interval_of(backups[i]))
            .collect(),
    );
    let from = cov.first()?;
    Some(RecoveryWindow {
        from,
        to: cov.last()?,
        gaps: cov.gaps(),
        point_in_time_from: from,
    })
}

/// What an inventory can restore as it stands (no pass applied): for `tidemark ls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// Backups that are completed with a complete chain.
    pub restorable: HashSet<BackupId>,
    pub window: Option<RecoveryWindow>,
    /// The earliest segment any restorable backup replays from: holes in the archive
    /// before it do not affect recovery.
    pub earliest_replay_start: Option<u64>,
}

/// Assesses an inventory as it stands, in one pass over it.
pub fn standing(inventory: &Inventory) -> Standing {
    standing_at(inventory, None)
}

/// The recovery window once `plan` is carried out as it stands: the backups it deletes and
/// the segments it deletes (or drops from the index) gone. Equal to the plan's own window
/// (a property test says so); a pass whose guard dropped some of its segment deletions
/// reports this, not the window of deletions that are not happening.
pub fn window_after(
    inventory: &Inventory,
    plan: &Plan,
    pitr_start: Option<Timestamp>,
) -> Option<RecoveryWindow> {
    let deleted: HashSet<&str> = plan.deletions().map(|d| d.backup.id.as_str()).collect();
    let gone: HashSet<u64> = plan
        .segments
        .delete
        .iter()
        .map(|d| d.sequence)
        .chain(plan.segments.drop_from_index.iter().map(|e| e.sequence))
        .collect();
    let after = Inventory {
        backups: inventory
            .backups
            .iter()
            .filter(|b| !deleted.contains(b.id.as_str()))
            .cloned()
            .collect(),
        segments: inventory
            .segments
            .iter()
            .filter(|s| !gone.contains(&s.sequence))
            .cloned()
            .collect(),
        ..inventory.clone()
    };
    standing_at(&after, pitr_start).window
}

/// [`standing`], for a policy whose point-in-time window starts at `pitr_start` (`now −
/// pointInTime.window`): holes before it are intended, not gaps
/// ([`RecoveryWindow::with_point_in_time`]).
pub fn standing_at(inventory: &Inventory, pitr_start: Option<Timestamp>) -> Standing {
    let backups = sorted(inventory);
    let ok = restorable(&backups, &parents(&backups));
    let replay = Replay::with_timelines(&inventory.segments, &inventory.timelines);
    let restorable_idx = (0..backups.len()).filter(|&i| ok[i]);
    Standing {
        restorable: restorable_idx
            .clone()
            .map(|i| backups[i].id.clone())
            .collect(),
        window: window_of(&backups, &replay, |i| ok[i]).map(|w| w.with_point_in_time(pitr_start)),
        earliest_replay_start: restorable_idx
            .filter_map(|i| replay.start_sequence(backups[i].restore_point()))
            .min(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::inventory::BackupKind;

    fn at(day: u32, hour: u32) -> jiff::Timestamp {
        format!("2026-11-{day:02}T{hour:02}:00:00Z")
            .parse()
            .unwrap()
    }

    fn full(id: &str, day: u32, hour: u32) -> Backup {
        Backup::completed_full(id.to_owned(), "nightly", at(day, hour), at(day, hour), 10)
    }

    fn incr(id: &str, parent: &str, day: u32) -> Backup {
        Backup {
            kind: BackupKind::Incremental(parent.to_owned()),
            ..full(id, day, 2)
        }
    }

    fn synthetic(id: &str, day: u32, hour: u32, merged: &[&str]) -> Backup {
        Backup {
            consolidated_from: merged.iter().map(|m| (*m).to_owned()).collect(),
            ..full(id, day, hour)
        }
    }

    /// Who holds a merged backup's data agrees with how the planner resolves chains: two
    /// synthetic fulls that merged one chain (a consolidation repeated) name the same one
    /// whatever the inventory's order; the one standing in for a backup wins over an
    /// earlier one that only merged it.
    /// Retention across a failover: each kept backup's needs follow the stitched history.
    /// A replica's backup that lags (its GTID position older than its start time says)
    /// keeps the file holding what it still needs; the old primary's files, branch and all,
    /// go once nothing kept replays them.
    #[test]
    fn retention_follows_the_stitched_history() {
        use crate::gtid::GtidPos;
        use crate::timeline::fixtures::{failover, seg, ts};
        let (mut segments, timelines) = failover();
        // A file of the old primary after the switch: only its branch.
        segments.insert(
            2,
            seg(6, "01T03:00", "01T03:30", 1, "0-1-12", &["0-1-13..14"]),
        );
        let backup = |id: &str, started: &str, completed: &str, gtid: &str| Backup {
            gtid: Some(GtidPos::parse(gtid).unwrap()),
            server_id: Some(2),
            ..Backup::completed_full(id.to_owned(), "nightly", ts(started), ts(completed), 10)
        };
        // Taken on the replica at 01:30, an hour behind: it holds 0-1-1..5 only.
        let lagging = backup("lagging", "01T01:30", "01T01:35", "0-1-5");
        // On the new primary, after the switch.
        let after = backup("after", "01T04:30", "01T04:35", "0-2-15");
        let inv = Inventory {
            backups: vec![lagging, after],
            segments,
            timelines,
            ..Default::default()
        };
        let keep = |n| {
            crate::policy::PolicyInput {
                keep_last: Some(n),
                ..Default::default()
            }
            .validate()
            .unwrap()
        };
        let deleted = |p: &Plan| -> Vec<String> {
            p.segments.delete.iter().map(|d| d.name.clone()).collect()
        };
        // Both kept: the lagging backup replays from 0-1-6, in file 4 (whose last event,
        // 01:00, is before its start), across the switch into timeline 1: nothing goes (the
        // branch-only file, which no kept backup replays, is a branch: kept, below).
        let p = plan(&keep(2), &inv, ts("01T06:00"));
        let kept: Vec<&str> = p
            .backups
            .iter()
            .filter(|b| b.action == Action::Keep)
            .map(|b| b.backup.id.as_str())
            .collect();
        assert_eq!(kept, ["lagging", "after"]);
        assert!(
            !deleted(&p).iter().any(|n| n == "mysql-bin.000004"
                || n == "mysql-bin.000005"
                || n.starts_with("mysql-bin.1")),
            "{:?}",
            p.segments.delete
        );
        // Only the newest kept: what lies before it on the main line goes; timeline 1's
        // file holding 0-2-13..20 stays. The old primary's branch is not deleted because a
        // new timeline appeared (issue 42 §3: had a lying server taken the main line, the
        // branch would be the real primary's): without a window, it stays until
        // acknowledged.
        let p = plan(&keep(1), &inv, ts("01T06:00"));
        assert_eq!(
            deleted(&p),
            [
                "mysql-bin.000004",
                "mysql-bin.000005",
                "mysql-bin.1000000000002"
            ]
        );
        assert_eq!(p.segments.kept_branch, 1);
        // Acknowledged up to its last event, it goes by the ordinary rule.
        let mut acked = keep(1);
        acked.branches_acknowledged = Some(ts("01T03:30"));
        let p = plan(&acked, &inv, ts("01T06:00"));
        assert_eq!(
            deleted(&p),
            [
                "mysql-bin.000004",
                "mysql-bin.000005",
                "mysql-bin.000006",
                "mysql-bin.1000000000002"
            ]
        );
        assert_eq!(p.segments.kept_branch, 0);
        // Acknowledged only up to an earlier instant: still kept.
        acked.branches_acknowledged = Some(ts("01T03:29"));
        assert_eq!(plan(&acked, &inv, ts("01T06:00")).segments.kept_branch, 1);
        // With a window, kept while within it, then gone.
        let windowed = |now: &str| {
            let p = crate::policy::PolicyInput {
                keep_last: Some(1),
                window: Some("1d".into()),
                ..Default::default()
            }
            .validate()
            .unwrap();
            plan(&p, &inv, ts(now))
        };
        assert!(!deleted(&windowed("01T06:00")).contains(&"mysql-bin.000006".to_owned()));
        assert!(deleted(&windowed("03T06:00")).contains(&"mysql-bin.000006".to_owned()));
    }

    #[test]
    fn merged_into_follows_the_planners_stand_in() {
        let backups = vec![
            full("f", 1, 2),
            incr("i1", "f", 2),
            incr("i2", "i1", 3),
            incr("i3", "i2", 4),
            // Merged f..i1, then (later, again from the old chain) f..i1 once more, and
            // f..i2.
            synthetic("s1", 2, 3, &["f", "i1"]),
            synthetic("s1b", 2, 4, &["f", "i1"]),
            synthetic("s2", 3, 3, &["f", "i1", "i2"]),
        ];
        for order in [false, true] {
            let mut b = backups.clone();
            if order {
                b.reverse();
            }
            let inventory = Inventory {
                backups: b,
                ..Default::default()
            };
            let m = merged_into(&inventory);
            let who = |id: &str| (m[id].full.id.as_str(), m[id].stands_in);
            assert_eq!(who("i1"), ("s1", true), "reversed: {order}");
            assert_eq!(who("i2"), ("s2", true), "reversed: {order}");
            assert_eq!(who("f"), ("s1", false), "reversed: {order}");
            assert!(!m.contains_key("i3") && !m.contains_key("s1"));
            // i3 builds on i2, which s2 stands in for: its chain goes through s2.
            let chain: Vec<String> = chain_of(&inventory, "i3")
                .unwrap()
                .into_iter()
                .map(|b| b.id)
                .collect();
            assert_eq!(chain, ["s2", "i3"], "reversed: {order}");
        }
    }
}
