//! Restore tests as Jobs (issue 19 §4): at each slot of a policy's `spec.restoreTest`
//! schedule the operator runs `tidemark restore-test` in a Job in the database image
//! (which has `mariabackup`, `mariadbd` and the client); the Job restores the newest (or a
//! random) point into an `emptyDir`, starts MariaDB on it, checks every table and the
//! user's query, and records the outcome in the store. When the Job has ended the operator
//! reads that record (`_state/restore-test.json`) and reports it: the policy's
//! `status.restoreTest`, the restored Backup's `status.restoreTest`, an event
//! (`RestoreTestPassed` / Warning `RestoreTestFailed`), and the metrics
//! `tidemark_restore_test_passed` and `tidemark_restore_test_last_run_timestamp_seconds`.
//!
//! Each copy's `spec.copies[].restoreTest` runs the same way from the copy's store (its
//! Secret, the same database image), reported in `status.restoreTest.copies`, events
//! naming the copy and `tidemark_copy_restore_test_passed`.
//!
//! One test at a time per policy, whichever store; a slot missed while a test ran (or the
//! operator was down) is run once, not replayed in bulk.
//!
//! On demand (issue 46 §3): a new value of the policy's annotation [`ANNOTATION`] runs one
//! test of the policy's own store as soon as none runs — with `spec.restoreTest`'s target
//! and query, or without one the newest instant and `CHECK TABLE` alone — recorded as
//! `status.restoreTest.request`; the schedule is not moved. `kubectl tidemark restore-test
//! POLICY` sets it and follows the test.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::{Backup, BackupPolicy};
use tidemark_api::policy::{RestoreTestSpec, RestoreTestStatus};
use tidemark_api::schedule::RestoreTestResult;

use crate::context::Context;
use crate::error::Error;
use crate::pod;

/// The annotation that asks for a restore test now: any new value (a date, a counter)
/// runs one; the value acted on last is `status.restoreTest.request`.
pub const ANNOTATION: &str = "tidemark.io/restore-test";
/// The longest annotation value acted on (longer: refused with an event).
pub const MAX_REQUEST: usize = 63;

/// The annotation's value when it asks for a test not run yet (pure): set, new, and 1 to
/// [`MAX_REQUEST`] bytes; `Err` with why a value is not acted on.
pub(crate) fn pending_request(policy: &BackupPolicy) -> Result<Option<String>, String> {
    let Some(value) = policy.annotations().get(ANNOTATION) else {
        return Ok(None);
    };
    let acted = policy
        .status
        .as_ref()
        .and_then(|s| s.restore_test.as_ref())
        .and_then(|t| t.request.as_deref());
    if acted == Some(value.as_str()) {
        return Ok(None);
    }
    if value.is_empty() || value.len() > MAX_REQUEST {
        return Err(format!(
            "annotation {ANNOTATION}: a value of {} bytes is not acted on; give 1 to {MAX_REQUEST} bytes, e.g. the date",
            value.len()
        ));
    }
    Ok(Some(value.clone()))
}

/// The Job of the test a request asks for: named by the request (a digest), so a restarted
/// operator finds the one it started rather than start another.
pub fn request_job_name(policy: &str, uid8: &str, request: &str) -> String {
    let base = crate::names::prefix(policy, 24);
    let digest: String = crate::names::digest16(request).chars().take(10).collect();
    format!("{base}-{uid8}-restore-test-r{digest}")
}

/// Where the restored data directory goes in the Job's pod.
const SCRATCH: &str = "/scratch";
/// How often a running test's Job is looked at.
const POLL: Duration = Duration::from_secs(15);
/// Problems carried into a status.
const STATUS_PROBLEMS: usize = 5;

/// The Job of the test of `slot` for the policy whose uid starts `uid8`: deterministic,
/// so a restarted operator finds it, and two policies never share one (long names are cut,
/// the uid is not).
pub fn job_name(policy: &str, uid8: &str, slot: Timestamp) -> String {
    let base = crate::names::prefix(policy, 24);
    format!(
        "{base}-{uid8}-restore-test-{}",
        slot.strftime("%Y%m%d%H%M%S")
    )
}

