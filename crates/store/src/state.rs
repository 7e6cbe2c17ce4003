//! Durable state of `tidemark run`, kept in the store beside the backups so that a restart
//! (or another machine) resumes without a duplicate or a lost slot:
//! `<cluster>/_state/run.json` holds each schedule's status and the last retention run.
//! Written with conditional puts: two runners on one cluster cannot both advance it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use object_store::path::Path;
use object_store::{ObjectStoreExt, UpdateVersion};
use serde::{Deserialize, Serialize};
use tidemark_core::schedule::ScheduleStatus;

use crate::bounded::{MAX_RUN_STATE, MAX_STATE_RECORD};
use crate::error::StoreError;
use crate::layout;
use crate::open::ClusterStore;
use crate::open::write_err;
use crate::rawfields::{self, RawFields, Record};

/// Version of `_state/run.json`.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// `_state/run.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunState {
    pub format_version: u32,
    /// Status of each ScheduledBackup, by name.
    #[serde(default)]
    pub schedules: BTreeMap<String, ScheduleStatus>,
    /// When the retention pass last ran.
    #[serde(default)]
    pub last_retention_run_time: Option<Timestamp>,
    /// Backups started and not yet finished, by schedule: written before a backup starts,
    /// so a run that dies during one leaves a record the next run finds (even when no
    /// byte reached the store) and records the attempt as failed.
    #[serde(default)]
    pub running: BTreeMap<String, JournaledAttempt>,
    /// Fields of newer versions, kept on rewrite.
    #[serde(flatten, skip_deserializing)]
    pub extra: RawFields,
}

impl Record for RunState {
    const KNOWN: &'static [&'static str] = &[
        "formatVersion",
        "schedules",
        "lastRetentionRunTime",
        "running",
    ];
    fn extra_mut(&mut self) -> &mut RawFields {
        &mut self.extra
    }
}

/// One backup attempt in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournaledAttempt {
    pub backup_name: String,
    pub backup_id: String,
    pub started_at: Timestamp,
    #[serde(default)]
    pub immediate: bool,
}

/// The state and the version it was read at.
#[derive(Debug, Clone)]
pub struct StoredState {
    pub state: RunState,
    version: Option<UpdateVersion>,
}

fn key() -> Path {
    Path::from_iter([layout::STATE, "run.json"])
}

impl StoredState {
    /// A state never written (saving it creates the file, and fails if one exists).
    pub fn empty() -> Self {
        StoredState {
            state: RunState {
                format_version: STATE_FORMAT_VERSION,
                ..Default::default()
            },
            version: None,
        }
    }

    /// Reads `_state/run.json` (empty state when absent).
    ///
    /// # Errors
    /// A failed request; a malformed file or one of a newer format.
    pub async fn load(store: &ClusterStore) -> Result<Self, StoreError> {
        let key = key();
        let Some((bytes, version)) = store.read_versioned_limited(&key, MAX_RUN_STATE).await?
        else {
            return Ok(Self::empty());
        };
        let state: RunState = rawfields::parse(&bytes).map_err(|e| StoreError::MalformedState {
            url: store.url.clone(),
            key: store.display_key(&key),
            problem: e.to_string(),
        })?;
        if state.format_version > STATE_FORMAT_VERSION {
            return Err(StoreError::MalformedState {
                url: store.url.clone(),
                key: store.display_key(&key),
                problem: format!(
                    "formatVersion {} is newer than this Tidemark understands ({STATE_FORMAT_VERSION}); upgrade Tidemark",
                    state.format_version
                ),
            });
        }
        Ok(StoredState {
            state,
            version: Some(version),
        })
    }

    /// Writes `next` if nobody else changed the state since it was read, and only then
    /// takes it as the state: a write that fails leaves the state as it was, and a write
    /// that reached the store but whose answer was lost is found out by reading it again.
    ///
    /// # Errors
    /// Another writer changed it ([`StoreError::StateContention`]: another `tidemark run`
    /// on the same cluster); a failed request (the state stays as it was).
    pub async fn save_as(
        &mut self,
        store: &ClusterStore,
        next: RunState,
    ) -> Result<(), StoreError> {
        let previous = std::mem::replace(&mut self.state, next);
        match self.save(store).await {
            Ok(()) => Ok(()),
            Err(e @ StoreError::StateContention { .. }) => {
                self.state = previous;
                Err(e)
            }
            Err(e) => {
                // In doubt: what is in the store now?
                match StoredState::load(store).await {
                    Ok(found) if found.state == self.state => {
                        self.version = found.version;
                        Ok(())
                    }
                    Ok(found) if found.state == previous => {
                        self.state = previous;
                        self.version = found.version;
                        Err(e)
                    }
                    _ => {
                        self.state = previous;
                        Err(e)
                    }
                }
            }
        }
    }

    /// Writes the state if nobody else changed it since it was read.
    ///
    /// # Errors
    /// Another writer changed it ([`StoreError::StateContention`]: another `tidemark run`
    /// on the same cluster); a failed request.
    pub async fn save(&mut self, store: &ClusterStore) -> Result<(), StoreError> {
        let key = key();
        let body = serde_json::to_vec_pretty(&self.state).map_err(|source| StoreError::Encode {
            url: store.url.clone(),
            what: "_state/run.json",
            source,
        })?;
        let written = match &self.version {
            None => crate::index::create_head(store, &key, body).await,
            Some(v) => crate::index::replace_head(store, &key, v, body).await,
        };
        match written {
            Ok(version) => {
                self.version = Some(version);
                Ok(())
            }
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => Err(StoreError::StateContention {
                url: store.url.clone(),
                key: store.display_key(&key),
            }),
            Err(source) => Err(write_err(store, &key, source)),
        }
    }
}

