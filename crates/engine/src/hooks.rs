//! DeleteHooks on one machine (`tidemark run`, seed 003): before a retention pass deletes
//! backups, every DeleteHook of the configuration whose selector matches a backup's
//! `metadata.json` labels runs its local command, one after the other in alphanumerical
//! order of name. A hook cannot veto; each outcome (`succeeded`, `failed` with its exit
//! status and the end of its stderr, `timedOut`) is logged and goes into the audit record.
//!
//! The command gets `TIDEMARK_DELETE_REASON=retention` and `TIDEMARK_BACKUP` (the backup's
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

use crate::pass::DeleteHooks;

/// One hook: its name, whom it applies to, its command and how long it may take.
#[derive(Debug, Clone)]
pub struct LocalHook {
    pub name: String,
    pub selector: LabelSelector,
    pub command: Vec<String>,
    pub timeout: Duration,
}

/// The hooks of a configuration, run as local processes.
#[derive(Debug, Clone, Default)]
pub struct LocalHooks {
    hooks: Vec<LocalHook>,
}

impl LocalHooks {
    /// The hooks, to be run in alphanumerical order of name.
    pub fn new(mut hooks: Vec<LocalHook>) -> Self {
        hooks.sort_by(|a, b| a.name.cmp(&b.name));
        LocalHooks { hooks }
    }
}

/// The end of a text (its last `n` characters).
fn tail(text: &str, n: usize) -> String {
    let chars: Vec<char> = text.trim().chars().collect();
    chars[chars.len().saturating_sub(n)..].iter().collect()
}

async fn run_one(hook: &LocalHook, description: &serde_json::Value) -> (&'static str, String) {
    let mut cmd = tokio::process::Command::new(&hook.command[0]);
    cmd.args(&hook.command[1..])
        .env("TIDEMARK_DELETE_REASON", "retention")
        .env("TIDEMARK_BACKUP", description.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_remove(tidemark_store::crypt::IDENTITY_ENV)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return ("failed", format!("cannot run {:?}: {e}", hook.command[0])),
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
                "reason": "retention",
                "backup": {
                    "cluster": store.cluster,
                    "store": store.url,
                    "name": b.name,
                    "backupId": b.id,
                    "labels": labels,
                },
            });
            let mut ran = Vec::new();
            for hook in self
                .hooks
                .iter()
                .filter(|h| tidemark_api::lifecycle::selects(&h.selector, &labels))
            {
                let (outcome, message) = run_one(hook, &description).await;
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
}
