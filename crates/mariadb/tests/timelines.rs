//! Issue 27, a hostile archive: segments of three servers with the same file names, GTID
//! ranges that overlap, and a GTID gap at a switch. Each server's files go to their own
//! timeline (never passing for another's), the overlap is skipped by GTID, the gap is
//! reported by the GTIDs missing and refused, and replay never runs in the wrong order.
//! Also: an archive written before timelines (no writer, no GTIDs) is continued by its own
//! server and never by another one with the same names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use jiff::Timestamp;
use object_store::ObjectStoreExt;
use object_store::path::Path as Key;
use tidemark_core::gtid::{Gtid, GtidPos, runs_text};
use tidemark_core::timeline::archive_sequence;
use tidemark_core::{Backup, History, RestoreRefusal, choose_restore};
use tidemark_mariadb::archive::archive_pass;
use tidemark_mariadb::binlog::{synthetic, synthetic_gtid};
use tidemark_store::catalog::{Catalog, SegmentListing};
use tidemark_store::format::IndexEntry;
use tidemark_store::testkit::local_store;
use tidemark_store::{ClusterStore, NoProgress};

const T0: i64 = 1_763_600_000;

/// One closed file: its starting position and its transactions (server, sequence), an
/// event a second apart from `at`.
struct File<'a> {
    number: u64,
    start: &'a [(u32, u64)],
    txns: &'a [(u32, u64)],
    at: i64,
}

