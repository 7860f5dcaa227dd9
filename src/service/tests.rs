//! One test per behaviour of envoyproxy/ratelimit that a drop-in must match (the reference's
//! closing list), driven through the service with a manual clock and the memory store.

use std::sync::Arc;

use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::config::{ConfigHandle, LoadOptions, parse_files};
use crate::descriptor::{Descriptor, Entry, LimitOverride, Request};
use crate::store::{MemoryLimits, MemoryStore};

const CONFIG: &str = r#"
domain: test
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20, name: per_minute}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: ten
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: shady
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: banned
    rate_limit: {unit: minute, requests_per_unit: 0, name: banned}
  - key: unbanned
    rate_limit:
      unit: minute
      requests_per_unit: 2
      replaces: [{name: banned}]
  - key: files
    value: "files/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: tier
    value: gold
    metadata: {tier: {name: gold, level: 1}, owner: a}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: team
    metadata: {tier: {name: silver, extra: x}, owner: b}
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
  - key: lb
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: leaky_bucket, burst: 3}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 2, name: per_second}
      - {unit: minute, requests_per_unit: 5, name: per_minute, algorithm: sliding_window}
  - key: parent
    value: p
    descriptors:
      - key: child
        rate_limit: {unit: day, requests_per_unit: 20}
"#;

struct Harness {
    service: RateLimitService<MemoryStore>,
    clock: ManualClock,
    config: ConfigHandle,
}

/// The service over the memory store and one config file, `yaml` loaded with `load`, its
/// clock at `now_secs`: what every harness here starts from.
fn service_of(
    yaml: &str,
    load: &LoadOptions,
    now_secs: u64,
    options: ServiceOptions,
) -> (RateLimitService<MemoryStore>, ManualClock, ConfigHandle) {
    let cfg = parse_files(&[("test.yaml".to_string(), yaml.to_string())], load)
        .expect("the test config loads");
    let config = ConfigHandle::new(Some(cfg));
    let clock = ManualClock::new(Timestamp::from_secs(now_secs));
    let service = RateLimitService::new(
        config.clone(),
        Arc::new(MemoryStore::new(10_000)),
        Arc::new(clock.clone()),
        options,
    );
    (service, clock, config)
}

fn harness_with(options: ServiceOptions) -> Harness {
    // now=2222 is 2 s into a minute (MINUTE windows reset in 58 s), as in the reference's
    // header example.
    let (service, clock, config) = service_of(CONFIG, &LoadOptions::default(), 2222, options);
    Harness {
        service,
        clock,
        config,
    }
}

fn harness() -> Harness {
    harness_with(ServiceOptions::default())
}

fn desc(entries: &[(&str, &str)]) -> Descriptor {
    Descriptor {
        entries: entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect(),
        ..Default::default()
    }
}

