//! Config fixtures: every error of envoyproxy/ratelimit's config tests, with its exact message,
//! and the valid fixtures with the lookups the Go tests make against them.

use sluice::config::{
    Block, ConfigErrors, LoadOptions, Matched, RateLimitConfig, Rule, parse_files,
};
use sluice::descriptor::Entry;
use sluice::limiter::{Algorithm, Quota, Unit};
use std::path::PathBuf;

fn fixture(name: &str) -> (String, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (name.to_owned(), text)
}

fn load(names: &[&str], merge: bool) -> Result<RateLimitConfig, ConfigErrors> {
    let files: Vec<_> = names.iter().map(|n| fixture(n)).collect();
    parse_files(
        &files,
        &LoadOptions {
            merge_domain_config: merge,
            without_slots: None,
            calendar_month: false,
        },
    )
}

fn error_of(names: &[&str], merge: bool) -> String {
    match load(names, merge) {
        Ok(_) => panic!("{names:?} should not load"),
        Err(e) => e.to_string(),
    }
}

fn ok(names: &[&str], merge: bool) -> RateLimitConfig {
    load(names, merge).unwrap_or_else(|e| panic!("{names:?}: {e}"))
}

fn lookup<'a>(cfg: &'a RateLimitConfig, entries: &[(&str, &str)]) -> Option<Matched<'a>> {
    let entries: Vec<Entry> = entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
    cfg.domain("test-domain")?.lookup(&entries)
}

fn limited(requests_per_unit: u32, unit: Unit) -> Rule {
    Rule::Limited(Box::new([Block {
        quota: Quota::fixed(requests_per_unit, unit),
        name: String::new(),
    }]))
}

fn rule_and_key(cfg: &RateLimitConfig, entries: &[(&str, &str)]) -> Option<(Rule, String)> {
    lookup(cfg, entries).map(|m| (m.limit.rule.clone(), m.limit.full_key.clone()))
}

#[test]
fn empty_domain() {
    assert_eq!(
        error_of(&["empty_domain.yaml"], false),
        "empty_domain.yaml: config file cannot have empty domain"
    );
}

#[test]
fn duplicate_domain() {
    assert_eq!(
        error_of(&["basic_config.yaml", "duplicate_domain.yaml"], false),
        "duplicate_domain.yaml: duplicate domain 'test-domain' in config file"
    );
}

#[test]
fn empty_key() {
    assert_eq!(
        error_of(&["empty_key.yaml"], false),
        "empty_key.yaml: descriptor has empty key"
    );
}

#[test]
fn duplicate_key() {
    assert_eq!(
        error_of(&["duplicate_key.yaml"], false),
        "duplicate_key.yaml: duplicate descriptor composite key 'test-domain.key1_value1'"
    );
}

#[test]
fn merge_same_file_twice_is_a_duplicate_key() {
    assert_eq!(
        error_of(&["merge_domain_key1.yaml", "merge_domain_key1.yaml"], true),
        "merge_domain_key1.yaml: duplicate descriptor composite key 'test-domain.key1_value1'"
    );
}

#[test]
fn merge_two_files_of_one_domain() {
    let cfg = ok(&["merge_domain_key1.yaml", "merge_domain_key2.yaml"], true);
    assert_eq!(cfg.domain_count(), 1);
    assert_eq!(
        rule_and_key(&cfg, &[("key1", "value1")]),
        Some((limited(10, Unit::Minute), "test-domain.key1_value1".into()))
    );
    assert_eq!(
        rule_and_key(&cfg, &[("key2", "value2")]),
        Some((limited(20, Unit::Minute), "test-domain.key2_value2".into()))
    );
    // Without merging, the second file is a duplicate domain.
    assert_eq!(
        error_of(&["merge_domain_key1.yaml", "merge_domain_key2.yaml"], false),
        "merge_domain_key2.yaml: duplicate domain 'test-domain' in config file"
    );
}

#[test]
fn bad_limit_unit() {
    assert_eq!(
        error_of(&["bad_limit_unit.yaml"], false),
        "bad_limit_unit.yaml: invalid rate limit unit 'foo'"
    );
}

#[test]
fn replaces_self() {
    assert_eq!(
        error_of(&["replaces_self.yaml"], false),
        "replaces_self.yaml: replaces should not contain name of same descriptor"
    );
}

#[test]
fn replaces_empty() {
    assert_eq!(
        error_of(&["replaces_empty.yaml"], false),
        "replaces_empty.yaml: should not have an empty replaces entry"
    );
}

