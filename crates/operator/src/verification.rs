//! Verification in the operator: `tidemark verify`'s use case
//! ([`tidemark_engine::verify::verify`]) on a policy's store, at each slot of
//! `spec.verify.schedule` and whenever the annotation [`ANNOTATION`] takes a value not yet
//! acted on. The newest completed backup, its chain and the binlogs a restore from it
//! replays are read back whole and checked against their recorded sizes and checksums
//! (and `spec.verify.samplePercent` of the rest).
//!
//! It runs as background work (`crate::background`): its catalog counts against the same
//! turns as the retention passes, so memory stays bounded, and it never holds a reconcile
//! slot. It only reads: no lease, and a backup a pass deletes meanwhile is left out, not
//! reported lost. It ends within [`MAX_DURATION`]. The outcome goes to
//! `status.verification` (its own field manager), an event (`BackupsVerified`, Warning
//! `VerificationFailed`) and the metrics `tidemark_verification_passed` and
//! `tidemark_verification_last_run_timestamp_seconds`.
//!
//! Each copy (`spec.copies[].verify`, and the annotation, which asks every store) is
//! verified the same way from its own store, reported in `status.verification.copies`, the
//! same events (naming the copy) and `tidemark_copy_verification_passed`.
//!
//! One verification at a time per policy; a slot missed while one ran (or the operator was
//! down) is run once, not replayed in bulk.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::BackupPolicy;
use tidemark_api::policy::{VerificationResult, VerificationStatus, VerifySpec};
use tidemark_core::schedule::Cron;
use tidemark_engine::verify::{Verification, VerifyRequest};

use crate::context::Context;
use crate::error::Error;

/// The annotation that asks for a verification now: any new value (a date, a counter)
/// runs one; the value acted on last is `status.verification.request`.
pub const ANNOTATION: &str = "tidemark.io/verify";
/// The longest annotation value acted on (longer: refused with an event).
pub const MAX_REQUEST: usize = 63;
/// The longest a verification may run: then it fails, saying so, and its turn goes to the
/// next work.
pub const MAX_DURATION: Duration = Duration::from_secs(6 * 3600);
/// Problems carried into the status.
const STATUS_PROBLEMS: usize = 5;
/// How often a running verification is looked at.
const POLL: Duration = Duration::from_secs(5);

/// What to do about a policy's verification now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Due {
    /// Run one now: for this schedule slot (`None`: the annotation asked) and this request
    /// (`None`: the schedule's).
    Now {
        slot: Option<Timestamp>,
        request: Option<String>,
    },
    /// Nothing now; the next slot, if any.
    Later(Option<Timestamp>),
}

/// Whether a verification is due (pure): a new `request` (the annotation's value, not the
/// one acted on last), or a slot of `cron` come since the last one run (or, the first
/// time, since `created`) — at most one catch-up slot, the latest.
pub(crate) fn due(
    cron: Option<&Cron>,
    tz: &jiff::tz::TimeZone,
    request: Option<&str>,
    status: &VerificationStatus,
    created: Option<Timestamp>,
    now: Timestamp,
) -> Due {
    let request = request
        .filter(|r| Some(*r) != status.request.as_deref())
        .map(str::to_owned);
    let slot = cron.and_then(|cron| {
        let since = status
            .last_schedule_time
            .as_ref()
            .map(|t| t.0)
            .or(created)
            .unwrap_or(now);
        let next = cron.next_after(since, tz).filter(|d| *d <= now)?;
        Some(cron.latest_in(since, now, tz).unwrap_or(next))
    });
    if slot.is_some() || request.is_some() {
        Due::Now { slot, request }
    } else {
        Due::Later(cron.and_then(|c| c.next_after(now, tz)))
    }
}

