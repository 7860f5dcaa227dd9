//! OpenTelemetry end to end: Sluice on port 0 exports to a collector inside the test (a tonic
//! server implementing the OTLP trace and metrics Export methods, or an axum server for
//! OTLP/HTTP), decoded with Sluice's own OTLP types; the same collectors behind TLS (tonic's
//! server TLS, or axum over Sluice's own TLS listener, `sluice::net`) with certificates from a test CA.
//! Loopback only; every wait is bounded.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as PbEntry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use prost::Message;
use sluice::app::AppOptions;
use sluice::config::ConfigHandle;
use sluice::telemetry::otlp::proto::{
    self, ExportMetricsServiceRequest, ExportMetricsServiceResponse, ExportTraceServiceRequest,
    ExportTraceServiceResponse, any_value, metric, number_data_point,
};
use sluice::telemetry::otlp::{Endpoint, MetricsExportOptions, Protocol, TracingOptions};
use sluice::tls::ClientTls;
use sluice_test_support::app::{default_options, start_with};
use sluice_test_support::http::http_async;
use sluice_test_support::{app, pki, process};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;
use tonic_prost::ProstCodec;

const CONFIG: &str = r#"
domain: test
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

fn config() -> ConfigHandle {
    app::config_from_yaml(CONFIG)
}

/// What a collector received.
#[derive(Clone, Default)]
struct Received {
    traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    /// `x-tenant` header values, one per export.
    tenants: Arc<Mutex<Vec<String>>>,
}

impl Received {
    fn spans(&self) -> Vec<proto::Span> {
        self.traces
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| ss.spans.clone())
            .collect()
    }

    fn resource(&self) -> Vec<proto::KeyValue> {
        self.traces.lock().unwrap()[0].resource_spans[0]
            .resource
            .clone()
            .unwrap()
            .attributes
    }

    async fn wait_for_spans(&self, n: usize) -> Vec<proto::Span> {
        let start = Instant::now();
        loop {
            let spans = self.spans();
            if spans.len() >= n {
                return spans;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "collector got {} spans, expected {n}",
                spans.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn string_attr(attrs: &[proto::KeyValue], key: &str) -> Option<String> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            _ => None,
        }
    })
}

fn int_attr(attrs: &[proto::KeyValue], key: &str) -> Option<i64> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::IntValue(i) => Some(*i),
            _ => None,
        }
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The OTLP/gRPC collector: one tonic service per collector service name.
#[derive(Clone)]
struct TraceCollector(Received);
#[derive(Clone)]
struct MetricsCollector(Received);

impl NamedService for TraceCollector {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}
impl NamedService for MetricsCollector {
    const NAME: &'static str = "opentelemetry.proto.collector.metrics.v1.MetricsService";
}

macro_rules! collector_service {
    ($ty:ident, $req:ty, $resp:ty, $field:ident, $path:expr) => {
        impl<B> Service<http::Request<B>> for $ty
        where
            B: tonic::codegen::Body + Send + 'static,
            B::Error: Into<tonic::codegen::StdError> + Send + 'static,
        {
            type Response = http::Response<Body>;
            type Error = Infallible;
            type Future = BoxFuture<Self::Response, Self::Error>;

            fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, req: http::Request<B>) -> Self::Future {
                let received = self.0.clone();
                if req.uri().path() != $path {
                    return Box::pin(async { Ok(tonic::Status::unimplemented("no").into_http()) });
                }
                if let Some(t) = req.headers().get("x-tenant") {
                    received
                        .tenants
                        .lock()
                        .unwrap()
                        .push(t.to_str().unwrap().to_owned());
                }
                struct Export(Received);
                impl tonic::server::UnaryService<$req> for Export {
                    type Response = $resp;
                    type Future = BoxFuture<tonic::Response<$resp>, tonic::Status>;
                    fn call(&mut self, request: tonic::Request<$req>) -> Self::Future {
                        self.0.$field.lock().unwrap().push(request.into_inner());
                        Box::pin(async { Ok(tonic::Response::new(<$resp>::default())) })
                    }
                }
                Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(ProstCodec::<$resp, $req>::default());
                    Ok(grpc.unary(Export(received), req).await)
                })
            }
        }
    };
}

