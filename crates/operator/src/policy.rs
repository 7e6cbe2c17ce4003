//! The BackupPolicy controller: the engine's retention pass — the one `tidemark gc` and
//! `tidemark run` make — throttled to `spec.retentionInterval`, with its outcome in the
//! policy's status and a `BackupRetention` event when it deleted something.
//!
//! The store is the source of truth (DESIGN.md §1): the pass reads `metadata.json` and
//! `_index.json`, never the Backup objects, except for holds — a Backup annotated
//! `tidemark.io/protect: "true"` keeps its backup-id whatever the rules say.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{
    BackupPolicy, BackupPolicyStatus, DataRemoved, GapStatus, RecoveryWindowStatus, StoredBackup,
    TimelineStatus,
};
use tidemark_core::Action;
use tidemark_engine::{PassOutcome, PassRequest, unattended_pass};

use crate::context::Context;
use crate::error::Error;
use crate::status::{condition, condition_at};

/// Runs the policy's retention pass when it is due.
///
/// # Guarantees
/// Deletes only what the engine's pass plans, under the store's lease ([`unattended_pass`]);
/// and Backup objects beyond their history (`history::prune`), finished consolidation Jobs.
///
/// # Errors
/// The spec is invalid, its Secret is missing, the store failed or holds data that blocks
/// the pass; each also lands in status as the `Ready` condition.
pub async fn reconcile(policy: Arc<BackupPolicy>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let ns = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let api: Api<BackupPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    if policy.meta().deletion_timestamp.is_some() {
        return Ok(Requeue::await_change());
    }
    // Restore tests (their own Jobs and status) and the binlog archive's lag: looked after
    // whatever the retention pass is doing, and never in its way.
    let wake = crate::restoretest::reconcile(&ctx, &policy).await;
    let wake = match (wake, crate::archivewatch::check(&ctx, &policy).await) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    // A pass in the background: wait for it; once it ended, its failure goes to the
    // backoff, and after a success the policy is looked at afresh (its status now holds
    // the pass; the spec may have changed meanwhile and be due at once).
    let policy = match ctx.background.poll(&crate::context::key(policy.as_ref())) {
        crate::background::Polled::Running | crate::background::Polled::Queued => {
            return Ok(sooner(crate::background::POLL, wake));
        }
        crate::background::Polled::Done(Err(e)) => {
            // A spec change that arrived while the failed pass ended was consumed by this
            // reconcile: the failure would otherwise hold the changed policy back for the
            // whole backoff (10 minutes for data and input errors). Changed since the
            // pass: evaluated afresh now.
            match api.get_opt(&name).await? {
                Some(p) if changed_since_failure(&p) => Arc::new(p),
                _ => return Err(e),
            }
        }
        crate::background::Polled::Done(Ok(_)) => match api.get_opt(&name).await? {
            Some(p) => Arc::new(p),
            None => return Ok(Requeue::await_change()),
        },
        crate::background::Polled::Idle => policy,
    };
    // The binlog archiver (a Deployment) first: it does not wait for the retention pass.
    if let Err(e) = crate::archiver::reconcile(&ctx, &policy).await {
        // The archiver's trouble is its own: retention goes on.
        let message = format!("binlog archiver: {e}");
        tracing::warn!(policy = %name, "{message}");
        ctx.warn(&policy.object_ref(&()), "BinlogArchiverFailed", &message)
            .await;
    }
    let Some(retention) = policy.spec.retention.as_ref() else {
        return Ok(wake.map_or_else(Requeue::await_change, Requeue::requeue));
    };
    let now = ctx.clock.now();
    let checked = tidemark_api::names::label_value_name("metadata.name", &name)
        .map_err(tidemark_api::policy::PolicyFileError::from)
        .and_then(|()| policy.spec.validate())
        .and_then(|()| policy.spec.retention_interval())
        .map_err(|e| e.to_string())
        .and_then(|interval| {
            retention
                .to_input(policy.spec.time_zone.as_deref())
                .validate()
                .map(|p| (p, interval))
                .map_err(|e| format!("spec.retention: {e}"))
        });
    let (rules, interval) = match checked {
        Ok(v) => v,
        Err(message) => {
            ctx.warn(&policy.object_ref(&()), "InvalidSpec", &message)
                .await;
            set_failed(&api, &policy, "InvalidSpec", &message, None).await?;
            return Err(Error::Invalid(message));
        }
    };
    let status = policy.status.clone().unwrap_or_default();
    let generation = policy.meta().generation;
    if let Some(last) = status.last_retention_run_time.as_ref().map(|t| t.0)
        && status.observed_generation == generation
    {
        let due = tidemark_core::saturating_add(last, interval);
        if due > now {
            return Ok(sooner(until(now, due), wake));
        }
    }

    // Seed 000: retention runs only while the cluster has an established primary. While
    // it has none (an outage, a failover, a bootstrap) no new backups arrive, so nothing
    // may expire meanwhile. A store-only policy (no source) has no pods to look at.
    if let Some(source) = &policy.spec.source {
        let ready_for = source
            .primary_ready_for()
            .map_err(|e| Error::Invalid(e.to_string()))?;
        if let Some((message, recheck)) =
            no_established_primary(&ctx, &ns, source, ready_for, now).await?
        {
            ctx.warn(&policy.object_ref(&()), "NoEstablishedPrimary", &message)
                .await;
            set_failed(&api, &policy, "NoEstablishedPrimary", &message, None).await?;
            return Ok(sooner(recheck, wake));
        }
    }
    // The pass runs in the background (its hooks and consolidations can take long), never
    // holding one of the controller's reconcile slots; the reconcile after it collects the
    // outcome.
    let queue = Arc::new(std::sync::atomic::AtomicU8::new(PENDING));
    let work = {
        let (queue, api, name) = (queue.clone(), api.clone(), name.clone());
        let work = pass(ctx.clone(), policy.clone(), rules, interval, now);
        async move {
            // Its turn came: a `Queued` condition written meanwhile goes.
            if queue.swap(STARTED, std::sync::atomic::Ordering::AcqRel) == QUEUED {
                unqueue(&api, &name).await;
            }
            work.await
        }
    };
    if !ctx
        .background
        .start(crate::context::key(policy.as_ref()), work)
    {
        set_queued(&ctx, &api, &policy, &queue).await;
    }
    Ok(Requeue::requeue(crate::background::POLL))
}

