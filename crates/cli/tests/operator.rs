//! The operator's Backup Job, played on the node: the real operator (as its ServiceAccount,
//! against a real kube-apiserver) creates the Job for a Backup; with no kubelet here, the
//! test plays the node — it runs the Job's init container and container commands as local
//! processes with the Job's environment (Secrets resolved as a kubelet would, the Job's
//! mounts mapped to local directories) against a real MariaDB and SeaweedFS, and writes
//! the Job's status back. The backup the Job describes really runs, and a point-in-time
//! restore of it gives the exact row counts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPolicy};
use tidemark_operator::testkit::{ExecRequest, KubeCluster, Kubelet, Operator, events, eventually};
use tidemark_store::testkit::{ACCESS_KEY, BUCKET, MariaDb, SECRET_KEY, SeaweedFs, query_restored};

/// With `#` and `\`, which an unquoted option file would misread.
const DB_PASSWORD: &str = "pw-Xy7#do\\not-leak";

async fn secret(client: &Client, ns: &str, name: &str, data: &[(&str, &str)]) {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let data: BTreeMap<String, ByteString> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect();
    api.create(
        &PostParams::default(),
        &Secret {
            data: Some(data),
            metadata: tidemark_operator::testkit::policy_secret_meta(name, ns),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// The `shop.orders` table, and an account `user` with [`DB_PASSWORD`] that reaches the
/// server over TCP (and as `localhost`, which MariaDB's anonymous account would shadow).
fn shop_with_login(db: &MariaDb, user: &str) {
    // In SQL a backslash is an escape: double it so the server stores the password as is.
    let sql_password = DB_PASSWORD.replace('\\', "\\\\");
    db.sql(&format!(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT); \
         CREATE USER '{user}'@'%' IDENTIFIED BY '{sql_password}'; GRANT ALL ON *.* TO '{user}'@'%'; \
         CREATE USER '{user}'@'localhost' IDENTIFIED BY '{sql_password}'; GRANT ALL ON *.* TO '{user}'@'localhost';"
    ));
}

/// An env var's value as a kubelet would give it (literal, or from a Secret key).
async fn env_value(client: &Client, ns: &str, e: &k8s_openapi::api::core::v1::EnvVar) -> String {
    if let Some(v) = &e.value {
        return v.clone();
    }
    let r = e
        .value_from
        .as_ref()
        .and_then(|f| f.secret_key_ref.as_ref())
        .unwrap_or_else(|| panic!("env {} has neither value nor secretKeyRef", e.name));
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let s = api.get(&r.name).await.unwrap();
    let bytes = s.data.unwrap().remove(&r.key).unwrap().0;
    String::from_utf8(bytes).unwrap()
}

/// Plays the node for `job`: runs its init containers, then its container, with `mounts`
/// mapping each mount path to a local directory; then writes the Job's status.
async fn play_node(client: &Client, job: &Job, mounts: &[(&str, &Path)]) -> std::process::Output {
    let ns = job.namespace().unwrap();
    let spec = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let map = |s: &str| {
        mounts.iter().fold(s.to_owned(), |acc, (from, to)| {
            acc.replace(from, to.to_str().unwrap())
        })
    };
    let mut last = None;
    let steps = spec
        .init_containers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .chain(spec.containers.clone());
    for c in steps {
        let mut argv: Vec<String> = c.command.clone().unwrap_or_default();
        argv.extend(c.args.clone().unwrap_or_default());
        let argv: Vec<String> = argv.iter().map(|a| map(a)).collect();
        // The operator image's `/tidemark` is this build's binary.
        let program = if argv[0] == "/tidemark" {
            env!("CARGO_BIN_EXE_tidemark").to_owned()
        } else {
            argv[0].clone()
        };
        let mut cmd = std::process::Command::new(program);
        cmd.args(&argv[1..])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap());
        for e in c.env.clone().unwrap_or_default() {
            cmd.env(&e.name, env_value(client, &ns, &e).await);
        }
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        let ok = out.status.success();
        last = Some(out);
        if !ok {
            break;
        }
    }
    let out = last.unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let now = Timestamp::now().to_string();
    let (kind, counts) = if out.status.success() {
        ("Complete", json!({"succeeded": 1}))
    } else {
        ("Failed", json!({"failed": 1}))
    };
    let mut status = json!({
        "startTime": now, "conditions": [{"type": kind, "status": "True", "lastProbeTime": now, "lastTransitionTime": now, "message": "played by the test"}],
    });
    status
        .as_object_mut()
        .unwrap()
        .extend(counts.as_object().unwrap().clone());
    if out.status.success() {
        status["completionTime"] = json!(now);
    }
    jobs.patch_status(
        &job.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap();
    out
}

/// The database pod `db-0` as a StatefulSet would make it: the primary, on node-1, its
/// data in /var/lib/mysql, in `mariadb:11.4`. No kubelet runs it: it stays Pending (until
/// `testkit::mark_running`). Returns the pod as given (a copy to make others from).
async fn create_primary_pod(client: &Client, ns: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "db-0", "namespace": ns, "labels": {"app": "db", "tidemark.io/role": "primary"}},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "mariadb", "image": "mariadb:11.4", "volumeMounts": [{"name": "data", "mountPath": "/var/lib/mysql"}]}],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    pod
}