/// `_state/lease.json`: which `tidemark run` works on this cluster. Taken with a
/// conditional create, renewed with conditional updates, so two runners cannot both hold
/// it; one that stops renewing loses it once `expiresAt` has passed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub format_version: u32,
    /// A random id of the holding process.
    pub holder: String,
    pub host: String,
    pub pid: u32,
    /// The kernel boot and process namespace the process runs in: a pid means the same
    /// process only within them (containers share host names, not process tables).
    #[serde(default)]
    pub process_scope: String,
    pub acquired_at: Timestamp,
    pub renewed_at: Timestamp,
    /// Until when the holder may be assumed alive without a renewal.
    pub expires_at: Timestamp,
    #[serde(flatten, skip_deserializing)]
    pub extra: RawFields,
}

impl Record for Lease {
    const KNOWN: &'static [&'static str] = &[
        "formatVersion",
        "holder",
        "host",
        "pid",
        "processScope",
        "acquiredAt",
        "renewedAt",
        "expiresAt",
    ];
    fn extra_mut(&mut self) -> &mut RawFields {
        &mut self.extra
    }
}

impl Lease {
    /// `host:pid (holder)`, for messages.
    pub fn describe(&self) -> String {
        format!("{}:{} ({})", self.host, self.pid, self.holder)
    }
}

/// Why the lease could not be had.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("the lease is held by {}", .0.describe())]
    Held(Box<Lease>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A lease this process holds.
#[derive(Debug, Clone)]
pub struct HeldLease {
    pub lease: Lease,
    version: Option<UpdateVersion>,
}

fn lease_key() -> Path {
    Path::from_iter([layout::STATE, "lease.json"])
}

/// This machine's name, for the lease.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

async fn read_lease(store: &ClusterStore) -> Result<Option<(Lease, UpdateVersion)>, StoreError> {
    let key = lease_key();
    let Some((bytes, version)) = store.read_versioned_limited(&key, MAX_STATE_RECORD).await? else {
        return Ok(None);
    };
    let lease = rawfields::parse(&bytes).map_err(|e| StoreError::MalformedState {
        url: store.url.clone(),
        key: store.display_key(&key),
        problem: e.to_string(),
    })?;
    Ok(Some((lease, version)))
}

/// Takes the cluster's lease for `holder` until `now + ttl`: when nobody holds it, when
/// its holder let it expire, or when its holder was a process on this machine that is
/// gone (a `tidemark run` killed and restarted).
///
/// # Errors
/// [`LeaseError::Held`] naming the holder; a failed request.
pub async fn acquire_lease(
    store: &ClusterStore,
    holder: &str,
    now: Timestamp,
    ttl: jiff::SignedDuration,
) -> Result<HeldLease, LeaseError> {
    let key = lease_key();
    let host = host_name();
    let scope = process_scope();
    let mine = Lease {
        format_version: STATE_FORMAT_VERSION,
        holder: holder.to_owned(),
        host: host.clone(),
        pid: std::process::id(),
        process_scope: scope.clone(),
        acquired_at: now,
        renewed_at: now,
        expires_at: now.checked_add(ttl).unwrap_or(Timestamp::MAX),
        extra: RawFields::default(),
    };
    let current = read_lease(store).await?;
    let body = serde_json::to_vec_pretty(&mine).map_err(|source| StoreError::Encode {
        url: store.url.clone(),
        what: "_state/lease.json",
        source,
    })?;
    let written = match &current {
        None => crate::index::create_head(store, &key, body).await,
        Some((held, version)) => {
            // A holder whose process is gone from this very process table (a `run` killed
            // and restarted) is taken over at once; anything less certain waits for expiry.
            let gone = held.host == host
                && !scope.is_empty()
                && held.process_scope == scope
                && !process_alive(held.pid);
            if held.holder != holder && held.expires_at > now && !gone {
                return Err(LeaseError::Held(Box::new(held.clone())));
            }
            crate::index::replace_head(store, &key, version, body).await
        }
    };
    let version = match written {
        Ok(version) => version,
        Err(
            object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. },
        ) => {
            // Someone else got there first: name them.
            return match read_lease(store).await? {
                Some((held, _)) => Err(LeaseError::Held(Box::new(held))),
                None => Err(LeaseError::Store(StoreError::StateContention {
                    url: store.url.clone(),
                    key: store.display_key(&key),
                })),
            };
        }
        Err(source) => return Err(write_err(store, &key, source).into()),
    };
    Ok(HeldLease {
        lease: mine,
        version: Some(version),
    })
}

