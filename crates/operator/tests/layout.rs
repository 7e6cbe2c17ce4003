//! The operator crate's shape (issue 18 §6): its modules form a hierarchy — no two
//! modules reach each other, directly or around a circle — and the crate root only wires
//! the controllers (no module uses an item of `lib.rs`). Read from the sources: every
//! `crate::…` and `super::…` path outside `#[cfg(test)]` code is an edge.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`backup::job`) → its source.
fn modules(src: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            let stem = p.file_stem().unwrap().to_str().unwrap().to_owned();
            let name = if prefix.is_empty() {
                stem.clone()
            } else {
                format!("{prefix}::{stem}")
            };
            if p.is_dir() {
                walk(&p, &name, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                let module = match stem.as_str() {
                    "mod" => prefix.to_owned(),
                    "lib" if prefix.is_empty() => String::new(),
                    _ => name,
                };
                out.insert(module, text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, "", &mut out);
    out
}

/// The code of `text` without comments and without its `#[cfg(test)]` module.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths after `crate::` in `code` (`use crate::{a, b::c}` gives `a` and `b::c`).
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && code[..at].ends_with(|c: char| ident_char(c) || c == ':') {
            continue; // `tidemark_api::crate::…` does not occur; `$crate` neither
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(group.len(), |(i, _)| i);
            let mut d = 0;
            let mut item = String::new();
            for c in group[..end].chars() {
                match c {
                    '{' => d += 1,
                    '}' => d -= 1,
                    ',' if d == 0 => out.push(std::mem::take(&mut item)),
                    _ => item.push(c),
                }
            }
            out.push(item);
        } else {
            out.push(
                rest.chars()
                    .take_while(|&c| ident_char(c) || c == ':')
                    .collect(),
            );
        }
    }
    out.into_iter()
        .map(|p| {
            p.split("::")
                .map(str::trim)
                .take_while(|s| !s.is_empty() && s.chars().all(ident_char))
                .collect::<Vec<_>>()
                .join("::")
        })
        .filter(|p| !p.is_empty())
        .collect()
}

/// The module `path` (relative to the crate) lies in: its longest prefix that is a module;
/// `None` for an item of the crate root.
fn owner<'m>(path: &str, modules: &'m BTreeMap<String, String>) -> Option<&'m str> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find_map(|p| modules.get_key_value(&p).map(|(k, _)| k.as_str()))
}

#[test]
fn no_two_modules_reach_each_other_and_the_root_only_wires() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    assert!(modules.contains_key("backup"), "{:?}", modules.keys());
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut root_items = Vec::new();
    for (module, text) in &modules {
        // The root wires everything; test support may use anything.
        if module.is_empty() || module == "testkit" || module.starts_with("testkit::") {
            continue;
        }
        let code = code(text);
        let mut paths = crate_paths(&code);
        // `super::x` in `a::b` is `a::x`.
        let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
        for (at, _) in code.match_indices("super::") {
            let rest: String = code[at + "super::".len()..]
                .chars()
                .take_while(|&c| ident_char(c) || c == ':')
                .collect();
            let rest = rest.trim_end_matches(':');
            paths.push(if parent.is_empty() {
                rest.to_owned()
            } else {
                format!("{parent}::{rest}")
            });
        }
        // A parent names its children by relative paths (`job::JobPlan`).
        let children: Vec<&String> = modules
            .keys()
            .filter(|k| {
                k.strip_prefix(module.as_str())
                    .and_then(|r| r.strip_prefix("::"))
                    .is_some_and(|r| !r.contains("::"))
            })
            .collect();
        for child in children {
            let last = child.rsplit("::").next().unwrap_or_default();
            let named = code
                .match_indices(&format!("{last}::"))
                .any(|(at, _)| !code[..at].ends_with(|c: char| ident_char(c) || c == ':'));
            if named {
                paths.push(child.clone());
            }
        }
        for path in paths {
            match owner(&path, &modules) {
                Some(target) if target != module.as_str() => {
                    edges.entry(module).or_default().insert(target);
                }
                Some(_) => {}
                None => root_items.push(format!("{module} uses crate::{path}")),
            }
        }
    }
    assert!(
        root_items.is_empty(),
        "modules use items of the crate root (lib.rs only wires the controllers; the item \
         belongs in a module of its own): {root_items:#?}"
    );
    // A module reaching its own submodule is how Rust nests; the reverse closes a circle.
    let mut cycles = Vec::new();
    for &start in edges.keys() {
        // Depth-first from `start`, looking for a way back to it.
        let mut stack = vec![(start, vec![start])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for &next in edges.get(at).into_iter().flatten() {
                if next == start {
                    let mut circle = path.clone();
                    circle.push(start);
                    cycles.push(circle.join(" → "));
                } else if seen.insert(next) {
                    let mut p = path.clone();
                    p.push(next);
                    stack.push((next, p));
                }
            }
        }
    }
    cycles.sort();
    cycles.dedup();
    assert!(
        cycles.is_empty(),
        "operator modules reach each other in a circle:\n{}",
        cycles.join("\n")
    );
    eprintln!("module edges: {edges:#?}");
}

/// One module owns the status writes (issue 18 §6): every `patch_status` of the operator
/// is in `status.rs`, where each writer's fields and field manager are named.
#[test]
fn status_is_written_in_one_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let writers: Vec<&String> = modules
        .iter()
        .filter(|(m, text)| {
            m.as_str() != "status"
                && !m.starts_with("testkit")
                && (code(text).contains(".patch_status(")
                    || code(text).contains(".replace_status("))
        })
        .map(|(m, _)| m)
        .collect();
    assert!(
        writers.is_empty(),
        "status written outside status.rs: {writers:?}"
    );
}