/// Issue 46 §4: a backup whose database pod runs on a node of another architecture than
/// the operator's binary (which its Job would copy into the database image) fails at once,
/// naming the node, its architecture and the one the image is built for — no Job, no
/// `exec format error` later. The same pod on a node of the operator's own architecture
/// gets its Job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_on_a_node_of_another_architecture_fails_at_once() {
    use k8s_openapi::api::core::v1::Node;
    let s3 = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "arch";
    cluster.namespace(ns).await;
    secret(
        &admin,
        ns,
        "s3",
        &[("accessKeyId", ACCESS_KEY), ("secretAccessKey", SECRET_KEY)],
    )
    .await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": s3.endpoint, "credentialsSecret": "s3"},
            "source": {"selector": {"matchLabels": {"app": "db"}}, "container": "mariadb"},
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let other = if std::env::consts::ARCH == "aarch64" {
        "amd64"
    } else {
        "arm64"
    };
    let nodes: Api<Node> = Api::all(admin.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "node-1", "labels": {"kubernetes.io/arch": other}},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    create_primary_pod(&admin, ns).await;
    tidemark_operator::testkit::mark_running(&admin, ns, "db-0").await;
    let op = Operator::start(&cluster, "operator-arch");
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let backup = |name: &str| -> Backup {
        serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"policy": {"name": "shop"}, "method": "mariabackup", "target": "primary"},
        }))
        .unwrap()
    };
    backups
        .create(&PostParams::default(), &backup("on-another-node"))
        .await
        .unwrap();
    let st = eventually("the Backup failed", || async {
        let s = serde_json::to_value(backups.get("on-another-node").await.unwrap().status).unwrap();
        (s["phase"] == "failed").then_some(s)
    })
    .await;
    let ours = if other == "arm64" { "amd64" } else { "arm64" };
    let error = st["error"].as_str().unwrap();
    for part in [
        "the database pod db-0 runs on node node-1",
        &format!("whose architecture is {other}"),
        &format!("built for {ours} only"),
    ] {
        assert!(error.contains(part), "{part:?} not in {error}");
    }
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    assert!(
        jobs.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // The node of the operator's own architecture: the Job is made.
    let patch = json!({"metadata": {"labels": {"kubernetes.io/arch": ours}}});
    nodes
        .patch("node-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    backups
        .create(&PostParams::default(), &backup("on-its-node"))
        .await
        .unwrap();
    eventually("the backup Job", || async {
        backups.get("on-its-node").await.unwrap().status?.job_name
    })
    .await;
    op.stop().await;
}

fn tidemark(s3: &SeaweedFs, args: &[&str]) -> std::process::Output {
    common::on_store(s3, "shop", args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_job_on_the_node_then_point_in_time_restore() {
    let s3 = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let db = tokio::task::spawn_blocking(MariaDb::start).await.unwrap();
    shop_with_login(&db, "backup");
    let insert = |n: usize| {
        let values: Vec<String> = (0..n).map(|i| format!("({i})")).collect();
        db.sql(&format!(
            "INSERT INTO shop.orders (v) VALUES {}",
            values.join(",")
        ));
    };
    insert(10);

    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "prod";
    cluster.namespace(ns).await;
    secret(
        &admin,
        ns,
        "s3",
        &[("accessKeyId", ACCESS_KEY), ("secretAccessKey", SECRET_KEY)],
    )
    .await;
    secret(
        &admin,
        ns,
        "db",
        &[("username", "backup"), ("password", DB_PASSWORD)],
    )
    .await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": s3.endpoint, "credentialsSecret": "s3"},
            "source": {"selector": {"matchLabels": {"app": "db"}}, "container": "mariadb", "port": db.port, "credentialsSecret": "db"},
            "retention": {"keepLast": 5},
            "resources": {
                "install": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                "backup": {"requests": {"cpu": 1, "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
            },
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let pod = create_primary_pod(&admin, ns).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);

    let op = Operator::start(&cluster, "operator-backup");
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let b: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "manual-1", "namespace": ns},
        "spec": {"policy": {"name": "shop"}, "method": "mariabackup", "target": "primary"},
    }))
    .unwrap();
    backups.create(&PostParams::default(), &b).await.unwrap();

    // The pod is not running: a condition, not a hung Job.
    let st = eventually("Blocked: DatabasePodNotRunning", || async {
        let s = serde_json::to_value(backups.get("manual-1").await.unwrap().status).unwrap();
        (s["conditions"][0]["reason"] == "DatabasePodNotRunning").then_some(s)
    })
    .await;
    assert_eq!(st["phase"], "pending", "{st}");
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    assert!(
        jobs.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    tidemark_operator::testkit::mark_running(&admin, ns, "db-0").await;
    let job = eventually("the backup Job", || async {
        let name = backups.get("manual-1").await.unwrap().status?.job_name?;
        jobs.get_opt(&name).await.unwrap()
    })
    .await;
    assert!(
        job.name_any().starts_with("manual-1-") && job.name_any().ends_with("-backup"),
        "{}",
        job.name_any()
    );
    // Pinned to the pod's node, in the database container's image, the data volume mounted.
    let text = serde_json::to_string(&job).unwrap();
    assert!(text.contains("\"node-1\""), "{text}");
    assert!(text.contains("kubernetes.io/hostname"), "{text}");
    let pod_spec = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(
        pod_spec.containers[0].image.as_deref(),
        Some("mariadb:11.4")
    );
    // The policy's resources, as the API server stored them (a quantity given as a number
    // included).
    let resources = |c: &k8s_openapi::api::core::v1::Container| {
        serde_json::to_value(c.resources.as_ref().unwrap()).unwrap()
    };
    assert_eq!(
        resources(&pod_spec.containers[0]),
        json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}})
    );
    assert_eq!(
        resources(&pod_spec.init_containers.as_ref().unwrap()[0]),
        json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}})
    );
    assert!(
        pod_spec.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.mount_path == "/var/lib/mysql")
    );
    assert!(
        !text.contains(DB_PASSWORD) && !text.contains(SECRET_KEY),
        "a secret in the Job"
    );

    let tools = tempfile::tempdir().unwrap();
    let out = play_node(
        &admin,
        &job,
        &[
            ("/tidemark-bin", tools.path()),
            ("/var/lib/mysql", &db.datadir),
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "the Job's container failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = eventually("phase completed", || async {
        let s = serde_json::to_value(backups.get("manual-1").await.unwrap().status).unwrap();
        (s["phase"] == "completed").then_some(s)
    })
    .await;
    let id = st["backupId"].as_str().unwrap().to_owned();
    assert_eq!(st["jobName"], job.name_any().as_str());
    assert!(
        st["checksum"].as_str().unwrap().starts_with("sha256:"),
        "{st}"
    );
    assert!(st["size"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["key"], format!("manual-1/{id}/metadata.json"));
    // Counted once, with its size and duration as the last backup's.
    let metrics = op.get("/metrics").await.1;
    for series in [
        r#"tidemark_backups_total{namespace="prod",policy="shop",result="succeeded"} 1"#,
        r#"tidemark_backups_total{namespace="prod",policy="shop",result="failed"} 0"#,
        &format!(
            r#"tidemark_last_backup_size_bytes{{namespace="prod",policy="shop"}} {}"#,
            st["size"]
        ),
    ] {
        assert!(metrics.contains(series), "{series} not in:\n{metrics}");
    }
    assert!(
        st["startedAt"].is_string() && st["completedAt"].is_string(),
        "{st}"
    );

    // Point-in-time restore of what the Job backed up, plus the binlogs after it.
    insert(5);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let target = Timestamp::now();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    insert(3);
    db.sql("FLUSH BINARY LOGS");
    let index = db.binlog_index();
    tidemark(
        &s3,
        &[
            "archive-binlogs",
            "--once",
            "--binlog-index",
            index.to_str().unwrap(),
        ],
    );
    let restored = db.scratch().join("restored");
    tidemark(
        &s3,
        &[
            "restore",
            "--to",
            &target.to_string(),
            "--datadir",
            restored.to_str().unwrap(),
        ],
    );
    assert_eq!(
        query_restored(&restored, "SELECT COUNT(*) FROM shop.orders"),
        "15"
    );

    // The password is nowhere the operator writes.
    let everything = format!(
        "{}{}{}",
        serde_json::to_string(&backups.get("manual-1").await.unwrap()).unwrap(),
        serde_json::to_string(
            &Api::<K8sEvent>::namespaced(admin.clone(), ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
        )
        .unwrap(),
        String::from_utf8_lossy(
            &tidemark(
                &s3,
                &[
                    "fetch",
                    "--backup-id",
                    &id,
                    "--backup-name",
                    "manual-1",
                    "--out",
                    "/dev/null"
                ]
            )
            .stderr
        ),
    );
    assert!(
        !everything.contains(DB_PASSWORD),
        "the database password leaked"
    );
    let meta = s3
        .cluster_store("shop")
        .read(&tidemark_store::layout::metadata_key("manual-1", &id))
        .await
        .unwrap()
        .unwrap();
    assert!(!String::from_utf8_lossy(&meta).contains(DB_PASSWORD));

    // An incremental builds on the newest backup of the same data directory (InnoDB LSNs
    // are a server's own): from db-0 on the full above; from a standby, db-1, that has
    // none of its own, never — it waits with the reason.
    let uid = pods.get("db-0").await.unwrap().metadata.uid.unwrap();
    assert!(
        String::from_utf8_lossy(&meta).contains(&format!("pod:{uid}")),
        "the full records its data directory"
    );
    let incremental = |name: &str, target: &str| {
        serde_json::from_value::<Backup>(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"policy": {"name": "shop"}, "type": "incremental", "target": target},
        }))
        .unwrap()
    };
    backups
        .create(&PostParams::default(), &incremental("incr-1", "primary"))
        .await
        .unwrap();
    let job = eventually("the incremental's Job", || async {
        let name = backups.get("incr-1").await.unwrap().status?.job_name?;
        jobs.get_opt(&name).await.unwrap()
    })
    .await;
    let text = serde_json::to_string(&job).unwrap();
    assert!(
        text.contains(&format!("--parent {id}"))
            || text.contains(&format!("\"--parent\",\"{id}\"")),
        "{text}"
    );
    let mut standby = pod.clone();
    standby.metadata.name = Some("db-1".into());
    standby
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tidemark.io/role".into(), "standby".into());
    pods.create(&PostParams::default(), &standby).await.unwrap();
    tidemark_operator::testkit::mark_running(&admin, ns, "db-1").await;
    backups
        .create(
            &PostParams::default(),
            &incremental("incr-2", "prefer-standby"),
        )
        .await
        .unwrap();
    let st = eventually("incr-2 waits for a parent of its own", || async {
        let s = serde_json::to_value(backups.get("incr-2").await.unwrap().status).unwrap();
        (s["conditions"][0]["reason"] == "NoParent").then_some(s)
    })
    .await;
    let message = st["conditions"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("pod db-1") && message.contains(&id),
        "{message}"
    );
    backups.delete("incr-1", &Default::default()).await.unwrap();
    backups.delete("incr-2", &Default::default()).await.unwrap();
    pods.delete("db-1", &Default::default()).await.unwrap();

    // The plugin: `kubectl tidemark ls|plan <policy>` read the policy's store with its
    // Secret; `kubectl tidemark backup <policy> --wait` creates a Backup and follows it.
    let plugin_dir = tempfile::tempdir().unwrap();
    let plugin = plugin_dir.path().join("kubectl-tidemark");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tidemark"), &plugin).unwrap();
    let kubectl_tidemark = |args: &[&str]| {
        let out = std::process::Command::new(&plugin)
            .args(args)
            .env("KUBECONFIG", cluster.kubeconfig())
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl tidemark {args:?}: {}",
            common::stderr(&out)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or(serde_json::Value::Null)
    };
    let ls = kubectl_tidemark(&["ls", "shop", "-n", ns, "--output", "json"]);
    assert!(ls.to_string().contains(&id), "{ls}");
    // A store reachable only inside the cluster (a Service name): said at once, with how
    // to run the command there (issue 46 §4).
    let policies: Api<tidemark_api::crd::BackupPolicy> = Api::namespaced(admin.clone(), ns);
    let mut inside = policies.get("shop").await.unwrap();
    inside.metadata = kube::api::ObjectMeta {
        name: Some("inside".into()),
        ..Default::default()
    };
    inside.status = None;
    inside.spec.object_store.as_mut().unwrap().endpoint =
        Some("http://minio.minio.svc:9000".into());
    policies
        .create(&PostParams::default(), &inside)
        .await
        .unwrap();
    let out = std::process::Command::new(&plugin)
        .args(["ls", "inside", "-n", ns])
        .env("KUBECONFIG", cluster.kubeconfig())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", common::stderr(&out));
    let said = common::stderr(&out);
    assert!(
        said.contains("reachable only from inside the cluster")
            && said.contains("kubectl exec -n tidemark-system deploy/tidemark-operator -- /tidemark <command> inside"),
        "{said}"
    );
    policies
        .delete("inside", &Default::default())
        .await
        .unwrap();
    let plan = kubectl_tidemark(&["plan", "shop", "-n", ns, "--output", "json"]);
    assert_eq!(plan["backups"][0]["backupId"], id.as_str(), "{plan}");
    assert_eq!(plan["backups"][0]["action"], "keep", "{plan}");

    // Seed 004: the policy's ttl is the default of the backups it takes; --ttl wins.
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ttl": "30d"}})),
        )
        .await
        .unwrap();
    let kubeconfig = cluster.kubeconfig();
    let waiting = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args([
                "backup",
                "shop",
                "-n",
                "prod",
                "--target",
                "primary",
                "--ttl",
                "90d",
                "--wait",
                "--timeout",
                "5m",
            ])
            .env("KUBECONFIG", kubeconfig)
            .output()
            .unwrap()
    });
    let job = eventually("the Job of the plugin's Backup", || async {
        jobs.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|j| j.name_any().starts_with("shop-manual-"))
    })
    .await;
    let out = play_node(
        &admin,
        &job,
        &[
            ("/tidemark-bin", tools.path()),
            ("/var/lib/mysql", &db.datadir),
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let waited = waiting.await.unwrap();
    assert!(
        waited.status.success(),
        "backup --wait: {}",
        common::stderr(&waited)
    );
    let said = String::from_utf8_lossy(&waited.stdout);
    assert!(said.contains("completed: backup-id 2"), "{said}");
    let manual = said.split(' ').next().unwrap().to_owned();
    assert_eq!(
        backups.get(&manual).await.unwrap().spec.ttl.as_deref(),
        Some("90d")
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["backup", "shop", "-n", "prod"])
        .env("KUBECONFIG", cluster.kubeconfig())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let defaulted = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(
        backups.get(&defaulted).await.unwrap().spec.ttl.as_deref(),
        Some("30d")
    );
    backups
        .delete(&defaulted, &Default::default())
        .await
        .unwrap();
    op.stop().await;
}

/// An operator allowed to run the archiver in an image of the policy's choosing, and the
/// archiver Deployment of policy `shop` it makes in `ns`.
async fn archiver_operator(
    cluster: &KubeCluster,
    identity: &str,
    deployments: &Api<k8s_openapi::api::apps::v1::Deployment>,
) -> (Operator, k8s_openapi::api::apps::v1::Deployment) {
    let op = Operator::start_with(
        cluster,
        identity,
        std::sync::Arc::new(tidemark_engine::SystemClock),
        |o| o.tenancy.allow_archiver_images = true,
    );
    let d = eventually("the archiver Deployment", || async {
        deployments.get_opt("shop-binlog-archiver").await.unwrap()
    })
    .await;
    (op, d)
}

/// The operator-managed binlog archiver: a BackupPolicy with `binlogArchive.server` gets one
/// Deployment; the test plays the node for its pod (the init container, then the archiver as
/// a long-running local process with the pod's environment) against a real MariaDB over
/// the network; closed binlogs reach the store; without `server` the Deployment goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binlog_archiver_deployment_reads_the_server_over_the_network() {
    use k8s_openapi::api::apps::v1::Deployment;
    let s3 = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let db = tokio::task::spawn_blocking(MariaDb::start).await.unwrap();
    shop_with_login(&db, "repl");
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "archiver";
    cluster.namespace(ns).await;
    secret(
        &admin,
        ns,
        "s3",
        &[("accessKeyId", ACCESS_KEY), ("secretAccessKey", SECRET_KEY)],
    )
    .await;
    secret(
        &admin,
        ns,
        "db",
        &[("username", "repl"), ("password", DB_PASSWORD)],
    )
    .await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": s3.endpoint, "credentialsSecret": "s3"},
            "source": {"selector": {"matchLabels": {"app": "db"}}, "credentialsSecret": "db"},
            "binlogArchive": {"server": {"host": "127.0.0.1", "port": db.port, "image": "mariadb:11.4"}, "interval": "1s"},
            "resources": {"archiver": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}},
        },
    }))
    .unwrap();
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    // Issue 42 §5: an image other than the database container's (here no pod gives one)
    // would run with the store's keys and the login: refused unless the administrator
    // allows it.
    let op = Operator::start(&cluster, "operator-archiver-strict");
    let refused = eventually("the archiver image refused", || async {
        let e = events(&admin, ns, "BinlogArchiverFailed").await;
        let text = serde_json::to_string(&e).unwrap();
        text.contains("--allow-archiver-images").then_some(text)
    })
    .await;
    assert!(refused.contains("mariadb:11.4"), "{refused}");
    op.stop().await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    let (op, d) = archiver_operator(&cluster, "operator-archiver", &deployments).await;
    let text = serde_json::to_string(&d).unwrap();
    assert!(
        !text.contains(DB_PASSWORD) && !text.contains(SECRET_KEY),
        "a secret in the Deployment"
    );
    assert_eq!(d.owner_references()[0].kind, "BackupPolicy");
    let spec = d.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.strategy.unwrap().type_.as_deref(), Some("Recreate"));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.containers[0].image.as_deref(), Some("mariadb:11.4"));
    // No API token for tools that read the bucket (issue 28).
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(
        serde_json::to_value(pod.containers[0].resources.as_ref().unwrap()).unwrap(),
        json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    );
    // None given for the init container: none set (the API server stores `{}`).
    let init_resources = pod.init_containers.as_ref().unwrap()[0].resources.clone();
    assert!(
        init_resources.is_none_or(|r| r.requests.is_none() && r.limits.is_none()),
        "{:?}",
        pod.init_containers
    );

    // Play the node: the init container, then the archiver, which keeps running.
    let tools = tempfile::tempdir().unwrap();
    let spool = tempfile::tempdir().unwrap();
    let map = |s: &str| {
        s.replace("/tidemark-bin", tools.path().to_str().unwrap())
            .replace("/spool", spool.path().to_str().unwrap())
    };
    let command = |c: &k8s_openapi::api::core::v1::Container| {
        let mut argv: Vec<String> = c.command.clone().unwrap_or_default();
        argv.extend(c.args.clone().unwrap_or_default());
        argv.iter().map(|a| map(a)).collect::<Vec<String>>()
    };
    let init = command(&pod.init_containers.as_ref().unwrap()[0]);
    assert_eq!(init[0], "/tidemark");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(&init[1..])
        .status()
        .unwrap();
    assert!(st.success());
    let spawn = async |main: &k8s_openapi::api::core::v1::Container| {
        let argv = command(main);
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        for e in main.env.clone().unwrap_or_default() {
            cmd.env(&e.name, env_value(&admin, ns, &e).await);
        }
        cmd.spawn().unwrap()
    };
    let mut archiver = spawn(&pod.containers[0]).await;

    let values: Vec<String> = (0..20).map(|i| format!("({i})")).collect();
    db.sql(&format!(
        "INSERT INTO shop.orders (v) VALUES {}",
        values.join(",")
    ));
    db.sql("FLUSH BINARY LOGS");
    db.sql("INSERT INTO shop.orders (v) VALUES (1)");
    db.sql("FLUSH BINARY LOGS");
    let ls = eventually("two closed binlogs in the store", || async {
        let out = common::bin()
            .envs(s3.env())
            .args([
                "ls",
                "--store",
                &s3.url(),
                "--cluster",
                "shop",
                "--endpoint",
                &s3.endpoint,
                "--output",
                "json",
            ])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        (v["archive"]["segments"].as_u64().unwrap_or(0) >= 2).then_some(v)
    })
    .await;
    assert_eq!(ls["archive"]["missing"], json!([]), "{ls}");

    // The archive's lag is watched (issue 27 §5): current while the server's files close,
    // loud once its open file holds more than maxLag of unarchived events, and again
    // current once it closes and is archived.
    let condition = |p: &BackupPolicy| {
        p.status
            .as_ref()
            .and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == "BinlogArchiveCurrent")
            })
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    let current = eventually("BinlogArchiveCurrent=True", || async {
        let p = policies.get("shop").await.unwrap();
        (condition(&p) == Some(("True".into(), "ArchiveCurrent".into()))).then_some(p)
    })
    .await;
    let archive_status = current.status.unwrap().binlog_archive.unwrap();
    assert_eq!(
        (archive_status.server_id, archive_status.timeline),
        (Some(1), Some(0))
    );
    assert!(!archive_status.behind);
    policies
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"binlogArchive": {"maxLag": "2s"}}})),
        )
        .await
        .unwrap();
    for i in 0..6 {
        db.sql(&format!("INSERT INTO shop.orders (v) VALUES ({i})"));
        tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    }
    eventually("BinlogArchiveCurrent=False, ArchiveBehind", || async {
        let p = policies.get("shop").await.unwrap();
        (condition(&p) == Some(("False".into(), "ArchiveBehind".into()))).then_some(())
    })
    .await;
    let warned = events(&admin, ns, "BinlogArchiveBehind").await;
    assert_eq!(warned.len(), 1, "{warned:?}");
    let metrics = op.get("/metrics").await.1;
    let lag: f64 = metrics
        .lines()
        .find(|l| {
            l.starts_with("tidemark_binlog_archive_lag_seconds{") && l.contains("policy=\"shop\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no lag metric: {metrics}"));
    assert!(lag >= 2.0, "lag {lag}");
    db.sql("FLUSH BINARY LOGS");
    eventually("BinlogArchiveCurrent=True again", || async {
        let p = policies.get("shop").await.unwrap();
        (condition(&p) == Some(("True".into(), "ArchiveCurrent".into()))).then_some(())
    })
    .await;
    assert_eq!(events(&admin, ns, "BinlogArchiveCaughtUp").await.len(), 1);
    let _ = archiver.kill();
    let out = archiver.wait_with_output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains(DB_PASSWORD));

    // Issue 45 §4: binlogArchive.purge. The archiver's flags follow the spec; a segment the
    // store lacks (deleted by hand) stops the purge before its file, and with the server's
    // binlogs past 80 % of maxDiskUsage the point in time is at risk: condition, Warning,
    // metric. The segment back, the purge goes on and the condition clears.
    policies
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"binlogArchive": {"purge": {"keep": "1h", "maxDiskUsage": "1Ki"}}}})),
        )
        .await
        .unwrap();
    let main = eventually("the archiver's purge flags", || async {
        let d = deployments.get("shop-binlog-archiver").await.ok()?;
        let c = d.spec?.template.spec?.containers.into_iter().next()?;
        let args = c.args.clone().unwrap_or_default().join(" ");
        (args.contains("--purge-keep=1h") && args.contains("--purge-max-disk=1024")).then_some(c)
    })
    .await;
    let files = db.sql("SHOW BINARY LOGS");
    let second = files
        .lines()
        .nth(1)
        .and_then(|l| l.split('\t').next())
        .unwrap()
        .to_owned();
    let raw = s3.raw_store();
    let key = object_store::path::Path::from(format!("shop/binlogs/{second}"));
    use object_store::ObjectStoreExt as _;
    let kept = raw.get(&key).await.unwrap().bytes().await.unwrap();
    raw.delete(&key).await.unwrap();
    let mut archiver = spawn(&main).await;
    let risk = |p: &BackupPolicy| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "PointInTimeAtRisk"))
            .cloned()
    };
    let at_risk = eventually("PointInTimeAtRisk=True", || async {
        risk(&policies.get("shop").await.unwrap()).filter(|c| c.status == "True")
    })
    .await;
    assert!(
        at_risk.message.contains(&format!(
            "{second} holds transactions the archive has not verified yet"
        )),
        "{at_risk:?}"
    );
    let warned = eventually("a PointInTimeAtRisk event", || async {
        let e = events(&admin, ns, "PointInTimeAtRisk").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(warned[0].type_.as_deref(), Some("Warning"), "{warned:?}");
    let metrics = op.get("/metrics").await.1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tidemark_point_in_time_at_risk{")
                && l.contains("policy=\"shop\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
    // Only the file before the missing segment's went.
    let left: Vec<String> = db
        .sql("SHOW BINARY LOGS")
        .lines()
        .filter_map(|l| l.split('\t').next().map(str::to_owned))
        .collect();
    assert_eq!(left.first(), Some(&second), "{left:?}");
    raw.put(&key, kept.into()).await.unwrap();
    eventually("PointInTimeAtRisk=False", || async {
        risk(&policies.get("shop").await.unwrap()).filter(|c| c.status == "False")
    })
    .await;
    assert_eq!(events(&admin, ns, "PointInTimeSafe").await.len(), 1);
    assert_eq!(
        db.sql("SHOW BINARY LOGS").lines().count(),
        1,
        "everything archived is purged past the limit"
    );
    // A login that may not purge: the condition says it is unknown, and why — not that
    // all is well.
    db.sql(
        "REVOKE BINLOG ADMIN, SUPER ON *.* FROM 'repl'@'%'; REVOKE BINLOG ADMIN, SUPER ON *.* FROM 'repl'@'localhost'",
    );
    db.sql("INSERT INTO shop.orders (v) VALUES (7)");
    db.sql("FLUSH BINARY LOGS");
    let unknown = eventually("PointInTimeAtRisk=Unknown", || async {
        risk(&policies.get("shop").await.unwrap()).filter(|c| c.status == "Unknown")
    })
    .await;
    assert_eq!(unknown.reason, "PurgeFailed", "{unknown:?}");
    assert!(unknown.message.contains("BINLOG ADMIN"), "{unknown:?}");
    let _ = archiver.kill();
    let _ = archiver.wait();

    // No more binlogArchive: the Deployment goes.
    policies
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"binlogArchive": null}})),
        )
        .await
        .unwrap();
    eventually("the archiver Deployment deleted", || async {
        deployments
            .get_opt("shop-binlog-archiver")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    op.stop().await;
}

/// A store that accepts connections and never answers (a network cut that drops packets):
/// how many of its connections are open now, a client still waiting on each.
fn unanswering_store() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::Read as _;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let open = Arc::new(AtomicUsize::new(0));
    let counted = open.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let open = counted.clone();
            open.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                // Read what the client sends, answer nothing, until it gives up.
                let mut buf = [0u8; 4096];
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (endpoint, open)
}

