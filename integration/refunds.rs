//! Refunds (`is_negative_hits`, envoyproxy/ratelimit's PR #1140), reservations (issue 51),
//! penalties and values matched by pattern (issue 52) on the real binary, over gRPC and
//! `/json`, on each backend: memory, a real `redis-server`, a real `memcached`; and two
//! Sluice processes on one Redis, each with its local over-limit cache, measuring how long the
//! one that did not see a refund keeps refusing the key (SLUICE_LOCAL_CACHE_MAX_AGE_MS). The
//! peer cluster's refunds (forward and lease mode) are in `cluster.rs`.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
mod in_flight;
mod penalty;
mod redis_server;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_test_support::http::http;
use sluice_test_support::process::{free_port, tool_available, wait_for};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use in_flight::Answer;
use redis_server::{RedisServer, redis_server_available};

/// Every key a limit of 3 per hour: a fixed window (`inflight`, as the Go service counts), a
/// fixed window with `charge_refused: true` (`charged`), a sliding window without and with it.
const LIMITS: &str = "domain: d
descriptors:
  - key: inflight
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: charged
    rate_limit: {unit: hour, requests_per_unit: 3, charge_refused: true}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window}
  - key: sliding_charged
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window, charge_refused: true}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: hot_charged
    rate_limit: {unit: hour, requests_per_unit: 50, charge_refused: true}
  - key: budget
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: login
    rate_limit: {unit: second, requests_per_unit: 3, penalty_seconds: 3}
  - key: ver
    value: v1
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: ver
    value_regex: \"v[0-9]+\"
    rate_limit: {unit: hour, requests_per_unit: 2}
";

/// A `sluice` process on free 127.0.0.1 ports with [`LIMITS`] and `env`, killed on drop.
struct Sluice {
    child: Child,
    http: u16,
    grpc: u16,
    debug: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sluice {
    fn start(env: &[(&str, String)]) -> Sluice {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("limits.yaml"), LIMITS).unwrap();
        let (http, grpc, debug) = (free_port(), free_port(), free_port());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        for var in [
            "BACKEND_TYPE",
            "REDIS_URL",
            "REDIS_TLS",
            "REDIS_TYPE",
            "REDIS_AUTH",
        ] {
            cmd.env_remove(var);
        }
        let child = cmd
            .arg("--config")
            .arg(dir.path())
            .env("HOST", "127.0.0.1")
            .env("GRPC_HOST", "127.0.0.1")
            .env("DEBUG_HOST", "127.0.0.1")
            .env("PORT", http.to_string())
            .env("GRPC_PORT", grpc.to_string())
            .env("DEBUG_PORT", debug.to_string())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let s = Sluice {
            child,
            http,
            grpc,
            debug,
            _dir: dir,
        };
        wait_for("sluice to be healthy", Duration::from_secs(20), || {
            sluice_test_support::http::http(s.http, "GET", "/healthcheck", "")
                .is_some_and(|(c, _)| c == 200)
        });
        s
    }

