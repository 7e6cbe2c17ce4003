//! Store URLs → an object store rooted at one cluster's prefix.

use std::sync::Arc;
use std::time::Duration;

use object_store::limit::LimitStore;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, RetryConfig};
use url::Url;

use crate::error::StoreError;

pub use crate::error::URL_FORMS;

/// Requests in flight per store: enough to keep S3 busy, few enough not to trip its
/// request-rate limits (object_store backs off on 503/429 underneath).
pub const MAX_CONCURRENT_REQUESTS: usize = 64;

/// Bytes per multipart part (S3 needs at least 5 MiB) and parts in flight: a push holds at
/// most about `PART_SIZE * (PARTS_IN_FLIGHT + 1)` in memory.
pub const PART_SIZE: usize = 16 << 20;
pub const PARTS_IN_FLIGHT: usize = 6;

/// How the store is reached, besides the URL.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// S3-compatible endpoint, e.g. `http://127.0.0.1:8333`. An `http://` endpoint given
    /// here (or in `AWS_ENDPOINT_URL`) enables plain HTTP.
    pub endpoint: Option<String>,
    /// Give up on a request after this long (transient errors are retried with backoff
    /// until then).
    pub retry_timeout: Option<Duration>,
    /// The deadline of one request (default `bounded::REQUEST_TIMEOUT`); an object read's
    /// body has none, but a least rate (`bounded::MIN_READ_RATE`).
    pub request_timeout: Option<Duration>,
    /// S3 region (else `AWS_REGION`, `AWS_DEFAULT_REGION`, or `us-east-1`).
    pub region: Option<String>,
    /// S3 path-style requests (`https://host/bucket/key`); `false` asks for virtual-hosted
    /// style (`https://bucket.host/key`). Default: path style.
    pub path_style: Option<bool>,
    /// S3 credentials given explicitly (the operator reads them from the policy's Secret);
    /// else the environment's.
    pub credentials: Option<S3Credentials>,
    /// A private CA (PEM) trusted beside the machine's roots, or the roots built in where
    /// the machine has none (`crate::tls`).
    pub ca_bundle: Option<String>,
    /// GCS or Azure credentials given explicitly (the operator reads them from the
    /// policy's Secret); else the environment's. Nothing from the environment mixes in.
    pub cloud_credentials: Option<CloudCredentials>,
    /// Address ranges never connected to (the operator's `--deny-endpoints`): checked on
    /// every connection (`crate::deny`). Empty: none.
    pub denied_endpoints: Vec<crate::deny::Cidr>,
}

/// Credentials of a `gs://` or `az://` store. `Debug` never shows a secret.
#[derive(Clone)]
pub enum CloudCredentials {
    /// A GCS service-account key: the JSON key file.
    GcsServiceAccountKey(String),
    /// An Azure storage account with its access key or a SAS token (query string).
    Azure {
        account: String,
        access_key: Option<String>,
        sas_token: Option<String>,
    },
}

impl std::fmt::Debug for CloudCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloudCredentials::GcsServiceAccountKey(_) => {
                f.write_str("GcsServiceAccountKey(<redacted>)")
            }
            CloudCredentials::Azure {
                account,
                access_key,
                sas_token,
            } => f
                .debug_struct("Azure")
                .field("account", account)
                .field("access_key", &access_key.as_ref().map(|_| "<redacted>"))
                .field("sas_token", &sas_token.as_ref().map(|_| "<redacted>"))
                .finish(),
        }
    }
}

/// `k=v&k2=v2` (a SAS token, with or without its leading `?`) as decoded pairs.
fn sas_pairs(token: &str) -> Vec<(String, String)> {
    url::form_urlencoded::parse(token.trim_start_matches('?').as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

pub use crate::bounded::MAX_CONTROL_OBJECT;

/// Static S3 credentials. `Debug` never shows the secret.
#[derive(Clone, Default)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Backend family: decides what a listing can rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Local,
    Memory,
    S3,
    Gcs,
    Azure,
}

impl Backend {
    /// Whether listings come back in lexicographic key order (S3 ListObjectsV2, GCS, Azure
    /// and the in-memory store do; a directory walk does not). Early-stopping listings rely
    /// on it.
    pub fn lists_in_order(self) -> bool {
        !matches!(self, Backend::Local)
    }
}

/// What a backend offers beyond object_store's interface.
#[derive(Debug, Clone)]
pub(crate) enum Native {
    /// Nothing beyond it (in-memory stores, wrapped stores in tests, GCS, Azure).
    None,
    /// A local directory: the cluster's directory, walked without following links.
    Local { cluster_dir: std::path::PathBuf },
    /// S3: listing and aborting incomplete multipart uploads.
    S3(Arc<crate::uploads::S3Native>),
}

/// Whether a catalog load uses the metadata cache (`_state/metadata-cache.json.zst`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheUse {
    /// Every `metadata.json` is read from the store.
    Off,
    /// Bodies are taken from the cache where the listing shows them unchanged; the cache
    /// is not written (`plan`, `ls`, restores, read-only credentials).
    #[default]
    Read,
    /// As [`CacheUse::Read`], and the cache is rewritten when what was read differs from it
    /// (a pass that deletes, under the store's lease).
    Write,
}

