//! Writes the example store committed under `examples/store/`:
//!
//!     cargo run -p tidemark-store --example make-example-store -- examples/store
//!
//! Cluster `demo`: three weeks of nightly backups (a full every Sunday, incrementals on
//! the other days), one failed attempt, binlog segments every four hours (one with an
//! unknown last-event time), and one foreign file. Deterministic: the same bytes each run.

use jiff::{SignedDuration, Timestamp};
use tidemark_store::synth::{self, SynthBackup};
use tidemark_store::{ClusterStore, StoreOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: make-example-store DIR"))?;
    std::fs::create_dir_all(&dir)?;
    let dir = std::fs::canonicalize(&dir)?;
    if dir.join("demo").exists() {
        anyhow::bail!(
            "{} already holds a demo cluster; remove it first",
            dir.display()
        );
    }
    let store = ClusterStore::open(
        &format!("file://{}", dir.display()),
        "demo",
        &StoreOptions::default(),
    )?;

    // Sunday 1 November 2026 02:00 UTC.
    let first: Timestamp = "2026-11-01T02:00:00Z".parse()?;
    let day = SignedDuration::from_hours(24);
    let mut backups: Vec<SynthBackup> = Vec::new();
    for d in 0..20u32 {
        let at = first + day * (d as i32);
        let b = if d % 7 == 0 {
            SynthBackup::full("nightly", at, 0x1000 + d)
        } else {
            let parent = backups
                .iter()
                .rev()
                .find(|b| !b.failed)
                .map(|b| b.id.clone());
            SynthBackup::incremental("nightly", &parent.unwrap_or_default(), at, 0x1000 + d)
        };
        backups.push(b);
        if d == 12 {
            // A nightly run that failed halfway; the next increment builds on day 11.
            let mut failed = SynthBackup::incremental(
                "nightly",
                &backups[backups.len() - 1].id,
                at + SignedDuration::from_hours(3),
                0x2000,
            );
            failed.failed = true;
            backups.push(failed);
        }
    }
    // A manual full taken before an upgrade, on hold.
    let mut manual = SynthBackup::full(
        "pre-upgrade",
        first + day * 4 + SignedDuration::from_hours(9),
        0x3000,
    );
    manual
        .labels
        .push(("tidemark.io/protect".into(), "true".into()));
    backups.push(manual);
    synth::write_backups(&store, &backups).await?;

    let mut segments = synth::segments(
        "mysql-bin",
        1,
        20 * 6,
        first - SignedDuration::from_hours(2),
        SignedDuration::from_hours(4),
    );
    segments[3].last_event_at = None;
    synth::write_segments(&store, &segments).await?;
    synth::write_index(&store, &segments).await?;
    synth::write_raw(
        &store,
        "NOTES.txt",
        b"Left here by a person: Tidemark reports it and never deletes it.\n",
    )
    .await?;
    println!(
        "wrote {} backups and {} segments to {}/demo",
        backups.len(),
        segments.len(),
        dir.display()
    );
    Ok(())
}
