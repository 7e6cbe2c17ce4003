//! Opening a policy's store: credentials from a Secret of the policy's namespace (checked
//! names, no value ever in a message), the shared-URL rules of a multi-tenant operator, and
//! the store directory's owner record.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tidemark_api::crd::BackupPolicy;
use tidemark_api::policy::CredentialsKeys;
use tidemark_store::{CloudCredentials, ClusterStore, S3Credentials, StoreOptions};

use crate::context::Context;
use crate::error::Error;

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

/// The label a Secret of the namespace carries, `"true"`, to be used by its BackupPolicies
/// (issue 42 §5): the store's keys (`credentialsSecret`), the database login
/// (`usernameFrom`/`passwordFrom`, `source.credentialsSecret`) and the age identities
/// (`identityFrom`, `identitySecret`). The right to create a BackupPolicy is otherwise the
/// right to have the operator read any key of any Secret of the namespace and send it to a
/// host the policy names.
pub const POLICY_SECRET_LABEL: &str = "tidemark.io/policy-secret";

/// The Secrets `policy` names, each with the field that names it.
pub fn referenced_secrets(policy: &BackupPolicy) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(os) = &policy.spec.object_store {
        if let Some(s) = &os.credentials_secret {
            out.push(("spec.objectStore.credentialsSecret", s.clone()));
        }
        if let Some(r) = os.encryption.as_ref().and_then(|e| e.identity()) {
            out.push(("spec.objectStore.encryption.identityFrom", r.name));
        }
    }
    if let Some(login) = policy.spec.source.as_ref().and_then(|s| s.login()) {
        out.push((login.user_field, login.user.name));
        out.push((login.password_field, login.password.name));
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out.dedup_by(|a, b| a.1 == b.1);
    out
}

/// Refuses (`InvalidSpec`) a policy that names a Secret of its namespace not labelled
/// [`POLICY_SECRET_LABEL`]` = "true"`, unless the administrator allows any
/// (`--allow-unlabelled-secrets`). A Secret that does not exist yet is missing
/// ([`Error::Missing`]: looked at again later): a pod referencing it would get it, labelled
/// or not, once someone creates it.
///
/// # Errors
/// The first such Secret, with its field and the label to add; a missing one; the API
/// failed.
pub async fn check_policy_secrets(ctx: &Context, policy: &BackupPolicy) -> Result<(), Error> {
    check_secrets(ctx, policy, referenced_secrets(policy)).await
}

