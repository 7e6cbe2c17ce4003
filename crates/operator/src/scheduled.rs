//! The ScheduledBackup controller (seed 001): the engine's schedule tick, with the
//! schedule's status in the resource and each attempt a Backup object.
//!
//! Per reconcile: read the schedule fresh (its status is the resume cursor), list its
//! children by label (and any Backup holding one of its deterministic names), evaluate with
//! `tidemark_core::schedule`, then — when a slot is due — create the Backup *before*
//! recording the slot in status. A crash between the two leaves a Backup that the next
//! reconcile finds by its label or deterministic name and adopts; it never fires twice.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tidemark_api::OwnerReferenceMode;
use tidemark_api::crd::{Backup, BackupPolicy, ScheduledBackup, ScheduledBackupStatus};
use tidemark_api::schedule::{BackupPhase, IMMEDIATE_BACKUP_LABEL, SCHEDULED_BACKUP_LABEL};
use tidemark_core::schedule::{Child, ScheduleStatus};
use tidemark_engine::EngineError;
use tidemark_engine::schedule::{ScheduleState, Started, Tick, tick};

use crate::context::Context;
use crate::error::Error;

/// Evaluates one ScheduledBackup.
///
/// # Errors
/// The API failed, the spec is invalid, or its BackupPolicy is missing.
pub async fn reconcile(sb: Arc<ScheduledBackup>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = sb.namespace().unwrap_or_default();
    let name = sb.name_any();
    let schedules: Api<ScheduledBackup> = Api::namespaced(ctx.client.clone(), &ns);
    // The status is the resume cursor: read it fresh, not from the watch cache, so a
    // reconcile never decides on a status older than the last one it wrote.
    let Some(sb) = schedules.get_opt(&name).await? else {
        return Ok(Action::await_change());
    };
    // Its interval series: the one of its current policy (a series left by a deleted,
    // suspended or moved schedule goes with the metrics' sweep).
    let labels = crate::metrics::ScheduleLabels {
        namespace: ns.clone(),
        policy: sb.spec.template.policy.name.clone(),
        schedule: name.clone(),
    };
    if sb.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let invalid = |message: String| async {
        ctx.warn(&sb.object_ref(&()), "InvalidSpec", &message).await;
        ready(&ctx, &sb, false, "InvalidSpec", &message).await;
        Err(Error::Invalid(message))
    };
    // Before any request is built from the spec (the policy's name goes into a path), and
    // before a name too long to label the Backups creates any.
    if let Err(e) = sb.spec.validate() {
        return invalid(e.to_string()).await;
    }
    if let Err(e) = tidemark_api::names::label_value_name("metadata.name", &name) {
        return invalid(e.to_string()).await;
    }
    ctx.warn_ambiguous(&sb.object_ref(&()), &sb.spec.ambiguous_durations())
        .await;
    let policies: Api<BackupPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    let policy_name = &sb.spec.template.policy.name;
    let policy = policies.get_opt(policy_name).await?;
    let created_at = sb
        .meta()
        .creation_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    let spec = match sb.spec.schedule_spec(
        &name,
        policy.as_ref().and_then(|p| p.spec.time_zone.as_deref()),
        created_at,
    ) {
        Ok(s) => s,
        Err(e) => return invalid(e.to_string()).await,
    };
    // Once the policy is known to exist (a tenant's name of no policy makes no series):
    // the longest time between its slots, what "a backup is overdue" measures against.
    if !spec.suspend
        && policy.is_some()
        && let Some(gap) = spec.cron.longest_gap(ctx.clock.now(), &spec.time_zone)
    {
        ctx.metrics
            .schedule_interval
            .get_or_create(&labels)
            .set(gap.as_secs());
    }
    let Some(policy) = policy else {
        let message = format!("BackupPolicy {ns}/{policy_name} (spec.policy.name) does not exist");
        ready(&ctx, &sb, false, "PolicyMissing", &message).await;
        return Err(Error::Missing(message));
    };
    chains_end(&ctx, &sb, &policy).await;
    let owner = match sb.spec.backup_owner_reference {
        OwnerReferenceMode::SelfOwned => crate::context::owner_ref(&sb),
        OwnerReferenceMode::Cluster => crate::context::owner_ref(&policy),
        // Refused by `validate` above.
        OwnerReferenceMode::None | OwnerReferenceMode::Unknown(_) => None,
    };

    let backups: Api<Backup> = Api::namespaced(ctx.client.clone(), &ns);
    let immediate_owed = sb.spec.immediate
        && sb
            .status
            .as_ref()
            .and_then(|s| s.last_schedule_time.as_ref())
            .is_none();
    let children = children(&ctx, &backups, &ns, &name, immediate_owed).await?;
    let now = ctx.clock.now();
    let state = StatusInResource {
        schedules: schedules.clone(),
        backups: backups.clone(),
        schedule: sb.clone(),
        owner,
        default_ttl: policy.spec.ttl.clone(),
        recorded: std::sync::Mutex::new(None),
    };
    let outcome = tick(&spec, &children, &state, now, |_| String::new()).await;
    let outcome = match outcome {
        Ok(t) => t,
        Err(e) => return Err(e.into()),
    };
    match &outcome {
        Tick::Start { slot, attempt } => {
            tracing::info!(schedule = %name, backup = %attempt.backup_name, %slot, "created Backup");
        }
        Tick::Adopted { name: child, slot } => {
            tracing::info!(schedule = %name, backup = %child, %slot, "adopted Backup");
        }
        Tick::Skipped { name: child, slot } => {
            let note = format!(
                "Backup {child} exists and is not labelled {SCHEDULED_BACKUP_LABEL}={name}: refused to adopt it; slot {slot} skipped, resuming at the next"
            );
            tracing::warn!(schedule = %name, "{note}");
            ctx.warn(&sb.object_ref(&()), "BackupAdoptionRefused", &note)
                .await;
        }
        Tick::Nothing => {}
    }
    // The Backups it generated that only record the past, beyond its history (seed 000:
    // the scheduler's job, never the retention pass's).
    crate::history::prune(&ctx, &sb, &policy, now).await;
    // Wake at the next slot; a child finishing wakes us sooner (Backups are watched).
    let next = state
        .recorded
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .and_then(|s| s.next_schedule_time);
    let newest = newest_child(&ctx, &ns, &name);
    let (ok, reason, message) = health(spec.suspend, newest.as_ref());
    ready(&ctx, &sb, ok, reason, &message).await;
    Ok(match next {
        Some(at) => Action::requeue(until(now, at)),
        None => Action::requeue(Duration::from_secs(3600)),
    })
}

