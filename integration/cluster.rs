//! Three real `sluice` processes on 127.0.0.1 with PEERS pointing at each other: one global
//! limit enforced exactly across them, an owner killed mid-test, and its return.

mod support;

use support::{free_port, http};

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice::cluster::ring::{Ring, key_hash};

struct Node {
    child: Option<Child>,
    http: u16,
    debug: u16,
    peer: u16,
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
        self.start_with(peers, config, &[]);
    }

    fn start_with(&mut self, peers: &str, config: &std::path::Path, env: &[(&str, &str)]) {
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .envs(env.iter().copied())
            .arg("--config")
            .arg(config)
            .env_remove("REDIS_URL")
            .env_remove("BACKEND_TYPE")
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
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("limits.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    )
    .unwrap();
    let mut nodes: Vec<Node> = (0..3)
        .map(|_| Node {
            child: None,
            http: free_port(),
            debug: free_port(),
            peer: free_port(),
        })
        .collect();
    let peers = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.peer))
        .collect::<Vec<_>>()
        .join(",");
    for n in &mut nodes {
        n.start_with(&peers, dir.path(), env);
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
