//! The fault harness: a [`Scenario`] (nodes, mode, one limit, the load, and its faults as a
//! table of (when, link, what, until)) run on real `sluice` processes in network namespaces
//! (`net.rs`) with the delay proxy (`proxy.rs`) on every peer link and Redis in its own
//! namespace when the scenario writes behind. One client thread per node in the root namespace
//! offers the node a steady rate over the node's own link; the [`Outcome`] counts what each
//! window admitted, the answers that were slow or wrong, how long the membership took to heal,
//! and whether every node is still running.

#![allow(
    clippy::disallowed_methods,
    reason = "the harness times real processes, sockets and faults"
)]

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice::cluster::ring::{Ring, key_hash};
use sluice_test_support::delay_proxy::Proxy;
use sluice_test_support::http::http_to;
use sluice_test_support::process;

use super::net::{self, Net, REDIS};

/// SLUICE_CLUSTER_MODE, or Redis replicas without peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Forward,
    Lease,
    Divided,
    /// No peers: every node counts in the one Redis (BACKEND_TYPE=redis), as envoyproxy/ratelimit
    /// replicas do.
    Replicas,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Forward => "forward",
            Mode::Lease => "lease",
            Mode::Divided => "divided",
            Mode::Replicas => "replicas",
        }
    }
}

/// Where a fault is.
#[derive(Clone, Copy, Debug)]
pub enum Link {
    /// Every peer link of this node (its veth on the bridge, Redis included).
    Node(usize),
    /// The peer link between two nodes, both ways.
    Peer(usize, usize),
    /// Only the calls the first node makes to the second (a one-way cut of calls).
    Calls(usize, usize),
    /// Redis's link to the bridge.
    Redis,
}

/// What a fault does.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// Nothing gets through.
    Down,
    /// Every byte held this long, each way (the proxy; `Link::Peer` only).
    Delay(Duration),
    /// This percentage of packets dropped (iptables; `Link::Peer` or `Link::Calls`).
    Loss(u32),
}

/// One row of a scenario's fault table: from `at` (after the first measured window starts)
/// until `until` (`None`: the end of the run).
#[derive(Clone, Copy, Debug)]
pub struct Fault {
    pub at: Duration,
    pub link: Link,
    pub kind: Kind,
    pub until: Option<Duration>,
}

/// A scenario: who runs, what is offered, and what goes wrong when.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub mode: Mode,
    pub nodes: usize,
    /// The limit on `d`/`k`: `limit` per window of `window_secs` seconds, a fixed window.
    pub limit: u64,
    pub window_secs: u64,
    /// `safe_capacity` in the limit's YAML, when set.
    pub safe_capacity: Option<u64>,
    /// The node owning the key among all nodes.
    pub owner: usize,
    /// Requests per second each node's client offers, from the first window's start.
    pub rate: u64,
    /// How long the load runs; the windows it covers are measured.
    pub run: Duration,
    pub faults: Vec<Fault>,
    /// SLUICE_PEER_TIMEOUT_MS.
    pub peer_timeout_ms: u64,
    /// Owners write behind to Redis (in its own namespace).
    pub write_behind: bool,
    /// Replicas decide hot keys from batches reserved from Redis (SLUICE_REDIS_ALLOWANCE).
    pub allowance: bool,
}

impl Scenario {
    /// Whether the scenario runs a Redis: write-behind's, or the replicas' one store.
    pub fn uses_redis(&self) -> bool {
        self.write_behind || self.mode == Mode::Replicas
    }
}

/// One window's admissions.
#[derive(Clone, Debug)]
pub struct WindowCount {
    /// The window's index since the epoch.
    pub index: u64,
    /// Admitted per node.
    pub admitted: Vec<u64>,
    pub offered: u64,
}

impl WindowCount {
    pub fn total(&self) -> u64 {
        self.admitted.iter().sum()
    }
}

/// What a run saw.
#[derive(Debug)]
pub struct Outcome {
    pub windows: Vec<WindowCount>,
    /// Answers other than 200 or 429, and calls with no answer, with the first such.
    pub errors: u64,
    pub first_error: Option<String>,
    /// Answers slower than the peer timeout, and the slowest.
    pub slow: u64,
    pub slowest: Duration,
    /// From the last heal until every node saw every other up again; `None`: no heal, or
    /// not within 30 s.
    pub recovery: Option<Duration>,
    /// From the last heal to the last call answered with an error after it; `None`: no error
    /// after the heal (or no heal).
    pub errors_end: Option<Duration>,
    /// Nodes whose process ended during the run.
    pub crashed: Vec<usize>,
    /// Each node's resident memory at the end less at the start, in KiB.
    pub rss_growth_kib: Vec<i64>,
}

