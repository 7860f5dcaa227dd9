//! The decoder through `decode_request`: both spellings of every field, nulls, integers in any
//! JSON form, and the text of every error with the path it names.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;

use crate::api::json::{JsonError, decode_request};

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.into(),
        value: value.into(),
    }
}

fn error(body: &str) -> String {
    match decode_request(body.as_bytes()) {
        Ok(req) => panic!("{body} decoded to {req:?}, expected an error"),
        Err(e) => e.to_string(),
    }
}

fn sample_request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "envoy".into(),
        descriptors: vec![
            RateLimitDescriptor {
                entries: vec![entry("remote_address", "10.0.0.1"), entry("path", "/")],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 42,
                    unit: RateLimitUnit::Hour as i32,
                }),
                hits_addend: Some(UInt64Value { value: 0 }),
                is_negative_hits: true,
            },
            RateLimitDescriptor {
                entries: vec![entry("k", "")],
                ..Default::default()
            },
        ],
        hits_addend: 3,
    }
}

#[test]
fn decodes_lower_camel_case_names() {
    let body = r#"{
        "domain": "envoy",
        "descriptors": [
            {
                "entries": [{"key": "remote_address", "value": "10.0.0.1"}, {"key": "path", "value": "/"}],
                "limit": {"requestsPerUnit": 42, "unit": "HOUR"},
                "hitsAddend": 0,
                "isNegativeHits": true
            },
            {"entries": [{"key": "k"}]}
        ],
        "hitsAddend": 3
    }"#;
    assert_eq!(decode_request(body.as_bytes()).unwrap(), sample_request());
}

#[test]
fn decodes_proto_names_strings_for_integers_and_numbers_for_enums() {
    let body = r#"{
        "domain": "envoy",
        "descriptors": [
            {
                "entries": [{"key": "remote_address", "value": "10.0.0.1"}, {"key": "path", "value": "/"}],
                "limit": {"requests_per_unit": "42", "unit": 3},
                "hits_addend": "0",
                "is_negative_hits": true
            },
            {"entries": [{"key": "k", "value": ""}], "limit": null, "hits_addend": null}
        ],
        "hits_addend": "3"
    }"#;
    assert_eq!(decode_request(body.as_bytes()).unwrap(), sample_request());
}

#[test]
fn null_means_default_everywhere() {
    let body = r#"{"domain":null,"descriptors":null,"hitsAddend":null}"#;
    assert_eq!(
        decode_request(body.as_bytes()).unwrap(),
        RateLimitRequest::default()
    );
    let body = r#"{"descriptors":[{"entries":[{"key":null,"value":null}],"isNegativeHits":null,"limit":{"unit":null}}]}"#;
    let want = RateLimitRequest {
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry::default()],
            limit: Some(RateLimitOverride::default()),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(decode_request(body.as_bytes()).unwrap(), want);
    assert_eq!(decode_request(b"{}").unwrap(), RateLimitRequest::default());
}