#[test]
fn bad_yaml_names_the_position() {
    // go-yaml's wording differs from ours; the prefix and a position are what matter.
    let e = error_of(&["bad_yaml.yaml"], false);
    assert!(
        e.starts_with("bad_yaml.yaml: error loading config file: "),
        "{e}"
    );
    assert!(e.contains("line"), "{e}");
    assert!(e.contains("column"), "{e}");
}

#[test]
fn misspelled_keys() {
    assert_eq!(
        error_of(&["misspelled_key.yaml"], false),
        "misspelled_key.yaml: config error, unknown key 'ratelimit'"
    );
    assert_eq!(
        error_of(&["misspelled_key2.yaml"], false),
        "misspelled_key2.yaml: config error, unknown key 'requestsperunit'"
    );
}

#[test]
fn non_string_key() {
    assert_eq!(
        error_of(&["non_string_key.yaml"], false),
        "non_string_key.yaml: config error, key is not of type string: 0.25"
    );
}

#[test]
fn non_map_list() {
    assert_eq!(
        error_of(&["non_map_list.yaml"], false),
        "non_map_list.yaml: config error, yaml file contains list of type other than map: a"
    );
}

#[test]
fn unlimited_with_unit() {
    assert_eq!(
        error_of(&["unlimited_with_unit.yaml"], false),
        "unlimited_with_unit.yaml: should not specify rate limit unit when unlimited"
    );
}

#[test]
fn share_threshold_without_wildcard() {
    assert_eq!(
        error_of(&["share_threshold_no_wildcard.yaml"], false),
        "share_threshold_no_wildcard.yaml: share_threshold can only be used with wildcard values (containing '*'), but found key 'files_report.pdf'"
    );
}

#[test]
fn float_scalar() {
    assert_eq!(
        error_of(&["float_value.yaml"], false),
        "float_value.yaml: error checking config"
    );
}

#[test]
fn bad_metadata() {
    let e = error_of(&["bad_metadata.yaml"], false);
    assert!(
        e.starts_with("bad_metadata.yaml: error parsing metadata: "),
        "{e}"
    );
}

#[test]
fn all_bad_files_are_reported_together() {
    let err = load(
        &[
            "bad_limit_unit.yaml",
            "empty_domain.yaml",
            "misspelled_key.yaml",
            "basic_config.yaml",
        ],
        false,
    )
    .expect_err("bad");
    let names: Vec<&str> = err.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "misspelled_key.yaml",
            "bad_limit_unit.yaml",
            "empty_domain.yaml"
        ],
        "parse errors of every file come before load errors, as in Go"
    );
}

#[test]
fn basic_config_lookups() {
    let cfg = ok(&["basic_config.yaml"], false);
    assert!(cfg.domain("foo_domain").is_none());
    assert!(lookup(&cfg, &[]).is_none());
    assert!(lookup(&cfg, &[("key1", "something")]).is_none());
    assert!(lookup(&cfg, &[("key1", "value1")]).is_none());
    assert!(lookup(&cfg, &[("key2", "value2"), ("subkey", "subvalue")]).is_none());
    assert!(lookup(&cfg, &[("key5", "value5"), ("subkey5", "subvalue")]).is_none());
    assert_eq!(
        rule_and_key(&cfg, &[("key1", "value1"), ("subkey1", "something")]),
        Some((
            limited(5, Unit::Second),
            "test-domain.key1_value1.subkey1".into()
        ))
    );
    assert_eq!(
        rule_and_key(&cfg, &[("key1", "value1"), ("subkey1", "subvalue1")]),
        Some((
            limited(10, Unit::Second),
            "test-domain.key1_value1.subkey1_subvalue1".into()
        ))
    );
    assert_eq!(
        rule_and_key(&cfg, &[("key2", "something")]),
        Some((limited(20, Unit::Minute), "test-domain.key2".into()))
    );
    assert_eq!(
        rule_and_key(&cfg, &[("key2", "value2")]),
        Some((limited(30, Unit::Minute), "test-domain.key2_value2".into()))
    );
    assert!(lookup(&cfg, &[("key2", "value3")]).is_none());
    assert_eq!(
        rule_and_key(&cfg, &[("key3", "foo")]),
        Some((limited(1, Unit::Hour), "test-domain.key3".into()))
    );
    assert_eq!(
        rule_and_key(&cfg, &[("key4", "foo")]),
        Some((limited(1, Unit::Day), "test-domain.key4".into()))
    );
    assert_eq!(
        rule_and_key(&cfg, &[("key5", "value5")]),
        Some((limited(15, Unit::Day), "test-domain.key5_value5".into()))
    );
    assert_eq!(
        rule_and_key(&cfg, &[("key5", "value5"), ("subkey5", "subvalue5")]),
        Some((
            limited(25, Unit::Day),
            "test-domain.key5_value5.subkey5_subvalue5".into()
        ))
    );
}