/// Whether `policy`'s spec changed after its last failed pass (its generation is newer than
/// the one the `Ready=False` condition was written for).
fn changed_since_failure(policy: &BackupPolicy) -> bool {
    let failed_for = policy
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .filter(|c| c.status == "False")
        .and_then(|c| c.observed_generation);
    matches!((policy.meta().generation, failed_for), (Some(now), Some(then)) if now > then)
}

/// Why the cluster has no established primary (and when to look again), or `None` when it
/// has one: exactly one selected pod labelled primary — or, when no selected pod carries
/// the role label, the only selected pod — Running and Ready for at least `ready_for`.
///
/// # Errors
/// The pods could not be listed.
async fn no_established_primary(
    ctx: &Context,
    ns: &str,
    source: &tidemark_api::policy::SourceSpec,
    ready_for: jiff::SignedDuration,
    now: Timestamp,
) -> Result<Option<(String, Duration)>, Error> {
    use k8s_openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = crate::names::selector(&source.selector)?;
    let listed = crate::lean::list(
        &pods,
        &kube::api::ListParams::default().labels(&selector),
        crate::lean::meta_of,
    )
    .await?;
    let live: Vec<&Pod> = listed
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let label = source
        .role_label
        .as_deref()
        .unwrap_or(crate::names::DEFAULT_ROLE_LABEL);
    let labelled: Vec<&Pod> = live
        .iter()
        .copied()
        .filter(|p| p.labels().get(label).is_some_and(|r| r == "primary"))
        .collect();
    let unlabelled = live.iter().all(|p| !p.labels().contains_key(label));
    let again = Duration::from_secs(30);
    let primary = match (labelled.as_slice(), unlabelled, live.as_slice()) {
        ([one], _, _) => *one,
        ([], true, [only]) => *only,
        ([], _, []) => {
            return Ok(Some((
                format!(
                    "no established primary: no pod matches spec.source.selector ({selector}); retention deletes nothing until one has been Running and Ready for {ready_for:#}"
                ),
                again,
            )));
        }
        ([], _, _) => {
            return Ok(Some((
                format!(
                    "no established primary: no pod matching spec.source.selector is labelled {label}=primary; retention deletes nothing until one has been Running and Ready for {ready_for:#}"
                ),
                again,
            )));
        }
        (many, _, _) => {
            let mut names: Vec<String> = many.iter().map(|p| p.name_any()).collect();
            names.sort();
            return Ok(Some((
                format!(
                    "no established primary: {} pods are labelled {label}=primary ({}); retention deletes nothing until there is one",
                    names.len(),
                    names.join(", ")
                ),
                again,
            )));
        }
    };
    let status = primary.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready_since = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .map(|c| c.last_transition_time.as_ref().map_or(now, |t| t.0));
    let name = primary.name_any();
    match ready_since {
        Some(since) if running => {
            let established = tidemark_core::saturating_add(since, ready_for);
            if established <= now {
                Ok(None)
            } else {
                Ok(Some((
                    format!(
                        "no established primary yet: pod {name} has been Ready since {since}; retention deletes once it has been for {ready_for:#} (spec.source.primaryReadyFor), at {established}"
                    ),
                    until(now, established).max(Duration::from_secs(1)),
                )))
            }
        }
        _ => Ok(Some((
            format!(
                "no established primary: pod {name} is not Running and Ready; retention deletes nothing until it has been for {ready_for:#}"
            ),
            again,
        ))),
    }
}