fn req(domain: &str, descriptors: Vec<Descriptor>) -> Request {
    Request {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

impl Harness {
    async fn call(&self, r: Request) -> Response {
        self.service.should_rate_limit(r).await.expect("no error")
    }
    async fn one(&self, entries: &[(&str, &str)]) -> Response {
        self.call(req("test", vec![desc(entries)])).await
    }
}

#[tokio::test]
async fn calls_up_to_the_limit_pass_then_over_strictly() {
    let h = harness();
    for i in 1..=20u32 {
        let r = h.one(&[("key2", "R")]).await;
        assert_eq!(r.overall_code, Code::Ok, "call {i}");
        assert_eq!(r.statuses[0].limit_remaining, 20 - i);
    }
    for _ in 21..=25 {
        let r = h.one(&[("key2", "R")]).await;
        assert_eq!(r.overall_code, Code::OverLimit);
        assert_eq!(r.statuses[0].code, Code::OverLimit);
        assert_eq!(r.statuses[0].limit_remaining, 0);
    }
}

#[tokio::test]
async fn limit_zero_is_always_over() {
    let h = harness();
    let r = h.one(&[("zero", "x")]).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(r.overall_code, Code::OverLimit);
}

#[tokio::test]
async fn windows_are_epoch_aligned_and_reset_is_within_the_unit() {
    let h = harness();
    let r = h.one(&[("key1", "foo")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 49);
    assert_eq!(r.statuses[0].duration_until_reset_secs, Some(1));
    let r = h.one(&[("key2", "R")]).await;
    assert_eq!(
        r.statuses[0].duration_until_reset_secs,
        Some(60 - 2222 % 60)
    );
    // Two DAY calls 2 s apart: the second has less time left.
    let first = h.one(&[("parent", "p"), ("child", "c")]).await;
    h.clock.advance_secs(2);
    let second = h.one(&[("parent", "p"), ("child", "c")]).await;
    assert_eq!(
        first.statuses[0].duration_until_reset_secs.unwrap() - 2,
        second.statuses[0].duration_until_reset_secs.unwrap()
    );
    // A new minute starts a fresh count.
    for _ in 0..25 {
        h.one(&[("key2", "new")]).await;
    }
    h.clock.set(Timestamp::from_secs(2280));
    let r = h.one(&[("key2", "new")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 19);
    assert_eq!(r.statuses[0].duration_until_reset_secs, Some(60));
}

#[tokio::test]
async fn unknown_domain_and_unmatched_descriptors_answer_bare_ok() {
    let h = harness();
    let r = h.call(req("foo", vec![desc(&[("hello", "world")])])).await;
    assert_eq!(r.overall_code, Code::Ok);
    assert_eq!(r.statuses[..], [Status::ok()]);
    let r = h.one(&[("nope", "x")]).await;
    assert_eq!(r.statuses[..], [Status::ok()]);
    // Deeper than the config: no limit (the Go service stops at a leaf).
    let r = h.one(&[("key1", "a"), ("more", "b")]).await;
    assert_eq!(r.statuses[..], [Status::ok()]);
    // Shallower than the config's limit level: no limit either.
    let r = h.one(&[("parent", "p")]).await;
    assert_eq!(r.statuses[..], [Status::ok()]);
}

#[tokio::test]
async fn unlimited_answers_max_remaining_and_counts_nothing() {
    let h = harness();
    let r = h.one(&[("free", "x")]).await;
    assert_eq!(r.statuses[..], [Status::unlimited()]);
    assert_eq!(r.statuses[0].limit_remaining, 4_294_967_295);
    assert_eq!(h.service.store().live_counters(), 0);
}

#[tokio::test]
async fn empty_domain_or_descriptor_list_are_errors_with_go_messages() {
    let h = harness();
    let e = h
        .service
        .should_rate_limit(req("", vec![desc(&[("a", "b")])]))
        .await;
    assert_eq!(
        e.unwrap_err().to_string(),
        "rate limit domain must not be empty"
    );
    let e = h.service.should_rate_limit(req("test", vec![])).await;
    assert_eq!(
        e.unwrap_err().to_string(),
        "rate limit descriptor list must not be empty"
    );
    let no_config = RateLimitService::new(
        ConfigHandle::new(None),
        Arc::new(MemoryStore::new(10)),
        Arc::new(h.clock.clone()),
        ServiceOptions::default(),
    );
    let e = no_config
        .should_rate_limit(req("test", vec![desc(&[("a", "b")])]))
        .await;
    assert_eq!(
        e.unwrap_err().to_string(),
        "no rate limit configuration loaded"
    );
}

#[tokio::test]
async fn a_full_store_is_an_error_not_a_silent_ok() {
    let h = harness();
    let tiny = RateLimitService::new(
        h.config.clone(),
        Arc::new(MemoryStore::new(1)),
        Arc::new(h.clock.clone()),
        ServiceOptions::default(),
    );
    tiny.should_rate_limit(req("test", vec![desc(&[("key1", "a")])]))
        .await
        .unwrap();
    let e = tiny
        .should_rate_limit(req("test", vec![desc(&[("key1", "b")])]))
        .await
        .unwrap_err();
    assert!(matches!(
        e,
        ServiceError::Store(StoreError::Full { max: 1 })
    ));
    assert!(!e.is_invalid_argument());
}

#[tokio::test]
async fn every_descriptor_is_counted_even_when_one_is_over() {
    let h = harness();
    let two = || {
        req(
            "test",
            vec![desc(&[("key2", "R2")]), desc(&[("key3", "R2")])],
        )
    };
    for i in 1..=10u32 {
        let r = h.call(two()).await;
        assert_eq!(r.overall_code, Code::Ok, "call {i}");
    }
    for i in 11..=15u32 {
        let r = h.call(two()).await;
        assert_eq!(r.overall_code, Code::OverLimit);
        assert_eq!(r.statuses[1].code, Code::OverLimit);
        // key2 (20/min) keeps draining: 9, 8, 7, 6, 5.
        assert_eq!(r.statuses[0].code, Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, 20 - i);
    }
}

#[tokio::test]
async fn hits_addends() {
    let h = harness();
    // Request-level 0 means 1; 3 means 3.
    let mut r = req("test", vec![desc(&[("key1", "a")])]);
    r.hits_addend = 3;
    assert_eq!(h.call(r).await.statuses[0].limit_remaining, 47);
    // A per-descriptor addend wins, and 0 is a peek.
    let mut d = desc(&[("ten", "p")]);
    d.hits_addend = Some(10);
    let mut r = req("test", vec![d.clone()]);
    r.hits_addend = 5;
    assert_eq!(h.call(r).await.statuses[0].limit_remaining, 0);
    d.hits_addend = Some(0);
    let peek = h.call(req("test", vec![d.clone()])).await;
    assert_eq!(peek.statuses[0].code, Code::Ok);
    assert_eq!(peek.statuses[0].limit_remaining, 0);
    d.hits_addend = None;
    let next = h.call(req("test", vec![d])).await;
    assert_eq!(next.statuses[0].code, Code::OverLimit);
    // Enormous addends saturate instead of wrapping back under the limit.
    let mut huge = desc(&[("ten", "huge")]);
    huge.hits_addend = Some(u64::MAX);
    let r = h.call(req("test", vec![huge.clone()])).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    let r = h.call(req("test", vec![huge])).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
}

#[tokio::test]
async fn current_limit_echoes_the_rule() {
    let h = harness();
    let r = h.one(&[("key2", "x")]).await;
    assert_eq!(
        r.statuses[0].current_limit,
        Some(CurrentLimit {
            requests_per_unit: 20,
            unit: Unit::Minute,
            name: "per_minute".into()
        })
    );
}

#[tokio::test]
async fn per_rule_shadow_mode_answers_ok_with_zero_remaining() {
    let h = harness();
    for _ in 0..5 {
        let r = h.one(&[("shady", "x")]).await;
        assert_eq!(r.overall_code, Code::Ok);
        assert_eq!(r.statuses[0].code, Code::Ok);
    }
    let r = h.one(&[("shady", "x")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!(r.statuses[0].current_limit.is_some());
}

#[tokio::test]
async fn global_shadow_mode_keeps_statuses_over_but_answers_ok() {
    let h = harness_with(ServiceOptions {
        shadow_mode: true,
        ..Default::default()
    });
    let r = h.one(&[("zero", "x")]).await;
    assert_eq!(r.overall_code, Code::Ok);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
}

#[tokio::test]
async fn quota_descriptors_only_block_when_all_of_them_are_over() {
    let h = harness();
    let both = || {
        req(
            "test",
            vec![desc(&[("quota", "q")]), desc(&[("quota2", "q")])],
        )
    };
    h.call(both()).await;
    h.call(both()).await;
    // quota (2/min) is over, quota2 (5/min) is not: overall OK.
    let r = h.call(both()).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(r.overall_code, Code::Ok);
    h.call(both()).await;
    h.call(both()).await;
    // Now both are over.
    let r = h.call(both()).await;
    assert_eq!(r.overall_code, Code::OverLimit);
    // A non-quota descriptor over blocks regardless.
    let r = h
        .call(req(
            "test",
            vec![desc(&[("quota", "z")]), desc(&[("zero", "z")])],
        ))
        .await;
    assert_eq!(r.overall_code, Code::OverLimit);
    // Global QUOTA_MODE makes every limit a quota limit: one not over keeps the request OK.
    let g = harness_with(ServiceOptions {
        quota_mode: true,
        ..Default::default()
    });
    let r = g
        .call(req(
            "test",
            vec![desc(&[("zero", "z")]), desc(&[("key1", "z")])],
        ))
        .await;
    assert_eq!(r.overall_code, Code::Ok);
}

#[tokio::test]
async fn replaced_limits_answer_ok_and_are_not_counted() {
    let h = harness();
    let banned = h.one(&[("banned", "u")]).await;
    assert_eq!(banned.overall_code, Code::OverLimit);
    let both = || {
        req(
            "test",
            vec![desc(&[("banned", "u")]), desc(&[("unbanned", "u")])],
        )
    };
    for _ in 0..2 {
        let r = h.call(both()).await;
        assert_eq!(r.overall_code, Code::Ok);
        assert_eq!(r.statuses[0], Status::ok());
    }
    assert_eq!(h.call(both()).await.overall_code, Code::OverLimit);
}

#[tokio::test]
async fn an_override_needs_a_known_domain_and_shares_the_config_counter() {
    let h = harness();
    let mut d = desc(&[("key2", "shared")]);
    d.limit_override = Some(LimitOverride {
        requests_per_unit: 5,
        unit: Unit::Minute,
    });
    // Unknown domain: the override is ignored.
    let r = h.call(req("nowhere", vec![d.clone()])).await;
    assert_eq!(r.statuses[..], [Status::ok()]);
    // Three hits through config (20/min) ...
    for _ in 0..3 {
        h.one(&[("key2", "shared")]).await;
    }
    // ... are seen by the override (5/min): 4th hit leaves 1.
    let r = h.call(req("test", vec![d.clone()])).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(
        r.statuses[0].current_limit,
        Some(CurrentLimit {
            requests_per_unit: 5,
            unit: Unit::Minute,
            name: String::new()
        })
    );
    // An override applies even where config has no match.
    d.entries = vec![Entry::new("unconfigured", "x")];
    let r = h.call(req("test", vec![d])).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
}

#[tokio::test]
async fn share_threshold_counts_every_matching_value_together() {
    let h = harness();
    for _ in 0..10 {
        let r = h.one(&[("files", "files/a.pdf")]).await;
        assert_eq!(r.overall_code, Code::Ok);
    }
    let r = h.one(&[("files", "files/b.csv")]).await;
    assert_eq!(r.overall_code, Code::OverLimit);
}

/// Every key a request is counted under, as Redis and memcached get it: the Go service's bytes
/// for its limits, Sluice's own for the rest. Written out by hand (the rules are in
/// `crate::key`'s docs) for now = 1_700_000_000 s: 20 s into its minute, 2000 s into its hour.
#[test]
fn a_requests_counter_keys_are_the_go_services_bytes() {
    let h = harness();
    let config = h.config.current().expect("config");
    let domain = config.domain("test").expect("domain");
    let options = ServiceOptions {
        cache_key_prefix: "rl:".into(),
        ..Default::default()
    };
    let limit = |requests_per_unit, unit| LimitOverride {
        requests_per_unit,
        unit,
    };
    let mut same_descriptor = desc(&[("key2", "R")]);
    same_descriptor.limit_override = Some(limit(5, Unit::Minute));
    let mut unconfigured = desc(&[("nowhere", "x")]);
    unconfigured.limit_override = Some(limit(5, Unit::Hour));
    let mut shared_value = desc(&[("files", "files/a.pdf")]);
    shared_value.limit_override = Some(limit(5, Unit::Hour));
    let request = req(
        "test",
        vec![
            desc(&[("key1", "a")]),
            desc(&[("key2", "R")]),
            same_descriptor,
            unconfigured,
            desc(&[("files", "files/a.pdf")]),
            shared_value,
            desc(&[("parent", "p"), ("child", "c")]),
            desc(&[("multi", "m")]),
            desc(&[("tb", "t")]),
            desc(&[("free", "f")]),
        ],
    );
    let mut plans = plan::plan(domain, &request);
    plan::apply_replaces(&mut plans);
    let mut buf = String::new();
    let keys = plan::counter_keys(&options, &request, &plans, &mut buf).expect("keys fit");
    let now = Timestamp::from_secs(1_700_000_000);
    let remote: Vec<String> = plan::hits(&plans, &keys)
        .iter()
        .map(|h| crate::key::remote_key(h.key, &h.quota, now))
        .collect();
    assert_eq!(
        remote,
        [
            "rl:test_key1_a_1700000000",
            "rl:test_key2_R_1699999980",
            // A request's `limit` counts under the config limit's key (same unit, same key) ...
            "rl:test_key2_R_1699999980",
            // ... or the descriptor's, where no config limit matches ...
            "rl:test_nowhere_x_1699999200",
            // ... with the request's value, where a config limit's `share_threshold` has
            // the pattern.
            "rl:test_files_files/*_1699999200",
            "rl:test_files_files/a.pdf_1699999200",
            "rl:test_parent_p_child_c_1699920000",
            // A `rate_limits` list: the first limit has the Go key, the second adds `#1_`.
            "rl:test_multi_m_1700000000",
            "rl:test_multi_m_#1_sliding_window",
            "rl:test_tb_t_token_bucket",
            // `free` is unlimited: no key.
        ]
    );
}

#[tokio::test]
async fn rate_limit_headers_follow_the_go_selection_rule() {
    let h = harness_with(ServiceOptions {
        response_headers: Some(HeaderNames::default()),
        ..Default::default()
    });
    let mut last = None;
    for _ in 0..11 {
        last = Some(h.one(&[("ten", "h")]).await);
    }
    let headers = last.unwrap().response_headers.expect("headers");
    assert_eq!(
        headers.pairs().collect::<Vec<_>>(),
        [
            ("RateLimit-Limit", 10),
            ("RateLimit-Remaining", 0),
            ("RateLimit-Reset", 58),
        ]
    );
    // Sent on OK too, from the descriptor with the least remaining.
    let r = h
        .call(req(
            "test",
            vec![desc(&[("key1", "m")]), desc(&[("key3", "m")])],
        ))
        .await;
    assert_eq!(r.overall_code, Code::Ok);
    let values = r.rate_limit.expect("headers");
    assert_eq!((values.limit, values.remaining), (10, 9));
    assert!(matches!(r.response_headers, Some(ResponseHeaders::Named(h)) if h.values == values));
    // No headers when disabled, or when nothing has a limit.
    assert!(
        harness()
            .one(&[("ten", "h")])
            .await
            .response_headers
            .is_none()
    );
    assert!(h.one(&[("nope", "x")]).await.response_headers.is_none());
}

/// LIMIT_REQUEST_HEADERS_ENABLED and LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED.
#[path = "tests/headers_tests.rs"]
mod headers;

#[tokio::test]
async fn counters_survive_a_config_reload() {
    let h = harness();
    for _ in 0..5 {
        h.one(&[("key2", "kept")]).await;
    }
    let reloaded = parse_files(
        &[("test.yaml".to_string(), CONFIG.to_string())],
        &LoadOptions::default(),
    )
    .unwrap();
    h.config.store(reloaded);
    assert_eq!(
        h.one(&[("key2", "kept")]).await.statuses[0].limit_remaining,
        14
    );
}

#[tokio::test]
async fn requests_beyond_the_caps_are_refused_naming_the_cap() {
    let h = harness_with(ServiceOptions {
        max_descriptors: 2,
        max_entries: 1,
        ..Default::default()
    });
    let e = h
        .service
        .should_rate_limit(req("test", vec![desc(&[("a", "b")]); 3]))
        .await
        .unwrap_err();
    assert!(e.is_invalid_argument());
    assert!(e.to_string().contains("SLUICE_MAX_DESCRIPTORS"), "{e}");
    let e = h
        .service
        .should_rate_limit(req("test", vec![desc(&[("a", "b"), ("c", "d")])]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("SLUICE_MAX_ENTRIES"), "{e}");
}

#[tokio::test]
async fn an_over_long_counter_key_is_refused_naming_its_descriptor_and_the_setting() {
    // `test_key1_<value>_`: 11 bytes around the value.
    let h = harness_with(ServiceOptions {
        max_key_bytes: 64,
        ..Default::default()
    });
    let value = |n: usize| "v".repeat(n);
    let at_cap = h.one(&[("key1", value(53).as_str())]).await;
    assert_eq!(at_cap.statuses[0].limit_remaining, 49);
    let e = h
        .service
        .should_rate_limit(req(
            "test",
            vec![
                desc(&[("key2", "short")]),
                desc(&[("key1", value(54).as_str())]),
            ],
        ))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        ServiceError::KeyTooLong {
            index: 1,
            bytes: 65,
            max: 64
        }
    );
    assert!(e.is_invalid_argument());
    assert_eq!(
        e.to_string(),
        "descriptor 1 makes a counter key of 65 bytes; the limit is 64 bytes (SLUICE_MAX_KEY_BYTES)"
    );
    // Refused before the store: the short descriptor was not counted either.
    assert_eq!(h.service.store().live_counters(), 1);
    // The prefix counts, and a `rate_limits` list's further keys add `#1_`.
    let prefixed = harness_with(ServiceOptions {
        max_key_bytes: 64,
        cache_key_prefix: "p:".into(),
        ..Default::default()
    });
    async fn too_long(h: &Harness, key: &str, n: usize) -> Result<Response, ServiceError> {
        let r = req("test", vec![desc(&[(key, "v".repeat(n).as_str())])]);
        h.service.should_rate_limit(r).await
    }
    let e = too_long(&prefixed, "key1", 52).await;
    assert!(
        matches!(e, Err(ServiceError::KeyTooLong { bytes: 65, .. })),
        "{e:?}"
    );
    // `test_multi_<value>_#1_`: 15 bytes around the value.
    let e = too_long(&h, "multi", 50).await;
    assert!(
        matches!(e, Err(ServiceError::KeyTooLong { bytes: 65, .. })),
        "{e:?}"
    );
    assert_eq!(
        h.one(&[("multi", value(49).as_str())]).await.overall_code,
        Code::Ok
    );
}

#[tokio::test]
async fn descriptors_that_make_no_counter_are_not_held_to_the_key_cap() {
    let h = harness_with(ServiceOptions {
        max_key_bytes: 64,
        ..Default::default()
    });
    let long = "v".repeat(10_000);
    let files = format!("files/{long}");
    // No match, an unlimited limit, a shared wildcard (its key holds the pattern, not the
    // value) and an unknown domain answer as the Go service does.
    for (key, value) in [("nothing", &long), ("free", &long), ("files", &files)] {
        let r = h.one(&[(key, value.as_str())]).await;
        assert_eq!(r.overall_code, Code::Ok, "{key}");
    }
    let r = h.call(req(&long, vec![desc(&[("key1", "a")])])).await;
    assert_eq!(r.statuses[..], [Status::ok()]);
    assert_eq!(
        h.service.store().live_counters(),
        1,
        "only the shared counter"
    );
}

#[tokio::test]
async fn a_flood_of_large_keys_stays_within_the_byte_budget() {
    let h = harness();
    // 8 KB values under a key cap that lets them through; a 1 MiB budget.
    let max_bytes = 1 << 20;
    let store = Arc::new(MemoryStore::with_limits(MemoryLimits {
        max_counters: 1_000_000,
        max_bytes,
    }));
    let service = RateLimitService::new(
        h.config.clone(),
        store.clone(),
        Arc::new(h.clock.clone()),
        ServiceOptions {
            max_key_bytes: 16 * 1024,
            ..Default::default()
        },
    );
    // `test_key2_<value>_`: every counter costs the same here.
    let cost = MemoryLimits::counter_bytes(&format!("test_key2_{}_", "0".repeat(8192)));
    let mut admitted = 0;
    let mut first_refusal = None;
    for i in 0..10_000 {
        let value = format!("{i:08192}");
        match service
            .should_rate_limit(req("test", vec![desc(&[("key2", &value)])]))
            .await
        {
            Ok(_) => admitted += 1,
            Err(e) => {
                assert_eq!(
                    e,
                    ServiceError::Store(StoreError::FullBytes { max: max_bytes })
                );
                first_refusal.get_or_insert(i);
            }
        }
        assert!(store.counter_bytes() <= max_bytes);
    }
    // Refusals begin exactly where the next counter would pass the budget, and only there.
    assert_eq!(admitted, max_bytes / cost);
    assert_eq!(first_refusal, Some(max_bytes / cost));
    assert_eq!(store.counter_bytes(), admitted * cost);
    assert_eq!(
        store
            .stats()
            .rejected_full
            .load(std::sync::atomic::Ordering::Relaxed),
        (10_000 - admitted) as u64
    );
    // Existing counters keep answering; a new window's sweep gives the room back.
    let first = format!("{:08192}", 0);
    assert_eq!(
        service
            .should_rate_limit(req("test", vec![desc(&[("key2", &first)])]))
            .await
            .unwrap()
            .statuses[0]
            .limit_remaining,
        18
    );
    store.sweep(Timestamp::from_secs(2222 + 60));
    assert_eq!(store.counter_bytes(), 0);
}

#[tokio::test]
async fn a_store_out_of_bytes_fails_open_where_the_operator_chose_to() {
    let h = harness();
    let store = MemoryStore::with_limits(MemoryLimits {
        max_counters: 100,
        max_bytes: MemoryLimits::counter_bytes("test_key2_a_"),
    });
    let open = RateLimitService::new(
        h.config.clone(),
        Arc::new(store),
        Arc::new(h.clock.clone()),
        ServiceOptions {
            fail_open: true,
            ..Default::default()
        },
    );
    let call = |v: &str| open.should_rate_limit(req("test", vec![desc(&[("key2", v)])]));
    assert_eq!(call("a").await.unwrap().statuses[0].limit_remaining, 19);
    assert_eq!(call("b").await.unwrap().statuses[..], [Status::ok()]);
    assert_eq!(
        open.store()
            .stats()
            .rejected_full
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn dynamic_metadata_echoes_the_request_and_merges_metadata_of_passing_limits() {
    let h = harness_with(ServiceOptions {
        dynamic_metadata: true,
        ..Default::default()
    });
    let mut with_addend = desc(&[("team", "t")]);
    with_addend.hits_addend = Some(2);
    let two = || req("test", vec![desc(&[("tier", "gold")]), with_addend.clone()]);
    let r = h.call(two()).await;
    assert_eq!(
        r.dynamic_metadata,
        Some(serde_json::json!({
            "domain": "test",
            "descriptors": [{"entries": ["tier=gold"]}, {"entries": ["team=t"], "hitsAddend": 2}],
            "hitsAddend": 0,
            "metadata": {"tier": {"name": "gold", "level": 1, "extra": "x"}, "owner": "a"},
        }))
    );
    // gold is now over: only the passing descriptor's metadata is merged.
    let r = h.call(two()).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(
        r.dynamic_metadata.unwrap()["metadata"],
        serde_json::json!({"tier": {"name": "silver", "extra": "x"}, "owner": "b"})
    );
    assert_eq!(harness().one(&[("team", "t")]).await.dynamic_metadata, None);
}

#[tokio::test]
async fn token_bucket_bursts_then_refills() {
    let h = harness();
    for i in 0..20u32 {
        let r = h.one(&[("tb", "a")]).await;
        assert_eq!(r.statuses[0].code, Code::Ok, "call {i}");
        assert_eq!(r.statuses[0].limit_remaining, 19 - i);
    }
    let r = h.one(&[("tb", "a")]).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(r.statuses[0].duration_until_reset_secs, Some(1));
    // 10/s: one token back every 100 ms; rejected calls took none.
    h.clock
        .set(Timestamp::from_micros(2222 * 1_000_000 + 100_000));
    assert_eq!(h.one(&[("tb", "a")]).await.statuses[0].code, Code::Ok);
    assert_eq!(
        h.one(&[("tb", "a")]).await.statuses[0].code,
        Code::OverLimit
    );
}

#[tokio::test]
async fn leaky_bucket_follows_nginx_limit_req() {
    let h = harness();
    // rate=2r/s burst=3: four at once, then one per 500 ms.
    let admitted = |r: &Response| r.statuses[0].code == Code::Ok;
    let mut first = Vec::new();
    for _ in 0..5 {
        first.push(admitted(&h.one(&[("lb", "a")]).await));
    }
    assert_eq!(first, [true, true, true, true, false]);
    h.clock
        .set(Timestamp::from_micros(2222 * 1_000_000 + 500_000));
    assert!(admitted(&h.one(&[("lb", "a")]).await));
    assert!(!admitted(&h.one(&[("lb", "a")]).await));
}

#[tokio::test]
async fn sliding_window_weighs_the_previous_window() {
    let h = harness();
    for _ in 0..10 {
        assert_eq!(h.one(&[("sw", "a")]).await.statuses[0].code, Code::Ok);
    }
    assert_eq!(
        h.one(&[("sw", "a")]).await.statuses[0].code,
        Code::OverLimit
    );
    // 30 s into the next minute, half of the previous 10 still count: 5 more fit.
    h.clock.set(Timestamp::from_secs(2280 + 30));
    for _ in 0..5 {
        assert_eq!(h.one(&[("sw", "a")]).await.statuses[0].code, Code::Ok);
    }
    assert_eq!(
        h.one(&[("sw", "a")]).await.statuses[0].code,
        Code::OverLimit
    );
}

#[tokio::test]
async fn every_limit_of_a_multi_limit_descriptor_is_enforced() {
    let h = harness();
    let call = || h.one(&[("multi", "m")]);
    let name = |r: &Response| r.statuses[0].current_limit.as_ref().unwrap().name.clone();
    // Second 1: two pass; the per-second limit (remaining 0) is the most restrictive.
    let r = call().await;
    assert_eq!(
        (r.statuses[0].limit_remaining, name(&r)),
        (1, "per_second".into())
    );
    assert_eq!(call().await.statuses[0].code, Code::Ok);
    let r = call().await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(name(&r), "per_second");
    // Seconds 2 and 3: the per-minute sliding limit (5) runs out first.
    h.clock.advance_secs(1);
    assert_eq!(call().await.statuses[0].code, Code::Ok);
    assert_eq!(call().await.statuses[0].code, Code::Ok);
    h.clock.advance_secs(1);
    let r = call().await;
    assert_eq!(r.statuses[0].code, Code::Ok);
    assert_eq!(
        (r.statuses[0].limit_remaining, name(&r)),
        (0, "per_minute".into())
    );
    let r = call().await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(name(&r), "per_minute");
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        5
    );
}

mod multi_limit_property {
    use super::*;
    use proptest::prelude::*;

    const MULTI: &str = r#"
domain: p
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 3}
      - {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
      - {unit: minute, requests_per_unit: 12, algorithm: token_bucket, burst: 4}
"#;

    proptest! {
        /// A multi-limit descriptor never admits more than any one of its limits allows.
        #[test]
        fn never_exceeds_any_limit(gaps_ms in proptest::collection::vec(0u64..900, 1..150)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let cfg = parse_files(&[("p.yaml".into(), MULTI.into())], &LoadOptions::default()).unwrap();
            let clock = ManualClock::new(Timestamp::from_secs(6000));
            let service = RateLimitService::new(
                ConfigHandle::new(Some(cfg)),
                Arc::new(MemoryStore::new(100)),
                Arc::new(clock.clone()),
                ServiceOptions::default(),
            );
            let mut now_us = 6000 * 1_000_000u64;
            let mut admitted = Vec::new();
            for gap in gaps_ms {
                now_us += gap * 1_000;
                clock.set(Timestamp::from_micros(now_us));
                let r = rt.block_on(service.should_rate_limit(req("p", vec![desc(&[("k", "v")])]))).unwrap();
                if r.overall_code == Code::Ok {
                    admitted.push(now_us);
                }
            }
            for &t in &admitted {
                let in_second = admitted.iter().filter(|&&a| a / 1_000_000 == t / 1_000_000).count();
                prop_assert!(in_second <= 3);
                let in_minute = admitted.iter().filter(|&&a| a / 60_000_000 == t / 60_000_000).count();
                prop_assert!(in_minute <= 10);
                // Token bucket: at most 4 + 12/min * span in any interval starting at t.
                let mut n = 0u64;
                for &a in admitted.iter().filter(|&&a| a >= t) {
                    n += 1;
                    prop_assert!(n * 5_000_000 <= 4 * 5_000_000 + (a - t), "{n} in {}us", a - t);
                }
            }
        }
    }
}

#[tokio::test]
async fn a_backend_failure_is_an_error_unless_the_domain_fails_open() {
    let h = harness();
    let with = |options: ServiceOptions| {
        RateLimitService::new(
            h.config.clone(),
            // A store with no room fails every new counter: a backend failure on demand.
            Arc::new(MemoryStore::new(0)),
            Arc::new(h.clock.clone()),
            options,
        )
    };
    let r = || req("test", vec![desc(&[("key1", "x")]), desc(&[("nope", "x")])]);
    assert!(
        with(ServiceOptions::default())
            .should_rate_limit(r())
            .await
            .is_err()
    );
    for options in [
        ServiceOptions {
            fail_open: true,
            ..Default::default()
        },
        ServiceOptions {
            fail_open_domains: vec!["test".into()],
            ..Default::default()
        },
    ] {
        let answer = with(options).should_rate_limit(r()).await.unwrap();
        assert_eq!(answer.overall_code, Code::Ok);
        assert_eq!(answer.statuses[..], [Status::ok(), Status::ok()]);
    }
    let other_domain = ServiceOptions {
        fail_open_domains: vec!["elsewhere".into()],
        ..Default::default()
    };
    assert!(with(other_domain).should_rate_limit(r()).await.is_err());
}

/// A store that fails every call, and asks for a CLIENT span like Redis does.
struct TracedFailingStore;

impl CounterStore for TracedFailingStore {
    fn trace_backend(&self) -> Option<crate::store::TraceBackend> {
        Some(crate::store::TraceBackend {
            span_name: "Redis Pipeline Execution",
            attributes: &[("db.system", "redis")],
        })
    }

    async fn apply<'a>(
        &'a self,
        _now: crate::clock::Timestamp,
        _hits: &'a [Hit<'a>],
        _out: &'a mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        Err(StoreError::Backend {
            message: "connection refused".into(),
        })
    }

    async fn refund<'a>(
        &'a self,
        _now: crate::clock::Timestamp,
        _hits: &'a [Hit<'a>],
        _out: &'a mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        Err(StoreError::Backend {
            message: "connection refused".into(),
        })
    }
}

