//! The one deleter: carries out a plan's deletions in the crash-safe order of DESIGN.md
//! §5.3. It is handed concrete keys ([`Deletions`], built from a plan by destructuring it
//! without `..`, so a new kind of deletion cannot be skipped silently) and writes the audit
//! record before it deletes anything. It decides nothing: what goes, and when, is the
//! planner's (with `now` passed in).
//!
//! The one deleter of what retention judges. A writer removes only what it made itself
//! in the same attempt, and never through here: a push's own payload after its source
//! failed (`transfer::Attempt`), its `_inflight.json` marker once the attempt is recorded,
//! its own multipart upload when the upload fails (object_store aborts it), the lease it
//! holds (`state::release_lease`, only while it names this process), and the staging
//! files of a consolidation or restore on local disk. Nothing another writer made, and
//! nothing committed, is deleted anywhere else.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::{StreamExt, stream};
use jiff::Timestamp;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use tidemark_core::{
    Action, BackupDecision, EntryRef, LeftoverDeletion, LeftoverKind, LeftoverPlan, Plan,
    SegmentDeletion, SegmentPlan, SegmentReason,
};

use crate::catalog::Catalog;
use crate::error::{StoreError, is_not_found};
use crate::format::{AuditBackup, AuditRecord, FORMAT_VERSION};
use crate::index::SegmentIndex;
use crate::layout;
use crate::open::ClusterStore;
use crate::open::write_err;
use crate::progress::Progress;
use crate::survey::Survey;

/// Rounds of retries for keys a batch failed to delete; object_store already retries each
/// request with backoff on 5xx/429, so these cover whole-batch failures.
const DELETE_ROUNDS: u32 = 4;
/// Concurrent single-key deletes in a retry round, and uploads aborted at once.
const RETRY_CONCURRENCY: usize = 16;
/// First pause before retrying failed deletions one by one.
const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(200);

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
    /// More fields of the audit record (e.g. `hooks`: what the DeleteHooks did).
    pub audit_extra: serde_json::Map<String, serde_json::Value>,
}

impl ExecOptions {
    pub fn new(started_at: Timestamp, policy: serde_json::Value) -> Self {
        ExecOptions {
            started_at,
            policy,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
            index_shard_size: crate::index::SHARD_SIZE,
            audit_extra: serde_json::Map::new(),
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

/// One synthetic full committed by a pass (seed 002's consolidation).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Consolidation {
    /// The increment the full replaces.
    pub target: String,
    /// The new full's backup-id (same backup name as the target).
    pub synthetic: String,
    /// The chain merged into it, base first (the target last).
    pub consolidated_from: Vec<String>,
    pub size: u64,
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionReport {
    pub pass_id: String,
    /// Relative to the store URL; `None` when the pass had nothing to delete.
    pub audit_key: Option<String>,
    pub backups_deleted: Vec<String>,
    /// Locked backups whose lock ended, recorded as expired and left to the bucket's
    /// lifecycle rule (`afterExpiry: lifecycle`, seed 002): gone for every plan, restore
    /// and window, their objects still in the store.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backups_expired: Vec<String>,
    pub objects_deleted: usize,
    pub segments_deleted: usize,
    pub index_entries_removed: usize,
    /// Index shards no longer named by `_index.json` (left by an interrupted rewrite) that
    /// were deleted.
    pub orphan_shards_deleted: usize,
    /// Abandoned uploads aborted and staging files removed.
    pub leftovers_deleted: usize,
    /// Synthetic fulls committed by this pass (`consolidate`), before its deletions.
    pub consolidated: Vec<Consolidation>,
    pub failures: Vec<DeleteFailure>,
}

/// A backup to delete: its `metadata.json` (un-commit first), then every other object of
/// its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupDeletion {
    pub name: String,
    pub id: String,
    pub metadata_key: Option<Path>,
    pub payload_keys: Vec<Path>,
}

/// An upload to abort.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbandonedUpload {
    /// Key relative to the cluster.
    pub key: String,
    pub upload_id: String,
}

/// Everything a pass deletes, as keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deletions {
    pub backups: Vec<BackupDeletion>,
    /// Segment objects, with the index entry each one removes (if it is indexed).
    pub segments: Vec<(Path, Option<EntryRef>)>,
    /// Index entries whose object is already gone.
    pub index_entries: Vec<EntryRef>,
    /// Index shards no index names.
    pub shards: Vec<Path>,
    pub uploads: Vec<AbandonedUpload>,
    /// Staging files of a local store, relative to the cluster directory.
    pub staging: Vec<String>,
}

