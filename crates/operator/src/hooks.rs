//! DeleteHooks (seed 003's DeleteAction, as a resource): whenever the operator deletes a
//! Backup's data — the Backup deleted with `deletionPolicy: Delete`, or expired by its
//! `ttl` — every DeleteHook of the namespace whose selector matches the Backup's labels
//! runs first, one after the other in alphanumerical order of name. A hook cannot veto:
//! each outcome (`succeeded`, `failed` with its message, `timedOut`) is recorded in the
//! Backup's `status.hooks` and as an event, and the deletion goes on; the audit record in
//! the store lists them too.
//!
//! Actions: an HTTPS `webhook` (a POST of the backup's description, with the hook's
//! timeout; `caBundle` to trust a private CA), or a `job` from a pod template, followed
//! across reconciles until it ends or its timeout passes (`activeDeadlineSeconds`).

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, DeleteHook, HookResult, HookRun};

use crate::context::Context;
use crate::error::Error;

use tidemark_engine::hooks::call_webhook as call;
pub use tidemark_engine::hooks::{HookOutcome, WEBHOOK_BODY_LIMIT};
/// The label on a hook's Job: the Backup it ran for (uid).
const HOOK_LABEL: &str = "tidemark.io/delete-hook";

pub use tidemark_api::lifecycle::selects;

/// The hooks of the Backup's namespace that select it, in alphanumerical order of name.
///
/// # Errors
/// The API failed.
pub async fn matching(ctx: &Context, backup: &Backup) -> Result<Vec<DeleteHook>, Error> {
    let api: Api<DeleteHook> =
        Api::namespaced(ctx.client.clone(), &backup.namespace().unwrap_or_default());
    let mut hooks: Vec<DeleteHook> =
        crate::lean::list(&api, &ListParams::default(), crate::lean::meta_of)
            .await?
            .into_iter()
            .filter(|h| selects(&h.spec.selector, backup.labels()))
            .collect();
    hooks.sort_by_key(ResourceExt::name_any);
    Ok(hooks)
}

/// The DeleteHooks of namespace `ns` as the store records them for deleters without the
/// cluster (`_state/hooks.json`): name, action and selector — never a URL or a command.
///
/// # Errors
/// The API failed.
pub async fn recorded(
    ctx: &Context,
    ns: &str,
) -> Result<Vec<tidemark_store::state::StoredHook>, Error> {
    let api: Api<DeleteHook> = Api::namespaced(ctx.client.clone(), ns);
    Ok(
        crate::lean::list(&api, &ListParams::default(), crate::lean::meta_of)
            .await?
            .into_iter()
            .map(|h| tidemark_store::state::StoredHook {
                name: h.name_any(),
                action: if h.spec.job.is_some() {
                    "job"
                } else if h.spec.webhook.is_some() {
                    "webhook"
                } else {
                    "command"
                }
                .to_owned(),
                selector: serde_json::to_value(&h.spec.selector).unwrap_or_default(),
            })
            .collect(),
    )
}

/// The hook's timeout, bounded (CEL refuses a bad one at admission; API servers without
/// CEL let it through, and the hook then fails with the reason).
fn timeout_of(hook: &DeleteHook) -> Result<Duration, String> {
    hook.spec.timeout().map_err(|e| e.to_string())
}

/// The hook's timeout, once its spec is whole: exactly one action (CEL refuses another
/// count at admission; without CEL the hook fails with the reason, never runs one of two).
fn runnable(hook: &DeleteHook) -> Result<Duration, String> {
    let actions = usize::from(hook.spec.job.is_some())
        + usize::from(hook.spec.webhook.is_some())
        + usize::from(hook.spec.command.is_some());
    if actions != 1 {
        return Err(format!(
            "spec: {actions} actions; set exactly one of job, webhook and command"
        ));
    }
    timeout_of(hook)
}

