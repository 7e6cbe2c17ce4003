//! The schedule tick (seed 001): evaluate a ScheduledBackup at `now` with the pure
//! decisions of `tidemark-core`, and record what was decided where the schedule's status
//! lives — `_state/run.json` in the store under `tidemark run`, the ScheduledBackup's
//! status in the operator ([`ScheduleState`]).
//!
//! A slot is recorded before its backup starts, together with the attempt about to start,
//! in one write that is known to have happened: a crash during the backup neither repeats
//! the slot nor loses the attempt, and a write that failed does not advance the schedule.

use async_trait::async_trait;
use jiff::Timestamp;
use tidemark_core::schedule::{Child, Decision, ScheduleSpec, ScheduleStatus, evaluate};

use crate::error::EngineError;

/// An attempt a tick starts: what the journal records of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub backup_name: String,
    pub backup_id: String,
    pub started_at: Timestamp,
    pub immediate: bool,
}

/// Where a schedule's status (and the attempt it runs) lives.
#[async_trait]
pub trait ScheduleState: Send + Sync {
    /// The schedule's status as last recorded (default when never evaluated).
    async fn status(&self, schedule: &str) -> ScheduleStatus;

    /// Records `status` and, when a backup is about to start, the attempt — in one write.
    ///
    /// # Errors
    /// The write is not known to have happened; the status is then as it was.
    async fn record(
        &self,
        schedule: &str,
        status: &ScheduleStatus,
        starting: Option<&Started>,
    ) -> Result<(), EngineError>;

    /// The attempt the schedule ran has ended (committed, or recorded as failed).
    ///
    /// # Errors
    /// The write failed; the attempt stays recorded as running until a later write.
    async fn ended(&self, schedule: &str) -> Result<(), EngineError>;
}

/// What one evaluation decided, once recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tick {
    /// Take this backup now (its slot and attempt are recorded).
    Start { slot: Timestamp, attempt: Started },
    /// The slot's backup exists and is this schedule's.
    Adopted { name: String, slot: Timestamp },
    /// The slot's name is taken by a backup that is not this schedule's: skipped.
    Skipped { name: String, slot: Timestamp },
    /// Nothing to do now (a backup of this schedule runs, it is suspended, or no slot is
    /// due).
    Nothing,
}

/// Evaluates `spec` at `now` against its `children` and records the outcome in `state`.
/// `new_id` names the attempt a new slot starts (a backup-id).
///
/// # Errors
/// The outcome could not be recorded: nothing starts, and the next tick decides again.
#[tracing::instrument(skip_all, fields(schedule = %spec.name, now = %now))]
pub async fn tick(
    spec: &ScheduleSpec,
    children: &[Child],
    state: &dyn ScheduleState,
    now: Timestamp,
    new_id: impl FnOnce(Timestamp) -> String,
) -> Result<Tick, EngineError> {
    let status = state.status(&spec.name).await;
    let eval = evaluate(spec, &status, children, now);
    match eval.decision {
        Decision::Create {
            name,
            slot,
            immediate,
        } => {
            let attempt = Started {
                backup_id: new_id(now),
                backup_name: name,
                started_at: now,
                immediate,
            };
            state
                .record(&spec.name, &eval.status, Some(&attempt))
                .await?;
            Ok(Tick::Start { slot, attempt })
        }
        decision => {
            state.record(&spec.name, &eval.status, None).await?;
            Ok(match decision {
                Decision::Adopt { name, slot } => Tick::Adopted { name, slot },
                Decision::SkipCollision { name, slot } => Tick::Skipped { name, slot },
                Decision::Create { .. }
                | Decision::Wait { .. }
                | Decision::Suspended
                | Decision::Idle => Tick::Nothing,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;

    use super::*;
    use tidemark_core::schedule::Cron;

    /// Status in memory; a write can be made to fail.
    #[derive(Default)]
    struct Memory {
        status: Mutex<ScheduleStatus>,
        running: Mutex<Option<Started>>,
        fail: Mutex<bool>,
    }

    #[async_trait]
    impl ScheduleState for Memory {
        async fn status(&self, _: &str) -> ScheduleStatus {
            self.status.lock().unwrap().clone()
        }
        async fn record(
            &self,
            _: &str,
            status: &ScheduleStatus,
            starting: Option<&Started>,
        ) -> Result<(), EngineError> {
            if *self.fail.lock().unwrap() {
                return Err(EngineError::Internal("the write failed".into()));
            }
            *self.status.lock().unwrap() = status.clone();
            if let Some(s) = starting {
                *self.running.lock().unwrap() = Some(s.clone());
            }
            Ok(())
        }
        async fn ended(&self, _: &str) -> Result<(), EngineError> {
            *self.running.lock().unwrap() = None;
            Ok(())
        }
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn a_slot_is_taken_once_and_only_after_it_is_recorded() {
        let spec = ScheduleSpec {
            name: "daily".into(),
            cron: "0 0 2 * * *".parse::<Cron>().unwrap(),
            time_zone: jiff::tz::TimeZone::UTC,
            immediate: false,
            suspend: false,
            created_at: ts("2026-11-20T00:00:00Z"),
        };
        let state = Memory::default();
        let at = ts("2026-11-20T02:00:01Z");
        // The write fails: nothing starts, and the slot is still owed.
        *state.fail.lock().unwrap() = true;
        assert!(
            tick(&spec, &[], &state, at, |_| "id-1".into())
                .await
                .is_err()
        );
        assert_eq!(state.status(&spec.name).await, ScheduleStatus::default());
        *state.fail.lock().unwrap() = false;
        let t = tick(&spec, &[], &state, at, |_| "id-2".into())
            .await
            .unwrap();
        let Tick::Start { slot, attempt } = t else {
            panic!("{t:?}")
        };
        assert_eq!(slot, ts("2026-11-20T02:00:00Z"));
        assert_eq!(attempt.backup_name, "daily-20261120020000");
        assert_eq!(state.running.lock().unwrap().as_ref(), Some(&attempt));
        // The slot is recorded: a second tick does not take it again.
        let again = tick(&spec, &[], &state, at, |_| "id-3".into())
            .await
            .unwrap();
        assert_eq!(again, Tick::Nothing);
    }
}
