//! The gRPC adapter: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` and
//! `grpc.health.v1.Health`.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService as RateLimitServiceApi, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio_stream::{Stream, StreamExt};
use tonic::service::Routes;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health as HealthApi, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::bad_request::BadRequest;
use super::convert::{request_from_proto, response_to_proto};
use super::health::Health;
use crate::service::{RateLimitService, ServiceError};
use crate::store::CounterStore;

/// The gRPC health service name that mirrors `/healthcheck`, as in the Go service.
pub(crate) const HEALTH_SERVICE: &str = "ratelimit";

/// Maps a service error to a gRPC status.
///
/// Fail-open versus fail-closed is *not* decided here: backend errors (including a full
/// memory store) answer UNKNOWN, as the Go service does, and Envoy's `failure_mode_deny`
/// decides whether the request passes. Requests outside Sluice's caps are the client's fault
/// and answer INVALID_ARGUMENT.
pub(crate) fn status_for(e: &ServiceError) -> tonic::Status {
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
            self.service.observer().traces(),
            crate::telemetry::otlp::Transport::Grpc,
            request.metadata().as_ref(),
        );
        let request = request_from_proto(request.into_inner())
            .map_err(|e| tonic::Status::from(BadRequest::from(e)))?;
        match self.service.should_rate_limit_traced(request, &trace).await {
            Ok(response) => Ok(tonic::Response::new(response_to_proto(response))),
            Err(e) => Err(status_for(&e)),
        }
    }
}

/// The gRPC routes: the rate-limit service and the health service.
pub fn routes<S: CounterStore>(
    service: Arc<RateLimitService<S>>,
    health: Arc<Health>,
    max_request_bytes: usize,
) -> Routes {
    let rls = RateLimitServiceServer::new(GrpcRateLimit::new(service))
        .max_decoding_message_size(max_request_bytes);
    Routes::new(rls).add_service(HealthServer::new(GrpcHealth { health }))
}

/// `grpc.health.v1.Health`: service `ratelimit` answers what `/healthcheck` answers, computed
/// when asked; `""` (the server) is always SERVING; any other name is NOT_FOUND, as in grpc-go.
struct GrpcHealth {
    health: Arc<Health>,
}

fn health_response(serving: bool) -> HealthCheckResponse {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    HealthCheckResponse {
        status: status as i32,
    }
}

type HealthStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl HealthApi for GrpcHealth {
    async fn check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        match request.get_ref().service.as_str() {
            "" => Ok(tonic::Response::new(health_response(true))),
            HEALTH_SERVICE => Ok(tonic::Response::new(health_response(
                self.health.is_healthy(),
            ))),
            _ => Err(tonic::Status::not_found("service not registered")),
        }
    }

    type WatchStream = HealthStream;

    /// The status now, then each change as it happens.
    async fn watch(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthStream>, tonic::Status> {
        let stream: HealthStream = match request.get_ref().service.as_str() {
            "" => Box::pin(
                tokio_stream::once(Ok(health_response(true))).chain(tokio_stream::pending()),
            ),
            HEALTH_SERVICE => Box::pin(
                tokio_stream::wrappers::WatchStream::new(self.health.subscribe())
                    .map(|serving| Ok(health_response(serving))),
            ),
            _ => return Err(tonic::Status::not_found("service not registered")),
        };
        Ok(tonic::Response::new(stream))
    }
}
