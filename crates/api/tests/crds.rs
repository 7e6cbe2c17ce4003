//! The generated CRDs: `deploy/crds/` matches the types, and the CEL rules accept and
//! refuse what they should, evaluated offline (the test API server, v1.20, has no CEL).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};
use tidemark_api::crd;

#[test]
fn deploy_crds_match_the_types() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/crds/tidemark.io.yaml"
    );
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = crd::yaml().unwrap();
    assert!(
        committed == generated,
        "deploy/crds/tidemark.io.yaml differs from the types; regenerate it with:\n  scripts/gen-deploy.sh"
    );
}

/// What the YAML writer (serde-saphyr: quoting, folded long strings) wrote reads back as
/// the CRDs themselves, with the same parser the files go through.
#[test]
fn deploy_crds_read_back_as_the_types() {
    let text = crd::yaml().unwrap();
    let read = tidemark_api::fields::yaml_documents(&text).unwrap();
    let types: Vec<Value> = crd::all()
        .iter()
        .map(|c| serde_json::to_value(c).unwrap())
        .collect();
    assert_eq!(read.len(), types.len());
    for (r, t) in read.iter().zip(&types) {
        assert!(r == t, "{} does not read back", t["metadata"]["name"]);
    }
}

/// Issue 46 §4: `kubectl get` shows health — Ready and Reason columns, from the Ready
/// condition, on every kind.
#[test]
fn every_kind_shows_its_ready_condition() {
    let kinds: Vec<String> = crd::all().into_iter().map(|c| c.spec.names.kind).collect();
    assert_eq!(kinds.len(), 6, "{kinds:?}");
    for kind in kinds {
        let crd = crd::all()
            .into_iter()
            .find(|c| c.spec.names.kind == kind)
            .unwrap();
        let columns: Vec<(String, String)> = crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| (c.name.clone(), c.json_path.clone()))
            .collect();
        for (name, field) in [("Ready", "status"), ("Reason", "reason")] {
            let want = (
                name.to_owned(),
                format!(".status.conditions[?(@.type==\"Ready\")].{field}"),
            );
            assert!(columns.contains(&want), "{kind}: {columns:?}");
        }
        assert_eq!(columns.last().map(|c| c.0.as_str()), Some("Age"), "{kind}");
    }
}

