//! The operator's memory against tenants built to exhaust it (issue 28 findings 2, 5, 6):
//! the real `tidemark operator` binary, as the ServiceAccount `deploy/` binds, against a
//! real API server, with
//!
//! 1. `TIDEMARK_BENCH_HOSTILE_BACKUPS` (default 200) Backups whose `jobTemplate` is
//!    `TIDEMARK_BENCH_HOSTILE_TEMPLATE` bytes (default 1.4 MiB): the operator's memory
//!    once it has listed them, at start;
//! 2. then `TIDEMARK_BENCH_HOSTILE_POLICIES` (default 6) BackupPolicies, in turn pointing
//!    at a fake S3 endpoint that lists keys without end, one that pages without end, and
//!    one that serves 100 `metadata.json` of 1000 KiB each (just under the 1 MiB a record
//!    may have; 100 MB in all, against a pass's 16 MiB): the operator's peak once every
//!    policy's pass has failed on its budget (at most `--background-passes` at once; the
//!    others queued).
//!
//! It prints the operator's peak resident memory (VmHWM) after each step, and the peer in
//! the same run: `tidemark ls` against the keys-without-end endpoint with the operator's
//! budget. Run: `cargo bench -p tidemark --bench hostile_stores` (after
//! `scripts/kube-apiserver.sh`). No timed assertions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::peak_kib;

use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPolicy};
use tidemark_operator::testkit::{KubeCluster, s3_secret};
use tidemark_store::testkit::{HostileS3, Hostility};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let backups = env_or("TIDEMARK_BENCH_HOSTILE_BACKUPS", 200usize);
    let template = env_or("TIDEMARK_BENCH_HOSTILE_TEMPLATE", 1_400_000usize);
    let policies = env_or("TIDEMARK_BENCH_HOSTILE_POLICIES", 6usize);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(backups, template, policies));
    peer();
}

fn operator(cluster: &KubeCluster) -> std::process::Child {
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["operator", "--identity", "bench", "--listen", &listen])
        .env("KUBECONFIG", cluster.operator_kubeconfig())
        .env("TIDEMARK_LOG", "error")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

async fn run(backups: usize, template: usize, policies: usize) {
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let ns = "hostile";
    cluster.namespace(ns).await;
    s3_secret(&admin, ns, "s3").await;
    let api: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let t0 = Instant::now();
    for i in 0..backups {
        let b: Backup = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": format!("big-{i:04}"), "namespace": ns},
            "spec": {"policy": {"name": "absent"}, "method": "job", "jobTemplate": {"spec": {"containers": [{
                "name": "c", "image": "busybox:1.36",
                "env": [{"name": "PAD", "value": "x".repeat(template)}]}]}}},
        }))
        .unwrap();
        api.create(&PostParams::default(), &b).await.unwrap();
    }
    println!(
        "{backups} Backups with a {} KiB jobTemplate created in {:.1} s",
        template >> 10,
        t0.elapsed().as_secs_f64()
    );
    let mut child = operator(&cluster);
    // Listed, cached and reconciled (each fails: its policy does not exist).
    tokio::time::sleep(Duration::from_secs(30)).await;
    let listed = peak_kib(child.id()).unwrap_or(0);
    println!(
        "operator VmHWM after listing {backups} Backups of {} KiB: {} MiB",
        template >> 10,
        listed >> 10
    );

    let servers = [
        HostileS3::start(Hostility::EndlessKeys { per_page: 1000 }),
        HostileS3::start(Hostility::EndlessPages),
        HostileS3::start(Hostility::LargeMetadata {
            count: 100,
            size: 1000 << 10,
        }),
    ];
    let papi: Api<BackupPolicy> = Api::namespaced(admin.clone(), ns);
    for i in 0..policies {
        let p: BackupPolicy = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
            "metadata": {"name": format!("p{i}"), "namespace": ns},
            "spec": {
                "objectStore": {"bucket": "b", "endpoint": servers[i % servers.len()].endpoint, "credentialsSecret": "s3"},
                "retention": {"keepLast": 1},
            },
        }))
        .unwrap();
        papi.create(&PostParams::default(), &p).await.unwrap();
    }
    let t0 = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let list = papi.list(&Default::default()).await.unwrap().items;
        let failed = list
            .iter()
            .filter(|p| {
                p.status.as_ref().is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "Ready"
                            && c.status == "False"
                            && c.message.contains("more than one pass may hold")
                    })
                })
            })
            .count();
        if failed == policies {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(900),
            "{failed} of {policies} passes failed on their budget: {:?}",
            list.iter().map(|p| &p.status).collect::<Vec<_>>()
        );
    }
    let peak = peak_kib(child.id()).unwrap_or(0);
    println!(
        "operator VmHWM after {policies} passes against hostile stores ({:.1} s): {} MiB",
        t0.elapsed().as_secs_f64(),
        peak >> 10
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// The peer: `tidemark ls` against the keys-without-end endpoint, with the operator's
/// budget (its peak is one pass's).
fn peer() {
    let server = HostileS3::start(Hostility::EndlessKeys { per_page: 1000 });
    let t0 = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["ls", "--store", "s3://b", "--cluster", "c"])
        .args(["--endpoint", &server.endpoint])
        .env("AWS_ACCESS_KEY_ID", "a")
        .env("AWS_SECRET_ACCESS_KEY", "b")
        .env("TIDEMARK_MAX_LISTED_KEYS", "100000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        peak = peak_kib(child.id()).unwrap_or(peak).max(peak);
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "peer: tidemark ls against keys without end, 100000-key budget: VmHWM {} MiB, {:.1} s",
        peak >> 10,
        t0.elapsed().as_secs_f64()
    );
}
