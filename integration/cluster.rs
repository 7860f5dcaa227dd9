//! Three real `sluice` processes on 127.0.0.1 with PEERS pointing at each other: one global
//! limit enforced exactly across them, an owner killed mid-test, and its return; with
//! SLUICE_PEER_WRITE_BEHIND and a real `redis-server`, the same without resets; with
//! SLUICE_PEER_TLS, the same over mutual TLS, strangers refused, and a rotated certificate
//! picked up both ways; with SLUICE_CLUSTER_MODE=lease, every algorithm's limit held and used
//! under load spread over the three, a node killed mid-window, and a node joining.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
mod in_flight;
mod node;
mod penalty;
mod redis_server;

use node::Node;
use redis_server::{RedisServer, redis_server_available};

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice::cluster::ring::{Ring, key_hash};
use sluice_test_support::http::http;
use sluice_test_support::process::{free_port, wait_for};
use sluice_test_support::{pki, process, rlqs_envoy};

/// `n` peers, not started, each with `env`, and their PEERS string.
fn peer_nodes(n: usize, env: &[(String, String)]) -> (Vec<Node>, String) {
    let nodes: Vec<Node> = (0..n).map(|_| Node::new(env.to_vec())).collect();
    let peers = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.peer))
        .collect::<Vec<_>>()
        .join(",");
    (nodes, peers)
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
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (mut nodes, peers) = peer_nodes(3, &env);
    for n in &mut nodes {
        n.start(&peers, dir.path());
    }
    wait_settled(&nodes);
    (dir, nodes, peers)
}

/// Waits until every node's join has settled (`sluice.cluster.joining: 0`). Until then a node
/// relays the keys it owns to their previous owner (docs/cluster.md, "A node joining"), and the
/// tests that read or kill a key's owner mean the owner that counts it.
fn wait_settled(nodes: &[Node]) {
    for (i, n) in nodes.iter().enumerate() {
        wait_for(
            &format!("node {i}'s join to settle"),
            Duration::from_secs(10),
            || {
                http(n.debug, "GET", "/stats", "")
                    .is_some_and(|(_, b)| b.contains("sluice.cluster.joining: 0"))
            },
        );
    }
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
    // Calls: the forwards, and the owner's first hit asking the key's previous owner for its
    // count of the hour (it started in this hour: docs/cluster.md, "A node joining"), none.
    assert!(sum("relayed_hits") <= 1);
    assert_eq!(sum("taken_over"), 0);
    assert!(sum("peer_calls") <= 20 + sum("relayed_hits"));
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
    // Its memory is empty, but the hour's count is the stand-in's: the restarted owner relays
    // the key's hits there until its join settles, then takes the count over, and the limit
    // holds (before, its counter restarted from zero and 10 more passed).
    let mut admitted = 0;
    for i in 0..15 {
        let (status, _) = http(nodes[i % 3].http, "POST", "/json", BODY).expect("answer");
        admitted += usize::from(status == 200);
    }
    assert_eq!(admitted, 0);
    assert!(stat(&nodes[owner], "relayed_hits") >= 1);
    assert_eq!(stat(&nodes[owner], "failed_relays"), 0);
}

/// The counter admin on a three-node cluster: every node's `/debug/counters` shows the owner's
/// count (the peek is forwarded like a charge), a reset from a node that does not own the key
/// reaches the owner, and a node without SLUICE_DEBUG_COUNTER_RESET refuses to reset.
#[test]
fn debug_counters_are_read_and_reset_on_the_owner_from_any_node() {
    let (_dir, nodes, peers) = three_nodes(&[("SLUICE_DEBUG_COUNTER_RESET", "true")]);
    let owner = owner_index(&nodes, &peers);
    let other = (owner + 1) % 3;
    for i in 0..12 {
        http(nodes[i % 3].http, "POST", "/json", BODY).expect("answer");
    }
    let query = "/debug/counters?domain=d&descriptor=k=v";
    let count = |node: &Node| -> serde_json::Value {
        let (status, body) = http(node.debug, "GET", query, "").expect("answer");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["counters"][0]["key"], "d_k_v_", "{v}");
        v["counters"][0].clone()
    };
    for node in &nodes {
        let c = count(node);
        assert_eq!(
            (c["count"].as_u64(), c["over"].as_bool()),
            (Some(12), Some(true)),
            "{c}"
        );
    }
    assert_eq!(
        http(nodes[owner].http, "POST", "/json", BODY).unwrap().0,
        429
    );
    let reset = query.replace("counters?", "counters/reset?");
    let (status, body) = http(nodes[other].debug, "POST", &reset, "").expect("answer");
    assert_eq!(status, 200, "{body}");
    for node in &nodes {
        let c = count(node);
        assert_eq!(
            (c["count"].as_u64(), c["remaining"].as_u64()),
            (Some(0), Some(10)),
            "{c}"
        );
    }
    // The limit is whole again, on every node.
    let admitted = (0..12)
        .filter(|i| http(nodes[i % 3].http, "POST", "/json", BODY).unwrap().0 == 200)
        .count();
    assert_eq!(admitted, 10);
}

