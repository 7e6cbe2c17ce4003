//! The server's binlogs purged only once archived (issue 45 §4): `PURGE BINARY LOGS TO` the
//! newest file whose every transaction the store holds, indexed with its checksum and
//! present with its recorded size — never further, whatever the disk says — and no file
//! whose transactions are younger than `keep` (unless the disk limit is passed). A primary
//! and a replica follow the same rule: a file's transactions are found by GTID, not by name.

use jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use tidemark_core::gtid::{GtidPos, GtidRun, history_holds};
use tidemark_core::timeline::timeline_of;
use tidemark_store::ClusterStore;
use tidemark_store::format::IndexEntry;
use tidemark_store::index::SegmentIndex;

use crate::remote::{RemoteError, RemoteServer};

/// How the server's binlogs are purged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgePolicy {
    /// Files whose transactions are younger than this stay on the server, archived or not.
    pub keep: SignedDuration,
    /// Past this many bytes of binlogs, `keep` yields (the archive never does); from 80 %
    /// of it with files not archived, the point in time is at risk.
    pub max_disk: Option<u64>,
}

/// Index entries whose object is checked (a HEAD each) in one purge at most: a purge
/// goes no further than what it checked, and the next one continues.
pub const MAX_CHECKS: usize = 1000;

/// `PURGE BINARY LOGS TO` tries in one purge while a reader holds a file before the target.
const PURGE_ATTEMPTS: usize = 4;

/// What one purge found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PurgeReport {
    /// `PURGE BINARY LOGS TO` this file (it stays; those before it went).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purged_to: Option<String>,
    /// The files removed.
    pub purged: Vec<String>,
    /// Bytes of binlogs on the server before and after.
    pub disk_bytes: u64,
    pub disk_bytes_after: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_disk: Option<u64>,
    /// Why no further file was purged (the first closed file kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_because: Option<String>,
    /// The disk limit nears (80 %) and closed files are not archived: the database's disk
    /// may fill, and nothing of them may be purged.
    pub point_in_time_at_risk: bool,
}

/// The history the archive holds for its newest timeline, oldest first: each ancestor's
/// entries up to where its child left it (runs clipped at the switch: what the parent wrote
/// after it is a branch, not this history), then the newest timeline's own; and the
/// position before the first of them that is taken as held — the earliest entry's
/// `Gtid_list` (what preceded the archive, or entries the index keeps in shards not read).
/// A switch that misses transactions ends the lineage there, and the domains it misses
/// are not taken as held before it; one that joins nothing (`unrelated`) takes nothing as
/// held before the timeline's first entry. A server's file is purged only once its
/// transactions are in this history, so after a failover the new primary's older files
/// are matched to the old primary's archive.
pub fn lineage(
    timelines: &[tidemark_core::Timeline],
    entries: &[IndexEntry],
) -> (GtidPos, Vec<IndexEntry>) {
    let newest = timelines.iter().map(|t| t.id).max().unwrap_or_else(|| {
        entries
            .iter()
            .map(|e| timeline_of(e.sequence))
            .max()
            .unwrap_or(0)
    });
    // (timeline, the switch its child left it at), newest first.
    let mut chain: Vec<(u32, Option<&tidemark_core::timeline::Switch>)> = vec![(newest, None)];
    let mut untrusted: Option<Option<Vec<u32>>> = None; // Some(None): every domain
    let mut at = newest;
    let mut visited = std::collections::HashSet::from([newest]);
    while let Some(t) = timelines.iter().find(|t| t.id == at) {
        let (Some(parent), Some(sw)) = (t.parent, &t.switch) else {
            break;
        };
        if sw.unrelated {
            untrusted = Some(None);
            break;
        }
        if !sw.missing.is_empty() {
            untrusted = Some(Some(sw.missing.iter().map(|r| r.domain).collect()));
            break;
        }
        if !visited.insert(parent) {
            break; // a loop of parents (a forged index): the lineage ends here
        }
        chain.push((parent, Some(sw)));
        at = parent;
    }
    let mut out: Vec<IndexEntry> = Vec::new();
    for (id, switch) in chain.into_iter().rev() {
        let mut mine: Vec<IndexEntry> = entries
            .iter()
            .filter(|e| timeline_of(e.sequence) == id)
            .cloned()
            .collect();
        mine.sort_by_key(|e| e.sequence);
        let Some(sw) = switch else {
            out.extend(mine);
            continue;
        };
        for mut e in mine {
            if sw.parent_sequence.is_some_and(|s| e.sequence > s) {
                break;
            }
            let clipped: Vec<GtidRun> = e
                .gtids
                .iter()
                .filter_map(|r| {
                    let end = sw.gtid.seq(r.domain);
                    (r.first <= end).then_some(GtidRun {
                        last: r.last.min(end),
                        ..*r
                    })
                })
                .collect();
            if !e.gtids.is_empty() && clipped.is_empty() {
                break;
            }
            let cut = clipped != e.gtids;
            e.gtids = clipped;
            out.push(e);
            if cut {
                break;
            }
        }
    }
    // Entries from before the index recorded positions cannot be chained: the history
    // begins at the first that says where it starts.
    let first = out
        .iter()
        .position(|e| e.gtid_list.is_some())
        .unwrap_or(out.len());
    out.drain(..first);
    let base = out
        .first()
        .and_then(|e| e.gtid_list.clone())
        .unwrap_or_default();
    let base = match untrusted {
        None => base,
        Some(None) => GtidPos::default(),
        Some(Some(domains)) => {
            GtidPos::from_state(base.gtids().filter(|g| !domains.contains(&g.domain)))
        }
    };
    (base, out)
}

