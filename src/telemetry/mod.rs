//! Telemetry: metrics, logs, and the bounds that keep both cheap.
//!
//! - [`observer`]: [`DecisionTelemetry`], the decision's observer
//!   ([`crate::service::observe::Observer`]): what the service reports becomes the stats, spans
//!   and logs below; the service itself knows none of their formats.
//! - [`stats`]: the counters (envoyproxy/ratelimit's per-limit stats and arithmetic, service
//!   counters, the decision-latency histogram) with a hard cap on distinct keys.
//! - [`limits`]: the configured limits beside the per-limit series (requests_per_unit per
//!   series, the window, unit and algorithm once per limit), looked up in the config loaded
//!   when the exporters read it.
//! - [`prometheus`]: the text exposition served at `/metrics`: per stats key only the stats
//!   that apply to its limit (`stats::LimitCounters::applies`), which the OTLP metrics follow.
//! - [`statsd`]: counter increases pushed to a statsd server (USE_STATSD).
//! - [`otlp`]: OpenTelemetry: spans of `ShouldRateLimit` and its backend calls (TRACING_ENABLED)
//!   and the metrics above (OTEL_METRICS_EXPORTER=otlp), exported over OTLP.
//! - Logs: `tracing` to stderr, configured by LOG_LEVEL and LOG_FORMAT. Nothing on the request
//!   path logs at the default level (WARN) per request; failures that can repeat per request go
//!   through a [`LogLimiter`].

pub mod limits;
mod logs;
pub(crate) mod observer;
pub mod otlp;
pub mod prometheus;
pub mod stats;
pub mod statsd;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::clock;

pub(crate) use logs::{LogFormat, LogLevel};
pub use observer::DecisionTelemetry;
pub use stats::{Stats, StatsOptions};

/// What [`crate::app::App`] needs to know about telemetry.
#[derive(Clone, Debug, PartialEq)]
pub struct TelemetryOptions {
    pub stats: StatsOptions,
    /// PROMETHEUS_PATH: where the USE_PROMETHEUS listener serves the exposition.
    pub prometheus_path: String,
    /// USE_STATSD: where to push counters, and how often (STATS_FLUSH_INTERVAL).
    pub statsd: Option<(std::net::SocketAddr, Duration)>,
    /// TRACING_ENABLED: spans exported over OTLP.
    pub tracing: Option<otlp::TracingOptions>,
    /// OTEL_METRICS_EXPORTER=otlp: metrics pushed over OTLP.
    pub otlp_metrics: Option<otlp::MetricsExportOptions>,
}

impl Default for TelemetryOptions {
    fn default() -> Self {
        TelemetryOptions {
            stats: StatsOptions::default(),
            prometheus_path: "/metrics".to_owned(),
            statsd: None,
            tracing: None,
            otlp_metrics: None,
        }
    }
}

/// Installs the global subscriber, writing to stderr; `colour`: ANSI colours and dimming in
/// text lines, for a terminal only (a log collector stores escape codes as they are). Safe to
/// call once per process.
pub fn init_logs(level: LogLevel, format: LogFormat, colour: bool) {
    let level: tracing::Level = level.into();
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    // A second call (tests) keeps the first subscriber; that is fine.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Lets one log line through per interval and counts the ones it holds back, so a failure that
/// hits every request (a backend down) logs once a second, not ten thousand times.
#[derive(Debug)]
pub(crate) struct LogLimiter {
    interval_nanos: u64,
    /// Nanoseconds since [`process_start`] of the last line let through, plus one (0: never).
    last: AtomicU64,
    suppressed: AtomicU64,
}

fn process_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(clock::instant)
}

impl LogLimiter {
    pub(crate) fn new(interval: Duration) -> Self {
        let _ = process_start();
        LogLimiter {
            interval_nanos: u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines held back since the last one)` when a line may be logged now, else `None`
    /// (and the line is counted as held back).
    pub(crate) fn check(&self) -> Option<u64> {
        self.check_at(clock::instant())
    }

    fn check_at(&self, now: Instant) -> Option<u64> {
        let now = u64::try_from(now.saturating_duration_since(process_start()).as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < self.interval_nanos {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // One winner per interval; the losers count as held back.
        if self
            .last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

/// A [`LogLimiter`] per key (a limit), for a line worth logging once per limit per interval:
/// at most `max_keys` keys have their own; the lines of further keys share one.
#[derive(Debug)]
pub(crate) struct KeyedLogLimiter {
    interval: Duration,
    keys: dashmap::DashMap<Box<str>, LogLimiter, foldhash::fast::RandomState>,
    max_keys: usize,
    rest: LogLimiter,
}

impl KeyedLogLimiter {
    pub(crate) fn new(interval: Duration, max_keys: usize) -> Self {
        KeyedLogLimiter {
            interval,
            keys: dashmap::DashMap::default(),
            max_keys,
            rest: LogLimiter::new(interval),
        }
    }

    /// [`LogLimiter::check`] for `key`'s lines.
    pub(crate) fn check(&self, key: &str) -> Option<u64> {
        if let Some(l) = self.keys.get(key) {
            return l.check();
        }
        if self.keys.len() >= self.max_keys {
            return self.rest.check();
        }
        self.keys
            .entry(Box::from(key))
            .or_insert_with(|| LogLimiter::new(self.interval))
            .check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyed_limiter_lets_one_line_per_key_through_and_shares_one_past_its_keys() {
        let l = KeyedLogLimiter::new(Duration::from_secs(3600), 2);
        assert_eq!(l.check("a"), Some(0));
        assert_eq!(l.check("b"), Some(0));
        assert_eq!(l.check("a"), None);
        // Past two keys, the others share one limiter.
        assert_eq!(l.check("c"), Some(0));
        assert_eq!(l.check("d"), None);
        assert_eq!(l.keys.len(), 2);
    }

    #[test]
    fn log_limiter_lets_one_line_through_per_interval() {
        let l = LogLimiter::new(Duration::from_secs(1));
        let t0 = process_start() + Duration::from_secs(10);
        assert_eq!(l.check_at(t0), Some(0));
        assert_eq!(l.check_at(t0 + Duration::from_millis(10)), None);
        assert_eq!(l.check_at(t0 + Duration::from_millis(999)), None);
        assert_eq!(l.check_at(t0 + Duration::from_secs(1)), Some(2));
        assert_eq!(l.check_at(t0 + Duration::from_millis(1500)), None);
    }
}
