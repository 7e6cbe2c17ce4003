//! The binlog archiver of a BackupPolicy with `spec.binlogArchive.server`: one Deployment
//! per policy that reads the server's binlogs over the network as a replica client
//! (`tidemark archive-binlogs --from-server`) and ships closed files with the ordinary
//! archiver. Nothing changes on the database's pods; it is safe to restart (it fetches again
//! from the first file the archive lacks).
//!
//! Like a backup Job, it runs in an image that has `mariadb-binlog` (the database's own,
//! by default) with `tidemark` copied in by an init container, and receives credentials
//! only as Secret references.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use tidemark_api::crd::BackupPolicy;

use crate::error::Error;
use crate::pod::{self, SecretKeys, TOOLS_DIR};
use crate::{Context, FIELD_MANAGER};

/// Where fetched binlogs wait in the archiver's pod.
const SPOOL: &str = "/spool";

/// The Deployment's name.
pub fn deployment_name(policy: &str) -> String {
    let mut base: String = policy.chars().take(45).collect();
    while base.ends_with('-') || base.ends_with('.') {
        base.pop();
    }
    format!("{base}-binlog-archiver")
}

/// Creates, updates or removes the policy's archiver Deployment.
///
/// # Errors
/// The API failed; the spec lacks what the archiver needs.
pub async fn reconcile(ctx: &Context, policy: &BackupPolicy) -> Result<(), Error> {
    let ns = policy.namespace().unwrap_or_default();
    let name = deployment_name(&policy.name_any());
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(server) = policy
        .spec
        .binlog_archive
        .as_ref()
        .and_then(|a| a.server.as_ref())
    else {
        // Not (or no longer) wanted: remove ours if it is there.
        if let Some(d) = api.get_opt(&name).await?
            && d.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == policy.meta().uid.as_ref())
        {
            api.delete(&name, &DeleteParams::background()).await?;
        }
        return Ok(());
    };
    let image = match &server.image {
        Some(i) => i.clone(),
        None => database_image(ctx, policy).await?,
    };
    let store_secret = crate::pod::policy_secret_keys(&ctx.client, policy).await?;
    let deployment =
        archiver(policy, &image, &ctx.image, store_secret.as_ref()).map_err(Error::Invalid)?;
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&deployment),
    )
    .await?;
    Ok(())
}

/// The image of the database container of a pod the policy's source selects: the
/// primary's (its role label says `primary`) when one is running, else the first by name.
/// The archiver reads the primary, so its `mariadb-binlog` follows the primary's server
/// through an upgrade; a change of a selected pod's images looks at the policy again
/// ([`policies_of_pod`]).
pub(crate) async fn database_image(ctx: &Context, policy: &BackupPolicy) -> Result<String, Error> {
    let source = policy.spec.source.as_ref().ok_or_else(|| {
        Error::Invalid(
            "spec.binlogArchive.server needs spec.binlogArchive.server.image or spec.source (whose database image has mariadb-binlog)".into(),
        )
    })?;
    let pods: Api<Pod> =
        Api::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default());
    let listed = pods
        .list(&ListParams::default().labels(&crate::backup::selector(&source.selector)?))
        .await?;
    let role_label = source
        .role_label
        .as_deref()
        .unwrap_or(crate::backup::DEFAULT_ROLE_LABEL);
    let mut candidates: Vec<(bool, String, String)> = listed
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let spec = p.spec.as_ref()?;
            let c = match &source.container {
                Some(n) => spec.containers.iter().find(|c| &c.name == n)?,
                None => spec.containers.first()?,
            };
            let primary = p.labels().get(role_label).is_some_and(|r| r == "primary");
            Some((!primary, p.name_any(), c.image.clone()?))
        })
        .collect();
    candidates.sort();
    candidates
        .into_iter()
        .map(|(_, _, image)| image)
        .next()
        .ok_or_else(|| {
            Error::Missing(
                "no pod matches spec.source.selector yet, so the database image for the binlog archiver is unknown (or set spec.binlogArchive.server.image)".into(),
            )
        })
}