/// The scenario's processes and network; everything is removed on drop (processes first).
pub struct Cluster {
    nodes: Vec<Child>,
    redis: Option<Child>,
    proxy: Proxy,
    pub net: Net,
    pub value: String,
    dir: tempfile::TempDir,
    peers: String,
    /// Whether the nodes are peers (not Redis replicas), whose views `all_up` compares.
    peered: bool,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.nodes.iter_mut().chain(self.redis.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Node `i`'s HTTP answer to `method path` (`None`: no answer within 5 s), and how long it took.
pub fn http(
    ip: &str,
    port: u16,
    method: &str,
    path: &str,
    body: &str,
) -> (Option<(u16, String)>, Duration) {
    let started = Instant::now();
    let answer = format!("{ip}:{port}")
        .parse()
        .ok()
        .and_then(|addr| http_to(addr, method, path, body));
    (answer, started.elapsed())
}

impl Cluster {
    /// The network, the proxy, Redis if asked, and every node started and seeing the others.
    pub fn start(s: &Scenario) -> Cluster {
        let net = Net::new(s.nodes, s.uses_redis());
        let listen = (0..s.nodes)
            .map(|i| net.peer_addr(i).parse().unwrap())
            .collect();
        let target = (0..s.nodes)
            .map(|i| {
                format!("{}:{}", net.node_ip(i), net::peer_port(i))
                    .parse()
                    .unwrap()
            })
            .collect();
        let node_ips: Vec<IpAddr> = (0..s.nodes)
            .map(|i| net.node_ip(i).parse().unwrap())
            .collect();
        let proxy = Proxy::start(listen, target, move |ip| {
            node_ips.iter().position(|n| *n == ip)
        });
        let dir = tempfile::tempdir().unwrap();
        let peers = (0..s.nodes)
            .map(|i| net.peer_addr(i))
            .collect::<Vec<_>>()
            .join(",");
        let value = value_owned_by(&peers, &net.peer_addr(s.owner));
        std::fs::write(dir.path().join("limits.yaml"), limits_yaml(s)).unwrap();
        let redis = s.uses_redis().then(|| start_redis(&net, dir.path()));
        let mut c = Cluster {
            nodes: Vec::new(),
            redis,
            proxy,
            net,
            value,
            dir,
            peers,
            peered: s.mode != Mode::Replicas,
        };
        for i in 0..s.nodes {
            let child = c.start_node(s, i);
            c.nodes.push(child);
        }
        for i in 0..s.nodes {
            c.wait_healthy(i);
        }
        process::wait_for(
            "every node to see every other up",
            Duration::from_secs(30),
            || c.all_up(),
        );
        c
    }

    fn start_node(&self, s: &Scenario, i: usize) -> Child {
        let net = &self.net;
        let log = std::fs::File::create(self.dir.path().join(format!("node{i}.log"))).unwrap();
        let mut cmd = net.command(i, &sluice_binary());
        cmd.arg("--config")
            .arg(self.dir.path())
            .env_remove("REDIS_URL")
            .env_remove("BACKEND_TYPE");
        // Sluice refuses SLUICE_* variables it does not know, so the harness's own go.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SLUICE_FAULTS_") {
                cmd.env_remove(name);
            }
        }
        if s.mode == Mode::Replicas {
            cmd.env("BACKEND_TYPE", "redis");
        } else {
            cmd.env("SLUICE_CLUSTER_MODE", s.mode.name())
                .env("PEERS", &self.peers)
                .env("PEER_PORT", net::peer_port(i).to_string())
                .env("PEER_ADVERTISE_ADDRESS", net.peer_addr(i));
        }
        cmd.env("SLUICE_PEER_TIMEOUT_MS", s.peer_timeout_ms.to_string())
            // An RLQS part of a node cut off expires at its owner 2 s after its last sync.
            .env("SLUICE_RLQS_ASSIGNMENT_TTL_SECS", "2")
            .env("HOST", "0.0.0.0")
            .env("GRPC_HOST", "0.0.0.0")
            .env("DEBUG_HOST", "0.0.0.0")
            .env("PORT", net::HTTP_PORT.to_string())
            .env("GRPC_PORT", net::GRPC_PORT.to_string())
            .env("DEBUG_PORT", net::DEBUG_PORT.to_string())
            .env("LOG_LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if s.write_behind {
            cmd.env("SLUICE_PEER_WRITE_BEHIND", "true")
                .env("SLUICE_PEER_WRITE_BEHIND_MS", "100");
        }
        if s.allowance {
            cmd.env("SLUICE_REDIS_ALLOWANCE", "true");
        }
        if s.uses_redis() {
            cmd.env("REDIS_SOCKET_TYPE", "tcp").env(
                "REDIS_URL",
                format!("{}:{}", net.redis_ip(), net::REDIS_PORT),
            );
        }
        cmd.spawn().expect("start sluice in its namespace")
    }