/// The binlog archiver's Deployment is looked after while the policy's store does not
/// answer (its retention pass and the archive watch waiting on it): a failover then still
/// reaches the archiver. A run of the short chaos soak lost every instant after a failover
/// (read from the code: the archiver kept the old primary's server id while a pass ran).
/// Here the Deployment is deleted while the store hangs and must come back within 25 s:
/// before, the reconcile read the store first (the archive watch: a request timeout, 30 s)
/// and skipped the archiver while the pass ran and when it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archiver_is_looked_after_while_the_store_does_not_answer() {
    use k8s_openapi::api::apps::v1::Deployment;
    use std::sync::atomic::Ordering;
    let (endpoint, open) = unanswering_store();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "archiver-cut";
    cluster.namespace(ns).await;
    secret(
        &admin,
        ns,
        "s3",
        &[("accessKeyId", ACCESS_KEY), ("secretAccessKey", SECRET_KEY)],
    )
    .await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": endpoint, "credentialsSecret": "s3"},
            "binlogArchive": {"server": {"host": "127.0.0.1", "port": 3306, "image": "mariadb:11.4"}, "interval": "1s"},
            "retention": {"keepLast": 1},
        },
    }))
    .unwrap();
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    let (op, first) = archiver_operator(&cluster, "operator-archiver-cut", &deployments).await;
    // The operator waits on the store (the pass, the archive watch).
    eventually("a connection to the store waiting", || async {
        (open.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    deployments
        .delete("shop-binlog-archiver", &Default::default())
        .await
        .unwrap();
    let again = tidemark_operator::testkit::eventually_within(
        "the archiver Deployment made again while the store hangs",
        Duration::from_secs(25),
        || async {
            deployments
                .get_opt("shop-binlog-archiver")
                .await
                .unwrap()
                .filter(|d| d.uid() != first.uid())
        },
    )
    .await;
    assert_eq!(again.owner_references()[0].kind, "BackupPolicy");
    op.stop().await;
}

/// Method `job`: the user's pod template runs with the destination in its environment and
/// `tidemark` copied in; its own `tidemark push` makes the backup, which the Backup
/// reports once committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_job_runs_the_users_pod_template() {
    let s3 = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "userjob";
    cluster.namespace(ns).await;
    secret(
        &admin,
        ns,
        "s3",
        &[("accessKeyId", ACCESS_KEY), ("secretAccessKey", SECRET_KEY)],
    )
    .await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "app", "namespace": ns},
        "spec": {"objectStore": {"bucket": BUCKET, "endpoint": s3.endpoint, "credentialsSecret": "s3"}},
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let op = Operator::start(&cluster, "operator-job");
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let b: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "export-1", "namespace": ns},
        "spec": {"policy": {"name": "app"}, "method": "job", "jobTemplate": {"spec": {"containers": [{
            "name": "export", "image": "busybox:1.36",
            "command": ["sh", "-c", "echo hello-from-job | /tidemark-bin/tidemark push --backup-name \"$TIDEMARK_BACKUP_NAME\" --backup-id \"$TIDEMARK_BACKUP_ID\" --ext txt"],
            "env": [{"name": "TIDEMARK_STORE", "value": "file:///elsewhere"}],
        }]}}},
    }))
    .unwrap();
    backups.create(&PostParams::default(), &b).await.unwrap();
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let job = eventually("the user's Job", || async {
        let name = backups.get("export-1").await.unwrap().status?.job_name?;
        jobs.get_opt(&name).await.unwrap()
    })
    .await;
    let c = &job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    let store_env: Vec<_> = c
        .env
        .as_ref()
        .unwrap()
        .iter()
        .filter(|e| e.name == "TIDEMARK_STORE")
        .collect();
    assert_eq!(
        store_env.len(),
        1,
        "the template cannot redirect the backup"
    );
    assert_eq!(store_env[0].value.as_deref(), Some(s3.url().as_str()));
    let tools = tempfile::tempdir().unwrap();
    let out = play_node(&admin, &job, &[("/tidemark-bin", tools.path())]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = eventually("phase completed", || async {
        let s = serde_json::to_value(backups.get("export-1").await.unwrap().status).unwrap();
        (s["phase"] == "completed").then_some(s)
    })
    .await;
    let id = st["backupId"].as_str().unwrap().to_owned();
    // Issue 46 §4: the status says which generation it was written for (kstatus).
    assert_eq!(st["observedGeneration"], 1, "{st}");
    // A Normal event says it ended well, naming what was committed.
    let completed = eventually("a BackupCompleted event", || async {
        let e = events(&admin, ns, "BackupCompleted").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(completed.len(), 1, "{completed:?}");
    assert_eq!(completed[0].type_.as_deref(), Some("Normal"));
    assert!(
        completed[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains(&format!("full backup {id} committed"))),
        "{completed:?}"
    );
    let fetched = common::bin()
        .envs(s3.env())
        .args([
            "fetch",
            "--store",
            &s3.url(),
            "--cluster",
            "app",
            "--endpoint",
            &s3.endpoint,
        ])
        .args(["--backup-id", &id, "--backup-name", "export-1"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&fetched.stdout), "hello-from-job\n");
    // A template asking for more than its author may have (issue 28): the operator would
    // create it with its own rights, so it is refused, named, and no Job is made.
    for (name, extra, named) in [
        ("root-1", json!({"hostPID": true}), "hostPID"),
        (
            "root-2",
            json!({"serviceAccountName": "tidemark-operator"}),
            "tidemark-operator",
        ),
        (
            "root-3",
            json!({"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}),
            "hostPath",
        ),
    ] {
        let mut spec = json!({"containers": [{"name": "export", "image": "busybox:1.36",
            "securityContext": {"privileged": name == "root-1"}}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let b: Backup = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"policy": {"name": "app"}, "method": "job", "jobTemplate": {"spec": spec}},
        }))
        .unwrap();
        backups.create(&PostParams::default(), &b).await.unwrap();
        let st = eventually("the template refused", || async {
            let s = serde_json::to_value(backups.get(name).await.unwrap().status).unwrap();
            (s["phase"] == "failed").then_some(s)
        })
        .await;
        let said = st.to_string();
        assert!(
            said.contains(named) && said.contains("--allow-privileged-templates"),
            "{said}"
        );
        assert!(st["jobName"].is_null(), "{st}");
    }
    // A template past its bound fails the Backup (issue 28: the operator's caches hold
    // none, and a larger one is refused when read), naming its size and the bound.
    let big: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "big-1", "namespace": ns},
        "spec": {"policy": {"name": "app"}, "method": "job", "jobTemplate": {"spec": {"containers": [{
            "name": "export", "image": "busybox:1.36",
            "env": [{"name": "PADDING", "value": "x".repeat(70_000)}]}]}}},
    }))
    .unwrap();
    backups.create(&PostParams::default(), &big).await.unwrap();
    let st = eventually("the large template refused", || async {
        let s = serde_json::to_value(backups.get("big-1").await.unwrap().status).unwrap();
        (s["phase"] == "failed").then_some(s)
    })
    .await;
    assert!(st.to_string().contains("at most 65536"), "{st}");
    assert!(st["jobName"].is_null(), "{st}");
    // Labels past what the caches keep: the Backup is not started (its labels would go
    // into the store cut), and says why.
    let labels: serde_json::Map<String, serde_json::Value> = (0..300)
        .map(|i| (format!("k{i}"), json!("v".repeat(60))))
        .collect();
    let labelled: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "labelled-1", "namespace": ns, "labels": labels},
        "spec": {"policy": {"name": "app"}, "method": "job", "jobTemplate": {"spec": {"containers": [{
            "name": "export", "image": "busybox:1.36"}]}}},
    }))
    .unwrap();
    backups
        .create(&PostParams::default(), &labelled)
        .await
        .unwrap();
    let st = eventually("the over-labelled Backup refused", || async {
        let s = serde_json::to_value(backups.get("labelled-1").await.unwrap().status).unwrap();
        (s["phase"] == "failed").then_some(s)
    })
    .await;
    assert!(st.to_string().contains("keeps at most 16384"), "{st}");
    assert!(st["jobName"].is_null(), "{st}");
    // A schedule's Backups get its template, though the operator's cache of schedules
    // holds none.
    let schedule: tidemark_api::crd::ScheduledBackup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "ScheduledBackup",
        "metadata": {"name": "exports", "namespace": ns},
        "spec": {"schedule": "0 0 3 * * *", "immediate": true, "policy": {"name": "app"},
            "method": "job", "jobTemplate": {"spec": {"containers": [{
                "name": "export", "image": "busybox:1.36", "command": ["false"]}]}}},
    }))
    .unwrap();
    Api::<tidemark_api::crd::ScheduledBackup>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &schedule)
        .await
        .unwrap();
    let child = eventually("the schedule's Backup", || async {
        backups
            .list(&kube::api::ListParams::default().labels("tidemark.io/scheduled-backup=exports"))
            .await
            .unwrap()
            .items
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(
        child
            .spec
            .template
            .job_template
            .as_ref()
            .map(|t| t["spec"]["containers"][0]["command"][0].clone()),
        Some(json!("false")),
        "{:?}",
        child.spec
    );
    // The operator's own namespace is not served by a cluster-wide install: its service
    // account reads every Secret there.
    let own = tidemark_operator::testkit::OPERATOR_NAMESPACE;
    let mut there = policy.clone();
    there.metadata.namespace = Some(own.into());
    there.metadata.resource_version = None;
    there.metadata.uid = None;
    Api::<BackupPolicy>::namespaced(admin.clone(), own)
        .create(&PostParams::default(), &there)
        .await
        .unwrap();
    eventually("NotServed", || async {
        let e = events(&admin, own, "NotServed").await;
        (!e.is_empty()).then_some(())
    })
    .await;
    let p = Api::<BackupPolicy>::namespaced(admin.clone(), own)
        .get("app")
        .await
        .unwrap();
    assert!(p.status.is_none(), "{:?}", p.status);
    op.stop().await;
}

/// A mariabackup chain of "nightly" in `s3`, pushed with the real binary from the real
/// server: a full of 7 rows of `shop.orders`, then an increment with 5 more (12). Returns
/// their backup-ids.
fn mariabackup_chain(s3: &SeaweedFs, db: &MariaDb) -> (String, String) {
    db.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
    );
    let insert = |n: usize| {
        let values: Vec<String> = (0..n).map(|i| format!("({i})")).collect();
        db.sql(&format!(
            "INSERT INTO shop.orders (v) VALUES {}",
            values.join(",")
        ));
    };
    let push = |parent: Option<&str>| {
        let mut args = vec![
            "push",
            "--backup-name",
            "nightly",
            "--method",
            "mariabackup",
            "--output",
            "json",
        ];
        if let Some(p) = parent {
            args.extend(["--type", "incremental", "--parent", p]);
        }
        args.push("--");
        args.push("mariabackup");
        let client = db.client_args();
        args.extend(client.iter().map(String::as_str));
        let out = tidemark(s3, &args);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["backupId"].as_str().unwrap().to_owned()
    };
    insert(7);
    let full = push(None);
    insert(5); // 12
    let incremental = push(Some(&full));
    (full, incremental)
}

