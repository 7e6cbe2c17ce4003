//! What a scheduled backup should be (seed 002): the first backup of a data directory is
//! full, then incrementals on the newest restorable backup of the same data directory,
//! with a full again once its chain holds the maximum number of increments.

use crate::inventory::{Backup, BackupId, Inventory};
use crate::plan::{chain_of, standing};

/// Whether a backup in the store may be an incremental's parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidate {
    /// Same method, same data directory: an incremental can build on it.
    Yes,
    /// Same method, another data directory (InnoDB LSNs are a server's own): it cannot.
    OtherSource,
    /// A failed attempt of this data directory that found the server behind its parent,
    /// or another data directory than its parent's (a rebuilt or restored server): when it
    /// is the newest attempt, a new chain starts.
    Diverged,
    /// Another method, or nothing to build on.
    No,
}

/// The next backup of a data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextBackup {
    /// An incremental on `parent`, whose chain holds `increments` increments before it.
    Incremental { parent: BackupId, increments: usize },
    /// A full, and why.
    Full(FullBecause),
}

/// Why the next backup is a full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FullBecause {
    /// No restorable backup at all to build on: the first of its data directory.
    NoParent,
    /// The newest restorable candidate (named) is of another data directory.
    OtherSource(BackupId),
    /// The newest restorable backup of this data directory (named) ends a chain that holds
    /// `increments` increments, the maximum.
    ChainFull { parent: BackupId, increments: usize },
    /// The newest attempt (named) found the server behind its parent.
    Diverged(BackupId),
}

impl NextBackup {
    /// The parent, for an incremental.
    pub fn parent(&self) -> Option<&BackupId> {
        match self {
            NextBackup::Incremental { parent, .. } => Some(parent),
            NextBackup::Full(_) => None,
        }
    }
}

impl std::fmt::Display for FullBecause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FullBecause::NoParent => {
                f.write_str("there is no restorable backup of this data directory to build on")
            }
            FullBecause::OtherSource(id) => write!(
                f,
                "the newest restorable backup, {id}, is of another data directory (InnoDB LSNs are a server's own)"
            ),
            FullBecause::ChainFull { parent, increments } => write!(
                f,
                "the chain of {parent} holds {increments} increments, the maximum per full"
            ),
            FullBecause::Diverged(id) => write!(
                f,
                "the last attempt, {id}, found the server behind its parent or another data directory than its parent's (a rebuilt or restored server): a new chain starts"
            ),
        }
    }
}

