//! The memcache backend against real `memcached` processes (Debian's), each started by its test
//! on a free 127.0.0.1 port and killed when the test ends: the store contract; the Go service's
//! key bytes and expiries, read back with memcached's own text protocol over a plain socket; a
//! Go instance's writes and Sluice's on one key; two servers sharing the keys as the Go client
//! shares them; a killed and restarted memcached; servers from DNS SRV records served by a real
//! `dnsmasq`, followed when they change; TLS.
//!
//! Under CI (`CI=true`) a missing `memcached` or `dnsmasq` fails the test with instructions;
//! elsewhere the test says loudly that it is skipped.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
mod redis_server;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::clock::Timestamp;
use sluice::key::{go_cache_key, memcached_key};
use sluice::limiter::{Algorithm, Decision, Quota, Unit};
use sluice::store::memcache::{MemcacheConfig, MemcacheServers, MemcacheTls};
use sluice::store::redis::BreakerSettings;
use sluice::store::{CounterStore, Hit, MemcacheStore, StoreError};
use sluice_test_support::http::http;
use sluice_test_support::process::{free_port, tool_available};
use sluice_test_support::store_contract::{Routed, UnderTest, limit};
use sluice_test_support::{pki, process, store_contract};

/// A `memcached` on 127.0.0.1, killed on drop.
struct Memcached {
    child: Option<Child>,
    port: u16,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        self.kill();
    }
}

fn memcached_available() -> bool {
    tool_available(
        "memcached",
        "-V",
        "apt-get install memcached (scripts/test.sh does)",
    )
}

/// Debian puts `dnsmasq` in /usr/sbin, which is not on every PATH.
fn dnsmasq() -> &'static str {
    if std::path::Path::new("/usr/sbin/dnsmasq").exists() {
        "/usr/sbin/dnsmasq"
    } else {
        "dnsmasq"
    }
}

fn dnsmasq_available() -> bool {
    tool_available(
        dnsmasq(),
        "--version",
        "apt-get install dnsmasq-base (scripts/test.sh does)",
    )
}

impl Memcached {
    fn start() -> Memcached {
        Memcached::start_on(free_port(), &[])
    }

