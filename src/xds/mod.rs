//! Config over xDS (CONFIG_TYPE=GRPC_XDS_SOTW): a state-of-the-world ADS client that feeds
//! RateLimitConfig resources from a control plane (Envoy Gateway, WSO2 APK, ...) into the
//! shared [`ConfigHandle`].
//!
//! Like [`crate::api`], this is an adapter: the only place besides `api` that knows tonic and
//! protobuf. It speaks `envoy.service.discovery.v3.AggregatedDiscoveryService/
//! StreamAggregatedResources`, subscribed to [`TYPE_URL`], and for each response (always the
//! full set of resources):
//!
//! - converts every resource to the raw YAML types ([`convert`]) and builds one config through
//!   [`crate::config::build_raw`], so the validation, the error messages and the matching are
//!   the files' own;
//! - valid: stores it (counters live in the store, so they carry over), counts
//!   `config_load_success` and ACKs (`version_info` = the response's version, `response_nonce`
//!   = its nonce);
//! - invalid: keeps the previous config, counts `config_load_error` and NACKs (`version_info` =
//!   the last accepted version, this nonce, `error_detail` = INVALID_ARGUMENT with the errors,
//!   one `resource: reason` per line).
//!
//! When the stream breaks, the last good config keeps serving while the client reconnects
//! with jittered exponential back-off; the first request of each stream carries the last
//! accepted version, as the Go service's does.

pub mod convert;

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::Ordering;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{Node, node::UserAgentVersionType};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use envoy_types::pb::google::rpc::Status;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{ClientTlsConfig, Endpoint};

use crate::config::{ConfigHandle, LoadOptions, build_raw};
use crate::tls::ClientTls;
pub use convert::TYPE_URL;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 pings on the stream, so a control plane that vanished without closing the
/// connection is noticed and the client reconnects instead of waiting forever.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// google.rpc.Code INVALID_ARGUMENT, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// The xDS client's configuration (CONFIG_TYPE=GRPC_XDS_SOTW), built by `crate::settings`.
#[derive(Clone, Debug, PartialEq)]
pub struct XdsConfig {
    pub node_id: String,
    /// CONFIG_GRPC_XDS_NODE_METADATA, in the order given; sent as string values.
    pub node_metadata: Vec<(String, String)>,
    /// `http://host:port`, or `https://host:port` with TLS, ready for the gRPC client.
    pub server_uri: String,
    pub connect_retry_interval: Duration,
    /// Lower-case ASCII gRPC metadata keys with ASCII values.
    pub additional_headers: Vec<(String, String)>,
    pub backoff: XdsBackoff,
    /// `None`: gRPC's default limit.
    pub max_msg_size: Option<usize>,
    /// `Some` with CONFIG_GRPC_XDS_SERVER_USE_TLS or an `https://` URL.
    pub tls: Option<crate::tls::XdsTlsFiles>,
}

