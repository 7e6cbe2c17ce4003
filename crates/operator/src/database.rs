//! The database's pods as the operator's own pods see them: what a pod running the
//! database's tools copies from them ([`DatabaseRuntime`]), and which policies look at a
//! database pod. Shared by the binlog archiver, consolidation and restore-test Jobs, and
//! the policy controller.

use k8s_openapi::api::core::v1::{Pod, PodSecurityContext, SecurityContext};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tidemark_api::crd::BackupPolicy;

use crate::context::Context;
use crate::error::Error;

/// What a pod that runs the database's own tools (the binlog archiver, consolidation Jobs)
/// takes from a database pod: the database container's image, and the pod's and that
/// container's security settings — so a namespace that admits the database (a Pod Security
/// level, a user id its volumes expect) admits these pods too.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatabaseRuntime {
    pub image: String,
    pub pod_security: Option<PodSecurityContext>,
    pub container_security: Option<SecurityContext>,
}

/// The [`DatabaseRuntime`] of a pod the policy's source selects: the primary's (its role
/// label says `primary`) when one is running, else the first by name. The archiver reads
/// the primary, so its `mariadb-binlog` follows the primary's server through an upgrade; a
/// change of a selected pod's images or security settings looks at the policy again
/// ([`policies_of_pod`], [`pod_runtime`]).
pub(crate) async fn database_runtime(
    ctx: &Context,
    policy: &BackupPolicy,
) -> Result<DatabaseRuntime, Error> {
    let source = policy.spec.source.as_ref().ok_or_else(|| {
        Error::Invalid(
            "spec.binlogArchive.server needs spec.binlogArchive.server.image or spec.source (whose database image has mariadb-binlog)".into(),
        )
    })?;
    let pods: Api<Pod> =
        Api::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default());
    let listed = crate::lean::list(
        &pods,
        &ListParams::default().labels(&crate::names::selector(&source.selector)?),
        crate::lean::meta_of,
    )
    .await?;
    let role_label = source
        .role_label
        .as_deref()
        .unwrap_or(crate::names::DEFAULT_ROLE_LABEL);
    let mut candidates: Vec<(bool, String, DatabaseRuntime)> = listed
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let spec = p.spec.as_ref()?;
            let c = match &source.container {
                Some(n) => spec.containers.iter().find(|c| &c.name == n)?,
                None => spec.containers.first()?,
            };
            let primary = p.labels().get(role_label).is_some_and(|r| r == "primary");
            let runtime = DatabaseRuntime {
                image: c.image.clone()?,
                pod_security: spec.security_context.clone(),
                container_security: c.security_context.clone(),
            };
            Some((!primary, p.name_any(), runtime))
        })
        .collect();
    candidates.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let checked = |name: &str, runtime: DatabaseRuntime| {
        ctx.tenancy
            .check_copied(
                runtime.pod_security.as_ref(),
                runtime.container_security.as_ref(),
                &format!("the security settings of {name}, which Tidemark's pods copy"),
            )
            .map_err(Error::Invalid)?;
        Ok(runtime)
    };
    if let Some((_, name, runtime)) = candidates.into_iter().next() {
        return checked(&format!("pod {name}"), runtime);
    }
    // No pod (a StatefulSet scaled to 0 for a restore in place): its pod template says the
    // same.
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default());
    // Not allowed to list them (an install from before this rule): as if there were none.
    let listed_sets = crate::lean::list(&sets, &ListParams::default(), crate::lean::meta_of)
        .await
        .unwrap_or_else(|e| {
            tracing::debug!("StatefulSets not listed: {e}");
            Vec::new()
        });
    let mut templates: Vec<(String, DatabaseRuntime)> = listed_sets
        .iter()
        .filter_map(|set| {
            let template = &set.spec.as_ref()?.template;
            let labels = template.metadata.as_ref()?.labels.as_ref()?;
            if !tidemark_api::lifecycle::selects(&source.selector, labels) {
                return None;
            }
            let spec = template.spec.as_ref()?;
            let c = match &source.container {
                Some(n) => spec.containers.iter().find(|c| &c.name == n)?,
                None => spec.containers.first()?,
            };
            Some((
                set.name_any(),
                DatabaseRuntime {
                    image: c.image.clone()?,
                    pod_security: spec.security_context.clone(),
                    container_security: c.security_context.clone(),
                },
            ))
        })
        .collect();
    templates.sort_by(|a, b| a.0.cmp(&b.0));
    let (name, runtime) = templates.into_iter().next().ok_or_else(|| {
        Error::Missing(
            "no pod (nor StatefulSet's pod template) matches spec.source.selector yet, so the database image is unknown (for the binlog archiver, or set spec.binlogArchive.server.image)".into(),
        )
    })?;
    checked(&format!("StatefulSet {name}'s pod template"), runtime)
}

