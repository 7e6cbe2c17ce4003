//! Verify (issue 19 §4): every committed backup's payload and every indexed binlog segment
//! read back from the store and checked — size and sha256 of the stored bytes, and the
//! content where this machine can decode it (zstd's checksums; age's authentication, with
//! an identity) — then the chains and the recovery window. A damaged, cut or missing object
//! is named; nothing is written anywhere. `tidemark verify` is this use case; a retention
//! pass with `requireVerified` reads the newest backup's chain with the same check
//! ([`check_payload`]).

use std::collections::HashSet;

use futures::StreamExt;
use serde::Serialize;
use tidemark_core::plan::standing;
use tidemark_core::{Inventory, Phase, RecoveryWindow};
use tidemark_store::catalog::Catalog;
use tidemark_store::format::{IndexEntry, Metadata};
use tidemark_store::index::SegmentIndex;
use tidemark_store::transfer::{Checked, TransferError, verify_object};
use tidemark_store::{ClusterStore, NoProgress, Progress, SegmentListing, StoredBackup, layout};

use crate::error::EngineError;

/// Objects read at once.
const CONCURRENCY: usize = 4;

/// What became of one object.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectOut {
    pub key: String,
    /// `ok`, `damaged` (size, sha256 or content), `missing`, `unreachable` (the store
    /// failed; exit 3), or `unreadable` (a scheme this version does not read).
    pub status: &'static str,
    /// How deep the check went (`content`, or `stored` for encrypted objects without an
    /// identity here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checked: Option<Checked>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// One backup.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifiedBackup {
    pub backup_id: String,
    pub backup_name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `ok`, `damaged`, `missing`, `unreachable`, `unreadable`, or `brokenChain` (its
    /// payloads check out but an ancestor does not, or is gone).
    pub status: &'static str,
    pub restorable: bool,
    pub payload: Vec<ObjectOut>,
}

/// The binlog archive.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentsOut {
    pub indexed: usize,
    pub checked: usize,
    pub ok: usize,
    /// Every segment that is not `ok`.
    pub problems: Vec<ObjectOut>,
    /// Segments in the store that the index does not list: no restore replays them (an
    /// archiver stopped between upload and index, or one archiving right now). Not a
    /// problem of the data; passes collect those behind the recovery window.
    pub unindexed: usize,
    /// The first [`MAX_UNINDEXED_NAMES`] of them, in sequence order.
    pub unindexed_names: Vec<String>,
}

/// How many unindexed segments `verify` names.
pub const MAX_UNINDEXED_NAMES: usize = 20;

/// What to verify.
#[derive(Debug, Clone, Copy)]
pub struct VerifyRequest {
    /// The fraction of backups and segments read (1.0: all); the newest completed backup,
    /// its chain and the segments a restore from it replays are always read.
    pub sample: f64,
}

/// What verify found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    pub backups: Vec<VerifiedBackup>,
    pub segments: SegmentsOut,
    pub recovery_window: Option<RecoveryWindow>,
    /// `metadata.json` files that cannot be read: whatever they describe cannot be
    /// restored by this version.
    pub malformed: Vec<tidemark_store::Malformed>,
    /// Backups, segments and malformed files that are not `ok`.
    pub problems: usize,
    /// Some problem is damage to the data (not only a store that failed to answer).
    #[serde(skip)]
    pub damage: bool,
    /// The newest completed backup (read with its chain whatever the sample).
    #[serde(skip)]
    pub newest: Option<String>,
}

fn outcome(key: String, r: Result<Checked, TransferError>) -> ObjectOut {
    let (status, checked, problem) = match r {
        Ok(c) => ("ok", Some(c), None),
        Err(e) => {
            let status = match &e {
                TransferError::MissingPayload { .. } | TransferError::MissingSegment { .. } => {
                    "missing"
                }
                TransferError::Checksum { .. } | TransferError::Content { .. } => "damaged",
                // The store failing is not the data failing (exit 3, not 4).
                TransferError::Store(_) => "unreachable",
                _ => "unreadable",
            };
            (status, None, Some(crate::error::chain(&e)))
        }
    };
    ObjectOut {
        key,
        status,
        checked,
        problem,
    }
}

/// Whether to check the next item at `fraction` (a new random draw each run).
fn drawn(fraction: f64) -> impl FnMut() -> bool {
    move || fraction >= 1.0 || rand::random::<f64>() < fraction
}

/// `full`, `incremental` (what `ls` says of a backup's type).
fn kind_of(b: &tidemark_core::Backup) -> &'static str {
    match b.kind {
        tidemark_core::BackupKind::Full => "full",
        tidemark_core::BackupKind::Incremental(_) => "incremental",
    }
}

