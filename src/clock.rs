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

    /// The time in RFC 3339, UTC, to the millisecond (`2026-11-27T07:05:09.123Z`).
    pub(crate) fn rfc3339(self) -> String {
        let secs = self.secs();
        let (days, in_day) = (secs / 86_400, secs % 86_400);
        // Days since 1970-01-01 to a civil date (Howard Hinnant's `civil_from_days`).
        let z = days + 719_468;
        let era = z / 146_097;
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + u64::from(month <= 2);
        format!(
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
            in_day / 3_600,
            in_day / 60 % 60,
            in_day % 60,
            self.0 / 1_000 % 1_000
        )
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
pub(crate) fn system_time() -> SystemTime {
    SystemTime::now()
}

/// [`system_time`] as nanoseconds since the Unix epoch (0 before it, which is a broken host;
/// the maximum after 2554), as OTLP carries times and [`SystemClock`] reads them.
pub(crate) fn unix_nanos() -> u64 {
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

#[cfg(test)]
mod tests {
    use super::Timestamp;

    #[test]
    fn rfc3339_is_the_utc_date_and_time() {
        let at = |secs: u64, micros: u64| Timestamp::from_micros(secs * 1_000_000 + micros);
        assert_eq!(at(0, 0).rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 0).rfc3339(), "2000-02-29T00:00:00.000Z");
        assert_eq!(
            at(1_795_764_309, 123_999).rfc3339(),
            "2026-11-27T07:25:09.123Z"
        );
        assert_eq!(
            at(4_102_444_799, 999_999).rfc3339(),
            "2099-12-31T23:59:59.999Z"
        );
    }
}
