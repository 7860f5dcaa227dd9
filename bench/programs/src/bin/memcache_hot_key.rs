//! One hot key on memcached: how many decisions a second replicas make on it, per algorithm.
//!
//! The fixed window is one `incr` a decision; the other algorithms read and `cas` their state
//! word, one Sluice's updates of a key taking turns (docs/memcache.md), so their rate on one key
//! is bounded by round trips. Starts a memcached on a free port, then for each algorithm and
//! replica count runs `CALLERS` concurrent callers per replica (each replica its own store, as
//! separate Sluice processes would be) on one key with a limit no load reaches, for `SECONDS`,
//! and prints decisions per second and how many calls failed.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin memcache_hot_key            # 3 s per run
//! cargo run --release -p sluice-bench --bin memcache_hot_key -- 10      # 10 s per run
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark times itself; Sluice's code reads time through crate::clock"
)]

use std::num::NonZeroU32;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice::clock::Timestamp;
use sluice::limiter::{Algorithm, Quota, Unit};
use sluice::store::memcache::{MemcacheConfig, MemcacheServers};
use sluice::store::redis::BreakerSettings;
use sluice::store::{CounterStore, Hit, MemcacheStore};

const CALLERS: usize = 32;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").port()
}

async fn store(port: u16) -> MemcacheStore {
    let config = MemcacheConfig {
        servers: MemcacheServers::List(vec![format!("127.0.0.1:{port}")]),
        conns: 2,
        max_pending: 1024,
        timeout: Duration::from_millis(500),
        expiration_jitter_max_seconds: 0,
        local_cache_size_in_bytes: 0,
        local_cache_max_age: std::time::Duration::from_secs(1),
        stop_cache_key_increment_when_overlimit: false,
        breaker: BreakerSettings::default(),
        tls: None,
    };
    let s = MemcacheStore::start(&config).await.expect("store");
    while !s.is_ready() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s
}

/// Decisions and failures in `seconds`, `CALLERS` callers on each of `replicas` stores.
async fn run(port: u16, algorithm: Algorithm, replicas: usize, seconds: f64) -> (u64, u64) {
    let quota = Quota {
        penalty: None,
        safe_capacity: None,
        requests_per_unit: u32::MAX,
        unit: Unit::Hour,
        algorithm,
        burst: NonZeroU32::new(1),
        charge_refused: false,
        unit_multiplier: 1,
        calendar: sluice::limiter::Calendar::EPOCH,
    };
    let key = Arc::new(format!("hot_{}_{replicas}_", algorithm.name()));
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..replicas {
        let s = Arc::new(store(port).await);
        for _ in 0..CALLERS {
            let (s, key, done, failed) = (s.clone(), key.clone(), done.clone(), failed.clone());
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::with_capacity(1);
                while Instant::now() < end {
                    let since = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .expect("after 1970");
                    let now = Timestamp::from_micros(since.as_micros() as u64);
                    let hit = [Hit {
                        key: &key,
                        quota,
                        hits: 1,
                    }];
                    out.clear();
                    match s.apply(now, &hit, &mut out).await {
                        Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("caller");
    }
    (done.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
}

#[tokio::main]
async fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let port = free_port();
    let mut memcached = Command::new("memcached")
        .args([
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-u",
            "root",
            "-t",
            "4",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("memcached (apt-get install memcached)");
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("| algorithm | replicas | decisions/s on one key | failed calls |");
    println!("|---|---|---|---|");
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        for replicas in [1, 3] {
            let (done, failed) = run(port, algorithm, replicas, seconds).await;
            println!(
                "| {} | {replicas} | {:.0} | {failed} |",
                algorithm.name(),
                done as f64 / seconds
            );
        }
    }
    let _ = memcached.kill();
    let _ = memcached.wait();
}