/// Extends the lease to `now + ttl`.
///
/// # Errors
/// [`LeaseError::Held`]: another process took it (this one must stop); a failed request
/// (the lease is still ours until it expires: try again).
pub async fn renew_lease(
    store: &ClusterStore,
    held: &mut HeldLease,
    now: Timestamp,
    ttl: jiff::SignedDuration,
) -> Result<(), LeaseError> {
    let key = lease_key();
    let mut next = held.lease.clone();
    next.renewed_at = now;
    next.expires_at = now.checked_add(ttl).unwrap_or(Timestamp::MAX);
    let body = serde_json::to_vec_pretty(&next).map_err(|source| StoreError::Encode {
        url: store.url.clone(),
        what: "_state/lease.json",
        source,
    })?;
    let written = match &held.version {
        Some(v) => crate::index::replace_head(store, &key, v, body).await,
        None => crate::index::create_head(store, &key, body).await,
    };
    let version = match written {
        Ok(version) => version,
        Err(
            object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. },
        ) => {
            // Ours still, if a write of ours reached the store but its answer was lost.
            return match read_lease(store).await? {
                Some((l, v)) if l.holder == held.lease.holder => {
                    held.lease = l;
                    held.version = Some(v);
                    Ok(())
                }
                Some((l, _)) => Err(LeaseError::Held(Box::new(l))),
                None => Err(LeaseError::Store(StoreError::StateContention {
                    url: store.url.clone(),
                    key: store.display_key(&key),
                })),
            };
        }
        Err(source) => return Err(write_err(store, &key, source).into()),
    };
    held.version = Some(version);
    held.lease = next;
    Ok(())
}

/// Gives the lease up (best effort: unreleased, it expires).
///
/// # Guarantees
/// Deletes `_state/lease.json` only while it still names `held`'s holder: a lease another
/// holder took meanwhile is never removed.
pub async fn release_lease(store: &ClusterStore, held: &HeldLease) {
    let key = lease_key();
    if let Ok(Some((l, _))) = read_lease(store).await
        && l.holder == held.lease.holder
    {
        let _ = store.inner.delete(&key).await;
    }
}

/// This process's boot and process namespace (`<boot id>/<pid namespace>`), or empty when
/// they cannot be read.
pub fn process_scope() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|b| b.trim().to_owned())
        .unwrap_or_default();
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    if boot.is_empty() || ns.is_empty() {
        String::new()
    } else {
        format!("{boot}/{ns}")
    }
}

/// Whether a process of this machine is alive.
fn process_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// `_state/owner.json`: who owns this cluster directory — one BackupPolicy of one namespace,
/// or one `tidemark run` configuration. Created with a conditional write by the first
/// owner; any other is refused, naming the owner, so two teams sharing a bucket never plan
/// over, archive into or delete each other's backups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    pub format_version: u32,
    /// `BackupPolicy` (the operator) or `tidemark run`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The policy's name.
    pub name: String,
    /// The BackupPolicy's uid (the operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The machine (`tidemark run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub since: Timestamp,
    #[serde(flatten, skip_deserializing)]
    pub extra: RawFields,
}

impl Record for Owner {
    const KNOWN: &'static [&'static str] = &[
        "formatVersion",
        "kind",
        "namespace",
        "name",
        "uid",
        "host",
        "since",
    ];
    fn extra_mut(&mut self) -> &mut RawFields {
        &mut self.extra
    }
}

impl Owner {
    /// `BackupPolicy ns/name (uid …)` or `tidemark run policy name on host`.
    pub fn describe(&self) -> String {
        match (&self.namespace, &self.host) {
            (Some(ns), _) => format!(
                "{} {ns}/{} (uid {})",
                self.kind,
                self.name,
                self.uid.as_deref().unwrap_or("?")
            ),
            (None, Some(host)) => format!("{} policy {} on {host}", self.kind, self.name),
            (None, None) => format!("{} {}", self.kind, self.name),
        }
    }

    /// The same owner: same kind, namespace, name and host. A policy deleted and created
    /// again under its name (a new uid) is the same owner and takes the record over.
    pub fn same_as(&self, other: &Owner) -> bool {
        self.kind == other.kind
            && self.namespace == other.namespace
            && self.name == other.name
            && self.host == other.host
    }
}

/// The directory belongs to someone else.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("{url}: the cluster directory {cluster:?} belongs to {}; give this policy its own directory (spec.cluster)", .owner.describe())]
    Taken {
        url: String,
        cluster: String,
        owner: Box<Owner>,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn owner_key() -> Path {
    Path::from_iter([layout::STATE, "owner.json"])
}

/// Records `me` as the directory's owner when it has none (a conditional create), takes the
/// record over when it names the same owner (a new uid), and refuses any other.
///
/// # Errors
/// [`OwnerError::Taken`] naming the owner; a failed request; a malformed record.
pub async fn claim_owner(store: &ClusterStore, me: &Owner) -> Result<(), OwnerError> {
    let key = owner_key();
    let taken = |owner: Owner| OwnerError::Taken {
        url: store.url.clone(),
        cluster: store.cluster.clone(),
        owner: Box::new(owner),
    };
    let body = serde_json::to_vec_pretty(me).map_err(|source| StoreError::Encode {
        url: store.url.clone(),
        what: "_state/owner.json",
        source,
    })?;
    for _ in 0..3 {
        let current = match store.read_versioned_limited(&key, MAX_STATE_RECORD).await? {
            None => None,
            Some((bytes, version)) => {
                let owner: Owner =
                    rawfields::parse(&bytes).map_err(|e| StoreError::MalformedState {
                        url: store.url.clone(),
                        key: store.display_key(&key),
                        problem: e.to_string(),
                    })?;
                Some((owner, version))
            }
        };
        let written = match &current {
            Some((o, _)) if o.same_as(me) && o.uid == me.uid => return Ok(()),
            Some((o, _)) if !o.same_as(me) => return Err(taken(o.clone())),
            Some((_, version)) => {
                crate::index::replace_head(store, &key, version, body.clone()).await
            }
            None => crate::index::create_head(store, &key, body.clone()).await,
        };
        match written {
            Ok(_) => return Ok(()),
            // Someone wrote it meanwhile: look again.
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => {}
            Err(source) => return Err(write_err(store, &key, source).into()),
        }
    }
    Err(StoreError::StateContention {
        url: store.url.clone(),
        key: store.display_key(&key),
    }
    .into())
}

/// `_state/archiver.json`: what the binlog archiver saw at its last pass — how far the
/// archive is behind the server it reads. Written (last writer wins: it is a report, not a
/// lock) after every pass that succeeded; an archiver that stopped leaves it growing old.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiverStatus {
    pub format_version: u32,
    /// When the pass ended, by the archiver's clock.
    pub observed_at: Timestamp,
    /// The server it read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<u32>,
    /// The timeline that server's files go to.
    #[serde(default)]
    pub timeline: u32,
    /// The newest event the server had written, as far as the archiver saw: the last write
    /// to the binlog file it is writing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_last_event_at: Option<Timestamp>,
    /// The newest event archived on that timeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived_last_event_at: Option<Timestamp>,
    /// Host and process of the archiver.
    #[serde(default)]
    pub writer: String,
    /// `--purge-keep`: the server's binlogs as the last purge found them (issue 45 §4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge: Option<BinlogPurgeStatus>,
    #[serde(flatten, skip_deserializing)]
    pub extra: RawFields,
}

