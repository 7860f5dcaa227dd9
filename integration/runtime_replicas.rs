//! Runtime limits across nodes, against real `sluice` processes: a limit set on one node of a
//! three-node peer cluster applies to the next decision on every node, and a node that was down
//! catches up when it returns; a limit set on one of two replicas sharing a real `redis-server`
//! applies on the other within SLUICE_RUNTIME_LIMITS_POLL_MS, and a replica started later loads
//! it. Under CI a missing `redis-server` fails the Redis test; elsewhere it is skipped loudly.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
mod redis_server;
mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis_server::{RedisServer, redis_server_available};
use support::{free_port, http, wait_for};

const TOKEN: &str = "s3cr3t";

/// A Sluice process on free ports; killed on drop.
struct Node {
    child: Option<Child>,
    http: u16,
    debug: u16,
    peer: u16,
    grpc: u16,
    env: Vec<(String, String)>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Node {
    fn new(env: Vec<(String, String)>) -> Node {
        Node {
            child: None,
            http: free_port(),
            debug: free_port(),
            peer: free_port(),
            grpc: free_port(),
            env,
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn start(&mut self, dir: &Path) {
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("--config")
            .arg(dir.join("config"))
            .env_remove("REDIS_URL")
            .env_remove("BACKEND_TYPE")
            .env("SLUICE_PEER_TIMEOUT_MS", "300")
            .env("SLUICE_ADMIN_TOKEN_FILE", dir.join("tokens"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("HOST", "127.0.0.1")
            .env("GRPC_HOST", "127.0.0.1")
            .env("DEBUG_HOST", "127.0.0.1")
            .env("PORT", self.http.to_string())
            .env("GRPC_PORT", self.grpc.to_string())
            .env("DEBUG_PORT", self.debug.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sluice");
        self.child = Some(child);
        wait_for("sluice to answer", Duration::from_secs(20), || {
            http(self.http, "GET", "/healthcheck", "").is_some_and(|(s, _)| s == 200)
        });
    }

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
    let mut nodes: Vec<Node> = (0..3).map(|_| Node::new(Vec::new())).collect();
    let peers = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.peer))
        .collect::<Vec<_>>()
        .join(",");
    for n in &mut nodes {
        n.env = vec![
            ("PEERS".into(), peers.clone()),
            ("PEER_PORT".into(), n.peer.to_string()),
            (
                "PEER_ADVERTISE_ADDRESS".into(),
                format!("127.0.0.1:{}", n.peer),
            ),
        ];
        n.start(dir.path());
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
    nodes[2].start(dir.path());
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
    let env = vec![
        ("BACKEND_TYPE".to_owned(), "redis".to_owned()),
        ("REDIS_SOCKET_TYPE".to_owned(), "tcp".to_owned()),
        ("REDIS_URL".to_owned(), format!("127.0.0.1:{}", redis.port)),
        ("SLUICE_RUNTIME_LIMITS_POLL_MS".to_owned(), "100".to_owned()),
    ];
    let mut a = Node::new(env.clone());
    let mut b = Node::new(env.clone());
    a.start(dir.path());
    b.start(dir.path());
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
    c.start(dir.path());
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