/// Whether a Job has ended, and whether it failed: its `Complete`/`Failed` condition (a
/// Job past its deadline without ever running a pod fails with no failed pod), or its pod
/// counts.
pub(crate) fn ended(job: &Job) -> Option<bool> {
    let st = job.status.as_ref()?;
    let condition = |t: &str| {
        st.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == t && c.status == "True")
    };
    if condition("Failed") || st.failed.unwrap_or(0) > 0 {
        Some(true)
    } else if condition("Complete") || st.succeeded.unwrap_or(0) > 0 {
        Some(false)
    } else {
        None
    }
}

/// Looks after the restore tests of `policy`'s store and of its copies; returns when to
/// look again (`None`: the policy has none). Trouble is reported as an event, never stops
/// retention.
///
/// # Guarantees
/// Deletes only its own finished restore-test Jobs; the stores are only read (and the
/// outcome recorded).
pub async fn reconcile(ctx: &Context, policy: &BackupPolicy) -> Option<Duration> {
    let mut targets: Vec<(Option<&str>, &RestoreTestSpec)> =
        std::iter::once((None, policy.spec.restore_test.as_ref()))
            .chain(
                policy
                    .spec
                    .copies
                    .iter()
                    .map(|c| (Some(c.name.as_str()), c.restore_test.as_ref())),
            )
            .filter_map(|(copy, spec)| Some((copy, spec?)))
            .collect();
    let request = match pending_request(policy) {
        Ok(r) => r,
        Err(why) => {
            ctx.warn(&policy.object_ref(&()), "RestoreTestError", &why)
                .await;
            None
        }
    };
    // The policy's own store is looked after for a request, or a requested test still
    // running, without a schedule of its own.
    let own = policy.status.as_ref().and_then(|s| s.restore_test.as_ref());
    let requested_running = own.is_some_and(|t| t.job.is_some() && t.request.is_some());
    if policy.spec.restore_test.is_none() && (request.is_some() || requested_running) {
        targets.insert(0, (None, &ON_DEMAND));
    }
    // None asked for, and no test of one that was left running: nothing to do.
    let left_running =
        own.is_some_and(|t| t.job.is_some() || t.copies.iter().any(|c| c.job.is_some()));
    if targets.is_empty() && !left_running {
        return None;
    }
    match step(ctx, policy, &targets, request).await {
        Ok(wake) => Some(wake),
        Err(e) => {
            let message = format!("restore test: {e}");
            tracing::warn!(policy = %policy.name_any(), "{message}");
            ctx.warn(&policy.object_ref(&()), "RestoreTestError", &message)
                .await;
            Some(Duration::from_secs(300))
        }
    }
}

/// The Job of the test of `slot` of the copy `copy` (`None`: the policy's own store).
fn job_name_of(policy: &BackupPolicy, copy: Option<&str>, slot: Timestamp) -> String {
    let uid8 = crate::names::short_uid(policy);
    match copy {
        None => job_name(&policy.name_any(), &uid8, slot),
        Some(c) => copy_job_name(&policy.name_any(), &uid8, c, slot),
    }
}

/// The Job of the test of `slot` of the copy `copy`: the copy's name as a digest, so that
/// two copies tested at the same slot never share a Job and the name stays within 63.
pub fn copy_job_name(policy: &str, uid8: &str, copy: &str, slot: Timestamp) -> String {
    let base = crate::names::prefix(policy, 20);
    let digest: String = crate::names::digest16(copy).chars().take(8).collect();
    format!(
        "{base}-{uid8}-copy-test-{digest}-{}",
        slot.strftime("%Y%m%d%H%M%S")
    )
}

/// A requested test of a policy without `spec.restoreTest`: the newest instant, no query
/// (its schedule, empty, is never read: it is no schedule).
static ON_DEMAND: RestoreTestSpec = RestoreTestSpec {
    schedule: String::new(),
    target: None,
    query: None,
    expect: None,
    replay: None,
};

