//! Object lock dates of the backups the operator takes (issue 19 §3, seed 002).

use kube::api::Api;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::{Backup, BackupPolicy};

use crate::context::Context;
use crate::error::Error;

/// The lock date a backup of `policy` asks for under its object lock (seed 002): a full of
/// a schedule with incrementals is locked until its chain's last increment's slot (the
/// schedule's `maxIncrementsPerFull`-th slot after this Backup's) plus the period; any
/// other backup its start plus the period. An increment takes its chain's date where that
/// is later, and older backups of a chain are locked longer where a newer one outlives
/// them (both in the store: `transfer::chain_lock`), so a schedule that cannot be read
/// here (deleted meanwhile) shortens nothing that matters.
///
/// # Errors
/// The policy's object lock is invalid; the API server failed.
pub(crate) async fn lock_until(
    ctx: &Context,
    backup: &Backup,
    policy: &BackupPolicy,
    full: bool,
    started: jiff::Timestamp,
) -> Result<Option<jiff::Timestamp>, Error> {
    let Some(lock) = ctx.tenancy.object_lock(policy)? else {
        return Ok(None);
    };
    let max = backup
        .spec
        .incremental
        .as_ref()
        .and_then(|i| i.max_increments_per_full);
    let schedule = backup
        .labels()
        .get(tidemark_api::schedule::SCHEDULED_BACKUP_LABEL);
    let chain_end = match (full, max, schedule) {
        (true, Some(max), Some(schedule)) => {
            let ns = backup.namespace().unwrap_or_default();
            let api: Api<tidemark_api::crd::ScheduledBackup> =
                Api::namespaced(ctx.client.clone(), &ns);
            let slot = backup
                .meta()
                .creation_timestamp
                .as_ref()
                .map_or(started, |t| t.0);
            api.get_opt(schedule).await?.and_then(|sb| {
                let spec = sb
                    .spec
                    .schedule_spec(schedule, policy.spec.time_zone.as_deref(), slot)
                    .ok()?;
                tidemark_core::lock::chain_end(&spec.cron, &spec.time_zone, slot, max)
            })
        }
        _ => None,
    };
    // An increment counts from its slot (its creation), as its chain's date does.
    let from = if full {
        started
    } else {
        backup
            .meta()
            .creation_timestamp
            .as_ref()
            .map_or(started, |t| t.0)
    };
    // However long the chain, no later than the administrator allows from now.
    Ok(Some(ctx.tenancy.bound_lock_date(
        lock.until(from, chain_end),
        ctx.clock.now(),
    )))
}