/// The server's binlogs as the archiver's last purge found them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BinlogPurgeStatus {
    pub at: Timestamp,
    /// Bytes of binlogs on the server after the purge, and the limit.
    pub disk_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_disk: Option<u64>,
    /// The limit nears and files are not archived: the disk may fill.
    #[serde(default)]
    pub point_in_time_at_risk: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_because: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purged_to: Option<String>,
    /// `--purge-replica`: the same for each replica purged by the same rule (each with its
    /// `server`, and the `error` that stopped its purge, if one did).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<BinlogPurgeStatus>,
    /// The server as given to `--purge-replica` (absent for the server archived from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl BinlogPurgeStatus {
    /// Whether this server's, or a replica's, point in time is at risk.
    pub fn any_at_risk(&self) -> bool {
        self.point_in_time_at_risk || self.replicas.iter().any(|r| r.point_in_time_at_risk)
    }
}

impl Record for ArchiverStatus {
    const KNOWN: &'static [&'static str] = &[
        "formatVersion",
        "observedAt",
        "serverId",
        "timeline",
        "primaryLastEventAt",
        "archivedLastEventAt",
        "writer",
        "purge",
    ];
    fn extra_mut(&mut self) -> &mut RawFields {
        &mut self.extra
    }
}

impl ArchiverStatus {
    /// How far the archive is behind the server at `now`: the newest event the server
    /// wrote against the newest archived — or, when the archiver's last pass is older than
    /// `silent_after`, against `now` (an archiver that stopped falls further behind every
    /// second). Zero when nothing is unarchived.
    pub fn lag(&self, now: Timestamp, silent_after: jiff::SignedDuration) -> jiff::SignedDuration {
        let silent = now.duration_since(self.observed_at) > silent_after;
        let newest = if silent {
            Some(now)
        } else {
            self.primary_last_event_at
        };
        match (newest, self.archived_last_event_at) {
            (Some(n), Some(a)) if n > a => n.duration_since(a),
            (Some(n), None) if silent => n.duration_since(self.observed_at),
            _ => jiff::SignedDuration::ZERO,
        }
    }

    /// Whether the last pass is older than `silent_after` at `now`.
    pub fn silent(&self, now: Timestamp, silent_after: jiff::SignedDuration) -> bool {
        now.duration_since(self.observed_at) > silent_after
    }
}

/// Reads the record at `key` (at most `limit` bytes: refused unread beyond it); `None`
/// when nobody wrote one.
///
/// # Errors
/// A failed request; a malformed or too large record.
async fn load_record<T: Record>(
    store: &ClusterStore,
    key: &Path,
    limit: u64,
) -> Result<Option<T>, StoreError> {
    let Some(bytes) = store.read_limited(key, limit).await? else {
        return Ok(None);
    };
    rawfields::parse(&bytes)
        .map(Some)
        .map_err(|e| StoreError::MalformedState {
            url: store.url.clone(),
            key: store.display_key(key),
            problem: e.to_string(),
        })
}

/// Writes `record` at `key` (`what` names it in errors); last writer wins.
///
/// # Errors
/// A failed request.
async fn save_record<T: Serialize>(
    store: &ClusterStore,
    key: &Path,
    what: &'static str,
    record: &T,
) -> Result<(), StoreError> {
    let body = serde_json::to_vec_pretty(record).map_err(|source| StoreError::Encode {
        url: store.url.clone(),
        what,
        source,
    })?;
    store
        .object_store()
        .put(key, body.into())
        .await
        .map(|_| ())
        .map_err(|source| write_err(store, key, source))
}

fn archiver_key() -> Path {
    Path::from_iter([layout::STATE, "archiver.json"])
}

