//! Carries out a plan, in the crash-safe order of DESIGN.md §5.3.

use std::collections::HashSet;
use std::time::Duration;

use futures::{StreamExt, stream};
use jiff::Timestamp;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use tidemark_core::{Action, Plan, Reason, SegmentReason};

use crate::error::{StoreError, is_not_found, write_err};
use crate::format::{AuditBackup, AuditRecord, FORMAT_VERSION};
use crate::layout;
use crate::open::ClusterStore;
use crate::progress::Progress;
use crate::survey::Survey;

/// Rounds of retries for keys a batch failed to delete; object_store already retries each
/// request with backoff on 5xx/429, so these cover whole-batch failures.
const DELETE_ROUNDS: u32 = 4;
/// Concurrent single-key deletes in a retry round.
const RETRY_CONCURRENCY: usize = 16;
/// First pause before retrying failed deletions one by one.
const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(200);
/// How old an index shard that `_index.json` does not name must be before a pass deletes
/// it: younger ones may belong to a writer about to commit them.
const ORPHAN_SHARD_AGE: Duration = Duration::from_secs(3600);

/// Settings of one execution.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Wall-clock start of the pass (names the audit record).
    pub started_at: Timestamp,
    /// The policy as the user gave it, recorded in the audit record.
    pub policy: serde_json::Value,
    /// First backoff between retry rounds of failed deletions (doubles each round).
    pub retry_backoff: Duration,
    /// Entries per index shard when the index is rewritten.
    pub index_shard_size: usize,
    /// Age after which an index shard `_index.json` does not name is deleted.
    pub orphan_shard_age: Duration,
    /// The MariaDB programs consolidation runs.
    pub tools: crate::restore::Tools,
    /// Where consolidation prepares a chain (it needs room for one full data directory).
    pub work_dir: std::path::PathBuf,
}

impl ExecOptions {
    pub fn new(started_at: Timestamp, policy: serde_json::Value) -> Self {
        ExecOptions {
            started_at,
            policy,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
            index_shard_size: crate::index::SHARD_SIZE,
            orphan_shard_age: ORPHAN_SHARD_AGE,
            tools: crate::restore::Tools::default(),
            work_dir: std::env::temp_dir(),
        }
    }
}

/// A key that could not be deleted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteFailure {
    pub key: String,
    pub error: String,
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionReport {
    pub pass_id: String,
    /// Relative to the store URL; `None` when the pass had nothing to do.
    pub audit_key: Option<String>,
    pub backups_deleted: Vec<String>,
    pub objects_deleted: usize,
    pub segments_deleted: usize,
    pub index_entries_removed: usize,
    /// Index shards no longer named by `_index.json` (left by an interrupted pass) that
    /// were deleted.
    pub orphan_shards_deleted: usize,
    /// Synthetic fulls committed by this pass (`consolidate`).
    pub consolidated: Vec<crate::consolidate::Consolidation>,
    pub failures: Vec<DeleteFailure>,
}

