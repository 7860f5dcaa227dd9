//! The internal peer protocol: `sluice.peer.v1.Peer/Apply`, a unary gRPC call that carries a
//! batch of hits to the node that owns their counters and brings back one decision per hit.
//!
//! The protocol is `proto/sluice/peer/v1/peer.proto`; `build.rs` compiles it in pure Rust
//! (protox, no system `protoc`) into [`wire`], whose messages, server and client this module
//! drives. Every request carries [`PROTOCOL_VERSION`]; an owner refuses any other version with
//! FAILED_PRECONDITION naming both, before reading a hit, so a node of another version never
//! misreads one, and its caller treats the refusal as a failed peer. The algorithm and unit
//! numbers on the wire map to [`Algorithm`] and [`Unit`] by one match per variant here, so
//! reordering a Rust enum cannot change the wire (`pinned_wire_bytes` below fails first). An
//! owner always applies the hits it receives to its own store and never forwards them again,
//! so ring changes cannot make a call go round in circles.
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

use crate::limiter::Decision;
use crate::limiter::{Algorithm, Quota, Unit};
use crate::store::{CounterStore, Hit, StoreError};
use crate::tls::PeerTls;

/// The code `build.rs` generates from `proto/sluice/peer/v1/peer.proto`.
pub mod wire {
    tonic::include_proto!("sluice.peer.v1");
}

pub use wire::{ApplyRequest, ApplyResponse, PeerDecision, PeerHit};

/// The version of the peer protocol this node speaks, sent in every [`ApplyRequest`]. Raise it
/// (and say what changed in the .proto) for any change an older node would misread.
pub const PROTOCOL_VERSION: u32 = 1;

pub const APPLY_PATH: &str = "/sluice.peer.v1.Peer/Apply";

/// The wire number of each algorithm, one arm per variant: the .proto's numbers, not the
/// order of [`Algorithm`].
pub const fn algorithm_to_wire(a: Algorithm) -> wire::Algorithm {
    match a {
        Algorithm::FixedWindow => wire::Algorithm::FixedWindow,
        Algorithm::SlidingWindow => wire::Algorithm::SlidingWindow,
        Algorithm::TokenBucket => wire::Algorithm::TokenBucket,
        Algorithm::LeakyBucket => wire::Algorithm::LeakyBucket,
    }
}

/// The inverse of [`algorithm_to_wire`]; `None` for a number this version does not know.
pub fn algorithm_from_wire(n: i32) -> Option<Algorithm> {
    Some(match wire::Algorithm::try_from(n).ok()? {
        wire::Algorithm::FixedWindow => Algorithm::FixedWindow,
        wire::Algorithm::SlidingWindow => Algorithm::SlidingWindow,
        wire::Algorithm::TokenBucket => Algorithm::TokenBucket,
        wire::Algorithm::LeakyBucket => Algorithm::LeakyBucket,
    })
}

/// The wire number of each unit, one arm per variant (Envoy's numbering, as the .proto says).
pub const fn unit_to_wire(u: Unit) -> wire::Unit {
    match u {
        Unit::Second => wire::Unit::Second,
        Unit::Minute => wire::Unit::Minute,
        Unit::Hour => wire::Unit::Hour,
        Unit::Day => wire::Unit::Day,
        Unit::Week => wire::Unit::Week,
        Unit::Month => wire::Unit::Month,
        Unit::Year => wire::Unit::Year,
    }
}

/// The inverse of [`unit_to_wire`]; `None` for UNSPECIFIED and numbers this version does not
/// know.
pub fn unit_from_wire(n: i32) -> Option<Unit> {
    Some(match wire::Unit::try_from(n).ok()? {
        wire::Unit::Unspecified => return None,
        wire::Unit::Second => Unit::Second,
        wire::Unit::Minute => Unit::Minute,
        wire::Unit::Hour => Unit::Hour,
        wire::Unit::Day => Unit::Day,
        wire::Unit::Week => Unit::Week,
        wire::Unit::Month => Unit::Month,
        wire::Unit::Year => Unit::Year,
    })
}

/// The refusal of a call in another protocol version; `None` for this node's own.
pub fn version_mismatch(version: u32) -> Option<tonic::Status> {
    (version != PROTOCOL_VERSION).then(|| {
        tonic::Status::failed_precondition(format!(
            "peer protocol version {version} is not supported by this node (speaks {PROTOCOL_VERSION})"
        ))
    })
}

impl ApplyRequest {
    /// A request in this node's protocol version.
    pub fn new(hits: Vec<PeerHit>, refund: bool) -> Self {
        ApplyRequest {
            hits,
            refund,
            protocol_version: PROTOCOL_VERSION,
        }
    }
}