/// One retention pass of `policy` under the store's lease, its outcome in status, metrics
/// and events.
///
/// # Errors
/// Its Secret is missing, the store failed or holds data that blocks the pass (each also
/// in status as the `Ready` condition).
async fn pass(
    ctx: Arc<Context>,
    policy: Arc<BackupPolicy>,
    rules: tidemark_core::Policy,
    interval: jiff::SignedDuration,
    now: Timestamp,
) -> Result<Requeue, Error> {
    let ns = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let api: Api<BackupPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(retention) = policy.spec.retention.as_ref() else {
        return Ok(Requeue::await_change());
    };
    let status = policy.status.clone().unwrap_or_default();
    let generation = policy.meta().generation;
    let store = match crate::stores::open(&ctx, &policy).await {
        Ok(s) => s,
        Err(e) => {
            let message = failed_message(&ctx, &policy, &e);
            set_failed(&api, &policy, reason(&e), &message, None).await?;
            return Err(e);
        }
    };
    let request = PassRequest {
        policy: rules,
        policy_as_given: serde_json::to_value(retention).unwrap_or_default(),
        now,
        started_at: now,
        protect: crate::holds::holds(&ctx, &ns, &name),
        execute: true,
        ignore_malformed: false,
        hooks: Some(Arc::new(crate::hooks::PassHooks {
            ctx: ctx.clone(),
            namespace: ns.clone(),
            policy: name.clone(),
        })),
    };
    // Consolidations run as Jobs in the database image (seed 002).
    let consolidator = if request.policy.consolidate {
        consolidator(&ctx, &policy).await
    } else {
        None
    };
    let labels = crate::metrics::Metrics::policy(&ns, &name);
    let driver = consolidator
        .as_ref()
        .map(|c| c as &dyn tidemark_engine::Consolidator);
    // Under the store's lease: no other leader, policy or `tidemark run` deletes from this
    // store meanwhile.
    let fenced = match crate::fence::acquire(&ctx, &store).await {
        Ok(fence) => {
            let r = unattended_pass(&store, &request, Some(&fence), driver)
                .await
                .map_err(Error::from);
            fence.release().await;
            r
        }
        Err(e) => Err(e),
    };
    let outcome = match fenced {
        Ok(o) => o,
        Err(e) => {
            ctx.metrics
                .retention_passes
                .get_or_create(&crate::metrics::PassLabels {
                    namespace: ns.clone(),
                    policy: name.clone(),
                    result: e.class().as_str().to_owned(),
                })
                .inc();
            let message = failed_message(&ctx, &policy, &e);
            set_failed(&api, &policy, reason(&e), &message, Some(now)).await?;
            return Err(e);
        }
    };
    if let Some(c) = &consolidator {
        c.remove_finished().await;
    }
    let summary = PassSummary::of(&outcome);
    let failures = outcome
        .executed
        .as_ref()
        .map_or(&[][..], |r| r.failures.as_slice());
    let m = &ctx.metrics;
    m.retention_passes
        .get_or_create(&crate::metrics::PassLabels {
            namespace: ns.clone(),
            policy: name.clone(),
            result: if failures.is_empty() { "ok" } else { "partial" }.into(),
        })
        .inc();
    if let Some(r) = &outcome.executed {
        m.objects_deleted
            .get_or_create(&labels)
            .inc_by(r.objects_deleted as u64);
    }
    m.bytes_freed
        .get_or_create(&labels)
        .inc_by(summary.bytes_freed);
    m.recovery_window_seconds.get_or_create(&labels).set(
        outcome
            .survey
            .plan
            .recovery_window
            .as_ref()
            .map_or(0, |w| w.to.duration_since(w.from).as_secs()),
    );
    let recorded = record_removed(&ctx, &ns, &name, &outcome, summary.audit.as_deref(), now).await;
    crate::history::prune(&ctx, &policy, &recorded, now).await;
    if summary.deleted > 0 || summary.segments_deleted > 0 {
        ctx.event(
            &policy.object_ref(&()),
            EventType::Normal,
            "BackupRetention",
            &summary.note(),
        )
        .await;
    }
    let PassStatus {
        status: new,
        partly_failed,
    } = policy_status(
        &outcome,
        &status,
        generation,
        interval,
        now,
        Timestamp::now(),
    );
    if let Some(message) = &partly_failed {
        m.retention_failures
            .get_or_create(&labels)
            .inc_by(failures.len() as u64);
        ctx.warn(&policy.object_ref(&()), "RetentionPartlyFailed", message)
            .await;
    }
    crate::status::policy(&api, &name, &new).await?;
    if let Some(message) = partly_failed {
        return Err(Error::PartlyFailed(message));
    }
    Ok(Requeue::requeue(until(
        now,
        tidemark_core::saturating_add(now, interval),
    )))
}

/// What a pass leaves in its policy's status, and the message of what it could not do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PassStatus {
    pub status: BackupPolicyStatus,
    /// Some deletions or consolidations failed: the pass counts as not run.
    pub partly_failed: Option<String>,
}

