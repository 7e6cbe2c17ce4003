//! Holds: a Backup annotated `tidemark.io/protect: "true"` keeps its backup (and what it
//! needs) from retention, expiry and history pruning.

use std::collections::HashSet;

use kube::ResourceExt;

use crate::context::Context;

/// The backup-ids on hold: Backups of this policy annotated `tidemark.io/protect: "true"`.
pub fn holds(ctx: &Context, ns: &str, policy: &str) -> HashSet<String> {
    held_ids(ctx.backups.state().iter().map(AsRef::as_ref), ns, policy)
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
        // An object whose restore point a synthetic full holds now holds that full.
        .filter_map(|b| {
            let s = b.status.as_ref()?;
            s.data_removed
                .as_ref()
                .and_then(|r| r.replaced_by.as_ref())
                .map(|r| r.backup_id.clone())
                .or_else(|| s.backup_id.clone())
        })
        .collect()
}