#[tokio::test]
async fn a_traced_backend_failure_gives_error_spans_parent_and_child() {
    use crate::telemetry::observer::SPAN_NAME;
    use crate::telemetry::otlp::trace::{SpanKind, Value};
    use crate::telemetry::otlp::{RequestTrace, SpanContext, Tracer, Transport};
    use crate::telemetry::{DecisionTelemetry, Stats};
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n";
    let cfg = parse_files(&[("d.yaml".into(), yaml.into())], &LoadOptions::default()).unwrap();
    let (tracer, mut rx) = Tracer::new(0.0, 16);
    let service = RateLimitService::new(
        ConfigHandle::new(Some(cfg)),
        Arc::new(TracedFailingStore),
        Arc::new(ManualClock::new(Timestamp::from_secs(1_000))),
        ServiceOptions::default(),
    )
    .with_observer(Arc::new(DecisionTelemetry::new(
        Arc::new(Stats::default()),
        Arc::new(tracer),
    )));
    let request = Request {
        domain: "d".into(),
        descriptors: vec![Descriptor {
            entries: vec![Entry::new("k", "v")],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let trace = RequestTrace {
        transport: Transport::Grpc,
        parent: Some(SpanContext {
            trace_id: [1; 16],
            span_id: [2; 8],
            sampled: true,
            trace_state: String::new(),
        }),
    };
    assert!(
        service
            .should_rate_limit_traced(request, &trace)
            .await
            .is_err()
    );
    let child = rx.try_recv().expect("the backend span ends first");
    let server = rx.try_recv().expect("then the call's span");
    assert_eq!(child.name, "Redis Pipeline Execution");
    assert_eq!(child.kind, SpanKind::Client);
    assert_eq!(child.parent_span_id, server.span_id);
    assert_eq!(child.trace_id, [1; 16]);
    assert!(
        child
            .error
            .as_deref()
            .unwrap()
            .contains("connection refused")
    );
    assert!(
        child
            .attributes
            .contains(&("db.system", Value::Static("redis")))
    );
    assert!(
        child
            .attributes
            .contains(&("ratelimit.counters", Value::Int(1)))
    );
    assert_eq!(server.name, SPAN_NAME);
    assert_eq!(server.parent_span_id, [2; 8]);
    assert!(server.remote_parent);
    assert!(server.error.is_some());
    assert!(
        server
            .attributes
            .contains(&("error.type", Value::Static("redis_error")))
    );
    assert!(rx.try_recv().is_err());
}

/// A memory store whose every call takes `secs` on a manual clock.
struct SlowStore {
    inner: MemoryStore,
    clock: ManualClock,
    secs: u64,
}

impl CounterStore for SlowStore {
    async fn apply<'a>(
        &'a self,
        now: crate::clock::Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        self.clock.advance_secs(self.secs);
        self.inner.apply(now, hits, out).await
    }

    async fn refund<'a>(
        &'a self,
        now: crate::clock::Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        self.inner.refund(now, hits, out).await
    }
}

/// What an observer was told, in its order.
#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<String>>);

impl observe::Observer for Recorder {
    fn counts(&self) -> bool {
        true
    }
    fn call_done(&self, call: &observe::CallReport<'_>, span: Option<observe::Span>) {
        let code = call.result.as_ref().map(|r| r.overall_code);
        let line = format!(
            "call {} {code:?} {:?} {}",
            call.request.domain,
            call.elapsed,
            span.is_some()
        );
        self.0.lock().unwrap().push(line);
    }
    fn descriptor_decided(&self, r: &observe::DescriptorReport<'_>) {
        let key = match r.key {
            observe::StatsKey::Limit { full_key, .. } => format!("limit {full_key}"),
            observe::StatsKey::Values { key, limit } => format!("values {key} of {limit}"),
            observe::StatsKey::Override { key, unit } => format!("override {key} per {unit:?}"),
        };
        let line = format!(
            "descriptor {key} {}/{} over={}",
            r.outcome.count_after, r.outcome.limit, r.outcome.over
        );
        self.0.lock().unwrap().push(line);
    }
    fn domain_not_found(&self, domain: &str) {
        self.0.lock().unwrap().push(format!("not found {domain}"));
    }
}

/// The decision reports to its observer in domain terms, and times itself by the injected
/// clock: a store call that takes 3 s of manual time makes a call of 3 s.
#[tokio::test]
async fn the_observer_hears_each_decision_timed_by_the_injected_clock() {
    let h = harness();
    let store = SlowStore {
        inner: MemoryStore::new(100),
        clock: h.clock.clone(),
        secs: 3,
    };
    let recorder = Arc::new(Recorder::default());
    let service = RateLimitService::new(
        h.config.clone(),
        Arc::new(store),
        Arc::new(h.clock.clone()),
        ServiceOptions::default(),
    )
    .with_observer(recorder.clone());
    let mut overridden = desc(&[("any", "x")]);
    overridden.limit_override = Some(LimitOverride {
        requests_per_unit: 7,
        unit: Unit::Minute,
    });
    service
        .should_rate_limit(req("test", vec![desc(&[("key2", "a")]), overridden]))
        .await
        .unwrap();
    service
        .should_rate_limit(req("nope", vec![desc(&[("key2", "a")])]))
        .await
        .unwrap();
    assert_eq!(
        *recorder.0.lock().unwrap(),
        vec![
            "descriptor limit test.key2 1/20 over=false",
            "descriptor override test.any_x per Minute 1/7 over=false",
            "call test Ok(Ok) 3s false",
            "not found nope",
            "call nope Ok(Ok) 0ns false",
        ]
    );
}

/// A refused request's refund is charged at the time the request was charged at, so it reaches
/// the window it was counted in even when the store call ran past that window's end.
#[tokio::test]
async fn a_refund_reaches_the_window_its_hits_were_charged_to() {
    let h = harness();
    // The last second of a minute: the store call below ends in the next minute.
    h.clock.set(Timestamp::from_secs(2279));
    let service = RateLimitService::new(
        h.config.clone(),
        Arc::new(SlowStore {
            inner: MemoryStore::new(100),
            clock: h.clock.clone(),
            secs: 1,
        }),
        Arc::new(h.clock.clone()),
        ServiceOptions::default(),
    );
    let multi = |hits: u32| Request {
        hits_addend: hits,
        ..req("test", vec![desc(&[("multi", "m")])])
    };
    // 3 hits: over per_second (2), within per_minute (a sliding window of 5), which gives its 3
    // back. Were they given back in the next minute, the previous minute would still hold 3.
    let r = service.should_rate_limit(multi(3)).await.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit);
    // 2280 and 2281: 2 hits each, 4 in the new minute and none left in the previous one.
    for at in [2280, 2281] {
        let r = service.should_rate_limit(multi(2)).await.unwrap();
        assert_eq!(r.overall_code, Code::Ok, "at {at}");
    }
}

