//! gRPC `ShouldRateLimit`: protobuf bytes -> `RateLimitRequest` (prost) -> the domain request
//! (`api::convert::request_from_proto`) -> the service -> `RateLimitResponse` -> protobuf and
//! proto3 JSON (`response_to_proto`, `encode_response`).
//!
//! Generated requests are encoded with prost, mutated, decoded and handed to the gRPC adapter
//! itself. (SLUICE_MAX_REQUEST_BYTES is the listener's, checked from the message's length prefix
//! before decoding: tests/listeners.rs covers it, and src/net/guard.rs's frame check has its own
//! tests.) Whatever decodes must
//! convert without losing a field, be refused with the status that names the problem, or be
//! answered with one status per descriptor in a response that encodes and decodes back.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry as PbEntry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService as _;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use proptest::prelude::*;
use prost::Message;
use sluice::api::convert::{ConvertError, request_from_proto};
use sluice::api::grpc::GrpcRateLimit;
use sluice::api::json::encode_response;
use sluice::limiter::Unit;
use sluice::store::MemoryStore;

use crate::mutate::{apply, mutations, raw_bytes};
use crate::support::{SERVICE_DOMAIN, proptest_config, runtime, service, timed};

/// Protobuf syntax a mutation may insert: the request's field tags, varints of every length
/// (including an overlong one), huge lengths, and the wire types prost must refuse.
const TOKENS: &[&[u8]] = &[
    b"\x0a",
    b"\x12",
    b"\x18",
    b"\x0a\x00",
    b"\x12\x00",
    b"\x12\x04\x0a\x02\x0a\x00",
    b"\x1a\x02\x08\x07",
    b"\x22\x02\x08\x00",
    b"\x18\xff\xff\xff\xff\x0f",
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
    b"\x0a\xff\xff\xff\xff\x07",
    b"\x0b",
    b"\x0c",
    b"\x0f",
    b"\x00",
    b"\xa2\x06\x01x",
];

fn string() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z]{1,3}", "\\PC{0,6}", ".{0,3}",]
}

/// An entry key, often one of the service config's so that requests match its limits.
fn entry() -> impl Strategy<Value = PbEntry> {
    let key = prop_oneof![
        4 => proptest::sample::select(vec!["k", "n", "w", "free", "multi", "q"]).prop_map(String::from),
        1 => string(),
    ];
    let value = prop_oneof![
        Just(String::new()),
        Just("v".to_owned()),
        "a[a-z]{0,3}",
        string(),
    ];
    (key, value).prop_map(|(key, value)| PbEntry { key, value })
}

fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
    let limit = (
        prop_oneof![0u32..10, any::<u32>(), Just(u32::MAX)],
        prop_oneof![0i32..9, any::<i32>(), Just(i32::MIN), Just(i32::MAX)],
    )
        .prop_map(|(requests_per_unit, unit)| RateLimitOverride {
            requests_per_unit,
            unit,
        });
    let hits = prop_oneof![0u64..4, any::<u64>(), Just(u64::MAX)];
    (
        proptest::collection::vec(entry(), 0..4),
        proptest::option::weighted(0.2, limit),
        proptest::option::weighted(0.3, hits.prop_map(|value| UInt64Value { value })),
        any::<bool>(),
    )
        .prop_map(
            |(entries, limit, hits_addend, is_negative_hits)| RateLimitDescriptor {
                entries,
                limit,
                hits_addend,
                is_negative_hits,
            },
        )
}