    /// `memcached` on 127.0.0.1:`port` (UDP off, 64 MB), answering `version` (bounded wait).
    fn start_on(port: u16, extra: &[&str]) -> Memcached {
        let child = Command::new("memcached")
            .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
            .args(["-m", "64", "-t", "2", "-u", "root"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start memcached");
        let m = Memcached {
            child: Some(child),
            port,
        };
        let start = Instant::now();
        if extra.contains(&"-Z") {
            // TLS only: up once it accepts connections.
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "memcached did not start"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            return m;
        }
        while !m
            .raw("version\r\n", |r| r.ends_with("\r\n"))
            .starts_with("VERSION")
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "memcached did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `command` on a new connection and reads until `done` says the reply is whole
    /// (empty if memcached is not there).
    fn raw(&self, command: &str, done: impl Fn(&str) -> bool) -> String {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return String::new();
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(command.as_bytes()).unwrap();
        let mut reply = String::new();
        let mut buf = [0; 4096];
        while !done(&reply) {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => reply.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        reply
    }

    /// The value of `key`, read with `get`.
    fn get(&self, key: &str) -> Option<String> {
        let reply = self.raw(&format!("get {key}\r\n"), |r| r.ends_with("END\r\n"));
        let mut lines = reply.split("\r\n");
        lines.next().filter(|l| l.starts_with("VALUE"))?;
        lines.next().map(|v| v.trim().to_owned())
    }

    /// The seconds `key` has left, read with the meta command `mg key t` (-1: no expiry).
    fn ttl(&self, key: &str) -> Option<i64> {
        let reply = self.raw(&format!("mg {key} t\r\n"), |r| r.ends_with("\r\n"));
        reply
            .trim()
            .strip_prefix("HD t")
            .map(|t| t.parse().unwrap())
    }

    /// One line-reply command, as the Go service's client sends it.
    fn command(&self, command: &str) -> String {
        self.raw(command, |r| r.ends_with("\r\n")).trim().to_owned()
    }
}

fn config(servers: MemcacheServers, jitter: u64) -> MemcacheConfig {
    MemcacheConfig {
        servers,
        conns: 2,
        max_pending: 256,
        timeout: Duration::from_millis(500),
        expiration_jitter_max_seconds: jitter,
        local_cache_size_in_bytes: 0,
        local_cache_max_age: std::time::Duration::from_secs(1),
        stop_cache_key_increment_when_overlimit: false,
        breaker: BreakerSettings {
            probe_interval: Duration::from_millis(50),
            ..BreakerSettings::default()
        },
        tls: None,
    }
}

fn on(servers: &[&Memcached]) -> MemcacheServers {
    MemcacheServers::List(
        servers
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect(),
    )
}

/// Starts a store and waits (bounded) until every server has answered.
async fn store(config: &MemcacheConfig) -> MemcacheStore {
    let store = MemcacheStore::start(config).await.expect("store");
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

async fn apply<S: CounterStore>(
    store: &S,
    now: Timestamp,
    hits: &[Hit<'_>],
) -> Result<Vec<Decision>, StoreError> {
    let mut out = Vec::new();
    store.apply(now, hits, &mut out).await?;
    Ok(out)
}

fn now() -> Timestamp {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    Timestamp::from_micros(since.as_micros() as u64)
}

fn fixed(limit: u32, unit: Unit) -> Quota {
    store_contract::limit(Algorithm::FixedWindow, limit, unit)
}

/// A fresh memcached and a store on it (no jitter); `None` (a recorded skip) when `memcached`
/// is missing and tools are not required (`process::missing`).
async fn one_server() -> Option<(Memcached, MemcacheStore)> {
    one_server_with(|_| {}).await
}

/// [`one_server`], for one contract case.
async fn memcache_under_test() -> Option<Routed<UnderTest<MemcacheStore>>> {
    let (server, store) = one_server().await?;
    Some(Routed(UnderTest {
        store,
        server: Box::new(server),
    }))
}

// The store contract: for the same calls, memcached answers exactly as the reference model
// does, for every algorithm.
store_contract!(contract, memcache_under_test);

#[tokio::test]
async fn fixed_window_keys_and_expiries_are_the_go_service_bytes() {
    let Some((m, s)) = one_server().await else {
        return;
    };
    let t = now();
    let stem = "prefix:domain_key_value_";
    let minute = fixed(10, Unit::Minute);
    apply(
        &s,
        t,
        &[Hit {
            key: stem,
            quota: minute,
            hits: 2,
        }],
    )
    .await
    .unwrap();
    let d = apply(
        &s,
        t,
        &[Hit {
            key: stem,
            quota: minute,
            hits: 1,
        }],
    )
    .await
    .unwrap();
    assert_eq!(d[0].remaining, 7);
    // CACHE_KEY_PREFIX + domain_key_value_ + the window's start: the bytes Go writes.
    let key = go_cache_key(stem, t, Unit::Minute);
    assert_eq!(key, format!("{stem}{}", t.secs() / 60 * 60));
    assert_eq!(m.get(&key).as_deref(), Some("3"));
    let ttl = m.ttl(&key).expect("the key has an expiry");
    assert!(
        (55..=61).contains(&ttl),
        "a minute's key lives a minute, and a second for memcached's clock: {ttl}"
    );

    // MONTH plus a jitter and YEAR are past memcached's 30 days of relative expiry: sent as the
    // time they end, they live their window (the Go service's expire at once).
    let jittered = store(&config(on(&[&m]), 300)).await;
    for (unit, secs) in [(Unit::Month, 30 * 86_400), (Unit::Year, 365 * 86_400)] {
        let q = fixed(5, unit);
        let stem = "d_long_window_";
        apply(
            &jittered,
            t,
            &[Hit {
                key: stem,
                quota: q,
                hits: 1,
            }],
        )
        .await
        .unwrap();
        let key = go_cache_key(stem, t, unit);
        assert_eq!(m.get(&key).as_deref(), Some("1"), "{unit:?}");
        let ttl = m.ttl(&key).expect("the key has an expiry");
        assert!(ttl > secs - 60 && ttl <= secs + 300, "{unit:?}: {ttl}");
    }
}

#[tokio::test]
async fn a_go_instance_and_sluice_count_on_the_same_keys() {
    let Some((m, s)) = one_server().await else {
        return;
    };
    let t = now();
    let q = fixed(5, Unit::Hour);
    let stem = "shared_key_value_";
    let key = go_cache_key(stem, t, Unit::Hour);
    // The Go service's writes for a request of 2 hits on a new key, then one of 1 hit.
    assert_eq!(m.command(&format!("add {key} 0 3600 1\r\n2\r\n")), "STORED");
    assert_eq!(m.command(&format!("incr {key} 1\r\n")), "3");
    let d = apply(
        &s,
        t,
        &[Hit {
            key: stem,
            quota: q,
            hits: 1,
        }],
    )
    .await
    .unwrap();
    assert_eq!((d[0].over, d[0].remaining), (false, 1));
    // And Go reads what Sluice counted.
    assert_eq!(m.get(&key).as_deref(), Some("4"));
    let d = apply(
        &s,
        t,
        &[Hit {
            key: stem,
            quota: q,
            hits: 2,
        }],
    )
    .await
    .unwrap();
    assert!(d[0].over);
    assert_eq!(
        m.get(&key).as_deref(),
        Some("6"),
        "every hit is counted, as in Go"
    );
}

#[tokio::test]
async fn keys_memcached_cannot_store_are_counted_under_their_hash() {
    let Some((m, s)) = one_server().await else {
        return;
    };
    let t = now();
    let q = fixed(2, Unit::Hour);
    let long = format!("d_path_{}_", "p".repeat(300));
    for stem in ["d_ua_Mozilla 5.0 (X11)_", "d_k_tab\there_", long.as_str()] {
        let over: Vec<bool> = futures_util::future::join_all((0..3).map(|_| async {
            apply(
                &s,
                t,
                &[Hit {
                    key: stem,
                    quota: q,
                    hits: 1,
                }],
            )
            .await
            .unwrap()[0]
                .over
        }))
        .await;
        assert_eq!(
            over.iter().filter(|o| **o).count(),
            1,
            "{stem:?}: the limit applies"
        );
        let stored = memcached_key(go_cache_key(stem, t, Unit::Hour));
        assert!(stored.starts_with("sluice:"), "{stored}");
        assert_eq!(m.get(&stored).as_deref(), Some("3"), "{stem:?}");
    }
}

/// A fresh memcached and a store on it with `configure`d settings; `None` (a recorded skip)
/// when `memcached` is missing and tools are not required (`process::missing`).
async fn one_server_with(
    configure: impl FnOnce(&mut MemcacheConfig),
) -> Option<(Memcached, MemcacheStore)> {
    if !memcached_available() {
        return None;
    }
    let m = Memcached::start();
    let mut c = config(on(&[&m]), 0);
    configure(&mut c);
    let s = store(&c).await;
    Some((m, s))
}

#[tokio::test]
async fn the_local_over_limit_cache_stops_the_memcached_value_growing() {
    let Some((m, s)) = one_server_with(|c| c.local_cache_size_in_bytes = 1 << 20).await else {
        return;
    };
    let h = [Hit {
        key: "cached_",
        quota: fixed(2, Unit::Minute),
        hits: 1,
    }];
    let t = Timestamp::from_secs(1234);
    let mut over = Vec::new();
    for _ in 0..6 {
        over.push(apply(&s, t, &h).await.unwrap()[0].over);
    }
    assert_eq!(over, [false, false, true, true, true, true]);
    // The third call reached memcached (3), the rest were answered locally.
    assert_eq!(m.get("cached_1200").as_deref(), Some("3"));
}

/// envoyproxy/ratelimit #1077 on memcached: a request carrying its own limit of 100 is not
/// refused from the local cache that knows its key over the configured limit of 2.
#[tokio::test]
async fn a_requests_own_higher_limit_is_not_refused_from_the_memcached_local_cache() {
    let Some((m, s)) = one_server_with(|c| c.local_cache_size_in_bytes = 1 << 20).await else {
        return;
    };
    let with = |limit: u32| {
        [Hit {
            key: "tenant_t1_",
            quota: fixed(limit, Unit::Minute),
            hits: 1,
        }]
    };
    let t = Timestamp::from_secs(1234);
    let mut over = Vec::new();
    for _ in 0..3 {
        over.push(apply(&s, t, &with(2)).await.unwrap()[0].over);
    }
    assert_eq!(over, [false, false, true]);
    for n in 4..=6u64 {
        let d = apply(&s, t, &with(100)).await.unwrap()[0];
        assert!(
            !d.over,
            "a request with its own limit of 100 refused at {n}: {d:?}"
        );
    }
    assert_eq!(m.get("tenant_t1_1200").as_deref(), Some("6"));
    assert!(apply(&s, t, &with(2)).await.unwrap()[0].over);
    assert_eq!(m.get("tenant_t1_1200").as_deref(), Some("6"));
}

/// A fixed window's refund is memcached's `decr` on the Go key (floored at 0, a missing key not
/// made), and the local over-limit cache forgets the key at once.
#[tokio::test]
async fn a_refund_decrements_the_go_key_and_frees_the_local_cache() {
    let Some((m, s)) = one_server_with(|c| c.local_cache_size_in_bytes = 1 << 20).await else {
        return;
    };
    let q = fixed(3, Unit::Hour);
    let one = [Hit {
        key: "inflight_",
        quota: q,
        hits: 1,
    }];
    let t = Timestamp::from_secs(3_700);
    for _ in 0..5 {
        apply(&s, t, &one).await.unwrap();
    }
    // 4 counted; the 5th answered from the cache.
    assert_eq!(m.get("inflight_3600").as_deref(), Some("4"));
    assert!(!s.counts_refused(&q));
    let mut back = Vec::new();
    s.refund(t, &one, &mut back).await.unwrap();
    assert_eq!(m.get("inflight_3600").as_deref().map(str::trim), Some("3"));
    assert_eq!((back[0].over, back[0].remaining), (false, 0));
    // Forgotten by the cache: counted again.
    assert!(apply(&s, t, &one).await.unwrap()[0].over);
    assert_eq!(m.get("inflight_3600").as_deref().map(str::trim), Some("4"));
    let refunds = [
        Hit { hits: 9, ..one[0] },
        Hit {
            key: "never_",
            quota: q,
            hits: 2,
        },
    ];
    let mut back = Vec::new();
    s.refund(t, &refunds, &mut back).await.unwrap();
    assert_eq!(m.get("inflight_3600").as_deref().map(str::trim), Some("0"));
    assert_eq!(m.get("never_3600"), None);
    assert_eq!(back.iter().map(|d| d.remaining).collect::<Vec<_>>(), [3, 3]);
}

#[tokio::test]
async fn stop_flag_increments_only_the_keys_that_go_over() {
    let Some((m, s)) = one_server_with(|c| c.stop_cache_key_increment_when_overlimit = true).await
    else {
        return;
    };
    let t = Timestamp::from_secs(1234);
    let hits = |n| {
        [
            Hit {
                key: "a_",
                quota: fixed(20, Unit::Minute),
                hits: n,
            },
            Hit {
                key: "b_",
                quota: fixed(10, Unit::Minute),
                hits: n,
            },
        ]
    };
    apply(&s, t, &hits(10)).await.unwrap();
    // b would go over: only b is incremented; a stays at 10.
    let d = apply(&s, t, &hits(1)).await.unwrap();
    assert!(d[1].over && !d[0].over);
    assert_eq!(m.get("a_1200").as_deref(), Some("10"));
    assert_eq!(m.get("b_1200").as_deref(), Some("11"));
}

#[tokio::test]
async fn a_unix_socket_path_is_a_server_too() {
    if !memcached_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("memcached.sock");
    let child = Command::new("memcached")
        .args(["-s", path.to_str().unwrap(), "-u", "root", "-m", "16"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start memcached");
    let _m = Memcached {
        child: Some(child),
        port: 0,
    };
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(&path).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "memcached did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let servers = MemcacheServers::List(vec![path.to_str().unwrap().to_owned()]);
    let s = store(&config(servers, 0)).await;
    let h = [Hit {
        key: "unix_k_v_",
        quota: fixed(2, Unit::Hour),
        hits: 1,
    }];
    let over: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(apply(&s, now(), &h).await.unwrap()[0].over);
        }
        v
    };
    assert_eq!(over, [false, false, true]);
}

#[tokio::test]
async fn two_servers_share_the_keys_as_the_go_client_does() {
    if !memcached_available() {
        return;
    }
    let (a, b) = (Memcached::start(), Memcached::start());
    let s = store(&config(on(&[&a, &b]), 0)).await;
    let t = now();
    let q = fixed(100, Unit::Hour);
    let mut on_each = [0; 2];
    for i in 0..40 {
        let stem = format!("spread_k_v{i}_");
        apply(
            &s,
            t,
            &[Hit {
                key: &stem,
                quota: q,
                hits: 1,
            }],
        )
        .await
        .unwrap();
        let key = go_cache_key(&stem, t, Unit::Hour);
        // gomemcache's ServerList.PickServer: crc32.ChecksumIEEE(key) % len(servers).
        let expected = crc32fast::hash(key.as_bytes()) as usize % 2;
        let found = [a.get(&key), b.get(&key)];
        assert_eq!(found[expected].as_deref(), Some("1"), "{key}");
        assert_eq!(found[1 - expected], None, "{key} only on its server");
        on_each[expected] += 1;
    }
    assert!(on_each[0] > 5 && on_each[1] > 5, "{on_each:?}");
}

#[tokio::test]
async fn a_killed_memcached_fails_fast_until_it_is_back() {
    if !memcached_available() {
        return;
    }
    let port = free_port();
    let mut m = Memcached::start_on(port, &[]);
    let s = store(&config(on(&[&m]), 0)).await;
    let q = fixed(100, Unit::Hour);
    let hit = [Hit {
        key: "restart_k_v_",
        quota: q,
        hits: 1,
    }];
    apply(&s, now(), &hit).await.expect("memcached answers");
    m.kill();
    let e = apply(&s, now(), &hit).await.expect_err("memcached is gone");
    assert!(matches!(e, StoreError::Backend { .. }), "{e}");
    // The breaker is open: calls fail at once, saying why.
    let e = apply(&s, now(), &hit)
        .await
        .expect_err("still gone")
        .to_string();
    assert!(
        e.contains("is down") && e.contains("SLUICE_MEMCACHE_PROBE_INTERVAL_MS"),
        "{e}"
    );
    assert!(s.breakers()[0].1.opens >= 1);
    // Back on the same port (empty: memcached keeps nothing), the probe restores service.
    let m = Memcached::start_on(port, &[]);
    let start = Instant::now();
    loop {
        if let Ok(d) = apply(&s, now(), &hit).await {
            assert_eq!(d[0].remaining, 99, "counting starts again");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "service never resumed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(s.is_ready());
    drop(m);
}

#[tokio::test]
async fn replicas_updating_one_key_with_cas_admit_exactly_the_limit() {
    if !memcached_available() {
        return;
    }
    let m = Memcached::start();
    let replicas = [
        Arc::new(store(&config(on(&[&m]), 0)).await),
        Arc::new(store(&config(on(&[&m]), 0)).await),
        Arc::new(store(&config(on(&[&m]), 0)).await),
    ];
    let t = now();
    for algorithm in Algorithm::RATES {
        let q = limit(algorithm, 40, Unit::Hour);
        let key = format!("replicas_{}_", algorithm.name());
        let calls = (0..90).map(|i| {
            let (s, key) = (replicas[i % 3].clone(), key.clone());
            tokio::spawn(async move {
                let h = [Hit {
                    key: &key,
                    quota: q,
                    hits: 1,
                }];
                !apply(&*s, t, &h).await.expect("answered")[0].over
            })
        });
        let mut admitted = 0;
        for c in calls.collect::<Vec<_>>() {
            admitted += usize::from(c.await.unwrap());
        }
        assert_eq!(admitted, 40, "{algorithm:?}");
    }
}

/// A `dnsmasq` answering SRV records for `_memcache._tcp.sluice.test`, killed on drop.
struct Dns {
    child: Child,
    port: u16,
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dns {
    fn start(port: u16, memcached: &[&Memcached]) -> Dns {
        let mut cmd = Command::new(dnsmasq());
        cmd.args([
            "-k",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--pid-file=",
        ])
        .args(["--listen-address=127.0.0.1", &format!("--port={port}")]);
        for m in memcached {
            cmd.arg(format!(
                "--srv-host=_memcache._tcp.sluice.test,localhost,{}",
                m.port
            ));
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dnsmasq");
        std::thread::sleep(Duration::from_millis(200));
        Dns { child, port }
    }
}

fn addresses(s: &MemcacheStore) -> Vec<String> {
    s.breakers().into_iter().map(|(addr, _)| addr).collect()
}

#[tokio::test]
async fn srv_records_name_the_servers_and_a_refresh_follows_them() {
    if !memcached_available() || !dnsmasq_available() {
        return;
    }
    let (a, b) = (Memcached::start(), Memcached::start());
    let dns_port = free_port();
    let dns = Dns::start(dns_port, &[&a, &b]);
    let srv = MemcacheServers::Srv {
        name: "_memcache._tcp.sluice.test".into(),
        refresh: Some(Duration::from_millis(100)),
        resolver: Some(format!("127.0.0.1:{}", dns.port).parse().unwrap()),
    };
    let s = store(&config(srv, 0)).await;
    // As Go writes them (`target.:port`), sorted.
    let mut expected = vec![
        format!("localhost.:{}", a.port),
        format!("localhost.:{}", b.port),
    ];
    expected.sort();
    assert_eq!(addresses(&s), expected);
    let t = now();
    let q = fixed(100, Unit::Hour);
    let key = go_cache_key("srv_k_v_", t, Unit::Hour);
    apply(
        &s,
        t,
        &[Hit {
            key: "srv_k_v_",
            quota: q,
            hits: 1,
        }],
    )
    .await
    .unwrap();
    assert_eq!(
        [a.get(&key), b.get(&key)].iter().flatten().count(),
        1,
        "counted on one of the servers"
    );
    // The records change: the refresh follows, and the remaining server takes every key.
    drop(dns);
    let _dns = Dns::start(dns_port, &[&b]);
    let start = Instant::now();
    while addresses(&s) != [format!("localhost.:{}", b.port)] {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never refreshed: {:?}",
            addresses(&s)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let d = apply(
        &s,
        t,
        &[Hit {
            key: "srv_k2_v_",
            quota: q,
            hits: 1,
        }],
    )
    .await
    .unwrap();
    assert!(!d[0].over);
    assert_eq!(
        b.get(&go_cache_key("srv_k2_v_", t, Unit::Hour)).as_deref(),
        Some("1")
    );
}

#[tokio::test]
async fn an_srv_name_that_does_not_resolve_stops_start_up() {
    if !dnsmasq_available() {
        return;
    }
    let dns = Dns::start(free_port(), &[]);
    let srv = MemcacheServers::Srv {
        name: "_memcache._tcp.sluice.test".into(),
        refresh: None,
        resolver: Some(format!("127.0.0.1:{}", dns.port).parse().unwrap()),
    };
    let e = MemcacheStore::start(&config(srv, 0))
        .await
        .err()
        .expect("no servers")
        .to_string();
    assert!(
        e.contains("MEMCACHE_SRV=_memcache._tcp.sluice.test: unable to fetch servers"),
        "{e}"
    );
}

#[tokio::test]
async fn tls_to_memcached_checks_the_chain_and_the_name() {
    if !memcached_available() {
        return;
    }
    let pki = pki::TestPki::new();
    let leaf = pki.leaf("memcached", &["127.0.0.1"]);
    let other = pki.leaf("other", &["other.example"]);
    let tls_server = |leaf: &pki::Leaf| {
        let opts = format!(
            "ssl_chain_cert={},ssl_key={}",
            leaf.cert.display(),
            leaf.key.display()
        );
        Memcached::start_on(free_port(), &["-Z", "-o", &opts])
    };
    let client = |skip: bool| MemcacheTls {
        client: sluice::tls::ClientTls::from_files(
            Some(sluice::tls::PemFile::new("MEMCACHE_TLS_CACERT", &pki.ca)),
            None,
            None,
        )
        .unwrap(),
        skip_hostname_verification: skip,
    };
    let q = fixed(10, Unit::Hour);
    let hit = [Hit {
        key: "tls_k_v_",
        quota: q,
        hits: 1,
    }];

    let m = tls_server(&leaf);
    let mut c = config(on(&[&m]), 0);
    c.tls = Some(client(false));
    let s = store(&c).await;
    assert_eq!(apply(&s, now(), &hit).await.unwrap()[0].remaining, 9);

    // A certificate for another name: refused, unless the name is not checked.
    let wrong = tls_server(&other);
    let mut c = config(on(&[&wrong]), 0);
    c.tls = Some(client(false));
    let refused = MemcacheStore::start(&c).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!refused.is_ready());
    let e = apply(&refused, now(), &hit).await.unwrap_err().to_string();
    assert!(e.contains("not connected to memcached yet"), "{e}");
    c.tls = Some(client(true));
    let s = store(&c).await;
    assert_eq!(apply(&s, now(), &hit).await.unwrap()[0].remaining, 9);
}

/// The binary, kept from reading the test runner's own settings.
struct SluiceProcess(Child);

impl Drop for SluiceProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An envoyproxy/ratelimit deployment on memcached, image swapped: the Go service's variables
/// and config layout, nothing else.
#[test]
fn the_binary_serves_on_memcached_with_the_go_services_variables() {
    if !memcached_available() {
        return;
    }
    process::with_minute_to_spare(20);
    let m = Memcached::start();
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("limits.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    )
    .unwrap();
    let (http_port, grpc, debug) = (free_port(), free_port(), free_port());
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    for (var, _) in std::env::vars().filter(|(v, _)| {
        v.starts_with("REDIS") || v.starts_with("MEMCACHE") || v.starts_with("SLUICE")
    }) {
        c.env_remove(var);
    }
    c.env("BACKEND_TYPE", "memcache")
        .env("MEMCACHE_HOST_PORT", format!("127.0.0.1:{}", m.port))
        .env("MEMCACHE_MAX_IDLE_CONNS", "4")
        .env("CACHE_KEY_PREFIX", "rl:")
        .env("RUNTIME_ROOT", root.path())
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("USE_STATSD", "false")
        .env("HOST", "127.0.0.1")
        .env("GRPC_HOST", "127.0.0.1")
        .env("DEBUG_HOST", "127.0.0.1")
        .env("PORT", http_port.to_string())
        .env("GRPC_PORT", grpc.to_string())
        .env("DEBUG_PORT", debug.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _sluice = SluiceProcess(c.spawn().expect("spawn sluice"));
    process::wait_for("healthy on memcached", Duration::from_secs(20), || {
        http(http_port, "GET", "/healthcheck", "").is_some_and(|(s, _)| s == 200)
    });
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let codes: Vec<u16> = (0..3)
        .map(|_| http(http_port, "POST", "/json", body).expect("answered").0)
        .collect();
    assert_eq!(codes, [200, 200, 429]);
    let key = go_cache_key("rl:d_k_v_", now(), Unit::Minute);
    assert_eq!(
        m.get(&key).as_deref(),
        Some("3"),
        "the Go service's key and count"
    );
    let server = format!("127.0.0.1:{}", m.port);
    let metrics = http(debug, "GET", "/metrics", "").expect("metrics").1;
    assert!(
        metrics.contains(&format!("sluice_memcache_up{{server=\"{server}\"}} 1")),
        "{metrics}"
    );
    // memcached gone: answered OK, as the Go service's memcache backend does, and the
    // breaker says so.
    drop(m);
    let (status, answer) = http(http_port, "POST", "/json", body).expect("answered");
    assert_eq!(status, 200, "{answer}");
    let stats = http(debug, "GET", "/stats", "").expect("stats").1;
    assert!(
        stats.contains(&format!("sluice.memcache.{server}.up: 0")),
        "{stats}"
    );
}

/// The expiry each key is given, read back (`mg key t`) and held to the state's lifetime: the
/// key is deleted and a call at the earliest time memcached could have dropped it must answer
/// as the model, which kept the state (`store_contract::expiries_outlast_every_state`: every
/// algorithm, leaky buckets one emission interval past their excess, debts, windows of several
/// units, fixed and sliding windows of a second).
#[tokio::test]
async fn every_key_lives_as_long_as_its_state() {
    /// memcached's clock counts whole seconds: a key given `E` seconds is dropped when that
    /// clock has ticked `E` times, which may be as little as `E - 1` seconds and a moment
    /// later. `mg key t` answers `E` when the clock did not tick between the write and the
    /// read (`stats` time unchanged); otherwise the case is tried again.
    struct ClockExpiry<'a> {
        memcached: &'a Memcached,
        clock: u64,
    }
    impl store_contract::Expiry for ClockExpiry<'_> {
        fn before_write(&mut self) {
            self.clock = self.memcached.clock();
        }
        fn earliest_drop(&mut self, hit: &Hit<'_>, now: Timestamp) -> Option<Duration> {
            let key = memcached_key(match hit.quota.algorithm {
                Algorithm::FixedWindow => go_cache_key(hit.key, now, hit.quota.window()),
                _ => sluice::key::state_key(hit.key, &hit.quota),
            });
            let ttl = self.memcached.ttl(&key).expect("the key has an expiry");
            let ticked = self.memcached.clock() != self.clock;
            assert_eq!(
                self.memcached.command(&format!("delete {key}\r\n")),
                "DELETED"
            );
            assert!(ttl > 0, "{key} expires at once ({ttl})");
            (!ticked).then(|| Duration::from_secs(ttl as u64 - 1))
        }
    }
    let Some((m, s)) = one_server().await else {
        return;
    };
    let mut expiry = ClockExpiry {
        memcached: &m,
        clock: 0,
    };
    store_contract::expiries_outlast_every_state(&s, &mut expiry).await;
}

impl Memcached {
    /// memcached's own clock, in whole seconds (`stats`: `time`).
    fn clock(&self) -> u64 {
        let reply = self.raw("stats\r\n", |r| r.ends_with("END\r\n"));
        reply
            .lines()
            .find_map(|l| l.strip_prefix("STAT time "))
            .and_then(|t| t.trim().parse().ok())
            .expect("stats has the time")
    }
}
