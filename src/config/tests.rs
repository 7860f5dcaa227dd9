//! The config's builder and lookup together: files built, then requests matched.

use super::build::Builder;
use super::lookup::*;
use crate::config::raw;
use crate::descriptor::Entry;
use crate::limiter::{Quota, Unit};

fn config(text: &str) -> RateLimitConfig {
    let mut b = Builder::new(&crate::config::LoadOptions::default());
    b.add_file(raw::parse(text).expect("parses"))
        .expect("valid");
    b.finish()
}

fn build_err(text: &str) -> String {
    let mut b = Builder::new(&crate::config::LoadOptions::default());
    match raw::parse(text) {
        Err(e) => e,
        Ok(root) => b.add_file(root).expect_err("should fail"),
    }
}

fn look<'a>(cfg: &'a RateLimitConfig, entries: &[(&str, &str)]) -> Option<Matched<'a>> {
    let entries: Vec<Entry> = entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
    cfg.domain("d")?.lookup(&entries)
}

fn key_of(cfg: &RateLimitConfig, entries: &[(&str, &str)]) -> Option<String> {
    look(cfg, entries).map(|m| m.limit.full_key.clone())
}

const ORDER: &str = r#"
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: foo*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: f*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: foobar
    rate_limit: {unit: second, requests_per_unit: 4}
"#;

#[test]
fn exact_beats_wildcard_beats_key_only() {
    let cfg = config(ORDER);
    assert_eq!(
        key_of(&cfg, &[("k", "foobar")]).as_deref(),
        Some("d.k_foobar")
    );
    assert_eq!(
        key_of(&cfg, &[("k", "foobaz")]).as_deref(),
        Some("d.k_foo*")
    );
    assert_eq!(key_of(&cfg, &[("k", "fa")]).as_deref(), Some("d.k_f*"));
    assert_eq!(key_of(&cfg, &[("k", "x")]).as_deref(), Some("d.k"));
    assert_eq!(key_of(&cfg, &[("other", "x")]), None);
}

/// A level of more than `Level::SCAN_AT_MOST` nodes is searched through its index, a
/// smaller one by comparing in place: both give the same matches, Go's quirks included.
#[test]
fn small_and_indexed_levels_match_alike() {
    const QUIRKS: &str = r#"
  - key: a_b
    value: c
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: e
    value: ""
    rate_limit: {unit: second, requests_per_unit: 7}
"#;
    let small = format!("{ORDER}{QUIRKS}");
    let padding: String = (0..Level::SCAN_AT_MOST)
        .map(|i| format!("  - key: pad{i}\n    value: v\n"))
        .collect();
    let indexed = format!("{small}{padding}");
    let (small, indexed) = (config(&small), config(&indexed));
    let top = |c: &RateLimitConfig| c.domain("d").map_or(0, |d| d.root.nodes.len());
    assert!(top(&small) <= Level::SCAN_AT_MOST);
    assert!(top(&indexed) > Level::SCAN_AT_MOST);
    for entry in [
        ("k", "foobar"),
        ("k", "foobaz"),
        ("k", "fa"),
        ("k", "x"),
        ("k", ""),
        ("other", "x"),
        // Go probes "a_b_c" for both, which is the composite key of `a_b: c`.
        ("a", "b_c"),
        ("a_b", "c"),
        ("a_b", "d"),
        ("e", ""),
        ("e", "x"),
        ("", ""),
    ] {
        let expected = key_of(&small, &[entry]);
        assert_eq!(key_of(&indexed, &[entry]), expected, "{entry:?}");
    }
    assert_eq!(
        key_of(&small, &[("k", "foobar")]).as_deref(),
        Some("d.k_foobar")
    );
    assert_eq!(key_of(&small, &[("a", "b_c")]).as_deref(), Some("d.a_b_c"));
    // An empty YAML value is a key-only node, which any value of the key matches.
    assert_eq!(key_of(&small, &[("e", "")]).as_deref(), Some("d.e"));
    assert_eq!(key_of(&small, &[("e", "x")]).as_deref(), Some("d.e"));
}

#[test]
fn wildcards_are_tried_in_yaml_order() {
    // "foo*" comes first in the YAML, so it wins over "f*" for "foo1".
    let cfg = config(ORDER);
    assert_eq!(key_of(&cfg, &[("k", "foo1")]).as_deref(), Some("d.k_foo*"));
}

