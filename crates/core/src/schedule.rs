//! Scheduling decisions (seed 001, DESIGN.md §4): pure functions of the schedule, its
//! existing children and `now`. The operator and `tidemark run` carry them out.
//!
//! - Cron with six fields, seconds first, as seed 001 requires ("five-field Unix cron
//!   expressions are intentionally rejected because the leading seconds field is
//!   required"), or a macro (`@hourly`, `@daily`/`@midnight`, `@weekly`, `@monthly`,
//!   `@yearly`/`@annually`), which is unambiguous. Five fields are refused with the
//!   six-field form of what was typed (`"0 2 * * *"` → `"0 0 2 * * *"`): read as six they
//!   would be a different schedule. Seven fields (a year) are refused with the six
//!   without it.
//! - Child names are `<schedule>-<YYYYMMDDHHMMSS>` of the UTC slot, so a retry finds (and
//!   adopts) the child an earlier attempt created.
//! - `immediate`: one child at the first evaluation, found again by its label if the
//!   status update was lost (the adoption guard).
//! - No new child while one is neither completed nor failed (the concurrency guard).
//! - A deterministic name taken by a backup that is not this schedule's: skip that slot
//!   with a warning and resume at the next.
//! - After downtime, at most one catch-up run: the latest missed slot, never a burst.
//! - Slots are evaluated in an IANA time zone (default UTC); names use the UTC instant.

use std::str::FromStr;

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

/// The accepted forms, shown in errors.
pub const CRON_FORM: &str = "six fields, seconds first (second minute hour day-of-month month day-of-week, e.g. \"0 0 2 * * *\"), or a macro (@hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually)";

/// The macros, as six fields: at the start of the hour, day (midnight), week (Sunday),
/// month (the 1st), year (January 1st).
const MACROS: [(&str, &str); 7] = [
    ("@hourly", "0 0 * * * *"),
    ("@daily", "0 0 0 * * *"),
    ("@midnight", "0 0 0 * * *"),
    ("@weekly", "0 0 0 * * 0"),
    ("@monthly", "0 0 0 1 * *"),
    ("@yearly", "0 0 0 1 1 *"),
    ("@annually", "0 0 0 1 1 *"),
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "schedule {expr:?} has five fields; schedules need six, seconds first: did you mean \"0 {}\"? (Tidemark takes {CRON_FORM}; seed 001 refuses five-field cron, whose fields would be read shifted)",
        expr.split_whitespace().collect::<Vec<_>>().join(" ")
    )]
    FiveFields { expr: String },
    #[error(
        "schedule {expr:?} has {found} fields; Tidemark takes {CRON_FORM}{}",
        suggestion(expr, *found)
    )]
    FieldCount { expr: String, found: usize },
    #[error("schedule {expr:?} is not a valid cron expression ({problem}); expected {CRON_FORM}")]
    Invalid { expr: String, problem: String },
}

fn suggestion(expr: &str, found: usize) -> String {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    match found {
        7 => format!(" — without the year field, \"{}\"", fields[..6].join(" ")),
        _ => String::new(),
    }
}

/// A parsed cron expression (six fields or a macro), with standard semantics (as robfig/cron, which
/// CloudNativePG uses): day-of-week 0–7 with Sunday as 0 or 7, names `MON`–`SUN` and
/// `JAN`–`DEC`, and when both day-of-month and day-of-week are restricted, a day matching
/// either fires. Evaluated by `croner` on the wall clock of a time zone.
#[derive(Debug, Clone)]
pub struct Cron {
    expr: String,
    inner: croner::Cron,
}

impl PartialEq for Cron {
    fn eq(&self, other: &Self) -> bool {
        self.expr == other.expr
    }
}

impl FromStr for Cron {
    type Err = ScheduleError;

