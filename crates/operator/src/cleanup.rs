//! Opt-in remote cleanup (seed 000's planned finalizer): a Backup whose effective
//! `deletionPolicy` is `Delete` — its own (or its ScheduledBackup template's, copied into
//! it), else its BackupPolicy's — carries the finalizer `tidemark.io/remote-cleanup`.
//! When it is deleted:
//!
//! 1. the finalizer holds the object (its `deletionTimestamp` set);
//! 2. the recorded backup (`status.backupId` under its store name) is looked up in the
//!    policy's store with the policy's credentials;
//! 3. the engine's deleter removes it — audit record first, `metadata.json` before the
//!    payload — unless a recovery depends on it (the last restorable backup — an
//!    explicit deletion is not retention, so the newest goes while another remains — the
//!    parent of a committed increment, the only bridge over a binlog gap): then the backup is
//!    marked for deletion in the store (`_deletion-requested.json`, seed 002's
//!    delete-then-consolidate), so that no retention rule keeps it and a pass removes it
//!    or consolidates its chain once that is safe; the Backup says so
//!    (`RemoteCleanup=False`, `WaitingForRetention`, or `LastRestorableBackup`) and is
//!    looked at again until its
//!    data is gone;
//! 4. a failure is the condition `RemoteCleanup=False` (`RemoteCleanupFailed`) and a
//!    Warning event, and is retried with backoff; the finalizer stays;
//! 5. the finalizer goes once the data is gone, or at once with the annotation
//!    `tidemark.io/skip-remote-cleanup: "true"` (the explicit bypass).
//!
//! With `Retain` (the default) there is no finalizer, so no deletion of the object — by
//! hand, a namespace deletion, an owner-reference cascade or a GitOps prune — touches the
//! store.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tidemark_api::DeletionPolicy;
use tidemark_api::crd::{Backup, BackupPhase, BackupPolicy};
use tidemark_engine::delete::{
    Decision, DeleteRequest, Requested, decide_requested, delete_requested,
};
use tidemark_store::{Catalog, NoProgress};

use crate::context::Context;
use crate::error::Error;
use crate::status::condition;

/// The finalizer of a Backup whose remote data goes with it.
pub const FINALIZER: &str = "tidemark.io/remote-cleanup";
/// The annotation that lets a Backup go without deleting its remote data.
pub const SKIP_ANNOTATION: &str = "tidemark.io/skip-remote-cleanup";
/// The condition that tells how the cleanup goes.
const CONDITION: &str = "RemoteCleanup";
/// How often a Backup whose data a recovery still depends on is looked at again.
const WAITING_RECHECK: Duration = Duration::from_secs(600);
pub use crate::names::EXPIRED_ANNOTATION;
/// The condition that tells how TTL expiry goes.
const EXPIRY_CONDITION: &str = "Expired";
/// Longest wait before an unexpired TTL is looked at again (the clock is read afresh).
const EXPIRY_RECHECK: Duration = Duration::from_secs(3600);

/// The effective deletion policy: the Backup's own, else its policy's, else `Retain`. A
/// value this version does not know (a newer CRD's) is never `Delete`: nothing is deleted
/// by it.
pub fn effective(backup: &Backup, policy: Option<&BackupPolicy>) -> DeletionPolicy {
    backup
        .spec
        .template
        .deletion_policy
        .clone()
        .or_else(|| policy.and_then(|p| p.spec.deletion_policy.clone()))
        .unwrap_or(DeletionPolicy::Retain)
}

/// Whether `backup` carries the finalizer.
pub fn has_finalizer(backup: &Backup) -> bool {
    backup.finalizers().iter().any(|f| f == FINALIZER)
}

/// Adds or removes the finalizer so that it matches `want`. A patch that names the
/// resourceVersion it read, so a concurrent change is not lost (409: retried).
///
/// # Errors
/// The API refused.
pub async fn set_finalizer(api: &Api<Backup>, backup: &Backup, want: bool) -> Result<(), Error> {
    crate::context::set_finalizer(api, backup, FINALIZER, want).await
}

