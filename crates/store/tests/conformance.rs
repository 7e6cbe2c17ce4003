//! One conformance suite, run against a local directory and a real S3 server (SeaweedFS on
//! 127.0.0.1, started here). Each backend runs the cases in sequence inside one test so the
//! server is started once and stopped when the test ends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use object_store::ObjectStoreExt;
use object_store::path::Path;
use tidemark_core::{Action, PolicyInput, Reason};
use tidemark_store::fault::{FaultMode, FaultStore};
use tidemark_store::format::{AuditRecord, IndexFile};
use tidemark_store::index::SegmentIndex;
use tidemark_store::metacache::CacheUse;
use tidemark_store::synth::{self, SynthBackup};
use tidemark_store::testkit::{Azurite, GcsEmulator, SeaweedFs, local_store};
use tidemark_store::{
    ClusterStore, ExecOptions, NoProgress, StoreError, SurveyOptions, execute, survey,
};

/// The pass's `now`: two hours ahead of the clock (whole seconds), so that what the test
/// writes into the store — index shards its passes leave, with the store's own times — is
/// old enough for the planner's age rules (an unreferenced shard goes after an hour).
fn now() -> Timestamp {
    static NOW: std::sync::OnceLock<Timestamp> = std::sync::OnceLock::new();
    *NOW.get_or_init(|| {
        let t = Timestamp::now() + SignedDuration::from_hours(2);
        Timestamp::from_second(t.as_second()).unwrap()
    })
}

/// Day `d` of the test's history: `now` is day 19, 10:00.
fn day(d: i64) -> Timestamp {
    now() - SignedDuration::from_hours(19 * 24 + 10) + SignedDuration::from_hours(24 * d)
}

fn policy() -> tidemark_core::Policy {
    PolicyInput {
        window: Some("7d".into()),
        failed_backups_ttl: Some("2d".into()),
        ..Default::default()
    }
    .validate()
    .unwrap()
}

/// Index shards this small make every pass read, rewrite, seal and drop shards.
const SHARD: usize = 8;

fn exec_options() -> ExecOptions {
    ExecOptions {
        // Injected faults fail every retry; keep the pauses short.
        retry_backoff: std::time::Duration::from_millis(1),
        index_shard_size: SHARD,
        ..ExecOptions::new(
            now(),
            serde_json::json!({"window": "7d", "failedBackupsTTL": "2d"}),
        )
    }
}

/// A survey with the standard policy at the standard `now`.
async fn standard_survey(store: &ClusterStore) -> tidemark_store::Survey {
    survey(
        store,
        &policy(),
        now(),
        &SurveyOptions::default(),
        &NoProgress,
    )
    .await
    .unwrap()
}

/// A fresh store for one case.
trait Backing {
    fn fresh(&self, case: &str) -> (Option<tempfile::TempDir>, ClusterStore);
    fn name(&self) -> &'static str;
}

struct Local;
impl Backing for Local {
    fn fresh(&self, case: &str) -> (Option<tempfile::TempDir>, ClusterStore) {
        let (dir, store) = local_store(case);
        (Some(dir), store)
    }
    fn name(&self) -> &'static str {
        "local"
    }
}

impl Backing for SeaweedFs {
    fn fresh(&self, case: &str) -> (Option<tempfile::TempDir>, ClusterStore) {
        let unique = format!("{case}-{:08x}", rand::random::<u32>());
        (None, self.cluster_store(&unique))
    }
    fn name(&self) -> &'static str {
        "seaweedfs"
    }
}

impl Backing for Azurite {
    fn fresh(&self, case: &str) -> (Option<tempfile::TempDir>, ClusterStore) {
        let unique = format!("{case}-{:08x}", rand::random::<u32>());
        (None, self.cluster_store(&unique))
    }
    fn name(&self) -> &'static str {
        "azurite"
    }
}

impl Backing for GcsEmulator {
    fn fresh(&self, case: &str) -> (Option<tempfile::TempDir>, ClusterStore) {
        let unique = format!("{case}-{:08x}", rand::random::<u32>());
        (None, self.cluster_store(&unique))
    }
    fn name(&self) -> &'static str {
        "gcs"
    }
}

/// The same store behind a fault-injecting wrapper.
fn faulty(store: &ClusterStore, mode: FaultMode) -> (Arc<FaultStore>, ClusterStore) {
    let fault = Arc::new(FaultStore::new(Arc::clone(store.object_store()), mode));
    let wrapped = store.map_inner(|_| fault.clone());
    (fault, wrapped)
}

