//! Metrics end to end: a known sequence of requests, then the Prometheus exposition on the
//! debug port (and on its own listener) has the expected values, passes `promtool check
//! metrics`, and stays within the stats key cap under a flood of unique values.
//!
//! `promtool` comes from Debian's `prometheus` package (scripts/test.sh installs it). Under CI
//! (`CI=true`) a missing promtool fails the test; elsewhere the check is skipped loudly.

use std::sync::Arc;

use sluice::clock::{ManualClock, Timestamp};
use sluice::config::{ConfigHandle, LoadOptions, parse_files};
use sluice::descriptor::{Descriptor, Entry, LimitOverride, Request};
use sluice::limiter::Unit;
use sluice::service::{RateLimitService, ServiceOptions};
use sluice::store::MemoryStore;
use sluice::telemetry::limits::limit_table;
use sluice::telemetry::prometheus::{BreakerGauges, Extra, StoreReport, render};
use sluice::telemetry::{DecisionTelemetry, Stats, StatsOptions};
use sluice_test_support::app::{default_options, start_with};
use sluice_test_support::http::http_async;
use sluice_test_support::{app, process};

const CONFIG: &str = r#"
domain: test
descriptors:
  - key: k
    value: v
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: outer
    descriptors:
      - key: inner
        descriptors:
          - key: deepest
            rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: ip
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
"#;

fn config() -> ConfigHandle {
    app::config_from_yaml(CONFIG)
}

fn json(domain: &str, entries: &[(&str, &str)]) -> String {
    let entries: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!(r#"{{"key":"{k}","value":"{v}"}}"#))
        .collect();
    format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{}]}}]}}"#,
        entries.join(",")
    )
}

/// The value of the one sample line that starts with `series` (name and labels), if any.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, step by step; to split next"
)]
async fn a_known_sequence_gives_the_go_stats_on_metrics() {
    let mut options = default_options();
    options.service = ServiceOptions::default();
    let mut running = start_with(config(), options).await;

    // k=v, limit 10, near threshold 8: 12 calls are 10 within (2 of them near) and 2 over.
    for _ in 0..12 {
        http_async(running.http, "POST", "/json", &json("test", &[("k", "v")])).await;
    }
    // Shadow rule, limit 1: 3 calls answer OK but count 2 over and 2 shadow.
    for _ in 0..3 {
        let r = http_async(
            running.http,
            "POST",
            "/json",
            &json("test", &[("shadow", "x")]),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    // Three levels: labelled by the first two, as the Go mapping does.
    http_async(
        running.http,
        "POST",
        "/json",
        &json("test", &[("outer", "a"), ("inner", "b"), ("deepest", "c")]),
    )
    .await;
    // detailed_metric: the request's value is in the key; an IPv4 address is sanitised.
    http_async(
        running.http,
        "POST",
        "/json",
        &json("test", &[("user", "alice")]),
    )
    .await;
    http_async(
        running.http,
        "POST",
        "/json",
        &json("test", &[("ip", "10.1.2.3")]),
    )
    .await;
    // Unknown domain twice; an empty domain is a service error.
    for _ in 0..2 {
        http_async(running.http, "POST", "/json", &json("nope", &[("k", "v")])).await;
    }
    let r = http_async(running.http, "POST", "/json", &json("", &[("k", "v")])).await;
    assert_eq!(r.status, 400);

    let r = http_async(running.debug, "GET", "/metrics", "").await;
    assert_eq!(r.status, 200);
    assert!(
        r.headers.contains("text/plain; version=0.0.4"),
        "{}",
        r.headers
    );
    let text = r.body;
    let kv = r#"{domain="test",key1="k_v"}"#;
    for (stat, want) in [
        ("total_hits", 12.0),
        ("within_limit", 10.0),
        ("near_limit", 2.0),
        ("over_limit", 2.0),
        ("shadow_mode", 0.0),
        ("over_limit_with_local_cache", 0.0),
    ] {
        let series = format!("ratelimit_service_rate_limit_{stat}{kv}");
        assert_eq!(value(&text, &series), Some(want), "{series}\n{text}");
    }
    let shadow = r#"{domain="test",key1="shadow"}"#;
    for (stat, want) in [
        ("total_hits", 3.0),
        ("within_limit", 1.0),
        ("over_limit", 2.0),
        ("shadow_mode", 2.0),
    ] {
        let series = format!("ratelimit_service_rate_limit_{stat}{shadow}");
        assert_eq!(value(&text, &series), Some(want), "{series}\n{text}");
    }
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_rate_limit_total_hits{domain="test",key1="outer",key2="inner"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_rate_limit_total_hits{domain="test",key1="user_alice"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_rate_limit_total_hits{domain="test",key1="ip_10_1_2_3"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_rate_limit_domain_not_found{domain="nope"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_should_rate_limit_error{err_type="service_error"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_should_rate_limit_error{err_type="redis_error"}"#
        ),
        Some(0.0)
    );
    // 12 + 3 + 1 + 1 + 1 + 2 + 1 calls reached the service.
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#
        ),
        Some(21.0)
    );
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}"#
        ),
        Some(21.0)
    );
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="+Inf"}"#
        ),
        Some(21.0)
    );
    assert_eq!(value(&text, "sluice_memory_live_counters"), Some(5.0));
    // Five counters, each charged its key plus 112 bytes.
    let used = value(&text, "sluice_memory_used_bytes").unwrap();
    assert!((5.0 * 113.0..5.0 * 200.0).contains(&used), "{used}");
    assert_eq!(
        value(&text, "sluice_memory_budget_bytes"),
        Some(f64::from(256 << 20))
    );
    assert_eq!(value(&text, "sluice_stats_keys"), Some(6.0));
    process::promtool_check(&text);

    let _ = running.shutdown.take().map(|tx| tx.send(()));
}

