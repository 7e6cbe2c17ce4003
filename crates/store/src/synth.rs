//! Writes well-formed backups, segments and indexes straight into a store: the example
//! store, the tests and the benchmarks build their histories with it. (Real backups come
//! from `tidemark push`; these carry small synthetic payloads.)

use futures::{StreamExt, stream};
use jiff::{SignedDuration, Timestamp};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};

use crate::error::StoreError;
use crate::format::{
    BackupType, FORMAT_VERSION, IndexEntry, LogPosition, Metadata, MetadataPhase, PayloadObject,
};
use crate::layout;
use crate::open::ClusterStore;

/// Objects written at once.
const WRITE_CONCURRENCY: usize = 32;

/// One synthetic backup.
#[derive(Debug, Clone)]
pub struct SynthBackup {
    pub name: String,
    pub id: String,
    pub parent: Option<String>,
    pub started_at: Timestamp,
    pub duration: SignedDuration,
    pub failed: bool,
    /// Write the payload but no `metadata.json` (an interrupted attempt).
    pub uncommitted: bool,
    pub payload: Vec<u8>,
    pub log_file: Option<String>,
    /// The GTID position recorded beside `log_file`.
    pub gtid: Option<String>,
    pub labels: Vec<(String, String)>,
    /// The method recorded (`exec` unless set; `mariabackup` makes it consolidatable).
    pub method: String,
    /// For a synthetic full: the chain it merged (`consolidatedFrom`), base first.
    pub consolidated_from: Vec<String>,
    /// Recorded as locked until then (no lock is set on the server).
    pub immutable_until: Option<Timestamp>,
    /// Its recorded ttl (seed 004).
    pub ttl: Option<tidemark_core::RetentionDuration>,
}

impl SynthBackup {
    /// A completed full backup of `payload` started at `started_at`, with a backup-id
    /// derived from the time and `salt`.
    pub fn full(name: &str, started_at: Timestamp, salt: u32) -> Self {
        SynthBackup {
            name: name.to_owned(),
            id: backup_id(started_at, salt),
            parent: None,
            started_at,
            duration: SignedDuration::from_mins(5),
            failed: false,
            uncommitted: false,
            payload: format!("payload of {name} at {started_at}\n").into_bytes(),
            log_file: None,
            gtid: None,
            labels: Vec::new(),
            method: "exec".into(),
            consolidated_from: Vec::new(),
            immutable_until: None,
            ttl: None,
        }
    }

    pub fn incremental(name: &str, parent: &str, started_at: Timestamp, salt: u32) -> Self {
        SynthBackup {
            parent: Some(parent.to_owned()),
            ..SynthBackup::full(name, started_at, salt)
        }
    }

    pub fn metadata(&self, cluster: &str) -> Metadata {
        Metadata {
            format_version: FORMAT_VERSION,
            backup_id: self.id.clone(),
            backup_name: self.name.clone(),
            cluster: cluster.to_owned(),
            kind: if self.parent.is_some() {
                BackupType::Incremental
            } else {
                BackupType::Full
            },
            parent_id: self.parent.clone(),
            method: self.method.clone(),
            phase: if self.failed {
                MetadataPhase::Failed
            } else {
                MetadataPhase::Completed
            },
            started_at: self.started_at,
            completed_at: Some(self.started_at + self.duration),
            payload: vec![PayloadObject {
                name: "backup.tar".into(),
                size: self.payload.len() as u64,
                sha256: hex::encode(Sha256::digest(&self.payload)),
                compression: None,
                original_size: None,
                encryption: None,
            }],
            log_position: self.log_file.as_ref().map(|f| LogPosition {
                file: f.clone(),
                position: 4,
                gtid: self.gtid.clone(),
            }),
            server: None,
            immutable_until: self.immutable_until,
            ttl: self.ttl,
            labels: self.labels.iter().cloned().collect(),
            error: self.failed.then(|| "synthetic failure".to_owned()),
            extra: if self.consolidated_from.is_empty() {
                serde_json::Map::new()
            } else {
                serde_json::Map::from_iter([(
                    crate::format::CONSOLIDATED_FROM.to_owned(),
                    serde_json::json!(self.consolidated_from),
                )])
            },
        }
    }
}

/// `<YYYYMMDDTHHMMSSZ>-<8 hex>`.
pub fn backup_id(started_at: Timestamp, salt: u32) -> String {
    format!("{}-{:08x}", started_at.strftime("%Y%m%dT%H%M%SZ"), salt)
}

fn put_err(store: &ClusterStore, key: &Path, source: object_store::Error) -> StoreError {
    StoreError::Request {
        url: store.url.clone(),
        action: format!("writing {}", store.display_key(key)),
        answer: source,
    }
}

