//! Config over xDS, end to end: a small ADS server (tonic, envoy-types' discovery service) on
//! port 0 drives a Sluice started with CONFIG_TYPE=GRPC_XDS_SOTW through a config, an update,
//! an invalid update, a dropped stream and a control-plane restart, while the real gRPC API
//! answers. Every wait is bounded.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as RequestDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;
use sluice::app::Xds;
use sluice::config::{ConfigHandle, LoadOptions};
use sluice::tls::ClientTls;
use sluice::tls::XdsTlsFiles;
use sluice::xds::TYPE_URL;
use sluice::xds::{XdsBackoff, XdsConfig};
use sluice_test_support::app::{default_options, start_with};
use sluice_test_support::http::http_async;
use sluice_test_support::pki;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Certificate, Channel, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// How long any one expected event may take.
const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The test's ADS server: every stream Sluice opens is handed to the test, which reads the
// requests and pushes responses by hand.

/// One open StreamAggregatedResources call, seen from the server.
struct AdsStream {
    requests: mpsc::UnboundedReceiver<DiscoveryRequest>,
    responses: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    metadata: tonic::metadata::MetadataMap,
    /// The client's certificate chain, over TLS with client authentication.
    peer_certs: Option<usize>,
}

impl AdsStream {
    async fn next_request(&mut self) -> DiscoveryRequest {
        tokio::time::timeout(WAIT, self.requests.recv())
            .await
            .expect("a request in time")
            .expect("stream still open")
    }

    async fn push(&self, version: &str, nonce: &str, configs: &[RateLimitConfig]) {
        let response = DiscoveryResponse {
            version_info: version.into(),
            nonce: nonce.into(),
            type_url: TYPE_URL.into(),
            resources: configs
                .iter()
                .map(|c| Any {
                    type_url: TYPE_URL.into(),
                    value: c.encode_to_vec(),
                })
                .collect(),
            ..Default::default()
        };
        self.responses.send(Ok(response)).await.expect("push");
    }

    /// Pushes `configs` as `version`/`nonce` and checks that Sluice ACKs them: the next request
    /// echoes both, with no error.
    async fn push_acked(&mut self, version: &str, nonce: &str, configs: &[RateLimitConfig]) {
        self.push(version, nonce, configs).await;
        let ack = self.next_request().await;
        assert_eq!(
            (ack.version_info.as_str(), ack.response_nonce.as_str()),
            (version, nonce)
        );
        assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
    }
}

