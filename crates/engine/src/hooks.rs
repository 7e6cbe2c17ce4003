//! DeleteHooks outside the cluster (seed 003): `tidemark run`'s configuration, and the
//! hook files of `tidemark gc` / `tidemark delete` (`--hooks`). Right before a backup's
//! data goes, every hook whose selector matches its `metadata.json` labels runs, one after
//! the other in alphanumerical order of name: a local command, or an HTTPS webhook (a POST
//! of the backup's description — the same call the operator makes). A hook cannot veto;
//! each outcome (`succeeded`, `failed` with its exit status or HTTP answer, `timedOut`) is
//! logged and goes into the audit record. A `job` action needs the cluster: it never runs
//! here, and a deletion it selects is refused unless the caller skips it (see
//! [`crate::DeleteHooks::cannot_run`]).
//!
//! A command gets `TIDEMARK_DELETE_REASON` and `TIDEMARK_BACKUP` (the backup's
//! description as JSON) in its environment; nothing about the backup is in its arguments.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::json;
use tidemark_core::Backup;
use tidemark_store::ClusterStore;
use tidemark_store::format::Metadata;
use tokio::io::AsyncReadExt;

use tidemark_api::lifecycle::{DeleteHook, WebhookAction};
use tidemark_store::deny::Cidr;
use tidemark_store::state::StoredHook;

use crate::pass::DeleteHooks;

/// The most of a webhook's answer that is read (the first 300 characters are recorded).
pub const WEBHOOK_BODY_LIMIT: usize = 4096;

/// What a hook does.
#[derive(Debug, Clone)]
pub enum HookAction {
    /// A local process: the program and its arguments.
    Command(Vec<String>),
    /// A POST of the description to an HTTPS endpoint.
    Webhook(WebhookAction),
    /// A Job from a pod template: runs only in the cluster, never here.
    Job,
}

impl HookAction {
    /// Its word, as the store's record of hooks spells it.
    pub fn word(&self) -> &'static str {
        match self {
            HookAction::Command(_) => "command",
            HookAction::Webhook(_) => "webhook",
            HookAction::Job => "job",
        }
    }
}

/// One hook: its name, whom it applies to, its action and how long it may take.
#[derive(Debug, Clone)]
pub struct LocalHook {
    pub name: String,
    pub selector: LabelSelector,
    pub action: HookAction,
    pub timeout: Duration,
}

impl LocalHook {
    /// A DeleteHook document as it runs here (its timeout checked).
    ///
    /// # Errors
    /// A bad timeout, or no action.
    pub fn from_document(hook: &DeleteHook) -> Result<Self, String> {
        let action = match (&hook.spec.command, &hook.spec.webhook, &hook.spec.job) {
            (Some(c), _, _) if !c.is_empty() && !c[0].is_empty() => HookAction::Command(c.clone()),
            (_, Some(w), _) => HookAction::Webhook(w.clone()),
            (_, _, Some(_)) => HookAction::Job,
            _ => return Err("spec: no action; expected one of command, webhook and job".into()),
        };
        Ok(LocalHook {
            name: hook.metadata.name.clone(),
            selector: hook.spec.selector.clone(),
            action,
            timeout: hook.timeout().map_err(|e| e.to_string())?,
        })
    }
}

/// The hooks of a configuration or a hook file, run on this machine.
#[derive(Debug, Clone)]
pub struct LocalHooks {
    hooks: Vec<LocalHook>,
    /// `TIDEMARK_DELETE_REASON` and the description's `reason`.
    reason: &'static str,
    /// Addresses no webhook may connect to.
    denied: Vec<Cidr>,
}

impl LocalHooks {
    /// The hooks, to be run in alphanumerical order of name, for a retention pass.
    pub fn new(mut hooks: Vec<LocalHook>) -> Self {
        hooks.sort_by(|a, b| a.name.cmp(&b.name));
        LocalHooks {
            hooks,
            reason: "retention",
            denied: Vec::new(),
        }
    }

    /// The same hooks, for deletions of another reason (`deletionRequested`).
    #[must_use]
    pub fn for_reason(mut self, reason: &'static str) -> Self {
        self.reason = reason;
        self
    }

    /// The same hooks, their webhooks kept off `denied`.
    #[must_use]
    pub fn denying(mut self, denied: Vec<Cidr>) -> Self {
        self.denied = denied;
        self
    }
}