/// What a verification leaves in status (pure): the outcome (`Err`: it could not run, with
/// why), with the slot and request it was for, and the next slot.
pub(crate) fn verification_status(
    previous: &VerificationStatus,
    outcome: Result<Option<&Verification>, String>,
    slot: Option<Timestamp>,
    request: Option<String>,
    next: Option<Timestamp>,
    verified_at: Timestamp,
) -> VerificationStatus {
    let last = match outcome {
        Ok(Some(v)) => {
            let mut problems: Vec<String> = Vec::new();
            for b in &v.backups {
                if b.status == "brokenChain" {
                    problems.push(format!(
                        "{}/{}: brokenChain: an ancestor does not read back or is gone",
                        b.backup_name, b.backup_id
                    ));
                }
                for o in b.payload.iter().filter(|o| o.status != "ok") {
                    problems.push(object_problem(&o.key, o.status, o.problem.as_deref()));
                }
            }
            for o in &v.segments.problems {
                problems.push(object_problem(&o.key, o.status, o.problem.as_deref()));
            }
            for m in &v.malformed {
                problems.push(format!("{}: malformed: {}", m.key, m.problem));
            }
            VerificationResult {
                verified_at: Time(verified_at),
                passed: v.problems == 0,
                backup_id: v.newest.clone(),
                backups_checked: v.backups.len() as u64,
                segments_checked: v.segments.checked as u64,
                problem_count: v.problems as u64,
                problems: problems.into_iter().take(STATUS_PROBLEMS).collect(),
            }
        }
        Ok(None) => failed(
            verified_at,
            "no committed backup in the store: nothing to verify".into(),
        ),
        Err(why) => failed(verified_at, why),
    };
    VerificationStatus {
        last_schedule_time: slot
            .map(Time)
            .or_else(|| previous.last_schedule_time.clone()),
        next_schedule_time: next.map(Time),
        request: request.or_else(|| previous.request.clone()),
        last: Some(last),
        copies: Vec::new(),
    }
}

fn object_problem(key: &str, status: &str, problem: Option<&str>) -> String {
    match problem {
        Some(p) => format!("{key}: {status}: {p}"),
        None => format!("{key}: {status}"),
    }
}

fn failed(verified_at: Timestamp, why: String) -> VerificationResult {
    VerificationResult {
        verified_at: Time(verified_at),
        passed: false,
        backup_id: None,
        backups_checked: 0,
        segments_checked: 0,
        problem_count: 1,
        problems: vec![why],
    }
}

/// The key of a policy's verification among the background works.
fn work_key(policy: &BackupPolicy) -> String {
    format!("Verification/{}", crate::context::key(policy))
}

