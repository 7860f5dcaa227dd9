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
        ServiceOptions::default(),
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
    r.descriptors
        .iter()
        .map(|d| {
            d.entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect()
        })
        .collect()
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
        HeaderError::BadHitsAddend("-1".into())
    );
    assert_eq!(
        with(b"4294967296").unwrap_err(),
        HeaderError::BadHitsAddend("4294967296".into())
    );
}

#[test]
fn malformed_headers_are_named_errors() {
    let d = |v: &'static [u8]| parse(&[("X-Sluice-Domain", b"edge"), ("X-Sluice-Descriptor", v)]);
    assert_eq!(
        parse(&[("X-Sluice-Descriptor", b"a=1")]),
        Err(HeaderError::MissingDomain)
    );
    assert_eq!(
        parse(&[("X-Sluice-Domain", b" "), ("X-Sluice-Descriptor", b"a=1")]),
        Err(HeaderError::MissingDomain)
    );
    assert_eq!(
        parse(&[
            ("X-Sluice-Domain", b"a"),
            ("X-Sluice-Domain", b"b"),
            ("X-Sluice-Descriptor", b"a=1")
        ]),
        Err(HeaderError::SeveralDomains)
    );
    assert_eq!(
        parse(&[("X-Sluice-Domain", b"edge")]),
        Err(HeaderError::MissingDescriptor)
    );
    assert_eq!(d(b" , "), Err(HeaderError::MissingDescriptor));
    assert_eq!(d(b"a=1&&b=2"), Err(HeaderError::EmptyEntry { index: 0 }));
    assert_eq!(
        d(b"a=1, b"),
        Err(HeaderError::NoEquals {
            index: 1,
            entry: "b".into()
        })
    );
    assert_eq!(
        d(b"=v"),
        Err(HeaderError::EmptyKey {
            index: 0,
            entry: "=v".into()
        })
    );
    assert_eq!(
        d(b"a=@bad header"),
        Err(HeaderError::BadHeaderName {
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
    assert_eq!(e, Err(HeaderError::TooLarge { max: MAX_BYTES }));
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
        Err(HeaderError::TooLarge { max: MAX_BYTES })
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
    assert_eq!(twice, Err(HeaderError::TooLarge { max: MAX_BYTES }));
    // Repeated lines of the named header all count.
    let repeated = parse(&[
        ("X-Sluice-Domain", b"edge"),
        ("X-Sluice-Descriptor", b"api_key=@x-api-key"),
        ("x-api-key", &client),
        ("x-api-key", &client),
    ]);
    assert_eq!(repeated, Err(HeaderError::TooLarge { max: MAX_BYTES }));
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
