//! A configuration directory's documents (`tidemark run --config DIR`): YAML files holding
//! BackupPolicy and ScheduledBackup documents, several per file with `---`. Parsing only;
//! the caller reads the files.

use crate::policy::BackupPolicy;
use crate::schedule::ScheduledBackup;

/// The kinds a configuration may hold.
pub const KINDS: &str = "BackupPolicy, ScheduledBackup, DeleteHook";

/// One document of a configuration file.
#[derive(Debug, Clone, PartialEq)]
pub enum Document {
    Policy(Box<BackupPolicy>),
    Schedule(Box<ScheduledBackup>),
    Hook(Box<crate::lifecycle::DeleteHook>),
}

pub use crate::fields::{MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, YamlError, check_bounds};

/// Why a document was refused; the caller adds the file name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// Not YAML, or beyond a bound (with the line).
    #[error(transparent)]
    Yaml(#[from] YamlError),
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
    for (i, value) in crate::fields::yaml_documents(text)?.into_iter().enumerate() {
        let index = i + 1;
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
            "DeleteHook" => crate::lifecycle::DeleteHook::from_value(value)
                .map(|h| Document::Hook(Box::new(h)))
                .map_err(|e| DocumentError::Invalid {
                    index,
                    kind: "DeleteHook",
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

    /// Files are strict (a typo anywhere in a spec is refused with its path), the
    /// operator's types are not (a field a newer CRD added does not stop a watch).
    #[test]
    fn files_are_strict_and_the_operator_tolerates_newer_fields() {
        let e = parse_documents(&FILE.replace("command:", "commmand:"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown field `commmand` at spec.commmand"),
            "{e}"
        );
        let e = BackupPolicy::from_yaml(
            "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {name: p}\nspec:\n  objectStore:\n    bucket: b\n    credentialSecret: s3\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(
                "unknown field `credentialSecret` at spec.objectStore.credentialSecret (line 7)"
            ),
            "{e}"
        );
        // Preserved objects (a pod template) are the API server's to check, not ours.
        let hook = "apiVersion: tidemark.io/v1alpha1\nkind: DeleteHook\nmetadata: {name: h}\nspec:\n  command: [\"true\"]\n  selector: {matchLabels: {a: b}}\n";
        assert!(parse_documents(hook).is_ok());
        let newer: Result<crate::crd::BackupPolicy, _> = serde_json::from_value(
            serde_json::json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
                "metadata": {"name": "p", "namespace": "n"},
                "spec": {"objectStore": {"bucket": "b", "futureField": 1}, "futureSection": {"x": 1}},
            }),
        );
        assert!(newer.is_ok(), "{newer:?}");
    }

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
        let started = std::time::Instant::now();
        assert!(matches!(
            parse_documents(&flow),
            Err(DocumentError::Yaml(YamlError::TooDeep { line: 1 }))
        ));
        let block: String = (0..100_000)
            .map(|i| format!("{}a{i}:\n", " ".repeat(i % 5000)))
            .collect();
        assert!(check_bounds(&block).is_err());
        let seq = format!("{}x\n", "- ".repeat(10_000));
        assert!(matches!(check_bounds(&seq), Err(YamlError::TooDeep { .. })));
        // Quotes, comments and multi-line scalars do not hide brackets that nest.
        for hidden in [
            format!("a: [it's, {}{}]", "[".repeat(1000), "]".repeat(1000)),
            format!("a: x # ]]]]\nb: {}{}", "[".repeat(1000), "]".repeat(1000)),
            format!(
                "a: [\"x\n ]]]]]]]]\", {}{}]",
                "[".repeat(1000),
                "]".repeat(1000)
            ),
            format!(
                "{{a: 'q''{}', b: {}1{}}}",
                "]".repeat(50),
                "{a: ".repeat(100),
                "}".repeat(100)
            ),
        ] {
            assert!(
                matches!(check_bounds(&hidden), Err(YamlError::TooDeep { .. })),
                "{hidden:.80}: {:?}",
                check_bounds(&hidden)
            );
        }
        // Brackets inside quoted strings and comments are not nesting.
        check_bounds(&format!(
            "a: \"{}\"\nb: '[[[' # {}\n",
            "[".repeat(1000),
            "{".repeat(1000)
        ))
        .unwrap();
        // Aliases and nodes are bounded (an alias bomb expands no further).
        let bomb = format!(
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n{}",
            (0..2_000)
                .map(|i| format!("k{i}: *a\n"))
                .collect::<String>()
        );
        assert!(matches!(check_bounds(&bomb), Err(YamlError::Budget { .. })));
        // Aliases of one large scalar count every replay: a 1 MiB file does not become
        // 900 MB (issue 42), and the refusal says what was exceeded.
        let scalar = format!(
            "a: &a \"{}\"\n{}",
            "x".repeat(900 * 1024),
            (0..999).map(|i| format!("k{i}: *a\n")).collect::<String>()
        );
        assert!(scalar.len() <= MAX_CONFIG_BYTES);
        match check_bounds(&scalar) {
            Err(YamlError::Budget { problem, .. }) => {
                assert!(problem.contains("bytes of text"), "{problem}")
            }
            other => panic!("{other:?}"),
        }
        let wide = format!("a: [{}]\n", "1, ".repeat(200_000));
        assert!(matches!(
            check_bounds(&wide),
            Err(YamlError::Budget { .. } | YamlError::TooLarge { .. })
        ));
        let huge = "#".repeat(MAX_CONFIG_BYTES + 1);
        assert!(matches!(
            check_bounds(&huge),
            Err(YamlError::TooLarge { .. })
        ));
        // Every hostile text above was refused quickly (a bound, not a timing assertion:
        // the old libyaml path took 13 s on one of them).
        eprintln!("hostile texts refused in {:?}", started.elapsed());
        // A real configuration passes; a `-` in a flow sequence must be quoted (YAML 1.2),
        // and the message says where.
        check_bounds(FILE).unwrap();
        // libyaml's reading of a bare `-` in a flow sequence (YAML 1.2 refuses it) is
        // kept: files that loaded before still load, meaning the same.
        for (text, want) in [
            ("command: [tar, -cf, -]\n", vec!["tar", "-cf", "-"]),
            ("command: [tar, -cf, '-']\n", vec!["tar", "-cf", "-"]),
            ("command: [-, -, é, -]\n", vec!["-", "-", "é", "-"]),
            ("command: [\"-\", x- , -]\n", vec!["-", "x-", "-"]),
        ] {
            let doc = crate::fields::yaml_document(text).unwrap();
            assert_eq!(doc["command"], serde_json::json!(want), "{text}");
        }
        let many = format!(
            "command: [{}]\n",
            ["-"; crate::fields::MAX_BARE_DASHES + 1].join(", ")
        );
        let e = check_bounds(&many).unwrap_err().to_string();
        assert!(e.contains("line 1, column"), "{e}");
        let e = check_bounds("a: [x, {b: -}]\nc: [-x, @]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
        // A duplicate key is an error, not a silent choice of one of the two.
        let e = check_bounds("a: 1\na: 2\n").unwrap_err().to_string();
        assert!(e.contains("duplicate") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn errors_name_the_document_the_kind_and_the_field() {
        let e = parse_documents(&FILE.replace("kind: ScheduledBackup", "kind: Schedule"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "document 2: unknown kind \"Schedule\"; expected one of BackupPolicy, ScheduledBackup, DeleteHook"
        );
        let e = parse_documents(&FILE.replace("*/10 * * * * *", "*/10 * * *"))
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
