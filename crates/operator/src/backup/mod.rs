//! The Backup controller: runs one backup attempt as DESIGN.md §7 describes, and follows
//! it to `completed` or `failed`.
//!
//! For `mariabackup` / `xtrabackup` the attempt is a Job pinned to the chosen database
//! pod's node, mounting that pod's data volume, in the database container's own image, with
//! the static `tidemark` binary copied in by an init container. Its container runs
//! `tidemark push --method mariabackup -- mariabackup …`: push starts the backup tool,
//! streams its `--stream=xbstream` output straight to the store with a running sha256,
//! reads the LSNs, and commits `metadata.json` last. Credentials reach the Job as
//! environment only (the database's through an option file the container writes), never as
//! arguments.
//!
//! Phases: `pending` (nothing started; a `Blocked` condition says why, e.g. the database pod
//! is not running) → `running` (the Job exists) → `completed` (the Job succeeded and the
//! committed `metadata.json` says completed) | `failed`. The store decides: a Job that
//! succeeded without a committed backup is a failure.
//!
//! The controller is a phase machine: [`reconcile`] reads the [`Phase`] from the object and
//! hands it to that phase's function, which returns the next action. The parts live in
//! submodules that never reach back here: [`attempt`] (the attempt's status), [`source`]
//! (pod, data volume, parent), [`job`] (the Job), [`exec`] (method `exec`), [`lock`] (object lock dates).

pub mod attempt;
pub mod exec;
pub mod job;
pub mod lock;
pub mod source;
pub mod standby;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::{Backup, BackupPhase, BackupPolicy, BackupStatus};
use tidemark_api::schedule::BackupType;
use tidemark_core::FullBecause;
use tidemark_store::ClusterStore;

use crate::context::Context;
use crate::error::Error;
use crate::names::{backup_id, store_name};
use attempt::{blocked, fail};

/// The BackupPolicy a Backup names, checked as a Kubernetes name: the schema's pattern
/// refuses others, and an object admitted before it must not put its value into a request
/// path (`../../other-team/…`).
fn policy_name(backup: &Backup) -> Result<&str, tidemark_api::names::NameError> {
    let name = backup.spec.template.policy.name.as_str();
    tidemark_api::names::dns_subdomain("spec.policy.name", name).map(|()| name)
}

/// Where a Backup stands, read from the object: which function advances it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Being deleted, and no finalizer of ours holds it: nothing to do.
    Released,
    /// Being deleted, its attempt settled: the remote cleanup (`Step::deleting`).
    Deleting,
    /// `status.phase` is one a newer operator wrote: left alone.
    Foreign,
    /// Completed or failed: the finalizer, the gauge and the TTL (`Step::finished`).
    Finished,
    /// Not started, blocked or running: admitted, then started or followed
    /// (`Step::active`). A Backup deleted while its attempt runs stays here until the
    /// attempt ends (nothing new starts for it).
    Active,
}

impl Phase {
    /// The phase of `backup`.
    pub fn of(backup: &Backup) -> Phase {
        let status = backup.status.as_ref().and_then(|s| s.phase.as_ref());
        if backup.meta().deletion_timestamp.is_some() {
            if !crate::cleanup::has_finalizer(backup) {
                return Phase::Released;
            }
            if crate::cleanup::settled(backup) {
                return Phase::Deleting;
            }
        }
        match status {
            Some(BackupPhase::Unknown) => Phase::Foreign,
            Some(p) if p.is_done() => Phase::Finished,
            _ => Phase::Active,
        }
    }
}

/// Advances one Backup: the function of its [`Phase`].
///
/// # Errors
/// The API or the store failed; the policy is missing.
pub async fn reconcile(backup: Arc<Backup>, ctx: Arc<Context>) -> Result<Action, Error> {
    let step = Step::new(backup, ctx);
    match Phase::of(&step.backup) {
        Phase::Released => Ok(Action::await_change()),
        Phase::Deleting => step.deleting().await,
        Phase::Foreign => Ok(step.foreign()),
        Phase::Finished => step.finished().await,
        Phase::Active => step.active().await,
    }
}

/// One reconcile of one Backup: what its phase functions share.
struct Step {
    ctx: Arc<Context>,
    backup: Arc<Backup>,
    status: BackupStatus,
    ns: String,
    api: Api<Backup>,
    policies: Api<BackupPolicy>,
}

/// What the admission checks found: the policy and the method.
struct Admitted {
    policy: BackupPolicy,
    method: String,
}

impl Step {
    fn new(backup: Arc<Backup>, ctx: Arc<Context>) -> Self {
        let ns = backup.namespace().unwrap_or_default();
        Step {
            api: Api::namespaced(ctx.client.clone(), &ns),
            policies: Api::namespaced(ctx.client.clone(), &ns),
            status: backup.status.clone().unwrap_or_default(),
            ctx,
            backup,
            ns,
        }
    }

    /// The Backup's BackupPolicy; `None` when it does not exist or the name is not a name.
    async fn policy(&self) -> Result<Option<BackupPolicy>, Error> {
        match policy_name(&self.backup) {
            Ok(name) => Ok(self.policies.get_opt(name).await?),
            Err(_) => Ok(None),
        }
    }

