//! Tidemark's Kubernetes operator: kube-runtime controllers over the engine (DESIGN.md §2,
//! §6, §7).
//!
//! - [`scheduled`]: ScheduledBackup → Backups on a cron cadence (seed 001), through the
//!   engine's schedule tick with the status in the resource;
//! - [`backup`]: Backup → a Job on the database pod's node that streams the backup to the
//!   store, followed to completed or failed by what the store holds; for method `exec`
//!   ([`backup::exec`]), the command runs in the database container through `pods/exec` and this
//!   process streams its stdout;
//! - [`retention`]: BackupPolicy → the engine's retention pass, throttled, its outcome in
//!   status and events;
//! - [`archiver`]: one binlog archiver Deployment per BackupPolicy with
//!   `binlogArchive.server` (binlogs read over the network);
//! - [`leader`]: leader election with a Lease, so one replica runs the controllers.
//!
//! [`run`] elects, then runs every controller until shutdown or until leadership is lost.
//!
//! What the controllers share lives in modules of its own, which never reach back into a
//! controller: [`context`] (clients, caches, backoff, events), [`status`] (every status
//! write, one field manager per writer), [`stores`] (a policy's store from its Secret),
//! [`names`] (labels and derived names), [`holds`], [`pod`] (the parts of every pod). No
//! two modules reach each other, directly or around a circle, and nothing uses an item of
//! this root: `tests/layout.rs` reads the sources and checks both.

pub mod archiver;
pub mod archivewatch;
pub mod background;
pub mod backup;
pub mod cleanup;
pub mod consolidation;
pub mod context;
pub mod copies;
pub mod database;
pub mod error;
pub mod events;
pub mod fence;
pub mod history;
pub mod holds;
pub mod hooks;
pub mod leader;
pub mod lean;
pub mod metrics;
pub mod names;
pub mod pod;
pub mod policy;
pub mod rbac;
pub mod restore;
pub mod restoretest;
pub mod scheduled;
pub mod status;
pub mod stores;
pub mod streams;
pub mod tenancy;
#[cfg(feature = "test-support")]
pub mod testkit;
pub mod verification;
pub mod volumes;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tidemark_api::crd::{Backup, BackupPolicy, ScheduledBackup};
use tidemark_engine::Clock;

pub use context::Context;
pub use error::Error;

use crate::context::key;
use crate::status::FIELD_MANAGER;

/// How the operator runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Leader election.
    pub election: leader::Election,
    /// How long one store request may keep retrying transient errors before the pass
    /// fails (and the policy is requeued with backoff).
    pub store_retry_timeout: Duration,
    /// The operator's image (it holds the static `tidemark` binary at `/tidemark`): the
    /// init container of every backup Job copies it from there.
    pub image: String,
    /// Where the metrics go (serve them with [`metrics::serve`]).
    pub metrics: Arc<metrics::Metrics>,
    /// Whether a policy may reach its store with the operator's own identity (its
    /// environment, IRSA, pod identity). Off by default: every store
    /// needs credentials from a Secret of the policy's namespace.
    pub allow_ambient_credentials: bool,
    /// Exec streams at once and the longest one may run: the operator's memory is about
    /// 60 MiB plus 24 MiB per stream (`streams::EXEC_PART_SIZE`, `streams::EXEC_PARTS_IN_FLIGHT`),
    /// and under 10 MiB more for a compressed one (`streams::EXEC_MAX_ZSTD_LEVEL`).
    pub exec_limits: streams::Limits,
    /// What one pass may read from a store ([`tidemark_store::budget`]).
    pub pass_budget: tidemark_store::budget::Budget,
    /// The TTL of the store leases the operator's deletions hold (`TIDEMARK_LEASE_TTL`).
    pub store_lease: tidemark_engine::FenceOptions,
    /// Retention passes and deletions run in the background at once; more wait their
    /// turn ([`background::Background`]).
    pub background_passes: usize,
    /// The namespaces whose objects the operator serves: empty for every namespace (the
    /// cluster-wide RBAC), else only these (the namespaced RBAC, [`rbac::Install`]).
    pub namespaces: Vec<String>,
    /// What the install lets the operator start; a Backup, policy or hook that needs a
    /// capability turned off is refused with the reason.
    pub capabilities: rbac::Capabilities,
    /// What the administrator lets a tenant's objects ask for (locks, templates).
    pub tenancy: tenancy::Tenancy,
}

