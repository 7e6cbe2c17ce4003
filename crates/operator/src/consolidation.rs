//! Consolidation as a Job (seed 002's synthetic full): when a retention pass's plan asks to
//! merge a mariabackup chain, the operator runs `tidemark consolidate` in a Job (in the
//! database image, which has `mariabackup` and `mbstream`) instead of in its own process.
//!
//! The engine's pass calls [`JobConsolidator::consolidate`] for each chain to merge. The
//! first call creates the Job and answers "pending": the pass keeps that chain whole and
//! goes on. A later pass, once the Job has committed the synthetic full, finds it in the
//! store and reports it; the plan then lets the merged chain go. A failed Job is reported
//! and removed, so a later pass tries again.

use async_trait::async_trait;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use tidemark_api::crd::BackupPolicy;
use tidemark_core::Backup;
use tidemark_engine::{Class, Consolidator, EngineError};
use tidemark_store::executor::Consolidation;
use tidemark_store::format::CONSOLIDATED_FROM;
use tidemark_store::{ClusterStore, Progress, Survey};

use crate::pod;
use crate::stores::SecretKeys;

/// Where the chain is prepared in the Job's pod.
const WORK: &str = "/work";

/// Runs consolidations as Jobs of `policy`.
#[derive(Debug)]
pub struct JobConsolidator {
    pub jobs: Api<Job>,
    pub policy: BackupPolicy,
    /// The database's image (with `mariabackup` and `mbstream`) and security settings.
    pub database: crate::database::DatabaseRuntime,
    /// The operator's image (the init container copies `tidemark` from it).
    pub operator_image: String,
    pub store_secret: Option<SecretKeys>,
}

fn pending(message: String) -> EngineError {
    EngineError::Edge {
        class: Class::Contention,
        message,
    }
}

/// The Job's name for merging the chain of `target` (a backup-id): deterministic, so every
/// pass finds the same Job.
pub fn job_name(policy: &str, target: &str) -> String {
    let base = crate::names::prefix(policy, 24);
    format!("{base}-consolidate-{}", target.to_ascii_lowercase())
}

#[async_trait]
impl Consolidator for JobConsolidator {
    async fn consolidate(
        &self,
        store: &ClusterStore,
        survey: &Survey,
        target: &Backup,
        _: &dyn Progress,
    ) -> Result<Consolidation, EngineError> {
        // Already committed (by a Job of an earlier pass): report it.
        if let Some(done) = committed(survey, target) {
            return Ok(done);
        }
        let name = job_name(&self.policy.name_any(), &target.id);
        // An encrypted chain needs the identities in the Job; without them, no Job is
        // started (it could only fail) and the chain is kept whole.
        let encryption = self
            .policy
            .spec
            .object_store
            .as_ref()
            .and_then(|os| os.encryption.as_ref());
        if chain_encrypted(survey, &target.id) {
            if encryption
                .and_then(tidemark_api::policy::EncryptionSpec::identity)
                .is_none()
            {
                return Err(EngineError::Input(format!(
                    "the chain of {} is encrypted, and consolidating it reads it: set spec.objectStore.encryption.identitySecret (a Secret with key `{}` holding the age identities) or identityFrom ({{name, key}}); the chain is kept whole",
                    target.id,
                    tidemark_api::policy::IDENTITY_KEY
                )));
            }
            // The synthetic full would hold the chain's content in clear.
            if encryption.is_none_or(|e| e.recipients.is_empty()) {
                return Err(EngineError::Input(format!(
                    "the chain of {} is encrypted, and spec.objectStore.encryption.recipients is empty: its synthetic full would be written in clear; the chain is kept whole",
                    target.id
                )));
            }
        }
        let edge = |e: kube::Error| EngineError::Edge {
            class: Class::Store,
            message: format!("consolidation Job {name}: {e}"),
        };
        match self.jobs.get_opt(&name).await.map_err(edge)? {
            None => {
                let job = self
                    .job(
                        store,
                        &name,
                        &target.id,
                        survey.catalog.restore_scratch_bytes(),
                    )
                    .map_err(EngineError::Input)?;
                match self.jobs.create(&PostParams::default(), &job).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(edge(e)),
                }
                tracing::info!(job = %name, target = %target.id, "consolidation Job created");
                Err(pending(format!(
                    "pending: consolidation Job {name} started; the chain is kept until it commits the synthetic full"
                )))
            }
            Some(job) => {
                let st = job.status.clone().unwrap_or_default();
                let failed = st.failed.unwrap_or(0) > 0;
                let succeeded = st.succeeded.unwrap_or(0) > 0;
                // Read before the Job (and its pod) goes.
                let why = if failed {
                    crate::pod::job_failure(&self.jobs.clone().into_client(), &job).await
                } else {
                    None
                };
                if failed || succeeded {
                    // Done either way: the store says what came of it (a later pass reads
                    // the synthetic full), and a failure is tried again by a new Job.
                    let _ = self.jobs.delete(&name, &DeleteParams::background()).await;
                }
                if failed {
                    let why = why.unwrap_or_else(|| "its pod's log says why".into());
                    return Err(EngineError::Source(format!(
                        "consolidation Job {name} failed ({why}); a later pass tries again"
                    )));
                }
                Err(pending(format!(
                    "pending: consolidation Job {name} {}",
                    if succeeded {
                        "finished; the next pass reads its synthetic full"
                    } else {
                        "is running; the chain is kept meanwhile"
                    }
                )))
            }
        }
    }
}

