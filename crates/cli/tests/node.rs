//! The operator on a real single-node Kubernetes cluster (containerd, kubelet, scheduler,
//! kube-proxy: `tidemark_operator::testkit::Node`), installed as the docs say, running the
//! image users run, against real MariaDB pods and a real S3 server (SeaweedFS) that the
//! pods reach over the node's link.
//!
//! The node takes a while to start, so one node serves every scenario: this test has its
//! own `main` (harness = false), starts the node once, runs the scenarios one after the
//! other (each in a namespace of its own; a failing one does not stop the others) and
//! stops everything at the end, on success and on failure. Arguments select scenarios
//! by substring, as libtest's do; the summary line has libtest's form.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use tidemark_operator::testkit::node::MARIADB_IMAGE;
use tidemark_operator::testkit::{Node, eventually};
use tidemark_store::testkit::SeaweedFs;

/// What every scenario shares.
struct World {
    node: Node,
    s3: SeaweedFs,
}

type Scenario = fn(Arc<World>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

const SCENARIOS: &[(&str, Scenario)] = &[("a_pod_runs_to_completion", |w| {
    Box::pin(a_pod_runs_to_completion(w))
})];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in SCENARIOS {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let selected: Vec<&(&str, Scenario)> = SCENARIOS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    let started = Instant::now();
    println!("\nrunning {} tests", selected.len());
    let mut failed = Vec::new();
    if !selected.is_empty() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        failed = rt.block_on(async {
            let world = Arc::new(World::start().await);
            let mut failed = Vec::new();
            for (name, scenario) in &selected {
                let t = Instant::now();
                let outcome = tokio::spawn(scenario(world.clone())).await;
                let took = t.elapsed();
                match outcome {
                    Ok(()) => println!("test {name} ... ok ({took:.1?})"),
                    Err(e) => {
                        println!("test {name} ... FAILED ({took:.1?}): {e}");
                        failed.push(*name);
                    }
                }
            }
            let world = Arc::try_unwrap(world).ok().expect("scenarios hold no World");
            tokio::task::spawn_blocking(move || drop(world)).await.expect("teardown");
            failed
        });
    }
    let (n, f) = (selected.len(), failed.len());
    if f > 0 {
        println!("\nfailures:\n    {}", failed.join("\n    "));
    }
    println!(
        "\ntest result: {}. {} passed; {f} failed; 0 ignored; 0 measured; {} filtered out; finished in {:.2}s\n",
        if f == 0 { "ok" } else { "FAILED" },
        n - f,
        SCENARIOS.len() - n,
        started.elapsed().as_secs_f64()
    );
    if f == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

impl World {
    async fn start() -> Self {
        let node = Node::start(&[]).await;
        let ip = node.host_ip().to_string();
        let s3 = tokio::task::spawn_blocking(move || SeaweedFs::start_on(&ip))
            .await
            .unwrap();
        World { node, s3 }
    }
}

async fn a_pod_runs_to_completion(w: Arc<World>) {
    let ns = "smoke";
    w.node.namespace(ns).await;
    let client = w.node.cluster().admin_client();
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "hello", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": MARIADB_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", format!("echo hello; wget -q -O- {}/ >/dev/null 2>&1 || true", w.s3.endpoint)]}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let phase = eventually("the pod finishes", || async {
        let p = pods.get("hello").await.unwrap();
        let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
        eprintln!("{phase}: {}", serde_json::to_string(&pods.get("hello").await.unwrap().status).unwrap());
        (phase == "Succeeded" || phase == "Failed").then_some(phase)
    })
    .await;
    assert_eq!(phase, "Succeeded", "{}", w.node.log_tail("kubelet"));
    let _ = Duration::from_secs(1);
}
