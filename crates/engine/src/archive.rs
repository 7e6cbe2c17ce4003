//! Binlog archiving: one pass — the closed binlog files of a server archived as segments,
//! indexed, a new timeline started on a failover — and the archive's lag behind the
//! server, for `tidemark archive-binlogs` (from a binlog index or a remote server's
//! spool) and `tidemark run`'s binlog task (the operator's archiver runs the former).

use std::path::Path;

use tidemark_mariadb::archive::{ArchiveReport, LagAlarm, Primary, archive_pass_as};
use tidemark_mariadb::remote::RemoteServer;
use tidemark_store::{ClusterStore, NoProgress};

use crate::error::EngineError;

/// Where the binlog files come from.
#[derive(Debug, Clone, Copy)]
pub enum BinlogSource<'a> {
    /// The server's own binlog index file (the files beside it), and which server may
    /// start a timeline.
    Index(&'a Path, Primary),
    /// Files a replica client fetched from a remote server into its spool.
    Remote(&'a RemoteServer),
}

/// A watching archiver: its passes, and whether the archive is behind the server.
#[derive(Debug, Clone)]
pub struct Archiver {
    alarm: LagAlarm,
    /// How far the archive may fall behind before [`Archived::lag`] says so.
    pub max_lag: jiff::SignedDuration,
}

/// What one pass did, and the lag it changed.
#[derive(Debug)]
pub struct Archived {
    pub report: ArchiveReport,
    /// When the archive crossed `max_lag` with this pass: `(true, message)` now behind,
    /// `(false, message)` caught up again.
    pub lag: Option<(bool, String)>,
}

impl Archiver {
    pub fn new(max_lag: jiff::SignedDuration) -> Self {
        Archiver {
            alarm: LagAlarm::default(),
            max_lag,
        }
    }

    /// Archives what `source` holds that the archive lacks.
    ///
    /// # Guarantees
    /// Deletes nothing of the archive; a remote server's spool files go only once they
    /// are archived and indexed.
    ///
    /// # Errors
    /// The source cannot be read (its index, a binlog), the store failed, or another
    /// archiver holds a sequence or a timeline.
    pub async fn pass(
        &mut self,
        store: &ClusterStore,
        source: BinlogSource<'_>,
    ) -> Result<Archived, EngineError> {
        let report = match source {
            BinlogSource::Index(index, primary) => {
                archive_pass_as(store, index, primary, &NoProgress).await?
            }
            BinlogSource::Remote(server) => server.ship(store, &NoProgress).await?,
        };
        let lag = self.alarm.observe(&report, self.max_lag);
        Ok(Archived { report, lag })
    }
}