/// A server's binlog directory: the closed files, then an open one.
fn server(id: u32, files: &[File<'_>]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mut index = String::new();
    for f in files {
        let start: Vec<Gtid> = f.start.iter().map(|&(s, q)| Gtid::new(0, s, q)).collect();
        let events: Vec<(i64, Option<Gtid>)> = f
            .txns
            .iter()
            .enumerate()
            .map(|(i, &(s, q))| (f.at + i as i64, Some(Gtid::new(0, s, q))))
            .collect();
        let name = format!("mysql-bin.{:06}", f.number);
        std::fs::write(
            dir.path().join(&name),
            synthetic_gtid(id, Some(&start), &events, 16),
        )
        .unwrap();
        index.push_str(&format!("./{name}\n"));
    }
    let open = files.last().map_or(1, |f| f.number + 1);
    let name = format!("mysql-bin.{open:06}");
    std::fs::write(dir.path().join(&name), synthetic(&[T0 + 9_000], 16)).unwrap();
    index.push_str(&format!("./{name}\n"));
    let path = dir.path().join("mysql-bin.index");
    std::fs::write(&path, index).unwrap();
    (dir, path)
}

/// Server 1, the first primary: 0-1-1..40 in four files (then an open one).
fn server_one() -> (tempfile::TempDir, PathBuf) {
    let txns: Vec<Vec<(u32, u64)>> = (0..4).map(|k| run(k * 10 + 1, k * 10 + 10, 1)).collect();
    let starts: Vec<Vec<(u32, u64)>> = (0..4)
        .map(|k| if k == 0 { vec![] } else { vec![(1, k * 10)] })
        .collect();
    let files: Vec<File> = (0..4)
        .map(|k| File {
            number: k as u64 + 1,
            start: &starts[k],
            txns: &txns[k],
            at: T0 + 100 * k as i64,
        })
        .collect();
    server(1, &files)
}

/// Server 2, server 1's replica, promoted after 0-1-35 (0-1-36..40 never reached it): the
/// same file names, its first two holding what it replicated, then its own 0-2-36..50.
fn server_two() -> (tempfile::TempDir, PathBuf) {
    let mut s2_second = run(21, 35, 1);
    s2_second.extend(run(36, 45, 2));
    let s2_third = run(46, 50, 2);
    server(
        2,
        &[
            File {
                number: 1,
                start: &[],
                txns: &run(1, 20, 1),
                at: T0,
            },
            File {
                number: 2,
                start: &[(1, 20)],
                txns: &s2_second,
                at: T0 + 200,
            },
            File {
                number: 3,
                start: &[(2, 45)],
                txns: &s2_third,
                at: T0 + 400,
            },
        ],
    )
}

fn run(a: u64, b: u64, server: u32) -> Vec<(u32, u64)> {
    (a..=b).map(|q| (server, q)).collect()
}

async fn inventory(store: &ClusterStore) -> tidemark_core::Inventory {
    let mut catalog = Catalog::load(store, &NoProgress).await.unwrap();
    if let Some(idx) = catalog.index.as_mut() {
        let unread: Vec<String> = idx.unread().map(|s| s.key.clone()).collect();
        idx.read_shards(store, unread).await.unwrap();
    }
    catalog.inventory(&SegmentListing::default())
}

fn at(t: i64) -> Timestamp {
    Timestamp::from_second(t).unwrap()
}

#[test]
fn three_servers_with_the_same_file_names() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, store) = local_store("db");
    // Server 1, the first primary: 0-1-1..40 in four files.
    let (s1_dir, s1) = server_one();
    let r = rt.block_on(archive_pass(&store, &s1, &NoProgress)).unwrap();
    assert_eq!((r.uploaded.len(), r.timeline), (4, 0), "{r:?}");

    // Server 2, its replica, promoted after 0-1-35 (0-1-36..40 never reached it).
    let (_s2_dir, s2) = server_two();
    let r = rt.block_on(archive_pass(&store, &s2, &NoProgress)).unwrap();
    let t1 = r.new_timeline.clone().expect("a new timeline");
    assert_eq!((t1.id, t1.server_id, t1.parent), (1, Some(2), Some(0)));
    let sw = t1.switch.clone().unwrap();
    assert_eq!(sw.gtid.to_string(), "0-1-35");
    assert_eq!(sw.parent_sequence, Some(4));
    assert!(sw.missing.is_empty(), "{sw:?}");
    // From its newest file the archive holds the start of (0-1-20, in file 2): not file 1,
    // and not file 3, whose start 0-2-45 is its own.
    assert_eq!(
        r.uploaded,
        ["mysql-bin.1000000000002", "mysql-bin.1000000000003"],
        "{r:?}"
    );
    // Server 1's objects are untouched by server 2's files of the same names.
    let body = rt
        .block_on(async {
            store
                .object_store()
                .get(&Key::from("binlogs/mysql-bin.000002"))
                .await
                .unwrap()
                .bytes()
                .await
        })
        .unwrap();
    assert_eq!(
        body.as_ref(),
        std::fs::read(s1_dir.path().join("mysql-bin.000002")).unwrap()
    );
    // A rerun is idempotent.
    let again = rt.block_on(archive_pass(&store, &s2, &NoProgress)).unwrap();
    assert_eq!(
        (again.uploaded.len(), again.already_indexed),
        (0, 2),
        "{again:?}"
    );
    assert!(again.new_timeline.is_none());

    // The main line: server 1's files up to the switch, then server 2's; what only server
    // 1 had is a branch.
    let inv = rt.block_on(inventory(&store));
    let h = History::new(&inv.segments, &inv.timelines);
    let main: Vec<u64> = h.main.iter().map(|m| m.segment.sequence).collect();
    let t1_2 = archive_sequence(1, 2).unwrap();
    let t1_3 = archive_sequence(1, 3).unwrap();
    assert_eq!(main, [1, 2, 3, 4, t1_2, t1_3]);
    assert!(h.main.iter().all(|m| m.linked || m.segment.sequence == 1));
    assert_eq!(runs_text(&h.branch_runs(0, &sw.gtid)), "0-1-36..40");
    assert!(!h.on_main_line(&GtidPos::parse("0-1-38").unwrap()));
    assert!(h.on_main_line(&GtidPos::parse("0-2-38").unwrap()));

    // A backup at 0-1-15, restored to server 2's last write: server 1's segments from it
    // up to the switch, then server 2's after it — the overlap (0-1-21..35 in both) read
    // once, in order.
    let mut backup = Backup::completed_full(
        "20251120T010000Z-00000001",
        "nightly",
        at(T0 + 100),
        at(T0 + 105),
        1,
    );
    backup.gtid = Some(GtidPos::parse("0-1-15").unwrap());
    let mut with_backup = inv.clone();
    with_backup.backups.push(backup.clone());
    let c = choose_restore(&with_backup, at(T0 + 404)).unwrap();
    let runs: Vec<(u32, Vec<u64>, String, String)> = c
        .runs
        .iter()
        .map(|r| {
            (
                r.timeline,
                c.segments[r.first..r.first + r.count]
                    .iter()
                    .map(|s| s.sequence)
                    .collect(),
                r.start_after.as_ref().unwrap().to_string(),
                r.stop_at
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        runs,
        [
            (0, vec![2, 3, 4], "0-1-15".into(), "0-1-35".into()),
            (1, vec![t1_2, t1_3], "0-1-35".into(), String::new()),
        ]
    );

    // Server 3 takes over with a gap: its binlog starts at 0-2-55, the archive ends at
    // 0-2-50. Its timeline records the GTIDs missing; the window has a hole there, and a
    // target in it is refused naming them.
    let (_s3_dir, s3) = server(
        3,
        &[File {
            number: 7,
            start: &[(2, 55)],
            txns: &run(56, 60, 3),
            at: T0 + 600,
        }],
    );
    let r = rt.block_on(archive_pass(&store, &s3, &NoProgress)).unwrap();
    let t2 = r.new_timeline.clone().expect("a new timeline");
    assert_eq!((t2.id, t2.parent), (2, Some(1)));
    assert_eq!(
        runs_text(&t2.switch.as_ref().unwrap().missing),
        "0-2-51..55"
    );
    let inv = rt.block_on(inventory(&store));
    let mut with_backup = inv.clone();
    with_backup.backups.push(backup);
    // A backup on server 3's timeline makes the instants after the gap restorable.
    let mut on_three = Backup::completed_full(
        "20251120T020000Z-00000002",
        "nightly",
        at(T0 + 600),
        at(T0 + 602),
        1,
    );
    on_three.gtid = Some(GtidPos::parse("0-3-57").unwrap());
    with_backup.backups.push(on_three);
    let e = choose_restore(&with_backup, at(T0 + 500)).unwrap_err();
    assert!(matches!(e, RestoreRefusal::InGap { .. }), "{e}");
    assert!(e.to_string().contains("0-2-51..55"), "{e}");

    // An entry claiming a timeline the archive never recorded is off the main line.
    let mut forged = inv.clone();
    let mut stray = forged.segments[0].clone();
    stray.sequence = archive_sequence(5, 1).unwrap();
    stray.name = "mysql-bin.5000000000001".into();
    forged.segments.push(stray);
    let h = History::new(&forged.segments, &forged.timelines);
    assert!(
        h.main
            .iter()
            .all(|m| m.segment.sequence < 5_000_000_000_000)
    );
    assert!(h.branch.iter().any(|s| s.sequence == 5_000_000_000_001));
}

/// A second failover to a replica rebuilt from nothing (found by the chaos soak): its one
/// binlog file starts empty and holds the whole history — server 1's, server 2's — then its
/// own. It joins server 2's timeline where server 2's archive ends, with nothing missing,
/// though that timeline's first file starts later (0-1-20). It joined nothing before (an
/// unrelated switch: a gap until the next backup).
#[test]
fn a_second_failover_to_a_replica_rebuilt_from_nothing_joins() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, store) = local_store("db");
    let (_s1_dir, s1) = server_one();
    rt.block_on(archive_pass(&store, &s1, &NoProgress)).unwrap();
    let (_s2_dir, s2) = server_two();
    let r = rt.block_on(archive_pass(&store, &s2, &NoProgress)).unwrap();
    assert_eq!(r.new_timeline.map(|t| t.id), Some(1));
    let mut all = run(1, 35, 1);
    all.extend(run(36, 50, 2));
    all.extend(run(51, 60, 3));
    let (_s3_dir, s3) = server(
        3,
        &[File {
            number: 1,
            start: &[],
            txns: &all,
            at: T0 + 600,
        }],
    );
    let r = rt.block_on(archive_pass(&store, &s3, &NoProgress)).unwrap();
    let t2 = r.new_timeline.clone().expect("a new timeline");
    assert_eq!((t2.id, t2.server_id, t2.parent), (2, Some(3), Some(1)));
    let sw = t2.switch.clone().unwrap();
    assert!(!sw.unrelated && sw.missing.is_empty(), "{sw:?}");
    assert_eq!(sw.gtid.to_string(), "0-2-50");
    // The main line runs through all three servers without a gap.
    let inv = rt.block_on(inventory(&store));
    let h = History::new(&inv.segments, &inv.timelines);
    assert!(
        h.main.iter().skip(1).all(|m| m.linked),
        "{:?}",
        h.main
            .iter()
            .map(|m| (m.segment.sequence, m.linked))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        h.main.last().map(|m| m.segment.sequence),
        archive_sequence(2, 1)
    );
}

