//! What the archive records of its timelines and of each segment's GTIDs: plain records,
//! below the inventory that holds them and the timeline logic that reads them.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::gtid::{GtidPos, GtidRun, end_of};

/// What a segment holds, by GTID: who wrote the file and which transactions it carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentGtids {
    /// The server that wrote the file (its format description's server id): the origin.
    pub server_id: u32,
    /// The position at the file's start (its `Gtid_list` event).
    pub start: GtidPos,
    /// Its transactions, in order. Empty: none (a file holding no transaction).
    pub runs: Vec<GtidRun>,
}

impl SegmentGtids {
    /// The position at the file's end.
    pub fn end(&self) -> GtidPos {
        end_of(&self.start, &self.runs)
    }
}

/// Where a timeline leaves its parent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Switch {
    /// The last transaction of each domain that the parent's archived history and this
    /// timeline share: replay takes the parent's events up to it and this timeline's after.
    pub gtid: GtidPos,
    /// When that transaction was written: on the main line, the parent's history ends there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Timestamp>,
    /// The parent's segment holding it (its last archived one, when the parent's archive
    /// ends before the histories part).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_sequence: Option<u64>,
    /// Transactions neither the parent's archive nor this timeline's first segment holds:
    /// a gap in the recovery window at the switch. Empty: the histories join.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<GtidRun>,
    /// The new server's history shares no proven transaction with the parent's (a binlog
    /// that started over, or a server that parted before its first archived file): the
    /// timelines do not join, a gap in the recovery window at the switch.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unrelated: bool,
}

/// One timeline, as the archive records it (`_index.json`'s `timelines`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeline {
    pub id: u32,
    /// The server that wrote it; unknown for a timeline 0 archived before timelines existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<u32>,
    /// The timeline it continues; none for the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<u32>,
    /// Its first archived segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_sequence: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<Switch>,
    /// When the archiver started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Timestamp>,
}

/// The first timeline of an archive that records none.
pub const LEGACY: Timeline = Timeline {
    id: 0,
    server_id: None,
    parent: None,
    first_sequence: None,
    switch: None,
    created_at: None,
};

impl Timeline {
    /// The first timeline of an archive written before timelines were recorded.
    pub fn legacy() -> Self {
        LEGACY
    }
}
