//! The operator's RBAC, as code: `tidemark rbac` prints it, `deploy/rbac.yaml` and the Helm
//! chart's template are checked against it (crates/operator/tests/deploy.rs), and the tests
//! run the operator under exactly these rules.
//!
//! Two forms: cluster-wide (a ClusterRole, every namespace) and namespaced (a Role in each
//! listed namespace; the operator then watches only those, `--namespace`). Either form
//! leaves out the rights of the capabilities the install turns off (`--disable`): no
//! `pods/exec` without method `exec`, no Job creation without Jobs (methods mariabackup,
//! xtrabackup and job, consolidation, DeleteHooks with a job action), no Deployment
//! creation without the binlog archiver, no pod deletion without `recreate` (an
//! expired claim's pending StatefulSet pod). The operator refuses what needs a right it lacks,
//! with a reason, instead of failing on a 403.

use serde_json::{Value, json};

/// What the operator may start besides watching objects and writing their status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Method `exec`: commands in the database container through `pods/exec`.
    pub exec: bool,
    /// Jobs: methods mariabackup, xtrabackup and job, consolidations, DeleteHook job
    /// actions.
    pub jobs: bool,
    /// The binlog archiver Deployment of `binlogArchive.server`.
    pub archiver: bool,
    /// Deleting a pending StatefulSet pod whose claim expired (VolumeClaimRetention), so
    /// that its StatefulSet recreates it on a fresh claim.
    pub recreate: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            exec: true,
            jobs: true,
            archiver: true,
            recreate: true,
        }
    }
}

/// The names `--disable` accepts.
pub const CAPABILITIES: [&str; 4] = ["exec", "jobs", "archiver", "recreate"];

impl Capabilities {
    /// Every capability but those named in `disabled` (`exec`, `jobs`, `archiver`,
    /// `recreate`).
    ///
    /// # Errors
    /// A name that is none of them, with the accepted ones.
    pub fn without(disabled: &[String]) -> Result<Self, String> {
        let mut c = Capabilities::default();
        for name in disabled {
            match name.trim() {
                "exec" => c.exec = false,
                "jobs" => c.jobs = false,
                "archiver" => c.archiver = false,
                "recreate" => c.recreate = false,
                "" => {}
                other => {
                    return Err(format!(
                        "unknown capability {other:?}; expected one of {}",
                        CAPABILITIES.join(", ")
                    ));
                }
            }
        }
        Ok(c)
    }

