//! The retention duration grammar of seed 000: `<n>d`, `<n>w` or `<n>mo`, where a month is
//! exactly 30 days. Calendar-free on purpose: "30d" must mean the same span in every time
//! zone and across daylight-saving changes, so a retention window never silently shrinks.
//!
//! Seed 000 spells months `<n>m` ("`<n>d`, `<n>w`, or `<n>m` (days, weeks, months, where a
//! month is 30 days)"), and that spelling is always accepted in a retention duration: it is
//! the seed's. But intervals (`retentionInterval`, hook timeouts, `--grace`) read `m` as
//! minutes, so `ttl: 90m` meant for ninety minutes is 2,700 days here:
//! [`RetentionDuration::is_ambiguous`] tells, and every reader of user input warns with
//! [`Ambiguous`], naming both readings and the unambiguous spellings. A warning, never a
//! refusal.

use std::fmt;
use std::str::FromStr;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Seconds in a day; days are fixed 24-hour spans (see the module docs).
const SECONDS_PER_DAY: i64 = 86_400;

/// The accepted form, quoted in every parse error so the user can fix the value at once.
pub const DURATION_FORM: &str =
    "<n>d, <n>w or <n>mo (days, weeks, or months of 30 days), e.g. 30d, 4w, 12mo";

/// Largest accepted count: 100 years of days keeps all arithmetic far from overflow.
const MAX_DAYS: i64 = 36_500;

/// The unit of a [`RetentionDuration`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DurationUnit {
    Days,
    Weeks,
    /// A month is 30 days (seed 000), written `mo`.
    Months,
    /// A month written `m`, as seed 000 does: the same 30 days, but `m` is a minute in
    /// intervals, so reading it warns (never refused; see the module docs).
    AmbiguousMonths,
}

impl DurationUnit {
    fn days(self) -> i64 {
        match self {
            DurationUnit::Days => 1,
            DurationUnit::Weeks => 7,
            DurationUnit::Months | DurationUnit::AmbiguousMonths => 30,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            DurationUnit::Days => "d",
            DurationUnit::Weeks => "w",
            DurationUnit::Months => "mo",
            DurationUnit::AmbiguousMonths => "m",
        }
    }
}

/// A span written as `<n>d`, `<n>w` or `<n>mo` (or seed 000's ambiguous `<n>m`). Keeps the user's
/// spelling for display.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetentionDuration {
    count: u32,
    unit: DurationUnit,
}

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {value:?}: {problem}; expected {DURATION_FORM}")]
pub struct DurationError {
    /// The offending input, verbatim.
    pub value: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl RetentionDuration {
    pub fn new(count: u32, unit: DurationUnit) -> Result<Self, DurationError> {
        let d = RetentionDuration { count, unit };
        if d.days() > MAX_DAYS {
            return Err(DurationError {
                value: d.to_string(),
                problem: "longer than 36500 days",
            });
        }
        Ok(d)
    }

    pub fn days(self) -> i64 {
        i64::from(self.count) * self.unit.days()
    }

    /// Written `<n>m`: months of 30 days here, minutes in an interval (see the module docs).
    pub fn is_ambiguous(self) -> bool {
        self.unit == DurationUnit::AmbiguousMonths
    }

    pub fn as_signed_duration(self) -> SignedDuration {
        SignedDuration::from_secs(self.days() * SECONDS_PER_DAY)
    }

    /// `t - self`, saturating at the earliest representable instant.
    pub fn before(self, t: Timestamp) -> Timestamp {
        t.checked_sub(self.as_signed_duration())
            .unwrap_or(Timestamp::MIN)
    }

    /// `t + self`, saturating at the latest representable instant.
    pub fn after(self, t: Timestamp) -> Timestamp {
        t.checked_add(self.as_signed_duration())
            .unwrap_or(Timestamp::MAX)
    }
}

/// `t + d`, saturating at the representable instants: a time read from a status, a state
/// file or a store never makes the arithmetic panic.
pub fn saturating_add(t: Timestamp, d: SignedDuration) -> Timestamp {
    t.checked_add(d).unwrap_or(if d.is_negative() {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    })
}

impl fmt::Display for RetentionDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.count, self.unit.suffix())
    }
}

impl FromStr for RetentionDuration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |problem| DurationError {
            value: s.to_owned(),
            problem,
        };
        let trimmed = s.trim();
        if trimmed.is_empty() {
            return Err(err("it is empty"));
        }
        let Some(last) = trimmed.chars().last() else {
            return Err(err("it is empty"));
        };
        if last.is_ascii_digit() {
            return Err(err("it has no unit"));
        }
        let (unit, digits) = if let Some(digits) = trimmed.strip_suffix("mo") {
            (DurationUnit::Months, digits)
        } else {
            let unit = match last {
                'd' => DurationUnit::Days,
                'w' => DurationUnit::Weeks,
                'm' => DurationUnit::AmbiguousMonths,
                _ => return Err(err("its unit is not d, w or mo")),
            };
            (unit, &trimmed[..trimmed.len() - last.len_utf8()])
        };
        if digits.starts_with('-') {
            return Err(err("it is negative"));
        }
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("the count before the unit is not a whole number"));
        }
        let count: u32 = digits.parse().map_err(|_| err("the count is too large"))?;
        RetentionDuration::new(count, unit).map_err(|_| err("longer than 36500 days"))
    }
}

