//! What the next backup builds on (seed 002) — one use case for every edge, which passes
//! what it knows: `tidemark run` the schedule, the operator the data volume, `push
//! --parent` the id a person named.

use tidemark_core::{Candidate, FullBecause, NextBackup, next_backup};
use tidemark_store::catalog::Catalog;
use tidemark_store::format::{Metadata, MetadataPhase};
use tidemark_store::transfer::{self, TransferError};
use tidemark_store::{ClusterStore, StoreError};

/// Which earlier backups an incremental may build on: `mariabackup` backups labelled
/// `label: value` (a schedule, a data volume).
#[derive(Debug, Clone, Copy)]
pub struct ParentLineage<'a> {
    pub label: &'a str,
    pub value: &'a str,
    /// What a `mariabackup` backup with another value is: another data directory, whose
    /// newer backup means a new full (the operator's volumes), or only another lineage
    /// of the same one, ignored (`tidemark run`'s schedules of one server).
    pub others_are_other_sources: bool,
}

impl ParentLineage<'_> {
    fn candidate(&self, m: &Metadata) -> Candidate {
        if m.method != tidemark_mariadb::METHOD {
            return Candidate::No;
        }
        let same = m.labels.get(self.label).map(String::as_str) == Some(self.value);
        let diverged = m
            .error
            .as_deref()
            .is_some_and(tidemark_mariadb::is_lsn_behind);
        match (same, diverged) {
            (true, true) => Candidate::Diverged,
            (true, false) => Candidate::Yes,
            (false, _) if self.others_are_other_sources => Candidate::OtherSource,
            (false, _) => Candidate::No,
        }
    }
}

/// The parent of the next backup of `lineage`: the newest restorable backup of it, unless
/// its chain holds `max_increments` increments (`None`: forever incremental); `Err` says
/// why the next one is a full.
pub fn next_parent<'c>(
    catalog: &'c Catalog,
    lineage: &ParentLineage<'_>,
    max_increments: Option<u32>,
) -> Result<&'c Metadata, FullBecause> {
    let metadata: std::collections::HashMap<&str, &Metadata> = catalog
        .backups
        .iter()
        .filter_map(|c| Some((c.backup.id.as_str(), c.metadata.as_ref()?)))
        .collect();
    let next = next_backup(
        &catalog.inventory(&Default::default()),
        |b| {
            metadata
                .get(b.id.as_str())
                .map_or(Candidate::No, |m| lineage.candidate(m))
        },
        max_increments,
    );
    match next {
        NextBackup::Incremental { parent, .. } => metadata
            .get(parent.as_str())
            .copied()
            .ok_or(FullBecause::NoParent),
        NextBackup::Full(why) => Err(why),
    }
}

/// Why a named parent cannot be built on.
#[derive(Debug, thiserror::Error)]
pub enum NamedParentError {
    #[error("{id}: no committed backup with this id in {url} (cluster {cluster})")]
    NotFound {
        id: String,
        url: String,
        cluster: String,
    },
    #[error("{id} is a failed backup; an incremental needs a completed parent")]
    NotCompleted { id: String },
    #[error(transparent)]
    Transfer(TransferError),
}

/// The backup `id` a person named as the parent: committed and completed.
///
/// # Errors
/// Not in the store, not completed, or the store failed.
pub async fn named_parent(store: &ClusterStore, id: &str) -> Result<Metadata, NamedParentError> {
    let p = transfer::find_backup(store, None, id)
        .await
        .map_err(|e| match e {
            TransferError::NotFound { .. } => NamedParentError::NotFound {
                id: id.to_owned(),
                url: store.url.clone(),
                cluster: store.cluster.clone(),
            },
            other => NamedParentError::Transfer(other),
        })?;
    if p.phase != MetadataPhase::Completed {
        return Err(NamedParentError::NotCompleted { id: id.to_owned() });
    }
    Ok(p)
}

