//! The on-store formats of DESIGN.md §3: `metadata.json`, `_index.json` and audit records.
//! All camelCase and versioned. Unknown fields are preserved on rewrite, and a file with a
//! newer `formatVersion` is never deleted by this version.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use tidemark_core::timeline::TIMELINE_STRIDE;

use crate::rawfields::{RawFields, Record};
use tidemark_core::{GtidPos, GtidRun, RetentionDuration, SegmentGtids, Timeline};

/// The format version this Tidemark writes for everything a version-1 reader reads fully:
/// audit records, markers, and backups whose payloads are stored as they came.
pub const FORMAT_VERSION: u32 = 1;

/// The `metadata.json` version of a backup whose payloads are compressed or encrypted
/// (`payload[].compression`, `payload[].encryption`): a version-1 reader would hand their
/// stored bytes to a restore as they are, so it must see a version it does not know — it
/// then refuses to restore the backup and never deletes it (`newerFormat`).
pub const CODED_FORMAT_VERSION: u32 = 2;

/// The newest `metadata.json` version this Tidemark understands.
pub const METADATA_FORMAT_VERSION: u32 = CODED_FORMAT_VERSION;

/// The newest `_index.json` version this Tidemark understands: 2 adds `shards`, 3 segment
/// entries with `compression` or `encryption`, 4 timelines after the first (`timelines`,
/// and entries whose sequence is an archive sequence of a later timeline: a version-3
/// reader would take them for one server's files and replay across a failover). An index
/// is written with the lowest version that describes it (without shards, coded entries or
/// later timelines: still version 1).
pub const INDEX_FORMAT_VERSION: u32 = 4;

/// `type` of a backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BackupType {
    Full,
    Incremental,
}

/// `phase` of a committed backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MetadataPhase {
    Completed,
    Failed,
}

/// One payload object inside the backup directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PayloadObject {
    pub name: String,
    /// The stored object's size and sha256 (compressed, when it is).
    pub size: u64,
    pub sha256: String,
    /// How the object is compressed (`zstd`); absent: stored as it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// The content's size before compression, when compressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_size: Option<u64>,
    /// How the object is encrypted; absent: plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
}

/// How an object is encrypted: the scheme (`age`) and the fingerprints of the recipients
/// it was encrypted to (`tidemark_store::crypt`), never the keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Encryption {
    pub scheme: String,
    pub recipients: Vec<String>,
}

impl PayloadObject {
    /// Whether reading it needs more than this format's first version knew (compression,
    /// encryption): `metadata.json` then says `formatVersion` 2, which a version that
    /// cannot decode such payloads refuses to restore from and never deletes.
    pub fn is_coded(&self) -> bool {
        self.compression.is_some() || self.encryption.is_some()
    }

    /// How the object was written, for reading it.
    pub fn form(&self) -> Form<'_> {
        Form {
            compression: self.compression.as_deref(),
            encryption: self.encryption.as_ref(),
        }
    }
}

impl PayloadObject {
    /// The content's size: before compression, when compressed.
    pub fn content_size(&self) -> u64 {
        self.original_size.unwrap_or(self.size)
    }
}

/// Where the binlog stood at the backup's consistent point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogPosition {
    pub file: String,
    pub position: u64,
    #[serde(default)]
    pub gtid: Option<String>,
}

/// The server a backup was taken on (`metadata.json`'s `server`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceServer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<u32>,
    /// `primary`, or `replica` (it replicated from another server when the backup ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// A replica's lag behind its primary as it reported it when the backup started, in
    /// seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<u64>,
    /// A replica's applied position (`gtid_slave_pos`) at the backup's consistent point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid_slave_pos: Option<String>,
    /// A Galera node (`wsrep_on`): its backup restores, but not with binlog replay past it
    /// (not supported yet).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub galera: bool,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// `metadata.json`: written last, its presence commits the backup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    pub format_version: u32,
    pub backup_id: String,
    pub backup_name: String,
    pub cluster: String,
    #[serde(rename = "type")]
    pub kind: BackupType,
    #[serde(default)]
    pub parent_id: Option<String>,
    pub method: String,
    pub phase: MetadataPhase,
    pub started_at: Timestamp,
    #[serde(default)]
    pub completed_at: Option<Timestamp>,
    #[serde(default)]
    pub payload: Vec<PayloadObject>,
    #[serde(default)]
    pub log_position: Option<LogPosition>,
    /// The server it was taken on, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<SourceServer>,
    #[serde(default)]
    pub immutable_until: Option<Timestamp>,
    #[serde(default)]
    pub ttl: Option<RetentionDuration>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub error: Option<String>,
    /// Fields from newer versions, kept verbatim.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Methods whose chains the consolidation driver can merge into a synthetic full.