/// What the finalizer of a Backup being deleted does: a pure decision from the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cleanup {
    /// Let the object go, deleting nothing: the skip annotation (`reason`, `note` for the
    /// event), a backup that never started (no event), or data retention already removed.
    Release {
        event: Option<(&'static str, String)>,
    },
    /// Delete the backup `id` from the store: its own, or the synthetic full that replaced
    /// it (`replaced`: its hooks ran when its own data went); `expired`: its TTL ran out.
    Delete {
        id: String,
        replaced: bool,
        expired: bool,
    },
}

/// What the finalizer of `backup` does (see the module's steps).
pub(crate) fn decide_cleanup(backup: &Backup) -> Cleanup {
    let status = backup.status.clone().unwrap_or_default();
    if backup
        .annotations()
        .get(SKIP_ANNOTATION)
        .map(String::as_str)
        == Some("true")
    {
        let note = match &status.key {
            Some(key) => format!("{SKIP_ANNOTATION}: the remote data stays ({key})"),
            None => format!("{SKIP_ANNOTATION}: nothing remote is deleted"),
        };
        return Cleanup::Release {
            event: Some(("RemoteCleanupSkipped", note)),
        };
    }
    let Some(id) = status.backup_id.clone().filter(|_| status.phase.is_some()) else {
        // Never started: nothing of it is in the store.
        return Cleanup::Release { event: None };
    };
    // Consolidation merged it into a synthetic full that holds its restore point now: the
    // deletion acts on that full (seed 002), under the same rules.
    if let Some(r) = status
        .data_removed
        .as_ref()
        .and_then(|r| r.replaced_by.as_ref())
    {
        return Cleanup::Delete {
            id: r.backup_id.clone(),
            replaced: true,
            expired: backup.annotations().contains_key(EXPIRED_ANNOTATION),
        };
    }
    if let Some(removed) = &status.data_removed {
        // A retention pass deleted its data (and ran the DeleteHooks then): nothing is left
        // to delete, and the hooks must not run twice.
        let note = format!(
            "the data was removed by retention at {}{}: nothing to delete",
            removed.at.0,
            removed
                .audit_record
                .as_deref()
                .map(|a| format!(" (audit record {a})"))
                .unwrap_or_default()
        );
        return Cleanup::Release {
            event: Some(("RemoteDataDeleted", note)),
        };
    }
    Cleanup::Delete {
        id,
        replaced: false,
        expired: backup.annotations().contains_key(EXPIRED_ANNOTATION),
    }
}

/// The condition of a Backup whose data stays, marked, while a recovery depends on it
/// (`keep`): its reason and message.
pub(crate) fn marked_condition(id: &str, keep: &[tidemark_core::Reason]) -> (&'static str, String) {
    let why: Vec<String> = keep.iter().map(ToString::to_string).collect();
    if keep == [tidemark_core::Reason::Floor] {
        (
            "LastRestorableBackup",
            format!(
                "backup {id} is the last restorable backup of this store, so its data stays (marked for deletion): a retention pass removes it once another backup is restorable. Annotate {SKIP_ANNOTATION}=\"true\" to let the object go now (the mark stays)"
            ),
        )
    } else {
        (
            "WaitingForRetention",
            format!(
                "backup {id} is marked for deletion but stays in the store while a recovery depends on it ({}): the last restorable backup is never deleted, nor the base of a committed increment; a retention pass removes it (with consolidate, merges its chain into a synthetic full) once that no longer holds. Annotate {SKIP_ANNOTATION}=\"true\" to let the object go now (the mark stays)",
                why.join(", ")
            ),
        )
    }
}