/// A control plane with the namespace `ns`, the store Secret `s3`, and the database pod
/// `db-0` (labelled `app=db`) whose image consolidation Jobs run in.
async fn consolidation_cluster(ns: &str) -> (KubeCluster, Client) {
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    cluster.namespace(ns).await;
    secret(
        &admin,
        ns,
        "s3",
        &[("accessKeyId", ACCESS_KEY), ("secretAccessKey", SECRET_KEY)],
    )
    .await;
    // The database's only pod, Running and Ready: the established primary retention needs.
    tidemark_operator::testkit::running_pod(
        &admin,
        ns,
        json!({
            "metadata": {"name": "db-0", "namespace": ns, "labels": {"app": "db"}},
            "spec": {"containers": [{"name": "mariadb", "image": "mariadb:11.4"}]},
        }),
    )
    .await;
    (cluster, admin)
}

/// The backup-ids `tidemark ls` lists, and its JSON.
fn listed(s3: &SeaweedFs) -> (Vec<String>, serde_json::Value) {
    let v: serde_json::Value =
        serde_json::from_slice(&tidemark(s3, &["ls", "--output", "json"]).stdout).unwrap();
    let ids = v["backups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backupId"].as_str().unwrap().to_owned())
        .collect();
    (ids, v)
}

/// Consolidation as a Job (seed 002): a policy that keeps only the newest backup, an
/// increment, with `consolidate`; the pass starts a Job in the database image instead of
/// merging in the operator; the test plays the node; the next pass finds the synthetic
/// full and lets the old chain go; the synthetic full restores to the exact row count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consolidation_runs_as_a_job() {
    let s3 = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let db = tokio::task::spawn_blocking(MariaDb::start).await.unwrap();
    let (full, incremental) = mariabackup_chain(&s3, &db);

    let ns = "merge";
    let (cluster, admin) = consolidation_cluster(ns).await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": s3.endpoint, "credentialsSecret": "s3"},
            "source": {"selector": {"matchLabels": {"app": "db"}}},
            "retention": {"keepLast": 1, "consolidate": true},
            "retentionInterval": "2s",
            "resources": {"consolidation": {"requests": {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": "10Gi"}}},
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    // The chain's Backup objects (a schedule's: their store name is "nightly").
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    for (object, id) in [("full-obj", &full), ("incr-obj", &incremental)] {
        let b: Backup = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": object, "namespace": ns,
                         "labels": {"tidemark.io/scheduled-backup": "nightly"}},
            "spec": {"policy": {"name": "shop"}},
        }))
        .unwrap();
        backups.create(&PostParams::default(), &b).await.unwrap();
        backups
            .patch_status(
                object,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "completed", "backupId": id}})),
            )
            .await
            .unwrap();
    }
    let op = Operator::start(&cluster, "operator-merge");
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let name = format!("shop-consolidate-{}", incremental.to_ascii_lowercase());
    let job = eventually("the consolidation Job", || async {
        jobs.get_opt(&name).await.unwrap()
    })
    .await;
    let c = &job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    assert_eq!(c.image.as_deref(), Some("mariadb:11.4"));
    assert_eq!(
        serde_json::to_value(c.resources.as_ref().unwrap()).unwrap(),
        json!({"requests": {"cpu": "500m", "ephemeral-storage": "10Gi", "memory": "512Mi"}})
    );
    // A hung consolidation fails by its deadline, as a backup Job does.
    assert_eq!(
        job.spec.as_ref().unwrap().active_deadline_seconds,
        Some(tidemark_operator::pod::JOB_DEADLINE_SECONDS)
    );
    // Meanwhile the chain is whole.
    let (ids, ls) = listed(&s3);
    assert_eq!(ids.len(), 2, "{ls}");

    let tools = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = play_node(
        &admin,
        &job,
        &[("/tidemark-bin", tools.path()), ("/work", work.path())],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The next passes: the synthetic full stands in, the old chain goes, the Job is removed.
    let ls = eventually("only the synthetic full left", || async {
        let (ids, v) = listed(&s3);
        (ids.len() == 1 && ids[0] != full && ids[0] != incremental).then_some(v)
    })
    .await;
    // The pass removes finished consolidation Jobs after its deletions: a moment later.
    eventually("the finished Job removed", || async {
        jobs.get_opt(&name).await.unwrap().is_none().then_some(())
    })
    .await;
    let synthetic = ls["backups"][0]["backupId"].as_str().unwrap().to_owned();
    // The objects of the merged chain name the synthetic full (issue 18 §2): the
    // increment's restore point is in it now, the full's was merged into it.
    let removed = |object: &'static str| {
        let backups = backups.clone();
        async move {
            let st = serde_json::to_value(backups.get(object).await.unwrap().status).unwrap();
            st["dataRemoved"].clone()
        }
    };
    let incr_removed = eventually("the increment's object names its replacement", || async {
        let r = removed("incr-obj").await;
        (r["replacedBy"]["backupId"] == synthetic.as_str()).then_some(r)
    })
    .await;
    assert_eq!(
        incr_removed["replacedBy"]["backupName"], "nightly",
        "{incr_removed}"
    );
    assert_eq!(incr_removed["mergedInto"]["backupId"], synthetic.as_str());
    let full_removed = removed("full-obj").await;
    assert_eq!(
        full_removed["mergedInto"]["backupId"],
        synthetic.as_str(),
        "{full_removed}"
    );
    assert!(full_removed.get("replacedBy").is_none(), "{full_removed}");
    // Deleting the increment's object acts on what exists: the synthetic full — here the
    // last restorable backup, so it stays and the object says so.
    backups
        .patch(
            "incr-obj",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"deletionPolicy": "Delete"}})),
        )
        .await
        .unwrap();
    tidemark_operator::testkit::cleanup_finalizer(&backups, "incr-obj").await;
    backups
        .delete("incr-obj", &Default::default())
        .await
        .unwrap();
    let refused = eventually("the deletion refused for the synthetic full", || async {
        let s = serde_json::to_value(backups.get("incr-obj").await.unwrap().status).unwrap();
        s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "RemoteCleanup" && c["reason"] == "LastRestorableBackup")
            .cloned()
    })
    .await;
    assert!(
        refused["message"].as_str().unwrap().contains(&synthetic),
        "{refused}"
    );
    assert_eq!(listed(&s3).0, vec![synthetic.clone()], "nothing deleted");
    // No binlogs are archived here: the window is the synthetic full's own restore point.
    let point = ls["recoveryWindow"]["to"].as_str().unwrap().to_owned();
    let restored = db.scratch().join("synthetic");
    tidemark(
        &s3,
        &[
            "restore",
            "--to",
            &point,
            "--datadir",
            restored.to_str().unwrap(),
        ],
    );
    assert_eq!(
        query_restored(&restored, "SELECT COUNT(*) FROM shop.orders"),
        "12",
        "{synthetic}"
    );
    op.stop().await;
}

