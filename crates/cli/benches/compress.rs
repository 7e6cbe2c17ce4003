//! Compression and encryption on the stream (issue 19 §1, §2): `tidemark push` of a real
//! `mariabackup` stream to a local SeaweedFS, uncompressed and with zstd at three levels,
//! then encrypted with age (`--recipient`) plain and after zstd:3, side by side with
//! `zstd -T0 -3 | aws s3 cp -` and `zstd -T0 -3 | age -r KEY | aws s3 cp -` on the same
//! bytes; then end to end from the database, beside `mariabackup --compress`. Reports each
//! run's throughput (of the content, MiB/s) and ratio (content ÷ stored), the median of the
//! runs. The peers come from `bench/install-peers.sh` (aws, age, zstd).
//!
//! The stream: a MariaDB server (the Debian packages the tests use) filled with
//! `TIDEMARK_BENCH_COMPRESS_MIB` (default 1024) MiB of rows — text that compresses as
//! real tables do, neither random nor repeated — then `mariabackup --backup
//! --stream=xbstream` into a file every run reads. `TIDEMARK_BENCH_ROUNDS` sets the runs
//! (default 3); `TIDEMARK_BENCH_COMPRESS_ONLY` keeps some of Tidemark's rows (a comma list
//! of settings, `age+` before one for the encrypted row: `zstd:3,age+zstd:3`; the peers
//! always run), and `TIDEMARK_BENCH_END_TO_END=0` leaves out the end-to-end table.
//! `cargo bench -p tidemark --bench compress`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs::File;
use std::process::{Command, Stdio};
use std::time::Instant;

use common::env_usize;
use tidemark_store::testkit::{ACCESS_KEY, BUCKET, MariaDb, SECRET_KEY, SeaweedFs};

/// The run's median throughput (content MiB/s) and its stored size.
fn median(mut runs: Vec<(f64, u64)>) -> (f64, u64) {
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs[runs.len() / 2]
}

fn main() {
    let mib = env_usize("TIDEMARK_BENCH_COMPRESS_MIB", 1024);
    let rounds = env_usize("TIDEMARK_BENCH_ROUNDS", 3);
    let zstd = common::tool("zstd").expect("zstd is missing: apt-get install zstd");
    let aws = common::tool("aws").expect("aws is missing: run bench/install-peers.sh first");
    let age = common::tool("age").expect("age is missing: run bench/install-peers.sh first");
    let (_, recipient) = tidemark_store::crypt::generate();
    let db = MariaDb::start();
    let t = Instant::now();
    common::fill(&db, mib);
    eprintln!("filled {mib} MiB in {:.0?}", t.elapsed());
    let stream = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = Command::new("mariabackup");
    cmd.args(db.client_args())
        .args(["--backup", "--stream=xbstream", "--target-dir"])
        .arg(tempfile::tempdir().unwrap().keep())
        .stdout(File::create(stream.path()).unwrap())
        .stderr(Stdio::null());
    assert!(cmd.status().unwrap().success(), "mariabackup failed");
    let content = std::fs::metadata(stream.path()).unwrap().len();
    eprintln!("mariabackup stream: {:.0} MiB", content as f64 / 1048576.0);
    let server = SeaweedFs::start();
    let mib_of = |b: u64| b as f64 / 1048576.0;
    let env = |c: &mut Command| {
        c.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env_remove("AWS_CA_BUNDLE")
            .env_remove("TIDEMARK_COMPRESSION");
    };
    println!("| run | MiB/s (content) | ratio | ÷ uncompressed push |");
    println!("|---|---:|---:|---:|");
    let mut baseline = None;
    let only = std::env::var("TIDEMARK_BENCH_COMPRESS_ONLY").unwrap_or_default();
    for (setting, encrypted) in [
        ("none", false),
        ("zstd:1", false),
        ("zstd:3", false),
        ("zstd:9", false),
        ("none", true),
        ("zstd:3", true),
    ]
    .into_iter()
    .filter(|(s, e)| {
        let name = if *e {
            format!("age+{s}")
        } else {
            (*s).to_owned()
        };
        only.is_empty() || only.split(',').any(|o| o.trim() == name)
    }) {
        let runs = (0..rounds)
            .map(|i| {
                let mut c = Command::new(env!("CARGO_BIN_EXE_tidemark"));
                env(&mut c);
                c.args([
                    "push",
                    "--store",
                    &format!("s3://{BUCKET}"),
                    "--cluster",
                    "bench",
                ])
                .args(["--endpoint", &server.endpoint, "--ext", "xbstream"])
                .args(["--backup-name", &format!("c{i}"), "--compression", setting])
                .args(["--output", "json"])
                .args(if encrypted {
                    vec!["--recipient", recipient.as_str()]
                } else {
                    vec![]
                })
                .stdin(File::open(stream.path()).unwrap())
                .stderr(Stdio::inherit());
                let t = Instant::now();
                let out = c.output().unwrap();
                let secs = t.elapsed().as_secs_f64();
                assert!(out.status.success(), "push {setting} failed");
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                (mib_of(content) / secs, v["size"].as_u64().unwrap())
            })
            .collect();
        let (speed, stored) = median(runs);
        let base = *baseline.get_or_insert(speed);
        println!(
            "| `tidemark push --compression {setting}{}` | {speed:.1} | {:.2} | {:.2} |",
            if encrypted {
                " --recipient age1…"
            } else {
                ""
            },
            content as f64 / stored as f64,
            speed / base
        );
    }
    // The peers: zstd's own CLI (all cores) into `aws s3 cp -`, and with age between.
    let peer = |encrypt: bool| {
        let runs = (0..rounds)
            .map(|i| {
                let age_stage = if encrypt {
                    format!("| {} -r {recipient} ", age.display())
                } else {
                    String::new()
                };
                let script = format!(
                    "set -o pipefail; {} -T0 -3 -c < {} {age_stage}| {} --endpoint-url {} s3 cp - s3://{BUCKET}/peer/{i}.zst --quiet",
                    zstd.display(),
                    stream.path().display(),
                    aws.display(),
                    server.endpoint
                );
                let mut c = Command::new("bash");
                env(&mut c);
                c.args(["-c", &script]);
                let t = Instant::now();
                assert!(c.status().unwrap().success(), "the peer pipeline failed");
                let secs = t.elapsed().as_secs_f64();
                (mib_of(content) / secs, 0)
            })
            .collect();
        median(runs).0
    };
    let speed = peer(false);
    let encrypted_speed = peer(true);
    let ratio = {
        let out = Command::new(&zstd)
            .args(["-T0", "-3", "-c"])
            .stdin(File::open(stream.path()).unwrap())
            .output()
            .unwrap();
        content as f64 / out.stdout.len() as f64
    };
    println!(
        "| `zstd -T0 -3 \\| aws s3 cp -` | {speed:.1} | {ratio:.2} | {:.2} |",
        speed / baseline.unwrap_or(speed)
    );
    println!(
        "| `zstd -T0 -3 \\| age -r age1… \\| aws s3 cp -` | {encrypted_speed:.1} | {ratio:.2} | {:.2} |",
        encrypted_speed / baseline.unwrap_or(encrypted_speed)
    );
    if env_usize("TIDEMARK_BENCH_END_TO_END", 1) != 0 {
        end_to_end(&db, &server, content, rounds);
    }
}

