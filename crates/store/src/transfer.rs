//! Moving backup bytes: a stream into `<name>/<id>/backup.<ext>` with a multipart upload
//! (size and sha256 computed on the way, memory bounded whatever the stream's length), the
//! commit (`metadata.json`, written last), and the way back out with the checksum verified.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::StreamExt;
use jiff::Timestamp;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};
use tidemark_core::RetentionDuration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{StoreError, is_not_found};
use crate::format::{
    BackupType, FORMAT_VERSION, LogPosition, Metadata, MetadataPhase, PayloadObject,
};
use crate::layout;
use crate::open::ClusterStore;
use crate::open::{request, write_err};
use crate::progress::Progress;

pub use crate::open::{PART_SIZE, PARTS_IN_FLIGHT};
/// Bytes read from the source at a time.
const READ_CHUNK: usize = 1 << 20;

/// What a backup is, besides its bytes.
#[derive(Debug, Clone)]
pub struct AttemptSpec {
    pub backup_name: String,
    pub backup_id: String,
    pub kind: BackupType,
    pub parent_id: Option<String>,
    pub method: String,
    /// Payload object name, e.g. `backup.xbstream`.
    pub payload_name: String,
    pub started_at: Timestamp,
    pub labels: BTreeMap<String, String>,
    pub ttl: Option<RetentionDuration>,
    /// Lock the backup (S3 Object Lock) at least until then; its chain's date may make it
    /// later ([`chain_lock`]).
    pub lock_until: Option<Timestamp>,
}