/// A Backup being deleted that carries the finalizer (and whose attempt is not running):
/// [`decide_cleanup`], then its hooks, then the deletion under the store's fence.
///
/// # Guarantees
/// Remote data is deleted only for a Backup whose effective `deletionPolicy` put the
/// finalizer on it, only the backup its status recorded (or the synthetic full that
/// replaced it), only from the store it was recorded in, only under the store's lease
/// (stopped when the lease is lost), and never while a recovery depends on it (marked
/// instead). The finalizer goes only once nothing is left to delete.
///
/// # Errors
/// The cleanup failed (recorded on the Backup and as a Warning event first); retried.
pub async fn on_delete(
    ctx: &Arc<Context>,
    api: &Api<Backup>,
    backup: &Backup,
    policy: Option<&BackupPolicy>,
) -> Result<Action, Error> {
    let reference = backup.object_ref(&());
    let (id, replaced, expired) = match decide_cleanup(backup) {
        Cleanup::Release { event } => {
            if let Some((reason, note)) = event {
                ctx.event(&reference, EventType::Normal, reason, &note)
                    .await;
            }
            set_finalizer(api, backup, false).await?;
            return Ok(Action::await_change());
        }
        Cleanup::Delete {
            id,
            replaced,
            expired,
        } => (id, replaced, expired),
    };
    // A hold released since the last pass leaves the store's record first.
    if let Some(p) = policy
        && let Err(e) = crate::holds::record_protected(ctx, backup, p).await
    {
        return failed(ctx, api, backup, e).await;
    }
    let fence = match fenced_store(ctx, backup, policy).await {
        Ok(f) => f,
        Err(e) => return failed(ctx, api, backup, e).await,
    };
    let fence = match unless_restores_use(ctx, api, backup, &id, fence).await? {
        Ok(f) => f,
        Err(wait) => return Ok(wait),
    };
    // The DeleteHooks run right before the data goes (seed 003), and only then: a backup
    // that would only be marked runs none (a pass that finally deletes it runs them). They
    // may take up to their timeouts, so they run outside the store's lease — slow hooks
    // never hold another deletion or pass of the store — and a Job hook is followed across
    // reconciles; the deletion is then decided again under the lease. (A replaced
    // backup's hooks ran when its own data was merged.)
    let probe = delete_request(backup, &id, expired, Vec::new(), ctx.clock.now());
    let (fence, request) = match decide_requested(&fence, &probe).await {
        Err(e) => {
            fence.release().await;
            return failed(ctx, api, backup, Error::Engine(e)).await;
        }
        Ok(Decision::Delete) if !replaced => {
            fence.release().await;
            let word = if expired {
                "ttlExpired"
            } else {
                "deletionRequested"
            };
            // The background turn is given back meanwhile (nothing of the store is held).
            let hooks =
                match crate::background::without_turn(crate::hooks::run(ctx, api, backup, word))
                    .await?
                {
                    Some(hooks) => hooks,
                    None => return Ok(Action::requeue(Duration::from_secs(5))),
                };
            // Re-read: the hooks' outcomes are in its status now.
            let fresh = api.get(&backup.name_any()).await?;
            let fence = match fenced_store(ctx, &fresh, policy).await {
                Ok(f) => f,
                Err(e) => return failed(ctx, api, &fresh, e).await,
            };
            let fence = match unless_restores_use(ctx, api, &fresh, &id, fence).await? {
                Ok(f) => f,
                Err(wait) => return Ok(wait),
            };
            let request = delete_request(&fresh, &id, expired, hooks, ctx.clock.now());
            (fence, request)
        }
        Ok(_) => (fence, probe),
    };
    let deleted = delete_requested(&fence, &request).await;
    fence.release().await;
    let name = &request.name;
    let report = match deleted {
        Err(e) => return failed(ctx, api, backup, Error::Engine(e)).await,
        Ok(Requested::Absent) => {
            // Already gone (a retention pass took it, or a previous attempt finished).
            ctx.event(
                &reference,
                EventType::Normal,
                "RemoteDataDeleted",
                &format!("no backup {name}/{id} in the store (already deleted): nothing to delete"),
            )
            .await;
            set_finalizer(api, backup, false).await?;
            return Ok(Action::await_change());
        }
        Ok(Requested::Marked(keep)) => {
            // Marked, not deleted (seed 002): from now on no retention rule keeps it, and
            // a pass removes it — or merges its chain into a synthetic full — once that
            // is safe. This object waits for that.
            let (reason, message) = marked_condition(&id, &keep);
            set_condition(api, backup, false, reason, &message).await?;
            return Ok(Action::requeue(WAITING_RECHECK));
        }
        Ok(Requested::Deleted(report)) => report,
    };
    ctx.metrics
        .objects_deleted
        .get_or_create(&crate::metrics::Metrics::policy(
            &backup.namespace().unwrap_or_default(),
            &backup.spec.template.policy.name,
        ))
        .inc_by(report.objects_deleted as u64);
    let note = format!(
        "deleted backup {id} from the store ({} objects; audit record {})",
        report.objects_deleted,
        report.audit_key.as_deref().unwrap_or("-")
    );
    tracing::info!(backup = %backup.name_any(), "{note}");
    ctx.event(&reference, EventType::Normal, "RemoteDataDeleted", &note)
        .await;
    set_finalizer(api, backup, false).await?;
    Ok(Action::await_change())
}