    /// Fails the attempt with `message`; the Backup then waits for a change.
    async fn fail(&self, message: &str) -> Result<Action, Error> {
        fail(
            &self.ctx.metrics,
            &self.ctx.recorder,
            &self.api,
            &self.backup,
            &self.status,
            message,
        )
        .await?;
        Ok(Action::await_change())
    }

    /// [`Phase::Deleting`]: the remote cleanup, in the background — its DeleteHooks may
    /// take up to their timeouts, which must not hold one of the controller's reconcile
    /// slots.
    async fn deleting(&self) -> Result<Action, Error> {
        let key = crate::context::key(self.backup.as_ref());
        match self.ctx.background.poll(&key) {
            crate::background::Polled::Running | crate::background::Polled::Queued => {
                return Ok(Action::requeue(crate::background::POLL));
            }
            crate::background::Polled::Done(outcome) => return outcome,
            crate::background::Polled::Idle => {}
        }
        let policy = self.policy().await?;
        let (c, a, b) = (self.ctx.clone(), self.api.clone(), self.backup.clone());
        // Queued when its turn has not come: the Backup stays Deleting meanwhile.
        self.ctx.background.start(key, async move {
            crate::cleanup::on_delete(&c, &a, &b, policy.as_ref()).await
        });
        Ok(Action::requeue(crate::background::POLL))
    }

    /// [`Phase::Foreign`]: written by a newer operator (a rollback, or two versions side by
    /// side): what it means is not known here, so nothing is started, finished or deleted.
    fn foreign(&self) -> Action {
        tracing::warn!(backup = %crate::context::key(self.backup.as_ref()), "status.phase is one this operator does not know; leaving the Backup alone");
        Action::await_change()
    }

    /// [`Phase::Finished`]: the finalizer follows the effective deletion policy, the gauge
    /// of the newest completed backup, and the TTL.
    async fn finished(&self) -> Result<Action, Error> {
        let backup = &self.backup;
        // The policy is read only when the Backup does not say, and from the watch cache:
        // at start-up every finished Backup is reconciled, and a GET each would be most of
        // the API traffic. One not in the cache (not filled yet, or really gone) is read
        // from the API; an expiry always reads it.
        let cached = self.ctx.policies.get(
            &kube::runtime::reflector::ObjectRef::new(&backup.spec.template.policy.name)
                .within(&self.ns),
        );
        let cached_policy = cached.clone();
        let policy = match (
            &backup.spec.template.deletion_policy,
            &backup.spec.ttl,
            cached,
        ) {
            (Some(_), None, _) => None,
            (_, None, Some(p)) => Some(p.as_ref().clone()),
            _ => self.policy().await?,
        };
        // A policy that is gone says nothing: the finalizer stays as it was (deleting the
        // policy must not quietly turn a Delete into a Retain, nor the reverse).
        if policy.is_some() || backup.spec.template.deletion_policy.is_some() {
            let delete = crate::cleanup::effective(backup, policy.as_ref())
                == tidemark_api::DeletionPolicy::Delete;
            crate::cleanup::set_finalizer(&self.api, backup, delete).await?;
        }
        // Every Backup is reconciled once at start-up: the gauge of the newest completed
        // backup is right from then on, not only after the next backup.
        if let Some(at) = self.status.completed_at.as_ref() {
            let labels =
                crate::metrics::Metrics::policy(&self.ns, &backup.spec.template.policy.name);
            match self.status.phase {
                Some(BackupPhase::Completed) => self.ctx.metrics.backup_completed(
                    &labels,
                    self.status.started_at.as_ref().map(|t| t.0),
                    at.0,
                    self.status.size,
                ),
                Some(BackupPhase::Failed) => self.ctx.metrics.backup_failed(&labels, at.0),
                _ => {}
            }
        }
        // A hold placed now is in the store now, for deleters with only the store (a
        // release is recorded where it matters: before an expiry or a deletion).
        let mut after = Action::await_change();
        let protected = backup
            .annotations()
            .get(crate::names::PROTECT_ANNOTATION)
            .is_some_and(|v| v == "true");
        if protected
            && let Some(p) = policy.as_ref().or(cached_policy.as_deref())
            && let Err(e) = crate::holds::record_protected(&self.ctx, backup, p).await
        {
            tracing::warn!(backup = %crate::context::key(backup.as_ref()), "recording its hold in the store: {e}; trying again in a minute (the policy's next pass records it too)");
            after = Action::requeue(std::time::Duration::from_secs(60));
        }
        if let Some(ttl) = backup.spec.ttl.as_deref() {
            return crate::cleanup::expire(&self.ctx, &self.api, backup, policy.as_ref(), ttl)
                .await;
        }
        Ok(after)
    }