/// Writes the archiver's status.
///
/// # Errors
/// A failed request.
pub async fn save_archiver_status(
    store: &ClusterStore,
    status: &ArchiverStatus,
) -> Result<(), StoreError> {
    save_record(store, &archiver_key(), "_state/archiver.json", status).await
}

/// Reads the archiver's status; `None` when no archiver has written one.
///
/// # Errors
/// A failed request; a malformed file.
pub async fn load_archiver_status(
    store: &ClusterStore,
) -> Result<Option<ArchiverStatus>, StoreError> {
    load_record(store, &archiver_key(), MAX_STATE_RECORD).await
}

/// `_state/holds.json`: the holds the operator knows of for this store — Backup objects
/// annotated `tidemark.io/protect` and the backups Restores need — written under the
/// store's lease at each of its passes, so that every deleter with only the store
/// (`tidemark gc --store`, `tidemark run`, another policy) keeps what the cluster holds
/// (seed 000: "Confirm no Cluster uses … that Backup"). Read by every retention pass; a
/// planted record can only keep more. It also carries seed 000's gate: while the operator
/// finds no established primary (`noPrimary`), no retention pass deletes anything, from
/// whichever deleter (a planted gate can only stop passes, which a deleter may override).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredHolds {
    pub format_version: u32,
    pub written_at: Timestamp,
    /// Who wrote it (the operator's namespace/policy).
    #[serde(default)]
    pub writer: String,
    /// Backup-ids on hold.
    #[serde(default)]
    pub protect: Vec<String>,
    /// What restores need: the backup and the restore's name.
    #[serde(default)]
    pub restores: Vec<StoredRestoreHold>,
    /// The cluster has no established primary (seed 000): retention deletes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_primary: Option<StoredGate>,
    #[serde(flatten, skip_deserializing)]
    pub extra: RawFields,
}

/// Seed 000's gate, closed: since when, and why (the operator's message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredGate {
    pub since: Timestamp,
    pub message: String,
}

/// What a writer of the holds says of seed 000's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate<'a> {
    /// An established primary: passes may delete.
    Open,
    /// None: passes delete nothing; why.
    Closed(&'a str),
    /// As recorded (a writer that does not look at the primary, e.g. a Restore).
    Keep,
}

/// One restore's hold, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredRestoreHold {
    pub backup_id: String,
    pub by: String,
}

impl Record for StoredHolds {
    const KNOWN: &'static [&'static str] = &[
        "formatVersion",
        "writtenAt",
        "writer",
        "protect",
        "restores",
        "noPrimary",
    ];
    fn extra_mut(&mut self) -> &mut RawFields {
        &mut self.extra
    }
}

impl StoredHolds {
    /// The holds as a pass takes them: backup-ids on hold, and the restores' holds.
    pub fn into_pass_holds(
        self,
    ) -> (
        std::collections::HashSet<String>,
        Vec<tidemark_core::RestoreHold>,
    ) {
        (
            self.protect.into_iter().collect(),
            self.restores
                .into_iter()
                .map(|r| tidemark_core::RestoreHold {
                    backup_id: r.backup_id,
                    by: r.by,
                })
                .collect(),
        )
    }
}

fn guard_key() -> Path {
    Path::from_iter([layout::STATE, "guard.json"])
}

/// The deletion guard's memory between passes (`_state/guard.json`, issue 45 §3): which
/// deletions it holds and since when, and what the last pass left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredGuard {
    pub format_version: u32,
    pub written_at: Timestamp,
    #[serde(flatten)]
    pub record: tidemark_core::guard::GuardRecord,
    #[serde(flatten, skip_deserializing)]
    pub extra: RawFields,
}

impl Record for StoredGuard {
    const KNOWN: &'static [&'static str] = &[
        "formatVersion",
        "writtenAt",
        "held",
        "segmentsHeldSince",
        "segmentWaves",
        "listingShortSince",
        "last",
    ];
    fn extra_mut(&mut self) -> &mut RawFields {
        &mut self.extra
    }
}

/// Reads the deletion guard's record (empty when none was written).
///
/// # Errors
/// A failed request; a malformed or too large record (a pass then stops: it cannot tell
/// what the guard holds).
pub async fn load_guard(
    store: &ClusterStore,
) -> Result<tidemark_core::guard::GuardRecord, StoreError> {
    Ok(
        load_record::<StoredGuard>(store, &guard_key(), MAX_RUN_STATE)
            .await?
            .map(|s| s.record)
            .unwrap_or_default(),
    )
}

/// Records the deletion guard's `record`. Call under the store's lease.
///
/// # Errors
/// A failed request.
pub async fn save_guard(
    store: &ClusterStore,
    record: &tidemark_core::guard::GuardRecord,
) -> Result<(), StoreError> {
    let stored = StoredGuard {
        format_version: STATE_FORMAT_VERSION,
        written_at: Timestamp::now(),
        record: record.clone(),
        extra: RawFields::default(),
    };
    save_record(store, &guard_key(), "_state/guard.json", &stored).await
}

fn holds_key() -> Path {
    Path::from_iter([layout::STATE, "holds.json"])
}

/// Reads the recorded holds; `None` when nobody recorded any.
///
/// # Errors
/// A failed request; a malformed or too large record (a pass then stops: holds it cannot
/// read might keep what it would delete).
pub async fn load_holds(store: &ClusterStore) -> Result<Option<StoredHolds>, StoreError> {
    load_record(store, &holds_key(), MAX_RUN_STATE).await
}

