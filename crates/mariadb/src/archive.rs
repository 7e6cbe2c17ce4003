//! `archive-binlogs`: ships the closed binlog files a server's binlog index names to
//! `binlogs/`, and indexes them with their event times.
//!
//! # Idempotence and crash safety
//! A file already in `_index.json` is skipped. A file uploaded but not indexed (the
//! archiver died in between) is adopted — its object is checked against the local file's
//! size and sha256 and indexed without a second upload; a mismatch is uploaded again. The
//! index is updated last, with a conditional write, so two archivers cannot corrupt it.

use std::collections::{HashMap, HashSet};
use std::path::{Path as FsPath, PathBuf};

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::binlog;
use tidemark_store::ClusterStore;
use tidemark_store::Progress;
use tidemark_store::StoreError;
use tidemark_store::format::IndexEntry;
use tidemark_store::index::{self, SegmentIndex};
use tidemark_store::layout;
use tidemark_store::transfer::{self, TransferError, Upload};

/// Small files (below one multipart part, sent in one request) shipped at once.
const SMALL_CONCURRENCY: usize = 32;
/// Large files shipped at once: each holds up to `PART_SIZE * (PARTS_IN_FLIGHT + 1)` bytes
/// of memory, so this bounds the archiver's memory near 250 MiB.
const LARGE_CONCURRENCY: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("cannot read the binlog index {}: {source}", path.display())]
    IndexFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: line {line} names {name:?}, which is not a binlog file name (<base>.<digits>, e.g. mysql-bin.000042)", path.display())]
    NotBinlogName {
        path: PathBuf,
        line: usize,
        name: String,
    },
    #[error(
        "{}: {first} and {second} have the same sequence number {sequence}; the archive identifies segments by it, so neither is shipped until one is renamed or removed",
        path.display()
    )]
    DuplicateSequence {
        path: PathBuf,
        sequence: u64,
        first: String,
        second: String,
    },
    #[error(
        "{name} has sequence number {sequence}, which binlogs/_index.json already gives to {indexed}; a segment is identified by its sequence, so {name} is not shipped"
    )]
    SequenceTaken {
        name: String,
        sequence: u64,
        indexed: String,
    },
    #[error("{}: {source}", path.display())]
    Binlog {
        path: PathBuf,
        #[source]
        source: binlog::BinlogError,
    },
    #[error("uploading {}", path.display())]
    Upload {
        path: PathBuf,
        #[source]
        source: Box<TransferError>,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Internal: the file vanished before it was read (reported, not an error).
    #[error("{0} vanished")]
    Vanished(String),
}

/// What one pass did. (`archive-binlogs --output json` prints it through the CLI's own
/// output type, which names every field: a field added here is a decision there.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArchiveReport {
    /// Closed files uploaded and indexed.
    pub uploaded: Vec<String>,
    /// Closed files found already uploaded (an earlier run died before indexing), indexed.
    pub adopted: Vec<String>,
    /// Closed files already indexed.
    pub already_indexed: usize,
    /// The file the server is writing (never shipped).
    pub open: Option<String>,
    /// Closed files the server purged before this pass could read them.
    pub vanished: Vec<String>,
    pub bytes: u64,
}

/// One file the binlog index names.
#[derive(Debug, Clone)]
struct Local {
    path: PathBuf,
    name: String,
    sequence: u64,
}