#[test]
fn an_archive_from_before_timelines_is_continued_only_by_its_own_server() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, store) = local_store("db");
    let (dir, s1) = server_one();
    // What an archiver before timelines left: files 1 and 2, indexed by name and times.
    rt.block_on(async {
        let mut entries = Vec::new();
        for k in 1..=2u64 {
            let name = format!("mysql-bin.{k:06}");
            let bytes = std::fs::read(dir.path().join(&name)).unwrap();
            store
                .object_store()
                .put(&Key::from(format!("binlogs/{name}")), bytes.clone().into())
                .await
                .unwrap();
            use sha2::Digest;
            entries.push(IndexEntry {
                name,
                sequence: k,
                first_event_at: Some(at(T0 + 100 * (k as i64 - 1))),
                last_event_at: Some(at(T0 + 100 * (k as i64 - 1) + 9)),
                size: bytes.len() as u64,
                sha256: Some(hex::encode(sha2::Sha256::digest(&bytes))),
                compression: None,
                encryption: None,
                server_id: None,
                file: None,
                gtid_list: None,
                previous_gtids: None,
                gtid_set: None,
                gtids: Vec::new(),
            });
        }
        tidemark_store::index::write_new(&store, &entries, 4096)
            .await
            .unwrap();
    });
    // Another server with the same names is not the one that wrote them.
    let other_txns = run(1, 30, 4);
    let (_o, other) = server(
        4,
        &[
            File {
                number: 1,
                start: &[],
                txns: &other_txns[..10],
                at: T0,
            },
            File {
                number: 2,
                start: &[(4, 10)],
                txns: &other_txns[10..],
                at: T0 + 100,
            },
        ],
    );
    let before = rt.block_on(async {
        tidemark_store::index::SegmentIndex::load(&store)
            .await
            .unwrap()
            .unwrap()
    });
    assert!(before.head.timelines.is_empty());
    // Its own server continues it: file 2's bytes match, timeline 0 learns its writer.
    let r = rt.block_on(archive_pass(&store, &s1, &NoProgress)).unwrap();
    assert_eq!((r.timeline, r.already_indexed), (0, 2), "{r:?}");
    assert_eq!(r.uploaded, ["mysql-bin.000003", "mysql-bin.000004"]);
    let inv = rt.block_on(inventory(&store));
    assert_eq!(inv.timelines.len(), 1);
    assert_eq!(inv.timelines[0].server_id, Some(1));
    // And now another server with the same names starts its own timeline.
    let r = rt
        .block_on(archive_pass(&store, &other, &NoProgress))
        .unwrap();
    assert_eq!(r.timeline, 1, "{r:?}");
    assert!(
        r.uploaded
            .iter()
            .all(|n| n.starts_with("mysql-bin.1000000000"))
    );
}