/// The standard history: a week of daily fulls (days 0–12, an incremental chain on days
/// 10–12), a failed and an uncommitted attempt, segments for the whole span, one foreign
/// object, one malformed metadata.json.
async fn standard_history(store: &ClusterStore) -> Vec<SynthBackup> {
    let mut backups = Vec::new();
    for d in 0..10 {
        backups.push(SynthBackup::full(
            &format!("daily-{d:02}"),
            day(d),
            d as u32,
        ));
    }
    let base = SynthBackup::full("chain", day(10), 100);
    let i1 = SynthBackup::incremental("chain", &base.id, day(11), 101);
    let i2 = SynthBackup::incremental("chain", &i1.id, day(12), 102);
    backups.extend([base, i1, i2]);
    let mut failed = SynthBackup::full("failed", day(5), 200);
    failed.failed = true;
    let mut uncommitted = SynthBackup::full("crashed", day(4), 201);
    uncommitted.uncommitted = true;
    backups.extend([failed, uncommitted]);
    synth::write_backups(store, &backups).await.unwrap();

    let entries = synth::segments("mysql-bin", 1, 60, day(0), SignedDuration::from_hours(6));
    synth::write_segments(store, &entries).await.unwrap();
    synth::write_index_sharded(store, &entries, SHARD)
        .await
        .unwrap();
    synth::write_raw(store, "README.txt", b"not ours")
        .await
        .unwrap();
    // Malformed, started on day 11: kept, holding binlogs from its start (after the
    // chain's base, so the horizon stays at day 10).
    let manual = malformed_dir();
    synth::write_raw(
        store,
        &format!("{manual}/metadata.json"),
        b"{\"formatVersion\": 1, \"backupId\": ",
    )
    .await
    .unwrap();
    synth::write_raw(store, &format!("{manual}/backup.tar"), b"x")
        .await
        .unwrap();
    backups
}

/// The directory of the standard history's malformed backup.
fn malformed_dir() -> String {
    format!("manual/{}", synth::backup_id(day(11), 0xdead_beef))
}

type Case = for<'a> fn(&'a ClusterStore) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

fn cases() -> Vec<(&'static str, Case)> {
    vec![
        ("collects-exactly-the-plan", |s| {
            Box::pin(collects_exactly_the_plan(s))
        }),
        ("second-pass-is-a-no-op", |s| {
            Box::pin(second_pass_is_a_no_op(s))
        }),
        ("orphans-are-reconciled", |s| {
            Box::pin(orphans_are_reconciled(s))
        }),
        ("interrupted-deletion-is-finished", |s| {
            Box::pin(interrupted_deletion_is_finished(s))
        }),
        ("index-rewrite-keeps-concurrent-appends", |s| {
            Box::pin(index_rewrite_keeps_concurrent_appends(s))
        }),
        ("malformed-index-stops-the-pass", |s| {
            Box::pin(malformed_index_stops_the_pass(s))
        }),
        ("newer-format-is-never-deleted", |s| {
            Box::pin(newer_format_is_never_deleted(s))
        }),
        ("sharded-index-is-read-where-the-pass-reaches", |s| {
            Box::pin(sharded_index_is_read_where_the_pass_reaches(s))
        }),
        ("a-stale-metadata-cache-never-changes-the-plan", |s| {
            Box::pin(a_stale_metadata_cache_never_changes_the_plan(s))
        }),
        ("a-forged-metadata-cache-never-changes-the-plan", |s| {
            Box::pin(a_forged_metadata_cache_never_changes_the_plan(s))
        }),
    ]
}

fn run_suite(backing: &dyn Backing) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    for (name, case) in cases() {
        let (_guard, store) = backing.fresh(name);
        eprintln!("[{}] {name}", backing.name());
        rt.block_on(case(&store));
    }
    rt.block_on(crash_at_every_request_converges(backing));
}

#[test]
fn conformance_local_directory() {
    run_suite(&Local);
}

#[test]
fn conformance_seaweedfs() {
    let server = SeaweedFs::start();
    run_suite(&server);
}

/// `az://` (issue 19 §5): the same suite against Azurite, the Azure Blob emulator, through
/// `ClusterStore::open` with the account's key, as the CLI and the operator open it.
#[test]
fn conformance_azurite() {
    let server = Azurite::start();
    run_suite(&server);
}

/// `gs://` (issue 19 §5): the same suite against a GCS emulator (PyPI's
/// gcp-storage-emulator with the XML API, `scripts/gcs-emulator.py`), through
/// `ClusterStore::open` with a service-account key, as the CLI and the operator open it.
#[test]
fn conformance_gcs() {
    let server = GcsEmulator::start();
    run_suite(&server);
}

// ------------------------------------------------------------------ cases

