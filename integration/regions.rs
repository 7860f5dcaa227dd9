//! One limit across clusters (SLUICE_LEASE_PARENT, issue 39), against real `sluice` processes:
//! a root lease cluster of two nodes and two child lease clusters of two nodes each, on
//! loopback, every node driven by its own client thread as fast as this machine lets it.
//!
//! - A key offered twice its limit in each child admits the limit across both, and no more.
//! - A token bucket's demand moving from one child to the other moves its share to the other
//!   within the bound `docs/cluster.md` ("Regions") states.
//! - The root killed: the children go on within their safe capacity, and recover once it is
//!   back.
//! - With every call to the root delayed 60 ms each way (the fault harness's delay proxy, as
//!   between regions), and every peer call over mutual TLS, the limit still holds across both
//!   children.
//! - A child whose root never answered (its addresses swallow calls from the start) admits
//!   the limit over SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS per window for a limit without a
//!   `safe_capacity`, says so (logs, `/stats`, `/metrics`, the status page), and takes the
//!   root's grants once the root starts.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
mod node;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_test_support::http::http;
use sluice_test_support::process::{wait_for, with_window_to_spare};
use sluice_test_support::{delay_proxy, pki, process};

use node::Node;

/// The hour limit of the first test.
const HOUR_LIMIT: usize = 200;
/// The token bucket's rate (and capacity), per second.
const RATE: usize = 100;
/// The one-second window's limit of the last test, and its safe capacity.
const SECOND_LIMIT: usize = 100;
const SAFE: usize = 20;
/// A one-second window's limit with no `safe_capacity`.
const BARE_LIMIT: usize = 100;

fn limits_yaml() -> String {
    format!(
        "domain: d\ndescriptors:\n\
         \x20 - key: hour\n    rate_limit: {{unit: hour, requests_per_unit: {HOUR_LIMIT}}}\n\
         \x20 - key: rate\n    rate_limit: {{unit: second, requests_per_unit: {RATE}, algorithm: token_bucket}}\n\
         \x20 - key: second\n    rate_limit: {{unit: second, requests_per_unit: {SECOND_LIMIT}, safe_capacity: {SAFE}}}\n\
         \x20 - key: bare\n    rate_limit: {{unit: second, requests_per_unit: {BARE_LIMIT}}}\n"
    )
}

fn body(key: &str, value: &str) -> String {
    format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    )
}

/// A lease cluster of two nodes, below `parent` when given.
struct Cluster {
    nodes: Vec<Node>,
    peers: String,
}

impl Cluster {
    /// Two nodes, below `parent` (its peers and this cluster's name) when given, with `extra`
    /// environment; with `proxied`, each node is named by another port, for a proxy to listen
    /// on.
    fn new(parent: Option<(&str, &str)>, proxied: bool, extra: &[(String, String)]) -> Cluster {
        let mut env = vec![
            ("SLUICE_CLUSTER_MODE".to_owned(), "lease".to_owned()),
            // A slow peer on a loaded machine is not a lost one (the tests kill what they
            // mean to lose); an owner waits half of it for its parent on a key new to it.
            ("SLUICE_PEER_TIMEOUT_MS".to_owned(), "2000".to_owned()),
        ];
        env.extend_from_slice(extra);
        if let Some((peers, name)) = parent {
            env.push(("SLUICE_LEASE_PARENT".to_owned(), peers.to_owned()));
            env.push(("SLUICE_LEASE_CLUSTER_NAME".to_owned(), name.to_owned()));
        }
        let mut nodes: Vec<Node> = (0..2).map(|_| Node::new(env.clone())).collect();
        for n in nodes.iter_mut().filter(|_| proxied) {
            n.advertised = Some(process::free_port());
        }
        let peers = Node::peers(&nodes);
        Cluster { nodes, peers }
    }

    fn start(&mut self, config: &std::path::Path) {
        for n in &mut self.nodes {
            n.start(&self.peers, config);
        }
        // Until each node has seen the other answer, two owners may serve one key.
        for (i, n) in self.nodes.iter().enumerate() {
            let other = &self.nodes[1 - i];
            let line = format!("sluice.cluster.peer_up.{}: 1", other.peer_address());
            wait_for(
                "the peers to see each other",
                Duration::from_secs(15),
                || http(n.debug, "GET", "/stats", "").is_some_and(|(_, b)| b.contains(&line)),
            );
        }
    }
}

