//! What a schedule and a retention policy keep over time (`tidemark simulate`): full
//! backups at every slot, a retention pass after each backup and at the end of each day,
//! and what remains each day. A pure function of its input; the clock is `start`.
//!
//! # Assumptions
//! Every backup succeeds, is a full backup of `backup_size` bytes (or, with
//! [`Incremental`], an increment of `size` bytes on the one before, a full every
//! `max_per_full` increments or only the first) and takes `backup_duration`; a planned
//! consolidation merges its chain into a synthetic full of `backup_size` at once; binlogs
//! are archived continuously, so the point-in-time window runs from the oldest kept
//! restore point to the end of the day (their own storage is not counted).

use jiff::civil::Date;
use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

use crate::inventory::{Backup, BackupKind, Inventory};
use crate::plan::{Action, plan};
use crate::policy::Policy;
use crate::reason::Reason;
use crate::schedule::Cron;

/// Input of one simulation.
#[derive(Debug, Clone)]
pub struct Simulation {
    pub cron: Cron,
    pub policy: Policy,
    /// First instant simulated; day 1 is the (policy zone) day holding it.
    pub start: Timestamp,
    pub days: u32,
    pub backup_size: u64,
    pub backup_duration: SignedDuration,
    /// Incremental backups (seed 002) instead of fulls only.
    pub incremental: Option<Incremental>,
}

/// Incremental backups in a simulation.
#[derive(Debug, Clone, Copy)]
pub struct Incremental {
    /// Bytes of one increment.
    pub size: u64,
    /// A full after this many increments; `None`: forever incremental (the first only).
    pub max_per_full: Option<u32>,
}

/// The state at the end of one day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimDay {
    /// 1-based.
    pub day: u32,
    pub date: Date,
    /// Backups taken that day.
    pub taken: u32,
    /// Backups deleted by the retention passes that day.
    pub deleted: u32,
    /// Restore points kept at the end of the day, oldest first.
    pub kept: Vec<Timestamp>,
    /// Oldest restorable instant (the oldest kept restore point).
    pub window_from: Option<Timestamp>,
    /// Length of the point-in-time window at the end of the day, in seconds.
    pub window_seconds: i64,
    /// Bytes of kept backups.
    pub stored_bytes: u64,
    /// Kept backups no rule keeps but an increment builds on (seed 002: what a chain that
    /// never ends costs).
    #[serde(skip_serializing_if = "is_zero")]
    pub kept_only_for_chains: u32,
    /// Synthetic fulls committed that day (consolidations).
    #[serde(skip_serializing_if = "is_zero")]
    pub consolidated: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Most slots simulated (every five minutes for a year is about 105,000): each slot is a
/// retention pass, and a per-second schedule over months says nothing more than a
/// per-minute one.
pub const MAX_SLOTS: usize = 200_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimulationError {
    #[error(
        "the schedule fires more than {MAX_SLOTS} times in {days} days; simulate fewer days or a coarser schedule"
    )]
    TooManySlots { days: u32 },
}