/// A request as a client could send it, aimed at the service config's domain most of the time.
pub fn request() -> impl Strategy<Value = RateLimitRequest> {
    (
        prop_oneof![4 => Just(SERVICE_DOMAIN.to_owned()), 1 => string()],
        proptest::collection::vec(descriptor(), 0..6),
        prop_oneof![0u32..4, any::<u32>(), Just(u32::MAX)],
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

/// The index of the first descriptor whose override has a unit the service does not know.
fn first_bad_unit(req: &RateLimitRequest) -> Option<usize> {
    req.descriptors.iter().position(|d| {
        d.limit
            .as_ref()
            .is_some_and(|l| Unit::from_proto_number(l.unit).is_none())
    })
}

/// `request_from_proto` moves every field across, or names the descriptor whose unit is bad.
pub fn check_conversion(req: &RateLimitRequest) {
    match request_from_proto(req.clone()) {
        Err(ConvertError::BadOverrideUnit { index, unit }) => {
            assert_eq!(Some(index), first_bad_unit(req));
            let message = ConvertError::BadOverrideUnit { index, unit }.to_string();
            assert!(message.starts_with(&format!("descriptors[{index}].limit.unit: {unit} ")));
        }
        Ok(r) => {
            assert_eq!(first_bad_unit(req), None);
            assert_eq!(r.domain, req.domain);
            assert_eq!(r.hits_addend, req.hits_addend);
            assert_eq!(r.descriptors.len(), req.descriptors.len());
            for (d, pb) in r.descriptors.iter().zip(&req.descriptors) {
                let entries: Vec<(&str, &str)> = d
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect();
                let expected: Vec<(&str, &str)> = pb
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect();
                assert_eq!(entries, expected);
                assert_eq!(d.hits_addend, pb.hits_addend.map(|h| h.value));
                assert_eq!(
                    d.limit_override
                        .map(|o| (o.requests_per_unit, o.unit.proto_number())),
                    pb.limit.map(|l| (l.requests_per_unit, l.unit))
                );
            }
        }
    }
}

/// A response encodes to protobuf and back unchanged, and to proto3 JSON with one status per
/// descriptor.
pub fn check_response(resp: &RateLimitResponse, descriptors: usize) {
    assert_eq!(resp.statuses.len(), descriptors);
    assert!(matches!(resp.overall_code, 1 | 2), "{resp:?}");
    assert!(resp.statuses.iter().all(|s| matches!(s.code, 1 | 2)));
    let decoded = RateLimitResponse::decode(resp.encode_to_vec().as_slice()).expect("decodes");
    assert_eq!(&decoded, resp);
    let json: serde_json::Value = serde_json::from_str(&encode_response(resp)).expect("valid JSON");
    let statuses = json
        .get("statuses")
        .and_then(|s| s.as_array())
        .map(Vec::len);
    assert_eq!(statuses.unwrap_or(0), descriptors);
}

thread_local! {
    static GRPC: (tokio::runtime::Runtime, GrpcRateLimit<MemoryStore>) =
        (runtime(), GrpcRateLimit::new(service(100_000)));
}

/// The check for one gRPC message body: it decodes or not; what decodes converts, and the
/// adapter answers it or refuses it with the status the problem calls for.
pub fn check_grpc_bytes(bytes: &[u8]) {
    let Ok(req) = RateLimitRequest::decode(bytes) else {
        return;
    };
    // Re-encoding drops unknown fields only; decoding that gives the same message.
    let again = RateLimitRequest::decode(req.encode_to_vec().as_slice()).expect("re-decodes");
    assert_eq!(again, req);
    check_conversion(&req);
    let bad_unit = first_bad_unit(&req);
    let descriptors = req.descriptors.len();
    let answer =
        GRPC.with(|(rt, grpc)| rt.block_on(grpc.should_rate_limit(tonic::Request::new(req))));
    match answer {
        Ok(resp) => {
            assert!(bad_unit.is_none());
            check_response(resp.get_ref(), descriptors);
        }
        Err(status) => {
            assert!(!status.message().is_empty());
            if let Some(i) = bad_unit {
                assert_eq!(status.code(), tonic::Code::InvalidArgument);
                let prefix = format!("descriptors[{i}].limit.unit");
                assert!(status.message().starts_with(&prefix), "{status:?}");
            } else {
                assert!(
                    matches!(
                        status.code(),
                        tonic::Code::InvalidArgument | tonic::Code::Unknown
                    ),
                    "{status:?}"
                );
            }
        }
    }
}

/// One cargo-fuzz input (`fuzz/fuzz_targets/proto.rs`): a `ShouldRateLimit` message body.
pub fn check_fuzz_input(data: &[u8]) {
    check_grpc_bytes(data);
}

proptest! {
    #![proptest_config(proptest_config(512, "proptest-regressions/fuzz/proto.txt"))]

    #[test]
    fn generated_requests_round_trip_and_are_answered(req in request()) {
        let bytes = req.encode_to_vec();
        prop_assert_eq!(&RateLimitRequest::decode(bytes.as_slice()).expect("decodes"), &req);
        timed("proto generated", || check_grpc_bytes(&bytes));
    }

    #[test]
    fn mutated_requests_are_answered_or_refused(req in request(), edits in mutations(6)) {
        let mut bytes = req.encode_to_vec();
        apply(&mut bytes, &edits, TOKENS);
        timed("proto mutated", || check_grpc_bytes(&bytes));
    }

    #[test]
    fn raw_bytes_are_answered_or_refused(bytes in raw_bytes(1024)) {
        timed("proto raw", || check_fuzz_input(&bytes));
    }
}
