//! A copy pass (issue 44, DESIGN.md §7.2): what a second store — its own retention, its
//! own lock — does not hold yet of the source's committed history, sent as stored.
//!
//! One pass: read both stores; plan the copy over the union of the two (as if everything
//! were copied) with the copy's own policy; send what that plan keeps and the copy lacks —
//! backups whole chains in order, each committed last (`metadata.json` after its payload,
//! as every writer does), then segments in sequence order, each indexed once its object is
//! there with the recorded bytes — and record in the *source*'s `_state/copies/<name>.json`
//! what the copy has dealt with, which every retention pass on the source then keeps
//! until it has ([`tidemark_core::copies`]). Nothing is ever deleted from the copy because
//! of the source: the copy's own retention pass (under its own lease) decides there.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use jiff::Timestamp;
use tidemark_core::copies::{self, CopyChoice};
use tidemark_core::{Inventory, Phase, Policy};
use tidemark_store::bandwidth::Bandwidth;
use tidemark_store::catalog::{Catalog, SegmentListing};
use tidemark_store::copy::{Expected, already_there, copy_object};
use tidemark_store::format::{IndexEntry, Metadata};
use tidemark_store::state::{CopyRecord, load_copy, save_copy};
use tidemark_store::transfer::{Attempt, AttemptRecord, AttemptSpec, TransferError};
use tidemark_store::{ClusterStore, Progress, layout};

use crate::error::EngineError;
use crate::fence::Fence;

/// Segments sent at once.
const SEGMENT_CONCURRENCY: usize = 8;
/// Segments indexed in the copy per index update (each update rewrites its head).
const SEGMENT_BATCH: usize = 256;

/// One copy pass.
#[derive(Debug, Clone)]
pub struct CopyRequest {
    /// The copy's name (`copies[].name`): its record in the source is
    /// `_state/copies/<name>.json`.
    pub name: String,
    /// The copy's retention policy (the source's when the copy has none).
    pub policy: Policy,
    pub now: Timestamp,
    /// Hold the copy's transfers to this rate.
    pub bandwidth: Option<Arc<Bandwidth>>,
    /// Send nothing: say what would be sent.
    pub dry_run: bool,
}

/// What a copy pass did.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyOutcome {
    pub name: String,
    /// Backups sent (committed in the copy), parents first.
    pub backups_sent: Vec<String>,
    /// Backups the copy's own plan would not keep: not sent.
    pub backups_declined: Vec<String>,
    /// Each of them with why: the copy's plan's reasons for deleting it (`expired`, …),
    /// or `broken`, or `newerFormat`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub declined: Vec<Declined>,
    pub segments_sent: usize,
    pub segments_declined: usize,
    /// Bytes moved (as stored).
    pub bytes: u64,
    /// What could not be copied this time (a later pass tries again).
    pub failures: Vec<String>,
    /// The newest restorable instant of the source and of the copy after the pass.
    pub source_newest_at: Option<Timestamp>,
    pub copy_newest_at: Option<Timestamp>,
    /// The copy's recovery window after the pass, by its own plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_window: Option<tidemark_core::RecoveryWindow>,
    /// What a dry run would send.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_send: Option<WouldSend>,
}

impl CopyOutcome {
    /// How far the copy is behind the source: the source's newest restorable instant
    /// against the copy's; a copy that holds nothing yet is behind by the time since the
    /// source's newest instant.
    pub fn lag(&self, now: Timestamp) -> jiff::SignedDuration {
        lag(self.source_newest_at, self.copy_newest_at, now)
    }
}

/// How far a copy whose newest restorable instant is `copy_newest` is behind a source
/// whose newest is `source_newest` (a copy that holds nothing: the time since the
/// source's newest instant).
pub fn lag(
    source_newest: Option<Timestamp>,
    copy_newest: Option<Timestamp>,
    now: Timestamp,
) -> jiff::SignedDuration {
    match (source_newest, copy_newest) {
        (Some(s), Some(c)) if s > c => s.duration_since(c),
        (Some(s), None) => now.duration_since(s).max(jiff::SignedDuration::ZERO),
        _ => jiff::SignedDuration::ZERO,
    }
}

/// A backup a copy pass did not send, and why.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Declined {
    pub backup_id: String,
    pub reasons: Vec<String>,
}