pub const CONSOLIDATABLE_METHODS: &[&str] = &["mariabackup"];

/// The `metadata.json` field of a synthetic full: the backup-ids it merged, base first.
pub const CONSOLIDATED_FROM: &str = "consolidatedFrom";

/// `metadata.json`'s field holding a MySQL backup's GTID set (the `gtid_executed` of its
/// data, issue 47): a clone has no binlog file or position at its point.
pub const GTID_EXECUTED_FIELD: &str = "gtidExecuted";

/// What is wrong with a `metadata.json`, beyond JSON syntax.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataProblem {
    #[error("backupId {found:?} does not match its directory {expected:?}")]
    IdMismatch { expected: String, found: String },
    #[error("backupName {found:?} does not match its directory {expected:?}")]
    NameMismatch { expected: String, found: String },
    #[error("type is incremental but parentId is missing")]
    IncrementalWithoutParent,
    #[error("parentId {0:?} is not a backup-id (<YYYYMMDDTHHMMSSZ>-<8 hex>)")]
    BadParent(String),
    #[error("phase is completed but completedAt is missing")]
    CompletedWithoutTime,
    #[error(
        "payload name {0:?} is not one object name (letters, digits, '-', '_', '.'; not metadata.json or a '_' name)"
    )]
    BadPayloadName(String),
    #[error("logPosition.file {0:?} is not a binlog name (<base>.<digits>)")]
    BadLogFile(String),
    #[error("consolidatedFrom names {0:?}, which is not a backup-id")]
    BadConsolidatedFrom(String),
}

/// About the memory a JSON value holds once parsed (its node, its text, its entries).
fn value_footprint(v: &serde_json::Value) -> u64 {
    use serde_json::Value;
    32 + match v {
        Value::String(s) => s.len() as u64,
        Value::Array(a) => a.iter().map(value_footprint).sum(),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| k.len() as u64 + 48 + value_footprint(v))
            .sum(),
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}

impl Metadata {
    /// About how much memory this record holds parsed: its strings, its entries, its
    /// unknown fields — what a pass's budget charges for it (issue 28: `[0,0,…]` among
    /// unknown fields holds 16 times its text, a label `"a":"b"` about 12 times).
    pub fn footprint(&self) -> u64 {
        let strings = [
            &self.backup_id,
            &self.backup_name,
            &self.cluster,
            &self.method,
        ]
        .iter()
        .map(|s| s.len() as u64)
        .sum::<u64>();
        let payload: u64 = self.payload.iter().map(|p| 256 + p.name.len() as u64).sum();
        let labels: u64 = self
            .labels
            .iter()
            .map(|(k, v)| 96 + (k.len() + v.len()) as u64)
            .sum();
        let extra: u64 = self
            .extra
            .iter()
            .map(|(k, v)| k.len() as u64 + 48 + value_footprint(v))
            .sum();
        let rest = self.error.as_ref().map_or(0, |e| e.len() as u64)
            + serde_json::to_string(&self.server).map_or(0, |s| 2 * s.len() as u64)
            + serde_json::to_string(&self.log_position).map_or(0, |s| 2 * s.len() as u64);
        1024 + strings + payload + labels + extra + rest
    }
    /// The GTID position its data holds, when recorded and well-formed (`logPosition.gtid`:
    /// on a replica, the position it had applied).
    /// A replica's applied position (`server.gtidSlavePos`) counts too: with
    /// `log_slave_updates` off, its binlog position says nothing of what it replicated.
    pub fn gtid_position(&self) -> Option<GtidPos> {
        let parse = |t: Option<&str>| {
            t.and_then(|t| GtidPos::parse(t).ok())
                .filter(|p| !p.is_empty())
        };
        let binlog = parse(self.log_position.as_ref().and_then(|l| l.gtid.as_deref()));
        let applied = parse(
            self.server
                .as_ref()
                .and_then(|s| s.gtid_slave_pos.as_deref()),
        );
        match (binlog, applied) {
            (Some(b), Some(a)) => Some(b.merged(&a)),
            (b, a) => b.or(a),
        }
    }

    /// A MySQL backup's GTID set (`gtidExecuted`, issue 47), when recorded and well-formed.
    pub fn gtid_set(&self) -> Option<tidemark_core::gtidset::GtidSet> {
        self.extra
            .get(GTID_EXECUTED_FIELD)?
            .as_str()
            .and_then(|t| tidemark_core::gtidset::GtidSet::parse(t).ok())
    }

