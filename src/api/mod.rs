//! Adapters only: decode a protocol's request into [`crate::descriptor::Request`], call
//! [`crate::service::RateLimitService`], encode its [`crate::service::Response`]. Errors are
//! mapped to gRPC and HTTP statuses here and nowhere else.
//!
//! - [`grpc`]: `envoy.service.ratelimit.v3.RateLimitService` and `grpc.health.v1.Health`.
//! - [`http`]: `/json`, `/healthcheck` and `/nginx` on PORT.
//! - [`nginx`]: the `auth_request` endpoint: headers in, 200/403 with `RateLimit-*` out.
//! - [`debug`]: `/rlconfig`, `/metrics` and `/stats` on DEBUG_PORT.
//! - [`convert`]: protobuf <-> domain types, shared by gRPC and `/json`.

pub mod convert;
pub mod debug;
pub mod grpc;
pub mod health;
pub mod http;
pub mod json;
pub mod nginx;
