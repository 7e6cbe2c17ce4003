//! The parts every pod the operator creates is made of (backup and consolidation Jobs, the
//! binlog archiver): `tidemark` copied in by an init container, the store's location and
//! credentials in the environment as Secret references, the database login written to an
//! option file, and the labels that mark them as Tidemark's.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSecurityContext, PodSpec, SeccompProfile,
    SecretKeySelector, SecurityContext, Volume, VolumeMount,
};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tidemark_api::ObjectStoreSpec;
use tidemark_api::crd::BackupPolicy;
use tidemark_api::policy::Login;

use crate::names::MANAGED_BY;
use crate::stores::SecretKeys;

/// How long a backup Job may run (`activeDeadlineSeconds`) before it is stopped and the
/// Backup recorded as failed.
pub const JOB_DEADLINE_SECONDS: i64 = 24 * 3600;

/// Where the init container puts the `tidemark` binary (and the database option file).
pub const TOOLS_DIR: &str = "/tidemark-bin";
/// The volume that carries it.
const TOOLS_VOLUME: &str = "tidemark-bin";
/// The store's endpoint, region and credentials (as Secret references) for `tidemark`.
pub fn store_env(os: &ObjectStoreSpec, keys: Option<&SecretKeys>) -> Vec<EnvVar> {
    let mut env = Vec::new();
    if let Some(ep) = &os.endpoint {
        let azure = os
            .url
            .as_deref()
            .is_some_and(|u| u.starts_with("az://") || u.starts_with("azure://"));
        let var = if azure {
            "AZURE_STORAGE_ENDPOINT"
        } else {
            "AWS_ENDPOINT_URL"
        };
        env.push(plain(var, ep));
    }
    if let Some(r) = &os.region {
        env.push(plain("AWS_REGION", r));
    }
    if let Some(pem) = &os.ca_bundle {
        env.push(plain("TIDEMARK_CA_BUNDLE", pem));
    }
    if let Some(c) = &os.compression {
        env.push(plain("TIDEMARK_COMPRESSION", c));
    }
    // Public keys: what uploads are encrypted to. The identities that read them go only to
    // the pods that read payloads ([`identity_env`]).
    if let Some(e) = os.encryption.as_ref().filter(|e| !e.recipients.is_empty()) {
        env.push(plain("TIDEMARK_RECIPIENTS", &e.recipients.join(",")));
        if let Some(t) = e.plaintext_before.as_deref() {
            env.push(plain("TIDEMARK_ALLOW_PLAINTEXT_BEFORE", t));
        }
    }
    // Object lock: what a pod commits is locked in this mode (its date is an argument),
    // and what it deletes goes with every version.
    if let Some(l) = &os.object_lock {
        env.push(plain("TIDEMARK_LOCK_MODE", &l.mode));
        if let Some(p) = &l.period {
            env.push(plain("TIDEMARK_LOCK_PERIOD", p));
        }
    }
    if let Some(s) = keys {
        for (var, key) in &s.env {
            env.push(from_secret(var, &s.name, key));
        }
    }
    env
}

/// `spec.bandwidth` as `TIDEMARK_BANDWIDTH`, for the pods that move the policy's bytes
/// (backup, restore and consolidation Jobs, the binlog archiver): they hold their
/// transfers to it.
pub fn bandwidth_env(spec: &tidemark_api::policy::BackupPolicySpec) -> Option<EnvVar> {
    spec.bandwidth
        .as_deref()
        .map(|b| plain("TIDEMARK_BANDWIDTH", b))
}

/// The age identities of `objectStore.encryption` (`identityFrom`, or `identitySecret`'s
/// key `identity`), by reference, as `TIDEMARK_IDENTITY`: for the pods that read encrypted
/// payloads (consolidation Jobs).
pub fn identity_env(os: &ObjectStoreSpec) -> Option<EnvVar> {
    let r = os.encryption.as_ref()?.identity()?;
    Some(from_secret("TIDEMARK_IDENTITY", &r.name, &r.key))
}

