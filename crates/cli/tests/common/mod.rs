//! Helpers shared by the tests that run the real `tidemark` binary.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};

use serde_json::Value;
use tidemark_store::testkit::SeaweedFs;

/// The binary, with no store, cluster or S3 settings leaking in from the environment, and
/// the user a restore's private server runs as when the tests run as root.
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tidemark"));
    c.env("TIDEMARK_SERVER_USER", tidemark_store::testkit::SERVER_USER)
        .env_remove("TIDEMARK_STORE")
        .env_remove("TIDEMARK_CLUSTER")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ENDPOINT");
    c
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// stdout as JSON, or a panic that shows both streams.
pub fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            stderr(o)
        )
    })
}

/// `tidemark SUB --store … --cluster CLUSTER --endpoint … REST…` with the store's
/// credentials; must succeed.
pub fn on_store(s3: &SeaweedFs, cluster: &str, args: &[&str]) -> Output {
    on_bucket(s3, &s3.url(), cluster, args)
}

/// [`on_store`] on another bucket of the server (`s3://name`, a lock-enabled one).
pub fn on_bucket(s3: &SeaweedFs, url: &str, cluster: &str, args: &[&str]) -> Output {
    let (sub, rest) = args.split_first().expect("a subcommand");
    let out = bin()
        .envs(s3.env())
        .arg(sub)
        .args([
            "--store",
            url,
            "--cluster",
            cluster,
            "--endpoint",
            &s3.endpoint,
        ])
        .args(rest)
        .output()
        .expect("the tidemark binary");
    assert!(out.status.success(), "tidemark {args:?}: {}", stderr(&out));
    out
}

/// Stops a `tidemark run` with SIGTERM and waits for it; it must exit cleanly. Its log.
pub fn stop_run(run: &mut std::process::Child, log: &std::path::Path) -> String {
    let ok = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -TERM {}", run.id());
    let status = run.wait().expect("tidemark run");
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(status.success(), "{status}\n{text}");
    text
}

/// Every file named `name` under `dir`, sorted.
pub fn find(dir: &std::path::Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.file_name() == name {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}
