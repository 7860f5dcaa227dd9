//! The injected clock: the service reads time once per request and passes it down, so the
//! limiter stays a pure function and tests drive a [`ManualClock`] instead of sleeping.
//!
//! This is the only module that reads the system's clocks: clippy's `disallowed-methods`
//! (clippy.toml) refuses `Instant::now` and `SystemTime::now` everywhere else. Code that is not
//! handed a [`Clock`] reads [`instant`] (monotonic) or [`system_time`] (for times compared with
//! file timestamps or sent to other systems); code that waits on Tokio's timers reads
//! `tokio::time::Instant`, which a test can pause.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    /// Whole seconds since the epoch: the resolution of envoyproxy/ratelimit's windows.
    pub const fn secs(self) -> u64 {
        self.0 / 1_000_000
    }
}

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// Wall-clock time: what windows are aligned to.
    fn now(&self) -> Timestamp;
    /// A monotonic reading from an arbitrary origin, for measuring how long something took
    /// (a decision's latency); never goes back, unlike [`Clock::now`].
    fn monotonic(&self) -> Duration;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        // A clock before 1970 is a broken host; treat it as the epoch rather than panic.
        let micros = system_time()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros().min(u128::from(u64::MAX)) as u64)
            .unwrap_or(0);
        Timestamp(micros)
    }

    fn monotonic(&self) -> Duration {
        // The origin is the first reading in the process.
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        instant().saturating_duration_since(*ORIGIN.get_or_init(instant))
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

/// [`system_time`] as nanoseconds since the Unix epoch (0 before it), as OTLP carries times.
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
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }

    /// The manual time itself: it only moves forward when told to.
    fn monotonic(&self) -> Duration {
        Duration::from_micros(self.0.load(Ordering::SeqCst))
    }
}
