//! The header format and the answers, without a network: headers are decoded directly and
//! [`check`] is called on a service with a manual clock.

use std::sync::Arc;

use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::config::{ConfigHandle, LoadOptions, parse_files};
use crate::service::ServiceOptions;
use crate::store::MemoryStore;

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
"#;

/// SLUICE_MAX_REQUEST_BYTES' default.
const MAX_BYTES: usize = 64 * 1024;

fn service() -> RateLimitService<MemoryStore> {
    service_with(ServiceOptions::default())
}

fn service_with(options: ServiceOptions) -> RateLimitService<MemoryStore> {
    let cfg = parse_files(
        &[("edge.yaml".to_string(), CONFIG.to_string())],
        &LoadOptions::default(),
    )
    .expect("test config loads");
    // 2 s into a minute: minute windows reset in 58 s.
    let clock = ManualClock::new(Timestamp::from_secs(2222));
    RateLimitService::new(
        ConfigHandle::new(Some(cfg)),
        Arc::new(MemoryStore::new(1000)),
        Arc::new(clock),
        options,
    )
}

fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        h.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    h
}

fn entries(r: &Request) -> Vec<Vec<(&str, &str)>> {
    r.entry_pairs()
}

fn parse(pairs: &[(&str, &[u8])]) -> Result<Request, HeaderError> {
    request_from_headers(&headers(pairs), MAX_BYTES)
}

#[test]
fn entries_are_percent_decoded_and_split_on_ampersands() {
    let r = parse(&[
        ("X-Sluice-Domain", b"edge"),
        (
            "X-Sluice-Descriptor",
            b"path=%2Fa%3Fb%3D1%26c%2C2 & remote_address=10.0.0.1&k%3Dy=%40at+plus%25",
        ),
    ])
    .unwrap();
    assert_eq!(r.domain, "edge");
    assert_eq!(r.hits_addend, 0);
    assert_eq!(
        entries(&r),
        vec![vec![
            ("path", "/a?b=1&c,2"),
            ("remote_address", "10.0.0.1"),
            ("k=y", "@at+plus%"),
        ]]
    );
    // Values may hold '=': only the first one splits.
    let r = parse(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"q=a=b"),
    ])
    .unwrap();
    assert_eq!(entries(&r), vec![vec![("q", "a=b")]]);
}

#[test]
fn commas_and_repeated_headers_both_separate_descriptors() {
    let joined = parse(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"a=1, b=2&c=3,,"),
    ])
    .unwrap();
    let repeated = parse(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"a=1"),
        ("x-sluice-descriptor", b"b=2&c=3"),
    ])
    .unwrap();
    assert_eq!(
        entries(&joined),
        vec![vec![("a", "1")], vec![("b", "2"), ("c", "3")]]
    );
    assert_eq!(joined, repeated);
}

#[test]
fn at_values_copy_a_header_raw_and_an_absent_header_drops_the_descriptor() {
    let r = parse(&[
        ("X-Sluice-Domain", b"edge"),
        (
            "X-Sluice-Descriptor",
            b"remote_address=10.0.0.1, api_key=@X-Api-Key, user=@x-user",
        ),
        ("x-api-key", b"k&1,%zz=\xff"),
    ])
    .unwrap();
    assert_eq!(
        entries(&r),
        vec![
            vec![("remote_address", "10.0.0.1")],
            vec![("api_key", "k&1,%zz=\u{fffd}")],
        ]
    );
    // Repeated header lines are joined with commas, as HTTP defines.
    let r = parse(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"k=@x-a"),
        ("x-a", b"1"),
        ("x-a", b"2"),
    ])
    .unwrap();
    assert_eq!(entries(&r), vec![vec![("k", "1,2")]]);
}

