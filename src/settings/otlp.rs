//! OpenTelemetry export (TRACING_* and the OTEL_* variables), [`OtlpArgs`] and their
//! validation: the exporters' protocols, endpoints, headers, TLS files, sampling and resource,
//! into [`crate::telemetry::otlp::TracingOptions`] and
//! [`crate::telemetry::otlp::MetricsExportOptions`]. TRACING_* wins over the matching OTEL_*
//! variable, which is a fallback, as in envoyproxy/ratelimit. [`super::TelemetryArgs`] flattens
//! them in.

use std::time::Duration;

use clap::ArgAction;

use super::parse::{Named, in_range, key_values, non_empty, non_zero, parse_go_bool, parsed};
use super::tls::key_pair_files;
use super::{SettingsError, header_name, invalid};
use crate::secret::Secret;
use crate::telemetry::otlp::{self, Endpoint, MetricsExportOptions, Protocol, TracingOptions};
use crate::tls::{ClientTls, KeyPairFiles, PemFile};

/// The OpenTelemetry export's settings, raw (TRACING_* and OTEL_*).
#[derive(Clone, Debug, clap::Args)]
pub struct OtlpArgs {
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
    pub otel_exporter_otlp_headers: Option<Secret>,
    /// Headers on trace exports, added to OTEL_EXPORTER_OTLP_HEADERS.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        hide_env_values = true,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_headers: Option<Secret>,
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
    pub otel_exporter_otlp_metrics_headers: Option<Secret>,
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

/// One value per signal: whether it exports, its protocol, headers, URL, TLS.
struct PerSignal<T> {
    traces: T,
    metrics: T,
}

/// One signal's TLS files: the CA to trust and the client certificate with its key.
struct TlsFiles {
    ca: Option<PemFile>,
    identity: Option<KeyPairFiles>,
}

/// The OTLP exporters that are on: traces, metrics, or neither.
pub(super) struct OtlpExports {
    pub(super) tracing: Option<TracingOptions>,
    pub(super) metrics: Option<MetricsExportOptions>,
}

/// OTEL_BSP_MAX_QUEUE_SIZE and OTEL_BSP_MAX_EXPORT_BATCH_SIZE (at most the queue).
struct BatchSizes {
    max_queue_size: usize,
    max_batch_size: usize,
}

impl OtlpArgs {
    /// The OpenTelemetry settings. TRACING_* wins over the matching OTEL_* variable, which is
    /// a fallback, as in envoyproxy/ratelimit. Syntax is checked even when nothing exports,
    /// so a typo shows before someone turns tracing on.
    pub(super) fn validate(&self) -> Result<OtlpExports, SettingsError> {
        let on = self.signals()?;
        let protocol = self.protocols()?;
        let sampling_rate = self.sampling_rate()?;
        let resource = self.resource()?;
        let headers = self.headers()?;
        if self.otel_exporter_otlp_timeout == 0 {
            return Err(invalid(
                "OTEL_EXPORTER_OTLP_TIMEOUT",
                0,
                "must be at least 1 (milliseconds)",
            ));
        }
        let timeout = Duration::from_millis(self.otel_exporter_otlp_timeout);
        let url = PerSignal {
            traces: self.endpoint_url(
                Named::new(
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    &self.otel_exporter_otlp_traces_endpoint,
                ),
                "/v1/traces",
                protocol.traces,
                self.otel_exporter_otlp_traces_insecure,
            )?,
            metrics: self.endpoint_url(
                Named::new(
                    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                    &self.otel_exporter_otlp_metrics_endpoint,
                ),
                "/v1/metrics",
                protocol.metrics,
                self.otel_exporter_otlp_metrics_insecure,
            )?,
        };
        let (traces_files, metrics_files) = (self.traces_tls_files()?, self.metrics_tls_files()?);
        let tls = PerSignal {
            traces: client_tls(on.traces, &url.traces, traces_files)?,
            metrics: client_tls(on.metrics, &url.metrics, metrics_files)?,
        };
        let batch = self.batch_sizes()?;
        let tracing = on.traces.then(|| TracingOptions {
            endpoint: Endpoint {
                protocol: protocol.traces,
                url: url.traces,
                tls: tls.traces,
                headers: headers.traces,
                timeout,
            },
            sampling_rate,
            resource: resource.clone(),
            max_queue_size: batch.max_queue_size,
            max_batch_size: batch.max_batch_size,
            schedule_delay: Duration::from_millis(self.otel_bsp_schedule_delay),
        });
        let metrics = on.metrics.then(|| MetricsExportOptions {
            endpoint: Endpoint {
                protocol: protocol.metrics,
                url: url.metrics,
                tls: tls.metrics,
                headers: headers.metrics,
                timeout,
            },
            interval: Duration::from_millis(self.otel_metric_export_interval),
            resource,
        });
        Ok(OtlpExports { tracing, metrics })
    }