    /// [`Phase::Active`]: admitted, its store opened, then followed (running) or started.
    async fn active(&self) -> Result<Action, Error> {
        // Labels go into the store with the backup (DeleteHooks select by them once the
        // object is gone): one whose labels the operator does not keep is not started.
        if let Some(size) = crate::lean::trimmed(&self.backup)
            && matches!(self.status.phase, None | Some(BackupPhase::Pending))
        {
            let message = format!(
                "metadata.labels and annotations take {size} bytes; the operator keeps at most {} of them per object (DeleteHooks select Backups by label): remove some",
                crate::lean::MAX_KEPT_LABELS
            );
            return self.fail(&message).await;
        }
        if matches!(self.status.phase, None | Some(BackupPhase::Pending)) {
            self.ctx
                .warn_ambiguous(
                    &self.backup.object_ref(&()),
                    &self.backup.spec.ambiguous_durations(),
                )
                .await;
        }
        let Admitted { policy, method } = match self.admit().await? {
            Ok(a) => a,
            Err(next) => return Ok(next),
        };
        let store = match crate::stores::open(&self.ctx, &policy).await {
            Ok(s) => s,
            // Nothing started yet: it waits with the reason (a Secret created or fixed is
            // noticed within a minute) and fails after PENDING_LIMIT, never holding its
            // schedule forever. One already running is followed as soon as the store opens.
            Err(e) if matches!(self.status.phase, None | Some(BackupPhase::Pending)) => {
                let reason = match &e {
                    Error::Missing(_) => "StoreCredentialsMissing",
                    Error::Invalid(_) => "InvalidSpec",
                    _ => "StoreUnavailable",
                };
                let message = tidemark_engine::error::chain(&e);
                return blocked(&self.ctx, &self.api, &self.backup, reason, &message).await;
            }
            Err(e) => return Err(e),
        };
        if method == "exec" {
            return exec::advance(
                &self.ctx,
                &self.api,
                self.backup.clone(),
                &self.status,
                &policy,
                store,
            )
            .await;
        }
        let jobs: Api<Job> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let job_name = self
            .status
            .job_name
            .clone()
            .unwrap_or_else(|| job::job_name(&self.backup));
        match jobs.get_opt(&job_name).await? {
            Some(job) => self.running(&job, &store).await,
            // Its Job is gone (deleted by hand) before an outcome was seen: the store
            // decides.
            None if self.status.phase == Some(BackupPhase::Running) => {
                attempt::settle(
                    &self.ctx.metrics,
                    &self.ctx.recorder,
                    &self.api,
                    &self.backup,
                    &self.status,
                    &store,
                    &store_name(&self.backup),
                    &backup_id(&self.backup),
                    None,
                )
                .await
            }
            None if method == "job" => self.start_user_job(&jobs, &job_name, &policy, &store).await,
            None => {
                self.start_job(&jobs, &job_name, &policy, &method, &store)
                    .await
            }
        }
    }

    /// Whether the Backup may start (or go on): its policy exists and is valid, and the
    /// method, type and settings are ones this operator runs. `Err(action)`: blocked or
    /// failed, and what to do next.
    async fn admit(&self) -> Result<Result<Admitted, Action>, Error> {
        let (ctx, api, backup) = (&self.ctx, &self.api, &self.backup);
        if let Err(e) = policy_name(backup) {
            return Ok(Err(blocked(
                ctx,
                api,
                backup,
                "InvalidSpec",
                &e.to_string(),
            )
            .await?));
        }
        let Some(policy) = self.policy().await? else {
            let message = format!(
                "BackupPolicy {}/{} (spec.policy.name) does not exist",
                self.ns, backup.spec.template.policy.name
            );
            return Ok(Err(
                blocked(ctx, api, backup, "PolicyMissing", &message).await?
            ));
        };
        // What the Job is made of must be valid before it is built (an API server refusing
        // the Job would be retried forever); a fixed policy lets it go on.
        if let Some(Err(e)) = policy
            .spec
            .resources
            .as_ref()
            .map(tidemark_api::PodResources::validate)
        {
            let message = format!("BackupPolicy {}/{}: {e}", self.ns, policy.name_any());
            return Ok(Err(
                blocked(ctx, api, backup, "InvalidSpec", &message).await?
            ));
        }
        if backup.meta().deletion_timestamp.is_none() {
            // Before anything is written: a Backup that opts into remote cleanup carries
            // the finalizer from the start.
            let delete = crate::cleanup::effective(backup, Some(&policy))
                == tidemark_api::DeletionPolicy::Delete;
            crate::cleanup::set_finalizer(api, backup, delete).await?;
        }
        let mysql_source = policy
            .spec
            .source
            .as_ref()
            .is_some_and(tidemark_api::policy::SourceSpec::is_mysql);
        let method = backup.spec.template.method.clone().unwrap_or_else(|| {
            if mysql_source {
                "mysql-clone"
            } else {
                "mariabackup"
            }
            .to_owned()
        });
        // A method of the other database: it would fail inside the Job, later.
        let mysql_method = is_mysql_method(&method);
        if mysql_method != mysql_source
            && matches!(
                method.as_str(),
                "mariabackup" | "xtrabackup" | "mysql-clone" | "mysqldump"
            )
        {
            let message = format!(
                "method {method} backs up {}, and the policy's source.engine is {}",
                if mysql_method { "MySQL" } else { "MariaDB" },
                if mysql_source {
                    "mysql"
                } else {
                    "mariadb (the default; set source.engine: mysql for MySQL)"
                }
            );
            return Ok(Err(self.fail(&message).await?));
        }
        if let Some(message) = self.refusal(&method) {
            return Ok(Err(self.fail(&message).await?));
        }
        Ok(Ok(Admitted { policy, method }))
    }

