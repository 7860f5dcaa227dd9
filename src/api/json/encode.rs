//! Encoding: prost's `RateLimitResponse` -> proto3 JSON, through borrowed views that serialize
//! with serde_json (for correct escaping): fields in `.proto` declaration order, zero values
//! omitted, enums as names, the well-known types as [`super::wkt`] writes them, and
//! `google.protobuf.Struct` as a plain JSON object.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::quota::ExpirationSpecifier;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, Quota, RateLimit,
};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Duration, Struct, Timestamp, Value};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

use super::wkt::{base64, format_duration, format_timestamp};

/// Encodes a `RateLimitResponse` as proto3 JSON, as `protojson.Marshal` would (compact form).
pub fn encode_response(resp: &RateLimitResponse) -> String {
    // Serializing into memory can only fail on non-string map keys or a custom error, and the
    // impls below produce neither. Should that ever change, answer with an UNKNOWN overall code
    // (which `/json` maps to 500) rather than panic in a request handler.
    serde_json::to_string(&J(resp)).unwrap_or_else(|_| String::from(r#"{"overallCode":"UNKNOWN"}"#))
}

/// A borrowed view of a prost message that serializes as its proto3 JSON form.
struct J<'a, T>(&'a T);

/// A repeated field.
impl<T> Serialize for J<'_, Vec<T>>
where
    for<'a> J<'a, T>: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&J(item))?;
        }
        seq.end()
    }
}

/// An enum value: its name when known, else the bare number (proto3 enums are open).
struct EnumJson(i32, Option<&'static str>);

impl Serialize for EnumJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.1 {
            Some(name) => s.serialize_str(name),
            None => s.serialize_i32(self.0),
        }
    }
}

fn code(n: i32) -> EnumJson {
    EnumJson(n, Code::try_from(n).ok().map(|c| c.as_str_name()))
}

fn unit(n: i32) -> EnumJson {
    EnumJson(n, Unit::try_from(n).ok().map(|u| u.as_str_name()))
}

/// A `bytes` field: standard base64 with padding, as `protojson` writes it.
struct Base64<'a>(&'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64(self.0))
    }
}

impl Serialize for J<'_, RateLimitResponse> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut m = s.serialize_map(None)?;
        if r.overall_code != 0 {
            m.serialize_entry("overallCode", &code(r.overall_code))?;
        }
        if !r.statuses.is_empty() {
            m.serialize_entry("statuses", &J(&r.statuses))?;
        }
        if !r.response_headers_to_add.is_empty() {
            m.serialize_entry("responseHeadersToAdd", &J(&r.response_headers_to_add))?;
        }
        if !r.request_headers_to_add.is_empty() {
            m.serialize_entry("requestHeadersToAdd", &J(&r.request_headers_to_add))?;
        }
        if !r.raw_body.is_empty() {
            m.serialize_entry("rawBody", &Base64(&r.raw_body))?;
        }
        if let Some(metadata) = &r.dynamic_metadata {
            m.serialize_entry("dynamicMetadata", &J(metadata))?;
        }
        if let Some(quota) = &r.quota {
            m.serialize_entry("quota", &J(quota))?;
        }
        m.end()
    }
}

impl Serialize for J<'_, DescriptorStatus> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let d = self.0;
        let mut m = s.serialize_map(None)?;
        if d.code != 0 {
            m.serialize_entry("code", &code(d.code))?;
        }
        if let Some(limit) = &d.current_limit {
            m.serialize_entry("currentLimit", &J(limit))?;
        }
        if d.limit_remaining != 0 {
            m.serialize_entry("limitRemaining", &d.limit_remaining)?;
        }
        if let Some(duration) = &d.duration_until_reset {
            m.serialize_entry("durationUntilReset", &J(duration))?;
        }
        if let Some(quota) = &d.quota {
            m.serialize_entry("quota", &J(quota))?;
        }
        m.end()
    }
}

impl Serialize for J<'_, RateLimit> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let l = self.0;
        let mut m = s.serialize_map(None)?;
        // `name` is field 3 but declared first in the .proto, and protojson writes fields in
        // declaration order.
        if !l.name.is_empty() {
            m.serialize_entry("name", &l.name)?;
        }
        if l.requests_per_unit != 0 {
            m.serialize_entry("requestsPerUnit", &l.requests_per_unit)?;
        }
        if l.unit != 0 {
            m.serialize_entry("unit", &unit(l.unit))?;
        }
        m.end()
    }
}