/// End to end from the database: `mariabackup --backup --stream=xbstream | tidemark push`
/// uncompressed and with zstd:3, beside mariabackup's own compression (`--compress`,
/// QuickLZ, deprecated in 10.11, on both cores) into an uncompressed push. Throughput is of
/// the uncompressed stream's size over the whole pipeline's time; the ratio is that size
/// over what the store holds.
fn end_to_end(db: &MariaDb, server: &SeaweedFs, content: u64, rounds: usize) {
    println!();
    println!("| end to end (backup + upload) | MiB/s (stream) | ratio |");
    println!("|---|---:|---:|");
    let client = db.client_args().join(" ");
    for (label, extra, compression) in [
        ("`mariabackup \\| tidemark push`", "", "none"),
        (
            "`mariabackup \\| tidemark push --compression zstd:3`",
            "",
            "zstd:3",
        ),
        (
            "`mariabackup --compress --compress-threads=2 \\| tidemark push`",
            "--compress --compress-threads=2",
            "none",
        ),
    ] {
        let runs = (0..rounds)
            .map(|i| {
                let target = tempfile::tempdir().unwrap();
                let script = format!(
                    "set -o pipefail; mariabackup {client} --backup --stream=xbstream {extra} --target-dir={} 2>/dev/null \
                     | {} push --store s3://{BUCKET} --cluster bench --endpoint {} --ext xbstream \
                       --backup-name e{i} --compression {compression} --output json",
                    target.path().display(),
                    env!("CARGO_BIN_EXE_tidemark"),
                    server.endpoint,
                );
                let mut c = Command::new("bash");
                c.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
                    .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
                    .env("AWS_REGION", "us-east-1")
                    .args(["-c", &script])
                    .stderr(Stdio::inherit());
                let t = Instant::now();
                let out = c.output().unwrap();
                let secs = t.elapsed().as_secs_f64();
                assert!(out.status.success(), "{label} failed");
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                (content as f64 / 1048576.0 / secs, v["size"].as_u64().unwrap())
            })
            .collect();
        let (speed, stored) = median(runs);
        println!(
            "| {label} | {speed:.1} | {:.2} |",
            content as f64 / stored as f64
        );
    }
}