#[test]
fn shadow_mode_config() {
    let cfg = ok(&["shadowmode_config.yaml"], false);
    let shadow = |e: &[(&str, &str)]| lookup(&cfg, e).map(|m| m.limit.shadow_mode);
    assert_eq!(shadow(&[("key1", "value1"), ("subkey1", "x")]), Some(true));
    assert_eq!(
        shadow(&[("key1", "value1"), ("subkey1", "subvalue1")]),
        Some(false)
    );
    assert_eq!(shadow(&[("key2", "x")]), Some(true));
    assert_eq!(shadow(&[("key2", "value2")]), Some(false));
    assert!(cfg.dump().contains(
        "test-domain.key2: unit=MINUTE requests_per_unit=20, shadow_mode: true, quota_mode: false\n"
    ));
}

#[test]
fn wildcard_config() {
    let cfg = ok(&["wildcard.yaml"], false);
    let key = |e: &[(&str, &str)]| lookup(&cfg, e).map(|m| m.limit.full_key.clone());
    assert_eq!(
        key(&[("wild", "foo1")]).as_deref(),
        Some("test-domain.wild_foo*")
    );
    assert_eq!(
        key(&[("wild", "foo")]).as_deref(),
        Some("test-domain.wild_foo*")
    );
    assert_eq!(key(&[("wild", "bar")]), None);
    assert_eq!(
        key(&[("noWild", "foo")]).as_deref(),
        Some("test-domain.noWild_foo")
    );
    assert_eq!(key(&[("noWild", "foo1")]), None);
    assert_eq!(
        key(&[("noVal", "anything")]).as_deref(),
        Some("test-domain.noVal")
    );
    assert_eq!(
        key(&[("midWild", "barxb")]).as_deref(),
        Some("test-domain.midWild_bar*b")
    );
    assert_eq!(key(&[("midWild", "barxc")]), None);
    assert_eq!(
        key(&[("nested", "value"), ("inner", "xyz")]).as_deref(),
        Some("test-domain.nested_val*.inner_x*")
    );
    assert_eq!(key(&[("nested", "value"), ("inner", "y")]), None);
}

#[test]
fn share_threshold_config() {
    let cfg = ok(&["share_threshold.yaml"], false);
    let a = lookup(&cfg, &[("files", "files/a.pdf")]).expect("match");
    let b = lookup(&cfg, &[("files", "files/b.csv")]).expect("match");
    assert!(std::ptr::eq(a.limit, b.limit));
    assert_eq!(a.limit.rule, limited(10, Unit::Hour));
    assert_eq!(a.shared_values, vec![(0, "files/*")]);
    assert_eq!(b.shared_values, vec![(0, "files/*")]);

    let m = lookup(
        &cfg,
        &[("user", "user/1"), ("resource", "res/9"), ("action", "get")],
    )
    .expect("match");
    assert_eq!(m.shared_values, vec![(0, "user/*"), (1, "res/*")]);
    assert_eq!(m.limit.rule, limited(150, Unit::Minute));

    // The explicit value wins and is not shared.
    let m = lookup(&cfg, &[("file", "test1")]).expect("match");
    assert_eq!(m.limit.rule, limited(50, Unit::Minute));
    assert!(m.shared_values.is_empty());
    let m = lookup(&cfg, &[("file", "test2")]).expect("match");
    assert_eq!(m.limit.rule, limited(100, Unit::Minute));
    assert_eq!(m.shared_values, vec![(0, "test*")]);
}

#[test]
fn metadata_config() {
    let cfg = ok(&["metadata.yaml"], false);
    let m = lookup(&cfg, &[("key1", "value1"), ("subkey1", "x")]).expect("match");
    assert_eq!(
        m.limit.metadata,
        Some(serde_json::json!({"name": "service_1"}))
    );
    let m = lookup(&cfg, &[("key1", "value1"), ("subkey1", "subvalue1")]).expect("match");
    assert_eq!(m.limit.metadata, None);
    let m = lookup(&cfg, &[("key2", "x")]).expect("match");
    assert_eq!(
        m.limit.metadata,
        Some(serde_json::json!({
            "service_with_quota": {"name": "service_2", "weight": 3, "ratio": 0.5, "tags": ["a", "b"]}
        }))
    );
}

