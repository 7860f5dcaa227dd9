//! The HTTP adapter on PORT: `/json` (proto3 JSON in and out), `/healthcheck`, and nginx's
//! `auth_request` endpoint `/nginx` (in [`super::forward_auth`]).
//!
//! `/json` answers as envoyproxy/ratelimit does: 200 for OK, 429 for OVER_LIMIT, and 400 for a
//! bad body or any service error (including backend errors), a body over SLUICE_MAX_REQUEST_BYTES
//! too (not [`super::BadRequest`]'s 413: the Go service answers 400 to every failure). The 400
//! body starts with the Go service's `Bad Request` line and adds a second line saying what was
//! wrong.

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
    let read = super::body::read(body, st.max_request_bytes).await;
    let request = match read.and_then(|bytes| super::json::request(&bytes)) {
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
    match st.health.unhealthy() {
        None => (StatusCode::OK, "OK").into_response(),
        Some(why) => (StatusCode::INTERNAL_SERVER_ERROR, why.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Bytes;
    use axum::http::Request as HttpRequest;
    use tower_service::Service;

    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::config::{ConfigHandle, LoadOptions, parse_files};
    use crate::service::ServiceOptions;
    use crate::store::MemoryStore;

    const MAX_BYTES: usize = 128;

    fn app() -> Router {
        let yaml = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
        let files = [("edge.yaml".to_string(), yaml.to_string())];
        let cfg = parse_files(&files, &LoadOptions::default()).expect("test config loads");
        let config = ConfigHandle::new(Some(cfg));
        let service = Arc::new(RateLimitService::new(
            config.clone(),
            Arc::new(MemoryStore::new(1000)),
            Arc::new(ManualClock::new(Timestamp::from_secs(2222))),
            ServiceOptions::default(),
        ));
        let ready = tokio::sync::watch::channel(true).1;
        let health = Arc::new(Health::new(config, false, ready));
        router(service, health, MAX_BYTES)
    }

    async fn post_json(body: Body) -> (StatusCode, String) {
        let request = HttpRequest::post("/json").body(body).expect("a request");
        let response = app().call(request).await.expect("infallible");
        crate::api::body::answer(response).await
    }

    #[tokio::test]
    async fn json_answers_a_body_over_the_cap_400_as_go_does() {
        let body = format!(r#"{{"domain":"edge","x":"{}"}}"#, "a".repeat(MAX_BYTES));
        let (status, text) = post_json(Body::from(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            text,
            "Bad Request\nrequest body is larger than 128 bytes (SLUICE_MAX_REQUEST_BYTES)\n"
        );
    }

    #[tokio::test]
    async fn json_answers_a_body_that_breaks_off_400_saying_so() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"{\"domain\"")),
            Err(std::io::Error::other("connection reset")),
        ];
        let body = Body::from_stream(futures_util::stream::iter(chunks));
        let (status, text) = post_json(body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            text.starts_with("Bad Request\nrequest body could not be read: "),
            "{text}"
        );
    }

    #[tokio::test]
    async fn json_answers_a_bad_body_with_the_decoder_s_reason() {
        let (status, text) = post_json(Body::from(r#"{"domain":1}"#)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            text,
            "Bad Request\ndomain: expected a string, found a number\n"
        );
        let unit = r#"{"domain":"edge","descriptors":[{"limit":{"unit":9}}]}"#;
        let (status, text) = post_json(Body::from(unit)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            text.contains("descriptors[0].limit.unit: 9 is not a valid unit"),
            "{text}"
        );
    }
}
