//! Store URLs → an object store rooted at one cluster's prefix.

use std::sync::Arc;
use std::time::Duration;

use object_store::limit::LimitStore;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, RetryConfig};
use url::Url;

use crate::error::StoreError;

/// The accepted store URL forms, quoted in errors.
pub const URL_FORMS: &str = "file:///absolute/dir, s3://bucket[/prefix], gs://bucket[/prefix], az://container[/prefix] or memory://";

/// Requests in flight per store: enough to keep S3 busy, few enough not to trip its
/// request-rate limits (object_store backs off on 503/429 underneath).
pub const MAX_CONCURRENT_REQUESTS: usize = 64;

/// How the store is reached, besides the URL.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// S3-compatible endpoint, e.g. `http://127.0.0.1:8333`. An `http://` endpoint given
    /// here (or in `AWS_ENDPOINT_URL`) enables plain HTTP.
    pub endpoint: Option<String>,
    /// Give up on a request after this long (transient errors are retried with backoff
    /// until then).
    pub retry_timeout: Option<Duration>,
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

/// A store rooted at `<path>/<cluster>/`.
#[derive(Debug, Clone)]
pub struct ClusterStore {
    pub(crate) inner: Arc<dyn ObjectStore>,
    /// The user's URL, for messages.
    pub url: String,
    pub cluster: String,
    pub backend: Backend,
}

impl ClusterStore {
    /// Opens `url` and roots it at `cluster`.
    ///
    /// # Errors
    /// [`StoreError::InvalidUrl`] for a URL of another form, an empty cluster name, or
    /// missing S3 credentials; [`StoreError::Open`] when the backend refuses its settings.
    /// Reachability is found out by the first request.
    pub fn open(url: &str, cluster: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        check_cluster(cluster)?;
        let (store, backend, base) = open_base(url, options)?;
        let root = if base.as_ref().is_empty() {
            Path::from(cluster)
        } else {
            base.clone().join(cluster)
        };
        let limited = LimitStore::new(store, MAX_CONCURRENT_REQUESTS);
        Ok(ClusterStore {
            inner: Arc::new(PrefixStore::new(limited, root)),
            url: url.to_owned(),
            cluster: cluster.to_owned(),
            backend,
        })
    }

    /// Wraps an existing store (tests: fault injection, in-memory) rooted at `cluster`.
    pub fn from_object_store(
        store: Arc<dyn ObjectStore>,
        cluster: &str,
        backend: Backend,
    ) -> Result<Self, StoreError> {
        check_cluster(cluster)?;
        Ok(ClusterStore {
            inner: Arc::new(PrefixStore::new(store, Path::from(cluster))),
            url: format!("{backend:?}://"),
            cluster: cluster.to_owned(),
            backend,
        })
    }

    /// The same store seen through a wrapper of its (already rooted) object store, e.g. a
    /// fault injector.
    pub fn map_inner(
        &self,
        wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
    ) -> Self {
        ClusterStore {
            inner: wrap(Arc::clone(&self.inner)),
            ..self.clone()
        }
    }