/// The newest completed backup of `completed` and what a restore of it reads: its chain as
/// the planner resolves it (a synthetic full standing in for the increments it merged) and
/// its recorded ancestors, also when the chain is broken (then as far as it goes).
pub fn newest_chain(inventory: &Inventory, newest: &tidemark_core::Backup) -> HashSet<String> {
    let mut always = HashSet::from([newest.id.clone()]);
    if let Some(chain) = tidemark_core::plan::chain_of(inventory, &newest.id) {
        always.extend(chain.into_iter().map(|b| b.id));
    }
    let mut walked: HashSet<String> = HashSet::new();
    let mut parent = newest.kind.parent().cloned();
    while let Some(id) = parent.take() {
        if !walked.insert(id.clone()) {
            break;
        }
        always.insert(id.clone());
        parent = inventory
            .backups
            .iter()
            .find(|b| b.id == id)
            .and_then(|b| b.kind.parent().cloned());
    }
    always
}

/// Reads back one payload `m` records (size, sha256, content where it can be decoded):
/// the check of `verify` and of a pass's `requireVerified`.
///
/// # Errors
/// The payload is missing, cut or damaged, cannot be decoded here, or the store failed.
pub async fn check_payload(
    store: &ClusterStore,
    m: &Metadata,
    p: &tidemark_store::format::PayloadObject,
    progress: &dyn Progress,
) -> Result<Checked, TransferError> {
    let key = layout::payload_key(&m.backup_name, &m.backup_id, &p.name);
    verify_object(store, &key, p.size, Some(&p.sha256), p.form(), progress).await
}

/// [`check_payload`] for every payload `m` records, as verify reports them.
pub async fn check_payloads(
    store: &ClusterStore,
    m: &Metadata,
    progress: &dyn Progress,
) -> Vec<ObjectOut> {
    let mut out = Vec::new();
    for p in &m.payload {
        let key = layout::payload_key(&m.backup_name, &m.backup_id, &p.name);
        let r = check_payload(store, m, p, progress).await;
        out.push(outcome(store.display_key(&key), r));
    }
    out
}