/// The parent of the next backup of `lineage`, from a fresh listing of `store` (the
/// backups' records only).
///
/// # Errors
/// The store failed.
pub async fn load_next_parent(
    store: &ClusterStore,
    lineage: &ParentLineage<'_>,
    max_increments: Option<u32>,
) -> Result<Result<Metadata, FullBecause>, StoreError> {
    let catalog = Catalog::load_backups(store, &tidemark_store::NoProgress).await?;
    Ok(next_parent(&catalog, lineage, max_increments).cloned())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use jiff::{SignedDuration, Timestamp};
    use tidemark_store::open::Backend;
    use tidemark_store::synth::{self, SynthBackup};

    use super::*;

    fn at(hours: i64) -> Timestamp {
        Timestamp::from_second(1_795_000_000).unwrap() + SignedDuration::from_hours(hours)
    }

    fn ours(b: SynthBackup, label: &str) -> SynthBackup {
        SynthBackup {
            method: "mariabackup".into(),
            labels: vec![("l".into(), label.into())],
            ..b
        }
    }

    async fn store_with(backups: &[SynthBackup]) -> ClusterStore {
        let inner = Arc::new(object_store::memory::InMemory::new());
        let store = ClusterStore::from_object_store(inner, "c", Backend::Memory).unwrap();
        synth::write_backups(&store, backups).await.unwrap();
        store
    }

    fn lineage(value: &str, others_are_other_sources: bool) -> ParentLineage<'_> {
        ParentLineage {
            label: "l",
            value,
            others_are_other_sources,
        }
    }

    /// Each edge's rule, as a table: which backup the next one builds on, or why a full.
    #[tokio::test]
    async fn the_parent_is_the_newest_restorable_backup_of_the_lineage() {
        let a = ours(SynthBackup::full("a", at(0), 1), "one");
        let a1 = ours(SynthBackup::incremental("a1", &a.id, at(1), 2), "one");
        let b = ours(SynthBackup::full("b", at(2), 3), "two");
        let exec = SynthBackup::full("x", at(3), 4);
        let failed = SynthBackup {
            failed: true,
            ..ours(SynthBackup::full("f", at(4), 5), "one")
        };
        let store = store_with(&[a.clone(), a1.clone(), b.clone(), exec, failed]).await;
        let catalog = Catalog::load_backups(&store, &tidemark_store::NoProgress)
            .await
            .unwrap();
        let cases: [(ParentLineage<'_>, Option<u32>, Result<&str, FullBecause>); 8] = [
            // Its own newest, whatever the others.
            (lineage("one", false), None, Ok(&a1.id)),
            (lineage("one", true), None, Ok(&a1.id)),
            // The operator: nothing of this volume, others' backups say why a full...
            (
                lineage("three", true),
                None,
                Err(FullBecause::OtherSource(b.id.clone())),
            ),
            // ...`tidemark run`: another schedule's backups are not this one's concern.
            (lineage("three", false), None, Err(FullBecause::NoParent)),
            (lineage("two", true), None, Ok(&b.id)),
            // A chain at its maximum starts a new full.
            (
                lineage("one", false),
                Some(1),
                Err(FullBecause::ChainFull {
                    parent: a1.id.clone(),
                    increments: 1,
                }),
            ),
            (lineage("one", false), Some(2), Ok(&a1.id)),
            (lineage("none", false), None, Err(FullBecause::NoParent)),
        ];
        for (lineage, max, want) in cases {
            let got = next_parent(&catalog, &lineage, max).map(|m| m.backup_id.as_str());
            assert_eq!(got, want, "{lineage:?} max {max:?}");
        }
        let loaded = load_next_parent(&store, &lineage("two", true), None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(loaded.backup_id, b.id);
    }

    /// A failed attempt refused for another data directory than its parent's reads as a
    /// divergence of its lineage (the next scheduled backup is a full), as one whose
    /// server was behind its parent does; another failure does not.
    #[test]
    fn an_attempt_of_another_data_directory_is_a_divergence() {
        let refused = tidemark_mariadb::MariaDbError::OtherDataDirectory {
            path: "/var/lib/mysql".into(),
            id: "20261120T020000Z-00000001".into(),
            parent: "ibdata1 made 2026-11-20T01:00:00Z".into(),
            ours: "ibdata1 made 2026-11-20T03:00:00Z".into(),
        };
        let behind = tidemark_mariadb::MariaDbError::LsnBehind {
            from_lsn: 5000,
            to_lsn: 1000,
        };
        let attempt = |error: &str| -> Metadata {
            serde_json::from_value(serde_json::json!({
                "formatVersion": 1, "backupId": "20261120T040000Z-00000002", "backupName": "nightly",
                "cluster": "c", "type": "incremental", "method": "mariabackup", "phase": "failed",
                "startedAt": "2026-11-20T04:00:00Z", "labels": {"l": "one"}, "error": error,
            }))
            .unwrap()
        };
        let l = lineage("one", true);
        // What the attempt records: the source's error, as `push` writes it.
        for e in [
            format!("mariabackup (not started) failed: {refused}"),
            behind.to_string(),
        ] {
            assert_eq!(l.candidate(&attempt(&e)), Candidate::Diverged, "{e}");
        }
        assert_eq!(
            l.candidate(&attempt("mariabackup exited with status 1")),
            Candidate::Yes
        );
    }

    #[tokio::test]
    async fn a_named_parent_is_committed_and_completed() {
        let a = SynthBackup::full("a", at(0), 1);
        let failed = SynthBackup {
            failed: true,
            ..SynthBackup::full("f", at(1), 2)
        };
        let store = store_with(&[a.clone(), failed.clone()]).await;
        assert_eq!(named_parent(&store, &a.id).await.unwrap().backup_id, a.id);
        let missing = synth::backup_id(at(5), 9);
        assert!(matches!(
            named_parent(&store, &missing).await,
            Err(NamedParentError::NotFound { .. })
        ));
        let e = named_parent(&store, &failed.id).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} is a failed backup; an incremental needs a completed parent",
                failed.id
            )
        );
    }
}
