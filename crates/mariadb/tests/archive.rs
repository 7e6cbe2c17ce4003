//! `archive_pass` against a local directory and a real S3 server (SeaweedFS on 127.0.0.1):
//! shipping, idempotent re-runs, adoption after a crash, and two archivers at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use object_store::ObjectStoreExt;
use object_store::path::Path as Key;
use tidemark_mariadb::archive::archive_pass;
use tidemark_mariadb::binlog::synthetic;
use tidemark_store::format::IndexEntry;
use tidemark_store::index::SegmentIndex;
use tidemark_store::testkit::{SeaweedFs, local_store};
use tidemark_store::{ClusterStore, NoProgress};

const T0: i64 = 1_763_600_000;

/// A server's binlog directory with `n` files (the last one open), each an hour of events.
fn binlog_dir(n: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mut index = String::new();
    for k in 1..=n {
        let name = format!("mysql-bin.{k:06}");
        let start = T0 + (k as i64 - 1) * 3600;
        std::fs::write(
            dir.path().join(&name),
            synthetic(&[start, start + 1800, start + 3599], 64),
        )
        .unwrap();
        index.push_str(&format!("./{name}\n"));
    }
    let index_path = dir.path().join("mysql-bin.index");
    std::fs::write(&index_path, index).unwrap();
    (dir, index_path)
}

async fn entries(store: &ClusterStore) -> Vec<IndexEntry> {
    let mut idx = SegmentIndex::load(store).await.unwrap().unwrap();
    let unread: Vec<String> = idx.unread().map(|s| s.key.clone()).collect();
    idx.read_shards(store, unread).await.unwrap();
    let mut v: Vec<IndexEntry> = idx.entries().cloned().collect();
    v.sort_by_key(|e| e.sequence);
    v
}

async fn suite(store: &ClusterStore, name: &str) {
    eprintln!("[{name}] ship, re-run, adopt, repair, race");
    let (dir, index_path) = binlog_dir(6);

    // 1. Closed files are shipped with their event times; the open one is not.
    let r = archive_pass(store, &index_path, &NoProgress).await.unwrap();
    assert_eq!(r.uploaded.len(), 5, "{r:?}");
    assert_eq!(r.open.as_deref(), Some("mysql-bin.000006"));
    let e = entries(store).await;
    assert_eq!(e.len(), 5);
    assert_eq!(e[0].first_event_at.unwrap().as_second(), T0);
    assert_eq!(e[0].last_event_at.unwrap().as_second(), T0 + 3599);
    assert_eq!(e[4].name, "mysql-bin.000005");
    let body = store
        .object_store()
        .get(&Key::from("binlogs/mysql-bin.000003"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(
        body.as_ref(),
        std::fs::read(dir.path().join("mysql-bin.000003")).unwrap()
    );

    // 2. A re-run uploads nothing.
    let r = archive_pass(store, &index_path, &NoProgress).await.unwrap();
    assert!(r.uploaded.is_empty() && r.adopted.is_empty(), "{r:?}");
    assert_eq!(r.already_indexed, 5);

    // 3. The server rotates: file 6 closes, 7 opens. Meanwhile a crash left file 6
    //    uploaded but not indexed: it is adopted, not uploaded again.
    let name7 = "mysql-bin.000007";
    std::fs::write(dir.path().join(name7), synthetic(&[T0 + 6 * 3600], 64)).unwrap();
    std::fs::write(
        &index_path,
        format!(
            "{}./{name7}\n",
            std::fs::read_to_string(&index_path).unwrap()
        ),
    )
    .unwrap();
    store
        .object_store()
        .put(
            &Key::from("binlogs/mysql-bin.000006"),
            std::fs::read(dir.path().join("mysql-bin.000006"))
                .unwrap()
                .into(),
        )
        .await
        .unwrap();
    let r = archive_pass(store, &index_path, &NoProgress).await.unwrap();
    assert_eq!(r.adopted, ["mysql-bin.000006"], "{r:?}");
    assert!(r.uploaded.is_empty());
    assert_eq!(entries(store).await.len(), 6);

    // 4. A half-written object from a crash (wrong size) is uploaded again.
    std::fs::write(
        dir.path().join("mysql-bin.000008"),
        synthetic(&[T0 + 7 * 3600], 64),
    )
    .unwrap();
    std::fs::write(
        &index_path,
        format!(
            "{}./mysql-bin.000008\n",
            std::fs::read_to_string(&index_path).unwrap()
        ),
    )
    .unwrap();
    store
        .object_store()
        .put(
            &Key::from("binlogs/mysql-bin.000007"),
            b"torn".to_vec().into(),
        )
        .await
        .unwrap();
    let r = archive_pass(store, &index_path, &NoProgress).await.unwrap();
    assert_eq!(r.uploaded, [name7], "{r:?}");
    let e = entries(store).await;
    let seven = e.iter().find(|x| x.name == name7).unwrap();
    assert_eq!(
        seven.size,
        std::fs::metadata(dir.path().join(name7)).unwrap().len()
    );

    // 5. Two archivers of the server at once (e.g. an old pod still running), with 31
    //    new files to ship: the index lists every file once.
    let mut listed = std::fs::read_to_string(&index_path).unwrap();
    for k in 9..=40u64 {
        let name = format!("mysql-bin.{k:06}");
        let start = T0 + (k as i64 - 1) * 3600;
        std::fs::write(
            dir.path().join(&name),
            synthetic(&[start, start + 1800, start + 3599], 64),
        )
        .unwrap();
        listed.push_str(&format!("./{name}\n"));
    }
    std::fs::write(&index_path, listed).unwrap();
    let (a, b) = futures::join!(
        archive_pass(store, &index_path, &NoProgress),
        archive_pass(store, &index_path, &NoProgress)
    );
    a.unwrap();
    b.unwrap();
    let e = entries(store).await;
    let names: Vec<&str> = e.iter().map(|x| x.name.as_str()).collect();
    let mut dedup = names.clone();
    dedup.dedup();
    assert_eq!(names, dedup, "duplicates in the index");
    assert_eq!(e.len(), 39, "files 1–39 indexed once");
    assert!(e.iter().all(|x| x.server_id == Some(1)), "{e:?}");
}

#[test]
fn archive_on_a_local_directory() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, store) = local_store("db");
    rt.block_on(suite(&store, "local"));
}

#[test]
fn archive_on_seaweedfs() {
    let server = SeaweedFs::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(suite(&server.cluster_store("db"), "seaweedfs"));
}

#[test]
fn bad_binlog_index_is_named() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, store) = local_store("db");
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.index");
    let e = rt
        .block_on(archive_pass(&store, &missing, &NoProgress))
        .unwrap_err();
    assert!(e.to_string().contains("nope.index"), "{e}");
    let idx = dir.path().join("bin.index");
    std::fs::write(&idx, "./mysql-bin.000001\n./notes.txt\n").unwrap();
    let e = rt
        .block_on(archive_pass(&store, &idx, &NoProgress))
        .unwrap_err();
    assert!(e.to_string().contains("line 2 names \"notes.txt\""), "{e}");
    // A closed file that is not a binlog is refused, not shipped.
    std::fs::write(&idx, "./mysql-bin.000001\n./mysql-bin.000002\n").unwrap();
    std::fs::write(dir.path().join("mysql-bin.000001"), b"plain text").unwrap();
    let e = rt
        .block_on(archive_pass(&store, &idx, &NoProgress))
        .unwrap_err();
    assert!(e.to_string().contains("not a binary log"), "{e}");
}