/// Runs the simulation.
///
/// # Errors
/// The schedule fires more than [`MAX_SLOTS`] times over the period.
pub fn simulate(sim: &Simulation) -> Result<Vec<SimDay>, SimulationError> {
    let tz = sim.policy.time_zone.clone();
    let first_date = sim.start.to_zoned(tz.clone()).date();
    let mut inventory = Inventory::default();
    let mut out = Vec::with_capacity(sim.days as usize);
    let mut slot = sim.cron.next_after(
        sim.start
            .checked_sub(SignedDuration::from_secs(1))
            .unwrap_or(sim.start),
        &tz,
    );
    // Refuse before working: the first day's slots, times the days, bounds the total.
    let per_day_cap = MAX_SLOTS / sim.days.max(1) as usize + 1;
    let day_one_end = sim.start + SignedDuration::from_hours(24);
    let mut probe = slot;
    let mut first_day = 0usize;
    while let Some(s) = probe.filter(|s| *s < day_one_end) {
        first_day += 1;
        if first_day > per_day_cap {
            return Err(SimulationError::TooManySlots { days: sim.days });
        }
        probe = sim.cron.next_after(s, &tz);
    }
    let mut slots = 0usize;
    let mut seq = 0u64;
    let mut last: Option<String> = None;
    let mut since_full = 0u32;
    for day in 1..=sim.days {
        let Ok(date) = first_date.checked_add(jiff::Span::new().days(i64::from(day - 1))) else {
            break;
        };
        let Some(day_end) = date
            .tomorrow()
            .ok()
            .and_then(|d| d.to_zoned(tz.clone()).ok())
            .map(|z| z.timestamp())
        else {
            break;
        };
        let mut taken = 0;
        let mut deleted = 0;
        let mut consolidated = 0;
        while let Some(s) = slot.filter(|s| *s < day_end) {
            slots += 1;
            if slots > MAX_SLOTS {
                return Err(SimulationError::TooManySlots { days: sim.days });
            }
            seq += 1;
            let completed = s + sim.backup_duration;
            let id = format!("{}-{seq:08x}", s.strftime("%Y%m%dT%H%M%SZ"));
            let mut b =
                Backup::completed_full(id.clone(), "simulated", s, completed, sim.backup_size);
            if let Some(inc) = sim.incremental {
                let parent = last.as_ref().filter(|_| {
                    inc.max_per_full.is_none_or(|m| since_full < m)
                        && inventory
                            .backups
                            .iter()
                            .any(|x| Some(&x.id) == last.as_ref())
                });
                if let Some(p) = parent {
                    b.kind = BackupKind::Incremental(p.clone());
                    b.size = inc.size;
                    since_full += 1;
                } else {
                    since_full = 0;
                }
                b.consolidatable = true;
            }
            inventory.backups.push(b);
            last = Some(id);
            taken += 1;
            let (d, c) = pass(&sim.policy, &mut inventory, completed, sim.backup_size);
            deleted += d;
            consolidated += c;
            slot = sim.cron.next_after(s, &tz);
        }
        let (d, c) = pass(&sim.policy, &mut inventory, day_end, sim.backup_size);
        deleted += d;
        consolidated += c;
        let kept_only_for_chains = plan(&sim.policy, &inventory, day_end)
            .backups
            .iter()
            .filter(|d| {
                d.action == Action::Keep
                    && !d.reasons.is_empty()
                    && d.reasons.iter().all(|r| matches!(r, Reason::Chain(_)))
            })
            .count() as u32;
        let mut kept: Vec<Timestamp> = inventory
            .backups
            .iter()
            .map(Backup::restore_point)
            .collect();
        kept.sort();
        let window_from = kept.first().copied();
        out.push(SimDay {
            day,
            date,
            taken,
            deleted,
            window_seconds: window_from.map_or(0, |f| day_end.duration_since(f).as_secs()),
            window_from,
            stored_bytes: inventory.backups.iter().map(|b| b.size).sum(),
            kept,
            kept_only_for_chains,
            consolidated,
        });
    }
    Ok(out)
}

