//! How a document's text is read (one YAML parser, within bounds), and the fields its kind
//! knows: what every file kind (BackupPolicy, ScheduledBackup, DeleteHook, a `run`
//! configuration) checks, below the kinds themselves.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Largest configuration file accepted: far beyond any real set of policies, and a bound
/// on what the parser is asked to do.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;
/// Deepest nesting accepted (mappings and sequences, block or flow): Tidemark's kinds nest
/// a handful of levels.
pub const MAX_CONFIG_DEPTH: usize = 64;
/// Most nodes (scalars, mappings, sequences) in one file, and most aliases (`*a`): a real
/// configuration holds a few hundred nodes and no alias.
pub const MAX_CONFIG_NODES: usize = 100_000;
pub const MAX_CONFIG_ALIASES: usize = 1_000;

/// Why a YAML text was refused: too large, too deep, beyond another budget, or not YAML.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    #[error("{bytes} bytes is larger than a configuration may be ({MAX_CONFIG_BYTES} bytes)")]
    TooLarge { bytes: usize },
    #[error(
        "line {line}: nested more than {MAX_CONFIG_DEPTH} levels deep; a configuration may nest at most {MAX_CONFIG_DEPTH}"
    )]
    TooDeep { line: usize },
    #[error("line {line}: {problem}")]
    Budget { line: usize, problem: String },
    /// The parser's own message, with the line and column.
    #[error("{0}")]
    Syntax(String),
}

/// Parses a YAML text of one or more documents (`---`) into values, within bounds: at most
/// [`MAX_CONFIG_BYTES`], [`MAX_CONFIG_DEPTH`] levels, [`MAX_CONFIG_NODES`] nodes and
/// [`MAX_CONFIG_ALIASES`] aliases. One parser (serde-saphyr, YAML 1.2) reads the text
/// once and stops at the first bound broken, so a hostile file costs microseconds; a
/// duplicate key is an error, and messages carry no part of the text beyond the field
/// named (no snippet). Empty documents are `null`.
///
/// One thing libyaml (`serde_yaml`, which read these files before) accepted and YAML 1.2
/// does not is kept: a bare `-` in a flow sequence (`command: [tar, -cf, -]`) is the
/// string `-`, as it always was — at most [`MAX_BARE_DASHES`] of them, each costing one
/// more parse of the text.
///
/// # Errors
/// The text breaks a bound or is not YAML.
pub fn yaml_documents(text: &str) -> Result<Vec<serde_json::Value>, YamlError> {
    if text.len() > MAX_CONFIG_BYTES {
        return Err(YamlError::TooLarge { bytes: text.len() });
    }
    let mut text = std::borrow::Cow::Borrowed(text);
    for _ in 0..MAX_BARE_DASHES {
        match parse_bounded(&text) {
            Err((YamlError::Syntax(message), Some(at)))
                if message.starts_with("plain scalar cannot start with '-'") =>
            {
                let Some(quoted) = quote_dash(&text, at) else {
                    return Err(YamlError::Syntax(message));
                };
                text = std::borrow::Cow::Owned(quoted);
            }
            other => return other.map_err(|(e, _)| e),
        }
    }
    parse_bounded(&text).map_err(|(e, _)| match e {
        YamlError::Syntax(m) if m.starts_with("plain scalar cannot start with '-'") => {
            YamlError::Syntax(format!(
                "{m} (more than {MAX_BARE_DASHES} bare '-' in flow sequences, where YAML 1.2 allows none: quote them, '-'; the line and column count the ones before as quoted)"
            ))
        }
        other => other,
    })
}

/// Most bare `-` in flow sequences one text may hold ([`yaml_documents`]).
pub const MAX_BARE_DASHES: usize = 64;

/// `text` with the `-` at 1-based `(line, column)` quoted, when a bare `-` followed by a
/// flow indicator is there.
fn quote_dash(text: &str, (line, column): (usize, usize)) -> Option<String> {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.checked_sub(1)?)
        .map(str::len)
        .sum();
    let at = start + text[start..].char_indices().nth(column.checked_sub(1)?)?.0;
    let rest = &text.as_bytes()[at..];
    (rest.first() == Some(&b'-') && rest.get(1).is_some_and(|c| b",[]{}".contains(c)))
        .then(|| format!("{}'-'{}", &text[..at], &text[at + 1..]))
}

