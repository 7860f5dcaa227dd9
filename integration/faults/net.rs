//! The fault tests' network: one Linux bridge, a network namespace per Sluice node (and one for
//! Redis when asked), and the faults the harness can put on it, all removed when [`Net`] is
//! dropped, also when a test panics.
//!
//! ```text
//!   root namespace                          node namespace i
//!   bridge sfb<s> 10.201.<s>.1  ── veth ──  10.201.<s>.<10+i>   peers (through the proxy) and Redis
//!   clients 10.202.<s>.<4i+1>  ── veth ──  10.202.<s>.<4i+2>   this node's clients only
//! ```
//!
//! Each node advertises `10.201.<s>.1:<7000+i>`, an address of the harness's delay proxy in the
//! root namespace (`proxy.rs`), so every peer call crosses the bridge twice and the proxy sees
//! which link it is on. Clients reach a node on its own point-to-point link, so cutting a node's
//! peer link leaves its clients talking to it, as the issue's clients inside the namespace did.
//!
//! Faults: a node's peer link down or up (`ip link`, the real thing: packets vanish, Redis's too);
//! cuts and packet loss on one peer link, or one direction of calls, with `iptables` in the node
//! namespaces (the kernel filters; matched by the proxy ports, since every peer packet is to or
//! from the bridge address); delay in the proxy (the kernel has no netem).
//!
//! Names carry a slot `s` (0 to 255, the bridge's creation is the lock) and the owning process
//! id, so parallel tests never collide and a run killed before its drop is swept by the next.

use std::process::{Command, Stdio};

use sluice_test_support::process::{missing, tool_available};

/// The first peer port: node `i`'s is `PEER_PORT_BASE + i`.
pub const PEER_PORT_BASE: u16 = 7000;
/// The ports every node listens on inside its namespace.
pub const HTTP_PORT: u16 = 8080;
pub const GRPC_PORT: u16 = 8081;
pub const DEBUG_PORT: u16 = 6070;
pub const REDIS_PORT: u16 = 6379;

/// One bridge and its namespaces, deleted on drop.
pub struct Net {
    pub slot: u8,
    pub nodes: usize,
    pub redis: bool,
    /// iptables rules in place, as (namespace index, rule arguments), to take out on heal.
    rules: std::sync::Mutex<Vec<(usize, Vec<String>)>>,
}

/// Whether this process may build namespaces: root, `ip` and `iptables`. Otherwise the test
/// fails or is a recorded skip, by the rule of [`missing`].
pub fn namespaces_available() -> bool {
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
            .unwrap_or(false)
    });
    if !root {
        return missing(
            "root",
            "the fault tests create network namespaces, veth pairs and a bridge: run them as \
             root (CI does)",
        );
    }
    tool_available("ip", "-V", "apt-get install iproute2")
        && tool_available(
            "iptables",
            "-V",
            "apt-get install iptables (scripts/test.sh does)",
        )
}

