//! The injected clock: the service reads time once per request and passes it down, so the
//! limiter stays a pure function and tests drive a [`ManualClock`] instead of sleeping.
//!
//! This is the only module that reads the system's clocks: clippy's `disallowed-methods`
//! (clippy.toml) refuses `Instant::now` and `SystemTime::now` everywhere else. Code that is not
//! handed a [`Clock`] reads [`instant`] (monotonic) or [`system_time`] (for times compared with
//! file timestamps or sent to other systems); code that waits on Tokio's timers reads
//! `tokio::time::Instant`, which a test can pause.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A point in time as microseconds since the Unix epoch. Windows are epoch-aligned, as in the
/// Go service, so wall-clock time (not a monotonic clock) is what the algorithms need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    pub const fn from_micros(micros: u64) -> Self {
        Timestamp(micros)
    }
    pub const fn from_secs(secs: u64) -> Self {
        Timestamp(secs.saturating_mul(1_000_000))
    }
    pub const fn micros(self) -> u64 {
        self.0
    }
    /// Nanoseconds since the epoch, truncated to the microsecond.
    pub const fn from_nanos(nanos: u64) -> Self {
        Timestamp(nanos / 1_000)
    }
    /// Whole seconds since the epoch: the resolution of envoyproxy/ratelimit's windows.
    pub const fn secs(self) -> u64 {
        self.0 / 1_000_000
    }
}

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// Wall-clock time in nanoseconds since the Unix epoch. A decision reads it once when it
    /// starts (its windows are aligned to it) and, when stats are on, once more when it ends,
    /// for its latency: one clock for both, so a decision reads the clock at most twice. The
    /// wall clock can be stepped; a latency measured across a step backwards reads 0, across a
    /// step forwards as long as the step.
    fn now_nanos(&self) -> u64;
    /// [`Clock::now_nanos`] to the microsecond.
    fn now(&self) -> Timestamp {
        Timestamp::from_nanos(self.now_nanos())
    }
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_nanos(&self) -> u64 {
        unix_nanos()
    }
}

/// Now on the system's monotonic clock. Not Tokio's: a caller that sleeps the thread (the
/// start-up config poll) would wait forever on a paused Tokio clock.
#[allow(
    clippy::disallowed_methods,
    reason = "the one place the monotonic clock is read"
)]
pub fn instant() -> Instant {
    Instant::now()
}

/// The system's wall clock, for times compared with file timestamps or sent to other systems
/// (OTLP). Rate-limit windows read [`Clock::now`] instead, so tests can drive them.
#[allow(
    clippy::disallowed_methods,
    reason = "the one place the wall clock is read"
)]
pub fn system_time() -> SystemTime {
    SystemTime::now()
}

/// [`system_time`] as nanoseconds since the Unix epoch (0 before it, which is a broken host;
/// the maximum after 2554), as OTLP carries times and [`SystemClock`] reads them.
pub fn unix_nanos() -> u64 {
    system_time()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A clock that only moves when told to; cheap to clone and share with the code under test.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start.micros())))
    }
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.micros(), Ordering::SeqCst);
    }
    pub fn advance_secs(&self, secs: u64) {
        self.0.fetch_add(secs * 1_000_000, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_nanos(&self) -> u64 {
        self.0.load(Ordering::SeqCst).saturating_mul(1_000)
    }
}
