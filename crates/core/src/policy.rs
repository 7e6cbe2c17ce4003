//! A validated retention policy (DESIGN.md §5.1). Construction is the only place input is
//! checked; a `Policy` value is always usable by the planner.

use jiff::tz::TimeZone;
use serde::Serialize;

use crate::duration::RetentionDuration;

/// The accepted form of a count, quoted in errors.
pub const COUNT_FORM: &str = "a whole number from 0 to 100000";

/// Upper bound for counts: far beyond any real policy, small enough for any arithmetic.
const MAX_COUNT: i64 = 100_000;

/// A policy that is checked and ready for [`crate::plan`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    pub window: Option<RetentionDuration>,
    pub keep_last: u32,
    pub keep_daily: u32,
    pub keep_weekly: u32,
    pub keep_monthly: u32,
    pub keep_yearly: u32,
    #[serde(rename = "failedBackupsTTL")]
    pub failed_backups_ttl: Option<RetentionDuration>,
    pub cover_window: bool,
    pub consolidate: bool,
    /// 0 = no cap.
    pub max_deletions_per_pass: u32,
    /// Delete no backup until the newest one (and its chain) was read back whole.
    pub require_verified: bool,
    /// GFS buckets are calendar days/weeks/months/years in this zone.
    #[serde(serialize_with = "serialize_tz")]
    pub time_zone: TimeZone,
    /// Branch segments (off the archive's main line) whose last event is at or before this
    /// instant were looked at and may go by the ordinary rule (`--acknowledge-branches`,
    /// the annotation `tidemark.io/acknowledge-branches`); later ones are kept for
    /// `window`, or, without one, until acknowledged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branches_acknowledged: Option<jiff::Timestamp>,
    /// `pointInTime.window`: every instant of this span before now restores by replay;
    /// binlog segments are kept from the start of the newest backup completed at or before
    /// its start, and backups kept for longer by other rules restore to their own point
    /// only (`standalone`). `None`: the window of the retained backups (DESIGN.md §5.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub point_in_time_window: Option<RetentionDuration>,
    /// `deletionGuard`: when a pass is held for acknowledgement (DESIGN.md §5.5).
    pub deletion_guard: DeletionGuard,
}

/// The breaker on mass deletion: a pass that would delete more than `threshold` recovery
/// points *and* more than half of those the store holds, or move the start of either
/// window later by more than `window`, deletes nothing of that wave until acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeletionGuard {
    /// 0: the count never trips the guard.
    pub threshold: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<RetentionDuration>,
}

/// The default `deletionGuard.threshold`.
pub const DEFAULT_GUARD_THRESHOLD: u32 = 10;

impl Default for DeletionGuard {
    fn default() -> Self {
        DeletionGuard {
            threshold: DEFAULT_GUARD_THRESHOLD,
            window: None,
        }
    }
}

fn serialize_tz<S: serde::Serializer>(tz: &TimeZone, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(tz.iana_name().unwrap_or("UTC"))
}

/// Unvalidated policy input, as written in YAML or given as flags. Counts are signed so a
/// negative value gets a message of ours rather than a parser's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyInput {
    pub window: Option<String>,
    pub keep_last: Option<i64>,
    pub keep_daily: Option<i64>,
    pub keep_weekly: Option<i64>,
    pub keep_monthly: Option<i64>,
    pub keep_yearly: Option<i64>,
    pub failed_backups_ttl: Option<String>,
    pub cover_window: Option<bool>,
    pub consolidate: Option<bool>,
    pub require_verified: Option<bool>,
    pub max_deletions_per_pass: Option<i64>,
    pub time_zone: Option<String>,
    /// `pointInTime.window`.
    pub point_in_time_window: Option<String>,
    /// `deletionGuard.threshold` (default [`DEFAULT_GUARD_THRESHOLD`]).
    pub deletion_guard_threshold: Option<i64>,
    /// `deletionGuard.window`.
    pub deletion_guard_window: Option<String>,
}

/// A field of the retention policy, as it is named in YAML (`spec.retention.<name>`, or
/// `spec.timeZone`). Callers map it to their own spelling (a flag, a CRD path) by matching
/// on it, never on error text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyField {
    Window,
    KeepLast,
    KeepDaily,
    KeepWeekly,
    KeepMonthly,
    KeepYearly,
    FailedBackupsTtl,
    CoverWindow,
    Consolidate,
    MaxDeletionsPerPass,
    PointInTimeWindow,
    DeletionGuardThreshold,
    DeletionGuardWindow,
    /// Not in `retention`: the policy's `spec.timeZone`.
    TimeZone,
}

