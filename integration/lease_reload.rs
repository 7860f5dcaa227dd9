//! A limit changed by a reload while three real `sluice` processes hold leases on it (issue 48,
//! docs/cluster.md "A limit changed while nodes hold leases"). Each node has its own config
//! directory, as pods of a Deployment each get the ConfigMap on their own schedule; a few keys
//! of 100 per 10 s are offered about three times that, spread over the nodes, and the nodes
//! take a new limit one after another, 1.5 s apart within one window (the file rewritten,
//! SIGHUP): halved, then two windows later doubled back. Every window admits at most the
//! larger of the limits its nodes had, and at most the new one once every node has it; a window
//! after the rollout uses the new limit. The same in forward mode, where one counter per key
//! always held it.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes; Sluice's code reads time through crate::clock"
)]

mod node;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_test_support::http::http;
use sluice_test_support::process::wait_for;

use node::Node;

/// The window: epoch-aligned, the same on every node.
const WINDOW_S: u64 = 10;
/// The limit before the rollouts, per key and window.
const LIMIT: u64 = 100;
/// Keys offered at once, each its own counter (and, as a rule, its own owner).
const KEYS: usize = 3;
/// One client thread per node and key sends a request this often: each key is offered
/// 3 x 10 a second, three times [`LIMIT`] per window.
const PACE: Duration = Duration::from_millis(100);
/// When the nodes take a new limit, from the start of the rollout's window (s): 1.5 s apart.
const RELOADS: [f64; 3] = [2.0, 3.5, 5.0];

/// The limits file every node starts with, and the one it is reloaded with.
fn limits_yaml(limit: u64) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, unit_multiplier: {WINDOW_S}, requests_per_unit: {limit}}}\n"
    )
}

fn body(key: usize) -> String {
    format!(r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"v{key}"}}]}}]}}"#)
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// Three peers in `mode`, each reading its own config directory, polled once a minute so only
/// SIGHUP reloads them within the test.
struct Reloading {
    dirs: Vec<tempfile::TempDir>,
    nodes: Vec<Node>,
}

impl Reloading {
    fn start(mode: &str) -> Reloading {
        let env: Vec<(String, String)> = [
            ("SLUICE_CLUSTER_MODE", mode),
            ("SLUICE_CONFIG_POLL_MS", "60000"),
            // A slow peer on a loaded machine is not a lost one (cluster.rs's lease tests).
            ("SLUICE_PEER_TIMEOUT_MS", "2000"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut nodes: Vec<Node> = (0..3).map(|_| Node::new(env.clone())).collect();
        let peers = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.peer))
            .collect::<Vec<_>>()
            .join(",");
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        for (n, dir) in nodes.iter_mut().zip(&dirs) {
            std::fs::write(dir.path().join("limits.yaml"), limits_yaml(LIMIT)).unwrap();
            n.start(&peers, dir.path());
        }
        let r = Reloading { dirs, nodes };
        r.wait_up();
        r
    }

    /// Until every node has seen the two others answer (else two could own one key).
    fn wait_up(&self) {
        for (i, node) in self.nodes.iter().enumerate() {
            for (j, other) in self.nodes.iter().enumerate().filter(|(j, _)| *j != i) {
                let line = format!("sluice.cluster.peer_up.127.0.0.1:{}: 1", other.peer);
                wait_for(
                    &format!("node {i} to see node {j} up"),
                    Duration::from_secs(15),
                    || {
                        http(node.debug, "GET", "/stats", "")
                            .is_some_and(|(_, b)| b.contains(&line))
                    },
                );
            }
        }
    }

    /// Node `i` takes `limit`: its file rewritten (a new file renamed over the old, as a
    /// ConfigMap's swap is atomic) and SIGHUP.
    fn reload(&self, i: usize, limit: u64) {
        let dir = self.dirs[i].path();
        let staged = dir.join(".limits.yaml.new");
        std::fs::write(&staged, limits_yaml(limit)).unwrap();
        std::fs::rename(&staged, dir.join("limits.yaml")).unwrap();
        let pid = self.nodes[i].child.as_ref().expect("running").id();
        let sent = std::process::Command::new("kill")
            .arg("-HUP")
            .arg(pid.to_string())
            .status();
        assert!(sent.unwrap().success(), "kill -HUP {pid}");
    }
}

/// One request: its key, when it was sent and answered (s since the epoch), and whether it
/// was admitted.
type Answer = (usize, f64, f64, bool);

/// Sends `body(key)` to `port` every [`PACE`] until `until`; every answer.
fn offer(port: u16, key: usize, until: Instant, seen: Arc<Mutex<Vec<Answer>>>) {
    let body = body(key);
    let mut next = Instant::now();
    while next < until {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let sent = now_s();
        let status = match http(port, "POST", "/json", &body) {
            Some((status @ (200 | 429), _)) => status,
            other => panic!("port {port}: {other:?}"),
        };
        seen.lock()
            .unwrap()
            .push((key, sent, now_s(), status == 200));
        next += PACE;
    }
}