/// A root cluster and two children below it, started on one config directory.
struct Tree {
    dir: tempfile::TempDir,
    root: Cluster,
    children: [Cluster; 2],
    /// With a delay: the proxy every call to a root node goes through.
    _proxy: Option<delay_proxy::Proxy>,
    /// With mutual TLS: the CA and the certificate every node presents.
    _pki: Option<pki::TestPki>,
}

impl Tree {
    fn start() -> Tree {
        Tree::delayed(None)
    }

    /// [`Tree::start`], every call to the root (its own nodes' included) delayed by `delay`
    /// each way, and with a delay every peer call over mutual TLS: one CA and one certificate
    /// for the whole tree, named for the peers.
    fn delayed(delay: Option<Duration>) -> Tree {
        const SAN: &str = "sluice-peers.test";
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("limits.yaml"), limits_yaml()).unwrap();
        let pki = delay.map(|_| pki::TestPki::new());
        let tls: Vec<(String, String)> = pki.as_ref().map_or(Vec::new(), |pki| {
            let leaf = pki.leaf("peers", &[SAN]);
            [
                ("SLUICE_PEER_TLS", "true".to_owned()),
                ("SLUICE_PEER_TLS_CERT", leaf.cert.display().to_string()),
                ("SLUICE_PEER_TLS_KEY", leaf.key.display().to_string()),
                ("SLUICE_PEER_TLS_CACERT", pki.ca.display().to_string()),
                ("SLUICE_PEER_TLS_SAN", SAN.to_owned()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
        });
        let mut root = Cluster::new(None, delay.is_some(), &tls);
        let proxy = delay.map(|d| {
            let at = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let listen = root
                .nodes
                .iter()
                .map(|n| at(n.advertised.unwrap()))
                .collect();
            let target = root.nodes.iter().map(|n| at(n.peer)).collect();
            // Every connection counts as from a third node, whose links to both are delayed.
            let proxy = delay_proxy::Proxy::start(listen, target, |_| Some(2));
            proxy.set_delay(0, 2, d);
            proxy.set_delay(1, 2, d);
            proxy
        });
        root.start(dir.path());
        let mut children = [
            Cluster::new(Some((&root.peers, "a")), false, &tls),
            Cluster::new(Some((&root.peers, "b")), false, &tls),
        ];
        for c in &mut children {
            c.start(dir.path());
        }
        Tree {
            dir,
            root,
            children,
            _proxy: proxy,
            _pki: pki,
        }
    }

    /// The HTTP ports of the child nodes: child 0's two, then child 1's.
    fn child_ports(&self) -> Vec<u16> {
        self.children
            .iter()
            .flat_map(|c| c.nodes.iter().map(|n| n.http))
            .collect()
    }
}

/// A request's (sent, answered).
type Span = (Instant, Instant);

/// One client thread per node (of `ports`, by index `on`), sending `body` one request at a
/// time (at most one per `pace`), recording when each admitted request was sent and answered,
/// and the longest any request took; each stops after `per_node` requests (if given), or when
/// told.
struct Load {
    stop: Arc<AtomicBool>,
    /// Per node (child 0's two, then child 1's): each admitted request's span.
    admitted: Vec<Arc<Mutex<Vec<Span>>>>,
    /// The longest a request took (µs).
    slowest_us: Arc<std::sync::atomic::AtomicU64>,
    threads: Vec<std::thread::JoinHandle<usize>>,
    /// An instant and the Unix time then, to place spans in windows.
    base: (Instant, SystemTime),
}

impl Load {
    fn start(
        ports: &[u16],
        on: &[usize],
        body: &str,
        per_node: Option<usize>,
        pace: Duration,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let slowest_us = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let admitted: Vec<Arc<Mutex<Vec<Span>>>> =
            (0..ports.len()).map(|_| Arc::default()).collect();
        let threads = on
            .iter()
            .map(|&i| {
                let (stop, admitted, slowest, port, body) = (
                    stop.clone(),
                    admitted[i].clone(),
                    slowest_us.clone(),
                    ports[i],
                    body.to_owned(),
                );
                std::thread::spawn(move || {
                    let mut answered = 0;
                    let start = Instant::now();
                    while !stop.load(Ordering::Relaxed) && per_node.is_none_or(|n| answered < n) {
                        let due = start + pace * u32::try_from(answered).unwrap_or(u32::MAX);
                        std::thread::sleep(due.saturating_duration_since(Instant::now()));
                        let sent = Instant::now();
                        let answer = http(port, "POST", "/json", &body);
                        let took = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                        slowest.fetch_max(took, Ordering::Relaxed);
                        match answer {
                            Some((200, _)) => admitted.lock().unwrap().push((sent, Instant::now())),
                            Some((429, _)) => {}
                            other => panic!("node on port {port} answered {other:?}"),
                        }
                        answered += 1;
                    }
                    answered
                })
            })
            .collect();
        Load {
            stop,
            admitted,
            slowest_us,
            threads,
            base: (Instant::now(), SystemTime::now()),
        }
    }