/// The status a pass leaves: a pure function of its outcome, the status before it (of the
/// policy at `generation`), the pass's `now` and when the status is written (`written`,
/// the time of a condition that changes).
pub(crate) fn policy_status(
    outcome: &PassOutcome,
    status: &BackupPolicyStatus,
    generation: Option<i64>,
    interval: jiff::SignedDuration,
    now: Timestamp,
    written: Timestamp,
) -> PassStatus {
    let summary = PassSummary::of(outcome);
    let failures = outcome
        .executed
        .as_ref()
        .map_or(&[][..], |r| r.failures.as_slice());
    let next = tidemark_core::saturating_add(now, interval);
    // What it could not do fails the pass: reported, and retried with backoff — so the
    // pass is not recorded as run (observedGeneration and lastRetentionRunTime stay those
    // of the last whole pass).
    let partly_failed = (!failures.is_empty()).then(|| {
        let first = &failures[0];
        format!(
            "{} deletion(s) or consolidation(s) failed (retried with backoff): {}: {}{}; {}",
            failures.len(),
            first.key,
            first.error,
            if failures.len() > 1 { " …" } else { "" },
            summary.note()
        )
    });
    let (observed_generation, last, next) = if partly_failed.is_some() {
        (
            status.observed_generation,
            status.last_retention_run_time.clone(),
            None,
        )
    } else {
        (generation, Some(Time(now)), Some(Time(next)))
    };
    let new = BackupPolicyStatus {
        observed_generation,
        last_retention_run_time: last,
        next_retention_run_time: next,
        recovery_window: outcome.survey.plan.recovery_window.as_ref().map(|w| {
            RecoveryWindowStatus {
                start: Time(w.from),
                end: Time(w.to),
                gaps: w
                    .gaps
                    .iter()
                    .map(|g| GapStatus {
                        start: Time(g.from),
                        end: Time(g.to),
                    })
                    .collect(),
            }
        }),
        backups_kept: Some(summary.kept),
        backups_deleted: Some(summary.deleted),
        segments_deleted: Some(summary.segments_deleted),
        bytes_freed: Some(summary.bytes_freed),
        failures: Some(failures.len() as u64),
        conditions: vec![match &partly_failed {
            Some(message) => condition_at(
                &status.conditions,
                "Ready",
                false,
                "PassPartlyFailed",
                message,
                generation,
                written,
            ),
            None => condition_at(
                &status.conditions,
                "Ready",
                true,
                "PassSucceeded",
                &summary.note(),
                generation,
                written,
            ),
        }],
        restore_test: None,
        timelines: timeline_status(&outcome.survey.inventory),
        binlog_archive: None,
    };
    PassStatus {
        status: new,
        partly_failed,
    }
}

/// The archive's timelines for the policy's status; none while it has one.
pub(crate) fn timeline_status(inventory: &tidemark_core::Inventory) -> Vec<TimelineStatus> {
    /// Timelines a status shows at most: the newest (the object's size is bounded).
    const SHOWN: usize = 16;
    let all = tidemark_core::timeline::summaries(inventory);
    if all.len() < 2 {
        return Vec::new();
    }
    let skip = all.len().saturating_sub(SHOWN);
    all.into_iter()
        .skip(skip)
        .map(|t| TimelineStatus {
            id: t.id,
            server_id: t.server_id,
            parent: t.parent,
            switch_gtid: t.switch.as_ref().map(|s| s.gtid.to_string()),
            switched_at: t.switch.as_ref().and_then(|s| s.at).map(Time),
            missing: t
                .switch
                .as_ref()
                .map(|s| s.missing.iter().map(ToString::to_string).collect())
                .unwrap_or_default(),
            branch: t.branch,
            main_line: t.main_line,
            segments: t.segments as u64,
            last_event_at: t.last_event_at.map(Time),
        })
        .collect()
}