async fn collects_exactly_the_plan(store: &ClusterStore) {
    let history = standard_history(store).await;
    let before: BTreeSet<String> = synth::all_keys(store).await.unwrap().into_iter().collect();
    let s = standard_survey(store).await;

    assert_eq!(
        s.catalog.foreign,
        vec![format!("{}/README.txt", store.cluster)]
    );
    assert_eq!(s.catalog.malformed.len(), 1);
    assert!(
        s.catalog.malformed[0]
            .key
            .ends_with(&format!("{}/metadata.json", malformed_dir()))
    );
    assert!(
        s.catalog.malformed[0]
            .problem
            .contains("not valid metadata")
    );

    // Window 7d at Nov 20 12:00 keeps completions from Nov 13 12:00: none, so the floor
    // keeps day 12 (i2) and its chain days 10 and 11. Days 0–9 expire, as does the failed
    // attempt (its completion is old).
    let decided: Vec<(String, Action, Vec<String>)> = s
        .plan
        .backups
        .iter()
        .map(|d| {
            (
                d.backup.name.clone(),
                d.action,
                d.reasons.iter().map(ToString::to_string).collect(),
            )
        })
        .collect();
    let kept: Vec<&str> = decided
        .iter()
        .filter(|d| d.1 == Action::Keep)
        .map(|d| d.0.as_str())
        .collect();
    // The crashed attempt ages from its objects' last-modified time (just written), so it
    // is still within failedBackupsTTL; the malformed one is kept whatever happens.
    assert_eq!(
        kept,
        ["crashed", "chain", "chain", "manual", "chain"],
        "{decided:?}"
    );
    let manual = decided.iter().find(|d| d.0 == "manual").unwrap();
    assert_eq!(manual.2, ["malformed"]);
    let crashed = decided.iter().find(|d| d.0 == "crashed").unwrap();
    assert_eq!(crashed.2, ["failedBackupsTTL"]);
    assert_eq!(s.plan.horizon, Some(day(10)));
    // 6-hour segments from day 0: those ending strictly before day 10 02:00 go (1–39;
    // segment 40 ends exactly at the horizon).
    assert_eq!(s.plan.segments.delete.len(), 39);

    let report = execute(store, &s, &exec_options(), &NoProgress)
        .await
        .unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.backups_deleted.len(), 11);
    assert_eq!(report.segments_deleted, 39);
    assert_eq!(report.index_entries_removed, 39);

    let after: BTreeSet<String> = without_shards(synth::all_keys(store).await.unwrap())
        .into_iter()
        .collect();
    let audit_key = report.audit_key.clone().unwrap();
    let audit_rel = audit_key
        .strip_prefix(&format!("{}/", store.cluster))
        .unwrap()
        .to_owned();
    let mut expected: BTreeSet<String> = without_shards(before.into_iter().collect())
        .iter()
        .filter(|k| {
            let deleted_backup = history.iter().any(|b| {
                b.name != "chain"
                    && b.name != "crashed"
                    && k.starts_with(&format!("{}/{}/", b.name, b.id))
            });
            let deleted_segment = k
                .strip_prefix("binlogs/mysql-bin.")
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n <= 39);
            !deleted_backup && !deleted_segment
        })
        .cloned()
        .collect();
    expected.insert(audit_rel.clone());
    assert_eq!(after, expected);

    // The audit record carries the plan with its reasons.
    let body = store
        .object_store()
        .get(&Path::from(audit_rel))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let record: AuditRecord = serde_json::from_slice(&body).unwrap();
    assert_eq!(record.backups.len(), 16);
    assert_eq!(record.segments_deleted.len(), 39);
    assert!(
        record
            .backups
            .iter()
            .any(|b| b.action == "keep" && b.reasons.iter().any(|r| r.starts_with("chain:")))
    );

    // The index lists exactly the remaining segments.
    let names: Vec<u64> = index_entries(store)
        .await
        .iter()
        .map(|e| e.sequence)
        .collect();
    assert_eq!(names, (40..=60).collect::<Vec<_>>());
}

async fn second_pass_is_a_no_op(store: &ClusterStore) {
    standard_history(store).await;
    let s = standard_survey(store).await;
    execute(store, &s, &exec_options(), &NoProgress)
        .await
        .unwrap();
    let keys = synth::all_keys(store).await.unwrap();
    let again = standard_survey(store).await;
    assert!(
        again.plan.is_empty(),
        "{:?}",
        again.plan.deletions().collect::<Vec<_>>()
    );
    let report = execute(store, &again, &exec_options(), &NoProgress)
        .await
        .unwrap();
    assert_eq!(report.audit_key, None);
    assert_eq!(synth::all_keys(store).await.unwrap(), keys);
}

