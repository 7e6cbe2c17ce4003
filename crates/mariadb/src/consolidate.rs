//! Consolidation (seed 002's synthetic full) for mariabackup chains: the base and its
//! increments up to a target are fetched, prepared into one full data directory, and that
//! directory is streamed back as a new full backup that takes the target's place.
//!
//! # Crash safety
//! The synthetic full is committed (its `metadata.json` written last) before anything of
//! the old chain is deleted, and its `consolidatedFrom` names the chain. Interrupted before
//! the commit, the store holds the old chain and an uncommitted payload that
//! `failedBackupsTTL` collects; after it, the planner treats the full as standing in for
//! the target, so the next pass deletes the merged backups and the target.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::backup::{self as mariadb, Lsns};
use crate::restore::{RestoreError, Tools, build_prepared, finish_piped, no_pipe, spawn};
use tidemark_store::ClusterStore;
use tidemark_store::Progress;
use tidemark_store::catalog::Catalog;
pub use tidemark_store::executor::Consolidation;
use tidemark_store::format::{BackupType, CONSOLIDATED_FROM, Metadata, PayloadObject};
use tidemark_store::transfer::{Attempt, AttemptRecord, AttemptSpec, TransferError, new_backup_id};

impl From<RestoreError> for ConsolidateError {
    fn from(e: RestoreError) -> Self {
        ConsolidateError::Restore(Box::new(e))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConsolidateError {
    #[error("backup {id}: its chain cannot be resolved in the store")]
    NoChain { id: String },
    #[error("backup {id} has no readable metadata.json")]
    NoMetadata { id: String },
    #[error(transparent)]
    Mariadb(#[from] mariadb::MariaDbError),
    #[error("{0}")]
    Restore(Box<RestoreError>),
    #[error(transparent)]
    Transfer(#[from] TransferError),
    #[error(
        "the chain of {id} is encrypted, and no recipient is set for the synthetic full (--recipient, objectStore.encryption.recipients): it would be written in clear; the chain is kept whole"
    )]
    WouldDecrypt { id: String },
}

/// Builds and commits the synthetic full that replaces `target` (a mariabackup
/// increment), in a scratch directory under `work_parent`. This is the work a plan's
/// `consolidate` actions ask for; the deletions that follow are the executor's.
///
/// # Guarantees
/// Deletes nothing of the chain it merges, nor any committed object. The new full is
/// committed only when its whole payload is uploaded; on failure its partial upload is
/// aborted and its own payload removed (a synthetic full never committed).
///
/// # Errors
/// The chain is incomplete; a download fails its checksum; a MariaDB tool fails; the
/// upload or commit fails.
pub async fn consolidate(
    store: &ClusterStore,
    catalog: &Catalog,
    inventory: &tidemark_core::Inventory,
    target: &str,
    tools: &Tools,
    work_parent: &Path,
    progress: &dyn Progress,
) -> Result<Consolidation, ConsolidateError> {
    let chain =
        tidemark_core::chain_of(inventory, target).ok_or_else(|| ConsolidateError::NoChain {
            id: target.to_owned(),
        })?;
    let metas: Vec<Metadata> = chain
        .iter()
        .map(|b| {
            catalog
                .backup(&b.name, &b.id)
                .and_then(|s| s.metadata.clone())
                .ok_or_else(|| ConsolidateError::NoMetadata { id: b.id.clone() })
        })
        .collect::<Result<_, _>>()?;
    let Some(last) = metas.last() else {
        return Err(ConsolidateError::NoChain {
            id: target.to_owned(),
        });
    };
    let lsns = mariadb::lsns_of(last)?;
    // An encrypted chain without its identity (or a newer format) fails here, before any
    // scratch space or tool is used; the chain is kept whole. So does an encrypted chain
    // on a store that writes plaintext: the synthetic full would hold its content in
    // clear.
    for m in &metas {
        tidemark_store::transfer::backup_readable(store, m)?;
    }
    let encrypted = metas
        .iter()
        .any(|m| m.payload.iter().any(|p| p.encryption.is_some()));
    if encrypted && store.recipients().is_none() {
        return Err(ConsolidateError::WouldDecrypt {
            id: target.to_owned(),
        });
    }
    let work = tempfile::Builder::new()
        .prefix(".tidemark-consolidate-")
        .tempdir_in(work_parent)
        .map_err(|source| RestoreError::Io {
            action: "creating a scratch directory".into(),
            dir: work_parent.to_path_buf(),
            source,
        })?;
    let datadir = work.path().join("full");
    build_prepared(store, &metas, &datadir, work.path(), tools, progress).await?;

    let spec = AttemptSpec {
        backup_name: last.backup_name.clone(),
        backup_id: new_backup_id(last.started_at),
        kind: BackupType::Full,
        parent_id: None,
        method: mariadb::METHOD.to_owned(),
        payload_name: format!("backup.{}", mariadb::EXT),
        started_at: last.started_at,
        labels: last.labels.clone(),
        ttl: last.ttl,
        lock_until: None,
    };
    progress.step(
        &format!("uploading the synthetic full {}", spec.backup_id),
        0,
    );
    // An attempt like any other: its marker keeps passes off its upload while it runs.
    let attempt = Attempt::begin(store, &spec).await?;
    let payload = match stream_directory(&attempt, &datadir, tools, progress).await {
        Ok(p) => p,
        Err(e) => {
            attempt.abandon().await;
            return Err(e);
        }
    };
    let consolidated_from: Vec<String> = metas.iter().map(|m| m.backup_id.clone()).collect();
    let mut extra = serde_json::Map::new();
    let (k, mut v) = mariadb::lsns_field(&Lsns {
        from_lsn: 0,
        ..lsns
    });
    // The data directory the chain was taken of, which the next incremental on this full
    // must be of too.
    if let (Some(dir), Some(fields)) = (mariadb::data_directory_of(last), v.as_object_mut()) {
        fields.insert(
            mariadb::DATA_DIRECTORY_FIELD.to_owned(),
            dir.to_owned().into(),
        );
    }
    extra.insert(k, v);
    extra.insert(
        CONSOLIDATED_FROM.to_owned(),
        serde_json::json!(consolidated_from),
    );
    extra.insert(
        "consolidatedAt".to_owned(),
        serde_json::json!(jiff::Timestamp::now()),
    );
    let size = payload.size;
    let committed = attempt
        .finish(AttemptRecord {
            payload: vec![payload],
            log_position: last.log_position.clone(),
            // It holds the data of the backup it stands in for, taken on that server.
            server: last.server.clone(),
            error: None,
            extra,
            // It restores to exactly the target's point.
            completed_at: last.completed_at,
            // It stands in for the chain: locked as long as the chain is, and at least the
            // lock period from now, like any new backup (a date in the past is not asked
            // for: S3 refuses it).
            immutable_until: store.object_lock().and_then(|_| {
                let now = jiff::Timestamp::now();
                metas
                    .iter()
                    .filter_map(|m| m.immutable_until)
                    .chain(store.lock_period().map(|p| p.after(now)))
                    .max()
                    .filter(|t| *t > now)
            }),
        })
        .await
        .map_err(|u| u.error)?;
    Ok(Consolidation {
        target: target.to_owned(),
        synthetic: committed.backup_id,
        consolidated_from,
        size,
    })
}

/// Streams a prepared data directory as an xbstream (`mbstream -c`) into the attempt.
async fn stream_directory(
    attempt: &Attempt,
    dir: &Path,
    tools: &Tools,
    progress: &dyn Progress,
) -> Result<PayloadObject, ConsolidateError> {
    let files = relative_files(dir).map_err(|source| RestoreError::Io {
        action: "listing the prepared directory".into(),
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut child = spawn(
        Command::new(&tools.mbstream)
            .arg("-c")
            .args(&files)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        &tools.mbstream,
    )?;
    let Some(mut stdout) = child.stdout.take() else {
        return Err(no_pipe("mbstream -c").into());
    };
    let uploaded = attempt.upload(&mut stdout, progress).await;
    drop(stdout);
    let finished = finish_piped(
        child,
        uploaded,
        &tools.mbstream,
        "mbstream -c of the synthetic full",
    )
    .await;
    if let (Err(RestoreError::Tool { .. }), spec) = (&finished, attempt.spec()) {
        // The bytes are of a failed stream: remove them rather than leave them for the TTL.
        let name = tidemark_store::transfer::payload_name(attempt.store(), spec);
        tidemark_store::transfer::remove_payload(attempt.store(), spec, &name).await;
    }
    Ok(finished?)
}

/// Every regular file under `dir`, relative to it, sorted.
fn relative_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(dir.join(&rel))? {
            let entry = entry?;
            let path = rel.join(entry.file_name());
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}