/// Server 1 (timeline 0) fails over to server 2 (timeline 1) after 0-1-35.
fn failed_over(
    rt: &tokio::runtime::Runtime,
    store: &ClusterStore,
) -> Vec<(tempfile::TempDir, std::path::PathBuf)> {
    let s1 = server_one();
    rt.block_on(archive_pass(store, &s1.1, &NoProgress))
        .unwrap();
    let mut second = run(21, 35, 1);
    second.extend(run(36, 50, 2));
    let s2 = server(
        2,
        &[File {
            number: 2,
            start: &[(1, 20)],
            txns: &second,
            at: T0 + 200,
        }],
    );
    let r = rt
        .block_on(archive_pass(store, &s2.1, &NoProgress))
        .unwrap();
    assert_eq!(
        r.new_timeline.unwrap().switch.unwrap().gtid.to_string(),
        "0-1-35"
    );
    vec![s1, s2]
}

#[test]
fn a_failback_starts_a_timeline_from_the_newest() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, store) = local_store("db");
    let _servers = failed_over(&rt, &store);
    // Server 1 is rebuilt as a replica of server 2 and promoted again: its binlog goes on
    // from file 5 (numbering kept), holds what it replicated, then its own writes. Its
    // files would "continue" timeline 0 by number; they belong after timeline 1.
    let mut txns = run(51, 55, 2);
    txns.extend(run(56, 60, 1));
    let (_back, s1_again) = server(
        1,
        &[File {
            number: 5,
            start: &[(2, 50)],
            txns: &txns,
            at: T0 + 600,
        }],
    );
    let r = rt
        .block_on(archive_pass(&store, &s1_again, &NoProgress))
        .unwrap();
    let t2 = r
        .new_timeline
        .clone()
        .expect("a new timeline, not timeline 0 again");
    assert_eq!((t2.id, t2.server_id, t2.parent), (2, Some(1), Some(1)));
    let sw = t2.switch.unwrap();
    assert_eq!(sw.gtid.to_string(), "0-2-50");
    assert!(!sw.unrelated && sw.missing.is_empty());
    let inv = rt.block_on(inventory(&store));
    let h = History::new(&inv.segments, &inv.timelines);
    assert_eq!(h.path, [0, 1, 2]);
    assert!(
        h.main.iter().skip(1).all(|m| m.linked),
        "one linked main line"
    );
    assert!(h.on_main_line(&GtidPos::parse("0-1-58").unwrap()));
}