/// How many of `entries` (a lineage, oldest first, from `base`) a server whose oldest file
/// starts at `oldest` may rely on: every entry holding a transaction the server still has
/// must start where the history before it holds, or where the server's files begin. A
/// hole — files purged before they were archived — ends it for a server that still holds
/// what is missing (a replica), and not for one whose files begin after it.
pub fn chained(base: &GtidPos, entries: &[IndexEntry], oldest: &GtidPos) -> usize {
    let mut runs: Vec<GtidRun> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let on_server = e.gtids.iter().any(|r| r.last > oldest.seq(r.domain));
        if i > 0
            && on_server
            && !e.gtid_list.as_ref().is_some_and(|start| {
                history_holds(base, &runs, start) || history_holds(oldest, &[], start)
            })
        {
            return i;
        }
        runs.extend(e.gtids.iter().copied());
    }
    entries.len()
}

impl RemoteServer {
    /// The server's binlog files and their sizes, oldest first.
    ///
    /// # Errors
    /// `mariadb` cannot run or fails; the server has no binlogs.
    pub async fn binary_logs(&self) -> Result<Vec<(String, u64)>, RemoteError> {
        let answer = self.query("SHOW BINARY LOGS").await?;
        let files: Vec<(String, u64)> = answer
            .lines()
            .filter_map(|l| {
                let mut cols = l.split('\t');
                let name = cols.next()?.trim();
                let size = cols.next()?.trim().parse().ok()?;
                tidemark_store::layout::is_segment_name(name).then(|| (name.to_owned(), size))
            })
            .collect();
        if files.is_empty() {
            return Err(RemoteError::NoBinlogs);
        }
        Ok(files)
    }

