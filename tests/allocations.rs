//! Heap allocations on the decision path, counted (issue 18): a counting global allocator
//! (`tests/alloc_counter`, per thread) around `RateLimitService::should_rate_limit` on the memory
//! store, stats on (the default) and tracing off, and around each step of the ratelimit.v3
//! adapter's decode -> convert -> decide -> convert -> encode, as `benches/decision.rs`'s
//! `grpc_adapter/decode_decide_encode` drives it (no network).
//!
//! The counts are deterministic: each test asserts they stay at most what was reached, a
//! regression guard. `cargo test --test allocations -- --nocapture` prints them.

use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use alloc_counter::{Counting, Counts, count};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as PbEntry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;
use sluice::api::convert::{request_from_proto, response_to_proto};
use sluice::clock::SystemClock;
use sluice::config::{ConfigHandle, LoadOptions, parse_files};
use sluice::descriptor::{Descriptor, Entry, Request};
use sluice::service::{HeaderNames, RateLimitService, ServiceOptions};
use sluice::store::MemoryStore;
use sluice::telemetry::{DecisionTelemetry, Stats};

#[global_allocator]
static ALLOC: Counting = Counting;

/// One plain limit (as `bench/config/bench.yaml`) and three nested ones, one of them named.
const CONFIG: &str = "
domain: alloc
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: tenant
    descriptors:
      - key: route
        rate_limit: {unit: minute, requests_per_unit: 1000000000, name: per_tenant_route}
  - key: remote_address
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    descriptors:
      - key: method
        rate_limit: {unit: hour, requests_per_unit: 1000000000}
";

/// Calls before counting: the first ones create the counters, the stats' entries and the
/// thread's buffers, which later calls reuse.
const WARM_UP: usize = 50;

fn service(options: ServiceOptions) -> RateLimitService<MemoryStore> {
    let config = parse_files(
        &[("alloc.yaml".into(), CONFIG.into())],
        &LoadOptions::default(),
    )
    .expect("config loads");
    RateLimitService::new(
        ConfigHandle::new(Some(config)),
        Arc::new(MemoryStore::new(100_000)),
        Arc::new(SystemClock),
        options,
    )
    .with_observer(Arc::new(DecisionTelemetry::untraced(Arc::new(
        Stats::default(),
    ))))
}

fn one_descriptor() -> Vec<Vec<(&'static str, &'static str)>> {
    vec![vec![("client", "c0")]]
}

fn three_descriptors() -> Vec<Vec<(&'static str, &'static str)>> {
    vec![
        vec![("tenant", "acme"), ("route", "/api/v1/orders")],
        vec![("remote_address", "10.1.2.3"), ("path", "/login")],
        vec![("user", "u-42"), ("method", "POST")],
    ]
}

