//! S3 Object Lock (issue 19 §3, seed 002): retention on the objects of a committed backup,
//! and deletion of every version of a key in a lock-enabled (hence versioned) bucket.
//!
//! object_store sets no lock headers and knows no versions, so these are signed requests
//! of their own (object_store's SigV4 signer and credentials, as in [`crate::uploads`]):
//! `PutObjectRetention`, `GetObjectRetention`, `ListObjectVersions` and
//! `DeleteObject?versionId`. Retention is set after an object is written, when the backup
//! commits: an attempt that fails before then leaves nothing locked, so it never stands in
//! the way of the next backups (pgBackRest #2686) and `failedBackupsTTL` collects it.

use base64::Engine as _;
use bytes::Bytes;
use jiff::Timestamp;
use md5::Digest as _;
use object_store::aws::AwsAuthorizer;
use object_store::client::{HttpRequest, HttpRequestBody};
use object_store::path::Path;
use serde::Deserialize;

use crate::uploads::{S3Native, capped, generic};

/// The most pages of versions listed for one key (1,000 versions each): an in-flight
/// marker rewritten every 30 s for days has thousands; a server that keeps answering
/// "truncated" is not followed without end.
pub const MAX_VERSION_PAGES: usize = 1000;

pub use tidemark_core::lock::{LOCK_MODES, LockMode};

/// An object's retention: locked in `mode` until `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub mode: LockMode,
    pub until: Timestamp,
}

/// `t` rounded up to a whole second: what S3 holds (and Tidemark records) as a lock date,
/// never before the instant asked for.
pub fn whole_second(t: Timestamp) -> Timestamp {
    let secs = t.as_second() + i64::from(t.subsec_nanosecond() > 0);
    Timestamp::from_second(secs).unwrap_or(t)
}

/// The URL of `key` under `root` in the bucket at `bucket_url`, with `query`. Each path
/// segment is encoded as object_store encodes S3 paths (every byte but `A-Z a-z 0-9 - . _
/// ~`): the request names the object exactly as object_store's requests do, and its
/// signature holds whether the server canonicalises the path as sent (AWS) or re-encodes
/// it strictly (MinIO, SeaweedFS) — a prefix with `+ : = @ , ;` left bare would be signed
/// one way and checked the other.
fn object_url(
    bucket_url: &str,
    root: &Path,
    key: &Path,
    query: &[(&str, &str)],
) -> object_store::Result<url::Url> {
    let mut url = url::Url::parse(bucket_url).map_err(generic)?;
    if url.cannot_be_a_base() {
        return Err(generic("the bucket URL cannot hold a path"));
    }
    let mut path = url.path().trim_end_matches('/').to_owned();
    for part in root.parts().chain(key.parts()) {
        path.push('/');
        path.push_str(&strict(part.as_ref()));
    }
    url.set_path(&path);
    set_query(&mut url, query);
    Ok(url)
}

/// A retention date as S3 takes it.
fn s3_date(t: Timestamp) -> String {
    whole_second(t).to_string()
}

impl S3Native {
    /// The URL of `key` (relative to the cluster's prefix), with `query`.
    fn object_url(&self, key: &Path, query: &[(&str, &str)]) -> object_store::Result<url::Url> {
        object_url(&self.bucket_url, &self.root, key, query)
    }

    /// Sends one signed request; the answer's status and (bounded) body.
    pub(crate) async fn send(
        &self,
        method: http::Method,
        url: &url::Url,
        headers: &[(&str, String)],
        body: Bytes,
    ) -> object_store::Result<(http::StatusCode, Bytes)> {
        let mut builder = http::Request::builder().method(method).uri(url.as_str());
        for (name, value) in headers {
            builder = builder.header(*name, value);
        }
        let mut request: HttpRequest =
            builder.body(HttpRequestBody::from(body)).map_err(generic)?;
        let credential = self.s3.credentials().get_credential().await?;
        AwsAuthorizer::new(&credential, "s3", &self.region).try_authorize(&mut request, None)?;
        let response = self.http.execute(request).await.map_err(generic)?;
        let status = response.status();
        let body = capped(response.into_body(), crate::bounded::MAX_CONTROL_OBJECT).await?;
        Ok((status, body))
    }

