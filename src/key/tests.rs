//! Golden keys. Every expected string is written out by hand from the Go service's rules
//! (envoyproxy/ratelimit's `src/limiter/cache_key.go`: the prefix, the domain, `_`, each entry's
//! key and value each followed by `_`, then `(now / divider) * divider` with SECOND 1, MINUTE
//! 60, HOUR 3600, DAY 86400, WEEK 604800, MONTH 2592000, YEAR 31536000) and from Sluice's own
//! suffixes as the module docs state them; none is computed by the code under test. The
//! vectors from Go's own tests (`test/limiter/base_limiter_test.go`,
//! `test/memcached/cache_impl_test.go`) are used as they are.
//!
//! `NOW` is 1_700_000_000 s, 2023-11-14T22:13:20Z: 20 s into its minute, 2000 s into its hour.

use super::*;
use crate::limiter::{Algorithm, Unit};

const NOW: Timestamp = Timestamp::from_secs(1_700_000_000);

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

/// The stem written, checked against its measured length.
fn stem(prefix: &str, domain: &str, pairs: &[(&str, &str)], shared: &[(usize, &str)]) -> String {
    let entries = entries(pairs);
    let mut buf = String::new();
    write_counter_key(&mut buf, prefix, domain, &entries, shared);
    assert_eq!(
        counter_key_len(prefix, domain, &entries, shared),
        buf.len(),
        "{buf}"
    );
    buf
}

fn quota(algorithm: Algorithm, unit: Unit, multiplier: u32) -> Quota {
    Quota {
        algorithm,
        unit_multiplier: multiplier,
        ..Quota::fixed(10, unit)
    }
}

#[test]
fn counter_keys_match_the_go_service() {
    let mut buf = String::new();
    write_counter_key(
        &mut buf,
        "",
        "domain",
        &[
            Entry::new("key2", "value2"),
            Entry::new("subkey2", "subvalue2"),
        ],
        &[],
    );
    // Go's key is this stem plus the window start: domain_key2_value2_subkey2_subvalue2_1200.
    assert_eq!(buf, "domain_key2_value2_subkey2_subvalue2_");
    buf.clear();
    write_counter_key(
        &mut buf,
        "prefix:",
        "domain",
        &[Entry::new("key", "value")],
        &[],
    );
    assert_eq!(buf, "prefix:domain_key_value_");
    buf.clear();
    write_counter_key(
        &mut buf,
        "",
        "domain",
        &[Entry::new("files", "files/a.pdf")],
        &[(0, "files/*")],
    );
    assert_eq!(buf, "domain_files_files/*_");
}

#[test]
fn stems_are_the_go_services_for_any_entries() {
    assert_eq!(
        stem("", "domain", &[("key", "value")], &[]),
        "domain_key_value_"
    );
    // An empty value is written as it is: nothing between the two underscores.
    assert_eq!(stem("", "domain", &[("key", "")], &[]), "domain_key__");
    // Bytes are copied, never escaped: `_`, `:`, `/`, spaces and UTF-8 alike.
    assert_eq!(
        stem("", "d", &[("a_b", "c:d/e f"), ("ключ", "значение")], &[]),
        "d_a_b_c:d/e f_ключ_значение_"
    );
    // share_threshold, by entry index (Go's nested cases): the pattern replaces only the
    // values it matched.
    let nested = [("parent", "value1"), ("files", "nested/a.txt")];
    assert_eq!(
        stem("", "domain", &nested, &[(1, "nested/*")]),
        "domain_parent_value1_files_nested/*_"
    );
    let both = [("files", "top/a"), ("files", "nested/b")];
    assert_eq!(
        stem("", "domain", &both, &[(0, "top/*"), (1, "nested/*")]),
        "domain_files_top/*_files_nested/*_"
    );
}

#[test]
fn full_keys_are_the_go_service_bytes() {
    // The reference's examples: now=1234 with MINUTE and SECOND windows.
    let now = Timestamp::from_secs(1234);
    assert_eq!(
        go_cache_key("domain_key2_value2_subkey2_subvalue2_", now, Unit::Minute),
        "domain_key2_value2_subkey2_subvalue2_1200"
    );
    assert_eq!(
        go_cache_key("prefix:domain_key_value_", now, Unit::Second),
        "prefix:domain_key_value_1234"
    );
    assert_eq!(
        go_cache_key("domain_files_files/*_", now, Unit::Second),
        "domain_files_files/*_1234"
    );
    // A window of several units: its start, and a marker no Go limit's key has.
    assert_eq!(
        go_cache_key("d_k_v_", now, Window::new(Unit::Minute, 5)),
        "d_k_v_x5MINUTE_1200"
    );
    assert_eq!(
        go_cache_key(
            "d_k_v_",
            Timestamp::from_secs(1500),
            Window::new(Unit::Minute, 5)
        ),
        "d_k_v_x5MINUTE_1500"
    );
}

