//! Key layout inside one cluster's prefix (DESIGN.md §3). All keys here are relative to
//! `<path>/<cluster>/`; the [`crate::ClusterStore`] is rooted there, so nothing outside it
//! can be named.
//!
//! # The grammar of names
//! Every name read from the store — a backup name or id, a payload object, a segment, an
//! index shard — becomes a key and sometimes a local path (a restore writes segments into a
//! directory by name). So each is checked here before use: one path segment of letters,
//! digits, `-`, `_` and `.`, not starting with `.`, at most [`MAX_NAME`] bytes. A name
//! outside the grammar is reported and left alone, never followed.

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
/// An attempt's in-flight marker: written before its first byte, rewritten while it runs
/// (its last-modified time is the heartbeat), deleted after the commit.
pub const MARKER: &str = "_inflight.json";
/// A committed backup whose deletion was asked for while a recovery depended on it (its
/// Backup object deleted with `deletionPolicy: Delete`): written once, never changed, and
/// deleted with the backup. Retention passes remove (or consolidate) the backup when safe.
pub const DELETION_MARK: &str = "_deletion-requested.json";
/// Left in a backup's directory once a retention pass read the backup (and its chain) back
/// whole (`retention.requireVerified`); it goes with the backup.
pub const VERIFIED: &str = "_verified.json";
/// Left in the directory of the backup a restore test restored (`tidemark restore-test`,
/// a policy's `restoreTest`): the newest outcome; it goes with the backup.
pub const RESTORE_TEST: &str = "_restoretest.json";
/// Longest name Tidemark writes or accepts in one path segment: Kubernetes object names are
/// at most 253 bytes, and file systems refuse more than 255.
pub const MAX_NAME: usize = 253;

/// Whether `name` is one safe path segment: letters, digits, `-`, `_`, `.`; not empty,
/// not starting with `.`, at most [`MAX_NAME`] bytes. Nothing in it can climb out of a
/// directory or name another one.
pub fn is_safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A backup name (the `<backup-name>` directory): a safe name not starting with `_`
/// (reserved for `_audit`, `_state`) and not `binlogs`.
pub fn is_backup_name(name: &str) -> bool {
    is_safe_name(name) && !name.starts_with('_') && name != BINLOGS
}

/// A payload object's name inside a backup directory, as `metadata.json` records it: a
/// safe name that is neither `metadata.json` nor a reserved `_` name.
pub fn is_payload_name(name: &str) -> bool {
    is_safe_name(name) && !name.starts_with('_') && name != METADATA
}

/// A binlog segment name, `<base>.<digits>` (e.g. `mysql-bin.000042`), as a safe name.
pub fn is_segment_name(name: &str) -> bool {
    is_safe_name(name)
        && !name.starts_with('_')
        && tidemark_core::inventory::segment_sequence(name).is_some()
}

pub fn marker_key(name: &str, id: &str) -> Path {
    Path::from_iter([name, id, MARKER])
}

pub fn payload_key(name: &str, id: &str, object: &str) -> Path {
    Path::from_iter([name, id, object])
}

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

/// An audit record's name exactly as [`audit_key`] writes it: `<YYYY-MM-DDTHH:MM:SSZ>-<8
/// hex>.json` (no other spelling of a time, so names sort by time).
pub fn is_audit_name(name: &str) -> bool {
    audit_time(name).is_some()
}

/// The time in an audit record's name (see [`is_audit_name`]).
pub fn audit_time(name: &str) -> Option<jiff::Timestamp> {
    let (time, id) = name.strip_suffix(".json")?.rsplit_once('-')?;
    let t = time.parse::<jiff::Timestamp>().ok()?;
    (id.len() == 8
        && id.bytes().all(|b| b.is_ascii_hexdigit())
        && t.subsec_nanosecond() == 0
        && t.to_string() == time)
        .then_some(t)
}

/// The directory (inside [`STATE`]) of expiry records: a locked chain whose lock ended,
/// that a pass recorded as expired and left to the bucket's lifecycle rule (seed 002).
pub const EXPIRED: &str = "expired";