/// The series `labels` (`domain=…,key1=…`) counts against the limit `limit`: its limit gauge
/// and `counters` label, and the limit's window gauge (one per limit) and `unit_multiplier`.
fn limit_of(text: &str, labels: &str, limit: &str) -> Option<(f64, &'static str, f64, String)> {
    let counters = ["one", "many"].into_iter().find(|c| {
        text.contains(&format!(
            r#"ratelimit_service_rate_limit_limit{{{labels},limit="{limit}",counters="{c}"}}"#
        ))
    })?;
    let rpu = value(
        text,
        &format!(
            r#"ratelimit_service_rate_limit_limit{{{labels},limit="{limit}",counters="{counters}"}}"#
        ),
    )?;
    let window = text.lines().find_map(|l| {
        l.strip_prefix(&format!(
            r#"sluice_rate_limit_window_seconds{{limit="{limit}","#
        ))
    })?;
    let (tail, secs) = window.rsplit_once(' ')?;
    Some((rpu, counters, secs.parse().ok()?, tail.to_owned()))
}

#[tokio::test]
async fn each_series_has_its_configured_limit_and_follows_reloads() {
    let handle = config();
    let mut running = start_with(handle.clone(), default_options()).await;
    for entries in [
        &[("k", "v")][..],
        &[("outer", "a"), ("inner", "b"), ("deepest", "c")],
        &[("user", "alice")],
        &[("user", "bob")],
        &[("ip", "10.1.2.3")],
    ] {
        http_async(running.http, "POST", "/json", &json("test", entries)).await;
    }
    let overridden = r#"{"domain":"test","descriptors":[{"entries":[{"key":"o","value":"1"}],"limit":{"requestsPerUnit":42,"unit":"HOUR"}}]}"#;
    http_async(running.http, "POST", "/json", overridden).await;

    let text = http_async(running.debug, "GET", "/metrics", "").await.body;
    let minute = r#"unit="MINUTE",unit_multiplier="1",algorithm="fixed_window"}"#;
    let kv = r#"domain="test",key1="k_v""#;
    assert_eq!(
        limit_of(&text, kv, "test.k_v"),
        Some((10.0, "one", 60.0, minute.to_owned())),
        "{text}"
    );
    // Key-only levels: one series sums every value's counter.
    let outer = r#"domain="test",key1="outer",key2="inner""#;
    assert_eq!(
        limit_of(&text, outer, "test.outer.inner.deepest"),
        Some((5.0, "many", 60.0, minute.to_owned())),
        "{text}"
    );
    // Two values of one limit: a limit gauge each, one window for the limit.
    for labels in [
        r#"domain="test",key1="user_alice""#,
        r#"domain="test",key1="user_bob""#,
    ] {
        assert_eq!(
            limit_of(&text, labels, "test.user"),
            Some((1000.0, "one", 60.0, minute.to_owned())),
            "{text}"
        );
    }
    assert_eq!(
        text.matches(r#"sluice_rate_limit_window_seconds{limit="test.user","#)
            .count(),
        1
    );
    let ip = r#"domain="test",key1="ip_10_1_2_3""#;
    assert_eq!(limit_of(&text, ip, "test.ip").map(|l| l.0), Some(1000.0));
    // An override is a limit of its own, named by its stats key.
    let o = r#"domain="test",key1="o_1""#;
    assert_eq!(
        limit_of(&text, o, "test.o_1"),
        Some((
            42.0,
            "one",
            3600.0,
            r#"unit="HOUR",unit_multiplier="1",algorithm="fixed_window"}"#.to_owned()
        )),
        "{text}"
    );
    assert!(
        !text.contains(r#"limit="test.shadow""#),
        "a limit with no stats has no series"
    );
    process::promtool_check(&text);

    a_reload_moves_the_limit_gauges(&handle, running.debug).await;
    let _ = running.shutdown.take().map(|tx| tx.send(()));
}

/// A reload that changes k=v and removes the deep limit: the next scrape follows it, and the
/// counters stay.
async fn a_reload_moves_the_limit_gauges(handle: &ConfigHandle, debug: std::net::SocketAddr) {
    let kv = r#"domain="test",key1="k_v""#;
    let outer = r#"domain="test",key1="outer",key2="inner""#;
    let changed = CONFIG
        .replace(
            "requests_per_unit: 10}",
            "requests_per_unit: 30, unit_multiplier: 2}",
        )
        .replace("key: deepest", "key: other");
    handle.store(
        parse_files(
            &[("test.yaml".to_string(), changed)],
            &LoadOptions::default(),
        )
        .unwrap(),
    );
    let text = http_async(debug, "GET", "/metrics", "").await.body;
    assert_eq!(
        limit_of(&text, kv, "test.k_v"),
        Some((
            30.0,
            "one",
            120.0,
            r#"unit="MINUTE",unit_multiplier="2",algorithm="fixed_window"}"#.to_owned()
        )),
        "{text}"
    );
    assert_eq!(limit_of(&text, outer, "test.outer.inner.deepest"), None);
    assert!(
        !text.contains(r#"limit="test.outer.inner.deepest""#),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            &format!("ratelimit_service_rate_limit_total_hits{{{outer}}}")
        ),
        Some(1.0),
        "the counters stay"
    );
    process::promtool_check(&text);
}

#[tokio::test]
async fn use_prometheus_serves_the_exposition_on_its_own_listener() {
    let listeners = sluice::app::Listeners {
        prometheus: Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()),
        ..sluice::app::Listeners::ephemeral().await.unwrap()
    };
    let http_addr = listeners.http.local_addr().unwrap();
    let prom_addr = listeners.prometheus.as_ref().unwrap().local_addr().unwrap();
    let mut options = default_options();
    options.telemetry.prometheus_path = "/custom".into();
    let clock = ManualClock::new(Timestamp::from_secs(1_000_000_020));
    let app = sluice::app::App::new(options, config(), Arc::new(clock))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(app.serve(listeners, async move {
        let _ = rx.await;
    }));
    http_async(http_addr, "POST", "/json", &json("test", &[("k", "v")])).await;
    let r = http_async(prom_addr, "GET", "/custom", "").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        value(
            &r.body,
            r#"ratelimit_service_rate_limit_total_hits{domain="test",key1="k_v"}"#
        ),
        Some(1.0),
        "{}",
        r.body
    );
    assert_eq!(
        http_async(prom_addr, "GET", "/metrics", "").await.status,
        404
    );
    let _ = tx.send(());
    let _ = task.await;
}