/// The end of a text (its last `n` characters).
fn tail(text: &str, n: usize) -> String {
    let chars: Vec<char> = text.trim().chars().collect();
    chars[chars.len().saturating_sub(n)..].iter().collect()
}

async fn run_one(
    hook: &LocalHook,
    reason: &str,
    description: &serde_json::Value,
    denied: &[Cidr],
) -> (&'static str, String) {
    let command = match &hook.action {
        HookAction::Command(c) => c,
        HookAction::Webhook(w) => {
            let outcome = call_webhook(w, hook.timeout, description, denied).await;
            let message = outcome.message(hook.timeout).unwrap_or_default();
            return (outcome.word(), message);
        }
        HookAction::Job => {
            return (
                "skipped",
                "a job action runs only in the cluster: not run here".into(),
            );
        }
    };
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("TIDEMARK_DELETE_REASON", reason)
        .env("TIDEMARK_BACKUP", description.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_remove(tidemark_store::crypt::IDENTITY_ENV)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return ("failed", format!("cannot run {:?}: {e}", command[0])),
    };
    let mut stderr = child.stderr.take();
    let read = async {
        let mut text = String::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_string(&mut text).await;
        }
        text
    };
    match tokio::time::timeout(hook.timeout, async { tokio::join!(child.wait(), read) }).await {
        Err(_) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            ("timedOut", format!("no end within {:?}", hook.timeout))
        }
        Ok((Ok(status), _)) if status.success() => ("succeeded", "exited with status 0".into()),
        Ok((Ok(status), text)) => {
            let said = crate::redact::redact(&[tail(&text, 300)]).remove(0);
            let how = status.code().map_or_else(
                || format!("ended with {status}"),
                |c| format!("exited with status {c}"),
            );
            if said.is_empty() {
                ("failed", how)
            } else {
                ("failed", format!("{how}; its stderr ends with: {said}"))
            }
        }
        Ok((Err(e), _)) => ("failed", format!("waiting for it: {e}")),
    }
}

#[async_trait]
impl DeleteHooks for LocalHooks {
    async fn before_delete(
        &self,
        store: &ClusterStore,
        deleting: &[(&Backup, Option<&Metadata>)],
    ) -> Vec<serde_json::Value> {
        let mut report = Vec::new();
        for (b, meta) in deleting {
            let labels: BTreeMap<String, String> =
                meta.map(|m| m.labels.clone()).unwrap_or_default();
            let description = json!({
                "apiVersion": tidemark_api::API_VERSION,
                "kind": "BackupDeletion",
                "reason": self.reason,
                "object": null,
                "backup": {
                    "cluster": store.cluster,
                    "store": store.url,
                    "name": b.name,
                    "backupId": b.id,
                    "labels": labels,
                    "key": tidemark_store::layout::metadata_key(&b.name, &b.id).to_string(),
                },
            });
            let mut ran = Vec::new();
            for hook in self.hooks.iter().filter(|h| {
                !matches!(h.action, HookAction::Job)
                    && tidemark_api::lifecycle::selects(&h.selector, &labels)
            }) {
                let (outcome, message) =
                    run_one(hook, self.reason, &description, &self.denied).await;
                if outcome == "succeeded" {
                    tracing::info!(hook = %hook.name, backup = %format!("{}/{}", b.name, b.id), "delete hook {outcome}");
                } else {
                    tracing::warn!(hook = %hook.name, backup = %format!("{}/{}", b.name, b.id), "delete hook {outcome}: {message}");
                }
                ran.push(json!({"name": hook.name, "outcome": outcome, "message": message}));
            }
            if !ran.is_empty() {
                report.push(json!({"backupId": b.id, "backupName": b.name, "hooks": ran}));
            }
        }
        report
    }

    fn runs(&self, hook: &StoredHook) -> bool {
        self.hooks.iter().any(|h| {
            h.name == hook.name
                && h.action.word() == hook.action
                && !matches!(h.action, HookAction::Job)
        })
    }

    fn cannot_run(&self) -> Vec<StoredHook> {
        self.hooks
            .iter()
            .filter(|h| matches!(h.action, HookAction::Job))
            .map(|h| StoredHook {
                name: h.name.clone(),
                action: h.action.word().into(),
                selector: serde_json::to_value(&h.selector).unwrap_or_default(),
            })
            .collect()
    }
}

/// How one action ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookOutcome {
    Succeeded(Option<String>),
    Failed(String),
    TimedOut,
}