async fn put_all(store: &ClusterStore, objects: Vec<(Path, Vec<u8>)>) -> Result<(), StoreError> {
    let results: Vec<Result<(), StoreError>> = stream::iter(objects)
        .map(|(key, body)| async move {
            store
                .inner
                .put(&key, PutPayload::from(body))
                .await
                .map(|_| ())
                .map_err(|e| put_err(store, &key, e))
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Writes each backup's payload, then (unless uncommitted) its `metadata.json`.
/// Two completed fulls written to `store`: `older` three hours before `now`, `newer` one
/// hour before — the commonest store a retention or deletion test starts from.
///
/// # Errors
/// As [`write_backups`].
pub async fn older_and_newer(
    store: &ClusterStore,
    older: &str,
    newer: &str,
    now: Timestamp,
) -> Result<(SynthBackup, SynthBackup), StoreError> {
    let o = SynthBackup::full(older, now - SignedDuration::from_hours(3), 1);
    let n = SynthBackup::full(newer, now - SignedDuration::from_hours(1), 2);
    write_backups(store, &[o.clone(), n.clone()]).await?;
    Ok((o, n))
}

pub async fn write_backups(
    store: &ClusterStore,
    backups: &[SynthBackup],
) -> Result<(), StoreError> {
    let payloads = backups
        .iter()
        .map(|b| {
            (
                Path::from_iter([b.name.as_str(), b.id.as_str(), "backup.tar"]),
                b.payload.clone(),
            )
        })
        .collect();
    put_all(store, payloads).await?;
    let mut metas = Vec::new();
    for b in backups.iter().filter(|b| !b.uncommitted) {
        let body = serde_json::to_vec_pretty(&b.metadata(&store.cluster)).map_err(|source| {
            StoreError::Encode {
                url: store.url.clone(),
                what: "metadata.json",
                source,
            }
        })?;
        metas.push((layout::metadata_key(&b.name, &b.id), body));
    }
    put_all(store, metas).await
}

/// `count` contiguous segments from `first_sequence`, each `every` long from `start`,
/// with tiny bodies (recorded with their true size and sha256). Returns their index
/// entries.
pub fn segments(
    prefix: &str,
    first_sequence: u64,
    count: u64,
    start: Timestamp,
    every: SignedDuration,
) -> Vec<IndexEntry> {
    (0..count)
        .map(|k| {
            let seq = first_sequence + k;
            let first = start + every * (k as i32);
            IndexEntry {
                name: format!("{prefix}.{seq:06}"),
                sequence: seq,
                first_event_at: Some(first),
                last_event_at: Some(first + every),
                size: segment_body(seq).len() as u64,
                sha256: Some(hex::encode(Sha256::digest(segment_body(seq)))),
                compression: None,
                encryption: None,
                server_id: None,
                file: None,
                gtid_list: None,
                previous_gtids: None,
                gtid_set: None,
                gtids: Vec::new(),
            }
        })
        .collect()
}

fn segment_body(seq: u64) -> Vec<u8> {
    format!("segment {seq:010}\n").into_bytes()
}

/// Writes segment objects for `entries` (and not the index).
pub async fn write_segments(
    store: &ClusterStore,
    entries: &[IndexEntry],
) -> Result<(), StoreError> {
    put_all(
        store,
        entries
            .iter()
            .map(|e| (layout::segment_key(&e.name), segment_body(e.sequence)))
            .collect(),
    )
    .await
}

/// Writes the segment index listing `entries`, in shards of the standard size beyond
/// it (a single `_index.json` up to 4,096 entries).
pub async fn write_index(store: &ClusterStore, entries: &[IndexEntry]) -> Result<(), StoreError> {
    crate::index::write_new(store, entries, crate::index::SHARD_SIZE).await
}

/// Writes the segment index listing `entries` in shards of `shard_size`.
pub async fn write_index_sharded(
    store: &ClusterStore,
    entries: &[IndexEntry],
    shard_size: usize,
) -> Result<(), StoreError> {
    crate::index::write_new(store, entries, shard_size).await
}

/// Writes an arbitrary object (foreign files, corrupt metadata in tests).
pub async fn write_raw(store: &ClusterStore, key: &str, body: &[u8]) -> Result<(), StoreError> {
    put_all(store, vec![(Path::from(key), body.to_vec())]).await
}

/// Every key under the cluster prefix, sorted (for tests and examples).
pub async fn all_keys(store: &ClusterStore) -> Result<Vec<String>, StoreError> {
    use futures::TryStreamExt;
    let mut keys: Vec<String> = store
        .inner
        .list(None)
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .map_err(|source| StoreError::Request {
            url: store.url.clone(),
            action: "listing".into(),
            answer: source,
        })?;
    keys.sort();
    Ok(keys)
}

/// The backup-ids that have a `metadata.json` under the cluster prefix, sorted.
///
/// # Errors
/// The listing failed.
pub async fn metadata_ids(store: &ClusterStore) -> Result<Vec<String>, StoreError> {
    let mut ids: Vec<String> = all_keys(store)
        .await?
        .into_iter()
        .filter(|k| k.ends_with("/metadata.json"))
        .filter_map(|k| k.split('/').nth(1).map(str::to_owned))
        .collect();
    ids.sort();
    Ok(ids)
}
