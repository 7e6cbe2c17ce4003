//! Prometheus metrics, and the `/metrics`, `/healthz` and `/readyz` endpoints.
//!
//! Labels are bounded: namespace and policy names (as many as there are policies), the
//! controller, and the engine's error class — never a backup-id or a message.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub namespace: String,
    pub policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassLabels {
    pub namespace: String,
    pub policy: String,
    /// `ok` or the error class.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: String,
    /// The engine's class: input, store, data, contention, source, internal…
    pub class: String,
}

/// Every metric the operator exports.
#[derive(Debug, Default)]
pub struct Metrics {
    pub retention_passes: Family<PassLabels, Counter>,
    pub objects_deleted: Family<PolicyLabels, Counter>,
    pub bytes_freed: Family<PolicyLabels, Counter>,
    pub recovery_window_seconds: Family<PolicyLabels, Gauge>,
    pub last_successful_backup: Family<PolicyLabels, Gauge>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Set once this replica has talked to the API server (readiness).
    pub ready: AtomicBool,
    /// 1 while this replica leads.
    pub leader: Gauge,
}

impl Metrics {
    /// A registry exposing these metrics.
    pub fn registry(self: &Arc<Self>) -> Registry {
        let mut r = Registry::with_prefix("tidemark");
        r.register(
            "retention_passes",
            "Retention passes, by policy and result",
            self.retention_passes.clone(),
        );
        r.register(
            "objects_deleted",
            "Objects deleted from the store by retention",
            self.objects_deleted.clone(),
        );
        r.register(
            "bytes_freed",
            "Bytes freed in the store by retention",
            self.bytes_freed.clone(),
        );
        r.register(
            "recovery_window_seconds",
            "Length of the recovery window after the last pass",
            self.recovery_window_seconds.clone(),
        );
        r.register(
            "last_successful_backup_timestamp_seconds",
            "Completion time of the newest completed Backup",
            self.last_successful_backup.clone(),
        );
        r.register(
            "reconcile_errors",
            "Failed reconciles, by controller and error class",
            self.reconcile_errors.clone(),
        );
        r.register(
            "reconciles",
            "Reconciles finished (successfully or not), by controller",
            self.reconciles.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the leader lease",
            self.leader.clone(),
        );
        r
    }

    pub fn policy(namespace: &str, policy: &str) -> PolicyLabels {
        PolicyLabels {
            namespace: namespace.to_owned(),
            policy: policy.to_owned(),
        }
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    let registry = Arc::new(metrics.registry());
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            let n =
                match tokio::time::timeout(std::time::Duration::from_secs(5), conn.read(&mut buf))
                    .await
                {
                    Ok(Ok(n)) => n,
                    _ => return,
                };
            let request = String::from_utf8_lossy(&buf[..n]);
            let path = request
                .lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .unwrap_or("/");
            let (code, body, kind) = match path {
                "/healthz" => ("200 OK", "ok\n".to_owned(), "text/plain"),
                "/readyz" if metrics.ready.load(Ordering::Relaxed) => {
                    ("200 OK", "ok\n".to_owned(), "text/plain")
                }
                "/readyz" => (
                    "503 Service Unavailable",
                    "the API server has not answered yet\n".to_owned(),
                    "text/plain",
                ),
                "/metrics" => {
                    let mut text = String::new();
                    match prometheus_client::encoding::text::encode(&mut text, &registry) {
                        Ok(()) => (
                            "200 OK",
                            text,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        ),
                        Err(_) => (
                            "500 Internal Server Error",
                            "encoding failed\n".to_owned(),
                            "text/plain",
                        ),
                    }
                }
                _ => ("404 Not Found", "not found\n".to_owned(), "text/plain"),
            };
            let response = format!(
                "HTTP/1.1 {code}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(response.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}
