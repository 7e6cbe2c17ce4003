//! The operator at scale, against a real kube-apiserver (no timed assertions; it prints
//! what it measures). Run: `cargo bench -p tidemark --bench operator` (after
//! `scripts/kube-apiserver.sh`). Sizes: `TIDEMARK_BENCH_SCHEDULES` (default 1,000),
//! `TIDEMARK_BENCH_BACKUPS` (10,000), `TIDEMARK_BENCH_FIRING` (20 schedules that fire).
//!
//! It runs the real `tidemark operator` binary as the ServiceAccount `deploy/` binds and
//! reports:
//! - reconciles per second while it works through every ScheduledBackup and Backup at
//!   start-up, from its own `tidemark_reconciles_total`;
//! - API requests per reconcile, from the API server's `apiserver_request_total` (the
//!   operator is the only other client; the benchmark's own requests are subtracted);
//! - the operator's memory (VmRSS, VmHWM);
//! - the time from a cron slot to the creation of its Backup's Job.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPolicy, ScheduledBackup};
use tidemark_operator::testkit::KubeCluster;

fn size(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Sum of `apiserver_request_total` over every label set.
async fn api_requests(client: &Client) -> f64 {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.unwrap();
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|v| v.parse::<f64>().ok())
        .sum()
}

/// `tidemark_reconciles_total{controller=…}` from the operator's /metrics.
fn reconciles(metrics: &str, controller: &str) -> u64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "tidemark_reconciles_total{{controller=\"{controller}\"}}"
            ))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
    let mut s = String::new();
    let _ = c.read_to_string(&mut s);
    s
}

fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench());
}

async fn bench() {
    let schedules = size("TIDEMARK_BENCH_SCHEDULES", 1000);
    let backups = size("TIDEMARK_BENCH_BACKUPS", 10_000);
    let firing = size("TIDEMARK_BENCH_FIRING", 20);
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "bench";
    cluster.namespace(ns).await;
    // Opening an S3 store sends nothing: the Jobs are created without a server.
    tidemark_operator::testkit::s3_secret(&admin, ns, "s3").await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "db", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": "bench", "endpoint": "http://127.0.0.1:9", "credentialsSecret": "s3"},
            "source": {"selector": {"matchLabels": {"app": "db"}}},
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    tidemark_operator::testkit::running_pod(&admin, ns, json!({
        "metadata": {"name": "db-0", "namespace": ns, "labels": {"app": "db", "tidemark.io/role": "primary"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "mariadb", "image": "mariadb:11.4",
            "volumeMounts": [{"name": "data", "mountPath": "/var/lib/mysql"}]}],
            "volumes": [{"name": "data", "emptyDir": {}}]},
    })).await;

    let started = Instant::now();
    let backup_api: Api<Backup> = Api::namespaced(admin.clone(), ns);
    stream::iter(0..backups)
        .map(|i| {
            let api = backup_api.clone();
            async move {
                let name = format!("old-{i:05}");
                let b: Backup = serde_json::from_value(json!({
                    "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
                    "metadata": {"name": name, "namespace": "bench"},
                    "spec": {"policy": {"name": "db"}},
                }))
                .unwrap();
                api.create(&PostParams::default(), &b).await?;
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": "completed"}})),
                )
                .await
                .map(|_| ())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
    let sb_api: Api<ScheduledBackup> = Api::namespaced(admin.clone(), ns);
    stream::iter(0..schedules)
        .map(|i| {
            let api = sb_api.clone();
            async move {
                let s: ScheduledBackup = serde_json::from_value(json!({
                    "apiVersion": "tidemark.io/v1alpha1", "kind": "ScheduledBackup",
                    "metadata": {"name": format!("sched-{i:04}"), "namespace": "bench"},
                    "spec": {"schedule": "0 0 2 * * *", "policy": {"name": "db"}},
                }))
                .unwrap();
                api.create(&PostParams::default(), &s).await.map(|_| ())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
    println!(
        "created {backups} completed Backups and {schedules} ScheduledBackups in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The real operator binary, as the ServiceAccount deploy/ binds.
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let before = api_requests(&admin).await;
    let t0 = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["operator", "--identity", "bench", "--listen", &listen])
        // The stores here listen on loopback, which the operator denies by default.
        .args(["--deny-endpoints", ""])
        .env("KUBECONFIG", cluster.operator_kubeconfig())
        .env("TIDEMARK_LOG", "error")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut own_requests = 1.0;
    let (sb_done, b_done) = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let m = get(&listen, "/metrics");
        let (s, b) = (reconciles(&m, "ScheduledBackup"), reconciles(&m, "Backup"));
        if s >= schedules as u64 && b >= backups as u64 {
            break (s, b);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1800),
            "not done in 30 min: {s} {b}"
        );
    };
    let elapsed = t0.elapsed().as_secs_f64();
    own_requests += 1.0;
    let after = api_requests(&admin).await;
    let (rss, hwm) = memory(child.id());
    let total = (sb_done + b_done) as f64;
    println!(
        "start-up: {sb_done} ScheduledBackup + {b_done} Backup reconciles in {elapsed:.1} s = {:.0} reconciles/s",
        total / elapsed
    );
    println!(
        "API requests: {:.0} during start-up = {:.2} per reconcile ({:.2} per ScheduledBackup if Backups cost none)",
        after - before - own_requests,
        (after - before - own_requests) / total,
        (after - before - own_requests) / sb_done as f64
    );
    println!(
        "operator memory: VmRSS {} MiB, VmHWM {} MiB",
        rss / 1024,
        hwm / 1024
    );

    // Slot → Job: schedules that fire every 20 s; their Backups' Jobs are created by the
    // operator (nobody runs them: the concurrency guard keeps one per schedule).
    stream::iter(0..firing)
        .map(|i| {
            let api = sb_api.clone();
            async move {
                let s: ScheduledBackup = serde_json::from_value(json!({
                    "apiVersion": "tidemark.io/v1alpha1", "kind": "ScheduledBackup",
                    "metadata": {"name": format!("fire-{i:02}"), "namespace": "bench"},
                    "spec": {"schedule": "*/20 * * * * *", "policy": {"name": "db"}, "target": "primary"},
                }))
                .unwrap();
                api.create(&PostParams::default(), &s).await.map(|_| ())
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(120);
    let latencies = loop {
        let list = jobs.list(&ListParams::default()).await.unwrap().items;
        let mut l: Vec<f64> = list
            .iter()
            .filter_map(|j| {
                let name = j.name_any();
                let stamp = name.strip_prefix("fire-")?.get(3..17)?.to_owned();
                let slot = jiff::civil::DateTime::strptime("%Y%m%d%H%M%S", &stamp)
                    .ok()?
                    .to_zoned(jiff::tz::TimeZone::UTC)
                    .ok()?
                    .timestamp();
                let created = j.metadata.creation_timestamp.as_ref()?.0;
                Some(created.duration_since(slot).as_secs_f64())
            })
            .collect();
        if l.len() >= firing || Instant::now() > deadline {
            l.sort_by(f64::total_cmp);
            break l;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    if latencies.is_empty() {
        println!("slot → Job: no Job created");
    } else {
        println!(
            "slot → Job creation over {} schedules: median {:.2} s, max {:.2} s (creation timestamps have whole seconds)",
            latencies.len(),
            latencies[latencies.len() / 2],
            latencies[latencies.len() - 1]
        );
    }
    let _ = Timestamp::now();
    let _ = child.kill();
    let _ = child.wait();
}