/// A fingerprint of what the policies selecting a database pod take from it: what pods
/// made from it copy ([`DatabaseRuntime`]: its containers' images and the security
/// settings), and whether it is an established primary for retention (its labels, phase
/// and readiness). A watch of pods passes on only the changes of it (a rollout of the
/// database image, a failover, a primary becoming Ready), not every status change.
pub fn pod_runtime(p: &Pod) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.metadata.uid.hash(&mut h);
    p.metadata.labels.hash(&mut h);
    let status = p.status.as_ref();
    status.and_then(|s| s.phase.as_ref()).hash(&mut h);
    status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| &c.status)
        .hash(&mut h);
    let spec = p.spec.as_ref()?;
    serde_json::to_string(&spec.security_context)
        .unwrap_or_default()
        .hash(&mut h);
    for c in &spec.containers {
        (&c.name, &c.image).hash(&mut h);
        serde_json::to_string(&c.security_context)
            .unwrap_or_default()
            .hash(&mut h);
    }
    Some(h.finish())
}

/// The policies that look at `pod` (a `source` that selects it): for the binlog archiver's
/// [`DatabaseRuntime`] (`binlogArchive.server`), or for retention's established primary.
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
            p.spec.retention.is_some()
                || p.spec
                    .binlog_archive
                    .as_ref()
                    .is_some_and(|a| a.server.is_some())
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

/// The StatefulSets whose pod template the policy's source selects, each with the names of
/// its claim templates: their claims (`<template>-<set>-<ordinal>`) are the database's own.
///
/// # Errors
/// The policy has no source; the API refused the list.
pub(crate) async fn claim_templates(
    ctx: &Context,
    policy: &BackupPolicy,
) -> Result<Vec<(String, Vec<String>)>, Error> {
    Ok(policy_sets(ctx, policy)
        .await?
        .into_iter()
        .map(|s| (s.name, s.templates))
        .collect())
}

/// A StatefulSet the policy's source selects: its name, its claim templates' names and
/// how many replicas it asks for.
pub(crate) struct PolicySet {
    pub name: String,
    pub templates: Vec<String>,
    pub replicas: i32,
    /// Its first ordinal (`spec.ordinals.start`, 0 unless set).
    pub start: i32,
}

impl PolicySet {
    /// Whether the set asks for the pod of `ordinal` (`start <= ordinal < start + replicas`).
    pub fn asks_for(&self, ordinal: i32) -> bool {
        self.start <= ordinal && ordinal < self.start.saturating_add(self.replicas)
    }

    /// The ordinal of the pod that mounts `claim` (`<template>-<set>-<ordinal>`), when it
    /// is one of this set's claims.
    pub fn ordinal_of(&self, claim: &str) -> Option<i32> {
        self.templates.iter().find_map(|t| {
            let n = claim.strip_prefix(&format!("{t}-{}-", self.name))?;
            if n.is_empty() || n.len() > 9 || !n.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            n.parse().ok()
        })
    }
}

/// The StatefulSets the policy's source selects (see [`claim_templates`]).
///
/// # Errors
/// As [`claim_templates`].
pub(crate) async fn policy_sets(
    ctx: &Context,
    policy: &BackupPolicy,
) -> Result<Vec<PolicySet>, Error> {
    let Some(source) = policy.spec.source.as_ref() else {
        return Ok(Vec::new());
    };
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default());
    let listed = crate::lean::list(&sets, &ListParams::default(), crate::lean::meta_of).await?;
    Ok(listed
        .iter()
        .filter_map(|set| {
            let spec = set.spec.as_ref()?;
            let labels = spec.template.metadata.as_ref()?.labels.as_ref()?;
            if !tidemark_api::lifecycle::selects(&source.selector, labels) {
                return None;
            }
            let templates = spec
                .volume_claim_templates
                .iter()
                .flatten()
                .filter_map(|t| t.metadata.name.clone())
                .collect();
            Some(PolicySet {
                name: set.name_any(),
                templates,
                // Unset: the API's default, one.
                replicas: spec.replicas.unwrap_or(1),
                start: spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0),
            })
        })
        .collect())
}