#[test]
fn a_node_without_the_setting_refuses_to_reset_counters() {
    let (_dir, nodes, _) = three_nodes(&[]);
    http(nodes[0].http, "POST", "/json", BODY).expect("answer");
    let (status, body) = http(
        nodes[1].debug,
        "POST",
        "/debug/counters/reset?domain=d&descriptor=k=v",
        "",
    )
    .expect("answer");
    assert_eq!(status, 403, "{body}");
    let (_, body) = http(
        nodes[2].debug,
        "GET",
        "/debug/counters?domain=d&descriptor=k=v",
        "",
    )
    .expect("answer");
    assert!(body.contains(r#""count":1"#), "{body}");
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
    // It continues from the stand-in's 7, relayed there or taken over (docs/cluster.md, "A node
    // joining"), and from Redis's 7 too: 3 more pass, then the limit holds, as if no node had
    // been lost (a reset would let 10 through). Admitted in the day: 4 + 3 + 3 = the limit.
    assert_eq!(admitted_on(&nodes, &all, 10, deadline), 3);
    assert!(cluster_stat(&nodes[owner], "relayed_hits") >= 1);
    wait_for(
        "the returned owner's count in Redis",
        Duration::from_secs(5),
        || in_redis() == 17,
    );
}

/// `algorithm: concurrency` with write-behind: the owner writes its slots behind, and when it
/// is lost the new owner loads them before answering, so the slots held stay held (a reset
/// would admit 3 more) and a refund still frees one.
#[test]
fn with_write_behind_losing_the_owner_keeps_the_slots_held() {
    if !redis_server_available() {
        return;
    }
    let redis = RedisServer::start_on(free_port());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("limits.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: concurrency}\n",
    )
    .unwrap();
    let env: Vec<(String, String)> = durable_env(&redis)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let (mut nodes, peers) = peer_nodes(3, &env);
    for n in &mut nodes {
        n.start(&peers, dir.path());
    }
    let owner = owner_index(&nodes, &peers);
    let others: Vec<usize> = (0..3).filter(|&i| i != owner).collect();
    let key = "sluice:wb:{d_k_v_}:cc:60";
    let slots_in_redis = || {
        redis
            .cli(&["GET", key])
            .split_whitespace()
            .count()
            .saturating_sub(2)
    };
    let deadline = Duration::from_secs(3);
    // Two requests start (round-robin), and the owner writes their two slots behind.
    assert_eq!(admitted_on(&nodes, &[0, 1, 2], 2, deadline), 2);
    wait_for("the owner's slots in Redis", Duration::from_secs(5), || {
        slots_in_redis() == 2
    });
    let ttl_ms: u64 = redis.cli(&["PTTL", key]).parse().unwrap();
    assert!(ttl_ms > 55_000 && ttl_ms <= 61_000, "TTL {ttl_ms} ms");
    // The owner dies: the new owner loads the two before answering: one more fits (a reset
    // would have let both through).
    nodes[owner].kill();
    assert_eq!(admitted_on(&nodes, &others, 2, deadline), 1);
    let loads: u64 = others
        .iter()
        .map(|&i| cluster_stat(&nodes[i], "durable.loads_found"))
        .sum();
    assert_eq!(loads, 1, "one take-over load found the slots");
    // The refused request's refund pays its debt, an admitted one's frees a slot: one fits.
    let refund = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"is_negative_hits":true}]}"#;
    for &i in &others {
        let (status, _) = http(nodes[i].http, "POST", "/json", refund).expect("answer");
        assert_eq!(status, 200);
    }
    assert_eq!(admitted_on(&nodes, &others, 2, deadline), 1);
    wait_for(
        "the new owner's slots in Redis",
        Duration::from_secs(5),
        || slots_in_redis() == 3,
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

#[test]
fn with_write_behind_a_stalled_redis_costs_forwarded_hits_no_answer_and_marks_no_peer_down() {
    if !redis_server_available() {
        return;
    }
    let redis = RedisServer::start_on(free_port());
    let mut env = durable_env(&redis);
    // A Redis deadline far past the peers' (1 s here): a take-over load bounded by
    // REDIS_TIMEOUT alone outlasts the forwarded call it runs in.
    env.push(("REDIS_TIMEOUT", "5s".into()));
    env.push(("SLUICE_PEER_TIMEOUT_MS", "1000".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (_dir, nodes, peers) = three_nodes_with("day", &env);
    let owner = owner_index(&nodes, &peers);
    let via = (owner + 1) % 3;
    // Each node's write-behind connection is up (plus redis-cli's own): a node that never
    // reached Redis fails its loads at once, which would prove nothing.
    wait_for(
        "every node connected to Redis",
        Duration::from_secs(10),
        || redis.cli(&["CLIENT", "LIST"]).lines().count() >= 4,
    );
    std::thread::sleep(Duration::from_millis(300));

    // Redis stalls without closing anything (a long fork, a partition). The nodes started
    // within today's window, so the owner loads d/k before its first hit, inside the call
    // `via` forwards to it.
    redis.pause();
    let started = Instant::now();
    let answer = http(nodes[via].http, "POST", "/json", BODY);
    let took = started.elapsed();
    let stats = http(nodes[via].debug, "GET", "/stats", "");
    redis.resume();

    // Answered from the owner's memory once the load gave up at half the peer deadline
    // (500 ms): unbounded, the forward timed out, the owner was marked down and the retry
    // waited on Redis too (an error, or an answer after REDIS_TIMEOUT).
    let (status, body) = answer.expect("an answer");
    assert_eq!(status, 200, "{body}");
    assert!(
        took < Duration::from_millis(2500),
        "answered after {took:?}"
    );
    let owner_up = format!("sluice.cluster.peer_up.127.0.0.1:{}: 1", nodes[owner].peer);
    assert!(
        stats.is_some_and(|(_, b)| b.contains(&owner_up)),
        "the owner was marked down"
    );
    assert_eq!(cluster_stat(&nodes[owner], "durable.load_failures"), 1);
}

/// The write-behind of one node, against a real Redis, driven by a manual clock.
mod durable {
    use super::*;
    use std::sync::Arc;

    use sluice::clock::Timestamp;
    use sluice::cluster::WriteBehind;
    use sluice::cluster::durable::{Durable, RingChanges};
    use sluice::limiter::{Algorithm, CounterKind, Decision, Quota, Unit, sliding_window};
    use sluice::store::{CounterStore, Hit, MemoryStore};

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
            .app
            .cluster
            .unwrap()
            .write_behind
            .unwrap()
    }

    /// A node's counters and write-behind; `started` is when it last saw the ring change.
    fn node(wb: &WriteBehind, started: Timestamp) -> (Arc<MemoryStore>, Arc<RingChanges>, Durable) {
        let local = Arc::new(MemoryStore::new(1000));
        let changes = Arc::new(RingChanges::new(started));
        let durable = Durable::new(wb, local.clone(), changes.clone(), wb.redis.timeout).unwrap();
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
                penalty: None,
                safe_capacity: None,
                requests_per_unit: 10,
                unit: Unit::Minute,
                algorithm,
                burst: None,
                charge_refused: false,
                unit_multiplier: 1,
                calendar: sluice::limiter::Calendar::EPOCH,
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
    #[expect(
        clippy::too_many_lines,
        reason = "one end-to-end scenario, step by step; to split next"
    )]
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
            .state(CounterKind::Sliding(Unit::Minute.into()), KEY)
            .unwrap();
        assert_eq!(
            sliding_window::counts_at(sliding, later.micros(), Unit::Minute.into()),
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

    /// A refund an owner makes is taken off the copy in Redis at the next flush (a window's
    /// count, a bucket's time), never below what the owner holds: a count another node added
    /// meanwhile stays, and is merged back.
    #[tokio::test]
    async fn refunds_are_written_behind_and_never_below_what_the_owner_holds() {
        if !redis_server_available() {
            return;
        }
        let redis = RedisServer::start_on(free_port());
        let wb = write_behind(&redis);
        let now = Timestamp::from_secs(1_800_000_010);
        let window = now.secs() / 60;
        let fixed_key = format!("p:sluice:wb:{{d_k_v_}}:fw:60:{window}");
        let sliding_key = format!("p:sluice:wb:{{d_k_v_}}:sw:60:{window}");
        let bucket_key = "p:sluice:wb:{d_k_v_}:gcra".to_owned();
        let (local, _, a) = node(&wb, now);
        let begun = Instant::now();
        while !a.is_ready() {
            assert!(
                begun.elapsed() < Duration::from_secs(10),
                "Redis never answered"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        owner_apply(&local, &a, now, 5).await;
        assert_eq!(a.flush(now).await, 3);
        assert_eq!(redis.cli(&["GET", &fixed_key]), "5");
        let tat: u64 = redis.cli(&["GET", &bucket_key]).parse().unwrap();
        let refund = |n: u64| {
            let hits = hits(n);
            let local = local.clone();
            let a = &a;
            async move {
                let mut out = Vec::new();
                local.refund(now, &hits, &mut out).await.unwrap();
                a.mark_refunded(now, &hits);
                out
            }
        };
        // 2 back: 3 left in each window; the bucket's time 2 × 6 s earlier.
        refund(2).await;
        assert_eq!(a.flush(now).await, 3);
        assert_eq!(redis.cli(&["GET", &fixed_key]), "3");
        assert_eq!(redis.cli(&["GET", &sliding_key]), "3");
        let back: u64 = redis.cli(&["GET", &bucket_key]).parse().unwrap();
        assert_eq!(tat - back, 12_000_000);
        let ttl: u64 = redis.cli(&["PTTL", &fixed_key]).parse().unwrap();
        assert!((49_000..=51_000).contains(&ttl), "{ttl}");
        // Another node counted 7 more meanwhile (10 in Redis): a refund of 1 leaves 9, which
        // this owner takes back.
        redis.cli(&["SET", &fixed_key, "10", "PX", "50000"]);
        refund(1).await;
        a.flush(now).await;
        assert_eq!(redis.cli(&["GET", &fixed_key]), "9");
        assert_eq!(local.count(KEY, Unit::Minute, now), 9);
        // More than is held: 0, not a credit.
        refund(20).await;
        a.flush(now).await;
        assert_eq!(redis.cli(&["GET", &fixed_key]), "0");
        assert_eq!(redis.cli(&["GET", &sliding_key]), "0");
        // Counting again raises it, as before.
        owner_apply(&local, &a, now, 4).await;
        a.flush(now).await;
        assert_eq!(redis.cli(&["GET", &fixed_key]), "4");
    }
}

// ---------------------------------------------------------------------------------------------
// The peer protocol's version (proto/sluice/peer/v1/peer.proto): real processes, real sockets.

mod peer_versions {
    use super::*;

    use sluice::cluster::peer::wire::peer_client::PeerClient;
    use sluice::cluster::peer::wire::peer_server::{Peer, PeerServer};
    use sluice::cluster::peer::{
        ApplyRequest, ApplyResponse, LeaseRequest, LeaseResponse, PROTOCOL_VERSION, PeerHit,
    };
    use sluice::limiter::{Algorithm, Quota, Unit};
    use sluice::store::Hit;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// `hits` hits on `d`/`k`=`v` at 10 per hour, in protocol `version`.
    fn request(version: u32, hits: u64) -> ApplyRequest {
        let quota = Quota {
            penalty: None,
            safe_capacity: None,
            requests_per_unit: 10,
            unit: Unit::Hour,
            algorithm: Algorithm::FixedWindow,
            burst: None,
            charge_refused: false,
            unit_multiplier: 1,
            calendar: sluice::limiter::Calendar::EPOCH,
        };
        let hit = PeerHit::from_hit(&Hit {
            key: "d_k_v_",
            quota,
            hits,
        });
        ApplyRequest {
            hits: vec![hit],
            refund: false,
            protocol_version: version,
            reset: false,
        }
    }

    /// One Apply call in clear to the peer port `port`.
    async fn apply(port: u16, request: ApplyRequest) -> Result<ApplyResponse, tonic::Status> {
        let mut client = PeerClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .expect("connects");
        client.apply(request).await.map(tonic::Response::into_inner)
    }

    #[test]
    fn a_call_in_another_protocol_version_is_refused_naming_both_and_counts_nothing() {
        let (_dir, nodes, peers) = three_nodes(&[]);
        let owner = &nodes[owner_index(&nodes, &peers)];
        let rt = runtime();
        // A whole hour's limit in each call: a misread would use it up.
        for version in [0, PROTOCOL_VERSION + 1, u32::MAX] {
            let status = rt
                .block_on(apply(owner.peer, request(version, 10)))
                .expect_err("refused");
            assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
            assert_eq!(
                status.message(),
                format!(
                    "peer protocol version {version} is not supported by this node (speaks {PROTOCOL_VERSION})"
                )
            );
        }
        // Nothing was counted: this node's own version's first hit is the first.
        let answer = rt
            .block_on(apply(owner.peer, request(PROTOCOL_VERSION, 1)))
            .expect("this version is answered");
        assert_eq!(answer.decisions.len(), 1);
        assert_eq!(answer.decisions[0].count_after, 1);
    }

    /// A node of the next protocol version: it refuses every call of this one, as it should.
    struct NextVersion {
        calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    #[tonic::async_trait]
    impl Peer for NextVersion {
        async fn apply(
            &self,
            request: tonic::Request<ApplyRequest>,
        ) -> Result<tonic::Response<ApplyResponse>, tonic::Status> {
            self.refuse(request.get_ref().protocol_version)
        }

        async fn lease(
            &self,
            request: tonic::Request<LeaseRequest>,
        ) -> Result<tonic::Response<LeaseResponse>, tonic::Status> {
            self.refuse(request.get_ref().protocol_version)
        }

        async fn quota(
            &self,
            request: tonic::Request<sluice::cluster::peer::wire::QuotaRequest>,
        ) -> Result<tonic::Response<sluice::cluster::peer::wire::QuotaResponse>, tonic::Status>
        {
            self.refuse(request.get_ref().protocol_version)
        }

        async fn limits(
            &self,
            request: tonic::Request<sluice::cluster::peer::wire::LimitsRequest>,
        ) -> Result<tonic::Response<sluice::cluster::peer::wire::LimitsResponse>, tonic::Status>
        {
            self.refuse(request.get_ref().protocol_version)
        }
    }

    impl NextVersion {
        fn refuse<T>(&self, version: u32) -> Result<T, tonic::Status> {
            self.calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let speaks = PROTOCOL_VERSION + 1;
            Err(tonic::Status::failed_precondition(format!(
                "peer protocol version {version} is not supported by this node (speaks {speaks})"
            )))
        }
    }

    #[test]
    fn a_peer_of_another_version_is_a_failed_peer_and_its_keys_are_counted_by_this_node() {
        let rt = runtime();
        let mut node = Node::new(Vec::new());
        let me = format!("127.0.0.1:{}", node.peer);
        // A port for the other node on which it owns `d`/`k`=`v`, as the ring sees the two.
        let (listener, other) = loop {
            let listener = rt
                .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .unwrap();
            let other = listener.local_addr().unwrap().to_string();
            let ring = Ring::new([me.clone(), other.clone()]);
            if ring.addr(ring.owner(key_hash("d_k_v_"), |_| true).unwrap()) == other {
                break (listener, other);
            }
        };
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let server = rt.spawn(
            tonic::transport::Server::builder()
                .add_service(PeerServer::new(NextVersion {
                    calls: calls.clone(),
                }))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("limits.yaml"),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
        )
        .unwrap();
        node.start(&format!("{me},{other}"), dir.path());

        // Counted here once the other node refused the forward, alone from the first hit (the
        // refusal left this node, one of two, without a majority; before issue 49 that first
        // hit was retried here as the key's next owner, with the whole limit), within the safe
        // capacity of 10 / 2 (docs/cluster.md, "Partitions").
        let nodes = [node];
        let admitted = admitted_on(&nodes, &[0], 12, Duration::from_secs(3));
        assert_eq!(admitted, 5);
        assert!(calls.load(std::sync::atomic::Ordering::Relaxed) >= 1);
        assert_eq!(cluster_stat(&nodes[0], "failed_forwards"), 1);
        assert_eq!(cluster_stat(&nodes[0], "local_hits"), 0);
        assert_eq!(cluster_stat(&nodes[0], "alone_hits"), 12);
        let (_, stats) = http(nodes[0].debug, "GET", "/stats", "").expect("stats");
        assert!(
            stats.contains(&format!("sluice.cluster.peer_up.{other}: 0")),
            "{stats}"
        );
        server.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// SLUICE_PEER_TLS: real processes, real sockets, certificates from a throw-away CA.

mod peer_tls {
    use super::*;

    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use sluice::cluster::peer::{APPLY_PATH, ApplyRequest, ApplyResponse, PeerDecision, PeerHit};
    use sluice::limiter::{Algorithm, Quota, Unit};
    use sluice::store::Hit;
    use tonic::transport::{Channel, Endpoint};

    /// The name on the certificate every replica shares, as a cert-manager Certificate for the
    /// headless Service gives it.
    const SAN: &str = "sluice-peers.test";

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    fn tls_env(cert: &Path, key: &Path, ca: &Path, san: Option<&str>) -> Vec<(String, String)> {
        let mut env = vec![
            ("SLUICE_PEER_TLS".to_owned(), "true".to_owned()),
            (
                "SLUICE_PEER_TLS_CERT".to_owned(),
                cert.display().to_string(),
            ),
            ("SLUICE_PEER_TLS_KEY".to_owned(), key.display().to_string()),
            (
                "SLUICE_PEER_TLS_CACERT".to_owned(),
                ca.display().to_string(),
            ),
        ];
        if let Some(san) = san {
            env.push(("SLUICE_PEER_TLS_SAN".to_owned(), san.to_owned()));
        }
        env
    }

    /// `hits` hits on `d`/`k`=`value`, as a peer forwards them: 10 per hour, fixed window.
    fn peer_hits(value: &str, hits: u64) -> Vec<PeerHit> {
        let key = format!("d_k_{value}_");
        let quota = Quota {
            penalty: None,
            safe_capacity: None,
            requests_per_unit: 10,
            unit: Unit::Hour,
            algorithm: Algorithm::FixedWindow,
            burst: None,
            charge_refused: false,
            unit_multiplier: 1,
            calendar: sluice::limiter::Calendar::EPOCH,
        };
        vec![PeerHit::from_hit(&Hit {
            key: &key,
            quota,
            hits,
        })]
    }

    /// One `sluice.peer.v1.Peer/Apply` call over `channel`.
    async fn apply(channel: Channel, hits: Vec<PeerHit>) -> Result<Vec<PeerDecision>, String> {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|e| format!("{e:?}"))?;
        grpc.unary(
            tonic::Request::new(ApplyRequest::new(hits, sluice::cluster::peer::Op::Apply)),
            tonic::codegen::http::uri::PathAndQuery::from_static(APPLY_PATH),
            tonic_prost::ProstCodec::<ApplyRequest, ApplyResponse>::default(),
        )
        .await
        .map(|r| r.into_inner().decisions)
        .map_err(|s| format!("{s:?}"))
    }

    /// Connects to a peer port over TLS trusting `ca`, expecting `name`, presenting `identity`
    /// (if any), and calls Apply. With TLS 1.3 the server judges the client's certificate after
    /// the client thinks the handshake is done, so a refusal may show on the call.
    async fn apply_over_tls(
        port: u16,
        ca: &Path,
        identity: Option<&pki::Leaf>,
        hits: Vec<PeerHit>,
    ) -> Result<Vec<PeerDecision>, String> {
        let channel = pki::tls_channel(port, ca, SAN, identity).await?;
        apply(channel, hits).await
    }

    async fn apply_in_clear(port: u16, hits: Vec<PeerHit>) -> Result<Vec<PeerDecision>, String> {
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))?;
        apply(channel, hits).await
    }

    /// The node owning `d`/`k`=`value`.
    fn owner_of(nodes: &[Node], peers: &str, value: &str) -> usize {
        let ring = Ring::new(peers.split(',').map(str::to_owned));
        let owner = ring.addr(
            ring.owner(key_hash(&format!("d_k_{value}_")), |_| true)
                .unwrap(),
        );
        nodes
            .iter()
            .position(|n| format!("127.0.0.1:{}", n.peer) == owner)
            .unwrap()
    }

    fn json(node: &Node, value: &str) -> u16 {
        let body = format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"{value}"}}]}}]}}"#
        );
        http(node.http, "POST", "/json", &body).expect("answer").0
    }

    #[test]
    fn three_nodes_over_mutual_tls_forward_and_agree_on_counts() {
        let pki = pki::TestPki::new();
        // One certificate for every replica, named for the peer Service, as cert-manager makes.
        let shared = pki.leaf("peers", &[SAN]);
        let env = tls_env(&shared.cert, &shared.key, &pki.ca, Some(SAN));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (_dir, nodes, _) = three_nodes(&env);

        // Exactly the limit passes, round-robin over the three: the forwards got through.
        let admitted = admitted_on(&nodes, &[0, 1, 2], 30, Duration::from_secs(3));
        assert_eq!(admitted, 10);
        let sum = |name: &str| nodes.iter().map(|n| cluster_stat(n, name)).sum::<u64>();
        assert_eq!(sum("local_hits"), 10);
        assert_eq!(sum("forwarded_hits"), 20);
        assert_eq!(sum("failed_forwards"), 0);
        // And every node sees the other two up (the probes go over TLS too).
        for n in &nodes {
            let (_, stats) = http(n.debug, "GET", "/stats", "").expect("stats");
            let up = stats
                .lines()
                .filter(|l| l.starts_with("sluice.cluster.peer_up.") && l.ends_with(": 1"))
                .count();
            assert_eq!(up, 3, "{stats}");
        }
    }

    #[test]
    fn only_a_certificate_from_the_ca_with_the_san_can_send_hits() {
        let pki = pki::TestPki::new();
        let shared = pki.leaf("peers", &[SAN]);
        let env = tls_env(&shared.cert, &shared.key, &pki.ca, Some(SAN));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (_dir, nodes, peers) = three_nodes(&env);
        let owner = &nodes[owner_of(&nodes, &peers, "w")];
        let rt = runtime();

        let other_ca = pki::TestPki::new();
        let impostor = other_ca.leaf("impostor", &[SAN]);
        let unnamed = pki.leaf("unnamed", &["someone-else.test"]);
        // A whole hour's limit in one call, from each stranger: none may land.
        for (who, identity) in [
            ("no client certificate", None),
            ("a certificate from another CA", Some(&impostor)),
            ("a certificate from the CA without the SAN", Some(&unnamed)),
        ] {
            let r = rt.block_on(apply_over_tls(
                owner.peer,
                &pki.ca,
                identity,
                peer_hits("w", 10),
            ));
            assert!(r.is_err(), "{who} could send hits: {r:?}");
        }
        let r = rt.block_on(apply_in_clear(owner.peer, peer_hits("w", 10)));
        assert!(r.is_err(), "a plain-text client could send hits: {r:?}");
        // None did: the limit is untouched, on every node.
        for n in &nodes {
            assert_eq!(json(n, "w"), 200);
        }

        // A peer's certificate can (the same call, so the refusals above were the TLS): 3
        // counted so far, plus these 7, leave the next request over the limit.
        let decisions = rt
            .block_on(apply_over_tls(
                owner.peer,
                &pki.ca,
                Some(&shared),
                peer_hits("w", 7),
            ))
            .expect("a peer's call");
        assert_eq!(decisions.len(), 1);
        assert_eq!(decisions[0].count_after, 10);
        assert_eq!(json(&nodes[0], "w"), 429);
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn der(leaf: &pki::Leaf) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(&leaf.cert).unwrap()
    }

    fn roots(ca: &Path) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(ca).unwrap())
            .unwrap();
        Arc::new(roots)
    }

    /// A stand-in peer on a free port: it completes TLS handshakes, requiring a client
    /// certificate from `ca`, records each client's certificate, and hangs up. Returns the port
    /// and what it saw, newest last.
    fn recording_peer(
        rt: &tokio::runtime::Runtime,
        ca: &Path,
        leaf: &pki::Leaf,
    ) -> (u16, Arc<Mutex<Vec<CertificateDer<'static>>>>) {
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca), provider())
                .build()
                .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![der(leaf)],
                PrivateKeyDer::from_pem_file(&leaf.key).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let port = free_port();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        rt.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                if let Ok(tls) = acceptor.accept(tcp).await
                    && let Some(chain) = tls.get_ref().1.peer_certificates()
                {
                    record.lock().unwrap().push(chain[0].clone().into_owned());
                }
            }
        });
        (port, seen)
    }

    /// The certificate the peer listener on `port` serves, to a client trusting `ca` that
    /// verifies 127.0.0.1 and presents `identity`.
    async fn served(port: u16, ca: &Path, identity: &pki::Leaf) -> Option<CertificateDer<'static>> {
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots(ca))
            .with_client_auth_cert(
                vec![der(identity)],
                PrivateKeyDer::from_pem_file(&identity.key).unwrap(),
            )
            .unwrap();
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .ok()?;
        Some(tls.get_ref().1.peer_certificates()?[0].clone().into_owned())
    }

    #[test]
    fn a_rotated_certificate_is_served_and_presented_by_new_connections() {
        let pki = pki::TestPki::new();
        // No SLUICE_PEER_TLS_SAN: each peer is verified against its address, an IP here.
        let first = pki.leaf("first", &["127.0.0.1"]);
        let second = pki.leaf("second", &["127.0.0.1"]);
        let stand_in = pki.leaf("stand-in", &["127.0.0.1"]);
        let tester = pki.leaf("tester", &["tester.test"]);
        let secret = tempfile::tempdir().unwrap();
        pki::secret_version(secret.path(), 1, &first.cert, &first.key);
        let config = tempfile::tempdir().unwrap();
        std::fs::write(
            config.path().join("limits.yaml"),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
        )
        .unwrap();

        let rt = runtime();
        // The node's other peer records the client certificate of every connection the node
        // makes to it (its probes reconnect every 500 ms, since the stand-in hangs up).
        let (stand_in_port, presented) = recording_peer(&rt, &pki.ca, &stand_in);
        let mut node = Node::new(tls_env(
            &secret.path().join("tls.crt"),
            &secret.path().join("tls.key"),
            &pki.ca,
            None,
        ));
        let peers = format!("127.0.0.1:{},127.0.0.1:{stand_in_port}", node.peer);
        node.start(&peers, config.path());
        let both_ways = |leaf: &pki::Leaf| {
            let last_presented = presented.lock().unwrap().last().cloned();
            last_presented == Some(der(leaf))
                && rt.block_on(served(node.peer, &pki.ca, &tester)) == Some(der(leaf))
        };
        wait_for(
            "the first certificate, both ways",
            Duration::from_secs(10),
            || both_ways(&first),
        );

        // The secret is renewed in place: new connections, made and accepted, use the new one.
        pki::secret_version(secret.path(), 2, &second.cert, &second.key);
        let started = Instant::now();
        wait_for(
            "the second certificate, both ways",
            Duration::from_secs(10),
            || both_ways(&second),
        );
        eprintln!(
            "renewed certificate in use both ways after {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn bad_peer_tls_settings_and_files_stop_start_up_naming_the_variable() {
        let pki = pki::TestPki::new();
        let leaf = pki.leaf("peer", &[SAN]);
        let other = pki.leaf("other", &[SAN]);
        let missing = pki.dir().join("missing.pem");
        // The peer port is taken: a refusal that came after binding would exit 1, not 64.
        let port = free_port();
        let _taken = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let refused = |vars: &[(&str, &Path)], expected: &str| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
            c.env_remove("REDIS_URL")
                .env_remove("BACKEND_TYPE")
                .env("GRPC_HOST", "127.0.0.1")
                .env("PEERS", format!("127.0.0.1:{port}"))
                .env("PEER_PORT", port.to_string())
                .env("PEER_ADVERTISE_ADDRESS", format!("127.0.0.1:{port}"))
                .env("SLUICE_PEER_TLS", "true")
                .stdin(Stdio::null());
            for (var, value) in vars {
                c.env(var, value);
            }
            let out = c.output().expect("run sluice");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{vars:?}: {err}");
            assert!(err.contains(expected), "{expected} not in: {err}");
        };
        let cert = ("SLUICE_PEER_TLS_CERT", leaf.cert.as_path());
        let key = ("SLUICE_PEER_TLS_KEY", leaf.key.as_path());
        let ca = ("SLUICE_PEER_TLS_CACERT", pki.ca.as_path());
        refused(
            &[cert, key],
            "SLUICE_PEER_TLS_CACERT=: must name a PEM file",
        );
        refused(
            &[cert, key, ("SLUICE_PEER_TLS_CACERT", &missing)],
            &format!("SLUICE_PEER_TLS_CACERT={}: cannot read", missing.display()),
        );
        refused(
            &[cert, ("SLUICE_PEER_TLS_KEY", &other.key), ca],
            &format!(
                "SLUICE_PEER_TLS_KEY={}: the private key does not match the certificate in \
                 SLUICE_PEER_TLS_CERT={}",
                other.key.display(),
                leaf.cert.display()
            ),
        );
        // A key is not a CA.
        refused(
            &[cert, key, ("SLUICE_PEER_TLS_CACERT", &leaf.key)],
            &format!(
                "SLUICE_PEER_TLS_CACERT={}: no PEM certificate",
                leaf.key.display()
            ),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Lease mode (SLUICE_CLUSTER_MODE=lease): three real processes, requests spread across them by
// one client thread per node, hammering as fast as this machine lets them.

mod lease {
    use super::*;

    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// Every lease test's limit: small, so a node's share is a handful of hits and a wrong
    /// split shows, and per hour, so nothing refills or rolls over while a test runs.
    const LIMIT: u64 = 60;

    /// One limit of [`LIMIT`] per hour for each algorithm, on the descriptor key named after
    /// it (each test uses its own value, so its own counter), a fixed window of ten times that
    /// on `large`, and on `rate` a token bucket of [`RATE`] per second holding [`RATE`].
    fn limits_yaml() -> String {
        let limit = |key: &str, extra: &str| {
            format!(
                "  - key: {key}\n    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}{extra}}}\n"
            )
        };
        format!(
            "domain: d\ndescriptors:\n{}{}{}  - key: large\n    rate_limit: {{unit: hour, requests_per_unit: {}}}\n  - key: rate\n    rate_limit: {{unit: second, requests_per_unit: {RATE}, algorithm: token_bucket}}\n  - key: burst\n    rate_limit: {{unit: minute, requests_per_unit: {BURST_LIMIT}}}\n  - key: second\n    rate_limit: {{unit: second, requests_per_unit: {LIMIT}}}\n",
            limit("fixed", ""),
            limit("sliding", ", algorithm: sliding_window"),
            limit("token", ", algorithm: token_bucket"),
            10 * LIMIT,
        )
    }

    fn body(key: &str, value: &str) -> String {
        format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
        )
    }

    /// Three lease-mode peers on [`limits_yaml`], of which those in `started` are running.
    struct Cluster {
        dir: tempfile::TempDir,
        nodes: Vec<Node>,
        peers: String,
    }

    impl Cluster {
        fn new(env: &[(&str, &str)], started: &[usize]) -> Cluster {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("limits.yaml"), limits_yaml()).unwrap();
            let mut env: Vec<(String, String)> = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            env.push(("SLUICE_CLUSTER_MODE".into(), "lease".into()));
            // A peer that is slow, not gone, must not be taken for lost on an overloaded
            // machine: that is a failure, with its own bound, and these tests kill the nodes
            // they mean to lose (a killed node's calls fail at once, whatever the deadline).
            env.push(("SLUICE_PEER_TIMEOUT_MS".into(), "2000".into()));
            let (mut nodes, peers) = peer_nodes(3, &env);
            for &i in started {
                nodes[i].start(&peers, dir.path());
            }
            let mut c = Cluster { dir, nodes, peers };
            c.wait_up(started);
            c
        }

        fn start(&mut self, i: usize) {
            self.nodes[i].start(&self.peers, self.dir.path());
        }

        fn addr(&self, i: usize) -> String {
            format!("127.0.0.1:{}", self.nodes[i].peer)
        }

        /// Waits until each node of `on` has seen every other node of `on` answer a probe
        /// since it last marked it down: otherwise two nodes may disagree on a key's owner,
        /// and two lease servers would each hand out its whole limit.
        fn wait_up(&mut self, on: &[usize]) {
            for &i in on {
                for &j in on.iter().filter(|&&j| j != i) {
                    let line = format!("sluice.cluster.peer_up.{}: 1", self.addr(j));
                    wait_for(
                        &format!("node {i} to see node {j} up"),
                        Duration::from_secs(15),
                        || {
                            http(self.nodes[i].debug, "GET", "/stats", "")
                                .is_some_and(|(_, b)| b.contains(&line))
                        },
                    );
                }
            }
        }

        /// The node that owns `key`=`value` among all three.
        fn owner(&self, key: &str, value: &str) -> usize {
            let ring = Ring::new(self.peers.split(',').map(str::to_owned));
            let owner = ring.addr(
                ring.owner(key_hash(&format!("d_{key}_{value}_")), |_| true)
                    .unwrap(),
            );
            (0..3).find(|&i| self.addr(i) == owner).unwrap()
        }

        /// A value of `key` whose owner among all three is (`owned`) or is not node `node`.
        fn value_owned(&self, key: &str, node: usize, owned: bool) -> String {
            (0..)
                .map(|i| format!("v{i}"))
                .find(|v| (self.owner(key, v) == node) == owned)
                .unwrap()
        }

        /// A `sluice.cluster.lease.<name>` counter summed over the nodes `on`.
        fn lease_stat(&self, on: &[usize], name: &str) -> u64 {
            on.iter()
                .map(|&i| cluster_stat(&self.nodes[i], &format!("lease.{name}")))
                .sum()
        }
    }

    /// Free shares (SLUICE_LEASE_FREE_SHARE_PERCENT=50, docs/cluster.md "Free shares"): with
    /// per-second limits of [`LIMIT`], a node's share is 9 hits a second of each key. Keys
    /// used once a second on each node are decided with no lease and no call; a key offered
    /// 1.5 times its limit within one second over the three nodes converts on each of them and is
    /// held to its limit, with more admitted than the free shares alone would give.
    #[test]
    fn with_free_shares_cold_keys_take_no_call_and_a_hot_key_keeps_its_limit() {
        let c = Cluster::new(&[("SLUICE_LEASE_FREE_SHARE_PERCENT", "50")], &[0, 1, 2]);
        // Permits come with the first renewal rounds; a window must begin a lease duration
        // (1 s) after they did.
        std::thread::sleep(Duration::from_millis(2_500));
        let all = [0, 1, 2];
        let ok = |i: usize, value: &str| {
            let (status, body) =
                http(c.nodes[i].http, "POST", "/json", &body("second", value)).expect("answer");
            assert!(status == 200 || status == 429, "{status} {body}");
            status == 200
        };
        let acquires = c.lease_stat(&all, "acquires");
        for round in 0..3 {
            for v in 0..30 {
                for i in all {
                    assert!(
                        ok(i, &format!("cold{v}")),
                        "round {round}: a cold key's hit"
                    );
                }
            }
        }
        assert_eq!(
            c.lease_stat(&all, "acquires"),
            acquires,
            "no cold key acquired"
        );
        assert!(c.lease_stat(&all, "free_decisions") >= 270);
        // The hot key: 90 hits round-robin, all within one second (started early in it; about
        // 0.1 to 0.3 s of calls).
        let hot = loop {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            if now.subsec_millis() < 100 {
                break now.as_secs();
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let admitted = (0..90).filter(|n| ok(n % 3, "hot")).count() as u64;
        let after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert_eq!(after, hot, "the hot key's hits took more than its second");
        assert!(admitted <= LIMIT, "{admitted} of {LIMIT} admitted");
        assert!(
            admitted > 27,
            "only the free shares (3 x 9) admitted: {admitted}"
        );
        assert!(c.lease_stat(&all, "free_conversions") >= 1);
    }

    /// Free shares are on by default, and a recall gives a key hot on one node its whole
    /// limit: node 0 alone is offered 100 to 200 hits a second of a key limited to [`LIMIT`]
    /// (60) a second. Without the recall the owner would charge the two idle nodes their free
    /// share (9 each) in every second, and node 0 could admit at most 60 - 18 + 9 = 51.
    #[test]
    fn with_free_shares_on_by_default_a_key_hot_on_one_node_gets_its_whole_limit() {
        let c = Cluster::new(&[], &[0, 1, 2]);
        std::thread::sleep(Duration::from_millis(2_500));
        let mut admitted: std::collections::BTreeMap<u64, u64> = Default::default();
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            let (status, body) =
                http(c.nodes[0].http, "POST", "/json", &body("second", "pinned")).expect("answer");
            assert!(status == 200 || status == 429, "{status} {body}");
            let second = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            *admitted.entry(second).or_default() += u64::from(status == 200);
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!("admitted per second on the pinned node: {admitted:?}");
        // The first and last seconds are partial.
        let whole: Vec<u64> = admitted.values().copied().skip(1).collect();
        let whole = &whole[..whole.len() - 1];
        assert!(whole.iter().all(|&a| a <= LIMIT), "{admitted:?}");
        assert!(
            whole.iter().any(|&a| a > 51),
            "the idle nodes' free shares were never recalled: {admitted:?}"
        );
        assert!(c.lease_stat(&[0], "free_conversions") >= 1);
    }

    /// What one client thread saw of one node.
    #[derive(Default)]
    struct Seen {
        offered: AtomicU64,
        admitted: AtomicU64,
        /// No answer: the node is gone (the thread stops).
        unanswered: AtomicU64,
        /// An answer other than 200 or 429, kept for the assertion.
        wrong: std::sync::Mutex<Option<String>>,
    }

    /// One client thread per node, each sending `body` to its node, one request at a time,
    /// until stopped or its node stops answering.
    struct Load {
        stop: Arc<AtomicBool>,
        seen: Vec<Arc<Seen>>,
        threads: Vec<std::thread::JoinHandle<()>>,
        started: Instant,
    }

    impl Load {
        fn start(c: &Cluster, on: &[usize], body: &str) -> Load {
            let stop = Arc::new(AtomicBool::new(false));
            let seen: Vec<Arc<Seen>> = (0..c.nodes.len()).map(|_| Arc::default()).collect();
            let threads = on
                .iter()
                .map(|&i| {
                    let (stop, seen, port, body) = (
                        stop.clone(),
                        seen[i].clone(),
                        c.nodes[i].http,
                        body.to_owned(),
                    );
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            match http(port, "POST", "/json", &body) {
                                Some((status @ (200 | 429), _)) => {
                                    seen.offered.fetch_add(1, Ordering::Relaxed);
                                    if status == 200 {
                                        seen.admitted.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                                Some((status, body)) => {
                                    *seen.wrong.lock().unwrap() = Some(format!("{status} {body}"));
                                    seen.offered.fetch_add(1, Ordering::Relaxed);
                                }
                                None => {
                                    seen.unanswered.fetch_add(1, Ordering::Relaxed);
                                    return;
                                }
                            }
                        }
                    })
                })
                .collect();
            Load {
                stop,
                seen,
                threads,
                started: Instant::now(),
            }
        }

        fn admitted(&self, on: &[usize]) -> u64 {
            on.iter()
                .map(|&i| self.seen[i].admitted.load(Ordering::Relaxed))
                .sum()
        }

        fn offered(&self, on: &[usize]) -> u64 {
            on.iter()
                .map(|&i| self.seen[i].offered.load(Ordering::Relaxed))
                .sum()
        }

        /// Stops every thread; panics if a node answered anything but 200 or 429, or if one
        /// of `live` stopped answering.
        fn stop(self, live: &[usize]) -> Vec<Arc<Seen>> {
            self.stop.store(true, Ordering::Relaxed);
            for t in self.threads {
                t.join().expect("client thread");
            }
            for (i, s) in self.seen.iter().enumerate() {
                if let Some(wrong) = s.wrong.lock().unwrap().take() {
                    panic!("node {i} answered {wrong}");
                }
                if live.contains(&i) {
                    assert_eq!(
                        s.unanswered.load(Ordering::Relaxed),
                        0,
                        "node {i} went quiet"
                    );
                }
            }
            self.seen
        }
    }

    /// Keeps `load` running until `what` holds (at most `timeout`), then for at least
    /// `settle` more and until `offered` hits have been offered in all: long enough for
    /// several renewals to have had their chance to let too much through.
    fn run_until(
        load: &Load,
        on: &[usize],
        what: &str,
        timeout: Duration,
        settle: Duration,
        offered: u64,
        mut done: impl FnMut(&Load) -> bool,
    ) {
        wait_for(what, timeout, || done(load));
        let reached = Instant::now();
        wait_for("the load to settle", timeout, || {
            reached.elapsed() >= settle && load.offered(on) >= offered
        });
    }

    const ALL: [usize; 3] = [0, 1, 2];

    /// Sends `body` round-robin over the nodes `on`, one request at a time, until exactly `n`
    /// were admitted (at most 10 s).
    fn admit(c: &Cluster, on: &[usize], body: &str, n: u64) {
        let started = Instant::now();
        let mut admitted = 0;
        for i in 0.. {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{admitted} of {n} admitted"
            );
            let (status, answer) =
                http(c.nodes[on[i % on.len()]].http, "POST", "/json", body).expect("answer");
            assert!(status == 200 || status == 429, "{status} {answer}");
            admitted += u64::from(status == 200);
            if admitted == n {
                return;
            }
        }
    }

    /// Issue 16's first property, for one algorithm: a key offered many times its limit,
    /// spread over three nodes, admits no more than its bound and at least `least`. Returns
    /// the hits offered.
    fn offered_well_over_the_limit(c: &Cluster, key: &str, least: u64) -> u64 {
        let load = Load::start(c, &ALL, &body(key, "over"));
        run_until(
            &load,
            &ALL,
            &format!("{key}: {least} admitted"),
            Duration::from_secs(30),
            Duration::from_secs(1),
            10 * LIMIT,
            |l| l.admitted(&ALL) >= least,
        );
        let elapsed = load.started.elapsed();
        let seen = load.stop(&ALL);
        let admitted: u64 = seen
            .iter()
            .map(|s| s.admitted.load(Ordering::Relaxed))
            .sum();
        let offered: u64 = seen.iter().map(|s| s.offered.load(Ordering::Relaxed)).sum();
        let per_node: Vec<u64> = seen
            .iter()
            .map(|s| s.admitted.load(Ordering::Relaxed))
            .collect();
        eprintln!("{key}: admitted {admitted} ({per_node:?}) of {offered} offered in {elapsed:?}");
        // Windows: allowances never sum past the limit. Buckets: the capacity plus the refill
        // over the test (LIMIT per hour: under one hit a minute).
        let refill = if key == "token" {
            (LIMIT * elapsed.as_secs()).div_ceil(3600)
        } else {
            0
        };
        assert!(
            admitted <= LIMIT + refill,
            "{key}: {admitted} admitted of a limit of {LIMIT} ({per_node:?})"
        );
        offered
    }

    /// `rate`'s bucket offered many times its rate over the three nodes: once every node holds
    /// a share, the cluster admits the bucket's rate r, and in any t at most C + r t (C its
    /// capacity), one hit in flight per client either side. Returns the hits offered.
    fn a_bucket_admits_its_rate(c: &Cluster) -> u64 {
        let load = Load::start(c, &ALL, &body("rate", "over"));
        // The bucket's first burst: every node that asked has had a grant by then. (Not every
        // node holds a share: see the fairness test below.)
        wait_for("a bucket's worth admitted", Duration::from_secs(20), || {
            load.admitted(&ALL) >= RATE
        });
        let (from, before) = (Instant::now(), load.admitted(&ALL));
        wait_for("five seconds of load", Duration::from_secs(20), || {
            from.elapsed() >= Duration::from_secs(5)
        });
        let (t, after) = (from.elapsed(), load.admitted(&ALL));
        let seen = load.stop(&ALL);
        let admitted = after - before;
        let rate = RATE as f64 * t.as_secs_f64();
        let per_node: Vec<u64> = seen
            .iter()
            .map(|s| s.admitted.load(Ordering::Relaxed))
            .collect();
        eprintln!("rate: admitted {admitted} in {t:?} at {RATE}/s ({per_node:?} in all)");
        assert!(
            admitted as f64 >= rate * 0.85 - 3.0,
            "rate: {admitted} admitted in {t:?}"
        );
        assert!(
            admitted as f64 <= RATE as f64 + rate + 3.0,
            "rate: {admitted} admitted in {t:?}"
        );
        seen.iter().map(|s| s.offered.load(Ordering::Relaxed)).sum()
    }

    #[test]
    fn a_key_offered_many_times_its_limit_admits_the_limit_and_no_more() {
        process::with_window_to_spare(3600, 120);
        let c = Cluster::new(&[], &ALL);
        let started = Instant::now();
        // Windows: every node uses what it holds, and what a node holds beyond its need
        // flows back at its renewal, so the limit is reached exactly. An hour's token bucket:
        // a node's local bucket starts full of its first share, and a larger share later
        // refills faster but adds no tokens (docs/cluster.md), so how much of the capacity is
        // used within the hour depends on the first grants' order: 59 of 60 as a rule, at
        // least the first node's share of it (its need at the key's rate, 23) always. The
        // bucket's utilisation is its rate, checked next.
        let offered = offered_well_over_the_limit(&c, "fixed", LIMIT)
            + offered_well_over_the_limit(&c, "sliding", LIMIT)
            + offered_well_over_the_limit(&c, "token", LIMIT / 3)
            + a_bucket_admits_its_rate(&c);
        // The only hops: hits that do not fit acquire, in the windows' contended tails in
        // small steps and, once an acquire brings nothing, backing off; fewer than one per
        // renewal interval (100 ms) per node and key here.
        let acquires = c.lease_stat(&ALL, "acquires");
        let bound = 3 * 3 * (started.elapsed().as_millis() as u64 / 100 + 1);
        assert!(acquires <= bound, "{acquires} acquires, at most {bound}");
        assert_eq!(c.lease_stat(&ALL, "forwarded"), 0);
        // Most other hits are decided locally: about 95% here, 83% with the machine
        // overloaded. The rest are over-limit hits that came while a renewal of their key was
        // under way, and waited for its answer (the longer a call takes, the more of them).
        let local = c.lease_stat(&ALL, "local_decisions");
        eprintln!("{local} local decisions of {offered}, {acquires} acquires");
        assert!(local * 2 >= offered, "{local} local decisions of {offered}");
    }

    /// The `burst` key's limit, per minute.
    const BURST_LIMIT: u64 = 600;

    /// Sends `n` hits of `body` to `port` one at a time once `start` opens; the ones admitted.
    fn sender(port: u16, body: String, n: u64, start: Arc<std::sync::Barrier>) -> u64 {
        start.wait();
        (0..n)
            .filter(|_| match http(port, "POST", "/json", &body) {
                Some((200, _)) => true,
                Some((429, _)) => false,
                other => panic!("unexpected answer {other:?}"),
            })
            .count() as u64
    }

    /// Issue 34's scenario: three times the limit offered at once, 90% to one node (four
    /// client threads) and 5% to each other (one thread each), as pinned Envoy connections
    /// send it. Before grants followed bursts the cluster admitted 380 of 600: the two quiet
    /// nodes held an equal share each, reserved for a demand extrapolated from their burst to
    /// the minute's end, while the busy node was refused. Five bursts, each on its own key,
    /// each on another busy node; every one admits at least 95% of the limit and never more.
    #[test]
    fn a_burst_on_one_node_receives_what_the_quiet_nodes_leave() {
        let c = Cluster::new(&[], &ALL);
        // Past the rebuild cap of the ring's forming (a lease duration).
        std::thread::sleep(Duration::from_millis(1500));
        process::with_window_to_spare(60, 40);
        let quiet = 3 * BURST_LIMIT * 5 / 100;
        let busy_share = (3 * BURST_LIMIT - 2 * quiet) / 4;
        let mut seen = Vec::new();
        for run in 0..5 {
            let busy = run % 3;
            let body = body("burst", &format!("run{run}"));
            let start = Arc::new(std::sync::Barrier::new(6));
            let plan = (0..4)
                .map(|_| (busy, busy_share))
                .chain((0..3).filter(|&i| i != busy).map(|i| (i, quiet)));
            let threads: Vec<_> = plan
                .map(|(i, n)| {
                    let (port, body, start) = (c.nodes[i].http, body.clone(), start.clone());
                    std::thread::spawn(move || sender(port, body, n, start))
                })
                .collect();
            let admitted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
            seen.push(admitted);
        }
        eprintln!("admitted per burst, of {BURST_LIMIT}: {seen:?}");
        assert!(
            seen.iter()
                .all(|&a| a * 100 >= BURST_LIMIT * 95 && a <= BURST_LIMIT),
            "admitted per burst, of {BURST_LIMIT}: {seen:?}"
        );
    }

    /// Max-min fairness between two equally hot nodes on a bucket: the first node, alone for a
    /// second, holds the whole rate; the second then asks as much. Each should end up with
    /// half the rate: the second node admits at least 70% of half the rate.
    ///
    /// What this guards against (it failed so until grants carried the node's fair part and a
    /// node holding more gave the excess back at its next renewal, 975e696): the second got
    /// nothing for as long as the first stayed hot, because a node kept all it held while its
    /// demand was above it, so a share once granted was never split again.
    #[test]
    fn two_equally_hot_nodes_share_a_bucket_equally() {
        let c = Cluster::new(&[], &ALL);
        let body = body("rate", "fair");
        let first = Load::start(&c, &[0], &body);
        wait_for("a second of load", Duration::from_secs(20), || {
            first.started.elapsed() >= Duration::from_secs(1)
        });
        let second = Load::start(&c, &[1], &body);
        wait_for("two more seconds", Duration::from_secs(20), || {
            second.started.elapsed() >= Duration::from_secs(2)
        });
        let (from, a0, b0) = (Instant::now(), first.admitted(&[0]), second.admitted(&[1]));
        wait_for("five seconds of both", Duration::from_secs(20), || {
            from.elapsed() >= Duration::from_secs(5)
        });
        let (t, a, b) = (
            from.elapsed(),
            first.admitted(&[0]) - a0,
            second.admitted(&[1]) - b0,
        );
        first.stop(&[0]);
        second.stop(&[1]);
        eprintln!("fair: the first admitted {a}, the second {b} in {t:?} at {RATE}/s");
        let half = RATE as f64 * t.as_secs_f64() / 2.0;
        assert!(
            b as f64 >= half * 0.7,
            "the second node admitted {b} in {t:?}, the first {a}: half the rate is {half:.0}"
        );
    }

    /// Short leases, so a lost node's leases expire within the test: 300 ms, renewed every
    /// 50 ms.
    const SHORT: [(&str, &str); 2] = [
        ("SLUICE_LEASE_DURATION_MS", "300"),
        ("SLUICE_LEASE_RENEW_MS", "50"),
    ];

    fn others(than: usize) -> Vec<usize> {
        ALL.into_iter().filter(|&i| i != than).collect()
    }

    /// The owner of `d`/`key`=`value` among all three, and its next owner without it.
    fn owner_and_next(c: &Cluster, key: &str, value: &str) -> (usize, usize) {
        let owner = c.owner(key, value);
        let ring = Ring::new(c.peers.split(',').map(str::to_owned));
        let lost = c.addr(owner);
        let next = ring.addr(
            ring.owner(key_hash(&format!("d_{key}_{value}_")), |i| {
                ring.addr(i) != lost
            })
            .unwrap(),
        );
        (owner, (0..3).find(|&i| c.addr(i) == next).unwrap())
    }

    /// A request on another key (of `fixed`) owned by node `owner` among all three.
    fn body_of_key_owned_by(c: &Cluster, owner: usize) -> String {
        body("fixed", &c.value_owned("fixed", owner, true))
    }

    /// The key's owner dies mid-window; the load pauses until the new owner has heard from the
    /// other node, so nothing is granted before it knows what the two hold (that race has its
    /// own bound, in the next test).
    #[test]
    fn a_killed_owner_lets_through_at_most_what_it_admitted_and_the_others_get_the_limit_back() {
        process::with_window_to_spare(3600, 120);
        let mut c = Cluster::new(&SHORT, &ALL);
        let value = "killed-owner";
        let (owner, next) = owner_and_next(&c, "fixed", value);
        let rest = others(owner);
        let body = body("fixed", value);
        let load = Load::start(&c, &ALL, &body);
        wait_for("half the limit admitted", Duration::from_secs(20), || {
            load.admitted(&ALL) >= LIMIT / 2
        });
        let before = load.stop(&ALL);
        let admitted = |i: usize| before[i].admitted.load(Ordering::Relaxed);
        // The owner, which is also the key's lease server, dies holding what it was granted:
        // what it admitted, no one else knows.
        let lost = admitted(owner);
        c.nodes[owner].kill();
        // The two see the owner go at their first call to it (a peer that never answered one
        // of their probes is not marked down by probes), here one hit each on another key of
        // the lost owner's. Then the other node reports what it holds to the new owner (a
        // ring change makes a node renew every key it holds); the new owner's own client
        // reports with its first ask. A holder shows in the owner's view while its lease is
        // live, so it is looked for until seen.
        let elsewhere = body_of_key_owned_by(&c, owner);
        let gone = format!("sluice.cluster.peer_up.{}: 0", c.addr(owner));
        for &i in &rest {
            let (status, answer) = http(c.nodes[i].http, "POST", "/json", &elsewhere).unwrap();
            assert_eq!(status, 200, "{answer}");
            wait_for(
                "the lost owner marked down",
                Duration::from_secs(10),
                || {
                    http(c.nodes[i].debug, "GET", "/stats", "")
                        .is_some_and(|(_, b)| b.contains(&gone))
                },
            );
        }
        let view = format!("/debug/lease?key=d_fixed_{value}_");
        let other = rest.iter().find(|&&i| i != next).copied().unwrap();
        let mut unheard = vec![format!("\"node\":\"{}\"", c.addr(other))];
        wait_for(
            "the new owner to hear from the other node",
            Duration::from_secs(10),
            || {
                if let Some((200, b)) = http(c.nodes[next].debug, "GET", &view, "") {
                    let leases = b.split("\"holders\"").nth(1).unwrap_or("").to_owned();
                    unheard.retain(|h| !leases.contains(h.as_str()));
                }
                unheard.is_empty()
            },
        );
        // It rebuilds the key from their reports, never learning the lost owner's part, so the
        // two get the whole limit back between them: the window admits the limit plus what
        // the lost owner admitted, the documented bound.
        let load = Load::start(&c, &rest, &body);
        let earlier: u64 = rest.iter().map(|&i| admitted(i)).sum();
        run_until(
            &load,
            &rest,
            "the others to admit the whole limit between them",
            Duration::from_secs(30),
            Duration::from_secs(1),
            5 * LIMIT,
            |l| earlier + l.admitted(&rest) >= LIMIT,
        );
        let seen = load.stop(&rest);
        let remaining = earlier
            + rest
                .iter()
                .map(|&i| seen[i].admitted.load(Ordering::Relaxed))
                .sum::<u64>();
        eprintln!("the lost owner admitted {lost}, the others {remaining}");
        assert!(
            remaining <= LIMIT,
            "{} admitted: the others {remaining} after the lost owner's {lost}",
            remaining + lost
        );
    }

    /// The key's owner dies while another node, hot, holds most of the window: the new owner
    /// grants itself its rebuild cap (an equal share over the two live nodes) before the hot
    /// node's report reaches it, and then counts the report. docs/cluster.md's bound during a
    /// failure allows exactly that: the limit, plus what the lost owner admitted (nothing
    /// here), plus the new owner's grants within its cap to nodes that acquired before every
    /// holder reported (the new owner itself: half the limit).
    #[test]
    fn a_new_owner_grants_at_most_its_rebuild_cap_before_a_hot_node_reports() {
        process::with_window_to_spare(3600, 120);
        let mut c = Cluster::new(&SHORT, &ALL);
        let limit = 10 * LIMIT;
        let value = "rebuild";
        let (owner, next) = owner_and_next(&c, "large", value);
        let hot = (0..3).find(|&i| i != owner && i != next).unwrap();
        // The hot node alone uses 60% of the limit, and holds more than it used (what its
        // demand needs until its next renewal).
        let body = body("large", value);
        let load = Load::start(&c, &[hot], &body);
        wait_for("60% of the limit admitted", Duration::from_secs(30), || {
            load.admitted(&[hot]) >= limit * 6 / 10
        });
        // The owner dies; the next owner starts taking hits at once.
        c.nodes[owner].kill();
        let hot_at_kill = load.admitted(&[hot]);
        let others = Load::start(&c, &[next], &body);
        wait_for(
            "the two to admit the whole limit",
            Duration::from_secs(30),
            || load.admitted(&[hot]) + others.admitted(&[next]) >= limit,
        );
        let reached = Instant::now();
        wait_for("the load to settle", Duration::from_secs(10), || {
            reached.elapsed() >= Duration::from_secs(1)
        });
        let hot_seen = load.stop(&[hot]);
        let next_seen = others.stop(&[next]);
        let (h, n) = (
            hot_seen[hot].admitted.load(Ordering::Relaxed),
            next_seen[next].admitted.load(Ordering::Relaxed),
        );
        eprintln!("rebuild: the hot node admitted {h}, the new owner {n}");
        let bound = limit + limit / 2;
        assert!(
            h + n <= bound,
            "{} admitted, over {bound} ({h} + {n})",
            h + n
        );
        // The cluster went on using the whole limit (the wait above fails the test otherwise),
        // and both live nodes took part: the hot node kept admitting once its lease server was
        // gone, and the new owner served the key during its rebuild.
        assert!(
            h > hot_at_kill,
            "the hot node admitted nothing after the owner died ({h} before and after)"
        );
        assert!(n > 0, "the new owner admitted nothing during its rebuild");
    }

    /// `rate`'s bucket: 10 hits per second, 10 at once.
    const RATE: u64 = 10;

    #[test]
    fn a_killed_holder_leaves_a_window_within_its_limit_and_its_bucket_rate_returns() {
        process::with_window_to_spare(3600, 120);
        let mut c = Cluster::new(&SHORT, &ALL);
        // A node that owns neither key: both lease servers survive it.
        let (window, bucket) = ("killed-holder-w", "killed-holder-b");
        let bucket_owner = c.owner("rate", bucket);
        let victim = (0..3)
            .find(|&i| c.owner("large", window) != i && bucket_owner != i)
            .expect("a node owning neither");
        let rest = others(victim);
        // The window's limit is large enough that it is half used, not all, when the victim
        // dies: the victim holds allowance it has not used.
        let limit = 10 * LIMIT;
        let buckets = Load::start(&c, &ALL, &body("rate", bucket));
        let windows = Load::start(&c, &ALL, &body("large", window));
        wait_for(
            "half the window's limit and a bucket's worth admitted",
            Duration::from_secs(20),
            || windows.admitted(&ALL) >= limit / 2 && buckets.admitted(&ALL) >= RATE,
        );
        c.nodes[victim].kill();
        wait_for(
            "the victim's clients to notice",
            Duration::from_secs(10),
            || {
                windows.seen[victim].unanswered.load(Ordering::Relaxed) > 0
                    && buckets.seen[victim].unanswered.load(Ordering::Relaxed) > 0
            },
        );
        // Bucket: once the victim's lease has expired (300 ms) its owner drops it, and the two
        // others' shares grow into its part of the rate at their next renewals.
        let victim_addr = c.addr(victim);
        let view = format!("/debug/lease?key=d_rate_{bucket}_");
        wait_for(
            "the owner to drop the victim's bucket share",
            Duration::from_secs(10),
            || {
                http(c.nodes[bucket_owner].debug, "GET", &view, "")
                    .is_some_and(|(status, b)| status == 200 && !b.contains(&victim_addr))
            },
        );
        let (from, before) = (Instant::now(), buckets.admitted(&rest));
        wait_for("six seconds of load", Duration::from_secs(20), || {
            from.elapsed() >= Duration::from_secs(6)
        });
        let (t, after) = (from.elapsed(), buckets.admitted(&rest));
        let elapsed = buckets.started.elapsed();
        let seen = buckets.stop(&rest);
        // Over those seconds the two admit the key's whole rate (two thirds of it before),
        // and never more than the bucket plus its rate: C + r t, one hit in flight per client
        // either side.
        let admitted = after - before;
        let rate = RATE as f64 * t.as_secs_f64();
        eprintln!("bucket: the others admitted {admitted} in {t:?}, at {RATE}/s: {rate:.0}");
        assert!(
            admitted as f64 >= rate * 0.85 - 2.0,
            "the others admitted {admitted} in {t:?}: the victim's rate did not return"
        );
        assert!(
            admitted as f64 <= RATE as f64 + rate + 2.0,
            "the others admitted {admitted} in {t:?}, over {RATE} + {rate:.0}"
        );
        // Over the whole test, the bound with every node's first grant starting full.
        let total: u64 = seen
            .iter()
            .map(|s| s.admitted.load(Ordering::Relaxed))
            .sum();
        let bound = RATE as f64 * (1.0 + elapsed.as_secs_f64()) + 3.0 * RATE as f64 + 3.0;
        assert!(
            total as f64 <= bound,
            "the bucket admitted {total} in {elapsed:?}"
        );
        // Window: the victim's allowance stays charged until the window ends (it may have
        // used all of it), so the window never passes its limit, and the others get the rest.
        let seen = windows.stop(&rest);
        let per_node: Vec<u64> = seen
            .iter()
            .map(|s| s.admitted.load(Ordering::Relaxed))
            .collect();
        let total: u64 = per_node.iter().sum();
        eprintln!("window: admitted {per_node:?} (node {victim} lost)");
        assert!(total <= limit, "the window admitted {total} ({per_node:?})");
    }

    /// Two of the three peers use half of a key's limit and go quiet; the third joins and is
    /// offered many times what is left. It gets all that is left, decided locally, and no more
    /// (`owned`: the joiner is the key's owner among all three, so its new lease server, which
    /// rebuilds the key: then docs/cluster.md's bound during a failure allows it its rebuild
    /// cap, an equal share over the three, beyond what is left).
    fn a_joining_node(owned: bool) {
        process::with_window_to_spare(3600, 120);
        let joiner = 2;
        let mut c = Cluster::new(&SHORT, &[0, 1]);
        let value = c.value_owned("fixed", joiner, owned);
        let body = body("fixed", &value);
        admit(&c, &[0, 1], &body, LIMIT / 2);
        // Quiet: they renew nothing any more, so what they hold is what they used and their
        // demand has decayed to nothing (no renewal for six renewal intervals).
        let mut last = (u64::MAX, Instant::now());
        wait_for(
            "the first two to stop renewing",
            Duration::from_secs(20),
            || {
                let renewals = c.lease_stat(&[0, 1], "renewals");
                if renewals != last.0 {
                    last = (renewals, Instant::now());
                }
                last.1.elapsed() >= Duration::from_millis(300)
            },
        );
        // The joiner starts, and the two others see it answer.
        c.start(joiner);
        c.wait_up(&ALL);
        let left = LIMIT - LIMIT / 2;
        let acquires = c.lease_stat(&[joiner], "acquires");
        let load = Load::start(&c, &[joiner], &body);
        run_until(
            &load,
            &[joiner],
            &format!("the joiner to admit what is left ({left})"),
            Duration::from_secs(20),
            Duration::from_secs(1),
            5 * LIMIT,
            |l| l.admitted(&[joiner]) >= left,
        );
        let elapsed = load.started.elapsed();
        let seen = load.stop(&[joiner]);
        let admitted = seen[joiner].admitted.load(Ordering::Relaxed);
        let offered = seen[joiner].offered.load(Ordering::Relaxed);
        eprintln!(
            "joiner {}: the first two admitted {}, the joiner {admitted} of {offered}",
            if owned {
                "owning the key"
            } else {
                "not owning it"
            },
            LIMIT / 2
        );
        let bound = if owned {
            left + LIMIT.div_ceil(3)
        } else {
            left
        };
        assert!(
            admitted <= bound,
            "the joiner admitted {admitted}, over {bound} ({left} left)"
        );
        // Decided from its leases: no hit forwarded, an acquire at most once per renewal
        // interval (50 ms), most decisions local (as in the first test; 60% when overloaded,
        // since renewals every 50 ms are under way for more of the time).
        let acquires = c.lease_stat(&[joiner], "acquires") - acquires;
        let bound = elapsed.as_millis() as u64 / 50 + 1;
        assert!(acquires <= bound, "{acquires} acquires, at most {bound}");
        assert_eq!(c.lease_stat(&[joiner], "forwarded"), 0);
        assert_eq!(cluster_stat(&c.nodes[joiner], "forwarded_hits"), 0);
        let local = c.lease_stat(&[joiner], "local_decisions");
        eprintln!("joiner: {local} local decisions of {offered}, {acquires} acquires");
        assert!(local * 2 >= offered, "{local} local decisions of {offered}");
    }

    #[test]
    fn a_joining_node_receives_a_share_and_decides_locally() {
        a_joining_node(false);
    }

    /// The joiner becomes the key's lease server and must learn what the others used before
    /// granting itself more. What this guards against (it failed so until a peer coming back up
    /// was a ring change in lease mode, 975e696): the joiner never heard from the quiet nodes
    /// (they sent no renewal for a key they held nothing more of), and its
    /// rebuild cap ended a lease duration after it started, before its first acquire: it
    /// granted itself the whole limit again, 90 admitted in a window of 60 (the documented
    /// bound: 80).
    #[test]
    fn a_joining_node_that_owns_the_key_learns_what_the_others_used() {
        a_joining_node(true);
    }
}