// Sluice extensions: `algorithm`, `burst`, `charge_refused`, `unit_multiplier`, `rate_limits`.

/// Each file of a Sluice extension's mistake, and the error it gets.
const EXTENSION_ERRORS: &[(&str, &str)] = &[
    (
        "algorithm_unknown.yaml",
        "invalid rate limit algorithm 'token-bucket'",
    ),
    (
        "algorithm_wrong_case.yaml",
        "invalid rate limit algorithm 'Token_Bucket'",
    ),
    (
        "burst_fixed_window.yaml",
        "burst can only be used with token_bucket or leaky_bucket, not 'fixed_window'",
    ),
    (
        "burst_sliding_window.yaml",
        "burst can only be used with token_bucket or leaky_bucket, not 'sliding_window'",
    ),
    (
        "burst_zero.yaml",
        "burst must be at least 1 (omit it for the default)",
    ),
    (
        "rate_limit_and_rate_limits.yaml",
        "descriptor cannot have both rate_limit and rate_limits",
    ),
    ("rate_limits_empty.yaml", "rate_limits must not be empty"),
    (
        "rate_limits_unlimited.yaml",
        "unlimited is not allowed inside rate_limits",
    ),
    (
        "unlimited_with_algorithm.yaml",
        "should not specify algorithm, burst, charge_refused, unit_multiplier, safe_capacity, \
             time_zone, week_start, penalty_seconds or penalty_extends when unlimited",
    ),
    (
        "unlimited_with_burst.yaml",
        "should not specify algorithm, burst, charge_refused, unit_multiplier, safe_capacity, \
             time_zone, week_start, penalty_seconds or penalty_extends when unlimited",
    ),
    (
        "unlimited_with_charge_refused.yaml",
        "should not specify algorithm, burst, charge_refused, unit_multiplier, safe_capacity, \
             time_zone, week_start, penalty_seconds or penalty_extends when unlimited",
    ),
    (
        "charge_refused_false_fixed_window.yaml",
        "charge_refused cannot be false for 'fixed_window', which counts every hit as the \
             Go service does (choose another algorithm to drop refused hits)",
    ),
    (
        "safe_capacity_zero.yaml",
        "safe_capacity must be at least 1 (omit it for the limit divided by the number of peers)",
    ),
    (
        "safe_capacity_over_limit.yaml",
        "safe_capacity 11 is more than the limit (10 requests_per_unit): it is what one peer \
             may admit alone, a part of the limit",
    ),
    (
        "unit_multiplier_zero.yaml",
        "unit_multiplier must be at least 1 (omit it for 1)",
    ),
    (
        "unit_multiplier_overflow.yaml",
        "unit_multiplier 200 makes a window of 6307200000 seconds; the most is 4294967295 \
             (about 136 years)",
    ),
    (
        "unit_multiplier_negative.yaml",
        "error loading config file: invalid value: integer `-5`, expected u32",
    ),
    (
        "charge_refused_not_bool.yaml",
        "error loading config file: invalid value: string \"sometimes\", expected a bool",
    ),
    (
        "rate_limits_bad_unit.yaml",
        "invalid rate limit unit 'fortnight'",
    ),
    (
        "rate_limits_burst_fixed_window.yaml",
        "burst can only be used with token_bucket or leaky_bucket, not 'fixed_window'",
    ),
    (
        "rate_limits_replaces_sibling.yaml",
        "replaces should not contain name of same descriptor",
    ),
    (
        "rate_limits_replaces_empty.yaml",
        "should not have an empty replaces entry",
    ),
    (
        "misspelled_algorithm_key.yaml",
        "config error, unknown key 'algoritm'",
    ),
];

#[test]
fn extension_errors() {
    for (file, message) in EXTENSION_ERRORS {
        assert_eq!(error_of(&[file], false), format!("{file}: {message}"));
    }
}

fn blocks_of(cfg: &RateLimitConfig, entries: &[(&str, &str)]) -> Vec<Block> {
    match &lookup(cfg, entries).expect("match").limit.rule {
        Rule::Limited(blocks) => blocks.to_vec(),
        Rule::Unlimited => panic!("{entries:?} is unlimited"),
    }
}

