//! The shipped Grafana dashboard (`helm/sluice/files/dashboard.json`) and Prometheus alerts
//! (`helm/sluice/files/alerts.yaml`) against a real Prometheus (Debian's `prometheus`) scraping
//! two real Sluice peers under load, with write-behind to a real `redis-server`: `promtool check
//! rules` passes; every dashboard query, and every alert expression without its threshold,
//! returns data through Prometheus's HTTP API; a tenant sending past its limit shows over 90% in
//! the utilisation panel and fires `SluiceNearLimit`, a quiet one does neither, nor does a
//! concurrency limit, whose lost refunds fire `SluiceLostRefunds` instead; and a config
//! reload that raises the one limit and removes the other moves the limit gauges in Prometheus;
//! and with the store driven full and Redis killed, the store, backend and Redis alerts fire.
//! Under CI a missing `prometheus` fails the test; elsewhere it is skipped loudly.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
mod redis_server;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_test_support::http::http;
use sluice_test_support::process::{free_port, tool_available, wait_for};

use redis_server::{RedisServer, redis_server_available};
use serde_json::Value;

fn files() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("helm/sluice/files")
}

fn prometheus_available() -> bool {
    let install = "apt-get install prometheus (scripts/test.sh does)";
    tool_available("prometheus", "--version", install)
        && tool_available("promtool", "--version", install)
}

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A Sluice peer: its HTTP and debug ports.
struct Node {
    _proc: Proc,
    http: u16,
    debug: u16,
}

fn start_nodes(config: &Path, redis: &RedisServer) -> Vec<Node> {
    let ports: Vec<(u16, u16, u16)> = (0..2)
        .map(|_| (free_port(), free_port(), free_port()))
        .collect();
    let peers = ports
        .iter()
        .map(|(_, _, peer)| format!("127.0.0.1:{peer}"))
        .collect::<Vec<_>>()
        .join(",");
    ports
        .into_iter()
        .map(|(http_port, debug, peer)| {
            let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
                .arg("--config")
                .arg(config)
                .env_remove("BACKEND_TYPE")
                .envs([
                    ("HOST", "127.0.0.1".to_owned()),
                    ("GRPC_HOST", "127.0.0.1".to_owned()),
                    ("DEBUG_HOST", "127.0.0.1".to_owned()),
                    ("PORT", http_port.to_string()),
                    ("GRPC_PORT", free_port().to_string()),
                    ("DEBUG_PORT", debug.to_string()),
                    ("PEERS", peers.clone()),
                    ("PEER_PORT", peer.to_string()),
                    ("PEER_ADVERTISE_ADDRESS", format!("127.0.0.1:{peer}")),
                    ("SLUICE_PEER_WRITE_BEHIND", "true".to_owned()),
                    ("SLUICE_PEER_WRITE_BEHIND_MS", "100".to_owned()),
                    ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
                    ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
                    // Small enough for the test to fill.
                    ("SLUICE_MAX_COUNTERS", "30".to_owned()),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start sluice");
            wait_for("sluice to answer", Duration::from_secs(20), || {
                http(http_port, "GET", "/healthcheck", "").is_some_and(|(s, _)| s == 200)
            });
            Node {
                _proc: Proc(child),
                http: http_port,
                debug,
            }
        })
        .collect()
}

/// Prometheus scraping `targets` every second, evaluating `rules` every second.
fn start_prometheus(dir: &Path, targets: &[String], rules: &Path) -> (Proc, u16) {
    let port = free_port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [{}]\n\
             scrape_configs:\n  - job_name: sluice\n    static_configs:\n      - targets: [{}]\n",
            rules.display(),
            targets.join(", ")
        ),
    )
    .unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    let proc = Proc(child);
    wait_for("prometheus to be ready", Duration::from_secs(30), || {
        http(port, "GET", "/-/ready", "").is_some_and(|(s, _)| s == 200)
    });
    (proc, port)
}

