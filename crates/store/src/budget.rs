//! What one pass may read from a store, in all (issue 28 finding 2). Each answer is bounded
//! on its own (`bounded`, `open::MAX_CONTROL_OBJECT`), but a server that lists keys
//! without end, pages without end, or a hundred 15 MiB `metadata.json` files would still
//! hold memory without bound over a pass — in the operator, every tenant's pass, since the
//! pass is due again after the restart it causes. So a store opened for a pass counts:
//!
//! - the keys its listings yield (each is held until the pass ends);
//! - the listing pages it asks for (a server may answer empty pages that never end);
//! - the bytes of `metadata.json` bodies it keeps (each parsed and kept for the pass);
//! - the segment index it reads — `_index.json` and each shard, by what they hold parsed —
//!   and the number of shards (issue 42 §2: a head naming thousands of shards marked
//!   unordered would have every one read).
//!
//! The count starts afresh with each catalog load (a pass's survey; a retention pass
//! may make a few), and goes on through what the pass lists after it (binlog segments,
//! versions of what it deletes).
//!
//! Past a limit the request fails with [`Exceeded`], which names the limit, what was
//! spent and the setting that raises it; the pass fails with that reason (a data error:
//! exit 4, the operator's longer backoff), and nothing is deleted. The limits come from
//! [`Budget`]: the CLI's generous ones by default, the operator's fit its memory limit;
//! `TIDEMARK_MAX_LISTED_KEYS`, `TIDEMARK_MAX_LIST_PAGES`, `TIDEMARK_MAX_METADATA_BYTES`,
//! `TIDEMARK_MAX_INDEX_BYTES` and `TIDEMARK_MAX_INDEX_SHARDS` set them
//! ([`Budget::from_env`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// How much one pass may read (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Keys listed, all listings together.
    pub keys: u64,
    /// Listing pages asked for.
    pub pages: u64,
    /// Bytes of `metadata.json` kept.
    pub metadata_bytes: u64,
    /// Bytes of the segment index kept (the head and the shards read, parsed).
    pub index_bytes: u64,
    /// Index shards read.
    pub shards: u64,
}

/// The environment variables that set a [`Budget`].
pub const KEYS_ENV: &str = "TIDEMARK_MAX_LISTED_KEYS";
pub const PAGES_ENV: &str = "TIDEMARK_MAX_LIST_PAGES";
pub const METADATA_ENV: &str = "TIDEMARK_MAX_METADATA_BYTES";
pub const INDEX_ENV: &str = "TIDEMARK_MAX_INDEX_BYTES";
pub const SHARDS_ENV: &str = "TIDEMARK_MAX_INDEX_SHARDS";

impl Budget {
    /// One machine's own run (`tidemark` commands): about 400 MB of keys at most, for
    /// stores of hundreds of thousands of backups.
    pub const LOCAL: Budget = Budget {
        keys: 2_000_000,
        pages: 100_000,
        metadata_bytes: 1 << 30,
        index_bytes: 1 << 30,
        shards: 100_000,
    };

    /// A pass of the shared operator (`--background-passes` passes at once): about 25 MB
    /// of keys (some 30,000 backups) and 16 MiB of parsed metadata (some 5,000 backups');
    /// passes failing on it left the operator's peak where it was (docs/benchmarks.md,
    /// "Hostile tenants"); 32 MiB of parsed index (a pass deleting from some ten full
    /// shards at once, 4,096 segments each) and 256 shards.
    pub const SHARED: Budget = Budget {
        keys: 100_000,
        pages: 5_000,
        metadata_bytes: 16 << 20,
        index_bytes: 32 << 20,
        shards: 256,
    };

    /// `default`, with each limit the environment sets ([`KEYS_ENV`], [`PAGES_ENV`],
    /// [`METADATA_ENV`], [`INDEX_ENV`], [`SHARDS_ENV`]; a positive whole number).
    ///
    /// # Errors
    /// A value that is not one, naming the variable, the value and the form.
    pub fn from_env(default: Budget) -> std::result::Result<Budget, String> {
        let read = |name: &str, default: u64| -> std::result::Result<u64, String> {
            match std::env::var(name) {
                Err(_) => Ok(default),
                Ok(v) => match v.trim().parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(format!(
                        "{name}={:?}: expected a positive whole number",
                        v.chars().take(32).collect::<String>()
                    )),
                },
            }
        };
        Ok(Budget {
            keys: read(KEYS_ENV, default.keys)?,
            pages: read(PAGES_ENV, default.pages)?,
            metadata_bytes: read(METADATA_ENV, default.metadata_bytes)?,
            index_bytes: read(INDEX_ENV, default.index_bytes)?,
            shards: read(SHARDS_ENV, default.shards)?,
        })
    }
}

impl Default for Budget {
    fn default() -> Self {
        Budget::LOCAL
    }
}

/// A limit of the [`Budget`] reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the store answered with more than one pass may hold: over {limit} {what} (set {env} to allow more, if the store really holds that much)"
)]
pub struct Exceeded {
    pub what: &'static str,
    pub limit: u64,
    pub env: &'static str,
}

/// What a store opened for a pass has spent of its [`Budget`]; shared by the store's clones.
#[derive(Debug)]
pub struct Spent {
    limits: std::sync::Mutex<Budget>,
    keys: AtomicU64,
    pages: AtomicU64,
    metadata: AtomicU64,
    index: AtomicU64,
    shards: AtomicU64,
}

