//! Adapters only: decode a protocol's request into [`crate::descriptor::Request`], call
//! [`crate::service::RateLimitService`], encode its [`crate::service::Response`]. Errors are
//! mapped to gRPC and HTTP statuses here and nowhere else.
//!
//! - [`grpc`]: `envoy.service.ratelimit.v3.RateLimitService` and `grpc.health.v1.Health`.
//! - [`rlqs`]: `envoy.service.rate_limit_quota.v3.RateLimitQuotaService` (Envoy's
//!   `rate_limit_quota` filter), over [`crate::rlqs`].
//! - [`http`]: `/json`, `/healthcheck`, `/nginx` and `/forward-auth` on PORT.
//! - [`json`]: the proto3-JSON codec of `/json` (a tree, decode, encode, the well-known types).
//! - [`forward_auth`]: the auth-subrequest endpoints (nginx `auth_request`, Traefik, Caddy):
//!   headers or a query string in, 200 or a refusal with `RateLimit-*` out.
//! - [`spoa`]: HAProxy's SPOE: an agent on SPOA_PORT whose answers set HAProxy variables.
//! - [`health`]: the health state behind `/healthcheck` and gRPC's health service.
//! - [`convert`]: protobuf <-> domain types, shared by gRPC and `/json`.
//! - [`bad_request`]: [`BadRequest`], every adapter's refusal of a request it cannot decode,
//!   with its HTTP status and gRPC code; [`body`]: HTTP request bodies read up to the cap.
//! - [`trace_context`]: the caller's trace context from gRPC metadata or HTTP headers.
//!
//! The debug port's admin (status page, explain, counters, the runtime limits API, its tokens)
//! is not an adapter: it is [`crate::admin`], above this module.

pub(crate) mod bad_request;
pub(crate) mod body;
pub mod convert;
pub mod forward_auth;
pub mod grpc;
pub mod health;
pub mod http;
pub mod json;
pub(crate) mod rlqs;
pub(crate) mod spoa;

/// The caller's trace context (`traceparent`, B3), read only when tracing is on, so a service
/// without tracing does no header lookups.
pub(crate) fn trace_context(
    enabled: bool,
    transport: crate::telemetry::otlp::Transport,
    headers: &axum::http::HeaderMap,
) -> crate::telemetry::otlp::RequestTrace {
    let parent = if enabled {
        crate::telemetry::otlp::propagation::extract(|name| {
            headers.get(name).and_then(|v| v.to_str().ok())
        })
    } else {
        None
    };
    crate::telemetry::otlp::RequestTrace { transport, parent }
}
