//! The retention pass, as `tidemark gc`, `tidemark run` and the operator all run it:
//! observe (list the store) → plan (pure, `tidemark-core`) → the work the plan asks for
//! (consolidation, through a [`Consolidator`]) → execute (the one deleter, audit record
//! first) → report. One path, so malformed metadata, holds and the audit record are
//! handled the same everywhere.

use std::collections::HashSet;
use std::path::PathBuf;

use async_trait::async_trait;
use jiff::Timestamp;
use tidemark_core::{Action, Backup, Policy, Reason};
use tidemark_store::executor::{Consolidation, ExecOptions};
use tidemark_store::{
    ClusterStore, DeleteFailure, ExecutionReport, Progress, Survey, SurveyOptions, execute, survey,
};

use tidemark_store::metacache::CacheUse;
use tidemark_store::transfer;

use crate::error::{EngineError, chain};
use crate::fence::Fence;

/// Builds the synthetic full a plan's `consolidate` actions ask for (seed 002).
#[async_trait]
pub trait Consolidator: Send + Sync {
    /// Builds and commits the full that replaces `target`, from what `survey` saw.
    ///
    /// # Errors
    /// The chain cannot be merged; nothing of it is deleted then. An error of class
    /// [`crate::error::Class::Contention`] says the work is under way elsewhere (a Job that
    /// runs): not a failure of the pass.
    async fn consolidate(
        &self,
        store: &ClusterStore,
        survey: &Survey,
        target: &Backup,
        progress: &dyn Progress,
    ) -> Result<Consolidation, EngineError>;
}

/// Consolidates on this machine: download, `mbstream -x`, `mariabackup --prepare`, and the
/// prepared directory streamed back as a new full.
#[derive(Debug, Clone)]
pub struct LocalConsolidator {
    pub tools: tidemark_mariadb::Tools,
    /// Where a chain is prepared (room for one full data directory).
    pub work_dir: PathBuf,
}

#[async_trait]
impl Consolidator for LocalConsolidator {
    async fn consolidate(
        &self,
        store: &ClusterStore,
        survey: &Survey,
        target: &Backup,
        progress: &dyn Progress,
    ) -> Result<Consolidation, EngineError> {
        Ok(tidemark_mariadb::consolidate::consolidate(
            store,
            &survey.catalog,
            &survey.inventory,
            &target.id,
            &self.tools,
            &self.work_dir,
            progress,
        )
        .await?)
    }
}

/// `tidemark consolidate`: the synthetic full of the chain that ends at `backup_id`, made
/// now on this machine (a pass makes the same when its plan asks, through its
/// [`Consolidator`]).
///
/// # Guarantees
/// Deletes nothing of the chain (a pass deletes what the full replaces, later).
///
/// # Errors
/// No such backup or chain, a tool failed, the store failed.
pub async fn consolidate_now(
    store: &ClusterStore,
    backup_id: &str,
    consolidator: &LocalConsolidator,
    progress: &dyn Progress,
) -> Result<Consolidation, EngineError> {
    let catalog = tidemark_store::Catalog::load(store, progress).await?;
    let inventory = catalog.inventory(&tidemark_store::SegmentListing::default());
    Ok(tidemark_mariadb::consolidate::consolidate(
        store,
        &catalog,
        &inventory,
        backup_id,
        &consolidator.tools,
        &consolidator.work_dir,
        progress,
    )
    .await?)
}

/// What runs before a pass deletes backups (DeleteHooks, seed 003): it cannot stop the
/// deletion; what it reports goes into the audit record as `hooks`.
#[async_trait]
pub trait DeleteHooks: Send + Sync + std::fmt::Debug {
    /// Runs the hooks that apply to `deleting` (the backups the plan deletes, with their
    /// `metadata.json` when readable) before anything is deleted.
    async fn before_delete(
        &self,
        store: &ClusterStore,
        deleting: &[(&Backup, Option<&tidemark_store::format::Metadata>)],
    ) -> Vec<serde_json::Value>;

    /// The holds in force now (backup-ids), read again after the hooks ran: hooks can take
    /// long, and a hold placed meanwhile must be honoured. `None`: holds cannot change
    /// during a pass (the request's stand).
    async fn holds(&self) -> Option<HashSet<String>> {
        None
    }

    /// The restores' holds in force now, read again after the hooks ran, as [`Self::holds`].
    async fn restore_holds(&self) -> Option<Vec<tidemark_core::RestoreHold>> {
        None
    }

    /// Whether these hooks run `hook` (one the store records, the operator's): one of the
    /// same name and action. Then its record refuses nothing.
    fn runs(&self, _hook: &tidemark_store::state::StoredHook) -> bool {
        false
    }