/// Method `exec`: the Backup's command runs in the database container through
/// `pods/exec` — the real API server proxies it to a kubelet, played here by the testkit's
/// [`Kubelet`], which runs it against the real MariaDB — and the operator streams its
/// stdout into SeaweedFS. The dump restores to the exact row count. A failing command
/// fails the Backup with its exit status and its stderr (redacted); a stream cut by an
/// operator stop is fenced by the next leader, whose store record wins over the old stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_exec_streams_through_pods_exec() {
    let s3 = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let db = tokio::task::spawn_blocking(MariaDb::start).await.unwrap();
    db.sql("CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT);");
    let values: Vec<String> = (0..12).map(|i| format!("({i})")).collect();
    db.sql(&format!(
        "INSERT INTO shop.orders (v) VALUES {}",
        values.join(",")
    ));

    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    // The node: the database container's commands run here, against the local server.
    // In a database container the client finds the server by its default socket; here, by
    // the option file in the container's home.
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join(".my.cnf"),
        format!("[client]\nsocket={}\n", db.socket.display()),
    )
    .unwrap();
    let home_dir = home.path().to_path_buf();
    let kubelet = Kubelet::start(Arc::new(move |r: &ExecRequest| {
        if r.pod != "db-0" || r.container != "mariadb" {
            return None;
        }
        let mut cmd = tokio::process::Command::new(&r.command[0]);
        cmd.args(&r.command[1..]).env("HOME", &home_dir);
        Some(cmd)
    }))
    .await;
    kubelet.register(&admin, "node-1").await;

    let ns = "logical";
    cluster.namespace(ns).await;
    secret(
        &admin,
        ns,
        "s3",
        &[("accessKeyId", ACCESS_KEY), ("secretAccessKey", SECRET_KEY)],
    )
    .await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": s3.endpoint, "credentialsSecret": "s3"},
            "source": {"selector": {"matchLabels": {"app": "db"}}, "container": "mariadb"},
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    tidemark_operator::testkit::running_pod(&admin, ns, json!({
        "metadata": {"name": "db-0", "namespace": ns, "labels": {"app": "db", "tidemark.io/role": "primary"}},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "mariadb", "image": "mariadb:11.4"}],
        },
    })).await;

    let op = Operator::start(&cluster, "operator-exec");
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let create = |name: &'static str, command: serde_json::Value| {
        let backups = backups.clone();
        async move {
            let b: Backup = serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
                "metadata": {"name": name, "namespace": ns, "labels": {"team": "payments"}},
                "spec": {"policy": {"name": "shop"}, "method": "exec", "target": "primary", "command": command},
            }))
            .unwrap();
            backups.create(&PostParams::default(), &b).await.unwrap();
        }
    };
    let dump = json!([
        "mariadb-dump",
        "--user=root",
        "--single-transaction",
        "--databases",
        "shop"
    ]);
    create("dump-1", dump.clone()).await;
    let phase_of = |name: &'static str, phase: &'static str| {
        let backups = backups.clone();
        async move {
            eventually(&format!("{name} {phase}"), || async {
                let s = serde_json::to_value(backups.get(name).await.unwrap().status).unwrap();
                if s["phase"] != phase {
                    eprintln!("{name}: {s}");
                }
                (s["phase"] == phase).then_some(s)
            })
            .await
        }
    };
    let st = phase_of("dump-1", "completed").await;
    let id = st["backupId"].as_str().unwrap().to_owned();
    assert!(st.get("jobName").is_none(), "no Job for exec: {st}");
    assert_eq!(st["key"], format!("dump-1/{id}/metadata.json"));
    // The Backup's labels are recorded with the backup (what selects it is known from the
    // store once the object is gone).
    let stored: serde_json::Value = serde_json::from_slice(
        &s3.cluster_store("shop")
            .read(&object_store::path::Path::from(format!(
                "dump-1/{id}/metadata.json"
            )))
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(stored["labels"]["team"], "payments", "{stored}");
    assert_eq!(stored["labels"]["tidemark.io/backup"], "dump-1", "{stored}");
    let checksum = st["checksum"].as_str().unwrap().to_owned();
    assert!(checksum.starts_with("sha256:"), "{st}");
    // The API server carried exactly the Backup's command to the pod's container.
    let served = kubelet.requests.lock().unwrap().clone();
    assert_eq!(served.len(), 1, "{served:?}");
    assert_eq!(
        (
            served[0].namespace.as_str(),
            served[0].pod.as_str(),
            served[0].container.as_str()
        ),
        (ns, "db-0", "mariadb")
    );
    assert_eq!(json!(served[0].command), dump);

    // The dump, fetched back (checksum verified), restores to the exact row count.
    let fetched = common::bin()
        .envs(s3.env())
        .args([
            "fetch",
            "--store",
            &s3.url(),
            "--cluster",
            "shop",
            "--endpoint",
            &s3.endpoint,
        ])
        .args(["--backup-id", &id, "--backup-name", "dump-1"])
        .output()
        .unwrap();
    assert!(
        fetched.status.success(),
        "{}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    assert_eq!(st["size"].as_u64().unwrap(), fetched.stdout.len() as u64);
    db.sql("DROP DATABASE shop");
    let mut load = std::process::Command::new("mariadb")
        .args(db.client_args())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    load.stdin
        .take()
        .unwrap()
        .write_all(&fetched.stdout)
        .unwrap();
    assert!(load.wait().unwrap().success());
    assert_eq!(db.sql("SELECT COUNT(*) FROM shop.orders").trim(), "12");

    // A command that fails: its exit status and stderr, a password in it hidden; the
    // store records the failed attempt and keeps no payload.
    create(
        "broken-1",
        json!([
            "sh",
            "-c",
            "echo partial; echo 'cannot connect with --password=hunter2' >&2; exit 3"
        ]),
    )
    .await;
    let st = phase_of("broken-1", "failed").await;
    let error = st["error"].as_str().unwrap();
    assert!(error.contains("exited with status 3"), "{error}");
    assert!(error.contains("cannot connect"), "{error}");
    assert!(
        !error.contains("hunter2"),
        "a secret in the status: {error}"
    );
    let failed_id = st["backupId"].as_str().unwrap();
    let store = s3.cluster_store("shop");
    let meta: serde_json::Value = serde_json::from_slice(
        &store
            .read(&tidemark_store::layout::metadata_key("broken-1", failed_id))
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(meta["phase"], "failed", "{meta}");
    assert!(
        meta["payload"].as_array().is_none_or(Vec::is_empty),
        "{meta}"
    );

    // A stream cut by an operator stop: the next leader fences the attempt.
    create(
        "slow-1",
        json!(["sh", "-c", "echo started; sleep 60; echo never"]),
    )
    .await;
    let st = phase_of("slow-1", "running").await;
    let slow_id = st["backupId"].as_str().unwrap().to_owned();
    op.stop().await;
    let op = Operator::start(&cluster, "operator-exec-2");
    let st = phase_of("slow-1", "failed").await;
    assert!(
        st["error"].as_str().unwrap().contains("operator stopped"),
        "{st}"
    );
    let meta: serde_json::Value = serde_json::from_slice(
        &store
            .read(&tidemark_store::layout::metadata_key("slow-1", &slow_id))
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(meta["phase"], "failed", "the store says so too: {meta}");
    op.stop().await;
}

/// Seed 002's delete-then-consolidate through the finalizer: the Backup object of a full
/// that a committed increment builds on is deleted with `deletionPolicy: Delete`. Its data
/// is marked, not deleted, and the object waits; the next pass, no rule keeping the full
/// any more, merges it into a synthetic full in a consolidation Job (the test plays the
/// node, real MariaDB); the pass after lets the old chain go, the object goes with it, and
/// the synthetic full restores to the exact row count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_chain_base_marks_it_and_a_pass_consolidates() {
    let s3 = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let db = tokio::task::spawn_blocking(MariaDb::start).await.unwrap();
    let (full, incremental) = mariabackup_chain(&s3, &db);

    let ns = "unchain";
    let (cluster, admin) = consolidation_cluster(ns).await;
    // Keeps both by count: only the deletion can make the full go.
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": s3.endpoint, "credentialsSecret": "s3"},
            "source": {"selector": {"matchLabels": {"app": "db"}}},
            "retention": {"keepLast": 5, "consolidate": true},
            "retentionInterval": "2s",
            "deletionPolicy": "Delete",
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    // The full's Backup object (its store name is its own: "nightly").
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let b: Backup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "nightly", "namespace": ns},
        "spec": {"policy": {"name": "shop"}},
    }))
    .unwrap();
    backups.create(&PostParams::default(), &b).await.unwrap();
    backups
        .patch_status(
            "nightly",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "completed", "backupId": full}})),
        )
        .await
        .unwrap();
    let op = Operator::start(&cluster, "operator-unchain");
    tidemark_operator::testkit::cleanup_finalizer(&backups, "nightly").await;

    backups
        .delete("nightly", &Default::default())
        .await
        .unwrap();
    let st = eventually("marked and waiting", || async {
        let s = serde_json::to_value(backups.get("nightly").await.unwrap().status).unwrap();
        s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "RemoteCleanup" && c["reason"] == "WaitingForRetention")
            .cloned()
    })
    .await;
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains(&format!("chain:{incremental}")),
        "{st}"
    );
    let store = s3.cluster_store("shop");
    let mark = tidemark_store::layout::metadata_key("nightly", &full)
        .as_ref()
        .replace("metadata.json", "_deletion-requested.json");
    assert!(
        store
            .read(&object_store::path::Path::from(mark.as_str()))
            .await
            .unwrap()
            .is_some(),
        "the mark is in the backup's directory"
    );
    assert_eq!(listed(&s3).0.len(), 2, "nothing deleted yet");

    // The pass: no rule keeps the full now, the increment does; consolidate merges them.
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let name = format!("shop-consolidate-{}", incremental.to_ascii_lowercase());
    let job = eventually("the consolidation Job", || async {
        jobs.get_opt(&name).await.unwrap()
    })
    .await;
    let tools = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = play_node(
        &admin,
        &job,
        &[("/tidemark-bin", tools.path()), ("/work", work.path())],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ls = eventually("only the synthetic full left", || async {
        let (ids, v) = listed(&s3);
        (ids.len() == 1 && ids[0] != full && ids[0] != incremental).then_some(v)
    })
    .await;
    // The object notices at its next look (here, a touch; else within 10 minutes).
    backups
        .patch(
            "nightly",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touch": "1"}}})),
        )
        .await
        .unwrap();
    eventually("the Backup object gone", || async {
        backups
            .get_opt("nightly")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let point = ls["recoveryWindow"]["to"].as_str().unwrap().to_owned();
    let restored = db.scratch().join("unchained");
    tidemark(
        &s3,
        &[
            "restore",
            "--to",
            &point,
            "--datadir",
            restored.to_str().unwrap(),
        ],
    );
    assert_eq!(
        query_restored(&restored, "SELECT COUNT(*) FROM shop.orders"),
        "12"
    );
    op.stop().await;
}

/// `kubectl tidemark gc <policy>` and DeleteHooks (issues 18 and 43, seed 003): every
/// deletion path runs the hooks. The plugin reads the namespace's DeleteHooks: a job hook
/// needs the operator, so `gc` refuses while one selects a backup it would delete —
/// naming the hook, deleting nothing; a webhook hook it calls itself, right before the
/// data goes (reason `retention`), and the deletion goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_tidemark_gc_runs_webhooks_and_refuses_job_hooks() {
    use tidemark_store::synth;
    let s3 = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "gc";
    cluster.namespace(ns).await;
    secret(
        &admin,
        ns,
        "s3",
        &[("accessKeyId", ACCESS_KEY), ("secretAccessKey", SECRET_KEY)],
    )
    .await;
    let store = s3.cluster_store("shop");
    let now = Timestamp::now();
    let mut old = synth::SynthBackup::full("old", now - jiff::SignedDuration::from_hours(3), 1);
    old.labels = vec![("team".into(), "pay".into())];
    let new = synth::SynthBackup::full("new", now - jiff::SignedDuration::from_hours(1), 2);
    synth::write_backups(&store, &[old.clone(), new.clone()])
        .await
        .unwrap();
    let hook_server = tidemark_operator::testkit::Webhook::start().await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": s3.endpoint, "credentialsSecret": "s3"},
            "retention": {"keepLast": 1},
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    tidemark_operator::testkit::completed_backup(
        &backups,
        &old,
        json!({"metadata": {"labels": {"team": "pay"}}, "spec": {"policy": {"name": "shop"}}}),
    )
    .await;
    let hooks: Api<tidemark_api::crd::DeleteHook> = Api::namespaced(admin.clone(), ns);
    let hook: tidemark_api::crd::DeleteHook = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "DeleteHook",
        "metadata": {"name": "ticket", "namespace": ns},
        "spec": {"selector": {"matchLabels": {"team": "pay"}}, "job": {"spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}},
    }))
    .unwrap();
    hooks.create(&PostParams::default(), &hook).await.unwrap();
    let gc = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args(["gc", "shop", "-n", ns, "--deny-endpoints", ""])
            .env("KUBECONFIG", cluster.kubeconfig())
            .output()
            .unwrap()
    };
    let refused = gc();
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        common::stderr(&refused)
    );
    let said = common::stderr(&refused);
    assert!(
        said.contains("ticket (job)") && said.contains("--skip-hooks"),
        "{said}"
    );
    assert_eq!(
        synth::metadata_ids(&store).await.unwrap().len(),
        2,
        "gc deleted while refusing"
    );
    // kubectl's global flags: --kubeconfig with --context (whose namespace is used), and
    // --as (impersonation, refused for a user without rights).
    let mut kubeconfig: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(cluster.kubeconfig()).unwrap()).unwrap();
    kubeconfig["contexts"] = json!([
        {"name": "broken", "context": {"cluster": "nowhere", "user": "admin"}},
        {"name": "shop", "context": {"cluster": "test", "user": "admin", "namespace": ns}},
    ]);
    kubeconfig["clusters"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1"}}));
    kubeconfig["current-context"] = json!("broken");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config");
    std::fs::write(&file, serde_json::to_string(&kubeconfig).unwrap()).unwrap();
    let ls = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args(["ls", "shop", "-o", "json", "--kubeconfig"])
            .arg(&file)
            .args(extra)
            .env("KUBECONFIG", "/nonexistent")
            .output()
            .unwrap()
    };
    let listed = ls(&["--context", "shop"]);
    assert!(listed.status.success(), "{}", common::stderr(&listed));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed["backups"].as_array().unwrap().len(), 2, "{listed}");
    let broken = ls(&[]);
    assert!(
        !broken.status.success(),
        "the current context points nowhere"
    );
    let nobody = ls(&[
        "--context",
        "shop",
        "--as",
        "system:serviceaccount:other:nobody",
    ]);
    assert_eq!(nobody.status.code(), Some(2), "{}", common::stderr(&nobody));
    assert!(
        common::stderr(&nobody).contains("not allowed"),
        "{}",
        common::stderr(&nobody)
    );
    hooks.delete("ticket", &Default::default()).await.unwrap();
    let webhook: tidemark_api::crd::DeleteHook = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "DeleteHook",
        "metadata": {"name": "notify", "namespace": ns},
        "spec": {"selector": {"matchLabels": {"team": "pay"}},
            "webhook": {"url": format!("{}/ok", hook_server.url), "caBundle": hook_server.ca_bundle}},
    }))
    .unwrap();
    hooks
        .create(&PostParams::default(), &webhook)
        .await
        .unwrap();
    let ran = gc();
    assert!(ran.status.success(), "{}", common::stderr(&ran));
    assert_eq!(
        synth::metadata_ids(&store).await.unwrap(),
        std::slice::from_ref(&new.id)
    );
    let calls = hook_server.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0].1["reason"], "retention");
    assert_eq!(calls[0].1["backup"]["backupId"], old.id.as_str());

    // `status POLICY`: the policy's health, window, pass, schedules, Backups, restore test
    // and warnings in one screen, and as one document.
    let policies: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    policies
        .patch_status(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "lastRetentionRunTime": "2026-11-27T10:00:00Z",
                "nextRetentionRunTime": "2026-11-27T11:00:00Z",
                "backupsKept": 1, "backupsDeleted": 1, "bytesFreed": 2048,
                "recoveryWindow": {"start": "2026-11-20T02:05:00Z", "end": "2026-11-27T10:00:00Z",
                    "gaps": [{"start": "2026-11-22T00:00:00Z", "end": "2026-11-22T01:00:00Z"}]},
                "conditions": [{"type": "Ready", "status": "False", "reason": "StoreUnavailable",
                    "message": "the store did not answer", "lastTransitionTime": "2026-11-27T10:00:00Z"}],
                "restoreTest": {"nextScheduleTime": "2026-11-28T03:00:00Z",
                    "last": {"testedAt": "2026-11-27T03:10:00Z", "passed": false, "backupId": "b-1",
                        "tablesChecked": 3, "problems": ["table shop.orders: 2 rows, expected 3"]}},
            }})),
        )
        .await
        .unwrap();
    let schedule: tidemark_api::crd::ScheduledBackup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "ScheduledBackup",
        "metadata": {"name": "nightly", "namespace": ns},
        "spec": {"schedule": "0 0 2 * * *", "policy": {"name": "shop"}},
    }))
    .unwrap();
    Api::<tidemark_api::crd::ScheduledBackup>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &schedule)
        .await
        .unwrap();
    let warning: K8sEvent = serde_json::from_value(json!({
        "metadata": {"name": "shop-warning", "namespace": ns},
        "eventTime": "2026-11-27T10:00:01.000000Z",
        "reportingController": "tidemark-operator", "reportingInstance": "test",
        "action": "RetentionPass", "reason": "RetentionPartlyFailed", "type": "Warning",
        "note": "1 deletion failed",
        "regarding": {"kind": "BackupPolicy", "name": "shop", "namespace": ns, "apiVersion": "tidemark.io/v1alpha1"},
    }))
    .unwrap();
    Api::<K8sEvent>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &warning)
        .await
        .unwrap();
    let status = |output: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args(["status", "shop", "-n", ns, "-o", output])
            .env("KUBECONFIG", cluster.kubeconfig())
            .output()
            .unwrap()
    };
    let doc = status("json");
    assert!(doc.status.success(), "{}", common::stderr(&doc));
    let doc: serde_json::Value = serde_json::from_slice(&doc.stdout).unwrap();
    assert_eq!(doc["policy"], "shop");
    assert_eq!(doc["conditions"][0]["reason"], "StoreUnavailable");
    assert_eq!(doc["recoveryWindow"]["gaps"].as_array().unwrap().len(), 1);
    assert_eq!(doc["lastPass"]["bytesFreed"], 2048);
    assert_eq!(doc["schedules"][0]["name"], "nightly");
    assert_eq!(doc["backups"][0]["name"], old.name);
    assert_eq!(doc["restoreTest"]["last"]["passed"], false);
    assert_eq!(doc["warnings"][0]["reason"], "RetentionPartlyFailed");
    let screen = status("table");
    assert!(screen.status.success(), "{}", common::stderr(&screen));
    let screen = String::from_utf8(screen.stdout).unwrap();
    for line in [
        &format!("BackupPolicy {ns}/shop"),
        "Health:           NOT READY (StoreUnavailable) since 2026-11-27T10:00:00Z: the store did not answer",
        "Recovery window:  2026-11-20T02:05:00Z → 2026-11-27T10:00:00Z, 1 GAP(S)",
        "Last pass:        2026-11-27T10:00:00Z: kept 1, deleted 1 backup(s) and - segment(s), 2.0 KiB freed",
        "Restore test:     FAILED at 2026-11-27T03:10:00Z (backup b-1, 3 table(s)); next 2026-11-28T03:00:00Z",
        "nightly",
        "RetentionPartlyFailed (x1): 1 deletion failed",
    ] {
        assert!(screen.contains(line), "{line:?} not in:\n{screen}");
    }
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["status", "nothing", "-n", ns])
        .env("KUBECONFIG", cluster.kubeconfig())
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(common::stderr(&missing).contains("BackupPolicy gc/nothing does not exist"));

    // `describe` and `logs` of a Backup (issue 46 §4): this one has no Job.
    let plugin = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args(args)
            .env("KUBECONFIG", cluster.kubeconfig())
            .output()
            .unwrap()
    };
    let described = plugin(&["describe", "backup", &old.name, "-n", ns]);
    assert!(described.status.success(), "{}", common::stderr(&described));
    let screen = String::from_utf8(described.stdout).unwrap();
    for line in [
        format!("Name:       {}", old.name),
        format!("Namespace:  {ns}"),
        "Kind:       Backup (tidemark.io/v1alpha1)".to_owned(),
        "Spec:".to_owned(),
        "  policy:".to_owned(),
        "Log:        no Job (yet)".to_owned(),
    ] {
        assert!(screen.contains(&line), "{line:?} not in:\n{screen}");
    }
    let doc = plugin(&["describe", "backup", &old.name, "-n", ns, "-o", "json"]);
    let doc: serde_json::Value = serde_json::from_slice(&doc.stdout).unwrap();
    assert_eq!(doc["object"]["metadata"]["name"], old.name.as_str());
    assert!(doc["events"].is_array());
    let none = plugin(&["logs", "backup", &old.name, "-n", ns]);
    assert_eq!(none.status.code(), Some(2));
    assert!(
        common::stderr(&none).contains("has no Job (yet)"),
        "{}",
        common::stderr(&none)
    );
    let missing = plugin(&["describe", "restore", "nothing", "-n", ns]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(common::stderr(&missing).contains("Restore gc/nothing does not exist"));

    // A store only the cluster's DNS names (issue 46 §4): said at once, with the
    // port-forward that reaches it from here; `--endpoint` then reads the same store.
    let inside: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "inside", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": "http://s3.gc.svc:8333", "credentialsSecret": "s3"},
            "cluster": "shop",
            "retention": {"keepLast": 5},
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &inside)
        .await
        .unwrap();
    let far = plugin(&["ls", "inside", "-n", ns]);
    assert_ne!(far.status.code(), Some(0), "{}", common::stderr(&far));
    assert!(
        common::stderr(&far).contains(
            "kubectl -n gc port-forward svc/s3 8333 & then kubectl tidemark <command> inside -n gc --endpoint http://127.0.0.1:8333"
        ),
        "{}",
        common::stderr(&far)
    );
    let near = plugin(&[
        "ls",
        "inside",
        "-n",
        ns,
        "--endpoint",
        &s3.endpoint,
        "-o",
        "json",
    ]);
    assert!(near.status.success(), "{}", common::stderr(&near));
    let listed = common::json(&near);
    assert!(
        listed["backups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["backupId"] == new.id.as_str()),
        "{listed}"
    );
    let planned = plugin(&["plan", "inside", "-n", ns, "--endpoint", &s3.endpoint]);
    assert!(planned.status.success(), "{}", common::stderr(&planned));
    let bad = plugin(&["ls", "inside", "-n", ns, "--endpoint", "s3.gc.svc:8333"]);
    assert_eq!(bad.status.code(), Some(2), "{}", common::stderr(&bad));
    assert!(
        common::stderr(&bad).contains("expected http(s)://host:port"),
        "{}",
        common::stderr(&bad)
    );
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .delete("inside", &Default::default())
        .await
        .unwrap();

    // `restore POLICY --statefulset` (issue 46 §3): one Restore per claim of the
    // StatefulSet's template, all to one point, only once it is scaled to 0 and with
    // --replace-data.
    let sts: serde_json::Value = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": ns},
        "spec": {"replicas": 1, "serviceName": "db",
                 "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": {"app": "db"}},
                              "spec": {"containers": [{"name": "mariadb", "image": "mariadb:10.11"}]}},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"},
                     "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]},
    });
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(admin.clone(), ns);
    sets.create(
        &PostParams::default(),
        &serde_json::from_value(sts).unwrap(),
    )
    .await
    .unwrap();
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(admin.clone(), ns);
    for claim in [
        "data-db-0",
        "data-db-1",
        "data-db-10",
        "data-dbx-0",
        "logs-db-0",
    ] {
        claims
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": claim},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    let to = "2026-11-30T10:03:00Z";
    let in_place = |extra: &[&str]| {
        let mut args = vec![
            "restore",
            "shop",
            "-n",
            ns,
            "--statefulset",
            "db",
            "--to",
            to,
        ];
        args.extend_from_slice(extra);
        plugin(&args)
    };
    let up = in_place(&["--replace-data"]);
    assert_eq!(up.status.code(), Some(2), "{}", common::stderr(&up));
    assert!(
        common::stderr(&up)
            .contains("scale it to 0 first (kubectl -n gc scale statefulset db --replicas=0"),
        "{}",
        common::stderr(&up)
    );
    sets.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 0}})),
    )
    .await
    .unwrap();
    eventually("the StatefulSet at 0", || async {
        let s = sets.get("db").await.unwrap();
        (s.status.map_or(0, |s| s.replicas) == 0).then_some(())
    })
    .await;
    let consent = in_place(&[]);
    assert_eq!(
        consent.status.code(),
        Some(2),
        "{}",
        common::stderr(&consent)
    );
    assert!(
        common::stderr(&consent)
            .contains("its claims data-db-0, data-db-1, data-db-10 hold data; give --replace-data"),
        "{}",
        common::stderr(&consent)
    );
    let made = in_place(&["--replace-data", "--name", "back-to-1003"]);
    assert!(made.status.success(), "{}", common::stderr(&made));
    assert_eq!(
        String::from_utf8_lossy(&made.stdout),
        "back-to-1003-0\nback-to-1003-1\nback-to-1003-10\n"
    );
    let restores: Api<tidemark_api::crd::Restore> = Api::namespaced(admin.clone(), ns);
    for (name, claim) in [
        ("back-to-1003-0", "data-db-0"),
        ("back-to-1003-1", "data-db-1"),
        ("back-to-1003-10", "data-db-10"),
    ] {
        let r = restores.get(name).await.unwrap();
        assert_eq!(r.spec.into.claim.as_deref(), Some(claim), "{name}");
        assert!(r.spec.into.replace_data, "{name}");
        assert_eq!(r.spec.target.to.as_deref(), Some(to), "{name}");
        assert_eq!(r.spec.policy.name, "shop", "{name}");
    }
    let count = || async {
        restores
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
    };
    assert_eq!(count().await, 3);
    // All or none: names taken, or one past 63 characters (it labels the claim), refuse
    // before any Restore is made.
    let again = in_place(&["--replace-data", "--name", "back-to-1003"]);
    assert_eq!(again.status.code(), Some(2), "{}", common::stderr(&again));
    assert!(
        common::stderr(&again).contains("Restore gc/back-to-1003-0 exists already: none was made"),
        "{}",
        common::stderr(&again)
    );
    let long = "n".repeat(61);
    let too_long = in_place(&["--replace-data", "--name", &long]);
    assert_eq!(
        too_long.status.code(),
        Some(2),
        "{}",
        common::stderr(&too_long)
    );
    assert!(
        common::stderr(&too_long).contains("at most 63 characters"),
        "{}",
        common::stderr(&too_long)
    );
    assert_eq!(count().await, 3);

    // kubectl's completion of the plugin: the binary as kubectl_complete-tidemark, asked
    // with the words after `kubectl tidemark`, answers Cobra's way.
    let dir = tempfile::tempdir().unwrap();
    let completer = dir.path().join("kubectl_complete-tidemark");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tidemark"), &completer).unwrap();
    let complete = |words: &[&str]| -> Vec<String> {
        let out = std::process::Command::new(&completer)
            .args(words)
            .env("KUBECONFIG", cluster.kubeconfig())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(complete(&["st"]), ["status", ":4"]);
    let commands = complete(&[""]);
    for c in [
        "backup",
        "describe",
        "logs",
        "restore",
        "restore-test",
        "status",
        ":4",
    ] {
        assert!(commands.contains(&c.to_owned()), "{c} not in {commands:?}");
    }
    assert_eq!(complete(&["status", "-n", ns, ""]), ["shop", ":4"]);
    assert_eq!(
        complete(&["ls", &format!("--namespace={ns}"), "s"]),
        ["shop", ":4"]
    );
    assert_eq!(complete(&["describe", ""]), ["backup", "restore", ":4"]);
    let backups = complete(&["logs", "backup", "-n", ns, ""]);
    assert!(
        backups.contains(&old.name) && backups.last().unwrap() == ":4",
        "{backups:?}"
    );
    assert_eq!(
        complete(&["status", "shop", "--output", "j"]),
        ["json", ":4"]
    );
    assert!(complete(&["status", "-n", ""]).contains(&ns.to_owned()));
    assert!(complete(&["describe", "backup", "x", "--n"]).contains(&"--namespace".to_owned()));
    // A value the shell completes itself (a file name, an instant): nothing, directive 0.
    assert_eq!(complete(&["restore", "shop", "--datadir", ""]), [":0"]);
    // A kubeconfig whose credential plugin never answers (an SSO prompt, say): the
    // answer comes without names after the completion's own deadline, not never.
    let hanging = dir.path().join("hanging-kubeconfig");
    std::fs::write(
        &hanging,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:9', insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user:\n    exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: sleep, args: ['40']}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = std::process::Command::new(&completer)
        .args(["status", ""])
        .env("KUBECONFIG", &hanging)
        .stdin(std::process::Stdio::null())
        // The plugin, left running, keeps the stderr it inherited (kubectl reads stdout).
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), ":4\n");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the completion waited {:?}",
        started.elapsed()
    );
    // No cluster to ask: no names, still an answer.
    let out = std::process::Command::new(&completer)
        .args(["status", ""])
        .env("KUBECONFIG", dir.path().join("none"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), ":4\n");
}