/// A store rooted at `<path>/<cluster>/`.
#[derive(Debug, Clone)]
pub struct ClusterStore {
    pub(crate) inner: Arc<dyn ObjectStore>,
    /// The user's URL, for messages.
    pub url: String,
    pub cluster: String,
    pub backend: Backend,
    pub(crate) native: Native,
    identity: String,
    /// Multipart upload buffering: bytes per part and parts in flight (an upload holds at
    /// most about `part_size * (parts_in_flight + 1)` in memory).
    pub(crate) upload_buffer: (usize, usize),
    /// How payloads and segments uploaded to this store are compressed.
    pub(crate) compression: crate::compress::Compression,
    /// Who payloads and segments uploaded to this store are encrypted to (`None`: not).
    pub(crate) recipients: Option<Arc<crate::crypt::Recipients>>,
    /// What encrypted objects read from this store are decrypted with.
    pub(crate) identities: Option<Arc<crate::crypt::Identities>>,
    /// With `recipients`: objects written before this instant may be plaintext (the
    /// history from before encryption was turned on, named by the user); later ones, and
    /// all of them without it, are refused unencrypted.
    pub(crate) plaintext_before: Option<jiff::Timestamp>,
    /// S3 Object Lock: committed backups are locked in this mode (until their
    /// `immutableUntil`), and deletions remove every version of a key.
    pub(crate) object_lock: Option<tidemark_core::lock::LockMode>,
    /// How long a backup this store commits is locked, when known (what a synthetic full
    /// is locked for).
    pub(crate) lock_period: Option<tidemark_core::RetentionDuration>,
    /// What a pass does with a locked backup whose lock ended and that no rule keeps
    /// (seed 002): record it as expired and leave it to the bucket (the default), or
    /// delete it.
    pub(crate) lock_expiry: tidemark_core::lock::LockExpiry,
    /// What a pass has read of its budget (keys, pages, metadata bytes), shared by clones.
    pub(crate) spent: Arc<crate::budget::Spent>,
    /// Whether catalog loads use (and write) the metadata cache.
    pub(crate) metadata_cache: CacheUse,
    /// The rate payloads and segments move at, to and from this store (`--bandwidth`,
    /// `spec.bandwidth`): shared by every transfer of the process through it.
    pub(crate) bandwidth: Option<Arc<crate::bandwidth::Bandwidth>>,
}

impl ClusterStore {
    /// The same store counting what it reads afresh against `budget` (see
    /// [`crate::budget`]): open a store per pass, or call this at a pass's start.
    #[must_use]
    pub fn with_budget(self, budget: crate::budget::Budget) -> Self {
        self.spent.set(budget);
        self
    }

    /// The same store with its transfers (uploads through [`crate::transfer::Upload`],
    /// reads through [`crate::transfer::copy_verified`], copies to it) held to `limit`.
    #[must_use]
    pub fn with_bandwidth(mut self, limit: Option<Arc<crate::bandwidth::Bandwidth>>) -> Self {
        self.bandwidth = limit;
        self
    }

    /// The rate this store's transfers are held to, if any.
    pub fn bandwidth(&self) -> Option<&Arc<crate::bandwidth::Bandwidth>> {
        self.bandwidth.as_ref()
    }

    /// The same store with catalog loads using the metadata cache as `use_` says
    /// ([`CacheUse::Read`] by default).
    #[must_use]
    pub fn with_metadata_cache(mut self, use_: CacheUse) -> Self {
        self.metadata_cache = use_;
        self
    }

    /// How catalog loads of this store use the metadata cache.
    pub fn metadata_cache(&self) -> CacheUse {
        self.metadata_cache
    }

    /// What this store may still read, and has.
    pub fn budget(&self) -> &crate::budget::Spent {
        &self.spent
    }

    /// Counts what this store reads afresh: a unit of work begins (each catalog load does
    /// this itself; a loop that only lists, such as the binlog archive's watch, calls it
    /// per round).
    pub fn begin_pass(&self) {
        self.spent.reset();
    }

    /// The same store with uploads buffered as `part_size` bytes per part (at least the
    /// 5 MiB S3 needs) and `parts_in_flight` parts sent at once (at least 1): what bounds
    /// one upload's memory, e.g. for the operator's exec streams.
    #[must_use]
    pub fn with_upload_buffer(mut self, part_size: usize, parts_in_flight: usize) -> Self {
        self.upload_buffer = (part_size.max(5 << 20), parts_in_flight.max(1));
        self
    }

    /// The same store with payloads and segments compressed as `compression` says when
    /// uploaded (reads follow what each object's record says, whatever this is).
    pub fn with_compression(mut self, compression: crate::compress::Compression) -> Self {
        self.compression = compression;
        self
    }

    /// The same store with payloads and segments encrypted to `recipients` when uploaded
    /// (`None`: stored as plaintext).
    #[must_use]
    pub fn with_recipients(mut self, recipients: Option<Arc<crate::crypt::Recipients>>) -> Self {
        self.recipients = recipients;
        self
    }

    /// The same store accepting plaintext payloads and segments written before `instant`
    /// although it encrypts (see [`crate::transfer::plaintext_allowed`]).
    #[must_use]
    pub fn with_plaintext_before(mut self, instant: Option<jiff::Timestamp>) -> Self {
        self.plaintext_before = instant;
        self
    }

    /// The same store reading encrypted objects with `identities`.
    #[must_use]
    pub fn with_identities(mut self, identities: Option<Arc<crate::crypt::Identities>>) -> Self {
        self.identities = identities;
        self
    }