/// `_state/expired/<name>/<id>.json`: the record that the backup `name/id` expired. Its
/// existence is the record (a load reads no body); the body says when and by which pass,
/// for people.
pub fn expiry_key(name: &str, id: &str) -> Path {
    Path::from_iter([STATE, EXPIRED, name, &format!("{id}.json")])
}

/// The backup an expiry record names, when `key` is one (names checked as everywhere).
pub fn expiry_of(key: &str) -> Option<(&str, &str)> {
    let parts: Vec<&str> = key.split('/').collect();
    match parts.as_slice() {
        [STATE, EXPIRED, name, file] => {
            let id = file.strip_suffix(".json")?;
            (is_backup_name(name) && is_backup_id(id)).then_some((*name, id))
        }
        _ => None,
    }
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
    /// `<name>/<id>/_inflight.json`
    Marker { name: &'a str, id: &'a str },
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
        [BINLOGS, seg] if is_segment_name(seg) => KeyKind::Segment { name: seg },
        [AUDIT, file] if is_audit_name(file) => KeyKind::Audit,
        [STATE, ..] => KeyKind::State,
        [BINLOGS, ..] | [AUDIT, ..] => KeyKind::Foreign,
        [name, id, file] if is_backup_name(name) && is_backup_id(id) => match *file {
            METADATA => KeyKind::Metadata { name, id },
            MARKER => KeyKind::Marker { name, id },
            // Any other object in the directory belongs to the attempt (a payload, or a
            // leftover of it), whatever its name: it goes with the backup.
            _ => KeyKind::Payload { name, id },
        },
        _ => KeyKind::Foreign,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_records_name_one_backup_or_none() {
        let id = "20261120T020000Z-3f2a9c1d";
        let key = expiry_key("daily", id);
        assert_eq!(key.as_ref(), format!("_state/expired/daily/{id}.json"));
        assert_eq!(classify(key.as_ref()), KeyKind::State);
        assert_eq!(expiry_of(key.as_ref()), Some(("daily", id)));
        for not in [
            format!("_state/expired/daily/{id}"),
            format!("_state/expired/_audit/{id}.json"),
            "_state/expired/daily/not-an-id.json".to_owned(),
            format!("_state/expired/daily/x/{id}.json"),
            format!("_state/owner/daily/{id}.json"),
        ] {
            assert_eq!(expiry_of(&not), None, "{not}");
        }
    }

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
            classify(&format!("daily/{id}/_inflight.json")),
            KeyKind::Marker { name: "daily", id }
        );
        assert_eq!(classify("binlogs/.hidden.000001"), KeyKind::Foreign);
        assert_eq!(
            classify(&format!("{}/{id}/x", "n".repeat(300))),
            KeyKind::Foreign
        );
        assert_eq!(
            classify("_audit/2026-11-20T02:00:00Z-5b0e33c1.json"),
            KeyKind::Audit
        );
        assert_eq!(classify("_audit/notes.txt"), KeyKind::Foreign);
        assert_eq!(
            classify("_audit/2026-11-20T02:00:00Z-ab.json"),
            KeyKind::Foreign
        );
    }
}

#[cfg(test)]
mod grammar {
    use super::*;

    #[test]
    fn names_that_could_escape_are_refused() {
        for bad in [
            "", ".", "..", "../x", "a/b", "/abs", "a\\b", ".hidden", "a b", "a\0b", "é",
        ] {
            assert!(!is_safe_name(bad), "{bad:?}");
        }
        assert!(!is_safe_name(&"a".repeat(MAX_NAME + 1)));
        assert!(is_safe_name(&"a".repeat(MAX_NAME)));
        assert!(is_segment_name("mysql-bin.000042"));
        assert!(!is_segment_name("../../../../tmp/victim.000001"));
        assert!(!is_segment_name("mysql-bin"));
        assert!(is_payload_name("backup.xbstream"));
        assert!(!is_payload_name("metadata.json"));
        assert!(!is_payload_name("_inflight.json"));
        assert!(!is_backup_name("binlogs"));
        assert!(!is_backup_name("_state"));
    }
}