    /// Why the Backup's method, type or settings cannot run here (a failure: only a new
    /// Backup fixes it), or `None`.
    fn refusal(&self, method: &str) -> Option<String> {
        let backup = &self.backup;
        if !matches!(
            method,
            "mariabackup" | "xtrabackup" | "exec" | "job" | "mysql-clone" | "mysqldump"
        ) {
            return Some(format!(
                "unknown method {method:?}; expected mariabackup, xtrabackup, exec, job, mysql-clone or mysqldump"
            ));
        }
        if let t @ BackupType::Unknown(_) = &backup.spec.kind {
            return Some(format!("spec.type: {}", t.unknown()));
        }
        if is_mysql_method(method) && backup.spec.kind == BackupType::Incremental {
            return Some(format!(
                "spec.type: incremental: method {method} takes full backups only"
            ));
        }
        if let Err(e) = backup.spec.template.compression() {
            return Some(e.to_string());
        }
        if let Some(Err(e)) = backup
            .spec
            .incremental
            .as_ref()
            .map(|i| i.validate(Some(method)))
        {
            return Some(e.to_string());
        }
        let needs = if method == "exec" {
            (self.ctx.capabilities.exec, "exec")
        } else {
            (self.ctx.capabilities.jobs, "jobs")
        };
        if !needs.0 {
            return Some(crate::rbac::refused(&format!("method {method}"), needs.1));
        }
        if method != "job" && backup.spec.template.online == Some(false) {
            return Some(format!(
                "online: false is not supported by {method}: it backs up a running server (remove online, or use method job with your own offline procedure)"
            ));
        }
        None
    }

    /// The attempt's Job exists: recorded as running (if a reconcile stopped before it
    /// did), then followed to its end.
    async fn running(&self, job: &Job, store: &ClusterStore) -> Result<Action, Error> {
        let job_name = job.name_any();
        let ours = job
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == self.backup.meta().uid.as_ref());
        if !ours {
            return self
                .fail(&format!(
                    "a Job named {job_name} exists and is not this Backup's"
                ))
                .await;
        }
        let (name, id) = (store_name(&self.backup), backup_id(&self.backup));
        if self.status.phase != Some(BackupPhase::Running) {
            // Created by a reconcile that stopped before recording it.
            attempt::mark_running(
                &self.ctx,
                &self.api,
                &self.backup,
                &self.status,
                &job_name,
                store,
                &name,
                &id,
                job.annotations()
                    .get(crate::names::BACKS_UP_ANNOTATION)
                    .map_or("its Job", String::as_str),
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        attempt::follow(
            &self.ctx.metrics,
            &self.ctx.recorder,
            &self.api,
            &self.backup,
            &self.status,
            job,
            store,
            &name,
            &id,
        )
        .await
    }

    /// Method `job`: the user's pod template as the attempt's Job.
    async fn start_user_job(
        &self,
        jobs: &Api<Job>,
        job_name: &str,
        policy: &BackupPolicy,
        store: &ClusterStore,
    ) -> Result<Action, Error> {
        let store_secret = crate::stores::policy_secret_keys(&self.ctx, policy).await?;
        let (name, id) = (store_name(&self.backup), backup_id(&self.backup));
        // The caches keep no pod template (`crate::lean::backup`): read it from the object,
        // within its bound.
        let mut backup = (*self.backup).clone();
        backup.spec.template.job_template = self
            .api
            .get(&self.backup.name_any())
            .await?
            .spec
            .template
            .job_template;
        let job = match job::user_job(
            &backup,
            policy,
            job_name,
            &self.ctx.image,
            &name,
            &id,
            store_secret.as_ref(),
        ) {
            Ok(j) => j,
            Err(message) => return self.fail(&message).await,
        };
        // The operator creates the Job with its own rights: the template gets no more than
        // its author could have asked for (issue 28).
        if let Some(spec) = job.spec.as_ref().and_then(|j| j.template.spec.as_ref())
            && let Err(message) = self.ctx.tenancy.check_pod(spec, "spec.jobTemplate.spec")
        {
            return self.fail(&message).await;
        }
        attempt::start(
            &self.ctx,
            &self.api,
            jobs,
            &self.backup,
            &self.status,
            job,
            store,
            &name,
            &id,
            "the user's pod template",
        )
        .await
    }

    /// `mariabackup` / `xtrabackup`: choose the pod, check its data volume, find the
    /// parent of an incremental, and create the Job. `mysql-clone` / `mysqldump`: choose
    /// the pod, and create the Job that reaches it over TCP (no data volume, no parent).
    async fn start_job(
        &self,
        jobs: &Api<Job>,
        job_name: &str,
        policy: &BackupPolicy,
        method: &str,
        store: &ClusterStore,
    ) -> Result<Action, Error> {
        let (ctx, api, backup) = (&self.ctx, &self.api, &self.backup);
        let store_secret = crate::stores::policy_secret_keys(ctx, policy).await?;
        let (pod, source, note) = match source::target_pod(ctx, api, backup, policy).await? {
            Ok(found) => found,
            Err(action) => return Ok(action),
        };
        // The Job runs this operator's binary on the pod's node: a node of another
        // architecture could only fail it later, with `exec format error`.
        if let Some(message) = crate::pod::foreign_architecture(&ctx.client, &pod).await {
            return self.fail(&message).await;
        }
        let mysql = is_mysql_method(method);
        let data = match source::data_volume(&pod, source) {
            Ok(d) => d,
            Err(message) => {
                return blocked(ctx, api, backup, "NoDataVolume", &message).await;
            }
        };
        // Which data directory this is: the claim's uid, else the pod's (an emptyDir lives
        // as long as its pod). InnoDB LSNs are a server's own; an incremental builds only
        // on a backup of the same data directory.
        let mut volume_id = format!("pod:{}", pod.meta().uid.as_deref().unwrap_or_default());
        // (A MySQL backup reaches the server over TCP: it mounts no volume, builds on no
        // parent.)
        if let Some(claim) = data
            .volume
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.clone())
            .filter(|_| !mysql)
        {
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &self.ns);
            if let Some(pvc) = claims.get_opt(&claim).await? {
                if pvc
                    .spec
                    .as_ref()
                    .and_then(|s| s.access_modes.as_ref())
                    .is_some_and(|m| m.iter().any(|m| m == "ReadWriteOncePod"))
                {
                    let message = format!(
                        "the data volume's claim {claim} is ReadWriteOncePod: no second pod may mount it; use method exec (the command runs in the database container) or job"
                    );
                    return blocked(ctx, api, backup, "ReadWriteOncePod", &message).await;
                }
                volume_id = format!("pvc:{}", pvc.meta().uid.as_deref().unwrap_or_default());
            }
        }
        let turn = ctx
            .catalog_turn
            .acquire()
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        let parent = if mysql {
            Ok(Ok(None))
        } else {
            source::parent_of(store, backup, &volume_id).await
        };
        drop(turn);
        let parent = match parent? {
            Ok(parent) => parent,
            Err(why) => {
                let message = no_parent(&why, &pod.name_any());
                return blocked(ctx, api, backup, "NoParent", &message).await;
            }
        };
        let (name, id) = (store_name(backup), backup_id(backup));
        let lock_until = lock::lock_until(
            &self.ctx,
            backup,
            policy,
            parent.is_none(),
            self.ctx.clock.now(),
        )
        .await?;
        let what = format!(
            "pod {} on node {}{}",
            pod.name_any(),
            source::node_of(&pod).unwrap_or_default(),
            note.map_or_else(String::new, |n| format!(" ({n})"))
        );
        let plan = job::JobPlan {
            job_name: job_name.to_owned(),
            backup,
            policy,
            source,
            pod: &pod,
            data,
            method: method.to_owned(),
            image: ctx.image.clone(),
            backup_name: name.clone(),
            backup_id: id.clone(),
            parent,
            volume_id,
            store_secret,
            lock_until,
            backs_up: what.clone(),
        };
        let job = plan.job().map_err(Error::Invalid)?;
        // The security settings it copies from the database pod pass the template check
        // (issue 42 §5), as the tool Jobs' do.
        if let Some(spec) = job.spec.as_ref().and_then(|s| s.template.spec.as_ref()) {
            ctx.tenancy
                .check_copied(
                    spec.security_context.as_ref(),
                    spec.containers
                        .first()
                        .and_then(|c| c.security_context.as_ref()),
                    "the security settings of the database pod, which the backup Job copies",
                )
                .map_err(Error::Invalid)?;
        }