/// Looks after the verification of `policy`'s store and of each of its copies; returns
/// when to look again (`None`: the policy asks for none). One verification at a time per
/// policy: of the stores due, the one verified longest ago first; a copy once its first
/// pass sent something. Trouble is reported as an event, never stops retention.
///
/// # Guarantees
/// Deletes nothing: the stores are only read.
pub async fn reconcile(ctx: &Arc<Context>, policy: &BackupPolicy) -> Option<Duration> {
    let request = policy.annotations().get(ANNOTATION);
    // The stores verified: the policy's own (`None`) and its copies, each with its
    // schedule; the annotation asks every one.
    let targets: Vec<(Option<&str>, Option<&VerifySpec>)> =
        std::iter::once((None, policy.spec.verify.as_ref()))
            .chain(
                policy
                    .spec
                    .copies
                    .iter()
                    .map(|c| (Some(c.name.as_str()), c.verify.as_ref())),
            )
            .filter(|(_, spec)| spec.is_some() || request.is_some())
            .collect();
    if targets.is_empty() {
        return None;
    }
    let key = work_key(policy);
    match ctx.background.poll(&key) {
        crate::background::Polled::Running | crate::background::Polled::Queued => {
            return Some(POLL);
        }
        // Its outcome is in status already; the cached policy may not show it yet.
        crate::background::Polled::Done(r) => {
            if let Err(e) = r {
                note(ctx, policy, &format!("verification: {e}")).await;
            }
            return Some(Duration::from_secs(1));
        }
        crate::background::Polled::Idle => {}
    }
    if let Some(r) = request.filter(|r| r.len() > MAX_REQUEST || r.is_empty()) {
        let message = format!(
            "annotation {ANNOTATION}: a value of {} bytes is not acted on; give 1 to {MAX_REQUEST} bytes, e.g. the date",
            r.len()
        );
        note(ctx, policy, &message).await;
        return None;
    }
    let tz = match policy
        .spec
        .time_zone
        .as_deref()
        .map(jiff::tz::TimeZone::get)
    {
        Some(Ok(tz)) => tz,
        None => jiff::tz::TimeZone::UTC,
        Some(Err(_)) => return None,
    };
    let now = ctx.clock.now();
    let created = policy.meta().creation_timestamp.as_ref().map(|t| t.0);
    let all = policy
        .status
        .as_ref()
        .and_then(|s| s.verification.clone())
        .unwrap_or_default();
    let mut wake: Option<Timestamp> = None;
    let soon = |wake: &mut Option<Timestamp>, at: Option<Timestamp>| {
        *wake = match (*wake, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    };
    // Of the stores due, the one verified longest ago goes first: a store whose schedule
    // is always due never starves the others.
    let mut chosen: Option<(Option<Timestamp>, Run)> = None;
    for (copy, spec) in targets {
        let (cron, sample) = match spec.map(VerifySpec::settings) {
            Some(Ok((cron, sample))) => (cron, sample),
            None => (None, 0.0),
            // The policy's own pass reports an invalid spec.
            Some(Err(_)) => continue,
        };
        // A copy is verified once its first pass has sent something: before that it
        // would only fail for being empty.
        if copy.is_some_and(|c| !crate::copies::has_data(policy, c)) {
            soon(&mut wake, Some(now + jiff::SignedDuration::from_secs(60)));
            continue;
        }
        let status = all.of(copy);
        match due(
            cron.as_ref(),
            &tz,
            request.map(String::as_str),
            &status,
            created,
            now,
        ) {
            Due::Later(next) => soon(&mut wake, next),
            Due::Now { slot, request } => {
                let last = status.last.as_ref().map(|l| l.verified_at.0);
                if chosen.as_ref().is_none_or(|(other, _)| last < *other) {
                    chosen = Some((
                        last,
                        Run {
                            copy: copy.map(str::to_owned),
                            cron,
                            tz: tz.clone(),
                            sample,
                            slot,
                            request,
                        },
                    ));
                }
            }
        }
    }
    if let Some((_, run_of)) = chosen {
        let work = run(ctx.clone(), Arc::new(policy.clone()), run_of);
        ctx.background.start(key, work);
        return Some(POLL);
    }
    wake.map(|at| {
        Duration::try_from(at.duration_since(now))
            .unwrap_or(Duration::ZERO)
            .max(Duration::from_secs(1))
    })
}

/// One verification's settings.
struct Run {
    /// The copy verified (`None`: the policy's own store).
    copy: Option<String>,
    cron: Option<Cron>,
    tz: jiff::tz::TimeZone,
    sample: f64,
    slot: Option<Timestamp>,
    request: Option<String>,
}

/// Verifies `policy`'s store (or its copy `run.copy`) and reports the outcome.
///
/// # Errors
/// The status could not be written.
async fn run(ctx: Arc<Context>, policy: Arc<BackupPolicy>, run: Run) -> Result<Requeue, Error> {
    let name = policy.name_any();
    let copy = run.copy.as_deref();
    let api: Api<BackupPolicy> =
        Api::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default());
    // The cached copy may be behind one this verification's predecessor wrote: what was
    // acted on last is read afresh, and a request or slot already done is not done twice.
    let Some(fresh) = api.get_opt(&name).await? else {
        return Ok(Requeue::await_change());
    };
    let all = fresh
        .status
        .as_ref()
        .and_then(|s| s.verification.clone())
        .unwrap_or_default();
    let previous = all.of(copy);
    let already = run.request.is_some() && run.request == previous.request
        || run.slot.is_some()
            && previous.last_schedule_time.as_ref().map(|t| t.0) >= run.slot
            && run.request.is_none();
    if already {
        return Ok(Requeue::await_change());
    }
    tracing::info!(policy = %name, copy = ?copy, slot = ?run.slot, request = ?run.request, "verification started");
    // A copy is read as the policy's view of it: the copy's store, Secret and keys.
    let read = match copy {
        None => Some(policy.as_ref().clone()),
        Some(c) => fresh.as_copy(c),
    };
    let outcome = match read {
        None => Err(format!(
            "the policy names no copy {:?} any more",
            copy.unwrap_or_default()
        )),
        Some(read) => match crate::stores::open(&ctx, &read).await {
            Ok(store) => {
                let request = VerifyRequest { sample: run.sample };
                match tokio::time::timeout(
                    MAX_DURATION,
                    tidemark_engine::verify::verify(&store, &request),
                )
                .await
                {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(tidemark_engine::error::chain(&e)),
                    Err(_) => Err(format!(
                        "did not finish within {}s; the next slot or request tries again",
                        MAX_DURATION.as_secs()
                    )),
                }
            }
            Err(e) => Err(tidemark_engine::error::chain(&e)),
        },
    };
    let now = ctx.clock.now();
    let next = run.cron.as_ref().and_then(|c| c.next_after(now, &run.tz));
    let one = verification_status(
        &previous,
        outcome.as_ref().map(Option::as_ref).map_err(Clone::clone),
        run.slot,
        run.request,
        next,
        now,
    );
    let named: Vec<&str> = fresh.spec.copies.iter().map(|c| c.name.as_str()).collect();
    let status = all.with(copy, one.clone(), &named);
    crate::status::verification(&api, &name, &status).await?;
    report(&ctx, &policy, copy, one.last.as_ref()).await;
    Ok(Requeue::await_change())
}