    /// Who uploads to this store are encrypted to.
    pub fn recipients(&self) -> Option<&crate::crypt::Recipients> {
        self.recipients.as_deref()
    }

    /// How uploads to this store are compressed.
    pub fn compression(&self) -> crate::compress::Compression {
        self.compression
    }

    /// The memory one upload to this store holds at most, in bytes.
    pub fn upload_memory(&self) -> usize {
        let (part, in_flight) = self.upload_buffer;
        part * (in_flight + 1)
    }

    /// Opens `url` and roots it at `cluster`.
    ///
    /// # Errors
    /// [`StoreError::InvalidUrl`] for a URL of another form, an empty cluster name, or
    /// missing S3 credentials; [`StoreError::Open`] when the backend refuses its settings.
    /// Reachability is found out by the first request.
    pub fn open(url: &str, cluster: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        check_cluster(cluster)?;
        let spent = Arc::new(crate::budget::Spent::default());
        let base = open_base(url, options, &spent)?;
        let root = if base.prefix.as_ref().is_empty() {
            Path::from(cluster)
        } else {
            base.prefix.clone().join(cluster)
        };
        let native = match base.native {
            BaseNative::None => Native::None,
            BaseNative::Local(dir) => Native::Local {
                cluster_dir: dir.join(cluster),
            },
            BaseNative::S3 {
                s3,
                bucket_url,
                region,
                client,
            } => match crate::uploads::S3Native::new(
                s3,
                bucket_url,
                region,
                root.clone(),
                &client,
                spent.clone(),
            ) {
                Ok(n) => Native::S3(Arc::new(n)),
                Err(source) => {
                    return Err(StoreError::Open {
                        url: url.to_owned(),
                        answer: source,
                    });
                }
            },
        };
        let identity = format!("{} {root}", base.place);
        let limited = LimitStore::new(base.store, MAX_CONCURRENT_REQUESTS);
        let counted = crate::budget::Counted {
            inner: Arc::new(limited),
            spent: spent.clone(),
        };
        Ok(ClusterStore {
            spent,
            inner: Arc::new(PrefixStore::new(counted, root)),
            url: url.to_owned(),
            cluster: cluster.to_owned(),
            backend: base.backend,
            native,
            identity,
            upload_buffer: (PART_SIZE, PARTS_IN_FLIGHT),
            compression: crate::compress::Compression::None,
            recipients: None,
            plaintext_before: None,
            identities: None,
            object_lock: None,
            lock_expiry: tidemark_core::lock::LockExpiry::default(),
            lock_period: None,
            metadata_cache: CacheUse::Read,
            bandwidth: None,
        })
    }

    /// Wraps an existing store (tests: fault injection, in-memory) rooted at `cluster`.
    pub fn from_object_store(
        store: Arc<dyn ObjectStore>,
        cluster: &str,
        backend: Backend,
    ) -> Result<Self, StoreError> {
        check_cluster(cluster)?;
        // A wrapped store is its own place.
        let identity = format!("{:p} {cluster}", Arc::as_ptr(&store));
        let spent = Arc::new(crate::budget::Spent::default());
        let counted = crate::budget::Counted {
            inner: store,
            spent: spent.clone(),
        };
        Ok(ClusterStore {
            spent,
            inner: Arc::new(PrefixStore::new(counted, Path::from(cluster))),
            url: format!("{backend:?}://"),
            cluster: cluster.to_owned(),
            backend,
            native: Native::None,
            identity,
            upload_buffer: (PART_SIZE, PARTS_IN_FLIGHT),
            compression: crate::compress::Compression::None,
            recipients: None,
            plaintext_before: None,
            identities: None,
            object_lock: None,
            lock_expiry: tidemark_core::lock::LockExpiry::default(),
            lock_period: None,
            metadata_cache: CacheUse::Read,
            bandwidth: None,
        })
    }

    /// The same store seen through a wrapper of its (already rooted) object store, e.g. a
    /// fault injector. Every request then goes through the wrapper: what the backend offers
    /// beyond object_store (a local walk, S3 upload listings) is not used.
    pub fn map_inner(
        &self,
        wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
    ) -> Self {
        ClusterStore {
            inner: wrap(Arc::clone(&self.inner)),
            native: Native::None,
            ..self.clone()
        }
    }

    /// The same store with S3 Object Lock: backups committed with a lock date are locked in
    /// `mode`, and what a pass deletes goes with all its versions (a lock-enabled bucket is
    /// versioned: a plain delete would only hide the data behind a delete marker).
    ///
    /// # Errors
    /// [`StoreError::ObjectLockUnsupported`] when the store is not S3 (object lock is an S3
    /// feature; a local directory or a wrapped store cannot hold it).
    pub fn with_object_lock(
        mut self,
        mode: Option<tidemark_core::lock::LockMode>,
    ) -> Result<Self, StoreError> {
        if mode.is_some() && self.s3().is_none() {
            return Err(StoreError::ObjectLockUnsupported {
                url: self.url.clone(),
            });
        }
        self.object_lock = mode;
        Ok(self)
    }

    /// The same store knowing the lock period of the policy (what a synthetic full, which
    /// starts a chain anew, is locked for).
    #[must_use]
    pub fn with_lock_period(mut self, period: Option<tidemark_core::RetentionDuration>) -> Self {
        self.lock_period = period;
        self
    }

