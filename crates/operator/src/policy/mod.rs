//! The BackupPolicy controller: the engine's retention pass — the one `tidemark gc` and
//! `tidemark run` make — throttled to `spec.retentionInterval`, with its outcome in the
//! policy's status and a `BackupRetention` event when it deleted something.
//!
//! The store is the source of truth (DESIGN.md §1): the pass reads `metadata.json` and
//! `_index.json`, never the Backup objects, except for holds — a Backup annotated
//! `tidemark.io/protect: "true"` keeps its backup-id whatever the rules say.
//!
//! A reconcile is a pipeline of steps (after Stackable's operators). Each step that can
//! fail has its own [`StepError`] variant, and so its own `Ready` reason; the pure ones are
//! tested with tables:
//!
//! 1. **validate** ([`validate`], pure): the spec into the planner's rules and intervals;
//! 2. **due** ([`not_due_until`], pure): a whole pass of this generation ran less than
//!    `retentionInterval` ago;
//! 3. **gate** ([`primary_verdict`], pure over the listed pods): seed 000's established
//!    primary — while there is none, nothing may expire;
//! 4. **dereference** ([`dereference`]): what the policy names — its store (through its
//!    Secret), the protected Backups, the consolidation Job runner;
//! 5. **build** ([`build`], pure): the engine's [`PassRequest`];
//! 6. **apply** ([`apply`]): the engine's pass under the store's lease, with what the
//!    Restores use read once the lease is held;
//! 7. **status** ([`status::policy_status`], pure) and its report: metrics, the event, the
//!    Backup objects whose data went.
//!
//! Steps 4–7 run in the background (`crate::background`), never holding a reconcile slot;
//! the reconcile after them collects the outcome. Every failure is reported in one place,
//! [`fail`].

mod removed;
mod status;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::{BackupPolicy, BackupPolicyStatus};
use tidemark_api::policy::RetentionSpec;
use tidemark_engine::{DeleteHooks, PassOutcome, PassRequest, unattended_pass};
use tidemark_store::ClusterStore;

use crate::context::Context;
use crate::error::Error;
use crate::status::condition;

use status::{PassStatus, PassSummary, failed_status, policy_status};

/// Why a step of a policy's reconcile failed: one variant per step.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StepError {
    /// validate: the spec (or the policy's name) is invalid; nothing happens until it
    /// changes.
    #[error("{0}")]
    Validate(String),
    /// dereference: what the policy names could not be read (its store's Secret, the
    /// store).
    #[error(transparent)]
    Dereference(Error),
    /// apply: the pass failed (the store, its data, its lease, `requireVerified`).
    #[error(transparent)]
    Apply(Error),
    /// status: the pass ran, but some of its deletions or consolidations failed; it counts
    /// as not run.
    #[error("{0}")]
    PartlyFailed(String),
    /// status: the pass's status could not be written.
    #[error(transparent)]
    Status(Error),
}

impl StepError {
    /// The bounded `Ready=False` reason of this failure: the step's, or for an error of the
    /// store or the engine, its class.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            StepError::Validate(_) => "InvalidSpec",
            StepError::PartlyFailed(_) => "PassPartlyFailed",
            StepError::Dereference(e) | StepError::Apply(e) | StepError::Status(e) => {
                error_reason(e)
            }
        }
    }
}

impl From<StepError> for Error {
    fn from(e: StepError) -> Self {
        match e {
            StepError::Validate(m) => Error::Invalid(m),
            StepError::PartlyFailed(m) => Error::PartlyFailed(m),
            StepError::Dereference(e) | StepError::Apply(e) | StepError::Status(e) => e,
        }
    }
}

/// A store's or the engine's error as a bounded reason: its class.
fn error_reason(e: &Error) -> &'static str {
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

/// How often a policy's binlog archiver is looked after while its retention pass runs
/// (at every reconcile otherwise).
const ARCHIVER_WHILE_PASS: Duration = Duration::from_secs(10);

/// The binlog archiver's Deployment ([`crate::archiver::reconcile`]); its trouble is its
/// own (a warning and an Event): retention goes on.
async fn archiver(ctx: &Context, policy: &BackupPolicy) {
    if let Err(e) = crate::archiver::reconcile(ctx, policy).await {
        let message = format!("binlog archiver: {e}");
        tracing::warn!(policy = %policy.name_any(), "{message}");
        ctx.warn(&policy.object_ref(&()), "BinlogArchiverFailed", &message)
            .await;
    }
}