    /// Hooks of the caller's that cannot run here (a `job` action outside the cluster): a
    /// deletion they select is refused, as one a recorded hook selects, unless skipped.
    fn cannot_run(&self) -> Vec<tidemark_store::state::StoredHook> {
        Vec::new()
    }
}

/// Who runs the DeleteHooks that cannot run where the deletion is made: those the store
/// records (`_state/hooks.json`, the operator's) that the caller's hooks do not run, and
/// the caller's own that need the cluster ([`DeleteHooks::cannot_run`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordedHooks {
    /// The caller runs every hook itself (the operator): the record is not read.
    RunByCaller,
    /// A deletion such a hook selects is refused, naming it (the command line).
    Refuse,
    /// Deleted without them, each named in the audit record (`--skip-hooks`).
    Skip,
}

/// One retention pass to make.
#[derive(Debug, Clone)]
pub struct PassRequest {
    pub policy: Policy,
    /// The policy as the user wrote it, for the audit record.
    pub policy_as_given: serde_json::Value,
    /// The instant the policy is evaluated at.
    pub now: Timestamp,
    /// The wall clock at the start of the pass (names the audit record).
    pub started_at: Timestamp,
    /// Backup-ids on hold for this pass.
    pub protect: HashSet<String>,
    /// Backups restores need (kept, reason `restore:<name>`, with their chains and the
    /// binlogs after them).
    pub restores: Vec<tidemark_core::RestoreHold>,
    /// Carry the plan out (`gc`), or only make it (`plan`).
    pub execute: bool,
    /// Go ahead although some `metadata.json` files are malformed (those backups are kept
    /// whatever happens).
    pub ignore_malformed: bool,
    /// Run before the deletions of an executed pass.
    pub hooks: Option<std::sync::Arc<dyn DeleteHooks>>,
    /// What becomes of a deletion that hooks select which `hooks` cannot run (recorded in
    /// the store by the operator, or needing the cluster).
    pub recorded_hooks: RecordedHooks,
    /// Delete although the store records that the cluster has no established primary
    /// (seed 000's gate, `_state/holds.json`): the operator, which looks at the primary
    /// itself, and `--override-primary-gate`.
    pub override_primary_gate: bool,
    /// The acknowledgement of mass deletions (`tidemark.io/allow-deletions-before`,
    /// `gc --allow-mass-deletion`): the deletion guard releases the deletions it first held
    /// at or before this instant, and no later wave.
    pub allow_deletions_before: Option<Timestamp>,
    /// The policy in force before this one (a change being previewed, or the operator's
    /// last applied): the pass compares its plan with this one's ([`PassOutcome::change`]).
    pub compare_with: Option<Policy>,
}

/// What a pass saw, planned and did.
#[derive(Debug)]
pub struct PassOutcome {
    /// What the plan was made from, and the plan (after any consolidation, the plan that
    /// was carried out).
    pub survey: Survey,
    /// What was done (`None`: a dry run, or refused because of malformed metadata).
    pub executed: Option<ExecutionReport>,
    /// Malformed `metadata.json` stopped the pass before it deleted anything.
    pub blocked_by_malformed: bool,
    /// The deletion guard's judgement of the plan (DESIGN.md §5.5): what it holds, and why.
    pub guard: tidemark_core::guard::Verdict,
    /// With [`PassRequest::compare_with`]: what this policy does that that one does not.
    pub change: Option<tidemark_core::preview::PolicyChange>,
}

