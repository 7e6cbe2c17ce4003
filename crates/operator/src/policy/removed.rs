//! Step 7's report on the Backup objects whose data a pass deleted.

use std::collections::HashSet;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{DataRemoved, StoredBackup};
use tidemark_engine::PassOutcome;

use crate::context::Context;

/// Records on each Backup object of `policy` whose data the pass deleted when, why and
/// under which audit record (`status.dataRemoved`): the object stays and says so (a pass
/// deletes data; the object goes only by its ScheduledBackup's history, `history.rs`, and
/// one made by hand never). A failure to record is logged; the data is gone either way,
/// and the next pass does not see it again. A backup that consolidation merged names the
/// synthetic full (`mergedInto`), and the one whose restore point that full holds now
/// follows it (`replacedBy`): when the full goes, so does the replacement.
pub(super) async fn record_removed(
    ctx: &Context,
    ns: &str,
    policy: &str,
    outcome: &PassOutcome,
    audit: Option<&str>,
    now: Timestamp,
) {
    let Some(report) = outcome.executed.as_ref() else {
        return;
    };
    let gone: HashSet<&str> = report.backups_deleted.iter().map(String::as_str).collect();
    if gone.is_empty() {
        return;
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
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(backup = %b.name_any(), "could not record that its data was removed: {e}");
            }
        }
    }
}

/// Seed 002's immutable chains: "it will only delete the backup CR … once the expiration
/// date is reached". Deletes the Backup objects of `policy` whose backup is recorded as
/// expired in the store (its lock ended; its objects are left to the bucket's lifecycle
/// rule) — by this pass or any earlier one, `tidemark gc` included, so one a failed
/// delete or a restart left behind goes at the next pass. Each first says so in
/// `status.dataRemoved` (reason `expired`), so a `deletionPolicy: Delete` finalizer lets
/// it go as one whose data retention removed (no second deletion, no hook again). A
/// failure is logged and retried at the next pass.
pub(super) async fn delete_expired(
    ctx: &Context,
    ns: &str,
    policy: &str,
    outcome: &PassOutcome,
    audit: Option<&str>,
    now: Timestamp,
) {
    let expired: HashSet<&str> = outcome
        .survey
        .catalog
        .expired
        .iter()
        .map(|e| e.backup_id.as_str())
        .chain(
            outcome
                .executed
                .iter()
                .flat_map(|r| r.backups_expired.iter().map(String::as_str)),
        )
        .collect();
    if expired.is_empty() {
        return;
    }
    let api: Api<tidemark_api::crd::Backup> = Api::namespaced(ctx.client.clone(), ns);
    let mut deleted = Vec::new();
    for b in ctx.backups.state() {
        let status = b.status.as_ref();
        let ours = b.namespace().as_deref() == Some(ns)
            && b.spec.template.policy.name == policy
            && b.meta().deletion_timestamp.is_none()
            && status
                .and_then(|s| s.backup_id.as_deref())
                .is_some_and(|id| expired.contains(id));
        if !ours {
            continue;
        }
        if status.is_some_and(|s| s.data_removed.is_none()) {
            let record = json!({ "dataRemoved": {
                "at": Time(now),
                "reasons": ["expired", "leftToBucketLifecycle"],
                "auditRecord": audit,
            }});
            if let Err(e) = crate::status::merge(
                &api,
                &b.name_any(),
                crate::status::DATA_REMOVED_MANAGER,
                record,
            )
            .await
            {
                tracing::warn!(backup = %b.name_any(), "could not record that its chain expired: {e}");
                continue;
            }
        }
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: b.uid(),
                resource_version: None,
            }),
            ..kube::api::DeleteParams::default()
        };
        match api.delete(&b.name_any(), &params).await {
            Ok(_) => deleted.push(b.name_any()),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                tracing::warn!(backup = %b.name_any(), "could not delete the Backup of an expired chain: {e}");
            }
        }
    }
    if !deleted.is_empty() {
        tracing::info!(policy, deleted = ?deleted, "deleted the Backup objects of expired locked chains");
    }
}
