//! Three real `sluice` processes on 127.0.0.1 with PEERS pointing at each other: one global
//! limit enforced exactly across them, an owner killed mid-test, and its return; with
//! SLUICE_PEER_WRITE_BEHIND and a real `redis-server`, the same without resets.

mod redis_server;
mod support;

use redis_server::{RedisServer, redis_server_available};
use support::{free_port, http, wait_for};

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice::cluster::ring::{Ring, key_hash};

struct Node {
    child: Option<Child>,
    http: u16,
    debug: u16,
    peer: u16,
    /// Extra environment, kept for restarts.
    env: Vec<(String, String)>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Node {
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn start(&mut self, peers: &str, config: &std::path::Path) {
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("--config")
            .arg(config)
            .env_remove("REDIS_URL")
            .env_remove("BACKEND_TYPE")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("HOST", "127.0.0.1")
            .env("GRPC_HOST", "127.0.0.1")
            .env("DEBUG_HOST", "127.0.0.1")
            .env("PORT", self.http.to_string())
            .env("GRPC_PORT", free_port().to_string())
            .env("DEBUG_PORT", self.debug.to_string())
            .env("PEERS", peers)
            .env("PEER_PORT", self.peer.to_string())
            .env("PEER_ADVERTISE_ADDRESS", format!("127.0.0.1:{}", self.peer))
            .env("SLUICE_PEER_TIMEOUT_MS", "300")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sluice");
        self.child = Some(child);
        let start = Instant::now();
        while http(self.http, "GET", "/healthcheck", "").is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "node never started"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Starts three peers (a limit of 10 per hour on `d`/`k`) with `env`; returns the config dir
/// (keep it alive), the nodes and the PEERS string.
fn three_nodes(env: &[(&str, &str)]) -> (tempfile::TempDir, Vec<Node>, String) {
    three_nodes_with("hour", env)
}

/// [`three_nodes`] with a limit of 10 per `unit`.
fn three_nodes_with(unit: &str, env: &[(&str, &str)]) -> (tempfile::TempDir, Vec<Node>, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("limits.yaml"),
        format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: 10}}\n"),
    )
    .unwrap();
    let mut nodes: Vec<Node> = (0..3)
        .map(|_| Node {
            child: None,
            http: free_port(),
            debug: free_port(),
            peer: free_port(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
        .collect();
    let peers = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.peer))
        .collect::<Vec<_>>()
        .join(",");
    for n in &mut nodes {
        n.start(&peers, dir.path());
    }
    (dir, nodes, peers)
}

const BODY: &str = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;

#[test]
fn three_nodes_enforce_one_limit_and_survive_losing_the_owner() {
    let (dir, mut nodes, peers) = three_nodes(&[]);
    let ring = Ring::new(peers.split(',').map(str::to_owned));
    // The memory store's key for this descriptor is the Go key stem.
    let owner_addr = ring
        .addr(ring.owner(key_hash("d_k_v_"), |_| true).unwrap())
        .to_string();
    let owner = nodes
        .iter()
        .position(|n| format!("127.0.0.1:{}", n.peer) == owner_addr)
        .unwrap();

    // Round-robin over the three nodes: exactly the limit passes, once.
    let mut admitted = 0;
    for i in 0..30 {
        let (status, body) = http(nodes[i % 3].http, "POST", "/json", BODY).expect("answer");
        assert!(status == 200 || status == 429, "{status} {body}");
        admitted += usize::from(status == 200);
    }
    assert_eq!(
        admitted,
        10,
        "last answer: {:?}",
        http(nodes[0].http, "POST", "/json", BODY)
    );
    // The owner's own 10 were local; the 20 sent to the others were forwarded to it.
    let stat = |node: &Node, name: &str| -> u64 {
        let (_, body) = http(node.debug, "GET", "/stats", "").expect("stats");
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("sluice.cluster.{name}: ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {body}"))
    };
    let sum = |name: &str| nodes.iter().map(|n| stat(n, name)).sum::<u64>();
    assert_eq!(sum("local_hits"), 10);
    assert_eq!(sum("forwarded_hits"), 20);
    assert_eq!(stat(&nodes[owner], "forwarded_hits"), 0);
    assert!(sum("peer_calls") <= 20);
    // The same numbers on the Prometheus exposition.
    let (_, metrics) = http(nodes[0].debug, "GET", "/metrics", "").expect("metrics");
    assert!(
        metrics.contains(&format!(
            "sluice_cluster_forwarded_hits_total {}",
            stat(&nodes[0], "forwarded_hits")
        )),
        "{metrics}"
    );
    assert_eq!(
        metrics.matches("sluice_cluster_peer_up{peer=").count(),
        3,
        "{metrics}"
    );

