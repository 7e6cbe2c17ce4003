//! The Restore controller (issue 30): a declarative restore of a BackupPolicy's backups into
//! a PersistentVolumeClaim, through the engine's one restore use case.
//!
//! A Restore is planned in the operator, with the engine (`restore_instant`, then the
//! database port's plan: the same refusals as `tidemark restore --to`), and the plan goes
//! to its status at once: from then on the backups it names are held from retention
//! (`restore:<name>`, see `crate::holds`), and the binlogs after them with them. Then the
//! claim is checked (an existing one no pod uses) or created, and a Job in the database
//! image runs `tidemark restore` into it: the data directory is made aside
//! (`.tidemark-restore/` on the claim), and only once it is complete does the claim's old
//! data go and the new move into place. The Job's outcome is the Restore's: `Succeeded`,
//! or `Failed` with the reason, a created claim then annotated as holding no usable data.
//!
//! Steps, each with its own `Ready` reason while it waits or fails: validate
//! (`InvalidSpec`), dereference (`PolicyMissing`, `BackupMissing`, `DatabaseImageUnknown`,
//! `StoreUnavailable`), plan (`NotRestorable`), claim (`ClaimMissing`, `ClaimInUse`,
//! `StatefulSetScaledUp`,
//! `ClaimExists`, `ClaimBusy`), run (`Restoring`, `RestoreFailed`), done (`Restored`).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPolicy, Restore, RestoreStatus};
use tidemark_api::restore::{
    Into as Destination, NewClaim, RESTORE_INTO_LABEL, RESTORE_LABEL, Target, UNUSABLE_ANNOTATION,
};
use tidemark_engine::restore::{
    Database, MariaDbTools, RestorePoint, RestoreSummary, restore_instant,
};
use tidemark_mariadb::restore::RestorePlan;

use crate::context::Context;
use crate::error::Error;
use crate::pod;

/// The label on a restore's Job and its pod: the policy restored.
const JOB_POLICY_LABEL: &str = "tidemark.io/restore-policy";
/// Where the claim is mounted in the Job's pod.
const MOUNT: &str = "/restore";
/// How often a pending or running restore is looked at.
const POLL: Duration = Duration::from_secs(10);
/// The longest a Restore waits before its Job starts (for its policy, its claim, the
/// Backup it names, the store's lease…): then it fails, saying for what.
const MAX_PENDING: Duration = Duration::from_secs(3600);
/// The finalizer of an unfinished Restore: deleting it stops its Job first.
pub const FINALIZER: &str = "tidemark.io/restore";
/// The longest a deleted Restore waits for its Job's pod to stop.
const STOP_WAIT: Duration = Duration::from_secs(600);
/// The smallest claim a Restore creates.
const MIN_CLAIM: u64 = 1 << 30;
/// The largest claim a Restore sizes by itself (2 TiB): the sizes it is computed from are
/// what the store records, a store writer's numbers; a larger one is refused, asking for
/// `spec.into.newClaim.size` (issue 42 §6).
pub const MAX_AUTO_CLAIM: u64 = 2 << 40;

/// The Job that restores `restore` (its uid's first 8 characters keep two Restores of one
/// name, one deleted and made again, apart).
pub fn job_name(restore: &str, uid8: &str) -> String {
    let base = crate::names::prefix(restore, 40);
    format!("{base}-{uid8}-restore")
}

/// The Restore a Job restores for (its owner).
pub fn restore_of(job: &Job) -> Option<kube::runtime::reflector::ObjectRef<Restore>> {
    let owner = job
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Restore" && o.api_version == tidemark_api::API_VERSION)?;
    Some(kube::runtime::reflector::ObjectRef::new(&owner.name).within(&job.namespace()?))
}

/// Looks after one Restore.
///
/// # Guarantees
/// Deletes nothing: the store is only read, and the claim's old data is replaced only
/// with `spec.into.replaceData`, by the Job, once the new data directory is complete.
///
/// # Errors
/// The store or the API failed; retried with backoff (the status says where it waits).
pub async fn reconcile(restore: Arc<Restore>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let ns = restore.namespace().unwrap_or_default();
    let api: Api<Restore> = Api::namespaced(ctx.client.clone(), &ns);
    // Read afresh: the cache may not show the status this controller wrote a moment ago
    // (the Job it started), and acting on an older one would plan and start again.
    let Some(restore) = api.get_opt(&restore.name_any()).await? else {
        return Ok(Requeue::await_change());
    };
    let status = restore.status.clone().unwrap_or_default();
    if restore.meta().deletion_timestamp.is_some() {
        return finalize(&ctx, &api, &restore, &status).await;
    }
    if status.finished() {
        crate::context::set_finalizer(&api, &restore, FINALIZER, false).await?;
        return Ok(Requeue::await_change());
    }
    // While it is unfinished, deleting it stops its Job first (see `finalize`).
    crate::context::set_finalizer(&api, &restore, FINALIZER, true).await?;
    let (target, into) = match checked(&restore) {
        Ok(v) => v,
        Err(message) => {
            return refuse(&ctx, &api, &restore, status, "InvalidSpec", &message).await;
        }
    };
    match status.job.clone() {
        None => start(&ctx, &api, &restore, status, &target, &into).await,
        Some(job) => follow(&ctx, &api, &restore, status, &job, &target, &into).await,
    }
}

/// A Restore deleted before it ended: its Job is deleted and waited for (its pod either
/// stops before the swap, leaving the claim's data as it was, or finishes the swap, which
/// ignores SIGTERM), at most [`STOP_WAIT`]; a claim it created is then marked unusable.
/// Until then the backups it needs stay held.
async fn finalize(
    ctx: &Context,
    api: &Api<Restore>,
    restore: &Restore,
    status: &RestoreStatus,
) -> Result<Requeue, Error> {
    if !restore.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Requeue::await_change());
    }
    if !status.finished() {
        let ns = restore.namespace().unwrap_or_default();
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
        let job = match &status.job {
            Some(name) => jobs
                .get_opt(name)
                .await?
                .filter(|j| crate::context::owns(restore, &j.metadata)),
            None => None,
        };
        let ended = job.as_ref().and_then(crate::restoretest::ended);
        let waited = restore
            .meta()
            .deletion_timestamp
            .as_ref()
            .map(|t| ctx.clock.now().duration_since(t.0))
            .is_some_and(|d| d > jiff::SignedDuration::try_from(STOP_WAIT).unwrap_or_default());
        if let (Some(j), None, false) = (&job, ended, waited) {
            if j.metadata.deletion_timestamp.is_none() {
                jobs.delete(&j.name_any(), &kube::api::DeleteParams::foreground())
                    .await?;
            }
            // Until no pod of it runs (the Job object itself may linger until the
            // garbage collector has removed its pods).
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
            let running = crate::lean::list(
                &pods,
                &ListParams::default().labels(&format!("job-name={}", j.name_any())),
                crate::lean::meta_of,
            )
            .await?
            .iter()
            .any(|p| {
                matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Pending" | "Running") | None
                )
            });
            if running {
                return Ok(Requeue::requeue(Duration::from_secs(5)));
            }
        }
        if ended != Some(false) {
            let message = match &status.job {
                Some(job) => format!(
                    "the Restore was deleted before its Job {job} ended, and the Job was stopped: the claim holds its data as it was, or all of the restored data if the Job was already moving it in, never a mix"
                ),
                None => "the Restore was deleted before its Job started".to_owned(),
            };
            ctx.warn(&restore.object_ref(&()), "RestoreCancelled", &message)
                .await;
            if let Some(claim) = &status.claim {
                mark_unusable(ctx, restore, claim, "RestoreCancelled", &message).await;
            }
        }
    }
    crate::context::set_finalizer(api, restore, FINALIZER, false).await?;
    Ok(Requeue::await_change())
}

