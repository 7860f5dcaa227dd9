//! `/nginx` and `/forward-auth`: the `X-Sluice-*` headers of an `auth_request` subrequest, or
//! the query string of a forward-auth call, -> the domain request
//! (`api::forward_auth::request_from_headers`, `forward_auth_request`), and the endpoints'
//! answers.
//!
//! Generated requests (any text, percent-encoded; values taken from other headers with
//! `@Header`, present or not) are written as nginx would send them, in one header line or
//! several, so parsing must give them back. Mutated and raw header values must parse into a
//! well-formed request or be refused with a reason naming the header; the endpoint answers
//! 200/403 with `RateLimit-*` numbers, or 400 with the parser's reason.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use proptest::prelude::*;
use sluice::api::forward_auth::{
    DESCRIPTOR_HEADER, DOMAIN_HEADER, HITS_ADDEND_HEADER, LIMIT, REMAINING, RESET,
    forward_auth_request, request_from_headers,
};
use sluice::descriptor::{Descriptor, Entry};

use crate::mutate::{apply, mutations, raw_bytes};
use crate::support::{
    SERVICE_DOMAIN, exchange, http_router, proptest_config, runtime, service, timed,
};

/// Header syntax a mutation may insert.
const TOKENS: &[&[u8]] = &[
    b",",
    b"&",
    b"=",
    b"%",
    b"%2",
    b"%zz",
    b"%ff",
    b"%c3%28",
    b"%00",
    b"@",
    b"@x-c-a",
    b"@bad name",
    b" ",
    b"\t",
    b"k=v",
    b"4294967296",
    b"-1",
    b"+1",
    b"\xff",
    b"\xc3\xa9",
];

/// A value the descriptor carries: literal text, or another header of the subrequest.
#[derive(Clone, Debug)]
enum Source {
    Literal(String),
    /// `@x-c-<name>`; the header's values (none: the header is absent).
    Header(String, Vec<Vec<u8>>),
}

#[derive(Clone, Debug)]
struct Model {
    domain: String,
    descriptors: Vec<Vec<(String, Source)>>,
    hits_addend: Option<u32>,
    /// Layout choices: separators, case of hex digits, one header line per descriptor.
    seed: u64,
}

/// Bytes a header value may hold (`HeaderValue::from_bytes` refuses controls but tab).
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![Just(b'\t'), 0x20u8..0x7f, 0x80u8..=0xff];
    proptest::collection::vec(byte, 0..8)
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9]{1,4}",
        "\\PC{1,6}",
        ".{1,4}",
        Just("@x".to_owned()),
        Just(" , & = % ".to_owned()),
    ]
}

fn source() -> impl Strategy<Value = Source> {
    prop_oneof![
        3 => prop_oneof![Just(String::new()), text()].prop_map(Source::Literal),
        1 => ("[a-z][a-z0-9-]{0,6}", proptest::collection::vec(header_bytes(), 0..3))
            .prop_map(|(name, values)| Source::Header(format!("x-c-{name}"), values)),
    ]
}

fn model() -> impl Strategy<Value = Model> {
    let entry = (text(), source());
    (
        prop_oneof![3 => Just(SERVICE_DOMAIN.to_owned()), 1 => text()],
        proptest::collection::vec(proptest::collection::vec(entry, 1..4), 1..5),
        proptest::option::of(prop_oneof![0u32..4, any::<u32>(), Just(u32::MAX)]),
        any::<u64>(),
    )
        .prop_map(|(domain, descriptors, hits_addend, seed)| Model {
            domain,
            descriptors,
            hits_addend,
            seed,
        })
}