    /// Which signals export: TRACING_ENABLED (else OTEL_TRACES_EXPORTER=otlp) and
    /// OTEL_METRICS_EXPORTER=otlp, both off with OTEL_SDK_DISABLED.
    fn signals(&self) -> Result<PerSignal<bool>, SettingsError> {
        let none_or_otlp = |var: &'static str, v: &Option<String>| match v.as_deref() {
            None => Ok(false),
            Some(x) if x.eq_ignore_ascii_case("none") => Ok(false),
            Some(x) if x.eq_ignore_ascii_case("otlp") => Ok(true),
            Some(x) => Err(invalid(var, x, "expected otlp or none")),
        };
        let traces_exporter = none_or_otlp("OTEL_TRACES_EXPORTER", &self.otel_traces_exporter)?;
        let metrics_exporter = none_or_otlp("OTEL_METRICS_EXPORTER", &self.otel_metrics_exporter)?;
        Ok(PerSignal {
            traces: self.tracing_enabled.unwrap_or(traces_exporter) && !self.otel_sdk_disabled,
            metrics: metrics_exporter && !self.otel_sdk_disabled,
        })
    }

    /// The traces' and the metrics' protocols; the metrics' defaults to the traces'.
    fn protocols(&self) -> Result<PerSignal<Protocol>, SettingsError> {
        let traces = match (
            &self.tracing_exporter_protocol,
            &self.otel_exporter_otlp_protocol,
        ) {
            (Some(v), _) => protocol("TRACING_EXPORTER_PROTOCOL", v)?,
            (None, Some(v)) => protocol("OTEL_EXPORTER_OTLP_PROTOCOL", v)?,
            (None, None) => Protocol::Http,
        };
        let metrics = match &self.otel_exporter_otlp_metrics_protocol {
            Some(v) => protocol("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", v)?,
            None => traces,
        };
        Ok(PerSignal { traces, metrics })
    }

    /// TRACING_SAMPLING_RATE, else what OTEL_TRACES_SAMPLER (and _ARG) mean; 1 by default.
    fn sampling_rate(&self) -> Result<f64, SettingsError> {
        if let Some(r) = self.tracing_sampling_rate {
            return in_range("TRACING_SAMPLING_RATE", r, 0.0..=1.0);
        }
        let Some(sampler) = self.otel_traces_sampler.as_deref() else {
            return Ok(1.0);
        };
        match sampler.to_ascii_lowercase().as_str() {
            "always_on" | "parentbased_always_on" => Ok(1.0),
            "always_off" | "parentbased_always_off" => Ok(0.0),
            "traceidratio" | "parentbased_traceidratio" => {
                match self.otel_traces_sampler_arg.as_deref() {
                    None => Ok(1.0),
                    Some(arg) => parsed(
                        "OTEL_TRACES_SAMPLER_ARG",
                        arg,
                        |a| a.trim().parse().ok().filter(|r| (0.0..=1.0).contains(r)),
                        "must be a number between 0 and 1",
                    ),
                }
            }
            _ => Err(invalid(
                "OTEL_TRACES_SAMPLER",
                sampler,
                "expected always_on, always_off, traceidratio or their parentbased_ forms",
            )),
        }
    }

    /// The resource every span and metric carries: the service's name, namespace and
    /// instance (TRACING_SERVICE_*, else OTEL_SERVICE_NAME, else OTEL_RESOURCE_ATTRIBUTES),
    /// the other OTEL_RESOURCE_ATTRIBUTES, the version and the SDK.
    fn resource(&self) -> Result<Vec<(String, String)>, SettingsError> {
        let mut attrs = match &self.otel_resource_attributes {
            Some(v) => key_values("OTEL_RESOURCE_ATTRIBUTES", v)?,
            None => Vec::new(),
        };
        let mut take = |key: &str| {
            attrs
                .iter()
                .position(|(k, _)| k == key)
                .map(|i| attrs.remove(i).1)
        };
        let from_attrs = (
            take("service.name"),
            take("service.namespace"),
            take("service.instance.id"),
        );
        let non_empty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        let name = non_empty(&self.tracing_service_name)
            .or_else(|| non_empty(&self.otel_service_name))
            .or(from_attrs.0)
            .unwrap_or_else(|| "RateLimit".to_owned());
        let namespace = non_empty(&self.tracing_service_namespace).or(from_attrs.1);
        let instance = non_empty(&self.tracing_service_instance_id)
            .or(from_attrs.2)
            .unwrap_or_else(otlp::random_uuid);
        let mut resource = vec![("service.name".to_owned(), name)];
        if let Some(ns) = namespace {
            resource.push(("service.namespace".to_owned(), ns));
        }
        resource.push(("service.instance.id".to_owned(), instance));
        resource.extend(attrs);
        if !resource.iter().any(|(k, _)| k == "service.version") {
            resource.push((
                "service.version".to_owned(),
                env!("CARGO_PKG_VERSION").to_owned(),
            ));
        }
        resource.push(("telemetry.sdk.name".to_owned(), "sluice".to_owned()));
        resource.push(("telemetry.sdk.language".to_owned(), "rust".to_owned()));
        Ok(resource)
    }

