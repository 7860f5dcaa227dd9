//! OpenTelemetry over OTLP, written for Sluice instead of taken from the `opentelemetry` SDK
//! (whose trace feature would add a second `rand` to the lock file, and whose `tracing` layer
//! costs more per request than a rate-limit decision):
//!
//! - [`proto`]: the OTLP messages, as prost derives.
//! - [`propagation`]: the caller's context from `traceparent` / `tracestate` and B3 headers.
//! - [`trace`]: the [`Tracer`]: parent-based sampling, span records pushed into a bounded
//!   queue (dropped and counted when full; the request path never waits).
//! - [`export`]: the OTLP/gRPC and OTLP/HTTP (protobuf) clients, the span batcher, and the
//!   periodic metrics export built from [`super::Stats`].
//!
//! Settings come from the Go service's TRACING_* variables and the standard OTEL_* ones, see
//! [`crate::settings`]. `https` endpoints use rustls on ring (tonic's for gRPC, hyper-rustls
//! for HTTP) with the OTEL_EXPORTER_OTLP_CERTIFICATE / _CLIENT_CERTIFICATE / _CLIENT_KEY files,
//! read and checked at start-up through [`crate::tls`].

pub mod export;
pub(crate) mod propagation;
pub mod proto;
pub(crate) mod trace;

use std::fmt;
use std::time::Duration;

use crate::tls::ClientTls;
pub use propagation::{RequestTrace, SpanContext, Transport};
pub use trace::Tracer;

/// How an OTLP exporter talks to its collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`).
    Http,
    /// OTLP/gRPC.
    Grpc,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
        }
    }
}

/// One exporter's destination. Its debug output names the headers but never their values,
/// which hold API keys and bearer tokens.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub protocol: Protocol,
    /// `http(s)://host:port/v1/traces` (HTTP: the full URL) or `http(s)://host:port` (gRPC).
    /// TLS exactly when the scheme is `https`.
    pub url: String,
    /// With an `https` URL: the CA to trust and the client certificate to present
    /// (OTEL_EXPORTER_OTLP_CERTIFICATE, _CLIENT_CERTIFICATE, _CLIENT_KEY and their per-signal
    /// forms), already read and checked. `None`: the system's roots, no client certificate.
    /// Not used with an `http` URL.
    pub tls: Option<ClientTls>,
    /// OTEL_EXPORTER_OTLP_HEADERS and the signal's own; names lower case.
    pub headers: Vec<(String, String)>,
    /// OTEL_EXPORTER_OTLP_TIMEOUT: each export's deadline.
    pub timeout: Duration,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(name, _)| (name.as_str(), "<redacted>"))
            .collect();
        f.debug_struct("Endpoint")
            .field("protocol", &self.protocol)
            .field("url", &self.url)
            .field("tls", &self.tls)
            .field("headers", &headers)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Validated tracing settings (TRACING_ENABLED and friends).
#[derive(Clone, Debug, PartialEq)]
pub struct TracingOptions {
    pub endpoint: Endpoint,
    /// TRACING_SAMPLING_RATE: the share of root spans (no sampled-or-not parent) sampled.
    pub sampling_rate: f64,
    /// service.name, service.namespace, service.instance.id and OTEL_RESOURCE_ATTRIBUTES.
    pub resource: Vec<(String, String)>,
    /// OTEL_BSP_MAX_QUEUE_SIZE: finished spans waiting for export; more are dropped.
    pub max_queue_size: usize,
    /// OTEL_BSP_MAX_EXPORT_BATCH_SIZE.
    pub max_batch_size: usize,
    /// OTEL_BSP_SCHEDULE_DELAY: the longest a span waits for its batch to fill.
    pub schedule_delay: Duration,
}

/// Validated OTLP metrics settings (OTEL_METRICS_EXPORTER=otlp).
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsExportOptions {
    pub endpoint: Endpoint,
    /// OTEL_METRIC_EXPORT_INTERVAL.
    pub interval: Duration,
    pub resource: Vec<(String, String)>,
}

/// The instrumentation scope of everything Sluice exports.
pub(crate) const SCOPE_NAME: &str = "sluice";

/// A random version-4 UUID, for TRACING_SERVICE_INSTANCE_ID when it is empty (as in Go).
pub(crate) fn random_uuid() -> String {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&trace::random_u64().to_be_bytes());
    b[8..].copy_from_slice(&trace::random_u64().to_be_bytes());
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = propagation::hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuids_are_version_4_and_differ() {
        let a = super::random_uuid();
        let b = super::random_uuid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }

    #[test]
    fn an_endpoint_never_prints_its_header_values() {
        let endpoint = super::Endpoint {
            protocol: super::Protocol::Http,
            url: "https://collector:4318/v1/traces".into(),
            tls: None,
            headers: vec![("authorization".into(), "Bearer s3cret".into())],
            timeout: std::time::Duration::from_secs(1),
        };
        let debug = format!("{endpoint:?}");
        assert!(debug.contains("authorization"), "{debug}");
        assert!(!debug.contains("s3cret"), "{debug}");
    }
}