/// The `Ready` condition's writer (its own field manager, beside `ChainsEnd`'s).
const READY_MANAGER: &str = "tidemark-operator-ready";

/// The newest Backup the schedule made (by its slot), with its phase and its `Ready`
/// message, from the cache.
fn newest_child(
    ctx: &Context,
    ns: &str,
    schedule: &str,
) -> Option<(String, Option<BackupPhase>, String)> {
    ctx.backups
        .state()
        .iter()
        .filter(|b| b.namespace().as_deref() == Some(ns))
        .filter(|b| b.labels().get(SCHEDULED_BACKUP_LABEL).map(String::as_str) == Some(schedule))
        .filter_map(|b| Some((crate::names::slot_of(&b.name_any(), schedule)?, b)))
        .max_by_key(|(slot, _)| *slot)
        .map(|(_, b)| {
            let status = b.status.as_ref();
            let said = status
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.message.clone())
                .unwrap_or_default();
            (b.name_any(), status.and_then(|s| s.phase), said)
        })
}

/// A schedule's health (pure), for its `Ready` condition: `False` while its newest Backup
/// failed (`LastBackupFailed`, naming it and why), else `True` — `Suspended`, or
/// `Scheduled` (the next slot is `status.nextScheduleTime`: not in the message, which
/// would change at every slot). A spec Tidemark refuses is `InvalidSpec`, a policy that
/// does not exist `PolicyMissing`, both `False`, written where they are found.
pub(crate) fn health(
    suspend: bool,
    newest: Option<&(String, Option<BackupPhase>, String)>,
) -> (bool, &'static str, String) {
    if let Some((name, Some(BackupPhase::Failed), why)) = newest {
        let why: String = why.chars().take(512).collect();
        return (
            false,
            "LastBackupFailed",
            format!("its newest Backup {name} failed: {why}"),
        );
    }
    if suspend {
        return (
            true,
            "Suspended",
            "suspended: no new Backups until spec.suspend is false".into(),
        );
    }
    (
        true,
        "Scheduled",
        "creating Backups at the schedule's slots (the next: status.nextScheduleTime)".into(),
    )
}