/// What to take next. `candidate` says which backups an incremental could build on;
/// among the restorable ones the newest (by restore point) of the same data directory is
/// the parent, unless its chain already holds `max_increments` increments (none: forever
/// incremental). A synthetic full counts as a full: consolidation restarts the count.
pub fn next_backup(
    inventory: &Inventory,
    candidate: impl Fn(&Backup) -> Candidate,
    max_increments: Option<u32>,
) -> NextBackup {
    let standing = standing(inventory);
    // The server went behind its parent (restored, say): a full, until one restorable
    // backup of this data directory is newer than the divergence — not only until the
    // next attempt, or a failed full would send the schedule back to the old parent,
    // fail there again, and alternate so for ever.
    let newest_diverged = inventory
        .backups
        .iter()
        .filter(|b| candidate(b) == Candidate::Diverged)
        .max_by_key(|b| (b.started_at, b.id.clone()));
    if let Some(d) = newest_diverged {
        let recovered = inventory.backups.iter().any(|b| {
            candidate(b) == Candidate::Yes
                && standing.restorable.contains(&b.id)
                && (b.started_at, &b.id) > (d.started_at, &d.id)
        });
        if !recovered {
            return NextBackup::Full(FullBecause::Diverged(d.id.clone()));
        }
    }
    let newest = |wanted: Candidate| {
        inventory
            .backups
            .iter()
            // One marked for deletion is on its way out: building on it would pin it.
            .filter(|b| !b.deletion_requested)
            .filter(|b| standing.restorable.contains(&b.id) && candidate(b) == wanted)
            .max_by_key(|b| (b.restore_point(), b.id.clone()))
    };
    let Some(parent) = newest(Candidate::Yes) else {
        return NextBackup::Full(match newest(Candidate::OtherSource) {
            Some(other) => FullBecause::OtherSource(other.id.clone()),
            None => FullBecause::NoParent,
        });
    };
    // Restorable, so its chain resolves; the base is the full.
    let increments = chain_of(inventory, &parent.id).map_or(0, |c| c.len().saturating_sub(1));
    match max_increments {
        Some(max) if increments >= max as usize => NextBackup::Full(FullBecause::ChainFull {
            parent: parent.id.clone(),
            increments,
        }),
        _ => NextBackup::Incremental {
            parent: parent.id.clone(),
            increments,
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::inventory::{BackupKind, Phase};
    use jiff::Timestamp;

    fn at(day: u32) -> Timestamp {
        format!("2026-11-{day:02}T02:00:00Z").parse().unwrap()
    }

    fn id(day: u32) -> String {
        format!("202611{day:02}T020000Z-0000000{}", day % 10)
    }

    fn full(day: u32) -> Backup {
        Backup::completed_full(id(day), "nightly", at(day), at(day), 10)
    }

    fn incr(day: u32, parent: u32) -> Backup {
        Backup {
            kind: BackupKind::Incremental(id(parent)),
            ..full(day)
        }
    }

    fn inv(backups: Vec<Backup>) -> Inventory {
        Inventory {
            backups,
            ..Default::default()
        }
    }

    #[test]
    fn the_seeds_full_after_every_three_backups() {
        // F ← I ← I  F ← I ← I  F ← I ← I: at most two increments per full.
        let mut backups = Vec::new();
        let mut kinds = String::new();
        for day in 1..=9 {
            let next = next_backup(&inv(backups.clone()), |_| Candidate::Yes, Some(2));
            backups.push(match &next {
                NextBackup::Full(_) => {
                    kinds.push('F');
                    full(day)
                }
                NextBackup::Incremental { parent, .. } => {
                    kinds.push('I');
                    assert_eq!(parent, &id(day - 1));
                    incr(day, day - 1)
                }
            });
        }
        assert_eq!(kinds, "FIIFIIFII");
    }

    #[test]
    fn forever_incremental_and_why_a_full() {
        let chain = vec![full(1), incr(2, 1), incr(3, 2)];
        assert_eq!(
            next_backup(&inv(chain.clone()), |_| Candidate::Yes, None),
            NextBackup::Incremental {
                parent: id(3),
                increments: 2
            }
        );
        assert_eq!(
            next_backup(&inv(chain.clone()), |_| Candidate::Yes, Some(2)),
            NextBackup::Full(FullBecause::ChainFull {
                parent: id(3),
                increments: 2
            })
        );
        assert_eq!(
            next_backup(&inv(vec![]), |_| Candidate::Yes, None),
            NextBackup::Full(FullBecause::NoParent)
        );
        assert_eq!(
            next_backup(&inv(chain.clone()), |_| Candidate::OtherSource, None),
            NextBackup::Full(FullBecause::OtherSource(id(3)))
        );
        assert_eq!(
            next_backup(&inv(chain.clone()), |_| Candidate::No, None),
            NextBackup::Full(FullBecause::NoParent)
        );
        // The newest of this data directory, even when another server's is newer.
        let mut mixed = chain;
        mixed.push(full(4));
        let ours = |b: &Backup| {
            if b.id == id(4) {
                Candidate::OtherSource
            } else {
                Candidate::Yes
            }
        };
        assert_eq!(next_backup(&inv(mixed), ours, None).parent(), Some(&id(3)));
    }

    #[test]
    fn a_server_behind_its_parent_starts_a_new_chain() {
        let chain = vec![
            full(1),
            incr(2, 1),
            Backup {
                phase: Phase::Failed,
                ..incr(3, 2)
            },
        ];
        let diverged = |b: &Backup| {
            if b.id == id(3) {
                Candidate::Diverged
            } else {
                Candidate::Yes
            }
        };
        assert_eq!(
            next_backup(&inv(chain.clone()), diverged, None),
            NextBackup::Full(FullBecause::Diverged(id(3)))
        );
        // A full that failed does not end it: the old parent is still behind the server
        // (before, the schedule went back to it, failed there, and alternated).
        let mut failed_full = chain.clone();
        failed_full.push(Backup {
            phase: Phase::Failed,
            ..full(4)
        });
        assert_eq!(
            next_backup(&inv(failed_full.clone()), diverged, None),
            NextBackup::Full(FullBecause::Diverged(id(3)))
        );
        // Once a newer restorable backup exists (the new chain's full), incrementals
        // resume on it.
        let mut resumed = failed_full;
        resumed.push(full(5));
        assert_eq!(
            next_backup(&inv(resumed), diverged, None).parent(),
            Some(&id(5))
        );
    }

    #[test]
    fn only_restorable_parents_and_synthetic_fulls_restart_the_count() {
        // The newest failed: the parent is the one before it.
        let failed = Backup {
            phase: Phase::Failed,
            ..incr(3, 2)
        };
        assert_eq!(
            next_backup(
                &inv(vec![full(1), incr(2, 1), failed]),
                |_| Candidate::Yes,
                None
            )
            .parent(),
            Some(&id(2))
        );
        // One marked for deletion is no parent: building on it would pin it.
        let marked = Backup {
            deletion_requested: true,
            ..incr(3, 2)
        };
        assert_eq!(
            next_backup(
                &inv(vec![full(1), incr(2, 1), marked]),
                |_| Candidate::Yes,
                None
            )
            .parent(),
            Some(&id(2))
        );
        // A broken chain (its base gone) is not restorable: a full.
        assert_eq!(
            next_backup(&inv(vec![incr(2, 1), incr(3, 2)]), |_| Candidate::Yes, None),
            NextBackup::Full(FullBecause::NoParent)
        );
        // Days 1–3 consolidated into a synthetic full standing in for day 3: day 4 built on
        // day 3 is one increment into a new chain.
        let synthetic = Backup {
            consolidated_from: vec![id(1), id(2), id(3)],
            ..full(3)
        };
        let synthetic = Backup {
            id: "20261103T030000Z-0000000s".into(),
            started_at: at(3) + jiff::SignedDuration::from_hours(1),
            ..synthetic
        };
        assert_eq!(
            next_backup(
                &inv(vec![synthetic, incr(4, 3)]),
                |_| Candidate::Yes,
                Some(1)
            ),
            NextBackup::Full(FullBecause::ChainFull {
                parent: id(4),
                increments: 1
            })
        );
    }
}