/// Runs `ip args`; panics with its stderr when it fails.
pub fn ip(args: &[&str]) {
    run("ip", args);
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

fn try_ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Net {
    /// A bridge with `nodes` node namespaces (and a Redis namespace with `redis`), every link up.
    pub fn new(nodes: usize, redis: bool) -> Net {
        assert!((1..=60).contains(&nodes), "1 to 60 nodes");
        sweep_stale();
        // Each test of a binary starts its search elsewhere: a slot just given back may still
        // have links the kernel is removing.
        static TAKEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let start = std::process::id() as usize
            + 101 * TAKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let slot = (0..256)
            .map(|i| ((start + i * 37) % 256) as u8)
            .find(|s| try_ip(&["link", "add", &bridge(*s), "type", "bridge"]))
            .expect("no free bridge slot (sfb0 to sfb255 all exist)");
        let net = Net {
            slot,
            nodes,
            redis,
            rules: Default::default(),
        };
        ip(&[
            "addr",
            "add",
            &format!("{}/24", net.root_ip()),
            "dev",
            &bridge(slot),
        ]);
        ip(&["link", "set", &bridge(slot), "up"]);
        for i in 0..nodes {
            net.add_namespace(i, &net.node_ip(i));
            net.add_client_link(i);
        }
        if redis {
            net.add_namespace(REDIS, &net.redis_ip());
        }
        net
    }

    /// The bridge's address in the root namespace, where the proxy listens.
    pub fn root_ip(&self) -> String {
        format!("10.201.{}.1", self.slot)
    }

    pub fn node_ip(&self, i: usize) -> String {
        format!("10.201.{}.{}", self.slot, 10 + i)
    }

    pub fn redis_ip(&self) -> String {
        format!("10.201.{}.5", self.slot)
    }

    /// Node `i`'s address on its clients' link.
    pub fn client_ip(&self, i: usize) -> String {
        format!("10.202.{}.{}", self.slot, 4 * i + 2)
    }

    /// Node `i`'s peer address as every node names it (the proxy's port for it).
    pub fn peer_addr(&self, i: usize) -> String {
        format!("{}:{}", self.root_ip(), peer_port(i))
    }

    /// The namespace of node `i` ([`REDIS`] for Redis's).
    pub fn namespace(&self, i: usize) -> String {
        let who = if i == REDIS {
            "redis".to_owned()
        } else {
            format!("n{i}")
        };
        format!("{NS_PREFIX}{}-{}-{who}", std::process::id(), self.slot)
    }

    fn add_namespace(&self, i: usize, addr: &str) {
        let ns = self.namespace(i);
        ip(&["netns", "add", &ns]);
        let (outside, inside) = (self.peer_link(i), format!("sf{}q{}", self.slot, tag(i)));
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", &inside, "netns", &ns,
        ]);
        ip(&["link", "set", &outside, "master", &bridge(self.slot)]);
        ip(&["link", "set", &outside, "up"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            &inside,
        ]);
        ip(&["-n", &ns, "link", "set", &inside, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
    }

    fn add_client_link(&self, i: usize) {
        let ns = self.namespace(i);
        let (outside, inside) = (
            format!("sf{}c{i}", self.slot),
            format!("sf{}d{i}", self.slot),
        );
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", &inside, "netns", &ns,
        ]);
        let root = format!("10.202.{}.{}/30", self.slot, 4 * i + 1);
        ip(&["addr", "add", &root, "dev", &outside]);
        ip(&["link", "set", &outside, "up"]);
        let node = format!("{}/30", self.client_ip(i));
        ip(&["-n", &ns, "addr", "add", &node, "dev", &inside]);
        ip(&["-n", &ns, "link", "set", &inside, "up"]);
    }

    /// The root side of node `i`'s (or Redis's) veth on the bridge.
    fn peer_link(&self, i: usize) -> String {
        format!("sf{}p{}", self.slot, tag(i))
    }

    /// Takes node `i`'s (or Redis's) bridge link down (`up` false) or up again.
    pub fn set_link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["link", "set", &self.peer_link(i), state]);
    }

    /// Drops node `from`'s calls to node `to` (their packets both ways, with probability
    /// `percent`); a link's cut or loss is this both ways.
    pub fn drop_calls(&self, from: usize, to: usize, percent: u32) {
        for rule in call_rules(&self.root_ip(), to, percent) {
            self.iptables(from, "-A", &rule);
            self.rules.lock().unwrap().push((from, rule));
        }
    }

    /// Takes out every rule [`Net::drop_calls`] put in.
    pub fn heal_calls(&self) {
        let rules = std::mem::take(&mut *self.rules.lock().unwrap());
        for (ns, rule) in rules {
            self.iptables(ns, "-D", &rule);
        }
    }

    fn iptables(&self, i: usize, op: &str, rule: &[String]) {
        let ns = self.namespace(i);
        let mut args = vec!["netns", "exec", &ns, "iptables", "-w", op];
        args.extend(rule.iter().map(String::as_str));
        ip(&args);
    }

    /// A command run inside node `i`'s (or Redis's) namespace.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.namespace(i), program]);
        c
    }
}

/// The iptables rules (chain and match) that drop calls to node `to` from the namespace they
/// are put in: its requests out, and the answers in.
fn call_rules(root: &str, to: usize, percent: u32) -> Vec<Vec<String>> {
    let port = peer_port(to).to_string();
    let chance: Vec<String> = if percent >= 100 {
        Vec::new()
    } else {
        let p = format!("{:.4}", f64::from(percent) / 100.0);
        ["-m", "statistic", "--mode", "random", "--probability", &p]
            .map(str::to_owned)
            .to_vec()
    };
    let rule = |chain: &str, addr: &str, port_flag: &str| {
        let mut r: Vec<String> = [chain, addr, root, "-p", "tcp", port_flag, &port]
            .map(str::to_owned)
            .to_vec();
        r.extend(chance.iter().cloned());
        r.extend(["-j", "DROP"].map(str::to_owned));
        r
    };
    vec![
        rule("OUTPUT", "-d", "--dport"),
        rule("INPUT", "-s", "--sport"),
    ]
}

/// Node `i`'s peer port, on the proxy and inside its namespace.
pub fn peer_port(i: usize) -> u16 {
    PEER_PORT_BASE + u16::try_from(i).expect("few nodes")
}

/// Stands for Redis's namespace where a node index is expected.
pub const REDIS: usize = usize::MAX;

const NS_PREFIX: &str = "sluice-faults-";

fn bridge(slot: u8) -> String {
    format!("sfb{slot}")
}

fn tag(i: usize) -> String {
    if i == REDIS {
        "r".to_owned()
    } else {
        i.to_string()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let mut names: Vec<String> = (0..self.nodes).map(|i| self.namespace(i)).collect();
        if self.redis {
            names.push(self.namespace(REDIS));
        }
        // The veths first, at once (a namespace's own are removed later, by the kernel).
        for i in (0..self.nodes).chain(self.redis.then_some(REDIS)) {
            try_ip(&["link", "del", &self.peer_link(i)]);
            if i != REDIS {
                try_ip(&["link", "del", &format!("sf{}c{i}", self.slot)]);
            }
        }
        for ns in names {
            delete_namespace(&ns);
        }
        try_ip(&["link", "del", &bridge(self.slot)]);
    }
}

/// Kills what still runs in `ns` and deletes it (its veths go with it).
fn delete_namespace(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
    try_ip(&["netns", "del", ns]);
}

/// Removes the namespaces and bridges of fault-test processes that are gone (killed before
/// their drop ran).
fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let mut parts = rest.split('-');
        let (Some(pid), Some(slot)) = (parts.next(), parts.next()) else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        delete_namespace(name);
        if let Ok(slot) = slot.parse::<u8>() {
            try_ip(&["link", "del", &bridge(slot)]);
        }
    }
}
