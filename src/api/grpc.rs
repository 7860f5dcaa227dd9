//! The gRPC adapter: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` and
//! `grpc.health.v1.Health`.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService as RateLimitServiceApi, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::service::Routes;
use tonic_health::ServingStatus;

use super::convert::{request_from_proto, response_to_proto};
use super::health::Health;
use crate::service::{RateLimitService, ServiceError};
use crate::store::CounterStore;

/// The gRPC health service name that mirrors `/healthcheck`, as in the Go service.
pub const HEALTH_SERVICE: &str = "ratelimit";

/// Maps a service error to a gRPC status.
///
/// Fail-open versus fail-closed is *not* decided here: backend errors (including a full
/// memory store) answer UNKNOWN, as the Go service does, and Envoy's `failure_mode_deny`
/// decides whether the request passes. Requests outside Sluice's caps are the client's fault
/// and answer INVALID_ARGUMENT.
pub fn status_for(e: &ServiceError) -> tonic::Status {
    if e.is_invalid_argument() {
        tonic::Status::invalid_argument(e.to_string())
    } else {
        tonic::Status::unknown(e.to_string())
    }
}

/// The `ShouldRateLimit` adapter.
///
/// SLUICE_MAX_REQUEST_BYTES is not checked here: the listener ([`crate::net`]) refuses a longer
/// message from its length prefix, before anything is decoded or buffered, and the decoder's
/// own limit is set to the same value.
pub struct GrpcRateLimit<S> {
    service: Arc<RateLimitService<S>>,
}

impl<S> GrpcRateLimit<S> {
    pub fn new(service: Arc<RateLimitService<S>>) -> Self {
        GrpcRateLimit { service }
    }
}

#[tonic::async_trait]
impl<S: CounterStore> RateLimitServiceApi for GrpcRateLimit<S> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        // gRPC metadata is the request's HTTP/2 headers.
        let trace = super::trace_context(
            self.service.tracer().enabled(),
            crate::telemetry::otlp::Transport::Grpc,
            request.metadata().as_ref(),
        );
        let request = request_from_proto(request.into_inner())
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        match self.service.should_rate_limit_traced(request, &trace).await {
            Ok(response) => Ok(tonic::Response::new(response_to_proto(response))),
            Err(e) => Err(status_for(&e)),
        }
    }
}

/// The gRPC routes: the rate-limit service and the health service. Also returns the task that
/// keeps the health service's `ratelimit` status in step with [`Health`]; it stops when the
/// returned handle is aborted or dropped with the runtime.
pub fn routes<S: CounterStore>(
    service: Arc<RateLimitService<S>>,
    health: Arc<Health>,
    max_request_bytes: usize,
) -> (Routes, tokio::task::JoinHandle<()>) {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let updater = tokio::spawn(async move {
        let mut last = None;
        loop {
            let status = if health.is_healthy() {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            if last != Some(status) {
                reporter.set_service_status(HEALTH_SERVICE, status).await;
                last = Some(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let rls = RateLimitServiceServer::new(GrpcRateLimit::new(service))
        .max_decoding_message_size(max_request_bytes);
    let routes = Routes::new(rls).add_service(health_service);
    (routes, updater)
}
