//! The operations kit agrees with the operator: the alert rules pass Prometheus's own
//! `promtool` (syntax, and unit tests with series that fire every alert and series that do
//! not), every metric the rules and the dashboard query is one the operator exports, the
//! exported metrics pass `promtool check metrics`, and docs/operator.md lists exactly them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

fn path(p: &str) -> PathBuf {
    PathBuf::from(format!("{}/../../{p}", env!("CARGO_MANIFEST_DIR")))
}

fn read(p: &str) -> String {
    std::fs::read_to_string(path(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

use tidemark_operator::testkit::promtool;

fn yaml(p: &str) -> serde_json::Value {
    serde_saphyr::from_str(&read(p)).unwrap()
}

const RULES: &str = "deploy/helm/tidemark/files/alerts.yaml";
const RULE_TESTS: &str = "deploy/monitoring/alerts_test.yaml";
const DASHBOARD: &str = "deploy/helm/tidemark/files/dashboard.json";

#[test]
fn the_rules_pass_promtool_check_and_their_unit_tests() {
    for args in [
        vec!["check", "rules", RULES],
        vec!["test", "rules", RULE_TESTS],
    ] {
        let out = promtool()
            .current_dir(path(""))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Issue 46 §4: every alert links its runbook — its own section of docs/runbooks.md, which
/// says what it means, what to check and what to do — and the page has no section for an
/// alert that does not exist.
#[test]
fn every_alert_has_a_runbook() {
    const BASE: &str = "https://example.invalid/tidemark/blob/main/docs/runbooks.md";
    let rules = yaml(RULES);
    let page = read("docs/runbooks.md");
    let sections: Vec<&str> = page.split("\n## ").skip(1).collect();
    let mut alerts = BTreeSet::new();
    for rule in rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
    {
        let Some(alert) = rule["alert"].as_str() else {
            continue;
        };
        alerts.insert(alert.to_owned());
        assert_eq!(
            rule["annotations"]["runbook_url"],
            format!("{BASE}#{}", alert.to_lowercase()),
            "{alert}"
        );
        let section = sections
            .iter()
            .find(|s| s.lines().next() == Some(alert))
            .unwrap_or_else(|| panic!("docs/runbooks.md has no section {alert}"));
        for part in ["**Means.**", "**Check.**", "**Do.**"] {
            assert!(section.contains(part), "{alert}: no {part}");
        }
    }
    let documented: BTreeSet<String> = sections
        .iter()
        .filter_map(|s| s.lines().next().map(str::to_owned))
        .collect();
    assert_eq!(documented, alerts, "runbooks of alerts that do not exist");
}

/// Every alert has a unit test in which it fires and one in which it does not.
#[test]
fn every_alert_is_tested_firing_and_quiet() {
    let rules = yaml(RULES);
    let alerts: BTreeSet<String> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    let tests = yaml(RULE_TESTS);
    let cases: Vec<(String, bool)> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .map(|c| {
            (
                c["alertname"].as_str().unwrap().to_owned(),
                c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()),
            )
        })
        .collect();
    for alert in &alerts {
        for fires in [true, false] {
            assert!(
                cases.contains(&(alert.clone(), fires)),
                "{RULE_TESTS} has no case in which {alert} {}",
                if fires { "fires" } else { "stays quiet" }
            );
        }
    }
    for (name, _) in &cases {
        assert!(
            alerts.contains(name),
            "{RULE_TESTS} tests {name}, which is no alert"
        );
    }
}

/// The operator's metrics, with one series each, as `/metrics` serves them to a client
/// that does not ask for OpenMetrics (`text` false: as OpenMetrics).
fn exposition(text: bool) -> String {
    use tidemark_operator::metrics::{ControllerLabels, ErrorLabels, PassLabels, ScheduleLabels};
    let m = Arc::new(tidemark_operator::metrics::Metrics::default());
    let p = tidemark_operator::metrics::Metrics::policy("ns", "db");
    let result = PassLabels {
        namespace: "ns".into(),
        policy: "db".into(),
        result: "ok".into(),
    };
    m.retention_passes.get_or_create(&result).inc();
    m.backups.get_or_create(&result).inc();
    m.restores.get_or_create(&result).inc();
    for c in [&m.objects_deleted, &m.bytes_freed, &m.retention_failures] {
        c.get_or_create(&p).inc();
    }
    for g in [
        &m.recovery_window_seconds,
        &m.recovery_window_start,
        &m.recovery_window_end,
        &m.recovery_window_gaps,
        &m.recovery_window_promised,
        &m.point_in_time_start,
        &m.point_in_time_promised,
        &m.deletions_held,
        &m.store_bytes,
        &m.backups_kept,
        &m.last_successful_backup,
        &m.last_backup_duration,
        &m.last_restore_duration,
        &m.last_backup_size,
        &m.last_failed_backup,
        &m.restore_test_passed,
        &m.restore_test_last_run,
        &m.restore_test_duration,
        &m.restore_test_next_run,
        &m.restore_test_interval,
        &m.policy_created,
        &m.verification_passed,
        &m.verification_last_run,
        &m.binlog_archive_lag,
        &m.binlog_disk_bytes,
        &m.point_in_time_at_risk,
    ] {
        g.get_or_create(&p).set(1);
    }
    m.backup_took(&p, 90.0);
    m.schedule_interval
        .get_or_create(&ScheduleLabels {
            namespace: "ns".into(),
            policy: "db".into(),
            schedule: "nightly".into(),
        })
        .set(86_400);
    let copy = tidemark_operator::metrics::CopyLabels {
        namespace: "ns".into(),
        policy: "db".into(),
        copy: "dr".into(),
    };
    for g in [
        &m.copy_lag,
        &m.copy_last_run,
        &m.copy_window,
        &m.copy_max_lag,
        &m.copy_verification_passed,
        &m.copy_verification_last_run,
        &m.copy_restore_test_passed,
        &m.copy_restore_test_last_run,
    ] {
        g.get_or_create(&copy).set(1);
    }
    m.copy_bytes.get_or_create(&copy).inc();
    m.reconciles
        .get_or_create(&ControllerLabels {
            controller: "Backup".into(),
        })
        .inc();
    m.reconcile_errors
        .get_or_create(&ErrorLabels {
            controller: "Backup".into(),
            class: "store".into(),
        })
        .inc();
    m.leader.set(1);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &m.registry()).unwrap();
    // Every registered metric has its series here: a new one must be added above.
    let registered = read("crates/operator/src/metrics.rs")
        .matches("r.register(")
        .count();
    assert_eq!(
        out.lines().filter(|l| l.starts_with("# TYPE ")).count(),
        registered,
        "a metric without a series in this test:\n{out}"
    );
    if text {
        tidemark_operator::metrics::text_format(&out)
    } else {
        out
    }
}

/// The metrics the operator exports, by the name docs/operator.md lists: a counter's with
/// `_total`, a histogram's bare; with `samples`, a histogram's `_bucket`, `_sum` and
/// `_count` instead (what a query names).
fn exported_as(samples: bool) -> BTreeSet<String> {
    exposition(false)
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .flat_map(|l| {
            let mut f = l.split_whitespace();
            let (name, kind) = (f.next().unwrap(), f.next().unwrap());
            match kind {
                "counter" => vec![format!("{name}_total")],
                "histogram" if samples => ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .collect(),
                _ => vec![name.to_owned()],
            }
        })
        .collect()
}

fn exported() -> BTreeSet<String> {
    exported_as(false)
}

/// The `tidemark_…` names in `text`.
fn named(text: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"\btidemark_[a-z_]+").unwrap();
    re.find_iter(text).map(|m| m.as_str().to_owned()).collect()
}

#[test]
fn the_rules_and_the_dashboard_query_only_exported_metrics() {
    let exported = exported_as(true);
    assert!(exported.len() >= 25, "{exported:?}");
    let rules = yaml(RULES);
    let exprs: String = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| r["expr"].as_str().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join("\n");
    let dashboard: serde_json::Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    let mut queries = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            queries.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            queries.push(q.to_owned());
        }
    }
    for (what, text) in [("the rules", exprs), ("the dashboard", queries.join("\n"))] {
        let used = named(&text);
        assert!(!used.is_empty(), "{what} query no metric");
        let unknown: Vec<_> = used.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{what} query metrics the operator does not export: {unknown:?}"
        );
    }
}