    /// Checks the rules JSON syntax cannot express, for the directory `<name>/<id>/`:
    /// every name it holds must be in the layout's grammar before it becomes a key.
    pub fn check(&self, expected_name: &str, expected_id: &str) -> Result<(), MetadataProblem> {
        use tidemark_core::inventory::is_backup_id;
        if self.backup_id != expected_id {
            return Err(MetadataProblem::IdMismatch {
                expected: expected_id.to_owned(),
                found: self.backup_id.clone(),
            });
        }
        if self.backup_name != expected_name {
            return Err(MetadataProblem::NameMismatch {
                expected: expected_name.to_owned(),
                found: self.backup_name.clone(),
            });
        }
        match (&self.kind, &self.parent_id) {
            (BackupType::Incremental, None) => {
                return Err(MetadataProblem::IncrementalWithoutParent);
            }
            (_, Some(p)) if !is_backup_id(p) => return Err(MetadataProblem::BadParent(p.clone())),
            _ => {}
        }
        if self.phase == MetadataPhase::Completed && self.completed_at.is_none() {
            return Err(MetadataProblem::CompletedWithoutTime);
        }
        if let Some(p) = self
            .payload
            .iter()
            .find(|p| !crate::layout::is_payload_name(&p.name))
        {
            return Err(MetadataProblem::BadPayloadName(p.name.clone()));
        }
        if let Some(l) = &self.log_position
            && !crate::layout::is_segment_name(&l.file)
        {
            return Err(MetadataProblem::BadLogFile(l.file.clone()));
        }
        if let Some(bad) = self
            .consolidated_from()
            .into_iter()
            .find(|id| !is_backup_id(id))
        {
            return Err(MetadataProblem::BadConsolidatedFrom(bad));
        }
        Ok(())
    }

    /// The chain a synthetic full merged (`consolidatedFrom`), base first; empty otherwise.
    pub fn consolidated_from(&self) -> Vec<String> {
        self.extra
            .get(CONSOLIDATED_FROM)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }
}

/// `_inflight.json`: an attempt being written. Created (only if absent) before the first
/// byte of the payload, so a second attempt with the same backup-id is refused; rewritten
/// every [`tidemark_core::plan::HEARTBEAT_INTERVAL`]; deleted after the commit. A pass
/// reads its last-modified time, not its body; the body is for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InFlight {
    pub format_version: u32,
    pub backup_id: String,
    pub backup_name: String,
    pub started_at: Timestamp,
    /// The last heartbeat, by the writer's clock.
    pub heartbeat_at: Timestamp,
    /// Who writes it: host name and process id.
    pub writer: String,
}

/// One entry of `_index.json`, as the planner reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexEntry {
    pub name: String,
    pub sequence: u64,
    #[serde(default, deserialize_with = "zero_time_is_unknown")]
    pub first_event_at: Option<Timestamp>,
    /// `null` (or the zero time) means unknown: the segment is never deleted by time.
    #[serde(default, deserialize_with = "zero_time_is_unknown")]
    pub last_event_at: Option<Timestamp>,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub sha256: Option<String>,
    /// How the segment object is compressed (`zstd`); absent: stored as it came. `size`
    /// and `sha256` are the stored object's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// How the segment object is encrypted; absent: plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
    /// The server that wrote the file (its format description's server id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<u32>,
    /// The file's name on that server, where the object's name differs (a timeline after
    /// the first: `mysql-bin.2000000000007` is the server's `mysql-bin.000007`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The GTID position at the file's start (its `Gtid_list` event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid_list: Option<GtidPos>,
    /// The file's transactions as runs (`domain-server-first..last`), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gtids: Vec<GtidRun>,
    /// A MySQL segment's `Previous_gtids`: what its server had executed when it opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_gtids: Option<tidemark_core::gtidset::GtidSet>,
    /// A MySQL segment's transactions, as a GTID set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid_set: Option<tidemark_core::gtidset::GtidSet>,
}

impl IndexEntry {
    /// What the entry says by GTID, when it records it.
    pub fn segment_gtids(&self) -> Option<SegmentGtids> {
        Some(SegmentGtids {
            server_id: self.server_id?,
            start: self.gtid_list.clone()?,
            runs: self.gtids.clone(),
        })
    }

    /// How the segment object was written, for reading it.
    pub fn form(&self) -> Form<'_> {
        Form {
            compression: self.compression.as_deref(),
            encryption: self.encryption.as_ref(),
        }
    }

    /// Whether reading it needs more than the first index versions knew.
    pub fn is_coded(&self) -> bool {
        self.compression.is_some() || self.encryption.is_some()
    }
}

