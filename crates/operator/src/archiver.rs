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
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use tidemark_api::crd::BackupPolicy;

use crate::context::Context;
use crate::database::{DatabaseRuntime, database_runtime};
use crate::error::Error;
use crate::pod::{self, TOOLS_DIR};
use crate::status::FIELD_MANAGER;
use crate::stores::SecretKeys;

/// Where fetched binlogs wait in the archiver's pod.
const SPOOL: &str = "/spool";

/// The Deployment's name.
pub fn deployment_name(policy: &str) -> String {
    let base = crate::names::prefix(policy, 45);
    format!("{base}-binlog-archiver")
}

/// Creates, updates or removes the policy's archiver Deployment.
///
/// # Errors
/// The API failed; the spec lacks what the archiver needs.
pub async fn reconcile(ctx: &Context, policy: &BackupPolicy) -> Result<(), Error> {
    let ns = policy.namespace().unwrap_or_default();
    let name = deployment_name(&policy.name_any());
    let wanted = policy
        .spec
        .binlog_archive
        .as_ref()
        .is_some_and(|a| a.server.is_some());
    if !ctx.capabilities.archiver {
        // Without the right to create or delete Deployments there is nothing to do, and
        // a policy that wants an archiver is told why it has none.
        return if wanted {
            Err(Error::Invalid(crate::rbac::refused(
                "binlogArchive.server",
                "archiver",
            )))
        } else {
            Ok(())
        };
    }
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
    // What the Deployment's arguments carry is checked as the operator's own store
    // opening and interval are.
    if let Some(os) = &policy.spec.object_store {
        os.shared_url(ctx.allow_ambient_credentials)
            .map_err(|e| Error::Invalid(e.to_string()))?;
    }
    policy
        .spec
        .binlog_interval()
        .map_err(|e| Error::Invalid(e.to_string()))?;
    // The archiver locks what it uploads as the policy says: only as this operator allows.
    ctx.tenancy.object_lock(policy)?;
    if let Some(r) = &policy.spec.resources {
        r.validate().map_err(|e| Error::Invalid(e.to_string()))?;
    }
    // Its login (a half `usernameFrom`/`passwordFrom` is refused here too, where no CEL
    // refused it at admission: never an archiver without the login asked for).
    if let Some(s) = &policy.spec.source {
        s.validate().map_err(|e| Error::Invalid(e.to_string()))?;
    }
    // An image other than the database container's runs only where the administrator
    // allows it: the archiver holds the store's keys and the database login.
    let other_image = |image: &str| {
        if ctx.tenancy.allow_archiver_images {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "spec.binlogArchive.server.image {:?} is not the database container's image: the archiver runs with the store's keys and the database login, so only the database's own image is used (the cluster's administrator may allow others: tidemark operator --allow-archiver-images); remove it to use the selected pod's",
                image.chars().take(128).collect::<String>()
            )))
        }
    };
    let runtime = match (database_runtime(ctx, policy).await, &server.image) {
        (Ok(db), Some(image)) if *image != db.image => {
            other_image(image)?;
            DatabaseRuntime {
                image: image.clone(),
                ..db
            }
        }
        (Ok(db), _) => db,
        // The image is given and no pod says more: the pod's defaults.
        (Err(Error::Invalid(_) | Error::Missing(_)), Some(image)) => {
            other_image(image)?;
            DatabaseRuntime {
                image: image.clone(),
                ..Default::default()
            }
        }
        (Err(e), _) => return Err(e),
    };
    let store_secret = crate::stores::policy_secret_keys(ctx, policy).await?;
    // A primary that cannot be asked now (mid-failover, no one labelled pod) keeps the one
    // last confirmed: the archiver then refuses the new server's timeline until it is
    // confirmed, rather than take whichever server it reads.
    let primary = match primary_server_id(ctx, policy).await {
        Some(id) => Some(id),
        None => confirmed_before(&api, &name).await,
    };
    let deployment = archiver(policy, &runtime, &ctx.image, store_secret.as_ref(), primary)
        .map_err(Error::Invalid)?;
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&deployment),
    )
    .await?;
    Ok(())
}

