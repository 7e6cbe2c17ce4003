//! The backup Job: built from the policy, the chosen pod and its data volume (or from the
//! user's pod template, method `job`), named after its Backup.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    Pod, PodSpec, PodTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::{Backup, BackupPolicy, SourceSpec};

use super::source::{DataVolume, node_of};
use crate::names::{BACKUP_UID_LABEL, DATA_VOLUME_LABEL, short_uid, stored_labels};
use crate::pod::{self, JOB_DEADLINE_SECONDS};
use crate::stores::SecretKeys;

/// How long a finished backup Job (and its pod) is kept (`ttlSecondsAfterFinished`, where
/// the cluster's TTL controller runs: Kubernetes 1.21+) — its outcome is in the Backup's
/// status by then — so finished Jobs do not pile up beside their Backups.
pub const FINISHED_JOB_TTL_SECONDS: i32 = 24 * 3600;

/// A Backup's own `compression` (it overrides the policy's, which [`pod::store_env`] put
/// in `env`) as `TIDEMARK_COMPRESSION`, which `tidemark push` reads.
fn compression_env(env: &mut Vec<k8s_openapi::api::core::v1::EnvVar>, backup: &Backup) {
    if let Some(c) = &backup.spec.template.compression {
        env.retain(|e| e.name != "TIDEMARK_COMPRESSION");
        env.push(pod::plain("TIDEMARK_COMPRESSION", c));
    }
}

/// The Job's name: `<backup>-<uid>-backup` (the Backup's name cut to fit 63 characters,
/// and the first 8 hex digits of its uid), so two Backups — two slots of a long-named
/// schedule, or a Backup deleted and created again under its name — never share a Job.
pub fn job_name(backup: &Backup) -> String {
    let base = crate::names::prefix(&backup.name_any(), 46);
    format!("{base}-{}-backup", short_uid(backup))
}

/// Everything the Job is made of.
#[derive(Debug)]
pub struct JobPlan<'a> {
    pub job_name: String,
    pub backup: &'a Backup,
    pub policy: &'a BackupPolicy,
    pub source: &'a SourceSpec,
    pub pod: &'a Pod,
    pub data: DataVolume,
    /// `mariabackup`, `xtrabackup`, or MySQL's `mysql-clone` or `mysqldump` (issue 47: the
    /// server is reached over TCP, and no volume is mounted).
    pub method: String,
    /// The operator's image: it holds the static `tidemark` binary at `/tidemark`.
    pub image: String,
    pub backup_name: String,
    pub backup_id: String,
    pub parent: Option<String>,
    /// The data directory's identity (`pvc:<uid>` or `pod:<uid>`), recorded as the label
    /// [`DATA_VOLUME_LABEL`]: an incremental's parent must carry the same.
    pub volume_id: String,
    pub store_secret: Option<SecretKeys>,
    /// The lock date the backup asks for (object lock; its mode is in the store's
    /// environment).
    pub lock_until: Option<jiff::Timestamp>,
    /// What it backs up, for people (the pod, and why that one).
    pub backs_up: String,
}