/// What a dry run would send.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WouldSend {
    pub backups: Vec<String>,
    pub segments: Vec<String>,
}

/// Makes one copy pass from `source` to `copy`, under `fence` (the copy's lease).
///
/// # Guarantees
/// Nothing is deleted from either store, except this pass's own unfinished upload of an
/// object whose bytes differ from their record. Every backup lands whole or not at all
/// (payload objects first, each checked against `metadata.json`, then `metadata.json`), an
/// increment only after its parent is committed in the copy; every segment is indexed only
/// once its object is in the copy with the recorded size and sha256, in sequence order (a
/// failed segment stops the indexing of later ones until it is sent). Objects are copied
/// as stored: ciphertext stays ciphertext. A pass cut at any point leaves nothing that looks
/// whole, and the next pass sends what is missing. The source's record of the copy is
/// written last; until then the source keeps what the previous record did not name.
///
/// # Errors
/// A store failed (reading either catalog, the index, or writing the record); the fence
/// was lost, or is not the copy's. Objects that fail to copy are not errors: they are in
/// [`CopyOutcome::failures`] and the next pass tries again.
#[tracing::instrument(skip_all, fields(copy = %request.name, from = %source.url, to = %copy.url))]
pub async fn copy_pass(
    source: &ClusterStore,
    copy: &ClusterStore,
    request: &CopyRequest,
    fence: Option<&Fence>,
    progress: &dyn Progress,
) -> Result<CopyOutcome, EngineError> {
    if source.identity() == copy.identity() {
        return Err(EngineError::Input(format!(
            "copy {}: the copy's store is the source itself ({}/{}); a copy goes to another bucket, region or provider",
            request.name, copy.url, copy.cluster
        )));
    }
    let fence = match (request.dry_run, fence) {
        (true, _) => None,
        (false, Some(f)) if f.store().identity() == copy.identity() => Some(f),
        (false, _) => {
            return Err(EngineError::Internal(format!(
                "a copy pass writes to {}/{} only under that store's lease",
                copy.url, copy.cluster
            )));
        }
    };
    let work = run(source, copy, request, progress);
    match fence {
        Some(f) => f.guard(work).await,
        None => work.await,
    }
}

/// What a copy keeps when neither it nor its policy has retention rules: everything it
/// is sent (the longest window there is).
pub fn keep_everything() -> Policy {
    tidemark_core::PolicyInput {
        window: Some("36500d".into()),
        ..Default::default()
    }
    .validate()
    .unwrap_or_else(|_| unreachable!("36500d is the longest window, and valid"))
}

/// The copy's own retention pass over its store (`policy`, as written `as_given`): no
/// hooks (the backups' data stays in the source; seed 003's hooks run where it goes), no
/// holds but those the copy's store records.
///
/// `allow_deletions_before`: the deletion guard's acknowledgement (the policy's
/// `tidemark.io/allow-deletions-before`).
pub fn retention_request(
    policy: &Policy,
    as_given: serde_json::Value,
    now: Timestamp,
    allow_deletions_before: Option<Timestamp>,
) -> crate::pass::PassRequest {
    crate::pass::PassRequest {
        policy: policy.clone(),
        policy_as_given: as_given,
        now,
        started_at: now,
        protect: Default::default(),
        restores: Vec::new(),
        execute: true,
        ignore_malformed: false,
        hooks: None,
        recorded_hooks: crate::pass::RecordedHooks::Refuse,
        override_primary_gate: false,
        allow_deletions_before,
        compare_with: None,
    }
}

/// Records in `source` that the copy `name` (at `destination`, for people) exists, if no
/// record does yet: from then on every retention pass on the source keeps what the copy has
/// not received. Runners call it when a copy is configured, before the source's first
/// retention pass; a copy pass does it too. Returns the record (the one found, or the new
/// one).
///
/// # Errors
/// A failed request; a malformed record.
pub async fn declare(
    source: &ClusterStore,
    name: &str,
    destination: &str,
    now: Timestamp,
) -> Result<CopyRecord, EngineError> {
    if let Some(found) = load_copy(source, name).await? {
        return Ok(found);
    }
    let record = CopyRecord::new(name, destination, now);
    save_copy(source, &record).await?;
    Ok(record)
}

