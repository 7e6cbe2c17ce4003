//! The binlog archive, watched: an archive that falls behind the server it reads is loud.
//!
//! The archiver records what it saw at every pass (`_state/archiver.json` in the store: the
//! server's newest event, the newest archived, when). The policy's reconcile reads it every
//! [`EVERY`] and keeps, per policy: the `tidemark_binlog_archive_lag_seconds` metric (what
//! an alert uses), `status.binlogArchive` and the `BinlogArchiveCurrent` condition (written
//! under their own field manager, and only when they change, so the watch does not wake
//! the controller by itself), and a Warning event `BinlogArchiveBehind` when the archive
//! falls behind by more than `spec.binlogArchive.maxLag` — or its archiver stops reporting
//! — and a Normal `BinlogArchiveCaughtUp` when it is back.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tidemark_api::crd::{BackupPolicy, BinlogArchiveStatus};
use tidemark_store::state::ArchiverStatus;

use crate::context::Context;
use crate::status::condition;

pub use crate::status::{
    BINLOG_ARCHIVE_CONDITION as CONDITION, BINLOG_ARCHIVE_MANAGER as MANAGER, MAIN_LINE_CONDITION,
    POINT_IN_TIME_RISK_CONDITION as RISK_CONDITION,
};
/// How often the archive is looked at, at most: every archiver interval, between
/// [`SOONEST`] and this.
pub const EVERY: Duration = Duration::from_secs(30);
/// How often the archive is looked at, at least.
pub const SOONEST: Duration = Duration::from_secs(5);

/// What the watch concludes from the archiver's last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    pub lag: SignedDuration,
    pub behind: bool,
    pub reason: &'static str,
    pub message: String,
    pub status: BinlogArchiveStatus,
}

/// How long after its last pass an archiver counts as stopped: three of its intervals, and
/// never less than a minute (a pass shipping a large file takes a while).
pub fn silent_after(interval: SignedDuration) -> SignedDuration {
    (interval * 3).max(SignedDuration::from_secs(60))
}

/// Judges the archive from its archiver's report at `now`. `None`: no report yet (an
/// archiver that has not finished a pass), nothing to say.
pub fn assess(
    report: Option<&ArchiverStatus>,
    now: Timestamp,
    max_lag: SignedDuration,
    silent_after: SignedDuration,
) -> Option<Assessment> {
    let r = report?;
    let lag = r.lag(now, silent_after);
    let silent = r.silent(now, silent_after);
    let behind = silent || lag > max_lag;
    let server = r
        .server_id
        .map_or_else(|| "the server".to_owned(), |s| format!("server {s}"));
    let (reason, message) = if silent {
        (
            "ArchiverSilent",
            format!(
                "the binlog archiver has not finished a pass since {} (it reads {server}): the archive is {}s behind and falling further",
                r.observed_at,
                lag.as_secs()
            ),
        )
    } else if behind {
        (
            "ArchiveBehind",
            format!(
                "the binlog archive is {}s behind {server} (its newest archived event {}, the server's {}): more than spec.binlogArchive.maxLag {max_lag:#}",
                lag.as_secs(),
                r.archived_last_event_at
                    .map_or_else(|| "none".to_owned(), |t| t.to_string()),
                r.primary_last_event_at
                    .map_or_else(|| "unknown".to_owned(), |t| t.to_string())
            ),
        )
    } else {
        (
            "ArchiveCurrent",
            format!(
                "the binlog archive is {}s behind {server} (within {max_lag:#})",
                lag.as_secs()
            ),
        )
    };
    Some(Assessment {
        lag,
        behind,
        reason,
        message,
        status: BinlogArchiveStatus {
            server_id: r.server_id,
            timeline: Some(r.timeline),
            archived_through: r.archived_last_event_at.map(Time),
            behind,
        },
    })
}