fn quota(rpu: u32, unit: Unit, algorithm: Algorithm, burst: Option<u32>) -> Quota {
    Quota {
        penalty: None,
        safe_capacity: None,
        requests_per_unit: rpu,
        unit,
        algorithm,
        burst: burst.map(|b| std::num::NonZeroU32::new(b).expect("non-zero")),
        charge_refused: false,
        unit_multiplier: 1,
        calendar: sluice::limiter::Calendar::EPOCH,
    }
}

#[test]
fn every_algorithm_loads() {
    let cfg = ok(&["algorithms.yaml"], false);
    let one = |entries: &[(&str, &str)]| {
        let blocks = blocks_of(&cfg, entries);
        assert_eq!(blocks.len(), 1, "{entries:?}");
        blocks[0].clone()
    };
    assert_eq!(
        one(&[("fixed", "x")]).quota,
        quota(10, Unit::Second, Algorithm::FixedWindow, None)
    );
    assert_eq!(
        one(&[("sliding", "x")]).quota,
        quota(60, Unit::Minute, Algorithm::SlidingWindow, None)
    );
    assert_eq!(
        one(&[("token", "x")]).quota,
        quota(10, Unit::Second, Algorithm::TokenBucket, None)
    );
    assert_eq!(
        one(&[("token", "burst")]),
        Block {
            quota: quota(10, Unit::Second, Algorithm::TokenBucket, Some(20)),
            name: "token_burst".into(),
        }
    );
    assert_eq!(
        one(&[("leaky", "x")]).quota,
        quota(5, Unit::Second, Algorithm::LeakyBucket, None)
    );
    assert_eq!(
        one(&[("leaky", "burst")]).quota,
        quota(30, Unit::Minute, Algorithm::LeakyBucket, Some(3))
    );
    let charged = |algorithm| Quota {
        charge_refused: true,
        ..quota(100, Unit::Minute, algorithm, None)
    };
    assert_eq!(
        one(&[("tokens", "x")]).quota,
        charged(Algorithm::TokenBucket)
    );
    assert_eq!(
        one(&[("tokens", "sliding")]).quota,
        charged(Algorithm::SlidingWindow)
    );
    let five = |algorithm| Quota {
        unit_multiplier: 5,
        ..quota(100, Unit::Minute, algorithm, None)
    };
    assert_eq!(
        one(&[("five_minutes", "x")]).quota,
        five(Algorithm::FixedWindow)
    );
    assert_eq!(
        one(&[("five_minutes", "bucket")]).quota,
        five(Algorithm::TokenBucket)
    );
    assert_eq!(five(Algorithm::FixedWindow).window().secs(), 300);
    // A fixed window charges refused hits anyway; `charge_refused: true` there is kept, as it
    // also exempts the limit from what holds refused hits back (the local over-limit cache,
    // the STOP flag, leases).
    let fixed = one(&[("tokens", "fixed")]).quota;
    assert_eq!(fixed, charged(Algorithm::FixedWindow));
    assert!(fixed.charges_refused());
    assert!(Quota::fixed(100, Unit::Minute).charges_refused());
    assert!(!quota(1, Unit::Second, Algorithm::TokenBucket, None).charges_refused());
    // A single `rate_limit` keeps its name on the limit too, as in Go.
    let l = lookup(&cfg, &[("token", "burst")]).expect("match").limit;
    assert_eq!(l.name, "token_burst");
    assert_eq!(l.names().collect::<Vec<_>>(), vec!["token_burst"]);

    assert_eq!(
        cfg.dump(),
        "test-domain.five_minutes: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false, unit_multiplier: 5\n\
         test-domain.five_minutes_bucket: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false, algorithm: token_bucket, unit_multiplier: 5\n\
         test-domain.fixed: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false\n\
         test-domain.leaky: unit=SECOND requests_per_unit=5, shadow_mode: false, quota_mode: false, algorithm: leaky_bucket\n\
         test-domain.leaky_burst: unit=MINUTE requests_per_unit=30, shadow_mode: true, quota_mode: false, algorithm: leaky_bucket, burst: 3\n\
         test-domain.sliding: unit=MINUTE requests_per_unit=60, shadow_mode: false, quota_mode: false, algorithm: sliding_window\n\
         test-domain.token: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false, algorithm: token_bucket\n\
         test-domain.token_burst: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false, algorithm: token_bucket, burst: 20\n\
         test-domain.tokens: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false, algorithm: token_bucket, charge_refused: true\n\
         test-domain.tokens_fixed: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false, charge_refused: true\n\
         test-domain.tokens_sliding: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false, algorithm: sliding_window, charge_refused: true\n"
    );
}

