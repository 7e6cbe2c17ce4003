//! One planning pass over a store: list, read, plan — the observe and plan steps.

use std::collections::HashSet;

use jiff::Timestamp;
use tidemark_core::{Action, Inventory, Plan, Policy, plan};

use crate::catalog::{Catalog, SegmentListing, list_segments};
use crate::error::StoreError;
use crate::open::ClusterStore;
use crate::progress::Progress;

/// Inputs to a pass besides the policy.
#[derive(Debug, Clone, Default)]
pub struct SurveyOptions {
    /// Backup-ids placed on hold for this pass (`--protect`).
    pub protect: HashSet<String>,
    /// Backups restores need (the operator's Restore objects).
    pub restores: Vec<tidemark_core::RestoreHold>,
    /// How far each copy of the store has come (`_state/copies/`): what a copy has not
    /// dealt with yet is kept (`copy:<name>`).
    pub copies: Vec<tidemark_core::copies::CopyFloor>,
    /// Backup-ids the deletion guard holds (`deletionGuard`).
    pub guarded: HashSet<String>,
}

/// What a pass saw and what it plans.
#[derive(Debug)]
pub struct Survey {
    pub catalog: Catalog,
    pub segments: SegmentListing,
    pub inventory: Inventory,
    pub plan: Plan,
}

/// The plan of `policy`, keeping what a copy has not received yet.
pub fn plan_for(
    policy: &Policy,
    inventory: &Inventory,
    now: Timestamp,
    copies: &[tidemark_core::copies::CopyFloor],
) -> Plan {
    let mut p = plan(policy, inventory, now);
    tidemark_core::copies::keep_segments_for_copies(&mut p, copies);
    p
}

