//! Copying objects from one store to another as they are stored (issue 44): the bytes are
//! never decoded — a compressed or encrypted object stays so, and the copy restores with
//! the same identity — and are checked on the way against what their record says, before
//! the destination's upload is completed. A transfer can be held to a rate
//! ([`crate::bandwidth::Bandwidth`]).

use futures::StreamExt;
use object_store::ObjectStoreExt;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::error::is_not_found;
use crate::layout;
use crate::open::{ClusterStore, request, write_err};
use crate::progress::Progress;
use crate::transfer::TransferError;

/// What an object is expected to be, from its record (`metadata.json`, the segment index).
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    pub size: u64,
    pub sha256: Option<&'a str>,
    /// Where the expectation is recorded, for messages.
    pub recorded_in: &'static str,
}

/// Copies the object `key` of `from` to the same key of `to`, as stored. The bytes are
/// hashed on the way; the destination's upload is completed only when their size and
/// sha256 are those `expected` records, and the completed object is then looked at in
/// `to` (its size).
///
/// # Guarantees
/// Writes only `key` of `to` (which is rooted at its cluster): an object whose bytes differ
/// from the record is never completed there (the upload is aborted).
///
/// # Errors
/// The object is missing in `from` ([`TransferError::MissingPayload`] or
/// [`TransferError::MissingSegment`]); its bytes differ from the record
/// ([`TransferError::Checksum`]); a request failed.
pub async fn copy_object(
    from: &ClusterStore,
    to: &ClusterStore,
    key: &Path,
    expected: Expected<'_>,
    limit: Option<&crate::bandwidth::Bandwidth>,
    progress: &dyn Progress,
) -> Result<(), TransferError> {
    let limit = limit.or(to.bandwidth.as_deref());
    let is_segment = key.as_ref().starts_with(layout::BINLOGS);
    let got = match from.inner.get(key).await {
        Ok(g) => g,
        Err(e) if is_not_found(&e) => {
            let key = from.display_key(key);
            return Err(if is_segment {
                TransferError::MissingSegment { key }
            } else {
                TransferError::MissingPayload { key }
            });
        }
        Err(source) => return Err(request(from, "reading", key, source).into()),
    };
    let mut stream = crate::transfer::resuming(from, key, got);
    let (part_size, in_flight) = to.upload_buffer;
    let mut writer = BufWriter::with_capacity(to.inner.clone(), key.clone(), part_size)
        .with_max_concurrency(in_flight);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    // The bytes are not those recorded.
    let differs = |actual_size: u64, actual_sha256: String| TransferError::Checksum {
        key: from.display_key(key),
        recorded_in: expected.recorded_in,
        expected_size: expected.size,
        expected_sha256: expected.sha256.unwrap_or("(not recorded)").to_owned(),
        actual_size,
        actual_sha256,
    };
    let sent = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|source| request(from, "reading", key, source))?;
            if let Some(l) = limit {
                l.take(chunk.len() as u64).await;
            }
            hasher.update(&chunk);
            size += chunk.len() as u64;
            if size > expected.size {
                // More than recorded: no more is read or sent (a server may send without end).
                return Err(differs(
                    size,
                    "(not read to its end: larger than recorded)".into(),
                ));
            }
            progress.bytes(chunk.len() as u64);
            writer
                .put(chunk)
                .await
                .map_err(|source| write_err(to, key, source))?;
        }
        Ok::<(), TransferError>(())
    }
    .await;
    if let Err(e) = sent {
        abort(to, key, writer).await;
        return Err(e);
    }
    let sha256 = hex::encode(hasher.finalize());
    if size != expected.size || expected.sha256.is_some_and(|e| e != sha256) {
        abort(to, key, writer).await;
        return Err(differs(size, sha256));
    }
    writer.shutdown().await.map_err(|e| {
        write_err(
            to,
            key,
            object_store::Error::Generic {
                store: "upload",
                source: Box::new(e),
            },
        )
    })?;
    match to.head(key).await? {
        Some(m) if m.size == size => Ok(()),
        found => Err(TransferError::PayloadGone {
            key: to.display_key(key),
            found: found.map_or_else(
                || "missing after its upload completed".to_owned(),
                |m| format!("{} bytes instead of {size}", m.size),
            ),
        }),
    }
}

/// Whether `key` is in `to` with `size` bytes already (a copy cut short after the object
/// was completed: it was checked on its way in, since an upload is completed only then).
///
/// # Errors
/// A failed request.
pub async fn already_there(
    to: &ClusterStore,
    key: &Path,
    size: u64,
) -> Result<bool, crate::error::StoreError> {
    Ok(to.head(key).await?.is_some_and(|m| m.size == size))
}

async fn abort(to: &ClusterStore, key: &Path, mut writer: BufWriter) {
    if let Err(e) = writer.abort().await {
        tracing::warn!(error = %e, key = %to.display_key(key), "could not abort the copy's upload");
    }
}
