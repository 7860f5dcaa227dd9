//! Stats, Prometheus, statsd and logs (USE_PROMETHEUS, USE_STATSD, LOG_LEVEL, ...) into
//! [`TelemetryOptions`], [`LogLevel`] and [`LogFormat`]; the OpenTelemetry variables are
//! [`OtlpArgs`], flattened in, with their own validation in [`super::otlp`].

use std::net::{SocketAddr, ToSocketAddrs};

use clap::ArgAction;

use super::addrs::resolve_listener;
use super::otlp::OtlpArgs;
use super::parse::{non_zero, parse_go_bool, positive_go_duration};
use super::{SettingsError, invalid};
use crate::telemetry::{LogFormat, LogLevel, TelemetryOptions};

/// Accepts what logrus's `ParseLevel` accepts, so existing LOG_LEVEL values keep working.
pub(super) fn log_level(value: &str) -> Result<LogLevel, SettingsError> {
    match value.to_ascii_lowercase().as_str() {
        "trace" => Ok(LogLevel::Trace),
        "debug" => Ok(LogLevel::Debug),
        "info" => Ok(LogLevel::Info),
        "warn" | "warning" => Ok(LogLevel::Warn),
        "error" | "fatal" | "panic" => Ok(LogLevel::Error),
        _ => Err(invalid(
            "LOG_LEVEL",
            value,
            "expected trace, debug, info, warn, warning, error, fatal or panic",
        )),
    }
}

/// Go treats anything but `json` as text; Sluice refuses other values so a typo is not silent.
pub(super) fn log_format(value: &str) -> Result<LogFormat, SettingsError> {
    match value.to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(invalid("LOG_FORMAT", value, "expected text or json")),
    }
}

/// Metrics settings: envoyproxy/ratelimit's stats variables and Sluice's cap on stats keys, and
/// the OpenTelemetry export's.
#[derive(Clone, Debug, clap::Args)]
pub struct TelemetryArgs {
    /// Serve the Prometheus exposition on its own listener (PROMETHEUS_ADDR) as well as at
    /// /metrics on the debug port.
    #[arg(
        long,
        env = "USE_PROMETHEUS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Metrics"
    )]
    pub use_prometheus: bool,
    /// Address of the USE_PROMETHEUS listener, `host:port` or `:port`.
    #[arg(
        long,
        env = "PROMETHEUS_ADDR",
        default_value = ":9090",
        help_heading = "Metrics"
    )]
    pub prometheus_addr: String,
    /// Path of the exposition on the USE_PROMETHEUS listener.
    #[arg(
        long,
        env = "PROMETHEUS_PATH",
        default_value = "/metrics",
        help_heading = "Metrics"
    )]
    pub prometheus_path: String,
    /// Record no stats at all.
    #[arg(
        long,
        env = "DISABLE_STATS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Metrics"
    )]
    pub disable_stats: bool,
    /// Most distinct per-limit stats keys (and unknown domains) kept; records for new keys
    /// past it add up in one `_overflow_` series. A key costs 7 to 13 Prometheus series, by
    /// its limit (docs/telemetry.md#series-per-stats-key).
    #[arg(
        long,
        env = "SLUICE_MAX_STAT_KEYS",
        default_value_t = 10_000,
        help_heading = "Metrics"
    )]
    pub max_stat_keys: usize,
    /// Push counters to statsd over UDP (off by default in Sluice; on in the Go service).
    #[arg(
        long,
        env = "USE_STATSD",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Metrics"
    )]
    pub use_statsd: bool,
    /// The statsd server's host.
    #[arg(
        long,
        env = "STATSD_HOST",
        default_value = "localhost",
        help_heading = "Metrics"
    )]
    pub statsd_host: String,
    /// The statsd server's UDP port.
    #[arg(
        long,
        env = "STATSD_PORT",
        default_value_t = 8125,
        help_heading = "Metrics"
    )]
    pub statsd_port: u16,
    /// How often counters are pushed to statsd (Go duration).
    #[arg(
        long,
        env = "STATS_FLUSH_INTERVAL",
        default_value = "10s",
        help_heading = "Metrics"
    )]
    pub stats_flush_interval: String,

    // TRACING_* and OTEL_*: the OpenTelemetry export, validated in `super::otlp`.
    #[command(flatten)]
    pub otlp: OtlpArgs,
}

impl TelemetryArgs {
    pub(super) fn validate(
        &self,
        near_limit_ratio: f32,
    ) -> Result<TelemetryOptions, SettingsError> {
        let max_keys = non_zero("SLUICE_MAX_STAT_KEYS", self.max_stat_keys)?.get();
        if !self.prometheus_path.starts_with('/') {
            return Err(invalid(
                "PROMETHEUS_PATH",
                &self.prometheus_path,
                "must start with /",
            ));
        }
        let statsd = if self.use_statsd {
            let interval =
                positive_go_duration("STATS_FLUSH_INTERVAL", &self.stats_flush_interval, "10s")?;
            let addr = (self.statsd_host.as_str(), self.statsd_port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| invalid("STATSD_HOST", &self.statsd_host, "cannot be resolved"))?;
            Some((addr, interval))
        } else {
            None
        };
        let otlp = self.otlp.validate()?;
        Ok(TelemetryOptions {
            tracing: otlp.tracing,
            otlp_metrics: otlp.metrics,
            statsd,
            stats: crate::telemetry::StatsOptions {
                enabled: !self.disable_stats,
                near_limit_ratio,
                max_keys,
                // CompatArgs's, set by the caller.
                response_time_in_millis: false,
            },
            prometheus_path: self.prometheus_path.clone(),
        })
    }

    /// USE_PROMETHEUS: where the exposition gets its own listener. Go's `:9090` means every
    /// interface.
    pub(super) fn prometheus_addr(&self) -> Result<Option<SocketAddr>, SettingsError> {
        if !self.use_prometheus {
            return Ok(None);
        }
        let (host, port) = self.prometheus_addr.rsplit_once(':').ok_or_else(|| {
            invalid(
                "PROMETHEUS_ADDR",
                &self.prometheus_addr,
                "expected host:port or :port",
            )
        })?;
        let port: u16 = port.parse().map_err(|_| {
            invalid(
                "PROMETHEUS_ADDR",
                &self.prometheus_addr,
                "the port is not a number",
            )
        })?;
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        resolve_listener("PROMETHEUS_ADDR", host, port).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::settings;
    use super::super::*;

    #[test]
    fn log_settings_accept_logrus_spellings() {
        let level = |l: &str| settings(&["--log-level", l]).map(|s| s.log_level);
        assert_eq!(level("TRACE").unwrap(), LogLevel::Trace);
        assert_eq!(level("debug").unwrap(), LogLevel::Debug);
        assert_eq!(level("Info").unwrap(), LogLevel::Info);
        assert_eq!(level("warning").unwrap(), LogLevel::Warn);
        assert_eq!(level("error").unwrap(), LogLevel::Error);
        assert_eq!(level("FATAL").unwrap(), LogLevel::Error);
        assert_eq!(level("panic").unwrap(), LogLevel::Error);
        assert!(
            level("loud")
                .unwrap_err()
                .to_string()
                .starts_with("LOG_LEVEL=loud:")
        );

        let format = |f: &str| settings(&["--log-format", f]).map(|s| s.log_format);
        assert_eq!(format("JSON").unwrap(), LogFormat::Json);
        assert_eq!(format("text").unwrap(), LogFormat::Text);
        assert_eq!(
            format("xml").unwrap_err().to_string(),
            "LOG_FORMAT=xml: expected text or json"
        );
    }
}