/// The image a backup Job's init container takes `tidemark` from, unless told otherwise.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/tidemark/tidemark:", env!("CARGO_PKG_VERSION"));

impl Options {
    /// Defaults: the election as given, store requests retried for up to a minute.
    pub fn new(election: leader::Election) -> Self {
        Options {
            election,
            store_retry_timeout: Duration::from_secs(60),
            image: DEFAULT_IMAGE.to_owned(),
            metrics: Arc::default(),
            allow_ambient_credentials: false,
            exec_limits: streams::Limits::default(),
            background_passes: background::DEFAULT_LIMIT,
            pass_budget: tidemark_store::budget::Budget::SHARED,
            store_lease: tidemark_engine::FenceOptions::default(),
            namespaces: Vec::new(),
            capabilities: rbac::Capabilities::default(),
            tenancy: tenancy::Tenancy::default(),
        }
    }
}

/// Stops the `exec` streams when the controllers stop (shutdown, or the lease lost): a
/// stream must not outlive the leadership it was started under.
struct StopStreams(Arc<Context>);

impl Drop for StopStreams {
    fn drop(&mut self) {
        let n = self.0.streams.len();
        if n > 0 {
            tracing::warn!(
                "stopping {n} exec backup stream(s); the next leader records them as failed"
            );
        }
        self.0.streams.stop_all();
        self.0.background.stop_all();
    }
}

