//! The shape of every crate of the workspace (issue 18 §6, issue 29): its modules form a
//! hierarchy — no two modules reach each other, directly or around a circle — the crate
//! root only wires (no module uses an item of `lib.rs` or `main.rs`; exported macros
//! aside), and no chain of imports is deeper than [`MAX_DEPTH`] modules. Read from the
//! sources: every `crate::…` and `super::…` path outside `#[cfg(test)]` code is an edge.

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
                    "lib" | "main" if prefix.is_empty() => String::new(),
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

/// The code of `text` without comments and without its `#[cfg(test)]` modules (whatever
/// their names, wherever they are).
fn code(text: &str) -> String {
    let mut text = text.to_owned();
    while let Some(at) = text.find("#[cfg(test)]") {
        let after = &text[at + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        let is_mod = item.starts_with("mod ")
            || item.starts_with("pub mod ")
            || item.starts_with("pub(crate) mod ");
        let Some(open) = after.find('{').filter(|_| is_mod) else {
            // A test-only item that is not a module: its attribute goes, the item stays
            // (it is a single item; its paths count, which errs on the strict side).
            text.replace_range(at..at + "#[cfg(test)]".len(), "");
            continue;
        };
        let body = &after[open + 1..];
        let end = closing_brace(body).map_or(body.len(), |i| i + 1);
        let stop = at + "#[cfg(test)]".len() + open + 1 + end;
        text.replace_range(at..stop, "");
    }
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where the `}` closing a brace opened just before `text` is (its byte offset).
fn closing_brace(text: &str) -> Option<usize> {
    let mut depth = 1usize;
    text.char_indices().find_map(|(i, c)| {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        (depth == 0).then_some(i)
    })
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
            let end = closing_brace(group).unwrap_or(group.len());
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
            let path: String = rest
                .chars()
                .take_while(|&c| ident_char(c) || c == ':')
                .collect();
            // An exported macro (`crate::name!`) lives at the root by necessity.
            if !rest[path.len()..].starts_with('!') {
                out.push(path);
            }
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

/// The longest chain of imports any crate may have, in modules (`a → b → c` is 3): a
/// shallow tree, so that a change to a shared helper is a change to few layers.
const MAX_DEPTH: usize = 9;

/// The crates of the workspace, beside this one.
fn crates() -> Vec<(String, PathBuf)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("src").is_dir())
        .map(|p| {
            (
                p.file_name().unwrap().to_str().unwrap().to_owned(),
                p.join("src"),
            )
        })
        .collect();
    out.sort();
    out
}

/// A crate's module edges, and the uses of root items found.
fn edges_of(
    modules: &BTreeMap<String, String>,
) -> (BTreeMap<String, BTreeSet<String>>, Vec<String>) {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut root_items = Vec::new();
    for (module, text) in modules {
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
            match owner(&path, modules) {
                Some(target) if target != module.as_str() => {
                    edges
                        .entry(module.clone())
                        .or_default()
                        .insert(target.to_owned());
                }
                Some(_) => {}
                None => root_items.push(format!("{module} uses crate::{path}")),
            }
        }
    }
    (edges, root_items)
}

/// Every circle of `edges`, as `a → b → a`.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut cycles = Vec::new();
    for start in edges.keys() {
        // Depth-first from `start`, looking for a way back to it.
        let mut stack = vec![(start, vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for next in edges.get(at).into_iter().flatten() {
                if next == start {
                    let mut circle = path.clone();
                    circle.push(start.clone());
                    cycles.push(circle.join(" → "));
                } else if seen.insert(next) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next, p));
                }
            }
        }
    }
    cycles.sort();
    cycles.dedup();
    cycles
}

/// The longest chain of imports from `module` (acyclic `edges`), modules first to last.
fn longest<'e>(
    module: &'e str,
    edges: &'e BTreeMap<String, BTreeSet<String>>,
    memo: &mut BTreeMap<&'e str, Vec<&'e str>>,
) -> Vec<&'e str> {
    if let Some(known) = memo.get(module) {
        return known.clone();
    }
    let mut best: Vec<&str> = Vec::new();
    for next in edges.get(module).into_iter().flatten() {
        let chain = longest(next, edges, memo);
        if chain.len() > best.len() {
            best = chain;
        }
    }
    best.insert(0, module);
    memo.insert(module, best.clone());
    best
}

#[test]
fn no_two_modules_reach_each_other_and_the_root_only_wires() {
    let all = crates();
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        names.contains(&"operator") && names.contains(&"cli") && names.len() >= 7,
        "{names:?}"
    );
    let mut problems = Vec::new();
    for (name, src) in &all {
        let modules = modules(src);
        let (edges, root_items) = edges_of(&modules);
        if !root_items.is_empty() {
            problems.push(format!(
                "{name}: modules use items of the crate root (the root only wires; the item belongs in a module of its own): {root_items:#?}"
            ));
        }
        let circles = cycles(&edges);
        if !circles.is_empty() {
            problems.push(format!(
                "{name}: modules reach each other in a circle:\n{}",
                circles.join("\n")
            ));
            continue;
        }
        let mut memo = BTreeMap::new();
        let deepest = edges
            .keys()
            .map(|m| longest(m, &edges, &mut memo))
            .max_by_key(Vec::len)
            .unwrap_or_default();
        eprintln!(
            "{name}: {} modules, deepest chain {}",
            modules.len(),
            deepest.join(" → ")
        );
        if deepest.len() > MAX_DEPTH {
            problems.push(format!(
                "{name}: an import chain {} modules deep (at most {MAX_DEPTH}): {}",
                deepest.len(),
                deepest.join(" → ")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// The checks above can fail: a circle and a root item are found in a made-up crate.
#[test]
fn the_layout_check_finds_a_circle_and_a_root_item() {
    let modules: BTreeMap<String, String> = [
        ("", "pub const ROOT: u8 = 1;"),
        ("a", "use crate::b::B; pub struct A;"),
        (
            "b",
            "use crate::a::A; pub struct B; fn f() -> u8 { crate::ROOT }",
        ),
        (
            "c",
            "#[cfg(test)]\nmod tests { use crate::a::A; }\npub struct C;",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let (edges, root_items) = edges_of(&modules);
    assert_eq!(root_items, ["b uses crate::ROOT"]);
    assert_eq!(cycles(&edges), ["a → b → a", "b → a → b"]);
    assert!(
        !edges.contains_key("c"),
        "test code is not an edge: {edges:?}"
    );
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
