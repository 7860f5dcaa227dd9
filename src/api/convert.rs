//! Protobuf <-> domain conversions shared by the gRPC and `/json` adapters. Strings are moved
//! out of the decoded message, never copied.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as PbCode, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Duration, ListValue, Struct, Value};

use super::bad_request::BadRequest;
use crate::descriptor::{Descriptor, Entry, LimitOverride, Request};
use crate::limiter::Unit;
use crate::service::{Code, Response, Status};

/// A request that cannot be turned into a [`Request`].
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ConvertError {
    /// The Go service crashes on this (its PR #1202); Sluice refuses the request instead.
    #[error(
        "descriptors[{index}].limit.unit: {unit} is not a valid unit (expected SECOND, MINUTE, HOUR, DAY, MONTH, YEAR or WEEK)"
    )]
    BadOverrideUnit { index: usize, unit: i32 },
}

impl From<ConvertError> for BadRequest {
    fn from(e: ConvertError) -> Self {
        BadRequest::invalid(e)
    }
}

/// Moves a decoded protobuf request into the domain model.
pub fn request_from_proto(req: RateLimitRequest) -> Result<Request, ConvertError> {
    // A new vector rather than the decoded one reused in place: a descriptor is smaller than
    // the protobuf's, so reusing it takes a `realloc`, measured slower than a fresh allocation.
    let mut descriptors = Vec::with_capacity(req.descriptors.len());
    for (index, d) in req.descriptors.into_iter().enumerate() {
        descriptors.push(descriptor_from_proto(index, d)?);
    }
    Ok(Request {
        domain: req.domain,
        descriptors,
        hits_addend: req.hits_addend,
    })
}

fn descriptor_from_proto(index: usize, d: RateLimitDescriptor) -> Result<Descriptor, ConvertError> {
    let limit_override = match d.limit {
        None => None,
        Some(o) => Some(LimitOverride {
            requests_per_unit: o.requests_per_unit,
            unit: Unit::from_proto_number(o.unit).ok_or(ConvertError::BadOverrideUnit {
                index,
                unit: o.unit,
            })?,
        }),
    };
    Ok(Descriptor {
        // Collected in place: an entry has the protobuf entry's layout, so the decoded
        // vector's allocation is reused.
        entries: d
            .entries
            .into_iter()
            .map(|e| Entry {
                key: e.key,
                value: e.value,
            })
            .collect(),
        limit_override,
        hits_addend: d.hits_addend.map(|h| h.value),
        negative_hits: d.is_negative_hits,
    })
}

fn code_to_proto(code: Code) -> i32 {
    match code {
        Code::Ok => PbCode::Ok as i32,
        Code::OverLimit => PbCode::OverLimit as i32,
    }
}

fn status_to_proto(s: Status) -> DescriptorStatus {
    DescriptorStatus {
        code: code_to_proto(s.code),
        current_limit: s.current_limit.map(|l| PbRateLimit {
            name: l.name,
            requests_per_unit: l.requests_per_unit,
            unit: l.unit.proto_number(),
        }),
        limit_remaining: s.limit_remaining,
        duration_until_reset: s.duration_until_reset_secs.map(|secs| Duration {
            seconds: i64::try_from(secs).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        quota: None,
    }
}

/// Encodes a domain response as the protobuf message.
pub fn response_to_proto(mut r: Response) -> RateLimitResponse {
    let statuses = r.statuses.drain(..).map(status_to_proto).collect();
    crate::service::recycle_statuses(std::mem::take(&mut r.statuses));
    RateLimitResponse {
        overall_code: code_to_proto(r.overall_code),
        statuses,
        response_headers_to_add: r
            .response_headers
            .map_or_else(Vec::new, |h| header_values(h.pairs())),
        request_headers_to_add: r
            .request_headers
            .map_or_else(Vec::new, |h| header_values(h.pairs())),
        dynamic_metadata: r
            .dynamic_metadata
            .and_then(|v| match json_to_proto(v).kind {
                Some(Kind::StructValue(s)) => Some(s),
                _ => None,
            }),
        ..Default::default()
    }
}

/// Headers as the protobuf's `HeaderValue`s: the value in `value` (Go's service fills no
/// `raw_value`).
fn header_values<'a>(pairs: impl IntoIterator<Item = (&'a str, u64)>) -> Vec<HeaderValue> {
    pairs
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key: key.to_owned(),
            value: value.to_string(),
            raw_value: Vec::new(),
        })
        .collect()
}

/// A JSON value as a `google.protobuf.Value` (numbers become doubles, as in protobuf).
fn json_to_proto(v: serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        J::String(s) => Kind::StringValue(s),
        J::Array(a) => Kind::ListValue(ListValue {
            values: a.into_iter().map(json_to_proto).collect(),
        }),
        J::Object(m) => Kind::StructValue(Struct {
            fields: m.into_iter().map(|(k, v)| (k, json_to_proto(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry as PbEntry, RateLimitOverride,
    };
    use envoy_types::pb::google::protobuf::UInt64Value;

    #[test]
    fn moves_every_field_and_keeps_a_zero_addend_distinct_from_unset() {
        let req = RateLimitRequest {
            domain: "d".into(),
            hits_addend: 3,
            descriptors: vec![RateLimitDescriptor {
                entries: vec![PbEntry {
                    key: "k".into(),
                    value: "v".into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 7,
                    unit: 2,
                }),
                hits_addend: Some(UInt64Value { value: 0 }),
                is_negative_hits: true,
            }],
        };
        let r = request_from_proto(req).unwrap();
        assert_eq!(r.domain, "d");
        assert_eq!(r.hits_addend, 3);
        assert_eq!(r.descriptors[0].entries, vec![Entry::new("k", "v")]);
        assert_eq!(r.descriptors[0].hits_addend, Some(0));
        assert!(r.descriptors[0].negative_hits);
        assert_eq!(
            r.descriptors[0].limit_override,
            Some(LimitOverride {
                requests_per_unit: 7,
                unit: Unit::Minute
            })
        );
    }

    #[test]
    fn an_override_with_unit_unknown_is_an_error_naming_the_descriptor() {
        let req = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![
                RateLimitDescriptor::default(),
                RateLimitDescriptor {
                    limit: Some(RateLimitOverride {
                        requests_per_unit: 1,
                        unit: 0,
                    }),
                    ..Default::default()
                },
            ],
            hits_addend: 0,
        };
        let err = request_from_proto(req).unwrap_err();
        assert_eq!(err, ConvertError::BadOverrideUnit { index: 1, unit: 0 });
        assert!(err.to_string().starts_with("descriptors[1].limit.unit: 0"));
    }
}