/// Retries a failed reconcile with per-object exponential backoff and jitter; an invalid
/// spec waits for a change.
fn error_policy<K>(obj: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action
where
    K: Resource,
    K::DynamicType: Default,
{
    let failures = ctx.failed(key(obj.as_ref()));
    ctx.metrics
        .reconcile_errors
        .get_or_create(&metrics::ErrorLabels {
            controller: K::kind(&Default::default()).into_owned(),
            class: error.class().as_str().to_owned(),
        })
        .inc();
    tracing::warn!(
        object = %key(obj.as_ref()),
        class = error.class().as_str(),
        failures,
        "reconcile failed: {}",
        tidemark_engine::error::chain(error)
    );
    match error.retry_after(failures) {
        Some(d) => Action::requeue(d),
        None => Action::await_change(),
    }
}

/// Why [`run`] ended.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    #[error("leadership lost: {0}")]
    LeadershipLost(#[from] leader::Lost),
}

/// Elects, then runs the controllers until `shutdown` resolves (`Ok`, the lease released)
/// or leadership is lost (`Err`: the process should exit and be restarted).
///
/// # Errors
/// Leadership was lost.
pub async fn run(
    client: Client,
    options: Options,
    clock: Arc<dyn Clock>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Stopped> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &options.election.namespace);
    let mut shutdown = std::pin::pin!(shutdown);
    // Ready once the API server answers (a candidate waiting for the lease is ready too).
    let readiness = tokio::spawn({
        let metrics = options.metrics.clone();
        let leases = leases.clone();
        let name = options.election.name.clone();
        async move {
            while leases.get_opt(&name).await.is_err() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            metrics
                .ready
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let lease = tokio::select! {
        l = leader::acquire(&leases, &options.election) => l,
        () = &mut shutdown => {
            readiness.abort();
            return Ok(());
        }
    };
    readiness.abort();
    options
        .metrics
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    options.metrics.leader.set(1);
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut controllers = Box::pin(controllers(client.clone(), &options, clock, stopping));
    let hold = leader::hold(&leases, &options.election, lease);
    tokio::pin!(hold);
    tokio::select! {
        lost = &mut hold => {
            options.metrics.leader.set(0);
            tracing::error!("{lost}; stopping the controllers");
            Err(Stopped::LeadershipLost(lost))
        }
        () = &mut controllers => Ok(()),
        () = &mut shutdown => {
            // Let reconciles in flight finish (a backup Job half created is worse than a
            // slower stop) while the lease is still renewed, so no successor acts beside
            // them; then stop what is left, and only then give the lease up.
            let _ = stop.send(true);
            let lost = tokio::select! {
                finished = tokio::time::timeout(SHUTDOWN_GRACE, &mut controllers) => {
                    if finished.is_err() {
                        tracing::warn!("reconciles still running after {SHUTDOWN_GRACE:?}; stopping them");
                    }
                    None
                }
                lost = &mut hold => Some(lost),
            };
            drop(controllers);
            options.metrics.leader.set(0);
            if let Some(lost) = lost {
                tracing::error!("{lost} while stopping");
                return Err(Stopped::LeadershipLost(lost));
            }
            leader::release(&leases, &options.election).await;
            Ok(())
        }
    }
}

/// What a controller can watch: every Tidemark and Kubernetes kind the operator runs on.
trait Watched:
    Resource<DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// Reconciles in flight per controller: enough to keep up, few enough not to flood the API
/// server when thousands of objects are reconciled at start-up.
const CONCURRENT_RECONCILES: u16 = 16;

fn controller_config() -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(CONCURRENT_RECONCILES)
}

/// A controller over `api` with the shared settings: bounded concurrency, and a graceful
/// stop when `stopping` turns true.
fn watched<K>(
    api: Api<K>,
    stopping: &tokio::sync::watch::Receiver<bool>,
    lean: fn(&mut K),
) -> Controller<K>
where
    K: Watched,
{
    let (reader, writer) = reflector::store();
    let trigger = watcher(api, lean::listed())
        .default_backoff()
        .modify(lean)
        .reflect(writer)
        .applied_objects();
    Controller::for_stream(trigger, reader)
        .with_config(controller_config())
        .graceful_shutdown_on(stopped(stopping.clone()))
}

/// Like [`watched`], but reconciling only when the spec (generation), labels or
/// annotations change — not when the controller's own status patch lands, which would
/// retry a failing object at once and defeat its backoff (a failure's message changes
/// from one attempt to the next).
fn watched_changes<K>(api: Api<K>, stopping: &tokio::sync::watch::Receiver<bool>) -> Controller<K>
where
    K: Watched,
{
    use kube::runtime::utils::{Predicate, predicates};
    let (reader, writer) = reflector::store();
    let trigger = watcher(api, lean::listed())
        .default_backoff()
        .modify(lean::tidemark_meta_of::<K>)
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation
                .combine(predicates::annotations)
                .combine(predicates::labels),
            Default::default(),
        );
    Controller::for_stream(trigger, reader)
        .with_config(controller_config())
        .graceful_shutdown_on(stopped(stopping.clone()))
}

/// Runs `controller` with `reconcile`, counting every reconcile and clearing an object's
/// backoff when it succeeds.
async fn drive<K, F, Fut>(controller: Controller<K>, reconcile: F, ctx: Arc<Context>)
where
    K: Watched,
    F: Fn(Arc<K>, Arc<Context>) -> Fut + Send + Sync + Copy + 'static,
    Fut: std::future::Future<Output = Result<Action, Error>> + Send + 'static,
{
    controller
        .run(
            move |obj, ctx| {
                // Every line this reconcile logs names its object (`--log-format json`
                // makes them fields).
                let span = tracing::info_span!(
                    "reconcile",
                    kind = %K::kind(&()),
                    namespace = %obj.namespace().unwrap_or_default(),
                    object = %obj.name_any(),
                );
                tracing::Instrument::instrument(reconcile_one(obj, ctx, reconcile), span)
            },
            error_policy,
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!("controller: {e}");
            }
        })
        .await;
}