#[test]
fn many_wildcards_are_still_tried_in_yaml_order_whatever_their_prefixes() {
    // More patterns than a level scans (its wildcards are then grouped by their literal
    // prefix), with the first match in YAML order having a shorter prefix than a later one,
    // an empty prefix, and patterns of other prefixes and of other keys around them.
    let values = [
        "zz*", "foo1*x", "fo*", "foo*", "*9", "f*", "other*", "x*y", "a*", "b*", "c*", "foo1*",
    ];
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for v in values {
        yaml += &format!(
            "  - key: k\n    value: \"{v}\"\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n"
        );
    }
    yaml += "  - key: j\n    value: \"f*\"\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let cfg = config(&yaml);
    for (value, expected) in [
        ("foo1", Some("d.k_fo*")),
        ("foo1x", Some("d.k_foo1*x")),
        ("f", Some("d.k_f*")),
        ("129", Some("d.k_*9")),
        ("fo9", Some("d.k_fo*")),
        ("xay", Some("d.k_x*y")),
        ("xa", None),
        ("", None),
    ] {
        assert_eq!(
            key_of(&cfg, &[("k", value)]).as_deref(),
            expected,
            "{value}"
        );
    }
    assert_eq!(key_of(&cfg, &[("j", "fx")]).as_deref(), Some("d.j_f*"));
}

#[test]
fn mid_pattern_wildcards_match() {
    let cfg = config(
        "domain: d\ndescriptors:\n  - key: m\n    value: bar*b\n    rate_limit: {unit: minute, requests_per_unit: 20}\n",
    );
    assert_eq!(
        key_of(&cfg, &[("m", "barxyzb")]).as_deref(),
        Some("d.m_bar*b")
    );
    assert_eq!(key_of(&cfg, &[("m", "barb")]).as_deref(), Some("d.m_bar*b"));
    assert_eq!(key_of(&cfg, &[("m", "barxyzc")]), None);
}

const NESTED: &str = r#"
domain: d
descriptors:
  - key: a
    value: 1
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: b
        descriptors:
          - key: c
            value: 3
            rate_limit: {unit: hour, requests_per_unit: 3}
  - key: leaf
    rate_limit: {unit: day, requests_per_unit: 5}
"#;

#[test]
fn depth_rules() {
    let cfg = config(NESTED);
    // The limit of an intermediate node only applies when it is matched by the last entry.
    assert_eq!(key_of(&cfg, &[("a", "1")]).as_deref(), Some("d.a_1"));
    assert_eq!(key_of(&cfg, &[("a", "1"), ("b", "x")]), None);
    assert_eq!(
        key_of(&cfg, &[("a", "1"), ("b", "x"), ("c", "3")]).as_deref(),
        Some("d.a_1.b.c_3")
    );
    // More entries than config depth: no limit, even though "leaf" has one.
    assert_eq!(key_of(&cfg, &[("leaf", "x"), ("more", "y")]), None);
    // Unmatched middle entry stops matching.
    assert_eq!(key_of(&cfg, &[("a", "1"), ("zz", "x"), ("c", "3")]), None);
    assert_eq!(
        key_of(&cfg, &[("a", "1"), ("b", "x"), ("c", "3"), ("d", "4")]),
        None
    );
    assert!(look(&cfg, &[]).is_none());
}

#[test]
fn empty_value_falls_back_to_key_only() {
    let cfg = config(NESTED);
    assert_eq!(key_of(&cfg, &[("leaf", "")]).as_deref(), Some("d.leaf"));
}

#[test]
fn share_threshold_reports_patterns_with_star() {
    let cfg = config(
        r#"
domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user
    value: u*
    share_threshold: true
    descriptors:
      - key: res
        value: r*
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plain
    value: p*
    rate_limit: {unit: minute, requests_per_unit: 1}
"#,
    );
    let m = look(&cfg, &[("files", "files/a.pdf")]).expect("match");
    assert_eq!(m.shared_values, vec![(0, "files/*")]);
    assert_eq!(m.limit.full_key, "d.files_files/*");
    let m = look(&cfg, &[("user", "u1"), ("res", "r1")]).expect("match");
    assert_eq!(m.shared_values, vec![(0, "u*")]);
    let m = look(&cfg, &[("plain", "p1")]).expect("match");
    assert!(m.shared_values.is_empty());
    assert_eq!(m.shared_values.capacity(), 0);
}