/// Records on each Backup object of `policy` whose data the pass deleted when, why and
/// under which audit record (`status.dataRemoved`): the object stays (a pass deletes data;
/// the object goes only by the history limit, see `history.rs`) and says so. A failure to record is logged; the data
/// is gone either way, and the next pass does not see it again. A backup that
/// consolidation merged names the synthetic full (`mergedInto`), and the one whose restore
/// point that full holds now follows it (`replacedBy`): when the full goes, so does the
/// replacement. Returns the objects it recorded whose data is gone for good (the watch
/// cache may not show them yet).
async fn record_removed(
    ctx: &Context,
    ns: &str,
    policy: &str,
    outcome: &PassOutcome,
    audit: Option<&str>,
    now: Timestamp,
) -> Vec<String> {
    let mut recorded = Vec::new();
    let Some(report) = outcome.executed.as_ref() else {
        return recorded;
    };
    let gone: HashSet<&str> = report.backups_deleted.iter().map(String::as_str).collect();
    if gone.is_empty() {
        return recorded;
    }
    let reasons: std::collections::HashMap<&str, Vec<String>> = outcome
        .survey
        .plan
        .deletions()
        .filter(|d| gone.contains(d.backup.id.as_str()))
        .map(|d| {
            (
                d.backup.id.as_str(),
                d.reasons.iter().map(ToString::to_string).collect(),
            )
        })
        .collect();
    // Consolidation (seed 002): each backup a synthetic full merged → that full, and
    // whether the full stands in for it (the chain's last), as the planner resolves it
    // (one this pass deletes too holds nothing any more: `mergedInto` only).
    // Who stands in is judged among the fulls that survive the pass (a second full that
    // also stood in takes over from one deleted now); a backup merged only into fulls
    // deleted now keeps `mergedInto`.
    let inventory = &outcome.survey.inventory;
    let surviving = tidemark_core::Inventory {
        backups: inventory
            .backups
            .iter()
            .filter(|b| !gone.contains(b.id.as_str()))
            .cloned()
            .collect(),
        ..Default::default()
    };
    let stored = |b: &tidemark_core::Backup| StoredBackup {
        backup_name: b.name.clone(),
        backup_id: b.id.clone(),
    };
    let mut merged: std::collections::HashMap<String, (StoredBackup, bool)> =
        tidemark_core::merged_into(inventory)
            .into_iter()
            .map(|(m, into)| (m.to_owned(), (stored(into.full), false)))
            .collect();
    for (m, into) in tidemark_core::merged_into(&surviving) {
        merged.insert(m.to_owned(), (stored(into.full), into.stands_in));
    }
    let api: Api<tidemark_api::crd::Backup> = Api::namespaced(ctx.client.clone(), ns);
    for b in ctx.backups.state() {
        let Some(status) = b.status.as_ref() else {
            continue;
        };
        // An object whose restore point a synthetic full holds follows that full.
        let previous = status.data_removed.as_ref();
        let followed = match previous {
            None => status.backup_id.as_deref(),
            Some(r) => r.replaced_by.as_ref().map(|s| s.backup_id.as_str()),
        };
        let Some(id) = followed else {
            continue;
        };
        if b.namespace().as_deref() != Some(ns)
            || b.spec.template.policy.name != policy
            || !gone.contains(id)
            || b.meta().deletion_timestamp.is_some()
        {
            continue;
        }
        let (merged_into, replaced_by) = match (previous, merged.get(id)) {
            (None, Some((into, stands_in))) => {
                (Some(into.clone()), stands_in.then(|| into.clone()))
            }
            (None, None) => (None, None),
            (Some(p), _) => (p.merged_into.clone(), None),
        };
        let removed = DataRemoved {
            at: Time(now),
            reasons: reasons.get(id).cloned().unwrap_or_default(),
            audit_record: audit.map(str::to_owned),
            merged_into,
            replaced_by: replaced_by.clone(),
        };
        let mut value = serde_json::to_value(&removed).unwrap_or_default();
        // A merge patch keeps what it does not name: every field is named, so a second
        // removal (the synthetic full that stood in, deleted later) leaves none of the
        // first's reasons, audit record or replacement behind.
        value["reasons"] = json!(removed.reasons);
        value["auditRecord"] = json!(removed.audit_record);
        value["mergedInto"] = json!(removed.merged_into);
        value["replacedBy"] = json!(removed.replaced_by);
        match crate::status::merge(
            &api,
            &b.name_any(),
            crate::status::DATA_REMOVED_MANAGER,
            json!({ "dataRemoved": value }),
        )
        .await
        {
            Ok(_) if replaced_by.is_none() => recorded.push(b.name_any()),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(backup = %b.name_any(), "could not record that its data was removed: {e}");
            }
        }
    }
    recorded
}

/// The Job runner of `policy`'s consolidations, when its database image is known.
async fn consolidator(
    ctx: &Context,
    policy: &BackupPolicy,
) -> Option<crate::consolidation::JobConsolidator> {
    let ns = policy.namespace().unwrap_or_default();
    if !ctx.capabilities.jobs {
        // The chains stay as they are (the pass keeps what they need).
        let note = crate::rbac::refused("retention.consolidate", "jobs");
        ctx.warn(&policy.object_ref(&()), "ConsolidationRefused", &note)
            .await;
        return None;
    }
    let database = match crate::database::database_runtime(ctx, policy).await {
        Ok(db) => db,
        Err(e) => {
            tracing::warn!(policy = %policy.name_any(), "consolidation waits: {e}");
            return None;
        }
    };
    let store_secret = crate::stores::policy_secret_keys(&ctx.client, policy)
        .await
        .ok()
        .flatten();
    Some(crate::consolidation::JobConsolidator {
        jobs: Api::namespaced(ctx.client.clone(), &ns),
        policy: policy.clone(),
        database,
        operator_image: ctx.image.clone(),
        store_secret,
    })
}

/// What a pass did, for status and the event.
struct PassSummary {
    kept: u64,
    deleted: u64,
    deleted_ids: Vec<String>,
    segments_deleted: u64,
    bytes_freed: u64,
    audit: Option<String>,
}