/// Executes `survey.plan` against `store`.
///
/// # Guarantees
/// - The audit record (the whole plan with its reasons) is written before anything is
///   deleted; if it cannot be written, nothing is deleted.
/// - A backup's `metadata.json` is deleted before its payload, so a half-deleted backup is
///   never offered for restore; a backup whose metadata could not be deleted keeps its
///   payload.
/// - Segments are deleted before `_index.json` is rewritten, and the rewrite removes only
///   entries whose objects are confirmed gone; it is a conditional write that re-reads and
///   re-applies when another writer (an archiver) changed the index meanwhile.
/// - An object already gone counts as deleted. Running the same pass again converges.
///
/// # Assumptions
/// `survey` was taken from this store; it is not re-validated.
///
/// # Errors
/// Writing the audit record or the index failed. Individual deletions that still fail
/// after retries do not abort the pass: they are listed in [`ExecutionReport::failures`].
pub async fn execute(
    store: &ClusterStore,
    survey: &Survey,
    options: &ExecOptions,
    progress: &dyn Progress,
) -> Result<ExecutionReport, StoreError> {
    let plan = &survey.plan;
    let mut report = ExecutionReport {
        pass_id: pass_id(),
        ..Default::default()
    };
    if plan.is_empty() {
        report.orphan_shards_deleted = delete_orphan_shards(store, survey, options).await;
        return Ok(report);
    }

    // 1. Audit record first.
    let audit_key = layout::audit_key(options.started_at, &report.pass_id);
    let record = audit_record(store, plan, options, &report.pass_id);
    let body = serde_json::to_vec_pretty(&record).map_err(|source| StoreError::Encode {
        url: store.url.clone(),
        what: "the audit record",
        source,
    })?;
    let t = std::time::Instant::now();
    put_new(store, &audit_key, body).await?;
    tracing::info!(
        elapsed_ms = t.elapsed().as_millis() as u64,
        "audit record written"
    );
    report.audit_key = Some(store.display_key(&audit_key));

    // Consolidations: each synthetic full is committed before the chain it replaces is
    // deleted with the other backups below; a failed one deletes nothing of its chain.
    let mut doomed: Vec<&crate::catalog::StoredBackup> = survey.deletions().collect();
    for target in consolidation_targets(plan) {
        progress.step(&format!("consolidating the chain of {}", target.id), 0);
        let done = crate::consolidate::consolidate(
            store,
            &survey.catalog,
            &survey.inventory,
            &target.id,
            &options.tools,
            &options.work_dir,
            progress,
        )
        .await;
        match done {
            Ok(c) => {
                tracing::info!(target = %c.target, synthetic = %c.synthetic, "synthetic full committed");
                let merged = plan.backups.iter().filter(|d| {
                    d.backup.id == target.id
                        || d.reasons
                            .iter()
                            .any(|r| matches!(r, Reason::ConsolidateInto(t) if *t == target.id))
                });
                doomed.extend(
                    merged.filter_map(|d| survey.catalog.backup(&d.backup.name, &d.backup.id)),
                );
                report.consolidated.push(c);
            }
            Err(e) => {
                let mut text = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    text.push_str(&format!(": {s}"));
                    source = s.source();
                }
                report.failures.push(DeleteFailure {
                    key: store.display_key(&layout::metadata_key(&target.name, &target.id)),
                    error: format!("consolidation failed, the chain stays: {text}"),
                });
            }
        }
    }

    // 2. Backups — un-commit (metadata.json), then the payloads of those whose metadata is
    //    gone — and 3. segments. The two are independent, so they run side by side; the
    //    orders that matter (metadata before payload, segments before the index) hold.
    let backoff = options.retry_backoff;
    let metadata_keys: Vec<Path> = doomed
        .iter()
        .filter_map(|b| b.metadata_key.clone())
        .collect();
    let segment_keys: Vec<Path> = plan
        .segments
        .delete
        .iter()
        .map(|d| layout::segment_key(&d.name))
        .collect();
    let payload_total: usize = doomed.iter().map(|b| b.payload_keys.len()).sum();
    progress.step(
        "deleting",
        metadata_keys.len() + payload_total + segment_keys.len(),
    );
    let backups_side = async {
        let meta = delete_keys(store, metadata_keys, backoff, progress).await;
        let payload_keys: Vec<Path> = doomed
            .iter()
            .filter(|b| {
                b.metadata_key
                    .as_ref()
                    .is_none_or(|k| !meta.failed.contains(k))
            })
            .flat_map(|b| b.payload_keys.iter().cloned())
            .collect();
        let payload = delete_keys(store, payload_keys, backoff, progress).await;
        (meta, payload)
    };
    let segments_side = delete_keys(store, segment_keys, backoff, progress);
    let ((meta, payload), segments) = futures::join!(backups_side, segments_side);
    for b in &doomed {
        let meta_ok = b
            .metadata_key
            .as_ref()
            .is_none_or(|k| !meta.failed.contains(k));
        let payload_ok = b.payload_keys.iter().all(|k| !payload.failed.contains(k));
        if meta_ok && payload_ok {
            report.backups_deleted.push(b.backup.id.clone());
        }
    }
    let failed_segments = segments.failed.clone();
    for outcome in [meta, payload, segments] {
        report.objects_deleted += outcome.deleted;
        report.failures.extend(outcome.failures);
    }
    let gone: HashSet<String> = plan
        .segments
        .delete
        .iter()
        .filter(|d| !failed_segments.contains(&layout::segment_key(&d.name)))
        .inspect(|_| report.segments_deleted += 1)
        .filter(|d| d.reason == SegmentReason::BehindHorizon)
        .map(|d| d.name.clone())
        .chain(plan.segments.drop_from_index.iter().cloned())
        .collect();

    // 4. The index, last.
    if let Some(index) = &survey.catalog.index
        && !gone.is_empty()
    {
        progress.step("rewriting the segment index", 1);
        let t = std::time::Instant::now();
        report.index_entries_removed =
            crate::index::remove_entries(store, index, &gone, options.index_shard_size).await?;
        tracing::info!(
            head_entries = index.head.entries.len(),
            shards = index.head.shards.len(),
            removed = report.index_entries_removed,
            elapsed_ms = t.elapsed().as_millis() as u64,
            "segment index rewritten"
        );
    }
    report.orphan_shards_deleted = delete_orphan_shards(store, survey, options).await;
    Ok(report)
}

