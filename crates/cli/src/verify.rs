//! `tidemark verify` (issue 19 §4): every committed backup's payload and every indexed
//! binlog segment read back from the store and checked — size and sha256 of the stored
//! bytes, and the content where this machine can decode it (zstd's checksums; age's
//! authentication, with an identity) — then the chains and the recovery window. A damaged,
//! cut or missing object is named; nothing is written anywhere.

use std::collections::HashSet;

use futures::StreamExt;
use serde::Serialize;
use tidemark_core::Phase;
use tidemark_core::plan::standing;
use tidemark_store::catalog::Catalog;
use tidemark_store::transfer::{Checked, TransferError, verify_object};
use tidemark_store::{ClusterStore, NoProgress, SegmentListing, layout};

use crate::args::{OutputFormat, VerifyArgs};
use crate::commands::{emit, emit_json};
use crate::exit::{CliError, Exit};
use crate::output::JSON_FORMAT_VERSION;
use crate::resolve;
use tidemark_core::RecoveryWindow;

/// Objects read at once.
const CONCURRENCY: usize = 4;

/// What became of one object.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectOut {
    pub key: String,
    /// `ok`, `damaged` (size, sha256 or content), `missing`, or `unreadable` (a scheme
    /// this version does not read, the store failing).
    pub status: &'static str,
    /// How deep the check went (`content`, or `stored` for encrypted objects without an
    /// identity here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checked: Option<Checked>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// One backup.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifiedBackup {
    pub backup_id: String,
    pub backup_name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `ok`, `damaged`, `missing`, `unreadable`, or `brokenChain` (its payloads check out
    /// but an ancestor does not, or is gone).
    pub status: &'static str,
    pub restorable: bool,
    pub payload: Vec<ObjectOut>,
}

/// The binlog archive.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentsOut {
    pub indexed: usize,
    pub checked: usize,
    pub ok: usize,
    /// Every segment that is not `ok`.
    pub problems: Vec<ObjectOut>,
}

/// What `verify --output json` prints.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyOut {
    pub format_version: u32,
    pub store: String,
    pub cluster: String,
    pub sample: f64,
    pub backups: Vec<VerifiedBackup>,
    pub segments: SegmentsOut,
    pub recovery_window: Option<RecoveryWindow>,
    /// `metadata.json` files that cannot be read: whatever they describe cannot be
    /// restored by this version.
    pub malformed: Vec<tidemark_store::Malformed>,
    /// Backups, segments and malformed files that are not `ok`.
    pub problems: usize,
}

fn outcome(key: String, r: Result<Checked, TransferError>) -> ObjectOut {
    let (status, checked, problem) = match r {
        Ok(c) => ("ok", Some(c), None),
        Err(e) => {
            let status = match &e {
                TransferError::MissingPayload { .. } | TransferError::MissingSegment { .. } => {
                    "missing"
                }
                TransferError::Checksum { .. } | TransferError::Content { .. } => "damaged",
                _ => "unreadable",
            };
            (status, None, Some(tidemark_engine::error::chain(&e)))
        }
    };
    ObjectOut {
        key,
        status,
        checked,
        problem,
    }
}

/// Whether to check item `i` of `n` at `fraction`: a fixed random draw per run.
fn drawn(fraction: f64) -> impl FnMut() -> bool {
    move || fraction >= 1.0 || rand::random::<f64>() < fraction
}

