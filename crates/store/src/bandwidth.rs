//! A rate limit on a store's transfers (`--bandwidth`, `spec.bandwidth`, a copy's
//! `bandwidth`): one clock shared by every transfer that holds it.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A rate limit shared by every transfer that holds it: each chunk reserves its share of
/// time on one clock, so parallel transfers together stay within the rate.
#[derive(Debug)]
pub struct Bandwidth {
    bytes_per_second: u64,
    /// When the bytes reserved so far have been paid for.
    next: Mutex<Option<Instant>>,
}

/// How far ahead of the clock a transfer may run (a burst): one second's worth.
const BURST: Duration = Duration::from_secs(1);

impl Bandwidth {
    pub fn new(rate: &tidemark_core::rate::Rate) -> Self {
        Bandwidth {
            bytes_per_second: rate.bytes_per_second().max(1),
            next: Mutex::new(None),
        }
    }

    pub fn bytes_per_second(&self) -> u64 {
        self.bytes_per_second
    }

    /// Waits until `bytes` more may go.
    pub async fn take(&self, bytes: u64) {
        let wait = self.reserve(bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Reserves `bytes` on the clock; returns how long to wait before they go.
    pub fn reserve(&self, bytes: u64) -> Duration {
        #[allow(clippy::cast_precision_loss)]
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_second as f64);
        let Ok(mut next) = self.next.lock() else {
            return Duration::ZERO;
        };
        let now = Instant::now();
        let floor = now.checked_sub(BURST).unwrap_or(now);
        let start = next.map_or(now, |n| n.max(floor));
        let end = start + cost;
        *next = Some(end);
        end.saturating_duration_since(now).saturating_sub(BURST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_limit_holds_parallel_transfers_to_one_rate() {
        let rate: tidemark_core::rate::Rate = "1MiB/s".parse().unwrap();
        let limit = std::sync::Arc::new(Bandwidth::new(&rate));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let l = limit.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    l.take(256 << 10).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // 10 MiB at 1 MiB/s, less the one-second burst.
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(8) && took <= Duration::from_secs(10),
            "{took:?}"
        );
    }
}
