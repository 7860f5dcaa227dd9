//! Sending to an OpenTelemetry collector: one client for both OTLP transports, the span
//! batcher that drains the [`super::Tracer`]'s queue, and the periodic metrics export.
//!
//! Exports never touch the request path. A failed export (collector down, refused, too slow)
//! loses its batch, is counted, and logs at warn at most once a minute; the next batch is tried
//! as usual.
//!
//! An `https` endpoint gets TLS (rustls on ring) with the endpoint's [`crate::tls::ClientTls`]:
//! tonic's client TLS for gRPC, a hyper-rustls connector for HTTP. A `http` endpoint goes
//! through the plain connector, as before.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::TokioExecutor;
use prost::Message;
use tokio::sync::mpsc;
use tonic_prost::ProstCodec;

use super::proto::{self, KeyValue};
use super::trace::{SpanCounters, SpanRecord, Value};
use super::{Endpoint, MetricsExportOptions, Protocol, TracingOptions};
use crate::clock::unix_nanos;
use crate::telemetry::LogLimiter;
use crate::telemetry::limits::LabelSet;
use crate::telemetry::limits::{KEY_FAMILY, LIMIT_FAMILY, limit_report};
use crate::telemetry::prometheus::{Extra, limit_series};
use crate::telemetry::stats::{LATENCY_BUCKETS, LimitCounters, Stats};

/// The largest collector answer read (its body is only checked for a status).
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// A connection to one collector endpoint, over OTLP/gRPC or OTLP/HTTP.
pub struct OtlpClient {
    endpoint: Endpoint,
    transport: Transport,
}

enum Transport {
    Grpc(tonic::client::Grpc<tonic::transport::Channel>),
    /// Boxed: one client per exporter, and it is by far the larger variant.
    Http(Box<HttpTransport<HttpConnector>>),
    Https(Box<HttpTransport<HttpsConnector<HttpConnector>>>),
}

struct HttpTransport<C> {
    client: Client<C, Full<Bytes>>,
    uri: hyper::Uri,
}

impl OtlpClient {
    /// Must be called inside a tokio runtime. Connects lazily: a collector that is down is
    /// only noticed by the first export.
    ///
    /// With an `https` URL the TLS config is built here: the system's roots are read now
    /// when no CA was given, and an empty trust store is an error.
    pub fn new(endpoint: &Endpoint) -> Result<Self, String> {
        let uri: hyper::Uri = endpoint
            .url
            .parse()
            .map_err(|e| format!("{}: {e}", endpoint.url))?;
        let tls = match uri.scheme_str() {
            Some("https") => Some(endpoint.tls.clone().unwrap_or_default()),
            _ => None,
        };
        let transport = match endpoint.protocol {
            Protocol::Grpc => {
                let mut channel = tonic::transport::Endpoint::from_shared(endpoint.url.clone())
                    .map_err(|e| format!("{}: {e}", endpoint.url))?
                    .connect_timeout(endpoint.timeout);
                if let Some(tls) = &tls {
                    channel = channel
                        .tls_config(tls.tonic_config())
                        .map_err(|e| format!("{}: TLS setup: {e}", endpoint.url))?;
                }
                Transport::Grpc(tonic::client::Grpc::new(channel.connect_lazy()))
            }
            Protocol::Http => {
                let mut connector = HttpConnector::new();
                connector.set_connect_timeout(Some(endpoint.timeout));
                connector.set_nodelay(true);
                let builder = Client::builder(TokioExecutor::new());
                match &tls {
                    None => Transport::Http(Box::new(HttpTransport {
                        client: builder.build(connector),
                        uri,
                    })),
                    Some(tls) => {
                        // The https URI goes to the plain connector inside the TLS one.
                        connector.enforce_http(false);
                        let config = tls
                            .rustls_config()
                            .map_err(|e| format!("{}: {e}", endpoint.url))?;
                        let https = hyper_rustls::HttpsConnectorBuilder::new()
                            .with_tls_config(config)
                            .https_only()
                            .enable_http1()
                            .wrap_connector(connector);
                        Transport::Https(Box::new(HttpTransport {
                            client: builder.build(https),
                            uri,
                        }))
                    }
                }
            }
        };
        Ok(OtlpClient {
            endpoint: endpoint.clone(),
            transport,
        })
    }