    /// Purges the server's binlogs the archive holds, as `policy` allows.
    ///
    /// # Guarantees
    /// Never purges a file with a transaction the archive's newest timeline does not hold
    /// in entries that have a checksum and whose objects are present with their size;
    /// never the file being written; never past a file whose start position cannot be
    /// read.
    ///
    /// # Errors
    /// The server or the store cannot be read; [`RemoteError::Unfit`] when the account lacks
    /// `BINLOG ADMIN` (or the server a setting archiving needs).
    pub async fn purge(
        &self,
        store: &ClusterStore,
        policy: PurgePolicy,
        now: Timestamp,
    ) -> Result<PurgeReport, RemoteError> {
        self.check(true).await?;
        let files = self.binary_logs().await?;
        let disk: u64 = files.iter().map(|(_, s)| s).sum();
        let mut report = PurgeReport {
            disk_bytes: disk,
            disk_bytes_after: disk,
            max_disk: policy.max_disk,
            ..PurgeReport::default()
        };
        let over = policy.max_disk.is_some_and(|m| disk > m);
        let near = policy
            .max_disk
            .is_some_and(|m| disk.saturating_mul(5) >= m.saturating_mul(4));
        // A store that cannot be read holds nothing verified: nothing is purged, and the
        // disk is watched all the same.
        let index = match SegmentIndex::load(store).await {
            Ok(i) => i,
            Err(e) => {
                report.point_in_time_at_risk = near && files.len() > 1;
                report.kept_because = Some(format!("the store cannot be read: {e}"));
                return Ok(report);
            }
        };
        // The verified history: the newest timeline's lineage, each entry with a checksum
        // and (for those the server's files still hold) present with its size.
        let (base, entries) = match &index {
            Some(i) => {
                let all: Vec<IndexEntry> = i.entries().cloned().collect();
                lineage(&i.head.timelines, &all)
            }
            None => (GtidPos::default(), Vec::new()),
        };
        let oldest_start = self.start_of(&files[0].0).await?;
        let mut verified: Vec<&IndexEntry> = Vec::new();
        let mut checks = 0;
        for e in &entries[..chained(&base, &entries, &oldest_start)] {
            if e.sha256.is_none() {
                break;
            }
            let still_on_server = e.gtids.iter().any(|r| r.last > oldest_start.seq(r.domain));
            if still_on_server {
                if checks == MAX_CHECKS {
                    break;
                }
                checks += 1;
                let present = store
                    .head(&tidemark_store::layout::segment_key(&e.name))
                    .await
                    .map_err(|e| RemoteError::Archive(e.into()))?;
                if present.is_none_or(|m| m.size != e.size) {
                    break;
                }
            }
            verified.push(e);
        }
        let runs: Vec<GtidRun> = verified
            .iter()
            .flat_map(|e| e.gtids.iter().copied())
            .collect();
        // The newest k (never the last, being written) whose start the verified history
        // holds: every transaction before it is archived.
        let mut target: Option<usize> = None;
        let mut why: Option<String> = None;
        for k in 1..files.len() {
            let name = &files[k].0;
            let start = self.start_of(name).await?;
            // Files before it holding no transaction at all (a server's first rotations)
            // keep nothing worth keeping.
            let empty_before = start == oldest_start;
            if !empty_before && (entries.is_empty() || !history_holds(&base, &runs, &start)) {
                why = Some(format!(
                    "{} holds transactions the archive has not verified yet",
                    files[k - 1].0
                ));
                break;
            }
            // When the last transaction before it was written, at the latest: the newest
            // event of the verified entries holding any transaction before it.
            let last_before = verified
                .iter()
                .filter(|e| e.gtids.iter().any(|r| r.first <= start.seq(r.domain)))
                .filter_map(|e| e.last_event_at)
                .max();
            let young = !empty_before && last_before.is_none_or(|t| t > now - policy.keep);
            if young && !over {
                why = Some(format!(
                    "{} is younger than keep ({})",
                    files[k - 1].0,
                    jiff::Span::try_from(policy.keep)
                        .map_or_else(|_| policy.keep.to_string(), |s| format!("{s:#}"))
                ));
                break;
            }
            target = Some(k);
        }
        report.point_in_time_at_risk = near && target.map_or(1, |k| k + 1) < files.len();
        report.kept_because = why;
        let Some(k) = target else {
            return Ok(report);
        };
        let to = files[k].0.clone();
        // A file a reader still holds (a replica's dump thread, this archiver's own reader
        // whose connection is closing) is skipped by the server without an error: tried
        // again a moment later, then left to the next pass.
        let mut after = Vec::new();
        for attempt in 0..PURGE_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
            self.query(&format!("PURGE BINARY LOGS TO '{to}'")).await?;
            after = self.binary_logs().await?;
            if !after
                .iter()
                .any(|(n, _)| files[..k].iter().any(|(f, _)| f == n))
            {
                break;
            }
        }
        if let Some((held, _)) = after
            .iter()
            .find(|(n, _)| files[..k].iter().any(|(f, _)| f == n))
        {
            report.kept_because = Some(format!(
                "{held} is in use by a reader (a replica, or a binlog reader closing): the next pass purges it"
            ));
        }
        report.disk_bytes_after = after.iter().map(|(_, s)| s).sum();
        report.purged = files
            .iter()
            .map(|(n, _)| n)
            .filter(|n| !after.iter().any(|(a, _)| a == *n))
            .cloned()
            .collect();
        report.purged_to = Some(to);
        Ok(report)
    }

    /// The GTID position at the start of the server's file `name`.
    async fn start_of(&self, name: &str) -> Result<GtidPos, RemoteError> {
        if !tidemark_store::layout::is_segment_name(name) {
            return Err(RemoteError::Answer {
                query: "SHOW BINARY LOGS".into(),
                answer: name.chars().take(64).collect(),
            });
        }
        let query = format!("SELECT BINLOG_GTID_POS('{name}', 4)");
        let answer = self.query(&query).await?;
        GtidPos::parse(&answer).map_err(|_| RemoteError::Answer { query, answer })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tidemark_core::timeline::{Switch, Timeline, archive_sequence};

    fn entry(timeline: u32, file: u64, server: u32, first: u64, last: u64) -> IndexEntry {
        IndexEntry {
            name: format!("mysql-bin.{file:06}"),
            sequence: archive_sequence(timeline, file).unwrap(),
            first_event_at: None,
            last_event_at: None,
            size: 1,
            sha256: Some("00".into()),
            compression: None,
            encryption: None,
            server_id: Some(server),
            file: None,
            gtid_list: GtidPos::parse(&format!("0-{server}-{}", first - 1)).ok(),
            previous_gtids: None,
            gtid_set: None,
            gtids: vec![GtidRun {
                domain: 0,
                server,
                first,
                last,
            }],
        }
    }

    /// A hole in the archive (files purged before they were archived) ends the verified
    /// history: what comes after it is not taken to hold what the hole lacks.
    #[test]
    fn a_hole_ends_the_chain() {
        let mut first = entry(0, 1, 1, 1, 5);
        first.gtid_list = Some(GtidPos::parse("0-1-0").unwrap());
        let whole = vec![first.clone(), entry(0, 2, 1, 6, 10), entry(0, 3, 1, 11, 15)];
        let base = first.gtid_list.clone().unwrap();
        let pos = |s: &str| GtidPos::parse(s).unwrap();
        assert_eq!(chained(&base, &whole, &pos("0-1-0")), 3);
        // 0-1-11..15 purged by the server before it was archived: 16..20 follows a hole.
        let holed = vec![first.clone(), entry(0, 2, 1, 6, 10), entry(0, 4, 1, 16, 20)];
        // A replica still holding 11..15 (its files begin at 0-1-10): not past the hole.
        assert_eq!(chained(&base, &holed, &pos("0-1-10")), 2);
        // The server whose files begin after the hole: the hole is none of its business.
        assert_eq!(chained(&base, &holed, &pos("0-1-15")), 3);
        // An entry that does not say where it starts cannot be chained.
        let mut unknown = entry(0, 2, 1, 6, 10);
        unknown.gtid_list = None;
        assert_eq!(chained(&base, &[first, unknown], &pos("0-1-0")), 1);
    }

    /// After a failover the new primary's history is the old primary's archive up to the
    /// switch, then its own: what the old primary wrote after the switch (a branch) is not
    /// in it, and a switch that misses transactions takes nothing before it as held.
    #[test]
    fn the_lineage_follows_the_switch() {
        let pos = |s: &str| GtidPos::parse(s).unwrap();
        let t0 = Timeline {
            server_id: Some(1),
            ..Timeline::legacy()
        };
        let t1 = |missing: Vec<GtidRun>| Timeline {
            id: 1,
            server_id: Some(2),
            parent: Some(0),
            first_sequence: archive_sequence(1, 7),
            switch: Some(Switch {
                gtid: pos("0-1-10"),
                at: None,
                parent_sequence: archive_sequence(0, 2),
                missing,
                unrelated: false,
            }),
            created_at: None,
        };
        let mut first = entry(0, 1, 1, 1, 5);
        first.gtid_list = Some(pos("0-1-0"));
        let entries = vec![
            first,
            entry(0, 2, 1, 6, 12), // 11 and 12: the old primary's branch
            entry(0, 3, 1, 13, 15),
            entry(1, 7, 2, 11, 20),
        ];
        let (base, history) = lineage(&[t0.clone(), t1(Vec::new())], &entries);
        let names: Vec<(u64, u64)> = history
            .iter()
            .map(|e| (e.gtids[0].first, e.gtids[0].last))
            .collect();
        assert_eq!(names, [(1, 5), (6, 10), (11, 20)]);
        let runs: Vec<GtidRun> = history.iter().flat_map(|e| e.gtids.clone()).collect();
        assert!(history_holds(&base, &runs, &pos("0-1-8")));
        assert!(history_holds(&base, &runs, &pos("0-2-15")));
        assert!(!history_holds(&base, &runs, &pos("0-1-12")), "the branch");
        assert!(!history_holds(&base, &runs, &pos("0-2-21")));
        // A switch missing transaction 0-1-11: the new timeline alone, nothing before it.
        let missing = GtidRun {
            domain: 0,
            server: 1,
            first: 11,
            last: 11,
        };
        let (base, history) = lineage(&[t0, t1(vec![missing])], &entries);
        assert_eq!(history.len(), 1);
        let runs: Vec<GtidRun> = history.iter().flat_map(|e| e.gtids.clone()).collect();
        assert!(!history_holds(&base, &runs, &pos("0-1-8")));
        assert!(history_holds(&base, &runs, &pos("0-2-15")));
    }
}