async fn step(
    ctx: &Context,
    policy: &BackupPolicy,
    targets: &[(Option<&str>, &RestoreTestSpec)],
    request: Option<String>,
) -> Result<Duration, Error> {
    let tz = match policy.spec.time_zone.as_deref() {
        Some(z) => jiff::tz::TimeZone::get(z)
            .map_err(|_| Error::Invalid(format!("spec.timeZone: unknown time zone {z:?}")))?,
        None => jiff::tz::TimeZone::UTC,
    };
    let ns = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let policies: Api<BackupPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    // The policy as stored now: a cached copy may not yet show the Job the last step
    // started, and two tests must never run at once.
    let Some(fresh) = policies.get_opt(&name).await? else {
        return Ok(Duration::from_secs(3600));
    };
    let named: Vec<&str> = fresh.spec.copies.iter().map(|c| c.name.as_str()).collect();
    let mut all = fresh
        .status
        .as_ref()
        .and_then(|s| s.restore_test.clone())
        .unwrap_or_default();
    let now = ctx.clock.now();
    let labels = crate::metrics::Metrics::policy(&ns, &name);
    seed_metrics(ctx, &ns, &name, &all);

    // The Job of a store no longer tested (a copy removed, or its restoreTest) goes.
    let tested: Vec<Option<&str>> = targets.iter().map(|t| t.0).collect();
    let mut orphans: Vec<String> = Vec::new();
    if !tested.contains(&None) {
        orphans.extend(all.job.take());
    }
    for c in &mut all.copies {
        if !tested.contains(&Some(c.name.as_str())) {
            orphans.extend(c.job.take());
        }
    }
    for job_name in &orphans {
        if let Some(job) = jobs.get_opt(job_name).await?
            && crate::context::owns(policy, &job.metadata)
        {
            let _ = jobs.delete(job_name, &DeleteParams::background()).await;
        }
    }

    // A test running: wait for its Job, then report what it recorded.
    let mut finished = Vec::new();
    let mut running = false;
    for &(copy, _) in targets {
        let mut status = all.of(copy);
        let Some(job_name) = status.job.clone() else {
            continue;
        };
        match jobs.get_opt(&job_name).await? {
            Some(job) if crate::context::owns(policy, &job.metadata) => match ended(&job) {
                None => running = true,
                Some(failed) => {
                    let why = if failed {
                        pod::job_failure(&ctx.client, &job).await
                    } else {
                        None
                    };
                    let read = store_view(policy, copy)?;
                    report(ctx, policy, &read, copy, &mut status, &job_name, why).await?;
                    finished.push(job_name);
                }
            },
            // Deleted by someone (or not ours): the next slot runs a new one.
            _ => status.job = None,
        }
        all = all.with(copy, status, &named);
    }

    // The next slot of each store: the first after its last one run (or the policy's
    // creation). One test at a time per policy: of the stores due, the one tested longest
    // ago goes first, so a store always due never starves the others.
    let mut wake: Option<Timestamp> = None;
    let mut chosen: Option<Chosen> = None;
    for &(copy, spec) in targets {
        if std::ptr::eq(spec, &ON_DEMAND) {
            continue;
        }
        let (cron, random) = match spec.settings() {
            Ok(s) => s,
            // A request still runs (with the spec's query); the schedule waits for a fix.
            Err(_) if request.is_some() => continue,
            Err(e) => return Err(Error::Invalid(e.to_string())),
        };
        let mut status = all.of(copy);
        let since = status
            .last_schedule_time
            .as_ref()
            .map(|t| t.0)
            .or_else(|| policy.meta().creation_timestamp.as_ref().map(|t| t.0))
            .unwrap_or(now);
        let next = status
            .job
            .is_none()
            .then(|| cron.next_after(since, &tz))
            .flatten();
        // A copy is tested once its first pass has sent something: before that it would
        // only fail for being empty.
        let ready = copy.is_none_or(|c| crate::copies::has_data(&fresh, c));
        if let Some(due) = next.filter(|d| *d <= now && !running && ready) {
            // At most one catch-up run: the latest slot that has come.
            let slot = cron.latest_in(since, now, &tz).unwrap_or(due);
            let last = status.last.as_ref().map(|l| l.tested_at.0);
            if chosen.as_ref().is_none_or(|c| last < c.last) {
                chosen = Some(Chosen {
                    last,
                    copy: copy.map(str::to_owned),
                    spec: spec.clone(),
                    random,
                    slot,
                });
            }
        }
        let mut upcoming = cron.next_after(now, &tz);
        status.next_schedule_time = upcoming.map(Time);
        if let (None, Some(next)) = (copy, upcoming) {
            let m = &ctx.metrics;
            m.restore_test_next_run
                .get_or_create(&labels)
                .set(next.as_second());
            if let Some(gap) = cron.longest_gap(now, &tz) {
                m.restore_test_interval
                    .get_or_create(&labels)
                    .set(gap.as_secs());
            }
        }
        if !ready {
            // Looked at again soon: the copy's first pass may end any time.
            upcoming = Some(now + jiff::SignedDuration::from_secs(60));
        }
        wake = match (wake, upcoming) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        all = all.with(copy, status, &named);
    }
    // A request goes before the schedule, once nothing runs: the policy's own store, its
    // settings (or the newest instant and no query).
    let request = request.filter(|_| !running);
    if let Some(r) = &request {
        let spec = targets
            .iter()
            .find(|t| t.0.is_none())
            .map_or(&ON_DEMAND, |t| t.1);
        chosen = Some(Chosen {
            last: None,
            copy: None,
            spec: spec.clone(),
            random: spec.target.as_deref() == Some("random"),
            slot: now,
        });
        tracing::info!(policy = %name, request = %r, "restore test asked for");
    }
    if let Some(c) = chosen {
        let copy = c.copy.as_deref();
        let job_name = match &request {
            Some(r) => request_job_name(&name, &crate::names::short_uid(policy), r),
            None => job_name_of(policy, copy, c.slot),
        };
        let read = store_view(policy, copy)?;
        let job = job(ctx, &read, &job_name, c.random, &c.spec).await?;
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => {}
            // Ours from before a restart (or, never, another's: then it is not waited for).
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(policy = %name, copy = ?copy, job = %job_name, "restore test started");
        let mut status = all.of(copy);
        status.job = Some(job_name);
        match request {
            // Acted on: the schedule's own slots stay as they were.
            Some(r) => status.request = Some(r),
            None => status.last_schedule_time = Some(Time(c.slot)),
        }
        all = all.with(copy, status, &named);
        running = true;
    }
    crate::status::restore_test(
        &policies,
        &name,
        serde_json::to_value(&all).unwrap_or_default(),
    )
    .await?;
    // Only once its outcome is in status does a finished Job go.
    for job_name in finished {
        let _ = jobs.delete(&job_name, &DeleteParams::background()).await;
    }
    Ok(if running {
        POLL
    } else {
        wake.map_or(Duration::from_secs(3600), |t| {
            Duration::try_from(t.duration_since(now))
                .unwrap_or(Duration::ZERO)
                .max(Duration::from_secs(1))
        })
    })
}

