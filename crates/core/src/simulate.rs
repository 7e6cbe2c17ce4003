//! What a schedule and a retention policy keep over time (`tidemark simulate`): full
//! backups at every slot, a retention pass after each backup and at the end of each day,
//! and what remains each day. A pure function of its input; the clock is `start`.
//!
//! # Assumptions
//! Every backup succeeds, is a full backup of `backup_size` bytes and takes
//! `backup_duration`; binlogs are archived continuously, so the point-in-time window runs
//! from the oldest kept restore point to the end of the day (their own storage is not
//! counted).

use jiff::civil::Date;
use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

use crate::inventory::{Backup, Inventory};
use crate::plan::plan;
use crate::policy::Policy;
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
        while let Some(s) = slot.filter(|s| *s < day_end) {
            slots += 1;
            if slots > MAX_SLOTS {
                return Err(SimulationError::TooManySlots { days: sim.days });
            }
            seq += 1;
            let completed = s + sim.backup_duration;
            inventory.backups.push(Backup::completed_full(
                format!("{}-{seq:08x}", s.strftime("%Y%m%dT%H%M%SZ")),
                "simulated",
                s,
                completed,
                sim.backup_size,
            ));
            taken += 1;
            deleted += pass(&sim.policy, &mut inventory, completed);
            slot = sim.cron.next_after(s, &tz);
        }
        deleted += pass(&sim.policy, &mut inventory, day_end);
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
            stored_bytes: sim.backup_size * kept.len() as u64,
            kept,
        });
    }
    Ok(out)
}

/// One retention pass at `now`; returns how many backups it deleted.
fn pass(policy: &Policy, inventory: &mut Inventory, now: Timestamp) -> u32 {
    let p = plan(policy, inventory, now);
    let gone: std::collections::HashSet<&str> =
        p.deletions().map(|d| d.backup.id.as_str()).collect();
    if gone.is_empty() {
        return 0;
    }
    let n = gone.len() as u32;
    let gone: std::collections::HashSet<String> = gone.into_iter().map(str::to_owned).collect();
    inventory.backups.retain(|b| !gone.contains(&b.id));
    n
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
        })
        .unwrap_err();
        assert!(e.to_string().contains("simulate fewer days"), "{e}");
    }
}