impl PassSummary {
    fn of(outcome: &PassOutcome) -> Self {
        let plan = &outcome.survey.plan;
        let report = outcome.executed.as_ref();
        let gone: HashSet<&str> = report
            .map(|r| r.backups_deleted.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let backup_bytes: u64 = plan
            .deletions()
            .filter(|d| gone.contains(d.backup.id.as_str()))
            .map(|d| d.backup.size)
            .sum();
        let segments_deleted = report.map_or(0, |r| r.segments_deleted as u64);
        let segment_bytes: u64 = if segments_deleted > 0 {
            let deleted: HashSet<&str> = plan
                .segments
                .delete
                .iter()
                .map(|d| d.name.as_str())
                .collect();
            outcome
                .survey
                .inventory
                .segments
                .iter()
                .filter(|s| deleted.contains(s.name.as_str()))
                .map(|s| s.size)
                .sum()
        } else {
            0
        };
        PassSummary {
            kept: plan
                .backups
                .iter()
                .filter(|d| d.action != Action::Delete)
                .count() as u64,
            deleted: gone.len() as u64,
            deleted_ids: gone.iter().map(|s| (*s).to_owned()).collect(),
            segments_deleted,
            bytes_freed: backup_bytes + segment_bytes,
            audit: report.and_then(|r| r.audit_key.clone()),
        }
    }

    fn note(&self) -> String {
        let mut ids = self.deleted_ids.clone();
        ids.sort();
        format!(
            "kept {} backup(s); deleted {} backup(s){}, {} binlog segment(s), {} bytes freed{}",
            self.kept,
            self.deleted,
            if ids.is_empty() {
                String::new()
            } else {
                format!(" ({})", ids.join(", "))
            },
            self.segments_deleted,
            self.bytes_freed,
            self.audit
                .as_deref()
                .map(|a| format!("; audit record {a}"))
                .unwrap_or_default()
        )
    }
}

/// A bounded reason for a failed pass: the error's class.
fn reason(e: &Error) -> &'static str {
    if matches!(
        e,
        Error::Engine(tidemark_engine::EngineError::Unverified { .. })
    ) {
        return "NewestBackupUnverified";
    }
    if tidemark_store::error::access_denied(e) {
        // Not an outage: the credentials (or the bucket's policy) need a person.
        return "StoreAccessDenied";
    }
    match e.class() {
        tidemark_engine::Class::Input => "InvalidSpec",
        tidemark_engine::Class::Store => "StoreUnavailable",
        tidemark_engine::Class::Data => "StoreDataBlocksPass",
        tidemark_engine::Class::Contention => "Waiting",
        _ => "PassFailed",
    }
}

/// The `Ready=False` message of a pass that failed with `e`: the error's causes, then which
/// consecutive failure of the policy this is and when it is retried.
fn failed_message(ctx: &Context, policy: &BackupPolicy, e: &Error) -> String {
    let failures = ctx.failures_of(&crate::context::key(policy)) + 1;
    e.with_retry_note(&tidemark_engine::error::chain(e), failures)
}

/// Records a failed pass in status (`Ready=False`), keeping what the last good pass
/// found. `attempted`: when a pass was tried, so the next one is throttled too.
async fn set_failed(
    api: &Api<BackupPolicy>,
    policy: &BackupPolicy,
    reason: &str,
    message: &str,
    attempted: Option<Timestamp>,
) -> Result<(), Error> {
    let previous = policy.status.clone().unwrap_or_default();
    let status = failed_status(
        &previous,
        policy.meta().generation,
        reason,
        message,
        Timestamp::now(),
    );
    let _ = attempted;
    crate::status::policy(api, &policy.name_any(), &status).await
}