    fn from_str(expr: &str) -> Result<Self, Self::Err> {
        let trimmed = expr.trim();
        let six = if trimmed.starts_with('@') {
            MACROS
                .iter()
                .find(|(m, _)| m.eq_ignore_ascii_case(trimmed))
                .map(|(_, six)| (*six).to_owned())
                .ok_or_else(|| ScheduleError::Invalid {
                    expr: expr.to_owned(),
                    problem: "an unknown macro".into(),
                })?
        } else {
            match expr.split_whitespace().count() {
                5 => {
                    return Err(ScheduleError::FiveFields {
                        expr: expr.to_owned(),
                    });
                }
                6 => trimmed.to_owned(),
                found => {
                    return Err(ScheduleError::FieldCount {
                        expr: expr.to_owned(),
                        found,
                    });
                }
            }
        };
        let parser = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Required)
            .year(croner::parser::Year::Disallowed)
            .build();
        let inner = parser.parse(&six).map_err(|e| ScheduleError::Invalid {
            expr: expr.to_owned(),
            problem: e.to_string(),
        })?;
        Ok(Cron {
            expr: expr.to_owned(),
            inner,
        })
    }
}

impl Cron {
    pub fn as_str(&self) -> &str {
        &self.expr
    }

    /// The first slot strictly after `after`, evaluated on the wall clock of `tz`. A civil
    /// time that a DST gap skips fires when the gap ends (as cron does); one that a fold
    /// repeats fires once, at its first occurrence.
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let start = after.to_zoned(tz.clone());
        self.inner
            .find_next_occurrence(&start, false)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The longest time between two consecutive slots after `after`, over the next 35 days
    /// (at most 2,000 slots), or between the next two slots when fewer fall in that span: a
    /// weekday schedule's weekend, a monthly one's month. What "a backup is overdue"
    /// measures against; `None` for a schedule with fewer than two slots left.
    pub fn longest_gap(&self, after: Timestamp, tz: &TimeZone) -> Option<SignedDuration> {
        const HORIZON: SignedDuration = SignedDuration::from_hours(35 * 24);
        const MAX_SLOTS: usize = 2_000;
        let end = crate::duration::saturating_add(after, HORIZON);
        let mut previous = self.next_after(after, tz)?;
        let mut longest: Option<SignedDuration> = None;
        for _ in 0..MAX_SLOTS {
            let Some(next) = self.next_after(previous, tz) else {
                break;
            };
            let gap = next.duration_since(previous);
            longest = Some(longest.map_or(gap, |l| l.max(gap)));
            if next > end {
                break;
            }
            previous = next;
        }
        longest
    }

    /// The latest slot in `(after, upto]`, if any: the one catch-up run after downtime.
    pub fn latest_in(&self, after: Timestamp, upto: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        if upto <= after {
            return None;
        }
        let end = upto.to_zoned(tz.clone());
        self.inner
            .find_previous_occurrence(&end, true)
            .ok()
            .map(|z| z.timestamp())
            .filter(|&t| t > after)
    }
}

/// A schedule as the decisions see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleSpec {
    /// The schedule's name: children are `<name>-<YYYYMMDDHHMMSS>`.
    pub name: String,
    pub cron: Cron,
    pub time_zone: TimeZone,
    /// One run at the first evaluation, besides the cron cadence.
    pub immediate: bool,
    /// No new runs (existing ones are left alone).
    pub suspend: bool,
    /// When the schedule was created: slots before it are not owed.
    pub created_at: Timestamp,
}

/// One existing backup whose name or labels concern this schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child {
    pub name: String,
    /// Labelled `tidemark.io/scheduled-backup=<this schedule>`.
    pub ours: bool,
    /// Labelled `tidemark.io/immediate-backup=true`.
    pub immediate: bool,
    /// Completed or failed.
    pub done: bool,
    /// The slot it was created for (from its name or labels), if known.
    pub slot: Option<Timestamp>,
}

/// What the schedule records between evaluations (seed 001's status fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    /// The last time the schedule was evaluated.
    pub last_check_time: Option<Timestamp>,
    /// The last slot that produced or adopted a backup (seed 001).
    pub last_schedule_time: Option<Timestamp>,
    /// The next expected slot.
    pub next_schedule_time: Option<Timestamp>,
    /// Where evaluation resumes: the last slot handled, including one skipped because its
    /// name was taken (which is not a `lastScheduleTime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_slot: Option<Timestamp>,
}