/// The Rate Limit Quota Service across peers: Envoys (tonic clients speaking the filter's
/// protocol) on different nodes share one bucket, split by its owner.
mod rlqs {
    use super::*;

    use rlqs_envoy::Envoy;

    const YAML: &str = "domain: rlqs\ndescriptors:\n  - key: tenant\n    value: acme\n    rate_limit: {unit: second, requests_per_unit: 100}\n";

    async fn connect(grpc: u16) -> Envoy {
        Envoy::connect(
            &format!("http://127.0.0.1:{grpc}"),
            "rlqs",
            &[("tenant", "acme")],
        )
        .await
        .expect("connect")
    }

    fn rate(e: &Envoy) -> Option<f64> {
        e.rate()
    }

    /// Waits (reporting `attempted` per half second on every stream) until `done` holds.
    async fn until(envoys: &[&Envoy], attempted: u64, what: &str, done: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            for e in envoys {
                e.report(attempted).await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    #[test]
    fn envoys_on_two_nodes_split_one_bucket_and_a_leaving_one_frees_its_part() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("limits.yaml"), YAML).unwrap();
        let env = [(
            "SLUICE_RLQS_ASSIGNMENT_TTL_SECS".to_string(),
            "2".to_string(),
        )];
        let (mut nodes, peers) = peer_nodes(2, &env);
        for n in &mut nodes {
            n.start(&peers, dir.path());
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let a = connect(nodes[0].grpc).await;
            until(&[&a], 100, "the first Envoy gets the whole rate", || {
                rate(&a) == Some(100.0)
            })
            .await;
            let b = connect(nodes[1].grpc).await;
            until(
                &[&a, &b],
                100,
                "two Envoys on two nodes split the rate",
                || rate(&a) == Some(50.0) && rate(&b) == Some(50.0),
            )
            .await;
            // Both stay within the bucket's rate as they keep reporting (every half second,
            // so their assignments live SLUICE_RLQS_ASSIGNMENT_TTL_SECS, 2 s).
            for _ in 0..4 {
                for e in [&a, &b] {
                    e.report(100).await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                let sum = rate(&a).unwrap() + rate(&b).unwrap();
                assert!(sum <= 100.0, "{sum} assigned of 100");
            }
            let left = tokio::time::Instant::now();
            drop(b);
            until(&[&a], 100, "the freed part goes to the Envoy left", || {
                rate(&a) == Some(100.0)
            })
            .await;
            // Its part was reserved while its Envoy could still enforce it: at least a TTL.
            assert!(
                left.elapsed() >= Duration::from_secs(2),
                "{:?}",
                left.elapsed()
            );
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Refunds (`is_negative_hits`) on three real processes: forwarded to the owner from any node
// (forward mode), decided on each node's share (divided mode), and in lease mode counted by the
// owner for a limit with `charge_refused: true`, or given back to a holder's allowance.

mod refunds {
    use super::*;
    use in_flight::Answer;

    /// Limits of 3 per hour: a fixed window, one with `charge_refused: true`, a sliding window
    /// without and with it.
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
  - key: budget
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: login
    rate_limit: {unit: second, requests_per_unit: 3, penalty_seconds: 3}
";

    /// Three peers on [`LIMITS`] with `env`, once each sees the three up.
    fn cluster(env: &[(&str, &str)]) -> (tempfile::TempDir, Vec<Node>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("limits.yaml"), LIMITS).unwrap();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (mut nodes, peers) = peer_nodes(3, &env);
        for n in &mut nodes {
            n.start(&peers, dir.path());
        }
        for n in &nodes {
            wait_for("every peer up", Duration::from_secs(15), || {
                http(n.debug, "GET", "/stats", "").is_some_and(|(_, b)| {
                    b.lines()
                        .filter(|l| l.starts_with("sluice.cluster.peer_up.") && l.ends_with(": 1"))
                        .count()
                        == 3
                })
            });
        }
        (dir, nodes)
    }

    /// One descriptor `key=value` with `hits`, a refund when `negative`, over `/json`.
    fn json(node: &Node, key: &str, value: &str, negative: bool, hits: u64) -> Answer {
        let body = format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}],"hits_addend":{hits},"is_negative_hits":{negative}}}]}}"#
        );
        let (status, body) = http(node.http, "POST", "/json", &body).expect("answer");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        let s = &v["statuses"][0];
        let ok = s["code"] == "OK";
        assert_eq!(status, if ok { 200 } else { 429 }, "{body}");
        Answer {
            ok,
            remaining: s["limitRemaining"].as_u64().unwrap_or(0) as u32,
        }
    }

    /// A reservation call on `budget=t` through `node`: `entry` is `sluice_reserve` or
    /// `sluice_reservation` with its token. OK, and the token the answer names.
    fn reservation(node: &Node, entry: (&str, &str), hits: u64) -> (bool, Option<String>) {
        let body = format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"budget","value":"t"}},{{"key":"{}","value":"{}"}}],"hits_addend":{hits}}}]}}"#,
            entry.0, entry.1
        );
        let (_, body) = http(node.http, "POST", "/json", &body).expect("answer");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        let token = v["dynamicMetadata"]["sluice_reservation"].as_str();
        (v["overallCode"] == "OK", token.map(str::to_owned))
    }

    /// Reserves 30 of the budget of 50 through node 0 (its token), and sees node 1 refuse 30
    /// more.
    fn reserve_then_refuse(nodes: &[Node]) -> String {
        let reserve = ("sluice_reserve", "1");
        let (ok, first) = reservation(&nodes[0], reserve, 30);
        let first = first.filter(|_| ok).expect("the first estimate fits");
        assert_eq!(reservation(&nodes[1], reserve, 30), (false, None));
        first
    }

    /// Issue 51 on three nodes: a budget of 50, estimates of 30 reserved and settled through
    /// different nodes; the settle gives back what the estimate passed the cost, wherever the
    /// reservation was made.
    fn reservations_across_nodes(nodes: &[Node]) {
        let reserve = ("sluice_reserve", "1");
        let first = reserve_then_refuse(nodes);
        assert!(reservation(&nodes[2], ("sluice_reservation", &first), 10).0);
        assert!(reservation(&nodes[1], reserve, 30).0, "20 came back");
        assert_eq!(reservation(&nodes[0], reserve, 30), (false, None));
    }

    /// Lease mode: a settle gives back into the allowance of the node it reaches, so one sent
    /// through the node that reserved frees the estimate's excess there at once; through
    /// another node, what it gives back is not the others' to spend (never past the budget).
    fn reservations_on_leases(nodes: &[Node]) {
        let reserve = ("sluice_reserve", "1");
        let first = reserve_then_refuse(nodes);
        assert!(reservation(&nodes[0], ("sluice_reservation", &first), 10).0);
        assert!(
            reservation(&nodes[0], reserve, 20).0,
            "20 came back to node 0"
        );
        // 10 used and 20 reserved on node 0: 20 left in the budget, not 30.
        assert_eq!(reservation(&nodes[1], reserve, 30), (false, None));
        assert_eq!(reservation(&nodes[2], reserve, 30), (false, None));
    }

    /// Issue 52's penalty ([`penalty::steps`]) with each request to the next node in turn: the
    /// key's owner keeps the penalty whichever node a request reaches.
    fn penalty_across_nodes(nodes: &[Node]) {
        let mut i = 0;
        penalty::steps(|value| {
            i += 1;
            penalty::login(nodes[i % nodes.len()].http, value)
        });
    }

    /// A client sending each call to the next node in turn.
    fn round_robin<'a>(nodes: &'a [Node], key: &'a str) -> impl FnMut(bool, u64) -> Answer + 'a {
        let mut i = 0;
        move |negative, hits| {
            i += 1;
            json(&nodes[i % nodes.len()], key, "rr", negative, hits)
        }
    }

    #[test]
    fn refunds_in_forward_mode_reach_the_owner_from_every_node() {
        let (_dir, nodes) = cluster(&[]);
        for key in ["inflight", "charged", "sliding_charged"] {
            in_flight::counted(&mut round_robin(&nodes, key));
        }
        in_flight::ignored(&mut round_robin(&nodes, "sliding"));
        reservations_across_nodes(&nodes);
        penalty_across_nodes(&nodes);
        // The owner's counter, read from any node: 10 used, 30 reserved.
        let uri = "/debug/counters?domain=d&descriptor=budget=t";
        let (_, body) = http(nodes[2].debug, "GET", uri, "").expect("counters");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        let c = &v["counters"][0];
        assert_eq!(
            (
                c["count"].as_u64(),
                c["used"].as_u64(),
                c["reserved"].as_u64()
            ),
            (Some(40), Some(10), Some(30)),
            "{body}"
        );
        let forwarded: u64 = nodes
            .iter()
            .map(|n| {
                let (_, b) = http(n.debug, "GET", "/stats", "").expect("stats");
                b.lines()
                    .find_map(|l| l.strip_prefix("sluice.cluster.forwarded_hits: "))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            })
            .sum();
        assert!(forwarded > 0, "refunds and hits crossed to the owners");
    }

    /// Divided mode: each node decides on its own share, ceil(3 / 3) = 1, refunds included.
    #[test]
    fn refunds_in_divided_mode_give_back_a_nodes_own_share() {
        let (_dir, nodes) = cluster(&[("SLUICE_CLUSTER_MODE", "divided")]);
        for n in &nodes {
            let call = |negative, hits| json(n, "inflight", "own", negative, hits);
            assert!(call(false, 1).ok);
            assert!(!call(false, 1).ok);
            assert_eq!(call(true, 1).remaining, 0, "the refusal's refund: 1 left");
            assert_eq!(call(true, 5).remaining, 1, "floored at 0");
            assert!(call(false, 1).ok);
        }
    }

    fn lease_cluster(env: &[(&str, &str)]) -> (tempfile::TempDir, Vec<Node>) {
        let mut all = vec![
            ("SLUICE_CLUSTER_MODE", "lease"),
            // A slow peer on a loaded machine is not a lost one (see the lease tests).
            ("SLUICE_PEER_TIMEOUT_MS", "2000"),
        ];
        all.extend_from_slice(env);
        cluster(&all)
    }

    /// Lease mode: a limit with `charge_refused: true` is counted by its owner, refused hits
    /// included, so its refunds balance exactly; a plain fixed window is leased, and a lease
    /// holds no refused hit, so by default its refunds are answered OK and taken off nothing.
    #[test]
    fn refunds_in_lease_mode_are_exact_with_charge_refused_and_ignored_without() {
        let (_dir, nodes) = lease_cluster(&[]);
        for key in ["charged", "sliding_charged"] {
            in_flight::counted(&mut round_robin(&nodes, key));
        }
        // A key's owner caps its grants at the limit over the peers for a lease duration after
        // the ring last changed (its rebuild: SLUICE_LEASE_DURATION_MS, 1 s): an estimate of 30
        // of 50 waits that out.
        std::thread::sleep(Duration::from_millis(2_500));
        reservations_on_leases(&nodes);
        let mut call = round_robin(&nodes, "inflight");
        let admitted: Vec<bool> = (0..4).map(|_| call(false, 1).ok).collect();
        assert_eq!(admitted, [true, true, true, false]);
        for _ in 0..3 {
            assert!(call(true, 1).ok, "a refund is answered OK");
        }
        let admitted = (0..3).filter(|_| call(false, 1).ok).count();
        assert_eq!(admitted, 0, "the refunds took nothing off");
        // A limit with a penalty is never leased: its owner decides and keeps the penalty.
        penalty_across_nodes(&nodes);
        let (_, metrics) = http(nodes[0].debug, "GET", "/metrics", "").expect("metrics");
        assert!(
            metrics.lines().any(|l| l.starts_with(
                r#"ratelimit_service_rate_limit_negative_hits_ignored{domain="d",key1="inflight"}"#
            ) && !l.ends_with(" 0")),
            "{metrics}"
        );
    }

    /// Lease mode with SLUICE_NEGATIVE_HITS=always (for a proxy that sends refunds only for the
    /// requests it admitted): a refund a holder takes gives the place back to its own
    /// allowance, used with no hop, while the other nodes stay full.
    #[test]
    fn a_lease_holder_takes_a_refund_back_into_its_allowance() {
        let (_dir, nodes) = lease_cluster(&[("SLUICE_NEGATIVE_HITS", "always")]);
        let call = |i: usize, negative: bool| json(&nodes[i], "inflight", "held", negative, 1);
        for i in 0..3 {
            assert!(call(i, false).ok, "node {i}");
        }
        assert!(!call(0, false).ok, "3 in flight, one on each node");
        assert!(call(0, true).ok);
        assert!(call(0, false).ok, "node 0's place came back");
        assert!(!call(0, false).ok);
        assert!(!call(1, false).ok, "node 1 still holds its one");
    }
}

