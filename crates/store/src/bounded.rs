//! Bounds on what a store's server can make Tidemark read. The server is chosen by whoever
//! writes the store URL or endpoint — in the operator, any tenant — so no answer may cost
//! unbounded memory:
//!
//! - an error answer's body (object_store reads it whole into its error message) is cut
//!   after [`MAX_ERROR_BODY`];
//! - a listing page, or the answer to anything but an object read (an upload's XML, a
//!   token), fails past [`MAX_LISTING_BODY`], as a control object does;
//! - no answer's announced length is trusted for preallocation (object_store sizes its
//!   buffer by the body's size hint: a forged `Content-Length` would reserve it at once).
//!
//! Object reads (payloads, segments) stream through unchanged: the code reading them
//! bounds what it keeps (control objects at `MAX_CONTROL_OBJECT`, payloads by streaming).
//!
//! Bounds on time: every request but an object read has one deadline for its whole
//! exchange ([`REQUEST_TIMEOUT`], object_store's). An object read's body may take as long
//! as its reader takes to use it — a restore streams a payload into a database's load for
//! hours — so it has none: its server must answer within [`REQUEST_TIMEOUT`], and then
//! send its body at [`MIN_READ_RATE`] or faster over the time Tidemark waits for it (the
//! time the reader holds the stream back is not counted). A server that trickles, or
//! stops, fails the read as a timeout (object_store retries it from where it stopped).

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};

/// The largest metadata, index, lease or state object Tidemark reads whole (16 MiB; a
/// `metadata.json` is a few KiB, an index shard well under 1 MiB). Larger is an error on
/// that object, never memory.
pub const MAX_CONTROL_OBJECT: u64 = 16 * 1024 * 1024;

/// The largest lease, owner record or archiver status read (a few hundred bytes each):
/// read on every fence and every archive watch, a larger one is refused before it is
/// parsed (issue 42 §2: a 15 MB lease cost the operator ~770 MiB on each fence).
pub const MAX_STATE_RECORD: u64 = 64 * 1024;

/// The largest `_state/run.json` read: a few KiB for each schedule of a configuration.
pub const MAX_RUN_STATE: u64 = 1024 * 1024;

/// The largest segment index object read, the head or a shard: each holds at most 4,096
/// entries of a few hundred bytes (and the head a summary of each shard, some 400 bytes),
/// about 2 MB. A larger one is refused unread; what they hold parsed is charged to the
/// pass's budget besides (`crate::budget`).
pub const MAX_INDEX_OBJECT: u64 = 8 * 1024 * 1024;

/// The most of an error answer's body kept (its start names the error).
pub const MAX_ERROR_BODY: u64 = 64 * 1024;
/// The largest listing page or other non-object answer read (a page of 1000 keys is
/// well under 1 MiB).
pub const MAX_LISTING_BODY: u64 = MAX_CONTROL_OBJECT;

/// The deadline of a request's whole exchange (object_store's default), and of an object
/// read's answer up to its body.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The slowest an object read's body may arrive while Tidemark waits for it, in bytes per
/// second (the slowest `--bandwidth` allowed): beside [`REQUEST_TIMEOUT`], a body of N
/// bytes may keep Tidemark waiting N / 64 KiB seconds.
pub const MIN_READ_RATE: u64 = 64 * 1024;

/// object_store's own HTTP client, with every answer bounded, and listing pages counted
/// against the pass's budget (`crate::budget`).
#[derive(Debug, Default)]
pub(crate) struct BoundedConnector {
    pub(crate) spent: std::sync::Arc<crate::budget::Spent>,
    /// [`REQUEST_TIMEOUT`], unless given (tests).
    pub(crate) request_timeout: Option<Duration>,
}

impl HttpConnector for BoundedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let timeout = self.request_timeout.unwrap_or(REQUEST_TIMEOUT);
        let mut options = options.clone();
        if self.request_timeout.is_some() {
            options = options.with_timeout(timeout);
        }
        let inner = ReqwestConnector::default().connect(&options)?;
        // Object reads: no deadline for the whole body (see the module's text).
        let reads = ReqwestConnector::default().connect(&options.with_timeout_disabled())?;
        Ok(HttpClient::new(Bounded {
            inner,
            reads,
            spent: self.spent.clone(),
            timeout,
        }))
    }
}

#[derive(Debug)]
struct Bounded {
    inner: HttpClient,
    /// The client of object reads: no deadline of its own ([`Paced`] bounds them).
    reads: HttpClient,
    spent: std::sync::Arc<crate::budget::Spent>,
    timeout: Duration,
}

/// A listing request of S3 or GCS (`list-type=2`), Azure (`comp=list`) or S3's uploads.
fn is_listing(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&').any(|p| {
            matches!(p, "list-type=2" | "comp=list" | "uploads") || p.starts_with("uploads=")
        })
    })
}