/// Object lock through the operator (issue 19 §3, seed 002): the first Backup of a
/// ScheduledBackup with `maxIncrementsPerFull: 3` is a full whose Job asks for a lock until
/// its chain's end — the schedule's third slot after the Backup's own — plus the policy's
/// period; the Job gets the mode in its environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_full_is_locked_until_its_chain_ends() {
    let s3 = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    s3.locked_bucket("locked", "shop").await;
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "locks";
    cluster.namespace(ns).await;
    secret(
        &admin,
        ns,
        "s3",
        &[("accessKeyId", ACCESS_KEY), ("secretAccessKey", SECRET_KEY)],
    )
    .await;
    secret(
        &admin,
        ns,
        "db",
        &[("username", "backup"), ("password", "pw")],
    )
    .await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": "locked", "endpoint": s3.endpoint, "credentialsSecret": "s3",
                "objectLock": {"mode": "governance", "period": "7d"}},
            "source": {"selector": {"matchLabels": {"app": "db"}}, "container": "mariadb", "port": 3306, "credentialsSecret": "db"},
            "retention": {"window": "30d"},
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    create_primary_pod(&admin, ns).await;
    tidemark_operator::testkit::mark_running(&admin, ns, "db-0").await;
    let schedule: tidemark_api::crd::ScheduledBackup = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "ScheduledBackup",
        "metadata": {"name": "nightly", "namespace": ns},
        "spec": {"schedule": "0 0 2 * * *", "immediate": true, "policy": {"name": "shop"},
            "method": "mariabackup", "target": "primary",
            "incremental": {"maxIncrementsPerFull": 3}},
    }))
    .unwrap();
    Api::<tidemark_api::crd::ScheduledBackup>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &schedule)
        .await
        .unwrap();

    let op = Operator::start(&cluster, "operator-locks");
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let (backup, job) = eventually("the first scheduled backup's Job", || async {
        for b in backups.list(&ListParams::default()).await.unwrap().items {
            if let Some(name) = b.status.as_ref().and_then(|s| s.job_name.clone())
                && let Some(job) = jobs.get_opt(&name).await.unwrap()
            {
                return Some((b, job));
            }
        }
        None
    })
    .await;
    let container = &job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    let args = container.args.clone().unwrap_or_default().join(" ");
    assert!(!args.contains("--parent"), "a full: {args}");
    let until: Timestamp = args
        .split("--lock-until ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no --lock-until in {args}"))
        .trim_matches(|c| c == '\'' || c == '"')
        .parse()
        .unwrap();
    // The slot: the Backup's creation. Its chain's third increment is taken at the third
    // 02:00 UTC after it; the lock runs a period (7 days) past that.
    let slot = backup.metadata.creation_timestamp.clone().unwrap().0;
    let day = jiff::SignedDuration::from_hours(24);
    let next_two = slot
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .at(2, 0, 0, 0)
        .to_zoned(jiff::tz::TimeZone::UTC)
        .unwrap()
        .timestamp();
    let first_slot_after = if next_two > slot {
        next_two
    } else {
        next_two + day
    };
    let chain_end = first_slot_after + day * 2;
    assert_eq!(until, chain_end + day * 7, "slot {slot}: {args}");
    let mode: Vec<String> = container
        .env
        .iter()
        .flatten()
        .filter(|e| e.name == "TIDEMARK_LOCK_MODE")
        .filter_map(|e| e.value.clone())
        .collect();
    assert_eq!(mode, ["governance"]);
    op.stop().await;
}

