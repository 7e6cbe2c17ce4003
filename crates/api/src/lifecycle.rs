//! `DeleteHook` (seed 003) and `VolumeClaimRetention` (seed 004): what runs when Tidemark
//! deletes a backup, and which unused PersistentVolumeClaims are garbage-collected.

// kube's `printcolumn(name = …, type_ = …)` repeats keys by design.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A claim TTL: a duration of at least one day.
const VCR_TTL_RULE: &str = "self.matches('^[0-9]*[1-9][0-9]*(d|w|mo?)$')";
const VCR_TTL_MESSAGE: &str = "expected <n>d, <n>w or <n>mo with n at least 1 (e.g. 30d)";

/// Runs an action whenever Tidemark deletes a Backup it selects (seed 003). Hooks run in
/// alphanumerical order of name before the remote data goes, and cannot veto the deletion.
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "tidemark.io",
    version = "v1alpha1",
    kind = "DeleteHook",
    root = "DeleteHookCrd",
    namespaced,
    shortname = "tdh",
    category = "tidemark",
    status = "DeleteHookStatus",
    doc = "An action run whenever Tidemark deletes a Backup that the selector matches; it runs before the remote data goes and cannot veto the deletion.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(name = "Last run", type_ = "date", json_path = ".status.lastRun.time"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("(has(self.job) ? 1 : 0) + (has(self.webhook) ? 1 : 0) + (has(self.command) ? 1 : 0) == 1").message("set exactly one of job, webhook and command"))]
#[serde(rename_all = "camelCase")]
pub struct DeleteHookSpec {
    /// The Backups this hook applies to ("applies to"); empty selects every Backup.
    #[serde(default)]
    pub selector: LabelSelector,
    /// Run a Job from this pod template (operator); at most 64 KiB as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "opaque_object")]
    pub job: Option<serde_json::Value>,
    /// Call an HTTPS webhook with the backup's description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookAction>,
    /// Run a local command (standalone `tidemark run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// How long the action may take: `30s`, `5m`… (default `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::interval::HOOK_TIMEOUT_RULE).message(crate::interval::HOOK_TIMEOUT_MESSAGE))]
    #[schemars(length(max = 24))]
    pub timeout: Option<String>,
}

/// What the operator made of a DeleteHook: whether it can run here (`Ready`), and its last
/// run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeleteHookStatus {
    /// The `metadata.generation` this status was written for (kstatus, Argo and Flux
    /// health checks compare the two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The hook's last run: for which backup, and how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<HookRun>,
    /// `Ready`: `True` (`Valid`, or `LastRunSucceeded` for a run of this spec) when the
    /// operator can run the action; `False` with `InvalidSpec`, `StandaloneOnly` (a
    /// `command`, which only `tidemark run` runs), `JobsDisabled` (the install has no Job
    /// rights) or `LastRunFailed` (until a run succeeds or the spec changes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One run of a DeleteHook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookRun {
    /// The backup it ran for: its Backup object's name, or `<name>/<backup id>` in the
    /// store once the object is gone.
    pub backup: String,
    /// `succeeded`, `failed` or `timedOut`.
    pub outcome: String,
    /// Why it failed (or what answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The `metadata.generation` of the hook that ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// When it ended.
    pub time: Time,
}

/// An HTTPS endpoint that receives a POST with the deleted backup's description.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAction {
    /// `https://…`
    #[x_kube(validation = Rule::new("self.startsWith('https://')").message("expected an https:// URL"))]
    #[schemars(length(max = 2048))]
    pub url: String,
    /// PEM bundle of the CA that signs the endpoint's certificate (default: system roots);
    /// at most 64 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub ca_bundle: Option<String>,
}

/// Whether `selector` selects `labels`, as Kubernetes reads a label selector (matchLabels
/// and matchExpressions; an empty selector selects everything).
pub fn selects(
    selector: &LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let by_label = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expression = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_label && by_expression
}

/// A `DeleteHook` document outside the cluster (`tidemark run`'s configuration, the
/// `--hooks` files of `tidemark gc` and `tidemark delete`): its action — a local `command`,
/// a `webhook`, or a `job` that runs only in the cluster — applies to a backup whose
/// `metadata.json` labels the selector matches, right before its data goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeleteHook {
    pub api_version: String,
    pub kind: String,
    pub metadata: crate::policy::ObjectMeta,
    pub spec: DeleteHookSpec,
}