/// Whether a payload of the chain ending at `target` is encrypted.
fn chain_encrypted(survey: &Survey, target: &str) -> bool {
    let chain = tidemark_core::chain_of(&survey.inventory, target).unwrap_or_default();
    chain.iter().any(|b| {
        survey
            .catalog
            .backup(&b.name, &b.id)
            .and_then(|s| s.metadata.as_ref())
            .is_some_and(|m| m.payload.iter().any(|p| p.encryption.is_some()))
    })
}

/// The synthetic full that replaces `target`, if the store holds it.
fn committed(survey: &Survey, target: &Backup) -> Option<Consolidation> {
    survey.catalog.backups.iter().find_map(|b| {
        let m = b.metadata.as_ref()?;
        let from: Vec<String> = m
            .extra
            .get(CONSOLIDATED_FROM)
            .and_then(|v| serde_json::from_value(v.clone()).ok())?;
        (from.last() == Some(&target.id)).then(|| Consolidation {
            target: target.id.clone(),
            synthetic: m.backup_id.clone(),
            consolidated_from: from,
            size: m.payload.iter().map(|p| p.size).sum(),
        })
    })
}

impl JobConsolidator {
    /// Removes this policy's consolidation Jobs that succeeded: their synthetic fulls are in
    /// the store, which the pass just read. (A failed one is removed when it is reported.)
    ///
    /// # Guarantees
    /// Deletes only this consolidator's own finished Jobs.
    pub async fn remove_finished(&self) {
        let selector = format!("tidemark.io/consolidation={}", self.policy.name_any());
        let Ok(list) = self
            .jobs
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
        else {
            return;
        };
        for j in list.items {
            if j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0 {
                let _ = self
                    .jobs
                    .delete(&j.name_any(), &DeleteParams::background())
                    .await;
            }
        }
    }

    fn job(
        &self,
        store: &ClusterStore,
        name: &str,
        target: &str,
        scratch_bytes: Option<u64>,
    ) -> Result<Job, String> {
        let os = self
            .policy
            .spec
            .object_store
            .as_ref()
            .ok_or("the BackupPolicy has no spec.objectStore")?;
        let args = vec![
            pod::tidemark_script(),
            "tidemark".to_owned(),
            "consolidate".to_owned(),
            "--store".into(),
            os.store_url().map_err(|e| e.to_string())?,
            "--cluster".into(),
            store.cluster.clone(),
            "--backup-id".into(),
            target.to_owned(),
            "--work-dir".into(),
            WORK.into(),
        ];
        ToolJob {
            policy: &self.policy,
            name,
            label: "tidemark.io/consolidation",
            container: "consolidate",
            args,
            database: &self.database,
            operator_image: &self.operator_image,
            store_secret: self.store_secret.as_ref(),
            work: ("work", WORK),
            scratch_bytes,
            claim: None,
            owner: None,
        }
        .job()
    }
}

