//! Leader election with a `coordination.k8s.io/v1` Lease: one operator replica runs the
//! controllers; the others wait. Every write is conditional on the Lease's
//! `resourceVersion`, so two replicas can never both believe they hold it from writes that
//! succeeded; a holder that cannot renew before its lease runs out stops by itself.
//!
//! Hand-written on purpose: kube-runtime has no leader election, and the crates that add
//! one take a held Lease by comparing its `renewTime` with the local clock, so a replica
//! whose clock runs ahead steals a Lease that is still renewed. Here a candidate takes a
//! held Lease only after seeing its record unchanged for a whole lease duration of its own
//! clock, and a holder steps down on its own clock too: the machines' clocks need not
//! agree.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;

/// How a replica takes part in the election.
#[derive(Debug, Clone)]
pub struct Election {
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica (its pod name in a cluster).
    pub identity: String,
    /// How long a lease lasts without renewal.
    pub lease_duration: Duration,
    /// How often the holder renews, and a candidate retries.
    pub retry_period: Duration,
}

impl Election {
    pub fn new(namespace: &str, identity: &str) -> Self {
        Election {
            namespace: namespace.to_owned(),
            name: "tidemark-operator".to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Why leadership ended.
#[derive(Debug, thiserror::Error)]
pub enum Lost {
    #[error("the Lease {0} is now held by {1}")]
    TakenBy(String, String),
    #[error("the Lease {0} could not be renewed before it expired: {1}")]
    Expired(String, String),
}

/// Waits until this replica holds the lease.
///
/// # Errors
/// Never returns an error: API failures are retried every `retry_period` (and logged).
pub async fn acquire(api: &Api<Lease>, e: &Election) -> Lease {
    let mut logged_holder = None;
    let mut seen = None;
    loop {
        match try_acquire(api, e, &mut seen).await {
            Ok(Ok(lease)) => {
                tracing::info!(lease = %e.name, identity = %e.identity, "leader election: acquired");
                return lease;
            }
            Ok(Err(holder)) => {
                if logged_holder.as_deref() != Some(holder.as_str()) {
                    tracing::info!(lease = %e.name, %holder, "leader election: waiting for the holder's lease to expire");
                    logged_holder = Some(holder);
                }
            }
            Err(err) => tracing::warn!(lease = %e.name, "leader election: {err}"),
        }
        tokio::time::sleep(e.retry_period).await;
    }
}

/// The lease record as this candidate last saw it, and when (on this machine's monotonic
/// clock): a holder's lease has expired when its record has not changed for a whole lease
/// duration of *our* time, whatever the two machines' wall clocks say (as client-go does).
#[derive(Debug)]
pub struct Seen {
    record: (Option<String>, Option<MicroTime>),
    since: tokio::time::Instant,
}

/// One attempt: `Ok(Ok(lease))` held, `Ok(Err(holder))` someone else holds it.
async fn try_acquire(
    api: &Api<Lease>,
    e: &Election,
    seen: &mut Option<Seen>,
) -> Result<Result<Lease, String>, kube::Error> {
    let now = Timestamp::now();
    let existing = api.get_opt(&e.name).await?;
    let Some(mut lease) = existing else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(e.name.clone()),
                namespace: Some(e.namespace.clone()),
                ..Default::default()
            },
            spec: Some(spec(e, now, now, 0)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(l) => Ok(Ok(l)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Err("another replica".into())),
            Err(err) => Err(err),
        };
    };
    let current = lease.spec.clone().unwrap_or_default();
    let holder = current.holder_identity.clone().unwrap_or_default();
    let ours = holder == e.identity;
    let record = (current.holder_identity.clone(), current.renew_time.clone());
    let unchanged_for = match seen {
        Some(s) if s.record == record => s.since.elapsed(),
        _ => {
            *seen = Some(Seen {
                record,
                since: tokio::time::Instant::now(),
            });
            std::time::Duration::ZERO
        }
    };
    let duration = std::time::Duration::from_secs(
        u64::try_from(current.lease_duration_seconds.unwrap_or(15)).unwrap_or(15),
    );
    if !ours && !holder.is_empty() && unchanged_for < duration {
        return Ok(Err(holder));
    }
    let transitions = current.lease_transitions.unwrap_or(0) + i32::from(!ours);
    let acquired = if ours {
        current.acquire_time.map_or(now, |t| t.0)
    } else {
        now
    };
    lease.spec = Some(spec(e, acquired, now, transitions));
    match api.replace(&e.name, &PostParams::default(), &lease).await {
        Ok(l) => Ok(Ok(l)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Err(holder)),
        Err(err) => Err(err),
    }
}

fn spec(e: &Election, acquired: Timestamp, renewed: Timestamp, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(e.identity.clone()),
        lease_duration_seconds: Some(i32::try_from(e.lease_duration.as_secs()).unwrap_or(15)),
        acquire_time: Some(MicroTime(acquired)),
        renew_time: Some(MicroTime(renewed)),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

/// Renews `lease` every `retry_period` until leadership is lost; returns why. A renewal
/// that has not succeeded by the time the lease would expire (less one retry period, so a
/// successor never overlaps) ends leadership.
pub async fn hold(api: &Api<Lease>, e: &Election, mut lease: Lease) -> Lost {
    let mut last_renewed = tokio::time::Instant::now();
    let deadline_after = e.lease_duration.saturating_sub(e.retry_period);
    loop {
        tokio::time::sleep(e.retry_period).await;
        let now = Timestamp::now();
        let mut next = lease.clone();
        if let Some(s) = next.spec.as_mut() {
            s.renew_time = Some(MicroTime(now));
        }
        let remaining = deadline_after.saturating_sub(last_renewed.elapsed());
        let result = tokio::time::timeout(
            remaining,
            api.replace(&e.name, &PostParams::default(), &next),
        )
        .await;
        match result {
            Ok(Ok(l)) => {
                lease = l;
                last_renewed = tokio::time::Instant::now();
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                // Someone wrote the lease: read who holds it now.
                match api.get_opt(&e.name).await {
                    Ok(Some(l)) => {
                        let holder = l
                            .spec
                            .as_ref()
                            .and_then(|s| s.holder_identity.clone())
                            .unwrap_or_default();
                        if holder != e.identity {
                            return Lost::TakenBy(e.name.clone(), holder);
                        }
                        lease = l;
                    }
                    Ok(None) => return Lost::TakenBy(e.name.clone(), "nobody (deleted)".into()),
                    Err(err) => tracing::warn!(lease = %e.name, "leader election: {err}"),
                }
            }
            Ok(Err(err)) => {
                tracing::warn!(lease = %e.name, "leader election: renewal failed: {err}")
            }
            Err(_) => {}
        }
        if last_renewed.elapsed() >= deadline_after {
            return Lost::Expired(
                e.name.clone(),
                format!("no successful renewal in {deadline_after:?}"),
            );
        }
    }
}

/// Gives the lease up at shutdown so a successor need not wait for it to expire.
pub async fn release(api: &Api<Lease>, e: &Election) {
    if let Ok(Some(mut lease)) = api.get_opt(&e.name).await
        && lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(e.identity.as_str())
    {
        if let Some(s) = lease.spec.as_mut() {
            s.holder_identity = None;
            s.renew_time = None;
        }
        let _ = api.replace(&e.name, &PostParams::default(), &lease).await;
    }
}