/// Writes the `Ready` condition when it changed.
async fn ready(ctx: &Context, sb: &ScheduledBackup, ok: bool, reason: &str, message: &str) {
    let wanted = crate::status::condition(
        &conditions_of(sb),
        "Ready",
        ok,
        reason,
        message,
        sb.meta().generation,
    );
    write_condition(ctx, sb, "Ready", READY_MANAGER, Some(wanted)).await;
}

/// The schedule's conditions as last read.
fn conditions_of(
    sb: &ScheduledBackup,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    sb.status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default()
}

/// Applies the condition `kind` as `manager` (none: removes it) when it differs from the
/// one the schedule carries.
async fn write_condition(
    ctx: &Context,
    sb: &ScheduledBackup,
    kind: &str,
    manager: &str,
    wanted: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
) {
    let old = conditions_of(sb);
    let current = old.iter().find(|c| c.type_ == kind);
    let same = match (current, &wanted) {
        (None, None) => true,
        (Some(c), Some(w)) => {
            c.status == w.status
                && c.reason == w.reason
                && c.message == w.message
                && c.observed_generation == w.observed_generation
        }
        _ => false,
    };
    if same {
        return;
    }
    let api: Api<ScheduledBackup> =
        Api::namespaced(ctx.client.clone(), &sb.namespace().unwrap_or_default());
    let value = serde_json::json!({ "conditions": wanted.into_iter().collect::<Vec<_>>() });
    if let Err(e) = crate::status::apply(&api, &sb.name_any(), manager, value).await {
        tracing::warn!(schedule = %sb.name_any(), error = %e, "{kind} condition");
    }
}

/// The condition a schedule of incrementals carries (seed 002): whether its chains end.
pub(crate) const CHAINS_END_CONDITION: &str = "ChainsEnd";
/// Its writer.
const CHAINS_END_MANAGER: &str = "tidemark-operator-chains";

/// Whether the chains of `sb`'s incrementals end (`tidemark_api`'s
/// `ScheduledBackupSpec::chains_end`).
pub(crate) fn chains_end_verdict(
    sb: &ScheduledBackup,
    policy: &BackupPolicy,
) -> Option<(bool, &'static str, String)> {
    sb.spec.chains_end(&policy.name_any(), &policy.spec)
}

/// Writes [`CHAINS_END_CONDITION`] when it changed (removes it from a schedule that takes
/// fulls only), with a `ChainsNeverEnd` Warning when a chain never ends.
async fn chains_end(ctx: &Context, sb: &ScheduledBackup, policy: &BackupPolicy) {
    let verdict = chains_end_verdict(sb, policy);
    let old = conditions_of(sb);
    let wanted = verdict.as_ref().map(|(ok, reason, message)| {
        crate::status::condition(
            &old,
            CHAINS_END_CONDITION,
            *ok,
            reason,
            message,
            sb.meta().generation,
        )
    });
    if let Some((false, _, message)) = &verdict {
        ctx.warn(&sb.object_ref(&()), "ChainsNeverEnd", message)
            .await;
    }
    write_condition(ctx, sb, CHAINS_END_CONDITION, CHAINS_END_MANAGER, wanted).await;
}

/// From `now` to `at`, at least 100 ms and at most an hour (a schedule is re-read hourly
/// even when nothing wakes it).
fn until(now: Timestamp, at: Timestamp) -> Duration {
    let d = at.duration_since(now);
    Duration::try_from(d)
        .unwrap_or(Duration::ZERO)
        .clamp(Duration::from_millis(100), Duration::from_secs(3600))
        + Duration::from_millis(50)
}

/// The Backups that concern schedule `name`, from the watch cache (complete before any
/// schedule is evaluated): its own (by label) and any other holding one of its
/// deterministic names. While the immediate Backup is still owed, its own are also listed
/// from the API, so an immediate Backup created moments ago is adopted, never repeated. A
/// collision the cache has not seen yet is a conflict on create, retried.
async fn children(
    ctx: &Context,
    backups: &Api<Backup>,
    ns: &str,
    name: &str,
    immediate_owed: bool,
) -> Result<Vec<Child>, Error> {
    let prefix = format!("{name}-");
    let mut out: BTreeMap<String, Child> = ctx
        .backups
        .state()
        .iter()
        .filter(|b| b.namespace().as_deref() == Some(ns))
        .filter(|b| {
            b.name_any().starts_with(&prefix)
                || b.labels().get(SCHEDULED_BACKUP_LABEL).map(String::as_str) == Some(name)
        })
        .map(|b| (b.name_any(), child(b, name)))
        .collect();
    if immediate_owed {
        let params = ListParams::default().labels(&format!("{SCHEDULED_BACKUP_LABEL}={name}"));
        let ours = crate::lean::list(backups, &params, crate::lean::backup).await?;
        for b in &ours {
            out.insert(b.name_any(), child(b, name));
        }
    }
    Ok(out.into_values().collect())
}