    /// Locks `key` as `retention` says (`PutObjectRetention`). S3 lets a retention be
    /// extended, never shortened: asking for an earlier date than the object has is
    /// refused by the server.
    ///
    /// # Errors
    /// The object is missing, the bucket has no object lock, or the server refused.
    pub async fn put_retention(
        &self,
        key: &Path,
        retention: &Retention,
    ) -> object_store::Result<()> {
        let url = self.object_url(key, &[("retention", "")])?;
        let body = format!(
            r#"<?xml version="1.0" encoding="UTF-8"?><Retention xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Mode>{}</Mode><RetainUntilDate>{}</RetainUntilDate></Retention>"#,
            retention.mode.as_s3(),
            s3_date(retention.until)
        );
        let md5 = base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(&body));
        let (status, answer) = self
            .send(
                http::Method::PUT,
                &url,
                &[
                    ("content-md5", md5),
                    ("content-type", "application/xml".to_owned()),
                ],
                Bytes::from(body),
            )
            .await?;
        if status.is_success() {
            return Ok(());
        }
        Err(refusal(key, "PutObjectRetention", status, &answer))
    }

    /// The retention of `key`'s current version (`GetObjectRetention`); `None` when it has
    /// none.
    ///
    /// # Errors
    /// The object is missing, or the request failed.
    pub async fn retention(&self, key: &Path) -> object_store::Result<Option<Retention>> {
        let url = self.object_url(key, &[("retention", "")])?;
        let (status, body) = self
            .send(http::Method::GET, &url, &[], Bytes::new())
            .await?;
        if status == http::StatusCode::NOT_FOUND && !error_code(&body).contains("NoSuchKey") {
            return Ok(None); // NoSuchObjectLockConfiguration: not locked
        }
        if !status.is_success() {
            return Err(refusal(key, "GetObjectRetention", status, &body));
        }
        let r: RetentionXml = quick_xml::de::from_reader(body.as_ref()).map_err(generic)?;
        let (Some(mode), Some(until)) = (r.mode, r.retain_until_date) else {
            return Ok(None);
        };
        Ok(Some(Retention {
            mode: mode.parse().map_err(generic)?,
            until: until.parse().map_err(generic)?,
        }))
    }

    /// Writes `body` as `key` locked from birth (`PutObject` with the object lock headers),
    /// only if no object is there (`If-None-Match: *`): how a locked backup's
    /// `metadata.json` commits, so a committed backup is never unlocked for an instant.
    ///
    /// # Errors
    /// [`object_store::Error::AlreadyExists`] when the key exists; the server refused (a
    /// bucket without object lock refuses the headers) or the request failed.
    pub async fn put_new_locked(
        &self,
        key: &Path,
        body: Bytes,
        retention: &Retention,
    ) -> object_store::Result<()> {
        let url = self.object_url(key, &[])?;
        let md5 = base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(&body));
        let (status, answer) = self
            .send(
                http::Method::PUT,
                &url,
                &[
                    ("content-md5", md5),
                    ("content-type", "application/json".to_owned()),
                    ("if-none-match", "*".to_owned()),
                    ("x-amz-object-lock-mode", retention.mode.as_s3().to_owned()),
                    (
                        "x-amz-object-lock-retain-until-date",
                        s3_date(retention.until),
                    ),
                ],
                body,
            )
            .await?;
        if status.is_success() {
            return Ok(());
        }
        if status == http::StatusCode::PRECONDITION_FAILED {
            return Err(object_store::Error::AlreadyExists {
                path: key.to_string(),
                source: "PutObject answered 412 Precondition Failed".into(),
            });
        }
        Err(refusal(key, "PutObject (locked)", status, &answer))
    }

    /// The version ids of exactly `key` (its objects, then its delete markers).
    ///
    /// # Errors
    /// The request failed; the server's pages do not end (more than
    /// [`MAX_VERSION_PAGES`]) or say "truncated" without where to go on.
    pub async fn versions(&self, key: &Path) -> object_store::Result<Vec<String>> {
        let full = format!("{}/{key}", self.root);
        let mut out = Vec::new();
        let mut markers: Option<(String, String)> = None;
        for _ in 0..MAX_VERSION_PAGES {
            self.spent.page().map_err(crate::budget::as_store_error)?;
            let mut query = vec![("versions", ""), ("prefix", full.as_str())];
            if let Some((k, v)) = &markers {
                query.push(("key-marker", k));
                query.push(("version-id-marker", v));
            }
            let mut url = url::Url::parse(&self.bucket_url).map_err(generic)?;
            set_query(&mut url, &query);
            let (status, body) = self
                .send(http::Method::GET, &url, &[], Bytes::new())
                .await?;
            if !status.is_success() {
                return Err(refusal(key, "ListObjectVersions", status, &body));
            }
            let page: VersionsXml = quick_xml::de::from_reader(body.as_ref()).map_err(generic)?;
            // Keys are listed in order: `full` itself comes before any longer key it
            // prefixes, so one of those ends the key's versions.
            let mut past = false;
            for v in page.versions.into_iter().chain(page.delete_markers) {
                if v.key == full {
                    self.spent.key().map_err(crate::budget::as_store_error)?;
                    out.push(v.version_id);
                } else {
                    past = true;
                }
            }
            if past || !page.is_truncated {
                return Ok(out);
            }
            match (page.next_key_marker, page.next_version_id_marker) {
                (Some(k), Some(v)) if markers.as_ref() != Some(&(k.clone(), v.clone())) => {
                    markers = Some((k, v));
                }
                _ => {
                    return Err(generic(format!(
                        "ListObjectVersions of {key} said its answer was cut short but not where to go on; refused rather than leave versions behind"
                    )));
                }
            }
        }
        Err(generic(format!(
            "{key} has more than {} pages of versions; refused",
            MAX_VERSION_PAGES
        )))
    }

    /// Locks `key` until at least `retention.until`: the date it has is kept when later,
    /// and a compliance lock stays compliance (S3 refuses to shorten a lock or weaken its
    /// mode, e.g. where the bucket's default retention already locked the object longer).
    /// Returns whether a request changed the lock.
    ///
    /// # Errors
    /// The object is missing, the bucket has no object lock, or the server refused.
    pub async fn lock_at_least(
        &self,
        key: &Path,
        retention: &Retention,
    ) -> object_store::Result<bool> {
        let current = self.retention(key).await?;
        if current.is_some_and(|c| c.until >= whole_second(retention.until)) {
            return Ok(false);
        }
        let mode = match current.map(|c| c.mode) {
            Some(LockMode::Compliance) => LockMode::Compliance,
            _ => retention.mode,
        };
        self.put_retention(
            key,
            &Retention {
                mode,
                until: retention.until,
            },
        )
        .await?;
        Ok(true)
    }

    /// Whether the bucket has S3 Object Lock enabled (`GetObjectLockConfiguration`).
    ///
    /// # Errors
    /// The request failed (other than "no configuration").
    pub async fn lock_enabled(&self) -> object_store::Result<bool> {
        let mut url = url::Url::parse(&self.bucket_url).map_err(generic)?;
        set_query(&mut url, &[("object-lock", "")]);
        let (status, body) = self
            .send(http::Method::GET, &url, &[], Bytes::new())
            .await?;
        if status == http::StatusCode::NOT_FOUND {
            return Ok(false);
        }
        if !status.is_success() {
            return Err(refusal(
                &Path::default(),
                "GetObjectLockConfiguration",
                status,
                &body,
            ));
        }
        let c: LockConfigurationXml = quick_xml::de::from_reader(body.as_ref()).map_err(generic)?;
        Ok(c.object_lock_enabled.as_deref() == Some("Enabled"))
    }

    /// Deletes one version of `key`. A version already gone is success; a locked one is
    /// refused by the server (403), which is what object lock is for.
    ///
    /// # Guarantees
    /// One version of `key`, no other; a locked version is refused by the server.
    ///
    /// # Errors
    /// The server refused (locked) or the request failed.
    pub async fn delete_version(&self, key: &Path, version: &str) -> object_store::Result<()> {
        let url = self.object_url(key, &[("versionId", version)])?;
        let (status, body) = self
            .send(http::Method::DELETE, &url, &[], Bytes::new())
            .await?;
        if status.is_success() || status == http::StatusCode::NOT_FOUND {
            return Ok(());
        }
        Err(refusal(key, "DeleteObject (version)", status, &body))
    }

    /// Deletes every version of `key` (its data and its delete markers), so nothing of it
    /// stays billed in a versioned bucket. Returns how many versions went.
    ///
    /// # Guarantees
    /// Only the versions and delete markers of `key` itself (its exact key, not a prefix).
    ///
    /// # Errors
    /// A version is still locked (the server refuses), or a request failed; the versions
    /// deleted before stay deleted.
    pub async fn delete_all_versions(&self, key: &Path) -> object_store::Result<usize> {
        let versions = self.versions(key).await?;
        for v in &versions {
            if let Err(e) = self.delete_version(key, v).await {
                // Say until when, where the server says why: a lock is a state, not a fault.
                return Err(match self.retention(key).await {
                    Ok(Some(r)) if e.to_string().contains("AccessDenied") => generic(format!(
                        "{e}: locked ({}) until {}; kept, and deleted by a pass after that",
                        r.mode, r.until
                    )),
                    _ => e,
                });
            }
        }
        Ok(versions.len())
    }
}