#[test]
fn accepts_integral_numbers_in_any_json_form() {
    let hits = |v: &str| {
        decode_request(format!(r#"{{"hitsAddend":{v}}}"#).as_bytes())
            .map(|r| r.hits_addend)
            .map_err(|e| e.to_string())
    };
    assert_eq!(hits("4294967295"), Ok(u32::MAX));
    assert_eq!(hits("1e2"), Ok(100));
    assert_eq!(hits("100.0"), Ok(100));
    assert_eq!(hits("\"1e2\""), Ok(100));
    assert_eq!(hits("-0"), Ok(0));
    let addend = |v: &str| {
        decode_request(format!(r#"{{"descriptors":[{{"hitsAddend":{v}}}]}}"#).as_bytes())
            .map(|r| r.descriptors[0].hits_addend.map(|w| w.value))
            .map_err(|e| e.to_string())
    };
    assert_eq!(addend("18446744073709551615"), Ok(Some(u64::MAX)));
    assert_eq!(addend("\"18446744073709551615\""), Ok(Some(u64::MAX)));
    assert_eq!(addend("7"), Ok(Some(7)));
    assert_eq!(addend("null"), Ok(None));
    // Exactly, up to 2^53: serde_json's default float parsing rounds twice and made these
    // 9007199254740990 (found by tests/fuzz), hence its float_roundtrip feature.
    assert_eq!(addend("9007199254740991.0"), Ok(Some((1 << 53) - 1)));
    assert_eq!(addend("\"9007199254740991.0\""), Ok(Some((1 << 53) - 1)));
    assert_eq!(addend("90071992547409.91e2"), Ok(Some((1 << 53) - 1)));
    // And past 2^53, where a double is no longer exact (tests/fuzz): read from the text.
    assert_eq!(addend("9007199254740993.0"), Ok(Some((1 << 53) + 1)));
    assert_eq!(addend("9007199254740993e0"), Ok(Some((1 << 53) + 1)));
    assert_eq!(addend("\"9007199254740993.0\""), Ok(Some((1 << 53) + 1)));
    assert_eq!(addend("1.8446744073709551615e19"), Ok(Some(u64::MAX)));
    assert_eq!(addend("18446744073709551615.000"), Ok(Some(u64::MAX)));
    assert_eq!(addend("\"1844674407370955161.5e1\""), Ok(Some(u64::MAX)));
    assert_eq!(hits("4.294967295e9"), Ok(u32::MAX));
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, step by step; to split next"
)]
fn every_error_names_its_path() {
    let cases = [
        // Not JSON, or not an object.
        (
            "",
            "request body is not valid JSON: EOF while parsing a value at line 1 column 0",
        ),
        (
            "{",
            "request body is not valid JSON: EOF while parsing an object at line 1 column 1",
        ),
        (
            "{} {}",
            "request body is not valid JSON: trailing characters at line 1 column 4",
        ),
        (
            r#"{"domain":"\ud800x"}"#,
            "request body is not valid JSON: unexpected end of hex escape at line 1 column 18",
        ),
        ("null", "request: expected an object, found null"),
        ("[]", "request: expected an object, found an array"),
        // Unknown and duplicate fields.
        (r#"{"foo":1}"#, r#"request: unknown field "foo""#),
        (r#"{"Domain":"x"}"#, r#"request: unknown field "Domain""#),
        (
            r#"{"descriptors":[{"entries":[{"key":"k","val":"v"}]}]}"#,
            r#"descriptors[0].entries[0]: unknown field "val""#,
        ),
        (
            r#"{"domain":"a","domain":"b"}"#,
            r#"request: duplicate field "domain" (already given as "domain")"#,
        ),
        (
            r#"{"hitsAddend":1,"hits_addend":null}"#,
            r#"request: duplicate field "hits_addend" (already given as "hitsAddend")"#,
        ),
        (
            r#"{"descriptors":[{"limit":{"unit":"SECOND","unit":"MINUTE"}}]}"#,
            r#"descriptors[0].limit: duplicate field "unit" (already given as "unit")"#,
        ),
        // Wrong types.
        (
            r#"{"domain":1}"#,
            "domain: expected a string, found a number",
        ),
        (
            r#"{"descriptors":{}}"#,
            "descriptors: expected an array, found an object",
        ),
        (
            r#"{"descriptors":[null]}"#,
            "descriptors[0]: expected an object, found null",
        ),
        (
            r#"{"descriptors":[{},{"entries":"k=v"}]}"#,
            "descriptors[1].entries: expected an array, found a string",
        ),
        (
            r#"{"descriptors":[{},{"entries":[{"key":false}]}]}"#,
            "descriptors[1].entries[0].key: expected a string, found a boolean",
        ),
        (
            r#"{"descriptors":[{"entries":[{"key":"k","value":["v"]}]}]}"#,
            "descriptors[0].entries[0].value: expected a string, found an array",
        ),
        (
            r#"{"descriptors":[{"isNegativeHits":"true"}]}"#,
            "descriptors[0].isNegativeHits: expected a boolean, found a string",
        ),
        (
            r#"{"descriptors":[{"limit":5}]}"#,
            "descriptors[0].limit: expected an object, found a number",
        ),
        (
            r#"{"hitsAddend":true}"#,
            "hitsAddend: expected an integer (number or string), found a boolean",
        ),
        (
            r#"{"descriptors":[{"hitsAddend":{"value":1}}]}"#,
            "descriptors[0].hitsAddend: expected an integer (number or string), found an object",
        ),
        (
            r#"{"descriptors":[{"limit":{"unit":true}}]}"#,
            "descriptors[0].limit.unit: expected an enum name or integer, found a boolean",
        ),
        // Bad numbers.
        (
            r#"{"hitsAddend":-1}"#,
            "hitsAddend: -1 is out of range for uint32",
        ),
        (
            r#"{"hitsAddend":4294967296}"#,
            "hitsAddend: 4294967296 is out of range for uint32",
        ),
        (r#"{"hitsAddend":1.5}"#, "hitsAddend: 1.5 is not an integer"),
        (
            r#"{"hitsAddend":1e300}"#,
            "hitsAddend: 1e300 is out of range for uint32",
        ),
        (
            r#"{"hitsAddend":"-3"}"#,
            "hitsAddend: -3 is out of range for uint32",
        ),
        (
            r#"{"hitsAddend":"0.5"}"#,
            "hitsAddend: 0.5 is not an integer",
        ),
        (
            r#"{"hitsAddend":"abc"}"#,
            r#"hitsAddend: "abc" is not a number"#,
        ),
        (
            r#"{"hitsAddend":" 1"}"#,
            r#"hitsAddend: " 1" is not a number"#,
        ),
        (
            r#"{"hitsAddend":"+1"}"#,
            r#"hitsAddend: "+1" is not a number"#,
        ),
        (
            r#"{"hitsAddend":"0x10"}"#,
            r#"hitsAddend: "0x10" is not a number"#,
        ),
        (r#"{"hitsAddend":""}"#, r#"hitsAddend: "" is not a number"#),
        (
            r#"{"descriptors":[{"hits_addend":18446744073709551616}]}"#,
            "descriptors[0].hits_addend: 18446744073709551616 is out of range for uint64",
        ),
        (
            r#"{"descriptors":[{"hitsAddend":"18446744073709551616"}]}"#,
            "descriptors[0].hitsAddend: 18446744073709551616 is out of range for uint64",
        ),
        // Past u64::MAX by one, which a double cannot tell from u64::MAX (tests/fuzz).
        (
            r#"{"descriptors":[{"hitsAddend":1.8446744073709551616e19}]}"#,
            "descriptors[0].hitsAddend: 1.8446744073709551616e19 is out of range for uint64",
        ),
        (
            r#"{"descriptors":[{"hitsAddend":9007199254740993.5}]}"#,
            "descriptors[0].hitsAddend: 9007199254740993.5 is not an integer",
        ),
        (
            r#"{"hitsAddend":4294967295.1e1}"#,
            "hitsAddend: 4294967295.1e1 is out of range for uint32",
        ),
        (
            r#"{"descriptors":[{"hitsAddend":-1}]}"#,
            "descriptors[0].hitsAddend: -1 is out of range for uint64",
        ),
        (
            r#"{"descriptors":[{"limit":{"requestsPerUnit":-5}}]}"#,
            "descriptors[0].limit.requestsPerUnit: -5 is out of range for uint32",
        ),
        // Enums.
        (
            r#"{"descriptors":[{"limit":{"unit":"second"}}]}"#,
            r#"descriptors[0].limit.unit: "second" is not a envoy.type.v3.RateLimitUnit value"#,
        ),
        (
            r#"{"descriptors":[{"limit":{"unit":"WEEK"}}]}"#,
            r#"descriptors[0].limit.unit: "WEEK" is not a envoy.type.v3.RateLimitUnit value"#,
        ),
        (
            r#"{"descriptors":[{"limit":{"unit":"1"}}]}"#,
            r#"descriptors[0].limit.unit: "1" is not a envoy.type.v3.RateLimitUnit value"#,
        ),
        (
            r#"{"descriptors":[{"limit":{"unit":2147483648}}]}"#,
            "descriptors[0].limit.unit: 2147483648 is out of range for envoy.type.v3.RateLimitUnit",
        ),
        (
            r#"{"descriptors":[{"limit":{"unit":1.5}}]}"#,
            "descriptors[0].limit.unit: 1.5 is not an integer",
        ),
    ];
    for (body, want) in cases {
        assert_eq!(error(body), want, "body: {body}");
    }
}

#[test]
fn keeps_unnamed_enum_numbers() {
    let req = decode_request(br#"{"descriptors":[{"limit":{"unit":-7}}]}"#).unwrap();
    assert_eq!(req.descriptors[0].limit.unwrap().unit, -7);
}

#[test]
fn rejects_deep_nesting_without_overflowing_the_stack() {
    let body = format!(
        r#"{{"foo":{}{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert!(matches!(
        decode_request(body.as_bytes()),
        Err(JsonError::Syntax(_))
    ));
}

#[test]
fn rejects_invalid_utf8() {
    assert!(matches!(
        decode_request(b"{\"domain\":\"\xff\"}"),
        Err(JsonError::Syntax(_))
    ));
}
