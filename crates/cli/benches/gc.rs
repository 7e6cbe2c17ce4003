//! GC pass throughput against a local SeaweedFS, side by side with other deleters, and the
//! steady-state pass over a large log archive.
//!
//!     bench/install-peers.sh                        # once: s3rm-rs, s5cmd, awscli, barman, rclone
//!     cargo bench -p tidemark --bench gc            # both scenarios
//!     cargo bench -p tidemark --bench gc -- peers   # or: steady
//!
//! Sizes (environment): TIDEMARK_BENCH_BACKUPS (10000), TIDEMARK_BENCH_SEGMENTS (80000),
//! TIDEMARK_BENCH_ARCHIVE (1000000), TIDEMARK_BENCH_EXPIRE (3000), and
//! TIDEMARK_BENCH_PEER_TIMEOUT (300 s: a tool still running then is stopped and what it
//! deleted so far counts over that time).
//!
//! Scenario "peers": each tool gets its own copy of the same dataset under its own prefix —
//! N backups (payload + metadata.json) and M segments — and deletes it. Tidemark runs a
//! whole retention pass (`tidemark gc --keep-last 1`: list, plan, audit record, deletes,
//! index rewrite) that deletes every backup but the newest and every segment behind it;
//! the bare deleters remove the prefix. Barman runs `barman-cloud-backup-delete` with a
//! retention policy over the same counts in Barman's layout. Survivors are counted after
//! every run: a tool that exits 0 having deleted nothing is reported, not timed as fast.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{env_usize, tool};
use futures::{StreamExt, TryStreamExt, stream};
use jiff::{SignedDuration, Timestamp};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tidemark_store::synth::{self, SynthBackup};
use tidemark_store::testkit::{ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedFs};

const START: &str = "2025-01-01T00:00:00Z";

fn start() -> Timestamp {
    START.parse().unwrap()
}

