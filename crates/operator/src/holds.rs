//! Holds: a Backup annotated `tidemark.io/protect: "true"` keeps its backup (and what it
//! needs) from retention, expiry and history pruning.

use std::collections::HashSet;

use kube::ResourceExt;

use tidemark_store::state::Gate;

use crate::context::Context;

/// The backup-ids on hold: Backups of this policy annotated `tidemark.io/protect: "true"`.
pub fn holds(ctx: &Context, ns: &str, policy: &str) -> HashSet<String> {
    held_ids(ctx.backups.state().iter().map(AsRef::as_ref), ns, policy)
}

/// A Backup whose `tidemark.io/protect: "true"` the store's record of holds does not
/// reflect — placed since, or removed since: the record is written now
/// (`_state/holds.json`, under the store's lease, the gate as recorded), so a deleter with
/// only the store keeps it from this moment, and lets it go once released, not from the
/// policy's next pass (seed 000).
///
/// # Errors
/// The store, its lease or the API failed (the next pass records it anyway).
pub async fn record_protected(
    ctx: &Context,
    backup: &tidemark_api::crd::Backup,
    policy: &tidemark_api::crd::BackupPolicy,
) -> Result<(), crate::error::Error> {
    let protected = backup
        .annotations()
        .get(crate::names::PROTECT_ANNOTATION)
        .map(String::as_str)
        == Some("true");
    let Some(id) = restore_point_id(backup) else {
        return Ok(());
    };
    let (ns, name) = (policy.namespace().unwrap_or_default(), policy.name_any());
    // Another Backup of the policy may hold the same backup.
    let others = held_ids(
        ctx.backups
            .state()
            .iter()
            .map(AsRef::as_ref)
            .filter(|b| b.uid() != backup.uid()),
        &ns,
        &name,
    );
    let want = protected || others.contains(&id);
    let store = crate::stores::open(ctx, policy).await?;
    let recorded = tidemark_store::state::load_holds(&store)
        .await
        .map_err(|e| crate::error::Error::Engine(e.into()))?;
    let has = recorded.as_ref().is_some_and(|h| h.protect.contains(&id));
    if has == want || (recorded.is_none() && !want) {
        return Ok(());
    }
    let mut protect = others;
    if want {
        protect.insert(id);
    }
    save_under_lease(ctx, &store, (&ns, &name), protect, Gate::Keep).await
}

/// Records the holds of `policy` in `ns` — `protect` and the Restores' read now — and
/// `gate` in the store (`_state/holds.json`), under its lease, between passes.
///
/// # Errors
/// The store, its lease or the API failed.
pub async fn save_under_lease(
    ctx: &Context,
    store: &tidemark_store::ClusterStore,
    (ns, policy): (&str, &str),
    protect: HashSet<String>,
    gate: Gate<'_>,
) -> Result<(), crate::error::Error> {
    let fence = crate::fence::acquire(ctx, store).await?;
    let written = async {
        let restores = read_restore_holds(ctx, ns, policy).await?;
        let writer = format!("tidemark-operator {ns}/{policy}");
        fence
            .guard(async {
                tidemark_store::state::save_holds(store, &writer, &protect, &restores, gate)
                    .await?;
                Ok::<_, tidemark_engine::EngineError>(())
            })
            .await
            .map_err(crate::error::Error::Engine)
    }
    .await;
    fence.release().await;
    written
}

/// The backup-ids `backups` hold for `policy` in `ns` (`tidemark.io/protect: "true"`).
pub fn held_ids<'a>(
    backups: impl Iterator<Item = &'a tidemark_api::crd::Backup>,
    ns: &str,
    policy: &str,
) -> HashSet<String> {
    backups
        .filter(|b| b.namespace().as_deref() == Some(ns) && b.spec.template.policy.name == policy)
        .filter(|b| {
            b.annotations()
                .get(crate::names::PROTECT_ANNOTATION)
                .map(String::as_str)
                == Some("true")
        })
        .filter_map(restore_point_id)
        .collect()
}

/// The backup-id that holds `b`'s restore point: its own, or, once consolidation merged it,
/// the synthetic full's that stands in for it.
pub fn restore_point_id(b: &tidemark_api::crd::Backup) -> Option<String> {
    let s = b.status.as_ref()?;
    s.data_removed
        .as_ref()
        .and_then(|r| r.replaced_by.as_ref())
        .map(|r| r.backup_id.clone())
        .or_else(|| s.backup_id.clone())
}

/// The holds of restores (pure): each Restore of `policy` in `ns` that has not finished
/// (`Succeeded` or `Failed`) holds every backup its plan uses and the backup it names
/// (`spec.target.backupId`, or `backup` resolved through `backups` before its plan is
/// made), by its name (reason `restore:<name>`). Deleting the Restore, or its end,
/// releases them.
pub fn restore_holds<'a>(
    restores: impl Iterator<Item = &'a tidemark_api::crd::Restore>,
    backups: &[&tidemark_api::crd::Backup],
    ns: &str,
    policy: &str,
) -> Vec<tidemark_core::RestoreHold> {
    restore_holds_in(restores, backups, ns, policy, None)
}

