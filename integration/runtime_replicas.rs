//! Runtime limits across nodes, against real `sluice` processes: a limit set on one node of a
//! three-node peer cluster applies to the next decision on every node, and a node that was down
//! catches up when it returns; a limit set on one of two replicas sharing a real `redis-server`
//! applies on the other within SLUICE_RUNTIME_LIMITS_POLL_MS, and a replica started later loads
//! it. Under CI a missing `redis-server` fails the Redis test; elsewhere it is skipped loudly.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
mod node;
mod redis_server;
mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use node::Node;
use redis_server::{RedisServer, redis_server_available};
use support::{free_port, http, wait_for};

const TOKEN: &str = "s3cr3t";

/// The environment every node of these tests gets: the token file, and `extra`.
fn node_env(dir: &Path, extra: &[(&str, String)]) -> Vec<(String, String)> {
    let tokens = dir.join("tokens").display().to_string();
    std::iter::once(("SLUICE_ADMIN_TOKEN_FILE", tokens))
        .chain(extra.iter().cloned())
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

/// What the runtime limits API and the decisions answer on a node.
impl Node {
    /// A call to the runtime limits API with the token: (status, body).
    fn admin(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.debug)).expect("debug port");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let status = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
        (status, body.unwrap_or_default())
    }

    /// The runtime limits `/rlconfig` shows.
    fn runtime_lines(&self) -> Vec<String> {
        let (_, text) = http(self.debug, "GET", "/rlconfig", "").expect("rlconfig");
        text.lines()
            .filter(|l| l.ends_with("source: runtime"))
            .map(str::to_owned)
            .collect()
    }

    /// `n` decisions for `d`/`k`=`value` on this node: the codes.
    fn decide(&self, value: &str, n: usize) -> Vec<String> {
        let body = format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"{value}"}}]}}]}}"#
        );
        (0..n)
            .map(|_| {
                let (_, answer) = http(self.http, "POST", "/json", &body).expect("json");
                let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
                v["overallCode"].as_str().unwrap_or_default().to_owned()
            })
            .collect()
    }
}

/// A directory with the config (`d`: `k` 100 an hour) and the token file.
fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/limits.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("tokens"), format!("ops {TOKEN}\n")).unwrap();
    dir
}

const TWO_AN_HOUR: &str = r#"{"unit":"hour","requests_per_unit":2}"#;
const LINE_V: &str =
    "d.k_v: unit=HOUR requests_per_unit=2, shadow_mode: false, quota_mode: false, source: runtime";

#[test]
fn a_limit_set_on_one_peer_applies_to_the_next_decision_on_every_peer_and_a_returning_peer_catches_up()
 {
    let dir = setup();
    let config = dir.path().join("config");
    let env = node_env(dir.path(), &[]);
    let mut nodes: Vec<Node> = (0..3).map(|_| Node::new(env.clone())).collect();
    let peers = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.peer))
        .collect::<Vec<_>>()
        .join(",");
    for n in &mut nodes {
        n.start(&peers, &config);
    }
    // Every node has seen the others answer (and pulled their empty sets).
    std::thread::sleep(Duration::from_secs(1));
    let (status, body) = nodes[0].admin("PUT", "/limits/d/k=v", TWO_AN_HOUR);
    assert_eq!(status, 201, "{body}");
    // No waiting: the API answered once every peer had it.
    for n in &nodes {
        assert_eq!(n.runtime_lines(), [LINE_V]);
    }
    // One counter for the cluster: two admitted anywhere, then refused everywhere.
    let codes: Vec<String> = [&nodes[1], &nodes[2], &nodes[0]]
        .iter()
        .flat_map(|n| n.decide("v", 1))
        .collect();
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT"]);

    // Node 2 is down while the limits change; it catches up when it returns.
    nodes[2].kill();
    let (status, _) = nodes[1].admin("DELETE", "/limits/d/k=v", "");
    assert_eq!(status, 204);
    let (status, _) = nodes[0].admin("PUT", "/limits/d/k=w", TWO_AN_HOUR);
    assert_eq!(status, 201);
    nodes[2].start(&peers, &config);
    let want = [LINE_V.replace("k_v", "k_w")];
    wait_for("node 2 to catch up", Duration::from_secs(10), || {
        nodes[2].runtime_lines() == want
    });
    for n in &nodes {
        assert_eq!(n.runtime_lines(), want);
    }
    let (status, body) = nodes[2].admin("GET", "/limits/d", "");
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["limits"].as_array().map(Vec::len), Some(1), "{body}");
}

#[test]
fn a_limit_set_on_one_replica_sharing_redis_holds_on_the_other_within_the_poll() {
    if !redis_server_available() {
        return;
    }
    let redis = RedisServer::start_on(free_port());
    let dir = setup();
    let config = dir.path().join("config");
    let env = node_env(
        dir.path(),
        &[
            ("BACKEND_TYPE", "redis".to_owned()),
            ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("SLUICE_RUNTIME_LIMITS_POLL_MS", "100".to_owned()),
        ],
    );
    let mut a = Node::new(env.clone());
    let mut b = Node::new(env.clone());
    a.start_alone(&config);
    b.start_alone(&config);
    let (status, body) = a.admin("PUT", "/limits/d/k=v", TWO_AN_HOUR);
    assert_eq!(status, 201, "{body}");
    let put_at = Instant::now();
    wait_for(
        "replica b to hold the limit",
        Duration::from_secs(5),
        || b.runtime_lines() == [LINE_V],
    );
    let took = put_at.elapsed();
    eprintln!("replica b held the limit {took:?} after the PUT was answered (poll 100 ms)");
    // The counters are Redis's: two admitted across both, then refused on both.
    let mut codes = a.decide("v", 1);
    codes.extend(b.decide("v", 2));
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT"]);
    // A replica started later loads the shared limits.
    let mut c = Node::new(env);
    c.start_alone(&config);
    wait_for(
        "replica c to load the limit",
        Duration::from_secs(5),
        || c.runtime_lines() == [LINE_V],
    );
    // A removal on b reaches a and c.
    let (status, _) = b.admin("DELETE", "/limits/d/k=v", "");
    assert_eq!(status, 204);
    wait_for("the removal everywhere", Duration::from_secs(5), || {
        a.runtime_lines().is_empty() && c.runtime_lines().is_empty()
    });
    assert!(
        redis.cli(&["HLEN", "sluice:{runtime}:limits"]).trim() == "1",
        "the removal is kept in the hash"
    );
}
