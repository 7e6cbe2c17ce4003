//! A configuration directory's documents (`tidemark run --config DIR`): YAML files holding
//! BackupPolicy and ScheduledBackup documents, several per file with `---`. Parsing only;
//! the caller reads the files.

use crate::policy::BackupPolicy;
use crate::schedule::ScheduledBackup;

/// The kinds a configuration may hold.
pub const KINDS: &str = "BackupPolicy, ScheduledBackup";

/// One document of a configuration file.
#[derive(Debug, Clone, PartialEq)]
pub enum Document {
    Policy(Box<BackupPolicy>),
    Schedule(Box<ScheduledBackup>),
}

/// Why a document was refused; the caller adds the file name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    #[error("document {index}: {problem}")]
    Syntax { index: usize, problem: String },
    #[error("document {index}: unknown kind {kind:?}; expected one of {KINDS}")]
    UnknownKind { index: usize, kind: String },
    #[error("document {index} ({kind} {name}): {problem}")]
    Invalid {
        index: usize,
        kind: &'static str,
        name: String,
        problem: String,
    },
}

/// Parses every document of one file (1-based `index` in errors). Empty documents are
/// skipped.
///
/// # Errors
/// The first document that is not valid YAML, has an unknown kind, or fails validation.
pub fn parse_documents(text: &str) -> Result<Vec<Document>, DocumentError> {
    let mut out = Vec::new();
    for (i, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let value: serde_yaml::Value =
            serde::Deserialize::deserialize(de).map_err(|e| DocumentError::Syntax {
                index,
                problem: e.to_string(),
            })?;
        if value.is_null() {
            continue;
        }
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_owned();
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .unwrap_or("(unnamed)")
            .to_owned();
        let doc = match kind.as_str() {
            "BackupPolicy" => BackupPolicy::from_value(value)
                .map(|p| Document::Policy(Box::new(p)))
                .map_err(|e| DocumentError::Invalid {
                    index,
                    kind: "BackupPolicy",
                    name,
                    problem: e.to_string(),
                })?,
            "ScheduledBackup" => ScheduledBackup::from_value(value)
                .map(|s| Document::Schedule(Box::new(s)))
                .map_err(|e| DocumentError::Invalid {
                    index,
                    kind: "ScheduledBackup",
                    name,
                    problem: e.to_string(),
                })?,
            _ => return Err(DocumentError::UnknownKind { index, kind }),
        };
        out.push(doc);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
apiVersion: tidemark.io/v1alpha1
kind: BackupPolicy
metadata: {name: local}
spec:
  objectStore: {url: "file:///tmp/backups"}
  retention: {keepLast: 3}
---
apiVersion: tidemark.io/v1alpha1
kind: ScheduledBackup
metadata: {name: every-ten-seconds}
spec:
  schedule: "*/10 * * * * *"
  policy: {name: local}
  method: exec
  command: [tar, -C, /etc, -cf, -, hostname]
"#;

    #[test]
    fn several_documents_per_file() {
        let docs = parse_documents(FILE).unwrap();
        assert!(matches!(&docs[0], Document::Policy(p) if p.metadata.name == "local"));
        assert!(matches!(&docs[1], Document::Schedule(s) if s.spec.template.command[0] == "tar"));
    }

    #[test]
    fn errors_name_the_document_the_kind_and_the_field() {
        let e = parse_documents(&FILE.replace("kind: ScheduledBackup", "kind: Schedule"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "document 2: unknown kind \"Schedule\"; expected one of BackupPolicy, ScheduledBackup"
        );
        let e = parse_documents(&FILE.replace("*/10 * * * * *", "*/10 * * * *"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("document 2 (ScheduledBackup every-ten-seconds): spec.schedule:"),
            "{e}"
        );
        let e =
            parse_documents(&FILE.replace("  objectStore: {url: \"file:///tmp/backups\"}\n", ""))
                .unwrap_err()
                .to_string();
        assert!(
            e.contains("spec.retention") && e.contains("spec.objectStore"),
            "{e}"
        );
    }
}
