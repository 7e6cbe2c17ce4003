//! `tidemark copy` of a 2 GiB chain plus binlog segments from one S3 server to another
//! (two SeaweedFS on 127.0.0.1), side by side with the peers on the same objects:
//! `rclone copy` between the two servers, and `aws s3 sync` (which cannot copy between two
//! endpoints in one command: down to a local directory, then up, timed together). Then the
//! rate limit: `tidemark copy --bandwidth` over about a minute, against the rate asked for.
//!
//! `bench/install-peers.sh` installs the peers; then `cargo bench -p tidemark --bench copy`
//! (TIDEMARK_BENCH_COPY_MIB sets the chain's size, TIDEMARK_BENCH_ROUNDS the runs per tool;
//! the median is reported).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use common::{env_usize, tool};
use tidemark_store::format::{BackupType, IndexEntry};
use tidemark_store::testkit::{ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedFs};
use tidemark_store::transfer::{Attempt, AttemptRecord, AttemptSpec, new_backup_id};
use tidemark_store::{ClusterStore, NoProgress, layout};

fn peer(name: &str) -> PathBuf {
    tool(name).unwrap_or_else(|| panic!("{name} is missing: run bench/install-peers.sh first"))
}

/// `mib` MiB of incompressible bytes (xorshift from `seed`).
fn bytes(mib: usize, seed: u64) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ seed;
    let mut out = vec![0u8; mib << 20];
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    out
}