/// Why a DeleteHook document was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookFileError {
    #[error("not a DeleteHook document: {0}")]
    Syntax(String),
    #[error("{field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },
}

impl DeleteHook {
    /// Parses and checks one document for use outside the cluster (`tidemark run`'s
    /// configuration, `--hooks` files). A `job` action is read but runs only in the
    /// cluster: the caller decides what that means.
    ///
    /// # Errors
    /// Another kind or version; not exactly one action; an empty command; a webhook that
    /// is not https://; a bad timeout.
    pub fn from_value(value: serde_json::Value) -> Result<Self, HookFileError> {
        crate::fields::known_fields(
            &<DeleteHookCrd as kube::CustomResourceExt>::crd(),
            &value,
            None,
        )
        .map_err(HookFileError::Syntax)?;
        let hook = serde_json::from_value::<DeleteHook>(value)
            .map_err(|e| HookFileError::Syntax(e.to_string()))?;
        let invalid = |field, problem: String| Err(HookFileError::Invalid { field, problem });
        if hook.kind != "DeleteHook" {
            return invalid("kind", format!("{:?}; expected DeleteHook", hook.kind));
        }
        if hook.api_version != crate::version::API_VERSION {
            return invalid(
                "apiVersion",
                format!(
                    "{:?}; expected {}",
                    hook.api_version,
                    crate::version::API_VERSION
                ),
            );
        }
        let actions = usize::from(hook.spec.job.is_some())
            + usize::from(hook.spec.webhook.is_some())
            + usize::from(hook.spec.command.is_some());
        if actions != 1 {
            return invalid(
                "spec",
                format!("{actions} actions; set exactly one of command, webhook and job"),
            );
        }
        if let Some(w) = &hook.spec.webhook
            && !w.url.starts_with("https://")
        {
            return invalid(
                "spec.webhook.url",
                "not https://; expected an https:// URL".into(),
            );
        }
        if let Some(c) = &hook.spec.command
            && (c.is_empty() || c[0].is_empty())
        {
            return invalid(
                "spec.command",
                "empty; expected the program and its arguments, e.g. [sh, -c, \"…\"]".into(),
            );
        }
        hook.timeout()?;
        Ok(hook)
    }

    /// How long the command may run (`spec.timeout`, default 5 minutes).
    ///
    /// # Errors
    /// Not a positive interval such as `30s`, `5m` or `1h`.
    pub fn timeout(&self) -> Result<std::time::Duration, HookFileError> {
        self.spec.timeout()
    }
}

impl DeleteHookSpec {
    /// How long the action may take (`spec.timeout`, default 5 minutes, at most an hour).
    ///
    /// # Errors
    /// Not an interval from 1 s to 1 h.
    pub fn timeout(&self) -> Result<std::time::Duration, HookFileError> {
        crate::interval::HOOK_TIMEOUT
            .parse(self.timeout.as_deref())
            .map(|d| d.unsigned_abs())
            .map_err(|e| HookFileError::Invalid {
                field: e.field,
                problem: e.to_string(),
            })
    }
}