#[test]
fn the_hits_addend_is_read_and_checked() {
    let base: [(&str, &[u8]); 2] = [
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"a=1"),
    ];
    let with = |v: &'static [u8]| {
        let mut p = base.to_vec();
        p.push(("X-Sluice-Hits-Addend", v));
        parse(&p)
    };
    assert_eq!(with(b" 5 ").unwrap().hits_addend, 5);
    assert_eq!(with(b"").unwrap().hits_addend, 0);
    assert_eq!(
        with(b"-1").unwrap_err(),
        HeaderError::BadHitsAddend {
            form: Form::Headers,
            text: "-1".into()
        }
    );
    assert_eq!(
        with(b"4294967296").unwrap_err(),
        HeaderError::BadHitsAddend {
            form: Form::Headers,
            text: "4294967296".into()
        }
    );
}

#[test]
fn malformed_headers_are_named_errors() {
    let d = |v: &'static [u8]| parse(&[("X-Sluice-Domain", b"edge"), ("X-Sluice-Descriptor", v)]);
    assert_eq!(
        parse(&[("X-Sluice-Descriptor", b"a=1")]),
        Err(HeaderError::MissingDomain(Form::Headers))
    );
    assert_eq!(
        parse(&[("X-Sluice-Domain", b" "), ("X-Sluice-Descriptor", b"a=1")]),
        Err(HeaderError::MissingDomain(Form::Headers))
    );
    assert_eq!(
        parse(&[
            ("X-Sluice-Domain", b"a"),
            ("X-Sluice-Domain", b"b"),
            ("X-Sluice-Descriptor", b"a=1")
        ]),
        Err(HeaderError::SeveralDomains(Form::Headers))
    );
    assert_eq!(
        parse(&[("X-Sluice-Domain", b"edge")]),
        Err(HeaderError::MissingDescriptor(Form::Headers))
    );
    assert_eq!(
        d(b" , "),
        Err(HeaderError::MissingDescriptor(Form::Headers))
    );
    assert_eq!(
        d(b"a=1&&b=2"),
        Err(HeaderError::EmptyEntry {
            form: Form::Headers,
            index: 0
        })
    );
    assert_eq!(
        d(b"a=1, b"),
        Err(HeaderError::NoEquals {
            form: Form::Headers,
            index: 1,
            entry: "b".into()
        })
    );
    assert_eq!(
        d(b"=v"),
        Err(HeaderError::EmptyKey {
            form: Form::Headers,
            index: 0,
            entry: "=v".into()
        })
    );
    assert_eq!(
        d(b"a=@bad header"),
        Err(HeaderError::BadHeaderName {
            form: Form::Headers,
            index: 0,
            header: "bad header".into()
        })
    );
    for bad in [&b"a=%"[..], b"a=%4", b"a=%zz", b"a=%ff", b"a=%+1", b"%zz=1"] {
        assert!(
            matches!(d(bad), Err(HeaderError::BadEncoding { .. })),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    // The reason names the header, for the 400 body.
    assert_eq!(
        d(b"a=%zz").unwrap_err().to_string(),
        "X-Sluice-Descriptor: \"a=%zz\" is not valid percent-encoded UTF-8"
    );
}

fn header<'a>(r: &'a Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

async fn body(r: Response) -> String {
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn allowed_is_200_and_over_is_403_with_retry_after() {
    let service = service();
    let h = headers(&[
        ("X-Sluice-Domain", b"edge"),
        (
            "X-Sluice-Descriptor",
            b"remote_address=10.0.0.1, api_key=@x-api-key",
        ),
        ("x-api-key", b"k1"),
    ]);
    for remaining in ["1", "0"] {
        let r = check(&service, &h, MAX_BYTES).await;
        assert_eq!(r.status(), StatusCode::OK);
        // The API key's limit (2) is the most restrictive.
        assert_eq!(header(&r, "RateLimit-Limit"), Some("2"));
        assert_eq!(header(&r, "RateLimit-Remaining"), Some(remaining));
        assert_eq!(header(&r, "RateLimit-Reset"), Some("58"));
        assert_eq!(header(&r, "Retry-After"), None);
    }
    let r = check(&service, &h, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(header(&r, "RateLimit-Limit"), Some("2"));
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("0"));
    assert_eq!(header(&r, "RateLimit-Reset"), Some("58"));
    assert_eq!(header(&r, "Retry-After"), Some("58"));
    assert_eq!(body(r).await, "OVER_LIMIT\n");

    // Another key is counted apart; the address has had 4 of its 10.
    let other = headers(&[
        ("X-Sluice-Domain", b"edge"),
        (
            "X-Sluice-Descriptor",
            b"remote_address=10.0.0.1, api_key=@x-api-key",
        ),
        ("x-api-key", b"k2"),
    ]);
    let r = check(&service, &other, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("1"));

    // Without the key only the address counts.
    let no_key = headers(&[
        ("X-Sluice-Domain", b"edge"),
        (
            "X-Sluice-Descriptor",
            b"remote_address=10.0.0.1, api_key=@x-api-key",
        ),
    ]);
    let r = check(&service, &no_key, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "RateLimit-Limit"), Some("10"));
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("5"));
}

#[tokio::test]
async fn unmatched_descriptors_and_absent_headers_are_allowed_without_headers() {
    let service = service();
    for h in [
        headers(&[
            ("X-Sluice-Domain", b"edge"),
            ("X-Sluice-Descriptor", b"nope=1"),
        ]),
        headers(&[
            ("X-Sluice-Domain", b"other"),
            ("X-Sluice-Descriptor", b"a=1"),
        ]),
        headers(&[
            ("X-Sluice-Domain", b"edge"),
            ("X-Sluice-Descriptor", b"api_key=@x-absent"),
        ]),
    ] {
        let r = check(&service, &h, MAX_BYTES).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "RateLimit-Limit"), None);
    }
}

