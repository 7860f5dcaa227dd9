//! The adapters over real sockets on port 0: gRPC with a tonic client built from envoy-types,
//! `/json` and `/healthcheck` over HTTP/1.1, and `/rlconfig` on the debug port.

use std::time::Duration;

use sluice_test_support::app;
use sluice_test_support::app::{default_options, fixture, start};
use sluice_test_support::http::http_async;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn request(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

async fn channel(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("a valid URI")
        .connect()
        .await
        .expect("connect gRPC")
}

async fn client(addr: std::net::SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::new(channel(addr).await)
}

async fn call(
    c: &mut RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    c.should_rate_limit(r).await.map(|r| r.into_inner())
}

#[tokio::test]
async fn grpc_answers_like_envoyproxy_ratelimit() {
    let app = start(&fixture("api"), default_options()).await;
    let mut c = client(app.grpc).await;

    let r = call(&mut c, request("api", &[("key1", "foo")]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 49);
    assert_eq!(r.statuses[0].duration_until_reset.unwrap().seconds, 1);

    for i in 1..=10 {
        let r = call(&mut c, request("api", &[("ten", "x")])).await.unwrap();
        assert_eq!(r.overall_code, Code::Ok as i32, "call {i}");
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(limit.name, "ten_per_minute");
        assert_eq!(limit.requests_per_unit, 10);
    }
    let r = call(&mut c, request("api", &[("ten", "x")])).await.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);

    let unknown = call(&mut c, request("nope", &[("a", "b")])).await.unwrap();
    assert_eq!(unknown.overall_code, Code::Ok as i32);
    assert_eq!(unknown.statuses.len(), 1);
    assert_eq!(unknown.statuses[0].current_limit, None);
}

#[tokio::test]
async fn grpc_errors_use_go_codes_and_messages() {
    let app = start(&fixture("api"), default_options()).await;
    let mut c = client(app.grpc).await;

    let e = call(&mut c, request("", &[("a", "b")])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unknown);
    assert_eq!(e.message(), "rate limit domain must not be empty");

    let mut empty = request("api", &[]);
    empty.descriptors.clear();
    let e = call(&mut c, empty).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unknown);
    assert_eq!(e.message(), "rate limit descriptor list must not be empty");

    let mut bad_unit = request("api", &[("key1", "x")]);
    bad_unit.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    let e = call(&mut c, bad_unit).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("descriptors[0].limit.unit"),
        "{}",
        e.message()
    );

    let mut many = request("api", &[("key1", "x")]);
    many.descriptors = vec![many.descriptors[0].clone(); 65];
    let e = call(&mut c, many).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("SLUICE_MAX_DESCRIPTORS"),
        "{}",
        e.message()
    );

    let big = request("api", &[("key1", &"x".repeat(70 * 1024))]);
    let e = call(&mut c, big).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("SLUICE_MAX_REQUEST_BYTES"),
        "{}",
        e.message()
    );

    // Under the request cap, over SLUICE_MAX_KEY_BYTES (4096): refused before any counter.
    let long = request("api", &[("key1", &"x".repeat(5000))]);
    let e = call(&mut c, long).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        e.message(),
        "descriptor 0 makes a counter key of 5010 bytes; the limit is 4096 bytes (SLUICE_MAX_KEY_BYTES)"
    );

    // The server is still healthy after all that.
    assert!(call(&mut c, request("api", &[("key1", "y")])).await.is_ok());
}

