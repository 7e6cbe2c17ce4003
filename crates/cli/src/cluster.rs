//! The commands that read the Kubernetes cluster (kubeconfig as kubectl reads it), also
//! reachable as `kubectl tidemark …` when the binary is installed as `kubectl-tidemark`:
//! `backup <policy> [--wait]` creates a Backup (seed 001's "skip the YAML and use the
//! plugin"); `ls|plan|gc <policy>` read the BackupPolicy's store with its Secret.

use std::collections::HashSet;
use std::time::Duration;

use jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPhase, BackupPolicy};
use tidemark_store::ClusterStore;

use crate::args::{BackupArgs, KubeArgs};
use crate::exit::{CliError, Exit};

/// A BackupPolicy read from the cluster: the document the file commands understand, its
/// store opened with its Secret, and the backup-ids its Backups hold.
pub struct ClusterPolicy {
    pub document: tidemark_api::BackupPolicy,
    pub store: ClusterStore,
    pub holds: HashSet<String>,
    /// What the namespace's Restores of this policy use (reason `restore:<name>`).
    pub restore_holds: Vec<tidemark_core::RestoreHold>,
    /// The DeleteHooks of the namespace, as `gc` runs them: webhooks are called from here;
    /// a job needs the cluster's operator (a deletion it selects is refused unless
    /// `--skip-hooks`). A `command` action runs in no cluster and is left out.
    pub hooks: Vec<tidemark_engine::hooks::LocalHook>,
}

/// The cluster's client as kubectl would make it from `--kubeconfig`, `--context`, `--as`
/// and `--as-group`.
async fn client(args: &KubeArgs) -> Result<Client, CliError> {
    let no_config = |e: &dyn std::fmt::Display| {
        CliError::input(format!(
            "no Kubernetes configuration (a kubeconfig as kubectl reads it, or in-cluster): {e}"
        ))
    };
    let options = kube::config::KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let mut config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| CliError::input(format!("--kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| CliError::input(format!("--kubeconfig {}: {e}", path.display())))?
        }
        (None, Some(context)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| CliError::input(format!("--context {context}: {e}")))?,
        (None, None) => kube::Config::infer().await.map_err(|e| no_config(&e))?,
    };
    if let Some(user) = &args.as_user {
        config.auth_info.impersonate = Some(user.clone());
        if !args.as_group.is_empty() {
            config.auth_info.impersonate_groups = Some(args.as_group.clone());
        }
    }
    Client::try_from(config).map_err(|e| no_config(&e))
}

pub(crate) fn api_error(what: &str, e: kube::Error) -> CliError {
    match &e {
        kube::Error::Api(s) if s.code == 403 || s.code == 401 => {
            CliError::input(format!("{what}: not allowed: {}", s.message))
        }
        _ => CliError::new(Exit::Store, anyhow::anyhow!("{what}: {e}")),
    }
}

/// The cluster's client, and the namespace `-n` names (else the kubeconfig's).
pub(crate) async fn client_in(args: &KubeArgs) -> Result<(Client, String), CliError> {
    let client = client(args).await?;
    let ns = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    Ok((client, ns))
}

/// BackupPolicy `ns/name` from the API server; its absence is the user's input error.
async fn read_policy(client: &Client, ns: &str, name: &str) -> Result<BackupPolicy, CliError> {
    Api::<BackupPolicy>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| api_error(&format!("BackupPolicy {ns}/{name}"), e))?
        .ok_or_else(|| {
            CliError::input(format!(
                "BackupPolicy {ns}/{name} does not exist (kubectl get backuppolicies -n {ns})"
            ))
        })
}

/// Reads BackupPolicy `name` (in `--namespace`, else the kubeconfig's namespace).
///
/// # Errors
/// No cluster configuration, no such policy, or its Secret / store cannot be used.
pub async fn policy(
    args: &KubeArgs,
    name: &str,
    copy: Option<&str>,
    endpoint: Option<&str>,
) -> Result<ClusterPolicy, CliError> {
    let (client, ns) = client_in(args).await?;
    let p = read_policy(&client, &ns, name).await?;
    // `--from-copy NAME`: the policy as its copy sees it (the copy's store, Secret and
    // retention), and the holds of the Restores that read from it.
    let p = match copy {
        None => p,
        Some(c) => p.as_copy(c).ok_or_else(|| {
            CliError::input(format!(
                "--from-copy {c}: BackupPolicy {ns}/{name} names no such copy (spec.copies: {})",
                p.spec.copy_names()
            ))
        })?,
    };
    // `--endpoint URL`: the same store reached another way from here (a port-forward).
    let mut p = p;
    if let Some(url) = endpoint {
        let usable = (url.starts_with("http://") || url.starts_with("https://"))
            && endpoint_host(url).is_some_and(|(h, _)| !h.is_empty());
        if !usable {
            return Err(CliError::input(format!(
                "--endpoint {url}: expected http(s)://host:port, e.g. http://127.0.0.1:8333 (a port-forward of the store's Service)"
            )));
        }
        match p.spec.object_store.as_mut() {
            Some(o) => o.endpoint = Some(url.to_owned()),
            None => {
                return Err(CliError::input(format!(
                    "--endpoint: BackupPolicy {ns}/{name} has no spec.objectStore"
                )));
            }
        }
    }
    let endpoint = p
        .spec
        .object_store
        .as_ref()
        .and_then(|o| o.endpoint.as_deref());
    if let Some(why) = reachable_only_inside(endpoint, &ns, name).await {
        return Err(CliError::new(Exit::Store, anyhow::anyhow!(why)));
    }
    let store =
        tidemark_operator::stores::open_store(&client, &p, Duration::from_secs(60), true, &[])
            .await
            .map_err(|e| match e.class() {
                tidemark_engine::Class::Store => CliError::new(Exit::Store, e),
                _ => CliError::input(format!("BackupPolicy {ns}/{name}: {e}")),
            })?
            .with_budget(crate::resolve::budget()?);
    let backups: Api<Backup> = Api::namespaced(client.clone(), &ns);
    let listed = backups
        .list(&ListParams::default())
        .await
        .map_err(|e| api_error(&format!("Backups in {ns}"), e))?;
    let holds = tidemark_operator::holds::held_ids(listed.items.iter(), &ns, name);
    let restores: Api<tidemark_api::crd::Restore> = Api::namespaced(client.clone(), &ns);
    let restore_holds = tidemark_operator::holds::restore_holds_in(
        restores
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error(&format!("Restores in {ns}"), e))?
            .items
            .iter(),
        &listed.items.iter().collect::<Vec<_>>(),
        &ns,
        name,
        copy,
    );
    let delete_hooks: Api<tidemark_api::crd::DeleteHook> = Api::namespaced(client.clone(), &ns);
    let hooks: Vec<tidemark_engine::hooks::LocalHook> = delete_hooks
        .list(&ListParams::default())
        .await
        .map_err(|e| api_error(&format!("DeleteHooks in {ns}"), e))?
        .items
        .iter()
        // A copy's own retention deletes a copy of the data, not the backup: no hooks.
        .filter(|_| copy.is_none())
        .filter_map(|h| {
            use tidemark_engine::hooks::HookAction;
            let action = match (&h.spec.webhook, &h.spec.job) {
                (Some(w), _) => HookAction::Webhook(w.clone()),
                (None, Some(_)) => HookAction::Job,
                (None, None) => return None,
            };
            Some(tidemark_engine::hooks::LocalHook {
                name: h.name_any(),
                selector: h.spec.selector.clone(),
                action,
                // A bad timeout: the operator fails such a hook; here it gets the default.
                timeout: h
                    .spec
                    .timeout()
                    .unwrap_or(std::time::Duration::from_secs(300)),
            })
        })
        .collect();
    let document = tidemark_api::BackupPolicy {
        api_version: tidemark_api::API_VERSION.to_owned(),
        kind: "BackupPolicy".to_owned(),
        metadata: tidemark_api::policy::ObjectMeta {
            name: p.name_any(),
            namespace: Some(ns),
            ..Default::default()
        },
        spec: p.spec.clone(),
        status: None,
    };
    Ok(ClusterPolicy {
        document,
        store,
        holds,
        restore_holds,
        hooks,
    })
}