/// Runs the policy's retention pass when it is due.
///
/// # Guarantees
/// Deletes only what the engine's pass plans, under the store's lease ([`unattended_pass`]);
/// and finished consolidation Jobs; never a Backup object (seed 000: its ScheduledBackup
/// prunes those, `history::prune`).
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
    let key = crate::context::key(policy.as_ref());
    // The binlog archiver (a Deployment) first, before anything that reads the store, and
    // whatever the retention pass is doing: a failover while a long pass runs, or while
    // the store is cut off, must reach it, or it refuses the new primary's timeline and
    // the recovery window stops at the failover (a run of the short chaos soak). While a
    // pass runs, at most every [`ARCHIVER_WHILE_PASS`] (it asks the primary pod its server
    // id).
    if !ctx.background.tracks(&key) || ctx.archiver_due(&key, ARCHIVER_WHILE_PASS) {
        archiver(&ctx, &policy).await;
    }
    // Restore tests (their own Jobs and status), the binlog archive's lag and verification:
    // looked after
    // whatever the retention pass is doing, and never in its way.
    let wake = crate::restoretest::reconcile(&ctx, &policy).await;
    let wake = [
        crate::archivewatch::check(&ctx, &policy).await,
        crate::verification::reconcile(&ctx, &policy).await,
        crate::copies::reconcile(&ctx, &policy).await,
    ]
    .into_iter()
    .fold(wake, |a, b| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    });
    // A pass in the background: wait for it; once it ended, its failure goes to the
    // backoff, and after a success the policy is looked at afresh (its status now holds
    // the pass; the spec may have changed meanwhile and be due at once).
    let policy = match ctx.background.poll(&key) {
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
    ctx.warn_ambiguous(&policy.object_ref(&()), &policy.spec.ambiguous_durations())
        .await;
    // Its series exist from now on: the first failure is an increase, and an alert on a
    // promise waits until the policy is as old as it.
    let labels = crate::metrics::Metrics::policy(&ns, &name);
    ctx.metrics.policy_seen(&labels);
    if let Some(created) = policy.meta().creation_timestamp.as_ref() {
        ctx.metrics
            .policy_created
            .get_or_create(&labels)
            .set(created.0.as_second());
    }
    let Some(retention) = policy.spec.retention.as_ref() else {
        return Ok(wake.map_or_else(Requeue::await_change, Requeue::requeue));
    };
    let now = ctx.clock.now();
    // 1. validate
    let valid = match validate(&policy, retention) {
        Ok(v) => v,
        Err(e) => return Err(fail(&ctx, &api, &policy, e).await),
    };
    // 2. due
    let status = policy.status.clone().unwrap_or_default();
    // A status written before `appliedRetention` existed (an upgrade): the last whole pass
    // was of this very generation, so it applied the spec's retention — recorded now, not
    // at the next pass an interval away, so that the first edit is previewed too.
    if status.applied_retention.is_none()
        && status.last_retention_run_time.is_some()
        && status.observed_generation.is_some()
        && status.observed_generation == policy.meta().generation
    {
        // That one field (merged): the status as this reconcile read it may be stale.
        let value = serde_json::json!({ "appliedRetention": policy.spec.retention });
        if let Err(e) = crate::status::merge(&api, &name, crate::status::FIELD_MANAGER, value).await
        {
            tracing::warn!(policy = %name, error = %e, "the applied retention could not be recorded");
        }
    }
    if let Some(due) = not_due_until(&status, policy.meta().generation, valid.interval, now) {
        return Ok(sooner(until(now, due), wake));
    }
    // 3. gate. A store-only policy (no source) has no pods to look at.
    if let (Some(source), Some(ready_for)) = (&policy.spec.source, valid.primary_ready_for) {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        let selector = crate::names::selector(&source.selector)?;
        let listed = crate::lean::list(
            &pods,
            &kube::api::ListParams::default().labels(&selector),
            crate::lean::meta_of,
        )
        .await?;
        let label = source
            .role_label
            .as_deref()
            .unwrap_or(crate::names::DEFAULT_ROLE_LABEL);
        if let Some(waiting) = primary_verdict(&listed, label, &selector, ready_for, now) {
            // Recorded in the store first (seed 000, for deleters with only the store),
            // when it is news: a failure is retried before the condition says so.
            let said = policy
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| {
                    c.reason == "NoEstablishedPrimary" && c.message == waiting.message
                });
            if !said {
                record_gate(&ctx, &policy, &waiting.message).await?;
            }
            ctx.warn(
                &policy.object_ref(&()),
                "NoEstablishedPrimary",
                &waiting.message,
            )
            .await;
            set_failed(&api, &policy, "NoEstablishedPrimary", &waiting.message).await?;
            return Ok(sooner(waiting.recheck, wake));
        }
    }
    // 4–7 in the background: its hooks and consolidations can take long.
    let queue = Arc::new(std::sync::atomic::AtomicU8::new(PENDING));
    let work = {
        let (queue, api, name) = (queue.clone(), api.clone(), name.clone());
        let work = pass(ctx.clone(), policy.clone(), valid, now);
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

/// Seed 000's gate closed, recorded in the store under its lease with the holds in force
/// (`_state/holds.json`): every retention pass, from whichever deleter, deletes nothing
/// until the operator finds an established primary again (its next pass records that).
///
/// # Errors
/// The store, its lease or the API failed.
async fn record_gate(ctx: &Context, policy: &BackupPolicy, message: &str) -> Result<(), Error> {
    let (ns, name) = (policy.namespace().unwrap_or_default(), policy.name_any());
    let store = crate::stores::open(ctx, policy).await?;
    let protect = crate::holds::holds(ctx, &ns, &name);
    crate::holds::save_under_lease(
        ctx,
        &store,
        (&ns, &name),
        protect,
        tidemark_store::state::Gate::Closed(message),
    )
    .await
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

/// A policy's spec, validated: what its passes are built from.
#[derive(Debug, Clone)]
pub(crate) struct Validated {
    /// The planner's rules.
    pub rules: tidemark_core::Policy,
    /// `spec.retention` as the user wrote it, for the audit record.
    pub as_given: serde_json::Value,
    /// `spec.retentionInterval`.
    pub interval: SignedDuration,
    /// `spec.source.primaryReadyFor`, when the policy has a source.
    pub primary_ready_for: Option<SignedDuration>,
    /// `tidemark.io/allow-deletions-before`: the deletion guard's acknowledgement.
    pub deletions_allowed_before: Option<Timestamp>,
}

/// Step 1 (pure): `policy`'s name and spec, with its `retention`, into the rules and
/// intervals of its passes.
///
/// # Errors
/// [`StepError::Validate`], naming the field and the accepted form.
pub(crate) fn validate(
    policy: &BackupPolicy,
    retention: &RetentionSpec,
) -> Result<Validated, StepError> {
    let spec = &policy.spec;
    let invalid = |e: tidemark_api::policy::PolicyFileError| StepError::Validate(e.to_string());
    tidemark_api::names::label_value_name("metadata.name", &policy.name_any())
        .map_err(tidemark_api::policy::PolicyFileError::from)
        .map_err(invalid)?;
    spec.validate().map_err(invalid)?;
    let interval = spec.retention_interval().map_err(invalid)?;
    let primary_ready_for = spec
        .source
        .as_ref()
        .map(tidemark_api::policy::SourceSpec::primary_ready_for)
        .transpose()
        .map_err(invalid)?;
    let mut rules = retention
        .to_input(spec.time_zone.as_deref())
        .validate()
        .map_err(|e| StepError::Validate(format!("spec.retention: {e}")))?;
    rules.branches_acknowledged = tidemark_api::policy::branches_acknowledged(policy.annotations())
        .map_err(StepError::Validate)?;
    let deletions_allowed_before =
        tidemark_api::policy::deletions_allowed_before(policy.annotations())
            .map_err(StepError::Validate)?;
    Ok(Validated {
        rules,
        as_given: serde_json::to_value(retention).unwrap_or_default(),
        interval,
        primary_ready_for,
        deletions_allowed_before,
    })
}

/// Step 2 (pure): when the next pass is due, while it is not yet — `interval` after the
/// last whole pass, if that pass was of the spec's current `generation` (a changed spec is
/// due at once).
pub(crate) fn not_due_until(
    status: &BackupPolicyStatus,
    generation: Option<i64>,
    interval: SignedDuration,
    now: Timestamp,
) -> Option<Timestamp> {
    let last = status.last_retention_run_time.as_ref()?.0;
    if status.observed_generation != generation {
        return None;
    }
    let due = tidemark_core::saturating_add(last, interval);
    (due > now).then_some(due)
}

/// Why a pass waits for the cluster, and when to look again.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Waiting {
    pub message: String,
    pub recheck: Duration,
}

/// Step 3 (pure): why the cluster has no established primary (and when to look again), or
/// `None` when it has one: exactly one of the selected `pods` labelled `label=primary` —
/// or, when no selected pod carries the label, the only selected pod — Running and Ready
/// for at least `ready_for`. Pods being deleted do not count. `selector` is for the
/// message.
pub(crate) fn primary_verdict(
    pods: &[Pod],
    label: &str,
    selector: &str,
    ready_for: SignedDuration,
    now: Timestamp,
) -> Option<Waiting> {
    let again = Duration::from_secs(30);
    let waiting = |message: String| {
        Some(Waiting {
            message,
            recheck: again,
        })
    };
    let live: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let labelled: Vec<&Pod> = live
        .iter()
        .copied()
        .filter(|p| p.labels().get(label).is_some_and(|r| r == "primary"))
        .collect();
    let unlabelled = live.iter().all(|p| !p.labels().contains_key(label));
    let primary = match (labelled.as_slice(), unlabelled, live.as_slice()) {
        ([one], _, _) => *one,
        ([], true, [only]) => *only,
        ([], _, []) => {
            return waiting(format!(
                "no established primary: no pod matches spec.source.selector ({selector}); retention deletes nothing until one has been Running and Ready for {ready_for:#}"
            ));
        }
        ([], _, _) => {
            return waiting(format!(
                "no established primary: no pod matching spec.source.selector is labelled {label}=primary; retention deletes nothing until one has been Running and Ready for {ready_for:#}"
            ));
        }
        (many, _, _) => {
            let mut names: Vec<String> = many.iter().map(|p| p.name_any()).collect();
            names.sort();
            return waiting(format!(
                "no established primary: {} pods are labelled {label}=primary ({}); retention deletes nothing until there is one",
                names.len(),
                names.join(", ")
            ));
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
            (established > now).then(|| Waiting {
                message: format!(
                    "no established primary yet: pod {name} has been Ready since {since}; retention deletes once it has been for {ready_for:#} (spec.source.primaryReadyFor), at {established}"
                ),
                recheck: until(now, established).max(Duration::from_secs(1)),
            })
        }
        _ => waiting(format!(
            "no established primary: pod {name} is not Running and Ready; retention deletes nothing until it has been for {ready_for:#}"
        )),
    }
}

/// What a policy names, read.
struct Dereferenced {
    store: ClusterStore,
    /// Backup ids held by protected Backup objects.
    protect: HashSet<String>,
    /// The Job runner of its consolidations, when it consolidates and can.
    consolidator: Option<crate::consolidation::JobConsolidator>,
}

/// Step 4: opens `policy`'s store (through its Secret), reads its holds and, when it
/// consolidates, its consolidation Job runner.
///
/// # Errors
/// [`StepError::Dereference`]: the Secret is missing or the store cannot be opened.
async fn dereference(
    ctx: &Context,
    policy: &BackupPolicy,
    consolidate: bool,
) -> Result<Dereferenced, StepError> {
    let store = crate::stores::open(ctx, policy)
        .await
        .map_err(StepError::Dereference)?;
    let (ns, name) = (policy.namespace().unwrap_or_default(), policy.name_any());
    let protect = crate::holds::holds(ctx, &ns, &name);
    // Consolidations run as Jobs in the database image (seed 002).
    let consolidator = if consolidate {
        consolidator(ctx, policy).await
    } else {
        None
    };
    Ok(Dereferenced {
        store,
        protect,
        consolidator,
    })
}

/// Step 5 (pure): the engine's request for a pass at `now` that executes its plan.
pub(crate) fn build(
    valid: &Validated,
    protect: HashSet<String>,
    hooks: Option<Arc<dyn DeleteHooks>>,
    now: Timestamp,
) -> PassRequest {
    PassRequest {
        policy: valid.rules.clone(),
        policy_as_given: valid.as_given.clone(),
        now,
        started_at: now,
        protect,
        // Read under the store's lease (step 6).
        restores: Vec::new(),
        execute: true,
        ignore_malformed: false,
        // A policy with a source passed the gate itself (step 3); a store-only one obeys
        // the gate another policy of the store recorded.
        override_primary_gate: valid.primary_ready_for.is_some(),
        hooks,
        recorded_hooks: tidemark_engine::RecordedHooks::RunByCaller,
        allow_deletions_before: valid.deletions_allowed_before,
        compare_with: None,
    }
}

/// Step 6: the engine's pass over `store`, under the store's lease — no other leader,
/// policy or `tidemark run` deletes from the store meanwhile, and a lost lease stops it.
/// The restores' holds are read once the lease is held: a Restore plans under the same
/// lease, so what it chose is in its status by then.
///
/// # Errors
/// [`StepError::Apply`]: the lease is held or lost, the Restores cannot be read, the store
/// failed, its data blocks the pass, or `requireVerified` refused.
async fn apply(
    ctx: &Context,
    store: &ClusterStore,
    request: &mut PassRequest,
    (ns, policy): (&str, &str),
    consolidator: Option<&crate::consolidation::JobConsolidator>,
    copies: &[tidemark_api::policy::CopySpec],
) -> Result<PassOutcome, StepError> {
    let fence = crate::fence::acquire(ctx, store)
        .await
        .map_err(StepError::Apply)?;
    let outcome = async {
        request.restores = crate::holds::read_restore_holds(ctx, ns, policy)
            .await
            .map_err(StepError::Apply)?;
        // Recorded in the store, under the lease (a pass that lost it writes nothing), for
        // every deleter that has only the store (seed 000): its holds, and the DeleteHooks
        // that select Backups in its namespace (names, actions and selectors only: a
        // deleter without the cluster refuses what they select). A failure fails the pass.
        let recorded = crate::hooks::recorded(ctx, ns)
            .await
            .map_err(StepError::Apply)?;
        let writer = format!("tidemark-operator {ns}/{policy}");
        let gate_is_ours = tidemark_store::state::load_holds(store)
            .await
            .ok()
            .flatten()
            .is_some_and(|h| h.writer == writer);
        // The policy's copies as the store records them, under the lease: a copy named
        // and never sent to is declared (this pass already keeps what it has not
        // received), a copy no longer named is forgotten (nothing is kept for it).
        fence
            .guard(reconcile_copies(store, copies, ctx.clock.now()))
            .await
            .map_err(StepError::Apply)?;
        fence
            .guard(async {
                tidemark_store::state::save_holds(
                    store,
                    &writer,
                    &request.protect,
                    &request.restores,
                    // A policy that looks at its primary found one (the gate is before
                    // the pass); a store-only policy leaves another policy's gate as
                    // recorded (its own, from when it had a source, goes).
                    if request.override_primary_gate || gate_is_ours {
                        tidemark_store::state::Gate::Open
                    } else {
                        tidemark_store::state::Gate::Keep
                    },
                )
                .await?;
                tidemark_store::state::save_hooks(store, &writer, recorded).await?;
                Ok::<_, tidemark_engine::EngineError>(())
            })
            .await
            .map_err(|e| StepError::Apply(Error::Engine(e)))?;
        let driver = consolidator.map(|c| c as &dyn tidemark_engine::Consolidator);
        unattended_pass(store, request, Some(&fence), driver)
            .await
            .map_err(|e| StepError::Apply(e.into()))
    }
    .await;
    fence.release().await;
    outcome
}

/// Steps 4–7 of `policy`: one retention pass under the store's lease, its outcome in
/// status, metrics and events.
///
/// # Errors
/// Its Secret is missing, the store failed or holds data that blocks the pass (each also
/// in status as the `Ready` condition).
async fn pass(
    ctx: Arc<Context>,
    policy: Arc<BackupPolicy>,
    valid: Validated,
    now: Timestamp,
) -> Result<Requeue, Error> {
    let api: Api<BackupPolicy> =
        Api::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default());
    match run_steps(&ctx, &api, &policy, &valid, now).await {
        Ok(()) => Ok(Requeue::requeue(until(
            now,
            tidemark_core::saturating_add(now, valid.interval),
        ))),
        Err(e) => Err(fail(&ctx, &api, &policy, e).await),
    }
}