/// One retention pass at `now`: each planned consolidation commits its synthetic full
/// (`full_size` bytes, standing in for the chain's last backup) first, then the plan made
/// again deletes what it may. Returns how many backups it deleted and how many synthetic
/// fulls it committed.
fn pass(policy: &Policy, inventory: &mut Inventory, now: Timestamp, full_size: u64) -> (u32, u32) {
    let mut p = plan(policy, inventory, now);
    let targets: Vec<Backup> = p
        .backups
        .iter()
        .filter(|d| {
            d.action == Action::Consolidate
                && !d
                    .reasons
                    .iter()
                    .any(|r| matches!(r, Reason::ConsolidateInto(_)))
        })
        .map(|d| d.backup.clone())
        .collect();
    for target in &targets {
        let mut chain = vec![target.id.clone()];
        let mut at = target.kind.parent().cloned();
        while let Some(parent) = at {
            chain.push(parent.clone());
            at = inventory
                .backups
                .iter()
                .find(|b| b.id == parent)
                .and_then(|b| b.kind.parent().cloned());
        }
        chain.reverse();
        let mut full = Backup::completed_full(
            format!("{}s", &target.id[..target.id.len() - 1]),
            "simulated",
            target.started_at,
            target.restore_point(),
            full_size,
        );
        full.consolidated_from = chain;
        full.consolidatable = true;
        inventory.backups.push(full);
    }
    if !targets.is_empty() {
        p = plan(policy, inventory, now);
    }
    let gone: std::collections::HashSet<&str> =
        p.deletions().map(|d| d.backup.id.as_str()).collect();
    let n = gone.len() as u32;
    let gone: std::collections::HashSet<String> = gone.into_iter().map(str::to_owned).collect();
    inventory.backups.retain(|b| !gone.contains(&b.id));
    (n, targets.len() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicyInput;

    fn sim(schedule: &str, policy: PolicyInput, days: u32) -> Vec<SimDay> {
        simulate(&Simulation {
            cron: schedule.parse().unwrap(),
            policy: policy.validate().unwrap(),
            start: "2026-11-01T00:00:00Z".parse().unwrap(),
            days,
            backup_size: 1 << 30,
            backup_duration: SignedDuration::from_mins(5),
            incremental: None,
        })
        .unwrap()
    }

    #[test]
    fn keep_last_holds_steady_once_full() {
        let days = sim(
            "0 0 2 * * *",
            PolicyInput {
                keep_last: Some(3),
                ..Default::default()
            },
            10,
        );
        let kept: Vec<usize> = days.iter().map(|d| d.kept.len()).collect();
        assert_eq!(kept, vec![1, 2, 3, 3, 3, 3, 3, 3, 3, 3]);
        assert_eq!(days[9].stored_bytes, 3 << 30);
        assert_eq!(days[9].deleted, 1);
        assert_eq!(days[9].taken, 1);
        // The window: from the oldest kept (day 8, 02:05) to the end of day 10.
        assert_eq!(
            days[9].window_from,
            Some("2026-11-08T02:05:00Z".parse().unwrap())
        );
        assert_eq!(days[9].window_seconds, (2 * 86_400) + 21 * 3600 + 55 * 60);
    }

    #[test]
    fn gfs_keeps_dailies_and_weeklies() {
        let days = sim(
            "0 0 */6 * * *",
            PolicyInput {
                keep_daily: Some(7),
                keep_weekly: Some(4),
                ..Default::default()
            },
            60,
        );
        let last = days.last().unwrap();
        // 7 dailies plus the newest of up to 4 weeks (some of them the same backup).
        assert!(
            last.kept.len() >= 7 && last.kept.len() <= 11,
            "{:?}",
            last.kept
        );
        assert!(days.iter().all(|d| d.taken == 4));
        // Day 60 is Wednesday 2026-12-30: four ISO weeks hold the current one (from Monday
        // the 28th), so the oldest weekly is the newest backup of the week of the 7th.
        assert_eq!(
            last.window_from,
            Some("2026-12-13T18:05:00Z".parse().unwrap())
        );
    }

    fn incremental_sim(policy: PolicyInput, max_per_full: Option<u32>) -> Vec<SimDay> {
        simulate(&Simulation {
            cron: "0 0 2 * * *".parse().unwrap(),
            policy: policy.validate().unwrap(),
            start: "2026-11-01T00:00:00Z".parse().unwrap(),
            days: 20,
            backup_size: 1 << 30,
            backup_duration: SignedDuration::from_mins(5),
            incremental: Some(Incremental {
                size: 1 << 20,
                max_per_full,
            }),
        })
        .unwrap()
    }

    /// Seed 002's forever incremental: without consolidation nothing is ever freed (every
    /// backup is a chain's link), and the simulation says so, day by day; consolidation
    /// bounds it; a full every N increments frees whole chains.
    #[test]
    fn forever_incrementals_grow_until_consolidated() {
        let keep3 = || PolicyInput {
            keep_last: Some(3),
            ..Default::default()
        };
        let forever = incremental_sim(keep3(), None);
        let kept: Vec<usize> = forever.iter().map(|d| d.kept.len()).collect();
        assert_eq!(kept, (1..=20).collect::<Vec<_>>(), "nothing freed");
        assert!(forever.iter().all(|d| d.deleted == 0));
        assert_eq!(forever[19].kept_only_for_chains, 17);
        assert_eq!(forever[19].stored_bytes, (1 << 30) + 19 * (1 << 20));
        let merged = incremental_sim(
            PolicyInput {
                consolidate: Some(true),
                ..keep3()
            },
            None,
        );
        assert!(merged.iter().all(|d| d.kept.len() <= 4), "{merged:?}");
        assert!(merged.iter().map(|d| d.consolidated).sum::<u32>() > 0);
        assert_eq!(merged[19].kept_only_for_chains, 0);
        let weekly_full = incremental_sim(keep3(), Some(6));
        assert!(
            weekly_full.iter().all(|d| d.kept.len() <= 9),
            "{weekly_full:?}"
        );
        assert!(weekly_full.iter().map(|d| d.deleted).sum::<u32>() > 0);
    }

    #[test]
    fn a_per_second_schedule_over_years_is_refused() {
        let e = simulate(&Simulation {
            cron: "* * * * * *".parse().unwrap(),
            policy: PolicyInput {
                keep_last: Some(1),
                ..Default::default()
            }
            .validate()
            .unwrap(),
            start: "2026-11-01T00:00:00Z".parse().unwrap(),
            days: 400,
            backup_size: 1,
            backup_duration: SignedDuration::from_secs(0),
            incremental: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("simulate fewer days"), "{e}");
    }
}
