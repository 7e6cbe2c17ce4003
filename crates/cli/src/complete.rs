//! Completion of `kubectl tidemark …` (issue 46 §4). kubectl (1.26 and later) completes a
//! plugin's arguments by running `kubectl_complete-<plugin>` from PATH with the words
//! typed after the plugin's name, the last one being the word to complete (empty for a new
//! one), and reads Cobra's `__complete` answer: one candidate per line, then a line
//! `:<directive>`. This binary answers when it runs under that name (a link to it, as
//! `kubectl-tidemark` is): the commands, a command's flags, the values of a flag or
//! argument that has a fixed set (`describe backup|restore`, `-o json`…), and the names of
//! BackupPolicies, Backups and Restores read from the cluster (`-n`, `--context`,
//! `--kubeconfig` as typed, else the kubeconfig's), within a few seconds or not at all.

use std::time::Duration;

use kube::api::{Api, ListParams};
use tidemark_api::crd::{Backup, BackupPolicy, Restore};

use crate::args::KubeArgs;

/// The name kubectl looks for beside `kubectl-tidemark`.
pub const COMPLETER: &str = "kubectl_complete-tidemark";

/// Cobra's directives: only the candidates given (no file names).
const NO_FILES: u32 = 4;
/// Cobra's default: the shell may complete file names.
const FILES: u32 = 0;
/// How long the cluster may take to name its objects.
const CLUSTER_WAIT: Duration = Duration::from_secs(5);

/// Whether this process runs as [`COMPLETER`].
pub fn invoked() -> bool {
    std::env::args_os()
        .next()
        .and_then(|a| std::path::Path::new(&a).file_name().map(|n| n == COMPLETER))
        .unwrap_or(false)
}

/// Prints the completions of `words` (the arguments after `tidemark`), Cobra's way, and
/// ends the process: the answer is worked out on a thread of its own and given up on after
/// [`CLUSTER_WAIT`] and a second — a kubeconfig's credential plugin or a slow resolver,
/// which no timer inside can interrupt, never holds a shell's TAB.
pub fn run(words: &[String]) -> ! {
    let words = words.to_vec();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        let answer = match rt {
            Ok(rt) => rt.block_on(complete(&words)),
            Err(_) => (Vec::new(), NO_FILES),
        };
        let _ = tx.send(answer);
    });
    let (candidates, directive) = rx
        .recv_timeout(CLUSTER_WAIT + Duration::from_secs(1))
        .unwrap_or((Vec::new(), NO_FILES));
    let mut out = String::new();
    for c in candidates {
        out.push_str(&c);
        out.push('\n');
    }
    out.push_str(&format!(":{directive}\n"));
    let _ = crate::output::emit(&out);
    std::process::exit(0)
}

/// What a cluster list names: BackupPolicies, Backups or Restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Names {
    Policies,
    Backups,
    Restores,
}