impl PeerHit {
    pub fn from_hit(h: &Hit<'_>) -> Self {
        let q = h.quota;
        PeerHit {
            key: h.key.to_owned(),
            requests_per_unit: q.requests_per_unit,
            unit: unit_to_wire(q.unit) as i32,
            algorithm: algorithm_to_wire(q.algorithm) as i32,
            burst: q.burst.map_or(0, NonZeroU32::get),
            hits: h.hits,
        }
    }

    /// The quota this hit's counter enforces; an unknown unit or algorithm number is refused,
    /// never read as another.
    pub fn quota(&self) -> Result<Quota, tonic::Status> {
        let unknown = |what: &str, n: i32| {
            tonic::Status::invalid_argument(format!("peer hit: unknown {what} number {n}"))
        };
        Ok(Quota {
            requests_per_unit: self.requests_per_unit,
            unit: unit_from_wire(self.unit).ok_or_else(|| unknown("unit", self.unit))?,
            algorithm: algorithm_from_wire(self.algorithm)
                .ok_or_else(|| unknown("algorithm", self.algorithm))?,
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
/// The generated `Peer` service routes and decodes; `Owner` answers.
#[derive(Clone)]
pub struct PeerServer {
    grpc: wire::peer_server::PeerServer<Owner>,
}

impl PeerServer {
    pub fn new(local: Arc<super::OwnerStore>, clock: Arc<dyn crate::clock::Clock>) -> Self {
        PeerServer {
            grpc: wire::peer_server::PeerServer::new(Owner { local, clock }),
        }
    }
}

/// What [`PeerServer`] answers Apply with.
struct Owner {
    local: Arc<super::OwnerStore>,
    clock: Arc<dyn crate::clock::Clock>,
}

#[tonic::async_trait]
impl wire::peer_server::Peer for Owner {
    async fn apply(
        &self,
        request: tonic::Request<ApplyRequest>,
    ) -> Result<tonic::Response<ApplyResponse>, tonic::Status> {
        self.answer(request.into_inner())
            .await
            .map(tonic::Response::new)
    }
}

impl Owner {
    async fn answer(&self, req: ApplyRequest) -> Result<ApplyResponse, tonic::Status> {
        // The version first: under another version's rules the hits may mean something else.
        if let Some(refused) = version_mismatch(req.protocol_version) {
            return Err(refused);
        }
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
    const NAME: &'static str = wire::peer_server::SERVICE_NAME;
}

impl<B> Service<http::Request<B>> for PeerServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<http::Request<B>>::poll_ready(&mut self.grpc, cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.grpc.call(req)
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

/// At most this many hits go in one call; the jobs waiting beyond it start the next.
const MAX_BATCH_HITS: usize = 256;

/// Collects jobs for up to `window` (or [`MAX_BATCH_HITS`] hits), sends them as one call,
/// splits the answer. Refunds and charges travel in separate calls.
async fn batcher(
    channel: tonic::transport::Channel,
    mut rx: mpsc::Receiver<Job>,
    timeout: Duration,
    window: Duration,
    stats: Arc<super::ClusterStats>,
) {
    let client = wire::peer_client::PeerClient::new(channel);
    let mut pending: Option<Job> = None;
    loop {
        let first = match pending.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let (batch, next) = collect_batch(first, &mut rx, window).await;
        pending = next;
        if batch.size > 0 {
            stats
                .peer_calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // Each batch is its own call on the shared HTTP/2 connection, so a slow or dead peer's
        // deadline does not hold the batches queued behind it.
        tokio::spawn(send_batch(client.clone(), batch, timeout));
    }
}

/// Jobs of one kind (charges or refunds) to send in one call, and their hits in all.
struct Batch {
    jobs: Vec<Job>,
    refund: bool,
    size: usize,
}

/// `first` and the jobs of its kind that arrive within `window`, up to [`MAX_BATCH_HITS`] hits;
/// and the job of the other kind that ended the batch early, if one did.
async fn collect_batch(
    first: Job,
    rx: &mut mpsc::Receiver<Job>,
    window: Duration,
) -> (Batch, Option<Job>) {
    let mut batch = Batch {
        refund: first.refund,
        size: first.hits.len(),
        jobs: vec![first],
    };
    let deadline = tokio::time::Instant::now() + window;
    while batch.size < MAX_BATCH_HITS {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(job)) if job.refund == batch.refund => {
                batch.size += job.hits.len();
                batch.jobs.push(job);
            }
            // A different kind starts the next call.
            Ok(Some(other)) => return (batch, Some(other)),
            Ok(None) | Err(_) => break,
        }
    }
    (batch, None)
}

/// One Apply call for `batch`, bounded by `timeout`; each job gets its share of the answer, or
/// the error. A refusal (another protocol version, an unknown number) comes back as the
/// owner's message, and the caller treats the peer as failed.
async fn send_batch(
    mut client: wire::peer_client::PeerClient<tonic::transport::Channel>,
    batch: Batch,
    timeout: Duration,
) {
    let request = ApplyRequest::new(
        batch
            .jobs
            .iter()
            .flat_map(|j| j.hits.iter().cloned())
            .collect(),
        batch.refund,
    );
    let call = async {
        client
            .apply(request)
            .await
            .map(|r| r.into_inner().decisions)
            .map_err(|s| format!("peer call failed: {}", s.message()))
    };
    let result = match tokio::time::timeout(timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(format!("peer did not answer within {timeout:?}")),
    };
    deliver(batch, result);
}

/// Splits a call's decisions among the jobs of its batch, in order (refunds get none); a
/// wrong count of decisions fails every job.
fn deliver(batch: Batch, result: Result<Vec<PeerDecision>, String>) {
    let Batch { jobs, refund, size } = batch;
    let result = result.and_then(|decisions| {
        if refund || decisions.len() == size {
            Ok(decisions)
        } else {
            Err(format!(
                "peer answered {} decisions for {size} hits",
                decisions.len()
            ))
        }
    });
    match result {
        Ok(decisions) => {
            let mut rest = decisions.into_iter();
            for job in jobs {
                let mine = if refund {
                    Vec::new()
                } else {
                    rest.by_ref().take(job.hits.len()).collect()
                };
                let _ = job.reply.send(Ok(mine));
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Every algorithm and unit with the number it has on the wire. These are the .proto's
    /// numbers and may never change within a protocol version.
    const ALGORITHMS: [(Algorithm, i32); 4] = [
        (Algorithm::FixedWindow, 0),
        (Algorithm::SlidingWindow, 1),
        (Algorithm::TokenBucket, 2),
        (Algorithm::LeakyBucket, 3),
    ];
    const UNITS: [(Unit, i32); 7] = [
        (Unit::Second, 1),
        (Unit::Minute, 2),
        (Unit::Hour, 3),
        (Unit::Day, 4),
        (Unit::Month, 5),
        (Unit::Year, 6),
        (Unit::Week, 7),
    ];

    fn hit(key: &str, rate: u32, unit: Unit, algorithm: Algorithm, burst: u32, n: u64) -> PeerHit {
        let quota = Quota {
            requests_per_unit: rate,
            unit,
            algorithm,
            burst: NonZeroU32::new(burst),
        };
        PeerHit::from_hit(&Hit {
            key,
            quota,
            hits: n,
        })
    }

    /// One hit of each algorithm, on several units.
    fn known_batch() -> ApplyRequest {
        ApplyRequest::new(
            vec![
                hit("d_k_v_", 10, Unit::Hour, Algorithm::FixedWindow, 0, 1),
                hit("d_k_w_", 5, Unit::Day, Algorithm::SlidingWindow, 0, 2),
                hit("d_k_x_", 100, Unit::Minute, Algorithm::TokenBucket, 20, 3),
                hit("d_k_y_", 7, Unit::Week, Algorithm::LeakyBucket, 2, 300),
            ],
            false,
        )
    }

    /// The bytes of [`known_batch`]. Without the final `1801` (protocol_version 1) they are
    /// exactly what the unversioned protocol before the .proto sent, which is why a node of
    /// that build reads version 1 hits right.
    const KNOWN_BATCH_HEX: &str = concat!(
        "0a0e0a06645f6b5f765f100a18033001",
        "0a100a06645f6b5f775f100518042001",
        "30020a120a06645f6b5f785f10641802",
        "2002281430030a130a06645f6b5f795f",
        "100718072003280230ac02",
        "1801",
    );

    /// Two decisions, one over the limit.
    fn known_answer() -> ApplyResponse {
        ApplyResponse {
            decisions: vec![
                PeerDecision {
                    over: false,
                    remaining: 9,
                    reset_after_secs: 3_599,
                    count_before: 0,
                    count_after: 1,
                },
                PeerDecision {
                    over: true,
                    remaining: 0,
                    reset_after_secs: 60,
                    count_before: 5,
                    count_after: 7,
                },
            ],
        }
    }

    const KNOWN_ANSWER_HEX: &str = "0a071009188f1c28010a080801183c20052807";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn pinned_wire_bytes() {
        // An accidental change to the .proto, the mapping or the encoder fails here first.
        assert_eq!(hex(&known_batch().encode_to_vec()), KNOWN_BATCH_HEX);
        assert_eq!(hex(&known_answer().encode_to_vec()), KNOWN_ANSWER_HEX);
        let batch = ApplyRequest::decode(unhex(KNOWN_BATCH_HEX).as_slice()).expect("decodes");
        assert_eq!(batch, known_batch());
        assert_eq!(batch.protocol_version, 1);
        let quotas: Vec<Quota> = batch.hits.iter().map(|h| h.quota().unwrap()).collect();
        assert_eq!(
            quotas.iter().map(|q| q.algorithm).collect::<Vec<_>>(),
            Algorithm::ALL
        );
        assert_eq!(
            quotas[2],
            Quota {
                requests_per_unit: 100,
                unit: Unit::Minute,
                algorithm: Algorithm::TokenBucket,
                burst: NonZeroU32::new(20),
            }
        );
        let answer = ApplyResponse::decode(unhex(KNOWN_ANSWER_HEX).as_slice()).expect("decodes");
        assert_eq!(answer, known_answer());
    }

    #[test]
    fn every_algorithm_and_unit_has_its_pinned_number_both_ways() {
        for (a, n) in ALGORITHMS {
            assert_eq!(algorithm_to_wire(a) as i32, n, "{a:?}");
            assert_eq!(algorithm_from_wire(n), Some(a), "{n}");
        }
        for (u, n) in UNITS {
            assert_eq!(unit_to_wire(u) as i32, n, "{u:?}");
            assert_eq!(unit_from_wire(n), Some(u), "{n}");
        }
        // Every variant is in the tables (a new one needs a number there and in the .proto).
        assert_eq!(ALGORITHMS.len(), Algorithm::ALL.len());
        assert_eq!(UNITS.len(), Unit::ALL.len());
    }

    #[test]
    fn unknown_algorithm_and_unit_numbers_are_refused_naming_the_number() {
        let refused = |unit: i32, algorithm: i32| {
            let mut h = hit("k", 1, Unit::Second, Algorithm::FixedWindow, 0, 1);
            h.unit = unit;
            h.algorithm = algorithm;
            let status = h.quota().expect_err("refused");
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            status.message().to_owned()
        };
        assert_eq!(refused(1, 4), "peer hit: unknown algorithm number 4");
        assert_eq!(refused(1, -1), "peer hit: unknown algorithm number -1");
        assert_eq!(refused(0, 0), "peer hit: unknown unit number 0");
        assert_eq!(refused(8, 0), "peer hit: unknown unit number 8");
        assert_eq!(
            refused(i32::MIN, 9),
            "peer hit: unknown unit number -2147483648"
        );
    }

    #[test]
    fn only_this_nodes_protocol_version_is_accepted() {
        assert!(version_mismatch(PROTOCOL_VERSION).is_none());
        assert_eq!(known_batch().protocol_version, PROTOCOL_VERSION);
        for (other, message) in [
            (
                0,
                "peer protocol version 0 is not supported by this node (speaks 1)",
            ),
            (
                2,
                "peer protocol version 2 is not supported by this node (speaks 1)",
            ),
        ] {
            let status = version_mismatch(other).expect("refused");
            assert_eq!(status.code(), tonic::Code::FailedPrecondition);
            assert_eq!(status.message(), message);
        }
    }

    /// A node of a later version: it answers only version 2 calls, as this node answers only
    /// its own.
    struct LaterNode;

    #[tonic::async_trait]
    impl wire::peer_server::Peer for LaterNode {
        async fn apply(
            &self,
            request: tonic::Request<ApplyRequest>,
        ) -> Result<tonic::Response<ApplyResponse>, tonic::Status> {
            let version = request.get_ref().protocol_version;
            Err(tonic::Status::failed_precondition(format!(
                "peer protocol version {version} is not supported by this node (speaks 2)"
            )))
        }
    }

    #[tokio::test]
    async fn a_peer_of_another_version_fails_the_forward_with_its_message() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(wire::peer_server::PeerServer::new(LaterNode))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let stats = Arc::new(super::super::ClusterStats::default());
        let timeout = Duration::from_secs(5);
        let client = PeerClient::start(&addr, timeout, Duration::from_millis(1), None, stats)
            .expect("a client");
        let hits = vec![hit("d_k_v_", 10, Unit::Hour, Algorithm::FixedWindow, 0, 1)];
        let error = client.apply(hits, false).await.expect_err("refused");
        assert_eq!(
            error,
            "peer call failed: peer protocol version 1 is not supported by this node (speaks 2)"
        );
        server.abort();
    }
}