#[test]
fn a_binlog_that_started_over_never_joins_by_reused_numbers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, store) = local_store("db");
    let (_a, s1) = server_one();
    rt.block_on(archive_pass(&store, &s1, &NoProgress)).unwrap();
    // RESET MASTER: file 1 again, numbers from 1 again — the same GTIDs as archived ones.
    let (_b, reset) = server(
        1,
        &[File {
            number: 1,
            start: &[],
            txns: &run(1, 10, 1),
            at: T0 + 900,
        }],
    );
    let r = rt
        .block_on(archive_pass(&store, &reset, &NoProgress))
        .unwrap();
    let t1 = r.new_timeline.clone().expect("a new timeline");
    assert_eq!((t1.id, t1.server_id), (1, Some(1)));
    assert!(t1.switch.as_ref().unwrap().unrelated, "{t1:?}");
    let inv = rt.block_on(inventory(&store));
    let h = History::new(&inv.segments, &inv.timelines);
    let first_of_t1 = h
        .main
        .iter()
        .find(|m| m.segment.sequence > 1_000_000_000_000)
        .unwrap();
    assert!(!first_of_t1.linked, "a gap, not a join by reused numbers");
}

#[test]
fn an_old_primary_still_writing_is_refused() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, store) = local_store("db");
    let _servers = failed_over(&rt, &store);
    // Server 1 never learned of the failover and keeps writing its branch.
    let (_c, stale) = server(
        1,
        &[File {
            number: 5,
            start: &[(1, 40)],
            txns: &run(41, 45, 1),
            at: T0 + 700,
        }],
    );
    let e = rt
        .block_on(archive_pass(&store, &stale, &NoProgress))
        .unwrap_err();
    assert!(
        matches!(
            e,
            tidemark_mariadb::archive::ArchiveError::StaleBranch { .. }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("old primary"), "{e}");
    let inv = rt.block_on(inventory(&store));
    assert_eq!(inv.timelines.len(), 2, "nothing recorded");
}

