//! The retention planner (DESIGN.md §5.2): a pure function of policy, inventory and `now`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use jiff::Timestamp;
use serde::Serialize;

use crate::coverage::{Coverage, Interval, Replay};
use crate::inventory::{Backup, BackupId, BackupKind, Inventory, Phase, Segment};
use crate::policy::Policy;
use crate::reason::Reason;

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

/// What happens to the log archive.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentPlan {
    /// Segment objects to delete, in sequence order.
    pub delete: Vec<SegmentDeletion>,
    /// Index entries whose object is already gone: dropped when the index is rewritten.
    pub drop_from_index: Vec<String>,
    /// Segments that stay.
    pub keep: usize,
    /// Segments kept only because their last event time is unknown.
    pub kept_unknown_last_event: usize,
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

/// The recoverable instants after the pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryWindow {
    /// Earliest restorable instant.
    pub from: Timestamp,
    /// Latest restorable instant (a backup's completion or the last replayable event).
    pub to: Timestamp,
    /// Holes inside `[from, to]`: no backup plus contiguous segments reaches them.
    pub gaps: Vec<Interval>,
}

/// A complete, explained retention plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub now: Timestamp,
    /// Every backup, oldest first (by start, then id).
    pub backups: Vec<BackupDecision>,
    pub segments: SegmentPlan,
    /// Start of the oldest retained successful backup: segments whose last event precedes
    /// it cannot be replayed onto any retained backup.
    pub horizon: Option<Timestamp>,
    pub recovery_window: Option<RecoveryWindow>,
}

impl Plan {
    pub fn deletions(&self) -> impl Iterator<Item = &BackupDecision> {
        self.backups.iter().filter(|d| d.action == Action::Delete)
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
    }
}