#[path = "tests/refunds_tests.rs"]
mod refunds;

/// Reservations (issue 51): reserve an estimate, settle the real cost.
#[path = "tests/reserve_tests.rs"]
mod reserve_tests;

/// Calendar windows (issue 51): `time_zone` and USE_CALENDAR_MONTH_RATE_LIMIT.
#[path = "tests/calendar_tests.rs"]
mod calendar_tests;

/// Issue 52's penalty through the service: the answer's code and reset; under shadow mode
/// the same penalty, answered OK with nothing remaining; explain shows it.
#[tokio::test]
async fn a_penalty_refuses_a_key_after_its_window_and_shadow_mode_only_reports_it() {
    let yaml = "domain: test\ndescriptors:\n  - key: brute\n    rate_limit: {unit: second, requests_per_unit: 3, penalty_seconds: 3}\n  - key: watched\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 3, penalty_seconds: 3}\n";
    let (service, clock, config) =
        service_of(yaml, &LoadOptions::default(), 5_000, Default::default());
    let h = Harness {
        service,
        clock,
        config,
    };
    let answer = |r: &Response| {
        let s = &r.statuses[0];
        (s.code, s.limit_remaining, s.duration_until_reset_secs)
    };
    for key in ["brute", "watched"] {
        h.clock.set(Timestamp::from_secs(5_000));
        for _ in 0..3 {
            assert_eq!(h.one(&[(key, "ip")]).await.statuses[0].code, Code::Ok);
        }
        // Shadow mode answers OK, nothing remaining, as for any refusal.
        let code = match key {
            "brute" => Code::OverLimit,
            _ => Code::Ok,
        };
        assert_eq!(
            answer(&h.one(&[(key, "ip")]).await),
            (code, 0, Some(3)),
            "{key}"
        );
        // A second later the window has reset, the penalty has not.
        h.clock.set(Timestamp::from_micros(5_001_500_000));
        assert_eq!(
            answer(&h.one(&[(key, "ip")]).await),
            (code, 0, Some(2)),
            "{key}"
        );
        let explained = h
            .service
            .explain(&req("test", vec![desc(&[(key, "ip")])]), true)
            .await
            .unwrap()
            .to_string();
        assert!(explained.contains(r#""penalized":true"#), "{explained}");
        assert!(explained.contains(r#""penalty_seconds":3"#), "{explained}");
        h.clock.set(Timestamp::from_secs(5_003));
        assert_eq!(
            answer(&h.one(&[(key, "ip")]).await),
            (Code::Ok, 2, Some(1)),
            "{key}"
        );
    }
}