/// Errors of a push or fetch.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error(
        "invalid backup name {0:?}: expected letters, digits, '-', '_' or '.', not starting with '_' or '.'"
    )]
    InvalidName(String),
    #[error(
        "invalid backup-id {0:?}: expected <UTC start YYYYMMDDTHHMMSSZ>-<8 lowercase hex>, e.g. 20261120T020000Z-3f2a9c1d"
    )]
    InvalidId(String),
    #[error("backup {name}/{id} is already committed in {url}; a backup-id names one attempt")]
    AlreadyCommitted {
        url: String,
        name: String,
        id: String,
    },
    #[error(
        "backup-id {id} is taken: another attempt holds it (its in-flight marker {marker} exists, last written {written}); a backup-id names one attempt, so choose another (or omit --backup-id)"
    )]
    AttemptExists {
        id: String,
        /// The marker's key, relative to the store URL.
        marker: String,
        written: String,
    },
    #[error(
        "the payload {key} is not in the store as uploaded ({found}) — another process deleted or replaced it — so the backup was not committed"
    )]
    PayloadGone { key: String, found: String },
    #[error("the backup stream was empty (0 bytes): nothing to commit")]
    EmptyStream,
    #[error("reading the backup stream failed after {bytes} bytes")]
    Source {
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("no committed backup {what} in {url}")]
    NotFound { url: String, what: String },
    #[error(
        "backup {name}/{id} in {url} expired: its lock ended at {until} and a retention pass recorded it as expired ({record}); its objects are left to the bucket's lifecycle rule and no restore uses it"
    )]
    Expired {
        url: String,
        name: String,
        id: String,
        until: jiff::Timestamp,
        record: String,
    },
    #[error("{key} is missing: the backup is committed but its payload is gone")]
    MissingPayload { key: String },
    #[error("{key} is missing: binlogs/_index.json names it but the object is gone")]
    MissingSegment { key: String },
    #[error("backup {name}/{id} is recorded as failed: {error}")]
    Failed {
        name: String,
        id: String,
        error: String,
    },
    #[error(
        "{key}: read {actual_size} bytes with sha256 {actual_sha256}, but {recorded_in} records {expected_size} bytes with sha256 {expected_sha256}"
    )]
    Checksum {
        key: String,
        /// Where the expected values come from: `metadata.json` or `binlogs/_index.json`.
        recorded_in: &'static str,
        expected_size: u64,
        expected_sha256: String,
        actual_size: u64,
        actual_sha256: String,
    },
    #[error("{key}: its content cannot be read back: {problem}")]
    Content { key: String, problem: String },
    #[error(
        "{key} is encrypted to the age recipients with fingerprints {recipients}, and no identity given is one of them ({have}); pass the identity file of one of those recipients (--identity, TIDEMARK_IDENTITY_FILE); nothing was written",
        recipients = .recipients.join(", "),
        have = if .have.is_empty() { "no identity was given".to_owned() } else { format!("given: {}", .have.join(", ")) }
    )]
    NoIdentity {
        key: String,
        recipients: Vec<String>,
        have: Vec<String>,
    },
    #[error(
        "{key} is not encrypted, but this store encrypts (to {recipients} recipient(s)){}: it is \
         not read, since whoever can write the bucket could have planted it. If it is from \
         before encryption was turned on, name that instant: --allow-plaintext-before \
         (TIDEMARK_ALLOW_PLAINTEXT_BEFORE, objectStore.encryption.plaintextBefore)",
        match (.written, .before) {
            (Some(w), Some(b)) => format!("; it was written at {w}, not before {b}"),
            (None, Some(b)) => format!("; it records no time to compare with {b}"),
            _ => String::new(),
        }
    )]
    Plaintext {
        key: String,
        recipients: usize,
        written: Option<jiff::Timestamp>,
        before: Option<jiff::Timestamp>,
    },
    #[error("writing the fetched bytes failed")]
    Sink(#[source] std::io::Error),
    #[error("{key} is not valid metadata: {problem}")]
    Metadata { key: String, problem: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A new backup-id for an attempt started at `at`: `<YYYYMMDDTHHMMSSZ>-<8 random hex>`.
pub fn new_backup_id(at: Timestamp) -> String {
    format!(
        "{}-{:08x}",
        at.strftime("%Y%m%dT%H%M%SZ"),
        rand::random::<u32>()
    )
}

/// Whether `name` may be a backup name (one path segment of the layout).
pub fn valid_backup_name(name: &str) -> bool {
    layout::is_backup_name(name)
}

/// An upload in progress: bytes go in, size and sha256 are kept.
#[derive(Debug)]
pub struct Upload {
    key: Path,
    writer: BufWriter,
    /// Of the stored bytes.
    hasher: Sha256,
    stored: u64,
    /// Of the content, before compression.
    original: u64,
    /// Compresses and encrypts (`None`: stored as it comes). Taken while a chunk is in
    /// its blocking task.
    encoder: Option<crate::codec::Encoder>,
    /// Whether the object is compressed or encrypted: then a missing encoder (lost with a
    /// failed or cancelled chunk) is an error, never plaintext.
    coded: bool,
    compression: Option<&'static str>,
    encryption: Option<crate::format::Encryption>,
    payload_name: String,
}

impl Upload {
    /// Starts the payload upload of `spec` (nothing is sent until the first part fills).
    /// The caller holds the attempt ([`Attempt::begin`]).
    ///
    /// # Errors
    /// An invalid name or id; the encoder could not start.
    pub fn start(store: &ClusterStore, spec: &AttemptSpec) -> Result<Self, TransferError> {
        check_spec(spec)?;
        let name = payload_name(store, spec);
        let key = layout::payload_key(&spec.backup_name, &spec.backup_id, &name);
        Ok(Upload::to_key(store, key, &name)?)
    }

    /// An upload to any key of the cluster (segments, payloads); `name` is what the
    /// returned [`PayloadObject`] calls it. Compressed and encrypted as the store says.
    ///
    /// # Errors
    /// zstd refused its parameters, or age could not start.
    pub fn to_key(store: &ClusterStore, key: Path, name: &str) -> Result<Self, StoreError> {
        let (part_size, in_flight) = store.upload_buffer;
        let encoder = crate::codec::Encoder::new(store.compression, store.recipients.as_deref())
            .map_err(|e| compress_err(store, &key, e))?;
        let writer = BufWriter::with_capacity(store.inner.clone(), key.clone(), part_size)
            .with_max_concurrency(in_flight);
        Ok(Upload {
            key,
            writer,
            hasher: Sha256::new(),
            stored: 0,
            original: 0,
            coded: encoder.is_some(),
            encoder,
            compression: store.compression.recorded(),
            encryption: store
                .recipients
                .as_deref()
                .map(crate::crypt::Recipients::record),
            payload_name: name.to_owned(),
        })
    }

    /// Hands stored bytes to the writer.
    async fn write(&mut self, store: &ClusterStore, bytes: Bytes) -> Result<(), StoreError> {
        if bytes.is_empty() {
            return Ok(());
        }
        if let Some(limit) = &store.bandwidth {
            limit.take(bytes.len() as u64).await;
        }
        self.hasher.update(&bytes);
        self.stored += bytes.len() as u64;
        self.writer
            .put(bytes)
            .await
            .map_err(|source| write_err(store, &self.key, source))
    }

    /// Sends one chunk.
    ///
    /// # Errors
    /// The store refused a part; the encoder failed.
    pub async fn put(&mut self, store: &ClusterStore, chunk: Bytes) -> Result<(), StoreError> {
        self.original += chunk.len() as u64;
        let stored = match self.encoder.take() {
            Some(mut encoder) => {
                let (encoder, stored) = tokio::task::spawn_blocking(move || {
                    let stored = encoder.push(&chunk);
                    (encoder, stored)
                })
                .await
                .map_err(|e| compress_err(store, &self.key, std::io::Error::other(e)))?;
                self.encoder = Some(encoder);
                Bytes::from(stored.map_err(|e| compress_err(store, &self.key, e))?)
            }
            None if self.coded => return Err(lost_encoder(store, &self.key)),
            None => chunk,
        };
        self.write(store, stored).await
    }

    /// Content bytes taken so far (before compression).
    pub fn size(&self) -> u64 {
        self.original
    }

    /// Completes the upload: the payload object exists, uncommitted.
    ///
    /// # Errors
    /// The store refused the last part or the completion.
    pub async fn finish(mut self, store: &ClusterStore) -> Result<PayloadObject, StoreError> {
        if self.coded && self.encoder.is_none() {
            return Err(lost_encoder(store, &self.key));
        }
        if let Some(encoder) = self.encoder.take() {
            let rest = tokio::task::spawn_blocking(move || encoder.finish())
                .await
                .map_err(|e| compress_err(store, &self.key, std::io::Error::other(e)))?
                .map_err(|e| compress_err(store, &self.key, e))?;
            self.write(store, Bytes::from(rest)).await?;
        }
        self.writer.shutdown().await.map_err(|e| {
            write_err(
                store,
                &self.key,
                object_store::Error::Generic {
                    store: "upload",
                    source: Box::new(e),
                },
            )
        })?;
        Ok(PayloadObject {
            name: self.payload_name,
            size: self.stored,
            sha256: hex::encode(self.hasher.finalize()),
            compression: self.compression.map(str::to_owned),
            original_size: (self.compression.is_some() || self.encryption.is_some())
                .then_some(self.original),
            encryption: self.encryption,
        })
    }

    /// Abandons the upload, removing what was sent (best effort: a leftover is an
    /// uncommitted payload, collected after `failedBackupsTTL`).
    ///
    /// # Guarantees
    /// Only this upload's own payload key (and its unfinished multipart upload); nothing
    /// committed refers to it yet.
    pub async fn abort(mut self, store: &ClusterStore) {
        if let Err(e) = self.writer.abort().await {
            tracing::warn!(error = %e, key = %store.display_key(&self.key), "could not abort the upload");
        }
        let _ = store.inner.delete(&self.key).await;
    }
}

/// The payload object's name for `spec` in `store`: a compressed payload says so in its name
/// too (`backup.xbstream.zst`).
pub fn payload_name(store: &ClusterStore, spec: &AttemptSpec) -> String {
    match store.compression.recorded() {
        Some(_) => format!("{}{}", spec.payload_name, crate::compress::ZSTD_SUFFIX),
        None => spec.payload_name.clone(),
    }
}

/// A coded upload whose encoder went with a failed or cancelled chunk.
fn lost_encoder(store: &ClusterStore, key: &Path) -> StoreError {
    compress_err(
        store,
        key,
        std::io::Error::other(
            "the encoder was lost with an earlier chunk; the upload cannot go on",
        ),
    )
}

/// An encoder's failure while writing `key`, as a store error.
fn compress_err(store: &ClusterStore, key: &Path, e: std::io::Error) -> StoreError {
    request(
        store,
        "encoding (compressing or encrypting)",
        key,
        object_store::Error::Generic {
            store: "encoder",
            source: Box::new(e),
        },
    )
}

/// Streams `source` to the payload of `spec`, reporting bytes to `progress`. Returns the
/// payload description; nothing is committed.
///
/// # Errors
/// Reading the source or writing the store failed; the upload was aborted.
pub async fn upload(
    store: &ClusterStore,
    spec: &AttemptSpec,
    source: &mut (dyn AsyncRead + Unpin + Send),
    progress: &dyn Progress,
) -> Result<PayloadObject, TransferError> {
    let up = Upload::start(store, spec)?;
    let payload = send(store, up, source, progress).await?;
    if payload.content_size() == 0 {
        remove_payload(store, spec, &payload.name).await;
        return Err(TransferError::EmptyStream);
    }
    Ok(payload)
}

/// Removes the payload object of a failed attempt now rather than after
/// `failedBackupsTTL` (best effort: the TTL collects it if this fails).
///
/// # Guarantees
/// Only the payload object `name` of `spec`'s own directory (an attempt that failed before it
/// was committed); never a `metadata.json`, never another backup's object.
pub async fn remove_payload(store: &ClusterStore, spec: &AttemptSpec, name: &str) {
    let key = layout::payload_key(&spec.backup_name, &spec.backup_id, name);
    let _ = store.inner.delete(&key).await;
}

fn check_spec(spec: &AttemptSpec) -> Result<(), TransferError> {
    if !valid_backup_name(&spec.backup_name) {
        return Err(TransferError::InvalidName(spec.backup_name.clone()));
    }
    if !tidemark_core::inventory::is_backup_id(&spec.backup_id) {
        return Err(TransferError::InvalidId(spec.backup_id.clone()));
    }
    if !layout::is_payload_name(&spec.payload_name) {
        return Err(TransferError::InvalidName(spec.payload_name.clone()));
    }
    Ok(())
}

/// Streams `source` through `up` and completes it; aborts it on any failure.
///
/// # Errors
/// Reading the source or writing the store failed.
pub async fn send(
    store: &ClusterStore,
    mut up: Upload,
    source: &mut (dyn AsyncRead + Unpin + Send),
    progress: &dyn Progress,
) -> Result<PayloadObject, TransferError> {
    // The next chunk is read while the current one is compressed and handed to the
    // writer (one chunk ahead: READ_CHUNK more memory), so the source never waits for
    // zstd and zstd never waits for the source. The first failure of either ends both.
    enum Failed {
        Store(StoreError),
        Source(std::io::Error),
    }
    let mut next = read_chunk(source).await.map_err(Failed::Source);
    let failed = loop {
        match next {
            Ok(buf) if buf.is_empty() => break None,
            Ok(buf) => {
                progress.bytes(buf.len() as u64);
                let up = &mut up;
                let source = &mut *source;
                next = tokio::try_join!(
                    async { up.put(store, Bytes::from(buf)).await.map_err(Failed::Store) },
                    async { read_chunk(source).await.map_err(Failed::Source) },
                )
                .map(|((), read)| read);
            }
            Err(e) => break Some(e),
        }
    };
    match failed {
        None => Ok(up.finish(store).await?),
        Some(Failed::Store(e)) => {
            up.abort(store).await;
            Err(e.into())
        }
        Some(Failed::Source(source)) => {
            let bytes = up.size();
            up.abort(store).await;
            Err(TransferError::Source { bytes, source })
        }
    }
}

/// Up to [`READ_CHUNK`] bytes of `source` (fewer only at its end; empty: the end).
async fn read_chunk(source: &mut (dyn AsyncRead + Unpin + Send)) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(READ_CHUNK);
    (&mut *source)
        .take(READ_CHUNK as u64)
        .read_to_end(&mut buf)
        .await
        .map(|_| buf)
}

/// What a committed (or failed) attempt records besides the spec.
#[derive(Debug, Clone, Default)]
pub struct AttemptRecord {
    pub payload: Vec<PayloadObject>,
    pub log_position: Option<LogPosition>,
    /// The server the backup was taken on, when known.
    pub server: Option<crate::format::SourceServer>,
    /// `None`: completed; `Some(error)`: failed.
    pub error: Option<String>,
    /// Method-specific fields (e.g. `mariabackup`'s LSNs), kept in `metadata.json`.
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The instant the backup restores to, when it is not the commit time (a synthetic
    /// full restores to the increment it replaces).
    pub completed_at: Option<Timestamp>,
    /// Lock a completed backup's objects until then (S3 Object Lock in the store's mode),
    /// recorded as `immutableUntil`. A failed record is never locked.
    pub immutable_until: Option<Timestamp>,
}

/// Writes `metadata.json` for `spec`: this commits a completed backup, or records a
/// failed attempt. Returns the metadata written.
///
/// # Guarantees
/// A completed backup is committed only when every payload object it records is in the
/// store with the recorded size: an upload that another process deleted meanwhile is never
/// committed. The write is a conditional create: of two attempts with one backup-id, one
/// commits and the other fails with [`TransferError::AlreadyCommitted`].
///
/// # Errors
/// The payload is not there as uploaded; the backup is already committed; the store
/// refused the write.
pub async fn commit(
    store: &ClusterStore,
    spec: &AttemptSpec,
    outcome: AttemptRecord,
) -> Result<Metadata, TransferError> {
    check_spec(spec)?;
    if outcome.error.is_none() {
        for p in &outcome.payload {
            let key = layout::payload_key(&spec.backup_name, &spec.backup_id, &p.name);
            match store.head(&key).await? {
                Some(m) if m.size == p.size => {}
                Some(m) => {
                    return Err(TransferError::PayloadGone {
                        key: store.display_key(&key),
                        found: format!("{} bytes instead of {}", m.size, p.size),
                    });
                }
                None => {
                    return Err(TransferError::PayloadGone {
                        key: store.display_key(&key),
                        found: "missing".into(),
                    });
                }
            }
        }
    }
    let lock = match outcome.immutable_until {
        Some(until) if outcome.error.is_none() => Some(lock_target(store, until)?),
        _ => None,
    };
    if let Some((native, retention)) = &lock {
        for p in &outcome.payload {
            let key = layout::payload_key(&spec.backup_name, &spec.backup_id, &p.name);
            native
                .lock_at_least(&key, retention)
                .await
                .map_err(|source| request(store, "locking", &key, source))?;
        }
    }
    let now = Timestamp::now();
    let phase = if outcome.error.is_some() {
        MetadataPhase::Failed
    } else {
        MetadataPhase::Completed
    };
    let m = Metadata {
        format_version: if outcome.payload.iter().any(PayloadObject::is_coded) {
            crate::format::CODED_FORMAT_VERSION
        } else {
            FORMAT_VERSION
        },
        backup_id: spec.backup_id.clone(),
        backup_name: spec.backup_name.clone(),
        cluster: store.cluster.clone(),
        kind: spec.kind,
        parent_id: spec.parent_id.clone(),
        method: spec.method.clone(),
        phase,
        started_at: spec.started_at,
        completed_at: Some(outcome.completed_at.unwrap_or(now)),
        payload: outcome.payload,
        log_position: outcome.log_position,
        server: outcome.server,
        immutable_until: lock.as_ref().map(|(_, r)| r.until),
        ttl: spec.ttl,
        labels: spec.labels.clone(),
        error: outcome.error,
        extra: outcome.extra,
    };
    let key = layout::metadata_key(&spec.backup_name, &spec.backup_id);
    let body = serde_json::to_vec_pretty(&m).map_err(|source| StoreError::Encode {
        url: store.url.clone(),
        what: "metadata.json",
        source,
    })?;
    let written = match &lock {
        Some((native, retention)) => {
            match native
                .put_new_locked(&key, bytes::Bytes::from(body), retention)
                .await
            {
                Err(e) if !matches!(e, object_store::Error::AlreadyExists { .. }) => {
                    // The payloads are locked already: a failed record saying until when
                    // keeps every pass from trying (and failing) to collect them before.
                    let failed = Metadata {
                        phase: MetadataPhase::Failed,
                        payload: Vec::new(),
                        format_version: FORMAT_VERSION,
                        error: Some(format!(
                            "committing failed ({e}); the payload stays locked until {}",
                            retention.until
                        )),
                        ..m.clone()
                    };
                    if let Ok(body) = serde_json::to_vec_pretty(&failed) {
                        let _ = create(store, &key, body).await;
                    }
                    Err(e)
                }
                other => other,
            }
        }
        None => create(store, &key, body).await,
    };
    match written {
        Ok(()) => Ok(m),
        Err(
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. },
        ) => Err(TransferError::AlreadyCommitted {
            url: store.url.clone(),
            name: spec.backup_name.clone(),
            id: spec.backup_id.clone(),
        }),
        Err(source) => Err(write_err(store, &key, source).into()),
    }
}

/// How much later than its chain's date an increment may ask to be locked and still take
/// the chain's date (no older backup locked longer for it).
pub const CHAIN_LOCK_TOLERANCE: jiff::SignedDuration = jiff::SignedDuration::from_hours(1);

/// Where and how a backup is locked until `until`: the store's S3 side and its mode.
fn lock_target(
    store: &ClusterStore,
    until: Timestamp,
) -> Result<(&crate::uploads::S3Native, crate::objectlock::Retention), TransferError> {
    let (Some(native), Some(mode)) = (store.s3(), store.object_lock) else {
        return Err(StoreError::ObjectLockUnsupported {
            url: store.url.clone(),
        }
        .into());
    };
    // Recorded as the server holds it: in whole seconds, never earlier than asked.
    let until = crate::objectlock::whole_second(until);
    Ok((native, crate::objectlock::Retention { mode, until }))
}

/// The lock date of a backup asked to be locked until `requested` on `parent` (seed 002:
/// every backup of a chain stays locked until the chain's last backup expires): the later
/// of `requested` and the parent's `immutableUntil`, so a chain's members share one date.
/// When `requested` is the later — the chain grew past what its full foresaw (a schedule
/// fell behind, or forever-incremental chains) — the parent and every ancestor are locked
/// until then first (S3 lets a retention grow, never shrink), so no backup of the chain
/// becomes deletable before its last one. Returns how many objects were extended, too.
///
/// # Errors
/// The store holds no locks ([`StoreError::ObjectLockUnsupported`]); an ancestor could
/// not be read or locked longer.
pub async fn chain_lock(
    store: &ClusterStore,
    requested: Option<Timestamp>,
    parent: Option<&Metadata>,
) -> Result<(Option<Timestamp>, usize), TransferError> {
    let Some(requested) = requested else {
        return Ok((None, 0));
    };
    let (native, retention) = lock_target(store, requested)?;
    let requested = retention.until; // in whole seconds, as the server holds it
    let parent_until = parent.and_then(|p| p.immutable_until);
    let Some(parent) = parent else {
        return Ok((Some(requested), 0));
    };
    // Within the tolerance the chain's date stands: an increment asking for its own start
    // plus the period lands seconds or minutes after its chain's last slot plus the period.
    if parent_until.is_some_and(|p| p + CHAIN_LOCK_TOLERANCE >= requested) {
        return Ok((parent_until, 0));
    }
    // Rare (the chain outgrew its date): every backup is read to find the ancestors.
    let catalog =
        crate::catalog::Catalog::load_backups(store, &crate::progress::NoProgress).await?;
    let mut extended = 0;
    let mut next = Some(parent.backup_id.clone());
    let mut steps = 0;
    while let Some(id) = next.take() {
        steps += 1;
        if steps > catalog.backups.len() + 1 {
            break; // a parent cycle in corrupt metadata
        }
        let Some(b) = catalog.backups.iter().find(|b| b.backup.id == id) else {
            return Err(TransferError::NotFound {
                url: store.url.clone(),
                what: format!("{id}, an ancestor of the backup being locked"),
            });
        };
        for key in b.payload_keys.iter().chain(b.metadata_key.iter()) {
            if native
                .lock_at_least(key, &retention)
                .await
                .map_err(|source| request(store, "locking longer", key, source))?
            {
                extended += 1;
            }
        }
        next = b.metadata.as_ref().and_then(|m| m.parent_id.clone());
    }
    tracing::info!(objects = extended, until = %requested, "locked the chain's older backups longer");
    Ok((Some(requested), extended))
}

/// Writes an object only if it does not exist. A backend without conditional writes is
/// asked first (the window between the two requests is the price).
pub(crate) async fn create(
    store: &ClusterStore,
    key: &Path,
    body: Vec<u8>,
) -> Result<(), object_store::Error> {
    crate::index::create_head(store, key, body)
        .await
        .map(|_| ())
}

/// An attempt that could not be committed: why, and the failed record written instead, if
/// one was.
#[derive(Debug)]
pub struct Unfinished {
    pub error: TransferError,
    pub recorded: Option<Metadata>,
}

/// An attempt in flight: it holds its backup-id through the in-flight marker
/// (`<name>/<id>/_inflight.json`), written before the first byte and rewritten every
/// [`HEARTBEAT_INTERVAL`](tidemark_core::plan::HEARTBEAT_INTERVAL) while it runs, so every
/// retention pass sees it running and collects nothing of it.
#[derive(Debug)]
pub struct Attempt {
    store: ClusterStore,
    spec: AttemptSpec,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Attempt {
    /// Claims the backup-id of `spec`: refused when it is committed already, or when
    /// another attempt's marker holds it.
    ///
    /// # Errors
    /// An invalid name or id; the id is taken; the store failed.
    pub async fn begin(store: &ClusterStore, spec: &AttemptSpec) -> Result<Self, TransferError> {
        check_spec(spec)?;
        // A backup to be locked goes to a bucket that can hold the lock, or nowhere: found
        // out before the first byte, not after the upload.
        if let Some(until) = spec.lock_until {
            let (native, _) = lock_target(store, until)?;
            let enabled = native
                .lock_enabled()
                .await
                .map_err(|source| StoreError::Request {
                    url: store.url.clone(),
                    action: "reading the bucket's object lock configuration".into(),
                    answer: source,
                })?;
            if !enabled {
                return Err(StoreError::ObjectLockUnsupported {
                    url: store.url.clone(),
                }
                .into());
            }
        }
        let meta_key = layout::metadata_key(&spec.backup_name, &spec.backup_id);
        if store.head(&meta_key).await?.is_some() {
            return Err(TransferError::AlreadyCommitted {
                url: store.url.clone(),
                name: spec.backup_name.clone(),
                id: spec.backup_id.clone(),
            });
        }
        let key = layout::marker_key(&spec.backup_name, &spec.backup_id);
        match create(store, &key, marker_body(spec)).await {
            Ok(()) => {}
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => {
                let written = store
                    .head(&key)
                    .await?
                    .map(|m| crate::catalog::to_ts(m.last_modified).to_string())
                    .unwrap_or_else(|| "just now".into());
                return Err(TransferError::AttemptExists {
                    id: spec.backup_id.clone(),
                    marker: format!("{}/{}", store.url, store.display_key(&key)),
                    written,
                });
            }
            Err(source) => return Err(write_err(store, &key, source).into()),
        }
        // Another attempt with this id may have committed and released its marker between
        // the first look and the claim: it writes metadata.json before it lets the marker
        // go, so a second look now tells.
        if store.head(&meta_key).await?.is_some() {
            release_marker(store, spec).await;
            return Err(TransferError::AlreadyCommitted {
                url: store.url.clone(),
                name: spec.backup_name.clone(),
                id: spec.backup_id.clone(),
            });
        }
        let (hb_store, hb_spec) = (store.clone(), spec.clone());
        let heartbeat = tokio::spawn(async move {
            let every = std::time::Duration::try_from(tidemark_core::plan::HEARTBEAT_INTERVAL)
                .unwrap_or(std::time::Duration::from_secs(30));
            loop {
                tokio::time::sleep(every).await;
                let key = layout::marker_key(&hb_spec.backup_name, &hb_spec.backup_id);
                if let Err(e) = hb_store
                    .inner
                    .put(&key, PutPayload::from(marker_body(&hb_spec)))
                    .await
                {
                    tracing::warn!(error = %e, key = %hb_store.display_key(&key), "could not refresh the in-flight marker");
                }
            }
        });
        Ok(Attempt {
            store: store.clone(),
            spec: spec.clone(),
            heartbeat,
        })
    }

    pub fn spec(&self) -> &AttemptSpec {
        &self.spec
    }

    pub fn store(&self) -> &ClusterStore {
        &self.store
    }

    /// Streams `source` into the attempt's payload (see [`upload`]).
    ///
    /// # Errors
    /// As [`upload`].
    pub async fn upload(
        &self,
        source: &mut (dyn AsyncRead + Unpin + Send),
        progress: &dyn Progress,
    ) -> Result<PayloadObject, TransferError> {
        upload(&self.store, &self.spec, source, progress).await
    }

    /// Commits (or records as failed, when `outcome.error` is set) and ends the attempt:
    /// the marker goes once `metadata.json` is written. See [`commit`].
    ///
    /// # Guarantees
    /// The marker goes only after `metadata.json` is written: a crash between the two leaves a
    /// committed backup with a stale marker, never a marker-less uncommitted one.
    ///
    /// # Errors
    /// As [`commit`]; the marker stays then, and goes stale.
    pub async fn finish(self, outcome: AttemptRecord) -> Result<Metadata, Unfinished> {
        self.heartbeat.abort();
        let committed = match commit(&self.store, &self.spec, outcome).await {
            // The upload went missing before the commit (another process deleted it): the
            // attempt is recorded as failed, with why, rather than left uncommitted.
            Err(e @ TransferError::PayloadGone { .. }) => {
                let failed = AttemptRecord {
                    error: Some(e.to_string()),
                    ..Default::default()
                };
                let recorded = commit(&self.store, &self.spec, failed).await.ok();
                if recorded.is_some() {
                    self.release().await;
                }
                return Err(Unfinished { error: e, recorded });
            }
            other => other,
        };
        match committed {
            Ok(m) => {
                self.release().await;
                Ok(m)
            }
            Err(error) => Err(Unfinished {
                error,
                recorded: None,
            }),
        }
    }

    /// Ends the attempt without a record: the marker goes, and what was uploaded is an
    /// uncommitted attempt that `failedBackupsTTL` collects.
    ///
    /// # Guarantees
    /// Only the attempt's own marker; its payload stays for the TTL to collect.
    pub async fn abandon(self) {
        self.heartbeat.abort();
        self.release().await;
    }

    async fn release(&self) {
        release_marker(&self.store, &self.spec).await;
    }
}

/// Removes an attempt's in-flight marker (best effort: one left behind goes stale and is
/// collected with the attempt).
///
/// # Guarantees
/// Only `spec`'s own `_inflight.json` marker.
pub async fn release_marker(store: &ClusterStore, spec: &AttemptSpec) {
    let key = layout::marker_key(&spec.backup_name, &spec.backup_id);
    if let Err(e) = store.inner.delete(&key).await
        && !is_not_found(&e)
    {
        tracing::warn!(error = %e, key = %store.display_key(&key), "could not remove the in-flight marker; it goes stale");
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

fn marker_body(spec: &AttemptSpec) -> Vec<u8> {
    let writer = format!(
        "{}:{}",
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "localhost".into()),
        std::process::id()
    );
    let m = crate::format::InFlight {
        format_version: FORMAT_VERSION,
        backup_id: spec.backup_id.clone(),
        backup_name: spec.backup_name.clone(),
        started_at: spec.started_at,
        heartbeat_at: Timestamp::now(),
        writer,
    };
    serde_json::to_vec_pretty(&m).unwrap_or_default()
}

/// Reads the `metadata.json` of backup `id` (under any backup name when `name` is `None`).
///
/// # Errors
/// No such committed backup; malformed metadata; a failed request.
pub async fn find_backup(
    store: &ClusterStore,
    name: Option<&str>,
    id: &str,
) -> Result<Metadata, TransferError> {
    if !tidemark_core::inventory::is_backup_id(id) {
        return Err(TransferError::InvalidId(id.to_owned()));
    }
    let key = match name {
        Some(n) if !valid_backup_name(n) => return Err(TransferError::InvalidName(n.to_owned())),
        Some(n) => layout::metadata_key(n, id),
        None => {
            // The id is unique per attempt; find its directory by listing backup names.
            let listed = store
                .inner
                .list_with_delimiter(None)
                .await
                .map_err(|source| StoreError::Request {
                    url: store.url.clone(),
                    action: format!("listing {}/", store.cluster),
                    answer: source,
                })?;
            let mut found = None;
            for dir in listed.common_prefixes {
                let Some(n) = dir.filename() else { continue };
                if !valid_backup_name(n) {
                    continue;
                }
                let k = layout::metadata_key(n, id);
                if store.head(&k).await?.is_some() {
                    found = Some(k);
                    break;
                }
            }
            found.ok_or_else(|| TransferError::NotFound {
                url: store.url.clone(),
                what: format!("with backup-id {id}"),
            })?
        }
    };
    let bytes = store
        .read(&key)
        .await?
        .ok_or_else(|| TransferError::NotFound {
            url: store.url.clone(),
            what: store.display_key(&key),
        })?;
    let m: Metadata = serde_json::from_slice(&bytes).map_err(|e| TransferError::Metadata {
        key: store.display_key(&key),
        problem: e.to_string(),
    })?;
    let dir_name = key
        .parts()
        .next()
        .map(|p| p.as_ref().to_owned())
        .unwrap_or_default();
    m.check(&dir_name, id)
        .map_err(|e| TransferError::Metadata {
            key: store.display_key(&key),
            problem: e.to_string(),
        })?;
    // A locked chain recorded as expired (seed 002) is gone for every reader, as it is
    // for the catalog: the same rule (its lock ended by the wall clock).
    if let Some(until) = m.immutable_until.filter(|u| *u <= jiff::Timestamp::now()) {
        let record = layout::expiry_key(&dir_name, id);
        if store.head(&record).await?.is_some() {
            return Err(TransferError::Expired {
                url: store.url.clone(),
                name: dir_name,
                id: id.to_owned(),
                until,
                record: store.display_key(&record),
            });
        }
    }
    Ok(m)
}

/// Streams the payload of the committed backup `m` into `sink`, verifying its size and
/// sha256 against `metadata.json`. On a mismatch the error says so after the bytes were
/// written: a caller writing a file must remove it (the CLI writes to a temporary file and
/// renames it only on success).
///
/// # Errors
/// The backup failed or has no payload; the payload is missing; the checksum or size
/// differs; a request or the sink failed.
pub async fn download(
    store: &ClusterStore,
    m: &Metadata,
    sink: &mut (dyn AsyncWrite + Unpin + Send),
    progress: &dyn Progress,
) -> Result<PayloadObject, TransferError> {
    if m.phase == MetadataPhase::Failed {
        return Err(TransferError::Failed {
            name: m.backup_name.clone(),
            id: m.backup_id.clone(),
            error: m.error.clone().unwrap_or_default(),
        });
    }
    backup_readable(store, m)?;
    let Some(expected) = m.payload.first() else {
        return Err(TransferError::MissingPayload {
            key: format!(
                "{}/{}/{}/backup.*",
                store.cluster, m.backup_name, m.backup_id
            ),
        });
    };
    let key = layout::payload_key(&m.backup_name, &m.backup_id, &expected.name);
    copy_verified(
        store,
        &key,
        expected.size,
        Some(&expected.sha256),
        expected.form(),
        sink,
        progress,
    )
    .await?;
    Ok(expected.clone())
}

/// How many times in a row a long read is resumed without progress between
/// ([`resuming`]).
const RESUMES: u32 = 5;
/// What a resumed read must bring before it breaks again to count as progress: a server
/// that sends a byte, stalls and drops, again and again, runs out of tries.
const RESUME_PROGRESS: u64 = 1 << 20;

/// The body of `got` (object `key`), resumed where it broke: object_store retries a read
/// only within its retry timeout from the first request (60 s), and a payload streamed into
/// a slow restore for hours would otherwise fail on the first dropped connection after
/// it. A read that fails is asked again from the byte it reached, of the same object (its
/// entity tag: a changed or deleted object is an error at once), up to [`RESUMES`] times
/// in a row without progress ([`RESUME_PROGRESS`] bytes), after 1, 2, 4… s.
pub(crate) fn resuming(
    store: &ClusterStore,
    key: &Path,
    got: object_store::GetResult,
) -> futures::stream::BoxStream<'static, object_store::Result<Bytes>> {
    struct Reading {
        inner: std::sync::Arc<dyn object_store::ObjectStore>,
        key: Path,
        etag: Option<String>,
        end: u64,
        at: u64,
        /// Where the last break was.
        broke_at: u64,
        failed: u32,
        body: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    }
    let reading = Reading {
        inner: store.inner.clone(),
        key: key.clone(),
        etag: got.meta.e_tag.clone(),
        end: got.range.end,
        at: got.range.start,
        broke_at: got.range.start,
        failed: 0,
        body: got.into_stream(),
    };
    futures::stream::unfold(Some(reading), |reading| async move {
        let mut r = reading?;
        loop {
            let mut broke = match r.body.next().await {
                Some(Ok(chunk)) => {
                    r.at += chunk.len() as u64;
                    return Some((Ok(chunk), Some(r)));
                }
                None => return None,
                Some(Err(e)) => e,
            };
            if r.at - r.broke_at >= RESUME_PROGRESS {
                r.failed = 0;
            }
            r.broke_at = r.at;
            // Asked again from where it broke, until it answers or the tries run out.
            loop {
                let final_error = matches!(
                    broke,
                    object_store::Error::NotFound { .. } | object_store::Error::Precondition { .. }
                );
                if final_error || r.etag.is_none() || r.at >= r.end || r.failed >= RESUMES {
                    return Some((Err(broke), None));
                }
                tracing::info!(key = %r.key, at = r.at, "a read broke ({broke}); resuming it");
                tokio::time::sleep(std::time::Duration::from_secs(1 << r.failed)).await;
                r.failed += 1;
                let options = object_store::GetOptions {
                    range: Some(object_store::GetRange::Bounded(r.at..r.end)),
                    if_match: r.etag.clone(),
                    ..Default::default()
                };
                match r.inner.get_opts(&r.key, options).await {
                    Ok(again) if again.meta.e_tag == r.etag && again.range.start == r.at => {
                        r.body = again.into_stream();
                        break;
                    }
                    Ok(_) | Err(object_store::Error::Precondition { .. }) => {
                        let changed = object_store::Error::Generic {
                            store: "resume",
                            source: format!(
                                "object {} changed while it was read (another entity tag, or \
                                 another first byte served)",
                                r.key
                            )
                            .into(),
                        };
                        return Some((Err(changed), None));
                    }
                    Err(e) => broke = e,
                }
            }
        }
    })
    .boxed()
}

/// Streams the object `key` into `sink`, checking its size and (when recorded) sha256 —
/// of the stored bytes — and decoding what its record says (`form`: zstd checks its
/// content's own checksum, age authenticates every 64 KiB). Whether the object can be
/// decoded here at all (scheme, identity) is checked before anything is read or written. On
/// a mismatch the error comes after the bytes were written: the caller discards them.
///
/// # Errors
/// The object is missing ([`TransferError::MissingPayload`]); no identity opens it
/// ([`TransferError::NoIdentity`]); its size or checksum differs; a request or the sink
/// failed.
pub async fn copy_verified(
    store: &ClusterStore,
    key: &Path,
    expected_size: u64,
    expected_sha256: Option<&str>,
    form: crate::codec::Form<'_>,
    sink: &mut (dyn AsyncWrite + Unpin + Send),
    progress: &dyn Progress,
) -> Result<(), TransferError> {
    let is_segment = key.as_ref().starts_with(layout::BINLOGS);
    readable(store, key, form)?;
    let got = match store.inner.get(key).await {
        Ok(g) => g,
        Err(e) if is_not_found(&e) => {
            let key = store.display_key(key);
            return Err(if is_segment {
                TransferError::MissingSegment { key }
            } else {
                TransferError::MissingPayload { key }
            });
        }
        Err(source) => return Err(request(store, "reading", key, source).into()),
    };
    let mut stream = resuming(store, key, got);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    // The bytes are not those recorded.
    let differs = |actual_size: u64, actual_sha256: String| TransferError::Checksum {
        key: store.display_key(key),
        recorded_in: if is_segment {
            "binlogs/_index.json"
        } else {
            "metadata.json"
        },
        expected_size,
        expected_sha256: expected_sha256.unwrap_or("(not recorded)").to_owned(),
        actual_size,
        actual_sha256,
    };
    // More than its record says: no more is read (a server may send without end).
    let larger = |size: u64| differs(size, "(not read to its end: larger than recorded)".into());
    // The first content problem; the stored bytes are still read to the end, so that a
    // damaged object is reported by its checksum (it changed in the store) rather than by
    // the decoder (it was written so).
    let mut problem = None;
    if form.plain() {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|source| request(store, "reading", key, source))?;
            if let Some(limit) = &store.bandwidth {
                limit.take(chunk.len() as u64).await;
            }
            hasher.update(&chunk);
            size += chunk.len() as u64;
            if size > expected_size {
                return Err(larger(size));
            }
            progress.bytes(chunk.len() as u64);
            sink.write_all(&chunk).await.map_err(TransferError::Sink)?;
        }
    } else {
        let crate::codec::Decoding {
            input,
            mut output,
            thread,
        } = crate::codec::decoding(form, store.identities.clone());
        let feed = async {
            let mut input = Some(input);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|source| request(store, "reading", key, source))?;
                if let Some(limit) = &store.bandwidth {
                    limit.take(chunk.len() as u64).await;
                }
                hasher.update(&chunk);
                size += chunk.len() as u64;
                if size > expected_size {
                    return Err(larger(size));
                }
                progress.bytes(chunk.len() as u64);
                // A decoder that stopped (it found a problem) takes no more; the rest is
                // still hashed.
                if let Some(tx) = &input
                    && tx.send(chunk).await.is_err()
                {
                    input = None;
                }
            }
            Ok::<(), TransferError>(())
        };
        let drain = async {
            while let Some(content) = output.recv().await {
                sink.write_all(&content)
                    .await
                    .map_err(TransferError::Sink)?;
            }
            Ok::<(), TransferError>(())
        };
        tokio::try_join!(feed, drain)?;
        problem = match thread.await {
            Ok(Ok(())) => None,
            Ok(Err(p)) => Some(p),
            Err(e) => Some(format!("the decoder stopped: {e}")),
        };
    }
    sink.flush().await.map_err(TransferError::Sink)?;
    let sha256 = hex::encode(hasher.finalize());
    if size != expected_size || expected_sha256.is_some_and(|e| e != sha256) {
        return Err(differs(size, sha256));
    }
    match problem {
        Some(problem) => Err(TransferError::Content {
            key: store.display_key(key),
            problem,
        }),
        None => Ok(()),
    }
}