/// The candidates for the last of `words`, and the directive.
async fn complete(words: &[String]) -> (Vec<String>, u32) {
    let current = words.last().map(String::as_str).unwrap_or_default();
    let typed = &words[..words.len().saturating_sub(1)];
    let root = crate::args::command();
    let prefixed = |all: Vec<String>| -> Vec<String> {
        all.into_iter().filter(|c| c.starts_with(current)).collect()
    };
    let Some(name) = typed.first() else {
        let commands = root
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| c.get_name().to_owned())
            .collect();
        return (prefixed(commands), NO_FILES);
    };
    let Some(command) = root.find_subcommand(name) else {
        return (Vec::new(), NO_FILES);
    };
    let flag = |word: &str| {
        command.get_arguments().find(|a| {
            word.strip_prefix("--")
                .is_some_and(|l| a.get_long() == Some(l))
                || word
                    .strip_prefix('-')
                    .and_then(|s| s.chars().next().filter(|_| s.len() == 1))
                    .is_some_and(|s| a.get_short() == Some(s))
        })
    };
    let takes_value = |a: &clap::Arg| a.get_num_args().is_none_or(|n| n.takes_values());
    if current.starts_with('-') {
        let flags = command
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        return (prefixed(flags), NO_FILES);
    }
    // The positional arguments given so far, and the value the previous word asks for.
    let mut positionals = Vec::new();
    let mut i = 1;
    let mut value_of = None;
    while i < typed.len() {
        let w = typed[i].as_str();
        if w.starts_with('-') && w.len() > 1 && !w.contains('=') {
            if let Some(a) = flag(w).filter(|a| takes_value(a) && a.get_action().takes_values()) {
                if i + 1 == typed.len() {
                    value_of = Some(a);
                }
                i += 2;
                continue;
            }
        } else if !w.starts_with('-') {
            positionals.push(w.to_owned());
        }
        i += 1;
    }
    if let Some(a) = value_of {
        let values = choices(a);
        if !values.is_empty() {
            return (prefixed(values), NO_FILES);
        }
        if a.get_id() == "namespace" {
            return (prefixed(namespaces(&kube_args(typed)).await), NO_FILES);
        }
        // A file, a directory, an instant…: the shell's own completion.
        return (Vec::new(), FILES);
    }
    let Some(arg) = command.get_positionals().nth(positionals.len()) else {
        return (Vec::new(), NO_FILES);
    };
    let values = choices(arg);
    if !values.is_empty() {
        return (prefixed(values), NO_FILES);
    }
    let value_name = arg
        .get_value_names()
        .and_then(|n| n.first())
        .map(|n| n.as_str().to_owned())
        .unwrap_or_default();
    let names = match (value_name.as_str(), positionals.first().map(String::as_str)) {
        ("POLICY", _) => Names::Policies,
        ("NAME", Some("backup")) => Names::Backups,
        ("NAME", Some("restore")) => Names::Restores,
        _ => return (Vec::new(), FILES),
    };
    (prefixed(objects(&kube_args(typed), names).await), NO_FILES)
}

/// The values an argument takes, when it has a fixed set (`backup`, `restore`; `json`, …).
fn choices(arg: &clap::Arg) -> Vec<String> {
    arg.get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_owned())
        .collect()
}

/// The cluster flags among the words typed (`-n`, `--namespace`, `--context`,
/// `--kubeconfig`, with their value as the next word or after `=`).
fn kube_args(words: &[String]) -> KubeArgs {
    let mut args = KubeArgs::default();
    let mut iter = words.iter().peekable();
    while let Some(w) = iter.next() {
        let (key, inline) = match w.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k, Some(v.to_owned())),
            _ => (w.as_str(), None),
        };
        if !matches!(key, "-n" | "--namespace" | "--context" | "--kubeconfig") {
            continue;
        }
        let Some(value) = inline.or_else(|| iter.next().cloned()) else {
            break;
        };
        match key {
            "--context" => args.context = Some(value),
            "--kubeconfig" => args.kubeconfig = Some(value.into()),
            _ => args.namespace = Some(value),
        }
    }
    args
}

/// The names of the objects `names` in the namespace, sorted; none when the cluster cannot
/// be asked within [`CLUSTER_WAIT`].
async fn objects(args: &KubeArgs, names: Names) -> Vec<String> {
    sorted(async {
        let (client, ns) = crate::cluster::client_in(args).await.ok()?;
        match names {
            Names::Policies => names_of(Api::<BackupPolicy>::namespaced(client, &ns)).await,
            Names::Backups => names_of(Api::<Backup>::namespaced(client, &ns)).await,
            Names::Restores => names_of(Api::<Restore>::namespaced(client, &ns)).await,
        }
    })
    .await
}

/// The cluster's namespaces (for `-n`), as [`objects`].
async fn namespaces(args: &KubeArgs) -> Vec<String> {
    sorted(async {
        let (client, _) = crate::cluster::client_in(args).await.ok()?;
        names_of(Api::<k8s_openapi::api::core::v1::Namespace>::all(client)).await
    })
    .await
}

/// What `list` names within [`CLUSTER_WAIT`], sorted (nothing after it).
async fn sorted(list: impl Future<Output = Option<Vec<String>>>) -> Vec<String> {
    let mut all = tokio::time::timeout(CLUSTER_WAIT, list)
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    all.sort();
    all
}

/// The names of the objects `api` lists (metadata only).
async fn names_of<K>(api: Api<K>) -> Option<Vec<String>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list_metadata(&ListParams::default()).await.ok()?;
    Some(
        list.items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect(),
    )
}
