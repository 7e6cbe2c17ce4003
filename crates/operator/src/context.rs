//! What every reconcile shares: the clients, caches, limits and per-object bookkeeping
//! (backoff, hook turns), and how events are published.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use tidemark_api::crd::{Backup, BackupPolicy};
use tidemark_engine::Clock;

use crate::events::{NOTE_LIMIT, fit};
use crate::{background, events, metrics, rbac, streams};

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub recorder: events::Recorder,
    pub clock: Arc<dyn Clock>,
    /// Every Backup, as the watch last saw it (name collisions, children).
    pub backups: Store<Backup>,
    /// Every BackupPolicy, as the watch last saw it (a finished Backup's finalizer).
    pub policies: Store<BackupPolicy>,
    pub store_retry_timeout: Duration,
    pub image: String,
    pub metrics: Arc<metrics::Metrics>,
    /// The `exec` backups this process streams.
    pub streams: streams::Streams,
    /// [`crate::Options::allow_ambient_credentials`].
    pub allow_ambient_credentials: bool,
    /// This replica's name in the election (and in the store leases it takes).
    pub identity: String,
    /// [`crate::Options::exec_limits`], and the slots of the streams that run.
    pub exec_limits: streams::Limits,
    pub exec_slots: Arc<tokio::sync::Semaphore>,
    /// Retention passes running outside the reconcile slots.
    pub background: background::Background,
    /// What one pass may read from a store.
    pub pass_budget: tidemark_store::budget::Budget,
    /// [`crate::Options::store_lease`].
    pub store_lease: tidemark_engine::FenceOptions,
    /// A catalog loaded outside the background passes (a restore test's scratch size, an
    /// incremental's parent) takes this turn, one at a time: the operator's memory holds
    /// at most `--background-passes` + 1 catalogs (issue 28).
    pub catalog_turn: tokio::sync::Semaphore,
    /// The store directories this process has claimed for a policy (`<store> <uid>`): the
    /// owner record is read once, not on every reconcile that opens the store.
    pub owned: Mutex<std::collections::HashSet<String>>,
    /// [`crate::Options::capabilities`].
    pub capabilities: rbac::Capabilities,
    /// [`crate::Options::tenancy`].
    pub tenancy: crate::tenancy::Tenancy,
    /// Whose turn it is to run a Backup's DeleteHooks (by the Backup's uid).
    pub(crate) hook_turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Consecutive failures per object, for exponential backoff.
    pub(crate) failures: Mutex<HashMap<String, u32>>,
    /// When each policy's binlog archiver was last looked after while a retention pass ran
    /// ([`Context::archiver_due`]).
    pub(crate) archiver_seen: Mutex<HashMap<String, std::time::Instant>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    pub(crate) fn failed(&self, key: String) -> u32 {
        let mut f = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = f.entry(key).or_insert(0);
        *n += 1;
        *n
    }

    /// The lock whose holder runs the DeleteHooks of the Backup `uid` (see
    /// [`hooks::run`]). Locks nobody holds or waits for are forgotten.
    pub(crate) fn hook_turn(&self, uid: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self
            .hook_turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        turns.retain(|_, l| Arc::strong_count(l) > 1);
        turns.entry(uid.to_owned()).or_default().clone()
    }

    /// Counts a finished reconcile of the object `key` (`Kind/namespace/name`).
    pub(crate) fn reconciled(&self, key: &str) {
        let controller = key.split('/').next().unwrap_or_default().to_owned();
        self.metrics
            .reconciles
            .get_or_create(&metrics::ControllerLabels { controller })
            .inc();
    }

    /// How many times in a row the object `key` failed so far (its next failure is the
    /// `failures_of + 1`-th, which the controllers' error policy then counts).
    pub(crate) fn failures_of(&self, key: &str) -> u32 {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Whether the binlog archiver of policy `key` is to be looked after now, while its
    /// retention pass runs: at most once every `every` (it asks the primary pod its server
    /// id). What is older than four times `every` is forgotten: the map holds the policies
    /// whose pass runs now.
    pub(crate) fn archiver_due(&self, key: &str, every: Duration) -> bool {
        let mut seen = self
            .archiver_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        seen.retain(|k, at| now.duration_since(*at) < every * 4 || k == key);
        match seen.get(key) {
            Some(at) if now.duration_since(*at) < every => false,
            _ => {
                seen.insert(key.to_owned(), now);
                true
            }
        }
    }

    pub(crate) fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }
}

/// A controller owner reference to `owner`, without `blockOwnerDeletion`: setting that needs
/// `update` on the owner's finalizers (enforced by OwnerReferencesPermissionEnforcement), a
/// right the operator does not otherwise need.
pub fn owner_ref<K: Resource<DynamicType = ()>>(
    owner: &K,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    owner.controller_owner_ref(&()).map(|mut r| {
        r.block_owner_deletion = None;
        r
    })
}

/// Adds or removes `finalizer` on `object` so that it matches `want`: a patch that names
/// the resourceVersion it read, so a concurrent change is not lost (409: retried).
///
/// # Errors
/// The API refused.
pub async fn set_finalizer<K>(
    api: &kube::Api<K>,
    object: &K,
    finalizer: &str,
    want: bool,
) -> Result<(), crate::error::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if object.finalizers().iter().any(|f| f == finalizer) == want {
        return Ok(());
    }
    let mut finalizers: Vec<String> = object
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    if want {
        finalizers.push(finalizer.to_owned());
    }
    api.patch(
        &object.name_any(),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": object.resource_version(),
        }})),
    )
    .await?;
    Ok(())
}

/// Whether `owner` is among the owners of the object `meta` describes (by uid).
pub fn owns<K: Resource>(owner: &K, meta: &kube::api::ObjectMeta) -> bool {
    let uid = owner.meta().uid.as_deref();
    uid.is_some()
        && meta
            .owner_references
            .iter()
            .flatten()
            .any(|o| Some(o.uid.as_str()) == uid)
}

/// The per-object key of the backoff table.
pub fn key<K: Resource>(o: &K) -> String
where
    K::DynamicType: Default,
{
    format!(
        "{}/{}/{}",
        K::kind(&Default::default()),
        o.namespace().unwrap_or_default(),
        o.name_any()
    )
}

impl Context {
    /// Publishes a Warning event on `reference` (failures to publish are logged, never
    /// fatal).
    pub(crate) async fn warn(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        reason: &str,
        note: &str,
    ) {
        self.event(reference, EventType::Warning, reason, note)
            .await;
    }

    /// Publishes a Warning event `AmbiguousDuration` on `reference` for each duration
    /// written with seed 000's ambiguous `<n>m` (months, where intervals read minutes), naming both
    /// readings and the unambiguous spellings. Repeats fold into one series.
    pub(crate) async fn warn_ambiguous(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        found: &[tidemark_core::AmbiguousDuration],
    ) {
        for a in found {
            tracing::warn!("{a}");
            self.warn(reference, "AmbiguousDuration", &a.to_string())
                .await;
        }
    }

    pub(crate) async fn event(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let ev = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(fit(note, NOTE_LIMIT)),
            action: reason.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, reference).await {
            tracing::warn!(%reason, "could not publish event: {e}");
        }
    }
}