/// Reads the server's binlog index (`mysql-bin.index`): one path per line, relative to the
/// index's directory unless absolute; the last one is the file being written.
fn read_binlog_index(path: &FsPath) -> Result<Vec<Local>, ArchiveError> {
    let text = std::fs::read_to_string(path).map_err(|source| ArchiveError::IndexFile {
        path: path.to_path_buf(),
        source,
    })?;
    let dir = path.parent().unwrap_or(FsPath::new("."));
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let p = FsPath::new(line);
        let full = if p.is_absolute() {
            p.to_path_buf()
        } else {
            dir.join(p)
        };
        let name = full
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let sequence = tidemark_core::inventory::segment_sequence(&name)
            .filter(|_| tidemark_store::layout::is_segment_name(&name));
        let Some(sequence) = sequence else {
            return Err(ArchiveError::NotBinlogName {
                path: path.to_path_buf(),
                line: i + 1,
                name,
            });
        };
        if let Some(other) = out.iter().find(|l: &&Local| l.sequence == sequence) {
            return Err(ArchiveError::DuplicateSequence {
                path: path.to_path_buf(),
                sequence,
                first: other.name.clone(),
                second: name,
            });
        }
        out.push(Local {
            path: full,
            name,
            sequence,
        });
    }
    Ok(out)
}

