//! The headers for the upstream (LIMIT_REQUEST_HEADERS_ENABLED, envoyproxy/ratelimit's PR #1168)
//! and every descriptor's headers (LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED, its open PR #1190),
//! under, near and over the limit, in shadow mode, with several descriptors, and off. The clock
//! is 2 s into a minute: minute windows reset in 58 s, hour windows in 1378 s.

use super::*;

type Pairs = Vec<(String, u64)>;

fn quota_names() -> HeaderNames {
    HeaderNames {
        limit: "X-Quota-Limit".into(),
        remaining: "X-Quota-Remaining".into(),
        reset: "X-Quota-Reset".into(),
    }
}

/// Both kinds on, the upstream's under names of its own, as PR #1168's tests have them.
fn both() -> Harness {
    harness_with(ServiceOptions {
        response_headers: Some(HeaderNames::default()),
        request_headers: Some(quota_names()),
        ..Default::default()
    })
}

fn owned<'a>(pairs: impl IntoIterator<Item = (&'a str, u64)>) -> Pairs {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

fn upstream(r: &Response) -> Option<Pairs> {
    r.request_headers.as_ref().map(|h| owned(h.pairs()))
}

fn client(r: &Response) -> Option<Pairs> {
    r.response_headers.as_ref().map(|h| owned(h.pairs()))
}

fn quota(limit: u64, remaining: u64, reset: u64) -> Option<Pairs> {
    Some(owned([
        ("X-Quota-Limit", limit),
        ("X-Quota-Remaining", remaining),
        ("X-Quota-Reset", reset),
    ]))
}

fn rate_limit(limit: u64, remaining: u64, reset: u64) -> Option<Pairs> {
    Some(owned([
        ("RateLimit-Limit", limit),
        ("RateLimit-Remaining", remaining),
        ("RateLimit-Reset", reset),
    ]))
}

fn several(entries: &[(&str, &str)]) -> Request {
    req("test", entries.iter().map(|e| desc(&[*e])).collect())
}

#[tokio::test]
async fn request_headers_carry_the_response_headers_values_under_their_own_names() {
    let h = both();
    // Under the limit (10 a minute).
    let r = h.one(&[("ten", "a")]).await;
    assert_eq!(upstream(&r), quota(10, 9, 58));
    assert_eq!(client(&r), rate_limit(10, 9, 58));
    // Near it.
    for _ in 0..7 {
        h.one(&[("ten", "a")]).await;
    }
    let r = h.one(&[("ten", "a")]).await;
    assert_eq!((r.overall_code, upstream(&r)), (Code::Ok, quota(10, 1, 58)));
    let r = h.one(&[("ten", "a")]).await;
    assert_eq!((r.overall_code, upstream(&r)), (Code::Ok, quota(10, 0, 58)));
    // Over it: filled as in Go (Envoy adds them to nothing, since it refuses the request).
    let r = h.one(&[("ten", "a")]).await;
    assert_eq!(
        (r.overall_code, upstream(&r)),
        (Code::OverLimit, quota(10, 0, 58))
    );
    assert_eq!(client(&r), rate_limit(10, 0, 58));
}

#[tokio::test]
async fn several_descriptors_are_described_by_the_one_the_go_service_chooses() {
    let h = both();
    // The least remaining: 9 of 10 an hour beats 49 of 50 a second.
    let r = h.call(several(&[("key1", "s"), ("key3", "s")])).await;
    assert_eq!(upstream(&r), quota(10, 9, 1378));
    assert_eq!(client(&r), rate_limit(10, 9, 1378));
    // Unmatched and unlimited descriptors have no limit to describe.
    let r = h
        .call(several(&[("nope", "x"), ("free", "x"), ("key2", "s")]))
        .await;
    assert_eq!(upstream(&r), quota(20, 19, 58));
    // Two over: the last non-quota one, whichever limit is smaller.
    for _ in 0..10 {
        h.one(&[("ten", "over")]).await;
    }
    let r = h.call(several(&[("zero", "z"), ("ten", "over")])).await;
    assert_eq!(upstream(&r), quota(10, 0, 58));
    let r = h.call(several(&[("ten", "over"), ("zero", "z")])).await;
    assert_eq!(upstream(&r), quota(0, 0, 58));
    // Nothing with a limit: no headers at all.
    for r in [
        h.one(&[("nope", "x")]).await,
        h.one(&[("free", "x")]).await,
        h.call(req("elsewhere", vec![desc(&[("ten", "a")])])).await,
    ] {
        assert_eq!((upstream(&r), client(&r)), (None, None), "{r:?}");
    }
}

#[tokio::test]
async fn request_and_response_headers_are_turned_on_apart() {
    let only_request = harness_with(ServiceOptions {
        request_headers: Some(HeaderNames::default()),
        ..Default::default()
    });
    let r = only_request.one(&[("ten", "a")]).await;
    assert_eq!(upstream(&r), Some(rate_limit(10, 9, 58).unwrap()));
    assert_eq!(client(&r), None);
    // `rate_limit` (what `/nginx` and HAProxy's agent send) is there whatever is on.
    assert!(r.rate_limit.is_some());
    let only_response = harness_with(ServiceOptions {
        response_headers: Some(HeaderNames::default()),
        ..Default::default()
    });
    let r = only_response.one(&[("ten", "a")]).await;
    assert_eq!((upstream(&r), client(&r)), (None, rate_limit(10, 9, 58)));
    let r = harness().one(&[("ten", "a")]).await;
    assert_eq!((upstream(&r), client(&r)), (None, None));
}

/// The reason PR #1168 was asked for: in shadow mode an over-limit request reaches the upstream,
/// which can tell from `remaining: 0`.
#[tokio::test]
async fn in_shadow_mode_the_upstream_sees_the_request_is_over() {
    let global = harness_with(ServiceOptions {
        shadow_mode: true,
        request_headers: Some(quota_names()),
        ..Default::default()
    });
    for _ in 0..10 {
        global.one(&[("ten", "s")]).await;
    }
    let r = global.one(&[("ten", "s")]).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].code),
        (Code::Ok, Code::OverLimit)
    );
    assert_eq!(upstream(&r), quota(10, 0, 58));
    // A rule's own shadow_mode (3 a minute): OK, remaining 0 from the 3rd call on.
    let h = both();
    for _ in 0..3 {
        h.one(&[("shady", "s")]).await;
    }
    let r = h.one(&[("shady", "s")]).await;
    assert_eq!(r.overall_code, Code::Ok);
    assert_eq!(upstream(&r), quota(3, 0, 58));
}