impl HookOutcome {
    /// Its word in records: `succeeded`, `failed`, `timedOut`.
    pub fn word(&self) -> &'static str {
        match self {
            HookOutcome::Succeeded(_) => "succeeded",
            HookOutcome::Failed(_) => "failed",
            HookOutcome::TimedOut => "timedOut",
        }
    }

    /// Its message (`timeout`: the hook's, named when it timed out).
    pub fn message(&self, timeout: Duration) -> Option<String> {
        match self {
            HookOutcome::Succeeded(m) => m.clone(),
            HookOutcome::Failed(m) => Some(m.clone()),
            HookOutcome::TimedOut => Some(format!("no answer within {timeout:?}")),
        }
    }
}

/// Resolves a webhook's host with the denied ranges left out (`tidemark_store::deny`):
/// every connection of the webhook client is checked, whatever the name answers then.
#[derive(Debug)]
struct DeniedResolver(Vec<Cidr>);

impl reqwest::dns::Resolve for DeniedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (denied, host) = (self.0.clone(), name.as_str().to_owned());
        Box::pin(async move {
            let ips = tidemark_store::deny::resolve(&denied, &host).await?;
            let addrs: reqwest::dns::Addrs =
                Box::new(ips.into_iter().map(|ip| std::net::SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// Why `webhook` would be refused before any connection (not https://, an address of
/// `denied` written as the host, a `caBundle` that is not PEM), without the URL.
pub fn webhook_problem(webhook: &WebhookAction, denied: &[Cidr]) -> Option<String> {
    if !webhook.url.starts_with("https://") {
        return Some("webhook url is not https://; refused".into());
    }
    if let Some(host) = reqwest::Url::parse(&webhook.url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        && let Err(e) = tidemark_store::deny::check_literal(denied, &host)
    {
        return Some(format!("webhook url: {e}"));
    }
    if let Some(pem) = &webhook.ca_bundle {
        match reqwest::Certificate::from_pem_bundle(pem.as_bytes()) {
            Err(e) => return Some(format!("caBundle is not PEM: {e}")),
            Ok(certs) if certs.is_empty() => {
                return Some("caBundle holds no PEM certificate".into());
            }
            Ok(_) => {}
        }
    }
    None
}

/// POSTs the description to the webhook; a 2xx answer is success. No address in `denied`
/// is connected to (the operator's `--deny-endpoints`): the host's every connection is
/// resolved without them, and an address written as the host is refused. Nothing of the
/// URL (which may carry a token) is in any message.
pub async fn call_webhook(
    webhook: &WebhookAction,
    timeout: Duration,
    body: &serde_json::Value,
    denied: &[Cidr],
) -> HookOutcome {
    if let Some(problem) = webhook_problem(webhook, denied) {
        return HookOutcome::Failed(problem);
    }
    let mut builder = reqwest::Client::builder()
        .https_only(true)
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none());
    if !denied.is_empty() {
        builder = builder.dns_resolver(std::sync::Arc::new(DeniedResolver(denied.to_vec())));
    }
    if let Some(pem) = &webhook.ca_bundle {
        match reqwest::Certificate::from_pem_bundle(pem.as_bytes()) {
            Ok(certs) => {
                for c in certs {
                    builder = builder.add_root_certificate(c);
                }
            }
            Err(e) => return HookOutcome::Failed(format!("caBundle is not PEM: {e}")),
        }
    }
    let client = match builder.build() {
        Ok(c) => c,
        Err(e) => return HookOutcome::Failed(format!("webhook client: {e}")),
    };
    let request = client
        .post(&webhook.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string());
    match request.send().await {
        Ok(r) if r.status().is_success() => {
            HookOutcome::Succeeded(Some(format!("HTTP {}", r.status())))
        }
        Ok(mut r) => {
            // At most WEBHOOK_BODY_LIMIT bytes of the answer are read, whatever it sends.
            let status = r.status();
            let mut body = Vec::new();
            while body.len() < WEBHOOK_BODY_LIMIT {
                match r.chunk().await {
                    Ok(Some(c)) => body.extend_from_slice(&c),
                    _ => break,
                }
            }
            body.truncate(WEBHOOK_BODY_LIMIT);
            let text: String = String::from_utf8_lossy(&body).chars().take(300).collect();
            HookOutcome::Failed(format!("HTTP {status}: {}", text.trim()))
        }
        Err(e) if e.is_timeout() => HookOutcome::TimedOut,
        // Without the URL: a token in it must not reach status, events or the store.
        Err(e) => HookOutcome::Failed(crate::error::chain(&e.without_url())),
    }
}