impl ScheduleStatus {
    /// The last slot handled in any way: evaluation resumes after it.
    pub fn resume_after(&self) -> Option<Timestamp> {
        self.last_schedule_time.max(self.last_handled_slot)
    }
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "action")]
pub enum Decision {
    /// Create this backup for this slot.
    Create {
        name: String,
        slot: Timestamp,
        immediate: bool,
    },
    /// The backup for this slot already exists and is ours: record it, create nothing.
    Adopt { name: String, slot: Timestamp },
    /// A backup of this schedule is still running: no new slot until it is done.
    Wait { running: String },
    /// The slot's name is taken by a backup that is not this schedule's: skip the slot
    /// (a warning), resume at the next.
    SkipCollision { name: String, slot: Timestamp },
    /// Suspended: nothing new.
    Suspended,
    /// No slot is due.
    Idle,
}

/// A decision and the status to record with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Evaluation {
    pub decision: Decision,
    pub status: ScheduleStatus,
}

/// The deterministic name of the child for `slot`: `<schedule>-<YYYYMMDDHHMMSS>` (UTC).
pub fn child_name(schedule: &str, slot: Timestamp) -> String {
    format!("{schedule}-{}", slot.strftime("%Y%m%d%H%M%S"))
}

/// Decides what a schedule does at `now`.
pub fn evaluate(
    spec: &ScheduleSpec,
    status: &ScheduleStatus,
    children: &[Child],
    now: Timestamp,
) -> Evaluation {
    let mut out = ScheduleStatus {
        last_check_time: Some(now),
        last_schedule_time: status.last_schedule_time,
        next_schedule_time: None,
        last_handled_slot: status.last_handled_slot,
    };
    let decision = decide(spec, status, children, now, &mut out);
    let base = out.resume_after().map_or(now, |l| l.max(now));
    out.next_schedule_time = spec.cron.next_after(base, &spec.time_zone);
    Evaluation {
        decision,
        status: out,
    }
}