    /// The same store doing `expiry` with locked backups whose lock ended (seed 002).
    #[must_use]
    pub fn with_lock_expiry(mut self, expiry: tidemark_core::lock::LockExpiry) -> Self {
        self.lock_expiry = expiry;
        self
    }

    /// What a pass does with a locked backup whose lock ended.
    pub fn lock_expiry(&self) -> tidemark_core::lock::LockExpiry {
        self.lock_expiry
    }

    /// The lock period, when known.
    pub fn lock_period(&self) -> Option<tidemark_core::RetentionDuration> {
        self.lock_period
    }

    /// The object lock mode backups are committed with, if any.
    pub fn object_lock(&self) -> Option<tidemark_core::lock::LockMode> {
        self.object_lock
    }

    /// The cluster's directory, for a local store.
    pub(crate) fn local_dir(&self) -> Option<&std::path::Path> {
        match &self.native {
            Native::Local { cluster_dir } => Some(cluster_dir),
            _ => None,
        }
    }

    /// S3 operations beyond object_store, for an S3 store.
    pub(crate) fn s3(&self) -> Option<&crate::uploads::S3Native> {
        match &self.native {
            Native::S3(n) => Some(n),
            _ => None,
        }
    }

    /// Replaces the URL shown in messages.
    pub fn with_url(mut self, url: &str) -> Self {
        self.url = url.to_owned();
        self
    }

    /// What tells two handles on the same cluster apart from two clusters, across
    /// spellings of one place: the store resolved (a local directory's `..` and links, an
    /// S3 bucket at its endpoint) and the cluster's key prefix, decoded and normalised
    /// (`s3://b//p` and `s3://b/p`, `my%20dir` and `my dir` are one).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    /// A key relative to the store URL (`<cluster>/<key>`), as shown to users.
    pub fn display_key(&self, key: &Path) -> String {
        format!("{}/{}", self.cluster, key)
    }

    /// An object's metadata; `None` when it does not exist.
    ///
    /// # Errors
    /// The request failed after retries.
    pub async fn head(&self, key: &Path) -> Result<Option<object_store::ObjectMeta>, StoreError> {
        use object_store::ObjectStoreExt;
        match self.inner.head(key).await {
            Ok(m) => Ok(Some(m)),
            Err(e) if crate::error::is_not_found(&e) => Ok(None),
            Err(source) => Err(request(self, "checking", key, source)),
        }
    }

    /// Reads a whole object with the version a conditional rewrite of it needs; `None`
    /// when it does not exist (or vanished while being read). An object over `limit` bytes
    /// (at most [`MAX_CONTROL_OBJECT`]) is refused with [`StoreError::TooLarge`].
    ///
    /// # Errors
    /// The request failed after retries, or the object is larger.
    pub(crate) async fn read_versioned_limited(
        &self,
        key: &Path,
        limit: u64,
    ) -> Result<Option<(bytes::Bytes, object_store::UpdateVersion)>, StoreError> {
        self.read_versioned_charged(key, limit, |_| Ok(())).await
    }

    /// [`Self::read_versioned_limited`], with the size the store announces for the body
    /// charged by `charge` before any of it is read: a pass's budget bounds what its reads
    /// hold at once, however many run together.
    ///
    /// # Errors
    /// As [`Self::read_versioned_limited`]; the charge refused (the request fails with
    /// it, as a listing past the budget does).
    pub(crate) async fn read_versioned_charged(
        &self,
        key: &Path,
        limit: u64,
        charge: impl Fn(u64) -> Result<(), crate::budget::Exceeded>,
    ) -> Result<Option<(bytes::Bytes, object_store::UpdateVersion)>, StoreError> {
        use object_store::ObjectStoreExt;
        let got = match self.inner.get(key).await {
            Ok(g) => g,
            Err(e) if crate::error::is_not_found(&e) => return Ok(None),
            Err(source) => return Err(request(self, "reading", key, source)),
        };
        charge(got.meta.size.min(limit)).map_err(|e| StoreError::Request {
            url: self.url.clone(),
            action: format!("reading {}", self.display_key(key)),
            answer: crate::budget::as_store_error(e),
        })?;
        let version = object_store::UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        Ok(self
            .collect_limited(key, got, limit)
            .await?
            .map(|b| (b, version)))
    }