/// How deep [`verify_object`] could look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Checked {
    /// The stored bytes' size and sha256, and the content decoded (zstd's checksums, age's
    /// authentication) — or the stored bytes are the content.
    Content,
    /// The stored bytes' size and sha256 only: the object is encrypted and no identity
    /// here opens it.
    Stored,
}

/// Reads the object `key` to its end, checking what its record says: size and sha256 of
/// the stored bytes, and, where this store can decode it, the content. Nothing is kept.
///
/// # Errors
/// Missing, cut short, changed, or undecodable — each named; a request failed.
pub async fn verify_object(
    store: &ClusterStore,
    key: &Path,
    expected_size: u64,
    expected_sha256: Option<&str>,
    form: crate::codec::Form<'_>,
    progress: &dyn Progress,
) -> Result<Checked, TransferError> {
    // Without an identity for it, an encrypted object is checked as the bytes it is.
    let (form, depth) = match readable(store, key, form) {
        Ok(()) => (form, Checked::Content),
        Err(TransferError::NoIdentity { .. }) => (crate::codec::Form::default(), Checked::Stored),
        Err(e) => return Err(e),
    };
    copy_verified(
        store,
        key,
        expected_size,
        expected_sha256,
        form,
        &mut tokio::io::sink(),
        progress,
    )
    .await?;
    Ok(depth)
}

