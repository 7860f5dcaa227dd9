//! One `RateLimit-*` header rule: the same decisions give the same headers through gRPC,
//! `/json` and `/nginx`, in normal, SHADOW_MODE and QUOTA_MODE, for the client's answer
//! (`response_headers_to_add`) and for the upstream (`request_headers_to_add`, and `/nginx`'s
//! allowed answers, with LIMIT_REQUEST_HEADERS_ENABLED). Without a network: the gRPC adapter and
//! the `/json` router are called directly, `/nginx` through its `check`.

use std::future::poll_fn;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request as HttpRequest};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService as _;
use sluice::api::grpc::GrpcRateLimit;
use sluice::api::health::Health;
use sluice::clock::{ManualClock, Timestamp};
use sluice::config::{ConfigHandle, LoadOptions, parse_files};
use sluice::service::{HeaderNames, RateLimitService, ServiceOptions};
use sluice::store::MemoryStore;
use tower_service::Service as _;

const CONFIG: &str = r#"
domain: hdr
descriptors:
  - key: one
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: two
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: three
    rate_limit: {unit: hour, requests_per_unit: 8}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: shady
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
"#;

const MAX_BYTES: usize = 64 * 1024;

/// The requests every adapter is sent, in order: each a list of descriptors of one entry.
/// Repeated, they go over in different orders and mixes (two over with different limits, a
/// quota one over next to a non-quota one, a per-rule shadow one, an unlimited one).
const SEQUENCE: &[&[(&str, &str)]] = &[
    &[("one", "a"), ("two", "a")],
    &[("two", "a"), ("one", "a")],
    &[("one", "a"), ("two", "a"), ("three", "a")],
    &[("quota", "a"), ("two", "b")],
    &[("two", "b"), ("quota", "a")],
    &[("quota", "a"), ("quota", "b")],
    &[("shady", "a"), ("three", "b")],
    &[("free", "a"), ("one", "b")],
    &[("three", "c"), ("one", "b"), ("two", "c"), ("free", "b")],
    &[("nomatch", "x")],
];

fn service(options: &ServiceOptions) -> Arc<RateLimitService<MemoryStore>> {
    let cfg = parse_files(
        &[("hdr.yaml".to_string(), CONFIG.to_string())],
        &LoadOptions::default(),
    )
    .expect("test config loads");
    // 2 s into a minute, so minute windows reset in 58 s and hour windows later.
    let clock = ManualClock::new(Timestamp::from_secs(2222));
    Arc::new(RateLimitService::new(
        ConfigHandle::new(Some(cfg)),
        Arc::new(MemoryStore::new(10_000)),
        Arc::new(clock),
        options.clone(),
    ))
}

