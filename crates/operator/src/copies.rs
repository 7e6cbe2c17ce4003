//! A policy's copies (`spec.copies`, issue 44) as background work of the policy: every
//! copy in turn is sent ([`tidemark_engine::copy::copy_pass`], under the copy store's own
//! lease) and kept by its own retention, bounded like every background task (one turn of
//! `--background-passes` for all the copies of a policy). What came of it is `status.copies`
//! with the `CopiesCurrent` condition (their own field manager), the `tidemark_copy_*`
//! metrics and events on a change (`CopyBehind`, `CopyCaughtUp`, `CopyFailed`).

use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::BackupPolicy;
use tidemark_api::policy::{CopyStatus, RecoveryWindowStatus};
use tidemark_engine::copy::{CopyOutcome, CopyRequest};

use crate::context::Context;
use crate::error::Error;
use crate::status::{COPIES_CONDITION, COPIES_MANAGER, condition};

/// How often a running pass is looked at.
const POLL: Duration = Duration::from_secs(5);
/// Copy passes come at most this often, and at least this often (half `maxLag` between).
const SOONEST: Duration = Duration::from_secs(10);
const LATEST: Duration = Duration::from_secs(600);
/// Longest a policy's copy passes may take together before they are given up (the next
/// turn goes on from what was committed).
const MAX_DURATION: Duration = Duration::from_secs(6 * 3600);

/// The key of a policy's copies among the background works.
fn work_key(policy: &BackupPolicy) -> String {
    format!("Copies/{}", crate::context::key(policy))
}

/// How often the copies of `policy` are sent: half the smallest `maxLag`, from 10 s to
/// 10 min.
fn every(policy: &BackupPolicy) -> Duration {
    policy
        .spec
        .copies
        .iter()
        .filter_map(|c| c.max_lag().ok())
        .min()
        .and_then(|l| Duration::try_from(l / 2).ok())
        .unwrap_or(LATEST)
        .clamp(SOONEST, LATEST)
}

/// Looks after the copies of `policy`; returns when to look again (`None`: it names none).
/// Trouble is reported in status and as an event; it never stops the policy's retention.
///
/// # Guarantees
/// Deletes only what each copy's own retention pass plans, in that copy, under its lease;
/// nothing in the policy's own store.
pub async fn reconcile(ctx: &Arc<Context>, policy: &BackupPolicy) -> Option<Duration> {
    if policy.spec.copies.is_empty() {
        return None;
    }
    let key = work_key(policy);
    match ctx.background.poll(&key) {
        crate::background::Polled::Running | crate::background::Polled::Queued => {
            return Some(POLL);
        }
        crate::background::Polled::Done(r) => {
            if let Err(e) = r {
                tracing::warn!(policy = %policy.name_any(), "copies: {e}");
                ctx.warn(
                    &policy.object_ref(&()),
                    "CopyFailed",
                    &format!("copies: {e}"),
                )
                .await;
            }
            return Some(Duration::from_secs(1));
        }
        crate::background::Polled::Idle => {}
    }
    let every = every(policy);
    let now = ctx.clock.now();
    let last = policy
        .status
        .as_ref()
        .map(|s| {
            s.copies
                .iter()
                .filter_map(|c| c.last_copy_time.as_ref().map(|t| t.0))
                .min()
        })
        .unwrap_or_default();
    let all_known = policy.status.as_ref().is_some_and(|s| {
        policy
            .spec
            .copies
            .iter()
            .all(|c| s.copies.iter().any(|x| x.name == c.name))
    });
    if let (Some(last), true) = (last, all_known) {
        let due = last + SignedDuration::try_from(every).unwrap_or(SignedDuration::ZERO);
        if now < due {
            return Some(
                Duration::try_from(due.duration_since(now))
                    .unwrap_or(Duration::ZERO)
                    .max(Duration::from_secs(1)),
            );
        }
    }
    ctx.background
        .start(key, run(ctx.clone(), Arc::new(policy.clone())));
    Some(POLL)
}