/// The archiver Deployment of `policy`.
///
/// # Errors
/// The policy lacks an object store or a binlog server.
pub fn archiver(
    policy: &BackupPolicy,
    image: &str,
    operator_image: &str,
    store_secret: Option<&SecretKeys>,
) -> Result<Deployment, String> {
    let archive = policy
        .spec
        .binlog_archive
        .as_ref()
        .ok_or("no spec.binlogArchive")?;
    let server = archive
        .server
        .as_ref()
        .ok_or("no spec.binlogArchive.server")?;
    let os = policy
        .spec
        .object_store
        .as_ref()
        .ok_or("the BackupPolicy has no spec.objectStore")?;
    let url = os.store_url().map_err(|e| e.to_string())?;
    let cluster = policy.spec.cluster_or(&policy.name_any()).to_owned();
    let login = policy
        .spec
        .source
        .as_ref()
        .and_then(|s| s.credentials_secret.clone());
    let mut cmd = vec![
        "archive-binlogs".to_owned(),
        "--store".into(),
        url,
        "--cluster".into(),
        cluster,
        "--from-server".into(),
        "--spool".into(),
        SPOOL.into(),
        "--interval".into(),
        archive.interval.clone().unwrap_or_else(|| "10s".into()),
        "--".into(),
    ];
    if login.is_some() {
        cmd.push(format!("--defaults-extra-file={TOOLS_DIR}/my.cnf"));
    }
    cmd.push(format!("--host={}", server.host));
    cmd.push(format!("--port={}", server.port.unwrap_or(3306)));
    let script = if login.is_some() {
        pod::login_script()
    } else {
        pod::tidemark_script()
    };
    let mut args = vec![script, "tidemark".to_owned()];
    args.extend(cmd);
    let mut env = vec![pod::plain("TIDEMARK_LOG", "info")];
    env.extend(pod::store_env(os, store_secret));
    if let Some(db) = &login {
        env.extend(pod::login_env(db));
    }
    let labels = pod::labels("tidemark.io/binlog-archiver", &policy.name_any());
    let owner = crate::owner_ref(policy).ok_or("the BackupPolicy has no uid yet")?;
    Ok(Deployment {
        metadata: ObjectMeta {
            name: Some(deployment_name(&policy.name_any())),
            namespace: policy.namespace(),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            // Never two at once (the index's conditional writes would cope, but waste work).
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                ..Default::default()
            }),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    init_containers: Some(vec![pod::install_container(operator_image)]),
                    containers: vec![Container {
                        name: "archiver".into(),
                        image: Some(image.to_owned()),
                        command: Some(vec!["sh".into(), "-c".into()]),
                        args: Some(args),
                        env: Some(env),
                        volume_mounts: Some(vec![pod::tools_mount(), pod::mount("spool", SPOOL)]),
                        termination_message_policy: Some(pod::TERMINATION_MESSAGE_POLICY.into()),
                        ..Default::default()
                    }],
                    volumes: Some(vec![pod::tools_volume(), pod::empty_volume("spool")]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    })
}

/// Which BackupPolicy an archiver Deployment belongs to.
/// A fingerprint of a pod's container images: a watch of pods passes on only the changes
/// of it (a rollout of the database image), not every status change.
pub fn pod_images(p: &Pod) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.metadata.uid.hash(&mut h);
    for c in &p.spec.as_ref()?.containers {
        (&c.name, &c.image).hash(&mut h);
    }
    Some(h.finish())
}

/// The policies whose binlog archiver takes its image from `pod` (a `source` that selects
/// it, a `binlogArchive.server` without its own `image`), among `policies`.
pub fn policies_of_pod(
    policies: &kube::runtime::reflector::Store<BackupPolicy>,
    pod: &Pod,
) -> Vec<kube::runtime::reflector::ObjectRef<BackupPolicy>> {
    let ns = pod.namespace();
    policies
        .state()
        .iter()
        .filter(|p| p.namespace() == ns)
        .filter(|p| {
            let server = p
                .spec
                .binlog_archive
                .as_ref()
                .and_then(|a| a.server.as_ref());
            server.is_some_and(|s| s.image.is_none())
        })
        .filter(|p| {
            p.spec
                .source
                .as_ref()
                .is_some_and(|s| tidemark_api::lifecycle::selects(&s.selector, pod.labels()))
        })
        .map(|p| kube::runtime::reflector::ObjectRef::from_obj(p.as_ref()))
        .collect()
}

pub fn policy_of(d: &Deployment) -> Option<kube::runtime::reflector::ObjectRef<BackupPolicy>> {
    let ns = d.namespace()?;
    d.owner_references()
        .iter()
        .find(|o| o.kind == "BackupPolicy" && o.controller == Some(true))
        .map(|o| kube::runtime::reflector::ObjectRef::new(&o.name).within(&ns))
}