/// Issue 42 §3: one forged `Gtid_list` entry (a GTID of the new primary's, server 2) in an
/// old primary's file passes the "old primary still writing" refusal, which looks at what
/// the files claim: pointed at that server, the archive takes its branch as the newest
/// timeline. Confirmed by the cluster (server 2 is primary), it is refused, nothing is
/// recorded, and the real primary's next file goes on with its timeline.
#[test]
fn only_the_confirmed_primary_starts_a_timeline() {
    use tidemark_mariadb::archive::{ArchiveError, Primary, archive_pass_as};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let forged = || {
        server(
            1,
            &[File {
                number: 5,
                start: &[(1, 40), (2, 50)],
                txns: &run(51, 55, 1),
                at: T0 + 700,
            }],
        )
    };
    // Pointed at it, nothing tells the lie apart: it takes the main line (what the flag
    // and the operator's confirmation are for).
    let (_d, store) = local_store("db");
    let _servers = failed_over(&rt, &store);
    let (_f, stale) = forged();
    let r = rt
        .block_on(archive_pass(&store, &stale, &NoProgress))
        .unwrap();
    assert_eq!(r.new_timeline.map(|t| t.server_id), Some(Some(1)));

    let (_d, store) = local_store("db");
    let servers = failed_over(&rt, &store);
    let (_f, stale) = forged();
    let e = rt
        .block_on(archive_pass_as(
            &store,
            &stale,
            Primary::Confirmed(2),
            &NoProgress,
        ))
        .unwrap_err();
    assert!(
        matches!(e, ArchiveError::NotThePrimary { primary: 2, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("server 1 would start a new timeline"),
        "{e}"
    );
    let inv = rt.block_on(inventory(&store));
    assert_eq!(inv.timelines.len(), 2, "nothing recorded");
    // The real primary goes on, on its timeline (1).
    let (_n, next) = server(
        2,
        &[
            File {
                number: 2,
                start: &[(1, 20)],
                txns: &{
                    let mut t = run(21, 35, 1);
                    t.extend(run(36, 50, 2));
                    t
                },
                at: T0 + 200,
            },
            File {
                number: 3,
                start: &[(2, 50)],
                txns: &run(51, 60, 2),
                at: T0 + 800,
            },
        ],
    );
    let r = rt
        .block_on(archive_pass_as(
            &store,
            &next,
            Primary::Confirmed(2),
            &NoProgress,
        ))
        .unwrap();
    assert_eq!((r.timeline, r.new_timeline), (1, None));
    drop(servers);
}

/// Issue 42 §3: every closed file is the newest one's writer's; a binlog directory mixing
/// two servers' files is refused, naming the file and both servers.
#[test]
fn files_of_two_servers_are_refused() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, store) = local_store("db");
    let (dir, path) = server_one();
    // File 2 replaced by one server 9 wrote.
    std::fs::write(
        dir.path().join("mysql-bin.000002"),
        synthetic_gtid(
            9,
            Some(&[Gtid::new(0, 1, 10)]),
            &[(T0 + 100, Some(Gtid::new(0, 1, 11)))],
            16,
        ),
    )
    .unwrap();
    let e = rt
        .block_on(archive_pass(&store, &path, &NoProgress))
        .unwrap_err();
    let said = e.to_string();
    assert!(
        said.contains("mysql-bin.000002 was written by server 9") && said.contains("by server 1"),
        "{said}"
    );
    let inv = rt.block_on(inventory(&store));
    assert!(inv.segments.is_empty(), "nothing archived");
}