#[test]
fn go_keys_for_every_unit() {
    let s = "domain_key_value_";
    let cases = [
        (Unit::Second, "domain_key_value_1700000000"),
        (Unit::Minute, "domain_key_value_1699999980"),
        (Unit::Hour, "domain_key_value_1699999200"),
        (Unit::Day, "domain_key_value_1699920000"),
        (Unit::Week, "domain_key_value_1699488000"),
        // MONTH is 30 days and YEAR 365, as in Go: not calendar months or years.
        (Unit::Month, "domain_key_value_1697760000"),
        (Unit::Year, "domain_key_value_1671408000"),
    ];
    for (unit, expected) in cases {
        assert_eq!(go_cache_key(s, NOW, unit), expected, "{unit:?}");
        assert_eq!(go_cache_key(s, NOW, Window::of(unit)), expected, "{unit:?}");
    }
    // Go's memcached tests: now=1000000 for HOUR and DAY, two descriptors of one request.
    let now = Timestamp::from_secs(1_000_000);
    assert_eq!(
        go_cache_key("domain_key3_value3_", now, Unit::Hour),
        "domain_key3_value3_997200"
    );
    assert_eq!(
        go_cache_key("domain_key3_value3_subkey3_subvalue3_", now, Unit::Day),
        "domain_key3_value3_subkey3_subvalue3_950400"
    );
}

#[test]
fn a_window_starts_at_its_first_second_and_holds_to_its_last() {
    let s = "d_k_v_";
    let at = Timestamp::from_secs;
    assert_eq!(
        go_cache_key(s, at(1_699_999_980), Unit::Minute),
        "d_k_v_1699999980"
    );
    assert_eq!(
        go_cache_key(s, at(1_700_000_039), Unit::Minute),
        "d_k_v_1699999980"
    );
    assert_eq!(
        go_cache_key(s, at(1_700_000_040), Unit::Minute),
        "d_k_v_1700000040"
    );
    assert_eq!(go_cache_key(s, at(0), Unit::Year), "d_k_v_0");
}

#[test]
fn windows_of_several_units_carry_a_marker_go_keys_never_end_with() {
    let s = "domain_key_value_";
    let cases = [
        (
            Window::new(Unit::Minute, 5),
            "domain_key_value_x5MINUTE_1699999800",
        ),
        // Two hours start where one does here: the marker alone keeps them apart.
        (
            Window::new(Unit::Hour, 2),
            "domain_key_value_x2HOUR_1699999200",
        ),
        (
            Window::new(Unit::Day, 3),
            "domain_key_value_x3DAY_1699833600",
        ),
        (
            Window::new(Unit::Second, 10),
            "domain_key_value_x10SECOND_1700000000",
        ),
        // One unit, or a multiplier of 0 (read as 1): the Go service's key.
        (Window::new(Unit::Minute, 1), "domain_key_value_1699999980"),
        (Window::new(Unit::Minute, 0), "domain_key_value_1699999980"),
    ];
    for (window, expected) in cases {
        assert_eq!(go_cache_key(s, NOW, window), expected, "{window:?}");
    }
    assert!(matches!(
        window_stem(s, Window::of(Unit::Hour)),
        Cow::Borrowed("domain_key_value_")
    ));
    assert_eq!(
        window_stem(s, Window::new(Unit::Week, 2)),
        "domain_key_value_x2WEEK_"
    );
}

#[test]
fn the_cache_key_prefix_comes_before_the_domain() {
    let s = stem("rl:", "edge", &[("api_key", "k1")], &[]);
    assert_eq!(s, "rl:edge_api_key_k1_");
    assert_eq!(
        go_cache_key(&s, NOW, Unit::Minute),
        "rl:edge_api_key_k1_1699999980"
    );
    // A prefix is bytes like any other: no separator is added.
    assert_eq!(stem("svc", "edge", &[("k", "v")], &[]), "svcedge_k_v_");
}