/// What each key's windows admitted, and the hits offered in them: (key, window) to
/// (admitted at most, admitted at least, offered at least). An answer whose request and reply
/// fall in two windows counts in both as admitted at most, in neither as at least.
fn per_window(answers: &[Answer]) -> HashMap<(usize, u64), (u64, u64, u64)> {
    let mut windows: HashMap<(usize, u64), (u64, u64, u64)> = HashMap::new();
    for &(key, sent, answered, admitted) in answers {
        let (from, to) = (sent as u64 / WINDOW_S, answered as u64 / WINDOW_S);
        for w in from..=to {
            let e = windows.entry((key, w)).or_default();
            e.0 += u64::from(admitted);
            if from == to {
                e.1 += u64::from(admitted);
                e.2 += 1;
            }
        }
    }
    windows
}

/// The rollouts in `mode`: windows 0 and 2 to 4 after the load starts at 100, 50, 50 (halved
/// in window 1), 100 (doubled in window 3). Asserts every window within the larger limit of
/// its nodes, within the new one once every node has it, and (a window after a rollout) using
/// it. Returns each window's counts, per key.
fn rollouts(mode: &str) -> Vec<Vec<u64>> {
    let r = Reloading::start(mode);
    // Past a lease duration since the ring formed (a new owner's rebuild cap), then from a
    // window's start.
    std::thread::sleep(Duration::from_millis(1500));
    let first = (now_s() as u64 / WINDOW_S + 1) * WINDOW_S;
    std::thread::sleep(Duration::from_secs_f64(first as f64 - now_s()));
    let windows = 5u64;
    let until = Instant::now() + Duration::from_secs(windows * WINDOW_S);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..3)
        .flat_map(|i| (0..KEYS).map(move |k| (i, k)))
        .map(|(i, k)| {
            let (port, seen) = (r.nodes[i].http, seen.clone());
            std::thread::spawn(move || offer(port, k, until, seen))
        })
        .collect();
    for (window, limit) in [(1, LIMIT / 2), (3, LIMIT)] {
        for (i, at) in RELOADS.iter().enumerate() {
            let when = (first + window * WINDOW_S) as f64 + at;
            std::thread::sleep(Duration::from_secs_f64((when - now_s()).max(0.0)));
            r.reload(i, limit);
        }
    }
    for t in threads {
        t.join().expect("client thread");
    }
    let counts = per_window(&seen.lock().unwrap());
    let count = |key: usize, w: u64| {
        counts
            .get(&(key, first / WINDOW_S + w))
            .copied()
            .unwrap_or_default()
    };
    let admitted: Vec<Vec<u64>> = (0..KEYS)
        .map(|key| (0..windows).map(|w| count(key, w).0).collect())
        .collect();
    eprintln!(
        "{mode}: admitted per key and window (limits 100, 100 then 50, 50, 50 then 100, 100): {admitted:?}"
    );
    // The larger limit of each window's nodes, and whether every node had it all along.
    let bounds = [LIMIT, LIMIT, LIMIT / 2, LIMIT, LIMIT];
    let settled = [false, false, true, false, true];
    for key in 0..KEYS {
        for w in 0..windows {
            let (most, least, offered) = count(key, w);
            let bound = bounds[w as usize];
            assert!(
                most <= bound,
                "{mode}: key {key}, window {w}: {most} admitted, at most {bound}"
            );
            // A window after a rollout, offered well over its limit, uses it.
            if settled[w as usize] && offered >= bound * 3 / 2 {
                assert!(
                    least * 10 >= bound * 9,
                    "{mode}: key {key}, window {w}: {least} admitted of {bound}, {offered} offered"
                );
            }
        }
    }
    admitted
}

/// Before issue 48's fix each ask naming the other limit started the key again at its owner,
/// and a node taking the new limit forgot what it had used: the rollout's window admitted well
/// over the larger limit.
#[test]
fn lease_mode_keeps_a_window_within_the_larger_limit_while_nodes_reload_seconds_apart() {
    let admitted = rollouts("lease");
    // The owner holds a window to the smallest limit its asks named: a doubled limit is used
    // from the window after the rollout's.
    for (key, windows) in admitted.iter().enumerate() {
        assert!(
            windows[3] <= LIMIT / 2,
            "key {key}: {} admitted while the limit was doubled",
            windows[3]
        );
    }
}

#[test]
fn forward_mode_keeps_a_window_within_the_larger_limit_while_nodes_reload_seconds_apart() {
    rollouts("forward");
}