/// The status a failed pass leaves: what the last good pass found, and `Ready=False` with
/// `reason` and `message` (pure). observedGeneration moves only with a pass that
/// succeeded: after a spec change, a failed pass is retried (by backoff), not held back by
/// retentionInterval.
pub(crate) fn failed_status(
    previous: &BackupPolicyStatus,
    generation: Option<i64>,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> BackupPolicyStatus {
    let mut status = previous.clone();
    status.conditions = vec![condition_at(
        &previous.conditions,
        "Ready",
        false,
        reason,
        message,
        generation,
        now,
    )];
    status
}

/// Where a queued pass stands, between [`set_queued`] and the pass's start.
const PENDING: u8 = 0;
const QUEUED: u8 = 1;
const STARTED: u8 = 2;

/// Says in status that `policy`'s pass waits for its turn: the condition
/// [`crate::status::QUEUED_CONDITION`], under its own field manager (so no other status
/// write of the operator, from whatever it read, drops it or brings it back), removed when
/// the turn comes. A failure to say so is logged: the pass is queued either way.
async fn set_queued(
    ctx: &Context,
    api: &Api<BackupPolicy>,
    policy: &BackupPolicy,
    queue: &std::sync::atomic::AtomicU8,
) {
    use std::sync::atomic::Ordering;
    if queue.load(Ordering::Acquire) != PENDING {
        return;
    }
    let previous = policy
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let message = format!(
        "the retention pass is due and waits for its turn: at most {} passes run at once (tidemark operator --background-passes); {} wait",
        ctx.background.limit(),
        ctx.background.queued()
    );
    let queued = condition(
        &previous,
        crate::status::QUEUED_CONDITION,
        true,
        "WaitingForTurn",
        &message,
        policy.meta().generation,
    );
    let name = policy.name_any();
    let written = crate::status::apply(
        api,
        &name,
        crate::status::QUEUE_MANAGER,
        serde_json::json!({ "conditions": [queued] }),
    )
    .await;
    if let Err(e) = &written {
        tracing::warn!(policy = %name, error = %e, "could not say the pass is queued");
    }
    // The turn came while this was written: take it back.
    if queue
        .compare_exchange(PENDING, QUEUED, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        unqueue(api, &name).await;
    }
}

/// Removes the `Queued` condition (an empty apply of its manager).
async fn unqueue(api: &Api<BackupPolicy>, name: &str) {
    if let Err(e) = crate::status::apply(
        api,
        name,
        crate::status::QUEUE_MANAGER,
        serde_json::json!({}),
    )
    .await
    {
        tracing::warn!(policy = %name, error = %e, "could not clear the Queued condition");
    }
}

/// Requeue after `d`, or sooner when the restore tests want to be looked at (`wake`).
fn sooner(d: Duration, wake: Option<Duration>) -> Requeue {
    Requeue::requeue(wake.map_or(d, |w| w.min(d)))
}

fn until(now: Timestamp, at: Timestamp) -> Duration {
    Duration::try_from(at.duration_since(now))
        .unwrap_or(Duration::ZERO)
        .clamp(Duration::from_secs(1), Duration::from_secs(24 * 3600))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tidemark_core::gtid::{GtidPos, GtidRun};
    use tidemark_core::{Inventory, Segment, SegmentGtids, Switch, Timeline};

    fn seg(seq: u64, name: &str, server: u32, start: &str, runs: &str, last: &str) -> Segment {
        let t: Timestamp = last.parse().unwrap();
        let mut s = Segment::new(name, seq, Some(t), Some(t), 1);
        s.gtids = Some(Box::new(SegmentGtids {
            server_id: server,
            start: GtidPos::parse(start).unwrap(),
            runs: runs
                .split(", ")
                .map(|r| GtidRun::parse(r).unwrap())
                .collect(),
        }));
        s
    }

    #[test]
    fn status_names_each_switch_and_what_it_lost() {
        let mut inv = Inventory {
            segments: vec![seg(
                1,
                "mysql-bin.000001",
                1,
                "",
                "0-1-1..12",
                "2026-11-27T10:00:00Z",
            )],
            ..Default::default()
        };
        assert!(
            timeline_status(&inv).is_empty(),
            "one timeline: nothing to show"
        );
        inv.segments.push(seg(
            1_000_000_000_001,
            "mysql-bin.1000000000001",
            2,
            "",
            "0-1-1..10, 0-2-11..20",
            "2026-11-27T11:00:00Z",
        ));
        inv.timelines = vec![
            Timeline {
                server_id: Some(1),
                ..Timeline::legacy()
            },
            Timeline {
                id: 1,
                server_id: Some(2),
                parent: Some(0),
                first_sequence: Some(1_000_000_000_001),
                switch: Some(Switch {
                    gtid: GtidPos::parse("0-1-10").unwrap(),
                    at: Some("2026-11-27T09:59:00Z".parse().unwrap()),
                    parent_sequence: Some(1),
                    missing: Vec::new(),
                    unrelated: false,
                }),
                created_at: None,
            },
        ];
        let status = timeline_status(&inv);
        assert_eq!(status.len(), 2);
        let t1 = &status[1];
        assert_eq!(
            (t1.id, t1.server_id, t1.parent, t1.switch_gtid.as_deref()),
            (1, Some(2), Some(0), Some("0-1-10"))
        );
        assert_eq!(t1.branch, ["0-1-11..12"]);
        assert!(t1.main_line && status[0].main_line);
    }
}

#[cfg(test)]
mod status_tests {
    #![allow(clippy::unwrap_used)]
    use jiff::{SignedDuration, Timestamp};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use tidemark_api::crd::BackupPolicyStatus;
    use tidemark_engine::{PassOutcome, PassRequest};
    use tidemark_store::executor::{DeleteFailure, ExecutionReport};
    use tidemark_store::synth;

    use super::{PassStatus, failed_status, policy_status};

    fn at(hours: i64) -> Timestamp {
        Timestamp::from_second(1_795_000_000).unwrap() + SignedDuration::from_hours(hours)
    }

    /// A real pass's plan over two backups, keep one; `executed` as each case says.
    async fn outcome(executed: Option<ExecutionReport>) -> (PassOutcome, String, String) {
        let (_dir, store) = tidemark_store::testkit::local_store("c");
        let (old, new) = synth::older_and_newer(&store, "old", "new", at(10))
            .await
            .unwrap();
        let policy = tidemark_core::PolicyInput {
            keep_last: Some(1),
            ..Default::default()
        }
        .validate()
        .unwrap();
        let request = PassRequest {
            policy,
            policy_as_given: serde_json::json!({"keepLast": 1}),
            now: at(10),
            started_at: at(10),
            protect: Default::default(),
            execute: false,
            ignore_malformed: false,
            hooks: None,
        };
        let mut o = tidemark_engine::retention_pass(
            &store,
            &request,
            None,
            None,
            &tidemark_store::NoProgress,
        )
        .await
        .unwrap();
        o.executed = executed;
        (o, old.id, new.id)
    }

    fn previous() -> BackupPolicyStatus {
        let mut p = BackupPolicyStatus {
            observed_generation: Some(3),
            last_retention_run_time: Some(Time(at(9))),
            next_retention_run_time: Some(Time(at(10))),
            ..Default::default()
        };
        p.conditions = vec![crate::status::condition_at(
            &[],
            "Ready",
            true,
            "PassSucceeded",
            "earlier",
            Some(3),
            at(1),
        )];
        p
    }

    /// The status of a pass, as a table: what moves and what stays, by outcome.
    #[tokio::test]
    async fn a_pass_status_is_a_function_of_its_outcome_the_previous_status_and_now() {
        let interval = SignedDuration::from_hours(1);
        let now = at(10);
        let (whole, old, _) = outcome(None).await;
        let deleted = ExecutionReport {
            audit_key: Some("c/_audit/a.json".into()),
            backups_deleted: vec![old.clone()],
            objects_deleted: 2,
            ..Default::default()
        };
        let (done, _, _) = outcome(Some(deleted.clone())).await;
        let partly = ExecutionReport {
            failures: vec![DeleteFailure {
                key: "c/old/x".into(),
                error: "503".into(),
            }],
            ..deleted
        };
        let (failed, _, _) = outcome(Some(partly)).await;
        struct Case<'a> {
            name: &'a str,
            outcome: &'a PassOutcome,
            ready: (&'a str, &'a str),
            observed: Option<i64>,
            last: Option<Timestamp>,
            next: Option<Timestamp>,
            since: Timestamp,
            deleted: u64,
            partly: bool,
        }
        let cases = [
            Case {
                name: "a plan that deleted nothing",
                outcome: &whole,
                ready: ("True", "PassSucceeded"),
                observed: Some(4),
                last: Some(now),
                next: Some(at(11)),
                since: at(1),
                deleted: 0,
                partly: false,
            },
            Case {
                name: "a pass that deleted",
                outcome: &done,
                ready: ("True", "PassSucceeded"),
                observed: Some(4),
                last: Some(now),
                next: Some(at(11)),
                since: at(1),
                deleted: 1,
                partly: false,
            },
            Case {
                name: "a pass that partly failed counts as not run",
                outcome: &failed,
                ready: ("False", "PassPartlyFailed"),
                observed: Some(3),
                last: Some(at(9)),
                next: None,
                since: now,
                deleted: 1,
                partly: true,
            },
        ];
        for c in cases {
            let PassStatus {
                status,
                partly_failed,
            } = policy_status(c.outcome, &previous(), Some(4), interval, now, now);
            let ready = &status.conditions[0];
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                c.ready,
                "{}",
                c.name
            );
            assert_eq!(ready.last_transition_time.0, c.since, "{}", c.name);
            assert_eq!(status.observed_generation, c.observed, "{}", c.name);
            assert_eq!(
                status.last_retention_run_time.as_ref().map(|t| t.0),
                c.last,
                "{}",
                c.name
            );
            assert_eq!(
                status.next_retention_run_time.as_ref().map(|t| t.0),
                c.next,
                "{}",
                c.name
            );
            assert_eq!(status.backups_deleted, Some(c.deleted), "{}", c.name);
            assert_eq!(status.backups_kept, Some(1), "{}", c.name);
            assert_eq!(partly_failed.is_some(), c.partly, "{}", c.name);
            if let Some(m) = &partly_failed {
                assert!(m.contains("c/old/x: 503"), "{m}");
                assert_eq!(&ready.message, m);
            }
            // Deterministic: the same inputs give the same patch.
            assert_eq!(
                policy_status(c.outcome, &previous(), Some(4), interval, now, now).status,
                status
            );
        }
        let _ = old;
    }

    #[test]
    fn a_failed_pass_keeps_what_the_last_good_one_found() {
        let before = previous();
        let after = failed_status(&before, Some(4), "Waiting", "held by x", at(10));
        assert_eq!(after.observed_generation, Some(3));
        assert_eq!(
            after.last_retention_run_time,
            before.last_retention_run_time
        );
        let c = &after.conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Waiting"));
        assert_eq!(c.observed_generation, Some(4));
        assert_eq!(c.last_transition_time.0, at(10));
        // Still failing later: the transition stays where it was.
        let again = failed_status(&after, Some(4), "Waiting", "held by y", at(11));
        assert_eq!(again.conditions[0].last_transition_time.0, at(10));
        assert_eq!(again.conditions[0].message, "held by y");
    }
}