/// When `spec.retention` differs from what the last whole pass applied: plans both over
/// the store (a dry run, no lease needed) and records the difference — `status.policyChange`
/// and a `PolicyChangePreview` event, a Warning when the change deletes what the applied
/// retention keeps or loses instants. A preview that cannot be made is logged; the pass
/// goes on (its deletion guard still holds a mass deletion).
async fn preview_change(
    ctx: &Context,
    api: &Api<BackupPolicy>,
    policy: &BackupPolicy,
    store: &ClusterStore,
    request: &PassRequest,
) {
    let Some(applied) = policy
        .status
        .as_ref()
        .and_then(|s| s.applied_retention.as_ref())
        .filter(|a| Some(*a) != policy.spec.retention.as_ref())
    else {
        return;
    };
    let generation = policy.meta().generation;
    if policy
        .status
        .as_ref()
        .and_then(|s| s.policy_change.as_ref())
        .is_some_and(|c| c.generation == generation)
    {
        return; // this generation is previewed already (a pass that failed is retried)
    }
    let Ok(before) = applied
        .to_input(policy.spec.time_zone.as_deref())
        .validate()
    else {
        return;
    };
    let mut dry = request.clone();
    dry.execute = false;
    dry.hooks = None;
    dry.compare_with = Some(before);
    let change = match tidemark_engine::retention_pass(
        store,
        &dry,
        None,
        None,
        &tidemark_store::progress::NoProgress,
    )
    .await
    {
        Ok(o) => o.change,
        Err(e) => {
            tracing::warn!(error = %e, "the policy change could not be previewed");
            None
        }
    };
    let Some(change) = change else { return };
    let status = change_status(&change, generation, ctx.clock.now());
    if let Err(e) = crate::status::policy_change(api, &policy.name_any(), &status).await {
        tracing::warn!(error = %e, "the policy change preview could not be recorded");
    }
    let kind = if change.loses() {
        EventType::Warning
    } else {
        EventType::Normal
    };
    ctx.event(
        &policy.object_ref(&()),
        kind,
        "PolicyChangePreview",
        &status.message,
    )
    .await;
}