impl crate::open::ClusterStore {
    fn native_or_unsupported(&self) -> Result<&S3Native, crate::error::StoreError> {
        self.s3()
            .ok_or_else(|| crate::error::StoreError::ObjectLockUnsupported {
                url: self.url.clone(),
            })
    }

    /// The retention of `key` (relative to the cluster) as the server holds it.
    ///
    /// # Errors
    /// Not an S3 store; the request failed.
    pub async fn retention(
        &self,
        key: &Path,
    ) -> Result<Option<Retention>, crate::error::StoreError> {
        self.native_or_unsupported()?
            .retention(key)
            .await
            .map_err(|source| crate::open::request(self, "reading the lock of", key, source))
    }

    /// Locks `key` (relative to the cluster) until at least `retention.until`, keeping a
    /// later date or a compliance mode it has. Returns whether a request changed the lock.
    ///
    /// # Errors
    /// Not an S3 store; the object is missing; the server refused.
    pub async fn lock_at_least(
        &self,
        key: &Path,
        retention: &Retention,
    ) -> Result<bool, crate::error::StoreError> {
        self.native_or_unsupported()?
            .lock_at_least(key, retention)
            .await
            .map_err(|source| crate::open::request(self, "locking", key, source))
    }

    /// The bucket's lifecycle rules (empty: none).
    ///
    /// # Errors
    /// Not an S3 store; the request failed or was refused.
    pub async fn lifecycle(&self) -> Result<Vec<crate::lifecycle::Rule>, crate::error::StoreError> {
        self.native_or_unsupported()?
            .lifecycle()
            .await
            .map_err(|source| {
                crate::open::request(
                    self,
                    "reading the lifecycle rules of",
                    &Path::default(),
                    source,
                )
            })
    }

