//! The parts every pod the operator creates is made of (backup and consolidation Jobs, the
//! binlog archiver): `tidemark` copied in by an init container, the store's location and
//! credentials in the environment as Secret references, the database login written to an
//! option file, and the labels that mark them as Tidemark's.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, Pod, PodSecurityContext,
    SeccompProfile, Secret, SecretKeySelector, SecurityContext, Volume, VolumeMount,
};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tidemark_api::ObjectStoreSpec;
use tidemark_api::crd::BackupPolicy;
use tidemark_store::{CloudCredentials, S3Credentials};

use crate::error::Error;

/// Where the init container puts the `tidemark` binary (and the database option file).
pub const TOOLS_DIR: &str = "/tidemark-bin";
/// The volume that carries it.
const TOOLS_VOLUME: &str = "tidemark-bin";
/// The label on everything the operator creates (its watches select by it).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "tidemark");

/// Which keys of the store Secret hold the credentials: each as the environment variable
/// `tidemark` reads in a pod (`AWS_*`, `GOOGLE_SERVICE_ACCOUNT_KEY`, `AZURE_STORAGE_*`).
#[derive(Debug, Clone)]
pub struct SecretKeys {
    pub name: String,
    /// `(environment variable, key of the Secret)`.
    pub env: Vec<(String, String)>,
}

/// What a store Secret holds, for this process's own requests.
#[derive(Debug, Clone)]
pub enum StoreCredentials {
    S3(S3Credentials),
    Cloud(CloudCredentials),
}

/// The keys a store Secret may hold for each kind of store, each under its own name or
/// the environment variable's; the first of a list that is present and not empty counts.
const S3_KEYS: [(&str, &str); 3] = [
    ("accessKeyId", "AWS_ACCESS_KEY_ID"),
    ("secretAccessKey", "AWS_SECRET_ACCESS_KEY"),
    ("sessionToken", "AWS_SESSION_TOKEN"),
];
const GCS_KEY: (&str, &str) = ("serviceAccountKey", "GOOGLE_SERVICE_ACCOUNT_KEY");
const AZURE_KEYS: [(&str, &str); 3] = [
    ("accountName", "AZURE_STORAGE_ACCOUNT_NAME"),
    ("accountKey", "AZURE_STORAGE_ACCOUNT_KEY"),
    ("sasToken", "AZURE_STORAGE_SAS_TOKEN"),
];

/// Reads the store Secret `ns/name` for a store at `url`: which keys hold the credentials
/// and their values. S3: `accessKeyId` and `secretAccessKey`, optionally `sessionToken`;
/// `gs://`: `serviceAccountKey` (the JSON key file); `az://`: `accountName` with
/// `accountKey` or `sasToken`; each also under its environment variable's name
/// (`AWS_ACCESS_KEY_ID`, `GOOGLE_SERVICE_ACCOUNT_KEY`, `AZURE_STORAGE_ACCOUNT_KEY`, …).
/// No value is ever repeated in an error.
///
/// # Errors
/// The Secret is missing or lacks the keys.
pub async fn store_secret(
    client: &Client,
    ns: &str,
    name: &str,
    url: &str,
) -> Result<(SecretKeys, StoreCredentials), Error> {
    // Checked before it reaches a request path (`../../other-team/secrets/…`).
    tidemark_api::names::dns_subdomain("spec.objectStore.credentialsSecret", name)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let Some(secret) = secrets.get_opt(name).await? else {
        return Err(Error::Missing(format!(
            "Secret {ns}/{name} (spec.objectStore.credentialsSecret) does not exist"
        )));
    };
    let data = secret.data.unwrap_or_default();
    let mut env = Vec::new();
    // The value of the first of `keys` present, recorded as environment variable `var`.
    let mut pick = |(ours, var): (&str, &str)| {
        [ours, var].into_iter().find_map(|k| {
            let value = data
                .get(k)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())?;
            env.push((var.to_owned(), k.to_owned()));
            Some(value)
        })
    };
    let lacks = |what: &str| {
        Err(Error::Invalid(format!(
            "Secret {ns}/{name} (spec.objectStore.credentialsSecret) lacks {what}"
        )))
    };
    let scheme = url.split_once("://").map_or("s3", |(s, _)| s);
    let credentials = match scheme {
        "gs" => {
            let Some(key) = pick(GCS_KEY) else {
                return lacks(
                    "serviceAccountKey (or GOOGLE_SERVICE_ACCOUNT_KEY): a GCS service-account key file",
                );
            };
            if !serde_json::from_str::<serde_json::Value>(&key).is_ok_and(|v| v.is_object()) {
                return Err(Error::Invalid(format!(
                    "Secret {ns}/{name}: serviceAccountKey is not a service-account key file (a JSON object)"
                )));
            }
            StoreCredentials::Cloud(CloudCredentials::GcsServiceAccountKey(key))
        }
        "az" | "azure" => {
            let account = pick(AZURE_KEYS[0]);
            let access_key = pick(AZURE_KEYS[1]);
            let sas_token = pick(AZURE_KEYS[2]);
            match account {
                Some(account) if access_key.is_some() || sas_token.is_some() => {
                    StoreCredentials::Cloud(CloudCredentials::Azure {
                        account,
                        access_key,
                        sas_token,
                    })
                }
                _ => {
                    return lacks(
                        "accountName, and accountKey or sasToken (or AZURE_STORAGE_ACCOUNT_NAME, and AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN)",
                    );
                }
            }
        }
        _ => match (pick(S3_KEYS[0]), pick(S3_KEYS[1])) {
            (Some(access_key_id), Some(secret_access_key)) => StoreCredentials::S3(S3Credentials {
                access_key_id,
                secret_access_key,
                session_token: pick(S3_KEYS[2]),
            }),
            _ => {
                return lacks(
                    "accessKeyId and secretAccessKey (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
                );
            }
        },
    };
    Ok((
        SecretKeys {
            name: name.to_owned(),
            env,
        },
        credentials,
    ))
}

