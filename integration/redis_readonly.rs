//! A failover that repoints an address (a Kubernetes Service, DNS, a proxy) instead of going
//! through Sentinel: the connection Sluice holds stays on the demoted master, now a replica
//! that answers every write READONLY (envoyproxy/ratelimit PR #1191,
//! REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR).
//!
//! The address is a TCP forwarder in the test, which sends each new connection to the port it
//! is pointed at, while connections already made stay where they were, as a Service's do. Two
//! real redis-servers: A, the master the forwarder points at, then a replica of B
//! (`REPLICAOF`), while the forwarder is pointed at B.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
use super::*;

use std::sync::atomic::{AtomicU16, Ordering};

/// A local port whose new connections go to 127.0.0.1:`target`, which the test can change.
struct Forwarder {
    port: u16,
    target: Arc<AtomicU16>,
    task: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    async fn start(target: u16) -> Forwarder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(AtomicU16::new(target));
        let to = target.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let port = to.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut server) =
                        tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Forwarder { port, target, task }
    }

    /// New connections go to `port` from now on; open ones stay where they are.
    fn point_at(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The settings of a store whose REDIS_URL is the forwarder.
fn through(redis: &Redis, forwarder: &Forwarder, reconnect_on_readonly: bool) -> RedisConfig {
    let mut settings = redis.settings(0);
    settings.main = RedisTarget::single(RedisNode::tcp("127.0.0.1", forwarder.port));
    settings.timeout = Duration::from_secs(2);
    settings.breaker.probe_interval = Duration::from_millis(100);
    settings.breaker.reconnect_on_readonly = reconnect_on_readonly;
    settings
}

const NOW: Timestamp = Timestamp::from_secs(1_700_000_000);

fn hit(key: &str) -> [Hit<'_>; 1] {
    [Hit {
        key,
        quota: Quota::fixed(1000, Unit::Hour),
        hits: 1,
    }]
}

/// The error of one call, which must fail.
async fn error_of(store: &RedisStore, key: &str) -> String {
    match apply(store, NOW, &hit(key)).await {
        Err(StoreError::Backend { message }) => message,
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[tokio::test]
async fn after_a_failover_that_repoints_the_address_a_readonly_reply_reconnects() {
    if !redis_server_available() {
        return;
    }
    let a = Redis::start();
    let b = Redis::start();
    let forwarder = Forwarder::start(a.port).await;
    let sluice = store(&through(&a, &forwarder, true)).await;
    let go_default = store(&through(&a, &forwarder, false)).await;
    for (s, key) in [(&sluice, "sluice_"), (&go_default, "go_")] {
        assert_eq!(apply(s, NOW, &hit(key)).await.unwrap()[0].remaining, 999);
    }

    // The failover: A is demoted to a replica of B. The address still reaches A for a while.
    assert_eq!(
        a.cli(&["REPLICAOF", "127.0.0.1", &b.port.to_string()]),
        "OK"
    );
    let e = error_of(&sluice, "after_").await;
    assert!(e.contains("read only replica"), "{e}");
    // The breaker is open: calls answer at once, and the probes, which reach A again, do not
    // take a replica for the master.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let e = error_of(&sluice, "after_").await;
    assert!(
        e.contains("is down") && e.contains("ROLE says slave"),
        "{e}"
    );
    assert!(!sluice.breakers()[0].up);

    // The address moves to B: the next probe's connection reaches the new master.
    forwarder.point_at(b.port);
    let start = Instant::now();
    let decisions = loop {
        match apply(&sluice, NOW, &hit("after_")).await {
            Ok(d) => break d,
            Err(e) => assert!(
                start.elapsed() < Duration::from_secs(5),
                "no recovery: {e:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("recovered {:?} after the address moved", start.elapsed());
    assert_eq!(decisions[0].remaining, 999, "counted on B");
    let stats = sluice.breakers()[0];
    assert!(stats.up && stats.opens == 1, "{stats:?}");
    assert!(
        b.cli(&["KEYS", "after_*"]).starts_with("after_"),
        "the key is on B"
    );

    // REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR=false, the Go service's default: the
    // connection stays on A, and every write fails while it lasts.
    for _ in 0..5 {
        let e = error_of(&go_default, "go_").await;
        assert!(e.contains("read only replica"), "{e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = go_default.breakers()[0];
    assert!(stats.up && stats.opens == 0, "{stats:?}");
}
