//! `deploy/` agrees with itself: the Helm chart carries the same CRDs and RBAC as the plain
//! manifests, and the Deployment runs as the ServiceAccount the RBAC binds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_yaml::Value;
use tidemark_operator::rbac::{Capabilities, Install};

fn read(path: &str) -> String {
    let full = format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

fn docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

#[test]
fn the_chart_carries_the_generated_crds() {
    assert!(
        read("deploy/helm/tidemark/crds/tidemark.io.yaml") == read("deploy/crds/tidemark.io.yaml"),
        "deploy/helm/tidemark/crds/ differs from deploy/crds/; regenerate: scripts/gen-deploy.sh"
    );
}

/// deploy/rbac.yaml is what `tidemark rbac` prints for the default install.
#[test]
fn deploy_rbac_is_the_generated_rbac() {
    let plain = json(docs(&read("deploy/rbac.yaml")));
    let generated = tidemark_operator::rbac::manifests(&Install::default());
    assert_eq!(
        plain, generated,
        "deploy/rbac.yaml differs from `tidemark rbac`"
    );
}

fn json(docs: Vec<Value>) -> Vec<serde_json::Value> {
    docs.into_iter()
        .map(|d| serde_json::to_value(d).unwrap())
        .collect()
}

/// The chart's RBAC template, rendered for every combination of watchNamespaces and
/// capabilities, is what `tidemark rbac` prints for the same install (no Helm here: a
/// renderer of the template language's few constructs the template uses).
#[test]
fn the_chart_rbac_is_the_generated_rbac() {
    let templates = [
        read("deploy/helm/tidemark/templates/_rules.tpl"),
        read("deploy/helm/tidemark/templates/rbac.yaml"),
    ];
    for namespaces in [vec![], vec!["team-a".to_owned(), "team-b".to_owned()]] {
        for off in 0..16u8 {
            let capabilities = Capabilities {
                exec: off & 1 == 0,
                jobs: off & 2 == 0,
                archiver: off & 4 == 0,
                recreate: off & 8 == 0,
            };
            let values = serde_json::json!({
                "Values": {
                    "rbac": { "create": true },
                    "serviceAccount": { "name": "tidemark-operator" },
                    "watchNamespaces": namespaces,
                    "capabilities": {
                        "exec": capabilities.exec,
                        "jobs": capabilities.jobs,
                        "archiver": capabilities.archiver,
                        "recreate": capabilities.recreate,
                    },
                },
                "Release": { "Namespace": "tidemark-system" },
            });
            let rendered = template::render(&templates, "rbac.yaml", &values);
            let install = Install {
                namespaces: namespaces.clone(),
                capabilities,
                ..Install::default()
            };
            let generated: Vec<_> = tidemark_operator::rbac::manifests(&install)
                .into_iter()
                .filter(|d| d["kind"] != "Namespace")
                .collect();
            assert_eq!(
                json(docs(&rendered)),
                generated,
                "the chart's RBAC for {namespaces:?} {capabilities:?} differs from `tidemark rbac`:\n{rendered}"
            );
        }
    }
}

/// The few constructs of Go's text/template (as Helm runs it) that the chart's RBAC uses:
/// `if`/`else`/`end`, `not`, `range $v := ...`, `define`, `include`, comments, `{{-`/`-}}`
/// trimming, and values by path. Anything else panics, so the template cannot drift into
/// what the test does not understand.
mod template {
    use serde_json::Value;
    use std::collections::HashMap;

    #[derive(Debug)]
    enum Node {
        Text(String),
        Out(String),
        If(String, Vec<Node>, Vec<Node>),
        Range(String, String, Vec<Node>),
        Include(String, String),
    }

    /// Text and actions, with trimming applied.
    fn tokens(src: &str) -> Vec<(bool, String)> {
        let mut out: Vec<(bool, String)> = Vec::new();
        let mut rest = src;
        let mut trim_next = false;
        while let Some(at) = rest.find("{{") {
            let mut text = rest[..at].to_owned();
            if trim_next {
                text = text.trim_start().to_owned();
            }
            let close = rest[at..].find("}}").expect("unclosed action") + at;
            let mut action = &rest[at + 2..close];
            if let Some(a) = action.strip_prefix('-') {
                text = text.trim_end().to_owned();
                action = a;
            }
            trim_next = false;
            if let Some(a) = action.strip_suffix('-') {
                trim_next = true;
                action = a;
            }
            out.push((false, text));
            out.push((true, action.trim().to_owned()));
            rest = &rest[close + 2..];
        }
        let text = if trim_next { rest.trim_start() } else { rest };
        out.push((false, text.to_owned()));
        out
    }

    /// Parses until `end` (or `else`); returns the nodes and what ended them.
    fn parse(
        toks: &mut std::iter::Peekable<std::vec::IntoIter<(bool, String)>>,
        defines: &mut HashMap<String, Vec<Node>>,
    ) -> (Vec<Node>, Option<String>) {
        let mut nodes = Vec::new();
        while let Some((action, t)) = toks.next() {
            if !action {
                nodes.push(Node::Text(t));
                continue;
            }
            let words: Vec<&str> = t.split_whitespace().collect();
            match words.as_slice() {
                ["end"] | ["else"] => return (nodes, Some(t)),
                _ if t.starts_with("/*") => {}
                ["if", cond @ ..] => {
                    let (then, ended) = parse(toks, defines);
                    let otherwise = if ended.as_deref() == Some("else") {
                        parse(toks, defines).0
                    } else {
                        Vec::new()
                    };
                    nodes.push(Node::If(cond.join(" "), then, otherwise));
                }
                ["range", var, ":=", list] => {
                    let (body, _) = parse(toks, defines);
                    nodes.push(Node::Range((*var).to_owned(), (*list).to_owned(), body));
                }
                ["define", name] => {
                    let (body, _) = parse(toks, defines);
                    defines.insert(name.trim_matches('"').to_owned(), body);
                }
                ["include", name, ctx] => nodes.push(Node::Include(
                    name.trim_matches('"').to_owned(),
                    (*ctx).to_owned(),
                )),
                [path] => nodes.push(Node::Out((*path).to_owned())),
                _ => panic!("the test's template renderer does not know {{{{ {t} }}}}"),
            }
        }
        (nodes, None)
    }

    struct Scope<'a> {
        root: &'a Value,
        dot: Value,
        vars: HashMap<String, Value>,
    }

    fn value(expr: &str, s: &Scope<'_>) -> Value {
        if let Some(e) = expr.strip_prefix("not ") {
            return Value::Bool(!truthy(&value(e, s)));
        }
        let (base, path) = if let Some(p) = expr.strip_prefix("$.") {
            (s.root.clone(), p)
        } else if expr == "$" {
            return s.root.clone();
        } else if let Some(p) = expr.strip_prefix('.') {
            (s.dot.clone(), p)
        } else if expr.starts_with('$') {
            let (var, p) = expr.split_once('.').unwrap_or((expr, ""));
            (s.vars.get(var).cloned().expect("unknown variable"), p)
        } else {
            panic!("the test's template renderer does not know the expression {expr}")
        };
        // As Helm: a field of something that is not a map is an error, not nothing.
        path.split('.')
            .filter(|k| !k.is_empty())
            .fold(base, |v, k| {
                let map = v
                    .as_object()
                    .unwrap_or_else(|| panic!("{expr}: can't evaluate field {k} in {v}"));
                map.get(k).cloned().unwrap_or(Value::Null)
            })
    }

    fn truthy(v: &Value) -> bool {
        match v {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            Value::Number(n) => n.as_f64() != Some(0.0),
        }
    }

    fn eval(
        nodes: &[Node],
        s: &mut Scope<'_>,
        defines: &HashMap<String, Vec<Node>>,
        out: &mut String,
    ) {
        for n in nodes {
            match n {
                Node::Text(t) => out.push_str(t),
                Node::Out(e) => match value(e, s) {
                    Value::String(v) => out.push_str(&v),
                    other => out.push_str(&other.to_string()),
                },
                Node::If(c, then, otherwise) => {
                    let branch = if truthy(&value(c, s)) {
                        then
                    } else {
                        otherwise
                    };
                    eval(branch, s, defines, out);
                }
                Node::Range(var, list, body) => {
                    let items = value(list, s).as_array().cloned().unwrap_or_default();
                    for item in items {
                        s.vars.insert(var.clone(), item.clone());
                        let saved = std::mem::replace(&mut s.dot, item);
                        eval(body, s, defines, out);
                        s.dot = saved;
                    }
                }
                Node::Include(name, ctx) => {
                    let mut inner = Scope {
                        root: s.root,
                        dot: value(ctx, s),
                        vars: HashMap::from([("$".to_owned(), s.root.clone())]),
                    };
                    eval(&defines[name.as_str()], &mut inner, defines, out);
                }
            }
        }
    }

    /// Renders the last of `files` (the others hold `define`s) with `root` as `.`.
    pub fn render(files: &[String], _name: &str, root: &Value) -> String {
        let mut defines = HashMap::new();
        let mut main = Vec::new();
        for f in files {
            let mut toks = tokens(f).into_iter().peekable();
            let (nodes, ended) = parse(&mut toks, &mut defines);
            assert!(ended.is_none(), "an unmatched {ended:?}");
            main = nodes;
        }
        let mut out = String::new();
        let mut scope = Scope {
            root,
            dot: root.clone(),
            vars: HashMap::new(),
        };
        eval(&main, &mut scope, &defines, &mut out);
        out
    }
}

#[test]
fn the_deployment_runs_as_the_bound_service_account() {
    let deployment = &docs(&read("deploy/operator.yaml"))[0];
    let spec = &deployment["spec"]["template"]["spec"];
    let rbac = docs(&read("deploy/rbac.yaml"));
    let binding = rbac
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .unwrap();
    assert_eq!(spec["serviceAccountName"], binding["subjects"][0]["name"]);
    assert_eq!(
        deployment["metadata"]["namespace"],
        binding["subjects"][0]["namespace"]
    );
    let c = &spec["containers"][0];
    assert_eq!(c["args"][0], "operator");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    // Backup Jobs copy tidemark from the operator's own image.
    let image = c["image"].as_str().unwrap();
    let env = c["env"].as_sequence().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "TIDEMARK_IMAGE" && e["value"].as_str() == Some(image))
    );
}