/// [`restore_holds`] of the restores that read the store `from` names: the policy's own
/// (`None`), or its copy of that name (a Restore's `spec.from`) — each store holds what
/// the restores from it need.
pub fn restore_holds_in<'a>(
    restores: impl Iterator<Item = &'a tidemark_api::crd::Restore>,
    backups: &[&tidemark_api::crd::Backup],
    ns: &str,
    policy: &str,
    from: Option<&str>,
) -> Vec<tidemark_core::RestoreHold> {
    let mut holds = Vec::new();
    for r in restores.filter(|r| {
        r.namespace().as_deref() == Some(ns)
            && r.spec.policy.name == policy
            && r.spec.from.as_deref() == from
    }) {
        let status = r.status.clone().unwrap_or_default();
        if status.finished() {
            continue;
        }
        let mut ids: Vec<String> = status.backups.clone();
        let target = &r.spec.target;
        ids.extend(target.backup_id.iter().cloned());
        if let Some(name) = &target.backup {
            ids.extend(backup_id_of_name(backups, ns, policy, name));
        }
        ids.sort();
        ids.dedup();
        let by = r.name_any();
        holds.extend(ids.into_iter().map(|backup_id| tidemark_core::RestoreHold {
            backup_id,
            by: by.clone(),
        }));
    }
    holds
}

/// The backup-id of the Backup object `name` of `policy` (or of the synthetic full that
/// holds its restore point now).
fn backup_id_of_name(
    backups: &[&tidemark_api::crd::Backup],
    ns: &str,
    policy: &str,
    name: &str,
) -> Option<String> {
    let b = backups.iter().find(|b| {
        b.namespace().as_deref() == Some(ns)
            && b.name_any() == name
            && b.spec.template.policy.name == policy
    })?;
    restore_point_id(b)
}

/// Who writes a store's record of holds: the operator for `policy`, in its own store or
/// in its copy `from`.
pub fn writer(ns: &str, policy: &str, from: Option<&str>) -> String {
    match from {
        None => format!("tidemark-operator {ns}/{policy}"),
        Some(c) => format!("tidemark-operator {ns}/{policy} copy {c}"),
    }
}

/// The holds of `policy`'s restores now, from the API (a Restore made a moment ago
/// counts).
///
/// # Errors
/// The Restores could not be listed: a pass that cannot know what restores need deletes
/// nothing.
pub async fn read_restore_holds(
    ctx: &Context,
    ns: &str,
    policy: &str,
) -> Result<Vec<tidemark_core::RestoreHold>, crate::error::Error> {
    read_restore_holds_in(ctx, ns, policy, None).await
}

/// [`read_restore_holds`] of the restores that read the store `from` names (the policy's
/// own, or a copy's).
///
/// # Errors
/// The Restores could not be listed.
pub async fn read_restore_holds_in(
    ctx: &Context,
    ns: &str,
    policy: &str,
    from: Option<&str>,
) -> Result<Vec<tidemark_core::RestoreHold>, crate::error::Error> {
    let api: kube::Api<tidemark_api::crd::Restore> = kube::Api::namespaced(ctx.client.clone(), ns);
    let restores = crate::lean::list(
        &api,
        &kube::api::ListParams::default(),
        crate::lean::meta_of,
    )
    .await?;
    let cached = ctx.backups.state();
    let backups: Vec<&tidemark_api::crd::Backup> = cached.iter().map(AsRef::as_ref).collect();
    Ok(restore_holds_in(
        restores.iter(),
        &backups,
        ns,
        policy,
        from,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn restore(
        name: &str,
        policy: &str,
        target: serde_json::Value,
        status: serde_json::Value,
    ) -> tidemark_api::crd::Restore {
        serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Restore",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"policy": {"name": policy}, "target": target, "into": {"claim": "c"}},
            "status": status,
        }))
        .unwrap()
    }

    /// What each Restore holds, by its state: its plan and the backup it names until it
    /// has finished; nothing of another policy.
    #[test]
    fn restores_hold_what_they_need_while_they_need_it() {
        let backup: tidemark_api::crd::Backup = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": "nightly-1", "namespace": "ns"},
            "spec": {"policy": {"name": "db"}},
            "status": {"phase": "completed", "backupId": "B1"},
        }))
        .unwrap();
        let restores = [
            restore(
                "running",
                "db",
                json!({}),
                json!({"phase": "Running", "backups": ["F", "I1"]}),
            ),
            restore(
                "done",
                "db",
                json!({"to": "2026-11-27T00:00:00Z"}),
                json!({"phase": "Succeeded", "backups": ["F"]}),
            ),
            restore(
                "named-failed",
                "db",
                json!({"backupId": "B9"}),
                json!({"phase": "Failed", "backups": ["B9"]}),
            ),
            restore("named-new", "db", json!({"backup": "nightly-1"}), json!({})),
            restore(
                "by-id-pending",
                "db",
                json!({"backupId": "B2"}),
                json!({"phase": "Pending"}),
            ),
            restore(
                "other",
                "other-db",
                json!({}),
                json!({"phase": "Running", "backups": ["X"]}),
            ),
        ];
        let holds = restore_holds(restores.iter(), &[&backup], "ns", "db");
        let got: Vec<(String, String)> = holds.into_iter().map(|h| (h.by, h.backup_id)).collect();
        let want: Vec<(String, String)> = [
            ("running", "F"),
            ("running", "I1"),
            ("named-new", "B1"),
            ("by-id-pending", "B2"),
        ]
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
        assert_eq!(got, want);
    }
}