fn child(b: &Backup, schedule: &str) -> Child {
    let labels = b.labels();
    let name = b.name_any();
    Child {
        ours: labels.get(SCHEDULED_BACKUP_LABEL).map(String::as_str) == Some(schedule),
        immediate: labels.get(IMMEDIATE_BACKUP_LABEL).map(String::as_str) == Some("true"),
        done: b
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|p| p.is_done()),
        slot: crate::names::slot_of(&name, schedule),
        name,
    }
}

/// The schedule's status lives in the ScheduledBackup; an attempt is a Backup object.
struct StatusInResource {
    schedules: Api<ScheduledBackup>,
    backups: Api<Backup>,
    schedule: ScheduledBackup,
    owner: Option<OwnerReference>,
    /// The policy's `ttl`, for a schedule without its own (seed 004).
    default_ttl: Option<String>,
    /// The status this reconcile recorded.
    recorded: std::sync::Mutex<Option<ScheduleStatus>>,
}

#[async_trait]
impl ScheduleState for StatusInResource {
    async fn status(&self, _: &str) -> ScheduleStatus {
        let s = self.schedule.status.clone().unwrap_or_default();
        ScheduleStatus {
            last_check_time: s.last_check_time.map(|t| t.0),
            last_schedule_time: s.last_schedule_time.map(|t| t.0),
            next_schedule_time: s.next_schedule_time.map(|t| t.0),
            last_handled_slot: s.last_handled_slot.map(|t| t.0),
        }
    }

    async fn record(
        &self,
        schedule: &str,
        status: &ScheduleStatus,
        starting: Option<&Started>,
    ) -> Result<(), EngineError> {
        if let Some(attempt) = starting {
            self.create_child(schedule, attempt)
                .await
                .map_err(|e| EngineError::Edge {
                    class: e.class(),
                    message: e.to_string(),
                })?;
        }
        let previous = self.schedule.status.clone().unwrap_or_default();
        let new = ScheduledBackupStatus {
            last_check_time: status.last_check_time.map(Time),
            last_schedule_time: status.last_schedule_time.map(Time),
            next_schedule_time: status.next_schedule_time.map(Time),
            last_handled_slot: status.last_handled_slot.map(Time),
            immediate_done: previous.immediate_done
                || (self.schedule.spec.immediate && status.last_schedule_time.is_some()),
            // Conditions have writers of their own (`chains_end`): not this one's.
            conditions: Vec::new(),
            observed_generation: self.schedule.meta().generation,
        };
        crate::status::own(&self.schedules, schedule, &new)
            .await
            .map_err(|e: Error| EngineError::Edge {
                class: e.class(),
                message: format!("ScheduledBackup {schedule} status: {e}"),
            })?;
        *self
            .recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(status.clone());
        Ok(())
    }

    async fn ended(&self, _: &str) -> Result<(), EngineError> {
        Ok(())
    }
}