/// Deletes index shards that the surveyed `_index.json` does not name and that are older
/// than `options.orphan_shard_age` (debris of an interrupted index rewrite). Best effort.
async fn delete_orphan_shards(
    store: &ClusterStore,
    survey: &Survey,
    options: &ExecOptions,
) -> usize {
    let named: HashSet<&str> = survey
        .catalog
        .index
        .iter()
        .flat_map(|i| i.head.shards.iter().map(|s| s.key.as_str()))
        .collect();
    let age = jiff::SignedDuration::try_from(options.orphan_shard_age)
        .unwrap_or(jiff::SignedDuration::MAX);
    let cutoff = Timestamp::now().checked_sub(age).unwrap_or(Timestamp::MIN);
    let orphans: Vec<String> = survey
        .catalog
        .shard_objects
        .iter()
        .filter(|m| crate::catalog::to_ts(m.last_modified) <= cutoff)
        .filter_map(|m| {
            let rel = m
                .location
                .as_ref()
                .strip_prefix(&format!("{}/", layout::BINLOGS))?;
            (!named.contains(rel)).then(|| rel.to_owned())
        })
        .collect();
    if orphans.is_empty() {
        return 0;
    }
    tracing::info!(
        count = orphans.len(),
        "deleting index shards no index names"
    );
    crate::index::delete_shards(store, orphans.iter()).await
}

/// The increments a plan replaces by synthetic fulls: `consolidate` actions that are not
/// themselves merged into another.
fn consolidation_targets(plan: &Plan) -> impl Iterator<Item = &tidemark_core::Backup> {
    plan.backups
        .iter()
        .filter(|d| d.action == Action::Consolidate)
        .filter(|d| {
            !d.reasons
                .iter()
                .any(|r| matches!(r, Reason::ConsolidateInto(_)))
        })
        .map(|d| &d.backup)
}

fn pass_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}

