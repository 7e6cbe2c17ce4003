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

/// The most bytes of a Tidemark object's labels and annotations (keys and values) kept.
pub const MAX_KEPT_LABELS: usize = 16 << 10;

/// The annotation a kept object gets when its labels and annotations were cut to
/// Tidemark's own (`tidemark.io/…`): their size in bytes. A Backup so marked is not
/// started (its labels go into the store, where DeleteHooks select by them); hooks of
/// one already made read the object itself.
pub const TRIMMED: &str = "tidemark.io/trimmed-labels";

/// [`meta`], and labels and annotations past [`MAX_KEPT_LABELS`] cut to Tidemark's own
/// with [`TRIMMED`] (a tenant's object may carry 1.4 MiB of them, in every cache).
pub fn tidemark_meta(m: &mut ObjectMeta) {
    meta(m);
    let size: usize = m
        .labels
        .iter()
        .chain(m.annotations.iter())
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if size <= MAX_KEPT_LABELS {
        return;
    }
    for map in [m.labels.as_mut(), m.annotations.as_mut()]
        .into_iter()
        .flatten()
    {
        map.retain(|k, _| k.starts_with("tidemark.io/"));
    }
    m.annotations
        .get_or_insert_with(Default::default)
        .insert(TRIMMED.to_owned(), size.to_string());
}

/// [`tidemark_meta`] of a Tidemark kind.
pub fn tidemark_meta_of<K: Resource>(k: &mut K) {
    tidemark_meta(k.meta_mut());
}

/// What is kept of a Backup: [`tidemark_meta`], and no `jobTemplate`.
pub fn backup(b: &mut Backup) {
    tidemark_meta(&mut b.metadata);
    b.spec.template.job_template = None;
}

/// What is kept of a ScheduledBackup: [`tidemark_meta`], and no `jobTemplate`.
pub fn schedule(s: &mut ScheduledBackup) {
    tidemark_meta(&mut s.metadata);
    s.spec.template.job_template = None;
}

/// What is kept of a DeleteHook: [`tidemark_meta`] and no spec (its controller reads the
/// hook whole, one at a time; a tenant's hooks hold up to a job template, a CA bundle and
/// a command each).
pub fn delete_hook(h: &mut tidemark_api::crd::DeleteHook) {
    tidemark_meta(&mut h.metadata);
    h.spec = tidemark_api::crd::DeleteHookSpec {
        selector: Default::default(),
        job: None,
        webhook: None,
        command: None,
        timeout: None,
    };
    h.status = None;
}

/// Whether `b`'s labels were cut in the cache ([`TRIMMED`]), and their size.
pub fn trimmed(b: &Backup) -> Option<&str> {
    b.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TRIMMED))
        .map(String::as_str)
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
        assert!(trimmed(&b).is_none());
        // Labels past the bound: Tidemark's own kept, the object marked.
        let mut b: Backup = serde_json::from_value(serde_json::json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": "b", "namespace": "t",
                "labels": (0..2000).map(|i| (format!("k{i}"), "v".repeat(60))).chain([("tidemark.io/scheduled-backup".to_owned(), "s".to_owned())]).collect::<std::collections::BTreeMap<_, _>>()},
            "spec": {"policy": {"name": "p"}},
        }))
        .unwrap();
        backup(&mut b);
        assert_eq!(b.labels().len(), 1, "{:?}", b.labels());
        assert!(trimmed(&b).is_some_and(|s| s.parse::<usize>().unwrap() > MAX_KEPT_LABELS));
    }
}
