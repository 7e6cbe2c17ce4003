//! Tidemark's use cases, shared by the command line and the operator:
//!
//! - [`pass`]: the retention pass — observe, plan, the work the plan asks for, execute,
//!   report — one path for `tidemark gc`, `tidemark run` and the operator;
//! - [`parent`]: what the next backup builds on, for every edge;
//! - [`archive`]: a binlog archive pass and the archive's lag;
//! - [`attempt`]: the backup attempt — marker, upload, commit, or a failed record — and
//!   where it runs ([`attempt::BackupRunner`]: a local process now, a Job in the operator);
//! - [`schedule`]: the schedule tick, and where a schedule's status lives
//!   ([`schedule::ScheduleState`]: `_state/` in the store now, the resource's status next);
//! - [`clock`]: where `now` comes from;
//! - [`fence`]: the store's lease, held by every deleter and stopping its work when lost;
//! - [`standalone`]: `tidemark run`, the schedules, binlog archiving and retention of a
//!   configuration as independent tasks, with their state in the store;
//! - [`restore`]: a restore and a restore test, with the database as a port
//!   ([`restore::Database`]);
//! - [`verify`]: every backup and segment read back and checked, and the window that
//!   follows (`tidemark verify`, a pass's `requireVerified`);
//! - [`error`]: one error type, whose [`error::Class`] the CLI maps to exit codes and the
//!   operator to requeue policies.

pub mod archive;
pub mod attempt;
pub mod clock;
pub mod copy;
pub mod delete;
pub mod error;
pub mod fence;
pub mod hooks;
pub mod parent;
pub mod pass;
pub mod redact;
pub mod restore;
pub mod schedule;
pub mod standalone;
pub mod verify;

pub use attempt::{
    AttemptFailure, BackupRequest, BackupRunner, LocalProcess, Source, take_backup_from,
};
pub use clock::{Clock, SystemClock};
pub use error::{Class, EngineError};
pub use fence::{Fence, FenceOptions, Wait};
pub use pass::{
    Consolidator, DeleteHooks, LocalConsolidator, PassOutcome, PassRequest, RecordedHooks,
    retention_pass, unattended_pass,
};

/// The use cases run as tasks (here and in the operator's controllers), so their futures
/// must be `Send` for every lifetime of what they borrow — which a stream of closures over
/// borrowed items quietly breaks. This fails to compile if one of them stops being so.
#[cfg(test)]
#[allow(dead_code)]
mod send_check {
    use tidemark_store::{ClusterStore, NoProgress};

    fn task<F: std::future::Future + Send + 'static>(_: F) {}

    fn check(
        store: ClusterStore,
        binlog_index: std::path::PathBuf,
        request: crate::PassRequest,
        backup: crate::BackupRequest,
    ) {
        let s = store.clone();
        task(async move {
            crate::retention_pass(&s, &request, None, None, &NoProgress)
                .await
                .is_ok()
        });
        let s = store.clone();
        task(async move {
            tidemark_mariadb::archive::archive_pass(&s, &binlog_index, &NoProgress)
                .await
                .is_ok()
        });
        let (s, c) = (store.clone(), store.clone());
        task(async move {
            let request = crate::copy::CopyRequest {
                name: "dr".into(),
                policy: tidemark_core::PolicyInput::default()
                    .validate()
                    .unwrap_or_else(|_| unreachable!()),
                now: jiff::Timestamp::now(),
                bandwidth: None,
                dry_run: true,
            };
            crate::copy::copy_pass(&s, &c, &request, None, &NoProgress)
                .await
                .is_ok()
        });
        task(async move {
            crate::attempt::take_backup(&store, &backup, &NoProgress)
                .await
                .is_ok()
        });
    }
}
