//! A requested deletion of one backup (seed 000's finalizer, seed 004's TTL, `tidemark
//! delete`): that backup alone, audit record first — unless a recovery depends on it.
//! Then it is marked (`_deletion-requested.json`, seed 002's delete-then-consolidate): no
//! retention rule keeps it any more, and a pass removes it (or merges its chain into a
//! synthetic full) once that is safe.

use std::sync::Arc;

use jiff::Timestamp;
use tidemark_core::Reason;
use tidemark_store::executor::{ExecOptions, ExecutionReport, mark_for_deletion};
use tidemark_store::{Catalog, ClusterStore, NoProgress, Survey};

use crate::error::{Class, EngineError};
use crate::fence::Fence;
use crate::pass::DeleteHooks;

/// What to delete, and who asks.
#[derive(Debug, Clone)]
pub struct DeleteRequest {
    /// `<backup-name>` and `<backup-id>`: the backup's directory.
    pub name: String,
    pub id: String,
    /// [`Reason::DeletionRequested`] or [`Reason::TtlExpired`] (the audit record says it).
    pub reason: Reason,
    /// Who asks (`Backup ns/name`, `tidemark delete`), in the audit record and the mark.
    pub requested_by: String,
    /// More fields of the audit record.
    pub audit_extra: serde_json::Map<String, serde_json::Value>,
    pub now: Timestamp,
    /// The DeleteHooks to run right before the data goes (seed 003) — never when the
    /// backup is only marked: they run when a pass finally deletes it.
    pub hooks: Option<Arc<dyn DeleteHooks>>,
    /// What becomes of a deletion that hooks `hooks` cannot run select.
    pub recorded_hooks: RecordedHooks,
}

pub use crate::pass::RecordedHooks;

/// What a requested deletion did.
#[derive(Debug)]
pub enum Requested {
    /// No such backup in the store (already deleted): nothing to do.
    Absent,
    /// A recovery depends on it: marked, not deleted; the reasons it stays.
    Marked(Vec<Reason>),
    /// Deleted, audit record first.
    Deleted(ExecutionReport),
}

/// Deletes the backup `request` names from the fence's store, or marks it when a recovery
/// depends on it. Its hooks run right before its data goes, and only then.
///
/// # Guarantees
/// Only under `fence` (the store's lease): nothing is marked or deleted once it is lost.
/// Those of [`tidemark_store::execute`]: the audit record first, metadata before payload.
/// Whether it is deleted or marked is decided again after its hooks ran (they may take
/// long; a hold placed meanwhile is honoured).
///
/// # Errors
/// The store failed; objects that could not be deleted after retries (class Store, the
/// first named): run it again to finish; the fence was lost; hooks that cannot run here
/// select it and the request refuses them (class Input).
pub async fn delete_requested(
    fence: &Fence,
    request: &DeleteRequest,
) -> Result<Requested, EngineError> {
    fence.guard(delete_under(fence.store(), request)).await
}

/// What a requested deletion would do now (read only): see [`decide_requested`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No such backup in the store.
    Absent,
    /// A recovery depends on it, or a hold: it would be marked, for these reasons.
    Keep(Vec<Reason>),
    /// Its data would go.
    Delete,
}

/// What [`delete_requested`] would do with `request` now, changing nothing: a caller that
/// runs slow hooks itself (the operator's finalizer) runs them only for data that goes,
/// outside the lease, then asks for the deletion (decided again).
///
/// # Errors
/// The store failed; the fence was lost.
pub async fn decide_requested(
    fence: &Fence,
    request: &DeleteRequest,
) -> Result<Decision, EngineError> {
    fence
        .guard(async {
            Ok(match decide(fence.store(), request, &[]).await? {
                None => Decision::Absent,
                Some((_, Err(keep))) => Decision::Keep(keep),
                Some((_, Ok(_))) => Decision::Delete,
            })
        })
        .await
}