impl StatusInResource {
    /// Creates the slot's Backup. Already there and ours: that is the same attempt (a
    /// retry), fine. Already there and not ours: a collision the next evaluation skips.
    async fn create_child(&self, schedule: &str, attempt: &Started) -> Result<(), Error> {
        let mut spec = self.schedule.spec.child_spec();
        if spec.ttl.is_none() {
            spec.ttl.clone_from(&self.default_ttl);
        }
        // The cache keeps no pod template (`crate::lean::schedule`): the object has it.
        if spec.template.method.as_deref() == Some("job") {
            let read = self.schedules.get(&self.schedule.name_any()).await?;
            spec.template.job_template = read.spec.template.job_template;
        }
        let backup = Backup {
            metadata: ObjectMeta {
                name: Some(attempt.backup_name.clone()),
                namespace: self.schedule.namespace(),
                labels: Some(
                    self.schedule
                        .spec
                        .labels_of_child(schedule, attempt.immediate),
                ),
                owner_references: self.owner.clone().map(|o| vec![o]),
                ..Default::default()
            },
            spec,
            status: None,
        };
        match self.backups.create(&PostParams::default(), &backup).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = self.backups.get(&attempt.backup_name).await?;
                if existing
                    .labels()
                    .get(SCHEDULED_BACKUP_LABEL)
                    .map(String::as_str)
                    == Some(schedule)
                {
                    Ok(())
                } else {
                    Err(Error::Missing(format!(
                        "Backup {} exists and is not this schedule's",
                        attempt.backup_name
                    )))
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Which schedule a Backup event concerns (by its label).
pub fn schedule_of(b: Backup) -> Option<ObjectRef<ScheduledBackup>> {
    let ns = b.namespace()?;
    b.labels()
        .get(SCHEDULED_BACKUP_LABEL)
        .map(|n| ObjectRef::new(n).within(&ns))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    use crate::names::slot_of;

    #[test]
    fn slots_come_from_deterministic_names_only() {
        assert_eq!(
            slot_of("nightly-20261122020000", "nightly"),
            Some("2026-11-22T02:00:00Z".parse().unwrap())
        );
        assert_eq!(slot_of("nightly-2026112202000", "nightly"), None);
        assert_eq!(slot_of("nightly-x-20261122020000", "nightly"), None);
        assert_eq!(slot_of("other-20261122020000", "nightly"), None);
        assert_eq!(slot_of("nightly-20261322020000", "nightly"), None);
    }

    #[test]
    fn only_a_forever_incremental_without_consolidation_never_ends() {
        let schedule = |incremental: serde_json::Value| -> ScheduledBackup {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "ScheduledBackup",
                "metadata": {"name": "s", "namespace": "n"},
                "spec": {"schedule": "@daily", "policy": {"name": "p"}, "incremental": incremental},
            }))
            .unwrap()
        };
        let policy = |retention: serde_json::Value| -> BackupPolicy {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
                "metadata": {"name": "p", "namespace": "n"},
                "spec": {"objectStore": {"url": "file:///b"}, "retention": retention},
            }))
            .unwrap()
        };
        let plain = policy(serde_json::json!({"keepLast": 3}));
        let merging = policy(serde_json::json!({"keepLast": 3, "consolidate": true}));
        let verdict = |s: &ScheduledBackup, p: &BackupPolicy| {
            chains_end_verdict(s, p).map(|(ok, reason, _)| (ok, reason))
        };
        let forever = schedule(serde_json::json!({}));
        let every = schedule(serde_json::json!({"maxIncrementsPerFull": 6}));
        assert_eq!(
            verdict(&forever, &plain),
            Some((false, "ForeverIncrementalWithoutConsolidate"))
        );
        assert_eq!(verdict(&forever, &merging), Some((true, "Consolidated")));
        assert_eq!(verdict(&every, &plain), Some((true, "FullEveryN")));
        assert_eq!(verdict(&schedule(serde_json::Value::Null), &plain), None);
    }

    /// Ready follows the newest Backup: a failed one makes the schedule not Ready, naming
    /// it; a later one that did not fail makes it Ready again; suspended is Ready.
    #[test]
    fn a_schedule_is_ready_unless_its_newest_backup_failed() {
        let failed = (
            "nightly-20261130020000".to_owned(),
            Some(BackupPhase::Failed),
            "mariabackup exited with status 1".to_owned(),
        );
        let (ok, reason, message) = health(false, Some(&failed));
        assert!(!ok);
        assert_eq!(reason, "LastBackupFailed");
        assert!(
            message.contains("nightly-20261130020000") && message.contains("status 1"),
            "{message}"
        );
        assert!(
            !health(true, Some(&failed)).0,
            "suspended does not hide a failure"
        );
        let running = (
            "nightly-20261201020000".to_owned(),
            Some(BackupPhase::Running),
            String::new(),
        );
        assert_eq!(health(false, Some(&running)).1, "Scheduled");
        assert_eq!(
            health(true, None),
            (
                true,
                "Suspended",
                "suspended: no new Backups until spec.suspend is false".to_owned()
            )
        );
        assert!(health(false, None).0);
    }

    #[test]
    fn waits_are_bounded() {
        let now: Timestamp = "2026-11-22T02:00:00Z".parse().unwrap();
        assert_eq!(
            until(now, "2026-11-22T02:00:05Z".parse().unwrap()),
            Duration::from_millis(5050)
        );
        assert_eq!(until(now, now), Duration::from_millis(150));
        assert_eq!(
            until(now, "2027-11-22T02:00:00Z".parse().unwrap()),
            Duration::from_secs(3600) + Duration::from_millis(50)
        );
    }
}