/// Ships the closed files of `binlog_index` not yet archived, then indexes them.
///
/// # Errors
/// The binlog index cannot be read or names a non-binlog; a closed file cannot be read or
/// parsed; the store fails. Files shipped before an error are indexed by the next run.
pub async fn archive_pass(
    store: &ClusterStore,
    binlog_index: &FsPath,
    progress: &dyn Progress,
) -> Result<ArchiveReport, ArchiveError> {
    let mut files = read_binlog_index(binlog_index)?;
    let mut report = ArchiveReport {
        open: files.pop().map(|f| f.name),
        ..Default::default()
    };
    let loaded = SegmentIndex::load(store).await?;
    // What the index holds for each sequence of ours.
    let known: HashMap<u64, String> = match &loaded {
        None => HashMap::new(),
        Some(idx) => {
            let mut idx = idx.clone();
            let mut seqs: Vec<u64> = files.iter().map(|f| f.sequence).collect();
            seqs.sort_unstable();
            let holding = idx.shards_holding(&seqs);
            idx.read_shards(store, holding).await?;
            idx.entries()
                .map(|e| (e.sequence, e.name.clone()))
                .collect()
        }
    };
    let mut todo = Vec::new();
    for f in files {
        match known.get(&f.sequence) {
            Some(name) if *name == f.name => report.already_indexed += 1,
            Some(name) => {
                return Err(ArchiveError::SequenceTaken {
                    name: f.name,
                    sequence: f.sequence,
                    indexed: name.clone(),
                });
            }
            None => todo.push(f),
        }
    }
    let (large, small): (Vec<Local>, Vec<Local>) = todo.into_iter().partition(|f| {
        std::fs::metadata(&f.path).is_ok_and(|m| m.len() >= transfer::PART_SIZE as u64)
    });
    // The futures are made before they become a stream: a stream of closures borrowing
    // `store` and `progress` would not be `Send` for every lifetime, which tasks need.
    let ship_all = |files: Vec<Local>, concurrency: usize| {
        let shipping: Vec<_> = files
            .into_iter()
            .map(|f| ship(store, f, progress))
            .collect();
        futures::stream::iter(shipping)
            .buffer_unordered(concurrency)
            .collect::<Vec<_>>()
    };
    let (small, large) = futures::join!(
        ship_all(small, SMALL_CONCURRENCY),
        ship_all(large, LARGE_CONCURRENCY)
    );
    let results: Vec<Result<(IndexEntry, bool), ArchiveError>> =
        small.into_iter().chain(large).collect();
    let mut entries = Vec::new();
    let mut first_error = None;
    for r in results {
        match r {
            Ok((entry, adopted)) => {
                report.bytes += entry.size;
                if adopted {
                    report.adopted.push(entry.name.clone());
                } else {
                    report.uploaded.push(entry.name.clone());
                }
                entries.push(entry);
            }
            Err(ArchiveError::Vanished(name)) => report.vanished.push(name),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    entries.sort_by_key(|e| e.sequence);
    report.uploaded.sort();
    report.adopted.sort();
    // Index what was shipped even when another file failed: it is in the store.
    if !entries.is_empty() {
        index::update(
            store,
            loaded.as_ref(),
            &HashSet::new(),
            &entries,
            index::SHARD_SIZE,
        )
        .await?;
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

/// Uploads one closed file (or adopts its object), returning its index entry and whether
/// it was adopted. [`ArchiveError::Vanished`]: the server purged it before it was read.
async fn ship(
    store: &ClusterStore,
    f: Local,
    progress: &dyn Progress,
) -> Result<(IndexEntry, bool), ArchiveError> {
    let path = f.path.clone();
    let times = match tokio::task::spawn_blocking(move || {
        let mut file = std::fs::File::open(&path)?;
        binlog::event_times(&mut file).map_err(|e| match e {
            binlog::BinlogError::Io(io) => io,
            other => std::io::Error::other(other),
        })
    })
    .await
    {
        Ok(Ok(t)) => t,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(file = %f.path.display(), "binlog purged before it was archived");
            return Err(ArchiveError::Vanished(f.name.clone()));
        }
        Ok(Err(e)) => {
            let source = match e.downcast::<binlog::BinlogError>() {
                Ok(b) => b,
                Err(io) => binlog::BinlogError::Io(io),
            };
            return Err(ArchiveError::Binlog {
                path: f.path.clone(),
                source,
            });
        }
        Err(join) => {
            return Err(ArchiveError::Binlog {
                path: f.path.clone(),
                source: binlog::BinlogError::Io(std::io::Error::other(join)),
            });
        }
    };
    let key = layout::segment_key(&f.name);
    let local_size = tokio::fs::metadata(&f.path)
        .await
        .map_err(|e| ArchiveError::Binlog {
            path: f.path.clone(),
            source: binlog::BinlogError::Io(e),
        })?
        .len();
    // Already uploaded (as it is: a compressed or encrypted upload is simply sent again) by
    // a run that died before indexing? Not taken when this store encrypts: a plaintext copy
    // left by an earlier run is replaced, never indexed.
    let existing = store.head(&key).await?.map(|m| m.size);
    let entry = |sent: tidemark_store::format::PayloadObject| IndexEntry {
        name: f.name.clone(),
        sequence: f.sequence,
        first_event_at: times.first,
        last_event_at: times.last,
        size: sent.size,
        sha256: Some(sent.sha256),
        compression: sent.compression,
        encryption: sent.encryption,
    };
    if store.recipients().is_none()
        && existing == Some(local_size)
        && let Some(local_sha) = local_sha256(&f.path).await
        && stored_sha256(store, &key).await.as_deref() == Some(local_sha.as_str())
    {
        return Ok((
            entry(tidemark_store::format::PayloadObject {
                name: f.name.clone(),
                size: local_size,
                sha256: local_sha,
                compression: None,
                original_size: None,
                encryption: None,
            }),
            true,
        ));
    }
    let mut file = match tokio::fs::File::open(&f.path).await {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ArchiveError::Vanished(f.name.clone()));
        }
        Err(e) => {
            return Err(ArchiveError::Binlog {
                path: f.path.clone(),
                source: binlog::BinlogError::Io(e),
            });
        }
    };
    let up = Upload::to_key(store, key, &f.name).map_err(|source| ArchiveError::Upload {
        path: f.path.clone(),
        source: Box::new(source.into()),
    })?;
    let sent = transfer::send(store, up, &mut file, progress)
        .await
        .map_err(|source| ArchiveError::Upload {
            path: f.path.clone(),
            source: Box::new(source),
        })?;
    Ok((entry(sent), false))
}

async fn local_sha256(path: &FsPath) -> Option<String> {
    let mut f = tokio::fs::File::open(path).await.ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).await.ok()?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Some(hex::encode(h.finalize()))
}

async fn stored_sha256(store: &ClusterStore, key: &object_store::path::Path) -> Option<String> {
    let got = store.object_store().get(key).await.ok()?;
    let mut h = Sha256::new();
    let mut s = got.into_stream();
    while let Some(chunk) = s.try_next().await.ok()? {
        h.update(&chunk);
    }
    Some(hex::encode(h.finalize()))
}