/// What a hook is told about the backup being deleted.
fn description(backup: &Backup, reason: &str) -> serde_json::Value {
    let status = backup.status.clone().unwrap_or_default();
    // The Backup object itself (seed 003: the hook receives it), without the server's
    // bookkeeping of who wrote which field.
    let mut object = serde_json::to_value(backup).unwrap_or_default();
    if let Some(meta) = object
        .get_mut("metadata")
        .and_then(serde_json::Value::as_object_mut)
    {
        meta.remove("managedFields");
    }
    json!({
        "object": object,
        "apiVersion": tidemark_api::API_VERSION,
        "kind": "BackupDeletion",
        "reason": reason,
        "backup": {
            "namespace": backup.namespace(),
            "name": backup.name_any(),
            "uid": backup.uid(),
            "labels": backup.labels(),
            "policy": backup.spec.template.policy.name,
            "backupId": status.backup_id,
            "bucket": status.bucket,
            "key": status.key,
        },
    })
}

/// Runs the hooks that have no outcome yet, in order. `Ok(None)`: one is still running
/// (a Job), look again later; `Ok(Some(results))`: every hook has its outcome.
///
/// # Errors
/// The API failed (the outcomes so far are recorded first).
pub async fn run(
    ctx: &Context,
    api: &Api<Backup>,
    backup: &Backup,
    reason: &str,
) -> Result<Option<Vec<HookResult>>, Error> {
    // Its labels select the hooks: a cached object whose labels were cut is read whole.
    let read;
    let backup = if crate::lean::trimmed(backup).is_some() {
        read = api.get(&backup.name_any()).await?;
        &read
    } else {
        backup
    };
    let hooks = matching(ctx, backup).await?;
    // One runner at a time per Backup: a retention pass and the finalizer can both get to
    // its hooks at once, and each would see no outcome yet and call every hook. The second
    // waits here, then reads the first one's outcomes and skips those hooks.
    let _turn = ctx
        .hook_turn(backup.meta().uid.as_deref().unwrap_or_default())
        .lock_owned()
        .await;
    // The outcomes so far from the API, not the watch cache: a reconcile that follows
    // the one that ran a hook may start before the cache has its status.
    let mut status = api
        .get(&backup.name_any())
        .await?
        .status
        .unwrap_or_default();
    let mut changed = false;
    let mut pending = false;
    for hook in &hooks {
        let name = hook.name_any();
        if status
            .hooks
            .iter()
            .any(|r| r.name == name && r.outcome != "running")
        {
            continue;
        }
        let timeout = runnable(hook);
        let outcome = match (&timeout, &hook.spec.webhook, &hook.spec.job) {
            (Err(e), _, _) => Some(HookOutcome::Failed(e.clone())),
            (Ok(t), Some(webhook), _) => {
                Some(
                    call(
                        webhook,
                        *t,
                        &description(backup, reason),
                        &ctx.tenancy.denied_endpoints,
                    )
                    .await,
                )
            }
            (Ok(_), None, Some(_)) if !ctx.capabilities.jobs => {
                Some(HookOutcome::Failed(crate::rbac::refused("a job action", "jobs")))
            }
            (Ok(t), None, Some(template)) => {
                job(ctx, &JobFor::backup(backup, reason), hook, template, reason, *t).await?
            }
            (Ok(_), None, None) => Some(HookOutcome::Failed(
                "a local command runs only in standalone `tidemark run`; give the hook a job or a webhook".into(),
            )),
        };
        status.hooks.retain(|r| r.name != name);
        let Some(outcome) = outcome else {
            status.hooks.push(HookResult {
                name,
                outcome: "running".into(),
                ..HookResult::default()
            });
            changed = true;
            pending = true;
            break;
        };
        let (word, message, type_, event) = as_recorded(&outcome, timeout.ok());
        let note = format!("DeleteHook {name} {word}{}", suffix(message.as_deref()));
        ctx.event(&backup.object_ref(&()), type_, event, &note)
            .await;
        record_run(ctx, hook, backup.name_any(), word, message.as_deref()).await;
        status.hooks.push(HookResult {
            name,
            outcome: word.into(),
            message: message.map(|m| m.chars().take(1024).collect()),
            finished_at: Some(Time(ctx.clock.now())),
        });
        // Recorded at once: a restart does not run a finished hook again.
        record(api, backup, &status.hooks).await?;
        changed = false;
    }
    if changed {
        record(api, backup, &status.hooks).await?;
    }
    Ok((!pending).then_some(status.hooks))
}