/// The database login, by reference, as `$DB_USER` and `$DB_PASSWORD`, for
/// [`login_script`].
pub fn login_env(login: &Login) -> [EnvVar; 2] {
    [
        from_secret("DB_USER", &login.user.name, &login.user.key),
        from_secret("DB_PASSWORD", &login.password.name, &login.password.key),
    ]
}

/// The container script that writes the database login from `$DB_USER` / `$DB_PASSWORD`
/// into a mode-600 option file (`[client]`, values double-quoted with backslashes doubled,
/// so `#` and `\` in a password are read as written), then runs `tidemark "$@"`. The
/// password is in no argument of any process.
pub fn login_script() -> String {
    format!(
        r#"umask 077 && q() {{ printf '%s' "$1" | sed 's/\\/\\\\/g'; }} && printf '[client]\nuser="%s"\npassword="%s"\n' "$(q "$DB_USER")" "$(q "$DB_PASSWORD")" > {TOOLS_DIR}/my.cnf && exec {TOOLS_DIR}/tidemark "$@""#
    )
}

/// The container script that runs `tidemark "$@"` (no database login).
pub fn tidemark_script() -> String {
    format!("exec {TOOLS_DIR}/tidemark \"$@\"")
}

/// `automountServiceAccountToken` of every pod Tidemark builds (backup, consolidation,
/// restore test, archiver): none talks to the API, and each runs tools on files from the
/// bucket — a token there would be the operator's reach handed to whoever can write it
/// (issue 28).
pub const NO_TOKEN: Option<bool> = Some(false);

/// The init container that copies `tidemark` from the operator's `image` into
/// [`TOOLS_DIR`] (`tidemark install`: the target image may have no `cp`), in a pod whose
/// pod-level security settings are `pod_security`.
///
/// It meets the Pod Security Standards' `restricted` level on its own — no privilege
/// escalation, no capabilities, the runtime's seccomp profile, a read-only root — so a
/// namespace that enforces it admits the pod whenever the database's own containers are
/// admitted. It runs as non-root (the image's user 65532, or the pod's) unless the pod
/// itself runs as root.
pub fn install_container(
    image: &str,
    pod_security: Option<&PodSecurityContext>,
    policy: &BackupPolicy,
) -> Container {
    let pod_is_root = pod_security.is_some_and(|p| p.run_as_user == Some(0));
    Container {
        name: "tidemark".into(),
        resources: resources(policy, |r| r.install.as_ref()),
        image: Some(image.to_owned()),
        command: Some(vec![
            "/tidemark".into(),
            "install".into(),
            format!("{TOOLS_DIR}/tidemark"),
        ]),
        volume_mounts: Some(vec![tools_mount()]),
        termination_message_policy: Some(TERMINATION_MESSAGE_POLICY.into()),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            read_only_root_filesystem: Some(true),
            run_as_non_root: (!pod_is_root).then_some(true),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The resources `pick` chooses from `policy`'s `spec.resources`, for a container (none
/// unless the policy gives them).
pub fn resources(
    policy: &BackupPolicy,
    pick: impl Fn(&tidemark_api::PodResources) -> Option<&tidemark_api::Resources>,
) -> Option<k8s_openapi::api::core::v1::ResourceRequirements> {
    policy
        .spec
        .resources
        .as_ref()
        .and_then(pick)
        .map(tidemark_api::Resources::to_requirements)
}

/// Where a container's exit message comes from: the end of its log when it fails without
/// writing `/dev/termination-log` — so a failed Job's cause reaches the Backup's status
/// (and events) without reading logs.
pub const TERMINATION_MESSAGE_POLICY: &str = "FallbackToLogsOnError";

/// At most this much of a pod's own error is carried into a status or an event (the API
/// keeps event notes up to 1 KiB).
pub const FAILURE_LIMIT: usize = 1024;

/// Why a finished Job's pod failed, in its own words: the exit message of the container
/// that exited non-zero (init containers first) — with [`TERMINATION_MESSAGE_POLICY`], the
/// end of its log — its last [`FAILURE_LIMIT`] bytes, secret-looking words hidden, e.g.
/// `container backup exited 1: error: cannot open store …`. `None` when no pod is left or
/// none says anything.
pub async fn job_failure(client: &Client, job: &Job) -> Option<String> {
    terminations(client, job)
        .await
        .into_iter()
        .find_map(|(name, code, said)| {
            if code == 0 {
                return None;
            }
            // Hidden before it is cut: a cut through `--password=…` would no longer look
            // like a secret.
            let said = tidemark_engine::redact::redact(&[said.trim().to_owned()]).remove(0);
            let said = tail(&said, FAILURE_LIMIT).to_owned();
            Some(if said.is_empty() {
                format!("container {name} exited {code}")
            } else {
                format!("container {name} exited {code}: {said}")
            })
        })
}

/// The architecture this operator's binary — and so its image, and the copy its Jobs put
/// into the database image — is built for, as Kubernetes names it (`kubernetes.io/arch`).
pub fn built_for() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The architectures the operator's image is built for: `TIDEMARK_IMAGE_ARCHITECTURES`
/// (comma-separated, e.g. `amd64,arm64` for a multi-platform image, whose every node pulls
/// its own), else this binary's own ([`built_for`]).
fn image_architectures() -> Vec<String> {
    std::env::var("TIDEMARK_IMAGE_ARCHITECTURES")
        .ok()
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| vec![built_for().to_owned()])
}

/// The label of a node's architecture (the kubelet sets it).
const ARCH_LABEL: &str = "kubernetes.io/arch";

/// What every pod that runs this operator's binary (copied into the database image) asks
/// of its node: one of [`image_architectures`]. A Job or the archiver never lands where the
/// binary cannot start (`exec format error`); with no such node it stays Pending, its
/// events saying which requirement no node meets.
pub fn architecture_requirement() -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: ARCH_LABEL.into(),
        operator: "In".into(),
        values: Some(image_architectures()),
    }
}