impl Deletions {
    /// The deletions `plan` decides, over the objects `catalog` found.
    pub fn of(plan: &Plan, catalog: &Catalog) -> Self {
        let Plan {
            now: _,
            backups,
            segments,
            horizon: _,
            recovery_window: _,
            leftovers,
        } = plan;
        let mut out = Deletions::default();
        for d in backups {
            let BackupDecision {
                backup,
                action,
                reasons: _,
            } = d;
            match action {
                Action::Delete => {
                    if let Some(b) = catalog.backup(&backup.name, &backup.id) {
                        out.backups.push(BackupDeletion {
                            name: backup.name.clone(),
                            id: backup.id.clone(),
                            metadata_key: b.metadata_key.clone(),
                            payload_keys: b.payload_keys.clone(),
                        });
                    }
                }
                // Consolidation is work the engine's driver does before the deletions; the
                // merged backups are deleted by the plan made after the full is committed.
                Action::Keep | Action::Consolidate => {}
            }
        }
        let SegmentPlan {
            delete,
            drop_from_index,
            keep: _,
            kept_unknown_last_event: _,
            kept_branch: _,
            kept_for_copies: _,
        } = segments;
        for s in delete {
            let SegmentDeletion {
                name,
                sequence,
                size: _,
                reason,
            } = s;
            let entry = match reason {
                SegmentReason::BehindHorizon => Some(EntryRef {
                    sequence: *sequence,
                    name: name.clone(),
                }),
                SegmentReason::UnindexedBehindHorizon => None,
            };
            out.segments.push((layout::segment_key(name), entry));
        }
        out.index_entries = drop_from_index.clone();
        let LeftoverPlan { delete, keep: _ } = leftovers;
        for l in delete {
            let LeftoverDeletion {
                leftover,
                reason: _,
            } = l;
            match (leftover.kind, &leftover.upload_id) {
                (LeftoverKind::UnreferencedShard, _) => {
                    out.shards.push(Path::from(leftover.key.as_str()));
                }
                (LeftoverKind::IncompleteUpload, Some(id)) => out.uploads.push(AbandonedUpload {
                    key: leftover.key.clone(),
                    upload_id: id.clone(),
                }),
                // Without its id an upload cannot be aborted; the catalog always sets it.
                (LeftoverKind::IncompleteUpload, None) => {}
                (LeftoverKind::StagingFile, _) => out.staging.push(leftover.key.clone()),
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        let Deletions {
            backups,
            segments,
            index_entries,
            shards,
            uploads,
            staging,
        } = self;
        backups.is_empty()
            && segments.is_empty()
            && index_entries.is_empty()
            && shards.is_empty()
            && uploads.is_empty()
            && staging.is_empty()
    }
}

/// Executes the plan of `survey` against `store`.
///
/// # Guarantees
/// - The audit record (the whole plan with its reasons, and every key of debris it
///   collects) is written before anything is deleted; if it cannot be written, nothing is.
/// - A backup's `metadata.json` is deleted before its payload, so a half-deleted backup is
///   never offered for restore; a backup whose metadata could not be deleted keeps its
///   payload.
/// - Segments are deleted before `_index.json` is rewritten, and the rewrite removes only
///   entries — identified by sequence *and* name — whose objects are confirmed gone; it is
///   a conditional write that re-reads and re-applies when another writer (an archiver)
///   changed the index meanwhile.
/// - On a local store nothing is deleted through a symbolic link.
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
    let deletions = Deletions::of(&survey.plan, &survey.catalog);
    let mut report = ExecutionReport {
        pass_id: pass_id(),
        ..Default::default()
    };
    if deletions.is_empty() {
        return Ok(report);
    }

    // Seed 002: a locked chain whose lock ended and that no rule keeps is recorded as
    // expired and left to the bucket's lifecycle rule, unless the policy opted into
    // deleting it. Only for that reason: a deletion asked for (`tidemark delete`, the
    // finalizer), an expired ttl or a chain merged into a synthetic full deletes.
    let expiring_ids: HashSet<String> = deletions
        .backups
        .iter()
        .filter(|b| expires_to_the_bucket(store, survey, b))
        .map(|b| b.id.clone())
        .collect();

    // 1. Audit record first.
    let audit_key = layout::audit_key(options.started_at, &report.pass_id);
    let mut record = audit_record(store, &survey.plan, &deletions, options, &report.pass_id);
    for b in &mut record.backups {
        if expiring_ids.contains(&b.backup_id) {
            "expire".clone_into(&mut b.action);
        }
    }
    let body = serde_json::to_vec_pretty(&record).map_err(|source| StoreError::Encode {
        url: store.url.clone(),
        what: "the audit record",
        source,
    })?;
    put_new(store, &audit_key, body).await?;
    tracing::info!(key = %store.display_key(&audit_key), "audit record written");
    report.audit_key = Some(store.display_key(&audit_key));

    let Deletions {
        backups,
        segments,
        index_entries,
        shards,
        uploads,
        staging,
    } = deletions;
    let (expiring, backups): (Vec<BackupDeletion>, Vec<BackupDeletion>) = backups
        .into_iter()
        .partition(|b| expiring_ids.contains(&b.id));
    for b in &expiring {
        let until = locked_until(survey, b).unwrap_or(Timestamp::UNIX_EPOCH);
        let key = layout::expiry_key(&b.name, &b.id);
        // By this machine's clock, not the pass's `now`: a pass told a later time must
        // not expire what the server still locks.
        if until > Timestamp::now() {
            report.failures.push(DeleteFailure {
                key: store.display_key(&key),
                error: format!(
                    "{}/{} is locked until {until}: not expired before its lock ends",
                    b.name, b.id
                ),
            });
            continue;
        }
        let body = serde_json::to_vec_pretty(&serde_json::json!({
            "formatVersion": FORMAT_VERSION,
            "backupName": b.name,
            "backupId": b.id,
            "immutableUntil": until,
            "expiredAt": options.started_at,
            "passId": report.pass_id,
            "auditRecord": report.audit_key,
            "objectsLeftTo": "the bucket's lifecycle rule",
        }))
        .unwrap_or_default();
        // Written once: one left by an earlier pass (ignored then, its lock not over) holds.
        let written = match store.inner.head(&key).await {
            Ok(_) => Ok(()),
            Err(_) => put_new(store, &key, body).await,
        };
        match written {
            Ok(()) => {
                tracing::info!(backup = %format!("{}/{}", b.name, b.id), "recorded as expired; its objects are left to the bucket's lifecycle rule");
                report.backups_expired.push(b.id.clone());
            }
            Err(e) => report.failures.push(DeleteFailure {
                key: store.display_key(&key),
                error: e.to_string(),
            }),
        }
    }
    for b in &backups {
        if let Some(d) = survey.plan.backups.iter().find(|d| d.backup.id == b.id) {
            let reasons: Vec<String> = d.reasons.iter().map(ToString::to_string).collect();
            tracing::info!(backup = %format!("{}/{}", b.name, b.id), reasons = %reasons.join(", "), "deleting backup");
        }
    }

    // 2. Backups — un-commit (metadata.json), then the payloads of those whose metadata is
    //    gone — and 3. segments. The two are independent, so they run side by side; the
    //    orders that matter (metadata before payload, segments before the index) hold.
    let backoff = options.retry_backoff;
    // In a lock-enabled (versioned) bucket a plain delete only hides the data behind a
    // delete marker: with an object lock mode, or when a backup this pass deletes was
    // locked (a `gc` run without the mode), keys go with every version.
    let versioned = store.s3().filter(|_| {
        store.object_lock.is_some()
            || backups.iter().any(|b| {
                survey
                    .catalog
                    .backup(&b.name, &b.id)
                    .and_then(|s| s.metadata.as_ref())
                    .is_some_and(|m| m.immutable_until.is_some())
            })
    });
    let metadata_keys: Vec<Path> = backups
        .iter()
        .filter_map(|b| b.metadata_key.clone())
        .collect();
    let segment_keys: Vec<Path> = segments.iter().map(|(k, _)| k.clone()).collect();
    let payload_total: usize = backups.iter().map(|b| b.payload_keys.len()).sum();
    progress.step(
        "deleting",
        metadata_keys.len() + payload_total + segment_keys.len(),
    );
    let backups_side = async {
        let meta = delete_keys(store, metadata_keys, versioned, backoff, progress).await;
        let payload_keys: Vec<Path> = backups
            .iter()
            .filter(|b| {
                b.metadata_key
                    .as_ref()
                    .is_none_or(|k| !meta.failed.contains(k))
            })
            .flat_map(|b| b.payload_keys.iter().cloned())
            .collect();
        let payload = delete_keys(store, payload_keys, versioned, backoff, progress).await;
        (meta, payload)
    };
    let segments_side = delete_keys(store, segment_keys, versioned, backoff, progress);
    let ((meta, payload), deleted_segments) = futures::join!(backups_side, segments_side);
    for b in &backups {
        let meta_ok = b
            .metadata_key
            .as_ref()
            .is_none_or(|k| !meta.failed.contains(k));
        let payload_ok = b.payload_keys.iter().all(|k| !payload.failed.contains(k));
        if meta_ok && payload_ok {
            report.backups_deleted.push(b.id.clone());
        }
    }
    let failed_segments = deleted_segments.failed.clone();
    for outcome in [meta, payload, deleted_segments] {
        report.objects_deleted += outcome.deleted;
        report.failures.extend(outcome.failures);
    }
    let mut gone: HashSet<EntryRef> = index_entries.into_iter().collect();
    for (key, entry) in &segments {
        if failed_segments.contains(key) {
            continue;
        }
        report.segments_deleted += 1;
        gone.extend(entry.clone());
    }

    // 4. The index, last.
    if let Some(index) = &survey.catalog.index
        && !gone.is_empty()
    {
        progress.step("rewriting the segment index", 1);
        let t = std::time::Instant::now();
        report.index_entries_removed =
            crate::index::remove_entries(store, index, &gone, options.index_shard_size).await?;
        tracing::info!(
            removed = report.index_entries_removed,
            elapsed_ms = t.elapsed().as_millis() as u64,
            "segment index rewritten"
        );
    }

    // 5. Debris, which nothing reads: unreferenced shards, abandoned uploads, staging.
    report.orphan_shards_deleted =
        delete_shards(store, shards, survey.catalog.index.as_ref()).await;
    let (aborted, failures) = abort_uploads(store, uploads).await;
    report.leftovers_deleted += aborted;
    report.failures.extend(failures);
    let (removed, failures) = remove_staging(store, staging).await;
    report.leftovers_deleted += removed;
    report.failures.extend(failures);
    Ok(report)
}

/// Deletes index shards no index names. The planner chose those it saw unnamed; the index
/// may have been rewritten since, so one the current head names again is kept.
async fn delete_shards(
    store: &ClusterStore,
    shards: Vec<Path>,
    index: Option<&SegmentIndex>,
) -> usize {
    if shards.is_empty() {
        return 0;
    }
    let named: HashSet<&str> = index
        .iter()
        .flat_map(|i| i.head.shards.iter().map(|s| s.key.as_str()))
        .collect();
    let prefix = format!("{}/", layout::BINLOGS);
    let keys: Vec<String> = shards
        .iter()
        .filter_map(|k| k.as_ref().strip_prefix(&prefix).map(str::to_owned))
        .filter(|rel| !named.contains(rel.as_str()))
        .collect();
    tracing::info!(count = keys.len(), "deleting index shards no index names");
    crate::index::delete_shards(store, keys.iter()).await
}

async fn abort_uploads(
    store: &ClusterStore,
    uploads: Vec<AbandonedUpload>,
) -> (usize, Vec<DeleteFailure>) {
    let Some(s3) = store.s3() else {
        return (0, Vec::new());
    };
    let results: Vec<(AbandonedUpload, object_store::Result<()>)> = stream::iter(uploads)
        .map(|u| async move {
            let r = s3.abort(&u.key, &u.upload_id).await;
            (u, r)
        })
        .buffer_unordered(RETRY_CONCURRENCY)
        .collect()
        .await;
    let mut done = 0;
    let mut failures = Vec::new();
    for (u, r) in results {
        match r {
            Ok(()) => {
                tracing::info!(key = %u.key, upload = %u.upload_id, "aborted an abandoned upload");
                done += 1;
            }
            Err(e) => failures.push(DeleteFailure {
                key: format!("{}/{} (upload {})", store.cluster, u.key, u.upload_id),
                error: error_chain(&e),
            }),
        }
    }
    (done, failures)
}

async fn remove_staging(store: &ClusterStore, staging: Vec<String>) -> (usize, Vec<DeleteFailure>) {
    let Some(dir) = store.local_dir().map(std::path::Path::to_path_buf) else {
        return (0, Vec::new());
    };
    let removed = tokio::task::spawn_blocking(move || {
        staging
            .into_iter()
            .map(|key| {
                let r = crate::local::remove_staging(&dir, &key);
                (key, r)
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    let mut done = 0;
    let mut failures = Vec::new();
    for (key, r) in removed {
        match r {
            Ok(()) => {
                tracing::info!(key = %key, "removed the staging file of an abandoned upload");
                done += 1;
            }
            Err(e) => failures.push(DeleteFailure {
                key: format!("{}/{key}", store.cluster),
                error: e.to_string(),
            }),
        }
    }
    (done, failures)
}

fn pass_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}

fn audit_record(
    store: &ClusterStore,
    plan: &Plan,
    deletions: &Deletions,
    options: &ExecOptions,
    pass_id: &str,
) -> AuditRecord {
    let mut leftovers: Vec<String> = deletions
        .shards
        .iter()
        .map(ToString::to_string)
        .chain(
            deletions
                .uploads
                .iter()
                .map(|u| format!("{} (upload {})", u.key, u.upload_id)),
        )
        .chain(deletions.staging.iter().cloned())
        .collect();
    leftovers.sort();
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
        index_entries_dropped: plan
            .segments
            .drop_from_index
            .iter()
            .map(|e| e.name.clone())
            .collect(),
        leftovers_deleted: leftovers,
        extra: options.audit_extra.clone(),
    }
}

/// Whether the pass leaves `b` to the bucket rather than deleting it: the store does so
/// with expired locked chains (`afterExpiry: lifecycle`), `b` was locked, no rule keeps it
/// is its only reason to go (`expired`), and no synthetic full holds what it held (a
/// chain merged into one is deleted: its content lives on, locked anew).
fn expires_to_the_bucket(store: &ClusterStore, survey: &Survey, b: &BackupDeletion) -> bool {
    store.lock_expiry == tidemark_core::lock::LockExpiry::Lifecycle
        && locked_until(survey, b).is_some()
        && !survey
            .plan
            .backups
            .iter()
            .any(|d| d.backup.consolidated_from.contains(&b.id))
        && survey
            .plan
            .backups
            .iter()
            .find(|d| d.backup.id == b.id)
            .is_some_and(|d| {
                d.reasons.contains(&tidemark_core::Reason::Expired)
                    && d.reasons.iter().all(|r| {
                        matches!(
                            r,
                            tidemark_core::Reason::Expired | tidemark_core::Reason::Broken
                        )
                    })
            })
}

/// When the backup `b` deletes was locked until (its `metadata.json`'s `immutableUntil`).
fn locked_until(survey: &Survey, b: &BackupDeletion) -> Option<Timestamp> {
    survey
        .catalog
        .backup(&b.name, &b.id)
        .and_then(|s| s.metadata.as_ref())
        .and_then(|m| m.immutable_until)
}

/// Writes an object that must not exist yet; where the backend cannot refuse overwrites,
/// the unique key makes a plain write equivalent.
pub(crate) async fn put_new(
    store: &ClusterStore,
    key: &Path,
    body: Vec<u8>,
) -> Result<(), StoreError> {
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

/// Marks the committed backup `name/id` for deletion with [`layout::DELETION_MARK`]: its
/// deletion was asked for while a recovery depended on it, so no rule keeps it from now
/// on, and a retention pass removes it — or consolidates its chain — once that is safe.
/// Deletes nothing; written once (a second request leaves the first mark).
///
/// # Guarantees
/// Deletes nothing itself. The mark only lifts the rules that keep the backup: a later
/// pass still never deletes it while the floor, a chain or a hold depends on it.
///
/// # Errors
/// The mark could not be written.
pub async fn mark_for_deletion(
    store: &ClusterStore,
    name: &str,
    id: &str,
    requested_by: &str,
    at: Timestamp,
) -> Result<(), StoreError> {
    let key = Path::from_iter([name, id, layout::DELETION_MARK]);
    let body = serde_json::to_vec_pretty(&serde_json::json!({
        "formatVersion": FORMAT_VERSION,
        "requestedAt": at,
        "requestedBy": requested_by,
    }))
    .map_err(|source| StoreError::Encode {
        url: store.url.clone(),
        what: "the deletion mark",
        source,
    })?;
    let payload = PutPayload::from(body);
    let create = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match store.inner.put_opts(&key, payload.clone(), create).await {
        Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
        Err(object_store::Error::NotImplemented { .. }) => store
            .inner
            .put(&key, payload)
            .await
            .map(|_| ())
            .map_err(|source| write_err(store, &key, source)),
        Err(source) => Err(write_err(store, &key, source)),
    }
}

/// What one batch of deletions came to.
#[derive(Debug, Default)]
struct BatchTally {
    deleted: usize,
    failed: HashSet<Path>,
    failures: Vec<DeleteFailure>,
}

/// Keys per bulk delete request. S3's DeleteObjects takes 1,000, but a server works
/// through one request's keys in turn: 3,000 keys went in 0.30–0.42 s as 100- to 250-key
/// requests, 32 at once, and in 0.60–0.74 s as 1,000-key ones (SeaweedFS, issue 32 §2).
/// Azure's batches take 256 at most.
const DELETE_BATCH: usize = 250;

/// Bulk delete requests in flight at once (within the store's request limit).
const DELETE_BATCHES_IN_FLIGHT: usize = 16;

/// Deletes `keys` in batches (S3 DeleteObjects, [`DELETE_BATCH`] keys a request,
/// [`DELETE_BATCHES_IN_FLIGHT`] requests in flight), then retries what is left one key at a time with backoff. Missing objects are
/// success.
async fn delete_keys(
    store: &ClusterStore,
    keys: Vec<Path>,
    versioned: Option<&crate::uploads::S3Native>,
    backoff: Duration,
    progress: &dyn Progress,
) -> BatchTally {
    let mut outcome = BatchTally::default();
    if keys.is_empty() {
        return outcome;
    }
    let started = std::time::Instant::now();
    let total = keys.len();
    let mut pending: HashSet<Path> = keys.iter().cloned().collect();
    // Versioned: a key goes with all its versions, one key at a time; the server refuses
    // those still locked.
    let results: Vec<_> = if versioned.is_some() {
        Vec::new()
    } else {
        let batches: Vec<Vec<Path>> = keys.chunks(DELETE_BATCH).map(<[Path]>::to_vec).collect();
        stream::iter(batches)
            .map(|batch| {
                store
                    .inner
                    .delete_stream(stream::iter(batch.into_iter().map(Ok)).boxed())
                    .collect::<Vec<_>>()
            })
            .buffer_unordered(DELETE_BATCHES_IN_FLIGHT)
            .flat_map(stream::iter)
            .collect()
            .await
    };
    // Keys the server refused because of a lock: asking again before it ends is useless.
    let mut locked: HashSet<Path> = HashSet::new();
    for r in results {
        if let Ok(p) = r
            && pending.remove(&p)
        {
            outcome.deleted += 1;
            progress.deleted(1);
        }
    }
    let mut last_error: HashMap<Path, String> = HashMap::new();
    for round in 0..DELETE_ROUNDS {
        if pending.iter().all(|k| locked.contains(k)) {
            break;
        }
        if round > 0 {
            let cap = backoff.saturating_mul(1 << DELETE_ROUNDS.min(16));
            let pause = tidemark_core::retry::delay(backoff, cap, round);
            tokio::time::sleep(tidemark_core::retry::jitter(pause, 0.0, 0.5)).await;
        }
        let round_keys: Vec<Path> = pending
            .iter()
            .filter(|k| !locked.contains(*k))
            .cloned()
            .collect();
        let outcomes: Vec<(Path, Result<(), object_store::Error>)> = stream::iter(round_keys)
            .map(|key| async move {
                let r = match versioned {
                    Some(native) => native.delete_all_versions(&key).await.map(|_| ()),
                    None => store.inner.delete(&key).await,
                };
                let r = match r {
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
                    let text = error_chain(&e);
                    if versioned.is_some() && text.contains("AccessDenied") {
                        locked.insert(key.clone());
                    }
                    last_error.insert(key, text);
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