struct Ads {
    streams: mpsc::UnboundedSender<AdsStream>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let metadata = request.metadata().clone();
        let peer_certs = request.peer_certs().map(|c| c.len());
        let mut incoming = request.into_inner();
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(r)) = incoming.message().await {
                if req_tx.send(r).is_err() {
                    break;
                }
            }
        });
        let (resp_tx, resp_rx) = mpsc::channel(4);
        let _ = self.streams.send(AdsStream {
            requests: req_rx,
            responses: resp_tx,
            metadata,
            peer_certs,
        });
        Ok(Response::new(ReceiverStream::new(resp_rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// A running ADS server; dropping `stop` shuts it down.
struct AdsServer {
    addr: SocketAddr,
    streams: mpsc::UnboundedReceiver<AdsStream>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl AdsServer {
    async fn start(listener: TcpListener) -> Self {
        Self::start_with_tls(listener, None).await
    }

    async fn start_with_tls(listener: TcpListener, tls: Option<ServerTlsConfig>) -> Self {
        let addr = listener.local_addr().unwrap();
        let (streams_tx, streams) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let service = AggregatedDiscoveryServiceServer::new(Ads {
            streams: streams_tx,
        });
        let task = tokio::spawn(async move {
            let mut builder = tonic::transport::Server::builder();
            if let Some(tls) = tls {
                builder = builder.tls_config(tls).expect("ADS server TLS");
            }
            let _ = builder
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        AdsServer {
            addr,
            streams,
            stop: Some(stop),
            task,
        }
    }

    async fn next_stream(&mut self) -> AdsStream {
        tokio::time::timeout(WAIT, self.streams.recv())
            .await
            .expect("Sluice opened a stream in time")
            .expect("server running")
    }

    async fn shutdown(mut self) {
        drop(self.stop.take());
        // Open streams keep a graceful shutdown waiting; aborting closes the connections.
        self.task.abort();
        let _ = self.task.await;
    }
}

// ---------------------------------------------------------------------------------------------
// Configs and requests.

fn limit(key: &str, unit: RateLimitUnit, n: u32) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        rate_limit: Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn config(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
    RateLimitConfig {
        name: name.into(),
        domain: domain.into(),
        descriptors,
    }
}

async fn hit(
    c: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    key: &str,
) -> Result<RateLimitResponse, Status> {
    let request = RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RequestDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: "v".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    c.should_rate_limit(request).await.map(|r| r.into_inner())
}

/// (limit, remaining) of the single status, after asserting the call succeeded.
async fn remaining(c: &mut RateLimitServiceClient<Channel>, key: &str) -> (u32, u32) {
    let r = hit(c, "edge", key).await.expect("decision");
    let s = &r.statuses[0];
    let limit = s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
    (limit, s.limit_remaining)
}

fn xds_settings(addr: SocketAddr) -> XdsConfig {
    XdsConfig {
        node_id: "test-node".into(),
        node_metadata: vec![("zone".into(), "z1".into())],
        server_uri: format!("http://{addr}"),
        connect_retry_interval: Duration::from_millis(20),
        additional_headers: vec![("x-tenant".into(), "t1".into())],
        backoff: XdsBackoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
            random_factor: 0.5,
            jitter: true,
        },
        max_msg_size: None,
        tls: None,
    }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, step by step; to split next"
)]
async fn xds_updates_drive_decisions_with_ack_nack_and_reconnects() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut ads = AdsServer::start(listener).await;
    let ads_addr = ads.addr;

    let handle = ConfigHandle::new(None);
    let mut options = default_options();
    options.require_config_for_health = true;
    options.xds = Some(Xds {
        settings: xds_settings(ads_addr),
        options: LoadOptions::default(),
        tls: None,
    });
    let app = start_with(handle.clone(), options).await;
    let mut c = RateLimitServiceClient::connect(format!("http://{}", app.grpc))
        .await
        .expect("connect gRPC");

    // Started without config: unhealthy, and calls fail like the Go service's.
    let mut s1 = ads.next_stream().await;
    assert_eq!(
        http_async(app.http, "GET", "/healthcheck", "").await.status,
        500
    );
    let err = hit(&mut c, "edge", "k").await.expect_err("no config yet");
    assert!(
        err.message().contains("no rate limit configuration loaded"),
        "{err:?}"
    );

    // The subscription: node, metadata, type, no version or nonce yet; extra headers sent.
    let first = s1.next_request().await;
    assert_eq!(first.type_url, TYPE_URL);
    assert_eq!(first.version_info, "");
    assert_eq!(first.response_nonce, "");
    assert!(first.error_detail.is_none());
    let node = first.node.expect("node");
    assert_eq!(node.id, "test-node");
    assert!(node.metadata.expect("metadata").fields.contains_key("zone"));
    assert_eq!(
        s1.metadata.get("x-tenant").and_then(|v| v.to_str().ok()),
        Some("t1")
    );

    // v1: k is 3 per minute. ACKed with its version and nonce.
    s1.push_acked(
        "v1",
        "n1",
        &[config(
            "edge-rl",
            "edge",
            vec![limit("k", RateLimitUnit::Minute, 3)],
        )],
    )
    .await;
    assert_eq!(
        http_async(app.http, "GET", "/healthcheck", "").await.status,
        200
    );
    assert_eq!(remaining(&mut c, "k").await, (3, 2));
    assert_eq!(remaining(&mut c, "k").await, (3, 1));
    let dump = http_async(app.debug, "GET", "/rlconfig", "").await.body;
    assert!(
        dump.contains("edge.k: unit=MINUTE requests_per_unit=3"),
        "{dump}"
    );

    // v2: k becomes 5 per minute and `other` appears. The counter carries over: 2 used.
    s1.push_acked(
        "v2",
        "n2",
        &[config(
            "edge-rl",
            "edge",
            vec![
                limit("k", RateLimitUnit::Minute, 5),
                limit("other", RateLimitUnit::Minute, 1),
            ],
        )],
    )
    .await;
    assert_eq!(remaining(&mut c, "k").await, (5, 2));
    assert_eq!(remaining(&mut c, "other").await, (1, 0));

    // v3 is invalid: NACKed with the last good version, this nonce and the file-style error
    // named by resource; nothing changes.
    s1.push(
        "v3",
        "n3",
        &[
            config(
                "edge-rl",
                "edge",
                vec![limit("k", RateLimitUnit::Minute, 100)],
            ),
            config(
                "broken",
                "other",
                vec![limit("x", RateLimitUnit::Unknown, 1)],
            ),
        ],
    )
    .await;
    let nack = s1.next_request().await;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("v2", "n3")
    );
    let detail = nack.error_detail.expect("error_detail");
    assert_eq!(detail.code, 3);
    assert_eq!(detail.message, "broken: invalid rate limit unit 'UNKNOWN'");
    assert_eq!(remaining(&mut c, "k").await, (5, 1));
    assert_eq!(handle.stats().load_success.load(Ordering::Relaxed), 2);
    assert_eq!(handle.stats().load_error.load(Ordering::Relaxed), 1);

    // The server drops the stream: Sluice reconnects, resubscribing at the last good version.
    s1.responses
        .send(Err(Status::unavailable("control plane restarting")))
        .await
        .unwrap();
    drop(s1);
    let mut s2 = ads.next_stream().await;
    let resub = s2.next_request().await;
    assert_eq!(
        (resub.version_info.as_str(), resub.response_nonce.as_str()),
        ("v2", "")
    );

    // The whole control plane goes away: the last good config keeps serving meanwhile.
    drop(s2);
    ads.shutdown().await;
    assert_eq!(remaining(&mut c, "k").await, (5, 0));
    assert_eq!(
        http_async(app.http, "GET", "/healthcheck", "").await.status,
        200
    );

    // It comes back on the same address; Sluice finds it (back-off) and takes v4.
    let listener = TcpListener::bind(ads_addr)
        .await
        .expect("rebind the ADS port");
    let mut ads = AdsServer::start(listener).await;
    let mut s3 = ads.next_stream().await;
    let resub = s3.next_request().await;
    assert_eq!(resub.version_info, "v2");
    s3.push_acked(
        "v4",
        "n4",
        &[config(
            "edge-rl",
            "edge",
            vec![limit("k", RateLimitUnit::Minute, 10)],
        )],
    )
    .await;
    // Six hits so far on k's minute counter: it survived every update and the outage.
    assert_eq!(remaining(&mut c, "k").await, (10, 4));
    // `other` is gone from v4.
    let r = hit(&mut c, "edge", "other").await.unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());

    // An empty state of the world is a valid config with no domains: health follows it.
    s3.push("v5", "n5", &[]).await;
    let ack = s3.next_request().await;
    assert_eq!(ack.version_info, "v5");
    assert_eq!(
        http_async(app.http, "GET", "/healthcheck", "").await.status,
        500
    );

    drop(s3);
    ads.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// xDS over TLS.

/// An ADS server on TLS that requires a client certificate from `pki`'s CA; its own
/// certificate is for `xds.example` only, so Sluice must be told the name to verify.
async fn tls_ads(pki: &pki::TestPki) -> AdsServer {
    let server = pki.leaf("xds-server", &["xds.example"]);
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            std::fs::read(&server.cert).unwrap(),
            std::fs::read(&server.key).unwrap(),
        ))
        .client_ca_root(Certificate::from_pem(std::fs::read(&pki.ca).unwrap()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    AdsServer::start_with_tls(listener, Some(tls)).await
}

fn tls_xds(addr: SocketAddr, tls: &XdsTlsFiles) -> Xds {
    let mut settings = xds_settings(addr);
    settings.server_uri = format!("https://{addr}");
    settings.tls = Some(tls.clone());
    Xds {
        settings,
        options: LoadOptions::default(),
        tls: Some(ClientTls::load(tls).expect("TLS files load")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_over_tls_verifies_the_server_and_presents_a_client_certificate() {
    let pki = pki::TestPki::new();
    let client = pki.leaf("sluice", &["envoy-ratelimit"]);
    let mut ads = tls_ads(&pki).await;

    let handle = ConfigHandle::new(None);
    let mut options = default_options();
    options.xds = Some(tls_xds(
        ads.addr,
        &XdsTlsFiles {
            client_identity: Some((client.cert.clone(), client.key.clone())),
            server_ca: Some(pki.ca.clone()),
            server_name: Some("xds.example".into()),
        },
    ));
    let app = start_with(handle.clone(), options).await;

    let mut stream = ads.next_stream().await;
    assert_eq!(
        stream.peer_certs,
        Some(1),
        "Sluice presented its certificate"
    );
    let first = stream.next_request().await;
    assert_eq!(first.type_url, TYPE_URL);
    stream
        .push_acked(
            "v1",
            "n1",
            &[config(
                "edge-rl",
                "edge",
                vec![limit("k", RateLimitUnit::Minute, 3)],
            )],
        )
        .await;
    let mut c = RateLimitServiceClient::connect(format!("http://{}", app.grpc))
        .await
        .expect("connect gRPC");
    assert_eq!(remaining(&mut c, "k").await, (3, 2));
    drop(stream);
    ads.shutdown().await;
}

/// A `MakeWriter` that keeps what is logged, for the assertions.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

// One thread, so the log subscriber set for this test sees the xDS client's task.
#[tokio::test(flavor = "current_thread")]
async fn xds_over_tls_refuses_an_unverified_server_and_says_why() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);

    let pki = pki::TestPki::new();
    let client = pki.leaf("sluice", &["envoy-ratelimit"]);
    let mut ads = tls_ads(&pki).await;
    let other = pki::TestPki::new();
    let identity = Some((client.cert.clone(), client.key.clone()));

    for (case, tls, expected) in [
        (
            "another CA",
            XdsTlsFiles {
                client_identity: identity.clone(),
                server_ca: Some(other.ca.clone()),
                server_name: Some("xds.example".into()),
            },
            "invalid peer certificate",
        ),
        (
            "another name",
            XdsTlsFiles {
                client_identity: identity.clone(),
                server_ca: Some(pki.ca.clone()),
                server_name: Some("other.example".into()),
            },
            "certificate not valid for name \"other.example\"",
        ),
    ] {
        let handle = ConfigHandle::new(None);
        let mut options = default_options();
        options.require_config_for_health = true;
        options.xds = Some(tls_xds(ads.addr, &tls));
        let app = start_with(handle.clone(), options).await;
        let deadline = tokio::time::Instant::now() + WAIT;
        while !logs.text().contains(expected) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{case}: no '{expected}' in the logs:\n{}",
                logs.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(logs.text().contains("xDS config stream down"), "{case}");
        // No stream reached the server, no config, and health says so.
        assert!(
            ads.streams.try_recv().is_err(),
            "{case}: a stream got through"
        );
        assert!(handle.current().is_none(), "{case}: config applied");
        assert_eq!(
            http_async(app.http, "GET", "/healthcheck", "").await.status,
            500,
            "{case}"
        );
    }
    ads.shutdown().await;
}