/// Writes `status.hooks` under its own field manager: the attempt's writer and the
/// deletion's conditions cannot drop it, nor it theirs.
async fn record(api: &Api<Backup>, backup: &Backup, hooks: &[HookResult]) -> Result<(), Error> {
    crate::status::apply(
        api,
        &backup.name_any(),
        crate::status::HOOKS_MANAGER,
        json!({ "hooks": hooks }),
    )
    .await
}

/// The hooks of a retention pass (the operator's BackupPolicy controller): a backup the
/// pass deletes by its rules runs the DeleteHooks that select its Backup object (one with
/// its backup-id under its store name, in the policy's namespace), before its data goes;
/// once that object is gone, those the labels it recorded in the store select
/// ([`PassHooks::without_object`]); a backup no object ever made is selected by none. Job hooks are waited for (up to
/// their timeouts). The object stays (retention deletes data, not objects) and shows the
/// outcomes in `status.hooks`.
#[derive(Debug)]
pub struct PassHooks {
    pub ctx: std::sync::Arc<Context>,
    pub namespace: String,
    pub policy: String,
}

#[async_trait::async_trait]
impl tidemark_engine::DeleteHooks for PassHooks {
    async fn before_delete(
        &self,
        _store: &tidemark_store::ClusterStore,
        deleting: &[(
            &tidemark_core::Backup,
            Option<&tidemark_store::format::Metadata>,
        )],
    ) -> Vec<serde_json::Value> {
        // Hooks may take up to their timeouts: the pass gives its background turn back
        // meanwhile (the engine holds no survey while hooks run), so one tenant's slow
        // hooks never keep another's pass waiting.
        crate::background::without_turn(self.run_before_delete(deleting)).await
    }

    /// The holds in force now, from the API (the watch cache may lag behind a hold placed
    /// while the hooks ran); the cache's when the API does not answer.
    async fn restore_holds(&self) -> Option<Vec<tidemark_core::RestoreHold>> {
        match crate::holds::read_restore_holds(&self.ctx, &self.namespace, &self.policy).await {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(policy = %self.policy, "reading restores' holds after the hooks: {e}; using those read before");
                None
            }
        }
    }

    async fn holds(&self) -> Option<std::collections::HashSet<String>> {
        let api: Api<Backup> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        Some(
            match crate::lean::list(&api, &ListParams::default(), crate::lean::backup).await {
                Ok(list) => crate::holds::held_ids(list.iter(), &self.namespace, &self.policy),
                Err(e) => {
                    tracing::warn!(policy = %self.policy, "reading holds after the hooks: {e}; using the cache");
                    crate::holds::held_ids(
                        self.ctx.backups.state().iter().map(AsRef::as_ref),
                        &self.namespace,
                        &self.policy,
                    )
                }
            },
        )
    }
}