async fn orphans_are_reconciled(store: &ClusterStore) {
    let keeper = SynthBackup::full("daily", day(15), 1);
    synth::write_backups(store, &[keeper]).await.unwrap();
    let entries = synth::segments("mysql-bin", 1, 80, day(0), SignedDuration::from_hours(6));
    // Indexed 1..=70; 71..=80 archived but not yet indexed (an archiver died between).
    synth::write_segments(store, &entries).await.unwrap();
    synth::write_index(store, &entries[..70]).await.unwrap();
    // Segment 5's object is already gone (an earlier pass died before the index rewrite),
    // and segment 2 was never indexed.
    store
        .object_store()
        .delete(&Path::from("binlogs/mysql-bin.000005"))
        .await
        .unwrap();
    let mut idx = read_index(store).await;
    idx.remove_where(|e| e.sequence == 2);
    store
        .object_store()
        .put(&Path::from("binlogs/_index.json"), idx.to_bytes().into())
        .await
        .unwrap();

    let s = standard_survey(store).await;
    assert_eq!(
        s.plan.segments.drop_from_index,
        [tidemark_core::EntryRef {
            sequence: 5,
            name: "mysql-bin.000005".into()
        }]
    );
    let unindexed: Vec<&str> = s
        .plan
        .segments
        .delete
        .iter()
        .filter(|d| d.reason == tidemark_core::SegmentReason::UnindexedBehindHorizon)
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(unindexed, ["mysql-bin.000002"]);
    execute(store, &s, &exec_options(), &NoProgress)
        .await
        .unwrap();
    let keys = synth::all_keys(store).await.unwrap();
    assert!(!keys.iter().any(|k| k == "binlogs/mysql-bin.000002"));
    // Unindexed segments ahead of the horizon are left for the archiver.
    assert!(keys.iter().any(|k| k == "binlogs/mysql-bin.000080"));
    assert!(index_entries(store).await.iter().all(|e| e.sequence > 5));
}

async fn interrupted_deletion_is_finished(store: &ClusterStore) {
    // A pass un-committed `old` (deleted its metadata), recorded it in its audit record,
    // then died. With no failedBackupsTTL the leftover payload is still removed.
    let old = SynthBackup::full("daily", day(1), 1);
    let new = SynthBackup::full("daily", day(15), 2);
    synth::write_backups(store, &[old.clone(), new])
        .await
        .unwrap();
    let p = PolicyInput {
        keep_last: Some(1),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let s = survey(store, &p, now(), &SurveyOptions::default(), &NoProgress)
        .await
        .unwrap();
    // Request 0 writes the audit record, 1 deletes the metadata, 2 (the payload) fails
    // and so does everything after: the process "died" there.
    let (fault, crashing) = faulty(store, FaultMode::From(2));
    let _ = execute(&crashing, &s, &exec_options(), &NoProgress).await;
    assert!(fault.requests() >= 2);
    let keys = synth::all_keys(store).await.unwrap();
    assert!(
        !keys.contains(&format!("daily/{}/metadata.json", old.id)),
        "{keys:?}"
    );
    assert!(keys.contains(&format!("daily/{}/backup.tar", old.id)));
    let s2 = survey(store, &p, now(), &SurveyOptions::default(), &NoProgress)
        .await
        .unwrap();
    let d = s2
        .plan
        .backups
        .iter()
        .find(|d| d.backup.id == old.id)
        .unwrap();
    assert_eq!(d.reasons, [Reason::InterruptedDelete]);
    execute(store, &s2, &exec_options(), &NoProgress)
        .await
        .unwrap();
    let keys = synth::all_keys(store).await.unwrap();
    assert!(!keys.iter().any(|k| k.contains(&old.id)), "{keys:?}");
}

async fn index_rewrite_keeps_concurrent_appends(store: &ClusterStore) {
    synth::write_backups(store, &[SynthBackup::full("daily", day(15), 1)])
        .await
        .unwrap();
    let entries = synth::segments("mysql-bin", 1, 70, day(0), SignedDuration::from_hours(6));
    synth::write_segments(store, &entries).await.unwrap();
    synth::write_index(store, &entries[..69]).await.unwrap();
    let s = standard_survey(store).await;
    // An archiver appends segment 70 after the survey read the index.
    let mut idx = read_index(store).await;
    idx.push(entries[69].clone()).unwrap();
    store
        .object_store()
        .put(&Path::from("binlogs/_index.json"), idx.to_bytes().into())
        .await
        .unwrap();
    execute(store, &s, &exec_options(), &NoProgress)
        .await
        .unwrap();
    let entries = index_entries(store).await;
    assert!(
        entries.iter().any(|e| e.sequence == 70),
        "concurrent append lost"
    );
    assert!(entries.iter().all(|e| e.sequence > 56));
}

async fn malformed_index_stops_the_pass(store: &ClusterStore) {
    synth::write_backups(
        store,
        &[
            SynthBackup::full("daily", day(1), 1),
            SynthBackup::full("daily", day(15), 2),
        ],
    )
    .await
    .unwrap();
    synth::write_raw(
        store,
        "binlogs/_index.json",
        b"{\"formatVersion\": 1, \"segments\": {}}",
    )
    .await
    .unwrap();
    let e = survey(
        store,
        &policy(),
        now(),
        &SurveyOptions::default(),
        &NoProgress,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, StoreError::MalformedIndex { .. }), "{e}");
    let msg = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(
        msg.contains("binlogs/_index.json") && msg.contains("expected {\"formatVersion\": 1"),
        "{msg}"
    );
    assert_eq!(synth::all_keys(store).await.unwrap().len(), 5);
}