/// Verifies `store`: `None` when it holds no committed backup.
///
/// # Errors
/// The catalog or the index could not be read.
pub async fn verify(
    store: &ClusterStore,
    request: &VerifyRequest,
) -> Result<Option<Verification>, EngineError> {
    let fraction = request.sample;
    let mut catalog = Catalog::load(store, &NoProgress).await?;
    // Every shard, so that every segment is known one by one.
    if let Some(index) = &mut catalog.index {
        let keys: Vec<String> = index.unread().map(|s| s.key.clone()).collect();
        index.read_shards(store, keys).await?;
    }
    let mut inventory = catalog.inventory(&SegmentListing::default());

    // The committed backups to read: all, or a sample that always holds the newest
    // completed backup and what it builds on.
    let mut completed: Vec<&StoredBackup> = catalog
        .backups
        .iter()
        .filter(|b| b.backup.phase == Phase::Completed && b.metadata.is_some())
        .collect();
    completed.sort_by(|a, b| {
        (a.backup.started_at, &a.backup.id).cmp(&(b.backup.started_at, &b.backup.id))
    });
    if completed.is_empty() {
        return Ok(None);
    }
    let mut always: HashSet<String> = HashSet::new();
    let mut newest_start = None;
    let newest_id = completed.last().map(|b| b.backup.id.clone());
    if let Some(newest) = completed.last() {
        newest_start = Some(newest.backup.started_at);
        always = newest_chain(&inventory, &newest.backup);
    }
    let mut draw = drawn(fraction);
    let chosen: Vec<&StoredBackup> = completed
        .into_iter()
        .filter(|b| always.contains(&b.backup.id) || draw())
        .collect();

    // Futures of named functions over collected references, no closures held across an
    // await: the use case's future is `Send` (the operator runs it as background work).
    let checks: Vec<_> = chosen.into_iter().map(|b| check_backup(store, b)).collect();
    let checked: Vec<_> = futures::stream::iter(checks)
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    // A retention pass running meanwhile deletes backups: one whose payload went missing
    // *and* whose metadata.json is gone too was deleted, not lost — left out of the report.
    let mut kept = Vec::with_capacity(checked.len());
    for (b, payload) in checked {
        if payload.iter().any(|o| o.status == "missing") {
            let meta = layout::payload_key(&b.backup.name, &b.backup.id, layout::METADATA);
            if matches!(store.head(&meta).await, Ok(None)) {
                tracing::info!(backup = %b.backup.id, "deleted while verify ran; left out");
                continue;
            }
        }
        kept.push((b, payload));
    }
    let checked = kept;

    // The segments: those a restore from the newest backup replays always, the rest
    // drawn. Only problems are kept (an archive may hold millions of segments).
    let mut draw = drawn(fraction);
    let mut seen: HashSet<(u64, &str)> = HashSet::new();
    let mut chosen_segments: Vec<&IndexEntry> = Vec::new();
    for e in catalog.index.iter().flat_map(SegmentIndex::entries) {
        if !seen.insert((e.sequence, e.name.as_str())) {
            continue;
        }
        let needed = newest_start.is_some_and(|t| e.last_event_at.is_none_or(|last| last >= t));
        if needed || draw() {
            chosen_segments.push(e);
        }
    }
    let mut segments_checked = 0usize;
    let mut segments_ok = 0usize;
    let mut segment_problems: Vec<ObjectOut> = Vec::new();
    let mut pending = chosen_segments.into_iter();
    let mut running = futures::stream::FuturesUnordered::new();
    loop {
        while running.len() < CONCURRENCY * 2 {
            let Some(e) = pending.next() else { break };
            running.push(check_segment(store, e));
        }
        let Some(o) = running.next().await else { break };
        segments_checked += 1;
        if o.status == "ok" {
            segments_ok += 1;
        } else {
            segment_problems.push(o);
        }
    }
    let indexed = seen.len();
    // Segments stored but not indexed: listed whole (cheap beside reading the archive), and
    // those the index names by now (archived while this ran) left out. A listing that
    // fails only leaves this part of the report out.
    let indexed_names: HashSet<&str> = seen.iter().map(|(_, n)| *n).collect();
    let unindexed: Vec<String> = match tidemark_store::catalog::list_segments(
        store,
        u64::MAX,
        false,
        &[],
        &NoProgress,
    )
    .await
    {
        Ok(listed) => {
            let mut names: Vec<String> = listed
                .objects
                .iter()
                .filter(|o| !indexed_names.contains(o.name.as_str()))
                .map(|o| o.name.clone())
                .collect();
            if !names.is_empty()
                && let Ok(now) = index_now(store).await
            {
                let now: HashSet<&str> = now
                    .iter()
                    .flat_map(|i| i.entries())
                    .map(|e| e.name.as_str())
                    .collect();
                names.retain(|n| !now.contains(n.as_str()));
            }
            names
        }
        Err(e) => {
            tracing::warn!("unindexed segments not looked for: listing binlogs/ failed: {e}");
            Vec::new()
        }
    };
    segment_problems.sort_by(|a, b| a.key.cmp(&b.key));

    // A segment missing because a pass deleted it meanwhile is no longer in the index.
    if segment_problems.iter().any(|o| o.status == "missing")
        && let Ok(now) = index_now(store).await
    {
        let still: HashSet<&str> = now
            .iter()
            .flat_map(|i| i.entries())
            .map(|e| e.name.as_str())
            .collect();
        segment_problems.retain(|o| {
            o.status != "missing" || o.key.rsplit('/').next().is_some_and(|n| still.contains(n))
        });
    }
    // What can be restored given what was read: damaged backups count as missing, damaged
    // segments as absent, and the chains and the window follow.
    let own_status = |payload: &[ObjectOut]| {
        if payload.is_empty() {
            return "missing";
        }
        payload
            .iter()
            .map(|o| o.status)
            .find(|s| *s != "ok")
            .unwrap_or("ok")
    };
    // A payload the store failed to serve says nothing about the data: not counted gone.
    let bad: HashSet<&str> = checked
        .iter()
        .filter(|(_, p)| !matches!(own_status(p), "ok" | "unreachable"))
        .map(|(b, _)| b.backup.id.as_str())
        .collect();
    for b in &mut inventory.backups {
        if bad.contains(b.id.as_str()) {
            b.payload_missing = true;
        }
    }
    let bad_segments: HashSet<String> = segment_problems
        .iter()
        .filter_map(|o| o.key.rsplit('/').next().map(str::to_owned))
        .collect();
    for seg in &mut inventory.segments {
        if bad_segments.contains(&seg.name) {
            seg.present = false;
        }
    }
    let standing = standing(&inventory);
    let mut backups: Vec<VerifiedBackup> = checked
        .into_iter()
        .map(|(b, payload)| {
            let own = own_status(&payload);
            let restorable = standing.restorable.contains(&b.backup.id);
            VerifiedBackup {
                backup_id: b.backup.id.clone(),
                backup_name: b.backup.name.clone(),
                kind: kind_of(&b.backup),
                status: if own == "ok" && !restorable {
                    "brokenChain"
                } else {
                    own
                },
                restorable,
                payload,
            }
        })
        .collect();
    backups.sort_by(|a, b| a.backup_id.cmp(&b.backup_id));
    // Damage found wins over a store that failed to answer (exit 4 before 3).
    let damage = backups
        .iter()
        .any(|b| !matches!(b.status, "ok" | "unreachable"))
        || segment_problems.iter().any(|o| o.status != "unreachable")
        || !catalog.malformed.is_empty();
    let problems = backups.iter().filter(|b| b.status != "ok").count()
        + segment_problems.len()
        + catalog.malformed.len();
    Ok(Some(Verification {
        backups,
        segments: SegmentsOut {
            indexed,
            checked: segments_checked,
            ok: segments_ok,
            problems: segment_problems,
            unindexed: unindexed.len(),
            unindexed_names: unindexed.into_iter().take(MAX_UNINDEXED_NAMES).collect(),
        },
        recovery_window: standing.window.clone(),
        malformed: catalog.malformed.clone(),
        problems,
        newest: newest_id,
        damage,
    }))
}