    /// The names turned off, in [`CAPABILITIES`] order.
    pub fn disabled(&self) -> Vec<&'static str> {
        [
            (!self.exec).then_some("exec"),
            (!self.jobs).then_some("jobs"),
            (!self.archiver).then_some("archiver"),
            (!self.recreate).then_some("recreate"),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Why `what` is refused: the install turned `capability` off (`--disable`).
pub fn refused(what: &str, capability: &str) -> String {
    let right = match capability {
        "exec" => "pods/exec",
        "jobs" => "Job creation",
        "recreate" => "pod deletion",
        _ => "Deployment creation",
    };
    format!(
        "{what} needs {right}, which this operator was installed without (--disable {capability}); ask the cluster admin, or use what the install allows"
    )
}

/// One install of the operator.
#[derive(Debug, Clone)]
pub struct Install {
    /// Where the operator runs (its ServiceAccount and leader Lease).
    pub namespace: String,
    pub service_account: String,
    /// Empty: every namespace (ClusterRole); else a Role in each of these.
    pub namespaces: Vec<String>,
    pub capabilities: Capabilities,
}

impl Default for Install {
    fn default() -> Self {
        Install {
            namespace: "tidemark-system".into(),
            service_account: NAME.into(),
            namespaces: Vec::new(),
            capabilities: Capabilities::default(),
        }
    }
}

/// The default ServiceAccount, which also names every role and binding.
const NAME: &str = "tidemark-operator";
const RBAC: &str = "rbac.authorization.k8s.io/v1";

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> Value {
    json!({ "apiGroups": [group], "resources": resources, "verbs": verbs })
}

/// The rules in one watched namespace (or, cluster-wide, in all of them).
pub fn rules(c: Capabilities) -> Vec<Value> {
    let read = ["get", "list", "watch"];
    let mut rules = vec![
        rule(
            "tidemark.io",
            &[
                "backuppolicies",
                "scheduledbackups",
                "backups",
                "volumeclaimretentions",
                "restores",
                "deletehooks",
            ],
            &read,
        ),
        rule(
            "tidemark.io",
            &[
                "backuppolicies/status",
                "scheduledbackups/status",
                "backups/status",
                "volumeclaimretentions/status",
                "restores/status",
                "deletehooks/status",
            ],
            &["patch"],
        ),
        rule("tidemark.io", &["backups"], &["create", "patch", "delete"]),
        rule("tidemark.io", &["restores"], &["patch"]),
    ];
    rules.push(if c.jobs {
        rule(
            "batch",
            &["jobs"],
            &["get", "list", "watch", "create", "delete"],
        )
    } else {
        rule("batch", &["jobs"], &read)
    });
    rules.push(if c.archiver {
        rule(
            "apps",
            &["deployments"],
            &["get", "list", "watch", "create", "patch", "delete"],
        )
    } else {
        rule("apps", &["deployments"], &read)
    });
    rules.push(if c.recreate {
        rule("", &["pods"], &["list", "watch", "delete"])
    } else {
        rule("", &["pods"], &["list", "watch"])
    });
    // A database's pod template, while it has no pod (scaled to 0 for a restore in place).
    rules.push(if c.recreate {
        rule("apps", &["statefulsets"], &["get", "list"])
    } else {
        rule("apps", &["statefulsets"], &["list"])
    });
    // The end of a backup or restore Job's log, kept in its object's status (`logTail`).
    rules.push(rule("", &["pods/log"], &["get"]));
    if c.exec {
        rules.push(rule("", &["pods/exec"], &["get", "create"]));
    }
    rules.push(rule(
        "",
        &["persistentvolumeclaims"],
        &["get", "list", "watch", "create", "patch", "delete"],
    ));
    rules.push(rule("", &["secrets"], &["get"]));
    rules.push(rule("events.k8s.io", &["events"], &["create", "patch"]));
    rules
}

/// What is cluster-scoped, so even a namespaced install reads it through a ClusterRole:
/// the reclaim policy of the volume a claim is bound to (PersistentVolumes), and the
/// architecture of the node a backup Job would run on (Nodes).
fn cluster_scoped_rules() -> [Value; 2] {
    [
        rule("", &["persistentvolumes"], &["get"]),
        rule("", &["nodes"], &["get"]),
    ]
}

fn subjects(i: &Install) -> Value {
    json!([{ "kind": "ServiceAccount", "name": i.service_account, "namespace": i.namespace }])
}

fn binding(kind: &str, name: &str, namespace: Option<&str>, role_kind: &str, i: &Install) -> Value {
    let mut metadata = json!({ "name": name });
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    json!({
        "apiVersion": RBAC,
        "kind": kind,
        "metadata": metadata,
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name },
        "subjects": subjects(i),
    })
}

/// Every object of the install: the namespace and ServiceAccount, the roles and their
/// bindings, and the leader-election Role.
/// The roles and bindings are named after the ServiceAccount.
pub fn manifests(i: &Install) -> Vec<Value> {
    let name = i.service_account.as_str();
    let mut out = vec![
        json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": i.namespace } }),
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": { "name": i.service_account, "namespace": i.namespace },
        }),
    ];
    let cluster_rules = if i.namespaces.is_empty() {
        let mut r = rules(i.capabilities);
        // In the order deploy/rbac.yaml has always had: after the claims.
        let at = r
            .iter()
            .position(|r| r["resources"][0] == "persistentvolumeclaims")
            .map_or(r.len(), |p| p + 1);
        r.splice(at..at, cluster_scoped_rules());
        r
    } else {
        cluster_scoped_rules().to_vec()
    };
    out.push(json!({
        "apiVersion": RBAC,
        "kind": "ClusterRole",
        "metadata": { "name": name },
        "rules": cluster_rules,
    }));
    out.push(binding("ClusterRoleBinding", name, None, "ClusterRole", i));
    for ns in &i.namespaces {
        out.push(json!({
            "apiVersion": RBAC,
            "kind": "Role",
            "metadata": { "name": name, "namespace": ns },
            "rules": rules(i.capabilities),
        }));
        out.push(binding("RoleBinding", name, Some(ns), "Role", i));
    }
    let leader = format!("{name}-leader");
    out.push(json!({
        "apiVersion": RBAC,
        "kind": "Role",
        "metadata": { "name": leader, "namespace": i.namespace },
        "rules": [rule("coordination.k8s.io", &["leases"], &["get", "create", "update"])],
    }));
    out.push(binding(
        "RoleBinding",
        &leader,
        Some(&i.namespace),
        "Role",
        i,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_by_name() {
        let c = Capabilities::without(&["exec".into(), "archiver".into()]).unwrap();
        assert!(!c.exec && c.jobs && !c.archiver);
        assert_eq!(c.disabled(), ["exec", "archiver"]);
        let e = Capabilities::without(&["pods".into()]).unwrap_err();
        assert!(
            e.contains("\"pods\"") && e.contains("exec, jobs, archiver"),
            "{e}"
        );
    }

    #[test]
    fn turned_off_rights_are_not_granted() {
        let all = serde_json::to_string(&rules(Capabilities::default())).unwrap();
        assert!(all.contains("pods/exec"));
        let none = Capabilities {
            exec: false,
            jobs: false,
            archiver: false,
            recreate: false,
        };
        let text = serde_json::to_string(&rules(none)).unwrap();
        assert!(!text.contains("pods/exec"), "{text}");
        for r in rules(none) {
            if r["resources"][0] == "jobs" || r["resources"][0] == "deployments" {
                assert_eq!(r["verbs"], json!(["get", "list", "watch"]));
            }
            if r["resources"][0] == "pods" {
                assert_eq!(r["verbs"], json!(["list", "watch"]));
            }
        }
        let pods = |c| {
            rules(c)
                .into_iter()
                .find(|r| r["resources"][0] == "pods")
                .map(|r| r["verbs"].clone())
        };
        assert_eq!(
            pods(Capabilities::default()),
            Some(json!(["list", "watch", "delete"]))
        );
    }

    #[test]
    fn a_namespaced_install_grants_nothing_cluster_wide_but_volumes() {
        let i = Install {
            namespaces: vec!["team-a".into(), "team-b".into()],
            ..Install::default()
        };
        let m = manifests(&i);
        let cluster: Vec<_> = m.iter().filter(|d| d["kind"] == "ClusterRole").collect();
        assert_eq!(cluster.len(), 1);
        assert_eq!(cluster[0]["rules"], json!(cluster_scoped_rules()));
        let roles: Vec<_> = m
            .iter()
            .filter(|d| d["kind"] == "Role" && d["metadata"]["name"] == NAME)
            .map(|d| d["metadata"]["namespace"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["team-a", "team-b"]);
    }
}