impl Default for Spent {
    fn default() -> Self {
        Spent::new(Budget::default())
    }
}

impl Spent {
    pub fn new(limits: Budget) -> Self {
        Spent {
            limits: std::sync::Mutex::new(limits),
            keys: AtomicU64::new(0),
            pages: AtomicU64::new(0),
            metadata: AtomicU64::new(0),
            index: AtomicU64::new(0),
            shards: AtomicU64::new(0),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> Budget {
        *self
            .limits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// New limits, counted afresh.
    pub(crate) fn set(&self, limits: Budget) {
        *self
            .limits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = limits;
        self.reset();
    }

    /// Counted afresh: a catalog load begins (what an earlier one held is gone, or goes
    /// when it is replaced), so a long-running `tidemark run` or watch is not stopped by
    /// what its earlier passes read.
    pub(crate) fn reset(&self) {
        for c in [
            &self.keys,
            &self.pages,
            &self.metadata,
            &self.index,
            &self.shards,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }

    fn take(
        counter: &AtomicU64,
        n: u64,
        limit: u64,
        what: &'static str,
        env: &'static str,
    ) -> std::result::Result<(), Exceeded> {
        let before = counter.fetch_add(n, Ordering::Relaxed);
        if before.saturating_add(n) > limit {
            return Err(Exceeded { what, limit, env });
        }
        Ok(())
    }

    /// One more key listed.
    pub fn key(&self) -> std::result::Result<(), Exceeded> {
        Self::take(&self.keys, 1, self.limits().keys, "listed keys", KEYS_ENV)
    }

    /// One more listing page asked for.
    pub fn page(&self) -> std::result::Result<(), Exceeded> {
        Self::take(
            &self.pages,
            1,
            self.limits().pages,
            "listing pages",
            PAGES_ENV,
        )
    }

    /// `n` more bytes of metadata kept.
    pub fn metadata(&self, n: u64) -> std::result::Result<(), Exceeded> {
        Self::take(
            &self.metadata,
            n,
            self.limits().metadata_bytes,
            "bytes of metadata.json",
            METADATA_ENV,
        )
    }

    /// `n` more bytes of the segment index kept.
    pub fn index(&self, n: u64) -> std::result::Result<(), Exceeded> {
        Self::take(
            &self.index,
            n,
            self.limits().index_bytes,
            "bytes of segment index",
            INDEX_ENV,
        )
    }

    /// `n` more index shards to read.
    pub fn shards(&self, n: u64) -> std::result::Result<(), Exceeded> {
        Self::take(
            &self.shards,
            n,
            self.limits().shards,
            "index shards",
            SHARDS_ENV,
        )
    }
}

/// `e` as an object_store error (what a listing yields).
pub(crate) fn as_store_error(e: Exceeded) -> object_store::Error {
    object_store::Error::Generic {
        store: "budget",
        source: Box::new(e),
    }
}

/// An object store whose listings count their keys against a [`Spent`].
#[derive(Debug)]
pub(crate) struct Counted {
    pub(crate) inner: Arc<dyn ObjectStore>,
    pub(crate) spent: Arc<Spent>,
}

impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.inner)
    }
}

impl Counted {
    fn count(
        &self,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let spent = Arc::clone(&self.spent);
        // Ends at the first key past the budget (its error is the last item).
        listing
            .scan(false, move |ended, item| {
                if *ended {
                    return futures::future::ready(None);
                }
                let item = match item {
                    Ok(meta) => match spent.key() {
                        Ok(()) => Ok(meta),
                        Err(e) => {
                            *ended = true;
                            Err(as_store_error(e))
                        }
                    },
                    Err(e) => Err(e),
                };
                futures::future::ready(Some(item))
            })
            .boxed()
    }
}

#[async_trait]
impl ObjectStore for Counted {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.count(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.count(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let listed = self.inner.list_with_delimiter(prefix).await?;
        for _ in 0..listed.objects.len() + listed.common_prefixes.len() {
            self.spent.key().map_err(as_store_error)?;
        }
        Ok(listed)
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_counted_and_named() {
        let spent = Spent::new(Budget {
            keys: 2,
            pages: 1,
            metadata_bytes: 10,
            index_bytes: 20,
            shards: 3,
        });
        assert!(spent.key().is_ok() && spent.key().is_ok());
        let e = spent.key().unwrap_err();
        assert!(e.to_string().contains("over 2 listed keys"), "{e}");
        assert!(e.to_string().contains(KEYS_ENV), "{e}");
        assert!(spent.page().is_ok() && spent.page().is_err());
        assert!(spent.metadata(10).is_ok() && spent.metadata(1).is_err());
        assert!(spent.index(20).is_ok());
        let e = spent.index(1).unwrap_err();
        assert!(e.to_string().contains("segment index"), "{e}");
        assert!(e.to_string().contains(INDEX_ENV), "{e}");
        assert!(spent.shards(3).is_ok());
        let e = spent.shards(1).unwrap_err();
        assert!(e.to_string().contains("over 3 index shards"), "{e}");
        assert!(e.to_string().contains(SHARDS_ENV), "{e}");
        // Counted afresh with new limits.
        spent.set(Budget::SHARED);
        assert!(spent.key().is_ok());
        let wrapped = crate::StoreError::Request {
            url: "s3://b".into(),
            action: "listing".into(),
            answer: as_store_error(e),
        };
        assert!(crate::error::exceeded(&wrapped).is_some());
    }
}