/// The test a step starts: the store (`copy`), its settings and slot, and when that store
/// was last tested (the longest ago goes first).
struct Chosen {
    last: Option<Timestamp>,
    copy: Option<String>,
    spec: RestoreTestSpec,
    random: bool,
    slot: Timestamp,
}

/// The gauges of the last outcomes in `status`, the policy's store's and each copy's:
/// right from start-up, not only after the next test.
fn seed_metrics(ctx: &Context, ns: &str, name: &str, status: &RestoreTestStatus) {
    use prometheus_client::metrics::gauge::Gauge;
    let seed = |run: &Gauge, passed: &Gauge, last: &RestoreTestResult| {
        if run.get() < last.tested_at.0.as_second() {
            run.set(last.tested_at.0.as_second());
            passed.set(i64::from(last.passed));
        }
    };
    let m = &ctx.metrics;
    if let Some(last) = &status.last {
        let labels = crate::metrics::Metrics::policy(ns, name);
        seed(
            &m.restore_test_last_run.get_or_create(&labels),
            &m.restore_test_passed.get_or_create(&labels),
            last,
        );
    }
    for c in &status.copies {
        let Some(last) = &c.last else { continue };
        let labels = crate::metrics::CopyLabels {
            namespace: ns.to_owned(),
            policy: name.to_owned(),
            copy: c.name.clone(),
        };
        seed(
            &m.copy_restore_test_last_run.get_or_create(&labels),
            &m.copy_restore_test_passed.get_or_create(&labels),
            last,
        );
    }
}

/// The policy as the store `copy` is read: its own (`None`), or its copy's view (the
/// copy's store, Secret and keys; the same database).
fn store_view(policy: &BackupPolicy, copy: Option<&str>) -> Result<BackupPolicy, Error> {
    match copy {
        None => Ok(policy.clone()),
        Some(c) => policy
            .as_copy(c)
            .ok_or_else(|| Error::Invalid(format!("the policy names no copy {c:?}"))),
    }
}