/// Whether the committed backup `m` can be read here: its `formatVersion`, and every
/// payload's compression, encryption and identity ([`readable`]); checked before anything
/// is read or written.
///
/// # Errors
/// [`TransferError::Metadata`] for a newer format; as [`readable`].
pub fn backup_readable(store: &ClusterStore, m: &Metadata) -> Result<(), TransferError> {
    if m.format_version > crate::format::METADATA_FORMAT_VERSION {
        return Err(TransferError::Metadata {
            key: store.display_key(&layout::payload_key(
                &m.backup_name,
                &m.backup_id,
                layout::METADATA,
            )),
            problem: format!(
                "formatVersion {} is newer than this Tidemark understands ({}); upgrade Tidemark",
                m.format_version,
                crate::format::METADATA_FORMAT_VERSION
            ),
        });
    }
    for p in &m.payload {
        let key = layout::payload_key(&m.backup_name, &m.backup_id, &p.name);
        plaintext_allowed(store, &key, p.encryption.is_some(), m.completed_at)?;
        readable(store, &key, p.form())?;
    }
    Ok(())
}

/// Whether the archived segment `name`, recorded as `form` with its last event at
/// `last_event_at`, can be read here ([`readable`], [`plaintext_allowed`]).
///
/// # Errors
/// As those.
pub fn segment_readable(
    store: &ClusterStore,
    name: &str,
    form: crate::codec::Form<'_>,
    last_event_at: Option<jiff::Timestamp>,
) -> Result<(), TransferError> {
    let key = layout::segment_key(name);
    plaintext_allowed(store, &key, form.encryption.is_some(), last_event_at)?;
    readable(store, &key, form)
}