    fn wait_healthy(&self, i: usize) {
        let ip = self.net.client_ip(i);
        let started = Instant::now();
        while http(&ip, net::HTTP_PORT, "GET", "/healthcheck", "")
            .0
            .is_none()
        {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "node {i} did not start within 20 s; its log:\n{}",
                self.log(i)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether every node sees every other up (`/stats`); for replicas, that every node answers.
    pub fn all_up(&self) -> bool {
        (0..self.nodes.len()).all(|i| {
            let (answer, _) = http(&self.net.client_ip(i), net::DEBUG_PORT, "GET", "/stats", "");
            let Some((200, stats)) = answer else {
                return false;
            };
            (0..self.nodes.len())
                .filter(|&j| j != i && self.peered)
                .all(|j| {
                    stats.contains(&format!(
                        "sluice.cluster.peer_up.{}: 1",
                        self.net.peer_addr(j)
                    ))
                })
        })
    }

    /// Node `i`'s `sluice.cluster.<name>` from `/stats`; 0 when absent or not answered.
    pub fn stat(&self, i: usize, name: &str) -> u64 {
        let (answer, _) = http(&self.net.client_ip(i), net::DEBUG_PORT, "GET", "/stats", "");
        let prefix = format!("sluice.cluster.{name}: ");
        answer
            .and_then(|(_, stats)| {
                stats
                    .lines()
                    .find_map(|l| l.strip_prefix(prefix.as_str()))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0)
    }

    /// The log of node `i`, for a failing test's message.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("node{i}.log"))).unwrap_or_default()
    }

    fn rss_kib(&self) -> Vec<i64> {
        self.nodes
            .iter()
            .map(|c| {
                std::fs::read_to_string(format!("/proc/{}/status", c.id()))
                    .ok()
                    .and_then(|s| {
                        let line = s.lines().find(|l| l.starts_with("VmRSS:"))?.to_owned();
                        line.split_whitespace().nth(1)?.parse().ok()
                    })
                    .unwrap_or(0)
            })
            .collect()
    }

    fn crashed(&mut self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| !matches!(self.nodes[i].try_wait(), Ok(None)))
            .collect()
    }

    /// Puts `f` on the network (`on`) or takes it off.
    pub fn apply(&self, f: &Fault, on: bool) {
        let proxy = &self.proxy;
        match (f.link, f.kind) {
            (Link::Node(i), Kind::Down) => self.net.set_link(i, !on),
            (Link::Redis, Kind::Down) => self.net.set_link(REDIS, !on),
            (Link::Peer(a, b), Kind::Delay(d)) => {
                proxy.set_delay(a, b, if on { d } else { Duration::ZERO });
            }
            (Link::Peer(a, b), kind) if on => {
                let pct = loss_percent(kind);
                self.net.drop_calls(a, b, pct);
                self.net.drop_calls(b, a, pct);
            }
            (Link::Calls(a, b), kind) if on => self.net.drop_calls(a, b, loss_percent(kind)),
            (Link::Peer(..) | Link::Calls(..), _) => self.net.heal_calls(),
            (link, kind) => panic!("the harness cannot put {kind:?} on {link:?}"),
        }
    }
}

fn loss_percent(kind: Kind) -> u32 {
    match kind {
        Kind::Down => 100,
        Kind::Loss(p) => p,
        Kind::Delay(_) => unreachable!("delay is the proxy's"),
    }
}

/// The `sluice` to run: SLUICE_FAULTS_BINARY (to measure another build, say a copy taken before
/// a change), else the one cargo built with the tests.
fn sluice_binary() -> String {
    std::env::var("SLUICE_FAULTS_BINARY")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_sluice").to_owned())
}

/// The scenario's one limit on `d`/`k`.
fn limits_yaml(s: &Scenario) -> String {
    let safe = s
        .safe_capacity
        .map(|c| format!(", safe_capacity: {c}"))
        .unwrap_or_default();
    format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, unit_multiplier: {}, requests_per_unit: {}{safe}}}\n",
        s.window_secs, s.limit
    )
}

