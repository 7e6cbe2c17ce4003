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
}

/// What a pass saw and what it plans.
#[derive(Debug)]
pub struct Survey {
    pub catalog: Catalog,
    pub segments: SegmentListing,
    pub inventory: Inventory,
    pub plan: Plan,
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
        elapsed_ms = t.elapsed().as_millis() as u64,
        "catalog loaded"
    );
    for b in &mut catalog.backups {
        if options.protect.contains(&b.backup.id) {
            b.backup.protected = true;
        }
    }
    let unlisted = SegmentListing::default();
    let first = plan(policy, &catalog.inventory(&unlisted), now);
    let below = first
        .segments
        .delete
        .iter()
        .map(|d| d.sequence)
        .max()
        .map(|s| s + 1);
    let segments = match below {
        None => unlisted,
        Some(below) => {
            let same_width = catalog.index.as_ref().is_some_and(|i| {
                let mut lens = i.file.entries.iter().map(|e| e.name.len());
                let first = lens.next();
                lens.all(|l| Some(l) == first)
            });
            let t = std::time::Instant::now();
            let mut split: Vec<&str> = catalog
                .index
                .as_ref()
                .map(|i| {
                    i.file
                        .entries
                        .iter()
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
    let inventory = catalog.inventory(&segments);
    let plan = plan(policy, &inventory, now);
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