collector_service!(
    TraceCollector,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
    traces,
    proto::TRACE_EXPORT_PATH
);
collector_service!(
    MetricsCollector,
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
    metrics,
    proto::METRICS_EXPORT_PATH
);

async fn grpc_collector() -> (SocketAddr, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let server = tonic::transport::Server::builder()
        .add_service(TraceCollector(received.clone()))
        .add_service(MetricsCollector(received.clone()))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);
    (addr, received)
}

/// The OTLP/HTTP collector's routes: POST /v1/traces and /v1/metrics with protobuf bodies.
fn http_router(received: Received) -> axum::Router {
    use axum::extract::State;
    use axum::http::HeaderMap;
    use axum::routing::post;
    let tenant = |r: &Received, h: &HeaderMap| {
        assert_eq!(
            h.get("content-type").unwrap(),
            "application/x-protobuf",
            "OTLP/HTTP protobuf"
        );
        if let Some(t) = h.get("x-tenant") {
            r.tenants
                .lock()
                .unwrap()
                .push(t.to_str().unwrap().to_owned());
        }
    };
    axum::Router::new()
        .route(
            "/v1/traces",
            post(
                move |State(r): State<Received>, h: HeaderMap, body: axum::body::Bytes| async move {
                    tenant(&r, &h);
                    let req = ExportTraceServiceRequest::decode(body).unwrap();
                    r.traces.lock().unwrap().push(req);
                    ExportTraceServiceResponse::default().encode_to_vec()
                },
            ),
        )
        .route(
            "/v1/metrics",
            post(
                move |State(r): State<Received>, h: HeaderMap, body: axum::body::Bytes| async move {
                    tenant(&r, &h);
                    let req = ExportMetricsServiceRequest::decode(body).unwrap();
                    r.metrics.lock().unwrap().push(req);
                    ExportMetricsServiceResponse::default().encode_to_vec()
                },
            ),
        )
        .with_state(received)
}

/// The OTLP/HTTP collector, plain text.
async fn http_collector() -> (SocketAddr, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let router = http_router(received.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (addr, received)
}

// ---------------------------------------------------------------------------------------------
// Collectors behind TLS.

fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// A rustls server config for a collector: `leaf`'s certificate, and with `client_ca` a
/// required client certificate from that CA. No ALPN: an OTLP/HTTP client offers http/1.1.
fn collector_tls(leaf: &pki::Leaf, client_ca: Option<&std::path::Path>) -> rustls::ServerConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_file_iter(&leaf.cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&leaf.key).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).unwrap() {
                roots.add(cert.unwrap()).unwrap();
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder.with_single_cert(chain, key).unwrap()
}

/// The OTLP/HTTP collector over TLS with `leaf`'s certificate (and a required client
/// certificate from `client_ca`).
async fn https_collector(
    leaf: &pki::Leaf,
    client_ca: Option<&std::path::Path>,
) -> (SocketAddr, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(collector_tls(leaf, client_ca)));
    let received = Received::default();
    let router = http_router(received.clone());
    // Served by Sluice's own listener code, with TLS.
    let port = sluice::net::Port::http("collector", &Default::default()).with_tls(Some(acceptor));
    tokio::spawn(port.serve(listener, router, std::future::pending()));
    (addr, received)
}

/// The OTLP/gRPC collector over TLS: tonic's server TLS with `leaf`'s certificate (and a
/// required client certificate from `client_ca`).
async fn grpcs_collector(
    leaf: &pki::Leaf,
    client_ca: Option<&std::path::Path>,
) -> (SocketAddr, Received) {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut tls =
        ServerTlsConfig::new().identity(Identity::from_pem(read(&leaf.cert), read(&leaf.key)));
    if let Some(ca) = client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca)));
    }
    let received = Received::default();
    let server = tonic::transport::Server::builder()
        .tls_config(tls)
        .unwrap()
        .add_service(TraceCollector(received.clone()))
        .add_service(MetricsCollector(received.clone()))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);
    (addr, received)
}