#[tokio::test]
async fn the_hits_addend_is_charged() {
    let service = service();
    let h = headers(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"remote_address=10.0.0.9"),
        ("X-Sluice-Hits-Addend", b"7"),
    ]);
    let r = check(&service, &h, MAX_BYTES).await;
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("3"));
    assert_eq!(
        check(&service, &h, MAX_BYTES).await.status(),
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn bad_headers_are_400_and_service_errors_500_with_a_reason() {
    let service = service();
    let r = check(
        &service,
        &headers(&[("X-Sluice-Descriptor", b"a=1")]),
        MAX_BYTES,
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(body(r).await, "missing X-Sluice-Domain header\n");

    // Beyond the descriptor cap: the config's mistake, 400.
    let many = vec!["a=1"; 65].join(",");
    let h = headers(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", many.as_bytes()),
    ]);
    assert_eq!(
        check(&service, &h, MAX_BYTES).await.status(),
        StatusCode::BAD_REQUEST
    );

    // No config loaded: Sluice cannot decide, 500.
    let unloaded = RateLimitService::new(
        ConfigHandle::new(None),
        Arc::new(MemoryStore::new(10)),
        Arc::new(ManualClock::new(Timestamp::from_secs(0))),
        ServiceOptions::default(),
    );
    let h = headers(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"a=1"),
    ]);
    let r = check(&unloaded, &h, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body(r).await, "no rate limit configuration loaded\n");
}

#[tokio::test]
async fn a_zero_limit_is_always_403() {
    let service = service();
    let h = headers(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"zero=x"),
    ]);
    let r = check(&service, &h, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(header(&r, "RateLimit-Limit"), Some("0"));
    assert_eq!(header(&r, "Retry-After"), Some("58"));
}