    /// The longest any request has taken so far.
    fn slowest(&self) -> Duration {
        Duration::from_micros(self.slowest_us.load(Ordering::Relaxed))
    }

    /// The Unix second `t` falls in.
    fn window_of(&self, t: Instant) -> u64 {
        let (i0, s0) = self.base;
        let at = if t >= i0 {
            s0 + (t - i0)
        } else {
            s0 - (i0 - t)
        };
        at.duration_since(UNIX_EPOCH).unwrap().as_secs()
    }

    /// Per one-second window (Unix seconds) wholly in `[from, to)`: the requests child
    /// `child`'s nodes admitted that were sent and answered within it (at most one a thread
    /// less than the window admitted: a request across its edge is in neither).
    fn per_window(&self, child: usize, from: Instant, to: Instant) -> Vec<(u64, usize)> {
        let first = self.window_of(from) + 1;
        let last = self.window_of(to);
        (first..last)
            .map(|w| {
                let n = self.admitted[child * 2..child * 2 + 2]
                    .iter()
                    .map(|a| {
                        let a = a.lock().unwrap();
                        a.iter()
                            .filter(|(s, e)| self.window_of(*s) == w && self.window_of(*e) == w)
                            .count()
                    })
                    .sum();
                (w, n)
            })
            .collect()
    }

    /// Stops the threads; the requests each answered.
    fn stop(self) -> (Vec<Vec<Span>>, Vec<usize>) {
        self.stop.store(true, Ordering::Relaxed);
        let answered = self
            .threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let admitted = self
            .admitted
            .iter()
            .map(|a| a.lock().unwrap().clone())
            .collect();
        (admitted, answered)
    }