/// Writes `objects` with many requests in flight.
async fn put_all(store: &dyn ObjectStore, objects: Vec<(String, Vec<u8>)>) {
    stream::iter(objects)
        .map(|(k, v)| async move {
            let key = ObjPath::from(k);
            for attempt in 0..5 {
                match store.put(&key, PutPayload::from(v.clone())).await {
                    Ok(_) => return,
                    Err(e) if attempt == 4 => panic!("put {key}: {e}"),
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        })
        .buffer_unordered(128)
        .collect::<Vec<()>>()
        .await;
}

async fn count(store: &dyn ObjectStore, prefix: &str) -> usize {
    store
        .list(Some(&ObjPath::from(prefix)))
        .try_fold(0usize, |n, _| async move { Ok(n + 1) })
        .await
        .unwrap()
}

/// A synthetic backup's two objects (its payload and `metadata.json`), keys and bodies,
/// to write in bulk.
fn backup_objects(cluster: &str, b: &SynthBackup) -> [(String, Vec<u8>); 2] {
    [
        (
            format!("{cluster}/{}/{}/backup.tar", b.name, b.id),
            b.payload.clone(),
        ),
        (
            format!("{cluster}/{}/{}/metadata.json", b.name, b.id),
            serde_json::to_vec_pretty(&b.metadata(cluster)).unwrap(),
        ),
    ]
}

/// The Tidemark-layout dataset: `backups` hourly fulls and `segments` segments, the last
/// backup after every segment, so keepLast 1 deletes all other backups and every segment.
async fn tidemark_dataset(
    server: &SeaweedFs,
    cluster: &str,
    backups: usize,
    segments: usize,
) -> usize {
    let store = server.cluster_store(cluster);
    let every = SignedDuration::from_secs(3600);
    let list: Vec<SynthBackup> = (0..backups)
        .map(|i| {
            let mut b = SynthBackup::full("nightly", start() + every * (i as i32), i as u32);
            b.payload = vec![b'x'; 64];
            b
        })
        .collect();
    // Segments span the backups' time; their count is independent.
    let span = every * (backups as i32);
    let seg_every = SignedDuration::from_nanos((span.as_nanos() / segments as i128) as i64);
    let entries = synth::segments("mysql-bin", 1_000_000, segments as u64, start(), seg_every);
    let raw = server.raw_store();
    let mut objects: Vec<(String, Vec<u8>)> = Vec::with_capacity(backups * 2 + segments);
    for b in &list {
        objects.extend(backup_objects(cluster, b));
    }
    for e in &entries {
        objects.push((format!("{cluster}/binlogs/{}", e.name), vec![b's'; 16]));
    }
    let n = objects.len();
    put_all(raw.as_ref(), objects).await;
    // The kept backup: after every segment.
    let last = SynthBackup::full(
        "nightly",
        start() + span + SignedDuration::from_hours(2),
        0xffff_ffff,
    );
    synth::write_backups(&store, &[last]).await.unwrap();
    synth::write_index(&store, &entries).await.unwrap();
    n
}

/// Barman's layout: `<server>/base/<id>/backup.info` + `data.tar`, and WAL files under
/// `<server>/wals/<timeline+log>/`.
async fn barman_dataset(server: &SeaweedFs, prefix: &str, backups: usize, wals: usize) -> usize {
    let raw = server.raw_store();
    let mut objects: Vec<(String, Vec<u8>)> = Vec::with_capacity(backups * 2 + wals);
    let wal_name = |k: usize| format!("00000001{:08X}{:08X}", k / 256, k % 256);
    let per_backup = (wals / backups.max(1)).max(1);
    for i in 0..=backups {
        let at = start() + SignedDuration::from_hours(i as i64);
        let id = at.strftime("%Y%m%dT%H%M%S").to_string();
        let begin = (i * per_backup).min(wals.saturating_sub(1) + 1);
        let info = format!(
            "backup_id={id}\nbackup_name=None\nbegin_offset=40\nbegin_time={begin_time}\nbegin_wal={bw}\nbegin_xlog=0/{bx:X}\nbackup_label=None\nconfig_file=/etc/postgresql/postgresql.conf\ncopy_stats=None\ndeduplicated_size=None\nend_offset=312\nend_time={end_time}\nend_wal={bw}\nend_xlog=0/{bx:X}\nerror=None\nhba_file=/etc/postgresql/pg_hba.conf\nident_file=/etc/postgresql/pg_ident.conf\nincluded_files=None\nmode=concurrent\npgdata=/var/lib/postgresql/data\nserver_name=pg\nsize=64\nstatus=DONE\nsystemid=7000000000000000000\ntablespaces=None\ntimeline=1\nversion=150000\nxlog_segment_size=16777216\n",
            begin_time = at.strftime("%Y-%m-%d %H:%M:%S+00:00"),
            end_time = (at + SignedDuration::from_mins(5)).strftime("%Y-%m-%d %H:%M:%S+00:00"),
            bw = wal_name(begin),
            bx = begin * 16_777_216,
        );
        objects.push((
            format!("{prefix}/pg/base/{id}/backup.info"),
            info.into_bytes(),
        ));
        objects.push((format!("{prefix}/pg/base/{id}/data.tar"), vec![b'x'; 64]));
    }
    for k in 0..wals {
        let name = wal_name(k);
        objects.push((
            format!("{prefix}/pg/wals/{}/{name}", &name[..16]),
            vec![b'w'; 16],
        ));
    }
    let n = objects.len();
    put_all(raw.as_ref(), objects).await;
    n
}

/// Builds a peer's delete command for a prefix, or `None` when the tool is not installed.
type PeerCommand<'a> = Box<dyn Fn(&str) -> Option<Command> + 'a>;

struct Row {
    tool: &'static str,
    objects: usize,
    secs: f64,
    survivors: usize,
    note: String,
}

/// Runs a tool, stopping it after `TIDEMARK_BENCH_PEER_TIMEOUT` seconds (default 300):
/// what it deleted by then still counts, over the time it had.
fn timed(mut cmd: Command) -> (f64, bool, String) {
    let limit = Duration::from_secs(env_usize("TIDEMARK_BENCH_PEER_TIMEOUT", 300) as u64);
    let stderr_file = tempfile::NamedTempFile::new().unwrap();
    cmd.stdout(std::process::Stdio::null())
        .stderr(stderr_file.reopen().unwrap());
    let t = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let (ok, stopped) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status.success(), false);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break (false, true);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let secs = t.elapsed().as_secs_f64();
    let mut note = std::fs::read_to_string(stderr_file.path()).unwrap_or_default();
    if stopped {
        note = format!("stopped after {:.0} s (time cap)", limit.as_secs_f64());
    } else if std::env::var_os("TIDEMARK_LOG").is_none() {
        note.truncate(300);
    }
    (secs, ok, note)
}

fn peers(rt: &tokio::runtime::Runtime, server: &SeaweedFs) {
    let backups = env_usize("TIDEMARK_BENCH_BACKUPS", 10_000);
    let segments = env_usize("TIDEMARK_BENCH_SEGMENTS", 80_000);
    let raw = server.raw_store();
    let mut rows: Vec<Row> = Vec::new();
    let aws_env = server.env();

    // Tidemark: a whole retention pass.
    let t = Instant::now();
    let n = rt.block_on(tidemark_dataset(server, "tm", backups, segments));
    eprintln!("populated {n} objects in {:.1}s", t.elapsed().as_secs_f64());
    let before = rt.block_on(count(raw.as_ref(), "tm"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tidemark"));
    cmd.args([
        "gc",
        "--store",
        &server.url(),
        "--cluster",
        "tm",
        "--keep-last",
        "1",
        "--output",
        "json",
    ])
    .envs(aws_env.clone());
    let (secs, ok, note) = timed(cmd);
    if std::env::var_os("TIDEMARK_LOG").is_some() {
        eprintln!("{note}");
    }
    let after = rt.block_on(count(raw.as_ref(), "tm"));
    // Left: the kept backup (2), the index, the audit record.
    let deleted = before - after;
    rows.push(Row {
        tool: "tidemark gc (whole pass)",
        objects: deleted,
        secs,
        survivors: after,
        note: if ok {
            format!("{after} left: kept backup, index, audit record")
        } else {
            note
        },
    });

    let bare: Vec<(&'static str, PeerCommand)> = vec![
        (
            "s3rm-rs 1.6.5",
            Box::new(|p: &str| {
                tool("s3rm").map(|bin| {
                    let mut c = Command::new(bin);
                    c.args([
                        &format!("s3://{BUCKET}/{p}/"),
                        "--target-endpoint-url",
                        &server.endpoint,
                        "--target-force-path-style",
                        "--force",
                    ]);
                    c
                })
            }),
        ),
        (
            "s5cmd rm",
            Box::new(|p: &str| {
                tool("s5cmd").map(|bin| {
                    let mut c = Command::new(bin);
                    c.args([
                        "--endpoint-url",
                        &server.endpoint,
                        "rm",
                        &format!("s3://{BUCKET}/{p}/*"),
                    ]);
                    c
                })
            }),
        ),
        (
            "rclone delete",
            Box::new(|p: &str| {
                tool("rclone").map(|bin| {
                    let mut c = Command::new(bin);
                    c.args([
                        "delete",
                        &format!(":s3:{BUCKET}/{p}"),
                        "--checkers",
                        "64",
                        "--transfers",
                        "64",
                        "--s3-provider",
                        "Other",
                        "--s3-endpoint",
                        &server.endpoint,
                        "--s3-access-key-id",
                        ACCESS_KEY,
                        "--s3-secret-access-key",
                        SECRET_KEY,
                    ]);
                    c
                })
            }),
        ),
        (
            "aws s3 rm --recursive",
            Box::new(|p: &str| {
                tool("aws").map(|bin| {
                    let mut c = Command::new(bin);
                    c.args([
                        "--endpoint-url",
                        &server.endpoint,
                        "s3",
                        "rm",
                        "--recursive",
                        "--only-show-errors",
                        &format!("s3://{BUCKET}/{p}/"),
                    ]);
                    c
                })
            }),
        ),
    ];
    for (name, make) in bare {
        let prefix = name.split_whitespace().next().unwrap().replace('.', "");
        let drop_ca_bundle = name.starts_with("rclone");
        let Some(mut cmd) = make(&prefix) else {
            rows.push(Row {
                tool: name,
                objects: 0,
                secs: f64::NAN,
                survivors: 0,
                note: "not installed (bench/install-peers.sh)".into(),
            });
            continue;
        };
        let n = rt.block_on(tidemark_dataset(server, &prefix, backups, segments));
        let _ = n;
        let before = rt.block_on(count(raw.as_ref(), &prefix));
        cmd.envs(aws_env.clone());
        if drop_ca_bundle {
            // rclone's S3 SDK cannot apply a custom CA bundle to its transport; the
            // endpoint is plain HTTP anyway.
            cmd.env_remove("AWS_CA_BUNDLE");
        }
        let (secs, ok, note) = timed(cmd);
        let after = rt.block_on(count(raw.as_ref(), &prefix));
        rows.push(Row {
            tool: name,
            objects: before - after,
            secs,
            survivors: after,
            note: if ok { String::new() } else { note },
        });
    }

    // Barman: a retention pass over its own layout.
    match tool("barman-cloud-backup-delete") {
        None => rows.push(Row {
            tool: "barman-cloud-backup-delete",
            objects: 0,
            secs: f64::NAN,
            survivors: 0,
            note: "not installed".into(),
        }),
        Some(bin) => {
            rt.block_on(barman_dataset(server, "barman", backups, segments));
            let before = rt.block_on(count(raw.as_ref(), "barman"));
            let mut cmd = Command::new(bin);
            cmd.args([
                "--endpoint-url",
                &server.endpoint,
                "-r",
                "REDUNDANCY 1",
                &format!("s3://{BUCKET}/barman"),
                "pg",
            ])
            .envs(aws_env.clone());
            let (secs, ok, note) = timed(cmd);
            let after = rt.block_on(count(raw.as_ref(), "barman"));
            rows.push(Row {
                tool: "barman-cloud-backup-delete",
                objects: before - after,
                secs,
                survivors: after,
                note: if ok {
                    format!("{after} left: the kept backup and its WALs")
                } else {
                    note
                },
            });
        }
    }

    let tm = rows[0].objects as f64 / rows[0].secs;
    println!(
        "\nGC of {backups} backups (payload + metadata.json) and {segments} segments on SeaweedFS (127.0.0.1)"
    );
    println!(
        "{:<28} {:>9} {:>9} {:>12} {:>10} {:>10}  note",
        "tool", "deleted", "seconds", "objects/s", "tidemark×", "survivors"
    );
    for r in &rows {
        let rate = r.objects as f64 / r.secs;
        println!(
            "{:<28} {:>9} {:>9.2} {:>12.0} {:>10.2} {:>10}  {}",
            r.tool,
            r.objects,
            r.secs,
            rate,
            tm / rate,
            r.survivors,
            r.note.lines().next().unwrap_or("")
        );
    }
}

fn steady(rt: &tokio::runtime::Runtime, server: &SeaweedFs) {
    let archive = env_usize("TIDEMARK_BENCH_ARCHIVE", 1_000_000);
    let expire = env_usize("TIDEMARK_BENCH_EXPIRE", 3_000);
    // Backups kept (issue 32 §2: each pass used to read every one's metadata.json).
    let kept = env_usize("TIDEMARK_BENCH_STEADY_BACKUPS", 10_000).max(1);
    let cluster = "steady";
    let store = server.cluster_store(cluster);
    let raw = server.raw_store();
    let every = SignedDuration::from_secs(60);
    let entries = synth::segments("mysql-bin", 1_000_000, archive as u64, start(), every);
    let t = Instant::now();
    rt.block_on(async {
        let mut objects: Vec<(String, Vec<u8>)> = entries
            .iter()
            .map(|e| (format!("{cluster}/binlogs/{}", e.name), vec![b's'; 16]))
            .collect();
        // The kept backups, a minute apart from when segment `expire` ends; the oldest of
        // them is the horizon.
        let first_kept = start() + every * (expire as i32) + SignedDuration::from_secs(1);
        for i in 0..kept {
            let mut b = SynthBackup::full("nightly", first_kept + every * (i as i32), 2 + i as u32);
            b.payload = vec![b'x'; 64];
            objects.extend(backup_objects(cluster, &b));
        }
        put_all(raw.as_ref(), objects).await;
        // An old backup that expires.
        let old = SynthBackup::full("nightly", start() - SignedDuration::from_hours(24), 1);
        synth::write_backups(&store, &[old]).await.unwrap();
        synth::write_index(&store, &entries).await.unwrap();
    });
    eprintln!(
        "populated {archive} segments and {} backups in {:.1}s",
        kept + 1,
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    let listed = rt.block_on(count(raw.as_ref(), &format!("{cluster}/binlogs")));
    let list_secs = t.elapsed().as_secs_f64();

    let gc = |keep_last: usize| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tidemark"));
        cmd.args([
            "gc",
            "--store",
            &server.url(),
            "--cluster",
            cluster,
            "--keep-last",
            &keep_last.to_string(),
            "--output",
            "json",
        ])
        .envs(server.env());
        let t = Instant::now();
        let out = cmd.output().unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if std::env::var_os("TIDEMARK_LOG").is_some() {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let segments = v["executed"]["segmentsDeleted"].as_u64().unwrap_or(0);
        let backups = v["executed"]["backupsDeleted"]
            .as_array()
            .map_or(0, Vec::len);
        (secs, segments, backups)
    };
    // Keeping every backup deletes nothing: the first pass reads every metadata.json and
    // writes the metadata cache, the second reads none of them.
    let (cold, ..) = gc(kept + 1);
    let (warm, ..) = gc(kept + 1);
    // The steady pass: the old backup and what lies behind the horizon expire.
    let (steady, segments, backups) = gc(kept);
    println!(
        "\nSteady state: {archive} archived segments, {expire} behind the horizon, {} backups",
        kept + 1
    );
    println!("full listing of binlogs/ ({listed} objects)          {list_secs:>8.2} s");
    println!("tidemark gc, nothing to delete, no metadata cache     {cold:>8.2} s");
    println!("tidemark gc, nothing to delete, metadata cache        {warm:>8.2} s");
    println!(
        "tidemark gc (deletes {segments} segments + {backups} backup)      {steady:>8.2} s   ({:.1}× faster than listing alone)",
        list_secs / steady
    );
}

fn main() {
    let which: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let want = |s: &str| which.is_empty() || which.iter().any(|w| w == s);
    let server = SeaweedFs::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if want("peers") {
        peers(&rt, &server);
    }
    if want("steady") {
        steady(&rt, &server);
    }
}