/// The decision on a requested deletion from what the store holds now: the plan that
/// deletes it, or the reasons it stays.
async fn decide(
    store: &ClusterStore,
    request: &DeleteRequest,
    more_holds: &[Reason],
) -> Result<Option<(Catalog, Result<tidemark_core::Plan, Vec<Reason>>)>, EngineError> {
    let catalog = Catalog::load(store, &NoProgress).await?;
    let inventory = catalog.inventory(&Default::default());
    let planned = tidemark_core::requested_deletion(
        &inventory,
        &request.name,
        &request.id,
        request.reason.clone(),
        request.now,
    );
    // A hold recorded in the store (the operator's protected Backups and Restores) keeps
    // the data as a recovery does: marked, deleted by a pass once nothing holds it.
    let mut held: Vec<Reason> = match tidemark_store::state::load_holds(store).await? {
        Some(stored) => {
            let (protect, restores) = stored.into_pass_holds();
            protect
                .contains(&request.id)
                .then_some(Reason::Protected)
                .into_iter()
                .chain(
                    restores
                        .into_iter()
                        .filter(|r| r.backup_id == request.id)
                        .map(|r| Reason::Restore(r.by)),
                )
                .collect()
        }
        None => Vec::new(),
    };
    // A copy that has not received it yet keeps it, as a retention pass does: a deletion
    // by hand does not take a recovery point from the copy before it arrived.
    if let Some(b) = inventory
        .backups
        .iter()
        .find(|b| b.name == request.name && b.id == request.id)
    {
        let floors: Vec<_> = tidemark_store::state::load_copies(store)
            .await?
            .iter()
            .map(tidemark_store::state::CopyRecord::floor)
            .collect();
        let mut one = [b.clone()];
        tidemark_core::copies::mark_awaiting(&mut one, &floors);
        held.extend(one[0].awaiting_copy.iter().cloned().map(Reason::Copy));
    }
    held.extend(more_holds.iter().cloned());
    Ok(match planned {
        None => None,
        Some(Ok(_)) if !held.is_empty() => Some((catalog, Err(held))),
        Some(other) => Some((catalog, other)),
    })
}

async fn delete_under(
    store: &ClusterStore,
    request: &DeleteRequest,
) -> Result<Requested, EngineError> {
    let mut audit_hooks: Vec<serde_json::Value> = Vec::new();
    let mut hooks_ran = false;
    let mut more_holds: Vec<Reason> = Vec::new();
    loop {
        let (catalog, plan) = match decide(store, request, &more_holds).await? {
            None => return Ok(Requested::Absent),
            Some((_, Err(keep))) => {
                mark_for_deletion(
                    store,
                    &request.name,
                    &request.id,
                    &request.requested_by,
                    request.now,
                )
                .await?;
                return Ok(Requested::Marked(keep));
            }
            Some((catalog, Ok(plan))) => (catalog, plan),
        };
        if request.recorded_hooks != RecordedHooks::RunByCaller && !hooks_ran {
            let deleting: Vec<(&str, &str)> = plan
                .deletions()
                .map(|d| (d.backup.name.as_str(), d.backup.id.as_str()))
                .collect();
            let stored = crate::pass::stored_hooks(store, request.recorded_hooks).await?;
            if let Some(skipped) = crate::pass::recorded_hooks(
                &stored,
                &catalog,
                &deleting,
                request.recorded_hooks,
                request.hooks.as_deref(),
            )? {
                audit_hooks.extend(skipped);
            }
        }
        if let Some(hooks) = request.hooks.as_ref().filter(|_| !hooks_ran) {
            // Right before the data goes: the hooks of what this deletion takes.
            let deleting: Vec<(
                tidemark_core::Backup,
                Option<tidemark_store::format::Metadata>,
            )> = plan
                .deletions()
                .map(|d| {
                    let meta = catalog
                        .backup(&d.backup.name, &d.backup.id)
                        .and_then(|b| b.metadata.clone());
                    (d.backup.clone(), meta)
                })
                .collect();
            drop((catalog, plan));
            let borrowed: Vec<_> = deleting.iter().map(|(b, m)| (b, m.as_ref())).collect();
            audit_hooks.extend(hooks.before_delete(store, &borrowed).await);
            hooks_ran = true;
            // Decided again with the holds in force now (the store's are read again).
            if hooks.holds().await.is_some_and(|h| h.contains(&request.id)) {
                more_holds.push(Reason::Protected);
            }
            more_holds.extend(
                hooks
                    .restore_holds()
                    .await
                    .into_iter()
                    .flatten()
                    .filter(|r| r.backup_id == request.id)
                    .map(|r| Reason::Restore(r.by)),
            );
            continue;
        }
        let survey = Survey {
            inventory: catalog.inventory(&Default::default()),
            catalog,
            segments: Default::default(),
            plan,
        };
        let mut options = ExecOptions::new(
            request.now,
            serde_json::json!({ "deletionRequestedBy": request.requested_by }),
        );
        options.audit_extra.clone_from(&request.audit_extra);
        if !audit_hooks.is_empty() {
            options
                .audit_extra
                .insert("hooks".into(), serde_json::Value::Array(audit_hooks));
        }
        // The deletion guard's count of what the last pass left goes down with it first:
        // a deletion by hand is no listing that lost backups.
        let mut guard = tidemark_store::state::load_guard(store).await?;
        if let Some(last) = guard.last.as_mut().filter(|l| l.restorable > 0) {
            last.restorable -= 1;
            tidemark_store::state::save_guard(store, &guard).await?;
        }
        let report = tidemark_store::execute(store, &survey, &options, &NoProgress).await?;
        if let Some(f) = report.failures.first() {
            return Err(EngineError::Edge {
                class: Class::Store,
                message: format!(
                    "{} object(s) of backup {} could not be deleted, e.g. {}: {}",
                    report.failures.len(),
                    request.id,
                    f.key,
                    f.error
                ),
            });
        }
        return Ok(Requested::Deleted(report));
    }
}