    /// One descriptor `key=value`, `hits` as its addend, over `/json`.
    fn json(&self, key: &str, value: &str, negative: bool, hits: u64) -> Answer {
        let body = format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}],"hits_addend":{hits},"is_negative_hits":{negative}}}]}}"#
        );
        let (status, body) = http(self.http, "POST", "/json", &body).expect("answer");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        let s = &v["statuses"][0];
        let ok = s["code"] == "OK";
        assert_eq!(status, if ok { 200 } else { 429 }, "{body}");
        Answer {
            ok,
            remaining: s["limitRemaining"].as_u64().unwrap_or(0) as u32,
        }
    }

    /// One `/json` call on `budget=t` with `hits` and the reservation entry `(key, value)`: OK,
    /// and the reservation token its answer names.
    fn reservation(&self, entry: (&str, &str), hits: u64) -> (bool, Option<String>) {
        let body = format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"budget","value":"t"}},{{"key":"{}","value":"{}"}}],"hits_addend":{hits}}}]}}"#,
            entry.0, entry.1
        );
        let (_, body) = http(self.http, "POST", "/json", &body).expect("answer");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        let token = v["dynamicMetadata"]["sluice_reservation"].as_str();
        (v["overallCode"] == "OK", token.map(str::to_owned))
    }

    /// `budget=t`'s counter from `/debug/counters`: (count, used, reserved).
    fn budget(&self) -> (u64, u64, u64) {
        let uri = "/debug/counters?domain=d&descriptor=budget=t";
        let (_, body) = http(self.debug, "GET", uri, "").expect("counters");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        let c = &v["counters"][0];
        let n = |f: &str| c[f].as_u64().unwrap_or(u64::MAX);
        (n("count"), n("used"), n("reserved"))
    }

    /// The same over gRPC.
    fn grpc(
        &self,
        rt: &tokio::runtime::Runtime,
        key: &str,
        value: &str,
        negative: bool,
        hits: u64,
    ) -> Answer {
        let request = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value: value.into(),
                }],
                hits_addend: Some(UInt64Value { value: hits }),
                is_negative_hits: negative,
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let addr = format!("http://127.0.0.1:{}", self.grpc);
        let r = rt.block_on(async {
            let mut client = RateLimitServiceClient::connect(addr)
                .await
                .expect("connect");
            client
                .should_rate_limit(request)
                .await
                .expect("answer")
                .into_inner()
        });
        let s = &r.statuses[0];
        Answer {
            ok: s.code == Code::Ok as i32,
            remaining: s.limit_remaining,
        }
    }

    /// `ratelimit_service_rate_limit_<stat>{domain="d",key1="<key>"}` from `/metrics` (statsd's
    /// `ratelimit.service.rate_limit.d.<key>.<stat>`, in the Go mapping).
    fn stat(&self, key: &str, stat: &str) -> u64 {
        let (_, body) = http(self.debug, "GET", "/metrics", "").expect("metrics");
        let name = format!(r#"ratelimit_service_rate_limit_{stat}{{domain="d",key1="{key}"}} "#);
        body.lines()
            .find_map(|l| l.strip_prefix(&name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The scenarios on one Sluice: the counted ones over gRPC and `/json` on their own values of
/// the same limits, the ignored one, and the stats they leave.
fn every_scenario(s: &Sluice) {
    let rt = runtime();
    for key in ["inflight", "charged", "sliding_charged"] {
        in_flight::counted(&mut |negative, hits| s.grpc(&rt, key, "grpc", negative, hits));
        in_flight::counted(&mut |negative, hits| s.json(key, "json", negative, hits));
    }
    in_flight::ignored(&mut |negative, hits| s.grpc(&rt, "sliding", "grpc", negative, hits));
    // Two runs of the counted scenario: 2 × (1 + 1 + 1 + 1 + 5) hits refunded.
    assert_eq!(s.stat("inflight", "total_negative_hits"), 18);
    assert_eq!(s.stat("inflight", "negative_hits_ignored"), 0);
    assert_eq!(s.stat("sliding", "total_negative_hits"), 1);
    assert_eq!(s.stat("sliding", "negative_hits_ignored"), 1);
    // Refunds are not hits: 2 × 10 charges.
    assert_eq!(s.stat("inflight", "total_hits"), 20);
    reservations(s);
    penalty(s);
    patterns(s);
}

/// Issue 52's case ([`penalty::steps`]) on `login`, and the stats it leaves.
fn penalty(s: &Sluice) {
    penalty::steps(|value| penalty::login(s.http, value));
    assert_eq!(s.stat("login", "penalties"), 1);
    assert!(s.stat("login", "penalized") >= 1);
}

/// `value_regex` (issue 52): `ver=v1` has its exact limit of 5; every other `v<digits>` its
/// own counter of 2; `v7x` matches no pattern, so no limit.
fn patterns(s: &Sluice) {
    let rt = runtime();
    let admitted = |value: &str, n: usize| {
        (0..n)
            .filter(|_| s.grpc(&rt, "ver", value, false, 1).ok)
            .count()
    };
    assert_eq!(admitted("v1", 6), 5);
    assert_eq!(admitted("v7", 3), 2);
    assert_eq!(admitted("v8", 3), 2);
    assert_eq!(admitted("v7x", 3), 3);
}

/// Reservations (issue 51) on one Sluice: a budget of 50 an hour, estimates of 30; the settle
/// gives back what the estimate passed the cost; `/debug/counters` shows used and reserved.
fn reservations(s: &Sluice) {
    let (ok, first) = s.reservation(("sluice_reserve", "1"), 30);
    let first = first.filter(|_| ok).expect("the first estimate fits");
    assert_eq!(s.reservation(("sluice_reserve", "1"), 30), (false, None));
    assert_eq!(s.budget(), (30, 0, 30));
    assert!(s.reservation(("sluice_reservation", &first), 10).0);
    let (ok, second) = s.reservation(("sluice_reserve", "1"), 30);
    assert!(ok && second.is_some());
    assert_eq!(s.budget(), (40, 10, 30));
    let (_, metrics) = http(s.debug, "GET", "/metrics", "").expect("metrics");
    assert!(
        metrics.contains("sluice_reservations_opened_total 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluice_reservations_settled_total 1\n"),
        "{metrics}"
    );
}

#[test]
fn refunds_on_the_memory_store_over_grpc_and_json() {
    let s = Sluice::start(&[]);
    every_scenario(&s);
}

#[test]
fn refunds_on_redis_over_grpc_and_json() {
    if !redis_server_available() {
        return;
    }
    let redis = RedisServer::start_on(free_port());
    let s = Sluice::start(&[
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
    ]);
    every_scenario(&s);
    // The Go key, as the Go service would read it: the scenario ends with 4 hits (the 4th
    // counted) after a refund that left 0.
    let hour = this_hour();
    assert_eq!(go_count(&redis, &format!("d_inflight_json_{hour}")), 4);
}

/// The start of this hour's window, as the Go service's keys name it.
fn this_hour() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 3600
        * 3600
}

/// A Go key's count in `redis` (0 when missing).
fn go_count(redis: &RedisServer, key: &str) -> u64 {
    redis.cli(&["GET", key]).parse().unwrap_or(0)
}

/// SLUICE_REDIS_ALLOWANCE keeps the store's semantics (issue 48): the same scenarios, and on a
/// hot key, decided from batches, the two recipes the allowances once broke. The refund recipe
/// for requests in flight: a fixed window of 50 filled, 5 refunds, then 6 hits: 5 pass and the
/// 6th is refused (the refunds were once ignored: all 6 refused). `charge_refused`: 60 hits on
/// a limit of 50 leave 60 on the Go key (once 50: the refused charges were lost).
#[test]
fn refunds_on_redis_with_allowances_keep_the_recipes_on_a_hot_key() {
    if !redis_server_available() {
        return;
    }
    let redis = RedisServer::start_on(free_port());
    let s = Sluice::start(&[
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("SLUICE_REDIS_ALLOWANCE", "true".into()),
    ]);
    every_scenario(&s);
    let rt = runtime();
    let call = |key: &str, negative: bool| s.grpc(&rt, key, "v", negative, 1).ok;
    let filled = (0..50).filter(|_| call("hot", false)).count();
    assert_eq!(filled, 50);
    for _ in 0..5 {
        assert!(call("hot", true));
    }
    let after: Vec<bool> = (0..6).map(|_| call("hot", false)).collect();
    assert_eq!(after, [true, true, true, true, true, false]);
    let admitted = (0..60).filter(|_| call("hot_charged", false)).count();
    assert_eq!(admitted, 50);
    let hour = this_hour();
    assert_eq!(go_count(&redis, &format!("d_hot_v_{hour}")), 51);
    assert_eq!(go_count(&redis, &format!("d_hot_charged_v_{hour}")), 60);
    // The hot key was decided from batches, not one INCRBY a call.
    let (_, metrics) = http(s.debug, "GET", "/metrics", "").expect("metrics");
    let local: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_redis_allowance_local_calls_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(local >= 30, "{local} calls decided from batches");
}

/// A `memcached` on 127.0.0.1:`port`, killed on drop.
struct Memcached(Child);

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn refunds_on_memcached_over_grpc_and_json() {
    if !tool_available(
        "memcached",
        "-V",
        "apt-get install memcached (scripts/test.sh does)",
    ) {
        return;
    }
    let port = free_port();
    let _memcached = Memcached(
        Command::new("memcached")
            .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
            .args(["-m", "64", "-t", "2", "-u", "root"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start memcached"),
    );
    wait_for("memcached", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let s = Sluice::start(&[
        ("BACKEND_TYPE", "memcache".into()),
        ("MEMCACHE_HOST_PORT", format!("127.0.0.1:{port}")),
    ]);
    every_scenario(&s);
}

/// Two Sluice processes on one Redis, each with its local over-limit cache. B finds the key
/// over and remembers it; a refund through A frees a place in Redis, which B cannot know of:
/// B keeps answering OVER from its cache until the entry's age (SLUICE_LOCAL_CACHE_MAX_AGE_MS)
/// runs out, then asks Redis and admits. Measured for the default (1 s) and for 300 ms; the
/// bound is the age plus one poll and a call.
#[test]
fn another_replica_admits_a_refunded_key_within_the_local_cache_max_age() {
    if !redis_server_available() {
        return;
    }
    let redis = RedisServer::start_on(free_port());
    for (max_age_ms, value) in [(None, "default"), (Some(300u64), "short")] {
        let mut env = vec![
            ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576".to_owned()),
            // The cache holds refused hits back: only `always` applies a plain fixed window's
            // refunds then (the default ignores them; `charge_refused: true` bypasses the cache).
            ("SLUICE_NEGATIVE_HITS", "always".to_owned()),
        ];
        if let Some(ms) = max_age_ms {
            env.push(("SLUICE_LOCAL_CACHE_MAX_AGE_MS", ms.to_string()));
        }
        let bound = Duration::from_millis(max_age_ms.unwrap_or(1000));
        let (a, b) = (Sluice::start(&env), Sluice::start(&env));
        for _ in 0..3 {
            assert!(b.json("inflight", value, false, 1).ok);
        }
        // Over: counted in Redis (4), and remembered by B's cache from now.
        let remembered = Instant::now();
        assert!(!b.json("inflight", value, false, 1).ok);
        // A refunds 2 (the refused one's and an admitted one's): 2 in Redis.
        assert!(a.json("inflight", value, true, 2).ok);
        assert!(
            !b.json("inflight", value, false, 1).ok,
            "B's cache still refuses"
        );
        let admitted = loop {
            if b.json("inflight", value, false, 1).ok {
                break remembered.elapsed();
            }
            assert!(
                remembered.elapsed() < bound + Duration::from_secs(2),
                "B never asked Redis again"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        eprintln!(
            "max age {bound:?}: the other replica admitted {admitted:?} after it cached the key"
        );
        assert!(
            admitted >= bound - Duration::from_millis(50),
            "{admitted:?}"
        );
        assert!(
            admitted <= bound + Duration::from_millis(300),
            "{admitted:?}"
        );
        // A, whose cache forgot the key at its own refund, admits at once where B did not.
        assert!(!a.json("inflight", value, false, 1).ok, "3 in flight again");
    }
}
