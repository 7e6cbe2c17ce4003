//! A fault-injecting [`ObjectStore`] wrapper, for proving crash safety: it fails the k-th
//! request (or every request from the k-th on, like a process that died there).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// Deletes one key through `inner`'s batch interface (what a wrapper that looks at each
/// key before passing it on does).
pub(crate) async fn delete_one(inner: &dyn ObjectStore, location: Path) -> Result<Path> {
    let mut one = inner.delete_stream(futures::stream::once(async move { Ok(location) }).boxed());
    match one.next().await {
        Some(r) => r,
        None => Err(object_store::Error::Generic {
            store: "delete",
            source: "a delete yielded nothing".into(),
        }),
    }
}

/// When requests fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// Only the k-th request (0-based) fails: a transient error.
    Once(usize),
    /// The k-th request and every later one fail: a crash at that point.
    From(usize),
    /// The k-th request is carried out, and then reported failed: an answer lost on the
    /// way back, so the caller does not know its write took effect.
    LoseAnswer(usize),
    /// Nothing fails; requests are only counted.
    Never,
}

/// Wraps a store and injects failures by request count. Every listing, read, write and
/// each key of a delete counts as one request.
#[derive(Debug)]
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
    mode: FaultMode,
    count: Arc<AtomicUsize>,
}

impl FaultStore {
    pub fn new(inner: Arc<dyn ObjectStore>, mode: FaultMode) -> Self {
        FaultStore {
            inner,
            mode,
            count: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Requests seen so far.
    pub fn requests(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    fn tick(count: &AtomicUsize, mode: FaultMode) -> Result<()> {
        let n = count.fetch_add(1, Ordering::SeqCst);
        let fail = match mode {
            FaultMode::Once(k) => n == k,
            FaultMode::From(k) => n >= k,
            FaultMode::LoseAnswer(_) | FaultMode::Never => false,
        };
        if fail { Err(Self::fault(n)) } else { Ok(()) }
    }

    fn fault(n: usize) -> object_store::Error {
        object_store::Error::Generic {
            store: "FaultStore",
            source: format!("injected fault at request {n}").into(),
        }
    }

    /// For a write: counts it, and says whether its answer is to be lost.
    fn tick_write(&self) -> Result<bool> {
        let n = self.count.load(Ordering::SeqCst);
        Self::tick(&self.count, self.mode)?;
        Ok(self.mode == FaultMode::LoseAnswer(n))
    }
}

impl fmt::Display for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let lose = self.tick_write()?;
        let done = self.inner.put_opts(location, payload, opts).await;
        if lose && done.is_ok() {
            return Err(Self::fault(self.requests() - 1));
        }
        done
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        Self::tick(&self.count, self.mode)?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        Self::tick(&self.count, self.mode)?;
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let count = Arc::clone(&self.count);
        let mode = self.mode;
        let inner = Arc::clone(&self.inner);
        locations
            .then(move |loc| {
                let count = Arc::clone(&count);
                let inner = Arc::clone(&inner);
                async move {
                    let loc = loc?;
                    Self::tick(&count, mode)?;
                    delete_one(inner.as_ref(), loc).await
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        match Self::tick(&self.count, self.mode) {
            Ok(()) => self.inner.list(prefix),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        }
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        match Self::tick(&self.count, self.mode) {
            Ok(()) => self.inner.list_with_offset(prefix, offset),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        Self::tick(&self.count, self.mode)?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        Self::tick(&self.count, self.mode)?;
        self.inner.copy_opts(from, to, options).await
    }
}
