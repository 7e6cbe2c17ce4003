//! Bounds a document's text is held to before it is parsed, and the fields its kind
//! knows: what every file kind (BackupPolicy, ScheduledBackup, DeleteHook, a `run`
//! configuration) checks, below the kinds themselves.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use yaml_rust2::parser::Event;

/// Largest configuration file accepted: far beyond any real set of policies, and a bound
/// on what the parser is asked to do.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;
/// Deepest nesting accepted (mappings and sequences, block or flow): Tidemark's kinds nest
/// a handful of levels; libyaml (under `serde_yaml`) walking 100,000 flow levels takes
/// minutes.
pub const MAX_CONFIG_DEPTH: usize = 64;

/// Most work (flow brackets `[`/`{` × bytes) in a text `serde_yaml` is given without a
/// depth check. libyaml keeps one pending key per open flow collection and looks at every
/// one of them for each token it reads, so its time is bounded by brackets × tokens, and
/// tokens by bytes: 2²⁴ such steps take it about 0.1 s (65,536 nested brackets, 2³¹ steps,
/// took 13 s on these machines).
pub const MAX_UNCHECKED_WORK: usize = 1 << 24;

/// Why a configuration was refused before parsing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    #[error("{bytes} bytes is larger than a configuration may be ({MAX_CONFIG_BYTES} bytes)")]
    TooLarge { bytes: usize },
    #[error(
        "line {line}: nested {depth} levels deep; a configuration may nest at most {MAX_CONFIG_DEPTH}"
    )]
    TooDeep { line: usize, depth: usize },
    #[error(
        "line {line} column {column}: {problem}; a configuration this large (flow brackets × bytes above {MAX_UNCHECKED_WORK}) must be YAML 1.2, whose nesting can be checked before parsing (quote such a scalar: '-')"
    )]
    Syntax {
        line: usize,
        column: usize,
        problem: String,
    },
}

/// Checks the size and nesting of a YAML text before it is parsed. The nesting is counted
/// by a streaming YAML parser (`yaml-rust2`'s events: each mapping or sequence opened is a
/// level), which stops at the first level too deep, so a hostile file costs microseconds;
/// counting brackets and indentation by hand is fooled by quotes (`it's [`), comments and
/// multi-line scalars.
///
/// That parser follows YAML 1.2 more strictly than libyaml (under `serde_yaml`), which
/// accepts, for one, `[tar, -cf, -]`. Text it cannot read goes on to `serde_yaml` when its
/// flow brackets times its length stay within [`MAX_UNCHECKED_WORK`] (a bound on libyaml's
/// time, whatever the nesting), and is refused otherwise.
///
/// # Errors
/// The text is too large, too deeply nested, or too large to read without a depth check.
pub fn check_bounds(text: &str) -> Result<(), BoundsError> {
    if text.len() > MAX_CONFIG_BYTES {
        return Err(BoundsError::TooLarge { bytes: text.len() });
    }
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    let mut depth = 0usize;
    loop {
        let next = parser.next_token().map_err(|e| {
            let line = e.marker().line();
            if e.info().contains("recursion limit") {
                BoundsError::TooDeep {
                    line,
                    depth: MAX_CONFIG_DEPTH + 1,
                }
            } else {
                BoundsError::Syntax {
                    line,
                    column: e.marker().col() + 1,
                    problem: e.info().to_owned(),
                }
            }
        });
        let (event, at) = match next {
            Ok(next) => next,
            Err(BoundsError::Syntax { .. })
                if text
                    .bytes()
                    .filter(|b| matches!(b, b'[' | b'{'))
                    .count()
                    .saturating_mul(text.len())
                    <= MAX_UNCHECKED_WORK =>
            {
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        match event {
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                depth += 1;
                if depth > MAX_CONFIG_DEPTH {
                    return Err(BoundsError::TooDeep {
                        line: at.line(),
                        depth,
                    });
                }
            }
            Event::MappingEnd | Event::SequenceEnd => depth = depth.saturating_sub(1),
            Event::StreamEnd => return Ok(()),
            _ => {}
        }
    }
}

/// A document's `spec` may hold only fields its kind knows (the CRD's schema): the first
/// other one is refused by name and path, with its line when `text` is the document.
///
/// # Errors
/// The unknown field.
pub(crate) fn known_fields(
    crd: &CustomResourceDefinition,
    doc: &serde_yaml::Value,
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
pub fn unknown_in(crd: &CustomResourceDefinition, spec: &serde_yaml::Value) -> Option<String> {
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
    let spec = serde_json::to_value(spec).ok()?;
    first_unknown(&schema["properties"]["spec"], &spec, "spec")
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