#[test]
fn the_exported_metrics_pass_promtool_check_metrics() {
    tidemark_operator::testkit::check_metrics(&exposition(true));
}

/// docs/operator.md's metrics table lists exactly what the operator exports.
#[test]
fn every_metric_is_documented() {
    let docs = read("docs/operator.md");
    let start = docs
        .find("### Metrics")
        .expect("docs/operator.md: ### Metrics");
    let table = &docs[start..];
    let table = &table[..table[4..].find("\n### ").map_or(table.len(), |e| e + 4)];
    let documented: BTreeSet<String> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect();
    assert_eq!(
        documented,
        exported(),
        "docs/operator.md's ### Metrics table against the operator's registry"
    );
}

/// Every event reason the operator's code publishes is named in docs/operator.md. The
/// reasons are read from the source: the first reason-like literal after each way of
/// publishing (`.warn(`, `EventType::Normal|Warning,`, `reason: "`, a cleanup's
/// `event: Some((`).
#[test]
fn every_event_reason_is_documented() {
    let triggers = regex::Regex::new(
        r#"(?s)(?:\.warn\(|EventType::(?:Normal|Warning),|reason: |event: Some\(\()[^"]{0,160}?"([A-Z][a-z]+(?:[A-Z][a-z]*)+)""#,
    )
    .unwrap();
    let mut reasons = BTreeSet::new();
    let mut stack = vec![path("crates/operator/src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs")
                && !p.to_string_lossy().contains("testkit")
            {
                let text = std::fs::read_to_string(&p).unwrap();
                // Tests name reasons of their own; only the code that runs counts.
                let code = text.split("#[cfg(test)]").next().unwrap_or(&text);
                for c in triggers.captures_iter(code) {
                    reasons.insert(c[1].to_owned());
                }
            }
        }
    }
    assert!(reasons.len() >= 30, "too few reasons found: {reasons:?}");
    let docs = read("docs/operator.md");
    let missing: Vec<_> = reasons
        .iter()
        .filter(|r| !docs.contains(&format!("`{r}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "event reasons the operator publishes that docs/operator.md does not name: {missing:?}"
    );
}
