//! `/json`: a request body (proto3 JSON) -> `RateLimitRequest` (`api::json::decode_request`),
//! and the whole endpoint: body cap, decode, conversion, service, response encoding.
//!
//! Generated requests are written as a client may write them (either field spelling, integers
//! as numbers or strings, enums as names or numbers, explicit nulls), so decoding must give the
//! request back. Mutated and raw bodies must decode to a request that survives a round trip, or
//! fail with an error that says where; the endpoint must answer 200/429 with one status per
//! descriptor, or 400 with the reason.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use sluice::api::json::{JsonError, decode_request};

use crate::mutate::{apply, mutations, raw_bytes};
use crate::proto::{check_conversion, request};
use crate::support::{exchange, http_router, proptest_config, runtime, service, timed};

/// The endpoint's body cap here (SLUICE_MAX_REQUEST_BYTES): small, so some bodies cross it.
const MAX_REQUEST_BYTES: usize = 4096;

/// JSON syntax a mutation may insert, and the messages' field names.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\"",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"null",
    b"true",
    b"-0",
    b"1e400",
    b"18446744073709551616",
    b"-1",
    b"0.5",
    b"\"1e2\"",
    b"\"domain\"",
    b"\"descriptors\"",
    b"\"entries\"",
    b"\"key\"",
    b"\"value\"",
    b"\"hitsAddend\"",
    b"\"hits_addend\"",
    b"\"limit\"",
    b"\"unit\"",
    b"\"SECOND\"",
    b"\"WEEK\"",
    b"\"requestsPerUnit\"",
    b"\"isNegativeHits\"",
    b"[[[[[[[[",
    b"{\"a\":{\"a\":",
    b" ",
    b"\n",
];

/// Choices for how a client writes a request, drawn one after another from a seed.
struct Style(u64);

