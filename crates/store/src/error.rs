//! Errors of the store edge. Each names the store or key it concerns; `category` gives
//! the bounded class the CLI maps to exit codes (and the operator to event reasons).

use std::path::PathBuf;

use crate::open::URL_FORMS;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid store URL {url:?}: {problem}; expected {URL_FORMS}")]
    InvalidUrl { url: String, problem: String },
    #[error(
        "invalid endpoint {endpoint:?}: {problem}; expected a URL such as http://127.0.0.1:8333"
    )]
    InvalidEndpoint { endpoint: String, problem: String },
    #[error(
        "invalid cluster name {cluster:?}: expected letters, digits, '-', '_' or '.', not starting with '_' or '.'"
    )]
    InvalidCluster { cluster: String },
    #[error("store {url}: directory {} does not exist", dir.display())]
    MissingDirectory { url: String, dir: PathBuf },
    #[error(
        "store {url}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or use web-identity or container credentials; TIDEMARK_S3_USE_INSTANCE_METADATA=1 allows the EC2 metadata service)"
    )]
    NoCredentials { url: String },
    #[error(
        "store {url}: object lock needs an s3:// store whose bucket has S3 Object Lock enabled; this store cannot hold locks"
    )]
    ObjectLockUnsupported { url: String },
    #[error("cannot open store {url}")]
    Open {
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("store {url}: {action} failed")]
    Request {
        url: String,
        action: String,
        #[source]
        source: object_store::Error,
    },
    #[error("store {url}: {key} is malformed")]
    MalformedIndex {
        url: String,
        key: String,
        #[source]
        source: crate::format::IndexError,
    },
    #[error(
        "store {url}: {key} has formatVersion {version}, newer than this Tidemark understands ({supported}); upgrade Tidemark"
    )]
    NewerIndex {
        url: String,
        key: String,
        version: u32,
        supported: u32,
    },
    #[error(
        "store {url}: binlogs/_index.json names the shard {key}, which does not exist; if another pass rewrote the index meanwhile, run again, otherwise the index is damaged"
    )]
    MissingShard { url: String, key: String },
    #[error(
        "store {url}: {key} was changed by another writer {attempts} times in a row; try again"
    )]
    IndexContention {
        url: String,
        key: String,
        attempts: u32,
    },
    #[error(
        "store {url}: {key} records timeline {id} for server {server} already, written by another archiver meanwhile; run again (two archivers of one cluster's log archive should not run at once)"
    )]
    TimelineTaken {
        url: String,
        key: String,
        id: u32,
        server: String,
    },
    #[error("store {url}: {key} is malformed: {problem}")]
    MalformedState {
        url: String,
        key: String,
        problem: String,
    },
    #[error(
        "store {url}: {key} was changed by another writer; is another `tidemark run` using this cluster?"
    )]
    StateContention { url: String, key: String },
    #[error("store {url}: internal error: {problem}")]
    Internal { url: String, problem: String },
    #[error(
        "store {url}: {key} is larger than {limit} bytes, the most Tidemark reads of a metadata, index or state object; refused unread"
    )]
    TooLarge {
        url: String,
        key: String,
        limit: u64,
    },
    #[error("store {url}: could not serialise {what}")]
    Encode {
        url: String,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// The bounded class of a store error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCategory {
    /// The user's input (URL, cluster, credentials setup) is wrong.
    Input,
    /// The store could not be reached or refused a request.
    Store,
    /// Data in the store is not in a form this Tidemark can act on safely.
    Data,
    /// Another writer kept changing what this one had to change.
    Contention,
    /// A bug in Tidemark.
    Internal,
}

impl StoreError {
    pub fn category(&self) -> ErrorCategory {
        match self {
            StoreError::InvalidUrl { .. }
            | StoreError::InvalidEndpoint { .. }
            | StoreError::InvalidCluster { .. }
            | StoreError::MissingDirectory { .. }
            | StoreError::NoCredentials { .. }
            | StoreError::ObjectLockUnsupported { .. } => ErrorCategory::Input,
            StoreError::Open { .. } | StoreError::Request { .. } | StoreError::Encode { .. } => {
                ErrorCategory::Store
            }
            StoreError::IndexContention { .. }
            | StoreError::StateContention { .. }
            | StoreError::TimelineTaken { .. } => ErrorCategory::Contention,
            StoreError::Internal { .. } => ErrorCategory::Internal,
            StoreError::MalformedIndex { .. }
            | StoreError::NewerIndex { .. }
            | StoreError::MissingShard { .. }
            | StoreError::MalformedState { .. }
            | StoreError::TooLarge { .. } => ErrorCategory::Data,
        }
    }
}

/// A failed request on `key`, e.g. `request(store, "reading", key, e)`.
pub(crate) fn request(
    store: &crate::open::ClusterStore,
    verb: &str,
    key: &object_store::path::Path,
    source: object_store::Error,
) -> StoreError {
    StoreError::Request {
        url: store.url.clone(),
        action: format!("{verb} {}", store.display_key(key)),
        source,
    }
}

/// A failed write of `key`.
pub(crate) fn write_err(
    store: &crate::open::ClusterStore,
    key: &object_store::path::Path,
    source: object_store::Error,
) -> StoreError {
    request(store, "writing", key, source)
}

/// Whether an object_store error means "it is not there" (success for a delete).
pub fn is_not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
}

/// Whether `e`, or an error it was caused by, is the store refusing the credentials
/// (HTTP 401 or 403): a Secret or a bucket policy to fix, not an outage.
///
/// object_store types this for single-object requests (`PermissionDenied`,
/// `Unauthenticated`), but a listing's failure is `Generic` around a retry error whose
/// type is private; its text is then the only witness ("non-2xx status code: 403 …").
pub fn access_denied(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. },
        ) = e.downcast_ref::<object_store::Error>()
        {
            return true;
        }
        let text = e.to_string();
        if ["status code: 401", "status code: 403"]
            .iter()
            .any(|s| text.contains(s))
        {
            return true;
        }
        next = e.source();
    }
    false
}
