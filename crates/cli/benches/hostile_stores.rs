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
//! 3. then `TIDEMARK_BENCH_FAT_POLICIES` (default 6) BackupPolicies on a real S3 server
//!    (SeaweedFS), each cluster holding one object planted to take a reader's memory
//!    (issue 42 §2): a 15 MB lease (valid, plus a padding field), an index head whose shard
//!    summary carries 15 MB of padding, or a head naming 20,000 shards marked unordered:
//!    the operator's peak once every policy's pass has failed on it.
//!
//! It prints the operator's peak resident memory (VmHWM) after each step, and the peers in
//! the same run: `tidemark ls` against the keys-without-end endpoint with the operator's
//! budget, and `tidemark gc` against each planted object. Run: `cargo bench -p tidemark --bench hostile_stores` (after
//! `scripts/kube-apiserver.sh`). No timed assertions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::peak_kib;

use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use serde_json::json;
use tidemark_api::crd::{Backup, BackupPolicy};
use tidemark_operator::testkit::{KubeCluster, s3_secret};
use tidemark_store::testkit::{BUCKET, HostileS3, Hostility, SeaweedFs, fat};

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
    let fat = env_or("TIDEMARK_BENCH_FAT_POLICIES", 6usize);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let weed = SeaweedFs::start();
    rt.block_on(run(backups, template, policies, fat, &weed));
    peer();
    fat_peers(&weed);
}

/// The objects of step 3, by cluster: `fat-<i>` holds the `i % 3`-th.
fn fat_object(i: usize) -> (&'static str, (&'static str, String)) {
    match i % 3 {
        0 => ("a 15 MB lease", fat::lease(15_000_000)),
        1 => ("a 15 MB shard summary", fat::shard_summary(15_000_000)),
        _ => ("20,000 unordered shards", fat::unordered_shards(20_000)),
    }
}

async fn plant(weed: &SeaweedFs, cluster: &str, key: &str, body: String) {
    use object_store::ObjectStoreExt;
    weed.cluster_store(cluster)
        .object_store()
        .put(
            &object_store::path::Path::from(key),
            body.into_bytes().into(),
        )
        .await
        .unwrap();
}

/// The peers: `tidemark gc` on each planted object, with the operator's budget.
fn fat_peers(weed: &SeaweedFs) {
    for i in 0..3 {
        let (what, _) = fat_object(i);
        let cluster = format!("fat-{i}");
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"));
        cmd.args(["gc", "--keep-last", "1", "--store", &weed.url()])
            .args(["--cluster", &cluster, "--endpoint", &weed.endpoint])
            .envs(weed.env())
            .env("TIDEMARK_MAX_INDEX_BYTES", (32u64 << 20).to_string())
            .env("TIDEMARK_MAX_INDEX_SHARDS", "256");
        let (peak, took) = sampled_peak(cmd);
        println!(
            "peer: tidemark gc on {what}, the operator's index budget: VmHWM {} MiB, {:.1} s",
            peak >> 10,
            took.as_secs_f64()
        );
    }
}

/// Runs `cmd` (output discarded), sampling its peak resident memory (VmHWM, KiB) until it
/// ends; with how long it ran.
fn sampled_peak(mut cmd: std::process::Command) -> (u64, Duration) {
    let t0 = Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        peak = peak_kib(child.id()).unwrap_or(peak).max(peak);
        std::thread::sleep(Duration::from_millis(5));
    }
    (peak, t0.elapsed())
}

/// Waits until every policy named `<prefix><i>` (`i < n`) is `Ready=False` with a message
/// containing one of `said`.
async fn all_refused(papi: &Api<BackupPolicy>, prefix: &str, n: usize, said: &[&str]) {
    let t0 = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let list = papi.list(&Default::default()).await.unwrap().items;
        let mine: Vec<&BackupPolicy> = list
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|m| m.starts_with(prefix))
            })
            .collect();
        let failed = mine
            .iter()
            .filter(|p| {
                p.status.as_ref().is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "Ready"
                            && c.status == "False"
                            && said.iter().any(|w| c.message.contains(w))
                    })
                })
            })
            .count();
        if failed == n {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(900),
            "{failed} of {n} passes failed as expected: {:?}",
            mine.iter().map(|p| &p.status).collect::<Vec<_>>()
        );
    }
}

fn operator(cluster: &KubeCluster) -> std::process::Child {
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["operator", "--identity", "bench", "--listen", &listen])
        // The stores here listen on loopback, which the operator denies by default.
        .args(["--deny-endpoints", ""])
        .env("KUBECONFIG", cluster.operator_kubeconfig())
        .env("TIDEMARK_LOG", "error")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

async fn run(backups: usize, template: usize, policies: usize, fat: usize, weed: &SeaweedFs) {
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
    all_refused(&papi, "p", policies, &["more than one pass may hold"]).await;
    let peak = peak_kib(child.id()).unwrap_or(0);
    println!(
        "operator VmHWM after {policies} passes against hostile stores ({:.1} s): {} MiB",
        t0.elapsed().as_secs_f64(),
        peak >> 10
    );

    // Step 3: one planted object in each tenant's cluster of a real S3 server.
    for i in 0..fat.max(3) {
        let (_, (key, body)) = fat_object(i);
        plant(weed, &format!("fat-{i}"), key, body).await;
    }
    for i in 0..fat {
        let p: BackupPolicy = serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
            "metadata": {"name": format!("fat-{i}"), "namespace": ns},
            "spec": {
                "objectStore": {"bucket": BUCKET, "endpoint": weed.endpoint, "credentialsSecret": "s3"},
                "retention": {"keepLast": 1},
            },
        }))
        .unwrap();
        papi.create(&PostParams::default(), &p).await.unwrap();
    }
    let t0 = Instant::now();
    all_refused(
        &papi,
        "fat-",
        fat,
        &["is larger than", "more than one pass may hold"],
    )
    .await;
    let peak = peak_kib(child.id()).unwrap_or(0);
    println!(
        "operator VmHWM after {fat} passes against planted objects (a 15 MB lease, a 15 MB \
         shard summary, 20,000 unordered shards, in turn; {:.1} s): {} MiB",
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
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"));
    cmd.args(["ls", "--store", "s3://b", "--cluster", "c"])
        .args(["--endpoint", &server.endpoint])
        .env("AWS_ACCESS_KEY_ID", "a")
        .env("AWS_SECRET_ACCESS_KEY", "b")
        .env("TIDEMARK_MAX_LISTED_KEYS", "100000");
    let (peak, took) = sampled_peak(cmd);
    println!(
        "peer: tidemark ls against keys without end, 100000-key budget: VmHWM {} MiB, {:.1} s",
        peak >> 10,
        took.as_secs_f64()
    );
}
