//! The owner's side of the peer protocol: [`PeerServer`] routes and decodes each call (the
//! generated `Peer` service), `Owner` answers it. Apply's hits go to this node's counters
//! through [`OwnerStore`], so forwarded hits are loaded and written behind like
//! local ones, and relayed to their previous owner while this node joins (a hit relayed to it
//! is applied here); Lease asks go to this node's lease server (their wire form is
//! `cluster::lease::wire`); Quota calls go to the Rate Limit Quota Service, through
//! [`RlqsOwner`] (its wire form is beside the quota peers, `cluster::rlqs_peers`).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;

use super::{
    ApplyRequest, ApplyResponse, LeaseGrant, LeaseRequest, LeaseResponse, PeerDecision, PeerHit,
    version_mismatch, wire,
};
use crate::clock::{Clock, Timestamp};
use crate::cluster::{OwnerStore, Served};
use crate::store::{Hit, StoreError};

/// The buckets' owner as the `Quota` call reaches it: this node's Rate Limit Quota Service,
/// which splits each bucket it owns across every node's Envoys. Implemented beside the quota
/// peers, which hold the call's wire form, so the peer server names no quota type.
pub trait RlqsOwner: Send + Sync {
    /// The parts of `node`'s holders of `buckets`, one list per bucket; a call past the bounds,
    /// or a rate that is not one, is refused whole (INVALID_ARGUMENT).
    fn answer(
        &self,
        node: &str,
        buckets: Vec<wire::QuotaBucket>,
    ) -> Result<Vec<wire::QuotaParts>, tonic::Status>;
}

/// This node's runtime limits as the `Limits` call reaches them: pushes applied, pulls answered
/// a page at a time. Implemented beside the runtime-limit peers (`cluster::runtime_peers`),
/// which hold the call's wire form.
pub trait LimitsOwner: Send + Sync {
    /// Applies a peer's changes; a call past the bounds is refused whole (INVALID_ARGUMENT).
    fn push(&self, node: &str, changes: Vec<wire::RuntimeLimitChange>)
    -> Result<(), tonic::Status>;
    /// The page of limits and removals after `after`, and the key to pull after next.
    fn pull(&self, after: &str) -> (Vec<wire::RuntimeLimitChange>, String);
    /// This node's digest of its runtime limits, for a peer to compare with its own.
    fn digest(&self) -> wire::LimitsDigest;
}

/// The peer listener's service: the owner's side of every call.
#[derive(Clone)]
pub struct PeerServer {
    grpc: wire::peer_server::PeerServer<Owner>,
}

impl PeerServer {
    /// `quota`: the Rate Limit Quota Service, whose buckets this node splits as their owner.
    /// `limits`: this node's runtime limits.
    pub fn new(
        local: Arc<OwnerStore>,
        clock: Arc<dyn Clock>,
        quota: Option<Arc<dyn RlqsOwner>>,
        limits: Option<Arc<dyn LimitsOwner>>,
    ) -> Self {
        PeerServer {
            grpc: wire::peer_server::PeerServer::new(Owner {
                local,
                clock,
                quota,
                limits,
            }),
        }
    }
}

/// What [`PeerServer`] answers each call with.
struct Owner {
    local: Arc<OwnerStore>,
    clock: Arc<dyn Clock>,
    quota: Option<Arc<dyn RlqsOwner>>,
    limits: Option<Arc<dyn LimitsOwner>>,
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

    async fn lease(
        &self,
        request: tonic::Request<LeaseRequest>,
    ) -> Result<tonic::Response<LeaseResponse>, tonic::Status> {
        let mut req = request.into_inner();
        if let Some(refused) = version_mismatch(req.protocol_version) {
            return Err(refused);
        }
        let asks = req.take_asks()?;
        let now = self.clock.now();
        let grants = self
            .local
            .answer_leases(&req.node, &asks, now)
            .await
            .ok_or_else(|| {
                tonic::Status::failed_precondition(
                    "this node is not in lease mode (SLUICE_CLUSTER_MODE=lease on every peer)",
                )
            })?;
        let permit = req
            .free_shares
            .then(|| self.local.permit(&req.node, now))
            .flatten()
            .map(|p| wire::FreePermit {
                since_us: p.since_us,
                valid_us: p.valid_us,
                share_ppm: p.share_ppm,
            });
        let recalls = match permit {
            Some(_) => self.local.recalls(&req.node),
            None => Vec::new(),
        };
        Ok(tonic::Response::new(LeaseResponse {
            grants: grants.iter().map(LeaseGrant::from).collect(),
            permit,
            recalls: recalls.iter().map(wire::FreeRecall::from).collect(),
        }))
    }

    async fn quota(
        &self,
        request: tonic::Request<wire::QuotaRequest>,
    ) -> Result<tonic::Response<wire::QuotaResponse>, tonic::Status> {
        let req = request.into_inner();
        if let Some(refused) = version_mismatch(req.protocol_version) {
            return Err(refused);
        }
        let quota = self.quota.as_ref().ok_or_else(|| {
            tonic::Status::failed_precondition("this node serves no Rate Limit Quota Service")
        })?;
        let buckets = quota.answer(&req.node, req.buckets)?;
        Ok(tonic::Response::new(wire::QuotaResponse { buckets }))
    }

    async fn limits(
        &self,
        request: tonic::Request<wire::LimitsRequest>,
    ) -> Result<tonic::Response<wire::LimitsResponse>, tonic::Status> {
        let req = request.into_inner();
        if let Some(refused) = version_mismatch(req.protocol_version) {
            return Err(refused);
        }
        let limits = self.limits.as_ref().ok_or_else(|| {
            tonic::Status::failed_precondition("this node keeps no runtime limits")
        })?;
        limits.push(&req.node, req.changes)?;
        let digest = req.digest.then(|| limits.digest());
        let (entries, next) = if req.pull {
            limits.pull(&req.after)
        } else {
            (Vec::new(), String::new())
        };
        Ok(tonic::Response::new(wire::LimitsResponse {
            entries,
            next,
            digest,
        }))
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
        let relay = req
            .hits
            .iter()
            .map(PeerHit::how_relayed)
            .collect::<Result<Vec<_>, _>>()?;
        // The owner's clock decides, so each counter lives on one timeline.
        let now = self.clock.now();
        let op = req.op();
        let served = self
            .local
            .serve(op, now, &hits, &relay)
            .await
            .map_err(store_status)?;
        if !op.answers() {
            return Ok(ApplyResponse::default());
        }
        Ok(ApplyResponse {
            decisions: served
                .iter()
                .map(|answer| match answer {
                    Served::Decided(d) => PeerDecision::from(d),
                    Served::Taken(window, values, penalty) => PeerDecision::taken(
                        *window,
                        values.clone(),
                        penalty.map_or(0, Timestamp::micros),
                    ),
                })
                .collect(),
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