    /// The body of `got`, at most `limit` bytes (and never more than
    /// [`MAX_CONTROL_OBJECT`]): a store (or an endpoint a policy names) that serves a
    /// larger one — by its announced size or by what it sends — is refused before it can
    /// fill memory.
    async fn collect_limited(
        &self,
        key: &Path,
        got: object_store::GetResult,
        limit: u64,
    ) -> Result<Option<bytes::Bytes>, StoreError> {
        use futures::StreamExt;
        let limit = limit.min(MAX_CONTROL_OBJECT);
        let too_large = || StoreError::TooLarge {
            url: self.url.clone(),
            key: key.to_string(),
            limit,
        };
        if got.meta.size > limit {
            return Err(too_large());
        }
        let mut body = bytes::BytesMut::new();
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) if crate::error::is_not_found(&e) => return Ok(None),
                Err(source) => return Err(request(self, "reading", key, source)),
            };
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Some(body.freeze()))
    }

    /// [`Self::read_limited`], with the metadata the store served the body with (its entity
    /// tag and size).
    ///
    /// # Errors
    /// As [`Self::read_limited`].
    pub(crate) async fn read_limited_with_meta(
        &self,
        key: &Path,
        limit: u64,
    ) -> Result<Option<(object_store::ObjectMeta, bytes::Bytes)>, StoreError> {
        use object_store::ObjectStoreExt;
        match self.inner.get(key).await {
            Ok(got) => {
                let meta = got.meta.clone();
                Ok(self
                    .collect_limited(key, got, limit)
                    .await?
                    .map(|body| (meta, body)))
            }
            Err(e) if crate::error::is_not_found(&e) => Ok(None),
            Err(source) => Err(request(self, "reading", key, source)),
        }
    }

    /// Reads a whole object; `None` when it does not exist (or vanished while being read).
    ///
    /// # Errors
    /// The request failed after retries.
    pub async fn read(&self, key: &Path) -> Result<Option<bytes::Bytes>, StoreError> {
        self.read_limited(key, MAX_CONTROL_OBJECT).await
    }

    /// [`Self::read`], refusing an object over `limit` bytes (at most
    /// [`MAX_CONTROL_OBJECT`]) with [`StoreError::TooLarge`].
    ///
    /// # Errors
    /// The request failed after retries, or the object is larger.
    pub async fn read_limited(
        &self,
        key: &Path,
        limit: u64,
    ) -> Result<Option<bytes::Bytes>, StoreError> {
        use object_store::ObjectStoreExt;
        match self.inner.get(key).await {
            Ok(got) => self.collect_limited(key, got, limit).await,
            Err(e) if crate::error::is_not_found(&e) => Ok(None),
            Err(source) => Err(request(self, "reading", key, source)),
        }
    }
}

fn check_cluster(cluster: &str) -> Result<(), StoreError> {
    if crate::layout::is_safe_name(cluster) && !cluster.starts_with('_') {
        Ok(())
    } else {
        Err(StoreError::InvalidCluster {
            cluster: cluster.to_owned(),
        })
    }
}

fn invalid(url: &str, problem: impl Into<String>) -> StoreError {
    StoreError::InvalidUrl {
        url: url.to_owned(),
        problem: problem.into(),
    }
}

/// What a URL opens, before it is rooted at a cluster.
struct Base {
    store: Arc<dyn ObjectStore>,
    backend: Backend,
    /// What the store is, spelt one way: a local directory resolved (`..`, links), an S3
    /// bucket's URL at its endpoint, `gs://bucket`, `az://container`.
    place: String,
    /// The prefix inside the bucket (or the store directory).
    prefix: Path,
    native: BaseNative,
}

enum BaseNative {
    None,
    Local(std::path::PathBuf),
    S3 {
        s3: Arc<object_store::aws::AmazonS3>,
        bucket_url: String,
        region: String,
        /// The client settings of the store's own client (roots, plain HTTP).
        client: Box<object_store::ClientOptions>,
    },
}