/// The event and metrics of a verification's `result`, of the policy's store or of its
/// copy `copy`.
async fn report(
    ctx: &Context,
    policy: &BackupPolicy,
    copy: Option<&str>,
    result: Option<&VerificationResult>,
) {
    let Some(r) = result else { return };
    let (ns, name) = (policy.namespace().unwrap_or_default(), policy.name_any());
    let m = &ctx.metrics;
    match copy {
        None => {
            let labels = crate::metrics::Metrics::policy(&ns, &name);
            m.verification_passed
                .get_or_create(&labels)
                .set(i64::from(r.passed));
            m.verification_last_run
                .get_or_create(&labels)
                .set(r.verified_at.0.as_second());
        }
        Some(c) => {
            let labels = crate::metrics::CopyLabels {
                namespace: ns,
                policy: name,
                copy: c.to_owned(),
            };
            m.copy_verification_passed
                .get_or_create(&labels)
                .set(i64::from(r.passed));
            m.copy_verification_last_run
                .get_or_create(&labels)
                .set(r.verified_at.0.as_second());
        }
    }
    let what = format!(
        "{}read back {} backup(s) and {} binlog segment(s){}",
        copy.map(|c| format!("copy {c}: ")).unwrap_or_default(),
        r.backups_checked,
        r.segments_checked,
        r.backup_id
            .as_deref()
            .map(|id| format!(", the newest {id} with its chain"))
            .unwrap_or_default()
    );
    if r.passed {
        ctx.event(
            &policy.object_ref(&()),
            EventType::Normal,
            "BackupsVerified",
            &format!("{what}: every object whole"),
        )
        .await;
    } else {
        ctx.warn(
            &policy.object_ref(&()),
            "VerificationFailed",
            &format!(
                "{what}: {} problem(s): {}",
                r.problem_count,
                r.problems.join("; ")
            ),
        )
        .await;
    }
}