/// `null`, `""` and a zero time (`0001-01-01T00:00:00Z` as Go writes it, or the Unix
/// epoch) all mean "unknown" (seed 000).
fn zero_time_is_unknown<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    match s.as_deref() {
        None | Some("") => Ok(None),
        Some(text) => {
            let t: Timestamp = text.parse().map_err(serde::de::Error::custom)?;
            // No binlog event predates the Unix epoch; anything at or before it is a writer's
            // "zero" (Go's year 1, or epoch 0).
            Ok((t > Timestamp::UNIX_EPOCH).then_some(t))
        }
    }
}

/// `_index.json`, parsed lazily: entries stay raw so a rewrite preserves every field of
/// every kept entry, and parsing a million entries stays cheap.
#[derive(Debug, Clone)]
pub struct IndexFile {
    /// Top-level fields, verbatim (`formatVersion`, `segments`, and any newer ones).
    fields: BTreeMap<String, Box<RawValue>>,
    pub format_version: u32,
    raw_entries: Vec<Box<RawValue>>,
    pub entries: Vec<IndexEntry>,
    /// Summaries of the shard objects holding older entries (`_index.json` only).
    pub shards: Vec<ShardSummary>,
    /// The archive's timelines (`_index.json` only); none recorded: one, timeline 0.
    pub timelines: Vec<Timeline>,
    /// What it held when parsed ([`IndexFile::footprint`]).
    footprint: u64,
}

/// One shard of the segment index, as `_index.json` summarises it: the planner uses the
/// summary instead of reading the shard unless a pass may delete some of its segments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardSummary {
    /// Object key relative to `binlogs/`, e.g. `_index/00000000000000000001-00000000000000004096-1a2b3c4d.json`.
    pub key: String,
    pub first_sequence: u64,
    pub last_sequence: u64,
    pub count: u64,
    pub first_name: String,
    pub last_name: String,
    /// First event of the first segment.
    #[serde(default, deserialize_with = "zero_time_is_unknown")]
    pub first_event_at: Option<Timestamp>,
    /// Last event of the last segment.
    #[serde(default, deserialize_with = "zero_time_is_unknown")]
    pub last_event_at: Option<Timestamp>,
    /// Total bytes of its segments.
    pub size: u64,
    /// Sequences contiguous, every event time known, times growing with the sequence:
    /// only then can the summary stand for the segments.
    pub ordered: bool,
    /// Entries whose last event time is unknown.
    pub unknown_last_event: u64,
    /// Fields of newer versions, kept verbatim.
    #[serde(flatten, skip_deserializing)]
    pub extra: RawFields,
}

impl Record for ShardSummary {
    const KNOWN: &'static [&'static str] = &[
        "key",
        "firstSequence",
        "lastSequence",
        "count",
        "firstName",
        "lastName",
        "firstEventAt",
        "lastEventAt",
        "size",
        "ordered",
        "unknownLastEvent",
    ];
    fn extra_mut(&mut self) -> &mut RawFields {
        &mut self.extra
    }
}

impl ShardSummary {
    /// Summarises `entries`, which must be sorted by sequence and not empty.
    pub fn of(key: String, entries: &[IndexEntry]) -> Option<Self> {
        let (first, last) = (entries.first()?, entries.last()?);
        let ordered = entries.iter().all(|e| {
            e.first_event_at.is_some()
                && e.last_event_at.is_some()
                && e.first_event_at <= e.last_event_at
        }) && entries.windows(2).all(|w| {
            w[1].sequence == w[0].sequence + 1 && w[0].last_event_at <= w[1].first_event_at
        });
        Some(ShardSummary {
            key,
            first_sequence: first.sequence,
            last_sequence: last.sequence,
            count: entries.len() as u64,
            first_name: first.name.clone(),
            last_name: last.name.clone(),
            first_event_at: first.first_event_at,
            last_event_at: last.last_event_at,
            size: entries.iter().map(|e| e.size).sum(),
            ordered,
            unknown_last_event: entries.iter().filter(|e| e.last_event_at.is_none()).count() as u64,
            extra: RawFields::default(),
        })
    }
}