impl Serialize for J<'_, Quota> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let q = self.0;
        let mut m = s.serialize_map(None)?;
        if q.requests != 0 {
            m.serialize_entry("requests", &q.requests)?;
        }
        // A oneof member is written whenever it is set, even to its zero value.
        if let Some(ExpirationSpecifier::ValidUntil(ts)) = &q.expiration_specifier {
            m.serialize_entry("validUntil", &J(ts))?;
        }
        if !q.id.is_empty() {
            m.serialize_entry("id", &q.id)?;
        }
        m.end()
    }
}

impl Serialize for J<'_, HeaderValue> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let h = self.0;
        let mut m = s.serialize_map(None)?;
        if !h.key.is_empty() {
            m.serialize_entry("key", &h.key)?;
        }
        if !h.value.is_empty() {
            m.serialize_entry("value", &h.value)?;
        }
        if !h.raw_value.is_empty() {
            m.serialize_entry("rawValue", &Base64(&h.raw_value))?;
        }
        m.end()
    }
}

impl Serialize for J<'_, Struct> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The fields live in a HashMap; sort them, as protojson does, so output is deterministic.
        let mut fields: Vec<_> = self.0.fields.iter().collect();
        fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut m = s.serialize_map(Some(fields.len()))?;
        for (key, value) in fields {
            m.serialize_entry(key, &J(value))?;
        }
        m.end()
    }
}

impl Serialize for J<'_, Value> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0.kind {
            // protojson refuses to marshal a Value with no kind; null is the closest valid JSON.
            None | Some(Kind::NullValue(_)) => s.serialize_unit(),
            Some(Kind::NumberValue(n)) => serialize_number(*n, s),
            Some(Kind::StringValue(v)) => s.serialize_str(v),
            Some(Kind::BoolValue(b)) => s.serialize_bool(*b),
            Some(Kind::StructValue(v)) => J(v).serialize(s),
            Some(Kind::ListValue(list)) => J(&list.values).serialize(s),
        }
    }
}

/// A `google.protobuf.Value` number. Go writes integral doubles below 1e21 without a fraction
/// (`5`, not serde_json's `5.0`), and counters in dynamic metadata are exactly such numbers, so
/// write those as integers. NaN and infinities (which protojson refuses) come out as null.
fn serialize_number<S: Serializer>(n: f64, s: S) -> Result<S::Ok, S::Error> {
    if n.is_finite() && n.fract() == 0.0 && n.abs() < 1e21 {
        // Exact: an integral double below 1e21 < 2^70 fits an i128.
        s.serialize_i128(n as i128)
    } else {
        s.serialize_f64(n)
    }
}

// The well-known types, as strings written by `super::wkt`.

impl Serialize for J<'_, Duration> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(self.0))
    }
}

