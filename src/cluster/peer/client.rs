//! The caller's side of the peer protocol: one [`PeerClient`] per remote peer, over one
//! long-lived HTTP/2 connection (mutual TLS with SLUICE_PEER_TLS). Apply calls are batched
//! (`batch.rs`); Lease and Quota calls go out as they come (renewals and syncs are one call
//! per peer already). Every call is bounded by SLUICE_PEER_TIMEOUT_MS (a Lease call in a cluster
//! below a parent, by SLUICE_LEASE_PARENT_TIMEOUT_MS more), and fails with a
//! [`PeerError`] that says why.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::batch::{self, Job};
use super::{
    ApplyRequest, Call, LeaseAsk, LeaseGrant, LeaseRequest, Malformed, Op, PROTOCOL_VERSION,
    PeerDecision, PeerError, PeerHit, wire,
};
use crate::cluster::ClusterStats;
use crate::tls::PeerTls;

/// How often a peer connection is pinged (HTTP/2 PING), idle or not.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);

/// How long a ping may go unanswered before its connection is dropped: the peer timeout, and at
/// least a second, so that a slow link (a ping waits behind the data before it) is not taken
/// for a cut one.
fn keepalive_timeout(peer_timeout: Duration) -> Duration {
    peer_timeout.max(Duration::from_secs(1))
}

/// The forwarding side for one peer: a task that batches concurrent forwards into one call
/// over a long-lived HTTP/2 connection.
#[derive(Clone)]
pub struct PeerClient {
    jobs: mpsc::Sender<Job>,
    timeout: Duration,
    /// A Lease call's deadline: the timeout, plus, below a parent, how long the owner may
    /// wait for the parent's grant ([`PeerClient::with_lease_wait`]).
    lease_timeout: Duration,
    /// For lease calls, which are not batched here (renewals are one call per peer already).
    grpc: wire::peer_client::PeerClient<tonic::transport::Channel>,
}