/// Reads what the Job recorded and reports it: status, the Backup restored, an event and
/// the metrics. A Job that ended without a record (its restore failed) is reported with
/// `why` (its pod's termination message).
/// A copy's test (`copy`) is read from the copy's store (`read`, the policy's view of it),
/// reported under the copy's metrics and events naming it, and not on Backup objects
/// (theirs are the policy's store's tests).
async fn report(
    ctx: &Context,
    policy: &BackupPolicy,
    read: &BackupPolicy,
    copy: Option<&str>,
    status: &mut RestoreTestStatus,
    job_name: &str,
    why: Option<String>,
) -> Result<(), Error> {
    status.job = None;
    let store = crate::stores::open(ctx, read).await?;
    let record = tidemark_store::transfer::latest_restore_test(&store)
        .await
        .map_err(|e| Error::Engine(e.into()))?
        .and_then(|v| serde_json::from_value::<tidemark_mariadb::check::RestoreTestRecord>(v).ok())
        // Only this Job's record (it ran with `--run-id <its name>`).
        .filter(|r| r.run_id.as_deref() == Some(job_name));
    let (ns, name) = (policy.namespace().unwrap_or_default(), policy.name_any());
    let passed = |ok: bool| {
        let now = ctx.clock.now().as_second();
        let m = &ctx.metrics;
        match copy {
            None => {
                let labels = crate::metrics::Metrics::policy(&ns, &name);
                m.restore_test_last_run.get_or_create(&labels).set(now);
                m.restore_test_passed
                    .get_or_create(&labels)
                    .set(i64::from(ok));
            }
            Some(c) => {
                let labels = crate::metrics::CopyLabels {
                    namespace: ns.clone(),
                    policy: name.clone(),
                    copy: c.to_owned(),
                };
                m.copy_restore_test_last_run.get_or_create(&labels).set(now);
                m.copy_restore_test_passed
                    .get_or_create(&labels)
                    .set(i64::from(ok));
            }
        }
    };
    let of_copy = copy.map(|c| format!("copy {c}: ")).unwrap_or_default();
    let Some(record) = record else {
        let message = format!(
            "{of_copy}restore test Job {job_name} ended without restoring anything ({}); the next slot tries again",
            why.unwrap_or_else(|| "its pod's log says why".into())
        );
        status.last = Some(RestoreTestResult {
            tested_at: Time(ctx.clock.now()),
            passed: false,
            target: None,
            backup_id: None,
            tables_checked: None,
            oracle_chunks: None,
            problems: vec![message.clone()],
        });
        passed(false);
        ctx.warn(&policy.object_ref(&()), "RestoreTestFailed", &message)
            .await;
        return Ok(());
    };
    let outcome = &record.outcome;
    let result = RestoreTestResult {
        tested_at: Time(record.tested_at),
        passed: outcome.passed,
        target: Some(Time(record.target)),
        backup_id: Some(record.backup_id.clone()),
        tables_checked: Some(outcome.tables_checked as u64),
        oracle_chunks: outcome.oracle_chunks,
        problems: outcome
            .problems
            .iter()
            .take(STATUS_PROBLEMS)
            .cloned()
            .collect(),
    };
    status.last = Some(result.clone());
    passed(outcome.passed);
    if copy.is_none() {
        ctx.metrics
            .restore_test_duration
            .get_or_create(&crate::metrics::Metrics::policy(&ns, &name))
            .set(i64::try_from(record.seconds).unwrap_or(i64::MAX));
    }
    let mut what = format!(
        "{of_copy}restore test of {} ({}/{}, {} backup(s), {} binlog(s)): {} table(s) checked",
        record.target,
        record.backup_name,
        record.backup_id,
        record.chain.len(),
        record.segments_replayed,
        outcome.tables_checked
    );
    if let Some(n) = outcome.oracle_chunks {
        what.push_str(&format!(", {n} chunk(s) of the restore oracle compared"));
    }
    if outcome.passed {
        ctx.event(
            &policy.object_ref(&()),
            EventType::Normal,
            "RestoreTestPassed",
            &format!("{what}; passed"),
        )
        .await;
    } else {
        ctx.warn(
            &policy.object_ref(&()),
            "RestoreTestFailed",
            &format!("{what}; failed: {}", outcome.problems.join("; ")),
        )
        .await;
    }
    if copy.is_some() {
        return Ok(());
    }
    // The Backup object of the backup restored, if it has one: found in the operator's
    // cache of Backups (a namespace may hold thousands; no list request per test).
    let backups: Api<Backup> = Api::namespaced(ctx.client.clone(), &ns);
    let restored = ctx.backups.state().into_iter().find(|b| {
        b.namespace().as_deref() == Some(ns.as_str())
            && b.spec.template.policy.name == policy.name_any()
            && b.status.as_ref().and_then(|s| s.backup_id.as_deref())
                == Some(record.backup_id.as_str())
    });
    if let Some(b) = restored {
        crate::status::restore_test(
            &backups,
            &b.name_any(),
            serde_json::to_value(&result).unwrap_or_default(),
        )
        .await?;
    }
    Ok(())
}