fn request(descriptors: &[Vec<(&str, &str)>]) -> Request {
    Request {
        domain: "alloc".into(),
        descriptors: descriptors
            .iter()
            .map(|d| Descriptor {
                entries: d.iter().map(|(k, v)| Entry::new(*k, *v)).collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 1,
    }
}

fn proto_request(descriptors: &[Vec<(&str, &str)>]) -> Vec<u8> {
    RateLimitRequest {
        domain: "alloc".into(),
        descriptors: descriptors
            .iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .iter()
                    .map(|(k, v)| PbEntry {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 1,
    }
    .encode_to_vec()
}

/// The memory store's and the service's futures never wait; poll once.
fn ready<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the memory path never waits"),
    }
}

/// The allocations of one decision after warm-up: the request is built outside the count and
/// moved in; the response is given back (`Response::recycle`) as the adapters do once they
/// have written it.
fn decision(svc: &RateLimitService<MemoryStore>, descriptors: &[Vec<(&str, &str)>]) -> Counts {
    for _ in 0..WARM_UP {
        ready(svc.should_rate_limit(request(descriptors)))
            .expect("decides")
            .recycle();
    }
    let req = request(descriptors);
    let (response, counts) = count(|| ready(svc.should_rate_limit(req)).expect("decides"));
    assert!(response.statuses.iter().all(|s| s.current_limit.is_some()));
    response.recycle();
    counts
}

#[test]
fn a_decision_with_one_descriptor() {
    let counts = decision(&service(ServiceOptions::default()), &one_descriptor());
    println!("decision, 1 descriptor of 1 entry: {counts:?}");
    // Before issue 18: 3 (the counter keys' `String`, the store's decisions `Vec`, the statuses
    // `Vec`). Now none: the key text and the decisions are the thread's reused buffers, and the
    // statuses' buffer is the one the last answer gave back.
    assert_eq!(counts.allocs, 0, "{counts:?}");
}

#[test]
fn a_decision_with_three_descriptors_and_headers() {
    let options = ServiceOptions {
        response_headers: Some(HeaderNames::default()),
        ..ServiceOptions::default()
    };
    let counts = decision(&service(options), &three_descriptors());
    println!("decision, 3 descriptors of 2 entries, headers on: {counts:?}");
    // Before issue 18: 11 (those three, the named limit's name, the headers' `Vec` and their three
    // names and three values). Left: the named limit's name, a `String` the gRPC encoding moves
    // into the protobuf's `RateLimit.name` (shared, it would only move there).
    assert!(counts.allocs <= 1, "{counts:?}");
}

/// One gRPC request's allocations, step by step.
#[derive(Debug, Default)]
struct Steps {
    decode: Counts,
    convert_request: Counts,
    decide: Counts,
    convert_response: Counts,
    encode: Counts,
}

impl Steps {
    fn allocs(&self) -> u64 {
        self.decode.allocs
            + self.convert_request.allocs
            + self.decide.allocs
            + self.convert_response.allocs
            + self.encode.allocs
    }
}

fn grpc_request(svc: &RateLimitService<MemoryStore>, bytes: &[u8], encoded: &mut Vec<u8>) -> Steps {
    let (msg, decode) = count(|| RateLimitRequest::decode(bytes).expect("decodes"));
    let (req, convert_request) = count(|| request_from_proto(msg).expect("converts"));
    let (resp, decide) = count(|| ready(svc.should_rate_limit(req)).expect("decides"));
    let (proto, convert_response) = count(|| response_to_proto(resp));
    encoded.clear();
    let ((), encode) = count(|| {
        proto.encode(encoded).expect("encodes");
        drop(proto);
    });
    Steps {
        decode,
        convert_request,
        decide,
        convert_response,
        encode,
    }
}

fn grpc(svc: &RateLimitService<MemoryStore>, descriptors: &[Vec<(&str, &str)>]) -> Steps {
    let bytes = proto_request(descriptors);
    // The adapter's output buffer outlives the request, as tonic's encode buffer does.
    let mut encoded = Vec::with_capacity(256);
    for _ in 0..WARM_UP {
        grpc_request(svc, &bytes, &mut encoded);
    }
    grpc_request(svc, &bytes, &mut encoded)
}

#[test]
fn a_grpc_request_with_one_descriptor() {
    let steps = grpc(&service(ServiceOptions::default()), &one_descriptor());
    println!(
        "gRPC request, 1 descriptor of 1 entry: {} allocations: {steps:?}",
        steps.allocs()
    );
    // Before issue 18: 10 (decode 5, convert 1, decide 3, convert 1). Left: prost's decode (the
    // domain, the descriptors' and the entries' vectors, the key and the value), the domain
    // descriptors' vector (the entries' is reused in place) and the protobuf statuses' vector;
    // the domain statuses' buffer is the one the last answer's conversion gave back.
    assert!(steps.allocs() <= 7, "{steps:?}");
}

#[test]
fn a_grpc_request_with_three_descriptors_and_headers() {
    let options = ServiceOptions {
        response_headers: Some(HeaderNames::default()),
        ..ServiceOptions::default()
    };
    let steps = grpc(&service(options), &three_descriptors());
    println!(
        "gRPC request, 3 descriptors of 2 entries, headers on: {} allocations: {steps:?}",
        steps.allocs()
    );
    // Before issue 18: 31 (decode 17, convert 1, decide 11, convert 2). Left: decode 17, convert
    // 1, decide 1 (the name), and the protobuf's statuses and headers vectors with each header's
    // name and value as `String`s (8).
    assert!(steps.allocs() <= 27, "{steps:?}");
}

/// The tonic handler itself (`GrpcRateLimit::should_rate_limit`: `#[tonic::async_trait]` boxes
/// its future, and the request and response are wrapped in `tonic::Request`/`Response`), from a
/// decoded message to the protobuf answer: what the gRPC listener adds beyond HTTP/2, the
/// codec's buffers and prost's decode.
fn handler(svc: RateLimitService<MemoryStore>, descriptors: &[Vec<(&str, &str)>]) -> Counts {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService as _;
    let adapter = sluice::api::grpc::GrpcRateLimit::new(Arc::new(svc));
    let bytes = proto_request(descriptors);
    let call = |msg| ready(adapter.should_rate_limit(tonic::Request::new(msg))).expect("answers");
    for _ in 0..WARM_UP {
        call(RateLimitRequest::decode(bytes.as_slice()).expect("decodes"));
    }
    let msg = RateLimitRequest::decode(bytes.as_slice()).expect("decodes");
    count(|| call(msg)).1
}

#[test]
fn the_grpc_handler_with_one_descriptor() {
    let counts = handler(service(ServiceOptions::default()), &one_descriptor());
    println!("gRPC handler (after decode), 1 descriptor of 1 entry: {counts:?}");
    // Before issue 18: 6 (convert 1, decide 3, convert 1, the handler's boxed future 1). Left:
    // the domain descriptors' vector, the protobuf statuses' vector and the boxed future.
    assert!(counts.allocs <= 3, "{counts:?}");
}
