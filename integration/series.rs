//! What a stats key costs in Prometheus series, counted on `/metrics` of the real `sluice`
//! binary (docs/telemetry.md, "Series per stats key"): a plain fixed-window limit's key has the
//! Go service's six series and the limit it counts against; a refund adds the refund series to
//! that key alone; a concurrency limit's key adds its slot series; the configuration is one
//! series per limit. And 3,000 values of one `detailed_metric` limit make under 24,000 series
//! on the whole page (issue 50 measured 45,072 before). Every process is started on 127.0.0.1
//! on free ports and killed when its guard drops; every wait is bounded.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice_test_support::http::http;
use sluice_test_support::process::{free_port, wait_for};

/// A `sluice` process killed on drop, and its HTTP and debug ports.
struct Sluice {
    child: Child,
    http: u16,
    debug: u16,
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sluice {
    /// Starts the binary on `config` (a directory of YAML files) with the memory store and
    /// every stats setting at its default.
    fn start(config: &Path) -> Sluice {
        let (http_port, debug) = (free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("--config")
            .arg(config)
            .env_remove("BACKEND_TYPE")
            .env_remove("SLUICE_MAX_STAT_KEYS")
            .env_remove("USE_PROMETHEUS")
            .envs([
                ("HOST", "127.0.0.1".to_owned()),
                ("GRPC_HOST", "127.0.0.1".to_owned()),
                ("DEBUG_HOST", "127.0.0.1".to_owned()),
                ("PORT", http_port.to_string()),
                ("GRPC_PORT", free_port().to_string()),
                ("DEBUG_PORT", debug.to_string()),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sluice");
        let sluice = Sluice {
            child,
            http: http_port,
            debug,
        };
        wait_for("sluice to answer", Duration::from_secs(20), || {
            http(sluice.http, "GET", "/healthcheck", "").is_some_and(|(s, _)| s == 200)
        });
        sluice
    }

    /// One `/json` call with these descriptors, each `(key, value, negative)`: answered 200.
    fn call(&self, domain: &str, descriptors: &[(&str, &str, bool)]) {
        let descriptors: Vec<String> = descriptors
            .iter()
            .map(|(k, v, negative)| {
                format!(
                    r#"{{"entries":[{{"key":"{k}","value":"{v}"}}],"is_negative_hits":{negative}}}"#
                )
            })
            .collect();
        let body = format!(
            r#"{{"domain":"{domain}","descriptors":[{}]}}"#,
            descriptors.join(",")
        );
        let answer = http(self.http, "POST", "/json", &body);
        assert!(
            answer.as_ref().is_some_and(|(s, _)| *s == 200),
            "{body}: {answer:?}"
        );
    }

    /// `/metrics`, over HTTP/1.0 so the body is never chunked.
    fn metrics(&self) -> Exposition {
        Exposition::parse(&self.metrics_text())
    }

    /// `/metrics`' text.
    fn metrics_text(&self) -> String {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.debug)).expect("debug port");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
        assert!(head.contains(" 200 "), "{head}");
        body.to_owned()
    }
}

/// One sample: its name and labels.
type Sample = (String, BTreeMap<String, String>);

/// The samples of an exposition (no label value in these tests holds a comma or a quote).
struct Exposition(Vec<(Sample, f64)>);

impl Exposition {
    fn parse(text: &str) -> Exposition {
        let samples = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').expect("a value");
                let (name, labels) = match series.split_once('{') {
                    Some((name, rest)) => (name, rest.trim_end_matches('}')),
                    None => (series, ""),
                };
                let labels = labels
                    .split(',')
                    .filter(|l| !l.is_empty())
                    .map(|l| {
                        let (k, v) = l.split_once('=').expect("a label");
                        (k.to_owned(), v.trim_matches('"').to_owned())
                    })
                    .collect();
                ((name.to_owned(), labels), value.parse().expect("a number"))
            })
            .collect();
        Exposition(samples)
    }

    /// The series of one stats key: labelled `domain`, `key1` and no `key2`, sorted by name.
    fn of_key(&self, domain: &str, key1: &str) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .0
            .iter()
            .filter(|((_, l), _)| {
                l.get("domain").map(String::as_str) == Some(domain)
                    && l.get("key1").map(String::as_str) == Some(key1)
                    && !l.contains_key("key2")
            })
            .map(|((name, _), _)| name.as_str())
            .collect();
        names.sort_unstable();
        names
    }

    /// The series of one configured limit: labelled `limit` and no `domain`.
    fn of_limit(&self, limit: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|((_, l), _)| {
                l.get("limit").map(String::as_str) == Some(limit) && !l.contains_key("domain")
            })
            .map(|((name, _), _)| name.as_str())
            .collect()
    }

    /// The value of the one series named `name` with these labels (and maybe others).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0
            .iter()
            .find(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, v)| *v)
    }
}

