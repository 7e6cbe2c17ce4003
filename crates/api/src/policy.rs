//! `BackupPolicy`: one per protected cluster (DESIGN.md §6).

use serde::{Deserialize, Serialize};
use tidemark_core::PolicyInput;

/// Name and labels, as in any Kubernetes object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// A `BackupPolicy` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackupPolicy {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: BackupPolicySpec,
    /// Written by the operator; ignored on input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// What to protect, where the backups live, and how long they are kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackupPolicySpec {
    /// The cluster directory inside the store (`<path>/<cluster>/…`). Defaults to
    /// `metadata.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Where backups are stored. Required when `retention` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_store: Option<ObjectStoreSpec>,
    /// What to keep. Rules are a union: a backup is kept if any rule keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionSpec>,
    /// How often the retention pass runs under `tidemark run`: `<n>s`, `<n>m` (minutes) or
    /// `<n>h`; default `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_interval: Option<String>,
    /// What deleting a Backup object does to its remote data. Default `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<DeletionPolicy>,
    /// IANA time zone for calendar buckets (keepDaily…) and schedules. Default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// Ship the server's binlogs (standalone `tidemark run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binlog_archive: Option<BinlogArchiveSpec>,
}

/// Where the server's binlogs are, and how often to look for closed ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BinlogArchiveSpec {
    /// The server's binlog index file, e.g. `/var/lib/mysql/mysql-bin.index`.
    pub binlog_index: String,
    /// Pause between passes, e.g. `10s`, `1m` (default `10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
}

/// `Retain` keeps remote data when a Backup object is deleted; `Delete` removes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeletionPolicy {
    Retain,
    Delete,
}

/// An object store location: either a full `url` (any scheme Tidemark accepts, such as
/// `file:///var/backups`) or an S3 `bucket` with an optional `path` prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectStoreSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// S3-compatible endpoint, e.g. `http://minio:9000` (plain HTTP is allowed when given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Name of the Secret holding the credentials (operator only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// Path-style requests (the default whenever an endpoint is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_style: Option<bool>,
}

impl ObjectStoreSpec {
    /// The store URL this spec names.
    ///
    /// # Errors
    /// Neither or both of `url` and `bucket` are set.
    pub fn store_url(&self) -> Result<String, PolicyFileError> {
        match (&self.url, &self.bucket) {
            (Some(url), None) => Ok(url.clone()),
            (None, Some(bucket)) => Ok(match self.path.as_deref().map(|p| p.trim_matches('/')) {
                Some(p) if !p.is_empty() => format!("s3://{bucket}/{p}"),
                _ => format!("s3://{bucket}"),
            }),
            _ => Err(PolicyFileError::Invalid {
                field: "spec.objectStore",
                problem: "set exactly one of url (e.g. file:///var/backups) and bucket (with an optional path)".into(),
            }),
        }
    }
}

/// Retention rules (DESIGN.md §5.1). Counts are whole numbers; durations are
/// `<n>d`, `<n>w` or `<n>m` (a month is 30 days).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetentionSpec {
    /// Keep every backup completed within this span of now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// Keep the newest N successful backups (failed ones never count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_daily: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_weekly: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_monthly: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_yearly: Option<i64>,
    /// Delete failed and never-committed attempts older than this.
    #[serde(
        default,
        rename = "failedBackupsTTL",
        skip_serializing_if = "Option::is_none"
    )]
    pub failed_backups_ttl: Option<String>,
    /// Merge old increments into a synthetic full (seed 002).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidate: Option<bool>,
    /// Also keep the newest backup completed before the window, so every instant of the
    /// window stays restorable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cover_window: Option<bool>,
    /// Cap on backups deleted in one pass; 0 = no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_deletions_per_pass: Option<i64>,
}

impl RetentionSpec {
    /// The unvalidated planner input, with the policy's time zone.
    pub fn to_input(&self, time_zone: Option<&str>) -> PolicyInput {
        PolicyInput {
            window: self.window.clone(),
            keep_last: self.keep_last,
            keep_daily: self.keep_daily,
            keep_weekly: self.keep_weekly,
            keep_monthly: self.keep_monthly,
            keep_yearly: self.keep_yearly,
            failed_backups_ttl: self.failed_backups_ttl.clone(),
            cover_window: self.cover_window,
            consolidate: self.consolidate,
            max_deletions_per_pass: self.max_deletions_per_pass,
            time_zone: time_zone.map(str::to_owned),
        }
    }
}

