//! Where `now` comes from: the pure core takes it as an argument, and the use cases ask a
//! [`Clock`] for it, so tests (and the operator's simulations) can supply their own.

use jiff::Timestamp;

pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}
