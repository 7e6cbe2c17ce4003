//! `tidemark push` of a 1 GiB stream to a local SeaweedFS, side by side with the peers that
//! stream stdin to S3: `aws s3 cp -`, `s5cmd pipe` and `rclone rcat`, on the same bytes.
//! Tidemark computes sha256 on the way (the peers compute what they compute by default).
//!
//! `bench/install-peers.sh` installs the peers into `.bench-tools/`; then
//! `cargo bench -p tidemark --bench push` (TIDEMARK_BENCH_PUSH_MIB sets the size,
//! TIDEMARK_BENCH_ROUNDS the runs per tool; the median is reported).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use common::{env_usize, tool};
use tidemark_store::testkit::{ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedFs};

fn peer(name: &str) -> PathBuf {
    tool(name).unwrap_or_else(|| panic!("{name} is missing: run bench/install-peers.sh first"))
}

/// Incompressible bytes (xorshift), written once to a file every tool reads.
fn payload(mib: usize) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..mib {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        f.write_all(&buf).unwrap();
    }
    f.flush().unwrap();
    f
}

struct Tool {
    name: &'static str,
    command: Box<dyn Fn(usize) -> Command>,
}

fn main() {
    let mib = env_usize("TIDEMARK_BENCH_PUSH_MIB", 1024);
    let rounds = env_usize("TIDEMARK_BENCH_ROUNDS", 3);
    let aws = peer("aws");
    let s5cmd = peer("s5cmd");
    let rclone = peer("rclone");
    let server = SeaweedFs::start();
    let endpoint = server.endpoint.clone();
    let data = payload(mib);
    let base_env = move |c: &mut Command| {
        c.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            // A sandbox CA bundle breaks rclone's plain-HTTP client; nothing here uses TLS.
            .env_remove("AWS_CA_BUNDLE");
    };
    let tools: Vec<Tool> = vec![
        Tool {
            name: "tidemark push (sha256)",
            command: Box::new({
                let endpoint = endpoint.clone();
                move |i| {
                    let mut c = Command::new(env!("CARGO_BIN_EXE_tidemark"));
                    base_env(&mut c);
                    c.args(["push", "--store", &format!("s3://{BUCKET}"), "--cluster"])
                        .arg("bench")
                        .args(["--endpoint", &endpoint, "--backup-name"])
                        .arg(format!("run{i}"));
                    c
                }
            }),
        },
        Tool {
            name: "aws s3 cp -",
            command: Box::new({
                let endpoint = endpoint.clone();
                move |i| {
                    let mut c = Command::new(&aws);
                    base_env(&mut c);
                    c.args(["s3", "cp", "-"])
                        .arg(format!("s3://{BUCKET}/aws/run{i}"))
                        .args(["--endpoint-url", &endpoint, "--only-show-errors"]);
                    c
                }
            }),
        },
        Tool {
            name: "s5cmd pipe",
            command: Box::new({
                let endpoint = endpoint.clone();
                move |i| {
                    let mut c = Command::new(&s5cmd);
                    base_env(&mut c);
                    c.args(["--endpoint-url", &endpoint, "pipe"])
                        .arg(format!("s3://{BUCKET}/s5cmd/run{i}"));
                    c
                }
            }),
        },
        Tool {
            name: "rclone rcat",
            command: Box::new({
                let endpoint = endpoint.clone();
                move |i| {
                    let mut c = Command::new(&rclone);
                    base_env(&mut c);
                    c.env("RCLONE_CONFIG_BENCH_TYPE", "s3")
                        .env("RCLONE_CONFIG_BENCH_PROVIDER", "Other")
                        .env("RCLONE_CONFIG_BENCH_ENDPOINT", &endpoint)
                        .env("RCLONE_CONFIG_BENCH_ACCESS_KEY_ID", ACCESS_KEY)
                        .env("RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY", SECRET_KEY)
                        .arg("rcat")
                        .arg(format!("bench:{BUCKET}/rclone/run{i}"));
                    c
                }
            }),
        },
    ];
    let mut results: Vec<(&str, f64)> = Vec::new();
    for tool in &tools {
        let mut secs = Vec::new();
        for i in 0..rounds {
            let mut c = (tool.command)(i);
            let t = Instant::now();
            let out = c
                .stdin(Stdio::from(File::open(data.path()).unwrap()))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .output()
                .unwrap_or_else(|e| panic!("{}: {e}", tool.name));
            let s = t.elapsed().as_secs_f64();
            assert!(
                out.status.success(),
                "{}: {}",
                tool.name,
                String::from_utf8_lossy(&out.stderr)
            );
            secs.push(s);
        }
        secs.sort_by(f64::total_cmp);
        let median = secs[secs.len() / 2];
        results.push((tool.name, mib as f64 / median));
        eprintln!("{}: {:?}", tool.name, secs);
    }
    let fastest_peer = results[1..].iter().map(|r| r.1).fold(f64::MIN, f64::max);
    println!("\nstdin → S3 (SeaweedFS on 127.0.0.1), {mib} MiB, median of {rounds}");
    for (name, mibs) in &results {
        println!(
            "{name:<24} {mibs:>8.1} MiB/s   tidemark ÷ this = {:.2}",
            results[0].1 / mibs
        );
    }
    println!(
        "tidemark ÷ fastest peer = {:.2}",
        results[0].1 / fastest_peer
    );
}