/// Garbage-collects PersistentVolumeClaims no running pod has mounted for `ttl` (seed 004).
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "tidemark.io",
    version = "v1alpha1",
    kind = "VolumeClaimRetention",
    root = "VolumeClaimRetentionCrd",
    namespaced,
    status = "VolumeClaimRetentionStatus",
    shortname = "tvcr",
    category = "tidemark",
    doc = "Deletes the PersistentVolumeClaims it selects once no running pod has mounted them for ttl; never a claim a started pod uses. An expired claim is never mounted again: a StatefulSet's pending pod on one is deleted with it, and both are recreated.",
    printcolumn(name = "TTL", type_ = "string", json_path = ".spec.ttl"),
    printcolumn(name = "Dry run", type_ = "boolean", json_path = ".spec.dryRun"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeClaimRetentionSpec {
    /// The claims this applies to (same namespace).
    pub selector: LabelSelector,
    /// How long a claim must stay unmounted before it is deleted: `<n>d`, `<n>w`, `<n>mo`,
    /// at least `1d` (a claim is unmounted between a pod's restart and its successor's
    /// start).
    #[x_kube(validation = Rule::new(VCR_TTL_RULE).message(VCR_TTL_MESSAGE))]
    pub ttl: String,
    /// Report what would be deleted, delete nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Also delete claims bound to a PersistentVolume whose reclaim policy is `Retain`
    /// (by default these are reported, not deleted).
    #[serde(default)]
    pub delete_retained_volumes: bool,
}

impl VolumeClaimRetentionSpec {
    /// Its `ttl` when written with seed 000's ambiguous `<n>m` (months, where intervals read
    /// minutes: `ttl: 90m` is 2,700 days).
    pub fn ambiguous_durations(&self) -> Vec<tidemark_core::AmbiguousDuration> {
        tidemark_core::AmbiguousDuration::check("spec.ttl", Some(&self.ttl))
            .into_iter()
            .collect()
    }
}

/// What the reaper saw and did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeClaimRetentionStatus {
    /// The `metadata.generation` this status was written for (kstatus, Argo and Flux
    /// health checks compare the two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run_time: Option<Time>,
    /// Claims unmounted now, with when they were last seen mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmounted: Option<u64>,
    /// Claims the last look deleted (or, with dryRun, would have deleted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted: Vec<String>,
    /// Claims unmounted for longer than the TTL but bound to a PersistentVolume whose
    /// reclaim policy is `Retain`: reported, not deleted (unless `deleteRetainedVolumes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retained_volumes: Vec<String>,
    /// Expired claims a pending pod referenced (an expired claim is never mounted again):
    /// a StatefulSet's template claim deleted together with its pod, so that the
    /// StatefulSet recreates both on a fresh claim; any other claim renewed (deleted, then
    /// created anew, empty: `renewal`). Kept for an hour: a pod recreated while its old
    /// claim was still being deleted is recreated once more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaced: Vec<ReplacedClaim>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// An expired claim replaced with its pending pod, or renewed for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplacedClaim {
    /// The claim's name (the StatefulSet creates the fresh one under it).
    pub claim: String,
    /// The expired claim's uid.
    pub claim_uid: String,
    /// The pod that referenced it.
    pub pod: String,
    /// That pod's uid (a pod of the name with another uid is its replacement).
    pub pod_uid: String,
    /// The StatefulSet that recreates them; empty for a claim no StatefulSet recreates
    /// (then `renewal` says what Tidemark creates in its place).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stateful_set: Option<String>,
    /// A claim no StatefulSet would recreate (a bare pod's, a Deployment's, a claim named
    /// in a pod template): the fresh, empty claim Tidemark creates under the same name once
    /// the expired one is gone, for its pending pod to start on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal: Option<ClaimRenewal>,
    /// How often a recreated pod was deleted once more (it came back while the old claim
    /// was still being deleted); at most 5.
    #[serde(default)]
    pub recreations: u32,
    /// When both were deleted.
    pub at: Time,
}

/// The fresh claim made in place of an expired one that nothing else recreates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRenewal {
    /// The expired claim's labels (the reaper's selector keeps selecting it).
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Its spec's access modes, resources, storage class and volume mode (no volume, no
    /// data source: the fresh claim is provisioned empty).
    #[schemars(schema_with = "opaque_object")]
    pub spec: serde_json::Value,
    /// When the fresh claim was created (absent: the expired one is still going).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<Time>,
}

/// A free-form object (a pod template): kept whole by the API server.
pub(crate) fn opaque_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    fn hook(spec: serde_json::Value) -> Result<DeleteHook, HookFileError> {
        DeleteHook::from_value(json!({
            "apiVersion": crate::version::API_VERSION, "kind": "DeleteHook",
            "metadata": {"name": "h"}, "spec": spec,
        }))
    }

    /// Outside the cluster a hook file holds any one action (a job is read, and the caller
    /// refuses or skips it); a second action, an http:// webhook and an empty command are
    /// refused naming the field.
    #[test]
    fn hook_files_hold_one_action_each() {
        assert!(hook(json!({"command": ["true"]})).is_ok());
        assert!(hook(json!({"webhook": {"url": "https://example.org/h"}})).is_ok());
        assert!(hook(json!({"job": {"spec": {"containers": []}}})).is_ok());
        let e = hook(json!({"command": ["true"], "webhook": {"url": "https://e.org"}}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("exactly one"), "{e}");
        let e = hook(json!({"webhook": {"url": "http://e.org"}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("spec.webhook.url") && e.contains("https://"),
            "{e}"
        );
        let e = hook(json!({"command": []})).unwrap_err().to_string();
        assert!(e.contains("spec.command"), "{e}");
        let e = hook(json!({})).unwrap_err().to_string();
        assert!(e.contains("0 actions"), "{e}");
    }
}