/// The policy's store, under its fence: the one the backup was recorded in.
async fn fenced_store(
    ctx: &Context,
    backup: &Backup,
    policy: Option<&BackupPolicy>,
) -> Result<tidemark_engine::Fence, Error> {
    let Some(policy) = policy else {
        return Err(Error::Missing(format!(
            "BackupPolicy {}/{} (spec.policy.name) does not exist, so the store is unknown; restore it, or annotate the Backup {SKIP_ANNOTATION}=\"true\" to let it go without deleting its data",
            backup.namespace().unwrap_or_default(),
            backup.spec.template.policy.name
        )));
    };
    let store = crate::stores::open(ctx, policy).await?;
    // The store it was written to, as recorded: a policy pointed elsewhere since must not
    // make its data look gone.
    if let Some(recorded) = backup.status.as_ref().and_then(|s| s.bucket.as_deref())
        && recorded != store.url
    {
        return Err(Error::Invalid(format!(
            "the backup was recorded in {recorded}, but BackupPolicy {} now names {}; point it back, or annotate {SKIP_ANNOTATION}=\"true\" to let the object go and keep the data",
            policy.name_any(),
            store.url
        )));
    }
    // Under the store's lease until the deletion is done; the deletion stops if it is lost.
    crate::fence::acquire(ctx, &store).await
}

/// The engine's request to delete `id`, the backup this object made (under the name its
/// status recorded), with the hooks' outcomes in the audit record.
fn delete_request(
    backup: &Backup,
    id: &str,
    expired: bool,
    hooks: Vec<tidemark_api::crd::HookResult>,
    now: jiff::Timestamp,
) -> DeleteRequest {
    let by = format!(
        "Backup {}/{}",
        backup.namespace().unwrap_or_default(),
        backup.name_any()
    );
    let mut audit_extra = serde_json::Map::new();
    if !hooks.is_empty() {
        audit_extra.insert(
            "hooks".into(),
            json!([{"backupId": id, "backupName": crate::names::store_name(backup), "hooks": hooks}]),
        );
    }
    DeleteRequest {
        // The operator runs every hook itself (before this request).
        recorded_hooks: tidemark_engine::delete::RecordedHooks::RunByCaller,
        hooks: None,
        name: recorded_name(backup),
        id: id.to_owned(),
        // An expired TTL says so in the audit record.
        reason: if expired {
            tidemark_core::Reason::TtlExpired
        } else {
            tidemark_core::Reason::DeletionRequested
        },
        requested_by: by,
        audit_extra,
        now,
    }
}

/// Seed 000: no deletion of data a restore uses (a Restore that names this backup, or
/// whose plan holds it, until it has ended): the object waits (`Err(action)`, the fence
/// released); otherwise the fence back. Read under the lease, which a Restore plans under.
///
/// # Errors
/// The API failed (recorded first, the fence released).
async fn unless_restores_use(
    ctx: &Context,
    api: &Api<Backup>,
    backup: &Backup,
    id: &str,
    fence: tidemark_engine::Fence,
) -> Result<Result<tidemark_engine::Fence, Action>, Error> {
    let ns = backup.namespace().unwrap_or_default();
    let by: Vec<String> =
        match crate::holds::read_restore_holds(ctx, &ns, &backup.spec.template.policy.name).await {
            Ok(holds) => holds
                .into_iter()
                .filter(|h| h.backup_id == id)
                .map(|h| h.by)
                .collect(),
            Err(e) => {
                fence.release().await;
                return failed(ctx, api, backup, e).await.map(Err);
            }
        };
    if by.is_empty() {
        return Ok(Ok(fence));
    }
    fence.release().await;
    let message = format!(
        "backup {id} stays in the store while Restore(s) {} use it; its data is deleted once they have ended or are deleted",
        by.join(", ")
    );
    set_condition(api, backup, false, "HeldByRestore", &message).await?;
    Ok(Err(Action::requeue(WAITING_RECHECK)))
}