/// One turn: each copy of `policy` sent and kept, then the status written.
///
/// # Errors
/// The status could not be written.
async fn run(ctx: Arc<Context>, policy: Arc<BackupPolicy>) -> Result<Requeue, Error> {
    let name = policy.name_any();
    let ns = policy.namespace().unwrap_or_default();
    let api: Api<BackupPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(fresh) = api.get_opt(&name).await? else {
        return Ok(Requeue::await_change());
    };
    let previous = fresh.status.clone().unwrap_or_default();
    let mut statuses = Vec::new();
    let work = async {
        for c in &fresh.spec.copies {
            let before = previous.copies.iter().find(|x| x.name == c.name);
            let outcome = one(&ctx, &fresh, &c.name, before).await;
            statuses.push((c.name.clone(), outcome));
        }
    };
    if tokio::time::timeout(MAX_DURATION, work).await.is_err() {
        tracing::warn!(policy = %name, "copies: the turn took longer than {}s; the next goes on", MAX_DURATION.as_secs());
    }
    let now = ctx.clock.now();
    let mut copies = Vec::new();
    for (copy, outcome) in statuses {
        let spec = fresh.spec.copy(&copy);
        let max_lag = spec
            .and_then(|c| c.max_lag().ok())
            .unwrap_or(SignedDuration::from_hours(1));
        let before = previous.copies.iter().find(|x| x.name == copy);
        let status = copy_status(&copy, before, &outcome, max_lag, now);
        report(&ctx, &fresh, before, &status, &outcome, max_lag).await;
        copies.push(status);
    }
    let behind: Vec<&CopyStatus> = copies.iter().filter(|c| c.behind).collect();
    let (ok, reason, message) = match behind.first() {
        None => (
            true,
            "CopiesCurrent",
            format!("every copy within its maxLag ({})", names(&copies)),
        ),
        Some(c) => (
            false,
            if c.error.is_some() && c.lag_seconds.is_none() {
                "CopyFailed"
            } else {
                "CopyBehind"
            },
            behind
                .iter()
                .map(|c| describe(c))
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    let cond = condition(
        &previous.conditions,
        COPIES_CONDITION,
        ok,
        reason,
        &message,
        fresh.meta().generation,
    );
    crate::status::apply(
        &api,
        &name,
        COPIES_MANAGER,
        serde_json::json!({ "copies": copies, "conditions": [cond] }),
    )
    .await?;
    Ok(Requeue::await_change())
}

fn names(copies: &[CopyStatus]) -> String {
    copies
        .iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe(c: &CopyStatus) -> String {
    match (&c.error, c.lag_seconds) {
        (Some(e), None) => format!("copy {}: {e}", c.name),
        (_, Some(l)) => format!("copy {} is {l}s behind the store", c.name),
        (None, None) => format!("copy {} has no pass yet", c.name),
    }
}

/// What one copy's pass (and its retention pass) came to.
#[derive(Debug)]
pub struct CopyTurn {
    pub copied: Result<CopyOutcome, String>,
    /// When the copy's retention pass ran, if it did.
    pub retention_at: Option<Timestamp>,
}

/// Sends `policy`'s store to its copy `name` and runs the copy's own retention when due.
async fn one(
    ctx: &Context,
    policy: &BackupPolicy,
    name: &str,
    before: Option<&CopyStatus>,
) -> CopyTurn {
    let failed = |e: String| CopyTurn {
        copied: Err(e),
        retention_at: None,
    };
    let (Some(spec), Some(seen)) = (policy.spec.copy(name), policy.as_copy(name)) else {
        return failed(format!("no copy {name:?}"));
    };
    let source = match crate::stores::open(ctx, policy).await {
        Ok(s) => s,
        Err(e) => return failed(format!("the policy's store: {e}")),
    };
    let copy = match crate::stores::open(ctx, &seen).await {
        Ok(s) => s,
        Err(e) => return failed(format!("the copy's store: {e}")),
    };
    let rules = match seen
        .spec
        .retention
        .as_ref()
        .map(|r| r.to_input(policy.spec.time_zone.as_deref()).validate())
        .transpose()
    {
        Ok(r) => r,
        Err(e) => return failed(format!("retention: {e}")),
    };
    let copy_policy = rules
        .clone()
        .unwrap_or_else(tidemark_engine::copy::keep_everything);
    let bandwidth = match spec.bandwidth() {
        Ok(b) => b.map(|r| Arc::new(tidemark_store::bandwidth::Bandwidth::new(&r))),
        Err(e) => return failed(e.to_string()),
    };
    let fence = match crate::fence::acquire(ctx, &copy).await {
        Ok(f) => f,
        Err(e) => return failed(format!("the copy's lease: {e}")),
    };
    let now = ctx.clock.now();
    let request = CopyRequest {
        name: name.to_owned(),
        policy: copy_policy,
        now,
        bandwidth,
        dry_run: false,
    };
    let copied = tidemark_engine::copy::copy_pass(
        &source,
        &copy,
        &request,
        Some(&fence),
        &tidemark_store::NoProgress,
    )
    .await
    .map_err(|e| tidemark_engine::error::chain(&e));
    // The copy's own retention, at the policy's interval, when it has rules.
    let interval = policy
        .spec
        .retention_interval()
        .unwrap_or(SignedDuration::from_hours(1));
    let due = before
        .and_then(|b| b.last_retention_run_time.as_ref())
        .is_none_or(|t| now >= tidemark_core::saturating_add(t.0, interval));
    let mut retention_at = before
        .and_then(|b| b.last_retention_run_time.as_ref())
        .map(|t| t.0);
    // The copy's record of holds, under its lease: the Restores reading from it (ended
    // ones released) and the Backups on hold, which its own retention and every deleter
    // with only the copy keep.
    let ns = policy.namespace().unwrap_or_default();
    let policy_name = policy.name_any();
    let holds = async {
        let restores =
            crate::holds::read_restore_holds_in(ctx, &ns, &policy_name, Some(name)).await?;
        let protect = crate::holds::holds(ctx, &ns, &policy_name);
        tidemark_store::state::save_holds(
            &copy,
            &crate::holds::writer(&ns, &policy_name, Some(name)),
            &protect,
            &restores,
            tidemark_store::state::Gate::Keep,
        )
        .await
        .map_err(|e| Error::Engine(e.into()))
    };
    let held = fence.guard(holds).await;
    if let Err(e) = &held {
        tracing::warn!(copy = %name, "the copy's holds: {e}");
    }
    if let (Some(rules), true, true, true) = (rules, due, copied.is_ok(), held.is_ok()) {
        let request = tidemark_engine::copy::retention_request(
            &rules,
            serde_json::to_value(&seen.spec.retention).unwrap_or_default(),
            now,
            // The copy's deletion guard takes the policy's acknowledgement.
            tidemark_api::policy::deletions_allowed_before(policy.annotations())
                .ok()
                .flatten(),
        );
        match tidemark_engine::unattended_pass(&copy, &request, Some(&fence), None).await {
            Ok(_) => retention_at = Some(now),
            Err(e) => {
                tracing::warn!(copy = %name, "copy retention: {}", tidemark_engine::error::chain(&e))
            }
        }
    }
    fence.release().await;
    CopyTurn {
        copied,
        retention_at,
    }
}

/// The status of one copy after a turn (pure): its lag against `max_lag`, its window, what
/// was sent; a failed pass keeps what the last good one said and is behind.
pub fn copy_status(
    name: &str,
    before: Option<&CopyStatus>,
    turn: &CopyTurn,
    max_lag: SignedDuration,
    now: Timestamp,
) -> CopyStatus {
    let retention = turn.retention_at.map(Time);
    match &turn.copied {
        Ok(o) => {
            let lag = o.lag(now);
            CopyStatus {
                name: name.to_owned(),
                last_copy_time: Some(Time(now)),
                copied_through: o.copy_newest_at.map(Time),
                lag_seconds: Some(lag.as_secs()),
                behind: lag > max_lag,
                recovery_window: o.copy_window.as_ref().map(RecoveryWindowStatus::from),
                backups_sent: o.backups_sent.len() as u64,
                segments_sent: o.segments_sent as u64,
                bytes_sent: o.bytes,
                last_retention_run_time: retention,
                error: (!o.failures.is_empty()).then(|| {
                    let mut e = o
                        .failures
                        .iter()
                        .take(3)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("; ");
                    if o.failures.len() > 3 {
                        e.push_str(&format!(" (and {} more)", o.failures.len() - 3));
                    }
                    e
                }),
            }
        }
        Err(e) => {
            let mut s = before.cloned().unwrap_or_else(|| CopyStatus {
                name: name.to_owned(),
                ..CopyStatus::default()
            });
            // The copy falls further behind every second it cannot be sent to.
            s.lag_seconds = s
                .copied_through
                .as_ref()
                .map(|t| now.duration_since(t.0).as_secs().max(0));
            s.behind = true;
            s.error = Some(e.clone());
            s.last_copy_time = Some(Time(now));
            s.backups_sent = 0;
            s.segments_sent = 0;
            s.bytes_sent = 0;
            s.last_retention_run_time = retention.or(s.last_retention_run_time);
            s
        }
    }
}

/// Metrics and events of one copy's turn: `CopyBehind` when it falls behind, `CopyCaughtUp`
/// when it is back, `CopyFailed` for what could not be sent.
async fn report(
    ctx: &Context,
    policy: &BackupPolicy,
    before: Option<&CopyStatus>,
    now: &CopyStatus,
    turn: &CopyTurn,
    max_lag: SignedDuration,
) {
    let labels = crate::metrics::CopyLabels {
        namespace: policy.namespace().unwrap_or_default(),
        policy: policy.name_any(),
        copy: now.name.clone(),
    };
    let m = &ctx.metrics;
    m.copy_lag
        .get_or_create(&labels)
        .set(now.lag_seconds.unwrap_or(0));
    if let Some(t) = &now.last_copy_time {
        m.copy_last_run.get_or_create(&labels).set(t.0.as_second());
    }
    m.copy_bytes.get_or_create(&labels).inc_by(now.bytes_sent);
    m.copy_max_lag.get_or_create(&labels).set(max_lag.as_secs());
    m.copy_window.get_or_create(&labels).set(
        now.recovery_window
            .as_ref()
            .map_or(0, |w| w.end.0.duration_since(w.start.0).as_secs().max(0)),
    );
    let reference = policy.object_ref(&());
    match &turn.copied {
        Err(e) => {
            ctx.warn(&reference, "CopyFailed", &format!("copy {}: {e}", now.name))
                .await;
        }
        Ok(o) if !o.failures.is_empty() => {
            ctx.warn(
                &reference,
                "CopyFailed",
                &format!(
                    "copy {}: {} object(s) could not be sent; the next pass tries again: {}",
                    now.name,
                    o.failures.len(),
                    now.error.as_deref().unwrap_or_default()
                ),
            )
            .await;
        }
        Ok(_) => {}
    }
    let was_behind = before.map(|b| b.behind);
    match (was_behind, now.behind) {
        (Some(false) | None, true) if turn.copied.is_ok() => {
            ctx.warn(
                &reference,
                "CopyBehind",
                &format!(
                    "copy {} is {}s behind the store (maxLag {max_lag:#})",
                    now.name,
                    now.lag_seconds.unwrap_or(0)
                ),
            )
            .await;
        }
        (Some(true), false) => {
            ctx.event(
                &reference,
                EventType::Normal,
                "CopyCaughtUp",
                &format!("copy {} is within its maxLag ({max_lag:#}) again", now.name),
            )
            .await;
        }
        _ => {}
    }
}

/// Whether the copy `name` of `policy` holds something to check: its status records a
/// restorable instant (its first pass sent something).
pub(crate) fn has_data(policy: &BackupPolicy, name: &str) -> bool {
    policy.status.as_ref().is_some_and(|s| {
        s.copies
            .iter()
            .any(|c| c.name == name && c.copied_through.is_some())
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn ok(source: i64, copy: Option<i64>) -> CopyTurn {
        CopyTurn {
            copied: Ok(CopyOutcome {
                name: "dr".into(),
                source_newest_at: Some(t(source)),
                copy_newest_at: copy.map(t),
                bytes: 10,
                ..CopyOutcome::default()
            }),
            retention_at: None,
        }
    }

    /// A copy is behind beyond its maxLag, not at it; a failed pass keeps the last good
    /// pass's point and counts the lag from it to now.
    #[test]
    fn lag_and_failures_make_the_status() {
        let lag = SignedDuration::from_secs(60);
        let s = copy_status("dr", None, &ok(100, Some(40)), lag, t(101));
        assert_eq!((s.lag_seconds, s.behind), (Some(60), false));
        let s = copy_status("dr", None, &ok(100, Some(39)), lag, t(101));
        assert_eq!((s.lag_seconds, s.behind), (Some(61), true));
        let good = copy_status("dr", None, &ok(100, Some(100)), lag, t(101));
        assert!(!good.behind && good.error.is_none(), "{good:?}");
        let failed = CopyTurn {
            copied: Err("the copy's store: refused".into()),
            retention_at: None,
        };
        let s = copy_status("dr", Some(&good), &failed, lag, t(130));
        assert!(s.behind, "{s:?}");
        assert_eq!(s.lag_seconds, Some(30));
        assert_eq!(s.copied_through, good.copied_through);
        assert_eq!(s.error.as_deref(), Some("the copy's store: refused"));
        // Never sent anything yet: behind by what the store holds.
        let s = copy_status("dr", None, &ok(100, None), lag, t(200));
        assert_eq!((s.lag_seconds, s.behind), (Some(100), true));
    }
}