/// One reconcile of `obj` (see [`drive`]).
async fn reconcile_one<K, F, Fut>(
    obj: Arc<K>,
    ctx: Arc<Context>,
    reconcile: F,
) -> Result<Action, Error>
where
    K: Watched,
    F: Fn(Arc<K>, Arc<Context>) -> Fut + Send + Sync + Copy + 'static,
    Fut: std::future::Future<Output = Result<Action, Error>> + Send + 'static,
{
    let k = key(obj.as_ref());
    let reference = obj.object_ref(&());
    if !ctx.tenancy.serves(obj.namespace().as_deref()) {
        let note = "the operator's own namespace is not served (its service account reads every Secret there): create Tidemark objects in the namespaces of the databases";
        ctx.warn(&reference, "NotServed", note).await;
        return Ok(Action::await_change());
    }
    let r = match caught(reconcile(obj, ctx.clone())).await {
        Ok(r) => r,
        Err(panic) => {
            // A bug must fail its object, never the process: kube-runtime
            // would re-raise the panic, and the restarted process would meet
            // the same object again.
            tracing::error!(object = %k, "reconcile panicked: {panic}");
            let note = format!("reconcile panicked (a bug; please report it): {panic}");
            ctx.warn(&reference, "ReconcilePanicked", &note).await;
            Err(Error::Internal(panic))
        }
    };
    ctx.reconciled(&k);
    // Work started or still running in the background has not succeeded yet:
    // its outcome, collected later, decides (and a failure's backoff grows).
    if r.is_ok() && !ctx.background.tracks(&k) {
        ctx.succeeded(&k);
    }
    r
}

/// Runs `fut`, turning a panic inside it into `Err` with the panic's message.
async fn caught<T>(fut: impl std::future::Future<Output = T>) -> Result<T, String> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(fut)
        .catch_unwind()
        .await
        .map_err(|payload| {
            payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned())
        })
}

/// How long reconciles in flight may take to finish at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Resolves once `stopping` turns true.
async fn stopped(mut stopping: tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}

/// Every controller, as one future that runs until they all end: one set over every
/// namespace, or one per namespace the install serves ([`Options::namespaces`]), sharing
/// the exec stream slots.
async fn controllers(
    client: Client,
    options: &Options,
    clock: Arc<dyn Clock>,
    stopping: tokio::sync::watch::Receiver<bool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(
        options.exec_limits.streams.max(1),
    ));
    let scopes: Vec<Option<&str>> = if options.namespaces.is_empty() {
        vec![None]
    } else {
        options
            .namespaces
            .iter()
            .map(|n| Some(n.as_str()))
            .collect()
    };
    futures::future::join_all(scopes.into_iter().map(|namespace| {
        scope(
            client.clone(),
            options,
            clock.clone(),
            stopping.clone(),
            namespace,
            slots.clone(),
        )
    }))
    .await;
}