/// Under a store that encrypts (recipients given), an unencrypted object is refused unless
/// it was `written` before the instant the user named (`--allow-plaintext-before`): a
/// bucket writer without the key can plant plaintext backups and segments, and a restore
/// would prepare and replay them. Objects of a store that does not encrypt are read as
/// they are.
///
/// # Errors
/// [`TransferError::Plaintext`], naming the object and the instants compared.
pub fn plaintext_allowed(
    store: &ClusterStore,
    key: &Path,
    encrypted: bool,
    written: Option<jiff::Timestamp>,
) -> Result<(), TransferError> {
    let Some(recipients) = store.recipients.as_deref() else {
        return Ok(());
    };
    if encrypted {
        return Ok(());
    }
    match (written, store.plaintext_before) {
        (Some(w), Some(b)) if w < b => Ok(()),
        (written, before) => Err(TransferError::Plaintext {
            key: store.display_key(key),
            recipients: recipients.len(),
            written,
            before,
        }),
    }
}

/// What a verification record names of a backup: each of its payloads as
/// `backup-id:sha256` ([`is_verified`], [`record_verified`]).
pub fn verified_payloads(m: &Metadata) -> Vec<String> {
    m.payload
        .iter()
        .map(|p| format!("{}:{}", m.backup_id, p.sha256))
        .collect()
}