/// The scratch volume: an emptyDir of at most `bytes` when known.
fn scratch_volume(name: &str, bytes: Option<u64>) -> k8s_openapi::api::core::v1::Volume {
    let mut v = pod::empty_volume(name);
    if let (Some(b), Some(e)) = (bytes, v.empty_dir.as_mut()) {
        e.size_limit = Some(Quantity(b.to_string()));
    }
    v
}

/// `resources` with an `ephemeral-storage` request of `bytes` (when known and not set by
/// the policy), never above the policy's own `ephemeral-storage` limit (a request over
/// the limit makes the API refuse the Job, every time).
fn scratch_request(
    resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    bytes: Option<u64>,
) -> Option<k8s_openapi::api::core::v1::ResourceRequirements> {
    let Some(mut b) = bytes else {
        return resources;
    };
    let limit = resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("ephemeral-storage"));
    if let Some(limit) = limit {
        match tidemark_api::quantity::bytes(&limit.0) {
            Some(l) => b = b.min(l),
            // A limit in a form not read here: no request beside it.
            None => return resources,
        }
    }
    let mut r = resources.unwrap_or_default();
    r.requests
        .get_or_insert_with(Default::default)
        .entry("ephemeral-storage".into())
        .or_insert_with(|| Quantity(b.to_string()));
    Some(r)
}

/// The user a tool Job's private server runs as when the pod runs as root: the one the
/// MariaDB images run their server as.
pub const SERVER_USER_AS_ROOT: &str = "mysql";

/// A Job that runs `tidemark` in the database image (whose `mariabackup`, `mbstream` and
/// `mariadbd` it uses): consolidations and restore tests. It runs once (a failure is
/// reported and tried again later), within the backup Jobs' deadline, with the policy's
/// store settings and its identities by Secret reference, `tidemark` copied in by an init
/// container, and its scratch space in an `emptyDir`.
#[derive(Debug)]
pub struct ToolJob<'a> {
    pub policy: &'a BackupPolicy,
    pub name: &'a str,
    /// The label naming the policy on the Job and its pod.
    pub label: &'a str,
    pub container: &'a str,
    /// The container's shell arguments ([`pod::tidemark_script`] first).
    pub args: Vec<String>,
    pub database: &'a crate::database::DatabaseRuntime,
    /// The operator's image (the init container copies `tidemark` from it).
    pub operator_image: &'a str,
    pub store_secret: Option<&'a SecretKeys>,
    /// The scratch volume's name and mount path.
    pub work: (&'a str, &'a str),
    /// The scratch space the work takes, estimated from the store's recorded sizes
    /// ([`tidemark_store::Catalog::restore_scratch_bytes`]): the volume's `sizeLimit` and the
    /// container's `ephemeral-storage` request, so a large restore is placed where it fits
    /// and is evicted rather than filling a shared node's disk (issue 28). `None`: unbounded.
    pub scratch_bytes: Option<u64>,
    /// The claim mounted as the work volume, in place of scratch space (a restore's).
    pub claim: Option<&'a str>,
    /// The Job's owner, when not the policy (a Restore).
    pub owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
}

