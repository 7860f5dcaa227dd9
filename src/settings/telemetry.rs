//! Stats, Prometheus, statsd and logs (USE_PROMETHEUS, USE_STATSD, LOG_LEVEL, ...) into
//! [`TelemetryOptions`], [`LogLevel`] and [`LogFormat`]; the OpenTelemetry variables are
//! [`super::otlp`]'s.

use std::net::{SocketAddr, ToSocketAddrs};

use clap::ArgAction;

use super::parse::{non_zero, parse_go_bool, parse_go_duration};
use super::{SettingsError, invalid, resolve_listener};
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

/// Metrics settings: envoyproxy/ratelimit's stats variables and Sluice's cap on stats keys.
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
    /// past it add up in one `_overflow_` series.
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

    /// Export spans of ShouldRateLimit and its backend calls over OTLP. Unset: on when
    /// OTEL_TRACES_EXPORTER=otlp. OTEL_SDK_DISABLED=true turns it off either way.
    #[arg(
        long,
        env = "TRACING_ENABLED",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        help_heading = "Tracing"
    )]
    pub tracing_enabled: Option<bool>,
    /// service.name. Default: OTEL_SERVICE_NAME, else `service.name` in
    /// OTEL_RESOURCE_ATTRIBUTES, else RateLimit.
    #[arg(long, env = "TRACING_SERVICE_NAME", help_heading = "Tracing")]
    pub tracing_service_name: Option<String>,
    /// service.namespace. Default: `service.namespace` in OTEL_RESOURCE_ATTRIBUTES.
    #[arg(long, env = "TRACING_SERVICE_NAMESPACE", help_heading = "Tracing")]
    pub tracing_service_namespace: Option<String>,
    /// service.instance.id. Default: `service.instance.id` in OTEL_RESOURCE_ATTRIBUTES, else
    /// a random UUID.
    #[arg(long, env = "TRACING_SERVICE_INSTANCE_ID", help_heading = "Tracing")]
    pub tracing_service_instance_id: Option<String>,
    /// `http` (OTLP/HTTP, protobuf) or `grpc`. Default: OTEL_EXPORTER_OTLP_PROTOCOL, else http.
    #[arg(long, env = "TRACING_EXPORTER_PROTOCOL", help_heading = "Tracing")]
    pub tracing_exporter_protocol: Option<String>,
    /// Share of root spans (calls without a caller trace context) sampled, 0 to 1; a caller's
    /// sampled flag is followed. Default: OTEL_TRACES_SAMPLER(_ARG), else 1.
    #[arg(long, env = "TRACING_SAMPLING_RATE", help_heading = "Tracing")]
    pub tracing_sampling_rate: Option<f64>,
    /// `otlp` turns tracing on when TRACING_ENABLED is unset; `none` leaves it off.
    #[arg(long, env = "OTEL_TRACES_EXPORTER", help_heading = "Tracing")]
    pub otel_traces_exporter: Option<String>,
    /// `true` turns tracing and OTLP metrics off whatever else says.
    #[arg(
        long,
        env = "OTEL_SDK_DISABLED",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        default_value = "false",
        help_heading = "Tracing"
    )]
    pub otel_sdk_disabled: bool,
    /// always_on, always_off, traceidratio and their parentbased_ forms (all parent-based here);
    /// read when TRACING_SAMPLING_RATE is unset.
    #[arg(long, env = "OTEL_TRACES_SAMPLER", help_heading = "Tracing")]
    pub otel_traces_sampler: Option<String>,
    /// The ratio of a traceidratio sampler.
    #[arg(long, env = "OTEL_TRACES_SAMPLER_ARG", help_heading = "Tracing")]
    pub otel_traces_sampler_arg: Option<String>,
    /// service.name when TRACING_SERVICE_NAME is unset.
    #[arg(long, env = "OTEL_SERVICE_NAME", help_heading = "Tracing")]
    pub otel_service_name: Option<String>,
    /// Resource attributes, `key=value,key2=value2` (values percent-decoded).
    #[arg(long, env = "OTEL_RESOURCE_ATTRIBUTES", help_heading = "Tracing")]
    pub otel_resource_attributes: Option<String>,
    /// `grpc`, `http/protobuf` (`http/json` is not supported).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_PROTOCOL", help_heading = "Tracing")]
    pub otel_exporter_otlp_protocol: Option<String>,
    /// The collector's base URL, `http(s)://host:port`; HTTP appends /v1/traces and /v1/metrics.
    /// `host:port`: https for gRPC (http with OTEL_EXPORTER_OTLP_INSECURE=true), http for HTTP.
    /// Default: http://localhost:4318 (http) or http://localhost:4317 (grpc).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", help_heading = "Tracing")]
    pub otel_exporter_otlp_endpoint: Option<String>,
    /// The traces URL, used as is; wins over OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_endpoint: Option<String>,
    /// Headers on every export, `key=value,key2=value2` (values percent-decoded).
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_HEADERS",
        hide_env_values = true,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_headers: Option<String>,
    /// Headers on trace exports, added to OTEL_EXPORTER_OTLP_HEADERS.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        hide_env_values = true,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_headers: Option<String>,
    /// Deadline of each export, in milliseconds.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TIMEOUT",
        default_value_t = 10_000,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_timeout: u64,
    /// Longest a finished span waits for its batch, in milliseconds.
    #[arg(
        long,
        env = "OTEL_BSP_SCHEDULE_DELAY",
        default_value_t = 5_000,
        help_heading = "Tracing"
    )]
    pub otel_bsp_schedule_delay: u64,
    /// Finished spans waiting for export; past it, spans are dropped (and counted).
    #[arg(
        long,
        env = "OTEL_BSP_MAX_QUEUE_SIZE",
        default_value_t = 2_048,
        help_heading = "Tracing"
    )]
    pub otel_bsp_max_queue_size: usize,
    /// Most spans in one export.
    #[arg(
        long,
        env = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        default_value_t = 512,
        help_heading = "Tracing"
    )]
    pub otel_bsp_max_export_batch_size: usize,
    /// `otlp` pushes the metrics over OTLP as well; `none` (the default) does not.
    #[arg(long, env = "OTEL_METRICS_EXPORTER", help_heading = "Tracing")]
    pub otel_metrics_exporter: Option<String>,
    /// How often metrics are pushed, in milliseconds.
    #[arg(
        long,
        env = "OTEL_METRIC_EXPORT_INTERVAL",
        default_value_t = 60_000,
        help_heading = "Tracing"
    )]
    pub otel_metric_export_interval: u64,
    /// The metrics URL, used as is; wins over OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_endpoint: Option<String>,
    /// Headers on metrics exports, added to OTEL_EXPORTER_OTLP_HEADERS.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        hide_env_values = true,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_headers: Option<String>,
    /// Protocol of metrics exports. Default: the traces' protocol.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_protocol: Option<String>,
    /// PEM CA certificate(s) an `https` collector's certificate must chain to (only
    /// those). Default: the system's roots.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_certificate: Option<String>,
    /// PEM client certificate (chain) presented to an `https` collector (mTLS); needs
    /// OTEL_EXPORTER_OTLP_CLIENT_KEY.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_client_certificate: Option<String>,
    /// PEM private key of OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_client_key: Option<String>,
    /// `true`: a gRPC endpoint without a scheme (`host:port`) is plain text rather than
    /// TLS. No effect on `http://` and `https://` URLs, nor on OTLP/HTTP. Default: false.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_INSECURE",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_insecure: Option<bool>,
    /// OTEL_EXPORTER_OTLP_CERTIFICATE for traces exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_certificate: Option<String>,
    /// OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE for traces exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_client_certificate: Option<String>,
    /// OTEL_EXPORTER_OTLP_CLIENT_KEY for traces exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_client_key: Option<String>,
    /// OTEL_EXPORTER_OTLP_INSECURE for traces exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_insecure: Option<bool>,
    /// OTEL_EXPORTER_OTLP_CERTIFICATE for metrics exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_certificate: Option<String>,
    /// OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE for metrics exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_client_certificate: Option<String>,
    /// OTEL_EXPORTER_OTLP_CLIENT_KEY for metrics exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_client_key: Option<String>,
    /// OTEL_EXPORTER_OTLP_INSECURE for metrics exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_INSECURE",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_insecure: Option<bool>,
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
            let interval = parse_go_duration(&self.stats_flush_interval)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    invalid(
                        "STATS_FLUSH_INTERVAL",
                        &self.stats_flush_interval,
                        "expected a positive Go duration such as 10s",
                    )
                })?;
            let addr = (self.statsd_host.as_str(), self.statsd_port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| invalid("STATSD_HOST", &self.statsd_host, "cannot be resolved"))?;
            Some((addr, interval))
        } else {
            None
        };
        let (tracing, otlp_metrics) = self.otlp()?;
        Ok(TelemetryOptions {
            tracing,
            otlp_metrics,
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