#[tokio::test]
async fn many_concurrent_calls_on_one_key_admit_exactly_the_limit() {
    let app = start(&fixture("api"), default_options()).await;
    let c = client(app.grpc).await;
    let tasks: Vec<_> = (0..250)
        .map(|_| {
            let mut c = c.clone();
            tokio::spawn(async move {
                call(&mut c, request("api", &[("hot", "k")]))
                    .await
                    .map(|r| r.overall_code == Code::Ok as i32)
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        if t.await.unwrap().unwrap() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 100);
}

#[tokio::test]
async fn grpc_health_mirrors_healthcheck_at_every_instant_and_pushes_changes() {
    // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED with no domain loaded yet: not serving.
    let config = sluice::config::ConfigHandle::new(None);
    let options = sluice::app::AppOptions {
        require_config_for_health: true,
        ..default_options()
    };
    let app = app::start_with(config.clone(), options).await;
    let mut h = HealthClient::new(channel(app.grpc).await);
    let check = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    let status = |r: tonic::Response<tonic_health::pb::HealthCheckResponse>| r.into_inner().status;
    let (serving, not_serving) = (
        ServingStatus::Serving as i32,
        ServingStatus::NotServing as i32,
    );
    // Right from the start, with no task to publish it first.
    assert_eq!(
        status(h.check(check("ratelimit")).await.unwrap()),
        not_serving
    );
    assert_eq!(status(h.check(check("")).await.unwrap()), serving);
    assert_eq!(
        h.check(check("other")).await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    assert_eq!(
        http_async(app.http, "GET", "/healthcheck", "").await.status,
        500
    );
    let mut watch = h.watch(check("ratelimit")).await.unwrap().into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().status, not_serving);

    // A config with a domain arrives: both answers change at once, with no delay to wait out.
    let loaded = sluice::config::parse_files(
        &[("a.yaml".to_string(), "domain: d\n".to_string())],
        &Default::default(),
    )
    .unwrap();
    config.store(loaded);
    assert_eq!(status(h.check(check("ratelimit")).await.unwrap()), serving);
    assert_eq!(
        http_async(app.http, "GET", "/healthcheck", "").await.status,
        200
    );
    let pushed = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("the change pushed to the Watch stream")
        .unwrap()
        .unwrap();
    assert_eq!(pushed.status, serving);
}

#[tokio::test]
async fn json_endpoint_codes_and_bodies() {
    let app = start(&fixture("api"), default_options()).await;
    let ok = http_async(
        app.http,
        "POST",
        "/json",
        r#"{"domain":"api","descriptors":[{"entries":[{"key":"key1","value":"foo"}]}]}"#,
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert!(
        ok.headers
            .to_ascii_lowercase()
            .contains("content-type: application/json")
    );
    let v: serde_json::Value = serde_json::from_str(&ok.body).unwrap();
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["limitRemaining"], 49);
    assert_eq!(v["statuses"][0]["durationUntilReset"], "1s");
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "SECOND");

    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"ten","value":"j"}]}],"hitsAddend":11}"#;
    let over = http_async(app.http, "POST", "/json", body).await;
    assert_eq!(over.status, 429, "{}", over.body);
    let v: serde_json::Value = serde_json::from_str(&over.body).unwrap();
    assert_eq!(v["overallCode"], "OVER_LIMIT");

    let bad = http_async(app.http, "POST", "/json", "{not json").await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.starts_with("Bad Request\n"), "{}", bad.body);

    let empty_domain = http_async(
        app.http,
        "POST",
        "/json",
        r#"{"descriptors":[{"entries":[]}]}"#,
    )
    .await;
    assert_eq!(empty_domain.status, 400);
    assert!(
        empty_domain
            .body
            .contains("rate limit domain must not be empty"),
        "{}",
        empty_domain.body
    );

    let health = http_async(app.http, "GET", "/healthcheck", "").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.body, "OK");
}

#[tokio::test]
async fn rlconfig_lists_each_limit() {
    let app = start(&fixture("api"), default_options()).await;
    let r = http_async(app.debug, "GET", "/rlconfig", "").await;
    assert_eq!(r.status, 200);
    assert!(
        r.body.contains(
            "api.ten: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false\n"
        ),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("api.token: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false, algorithm: token_bucket, burst: 3\n"),
        "{}",
        r.body
    );
    // One line per limit, and one per block of a `rate_limits` list.
    assert_eq!(r.body.lines().count(), 8, "{}", r.body);
}

#[tokio::test]
async fn shutdown_fails_health_then_drains() {
    let mut options = default_options();
    options.shutdown_delay = Duration::from_millis(1500);
    let mut app = start(&fixture("api"), options).await;
    assert_eq!(
        http_async(app.http, "GET", "/healthcheck", "").await.status,
        200
    );
    app.shutdown.take().unwrap().send(()).unwrap();
    // During the shutdown delay the listeners still answer, with health failing.
    let mut saw_500 = false;
    for _ in 0..20 {
        if http_async(app.http, "GET", "/healthcheck", "").await.status == 500 {
            saw_500 = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(saw_500, "health should fail after shutdown starts");
    let result = tokio::time::timeout(Duration::from_secs(10), app.task)
        .await
        .expect("server stops within the drain timeout");
    result.unwrap().unwrap();
    assert!(tokio::net::TcpStream::connect(app.http).await.is_err());
}

/// Sends raw bytes as the request message, to feed the server malformed protobuf.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

#[tokio::test]
async fn malformed_protobuf_gets_a_clear_error_and_the_server_keeps_serving() {
    let app = start(&fixture("api"), default_options()).await;
    let channel = channel(app.grpc).await;
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    // Field 1 (domain) claims 100 bytes of string but the message ends after 3.
    let e = grpc
        .unary(
            tonic::Request::new(vec![0x0a, 100, b'a', b'b', b'c']),
            path,
            RawCodec,
        )
        .await
        .unwrap_err();
    assert!(
        e.message().contains("decode"),
        "code {:?}: {}",
        e.code(),
        e.message()
    );
    let mut c = RateLimitServiceClient::new(channel);
    assert!(call(&mut c, request("api", &[("key1", "z")])).await.is_ok());
}

#[tokio::test]
async fn every_algorithm_answers_over_grpc() {
    let app = start(&fixture("api"), default_options()).await;
    let mut c = client(app.grpc).await;
    // (key, admitted before the first refusal)
    for (key, admitted) in [("token", 3), ("leaky", 3), ("sliding", 4), ("guarded", 3)] {
        let mut codes = Vec::new();
        for _ in 0..admitted + 2 {
            let r = call(&mut c, request("api", &[(key, "x")])).await.unwrap();
            codes.push(r.overall_code == Code::Ok as i32);
        }
        let expected: Vec<bool> = (0..admitted + 2).map(|i| i < admitted).collect();
        assert_eq!(codes, expected, "{key}");
    }
    // The multi-limit descriptor reports the limit that refused it.
    let r = call(&mut c, request("api", &[("guarded", "x")]))
        .await
        .unwrap();
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit),
        ("per_minute", 3)
    );
}