#[test]
fn further_limits_of_a_descriptor_add_their_index() {
    let mut buf = String::from("other_");
    write_counter_key(&mut buf, "rl:", "edge", &entries(&[("api_key", "k1")]), &[]);
    let s = 6..buf.len();
    let mut ranges = Vec::new();
    write_limit_keys(&mut buf, s.clone(), 3, |r| ranges.push(r));
    let keys: Vec<&str> = ranges.iter().map(|r| &buf[r.clone()]).collect();
    assert_eq!(
        keys,
        [
            "rl:edge_api_key_k1_",
            "rl:edge_api_key_k1_#1_",
            "rl:edge_api_key_k1_#2_"
        ]
    );
    assert_eq!(
        go_cache_key(keys[1], NOW, Unit::Second),
        "rl:edge_api_key_k1_#1_1700000000"
    );
    assert_eq!(
        go_cache_key(keys[2], NOW, Window::new(Unit::Minute, 5)),
        "rl:edge_api_key_k1_#2_x5MINUTE_1699999800"
    );
    let k2 = Quota {
        algorithm: Algorithm::SlidingWindow,
        ..Quota::fixed(5, Unit::Minute)
    };
    assert_eq!(
        state_key(keys[2], &k2),
        "rl:edge_api_key_k1_#2_sliding_window"
    );
    // 19 bytes of stem: the longest key adds `#2_`; all three add `#1_` and `#2_`.
    assert_eq!(
        limit_keys_len(19, 3),
        LimitKeysLen {
            longest: 22,
            total: 63
        }
    );
    assert_eq!(buf.len(), 6 + 63);

    // Past nine further limits the index takes two digits.
    let mut buf = String::from("d_k_v_");
    let mut ranges = Vec::new();
    write_limit_keys(&mut buf, 0..6, 12, |r| ranges.push(r));
    assert_eq!(&buf[ranges[9].clone()], "d_k_v_#9_");
    assert_eq!(&buf[ranges[10].clone()], "d_k_v_#10_");
    assert_eq!(&buf[ranges[11].clone()], "d_k_v_#11_");
    // 6 × 12 + 9 × 3 (`#1_`..`#9_`) + 2 × 4 (`#10_`, `#11_`).
    assert_eq!(
        limit_keys_len(6, 12),
        LimitKeysLen {
            longest: 10,
            total: 107
        }
    );
    assert_eq!(buf.len(), 107);

    // One limit (every Go limit) is the stem alone.
    let mut buf = String::from("d_k_v_");
    let mut ranges = Vec::new();
    write_limit_keys(&mut buf, 0..6, 1, |r| ranges.push(r));
    assert_eq!(buf, "d_k_v_");
    assert_eq!(ranges.len(), 1);
    assert_eq!(ranges[0], 0..6);
    assert_eq!(
        limit_keys_len(6, 1),
        LimitKeysLen {
            longest: 6,
            total: 6
        }
    );
}

#[test]
fn other_algorithms_keep_their_state_under_the_stem_and_their_name() {
    let s = "domain_key_value_";
    let cases = [
        (
            Algorithm::SlidingWindow,
            1,
            "domain_key_value_sliding_window",
        ),
        (Algorithm::TokenBucket, 1, "domain_key_value_token_bucket"),
        (Algorithm::LeakyBucket, 1, "domain_key_value_leaky_bucket"),
        (Algorithm::Concurrency, 1, "domain_key_value_concurrency"),
        (
            Algorithm::SlidingWindow,
            5,
            "domain_key_value_x5MINUTE_sliding_window",
        ),
        (
            Algorithm::TokenBucket,
            5,
            "domain_key_value_x5MINUTE_token_bucket",
        ),
        (
            Algorithm::Concurrency,
            5,
            "domain_key_value_x5MINUTE_concurrency",
        ),
    ];
    for (algorithm, multiplier, expected) in cases {
        let q = quota(algorithm, Unit::Minute, multiplier);
        assert_eq!(state_key(s, &q), expected, "{algorithm:?}");
        assert_eq!(remote_key(s, &q, NOW), expected, "{algorithm:?}");
    }
    // A fixed window's remote key is the Go key, never a state key.
    let fixed = quota(Algorithm::FixedWindow, Unit::Minute, 1);
    assert_eq!(remote_key(s, &fixed, NOW), "domain_key_value_1699999980");
    let five = quota(Algorithm::FixedWindow, Unit::Minute, 5);
    assert_eq!(
        remote_key(s, &five, NOW),
        "domain_key_value_x5MINUTE_1699999800"
    );
}