/// The keys of `policy`'s store Secret, when it names one.
///
/// # Errors
/// As [`store_secret`].
pub async fn policy_secret_keys(
    client: &Client,
    policy: &BackupPolicy,
) -> Result<Option<SecretKeys>, Error> {
    let ns = policy.namespace().unwrap_or_default();
    let Some(os) = policy.spec.object_store.as_ref() else {
        return Ok(None);
    };
    match os.credentials_secret.as_deref() {
        Some(name) => {
            let url = os.store_url().unwrap_or_default();
            Ok(Some(store_secret(client, &ns, name, &url).await?.0))
        }
        None => Ok(None),
    }
}

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
    if let Some(s) = keys {
        for (var, key) in &s.env {
            env.push(from_secret(var, &s.name, key));
        }
    }
    env
}

/// The database login of Secret `secret` (`username`, `password`) as `$DB_USER` and
/// `$DB_PASSWORD`, for [`login_script`].
pub fn login_env(secret: &str) -> [EnvVar; 2] {
    [
        from_secret("DB_USER", secret, "username"),
        from_secret("DB_PASSWORD", secret, "password"),
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
    let ns = job.metadata.namespace.as_deref()?;
    let uid = job.metadata.uid.as_deref()?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("controller-uid={uid}")))
        .await
        .ok()?;
    let mut pods = list.items;
    // The newest pod's word first.
    pods.sort_by(|a, b| {
        b.metadata
            .creation_timestamp
            .cmp(&a.metadata.creation_timestamp)
    });
    pods.iter().find_map(|p| {
        let st = p.status.as_ref()?;
        let all = st
            .init_container_statuses
            .iter()
            .chain(st.container_statuses.iter())
            .flatten();
        all.into_iter().find_map(|c| {
            let t = c.state.as_ref()?.terminated.as_ref()?;
            if t.exit_code == 0 {
                return None;
            }
            // Hidden before it is cut: a cut through `--password=…` would no longer look
            // like a secret.
            let said = t.message.as_deref().unwrap_or_default().trim();
            let said = tidemark_engine::redact::redact(&[said.to_owned()]).remove(0);
            let said = tail(&said, FAILURE_LIMIT).to_owned();
            Some(if said.is_empty() {
                format!("container {} exited {}", c.name, t.exit_code)
            } else {
                format!("container {} exited {}: {said}", c.name, t.exit_code)
            })
        })
    })
}

/// The last `limit` bytes of `s`, cut at a character boundary.
pub fn tail(s: &str, limit: usize) -> &str {
    let mut from = s.len().saturating_sub(limit);
    while !s.is_char_boundary(from) {
        from += 1;
    }
    &s[from..]
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

pub fn empty_volume(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
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