fn open_base(
    url: &str,
    options: &StoreOptions,
    spent: &Arc<crate::budget::Spent>,
) -> Result<Base, StoreError> {
    let parsed = Url::parse(url).map_err(|e| invalid(url, e.to_string()))?;
    let retry = RetryConfig {
        max_retries: 6,
        retry_timeout: options.retry_timeout.unwrap_or(Duration::from_secs(60)),
        ..Default::default()
    };
    let open_err = |source| StoreError::Open {
        url: url.to_owned(),
        answer: source,
    };
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid(url, "a store URL has no query or fragment"));
    }
    // Hosts written as addresses are never resolved: checked here (names are checked by
    // the resolver on every connection).
    if !options.denied_endpoints.is_empty() {
        let gcs_base = match &options.cloud_credentials {
            Some(CloudCredentials::GcsServiceAccountKey(key)) => {
                serde_json::from_str::<serde_json::Value>(key)
                    .ok()
                    .and_then(|k| k["gcs_base_url"].as_str().map(str::to_owned))
            }
            _ => None,
        };
        for u in options.endpoint.iter().chain(gcs_base.as_ref()) {
            if let Some(host) = Url::parse(u)
                .ok()
                .and_then(|u| u.host_str().map(str::to_owned))
            {
                crate::deny::check_literal(&options.denied_endpoints, &host)
                    .map_err(|e| invalid(url, e))?;
            }
        }
    }
    // Percent-encoded characters are decoded: `s3://b/my%20dir` is the prefix `my dir`.
    let prefix = || -> Result<Path, StoreError> {
        Path::from_url_path(parsed.path().trim_matches('/'))
            .map_err(|e| invalid(url, e.to_string()))
    };
    let bucket = || -> Result<String, StoreError> {
        match parsed.host_str() {
            Some(h) if !h.is_empty() => Ok(h.to_owned()),
            _ => Err(invalid(url, "the bucket name is missing")),
        }
    };
    match parsed.scheme() {
        "file" => {
            if parsed.host_str().is_some_and(|h| !h.is_empty()) {
                return Err(invalid(
                    url,
                    "a file URL needs an absolute path (three slashes: file:///dir)",
                ));
            }
            let dir = parsed
                .to_file_path()
                .map_err(|()| invalid(url, "not a local path"))?;
            if dir.parent().is_none() {
                return Err(invalid(
                    url,
                    "it names the root directory; name the directory the backups go to, e.g. file:///var/backups",
                ));
            }
            if !dir.is_dir() {
                return Err(StoreError::MissingDirectory {
                    url: url.to_owned(),
                    dir,
                });
            }
            let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                .map_err(open_err)?
                .with_automatic_cleanup(true);
            Ok(Base {
                store: Arc::new(crate::local::SafeLocal::new(dir.clone(), fs)),
                backend: Backend::Local,
                place: format!(
                    "file://{}",
                    std::fs::canonicalize(&dir)
                        .unwrap_or_else(|_| dir.clone())
                        .display()
                ),
                prefix: Path::default(),
                native: BaseNative::Local(dir),
            })
        }
        "memory" => Ok(Base {
            store: Arc::new(object_store::memory::InMemory::new()),
            backend: Backend::Memory,
            place: url.to_owned(),
            prefix: prefix()?,
            native: BaseNative::None,
        }),
        "s3" => {
            use object_store::aws::AmazonS3Builder;
            let bucket = bucket()?;
            // Explicit credentials: nothing from the environment may mix into them.
            let builder = if options.credentials.is_some() {
                AmazonS3Builder::new()
            } else {
                AmazonS3Builder::from_env()
            };
            let client = crate::tls::client_options(
                options.ca_bundle.as_deref(),
                &options.denied_endpoints,
                |k| match k {
                    object_store::aws::AmazonS3ConfigKey::Client(c) => Some(c),
                    _ => None,
                },
            )
            .map_err(|e| invalid(url, e))?;
            let mut b = builder
                .with_bucket_name(&bucket)
                .with_retry(retry)
                .with_http_connector(crate::bounded::BoundedConnector {
                    spent: spent.clone(),
                    request_timeout: options.request_timeout,
                })
                .with_client_options(client.clone());
            let endpoint = options
                .endpoint
                .clone()
                .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
                .or_else(|| std::env::var("AWS_ENDPOINT").ok());
            let mut allow_http = false;
            if let Some(ep) = &endpoint {
                check_endpoint(ep, false)?;
                // Without a trailing `/`, as `bucket_url` has it: object_store takes a
                // virtual-hosted endpoint as given, and `https://host/` would put every
                // key under `//`, apart from the requests signed here.
                b = b.with_endpoint(ep.trim_end_matches('/'));
                if ep.starts_with("http://") {
                    allow_http = true;
                    b = b.with_allow_http(true);
                }
            }
            let env = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty());
            if let Some(c) = &options.credentials {
                b = b
                    .with_access_key_id(&c.access_key_id)
                    .with_secret_access_key(&c.secret_access_key);
                if let Some(t) = &c.session_token {
                    b = b.with_token(t);
                }
            } else if env("AWS_ACCESS_KEY_ID") != env("AWS_SECRET_ACCESS_KEY") {
                return Err(invalid(
                    url,
                    "only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set; set both",
                ));
            }
            // Without static, web-identity or container credentials object_store would ask
            // the instance metadata service, which hangs off-cloud: refuse with a message.
            let has_creds = options.credentials.is_some()
                || env("AWS_ACCESS_KEY_ID")
                || env("AWS_WEB_IDENTITY_TOKEN_FILE")
                || env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                || env("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                || env("TIDEMARK_S3_USE_INSTANCE_METADATA");
            if !has_creds {
                return Err(StoreError::NoCredentials {
                    url: url.to_owned(),
                });
            }
            let region = options
                .region
                .clone()
                .or_else(|| std::env::var("AWS_REGION").ok().filter(|r| !r.is_empty()))
                .or_else(|| {
                    std::env::var("AWS_DEFAULT_REGION")
                        .ok()
                        .filter(|r| !r.is_empty())
                })
                .unwrap_or_else(|| "us-east-1".to_owned());
            b = b.with_region(&region);
            let path_style = options.path_style.unwrap_or(true);
            b = b.with_virtual_hosted_style_request(!path_style);
            let bucket_url = bucket_url(endpoint.as_deref(), &bucket, &region, path_style);
            let s3 = Arc::new(b.build().map_err(open_err)?);
            Ok(Base {
                store: s3.clone(),
                backend: Backend::S3,
                place: bucket_url.clone(),
                prefix: prefix()?,
                native: BaseNative::S3 {
                    s3,
                    bucket_url,
                    region,
                    client: Box::new(client.with_allow_http(allow_http)),
                },
            })
        }
        "gs" => {
            let bucket = bucket()?;
            let client = crate::tls::client_options(
                options.ca_bundle.as_deref(),
                &options.denied_endpoints,
                |k| match k {
                    object_store::gcp::GoogleConfigKey::Client(c) => Some(c),
                    _ => None,
                },
            )
            .map_err(|e| invalid(url, e))?;
            let (builder, key) = match &options.cloud_credentials {
                Some(CloudCredentials::GcsServiceAccountKey(key)) => (
                    object_store::gcp::GoogleCloudStorageBuilder::new()
                        .with_service_account_key(key),
                    Some(key.clone()),
                ),
                Some(CloudCredentials::Azure { .. }) => {
                    return Err(invalid(url, "Azure credentials given for a gs:// store"));
                }
                None => gcs_from_env().map_err(|e| invalid(url, e))?,
            };
            // A key may name its own base URL (an emulator on loopback: `gcs_base_url`,
            // with `disable_oauth`); plain HTTP only when it says so.
            let http = key
                .and_then(|k| serde_json::from_str::<serde_json::Value>(&k).ok())
                .and_then(|k| k["gcs_base_url"].as_str().map(str::to_owned))
                .is_some_and(|u| u.starts_with("http://"));
            let gcs = builder
                .with_http_connector(crate::bounded::BoundedConnector {
                    spent: spent.clone(),
                    request_timeout: options.request_timeout,
                })
                .with_client_options(client.with_allow_http(http))
                .with_bucket_name(&bucket)
                .with_retry(retry)
                .build()
                .map_err(open_err)?;
            Ok(Base {
                store: Arc::new(gcs),
                backend: Backend::Gcs,
                place: format!("gs://{bucket}"),
                prefix: prefix()?,
                native: BaseNative::None,
            })
        }
        "az" | "azure" => {
            let container = bucket()?;
            let client = crate::tls::client_options(
                options.ca_bundle.as_deref(),
                &options.denied_endpoints,
                |k| match k {
                    object_store::azure::AzureConfigKey::Client(c) => Some(c),
                    _ => None,
                },
            )
            .map_err(|e| invalid(url, e))?;
            use object_store::azure::MicrosoftAzureBuilder;
            let mut b = match &options.cloud_credentials {
                Some(CloudCredentials::Azure {
                    account,
                    access_key,
                    sas_token,
                }) => {
                    let mut b = MicrosoftAzureBuilder::new().with_account(account);
                    if let Some(k) = access_key {
                        b = b.with_access_key(k);
                    }
                    if let Some(t) = sas_token {
                        b = b.with_sas_authorization(sas_pairs(t));
                    }
                    b
                }
                Some(CloudCredentials::GcsServiceAccountKey(_)) => {
                    return Err(invalid(url, "a GCS key given for an az:// store"));
                }
                None => MicrosoftAzureBuilder::from_env(),
            }
            // Before allow_http below: client options replace what it sets.
            .with_client_options(client);
            // The blob endpoint (an Azure Stack, or an emulator on loopback).
            let endpoint = options
                .endpoint
                .clone()
                .or_else(|| std::env::var("AZURE_STORAGE_ENDPOINT").ok())
                .filter(|e| !e.is_empty());
            if let Some(ep) = endpoint {
                check_endpoint(&ep, true)?;
                b = b
                    .with_allow_http(ep.starts_with("http://"))
                    .with_endpoint(ep);
            }
            let az = b
                .with_http_connector(crate::bounded::BoundedConnector {
                    spent: spent.clone(),
                    request_timeout: options.request_timeout,
                })
                .with_container_name(&container)
                .with_retry(retry)
                .build()
                .map_err(open_err)?;
            Ok(Base {
                store: Arc::new(az),
                backend: Backend::Azure,
                place: format!("az://{container}"),
                prefix: prefix()?,
                native: BaseNative::None,
            })
        }
        other => Err(invalid(url, format!("unknown scheme {other:?}"))),
    }
}