impl PeerClient {
    /// Starts the batching task for the peer at `addr` (`host:port`), over mutual TLS with
    /// `tls`.
    pub fn start(
        addr: &str,
        timeout: Duration,
        window: Duration,
        tls: Option<&PeerTls>,
        stats: Arc<ClusterStats>,
    ) -> Result<Self, PeerError> {
        // `http://` either way: with TLS the connector does the handshake under tonic, so that
        // each new connection presents the certificate as last reloaded (tonic's own TLS
        // config keeps the identity it was built with).
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| PeerError::Address {
                addr: addr.to_owned(),
                source: Arc::new(e),
            })?
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            // A connection whose packets vanish (a cut link) is dropped after one unanswered
            // ping instead of waiting out TCP's retransmission backoff, which after a long cut
            // reaches seconds: the next call (a probe every 500 ms) dials afresh, so a healed
            // link is used again within about a probe (issue 35's heal scenarios).
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(keepalive_timeout(timeout))
            .keep_alive_while_idle(true);
        let channel = match tls {
            None => endpoint.connect_lazy(),
            Some(tls) => {
                let connector = tls
                    .connector(addr)
                    .map_err(|e| PeerError::Tls(Arc::new(e)))?;
                endpoint.connect_with_connector_lazy(connector)
            }
        };
        let grpc = wire::peer_client::PeerClient::new(channel);
        let caller = grpc.clone();
        let jobs = batch::start(
            move |hits, op| apply_call(caller.clone(), hits, op, timeout),
            window,
            stats,
        );
        Ok(PeerClient {
            jobs,
            timeout,
            lease_timeout: timeout,
            grpc,
        })
    }

    /// The client, its Lease calls allowed `wait` more than the timeout: a child cluster's
    /// owner may wait that long for its parent's grant on a key new to the cluster before it
    /// answers (SLUICE_LEASE_PARENT_TIMEOUT_MS).
    pub(crate) fn with_lease_wait(self, wait: Duration) -> Self {
        PeerClient {
            lease_timeout: self.timeout + wait,
            ..self
        }
    }

    /// A unary call's answer within `deadline`, or what went wrong.
    async fn bounded<T>(
        what: Call,
        deadline: Duration,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, PeerError> {
        match tokio::time::timeout(deadline, call).await {
            Ok(Ok(answer)) => Ok(answer.into_inner()),
            Ok(Err(s)) => Err(PeerError::from_status(what, s)),
            Err(_) => Err(PeerError::Timeout { after: deadline }),
        }
    }

    /// One Lease call from `node` (this node's advertised address) carrying `asks`, bounded by
    /// the Lease deadline: one grant per ask, in order.
    pub async fn lease(
        &self,
        node: &str,
        asks: Vec<LeaseAsk>,
    ) -> Result<Vec<LeaseGrant>, PeerError> {
        Ok(self.lease_with_permit(node, asks, false).await?.grants)
    }

    /// [`Self::lease`], asking for a permit for free shares when `free` (lease mode's nodes;
    /// not a child cluster asking its parent): the answer, with the permit if the owner gave
    /// one and its recalls.
    pub(crate) async fn lease_with_permit(
        &self,
        node: &str,
        asks: Vec<LeaseAsk>,
        free: bool,
    ) -> Result<wire::LeaseResponse, PeerError> {
        let n = asks.len();
        let request = LeaseRequest {
            protocol_version: PROTOCOL_VERSION,
            node: node.to_owned(),
            asks,
            free_shares: free,
        };
        let mut grpc = self.grpc.clone();
        let response = Self::bounded(Call::Lease, self.lease_timeout, grpc.lease(request)).await?;
        if response.grants.len() != n {
            return Err(PeerError::Malformed(Malformed::Grants {
                got: response.grants.len(),
                asks: n,
            }));
        }
        Ok(response)
    }

    /// One Quota call from `node` carrying this node's holders of `buckets`, bounded by the
    /// timeout: the owner's parts, one list per bucket, each as long as its holders.
    pub async fn quota(
        &self,
        node: &str,
        buckets: Vec<wire::QuotaBucket>,
    ) -> Result<Vec<Vec<u64>>, PeerError> {
        let shape: Vec<usize> = buckets.iter().map(|b| b.holders.len()).collect();
        let request = wire::QuotaRequest {
            protocol_version: PROTOCOL_VERSION,
            node: node.to_owned(),
            buckets,
        };
        let mut grpc = self.grpc.clone();
        let parts = Self::bounded(Call::Quota, self.timeout, grpc.quota(request))
            .await?
            .buckets;
        let answered: Vec<usize> = parts.iter().map(|p| p.assigned.len()).collect();
        if answered != shape {
            return Err(PeerError::Malformed(Malformed::Parts {
                answered,
                asked: shape,
            }));
        }
        Ok(parts.into_iter().map(|p| p.assigned).collect())
    }

    /// Runtime limits: pushes `changes` to the peer; with `pull`, asks for the page of its set
    /// after that key; with `digest`, for its digest. The answer: the page, the key to pull
    /// after next (empty at the end), and the peer's digest when asked (absent from a peer
    /// that predates the comparison).
    pub async fn limits(
        &self,
        node: &str,
        changes: Vec<wire::RuntimeLimitChange>,
        pull: Option<String>,
        digest: bool,
    ) -> Result<wire::LimitsResponse, PeerError> {
        let request = wire::LimitsRequest {
            protocol_version: PROTOCOL_VERSION,
            node: node.to_owned(),
            changes,
            pull: pull.is_some(),
            after: pull.unwrap_or_default(),
            digest,
        };
        let mut grpc = self.grpc.clone();
        Self::bounded(Call::Limits, self.timeout, grpc.limits(request)).await
    }

    /// Sends hits to the peer (batched with concurrent calls); bounded by the timeout.
    pub async fn apply(&self, hits: Vec<PeerHit>, op: Op) -> Result<Vec<PeerDecision>, PeerError> {
        let (reply, answer) = oneshot::channel();
        let job = Job { hits, op, reply };
        let sent = async {
            self.jobs
                .send(job)
                .await
                .map_err(|_| PeerError::NoClient("peer client stopped"))?;
            answer
                .await
                .map_err(|_| PeerError::NoClient("peer call dropped"))?
        };
        // A forward waits at most for a call in flight to come back (each bounded by the
        // timeout), then for its own call.
        match tokio::time::timeout(self.timeout * 2, sent).await {
            Ok(r) => r,
            Err(_) => Err(PeerError::Timeout {
                after: self.timeout,
            }),
        }
    }
}

