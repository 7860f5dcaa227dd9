//! The internal peer protocol: `sluice.peer.v1.Peer/Apply`, a unary gRPC call that carries a
//! batch of hits to the node that owns their counters and brings back one decision per hit.
//!
//! The messages are declared here with prost's derive (no .proto build step); the server and
//! client use tonic's codec and generic gRPC plumbing directly. An owner always applies the
//! hits it receives to its own store and never forwards them again, so ring changes cannot
//! make a call go round in circles.
//!
//! Whoever reaches the peer port can charge any counter, so with SLUICE_PEER_TLS both the
//! listener and [`PeerClient`] speak mutual TLS ([`crate::tls::PeerTls`]): only a holder of a
//! certificate from the peers' CA can call Apply.

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;
use tonic_prost::ProstCodec;

use crate::limiter::Decision;
use crate::limiter::{Algorithm, Quota, Unit};
use crate::store::{CounterStore, Hit, StoreError};
use crate::tls::PeerTls;

pub const APPLY_PATH: &str = "/sluice.peer.v1.Peer/Apply";

#[derive(Clone, PartialEq, prost::Message)]
pub struct PeerHit {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    /// `Unit::proto_number`.
    #[prost(int32, tag = "3")]
    pub unit: i32,
    /// Index in `Algorithm::ALL`.
    #[prost(uint32, tag = "4")]
    pub algorithm: u32,
    /// 0 for none.
    #[prost(uint32, tag = "5")]
    pub burst: u32,
    #[prost(uint64, tag = "6")]
    pub hits: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ApplyRequest {
    #[prost(message, repeated, tag = "1")]
    pub hits: Vec<PeerHit>,
    /// Give the hits back instead of charging them.
    #[prost(bool, tag = "2")]
    pub refund: bool,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct PeerDecision {
    #[prost(bool, tag = "1")]
    pub over: bool,
    #[prost(uint32, tag = "2")]
    pub remaining: u32,
    #[prost(uint64, tag = "3")]
    pub reset_after_secs: u64,
    #[prost(uint64, tag = "4")]
    pub count_before: u64,
    #[prost(uint64, tag = "5")]
    pub count_after: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ApplyResponse {
    #[prost(message, repeated, tag = "1")]
    pub decisions: Vec<PeerDecision>,
}

impl PeerHit {
    pub fn from_hit(h: &Hit<'_>) -> Self {
        let q = h.quota;
        PeerHit {
            key: h.key.to_owned(),
            requests_per_unit: q.requests_per_unit,
            unit: q.unit.proto_number(),
            algorithm: Algorithm::ALL
                .iter()
                .position(|a| *a == q.algorithm)
                .unwrap_or(0) as u32,
            burst: q.burst.map_or(0, NonZeroU32::get),
            hits: h.hits,
        }
    }

    fn quota(&self) -> Result<Quota, tonic::Status> {
        let bad = |what: &str| tonic::Status::invalid_argument(format!("peer hit: bad {what}"));
        Ok(Quota {
            requests_per_unit: self.requests_per_unit,
            unit: Unit::from_proto_number(self.unit).ok_or_else(|| bad("unit"))?,
            algorithm: *Algorithm::ALL
                .get(self.algorithm as usize)
                .ok_or_else(|| bad("algorithm"))?,
            burst: NonZeroU32::new(self.burst),
        })
    }
}

impl From<&Decision> for PeerDecision {
    fn from(d: &Decision) -> Self {
        PeerDecision {
            over: d.over,
            remaining: d.remaining,
            reset_after_secs: d.reset_after_secs,
            count_before: d.count_before,
            count_after: d.count_after,
        }
    }
}

impl From<PeerDecision> for Decision {
    fn from(d: PeerDecision) -> Self {
        Decision {
            over: d.over,
            remaining: d.remaining,
            reset_after_secs: d.reset_after_secs,
            count_before: d.count_before,
            count_after: d.count_after,
        }
    }
}

/// The owner's side: applies forwarded hits to this node's counters (through the
/// [`super::OwnerStore`], so forwarded hits are loaded and written behind like local ones).
#[derive(Clone)]
pub struct PeerServer {
    local: Arc<super::OwnerStore>,
    clock: Arc<dyn crate::clock::Clock>,
}

impl PeerServer {
    pub fn new(local: Arc<super::OwnerStore>, clock: Arc<dyn crate::clock::Clock>) -> Self {
        PeerServer { local, clock }
    }

    async fn apply(&self, req: ApplyRequest) -> Result<ApplyResponse, tonic::Status> {
        let quotas = req
            .hits
            .iter()
            .map(PeerHit::quota)
            .collect::<Result<Vec<_>, _>>()?;
        let hits: Vec<Hit<'_>> = req
            .hits
            .iter()
            .zip(quotas)
            .map(|(h, quota)| Hit {
                key: &h.key,
                quota,
                hits: h.hits,
            })
            .collect();
        // The owner's clock decides, so each counter lives on one timeline.
        let now = self.clock.now();
        if req.refund {
            self.local.refund(now, &hits).await.map_err(store_status)?;
            return Ok(ApplyResponse::default());
        }
        let mut out = Vec::with_capacity(hits.len());
        self.local
            .apply(now, &hits, &mut out)
            .await
            .map_err(store_status)?;
        Ok(ApplyResponse {
            decisions: out.iter().map(PeerDecision::from).collect(),
        })
    }
}

fn store_status(e: StoreError) -> tonic::Status {
    tonic::Status::unavailable(e.to_string())
}

impl NamedService for PeerServer {
    const NAME: &'static str = "sluice.peer.v1.Peer";
}

impl<B> Service<http::Request<B>> for PeerServer
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
        if req.uri().path() != APPLY_PATH {
            return Box::pin(async {
                Ok(tonic::Status::unimplemented("unknown peer method").into_http())
            });
        }
        struct Apply(PeerServer);
        impl tonic::server::UnaryService<ApplyRequest> for Apply {
            type Response = ApplyResponse;
            type Future = BoxFuture<tonic::Response<ApplyResponse>, tonic::Status>;
            fn call(&mut self, request: tonic::Request<ApplyRequest>) -> Self::Future {
                let server = self.0.clone();
                Box::pin(async move {
                    server
                        .apply(request.into_inner())
                        .await
                        .map(tonic::Response::new)
                })
            }
        }
        let server = self.clone();
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(ProstCodec::<ApplyResponse, ApplyRequest>::default());
            Ok(grpc.unary(Apply(server), req).await)
        })
    }
}