async fn newer_format_is_never_deleted(store: &ClusterStore) {
    let old = SynthBackup::full("daily", day(1), 1);
    synth::write_backups(
        store,
        &[old.clone(), SynthBackup::full("daily", day(15), 2)],
    )
    .await
    .unwrap();
    let mut m = serde_json::to_value(old.metadata(&store.cluster)).unwrap();
    m["formatVersion"] = (tidemark_store::format::METADATA_FORMAT_VERSION + 1).into();
    m["shinyNewField"] = "x".into();
    synth::write_raw(
        store,
        &format!("daily/{}/metadata.json", old.id),
        &serde_json::to_vec(&m).unwrap(),
    )
    .await
    .unwrap();
    let s = standard_survey(store).await;
    let d = s
        .plan
        .backups
        .iter()
        .find(|d| d.backup.id == old.id)
        .unwrap();
    assert_eq!(d.action, Action::Keep);
    assert_eq!(d.reasons, [Reason::NewerFormat]);
}

/// Issue 32 §2: the metadata cache saves the reads of unchanged `metadata.json` files, and
/// a stale cache never changes a plan. After each change to the store — an edit of the
/// same size (an expired backup rewritten in a newer format, which is then kept; a backup
/// marked failed; an increment given another parent), a deleted
/// `metadata.json`, a new backup — the plan made with the cache written before it is the
/// plan made without any cache, and differs from the plan before the change (so a cache
/// trusted where it should not be would show).
async fn a_stale_metadata_cache_never_changes_the_plan(store: &ClusterStore) {
    let history = standard_history(store).await;
    let writing = store.clone().with_metadata_cache(CacheUse::Write);
    let uncached = store.clone().with_metadata_cache(CacheUse::Off);
    let committed = history.iter().filter(|b| !b.uncommitted).count();
    let served = if cache_serves(store) { committed } else { 0 };
    let plan = |store: ClusterStore| async move { standard_survey(&store).await.plan };

    let first = plan(writing.clone()).await;
    let (counted, counting) = faulty(store, FaultMode::Never);
    let loaded = tidemark_store::Catalog::load(&counting, &NoProgress)
        .await
        .unwrap();
    assert_eq!(loaded.metadata_from_cache, served);
    let with_cache = counted.requests();
    let (counted, counting) = faulty(&uncached, FaultMode::Never);
    let loaded = tidemark_store::Catalog::load(&counting, &NoProgress)
        .await
        .unwrap();
    assert_eq!(loaded.metadata_from_cache, 0);
    // Without the cache: one GET per metadata.json (the malformed one too); with it, one
    // GET of the cache and none of the committed ones.
    if served > 0 {
        assert_eq!(counted.requests() - with_cache, committed - 1);
    }
    assert_eq!(plan(store.clone()).await, first);

    // Each change, with the cache as it was before any of them.
    let doc = |b: &SynthBackup| format!("{}/{}/metadata.json", b.name, b.id);
    let read = |key: String| async move {
        let bytes = store
            .read(&Path::from(key.as_str()))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    };
    let newest = history.iter().find(|b| b.name == "daily-09").unwrap();
    let text = read(doc(newest)).await;
    let failed = text.replacen("\"phase\": \"completed\"", "\"phase\": \"failed\"   ", 1);
    assert_eq!((failed.len(), failed != text), (text.len(), true));
    let increment = history
        .iter()
        .find(|b| b.name == "chain" && b.parent.is_some() && b.started_at == day(12))
        .unwrap();
    let base = history
        .iter()
        .find(|b| b.name == "chain" && b.parent.is_none())
        .unwrap();
    let text_i2 = read(doc(increment)).await;
    let reparented = text_i2.replacen(increment.parent.as_deref().unwrap(), &base.id, 1);
    assert_eq!(reparented.len(), text_i2.len());
    // An expired backup rewritten by a newer Tidemark, same size: the store no longer
    // justifies deleting it (a newer format is never deleted), the stale cache would.
    let expired = history.iter().find(|b| b.name == "daily-05").unwrap();
    let text_05 = read(doc(expired)).await;
    let at = text_05.find("\"formatVersion\": ").unwrap() + "\"formatVersion\": ".len();
    let digits = text_05[at..].find(|c: char| !c.is_ascii_digit()).unwrap();
    let next = tidemark_store::format::METADATA_FORMAT_VERSION + 1;
    let newer = format!(
        "{}{next:0digits$}{}",
        &text_05[..at],
        &text_05[at + digits..]
    );
    assert_eq!((newer.len(), newer != text_05), (text_05.len(), true));
    assert_eq!(action_of(&first, &expired.id), Action::Delete);
    let gone = history.iter().find(|b| b.name == "daily-03").unwrap();
    let changes = [
        "an expired backup's metadata.json of a newer format, same size",
        "a backup marked failed, same size",
        "an increment given another parent, same size",
        "a metadata.json deleted",
        "a backup added",
    ];
    let mut before = first;
    for (step, what) in changes.into_iter().enumerate() {
        match step {
            0 => write(store, &doc(expired), newer.as_bytes()).await,
            1 => write(store, &doc(newest), failed.as_bytes()).await,
            2 => write(store, &doc(increment), reparented.as_bytes()).await,
            3 => store
                .object_store()
                .delete(&Path::from(doc(gone).as_str()))
                .await
                .unwrap(),
            _ => synth::write_backups(store, &[SynthBackup::full("daily-10", day(13), 10)])
                .await
                .unwrap(),
        }
        let truth = plan(uncached.clone()).await;
        assert!(truth != before, "{what}: the change should change the plan");
        let cached = plan(store.clone()).await;
        assert!(
            cached == truth,
            "{what}: the cache changed the plan:\n{}",
            plan_differences(&cached, &truth)
        );
        if step == 0 {
            assert_eq!(action_of(&truth, &expired.id), Action::Keep);
        }
        before = truth;
    }

    // A pass that deletes writes the cache again; it then serves every committed backup.
    let again = plan(writing.clone()).await;
    assert_eq!(again, before);
    let loaded = tidemark_store::Catalog::load(store, &NoProgress)
        .await
        .unwrap();
    let committed_now = loaded
        .backups
        .iter()
        .filter(|b| b.metadata.is_some())
        .count();
    assert_eq!(
        loaded.metadata_from_cache,
        if served > 0 { committed_now } else { 0 }
    );
    assert_eq!(plan(store.clone()).await, before);
}