/// A retention duration the user wrote with seed 000's ambiguous `m`, and where: the warning the
/// CLI prints and the operator's `AmbiguousDuration` event carry (its `Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ambiguous {
    /// Where it was written: a field path (`spec.retention.window`) or a flag (`--ttl`).
    pub field: String,
    /// The value, verbatim.
    pub value: RetentionDuration,
}

impl Ambiguous {
    /// `value` read from `field` when it is a valid duration written `<n>m`; `None` for
    /// anything else (an invalid value is the parser's to refuse).
    pub fn check(field: impl Into<String>, value: Option<&str>) -> Option<Ambiguous> {
        let value = value?.parse::<RetentionDuration>().ok()?;
        value.is_ambiguous().then(|| Ambiguous {
            field: field.into(),
            value,
        })
    }
}

impl fmt::Display for Ambiguous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.value.count;
        let (months, minutes) = if n == 1 {
            ("month", "minute")
        } else {
            ("months", "minutes")
        };
        write!(
            f,
            "{} {:?} is read as {n} {months} of 30 days ({} days), not {n} {minutes} as \"m\" means in intervals; write \"{n}mo\" (or \"{}d\") to say months unambiguously, or use an interval field for minutes. \"<n>m\" stays accepted as months of 30 days, as seed 000 spells them (docs/retention.md#durations)",
            self.field,
            self.value.to_string(),
            self.value.days(),
            self.value.days()
        )
    }
}

impl Serialize for RetentionDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RetentionDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_seed_grammar() {
        let cases = [
            ("30d", 30),
            ("1w", 7),
            ("4w", 28),
            ("1m", 30),
            ("12m", 360),
            ("1mo", 30),
            ("12mo", 360),
            ("0d", 0),
        ];
        for (text, days) in cases {
            let d: RetentionDuration = text.parse().unwrap();
            assert_eq!(d.days(), days, "{text}");
            assert_eq!(d.to_string(), text);
            assert_eq!(
                d.is_ambiguous(),
                !text.ends_with("mo") && text.ends_with('m')
            );
        }
    }

    #[test]
    fn months_written_m_warn_naming_both_readings_and_the_spellings() {
        let a = Ambiguous::check("spec.ttl", Some("90m")).unwrap();
        let text = a.to_string();
        for part in [
            "spec.ttl \"90m\"",
            "90 months of 30 days (2700 days)",
            "not 90 minutes",
            "\"90mo\"",
            "\"2700d\"",
            "stays accepted as months of 30 days",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
        for never in ["deprecated", "refused", "later release"] {
            assert!(!text.contains(never), "{never:?} in {text}");
        }
        for fine in [
            Some("90mo"),
            Some("90d"),
            Some("4w"),
            Some("nonsense"),
            None,
        ] {
            assert_eq!(Ambiguous::check("spec.ttl", fine), None, "{fine:?}");
        }
    }

    #[test]
    fn refuses_bad_input_naming_value_and_form() {
        let cases = [
            ("30", "it has no unit"),
            ("30h", "its unit is not d, w or mo"),
            ("30y", "its unit is not d, w or mo"),
            ("mo", "the count before the unit is not a whole number"),
            ("3 mo", "the count before the unit is not a whole number"),
            ("-3d", "it is negative"),
            ("", "it is empty"),
            ("d", "the count before the unit is not a whole number"),
            ("1.5d", "the count before the unit is not a whole number"),
            ("99999999999d", "the count is too large"),
            ("40000d", "longer than 36500 days"),
        ];
        for (text, problem) in cases {
            let e = text.parse::<RetentionDuration>().unwrap_err();
            assert_eq!(e.problem, problem, "{text}");
            let msg = e.to_string();
            assert!(msg.contains(&format!("{text:?}")), "{msg}");
            assert!(msg.contains("<n>d, <n>w or <n>mo"), "{msg}");
        }
    }

    #[test]
    fn arithmetic_is_in_whole_days() {
        let t: Timestamp = "2026-11-20T02:00:00Z".parse().unwrap();
        let d: RetentionDuration = "1m".parse().unwrap();
        assert_eq!(d.before(t).to_string(), "2026-10-21T02:00:00Z");
        assert_eq!(d.after(t).to_string(), "2026-12-20T02:00:00Z");
    }
}