/// A Warning event about the verification itself (not its outcome).
async fn note(ctx: &Context, policy: &BackupPolicy, message: &str) {
    tracing::warn!(policy = %policy.name_any(), "{message}");
    ctx.warn(&policy.object_ref(&()), "VerificationError", message)
        .await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use jiff::SignedDuration;
    use tidemark_engine::verify::{ObjectOut, SegmentsOut, VerifiedBackup};

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_795_000_000).unwrap() + SignedDuration::from_secs(secs)
    }

    /// When a verification is due, as a table: a new annotation value, a slot come, both,
    /// neither.
    #[test]
    fn a_verification_is_due_at_a_slot_or_a_new_request() {
        let utc = jiff::tz::TimeZone::UTC;
        // Every minute, at second 0 (1_795_000_000 is at second 40 of its minute).
        let cron: Cron = "0 * * * * *".parse().unwrap();
        let minute = at(20); // the first slot after at(0)
        let done = |slot: Option<Timestamp>, request: Option<&str>| VerificationStatus {
            last_schedule_time: slot.map(Time),
            request: request.map(str::to_owned),
            ..Default::default()
        };
        /// A case: its name, the schedule, the annotation, the status, now, and the answer.
        type Case<'a> = (
            &'a str,
            Option<&'a Cron>,
            Option<&'a str>,
            VerificationStatus,
            Timestamp,
            Due,
        );
        let cases: Vec<Case> = vec![
            (
                "nothing asked",
                None,
                None,
                done(None, None),
                at(5),
                Due::Later(None),
            ),
            (
                "a first request",
                None,
                Some("1"),
                done(None, None),
                at(5),
                Due::Now {
                    slot: None,
                    request: Some("1".into()),
                },
            ),
            (
                "the request acted on already",
                None,
                Some("1"),
                done(None, Some("1")),
                at(5),
                Due::Later(None),
            ),
            (
                "a slot not come yet (created at 0)",
                Some(&cron),
                None,
                done(None, None),
                at(10),
                Due::Later(Some(minute)),
            ),
            (
                "the first slot come",
                Some(&cron),
                None,
                done(None, None),
                at(25),
                Due::Now {
                    slot: Some(minute),
                    request: None,
                },
            ),
            (
                "three slots missed: the latest, once",
                Some(&cron),
                None,
                done(None, None),
                at(150),
                Due::Now {
                    slot: Some(at(140)),
                    request: None,
                },
            ),
            (
                "the slot done; the next to come",
                Some(&cron),
                None,
                done(Some(minute), None),
                at(25),
                Due::Later(Some(at(80))),
            ),
            (
                "a new request between slots",
                Some(&cron),
                Some("2"),
                done(Some(minute), Some("1")),
                at(25),
                Due::Now {
                    slot: None,
                    request: Some("2".into()),
                },
            ),
        ];
        for (name, cron, request, status, now, want) in cases {
            assert_eq!(
                due(cron, &utc, request, &status, Some(at(0)), now),
                want,
                "{name}"
            );
        }
    }

    fn object(key: &str, status: &'static str) -> ObjectOut {
        ObjectOut {
            key: key.into(),
            status,
            checked: None,
            problem: (status != "ok").then(|| format!("{key} is {status}")),
        }
    }

    fn verification(problems: Vec<ObjectOut>) -> Verification {
        let count = problems.len();
        Verification {
            backups: vec![VerifiedBackup {
                backup_id: "20261127T000000Z".into(),
                backup_name: "nightly".into(),
                kind: "full",
                status: if count == 0 { "ok" } else { "damaged" },
                restorable: count == 0,
                payload: std::iter::once(object("c/nightly/x/meta", "ok"))
                    .chain(problems)
                    .collect(),
            }],
            segments: SegmentsOut {
                indexed: 3,
                checked: 2,
                ok: 2,
                problems: Vec::new(),
                unindexed: 0,
                unindexed_names: Vec::new(),
            },
            recovery_window: None,
            malformed: Vec::new(),
            problems: count,
            damage: count > 0,
            newest: Some("20261127T000000Z".into()),
        }
    }

    /// What a verification leaves in status, by outcome: what it read, the first problems
    /// naming their objects, and the slot and request it was for.
    #[test]
    fn the_status_says_what_was_read_and_what_was_not_whole() {
        let previous = VerificationStatus {
            last_schedule_time: Some(Time(at(20))),
            request: Some("1".into()),
            ..Default::default()
        };
        let whole = verification(Vec::new());
        let s = verification_status(
            &previous,
            Ok(Some(&whole)),
            None,
            Some("2".into()),
            Some(at(80)),
            at(30),
        );
        let last = s.last.as_ref().unwrap();
        assert!(last.passed);
        assert_eq!(
            (
                last.backups_checked,
                last.segments_checked,
                last.problem_count
            ),
            (1, 2, 0)
        );
        assert_eq!(last.backup_id.as_deref(), Some("20261127T000000Z"));
        assert_eq!(s.request.as_deref(), Some("2"));
        assert_eq!(
            s.last_schedule_time,
            Some(Time(at(20))),
            "a request keeps the slot"
        );
        assert_eq!(s.next_schedule_time, Some(Time(at(80))));

        let damaged: Vec<ObjectOut> = (0..7)
            .map(|i| object(&format!("c/nightly/x/part{i}"), "damaged"))
            .collect();
        let bad = verification(damaged);
        let s = verification_status(&previous, Ok(Some(&bad)), Some(at(80)), None, None, at(90));
        let last = s.last.as_ref().unwrap();
        assert!(!last.passed);
        assert_eq!(last.problem_count, 7);
        assert_eq!(last.problems.len(), STATUS_PROBLEMS, "bounded");
        assert!(
            last.problems[0].starts_with("c/nightly/x/part0: damaged"),
            "{:?}",
            last.problems
        );
        assert_eq!(s.request.as_deref(), Some("1"), "a slot keeps the request");
        assert_eq!(s.last_schedule_time, Some(Time(at(80))));

        for (outcome, says) in [
            (Ok(None), "no committed backup"),
            (Err("store: access denied".to_owned()), "access denied"),
        ] {
            let s = verification_status(&previous, outcome, None, None, None, at(90));
            let last = s.last.unwrap();
            assert!(!last.passed && last.problem_count == 1);
            assert!(last.problems[0].contains(says), "{:?}", last.problems);
        }
    }
}