/// The `@@server_id` of the one pod the policy's source selects and labels primary, asked
/// through `pods/exec` with the source's login: the archiver then lets only that server
/// start a timeline (issue 42 §3), so an old primary still writing, or one whose files claim
/// the new primary's transactions, never takes over the archive's main line. `None` (the
/// archiver takes the server it reads as primary, and says so) when there is no one such
/// pod or it cannot be asked; why is logged. A failover moves the label, which looks at the
/// policy again: the archiver is restarted with the new primary's id.
async fn primary_server_id(ctx: &Context, policy: &BackupPolicy) -> Option<u32> {
    let source = policy.spec.source.as_ref()?;
    let ns = policy.namespace().unwrap_or_default();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let selector = crate::names::selector(&source.selector).ok()?;
    let listed = match crate::lean::list(
        &pods,
        &kube::api::ListParams::default().labels(&selector),
        crate::lean::meta_of,
    )
    .await
    {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(policy = %policy.name_any(), error = %e, "the primary's server id: pods not listed");
            return None;
        }
    };
    let role = source
        .role_label
        .as_deref()
        .unwrap_or(crate::names::DEFAULT_ROLE_LABEL);
    let labelled: Vec<_> = listed
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.labels().get(role).is_some_and(|r| r == "primary"))
        .collect();
    let [pod] = labelled.as_slice() else {
        tracing::info!(policy = %policy.name_any(), labelled = labelled.len(), "no one primary pod: the archiver takes the server it reads as primary");
        return None;
    };
    match crate::backup::standby::server_id_of(ctx, source, pod).await {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::warn!(policy = %policy.name_any(), pod = %pod.name_any(), error = %e, "the primary's server id could not be asked: the archiver takes the server it reads as primary");
            None
        }
    }
}

/// The primary server id the archiver Deployment `name` was last given, if any.
async fn confirmed_before(api: &Api<Deployment>, name: &str) -> Option<u32> {
    let d = api.get_opt(name).await.ok()??;
    d.spec?
        .template
        .spec?
        .containers
        .first()?
        .args
        .as_ref()?
        .iter()
        .find_map(|a| a.strip_prefix("--primary-server-id=")?.parse().ok())
}

/// The archiver Deployment of `policy`; with `primary`, only that server (its
/// `@@server_id`) starts a timeline (`--primary-server-id`).
///
/// # Errors
/// The policy lacks an object store or a binlog server.
pub fn archiver(
    policy: &BackupPolicy,
    db: &DatabaseRuntime,
    operator_image: &str,
    store_secret: Option<&SecretKeys>,
    primary: Option<u32>,
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
        .and_then(tidemark_api::policy::SourceSpec::login);
    let mysql = policy
        .spec
        .source
        .as_ref()
        .is_some_and(tidemark_api::policy::SourceSpec::is_mysql);
    if mysql && archive.purge.is_some() {
        return Err("binlogArchive.purge: purging a MySQL server's binlogs is not built yet (its archive is): remove purge, and let the server expire its binlogs (binlog_expire_logs_seconds)".into());
    }
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
        "--max-lag".into(),
        archive.max_lag.clone().unwrap_or_else(|| "5m".into()),
    ];
    if mysql {
        // MySQL's own programs, from the database image's PATH.
        cmd.extend(["--engine".into(), "mysql".into()]);
    }
    if let Some(id) = primary {
        cmd.push(format!("--primary-server-id={id}"));
    }
    if let Some(p) = &archive.purge {
        cmd.push(format!(
            "--purge-keep={}",
            p.keep.as_deref().unwrap_or("1h")
        ));
        // A quantity the CLI reads as bytes.
        if let Some(b) = p
            .max_disk_usage
            .as_deref()
            .and_then(tidemark_api::quantity::bytes)
        {
            cmd.push(format!("--purge-max-disk={b}"));
        }
        for r in &p.replicas {
            cmd.push(format!("--purge-replica={}", r.address()));
        }
    }
    if let Some(c) = &archive.checksums {
        c.validate(true)
            .map_err(|e| format!("binlogArchive.checksums: {e}"))?;
        cmd.push(format!(
            "--checksums-every={}",
            c.every.as_deref().unwrap_or("1h")
        ));
        cmd.push(format!(
            "--checksum-chunk-rows={}",
            c.chunk_rows.unwrap_or(tidemark_mariadb::oracle::CHUNK_ROWS)
        ));
        cmd.push(format!(
            "--checksum-pause={}ms",
            c.pause_milliseconds.unwrap_or(50)
        ));
        cmd.extend(c.tables.iter().map(|t| format!("--checksum-tables={t}")));
        cmd.extend(c.skip.iter().map(|t| format!("--checksum-skip={t}")));
    }
    cmd.push("--".into());
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
    env.extend(pod::bandwidth_env(&policy.spec));
    if let Some(db) = &login {
        env.extend(pod::login_env(db));
    }
    let labels = pod::labels("tidemark.io/binlog-archiver", &policy.name_any());
    let owner = crate::context::owner_ref(policy).ok_or("the BackupPolicy has no uid yet")?;
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
                    // Nothing in it talks to the API: no token for a planted tool to read.
                    automount_service_account_token: pod::NO_TOKEN,
                    affinity: pod::architecture_affinity(),
                    security_context: db.pod_security.clone(),
                    init_containers: Some(vec![pod::install_container(
                        operator_image,
                        db.pod_security.as_ref(),
                        policy,
                    )]),
                    containers: vec![Container {
                        name: "archiver".into(),
                        resources: pod::resources(policy, |r| r.archiver.as_ref()),
                        image: Some(db.image.clone()),
                        security_context: db.container_security.clone(),
                        command: Some(vec!["sh".into(), "-c".into()]),
                        args: Some(args),
                        env: Some(env),
                        volume_mounts: Some(vec![
                            pod::tools_mount(),
                            pod::mount("spool", SPOOL),
                            pod::tmp_mount(),
                        ]),
                        termination_message_policy: Some(pod::TERMINATION_MESSAGE_POLICY.into()),
                        ..Default::default()
                    }],
                    volumes: Some(vec![
                        pod::tools_volume(),
                        pod::empty_volume("spool"),
                        pod::tmp_volume(),
                    ]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    })
}