    /// The traces' and the metrics' headers: the common OTEL_EXPORTER_OTLP_HEADERS, where the
    /// signal's own list does not set the same header.
    fn headers(&self) -> Result<PerSignal<Headers>, SettingsError> {
        let common = headers(
            "OTEL_EXPORTER_OTLP_HEADERS",
            &self.otel_exporter_otlp_headers,
        )?;
        let merge = |own: Headers| {
            let mut all: Headers = common
                .iter()
                .filter(|(k, _)| !own.iter().any(|(o, _)| o == k))
                .cloned()
                .collect();
            all.extend(own);
            all
        };
        let traces = merge(headers(
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            &self.otel_exporter_otlp_traces_headers,
        )?);
        let metrics = merge(headers(
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            &self.otel_exporter_otlp_metrics_headers,
        )?);
        Ok(PerSignal { traces, metrics })
    }

    /// A signal's URL: its own variable as is; else OTEL_EXPORTER_OTLP_ENDPOINT, with the
    /// signal's path on HTTP; else the collector's default on localhost. `insecure` is the
    /// signal's own OTEL_EXPORTER_OTLP_*_INSECURE, else the common one.
    fn endpoint_url(
        &self,
        own: Named<&Option<String>>,
        path: &str,
        protocol: Protocol,
        insecure: Option<bool>,
    ) -> Result<String, SettingsError> {
        let insecure = insecure
            .or(self.otel_exporter_otlp_insecure)
            .unwrap_or(false);
        Ok(match (own.value, &self.otel_exporter_otlp_endpoint) {
            (Some(u), _) => otlp_url(own.var, u, protocol, insecure)?,
            (None, Some(base)) => {
                let base = otlp_url("OTEL_EXPORTER_OTLP_ENDPOINT", base, protocol, insecure)?;
                match protocol {
                    Protocol::Http => format!("{}{path}", base.trim_end_matches('/')),
                    Protocol::Grpc => base,
                }
            }
            (None, None) => match protocol {
                Protocol::Http => format!("http://localhost:4318{path}"),
                Protocol::Grpc => "http://localhost:4317".to_owned(),
            },
        })
    }

    /// The traces' TLS files: pairs are checked always (a typo shows before export is turned
    /// on); the files are read by [`client_tls`] only when they will be used.
    fn traces_tls_files(&self) -> Result<TlsFiles, SettingsError> {
        otlp_tls_files(
            [
                Named::new(
                    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                    &self.otel_exporter_otlp_traces_certificate,
                ),
                Named::new(
                    "OTEL_EXPORTER_OTLP_CERTIFICATE",
                    &self.otel_exporter_otlp_certificate,
                ),
            ],
            [
                Named::new(
                    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                    &self.otel_exporter_otlp_traces_client_certificate,
                ),
                Named::new(
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    &self.otel_exporter_otlp_client_certificate,
                ),
            ],
            [
                Named::new(
                    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                    &self.otel_exporter_otlp_traces_client_key,
                ),
                Named::new(
                    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                    &self.otel_exporter_otlp_client_key,
                ),
            ],
        )
    }

    /// The metrics' TLS files, as [`Self::traces_tls_files`].
    fn metrics_tls_files(&self) -> Result<TlsFiles, SettingsError> {
        otlp_tls_files(
            [
                Named::new(
                    "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
                    &self.otel_exporter_otlp_metrics_certificate,
                ),
                Named::new(
                    "OTEL_EXPORTER_OTLP_CERTIFICATE",
                    &self.otel_exporter_otlp_certificate,
                ),
            ],
            [
                Named::new(
                    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",
                    &self.otel_exporter_otlp_metrics_client_certificate,
                ),
                Named::new(
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    &self.otel_exporter_otlp_client_certificate,
                ),
            ],
            [
                Named::new(
                    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
                    &self.otel_exporter_otlp_metrics_client_key,
                ),
                Named::new(
                    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                    &self.otel_exporter_otlp_client_key,
                ),
            ],
        )
    }