#[test]
fn unlimited_and_flags() {
    let cfg = config(
        r#"
domain: d
descriptors:
  - key: u
    rate_limit: {unlimited: true, name: free, replaces: [{name: paid}]}
  - key: s
    shadow_mode: true
    quota_mode: true
    detailed_metric: true
    value_to_metric: true
    rate_limit: {unit: Minute, requests_per_unit: 7}
    metadata: {tier: gold, n: 1}
"#,
    );
    let u = look(&cfg, &[("u", "x")]).expect("match").limit;
    assert_eq!(u.rule, Rule::Unlimited);
    assert_eq!(u.name, "free");
    assert_eq!(u.replaces, vec!["paid".to_owned()]);
    let s = look(&cfg, &[("s", "x")]).expect("match").limit;
    assert_eq!(
        s.rule,
        Rule::Limited(Box::new([Block {
            quota: Quota::fixed(7, Unit::Minute),
            name: String::new(),
        }]))
    );
    assert!(s.shadow_mode && s.quota_mode && s.detailed_metric && s.value_to_metric);
    assert_eq!(
        s.metadata,
        Some(serde_json::json!({"tier": "gold", "n": 1}))
    );
}

#[test]
fn dump_is_sorted_and_formatted() {
    let cfg = config(
        r#"
domain: d
descriptors:
  - key: z
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: a
    rate_limit: {unlimited: true}
    descriptors:
      - key: b
        quota_mode: true
        rate_limit: {unit: week, requests_per_unit: 9}
"#,
    );
    assert_eq!(
        cfg.dump(),
        "d.a: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n\
             d.a.b: unit=WEEK requests_per_unit=9, shadow_mode: false, quota_mode: true\n\
             d.z: unit=SECOND requests_per_unit=5, shadow_mode: true, quota_mode: false\n"
    );
    assert_eq!(RateLimitConfig::empty().dump(), "");
}

#[test]
fn validation_messages() {
    assert_eq!(
        build_err("domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n"),
        "share_threshold can only be used with wildcard values (containing '*'), but found key 'k'"
    );
    assert_eq!(
        build_err("domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n"),
        "error parsing metadata: metadata must be a map, found '[a]'"
    );
    assert_eq!(
        build_err("domain: d\ndescriptors:\n  - key: k\n    metadata: {1: a}\n"),
        "error parsing metadata: key is not of type string: 1"
    );
    assert_eq!(
        build_err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown}\n"),
        "invalid rate limit unit 'unknown'"
    );
    assert_eq!(
        build_err(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, unlimited: true}\n"
        ),
        "should not specify rate limit unit when unlimited"
    );
    // Nested duplicates name the full path.
    assert_eq!(
        build_err(
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n"
        ),
        "duplicate descriptor composite key 'd.a.b'"
    );
}

#[test]
fn stats_keys_follow_detailed_metric_and_value_to_metric() {
    let cfg = config(
        r#"
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: svc
    value: s*
    value_to_metric: true
    descriptors:
      - key: ep
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value: u*
    share_threshold: true
    descriptors:
      - key: ep
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
"#,
    );
    let d = cfg.domain("d").expect("domain");
    let key = |e: &[(&str, &str)]| {
        let e: Vec<Entry> = e.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
        d.stats_key(&e)
    };
    assert_eq!(key(&[("plain", "x")]).as_deref(), Some("d.plain"));
    assert_eq!(key(&[("detailed", "x")]).as_deref(), Some("d.detailed_x"));
    // share_threshold keeps the pattern even with value_to_metric; key-only shows the value.
    assert_eq!(
        key(&[("route", "api/v1"), ("method", "GET")]).as_deref(),
        Some("d.route_api/*.method_GET")
    );
    assert_eq!(
        key(&[("svc", "s1"), ("ep", "e")]).as_deref(),
        Some("d.svc_s1.ep")
    );
    assert_eq!(
        key(&[("user", "u7"), ("ep", "e")]).as_deref(),
        Some("d.user_u*.ep_e")
    );
    assert_eq!(key(&[("nothing", "x")]), None);
}