fn decide(
    spec: &ScheduleSpec,
    status: &ScheduleStatus,
    children: &[Child],
    now: Timestamp,
    out: &mut ScheduleStatus,
) -> Decision {
    if spec.suspend {
        return Decision::Suspended;
    }
    let ours = || children.iter().filter(|c| c.ours);
    // The immediate run, once: at the first evaluation — or adopted, if an earlier attempt
    // created it but its status update was lost.
    if spec.immediate && status.last_schedule_time.is_none() {
        if let Some(c) = ours().find(|c| c.immediate) {
            let slot = c.slot.unwrap_or(now);
            out.last_schedule_time = Some(slot);
            return Decision::Adopt {
                name: c.name.clone(),
                slot,
            };
        }
        if let Some(running) = ours().find(|c| !c.done) {
            return Decision::Wait {
                running: running.name.clone(),
            };
        }
        let slot = Timestamp::from_second(now.as_second()).unwrap_or(now);
        out.last_schedule_time = Some(slot);
        return Decision::Create {
            name: child_name(&spec.name, slot),
            slot,
            immediate: true,
        };
    }
    if let Some(running) = ours().find(|c| !c.done) {
        return Decision::Wait {
            running: running.name.clone(),
        };
    }
    // The latest slot owed: after the last one handled (or the schedule's creation), at or
    // before now. Earlier missed slots are not replayed.
    let since = status.resume_after().unwrap_or(spec.created_at);
    let Some(slot) = spec.cron.latest_in(since, now, &spec.time_zone) else {
        return Decision::Idle;
    };
    let name = child_name(&spec.name, slot);
    out.last_handled_slot = Some(slot);
    match children.iter().find(|c| c.name == name) {
        Some(c) if c.ours => {
            out.last_schedule_time = Some(slot);
            Decision::Adopt { name, slot }
        }
        // Not ours: the slot is skipped, and it is not a `lastScheduleTime` (seed 001: the
        // last slot that produced or adopted a backup).
        Some(_) => Decision::SkipCollision { name, slot },
        None => {
            out.last_schedule_time = Some(slot);
            Decision::Create {
                name,
                slot,
                immediate: false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_gap_covers_weekends_and_months() {
        let utc = TimeZone::UTC;
        let friday: Timestamp = "2026-11-27T12:00:00Z".parse().unwrap();
        let gap = |expr: &str| {
            expr.parse::<Cron>()
                .unwrap()
                .longest_gap(friday, &utc)
                .map(|d| d.as_hours())
        };
        assert_eq!(gap("0 0 2 * * *"), Some(24));
        assert_eq!(gap("0 0 2 * * 1-5"), Some(72), "Friday to Monday");
        assert_eq!(gap("0 0 */6 * * *"), Some(6));
        assert_eq!(gap("0 0 3 1 * *"), Some(31 * 24), "December to January");
        assert_eq!(gap("@yearly"), Some(365 * 24));
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn cron(s: &str) -> Cron {
        s.parse().unwrap()
    }

    fn spec(schedule: &str) -> ScheduleSpec {
        ScheduleSpec {
            name: "cluster-sample-daily".into(),
            cron: cron(schedule),
            time_zone: TimeZone::UTC,
            immediate: false,
            suspend: false,
            created_at: ts("2026-11-20T00:00:00Z"),
        }
    }

    fn child(name: &str, ours: bool, done: bool) -> Child {
        Child {
            name: name.into(),
            ours,
            immediate: false,
            done,
            slot: None,
        }
    }

    #[test]
    fn six_fields_and_macros_parse_and_five_are_refused_with_their_six_field_form() {
        for ok in ["0 0 2 * * *", "0 */15 * * * *", "30 0 */6 * * *"] {
            assert!(ok.parse::<Cron>().is_ok(), "{ok}");
        }
        // A macro is its six-field meaning. The user's spelling is kept.
        let tz = TimeZone::UTC;
        let at = ts("2026-11-20T01:07:00Z");
        for (mac, six) in [
            ("@hourly", "0 0 * * * *"),
            ("@daily", "0 0 0 * * *"),
            ("@MIDNIGHT", "0 0 0 * * *"),
            ("@weekly", "0 0 0 * * 0"),
            ("@monthly", "0 0 0 1 * *"),
            ("@yearly", "0 0 0 1 1 *"),
            (" @annually ", "0 0 0 1 1 *"),
        ] {
            let c = cron(mac);
            assert_eq!(c.as_str(), mac);
            let mut t = at;
            for _ in 0..3 {
                let next = c.next_after(t, &tz);
                assert_eq!(next, cron(six).next_after(t, &tz), "{mac} after {t}");
                t = next.unwrap();
            }
        }
        // Seed 001: five fields are refused, never read minute first nor shifted; the
        // message gives the six-field form of what was typed.
        for (five, six) in [
            ("0 2 * * *", "0 0 2 * * *"),
            ("*/5 * * * *", "0 */5 * * * *"),
            ("  0   2 * *  MON-FRI ", "0 0 2 * * MON-FRI"),
        ] {
            let e = five.parse::<Cron>().unwrap_err();
            assert!(matches!(e, ScheduleError::FiveFields { .. }), "{e}");
            let e = e.to_string();
            assert!(
                e.contains("has five fields; schedules need six, seconds first")
                    && e.contains(&format!("did you mean \"{six}\"?")),
                "{five}: {e}"
            );
            assert!(six.parse::<Cron>().is_ok(), "{six}");
        }
        let e = "0 0 2 * * * 2027".parse::<Cron>().unwrap_err().to_string();
        assert!(
            e.contains("has 7 fields") && e.contains("\"0 0 2 * * *\""),
            "{e}"
        );
        assert!(e.contains("six fields") && e.contains("@daily"), "{e}");
        for bad in ["* * * *", "@reboot", "@every 5m", ""] {
            let e = bad.parse::<Cron>().unwrap_err().to_string();
            assert!(e.contains("seconds first"), "{bad}: {e}");
        }
        let e = "0 0 25 * * *".parse::<Cron>().unwrap_err();
        assert!(matches!(e, ScheduleError::Invalid { .. }), "{e}");
    }

    #[test]
    fn seed_examples_fire_when_the_seed_says() {
        let tz = TimeZone::UTC;
        let at = ts("2026-11-20T01:00:00Z");
        assert_eq!(
            cron("0 0 2 * * *").next_after(at, &tz),
            Some(ts("2026-11-20T02:00:00Z"))
        );
        assert_eq!(
            cron("0 */15 * * * *").next_after(at, &tz),
            Some(ts("2026-11-20T01:15:00Z"))
        );
        assert_eq!(
            cron("30 0 */6 * * *").next_after(at, &tz),
            Some(ts("2026-11-20T06:00:30Z"))
        );
    }

    #[test]
    fn slots_follow_the_wall_clock_of_the_time_zone() {
        let paris = TimeZone::get("Europe/Paris").unwrap();
        // 02:00 in Paris is 01:00 UTC in winter.
        assert_eq!(
            cron("0 0 2 * * *").next_after(ts("2026-11-20T00:00:00Z"), &paris),
            Some(ts("2026-11-20T01:00:00Z"))
        );
        // 2027-03-28: 02:00–03:00 does not exist in Paris; the slot fires when the gap
        // ends, at 03:00 local (01:00 UTC), once.
        assert_eq!(
            cron("0 30 2 * * *").next_after(ts("2027-03-27T12:00:00Z"), &paris),
            Some(ts("2027-03-28T01:00:00Z"))
        );
        assert_eq!(
            cron("0 30 2 * * *").next_after(ts("2027-03-28T01:00:00Z"), &paris),
            Some(ts("2027-03-29T00:30:00Z"))
        );
        // 2026-10-25: 02:00–03:00 happens twice in Paris; a daily 02:30 fires once, at the
        // first (00:30 UTC), and the next day as usual.
        assert_eq!(
            cron("0 30 2 * * *").next_after(ts("2026-10-24T12:00:00Z"), &paris),
            Some(ts("2026-10-25T00:30:00Z"))
        );
        assert_eq!(
            cron("0 30 2 * * *").next_after(ts("2026-10-25T00:30:00Z"), &paris),
            Some(ts("2026-10-26T01:30:00Z"))
        );
    }

    /// Standard cron fields (DESIGN.md §4), each row: expression, instant, next slot.
    #[test]
    fn fields_mean_what_standard_cron_means() {
        let utc = TimeZone::UTC;
        // 2026-11-22 is a Sunday.
        let sunday = ts("2026-11-22T12:00:00Z");
        let rows = [
            // Monday to Friday, not Sunday to Thursday.
            ("0 0 2 * * 1-5", sunday, "2026-11-23T02:00:00Z"),
            (
                "0 0 2 * * 1-5",
                ts("2026-11-27T03:00:00Z"),
                "2026-11-30T02:00:00Z",
            ),
            // Names.
            ("0 0 2 * * MON-FRI", sunday, "2026-11-23T02:00:00Z"),
            ("0 0 2 * * SAT", sunday, "2026-11-28T02:00:00Z"),
            ("0 0 0 1 JAN *", sunday, "2027-01-01T00:00:00Z"),
            // Sunday is 0 and 7.
            (
                "0 0 2 * * 0",
                ts("2026-11-21T12:00:00Z"),
                "2026-11-22T02:00:00Z",
            ),
            (
                "0 0 2 * * 7",
                ts("2026-11-21T12:00:00Z"),
                "2026-11-22T02:00:00Z",
            ),
            // Both day fields restricted: either matches (Monday the 23rd, before the 1st).
            ("0 0 0 1 * MON", sunday, "2026-11-23T00:00:00Z"),
            (
                "0 0 0 1 * MON",
                ts("2026-11-30T01:00:00Z"),
                "2026-12-01T00:00:00Z",
            ),
            // Steps and lists.
            (
                "*/20 * * * * *",
                ts("2026-11-22T12:00:05Z"),
                "2026-11-22T12:00:20Z",
            ),
            ("0 0 6,18 * * *", sunday, "2026-11-22T18:00:00Z"),
        ];
        for (expr, at, want) in rows {
            assert_eq!(
                cron(expr).next_after(at, &utc),
                Some(ts(want)),
                "{expr} after {at}"
            );
        }
    }

    #[test]
    fn deterministic_names_use_the_utc_slot() {
        assert_eq!(
            child_name("cluster-sample-daily", ts("2026-11-20T02:00:00Z")),
            "cluster-sample-daily-20261120020000"
        );
    }

    #[test]
    fn first_check_stamps_status_and_due_slot_creates() {
        let s = spec("0 0 2 * * *");
        let e = evaluate(
            &s,
            &ScheduleStatus::default(),
            &[],
            ts("2026-11-20T01:00:00Z"),
        );
        assert_eq!(e.decision, Decision::Idle);
        assert_eq!(e.status.last_check_time, Some(ts("2026-11-20T01:00:00Z")));
        assert_eq!(e.status.last_schedule_time, None);
        assert_eq!(
            e.status.next_schedule_time,
            Some(ts("2026-11-20T02:00:00Z"))
        );

        let e = evaluate(&s, &e.status, &[], ts("2026-11-20T02:00:03Z"));
        assert_eq!(
            e.decision,
            Decision::Create {
                name: "cluster-sample-daily-20261120020000".into(),
                slot: ts("2026-11-20T02:00:00Z"),
                immediate: false
            }
        );
        assert_eq!(
            e.status.last_schedule_time,
            Some(ts("2026-11-20T02:00:00Z"))
        );
        assert_eq!(
            e.status.next_schedule_time,
            Some(ts("2026-11-21T02:00:00Z"))
        );
        // The same slot is not created twice.
        let again = evaluate(&s, &e.status, &[], ts("2026-11-20T02:00:09Z"));
        assert_eq!(again.decision, Decision::Idle);
    }

    #[test]
    fn immediate_creates_once_and_adopts_after_a_lost_status_update() {
        let s = ScheduleSpec {
            immediate: true,
            ..spec("0 0 2 * * *")
        };
        let now = ts("2026-11-20T10:15:42.5Z");
        let e = evaluate(&s, &ScheduleStatus::default(), &[], now);
        assert_eq!(
            e.decision,
            Decision::Create {
                name: "cluster-sample-daily-20261120101542".into(),
                slot: ts("2026-11-20T10:15:42Z"),
                immediate: true
            }
        );
        // The status update was lost: the labelled child is adopted, not created again.
        let created = Child {
            immediate: true,
            slot: Some(ts("2026-11-20T10:15:42Z")),
            ..child("cluster-sample-daily-20261120101542", true, false)
        };
        let e = evaluate(&s, &ScheduleStatus::default(), &[created], now);
        assert!(matches!(e.decision, Decision::Adopt { .. }), "{e:?}");
        assert_eq!(
            e.status.last_schedule_time,
            Some(ts("2026-11-20T10:15:42Z"))
        );
    }

    #[test]
    fn no_new_slot_while_a_child_runs() {
        let s = spec("0 */15 * * * *");
        let status = ScheduleStatus {
            last_schedule_time: Some(ts("2026-11-20T10:00:00Z")),
            ..Default::default()
        };
        let running = child("cluster-sample-daily-20261120100000", true, false);
        let e = evaluate(&s, &status, &[running], ts("2026-11-20T10:15:01Z"));
        assert_eq!(
            e.decision,
            Decision::Wait {
                running: "cluster-sample-daily-20261120100000".into()
            }
        );
        assert_eq!(e.status.last_schedule_time, status.last_schedule_time);
        // Someone else's running backup does not hold this schedule.
        let foreign = child("other-20261120100000", false, false);
        let e = evaluate(&s, &status, &[foreign], ts("2026-11-20T10:15:01Z"));
        assert!(matches!(e.decision, Decision::Create { .. }), "{e:?}");
    }

    #[test]
    fn a_taken_name_skips_the_slot_and_resumes_at_the_next() {
        let s = spec("0 */15 * * * *");
        let status = ScheduleStatus {
            last_schedule_time: Some(ts("2026-11-20T10:00:00Z")),
            ..Default::default()
        };
        let squatter = child("cluster-sample-daily-20261120101500", false, true);
        let e = evaluate(
            &s,
            &status,
            std::slice::from_ref(&squatter),
            ts("2026-11-20T10:15:01Z"),
        );
        assert_eq!(
            e.decision,
            Decision::SkipCollision {
                name: "cluster-sample-daily-20261120101500".into(),
                slot: ts("2026-11-20T10:15:00Z")
            }
        );
        // The skipped slot is where evaluation resumes, not a lastScheduleTime.
        assert_eq!(e.status.last_schedule_time, status.last_schedule_time);
        assert_eq!(e.status.last_handled_slot, Some(ts("2026-11-20T10:15:00Z")));
        assert_eq!(
            e.status.next_schedule_time,
            Some(ts("2026-11-20T10:30:00Z"))
        );
        let again = evaluate(
            &s,
            &e.status,
            std::slice::from_ref(&squatter),
            ts("2026-11-20T10:15:30Z"),
        );
        assert_eq!(again.decision, Decision::Idle);
        let next = evaluate(&s, &e.status, &[squatter], ts("2026-11-20T10:30:00Z"));
        assert!(
            matches!(&next.decision, Decision::Create { name, .. } if name.ends_with("103000")),
            "{next:?}"
        );
        // Our own child under the name (created, status lost): adopted.
        let ours = child("cluster-sample-daily-20261120101500", true, true);
        let e = evaluate(&s, &status, &[ours], ts("2026-11-20T10:15:01Z"));
        assert!(matches!(e.decision, Decision::Adopt { .. }), "{e:?}");
    }

    #[test]
    fn after_downtime_one_catch_up_run_not_a_burst() {
        let s = spec("0 */15 * * * *");
        let status = ScheduleStatus {
            last_schedule_time: Some(ts("2026-11-20T10:00:00Z")),
            ..Default::default()
        };
        // Down from 10:05 to 16:07: 24 slots missed; only the latest runs.
        let e = evaluate(&s, &status, &[], ts("2026-11-20T16:07:00Z"));
        assert_eq!(
            e.decision,
            Decision::Create {
                name: "cluster-sample-daily-20261120160000".into(),
                slot: ts("2026-11-20T16:00:00Z"),
                immediate: false
            }
        );
        let e = evaluate(&s, &e.status, &[], ts("2026-11-20T16:08:00Z"));
        assert_eq!(e.decision, Decision::Idle);
        // A per-second schedule after a week away still answers at once.
        let fast = spec("* * * * * *");
        let e = evaluate(&fast, &status, &[], ts("2026-11-27T10:00:00Z"));
        assert!(
            matches!(&e.decision, Decision::Create { slot, .. } if *slot == ts("2026-11-27T10:00:00Z")),
            "{e:?}"
        );
    }

    #[test]
    fn suspended_creates_nothing_but_keeps_status() {
        let s = ScheduleSpec {
            suspend: true,
            immediate: true,
            ..spec("0 0 2 * * *")
        };
        let e = evaluate(
            &s,
            &ScheduleStatus::default(),
            &[],
            ts("2026-11-21T03:00:00Z"),
        );
        assert_eq!(e.decision, Decision::Suspended);
        assert_eq!(e.status.last_check_time, Some(ts("2026-11-21T03:00:00Z")));
        assert_eq!(
            e.status.next_schedule_time,
            Some(ts("2026-11-22T02:00:00Z"))
        );
    }
}