#[test]
fn an_archiver_stopped_in_the_switch_converges() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, store) = local_store("db");
    let (_one, s1) = server_one();
    rt.block_on(archive_pass(&store, &s1, &NoProgress)).unwrap();
    let mut second = run(21, 35, 1);
    second.extend(run(36, 45, 2));
    let (s2_dir, s2) = server(
        2,
        &[
            File {
                number: 2,
                start: &[(1, 20)],
                txns: &second,
                at: T0 + 200,
            },
            File {
                number: 3,
                start: &[(2, 45)],
                txns: &run(46, 50, 2),
                at: T0 + 400,
            },
        ],
    );
    // The pass dies after recording the timeline: its second file's start reads well,
    // its end does not (an event header that declares no size).
    let good = std::fs::read(s2_dir.path().join("mysql-bin.000003")).unwrap();
    let mut torn = good.clone();
    torn.extend_from_slice(&[0u8; 19]);
    std::fs::write(s2_dir.path().join("mysql-bin.000003"), torn).unwrap();
    let e = rt
        .block_on(archive_pass(&store, &s2, &NoProgress))
        .unwrap_err();
    assert!(e.to_string().contains("declares a size of 0 bytes"), "{e}");
    let inv = rt.block_on(inventory(&store));
    assert_eq!(inv.timelines.len(), 2, "the timeline was recorded first");
    // Run again: the same timeline (recorded once), every file on it.
    std::fs::write(s2_dir.path().join("mysql-bin.000003"), good).unwrap();
    let r = rt.block_on(archive_pass(&store, &s2, &NoProgress)).unwrap();
    assert!(r.new_timeline.is_none(), "{r:?}");
    assert_eq!(r.timeline, 1);
    let inv = rt.block_on(inventory(&store));
    assert_eq!(inv.timelines.len(), 2);
    let on_one: Vec<u64> = inv
        .segments
        .iter()
        .filter(|s| s.sequence > 1_000_000_000_000)
        .map(|s| s.sequence)
        .collect();
    assert_eq!(on_one.len(), 2, "{on_one:?}");
}

#[test]
fn a_replica_never_starts_a_timeline() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, store) = local_store("db");
    let (_one, s1) = server_one();
    rt.block_on(archive_pass(&store, &s1, &NoProgress)).unwrap();
    // Server 2 replicates server 1 (its own numbering, only server 1's transactions), and
    // an archiver is pointed at it by mistake while server 1 is the primary.
    let (_two, replica) = server(
        2,
        &[File {
            number: 7,
            start: &[(1, 20)],
            txns: &run(21, 40, 1),
            at: T0 + 200,
        }],
    );
    let e = rt
        .block_on(archive_pass(&store, &replica, &NoProgress))
        .unwrap_err();
    assert!(
        matches!(
            e,
            tidemark_mariadb::archive::ArchiveError::NotPrimary { server: 2, .. }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("a replica"), "{e}");
    let inv = rt.block_on(inventory(&store));
    assert_eq!(
        inv.timelines.len(),
        1,
        "no timeline started: {:?}",
        inv.timelines
    );
    // The primary's next pass continues its own timeline (no failback, no new timeline).
    let r = rt.block_on(archive_pass(&store, &s1, &NoProgress)).unwrap();
    assert!(r.new_timeline.is_none(), "{r:?}");
    // Once it writes as primary (a failover), the same server starts its timeline.
    let mut promoted = run(21, 40, 1);
    promoted.extend(run(41, 42, 2));
    let (_three, failed_over) = server(
        2,
        &[File {
            number: 7,
            start: &[(1, 20)],
            txns: &promoted,
            at: T0 + 200,
        }],
    );
    let r = rt
        .block_on(archive_pass(&store, &failed_over, &NoProgress))
        .unwrap();
    assert_eq!(r.new_timeline.map(|t| t.server_id), Some(Some(2)));
}