        attempt::start(
            ctx,
            api,
            jobs,
            backup,
            &self.status,
            job,
            store,
            &name,
            &id,
            &what,
        )
        .await
    }
}

/// Why an incremental of `pod` cannot be taken (its `NoParent` message).
/// A method that backs up MySQL over TCP (issue 47).
fn is_mysql_method(method: &str) -> bool {
    matches!(method, "mysql-clone" | "mysqldump")
}

/// Why an incremental has no parent here, and what to do.
fn no_parent(why: &FullBecause, pod: &str) -> String {
    match why {
        FullBecause::OtherSource(id) => format!(
            "an incremental builds on a backup of the same data directory (InnoDB LSNs are a server's own), and pod {pod} holds none: the newest restorable one, {id}, was taken from another server; take a full backup of this one first, set target to the pod it came from, or set spec.incremental to take a full when there is no parent"
        ),
        FullBecause::Diverged(_) | FullBecause::ChainFull { .. } => format!(
            "{why}: take a full backup of pod {pod} first, or set spec.incremental to take one when needed"
        ),
        FullBecause::NoParent => "an incremental needs a restorable mariabackup backup in the store to start from; there is none (spec.incremental takes a full then)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::job::*;
    use super::source::*;
    use super::*;
    use crate::names::*;
    use crate::pod;
    use crate::stores::SecretKeys;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;
    use tidemark_api::crd::SourceSpec;

    fn pod(name: &str, role: Option<&str>, running: bool) -> Pod {
        let mut labels = serde_json::Map::new();
        labels.insert("app".into(), json!("db"));
        if let Some(r) = role {
            labels.insert(DEFAULT_ROLE_LABEL.into(), json!(r));
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {
                "nodeName": format!("node-of-{name}"),
                "containers": [{"name": "mariadb", "image": "mariadb:11.4",
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/mysql", "subPath": "mysql"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{name}")}}],
                "tolerations": [{"key": "db", "operator": "Exists"}],
            },
            "status": {"phase": if running { "Running" } else { "Pending" }, "podIP": "10.0.0.7",
                "conditions": [{"type": "Ready", "status": if running { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    fn source() -> SourceSpec {
        serde_json::from_value(json!({
            "selector": {"matchLabels": {"app": "db"}},
            "credentialsSecret": "db-login",
            // The password by reference (another operator's Secret); the user by default.
            "passwordFrom": {"name": "mariadb-root", "key": "root-password"},
        }))
        .unwrap()
    }

    #[test]
    fn the_target_chooses_the_pod() {
        let pods = vec![
            pod("db-0", Some("primary"), true),
            pod("db-1", Some("replica"), true),
            pod("db-2", Some("replica"), false),
        ];
        let s = source();
        assert_eq!(choose_pod(&pods, &s, "primary").unwrap().name_any(), "db-0");
        assert_eq!(
            choose_pod(&pods, &s, "prefer-standby").unwrap().name_any(),
            "db-1"
        );
        // No standby running: the primary.
        let only_primary = vec![pods[0].clone(), pods[2].clone()];
        assert_eq!(
            choose_pod(&only_primary, &s, "prefer-standby")
                .unwrap()
                .name_any(),
            "db-0"
        );
        // A standby that runs but is not Ready (its probes say replication is broken) is
        // never picked.
        let mut unready = pods[1].clone();
        unready
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .status = "False".into();
        assert_eq!(
            choose_pod(&[pods[0].clone(), unready], &s, "prefer-standby")
                .unwrap()
                .name_any(),
            "db-0"
        );
        // Nothing running: nothing (a condition, not a hung Job).
        assert!(choose_pod(&[pods[2].clone()], &s, "primary").is_none());
        assert!(choose_pod(&[pods[1].clone()], &s, "primary").is_none());
    }

    #[test]
    fn names_are_deterministic_and_valid() {
        let b: Backup = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": "nightly-20261122020000", "namespace": "ns",
                "uid": "4F3A9C1E-0000-4000-8000-000000000000",
                "creationTimestamp": "2026-11-22T02:00:01Z",
                "labels": {"tidemark.io/scheduled-backup": "nightly"}},
            "spec": {"policy": {"name": "db"}},
        }))
        .unwrap();
        let id = backup_id(&b);
        assert_eq!(id, "20261122T020001Z-4f3a9c1e");
        assert!(tidemark_core::inventory::is_backup_id(&id));
        assert_eq!(store_name(&b), "nightly");
        assert_eq!(job_name(&b), "nightly-20261122020000-4f3a9c1e-backup");
        let mut long = b.clone();
        long.metadata.name = Some(format!("{}-20261122020000", "x".repeat(47)));
        let other_slot = {
            let mut o = long.clone();
            o.metadata.name = Some(format!("{}-20261122030000", "x".repeat(47)));
            o.metadata.uid = Some("5e000000-0000".into());
            o
        };
        assert!(job_name(&long).len() <= 63, "{}", job_name(&long));
        assert_ne!(
            job_name(&long),
            job_name(&other_slot),
            "two slots share a Job"
        );
    }

    /// The backup Job of an incremental Backup `m` of policy `shop` from pod `p`.
    fn job_of(p: &Pod) -> Job {
        job_compressed(p, None, None)
    }

    /// [`job_of`] with the policy's and the Backup's `compression`.
    fn job_compressed(p: &Pod, policy_says: Option<&str>, backup_says: Option<&str>) -> Job {
        job_with(p, policy_says, backup_says, None)
    }

    /// [`job_compressed`] with the policy's object lock mode and the date asked for.
    fn job_with(
        p: &Pod,
        policy_says: Option<&str>,
        backup_says: Option<&str>,
        lock: Option<(&str, jiff::Timestamp)>,
    ) -> Job {
        job_method(p, policy_says, backup_says, lock, "mariabackup")
    }

    /// [`job_with`] of a method: a MySQL one's Backup is a full.
    fn job_method(
        p: &Pod,
        policy_says: Option<&str>,
        backup_says: Option<&str>,
        lock: Option<(&str, jiff::Timestamp)>,
        method: &str,
    ) -> Job {
        let mysql = is_mysql_method(method);
        let s = source();
        let mut os = json!({"bucket": "b", "path": "prod", "endpoint": "http://s3:9000", "credentialsSecret": "s3"});
        if let Some(c) = policy_says {
            os["compression"] = json!(c);
        }
        if let Some((mode, _)) = lock {
            os["objectLock"] = json!({"mode": mode, "period": "30d"});
        }
        let policy: BackupPolicy = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
            "metadata": {"name": "shop", "namespace": "ns"},
            "spec": {"objectStore": os},
        }))
        .unwrap();
        let mut spec = json!({"policy": {"name": "shop"}, "type": if mysql { "full" } else { "incremental" }, "ttl": "7d", "method": method});
        if let Some(c) = backup_says {
            spec["compression"] = json!(c);
        }
        let b: Backup = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": "m", "namespace": "ns", "uid": "abcdef12-0000", "creationTimestamp": "2026-11-22T02:00:01Z"},
            "spec": spec,
        }))
        .unwrap();
        let plan = JobPlan {
            job_name: job_name(&b),
            backup: &b,
            policy: &policy,
            source: &s,
            pod: p,
            data: data_volume(p, &s).unwrap(),
            method: method.into(),
            image: "tidemark:test".into(),
            backup_name: "m".into(),
            backup_id: backup_id(&b),
            parent: (!mysql).then(|| "20261121T020001Z-00000001".into()),
            volume_id: "pvc:0123-4567".into(),
            store_secret: Some(SecretKeys {
                name: "s3".into(),
                env: vec![
                    ("AWS_ACCESS_KEY_ID".into(), "accessKeyId".into()),
                    ("AWS_SECRET_ACCESS_KEY".into(), "secretAccessKey".into()),
                ],
            }),
            lock_until: lock.map(|(_, t)| t),
            backs_up: "pod db-0 on node n".into(),
        };
        plan.job().unwrap()
    }

    /// Object lock: the Job's `tidemark push` gets the mode from the store's environment
    /// (`TIDEMARK_LOCK_MODE`) and the date as `--lock-until`; without a lock, neither.
    #[test]
    fn the_job_locks_as_the_policy_says() {
        let p = pod("db-1", Some("replica"), true);
        let until: jiff::Timestamp = "2026-12-29T02:00:00Z".parse().unwrap();
        let parts = |job: &Job| {
            let c = job
                .spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .clone();
            let mode: Vec<String> = c
                .env
                .iter()
                .flatten()
                .filter(|e| e.name == "TIDEMARK_LOCK_MODE")
                .map(|e| e.value.clone().unwrap_or_default())
                .collect();
            let args = c.args.unwrap_or_default().join(" ");
            (mode, args)
        };
        let (mode, args) = parts(&job_with(&p, None, None, Some(("compliance", until))));
        assert_eq!(mode, ["compliance"]);
        assert!(args.contains("--lock-until 2026-12-29T02:00:00Z"), "{args}");
        let (mode, args) = parts(&job_of(&p));
        assert!(mode.is_empty());
        assert!(!args.contains("--lock-until"), "{args}");
    }

    /// The policy's `objectStore.compression` reaches the backup Job as
    /// `TIDEMARK_COMPRESSION` (which `tidemark push` reads); a Backup's own `compression`
    /// overrides it, once.
    #[test]
    fn the_job_compresses_as_the_backup_or_its_policy_says() {
        let p = pod("db-1", Some("replica"), true);
        let setting = |job: &Job| -> Vec<String> {
            job.spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .env
                .iter()
                .flatten()
                .filter(|e| e.name == "TIDEMARK_COMPRESSION")
                .map(|e| e.value.clone().unwrap_or_default())
                .collect()
        };
        assert!(setting(&job_compressed(&p, None, None)).is_empty());
        assert_eq!(setting(&job_compressed(&p, Some("zstd"), None)), ["zstd"]);
        assert_eq!(
            setting(&job_compressed(&p, Some("zstd"), Some("none"))),
            ["none"]
        );
        assert_eq!(
            setting(&job_compressed(&p, None, Some("zstd:9"))),
            ["zstd:9"]
        );
    }

    /// Issue 47: a MySQL backup's Job reaches the chosen pod over TCP with MySQL's program
    /// and the login's options file, mounts no data volume, and names the server user.
    #[test]
    fn a_mysql_backup_job_reaches_the_server_over_tcp() {
        let p = pod("db-0", Some("primary"), true);
        for (method, tool) in [("mysql-clone", "mysql"), ("mysqldump", "mysqldump")] {
            let job = job_method(&p, None, None, None, method);
            let spec = job.spec.unwrap().template.spec.unwrap();
            let c = &spec.containers[0];
            let joined = c.args.clone().unwrap().join(" ");
            assert!(
                joined.contains(&format!(
                    "--method {method} --label tidemark.io/data-volume=pvc:0123-4567"
                )),
                "{joined}"
            );
            assert!(
                joined.ends_with(&format!(
                    "-- {tool} --defaults-extra-file=/tidemark-bin/my.cnf --host=10.0.0.7 --port=3306"
                )),
                "{joined}"
            );
            assert!(
                !joined.contains("--parent") && !joined.contains("--datadir"),
                "{joined}"
            );
            assert!(!joined.contains("mariabackup"), "{joined}");
            let mounts: Vec<&str> = c
                .volume_mounts
                .iter()
                .flatten()
                .map(|m| m.mount_path.as_str())
                .collect();
            assert!(!mounts.contains(&"/var/lib/mysql"), "{mounts:?}");
            assert!(
                spec.volumes
                    .iter()
                    .flatten()
                    .all(|v| v.persistent_volume_claim.is_none()),
                "no claim mounted"
            );
            let env = c.env.clone().unwrap();
            assert!(
                env.iter().any(
                    |e| e.name == "TIDEMARK_SERVER_USER" && e.value.as_deref() == Some("mysql")
                ),
                "{env:?}"
            );
            // The password only by reference.
            assert!(
                !serde_json::to_string(&env)
                    .unwrap()
                    .contains("\"value\":\"root")
            );
        }
    }

    #[test]
    fn the_job_carries_secrets_only_by_reference() {
        let p = pod("db-1", Some("replica"), true);
        let job = job_of(&p);
        // Bounded in time, and gone a day after it finished (its outcome is in status).
        let job_spec = job.spec.clone().unwrap();
        assert_eq!(
            job_spec.active_deadline_seconds,
            Some(crate::pod::JOB_DEADLINE_SECONDS)
        );
        assert_eq!(
            job_spec.ttl_seconds_after_finished,
            Some(FINISHED_JOB_TTL_SECONDS)
        );
        let spec = job.spec.unwrap().template.spec.unwrap();
        // Nothing in it talks to the API: no token (issue 28).
        assert_eq!(spec.automount_service_account_token, Some(false));
        let c = &spec.containers[0];
        let args = c.args.clone().unwrap();
        // Pinned, tolerated, in the database image, the claim mounted with its subPath.
        let affinity = serde_json::to_string(&spec.affinity).unwrap();
        assert!(affinity.contains("node-of-db-1"), "{affinity}");
        assert_eq!(spec.tolerations.as_ref().unwrap().len(), 1);
        assert_eq!(c.image.as_deref(), Some("mariadb:11.4"));
        let mount = &c.volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (mount.mount_path.as_str(), mount.sub_path.as_deref()),
            ("/var/lib/mysql", Some("mysql"))
        );
        assert_eq!(
            spec.volumes.as_ref().unwrap()[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "data-db-1"
        );
        // push to the store, incremental from the parent, then the tool with the option
        // file first and the pod's address.
        let joined = args.join(" ");
        for part in [
            "push --store s3://b/prod --cluster shop --backup-name m --backup-id 20261122T020001Z-abcdef12",
            "--type incremental --parent 20261121T020001Z-00000001",
            "--ttl 7d",
            "--label tidemark.io/data-volume=pvc:0123-4567",
            "-- mariabackup --defaults-extra-file=/tidemark-bin/my.cnf --host=10.0.0.7 --port=3306 --datadir=/var/lib/mysql",
        ] {
            assert!(joined.contains(part), "{part} not in {joined}");
        }
        // Credentials by reference only.
        let env = c.env.clone().unwrap();
        let by_ref = |n: &str| {
            env.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value_from.as_ref())
                .and_then(|v| v.secret_key_ref.as_ref())
                .map(|r| (r.name.clone(), r.key.clone()))
        };
        assert_eq!(
            by_ref("AWS_SECRET_ACCESS_KEY"),
            Some(("s3".into(), "secretAccessKey".into()))
        );
        assert_eq!(
            by_ref("DB_USER"),
            Some(("db-login".into(), "username".into()))
        );
        assert_eq!(
            by_ref("DB_PASSWORD"),
            Some(("mariadb-root".into(), "root-password".into()))
        );
        assert!(!joined.contains("--password"), "{joined}");
        // The init container installs tidemark from the operator image.
        let init = &spec.init_containers.unwrap()[0];
        assert_eq!(init.image.as_deref(), Some("tidemark:test"));
        assert_eq!(
            init.command.clone().unwrap(),
            vec!["/tidemark", "install", "/tidemark-bin/tidemark"]
        );
        assert_eq!(job.metadata.owner_references.unwrap()[0].kind, "Backup");
    }

    #[test]
    fn a_database_pod_a_restricted_namespace_admits_gives_a_job_it_admits() {
        use crate::testkit::restricted_violations;
        let mut p = pod("db-1", Some("replica"), true);
        let spec = p.spec.as_mut().unwrap();
        spec.security_context = Some(
            serde_json::from_value(json!({"runAsNonRoot": true, "runAsUser": 999,
                "seccompProfile": {"type": "RuntimeDefault"}}))
            .unwrap(),
        );
        spec.containers[0].security_context = Some(
            serde_json::from_value(json!({"allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]}}))
            .unwrap(),
        );
        assert_eq!(restricted_violations(spec), Vec::<String>::new());
        let job = job_of(&p).spec.unwrap().template.spec.unwrap();
        assert_eq!(restricted_violations(&job), Vec::<String>::new());
        // Our own init container meets the level on its own, even in a pod that does not.
        let plain = job_of(&pod("db-1", Some("replica"), true));
        let mut init = plain.spec.unwrap().template.spec.unwrap();
        init.containers.clear();
        init.volumes = None;
        init.security_context = None;
        assert_eq!(restricted_violations(&init), Vec::<String>::new());
        // In a pod that runs as root it does not claim non-root (the kubelet would refuse it).
        let root: k8s_openapi::api::core::v1::PodSecurityContext =
            serde_json::from_value(json!({"runAsUser": 0})).unwrap();
        let none = BackupPolicy::new("p", Default::default());
        let c = pod::install_container("tidemark:test", Some(&root), &none);
        assert_eq!(c.security_context.unwrap().run_as_non_root, None);
    }

    #[test]
    fn a_missing_data_volume_is_named() {
        let p = pod("db-0", None, true);
        let mut s = source();
        s.data_volume = Some("nope".into());
        let e = data_volume(&p, &s).unwrap_err();
        assert!(
            e.contains("\"nope\"") && e.contains("spec.source.dataVolume"),
            "{e}"
        );
        s.data_volume = None;
        s.container = Some("sidecar".into());
        let e = data_volume(&p, &s).unwrap_err();
        assert!(e.contains("no container \"sidecar\""), "{e}");
    }
}
