//! Key layout inside one cluster's prefix (DESIGN.md §3). All keys here are relative to
//! `<path>/<cluster>/`; the [`crate::ClusterStore`] is rooted there, so nothing outside it
//! can be named.

use object_store::path::Path;
use tidemark_core::inventory::is_backup_id;

/// Directory of archived binlog segments.
pub const BINLOGS: &str = "binlogs";
/// The segment index inside [`BINLOGS`].
pub const INDEX: &str = "_index.json";
/// Directory of index shards inside [`BINLOGS`].
pub const INDEX_SHARDS: &str = "_index";
/// Audit records, one per deleting pass.
pub const AUDIT: &str = "_audit";
/// Durable state of standalone mode (reserved).
pub const STATE: &str = "_state";
/// The commit marker of a backup.
pub const METADATA: &str = "metadata.json";

pub fn metadata_key(name: &str, id: &str) -> Path {
    Path::from_iter([name, id, METADATA])
}

pub fn segment_key(name: &str) -> Path {
    Path::from_iter([BINLOGS, name])
}

pub fn index_key() -> Path {
    Path::from_iter([BINLOGS, INDEX])
}

/// The key of an index shard named in `_index.json` (relative to `binlogs/`, of the form
/// `_index/<file>.json`); `None` for anything else, which makes the index malformed.
pub fn shard_key(relative: &str) -> Option<Path> {
    let file = relative.strip_prefix("_index/")?;
    let ok = file.ends_with(".json")
        && !file.contains('/')
        && !file.starts_with('.')
        && file
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    ok.then(|| Path::from_iter([BINLOGS, INDEX_SHARDS, file]))
}

/// A fresh shard name (relative to `binlogs/`) for entries `first..=last`: sortable by
/// range, unique per write, so a shard object is never overwritten.
pub fn new_shard_name(first: u64, last: u64) -> String {
    format!(
        "{INDEX_SHARDS}/{first:020}-{last:020}-{:08x}.json",
        rand::random::<u32>()
    )
}

pub fn index_shards_prefix() -> Path {
    Path::from_iter([BINLOGS, INDEX_SHARDS])
}

pub fn audit_key(at: jiff::Timestamp, pass_id: &str) -> Path {
    // Whole seconds keep keys short and sortable; the pass id makes them unique.
    let stamp = jiff::Timestamp::from_second(at.as_second()).unwrap_or(at);
    Path::from_iter([AUDIT, &format!("{stamp}-{pass_id}.json")])
}

/// What a key (relative to the cluster prefix) is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind<'a> {
    /// `<name>/<id>/metadata.json`
    Metadata { name: &'a str, id: &'a str },
    /// `<name>/<id>/<object>`: a payload object (or leftover) of that attempt.
    Payload { name: &'a str, id: &'a str },
    /// `binlogs/<segment>`
    Segment { name: &'a str },
    /// `binlogs/_index.json`
    Index,
    /// `binlogs/_index/<shard>.json`
    IndexShard,
    /// `_audit/<record>`
    Audit,
    /// `_state/...`
    State,
    /// Anything else: never deleted, reported.
    Foreign,
}

/// Classifies a key relative to the cluster prefix.
pub fn classify(key: &str) -> KeyKind<'_> {
    let parts: Vec<&str> = key.split('/').collect();
    match parts.as_slice() {
        [BINLOGS, INDEX] => KeyKind::Index,
        [BINLOGS, INDEX_SHARDS, file] if shard_key(&format!("{INDEX_SHARDS}/{file}")).is_some() => {
            KeyKind::IndexShard
        }
        [BINLOGS, seg] if tidemark_core::inventory::segment_sequence(seg).is_some() => {
            KeyKind::Segment { name: seg }
        }
        [AUDIT, _] => KeyKind::Audit,
        [STATE, ..] => KeyKind::State,
        [BINLOGS, ..] | [AUDIT, ..] => KeyKind::Foreign,
        [name, id, file] if !name.starts_with('_') && is_backup_id(id) => {
            if *file == METADATA {
                KeyKind::Metadata { name, id }
            } else {
                KeyKind::Payload { name, id }
            }
        }
        _ => KeyKind::Foreign,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_classified() {
        let id = "20261120T020000Z-3f2a9c1d";
        assert_eq!(
            classify(&format!("daily/{id}/metadata.json")),
            KeyKind::Metadata { name: "daily", id }
        );
        assert_eq!(
            classify(&format!("daily/{id}/backup.xbstream")),
            KeyKind::Payload { name: "daily", id }
        );
        assert_eq!(
            classify("binlogs/mysql-bin.000041"),
            KeyKind::Segment {
                name: "mysql-bin.000041"
            }
        );
        assert_eq!(classify("binlogs/_index.json"), KeyKind::Index);
        let shard = new_shard_name(1, 4096);
        assert_eq!(classify(&format!("binlogs/{shard}")), KeyKind::IndexShard);
        assert_eq!(
            shard_key(&shard).unwrap().as_ref(),
            format!("binlogs/{shard}")
        );
        assert_eq!(shard_key("../x.json"), None);
        assert_eq!(shard_key("_index/a/b.json"), None);
        assert_eq!(classify("binlogs/_index/notes.txt"), KeyKind::Foreign);
        assert_eq!(classify("binlogs/notes.txt"), KeyKind::Foreign);
        assert_eq!(classify("daily/latest/backup.xbstream"), KeyKind::Foreign);
        assert_eq!(classify(&format!("daily/{id}/sub/x")), KeyKind::Foreign);
        assert_eq!(classify("README"), KeyKind::Foreign);
        assert_eq!(classify(&format!("_other/{id}/x")), KeyKind::Foreign);
        assert_eq!(
            classify("_audit/2026-11-20T02:00:00Z-ab.json"),
            KeyKind::Audit
        );
    }
}