fn per_unit(pairs: &[(&str, u64)]) -> Option<Pairs> {
    Some(owned(pairs.iter().copied()))
}

#[tokio::test]
async fn all_descriptors_headers_name_every_limit_by_its_unit() {
    let h = harness_with(ServiceOptions {
        all_descriptors_headers: true,
        request_headers: Some(quota_names()),
        ..Default::default()
    });
    // PR #1190's first case: a second and a minute limit, both under.
    let r = h.call(several(&[("key1", "a"), ("key2", "a")])).await;
    assert_eq!(
        client(&r),
        per_unit(&[
            ("ratelimit-limit-seconds", 50),
            ("ratelimit-remaining-seconds", 49),
            ("ratelimit-limit-minutes", 20),
            ("ratelimit-remaining-minutes", 19),
        ])
    );
    // The upstream's headers still describe one descriptor: #1190 changes the response's only.
    assert_eq!(upstream(&r), quota(20, 19, 58));
    // Over: every descriptor's numbers, the over one's remaining 0.
    let r = h.call(several(&[("zero", "a"), ("key1", "a")])).await;
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(
        client(&r),
        per_unit(&[
            ("ratelimit-limit-minutes", 0),
            ("ratelimit-remaining-minutes", 0),
            ("ratelimit-limit-seconds", 50),
            ("ratelimit-remaining-seconds", 48),
        ])
    );
    // Unmatched, unlimited and replaced descriptors are left out; nothing left, no headers.
    let r = h
        .call(several(&[
            ("nope", "x"),
            ("free", "x"),
            ("banned", "x"),
            ("unbanned", "x"),
            ("key3", "x"),
        ]))
        .await;
    assert_eq!(
        client(&r),
        per_unit(&[
            ("ratelimit-limit-minutes", 2),
            ("ratelimit-remaining-minutes", 1),
            ("ratelimit-limit-hours", 10),
            ("ratelimit-remaining-hours", 9),
        ])
    );
    assert_eq!(client(&h.one(&[("nope", "x")]).await), None);
    // Two limits of one unit send the same names twice, as the PR does.
    let r = h.call(several(&[("ten", "b"), ("key2", "b")])).await;
    assert_eq!(
        client(&r),
        per_unit(&[
            ("ratelimit-limit-minutes", 10),
            ("ratelimit-remaining-minutes", 9),
            ("ratelimit-limit-minutes", 20),
            ("ratelimit-remaining-minutes", 19),
        ])
    );
    // A `rate_limits` list reports its most restrictive block, once.
    let r = h.one(&[("multi", "m")]).await;
    assert_eq!(
        client(&r),
        per_unit(&[
            ("ratelimit-limit-seconds", 2),
            ("ratelimit-remaining-seconds", 1),
        ])
    );
}

#[tokio::test]
async fn all_descriptors_headers_replace_limit_response_headers() {
    let h = harness_with(ServiceOptions {
        all_descriptors_headers: true,
        response_headers: Some(HeaderNames::default()),
        ..Default::default()
    });
    let r = h.one(&[("key3", "x")]).await;
    assert_eq!(
        client(&r),
        per_unit(&[
            ("ratelimit-limit-hours", 10),
            ("ratelimit-remaining-hours", 9)
        ])
    );
    assert_eq!(upstream(&r), None);
}

#[test]
fn every_unit_has_its_plural_in_the_names() {
    let names: Vec<[String; 2]> = Unit::ALL
        .iter()
        .map(|&unit| {
            let headers = UnitHeaders {
                unit,
                limit: 1,
                remaining: 0,
            };
            let [(limit, _), (remaining, _)] = headers.pairs();
            [limit.to_owned(), remaining.to_owned()]
        })
        .collect();
    let plurals = [
        "seconds", "minutes", "hours", "days", "weeks", "months", "years",
    ];
    for (names, plural) in names.iter().zip(plurals) {
        assert_eq!(
            names,
            &[
                format!("ratelimit-limit-{plural}"),
                format!("ratelimit-remaining-{plural}")
            ]
        );
    }
}