/// The host of an endpoint URL (`http://minio.minio.svc:9000` → `minio.minio.svc`).
fn endpoint_host(endpoint: &str) -> Option<(String, u16)> {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (h, after) = v6.split_once(']')?;
            (
                h.to_owned(),
                after.strip_prefix(':').and_then(|p| p.parse().ok()),
            )
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().ok()),
            None => (authority.to_owned(), None),
        },
    };
    let port = port.unwrap_or(if endpoint.starts_with("http://") {
        80
    } else {
        443
    });
    (!host.is_empty()).then_some((host, port))
}

/// Whether a name is one only a cluster's DNS answers: a Service's (`minio.minio.svc`,
/// `….svc.cluster.local`). Other names are looked up.
fn cluster_internal_name(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    host.ends_with(".svc") || host.ends_with(".cluster.local")
}

/// Why a policy's store cannot be reached from here, when its endpoint is a name only the
/// cluster's DNS answers (or one that does not resolve here) and this is not a pod: said at
/// once, with how to run the command inside the cluster (issue 46 §4), rather than after
/// the store's retries.
async fn reachable_only_inside(endpoint: Option<&str>, ns: &str, name: &str) -> Option<String> {
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return None;
    }
    let endpoint = endpoint?;
    let (host, port) = endpoint_host(endpoint)?;
    let why = if cluster_internal_name(&host) {
        "a name only the cluster's DNS answers"
    } else {
        let lookup = tokio::net::lookup_host((host.as_str(), port));
        let resolved = match tokio::time::timeout(Duration::from_secs(5), lookup).await {
            Ok(Ok(addrs)) => addrs.count() > 0,
            _ => false,
        };
        if resolved {
            return None;
        }
        "a name that does not resolve here"
    };
    // A Service's name (`<service>.<namespace>.svc…`): reachable from here through a
    // port-forward, with the rights of the namespace alone.
    let labels: Vec<&str> = host.trim_end_matches('.').split('.').collect();
    let scheme = if endpoint.starts_with("https://") {
        "https"
    } else {
        "http"
    };
    // A port below 1024 would need root here: forwarded from 8333.
    let (local, ports) = if port < 1024 {
        (8333, format!("8333:{port}"))
    } else {
        (port, port.to_string())
    };
    let forward = match labels.as_slice() {
        [service, namespace, "svc", ..] => format!(
            "; or reach it from here through a port-forward (`pods/portforward` in {namespace}): kubectl -n {namespace} port-forward svc/{service} {ports} & then kubectl tidemark <command> {name} -n {ns} --endpoint {scheme}://127.0.0.1:{local}"
        ),
        _ => String::new(),
    };
    Some(format!(
        "BackupPolicy {ns}/{name}'s store endpoint {endpoint} is {why}: the store is reachable only from inside the cluster. Run the same command there, e.g. in the operator's pod, which has the binary and the rights: kubectl exec -n tidemark-system deploy/tidemark-operator -- /tidemark <command> {name} -n {ns}{forward}"
    ))
}