impl PolicyField {
    /// The YAML field name.
    pub fn name(self) -> &'static str {
        match self {
            PolicyField::Window => "window",
            PolicyField::KeepLast => "keepLast",
            PolicyField::KeepDaily => "keepDaily",
            PolicyField::KeepWeekly => "keepWeekly",
            PolicyField::KeepMonthly => "keepMonthly",
            PolicyField::KeepYearly => "keepYearly",
            PolicyField::FailedBackupsTtl => "failedBackupsTTL",
            PolicyField::CoverWindow => "coverWindow",
            PolicyField::Consolidate => "consolidate",
            PolicyField::MaxDeletionsPerPass => "maxDeletionsPerPass",
            PolicyField::PointInTimeWindow => "pointInTime.window",
            PolicyField::DeletionGuardThreshold => "deletionGuard.threshold",
            PolicyField::DeletionGuardWindow => "deletionGuard.window",
            PolicyField::TimeZone => "timeZone",
        }
    }
}

/// Why a policy was refused. Each variant names the field, the value and the accepted form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{}: {source}", field.name())]
    Duration {
        field: PolicyField,
        #[source]
        source: crate::duration::DurationError,
    },
    #[error("{}: invalid count {value}: expected {COUNT_FORM}", field.name())]
    Count { field: PolicyField, value: i64 },
    #[error(
        "timeZone: unknown time zone {value:?}: expected an IANA name such as UTC, Europe/Paris or America/New_York"
    )]
    TimeZone { value: String },
    #[error(
        "window: 0d keeps nothing but the newest backup, like a policy without rules: expected at least 1d (e.g. 30d)"
    )]
    ZeroWindow,
    #[error(
        "the policy has no retention rule, so it would keep only the newest backup: set at least one of window, keepLast, keepDaily, keepWeekly, keepMonthly or keepYearly"
    )]
    NoRule,
    #[error("coverWindow: needs a window to cover; set window (e.g. 30d) or remove coverWindow")]
    CoverWithoutWindow,
    #[error(
        "pointInTime.window: 0d promises no instant but the newest backup's; expected at least 1d (e.g. 14d), or remove pointInTime to keep binlogs for every retained backup"
    )]
    ZeroPointInTime,
}

impl PolicyError {
    /// The field the error is about (`None`: the policy as a whole).
    pub fn field(&self) -> Option<PolicyField> {
        match self {
            PolicyError::Duration { field, .. } | PolicyError::Count { field, .. } => Some(*field),
            PolicyError::TimeZone { .. } => Some(PolicyField::TimeZone),
            PolicyError::ZeroWindow => Some(PolicyField::Window),
            PolicyError::CoverWithoutWindow => Some(PolicyField::CoverWindow),
            PolicyError::ZeroPointInTime => Some(PolicyField::PointInTimeWindow),
            PolicyError::NoRule => None,
        }
    }

    /// The message without the field name in front, for callers that name the field their
    /// own way.
    pub fn problem(&self) -> String {
        let text = self.to_string();
        match self.field() {
            Some(f) => text
                .strip_prefix(f.name())
                .and_then(|t| t.strip_prefix(": "))
                .map(str::to_owned)
                .unwrap_or(text),
            None => text,
        }
    }
}