/// Reconnection delays: after the `n`-th consecutive failed attempt (from 0), the delay is
/// `min(initial * 2^n, max)`, randomised within `±random_factor` when `jitter` is set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct XdsBackoff {
    pub initial: Duration,
    pub max: Duration,
    /// In [0, 1].
    pub random_factor: f64,
    pub jitter: bool,
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum XdsError {
    #[error("cannot connect to the xDS server: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("xDS stream failed: {0}")]
    Stream(#[from] tonic::Status),
    #[error("xDS stream ended by the server")]
    Ended,
    #[error("invalid additional header {0}")]
    Header(String),
}

/// Stops the xDS client when dropped.
#[derive(Debug)]
#[must_use = "the xDS client stops when the guard is dropped"]
pub struct XdsGuard {
    task: JoinHandle<()>,
}

impl Drop for XdsGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the client; it runs (reconnecting as needed) until the guard is dropped.
///
/// Must be called within a tokio runtime.
pub fn spawn(
    settings: XdsConfig,
    tls: Option<ClientTls>,
    options: LoadOptions,
    handle: ConfigHandle,
) -> XdsGuard {
    let client = Client {
        node: node(&settings),
        tls: tls.as_ref().map(ClientTls::tonic_config),
        settings,
        options,
        handle,
        accepted_version: String::new(),
    };
    XdsGuard {
        task: tokio::spawn(client.run()),
    }
}

struct Client {
    settings: XdsConfig,
    /// `None`: plain text.
    tls: Option<ClientTlsConfig>,
    options: LoadOptions,
    handle: ConfigHandle,
    node: Node,
    /// The version of the last accepted response; "" before the first.
    accepted_version: String,
}

impl Client {
    async fn run(mut self) {
        let mut failures: u32 = 0;
        loop {
            let mut received = false;
            let result = self.stream(&mut received).await;
            let delay = if received {
                // The stream worked until it broke: retry soon, as the Go service does.
                failures = 0;
                jitter(
                    self.settings.connect_retry_interval,
                    &self.settings.backoff,
                    random_unit(),
                )
            } else {
                failures = failures.saturating_add(1);
                backoff_delay(&self.settings.backoff, failures - 1, random_unit())
            };
            let error = match result {
                Ok(()) => XdsError::Ended,
                Err(e) => e,
            };
            tracing::warn!(
                server = %self.settings.server_uri,
                error = %with_sources(&error),
                retry_in = ?delay,
                "xDS config stream down; serving the last accepted config"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// One connection and stream, until it ends. `received` is set once a response arrives.
    async fn stream(&mut self, received: &mut bool) -> Result<(), XdsError> {
        let mut endpoint = Endpoint::from_shared(self.settings.server_uri.clone())?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let channel = endpoint.connect().await?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        if let Some(max) = self.settings.max_msg_size {
            client = client.max_decoding_message_size(max);
        }

        let (tx, rx) = mpsc::channel::<DiscoveryRequest>(4);
        let first = self.request(self.accepted_version.clone(), String::new(), None);
        // Cannot fail: the receiver is alive and the channel empty.
        let _ = tx.send(first).await;
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        for (key, value) in &self.settings.additional_headers {
            let k = AsciiMetadataKey::from_bytes(key.as_bytes())
                .map_err(|_| XdsError::Header(key.clone()))?;
            let v = AsciiMetadataValue::try_from(value.as_str())
                .map_err(|_| XdsError::Header(key.clone()))?;
            request.metadata_mut().insert(k, v);
        }
        let mut responses = client
            .stream_aggregated_resources(request)
            .await?
            .into_inner();
        tracing::info!(server = %self.settings.server_uri, node = %self.node.id, "xDS config stream open");
        while let Some(response) = responses.message().await? {
            *received = true;
            if response.type_url != TYPE_URL {
                // Only one type is subscribed; a stray type is not ours to ACK or NACK.
                tracing::warn!(type_url = %response.type_url, "ignoring an xDS response of another type");
                continue;
            }
            let reply = self.apply(&response);
            if tx.send(reply).await.is_err() {
                break;
            }
        }
        Ok(())
    }

    /// Applies one response; returns its ACK or NACK.
    fn apply(&mut self, response: &DiscoveryResponse) -> DiscoveryRequest {
        let built =
            convert::decode(&response.resources).and_then(|roots| build_raw(roots, &self.options));
        let stats = self.handle.stats();
        match built {
            Ok(config) => {
                let domains = config.domain_count();
                self.handle.store(config);
                stats.load_success.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    version = %response.version_info,
                    resources = response.resources.len(),
                    domains,
                    "xDS config applied"
                );
                self.accepted_version = response.version_info.clone();
                self.request(response.version_info.clone(), response.nonce.clone(), None)
            }
            Err(errors) => {
                stats.load_error.fetch_add(1, Ordering::Relaxed);
                for e in errors.iter() {
                    tracing::warn!(
                        version = %response.version_info,
                        resource = %e.name,
                        reason = %e.message,
                        "xDS config rejected; keeping the previous config"
                    );
                }
                self.request(
                    self.accepted_version.clone(),
                    response.nonce.clone(),
                    Some(Status {
                        code: INVALID_ARGUMENT,
                        message: errors.to_string(),
                        details: Vec::new(),
                    }),
                )
            }
        }
    }

    fn request(&self, version: String, nonce: String, error: Option<Status>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version,
            node: Some(self.node.clone()),
            type_url: TYPE_URL.to_owned(),
            response_nonce: nonce,
            error_detail: error,
            ..Default::default()
        }
    }
}

fn node(settings: &XdsConfig) -> Node {
    let fields: HashMap<String, Value> = settings
        .node_metadata
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Value {
                    kind: Some(Kind::StringValue(v.clone())),
                },
            )
        })
        .collect();
    Node {
        id: settings.node_id.clone(),
        metadata: Some(Struct { fields }),
        user_agent_name: "sluice".to_owned(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").to_owned(),
        )),
        ..Default::default()
    }
}