#[tokio::test]
async fn every_algorithm_answers_over_json() {
    let app = start(&fixture("api"), default_options()).await;
    for (key, admitted) in [("token", 3), ("leaky", 3), ("sliding", 4), ("guarded", 3)] {
        let body = format!(
            r#"{{"domain":"api","descriptors":[{{"entries":[{{"key":"{key}","value":"j"}}]}}]}}"#
        );
        for i in 0..=admitted {
            let r = http_async(app.http, "POST", "/json", &body).await;
            let expected = if i < admitted { 200 } else { 429 };
            assert_eq!(r.status, expected, "{key} call {i}: {}", r.body);
        }
    }
}

/// `/debug/counters` on the debug port: a request's counters read without counting (every
/// block of a `rate_limits` list, with the `#1_` key of the second), and their reset, which
/// is refused unless SLUICE_DEBUG_COUNTER_RESET allows it.
#[tokio::test]
async fn debug_counters_read_without_counting_and_reset_only_when_enabled() {
    for enabled in [false, true] {
        let options = sluice::app::AppOptions {
            counter_reset: enabled,
            ..default_options()
        };
        let app = start(&fixture("api"), options).await;
        let charge = r#"{"domain":"api","descriptors":[{"entries":[{"key":"guarded","value":"t1"}]}],"hitsAddend":2}"#;
        assert_eq!(
            http_async(app.http, "POST", "/json", charge).await.status,
            200
        );
        let query = "/debug/counters?domain=api&descriptor=guarded=t1";
        let read = |app_debug| async move {
            let r = http_async(app_debug, "GET", query, "").await;
            assert_eq!(r.status, 200, "{}", r.body);
            serde_json::from_str::<serde_json::Value>(&r.body).unwrap()
        };
        let v = read(app.debug).await;
        let c = &v["counters"];
        assert_eq!(v["domain"], "api");
        assert_eq!(c.as_array().map(Vec::len), Some(2), "{v}");
        assert_eq!(c[0]["key"], "api_guarded_t1_");
        assert_eq!(c[0]["limit"], "api.guarded");
        assert_eq!(c[0]["name"], "per_minute");
        assert_eq!(c[0]["algorithm"], "token_bucket");
        assert_eq!(
            (c[0]["count"].as_u64(), c[0]["remaining"].as_u64()),
            (Some(2), Some(1))
        );
        assert_eq!(c[1]["key"], "api_guarded_t1_#1_");
        assert_eq!(c[1]["name"], "per_day");
        assert_eq!(c[1]["unit"], "DAY");
        assert_eq!(
            (c[1]["count"].as_u64(), c[1]["remaining"].as_u64()),
            (Some(2), Some(3))
        );
        assert_eq!(c[1]["over"], false);
        // Reading counted nothing.
        assert_eq!(read(app.debug).await, v);

        let reset = http_async(
            app.debug,
            "POST",
            &query.replace("counters?", "counters/reset?"),
            "",
        )
        .await;
        if enabled {
            assert_eq!(reset.status, 200, "{}", reset.body);
            let v: serde_json::Value = serde_json::from_str(&reset.body).unwrap();
            assert_eq!(v["counters"][0]["remaining"], 3, "{v}");
            assert_eq!(v["counters"][1]["remaining"], 5, "{v}");
            assert_eq!(read(app.debug).await, v);
        } else {
            assert_eq!(reset.status, 403, "{}", reset.body);
            assert!(
                reset.body.contains("SLUICE_DEBUG_COUNTER_RESET=true"),
                "{}",
                reset.body
            );
            assert_eq!(read(app.debug).await, v, "nothing was reset");
        }
    }
}

/// `/debug/counters` refuses what it cannot read, and has nothing for what matches no limit.
#[tokio::test]
async fn debug_counters_refuse_a_bad_request_and_a_get_that_would_reset() {
    let app = start(&fixture("api"), default_options()).await;
    // A GET cannot reset, and a request without a domain says what is missing.
    let get = http_async(
        app.debug,
        "GET",
        "/debug/counters/reset?domain=api&descriptor=guarded=t1",
        "",
    )
    .await;
    assert_eq!(get.status, 405);
    let bad = http_async(
        app.debug,
        "GET",
        "/debug/counters?descriptor=guarded=t1",
        "",
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    // An unknown domain or an unmatched descriptor has no counters.
    let none = http_async(
        app.debug,
        "GET",
        "/debug/counters?domain=nope&descriptor=a=b",
        "",
    )
    .await;
    assert_eq!(none.body.trim(), r#"{"counters":[],"domain":"nope"}"#);
}