/// The objects of `namespace`, or of every namespace.
fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The controllers over `namespace` (`None`: every namespace).
async fn scope(
    client: Client,
    options: &Options,
    clock: Arc<dyn Clock>,
    stopping: tokio::sync::watch::Receiver<bool>,
    namespace: Option<&str>,
    exec_slots: Arc<tokio::sync::Semaphore>,
) {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(options.election.identity.clone()),
    };
    let (backups, writer) = reflector::store();
    let backup_api: Api<Backup> = api(&client, namespace);
    let backup_cache = watcher(backup_api.clone(), lean::listed())
        .default_backoff()
        .modify(lean::backup)
        .reflect(writer)
        .for_each(|_| async {});
    // The policy cache is filled by the same stream that re-reads a policy's Backups on a
    // spec change (below), so a Backup reconciled for that change finds the new spec.
    let (policy_store, policy_writer) = reflector::store();
    let policy_specs = {
        use kube::runtime::utils::predicates;
        watcher(api::<BackupPolicy>(&client, namespace), lean::listed())
            .default_backoff()
            .modify(lean::tidemark_meta_of::<BackupPolicy>)
            .reflect(policy_writer)
            .touched_objects()
            .predicate_filter(predicates::generation, Default::default())
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder: events::Recorder::new(client.clone(), reporter),
        clock,
        backups,
        policies: policy_store,
        store_retry_timeout: options.store_retry_timeout,
        image: options.image.clone(),
        metrics: options.metrics.clone(),
        streams: streams::Streams::default(),
        allow_ambient_credentials: options.allow_ambient_credentials,
        identity: options.election.identity.clone(),
        exec_limits: options.exec_limits.clone(),
        exec_slots,
        background: background::Background::new(options.background_passes),
        pass_budget: options.pass_budget,
        store_lease: options.store_lease,
        catalog_turn: tokio::sync::Semaphore::new(1),
        owned: Mutex::default(),
        capabilities: options.capabilities,
        tenancy: {
            // A cluster-wide install never serves its own namespace (issue 28).
            let mut t = options.tenancy.clone();
            if options.namespaces.is_empty() {
                t.own_namespace = Some(options.election.namespace.clone());
            }
            t
        },
        hook_turns: Mutex::default(),
        failures: Mutex::new(HashMap::new()),
        archiver_seen: Mutex::new(HashMap::new()),
    });
    let _stop_streams = StopStreams(ctx.clone());
    // The Backup cache must hold everything that exists before a schedule decides on it.
    let cache_ready = ctx.backups.clone();
    let scheduled_ready = async move {
        let _ = cache_ready.wait_until_ready().await;
    };
    let schedules: Api<ScheduledBackup> = api(&client, namespace);
    let schedule_controller = watched(schedules, &stopping, lean::schedule);
    let schedule_store = schedule_controller.store();
    // A policy's spec change (its `consolidate`, its `ttl`) is looked at by its schedules
    // at once: their `ChainsEnd` condition follows it, not the next slot.
    let schedule_policy_specs = {
        use kube::runtime::WatchStreamExt;
        use kube::runtime::utils::predicates;
        watcher(api::<BackupPolicy>(&client, namespace), lean::listed())
            .default_backoff()
            .modify(lean::tidemark_meta_of::<BackupPolicy>)
            .applied_objects()
            .predicate_filter(predicates::generation, Default::default())
    };
    let of_schedule_policy = schedule_store.clone();
    let scheduled = drive(
        schedule_controller
            .watches(backup_api, lean::listed(), |b: Backup| {
                scheduled::schedule_of(b)
                    .into_iter()
                    .collect::<Vec<ObjectRef<ScheduledBackup>>>()
            })
            .watches_stream(schedule_policy_specs, move |p: BackupPolicy| {
                let (ns, name) = (p.namespace(), p.name_any());
                of_schedule_policy
                    .state()
                    .iter()
                    .filter(|s| s.namespace() == ns && s.spec.template.policy.name == name)
                    .map(|s| ObjectRef::from_obj(s.as_ref()))
                    .collect::<Vec<_>>()
            }),
        scheduled::reconcile,
        ctx.clone(),
    );
    let ours =
        || lean::listed().labels(&format!("{}={}", names::MANAGED_BY.0, names::MANAGED_BY.1));
    let policies: Api<BackupPolicy> = api(&client, namespace);
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = api(&client, namespace);
    // The archiver runs in the database's image: a rollout of a selected pod's image
    // (and nothing else of a pod) looks at the policy again.
    let database_pods = {
        use kube::runtime::WatchStreamExt;
        watcher(
            api::<k8s_openapi::api::core::v1::Pod>(&client, namespace),
            lean::listed(),
        )
        .default_backoff()
        .applied_objects()
        .predicate_filter(database::pod_runtime, Default::default())
    };
    let retention = {
        let c = watched_changes(policies, &stopping);
        let of_pod = c.store();
        c.watches(deployments, ours(), |d| {
            archiver::policy_of(&d).into_iter().collect::<Vec<_>>()
        })
        .watches_stream(database_pods, move |p| {
            database::policies_of_pod(&of_pod, &p)
        })
    };
    let retention = drive(retention, policy::reconcile, ctx.clone());
    let backups_api: Api<Backup> = api(&client, namespace);
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = api(&client, namespace);
    // A policy's deletionPolicy decides its Backups' finalizers: a spec change re-reads
    // them (status changes do not).
    let of_policy = ctx.backups.clone();
    let runner = drive(
        watched(backups_api, &stopping, lean::backup)
            .watches(jobs, ours(), |j| {
                backup::job::backup_of(&j).into_iter().collect::<Vec<_>>()
            })
            .watches_stream(policy_specs, move |p: BackupPolicy| {
                let (ns, name) = (p.namespace(), p.name_any());
                of_policy
                    .state()
                    .iter()
                    .filter(|b| b.namespace() == ns && b.spec.template.policy.name == name)
                    .map(|b| ObjectRef::from_obj(b.as_ref()))
                    .collect::<Vec<_>>()
            }),
        backup::reconcile,
        ctx.clone(),
    );
    // The PVC reaper: every VolumeClaimRetention, looked at again when a pod or a claim
    // of its namespace changes.
    let reaper = {
        // Its own status write must not trigger the next look.
        let c = watched_changes(
            api::<tidemark_api::crd::VolumeClaimRetention>(&client, namespace),
            &stopping,
        );
        let (by_pod, by_claim) = (c.store(), c.store());
        c.watches(
            api::<k8s_openapi::api::core::v1::Pod>(&client, namespace),
            lean::listed(),
            move |p| volumes::in_namespace(&by_pod, p.namespace()),
        )
        .watches(
            api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(&client, namespace),
            lean::listed(),
            move |c| volumes::in_namespace(&by_claim, c.namespace()),
        )
    };
    let reaper = drive(reaper, volumes::reconcile, ctx.clone());
    // DeleteHooks: Ready from the spec and the last run (a run's status write looks again).
    let delete_hooks = drive(
        watched(
            api::<tidemark_api::crd::DeleteHook>(&client, namespace),
            &stopping,
            lean::delete_hook,
        ),
        hooks::reconcile,
        ctx.clone(),
    );
    // Restores: each looked at again when its Job changes (and polled while it runs).
    let restores = drive(
        watched_changes(
            api::<tidemark_api::crd::Restore>(&client, namespace),
            &stopping,
        )
        .watches(
            api::<k8s_openapi::api::batch::v1::Job>(&client, namespace),
            ours(),
            |j| restore::restore_of(&j).into_iter().collect::<Vec<_>>(),
        ),
        restore::reconcile,
        ctx.clone(),
    );
    let scheduled = async move {
        scheduled_ready.await;
        scheduled.await;
    };
    // Holds (`tidemark.io/protect`) come from the same cache: no pass before it is full.
    let retention_ready = ctx.backups.clone();
    let retention = async move {
        let _ = retention_ready.wait_until_ready().await;
        retention.await;
    };
    // Series of what is gone (a deleted policy or schedule, a tenant's name of no policy)
    // go, so no alert fires on them.
    let sweep = {
        let ctx = ctx.clone();
        // Never ends: the controllers' end ends it.
        async move {
            loop {
                tokio::time::sleep(metrics::SWEEP_EVERY).await;
                let known = |ns: &str, name: &str| {
                    ctx.policies
                        .get(&ObjectRef::<BackupPolicy>::new(name).within(ns))
                        .map(|p| metrics::Owned {
                            restore_test: p.spec.restore_test.is_some(),
                            verification: p.spec.verify.is_some(),
                            binlog_archive: p.spec.binlog_archive.is_some(),
                            copies: p.spec.copies.iter().map(|c| c.name.clone()).collect(),
                            copies_verified: p
                                .spec
                                .copies
                                .iter()
                                .filter(|c| c.verify.is_some())
                                .map(|c| c.name.clone())
                                .collect(),
                            copies_restore_tested: p
                                .spec
                                .copies
                                .iter()
                                .filter(|c| c.restore_test.is_some())
                                .map(|c| c.name.clone())
                                .collect(),
                        })
                };
                let schedule = |ns: &str, name: &str, policy: &str| {
                    schedule_store
                        .get(&ObjectRef::<ScheduledBackup>::new(name).within(ns))
                        .is_some_and(|s| s.spec.template.policy.name == policy && !s.spec.suspend)
                };
                ctx.metrics.sweep(known, schedule);
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(scheduled, retention, runner, reaper, restores, delete_hooks) } => {}
        () = backup_cache => {}
        _ = sweep => {}
    }
    // Work in the background (passes, deletions waiting on hooks) is work in flight too:
    // the caller bounds the wait, and keeps the lease meanwhile. What waits for its turn
    // does not start now; the next leader runs it.
    ctx.background.close_queue();
    while !ctx.background.is_empty() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_in_a_reconcile_becomes_its_error() {
        let boom = caught(async {
            let far = jiff::Timestamp::MAX;
            let _ = far + jiff::SignedDuration::from_hours(1);
        })
        .await
        .unwrap_err();
        assert!(
            boom.contains("overflow") || boom.contains("range"),
            "{boom}"
        );
        let fmt = caught(async { panic!("object {}", 7) }).await.unwrap_err();
        assert_eq!(fmt, "object 7");
        assert_eq!(caught(async { 5 }).await, Ok(5));
    }
}