impl PolicyInput {
    /// Checks every field and builds a [`Policy`].
    ///
    /// # Errors
    /// The first invalid field, named with its value and accepted form; or
    /// [`PolicyError::NoRule`] when nothing would be kept but the floor.
    pub fn validate(&self) -> Result<Policy, PolicyError> {
        let duration = |field: PolicyField, v: &Option<String>| {
            v.as_deref()
                .map(|s| {
                    s.parse::<RetentionDuration>()
                        .map_err(|source| PolicyError::Duration { field, source })
                })
                .transpose()
        };
        let count = |field: PolicyField, v: Option<i64>| match v {
            None => Ok(0),
            Some(n) if (0..=MAX_COUNT).contains(&n) => Ok(n as u32),
            Some(n) => Err(PolicyError::Count { field, value: n }),
        };
        let time_zone = match self.time_zone.as_deref() {
            None | Some("") => TimeZone::UTC,
            Some(name) => TimeZone::get(name).map_err(|_| PolicyError::TimeZone {
                value: name.to_owned(),
            })?,
        };
        let policy = Policy {
            window: duration(PolicyField::Window, &self.window)?,
            keep_last: count(PolicyField::KeepLast, self.keep_last)?,
            keep_daily: count(PolicyField::KeepDaily, self.keep_daily)?,
            keep_weekly: count(PolicyField::KeepWeekly, self.keep_weekly)?,
            keep_monthly: count(PolicyField::KeepMonthly, self.keep_monthly)?,
            keep_yearly: count(PolicyField::KeepYearly, self.keep_yearly)?,
            failed_backups_ttl: duration(PolicyField::FailedBackupsTtl, &self.failed_backups_ttl)?,
            cover_window: self.cover_window.unwrap_or(false),
            consolidate: self.consolidate.unwrap_or(false),
            require_verified: self.require_verified.unwrap_or(false),
            max_deletions_per_pass: count(
                PolicyField::MaxDeletionsPerPass,
                self.max_deletions_per_pass,
            )?,
            time_zone,
            branches_acknowledged: None,
            point_in_time_window: duration(
                PolicyField::PointInTimeWindow,
                &self.point_in_time_window,
            )?,
            deletion_guard: DeletionGuard {
                threshold: match self.deletion_guard_threshold {
                    None => DEFAULT_GUARD_THRESHOLD,
                    Some(n) => count(PolicyField::DeletionGuardThreshold, Some(n))?,
                },
                window: duration(
                    PolicyField::DeletionGuardWindow,
                    &self.deletion_guard_window,
                )?,
            },
        };
        if policy.point_in_time_window.is_some_and(|w| w.days() == 0) {
            return Err(PolicyError::ZeroPointInTime);
        }
        // A zero window keeps only the floor: what a refused `keepLast: 0` would mean.
        if policy.window.is_some_and(|w| w.days() == 0) {
            return Err(PolicyError::ZeroWindow);
        }
        if policy.cover_window && policy.window.is_none() {
            return Err(PolicyError::CoverWithoutWindow);
        }
        if !policy.has_rule() {
            return Err(PolicyError::NoRule);
        }
        Ok(policy)
    }
}

impl Policy {
    /// Whether some rule keeps backups beyond the floor.
    pub fn has_rule(&self) -> bool {
        self.window.is_some()
            || self.point_in_time_window.is_some()
            || self.keep_last > 0
            || self.keep_daily > 0
            || self.keep_weekly > 0
            || self.keep_monthly > 0
            || self.keep_yearly > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_without_rules_is_refused() {
        assert_eq!(
            PolicyInput::default().validate().unwrap_err(),
            PolicyError::NoRule
        );
        let only_failed = PolicyInput {
            failed_backups_ttl: Some("7d".into()),
            keep_last: Some(0),
            ..Default::default()
        };
        assert_eq!(only_failed.validate().unwrap_err(), PolicyError::NoRule);
    }

    #[test]
    fn errors_name_field_value_and_form() {
        let neg = PolicyInput {
            keep_last: Some(-1),
            ..Default::default()
        };
        let msg = neg.validate().unwrap_err().to_string();
        assert_eq!(
            msg,
            "keepLast: invalid count -1: expected a whole number from 0 to 100000"
        );

        let tz = PolicyInput {
            keep_last: Some(3),
            time_zone: Some("Mars/Olympus".into()),
            ..Default::default()
        };
        let msg = tz.validate().unwrap_err().to_string();
        assert!(
            msg.contains("\"Mars/Olympus\"") && msg.contains("IANA"),
            "{msg}"
        );

        let win = PolicyInput {
            window: Some("30".into()),
            ..Default::default()
        };
        let msg = win.validate().unwrap_err().to_string();
        assert!(
            msg.starts_with("window: invalid duration \"30\": it has no unit"),
            "{msg}"
        );
    }

    #[test]
    fn a_zero_window_is_refused_and_errors_name_their_field() {
        let p = PolicyInput {
            window: Some("0d".into()),
            keep_last: Some(3),
            ..Default::default()
        };
        let e = p.validate().unwrap_err();
        assert_eq!(e, PolicyError::ZeroWindow);
        assert_eq!(e.field(), Some(PolicyField::Window));
        assert!(
            e.problem().starts_with("0d keeps nothing"),
            "{}",
            e.problem()
        );
        let tz = PolicyInput {
            keep_last: Some(3),
            time_zone: Some("Nowhere/Land".into()),
            ..Default::default()
        };
        assert_eq!(
            tz.validate().unwrap_err().field(),
            Some(PolicyField::TimeZone)
        );
        assert_eq!(PolicyError::NoRule.field(), None);
    }

    #[test]
    fn cover_window_needs_a_window() {
        let p = PolicyInput {
            keep_last: Some(1),
            cover_window: Some(true),
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err(), PolicyError::CoverWithoutWindow);
    }

    #[test]
    fn zones_resolve() {
        let p = PolicyInput {
            keep_daily: Some(7),
            time_zone: Some("Europe/Paris".into()),
            ..Default::default()
        }
        .validate()
        .unwrap();
        assert_eq!(p.time_zone.iana_name(), Some("Europe/Paris"));
    }
}