#[test]
fn write_behind_keys_tag_the_stem_without_the_prefix() {
    let k = write_behind_key(
        "app:",
        "app:d_k_v_",
        CounterKind::Fixed(Unit::Minute.into()),
        28,
    );
    assert_eq!(k, "app:sluice:wb:{d_k_v_}:fw:60:28");
    let k = write_behind_key("", "d_k_v_", CounterKind::Sliding(Unit::Second.into()), 9);
    assert_eq!(k, "sluice:wb:{d_k_v_}:sw:1:9");
    assert_eq!(
        write_behind_key("", "d_k_v_", CounterKind::Bucket, 0),
        "sluice:wb:{d_k_v_}:gcra"
    );
    // The window index is ignored for buckets; a window of several units is in its seconds.
    assert_eq!(
        write_behind_key("app:", "app:d_k_v_", CounterKind::Bucket, 7),
        "app:sluice:wb:{d_k_v_}:gcra"
    );
    let five = Window::new(Unit::Minute, 5);
    assert_eq!(
        write_behind_key("p:", "p:d_k_v_#1_", CounterKind::Sliding(five), 5_666_666),
        "p:sluice:wb:{d_k_v_#1_}:sw:300:5666666"
    );
    assert_eq!(
        write_behind_slots_key("p:", "p:d_k_v_", Window::of(Unit::Second)),
        "p:sluice:wb:{d_k_v_}:cc:1"
    );
    assert_eq!(
        write_behind_slots_key("", "d_k_v_", five),
        "sluice:wb:{d_k_v_}:cc:300"
    );
}

#[test]
fn keys_are_legal_as_the_go_client_says() {
    assert!(memcached_legal("domain_key_value_1700000000"));
    assert!(memcached_legal("pfx:d_k_ünïcode_1"));
    assert!(memcached_legal(&"k".repeat(250)));
    assert!(!memcached_legal(&"k".repeat(251)));
    for bad in ["a b", "a\tb", "a\nb", "a\r", "a\u{7f}", "a\u{1}"] {
        assert!(!memcached_legal(bad), "{bad:?}");
    }
}

#[test]
fn keys_memcached_cannot_store_are_hashed() {
    let fine = "domain_key_value_1700000000".to_owned();
    assert_eq!(memcached_key(fine.clone()), fine);
    for bad in [
        format!("d_ua_Mozilla 5.0_{}", 1),
        format!("d_k_{}_1", "v".repeat(300)),
        "d_k_a\u{1}_1".to_owned(),
    ] {
        let key = memcached_key(bad.clone());
        assert!(key.starts_with("sluice:") && key.len() == 71, "{key}");
        assert!(memcached_legal(&key));
        assert_eq!(
            memcached_key(bad),
            key,
            "the same key every time, on every replica"
        );
    }
    assert_ne!(memcached_key("a b_1".into()), memcached_key("a b_2".into()));
}

#[test]
fn memcached_keys_are_the_go_keys_or_their_sha256() {
    // What memcached can store goes as the Go service sends it.
    assert_eq!(
        memcached_key("rl:domain_key_value_1699999980".to_owned()),
        "rl:domain_key_value_1699999980"
    );
    let longest = format!("d_k_{}_1", "v".repeat(244));
    assert_eq!(longest.len(), 250);
    assert_eq!(memcached_key(longest.clone()), longest);
    // The rest: `sluice:` and the SHA-256 of the key in hex (from `printf %s KEY | sha256sum`).
    assert_eq!(
        memcached_key("d_ua_Mozilla 5.0_1699999980".to_owned()),
        "sluice:35d6ac9167f4883d938e09613de71054271cbb6ca45b9eade8952fd8e4e2c325"
    );
    assert_eq!(
        memcached_key("rl:d_k_a b_1699999200".to_owned()),
        "sluice:3950e8a64ec024bda1d6ab8e570c86e999cf564b9d9313cbf781b90c5007471a"
    );
}

#[test]
fn rlqs_buckets_are_named_by_their_stem_without_the_prefix() {
    let id = entries(&[("tenant", "acme")]);
    let mut key = String::new();
    write_bucket_key(&mut key, "rlqs", &id, &[]);
    assert_eq!(key, "rlqs_tenant_acme_");
    assert_eq!(bucket_key_len("rlqs", &id), key.len());
    // Entries in descriptor order (the caller sorts them), and a shared pattern as for counters.
    let id = entries(&[("name", "api"), ("path", "/v1/users")]);
    key.clear();
    write_bucket_key(&mut key, "envoy", &id, &[(1, "/v1/*")]);
    assert_eq!(key, "envoy_name_api_path_/v1/*_");
    assert_eq!(
        bucket_key_len("envoy", &id),
        "envoy_name_api_path_/v1/users_".len()
    );
}
