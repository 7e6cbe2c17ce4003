//! The operator's memory with N concurrent `exec` backups (issue 17): the real `tidemark
//! operator` binary, as the ServiceAccount `deploy/` binds, streams N backups of
//! `TIDEMARK_BENCH_EXEC_BYTES` (default 1 GiB) each from a pod's container through
//! `pods/exec` (the test kubelet plays the node: the container's command is
//! `head -c BYTES /dev/zero`) into SeaweedFS, with `--exec-streams N` so all N run at once.
//! It prints, per N (`TIDEMARK_BENCH_EXEC_N`, default `1,4,16`), the operator's peak
//! resident memory (VmHWM), the wall time and the aggregate throughput; and, as the peer
//! in the same run, `tidemark push` of the same bytes with the CLI's default buffering.
//! `TIDEMARK_BENCH_EXEC_COMPRESSION` (default `none`; e.g. `none,zstd:3,zstd:19`) gives
//! the Backups' `compression`, one run per setting: the operator compresses exec streams
//! itself, at most at `zstd:6` in the stream's thread (issue 28), so its peak stays within
//! idle + 34 MiB a stream whatever level is asked.
//! Run: `cargo bench -p tidemark --bench exec_streams` (after `scripts/kube-apiserver.sh`;
//! SeaweedFS as for the tests: `TIDEMARK_WEED`). No timed assertions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::peak_kib;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPolicy};
use tidemark_operator::testkit::{ExecRequest, KubeCluster, Kubelet, s3_secret};
use tidemark_store::testkit::{BUCKET, SeaweedFs};

fn main() {
    let bytes: u64 = std::env::var("TIDEMARK_BENCH_EXEC_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 30);
    let counts: Vec<usize> = std::env::var("TIDEMARK_BENCH_EXEC_N")
        .unwrap_or_else(|_| "1,4,16".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let compressions: Vec<String> = std::env::var("TIDEMARK_BENCH_EXEC_COMPRESSION")
        .unwrap_or_else(|_| "none".into())
        .split(',')
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty())
        .collect();
    println!("exec streams of {} MiB each", bytes >> 20);
    for compression in &compressions {
        for &n in &counts {
            rt.block_on(streams(n, bytes, compression));
        }
    }
    push_peer(bytes);
}

async fn streams(n: usize, bytes: u64, compression: &str) {
    let s3 = tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap();
    let cluster = KubeCluster::start(false).await;
    let admin = cluster.admin_client();
    let kubelet = Kubelet::start(Arc::new(move |r: &ExecRequest| {
        if r.container != "db" {
            return None;
        }
        let mut cmd = tokio::process::Command::new("head");
        cmd.args(["-c", &bytes.to_string(), "/dev/zero"]);
        Some(cmd)
    }))
    .await;
    kubelet.register(&admin, "node-1").await;
    let ns = "bench";
    cluster.namespace(ns).await;
    s3_secret(&admin, ns, "s3").await;
    let policy: BackupPolicy = serde_json::from_value(json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
        "metadata": {"name": "db", "namespace": ns},
        "spec": {
            "objectStore": {"bucket": BUCKET, "endpoint": s3.endpoint, "credentialsSecret": "s3"},
            "source": {"selector": {"matchLabels": {"app": "db"}}, "container": "db"},
        },
    }))
    .unwrap();
    Api::<BackupPolicy>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    tidemark_operator::testkit::running_pod(&admin, ns, json!({
        "metadata": {"name": "db-0", "namespace": ns, "labels": {"app": "db", "tidemark.io/role": "primary"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "db", "image": "mariadb:11.4"}]},
    })).await;
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["operator", "--identity", "bench", "--listen", &listen])
        // The stores here listen on loopback, which the operator denies by default.
        .args(["--deny-endpoints", ""])
        .args(["--exec-streams", &n.to_string()])
        .env("KUBECONFIG", cluster.operator_kubeconfig())
        .env("TIDEMARK_LOG", "error")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Idle, before any stream.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = peak_kib(child.id()).unwrap_or(0);
    let backups: Api<Backup> = Api::namespaced(admin.clone(), ns);
    let t0 = Instant::now();
    for i in 0..n {
        let b: Backup = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": format!("dump-{i:02}"), "namespace": ns},
            "spec": {"policy": {"name": "db"}, "method": "exec", "target": "primary", "command": ["stream"], "compression": compression},
        }))
        .unwrap();
        backups.create(&PostParams::default(), &b).await.unwrap();
    }
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let list = backups.list(&Default::default()).await.unwrap().items;
        let phases: Vec<String> = list
            .iter()
            .map(|b| {
                b.status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .map(|p| format!("{p:?}"))
                    .unwrap_or_default()
            })
            .collect();
        assert!(
            !phases.iter().any(|p| p == "Failed"),
            "a stream failed: {:?}",
            list.iter().map(|b| &b.status).collect::<Vec<_>>()
        );
        if phases.iter().filter(|p| *p == "Completed").count() == n {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(3600), "{phases:?}");
    }
    let wall = t0.elapsed();
    let peak = peak_kib(child.id()).unwrap_or(0);
    let total = bytes * n as u64;
    println!(
        "{compression:>7}, N = {n:>2}: operator VmHWM {:>4} MiB (idle {} MiB, {:.1} MiB a stream above idle); {} MiB in {:.1} s, {:.0} MiB/s",
        peak / 1024,
        idle / 1024,
        (peak.saturating_sub(idle)) as f64 / 1024.0 / n as f64,
        total >> 20,
        wall.as_secs_f64(),
        (total >> 20) as f64 / wall.as_secs_f64()
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// The peer: `tidemark push` of the same bytes (the CLI's default buffering, 16 MiB parts,
/// 6 in flight).
fn push_peer(bytes: u64) {
    let s3 = SeaweedFs::start();
    let t0 = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["push", "--store", &s3.url(), "--cluster", "peer"])
        .args(["--endpoint", &s3.endpoint, "--backup-name", "peer", "--"])
        .args(["head", "-c", &bytes.to_string(), "/dev/zero"])
        .envs(s3.env())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        peak = peak_kib(child.id()).unwrap_or(peak).max(peak);
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "peer: tidemark push of {} MiB: VmHWM {} MiB, {:.1} s",
        bytes >> 20,
        peak / 1024,
        t0.elapsed().as_secs_f64()
    );
}