/// What the archiver's last purge says of the point in time (issue 45 §4): `(at risk,
/// reason, message)` for the `PointInTimeAtRisk` condition — at risk while a server's
/// binlogs near `maxDiskUsage` and some are not archived, so none of those is purged and
/// its disk may fill; unknown (`None`) while the purge of the server archived from fails.
pub fn purge_risk(
    p: &tidemark_store::state::BinlogPurgeStatus,
) -> (Option<bool>, &'static str, String) {
    if let Some(e) = &p.error {
        return (
            None,
            "PurgeFailed",
            format!(
                "the server's binlogs could not be purged ({e}): nothing is purged until it can be, and its disk may fill — the login needs BINLOG ADMIN"
            ),
        );
    }
    let one = |s: &tidemark_store::state::BinlogPurgeStatus| {
        let who = s
            .server
            .as_deref()
            .map_or_else(|| "the server".to_owned(), |r| format!("replica {r}"));
        let limit = s
            .max_disk
            .map_or_else(|| "none".to_owned(), |m| format!("{m} bytes"));
        format!(
            "{who} holds {} bytes of binlogs (maxDiskUsage {limit}){}",
            s.disk_bytes,
            s.kept_because
                .as_deref()
                .map(|w| format!(": {w}"))
                .unwrap_or_default()
        )
    };
    let at_risk: Vec<String> = std::iter::once(p)
        .chain(&p.replicas)
        .filter(|s| s.point_in_time_at_risk)
        .map(one)
        .collect();
    if at_risk.is_empty() {
        let failed: Vec<String> = p
            .replicas
            .iter()
            .filter_map(|r| {
                r.error.as_ref().map(|e| {
                    format!(
                        "replica {} not purged: {e}",
                        r.server.as_deref().unwrap_or("?")
                    )
                })
            })
            .collect();
        let mut message = format!(
            "binlogs are purged only once archived; {}",
            std::iter::once(p)
                .chain(&p.replicas)
                .filter(|s| s.error.is_none())
                .map(one)
                .collect::<Vec<_>>()
                .join("; ")
        );
        if !failed.is_empty() {
            message.push_str(&format!(" ({})", failed.join("; ")));
        }
        return (Some(false), "BinlogsArchived", message);
    }
    (
        Some(true),
        "DiskNearsLimitUnarchived",
        format!(
            "point in time at risk: {}. None of what the archive lacks is purged, and the database's disk may fill: bring the archive back (BinlogArchiveCurrent), or give the server room",
            at_risk.join("; ")
        ),
    )
}

/// A timeline whose switch lies before the end of its parent's archive: the parent's
/// segments after the switch are a branch (an old primary's last writes, or — should a
/// server have lied its way to a new timeline — the real primary's), or the switch misses
/// transactions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EarlySwitch {
    pub timeline: u32,
    pub message: String,
}

/// Where a timeline's archive ends: its last segment's sequence, and the GTID position after
/// it when the index says (an entry of the head; a shard's summary does not).
pub type ArchiveEnd = (u64, Option<tidemark_core::GtidPos>);

/// The timelines of `timelines` whose switch lies before the archive's end — the parent
/// holds a segment after the one holding the switch, or transactions after the switch in
/// that very segment — that are not acknowledged (`acknowledged` at or after the switch).
pub fn early_switches(
    timelines: &[tidemark_core::Timeline],
    ends: &std::collections::HashMap<u32, ArchiveEnd>,
    acknowledged: Option<Timestamp>,
) -> Vec<EarlySwitch> {
    let server = |s: Option<u32>| s.map_or_else(|| "unknown".to_owned(), |s| s.to_string());
    let mut out = Vec::new();
    for t in timelines {
        let (Some(parent), Some(sw)) = (t.parent, &t.switch) else {
            continue;
        };
        let parent_end = ends.get(&parent);
        let after_switch = parent_end
            .and_then(|(_, gtids)| gtids.as_ref())
            .is_some_and(|end| !sw.gtid.covers(end));
        let branch = after_switch
            || match (sw.parent_sequence, parent_end) {
                (Some(at), Some((end, _))) => *end > at,
                (None, Some(_)) => true,
                _ => false,
            };
        if !(branch || !sw.missing.is_empty() || sw.unrelated) {
            continue;
        }
        let when = sw.at.or(t.created_at);
        if acknowledged.is_some_and(|a| when.is_some_and(|w| w <= a)) {
            continue;
        }
        let parent_server = timelines
            .iter()
            .find(|p| p.id == parent)
            .and_then(|p| p.server_id);
        out.push(EarlySwitch {
            timeline: t.id,
            message: format!(
                "timeline {} (server {}) left timeline {parent} (server {}) after {}{} before the end of its archive: {}. If server {} is the primary, acknowledge with the annotation tidemark.io/acknowledge-branches (an instant at or after the switch); if it is not, stop what archives it — its history is now the archive's main line",
                t.id,
                server(t.server_id),
                server(parent_server),
                sw.gtid,
                when.map(|w| format!(" ({w})")).unwrap_or_default(),
                if branch {
                    "what the old timeline holds after the switch is a branch, kept for retention.window (or until acknowledged), never replayed"
                } else {
                    "transactions are missing at the switch"
                },
                server(t.server_id),
            ),
        });
    }
    out
}