/// TTL expiry (seed 004): a finished Backup with `spec.ttl` expires once `ttl` has passed
/// since its creation. It is then deleted together with its data — through the same
/// finalizer as a deletion with `deletionPolicy: Delete` (audit record first; a chain's
/// base is marked and goes when safe) — using the policy's credentials. Never the newest
/// restorable backup: that one waits (`Expired=False`, `NewestRestorable`). Without the
/// policy or its Secret the data cannot be reached: a Warning event and `Expired=False`
/// say so, the data and the object stay, and it is retried.
///
/// # Guarantees
/// Deletes only a Backup whose own `ttl` ran out (by the operator's clock); its data goes
/// with it through the finalizer ([`on_delete`]) with reason `ttlExpired`.
///
/// # Errors
/// The API or the store failed; the policy or its Secret is missing (after the warning).
pub async fn expire(
    ctx: &Context,
    api: &Api<Backup>,
    backup: &Backup,
    policy: Option<&BackupPolicy>,
    ttl: &str,
) -> Result<Action, Error> {
    let Ok(ttl) = ttl.parse::<tidemark_core::RetentionDuration>() else {
        // The schema refuses this; an object from before it is left alone.
        return Ok(Action::await_change());
    };
    let Some(created) = backup.meta().creation_timestamp.as_ref().map(|t| t.0) else {
        return Ok(Action::await_change());
    };
    let expires = ttl.after(created);
    let now = ctx.clock.now();
    if now <= expires {
        let wait = now.duration_until(expires).unsigned_abs();
        return Ok(Action::requeue(
            wait.min(EXPIRY_RECHECK) + Duration::from_secs(1),
        ));
    }
    let reference = backup.object_ref(&());
    let status = backup.status.clone().unwrap_or_default();
    // A hold wins over the ttl, as it does over every retention rule: this object's
    // `tidemark.io/protect`, or another Backup's on the same backup.
    let ns = backup.namespace().unwrap_or_default();
    let held = backup
        .annotations()
        .get(crate::names::PROTECT_ANNOTATION)
        .is_some_and(|v| v == "true")
        || status.backup_id.as_ref().is_some_and(|id| {
            crate::holds::held_ids(
                ctx.backups.state().iter().map(AsRef::as_ref),
                &ns,
                &backup.spec.template.policy.name,
            )
            .contains(id)
        });
    if held {
        let message = format!(
            "expired by its ttl at {expires}, but {} holds it; it expires once the hold is removed",
            crate::names::PROTECT_ANNOTATION
        );
        set_status_condition(api, backup, EXPIRY_CONDITION, false, "Held", &message).await?;
        // Its own annotation's removal reconciles it at once; another object's is seen
        // by the next look.
        return Ok(Action::requeue(WAITING_RECHECK));
    }
    let blocked = |e: Error| async move {
        let message = format!(
            "expired by its ttl at {expires}, but its data cannot be reached, so it is kept (retried): {}",
            tidemark_engine::error::chain(&e)
        );
        ctx.warn(&backup.object_ref(&()), "BackupExpiryBlocked", &message)
            .await;
        set_status_condition(
            api,
            backup,
            EXPIRY_CONDITION,
            false,
            "StoreUnreachable",
            &message,
        )
        .await?;
        Err(e)
    };
    let Some(policy) = policy else {
        return blocked(Error::Missing(format!(
            "BackupPolicy {}/{} (spec.policy.name) does not exist",
            backup.namespace().unwrap_or_default(),
            backup.spec.template.policy.name
        )))
        .await;
    };
    // A hold released since the last pass leaves the store's record first: else the
    // deletion below would only mark the data.
    if let Err(e) = crate::holds::record_protected(ctx, backup, policy).await {
        return blocked(e).await;
    }
    let store = match crate::stores::open(ctx, policy).await {
        Ok(s) => s,
        Err(e) => return blocked(e).await,
    };
    if let Some(id) = status.backup_id.as_deref() {
        let catalog = match Catalog::load(&store, &NoProgress).await {
            Ok(c) => c,
            Err(e) => return blocked(Error::Engine(e.into())).await,
        };
        let inventory = catalog.inventory(&Default::default());
        let name = recorded_name(backup);
        if let Some(Err(keep)) = tidemark_core::requested_deletion(
            &inventory,
            &name,
            id,
            tidemark_core::Reason::TtlExpired,
            now,
        ) && keep.contains(&tidemark_core::Reason::Floor)
        {
            let message = format!(
                "expired by its ttl at {expires}, but it is the newest restorable backup, which never expires; it does once a newer one is"
            );
            set_status_condition(
                api,
                backup,
                EXPIRY_CONDITION,
                false,
                "NewestRestorable",
                &message,
            )
            .await?;
            return Ok(Action::requeue(WAITING_RECHECK));
        }
        // A chain's base: its data stays, marked, while committed increments build on it
        // (the object is deleted now and waits, Terminating, as `RemoteCleanup` says):
        // which, and until when, said here.
        if let Some(wait) = inventory.chain_wait(id) {
            let until = wait.until.map_or_else(
                || "one of them has no ttl, so until retention removes them, they are deleted, or the chain is consolidated".to_owned(),
                |u| format!("until the last of them goes: not before {u}, when its ttl ends (sooner if the chain is consolidated; later while it is the newest restorable backup or held)"),
            );
            let message = format!(
                "expired by its ttl at {expires}, but it is the base of {} committed increment(s), so its data stays, marked for deletion, {until}",
                wait.increments
            );
            set_status_condition(api, backup, EXPIRY_CONDITION, false, "ChainBase", &message)
                .await?;
        }
    }
    // The object goes, and its data with it: the finalizer first, then the deletion.
    let mut finalizers: Vec<String> = backup.finalizers().to_vec();
    if !finalizers.iter().any(|f| f == FINALIZER) {
        finalizers.push(FINALIZER.to_owned());
    }
    api.patch(
        &backup.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {
            "finalizers": finalizers,
            "annotations": {EXPIRED_ANNOTATION: now.to_string()},
            "resourceVersion": backup.resource_version(),
        }})),
    )
    .await?;
    ctx.event(
        &reference,
        EventType::Normal,
        "BackupExpired",
        &format!("its ttl ran out at {expires}: the Backup is deleted with its data"),
    )
    .await;
    api.delete(&backup.name_any(), &Default::default()).await?;
    Ok(Action::await_change())
}