    // Kill the owner: every request on the others still gets an answer, promptly, and the
    // limit applies again on the new owner (which starts from its own count).
    nodes[owner].kill();
    let others: Vec<usize> = (0..3).filter(|&i| i != owner).collect();
    let mut admitted = 0;
    for i in 0..30 {
        let started = Instant::now();
        let (status, body) =
            http(nodes[others[i % 2]].http, "POST", "/json", BODY).expect("answer");
        assert!(started.elapsed() < Duration::from_secs(3), "slow answer");
        assert!(status == 200 || status == 429, "{status} {body}");
        admitted += usize::from(status == 200);
    }
    assert_eq!(admitted, 10, "the new owner enforces the limit");

    // The owner comes back: the others see it up again and route its keys to it.
    nodes[owner].start(&peers, dir.path());
    let start = Instant::now();
    let up_line = format!("sluice.cluster.peer_up.{owner_addr}: 1");
    while !others.iter().all(|&i| {
        http(nodes[i].debug, "GET", "/stats", "").is_some_and(|(_, b)| b.contains(&up_line))
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "owner never rejoined"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its counter restarted from zero (memory only): 10 more pass, then the limit holds.
    let mut admitted = 0;
    for i in 0..15 {
        let (status, _) = http(nodes[i % 3].http, "POST", "/json", BODY).expect("answer");
        admitted += usize::from(status == 200);
    }
    assert_eq!(admitted, 10);
}

#[test]
fn divided_mode_enforces_a_share_of_the_limit_on_each_node_without_forwarding() {
    let (_dir, nodes, _) = three_nodes(&[("SLUICE_CLUSTER_MODE", "divided")]);
    // Membership converges: every node sees all three peers up.
    let start = Instant::now();
    while !nodes.iter().all(|n| {
        http(n.debug, "GET", "/stats", "").is_some_and(|(_, b)| {
            b.lines()
                .filter(|l| l.starts_with("sluice.cluster.peer_up.") && l.ends_with(": 1"))
                .count()
                == 3
        })
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "peers never all up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Each node allows ceil(10 / 3) = 4 on its own.
    for n in &nodes {
        let admitted = (0..8)
            .filter(|_| http(n.http, "POST", "/json", BODY).expect("answer").0 == 200)
            .count();
        assert_eq!(admitted, 4);
    }
}

/// The node that owns `d`/`k` among all three.
fn owner_index(nodes: &[Node], peers: &str) -> usize {
    let ring = Ring::new(peers.split(',').map(str::to_owned));
    let owner_addr = ring.addr(ring.owner(key_hash("d_k_v_"), |_| true).unwrap());
    nodes
        .iter()
        .position(|n| format!("127.0.0.1:{}", n.peer) == owner_addr)
        .unwrap()
}

/// A `sluice.cluster.<name>` counter from a node's `/stats` (0 if absent).
fn cluster_stat(node: &Node, name: &str) -> u64 {
    http(node.debug, "GET", "/stats", "")
        .and_then(|(_, body)| {
            body.lines()
                .find_map(|l| l.strip_prefix(&format!("sluice.cluster.{name}: ")))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Sends `n` requests round-robin over the nodes `on`, each answered within `deadline`;
/// returns how many were admitted.
fn admitted_on(nodes: &[Node], on: &[usize], n: usize, deadline: Duration) -> usize {
    (0..n)
        .filter(|i| {
            let started = Instant::now();
            let (status, body) =
                http(nodes[on[i % on.len()]].http, "POST", "/json", BODY).expect("answer");
            assert!(started.elapsed() < deadline, "slow answer");
            assert!(status == 200 || status == 429, "{status} {body}");
            status == 200
        })
        .count()
}

fn durable_env(redis: &RedisServer) -> Vec<(&'static str, String)> {
    vec![
        ("SLUICE_PEER_WRITE_BEHIND", "true".into()),
        ("SLUICE_PEER_WRITE_BEHIND_MS", "100".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
    ]
}

/// The write-behind key of `d`/`k`'s daily fixed window today.
fn daily_key() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    format!("sluice:wb:{{d_k_v_}}:fw:86400:{}", now / 86_400)
}

#[test]
fn with_write_behind_losing_and_restarting_the_owner_does_not_reset_the_count() {
    if !redis_server_available() {
        return;
    }
    let redis = RedisServer::start_on(free_port());
    let env = durable_env(&redis);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // A daily window, so the test does not straddle one.
    let (dir, mut nodes, peers) = three_nodes_with("day", &env);
    let owner = owner_index(&nodes, &peers);
    let others: Vec<usize> = (0..3).filter(|&i| i != owner).collect();
    let key = daily_key();
    let in_redis = || redis.cli(&["GET", &key]).parse::<u64>().unwrap_or(0);
    let all = [0, 1, 2];
    let deadline = Duration::from_secs(3);

    // 4 hits round-robin: all pass, and the owner writes 4 behind within a flush interval,
    // with a TTL that ends with the day (plus the 1 s grace).
    assert_eq!(admitted_on(&nodes, &all, 4, deadline), 4);
    wait_for("the owner's count in Redis", Duration::from_secs(5), || {
        in_redis() == 4
    });
    let ttl_ms: u64 = redis.cli(&["PTTL", &key]).parse().unwrap();
    assert!(
        ttl_ms > 0 && ttl_ms <= 86_400_000 + 1_000,
        "TTL {ttl_ms} ms"
    );

    // The owner dies. The new owner loads 4 before answering, so 3 more make 7 in Redis;
    // a reset would have counted 3 and left Redis at max(4, 3) = 4.
    nodes[owner].kill();
    assert_eq!(admitted_on(&nodes, &others, 3, deadline), 3);
    wait_for(
        "the new owner's count in Redis",
        Duration::from_secs(5),
        || in_redis() == 7,
    );
    let loads: u64 = others
        .iter()
        .map(|&i| cluster_stat(&nodes[i], "durable.loads_found"))
        .sum();
    assert_eq!(loads, 1, "one take-over load found the count");

    // The owner restarts, empty, and the others send its keys back to it.
    let owner_addr = format!("127.0.0.1:{}", nodes[owner].peer);
    nodes[owner].start(&peers, dir.path());
    let up_line = format!("sluice.cluster.peer_up.{owner_addr}: 1");
    wait_for("the owner to rejoin", Duration::from_secs(15), || {
        others.iter().all(|&i| {
            http(nodes[i].debug, "GET", "/stats", "").is_some_and(|(_, b)| b.contains(&up_line))
        })
    });
    // It loads 7 before its first answer: 3 more pass, then the limit holds, as if no node had
    // been lost (a reset would let 10 through). Admitted in the day: 4 + 3 + 3 = the limit.
    assert_eq!(admitted_on(&nodes, &all, 10, deadline), 3);
    assert_eq!(cluster_stat(&nodes[owner], "durable.loads_found"), 1);
    wait_for(
        "the returned owner's count in Redis",
        Duration::from_secs(5),
        || in_redis() == 17,
    );
}

#[test]
fn with_write_behind_and_redis_down_the_cluster_decides_from_memory() {
    if !redis_server_available() {
        return;
    }
    let mut redis = RedisServer::start_on(free_port());
    let env = durable_env(&redis);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (_dir, mut nodes, peers) = three_nodes_with("day", &env);
    let owner = owner_index(&nodes, &peers);
    let others: Vec<usize> = (0..3).filter(|&i| i != owner).collect();
    let key = daily_key();
    let deadline = Duration::from_secs(3);
    assert_eq!(admitted_on(&nodes, &[0, 1, 2], 4, deadline), 4);
    wait_for("the owner's count in Redis", Duration::from_secs(5), || {
        redis.cli(&["GET", &key]) == "4"
    });

    // Redis goes away: answers stay prompt and the limit holds, from the owner's memory.
    redis.kill();
    assert_eq!(admitted_on(&nodes, &[0, 1, 2], 10, deadline), 6);
    wait_for("a failed flush", Duration::from_secs(5), || {
        cluster_stat(&nodes[owner], "durable.flush_failures") > 0
    });

    // Losing the owner as well: the new owner cannot load, counts that (a failure or a
    // skipped load), and enforces the limit from its own count, as without durability.
    nodes[owner].kill();
    assert_eq!(admitted_on(&nodes, &others, 12, deadline), 10);
    let missed: u64 = others
        .iter()
        .map(|&i| {
            cluster_stat(&nodes[i], "durable.load_failures")
                + cluster_stat(&nodes[i], "durable.loads_skipped")
        })
        .sum();
    assert!(missed >= 1, "no failed load counted");
}

/// The write-behind of one node, against a real Redis, driven by a manual clock.
mod durable {
    use super::*;
    use std::sync::Arc;

    use sluice::clock::Timestamp;
    use sluice::cluster::durable::{Durable, RingChanges};
    use sluice::limiter::fixed_window::Decision;
    use sluice::limiter::{Algorithm, Quota, Unit, sliding_window};
    use sluice::settings::WriteBehind;
    use sluice::store::{CounterKind, CounterStore, Hit, MemoryStore};

    fn write_behind(redis: &RedisServer) -> WriteBehind {
        let url = format!("127.0.0.1:{}", redis.port);
        let cli = sluice::settings::parse_cli_from([
            "sluice",
            "--peers",
            "a:1",
            "--peer-advertise-address",
            "a:1",
            "--peer-write-behind",
            "--redis-socket-type",
            "tcp",
            "--redis-url",
            &url,
            "--redis-timeout",
            "300ms",
            "--cache-key-prefix",
            "p:",
        ])
        .unwrap();
        cli.serve
            .validate()
            .unwrap()
            .cluster
            .unwrap()
            .write_behind
            .unwrap()
    }

    /// A node's counters and write-behind; `started` is when it last saw the ring change.
    fn node(wb: &WriteBehind, started: Timestamp) -> (Arc<MemoryStore>, Arc<RingChanges>, Durable) {
        let local = Arc::new(MemoryStore::new(1000));
        let changes = Arc::new(RingChanges::new(started));
        let durable = Durable::new(wb, local.clone(), changes.clone()).unwrap();
        (local, changes, durable)
    }

    const KEY: &str = "p:d_k_v_";

    fn hits(n: u64) -> Vec<Hit<'static>> {
        [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
        ]
        .into_iter()
        .map(|algorithm| Hit {
            key: KEY,
            quota: Quota {
                requests_per_unit: 10,
                unit: Unit::Minute,
                algorithm,
                burst: None,
            },
            hits: n,
        })
        .collect()
    }

    /// take-over, apply, mark: what an owner does with hits.
    async fn owner_apply(
        local: &MemoryStore,
        durable: &Durable,
        now: Timestamp,
        n: u64,
    ) -> Vec<Decision> {
        let hits = hits(n);
        durable.take_over(now, &hits, |_| false).await;
        let mut out = Vec::new();
        local.apply(now, &hits, &mut out).await.unwrap();
        durable.mark_dirty(&hits);
        out
    }

    #[tokio::test]
    async fn counts_are_raised_only_and_loaded_by_the_next_owner() {
        if !redis_server_available() {
            return;
        }
        let mut redis = RedisServer::start_on(free_port());
        let wb = write_behind(&redis);
        // 10 s into a minute.
        let now = Timestamp::from_secs(1_800_000_010);
        let window = now.secs() / 60;
        let fixed_key = format!("p:sluice:wb:{{d_k_v_}}:fw:60:{window}");

        // A: starts now, so it loads (Redis is empty), counts 3 of each and writes them behind.
        let (local_a, _, a) = node(&wb, now);
        // The connection comes up in the background, on this runtime.
        let begun = Instant::now();
        while !a.is_ready() {
            assert!(
                begun.elapsed() < Duration::from_secs(10),
                "Redis never answered"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        owner_apply(&local_a, &a, now, 3).await;
        assert_eq!(a.dirty_counters(), 3);
        assert_eq!(a.flush(now).await, 3);
        assert_eq!(a.dirty_counters(), 0);
        assert_eq!(redis.cli(&["GET", &fixed_key]), "3");
        // The TTL ends with the window: 50 s left, plus the 1 s grace.
        let ttl: u64 = redis.cli(&["PTTL", &fixed_key]).parse().unwrap();
        assert!((49_000..=51_000).contains(&ttl), "{ttl}");
        // Nothing changed since: the next flush writes nothing.
        assert_eq!(a.flush(now).await, 0);

        // B has been up since long before this minute and owns the key: no state means no
        // hits anywhere, so no load (the steady state pays no Redis round trip).
        let (local_b, changes_b, b) = node(&wb, Timestamp::from_secs(1_700_000_000));
        owner_apply(&local_b, &b, now, 0).await;
        assert_eq!(
            b.stats().loads.load(std::sync::atomic::Ordering::Relaxed),
            0
        );

        // C saw a ring change this minute: it loads each counter once, however many hits
        // arrive together, and continues from A's counts.
        let later = Timestamp::from_micros(now.micros() + 1_000_000);
        let (local_c, _, c) = node(&wb, later);
        let one = hits(1);
        let concurrent = (0..8).map(|_| c.take_over(later, &one, |_| false));
        futures_util::future::join_all(concurrent).await;
        assert_eq!(
            c.stats().loads.load(std::sync::atomic::Ordering::Relaxed),
            3
        );
        assert_eq!(local_c.count(KEY, Unit::Minute, later), 3);
        let sliding = local_c
            .state(CounterKind::Sliding(Unit::Minute), KEY)
            .unwrap();
        assert_eq!(
            sliding_window::counts_at(sliding, later.micros(), Unit::Minute),
            (3, 0)
        );
        assert_eq!(
            local_c.state(CounterKind::Bucket, KEY),
            local_a.state(CounterKind::Bucket, KEY)
        );
        let d = owner_apply(&local_c, &c, later, 3).await;
        assert_eq!(d[0].count_after, 6);
        assert_eq!(d[1].remaining, 4);
        assert_eq!(c.flush(later).await, 3);
        assert_eq!(redis.cli(&["GET", &fixed_key]), "6");

        // A, stale at 3, counts one more and writes 4: Redis keeps 6 (never lowered), and A
        // takes the 6 back, so the two converge within one flush.
        owner_apply(&local_a, &a, later, 1).await;
        a.flush(later).await;
        assert_eq!(redis.cli(&["GET", &fixed_key]), "6");
        assert_eq!(local_a.count(KEY, Unit::Minute, later), 6);
        assert!(
            a.stats()
                .merged_back
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 1
        );

        // B, once it sees a change, loads too.
        changes_b.record(later);
        owner_apply(&local_b, &b, later, 0).await;
        assert_eq!(local_b.count(KEY, Unit::Minute, later), 6);

        // Redis down: flushes fail and keep their counters for the next one; a load fails,
        // is counted, and the next one within a second is skipped.
        redis.kill();
        owner_apply(&local_c, &c, later, 1).await;
        assert_eq!(c.flush(later).await, 0);
        assert!(
            c.stats()
                .flush_failures
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 1
        );
        assert_eq!(c.dirty_counters(), 3);
        let (_, _, d) = node(&wb, later);
        d.take_over(later, &hits(1), |_| false).await;
        assert_eq!(
            d.stats()
                .load_failures
                .load(std::sync::atomic::Ordering::Relaxed),
            3
        );
        d.take_over(later, &hits(1), |_| false).await;
        assert_eq!(
            d.stats()
                .loads_skipped
                .load(std::sync::atomic::Ordering::Relaxed),
            3
        );
    }
}