async fn run(
    source: &ClusterStore,
    copy: &ClusterStore,
    request: &CopyRequest,
    progress: &dyn Progress,
) -> Result<CopyOutcome, EngineError> {
    let destination = format!("{}/{}", copy.url, copy.cluster);
    // The record exists from the first pass on: the source keeps everything for the copy
    // while it is sent.
    let mut record = if request.dry_run {
        load_copy(source, &request.name)
            .await?
            .unwrap_or_else(|| CopyRecord::new(&request.name, &destination, request.now))
    } else {
        declare(source, &request.name, &destination, request.now).await?
    };

    progress.step("reading the source", 0);
    let from = read_whole(source, progress).await?;
    progress.step("reading the copy", 0);
    let to = read_whole(copy, progress).await?;

    let in_copy: HashSet<String> = to
        .inventory
        .backups
        .iter()
        .filter(|b| matches!(b.phase, Phase::Completed | Phase::Failed))
        .map(|b| b.id.clone())
        .collect();
    let segments_in_copy: HashSet<u64> = to
        .inventory
        .segments
        .iter()
        .filter(|s| s.indexed && s.present)
        .map(|s| s.sequence)
        .collect();
    let union = union(&to.inventory, &from.inventory, &in_copy, &segments_in_copy);
    let plan = tidemark_core::plan(&request.policy, &union, request.now);
    let choice = copies::choose(&union, &plan, &in_copy, &segments_in_copy);
    let source_ids: HashSet<&str> = from
        .inventory
        .backups
        .iter()
        .map(|b| b.id.as_str())
        .collect();
    let mut out = CopyOutcome {
        name: request.name.clone(),
        backups_declined: choice
            .declined
            .iter()
            .filter(|id| source_ids.contains(id.as_str()))
            .cloned()
            .collect(),
        declined: choice
            .declined
            .iter()
            .filter(|id| source_ids.contains(id.as_str()))
            .map(|id| Declined {
                backup_id: id.clone(),
                reasons: choice
                    .declined_why
                    .get(id)
                    .into_iter()
                    .flatten()
                    .map(ToString::to_string)
                    .collect(),
            })
            .collect(),
        segments_declined: choice.declined_segments.len(),
        source_newest_at: newest(&from.inventory),
        ..CopyOutcome::default()
    };
    if request.dry_run {
        out.would_send = Some(WouldSend {
            backups: choice.backups.clone(),
            segments: choice
                .segments
                .iter()
                .filter_map(|s| from.entries.get(s).map(|e| e.name.clone()))
                .collect(),
        });
        out.copy_newest_at = newest(&to.inventory);
        return Ok(out);
    }

    let sent_backups =
        send_backups(source, copy, &from, &choice, request, progress, &mut out).await;
    let failed_segments =
        send_segments(source, copy, &from, &choice, request, progress, &mut out).await?;

    // The record: what the copy has dealt with, pruned to what the source still has.
    let mut received: BTreeSet<String> = record
        .received
        .iter()
        .chain(in_copy.iter())
        .chain(sent_backups.iter())
        .filter(|id| source_ids.contains(id.as_str()))
        .cloned()
        .collect();
    let failed_backups: HashSet<&String> = choice
        .backups
        .iter()
        .filter(|id| !sent_backups.contains(*id))
        .collect();
    received.retain(|id| !failed_backups.contains(id));
    record.received = received;
    record.declined = record
        .declined
        .iter()
        .chain(out.backups_declined.iter())
        .filter(|id| source_ids.contains(id.as_str()) && !record.received.contains(*id))
        .cloned()
        .collect();
    let floor = copies::segments_through(from.entries.keys().copied(), &failed_segments);
    record.segments_through = floor.through;
    record.segments_missing = floor.missing;
    record.segments_from = floor.from;
    record.observed_at = Timestamp::now();
    record.source_newest_at = out.source_newest_at;
    // The copy after the pass, without reading it again: what it held and what was sent.
    let sent_segments: HashSet<u64> = choice
        .segments
        .iter()
        .copied()
        .filter(|s| !failed_segments.contains(s))
        .collect();
    let mut after = union;
    after
        .backups
        .retain(|b| in_copy.contains(&b.id) || sent_backups.contains(&b.id));
    after
        .segments
        .retain(|s| segments_in_copy.contains(&s.sequence) || sent_segments.contains(&s.sequence));
    out.copy_newest_at = newest(&after);
    out.copy_window = tidemark_core::plan(&request.policy, &after, request.now).recovery_window;
    record.copy_newest_at = out.copy_newest_at;
    record.failures = out.failures.iter().take(32).cloned().collect();
    record.destination = destination;
    record.writer = tidemark_store::state::host_name();
    save_copy(source, &record).await?;
    Ok(out)
}

