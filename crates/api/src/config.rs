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

/// Largest configuration file accepted: far beyond any real set of policies, and a bound
/// on what the parser is asked to do.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;
/// Deepest nesting accepted (block indentation levels and flow brackets): Tidemark's
/// kinds nest a handful of levels; a parser walking 100,000 levels takes minutes.
pub const MAX_CONFIG_DEPTH: usize = 64;

/// Why a configuration was refused before parsing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    #[error("{bytes} bytes is larger than a configuration may be ({MAX_CONFIG_BYTES} bytes)")]
    TooLarge { bytes: usize },
    #[error(
        "line {line}: nested {depth} levels deep; a configuration may nest at most {MAX_CONFIG_DEPTH}"
    )]
    TooDeep { line: usize, depth: usize },
}

/// Checks the size and nesting of a YAML text before it is parsed. The nesting is
/// estimated from indentation (each deeper indentation, and each `- ` that opens a
/// sequence item, is a level) and from flow brackets outside quotes.
///
/// # Errors
/// The text is too large or too deeply nested.
pub fn check_bounds(text: &str) -> Result<(), BoundsError> {
    if text.len() > MAX_CONFIG_BYTES {
        return Err(BoundsError::TooLarge { bytes: text.len() });
    }
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start_matches(' ');
        if flow == 0 && !trimmed.is_empty() && !trimmed.starts_with('#') {
            let mut indent = line.len() - trimmed.len();
            let mut rest = trimmed;
            while let Some(r) = rest.strip_prefix("- ") {
                indent += 2;
                rest = r.trim_start_matches(' ');
                indents.retain(|&i| i < indent - 1);
                indents.push(indent - 1);
            }
            indents.retain(|&i| i < indent);
            indents.push(indent);
        }
        let (mut single, mut double) = (false, false);
        for c in line.chars() {
            match c {
                '\'' if !double => single = !single,
                '"' if !single => double = !double,
                '#' if !single && !double => break,
                '[' | '{' if !single && !double => flow += 1,
                ']' | '}' if !single && !double => flow = flow.saturating_sub(1),
                _ => {}
            }
            if flow > MAX_CONFIG_DEPTH {
                return Err(BoundsError::TooDeep {
                    line: n + 1,
                    depth: flow,
                });
            }
        }
        let depth = indents.len() + flow;
        if depth > MAX_CONFIG_DEPTH {
            return Err(BoundsError::TooDeep { line: n + 1, depth });
        }
    }
    Ok(())
}

/// Why a document was refused; the caller adds the file name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    #[error(transparent)]
    Bounds(#[from] BoundsError),
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
    check_bounds(text)?;
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
    fn deep_or_huge_input_is_refused_before_parsing() {
        let flow = format!("a: {}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(
            parse_documents(&flow),
            Err(DocumentError::Bounds(BoundsError::TooDeep { .. }))
        ));
        let block: String = (0..100_000)
            .map(|i| format!("{}a{i}:\n", " ".repeat(i % 5000)))
            .collect();
        assert!(check_bounds(&block).is_err());
        let seq = format!("{}x\n", "- ".repeat(10_000));
        assert!(check_bounds(&seq).is_err());
        let huge = "#".repeat(MAX_CONFIG_BYTES + 1);
        assert!(matches!(
            check_bounds(&huge),
            Err(BoundsError::TooLarge { .. })
        ));
        // A real configuration passes.
        check_bounds(FILE).unwrap();
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