    /// Replaces the bucket's lifecycle configuration with `xml`.
    ///
    /// # Errors
    /// Not an S3 store; the server refused.
    pub async fn put_lifecycle(&self, xml: &str) -> Result<(), crate::error::StoreError> {
        self.native_or_unsupported()?
            .put_lifecycle(xml)
            .await
            .map_err(|source| {
                crate::open::request(
                    self,
                    "setting the lifecycle rules of",
                    &Path::default(),
                    source,
                )
            })
    }

    /// The cluster's prefix in its bucket (what a lifecycle rule's prefix is matched
    /// against); `None` when the store is not S3.
    pub fn bucket_prefix(&self) -> Option<String> {
        self.s3().map(|s| s.root.as_ref().to_owned())
    }

    /// The version ids of `key` (objects and delete markers).
    ///
    /// # Errors
    /// Not an S3 store; the request failed.
    pub async fn versions(&self, key: &Path) -> Result<Vec<String>, crate::error::StoreError> {
        self.native_or_unsupported()?
            .versions(key)
            .await
            .map_err(|source| crate::open::request(self, "listing the versions of", key, source))
    }

    /// Deletes one version of `key` (what someone holding the store's credentials could
    /// try; the server refuses a locked version).
    ///
    /// # Guarantees
    /// One version of `key` in this cluster's prefix; the server refuses a locked one.
    ///
    /// # Errors
    /// Not an S3 store; the server refused; the request failed.
    pub async fn delete_version(
        &self,
        key: &Path,
        version: &str,
    ) -> Result<(), crate::error::StoreError> {
        self.native_or_unsupported()?
            .delete_version(key, version)
            .await
            .map_err(|source| crate::open::request(self, "deleting a version of", key, source))
    }
}

/// Replaces `url`'s query with `pairs` (an empty value is a bare key, `?retention`).
fn set_query(url: &mut url::Url, pairs: &[(&str, &str)]) {
    if pairs.is_empty() {
        url.set_query(None);
        return;
    }
    // Encoded strictly, as object_store encodes queries (a space as `%20`, not `+`): AWS
    // signs the query bytes as sent, and object_store's signer signs them strictly.
    let query: Vec<String> = pairs
        .iter()
        .map(|(k, v)| {
            if v.is_empty() && matches!(*k, "retention" | "versions" | "object-lock") {
                strict(k)
            } else {
                format!("{}={}", strict(k), strict(v))
            }
        })
        .collect();
    url.set_query(Some(&query.join("&")));
}