#[test]
fn sluice_headers_are_measured_before_they_are_parsed() {
    // Malformed as well as too large: refused for its size, so nothing was parsed.
    let big = format!("remote_address=%zz{}", "a".repeat(MAX_BYTES));
    let e = parse(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", big.as_bytes()),
    ]);
    assert_eq!(
        e,
        Err(HeaderError::TooLarge {
            form: Form::Headers,
            max: MAX_BYTES
        })
    );
    // The cap is on the total: every Sluice header counts, to the byte.
    let value = |n: usize| format!("remote_address={}", "a".repeat(n - 15 - 4 - 1));
    let fits = value(MAX_BYTES);
    let with = |d: &[u8]| {
        parse(&[
            ("X-Sluice-Domain", b"edge"),
            ("X-Sluice-Descriptor", d),
            ("X-Sluice-Hits-Addend", b"1"),
        ])
    };
    assert!(with(fits.as_bytes()).is_ok());
    let over = value(MAX_BYTES + 1);
    assert_eq!(
        with(over.as_bytes()),
        Err(HeaderError::TooLarge {
            form: Form::Headers,
            max: MAX_BYTES
        })
    );
}

#[test]
fn client_headers_count_once_per_copy() {
    let client = vec![b'k'; MAX_BYTES / 2];
    let once = parse(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"api_key=@x-api-key"),
        ("x-api-key", &client),
    ]);
    assert!(once.is_ok());
    // Named twice, it is copied twice: over the cap, refused before the second copy.
    let twice = parse(&[
        ("X-Sluice-Domain", b"edge"),
        (
            "X-Sluice-Descriptor",
            b"api_key=@x-api-key&again=@x-api-key",
        ),
        ("x-api-key", &client),
    ]);
    assert_eq!(
        twice,
        Err(HeaderError::TooLarge {
            form: Form::Headers,
            max: MAX_BYTES
        })
    );
    // Repeated lines of the named header all count.
    let repeated = parse(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"api_key=@x-api-key"),
        ("x-api-key", &client),
        ("x-api-key", &client),
    ]);
    assert_eq!(
        repeated,
        Err(HeaderError::TooLarge {
            form: Form::Headers,
            max: MAX_BYTES
        })
    );
}

#[tokio::test]
async fn oversized_headers_and_keys_are_400_naming_the_setting_and_count_nothing() {
    let service = service();
    // The finding: a 300 KB value was accepted and became a 300 KB counter.
    let huge = format!("remote_address={}", "v".repeat(300 * 1024));
    let h = headers(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", huge.as_bytes()),
    ]);
    let r = check(&service, &h, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(body(r).await.contains("SLUICE_MAX_REQUEST_BYTES"));
    // Under the request cap but over SLUICE_MAX_KEY_BYTES (4096): the service refuses the key.
    let long = format!("remote_address={}", "v".repeat(5000));
    let h = headers(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", long.as_bytes()),
    ]);
    let r = check(&service, &h, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let text = body(r).await;
    assert!(text.contains("SLUICE_MAX_KEY_BYTES"), "{text}");
    assert_eq!(service.store().live_counters(), 0);
}

fn query(q: &str, pairs: &[(&str, &[u8])]) -> Result<(Request, StatusCode), HeaderError> {
    forward_auth_request(Some(q), &headers(pairs), MAX_BYTES)
}

#[test]
fn the_query_string_carries_the_request_and_the_headers_are_then_ignored() {
    let (r, deny) = query(
        "domain=edge&descriptor=api_key=@X-Api-Key&descriptor=route=api%26method=GET,k=%2525",
        &[
            ("x-api-key", b"key-1"),
            // A client's own X-Sluice-* headers, passed on by the proxy: ignored.
            ("X-Sluice-Domain", b"other"),
            ("X-Sluice-Descriptor", b"free=1"),
            ("X-Sluice-Hits-Addend", b"1000"),
        ],
    )
    .unwrap();
    assert_eq!(deny, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.domain, "edge");
    assert_eq!(r.hits_addend, 0);
    assert_eq!(
        entries(&r),
        vec![
            vec![("api_key", "key-1")],
            vec![("route", "api"), ("method", "GET")],
            vec![("k", "%")],
        ]
    );
    let (r, deny) = query(
        "domain=edge&descriptor=a=1&hits_addend=3&deny_status=403",
        &[],
    )
    .unwrap();
    assert_eq!((r.hits_addend, deny), (3, StatusCode::FORBIDDEN));
}