/// Whether a load takes bodies from the metadata cache here: where the store's entity tag
/// is the content's MD5 (S3, GCS's XML API). A local directory's listing has no tags, and
/// Azure's are not digests: both read every metadata.json.
fn cache_serves(store: &ClusterStore) -> bool {
    matches!(
        store.backend,
        tidemark_store::Backend::S3 | tidemark_store::Backend::Gcs
    )
}

/// Issue 42 §4: a forged metadata cache — the listing's own keys, entity tags and sizes,
/// each with another body of the same size (every committed backup marked failed) —
/// changes no plan: a body is taken from the cache only when its MD5 is the tag the store
/// computed, so none of the forged ones is. A pass that deletes then rewrites the cache with
/// the objects' bodies, which a later load takes (where tags are digests).
async fn a_forged_metadata_cache_never_changes_the_plan(store: &ClusterStore) {
    use futures::TryStreamExt;
    let history = standard_history(store).await;
    let plan = |store: ClusterStore| async move { standard_survey(&store).await.plan };
    let truth = plan(store.clone().with_metadata_cache(CacheUse::Off)).await;
    let listed: Vec<object_store::ObjectMeta> = store
        .object_store()
        .list(None)
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.location.as_ref().ends_with("/metadata.json"))
        .collect();
    let mut entries = serde_json::Map::new();
    let mut forged = 0;
    for m in &listed {
        let body = store.read(&m.location).await.unwrap().unwrap();
        let text = String::from_utf8_lossy(&body).into_owned();
        let lie = text.replacen("\"phase\": \"completed\"", "\"phase\": \"failed\"   ", 1);
        assert_eq!(lie.len(), text.len());
        forged += usize::from(lie != text);
        let tag = m.e_tag.clone().unwrap_or_default().replace('"', "");
        entries.insert(
            m.location.as_ref().to_owned(),
            serde_json::json!({"eTag": tag, "size": m.size, "body": lie}),
        );
    }
    let committed = history.iter().filter(|b| !b.uncommitted).count();
    assert!(forged >= committed - 2, "{forged} of {committed} forged");
    let file = serde_json::json!({"formatVersion": 1, "entries": entries});
    let cache = zstd::bulk::compress(&serde_json::to_vec(&file).unwrap(), 3).unwrap();
    write(store, "_state/metadata-cache.json.zst", &cache).await;
    // Read by a load (`plan`, `ls`, a restore's): the plan made without any cache.
    let cached = plan(store.clone()).await;
    assert!(
        cached == truth,
        "the forged cache changed the plan:\n{}",
        plan_differences(&cached, &truth)
    );
    let loaded = tidemark_store::Catalog::load(store, &NoProgress)
        .await
        .unwrap();
    assert_eq!(
        loaded.metadata_from_cache,
        if cache_serves(store) {
            listed.len() - forged
        } else {
            0
        },
        "only the bodies that are the objects' are taken"
    );
    // A pass that deletes rewrites it; it then serves every committed backup.
    let again = plan(store.clone().with_metadata_cache(CacheUse::Write)).await;
    assert!(again == truth);
    let rewritten = store
        .read(&Path::from("_state/metadata-cache.json.zst"))
        .await
        .unwrap();
    if cache_serves(store) {
        assert!(
            rewritten.is_some_and(|r| r.as_ref() != cache.as_slice()),
            "not rewritten"
        );
        let loaded = tidemark_store::Catalog::load(store, &NoProgress)
            .await
            .unwrap();
        assert_eq!(
            loaded.metadata_from_cache,
            listed.len() - 1,
            "the malformed one is read"
        );
    }
    assert!(plan(store.clone()).await == truth);
}