/// Where each timeline's archive ends, from an index head (its entries and its shard
/// summaries): the highest sequence, with the GTID position after it when an entry of the
/// head gives it.
fn archive_ends(
    head: &tidemark_store::format::IndexFile,
) -> std::collections::HashMap<u32, ArchiveEnd> {
    use tidemark_core::timeline::timeline_of;
    let mut ends: std::collections::HashMap<u32, ArchiveEnd> = std::collections::HashMap::new();
    let seen = head
        .entries
        .iter()
        .map(|e| (e.sequence, e.segment_gtids().map(|g| g.end())))
        .chain(head.shards.iter().map(|s| (s.last_sequence, None)));
    for (q, gtids) in seen {
        match ends.get_mut(&timeline_of(q)) {
            Some(e) if e.0 > q => {}
            Some(e) if e.0 == q => e.1 = e.1.take().or(gtids),
            _ => {
                ends.insert(timeline_of(q), (q, gtids));
            }
        }
    }
    ends
}

/// How long the watch waits for the archiver's report from the store.
const READ_WITHIN: Duration = Duration::from_secs(5);

/// Looks at the archive of `policy` (one with an operator-run archiver): metric, status,
/// condition and events. Returns when to look again; `None` for a policy without one.
/// Trouble reading the store is logged (a store that does not answer within
/// [`READ_WITHIN`] too): the retention pass reports the store's state.
pub async fn check(ctx: &Context, policy: &BackupPolicy) -> Option<Duration> {
    policy
        .spec
        .binlog_archive
        .as_ref()
        .and_then(|a| a.server.as_ref())?;
    let (Ok(max_lag), Ok(interval)) = (policy.spec.binlog_max_lag(), policy.spec.binlog_interval())
    else {
        return Some(EVERY); // an invalid spec is reported by the pass
    };
    let every = Duration::try_from(interval)
        .unwrap_or(EVERY)
        .clamp(SOONEST, EVERY);
    let name = policy.name_any();
    // Read in the reconcile itself: a store that does not answer (cut off) holds it for
    // [`READ_WITHIN`] at most, not a request timeout, and the retention pass and the next
    // reconciles of the policy go on.
    let read = async {
        let store = crate::stores::open(ctx, policy)
            .await
            .map_err(|e| format!("store not open: {e}"))?;
        let report = tidemark_store::state::load_archiver_status(&store)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((store, report))
    };
    let (store, report) = match tokio::time::timeout(READ_WITHIN, read).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::warn!(policy = %name, error = %e, "binlog archive watch");
            return Some(every);
        }
        Err(_) => {
            tracing::warn!(policy = %name, "binlog archive watch: the store did not answer within {} s", READ_WITHIN.as_secs());
            return Some(every);
        }
    };
    let now = ctx.clock.now();
    let Some(a) = assess(report.as_ref(), now, max_lag, silent_after(interval)) else {
        return Some(every);
    };
    let ns = policy.namespace().unwrap_or_default();
    ctx.metrics
        .binlog_archive_lag
        .get_or_create(&crate::metrics::Metrics::policy(&ns, &name))
        .set(a.lag.as_secs().max(0));
    // binlogArchive.purge: the server's disk as the archiver's last purge found it.
    if let Some(p) = report
        .as_ref()
        .and_then(|r| r.purge.as_ref())
        .filter(|p| p.error.is_none())
    {
        let labels = crate::metrics::Metrics::policy(&ns, &name);
        ctx.metrics
            .binlog_disk_bytes
            .get_or_create(&labels)
            .set(i64::try_from(p.disk_bytes).unwrap_or(i64::MAX));
        ctx.metrics
            .point_in_time_at_risk
            .get_or_create(&labels)
            .set(i64::from(p.any_at_risk()));
        if p.any_at_risk() {
            tracing::warn!(policy = %name, disk = p.disk_bytes, limit = ?p.max_disk, "point in time at risk: {}", p.kept_because.as_deref().unwrap_or("binlogs not archived"));
        }
    }
    let risk = report
        .as_ref()
        .and_then(|r| r.purge.as_ref())
        .map(purge_risk);
    let previous = policy.status.as_ref();
    let was_behind = previous
        .and_then(|s| s.binlog_archive.as_ref())
        .map(|b| b.behind);
    let old = previous.map_or(&[][..], |s| s.conditions.as_slice());
    let same_condition = old.iter().find(|c| c.type_ == CONDITION).is_some_and(|c| {
        c.status == if a.behind { "False" } else { "True" } && c.reason == a.reason
    });
    let same_status = previous.and_then(|s| s.binlog_archive.as_ref()) == Some(&a.status);
    // The timelines: read again when the archiver's timeline changed (or never was), else
    // what the condition says stands (an acknowledgement is read with the next change).
    let previous_timeline = previous
        .and_then(|s| s.binlog_archive.as_ref())
        .and_then(|b| b.timeline);
    let old_main = old.iter().find(|c| c.type_ == MAIN_LINE_CONDITION);
    // While a switch is unacknowledged, read again each time: an acknowledgement (the
    // annotation) clears it, and the parent's archive may still grow.
    let early =
        if previous_timeline != a.status.timeline || old_main.is_none_or(|c| c.status == "False") {
            store.begin_pass();
            let index = tokio::time::timeout(
                READ_WITHIN,
                tidemark_store::index::SegmentIndex::load(&store),
            )
            .await
            .map_or_else(
                |_| Err(format!("no answer within {} s", READ_WITHIN.as_secs())),
                |read| read.map_err(|e| e.to_string()),
            );
            match index {
                Ok(Some(index)) => {
                    let acknowledged = policy
                        .annotations()
                        .get(crate::names::ACKNOWLEDGE_BRANCHES_ANNOTATION)
                        .and_then(|a| a.parse().ok());
                    Some(early_switches(
                        &index.head.timelines,
                        &archive_ends(&index.head),
                        acknowledged,
                    ))
                }
                Ok(None) => Some(Vec::new()),
                Err(e) => {
                    tracing::warn!(policy = %name, error = %e, "binlog archive watch: the index");
                    None
                }
            }
        } else {
            None
        };
    let main_line = match &early {
        Some(early) => {
            let (ok, reason, message) = match early.first() {
                None => (
                    true,
                    "MainLineWhole",
                    "every switch of primary joins the end of its parent's archive".to_owned(),
                ),
                Some(e) => (false, "SwitchBeforeArchiveEnd", e.message.clone()),
            };
            Some(condition(
                old,
                MAIN_LINE_CONDITION,
                ok,
                reason,
                &message,
                policy.meta().generation,
            ))
        }
        None => old_main.cloned(),
    };
    let same_main = old_main == main_line.as_ref();
    let old_risk = old.iter().find(|c| c.type_ == RISK_CONDITION);
    let purging = policy
        .spec
        .binlog_archive
        .as_ref()
        .is_some_and(|a| a.purge.is_some());
    let risk_condition = risk.as_ref().map(|(at_risk, reason, message)| {
        // Negative polarity, as Kubernetes' own DiskPressure: True is the trouble.
        let mut c = condition(
            old,
            RISK_CONDITION,
            at_risk.unwrap_or(false),
            reason,
            message,
            policy.meta().generation,
        );
        if at_risk.is_none() {
            c.status = "Unknown".into();
            c.last_transition_time = old_risk
                .filter(|o| o.status == "Unknown")
                .map_or_else(|| Time(ctx.clock.now()), |o| o.last_transition_time.clone());
        }
        // The disk's bytes change every pass: rewritten only when the verdict does.
        if let Some(o) = old_risk.filter(|o| o.status == c.status && o.reason == c.reason) {
            c = o.clone();
        }
        c
    });
    // No purge recorded yet by this archiver (a pass under way, or an older archiver):
    // the condition stands; without binlogArchive.purge it goes.
    let risk_condition = match risk_condition {
        None if purging => old_risk.cloned(),
        c => c,
    };
    let same_risk = old_risk == risk_condition.as_ref();
    if !(same_condition && same_status && same_main && same_risk) {
        let c = condition(
            old,
            CONDITION,
            !a.behind,
            a.reason,
            &a.message,
            policy.meta().generation,
        );
        let conditions: Vec<_> = std::iter::once(c)
            .chain(main_line.clone())
            .chain(risk_condition.clone())
            .collect();
        let api: Api<BackupPolicy> = Api::namespaced(ctx.client.clone(), &ns);
        let value = serde_json::json!({ "binlogArchive": a.status, "conditions": conditions });
        if let Err(e) = crate::status::apply(&api, &name, MANAGER, value).await {
            tracing::warn!(policy = %name, error = %e, "binlog archive watch: status");
        }
    }
    let object = policy.object_ref(&());
    // A Warning for every new timeline whose switch lies before the archive's end.
    for e in early.iter().flatten() {
        if previous_timeline.is_none_or(|p| e.timeline > p) {
            ctx.warn(&object, "TimelineSwitchBeforeArchiveEnd", &e.message)
                .await;
        }
    }
    match (old_risk.map(|c| c.status == "True"), &risk) {
        (Some(false) | None, Some((Some(true), _, message))) => {
            ctx.warn(&object, "PointInTimeAtRisk", message).await;
        }
        (Some(true), Some((Some(false), _, message))) => {
            ctx.event(&object, EventType::Normal, "PointInTimeSafe", message)
                .await;
        }
        _ => {}
    }
    match (was_behind, a.behind) {
        (Some(false) | None, true) => ctx.warn(&object, "BinlogArchiveBehind", &a.message).await,
        (Some(true), false) => {
            ctx.event(
                &object,
                EventType::Normal,
                "BinlogArchiveCaughtUp",
                &a.message,
            )
            .await;
        }
        _ => {}
    }
    Some(every)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn at(s: &str) -> Timestamp {
        format!("2026-11-27T10:{s}Z").parse().unwrap()
    }

    fn report(observed: &str, primary: &str, archived: &str) -> ArchiverStatus {
        ArchiverStatus {
            format_version: 1,
            observed_at: at(observed),
            server_id: Some(2),
            timeline: 1,
            primary_last_event_at: Some(at(primary)),
            archived_last_event_at: Some(at(archived)),
            writer: String::new(),
            purge: None,
            extra: Default::default(),
        }
    }

    #[test]
    fn behind_by_more_than_max_lag_or_silent() {
        let max = SignedDuration::from_mins(5);
        let quiet = silent_after(SignedDuration::from_secs(10));
        assert_eq!(quiet, SignedDuration::from_secs(60));
        assert_eq!(assess(None, at("00:00"), max, quiet), None);
        // Two minutes behind: current.
        let a = assess(
            Some(&report("10:00", "10:00", "08:00")),
            at("10:10"),
            max,
            quiet,
        )
        .unwrap();
        assert_eq!(
            (a.behind, a.reason, a.lag.as_secs()),
            (false, "ArchiveCurrent", 120)
        );
        // Ten minutes behind: behind.
        let a = assess(
            Some(&report("10:00", "10:00", "00:00")),
            at("10:10"),
            max,
            quiet,
        )
        .unwrap();
        assert_eq!(
            (a.behind, a.reason, a.lag.as_secs()),
            (true, "ArchiveBehind", 600)
        );
        assert!(a.message.contains("600s behind server 2"), "{}", a.message);
        assert_eq!(a.status.timeline, Some(1));
        // No pass for two minutes: silent, and behind by the archive's age.
        let a = assess(
            Some(&report("10:00", "10:00", "09:30")),
            at("12:00"),
            max,
            quiet,
        )
        .unwrap();
        assert_eq!(
            (a.behind, a.reason, a.lag.as_secs()),
            (true, "ArchiverSilent", 150)
        );
    }

    /// Issue 45 §4: the condition is True while any server (the one archived from or a
    /// replica) is at risk, and names it; else False, naming a replica that failed.
    #[test]
    fn the_point_in_time_is_at_risk_while_any_server_is() {
        use tidemark_store::state::BinlogPurgeStatus;
        let server = |at_risk: bool, name: Option<&str>| BinlogPurgeStatus {
            at: at("00:00"),
            disk_bytes: 900,
            max_disk: Some(1000),
            point_in_time_at_risk: at_risk,
            kept_because: at_risk.then(|| {
                "mysql-bin.000002 holds transactions the archive has not verified yet".into()
            }),
            purged_to: None,
            replicas: Vec::new(),
            server: name.map(str::to_owned),
            error: None,
        };
        let mut p = server(false, None);
        p.replicas = vec![server(false, Some("db-1:3306"))];
        let (risk, reason, message) = purge_risk(&p);
        assert_eq!(
            (risk, reason),
            (Some(false), "BinlogsArchived"),
            "{message}"
        );
        p.replicas[0].point_in_time_at_risk = true;
        let (risk, reason, message) = purge_risk(&p);
        assert_eq!((risk, reason), (Some(true), "DiskNearsLimitUnarchived"));
        assert!(
            message.contains("replica db-1:3306 holds 900 bytes")
                && !message.contains("the server holds"),
            "{message}"
        );
        p.replicas[0] = server(false, Some("db-1:3306"));
        p.replicas[0].error = Some("cannot connect".into());
        p.point_in_time_at_risk = true;
        let (risk, _, message) = purge_risk(&p);
        assert!(
            risk == Some(true) && message.contains("the server holds 900 bytes"),
            "{message}"
        );
        p.point_in_time_at_risk = false;
        let (risk, _, message) = purge_risk(&p);
        assert!(
            risk == Some(false) && message.contains("replica db-1:3306 not purged: cannot connect"),
            "{message}"
        );
        // The purge of the server archived from fails: unknown, and why.
        p.error = Some("Access denied; you need the BINLOG ADMIN privilege".into());
        let (risk, reason, message) = purge_risk(&p);
        assert_eq!((risk, reason), (None, "PurgeFailed"));
        assert!(message.contains("BINLOG ADMIN"), "{message}");
    }

    /// Issue 42 §3: a switch before the end of its parent's archive is named (the parent
    /// holds segments after it), one at the end is not, and an acknowledgement at or after
    /// the switch silences it.
    #[test]
    fn switches_before_the_archive_end_are_named_until_acknowledged() {
        use tidemark_core::gtid::GtidPos;
        use tidemark_core::timeline::{Switch, Timeline, archive_sequence};
        let switch_at = at("05:00");
        let t0 = Timeline {
            server_id: Some(1),
            ..Timeline::legacy()
        };
        let t1 = |parent_sequence: u64| Timeline {
            id: 1,
            server_id: Some(2),
            parent: Some(0),
            first_sequence: archive_sequence(1, 1),
            switch: Some(Switch {
                gtid: GtidPos::parse("0-1-35").unwrap(),
                at: Some(switch_at),
                parent_sequence: Some(parent_sequence),
                missing: Vec::new(),
                unrelated: false,
            }),
            created_at: None,
        };
        let at_switch = GtidPos::parse("0-1-35").ok();
        let last: std::collections::HashMap<u32, ArchiveEnd> = [
            (0, (4, at_switch.clone())),
            (1, (archive_sequence(1, 2).unwrap(), None)),
        ]
        .into_iter()
        .collect();
        // The parent's archive ends with the switch: nothing to say.
        assert!(early_switches(&[t0.clone(), t1(4)], &last, None).is_empty());
        // It ends in the segment holding the switch, but after it (the old primary's
        // last transactions, in that very file): a branch.
        let beyond: std::collections::HashMap<u32, ArchiveEnd> =
            [(0, (4, GtidPos::parse("0-1-42").ok()))]
                .into_iter()
                .collect();
        assert_eq!(early_switches(&[t0.clone(), t1(4)], &beyond, None).len(), 1);
        // The parent holds segments 3 and 4 after a switch in segment 2.
        let e = early_switches(&[t0.clone(), t1(2)], &last, None);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].timeline, 1);
        assert!(
            e[0].message
                .contains("timeline 1 (server 2) left timeline 0 (server 1) after 0-1-35")
                && e[0].message.contains("branch"),
            "{}",
            e[0].message
        );
        // Acknowledged at the switch: silent; before it: still named.
        assert!(early_switches(&[t0.clone(), t1(2)], &last, Some(switch_at)).is_empty());
        assert_eq!(
            early_switches(&[t0, t1(2)], &last, Some(at("04:59"))).len(),
            1
        );
    }
}