/// The spec and the name, checked: the name labels the claim it creates, so it must be a
/// label value.
fn checked(restore: &Restore) -> Result<(Target, Destination), String> {
    tidemark_api::names::label_value_name("metadata.name", &restore.name_any())
        .map_err(|e| e.to_string())?;
    restore.spec.checked().map_err(|e| e.to_string())
}

/// What a step that cannot go on says: wait (`Pending`, looked at again) or refuse
/// (`Failed`, for good).
enum Stop {
    Wait(&'static str, String),
    Refuse(&'static str, String),
    Err(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Err(e)
    }
}

/// Plans `restore`, makes sure of its claim and starts its Job.
async fn start(
    ctx: &Context,
    api: &Api<Restore>,
    restore: &Restore,
    mut status: RestoreStatus,
    target: &Target,
    into: &Destination,
) -> Result<Requeue, Error> {
    match prepare(ctx, api, restore, &mut status, target, into).await {
        Ok(()) => Ok(Requeue::requeue(POLL)),
        Err(Stop::Refuse(reason, message)) => {
            refuse(ctx, api, restore, status, reason, &message).await
        }
        Err(Stop::Wait(reason, message)) => {
            // Waiting is bounded: after MAX_PENDING it fails, saying for what.
            let created = restore.meta().creation_timestamp.as_ref().map(|t| t.0);
            if created.is_some_and(|c| {
                ctx.clock.now().duration_since(c)
                    > jiff::SignedDuration::try_from(MAX_PENDING).unwrap_or_default()
            }) {
                let message = format!(
                    "{message}; gave up after waiting {}s (create the Restore again once that is resolved)",
                    MAX_PENDING.as_secs()
                );
                return refuse(ctx, api, restore, status, reason, &message).await;
            }
            status.phase = Some("Pending".into());
            set_ready(&mut status, restore, false, reason, &message);
            write(api, restore, &status).await?;
            Ok(Requeue::requeue(POLL))
        }
        Err(Stop::Err(e)) => {
            status.phase = Some("Pending".into());
            let message = tidemark_engine::error::chain(&e);
            set_ready(&mut status, restore, false, reason_of(&e), &message);
            write(api, restore, &status).await?;
            Err(e)
        }
    }
}

/// The steps before the Job: dereference (the policy, the Backup named, the database
/// image, the claim and whether a pod uses it — the cheap checks first, so a Restore that
/// waits costs no catalog), plan under the store's lease (so no pass deletes what it
/// chooses before the plan, and with it the holds, is in status), the claim made, the
/// Job's name in status, the Job.
async fn prepare(
    ctx: &Context,
    api: &Api<Restore>,
    restore: &Restore,
    status: &mut RestoreStatus,
    target: &Target,
    into: &Destination,
) -> Result<(), Stop> {
    let ns = restore.namespace().unwrap_or_default();
    let name = restore.name_any();
    let policies: Api<BackupPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    let policy_name = &restore.spec.policy.name;
    let Some(policy) = policies.get_opt(policy_name).await.map_err(Error::from)? else {
        return Err(Stop::Wait(
            "PolicyMissing",
            format!("BackupPolicy {ns}/{policy_name} does not exist (yet)"),
        ));
    };
    // The store read: the policy's own, or its copy `spec.from` (the copy's store, Secret
    // and holds); the database side (its image, its claims) stays the policy's.
    let from = restore.spec.from.as_deref();
    let read_from = match from {
        None => policy.clone(),
        Some(c) => policy.as_copy(c).ok_or_else(|| {
            Stop::Refuse(
                "CopyMissing",
                format!(
                    "spec.from: BackupPolicy {ns}/{policy_name} names no copy {c:?} (spec.copies: {})",
                    policy.spec.copy_names()
                ),
            )
        })?,
    };
    let from_copy = from.map(|c| format!(" from copy {c}")).unwrap_or_default();
    if !ctx.capabilities.jobs {
        return Err(Stop::Refuse(
            "JobsRefused",
            crate::rbac::refused("a Restore", "jobs"),
        ));
    }
    let point = match target {
        Target::Newest => RestorePoint::Newest,
        Target::At(t) => RestorePoint::At(*t),
        Target::BackupId(id) => RestorePoint::Backup(id.clone()),
        Target::Backup(b) => {
            RestorePoint::Backup(backup_id_of(ctx, &ns, policy_name, b, from.is_some()).await?)
        }
    };
    let database = match crate::database::database_runtime(ctx, &policy).await {
        Ok(d) => d,
        Err(Error::Invalid(m)) => return Err(Stop::Refuse("DatabaseImageUnknown", m)),
        Err(Error::Missing(m)) => return Err(Stop::Wait("DatabaseImageUnknown", m)),
        Err(e) => return Err(e.into()),
    };
    let uid8 = crate::names::short_uid(restore);
    let job_name = job_name(&name, &uid8);
    let claim = match into {
        Destination::Existing { claim, .. } => claim.clone(),
        Destination::New(n) => n.name.clone(),
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = claims.get_opt(&claim).await.map_err(Error::from)?;
    match (into, &existing) {
        (Destination::Existing { .. }, None) => {
            return Err(Stop::Wait(
                "ClaimMissing",
                format!(
                    "PersistentVolumeClaim {ns}/{claim} does not exist (yet); the restore waits for it (or use spec.into.newClaim)"
                ),
            ));
        }
        (Destination::New(_), Some(c)) if c.labels().get(RESTORE_LABEL) != Some(&name) => {
            return Err(Stop::Refuse(
                "ClaimExists",
                format!(
                    "PersistentVolumeClaim {ns}/{claim} exists already; restore into it with spec.into.claim (and replaceData), or name a new one"
                ),
            ));
        }
        // An existing claim is written (and with replaceData wiped) only when it is the
        // policy's database's, or its owner said so: the right to create Restores is not
        // the right to overwrite any unused claim of the namespace.
        (Destination::Existing { .. }, Some(c)) => {
            let sets = crate::database::claim_templates(ctx, &policy)
                .await
                .map_err(Stop::from)?;
            if !claim_of_policy(&claim, c.labels(), policy_name, &sets) {
                return Err(Stop::Refuse(
                    "ClaimNotThePolicys",
                    format!(
                        "PersistentVolumeClaim {ns}/{claim} is not a claim of a StatefulSet spec.source of BackupPolicy {policy_name} selects (<template>-<statefulset>-<ordinal>), nor labelled {RESTORE_INTO_LABEL}={policy_name}: a Restore writes only its policy's database's claims, or one its owner labelled so"
                    ),
                ));
            }
        }
        _ => {}
    }
    claim_unused(ctx, &ns, &claim, &job_name).await?;
    set_scaled_down(ctx, &policy, &claim).await?;

    // Plan, under the store's lease: a pass holds it while it deletes, and reads the holds
    // once it has it — so what this plan chooses is held before any pass can delete it.
    let store = crate::stores::open(ctx, &read_from).await?;
    // One catalog in memory at a time beside the passes': a turn taken before the lease,
    // never waited for in a reconcile slot.
    let Ok(_turn) = ctx.catalog_turn.try_acquire() else {
        return Err(Stop::Wait(
            "Waiting",
            "another catalog is being read; the plan waits for its turn".into(),
        ));
    };
    let fence = match crate::fence::acquire(ctx, &store).await {
        Ok(f) => f,
        Err(e) if e.class() == tidemark_engine::Class::Contention => {
            return Err(Stop::Wait("Waiting", tidemark_engine::error::chain(&e)));
        }
        Err(e) => return Err(e.into()),
    };
    let plan = async {
        let plan = plan_of(&store, &point).await?;
        planned(status, &plan, &claim);
        status.phase = Some("Pending".into());
        set_ready(
            status,
            restore,
            false,
            "Planned",
            &format!(
                "restoring to {}{from_copy}; the backups it needs are held",
                plan.target
            ),
        );
        // From here on the backups are held (`restore:<name>`): in its status, and in the
        // store's record of holds, for deleters that have only the store (seed 000) — the
        // copy's store for a restore from a copy, whose own retention deletes there.
        write(api, restore, status).await?;
        let restores = crate::holds::read_restore_holds_in(ctx, &ns, policy_name, from).await?;
        let protect = crate::holds::holds(ctx, &ns, policy_name);
        tidemark_store::state::save_holds(
            &store,
            &crate::holds::writer(&ns, policy_name, from),
            &protect,
            &restores,
            tidemark_store::state::Gate::Keep,
        )
        .await
        .map_err(|e| Stop::from(Error::Engine(e.into())))?;
        Ok::<_, Stop>(plan)
    }
    .await;
    fence.release().await;
    let plan = plan?;
    // Another unfinished Restore planned into the same claim: the older goes first (both
    // plans are in status now, so two planned at once see each other).
    claim_not_restored_by_another(ctx, &ns, &claim, restore).await?;

    if let (Destination::New(n), None) = (into, &existing) {
        claims
            .create(&PostParams::default(), &new_claim(restore, n, &plan)?)
            .await
            .map_err(Error::from)?;
        tracing::info!(restore = %name, claim = %claim, "claim created");
        // A pod that was waiting for a claim of this name: not ours to write.
        claim_unused(ctx, &ns, &claim, &job_name).await?;
    }

    // Run: the Job's name first (a restart finds and follows it), then the Job.
    let store_secret = crate::stores::policy_secret_keys(ctx, &read_from).await?;
    let replace = matches!(
        into,
        Destination::Existing {
            replace_data: true,
            ..
        }
    );
    let args = args_of(&read_from, &plan, replace, &restore.spec)
        .map_err(|m| Stop::Refuse("InvalidSpec", m))?;
    let job = crate::consolidation::ToolJob {
        policy: &read_from,
        name: &job_name,
        label: JOB_POLICY_LABEL,
        container: "restore",
        args,
        database: &database,
        operator_image: &ctx.image,
        store_secret: store_secret.as_ref(),
        work: ("data", MOUNT),
        scratch_bytes: None,
        claim: Some(&claim),
        owner: crate::context::owner_ref(restore),
    }
    .job()
    .map_err(|m| Stop::Refuse("InvalidSpec", m))?;
    status.job = Some(job_name.clone());
    write(api, restore, status).await?;
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    match jobs.create(&PostParams::default(), &job).await {
        Ok(_) => {}
        // Ours from before a restart: followed. Another's of that name: refused.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let found = jobs.get(&job_name).await.map_err(Error::from)?;
            if !crate::context::owns(restore, &found.metadata) {
                return Err(Stop::Refuse(
                    "JobExists",
                    format!("Job {ns}/{job_name} exists and is not this Restore's"),
                ));
            }
        }
        Err(e) => return Err(Error::from(e).into()),
    }
    status.phase = Some("Running".into());
    status.started_at = Some(Time(ctx.clock.now()));
    let message = format!(
        "Job {job_name} restores {}{from_copy} into claim {claim}: {} backup(s), {} binlog segment(s)",
        plan.target,
        plan.backups.len(),
        plan.segments.len()
    );
    set_ready(status, restore, false, "Restoring", &message);
    write(api, restore, status).await?;
    ctx.event(
        &restore.object_ref(&()),
        EventType::Normal,
        "RestoreStarted",
        &message,
    )
    .await;
    Ok(())
}

/// The plan of a restore to `point` (the caller holds the catalog turn); what cannot be
/// restored refused for good.
async fn plan_of(
    store: &tidemark_store::ClusterStore,
    point: &RestorePoint,
) -> Result<RestorePlan, Stop> {
    let planned = async {
        let at = restore_instant(store, point).await?;
        MariaDbTools::default()
            .plan(store, at, None, &tidemark_store::NoProgress)
            .await
    };
    match planned.await {
        Ok(p) => Ok(p),
        Err(e)
            if matches!(
                e.class(),
                tidemark_engine::Class::NotRestorable | tidemark_engine::Class::Input
            ) =>
        {
            Err(Stop::Refuse(
                "NotRestorable",
                tidemark_engine::error::chain(&e),
            ))
        }
        Err(e) => Err(Stop::Err(e.into())),
    }
}

/// Refuses (`ClaimInUse`, naming the pod) when a pod other than those of the Job
/// `job_name` uses `claim`.
async fn claim_unused(ctx: &Context, ns: &str, claim: &str, job_name: &str) -> Result<(), Stop> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let listed: Vec<Pod> = crate::lean::list(&pods, &ListParams::default(), crate::lean::meta_of)
        .await
        .map_err(Error::from)?
        .into_iter()
        .filter(|p| p.labels().get("job-name").map(String::as_str) != Some(job_name))
        .collect();
    match crate::volumes::live_user(&listed, claim) {
        Some(pod) => Err(Stop::Refuse(
            "ClaimInUse",
            format!(
                "PersistentVolumeClaim {ns}/{claim} is used by pod {pod}; a restore writes only a claim no pod uses (scale the database down first)"
            ),
        )),
        None => Ok(()),
    }
}

/// Refuses while a pod other than the Job's uses `claim` (`ClaimInUse`) or a StatefulSet
/// of the Restore's policy asks for the pod that mounts it (`StatefulSetScaledUp`).
async fn still_alone(
    ctx: &Context,
    restore: &Restore,
    claim: &str,
    job_name: &str,
) -> Result<(), Stop> {
    let ns = restore.namespace().unwrap_or_default();
    claim_unused(ctx, &ns, claim, job_name).await?;
    match policy_of(ctx, restore).await {
        Some(p) => set_scaled_down(ctx, &p, claim).await,
        None => Ok(()),
    }
}

/// The Restore's BackupPolicy, when it can be read.
async fn policy_of(ctx: &Context, restore: &Restore) -> Option<BackupPolicy> {
    let ns = restore.namespace().unwrap_or_default();
    let policies: Api<BackupPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    policies
        .get_opt(&restore.spec.policy.name)
        .await
        .ok()
        .flatten()
}

/// Refuses (`StatefulSetScaledUp`) while a StatefulSet of the policy's source asks for the
/// pod that mounts `claim` (its replicas reach that pod's ordinal): before the restore, and
/// while its Job runs — something (a GitOps sync, an autoscaler, a person) scaled the
/// database back up, and its pod would start on a claim whose data is being replaced.
async fn set_scaled_down(ctx: &Context, policy: &BackupPolicy, claim: &str) -> Result<(), Stop> {
    let sets = crate::database::policy_sets(ctx, policy)
        .await
        .map_err(Stop::from)?;
    for set in &sets {
        let Some(ordinal) = set.ordinal_of(claim) else {
            continue;
        };
        if set.asks_for(ordinal) {
            return Err(Stop::Refuse(
                "StatefulSetScaledUp",
                format!(
                    "StatefulSet {}/{} asks for {} replica(s), so its pod {}-{ordinal} would mount {claim} while it is restored: scale it to {} or fewer for the whole restore, and pause whatever scales it back (Argo CD auto-sync, Flux, an autoscaler: docs/operator.md, \"Restoring in place\")",
                    policy.namespace().unwrap_or_default(),
                    set.name,
                    set.replicas,
                    set.name,
                    (ordinal - set.start).max(0)
                ),
            ));
        }
    }
    Ok(())
}

/// Waits (`ClaimBusy`) while an older unfinished Restore of the namespace has planned
/// into `claim`: two Jobs never write one claim at once.
async fn claim_not_restored_by_another(
    ctx: &Context,
    ns: &str,
    claim: &str,
    restore: &Restore,
) -> Result<(), Stop> {
    let api: Api<Restore> = Api::namespaced(ctx.client.clone(), ns);
    let all = crate::lean::list(&api, &ListParams::default(), crate::lean::meta_of)
        .await
        .map_err(Error::from)?;
    let order = |r: &Restore| {
        (
            r.meta().creation_timestamp.clone().map(|t| t.0),
            r.name_any(),
        )
    };
    let older = all.iter().find(|o| {
        o.meta().uid != restore.meta().uid
            && o.status
                .as_ref()
                .is_some_and(|s| !s.finished() && s.claim.as_deref() == Some(claim))
            && order(o) < order(restore)
    });
    match older {
        Some(o) => Err(Stop::Wait(
            "ClaimBusy",
            format!(
                "Restore {} restores into PersistentVolumeClaim {ns}/{claim}; this one waits until it ends",
                o.name_any()
            ),
        )),
        None => Ok(()),
    }
}

/// The backup-id of the Backup object `name` of `policy`, once it has completed.
/// The backup-id a Restore naming the Backup object `name` restores: its own, or, when the
/// policy's retention removed its data, the synthetic full that holds its point now — except
/// from a copy (`from_copy`), which keeps its own data by its own rules: there the backup's
/// own id (the copy's plan refuses it if the copy does not hold it).
async fn backup_id_of(
    ctx: &Context,
    ns: &str,
    policy: &str,
    name: &str,
    from_copy: bool,
) -> Result<String, Stop> {
    let backups: Api<Backup> = Api::namespaced(ctx.client.clone(), ns);
    let Some(b) = backups.get_opt(name).await.map_err(Error::from)? else {
        return Err(Stop::Refuse(
            "BackupMissing",
            format!("Backup {ns}/{name} does not exist"),
        ));
    };
    if b.spec.template.policy.name != policy {
        return Err(Stop::Refuse(
            "BackupMissing",
            format!(
                "Backup {ns}/{name} belongs to BackupPolicy {}, not {policy}",
                b.spec.template.policy.name
            ),
        ));
    }
    let s = b.status.as_ref();
    if from_copy {
        return match (
            s.and_then(|s| s.backup_id.clone()),
            s.and_then(|s| s.phase.as_ref()),
        ) {
            (Some(id), Some(tidemark_api::crd::BackupPhase::Completed)) => Ok(id),
            (_, Some(tidemark_api::crd::BackupPhase::Failed)) => Err(Stop::Refuse(
                "BackupMissing",
                format!("Backup {ns}/{name} failed: there is nothing to restore"),
            )),
            _ => Err(Stop::Wait(
                "BackupNotReady",
                format!("Backup {ns}/{name} has not completed yet"),
            )),
        };
    }
    // A backup whose data a synthetic full holds now restores from that full.
    let replaced = s
        .and_then(|s| s.data_removed.as_ref())
        .and_then(|r| r.replaced_by.as_ref())
        .map(|r| r.backup_id.clone());
    if s.and_then(|s| s.data_removed.as_ref()).is_some() && replaced.is_none() {
        return Err(Stop::Refuse(
            "BackupMissing",
            format!("the data of Backup {ns}/{name} was removed by retention"),
        ));
    }
    match (
        replaced,
        s.and_then(|s| s.backup_id.clone()),
        s.and_then(|s| s.phase.as_ref()),
    ) {
        (Some(id), _, _) => Ok(id),
        (None, Some(id), Some(tidemark_api::crd::BackupPhase::Completed)) => Ok(id),
        (None, _, Some(tidemark_api::crd::BackupPhase::Failed)) => Err(Stop::Refuse(
            "BackupMissing",
            format!("Backup {ns}/{name} failed: there is nothing to restore"),
        )),
        _ => Err(Stop::Wait(
            "BackupNotReady",
            format!("Backup {ns}/{name} has not completed yet"),
        )),
    }
}

/// The plan in status (pure): the instant, the backups, the segments and their timelines,
/// the bytes to download, the claim.
pub(crate) fn planned(status: &mut RestoreStatus, plan: &RestorePlan, claim: &str) {
    status.target = Some(Time(plan.target));
    status.backups = plan.backups.iter().map(|m| m.backup_id.clone()).collect();
    status.segments = Some(plan.segments.len() as u64);
    let mut timelines: Vec<u32> = plan.segments.iter().map(|s| s.timeline).collect();
    timelines.sort_unstable();
    timelines.dedup();
    status.timelines = timelines;
    let backup_bytes = plan
        .backups
        .iter()
        .flat_map(|m| m.payload.iter())
        .map(|p| p.size)
        .fold(0u64, u64::saturating_add);
    let segment_bytes = plan
        .segments
        .iter()
        .map(|s| s.size)
        .fold(0u64, u64::saturating_add);
    status.bytes = Some(backup_bytes.saturating_add(segment_bytes));
    status.claim = Some(claim.to_owned());
}

/// What the Job reported in status (pure; bounded as the summary is).
pub(crate) fn reported(status: &mut RestoreStatus, summary: &RestoreSummary) {
    status.bytes_downloaded = Some(summary.bytes_downloaded);
    status.reached = summary.reached.map(Time);
    status.oracle_chunks = summary.oracle_chunks;
    status.oracle_differences = summary
        .oracle_differences
        .iter()
        .take(tidemark_engine::restore::MAX_ORACLE_DIFFERENCES)
        .map(|d| tidemark_engine::restore::bounded_text(d, tidemark_engine::restore::MAX_STEP_NAME))
        .collect();
    status.gtid_position = summary
        .gtid_position
        .clone()
        .filter(|p| tidemark_engine::restore::is_gtid_position(p));
    status.steps = summary
        .steps
        .iter()
        .take(tidemark_engine::restore::MAX_SUMMARY_STEPS)
        .map(|s| tidemark_api::restore::RestoreStep {
            name: s
                .name
                .chars()
                .take(tidemark_engine::restore::MAX_STEP_NAME)
                .collect(),
            milliseconds: s.milliseconds,
            bytes: (s.bytes > 0).then_some(s.bytes),
        })
        .collect();
}

/// The size of a claim for `plan` (pure): the chain's content (each payload's original
/// size), the binlogs replayed into it (five times their stored size, as compressed ones
/// grow), a quarter more for the server's own files, at least 1 GiB, in whole GiB.
pub(crate) fn claim_bytes(plan: &RestorePlan) -> u64 {
    let content = plan
        .backups
        .iter()
        .flat_map(|m| m.payload.iter())
        .map(|p| p.original_size.unwrap_or(p.size))
        .fold(0u64, u64::saturating_add);
    let binlogs = plan
        .segments
        .iter()
        .map(|s| s.size.saturating_mul(5))
        .fold(0u64, u64::saturating_add);
    let need = content.saturating_add(binlogs);
    let padded = need.saturating_add(need / 4).max(MIN_CLAIM);
    padded.div_ceil(1 << 30).saturating_mul(1 << 30)
}

/// Whether a Restore of `policy` may write the existing claim `name` (pure): a claim of a
/// StatefulSet the policy's source selects — `<template>-<set>-<ordinal>`, `sets` giving
/// each such set's name and its claim templates' names — or one labelled
/// [`RESTORE_INTO_LABEL`]` = <policy>` by its owner.
pub(crate) fn claim_of_policy(
    name: &str,
    labels: &std::collections::BTreeMap<String, String>,
    policy: &str,
    sets: &[(String, Vec<String>)],
) -> bool {
    if labels.get(RESTORE_INTO_LABEL).map(String::as_str) == Some(policy) {
        return true;
    }
    sets.iter().any(|(set, templates)| {
        templates.iter().any(|t| {
            name.strip_prefix(&format!("{t}-{set}-"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

/// The claim a Restore creates: labelled with it, not owned by it (the data outlives the
/// Restore), sized as asked or by [`claim_bytes`] — at most [`MAX_AUTO_CLAIM`] (refused
/// beyond, asking for a size: the store's numbers are not trusted with a volume's cost).
fn new_claim(
    restore: &Restore,
    n: &NewClaim,
    plan: &RestorePlan,
) -> Result<PersistentVolumeClaim, Stop> {
    let size = match &n.size {
        Some(s) => s.clone(),
        None => {
            let bytes = claim_bytes(plan);
            if bytes > MAX_AUTO_CLAIM {
                return Err(Stop::Refuse(
                    "ClaimTooLarge",
                    format!(
                        "the store's recorded sizes ask for a claim of {} GiB, more than the {} GiB a Restore sizes by itself; give spec.into.newClaim.size",
                        bytes >> 30,
                        MAX_AUTO_CLAIM >> 30
                    ),
                ));
            }
            bytes.to_string()
        }
    };
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {
            "name": n.name,
            "namespace": restore.namespace(),
            "labels": pod::labels(RESTORE_LABEL, &restore.name_any()),
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": n.storage_class_name,
            "resources": {"requests": {"storage": Quantity(size)}},
        },
    }))
    .map_err(|e| Stop::Err(Error::Internal(e.to_string())))?;
    Ok(claim)
}

/// The Job's shell. It refuses a claim that holds data unless it is to be replaced,
/// restores into `.tidemark-restore/data` on the claim (removed if the restore fails or
/// the pod is stopped), and only then swaps: the old entries are renamed aside (one
/// filesystem), the new ones renamed into place, and a rename that fails puts the old data
/// back. The swap ignores SIGTERM (a deleted Job's pod finishes it: renames take
/// milliseconds), and records its phase on the claim: a swap cut short by a lost node is
/// rolled back (old entries still being moved aside) or finished (new ones being moved in)
/// by the next restore into the claim, before anything else. Entries are found whatever
/// their names (hidden ones, dangling links); `lost+found` stays. The summary of
/// `tidemark restore --report-file` becomes the termination message only at the end, so a
/// failure says its own words.
pub const SCRIPT: &str = r#"set -eu
root="${TIDEMARK_RESTORE_ROOT:-/restore}"
bin="${TIDEMARK_RESTORE_BIN:-/tidemark-bin/tidemark}"
log="${TIDEMARK_TERMINATION_LOG:-/dev/termination-log}"
aside="$root/.tidemark-restore"
replace="$1"
shift
# move_all FROM TO: every entry of FROM but ours and lost+found, whatever its name.
move_all() {
  for f in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    { [ -e "$f" ] || [ -L "$f" ]; } || continue
    case "${f##*/}" in .tidemark-restore|lost+found) ;; *) mv "$f" "$2/" || return 1 ;; esac
  done
}
case "$(cat "$aside/phase" 2>/dev/null || true)" in
  into)
    echo "an earlier swap was cut short while moving the restored data in: finishing it" >&2
    move_all "$aside/data" "$root"
    rm -rf "$aside" ;;
  *)
    # Cut while moving the old data aside (or the phase never written): put it back.
    if [ -d "$aside/old" ]; then
      echo "an earlier swap was cut short while moving the old data aside: putting it back" >&2
      move_all "$aside/old" "$root"
    fi
    rm -rf "$aside" ;;
esac
held=""
for f in "$root"/* "$root"/.[!.]* "$root"/..?*; do
  { [ -e "$f" ] || [ -L "$f" ]; } || continue
  case "${f##*/}" in .tidemark-restore|lost+found) ;; *) held="$held ${f##*/}" ;; esac
done
if [ -n "$held" ] && [ "$replace" != true ]; then
  echo "the claim holds data ($held ); set spec.into.replaceData: true to replace it" | tee "$log" >&2
  exit 3
fi
rm -rf "$aside"
mkdir -p "$aside"
child=""
stopped() {
  trap - EXIT
  if [ "$$" = 1 ]; then kill -KILL -1 2>/dev/null || true; elif [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  sleep 1
  rm -rf "$aside" 2>/dev/null || { sleep 3; rm -rf "$aside" || true; }
  echo "stopped before the restored data was moved into place; the claim's data is as it was" | tee "$log" >&2
  exit 143
}
trap 'rm -rf "$aside"' EXIT
trap stopped TERM INT
"$bin" restore "$@" --datadir "$aside/data" --report-file /tmp/restore-report.json &
child=$!
wait "$child"
if [ "$(id -u)" = 0 ] && id mysql >/dev/null 2>&1; then
  chown -R mysql:mysql "$aside/data"
fi
# On disk before the swap, so that what follows takes milliseconds.
sync
# The swap: not stopped by SIGTERM, its phase on the claim for the next restore to mend.
trap '' TERM INT
trap - EXIT
mkdir "$aside/old"
back() {
  if move_all "$root" "$aside/data" && move_all "$aside/old" "$root"; then
    rm -rf "$aside"
    echo "could not move the restored data into place; the claim's data was put back" | tee "$log" >&2
  else
    phase aside
    echo "could not move the restored data into place, nor all of the old data back: the rest is in .tidemark-restore/old, which the next restore into this claim puts back first" | tee "$log" >&2
  fi
  exit 1
}
phase() { echo "$1" > "$aside/phase.new" && mv "$aside/phase.new" "$aside/phase" && sync; }
phase aside
if ! move_all "$root" "$aside/old"; then
  if move_all "$aside/old" "$root"; then
    rm -rf "$aside"
    echo "could not move the claim's data aside; it was put back" | tee "$log" >&2
  else
    echo "could not move the claim's data aside, nor all of it back: the rest is in .tidemark-restore/old, which the next restore into this claim puts back first" | tee "$log" >&2
  fi
  exit 1
fi
phase into
move_all "$aside/data" "$root" || back
rm -rf "$aside" || echo "warning: the old data could not all be removed from .tidemark-restore/old" >&2
cat /tmp/restore-report.json > "$log" || true
echo "restored into the claim"
"#;

/// The Job's arguments: [`SCRIPT`], then `tidemark restore`'s for the planned instant.
///
/// # Errors
/// The policy has no object store.
pub fn args_of(
    policy: &BackupPolicy,
    plan: &RestorePlan,
    replace: bool,
    spec: &tidemark_api::restore::RestoreSpec,
) -> Result<Vec<String>, String> {
    let mut args = vec![SCRIPT.to_owned(), "restore".to_owned(), replace.to_string()];
    args.extend(pod::store_args(policy)?);
    // The instant exactly as planned (with its fraction): the same backups.
    args.push(format!("--to={}", plan.target));
    if spec.require_oracle {
        args.push("--require-oracle".into());
    }
    if let Some(how) = tidemark_api::policy::replay_of("spec.replay", spec.replay.as_deref())
        .map_err(|e| e.to_string())?
    {
        args.push(format!("--replay={how}"));
    }
    Ok(args)
}

/// Follows the Job of a running restore to its end.
async fn follow(
    ctx: &Context,
    api: &Api<Restore>,
    restore: &Restore,
    mut status: RestoreStatus,
    job_name: &str,
    target: &Target,
    into: &Destination,
) -> Result<Requeue, Error> {
    let ns = restore.namespace().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let job = match jobs.get_opt(job_name).await? {
        Some(j) if crate::context::owns(restore, &j.metadata) => j,
        // Named, never made (the operator stopped in between): started now.
        None if status.phase.as_deref() != Some("Running") => {
            status.job = None;
            return start(ctx, api, restore, status, target, into).await;
        }
        _ => {
            return refuse(
                ctx,
                api,
                restore,
                status,
                "RestoreFailed",
                &format!("Job {job_name} was deleted before it ended"),
            )
            .await;
        }
    };
    let ended = crate::restoretest::ended(&job);
    if ended.is_some() {
        // Kept, for when the Job is gone (`kubectl tidemark logs restore NAME`).
        status.log_tail = pod::job_log_tail(&ctx.client, &job).await;
    }
    match ended {
        None => {
            // A pod that started on the claim meanwhile: the Job stops before it swaps
            // the data directory under that pod.
            let claim = status.claim.clone().unwrap_or_default();
            if let Err(Stop::Refuse(reason, message)) =
                still_alone(ctx, restore, &claim, job_name).await
            {
                let _ = jobs
                    .delete(job_name, &kube::api::DeleteParams::foreground())
                    .await;
                return refuse(ctx, api, restore, status, reason, &message).await;
            }
            Ok(Requeue::requeue(POLL))
        }
        Some(true) => {
            let why = pod::job_failure(&ctx.client, &job)
                .await
                .unwrap_or_else(|| "its pod's log says why".into());
            refuse(
                ctx,
                api,
                restore,
                status,
                "RestoreFailed",
                &format!("Job {job_name} failed: {why}"),
            )
            .await
        }
        Some(false) => {
            // Scaled up (or a pod started) between the last look and the Job's end: the
            // data is the restored one, but a pod may have started on the claim while it
            // was replaced. Said, not called a success.
            let claim = status.claim.clone().unwrap_or_default();
            if let Err(Stop::Refuse(reason, message)) =
                still_alone(ctx, restore, &claim, job_name).await
            {
                let message = format!(
                    "{message}; the Job had finished: the claim holds the restored data, but a pod may have started on it while it was replaced — restart that pod before trusting it"
                );
                return refuse(ctx, api, restore, status, reason, &message).await;
            }
            let now = ctx.clock.now();
            status.phase = Some("Succeeded".into());
            status.completed_at = Some(Time(now));
            // What the Job reported of its steps (its termination message).
            if let Some(summary) = pod::job_report(&ctx.client, &job, "restore")
                .await
                .and_then(|m| serde_json::from_str::<RestoreSummary>(&m).ok())
            {
                reported(&mut status, &summary);
            }
            let message = format!(
                "restored {}{} into claim {}: backups {}, {} binlog segment(s){}",
                status
                    .target
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
                status
                    .reached
                    .as_ref()
                    .map(|t| format!(" (the last transaction applied: {})", t.0))
                    .unwrap_or_default(),
                status.claim.as_deref().unwrap_or_default(),
                status.backups.join(", "),
                status.segments.unwrap_or(0),
                status
                    .started_at
                    .as_ref()
                    .map(|s| format!(", in {}s", now.duration_since(s.0).as_secs()))
                    .unwrap_or_default()
            );
            set_ready(&mut status, restore, true, "Restored", &message);
            write(api, restore, &status).await?;
            let took = status
                .started_at
                .as_ref()
                .map_or(0, |s| now.duration_since(s.0).as_secs());
            ctx.metrics
                .restore_ended(&policy_labels(restore), Some(took));
            // A mark an earlier attempt of the same name left no longer holds.
            if let Some(claim) = &status.claim {
                annotate(ctx, restore, claim, None).await;
            }
            ctx.event(
                &restore.object_ref(&()),
                EventType::Normal,
                "RestoreSucceeded",
                &message,
            )
            .await;
            Ok(Requeue::await_change())
        }
    }
}

/// Ends `restore` as `Failed` with `reason` and `message` (status, a Warning event); a
/// claim it created is annotated as holding no usable data.
async fn refuse(
    ctx: &Context,
    api: &Api<Restore>,
    restore: &Restore,
    mut status: RestoreStatus,
    reason: &'static str,
    message: &str,
) -> Result<Requeue, Error> {
    status.phase = Some("Failed".into());
    status.completed_at = Some(Time(ctx.clock.now()));
    set_ready(&mut status, restore, false, reason, message);
    write(api, restore, &status).await?;
    ctx.metrics.restore_ended(&policy_labels(restore), None);
    ctx.warn(&restore.object_ref(&()), reason, message).await;
    // Only a claim its Job may have written (a refusal before the Job touched nothing).
    if let (Some(claim), Some(_)) = (&status.claim, &status.job) {
        mark_unusable(ctx, restore, claim, reason, message).await;
    }
    Ok(Requeue::await_change())
}

/// The metrics' labels of the Restore's policy.
fn policy_labels(restore: &Restore) -> crate::metrics::PolicyLabels {
    crate::metrics::Metrics::policy(
        &restore.namespace().unwrap_or_default(),
        &restore.spec.policy.name,
    )
}

/// Annotates `claim`, if this Restore created it, with why it holds no usable data.
async fn mark_unusable(ctx: &Context, restore: &Restore, claim: &str, reason: &str, message: &str) {
    let note: String = format!("{reason}: {message}").chars().take(512).collect();
    annotate(ctx, restore, claim, Some(note)).await;
}

/// Sets (or, with `None`, removes) [`UNUSABLE_ANNOTATION`] on `claim`, if this Restore
/// created it.
async fn annotate(ctx: &Context, restore: &Restore, claim: &str, note: Option<String>) {
    let ns = restore.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let Ok(Some(c)) = claims.get_opt(claim).await else {
        return;
    };
    if c.labels().get(RESTORE_LABEL) != Some(&restore.name_any()) {
        return;
    }
    if note.is_none() && !c.annotations().contains_key(UNUSABLE_ANNOTATION) {
        return;
    }
    let patch = json!({"metadata": {"annotations": {UNUSABLE_ANNOTATION: note}}});
    if let Err(e) = claims
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(claim = %claim, "could not mark the claim unusable: {e}");
    }
}

fn set_ready(
    status: &mut RestoreStatus,
    restore: &Restore,
    ready: bool,
    reason: &str,
    message: &str,
) {
    status.conditions = vec![crate::status::condition(
        &status.conditions,
        "Ready",
        ready,
        reason,
        message,
        restore.meta().generation,
    )];
}

/// A bounded reason for an error that stops a restore for now.
fn reason_of(e: &Error) -> &'static str {
    if tidemark_store::error::access_denied(e) {
        return "StoreAccessDenied";
    }
    match e {
        Error::Missing(_) => "Waiting",
        Error::Kube(_) => "KubernetesUnavailable",
        _ => "StoreUnavailable",
    }
}