/// A store's catalog, its inventory and every index entry (all shards read), by sequence.
struct Whole {
    catalog: Catalog,
    inventory: Inventory,
    entries: HashMap<u64, IndexEntry>,
}

async fn read_whole(store: &ClusterStore, progress: &dyn Progress) -> Result<Whole, EngineError> {
    let mut catalog = Catalog::load(store, progress).await?;
    if let Some(index) = catalog.index.as_mut() {
        let unread: Vec<String> = index.unread().map(|s| s.key.clone()).collect();
        index.read_shards(store, unread).await?;
    }
    catalog.check_index_entries(store);
    let inventory = catalog.inventory(&SegmentListing::default());
    let entries = catalog
        .index
        .as_ref()
        .map(|i| i.entries().map(|e| (e.sequence, e.clone())).collect())
        .unwrap_or_default();
    Ok(Whole {
        catalog,
        inventory,
        entries,
    })
}

/// The copy's inventory with what the source holds and the copy lacks, as if copied: the
/// copy's plan over it says what the copy wants. (The source's lock dates are the source's:
/// the copy's own lock is set when a backup lands, and a deletion asked for in the source
/// is not the copy's.)
fn union(
    copy: &Inventory,
    source: &Inventory,
    in_copy: &HashSet<String>,
    segments_in_copy: &HashSet<u64>,
) -> Inventory {
    let mut out = copy.clone();
    out.backups
        .retain(|b| !matches!(b.phase, Phase::Uncommitted | Phase::InProgress));
    out.backups.extend(
        source
            .backups
            .iter()
            .filter(|b| b.phase == Phase::Completed && !in_copy.contains(&b.id))
            .map(|b| tidemark_core::Backup {
                immutable_until: None,
                // A deletion asked for in the source is the source's: the copy's own rules
                // decide whether it keeps the backup (no deletion is mirrored).
                deletion_requested: false,
                ..b.clone()
            }),
    );
    out.segments.retain(|s| s.indexed && s.present);
    out.segments.extend(
        source
            .segments
            .iter()
            .filter(|s| {
                s.indexed && s.present && !s.summary && !segments_in_copy.contains(&s.sequence)
            })
            .cloned(),
    );
    for t in &source.timelines {
        if !out.timelines.iter().any(|x| x.id == t.id) {
            out.timelines.push(t.clone());
        }
    }
    out.leftovers.clear();
    out
}

/// The newest restorable instant a store's inventory shows: its newest completed backup's
/// completion, or its newest archived event.
fn newest(inv: &Inventory) -> Option<Timestamp> {
    let backups = inv
        .backups
        .iter()
        .filter(|b| b.phase == Phase::Completed && !b.payload_missing)
        .filter_map(|b| b.completed_at);
    let events = inv
        .segments
        .iter()
        .filter(|s| s.indexed && s.present)
        .filter_map(|s| s.last_event_at);
    backups.chain(events).max()
}

/// Sends the chosen backups in order; returns those committed in the copy. An increment
/// whose parent failed is not sent.
async fn send_backups(
    source: &ClusterStore,
    copy: &ClusterStore,
    from: &Whole,
    choice: &CopyChoice,
    request: &CopyRequest,
    progress: &dyn Progress,
    out: &mut CopyOutcome,
) -> BTreeSet<String> {
    let mut sent = BTreeSet::new();
    let mut failed: HashSet<String> = HashSet::new();
    let by_id: HashMap<&str, &tidemark_store::StoredBackup> = from
        .catalog
        .backups
        .iter()
        .map(|b| (b.backup.id.as_str(), b))
        .collect();
    progress.step("copying backups", choice.backups.len());
    for id in &choice.backups {
        let Some(stored) = by_id.get(id.as_str()) else {
            continue;
        };
        let Some(m) = stored.metadata.as_ref() else {
            continue;
        };
        if m.parent_id.as_ref().is_some_and(|p| failed.contains(p)) {
            failed.insert(id.clone());
            out.failures.push(format!(
                "{}/{}: not sent, its parent could not be sent",
                m.backup_name, m.backup_id
            ));
            continue;
        }
        match send_backup(source, copy, m, request, progress).await {
            Ok(bytes) => {
                out.bytes += bytes;
                out.backups_sent.push(id.clone());
                sent.insert(id.clone());
            }
            Err(e) => {
                tracing::warn!(backup = %id, error = %crate::error::chain(&e), "could not copy a backup");
                failed.insert(id.clone());
                out.failures.push(format!(
                    "{}/{}: {}",
                    m.backup_name,
                    m.backup_id,
                    crate::error::chain(&e)
                ));
            }
        }
    }
    sent
}