/// [`check_policy_secrets`] for the Secrets in `named` (field, name).
async fn check_secrets(
    ctx: &Context,
    policy: &BackupPolicy,
    named: Vec<(&'static str, String)>,
) -> Result<(), Error> {
    if ctx.tenancy.allow_unlabelled_secrets {
        return Ok(());
    }
    let ns = policy.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    for (field, name) in named {
        tidemark_api::names::dns_subdomain(field, &name)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let Some(meta) = secrets.get_metadata_opt(&name).await? else {
            return Err(Error::Missing(format!(
                "Secret {ns}/{name} ({field}) does not exist"
            )));
        };
        if !secret_opted_in(meta.labels()) {
            return Err(Error::Invalid(secret_not_opted_in(&ns, &name, field)));
        }
    }
    Ok(())
}

/// Whether a Secret's labels say BackupPolicies may use it.
pub fn secret_opted_in(labels: &std::collections::BTreeMap<String, String>) -> bool {
    labels.get(POLICY_SECRET_LABEL).map(String::as_str) == Some("true")
}

/// Why a Secret a policy names is not used.
pub fn secret_not_opted_in(ns: &str, name: &str, field: &str) -> String {
    format!(
        "Secret {ns}/{name} ({field}) is not labelled {POLICY_SECRET_LABEL}=true: a BackupPolicy uses only the Secrets of its namespace that opted in (kubectl label secret {name} {POLICY_SECRET_LABEL}=true; the cluster's administrator may allow any: tidemark operator --allow-unlabelled-secrets)"
    )
}

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
/// A credential `overrides` (`spec.objectStore.credentialsKeys`) names is read from that
/// key only. No value is ever repeated in an error.
///
/// # Errors
/// The Secret is missing or lacks the keys.
pub async fn store_secret(
    client: &Client,
    ns: &str,
    name: &str,
    url: &str,
    overrides: Option<&CredentialsKeys>,
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
        let keys = match overrides.and_then(|o| o.key_for(ours)) {
            Some(named) => vec![named],
            None => vec![ours, var],
        };
        keys.into_iter().find_map(|k| {
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
        let named = overrides.map_or(String::new(), |o| {
            let keys: Vec<String> = o.named().map(|(d, k)| format!("{k:?} for {d}")).collect();
            if keys.is_empty() {
                String::new()
            } else {
                format!(" (spec.objectStore.credentialsKeys: {})", keys.join(", "))
            }
        });
        Err(Error::Invalid(format!(
            "Secret {ns}/{name} (spec.objectStore.credentialsSecret) lacks {what}{named}"
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
            // The account becomes the request's host (`<account>.blob.core.windows.net`):
            // anything but Azure's form could steer it elsewhere (`evil.example/x#`).
            if account.as_deref().is_some_and(|a| {
                !(3..=24).contains(&a.len())
                    || !a
                        .bytes()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            }) {
                return Err(Error::Invalid(format!(
                    "Secret {ns}/{name}: accountName is not an Azure storage account name (3 to 24 lowercase letters and digits; not repeated here)"
                )));
            }
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

/// The keys of `policy`'s store Secret, when it names one — for a pod that gets them (and
/// the policy's other Secrets) by reference: every Secret the policy names must have opted
/// in ([`check_policy_secrets`]).
///
/// # Errors
/// As [`store_secret`] and [`check_policy_secrets`].
pub async fn policy_secret_keys(
    ctx: &Context,
    policy: &BackupPolicy,
) -> Result<Option<SecretKeys>, Error> {
    check_policy_secrets(ctx, policy).await?;
    let client = &ctx.client;
    let ns = policy.namespace().unwrap_or_default();
    let Some(os) = policy.spec.object_store.as_ref() else {
        return Ok(None);
    };
    match os.credentials_secret.as_deref() {
        Some(name) => {
            let url = os.store_url().unwrap_or_default();
            Ok(Some(
                store_secret(client, &ns, name, &url, os.credentials_keys.as_ref())
                    .await?
                    .0,
            ))
        }
        None => Ok(None),
    }
}

/// Opens the policy's store with the credentials from its Secret.
///
/// # Errors
/// The Secret is missing or lacks the keys; the URL is invalid.
pub async fn open(ctx: &Context, policy: &BackupPolicy) -> Result<ClusterStore, Error> {
    // A lock this operator does not allow stops every use of the store (passes, Jobs).
    ctx.tenancy.object_lock(policy)?;
    // The store's own Secret, which the operator reads here (the others go to pods, and
    // are checked where pods are built: `policy_secret_keys`).
    let store_secret = referenced_secrets(policy)
        .into_iter()
        .filter(|(field, _)| *field == "spec.objectStore.credentialsSecret")
        .collect();
    check_secrets(ctx, policy, store_secret).await?;
    if let Some(endpoint) = policy
        .spec
        .object_store
        .as_ref()
        .and_then(|os| os.endpoint.as_deref())
    {
        ctx.tenancy.check_endpoint(endpoint).await?;
    }
    let store = open_store(
        &ctx.client,
        policy,
        ctx.store_retry_timeout,
        ctx.allow_ambient_credentials,
        &ctx.tenancy.denied_endpoints,
    )
    .await?
    // Opened for one pass or one Job's check: what it may read (issue 28).
    .with_budget(ctx.pass_budget);
    // The directory is this policy's alone (the first to claim it), never a second
    // team's with the same policy name in a shared bucket. Claimed once per process.
    let claim = format!("{} {}", store.identity(), policy.uid().unwrap_or_default());
    let owned = |c: &Context| {
        c.owned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&claim)
    };
    if owned(ctx) {
        return Ok(store);
    }
    let me = tidemark_store::state::Owner {
        format_version: tidemark_store::state::STATE_FORMAT_VERSION,
        kind: "BackupPolicy".into(),
        namespace: policy.namespace(),
        name: policy.name_any(),
        uid: policy.uid(),
        host: None,
        since: ctx.clock.now(),
        extra: Default::default(),
    };
    match tidemark_store::state::claim_owner(&store, &me).await {
        Ok(()) => {
            ctx.owned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(claim);
            Ok(store)
        }
        Err(e @ tidemark_store::state::OwnerError::Taken { .. }) => {
            Err(Error::Invalid(e.to_string()))
        }
        Err(tidemark_store::state::OwnerError::Store(e)) => Err(Error::Engine(e.into())),
    }
}

/// Opens `policy`'s store as the operator does — the URL, endpoint, region and path style
/// of `spec.objectStore`, the credentials from its Secret — for the operator and for
/// `kubectl tidemark ls|plan <policy>`.
///
/// `ambient`: whether a store may be reached with this process's own identity (the
/// operator's `--allow-ambient-credentials`; a person's own `kubectl tidemark` does).
///
/// # Errors
/// The Secret is missing or lacks the keys; the URL is invalid or not one the operator
/// may use ([`tidemark_api::ObjectStoreSpec::shared_url`]).
pub async fn open_store(
    client: &kube::Client,
    policy: &BackupPolicy,
    retry_timeout: Duration,
    ambient: bool,
    denied: &[crate::tenancy::Cidr],
) -> Result<ClusterStore, Error> {
    let ns = policy.namespace().unwrap_or_default();
    let Some(os) = policy.spec.object_store.as_ref() else {
        return Err(Error::Invalid(
            "spec.objectStore is missing (where the backups are)".into(),
        ));
    };
    let url = os
        .shared_url(ambient)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let (credentials, cloud_credentials) = match &os.credentials_secret {
        None => (None, None),
        Some(secret) => match crate::stores::store_secret(
            client,
            &ns,
            secret,
            &url,
            os.credentials_keys.as_ref(),
        )
        .await?
        .1
        {
            crate::stores::StoreCredentials::S3(c) => (Some(c), None),
            crate::stores::StoreCredentials::Cloud(c) => (None, Some(c)),
        },
    };
    let options = StoreOptions {
        endpoint: os.endpoint.clone(),
        region: os.region.clone(),
        path_style: os.path_style,
        credentials,
        retry_timeout: Some(retry_timeout),
        // The store's own: an object read's body is bounded by its rate, every other
        // request by its deadline (`tidemark_store::bounded`).
        request_timeout: None,
        ca_bundle: os.ca_bundle.clone(),
        cloud_credentials,
        denied_endpoints: denied.to_vec(),
    };
    let compression = os
        .compression()
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let recipients = tidemark_store::crypt::Recipients::parse(
        os.encryption
            .as_ref()
            .map(|e| e.recipients.as_slice())
            .unwrap_or_default(),
    )
    .map_err(|e| Error::Invalid(format!("spec.objectStore.encryption.recipients: {e}")))?;
    let lock = policy
        .spec
        .object_lock()
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let lock_expiry = policy
        .spec
        .lock_expiry()
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let plaintext_before = os
        .encryption
        .as_ref()
        .map(tidemark_api::policy::EncryptionSpec::plaintext_before)
        .transpose()
        .map_err(|e| Error::Invalid(e.to_string()))?
        .flatten();
    ClusterStore::open(&url, policy.spec.cluster_or(&policy.name_any()), &options)
        .and_then(|s| {
            s.with_compression(compression)
                .with_recipients(recipients.map(std::sync::Arc::new))
                .with_plaintext_before(plaintext_before)
                .with_object_lock(lock.map(|l| l.mode))
                .map(|s| {
                    s.with_lock_period(lock.map(|l| l.period))
                        .with_lock_expiry(lock_expiry)
                })
        })
        .map_err(|e| Error::Engine(e.into()))
}