impl Serialize for J<'_, Timestamp> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_timestamp(self.0))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use envoy_types::pb::google::protobuf::ListValue;

    use super::*;

    #[test]
    fn encodes_the_documented_example_byte_for_byte() {
        let resp = RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![DescriptorStatus {
                code: Code::Ok as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: 50,
                    unit: Unit::Second as i32,
                }),
                limit_remaining: 49,
                duration_until_reset: Some(Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                quota: None,
            }],
            ..Default::default()
        };
        assert_eq!(
            encode_response(&resp),
            r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":50,"unit":"SECOND"},"limitRemaining":49,"durationUntilReset":"1s"}]}"#
        );
    }

    #[test]
    fn encodes_an_empty_response_as_an_empty_object() {
        assert_eq!(encode_response(&RateLimitResponse::default()), "{}");
        // A status with every field at its zero value still occupies its slot in the list.
        let resp = RateLimitResponse {
            statuses: vec![DescriptorStatus::default()],
            ..Default::default()
        };
        assert_eq!(encode_response(&resp), r#"{"statuses":[{}]}"#);
    }

    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "one end-to-end scenario, step by step; to split next"
    )]
    fn encodes_every_response_field() {
        let metadata = Struct {
            fields: HashMap::from([
                (
                    "domain".to_string(),
                    Value {
                        kind: Some(Kind::StringValue("rl".into())),
                    },
                ),
                (
                    "hitsAddend".to_string(),
                    Value {
                        kind: Some(Kind::NumberValue(3.0)),
                    },
                ),
                (
                    "ratio".to_string(),
                    Value {
                        kind: Some(Kind::NumberValue(0.25)),
                    },
                ),
                (
                    "nan".to_string(),
                    Value {
                        kind: Some(Kind::NumberValue(f64::NAN)),
                    },
                ),
                ("none".to_string(), Value { kind: None }),
                (
                    "null".to_string(),
                    Value {
                        kind: Some(Kind::NullValue(0)),
                    },
                ),
                (
                    "on".to_string(),
                    Value {
                        kind: Some(Kind::BoolValue(true)),
                    },
                ),
                (
                    "descriptors".to_string(),
                    Value {
                        kind: Some(Kind::ListValue(ListValue {
                            values: vec![Value {
                                kind: Some(Kind::StructValue(Struct {
                                    fields: HashMap::from([(
                                        "entries".to_string(),
                                        Value {
                                            kind: Some(Kind::ListValue(ListValue {
                                                values: vec![Value {
                                                    kind: Some(Kind::StringValue("k=v".into())),
                                                }],
                                            })),
                                        },
                                    )]),
                                })),
                            }],
                        })),
                    },
                ),
            ]),
        };
        let quota = Quota {
            requests: 10,
            id: "q1".into(),
            expiration_specifier: Some(ExpirationSpecifier::ValidUntil(Timestamp {
                seconds: 1_484_443_815,
                nanos: 10_000_000,
            })),
        };
        let resp = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![
                DescriptorStatus {
                    code: Code::OverLimit as i32,
                    current_limit: Some(RateLimit {
                        name: "per \"user\"\n".into(),
                        requests_per_unit: 10,
                        unit: Unit::Week as i32,
                    }),
                    limit_remaining: 0,
                    duration_until_reset: Some(Duration {
                        seconds: 58,
                        nanos: 500_000_000,
                    }),
                    quota: Some(quota.clone()),
                },
                DescriptorStatus {
                    code: 9,
                    current_limit: Some(RateLimit {
                        unit: 42,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            response_headers_to_add: vec![HeaderValue {
                key: "RateLimit-Limit".into(),
                value: "10".into(),
                raw_value: vec![],
            }],
            request_headers_to_add: vec![HeaderValue {
                key: "x-raw".into(),
                value: String::new(),
                raw_value: b"\xff\x00ab".to_vec(),
            }],
            raw_body: b"over".to_vec(),
            dynamic_metadata: Some(metadata),
            quota: Some(quota),
        };
        assert_eq!(
            encode_response(&resp),
            concat!(
                r#"{"overallCode":"OVER_LIMIT","statuses":["#,
                r#"{"code":"OVER_LIMIT","currentLimit":{"name":"per \"user\"\n","requestsPerUnit":10,"unit":"WEEK"},"#,
                r#""durationUntilReset":"58.500s","quota":{"requests":10,"validUntil":"2017-01-15T01:30:15.010Z","id":"q1"}},"#,
                r#"{"code":9,"currentLimit":{"unit":42}}],"#,
                r#""responseHeadersToAdd":[{"key":"RateLimit-Limit","value":"10"}],"#,
                r#""requestHeadersToAdd":[{"key":"x-raw","rawValue":"/wBhYg=="}],"#,
                r#""rawBody":"b3Zlcg==","#,
                r#""dynamicMetadata":{"descriptors":[{"entries":["k=v"]}],"domain":"rl","hitsAddend":3,"nan":null,"none":null,"null":null,"on":true,"ratio":0.25},"#,
                r#""quota":{"requests":10,"validUntil":"2017-01-15T01:30:15.010Z","id":"q1"}}"#,
            )
        );
    }

    #[test]
    fn escapes_control_characters_and_non_ascii() {
        let resp = RateLimitResponse {
            response_headers_to_add: vec![HeaderValue {
                key: "k\u{1}\t\\".into(),
                value: "é\u{2028}😀".into(),
                raw_value: vec![],
            }],
            ..Default::default()
        };
        let out = encode_response(&resp);
        assert_eq!(
            out,
            "{\"responseHeadersToAdd\":[{\"key\":\"k\\u0001\\t\\\\\",\"value\":\"é\u{2028}😀\"}]}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(parsed["responseHeadersToAdd"][0]["key"], "k\u{1}\t\\");
    }

    #[test]
    fn writes_integral_metadata_numbers_without_a_fraction() {
        let number = |n: f64| {
            serde_json::to_string(&J(&Value {
                kind: Some(Kind::NumberValue(n)),
            }))
            .unwrap()
        };
        assert_eq!(number(5.0), "5");
        assert_eq!(number(-5.0), "-5");
        assert_eq!(number(1e20), "100000000000000000000");
        assert_eq!(number(1.5), "1.5");
        assert_eq!(number(f64::INFINITY), "null");
        assert_eq!(serde_json::from_str::<f64>(&number(1e21)).unwrap(), 1e21);
    }
}