/// Whether the backup `name`/`id` was read back whole before ([`record_verified`]) *as
/// its chain is now*: `chain` names every payload read (backup-id and sha256, in chain
/// order), so a record left before the chain changed (a consolidation put a synthetic full
/// under it) or by another attempt counts for nothing.
///
/// # Errors
/// The store failed.
pub async fn is_verified(
    store: &ClusterStore,
    name: &str,
    id: &str,
    chain: &[String],
) -> Result<bool, StoreError> {
    let key = layout::payload_key(name, id, layout::VERIFIED);
    let Some(body) = store.read(&key).await? else {
        return Ok(false);
    };
    let recorded: Option<Vec<String>> = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| serde_json::from_value(v.get("chain")?.clone()).ok());
    Ok(recorded.as_deref() == Some(chain))
}

/// Records that the backup `name`/`id` and its chain were read back whole at `at`, `checked`
/// that deep, `by` whom (`retention pass`, `restore test`).
///
/// # Errors
/// The store refused the write.
pub async fn record_verified(
    store: &ClusterStore,
    name: &str,
    id: &str,
    chain: &[String],
    checked: Checked,
    at: Timestamp,
    by: &str,
) -> Result<(), StoreError> {
    let key = layout::payload_key(name, id, layout::VERIFIED);
    let body = serde_json::json!({
        "formatVersion": FORMAT_VERSION,
        "verifiedAt": at,
        "checked": checked,
        "chain": chain,
        "by": by,
    });
    store
        .inner
        .put(
            &key,
            object_store::PutPayload::from(body.to_string().into_bytes()),
        )
        .await
        .map(drop)
        .map_err(|source| request(store, "writing", &key, source))
}

