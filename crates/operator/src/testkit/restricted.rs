//! The Pod Security Standards' `restricted` level (with `baseline`, which it includes),
//! checked on a pod spec: Kubernetes 1.20, which the tests run, has no Pod Security
//! admission, so the tests check the level's rules themselves and the real node shows that
//! pods made to meet them still work.
//!
//! Rules as the standard states them (kubernetes.io/docs/concepts/security/
//! pod-security-standards): host namespaces, privileged containers, added capabilities
//! beyond `NET_BIND_SERVICE`, `hostPath` volumes and host ports are refused (baseline);
//! only ephemeral and claim-like volume kinds, no privilege escalation, non-root with no
//! user 0, a `RuntimeDefault` or `Localhost` seccomp profile and `drop: [ALL]` are required
//! (restricted).

use k8s_openapi::api::core::v1::{Container, PodSpec, SeccompProfile};

/// What in `spec` breaks the `restricted` level, one line per rule and container; empty
/// when the pod would be admitted by a namespace that enforces it.
pub fn restricted_violations(spec: &PodSpec) -> Vec<String> {
    let mut found = Vec::new();
    let pod = spec.security_context.clone().unwrap_or_default();
    for (what, set) in [
        ("hostNetwork", spec.host_network),
        ("hostPID", spec.host_pid),
        ("hostIPC", spec.host_ipc),
    ] {
        if set == Some(true) {
            found.push(format!("{what} is set"));
        }
    }
    const VOLUME_KINDS: [&str; 8] = [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ];
    for v in spec.volumes.iter().flatten() {
        let json = serde_json::to_value(v).unwrap_or_default();
        let kinds: Vec<&String> = json
            .as_object()
            .map(|o| o.keys().filter(|k| *k != "name").collect())
            .unwrap_or_default();
        for k in kinds {
            if !VOLUME_KINDS.contains(&k.as_str()) {
                found.push(format!("volume {} is of kind {k}", v.name));
            }
        }
    }
    let pod_seccomp = pod.seccomp_profile.as_ref();
    if pod.run_as_user == Some(0) {
        found.push("the pod runs as user 0".into());
    }
    if pod_seccomp.is_some_and(|p| !confined(p)) {
        found.push("the pod's seccomp profile is Unconfined".into());
    }
    let all: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .collect();
    for c in all {
        let name = &c.name;
        let sc = c.security_context.clone().unwrap_or_default();
        if sc.privileged == Some(true) {
            found.push(format!("container {name} is privileged"));
        }
        if c.ports
            .iter()
            .flatten()
            .any(|p| p.host_port.unwrap_or(0) != 0)
        {
            found.push(format!("container {name} uses a host port"));
        }
        if sc.allow_privilege_escalation != Some(false) {
            found.push(format!(
                "container {name} does not set allowPrivilegeEscalation: false"
            ));
        }
        let non_root = sc.run_as_non_root.or(pod.run_as_non_root);
        if non_root != Some(true) {
            found.push(format!(
                "container {name} does not set runAsNonRoot: true (nor does the pod)"
            ));
        }
        if sc.run_as_user == Some(0) {
            found.push(format!("container {name} runs as user 0"));
        }
        match sc.seccomp_profile.as_ref().or(pod_seccomp) {
            Some(p) if confined(p) => {}
            _ => found.push(format!(
                "container {name} has no RuntimeDefault or Localhost seccomp profile (nor does the pod)"
            )),
        }
        let caps = sc.capabilities.unwrap_or_default();
        if !caps.drop.iter().flatten().any(|d| d == "ALL") {
            found.push(format!("container {name} does not drop ALL capabilities"));
        }
        for add in caps.add.iter().flatten() {
            if add != "NET_BIND_SERVICE" {
                found.push(format!("container {name} adds capability {add}"));
            }
        }
    }
    found
}

fn confined(p: &SeccompProfile) -> bool {
    p.type_ == "RuntimeDefault" || p.type_ == "Localhost"
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec(json: serde_json::Value) -> PodSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_restricted_pod_passes_and_each_rule_is_seen() {
        let ok = serde_json::json!({
            "securityContext": {"runAsNonRoot": true, "runAsUser": 999,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
                        {"name": "t", "emptyDir": {}}],
            "containers": [{"name": "db", "image": "x", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
        });
        assert_eq!(
            restricted_violations(&spec(ok.clone())),
            Vec::<String>::new()
        );
        let broken = |path: &[&str], value: serde_json::Value| {
            let mut j = ok.clone();
            let (last, parents) = path.split_last().unwrap();
            let pointer: String = parents.iter().map(|p| format!("/{p}")).collect();
            let at = j.pointer_mut(&pointer).unwrap();
            match last.parse::<usize>() {
                Ok(i) => at[i] = value,
                Err(_) => at[*last] = value,
            }
            restricted_violations(&spec(j))
        };
        let c = ["containers", "0", "securityContext"];
        for (path, value) in [
            (&["hostNetwork"][..], serde_json::json!(true)),
            (
                &["securityContext", "runAsNonRoot"][..],
                serde_json::json!(false),
            ),
            (&["securityContext", "runAsUser"][..], serde_json::json!(0)),
            (
                &["securityContext", "seccompProfile"][..],
                serde_json::json!({"type": "Unconfined"}),
            ),
            (
                &["volumes", "1"][..],
                serde_json::json!({"name": "h", "hostPath": {"path": "/"}}),
            ),
            (
                &[c[0], c[1], c[2], "allowPrivilegeEscalation"][..],
                serde_json::json!(true),
            ),
            (
                &[c[0], c[1], c[2], "privileged"][..],
                serde_json::json!(true),
            ),
            (
                &[c[0], c[1], c[2], "capabilities"][..],
                serde_json::json!({"drop": ["NET_RAW"]}),
            ),
            (
                &[c[0], c[1], c[2], "capabilities"][..],
                serde_json::json!({"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
            ),
        ] {
            assert!(
                !broken(path, value.clone()).is_empty(),
                "{path:?} = {value} passed"
            );
        }
    }
}