/// Which BackupPolicy an archiver Deployment belongs to.
pub fn policy_of(d: &Deployment) -> Option<kube::runtime::reflector::ObjectRef<BackupPolicy>> {
    let ns = d.namespace()?;
    d.owner_references()
        .iter()
        .find(|o| o.kind == "BackupPolicy" && o.controller == Some(true))
        .map(|o| kube::runtime::reflector::ObjectRef::new(&o.name).within(&ns))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn policy(engine: &str, purge: bool) -> BackupPolicy {
        let mut archive = json!({"server": {"host": "db-primary"}});
        if purge {
            archive["purge"] = json!({"keep": "2h"});
        }
        serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
            "metadata": {"name": "shop", "namespace": "ns", "uid": "0123"},
            "spec": {
                "objectStore": {"bucket": "b", "endpoint": "http://s3:9000"},
                "source": {"selector": {"matchLabels": {"app": "db"}}, "credentialsSecret": "db", "engine": engine},
                "binlogArchive": archive,
            },
        }))
        .unwrap()
    }

    /// Issue 47: a MySQL source's archiver reads it with MySQL's programs; purging its
    /// binlogs is refused by name (not built), not ignored.
    #[test]
    fn a_mysql_sources_archiver_names_its_engine() {
        let db = DatabaseRuntime {
            image: "mysql:9.7".into(),
            pod_security: None,
            container_security: None,
        };
        let args = |engine: &str| {
            let d = archiver(&policy(engine, false), &db, "tidemark:test", None, None).unwrap();
            let spec = d.spec.unwrap().template.spec.unwrap();
            spec.containers[0].args.clone().unwrap().join(" ")
        };
        let mysql = args("mysql");
        assert!(mysql.contains("--from-server --spool /spool"), "{mysql}");
        assert!(mysql.contains(" --engine mysql "), "{mysql}");
        assert!(mysql.ends_with("--host=db-primary --port=3306"), "{mysql}");
        assert!(!args("mariadb").contains("--engine"));
        let e = archiver(&policy("mysql", true), &db, "tidemark:test", None, None).unwrap_err();
        assert!(e.contains("binlogArchive.purge"), "{e}");
    }

    /// Issue 48: `binlogArchive.checksums` becomes the archiver's `--checksum*` flags, each
    /// pattern one flag (no shell between: a pattern is one argument whatever it holds).
    #[test]
    fn the_oracles_checksums_become_the_archivers_flags() {
        let db = DatabaseRuntime {
            image: "mariadb:11.4".into(),
            pod_security: None,
            container_security: None,
        };
        let mut p = policy("mariadb", false);
        let args = |p: &BackupPolicy| {
            let d = archiver(p, &db, "tidemark:test", None, None).unwrap();
            let spec = d.spec.unwrap().template.spec.unwrap();
            spec.containers[0].args.clone().unwrap()
        };
        assert!(!args(&p).iter().any(|a| a.starts_with("--checksum")));
        p.spec.binlog_archive.as_mut().unwrap().checksums =
            Some(tidemark_api::policy::BinlogChecksumsSpec::default());
        let defaults = args(&p).join(" ");
        assert!(
            defaults.contains(
                "--checksums-every=1h --checksum-chunk-rows=10000 --checksum-pause=50ms --"
            ),
            "{defaults}"
        );
        p.spec.binlog_archive.as_mut().unwrap().checksums =
            Some(tidemark_api::policy::BinlogChecksumsSpec {
                every: Some("30m".into()),
                tables: vec!["shop.*".into()],
                skip: vec!["shop.audit log; rm -rf /".into()],
                chunk_rows: Some(5000),
                pause_milliseconds: Some(0),
                client: vec![],
            });
        let given = args(&p);
        for flag in [
            "--checksums-every=30m",
            "--checksum-chunk-rows=5000",
            "--checksum-pause=0ms",
            "--checksum-tables=shop.*",
            "--checksum-skip=shop.audit log; rm -rf /",
        ] {
            assert!(given.iter().any(|a| a == flag), "{flag}: {given:?}");
        }
        p.spec.binlog_archive.as_mut().unwrap().checksums =
            Some(tidemark_api::policy::BinlogChecksumsSpec {
                tables: vec!["orders".into()],
                ..Default::default()
            });
        let e = archiver(&p, &db, "tidemark:test", None, None).unwrap_err();
        assert!(e.contains("spec.binlogArchive.checksums.tables"), "{e}");
    }
}