/// The openAPIV3Schema of the CRD for `kind`.
fn schema(kind: &str) -> Value {
    let crd = crd::all()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

/// The messages of the CEL rules `object` breaks (empty: accepted).
fn refusals(kind: &str, spec: Value) -> Vec<String> {
    refusals_named(kind, "x", spec)
}

fn refusals_named(kind: &str, name: &str, spec: Value) -> Vec<String> {
    let object = json!({
        "apiVersion": "tidemark.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    });
    match kube::core::cel::Validator::new().validate(&schema(kind), &object, None) {
        Ok(()) => Vec::new(),
        Err(e) => e
            .into_vec()
            .into_iter()
            .map(|e| format!("{}: {}", e.field_path, e.message))
            .collect(),
    }
}

fn assert_refused(kind: &str, spec: Value, expected: &str) {
    let got = refusals(kind, spec.clone());
    assert!(
        got.iter().any(|m| m.contains(expected)),
        "{kind} {spec}: expected a refusal containing {expected:?}, got {got:?}"
    );
}

fn assert_accepted(kind: &str, spec: Value) {
    let got = refusals(kind, spec.clone());
    assert!(got.is_empty(), "{kind} {spec}: refused: {got:?}");
}

#[test]
fn a_retention_policy_requires_an_object_store() {
    assert_refused(
        "BackupPolicy",
        json!({"retention": {"keepLast": 3}}),
        "a retention policy requires spec.objectStore",
    );
    assert_accepted(
        "BackupPolicy",
        json!({"retention": {"keepLast": 3}, "objectStore": {"bucket": "b"}}),
    );
    assert_accepted("BackupPolicy", json!({}));
}

#[test]
fn an_object_store_names_exactly_one_of_url_and_bucket() {
    assert_refused(
        "BackupPolicy",
        json!({"objectStore": {"url": "file:///b", "bucket": "b"}}),
        "set exactly one of url",
    );
    assert_refused(
        "BackupPolicy",
        json!({"objectStore": {"path": "p"}}),
        "set exactly one of url",
    );
    assert_accepted("BackupPolicy", json!({"objectStore": {"url": "file:///b"}}));
}

#[test]
fn retention_durations_follow_the_grammar() {
    for good in ["30d", "4w", "12mo", "12m"] {
        assert_accepted(
            "BackupPolicy",
            json!({"objectStore": {"bucket": "b"}, "retention": {"window": good, "failedBackupsTTL": good}}),
        );
    }
    for bad in ["30", "30x", "d", "-1d", "1.5d", "30 d", "3mm", "3om", "mo"] {
        assert_refused(
            "BackupPolicy",
            json!({"objectStore": {"bucket": "b"}, "retention": {"window": bad}}),
            "expected <n>d, <n>w or <n>mo",
        );
        assert_refused(
            "Backup",
            json!({"policy": {"name": "p"}, "ttl": bad}),
            "expected <n>d, <n>w or <n>mo",
        );
    }
    for zero in ["0d", "0mo", "0m"] {
        assert_refused(
            "BackupPolicy",
            json!({"objectStore": {"bucket": "b"}, "retention": {"window": zero}}),
            "a window of 0 keeps only the newest backup",
        );
    }
    assert_refused(
        "BackupPolicy",
        json!({"objectStore": {"bucket": "b"}, "retention": {"keepLast": 0}}),
        "keepLast must be at least 1",
    );
    assert_refused(
        "BackupPolicy",
        json!({"retentionInterval": "1 hour"}),
        "expected an interval",
    );
    assert_accepted("BackupPolicy", json!({"retentionInterval": "1h30m"}));
}

/// Every interval is bounded at admission, and the CEL rule and the operator's own check
/// (for API servers without CEL) agree on each value.
#[test]
fn intervals_are_bounded_and_cel_agrees_with_the_code() {
    use tidemark_api::interval::{
        BINLOG_INTERVAL, HOOK_TIMEOUT, IntervalField, PRIMARY_READY_FOR, RETENTION_INTERVAL,
    };
    let values = [
        "1s",
        "30s",
        "10m",
        "1h",
        "1h30m",
        "60m",
        "3600s",
        "3601s",
        "61m",
        "2h",
        "168h",
        "169h",
        "167h60m",
        "0s",
        "0h0m0s",
        "70000000h",
        "99999h",
        "24h",
        "24h1s",
        "2562048h",
        "1 hour",
        "1d",
        "-1h",
        "h",
        "10",
        "",
        "1h1h",
        "00001s",
    ];
    type Spec = fn(&str) -> Value;
    let kinds: [(&str, &IntervalField, Spec); 4] = [
        (
            "BackupPolicy",
            &RETENTION_INTERVAL,
            |v| json!({"retentionInterval": v}),
        ),
        (
            "BackupPolicy",
            &BINLOG_INTERVAL,
            |v| json!({"binlogArchive": {"server": {"host": "db"}, "interval": v}}),
        ),
        (
            "BackupPolicy",
            &PRIMARY_READY_FOR,
            |v| json!({"source": {"selector": {}, "primaryReadyFor": v}}),
        ),
        (
            "DeleteHook",
            &HOOK_TIMEOUT,
            |v| json!({"command": ["true"], "timeout": v}),
        ),
    ];
    for (kind, field, spec) in kinds {
        for v in values {
            let cel = refusals(kind, spec(v)).is_empty();
            let code = field.parse(Some(v));
            assert_eq!(
                cel,
                code.is_ok(),
                "{kind} {} = {v:?}: CEL {} but the code {code:?}",
                field.field,
                if cel { "accepts" } else { "refuses" },
            );
        }
    }
    assert_refused(
        "BackupPolicy",
        json!({"retentionInterval": "70000000h"}),
        "from 1s to 168h",
    );
    assert_refused(
        "DeleteHook",
        json!({"command": ["true"], "timeout": "2h"}),
        "from 1s to 1h",
    );
}

/// Compression settings (issue 19 §1): the CEL rule on `objectStore.compression` and on a
/// Backup's / ScheduledBackup's `compression` accepts exactly what the code parses.
#[test]
fn compression_settings_cel_agrees_with_the_code() {
    let values = [
        "none", "zstd", "zstd:1", "zstd:3", "zstd:9", "zstd:19", "zstd:20", "zstd:0", "zstd:03",
        "zstd:", "zstd:-1", "gzip", "ZSTD", "none:1", "", "zstd:3 ", "lz4",
    ];
    type Spec = fn(&str) -> Value;
    let kinds: [(&str, Spec); 3] = [
        (
            "BackupPolicy",
            |v| json!({"objectStore": {"url": "file:///b", "compression": v}}),
        ),
        (
            "Backup",
            |v| json!({"policy": {"name": "p"}, "compression": v}),
        ),
        (
            "ScheduledBackup",
            |v| json!({"schedule": "0 0 2 * * *", "policy": {"name": "p"}, "compression": v}),
        ),
    ];
    for (kind, spec) in kinds {
        for v in values {
            let cel = refusals(kind, spec(v)).is_empty();
            let code = v.parse::<tidemark_core::compression::Compression>();
            assert_eq!(
                cel,
                code.is_ok(),
                "{kind} compression = {v:?}: CEL {} but the code {code:?}",
                if cel { "accepts" } else { "refuses" },
            );
        }
    }
    assert_refused(
        "BackupPolicy",
        json!({"objectStore": {"url": "file:///b", "compression": "zstd:22"}}),
        "zstd:<level>",
    );
}

#[test]
fn a_schedule_has_six_fields_or_is_a_macro_never_five() {
    for good in [
        "0 0 2 * * *",
        "*/30 * * * * MON-FRI",
        " 0 0 2 * * 0 ",
        "@daily",
        "@Weekly",
        " @hourly ",
    ] {
        assert_accepted(
            "ScheduledBackup",
            json!({"schedule": good, "policy": {"name": "p"}}),
        );
        assert_accepted(
            "BackupPolicy",
            json!({"restoreTest": {"schedule": good}, "verify": {"schedule": good}}),
        );
    }
    // Seed 001: five fields are refused ("0 2 * * *" would be read shifted).
    for bad in [
        "0 2 * * *",
        "2 * * *",
        "0 0 2 * * * 2030",
        "",
        "@reboot",
        "@every 5m",
        "@daily 0",
    ] {
        assert_refused(
            "ScheduledBackup",
            json!({"schedule": bad, "policy": {"name": "p"}}),
            "expected six fields, seconds first",
        );
        assert_refused(
            "BackupPolicy",
            json!({"restoreTest": {"schedule": bad}}),
            "five fields are refused",
        );
        assert_refused(
            "BackupPolicy",
            json!({"verify": {"schedule": bad}}),
            "five fields are refused",
        );
    }
    assert_refused(
        "ScheduledBackup",
        json!({"schedule": "0 0 2 * * *", "policy": {"name": ""}}),
        "name the BackupPolicy",
    );
}

#[test]
fn a_delete_hook_has_exactly_one_action() {
    assert_refused(
        "DeleteHook",
        json!({}),
        "set exactly one of job, webhook and command",
    );
    assert_refused(
        "DeleteHook",
        json!({"command": ["true"], "webhook": {"url": "https://x"}}),
        "set exactly one",
    );
    assert_refused(
        "DeleteHook",
        json!({"webhook": {"url": "http://x"}}),
        "expected an https:// URL",
    );
    assert_accepted(
        "DeleteHook",
        json!({"webhook": {"url": "https://hooks.example/b"}}),
    );
}

#[test]
fn enums_are_in_the_schema() {
    let s = schema("Backup");
    let spec = &s["properties"]["spec"]["properties"];
    assert_eq!(
        spec["method"]["enum"],
        json!([
            "mariabackup",
            "xtrabackup",
            "exec",
            "job",
            "mysql-clone",
            "mysqldump"
        ])
    );
    assert_eq!(spec["target"]["enum"], json!(["primary", "prefer-standby"]));
    assert_eq!(spec["type"]["enum"], json!(["full", "incremental"]));
    let s = schema("ScheduledBackup");
    assert_eq!(
        s["properties"]["spec"]["properties"]["backupOwnerReference"]["enum"],
        json!(["self", "cluster", "none"])
    );
    let s = schema("BackupPolicy");
    // An optional enum also lists null (kube's OptionalEnum).
    assert_eq!(
        s["properties"]["spec"]["properties"]["deletionPolicy"]["enum"],
        json!(["Retain", "Delete", null])
    );
}

#[test]
fn every_kind_has_status_short_names_and_columns() {
    for c in crd::all() {
        let v = &c.spec.versions[0];
        assert!(
            c.spec
                .names
                .short_names
                .as_ref()
                .is_some_and(|s| !s.is_empty()),
            "{}",
            c.spec.names.kind
        );
        assert!(
            v.additional_printer_columns.is_some(),
            "{}",
            c.spec.names.kind
        );
        assert_eq!(c.spec.group, "tidemark.io");
        assert_eq!(v.name, "v1alpha1");
        if c.spec.names.kind != "DeleteHook" {
            assert!(
                v.subresources.as_ref().is_some_and(|s| s.status.is_some()),
                "{}",
                c.spec.names.kind
            );
        }
    }
    let stripped = crd::without_cel(&crd::all()[0]);
    let text = serde_json::to_string(&stripped).unwrap();
    assert!(!text.contains("x-kubernetes-validations"));
    assert_eq!(
        stripped["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["deletionPolicy"]["enum"],
        json!(["Retain", "Delete"])
    );
}

/// Names that become label values on what the operator creates are at most 63 characters.
#[test]
fn schedule_and_policy_names_fit_a_label_value() {
    let schedule = json!({"schedule": "0 0 2 * * *", "policy": {"name": "db"}});
    for (kind, spec) in [("ScheduledBackup", schedule), ("BackupPolicy", json!({}))] {
        assert!(refusals_named(kind, &"s".repeat(63), spec.clone()).is_empty());
        let got = refusals_named(kind, &"s".repeat(64), spec);
        assert!(
            got.iter().any(|m| m.contains("at most 63 characters")),
            "{kind}: {got:?}"
        );
    }
}

/// Every name a spec carries has the schema pattern of its kind of Kubernetes name, which
/// API servers of every version enforce (unlike CEL).
#[test]
fn names_in_specs_carry_their_pattern() {
    let crd = serde_json::to_value(crd::all()).unwrap();
    for (field, pattern) in [
        ("credentialsSecret", tidemark_api::names::SUBDOMAIN_PATTERN),
        ("container", tidemark_api::names::LABEL_PATTERN),
        ("dataVolume", tidemark_api::names::LABEL_PATTERN),
        ("roleLabel", tidemark_api::names::LABEL_KEY_PATTERN),
    ] {
        let schema = find(&crd, field);
        assert_eq!(schema["pattern"], pattern, "{field}: {schema}");
    }
    let policy_ref =
        &schema("Backup")["properties"]["spec"]["properties"]["policy"]["properties"]["name"];
    assert_eq!(
        policy_ref["pattern"],
        tidemark_api::names::SUBDOMAIN_PATTERN,
        "{policy_ref}"
    );
}

/// The first schema property named `name` anywhere in `v`.
fn find<'a>(v: &'a Value, name: &str) -> &'a Value {
    fn walk<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
        match v {
            Value::Object(m) => m
                .get("properties")
                .and_then(|p| p.get(name))
                .or_else(|| m.values().find_map(|x| walk(x, name))),
            Value::Array(a) => a.iter().find_map(|x| walk(x, name)),
            _ => None,
        }
    }
    walk(v, name).unwrap_or_else(|| panic!("no property {name}"))
}

#[test]
fn secret_keys_by_reference_come_whole() {
    let source = |extra: Value| {
        let mut s = json!({"selector": {"matchLabels": {"app": "db"}}});
        s.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"source": s})
    };
    let r = |name: &str, key: &str| json!({"name": name, "key": key});
    // Both by reference, or one beside credentialsSecret (its default key for the other).
    for ok in [
        json!({"usernameFrom": r("root", "user"), "passwordFrom": r("root", "root-password")}),
        json!({"credentialsSecret": "db", "passwordFrom": r("root", "root-password")}),
        json!({"credentialsSecret": "db", "usernameFrom": r("root", "user")}),
        json!({"credentialsSecret": "db"}),
        json!({}),
    ] {
        assert_accepted("BackupPolicy", source(ok));
    }
    for half in [
        json!({"usernameFrom": r("root", "user")}),
        json!({"passwordFrom": r("root", "root-password")}),
    ] {
        assert_refused(
            "BackupPolicy",
            source(half),
            "set passwordFrom with usernameFrom",
        );
    }
    let store = |extra: Value| {
        let mut s = json!({"bucket": "b"});
        s.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"objectStore": s})
    };
    assert_accepted(
        "BackupPolicy",
        store(
            json!({"credentialsSecret": "s3", "credentialsKeys": {"accessKeyId": "ACCESS_KEY_ID"}}),
        ),
    );
    assert_refused(
        "BackupPolicy",
        store(json!({"credentialsKeys": {"accessKeyId": "ACCESS_KEY_ID"}})),
        "credentialsKeys names keys of credentialsSecret",
    );
    assert_accepted(
        "BackupPolicy",
        store(json!({"encryption": {"identityFrom": r("age", "key.txt")}})),
    );
    assert_refused(
        "BackupPolicy",
        store(
            json!({"encryption": {"identitySecret": "age", "identityFrom": r("age", "key.txt")}}),
        ),
        "set one of identitySecret",
    );
}