#[test]
fn without_a_domain_in_the_query_the_headers_carry_the_request() {
    let pairs: [(&str, &[u8]); 2] = [
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"a=1"),
    ];
    let (r, deny) = forward_auth_request(None, &headers(&pairs), MAX_BYTES).unwrap();
    assert_eq!(
        (r.domain.as_str(), deny),
        ("edge", StatusCode::TOO_MANY_REQUESTS)
    );
    let (r, deny) = query("deny_status=503", &pairs).unwrap();
    assert_eq!(
        (entries(&r), deny),
        (vec![vec![("a", "1")]], StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(
        query("", &[]),
        Err(HeaderError::MissingDomain(Form::Headers))
    );
}

#[test]
fn malformed_query_strings_are_named_errors() {
    let e = |q: &str| query(q, &[]).unwrap_err().to_string();
    assert_eq!(
        e("domain=edge&descriptors=a=1"),
        "unknown query parameter \"descriptors\" (domain, descriptor, hits_addend, negative_hits and deny_status are known)"
    );
    assert!(e("descriptor=a=1").starts_with("query parameter descriptor without domain"));
    assert!(e("hits_addend=2").starts_with("query parameter hits_addend without domain"));
    assert_eq!(e("domain=edge"), "missing query parameter descriptor");
    assert_eq!(
        e("domain=&descriptor=a=1"),
        "missing query parameter domain"
    );
    assert_eq!(
        e("domain=a&domain=b&descriptor=a=1"),
        "more than one query parameter domain"
    );
    assert_eq!(
        e("domain=edge&descriptor=a"),
        "query parameter descriptor: descriptor 0: entry \"a\" is not key=value"
    );
    assert_eq!(
        e("domain=edge&descriptor=a=%zz"),
        "query parameter descriptor: \"a=%zz\" is not valid percent-encoded UTF-8"
    );
    // Decoded once by the query, the value is the header syntax, decoded again.
    assert_eq!(
        e("domain=edge&descriptor=a=%25zz"),
        "query parameter descriptor: \"a=%zz\" is not valid percent-encoded UTF-8"
    );
    assert_eq!(
        e("domain=edge&descriptor=a=1&hits_addend=x"),
        "query parameter hits_addend: \"x\" is not a number from 0 to 4294967295"
    );
    for bad in ["200", "600", "x", ""] {
        assert_eq!(
            e(&format!("domain=edge&descriptor=a=1&deny_status={bad}")),
            format!("query parameter deny_status: {bad:?} is not a status from 400 to 599")
        );
    }
    assert_eq!(
        e("deny_status=429&deny_status=403"),
        "more than one query parameter deny_status"
    );
    assert_eq!(
        e("domain=edge&descriptor=a=@x-a:middle"),
        "query parameter descriptor: descriptor 0: \"x-a:middle\" is not a header name, optionally followed by :first or :last"
    );
}

#[test]
fn the_first_or_last_hop_of_a_header_can_be_taken() {
    let pairs: [(&str, &[u8]); 3] = [
        ("X-Forwarded-For", b" 203.0.113.9 , 10.0.0.1"),
        ("x-forwarded-for", b"10.0.0.2, 192.0.2.7 "),
        ("x-one", b"solo"),
    ];
    let (r, _) = query(
        "domain=edge&descriptor=first=@X-Forwarded-For:first,last=@x-forwarded-for:last,whole=@x-forwarded-for,one=@x-one:last",
        &pairs,
    )
    .unwrap();
    assert_eq!(
        entries(&r),
        vec![
            vec![("first", "203.0.113.9")],
            vec![("last", "192.0.2.7")],
            vec![("whole", " 203.0.113.9 , 10.0.0.1,10.0.0.2, 192.0.2.7 ")],
            vec![("one", "solo")],
        ]
    );
    // Absent, the descriptor is left out, whatever the part.
    let (r, _) = query("domain=edge&descriptor=a=@x-none:first", &pairs).unwrap();
    assert!(r.descriptors.is_empty());
}

#[test]
fn the_query_string_counts_against_the_byte_cap() {
    let long = format!("domain=edge&descriptor=a={}", "v".repeat(MAX_BYTES));
    assert_eq!(
        query(&long, &[]),
        Err(HeaderError::TooLarge {
            form: Form::Query,
            max: MAX_BYTES
        })
    );
    // The query's bytes and the header copies share the cap.
    let q = "domain=edge&descriptor=a=@x-a";
    let client = vec![b'k'; MAX_BYTES - q.len()];
    assert!(query(q, &[("x-a", &client)]).is_ok());
    let client = vec![b'k'; MAX_BYTES - q.len() + 1];
    assert_eq!(
        query(q, &[("x-a", &client)]),
        Err(HeaderError::TooLarge {
            form: Form::Query,
            max: MAX_BYTES
        })
    );
}

#[tokio::test]
async fn forward_auth_refuses_with_429_or_the_asked_status() {
    let service = service();
    let q = Some("domain=edge&descriptor=api_key=@x-api-key");
    let h = headers(&[("x-api-key", b"k1")]);
    for remaining in ["1", "0"] {
        let r = forward_auth(&service, q, &h, MAX_BYTES).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "RateLimit-Remaining"), Some(remaining));
    }
    let r = forward_auth(&service, q, &h, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "RateLimit-Limit"), Some("2"));
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("0"));
    assert_eq!(header(&r, "Retry-After"), Some("58"));
    assert_eq!(body(r).await, "OVER_LIMIT\n");
    let q = Some("domain=edge&descriptor=api_key=@x-api-key&deny_status=403");
    let r = forward_auth(&service, q, &h, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Another key is counted apart.
    let other = headers(&[("x-api-key", b"k2")]);
    let r = forward_auth(&service, q, &other, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = forward_auth(&service, Some("domain=edge&descriptor=a"), &h, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

/// LIMIT_REQUEST_HEADERS_ENABLED: an allowed answer also carries the numbers under the
/// upstream's names, for the proxy to copy onto the request it sends on; a refusal does not
/// (the proxy hands it to the client), nor does an answer with no limit. Under the fixed
/// names (the defaults), nothing is sent twice.
#[tokio::test]
async fn upstream_headers_ride_on_allowed_answers_only() {
    use crate::service::HeaderNames;
    let names = HeaderNames {
        limit: "X-Quota-Limit".into(),
        remaining: "X-Quota-Remaining".into(),
        reset: "X-Quota-Reset".into(),
    };
    let service = service_with(ServiceOptions {
        request_headers: Some(names),
        ..Default::default()
    });
    let h = headers(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"api_key=k1"),
    ]);
    for remaining in ["1", "0"] {
        let r = check(&service, &h, MAX_BYTES).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "X-Quota-Limit"), Some("2"));
        assert_eq!(header(&r, "X-Quota-Remaining"), Some(remaining));
        assert_eq!(header(&r, "X-Quota-Reset"), Some("58"));
        assert_eq!(header(&r, "RateLimit-Remaining"), Some(remaining));
    }
    let r = check(&service, &h, MAX_BYTES).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("0"));
    assert_eq!(header(&r, "X-Quota-Remaining"), None);
    let r = forward_auth(
        &service,
        Some("domain=edge&descriptor=api_key=k1"),
        &HeaderMap::new(),
        MAX_BYTES,
    )
    .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "X-Quota-Limit"), None);
    let r = forward_auth(
        &service,
        Some("domain=edge&descriptor=api_key=k2"),
        &HeaderMap::new(),
        MAX_BYTES,
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "X-Quota-Remaining"), Some("1"));
    let r = forward_auth(
        &service,
        Some("domain=edge&descriptor=nope=1"),
        &HeaderMap::new(),
        MAX_BYTES,
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "X-Quota-Limit"), None);

    let same_names = service_with(ServiceOptions {
        request_headers: Some(HeaderNames::default()),
        ..Default::default()
    });
    let r = check(&same_names, &h, MAX_BYTES).await;
    for name in ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"] {
        assert_eq!(r.headers().get_all(name).iter().count(), 1, "{name}");
    }
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("1"));
}