/// Records a failed cleanup (condition and Warning event), and hands the error on for
/// the backoff.
async fn failed(
    ctx: &Context,
    api: &Api<Backup>,
    backup: &Backup,
    e: Error,
) -> Result<Action, Error> {
    let message = format!(
        "the remote data could not be deleted, so the finalizer {FINALIZER} stays (retried): {}",
        tidemark_engine::error::chain(&e)
    );
    ctx.warn(&backup.object_ref(&()), "RemoteCleanupFailed", &message)
        .await;
    set_condition(api, backup, false, "RemoteCleanupFailed", &message).await?;
    Err(e)
}

async fn set_condition(
    api: &Api<Backup>,
    backup: &Backup,
    ok: bool,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    set_status_condition(api, backup, CONDITION, ok, reason, message).await
}

/// Sets the condition `type_` on the Backup, keeping the rest of its status.
async fn set_status_condition(
    api: &Api<Backup>,
    backup: &Backup,
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    // As the API has it now (the cache may lag behind): whether it is said already.
    let status = api
        .get(&backup.name_any())
        .await?
        .status
        .unwrap_or_default();
    let want = if ok { "True" } else { "False" };
    if status
        .conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == want && c.reason == reason)
    {
        // Said already. Rewriting only the message (an error's text changes from one
        // try to the next) would trigger the next reconcile at once and defeat the
        // backoff.
        return Ok(());
    }
    let written = condition(
        &status.conditions,
        type_,
        ok,
        reason,
        message,
        backup.meta().generation,
    );
    // Only this condition, under a field manager of its own (`…-remotecleanup`,
    // `…-expired`): the rest of the status is other writers'.
    let manager = format!(
        "{}-{}",
        crate::status::FIELD_MANAGER,
        type_.to_ascii_lowercase()
    );
    crate::status::apply(
        api,
        &backup.name_any(),
        &manager,
        json!({ "conditions": [written] }),
    )
    .await
}