impl PassHooks {
    async fn run_before_delete(
        &self,
        deleting: &[(
            &tidemark_core::Backup,
            Option<&tidemark_store::format::Metadata>,
        )],
    ) -> Vec<serde_json::Value> {
        let ctx = self.ctx.as_ref();
        let api: Api<Backup> = Api::namespaced(ctx.client.clone(), &self.namespace);
        let objects = ctx.backups.state();
        let mut report = Vec::new();
        for (b, _) in deleting {
            // Its object: the Backup that made it, or — for a synthetic full — the one
            // whose restore point it holds (`dataRemoved.replacedBy`), whose hooks ran
            // when its own data was merged and are not run again (`status.hooks`).
            let Some(object) = objects.iter().find(|o| {
                let status = o.status.as_ref();
                let own = status.and_then(|s| s.backup_id.as_deref()) == Some(b.id.as_str())
                    && crate::names::store_name(o) == b.name;
                let stood_in = status
                    .and_then(|s| s.data_removed.as_ref())
                    .and_then(|r| r.replaced_by.as_ref())
                    .is_some_and(|r| r.backup_id == b.id && r.backup_name == b.name);
                o.namespace().as_deref() == Some(self.namespace.as_str())
                    && o.spec.template.policy.name == self.policy
                    && (own || stood_in)
            }) else {
                // Its object is gone (a Retain Backup deleted by hand or by a cascade):
                // the labels it recorded in the store select the hooks (seed 003).
                if let Some(r) = self.without_object(b, metadata(deleting, b)).await {
                    report.push(r);
                }
                continue;
            };
            // Job hooks are followed until they end (each bounded by its timeout).
            let results = loop {
                match run(ctx, &api, object, reason_of(object)).await {
                    Ok(Some(r)) => break Ok(r),
                    Ok(None) => tokio::time::sleep(Duration::from_secs(2)).await,
                    Err(e) => break Err(e),
                }
            };
            match results {
                Ok(r) if !r.is_empty() => report.push(json!({
                    "backupId": b.id, "backupName": b.name, "hooks": r,
                })),
                Ok(_) => {}
                Err(e) => {
                    // A hook cannot stop the deletion; what went wrong is recorded.
                    tracing::warn!(backup = %b.id, "delete hooks: {e}");
                    report.push(json!({
                        "backupId": b.id, "backupName": b.name,
                        "error": tidemark_engine::error::chain(&e),
                    }));
                }
            }
        }
        report
    }
}

/// Why a Backup object's data is deleted, as its hooks are told: `deletionRequested` or
/// `ttlExpired` for one being deleted (the finalizer's deletion, or a pass removing what
/// such a deletion marked), `retention` otherwise.
fn reason_of(object: &Backup) -> &'static str {
    if object.metadata.deletion_timestamp.is_none() {
        "retention"
    } else if object
        .annotations()
        .contains_key(crate::names::EXPIRED_ANNOTATION)
    {
        "ttlExpired"
    } else {
        "deletionRequested"
    }
}

/// The stored metadata of `b` among what is being deleted.
fn metadata<'a>(
    deleting: &[(
        &tidemark_core::Backup,
        Option<&'a tidemark_store::format::Metadata>,
    )],
    b: &tidemark_core::Backup,
) -> Option<&'a tidemark_store::format::Metadata> {
    deleting
        .iter()
        .find(|(d, _)| d.id == b.id && d.name == b.name)
        .and_then(|(_, m)| *m)
}