/// Makes one retention pass over `store`: a plan, and when `request.execute`, the work it
/// asks for and its deletions, all under `fence` (the store's lease, which an executing
/// pass must be given).
///
/// # Guarantees
/// Nothing is consolidated or deleted once `fence` is lost ([`Fence::guard`]). Those of
/// [`tidemark_store::execute`]: the audit record before any deletion, metadata
/// before payload, segments before the index. A synthetic full is committed before the
/// plan that deletes what it replaces is made (from a fresh listing), so a consolidation
/// that fails deletes nothing of its chain.
///
/// # Errors
/// The store failed or holds data that blocks the pass (a malformed or newer index); the
/// fence was lost, or an executing pass was given none or another store's.
#[tracing::instrument(skip_all, fields(cluster = %store.cluster, now = %request.now, execute = request.execute))]
pub async fn retention_pass(
    store: &ClusterStore,
    request: &PassRequest,
    fence: Option<&Fence>,
    consolidator: Option<&dyn Consolidator>,
    progress: &dyn Progress,
) -> Result<PassOutcome, EngineError> {
    // The holds recorded in the store (`_state/holds.json`: the operator's protected
    // Backups and Restores) count for every deleter, the command line's too (seed 000).
    let with_stored;
    let request = match tidemark_store::state::load_holds(store).await? {
        Some(stored) => {
            if let Some(gate) = stored.no_primary.as_ref().filter(|_| request.execute)
                && !request.override_primary_gate
            {
                return Err(EngineError::Edge {
                    class: crate::error::Class::Input,
                    message: no_primary_refusal(&stored.writer, gate),
                });
            }
            let (protect, restores) = stored.into_pass_holds();
            let mut r = request.clone();
            r.protect.extend(protect);
            r.restores.extend(restores);
            r.restores.sort();
            r.restores.dedup();
            with_stored = r;
            &with_stored
        }
        None => request,
    };
    let fence = match (request.execute, fence) {
        (false, _) => None,
        (true, Some(f)) if f.store().url == store.url && f.store().cluster == store.cluster => {
            Some(f)
        }
        (true, _) => {
            return Err(EngineError::Internal(format!(
                "a retention pass deletes from {}/{} only under that store's lease",
                store.url, store.cluster
            )));
        }
    };
    // A pass that deletes keeps the metadata cache up to date; `plan` only reads it.
    let writing;
    let store = match fence {
        Some(_) if store.metadata_cache() == CacheUse::Read => {
            writing = store.clone().with_metadata_cache(CacheUse::Write);
            &writing
        }
        _ => store,
    };
    // What each copy of the store has not received yet is kept (`_state/copies/`), for
    // every deleter. Read under the fence like the listing: a server that pages without
    // end is stopped with the lease.
    let looked = async {
        let copies: Vec<tidemark_core::copies::CopyFloor> =
            tidemark_store::state::load_copies(store)
                .await?
                .iter()
                .map(tidemark_store::state::CopyRecord::floor)
                .collect();
        let mut options = SurveyOptions {
            protect: request.protect.clone(),
            restores: request.restores.clone(),
            copies,
            guarded: HashSet::new(),
        };
        let mut seen = survey(store, &request.policy, request.now, &options, progress).await?;
        let change = request.compare_with.as_ref().map(|current| {
            let before = tidemark_store::survey::plan_for(
                current,
                &seen.inventory,
                request.now,
                &options.copies,
            );
            tidemark_core::preview::compare(&before, &seen.plan)
        });
        // The deletion guard judges the plan; what it holds is planned again as kept
        // (`deletionGuard`), so the horizon keeps the binlogs they need.
        let record = tidemark_store::state::load_guard(store).await?;
        let before = tidemark_core::standing_at(
            &seen.inventory,
            tidemark_core::point_in_time_start(&request.policy, request.now),
        );
        let verdict = tidemark_core::guard::assess(
            &request.policy.deletion_guard,
            &seen.plan,
            &before.restorable,
            before.window.as_ref(),
            &record,
            request.allow_deletions_before,
            request.started_at,
        );
        let mut verdict = verdict;
        if !verdict.held.is_empty() {
            // Planned again with what is held kept. That plan may delete what the judged
            // one kept (a bridge the held backups made redundant): held as well, so that
            // nothing goes that was not judged and released.
            let judged: HashSet<String> =
                seen.plan.deletions().map(|d| d.backup.id.clone()).collect();
            for round in 0..=GUARD_ROUNDS {
                options.guarded = verdict.held.keys().cloned().collect();
                seen = survey(store, &request.policy, request.now, &options, progress).await?;
                let unjudged: Vec<String> = seen
                    .plan
                    .deletions()
                    .filter(|d| !judged.contains(&d.backup.id))
                    .map(|d| d.backup.id.clone())
                    .collect();
                if unjudged.is_empty() {
                    break;
                }
                for id in unjudged {
                    let since = record.held.get(&id).copied().unwrap_or(request.started_at);
                    verdict.held.insert(id, since);
                }
                if round == GUARD_ROUNDS {
                    // Still moving: this pass deletes no backup at all.
                    let all: Vec<String> =
                        seen.plan.deletions().map(|d| d.backup.id.clone()).collect();
                    for id in all {
                        let since = record.held.get(&id).copied().unwrap_or(request.started_at);
                        verdict.held.insert(id, since);
                    }
                    options.guarded = verdict.held.keys().cloned().collect();
                    seen = survey(store, &request.policy, request.now, &options, progress).await?;
                }
            }
        }
        apply_holds(
            &mut seen,
            &verdict,
            tidemark_core::point_in_time_start(&request.policy, request.now),
        );
        let guard = Guard {
            verdict,
            record,
            restorable_before: before.restorable.len(),
            change,
        };
        Ok::<_, EngineError>((options, seen, guard))
    };
    let (options, seen, guard) = match fence {
        Some(f) => f.guard(looked).await?,
        None => looked.await?,
    };
    let Some(fence) = fence else {
        return Ok(PassOutcome {
            survey: seen,
            executed: None,
            blocked_by_malformed: false,
            guard: guard.verdict,
            change: guard.change,
        });
    };
    if !seen.catalog.malformed.is_empty() && !request.ignore_malformed {
        return Ok(PassOutcome {
            survey: seen,
            executed: None,
            blocked_by_malformed: true,
            guard: guard.verdict,
            change: guard.change,
        });
    }
    fence
        .guard(carry_out(
            store,
            request,
            consolidator,
            progress,
            seen,
            options,
            guard,
        ))
        .await
}