/// Lists the store and plans a pass.
///
/// Segment objects are listed only below the first indexed segment the pass keeps: a
/// first plan from the index alone finds the horizon, the listing finds orphans and
/// unindexed leftovers behind it, and the final plan uses both. So a pass over an archive
/// of a million segments lists what it deletes, not the archive.
///
/// # Errors
/// Store requests that fail after retries; a malformed or newer `_index.json`.
pub async fn survey(
    store: &ClusterStore,
    policy: &Policy,
    now: Timestamp,
    options: &SurveyOptions,
    progress: &dyn Progress,
) -> Result<Survey, StoreError> {
    let t = std::time::Instant::now();
    let mut catalog = Catalog::load(store, progress).await?;
    tracing::info!(
        backups = catalog.backups.len(),
        objects = catalog.objects_listed,
        metadata_from_cache = catalog.metadata_from_cache,
        elapsed_ms = t.elapsed().as_millis() as u64,
        "catalog loaded"
    );
    for b in &mut catalog.backups {
        if options.protect.contains(&b.backup.id) {
            b.backup.protected = true;
        }
        if options.guarded.contains(&b.backup.id) {
            b.backup.guarded = true;
        }
        b.backup.held_for = options
            .restores
            .iter()
            .filter(|h| h.backup_id == b.backup.id)
            .map(|h| h.by.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
    }
    for b in &mut catalog.backups {
        tidemark_core::copies::mark_awaiting(std::slice::from_mut(&mut b.backup), &options.copies);
    }
    // Plan from the index, summaries standing for unread shards; read the shards the plan
    // reaches (its horizon, or the listing it needs) and plan again, until none is left.
    // Each round reads at least one shard, so this ends.
    let unlisted = SegmentListing::default();
    let mut first;
    let mut rounds = 0;
    let below = loop {
        let inventory = catalog.inventory(&unlisted);
        first = plan_for(policy, &inventory, now, &options.copies);
        let below = first
            .segments
            .delete
            .iter()
            .map(|d| d.sequence)
            .max()
            .map(|s| s + 1);
        let mut read: Vec<String> = first
            .summaries_to_read(&inventory.segments)
            .iter()
            .map(|s| s.name.clone())
            .collect();
        if let Some(below) = below {
            read.extend(catalog.shards_below(below));
        }
        match (&mut catalog.index, read.is_empty()) {
            (Some(index), false) => {
                rounds += 1;
                index.read_shards(store, read).await?;
            }
            _ => break below,
        }
    };
    tracing::info!(
        rounds,
        shards_unread = catalog.index.as_ref().map_or(0, |i| i.unread().count()),
        "planned over the index"
    );
    let segments = match below {
        None => unlisted,
        Some(below) => {
            let same_width = catalog.index.as_ref().is_some_and(|i| {
                let runs = i.runs();
                let mut lens = runs
                    .iter()
                    .flat_map(|r| [r.first_name.len(), r.last_name.len()]);
                let first = lens.next();
                lens.all(|l| Some(l) == first)
            });
            let t = std::time::Instant::now();
            let mut split: Vec<&str> = catalog
                .index
                .as_ref()
                .map(|i| {
                    i.entries()
                        .filter(|e| e.sequence < below)
                        .map(|e| e.name.as_str())
                        .collect()
                })
                .unwrap_or_default();
            split.sort_unstable();
            let mut listing = list_segments(store, below, same_width, &split, progress).await?;
            tracing::info!(
                below,
                listed = listing.objects.len(),
                elapsed_ms = t.elapsed().as_millis() as u64,
                "segments listed"
            );
            catalog.foreign.append(&mut listing.foreign);
            catalog.foreign.sort();
            listing
        }
    };
    // Shards read on the way may hold entries outside the grammar: report them too.
    catalog.check_index_entries(store);
    let mut inventory = catalog.inventory(&segments);
    let mut plan = plan_for(policy, &inventory, now, &options.copies);
    // What the server holds locked longer than recorded is kept (a crash between the steps
    // of a locked commit); with more kept the horizon can only move earlier.
    if catalog.read_server_locks(store, &plan).await {
        inventory = catalog.inventory(&segments);
        plan = plan_for(policy, &inventory, now, &options.copies);
    }
    // The listing can only move the horizon earlier, so no unread shard is reached now;
    // checked, because a plan over a shard's summary cannot delete its segments.
    if let Some(s) = plan.summaries_to_read(&inventory.segments).first() {
        return Err(StoreError::Internal {
            url: store.url.clone(),
            problem: format!(
                "the final plan reaches the unread index shard {}; nothing was deleted",
                s.name
            ),
        });
    }
    Ok(Survey {
        catalog,
        segments,
        inventory,
        plan,
    })
}

impl Survey {
    /// Backups the plan deletes, with their stored objects.
    pub fn deletions(&self) -> impl Iterator<Item = &crate::catalog::StoredBackup> {
        self.plan
            .backups
            .iter()
            .filter(|d| d.action == Action::Delete)
            .filter_map(|d| self.catalog.backup(&d.backup.name, &d.backup.id))
    }
}

/// What the bucket's rules mean for `store`'s expired chains, when that matters: an S3
/// store that leaves expired locked chains to the bucket (`afterExpiry: lifecycle`) and
/// holds, or locks, locked backups. `None` otherwise. The window a kept backup must last:
/// the oldest kept backup's age by `survey`'s plan, or `window`, whichever is longer.
pub async fn bucket_lifecycle(
    store: &crate::open::ClusterStore,
    survey: &Survey,
    window: Option<jiff::SignedDuration>,
) -> Option<(Vec<crate::lifecycle::Rule>, crate::lifecycle::Verdict)> {
    let prefix = store.bucket_prefix()?;
    let locked = store.object_lock().is_some()
        || !survey.catalog.expired.is_empty()
        || survey.catalog.backups.iter().any(|b| {
            b.metadata
                .as_ref()
                .is_some_and(|m| m.immutable_until.is_some())
        });
    if !locked || store.lock_expiry() != tidemark_core::lock::LockExpiry::Lifecycle {
        return None;
    }
    let now = survey.plan.now;
    let oldest = survey
        .plan
        .backups
        .iter()
        .filter(|d| d.action == tidemark_core::Action::Keep)
        .map(|d| now.duration_since(d.backup.started_at))
        .max()
        .unwrap_or(jiff::SignedDuration::ZERO);
    let longest = oldest.max(window.unwrap_or(jiff::SignedDuration::ZERO));
    let needed_days = u64::try_from(longest.as_secs())
        .unwrap_or(0)
        .div_ceil(86_400);
    Some(match store.lifecycle().await {
        Ok(rules) => {
            let v = crate::lifecycle::verdict(&rules, &prefix, needed_days);
            (rules, v)
        }
        Err(e) => (
            Vec::new(),
            crate::lifecycle::Verdict::Unknown {
                problem: e.to_string(),
            },
        ),
    })
}