pub async fn verify(args: &VerifyArgs) -> Result<Exit, CliError> {
    let target = resolve::store_target(&args.store, args.policy.as_deref())?;
    let store = &target.store;
    let fraction = args.sample.unwrap_or(1.0);
    let mut catalog = Catalog::load(store, &NoProgress).await?;
    // Every shard, so that every segment is known one by one.
    if let Some(index) = &mut catalog.index {
        let keys: Vec<String> = index.unread().map(|s| s.key.clone()).collect();
        index.read_shards(store, keys).await?;
    }
    let inventory = catalog.inventory(&SegmentListing::default());
    let standing = standing(&inventory);

    // The committed backups to read: all, or a sample that always holds the newest
    // completed backup and its chain.
    let mut completed: Vec<&tidemark_store::StoredBackup> = catalog
        .backups
        .iter()
        .filter(|b| b.backup.phase == Phase::Completed && b.metadata.is_some())
        .collect();
    completed.sort_by(|a, b| {
        (a.backup.started_at, &a.backup.id).cmp(&(b.backup.started_at, &b.backup.id))
    });
    let mut always: HashSet<String> = HashSet::new();
    if let Some(newest) = completed.last() {
        for b in tidemark_core::chain_of(&inventory, &newest.backup.id).unwrap_or_default() {
            always.insert(b.id);
        }
    }
    let mut draw = drawn(fraction);
    let chosen: Vec<&tidemark_store::StoredBackup> = completed
        .into_iter()
        .filter(|b| always.contains(&b.backup.id) || draw())
        .collect();

    let checks = chosen.iter().map(|b| async move {
        let mut out = Vec::new();
        for m in b.metadata.iter() {
            for p in &m.payload {
                let key = object_store::path::Path::from_iter([
                    m.backup_name.as_str(),
                    m.backup_id.as_str(),
                    p.name.as_str(),
                ]);
                let r = verify_object(store, &key, p.size, Some(&p.sha256), p.form(), &NoProgress)
                    .await;
                out.push(outcome(store.display_key(&key), r));
            }
        }
        (b, out)
    });
    let checked: Vec<_> = futures::stream::iter(checks)
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let mut backups: Vec<VerifiedBackup> = checked
        .into_iter()
        .map(|(b, payload)| {
            let own = payload
                .iter()
                .map(|o| o.status)
                .find(|s| *s != "ok")
                .unwrap_or("ok");
            let restorable = standing.restorable.contains(&b.backup.id);
            VerifiedBackup {
                backup_id: b.backup.id.clone(),
                backup_name: b.backup.name.clone(),
                kind: crate::output::BackupOut::from_backup(&b.backup).kind,
                status: if own == "ok" && !restorable {
                    "brokenChain"
                } else if payload.is_empty() {
                    "missing"
                } else {
                    own
                },
                restorable,
                payload,
            }
        })
        .collect();
    // A backup whose own payload is fine but an ancestor's is not cannot be restored either.
    let bad: HashSet<String> = backups
        .iter()
        .filter(|b| b.status != "ok")
        .map(|b| b.backup_id.clone())
        .collect();
    for b in &mut backups {
        if b.status == "ok"
            && tidemark_core::chain_of(&inventory, &b.backup_id)
                .unwrap_or_default()
                .iter()
                .any(|a| bad.contains(&a.id))
        {
            b.status = "brokenChain";
            b.restorable = false;
        }
    }

    // The segments.
    let entries: Vec<tidemark_store::format::IndexEntry> = catalog
        .index
        .as_ref()
        .map(|i| i.entries().cloned().collect())
        .unwrap_or_default();
    let indexed = entries.len();
    let mut draw = drawn(fraction);
    let chosen_segments: Vec<_> = entries.into_iter().filter(|_| draw()).collect();
    let segment_checks = chosen_segments.iter().map(|e| async move {
        let r = if layout::is_segment_name(&e.name) {
            let key = layout::segment_key(&e.name);
            verify_object(
                store,
                &key,
                e.size,
                e.sha256.as_deref(),
                e.form(),
                &NoProgress,
            )
            .await
        } else {
            Err(TransferError::InvalidName(e.name.clone()))
        };
        outcome(
            format!("{}/{}/{}", store.cluster, layout::BINLOGS, e.name),
            r,
        )
    });
    let seg_out: Vec<ObjectOut> = futures::stream::iter(segment_checks)
        .buffered(CONCURRENCY * 2)
        .collect()
        .await;
    let ok = seg_out.iter().filter(|o| o.status == "ok").count();
    let segment_problems: Vec<ObjectOut> = seg_out
        .iter()
        .filter(|o| o.status != "ok")
        .cloned()
        .collect();
    let problems = backups.iter().filter(|b| b.status != "ok").count()
        + segment_problems.len()
        + catalog.malformed.len();
    let out = VerifyOut {
        format_version: JSON_FORMAT_VERSION,
        store: store.url.clone(),
        cluster: store.cluster.clone(),
        sample: fraction,
        backups,
        segments: SegmentsOut {
            indexed,
            checked: seg_out.len(),
            ok,
            problems: segment_problems,
        },
        recovery_window: standing.window.clone(),
        malformed: catalog.malformed.clone(),
        problems,
    };
    if args.output == OutputFormat::Json {
        emit_json(&out)?;
    } else {
        emit(&table(store, &out))?;
    }
    Ok(if problems == 0 {
        Exit::Success
    } else {
        Exit::Data
    })
}

fn table(store: &ClusterStore, out: &VerifyOut) -> String {
    let mut s = format!(
        "Verified cluster {:?} in {}{}\n\n",
        store.cluster,
        store.url,
        if out.sample < 1.0 {
            format!(" (a sample of {:.0}%)", out.sample * 100.0)
        } else {
            String::new()
        }
    );
    for b in &out.backups {
        let depth = if b.payload.iter().any(|p| p.checked == Some(Checked::Stored)) {
            " (stored bytes only: encrypted, no identity here)"
        } else {
            ""
        };
        s.push_str(&format!(
            "{:<12} {}  {}  {}{depth}\n",
            b.status, b.backup_id, b.backup_name, b.kind
        ));
        for p in b.payload.iter().filter(|p| p.status != "ok") {
            s.push_str(&format!(
                "             {}: {}\n",
                p.key,
                p.problem.as_deref().unwrap_or(p.status)
            ));
        }
    }
    s.push_str(&format!(
        "\nSegments: {} indexed, {} checked, {} ok\n",
        out.segments.indexed, out.segments.checked, out.segments.ok
    ));
    for m in &out.malformed {
        s.push_str(&format!("{:<12} {}: {}\n", "malformed", m.key, m.problem));
    }
    for p in &out.segments.problems {
        s.push_str(&format!(
            "{:<12} {}: {}\n",
            p.status,
            p.key,
            p.problem.as_deref().unwrap_or("")
        ));
    }
    s.push_str(&format!(
        "Recovery window: {}\n",
        crate::output::window_line(&out.recovery_window)
    ));
    s.push_str(&if out.problems == 0 {
        "Everything checked out.\n".to_owned()
    } else {
        format!("{} problem(s) found.\n", out.problems)
    });
    s
}
