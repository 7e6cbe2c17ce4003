//! Intervals and timeouts (`30s`, `10m`, `1h`, `1h30m`): one grammar and one set of bounds
//! for the CRDs' CEL rules, the operator's own check (API servers before 1.25 have no CEL)
//! and standalone `tidemark run`. Every interval has a documented maximum, so no value a
//! user writes can overflow the time arithmetic it meets (`now + interval`).

use jiff::SignedDuration;

/// One bounded interval field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntervalField {
    /// Where it is written, e.g. `spec.retentionInterval`.
    pub field: &'static str,
    /// The value when the field is absent.
    pub default: &'static str,
    /// The largest accepted value, in the field's own grammar.
    pub max: &'static str,
    max_secs: i64,
}

/// Longest accepted text (the CRD's `maxLength`). The grammar is one or more
/// `<digits><unit>` groups of at most five digits each, so no sum can overflow.
pub const MAX_LEN: usize = 24;

/// CEL for an interval bounded by `$max` (a literal such as `"168h"`): the grammar, then the
/// span between one second and the maximum.
macro_rules! interval_rule {
    ($max:literal) => {
        concat!(
            "self.matches('^([0-9]{1,5}(h|m|s))+$') && duration(self) >= duration('1s') && duration(self) <= duration('",
            $max,
            "')"
        )
    };
}

/// `spec.retentionInterval` of a BackupPolicy: at most a week.
pub const RETENTION_INTERVAL: IntervalField = IntervalField {
    field: "spec.retentionInterval",
    default: "1h",
    max: "168h",
    max_secs: 168 * 3600,
};
pub(crate) const RETENTION_INTERVAL_RULE: &str = interval_rule!("168h");
pub(crate) const RETENTION_INTERVAL_MESSAGE: &str =
    "expected an interval from 1s to 168h (a week), such as 30s, 10m, 1h or 1h30m";

/// `spec.binlogArchive.interval` of a BackupPolicy (and `archive-binlogs --interval`): at
/// most an hour.
pub const BINLOG_INTERVAL: IntervalField = IntervalField {
    field: "spec.binlogArchive.interval",
    default: "10s",
    max: "1h",
    max_secs: 3600,
};
pub(crate) const BINLOG_INTERVAL_RULE: &str = interval_rule!("1h");
pub(crate) const BINLOG_INTERVAL_MESSAGE: &str =
    "expected an interval from 1s to 1h, such as 10s, 1m or 5m";

/// `spec.binlogArchive.maxLag` of a BackupPolicy: how far the archive may fall behind the
/// server (its newest archived event against the server's newest) before the policy says so
/// (`BinlogArchiveCurrent=False`, an event); at most a day.
pub const BINLOG_MAX_LAG: IntervalField = IntervalField {
    field: "spec.binlogArchive.maxLag",
    default: "5m",
    max: "24h",
    max_secs: 24 * 3600,
};
pub(crate) const BINLOG_MAX_LAG_RULE: &str = interval_rule!("24h");
pub(crate) const BINLOG_MAX_LAG_MESSAGE: &str =
    "expected a duration from 1s to 24h, such as 1m, 5m or 1h";

/// `spec.binlogArchive.checksums.every` of a BackupPolicy (issue 48): at most a week.
pub const CHECKSUMS_EVERY: IntervalField = IntervalField {
    field: "spec.binlogArchive.checksums.every",
    default: "1h",
    max: "168h",
    max_secs: 168 * 3600,
};
pub(crate) const CHECKSUMS_EVERY_RULE: &str = interval_rule!("168h");
pub(crate) const CHECKSUMS_EVERY_MESSAGE: &str =
    "expected an interval from 1s to 168h, such as 30m, 1h or 24h";

/// `spec.copies[].maxLag` of a BackupPolicy: how far a copy may fall behind its source
/// before it is loud (condition, event, alert); at most a week.
pub const COPY_MAX_LAG: IntervalField = IntervalField {
    field: "spec.copies[].maxLag",
    default: "1h",
    max: "168h",
    max_secs: 168 * 3600,
};
pub(crate) const COPY_MAX_LAG_RULE: &str = interval_rule!("168h");
pub(crate) const COPY_MAX_LAG_MESSAGE: &str =
    "expected a duration from 1s to 168h, such as 30m, 1h or 24h";

/// `spec.source.standbyMaxLag` of a BackupPolicy: how far a standby may lag behind its
/// primary to be backed up; at most a day.
pub const STANDBY_MAX_LAG: IntervalField = IntervalField {
    field: "spec.source.standbyMaxLag",
    default: "5m",
    max: "24h",
    max_secs: 24 * 3600,
};

/// `spec.timeout` of a DeleteHook: at most an hour.
pub const HOOK_TIMEOUT: IntervalField = IntervalField {
    field: "spec.timeout",
    default: "5m",
    max: "1h",
    max_secs: 3600,
};
pub(crate) const HOOK_TIMEOUT_RULE: &str = interval_rule!("1h");
pub(crate) const HOOK_TIMEOUT_MESSAGE: &str =
    "expected a timeout from 1s to 1h, such as 30s, 5m or 1h";