/// The deletion guard's judgement of a pass, and what it is judged against.
struct Guard {
    verdict: tidemark_core::guard::Verdict,
    record: tidemark_core::guard::GuardRecord,
    restorable_before: usize,
    change: Option<tidemark_core::preview::PolicyChange>,
}

/// Rounds of planning again while the deletion guard's holds change what a plan deletes.
const GUARD_ROUNDS: usize = 3;

/// Holds what the deletion guard's `verdict` holds beyond the backups planned as kept:
/// every segment deletion and index change, and with a short listing every leftover too.
fn apply_holds(
    seen: &mut Survey,
    verdict: &tidemark_core::guard::Verdict,
    pitr_start: Option<jiff::Timestamp>,
) {
    let plan = &mut seen.plan;
    let deleting = plan.segments.delete.len() + plan.segments.drop_from_index.len();
    if verdict.hold_all {
        plan.segments.delete.clear();
        plan.segments.drop_from_index.clear();
    }
    // A held pass deletes only the segments the guard judged and an acknowledgement
    // released: one the judged plan did not show (the store listed again after
    // consolidation or hooks) is not deleted on the word of that listing.
    if !verdict.trips.is_empty() {
        let released = &verdict.released_segments;
        plan.segments
            .delete
            .retain(|d| released.contains(&d.sequence));
        plan.segments
            .drop_from_index
            .retain(|e| released.contains(&e.sequence));
    }
    // The window the pass leaves is the one of what it still deletes (the plan's assumed
    // every segment deletion carried out).
    if plan.segments.delete.len() + plan.segments.drop_from_index.len() != deleting {
        plan.recovery_window = tidemark_core::window_after(&seen.inventory, plan, pitr_start);
    }
    if verdict.hold_all {
        plan.leftovers.delete.clear();
    }
}