/// `status.policyChange` of a previewed change (lists bounded: the object's size is).
fn change_status(
    change: &tidemark_core::preview::PolicyChange,
    generation: Option<i64>,
    now: Timestamp,
) -> tidemark_api::policy::PolicyChangeStatus {
    const SHOWN: usize = 20;
    let window = |w: &Option<tidemark_core::RecoveryWindow>| {
        w.as_ref()
            .map(tidemark_api::policy::RecoveryWindowStatus::from)
    };
    let span = |w: &Option<tidemark_core::RecoveryWindow>| {
        w.as_ref().map_or("nothing".to_owned(), |w| {
            format!(
                "point in time from {} (snapshots back to {})",
                w.point_in_time_from, w.from
            )
        })
    };
    let backups: Vec<String> = change
        .newly_deleted
        .iter()
        .take(SHOWN)
        .map(|b| format!("{}/{}", b.backup_name, b.backup_id))
        .collect();
    let lost: Vec<String> = change
        .lost
        .iter()
        .take(SHOWN)
        .map(|i| format!("{} → {}", i.from, i.to))
        .collect();
    let message = format!(
        "the retention change (generation {}) deletes {} backup(s) the applied retention keeps{}; keeps {} it deletes; recovery window now {}, after {}; {}",
        generation.map_or("?".to_owned(), |g| g.to_string()),
        change.newly_deleted.len(),
        if backups.is_empty() {
            String::new()
        } else {
            format!(
                " ({}{})",
                backups.join(", "),
                if change.newly_deleted.len() > SHOWN {
                    ", …"
                } else {
                    ""
                }
            )
        },
        change.newly_kept.len(),
        span(&change.recovery_window.before),
        span(&change.recovery_window.after),
        if lost.is_empty() {
            "no instant restorable now stops being restorable".to_owned()
        } else {
            format!(
                "instants no longer restorable to the point: {}",
                lost.join(", ")
            )
        }
    );
    tidemark_api::policy::PolicyChangeStatus {
        generation,
        previewed_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        newly_deleted: change.newly_deleted.len() as u64,
        backups,
        newly_kept: change.newly_kept.len() as u64,
        recovery_window_before: window(&change.recovery_window.before),
        recovery_window_after: window(&change.recovery_window.after),
        lost: change
            .lost
            .iter()
            .take(SHOWN)
            .map(|i| tidemark_api::policy::GapStatus {
                start: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(i.from),
                end: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(i.to),
            })
            .collect(),
        message: crate::events::fit(&message, 1000),
    }
}