/// One parse of `text` within the budget; on failure, the error and its 1-based line and
/// column.
#[allow(clippy::type_complexity)]
fn parse_bounded(
    text: &str,
) -> Result<Vec<serde_json::Value>, (YamlError, Option<(usize, usize)>)> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_CONFIG_DEPTH,
            flow_nesting_limit: MAX_CONFIG_DEPTH,
            max_nodes: MAX_CONFIG_NODES,
            max_aliases: MAX_CONFIG_ALIASES,
            max_anchors: MAX_CONFIG_ALIASES,
            // Aliases of large anchored scalars do not multiply the text's bytes.
            max_total_scalar_bytes: 4 * MAX_CONFIG_BYTES,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_CONFIG_NODES,
        },
        with_snippet: false,
    };
    serde_saphyr::from_multiple_with_options(text, options).map_err(|e| {
        let at = e.location().map(|l| {
            (
                usize::try_from(l.line()).unwrap_or(0),
                usize::try_from(l.column()).unwrap_or(0),
            )
        });
        let line = at.map_or(0, |a| a.0);
        // An error met while replaying an alias comes wrapped with where it was used.
        let mut inner = &e;
        while let serde_saphyr::Error::AliasError { error, .. }
        | serde_saphyr::Error::WithSnippet { error, .. } = inner
        {
            inner = error;
        }
        let e = match inner {
            serde_saphyr::Error::Budget { breach, .. } => {
                use serde_saphyr::budget::BudgetBreach;
                let what = match breach {
                    BudgetBreach::Depth { .. } => return (YamlError::TooDeep { line }, at),
                    BudgetBreach::Nodes { .. } => format!("more than {MAX_CONFIG_NODES} nodes"),
                    BudgetBreach::Aliases { .. } => {
                        format!("more than {MAX_CONFIG_ALIASES} aliases")
                    }
                    BudgetBreach::Anchors { .. } => {
                        format!("more than {MAX_CONFIG_ALIASES} anchors")
                    }
                    // Aliases replay their anchor's text: counted each time.
                    BudgetBreach::ScalarBytes { .. } => format!(
                        "more than {} bytes of text, aliases' replays included",
                        4 * MAX_CONFIG_BYTES
                    ),
                    other => format!("{other:?}"),
                };
                YamlError::Budget {
                    line,
                    problem: format!("{what}: beyond what a configuration may hold"),
                }
            }
            _ => {
                let message = e.without_snippet().to_string();
                if message.contains("recursion limit") || message.contains("nesting limit") {
                    YamlError::TooDeep { line }
                } else {
                    YamlError::Syntax(message)
                }
            }
        };
        (e, at)
    })
}

/// [`yaml_documents`] for a text that holds one document (an empty text is `null`).
///
/// # Errors
/// As [`yaml_documents`], or more than one document.
pub fn yaml_document(text: &str) -> Result<serde_json::Value, YamlError> {
    let mut docs = yaml_documents(text)?;
    match docs.len() {
        0 => Ok(serde_json::Value::Null),
        1 => Ok(docs.remove(0)),
        n => Err(YamlError::Syntax(format!(
            "{n} documents where one is expected"
        ))),
    }
}

/// Checks a configuration's size and nesting: [`yaml_documents`] without keeping what it
/// read.
///
/// # Errors
/// As [`yaml_documents`].
pub fn check_bounds(text: &str) -> Result<(), YamlError> {
    yaml_documents(text).map(drop)
}

/// A document's `spec` may hold only fields its kind knows (the CRD's schema): the first
/// other one is refused by name and path, with its line when `text` is the document.
///
/// # Errors
/// The unknown field.
pub(crate) fn known_fields(
    crd: &CustomResourceDefinition,
    doc: &serde_json::Value,
    text: Option<&str>,
) -> Result<(), String> {
    let Some(spec) = doc.get("spec") else {
        return Ok(());
    };
    let Some(path) = unknown_in(crd, spec) else {
        return Ok(());
    };
    let field = path
        .rsplit('.')
        .next()
        .unwrap_or_default()
        .split('[')
        .next()
        .unwrap_or_default()
        .to_owned();
    let line = text.and_then(|t| {
        t.lines()
            .position(|l| {
                l.trim_start()
                    .trim_start_matches("- ")
                    .trim_start_matches(['{', ' '])
                    .starts_with(&format!("{field}:"))
            })
            .map(|i| i + 1)
    });
    Err(format!(
        "unknown field `{field}` at {path}{}",
        line.map(|l| format!(" (line {l})")).unwrap_or_default()
    ))
}

/// The first field of `spec` (a document's, as YAML) that the kind's schema does not know,
/// as a path such as `spec.retention.keeplast` — what the API server would prune. Files
/// are held to it (a typo is an error, not a silently ignored setting); the operator's own
/// types accept fields they do not know, so a newer CRD beside an older operator never
/// stops a watch.
pub fn unknown_in(crd: &CustomResourceDefinition, spec: &serde_json::Value) -> Option<String> {
    let schema = serde_json::to_value(
        crd.spec
            .versions
            .first()?
            .schema
            .as_ref()?
            .open_api_v3_schema
            .as_ref()?,
    )
    .ok()?;
    first_unknown(&schema["properties"]["spec"], spec, "spec")
}

fn first_unknown(
    schema: &serde_json::Value,
    value: &serde_json::Value,
    at: &str,
) -> Option<String> {
    use serde_json::Value;
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return None;
    }
    match value {
        Value::Object(map) => {
            if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                return map
                    .iter()
                    .find_map(|(k, v)| first_unknown(extra, v, &format!("{at}.{k}")));
            }
            let props = schema.get("properties");
            map.iter().find_map(|(k, v)| {
                let path = format!("{at}.{k}");
                match props.and_then(|p| p.get(k)) {
                    Some(s) => first_unknown(s, v, &path),
                    None => Some(path),
                }
            })
        }
        Value::Array(items) => {
            let s = schema.get("items")?;
            items
                .iter()
                .enumerate()
                .find_map(|(i, v)| first_unknown(s, v, &format!("{at}[{i}]")))
        }
        _ => None,
    }
}