/// Percent-encodes all but a few plain bytes; `upper` picks the hex digits' case.
fn encode(s: &str, upper: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~*:/".contains(&b) {
            out.push(char::from(b));
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

/// The subrequest's headers for a model, as nginx would send them.
fn headers(m: &Model) -> HeaderMap {
    let mut h = HeaderMap::new();
    let bit = |i: u32| m.seed >> i & 1 == 1;
    let value = |s: String| HeaderValue::from_str(&s).expect("ASCII");
    h.append(
        DOMAIN_HEADER,
        value(format!(" {} ", encode(&m.domain, bit(0)))),
    );
    let mut items = Vec::new();
    for (i, entries) in m.descriptors.iter().enumerate() {
        let mut parts = Vec::new();
        for (key, source) in entries {
            let v = match source {
                Source::Literal(s) => encode(s, bit(1)),
                Source::Header(name, values) => {
                    for v in values {
                        let v = HeaderValue::from_bytes(v).expect("valid header bytes");
                        h.append(HeaderName::from_bytes(name.as_bytes()).expect("a name"), v);
                    }
                    format!("@{name}")
                }
            };
            parts.push(format!("{}={v}", encode(key, bit(2))));
        }
        items.push(parts.join(if bit(3) { " & " } else { "&" }));
        // A new header line now and then instead of a comma.
        if bit(4 + i as u32 % 32) || i + 1 == m.descriptors.len() {
            h.append(DESCRIPTOR_HEADER, value(items.join(" ,")));
            items.clear();
        }
    }
    if let Some(n) = m.hits_addend {
        h.append(HITS_ADDEND_HEADER, value(format!("{n} ")));
    }
    h
}

/// What parsing the model's headers must give: descriptors naming an absent header left out.
fn expected(m: &Model) -> Vec<Descriptor> {
    let mut out = Vec::new();
    'descriptors: for entries in &m.descriptors {
        let mut d = Descriptor::default();
        for (key, source) in entries {
            let value = match source {
                Source::Literal(s) => s.clone(),
                Source::Header(name, _) => {
                    // Values of every entry naming this header, in the order they were added.
                    let all: Vec<&Vec<u8>> = m
                        .descriptors
                        .iter()
                        .flatten()
                        .filter_map(|(_, s)| match s {
                            Source::Header(n, values) if n == name => Some(values),
                            _ => None,
                        })
                        .flatten()
                        .collect();
                    if all.is_empty() {
                        continue 'descriptors;
                    }
                    let lossy: Vec<String> = all
                        .iter()
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .collect();
                    lossy.join(",")
                }
            };
            d.entries.push(Entry::new(key.clone(), value));
        }
        out.push(d);
    }
    out
}

/// The byte cap `/nginx` applies to the `X-Sluice-*` headers here (SLUICE_MAX_REQUEST_BYTES),
/// as the endpoint below applies it.
const NGINX_MAX_BYTES: usize = 64 * 1024;

/// A parsed request is well formed; a refusal's reason names one of `names` (its header, its
/// query parameter or the byte cap).
fn check_parsed(parsed: Result<&sluice::descriptor::Request, String>, names: &[&str]) {
    match parsed {
        Ok(r) => {
            assert!(!r.domain.is_empty());
            for d in &r.descriptors {
                assert!(!d.entries.is_empty());
                assert!(d.entries.iter().all(|e| !e.key.is_empty()));
            }
        }
        Err(message) => {
            assert!(names.iter().any(|n| message.contains(n)), "{message}");
        }
    }
}

/// A parsed request is well formed, a refusal names the header or the byte cap.
fn check_parse(headers: &HeaderMap) {
    let parsed = request_from_headers(headers, NGINX_MAX_BYTES);
    check_parsed(
        parsed.as_ref().map_err(ToString::to_string),
        &["X-Sluice-", "SLUICE_MAX_REQUEST_BYTES"],
    );
}

thread_local! {
    static HTTP: (tokio::runtime::Runtime, std::cell::RefCell<axum::Router>) =
        (runtime(), std::cell::RefCell::new(http_router(service(100_000), 64 * 1024)));
}

/// The endpoint's answer agrees with the parser, and its numbers are numbers.
pub fn check_endpoint(headers: &HeaderMap) {
    check_parse(headers);
    let parsed = request_from_headers(headers, NGINX_MAX_BYTES);
    let mut request = Request::get("/nginx")
        .body(Body::empty())
        .expect("a request");
    *request.headers_mut() = headers.clone();
    let (status, answer_headers, body) = HTTP.with(|(rt, router)| {
        let mut router = router.borrow_mut();
        rt.block_on(exchange(&mut router, request))
    });
    let text = String::from_utf8_lossy(&body);
    let number = |name: &str| {
        answer_headers
            .get(name)
            .map(|v| v.to_str().ok().and_then(|s| s.parse::<u64>().ok()))
    };
    match status {
        StatusCode::OK | StatusCode::FORBIDDEN => {
            assert!(parsed.is_ok(), "answered {status} to {parsed:?}");
            for name in [LIMIT, REMAINING, RESET] {
                assert_ne!(number(name), Some(None), "{name} is not a number");
            }
            if status == StatusCode::FORBIDDEN {
                assert!(
                    matches!(number("retry-after"), Some(Some(_))),
                    "no Retry-After"
                );
            }
        }
        StatusCode::BAD_REQUEST => {
            assert!(!text.trim().is_empty(), "400 without a reason");
            if let Err(e) = parsed {
                assert_eq!(text, format!("{e}\n"));
            }
        }
        StatusCode::INTERNAL_SERVER_ERROR => assert!(!text.trim().is_empty()),
        other => panic!("/nginx answered {other}: {text}"),
    }
}