/// The backup name its status recorded (`status.key` is `<name>/<id>/metadata.json`),
/// else the one it would be written under.
fn recorded_name(backup: &Backup) -> String {
    let status = backup.status.as_ref();
    if let Some(r) = status
        .and_then(|s| s.data_removed.as_ref())
        .and_then(|r| r.replaced_by.as_ref())
        .filter(|r| tidemark_store::layout::is_backup_name(&r.backup_name))
    {
        return r.backup_name.clone();
    }
    status
        .and_then(|s| s.key.as_deref())
        .and_then(|k| k.split('/').next())
        .filter(|n| tidemark_store::layout::is_backup_name(n))
        .map_or_else(|| crate::names::store_name(backup), str::to_owned)
}

/// Whether a Backup being deleted may be cleaned up now: its attempt is not running (a
/// running one is followed to its end first, so that what is deleted is what it wrote).
pub fn settled(backup: &Backup) -> bool {
    backup
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_none_or(|p| p != BackupPhase::Running)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;
    use tidemark_api::crd::Backup;
    use tidemark_core::Reason;

    use super::{Cleanup, EXPIRED_ANNOTATION, SKIP_ANNOTATION, decide_cleanup, marked_condition};

    const ID: &str = "20261120T020000Z-3f2a9c1d";
    const FULL: &str = "20261121T020000Z-00000001";

    fn backup(annotations: serde_json::Value, status: serde_json::Value) -> Backup {
        serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": "b", "namespace": "ns", "annotations": annotations},
            "spec": {"policy": {"name": "db"}},
            "status": status,
        }))
        .unwrap()
    }

    /// The finalizer's decision, as a table: each kind of Backup and what it does.
    #[test]
    fn the_finalizer_decides_from_the_object_alone() {
        let done =
            json!({"phase": "completed", "backupId": ID, "key": format!("b/{ID}/metadata.json")});
        let removed = json!({"phase": "completed", "backupId": ID,
            "dataRemoved": {"at": "2026-11-22T00:00:00Z", "reasons": ["window"], "auditRecord": "c/_audit/x.json"}});
        let replaced = json!({"phase": "completed", "backupId": ID,
            "dataRemoved": {"at": "2026-11-22T00:00:00Z", "reasons": ["consolidated"],
                "replacedBy": {"backupName": "b", "backupId": FULL}}});
        let skip = json!({SKIP_ANNOTATION: "true"});
        let expired = json!({EXPIRED_ANNOTATION: "2026-11-22T00:00:00Z"});
        let delete = |id: &str, replaced, expired| Cleanup::Delete {
            id: id.into(),
            replaced,
            expired,
        };
        let cases = [
            (
                "skip",
                backup(skip.clone(), done.clone()),
                "RemoteCleanupSkipped",
            ),
            ("never started", backup(json!({}), json!({})), "-"),
            (
                "removed by retention",
                backup(json!({}), removed),
                "RemoteDataDeleted",
            ),
        ];
        for (what, b, reason) in cases {
            match decide_cleanup(&b) {
                Cleanup::Release { event } => {
                    assert_eq!(event.as_ref().map_or("-", |(r, _)| *r), reason, "{what}")
                }
                other => panic!("{what}: {other:?}"),
            }
        }
        assert_eq!(
            decide_cleanup(&backup(json!({}), done.clone())),
            delete(ID, false, false)
        );
        assert_eq!(
            decide_cleanup(&backup(expired.clone(), done)),
            delete(ID, false, true)
        );
        assert_eq!(
            decide_cleanup(&backup(expired, replaced.clone())),
            delete(FULL, true, true)
        );
        // The bypass wins over everything, a replacement included.
        assert!(matches!(
            decide_cleanup(&backup(skip, replaced)),
            Cleanup::Release {
                event: Some(("RemoteCleanupSkipped", _))
            }
        ));
    }

    #[test]
    fn a_marked_backup_says_why_its_data_stays() {
        let (reason, message) = marked_condition(ID, &[Reason::Floor]);
        assert_eq!(reason, "LastRestorableBackup");
        assert!(message.contains("last restorable backup") && message.contains(SKIP_ANNOTATION));
        let (reason, message) = marked_condition(ID, &[Reason::Chain(FULL.into())]);
        assert_eq!(reason, "WaitingForRetention");
        assert!(message.contains(&format!("chain:{FULL}")), "{message}");
    }
}