/// An affinity of [`architecture_requirement`] alone.
pub fn architecture_affinity() -> Option<Affinity> {
    let mut spec = PodSpec::default();
    pin_architecture(&mut spec);
    spec.affinity
}

/// Adds [`architecture_requirement`] to `spec`'s required node affinity: to each of its
/// terms (a node must meet one of them), or as its only term.
pub fn pin_architecture(spec: &mut PodSpec) {
    let required = spec
        .affinity
        .get_or_insert_with(Default::default)
        .node_affinity
        .get_or_insert_with(Default::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(Default::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(architecture_requirement());
    }
}

/// Why a Job on `pod`'s node cannot run this operator's binary: the node's
/// `kubernetes.io/arch` is not one of [`image_architectures`]. `None` when it can, or when
/// the node cannot be read (no right to Nodes: the Job then fails with the runtime's `exec
/// format error`).
pub async fn foreign_architecture(client: &Client, pod: &Pod) -> Option<String> {
    let node = pod.spec.as_ref()?.node_name.as_deref()?;
    let found = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get_opt(node)
        .await
        .ok()??;
    let arch = found.metadata.labels.as_ref()?.get("kubernetes.io/arch")?;
    let ours = image_architectures();
    (!ours.iter().any(|a| a == arch)).then(|| {
        let ours = ours.join(", ");
        format!(
            "the database pod {} runs on node {node}, whose architecture is {arch}: this operator's image, and the binary its backup Jobs copy into the database image, are built for {ours} only (docs/operator.md, \"Architectures\"); run the database on {ours} nodes, or an image built for {arch} too (then set TIDEMARK_IMAGE_ARCHITECTURES on the operator)",
            pod.name_any()
        )
    })
}

/// At most this much of a Job's log is kept in its object's status (`logTail`).
pub const LOG_TAIL_LIMIT: usize = 4096;
/// At most this much of a Job's log is read for it, and for at most this long.
const LOG_READ_LIMIT: i64 = 64 * 1024;
const LOG_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Words that mark a line of a log as naming a secret (any case): the line is hidden
/// whole, whatever its form (`password: x`, `"token":"x"`, `IDENTIFIED BY 'x'`).
const SECRET_WORDS: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "identified by",
    "credential",
    "private key",
    "age-secret-key",
    "authorization",
];