impl ToolJob<'_> {
    /// The same Job with its scratch bounded by `bytes` ([`ToolJob::scratch_bytes`]).
    #[must_use]
    pub fn with_scratch(mut self, bytes: Option<u64>) -> Self {
        self.scratch_bytes = bytes;
        self
    }

    /// The Job.
    ///
    /// # Errors
    /// The policy has no object store, or no uid yet.
    pub fn job(self) -> Result<Job, String> {
        let policy = self.policy;
        let os = policy
            .spec
            .object_store
            .as_ref()
            .ok_or("the BackupPolicy has no spec.objectStore")?;
        let mut env = vec![
            pod::plain("TIDEMARK_LOG", "info"),
            // The private server a restore replays binlogs on never runs as root: in a pod
            // that runs as root, it runs as the database image's own user.
            pod::plain(
                tidemark_mariadb::server::SERVER_USER_ENV,
                SERVER_USER_AS_ROOT,
            ),
        ];
        env.extend(pod::store_env(os, self.store_secret));
        env.extend(pod::bandwidth_env(&policy.spec));
        // What such a Job commits (a synthetic full) is locked at least the policy's lock
        // period from now: the period as the policy resolves it (`objectLock.period`, else
        // `retention.window`), which `store_env` passes on only when it is set explicitly.
        if let Ok(Some(lock)) = policy.spec.object_lock() {
            env.retain(|e| e.name != "TIDEMARK_LOCK_PERIOD");
            env.push(pod::plain("TIDEMARK_LOCK_PERIOD", &lock.period.to_string()));
        }
        // An encrypted chain is read with the policy's identities (by Secret reference).
        env.extend(pod::identity_env(os));
        let labels = pod::labels(self.label, &policy.name_any());
        let owner = match self.owner {
            Some(o) => o,
            None => crate::context::owner_ref(policy).ok_or("the BackupPolicy has no uid yet")?,
        };
        let (work_volume, scratch) = match self.claim {
            Some(claim) => (pod::claim_volume(self.work.0, claim), None),
            None => (
                scratch_volume(self.work.0, self.scratch_bytes),
                self.scratch_bytes,
            ),
        };
        let (volume, path) = self.work;
        Ok(Job {
            metadata: ObjectMeta {
                name: Some(self.name.to_owned()),
                namespace: policy.namespace(),
                labels: Some(labels.clone()),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            spec: Some(JobSpec {
                backoff_limit: Some(0),
                // As a backup Job: a hung tool fails, and a later pass or slot tries again.
                active_deadline_seconds: Some(crate::pod::JOB_DEADLINE_SECONDS),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        // Nothing in it talks to the API: no token for a planted tool to read.
                        automount_service_account_token: pod::NO_TOKEN,
                        restart_policy: Some("Never".into()),
                        affinity: pod::architecture_affinity(),
                        security_context: self.database.pod_security.clone(),
                        init_containers: Some(vec![pod::install_container(
                            self.operator_image,
                            self.database.pod_security.as_ref(),
                            policy,
                        )]),
                        containers: vec![Container {
                            name: self.container.into(),
                            // One database's worth of scratch space and tools.
                            resources: scratch_request(
                                pod::resources(policy, |r| r.consolidation.as_ref()),
                                scratch,
                            ),
                            image: Some(self.database.image.clone()),
                            security_context: self.database.container_security.clone(),
                            command: Some(vec!["sh".into(), "-c".into()]),
                            args: Some(self.args),
                            env: Some(env),
                            volume_mounts: Some(vec![
                                pod::tools_mount(),
                                pod::mount(volume, path),
                                pod::tmp_mount(),
                            ]),
                            termination_message_policy: Some(
                                pod::TERMINATION_MESSAGE_POLICY.into(),
                            ),
                            ..Default::default()
                        }],
                        volumes: Some(vec![pod::tools_volume(), work_volume, pod::tmp_volume()]),
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            status: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    /// Issue 28 review: a request above the policy's own limit would make the API refuse
    /// the Job every time; it is cut to the limit, and a limit not read adds none.
    #[test]
    fn the_scratch_request_stays_within_the_policys_limit() {
        let with_limit = |l: &str| {
            Some(ResourceRequirements {
                limits: Some([("ephemeral-storage".to_owned(), Quantity(l.to_owned()))].into()),
                ..Default::default()
            })
        };
        let request = |r: Option<ResourceRequirements>| {
            r.and_then(|r| r.requests)
                .and_then(|r| r.get("ephemeral-storage").cloned())
                .map(|q| q.0)
        };
        assert_eq!(
            request(scratch_request(with_limit("1Gi"), Some(5 << 30))),
            Some((1u64 << 30).to_string())
        );
        assert_eq!(
            request(scratch_request(with_limit("10Gi"), Some(5 << 30))),
            Some((5u64 << 30).to_string())
        );
        assert_eq!(
            request(scratch_request(with_limit("1e9"), Some(5 << 30))),
            None
        );
        assert_eq!(
            request(scratch_request(None, Some(7))),
            Some("7".to_owned())
        );
    }
}