fn action_of(plan: &tidemark_core::Plan, id: &str) -> Action {
    plan.backups
        .iter()
        .find(|d| d.backup.id == id)
        .map(|d| d.action)
        .unwrap()
}

/// What differs between two plans, as people read it (a whole plan is long).
fn plan_differences(a: &tidemark_core::Plan, b: &tidemark_core::Plan) -> String {
    let line = |d: &tidemark_core::BackupDecision| {
        format!(
            "{}/{} {:?} {:?} {:?}",
            d.backup.name, d.backup.id, d.backup.phase, d.action, d.reasons
        )
    };
    let (left, right): (BTreeSet<String>, BTreeSet<String>) = (
        a.backups.iter().map(line).collect(),
        b.backups.iter().map(line).collect(),
    );
    let mut out: Vec<String> = left
        .difference(&right)
        .map(|l| format!("- {l}"))
        .chain(right.difference(&left).map(|l| format!("+ {l}")))
        .collect();
    if a.horizon != b.horizon || a.segments.delete.len() != b.segments.delete.len() {
        out.push(format!(
            "horizon {:?} vs {:?}, segments deleted {} vs {}",
            a.horizon,
            b.horizon,
            a.segments.delete.len(),
            b.segments.delete.len()
        ));
    }
    if out.is_empty() {
        out.push("(the decisions are the same; other fields differ)".to_owned());
    }
    out.join("\n")
}

async fn write(store: &ClusterStore, key: &str, body: &[u8]) {
    synth::write_raw(store, key, body).await.unwrap();
}

/// Crash (every request from the k-th fails) or a single transient failure at the k-th
/// request, for every k of a pass; then a clean pass. The store must end exactly as after
/// one clean pass, never expose a half-deleted backup, and keep a valid index.
async fn crash_at_every_request_converges(backing: &dyn Backing) {
    let small_history = |store: ClusterStore| async move {
        let a = SynthBackup::full("daily", day(1), 1);
        let b = SynthBackup::incremental("daily", &a.id, day(2), 2);
        let c = SynthBackup::full("daily", day(14), 3);
        let mut f = SynthBackup::full("failed", day(3), 4);
        f.failed = true;
        synth::write_backups(&store, &[a, b, c, f]).await.unwrap();
        let entries = synth::segments("mysql-bin", 1, 12, day(0), SignedDuration::from_hours(36));
        synth::write_segments(&store, &entries).await.unwrap();
        // Two shards of four and four entries in the head: the pass drops one shard,
        // rewrites the other and re-seals the head.
        synth::write_index_sharded(&store, &entries, 4)
            .await
            .unwrap();
        store
    };
    let clean_pass = |store: ClusterStore| async move {
        let s = standard_survey(&store).await;
        execute(&store, &s, &exec_options(), &NoProgress)
            .await
            .unwrap();
        store
    };
    // Audit records and shard names carry random ids; the index is compared by content.
    let without_audit = |keys: Vec<String>| -> Vec<String> {
        without_shards(keys)
            .into_iter()
            .filter(|k| !k.starts_with("_audit/"))
            .collect()
    };

    let (_g, reference) = backing.fresh("crash-reference");
    let reference = clean_pass(small_history(reference).await).await;
    let expected = without_audit(synth::all_keys(&reference).await.unwrap());

    // Requests a whole clean pass makes (survey + execute).
    let (_g0, counted) = backing.fresh("crash-count");
    let counted = small_history(counted).await;
    let (counter, through) = faulty(&counted, FaultMode::Never);
    clean_pass(through).await;
    let total = counter.requests();
    assert!(
        total > 10,
        "a pass should make more than 10 requests, made {total}"
    );

    for k in 0..total {
        for mode in [FaultMode::From(k), FaultMode::Once(k)] {
            let (_g, store) = backing.fresh("crash");
            let store = small_history(store).await;
            let (_, broken) = faulty(&store, mode);
            if let Ok(s) = survey(
                &broken,
                &policy(),
                now(),
                &SurveyOptions::default(),
                &NoProgress,
            )
            .await
            {
                let _ = execute(&broken, &s, &exec_options(), &NoProgress).await;
            }
            // In between: no committed backup is missing its payload.
            let keys = synth::all_keys(&store).await.unwrap();
            for k2 in keys.iter().filter(|k| k.ends_with("/metadata.json")) {
                let dir = k2.trim_end_matches("metadata.json");
                assert!(
                    keys.iter()
                        .any(|o| o.starts_with(dir) && o.ends_with("backup.tar")),
                    "{mode:?}: {k2} committed without payload"
                );
            }
            // The index, shards included, is whole after the fault.
            try_index_entries(&store)
                .await
                .unwrap_or_else(|e| panic!("{mode:?}: index invalid after the fault: {e}"));
            let store = clean_pass(store).await;
            let got = without_audit(synth::all_keys(&store).await.unwrap());
            assert_eq!(got, expected, "{mode:?} did not converge");
            assert_shards_all_named(&store).await;
            let mut idx_names: Vec<String> = index_entries(&store)
                .await
                .iter()
                .map(|e| format!("binlogs/{}", e.name))
                .collect();
            idx_names.sort();
            let seg_keys: Vec<String> = got
                .iter()
                .filter(|k| k.starts_with("binlogs/mysql-bin."))
                .cloned()
                .collect();
            assert_eq!(idx_names, seg_keys, "{mode:?}: index and segments disagree");
        }
    }
    eprintln!(
        "[{}] crash/transient fault at each of {total} requests: converged",
        backing.name()
    );
}