/// The executing half of [`retention_pass`], under its fence.
async fn carry_out(
    store: &ClusterStore,
    request: &PassRequest,
    consolidator: Option<&dyn Consolidator>,
    progress: &dyn Progress,
    mut seen: Survey,
    options: SurveyOptions,
    guard: Guard,
) -> Result<PassOutcome, EngineError> {
    let copies = options.copies.clone();

    // DeleteHooks this deleter cannot run: refused before any work (consolidation
    // included) on what the plan deletes or merges. The store's record of the operator's
    // hooks is read once for the pass.
    let stored_hooks = stored_hooks(store, request.recorded_hooks).await?;
    if request.recorded_hooks != RecordedHooks::RunByCaller {
        let early: Vec<(&str, &str)> = seen
            .plan
            .backups
            .iter()
            .filter(|d| d.action != Action::Keep)
            .map(|d| (d.backup.name.as_str(), d.backup.id.as_str()))
            .collect();
        recorded_hooks(
            &stored_hooks,
            &seen.catalog,
            &early,
            request.recorded_hooks,
            request.hooks.as_deref(),
        )?;
    }

    // The work the plan asks for first: each synthetic full is committed before anything
    // of its chain goes, then the store is read again, and the full stands in.
    let mut consolidated = Vec::new();
    let mut failures = Vec::new();
    let targets: Vec<Backup> = consolidation_targets(&seen);
    if let Some(driver) = consolidator
        && !targets.is_empty()
    {
        for target in &targets {
            progress.step(&format!("consolidating the chain of {}", target.id), 0);
            match driver.consolidate(store, &seen, target, progress).await {
                Ok(c) => {
                    tracing::info!(target = %c.target, synthetic = %c.synthetic, "synthetic full committed");
                    consolidated.push(c);
                }
                // Under way elsewhere (a Job that runs): not a failure; the chain stays
                // and a later pass finds the synthetic full.
                Err(e) if e.class() == crate::error::Class::Contention => {
                    tracing::info!(target = %target.id, "consolidation under way: {}", chain(&e));
                }
                Err(e) => failures.push(DeleteFailure {
                    key: format!("{}/{}/{}", store.cluster, target.name, target.id),
                    error: format!("consolidation failed, the chain stays: {}", chain(&e)),
                }),
            }
        }
        if !consolidated.is_empty() {
            seen = survey(store, &request.policy, request.now, &options, progress).await?;
        }
    }

    if request.policy.require_verified {
        newest_reads_back(store, &seen, request.started_at, progress).await?;
    }
    let mut exec = ExecOptions::new(request.started_at, request.policy_as_given.clone());
    exec.index_shard_size = tidemark_store::index::SHARD_SIZE;
    let mut skipped = Vec::new();
    if let Some(hooks) = &request.hooks {
        // Hooks run before anything of a backup goes; they may take long, so the plan is
        // made again afterwards with the holds in force then, and hooks run for any backup
        // the new plan deletes that they have not run for (a few rounds at most; what is
        // still new after them is kept for the next pass).
        let mut hooked: HashSet<String> = HashSet::new();
        let mut ran_all = Vec::new();
        let mut protect = request.protect.clone();
        let mut restores = request.restores.clone();
        for round in 0..HOOK_ROUNDS {
            // What the hooks need of the backups, owned: the survey is dropped while they
            // run (they may take hours; a shared operator bounds how many catalogs are in
            // memory, and gives a pass's turn to another while its hooks run).
            let deleting: Vec<(Backup, Option<tidemark_store::format::Metadata>)> = seen
                .plan
                .deletions()
                .filter(|d| !hooked.contains(&d.backup.id))
                .map(|d| {
                    let meta = seen
                        .catalog
                        .backup(&d.backup.name, &d.backup.id)
                        .and_then(|b| b.metadata.clone());
                    (d.backup.clone(), meta)
                })
                .collect();
            if deleting.is_empty() {
                break;
            }
            if round + 1 == HOOK_ROUNDS {
                // Not hooked: not deleted by this pass.
                protect.extend(deleting.iter().map(|(b, _)| b.id.clone()));
                let options = SurveyOptions {
                    protect: protect.clone(),
                    restores: restores.clone(),
                    copies: copies.clone(),
                    guarded: options.guarded.clone(),
                };
                seen = survey(store, &request.policy, request.now, &options, progress).await?;
                break;
            }
            hooked.extend(deleting.iter().map(|(b, _)| b.id.clone()));
            drop(seen);
            let borrowed: Vec<_> = deleting.iter().map(|(b, m)| (b, m.as_ref())).collect();
            ran_all.extend(hooks.before_delete(store, &borrowed).await);
            drop(borrowed);
            // The plan is made again after the hooks, with the holds in force then; what
            // it deletes that no hook ran for yet gets its hooks in the next round.
            protect.extend(hooks.holds().await.into_iter().flatten());
            restores.extend(hooks.restore_holds().await.into_iter().flatten());
            let options = SurveyOptions {
                protect: protect.clone(),
                restores: restores.clone(),
                copies: copies.clone(),
                guarded: options.guarded.clone(),
            };
            seen = survey(store, &request.policy, request.now, &options, progress).await?;
        }
        skipped.extend(ran_all);
    }
    // On the plan carried out (hooks' rounds may have added deletions): hooks that cannot
    // run here refuse, or are skipped and said.
    if request.recorded_hooks != RecordedHooks::RunByCaller {
        let deleting: Vec<(&str, &str)> = seen
            .plan
            .deletions()
            .map(|d| (d.backup.name.as_str(), d.backup.id.as_str()))
            .collect();
        if let Some(s) = recorded_hooks(
            &stored_hooks,
            &seen.catalog,
            &deleting,
            request.recorded_hooks,
            request.hooks.as_deref(),
        )? {
            skipped.splice(0..0, s);
        }
    }
    if !skipped.is_empty() {
        exec.audit_extra
            .insert("hooks".into(), serde_json::Value::Array(skipped));
    }
    // Again on the plan carried out: hooks may have taken long, and a backup committed
    // meanwhile is the newest now (the same newest costs one read of its record).
    if request.policy.require_verified {
        newest_reads_back(store, &seen, request.started_at, progress).await?;
    }
    // The guard's record, before anything goes: what it holds and since when, and what
    // this pass leaves (a pass cut short leaves more, which the next one does not mind).
    apply_holds(
        &mut seen,
        &guard.verdict,
        tidemark_core::point_in_time_start(&request.policy, request.now),
    );
    let restorable_deleted = seen
        .plan
        .deletions()
        .filter(|d| {
            d.backup.phase == tidemark_core::Phase::Completed
                && !d.reasons.contains(&tidemark_core::Reason::Broken)
        })
        .count();
    let record = guard.verdict.record(
        request.started_at,
        guard.restorable_before.saturating_sub(restorable_deleted),
        &guard.record,
    );
    if record != guard.record {
        tidemark_store::state::save_guard(store, &record).await?;
    }
    let mut report = execute(store, &seen, &exec, progress).await?;
    for d in seen.plan.deletions() {
        if report.backups_deleted.contains(&d.backup.id) {
            let why: Vec<String> = d.reasons.iter().map(ToString::to_string).collect();
            tracing::info!(
                backup = %format!("{}/{}", d.backup.name, d.backup.id),
                reasons = %why.join(", "),
                "deleted"
            );
        }
    }
    report.consolidated = consolidated;
    report.failures.splice(0..0, failures);
    Ok(PassOutcome {
        survey: seen,
        executed: Some(report),
        blocked_by_malformed: false,
        guard: guard.verdict,
        change: guard.change,
    })
}