/// The Go service's six per-limit series (its default statsd-exporter mapping's names).
const GO_SIX: [&str; 6] = [
    "ratelimit_service_rate_limit_near_limit",
    "ratelimit_service_rate_limit_over_limit",
    "ratelimit_service_rate_limit_over_limit_with_local_cache",
    "ratelimit_service_rate_limit_shadow_mode",
    "ratelimit_service_rate_limit_total_hits",
    "ratelimit_service_rate_limit_within_limit",
];

/// `names` beside the Go six, sorted as [`Exposition::of_key`] sorts.
fn go_six_and(names: &[&'static str]) -> Vec<&'static str> {
    let mut all: Vec<&str> = GO_SIX.iter().chain(names).copied().collect();
    all.sort_unstable();
    all
}

const LIMITS: &str = "domain: s
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: inflight
    value: x
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: concurrency}
";

/// A plain fixed-window limit's key: the Go six and its limit (7), the window once for the
/// limit; after a refund, the two refund series (9). A concurrency limit's key: the Go six, its
/// limit, the three slot counters and the slots held (11); after a refund, 13.
#[test]
fn each_stats_key_costs_the_series_its_limit_needs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.yaml"), LIMITS).unwrap();
    let sluice = Sluice::start(dir.path());
    let limit = "ratelimit_service_rate_limit_limit";
    let refunds = [
        "ratelimit_service_rate_limit_negative_hits_ignored",
        "ratelimit_service_rate_limit_total_negative_hits",
    ];
    let slots = [
        "ratelimit_service_rate_limit_slots_expired",
        "ratelimit_service_rate_limit_slots_given_back",
        "ratelimit_service_rate_limit_slots_taken",
        "sluice_rate_limit_slots_held",
    ];

    sluice.call("s", &[("tenant", "acme", false), ("inflight", "x", false)]);
    let m = sluice.metrics();
    let plain = m.of_key("s", "tenant_acme");
    assert_eq!(plain, go_six_and(&[limit]), "a plain key: 7 series");
    let concurrency = m.of_key("s", "inflight_x");
    let mut want: Vec<&str> = vec![limit];
    want.extend(slots);
    assert_eq!(
        concurrency,
        go_six_and(&want),
        "a concurrency key: 11 series"
    );
    for name in ["s.tenant_acme", "s.inflight_x"] {
        assert_eq!(
            m.of_limit(name),
            ["sluice_rate_limit_window_seconds"],
            "one series per limit"
        );
    }
    let acme = [("domain", "s"), ("key1", "tenant_acme")];
    assert_eq!(m.value(limit, &acme), Some(100.0));
    assert_eq!(
        m.value(
            "sluice_rate_limit_window_seconds",
            &[("limit", "s.tenant_acme"), ("unit", "MINUTE")]
        ),
        Some(60.0)
    );

    sluice.call("s", &[("tenant", "acme", true), ("inflight", "x", true)]);
    let m = sluice.metrics();
    let mut want = vec![limit];
    want.extend(refunds);
    assert_eq!(
        m.of_key("s", "tenant_acme"),
        go_six_and(&want),
        "a refunded plain key: 9 series"
    );
    want.extend(slots);
    assert_eq!(
        m.of_key("s", "inflight_x"),
        go_six_and(&want),
        "a refunded concurrency key: 13 series"
    );
    let x = [("domain", "s"), ("key1", "inflight_x")];
    assert_eq!(
        m.value("ratelimit_service_rate_limit_slots_given_back", &x),
        Some(1.0)
    );
    assert_eq!(m.value("sluice_rate_limit_slots_held", &x), Some(0.0));
}

/// Issue 50's flood: 3,000 values of one `detailed_metric` limit, with every setting at its
/// default. Each value's key costs 7 series, the limit one more: under 24,000 on the page
/// (45,072 before, 15 a key). Prints the count (docs/telemetry.md, docs/benchmarks.md).
#[test]
fn three_thousand_detailed_values_make_under_24000_series() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("limits.yaml"),
        "domain: flood\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
    )
    .unwrap();
    let sluice = Sluice::start(dir.path());
    let values: Vec<String> = (0..3000).map(|i| format!("u{i}")).collect();
    for batch in values.chunks(50) {
        let descriptors: Vec<(&str, &str, bool)> =
            batch.iter().map(|v| ("user", v.as_str(), false)).collect();
        sluice.call("flood", &descriptors);
    }
    let text = sluice.metrics_text();
    let m = Exposition::parse(&text);
    assert_eq!(m.value("sluice_stats_keys", &[]), Some(3000.0));
    let total = m.0.len();
    let per_key = m.of_key("flood", "user_u1234").len();
    eprintln!(
        "3,000 detailed_metric values: {total} series on /metrics ({} bytes), {per_key} per stats key",
        text.len()
    );
    assert_eq!(per_key, 7, "{:?}", m.of_key("flood", "user_u1234"));
    assert_eq!(m.of_limit("flood.user").len(), 1);
    assert!(total < 24_000, "{total} series");
}