    /// Sends one Export request; `grpc_path` is the collector service's method. Bounded by
    /// the endpoint's timeout.
    pub async fn export<Req, Resp>(
        &mut self,
        grpc_path: &'static str,
        msg: Req,
    ) -> Result<(), String>
    where
        Req: Message + Send + Sync + 'static,
        Resp: Message + Default + Send + 'static,
    {
        let timeout = self.endpoint.timeout;
        let headers = &self.endpoint.headers;
        let call = async {
            match &mut self.transport {
                Transport::Grpc(grpc) => {
                    grpc.ready()
                        .await
                        .map_err(|e| with_causes("collector not ready", &e))?;
                    let mut request = tonic::Request::new(msg);
                    for (k, v) in headers {
                        if let (Ok(k), Ok(v)) = (
                            tonic::metadata::MetadataKey::from_bytes(k.as_bytes()),
                            tonic::metadata::MetadataValue::try_from(v.as_str()),
                        ) {
                            request.metadata_mut().insert(k, v);
                        }
                    }
                    grpc.unary(
                        request,
                        hyper::http::uri::PathAndQuery::from_static(grpc_path),
                        ProstCodec::<Req, Resp>::default(),
                    )
                    .await
                    .map(|_| ())
                    .map_err(|s| format!("collector answered {:?}: {}", s.code(), s.message()))
                }
                Transport::Http(http) => http.post(headers, msg.encode_to_vec()).await,
                Transport::Https(https) => https.post(headers, msg.encode_to_vec()).await,
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(format!("collector did not answer within {timeout:?}")),
        }
    }
}

impl<C> HttpTransport<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// One OTLP/HTTP export: POST the protobuf body, succeed on a 2xx.
    async fn post(&self, headers: &[(String, String)], body: Vec<u8>) -> Result<(), String> {
        let mut request = hyper::Request::post(self.uri.clone())
            .header(hyper::header::CONTENT_TYPE, "application/x-protobuf");
        for (k, v) in headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("cannot build the request: {e}"))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| with_causes("cannot reach the collector", &e))?;
        let status = response.status();
        // Read (a bounded amount of) the answer so the connection can be reused.
        let body = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if status.is_success() {
            Ok(())
        } else {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            Err(format!("collector answered HTTP {status}: {text}"))
        }
    }
}