/// The operator's DeleteHooks the store records (`_state/hooks.json`), for a deleter that
/// does not run every hook itself (none read for [`RecordedHooks::RunByCaller`]).
///
/// # Errors
/// The record cannot be read.
pub(crate) async fn stored_hooks(
    store: &ClusterStore,
    mode: RecordedHooks,
) -> Result<Vec<tidemark_store::state::StoredHook>, EngineError> {
    if mode == RecordedHooks::RunByCaller {
        return Ok(Vec::new());
    }
    Ok(tidemark_store::state::load_hooks(store)
        .await?
        .map(|r| r.hooks)
        .unwrap_or_default())
}

/// The DeleteHooks that cannot run where this deletion is made and select a backup of
/// `deleting` (`(name, id)`, by the labels its `metadata.json` records in `catalog`): those
/// the operator recorded in the store (`_state/hooks.json`) that `hooks` do not run, and
/// `hooks`' own that need the cluster. Refused, naming them, unless `mode` is
/// [`RecordedHooks::Skip`]; then skipped, each one said as the audit record's `hooks`
/// (`None`: none selects anything).
///
/// # Errors
/// Such hooks select a deletion and `mode` refuses (class Input).
pub(crate) fn recorded_hooks(
    recorded: &[tidemark_store::state::StoredHook],
    catalog: &tidemark_store::catalog::Catalog,
    deleting: &[(&str, &str)],
    mode: RecordedHooks,
    hooks: Option<&dyn DeleteHooks>,
) -> Result<Option<Vec<serde_json::Value>>, EngineError> {
    let skip = mode == RecordedHooks::Skip;
    let mut unrun: Vec<tidemark_store::state::StoredHook> = recorded
        .iter()
        .filter(|h| !hooks.is_some_and(|own| own.runs(h)))
        .cloned()
        .collect();
    for own in hooks.map(|h| h.cannot_run()).unwrap_or_default() {
        if !unrun.iter().any(|u| u.name == own.name) {
            unrun.push(own);
        }
    }
    if unrun.is_empty() {
        return Ok(None);
    }
    let selectors: Vec<(
        &str,
        &str,
        Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    )> = unrun
        .iter()
        .map(|h| {
            (
                h.name.as_str(),
                h.action.as_str(),
                serde_json::from_value(h.selector.clone()).ok(),
            )
        })
        .collect();
    let mut report = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for (name, id) in deleting {
        let labels = catalog
            .backup(name, id)
            .and_then(|s| s.metadata.as_ref())
            .map(|m| m.labels.clone())
            .unwrap_or_default();
        // A selector that cannot be read selects everything: refusing is the safe side.
        let selecting: Vec<&(&str, &str, _)> = selectors
            .iter()
            .filter(|(_, _, sel)| {
                sel.as_ref()
                    .is_none_or(|s| tidemark_api::lifecycle::selects(s, &labels))
            })
            .collect();
        if selecting.is_empty() {
            continue;
        }
        names.extend(selecting.iter().map(|(n, a, _)| format!("{n} ({a})")));
        let hooks: Vec<serde_json::Value> = selecting
            .iter()
            .map(|(n, _, _)| {
                serde_json::json!({"name": n, "outcome": "skipped",
                    "message": "deleted with --skip-hooks: the hook cannot run here and did not run"})
            })
            .collect();
        report.push(serde_json::json!({"backupId": id, "backupName": name, "hooks": hooks}));
    }
    if report.is_empty() {
        return Ok(None);
    }
    if !skip {
        return Err(EngineError::Edge {
            class: crate::error::Class::Input,
            message: format!(
                "DeleteHooks that cannot run here select {} backup(s) this deletion takes: {}; a job runs only in the cluster, and a hook the operator recorded for this store (_state/hooks.json) runs here only from its definition: give the DeleteHook files with --hooks FILE (webhooks and commands run here), let the operator's pass or `kubectl delete backup` delete them, give --skip-hooks to `tidemark gc` or `tidemark delete` to delete without them (recorded in the audit record), or remove _state/hooks.json if no operator owns this store any more. Nothing was deleted",
                report.len(),
                names.into_iter().collect::<Vec<_>>().join(", ")
            ),
        });
    }
    Ok(Some(report))
}