fn proto(descriptors: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "hdr".into(),
        descriptors: descriptors
            .iter()
            .map(|(k, v)| RateLimitDescriptor {
                entries: vec![Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

type Headers = Vec<(String, String)>;

/// What one call answered: the headers for the client, those for the upstream, and whether the
/// request may go on.
#[derive(Debug, PartialEq)]
struct Answer {
    response: Headers,
    request: Headers,
    allowed: bool,
}

/// LIMIT_REQUEST_*_HEADER's names in these tests, apart from the response headers' names.
const UPSTREAM: [&str; 3] = ["x-quota-limit", "x-quota-remaining", "x-quota-reset"];

fn upstream_names() -> HeaderNames {
    HeaderNames {
        limit: "X-Quota-Limit".into(),
        remaining: "X-Quota-Remaining".into(),
        reset: "X-Quota-Reset".into(),
    }
}

fn lowercase(pairs: impl IntoIterator<Item = (String, String)>) -> Headers {
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}

async fn grpc(adapter: &GrpcRateLimit<MemoryStore>, descriptors: &[(&str, &str)]) -> Answer {
    let r = adapter
        .should_rate_limit(tonic::Request::new(proto(descriptors)))
        .await
        .expect("gRPC answers")
        .into_inner();
    let pairs = |headers: Vec<envoy_types::pb::envoy::config::core::v3::HeaderValue>| {
        lowercase(headers.into_iter().map(|h| (h.key, h.value)))
    };
    Answer {
        allowed: r.overall_code == Code::Ok as i32,
        response: pairs(r.response_headers_to_add),
        request: pairs(r.request_headers_to_add),
    }
}

/// `/json`'s answer: its status and body.
async fn json_call(router: &mut axum::Router, body: String) -> (u16, String) {
    let request = HttpRequest::post("/json").body(Body::from(body)).unwrap();
    poll_fn(|cx| {
        <axum::Router as tower_service::Service<HttpRequest<Body>>>::poll_ready(router, cx)
    })
    .await
    .unwrap();
    let response = router.call(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), MAX_BYTES)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).expect("UTF-8"))
}

fn json_body(descriptors: &[(&str, &str)]) -> String {
    let descriptors: Vec<_> = descriptors
        .iter()
        .map(|(k, v)| serde_json::json!({"entries": [{"key": k, "value": v}]}))
        .collect();
    serde_json::json!({"domain": "hdr", "descriptors": descriptors}).to_string()
}

async fn json(router: &mut axum::Router, descriptors: &[(&str, &str)]) -> Answer {
    let (status, body) = json_call(router, json_body(descriptors)).await;
    let body: serde_json::Value = serde_json::from_str(&body).expect("a JSON answer");
    let pairs = |field: &str| {
        let pairs = body[field]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|h| {
                        let text = |f: &str| h[f].as_str().unwrap_or_default().to_string();
                        (text("key"), text("value"))
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        lowercase(pairs)
    };
    Answer {
        allowed: status == 200,
        response: pairs("responseHeadersToAdd"),
        request: pairs("requestHeadersToAdd"),
    }
}

async fn nginx(service: &RateLimitService<MemoryStore>, descriptors: &[(&str, &str)]) -> Answer {
    let mut headers = HeaderMap::new();
    headers.insert("x-sluice-domain", HeaderValue::from_static("hdr"));
    let list: Vec<String> = descriptors
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    headers.insert(
        "x-sluice-descriptor",
        HeaderValue::from_str(&list.join(", ")).unwrap(),
    );
    let response = sluice::api::forward_auth::check(service, &headers, MAX_BYTES).await;
    let pairs = |names: [&str; 3]| -> Headers {
        names
            .into_iter()
            .filter_map(|name| {
                let value = response.headers().get(name)?.to_str().unwrap().to_string();
                Some((name.to_string(), value))
            })
            .collect()
    };
    Answer {
        allowed: response.status() == 200,
        response: pairs(["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"]),
        request: pairs(UPSTREAM),
    }
}

/// Runs [`SEQUENCE`] three times through each adapter, each on its own service with the same
/// options and clock, and returns what gRPC answered to each call, having checked that `/json`
/// answered the same and `/nginx` sent the same headers (those for the upstream only when it
/// lets the request through).
async fn run(options: ServiceOptions) -> Vec<Answer> {
    let options = ServiceOptions {
        response_headers: Some(HeaderNames::default()),
        ..options
    };
    let grpc_adapter = GrpcRateLimit::new(service(&options));
    let json_service = service(&options);
    let (_ready, backend_ready) = tokio::sync::watch::channel(true);
    let health = Arc::new(Health::new(
        json_service.config().clone(),
        false,
        backend_ready,
    ));
    let mut router = sluice::api::http::router(json_service, health, MAX_BYTES);
    let nginx_service = service(&options);
    let mut seen = Vec::new();
    for round in 0..3 {
        for (i, descriptors) in SEQUENCE.iter().enumerate() {
            let from_grpc = grpc(&grpc_adapter, descriptors).await;
            let from_json = json(&mut router, descriptors).await;
            let from_nginx = nginx(&nginx_service, descriptors).await;
            let at = format!("round {round}, request {i} {descriptors:?}");
            assert_eq!(from_grpc, from_json, "gRPC and /json differ at {at}");
            assert_eq!(
                (&from_grpc.response, from_grpc.allowed),
                (&from_nginx.response, from_nginx.allowed),
                "gRPC and /nginx differ at {at}"
            );
            let upstream = if from_grpc.allowed {
                from_grpc.request.clone()
            } else {
                Vec::new()
            };
            assert_eq!(
                upstream, from_nginx.request,
                "/nginx's upstream headers at {at}"
            );
            seen.push(from_grpc);
        }
    }
    seen
}

/// The headers of the sequence's calls: some calls have them, some do not, and they vary. The
/// upstream's, when on, carry the client's numbers under their own names.
fn assert_not_trivial(seen: &[Answer], upstream: bool) {
    assert!(
        seen.iter().any(|a| a.response.is_empty()),
        "no call without a limit"
    );
    let distinct: std::collections::HashSet<_> = seen
        .iter()
        .filter(|a| !a.response.is_empty())
        .map(|a| &a.response)
        .collect();
    assert!(distinct.len() > 3, "too few distinct header sets: {seen:?}");
    for a in seen {
        if !upstream {
            assert!(a.request.is_empty(), "{a:?}");
            continue;
        }
        let values = |h: &Headers| h.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>();
        assert_eq!(values(&a.request), values(&a.response), "{a:?}");
        let names: Vec<&str> = a.request.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.is_empty() || names == UPSTREAM, "{a:?}");
    }
    assert!(
        !upstream
            || seen
                .iter()
                .any(|a| a.allowed && a.request.iter().any(|(n, v)| n == UPSTREAM[1] && v == "0")),
        "no request let through with nothing remaining: {seen:?}"
    );
}

#[tokio::test]
async fn same_headers_everywhere_in_normal_mode() {
    let seen = run(ServiceOptions::default()).await;
    assert_not_trivial(&seen, false);
}

#[tokio::test]
async fn same_headers_everywhere_in_shadow_mode() {
    let seen = run(ServiceOptions {
        shadow_mode: true,
        ..Default::default()
    })
    .await;
    assert_not_trivial(&seen, false);
}

#[tokio::test]
async fn same_headers_everywhere_in_quota_mode() {
    let seen = run(ServiceOptions {
        quota_mode: true,
        ..Default::default()
    })
    .await;
    assert_not_trivial(&seen, false);
}

/// LIMIT_REQUEST_HEADERS_ENABLED, in each mode: the upstream's headers are the client's numbers.
#[tokio::test]
async fn same_upstream_headers_everywhere_in_every_mode() {
    for (shadow_mode, quota_mode) in [(false, false), (true, false), (false, true)] {
        let seen = run(ServiceOptions {
            shadow_mode,
            quota_mode,
            request_headers: Some(upstream_names()),
            ..Default::default()
        })
        .await;
        assert_not_trivial(&seen, true);
    }
}

/// `/json` renders `request_headers_to_add` as Go's `protojson` does: `requestHeadersToAdd`,
/// after `responseHeadersToAdd`, in the `.proto`'s order.
#[tokio::test]
async fn json_renders_request_headers_to_add_in_protojson_form() {
    let (_ready, backend_ready) = tokio::sync::watch::channel(true);
    let service = service(&ServiceOptions {
        response_headers: Some(HeaderNames::default()),
        request_headers: Some(upstream_names()),
        ..Default::default()
    });
    let health = Arc::new(Health::new(service.config().clone(), false, backend_ready));
    let mut router = sluice::api::http::router(service, health, MAX_BYTES);
    let (status, body) = json_call(&mut router, json_body(&[("one", "j")])).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        concat!(
            r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":3,"unit":"MINUTE"},"limitRemaining":2,"durationUntilReset":"58s"}],"#,
            r#""responseHeadersToAdd":[{"key":"RateLimit-Limit","value":"3"},{"key":"RateLimit-Remaining","value":"2"},{"key":"RateLimit-Reset","value":"58"}],"#,
            r#""requestHeadersToAdd":[{"key":"X-Quota-Limit","value":"3"},{"key":"X-Quota-Remaining","value":"2"},{"key":"X-Quota-Reset","value":"58"}]}"#
        )
    );
}

/// The rule itself, as envoyproxy/ratelimit applies it: two descriptors over their limits
/// (limit 3, then limit 5) are described by the last non-quota one, whatever SHADOW_MODE does
/// to the overall code; with every descriptor in quota mode, by the least remaining (the first).
#[tokio::test]
async fn the_rule_is_envoyproxy_ratelimits() {
    let over_twice = [("one", "z"), ("two", "z")];
    for (options, expected_limit) in [
        (ServiceOptions::default(), "5"),
        (
            ServiceOptions {
                shadow_mode: true,
                ..Default::default()
            },
            "5",
        ),
        (
            ServiceOptions {
                quota_mode: true,
                ..Default::default()
            },
            "3",
        ),
    ] {
        let service = service(&options);
        for _ in 0..5 {
            nginx(&service, &over_twice).await;
        }
        let headers = nginx(&service, &over_twice).await.response;
        assert_eq!(
            headers,
            vec![
                ("ratelimit-limit".to_string(), expected_limit.to_string()),
                ("ratelimit-remaining".to_string(), "0".to_string()),
                ("ratelimit-reset".to_string(), "58".to_string()),
            ],
            "shadow {} quota {}",
            options.shadow_mode,
            options.quota_mode
        );
    }
}
