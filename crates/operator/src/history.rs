//! Backup objects do not grow without bound: once retention removed a backup's data
//! (`status.dataRemoved`), its object only says so, and after each retention pass the
//! objects beyond the history limit or age go — per ScheduledBackup with its own
//! `backupHistory`, else per policy (default: the 10 most recently removed). Their Jobs
//! go with them (owner references). Objects whose data is still in the store are never
//! touched here.

use std::collections::BTreeMap;

use jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::{Backup, BackupPolicy, ScheduledBackup};
use tidemark_api::policy::{BackupHistory, DEFAULT_HISTORY_LIMIT};
use tidemark_api::schedule::SCHEDULED_BACKUP_LABEL;
use tidemark_core::RetentionDuration;

use crate::context::Context;

/// One Backup object whose data is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Removed {
    pub name: String,
    /// The ScheduledBackup whose `backupHistory` governs it; `None`: the policy's.
    pub group: Option<String>,
    pub at: Timestamp,
}

/// The objects to delete: in each group, those beyond `limit` (the most recently removed
/// stay) and those removed longer than `max_age` ago.
pub(crate) fn beyond(
    removed: &[Removed],
    settings: impl Fn(Option<&str>) -> (u32, Option<RetentionDuration>),
    now: Timestamp,
) -> Vec<String> {
    let mut groups: BTreeMap<Option<&str>, Vec<&Removed>> = BTreeMap::new();
    for r in removed {
        groups.entry(r.group.as_deref()).or_default().push(r);
    }
    let mut out = Vec::new();
    for (group, mut members) in groups {
        let (limit, max_age) = settings(group);
        members.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| a.name.cmp(&b.name)));
        for (i, r) in members.iter().enumerate() {
            let too_old = max_age.is_some_and(|age| age.after(r.at) <= now);
            if i >= limit as usize || too_old {
                out.push(r.name.clone());
            }
        }
    }
    out.sort();
    out
}

/// Deletes `policy`'s Backup objects beyond their history (after a retention pass;
/// `just_recorded` were marked removed at `now` by that pass, which the watch cache may
/// not show yet). A failure is logged; the next pass tries again.
///
/// # Guarantees
/// Deletes only Backup objects of `policy` whose data is gone, beyond the history it keeps.
pub(crate) async fn prune(
    ctx: &Context,
    policy: &BackupPolicy,
    just_recorded: &[String],
    now: Timestamp,
) {
    let ns = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let removed_objects: Vec<std::sync::Arc<Backup>> = ctx
        .backups
        .state()
        .into_iter()
        .filter(|b| {
            b.namespace().as_deref() == Some(ns.as_str())
                && b.spec.template.policy.name == name
                && b.meta().deletion_timestamp.is_none()
                // A held object stays (`tidemark.io/protect`), as its backup would.
                && b.annotations().get(crate::names::PROTECT_ANNOTATION).map(String::as_str)
                    != Some("true")
                // One whose restore point a synthetic full holds stands for live data.
                && (b.status.as_ref().is_some_and(|s| {
                    s.data_removed.as_ref().is_some_and(|r| r.replaced_by.is_none())
                }) || just_recorded.contains(&b.name_any()))
        })
        .collect();
    if removed_objects.is_empty() {
        return;
    }
    // The schedules with a history of their own (one list, only when there is work).
    let schedules: Api<ScheduledBackup> = Api::namespaced(ctx.client.clone(), &ns);
    let own: BTreeMap<String, BackupHistory> = match crate::lean::list(
        &schedules,
        &ListParams::default(),
        crate::lean::schedule,
    )
    .await
    {
        Ok(list) => list
            .into_iter()
            .filter(|s| s.spec.template.policy.name == name)
            .filter_map(|s| Some((s.name_any(), s.spec.backup_history?)))
            .collect(),
        Err(e) => {
            tracing::warn!(policy = %name, "backup history: could not list ScheduledBackups: {e}");
            return;
        }
    };
    // As recorded: `Time` keeps whole seconds.
    let recorded_at = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let removed: Vec<Removed> = removed_objects
        .iter()
        .map(|b| {
            let at = b
                .status
                .as_ref()
                .and_then(|s| s.data_removed.as_ref())
                .map_or(recorded_at, |r| r.at.0);
            let group = b
                .labels()
                .get(SCHEDULED_BACKUP_LABEL)
                .filter(|s| own.contains_key(s.as_str()))
                .cloned();
            Removed {
                name: b.name_any(),
                group,
                at,
            }
        })
        .collect();
    let fallback = (DEFAULT_HISTORY_LIMIT, None);
    // Invalid settings were refused when the policy or schedule was reconciled; here they
    // keep everything rather than guess.
    let keep_all = (u32::MAX, None);
    let settings = |group: Option<&str>| {
        let history = match group {
            Some(s) => own.get(s),
            None => policy.spec.backup_history.as_ref(),
        };
        history.map_or(fallback, |h| h.settings().unwrap_or(keep_all))
    };
    let doomed = beyond(&removed, settings, now);
    if doomed.is_empty() {
        return;
    }
    let api: Api<Backup> = Api::namespaced(ctx.client.clone(), &ns);
    let mut deleted = Vec::new();
    for name in &doomed {
        let uid = removed_objects
            .iter()
            .find(|b| &b.name_any() == name)
            .and_then(|b| b.uid());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid,
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => deleted.push(name.as_str()),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => tracing::warn!(backup = %name, "backup history: could not delete: {e}"),
        }
    }
    if !deleted.is_empty() {
        tracing::info!(policy = %name, deleted = ?deleted, "backup history: deleted Backup objects whose data retention removed");
        ctx.event(
            &policy.object_ref(&()),
            EventType::Normal,
            "BackupHistoryPruned",
            &format!(
                "deleted {} Backup object(s) whose data retention removed, beyond the history limit or age: {}",
                deleted.len(),
                deleted.join(", ")
            ),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn r(name: &str, group: Option<&str>, day: u32) -> Removed {
        Removed {
            name: name.into(),
            group: group.map(str::to_owned),
            at: format!("2026-11-{day:02}T03:00:00Z").parse().unwrap(),
        }
    }

    #[test]
    fn each_group_keeps_its_newest_and_drops_the_old() {
        let removed = vec![
            r("a1", None, 1),
            r("a2", None, 2),
            r("a3", None, 3),
            r("n1", Some("nightly"), 1),
            r("n2", Some("nightly"), 2),
            r("n3", Some("nightly"), 20),
        ];
        let now: Timestamp = "2026-11-21T00:00:00Z".parse().unwrap();
        // The policy keeps 2; the schedule any number, but none removed over 7 days ago.
        let week: RetentionDuration = "7d".parse().unwrap();
        let settings = |g: Option<&str>| match g {
            None => (2, None),
            Some(_) => (u32::MAX, Some(week)),
        };
        assert_eq!(beyond(&removed, settings, now), vec!["a1", "n1", "n2"]);
        // Limit 0: every one goes.
        assert_eq!(beyond(&removed, |_| (0, None), now).len(), 6);
        // Within both: none.
        assert!(beyond(&removed, |_| (10, None), now).is_empty());
    }
}