impl Style {
    fn pick(&mut self, n: u64) -> u64 {
        // xorshift: cheap, and deterministic for a given seed.
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
    fn name(&mut self, camel: &'static str, snake: &'static str) -> String {
        if self.pick(2) == 0 { camel } else { snake }.to_owned()
    }
    fn integer(&mut self, n: u64) -> Value {
        // Integral values with a fraction or an exponent, which protojson reads exactly at any
        // size: `1.8446744073709551615e19` is u64::MAX.
        let digits = n.to_string();
        // One digit before the point: `1.8446744073709551615e19`, `7e0`.
        let exponent =
            format!("{}.{}e{}", &digits[..1], &digits[1..], digits.len() - 1).replace(".e", "e");
        match self.pick(7) {
            0 => json!(digits),
            1 => json!(format!("{n}.0")),
            2 => json!(exponent),
            3 => written(&format!("{n}.000")),
            4 => written(&exponent),
            _ => json!(n),
        }
    }
    /// A default-valued field: left out, or given as null.
    fn default_field(&mut self, m: &mut Map<String, Value>, name: String) {
        if self.pick(4) == 0 {
            m.insert(name, Value::Null);
        }
    }
}

/// Marks a string as a number to write as is (a JSON number serde_json's `Value` cannot hold
/// exactly), for [`write_numbers`] to unquote once the body is written.
const WRITTEN: &str = "\u{1}number:";

fn written(number: &str) -> Value {
    json!(format!("{WRITTEN}{number}"))
}

/// `body` with every [`written`] string replaced by its number, unquoted.
fn write_numbers(body: Vec<u8>) -> Vec<u8> {
    let mut body = String::from_utf8(body).expect("serde_json writes UTF-8");
    let marker = "\"\\u0001number:";
    while let Some(at) = body.find(marker) {
        let start = at + marker.len();
        let len = body[start..].find('"').expect("a closing quote");
        let number = body[start..start + len].to_owned();
        body.replace_range(at..start + len + 1, &number);
    }
    body.into_bytes()
}

fn descriptor_json(d: &RateLimitDescriptor, style: &mut Style) -> Value {
    let mut m = Map::new();
    let entries: Vec<Value> = d
        .entries
        .iter()
        .map(|e| json!({"key": e.key, "value": e.value}))
        .collect();
    m.insert("entries".into(), Value::Array(entries));
    if let Some(l) = &d.limit {
        let unit = match RateLimitUnit::try_from(l.unit) {
            Ok(u) if style.pick(2) == 0 => json!(u.as_str_name()),
            _ => json!(l.unit),
        };
        let mut limit = Map::new();
        let rpu = style.integer(u64::from(l.requests_per_unit));
        limit.insert(style.name("requestsPerUnit", "requests_per_unit"), rpu);
        limit.insert("unit".into(), unit);
        m.insert("limit".into(), Value::Object(limit));
    }
    let hits_name = style.name("hitsAddend", "hits_addend");
    match &d.hits_addend {
        Some(h) => {
            let n = style.integer(h.value);
            m.insert(hits_name, n);
        }
        None => style.default_field(&mut m, hits_name),
    }
    let negative = style.name("isNegativeHits", "is_negative_hits");
    if d.is_negative_hits {
        m.insert(negative, json!(true));
    } else {
        style.default_field(&mut m, negative);
    }
    Value::Object(m)
}

/// A request as a client could write it in proto3 JSON, in the style `seed` picks.
pub fn request_json(req: &RateLimitRequest, seed: u64) -> Vec<u8> {
    let mut style = Style(seed | 1);
    let mut m = Map::new();
    m.insert("domain".into(), json!(req.domain));
    let descriptors = req
        .descriptors
        .iter()
        .map(|d| descriptor_json(d, &mut style))
        .collect();
    m.insert("descriptors".into(), Value::Array(descriptors));
    let hits_name = style.name("hitsAddend", "hits_addend");
    if req.hits_addend != 0 {
        let n = style.integer(u64::from(req.hits_addend));
        m.insert(hits_name, n);
    } else {
        style.default_field(&mut m, hits_name);
    }
    let value = Value::Object(m);
    write_numbers(if style.pick(2) == 0 {
        serde_json::to_vec_pretty(&value).expect("serialises")
    } else {
        serde_json::to_vec(&value).expect("serialises")
    })
}

/// Where a decode error may point: the request itself or one of its fields.
const ERROR_PATHS: &[&str] = &[
    "request",
    "domain",
    "descriptors",
    "hitsAddend",
    "hits_addend",
];

/// The check for one body given straight to the decoder.
pub fn check_decode(body: &[u8], seed: u64) -> Option<RateLimitRequest> {
    match decode_request(body) {
        Err(e) => {
            let message = e.to_string();
            assert!(!message.is_empty());
            if !matches!(e, JsonError::Syntax(_)) {
                assert!(
                    ERROR_PATHS.iter().any(|p| message.starts_with(p)),
                    "an error that does not say where: {message}"
                );
            }
            None
        }
        Ok(req) => {
            // What decoded, written again in any style, decodes to the same request.
            let again = decode_request(&request_json(&req, seed)).expect("re-decodes");
            assert_eq!(again, req);
            check_conversion(&req);
            Some(req)
        }
    }
}

thread_local! {
    static HTTP: (tokio::runtime::Runtime, std::cell::RefCell<axum::Router>) =
        (runtime(), std::cell::RefCell::new(http_router(service(100_000), MAX_REQUEST_BYTES)));
}

/// The check for one body sent to `/json`: the answer agrees with the decoder.
pub fn check_endpoint(body: &[u8]) {
    let decoded = decode_request(body);
    let request = Request::post("/json")
        .body(Body::from(body.to_vec()))
        .expect("a request");
    let (status, _, answer) = HTTP.with(|(rt, router)| {
        let mut router = router.borrow_mut();
        rt.block_on(exchange(&mut router, request))
    });
    let text = String::from_utf8_lossy(&answer);
    match status {
        StatusCode::OK | StatusCode::TOO_MANY_REQUESTS => {
            let req = decoded.expect("answered a body that does not decode");
            let json: Value = serde_json::from_slice(&answer).expect("a JSON answer");
            let statuses = json.get("statuses").and_then(Value::as_array).map(Vec::len);
            assert_eq!(statuses.unwrap_or(0), req.descriptors.len(), "{text}");
            assert!(body.len() <= MAX_REQUEST_BYTES);
        }
        StatusCode::BAD_REQUEST => {
            let reason = text.strip_prefix("Bad Request\n").expect("Go's first line");
            assert!(!reason.trim().is_empty(), "400 without a reason");
            if body.len() > MAX_REQUEST_BYTES {
                assert!(reason.contains("SLUICE_MAX_REQUEST_BYTES"), "{reason}");
            } else if let Err(e) = decoded {
                assert_eq!(reason, format!("{e}\n"));
            }
        }
        other => panic!("/json answered {other}: {text}"),
    }
}

/// One cargo-fuzz input (`fuzz/fuzz_targets/json.rs`): a `/json` body, decoded (re-encoded in
/// a style that varies with its length) and sent to the endpoint.
pub fn check_fuzz_input(body: &[u8]) {
    let seed = (body.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    check_decode(body, seed);
    check_endpoint(body);
}

proptest! {
    #![proptest_config(proptest_config(512, "proptest-regressions/fuzz/json.txt"))]

    #[test]
    fn written_requests_decode_back(req in request(), seed in any::<u64>()) {
        let body = request_json(&req, seed);
        prop_assert_eq!(decode_request(&body).expect("decodes"), req);
        timed("json written", || check_endpoint(&body));
    }

    #[test]
    fn mutated_bodies_decode_or_say_where(
        req in request(),
        seed in any::<u64>(),
        edits in mutations(6),
    ) {
        let mut body = request_json(&req, seed);
        apply(&mut body, &edits, TOKENS);
        timed("json mutated", || {
            check_decode(&body, seed);
            check_endpoint(&body);
        });
    }

    #[test]
    fn raw_bodies_decode_or_say_where(body in raw_bytes(1024)) {
        timed("json raw", || check_fuzz_input(&body));
    }
}

/// Found by the long run: integers past 2^53 written with a fraction or an exponent went
/// through a double, so `9007199254740993.0` was counted as 9007199254740992 and
/// `1.8446744073709551615e19` (u64::MAX) was refused as out of range. protojson reads them
/// exactly; so does `/json` now, and refuses what is not integral or past the field's range,
/// naming the field.
#[test]
fn large_integers_with_a_fraction_or_an_exponent_are_read_exactly() {
    let addend = |v: &str| {
        let body = format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"v"}}],"hitsAddend":{v}}}]}}"#
        );
        check_fuzz_input(body.as_bytes());
        decode_request(body.as_bytes())
            .map(|r| r.descriptors[0].hits_addend.map(|h| h.value))
            .map_err(|e| e.to_string())
    };
    let two53 = 1_u64 << 53;
    for v in [
        "9007199254740993.0",
        "9007199254740993e0",
        "\"9007199254740993.0\"",
    ] {
        assert_eq!(addend(v), Ok(Some(two53 + 1)), "{v}");
    }
    for v in [
        "1.8446744073709551615e19",
        "18446744073709551615.0",
        "\"1.8446744073709551615E+19\"",
    ] {
        assert_eq!(addend(v), Ok(Some(u64::MAX)), "{v}");
    }
    assert_eq!(
        addend("1.8446744073709551616e19"),
        Err(
            "descriptors[0].hitsAddend: 1.8446744073709551616e19 is out of range for uint64".into()
        )
    );
    assert_eq!(
        addend("9007199254740993.5"),
        Err("descriptors[0].hitsAddend: 9007199254740993.5 is not an integer".into())
    );
    // The generator writes such numbers too (`written`), as a client may.
    let req = decode_request(&write_numbers(
        serde_json::to_vec(&json!({"hitsAddend": written("4.294967295e9")})).unwrap(),
    ))
    .unwrap();
    assert_eq!(req.hits_addend, u32::MAX);
}
