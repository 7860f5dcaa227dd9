//! Properties of the codec as a whole: what a client would write decodes back, no input
//! panics the decoder, and every response encodes to JSON.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::quota::ExpirationSpecifier;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, Quota, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Duration, Struct, Timestamp, UInt64Value, Value};
use proptest::prelude::*;
use serde_json::json;

use super::*;

/// A request's proto3 JSON, written the way a client might: with either spelling of field
/// names, integers as numbers or strings, enums as names or numbers, and zero fields present
/// or absent. (Sluice never encodes requests; this stands in for protojson.Marshal.)
fn request_json(req: &RateLimitRequest, style: &Style) -> serde_json::Value {
    let name = |camel: &'static str, snake: &'static str| if style.snake { snake } else { camel };
    let int = |n: u64| {
        if style.strings {
            json!(n.to_string())
        } else {
            json!(n)
        }
    };
    let mut obj = serde_json::Map::new();
    if !req.domain.is_empty() || style.zeros {
        obj.insert("domain".into(), json!(req.domain));
    }
    if !req.descriptors.is_empty() || style.zeros {
        let descriptors = req.descriptors.iter().map(|d| {
            let mut o = serde_json::Map::new();
            let entries: Vec<_> = d.entries.iter().map(|e| json!({"key": e.key, "value": e.value})).collect();
            o.insert("entries".into(), json!(entries));
            if let Some(limit) = d.limit {
                let unit = match RateLimitUnit::try_from(limit.unit) {
                    Ok(u) if !style.enum_numbers => json!(u.as_str_name()),
                    _ => json!(limit.unit),
                };
                o.insert(
                    "limit".into(),
                    json!({name("requestsPerUnit", "requests_per_unit"): int(limit.requests_per_unit.into()), "unit": unit}),
                );
            }
            match d.hits_addend {
                Some(w) => drop(o.insert(name("hitsAddend", "hits_addend").into(), int(w.value))),
                None if style.zeros => drop(o.insert(name("hitsAddend", "hits_addend").into(), json!(null))),
                None => {}
            }
            if d.is_negative_hits || style.zeros {
                o.insert(name("isNegativeHits", "is_negative_hits").into(), json!(d.is_negative_hits));
            }
            serde_json::Value::Object(o)
        });
        obj.insert("descriptors".into(), descriptors.collect());
    }
    if req.hits_addend != 0 || style.zeros {
        obj.insert(
            name("hitsAddend", "hits_addend").into(),
            int(req.hits_addend.into()),
        );
    }
    serde_json::Value::Object(obj)
}

#[derive(Debug)]
struct Style {
    snake: bool,
    strings: bool,
    enum_numbers: bool,
    zeros: bool,
}

fn arb_style() -> impl Strategy<Value = Style> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(snake, strings, enum_numbers, zeros)| Style {
            snake,
            strings,
            enum_numbers,
            zeros,
        },
    )
}

fn arb_request() -> impl Strategy<Value = RateLimitRequest> {
    let entry = (any::<String>(), any::<String>()).prop_map(|(key, value)| Entry { key, value });
    let limit = (any::<u32>(), prop_oneof![0..=6i32, any::<i32>()]).prop_map(
        |(requests_per_unit, unit)| RateLimitOverride {
            requests_per_unit,
            unit,
        },
    );
    let descriptor = (
        prop::collection::vec(entry, 0..4),
        prop::option::of(limit),
        prop::option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_map(
            |(entries, limit, hits, is_negative_hits)| RateLimitDescriptor {
                entries,
                limit,
                hits_addend: hits.map(|value| UInt64Value { value }),
                is_negative_hits,
            },
        );
    (
        any::<String>(),
        prop::collection::vec(descriptor, 0..4),
        any::<u32>(),
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

/// Arbitrary JSON, biased towards the request's own field names so that the decoder gets
/// past the top level and exercises the nested paths.
fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    let key = prop_oneof![
        prop::sample::select(vec![
            "domain",
            "descriptors",
            "hitsAddend",
            "hits_addend",
            "entries",
            "key",
            "value",
            "limit",
            "requestsPerUnit",
            "requests_per_unit",
            "unit",
            "isNegativeHits",
            "is_negative_hits",
        ])
        .prop_map(String::from),
        any::<String>(),
    ];
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        prop::sample::select(vec!["SECOND", "WEEK", "12", "-1", "1e3", "x"])
            .prop_map(serde_json::Value::from),
        any::<String>().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|members| serde_json::Value::Object(members.into_iter().collect())),
        ]
    })
}

fn arb_response() -> impl Strategy<Value = RateLimitResponse> {
    let status = (
        any::<i32>(),
        prop::option::of((any::<String>(), any::<u32>(), any::<i32>())),
        any::<u32>(),
        prop::option::of((any::<i64>(), any::<i32>())),
    )
        .prop_map(
            |(code, limit, limit_remaining, duration)| DescriptorStatus {
                code,
                current_limit: limit.map(|(name, requests_per_unit, unit)| RateLimit {
                    name,
                    requests_per_unit,
                    unit,
                }),
                limit_remaining,
                duration_until_reset: duration.map(|(seconds, nanos)| Duration { seconds, nanos }),
                quota: None,
            },
        );
    let header =
        (any::<String>(), any::<String>(), any::<Vec<u8>>()).prop_map(|(key, value, raw_value)| {
            HeaderValue {
                key,
                value,
                raw_value,
            }
        });
    let value = any::<String>().prop_map(|s| Value {
        kind: Some(Kind::StringValue(s)),
    });
    (
        any::<i32>(),
        prop::collection::vec(status, 0..4),
        prop::collection::vec(header, 0..3),
        any::<Vec<u8>>(),
        prop::option::of(prop::collection::hash_map(any::<String>(), value, 0..4)),
        prop::option::of((any::<i64>(), any::<i32>())),
    )
        .prop_map(
            |(overall_code, statuses, headers, raw_body, metadata, valid_until)| {
                RateLimitResponse {
                    overall_code,
                    statuses,
                    response_headers_to_add: headers.clone(),
                    request_headers_to_add: headers,
                    raw_body,
                    dynamic_metadata: metadata.map(|fields| Struct { fields }),
                    quota: valid_until.map(|(seconds, nanos)| Quota {
                        requests: 1,
                        id: String::new(),
                        expiration_specifier: Some(ExpirationSpecifier::ValidUntil(Timestamp {
                            seconds,
                            nanos,
                        })),
                    }),
                }
            },
        )
}

proptest! {
    #[test]
    fn decodes_what_a_client_would_encode(req in arb_request(), style in arb_style()) {
        let body = serde_json::to_vec(&request_json(&req, &style)).unwrap();
        prop_assert_eq!(decode_request(&body).unwrap(), req);
    }

    #[test]
    fn arbitrary_bytes_never_panic(body in any::<Vec<u8>>()) {
        let _ = decode_request(&body);
    }

    #[test]
    fn arbitrary_json_never_panics(json in arb_json()) {
        let body = serde_json::to_vec(&json).unwrap();
        if let Err(e) = decode_request(&body) {
            // Every error renders, and a rejected well-formed body says where.
            prop_assert!(!matches!(e, JsonError::Syntax(_)), "{e}");
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn encoded_responses_are_valid_json(resp in arb_response()) {
        let out = encode_response(&resp);
        let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
        prop_assert!(parsed.is_object());
        if !resp.statuses.is_empty() {
            prop_assert_eq!(parsed["statuses"].as_array().map(Vec::len), Some(resp.statuses.len()));
        }
    }
}