#[test]
fn a_stats_key_is_one_counter_when_it_names_every_value() {
    let cfg = config(
        r#"
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: route
    value: api/*
    share_threshold: true
    descriptors:
      - key: method
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
      - key: verb
        value: GET
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: svc
    value: s*
    value_to_metric: true
    descriptors:
      - key: ep
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: path
    value: p*
    descriptors:
      - key: ep
        value: e
        rate_limit: {unit: minute, requests_per_unit: 60}
"#,
    );
    let one = |full_key: &str| {
        cfg.limits()
            .find(|l| l.full_key == full_key)
            .map(|l| l.stats_key_is_one_counter)
    };
    assert_eq!(
        one("d.plain"),
        Some(false),
        "key only: every value's counter"
    );
    assert_eq!(one("d.tenant_acme"), Some(true));
    assert_eq!(one("d.detailed"), Some(true), "the key shows the value");
    assert_eq!(
        one("d.route_api/*.method"),
        Some(true),
        "shared, then shown"
    );
    assert_eq!(one("d.route_api/*.verb_GET"), Some(true));
    assert_eq!(one("d.svc_s*.ep"), Some(false), "ep's value is left out");
    assert_eq!(one("d.path_p*.ep_e"), Some(false), "a wildcard's values");
}

#[test]
fn the_slowest_block_has_the_lowest_sustained_rate() {
    let cfg = config(
        r#"
domain: d
descriptors:
  - key: a
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 100}
      - {unit: hour, requests_per_unit: 6000}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5, unit_multiplier: 2}
  - key: c
    rate_limit: {unlimited: true}
"#,
    );
    let slowest = |full_key: &str| {
        let l = cfg.limits().find(|l| l.full_key == full_key)?;
        l.slowest_block()
            .map(|q| (q.requests_per_unit, q.unit, q.unit_multiplier))
    };
    // 10/s, 1.67/s and 1.67/s: the first of the two equals.
    assert_eq!(slowest("d.a"), Some((100, Unit::Minute, 1)));
    assert_eq!(slowest("d.b"), Some((5, Unit::Minute, 2)));
    assert_eq!(slowest("d.c"), None);
}

#[test]
fn extension_checks_come_after_go_checks() {
    // Go's unit check wins over ours, so Go-valid messages stay first.
    assert_eq!(
        build_err(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, unlimited: true, algorithm: x}\n"
        ),
        "should not specify rate limit unit when unlimited"
    );
    assert_eq!(
        build_err(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: bogus, algorithm: x, burst: 0}\n"
        ),
        "invalid rate limit unit 'bogus'"
    );
    // A bad algorithm is reported before what it would make of the burst.
    assert_eq!(
        build_err(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, algorithm: nope, burst: 0}\n"
        ),
        "invalid rate limit algorithm 'nope'"
    );
    // burst 0 on a window is the window error: no burst at all belongs there.
    assert_eq!(
        build_err(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, burst: 0}\n"
        ),
        "burst can only be used with token_bucket or leaky_bucket, not 'fixed_window'"
    );
    // Elements are checked in order, each completely.
    assert_eq!(
        build_err(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, replaces: [{name: ''}]}\n      - {unlimited: true}\n"
        ),
        "should not have an empty replaces entry"
    );
    assert_eq!(
        build_err(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, name: a, replaces: [{name: a}]}\n"
        ),
        "replaces should not contain name of same descriptor"
    );
}

#[test]
fn null_extension_keys_are_absent() {
    let cfg = config(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3, algorithm: null, burst: null}\n  - key: u\n    rate_limit: {unlimited: true, algorithm: null}\n    rate_limits: null\n",
    );
    assert_eq!(
        look(&cfg, &[("k", "x")]).expect("match").limit.rule,
        Rule::Limited(Box::new([Block {
            quota: Quota::fixed(3, Unit::Second),
            name: String::new(),
        }]))
    );
    assert_eq!(
        look(&cfg, &[("u", "x")]).expect("match").limit.rule,
        Rule::Unlimited
    );
}

#[test]
fn names_lists_each_name_once() {
    let cfg = config(
        r#"
domain: d
descriptors:
  - key: single
    rate_limit: {unit: second, requests_per_unit: 1, name: one}
  - key: free
    rate_limit: {unlimited: true, name: free}
  - key: unnamed
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 1, name: a, replaces: [{name: x}, {name: y}]}
      - {unit: minute, requests_per_unit: 10}
      - {unit: hour, requests_per_unit: 100, name: b, replaces: [{name: y}, {name: z}]}
      - {unit: day, requests_per_unit: 1000, name: a}
"#,
    );
    let names = |k: &str| -> Vec<String> {
        let m = look(&cfg, &[(k, "v")]).expect("match");
        m.limit.names().map(str::to_owned).collect()
    };
    assert_eq!(names("single"), ["one"]);
    assert_eq!(names("free"), ["free"]);
    assert!(names("unnamed").is_empty());
    assert_eq!(names("multi"), ["a", "b"]);
    let multi = look(&cfg, &[("multi", "v")]).expect("match").limit;
    assert_eq!(multi.name, "");
    assert_eq!(multi.replaces, ["x", "y", "z"]);
}

#[test]
fn failed_merge_is_rolled_back() {
    let mut b = Builder::new(&crate::config::LoadOptions {
        merge_domain_config: true,
        ..Default::default()
    });
    b.add_file(raw::parse("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap())
            .unwrap();
    let bad = raw::parse("domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: c\n    rate_limit: {unit: bogus}\n").unwrap();
    assert_eq!(
        b.add_file(bad).unwrap_err(),
        "invalid rate limit unit 'bogus'"
    );
    let cfg = b.finish();
    assert_eq!(cfg.limits().count(), 1);
    assert_eq!(key_of(&cfg, &[("b", "x")]), None);
}

#[test]
fn time_zones_put_windows_on_a_calendar_and_bad_ones_are_refused_by_name() {
    let cfg = config(
        r#"
domain: d
descriptors:
  - key: tokyo
    rate_limit: {unit: day, requests_per_unit: 5, time_zone: Asia/Tokyo}
  - key: weekly
    rate_limit: {unit: week, requests_per_unit: 5, time_zone: UTC, week_start: sunday}
  - key: monthly
    rate_limit: {unit: month, requests_per_unit: 5}
"#,
    );
    let calendar = |full_key: &str| {
        let l = cfg.limits().find(|l| l.full_key == full_key).unwrap();
        l.slowest_block().unwrap().calendar
    };
    assert_eq!(calendar("d.tokyo").name(), "Asia/Tokyo");
    assert_eq!(calendar("d.weekly").week_start(), Some("sunday"));
    assert!(calendar("d.monthly").is_epoch());
    // USE_CALENDAR_MONTH_RATE_LIMIT: a month without a zone is the Go service's calendar month.
    let mut b = Builder::new(&crate::config::LoadOptions {
        calendar_month: true,
        ..Default::default()
    });
    let month = "domain: d\ndescriptors:\n  - key: m\n    rate_limit: {unit: month, requests_per_unit: 5}\n";
    b.add_file(raw::parse(month).unwrap()).unwrap();
    let cfg = b.finish();
    let l = cfg.limits().next().unwrap();
    assert_eq!(
        l.slowest_block().unwrap().calendar,
        crate::limiter::Calendar::GO_MONTH
    );

    for (fields, message) in [
        (
            "unit: day, time_zone: Mars/Olympus_Mons",
            "unknown time_zone 'Mars/Olympus_Mons' (an IANA time zone name, such as 'Asia/Tokyo')",
        ),
        (
            "unit: hour, time_zone: Asia/Tokyo",
            "time_zone 'Asia/Tokyo' needs a unit of day, week, month or year, not hour",
        ),
        (
            "unit: day, time_zone: Asia/Tokyo, algorithm: token_bucket",
            "time_zone 'Asia/Tokyo' can only be used with fixed_window or sliding_window, not 'token_bucket'",
        ),
        (
            "unit: week, week_start: sunday",
            "week_start needs a time_zone (for UTC weeks, time_zone: UTC)",
        ),
        (
            "unit: day, time_zone: UTC, week_start: sunday",
            "week_start needs unit: week, not day",
        ),
        (
            "unit: week, time_zone: UTC, week_start: someday",
            "unknown week_start 'someday' (a day's English name, such as 'sunday')",
        ),
    ] {
        assert_eq!(block_err(fields), message, "{fields}");
    }
}

/// The error of a config whose one limit is `rate_limit: {requests_per_unit: 5, <fields>}`.
fn block_err(fields: &str) -> String {
    build_err(&format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{requests_per_unit: 5, {fields}}}\n"
    ))
}

/// Issue 52: `value_regex` ranks with the wildcards in YAML order, after an exact value and
/// before the key alone, and matches the whole value.
const PATTERNS: &str = r#"
domain: d
descriptors:
  - key: v
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: v
    value: v2
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: v
    value_regex: "v[0-9]+"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: v
    value: v*
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: v
    value_regex: "v[a-z]+"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: other
    value_regex: "v[0-9]+"
    descriptors:
      - key: tier
        value_regex: "gold|silver"
        rate_limit: {unit: second, requests_per_unit: 6}
"#;

#[test]
fn value_regex_ranks_with_wildcards_in_yaml_order_after_exact_values() {
    let cfg = config(PATTERNS);
    let key = |entries: &[(&str, &str)]| key_of(&cfg, entries);
    // Exact first, whatever the patterns say.
    assert_eq!(key(&[("v", "v2")]).as_deref(), Some("d.v_v2"));
    // The pattern comes before the wildcard in YAML order; the wildcard before the next one.
    assert_eq!(key(&[("v", "v17")]).as_deref(), Some("d.v~v[0-9]+"));
    assert_eq!(key(&[("v", "vabc")]).as_deref(), Some("d.v_v*"));
    // A full match only: "xv17" and "v17x" are not matched by `v[0-9]+`.
    assert_eq!(key(&[("v", "xv17")]).as_deref(), Some("d.v"));
    assert_eq!(key(&[("v", "v17x")]).as_deref(), Some("d.v_v*"));
    // Nested patterns, on their own keys.
    assert_eq!(
        key(&[("other", "v9"), ("tier", "gold")]).as_deref(),
        Some("d.other~v[0-9]+.tier~gold|silver")
    );
    assert_eq!(key(&[("other", "v9"), ("tier", "golden")]), None);
    // A value spelling the pattern's composite is no exact match of it.
    assert_eq!(key(&[("v", "~v[0-9]+")]).as_deref(), Some("d.v"));
}

#[test]
fn bad_value_regexes_are_refused_naming_the_pattern() {
    let one = |fields: &str| {
        build_err(&format!(
            "domain: d\ndescriptors:\n  - key: k\n    {fields}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        ))
    };
    let err = one("value_regex: \"v(\"");
    assert!(err.starts_with("invalid value_regex 'v(': "), "{err}");
    assert_eq!(
        one("value: a\n    value_regex: b"),
        "descriptor 'k' has both value and value_regex: give one"
    );
    let long = "a".repeat(5_000);
    let err = one(&format!("value_regex: \"{long}\""));
    assert!(err.contains("is 5000 bytes; the most is 4096"), "{err}");
    // Patterns too large once compiled: a big counted repetition.
    let err = one("value_regex: \"(\\\\w{100}){100}\"");
    assert!(err.starts_with("invalid value_regex"), "{err}");
    let twice = "domain: d\ndescriptors:\n  - key: k\n    value_regex: a+\n  - key: k\n    value_regex: a+\n";
    assert_eq!(build_err(twice), "duplicate value_regex 'a+' for key 'k'");
}

#[test]
fn many_value_regexes_on_a_key_match_in_one_set() {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for i in 0..2_000 {
        yaml.push_str(&format!(
            "  - key: tenant\n    value_regex: \"t{i}-[a-z]+\"\n    rate_limit: {{unit: second, requests_per_unit: {}}}\n",
            i + 1
        ));
    }
    let cfg = config(&yaml);
    let limit = |v: &str| {
        look(&cfg, &[("tenant", v)]).map(|m| m.limit.slowest_block().unwrap().requests_per_unit)
    };
    assert_eq!(limit("t0-abc"), Some(1));
    assert_eq!(limit("t1999-x"), Some(2_000));
    assert_eq!(limit("t1999-"), None);
}

/// Issue 52: `penalty_seconds` and `penalty_extends` on a block, and their mistakes.
#[test]
fn penalties_load_onto_their_block_and_bad_ones_are_refused() {
    let cfg = config(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3, penalty_seconds: 3}\n  - key: e\n    rate_limits:\n      - {unit: second, requests_per_unit: 3, penalty_seconds: 60, penalty_extends: true}\n      - {unit: hour, requests_per_unit: 100}\n",
    );
    let penalties = |k: &str| {
        look(&cfg, &[(k, "x")]).map(|m| match &m.limit.rule {
            crate::config::Rule::Limited(blocks) => {
                blocks.iter().map(|b| b.quota.penalty).collect::<Vec<_>>()
            }
            crate::config::Rule::Unlimited => Vec::new(),
        })
    };
    let p = |secs, extends| {
        Some(crate::limiter::Penalty {
            secs: std::num::NonZeroU32::new(secs).unwrap(),
            extends,
        })
    };
    assert_eq!(penalties("k"), Some(vec![p(3, false)]));
    assert_eq!(penalties("e"), Some(vec![p(60, true), None]));

    for (fields, message) in [
        (
            "penalty_seconds: 0",
            "penalty_seconds must be at least 1 (omit it for no penalty)",
        ),
        (
            "penalty_seconds: 31622401",
            "penalty_seconds 31622401 is longer than a year (31622400)",
        ),
        (
            "penalty_extends: true",
            "penalty_extends needs penalty_seconds",
        ),
    ] {
        assert_eq!(
            block_err(&format!("unit: second, {fields}")),
            message,
            "{fields}"
        );
    }
}