/// Plans one retention pass.
///
/// # Guarantees
/// The invariants of DESIGN.md §5.4 (property-tested in `tests/invariants.rs`): the newest
/// successful backup and its chain are kept; every kept incremental keeps its ancestors; no
/// hole is opened in the point-in-time window; nothing locked, protected, in progress or
/// written by a newer format is deleted; the result does not depend on input order.
///
/// # Assumptions
/// Binlog event times grow with sequence numbers, as MariaDB writes them.
pub fn plan(policy: &Policy, inventory: &Inventory, now: Timestamp) -> Plan {
    let backups = sorted(inventory);
    let n = backups.len();
    let parent = parents(&backups);
    let restorable = restorable(&backups, &parent);
    // A backup a synthetic full replaced is no recovery point of its own any more: the
    // rules see the full in its place.
    let superseded = superseded_by(&backups);

    let mut reasons: Vec<Vec<Reason>> = vec![Vec::new(); n];
    apply_rules(
        policy,
        &backups,
        &restorable,
        &superseded,
        now,
        &mut reasons,
    );

    // Per-backup TTL overrides the retention rules (not floor, locks, holds, chains).
    let mut ttl_expired = vec![false; n];
    for (i, b) in backups.iter().enumerate() {
        if b.phase == Phase::InProgress || superseded[i].is_some() {
            continue;
        }
        if let Some(ttl) = b.ttl {
            if now >= ttl.after(b.started_at) {
                ttl_expired[i] = true;
                reasons[i].retain(|r| !r.is_policy_rule());
            } else {
                reasons[i].push(Reason::Ttl);
            }
        }
    }

    // coverWindow after TTLs: the backup that covers the window's start must be one whose
    // own TTL has not expired, or the cover would be stripped with its other reasons.
    if policy.cover_window
        && let Some(window) = policy.window
    {
        let cutoff = window.before(now);
        if let Some(i) = (0..n)
            .filter(|&i| restorable[i] && !ttl_expired[i] && superseded[i].is_none())
            .filter(|&i| backups[i].restore_point() <= cutoff)
            .max_by(|&a, &b| {
                (backups[a].restore_point(), &backups[a].id)
                    .cmp(&(backups[b].restore_point(), &backups[b].id))
            })
        {
            reasons[i].push(Reason::CoverWindow);
        }
    }

    close_chains(&backups, &parent, &mut reasons);
    let replay = Replay::new(&inventory.segments);
    bridge_gaps(
        &backups,
        &parent,
        &restorable,
        &superseded,
        &replay,
        &mut reasons,
    );

    let mut deletes = delete_reasons(&backups, &reasons, &ttl_expired, &superseded);
    if policy.max_deletions_per_pass > 0 {
        defer_beyond_cap(
            policy.max_deletions_per_pass as usize,
            &backups,
            &parent,
            &mut deletes,
            &mut reasons,
        );
        // Deferred backups are kept: their chains must be too (a deferred increment may
        // hang below a failed attempt that pins nothing), and they may move the oldest
        // retained restore point earlier, bringing a planned deletion inside the window.
        // Both only shrink the deletions, so the cap still holds.
        close_chains(&backups, &parent, &mut reasons);
        bridge_gaps(
            &backups,
            &parent,
            &restorable,
            &superseded,
            &replay,
            &mut reasons,
        );
        deletes = delete_reasons(&backups, &reasons, &ttl_expired, &superseded);
    }

    let horizon = backups
        .iter()
        .enumerate()
        .filter(|(i, b)| b.is_successful() && deletes[*i].is_none())
        .map(|(_, b)| b.started_at)
        .min();
    // Segments a retained backup's replay depends on beyond the time rule: the one just
    // before its start segment, and the one holding its recorded binlog position.
    let retained = (0..n).filter(|&i| restorable[i] && deletes[i].is_none());
    let mut pinned_sequences: Vec<u64> = retained
        .clone()
        .filter_map(|i| replay.predecessor_needed(backups[i].restore_point()))
        .collect();
    pinned_sequences.sort_unstable();
    let pinned_files: HashSet<&str> = retained
        .filter_map(|i| backups[i].log_file.as_deref())
        .collect();
    let segments = plan_segments(&inventory.segments, horizon, |s| {
        pinned_sequences.binary_search(&s.sequence).is_ok()
            || pinned_files.contains(s.name.as_str())
    });

    let recovery_window = {
        let kept_segments = kept_segments(&inventory.segments, &segments);
        let replay = Replay::new(kept_segments.iter().copied());
        window_of(&backups, &replay, |i| restorable[i] && deletes[i].is_none())
    };

    let mut merged: Vec<Option<&BackupId>> = vec![None; n];
    let mut targets = vec![false; n];
    if policy.consolidate {
        let groups = consolidations(&backups, &parent, &reasons, &deletes);
        for (target, members) in without_gaps(groups, &backups, &restorable, &replay, |i| {
            deletes[i].is_none()
        }) {
            targets[target] = true;
            for m in members {
                merged[m] = Some(&backups[target].id);
            }
        }
    }
    let decisions = backups
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let (action, mut rs) = match (deletes[i].take(), merged[i]) {
                (Some(r), _) => (Action::Delete, vec![r]),
                (None, Some(target)) => (
                    Action::Consolidate,
                    vec![Reason::ConsolidateInto(target.clone())],
                ),
                (None, None) if targets[i] => {
                    (Action::Consolidate, std::mem::take(&mut reasons[i]))
                }
                (None, None) => (Action::Keep, std::mem::take(&mut reasons[i])),
            };
            rs.sort();
            rs.dedup();
            BackupDecision {
                backup: (*b).clone(),
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
    }
}

/// The delete reason of every backup no rule keeps.
fn delete_reasons(
    backups: &[&Backup],
    reasons: &[Vec<Reason>],
    ttl_expired: &[bool],
    superseded: &[Option<usize>],
) -> Vec<Option<Reason>> {
    backups
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if !reasons[i].is_empty() {
                return None;
            }
            Some(match b.phase {
                _ if superseded[i].is_some() => {
                    Reason::Consolidated(superseded[i].map(|s| backups[s].id.clone())?)
                }
                _ if ttl_expired[i] => Reason::TtlExpired,
                Phase::Uncommitted if b.interrupted_delete => Reason::InterruptedDelete,
                Phase::Uncommitted => Reason::Uncommitted,
                Phase::Failed => Reason::Failed,
                Phase::Completed | Phase::InProgress => Reason::Expired,
            })
        })
        .collect()
}

