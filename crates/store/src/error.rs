//! Errors of the store edge. Each names the store or key it concerns; `category` gives
//! the bounded class the CLI maps to exit codes (and the operator to event reasons).

use std::path::PathBuf;

/// The accepted store URL forms, quoted in errors.
pub const URL_FORMS: &str = "file:///absolute/dir, s3://bucket[/prefix], gs://bucket[/prefix], az://container[/prefix] or memory://";

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
    /// The store's answer is shown as [`shown`] gives it, not as a source: an endpoint is
    /// input (a tenant's), and what its server says must not reach a status.
    #[error("cannot open store {url}: {}", shown(answer))]
    Open {
        url: String,
        answer: object_store::Error,
    },
    #[error("store {url}: {action} failed: {}", shown(answer))]
    Request {
        url: String,
        action: String,
        answer: object_store::Error,
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
        "store {url}: {key} is larger than {limit} bytes, the most Tidemark reads of it (a metadata, index or state object; a metadata.json up to twice the size it was listed at); refused unread"
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
    /// The store's own answer, for a failed request or open.
    pub fn answer(&self) -> Option<&object_store::Error> {
        match self {
            StoreError::Open { answer, .. } | StoreError::Request { answer, .. } => Some(answer),
            _ => None,
        }
    }

    pub fn category(&self) -> ErrorCategory {
        match self {
            StoreError::InvalidUrl { .. }
            | StoreError::InvalidEndpoint { .. }
            | StoreError::InvalidCluster { .. }
            | StoreError::MissingDirectory { .. }
            | StoreError::NoCredentials { .. }
            | StoreError::ObjectLockUnsupported { .. } => ErrorCategory::Input,
            // A pass's budget spent: what the store holds, not an outage (issue 28).
            StoreError::Open { answer, .. } | StoreError::Request { answer, .. }
                if exceeded(answer).is_some() =>
            {
                ErrorCategory::Data
            }
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

/// An object_store error as Tidemark shows it (issue 28): a server's own words — the body of
/// an error answer, text quoted from an answer it could not parse — are left out, so an
/// endpoint pointed at an internal service cannot make Tidemark echo what that service
/// says into a status or a log a tenant reads. The HTTP status stays, with the S3 error
/// code (`<Code>AccessDenied</Code>`) when the answer had one. `TIDEMARK_LOG=debug` logs
/// the whole text where the error is made.
pub fn shown(e: &object_store::Error) -> String {
    const STATUS: &str = "status code: ";
    const LIMIT: usize = 600;
    // The causes too: a transport failure's reason ("Connection refused") is in them, and
    // it is the machine's own words, not a server's. A server's answer ends at its status.
    let mut text = e.to_string();
    let mut next = std::error::Error::source(e);
    while let Some(cause) = next {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = cause.source();
    }
    let mut out = match text.find(STATUS) {
        Some(i) => {
            let rest = &text[i + STATUS.len()..];
            // `403 Forbidden: <the body>`: the status and its reason, then the body.
            let end = rest.find(": ").unwrap_or(rest.len());
            let mut s = text[..i + STATUS.len() + end].to_owned();
            if let Some(code) = s3_code(&rest[end..]) {
                s.push_str(&format!(" (S3 error code {code})"));
            }
            s
        }
        None => text,
    };
    out = without_quoted(&out);
    if out.len() > LIMIT {
        out.truncate(out.floor_char_boundary(LIMIT));
        out.push('…');
    }
    out
}

/// The `<Code>` of an S3 error document in `body`, when it has the form of one.
fn s3_code(body: &str) -> Option<&str> {
    let start = body.find("<Code>")? + "<Code>".len();
    let len = body[start..].find("</Code>")?;
    let code = &body[start..start + len];
    (!code.is_empty()
        && code.len() <= 64
        && code.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'))
    .then_some(code)
}

/// `text` with every span quoted in `"` or `` ` `` (how serde quotes what it could not
/// parse) replaced by `…`.
fn without_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut open: Option<char> = None;
    for c in text.chars() {
        match open {
            None => {
                out.push(c);
                if c == '"' || c == '`' {
                    open = Some(c);
                }
            }
            Some(q) if c == q => {
                out.push('…');
                out.push(c);
                open = None;
            }
            Some(_) => {}
        }
    }
    if open.is_some() {
        out.push('…');
    }
    out
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
        // The store's answer is not a source of a StoreError (it is shown cut): look in it.
        if let Some(answer) = e.downcast_ref::<StoreError>().and_then(StoreError::answer)
            && access_denied(answer)
        {
            return true;
        }
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

/// The [`crate::budget::Exceeded`] inside `e`, when a budget is why it failed.
pub fn exceeded<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a crate::budget::Exceeded> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(x) = e.downcast_ref::<crate::budget::Exceeded>() {
            return Some(x);
        }
        if let Some(answer) = e.downcast_ref::<StoreError>().and_then(StoreError::answer)
            && let Some(x) = exceeded(answer)
        {
            return Some(x);
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(text: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: text.to_owned().into(),
        }
    }

    /// Issue 28 finding 10: what an endpoint's server says is not echoed; its status and
    /// S3 error code are.
    #[test]
    fn a_servers_words_are_not_shown() {
        let said = shown(&generic(
            "Error performing GET http://10.0.0.5/b?list-type=2 in 3ms - Server returned \
             non-2xx status code: 403 Forbidden: INTERNAL token=hunter2 \
             <Error><Code>AccessDenied</Code><Message>detail</Message></Error>",
        ));
        assert!(
            said.contains("403 Forbidden (S3 error code AccessDenied)"),
            "{said}"
        );
        assert!(
            !said.contains("hunter2") && !said.contains("detail"),
            "{said}"
        );
        let said = shown(&generic(
            "Server returned non-2xx status code: 500 Internal Server Error: <html>secret</html>",
        ));
        assert!(said.ends_with("500 Internal Server Error"), "{said}");
        // A code that is not one is not shown either.
        let said = shown(&generic(
            "status code: 404 Not Found: <Code>a secret with spaces</Code>",
        ));
        assert!(!said.contains("secret"), "{said}");
        let said = shown(&generic(
            "Got invalid list response: invalid type: string \"root:x:0:0\", expected struct; unknown field `leak`",
        ));
        assert!(!said.contains("root:x") && !said.contains("leak"), "{said}");
        assert!(said.contains("invalid list response"), "{said}");
        let said = shown(&generic(&format!("unterminated \"{}", "x".repeat(2000))));
        assert!(!said.contains('x'), "{said}");
        assert!(shown(&generic(&"y".repeat(5000))).chars().count() <= 601);
        // Denied is still recognised through the error.
        let e = StoreError::Request {
            url: "s3://b".into(),
            action: "listing".into(),
            answer: generic("Server returned non-2xx status code: 403 Forbidden: x"),
        };
        assert!(access_denied(&e));
    }

    /// A transport failure is shown with its cause: the reason is the machine's, and the
    /// only thing that tells a refused connection from a name that does not resolve.
    #[test]
    fn a_transport_failure_shows_its_cause() {
        #[derive(Debug)]
        struct Sending(std::io::Error);
        impl std::fmt::Display for Sending {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("HTTP error: error sending request")
            }
        }
        impl std::error::Error for Sending {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = object_store::Error::Generic {
            store: "S3",
            source: Box::new(Sending(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            ))),
        };
        let said = shown(&e);
        assert!(said.contains("error sending request"), "{said}");
        assert!(said.to_lowercase().contains("connection refused"), "{said}");
    }
}