/// One Apply call carrying `hits`, bounded by `timeout`. A refusal (another protocol version,
/// an unknown number) comes back as the owner's message, and the caller treats the peer as
/// failed.
async fn apply_call(
    mut client: wire::peer_client::PeerClient<tonic::transport::Channel>,
    hits: Vec<PeerHit>,
    op: Op,
    timeout: Duration,
) -> Result<Vec<PeerDecision>, PeerError> {
    let call = async {
        client
            .apply(ApplyRequest::new(hits, op))
            .await
            .map(|r| r.into_inner().decisions)
            .map_err(|s| PeerError::from_status(Call::Apply, s))
    };
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(PeerError::Timeout { after: timeout }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Quota, Unit};
    use crate::store::Hit;
    use wire::{ApplyRequest, ApplyResponse, LeaseResponse};

    /// A test peer: answers Apply with `apply`, an empty Lease call with no grants (after
    /// 300 ms from a node named `slow`), and no other call.
    struct TestPeer<F>(F);

    #[tonic::async_trait]
    impl<F> wire::peer_server::Peer for TestPeer<F>
    where
        F: Fn(ApplyRequest) -> Result<ApplyResponse, tonic::Status> + Send + Sync + 'static,
    {
        async fn apply(
            &self,
            request: tonic::Request<ApplyRequest>,
        ) -> Result<tonic::Response<ApplyResponse>, tonic::Status> {
            let req = request.into_inner();
            if req.hits.first().is_some_and(|h| h.key == "slow") {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            (self.0)(req).map(tonic::Response::new)
        }

        async fn lease(
            &self,
            request: tonic::Request<LeaseRequest>,
        ) -> Result<tonic::Response<LeaseResponse>, tonic::Status> {
            let req = request.into_inner();
            if !req.asks.is_empty() {
                return Err(tonic::Status::unimplemented("no leases"));
            }
            if req.node == "slow" {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Ok(tonic::Response::new(LeaseResponse::default()))
        }

        async fn quota(
            &self,
            _: tonic::Request<wire::QuotaRequest>,
        ) -> Result<tonic::Response<wire::QuotaResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("no quotas"))
        }

        async fn limits(
            &self,
            _: tonic::Request<wire::LimitsRequest>,
        ) -> Result<tonic::Response<wire::LimitsResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("no runtime limits"))
        }
    }

    /// Serves `apply` on a port of its own; a client for it with `timeout`.
    async fn serve<F>(apply: F, timeout: Duration) -> (PeerClient, tokio::task::JoinHandle<()>)
    where
        F: Fn(ApplyRequest) -> Result<ApplyResponse, tonic::Status> + Send + Sync + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(wire::peer_server::PeerServer::new(TestPeer(apply)))
                .serve_with_incoming(incoming)
                .await;
        });
        (client(&addr, timeout), server)
    }

    fn client(addr: &str, timeout: Duration) -> PeerClient {
        let stats = Arc::new(ClusterStats::default());
        PeerClient::start(addr, timeout, Duration::from_millis(1), None, stats).expect("a client")
    }

    fn hit(key: &str) -> PeerHit {
        PeerHit::from_hit(&Hit {
            key,
            quota: Quota::fixed(10, Unit::Hour),
            hits: 1,
        })
    }

    /// One decision per hit, as an owner answers.
    fn answered(req: ApplyRequest) -> Result<ApplyResponse, tonic::Status> {
        let d = PeerDecision {
            penalized: false,
            over: false,
            remaining: 9,
            reset_after_secs: 60,
            count_before: 1,
            count_after: 1,
            expired: 0,
            taken: None,
        };
        Ok(ApplyResponse {
            decisions: vec![d; req.hits.len()],
        })
    }

    #[tokio::test]
    async fn a_peer_of_another_version_fails_the_forward_with_its_message() {
        // A node of a later version: it answers only version 2 calls, as this node answers
        // only its own.
        let later = |req: ApplyRequest| {
            Err(tonic::Status::failed_precondition(format!(
                "peer protocol version {} is not supported by this node (speaks 2)",
                req.protocol_version
            )))
        };
        let (client, server) = serve(later, Duration::from_secs(5)).await;
        let error = client
            .apply(vec![hit("d_k_v_")], Op::Apply)
            .await
            .expect_err("refused");
        assert_eq!(
            error.to_string(),
            "peer call failed: peer protocol version 1 is not supported by this node (speaks 2)"
        );
        assert!(
            matches!(
                error,
                PeerError::Refused {
                    call: Call::Apply,
                    code: tonic::Code::FailedPrecondition,
                    ..
                }
            ),
            "{error:?}"
        );
        server.abort();
    }

    /// A refund answered with no decisions is a success (an older owner's), which the cluster
    /// then peeks at; a charge answered with none is still a broken answer.
    #[tokio::test]
    async fn a_refund_an_older_owner_answers_with_no_decisions_is_not_a_failure() {
        // An owner from before refunds answered: it gives the hits back and sends no decision.
        let older = |req: ApplyRequest| {
            if req.refund {
                Ok(ApplyResponse::default())
            } else {
                answered(req)
            }
        };
        let (client, server) = serve(older, Duration::from_secs(5)).await;
        let refunded = client.apply(vec![hit("d_k_v_"); 2], Op::Refund).await;
        assert_eq!(refunded.expect("a success"), Vec::new());
        let charged = client.apply(vec![hit("d_k_v_"); 2], Op::Apply).await;
        assert_eq!(charged.unwrap().len(), 2);
        server.abort();
    }

    #[tokio::test]
    async fn a_wrong_number_of_decisions_is_a_malformed_answer() {
        let short = |_| Ok(ApplyResponse::default());
        let (client, server) = serve(short, Duration::from_secs(5)).await;
        let error = client
            .apply(vec![hit("d_k_v_"); 2], Op::Apply)
            .await
            .expect_err("malformed");
        assert_eq!(
            error.to_string(),
            "peer answered 0 decisions for 2 hits",
            "{error:?}"
        );
        assert!(matches!(
            error,
            PeerError::Malformed(Malformed::Decisions { got: 0, hits: 2 })
        ));
        server.abort();
    }

    #[tokio::test]
    async fn a_peer_that_does_not_answer_in_time_is_a_timeout() {
        let timeout = Duration::from_millis(100);
        let (client, server) = serve(answered, timeout).await;
        let error = client
            .apply(vec![hit("slow")], Op::Apply)
            .await
            .expect_err("too slow");
        assert!(
            matches!(error, PeerError::Timeout { after } if after == timeout),
            "{error:?}"
        );
        assert_eq!(error.to_string(), "peer did not answer within 100ms");
        server.abort();
    }

    #[tokio::test]
    async fn a_lease_call_below_a_parent_may_take_the_parents_wait_beyond_the_timeout() {
        let timeout = Duration::from_millis(100);
        let (client, server) = serve(answered, timeout).await;
        let error = client
            .lease("slow", Vec::new())
            .await
            .expect_err("too slow");
        assert!(
            matches!(error, PeerError::Timeout { after } if after == timeout),
            "{error:?}"
        );
        let below = client.with_lease_wait(Duration::from_secs(2));
        let grants = below.lease("slow", Vec::new()).await;
        assert_eq!(grants.expect("answered within the wait").len(), 0);
        // Other calls keep the peer timeout.
        let error = below.apply(vec![hit("slow")], Op::Apply).await;
        assert!(
            matches!(error, Err(PeerError::Timeout { after }) if after == timeout),
            "{error:?}"
        );
        server.abort();
    }

    #[tokio::test]
    async fn a_peer_nobody_listens_for_is_unreachable_with_the_transport_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let client = client(&addr, Duration::from_secs(5));
        let error = client
            .apply(vec![hit("d_k_v_")], Op::Apply)
            .await
            .expect_err("nobody listens");
        let PeerError::Unreachable { call, status } = &error else {
            panic!("not unreachable: {error:?}");
        };
        assert_eq!(*call, Call::Apply);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            error.to_string().starts_with("peer call failed: "),
            "{error}"
        );
        let transport = std::error::Error::source(&error).and_then(std::error::Error::source);
        assert!(transport.is_some(), "the connect error is the source");
    }
}
