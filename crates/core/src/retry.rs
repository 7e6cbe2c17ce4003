//! The one retry backoff of Tidemark: exponential and capped, from backon's
//! `ExponentialBuilder` (the crate kube-runtime already builds), with jitter around it.
//! The engine's pauses between failed passes, the operator's requeues and the store's
//! retries of failed deletions all take their delays from here.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// The pause before the `attempt`-th retry in a row (1-based; 0 counts as 1): `first`,
/// doubling each time, at most `cap`.
pub fn delay(first: Duration, cap: Duration, attempt: u32) -> Duration {
    let steps = attempt.saturating_sub(1).min(63) as usize;
    let d = ExponentialBuilder::default()
        .with_min_delay(first)
        .with_max_delay(cap)
        .with_factor(2.0)
        .without_max_times()
        .build()
        .nth(steps)
        .unwrap_or(cap)
        .min(cap);
    // backon multiplies in f32: whole microseconds, as the pauses were written.
    Duration::from_micros(u64::try_from((d.as_nanos() + 500) / 1000).unwrap_or(u64::MAX))
}

/// `d` scaled by a random factor in `[1 - below, 1 + above]`: retries of objects or keys
/// that failed together do not come back together.
pub fn jitter(d: Duration, below: f64, above: f64) -> Duration {
    let factor = 1.0 - below + fastrand::f64() * (below + above);
    d.mul_f64(factor.max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_first_pause_up_to_the_cap() {
        let s = Duration::from_secs;
        let got: Vec<u64> = (1..=12).map(|n| delay(s(1), s(300), n).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(delay(s(1), s(300), 0), s(1));
        assert_eq!(delay(s(1), s(300), u32::MAX), s(300));
        let ms = Duration::from_millis;
        assert_eq!(delay(ms(200), ms(1600), 3), ms(800));
    }

    #[test]
    fn jitter_stays_in_its_band_and_varies() {
        let d = Duration::from_secs(10);
        let samples: Vec<Duration> = (0..200).map(|_| jitter(d, 0.1, 0.1)).collect();
        assert!(
            samples
                .iter()
                .all(|j| *j >= Duration::from_secs(9) && *j <= Duration::from_secs(11))
        );
        assert!(samples.iter().any(|j| *j != samples[0]), "no jitter at all");
        let up: Vec<Duration> = (0..200).map(|_| jitter(d, 0.0, 0.5)).collect();
        assert!(up.iter().all(|j| *j >= d && *j <= Duration::from_secs(15)));
    }
}