/// `spec.source.primaryReadyFor` of a BackupPolicy: how long the primary must have been
/// Running and Ready before retention deletes anything; at most a day.
pub const PRIMARY_READY_FOR: IntervalField = IntervalField {
    field: "spec.source.primaryReadyFor",
    default: "5m",
    max: "24h",
    max_secs: 24 * 3600,
};
pub(crate) const PRIMARY_READY_FOR_RULE: &str = interval_rule!("24h");
pub(crate) const PRIMARY_READY_FOR_MESSAGE: &str =
    "expected a duration from 1s to 24h, such as 30s, 5m or 1h";

/// `TIDEMARK_LEASE_TTL`: how long a store lease (`_state/lease.json`) lasts without
/// renewal; at most an hour (a crashed holder keeps deleters out that long), and the
/// engine refuses less than 3 s (renewals every second would be most of a slow store's
/// traffic).
pub const LEASE_TTL: IntervalField = IntervalField {
    field: "TIDEMARK_LEASE_TTL",
    default: "60s",
    max: "1h",
    max_secs: 3600,
};

impl IntervalField {
    /// A command-line value named `field`, from 1 s to `max` (`max_secs` seconds); absent,
    /// it is `max`.
    pub const fn named(field: &'static str, max: &'static str, max_secs: i64) -> Self {
        IntervalField {
            field,
            default: max,
            max,
            max_secs,
        }
    }

    /// `tidemark operator --exec-max-duration`: at most a week.
    pub fn exec_max_duration() -> Self {
        IntervalField {
            field: "--exec-max-duration",
            default: "24h",
            max: "168h",
            max_secs: 168 * 3600,
        }
    }
}

/// Why an interval was refused: the field, the value and the accepted form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{field}: invalid interval {value:?}: {problem}; expected 1s to {max} written as <n>h, <n>m and <n>s (at most 5 digits each), e.g. 30s, 10m, 1h or 1h30m"
)]
pub struct IntervalError {
    pub field: &'static str,
    pub value: String,
    pub problem: &'static str,
    pub max: &'static str,
}

impl IntervalField {
    /// Parses `value` (the default when absent) and checks the bounds.
    ///
    /// # Errors
    /// Not the grammar, shorter than a second, or longer than the maximum.
    pub fn parse(&self, value: Option<&str>) -> Result<SignedDuration, IntervalError> {
        let text = value.unwrap_or(self.default);
        let err = |problem| IntervalError {
            field: self.field,
            value: text.chars().take(64).collect(),
            problem,
            max: self.max,
        };
        if text.len() > MAX_LEN {
            return Err(err("too long"));
        }
        let mut secs: i64 = 0;
        let mut digits = String::new();
        for c in text.chars() {
            if c.is_ascii_digit() {
                if digits.len() == 5 {
                    return Err(err("more than 5 digits before a unit"));
                }
                digits.push(c);
                continue;
            }
            let unit = match c {
                'h' => 3600,
                'm' => 60,
                's' => 1,
                _ => return Err(err("not <n>h, <n>m and <n>s")),
            };
            if digits.is_empty() {
                return Err(err("a unit without a number"));
            }
            // Five digits times 3600, at most MAX_LEN / 2 groups: far from overflow.
            let n: i64 = digits.parse().map_err(|_| err("not a number"))?;
            secs += n * unit;
            digits.clear();
        }
        if !digits.is_empty() || text.is_empty() {
            return Err(err("a number without a unit"));
        }
        if secs < 1 {
            return Err(err("shorter than one second"));
        }
        if secs > self.max_secs {
            return Err(err("longer than the maximum"));
        }
        Ok(SignedDuration::from_secs(secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_grammar_within_bounds() {
        let f = RETENTION_INTERVAL;
        assert_eq!(f.parse(None).unwrap(), SignedDuration::from_hours(1));
        assert_eq!(f.parse(Some("30s")).unwrap(), SignedDuration::from_secs(30));
        assert_eq!(
            f.parse(Some("1h30m")).unwrap(),
            SignedDuration::from_mins(90)
        );
        assert_eq!(
            f.parse(Some("168h")).unwrap(),
            SignedDuration::from_hours(168)
        );
        assert_eq!(
            f.parse(Some("86400s")).unwrap(),
            SignedDuration::from_hours(24)
        );
    }

    #[test]
    fn refuses_with_the_value_and_the_form() {
        let f = RETENTION_INTERVAL;
        for (bad, problem) in [
            ("70000000h", "more than 5 digits"),
            ("169h", "longer than the maximum"),
            ("0s", "shorter than one second"),
            ("", "a number without a unit"),
            ("10", "a number without a unit"),
            ("h", "a unit without a number"),
            ("1d", "not <n>h"),
            ("-1h", "not <n>h"),
            ("1 h", "not <n>h"),
            ("99999h99999h99999h99999h1s", "too long"),
        ] {
            let e = f.parse(Some(bad)).unwrap_err();
            assert!(e.problem.starts_with(problem), "{bad}: {e}");
            let text = e.to_string();
            assert!(
                text.starts_with("spec.retentionInterval: invalid interval")
                    && text.contains("168h")
                    && text.contains("e.g. 30s"),
                "{text}"
            );
        }
        assert!(HOOK_TIMEOUT.parse(Some("2h")).is_err());
        assert!(BINLOG_INTERVAL.parse(Some("61m")).is_err());
    }
}