/// Forward mode: a node whose forward fails and so leaves it without a majority decides the
/// hits of that forward alone, within the safe capacity, not as the key's stand-in with the
/// whole limit (issue 49's flaky fault test: a hit retried so crossed the partition bound).
/// Node C is down and marked down at node B; then the key's owner A dies, and B, which still
/// believes A up, forwards 5 hits to it. The refused forward marks A down, which leaves B alone
/// (1 of 3). Before, B retried the hits on their next owner, itself, with the whole limit of 10:
/// admitted. Now they are decided alone against the safe capacity (10 / 3 = 3): refused.
#[test]
fn a_forward_that_leaves_the_node_without_a_majority_is_decided_alone() {
    let (_dir, mut nodes, peers) = three_nodes(&[]);
    let ring = Ring::new(peers.split(',').map(str::to_owned));
    let index = |addr: &str| {
        nodes
            .iter()
            .position(|n| format!("127.0.0.1:{}", n.peer) == addr)
            .unwrap()
    };
    let owner = ring.owner(key_hash("d_k_v_"), |_| true).unwrap();
    let next = ring.owner(key_hash("d_k_v_"), |i| i != owner).unwrap();
    let (a, b) = (index(ring.addr(owner)), index(ring.addr(next)));
    let c = 3 - a - b;
    nodes[c].kill();
    let down = format!("sluice.cluster.peer_up.127.0.0.1:{}: 0", nodes[c].peer);
    wait_for(
        "node B to mark node C down",
        Duration::from_secs(10),
        || http(nodes[b].debug, "GET", "/stats", "").is_some_and(|(_, s)| s.contains(&down)),
    );
    nodes[a].kill();
    let five =
        r#"{"domain":"d","hitsAddend":5,"descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let (status, body) = http(nodes[b].http, "POST", "/json", five).expect("answer");
    let (_, stats) = http(nodes[b].debug, "GET", "/stats", "").expect("stats");
    assert!(stats.contains("sluice.cluster.majority: 0"), "{stats}");
    assert_eq!(status, 429, "5 hits against a safe capacity of 3: {body}");
}
