//! Builders shared by the planner's table and property tests.
#![allow(dead_code, clippy::unwrap_used)]

use jiff::{SignedDuration, Timestamp};
use tidemark_core::{Backup, BackupKind, Phase, PolicyInput, Segment};

pub fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// A completed full backup started at `start`, taking five minutes.
pub fn full(id: &str, start: &str) -> Backup {
    let started_at = ts(start);
    Backup::completed_full(
        id,
        format!("b-{id}"),
        started_at,
        started_at + SignedDuration::from_mins(5),
        100,
    )
}

pub fn incr(id: &str, parent: &str, start: &str) -> Backup {
    Backup {
        kind: BackupKind::Incremental(parent.to_owned()),
        ..full(id, start)
    }
}

pub fn failed(mut b: Backup) -> Backup {
    b.phase = Phase::Failed;
    b
}

pub fn segment(seq: u64, first: Timestamp, last: Option<Timestamp>) -> Segment {
    Segment::new(format!("mysql-bin.{seq:06}"), seq, Some(first), last, 1000)
}

pub fn keep_last(n: i64) -> PolicyInput {
    PolicyInput {
        keep_last: Some(n),
        ..Default::default()
    }
}

pub fn window(w: &str) -> PolicyInput {
    PolicyInput {
        window: Some(w.to_owned()),
        ..Default::default()
    }
}