/// Completed with every ancestor completed and present (cycles are not restorable).
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
            if !b.is_successful() {
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

/// The retention rules proper, plus the reasons that no rule may override.
fn apply_rules(
    policy: &Policy,
    backups: &[&Backup],
    restorable: &[bool],
    superseded: &[Option<usize>],
    now: Timestamp,
    reasons: &mut [Vec<Reason>],
) {
    // Successful backups, newest restore point first.
    let mut successful: Vec<usize> = (0..backups.len())
        .filter(|&i| backups[i].is_successful() && superseded[i].is_none())
        .collect();
    successful.sort_by(|&a, &b| {
        (backups[b].restore_point(), &backups[b].id)
            .cmp(&(backups[a].restore_point(), &backups[a].id))
    });

    if let Some(window) = policy.window {
        let cutoff = window.before(now);
        for &i in &successful {
            if backups[i].restore_point() >= cutoff {
                reasons[i].push(Reason::Window);
            }
        }
    }
    for &i in successful.iter().take(policy.keep_last as usize) {
        reasons[i].push(Reason::KeepLast);
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
        for &i in &successful {
            let key = (rule.key)(
                &backups[i]
                    .restore_point()
                    .to_zoned(policy.time_zone.clone()),
            );
            if last_key.as_deref() == Some(key.as_str()) {
                continue;
            }
            last_key = Some(key.clone());
            reasons[i].push((rule.reason)(key));
            taken += 1;
            if taken == rule.count {
                break;
            }
        }
    }
    // Floor: the newest successful backup, and the newest restorable one if that differs.
    if let Some(&i) = successful.first() {
        reasons[i].push(Reason::Floor);
    }
    if let Some(&i) = successful.iter().find(|&&i| restorable[i])
        && !reasons[i].contains(&Reason::Floor)
    {
        reasons[i].push(Reason::Floor);
    }
    for (i, b) in backups.iter().enumerate() {
        if let Some(until) = b.immutable_until
            && until > now
        {
            reasons[i].push(Reason::Locked(until));
        }
        if b.protected {
            reasons[i].push(Reason::Protected);
        }
        if b.newer_format {
            reasons[i].push(Reason::NewerFormat);
        }
        match b.phase {
            Phase::InProgress => reasons[i].push(Reason::InProgress),
            Phase::Failed | Phase::Uncommitted => {
                let age_from = if b.phase == Phase::Failed {
                    b.restore_point()
                } else {
                    b.last_modified
                };
                let expired = b.interrupted_delete
                    || policy
                        .failed_backups_ttl
                        .is_some_and(|ttl| now >= ttl.after(age_from));
                if !expired {
                    reasons[i].push(Reason::FailedBackupsTtl);
                }
            }
            Phase::Completed => {}
        }
    }
}

/// Keeps every ancestor of a kept (not failed) backup, naming the kept child in `chain:<id>`. A chain's
/// lock expiry is that of its last increment, so locks also flow to ancestors.
fn close_chains(backups: &[&Backup], parent: &[Option<usize>], reasons: &mut [Vec<Reason>]) {
    // A failed attempt is never part of a chain (seed 002): keeping it for
    // `failedBackupsTTL` does not pin its ancestors.
    let mut queue: VecDeque<usize> = (0..backups.len())
        .filter(|&i| !reasons[i].is_empty() && backups[i].phase != Phase::Failed)
        .collect();
    let mut seen = vec![false; backups.len()];
    for &i in &queue {
        seen[i] = true;
    }
    while let Some(i) = queue.pop_front() {
        let Some(p) = parent[i] else { continue };
        reasons[p].push(Reason::Chain(backups[i].id.clone()));
        if !seen[p] {
            seen[p] = true;
            queue.push_back(p);
        }
    }
    // Locks: an ancestor is locked at least as long as any locked descendant.
    for i in 0..backups.len() {
        let Some(until) = reasons[i].iter().find_map(|r| match r {
            Reason::Locked(t) => Some(*t),
            _ => None,
        }) else {
            continue;
        };
        let mut cur = parent[i];
        let mut steps = 0;
        while let Some(p) = cur {
            if steps > backups.len() {
                break; // a parent cycle in corrupt metadata
            }
            steps += 1;
            let has_later = reasons[p]
                .iter()
                .any(|r| matches!(r, Reason::Locked(t) if *t >= until));
            if !has_later {
                reasons[p].retain(|r| !matches!(r, Reason::Locked(_)));
                reasons[p].push(Reason::Locked(until));
            }
            cur = parent[p];
        }
    }
}

/// Keeps backups whose deletion would open a hole in the point-in-time window: the
/// instants a deleted backup could restore (by replay) that lie between the oldest retained
/// restore point and the last restorable instant must stay restorable.
fn bridge_gaps(
    backups: &[&Backup],
    parent: &[Option<usize>],
    restorable: &[bool],
    superseded: &[Option<usize>],
    replay: &Replay,
    reasons: &mut [Vec<Reason>],
) {
    let n = backups.len();
    let intervals: Vec<Option<Interval>> = (0..n)
        .map(|i| restorable[i].then(|| replay.interval(backups[i].restore_point())))
        .collect();
    let Some(t_end) = intervals.iter().flatten().map(|i| i.to).max() else {
        return;
    };
    loop {
        let kept = |i: usize| !reasons[i].is_empty();
        let mut cov = Coverage::from_intervals(
            (0..n)
                .filter(|&i| kept(i))
                .filter_map(|i| intervals[i])
                .collect(),
        );
        let Some(mut t0) = cov.first() else { return };
        let mut added = Vec::new();
        // A replaced backup's synthetic full restores the same instants: it bridges instead.
        let mut candidates: Vec<usize> = (0..n)
            .filter(|&i| superseded[i].is_none())
            .filter(|&i| !kept(i) && intervals[i].is_some_and(|iv| iv.to > iv.from))
            .collect();
        candidates.sort_by_key(|&i| (backups[i].restore_point(), &backups[i].id));
        for i in candidates {
            let Some(iv) = intervals[i] else { continue };
            let lo = iv.from.max(t0);
            let hi = iv.to.min(t_end);
            if !cov.covers_open_closed(lo, hi) {
                added.push(i);
                cov.insert(iv);
                t0 = t0.min(iv.from);
            }
        }
        if added.is_empty() {
            return;
        }
        for &i in &added {
            reasons[i].push(Reason::Gap);
        }
        // Chains of the newly kept backups, then check again: an ancestor may have moved
        // the oldest retained restore point earlier.
        let mut changed = false;
        for &i in &added {
            let mut cur = i;
            while let Some(p) = parent[cur] {
                let was_kept = !reasons[p].is_empty();
                reasons[p].push(Reason::Chain(backups[cur].id.clone()));
                if was_kept {
                    break;
                }
                changed = true;
                cur = p;
            }
        }
        if !changed {
            return;
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
fn consolidations(
    backups: &[&Backup],
    parent: &[Option<usize>],
    reasons: &[Vec<Reason>],
    deletes: &[Option<Reason>],
) -> Vec<(usize, Vec<usize>)> {
    let own_right = |i: usize| reasons[i].iter().any(|r| !matches!(r, Reason::Chain(_)));
    let pinned = |i: usize| {
        reasons[i].iter().any(|r| {
            matches!(
                r,
                Reason::Locked(_) | Reason::Protected | Reason::NewerFormat | Reason::InProgress
            )
        })
    };
    let mut out = Vec::new();
    for (r, b) in backups.iter().enumerate() {
        if deletes[r].is_some()
            || !b.is_successful()
            || !b.consolidatable
            || b.kind == BackupKind::Full
            || !own_right(r)
            || pinned(r)
        {
            continue;
        }
        // The whole line up to its base full must be mergeable, and no ancestor may be an
        // increment retained in its own right (that one is the oldest retained).
        let mut line = Vec::new();
        let mut cur = parent[r];
        let mut ok = true;
        while let Some(a) = cur {
            if line.len() > backups.len() {
                ok = false; // a parent cycle in corrupt metadata
                break;
            }
            let ab = backups[a];
            if deletes[a].is_some() || !ab.is_successful() || !ab.consolidatable {
                ok = false;
                break;
            }
            if ab.kind != BackupKind::Full && own_right(a) {
                ok = false;
                break;
            }
            line.push(a);
            cur = parent[a];
        }
        if !ok
            || line
                .last()
                .is_none_or(|&root| backups[root].kind != BackupKind::Full)
        {
            continue;
        }
        let mut members = Vec::new();
        let mut child = r;
        for &a in &line {
            let only_this_line = reasons[a]
                .iter()
                .all(|x| matches!(x, Reason::Chain(c) if *c == backups[child].id));
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
    backups: &[&Backup],
    restorable: &[bool],
    replay: &Replay,
    kept: impl Fn(usize) -> bool,
) -> Vec<(usize, Vec<usize>)> {
    let n = backups.len();
    let intervals: Vec<Option<Interval>> = (0..n)
        .map(|i| restorable[i].then(|| replay.interval(backups[i].restore_point())))
        .collect();
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
                    .filter(|&i| kept(i) && !removed[i])
                    .filter_map(|i| intervals[i])
                    .collect(),
            );
            let holds = (0..n).filter(|&i| removed[i]).all(|i| {
                let (Some(iv), Some(t0)) = (intervals[i], cov.first()) else {
                    return true;
                };
                iv.to <= iv.from || cov.covers_open_closed(iv.from.max(t0), iv.to.min(t_end))
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

/// Caps deletions at `cap`, deferring the rest so that the kept set stays closed under
/// ancestry: descendants go before their ancestors, oldest removal units first.
fn defer_beyond_cap(
    cap: usize,
    backups: &[&Backup],
    parent: &[Option<usize>],
    deletes: &mut [Option<Reason>],
    reasons: &mut [Vec<Reason>],
) {
    let candidates: Vec<usize> = (0..backups.len())
        .filter(|&i| deletes[i].is_some())
        .collect();
    if candidates.len() <= cap {
        return;
    }
    // A candidate's unit is its topmost candidate ancestor: chains are closed, so every
    // descendant of a candidate is a candidate too.
    let mut unit_root = vec![usize::MAX; backups.len()];
    let mut depth = vec![0usize; backups.len()];
    for &i in &candidates {
        let mut root = i;
        let mut d = 0;
        while let Some(p) = parent[root] {
            if deletes[p].is_none() || d > backups.len() {
                break;
            }
            root = p;
            d += 1;
        }
        unit_root[i] = root;
        depth[i] = d;
    }
    let unit_start: BTreeMap<usize, (Timestamp, &str)> = candidates
        .iter()
        .map(|&i| {
            let r = unit_root[i];
            (r, (backups[r].started_at, backups[r].id.as_str()))
        })
        .collect();
    let mut order = candidates.clone();
    order.sort_by(|&a, &b| {
        let ka = (
            unit_start[&unit_root[a]],
            std::cmp::Reverse(depth[a]),
            backups[a].started_at,
            &backups[a].id,
        );
        let kb = (
            unit_start[&unit_root[b]],
            std::cmp::Reverse(depth[b]),
            backups[b].started_at,
            &backups[b].id,
        );
        ka.cmp(&kb)
    });
    for &i in &order[cap..] {
        deletes[i] = None;
        reasons[i].push(Reason::Deferred);
    }
}

fn plan_segments(
    segments: &[Segment],
    horizon: Option<Timestamp>,
    pinned: impl Fn(&Segment) -> bool,
) -> SegmentPlan {
    let mut segs: Vec<&Segment> = segments.iter().collect();
    segs.sort_by(|a, b| (a.sequence, &a.name).cmp(&(b.sequence, &b.name)));
    let mut out = SegmentPlan::default();
    let behind = |s: &Segment| match (horizon, s.last_event_at) {
        (Some(h), Some(last)) => last < h,
        _ => false,
    };
    // Highest sequence provably behind the horizon: unindexed segments below it are orphans.
    let cut = segs
        .iter()
        .filter(|s| s.indexed && behind(s))
        .map(|s| s.sequence)
        .max();
    for s in segs {
        if s.indexed && !s.present {
            out.drop_from_index.push(s.name.clone());
            continue;
        }
        let reason = if s.summary || pinned(s) {
            None
        } else if s.indexed && behind(s) {
            Some(SegmentReason::BehindHorizon)
        } else if !s.indexed && cut.is_some_and(|c| s.sequence < c) {
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
            .map(|i| replay.interval(backups[i].restore_point()))
            .collect(),
    );
    Some(RecoveryWindow {
        from: cov.first()?,
        to: cov.last()?,
        gaps: cov.gaps(),
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
    let backups = sorted(inventory);
    let ok = restorable(&backups, &parents(&backups));
    let replay = Replay::new(&inventory.segments);
    let restorable_idx = (0..backups.len()).filter(|&i| ok[i]);
    Standing {
        restorable: restorable_idx
            .clone()
            .map(|i| backups[i].id.clone())
            .collect(),
        window: window_of(&backups, &replay, |i| ok[i]),
        earliest_replay_start: restorable_idx
            .filter_map(|i| replay.start_sequence(backups[i].restore_point()))
            .min(),
    }
}