/// `what: error: cause: cause...`. hyper's and tonic's errors say little more than
/// "client error (Connect)" or "transport error"; the reason (refused, a certificate from
/// an unknown issuer) is in their sources, and the warn line should carry it.
fn with_causes(what: &str, e: &dyn std::error::Error) -> String {
    let mut text = format!("{what}: {e}");
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn attribute(key: &'static str, value: Value) -> KeyValue {
    match value {
        Value::Str(s) => KeyValue::string(key, s),
        Value::Static(s) => KeyValue::string(key, s),
        Value::Int(i) => KeyValue::int(key, i),
        Value::Bool(b) => KeyValue::bool(key, b),
    }
}

/// A span record as OTLP has it. Every exported span is sampled (flag 01).
pub(crate) fn span_to_proto(r: SpanRecord) -> proto::Span {
    let remote = if r.remote_parent {
        proto::SPAN_FLAGS_CONTEXT_IS_REMOTE
    } else {
        0
    };
    proto::Span {
        trace_id: r.trace_id.to_vec(),
        span_id: r.span_id.to_vec(),
        trace_state: r.trace_state,
        parent_span_id: if r.parent_span_id == [0; 8] {
            Vec::new()
        } else {
            r.parent_span_id.to_vec()
        },
        flags: 1 | proto::SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE | remote,
        name: r.name.to_owned(),
        kind: r.kind as i32,
        start_time_unix_nano: r.start_unix_nanos,
        end_time_unix_nano: r.end_unix_nanos,
        attributes: r
            .attributes
            .into_iter()
            .map(|(k, v)| attribute(k, v))
            .collect(),
        dropped_attributes_count: 0,
        status: r.error.map(|message| proto::Status {
            message,
            code: proto::STATUS_CODE_ERROR,
        }),
    }
}

/// One Export request for a batch of spans.
pub(crate) fn traces_request(
    resource: &proto::Resource,
    spans: impl Iterator<Item = SpanRecord>,
) -> proto::ExportTraceServiceRequest {
    proto::ExportTraceServiceRequest {
        resource_spans: vec![proto::ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![proto::ScopeSpans {
                scope: Some(scope()),
                spans: spans.map(span_to_proto).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// Drains the tracer's queue into batches of up to OTEL_BSP_MAX_EXPORT_BATCH_SIZE, sent when
/// full or OTEL_BSP_SCHEDULE_DELAY after their first span. When `stop` completes, what is
/// queued is sent once more and the task ends.
pub(crate) async fn run_span_exporter(
    options: TracingOptions,
    mut rx: mpsc::Receiver<SpanRecord>,
    counters: Arc<SpanCounters>,
    stop: impl Future<Output = ()>,
) {
    let mut client = match OtlpClient::new(&options.endpoint) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "tracing disabled: bad OTLP endpoint");
            return;
        }
    };
    let resource = resource(&options.resource);
    let failures = LogLimiter::new(Duration::from_secs(60));
    let max_batch = options.max_batch_size.max(1);
    let mut batch: Vec<SpanRecord> = Vec::with_capacity(max_batch);
    tokio::pin!(stop);
    let mut stopping = false;
    while !stopping {
        tokio::select! {
            span = rx.recv() => match span {
                Some(s) => batch.push(s),
                None => stopping = true,
            },
            _ = &mut stop => stopping = true,
        }
        let deadline = tokio::time::Instant::now() + options.schedule_delay;
        while !stopping && batch.len() < max_batch {
            tokio::select! {
                span = tokio::time::timeout_at(deadline, rx.recv()) => match span {
                    Ok(Some(s)) => batch.push(s),
                    Ok(None) => stopping = true,
                    Err(_) => break,
                },
                _ = &mut stop => stopping = true,
            }
        }
        if stopping {
            while let Ok(s) = rx.try_recv() {
                batch.push(s);
            }
        }
        while !batch.is_empty() {
            let n = batch.len().min(max_batch);
            let request = traces_request(&resource, batch.drain(..n));
            let sent = client
                .export::<_, proto::ExportTraceServiceResponse>(proto::TRACE_EXPORT_PATH, request)
                .await;
            record_export(
                &sent,
                n as u64,
                &counters.exported,
                &counters.export_failures,
            );
            if let Err(e) = sent
                && let Some(suppressed) = failures.check()
            {
                tracing::warn!(
                    endpoint = %options.endpoint.url,
                    error = %e,
                    spans = n,
                    suppressed,
                    "could not export spans (at most one line a minute)"
                );
            }
        }
    }
}

fn record_export(sent: &Result<(), String>, n: u64, ok: &AtomicU64, failed: &AtomicU64) {
    match sent {
        Ok(()) => ok.fetch_add(n, Ordering::Relaxed),
        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
    };
}

fn sum(name: &str, description: &str, points: Vec<NumberPoint>, span: (u64, u64)) -> proto::Metric {
    proto::Metric {
        name: name.to_owned(),
        description: description.to_owned(),
        unit: String::new(),
        data: Some(proto::metric::Data::Sum(proto::Sum {
            data_points: points
                .into_iter()
                .map(|(attributes, v)| proto::NumberDataPoint {
                    attributes,
                    start_time_unix_nano: span.0,
                    time_unix_nano: span.1,
                    flags: 0,
                    value: Some(proto::number_data_point::Value::AsInt(
                        i64::try_from(v).unwrap_or(i64::MAX),
                    )),
                })
                .collect(),
            aggregation_temporality: proto::TEMPORALITY_CUMULATIVE,
            is_monotonic: true,
        })),
    }
}

type NumberPoint = (Vec<KeyValue>, u64);

fn gauge(name: &str, description: &str, points: Vec<NumberPoint>, now: u64) -> proto::Metric {
    proto::Metric {
        name: name.to_owned(),
        description: description.to_owned(),
        unit: String::new(),
        data: Some(proto::metric::Data::Gauge(proto::Gauge {
            data_points: points
                .into_iter()
                .map(|(attributes, v)| proto::NumberDataPoint {
                    attributes,
                    start_time_unix_nano: 0,
                    time_unix_nano: now,
                    flags: 0,
                    value: Some(proto::number_data_point::Value::AsInt(
                        i64::try_from(v).unwrap_or(i64::MAX),
                    )),
                })
                .collect(),
        })),
    }
}

/// The metrics of the Prometheus exposition (the Go service's names; see
/// [`crate::telemetry::prometheus`]) as cumulative OTLP sums and one explicit-bucket
/// histogram, read from the same counters. `start` is when the counters started (nanoseconds
/// since the epoch).
pub(crate) fn metrics_request(
    resource: &proto::Resource,
    stats: &Stats,
    extra: &Extra,
    start: u64,
) -> proto::ExportMetricsServiceRequest {
    let t = (start, unix_nanos());
    let mut metrics = limit_metrics(stats, t);
    metrics.extend(limit_gauge_metrics(stats, extra, t.1));
    metrics.extend(call_metrics(stats, extra, t));
    metrics.push(latency_metric(stats, t));
    proto::ExportMetricsServiceRequest {
        resource_metrics: vec![proto::ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![proto::ScopeMetrics {
                scope: Some(scope()),
                metrics,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// A per-limit series' attributes: `domain`, then `key1` and `key2` when the key has them.
fn series_attrs((domain, key1, key2): &LabelSet) -> Vec<KeyValue> {
    let mut attrs = vec![KeyValue::string("domain", domain.as_str())];
    if let Some(k) = key1 {
        attrs.push(KeyValue::string("key1", k.as_str()));
    }
    if let Some(k) = key2 {
        attrs.push(KeyValue::string("key2", k.as_str()));
    }
    attrs
}

/// `ratelimit_service_rate_limit_<stat>{domain, key1, key2}`, one sum per stat, each with the
/// series its stat applies to, as the exposition has them ([`LimitCounters::applies`]).
fn limit_metrics(stats: &Stats, t: (u64, u64)) -> Vec<proto::Metric> {
    let series = limit_series(stats);
    let mut metrics = Vec::new();
    for (i, stat) in LimitCounters::NAMES.iter().enumerate() {
        let points = series
            .iter()
            .filter(|(_, values)| LimitCounters::applies(values, i))
            .map(|(labels, values)| (series_attrs(labels), values[i]))
            .collect();
        metrics.push(sum(
            &format!("ratelimit_service_rate_limit_{stat}"),
            "Per-limit hits, with envoyproxy/ratelimit's arithmetic.",
            points,
            t,
        ));
    }
    metrics
}

/// The configured limits beside the per-limit series, as the exposition has them
/// ([`crate::telemetry::limits`]): the limit gauge per series and limit, the window gauge per
/// limit.
fn limit_gauge_metrics(stats: &Stats, extra: &Extra, now: u64) -> Vec<proto::Metric> {
    let report = limit_report(stats, &extra.limits);
    let keys = report
        .keys
        .iter()
        .map(|((labels, limit), key)| {
            let mut attrs = series_attrs(labels);
            attrs.push(KeyValue::string("limit", limit.as_str()));
            attrs.push(KeyValue::string("counters", key.counters()));
            (attrs, key.requests_per_unit)
        })
        .collect();
    let limits = report
        .limits
        .iter()
        .map(|(limit, shape)| {
            let mut attrs = vec![KeyValue::string("limit", limit.as_str())];
            attrs.extend(
                shape
                    .labels()
                    .into_iter()
                    .map(|(k, v)| KeyValue::string(k, v.as_str())),
            );
            (attrs, shape.window_secs())
        })
        .collect();
    let [(key_name, key_help), (limit_name, limit_help)] = [KEY_FAMILY, LIMIT_FAMILY];
    vec![
        gauge(key_name, key_help, keys, now),
        gauge(limit_name, limit_help, limits, now),
    ]
}

fn method() -> Vec<KeyValue> {
    vec![KeyValue::string("grpc_method", "ShouldRateLimit")]
}

/// Unknown domains, failed and all calls, config loads, shadow mode, folded records and the
/// tracer's counters.
fn call_metrics(stats: &Stats, extra: &Extra, t: (u64, u64)) -> Vec<proto::Metric> {
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let mut metrics = Vec::new();
    let mut not_found = stats.domains_not_found();
    not_found.sort();
    metrics.push(sum(
        "ratelimit_service_rate_limit_domain_not_found",
        "Requests for a domain no config declares.",
        not_found
            .into_iter()
            .map(|(d, n)| (vec![KeyValue::string("domain", d)], n))
            .collect(),
        t,
    ));
    let svc = &stats.service;
    let errors = |kind: &str, value| (vec![KeyValue::string("err_type", kind)], value);
    metrics.push(sum(
        "ratelimit_service_should_rate_limit_error",
        "ShouldRateLimit calls that failed.",
        vec![
            errors("redis_error", load(&svc.redis_error)),
            errors("service_error", load(&svc.service_error)),
        ],
        t,
    ));
    metrics.push(sum(
        "ratelimit_service_total_requests",
        "ShouldRateLimit calls.",
        vec![(method(), svc.total_requests.get())],
        t,
    ));
    for (name, description, value) in [
        (
            "ratelimit_service_config_load_success",
            "Config loads and reloads that succeeded.",
            extra.config_load_success,
        ),
        (
            "ratelimit_service_config_load_error",
            "Config loads and reloads that failed.",
            extra.config_load_error,
        ),
        (
            "ratelimit_service_global_shadow_mode",
            "OVER_LIMIT answers turned OK by SHADOW_MODE.",
            load(&svc.global_shadow_mode),
        ),
        (
            "sluice_stats_folded",
            "Records folded into the _overflow_ series.",
            load(&svc.folded),
        ),
    ] {
        metrics.push(sum(name, description, vec![(Vec::new(), value)], t));
    }
    for (name, description, value) in &extra.tracing {
        metrics.push(sum(name, description, vec![(Vec::new(), *value)], t));
    }
    metrics
}

/// The decision-latency histogram. OTLP bucket counts are per bucket (not cumulative), one
/// more than the bounds.
fn latency_metric(stats: &Stats, (start, now): (u64, u64)) -> proto::Metric {
    let h = stats.response_time.snapshot();
    let mut bucket_counts = Vec::with_capacity(LATENCY_BUCKETS.len() + 1);
    let mut previous = 0;
    for (_, cumulative) in &h.buckets {
        bucket_counts.push(cumulative - previous);
        previous = *cumulative;
    }
    bucket_counts.push(h.count - previous);
    proto::Metric {
        name: "ratelimit_service_response_time_seconds".to_owned(),
        description: "Time to decide a ShouldRateLimit call.".to_owned(),
        unit: "s".to_owned(),
        data: Some(proto::metric::Data::Histogram(proto::Histogram {
            data_points: vec![proto::HistogramDataPoint {
                attributes: method(),
                start_time_unix_nano: start,
                time_unix_nano: now,
                count: h.count,
                sum: Some(h.sum_secs),
                bucket_counts,
                explicit_bounds: LATENCY_BUCKETS.to_vec(),
                flags: 0,
            }],
            aggregation_temporality: proto::TEMPORALITY_CUMULATIVE,
        })),
    }
}

/// Every OTEL_METRIC_EXPORT_INTERVAL, exports the metrics; once more when `stop` completes.
pub(crate) async fn run_metrics_exporter(
    options: MetricsExportOptions,
    stats: Arc<Stats>,
    extra: impl Fn() -> Extra,
    stop: impl Future<Output = ()>,
) {
    let mut client = match OtlpClient::new(&options.endpoint) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "OTLP metrics disabled: bad endpoint");
            return;
        }
    };
    let start = unix_nanos();
    let resource = resource(&options.resource);
    let failures = LogLimiter::new(Duration::from_secs(60));
    let mut ticker = tokio::time::interval(options.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; the first export comes one interval in.
    ticker.tick().await;
    tokio::pin!(stop);
    loop {
        let last = tokio::select! {
            _ = ticker.tick() => false,
            _ = &mut stop => true,
        };
        let request = metrics_request(&resource, &stats, &extra(), start);
        let sent = client
            .export::<_, proto::ExportMetricsServiceResponse>(proto::METRICS_EXPORT_PATH, request)
            .await;
        if let Err(e) = sent
            && let Some(suppressed) = failures.check()
        {
            tracing::warn!(
                endpoint = %options.endpoint.url,
                error = %e,
                suppressed,
                "could not export metrics (at most one line a minute)"
            );
        }
        if last {
            return;
        }
    }
}

/// The resource every export names: OTEL_RESOURCE_ATTRIBUTES and the service's own.
fn resource(attrs: &[(String, String)]) -> proto::Resource {
    proto::Resource {
        attributes: attrs
            .iter()
            .map(|(k, v)| proto::KeyValue::string(k.as_str(), v.as_str()))
            .collect(),
        dropped_attributes_count: 0,
    }
}

/// The instrumentation scope of everything Sluice exports.
fn scope() -> proto::InstrumentationScope {
    proto::InstrumentationScope {
        name: super::SCOPE_NAME.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::stats::ErrorKind;

    #[test]
    fn histogram_buckets_are_per_bucket_and_counters_cumulative() {
        let stats = Stats::default();
        stats.request_done(Duration::from_micros(10), None);
        stats.request_done(Duration::from_micros(70), None);
        stats.request_done(Duration::from_secs(5), Some(ErrorKind::Backend));
        let r = metrics_request(&proto::Resource::default(), &stats, &Extra::default(), 1);
        let metrics = &r.resource_metrics[0].scope_metrics[0].metrics;
        let find = |n: &str| metrics.iter().find(|m| m.name == n).unwrap();
        let Some(proto::metric::Data::Histogram(h)) =
            &find("ratelimit_service_response_time_seconds").data
        else {
            panic!("histogram")
        };
        let p = &h.data_points[0];
        assert_eq!(p.count, 3);
        assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
        assert_eq!(p.bucket_counts.iter().sum::<u64>(), 3);
        assert_eq!(p.bucket_counts[0], 1);
        assert_eq!(*p.bucket_counts.last().unwrap(), 1);
        let Some(proto::metric::Data::Sum(s)) = &find("ratelimit_service_total_requests").data
        else {
            panic!("sum")
        };
        assert_eq!(s.aggregation_temporality, proto::TEMPORALITY_CUMULATIVE);
        assert!(s.is_monotonic);
        assert_eq!(
            s.data_points[0].value,
            Some(proto::number_data_point::Value::AsInt(3))
        );
    }

    #[test]
    fn each_limit_series_has_its_limit_and_each_limit_its_window() {
        use crate::limiter::{Algorithm, Unit};
        use crate::telemetry::limits::LimitShape;
        use crate::telemetry::stats::{KeySource, Outcome};
        let stats = Stats::default();
        let outcome = Outcome::admitted(1, 7);
        stats.record_dynamic("d.tenant_a", KeySource::Limit("d.tenant_a"), &outcome);
        let shape = LimitShape {
            requests_per_unit: 7,
            unit: Unit::Hour,
            unit_multiplier: 3,
            algorithm: Algorithm::SlidingWindow,
            one_counter: true,
        };
        let extra = Extra {
            limits: std::sync::Arc::new([("d.tenant_a".into(), shape)].into_iter().collect()),
            ..Extra::default()
        };
        let r = metrics_request(&proto::Resource::default(), &stats, &extra, 1);
        let metrics = &r.resource_metrics[0].scope_metrics[0].metrics;
        let point = |n: &str| {
            let m = metrics.iter().find(|m| m.name == n).expect(n);
            let Some(proto::metric::Data::Gauge(g)) = &m.data else {
                panic!("{n} is a gauge")
            };
            assert_eq!(g.data_points.len(), 1, "{n}");
            let p = &g.data_points[0];
            let attrs: Vec<String> = p.attributes.iter().map(|a| a.key.clone()).collect();
            (attrs, p.value)
        };
        let int = |v| Some(proto::number_data_point::Value::AsInt(v));
        let labels = ["domain", "key1", "limit", "counters"].map(str::to_owned);
        assert_eq!(
            point("ratelimit_service_rate_limit_limit"),
            (labels.to_vec(), int(7))
        );
        let labels = ["limit", "unit", "unit_multiplier", "algorithm"].map(str::to_owned);
        assert_eq!(
            point("sluice_rate_limit_window_seconds"),
            (labels.to_vec(), int(3 * 3600))
        );
        // No refund and no slot: those sums have no point, as the exposition has no series.
        let points = |n: &str| {
            let m = metrics.iter().find(|m| m.name == n).expect(n);
            let Some(proto::metric::Data::Sum(s)) = &m.data else {
                panic!("{n} is a sum")
            };
            s.data_points.len()
        };
        assert_eq!(points("ratelimit_service_rate_limit_total_hits"), 1);
        assert_eq!(
            points("ratelimit_service_rate_limit_total_negative_hits"),
            0
        );
        assert_eq!(points("ratelimit_service_rate_limit_slots_taken"), 0);
    }
}
