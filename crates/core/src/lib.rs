//! Tidemark's pure domain: retention durations and policy, the inventory model, the
//! restore model and the retention planner. No I/O, no clock: `now` is always passed in.

pub mod compression;
pub mod copies;
pub mod coverage;
pub mod duration;
pub mod gtid;
pub mod gtidset;
pub mod guard;
pub mod inventory;
pub mod lock;
pub mod next;
pub mod plan;
pub mod policy;
pub mod preview;
pub mod rate;
pub mod reason;
pub mod records;
pub mod restore;
pub mod retry;
pub mod schedule;
pub mod simulate;
pub mod timeline;

pub use coverage::{Coverage, Interval, Replay};
pub use duration::{
    Ambiguous as AmbiguousDuration, DURATION_FORM, DurationError, RetentionDuration, saturating_add,
};
pub use gtid::{Gtid, GtidPos, GtidRun};
pub use inventory::{
    Backup, BackupId, BackupKind, Inventory, Leftover, LeftoverKind, Phase, RestoreHold, Segment,
};
pub use next::{Candidate, FullBecause, NextBackup, next_backup};
pub use plan::{
    Action, BackupDecision, EntryRef, LeftoverDeletion, LeftoverPlan, LeftoverReason, MergedInto,
    Plan, RecoveryWindow, SegmentDeletion, SegmentPlan, SegmentReason, Standing, chain_of,
    merged_into, plan, point_in_time_start, requested_deletion, standing, standing_at,
    window_after,
};
pub use policy::{Policy, PolicyError, PolicyField, PolicyInput};
pub use reason::{Reason, ReasonKind};
pub use restore::{RestoreChoice, RestoreRefusal, choose_restore, choose_restore_to};
pub use timeline::{History, SegmentGtids, Switch, Timeline};