/// Why `_index.json` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error(
        "not a valid segment index: {0}; expected {{\"formatVersion\": 1, \"segments\": [{{\"name\", \"sequence\", \"firstEventAt\", \"lastEventAt\", \"size\", \"sha256\"}}, …]}}"
    )]
    Syntax(#[source] serde_json::Error),
    #[error(
        "`shards` is not a list of shard summaries: {0}; expected [{{\"key\", \"firstSequence\", \"lastSequence\", \"count\", \"firstName\", \"lastName\", \"firstEventAt\", \"lastEventAt\", \"size\", \"ordered\", \"unknownLastEvent\"}}, …]"
    )]
    Shards(#[source] serde_json::Error),
    #[error("shard key {0:?} is not of the form _index/<name>.json")]
    ShardKey(String),
    #[error(
        "`timelines` is not a list of timelines: {0}; expected [{{\"id\", \"serverId\", \"parent\", \"firstSequence\", \"switch\": {{\"gtid\", \"at\", \"parentSequence\", \"missing\"}}}}, …]"
    )]
    Timelines(#[source] serde_json::Error),
    #[error("segments[{position}] is not a valid segment entry: {source}")]
    Entry {
        position: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// The top level of an index file, each field taken from the text once: the lists as
/// their items' text (a list is never held whole beside its items), newer fields verbatim.
#[derive(Default)]
struct TopLevel {
    format_version: Option<u32>,
    segments: Option<Vec<Box<RawValue>>>,
    shards: Option<Vec<Box<RawValue>>>,
    timelines: Option<Vec<Timeline>>,
    fields: BTreeMap<String, Box<RawValue>>,
}

impl TopLevel {
    /// Reads `bytes`; an error names the field it is in ([`IndexError`]'s variants).
    fn read(bytes: &[u8]) -> Result<Self, IndexError> {
        use serde::de::{Error as _, MapAccess, Visitor};
        struct V<'f>(&'f std::cell::Cell<&'static str>);
        impl<'de> Visitor<'de> for V<'_> {
            type Value = TopLevel;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopLevel, A::Error> {
                let mut top = TopLevel::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "formatVersion" => top.format_version = Some(map.next_value()?),
                        "segments" => top.segments = Some(map.next_value()?),
                        "shards" => {
                            self.0.set("shards");
                            top.shards = Some(map.next_value()?);
                            self.0.set("");
                        }
                        "timelines" => {
                            self.0.set("timelines");
                            top.timelines = Some(map.next_value()?);
                            self.0.set("");
                        }
                        _ => {
                            let v = map.next_value()?;
                            top.fields.insert(key, v);
                        }
                    }
                }
                Ok(top)
            }
        }
        let failed = std::cell::Cell::new("");
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let read = serde::Deserializer::deserialize_map(&mut de, V(&failed))
            .and_then(|top| de.end().map(|()| top));
        let top = read.map_err(|e| match failed.get() {
            "shards" => IndexError::Shards(e),
            "timelines" => IndexError::Timelines(e),
            _ => IndexError::Syntax(e),
        })?;
        if top.format_version.is_none() {
            return Err(IndexError::Syntax(serde_json::Error::missing_field(
                "formatVersion",
            )));
        }
        if top.segments.is_none() {
            return Err(IndexError::Syntax(serde_json::Error::missing_field(
                "segments",
            )));
        }
        Ok(top)
    }
}