/// Issue 27 §6: with `spec.source.standbyMaxLag`, `prefer-standby` asks each Ready standby
/// about its replication (`mariadb` in its container through `pods/exec`, the login on its
/// stdin) and backs it up only while it replicates within the bound; a standby whose
/// replication is stopped is never picked — the primary is, and the Backup says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_standby_picks_a_standby_only_while_it_replicates() {
    const LOGIN_PASSWORD: &str = "standby-probe-pw-7d2e";
    let s3 = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let primary = tokio::task::spawn_blocking(|| MariaDb::start_replicating(1))
        .await
        .unwrap();
    let replica = tokio::task::spawn_blocking(|| MariaDb::start_replicating(2))
        .await
        .unwrap();
    replica.replicate_from(&primary);
    primary.sql(&format!(
        "CREATE USER 'probe'@'localhost' IDENTIFIED BY '{LOGIN_PASSWORD}'; \
         GRANT BINLOG MONITOR, SLAVE MONITOR ON *.* TO 'probe'@'localhost'"
    ));
    replica.wait_caught_up(&primary);

    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    // The node: each pod's container reaches its own server (its default socket, here by
    // the option file in the container's home).
    let homes: Vec<tempfile::TempDir> = [&primary, &replica]
        .iter()
        .map(|db| {
            let home = tempfile::tempdir().unwrap();
            std::fs::write(
                home.path().join(".my.cnf"),
                format!("[client]\nsocket={}\n", db.socket.display()),
            )
            .unwrap();
            home
        })
        .collect();
    let dirs: Vec<std::path::PathBuf> = homes.iter().map(|h| h.path().to_path_buf()).collect();
    let kubelet = Kubelet::start(Arc::new(move |r: &ExecRequest| {
        let home = match (r.pod.as_str(), r.container.as_str()) {
            ("db-0", "mariadb") => &dirs[0],
            ("db-1", "mariadb") => &dirs[1],
            _ => return None,
        };
        let mut cmd = tokio::process::Command::new(&r.command[0]);
        cmd.args(&r.command[1..]).env("HOME", home);
        Some(cmd)
    }))
    .await;
    kubelet.register(&admin, "node-1").await;
    let ns = "standby";
    cluster.namespace(ns).await;
    secret(
        &admin,
        ns,
        "s3",
        &[("accessKeyId", ACCESS_KEY), ("secretAccessKey", SECRET_KEY)],
    )
    .await;
    secret(
        &admin,
        ns,
        "db",
        &[("username", "probe"), ("password", LOGIN_PASSWORD)],
    )
    .await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": s3.endpoint, "credentialsSecret": "s3"},
            "source": {"selector": {"matchLabels": {"app": "db"}}, "container": "mariadb",
                       "credentialsSecret": "db", "standbyMaxLag": "1m"},
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    for (name, role) in [("db-0", "primary"), ("db-1", "standby")] {
        tidemark_operator::testkit::running_pod(&admin, ns, json!({
            "metadata": {"name": name, "namespace": ns, "labels": {"app": "db", "tidemark.io/role": role}},
            "spec": {
                "nodeName": "node-1",
                "containers": [{"name": "mariadb", "image": "mariadb:11.4",
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/mysql"}]}],
                "volumes": [{"name": "data", "emptyDir": {}}],
            },
        })).await;
    }
    let _op = Operator::start(&cluster, "operator-standby");
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let started = |name: &'static str| {
        let backups = backups.clone();
        async move {
            let b: Backup = serde_json::from_value(json!({
                "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"policy": {"name": "shop"}, "method": "mariabackup", "target": "prefer-standby"},
            }))
            .unwrap();
            backups.create(&PostParams::default(), &b).await.unwrap();
            eventually(&format!("{name}'s Job"), || async {
                let s = serde_json::to_value(backups.get(name).await.unwrap().status).unwrap();
                s["jobName"].is_string().then(|| {
                    s["conditions"][0]["message"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                })
            })
            .await
        }
    };
    // Replicating, and within the bound: the standby.
    let message = started("while-replicating").await;
    assert!(message.contains("backs up pod db-1"), "{message}");
    // Its replication stopped: never the standby; the primary, saying why.
    replica.sql("STOP SLAVE");
    let message = started("replication-stopped").await;
    assert!(message.contains("backs up pod db-0"), "{message}");
    assert!(
        message.contains("standby db-1 skipped: its replication is stopped or broken"),
        "{message}"
    );
    // Without standbyMaxLag, a standby that can be asked still is: stopped, never picked.
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .patch(
            "shop",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"source": {"standbyMaxLag": null}}})),
        )
        .await
        .unwrap();
    let message = started("stopped-no-bound").await;
    assert!(message.contains("backs up pod db-0"), "{message}");
    assert!(
        message.contains("standby db-1 skipped: its replication is stopped or broken"),
        "{message}"
    );
    // The login went on stdin: no request carried it.
    let served = kubelet.requests.lock().unwrap().clone();
    assert!(served.len() >= 2, "{served:?}");
    assert!(
        served
            .iter()
            .all(|r| r.command[0] == "sh" && !r.command.concat().contains(LOGIN_PASSWORD)),
        "{served:?}"
    );
}