/// Why a pass deletes nothing while the store records no established primary.
pub fn no_primary_refusal(writer: &str, gate: &tidemark_store::state::StoredGate) -> String {
    format!(
        "{writer} records that the cluster has had no established primary since {} ({}): retention deletes nothing until one is established (seed 000; _state/holds.json). Nothing was deleted; `plan` shows the pass; give --override-primary-gate to delete anyway (e.g. the cluster is gone for good)",
        gate.since, gate.message
    )
}

/// Rounds of hooks and re-planning a pass makes at most (see [`retention_pass`]).
const HOOK_ROUNDS: usize = 3;

/// `retention.requireVerified`: the newest completed backup and its chain read back whole
/// (size, sha256, content where this machine can decode it) before a pass deletes any
/// backup; recorded beside it (`_verified.json`) so that each backup is read once.
///
/// # Errors
/// A payload of the chain is damaged, cut or missing ([`Class::Data`]): nothing is
/// deleted; a request failed.
async fn newest_reads_back(
    store: &ClusterStore,
    seen: &Survey,
    at: Timestamp,
    progress: &dyn Progress,
) -> Result<(), EngineError> {
    // Only deleting a completed backup waits for it (failed attempts' TTL does not).
    let deleting_backups = seen
        .plan
        .deletions()
        .any(|d| d.backup.phase == tidemark_core::Phase::Completed);
    if !deleting_backups {
        return Ok(());
    }
    // The newest completed backup the plan keeps (one it deletes or consolidates away
    // cannot be the one that stands in for the others).
    let going: HashSet<&str> = seen
        .plan
        .backups
        .iter()
        .filter(|d| d.action != Action::Keep)
        .map(|d| d.backup.id.as_str())
        .collect();
    let Some(newest) = seen
        .catalog
        .backups
        .iter()
        .filter(|b| {
            b.backup.phase == tidemark_core::Phase::Completed
                && b.metadata.is_some()
                && !going.contains(b.backup.id.as_str())
        })
        .max_by(|a, b| {
            (a.backup.started_at, &a.backup.id).cmp(&(b.backup.started_at, &b.backup.id))
        })
    else {
        return Ok(());
    };
    let (name, id) = (&newest.backup.name, &newest.backup.id);
    let refuse = |problem: String| EngineError::Unverified {
        backup: format!("{name}/{id}"),
        problem,
    };
    let members = tidemark_core::chain_of(&seen.inventory, id)
        .ok_or_else(|| refuse("its chain is incomplete".into()))?;
    // Each member is read once: its own record names its payloads (backup-id:sha256), so
    // a new incremental reads only itself, and a synthetic full, a new backup, is read.
    let mut announced = false;
    for b in &members {
        let m = seen
            .catalog
            .backup(&b.name, &b.id)
            .and_then(|s| s.metadata.as_ref())
            .ok_or_else(|| refuse(format!("{} has no readable metadata.json", b.id)))?;
        let own = transfer::verified_payloads(m);
        if transfer::is_verified(store, &b.name, &b.id, &own).await? {
            continue;
        }
        if !announced {
            progress.step(
                &format!("reading back the newest backup {id} and its chain"),
                0,
            );
            announced = true;
        }
        let mut depth = transfer::Checked::Content;
        for p in &m.payload {
            match crate::verify::check_payload(store, m, p, progress).await {
                Ok(transfer::Checked::Stored) => depth = transfer::Checked::Stored,
                Ok(transfer::Checked::Content) => {}
                Err(transfer::TransferError::Store(e)) => {
                    return Err(EngineError::Store(Box::new(e)));
                }
                Err(e) => return Err(refuse(chain(&e))),
            }
        }
        // Never into a directory this pass deletes: the record would outlive the backup.
        if !going.contains(b.id.as_str()) {
            transfer::record_verified(store, &b.name, &b.id, &own, depth, at, "retention pass")
                .await?;
        }
    }
    tracing::info!(backup = %format!("{name}/{id}"), "the newest backup read back whole");
    Ok(())
}

/// The increments the plan replaces by synthetic fulls: `consolidate` actions that are not
/// themselves merged into another.
fn consolidation_targets(survey: &Survey) -> Vec<Backup> {
    survey
        .plan
        .backups
        .iter()
        .filter(|d| d.action == Action::Consolidate)
        .filter(|d| {
            !d.reasons
                .iter()
                .any(|r| matches!(r, Reason::ConsolidateInto(_)))
        })
        .map(|d| d.backup.clone())
        .collect()
}