/// Reads back every payload `b` records.
async fn check_backup<'a>(
    store: &'a ClusterStore,
    b: &'a StoredBackup,
) -> (&'a StoredBackup, Vec<ObjectOut>) {
    let mut out = Vec::new();
    if let Some(m) = &b.metadata {
        out.extend(check_payloads(store, m, &NoProgress).await);
    }
    (b, out)
}

/// Reads back the segment `e` names.
async fn check_segment(store: &ClusterStore, e: &IndexEntry) -> ObjectOut {
    let shown = format!("{}/{}/{}", store.cluster, layout::BINLOGS, e.name);
    if !layout::is_segment_name(&e.name) {
        return ObjectOut {
            key: shown,
            status: "unreadable",
            checked: None,
            problem: Some(format!("{:?} is not a binlog segment name", e.name)),
        };
    }
    let key = layout::segment_key(&e.name);
    let r = verify_object(
        store,
        &key,
        e.size,
        e.sha256.as_deref(),
        e.form(),
        &NoProgress,
    )
    .await;
    outcome(store.display_key(&key), r)
}

/// The segment index as it is now, every shard read.
async fn index_now(
    store: &ClusterStore,
) -> Result<Option<tidemark_store::index::SegmentIndex>, tidemark_store::StoreError> {
    let Some(mut index) = tidemark_store::index::SegmentIndex::load(store).await? else {
        return Ok(None);
    };
    let keys: Vec<String> = index.unread().map(|s| s.key.clone()).collect();
    index.read_shards(store, keys).await?;
    Ok(Some(index))
}

#[cfg(test)]
mod tests {
    use jiff::{SignedDuration, Timestamp};
    use object_store::ObjectStoreExt as _;
    use tidemark_store::synth::{self, SynthBackup};

    use super::*;

    /// Verify reads every backup back: a damaged payload is named, its backup and what
    /// builds on it are not restorable, and the window shrinks to what is left.
    #[tokio::test]
    async fn verify_names_damage_and_the_window_that_follows() {
        let (_dir, store) = tidemark_store::testkit::local_store("c");
        assert!(
            verify(&store, &VerifyRequest { sample: 1.0 })
                .await
                .unwrap()
                .is_none(),
            "an empty store has nothing to verify"
        );
        let now = Timestamp::now();
        let a = SynthBackup::full("a", now - SignedDuration::from_hours(5), 1);
        let a1 = SynthBackup::incremental("a1", &a.id, now - SignedDuration::from_hours(4), 2);
        let b = SynthBackup::full("b", now - SignedDuration::from_hours(3), 3);
        synth::write_backups(&store, &[a.clone(), a1.clone(), b.clone()])
            .await
            .unwrap();
        let all = verify(&store, &VerifyRequest { sample: 1.0 })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(all.problems, 0, "{all:?}");
        assert!(all.backups.iter().all(|b| b.status == "ok" && b.restorable));
        // The base of the chain is damaged on the way (same size, other bytes).
        let key =
            object_store::path::Path::from_iter([a.name.as_str(), a.id.as_str(), "backup.tar"]);
        let mut bytes = a.payload.clone();
        bytes[0] ^= 0xff;
        store.object_store().put(&key, bytes.into()).await.unwrap();
        let found = verify(&store, &VerifyRequest { sample: 1.0 })
            .await
            .unwrap()
            .unwrap();
        let status = |id: &str| {
            found
                .backups
                .iter()
                .find(|v| v.backup_id == id)
                .map(|v| (v.status, v.restorable))
                .unwrap()
        };
        assert_eq!(status(&a.id), ("damaged", false));
        assert_eq!(status(&a1.id), ("brokenChain", false));
        assert_eq!(status(&b.id), ("ok", true));
        assert_eq!(found.problems, 2);
        assert!(found.damage);
        let window = found.recovery_window.unwrap();
        assert!(window.from >= b.started_at, "{window:?}");
    }
}