    /// Requests child `child`'s nodes admitted in `[from, to)`.
    fn admitted_in(&self, child: usize, from: Instant, to: Instant) -> usize {
        self.admitted[child * 2..child * 2 + 2]
            .iter()
            .map(|a| {
                a.lock()
                    .unwrap()
                    .iter()
                    .filter(|(_, t)| *t >= from && *t < to)
                    .count()
            })
            .sum()
    }
}

#[test]
fn a_key_offered_twice_its_limit_in_each_child_admits_the_limit_across_both_and_no_more() {
    offered_twice_the_limit_in_each_child(&Tree::start(), "v1");
}

#[test]
fn with_the_root_60_ms_away_each_way_over_mutual_tls_the_limit_still_holds_across_both_children() {
    let tree = Tree::delayed(Some(Duration::from_millis(60)));
    offered_twice_the_limit_in_each_child(&tree, "v2");
}

/// Each child node offered the hour limit over four seconds (twice the limit in each child):
/// the limit admitted across both, no more and at least nine tenths of it; the root leases the
/// key to both clusters by name, and each child's owner shows the parent's grant.
fn offered_twice_the_limit_in_each_child(tree: &Tree, value: &str) {
    with_window_to_spare(3600, 60);
    // Two nodes a child: twice the limit in each child, over four seconds.
    let per_node = HOUR_LIMIT;
    let pace = Duration::from_secs(4) / u32::try_from(per_node).unwrap();
    let load = Load::start(
        &tree.child_ports(),
        &[0, 1, 2, 3],
        &body("hour", value),
        Some(per_node),
        pace,
    );
    while load.threads.iter().any(|t| !t.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (admitted, answered) = load.stop();
    assert_eq!(answered, vec![per_node; 4]);
    let per_child: Vec<usize> = admitted
        .chunks(2)
        .map(|c| c[0].len() + c[1].len())
        .collect();
    let total: usize = per_child.iter().sum();
    eprintln!("admitted per child {per_child:?}, total {total} of {HOUR_LIMIT}");
    assert!(
        total <= HOUR_LIMIT,
        "{total} admitted past the limit of {HOUR_LIMIT}"
    );
    assert!(
        total >= HOUR_LIMIT * 9 / 10,
        "only {total} of {HOUR_LIMIT} admitted"
    );
    // The root leases the key to the two clusters, by name; each child's owner shows its grant.
    let root_view = (0..2)
        .filter_map(|i| {
            http(
                tree.root.nodes[i].debug,
                "GET",
                &format!("/debug/lease?key=d_hour_{value}_"),
                "",
            )
        })
        .map(|(_, b)| b)
        .find(|b| b.contains(r#""node":"a""#))
        .expect("a root node leases the key to child a");
    assert!(root_view.contains(r#""node":"b""#), "{root_view}");
    let child_view = tree.children[0]
        .nodes
        .iter()
        .filter_map(|n| {
            http(
                n.debug,
                "GET",
                &format!("/debug/lease?key=d_hour_{value}_"),
                "",
            )
        })
        .map(|(_, b)| b)
        .find(|b| b.contains(r#""parent":{"#))
        .expect("child a's owner shows the parent's grant");
    assert!(child_view.contains(r#""source":"parent""#), "{child_view}");
}

#[test]
fn a_buckets_demand_moving_to_the_other_child_moves_its_share_within_two_seconds() {
    let tree = Tree::start();
    let body = body("rate", "v1");
    let began = Instant::now();
    let before = Load::start(&tree.child_ports(), &[0, 1], &body, None, Duration::ZERO);
    std::thread::sleep(Duration::from_secs(3));
    let moved = Instant::now();
    let after = Load::start(&tree.child_ports(), &[2, 3], &body, None, Duration::ZERO);
    std::thread::sleep(Duration::from_millis(300));
    let (admitted_before, _) = before.stop();
    std::thread::sleep(Duration::from_secs(4));
    // The first half second in which child b admits at least 80% of the rate.
    let half = Duration::from_millis(500);
    let full = (0..60)
        .map(|i| moved + Duration::from_millis(100 * i))
        .find(|&t| after.admitted_in(1, t, t + half) >= RATE * 8 / 10 / 2);
    let (admitted, _) = after.stop();
    let secs = began.elapsed().as_secs_f64();
    let took = full.map(|t| t - moved);
    let total: usize = admitted.iter().chain(&admitted_before).map(Vec::len).sum();
    eprintln!(
        "child b reached 80% of the rate {took:?} after the demand moved; {total} admitted in \
         {secs:.1} s across both"
    );
    // The rate over the whole run, and the bucket's capacity once: the children's shares
    // never sum past the whole.
    let bound = (RATE as f64 * (secs + 1.0)) as usize;
    assert!(
        total <= bound,
        "{total} admitted in {secs:.1} s, past {bound}"
    );
    let took = took.expect("child b never reached 80% of the rate");
    assert!(
        took <= Duration::from_secs(2),
        "the share took {took:?} to move"
    );
}

#[test]
fn the_root_lost_children_go_on_within_their_safe_capacity_then_recover() {
    let mut tree = Tree::start();
    let load = Load::start(
        &tree.child_ports(),
        &[0, 1, 2, 3],
        &body("second", "v1"),
        None,
        Duration::ZERO,
    );
    let began = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    // Two seconds with the root span at most three windows of the limit across both children.
    let now = Instant::now();
    let healthy = load.admitted_in(0, began, now) + load.admitted_in(1, began, now);
    eprintln!("{healthy} admitted in 2 s with the root (limit {SECOND_LIMIT}/s)");
    assert!(healthy <= SECOND_LIMIT * 3, "{healthy} admitted in 2 s");
    assert!(healthy >= SECOND_LIMIT, "only {healthy} admitted in 2 s");
    for n in &mut tree.root.nodes {
        n.kill();
    }
    // The last grants cover at most this window and the next one.
    std::thread::sleep(Duration::from_millis(2_500));
    let from = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let to = Instant::now();
    // Three seconds span at most four windows, each of at most the safe capacity per child.
    for child in 0..2 {
        let n = load.admitted_in(child, from, to);
        eprintln!("child {child} admitted {n} in 3 s without the root (safe capacity {SAFE}/s)");
        assert!(n > 0, "child {child} stopped admitting without its parent");
        assert!(
            n <= SAFE * 4,
            "child {child} admitted {n} in 3 s, past its safe capacity"
        );
    }
    // The key's owner in each child says so: `/stats` (and `/metrics`) carry the gauge.
    for child in &tree.children {
        let unreachable = child.nodes.iter().any(|n| {
            http(n.debug, "GET", "/stats", "")
                .is_some_and(|(_, b)| b.contains("sluice.cluster.lease.parent_unreachable: 1"))
        });
        assert!(
            unreachable,
            "no node of a child reports its parent unreachable"
        );
    }
    let back = Instant::now();
    tree.root.start(tree.dir.path());
    let mut recovered = None;
    while back.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(500));
        let now = Instant::now();
        let last = load.admitted_in(0, now - Duration::from_secs(1), now)
            + load.admitted_in(1, now - Duration::from_secs(1), now);
        if last >= SECOND_LIMIT * 8 / 10 {
            recovered = Some(back.elapsed());
            break;
        }
    }
    load.stop();
    eprintln!("recovered to 80% of the limit {recovered:?} after the root restarted");
    assert!(
        recovered.is_some(),
        "the children never recovered the limit"
    );
    for child in &tree.children {
        for n in &child.nodes {
            let (_, stats) = http(n.debug, "GET", "/stats", "").expect("stats");
            assert!(
                stats.contains("sluice.cluster.lease.parent_unreachable: 0"),
                "{stats}"
            );
        }
    }
}

/// Whether every node of `cluster` shows `line` on `/stats`.
fn all_stats_show(cluster: &Cluster, line: &str) -> bool {
    cluster
        .nodes
        .iter()
        .all(|n| http(n.debug, "GET", "/stats", "").is_some_and(|(_, b)| b.contains(line)))
}

#[test]
fn a_child_that_never_reached_its_root_admits_the_limit_over_the_expected_clusters_then_its_grants()
{
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.yaml"), limits_yaml()).unwrap();
    // The root's addresses take connections and never answer (nothing accepts them), as a
    // stale list of pod addresses may, until the root starts on them.
    let mut root = Cluster::new(None, false, &[]);
    let swallow: Vec<std::net::TcpListener> = root
        .nodes
        .iter()
        .map(|n| std::net::TcpListener::bind(("127.0.0.1", n.peer)).unwrap())
        .collect();
    // A call to the root's deadline: the longest a key's first request waits for it.
    let parent_timeout = Duration::from_millis(3000);
    let env = [(
        "SLUICE_LEASE_PARENT_TIMEOUT_MS".to_owned(),
        parent_timeout.as_millis().to_string(),
    )];
    // SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS left at its default, 2.
    let mut child = Cluster::new(Some((&root.peers, "a")), false, &env);
    for (i, n) in child.nodes.iter_mut().enumerate() {
        n.log = Some(logs.path().join(format!("child-{i}.log")));
    }
    child.start(dir.path());
    let ports: Vec<u16> = child.nodes.iter().map(|n| n.http).collect();
    let load = Load::start(&ports, &[0, 1], &body("bare", "v1"), None, Duration::ZERO);
    wait_for(
        "the child's nodes to find their root unreachable",
        Duration::from_secs(20),
        || {
            all_stats_show(&child, "sluice.cluster.lease.parent_unreachable: 1")
                && all_stats_show(&child, "sluice.cluster.lease.parent_never_reached: 1")
        },
    );
    admits_the_part_per_window(&load, parent_timeout);
    says_the_root_was_never_reached(&child, logs.path());
    drop(swallow);
    root.start(dir.path());
    takes_the_roots_grants(load, &child);
}

/// Without its root, child 0 of `load` admits the limit over 2 (the expected clusters) in each
/// full window, not 0 and not more; no request waited much past a call's deadline.
fn admits_the_part_per_window(load: &Load, parent_timeout: Duration) {
    std::thread::sleep(Duration::from_secs(1));
    let from = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    let windows = load.per_window(0, from, Instant::now());
    let part = BARE_LIMIT / 2;
    eprintln!(
        "never reached: admitted per window {windows:?} (limit {BARE_LIMIT}, part {part}); \
         slowest request {:?}",
        load.slowest()
    );
    assert!(windows.len() >= 3, "{windows:?}");
    for &(w, n) in &windows {
        assert!(n > 0, "window {w}: nothing admitted without the root");
        assert!(n <= part, "window {w}: {n} admitted, past the part {part}");
    }
    let total: usize = windows.iter().map(|w| w.1).sum();
    assert!(total >= part * windows.len() / 2, "{windows:?}");
    // A key's first request waited for the root at most a call's deadline (and the node's
    // call to its owner around it).
    let slowest = load.slowest();
    assert!(
        slowest < parent_timeout + Duration::from_millis(1500),
        "a request took {slowest:?}"
    );
}

/// Each node of `child` says its root was never reached: the status page, /metrics, and its
/// log in `logs`, once at the failure (the next comes a minute later).
fn says_the_root_was_never_reached(child: &Cluster, logs: &std::path::Path) {
    for (i, n) in child.nodes.iter().enumerate() {
        let (_, page) = http(n.debug, "GET", "/", "").expect("the status page");
        assert!(
            page.contains(
                "PARENT NEVER REACHED since start: deciding from safe capacity the limit / 2 \
                 (SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS) per window"
            ),
            "{page}"
        );
        let (_, metrics) = http(n.debug, "GET", "/metrics", "").expect("metrics");
        assert!(
            metrics.contains("\nsluice_cluster_lease_parent_unreachable 1\n")
                && metrics.contains("\nsluice_cluster_lease_parent_never_reached 1\n"),
            "{metrics}"
        );
        let log = std::fs::read_to_string(logs.join(format!("child-{i}.log"))).unwrap();
        let warnings = log.matches("the lease parent has never answered").count();
        assert_eq!(warnings, 1, "{log}");
    }
}

/// The root just started: child 0 of `load` reaches 80% of the limit in a window (more than
/// the part: only the root's grant allows that), then stays within the limit, and its nodes
/// say the root answers.
fn takes_the_roots_grants(load: Load, child: &Cluster) {
    let back = Instant::now();
    let mut converged = None;
    while back.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(500));
        let now = Instant::now();
        let last = load.per_window(0, now - Duration::from_secs(2), now);
        if last.last().is_some_and(|&(_, n)| n >= BARE_LIMIT * 8 / 10) {
            converged = Some(back.elapsed());
            break;
        }
    }
    eprintln!("the root started: 80% of the limit in a window {converged:?} after");
    assert!(
        converged.is_some(),
        "the child never took the root's grants"
    );
    let from = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let windows = load.per_window(0, from, Instant::now());
    load.stop();
    eprintln!("with the root: admitted per window {windows:?}");
    for &(w, n) in &windows {
        assert!(n <= BARE_LIMIT, "window {w}: {n} admitted past the limit");
    }
    assert!(all_stats_show(
        child,
        "sluice.cluster.lease.parent_unreachable: 0"
    ));
    assert!(all_stats_show(
        child,
        "sluice.cluster.lease.parent_never_reached: 0"
    ));
    let (_, page) = http(child.nodes[0].debug, "GET", "/", "").expect("the status page");
    assert!(page.contains("answering;"), "{page}");
}