/// object_store's `GoogleCloudStorageBuilder::from_env` (the `GOOGLE_*` variables), with the
/// service-account key it names read here, once: `GOOGLE_SERVICE_ACCOUNT_KEY` (the JSON),
/// else the file `GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_SERVICE_ACCOUNT_PATH` (or
/// `SERVICE_ACCOUNT`) names — a regular file of at most 64 KiB (a key is a few KiB; a FIFO
/// or a device would block or never end), given to the builder as the key. Returns the
/// builder and the key (its `gcs_base_url` decides plain HTTP).
///
/// # Errors
/// Both a key and a key file; the file cannot be read, is not a regular file or is too
/// large (named, never its contents).
fn gcs_from_env() -> Result<(object_store::gcp::GoogleCloudStorageBuilder, Option<String>), String>
{
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    use std::io::Read as _;
    const MAX_KEY_FILE: u64 = 64 << 10;
    let mut builder = GoogleCloudStorageBuilder::new();
    let mut path = std::env::var("SERVICE_ACCOUNT").ok();
    let mut key = None;
    for (k, v) in std::env::vars_os() {
        let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
            continue;
        };
        if !k.starts_with("GOOGLE_") {
            continue;
        }
        match k.to_ascii_lowercase().parse::<GoogleConfigKey>() {
            Ok(GoogleConfigKey::ServiceAccount) => path = Some(v.to_owned()),
            Ok(GoogleConfigKey::ServiceAccountKey) => key = Some(v.to_owned()),
            Ok(c) => builder = builder.with_config(c, v),
            Err(_) => {}
        }
    }
    let path = path.filter(|p| !p.is_empty());
    let key = match (key.filter(|k| !k.is_empty()), path) {
        (Some(_), Some(_)) => {
            return Err(
                "both GOOGLE_SERVICE_ACCOUNT_KEY and a key file (GOOGLE_SERVICE_ACCOUNT) are set; \
                 give one"
                    .into(),
            );
        }
        (Some(k), None) => Some(k),
        (None, Some(p)) => {
            let bad = |why: &str| format!("the service-account key file {p:?} {why}");
            let meta = std::fs::metadata(&p).map_err(|e| bad(&format!("cannot be read: {e}")))?;
            if !meta.is_file() {
                return Err(bad("is not a regular file"));
            }
            let mut text = String::new();
            std::fs::File::open(&p)
                .and_then(|f| f.take(MAX_KEY_FILE + 1).read_to_string(&mut text))
                .map_err(|e| bad(&format!("cannot be read: {e}")))?;
            if text.len() as u64 > MAX_KEY_FILE {
                return Err(bad("is larger than 64 KiB (a key file is a few KiB)"));
            }
            Some(text)
        }
        (None, None) => None,
    };
    if let Some(k) = &key {
        builder = builder.with_service_account_key(k);
    }
    Ok((builder, key))
}