fn audit_record(
    store: &ClusterStore,
    plan: &Plan,
    options: &ExecOptions,
    pass_id: &str,
) -> AuditRecord {
    AuditRecord {
        format_version: FORMAT_VERSION,
        pass_id: pass_id.to_owned(),
        tidemark_version: env!("CARGO_PKG_VERSION").to_owned(),
        cluster: store.cluster.clone(),
        started_at: options.started_at,
        evaluated_at: plan.now,
        policy: options.policy.clone(),
        horizon: plan.horizon,
        backups: plan
            .backups
            .iter()
            .map(|d| AuditBackup {
                backup_id: d.backup.id.clone(),
                backup_name: d.backup.name.clone(),
                action: match d.action {
                    Action::Keep => "keep",
                    Action::Delete => "delete",
                    Action::Consolidate => "consolidate",
                }
                .to_owned(),
                reasons: d.reasons.iter().map(ToString::to_string).collect(),
            })
            .collect(),
        segments_deleted: plan
            .segments
            .delete
            .iter()
            .map(|d| d.name.clone())
            .collect(),
        index_entries_dropped: plan.segments.drop_from_index.clone(),
        extra: serde_json::Map::new(),
    }
}

/// Writes an object that must not exist yet; where the backend cannot refuse overwrites,
/// the unique key makes a plain write equivalent.
async fn put_new(store: &ClusterStore, key: &Path, body: Vec<u8>) -> Result<(), StoreError> {
    let payload = PutPayload::from(body);
    let create = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match store.inner.put_opts(key, payload.clone(), create).await {
        Ok(_) => Ok(()),
        Err(object_store::Error::NotImplemented { .. }) => store
            .inner
            .put(key, payload)
            .await
            .map(|_| ())
            .map_err(|source| write_err(store, key, source)),
        Err(source) => Err(write_err(store, key, source)),
    }
}

/// What one batch of deletions came to.
#[derive(Debug, Default)]
struct Outcome {
    deleted: usize,
    failed: HashSet<Path>,
    failures: Vec<DeleteFailure>,
}

/// Deletes `keys` in batches (S3 DeleteObjects, 1,000 keys a request, several requests in
/// flight), then retries what is left one key at a time with backoff. Missing objects are
/// success.
async fn delete_keys(
    store: &ClusterStore,
    keys: Vec<Path>,
    backoff: Duration,
    progress: &dyn Progress,
) -> Outcome {
    let mut outcome = Outcome::default();
    if keys.is_empty() {
        return outcome;
    }
    let started = std::time::Instant::now();
    let total = keys.len();
    let mut pending: HashSet<Path> = keys.iter().cloned().collect();
    let results: Vec<_> = store
        .inner
        .delete_stream(stream::iter(keys.into_iter().map(Ok)).boxed())
        .collect()
        .await;
    for r in results {
        if let Ok(p) = r
            && pending.remove(&p)
        {
            outcome.deleted += 1;
            progress.deleted(1);
        }
    }
    let mut last_error: std::collections::HashMap<Path, String> = Default::default();
    for round in 0..DELETE_ROUNDS {
        if pending.is_empty() {
            break;
        }
        if round > 0 {
            let pause = backoff * (1 << (round - 1));
            let jitter = pause.mul_f64(rand::random::<f64>() * 0.5);
            tokio::time::sleep(pause + jitter).await;
        }
        let outcomes: Vec<(Path, Result<(), object_store::Error>)> =
            stream::iter(pending.iter().cloned())
                .map(|key| async move {
                    let r = match store.inner.delete(&key).await {
                        Err(e) if is_not_found(&e) => Ok(()),
                        other => other,
                    };
                    (key, r)
                })
                .buffer_unordered(RETRY_CONCURRENCY)
                .collect()
                .await;
        for (key, r) in outcomes {
            match r {
                Ok(()) => {
                    pending.remove(&key);
                    outcome.deleted += 1;
                    progress.deleted(1);
                }
                Err(e) => {
                    last_error.insert(key, error_chain(&e));
                }
            }
        }
    }
    tracing::info!(
        keys = total,
        failed = pending.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "deleted"
    );
    let mut failed: Vec<&Path> = pending.iter().collect();
    failed.sort();
    for key in failed {
        outcome.failures.push(DeleteFailure {
            key: store.display_key(key),
            error: last_error.get(key).cloned().unwrap_or_default(),
        });
    }
    outcome.failed = pending;
    outcome
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