/// Records `holds` and the `gate` when they differ from what is recorded (sorted, so the
/// same holds are the same record; a gate closed still keeps the time it closed). Call
/// under the store's lease.
///
/// # Errors
/// A failed request.
pub async fn save_holds(
    store: &ClusterStore,
    writer: &str,
    protect: &std::collections::HashSet<String>,
    restores: &[tidemark_core::RestoreHold],
    gate: Gate<'_>,
) -> Result<(), StoreError> {
    let mut protect: Vec<String> = protect.iter().cloned().collect();
    protect.sort();
    let mut restores: Vec<StoredRestoreHold> = restores
        .iter()
        .map(|r| StoredRestoreHold {
            backup_id: r.backup_id.clone(),
            by: r.by.clone(),
        })
        .collect();
    restores.sort_by(|a, b| (&a.backup_id, &a.by).cmp(&(&b.backup_id, &b.by)));
    restores.dedup();
    let old = load_holds(store).await.ok().flatten();
    let recorded_gate = old.as_ref().and_then(|o| o.no_primary.clone());
    let no_primary = match gate {
        Gate::Open => None,
        Gate::Keep => recorded_gate,
        Gate::Closed(message) => Some(StoredGate {
            since: recorded_gate.map_or_else(Timestamp::now, |g| g.since),
            message: message.to_owned(),
        }),
    };
    if let Some(old) = &old
        && old.protect == protect
        && old.restores == restores
        && old.no_primary == no_primary
    {
        return Ok(());
    }
    let record = StoredHolds {
        format_version: STATE_FORMAT_VERSION,
        written_at: Timestamp::now(),
        writer: writer.to_owned(),
        protect,
        restores,
        no_primary,
        extra: RawFields::default(),
    };
    save_record(store, &holds_key(), "_state/holds.json", &record).await
}

/// `_state/hooks.json`: the DeleteHooks the operator runs for this store's backups — name,
/// action (`job`, `webhook`, `command`) and selector, never a URL or a command — written
/// under the store's lease at each of its passes. A deleter without the cluster
/// (`tidemark gc --store`, `tidemark delete`) reads it and refuses to delete a backup a
/// recorded hook selects unless told to skip them (seed 003: hooks run on every deletion
/// path). A planted record can only make such a deleter refuse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredHooks {
    pub format_version: u32,
    pub written_at: Timestamp,
    #[serde(default)]
    pub writer: String,
    #[serde(default)]
    pub hooks: Vec<StoredHook>,
    #[serde(flatten, skip_deserializing)]
    pub extra: RawFields,
}

/// One recorded DeleteHook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredHook {
    pub name: String,
    /// `job`, `webhook` or `command`.
    pub action: String,
    /// Its label selector, as the DeleteHook gives it.
    #[serde(default)]
    pub selector: serde_json::Value,
}

impl Record for StoredHooks {
    const KNOWN: &'static [&'static str] = &["formatVersion", "writtenAt", "writer", "hooks"];
    fn extra_mut(&mut self) -> &mut RawFields {
        &mut self.extra
    }
}

fn hooks_key() -> Path {
    Path::from_iter([layout::STATE, "hooks.json"])
}

/// Reads the recorded DeleteHooks; `None` when nobody recorded any.
///
/// # Errors
/// A failed request; a malformed or too large record.
pub async fn load_hooks(store: &ClusterStore) -> Result<Option<StoredHooks>, StoreError> {
    load_record(store, &hooks_key(), MAX_RUN_STATE).await
}

/// Records `hooks` (sorted by name) when they differ from what is recorded. Call under
/// the store's lease.
///
/// # Errors
/// A failed request.
pub async fn save_hooks(
    store: &ClusterStore,
    writer: &str,
    mut hooks: Vec<StoredHook>,
) -> Result<(), StoreError> {
    hooks.sort_by(|a, b| a.name.cmp(&b.name));
    match load_hooks(store).await {
        Ok(Some(old)) if old.hooks == hooks => return Ok(()),
        Ok(None) if hooks.is_empty() => return Ok(()),
        _ => {}
    }
    let record = StoredHooks {
        format_version: STATE_FORMAT_VERSION,
        written_at: Timestamp::now(),
        writer: writer.to_owned(),
        hooks,
        extra: RawFields::default(),
    };
    save_record(store, &hooks_key(), "_state/hooks.json", &record).await
}