/// A full and two increments (three quarters, then an eighth each, of `mib`), and 32
/// segments of 4 MiB, committed in `store`. Returns the bytes written.
async fn fill(store: &ClusterStore, mib: usize) -> u64 {
    let mut parent: Option<String> = None;
    let mut total = 0u64;
    for (i, part) in [mib * 3 / 4, mib / 8, mib / 8].into_iter().enumerate() {
        let id = new_backup_id(jiff::Timestamp::now());
        let spec = AttemptSpec {
            backup_name: "nightly".into(),
            backup_id: id.clone(),
            kind: if parent.is_some() {
                BackupType::Incremental
            } else {
                BackupType::Full
            },
            parent_id: parent.clone(),
            method: "exec".into(),
            payload_name: "backup.bin".into(),
            started_at: jiff::Timestamp::now(),
            labels: BTreeMap::new(),
            ttl: None,
            lock_until: None,
        };
        let body = bytes(part, i as u64);
        total += body.len() as u64;
        let attempt = Attempt::begin(store, &spec).await.unwrap();
        let p = attempt
            .upload(&mut body.as_slice(), &NoProgress)
            .await
            .unwrap();
        attempt
            .finish(AttemptRecord {
                payload: vec![p],
                ..Default::default()
            })
            .await
            .unwrap();
        parent = Some(id);
    }
    let mut entries = Vec::new();
    for seq in 1..=32u64 {
        let body = bytes(4, 100 + seq);
        total += body.len() as u64;
        let name = format!("mysql-bin.{seq:06}");
        let at = jiff::Timestamp::now();
        use sha2::Digest;
        entries.push(IndexEntry {
            name: name.clone(),
            sequence: seq,
            first_event_at: Some(at),
            last_event_at: Some(at),
            size: body.len() as u64,
            sha256: Some(hex::encode(sha2::Sha256::digest(&body))),
            compression: None,
            encryption: None,
            server_id: None,
            file: None,
            gtid_list: None,
            previous_gtids: None,
            gtid_set: None,
            gtids: Vec::new(),
        });
        object_store::ObjectStoreExt::put(
            store.object_store().as_ref(),
            &layout::segment_key(&name),
            body.into(),
        )
        .await
        .unwrap();
    }
    tidemark_store::index::write_new(store, &entries, tidemark_store::index::SHARD_SIZE)
        .await
        .unwrap();
    total
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run(mut c: Command) -> f64 {
    let t = Instant::now();
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.elapsed().as_secs_f64()
}

fn main() {
    let mib = env_usize("TIDEMARK_BENCH_COPY_MIB", 2048);
    let rounds = env_usize("TIDEMARK_BENCH_ROUNDS", 3);
    let aws = peer("aws");
    let rclone = peer("rclone");
    let (src, dst) = (SeaweedFs::start(), SeaweedFs::start());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let total = rt.block_on(fill(&src.cluster_store("db"), mib));
    let gib = total as f64 / (1u64 << 30) as f64;
    println!(
        "copy: {:.2} GiB (a chain of 3 backups and 32 segments), {rounds} round(s) each",
        gib
    );
    let env = |c: &mut Command| {
        // (This machine's AWS_CA_BUNDLE names a bundle rclone's SDK refuses for plain HTTP.)
        c.env_remove("AWS_CA_BUNDLE")
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1");
    };
    let bin = env!("CARGO_BIN_EXE_tidemark");
    let mut results: Vec<(&str, f64)> = Vec::new();
    let mut times = Vec::new();
    for r in 0..rounds {
        let mut c = Command::new(bin);
        env(&mut c);
        c.args([
            "copy",
            "--from",
            &format!("s3://{BUCKET}"),
            "--cluster",
            "db",
        ])
        .args(["--endpoint", &src.endpoint])
        .args(["--to", &format!("s3://{BUCKET}/tidemark-{r}")])
        .args([
            "--to-endpoint",
            &dst.endpoint,
            "--name",
            &format!("bench{r}"),
        ]);
        times.push(run(c));
    }
    results.push(("tidemark copy", median(times)));
    let mut times = Vec::new();
    for r in 0..rounds {
        let mut c = Command::new(&rclone);
        env(&mut c);
        for (remote, endpoint) in [("SRC", &src.endpoint), ("DST", &dst.endpoint)] {
            c.env(format!("RCLONE_CONFIG_{remote}_TYPE"), "s3")
                .env(format!("RCLONE_CONFIG_{remote}_PROVIDER"), "Other")
                .env(format!("RCLONE_CONFIG_{remote}_ENDPOINT"), endpoint)
                .env(format!("RCLONE_CONFIG_{remote}_ACCESS_KEY_ID"), ACCESS_KEY)
                .env(
                    format!("RCLONE_CONFIG_{remote}_SECRET_ACCESS_KEY"),
                    SECRET_KEY,
                );
        }
        c.args([
            "copy",
            &format!("src:{BUCKET}/db"),
            &format!("dst:{BUCKET}/rclone-{r}/db"),
        ]);
        times.push(run(c));
    }
    results.push(("rclone copy", median(times)));
    let mut times = Vec::new();
    for r in 0..rounds {
        let local = tempfile::tempdir().unwrap();
        let mut down = Command::new(&aws);
        env(&mut down);
        down.args(["s3", "sync", &format!("s3://{BUCKET}/db")])
            .arg(local.path())
            .args(["--endpoint-url", &src.endpoint, "--only-show-errors"]);
        let mut up = Command::new(&aws);
        env(&mut up);
        up.args(["s3", "sync"])
            .arg(local.path())
            .arg(format!("s3://{BUCKET}/aws-{r}/db"))
            .args(["--endpoint-url", &dst.endpoint, "--only-show-errors"]);
        times.push(run(down) + run(up));
    }
    results.push(("aws s3 sync (down, then up)", median(times)));
    for (name, secs) in &results {
        println!(
            "  {name:<30} {secs:>7.1} s  {:>7.1} MiB/s",
            total as f64 / (1 << 20) as f64 / secs
        );
    }
    // The rate limit over more than a minute (the whole copy at a rate that takes 62 s).
    let rate_mib = (total as f64 / (1 << 20) as f64 / 62.0).floor().max(1.0);
    let mut c = Command::new(bin);
    env(&mut c);
    c.args([
        "copy",
        "--from",
        &format!("s3://{BUCKET}"),
        "--cluster",
        "db",
    ])
    .args(["--endpoint", &src.endpoint])
    .args(["--to", &format!("s3://{BUCKET}/limited")])
    .args(["--to-endpoint", &dst.endpoint, "--name", "limited"])
    .args(["--bandwidth", &format!("{rate_mib}MiB/s")]);
    let secs = run(c);
    let achieved = total as f64 / (1 << 20) as f64 / secs;
    println!(
        "  --bandwidth {rate_mib}MiB/s: {secs:.1} s, {achieved:.1} MiB/s ({:+.1} % of the limit)",
        (achieved / rate_mib - 1.0) * 100.0
    );
}