async fn sharded_index_is_read_where_the_pass_reaches(store: &ClusterStore) {
    // 400 six-hourly segments in shards of eight (50 shards, from day 0 to day 100), one
    // with a hole; backups on days 20 and 95: the window drops day 20, so segments before
    // day 95 go.
    synth::write_backups(
        store,
        &[
            SynthBackup::full("daily", day(20), 1),
            SynthBackup::full("daily", day(95), 2),
        ],
    )
    .await
    .unwrap();
    let mut entries = synth::segments("mysql-bin", 1, 400, day(0), SignedDuration::from_hours(6));
    entries.retain(|e| e.sequence != 390);
    synth::write_segments(store, &entries).await.unwrap();
    synth::write_index_sharded(store, &entries, SHARD)
        .await
        .unwrap();
    let now = day(101);
    let p = PolicyInput {
        window: Some("7d".into()),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let s = survey(store, &p, now, &SurveyOptions::default(), &NoProgress)
        .await
        .unwrap();
    let index = s.catalog.index.as_ref().unwrap();
    // Read: the shards up to the horizon (day 95 = segment 380) and the one with the hole.
    let read: Vec<u64> = index
        .head
        .shards
        .iter()
        .filter(|sh| index.is_read(&sh.key))
        .map(|sh| sh.first_sequence)
        .collect();
    let expected_read: Vec<u64> = (0..49u64).map(|k| k * 8 + 1).collect();
    assert_eq!(read, expected_read, "shards read");
    assert_eq!(s.plan.horizon, Some(day(95)));
    assert_eq!(s.plan.segments.delete.len(), 379);
    // Replay stops at the hole: the window ends with segment 389.
    let window = s.plan.recovery_window.clone().unwrap();
    assert_eq!(window.to, day(0) + SignedDuration::from_hours(389 * 6));

    execute(store, &s, &exec_options(), &NoProgress)
        .await
        .unwrap();
    let left: Vec<u64> = index_entries(store)
        .await
        .iter()
        .map(|e| e.sequence)
        .collect();
    let want: Vec<u64> = (380..=400).filter(|&q| q != 390).collect();
    assert_eq!(left, want);
    assert_shards_all_named(store).await;
    // The next pass has nothing to do and reads no shard beyond the head's reach.
    let again = survey(store, &p, now, &SurveyOptions::default(), &NoProgress)
        .await
        .unwrap();
    assert!(again.plan.is_empty());
}

fn without_shards(keys: Vec<String>) -> Vec<String> {
    keys.into_iter()
        .filter(|k| !k.starts_with("binlogs/_index/"))
        .collect()
}

/// Every index entry, head and shards, by sequence; an error when a named shard is
/// missing or anything is malformed.
async fn try_index_entries(
    store: &ClusterStore,
) -> Result<Vec<tidemark_store::format::IndexEntry>, StoreError> {
    let Some(mut index) = SegmentIndex::load(store).await? else {
        return Ok(Vec::new());
    };
    let unread: Vec<String> = index.unread().map(|s| s.key.clone()).collect();
    index.read_shards(store, unread).await?;
    let mut entries: Vec<_> = index.entries().cloned().collect();
    entries.sort_by_key(|e| e.sequence);
    Ok(entries)
}

async fn index_entries(store: &ClusterStore) -> Vec<tidemark_store::format::IndexEntry> {
    try_index_entries(store).await.unwrap()
}

/// Every shard object is named by the head (no debris), and every named one exists.
async fn assert_shards_all_named(store: &ClusterStore) {
    let index = SegmentIndex::load(store).await.unwrap();
    let mut named: Vec<String> = index
        .iter()
        .flat_map(|i| i.head.shards.iter().map(|s| format!("binlogs/{}", s.key)))
        .collect();
    named.sort();
    let present: Vec<String> = synth::all_keys(store)
        .await
        .unwrap()
        .into_iter()
        .filter(|k| k.starts_with("binlogs/_index/"))
        .collect();
    assert_eq!(present, named, "shard objects and the head disagree");
}

async fn read_index(store: &ClusterStore) -> IndexFile {
    let body = store
        .object_store()
        .get(&Path::from("binlogs/_index.json"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    IndexFile::parse(&body).unwrap()
}
