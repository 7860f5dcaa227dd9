//! A plain loop over `RateLimitService::should_rate_limit` on the memory store, for profilers
//! (criterion's own machinery would dominate a profile). Each call gets a fresh clone of one
//! prebuilt request, as the gRPC adapter hands over a freshly decoded one, and each answer's
//! statuses are given back as the adapters do.
//!
//! With `real` after the count, bench/run.sh's realistic request (3 descriptors of 2 entries,
//! headers on) through the gRPC adapter's conversions and protobuf, without HTTP/2.
//!
//! ```sh
//! cargo build --release -p sluice-bench --bin decision_profile
//! valgrind --tool=callgrind target/release/decision_profile 100000 [real]
//! callgrind_annotate --inclusive=yes callgrind.out.<pid>
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark's or load generator's own stopwatch, outside Sluice"
)]
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;
use sluice::api::convert::{request_from_proto, response_to_proto};
use sluice::clock::SystemClock;
use sluice::config::{ConfigHandle, LoadOptions, parse_files};
use sluice::descriptor::{Descriptor, Entry, Request};
use sluice::service::{HeaderNames, RateLimitService, ServiceOptions};
use sluice::store::MemoryStore;
use sluice::telemetry::{DecisionTelemetry, Stats};
use sluice_test_support::bench::ready::ready;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map_or(1_000_000, |s| s.parse().expect("N is a count"));
    let realistic = match args.next().as_deref() {
        None | Some("one") => false,
        Some("real") => true,
        Some(other) => panic!("the request is `one` or `real`, not {other:?}"),
    };
    let yaml = include_str!("../../../config/bench.yaml");
    let config = parse_files(
        &[("bench.yaml".into(), yaml.into())],
        &LoadOptions::default(),
    )
    .expect("bench config loads");
    let options = ServiceOptions {
        // The realistic request's server sends the RateLimit-* headers, as bench/run.sh's does.
        response_headers: realistic.then(HeaderNames::default),
        ..ServiceOptions::default()
    };
    let service = RateLimitService::new(
        ConfigHandle::new(Some(config)),
        Arc::new(MemoryStore::new(1_000)),
        Arc::new(SystemClock),
        options,
    )
    // Stats on, as a service runs by default.
    .with_observer(Arc::new(DecisionTelemetry::untraced(Arc::new(
        Stats::default(),
    ))));
    let start = Instant::now();
    let counted = if realistic {
        grpc_path(&service, n)
    } else {
        decisions(&service, n)
    };
    let elapsed = start.elapsed();
    assert_eq!(counted, n, "every call is counted");
    println!(
        "{n} calls in {elapsed:?}: {:.0} ns each",
        elapsed.as_nanos() as f64 / n as f64
    );
}

/// One descriptor, the decision alone: each call gets a clone of one request, as the gRPC
/// adapter hands over a freshly decoded one (the clone included in the time).
fn decisions(service: &RateLimitService<MemoryStore>, n: u64) -> u64 {
    let request = Request {
        domain: "bench".into(),
        descriptors: vec![Descriptor {
            entries: vec![Entry::new("client", "c0")],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let mut ok = 0u64;
    for _ in 0..n {
        let r = ready(service.should_rate_limit(request.clone()));
        if let Ok(r) = r {
            ok += u64::from(r.statuses[0].current_limit.is_some());
            // As the gRPC and HTTP adapters do once the answer is written.
            r.recycle();
        }
    }
    ok
}

/// bench/run.sh's realistic request (3 descriptors of 2 entries, `client` then `route`, the
/// RateLimit-* headers on) through the gRPC adapter's work without HTTP/2: protobuf decode,
/// conversion, decision, conversion, protobuf encode.
fn grpc_path(service: &RateLimitService<MemoryStore>, n: u64) -> u64 {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as ProtoEntry;
    let entry = |key: &str, value: &str| ProtoEntry {
        key: key.into(),
        value: value.into(),
    };
    let proto = RateLimitRequest {
        domain: "bench".into(),
        descriptors: ["r1", "r2", "r3"]
            .map(|route| RateLimitDescriptor {
                entries: vec![entry("client", "c0"), entry("route", route)],
                ..Default::default()
            })
            .to_vec(),
        hits_addend: 1,
    };
    let bytes = proto.encode_to_vec();
    let mut encoded = Vec::with_capacity(512);
    let mut ok = 0u64;
    for _ in 0..n {
        let msg = RateLimitRequest::decode(bytes.as_slice()).expect("decodes");
        let request = request_from_proto(msg).expect("converts");
        let Ok(response) = ready(service.should_rate_limit(request)) else {
            continue;
        };
        let answer = response_to_proto(response);
        ok += u64::from(answer.statuses.len() == 3 && !answer.response_headers_to_add.is_empty());
        encoded.clear();
        answer.encode(&mut encoded).expect("encodes");
    }
    ok
}