/// [`record_verified`] for a backup that a pass may delete meanwhile (a restore test runs
/// beside retention): a record already there for this chain is left alone, and one written
/// after the backup's `metadata.json` went is taken back. (A deletion between that check
/// and the end can still leave the record alone in its directory: an uncommitted attempt
/// to a pass, collected after `failedBackupsTTL`.)
///
/// # Guarantees
/// Deletes only the `_verified.json` this call wrote, and only when the backup's
/// `metadata.json` is gone.
///
/// # Errors
/// The store failed.
pub async fn record_verified_while_committed(
    store: &ClusterStore,
    name: &str,
    id: &str,
    chain: &[String],
    checked: Checked,
    at: Timestamp,
    by: &str,
) -> Result<(), StoreError> {
    if is_verified(store, name, id, chain).await? {
        return Ok(());
    }
    record_verified(store, name, id, chain, checked, at, by).await?;
    if store.head(&layout::metadata_key(name, id)).await?.is_none() {
        let key = layout::payload_key(name, id, layout::VERIFIED);
        if let Err(e) = store.inner.delete(&key).await
            && !is_not_found(&e)
        {
            return Err(request(store, "deleting", &key, e));
        }
    }
    Ok(())
}

/// Records a restore test's outcome (`outcome`, any JSON object) in the directory of the
/// backup `name`/`id` it restored, as [`layout::RESTORE_TEST`] (the newest replaces the
/// last), and as the cluster's latest ([`latest_restore_test_key`]), where whoever started
/// the test (the operator's Job) finds it.
///
/// # Errors
/// The store refused a write.
pub async fn record_restore_test(
    store: &ClusterStore,
    name: &str,
    id: &str,
    outcome: &serde_json::Value,
) -> Result<(), StoreError> {
    let body = outcome.to_string().into_bytes();
    for key in [
        layout::payload_key(name, id, layout::RESTORE_TEST),
        latest_restore_test_key(),
    ] {
        store
            .inner
            .put(&key, object_store::PutPayload::from(body.clone()))
            .await
            .map_err(|source| request(store, "writing", &key, source))?;
    }
    Ok(())
}