/// Sends one backup: claims its id in the copy (the in-flight marker, taking over one a
/// copier cut short left), sends each payload object (skipping one already completed there
/// with its recorded size), then commits `metadata.json` with the copy's own lock.
async fn send_backup(
    source: &ClusterStore,
    copy: &ClusterStore,
    m: &Metadata,
    request: &CopyRequest,
    progress: &dyn Progress,
) -> Result<u64, EngineError> {
    let lock_until = match (copy.object_lock(), copy.lock_period()) {
        (Some(_), Some(period)) => Some(period.after(m.started_at)),
        _ => None,
    };
    let spec = AttemptSpec {
        backup_name: m.backup_name.clone(),
        backup_id: m.backup_id.clone(),
        kind: m.kind,
        parent_id: m.parent_id.clone(),
        method: m.method.clone(),
        payload_name: m
            .payload
            .first()
            .map_or_else(|| "backup".to_owned(), |p| p.name.clone()),
        started_at: m.started_at,
        labels: m.labels.clone(),
        ttl: m.ttl,
        lock_until,
    };
    // A marker of this backup-id in the copy is a copier's that was cut short: backup-ids
    // are the source's, only copiers write them into a copy, and the copy's lease lets one
    // copier run at a time. It is taken over.
    let attempt = match Attempt::begin(copy, &spec).await {
        Ok(a) => a,
        Err(TransferError::AttemptExists { .. }) => {
            tidemark_store::transfer::release_marker(copy, &spec).await;
            Attempt::begin(copy, &spec).await?
        }
        Err(e) => return Err(e.into()),
    };
    let mut bytes = 0;
    for p in &m.payload {
        let key = layout::payload_key(&m.backup_name, &m.backup_id, &p.name);
        if already_there(copy, &key, p.size).await? {
            continue;
        }
        let expected = Expected {
            size: p.size,
            sha256: Some(&p.sha256),
            recorded_in: "metadata.json",
        };
        if let Err(e) = copy_object(
            source,
            copy,
            &key,
            expected,
            request.bandwidth.as_deref(),
            progress,
        )
        .await
        {
            attempt.abandon().await;
            return Err(e.into());
        }
        bytes += p.size;
    }
    let immutable_until = match lock_until {
        Some(_) => {
            let parent = match &m.parent_id {
                Some(p) => Some(tidemark_store::transfer::find_backup(copy, None, p).await?),
                None => None,
            };
            tidemark_store::transfer::chain_lock(copy, lock_until, parent.as_ref())
                .await?
                .0
        }
        None => None,
    };
    let record = AttemptRecord {
        payload: m.payload.clone(),
        log_position: m.log_position.clone(),
        server: m.server.clone(),
        error: None,
        extra: m.extra.clone(),
        completed_at: m.completed_at,
        immutable_until,
    };
    attempt
        .finish(record)
        .await
        .map_err(|u| EngineError::from(u.error))?;
    Ok(bytes)
}

