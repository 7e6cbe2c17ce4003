//! S3 Object Lock (issue 19 §3) against a real server: SeaweedFS with a lock-enabled
//! bucket. A committed backup's objects are locked from birth (the server refuses to delete
//! a version before its date), a failed attempt is never locked, a chain that outgrows its
//! date locks its older backups longer, and deletions take every version once the locks
//! have ended.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use tidemark_store::NoProgress;
use tidemark_store::format::{BackupType, Metadata};
use tidemark_store::layout;
use tidemark_store::objectlock::LockMode;
use tidemark_store::testkit::SeaweedFs;
use tidemark_store::transfer::{self, Attempt, AttemptRecord, AttemptSpec};

fn spec(name: &str, kind: BackupType, parent: Option<&str>, started: Timestamp) -> AttemptSpec {
    AttemptSpec {
        backup_name: name.into(),
        backup_id: transfer::new_backup_id(started),
        kind,
        parent_id: parent.map(str::to_owned),
        method: "stdin".into(),
        payload_name: "backup.bin".into(),
        started_at: started,
        labels: Default::default(),
        ttl: None,
        lock_until: None,
    }
}

/// Takes one backup of `bytes`; committed with `lock`, or recorded as failed with `error`.
async fn take(
    store: &tidemark_store::ClusterStore,
    spec: &AttemptSpec,
    lock: Option<Timestamp>,
    error: Option<&str>,
) -> Metadata {
    let attempt = Attempt::begin(store, spec).await.unwrap();
    let mut bytes: &[u8] = b"a backup's bytes, locked";
    let payload = attempt.upload(&mut bytes, &NoProgress).await.unwrap();
    attempt
        .finish(AttemptRecord {
            payload: if error.is_some() {
                Vec::new()
            } else {
                vec![payload]
            },
            error: error.map(str::to_owned),
            immutable_until: lock,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// SeaweedFS, started outside the test's runtime (its launcher runs one of its own).
fn start() -> SeaweedFs {
    std::thread::spawn(SeaweedFs::start).join().unwrap()
}

fn keys(m: &Metadata) -> Vec<object_store::path::Path> {
    let mut k: Vec<_> = m
        .payload
        .iter()
        .map(|p| layout::payload_key(&m.backup_name, &m.backup_id, &p.name))
        .collect();
    k.push(layout::metadata_key(&m.backup_name, &m.backup_id));
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_backups_refuse_deletion_until_their_date() {
    let s3 = start();
    let store = s3
        .locked_bucket("locked", "shop")
        .await
        .with_object_lock(Some(LockMode::Governance))
        .unwrap();
    let now = Timestamp::now();
    let until = Timestamp::from_second(now.as_second() + 12).unwrap();

    // A committed full: payload and metadata.json locked until `until`, recorded.
    let full = take(
        &store,
        &spec("nightly", BackupType::Full, None, now),
        Some(until),
        None,
    )
    .await;
    assert_eq!(full.immutable_until, Some(until));
    for key in keys(&full) {
        let r = store.retention(&key).await.unwrap();
        let r = r.unwrap_or_else(|| panic!("{key} is not locked"));
        assert_eq!(r.mode, LockMode::Governance, "{key}");
        assert_eq!(r.until, until, "{key}");
        // What a stolen key would do: delete the version itself. The server refuses.
        let versions = store.versions(&key).await.unwrap();
        assert_eq!(versions.len(), 1, "{key}: {versions:?}");
        let refused = store.delete_version(&key, &versions[0]).await.unwrap_err();
        assert!(
            format!("{refused:?}").contains("AccessDenied"),
            "{key}: {refused:?}"
        );
        assert_eq!(store.versions(&key).await.unwrap(), versions);
    }
    // The in-flight marker is never locked: it went when the backup committed.
    let marker = layout::marker_key(&full.backup_name, &full.backup_id);
    assert!(store.head(&marker).await.unwrap().is_none());

    // A failed attempt under object lock locks nothing: it is collected like any other, and
    // the next backup is not in its way (pgBackRest #2686).
    let failed_spec = spec("nightly", BackupType::Full, None, Timestamp::now());
    let failed = take(&store, &failed_spec, Some(until), Some("the source failed")).await;
    assert_eq!(failed.immutable_until, None);
    let failed_meta = layout::metadata_key(&failed.backup_name, &failed.backup_id);
    assert_eq!(store.retention(&failed_meta).await.unwrap(), None);
    let failed_payload = layout::payload_key(&failed.backup_name, &failed.backup_id, "backup.bin");
    assert_eq!(store.retention(&failed_payload).await.unwrap(), None);
    for key in [&failed_meta, &failed_payload] {
        for v in store.versions(key).await.unwrap() {
            store.delete_version(key, &v).await.unwrap();
        }
    }

    // An increment asking for less than its chain's date takes the chain's date, and locks
    // nothing else.
    let inc_spec = spec(
        "nightly",
        BackupType::Incremental,
        Some(&full.backup_id),
        Timestamp::now(),
    );
    let (chain_date, extended) = transfer::chain_lock(&store, Some(now), Some(&full))
        .await
        .unwrap();
    assert_eq!((chain_date, extended), (Some(until), 0));
    let inc = take(&store, &inc_spec, chain_date, None).await;
    assert_eq!(inc.immutable_until, Some(until));

    // Asking for a little more than the chain's date (an increment counted from its start
    // rather than its slot) takes the chain's date, and locks nothing longer.
    let a_bit_later = Timestamp::from_second(until.as_second() + 90).unwrap();
    let (date, extended) = transfer::chain_lock(&store, Some(a_bit_later), Some(&inc))
        .await
        .unwrap();
    assert_eq!((date, extended), (Some(until), 0));

    // Once the date has passed, every version goes.
    let wait = until.duration_since(Timestamp::now()) + SignedDuration::from_secs(2);
    tokio::time::sleep(Duration::try_from(wait).unwrap_or_default()).await;
    for key in keys(&inc) {
        for v in store.versions(&key).await.unwrap() {
            store.delete_version(&key, &v).await.unwrap();
        }
        assert!(store.versions(&key).await.unwrap().is_empty(), "{key}");
    }

    // One outliving its chain by more than the tolerance (a schedule that fell behind, a
    // forever-incremental chain) locks the older backups longer first.
    let later = Timestamp::now() + SignedDuration::from_hours(3);
    let (date, extended) = transfer::chain_lock(&store, Some(later), Some(&full))
        .await
        .unwrap();
    let later = tidemark_store::objectlock::whole_second(later);
    assert_eq!(date, Some(later));
    assert_eq!(extended, 2, "the full's payload and metadata.json");
    for key in keys(&full) {
        assert_eq!(
            store.retention(&key).await.unwrap().unwrap().until,
            later,
            "{key}"
        );
        let v = store.versions(&key).await.unwrap();
        let refused = store.delete_version(&key, &v[0]).await.unwrap_err();
        assert!(
            format!("{refused:?}").contains("AccessDenied"),
            "{key}: {refused:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_need_an_s3_store_and_a_mode() {
    let (_dir, local) = tidemark_store::testkit::local_store("shop");
    let e = local
        .with_object_lock(Some(LockMode::Compliance))
        .unwrap_err();
    assert!(
        e.to_string().contains("object lock needs an s3:// store"),
        "{e}"
    );
    // A lock date on a store without a mode is refused before anything is written.
    let s3 = start();
    let store = s3.cluster_store("shop");
    let e = transfer::chain_lock(&store, Some(Timestamp::now()), None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("object lock"), "{e}");
}

/// A commit locks the payloads, then writes the locked `metadata.json`; an increment that
/// outlives its chain locks the older backups longer first. A crash between such steps (or
/// a commit whose fallback record failed too) leaves objects the server holds locked longer
/// than any record says: in an uncommitted attempt, under a failed record, or in a
/// committed backup whose recorded date has passed. A pass reads the server's date for
/// what it would delete and keeps them (`locked:<date>`) instead of trying, and being
/// refused, at every pass until then; what is not locked goes; after the date all go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_server_holds_longer_than_recorded_is_kept_until_its_date() {
    use tidemark_core::{Action, PolicyInput, Reason};
    use tidemark_store::objectlock::{Retention, whole_second};
    let s3 = start();
    let store = s3
        .locked_bucket("crashed", "shop")
        .await
        .with_object_lock(Some(LockMode::Governance))
        .unwrap();
    let now = Timestamp::now();
    let until = whole_second(now + SignedDuration::from_hours(72));
    let lock = Retention {
        mode: LockMode::Governance,
        until,
    };

    // A committed full recorded locked for seconds, which the server holds for days (an
    // increment locked it longer, then died before its commit); a newer full after it.
    let short = whole_second(now + SignedDuration::from_secs(5));
    let extended = take(
        &store,
        &spec("nightly", BackupType::Full, None, now),
        Some(short),
        None,
    )
    .await;
    for key in keys(&extended) {
        store.lock_at_least(&key, &lock).await.unwrap();
    }
    let newer = take(
        &store,
        &spec("nightly", BackupType::Full, None, Timestamp::now()),
        None,
        None,
    )
    .await;
    // Died after locking its payload: no metadata.json. Its marker stops being refreshed;
    // removed here, which is how a pass sees it once it has gone stale.
    let crashed = spec("nightly", BackupType::Full, None, Timestamp::now());
    let attempt = Attempt::begin(&store, &crashed).await.unwrap();
    let mut bytes: &[u8] = b"locked, never committed";
    let payload = attempt.upload(&mut bytes, &NoProgress).await.unwrap();
    let crashed_key = layout::payload_key(&crashed.backup_name, &crashed.backup_id, &payload.name);
    assert!(store.lock_at_least(&crashed_key, &lock).await.unwrap());
    drop(attempt);
    transfer::release_marker(&store, &crashed).await;
    // Recorded as failed without a date (the runner's record of an attempt that died).
    let failed = take(
        &store,
        &spec("nightly", BackupType::Full, None, Timestamp::now()),
        None,
        Some("the runner died"),
    )
    .await;
    assert_eq!(failed.immutable_until, None);
    let failed_key = layout::payload_key(&failed.backup_name, &failed.backup_id, "backup.bin");
    assert!(store.lock_at_least(&failed_key, &lock).await.unwrap());
    // And a failed attempt the server holds nothing of.
    let plain = take(
        &store,
        &spec("nightly", BackupType::Full, None, Timestamp::now()),
        None,
        Some("the source failed"),
    )
    .await;

    let policy = PolicyInput {
        keep_last: Some(1),
        failed_backups_ttl: Some("1d".into()),
        ..Default::default()
    }
    .validate()
    .unwrap();
    // A deleting pass's catalog writes no metadata cache in a locked (versioned) bucket.
    let writing = store
        .clone()
        .with_metadata_cache(tidemark_store::metacache::CacheUse::Write);
    let pass_at = |at: Timestamp| {
        let (store, policy) = (&writing, &policy);
        async move {
            tidemark_store::survey(
                store,
                policy,
                at,
                &tidemark_store::SurveyOptions::default(),
                &NoProgress,
            )
            .await
            .unwrap()
        }
    };
    let action = |seen: &tidemark_store::Survey, id: &str| {
        let d = seen
            .plan
            .backups
            .iter()
            .find(|d| d.backup.id == id)
            .unwrap();
        (d.action, d.reasons.clone())
    };
    // Two days on: all three are past what keeps them on record, and still locked.
    let seen = pass_at(now + SignedDuration::from_hours(48)).await;
    assert!(
        seen.catalog.warnings.is_empty(),
        "{:?}",
        seen.catalog.warnings
    );
    for id in [&extended.backup_id, &crashed.backup_id, &failed.backup_id] {
        assert_eq!(
            action(&seen, id),
            (Action::Keep, vec![Reason::Locked(until)]),
            "{id}"
        );
    }
    assert_eq!(action(&seen, &plain.backup_id).0, Action::Delete);
    assert_eq!(action(&seen, &newer.backup_id).0, Action::Keep);
    // What a pass that planned the delete would meet: the server refuses it.
    let v = store.versions(&crashed_key).await.unwrap();
    let refused = store.delete_version(&crashed_key, &v[0]).await.unwrap_err();
    assert!(
        format!("{refused:?}").contains("AccessDenied"),
        "{refused:?}"
    );
    // After the date they are collected like any other.
    let seen = pass_at(until + SignedDuration::from_hours(1)).await;
    for id in [&extended.backup_id, &crashed.backup_id, &failed.backup_id] {
        assert_eq!(action(&seen, id).0, Action::Delete, "{id}");
    }
    let cache = object_store::path::Path::from("_state/metadata-cache.json.zst");
    assert!(store.head(&cache).await.unwrap().is_none());
}

/// A store prefix with characters a URL may leave bare (`+ : = @ , ;`, a space): the lock
/// requests signed here name the very objects object_store wrote, and the server takes
/// their signatures — retention set and read, versions listed and deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_under_a_prefix_with_unusual_characters() {
    let s3 = start();
    s3.locked_bucket("odd", "unused").await;
    let store = tidemark_store::ClusterStore::open(
        "s3://odd/team+a:b=c@d,e;f/db%201",
        "shop",
        &s3.options(),
    )
    .unwrap()
    .with_object_lock(Some(LockMode::Governance))
    .unwrap();
    let now = Timestamp::now();
    let until = Timestamp::from_second(now.as_second() + 3).unwrap();
    let full = take(
        &store,
        &spec("nightly", BackupType::Full, None, now),
        Some(until),
        None,
    )
    .await;
    for key in keys(&full) {
        let r = store.retention(&key).await.unwrap();
        assert_eq!(r.map(|r| r.until), Some(until), "{key}");
        assert_eq!(store.versions(&key).await.unwrap().len(), 1, "{key}");
    }
    while Timestamp::now() <= until + jiff::SignedDuration::from_secs(1) {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    for key in keys(&full) {
        for v in store.versions(&key).await.unwrap() {
            store.delete_version(&key, &v).await.unwrap();
        }
        assert!(store.versions(&key).await.unwrap().is_empty(), "{key}");
        assert!(store.head(&key).await.unwrap().is_none(), "{key}");
    }
}

/// A key with more versions than one `ListObjectVersions` page (1,000) — an in-flight
/// marker rewritten every 30 s for nine hours has that many: every version is listed,
/// across pages, and can be deleted, so a stale attempt stays collectable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_past_one_page_are_all_listed() {
    use futures::StreamExt as _;
    use object_store::ObjectStoreExt as _;
    const VERSIONS: usize = 1005;
    let s3 = start();
    let store = s3.locked_bucket("manyversions", "shop").await;
    let key = object_store::path::Path::from("nightly/20261125T000000Z-00000001/.inflight");
    let inner = store.object_store().clone();
    let puts = futures::stream::iter(0..VERSIONS)
        .map(|i| {
            let (inner, key) = (inner.clone(), key.clone());
            async move { inner.put(&key, format!("heartbeat {i}").into()).await }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    assert!(puts.iter().all(Result::is_ok));
    let versions = store.versions(&key).await.unwrap();
    assert_eq!(versions.len(), VERSIONS);
    let distinct: std::collections::HashSet<&String> = versions.iter().collect();
    assert_eq!(distinct.len(), VERSIONS, "each version once");
    let deleted = futures::stream::iter(versions.iter())
        .map(|v| store.delete_version(&key, v))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    assert!(deleted.iter().all(Result::is_ok));
    assert!(store.versions(&key).await.unwrap().is_empty());
}