/// The Job that runs `tidemark restore-test` in the database image.
async fn job(
    ctx: &Context,
    policy: &BackupPolicy,
    name: &str,
    random: bool,
    spec: &tidemark_api::policy::RestoreTestSpec,
) -> Result<Job, Error> {
    let database = crate::database::database_runtime(ctx, policy).await?;
    let store_secret = crate::stores::policy_secret_keys(ctx, policy).await?;
    // The scratch volume is sized by what the store records (a random target may be
    // anywhere in the window: the largest restore).
    let store = crate::stores::open(ctx, policy).await?;
    let _turn = ctx
        .catalog_turn
        .acquire()
        .await
        .map_err(|e| Error::Internal(e.to_string()))?;
    let scratch = tidemark_store::Catalog::load(&store, &tidemark_store::NoProgress)
        .await
        .map_err(|e| Error::Engine(e.into()))?
        .restore_scratch_bytes();
    let args = args_of(policy, name, random, spec).map_err(Error::Invalid)?;
    tool_job(
        policy,
        name,
        args,
        &database,
        &ctx.image,
        store_secret.as_ref(),
    )
    .with_scratch(scratch)
    .job()
    .map_err(Error::Invalid)
}

/// The Job's [`crate::consolidation::ToolJob`] running `args` (no scratch bound yet).
pub fn tool_job<'a>(
    policy: &'a BackupPolicy,
    name: &'a str,
    args: Vec<String>,
    database: &'a crate::database::DatabaseRuntime,
    operator_image: &'a str,
    store_secret: Option<&'a crate::stores::SecretKeys>,
) -> crate::consolidation::ToolJob<'a> {
    crate::consolidation::ToolJob {
        policy,
        name,
        label: "tidemark.io/restore-test",
        container: "restore-test",
        args,
        database,
        operator_image,
        store_secret,
        work: ("scratch", SCRATCH),
        scratch_bytes: None,
        claim: None,
        owner: None,
    }
}