#[cfg(test)]
mod tests {
    use jiff::{SignedDuration, Timestamp};
    use tidemark_store::synth;

    use super::*;
    use crate::fence::test_fence as fence;

    fn request(name: &str, id: &str, now: Timestamp) -> DeleteRequest {
        DeleteRequest {
            recorded_hooks: RecordedHooks::Refuse,
            hooks: None,
            name: name.into(),
            id: id.into(),
            reason: Reason::DeletionRequested,
            requested_by: "test".into(),
            audit_extra: Default::default(),
            now,
        }
    }

    /// A requested deletion, by what the store holds: gone, deleted (audit record first),
    /// or marked while a recovery depends on it.
    #[tokio::test]
    async fn a_requested_deletion_deletes_marks_or_finds_nothing() {
        let (_dir, store) = tidemark_store::testkit::local_store("c");
        let now = Timestamp::now();
        let (old, new) = synth::older_and_newer(&store, "old", "new", now)
            .await
            .unwrap();
        let f = fence(&store).await;
        let missing = synth::backup_id(now - SignedDuration::from_hours(9), 9);
        assert!(matches!(
            delete_requested(&f, &request("old", &missing, now))
                .await
                .unwrap(),
            Requested::Absent
        ));
        match delete_requested(&f, &request("old", &old.id, now))
            .await
            .unwrap()
        {
            Requested::Deleted(r) => {
                assert_eq!(r.backups_deleted, vec![old.id.clone()]);
                assert!(r.audit_key.is_some());
            }
            other => panic!("{other:?}"),
        }
        // The last restorable backup stays, marked.
        match delete_requested(&f, &request("new", &new.id, now))
            .await
            .unwrap()
        {
            Requested::Marked(keep) => assert_eq!(keep, vec![Reason::Floor]),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            synth::metadata_ids(&store).await.unwrap(),
            vec![new.id.clone()]
        );
        f.release().await;
    }

    /// Another's fence on the store: this one cannot be had, and a fence on another store
    /// deletes nothing here.
    #[tokio::test]
    async fn a_deletion_needs_the_stores_own_fence() {
        let (_dir, store) = tidemark_store::testkit::local_store("c");
        let now = Timestamp::now();
        let (old, _) = synth::older_and_newer(&store, "old", "new", now)
            .await
            .unwrap();
        let (_other_dir, other) = tidemark_store::testkit::local_store("c");
        let elsewhere = fence(&other).await;
        // The request goes to the fence's store, where the backup is not.
        assert!(matches!(
            delete_requested(&elsewhere, &request("old", &old.id, now))
                .await
                .unwrap(),
            Requested::Absent
        ));
        assert_eq!(synth::metadata_ids(&store).await.unwrap().len(), 2);
    }
}
