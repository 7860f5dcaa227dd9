//! The HTTP adapter on PORT: `/json` (proto3 JSON in and out), `/healthcheck`, and nginx's
//! `auth_request` endpoint `/nginx` (in [`super::nginx`]).
//!
//! `/json` answers as envoyproxy/ratelimit does: 200 for OK, 429 for OVER_LIMIT, and 400 for a
//! bad body or any service error (including backend errors). The 400 body starts with the Go
//! service's `Bad Request` line and adds a second line saying what was wrong.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;

use super::convert::response_to_proto;
use super::health::Health;
use super::json::encode_response;
use crate::service::{Code, RateLimitService};
use crate::store::CounterStore;

struct HttpState<S> {
    service: Arc<RateLimitService<S>>,
    health: Arc<Health>,
    max_request_bytes: usize,
}

/// The router for PORT.
pub fn router<S: CounterStore>(
    service: Arc<RateLimitService<S>>,
    health: Arc<Health>,
    max_request_bytes: usize,
) -> Router {
    let auth = super::forward_auth::router(service.clone(), max_request_bytes);
    let state = Arc::new(HttpState {
        service,
        health,
        max_request_bytes,
    });
    Router::new()
        .route("/json", any(json::<S>))
        .route("/healthcheck", any(healthcheck::<S>))
        .with_state(state)
        .merge(auth)
}

fn bad_request(reason: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_REQUEST,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("Bad Request\n{reason}\n"),
    )
        .into_response()
}

async fn json<S: CounterStore>(
    State(st): State<Arc<HttpState<S>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let trace = super::trace_context(
        st.service.observer().traces(),
        crate::telemetry::otlp::Transport::Json,
        &headers,
    );
    let request = match super::json::read_request(body, st.max_request_bytes).await {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    match st.service.should_rate_limit_traced(request, &trace).await {
        Ok(response) => {
            let status = match response.overall_code {
                Code::Ok => StatusCode::OK,
                Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
            };
            let body = encode_response(&response_to_proto(response));
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(e) => bad_request(e),
    }
}

async fn healthcheck<S: CounterStore>(State(st): State<Arc<HttpState<S>>>) -> Response {
    if st.health.is_healthy() {
        (StatusCode::OK, "OK").into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}