/// Why a policy document was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    #[error("not a BackupPolicy document: {0}")]
    Syntax(#[source] serde_yaml::Error),
    #[error("kind is {found:?}; expected BackupPolicy")]
    Kind { found: String },
    #[error("apiVersion is {found:?}; expected {}", crate::API_VERSION)]
    ApiVersion { found: String },
    #[error("{field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },
}

impl BackupPolicy {
    /// Parses one YAML document and checks what a single object can be checked for.
    ///
    /// # Errors
    /// YAML syntax or an unknown field (with line and column), another kind or version, or
    /// a retention policy without an object store.
    pub fn from_yaml(text: &str) -> Result<Self, PolicyFileError> {
        crate::config::check_bounds(text).map_err(|e| PolicyFileError::Invalid {
            field: "(file)",
            problem: e.to_string(),
        })?;
        serde_yaml::from_str::<BackupPolicy>(text)
            .map_err(PolicyFileError::Syntax)?
            .checked()
    }

    /// [`BackupPolicy::from_yaml`] for a document already read as YAML (one of several in
    /// a file).
    ///
    /// # Errors
    /// As [`BackupPolicy::from_yaml`].
    pub fn from_value(value: serde_yaml::Value) -> Result<Self, PolicyFileError> {
        serde_yaml::from_value::<BackupPolicy>(value)
            .map_err(PolicyFileError::Syntax)?
            .checked()
    }

    fn checked(self) -> Result<Self, PolicyFileError> {
        if self.kind != "BackupPolicy" {
            return Err(PolicyFileError::Kind { found: self.kind });
        }
        if self.api_version != crate::API_VERSION {
            return Err(PolicyFileError::ApiVersion {
                found: self.api_version,
            });
        }
        self.validate()?;
        Ok(self)
    }

    /// Single-object validation (the operator's CRD carries the same rules).
    ///
    /// # Errors
    /// A retention policy without an object store (seed 000); an object store naming both
    /// or neither of `url` and `bucket`.
    pub fn validate(&self) -> Result<(), PolicyFileError> {
        if self.spec.retention.is_some() && self.spec.object_store.is_none() {
            return Err(PolicyFileError::Invalid {
                field: "spec.retention",
                problem: "a retention policy requires spec.objectStore (where the backups are)"
                    .into(),
            });
        }
        if let Some(os) = &self.spec.object_store {
            os.store_url()?;
        }
        Ok(())
    }

    /// The cluster directory: `spec.cluster`, else `metadata.name`.
    pub fn cluster(&self) -> &str {
        self.spec
            .cluster
            .as_deref()
            .unwrap_or(self.metadata.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
apiVersion: tidemark.io/v1alpha1
kind: BackupPolicy
metadata:
  name: cluster-sample
spec:
  objectStore:
    bucket: my-backups
    path: prod
    endpoint: http://127.0.0.1:8333
  timeZone: Europe/Paris
  retention:
    window: 30d
    keepLast: 7
    keepDaily: 7
    failedBackupsTTL: 7d
    coverWindow: true
"#;

    #[test]
    fn parses_the_documented_example() {
        let p = BackupPolicy::from_yaml(EXAMPLE).unwrap();
        assert_eq!(p.cluster(), "cluster-sample");
        let os = p.spec.object_store.as_ref().unwrap();
        assert_eq!(os.store_url().unwrap(), "s3://my-backups/prod");
        let input = p
            .spec
            .retention
            .as_ref()
            .unwrap()
            .to_input(p.spec.time_zone.as_deref());
        let policy = input.validate().unwrap();
        assert_eq!(policy.keep_last, 7);
        assert!(policy.cover_window);
        assert_eq!(policy.time_zone.iana_name(), Some("Europe/Paris"));
    }

    #[test]
    fn unknown_fields_are_refused_with_their_place() {
        let typo = EXAMPLE.replace("keepLast", "keeplast");
        let e = BackupPolicy::from_yaml(&typo).unwrap_err().to_string();
        assert!(
            e.contains("unknown field `keeplast`") && e.contains("line"),
            "{e}"
        );
    }

    #[test]
    fn retention_without_object_store_is_refused() {
        let text = EXAMPLE
            .replace("  objectStore:\n    bucket: my-backups\n    path: prod\n    endpoint: http://127.0.0.1:8333\n", "");
        let e = BackupPolicy::from_yaml(&text).unwrap_err().to_string();
        assert!(
            e.starts_with("spec.retention: a retention policy requires spec.objectStore"),
            "{e}"
        );
    }

    #[test]
    fn wrong_kind_is_named() {
        let e = BackupPolicy::from_yaml(&EXAMPLE.replace("kind: BackupPolicy", "kind: Backup"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "kind is \"Backup\"; expected BackupPolicy");
    }
}