#[async_trait::async_trait]
impl HttpService for Bounded {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let get = req.method() == http::Method::GET;
        // A page of a listing (GET; a POST `?uploads` starts an upload).
        let listing = get && is_listing(req.uri());
        let object_read = get && !is_listing(req.uri());
        if listing && let Err(e) = self.spent.page() {
            // Not retried (a server that pages without end does not stop).
            return Err(HttpError::new(HttpErrorKind::Unknown, e));
        }
        let response = if object_read {
            tokio::time::timeout(self.timeout, self.reads.execute(req))
                .await
                .map_err(|_| {
                    HttpError::new(
                        HttpErrorKind::Timeout,
                        SlowServer(format!("no answer within {} s", self.timeout.as_secs_f64())),
                    )
                })??
        } else {
            self.inner.execute(req).await?
        };
        let limit = if !response.status().is_success() {
            Some(Limit::Cut(MAX_ERROR_BODY))
        } else if !object_read {
            Some(Limit::Fail(MAX_LISTING_BODY))
        } else {
            None
        };
        let (parts, body) = response.into_parts();
        let body = match limit {
            Some(limit) => HttpResponseBody::new(Limited {
                inner: body,
                left: limit.bytes(),
                limit,
                done: false,
            }),
            None => body,
        };
        // Every answer of the deadline-free client is paced, its error bodies too (object_store
        // reads those whole): nothing it sends may hold a read without sending.
        let body = if object_read {
            HttpResponseBody::new(Paced {
                inner: body,
                base: self.timeout,
                received: 0,
                waited: Duration::ZERO,
                since: None,
                alarm: None,
            })
        } else {
            body
        };
        Ok(HttpResponse::from_parts(parts, body))
    }
}

#[derive(Debug, Clone, Copy)]
enum Limit {
    /// Keep the first N bytes, then end the body.
    Cut(u64),
    /// Fail once more than N bytes arrive.
    Fail(u64),
}

impl Limit {
    fn bytes(self) -> u64 {
        match self {
            Limit::Cut(n) | Limit::Fail(n) => n,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the store's server is too slow: {0}")]
struct SlowServer(String);

/// An object read's body, without a size hint (nothing preallocates by the server's word),
/// that fails once Tidemark has waited on it for longer than `base` and a second for each
/// [`MIN_READ_RATE`] bytes received. Only the time spent waiting for the server counts:
/// while the reader holds the stream back (its sink is slow), nothing is asked.
struct Paced {
    inner: HttpResponseBody,
    base: Duration,
    received: u64,
    /// The waits that ended (data came).
    waited: Duration,
    /// When the current wait began.
    since: Option<tokio::time::Instant>,
    alarm: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Paced {
    fn allowed(&self) -> Duration {
        self.base + Duration::from_secs_f64(self.received as f64 / MIN_READ_RATE as f64)
    }
}

impl Body for Paced {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(since) = this.since.take() {
                    this.waited += since.elapsed();
                }
                this.alarm = None;
                if let Some(Ok(f)) = &frame
                    && let Some(data) = f.data_ref()
                {
                    this.received += data.len() as u64;
                }
                Poll::Ready(frame)
            }
            Poll::Pending => {
                let since = *this.since.get_or_insert_with(tokio::time::Instant::now);
                let deadline = since + this.allowed().saturating_sub(this.waited);
                let alarm = this
                    .alarm
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if alarm.deadline() != deadline {
                    alarm.as_mut().reset(deadline);
                }
                if alarm.as_mut().poll(cx).is_ready() {
                    this.alarm = None;
                    return Poll::Ready(Some(Err(HttpError::new(
                        HttpErrorKind::Timeout,
                        SlowServer(format!(
                            "an object's body came slower than {} KiB/s while Tidemark waited \
                             for it ({} bytes in {:.0} s of waiting)",
                            MIN_READ_RATE / 1024,
                            this.received,
                            (this.waited + since.elapsed()).as_secs_f64()
                        )),
                    ))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

struct Limited {
    inner: HttpResponseBody,
    left: u64,
    limit: Limit,
    done: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("the server's answer is larger than {0} bytes, the most Tidemark reads of it")]
struct TooLarge(u64);

impl Body for Limited {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        let Ok(mut data) = frame.into_data() else {
            // Trailers: nothing to count.
            return Poll::Ready(None);
        };
        let len = data.len() as u64;
        if len <= self.left {
            self.left -= len;
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        self.done = true;
        match self.limit {
            Limit::Cut(_) => {
                data.truncate(usize::try_from(self.left).unwrap_or(usize::MAX));
                self.left = 0;
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Limit::Fail(n) => Poll::Ready(Some(Err(HttpError::new(
                HttpErrorKind::Decode,
                TooLarge(n),
            )))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // At most what may still be read, and no more than the server announced.
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_upper(inner.upper().map_or(self.left, |u| u.min(self.left)));
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_are_told_from_object_reads() {
        for q in [
            "/b?list-type=2&prefix=c%2F",
            "/c?restype=container&comp=list",
            "/b?uploads",
            "/b?uploads=&prefix=x",
        ] {
            assert!(is_listing(&q.parse().unwrap()), "{q}");
        }
        for q in ["/b/c/_index.json", "/b/c/x?versionId=3", "/b/list-type=2"] {
            assert!(!is_listing(&q.parse().unwrap()), "{q}");
        }
    }
}
