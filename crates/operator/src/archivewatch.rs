//! The binlog archive, watched: an archive that falls behind the server it reads is loud.
//!
//! The archiver records what it saw at every pass (`_state/archiver.json` in the store: the
//! server's newest event, the newest archived, when). The policy's reconcile reads it every
//! [`EVERY`] and keeps, per policy: the `tidemark_binlog_archive_lag_seconds` metric (what
//! an alert uses), `status.binlogArchive` and the `BinlogArchiveCurrent` condition (written
//! under their own field manager, and only when they change, so the watch does not wake
//! the controller by itself), and a Warning event `BinlogArchiveBehind` when the archive
//! falls behind by more than `spec.binlogArchive.maxLag` — or its archiver stops reporting
//! — and a Normal `BinlogArchiveCaughtUp` when it is back.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::{BackupPolicy, BinlogArchiveStatus};
use tidemark_store::state::ArchiverStatus;

use crate::context::Context;
use crate::status::condition;

pub use crate::status::{BINLOG_ARCHIVE_CONDITION as CONDITION, BINLOG_ARCHIVE_MANAGER as MANAGER};
/// How often the archive is looked at, at most: every archiver interval, between
/// [`SOONEST`] and this.
pub const EVERY: Duration = Duration::from_secs(30);
/// How often the archive is looked at, at least.
pub const SOONEST: Duration = Duration::from_secs(5);

/// What the watch concludes from the archiver's last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    pub lag: SignedDuration,
    pub behind: bool,
    pub reason: &'static str,
    pub message: String,
    pub status: BinlogArchiveStatus,
}

/// How long after its last pass an archiver counts as stopped: three of its intervals, and
/// never less than a minute (a pass shipping a large file takes a while).
pub fn silent_after(interval: SignedDuration) -> SignedDuration {
    (interval * 3).max(SignedDuration::from_secs(60))
}

/// Judges the archive from its archiver's report at `now`. `None`: no report yet (an
/// archiver that has not finished a pass), nothing to say.
pub fn assess(
    report: Option<&ArchiverStatus>,
    now: Timestamp,
    max_lag: SignedDuration,
    silent_after: SignedDuration,
) -> Option<Assessment> {
    let r = report?;
    let lag = r.lag(now, silent_after);
    let silent = r.silent(now, silent_after);
    let behind = silent || lag > max_lag;
    let server = r
        .server_id
        .map_or_else(|| "the server".to_owned(), |s| format!("server {s}"));
    let (reason, message) = if silent {
        (
            "ArchiverSilent",
            format!(
                "the binlog archiver has not finished a pass since {} (it reads {server}): the archive is {}s behind and falling further",
                r.observed_at,
                lag.as_secs()
            ),
        )
    } else if behind {
        (
            "ArchiveBehind",
            format!(
                "the binlog archive is {}s behind {server} (its newest archived event {}, the server's {}): more than spec.binlogArchive.maxLag {max_lag:#}",
                lag.as_secs(),
                r.archived_last_event_at
                    .map_or_else(|| "none".to_owned(), |t| t.to_string()),
                r.primary_last_event_at
                    .map_or_else(|| "unknown".to_owned(), |t| t.to_string())
            ),
        )
    } else {
        (
            "ArchiveCurrent",
            format!(
                "the binlog archive is {}s behind {server} (within {max_lag:#})",
                lag.as_secs()
            ),
        )
    };
    Some(Assessment {
        lag,
        behind,
        reason,
        message,
        status: BinlogArchiveStatus {
            server_id: r.server_id,
            timeline: Some(r.timeline),
            archived_through: r.archived_last_event_at.map(Time),
            behind,
        },
    })
}