/// A refund on `/nginx` (`X-Sluice-Negative-Hits`) and `/forward-auth` (`negative_hits`): every
/// descriptor's hits come off, and the answer is 200. A client's own header is ignored when the
/// query string carries the request.
#[tokio::test]
async fn a_refund_takes_hits_off_on_both_endpoints_and_is_200() {
    let service = service();
    let check_of = |negative: &'static [u8]| {
        headers(&[
            ("X-Sluice-Domain", b"edge"),
            ("X-Sluice-Descriptor", b"api_key=k1"),
            ("X-Sluice-Negative-Hits", negative),
        ])
    };
    // 2 per minute: two pass, the third is refused (and counted, a fixed window).
    for status in [StatusCode::OK, StatusCode::OK, StatusCode::FORBIDDEN] {
        assert_eq!(
            check(&service, &check_of(b""), MAX_BYTES).await.status(),
            status
        );
    }
    // The refused one's refund and an admitted one's: 3 - 2 = 1, one place.
    for left in ["0", "1"] {
        let r = check(&service, &check_of(b"true"), MAX_BYTES).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "RateLimit-Remaining"), Some(left));
        assert_eq!(header(&r, "Retry-After"), None);
    }
    assert_eq!(
        check(&service, &check_of(b"0"), MAX_BYTES).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        check(&service, &check_of(b"false"), MAX_BYTES)
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    // The same counter through /forward-auth's query string: 3 counted, 2 refunds leave 1.
    let refund = Some("domain=edge&descriptor=api_key=k1&negative_hits=1");
    for _ in 0..2 {
        let r = forward_auth(&service, refund, &HeaderMap::new(), MAX_BYTES).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    // A client's X-Sluice-Negative-Hits beside a query string is ignored: this is a charge.
    let charge = Some("domain=edge&descriptor=api_key=k1");
    let client = headers(&[("X-Sluice-Negative-Hits", b"true")]);
    let r = forward_auth(&service, charge, &client, MAX_BYTES).await;
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("0"));
    assert_eq!(
        forward_auth(&service, charge, &client, MAX_BYTES)
            .await
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[test]
fn the_refund_field_is_read_and_checked() {
    let r = query("domain=edge&descriptor=a=1,b=2&negative_hits=TRUE", &[])
        .unwrap()
        .0;
    assert!(r.descriptors.iter().all(|d| d.negative_hits));
    let r = query("domain=edge&descriptor=a=1&negative_hits=", &[])
        .unwrap()
        .0;
    assert!(!r.descriptors[0].negative_hits);
    let e = |q: &str| query(q, &[]).unwrap_err().to_string();
    assert_eq!(
        e("domain=edge&descriptor=a=1&negative_hits=yes"),
        "query parameter negative_hits: \"yes\" is not true, false, 1, 0 or empty"
    );
    assert_eq!(
        e("domain=edge&descriptor=a=1&negative_hits=1&negative_hits=1"),
        "more than one query parameter negative_hits"
    );
    assert_eq!(
        e("negative_hits=1"),
        "query parameter negative_hits without domain: give the domain in the query string too, or every field in X-Sluice-* headers"
    );
    let e = parse(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"a=1"),
        ("X-Sluice-Negative-Hits", b"2"),
    ])
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "X-Sluice-Negative-Hits: \"2\" is not true, false, 1, 0 or empty"
    );
}