#[cfg(test)]
mod archiver_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Each record's known fields are the ones it writes, and a newer field survives a
    /// read and a rewrite verbatim.
    #[test]
    fn records_know_their_fields_and_keep_newer_ones() {
        let t: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        rawfields::assert_known(&Lease {
            format_version: 1,
            holder: "h".into(),
            host: "x".into(),
            pid: 1,
            process_scope: "s".into(),
            acquired_at: t,
            renewed_at: t,
            expires_at: t,
            extra: RawFields::default(),
        });
        rawfields::assert_known(&Owner {
            format_version: 1,
            kind: "BackupPolicy".into(),
            namespace: Some("ns".into()),
            name: "p".into(),
            uid: Some("u".into()),
            host: Some("h".into()),
            since: t,
            extra: RawFields::default(),
        });
        rawfields::assert_known(&ArchiverStatus {
            format_version: 1,
            observed_at: t,
            server_id: Some(1),
            timeline: 0,
            primary_last_event_at: Some(t),
            archived_last_event_at: Some(t),
            writer: "w".into(),
            purge: Some(BinlogPurgeStatus {
                disk_bytes: 10,
                max_disk: Some(20),
                point_in_time_at_risk: true,
                kept_because: Some("x".into()),
                purged_to: Some("mysql-bin.000002".into()),
                at: t,
                replicas: Vec::new(),
                server: None,
                error: None,
            }),
            extra: RawFields::default(),
        });
        rawfields::assert_known(&StoredHolds {
            format_version: 1,
            written_at: t,
            writer: "w".into(),
            protect: vec!["20261120T020000Z-00000001".into()],
            restores: vec![StoredRestoreHold {
                backup_id: "20261120T020000Z-00000001".into(),
                by: "r".into(),
            }],
            no_primary: Some(StoredGate {
                since: t,
                message: "no pod".into(),
            }),
            extra: RawFields::default(),
        });
        rawfields::assert_known(&StoredGuard {
            format_version: 1,
            written_at: t,
            record: tidemark_core::guard::GuardRecord {
                held: [("20261120T020000Z-00000001".to_owned(), t)].into(),
                segments_held_since: Some(t),
                segment_waves: vec![tidemark_core::guard::SegmentWave {
                    timeline: 0,
                    since: t,
                    first_sequence: 3,
                    through_sequence: 7,
                }],
                listing_short_since: Some(t),
                last: Some(tidemark_core::guard::LastPass {
                    at: t,
                    restorable: 3,
                }),
            },
            extra: RawFields::default(),
        });
        rawfields::assert_known(&StoredHooks {
            format_version: 1,
            written_at: t,
            writer: "w".into(),
            hooks: vec![StoredHook {
                name: "h".into(),
                action: "job".into(),
                selector: serde_json::json!({"matchLabels": {"a": "b"}}),
            }],
            extra: RawFields::default(),
        });
        rawfields::assert_known(&RunState {
            format_version: 1,
            last_retention_run_time: Some(t),
            ..Default::default()
        });
    }

    #[test]
    fn lag_is_the_unarchived_span_or_the_silence() {
        let t = |s: &str| format!("2026-11-27T10:{s}Z").parse::<Timestamp>().unwrap();
        let st = ArchiverStatus {
            format_version: 1,
            observed_at: t("00:00"),
            server_id: Some(2),
            timeline: 1,
            primary_last_event_at: Some(t("00:00")),
            archived_last_event_at: Some(t("00:00") - jiff::SignedDuration::from_secs(120)),
            writer: String::new(),
            purge: None,
            extra: RawFields::default(),
        };
        let minute = jiff::SignedDuration::from_secs(60);
        assert_eq!(st.lag(t("00:30"), minute).as_secs(), 120);
        // Silent for ten minutes: behind by its archive's age.
        assert!(st.silent(t("10:00"), minute));
        assert_eq!(st.lag(t("10:00"), minute).as_secs(), 720);
        let caught_up = ArchiverStatus {
            archived_last_event_at: Some(t("00:00")),
            ..st
        };
        assert_eq!(caught_up.lag(t("00:30"), minute).as_secs(), 0);
    }
}

/// The directory (inside [`layout::STATE`]) of copy records.
pub const COPIES: &str = "copies";

/// Most copies a store records: a policy names a handful; more records are planted.
pub const MAX_COPIES: usize = 16;

/// `_state/copies/<name>.json` in the *source* store: how far the copy `name` has come
/// (DESIGN.md §7.2). Written by the copier after each pass (last writer wins: one copier per
/// copy, under the copy's lease). Every retention pass on the source reads it and keeps
/// what the copy has not dealt with yet (`copy:<name>`). A planted record can only keep
/// more; a copy removed from the policy has its record removed by the runner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyRecord {
    pub format_version: u32,
    /// The copy's name (`copies[].name`).
    pub name: String,
    /// Where the copy is (its URL and cluster), for people.
    #[serde(default)]
    pub destination: String,
    /// When the last pass ended, by the copier's clock.
    pub observed_at: Timestamp,
    /// Backups of the source the copy received (pruned to those the source still has).
    #[serde(default)]
    pub received: std::collections::BTreeSet<String>,
    /// Backups of the source the copy's plan would not keep: never sent.
    #[serde(default)]
    pub declined: std::collections::BTreeSet<String>,
    /// Per timeline: every indexed segment up to this sequence was received or declined.
    #[serde(default)]
    pub segments_through: BTreeMap<u32, u64>,
    /// Per timeline: the runs of sequences (first, last) below `segmentsThrough` the
    /// source had not indexed at the last pass; one indexed since is still kept for the
    /// copy.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub segments_missing: BTreeMap<u32, Vec<[u64; 2]>>,
    /// Per timeline: the first sequence the source had indexed at the last pass; one
    /// indexed since below it is still kept for the copy.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub segments_from: BTreeMap<u32, u64>,
    /// The newest restorable instant of the source, and of the copy, at the last pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_newest_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_newest_at: Option<Timestamp>,
    /// What could not be copied at the last pass (each a key and why), if anything.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    /// Host and process of the copier.
    #[serde(default)]
    pub writer: String,
    #[serde(flatten, skip_deserializing)]
    pub extra: RawFields,
}