/// A log line as kept: without control characters, and hidden whole when it names a
/// secret (see [`SECRET_WORDS`]).
fn shown_line(line: &str) -> String {
    let lower = line.to_lowercase();
    if SECRET_WORDS.iter().any(|w| lower.contains(w)) {
        return "[a line naming a secret, hidden]".to_owned();
    }
    line.chars()
        .filter(|c| !c.is_control() || *c == '\t')
        .collect()
}
/// The lines of a Job's log read for [`job_log_tail`].
const LOG_TAIL_LINES: i64 = 60;

/// The end of the log of the main container of `job`'s newest pod — its last
/// [`LOG_TAIL_LINES`] lines, at most [`LOG_TAIL_LIMIT`] bytes, secret-looking words hidden
/// and control characters dropped — kept in the Backup's or Restore's status when the Job
/// ends, so `kubectl tidemark logs` shows it once the Job and its pod are gone. `None` when
/// no pod is left or its log cannot be read.
pub async fn job_log_tail(client: &Client, job: &Job) -> Option<String> {
    let ns = job.metadata.namespace.as_deref()?;
    let container = job
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .name
        .clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let newest = job_pods(client, job).await.first()?.metadata.name.clone()?;
    // Bounded on the server's side too (a line may be long): the kubelet reads from the
    // first of the last lines and stops at the byte limit, so a cut read would miss the
    // end — the lines that say why; then the last few lines alone.
    let mut log = String::new();
    for lines in [LOG_TAIL_LINES, 3] {
        let params = kube::api::LogParams {
            container: Some(container.clone()),
            tail_lines: Some(lines),
            limit_bytes: Some(LOG_READ_LIMIT),
            ..Default::default()
        };
        let read = tokio::time::timeout(LOG_READ_TIMEOUT, pods.logs(&newest, &params))
            .await
            .ok()?
            .ok()?;
        let cut = read.len() >= usize::try_from(LOG_READ_LIMIT).unwrap_or(usize::MAX);
        log = read;
        if !cut {
            break;
        }
    }
    let lines: Vec<String> = log.lines().map(shown_line).collect();
    let whole = tidemark_engine::redact::redact(&lines).join("\n");
    let whole = whole.trim();
    let text = tail(whole, LOG_TAIL_LIMIT);
    // Cut: from the first whole line.
    let text = match text.split_once('\n') {
        Some((_, rest)) if text.len() < whole.len() => rest,
        _ => text,
    };
    (!text.is_empty()).then(|| text.to_owned())
}