/// One queued forward: its hits, and where to send its decisions.
struct Job {
    hits: Vec<PeerHit>,
    refund: bool,
    reply: oneshot::Sender<Result<Vec<PeerDecision>, String>>,
}

/// The forwarding side for one peer: a task that batches concurrent forwards into one call
/// over a long-lived HTTP/2 connection.
#[derive(Clone)]
pub struct PeerClient {
    jobs: mpsc::Sender<Job>,
    timeout: Duration,
}

impl PeerClient {
    /// Starts the batching task for the peer at `addr` (`host:port`), over mutual TLS with
    /// `tls`.
    pub fn start(
        addr: &str,
        timeout: Duration,
        window: Duration,
        tls: Option<&PeerTls>,
        stats: Arc<super::ClusterStats>,
    ) -> Result<Self, String> {
        // `http://` either way: with TLS the connector does the handshake under tonic, so that
        // each new connection presents the certificate as last reloaded (tonic's own TLS
        // config keeps the identity it was built with).
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("peer {addr}: {e}"))?
            .connect_timeout(timeout)
            .tcp_nodelay(true);
        let channel = match tls {
            None => endpoint.connect_lazy(),
            Some(tls) => {
                let connector = tls.connector(addr).map_err(|e| e.to_string())?;
                endpoint.connect_with_connector_lazy(connector)
            }
        };
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(batcher(channel, rx, timeout, window, stats));
        Ok(PeerClient { jobs: tx, timeout })
    }

    /// Sends hits to the peer (batched with concurrent calls); bounded by the timeout.
    pub async fn apply(
        &self,
        hits: Vec<PeerHit>,
        refund: bool,
    ) -> Result<Vec<PeerDecision>, String> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            hits,
            refund,
            reply,
        };
        let sent = async {
            self.jobs
                .send(job)
                .await
                .map_err(|_| "peer client stopped".to_string())?;
            answer.await.map_err(|_| "peer call dropped".to_string())?
        };
        // The batch window plus the call's own deadline bound the wait.
        match tokio::time::timeout(self.timeout * 2, sent).await {
            Ok(r) => r,
            Err(_) => Err(format!("peer did not answer within {:?}", self.timeout)),
        }
    }
}

/// Collects jobs for up to `window` (or 256 hits), sends them as one call, splits the answer.
/// Refunds and charges travel in separate calls.
async fn batcher(
    channel: tonic::transport::Channel,
    mut rx: mpsc::Receiver<Job>,
    timeout: Duration,
    window: Duration,
    stats: Arc<super::ClusterStats>,
) {
    const MAX_HITS: usize = 256;
    let grpc = tonic::client::Grpc::new(channel);
    let mut pending: Option<Job> = None;
    loop {
        let first = match pending.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let refund = first.refund;
        let mut batch = vec![first];
        let mut size = batch[0].hits.len();
        let deadline = tokio::time::Instant::now() + window;
        while size < MAX_HITS {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(job)) if job.refund == refund => {
                    size += job.hits.len();
                    batch.push(job);
                }
                Ok(Some(other)) => {
                    // A different kind starts the next call.
                    pending = Some(other);
                    break;
                }
                Ok(None) | Err(_) => break,
            }
        }
        let request = ApplyRequest {
            hits: batch.iter().flat_map(|j| j.hits.iter().cloned()).collect(),
            refund,
        };
        if size > 0 {
            stats
                .peer_calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // Each batch is its own call on the shared HTTP/2 connection, so a slow or dead peer's
        // deadline does not hold the batches queued behind it.
        let mut grpc = grpc.clone();
        tokio::spawn(async move {
            let call = async {
                grpc.ready()
                    .await
                    .map_err(|e| format!("peer not ready: {e}"))?;
                let path = http::uri::PathAndQuery::from_static(APPLY_PATH);
                grpc.unary(
                    tonic::Request::new(request),
                    path,
                    ProstCodec::<ApplyRequest, ApplyResponse>::default(),
                )
                .await
                .map(|r| r.into_inner().decisions)
                .map_err(|s| format!("peer call failed: {}", s.message()))
            };
            let result = match tokio::time::timeout(timeout, call).await {
                Ok(r) => r,
                Err(_) => Err(format!("peer did not answer within {timeout:?}")),
            };
            match result {
                Ok(decisions) if refund || decisions.len() == size => {
                    let mut rest = decisions.into_iter();
                    for job in batch {
                        let mine = if refund {
                            Vec::new()
                        } else {
                            rest.by_ref().take(job.hits.len()).collect()
                        };
                        let _ = job.reply.send(Ok(mine));
                    }
                }
                Ok(decisions) => {
                    let e = format!(
                        "peer answered {} decisions for {size} hits",
                        decisions.len()
                    );
                    for job in batch {
                        let _ = job.reply.send(Err(e.clone()));
                    }
                }
                Err(e) => {
                    for job in batch {
                        let _ = job.reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}