/// The delay after the `failures`-th consecutive failed attempt (from 0):
/// `min(initial * 2^failures, max)`, then jittered. `unit` is a random number in [0, 1).
pub(crate) fn backoff_delay(b: &XdsBackoff, failures: u32, unit: f64) -> Duration {
    let exp = b
        .initial
        .checked_mul(1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(b.max)
        .min(b.max);
    jitter(exp, b, unit)
}

/// `d` scaled by a factor in `[1 - random_factor, 1 + random_factor)` picked by `unit` in
/// [0, 1), when jitter is on.
pub fn jitter(d: Duration, b: &XdsBackoff, unit: f64) -> Duration {
    if !b.jitter {
        return d;
    }
    d.mul_f64((1.0 + b.random_factor * (2.0 * unit - 1.0)).max(0.0))
}

/// The error and its causes, `: `-separated (tonic's transport error alone says only
/// "transport error"). A cause whose text is already there (some errors print their source
/// themselves) is not repeated.
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// A random number in [0, 1). Each std `RandomState` is freshly keyed, which is all the
/// randomness a reconnection delay needs; no RNG dependency for it.
fn random_unit() -> f64 {
    let bits = RandomState::new().hash_one(0u8) >> 11;
    bits as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: XdsBackoff = XdsBackoff {
        initial: Duration::from_secs(10),
        max: Duration::from_secs(60),
        random_factor: 0.5,
        jitter: true,
    };

    #[test]
    fn backoff_doubles_up_to_the_max() {
        let plain = XdsBackoff { jitter: false, ..B };
        let secs: Vec<u64> = (0..6)
            .map(|n| backoff_delay(&plain, n, 0.9).as_secs())
            .collect();
        assert_eq!(secs, [10, 20, 40, 60, 60, 60]);
        assert_eq!(
            backoff_delay(&plain, u32::MAX, 0.0),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn jitter_stays_within_the_random_factor() {
        assert_eq!(backoff_delay(&B, 0, 0.0), Duration::from_secs(5));
        assert_eq!(backoff_delay(&B, 0, 0.5), Duration::from_secs(10));
        assert!(backoff_delay(&B, 0, 0.999_999) < Duration::from_secs(15));
        for _ in 0..1000 {
            let u = random_unit();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
    }

    #[test]
    fn the_node_carries_id_and_metadata() {
        let settings = XdsConfig {
            node_id: "envoy-ratelimit".into(),
            node_metadata: vec![("zone".into(), "a".into())],
            server_uri: "http://localhost:18000".into(),
            connect_retry_interval: Duration::from_secs(3),
            additional_headers: vec![],
            backoff: B,
            max_msg_size: None,
            tls: None,
        };
        let n = node(&settings);
        assert_eq!(n.id, "envoy-ratelimit");
        let meta = n.metadata.expect("metadata");
        assert_eq!(
            meta.fields["zone"].kind,
            Some(Kind::StringValue("a".into()))
        );
    }
}