/// Sends the chosen segments, several at once, and indexes them in the copy in sequence
/// order, each batch once all its objects are there; the first failure stops the indexing
/// (later segments are sent again next time). Returns the sequences not indexed.
async fn send_segments(
    source: &ClusterStore,
    copy: &ClusterStore,
    from: &Whole,
    choice: &CopyChoice,
    request: &CopyRequest,
    progress: &dyn Progress,
    out: &mut CopyOutcome,
) -> Result<HashSet<u64>, EngineError> {
    let timelines = from
        .catalog
        .index
        .as_ref()
        .map(|i| i.head.timelines.clone())
        .unwrap_or_default();
    let entries: Vec<&IndexEntry> = choice
        .segments
        .iter()
        .filter_map(|s| from.entries.get(s))
        .collect();
    progress.step("copying binlog segments", entries.len());
    let mut not_indexed: HashSet<u64> = HashSet::new();
    let mut stopped = false;
    for batch in entries.chunks(SEGMENT_BATCH) {
        if stopped {
            not_indexed.extend(batch.iter().map(|e| e.sequence));
            continue;
        }
        // Owned stores and entries: a stream of futures borrowing them is not `Send` for
        // every lifetime, which the runner's and the operator's tasks need.
        let work: Vec<_> = batch
            .iter()
            .map(|e| {
                let (source, copy, entry) = (source.clone(), copy.clone(), (*e).clone());
                let limit = request.bandwidth.clone();
                async move {
                    let key = layout::segment_key(&entry.name);
                    let expected = Expected {
                        size: entry.size,
                        sha256: entry.sha256.as_deref(),
                        recorded_in: "binlogs/_index.json",
                    };
                    let r = copy_object(
                        &source,
                        &copy,
                        &key,
                        expected,
                        limit.as_deref(),
                        &tidemark_store::NoProgress,
                    )
                    .await
                    .map(|()| entry.size);
                    (entry.sequence, r)
                }
            })
            .collect();
        let results: Vec<(u64, Result<u64, TransferError>)> = futures::stream::iter(work)
            .buffered(SEGMENT_CONCURRENCY)
            .collect()
            .await;
        let mut add = Vec::new();
        for ((seq, r), e) in results.into_iter().zip(batch.iter()) {
            match r {
                Ok(bytes) if !stopped => {
                    out.bytes += bytes;
                    progress.bytes(bytes);
                    add.push((*e).clone());
                }
                Ok(_) => {
                    not_indexed.insert(seq);
                }
                Err(err) => {
                    stopped = true;
                    not_indexed.insert(seq);
                    out.failures
                        .push(format!("binlogs/{}: {}", e.name, crate::error::chain(&err)));
                }
            }
        }
        if add.is_empty() {
            continue;
        }
        match tidemark_store::index::update(
            copy,
            None,
            &HashSet::new(),
            &add,
            &timelines,
            tidemark_store::index::SHARD_SIZE,
        )
        .await
        {
            Ok(_) => out.segments_sent += add.len(),
            Err(e) => {
                not_indexed.extend(add.iter().map(|e| e.sequence));
                out.failures
                    .push(format!("binlogs/_index.json: {}", crate::error::chain(&e)));
                stopped = true;
            }
        }
    }
    Ok(not_indexed)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use sha2::Digest;
    use std::collections::BTreeMap;
    use tidemark_store::NoProgress;
    use tidemark_store::fault::{FaultMode, FaultStore};
    use tidemark_store::format::BackupType;
    use tidemark_store::transfer::new_backup_id;

    async fn push(store: &ClusterStore, id: &str, parent: Option<&str>, body: Vec<u8>) {
        let spec = AttemptSpec {
            backup_name: "nightly".into(),
            backup_id: id.into(),
            kind: if parent.is_some() {
                BackupType::Incremental
            } else {
                BackupType::Full
            },
            parent_id: parent.map(str::to_owned),
            method: "exec".into(),
            payload_name: "backup.bin".into(),
            started_at: Timestamp::now(),
            labels: BTreeMap::new(),
            ttl: None,
            lock_until: None,
        };
        let attempt = Attempt::begin(store, &spec).await.unwrap();
        let payload = attempt
            .upload(&mut body.as_slice(), &NoProgress)
            .await
            .unwrap();
        attempt
            .finish(AttemptRecord {
                payload: vec![payload],
                ..Default::default()
            })
            .await
            .unwrap();
    }

    async fn segment(store: &ClusterStore, sequence: u64, body: Vec<u8>) {
        let name = format!("mysql-bin.{sequence:06}");
        let key = layout::segment_key(&name);
        let at = Timestamp::now();
        let entry = IndexEntry {
            name,
            sequence,
            first_event_at: Some(at),
            last_event_at: Some(at),
            size: body.len() as u64,
            sha256: Some(hex::encode(sha2::Sha256::digest(&body))),
            compression: None,
            encryption: None,
            server_id: None,
            file: None,
            gtid_list: None,
            previous_gtids: None,
            gtid_set: None,
            gtids: Vec::new(),
        };
        object_store::ObjectStoreExt::put(store.object_store().as_ref(), &key, body.into())
            .await
            .unwrap();
        tidemark_store::index::update(
            store,
            None,
            &HashSet::new(),
            &[entry],
            &[],
            tidemark_store::index::SHARD_SIZE,
        )
        .await
        .unwrap();
    }

    fn request() -> CopyRequest {
        CopyRequest {
            name: "dr".into(),
            policy: tidemark_core::PolicyInput {
                window: Some("36500d".into()),
                ..Default::default()
            }
            .validate()
            .unwrap(),
            now: Timestamp::now(),
            bandwidth: None,
            dry_run: false,
        }
    }

    /// The copy as it reads back: each committed backup with its payload checked against
    /// its record, and each indexed segment checked likewise.
    async fn read_back(store: &ClusterStore) -> (Vec<(String, Phase)>, Vec<String>) {
        let whole = read_whole(store, &NoProgress).await.unwrap();
        let mut backups = Vec::new();
        for b in &whole.catalog.backups {
            if let Some(m) = &b.metadata {
                for p in &m.payload {
                    let key = layout::payload_key(&m.backup_name, &m.backup_id, &p.name);
                    tidemark_store::transfer::verify_object(
                        store,
                        &key,
                        p.size,
                        Some(&p.sha256),
                        p.form(),
                        &NoProgress,
                    )
                    .await
                    .unwrap();
                }
            }
            backups.push((b.backup.id.clone(), b.backup.phase));
        }
        backups.sort_by(|a, b| a.0.cmp(&b.0));
        let mut segments = Vec::new();
        for e in whole.entries.values() {
            tidemark_store::transfer::verify_object(
                store,
                &layout::segment_key(&e.name),
                e.size,
                e.sha256.as_deref(),
                e.form(),
                &NoProgress,
            )
            .await
            .unwrap();
            segments.push(e.name.clone());
        }
        segments.sort();
        (backups, segments)
    }

    /// A copy pass cut at every request it makes to the copy (as a process killed there
    /// would be), then run again whole, leaves the copy exactly the source: every backup
    /// committed and reading back as recorded, every segment indexed and reading back,
    /// nothing half-made (a backup committed before its payload, or a segment indexed
    /// before its object, would not read back after a cut between the two). The copy is a
    /// fresh one each time while the source's record says everything was received: a copy
    /// that lost its data is sent again what the source has.
    #[tokio::test]
    async fn a_copy_cut_at_any_request_converges() {
        let (_s, source) = tidemark_store::testkit::local_store("c1");
        let full = new_backup_id(Timestamp::now());
        let inc = new_backup_id(Timestamp::now());
        push(&source, &full, None, vec![7u8; 300_000]).await;
        push(&source, &inc, Some(&full), vec![9u8; 100_000]).await;
        for seq in 1..=4 {
            segment(&source, seq, vec![seq as u8; 5_000]).await;
        }
        let expected = read_back(&source).await;
        assert_eq!(expected.0.len(), 2);
        let mut cuts = 0;
        for k in 0..500 {
            let (_d, copy) = tidemark_store::testkit::local_store("c1");
            let faulty = copy.map_inner(|inner| {
                std::sync::Arc::new(FaultStore::new(inner, FaultMode::From(k)))
                    as std::sync::Arc<dyn object_store::ObjectStore>
            });
            let cut = run(&source, &faulty, &request(), &NoProgress).await;
            let whole = matches!(&cut, Ok(o) if o.failures.is_empty());
            let again = run(&source, &copy, &request(), &NoProgress).await.unwrap();
            assert!(
                again.failures.is_empty(),
                "cut at {k}: {:?}",
                again.failures
            );
            assert_eq!(read_back(&copy).await, expected, "cut at {k}");
            if whole {
                break;
            }
            cuts += 1;
        }
        assert!(cuts > 10, "the pass was cut at {cuts} points only");
        // The source's record names what the copy received.
        let record = load_copy(&source, "dr").await.unwrap().unwrap();
        assert_eq!(
            record.received,
            [full.clone(), inc.clone()].into_iter().collect()
        );
        assert_eq!(record.segments_through, [(0, 4)].into());
    }
}