/// A GET to Prometheus's API as JSON, over HTTP/1.0 (so the answer is never chunked).
fn api(port: u16, path: &str) -> Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("prometheus answers");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{path}: {raw}"
    );
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// An instant query's result vector.
fn query(port: u16, expr: &str) -> Vec<Value> {
    let v = api(
        port,
        &format!("/api/v1/query?query={}", sluice::percent::encode(expr, b"")),
    );
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// The dashboard's queries, with its variables as Grafana would fill them.
fn dashboard_queries() -> Vec<(String, String)> {
    dashboard_queries_over("30s")
}

/// The dashboard's queries, with `$__rate_interval` as `range`.
fn dashboard_queries_over(range: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(files().join("dashboard.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$job", "sluice")
                .replace("$__rate_interval", range);
            out.push((p["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    out
}

/// Each alert's name and expression without its final threshold (`... > 0`).
fn alert_expressions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(files().join("alerts.yaml")).unwrap();
    let mut out = Vec::new();
    let mut name = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(n) = line.strip_prefix("- alert: ") {
            name = n.to_owned();
        } else if let Some(e) = line.strip_prefix("expr: ") {
            let (bare, threshold) = e.rsplit_once(' ').unwrap();
            let (bare, op) = bare.rsplit_once(' ').unwrap();
            assert!(
                [">", "<", "==", ">=", "<="].contains(&op) && threshold.parse::<f64>().is_ok(),
                "{name}: the expression must end in its threshold: {e}"
            );
            out.push((name.clone(), bare.to_owned()));
        }
    }
    out
}

/// The rule file as the test loads it: every `for:` at 0s, so alerts fire at the next
/// evaluation instead of minutes later.
fn fast_rules(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(files().join("alerts.yaml")).unwrap();
    let fast: String = text
        .lines()
        .map(|l| match l.split_once("for: ") {
            Some((indent, _)) => format!("{indent}for: 0s\n"),
            None => format!("{l}\n"),
        })
        .collect();
    let path = dir.join("rules.yaml");
    std::fs::write(&path, fast).unwrap();
    path
}

fn firing(port: u16) -> Vec<String> {
    let v = api(port, "/api/v1/alerts");
    let mut names: Vec<String> = v["data"]["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["state"] == "firing")
        .filter_map(|a| a["labels"]["alertname"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// `k` (key only: every value's counter in one series), a hot tenant the load sends far past
/// its 30 an hour, and a quiet one it stays far below. (A 6 s load is a young series, whose
/// `rate()` over 5 minutes is its hits over 5 minutes: tens of hits must read as over 90%.)
const LIMITS: &str = "domain: d\ndescriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: tenant
    value: hot
    rate_limit: {unit: hour, requests_per_unit: 30}
  - key: tenant
    value: quiet
    rate_limit: {unit: second, requests_per_unit: 100000}
  - key: inflight
    value: x
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: concurrency}
  - key: inflight
    value: y
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: concurrency}
";

/// After the reload: the hot tenant's limit raised far above its load, the quiet one gone.
const RELOADED: &str = "domain: d\ndescriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: tenant
    value: hot
    rate_limit: {unit: second, requests_per_unit: 1000000, unit_multiplier: 2}
";

fn body(value: &str) -> String {
    entry_body("k", value)
}

fn entry_body(key: &str, value: &str) -> String {
    format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    )
}

#[test]
fn the_dashboard_and_alerts_work_against_a_real_prometheus() {
    if !prometheus_available() || !redis_server_available() {
        return;
    }
    let rules = files().join("alerts.yaml");
    let check = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("run promtool");
    assert!(check.status.success(), "{check:?}");

    let dir = tempfile::tempdir().unwrap();
    // Sluice's own directory: Prometheus's files beside it would be read as limits.
    let config = dir.path().join("config");
    std::fs::create_dir(&config).unwrap();
    std::fs::write(config.join("limits.yaml"), LIMITS).unwrap();
    let mut redis = RedisServer::start_on(free_port());
    let nodes = start_nodes(&config, &redis);
    let targets: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.debug))
        .collect();
    let (_prometheus, port) = start_prometheus(dir.path(), &targets, &fast_rules(dir.path()));

    load(&nodes, port);
    wait_for(
        "prometheus to scrape the errors",
        Duration::from_secs(20),
        || {
            !query(
                port,
                "ratelimit_service_should_rate_limit_error{err_type=\"redis_error\"} > 0",
            )
            .is_empty()
                && !query(
                    port,
                    "count_over_time(ratelimit_service_total_requests[1m]) > 3",
                )
                .is_empty()
        },
    );

    for (title, expr) in dashboard_queries() {
        assert!(
            !query(port, &expr).is_empty(),
            "dashboard panel {title:?}: no data for {expr}"
        );
    }
    for (name, expr) in alert_expressions() {
        assert!(
            !query(port, &expr).is_empty(),
            "alert {name}: no data for {expr}"
        );
    }

    the_near_limit_alert_fires_for_the_hot_tenant_only(port);
    lost_refunds_fire_for_the_concurrency_limit(port);
    std::fs::write(config.join("limits.yaml"), RELOADED).unwrap();
    a_reload_moves_the_limit_gauges(port);

    // Redis gone: the write-behind's Redis is down, and the alerts say so.
    redis.kill();
    wait_until_firing(
        port,
        &nodes,
        &[
            "SluiceBackendErrors",
            "SluiceCounterStoreFull",
            "SluiceRedisDown",
        ],
    );
}

/// Hits within and over the limit on both nodes for 6 s (a third of them the hot tenant's,
/// a few the quiet one's), then x's lost refunds until Prometheus has seen them, then more
/// distinct keys than the store holds (it refuses them: a backend error).
fn load(nodes: &[Node], port: u16) {
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(6) {
        let node = &nodes[i % 2];
        let body = match i % 30 {
            0 => entry_body("tenant", "quiet"),
            // Starts that never send their end: x's slots expire a second after they were
            // taken, y's in an hour (its starts read as far past 3 an hour).
            15 => entry_body("inflight", "x"),
            21 => entry_body("inflight", "y"),
            n if n % 3 == 0 => entry_body("tenant", "hot"),
            _ => body(&format!("v{}", i % 4)),
        };
        http(node.http, "POST", "/json", &body);
        i += 1;
    }
    x_loses_refunds_until_prometheus_counts_them(nodes, port);
    for n in 0..80 {
        http(
            nodes[n % 2].http,
            "POST",
            "/json",
            &body(&format!("flood{n}")),
        );
    }
}

/// A lost refund is counted by the next call on its counter after the slot expired, and
/// `increase()` sees it only once a scrape has read the counter before it grew: on a slow
/// machine the 6 s load may give it no such pair. So x keeps starting (one every 1.1 s, each
/// slot expiring before the next start counts it) until Prometheus reads an increase, 30 s at
/// most, before the flood fills the store.
fn x_loses_refunds_until_prometheus_counts_them(nodes: &[Node], port: u16) {
    let expr = "increase(ratelimit_service_rate_limit_slots_expired{key1=\"inflight_x\"}[1m]) > 0";
    let deadline = Instant::now() + Duration::from_secs(30);
    while query(port, expr).is_empty() {
        assert!(
            Instant::now() < deadline,
            "Prometheus never saw x's lost refunds; its series: {:?}",
            query(
                port,
                "ratelimit_service_rate_limit_slots_expired{key1=~\"inflight_.*\"}[1m]"
            )
        );
        http(nodes[1].http, "POST", "/json", &entry_body("inflight", "x"));
        std::thread::sleep(Duration::from_millis(1100));
    }
}

/// The utilisation panel's value for each tenant (its `key1`), as Prometheus computes it now
/// over the last 5 minutes (the load lasted 6 s, and the store refuses new counters after it).
fn utilisation(port: u16) -> Vec<(String, f64)> {
    let (_, expr) = dashboard_queries_over("5m")
        .into_iter()
        .find(|(title, _)| title.starts_with("Limit utilisation"))
        .expect("the utilisation panel");
    let mut out: Vec<(String, f64)> = query(port, &expr)
        .iter()
        .map(|r| {
            let key1 = r["metric"]["key1"].as_str().unwrap_or_default().to_owned();
            let v = r["value"][1].as_str().and_then(|v| v.parse().ok());
            (key1, v.unwrap_or(f64::NAN))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `SluiceNearLimit`'s firing alerts' `key1`s.
fn near_limit_firing(port: u16) -> Vec<String> {
    firing_for(port, "SluiceNearLimit")
}

/// The `key1`s `alert` fires for.
fn firing_for(port: u16, alert: &str) -> Vec<String> {
    let v = api(port, "/api/v1/alerts");
    let mut keys: Vec<String> = v["data"]["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["state"] == "firing" && a["labels"]["alertname"] == alert)
        .filter_map(|a| a["labels"]["key1"].as_str().map(str::to_owned))
        .collect();
    keys.sort();
    keys
}

/// The hot tenant sent tens of hits against 30 an hour allowed; the quiet one a few against
/// 100,000 a second. The panel shows the one far past 90% and the other far below (the key-only
/// `k` not at all: its series sums every value), and the alert fires for the hot one only.
fn the_near_limit_alert_fires_for_the_hot_tenant_only(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while near_limit_firing(port).is_empty() {
        assert!(
            Instant::now() < deadline,
            "SluiceNearLimit never fired; utilisation {:?}",
            utilisation(port)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(near_limit_firing(port), ["tenant_hot"]);
    let u = utilisation(port);
    let keys: Vec<&str> = u.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["tenant_hot", "tenant_quiet"], "{u:?}");
    assert!(u[0].1 > 0.9 && u[1].1 < 0.01, "{u:?}");
}

/// The gauges of the tenant `key1` (the limit `d.<key1>`) in Prometheus now, per instance:
/// (its series' limit gauge, its limit's window gauge), each list sorted.
fn limit_gauges(port: u16, key1: &str) -> Vec<(f64, f64)> {
    let values = |expr: String| -> Vec<f64> {
        let mut v: Vec<f64> = query(port, &expr)
            .iter()
            .filter_map(|r| r["value"][1].as_str().and_then(|v| v.parse().ok()))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    values(format!(
        "ratelimit_service_rate_limit_limit{{key1=\"{key1}\",limit=\"d.{key1}\"}}"
    ))
    .into_iter()
    .zip(values(format!(
        "sluice_rate_limit_window_seconds{{limit=\"d.{key1}\"}}"
    )))
    .collect()
}

/// The concurrency limits' starts never sent their end, so x's slots expired a second after
/// they were taken: `SluiceLostRefunds` fires for x alone (y's slots are held for an hour), the
/// slots panel shows both, and y's starts, far past 3 an hour, fired no `SluiceNearLimit`
/// (checked above: the hot tenant alone), its limit being slots, not a rate.
fn lost_refunds_fire_for_the_concurrency_limit(port: u16) {
    wait_for("SluiceLostRefunds to fire", Duration::from_secs(30), || {
        !firing_for(port, "SluiceLostRefunds").is_empty()
    });
    assert_eq!(firing_for(port, "SluiceLostRefunds"), ["inflight_x"]);
    let (_, slots) = dashboard_queries()
        .into_iter()
        .find(|(title, _)| title.starts_with("Concurrency slots held"))
        .expect("the slots panel");
    let mut held: Vec<(String, f64)> = query(port, &slots)
        .iter()
        .filter_map(|r| {
            let key1 = r["metric"]["key1"].as_str()?.to_owned();
            Some((key1, r["value"][1].as_str()?.parse().ok()?))
        })
        .collect();
    held.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(held.len(), 2, "{held:?}");
    assert_eq!(held[0].0, "inflight_x", "{held:?}");
    // y holds its 3 slots of 3 for the hour.
    assert_eq!(held[1], ("inflight_y".to_owned(), 1.0), "{held:?}");
}

/// After the reload, both nodes report the hot tenant's new limit (1,000,000 per 2 s), the
/// quiet tenant's gauges are gone from Prometheus (stale once no scrape has them), the panel
/// drops the hot one far below 90% and the alert stops.
fn a_reload_moves_the_limit_gauges(port: u16) {
    assert_eq!(
        limit_gauges(port, "tenant_hot"),
        [(30.0, 3600.0), (30.0, 3600.0)]
    );
    wait_for(
        "the reloaded limits in Prometheus",
        Duration::from_secs(30),
        || {
            limit_gauges(port, "tenant_hot") == [(1e6, 2.0), (1e6, 2.0)]
                && limit_gauges(port, "tenant_quiet").is_empty()
                && query(port, "{limit=\"d.tenant_quiet\"}").is_empty()
        },
    );
    wait_for("SluiceNearLimit to stop", Duration::from_secs(30), || {
        near_limit_firing(port).is_empty()
    });
    let u = utilisation(port);
    assert!(
        u.len() == 1 && u[0].0 == "tenant_hot" && u[0].1 < 0.01,
        "{u:?}"
    );
}

/// Keeps the store refusing until every alert of `want` fires (60 s at most).
fn wait_until_firing(port: u16, nodes: &[Node], want: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for n in 0..10 {
            http(
                nodes[n % 2].http,
                "POST",
                "/json",
                &body(&format!("more{n}")),
            );
        }
        let now = firing(port);
        if want.iter().all(|w| now.iter().any(|f| f == w)) {
            return;
        }
        assert!(Instant::now() < deadline, "firing {now:?}, wanted {want:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}