    /// OTEL_BSP_MAX_QUEUE_SIZE and _MAX_EXPORT_BATCH_SIZE (at most the queue), checked with
    /// the two export delays.
    fn batch_sizes(&self) -> Result<BatchSizes, SettingsError> {
        let queue = non_zero("OTEL_BSP_MAX_QUEUE_SIZE", self.otel_bsp_max_queue_size)?.get();
        let batch = non_zero(
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            self.otel_bsp_max_export_batch_size,
        )?
        .get();
        if self.otel_bsp_schedule_delay == 0 {
            return Err(invalid(
                "OTEL_BSP_SCHEDULE_DELAY",
                0,
                "must be at least 1 (milliseconds)",
            ));
        }
        if self.otel_metric_export_interval == 0 {
            return Err(invalid(
                "OTEL_METRIC_EXPORT_INTERVAL",
                0,
                "must be at least 1 (milliseconds)",
            ));
        }
        Ok(BatchSizes {
            max_queue_size: queue,
            max_batch_size: batch.min(queue),
        })
    }
}

type Headers = Vec<(String, String)>;

fn protocol(var: &'static str, v: &str) -> Result<Protocol, SettingsError> {
    match v.to_ascii_lowercase().as_str() {
        "http" | "http/protobuf" => Ok(Protocol::Http),
        "grpc" => Ok(Protocol::Grpc),
        "http/json" => Err(SettingsError::NotSupportedYet {
            var,
            value: v.to_owned(),
            reason: "OTLP/HTTP with JSON bodies (use http/protobuf or grpc)",
        }),
        _ => Err(invalid(var, v, "expected http (http/protobuf) or grpc")),
    }
}

/// One OTEL_EXPORTER_OTLP_*HEADERS list: lower-case names that are HTTP header names, and
/// values without control characters.
fn headers(var: &'static str, v: &Option<Secret>) -> Result<Headers, SettingsError> {
    let pairs = match v {
        Some(v) => key_values(var, v.expose())?,
        None => return Ok(Vec::new()),
    };
    pairs
        .into_iter()
        .map(|(k, v)| {
            let k = k.to_ascii_lowercase();
            header_name(var, k.clone())?;
            if v.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
                return Err(invalid(var, &k, "a header value holds a control character"));
            }
            Ok((k, v))
        })
        .collect()
}

/// A signal's TLS files, read and checked as every TLS client's are, when the signal is on and
/// its endpoint is `https`; with an `http` endpoint they are not used.
fn client_tls(used: bool, url: &str, files: TlsFiles) -> Result<Option<ClientTls>, SettingsError> {
    if used && url.starts_with("https://") {
        Ok(Some(ClientTls::from_files(files.ca, files.identity, None)?))
    } else {
        Ok(None)
    }
}

/// An OTLP endpoint as a URL: `http://` (plain text) or `https://` (TLS). Without a scheme,
/// `host:port` is `https://` for gRPC unless `insecure` (OTEL_EXPORTER_OTLP_INSECURE, which the
/// spec defines for exactly this case), and `http://` for OTLP/HTTP (whose endpoints the spec
/// requires to carry a scheme; Sluice has always read `host:port` as http there).
pub(super) fn otlp_url(
    var: &'static str,
    value: &str,
    protocol: Protocol,
    insecure: bool,
) -> Result<String, SettingsError> {
    let value = value.trim();
    let url = if value.contains("://") {
        value.to_owned()
    } else if protocol == Protocol::Grpc && !insecure {
        format!("https://{value}")
    } else {
        format!("http://{value}")
    };
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| invalid(var, value, format!("not a URL: {e}")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(invalid(var, value, "expected an http:// or https:// URL")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid(var, value, "no host"));
    }
    Ok(url)
}

/// The first of a signal's own variable and the common one that is set and not empty, with
/// its index in `vars`.
fn first_set(vars: [Named<&Option<String>>; 2]) -> Option<(usize, Named<&str>)> {
    vars.iter()
        .enumerate()
        .find_map(|(i, v)| non_empty(v.value.as_deref()).map(|value| (i, Named::new(v.var, value))))
}

/// One signal's OTLP TLS files, each variable given as `[own, common]` (the signal's own
/// wins). A client certificate needs its key and the other way round; the variable named as
/// missing is the one beside the one that is set.
fn otlp_tls_files(
    ca: [Named<&Option<String>>; 2],
    cert: [Named<&Option<String>>; 2],
    key: [Named<&Option<String>>; 2],
) -> Result<TlsFiles, SettingsError> {
    let ca = first_set(ca).map(|(_, set)| PemFile::new(set.var, set.value));
    let pair = match (first_set(cert), first_set(key)) {
        (None, None) => None,
        (Some((_, c)), Some((_, k))) => Some((c, k)),
        (Some((i, c)), None) => Some((c, Named::new(key[i].var, ""))),
        (None, Some((i, k))) => Some((Named::new(cert[i].var, ""), k)),
    };
    let identity = match pair {
        None => None,
        Some((c, k)) => key_pair_files(c, k)?,
    };
    Ok(TlsFiles { ca, identity })
}

#[cfg(test)]
mod tests;