/// A pass nobody watches (`tidemark run`, the operator): malformed `metadata.json` stops it
/// as it stops `gc` without `--ignore-malformed` (an error of class Data), and what it
/// deleted is logged, each backup with its reasons.
///
/// # Guarantees
/// Those of [`retention_pass`].
///
/// # Errors
/// As [`retention_pass`], and malformed metadata.
pub async fn unattended_pass(
    store: &ClusterStore,
    request: &PassRequest,
    fence: Option<&Fence>,
    consolidator: Option<&dyn Consolidator>,
) -> Result<PassOutcome, EngineError> {
    let outcome = retention_pass(
        store,
        request,
        fence,
        consolidator,
        &tidemark_store::NoProgress,
    )
    .await?;
    if outcome.blocked_by_malformed {
        let list: Vec<String> = outcome
            .survey
            .catalog
            .malformed
            .iter()
            .map(|m| format!("{}: {}", m.key, m.problem))
            .collect();
        return Err(EngineError::from(
            tidemark_store::StoreError::MalformedState {
                url: store.url.clone(),
                key: format!("{} metadata.json file(s)", list.len()),
                problem: format!(
                    "retention deletes nothing until they are fixed (as gc without --ignore-malformed): {}",
                    list.join("; ")
                ),
            },
        ));
    }
    if outcome.guard.holds() {
        tracing::warn!(
            "retention: deletion guard: {}{}",
            outcome.guard.summary(),
            outcome.guard.release_with.map_or(String::new(), |at| format!(
                "; if that is what you want, acknowledge with tidemark.io/allow-deletions-before: \"{at}\" on the policy (tidemark run reads it from its policy file), or `tidemark gc --allow-mass-deletion {at}` while nothing else holds the store's lease"
            ))
        );
    }
    if let Some(report) = &outcome.executed {
        for d in outcome.survey.plan.deletions() {
            if report.backups_deleted.contains(&d.backup.id) {
                let why: Vec<String> = d.reasons.iter().map(ToString::to_string).collect();
                tracing::info!(
                    "retention: deleted backup {}/{} ({})",
                    d.backup.name,
                    d.backup.id,
                    why.join(", ")
                );
            }
        }
        if report.audit_key.is_some() {
            tracing::info!(
                "retention: deleted {} backup(s), {} binlog segment(s) behind the horizon {} and {} leftover(s); audit record {}",
                report.backups_deleted.len(),
                report.segments_deleted,
                outcome
                    .survey
                    .plan
                    .horizon
                    .map_or_else(|| "-".into(), |h| h.to_string()),
                report.leftovers_deleted + report.orphan_shards_deleted,
                report.audit_key.as_deref().unwrap_or("-")
            );
        }
        for c in &report.consolidated {
            tracing::info!(
                "retention: consolidated {} into the synthetic full {}",
                c.consolidated_from.join(" + "),
                c.synthetic
            );
        }
        for f in &report.failures {
            tracing::warn!("retention: could not delete {}: {}", f.key, f.error);
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {

    use jiff::Timestamp;
    use tidemark_store::synth;

    use super::*;
    use crate::fence::test_fence;
    use tidemark_store::NoProgress;

    fn keep_last_one(now: Timestamp, execute: bool) -> PassRequest {
        PassRequest {
            policy: tidemark_core::PolicyInput {
                keep_last: Some(1),
                ..Default::default()
            }
            .validate()
            .unwrap(),
            policy_as_given: serde_json::json!({"keepLast": 1}),
            now,
            started_at: now,
            protect: Default::default(),
            restores: Vec::new(),
            execute,
            ignore_malformed: false,
            hooks: None,
            recorded_hooks: RecordedHooks::RunByCaller,
            override_primary_gate: false,
            allow_deletions_before: None,
            compare_with: None,
        }
    }

    /// A pass deletes only under its store's own fence: without one, or with another
    /// store's, it is refused before it reads anything; with it, it deletes what it plans.
    #[tokio::test]
    async fn an_executing_pass_needs_its_stores_fence() {
        let (_dir, store) = tidemark_store::testkit::local_store("c");
        let (_other_dir, other) = tidemark_store::testkit::local_store("d");
        let now = Timestamp::now();
        let (old, new) = synth::older_and_newer(&store, "old", "new", now)
            .await
            .unwrap();
        let request = keep_last_one(now, true);
        let elsewhere = test_fence(&other).await;
        for fence in [None, Some(&elsewhere)] {
            let e = retention_pass(&store, &request, fence, None, &NoProgress)
                .await
                .unwrap_err();
            assert!(
                e.to_string().contains("only under that store's lease"),
                "{e}"
            );
        }
        assert_eq!(synth::metadata_ids(&store).await.unwrap().len(), 2);
        // A plan needs none.
        let plan = retention_pass(&store, &keep_last_one(now, false), None, None, &NoProgress)
            .await
            .unwrap();
        assert!(plan.executed.is_none());
        let fence = test_fence(&store).await;
        let done = retention_pass(&store, &request, Some(&fence), None, &NoProgress)
            .await
            .unwrap();
        assert_eq!(done.executed.unwrap().backups_deleted, vec![old.id]);
        assert_eq!(synth::metadata_ids(&store).await.unwrap(), vec![new.id]);
    }
}