/// Header values from raw bytes; those `HeaderValue` refuses are left out, as no HTTP
/// parser would hand them over.
pub fn raw_headers(values: &[(&'static str, Vec<u8>)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, bytes) in values {
        if let Ok(v) = HeaderValue::from_bytes(bytes) {
            h.append(*name, v);
        }
    }
    h
}

/// The model as a forward-auth call: the query string (each descriptor in the header syntax,
/// percent-encoded once more as a query value) and the client's headers, with `X-Sluice-*`
/// headers of the client's own that must change nothing.
fn query(m: &Model) -> (String, HeaderMap) {
    let written = headers(m);
    let bit = |i: u32| m.seed >> i & 1 == 1;
    // Each value is the header's syntax (the domain percent-encoded) encoded once more.
    let domain = encode(&encode(&m.domain, bit(0)), bit(5));
    let mut params = vec![format!("domain={domain}")];
    for line in written.get_all(DESCRIPTOR_HEADER) {
        let line = line.to_str().expect("ASCII");
        params.push(format!("descriptor={}", encode(line, bit(6))));
    }
    if let Some(n) = m.hits_addend {
        params.push(format!("hits_addend={n}"));
    }
    let mut client = HeaderMap::new();
    for (name, v) in &written {
        if !name.as_str().starts_with("x-sluice-") {
            client.append(name.clone(), v.clone());
        }
    }
    client.append(DOMAIN_HEADER, HeaderValue::from_static("injected"));
    client.append(DESCRIPTOR_HEADER, HeaderValue::from_static("free=1"));
    client.append(HITS_ADDEND_HEADER, HeaderValue::from_static("99"));
    (params.join("&"), client)
}

/// A parsed forward-auth call is well formed; a refusal names its field or the byte cap.
fn check_query_parse(query: &str, headers: &HeaderMap) {
    let parsed = forward_auth_request(Some(query), headers, NGINX_MAX_BYTES);
    if let Ok((_, deny)) = &parsed {
        assert!((400..=599).contains(&deny.as_u16()));
    }
    check_parsed(
        parsed.as_ref().map(|(r, _)| r).map_err(ToString::to_string),
        &[
            "query parameter",
            "query string",
            "X-Sluice-",
            "SLUICE_MAX_REQUEST_BYTES",
        ],
    );
}

/// `/forward-auth` answers as its parser says: 200 or 429 with numeric headers, 400 with the
/// parser's reason, 500 with a reason.
fn check_forward_auth(query: &str, headers: &HeaderMap) {
    check_query_parse(query, headers);
    let Ok(uri) = format!("/forward-auth?{query}").parse::<axum::http::Uri>() else {
        return; // Not a URI an HTTP parser would hand over.
    };
    let Some(sent) = uri.query() else { return };
    let parsed = forward_auth_request(Some(sent), headers, NGINX_MAX_BYTES);
    let mut request = Request::get(uri).body(Body::empty()).expect("a request");
    *request.headers_mut() = headers.clone();
    let (status, answer_headers, body) = HTTP.with(|(rt, router)| {
        let mut router = router.borrow_mut();
        rt.block_on(exchange(&mut router, request))
    });
    let text = String::from_utf8_lossy(&body);
    match status {
        StatusCode::OK | StatusCode::TOO_MANY_REQUESTS => {
            assert!(parsed.is_ok(), "answered {status} to {parsed:?}");
            for name in [LIMIT, REMAINING, RESET] {
                let v = answer_headers
                    .get(name)
                    .map(|v| v.to_str().ok().and_then(|s| s.parse::<u64>().ok()));
                assert_ne!(v, Some(None), "{name} is not a number");
            }
        }
        StatusCode::BAD_REQUEST => {
            assert!(!text.trim().is_empty(), "400 without a reason");
            if let Err(e) = parsed {
                assert_eq!(text, format!("{e}\n"));
            }
        }
        StatusCode::INTERNAL_SERVER_ERROR => assert!(!text.trim().is_empty()),
        other => panic!("/forward-auth answered {other}: {text}"),
    }
}

/// One cargo-fuzz input (`fuzz/fuzz_targets/nginx.rs`): lines, each one header value whose
/// first byte names the header, modulo 3 (so `0` X-Sluice-Domain, `1` X-Sluice-Descriptor, `2`
/// X-Sluice-Hits-Addend; no header value holds a newline, so none is lost). A line starting
/// with `?` makes the input a `/forward-auth` call instead: that line is its query string (the
/// last such line wins), the others the client's headers.
pub fn check_fuzz_input(data: &[u8]) {
    let mut query = None;
    let mut values = Vec::new();
    for line in data.split(|b| *b == b'\n') {
        match line.split_first() {
            Some((b'?', q)) => query = Some(String::from_utf8_lossy(q).into_owned()),
            Some((first, value)) => {
                let name = [DOMAIN_HEADER, DESCRIPTOR_HEADER, HITS_ADDEND_HEADER];
                values.push((name[usize::from(first % 3)], value.to_vec()));
            }
            None => {}
        }
    }
    let headers = raw_headers(&values);
    match query {
        Some(query) => check_forward_auth(&query, &headers),
        None => check_endpoint(&headers),
    }
}

proptest! {
    #![proptest_config(proptest_config(512, "proptest-regressions/fuzz/nginx.txt"))]

    #[test]
    fn written_headers_parse_back(m in model()) {
        let h = headers(&m);
        let r = request_from_headers(&h, NGINX_MAX_BYTES).expect("parses");
        prop_assert_eq!(&r.domain, &m.domain);
        prop_assert_eq!(r.hits_addend, m.hits_addend.unwrap_or(0));
        prop_assert_eq!(r.descriptors, expected(&m));
        timed("nginx written", || check_endpoint(&h));
    }

    #[test]
    fn mutated_headers_parse_or_name_the_header(
        m in model(),
        edits in proptest::collection::vec(mutations(4), 3),
    ) {
        let h = headers(&m);
        let mut values = Vec::new();
        for (name, edits) in [DOMAIN_HEADER, DESCRIPTOR_HEADER, HITS_ADDEND_HEADER].iter().zip(&edits) {
            for v in h.get_all(*name) {
                let mut bytes = v.as_bytes().to_vec();
                apply(&mut bytes, edits, TOKENS);
                values.push((*name, bytes));
            }
        }
        let mut mutated = raw_headers(&values);
        for (name, v) in &h {
            if !name.as_str().starts_with("x-sluice-") {
                mutated.append(name.clone(), v.clone());
            }
        }
        timed("nginx mutated", || check_endpoint(&mutated));
    }

    /// Raw header values (and now and then a raw query string) as the cargo-fuzz target
    /// reads them.
    #[test]
    fn raw_headers_parse_or_name_the_header(
        domain in proptest::option::of(raw_bytes(64)),
        descriptors in proptest::collection::vec(raw_bytes(256), 0..3),
        hits in proptest::option::of(raw_bytes(16)),
        query in proptest::option::weighted(0.25, raw_bytes(256)),
    ) {
        let line = |first: u8, value: Vec<u8>| [vec![first], value].concat();
        let mut lines = Vec::new();
        lines.extend(domain.map(|d| line(b'0', d)));
        lines.extend(descriptors.into_iter().map(|d| line(b'1', d)));
        lines.extend(hits.map(|n| line(b'2', n)));
        lines.extend(query.map(|q| line(b'?', q)));
        let input = lines.join(&b'\n');
        timed("nginx raw", || check_fuzz_input(&input));
    }

    #[test]
    fn written_queries_parse_back_and_client_headers_change_nothing(m in model()) {
        let (q, client) = query(&m);
        let (r, deny) = forward_auth_request(Some(&q), &client, NGINX_MAX_BYTES).expect("parses");
        prop_assert_eq!(deny.as_u16(), 429);
        prop_assert_eq!(&r.domain, &m.domain);
        prop_assert_eq!(r.hits_addend, m.hits_addend.unwrap_or(0));
        prop_assert_eq!(r.descriptors, expected(&m));
        timed("forward-auth written", || check_forward_auth(&q, &client));
    }

    #[test]
    fn mutated_queries_parse_or_name_the_field(
        m in model(),
        edits in mutations(6),
    ) {
        let (q, client) = query(&m);
        let mut bytes = q.into_bytes();
        apply(&mut bytes, &edits, TOKENS);
        // A query string reaches the endpoint as text.
        let q = String::from_utf8_lossy(&bytes).into_owned();
        timed("forward-auth mutated", || check_forward_auth(&q, &client));
    }
}