async fn write(api: &Api<Restore>, restore: &Restore, status: &RestoreStatus) -> Result<(), Error> {
    let mut status = status.clone();
    status.observed_generation = restore.meta().generation;
    crate::status::apply(
        api,
        &restore.name_any(),
        crate::status::FIELD_MANAGER,
        serde_json::to_value(&status).unwrap_or_default(),
    )
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tidemark_store::format::{Metadata, PayloadObject};

    fn plan(payload: &[(u64, Option<u64>)], segments: &[(u64, u32)]) -> RestorePlan {
        let mut m: Metadata = serde_json::from_value(json!({
            "formatVersion": 1, "backupId": "20261127T000000Z", "backupName": "nightly",
            "cluster": "c", "method": "mariabackup", "type": "full", "phase": "completed",
            "startedAt": "2026-11-27T00:00:00Z", "completedAt": "2026-11-27T00:10:00Z",
            "payload": [],
        }))
        .unwrap();
        m.payload = payload
            .iter()
            .enumerate()
            .map(|(i, (size, original))| PayloadObject {
                name: format!("p{i}"),
                size: *size,
                sha256: String::new(),
                compression: None,
                original_size: *original,
                encryption: None,
            })
            .collect();
        RestorePlan {
            target: "2026-11-27T01:00:00Z".parse().unwrap(),
            backups: vec![m],
            segments: segments
                .iter()
                .map(
                    |(size, timeline)| tidemark_mariadb::restore::ReplaySegment {
                        name: "mysql-bin.000001".into(),
                        size: *size,
                        sha256: None,
                        compression: None,
                        encryption: None,
                        first_event_at: None,
                        last_event_at: None,
                        timeline: *timeline,
                        server_id: None,
                        file: None,
                    },
                )
                .collect(),
            start_position: None,
            runs: Vec::new(),
            stop_datetime: None,
            recovery_window: tidemark_core::RecoveryWindow {
                from: "2026-11-27T00:10:00Z".parse().unwrap(),
                to: "2026-11-27T02:00:00Z".parse().unwrap(),
                gaps: Vec::new(),
                point_in_time_from: "2026-11-27T00:10:00Z".parse().unwrap(),
            },
        }
    }

    /// A created claim holds the chain's content, its binlogs grown, and room to spare.
    #[test]
    fn a_new_claim_is_sized_from_the_chain() {
        let gib = 1u64 << 30;
        let cases = [
            ("tiny", plan(&[(1000, None)], &[]), gib),
            (
                "content, not the compressed size",
                plan(&[(gib, Some(4 * gib))], &[]),
                5 * gib,
            ),
            (
                "binlogs five times",
                plan(&[(gib, None)], &[(gib, 0)]),
                8 * gib,
            ),
        ];
        for (name, p, want) in cases {
            assert_eq!(claim_bytes(&p), want, "{name}");
        }
    }

    /// Issue 42 §6: a size computed from the store's numbers is bounded; past the bound
    /// the Restore asks for a size, and a size given is taken as it is.
    #[test]
    fn a_new_claims_automatic_size_is_bounded() {
        let restore: Restore = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Restore",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {"policy": {"name": "db"}, "into": {"newClaim": {"name": "c"}}},
        }))
        .unwrap();
        let huge = plan(&[(1, Some(u64::MAX / 2))], &[]);
        let auto = NewClaim {
            name: "c".into(),
            size: None,
            storage_class_name: None,
        };
        match new_claim(&restore, &auto, &huge) {
            Err(Stop::Refuse("ClaimTooLarge", m)) => {
                assert!(m.contains("spec.into.newClaim.size"), "{m}")
            }
            Err(_) => panic!("refused otherwise"),
            Ok(_) => panic!("a claim sized past the bound"),
        }
        let given = NewClaim {
            size: Some("3Ti".into()),
            ..auto.clone()
        };
        assert!(new_claim(&restore, &given, &huge).is_ok());
        assert!(new_claim(&restore, &auto, &plan(&[(1000, None)], &[])).is_ok());
    }

    /// Issue 42 §6: an existing claim is a Restore's to write only when it is one of the
    /// policy's StatefulSets' claims, or its owner labelled it for the policy.
    #[test]
    fn only_the_policys_claims_are_written() {
        let sets = [("db".to_owned(), vec!["data".to_owned(), "logs".to_owned()])];
        let none = std::collections::BTreeMap::new();
        let labelled: std::collections::BTreeMap<String, String> =
            [(RESTORE_INTO_LABEL.to_owned(), "shop".to_owned())].into();
        let cases = [
            ("data-db-0", &none, true),
            ("logs-db-12", &none, true),
            ("data-db-", &none, false),
            ("data-db-0x", &none, false),
            ("data-db2-0", &none, false),
            ("other", &none, false),
            ("other", &labelled, true),
        ];
        for (name, labels, want) in cases {
            assert_eq!(claim_of_policy(name, labels, "shop", &sets), want, "{name}");
        }
        // Labelled for another policy: not this one's.
        assert!(!claim_of_policy("other", &labelled, "db", &sets));
    }

    /// The status names what the restore uses: the backups (its holds), the segments, the
    /// timelines they are on, the bytes to download.
    #[test]
    fn the_plan_goes_to_status() {
        let p = plan(
            &[(100, Some(400)), (50, None)],
            &[(10, 0), (20, 1), (30, 1)],
        );
        let mut s = RestoreStatus::default();
        planned(&mut s, &p, "data-db-0");
        assert_eq!(s.backups, ["20261127T000000Z"]);
        assert_eq!(s.segments, Some(3));
        assert_eq!(s.timelines, [0, 1]);
        assert_eq!(s.bytes, Some(210));
        assert_eq!(s.claim.as_deref(), Some("data-db-0"));
        assert_eq!(s.target.unwrap().0.to_string(), "2026-11-27T01:00:00Z");
    }

    /// The Job restores the planned instant exactly, with the store's settings, into the
    /// claim through the script that moves the data into place last; `requireOracle` asks
    /// it to keep only data the restore oracle proves; `replay` picks how binlogs replay
    /// (none: the command's default, the applier).
    #[test]
    fn the_job_restores_the_planned_instant() {
        let policy: BackupPolicy = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
            "metadata": {"name": "shop", "namespace": "ns", "uid": "0123"},
            "spec": {"objectStore": {"bucket": "b", "endpoint": "http://s3:8333"}},
        }))
        .unwrap();
        let mut p = plan(&[(1, None)], &[]);
        p.target = "2026-11-27T01:00:00.123456789Z".parse().unwrap();
        let spec = |v: serde_json::Value| -> tidemark_api::restore::RestoreSpec {
            let mut s = json!({"policy": {"name": "shop"}, "into": {"claim": "data-db-0"}});
            s.as_object_mut()
                .unwrap()
                .extend(v.as_object().unwrap().clone());
            serde_json::from_value(s).unwrap()
        };
        let plain = args_of(&policy, &p, true, &spec(json!({}))).unwrap();
        assert!(!plain.contains(&"--require-oracle".to_owned()));
        assert!(
            !plain.iter().any(|a| a.starts_with("--replay")),
            "{plain:?}"
        );
        let args = args_of(&policy, &p, true, &spec(json!({"requireOracle": true}))).unwrap();
        assert!(args.contains(&"--require-oracle".to_owned()), "{args:?}");
        let client = args_of(&policy, &p, true, &spec(json!({"replay": "client"}))).unwrap();
        assert!(client.contains(&"--replay=client".to_owned()), "{client:?}");
        let wrong = args_of(&policy, &p, true, &spec(json!({"replay": "fast"}))).unwrap_err();
        assert!(
            wrong.contains("spec.replay") && wrong.contains("applier or client"),
            "{wrong}"
        );
        assert_eq!(args[0], SCRIPT);
        assert_eq!(args[1..3], ["restore", "true"]);
        assert!(
            args.contains(&"--to=2026-11-27T01:00:00.123456789Z".to_owned()),
            "{args:?}"
        );
        assert!(
            args.windows(2).any(|w| w == ["--cluster", "shop"]),
            "{args:?}"
        );
        assert_eq!(
            job_name(
                "a-very-long-restore-name-that-goes-on-and-on-and-on",
                "0123abcd"
            ),
            "a-very-long-restore-name-that-goes-on-an-0123abcd-restore"
        );
    }
}