impl IndexFile {
    pub fn parse(bytes: &[u8]) -> Result<Self, IndexError> {
        let TopLevel {
            format_version,
            segments,
            shards,
            timelines,
            fields,
        } = TopLevel::read(bytes)?;
        let format_version = format_version.unwrap_or_default();
        let raw_entries = segments.unwrap_or_default();
        let entries = raw_entries
            .iter()
            .enumerate()
            .map(|(position, r)| {
                serde_json::from_str(r.get())
                    .map_err(|source| IndexError::Entry { position, source })
            })
            .collect::<Result<Vec<IndexEntry>, _>>()?;
        let shards: Vec<ShardSummary> = shards
            .unwrap_or_default()
            .iter()
            .map(|r| crate::rawfields::parse::<ShardSummary>(r.get().as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(IndexError::Shards)?;
        let timelines = timelines.unwrap_or_default();
        // What it holds parsed: its text once as the entries' and extras' verbatim copies
        // and once in what was read out of it, and each parsed item.
        let footprint = 2 * bytes.len() as u64
            + (entries.len() * std::mem::size_of::<IndexEntry>()) as u64
            + (shards.len() * std::mem::size_of::<ShardSummary>()) as u64
            + (timelines.len() * std::mem::size_of::<Timeline>()) as u64;
        Ok(IndexFile {
            fields,
            format_version,
            raw_entries,
            entries,
            shards,
            timelines,
            footprint,
        })
    }

    /// About how many bytes it holds as parsed (0 for one not read from text): what a
    /// pass's budget is charged for it.
    pub fn footprint(&self) -> u64 {
        self.footprint
    }

    /// A new, empty index.
    pub fn empty() -> Self {
        IndexFile {
            fields: BTreeMap::new(),
            format_version: FORMAT_VERSION,
            raw_entries: Vec::new(),
            entries: Vec::new(),
            shards: Vec::new(),
            timelines: Vec::new(),
            footprint: 0,
        }
    }

    /// Moves out the `n` entries with the lowest sequences (verbatim), as a new file
    /// without top-level extras.
    pub fn take_lowest(&mut self, n: usize) -> IndexFile {
        let mut order: Vec<usize> = (0..self.entries.len()).collect();
        order.sort_by_key(|&i| (self.entries[i].sequence, i));
        let mut taken = vec![false; self.entries.len()];
        for &i in order.iter().take(n) {
            taken[i] = true;
        }
        let mut out = IndexFile::empty();
        let mut keep = Vec::with_capacity(self.entries.len());
        let mut keep_raw = Vec::with_capacity(self.entries.len());
        let mut moved: Vec<(IndexEntry, Box<RawValue>)> = Vec::with_capacity(n);
        for (i, (e, r)) in self
            .entries
            .drain(..)
            .zip(self.raw_entries.drain(..))
            .enumerate()
        {
            if taken[i] {
                moved.push((e, r));
            } else {
                keep.push(e);
                keep_raw.push(r);
            }
        }
        moved.sort_by_key(|(e, _)| e.sequence);
        for (e, r) in moved {
            out.entries.push(e);
            out.raw_entries.push(r);
        }
        self.entries = keep;
        self.raw_entries = keep_raw;
        out
    }

    /// Adds entries (the archiver's job; tests and examples use it too).
    pub fn push(&mut self, entry: IndexEntry) -> Result<(), serde_json::Error> {
        self.raw_entries
            .push(RawValue::from_string(serde_json::to_string(&entry)?)?);
        self.entries.push(entry);
        Ok(())
    }

    /// Removes the entries whose names `drop` says, keeping all other entries verbatim.
    /// Returns how many were removed.
    pub fn remove_where(&mut self, drop: impl Fn(&IndexEntry) -> bool) -> usize {
        let before = self.entries.len();
        let mut keep_raw = Vec::with_capacity(before);
        let mut keep = Vec::with_capacity(before);
        for (e, r) in self.entries.drain(..).zip(self.raw_entries.drain(..)) {
            if !drop(&e) {
                keep.push(e);
                keep_raw.push(r);
            }
        }
        self.entries = keep;
        self.raw_entries = keep_raw;
        before - self.entries.len()
    }

    /// Serialises, preserving unknown top-level fields and every kept entry as it was.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = String::with_capacity(
            64 + self
                .raw_entries
                .iter()
                .map(|r| r.get().len() + 1)
                .sum::<usize>(),
        );
        // Shards are what version 2 adds, coded entries what 3 adds: an index without them
        // stays readable by version 1.
        let mut version = self.format_version;
        if !self.shards.is_empty() {
            version = version.max(2);
        }
        if self.entries.iter().any(IndexEntry::is_coded) {
            version = version.max(3);
        }
        if self.timelines.iter().any(|t| t.id > 0)
            || self.entries.iter().any(|e| e.sequence >= TIMELINE_STRIDE)
        {
            version = version.max(4);
        }
        out.push_str("{\"formatVersion\":");
        out.push_str(&version.to_string());
        out.push_str(",\"segments\":[");
        for (i, r) in self.raw_entries.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(r.get());
        }
        out.push(']');
        if !self.shards.is_empty() {
            out.push_str(",\"shards\":");
            // Plain data with string keys: serialising cannot fail.
            out.push_str(&serde_json::to_string(&self.shards).unwrap_or_else(|_| "[]".into()));
        }
        if !self.timelines.is_empty() {
            out.push_str(",\"timelines\":");
            out.push_str(&serde_json::to_string(&self.timelines).unwrap_or_else(|_| "[]".into()));
        }
        for (k, v) in &self.fields {
            if k == "formatVersion" || k == "segments" || k == "shards" || k == "timelines" {
                continue;
            }
            out.push(',');
            // Keys came from valid JSON, so re-encoding them cannot fail.
            out.push_str(&serde_json::to_string(k).unwrap_or_else(|_| "\"\"".into()));
            out.push(':');
            out.push_str(v.get());
        }
        out.push('}');
        out.into_bytes()
    }
}

/// One backup line of an audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditBackup {
    pub backup_id: String,
    pub backup_name: String,
    pub action: String,
    pub reasons: Vec<String>,
}

