//! A Sluice process on free 127.0.0.1 ports for the multi-node tests (`cluster.rs`,
//! `runtime_replicas.rs`): started as a peer or alone, with extra environment kept for
//! restarts, killed on drop.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes; Sluice's code reads time through crate::clock"
)]
// Each test target that includes it uses a part.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_test_support::http::http;
use sluice_test_support::process::free_port;

/// One node.
pub struct Node {
    pub child: Option<Child>,
    pub http: u16,
    pub debug: u16,
    pub peer: u16,
    /// The port the other peers reach it on, when not `peer` (a delay proxy in between).
    pub advertised: Option<u16>,
    /// GRPC_PORT (ratelimit.v3 and the Rate Limit Quota Service).
    pub grpc: u16,
    /// Extra environment, kept for restarts.
    pub env: Vec<(String, String)>,
    /// Where its stderr (the logs) goes, appended across restarts; `None`: nowhere.
    pub log: Option<std::path::PathBuf>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Node {
    /// A node on free ports, not started, with `env`.
    pub fn new(env: Vec<(String, String)>) -> Node {
        Node {
            child: None,
            http: free_port(),
            debug: free_port(),
            peer: free_port(),
            advertised: None,
            grpc: free_port(),
            env,
            log: None,
        }
    }

    /// How the other peers name it: `127.0.0.1:` and its advertised port.
    pub fn peer_address(&self) -> String {
        format!("127.0.0.1:{}", self.advertised.unwrap_or(self.peer))
    }

    /// The PEERS list that names `nodes`.
    pub fn peers(nodes: &[Node]) -> String {
        nodes
            .iter()
            .map(Node::peer_address)
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it as a peer among `peers` (PEERS), with `config` as its config directory, and
    /// waits until it answers.
    pub fn start(&mut self, peers: &str, config: &std::path::Path) {
        self.launch(Some(peers), config);
    }

    /// Starts it alone (no peer cluster), and waits until it answers.
    pub fn start_alone(&mut self, config: &std::path::Path) {
        self.launch(None, config);
    }

    fn launch(&mut self, peers: Option<&str>, config: &std::path::Path) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .arg("--config")
            .arg(config)
            .env_remove("REDIS_URL")
            .env_remove("BACKEND_TYPE")
            // Before the test's own variables, which may set another.
            .env("SLUICE_PEER_TIMEOUT_MS", "300")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("HOST", "127.0.0.1")
            .env("GRPC_HOST", "127.0.0.1")
            .env("DEBUG_HOST", "127.0.0.1")
            .env("PORT", self.http.to_string())
            .env("GRPC_PORT", self.grpc.to_string())
            .env("DEBUG_PORT", self.debug.to_string());
        if let Some(peers) = peers {
            command
                .env("PEERS", peers)
                .env("PEER_PORT", self.peer.to_string())
                .env("PEER_ADVERTISE_ADDRESS", self.peer_address());
        }
        let stderr = self.log.as_ref().map_or_else(Stdio::null, |path| {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .expect("the node's log file");
            Stdio::from(file)
        });
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
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