/// `s` percent-encoded but for `A-Z a-z 0-9 - . _ ~` (object_store's strict set).
fn strict(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The `<Code>` of an S3 error answer, or "".
fn error_code(body: &[u8]) -> String {
    quick_xml::de::from_reader::<_, ErrorXml>(body)
        .ok()
        .and_then(|e| e.code)
        .unwrap_or_default()
}

/// A refused request as an error naming the key, the operation and the server's code.
fn refusal(
    key: &Path,
    operation: &str,
    status: http::StatusCode,
    body: &[u8],
) -> object_store::Error {
    let code = error_code(body);
    let message: String = if code.is_empty() {
        String::from_utf8_lossy(body).chars().take(300).collect()
    } else {
        code
    };
    if status == http::StatusCode::NOT_FOUND && message.contains("NoSuchKey") {
        return object_store::Error::NotFound {
            path: key.to_string(),
            source: format!("{operation} answered {status}").into(),
        };
    }
    generic(format!(
        "{operation} on {key} answered {status}: {}",
        message.trim()
    ))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RetentionXml {
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    retain_until_date: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct LockConfigurationXml {
    #[serde(default)]
    object_lock_enabled: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ErrorXml {
    #[serde(default)]
    code: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct VersionsXml {
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_key_marker: Option<String>,
    #[serde(default)]
    next_version_id_marker: Option<String>,
    #[serde(default, rename = "Version")]
    versions: Vec<VersionXml>,
    #[serde(default, rename = "DeleteMarker")]
    delete_markers: Vec<VersionXml>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct VersionXml {
    key: String,
    version_id: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn interleaved_versions_and_markers_parse() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListVersionsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>b</Name><Prefix>p/c/n/i/metadata.json</Prefix><IsTruncated>true</IsTruncated>
  <NextKeyMarker>p/c/n/i/metadata.json</NextKeyMarker><NextVersionIdMarker>v3</NextVersionIdMarker>
  <Version><Key>p/c/n/i/metadata.json</Key><VersionId>v1</VersionId><IsLatest>false</IsLatest></Version>
  <DeleteMarker><Key>p/c/n/i/metadata.json</Key><VersionId>v2</VersionId><IsLatest>true</IsLatest></DeleteMarker>
  <Version><Key>p/c/n/i/metadata.json.x</Key><VersionId>v3</VersionId></Version>
</ListVersionsResult>"#;
        let r: VersionsXml = quick_xml::de::from_reader(xml.as_bytes()).unwrap();
        assert!(r.is_truncated);
        assert_eq!(r.versions.len(), 2);
        assert_eq!(r.delete_markers.len(), 1);
        assert_eq!(r.delete_markers[0].version_id, "v2");
        assert_eq!(r.next_version_id_marker.as_deref(), Some("v3"));
    }

    /// Path segments are encoded strictly, as object_store encodes S3 paths; the bucket's
    /// own path (path style) is kept.
    #[test]
    fn object_urls_encode_segments_as_object_store_does() {
        let root = Path::from("team+a:b=c@d,e;f/db 1");
        let key = Path::from("nightly/20261125T020000Z-0000002a/backup.xbstream");
        let url = object_url(
            "http://127.0.0.1:8333/bucket",
            &root,
            &key,
            &[("retention", "")],
        )
        .unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:8333/bucket/team%2Ba%3Ab%3Dc%40d%2Ce%3Bf/db%201/nightly/20261125T020000Z-0000002a/backup.xbstream?retention"
        );
        let url = object_url("https://b.s3.example", &root, &key, &[]).unwrap();
        assert!(
            url.as_str().starts_with("https://b.s3.example/team%2Ba"),
            "{url}"
        );
        // Queries too: a prefix with a space is `%20`, never `+`.
        let mut url = url::Url::parse("http://127.0.0.1:8333/bucket").unwrap();
        set_query(&mut url, &[("versions", ""), ("prefix", "team+a/db 1/n*")]);
        assert_eq!(
            url.query(),
            Some("versions&prefix=team%2Ba%2Fdb%201%2Fn%2A")
        );
    }

    #[test]
    fn dates_and_codes() {
        let t: Timestamp = "2026-11-25T10:00:00.2Z".parse().unwrap();
        assert_eq!(s3_date(t), "2026-11-25T10:00:01Z");
        let t: Timestamp = "2026-11-25T10:00:00Z".parse().unwrap();
        assert_eq!(s3_date(t), "2026-11-25T10:00:00Z");
        let e = r#"<Error><Code>AccessDenied</Code><Message>x</Message></Error>"#;
        assert_eq!(error_code(e.as_bytes()), "AccessDenied");
    }
}