impl Record for CopyRecord {
    const KNOWN: &'static [&'static str] = &[
        "formatVersion",
        "name",
        "destination",
        "observedAt",
        "received",
        "declined",
        "segmentsThrough",
        "segmentsMissing",
        "segmentsFrom",
        "sourceNewestAt",
        "copyNewestAt",
        "failures",
        "writer",
    ];
    fn extra_mut(&mut self) -> &mut RawFields {
        &mut self.extra
    }
}

impl CopyRecord {
    /// A copy that has received nothing yet: everything of the source waits for it.
    pub fn new(name: &str, destination: &str, now: Timestamp) -> Self {
        CopyRecord {
            format_version: STATE_FORMAT_VERSION,
            name: name.to_owned(),
            destination: destination.to_owned(),
            observed_at: now,
            received: Default::default(),
            declined: Default::default(),
            segments_through: BTreeMap::new(),
            segments_missing: BTreeMap::new(),
            segments_from: BTreeMap::new(),
            source_newest_at: None,
            copy_newest_at: None,
            failures: Vec::new(),
            writer: host_name(),
            extra: RawFields::default(),
        }
    }

    /// What a retention pass on the source keeps for this copy.
    pub fn floor(&self) -> tidemark_core::copies::CopyFloor {
        tidemark_core::copies::CopyFloor {
            name: self.name.clone(),
            handled: self.received.union(&self.declined).cloned().collect(),
            segments_through: self.segments_through.clone(),
            segments_missing: self.segments_missing.clone(),
            segments_from: self.segments_from.clone(),
        }
    }
}

/// `_state/copies/<name>.json`; `None` for a name that is not one safe path segment.
pub fn copy_key(name: &str) -> Option<Path> {
    layout::is_backup_name(name)
        .then(|| Path::from_iter([layout::STATE, COPIES, &format!("{name}.json")]))
}

/// Reads the record of copy `name`; `None` when none was written.
///
/// # Errors
/// A failed request; a malformed or too large record; a name outside the grammar.
pub async fn load_copy(store: &ClusterStore, name: &str) -> Result<Option<CopyRecord>, StoreError> {
    let Some(key) = copy_key(name) else {
        return Err(StoreError::MalformedState {
            url: store.url.clone(),
            key: format!("{}/{COPIES}/{name}.json", layout::STATE),
            problem: "a copy's name is letters, digits, '-', '_' or '.'".into(),
        });
    };
    load_record(store, &key, MAX_RUN_STATE).await
}

/// Every copy record of the store (at most [`MAX_COPIES`]; a record whose file name is
/// not its `name` is refused — it would hold for a copy nobody can find).
///
/// # Errors
/// A failed request; a malformed record (a pass then stops: a copy's needs it cannot read
/// might be what it would delete); more records than [`MAX_COPIES`].
pub async fn load_copies(store: &ClusterStore) -> Result<Vec<CopyRecord>, StoreError> {
    use futures::TryStreamExt;
    let prefix = Path::from_iter([layout::STATE, COPIES]);
    // Read as it comes, nothing of the listing held: what is not a record is passed over
    // (the store's listing budget bounds a server that answers without end), and more
    // records than a store of copies holds are refused.
    let mut listing = store.object_store().list(Some(&prefix));
    let mut out = Vec::new();
    while let Some(meta) = listing
        .try_next()
        .await
        .map_err(|source| crate::open::request(store, "listing", &prefix, source))?
    {
        // Only `_state/copies/<name>.json` itself: a listing that answers with keys of
        // other places (a hostile or broken server) names no copy.
        let parts: Vec<&str> = meta.location.as_ref().split('/').collect();
        let [layout::STATE, COPIES, file] = parts.as_slice() else {
            continue;
        };
        let Some(name) = file
            .strip_suffix(".json")
            .filter(|n| layout::is_backup_name(n))
        else {
            continue;
        };
        if out.len() == MAX_COPIES {
            return Err(StoreError::MalformedState {
                url: store.url.clone(),
                key: store.display_key(&prefix),
                problem: format!("more than {MAX_COPIES} copy records"),
            });
        }
        if let Some(r) = load_copy(store, name).await? {
            if r.name != name {
                return Err(StoreError::MalformedState {
                    url: store.url.clone(),
                    key: store.display_key(&meta.location),
                    problem: format!("it names the copy {:?}", r.name),
                });
            }
            out.push(r);
        }
    }
    Ok(out)
}

/// Writes the record of a copy.
///
/// # Errors
/// A failed request; a name outside the grammar.
pub async fn save_copy(store: &ClusterStore, record: &CopyRecord) -> Result<(), StoreError> {
    let Some(key) = copy_key(&record.name) else {
        return Err(StoreError::MalformedState {
            url: store.url.clone(),
            key: format!("{}/{COPIES}/{}.json", layout::STATE, record.name),
            problem: "a copy's name is letters, digits, '-', '_' or '.'".into(),
        });
    };
    save_record(store, &key, "_state/copies/<name>.json", record).await
}

/// Removes the record of a copy no longer configured: the source stops keeping anything
/// for it.
///
/// # Guarantees
/// Only `_state/copies/<name>.json`.
///
/// # Errors
/// A failed request (already gone is success).
pub async fn forget_copy(store: &ClusterStore, name: &str) -> Result<(), StoreError> {
    let Some(key) = copy_key(name) else {
        return Ok(());
    };
    match store.object_store().delete(&key).await {
        Ok(()) => Ok(()),
        Err(e) if crate::error::is_not_found(&e) => Ok(()),
        Err(source) => Err(write_err(store, &key, source)),
    }
}