/// Looks at the archive of `policy` (one with an operator-run archiver): metric, status,
/// condition and events. Returns when to look again; `None` for a policy without one.
/// Trouble reading the store is logged: the retention pass reports the store's state.
pub async fn check(ctx: &Context, policy: &BackupPolicy) -> Option<Duration> {
    policy
        .spec
        .binlog_archive
        .as_ref()
        .and_then(|a| a.server.as_ref())?;
    let (Ok(max_lag), Ok(interval)) = (policy.spec.binlog_max_lag(), policy.spec.binlog_interval())
    else {
        return Some(EVERY); // an invalid spec is reported by the pass
    };
    let every = Duration::try_from(interval)
        .unwrap_or(EVERY)
        .clamp(SOONEST, EVERY);
    let name = policy.name_any();
    let store = match crate::stores::open(ctx, policy).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(policy = %name, error = %e, "binlog archive watch: store not open");
            return Some(every);
        }
    };
    let report = match tidemark_store::state::load_archiver_status(&store).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(policy = %name, error = %e, "binlog archive watch");
            return Some(every);
        }
    };
    let now = ctx.clock.now();
    let Some(a) = assess(report.as_ref(), now, max_lag, silent_after(interval)) else {
        return Some(every);
    };
    let ns = policy.namespace().unwrap_or_default();
    ctx.metrics
        .binlog_archive_lag
        .get_or_create(&crate::metrics::Metrics::policy(&ns, &name))
        .set(a.lag.as_secs().max(0));
    let previous = policy.status.as_ref();
    let was_behind = previous
        .and_then(|s| s.binlog_archive.as_ref())
        .map(|b| b.behind);
    let old = previous.map_or(&[][..], |s| s.conditions.as_slice());
    let same_condition = old.iter().find(|c| c.type_ == CONDITION).is_some_and(|c| {
        c.status == if a.behind { "False" } else { "True" } && c.reason == a.reason
    });
    let same_status = previous.and_then(|s| s.binlog_archive.as_ref()) == Some(&a.status);
    if !(same_condition && same_status) {
        let c = condition(
            old,
            CONDITION,
            !a.behind,
            a.reason,
            &a.message,
            policy.meta().generation,
        );
        let api: Api<BackupPolicy> = Api::namespaced(ctx.client.clone(), &ns);
        let value = serde_json::json!({ "binlogArchive": a.status, "conditions": [c] });
        if let Err(e) = crate::status::apply(&api, &name, MANAGER, value).await {
            tracing::warn!(policy = %name, error = %e, "binlog archive watch: status");
        }
    }
    let object = policy.object_ref(&());
    match (was_behind, a.behind) {
        (Some(false) | None, true) => ctx.warn(&object, "BinlogArchiveBehind", &a.message).await,
        (Some(true), false) => {
            ctx.event(
                &object,
                EventType::Normal,
                "BinlogArchiveCaughtUp",
                &a.message,
            )
            .await;
        }
        _ => {}
    }
    Some(every)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn at(s: &str) -> Timestamp {
        format!("2026-11-27T10:{s}Z").parse().unwrap()
    }

    fn report(observed: &str, primary: &str, archived: &str) -> ArchiverStatus {
        ArchiverStatus {
            format_version: 1,
            observed_at: at(observed),
            server_id: Some(2),
            timeline: 1,
            primary_last_event_at: Some(at(primary)),
            archived_last_event_at: Some(at(archived)),
            writer: String::new(),
            extra: Default::default(),
        }
    }

    #[test]
    fn behind_by_more_than_max_lag_or_silent() {
        let max = SignedDuration::from_mins(5);
        let quiet = silent_after(SignedDuration::from_secs(10));
        assert_eq!(quiet, SignedDuration::from_secs(60));
        assert_eq!(assess(None, at("00:00"), max, quiet), None);
        // Two minutes behind: current.
        let a = assess(
            Some(&report("10:00", "10:00", "08:00")),
            at("10:10"),
            max,
            quiet,
        )
        .unwrap();
        assert_eq!(
            (a.behind, a.reason, a.lag.as_secs()),
            (false, "ArchiveCurrent", 120)
        );
        // Ten minutes behind: behind.
        let a = assess(
            Some(&report("10:00", "10:00", "00:00")),
            at("10:10"),
            max,
            quiet,
        )
        .unwrap();
        assert_eq!(
            (a.behind, a.reason, a.lag.as_secs()),
            (true, "ArchiveBehind", 600)
        );
        assert!(a.message.contains("600s behind server 2"), "{}", a.message);
        assert_eq!(a.status.timeline, Some(1));
        // No pass for two minutes: silent, and behind by the archive's age.
        let a = assess(
            Some(&report("10:00", "10:00", "09:30")),
            at("12:00"),
            max,
            quiet,
        )
        .unwrap();
        assert_eq!(
            (a.behind, a.reason, a.lag.as_secs()),
            (true, "ArchiverSilent", 150)
        );
    }
}
