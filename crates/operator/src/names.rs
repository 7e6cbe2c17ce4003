//! The names, labels and annotations the operator derives and reads: how a Backup's
//! attempt is named in the store, which labels mark what the operator made, and how a
//! policy's selector becomes a label query.

use jiff::Timestamp;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::Backup;
use tidemark_api::schedule::SCHEDULED_BACKUP_LABEL;

use crate::error::Error;

/// The label on everything the operator creates (its watches select by it).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "tidemark");

/// The annotation that puts a Backup on hold.
pub const PROTECT_ANNOTATION: &str = "tidemark.io/protect";
pub use tidemark_api::policy::ACKNOWLEDGE_BRANCHES_ANNOTATION;

/// The default role label on database pods: `primary`, or anything else for a standby.
pub const DEFAULT_ROLE_LABEL: &str = "tidemark.io/role";

/// Set on a Backup its `ttl` expired (the time it did), just before it is deleted: its
/// data then goes with reason `ttlExpired`, whatever `deletionPolicy` says.
pub const EXPIRED_ANNOTATION: &str = "tidemark.io/expired";

/// The label every Job of a Backup carries: its uid (a name may be longer than a label
/// value allows).
pub const BACKUP_UID_LABEL: &str = "tidemark.io/backup-uid";

/// The first 8 hex digits of an object's uid (`00000000` before it has one): short,
/// stable names for what the operator creates for it.
pub fn short_uid<K: Resource>(o: &K) -> String {
    let uid: String = o
        .meta()
        .uid
        .as_deref()
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_hexdigit)
        .map(|c| c.to_ascii_lowercase())
        .take(8)
        .collect();
    format!("{uid:0<8}")
}

/// The backup-id: the Backup's creation time and its uid, so every reconcile of one Backup
/// names the same attempt.
pub fn backup_id(b: &Backup) -> String {
    let at = b
        .meta()
        .creation_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    format!("{}-{}", at.strftime("%Y%m%dT%H%M%SZ"), short_uid(b))
}

/// The backup name in the store: its schedule's name for a scheduled Backup (so one
/// schedule's backups share a directory), else the Backup's own name.
pub fn store_name(b: &Backup) -> String {
    b.labels()
        .get(SCHEDULED_BACKUP_LABEL)
        .cloned()
        .unwrap_or_else(|| b.name_any())
}

/// A label selector as a label query (`k=v,k in (a,b),!k`).
///
/// # Errors
/// An unknown operator, or a selector that selects nothing.
pub fn selector(
    s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Result<String, Error> {
    let mut parts: Vec<String> = s
        .match_labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in s.match_expressions.clone().unwrap_or_default() {
        let values = e.values.unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            other => {
                return Err(Error::Invalid(format!(
                    "spec.source.selector: unknown operator {other:?}; expected In, NotIn, Exists or DoesNotExist"
                )));
            }
        });
    }
    if parts.is_empty() {
        return Err(Error::Invalid(
            "spec.source.selector selects nothing; give matchLabels of the database pods".into(),
        ));
    }
    Ok(parts.join(","))
}

/// The labels a backup records in its `metadata.json`: its Backup object's own (so that
/// what selects the object — a DeleteHook — can be known from the store once the object
/// is gone), and `tidemark.io/backup` naming the object.
pub fn stored_labels(backup: &Backup) -> std::collections::BTreeMap<String, String> {
    let mut labels: std::collections::BTreeMap<String, String> = backup
        .labels()
        .iter()
        .filter(|(k, _)| k.as_str() != DATA_VOLUME_LABEL)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(BACKUP_LABEL.to_owned(), backup.name_any());
    labels
}

/// The label every exec backup records in its `metadata.json`, like a Job's.
pub const BACKUP_LABEL: &str = "tidemark.io/backup";

/// The label recording which data directory a physical backup was taken from.
pub const DATA_VOLUME_LABEL: &str = "tidemark.io/data-volume";
/// On a backup Job: which pod it backs up and why that one (a standby passed over), so the
/// Backup's status says it even when the Job is found by a later reconcile.
pub const BACKS_UP_ANNOTATION: &str = "tidemark.io/backs-up";

/// The slot in a deterministic name `<schedule>-<YYYYMMDDHHMMSS>` (UTC).
pub(crate) fn slot_of(name: &str, schedule: &str) -> Option<Timestamp> {
    let stamp = name.strip_prefix(schedule)?.strip_prefix('-')?;
    if stamp.len() != 14 || !stamp.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    jiff::civil::DateTime::strptime("%Y%m%d%H%M%S", stamp)
        .ok()?
        .to_zoned(jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

/// The first `max` characters of `name`, without a trailing `-` or `.`: the start of an
/// object name made from it (a Job's, a Deployment's), so what follows always joins on a
/// valid character.
pub(crate) fn prefix(name: &str, max: usize) -> String {
    let mut base: String = name.chars().take(max).collect();
    while base.ends_with('-') || base.ends_with('.') {
        base.pop();
    }
    base
}

/// 16 hex digits of a stable digest of `text` (FNV-1a, 64 bits): the same name for the
/// same input across restarts (a stored backup's hook Job, a copy's restore-test Job), and
/// no two inputs of one owner on one name.
pub(crate) fn digest16(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}