impl PassHooks {
    /// Runs the hooks of a backup whose Backup object is gone, selected by the labels the
    /// object recorded in `metadata.json` (only a backup an object made has them: one
    /// pushed from the command line is selected by none). Webhooks are called with the
    /// stored description (`object` is null); a job action runs as a Job owned by the
    /// policy, with that description in `TIDEMARK_BACKUP`, followed until it ends. The
    /// outcomes go to the audit record (there is no status to show them) and the policy's
    /// events.
    async fn without_object(
        &self,
        b: &tidemark_core::Backup,
        meta: Option<&tidemark_store::format::Metadata>,
    ) -> Option<serde_json::Value> {
        let meta = meta?;
        let object_name = meta.labels.get(crate::names::BACKUP_LABEL)?;
        let api: Api<DeleteHook> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let mut hooks: Vec<DeleteHook> =
            match crate::lean::list(&api, &ListParams::default(), crate::lean::meta_of).await {
                Ok(l) => l,
                Err(e) => {
                    return Some(json!({
                        "backupId": b.id, "backupName": b.name,
                        "error": format!("listing DeleteHooks: {e}"),
                    }));
                }
            };
        hooks.retain(|h| selects(&h.spec.selector, &meta.labels));
        if hooks.is_empty() {
            return None;
        }
        hooks.sort_by_key(ResourceExt::name_any);
        let body = json!({
            "object": null,
            "apiVersion": tidemark_api::API_VERSION,
            "kind": "BackupDeletion",
            "reason": "retention",
            "backup": {
                "namespace": self.namespace,
                "name": object_name,
                "uid": null,
                "labels": meta.labels,
                "policy": self.policy,
                "backupId": b.id,
                "bucket": null,
                "key": tidemark_store::layout::metadata_key(&b.name, &b.id).to_string(),
            },
        });
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(tidemark_api::API_VERSION.into()),
            kind: Some("BackupPolicy".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.policy.clone()),
            ..Default::default()
        };
        // A job action is owned by the policy (the Backup it would belong to is gone).
        let owner = match Api::<tidemark_api::crd::BackupPolicy>::namespaced(
            self.ctx.client.clone(),
            &self.namespace,
        )
        .get_opt(&self.policy)
        .await
        {
            Ok(p) => p.as_ref().and_then(crate::context::owner_ref),
            Err(e) => {
                tracing::warn!(policy = %self.policy, "reading the policy to own a hook's Job: {e}");
                None
            }
        };
        let who = JobFor {
            namespace: self.namespace.clone(),
            key: crate::names::digest16(&format!("{}/{}", b.name, b.id)),
            labels: serde_json::Map::new(),
            owner,
            description: body.clone(),
            what: format!(
                "backup {}/{} (its Backup {object_name} is gone)",
                b.name, b.id
            ),
            ttl_after_finished: Some(3600),
        };
        let mut results = Vec::new();
        for hook in &hooks {
            let name = hook.name_any();
            let outcome = match (runnable(hook), &hook.spec.webhook, &hook.spec.job) {
                (Err(e), _, _) => HookOutcome::Failed(e),
                (Ok(t), Some(webhook), _) => {
                    call(webhook, t, &body, &self.ctx.tenancy.denied_endpoints).await
                }
                (Ok(_), None, Some(_)) if !self.ctx.capabilities.jobs => {
                    HookOutcome::Failed(crate::rbac::refused("a job action", "jobs"))
                }
                // Followed until it ends (bounded by its timeout).
                (Ok(t), None, Some(template)) => loop {
                    match job(&self.ctx, &who, hook, template, "retention", t).await {
                        Ok(Some(o)) => break o,
                        Ok(None) => tokio::time::sleep(Duration::from_secs(2)).await,
                        Err(e) => break HookOutcome::Failed(format!("its Job: {e}")),
                    }
                },
                (Ok(_), None, None) => HookOutcome::Failed(
                    "a local command runs only outside the cluster; give the hook a job or a webhook".into(),
                ),
            };
            let (word, message, type_, reason) = as_recorded(&outcome, timeout_of(hook).ok());
            let note = format!(
                "DeleteHook {name} {word} for backup {}/{} (its Backup {object_name} is gone){}",
                b.name,
                b.id,
                suffix(message.as_deref())
            );
            self.ctx.event(&reference, type_, reason, &note).await;
            record_run(
                &self.ctx,
                hook,
                format!("{}/{}", b.name, b.id),
                word,
                message.as_deref(),
            )
            .await;
            results.push(HookResult {
                name,
                outcome: word.into(),
                message: message.map(|m| m.chars().take(1024).collect()),
                finished_at: Some(Time(self.ctx.clock.now())),
            });
        }
        Some(json!({
            "backupId": b.id, "backupName": b.name, "objectGone": object_name, "hooks": results,
        }))
    }
}