/// Where the cluster's latest restore test outcome is: `_state/restore-test.json`.
pub fn latest_restore_test_key() -> Path {
    Path::from_iter([layout::STATE, "restore-test.json"])
}

/// The cluster's latest restore test outcome, if any (at most the control-object size).
///
/// # Errors
/// The store failed, or the object is not JSON.
pub async fn latest_restore_test(
    store: &ClusterStore,
) -> Result<Option<serde_json::Value>, StoreError> {
    let key = latest_restore_test_key();
    let Some(body) = store.read(&key).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| StoreError::MalformedState {
            url: store.url.clone(),
            key: store.display_key(&key),
            problem: e.to_string(),
        })
}

/// Whether the object `key`, written as `form`, can be decoded with this store's
/// identities: checked before anything is read, and by restores for every object they
/// will need before they write anything.
///
/// # Errors
/// [`TransferError::NoIdentity`]; [`TransferError::Content`] for a scheme this version
/// does not read.
pub fn readable(
    store: &ClusterStore,
    key: &Path,
    form: crate::codec::Form<'_>,
) -> Result<(), TransferError> {
    crate::codec::check(form, store.identities.as_deref()).map_err(|u| match u {
        crate::codec::Unreadable::Scheme(problem) => TransferError::Content {
            key: store.display_key(key),
            problem,
        },
        crate::codec::Unreadable::NoIdentity { recipients, have } => TransferError::NoIdentity {
            key: store.display_key(key),
            recipients,
            have,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source of `len` bytes (a pattern that compresses), failing after `fail_after`
    /// bytes when asked to.
    struct Source {
        left: usize,
        fail_after: Option<usize>,
        sent: usize,
    }

    impl AsyncRead for Source {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if self.fail_after.is_some_and(|f| self.sent >= f) {
                return std::task::Poll::Ready(Err(std::io::Error::other("source broke")));
            }
            let n = buf.remaining().min(self.left).min(100_000);
            let start = self.sent;
            let bytes: Vec<u8> = (start..start + n).map(|i| (i / 7 % 251) as u8).collect();
            buf.put_slice(&bytes);
            self.left -= n;
            self.sent += n;
            std::task::Poll::Ready(Ok(()))
        }
    }

    fn store(compression: &str) -> (tempfile::TempDir, ClusterStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = ClusterStore::open(
            &format!("file://{}", dir.path().display()),
            "c",
            &Default::default(),
        )
        .unwrap()
        .with_compression(compression.parse().unwrap());
        (dir, store)
    }

    /// Reading ahead sends every byte once, in order: the stored object decompresses to
    /// the source, whose size and the stored object's hash are recorded; a source that
    /// breaks mid-stream fails the send with what was taken, and leaves no object.
    #[tokio::test]
    async fn the_stream_arrives_whole_and_a_broken_source_leaves_nothing() {
        for compression in ["none", "zstd:3"] {
            let (_dir, store) = store(compression);
            let len = 3 * READ_CHUNK + 12_345;
            let key = Path::from("b/payload");
            let up = Upload::to_key(&store, key.clone(), "payload").unwrap();
            let mut source = Source {
                left: len,
                fail_after: None,
                sent: 0,
            };
            let object = send(&store, up, &mut source, &crate::NoProgress)
                .await
                .unwrap();
            let stored = store.inner.get(&key).await.unwrap().bytes().await.unwrap();
            assert_eq!(object.size, stored.len() as u64);
            assert_eq!(object.sha256, hex::encode(Sha256::digest(&stored)));
            let content = if compression == "none" {
                stored.to_vec()
            } else {
                assert_eq!(object.original_size, Some(len as u64));
                zstd::decode_all(&stored[..]).unwrap()
            };
            let want: Vec<u8> = (0..len).map(|i| (i / 7 % 251) as u8).collect();
            assert!(content == want, "{compression}: the content differs");

            let broken_key = Path::from("c/payload");
            let up = Upload::to_key(&store, broken_key.clone(), "payload").unwrap();
            let mut broken = Source {
                left: len,
                fail_after: Some(2 * READ_CHUNK + 5),
                sent: 0,
            };
            match send(&store, up, &mut broken, &crate::NoProgress).await {
                Err(TransferError::Source { bytes, .. }) => {
                    assert!(bytes <= (2 * READ_CHUNK + 5) as u64, "{bytes}");
                }
                other => panic!("{compression}: {other:?}"),
            }
            assert!(
                store.inner.head(&broken_key).await.is_err(),
                "{compression}: a broken stream left its object"
            );
        }
    }
}