/// The pods of `job`, newest first (none when they cannot be listed).
async fn job_pods(client: &Client, job: &Job) -> Vec<Pod> {
    let (Some(ns), Some(uid)) = (
        job.metadata.namespace.as_deref(),
        job.metadata.uid.as_deref(),
    ) else {
        return Vec::new();
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let Ok(list) = pods
        .list(&ListParams::default().labels(&format!("controller-uid={uid}")))
        .await
    else {
        return Vec::new();
    };
    let mut pods = list.items;
    pods.sort_by(|a, b| {
        b.metadata
            .creation_timestamp
            .cmp(&a.metadata.creation_timestamp)
    });
    pods
}

/// What the container `container` of a finished Job's pod said when it exited 0: its
/// termination message (at most 4 KiB, the kubelet's bound). `None` when no pod is left,
/// or it did not succeed.
pub async fn job_report(client: &Client, job: &Job, container: &str) -> Option<String> {
    terminations(client, job)
        .await
        .into_iter()
        .find(|(name, code, _)| name == container && *code == 0)
        .map(|(_, _, said)| said)
}

/// The containers of the newest pod of `job` that have terminated (init containers first):
/// name, exit code, termination message.
async fn terminations(client: &Client, job: &Job) -> Vec<(String, i32, String)> {
    // The newest pod's word first.
    job_pods(client, job)
        .await
        .iter()
        .flat_map(|p| {
            let st = p.status.clone().unwrap_or_default();
            st.init_container_statuses
                .into_iter()
                .chain(st.container_statuses)
                .flatten()
                .filter_map(|c| {
                    let t = c.state?.terminated?;
                    Some((c.name, t.exit_code, t.message.unwrap_or_default()))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The last `limit` bytes of `s`, cut at a character boundary.
pub fn tail(s: &str, limit: usize) -> &str {
    &s[s.ceil_char_boundary(s.len().saturating_sub(limit))..]
}

/// [`TOOLS_DIR`], mounted.
pub fn tools_mount() -> VolumeMount {
    mount(TOOLS_VOLUME, TOOLS_DIR)
}

/// The empty volume behind [`TOOLS_DIR`].
pub fn tools_volume() -> Volume {
    empty_volume(TOOLS_VOLUME)
}

/// The empty volume mounted at `/tmp` in the containers the operator runs in the
/// database's image (backup, archiver, consolidation): they take the database container's
/// security context, and with `readOnlyRootFilesystem` the image's own `/tmp` cannot be
/// written — where `tidemark push` keeps its LSN directory and `mariabackup` its files.
const TMP_VOLUME: &str = "tidemark-tmp";

/// [`TMP_VOLUME`] at `/tmp`.
pub fn tmp_mount() -> VolumeMount {
    mount(TMP_VOLUME, "/tmp")
}

/// The empty volume behind [`tmp_mount`].
pub fn tmp_volume() -> Volume {
    empty_volume(TMP_VOLUME)
}

pub fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

/// A volume `name` of the claim `claim`.
pub fn claim_volume(name: &str, claim: &str) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(
            k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: None,
            },
        ),
        ..Default::default()
    }
}

pub fn empty_volume(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

/// `--store URL --cluster NAME` of `policy`, for a `tidemark` command a Job runs.
///
/// # Errors
/// The policy has no object store, or its URL cannot be formed.
pub fn store_args(policy: &BackupPolicy) -> Result<Vec<String>, String> {
    let os = policy
        .spec
        .object_store
        .as_ref()
        .ok_or("the BackupPolicy has no spec.objectStore")?;
    Ok(vec![
        "--store".into(),
        os.store_url().map_err(|e| e.to_string())?,
        "--cluster".into(),
        policy.spec.cluster_or(&policy.name_any()).to_owned(),
    ])
}

/// [`MANAGED_BY`] and `key=value`.
pub fn labels(key: &str, value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
        (key.to_owned(), value.to_owned()),
    ])
}

pub fn plain(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

pub fn from_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every term of a pod's required node affinity gets the architecture's requirement
    /// (terms are OR-ed: one without it would let the pod onto any node); a pod without
    /// one gets it as its only term; what the terms asked stays.
    #[test]
    fn the_architecture_is_required_in_every_term() {
        let arch = |spec: &PodSpec| -> Vec<Vec<String>> {
            spec.affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(|r| {
                    r.node_selector_terms
                        .iter()
                        .map(|t| {
                            t.match_expressions
                                .iter()
                                .flatten()
                                .map(|e| format!("{} {} {:?}", e.key, e.operator, e.values))
                                .collect()
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let ours = format!(
            "kubernetes.io/arch In {:?}",
            Some(vec![built_for().to_owned()])
        );
        let mut bare = PodSpec::default();
        pin_architecture(&mut bare);
        assert_eq!(arch(&bare), vec![vec![ours.clone()]]);
        assert_eq!(architecture_affinity(), bare.affinity);
        let mut two: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                ]}}},
        }))
        .unwrap();
        pin_architecture(&mut two);
        assert_eq!(
            arch(&two),
            vec![
                vec![r#"zone In Some(["a"])"#.to_owned(), ours.clone()],
                vec![ours]
            ]
        );
    }

    /// A kept log line naming a secret is hidden whole, whatever its form; the others
    /// stay, without control characters.
    #[test]
    fn a_log_line_naming_a_secret_is_hidden() {
        for line in [
            "password: hunter2",
            r#"{"level":"info","Token":"abc"}"#,
            "CREATE USER 'x'@'%' IDENTIFIED BY 'pw'",
            "AGE-SECRET-KEY-1QQQ",
            "Authorization: Bearer x",
        ] {
            assert_eq!(
                shown_line(line),
                "[a line naming a secret, hidden]",
                "{line}"
            );
        }
        assert_eq!(
            shown_line("[00] 2026-11-30 copying ./ibdata1\u{1b}[31m"),
            "[00] 2026-11-30 copying ./ibdata1[31m"
        );
    }

    /// The identities by reference: `identityFrom`'s Secret and key, or `identitySecret`'s
    /// key `identity`; never a value.
    #[test]
    fn identities_go_by_reference_to_the_key_named() {
        let r = |os: serde_json::Value| {
            let os: ObjectStoreSpec = serde_json::from_value(os).unwrap();
            let e = identity_env(&os)?;
            assert!(e.value.is_none());
            let s = e.value_from?.secret_key_ref?;
            Some((e.name, s.name, s.key))
        };
        assert_eq!(
            r(serde_json::json!({"bucket": "b", "encryption": {"identitySecret": "keys"}})),
            Some(("TIDEMARK_IDENTITY".into(), "keys".into(), "identity".into()))
        );
        assert_eq!(
            r(serde_json::json!({"bucket": "b",
                "encryption": {"identityFrom": {"name": "age", "key": "key.txt"}}})),
            Some(("TIDEMARK_IDENTITY".into(), "age".into(), "key.txt".into()))
        );
        assert_eq!(
            r(serde_json::json!({"bucket": "b", "encryption": {}})),
            None
        );
    }

    /// A pod's `tidemark` gets each credential as the environment variable its store
    /// builder reads, by reference to the Secret (never the value), and an Azure
    /// endpoint as Azure's.
    #[test]
    fn pods_get_each_store_kinds_credentials_by_reference() {
        let os: ObjectStoreSpec = serde_json::from_value(serde_json::json!({
            "url": "az://c", "endpoint": "http://10.0.0.1:10000/acct", "credentialsSecret": "az",
        }))
        .unwrap();
        let keys = SecretKeys {
            name: "az".into(),
            env: vec![
                ("AZURE_STORAGE_ACCOUNT_NAME".into(), "accountName".into()),
                ("AZURE_STORAGE_SAS_TOKEN".into(), "sasToken".into()),
            ],
        };
        let env = store_env(&os, Some(&keys));
        let by_name = |n: &str| env.iter().find(|e| e.name == n).cloned();
        assert_eq!(
            by_name("AZURE_STORAGE_ENDPOINT").and_then(|e| e.value),
            Some("http://10.0.0.1:10000/acct".into())
        );
        assert!(by_name("AWS_ENDPOINT_URL").is_none());
        let sas = by_name("AZURE_STORAGE_SAS_TOKEN").unwrap();
        assert!(sas.value.is_none());
        let r = sas.value_from.unwrap().secret_key_ref.unwrap();
        assert_eq!((r.name.as_str(), r.key.as_str()), ("az", "sasToken"));
    }
}