/// The Job's shell run here with `sh`, a stand-in for `tidemark restore`, on a directory
/// playing the claim.
#[cfg(test)]
mod script_tests {
    #![allow(clippy::unwrap_used)]
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};

    struct Claim {
        dir: PathBuf,
    }

    impl Claim {
        fn new(name: &str) -> Claim {
            let dir = std::env::temp_dir().join(format!(
                "tidemark-restore-script-{name}-{}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("root/lost+found")).unwrap();
            // The stand-in: writes a data directory, or fails, or hangs, as told.
            std::fs::write(
                dir.join("tidemark"),
                "#!/bin/sh\nfor a; do case \"$a\" in --datadir|--report-file) next=$a ;; *) case \"${next:-}\" in --datadir) d=\"$a\" ;; --report-file) r=\"$a\" ;; esac; next= ;; esac; done\n\
                 mkdir -p \"$d\" && echo new > \"$d/ibdata1\" && mkdir \"$d/mysql\" && echo x > \"$d/.hidden\"\n\
                 case \"$MODE\" in fail) echo boom >&2; exit 8 ;; hang) sleep 30 ;; esac\n\
                 echo '{\"bytesDownloaded\":1}' > \"$r\"; exit 0\n",
            )
            .unwrap();
            Command::new("chmod")
                .arg("+x")
                .arg(dir.join("tidemark"))
                .status()
                .unwrap();
            Claim { dir }
        }
        fn root(&self) -> PathBuf {
            self.dir.join("root")
        }
        fn run(&self, replace: bool, mode: &str) -> std::process::Child {
            Command::new("sh")
                .arg("-c")
                .arg(super::SCRIPT)
                .arg("restore")
                .arg(replace.to_string())
                .arg("--to=2026-11-27T00:00:00Z")
                .env("TIDEMARK_RESTORE_ROOT", self.root())
                .env("TIDEMARK_RESTORE_BIN", self.dir.join("tidemark"))
                .env("TIDEMARK_TERMINATION_LOG", self.dir.join("termination-log"))
                .env("MODE", mode)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        }
        fn exit(&self, replace: bool, mode: &str) -> i32 {
            self.run(replace, mode).wait().unwrap().code().unwrap_or(-1)
        }
        fn entries(&self) -> Vec<String> {
            entries(&self.root())
        }
        fn said(&self) -> String {
            std::fs::read_to_string(self.dir.join("termination-log")).unwrap_or_default()
        }
    }

    impl Drop for Claim {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn old_data(root: &Path) {
        std::fs::write(root.join("ibdata1"), "old").unwrap();
        std::fs::write(root.join(".old-hidden"), "old").unwrap();
        std::fs::write(root.join("name\nwith newline"), "old").unwrap();
        std::os::unix::fs::symlink("/nonexistent", root.join("dangling")).unwrap();
    }

    const OLD: [&str; 5] = [
        ".old-hidden",
        "dangling",
        "ibdata1",
        "lost+found",
        "name\nwith newline",
    ];
    const NEW: [&str; 4] = [".hidden", "ibdata1", "lost+found", "mysql"];

    #[test]
    fn the_claims_data_is_replaced_only_whole() {
        // Replaced: only the new entries are left (lost+found stays), nothing aside.
        let c = Claim::new("replace");
        old_data(&c.root());
        assert_eq!(c.exit(true, "ok"), 0, "{}", c.said());
        assert_eq!(c.entries(), NEW);
        assert_eq!(
            std::fs::read_to_string(c.root().join("ibdata1")).unwrap(),
            "new\n"
        );

        // Data there and not to be replaced: refused, untouched.
        let c = Claim::new("refuse");
        old_data(&c.root());
        assert_eq!(c.exit(false, "ok"), 3);
        assert!(c.said().contains("replaceData"), "{}", c.said());
        assert_eq!(c.entries(), OLD);

        // The restore fails: the old data as it was, nothing aside.
        let c = Claim::new("fail");
        old_data(&c.root());
        assert_eq!(c.exit(true, "fail"), 8);
        assert_eq!(c.entries(), OLD);
        assert_eq!(
            std::fs::read_to_string(c.root().join("ibdata1")).unwrap(),
            "old"
        );
    }

    #[test]
    fn a_stopped_job_leaves_the_claim_as_it_was() {
        let c = Claim::new("stopped");
        old_data(&c.root());
        let mut child = c.run(true, "hang");
        // Until the stand-in has written its data directory aside.
        let aside = c.root().join(".tidemark-restore/data/ibdata1");
        for _ in 0..100 {
            if aside.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(aside.exists(), "the restore never started");
        Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert_eq!(child.wait().unwrap().code(), Some(143));
        assert!(c.said().contains("as it was"), "{}", c.said());
        assert_eq!(c.entries(), OLD);
    }

    #[test]
    fn a_swap_cut_short_is_mended_by_the_next_restore() {
        // Cut while moving the old data aside: the next run puts it back first (and,
        // not replacing, refuses with the old data whole).
        let c = Claim::new("cut-aside");
        old_data(&c.root());
        let aside = c.root().join(".tidemark-restore");
        std::fs::create_dir_all(aside.join("old")).unwrap();
        std::fs::create_dir_all(aside.join("data")).unwrap();
        std::fs::write(aside.join("data/ibdata1"), "new").unwrap();
        std::fs::rename(c.root().join("ibdata1"), aside.join("old/ibdata1")).unwrap();
        std::fs::rename(c.root().join("dangling"), aside.join("old/dangling")).unwrap();
        std::fs::write(aside.join("phase"), "aside\n").unwrap();
        assert_eq!(c.exit(false, "ok"), 3);
        assert_eq!(c.entries(), OLD);
        assert_eq!(
            std::fs::read_to_string(c.root().join("ibdata1")).unwrap(),
            "old"
        );

        // Cut before its phase was written (or by an older Job that wrote none): what is
        // aside is put back all the same.
        let c = Claim::new("cut-no-phase");
        old_data(&c.root());
        let aside = c.root().join(".tidemark-restore");
        std::fs::create_dir_all(aside.join("old")).unwrap();
        std::fs::rename(c.root().join("ibdata1"), aside.join("old/ibdata1")).unwrap();
        assert_eq!(c.exit(false, "ok"), 3);
        assert_eq!(c.entries(), OLD);

        // Cut while moving the new data in: the next run finishes that move first.
        let c = Claim::new("cut-into");
        let aside = c.root().join(".tidemark-restore");
        std::fs::create_dir_all(aside.join("old")).unwrap();
        std::fs::create_dir_all(aside.join("data/mysql")).unwrap();
        std::fs::write(aside.join("data/.hidden"), "x").unwrap();
        std::fs::write(c.root().join("ibdata1"), "new").unwrap();
        std::fs::write(aside.join("phase"), "into\n").unwrap();
        assert_eq!(c.exit(false, "ok"), 3);
        assert_eq!(c.entries(), NEW);
    }
}
