//! `deploy/` agrees with itself: the Helm chart carries the same CRDs and RBAC as the plain
//! manifests, and the Deployment runs as the ServiceAccount the RBAC binds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_yaml::Value;

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

#[test]
fn the_chart_rbac_is_deploy_rbac() {
    let chart = read("deploy/helm/tidemark/templates/rbac.yaml")
        .replace("{{ .Release.Namespace }}", "tidemark-system")
        .replace("{{ .Values.serviceAccount.name }}", "tidemark-operator")
        .lines()
        .filter(|l| !l.trim_start().starts_with("{{"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        !chart.contains("{{"),
        "unexpected template expression:\n{chart}"
    );
    let plain: Vec<Value> = docs(&read("deploy/rbac.yaml"))
        .into_iter()
        .filter(|d| d["kind"] != "Namespace")
        .collect();
    assert_eq!(
        docs(&chart),
        plain,
        "deploy/helm/tidemark/templates/rbac.yaml differs from deploy/rbac.yaml"
    );
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