/// A value of `k` whose counter key's owner among every peer is `owner`.
fn value_owned_by(peers: &str, owner: &str) -> String {
    let ring = Ring::new(peers.split(',').map(str::to_owned));
    (0..)
        .map(|i| format!("v{i}"))
        .find(|v| {
            ring.addr(
                ring.owner(key_hash(&format!("d_k_{v}_")), |_| true)
                    .unwrap(),
            ) == owner
        })
        .unwrap()
}

fn start_redis(net: &Net, dir: &std::path::Path) -> Child {
    let log = std::fs::File::create(dir.join("redis.log")).unwrap();
    let child = net
        .command(REDIS, "redis-server")
        .args([
            "--bind",
            &net.redis_ip(),
            "--port",
            &net::REDIS_PORT.to_string(),
        ])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server in its namespace");
    let addr: SocketAddr = format!("{}:{}", net.redis_ip(), net::REDIS_PORT)
        .parse()
        .unwrap();
    process::wait_for("redis-server to listen", Duration::from_secs(10), || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
    });
    child
}

/// Seconds since the epoch, as a float.
fn epoch_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Sleeps until the next window of `window` seconds starts (plus 50 ms), returning its index.
fn until_next_window(window: u64) -> u64 {
    let now = epoch_secs();
    let next = (now / window as f64).floor() as u64 + 1;
    std::thread::sleep(Duration::from_secs_f64(
        next as f64 * window as f64 - now + 0.05,
    ));
    next
}

/// One answer a client saw: the window it was decided in, whether admitted, or what went
/// wrong.
struct Answer {
    window: u64,
    admitted: bool,
    error: Option<String>,
    /// When it came.
    at: Instant,
    took: Duration,
}

/// Runs `s` on `c`: the load from the next window's start, the faults on their schedule.
pub fn run(s: &Scenario, c: &mut Cluster) -> Outcome {
    let rss_before = c.rss_kib();
    let first = until_next_window(s.window_secs);
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Vec<Arc<Mutex<Vec<Answer>>>> = (0..s.nodes).map(|_| Arc::default()).collect();
    let clients: Vec<_> = (0..s.nodes)
        .map(|i| {
            client(
                c.net.client_ip(i),
                c.value.clone(),
                s,
                start,
                stop.clone(),
                seen[i].clone(),
            )
        })
        .collect();
    let (healed_at, recovery) = play_faults(s, c, start);
    if let Some(rest) = s.run.checked_sub(start.elapsed()) {
        std::thread::sleep(rest);
    }
    stop.store(true, Ordering::Relaxed);
    for t in clients {
        t.join().expect("client thread");
    }
    let rss_after = c.rss_kib();
    let mut outcome = tally(s, first, &seen);
    outcome.recovery = recovery;
    outcome.errors_end = healed_at.and_then(|healed| {
        seen.iter()
            .flat_map(|answers| {
                let answers = answers.lock().unwrap();
                answers
                    .iter()
                    .filter(|a| a.error.is_some() && a.at > healed)
                    .map(|a| a.at - healed)
                    .max()
            })
            .max()
    });
    outcome.crashed = c.crashed();
    outcome.rss_growth_kib = rss_after
        .iter()
        .zip(&rss_before)
        .map(|(a, b)| a - b)
        .collect();
    outcome
}

/// Applies and heals the faults at their times; returns when the last heal was and the
/// recovery after it.
fn play_faults(s: &Scenario, c: &Cluster, start: Instant) -> (Option<Instant>, Option<Duration>) {
    let mut events: Vec<(Duration, usize, bool)> = Vec::new();
    for (i, f) in s.faults.iter().enumerate() {
        events.push((f.at, i, true));
        if let Some(u) = f.until {
            events.push((u, i, false));
        }
    }
    events.sort_by_key(|e| (e.0, !e.2));
    let mut healed_at = None;
    for (at, i, on) in events {
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        c.apply(&s.faults[i], on);
        if !on {
            healed_at = Some(Instant::now());
        }
    }
    let Some(healed) = healed_at else {
        return (None, None);
    };
    while healed.elapsed() < Duration::from_secs(30) {
        if c.all_up() {
            return (healed_at, Some(healed.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (healed_at, None)
}

/// Node `ip`'s client: `s.rate` requests a second, one at a time, paced from `start`.
fn client(
    ip: String,
    value: String,
    s: &Scenario,
    start: Instant,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Answer>>>,
) -> std::thread::JoinHandle<()> {
    let (rate, window) = (s.rate, s.window_secs);
    let body = format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"{value}"}}]}}]}}"#
    );
    std::thread::spawn(move || {
        for n in 0u64.. {
            let due = start + Duration::from_secs_f64(n as f64 / rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let sent_in = (epoch_secs() / window as f64).floor() as u64;
            let (answer, took) = http(&ip, net::HTTP_PORT, "POST", "/json", &body);
            let decided_in = answer
                .as_ref()
                .and_then(|(_, body)| decided_window(body, window));
            let (admitted, error) = match answer {
                Some((200 | 429, body)) if decided_in.is_none() => {
                    (false, Some(format!("no durationUntilReset in {body}")))
                }
                Some((200, _)) => (true, None),
                Some((429, _)) => (false, None),
                Some((status, body)) => (false, Some(format!("{status} {body}"))),
                None => (false, Some("no answer".to_owned())),
            };
            seen.lock().unwrap().push(Answer {
                window: decided_in.unwrap_or(sent_in),
                admitted,
                error,
                took,
                at: Instant::now(),
            });
        }
    })
}