/// Writes the hook's `status.lastRun` (under its own field manager, beside the Ready
/// condition its controller writes). A refusal is logged: the deletion goes on.
async fn record_run(
    ctx: &Context,
    hook: &DeleteHook,
    backup: String,
    word: &str,
    message: Option<&str>,
) {
    let api: Api<DeleteHook> =
        Api::namespaced(ctx.client.clone(), &hook.namespace().unwrap_or_default());
    let run = HookRun {
        backup,
        outcome: word.to_owned(),
        message: message.map(|m| m.chars().take(1024).collect()),
        generation: hook.metadata.generation,
        time: Time(ctx.clock.now()),
    };
    if let Err(e) = crate::status::apply(
        &api,
        &hook.name_any(),
        crate::status::HOOK_RUNS_MANAGER,
        json!({ "lastRun": run }),
    )
    .await
    {
        tracing::warn!(hook = %hook.name_any(), "recording the hook's last run: {e}");
    }
}

/// One look at a DeleteHook: whether this operator can run it (`Ready`, with the reason
/// it cannot), from its spec and its last run. Runs nothing.
///
/// # Errors
/// The API failed.
pub async fn reconcile(
    hook: std::sync::Arc<DeleteHook>,
    ctx: std::sync::Arc<Context>,
) -> Result<kube::runtime::controller::Action, Error> {
    use kube::runtime::controller::Action;
    let api: Api<DeleteHook> =
        Api::namespaced(ctx.client.clone(), &hook.namespace().unwrap_or_default());
    // Whole and fresh: the cache keeps no job template, and a run's status may be newer.
    let Some(hook) = api.get_opt(&hook.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let generation = hook.metadata.generation;
    let previous = hook.status.clone().unwrap_or_default();
    let (ok, reason, message) = readiness(&ctx, &hook, previous.last_run.as_ref());
    let ready = crate::status::condition_at(
        &previous.conditions,
        "Ready",
        ok,
        reason,
        &message,
        generation,
        ctx.clock.now(),
    );
    let unchanged = previous.observed_generation == generation
        && previous.conditions.iter().any(|c| {
            c.type_ == ready.type_
                && c.status == ready.status
                && c.reason == ready.reason
                && c.message == ready.message
                && c.observed_generation == generation
        });
    if !unchanged {
        crate::status::apply(
            &api,
            &hook.name_any(),
            crate::status::FIELD_MANAGER,
            json!({ "observedGeneration": generation, "conditions": [ready] }),
        )
        .await?;
    }
    Ok(Action::await_change())
}

/// Whether the operator can run `hook`: `(ready, reason, message)`.
fn readiness(
    ctx: &Context,
    hook: &DeleteHook,
    last: Option<&HookRun>,
) -> (bool, &'static str, String) {
    if let Err(e) = runnable(hook) {
        return (false, "InvalidSpec", e);
    }
    let problem = match (&hook.spec.webhook, &hook.spec.job) {
        (Some(webhook), _) => {
            tidemark_engine::hooks::webhook_problem(webhook, &ctx.tenancy.denied_endpoints)
                .map(|p| ("InvalidSpec", p))
        }
        (None, Some(_)) if !ctx.capabilities.jobs => Some((
            "JobsDisabled",
            crate::rbac::refused("a job action", "jobs"),
        )),
        (None, Some(template)) => pod_spec_of(ctx, hook, template)
            .err()
            .map(|p| ("InvalidSpec", p)),
        (None, None) => Some((
            "StandaloneOnly",
            "a local command runs only in standalone `tidemark run`; give the hook a job or a webhook"
                .to_owned(),
        )),
    };
    if let Some((reason, message)) = problem {
        return (false, reason, message);
    }
    // A run of this spec: one of an earlier spec says nothing of this one.
    match last.filter(|r| r.generation == hook.metadata.generation) {
        Some(r) if r.outcome == "succeeded" => (
            true,
            "LastRunSucceeded",
            format!("its last run, for {}, succeeded", r.backup),
        ),
        Some(r) => (
            false,
            "LastRunFailed",
            format!(
                "its last run, for {}, {}{}",
                r.backup,
                r.outcome,
                suffix(r.message.as_deref())
            ),
        ),
        _ => (
            true,
            "Valid",
            "runs before the data of a Backup it selects is deleted".to_owned(),
        ),
    }
}

/// The pod spec of a job action, checked: within the size bound, a pod spec, and no more
/// than the hook's author may ask for (the Job is created with the operator's rights).
fn pod_spec_of(
    ctx: &Context,
    hook: &DeleteHook,
    template: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    if let Some(why) = tidemark_api::schedule::template_too_large(template, "spec.job", "") {
        return Err(why);
    }
    let spec = template
        .get("spec")
        .cloned()
        .unwrap_or_else(|| template.clone());
    let field = format!("DeleteHook {} spec.job", hook.name_any());
    let parsed: k8s_openapi::api::core::v1::PodSpec =
        serde_json::from_value(spec.clone()).map_err(|e| format!("{field}: {e}"))?;
    ctx.tenancy.check_pod(&parsed, &field)?;
    Ok(spec)
}

/// How an outcome is recorded: its word in `status.hooks`, its message, and its event's
/// type and reason. `timeout`: the hook's, named when it timed out.
fn as_recorded(
    outcome: &HookOutcome,
    timeout: Option<Duration>,
) -> (&'static str, Option<String>, EventType, &'static str) {
    let (type_, reason) = match outcome {
        HookOutcome::Succeeded(_) => (EventType::Normal, "DeleteHookSucceeded"),
        HookOutcome::Failed(_) => (EventType::Warning, "DeleteHookFailed"),
        HookOutcome::TimedOut => (EventType::Warning, "DeleteHookTimedOut"),
    };
    (
        outcome.word(),
        outcome.message(timeout.unwrap_or_default()),
        type_,
        reason,
    )
}

/// `: message`, or nothing.
fn suffix(message: Option<&str>) -> String {
    message.map(|m| format!(": {m}")).unwrap_or_default()
}

/// Whom a hook's Job runs for: a Backup object, or — once that object is gone — the
/// stored backup, owned by its BackupPolicy.
struct JobFor {
    namespace: String,
    /// Names the Job with the hook's uid: the Backup's uid, or a digest of the stored
    /// backup's directory.
    key: String,
    /// More labels (the Backup's uid).
    labels: serde_json::Map<String, serde_json::Value>,
    owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    /// `TIDEMARK_BACKUP`.
    description: serde_json::Value,
    /// For the log.
    what: String,
    /// Removed this long after it finished (one no Backup owns would stay for as long as
    /// its policy).
    ttl_after_finished: Option<i32>,
}

impl JobFor {
    fn backup(backup: &Backup, reason: &str) -> Self {
        JobFor {
            namespace: backup.namespace().unwrap_or_default(),
            key: crate::names::short_uid(backup),
            labels: [(
                crate::names::BACKUP_UID_LABEL.to_owned(),
                json!(backup.uid()),
            )]
            .into_iter()
            .collect(),
            owner: crate::context::owner_ref(backup),
            description: description(backup, reason),
            what: format!("Backup {}", backup.name_any()),
            ttl_after_finished: None,
        }
    }
}

/// The hook's Job: created once, then followed. `None` while it runs.
async fn job(
    ctx: &Context,
    who: &JobFor,
    hook: &DeleteHook,
    template: &serde_json::Value,
    reason: &str,
    timeout: Duration,
) -> Result<Option<HookOutcome>, Error> {
    let ns = who.namespace.clone();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let name = format!(
        "tidemark-hook-{}-{}",
        who.key,
        crate::names::short_uid(hook)
    );
    if let Some(j) = jobs.get_opt(&name).await? {
        let st = j.status.unwrap_or_default();
        let cond = |t: &str| {
            st.conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == t && c.status == "True")
                .cloned()
        };
        if cond("Complete").is_some() || st.succeeded.unwrap_or(0) > 0 {
            return Ok(Some(HookOutcome::Succeeded(Some(format!(
                "Job {name} succeeded"
            )))));
        }
        if let Some(c) = cond("Failed") {
            if c.reason.as_deref() == Some("DeadlineExceeded") {
                return Ok(Some(HookOutcome::TimedOut));
            }
            return Ok(Some(HookOutcome::Failed(format!(
                "Job {name} failed: {}",
                c.message.unwrap_or_default()
            ))));
        }
        if st.failed.unwrap_or(0) > 0 {
            return Ok(Some(HookOutcome::Failed(format!("Job {name} failed"))));
        }
        // No Job controller or kubelet answered within the timeout (and a margin).
        let created = j.metadata.creation_timestamp.map(|t| t.0);
        if created.is_some_and(|c| {
            ctx.clock.now()
                > c + jiff::SignedDuration::try_from(timeout + Duration::from_secs(30))
                    .unwrap_or_default()
        }) {
            return Ok(Some(HookOutcome::TimedOut));
        }
        return Ok(None);
    }
    let mut spec = match pod_spec_of(ctx, hook, template) {
        Ok(spec) => spec,
        Err(message) => return Ok(Some(HookOutcome::Failed(message))),
    };
    let env = json!([
        {"name": "TIDEMARK_DELETE_REASON", "value": reason},
        {"name": "TIDEMARK_BACKUP", "value": who.description.to_string()},
    ]);
    if let Some(containers) = spec.get_mut("containers").and_then(|c| c.as_array_mut()) {
        for c in containers {
            let mut all = env.as_array().cloned().unwrap_or_default();
            if let Some(own) = c.get("env").and_then(|e| e.as_array()) {
                all.extend(
                    own.iter()
                        .filter(|e| {
                            !matches!(
                                e.get("name").and_then(|n| n.as_str()),
                                Some("TIDEMARK_DELETE_REASON" | "TIDEMARK_BACKUP")
                            )
                        })
                        .cloned(),
                );
            }
            c["env"] = json!(all);
        }
    }
    if spec.get("restartPolicy").is_none() {
        spec["restartPolicy"] = json!("Never");
    }
    let mut labels = who.labels.clone();
    labels.insert(HOOK_LABEL.into(), json!(hook.name_any()));
    labels.insert(
        crate::names::MANAGED_BY.0.into(),
        json!(crate::names::MANAGED_BY.1),
    );
    let job: Job = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels,
            "ownerReferences": who.owner.iter().collect::<Vec<_>>(),
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": timeout.as_secs().max(1),
            "ttlSecondsAfterFinished": who.ttl_after_finished,
            "template": {"spec": spec},
        },
    }))
    .map_err(|e| Error::Invalid(format!("DeleteHook {} spec.job: {e}", hook.name_any())))?;
    match jobs.create(&PostParams::default(), &job).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => {
            return Ok(Some(HookOutcome::Failed(format!(
                "its Job was refused: {}",
                s.message
            ))));
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(for_ = %who.what, hook = %hook.name_any(), job = %name, "delete hook Job created");
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;

    #[test]
    fn selectors_read_as_kubernetes_reads_them() {
        let labels: BTreeMap<String, String> = [
            ("team".to_owned(), "pay".to_owned()),
            ("tier".to_owned(), "prod".to_owned()),
        ]
        .into();
        let sel = |v: serde_json::Value| serde_json::from_value::<LabelSelector>(v).unwrap();
        assert!(selects(&sel(json!({})), &labels));
        assert!(selects(
            &sel(json!({"matchLabels": {"team": "pay"}})),
            &labels
        ));
        assert!(!selects(
            &sel(json!({"matchLabels": {"team": "ops"}})),
            &labels
        ));
        assert!(selects(
            &sel(
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["prod", "dev"]}]})
            ),
            &labels
        ));
        assert!(!selects(
            &sel(
                json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["prod"]}]})
            ),
            &labels
        ));
        assert!(selects(
            &sel(json!({"matchExpressions": [{"key": "gone", "operator": "DoesNotExist"}]})),
            &labels
        ));
        assert!(!selects(
            &sel(json!({"matchExpressions": [{"key": "gone", "operator": "Exists"}]})),
            &labels
        ));
    }
}
