//! Incomplete multipart uploads on S3: a push or archiver killed mid-upload leaves its
//! parts behind, invisible to listings and billed all the same. object_store can abort an
//! upload whose id it knows but cannot list them, so this lists them with a signed
//! `ListMultipartUploads` request (object_store's own SigV4 signer and credentials), under
//! the cluster's prefix only.
//!
//! Hand-written on purpose: object_store has no call for these listings (nor for
//! versioned deletes and object-lock headers), and a second S3 client would bring its own
//! credentials chain and retry policy beside object_store's; signing with object_store's
//! own signer keeps one set of credentials, one TLS setup and one endpoint check.

use std::sync::Arc;

use jiff::Timestamp;
use object_store::aws::AmazonS3;
use object_store::client::{ClientOptions, HttpClient, HttpConnector, ReqwestConnector};
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use serde::Deserialize;

/// Uploads asked for per request (the S3 maximum).
const PAGE: usize = 1000;

/// One incomplete multipart upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncompleteUpload {
    /// Key relative to the cluster prefix.
    pub key: String,
    pub upload_id: String,
    pub initiated: Timestamp,
}

/// How to reach the bucket for what object_store does not do.
#[derive(Debug)]
pub struct S3Native {
    pub(crate) s3: Arc<AmazonS3>,
    /// `https://host[:port]/bucket` (path style) or `https://bucket.host[:port]`.
    pub(crate) bucket_url: String,
    pub(crate) region: String,
    /// The cluster's prefix inside the bucket, `<path>/<cluster>`.
    pub(crate) root: Path,
    pub(crate) http: HttpClient,
    /// The pass's budget: the pages and keys of these listings count too.
    pub(crate) spent: Arc<crate::budget::Spent>,
}

impl S3Native {
    pub(crate) fn new(
        s3: Arc<AmazonS3>,
        bucket_url: String,
        region: String,
        root: Path,
        client: &ClientOptions,
        spent: Arc<crate::budget::Spent>,
    ) -> object_store::Result<Self> {
        let http = ReqwestConnector::default().connect(client)?;
        Ok(S3Native {
            s3,
            bucket_url,
            region,
            root,
            http,
            spent,
        })
    }

    /// Every incomplete upload under the cluster's prefix.
    ///
    /// # Errors
    /// The request failed or its answer could not be read.
    pub async fn list_incomplete(&self) -> object_store::Result<Vec<IncompleteUpload>> {
        let prefix = format!("{}/", self.root);
        let mut out = Vec::new();
        let mut markers: Option<(String, String)> = None;
        loop {
            self.spent.page().map_err(crate::budget::as_store_error)?;
            let mut url = url::Url::parse(&self.bucket_url).map_err(generic)?;
            {
                let mut q = url.query_pairs_mut();
                q.append_key_only("uploads");
                q.append_pair("max-uploads", &PAGE.to_string());
                q.append_pair("prefix", &prefix);
                if let Some((key, id)) = &markers {
                    q.append_pair("key-marker", key);
                    q.append_pair("upload-id-marker", id);
                }
            }
            let (status, body) = self
                .send(http::Method::GET, &url, &[], bytes::Bytes::new())
                .await?;
            if !status.is_success() {
                let text: String = String::from_utf8_lossy(&body).chars().take(300).collect();
                return Err(generic(format!(
                    "ListMultipartUploads answered {status}: {}",
                    text.trim()
                )));
            }
            let page: ListResult = quick_xml::de::from_reader(body.as_ref()).map_err(generic)?;
            for u in page.uploads {
                self.spent.key().map_err(crate::budget::as_store_error)?;
                let Some(key) = u.key.strip_prefix(&prefix) else {
                    continue;
                };
                out.push(IncompleteUpload {
                    key: key.to_owned(),
                    upload_id: u.upload_id,
                    initiated: u.initiated.parse().unwrap_or(Timestamp::UNIX_EPOCH),
                });
            }
            match (
                page.is_truncated,
                page.next_key_marker,
                page.next_upload_id_marker,
            ) {
                (true, Some(k), Some(id)) if markers.as_ref() != Some(&(k.clone(), id.clone())) => {
                    markers = Some((k, id));
                }
                _ => break,
            }
        }
        Ok(out)
    }

    /// Aborts one upload (its parts are freed). An upload already gone is success.
    ///
    /// # Guarantees
    /// Only the upload `upload_id` of `key`: committed objects are never touched.
    ///
    /// # Errors
    /// The request failed.
    pub async fn abort(&self, key: &str, upload_id: &str) -> object_store::Result<()> {
        let path = Path::from(format!("{}/{key}", self.root));
        match self.s3.abort_multipart(&path, &upload_id.to_owned()).await {
            Err(e) if crate::error::is_not_found(&e) => Ok(()),
            other => other,
        }
    }
}

/// A response body of at most `limit` bytes: an endpoint that sends more is refused before
/// it fills memory.
pub(crate) async fn capped(
    body: object_store::client::HttpResponseBody,
    limit: u64,
) -> object_store::Result<bytes::Bytes> {
    use futures::StreamExt;
    let mut out = bytes::BytesMut::new();
    let mut stream = body.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(generic)?;
        if (out.len() + chunk.len()) as u64 > limit {
            return Err(generic(format!(
                "the answer is larger than {limit} bytes; refused"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

pub(crate) fn generic(e: impl std::fmt::Display) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: e.to_string().into(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListResult {
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_key_marker: Option<String>,
    #[serde(default)]
    next_upload_id_marker: Option<String>,
    #[serde(default, rename = "Upload")]
    uploads: Vec<Upload>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Upload {
    key: String,
    upload_id: String,
    initiated: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_answer_parses() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>b</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>
  <NextKeyMarker>p/c/n/x</NextKeyMarker><NextUploadIdMarker>2</NextUploadIdMarker>
  <MaxUploads>1000</MaxUploads><IsTruncated>true</IsTruncated>
  <Upload><Key>p/c/n/20261120T020000Z-00000001/backup.bin</Key><UploadId>1</UploadId>
    <Initiated>2026-11-20T02:00:00.000Z</Initiated><StorageClass>STANDARD</StorageClass></Upload>
  <Upload><Key>p/c/binlogs/mysql-bin.000001</Key><UploadId>2</UploadId>
    <Initiated>2026-11-20T03:00:00Z</Initiated></Upload>
</ListMultipartUploadsResult>"#;
        let r: ListResult = quick_xml::de::from_reader(xml.as_bytes()).unwrap();
        assert!(r.is_truncated);
        assert_eq!(r.uploads.len(), 2);
        assert_eq!(r.uploads[1].upload_id, "2");
        assert_eq!(r.next_key_marker.as_deref(), Some("p/c/n/x"));
        let empty = r#"<ListMultipartUploadsResult><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>"#;
        let r: ListResult = quick_xml::de::from_reader(empty.as_bytes()).unwrap();
        assert!(r.uploads.is_empty());
    }
}