/// The window a node decided in, from its answer's `durationUntilReset` (the time to the end
/// of the window it counted in), so that a call sent just before a window ends and decided
/// just after is counted where the node counted it; by the client's clock at sending, a
/// boundary pair reads 301 and 299 for a limit of 300 (CI, 2026-11-27). None for an answer
/// without one (an error).
fn decided_window(body: &str, window: u64) -> Option<u64> {
    let answer: serde_json::Value = serde_json::from_str(body).ok()?;
    let reset = answer["statuses"][0]["durationUntilReset"].as_str()?;
    let reset: f64 = reset.strip_suffix('s')?.parse().ok()?;
    let ends = ((epoch_secs() + reset) / window as f64).round() as u64;
    ends.checked_sub(1)
}

/// Counts the answers per window (from `first`) and the slow and wrong ones.
fn tally(s: &Scenario, first: u64, seen: &[Arc<Mutex<Vec<Answer>>>]) -> Outcome {
    let timeout = Duration::from_millis(s.peer_timeout_ms);
    let mut windows: Vec<WindowCount> = Vec::new();
    let mut out = Outcome {
        windows: Vec::new(),
        errors: 0,
        first_error: None,
        slow: 0,
        slowest: Duration::ZERO,
        recovery: None,
        errors_end: None,
        crashed: Vec::new(),
        rss_growth_kib: Vec::new(),
    };
    // The windows the run covers; a call sent as the run ends may fall in the next.
    let covered = s.run.as_secs().div_ceil(s.window_secs);
    for (node, answers) in seen.iter().enumerate() {
        for a in answers.lock().unwrap().iter() {
            if a.window >= first + covered {
                continue;
            }
            let w = usize::try_from(a.window.saturating_sub(first)).unwrap();
            while windows.len() <= w {
                let index = first + windows.len() as u64;
                windows.push(WindowCount {
                    index,
                    admitted: vec![0; s.nodes],
                    offered: 0,
                });
            }
            windows[w].offered += 1;
            windows[w].admitted[node] += u64::from(a.admitted);
            out.slow += u64::from(a.took > timeout);
            out.slowest = out.slowest.max(a.took);
            if let Some(e) = &a.error {
                out.errors += 1;
                out.first_error
                    .get_or_insert_with(|| format!("node {node}: {e}"));
            }
        }
    }
    out.windows = windows;
    out
}

impl Outcome {
    /// Admitted over the limit in each window, as (mean, max).
    pub fn ratios(&self, limit: u64) -> (f64, f64) {
        let r: Vec<f64> = self
            .windows
            .iter()
            .map(|w| w.total() as f64 / limit as f64)
            .collect();
        let mean = r.iter().sum::<f64>() / r.len().max(1) as f64;
        (mean, r.iter().copied().fold(0.0, f64::max))
    }

    /// One line per window: admitted per node, total and its ratio to the limit.
    pub fn report(&self, s: &Scenario) -> String {
        let mut r = format!("{} ({} mode):\n", s.name, s.mode.name());
        for w in &self.windows {
            r += &format!(
                "  window {}: admitted {:?} = {} of {} offered, {:.2} x limit\n",
                w.index,
                w.admitted,
                w.total(),
                w.offered,
                w.total() as f64 / s.limit as f64
            );
        }
        r += &format!(
            "  errors {} {:?}, the last {:?} after the heal; slow (> {} ms) {}, slowest {:?}; recovery {:?}; crashed {:?}; RSS growth KiB {:?}\n",
            self.errors,
            self.first_error,
            self.errors_end,
            s.peer_timeout_ms,
            self.slow,
            self.slowest,
            self.recovery,
            self.crashed,
            self.rss_growth_kib
        );
        r
    }
}