/// An endpoint is a scheme, a host and maybe a port: a path, query, fragment or
/// credentials in it would be sent on, or ignored, in ways nobody means. An Azure blob
/// endpoint may have a path (an emulator's is `http://127.0.0.1:10000/<account>`):
/// `account_path`.
fn check_endpoint(ep: &str, account_path: bool) -> Result<(), StoreError> {
    let bad = |problem: &str| StoreError::InvalidEndpoint {
        endpoint: ep.to_owned(),
        problem: problem.to_owned(),
    };
    let u = Url::parse(ep).map_err(|e| bad(&e.to_string()))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad("the scheme is not http or https"));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad("the host is missing"));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(bad("it has a query or fragment"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad(
            "it holds credentials; give them as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ));
    }
    if !account_path && !matches!(u.path(), "" | "/") {
        return Err(bad(
            "it has a path; the bucket and prefix go in the store URL",
        ));
    }
    Ok(())
}

/// The bucket's URL for requests object_store does not make, the way object_store forms
/// it: path style appends the bucket to the endpoint; virtual-hosted style takes an
/// explicit endpoint as the bucket's own (it must name the bucket's host).
fn bucket_url(endpoint: Option<&str>, bucket: &str, region: &str, path_style: bool) -> String {
    match (endpoint.map(|e| e.trim_end_matches('/')), path_style) {
        (Some(ep), true) => format!("{ep}/{bucket}"),
        (Some(ep), false) => ep.to_owned(),
        (None, true) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        (None, false) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
    }
}

/// A failed request on `key`, e.g. `request(store, "reading", key, e)`.
pub(crate) fn request(
    store: &ClusterStore,
    verb: &str,
    key: &object_store::path::Path,
    source: object_store::Error,
) -> StoreError {
    tracing::debug!(url = %store.url, key = %key, "the store answered: {source}");
    StoreError::Request {
        url: store.url.clone(),
        action: format!("{verb} {}", store.display_key(key)),
        answer: source,
    }
}

/// A failed write of `key`.
pub(crate) fn write_err(
    store: &ClusterStore,
    key: &object_store::path::Path,
    source: object_store::Error,
) -> StoreError {
    request(store, "writing", key, source)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bad_urls_name_the_url_and_the_forms() {
        for (url, problem) in [
            ("ftp://x/y", "unknown scheme \"ftp\""),
            ("not a url", "relative URL without a base"),
            ("file://host/dir", "absolute path"),
            ("file:", "root directory"),
            ("file:///", "root directory"),
            ("file:///tmp?x=1", "no query"),
        ] {
            let e = ClusterStore::open(url, "c", &StoreOptions::default()).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(url) && msg.contains(problem), "{msg}");
            assert!(msg.contains("s3://bucket[/prefix]"), "{msg}");
        }
    }

    #[test]
    fn percent_encoded_paths_are_decoded() {
        let dir = tempfile::tempdir().unwrap();
        let spaced = dir.path().join("my store");
        std::fs::create_dir(&spaced).unwrap();
        let url = format!("file://{}/my%20store", dir.path().display());
        let s = ClusterStore::open(&url, "c", &StoreOptions::default()).unwrap();
        assert_eq!(s.local_dir(), Some(spaced.join("c").as_path()));
    }

    #[test]
    fn endpoints_with_more_than_a_host_are_refused() {
        for ep in [
            "http://127.0.0.1:8333?x=1",
            "http://user:pw@127.0.0.1:8333",
            "ftp://host",
            "http://host/bucket",
        ] {
            assert!(check_endpoint(ep, false).is_err(), "{ep}");
        }
        check_endpoint("http://127.0.0.1:8333", false).unwrap();
        check_endpoint("http://127.0.0.1:10000/devstoreaccount1", true).unwrap();
        check_endpoint("https://minio.example:9000/", false).unwrap();
        assert_eq!(
            bucket_url(Some("http://h:1"), "b", "r", true),
            "http://h:1/b"
        );
        // Virtual-hosted: an explicit endpoint is the bucket's own host.
        assert_eq!(
            bucket_url(Some("http://b.h:1/"), "b", "r", false),
            "http://b.h:1"
        );
        assert_eq!(
            bucket_url(None, "b", "eu-west-1", false),
            "https://b.s3.eu-west-1.amazonaws.com"
        );
        assert_eq!(
            bucket_url(None, "b", "eu-west-1", true),
            "https://s3.eu-west-1.amazonaws.com/b"
        );
    }

    #[test]
    fn missing_directory_is_reported() {
        let e = ClusterStore::open(
            "file:///nonexistent/tidemark",
            "c",
            &StoreOptions::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/tidemark"), "{e}");
    }

    #[test]
    fn cluster_names_cannot_escape_or_collide_with_reserved_names() {
        let long = "c".repeat(300);
        for bad in ["", "a/b", "_audit", "..", "a b", long.as_str()] {
            let e = ClusterStore::open("memory://", bad, &StoreOptions::default()).unwrap_err();
            assert!(matches!(e, StoreError::InvalidCluster { .. }), "{bad}: {e}");
        }
    }
}