impl JobPlan<'_> {
    /// The Job.
    ///
    /// # Errors
    /// The policy's store or the pod lacks what the Job needs.
    pub fn job(&self) -> Result<Job, String> {
        let os = self
            .policy
            .spec
            .object_store
            .as_ref()
            .ok_or("the BackupPolicy has no spec.objectStore")?;
        let url = os.store_url().map_err(|e| e.to_string())?;
        let node = node_of(self.pod).ok_or("the database pod is not scheduled on a node")?;
        let pod_ip = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .ok_or("the database pod has no IP yet")?;
        let cluster = self
            .policy
            .spec
            .cluster_or(&self.policy.name_any())
            .to_owned();
        let data_path = self.data.mount.mount_path.clone();
        let mysql = matches!(self.method.as_str(), "mysql-clone" | "mysqldump");

        // `tidemark push … -- mariabackup …`: push runs the tool and streams its output.
        let mut push = vec![
            "push".to_owned(),
            "--store".into(),
            url,
            "--cluster".into(),
            cluster,
            "--backup-name".into(),
            self.backup_name.clone(),
            "--backup-id".into(),
            self.backup_id.clone(),
            "--method".into(),
            if mysql {
                self.method.clone()
            } else {
                "mariabackup".into()
            },
            "--label".into(),
            format!("{DATA_VOLUME_LABEL}={}", self.volume_id),
        ];
        for (k, v) in stored_labels(self.backup) {
            push.extend(["--label".into(), format!("{k}={v}")]);
        }
        if let Some(p) = &self.parent {
            push.extend([
                "--type".into(),
                "incremental".into(),
                "--parent".into(),
                p.clone(),
            ]);
        }
        if let Some(ttl) = &self.backup.spec.ttl {
            push.extend(["--ttl".into(), ttl.clone()]);
        }
        if let Some(until) = self.lock_until {
            push.extend(["--lock-until".into(), until.to_string()]);
        }
        let tool = match self.method.as_str() {
            "xtrabackup" => "xtrabackup",
            // The clone's source is asked through MySQL's client.
            "mysql-clone" => "mysql",
            "mysqldump" => "mysqldump",
            _ => "mariabackup",
        };
        push.push("--".into());
        push.push(tool.into());
        let login = self.source.login();
        let with_login = login.is_some();
        if with_login {
            // Must come first; written by the container from its environment.
            push.push(format!("--defaults-extra-file={}/my.cnf", pod::TOOLS_DIR));
        }
        push.extend([
            format!("--host={pod_ip}"),
            format!("--port={}", self.source.port.unwrap_or(3306)),
        ]);
        if !mysql {
            push.push(format!("--datadir={data_path}"));
        }
        // The option file is written with the shell's printf from the environment, so the
        // password is in no argument of any process.
        let script = if with_login {
            pod::login_script()
        } else {
            pod::tidemark_script()
        };
        let mut args = vec![script, "tidemark".to_owned()];
        args.extend(push);

        let mut env = vec![pod::plain("TIDEMARK_LOG", "info")];
        env.extend(pod::store_env(os, self.store_secret.as_ref()));
        env.extend(pod::bandwidth_env(&self.policy.spec));
        compression_env(&mut env, self.backup);
        if let Some(db) = &login {
            env.extend(pod::login_env(db));
        }
        if mysql {
            // The clone's private servers never run as root (ignored when the pod does not).
            env.push(pod::plain(
                tidemark_mariadb::server::SERVER_USER_ENV,
                "mysql",
            ));
        }
        let mut data_mount = self.data.mount.clone();
        // mariabackup only reads the data directory.
        data_mount.read_only = None;
        // A MySQL backup reads over TCP: the data volume is not mounted.
        let (mut mounts, mut volumes) = (Vec::new(), Vec::new());
        if !mysql {
            mounts.push(data_mount);
            volumes.push(self.data.volume.clone());
        }
        mounts.extend([pod::tools_mount(), pod::tmp_mount()]);
        volumes.extend([pod::tools_volume(), pod::tmp_volume()]);
        let image = self
            .data
            .container
            .image
            .clone()
            .ok_or("the database container has no image")?;
        let pod_spec = self.pod.spec.clone().unwrap_or_default();
        let labels = pod::labels(
            BACKUP_UID_LABEL,
            self.backup.meta().uid.as_deref().unwrap_or_default(),
        );
        let owner = crate::context::owner_ref(self.backup).ok_or("the Backup has no uid yet")?;
        Ok(Job {
            metadata: ObjectMeta {
                name: Some(self.job_name.clone()),
                namespace: self.backup.namespace(),
                labels: Some(labels.clone()),
                annotations: Some(std::collections::BTreeMap::from([(
                    crate::names::BACKS_UP_ANNOTATION.to_owned(),
                    self.backs_up.chars().take(1024).collect(),
                )])),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            spec: Some(JobSpec {
                // A retry would be a second attempt at the same backup-id (refused by the
                // store's conditional commit): the next slot tries again instead.
                backoff_limit: Some(0),
                active_deadline_seconds: Some(JOB_DEADLINE_SECONDS),
                ttl_seconds_after_finished: Some(FINISHED_JOB_TTL_SECONDS),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        // Nothing in it talks to the API: no token for a planted tool to read.
                        automount_service_account_token: pod::NO_TOKEN,
                        restart_policy: Some("Never".into()),
                        affinity: Some(Affinity {
                            node_affinity: Some(NodeAffinity {
                                required_during_scheduling_ignored_during_execution: Some(
                                    NodeSelector {
                                        node_selector_terms: vec![NodeSelectorTerm {
                                            match_expressions: Some(vec![
                                                NodeSelectorRequirement {
                                                    key: "kubernetes.io/hostname".into(),
                                                    operator: "In".into(),
                                                    values: Some(vec![node]),
                                                },
                                                pod::architecture_requirement(),
                                            ]),
                                            ..Default::default()
                                        }],
                                    },
                                ),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                        tolerations: pod_spec.tolerations.clone(),
                        security_context: pod_spec.security_context.clone(),
                        service_account_name: pod_spec.service_account_name.clone(),
                        image_pull_secrets: pod_spec.image_pull_secrets.clone(),
                        init_containers: Some(vec![pod::install_container(
                            &self.image,
                            pod_spec.security_context.as_ref(),
                            self.policy,
                        )]),
                        containers: vec![Container {
                            name: "backup".into(),
                            resources: pod::resources(self.policy, |r| r.backup.as_ref()),
                            image: Some(image),
                            image_pull_policy: self.data.container.image_pull_policy.clone(),
                            command: Some(vec!["sh".into(), "-c".into()]),
                            args: Some(args),
                            env: Some(env),
                            volume_mounts: Some(mounts),
                            security_context: self.data.container.security_context.clone(),
                            termination_message_policy: Some(
                                pod::TERMINATION_MESSAGE_POLICY.into(),
                            ),
                            ..Default::default()
                        }],
                        volumes: Some(volumes),
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            status: None,
        })
    }
}

/// The Job of method `job`: the user's pod template, with the destination in every
/// container's environment and `tidemark` copied in.
///
/// # Errors
/// No or an unreadable `jobTemplate`, or no object store.
pub fn user_job(
    backup: &Backup,
    policy: &BackupPolicy,
    job_name: &str,
    image: &str,
    backup_name: &str,
    backup_id: &str,
    store_secret: Option<&SecretKeys>,
) -> Result<Job, String> {
    let template = backup
        .spec
        .template
        .job_template
        .clone()
        .ok_or("method job needs spec.jobTemplate (the pod template that makes the backup)")?;
    if let Some(why) = tidemark_api::schedule::template_too_large(
        &template,
        "spec.jobTemplate",
        " (a pod template that runs `tidemark push`; put large content in a ConfigMap or the image)",
    ) {
        return Err(why);
    }
    let mut template: PodTemplateSpec = serde_json::from_value(template)
        .map_err(|e| format!("spec.jobTemplate is not a pod template: {e}"))?;
    let os = policy
        .spec
        .object_store
        .as_ref()
        .ok_or("the BackupPolicy has no spec.objectStore")?;
    let mut env = vec![
        pod::plain(
            "TIDEMARK_STORE",
            &os.store_url().map_err(|e| e.to_string())?,
        ),
        pod::plain(
            "TIDEMARK_CLUSTER",
            policy.spec.cluster_or(&policy.name_any()),
        ),
        pod::plain("TIDEMARK_BACKUP_NAME", backup_name),
        pod::plain("TIDEMARK_BACKUP_ID", backup_id),
    ];
    env.extend(pod::store_env(os, store_secret));
    env.extend(pod::bandwidth_env(&policy.spec));
    compression_env(&mut env, backup);
    let spec = template.spec.get_or_insert_with(Default::default);
    if spec.containers.is_empty() {
        return Err("spec.jobTemplate has no containers".into());
    }
    for c in &mut spec.containers {
        let mut e = c.env.take().unwrap_or_default();
        // Ours win: a template cannot point the backup elsewhere by accident.
        e.retain(|v| !env.iter().any(|ours| ours.name == v.name));
        e.extend(env.iter().cloned());
        c.env = Some(e);
        c.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(pod::tools_mount());
        // Unless the template says otherwise, a failure's log tail reaches the status.
        c.termination_message_policy
            .get_or_insert_with(|| pod::TERMINATION_MESSAGE_POLICY.into());
    }
    let install = pod::install_container(image, spec.security_context.as_ref(), policy);
    // The user's pod runs our binary too (the install container's copy).
    pod::pin_architecture(spec);
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .insert(0, install);
    spec.volumes
        .get_or_insert_with(Vec::new)
        .push(pod::tools_volume());
    spec.restart_policy = Some("Never".into());
    let labels = pod::labels(
        BACKUP_UID_LABEL,
        backup.meta().uid.as_deref().unwrap_or_default(),
    );
    template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend(labels.clone());
    let owner = crate::context::owner_ref(backup).ok_or("the Backup has no uid yet")?;
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(job_name.to_owned()),
            namespace: backup.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(JOB_DEADLINE_SECONDS),
            ttl_seconds_after_finished: Some(FINISHED_JOB_TTL_SECONDS),
            template,
            ..Default::default()
        }),
        status: None,
    })
}

/// Which Backup a Job belongs to (its controller owner reference).
pub fn backup_of(job: &Job) -> Option<kube::runtime::reflector::ObjectRef<Backup>> {
    let ns = job.namespace()?;
    job.owner_references()
        .iter()
        .find(|o| o.kind == "Backup" && o.controller == Some(true))
        .map(|o| kube::runtime::reflector::ObjectRef::new(&o.name).within(&ns))
}