/// The container's arguments: `tidemark restore-test` with the store's settings, the
/// query and its expected result.
pub fn args_of(
    policy: &BackupPolicy,
    name: &str,
    random: bool,
    spec: &tidemark_api::policy::RestoreTestSpec,
) -> Result<Vec<String>, String> {
    let mut args = vec![
        pod::tidemark_script(),
        "tidemark".to_owned(),
        "restore-test".to_owned(),
    ];
    args.extend(pod::store_args(policy)?);
    args.extend(["--scratch", SCRATCH, "--output", "json"].map(str::to_owned));
    if random {
        args.push("--random".into());
    }
    args.push(format!("--run-id={name}"));
    if let Some(how) =
        tidemark_api::policy::replay_of("spec.restoreTest.replay", spec.replay.as_deref())
            .map_err(|e| e.to_string())?
    {
        args.push(format!("--replay={how}"));
    }
    // `--flag=value`: a query or result starting with `-` stays a value.
    if let Some(q) = &spec.query {
        args.push(format!("--query={q}"));
        if let Some(e) = &spec.expect {
            args.push(format!("--expect={e}"));
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    /// The annotation asks once per value: a value acted on (in status) asks nothing, an
    /// empty or too long one is refused with why; the Job a request starts is named by the
    /// request, within 63 characters.
    #[test]
    fn a_request_is_a_new_annotation_value() {
        let policy = |annotation: Option<&str>, acted: Option<&str>| -> BackupPolicy {
            serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
                "metadata": {"name": "shop", "namespace": "ns",
                             "annotations": annotation.map(|a| json!({ANNOTATION: a})).unwrap_or(json!({}))},
                "spec": {"objectStore": {"bucket": "b"}},
                "status": {"restoreTest": {"request": acted}},
            }))
            .unwrap()
        };
        assert_eq!(pending_request(&policy(None, None)), Ok(None));
        assert_eq!(
            pending_request(&policy(Some("2026-11-30"), None)),
            Ok(Some("2026-11-30".into()))
        );
        assert_eq!(
            pending_request(&policy(Some("2026-11-30"), Some("2026-11-29"))),
            Ok(Some("2026-11-30".into()))
        );
        assert_eq!(
            pending_request(&policy(Some("2026-11-30"), Some("2026-11-30"))),
            Ok(None)
        );
        assert!(pending_request(&policy(Some(""), None)).is_err());
        let long = "x".repeat(MAX_REQUEST + 1);
        assert!(
            pending_request(&policy(Some(&long), None))
                .unwrap_err()
                .contains("64 bytes")
        );
        let a = request_job_name(&"p".repeat(60), "0123abcd", "2026-11-30T05:00:00Z");
        let b = request_job_name(&"p".repeat(60), "0123abcd", "2026-11-30T05:00:01Z");
        assert!(a.len() <= 63 && a != b, "{a} {b}");
        assert_eq!(
            a,
            request_job_name(&"p".repeat(60), "0123abcd", "2026-11-30T05:00:00Z")
        );
    }

    /// The Job runs `tidemark restore-test` in the database image with the store's
    /// settings, the query and its expected result, the identities by Secret reference,
    /// and its scratch space in an emptyDir.
    #[test]
    fn the_job_restores_and_checks_in_the_database_image() {
        let policy: BackupPolicy = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
            "metadata": {"name": "shop", "namespace": "ns", "uid": "0123"},
            "spec": {
                "objectStore": {"bucket": "b", "endpoint": "http://s3:9000",
                    "encryption": {"recipients": [], "identitySecret": "keys"}},
                "restoreTest": {"schedule": "0 0 4 * * *", "target": "random",
                    "query": "SELECT COUNT(*) FROM shop.orders", "expect": "8"},
            },
        }))
        .unwrap();
        let spec = policy.spec.restore_test.clone().unwrap();
        let db = crate::database::DatabaseRuntime {
            image: "mariadb:11.4".into(),
            pod_security: None,
            container_security: None,
        };
        let name = job_name("shop", "01230000", "2026-11-25T04:00:00Z".parse().unwrap());
        assert_eq!(name, "shop-01230000-restore-test-20261125040000");
        let args = args_of(&policy, &name, true, &spec).unwrap();
        let job = tool_job(&policy, &name, args, &db, "tidemark:test", None)
            .with_scratch(Some(3 << 30))
            .job()
            .unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        // It holds the identity and reads the bucket: no API token beside (issue 28).
        assert_eq!(pod.automount_service_account_token, Some(false));
        // Its scratch is bounded by the store's largest restore, and requested (issue 28).
        let scratch = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "scratch")
            .unwrap();
        assert_eq!(
            scratch.empty_dir.as_ref().unwrap().size_limit,
            Some(Quantity((3u64 << 30).to_string()))
        );
        let c = &pod.containers[0];
        assert_eq!(
            c.resources.as_ref().unwrap().requests.as_ref().unwrap()["ephemeral-storage"],
            Quantity((3u64 << 30).to_string())
        );
        assert_eq!(c.image.as_deref(), Some("mariadb:11.4"));
        let args = c.args.clone().unwrap();
        let joined = args.join(" ");
        for want in [
            "tidemark restore-test --store s3://b --cluster shop --scratch /scratch --output json --random",
            "--run-id=shop-01230000-restore-test-20261125040000 --query=SELECT COUNT(*) FROM shop.orders --expect=8",
        ] {
            assert!(joined.contains(want), "{joined}");
        }
        let env = c.env.clone().unwrap();
        let identity = env.iter().find(|e| e.name == "TIDEMARK_IDENTITY").unwrap();
        assert!(identity.value.is_none() && identity.value_from.is_some());
        assert!(
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == SCRATCH)
        );
        assert!(!env.iter().any(|e| e.name.starts_with("TIDEMARK_LOCK_")));
        // How binlogs replay: the command's default (the applier) unless the spec says.
        assert!(!joined.contains("--replay"), "{joined}");
        let client = RestoreTestSpec {
            replay: Some("client".into()),
            ..spec.clone()
        };
        let args = args_of(&policy, &name, true, &client).unwrap();
        assert!(args.contains(&"--replay=client".to_owned()), "{args:?}");
        let wrong = RestoreTestSpec {
            replay: Some("fast".into()),
            ..spec
        };
        let e = args_of(&policy, &name, true, &wrong).unwrap_err();
        assert!(e.contains("spec.restoreTest.replay"), "{e}");
    }

    /// A copy's test: its own Job name (the copy as a digest, at most 63 characters with
    /// the longest policy name and a whole uid, two copies at one slot apart), reading the
    /// copy's bucket with the policy's identity and the copy's own query.
    #[test]
    fn a_copys_test_reads_the_copy() {
        let policy: BackupPolicy = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
            "metadata": {"name": "a-policy-with-a-rather-long-name", "namespace": "ns",
                         "uid": "01234567-89ab-cdef-0123-456789abcdef"},
            "spec": {
                "objectStore": {"bucket": "b", "endpoint": "http://s3:9000",
                    "encryption": {"recipients": [], "identitySecret": "keys"}},
                "copies": [{"name": "dr", "objectStore": {"bucket": "dr-b", "endpoint": "http://s3:9000"},
                            "restoreTest": {"schedule": "0 0 5 * * *", "query": "SELECT 2", "expect": "2"}}],
            },
        }))
        .unwrap();
        let slot: Timestamp = "2026-11-25T05:00:00Z".parse().unwrap();
        let name = job_name_of(&policy, Some("dr"), slot);
        assert_eq!(name.len(), 63, "{name}");
        assert!(name.ends_with("-20261125050000"), "{name}");
        assert_ne!(name, job_name_of(&policy, Some("dr2"), slot));
        assert_ne!(name, job_name_of(&policy, None, slot));
        let view = store_view(&policy, Some("dr")).unwrap();
        let spec = view.spec.restore_test.clone().unwrap();
        let joined = args_of(&view, &name, false, &spec).unwrap().join(" ");
        assert!(
            joined.contains("--store s3://dr-b --cluster a-policy-with-a-rather-long-name"),
            "{joined}"
        );
        assert!(joined.contains("--query=SELECT 2 --expect=2"), "{joined}");
        assert_eq!(
            view.spec
                .object_store
                .unwrap()
                .encryption
                .unwrap()
                .identity_secret
                .as_deref(),
            Some("keys")
        );
        assert!(store_view(&policy, Some("elsewhere")).is_err());
    }

    /// Under object lock a tool Job gets the mode and the period as the policy resolves
    /// it: `objectLock.period`, else `retention.window` (a consolidation's synthetic full
    /// is locked at least that long from now).
    #[test]
    fn tool_jobs_get_the_lock_period_the_policy_resolves() {
        let db = crate::database::DatabaseRuntime {
            image: "mariadb:11.4".into(),
            pod_security: None,
            container_security: None,
        };
        let lock_env = |lock: serde_json::Value| {
            let policy: BackupPolicy = serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
                "metadata": {"name": "shop", "namespace": "ns", "uid": "0123"},
                "spec": {
                    "objectStore": {"bucket": "b", "objectLock": lock},
                    "retention": {"window": "14d"},
                },
            }))
            .unwrap();
            let job = crate::consolidation::ToolJob {
                policy: &policy,
                name: "shop-consolidate",
                label: "tidemark.io/consolidation",
                container: "consolidate",
                args: vec![],
                database: &db,
                operator_image: "tidemark:test",
                store_secret: None,
                work: ("work", "/work"),
                scratch_bytes: None,
                claim: None,
                owner: None,
            }
            .job()
            .unwrap();
            let mut env: Vec<(String, String)> =
                job.spec.unwrap().template.spec.unwrap().containers[0]
                    .env
                    .clone()
                    .unwrap()
                    .into_iter()
                    .filter(|e| e.name.starts_with("TIDEMARK_LOCK_"))
                    .map(|e| (e.name, e.value.unwrap_or_default()))
                    .collect();
            env.sort();
            env
        };
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert_eq!(
            lock_env(json!({"mode": "governance"})),
            [
                pair("TIDEMARK_LOCK_MODE", "governance"),
                pair("TIDEMARK_LOCK_PERIOD", "14d")
            ]
        );
        assert_eq!(
            lock_env(json!({"mode": "compliance", "period": "30d"})),
            [
                pair("TIDEMARK_LOCK_MODE", "compliance"),
                pair("TIDEMARK_LOCK_PERIOD", "30d")
            ]
        );
    }
}