    /// Replaces the URL shown in messages.
    pub fn with_url(mut self, url: &str) -> Self {
        self.url = url.to_owned();
        self
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
    pub(crate) async fn head(
        &self,
        key: &Path,
    ) -> Result<Option<object_store::ObjectMeta>, StoreError> {
        use object_store::ObjectStoreExt;
        match self.inner.head(key).await {
            Ok(m) => Ok(Some(m)),
            Err(e) if crate::error::is_not_found(&e) => Ok(None),
            Err(source) => Err(crate::error::request(self, "checking", key, source)),
        }
    }

    /// Reads a whole object; `None` when it does not exist (or vanished while being read).
    ///
    /// # Errors
    /// The request failed after retries.
    pub(crate) async fn read(&self, key: &Path) -> Result<Option<bytes::Bytes>, StoreError> {
        use object_store::ObjectStoreExt;
        let got = match self.inner.get(key).await {
            Ok(g) => g.bytes().await,
            Err(e) => Err(e),
        };
        match got {
            Ok(b) => Ok(Some(b)),
            Err(e) if crate::error::is_not_found(&e) => Ok(None),
            Err(source) => Err(crate::error::request(self, "reading", key, source)),
        }
    }
}

fn check_cluster(cluster: &str) -> Result<(), StoreError> {
    let ok = !cluster.is_empty()
        && !cluster.starts_with('_')
        && !cluster.starts_with('.')
        && cluster
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
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

fn open_base(
    url: &str,
    options: &StoreOptions,
) -> Result<(Arc<dyn ObjectStore>, Backend, Path), StoreError> {
    let parsed = Url::parse(url).map_err(|e| invalid(url, e.to_string()))?;
    let retry = RetryConfig {
        max_retries: 6,
        retry_timeout: options.retry_timeout.unwrap_or(Duration::from_secs(60)),
        ..Default::default()
    };
    let open_err = |source| StoreError::Open {
        url: url.to_owned(),
        source,
    };
    let prefix = || -> Result<Path, StoreError> {
        Path::parse(parsed.path().trim_matches('/')).map_err(|e| invalid(url, e.to_string()))
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
            let dir = std::path::PathBuf::from(parsed.path());
            if !dir.is_dir() {
                return Err(StoreError::MissingDirectory {
                    url: url.to_owned(),
                    dir,
                });
            }
            let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                .map_err(open_err)?
                .with_automatic_cleanup(true);
            Ok((Arc::new(fs), Backend::Local, Path::default()))
        }
        "memory" => Ok((
            Arc::new(object_store::memory::InMemory::new()),
            Backend::Memory,
            prefix()?,
        )),
        "s3" => {
            use object_store::aws::AmazonS3Builder;
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket()?)
                .with_retry(retry);
            let endpoint = options
                .endpoint
                .clone()
                .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
                .or_else(|| std::env::var("AWS_ENDPOINT").ok());
            if let Some(ep) = &endpoint {
                Url::parse(ep).map_err(|e| StoreError::InvalidEndpoint {
                    endpoint: ep.clone(),
                    problem: e.to_string(),
                })?;
                b = b.with_endpoint(ep);
                if ep.starts_with("http://") {
                    b = b.with_allow_http(true);
                }
            }
            let env = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty());
            if env("AWS_ACCESS_KEY_ID") != env("AWS_SECRET_ACCESS_KEY") {
                return Err(invalid(
                    url,
                    "only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set; set both",
                ));
            }
            // Without static, web-identity or container credentials object_store would ask
            // the instance metadata service, which hangs off-cloud: refuse with a message.
            let has_creds = env("AWS_ACCESS_KEY_ID")
                || env("AWS_WEB_IDENTITY_TOKEN_FILE")
                || env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                || env("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                || env("TIDEMARK_S3_USE_INSTANCE_METADATA");
            if !has_creds {
                return Err(StoreError::NoCredentials {
                    url: url.to_owned(),
                });
            }
            if !env("AWS_REGION") && !env("AWS_DEFAULT_REGION") {
                b = b.with_region("us-east-1");
            }
            let s3 = b.build().map_err(open_err)?;
            Ok((Arc::new(s3), Backend::S3, prefix()?))
        }
        "gs" => {
            let gcs = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket()?)
                .with_retry(retry)
                .build()
                .map_err(open_err)?;
            Ok((Arc::new(gcs), Backend::Gcs, prefix()?))
        }
        "az" | "azure" => {
            let az = object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_container_name(bucket()?)
                .with_retry(retry)
                .build()
                .map_err(open_err)?;
            Ok((Arc::new(az), Backend::Azure, prefix()?))
        }
        other => Err(invalid(url, format!("unknown scheme {other:?}"))),
    }
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
        ] {
            let e = ClusterStore::open(url, "c", &StoreOptions::default()).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(url) && msg.contains(problem), "{msg}");
            assert!(msg.contains("s3://bucket[/prefix]"), "{msg}");
        }
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
        for bad in ["", "a/b", "_audit", "..", "a b"] {
            let e = ClusterStore::open("memory://", bad, &StoreOptions::default()).unwrap_err();
            assert!(matches!(e, StoreError::InvalidCluster { .. }), "{bad}: {e}");
        }
    }
}