/// `tidemark backup <policy> [--wait]`.
///
/// # Errors
/// No such policy; the Backup could not be created; with `--wait`, it failed (exit 6) or
/// did not end in time.
pub async fn backup(args: &BackupArgs) -> Result<Exit, CliError> {
    let (client, ns) = client_in(&args.kube).await?;
    let policy = read_policy(&client, &ns, &args.policy).await?;
    timeout_of(&args.timeout)?;
    if let Some(ttl) = &args.ttl {
        crate::resolve::warn_ambiguous_flag("--ttl", Some(ttl));
        ttl.parse::<tidemark_core::RetentionDuration>()
            .map_err(|e| CliError::input(format!("--ttl: {e}")))?;
    }
    let name = format!(
        "{}-manual-{}",
        args.policy,
        Timestamp::now().strftime("%Y%m%d%H%M%S")
    );
    let mut spec = json!({"policy": {"name": args.policy}, "type": args.kind});
    if let Some(m) = &args.method {
        spec["method"] = json!(m);
    }
    if let Some(t) = &args.target {
        spec["target"] = json!(t);
    }
    // Seed 004: the policy's ttl is the default of the backups it takes.
    if let Some(ttl) = args.ttl.as_ref().or(policy.spec.ttl.as_ref()) {
        spec["ttl"] = json!(ttl);
    }
    let b: Backup = serde_json::from_value(json!({
        "apiVersion": tidemark_api::API_VERSION,
        "kind": "Backup",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .map_err(|e| CliError::new(Exit::Internal, e))?;
    let backups: Api<Backup> = Api::namespaced(client.clone(), &ns);
    create(&backups, &ns, &name, &b).await?;
    if !args.wait {
        crate::output::emit(&format!("{name}\n"))?;
        return Ok(Exit::Success);
    }
    follow(&backups, &ns, &name, &args.timeout, |b: Backup| {
        let status = b.status.unwrap_or_default();
        let condition = status
            .conditions
            .first()
            .map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_default();
        let ended = match status.phase {
            Some(BackupPhase::Completed) => Some(Ok(format!(
                "{name} completed: backup-id {}\n",
                status.backup_id.unwrap_or_default()
            ))),
            Some(BackupPhase::Failed) => Some(Err(CliError::new(
                Exit::SourceFailed,
                anyhow::anyhow!(
                    "Backup {ns}/{name} failed: {}",
                    status.error.unwrap_or_default()
                ),
            ))),
            _ => None,
        };
        (condition, ended)
    })
    .await
}

/// Creates `object` (`ns/name`) and says so on stderr.
async fn create<K>(api: &Api<K>, ns: &str, name: &str, object: &K) -> Result<(), CliError>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let kind = K::kind(&());
    api.create(&PostParams::default(), object)
        .await
        .map_err(|e| api_error(&format!("creating {kind} {ns}/{name}"), e))?;
    eprintln!("created {kind} {ns}/{name}");
    Ok(())
}

/// `--timeout`, read (before anything is created: a bad value leaves nothing behind).
fn timeout_of(t: &str) -> Result<jiff::SignedDuration, CliError> {
    t.parse().map_err(|_| {
        CliError::input(format!(
            "--timeout: invalid duration {t:?}; expected e.g. 30m or 2h"
        ))
    })
}

/// Follows the object `ns/name` until `look` says it ended (`Ok`: what to print, exit 0;
/// `Err`: its failure), printing each change of what `look` says of it on stderr; after
/// `timeout` (a duration such as `1h`) it fails with exit 1, the object going on.
async fn follow<K>(
    api: &Api<K>,
    ns: &str,
    name: &str,
    timeout: &str,
    look: impl Fn(K) -> (String, Option<Result<String, CliError>>),
) -> Result<Exit, CliError>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&());
    let deadline = Timestamp::now() + timeout_of(timeout)?;
    let mut last_reported = String::new();
    loop {
        let Some(object) = api
            .get_opt(name)
            .await
            .map_err(|e| api_error(&format!("{kind} {ns}/{name}"), e))?
        else {
            return Err(CliError::new(
                Exit::Internal,
                anyhow::anyhow!("{kind} {ns}/{name} was deleted before it ended"),
            ));
        };
        let (condition, ended) = look(object);
        if !condition.is_empty() && condition != last_reported {
            eprintln!("{name}: {condition}");
            last_reported = condition;
        }
        match ended {
            Some(Ok(done)) => {
                crate::output::emit(&done)?;
                return Ok(Exit::Success);
            }
            Some(Err(e)) => return Err(e),
            None => {}
        }
        if Timestamp::now() > deadline {
            return Err(CliError::new(
                Exit::Internal,
                anyhow::anyhow!(
                    "{kind} {ns}/{name} did not finish within --timeout {timeout}; it goes on (kubectl get {} {name} -n {ns})",
                    kind.to_lowercase()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `tidemark restore POLICY --into CLAIM | --new-claim CLAIM [--to TIME] [--wait]`: creates
/// a Restore of the policy (the operator does the work), and with `--wait` follows it to its
/// end.
///
/// # Errors
/// No such policy; the Restore could not be created; with `--wait`, its target cannot be
/// restored (exit 7), it failed (exit 8) or it did not end in time.
pub async fn restore(
    args: &crate::args::RestoreArgs,
    policy: &str,
    to: Option<Timestamp>,
) -> Result<Exit, CliError> {
    let (client, ns) = client_in(&args.kube).await?;
    if let Some(set) = &args.statefulset {
        return restore_statefulset(args, policy, to, &client, &ns, set).await;
    }
    if args.replace_data && args.into.is_none() {
        return Err(CliError::input(
            "--replace-data replaces the data of --into CLAIM or of --statefulset NAME's claims: give one",
        ));
    }
    let into = match (&args.into, &args.new_claim) {
        (Some(claim), None) => json!({"claim": claim, "replaceData": args.replace_data}),
        (None, Some(claim)) => {
            let mut n = json!({"name": claim});
            if let Some(c) = &args.storage_class {
                n["storageClassName"] = json!(c);
            }
            if let Some(size) = &args.size {
                n["size"] = json!(size);
            }
            json!({"newClaim": n})
        }
        _ => {
            return Err(CliError::input(
                "restore POLICY: name the claim to restore into with --into CLAIM (an existing one no pod uses) or --new-claim CLAIM (or print the plan with --dry-run)",
            ));
        }
    };
    let name = args.name.clone().unwrap_or_else(|| {
        let mut base: String = policy.chars().take(40).collect();
        while base.ends_with(['-', '.']) {
            base.pop();
        }
        format!(
            "{base}-restore-{}",
            Timestamp::now().strftime("%Y%m%d%H%M%S")
        )
    });
    let restore = restore_object(args, policy, to, &ns, &name, into)?;
    check_restore_policy(args, &client, &ns, policy).await?;
    timeout_of(&args.timeout)?;
    let restores: Api<tidemark_api::crd::Restore> = Api::namespaced(client.clone(), &ns);
    create(&restores, &ns, &name, &restore).await?;
    if !args.wait {
        crate::output::emit(&format!("{name}\n"))?;
        return Ok(Exit::Success);
    }
    follow_restore(&restores, &ns, &name, &args.timeout).await
}

/// The Restore `name` of `policy` into `into`, checked as the operator checks it.
fn restore_object(
    args: &crate::args::RestoreArgs,
    policy: &str,
    to: Option<Timestamp>,
    ns: &str,
    name: &str,
    into: serde_json::Value,
) -> Result<tidemark_api::crd::Restore, CliError> {
    let target = match to {
        Some(t) => json!({"to": t.to_string()}),
        None => json!({}),
    };
    let mut spec = json!({"policy": {"name": policy}, "target": target, "into": into});
    // `--from-copy NAME`: the Restore reads the policy's copy of that name.
    if let Some(copy) = &args.store.from_copy {
        spec["from"] = json!(copy);
    }
    let restore: tidemark_api::crd::Restore = serde_json::from_value(json!({
        "apiVersion": tidemark_api::API_VERSION,
        "kind": "Restore",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .map_err(|e| CliError::new(Exit::Internal, e))?;
    // The same checks as the operator's, before anything is created: the name labels the
    // claim it makes, so it is a label value too.
    tidemark_api::names::dns_subdomain("--name", name)
        .and_then(|()| tidemark_api::names::label_value_name("--name", name))
        .map_err(|e| CliError::input(format!("restore {policy}: {e}")))?;
    restore
        .spec
        .checked()
        .map_err(|e| CliError::input(format!("restore {policy}: {e}")))?;
    Ok(restore)
}

/// The policy exists, and has the copy `--from-copy` names.
async fn check_restore_policy(
    args: &crate::args::RestoreArgs,
    client: &Client,
    ns: &str,
    policy: &str,
) -> Result<(), CliError> {
    let p = read_policy(client, ns, policy).await?;
    if let Some(copy) = args
        .store
        .from_copy
        .as_deref()
        .filter(|c| p.spec.copy(c).is_none())
    {
        return Err(CliError::input(format!(
            "--from-copy {copy}: BackupPolicy {ns}/{policy} names no such copy (spec.copies: {})",
            p.spec.copy_names()
        )));
    }
    Ok(())
}

/// At most this many claims are restored by one `--statefulset`.
const MAX_STATEFULSET_CLAIMS: usize = 64;

/// `restore POLICY --statefulset NAME --replace-data`: one Restore per claim of the
/// StatefulSet (scaled to 0), all to the same point; with `--wait`, followed one after the
/// other (the operator runs them at once), then their positions compared.
async fn restore_statefulset(
    args: &crate::args::RestoreArgs,
    policy: &str,
    to: Option<Timestamp>,
    client: &Client,
    ns: &str,
    set: &str,
) -> Result<Exit, CliError> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let sts = sets
        .get_opt(set)
        .await
        .map_err(|e| api_error(&format!("StatefulSet {ns}/{set}"), e))?
        .ok_or_else(|| {
            CliError::input(format!("--statefulset {set}: no StatefulSet {ns}/{set}"))
        })?;
    let spec = sts.spec.clone().unwrap_or_default();
    let running = sts.status.as_ref().map_or(0, |s| s.replicas);
    let scale = format!("kubectl -n {ns} scale statefulset {set} --replicas=0");
    if spec.replicas.unwrap_or(1) > 0 || running > 0 {
        return Err(CliError::input(format!(
            "--statefulset {set}: it has {} replica(s) ({running} running); scale it to 0 first ({scale}, and pause what scales it back: docs/operator.md), as each Restore refuses a claim a pod may use",
            spec.replicas.unwrap_or(1)
        )));
    }
    let templates: Vec<String> = spec
        .volume_claim_templates
        .iter()
        .flatten()
        .filter_map(|t| t.metadata.name.clone())
        .collect();
    let template = match (&args.claim_template, templates.as_slice()) {
        (Some(t), all) if all.contains(t) => t.clone(),
        (Some(t), all) => {
            return Err(CliError::input(format!(
                "--claim-template {t}: StatefulSet {ns}/{set} has no such claim template (it has: {})",
                list_or_none(all)
            )));
        }
        (None, [one]) => one.clone(),
        (None, all) => {
            return Err(CliError::input(format!(
                "--statefulset {set}: give --claim-template, the one that holds the data (it has: {})",
                list_or_none(all)
            )));
        }
    };
    let prefix = format!("{template}-{set}-");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let mut ordinals: Vec<(u32, String)> = claims
        .list_metadata(&kube::api::ListParams::default())
        .await
        .map_err(|e| api_error(&format!("the claims of {ns}"), e))?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter_map(|n| {
            let suffix = n.strip_prefix(&prefix)?;
            // `01` is no pod's ordinal: only the StatefulSet's own spelling.
            let ordinal = suffix.parse::<u32>().ok()?;
            (ordinal.to_string() == suffix).then_some((ordinal, n))
        })
        .collect();
    ordinals.sort();
    if ordinals.is_empty() {
        return Err(CliError::input(format!(
            "--statefulset {set}: no claim {prefix}<ordinal> in {ns}; nothing to restore in place (a new database: --new-claim)"
        )));
    }
    if ordinals.len() > MAX_STATEFULSET_CLAIMS {
        return Err(CliError::input(format!(
            "--statefulset {set}: {} claims; at most {MAX_STATEFULSET_CLAIMS} are restored at once",
            ordinals.len()
        )));
    }
    if !args.replace_data {
        return Err(CliError::input(format!(
            "--statefulset {set}: its claims {} hold data; give --replace-data to replace it",
            ordinals
                .iter()
                .map(|(_, c)| c.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    // `<base>-<ordinal>` stays a label value (63): the default base gives the
    // StatefulSet's name what room is left.
    let base = args.name.clone().unwrap_or_else(|| {
        let stamp = Timestamp::now().strftime("%Y%m%d%H%M%S").to_string();
        let widest = ordinals.last().map_or(1, |(o, _)| o.to_string().len());
        let room = 63 - "-restore-".len() - stamp.len() - 1 - widest;
        let mut set: String = set.chars().take(room).collect();
        while set.ends_with(['-', '.']) {
            set.pop();
        }
        format!("{set}-restore-{stamp}")
    });
    let deadline = Timestamp::now() + timeout_of(&args.timeout)?;
    let mut planned = Vec::new();
    for (ordinal, claim) in &ordinals {
        let name = format!("{base}-{ordinal}");
        let into = json!({"claim": claim, "replaceData": true});
        planned.push((
            name.clone(),
            restore_object(args, policy, to, ns, &name, into)?,
        ));
    }
    check_restore_policy(args, client, ns, policy).await?;
    let restores: Api<tidemark_api::crd::Restore> = Api::namespaced(client.clone(), ns);
    // All or none: a name taken refuses before any claim is touched.
    for (name, _) in &planned {
        if restores
            .get_opt(name)
            .await
            .map_err(|e| api_error(&format!("Restore {ns}/{name}"), e))?
            .is_some()
        {
            return Err(CliError::input(format!(
                "Restore {ns}/{name} exists already: none was made; give another --name (or delete the Restores of an earlier run)"
            )));
        }
    }
    // One point for every claim: without --to, the first Restore's plan names it, and the
    // others restore to that instant (the newest could move between their plans).
    let mut to = to;
    for (i, (name, restore)) in planned.iter_mut().enumerate() {
        if i > 0
            && let Some(t) = to
        {
            restore.spec.target.to = Some(t.to_string());
        }
        create(&restores, ns, name, restore).await?;
        eprintln!(
            "{name}: restores claim {}",
            restore.spec.into.claim.as_deref().unwrap_or_default()
        );
        if to.is_none() {
            to = Some(planned_instant(&restores, ns, name, deadline).await?);
        }
    }
    let names: Vec<&str> = planned.iter().map(|(n, _)| n.as_str()).collect();
    if !args.wait {
        crate::output::emit(&format!("{}\n", names.join("\n")))?;
        return Ok(Exit::Success);
    }
    // One deadline for them all: they run at once.
    for name in &names {
        let left = deadline.duration_since(Timestamp::now()).as_secs().max(1);
        follow_restore(&restores, ns, name, &format!("{left}s")).await?;
    }
    // One point for all: the replicas resume from the primary's position.
    let mut positions = Vec::new();
    for name in &names {
        let r = restores
            .get(name)
            .await
            .map_err(|e| api_error(&format!("Restore {ns}/{name}"), e))?;
        let position = r.status.and_then(|s| s.gtid_position).unwrap_or_default();
        positions.push(((*name).to_owned(), position));
    }
    if positions
        .iter()
        .any(|(_, p)| p.is_empty() || *p != positions[0].1)
    {
        return Err(CliError::new(
            Exit::RestoreFailed,
            anyhow::anyhow!(
                "the claims of StatefulSet {ns}/{set} did not report one GTID position ({}); restore them again to one --to instant",
                positions
                    .iter()
                    .map(|(n, p)| format!("{n}: {p}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let restored: Vec<String> = ordinals.iter().map(|(o, _)| o.to_string()).collect();
    crate::output::emit(&format!(
        "StatefulSet {ns}/{set}: {} claim(s) restored to GTID position {} (ordinals {}); scale it back to its count: kubectl -n {ns} scale statefulset {set} --replicas=N\n",
        positions.len(),
        positions[0].1,
        restored.join(", ")
    ))?;
    Ok(Exit::Success)
}

/// The instant Restore `name`'s plan resolved (`status.target`), waited for until
/// `deadline`.
async fn planned_instant(
    restores: &Api<tidemark_api::crd::Restore>,
    ns: &str,
    name: &str,
    deadline: Timestamp,
) -> Result<Timestamp, CliError> {
    loop {
        let r = restores
            .get(name)
            .await
            .map_err(|e| api_error(&format!("Restore {ns}/{name}"), e))?;
        let status = r.status.unwrap_or_default();
        if let Some(t) = status.target {
            eprintln!(
                "{name}: restores {}; the other claims restore to it too",
                t.0
            );
            return Ok(t.0);
        }
        if status.phase.as_deref() == Some("Failed") {
            let why = status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_default();
            return Err(CliError::new(
                Exit::RestoreFailed,
                anyhow::anyhow!(
                    "Restore {ns}/{name} failed before it planned ({why}); no other claim was touched"
                ),
            ));
        }
        if Timestamp::now() > deadline {
            return Err(CliError::new(
                Exit::Internal,
                anyhow::anyhow!(
                    "Restore {ns}/{name} had no plan within --timeout; no other claim was touched"
                ),
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// `a, b, c`, or `none`.
fn list_or_none(all: &[String]) -> String {
    if all.is_empty() {
        "none".to_owned()
    } else {
        all.join(", ")
    }
}

/// Follows Restore `name` until it ends: exit 0 succeeded, 7 not restorable, 8 failed.
async fn follow_restore(
    restores: &Api<tidemark_api::crd::Restore>,
    ns: &str,
    name: &str,
    timeout: &str,
) -> Result<Exit, CliError> {
    follow(
        restores,
        ns,
        name,
        timeout,
        |r: tidemark_api::crd::Restore| {
            let status = r.status.unwrap_or_default();
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
            let condition = ready
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_default();
            let not_restorable = ready.is_some_and(|c| c.reason == "NotRestorable");
            let ended = match status.phase.as_deref() {
                Some("Succeeded") => Some(Ok(format!(
                    "{name} succeeded: {} restored into claim {}\n",
                    status.target.map(|t| t.0.to_string()).unwrap_or_default(),
                    status.claim.unwrap_or_default()
                ))),
                Some("Failed") => Some(Err(CliError::new(
                    if not_restorable {
                        Exit::NotRestorable
                    } else {
                        Exit::RestoreFailed
                    },
                    anyhow::anyhow!("Restore {ns}/{name} failed: {condition}"),
                ))),
                _ => None,
            };
            (condition, ended)
        },
    )
    .await
}

/// The annotation that asks the operator for a restore test now (the operator's
/// `restoretest::ANNOTATION`).
const RESTORE_TEST_ANNOTATION: &str = "tidemark.io/restore-test";

/// `tidemark restore-test POLICY [--wait]`: asks the operator for a restore test of the
/// policy's store now — the annotation [`RESTORE_TEST_ANNOTATION`] set to this instant —
/// and with `--wait` follows the policy's `status.restoreTest` until the operator has acted
/// on this request and recorded its outcome.
///
/// # Errors
/// No such policy, or the annotation could not be set; with `--wait`, the test failed
/// (exit 4, as a local `restore-test`) or did not end in time.
pub async fn restore_test(
    args: &crate::args::RestoreTestArgs,
    name: &str,
) -> Result<Exit, CliError> {
    let (client, ns) = client_in(&args.kube).await?;
    read_policy(&client, &ns, name).await?;
    let api: Api<BackupPolicy> = Api::namespaced(client, &ns);
    let asked = Timestamp::now();
    let value = asked.to_string();
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({
            "metadata": {"annotations": {RESTORE_TEST_ANNOTATION: value}}
        })),
    )
    .await
    .map_err(|e| api_error(&format!("BackupPolicy {ns}/{name}"), e))?;
    eprintln!("{name}: asked for a restore test ({RESTORE_TEST_ANNOTATION}={value})");
    if !args.wait {
        crate::output::emit(&format!(
            "restore test asked for; its outcome: kubectl get backuppolicies.tidemark.io {name} -n {ns} -o jsonpath='{{.status.restoreTest.last}}'\n"
        ))?;
        return Ok(Exit::Success);
    }
    let structured = args.output.structured();
    follow(&api, &ns, name, &args.timeout, |policy: BackupPolicy| {
        let test = policy
            .status
            .and_then(|s| s.restore_test)
            .unwrap_or_default();
        let acted = test.request.as_deref() == Some(value.as_str());
        let condition = match (&test.job, acted) {
            (_, false) => "waiting for the operator".to_owned(),
            (Some(job), true) => format!("running (Job {job})"),
            (None, true) => String::new(),
        };
        // The request is recorded with its Job, which goes only once the outcome is in
        // `last`: acted on and no Job is this test's outcome (no clock compared).
        let ended = test.last.filter(|_| acted && test.job.is_none()).map(|l| {
            let document = crate::output::rendered_as(args.output, &l);
            let what = format!(
                "restore test of {}{}: {} ({} table(s) checked{})\n",
                l.backup_id.as_deref().unwrap_or("the newest backup"),
                l.target
                    .as_ref()
                    .map(|t| format!(" at {}", t.0))
                    .unwrap_or_default(),
                if l.passed { "passed" } else { "FAILED" },
                l.tables_checked.unwrap_or(0),
                if l.problems.is_empty() {
                    String::new()
                } else {
                    format!("; {}", l.problems.join("; "))
                }
            );
            if l.passed {
                if structured { document } else { Ok(what) }
            } else {
                Err(CliError::new(
                    Exit::Data,
                    anyhow::anyhow!("{}", what.trim_end()),
                ))
            }
        });
        (condition, ended)
    })
    .await
}

/// `tidemark status POLICY`: everything about a policy's health in one document.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusOut {
    namespace: String,
    policy: String,
    store: Option<String>,
    cluster: String,
    conditions: Vec<ConditionOut>,
    recovery_window: Option<serde_json::Value>,
    promised_window: Option<String>,
    binlog_archive: Option<serde_json::Value>,
    /// Each copy (`status.copies`): its window, lag and last pass.
    copies: Vec<serde_json::Value>,
    last_pass: Option<serde_json::Value>,
    schedules: Vec<ScheduleOut>,
    backups: Vec<BackupOut>,
    restore_test: Option<serde_json::Value>,
    verification: Option<serde_json::Value>,
    restores: Vec<RestoreOut>,
    warnings: Vec<WarningOut>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ConditionOut {
    #[serde(rename = "type")]
    kind: String,
    status: String,
    reason: String,
    message: String,
    since: Timestamp,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ScheduleOut {
    name: String,
    schedule: String,
    suspended: bool,
    last: Option<Timestamp>,
    next: Option<Timestamp>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BackupOut {
    name: String,
    phase: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    backup_id: Option<String>,
    completed_at: Option<Timestamp>,
    size: Option<u64>,
    error: Option<String>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RestoreOut {
    name: String,
    phase: Option<String>,
    target: Option<Timestamp>,
    reached: Option<Timestamp>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct WarningOut {
    reason: String,
    note: String,
    at: Option<Timestamp>,
    count: i32,
}

/// The most recent warnings shown.
const STATUS_WARNINGS: usize = 5;

/// `status POLICY`: reads the policy, its ScheduledBackups, Backups and Restores and the
/// Warning events about it, and prints them as one screen (or one document).
///
/// # Errors
/// No cluster configuration, no such policy, or the API refused a read.
pub async fn status(args: &crate::args::StatusArgs) -> Result<Exit, CliError> {
    use tidemark_api::crd::{Restore, ScheduledBackup};
    let (client, ns) = client_in(&args.kube).await?;
    let name = args.policy.as_str();
    let policy = read_policy(&client, &ns, name).await?;
    let ns = ns.as_str();
    let list = |what: &'static str| move |e| api_error(&format!("{what} in {ns}"), e);
    let schedules: Vec<ScheduledBackup> = Api::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(list("ScheduledBackups"))?
        .items;
    let mut backups: Vec<Backup> = Api::<Backup>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(list("Backups"))?
        .items
        .into_iter()
        .filter(|b| b.spec.template.policy.name == name)
        .collect();
    let restores: Vec<Restore> = Api::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(list("Restores"))?
        .items;
    // Only the Warning events about this policy (the API server filters).
    let events: Vec<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!(
            "regarding.kind=BackupPolicy,regarding.name={name},type=Warning"
        )))
        .await
        .map_err(list("Events"))?
        .items;

    let status = policy.status.clone().unwrap_or_default();
    let created = |b: &Backup| b.metadata.creation_timestamp.as_ref().map(|t| t.0);
    backups.sort_by_key(|b| std::cmp::Reverse(created(b)));
    let mut warnings: Vec<WarningOut> = events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("BackupPolicy") && r.name.as_deref() == Some(name)
            })
        })
        .map(|e| WarningOut {
            reason: e.reason.clone().unwrap_or_default(),
            note: e.note.clone().unwrap_or_default(),
            at: last_seen(e),
            count: times_seen(e),
        })
        .collect();
    warnings.sort_by_key(|w| std::cmp::Reverse(w.at));
    warnings.truncate(STATUS_WARNINGS);
    let out = StatusOut {
        namespace: ns.to_owned(),
        policy: name.to_owned(),
        store: policy
            .spec
            .object_store
            .as_ref()
            .and_then(|s| s.store_url().ok()),
        cluster: policy
            .spec
            .cluster
            .clone()
            .unwrap_or_else(|| name.to_owned()),
        conditions: status
            .conditions
            .iter()
            .map(|c| ConditionOut {
                kind: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                since: c.last_transition_time.0,
            })
            .collect(),
        recovery_window: status.recovery_window.as_ref().and_then(value),
        promised_window: policy
            .spec
            .retention
            .as_ref()
            .and_then(|r| r.window.clone()),
        binlog_archive: status.binlog_archive.as_ref().and_then(value),
        copies: status.copies.iter().filter_map(value).collect(),
        last_pass: status.last_retention_run_time.as_ref().map(|at| {
            json!({
                "at": at.0,
                "next": status.next_retention_run_time.as_ref().map(|t| t.0),
                "backupsKept": status.backups_kept,
                "backupsDeleted": status.backups_deleted,
                "segmentsDeleted": status.segments_deleted,
                "bytesFreed": status.bytes_freed,
                "failures": status.failures,
            })
        }),
        schedules: schedules
            .iter()
            .filter(|s| s.spec.template.policy.name == name)
            .map(|s| {
                let st = s.status.clone().unwrap_or_default();
                ScheduleOut {
                    name: s.name_any(),
                    schedule: s.spec.schedule.clone(),
                    suspended: s.spec.suspend,
                    last: st.last_schedule_time.map(|t| t.0),
                    next: st.next_schedule_time.map(|t| t.0),
                }
            })
            .collect(),
        backups: backups
            .iter()
            .take(usize::from(args.backups))
            .map(|b| {
                let st = b.status.clone().unwrap_or_default();
                BackupOut {
                    name: b.name_any(),
                    phase: st
                        .phase
                        .and_then(|p| value(&p))
                        .and_then(|v| v.as_str().map(str::to_owned)),
                    kind: st.kind,
                    backup_id: st.backup_id,
                    completed_at: st.completed_at.map(|t| t.0),
                    size: st.size,
                    error: st.error,
                }
            })
            .collect(),
        restore_test: status.restore_test.as_ref().and_then(value),
        verification: status.verification.as_ref().and_then(value),
        restores: restores
            .iter()
            .filter(|r| r.spec.policy.name == name)
            .map(|r| {
                let st = r.status.clone().unwrap_or_default();
                RestoreOut {
                    name: r.name_any(),
                    phase: st.phase,
                    target: st.target.map(|t| t.0),
                    reached: st.reached.map(|t| t.0),
                }
            })
            .collect(),
        warnings,
    };
    if args.output.structured() {
        crate::output::emit_as(args.output, &out)?;
    } else {
        crate::output::emit(&status_text(&out))?;
    }
    Ok(Exit::Success)
}

/// When an event was last seen: its series' last observation, else its own time.
pub(crate) fn last_seen(e: &k8s_openapi::api::events::v1::Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.deprecated_last_timestamp.as_ref().map(|t| t.0))
}

/// How many times an event was seen (its series' count, else once).
pub(crate) fn times_seen(e: &k8s_openapi::api::events::v1::Event) -> i32 {
    e.series.as_ref().map_or(1, |s| s.count)
}

/// The events about the object, oldest first (the API server filters by kind and name).
fn value<T: serde::Serialize>(v: &T) -> Option<serde_json::Value> {
    serde_json::to_value(v).ok()
}

/// `status`'s screen for people.
fn status_text(s: &StatusOut) -> String {
    use std::fmt::Write;
    let time = |t: Option<Timestamp>| t.map_or_else(|| "-".to_owned(), |t| t.to_string());
    let field = |v: &serde_json::Value, k: &str| -> String {
        match &v[k] {
            serde_json::Value::Null => "-".to_owned(),
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    };
    let mut o = String::new();
    let _ = writeln!(o, "BackupPolicy {}/{}", s.namespace, s.policy);
    let _ = writeln!(
        o,
        "Store:            {} (cluster {})",
        s.store.as_deref().unwrap_or("-"),
        s.cluster
    );
    let ready = s.conditions.iter().find(|c| c.kind == "Ready");
    let _ = writeln!(
        o,
        "Health:           {}",
        ready.map_or_else(
            || "no retention pass yet".to_owned(),
            |c| format!(
                "{} ({}) since {}: {}",
                if c.status == "True" {
                    "ready"
                } else {
                    "NOT READY"
                },
                c.reason,
                c.since,
                crate::output::printable(&c.message)
            )
        )
    );
    let window = s.recovery_window.as_ref().map_or_else(
        || "- (no pass yet)".to_owned(),
        |w| {
            let gaps = w["gaps"].as_array().map_or(0, Vec::len);
            format!(
                "{} → {}{}",
                field(w, "start"),
                field(w, "end"),
                if gaps == 0 {
                    String::new()
                } else {
                    format!(", {gaps} GAP(S)")
                }
            )
        },
    );
    let _ = writeln!(
        o,
        "Recovery window:  {window}{}",
        s.promised_window
            .as_deref()
            .map(|p| format!(" (promised: {p})"))
            .unwrap_or_default()
    );
    if let Some(a) = &s.binlog_archive {
        let _ = writeln!(
            o,
            "Binlog archive:   {} through {} (server {}, timeline {})",
            if a["behind"] == true {
                "BEHIND"
            } else {
                "current"
            },
            field(a, "archivedThrough"),
            field(a, "serverId"),
            field(a, "timeline")
        );
    }
    for c in &s.copies {
        let window = &c["recoveryWindow"];
        let _ = writeln!(
            o,
            "Copy {:<12} {} through {}, {} s behind (window {} → {}); last pass {}{}",
            field(c, "name"),
            if c["behind"] == true {
                "BEHIND"
            } else {
                "current"
            },
            field(c, "copiedThrough"),
            field(c, "lagSeconds"),
            field(window, "start"),
            field(window, "end"),
            field(c, "lastCopyTime"),
            c["error"]
                .as_str()
                .map(|e| format!(": {}", crate::output::printable(e)))
                .unwrap_or_default()
        );
    }
    if let Some(p) = &s.last_pass {
        let _ = writeln!(
            o,
            "Last pass:        {}: kept {}, deleted {} backup(s) and {} segment(s), {} freed, {} failure(s); next {}",
            field(p, "at"),
            field(p, "backupsKept"),
            field(p, "backupsDeleted"),
            field(p, "segmentsDeleted"),
            p["bytesFreed"]
                .as_u64()
                .map_or_else(|| "-".to_owned(), crate::output::human_bytes),
            field(p, "failures"),
            field(p, "next")
        );
    }
    // A scheduled check's line: its last outcome (or none yet) and the next.
    let check =
        |o: &mut String, title: &str, check: &serde_json::Value, at: &str, details: String| {
            let last = &check["last"];
            let outcome = if last.is_null() {
                "none yet".to_owned()
            } else {
                format!(
                    "{} at {} ({details})",
                    if last["passed"] == true {
                        "passed"
                    } else {
                        "FAILED"
                    },
                    field(last, at)
                )
            };
            let _ = writeln!(
                o,
                "{title:<18}{outcome}; next {}",
                field(check, "nextScheduleTime")
            );
        };
    if let Some(t) = &s.restore_test {
        let last = &t["last"];
        let details = format!(
            "backup {}, {} table(s)",
            field(last, "backupId"),
            field(last, "tablesChecked")
        );
        check(&mut o, "Restore test:", t, "testedAt", details);
    }
    if let Some(v) = &s.verification {
        let details = format!("{} problem(s)", field(&v["last"], "problemCount"));
        check(&mut o, "Verification:", v, "verifiedAt", details);
    }
    let _ = writeln!(o, "\nConditions:");
    if s.conditions.is_empty() {
        let _ = writeln!(o, "  (none)");
    }
    for c in &s.conditions {
        let _ = writeln!(
            o,
            "  {:<22} {:<6} {:<24} {}  {}",
            c.kind,
            c.status,
            c.reason,
            c.since,
            crate::output::printable(&c.message)
        );
    }
    let _ = writeln!(o, "\nSchedules:");
    let rows: Vec<Vec<String>> = s
        .schedules
        .iter()
        .map(|x| {
            vec![
                x.name.clone(),
                x.schedule.clone(),
                if x.suspended { "yes" } else { "no" }.to_owned(),
                time(x.last),
                time(x.next),
            ]
        })
        .collect();
    o.push_str(&indent(
        &rows,
        &["NAME", "SCHEDULE", "SUSPENDED", "LAST", "NEXT"],
    ));
    let _ = writeln!(o, "\nNewest Backups:");
    let rows: Vec<Vec<String>> = s
        .backups
        .iter()
        .map(|b| {
            vec![
                b.name.clone(),
                b.phase.clone().unwrap_or_else(|| "-".into()),
                b.kind.clone().unwrap_or_else(|| "-".into()),
                time(b.completed_at),
                b.size
                    .map_or_else(|| "-".to_owned(), crate::output::human_bytes),
                crate::output::printable(b.error.as_deref().unwrap_or_default()),
            ]
        })
        .collect();
    o.push_str(&indent(
        &rows,
        &["NAME", "PHASE", "TYPE", "COMPLETED", "SIZE", "ERROR"],
    ));
    if !s.restores.is_empty() {
        let _ = writeln!(o, "\nRestores:");
        let rows: Vec<Vec<String>> = s
            .restores
            .iter()
            .map(|r| {
                vec![
                    r.name.clone(),
                    r.phase.clone().unwrap_or_else(|| "-".into()),
                    time(r.target),
                    time(r.reached),
                ]
            })
            .collect();
        o.push_str(&indent(&rows, &["NAME", "PHASE", "TARGET", "REACHED"]));
    }
    let _ = writeln!(o, "\nRecent warnings:");
    if s.warnings.is_empty() {
        let _ = writeln!(o, "  (none)");
    }
    for w in &s.warnings {
        let _ = writeln!(
            o,
            "  {} {} (x{}): {}",
            time(w.at),
            crate::output::printable(&w.reason),
            w.count,
            crate::output::printable(&w.note)
        );
    }
    o
}

/// A table indented two spaces, or `(none)`.
fn indent(rows: &[Vec<String>], header: &[&str]) -> String {
    if rows.is_empty() {
        return "  (none)\n".to_owned();
    }
    crate::output::table(header, rows)
        .lines()
        .map(|l| format!("  {l}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host and port of an endpoint, whatever its form; a Service's name is told from
    /// a name the machine may resolve.
    #[test]
    fn an_endpoint_names_its_host() {
        let cases = [
            (
                "http://minio.minio.svc:9000",
                Some(("minio.minio.svc", 9000)),
            ),
            ("https://s3.example.com", Some(("s3.example.com", 443))),
            ("http://10.0.0.5", Some(("10.0.0.5", 80))),
            ("https://[fd00::1]:8443/path?x#y", Some(("fd00::1", 8443))),
            (
                "https://user@minio.ns.svc.cluster.local/",
                Some(("minio.ns.svc.cluster.local", 443)),
            ),
            ("https://", None),
        ];
        for (endpoint, want) in cases {
            let got = endpoint_host(endpoint);
            assert_eq!(
                got.as_ref().map(|(h, p)| (h.as_str(), *p)),
                want,
                "{endpoint}"
            );
        }
        assert!(cluster_internal_name("minio.minio.svc"));
        assert!(cluster_internal_name("minio.minio.svc.cluster.local."));
        assert!(!cluster_internal_name("s3.example.com"));
        assert!(!cluster_internal_name("minio"));
    }
}