/// `svc` reporting to telemetry that records into `stats`, and those stats.
fn observed(
    svc: RateLimitService<MemoryStore>,
    stats: Stats,
) -> (RateLimitService<MemoryStore>, Arc<Stats>) {
    let stats = Arc::new(stats);
    let tracer = Arc::new(sluice::telemetry::otlp::Tracer::disabled());
    let telemetry = DecisionTelemetry::new(stats.clone(), tracer);
    (svc.with_observer(Arc::new(telemetry)), stats)
}

fn unobserved() -> RateLimitService<MemoryStore> {
    let clock = ManualClock::new(Timestamp::from_secs(2222));
    RateLimitService::new(
        config(),
        Arc::new(MemoryStore::new(100_000)),
        Arc::new(clock),
        ServiceOptions::default(),
    )
}

fn service(max_keys: usize) -> (RateLimitService<MemoryStore>, Arc<Stats>) {
    let stats = Stats::new(StatsOptions {
        max_keys,
        ..StatsOptions::default()
    });
    observed(unobserved(), stats)
}

fn request(domain: &str, key: &str, value: &str) -> Request {
    Request {
        domain: domain.into(),
        descriptors: vec![Descriptor {
            entries: vec![Entry::new(key, value)],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

#[tokio::test]
async fn a_flood_of_unique_values_stays_within_the_cap() {
    let (svc, stats) = service(50);
    for i in 0..2000 {
        // detailed_metric values, per-request overrides, and unknown domains: all unbounded.
        svc.should_rate_limit(request("test", "user", &format!("u{i}")))
            .await
            .unwrap();
        let mut overridden = request("test", "anything", &format!("o{i}"));
        overridden.descriptors[0].limit_override = Some(LimitOverride {
            requests_per_unit: 5,
            unit: Unit::Minute,
        });
        svc.should_rate_limit(overridden).await.unwrap();
        svc.should_rate_limit(request(&format!("d{i}"), "k", "v"))
            .await
            .unwrap();
    }
    let text = render(&stats, &Extra::default());
    let series = text
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
        .count();
    let domains = text
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_domain_not_found{"))
        .count();
    // 50 keys in all, plus one overflow series per family.
    assert!(series + domains <= 50 + 2, "{series} + {domains}\n{text}");
    assert_eq!(value(&text, "sluice_stats_keys"), Some(50.0));
    let overflow = value(
        &text,
        r#"ratelimit_service_rate_limit_total_hits{domain="_overflow_"}"#,
    )
    .unwrap();
    let folded = value(&text, "sluice_stats_folded_total").unwrap();
    // Every hit is still counted: 4000 per-limit hits, some in the overflow series.
    let kept: f64 = text
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(kept, 4000.0);
    assert!(overflow > 3000.0, "{overflow}");
    assert_eq!(folded, 6000.0 - 50.0);
    process::promtool_check(&text);
}

/// One series per Redis target (and memcached server) for each breaker family, and the
/// exposition still passes promtool.
#[test]
fn redis_allowance_counters_and_gauges_are_rendered_with_their_kinds() {
    let extra = Extra {
        store: StoreReport {
            allowance: vec![
                ("local_calls", 41),
                ("dry_calls", 2),
                ("keys", 3),
                ("bytes", 900),
            ],
            ..StoreReport::default()
        },
        ..Extra::default()
    };
    let text = render(&Stats::new(StatsOptions::default()), &extra);
    for want in [
        "# TYPE sluice_redis_allowance_local_calls_total counter",
        "sluice_redis_allowance_local_calls_total 41",
        "sluice_redis_allowance_dry_calls_total 2",
        "# TYPE sluice_redis_allowance_keys gauge",
        "sluice_redis_allowance_keys 3",
        "sluice_redis_allowance_bytes 900",
    ] {
        assert!(
            text.lines().any(|l| l == want),
            "{want} missing from:\n{text}"
        );
    }
}

#[test]
fn redis_breakers_are_one_series_per_target() {
    let gauges = |target: &str, up, opens, fast_failures| BreakerGauges {
        target: target.to_owned(),
        up,
        opens,
        fast_failures,
    };
    let extra = Extra {
        store: StoreReport {
            redis: vec![
                gauges("main", false, 2, 7),
                gauges("per_second", true, 0, 0),
            ],
            memcache: vec![
                gauges("10.0.0.1:11211", true, 1, 3),
                gauges("memcached-1.mc.svc.:11211", false, 4, 9),
            ],
            ..StoreReport::default()
        },
        ..Extra::default()
    };
    let text = render(&Stats::new(StatsOptions::default()), &extra);
    for (series, want) in [
        (r#"sluice_redis_up{target="main"}"#, 0.0),
        (r#"sluice_redis_up{target="per_second"}"#, 1.0),
        (r#"sluice_redis_breaker_opens_total{target="main"}"#, 2.0),
        (r#"sluice_redis_fast_failures_total{target="main"}"#, 7.0),
        (
            r#"sluice_redis_fast_failures_total{target="per_second"}"#,
            0.0,
        ),
        (r#"sluice_memcache_up{server="10.0.0.1:11211"}"#, 1.0),
        (
            r#"sluice_memcache_up{server="memcached-1.mc.svc.:11211"}"#,
            0.0,
        ),
        (
            r#"sluice_memcache_breaker_opens_total{server="memcached-1.mc.svc.:11211"}"#,
            4.0,
        ),
        (
            r#"sluice_memcache_fast_failures_total{server="10.0.0.1:11211"}"#,
            3.0,
        ),
    ] {
        assert_eq!(value(&text, series), Some(want), "{series}\n{text}");
    }
    process::promtool_check(&text);
}

#[tokio::test]
async fn stats_survive_a_reload_and_disabled_stats_record_nothing() {
    let (svc, stats) = service(100);
    svc.should_rate_limit(request("test", "k", "v"))
        .await
        .unwrap();
    let cfg = parse_files(
        &[("test.yaml".to_string(), CONFIG.to_string())],
        &LoadOptions::default(),
    )
    .unwrap();
    svc.config().store(cfg);
    svc.should_rate_limit(request("test", "k", "v"))
        .await
        .unwrap();
    let text = render(&stats, &Extra::default());
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_rate_limit_total_hits{domain="test",key1="k_v"}"#
        ),
        Some(2.0)
    );

    let (off, off_stats) = observed(unobserved(), Stats::disabled());
    off.should_rate_limit(request("test", "k", "v"))
        .await
        .unwrap();
    let text = render(&off_stats, &Extra::default());
    assert!(!text.contains("key1=\"k_v\""), "{text}");
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#
        ),
        Some(0.0)
    );
}

#[tokio::test]
async fn global_shadow_mode_and_backend_errors_are_counted() {
    let clock = ManualClock::new(Timestamp::from_secs(2222));
    let (svc, stats) = observed(
        RateLimitService::new(
            config(),
            // Room for one counter: a second key is a backend (store full) error.
            Arc::new(MemoryStore::new(1)),
            Arc::new(clock),
            ServiceOptions {
                shadow_mode: true,
                ..ServiceOptions::default()
            },
        ),
        Stats::default(),
    );
    for _ in 0..11 {
        svc.should_rate_limit(request("test", "k", "v"))
            .await
            .unwrap();
    }
    assert!(
        svc.should_rate_limit(request("test", "shadow", "x"))
            .await
            .is_err()
    );
    let text = render(&stats, &Extra::default());
    assert_eq!(
        value(&text, "ratelimit_service_global_shadow_mode"),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"ratelimit_service_should_rate_limit_error{err_type="redis_error"}"#
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn statsd_receives_counter_increases_under_the_go_names() {
    let receiver = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut sink = sluice::telemetry::statsd::StatsdSink::connect(receiver.local_addr().unwrap())
        .await
        .unwrap();
    let (svc, stats) = service(100);
    for _ in 0..3 {
        svc.should_rate_limit(request("test", "k", "v"))
            .await
            .unwrap();
    }
    svc.should_rate_limit(request("test", "ip", "10.0.0.1"))
        .await
        .unwrap();
    let extra = Extra {
        config_load_success: 1,
        limits: limit_table(&config().current().unwrap()).into(),
        ..Extra::default()
    };
    assert!(sink.flush(&stats, &extra).await.unwrap() > 0);
    let mut buf = vec![0u8; 2048];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), receiver.recv(&mut buf))
        .await
        .expect("a datagram")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    for want in [
        "ratelimit.service.rate_limit.test.k_v.total_hits:3|c",
        "ratelimit.service.rate_limit.test.k_v.within_limit:3|c",
        "ratelimit.service.rate_limit.test.ip_10_0_0_1.total_hits:1|c",
        "ratelimit_server.ShouldRateLimit.total_requests:4|c",
        "ratelimit.service.config_load_success:1|c",
        "ratelimit.service.rate_limit.test.k_v.rate_limit:10|g",
        "ratelimit.service.rate_limit.test.k_v.window_seconds:60|g",
        "ratelimit.service.rate_limit.test.ip_10_0_0_1.rate_limit:1000|g",
    ] {
        assert!(lines.contains(&want), "{want} missing from\n{text}");
    }
    // Unmoved counters are not sent; the next flush sends only the increase.
    svc.should_rate_limit(request("test", "k", "v"))
        .await
        .unwrap();
    sink.flush(&stats, &extra).await.unwrap();
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), receiver.recv(&mut buf))
        .await
        .expect("a datagram")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    // The limits again (gauges are sent at every flush), and only the counters that grew.
    assert_eq!(
        lines,
        [
            "ratelimit.service.rate_limit.test.ip_10_0_0_1.rate_limit:1000|g",
            "ratelimit.service.rate_limit.test.ip_10_0_0_1.window_seconds:60|g",
            "ratelimit.service.rate_limit.test.k_v.rate_limit:10|g",
            "ratelimit.service.rate_limit.test.k_v.total_hits:1|c",
            "ratelimit.service.rate_limit.test.k_v.window_seconds:60|g",
            "ratelimit.service.rate_limit.test.k_v.within_limit:1|c",
            "ratelimit_server.ShouldRateLimit.total_requests:1|c",
        ]
    );
}