#[test]
fn rate_limits_enforce_every_block() {
    let cfg = ok(&["rate_limits.yaml"], false);
    assert_eq!(
        blocks_of(&cfg, &[("api_key", "k1")]),
        vec![
            Block {
                quota: quota(10, Unit::Second, Algorithm::TokenBucket, Some(20)),
                name: "per_second".into(),
            },
            Block {
                quota: Quota::fixed(10_000, Unit::Day),
                name: "per_day".into(),
            },
        ]
    );
    let l = lookup(&cfg, &[("api_key", "k1")]).expect("match").limit;
    assert_eq!(l.full_key, "test-domain.api_key");
    assert_eq!(l.name, "");
    assert_eq!(l.names().collect::<Vec<_>>(), vec!["per_second", "per_day"]);
    assert_eq!(l.replaces, vec!["default_second", "default_day"]);

    // A one-element list, unnamed: the descriptor-level flags still apply.
    let m = lookup(&cfg, &[("api_key", "anonymous")]).expect("match");
    assert_eq!(m.limit.rule, limited(5, Unit::Minute));
    assert!(m.limit.quota_mode);
    assert_eq!(m.limit.names().count(), 0);

    assert_eq!(
        cfg.dump(),
        "test-domain.api_key: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false, algorithm: token_bucket, burst: 20\n\
         test-domain.api_key: unit=DAY requests_per_unit=10000, shadow_mode: false, quota_mode: false\n\
         test-domain.api_key_anonymous: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: true\n\
         test-domain.fallback: unit=SECOND requests_per_unit=1, shadow_mode: false, quota_mode: false\n"
    );
}

/// `algorithm: concurrency`: accepted where the other algorithms are (with `unit_multiplier`
/// and beside another block, with or without `charge_refused`); refused above the slots a
/// counter may hold or with a burst; and by a store that keeps no slots, naming the
/// descriptor and the store.
#[test]
fn concurrency_limits_and_where_they_cannot_apply() {
    let text = |rl: &str| {
        vec![(
            "c.yaml".to_owned(),
            format!(
                "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: api\n        {rl}\n"
            ),
        )]
    };
    let plain = LoadOptions::default();
    let good = "rate_limits:\n          - {unit: second, unit_multiplier: 5, requests_per_unit: 3, algorithm: concurrency}\n          - {unit: hour, requests_per_unit: 100}";
    let cfg = parse_files(&text(good), &plain).expect("loads");
    let d = cfg.domain("d").unwrap();
    let entries = [Entry::new("k", "x"), Entry::new("api", "y")];
    let m = d.lookup(&entries).expect("matches");
    let Rule::Limited(blocks) = &m.limit.rule else {
        panic!("limited")
    };
    assert_eq!(blocks[0].quota.algorithm, Algorithm::Concurrency);
    assert_eq!(blocks[0].quota.window().secs(), 5);
    let refused = |rl: &str, opts: &LoadOptions| {
        parse_files(&text(rl), opts)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert_eq!(
        refused(
            "rate_limit: {unit: second, requests_per_unit: 65537, algorithm: concurrency}",
            &plain
        ),
        "c.yaml: requests_per_unit 65537 is more slots than a concurrency limit may hold (at most 65536)"
    );
    // Refused starts are a debt by default; `charge_refused: false` keeps none.
    assert!(blocks[0].quota.charge_refused);
    let lean = "rate_limit: {unit: second, requests_per_unit: 3, algorithm: concurrency, charge_refused: false}";
    let cfg = parse_files(&text(lean), &plain).expect("loads");
    let m = cfg.domain("d").unwrap().lookup(&entries).expect("matches");
    let Rule::Limited(blocks) = &m.limit.rule else {
        panic!("limited")
    };
    assert!(!blocks[0].quota.charge_refused);
    assert!(
        refused(
            "rate_limit: {unit: second, requests_per_unit: 3, algorithm: concurrency, burst: 2}",
            &plain
        )
        .contains("burst can only be used with token_bucket or leaky_bucket, not 'concurrency'")
    );
    let memcache = LoadOptions {
        without_slots: Some("BACKEND_TYPE=memcache"),
        ..LoadOptions::default()
    };
    assert_eq!(
        refused(good, &memcache),
        "c.yaml: descriptor 'api' uses 'algorithm: concurrency', which BACKEND_TYPE=memcache cannot count (its slots need the memory, Redis or peer-cluster backend)"
    );
    assert!(
        parse_files(
            &text("rate_limit: {unit: second, requests_per_unit: 3}"),
            &memcache
        )
        .is_ok()
    );
}