/// A TLS collector that completes no handshake it is offered: it counts the handshakes that
/// failed (the client refused its certificate) and serves nothing.
async fn refused_handshakes(leaf: &pki::Leaf) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(collector_tls(leaf, None)));
    let failed = Arc::new(AtomicUsize::new(0));
    let counter = failed.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (acceptor, counter) = (acceptor.clone(), counter.clone());
            tokio::spawn(async move {
                let handshake =
                    tokio::time::timeout(Duration::from_secs(5), acceptor.accept(socket)).await;
                if !matches!(handshake, Ok(Ok(_))) {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    (addr, failed)
}

fn url_for(protocol: Protocol, scheme: &str, addr: SocketAddr, signal: &str) -> String {
    match protocol {
        Protocol::Grpc => format!("{scheme}://{addr}"),
        Protocol::Http => format!("{scheme}://{addr}/v1/{signal}"),
    }
}

fn endpoint(protocol: Protocol, url: String) -> Endpoint {
    Endpoint {
        protocol,
        url,
        tls: None,
        headers: vec![("x-tenant".into(), "acme".into())],
        timeout: Duration::from_secs(2),
    }
}

fn tracing_options(endpoint: Endpoint, sampling_rate: f64) -> TracingOptions {
    TracingOptions {
        endpoint,
        sampling_rate,
        resource: vec![
            ("service.name".into(), "RateLimit".into()),
            ("service.instance.id".into(), "test-1".into()),
        ],
        max_queue_size: 64,
        max_batch_size: 16,
        schedule_delay: Duration::from_millis(50),
    }
}

fn options_with(tracing: Option<TracingOptions>) -> AppOptions {
    let mut options = default_options();
    options.telemetry.tracing = tracing;
    options
}

fn grpc_request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "test".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![PbEntry {
                key: "k".into(),
                value: "v".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 3,
    }
}

/// POST /json (or GET /nginx) with extra headers; the status code.
async fn http_call(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> u16 {
    tokio::time::timeout(Duration::from_secs(10), async {
        let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
        let (method, body) = if path == "/json" {
            ("POST", body)
        } else {
            ("GET", "")
        };
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        let text = String::from_utf8_lossy(&raw);
        text.split_whitespace().nth(1).unwrap().parse().unwrap()
    })
    .await
    .expect("HTTP call finished in time")
}

#[tokio::test]
async fn grpc_call_with_traceparent_exports_a_child_span_over_otlp_grpc() {
    let (collector, received) = grpc_collector().await;
    let endpoint = endpoint(Protocol::Grpc, format!("http://{collector}"));
    let running = start_with(config(), options_with(Some(tracing_options(endpoint, 1.0)))).await;

    let mut client = RateLimitServiceClient::connect(format!("http://{}", running.grpc))
        .await
        .unwrap();
    let mut request = tonic::Request::new(grpc_request());
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    request
        .metadata_mut()
        .insert("tracestate", "congo=t61rcWkgMzE".parse().unwrap());
    client.should_rate_limit(request).await.unwrap();

    let spans = received.wait_for_spans(1).await;
    assert_eq!(spans.len(), 1);
    let span = &spans[0];
    assert_eq!(span.name, "ShouldRateLimit Execution");
    assert_eq!(span.kind, proto::SpanKind::Server as i32);
    assert_eq!(hex(&span.trace_id), TRACE_ID);
    assert_eq!(hex(&span.parent_span_id), PARENT_ID);
    assert_eq!(span.span_id.len(), 8);
    assert_ne!(hex(&span.span_id), PARENT_ID);
    assert_eq!(span.trace_state, "congo=t61rcWkgMzE");
    assert_eq!(span.flags & 0xff, 1, "sampled");
    assert_eq!(span.flags & 0x300, 0x300, "remote parent");
    assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
    assert!(span.status.is_none(), "no error");
    let a = &span.attributes;
    assert_eq!(string_attr(a, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        string_attr(a, "rpc.service").as_deref(),
        Some("envoy.service.ratelimit.v3.RateLimitService")
    );
    assert_eq!(
        string_attr(a, "rpc.method").as_deref(),
        Some("ShouldRateLimit")
    );
    assert_eq!(string_attr(a, "domain").as_deref(), Some("test"));
    assert_eq!(int_attr(a, "ratelimit.descriptors"), Some(1));
    assert_eq!(int_attr(a, "ratelimit.hits_addend"), Some(3));
    assert_eq!(
        string_attr(a, "ratelimit.overall_code").as_deref(),
        Some("OK")
    );
    let resource = received.resource();
    assert_eq!(
        string_attr(&resource, "service.name").as_deref(),
        Some("RateLimit")
    );
    assert_eq!(
        string_attr(&resource, "service.instance.id").as_deref(),
        Some("test-1")
    );
    assert_eq!(received.tenants.lock().unwrap()[0], "acme");
}

#[tokio::test]
async fn json_and_nginx_calls_with_b3_export_over_otlp_http() {
    let (collector, received) = http_collector().await;
    let endpoint = endpoint(Protocol::Http, format!("http://{collector}/v1/traces"));
    let running = start_with(config(), options_with(Some(tracing_options(endpoint, 1.0)))).await;

    let b3 = "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1";
    assert_eq!(http_call(running.http, "/json", &[("b3", b3)]).await, 200);
    assert_eq!(
        http_call(
            running.http,
            "/nginx",
            &[
                ("X-Sluice-Domain", "test"),
                ("X-Sluice-Descriptor", "k=v"),
                ("X-B3-TraceId", "463ac35c9f6413ad48485a3953bb6124"),
                ("X-B3-SpanId", "a2fb4a1d1a96d312"),
                ("X-B3-Sampled", "1"),
            ]
        )
        .await,
        200
    );

    let spans = received.wait_for_spans(2).await;
    let json = spans
        .iter()
        .find(|s| string_attr(&s.attributes, "http.route").as_deref() == Some("/json"))
        .expect("a /json span");
    assert_eq!(hex(&json.trace_id), "80f198ee56343ba864fe8b2a57d3eff7");
    assert_eq!(hex(&json.parent_span_id), "e457b5a2e4d86bd1");
    assert_eq!(json.name, "ShouldRateLimit Execution");
    let nginx = spans
        .iter()
        .find(|s| string_attr(&s.attributes, "http.route").as_deref() == Some("/nginx"))
        .expect("an /nginx span");
    assert_eq!(hex(&nginx.trace_id), "463ac35c9f6413ad48485a3953bb6124");
    assert_eq!(hex(&nginx.parent_span_id), "a2fb4a1d1a96d312");
    assert!(received.tenants.lock().unwrap().iter().all(|t| t == "acme"));

    // The tracer's own counters are on /metrics too, so dropped spans show without OTLP.
    let metrics = http_async(running.debug, "GET", "/metrics", "").await.body;
    assert!(
        metrics.contains("\nsluice_tracing_spans_queued_total 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nsluice_tracing_spans_dropped_total 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE sluice_tracing_export_failures_total counter\n"),
        "{metrics}"
    );
    process::promtool_check(&metrics);
}

#[tokio::test]
async fn unsampled_parents_and_rate_zero_roots_export_nothing() {
    let (collector, received) = http_collector().await;
    let endpoint = endpoint(Protocol::Http, format!("http://{collector}/v1/traces"));
    let running = start_with(config(), options_with(Some(tracing_options(endpoint, 0.0)))).await;

    // Not sampled by the caller; and a root with TRACING_SAMPLING_RATE=0.
    let unsampled = format!("00-{TRACE_ID}-{PARENT_ID}-00");
    assert_eq!(
        http_call(running.http, "/json", &[("traceparent", &unsampled)]).await,
        200
    );
    assert_eq!(http_call(running.http, "/json", &[]).await, 200);
    assert_eq!(
        http_call(
            running.http,
            "/json",
            &[
                ("x-b3-traceid", "80f198ee56343ba864fe8b2a57d3eff7"),
                ("x-b3-spanid", "e457b5a2e4d86bd1"),
                ("x-b3-sampled", "0")
            ]
        )
        .await,
        200
    );
    // Then a sampled parent, which is followed even at rate 0: the only span to arrive.
    let sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    assert_eq!(
        http_call(running.http, "/json", &[("traceparent", sampled)]).await,
        200
    );
    received.wait_for_spans(1).await;
    // Several batch delays more: nothing else comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spans = received.spans();
    assert_eq!(spans.len(), 1, "{spans:?}");
    assert_eq!(hex(&spans[0].trace_id), "0af7651916cd43dd8448eb211c80319c");
}

#[tokio::test]
async fn metrics_are_pushed_over_otlp_with_the_prometheus_values() {
    let (collector, received) = http_collector().await;
    let mut options = default_options();
    options.telemetry.otlp_metrics = Some(MetricsExportOptions {
        endpoint: endpoint(Protocol::Http, format!("http://{collector}/v1/metrics")),
        interval: Duration::from_millis(100),
        resource: vec![("service.name".into(), "RateLimit".into())],
    });
    let running = start_with(config(), options).await;
    for _ in 0..5 {
        assert_eq!(http_call(running.http, "/json", &[]).await, 200);
    }

    let sum_of = |r: &ExportMetricsServiceRequest, name: &str, attr: (&str, &str)| {
        let m = r.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == name)?;
        let Some(metric::Data::Sum(s)) = &m.data else {
            return None;
        };
        assert_eq!(s.aggregation_temporality, proto::TEMPORALITY_CUMULATIVE);
        s.data_points.iter().find_map(|p| {
            (string_attr(&p.attributes, attr.0).as_deref() == Some(attr.1)).then_some(p.value)?
        })
    };
    let start = Instant::now();
    loop {
        let last = received.metrics.lock().unwrap().last().cloned();
        if let Some(r) = last
            && sum_of(
                &r,
                "ratelimit_service_total_requests",
                ("grpc_method", "ShouldRateLimit"),
            ) == Some(number_data_point::Value::AsInt(5))
        {
            assert_eq!(
                sum_of(
                    &r,
                    "ratelimit_service_rate_limit_within_limit",
                    ("domain", "test")
                ),
                Some(number_data_point::Value::AsInt(5))
            );
            assert_eq!(
                sum_of(&r, "ratelimit_service_rate_limit_total_hits", ("key1", "k")),
                Some(number_data_point::Value::AsInt(5))
            );
            let m = &r.resource_metrics[0].scope_metrics[0].metrics;
            let h = m
                .iter()
                .find(|m| m.name == "ratelimit_service_response_time_seconds")
                .unwrap();
            let Some(metric::Data::Histogram(h)) = &h.data else {
                panic!("a histogram")
            };
            assert_eq!(h.data_points[0].count, 5);
            assert_eq!(h.data_points[0].bucket_counts.iter().sum::<u64>(), 5);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no metrics export with total_requests = 5"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_collector_that_never_answers_neither_slows_nor_fails_decisions() {
    // Accepts connections and never answers: every export waits for its timeout.
    let black_hole = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = black_hole.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = black_hole.accept().await {
            held.push(s);
        }
    });
    for protocol in [Protocol::Grpc, Protocol::Http] {
        let url = match protocol {
            Protocol::Grpc => format!("http://{addr}"),
            Protocol::Http => format!("http://{addr}/v1/traces"),
        };
        decisions_stay_prompt(endpoint(protocol, url), protocol).await;
    }
}

/// Starts Sluice exporting every call's span to `ep` through a tiny queue, and checks that 50
/// calls still answer within 2 s whatever the collector does. Returns the running Sluice, still
/// exporting.
async fn decisions_stay_prompt(ep: Endpoint, protocol: Protocol) -> app::Running {
    let mut tracing = tracing_options(ep, 1.0);
    tracing.max_queue_size = 4;
    tracing.max_batch_size = 2;
    let running = start_with(config(), options_with(Some(tracing))).await;
    let started = Instant::now();
    for _ in 0..50 {
        assert_eq!(http_call(running.http, "/json", &[]).await, 200);
    }
    // 50 loopback calls take milliseconds; an export waits 2 s. Generous for a busy box.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{protocol:?}: 50 calls took {:?}",
        started.elapsed()
    );
    running
}

/// Spans and metrics over `https` to a collector whose certificate is from the test CA, which
/// OTEL_EXPORTER_OTLP_CERTIFICATE names (read through Sluice's own loader).
#[tokio::test]
async fn spans_and_metrics_reach_an_https_collector_over_both_protocols() {
    let pki = pki::TestPki::new();
    let leaf = pki.leaf("collector", &["127.0.0.1"]);
    let tls = ClientTls::from_files(
        Some(sluice::tls::PemFile::new(
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            &pki.ca,
        )),
        None,
        None,
    )
    .unwrap();
    for protocol in [Protocol::Grpc, Protocol::Http] {
        let (collector, received) = match protocol {
            Protocol::Grpc => grpcs_collector(&leaf, None).await,
            Protocol::Http => https_collector(&leaf, None).await,
        };
        let mut traces = endpoint(protocol, url_for(protocol, "https", collector, "traces"));
        traces.tls = Some(tls.clone());
        let mut options = options_with(Some(tracing_options(traces, 1.0)));
        let mut metrics = endpoint(protocol, url_for(protocol, "https", collector, "metrics"));
        metrics.tls = Some(tls.clone());
        options.telemetry.otlp_metrics = Some(MetricsExportOptions {
            endpoint: metrics,
            interval: Duration::from_millis(100),
            resource: vec![("service.name".into(), "RateLimit".into())],
        });
        let running = start_with(config(), options).await;

        let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
        assert_eq!(
            http_call(running.http, "/json", &[("traceparent", &traceparent)]).await,
            200
        );
        let spans = received.wait_for_spans(1).await;
        assert_eq!(hex(&spans[0].trace_id), TRACE_ID, "{protocol:?}");
        assert_eq!(spans[0].name, "ShouldRateLimit Execution");
        assert_eq!(received.tenants.lock().unwrap()[0], "acme", "headers too");
        let start = Instant::now();
        while received.metrics.lock().unwrap().is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{protocol:?}: no metrics export over TLS"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A collector that requires a client certificate gets spans from Sluice configured with
/// OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE / _CLIENT_KEY, and none without them.
#[tokio::test]
async fn mtls_collectors_get_spans_only_from_a_client_with_a_certificate() {
    let pki = pki::TestPki::new();
    let server = pki.leaf("collector", &["127.0.0.1"]);
    let client = pki.leaf("sluice", &["sluice.test"]);
    let ca = || {
        Some(sluice::tls::PemFile::new(
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            &pki.ca,
        ))
    };
    let with_identity = ClientTls::from_files(
        ca(),
        Some(sluice::tls::KeyPairFiles {
            cert: sluice::tls::PemFile::new("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &client.cert),
            key: sluice::tls::PemFile::new("OTEL_EXPORTER_OTLP_CLIENT_KEY", &client.key),
        }),
        None,
    )
    .unwrap();
    let without_identity = ClientTls::from_files(ca(), None, None).unwrap();
    for protocol in [Protocol::Grpc, Protocol::Http] {
        let (collector, received) = match protocol {
            Protocol::Grpc => grpcs_collector(&server, Some(&pki.ca)).await,
            Protocol::Http => https_collector(&server, Some(&pki.ca)).await,
        };
        let url = url_for(protocol, "https", collector, "traces");

        // Without a client certificate first: the collector refuses the handshake.
        let mut ep = endpoint(protocol, url.clone());
        ep.tls = Some(without_identity.clone());
        let anonymous = start_with(config(), options_with(Some(tracing_options(ep, 1.0)))).await;
        assert_eq!(http_call(anonymous.http, "/json", &[]).await, 200);

        let mut ep = endpoint(protocol, url);
        ep.tls = Some(with_identity.clone());
        let running = start_with(config(), options_with(Some(tracing_options(ep, 1.0)))).await;
        let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
        assert_eq!(
            http_call(running.http, "/json", &[("traceparent", &traceparent)]).await,
            200
        );
        received.wait_for_spans(1).await;
        // Several batch delays more: the anonymous instance's span never arrives.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let spans = received.spans();
        assert_eq!(spans.len(), 1, "{protocol:?}: {spans:?}");
        assert_eq!(hex(&spans[0].trace_id), TRACE_ID);
    }
}

/// A collector whose certificate is from another CA: Sluice refuses the handshake, exports
/// nothing, and decisions answer as quickly as without tracing.
#[tokio::test]
async fn a_collector_from_another_ca_gets_nothing_and_decisions_stay_prompt() {
    let trusted = pki::TestPki::new();
    let other = pki::TestPki::new();
    let impostor = other.leaf("impostor", &["127.0.0.1"]);
    let (addr, failed_handshakes) = refused_handshakes(&impostor).await;
    let tls = ClientTls::from_files(
        Some(sluice::tls::PemFile::new(
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            &trusted.ca,
        )),
        None,
        None,
    )
    .unwrap();
    for protocol in [Protocol::Grpc, Protocol::Http] {
        let before = failed_handshakes.load(Ordering::Relaxed);
        let mut ep = endpoint(protocol, url_for(protocol, "https", addr, "traces"));
        ep.tls = Some(tls.clone());
        let _running = decisions_stay_prompt(ep.clone(), protocol).await;
        // The exporter's error (what the warn line says) names the reason. (BadSignature here,
        // not UnknownIssuer: both test CAs have the same name.)
        let mut client = sluice::telemetry::otlp::export::OtlpClient::new(&ep).unwrap();
        let err = client
            .export::<_, ExportTraceServiceResponse>(
                proto::TRACE_EXPORT_PATH,
                ExportTraceServiceRequest::default(),
            )
            .await
            .unwrap_err();
        assert!(
            err.contains("invalid peer certificate"),
            "{protocol:?}: {err}"
        );
        // Sluice did try, and refused the certificate.
        let start = Instant::now();
        while failed_handshakes.load(Ordering::Relaxed) == before {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{protocol:?}: no TLS handshake was tried"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn a_quota_stream_is_a_span_with_a_child_per_report() {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaUsageReports,
    };

    let (collector, received) = grpc_collector().await;
    let endpoint = endpoint(Protocol::Grpc, format!("http://{collector}"));
    let running = start_with(config(), options_with(Some(tracing_options(endpoint, 1.0)))).await;
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", running.grpc))
        .await
        .unwrap();
    let report = || RateLimitQuotaUsageReports {
        domain: "test".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("k".to_string(), "v".to_string())].into(),
            }),
            time_elapsed: None,
            num_requests_allowed: 1,
            num_requests_denied: 0,
        }],
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{PARENT_ID}-01").parse().unwrap(),
    );
    let mut answers = client
        .stream_rate_limit_quotas(request)
        .await
        .unwrap()
        .into_inner();
    for _ in 0..2 {
        tx.send(report()).await.unwrap();
        answers.message().await.unwrap().expect("an answer");
    }
    drop(tx);
    assert!(
        answers.message().await.unwrap().is_none(),
        "the stream ends"
    );

    let spans = received.wait_for_spans(3).await;
    let stream = spans
        .iter()
        .find(|s| s.name == "rlqs.stream")
        .expect("a stream span");
    assert_eq!(hex(&stream.trace_id), TRACE_ID);
    assert_eq!(hex(&stream.parent_span_id), PARENT_ID);
    assert_eq!(stream.kind, proto::SpanKind::Server as i32);
    assert_eq!(
        string_attr(&stream.attributes, "domain").as_deref(),
        Some("test")
    );
    assert_eq!(int_attr(&stream.attributes, "rlqs.reports"), Some(2));
    assert!(stream.status.is_none(), "ended by the client: no error");
    let reports: Vec<_> = spans.iter().filter(|s| s.name == "rlqs.report").collect();
    assert_eq!(reports.len(), 2);
    for r in reports {
        assert_eq!(r.parent_span_id, stream.span_id);
        assert_eq!(int_attr(&r.attributes, "rlqs.assignments"), Some(1));
    }
}
