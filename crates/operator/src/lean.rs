//! What the operator holds of the objects it reads (issue 28 finding 6): a tenant's object
//! may be as large as the API server allows (1.5 MiB), so its caches keep only what a
//! reconcile needs, and every list is read a bounded page at a time.
//!
//! - Watches list [`LIST_PAGE`] objects a page (kube's default, 500, is 750 MiB of such
//!   objects held at once at every start, for each watch of the kind).
//! - Caches drop `managedFields` and the copy of the whole object `kubectl apply` leaves
//!   in an annotation ([`meta`]), and a Backup's or ScheduledBackup's `jobTemplate`
//!   ([`backup`], [`schedule`]): a method-`job` Backup reads its object when it starts,
//!   a schedule when it makes a Backup.
//! - Lists a reconcile makes go through [`list`]: paged, each object made lean as its page
//!   arrives.
//!
//! The operator never writes an object back from what it holds: its writes are patches of
//! the fields it owns, so a dropped field is never dropped from the object.

use kube::Resource;
use kube::api::{Api, ListParams, ObjectMeta};
use kube::runtime::watcher;
use tidemark_api::crd::{Backup, ScheduledBackup};

/// Objects per page of a list: each page is held whole while it is read, and parsed (an
/// object may be 1.5 MiB: a page of 10 such is 15 MB read, about as much parsed; with 50,
/// 200 Backups of a 1.4 MiB template took the operator to 298 MiB at start).
pub const LIST_PAGE: u32 = 10;

/// How every watch of the operator lists: [`LIST_PAGE`] objects a page.
pub fn listed() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE)
}

/// The annotation `kubectl apply` fills with the whole object as applied.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What is kept of an object's metadata: not its `managedFields`, nor [`LAST_APPLIED`].
pub fn meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

/// [`meta`] of an object of any kind.
pub fn meta_of<K: Resource>(k: &mut K) {
    meta(k.meta_mut());
}

/// What is kept of a Backup: [`meta`], and no `jobTemplate`.
pub fn backup(b: &mut Backup) {
    meta(&mut b.metadata);
    b.spec.template.job_template = None;
}

/// What is kept of a ScheduledBackup: [`meta`], and no `jobTemplate`.
pub fn schedule(s: &mut ScheduledBackup) {
    meta(&mut s.metadata);
    s.spec.template.job_template = None;
}

/// Every object `params` selects, read [`LIST_PAGE`] at a time, each made lean (`lean`)
/// as its page arrives.
///
/// # Errors
/// The API failed (a page's continue token expired included: the caller retries).
pub async fn list<K>(
    api: &Api<K>,
    params: &ListParams,
    lean: fn(&mut K),
) -> Result<Vec<K>, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut all = Vec::new();
    let mut params = params.clone().limit(LIST_PAGE);
    loop {
        let page = api.list(&params).await?;
        all.extend(page.items.into_iter().map(|mut k| {
            lean(&mut k);
            k
        }));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(all),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

    /// A cached Backup holds neither its template nor the copies of itself its metadata
    /// can carry; what a reconcile reads stays.
    #[test]
    fn a_cached_backup_is_lean() {
        let mut b: Backup = serde_json::from_value(serde_json::json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {
                "name": "b", "namespace": "t",
                "annotations": {LAST_APPLIED: "x".repeat(1 << 20), "tidemark.io/protect": "true"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {"policy": {"name": "p"}, "method": "job",
                     "jobTemplate": {"spec": {"containers": [{"name": "c", "image": "x".repeat(1 << 20)}]}}},
        }))
        .unwrap();
        backup(&mut b);
        let kept = serde_json::to_vec(&b).unwrap().len();
        assert!(kept < 4096, "{kept} bytes kept");
        assert_eq!(
            b.annotations()
                .get("tidemark.io/protect")
                .map(String::as_str),
            Some("true")
        );
        assert_eq!(b.spec.template.method.as_deref(), Some("job"));
    }
}