/// Declares in `store` each of `copies` not recorded yet, and forgets the records of copies
/// the policy no longer names.
///
/// # Guarantees
/// Removes only `_state/copies/<name>.json` records of copies the spec does not name.
///
/// # Errors
/// The store failed.
async fn reconcile_copies(
    store: &ClusterStore,
    copies: &[tidemark_api::policy::CopySpec],
    now: Timestamp,
) -> Result<(), Error> {
    for c in copies {
        let destination = c.object_store.store_url().unwrap_or_default();
        tidemark_engine::copy::declare(store, &c.name, &destination, now).await?;
    }
    let recorded = tidemark_store::state::load_copies(store)
        .await
        .map_err(tidemark_engine::EngineError::from)?;
    for r in recorded {
        if !copies.iter().any(|c| c.name == r.name) {
            tracing::info!(copy = %r.name, "the policy no longer names this copy: its record goes");
            tidemark_store::state::forget_copy(store, &r.name)
                .await
                .map_err(tidemark_engine::EngineError::from)?;
        }
    }
    Ok(())
}

/// Steps 4–7, each failure its step's.
async fn run_steps(
    ctx: &Arc<Context>,
    api: &Api<BackupPolicy>,
    policy: &BackupPolicy,
    valid: &Validated,
    now: Timestamp,
) -> Result<(), StepError> {
    let ns = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let found = dereference(ctx, policy, valid.rules.consolidate).await?;
    let hooks: Arc<dyn DeleteHooks> = Arc::new(crate::hooks::PassHooks {
        ctx: ctx.clone(),
        namespace: ns.clone(),
        policy: name.clone(),
    });
    let mut request = build(valid, found.protect, Some(hooks), now);
    // A change of spec.retention since the last whole pass: the difference it makes is
    // recorded (status and event) before this pass acts on it.
    preview_change(ctx, api, policy, &found.store, &request).await;
    let outcome = apply(
        ctx,
        &found.store,
        &mut request,
        (&ns, &name),
        found.consolidator.as_ref(),
        &policy.spec.copies,
    )
    .await?;
    if let Some(c) = &found.consolidator {
        c.remove_finished().await;
    }
    // 7. status, and its report.
    let summary = PassSummary::of(&outcome);
    let labels = crate::metrics::Metrics::policy(&ns, &name);
    let m = &ctx.metrics;
    let failures = outcome
        .executed
        .as_ref()
        .map_or(0, |r| r.failures.len() as u64);
    m.retention_passes
        .get_or_create(&crate::metrics::PassLabels {
            namespace: ns.clone(),
            policy: name.clone(),
            result: if failures == 0 { "ok" } else { "partial" }.into(),
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
    let window = outcome.survey.plan.recovery_window.as_ref();
    m.recovery_window_seconds
        .get_or_create(&labels)
        .set(window.map_or(0, |w| w.to.duration_since(w.from).as_secs()));
    m.recovery_window_start
        .get_or_create(&labels)
        .set(window.map_or(0, |w| w.from.as_second()));
    m.recovery_window_end
        .get_or_create(&labels)
        .set(window.map_or(0, |w| w.to.as_second()));
    m.recovery_window_gaps
        .get_or_create(&labels)
        .set(window.map_or(0, |w| i64::try_from(w.gaps.len()).unwrap_or(i64::MAX)));
    m.point_in_time_start
        .get_or_create(&labels)
        .set(window.map_or(0, |w| w.point_in_time_from.as_second()));
    m.point_in_time_promised.get_or_create(&labels).set(
        valid
            .rules
            .point_in_time_window
            .map_or(0, |w| w.as_signed_duration().as_secs()),
    );
    m.store_bytes
        .get_or_create(&labels)
        .set(i64::try_from(summary.bytes_stored).unwrap_or(i64::MAX));
    m.backups_kept
        .get_or_create(&labels)
        .set(i64::try_from(summary.kept).unwrap_or(i64::MAX));
    m.recovery_window_promised.get_or_create(&labels).set(
        valid
            .rules
            .window
            .map_or(0, |w| w.as_signed_duration().as_secs()),
    );
    // Backup objects stay: pruning them is their ScheduledBackup's (seed 000).
    removed::record_removed(ctx, &ns, &name, &outcome, summary.audit.as_deref(), now).await;
    // Expired locked chains (seed 002): their Backup objects go, their data is the bucket's.
    removed::delete_expired(ctx, &ns, &name, &outcome, summary.audit.as_deref(), now).await;
    if let Some(r) = outcome
        .executed
        .as_ref()
        .filter(|r| !r.backups_expired.is_empty())
    {
        ctx.event(
            &policy.object_ref(&()),
            EventType::Normal,
            "ChainsExpired",
            &format!(
                "{} locked backup(s) whose lock ended recorded as expired; their objects are left to the bucket's lifecycle rule: {}",
                r.backups_expired.len(),
                r.backups_expired.join(", ")
            ),
        )
        .await;
    }
    if let Some((_, verdict)) = tidemark_store::survey::bucket_lifecycle(
        &found.store,
        &outcome.survey,
        valid.rules.window.map(|w| w.as_signed_duration()),
    )
    .await
        && let Some(problem) = verdict.problem()
    {
        ctx.warn(&policy.object_ref(&()), "BucketLifecycle", &problem)
            .await;
    }
    if summary.deleted > 0 || summary.segments_deleted > 0 {
        ctx.event(
            &policy.object_ref(&()),
            EventType::Normal,
            "BackupRetention",
            &summary.note(),
        )
        .await;
    }
    m.deletions_held.get_or_create(&labels).set(
        i64::try_from(outcome.guard.held.len()).unwrap_or(i64::MAX)
            + i64::from(outcome.guard.hold_segments && outcome.guard.held.is_empty()),
    );
    if outcome.guard.holds() {
        let condition = status::guard_condition(&outcome.guard, &[], None, now);
        ctx.warn(
            &policy.object_ref(&()),
            "DeletionsHeld",
            condition.message.as_str(),
        )
        .await;
    }
    let PassStatus {
        status: mut new,
        partly_failed,
    } = policy_status(
        &outcome,
        &policy.status.clone().unwrap_or_default(),
        policy.meta().generation,
        valid.interval,
        now,
        Timestamp::now(),
    );
    if partly_failed.is_none() {
        new.applied_retention = policy.spec.retention.clone();
    }
    if partly_failed.is_some() {
        m.retention_failures.get_or_create(&labels).inc_by(failures);
    }
    crate::status::policy(api, &name, &new)
        .await
        .map_err(StepError::Status)?;
    match partly_failed {
        Some(message) => Err(StepError::PartlyFailed(message)),
        None => Ok(()),
    }
}

/// Reports a step's failure — the one place a failed reconcile of a policy is reported —
/// and returns it as the reconcile's error (its class chooses the backoff):
///
/// - validate: a `InvalidSpec` warning, and `Ready=False`;
/// - dereference: `Ready=False` with the error's reason;
/// - apply: the failed pass counted in `tidemark_retention_passes_total` by class, and
///   `Ready=False`;
/// - partly failed: a `RetentionPartlyFailed` warning (status already says so);
/// - status: logged only (the status cannot be written).
///
/// A failure to write `Ready=False` is returned in its place.
async fn fail(
    ctx: &Context,
    api: &Api<BackupPolicy>,
    policy: &BackupPolicy,
    e: StepError,
) -> Error {
    let reason = e.reason();
    let object = policy.object_ref(&());
    let failed = |class: tidemark_engine::Class| {
        ctx.metrics
            .retention_passes
            .get_or_create(&crate::metrics::PassLabels {
                namespace: policy.namespace().unwrap_or_default(),
                policy: policy.name_any(),
                result: class.as_str().to_owned(),
            })
            .inc();
    };
    match &e {
        StepError::Validate(message) => {
            failed(tidemark_engine::Class::Input);
            ctx.warn(&object, reason, message).await;
        }
        StepError::Apply(inner) | StepError::Dereference(inner) => failed(inner.class()),
        StepError::PartlyFailed(message) => {
            ctx.warn(&object, "RetentionPartlyFailed", message).await;
            return e.into();
        }
        StepError::Status(inner) => {
            tracing::warn!(policy = %policy.name_any(), "could not write the pass's status: {inner}");
            return e.into();
        }
    }
    let error = Error::from(e);
    let failures = ctx.failures_of(&crate::context::key(policy)) + 1;
    let message = error.with_retry_note(&tidemark_engine::error::chain(&error), failures);
    match set_failed(api, policy, reason, &message).await {
        Ok(()) => error,
        Err(written) => written,
    }
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
    let store_secret = crate::stores::policy_secret_keys(ctx, policy)
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

/// Records a failed pass in status (`Ready=False` with `reason` and `message`), keeping
/// what the last good pass found.
async fn set_failed(
    api: &Api<BackupPolicy>,
    policy: &BackupPolicy,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    let previous = policy.status.clone().unwrap_or_default();
    let status = failed_status(
        &previous,
        policy.meta().generation,
        reason,
        message,
        Timestamp::now(),
    );
    crate::status::policy(api, &policy.name_any(), &status).await
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
mod step_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn at(minutes: i64) -> Timestamp {
        Timestamp::from_second(1_795_000_000).unwrap() + SignedDuration::from_mins(minutes)
    }

    fn policy(name: &str, spec: serde_json::Value) -> BackupPolicy {
        serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": spec,
        }))
        .unwrap()
    }

    /// validate: each field's refusal names it; a valid spec gives its rules and intervals.
    #[test]
    fn validate_names_the_field_it_refuses() {
        let store = json!({"bucket": "b"});
        let cases = [
            (
                "a-very-long-name-of-more-than-sixty-three-characters-is-no-label-value",
                json!({"objectStore": store, "retention": {"keepLast": 2}}),
                Some("metadata.name"),
            ),
            (
                "p",
                json!({"objectStore": store, "retention": {"keepLast": 2},
                       "retentionInterval": "soon"}),
                Some("retentionInterval"),
            ),
            (
                "p",
                json!({"objectStore": store, "retention": {"keepLast": 2},
                       "source": {"selector": {}, "primaryReadyFor": "2d"}}),
                Some("primaryReadyFor"),
            ),
            (
                "p",
                json!({"objectStore": store, "retention": {"window": "fortnight"}}),
                Some("spec.retention"),
            ),
            (
                "p",
                json!({"objectStore": store, "retention": {"keepLast": 2},
                       "retentionInterval": "30m",
                       "source": {"selector": {}, "primaryReadyFor": "90s"}}),
                None,
            ),
        ];
        for (name, spec, refused) in cases {
            let p = policy(name, spec);
            let result = validate(&p, p.spec.retention.as_ref().unwrap());
            match (result, refused) {
                (Err(e), Some(field)) => {
                    assert!(matches!(e, StepError::Validate(_)), "{e:?}");
                    assert_eq!(e.reason(), "InvalidSpec");
                    assert!(e.to_string().contains(field), "{field}: {e}");
                }
                (Ok(v), None) => {
                    assert_eq!(v.interval, SignedDuration::from_mins(30));
                    assert_eq!(v.primary_ready_for, Some(SignedDuration::from_secs(90)));
                    assert_eq!(v.as_given, json!({"keepLast": 2}));
                }
                (r, want) => panic!("{name}: {r:?}, wanted a refusal of {want:?}"),
            }
        }
    }

    /// due: throttled by the last whole pass of the current generation only.
    #[test]
    fn a_pass_is_due_after_its_interval_or_a_spec_change() {
        let hour = SignedDuration::from_hours(1);
        let ran = |generation: i64| BackupPolicyStatus {
            observed_generation: Some(generation),
            last_retention_run_time: Some(Time(at(0))),
            ..Default::default()
        };
        let cases = [
            ("never ran", BackupPolicyStatus::default(), 3, at(1), None),
            ("ran a minute ago", ran(3), 3, at(1), Some(at(60))),
            ("ran an hour ago", ran(3), 3, at(60), None),
            ("the spec changed since", ran(2), 3, at(1), None),
        ];
        for (name, status, generation, now, want) in cases {
            assert_eq!(
                not_due_until(&status, Some(generation), hour, now),
                want,
                "{name}"
            );
        }
    }

    fn pod(name: &str, role: Option<&str>, ready_since: Option<Timestamp>, deleting: bool) -> Pod {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {}},
            "status": {"phase": if ready_since.is_some() { "Running" } else { "Pending" }},
        }))
        .unwrap();
        if let Some(r) = role {
            p.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert("role".into(), r.into());
        }
        if let Some(since) = ready_since {
            p.status.as_mut().unwrap().conditions = Some(vec![
                serde_json::from_value(json!({
                    "type": "Ready", "status": "True", "lastTransitionTime": since.to_string(),
                }))
                .unwrap(),
            ]);
        }
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(at(0)));
        }
        p
    }

    /// gate (seed 000): retention waits for exactly one primary, Running and Ready for
    /// `primaryReadyFor`.
    #[test]
    fn retention_waits_for_an_established_primary() {
        let ready_for = SignedDuration::from_mins(5);
        let now = at(60);
        let old = Some(at(0));
        let recent = Some(at(58));
        /// A case: its name, the pods, and the message and recheck (seconds) of a wait.
        type Case<'a> = (&'a str, Vec<Pod>, Option<(&'a str, u64)>);
        let cases: Vec<Case> = vec![
            ("no pod", vec![], Some(("no pod matches", 30))),
            (
                "one unlabelled pod, ready long enough",
                vec![pod("a", None, old, false)],
                None,
            ),
            (
                "two unlabelled pods",
                vec![pod("a", None, old, false), pod("b", None, old, false)],
                Some(("is labelled role=primary", 30)),
            ),
            (
                "one primary among replicas",
                vec![
                    pod("a", Some("replica"), old, false),
                    pod("b", Some("primary"), old, false),
                ],
                None,
            ),
            (
                "two primaries",
                vec![
                    pod("b", Some("primary"), old, false),
                    pod("a", Some("primary"), old, false),
                ],
                Some(("2 pods are labelled role=primary (a, b)", 30)),
            ),
            (
                "a primary being deleted does not count",
                vec![
                    pod("a", Some("primary"), old, true),
                    pod("b", Some("replica"), old, false),
                ],
                Some(("no pod matching spec.source.selector is labelled", 30)),
            ),
            (
                "a primary not ready",
                vec![pod("a", Some("primary"), None, false)],
                Some(("pod a is not Running and Ready", 30)),
            ),
            (
                "a primary ready two minutes: three to go",
                vec![pod("a", Some("primary"), recent, false)],
                Some(("has been Ready since", 180)),
            ),
        ];
        for (name, pods, want) in cases {
            let got = primary_verdict(&pods, "role", "app=db", ready_for, now);
            match (got, want) {
                (None, None) => {}
                (Some(w), Some((text, recheck))) => {
                    assert!(w.message.contains(text), "{name}: {}", w.message);
                    assert_eq!(w.recheck, Duration::from_secs(recheck), "{name}");
                }
                (got, want) => panic!("{name}: {got:?}, wanted {want:?}"),
            }
        }
    }

    /// build: an executing pass at `now`, with the holds and the rules as validated.
    #[test]
    fn build_gives_the_engine_an_executing_request_with_the_holds() {
        let p = policy(
            "p",
            json!({"objectStore": {"bucket": "b"}, "retention": {"keepLast": 3}}),
        );
        let valid = validate(&p, p.spec.retention.as_ref().unwrap()).unwrap();
        let holds: HashSet<String> = ["20261127T000000Z".to_owned()].into();
        let r = build(&valid, holds.clone(), None, at(5));
        assert!(r.execute && !r.ignore_malformed);
        assert_eq!((r.now, r.started_at), (at(5), at(5)));
        assert_eq!(r.protect, holds);
        assert!(r.restores.is_empty(), "read under the lease, not here");
        assert_eq!(r.policy, valid.rules);
        assert_eq!(r.policy_as_given, json!({"keepLast": 3}));
    }

    /// Each step's failure has its own reason; the store's and the engine's by class.
    #[test]
    fn each_step_fails_with_its_own_reason() {
        let cases = [
            (StepError::Validate("x".into()), "InvalidSpec"),
            (StepError::PartlyFailed("x".into()), "PassPartlyFailed"),
            (
                StepError::Dereference(Error::Missing("secret s".into())),
                "Waiting",
            ),
            (
                StepError::Apply(Error::Engine(tidemark_engine::EngineError::Unverified {
                    backup: "b".into(),
                    problem: "p".into(),
                })),
                "NewestBackupUnverified",
            ),
            (StepError::Status(Error::Invalid("x".into())), "InvalidSpec"),
            (
                StepError::Apply(Error::PartlyFailed("x".into())),
                "StoreUnavailable",
            ),
        ];
        for (e, reason) in cases {
            assert_eq!(e.reason(), reason, "{e:?}");
        }
        // Validate fails for good; the others are retried.
        assert!(
            Error::from(StepError::Validate("x".into()))
                .retry_base(1)
                .is_none()
        );
        assert!(
            Error::from(StepError::PartlyFailed("x".into()))
                .retry_base(1)
                .is_some()
        );
    }
}
