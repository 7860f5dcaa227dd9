//! The Redis backend against a real `redis-server`, started by each test on a free 127.0.0.1
//! port with persistence off, and killed when the test ends.
//!
//! Under CI (`CI=true`) a missing `redis-server` fails the test with instructions; elsewhere
//! the test says loudly that it is skipped.

mod support;

use support::free_port;

use std::num::NonZeroU32;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::clock::Timestamp;
use sluice::limiter::fixed_window::Decision;
use sluice::limiter::{Algorithm, Quota, Unit};
use sluice::settings::{RedisSettings, RedisTarget};
use sluice::store::{CounterStore, Hit, MemoryStore, RedisStore, StoreError};

/// A `redis-server` child process, killed on drop.
struct Redis {
    child: Child,
    port: u16,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Finds `redis-server`, or explains what to do: fail under CI, skip loudly elsewhere.
fn redis_server_available() -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        let msg = "redis-server not found: install it with `apt-get install -y redis-server` \
                   (scripts/test.sh does this)";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{msg}");
        }
        eprintln!("SKIPPED: {msg}");
    }
    found
}

impl Redis {
    fn start_on(port: u16) -> Redis {
        Redis::spawn(port, None, &[])
    }

    /// A redis-server on 127.0.0.1:`port`, persistence off, run in `dir` with `extra` flags.
    fn spawn(port: u16, dir: Option<&std::path::Path>, extra: &[&str]) -> Redis {
        let mut cmd = Command::new("redis-server");
        if let Some(dir) = dir {
            cmd.current_dir(dir);
        }
        let child = cmd
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let r = Redis { child, port };
        r.wait_ready();
        r
    }