/// `_audit/<RFC3339>-<pass-id>.json`: written before a pass deletes anything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    pub format_version: u32,
    pub pass_id: String,
    pub tidemark_version: String,
    pub cluster: String,
    /// Wall-clock time the pass started.
    pub started_at: Timestamp,
    /// The `now` the plan was evaluated at (differs from `startedAt` under `--now`).
    pub evaluated_at: Timestamp,
    pub policy: serde_json::Value,
    pub horizon: Option<Timestamp>,
    pub backups: Vec<AuditBackup>,
    pub segments_deleted: Vec<String>,
    pub index_entries_dropped: Vec<String>,
    /// Debris deleted: unreferenced index shards, abandoned uploads, staging files (keys
    /// relative to the cluster).
    #[serde(default)]
    pub leftovers_deleted: Vec<String>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// How one stored object was written, from its record.
#[derive(Debug, Clone, Copy, Default)]
pub struct Form<'a> {
    pub compression: Option<&'a str>,
    pub encryption: Option<&'a Encryption>,
}

impl Form<'_> {
    /// Stored as it came.
    pub fn plain(&self) -> bool {
        self.compression.is_none() && self.encryption.is_none()
    }
}

/// Whether an index entry is in the grammar: a segment name, and the sequence its name
/// says.
pub fn is_index_entry(e: &IndexEntry) -> bool {
    crate::layout::is_segment_name(&e.name)
        && tidemark_core::inventory::segment_sequence(&e.name) == Some(e.sequence)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const DESIGN_METADATA: &str = r#"{
  "formatVersion": 1,
  "backupId": "20261120T020000Z-3f2a9c1d",
  "backupName": "cluster-sample-daily-20261120020000",
  "cluster": "cluster-sample",
  "type": "incremental",
  "parentId": "20261119T020000Z-8b1e0a77",
  "method": "mariabackup",
  "phase": "completed",
  "startedAt": "2026-11-20T02:00:00Z",
  "completedAt": "2026-11-20T02:04:31Z",
  "payload": [{"name": "backup.xbstream", "size": 73400320, "sha256": "9f86d0"}],
  "logPosition": {"file": "mysql-bin.000042", "position": 1337, "gtid": "0-1-4242"},
  "immutableUntil": null,
  "ttl": null,
  "labels": {"tidemark.io/scheduled-backup": "cluster-sample-daily"},
  "error": null,
  "futureField": {"x": 1}
}"#;

    #[test]
    fn metadata_round_trips_the_design_example_and_keeps_unknown_fields() {
        let m: Metadata = serde_json::from_str(DESIGN_METADATA).unwrap();
        assert_eq!(m.kind, BackupType::Incremental);
        assert_eq!(m.parent_id.as_deref(), Some("20261119T020000Z-8b1e0a77"));
        assert_eq!(m.log_position.as_ref().unwrap().position, 1337);
        m.check(
            "cluster-sample-daily-20261120020000",
            "20261120T020000Z-3f2a9c1d",
        )
        .unwrap();
        let out = serde_json::to_value(&m).unwrap();
        assert_eq!(out["futureField"]["x"], 1);
        assert_eq!(out["immutableUntil"], serde_json::Value::Null);
        assert_eq!(out["type"], "incremental");
    }

    /// Issue 28 review: a pass charges a record by what it holds parsed, not by its text —
    /// unknown fields of `[0,0,…]` and many small labels hold many times their text.
    #[test]
    fn a_records_footprint_counts_what_it_holds_parsed() {
        let plain: Metadata = serde_json::from_str(DESIGN_METADATA).unwrap();
        assert!(plain.footprint() < 4096, "{}", plain.footprint());
        let zeros = vec!["0"; 50_000].join(",");
        let labels: Vec<String> = (0..10_000).map(|i| format!("\"{i}\":\"\"")).collect();
        let text = DESIGN_METADATA
            .replace(
                r#""futureField": {"x": 1}"#,
                &format!(r#""futureField": [{zeros}]"#),
            )
            .replace(
                r#""labels": {"tidemark.io/scheduled-backup": "cluster-sample-daily"}"#,
                &format!(r#""labels": {{{}}}"#, labels.join(",")),
            );
        let m: Metadata = serde_json::from_str(&text).unwrap();
        assert_eq!(m.labels.len(), 10_000);
        assert!(
            m.footprint() > 8 * text.len() as u64,
            "{} bytes of text, footprint {}",
            text.len(),
            m.footprint()
        );
    }

    #[test]
    fn metadata_problems_are_named() {
        let m: Metadata = serde_json::from_str(DESIGN_METADATA).unwrap();
        assert!(matches!(
            m.check(&m.backup_name, "20261120T020000Z-00000000"),
            Err(MetadataProblem::IdMismatch { .. })
        ));
        let mut m2 = m.clone();
        m2.parent_id = None;
        assert_eq!(
            m2.check(&m.backup_name, &m.backup_id),
            Err(MetadataProblem::IncrementalWithoutParent)
        );
        // Names that would become keys or local paths are checked.
        let mut m3 = m.clone();
        m3.payload[0].name = "../../x".into();
        assert!(matches!(
            m3.check(&m.backup_name, &m.backup_id),
            Err(MetadataProblem::BadPayloadName(_))
        ));
        let mut m4 = m.clone();
        m4.log_position.as_mut().unwrap().file = "/etc/passwd.1".into();
        assert!(matches!(
            m4.check(&m.backup_name, &m.backup_id),
            Err(MetadataProblem::BadLogFile(_))
        ));
        assert!(matches!(
            m.check("other", &m.backup_id),
            Err(MetadataProblem::NameMismatch { .. })
        ));
    }

    #[test]
    fn index_keeps_unknown_fields_and_treats_zero_time_as_unknown() {
        let text = r#"{"formatVersion":1,"segments":[
            {"name":"mysql-bin.000041","sequence":41,"firstEventAt":"2026-11-19T23:00:00Z","lastEventAt":"2026-11-20T01:59:58Z","size":1048576,"sha256":"2c26b4","server":"db-0"},
            {"name":"mysql-bin.000042","sequence":42,"firstEventAt":"2026-11-20T01:59:58Z","lastEventAt":"0001-01-01T00:00:00Z","size":5,"sha256":"aa"},
            {"name":"mysql-bin.000043","sequence":43,"firstEventAt":null,"lastEventAt":null,"size":5,"sha256":"bb"}
        ],"writer":"archiver-1"}"#;
        let mut idx = IndexFile::parse(text.as_bytes()).unwrap();
        assert_eq!(idx.entries[1].last_event_at, None);
        assert_eq!(idx.entries[2].last_event_at, None);
        assert!(idx.entries[0].last_event_at.is_some());
        assert_eq!(idx.remove_where(|e| e.sequence == 42), 1);
        let v: serde_json::Value = serde_json::from_slice(&idx.to_bytes()).unwrap();
        assert_eq!(v["writer"], "archiver-1");
        assert_eq!(v["segments"].as_array().unwrap().len(), 2);
        assert_eq!(v["segments"][0]["server"], "db-0");
    }

    #[test]
    fn a_shard_summary_knows_its_fields() {
        let t = "2026-11-20T02:00:00Z".parse().unwrap();
        crate::rawfields::assert_known(&ShardSummary {
            key: "_index/x.json".into(),
            first_sequence: 1,
            last_sequence: 2,
            count: 2,
            first_name: "a".into(),
            last_name: "b".into(),
            first_event_at: Some(t),
            last_event_at: Some(t),
            size: 1,
            ordered: true,
            unknown_last_event: 0,
            extra: RawFields::default(),
        });
    }

    #[test]
    fn shards_make_version_two_and_round_trip() {
        let text = r#"{"formatVersion":1,"segments":[
            {"name":"mysql-bin.000003","sequence":3,"firstEventAt":"2026-11-20T02:00:00Z","lastEventAt":"2026-11-20T03:00:00Z","size":5}
        ]}"#;
        let mut head = IndexFile::parse(text.as_bytes()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&head.to_bytes()).unwrap();
        assert_eq!(v["formatVersion"], 1, "no shards: still version 1");
        let mut shard = IndexFile::parse(text.as_bytes()).unwrap();
        let taken = shard.take_lowest(1);
        assert!(shard.entries.is_empty());
        let mut summary = ShardSummary::of("_index/x.json".into(), &taken.entries).unwrap();
        assert!(summary.ordered);
        summary.extra.push("future", "7").unwrap();
        head.shards.push(summary.clone());
        let bytes = head.to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["formatVersion"], 2);
        assert_eq!(v["shards"][0]["firstName"], "mysql-bin.000003");
        let back = IndexFile::parse(&bytes).unwrap();
        assert_eq!(back.shards, [summary]);
        let e = IndexFile::parse(br#"{"formatVersion":2,"segments":[],"shards":{}}"#).unwrap_err();
        assert!(e.to_string().contains("`shards`"), "{e}");
    }

    #[test]
    fn malformed_index_says_what_is_expected() {
        let e = IndexFile::parse(b"{\"formatVersion\":1}").unwrap_err();
        assert!(e.to_string().contains("missing field `segments`"), "{e}");
        assert!(
            e.to_string().contains("expected {\"formatVersion\": 1"),
            "{e}"
        );
        let e = IndexFile::parse(br#"{"formatVersion":1,"segments":[{"name":"x"}]}"#).unwrap_err();
        assert!(e.to_string().starts_with("segments[0]"), "{e}");
    }
}