    fn start() -> Redis {
        Redis::start_on(free_port())
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn wait_ready(&self) {
        let start = Instant::now();
        while self.cli(&["PING"]) != "PONG" {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn settings(&self, jitter: u64) -> RedisSettings {
        RedisSettings {
            main: RedisTarget {
                urls: vec![format!("redis://127.0.0.1:{}", self.port)],
                cluster: false,
            },
            per_second: None,
            timeout: Duration::from_millis(300),
            expiration_jitter_max_seconds: jitter,
            local_cache_size_in_bytes: 0,
            stop_cache_key_increment_when_overlimit: false,
        }
    }
}

/// Starts a store and waits (bounded) until it has answered its start-up PING.
async fn store(settings: &RedisSettings) -> RedisStore {
    let store = RedisStore::start(settings).expect("store");
    let start = Instant::now();
    while !store.is_ready() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "store never ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store
}

fn quota(algorithm: Algorithm, rpu: u32, unit: Unit, burst: Option<u32>) -> Quota {
    Quota {
        requests_per_unit: rpu,
        unit,
        algorithm,
        burst: burst.and_then(NonZeroU32::new),
    }
}

async fn apply<S: CounterStore>(
    store: &S,
    now: Timestamp,
    hits: &[Hit<'_>],
) -> Result<Vec<Decision>, StoreError> {
    let mut out = Vec::new();
    store.apply(now, hits, &mut out).await?;
    Ok(out)
}

/// `tasks` concurrent callers each make `calls` one-hit calls on `key`; returns how many hits
/// were admitted in all.
async fn admitted_concurrently(
    remote: &Arc<RedisStore>,
    key: &str,
    quota: Quota,
    now: Timestamp,
    tasks: usize,
    calls: usize,
) -> usize {
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (remote, key) = (remote.clone(), key.to_owned());
            tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..calls {
                    let h = [Hit {
                        key: &key,
                        quota,
                        hits: 1,
                    }];
                    if !apply(&*remote, now, &h).await.unwrap()[0].over {
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for h in handles {
        admitted += h.await.unwrap();
    }
    admitted
}

/// The store contract: for the same calls, Redis answers exactly as the memory store does.
#[tokio::test]
async fn redis_answers_like_the_memory_store_for_every_algorithm() {
    if !redis_server_available() {
        return;
    }
    let redis = Redis::start();
    let remote = store(&redis.settings(0)).await;
    let memory = MemoryStore::new(1000);
    let quotas = [
        quota(Algorithm::FixedWindow, 7, Unit::Minute, None),
        quota(Algorithm::SlidingWindow, 7, Unit::Minute, None),
        quota(Algorithm::TokenBucket, 7, Unit::Minute, Some(3)),
        quota(Algorithm::LeakyBucket, 7, Unit::Minute, Some(2)),
    ];
    // A deterministic, irregular sequence of (µs step, hits).
    let mut now = 1_700_000_000_000_000u64;
    let mut seed = 42u64;
    for step in 0..200 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        now += (seed >> 33) % 9_000_000;
        let hits = (seed >> 20) % 3;
        for (i, q) in quotas.iter().enumerate() {
            let key = format!("contract_{i}_");
            let h = [Hit {
                key: &key,
                quota: *q,
                hits,
            }];
            let t = Timestamp::from_micros(now);
            let a = apply(&memory, t, &h).await.unwrap();
            let b = apply(&remote, t, &h).await.unwrap();
            assert_eq!(a, b, "step {step}, {:?}, hits {hits}", q.algorithm);
        }
    }
}

#[tokio::test]
async fn fixed_window_keys_and_ttls_are_the_go_service_bytes() {
    if !redis_server_available() {
        return;
    }
    let redis = Redis::start();
    let remote = store(&redis.settings(0)).await;
    let now = Timestamp::from_secs(1234);
    let hits = [
        Hit {
            key: "domain_key2_value2_subkey2_subvalue2_",
            quota: Quota::fixed(10, Unit::Minute),
            hits: 3,
        },
        Hit {
            key: "prefix:domain_key_value_",
            quota: Quota::fixed(10, Unit::Second),
            hits: 1,
        },
    ];
    let d = apply(&remote, now, &hits).await.unwrap();
    assert_eq!(d[0].remaining, 7);
    assert_eq!(
        redis.cli(&["GET", "domain_key2_value2_subkey2_subvalue2_1200"]),
        "3"
    );
    assert_eq!(redis.cli(&["GET", "prefix:domain_key_value_1234"]), "1");
    assert_eq!(
        redis.cli(&["TTL", "domain_key2_value2_subkey2_subvalue2_1200"]),
        "60"
    );
    assert_eq!(redis.cli(&["TTL", "prefix:domain_key_value_1234"]), "1");

    // With jitter, TTL is unit + [0, jitter).
    let jittered = store(&redis.settings(300)).await;
    for i in 0..20 {
        let key = format!("j{i}_");
        apply(
            &jittered,
            now,
            &[Hit {
                key: &key,
                quota: Quota::fixed(10, Unit::Minute),
                hits: 1,
            }],
        )
        .await
        .unwrap();
        let ttl: u64 = redis.cli(&["TTL", &format!("j{i}_1200")]).parse().unwrap();
        assert!((60..360).contains(&ttl), "TTL {ttl}");
    }
}

#[tokio::test]
async fn a_go_instance_and_sluice_share_one_counter() {
    if !redis_server_available() {
        return;
    }
    let redis = Redis::start();
    let remote = store(&redis.settings(0)).await;
    // A Go instance counted 5 in this window (it writes the same key with INCRBY).
    redis.cli(&["INCRBY", "shared_k_v_1200", "5"]);
    let d = apply(
        &remote,
        Timestamp::from_secs(1234),
        &[Hit {
            key: "shared_k_v_",
            quota: Quota::fixed(6, Unit::Minute),
            hits: 1,
        }],
    )
    .await
    .unwrap();
    assert_eq!((d[0].over, d[0].remaining), (false, 0));
}

#[tokio::test]
async fn concurrent_calls_admit_exactly_the_limit_with_every_script() {
    if !redis_server_available() {
        return;
    }
    let redis = Redis::start();
    let remote = Arc::new(store(&redis.settings(0)).await);
    let now = Timestamp::from_secs(1_700_000_000);
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        let key = format!("hot_{}_", algorithm.name());
        let q = quota(algorithm, 100, Unit::Hour, None);
        let admitted = admitted_concurrently(&remote, &key, q, now, 8, 50).await;
        assert_eq!(admitted, 100, "{algorithm:?}");
    }
}

#[tokio::test]
async fn scripts_are_reloaded_after_script_flush() {
    if !redis_server_available() {
        return;
    }
    let redis = Redis::start();
    let remote = store(&redis.settings(0)).await;
    let h = [Hit {
        key: "flushed_",
        quota: quota(Algorithm::TokenBucket, 5, Unit::Minute, None),
        hits: 1,
    }];
    let now = Timestamp::from_secs(1_700_000_000);
    assert_eq!(apply(&remote, now, &h).await.unwrap()[0].remaining, 4);
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]), "OK");
    assert_eq!(apply(&remote, now, &h).await.unwrap()[0].remaining, 3);
}

#[tokio::test]
async fn a_dead_redis_answers_errors_within_the_deadline_and_recovery_is_automatic() {
    if !redis_server_available() {
        return;
    }
    let port = free_port();
    let redis = Redis::start_on(port);
    let remote = store(&redis.settings(0)).await;
    let h = [Hit {
        key: "dies_",
        quota: Quota::fixed(100, Unit::Hour),
        hits: 1,
    }];
    let now = Timestamp::from_secs(1_700_000_000);
    apply(&remote, now, &h).await.unwrap();
    drop(redis);
    for _ in 0..5 {
        let started = Instant::now();
        let err = apply(&remote, now, &h).await.unwrap_err();
        assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
        // REDIS_TIMEOUT is 300 ms; allow a slow machine plenty of slack.
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    // Redis comes back on the same port (empty: persistence is off).
    let _redis = Redis::start_on(port);
    let start = Instant::now();
    loop {
        match apply(&remote, now, &h).await {
            Ok(d) => {
                assert_eq!(d[0].count_after, 1);
                break;
            }
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "no recovery: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test]
async fn an_unreachable_redis_at_start_is_not_ready_and_not_a_crash() {
    let settings = RedisSettings {
        main: RedisTarget {
            urls: vec![format!("redis://127.0.0.1:{}", free_port())],
            cluster: false,
        },
        per_second: None,
        timeout: Duration::from_millis(200),
        expiration_jitter_max_seconds: 0,
        local_cache_size_in_bytes: 0,
        stop_cache_key_increment_when_overlimit: false,
    };
    let remote = RedisStore::start(&settings).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!remote.is_ready());
    let h = [Hit {
        key: "nowhere_",
        quota: Quota::fixed(1, Unit::Second),
        hits: 1,
    }];
    assert!(apply(&remote, Timestamp::from_secs(1), &h).await.is_err());
}

#[tokio::test]
async fn the_local_over_limit_cache_stops_the_redis_value_growing() {
    if !redis_server_available() {
        return;
    }
    let redis = Redis::start();
    let mut settings = redis.settings(0);
    settings.local_cache_size_in_bytes = 1 << 20;
    let remote = store(&settings).await;
    let h = [Hit {
        key: "cached_",
        quota: Quota::fixed(2, Unit::Minute),
        hits: 1,
    }];
    let now = Timestamp::from_secs(1234);
    let over: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..6 {
            v.push(apply(&remote, now, &h).await.unwrap()[0].over);
        }
        v
    };
    assert_eq!(over, [false, false, true, true, true, true]);
    // The third call reached Redis (3), the rest were answered locally.
    assert_eq!(redis.cli(&["GET", "cached_1200"]), "3");
}

#[tokio::test]
async fn stop_flag_increments_only_the_keys_that_go_over() {
    if !redis_server_available() {
        return;
    }
    let redis = Redis::start();
    let mut settings = redis.settings(0);
    settings.stop_cache_key_increment_when_overlimit = true;
    let remote = store(&settings).await;
    let now = Timestamp::from_secs(1234);
    let hits = |n| {
        [
            Hit {
                key: "a_",
                quota: Quota::fixed(20, Unit::Minute),
                hits: n,
            },
            Hit {
                key: "b_",
                quota: Quota::fixed(10, Unit::Minute),
                hits: n,
            },
        ]
    };
    apply(&remote, now, &hits(10)).await.unwrap();
    // b would go over: only b is incremented; a stays at 10.
    let d = apply(&remote, now, &hits(1)).await.unwrap();
    assert!(d[1].over && !d[0].over);
    assert_eq!(redis.cli(&["GET", "a_1200"]), "10");
    assert_eq!(redis.cli(&["GET", "b_1200"]), "11");
}

/// The real binary on Redis: counts survive a restart of Sluice mid-window.
#[test]
fn sluice_restarted_mid_window_keeps_its_counts() {
    if !redis_server_available() {
        return;
    }
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("limits.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
    )
    .unwrap();
    let start = || {
        let http = free_port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("--config")
            .arg(dir.path())
            .env("REDIS_SOCKET_TYPE", "tcp")
            .env("REDIS_URL", format!("127.0.0.1:{}", redis.port))
            .env("HOST", "127.0.0.1")
            .env("GRPC_HOST", "127.0.0.1")
            .env("DEBUG_HOST", "127.0.0.1")
            .env("PORT", http.to_string())
            .env("GRPC_PORT", free_port().to_string())
            .env("DEBUG_PORT", free_port().to_string())
            .env_remove("BACKEND_TYPE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let begun = Instant::now();
        // Healthy only once Redis has answered.
        while support::http(http, "GET", "/healthcheck", "").map(|(s, _)| s) != Some(200) {
            if begun.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("sluice on Redis never became healthy");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (child, http)
    };
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let (mut first, port) = start();
    for _ in 0..3 {
        assert_eq!(
            support::http(port, "POST", "/json", body).map(|(s, _)| s),
            Some(200)
        );
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let (mut second, port) = start();
    let statuses: Vec<_> = (0..3)
        .map(|_| support::http(port, "POST", "/json", body).map(|(s, _)| s))
        .collect();
    second.kill().unwrap();
    second.wait().unwrap();
    // 3 before the restart + 2 more reach the limit of 5; the 6th is over.
    assert_eq!(statuses, [Some(200), Some(200), Some(429)]);
}

/// Three local redis-server nodes joined by `redis-cli --cluster create`.
struct Cluster {
    nodes: Vec<Redis>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<Redis> = (0..3)
            .map(|_| {
                let port = free_port();
                let config_file = format!("nodes-{port}.conf");
                Redis::spawn(
                    port,
                    Some(dir.path()),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &config_file,
                    ],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let start = Instant::now();
        while !nodes
            .iter()
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "cluster never ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Cluster { nodes, _dir: dir }
    }

    fn settings(&self) -> RedisSettings {
        RedisSettings {
            main: RedisTarget {
                urls: self
                    .nodes
                    .iter()
                    .map(|n| format!("redis://127.0.0.1:{}", n.port))
                    .collect(),
                cluster: true,
            },
            ..self.nodes[0].settings(0)
        }
    }

    /// GET through cluster redirections.
    fn get(&self, key: &str) -> String {
        let out = Command::new("redis-cli")
            .args([
                "-c",
                "-h",
                "127.0.0.1",
                "-p",
                &self.nodes[0].port.to_string(),
            ])
            .args(["GET", key])
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

#[tokio::test]
async fn redis_cluster_counts_every_algorithm_atomically_across_slots() {
    if !redis_server_available() {
        return;
    }
    let cluster = Cluster::start();
    let remote = Arc::new(store(&cluster.settings()).await);
    let memory = MemoryStore::new(1000);
    let now = Timestamp::from_secs(1234);
    // Keys spread over the slots of all three nodes, one request with several descriptors.
    let keys: Vec<String> = (0..12).map(|i| format!("cluster_{i}_")).collect();
    let algorithms = [
        quota(Algorithm::FixedWindow, 3, Unit::Minute, None),
        quota(Algorithm::SlidingWindow, 3, Unit::Minute, None),
        quota(Algorithm::TokenBucket, 3, Unit::Minute, None),
        quota(Algorithm::LeakyBucket, 3, Unit::Minute, Some(2)),
    ];
    for _ in 0..5 {
        let hits: Vec<Hit<'_>> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| Hit {
                key,
                quota: algorithms[i % 4],
                hits: 1,
            })
            .collect();
        let a = apply(&memory, now, &hits).await.unwrap();
        let b = apply(&*remote, now, &hits).await.unwrap();
        assert_eq!(a, b);
    }
    // The fixed-window keys hold the Go service's bytes on whichever node owns them.
    assert_eq!(cluster.get("cluster_0_1200"), "5");
    assert_eq!(cluster.get("cluster_4_1200"), "5");

    // Concurrent callers on one key admit exactly the limit.
    let q = quota(Algorithm::SlidingWindow, 50, Unit::Hour, None);
    let admitted = admitted_concurrently(&remote, "cluster_hot_", q, now, 6, 30).await;
    assert_eq!(admitted, 50);
}

#[tokio::test]
async fn per_second_limits_go_to_their_own_redis() {
    if !redis_server_available() {
        return;
    }
    let (main, per_second) = (Redis::start(), Redis::start());
    let mut settings = main.settings(0);
    settings.per_second = Some(per_second.settings(0).main);
    let remote = store(&settings).await;
    let now = Timestamp::from_secs(1234);
    apply(
        &remote,
        now,
        &[
            Hit {
                key: "s_",
                quota: Quota::fixed(5, Unit::Second),
                hits: 1,
            },
            Hit {
                key: "m_",
                quota: Quota::fixed(5, Unit::Minute),
                hits: 1,
            },
        ],
    )
    .await
    .unwrap();
    assert_eq!(per_second.cli(&["GET", "s_1234"]), "1");
    assert_eq!(main.cli(&["GET", "s_1234"]), "");
    assert_eq!(main.cli(&["GET", "m_1200"]), "1");
}
