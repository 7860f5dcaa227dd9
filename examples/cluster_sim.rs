//! A deterministic simulation of a Sluice peer cluster past what one machine can run: 3 to 50
//! nodes, skewed keys, a node failing, coming back and a new node joining, on a simulated
//! clock with simulated network latency. Used by `docs/cluster.md`.
//!
//! ```sh
//! cargo run --release --example cluster_sim              # the full run (docs/cluster.md)
//! cargo run --release --example cluster_sim -- --quick   # a shorter run, same shape
//! cargo run --release --example cluster_sim -- --seed 7  # another seed
//! ```
//!
//! Sluice's own pure pieces do the deciding: [`Ring`] and [`key_hash`] pick owners (among the
//! nodes a given node believes up) and [`fixed_window::decide`] is every counter's state
//! machine, one state word per (node, key). Everything else, the network, failure detection,
//! probes, DNS re-resolution and the clients, is modelled here after `src/cluster/mod.rs`:
//!
//! - **forward** (Sluice's default): a non-owner forwards to the owner (one extra hop, after up
//!   to one batch window). A forward to a dead owner fails after SLUICE_PEER_TIMEOUT_MS; only
//!   then does that node (and only that node) mark it down, and every forward it sent the dead
//!   owner meanwhile is retried once on the next owner by its ring. A node brings a peer back at
//!   its next probe (every 500 ms) after the peer answers again. Counters are memory only, so a
//!   new owner starts a key from its own count (0 for a restarted node).
//! - **durable**: forward with SLUICE_PEER_WRITE_BEHIND (`src/cluster/durable.rs`), at 500 ms
//!   (the default) and 100 ms: every interval each node writes the counters it changed to a simulated Redis (raise-only, and it
//!   takes back a larger count Redis holds); a node with no count for a key's current window
//!   loads it first (one Redis round trip) if it saw a change this window (its own start, a
//!   peer marked down) or the key's owner among all peers it knows is another node.
//! - **divided** (Cortex's global limiter): every node enforces `ceil(limit / live peers)`
//!   locally, where live peers is its own view, kept by the same probes (which in this mode also
//!   mark peers down); no hops.
//! - **local**: every node counts alone with the whole limit, as N independent
//!   envoyproxy/ratelimit instances with in-memory counters would.
//!
//! Traffic: Poisson arrivals over 10,000 keys with Zipf(1.1) popularity; limits of 10, 100 or
//! 1,000 per second by key rank, so a few dozen hot keys are over their limit. Each key has
//! several clients (more for hotter keys). Two spreads over the nodes: `pinned`, each client
//! keeps one long-lived gRPC connection to one node (as Envoy does behind a Kubernetes Service:
//! connections are balanced, requests are not), and `per-request`, each request goes to a random
//! node (an L7 balancer). Clients only ever reach nodes that are running.
//!
//! Membership script (times as fractions of the run): at 0.3 the owner of the hottest key dies;
//! at 0.55 it restarts with empty memory; at 0.75 a new node starts and every node discovers it
//! through PEERS_DNS within 5 s (each at its own re-resolution tick), while an even share of the
//! clients open their connections to it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use sluice::cluster::ring::{Ring, key_hash};
use sluice::limiter::Unit;
use sluice::limiter::fixed_window;

/// SLUICE_PEER_TIMEOUT_MS (default 200).
const PEER_TIMEOUT_US: u64 = 200_000;
/// SLUICE_PEER_BATCH_WINDOW_US (default 200): a forward waits up to this long to share a call.
const BATCH_WINDOW_US: u64 = 200;
/// One-way network latency between two nodes, drawn per hop.
const HOP_US: (u64, u64) = (200, 500);
const PROBE_EVERY_US: u64 = 500_000;
const DNS_EVERY_US: u64 = 5_000_000;
const KEYS: usize = 10_000;
const ZIPF_S: f64 = 1.1;
/// Requests per second over the whole cluster.
const RATE: f64 = 20_000.0;
/// Seconds since the epoch at the start, so window tags look like real ones.
const EPOCH_SECS: u64 = 1_700_000_000;
const NODE_COUNTS: [usize; 5] = [3, 5, 10, 20, 50];
/// A Redis round trip, for a take-over load.
const REDIS_US: (u64, u64) = (200, 500);

/// SplitMix64: small, seedable and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi].
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Forward,
    /// With SLUICE_PEER_WRITE_BEHIND_MS of this many milliseconds.
    Durable(u64),
    Divided,
    Local,
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Forward => "forward".into(),
            Mode::Durable(ms) => format!("durable {ms} ms"),
            Mode::Divided => "divided".into(),
            Mode::Local => "local".into(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Spread {
    Pinned,
    PerRequest,
}

impl Spread {
    fn name(self) -> &'static str {
        match self {
            Spread::Pinned => "pinned clients",
            Spread::PerRequest => "per-request spread",
        }
    }
}

/// The keys: popularity, limit, hash and clients, shared by every run.
struct Workload {
    cdf: Vec<f64>,
    limits: Vec<u32>,
    hashes: Vec<u64>,
    clients: Vec<usize>,
}

impl Workload {
    fn new() -> Self {
        let weights: Vec<f64> = (1..=KEYS).map(|r| (r as f64).powf(-ZIPF_S)).collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        let limits = (0..KEYS).map(|r| [10, 100, 1000][r % 3]).collect();
        let hashes = (0..KEYS)
            .map(|r| key_hash(&format!("api_key_client{r}_")))
            .collect();
        // One client per 25 requests/s of the key's expected rate, 1 to 16.
        let clients = weights
            .iter()
            .map(|w| ((RATE * w / total / 25.0).ceil() as usize).clamp(1, 16))
            .collect();
        Workload {
            cdf,
            limits,
            hashes,
            clients,
        }
    }

    fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(KEYS - 1)
    }
}

#[derive(Clone, Copy)]
enum Event {
    Arrive,
    /// A forward from `from` reaches `owner`.
    Deliver {
        owner: u16,
        from: u16,
        key: u32,
        retry: bool,
        sent: u64,
    },
    /// `from`'s forward to `dead` timed out: mark it down and retry on the next owner.
    Retry {
        from: u16,
        dead: u16,
        key: u32,
        sent: u64,
    },
    Probe {
        node: u16,
    },
    /// `node` learns a view change about `peer`.
    View {
        node: u16,
        peer: u16,
        up: bool,
    },
    Fail {
        node: u16,
    },
    Restart {
        node: u16,
    },
    Join {
        node: u16,
    },
    /// Durable mode: `node` writes its changed counters behind.
    Flush {
        node: u16,
    },
}

#[derive(Default)]
struct Outcome {
    /// admitted / limit for every (key, window) offered more than its limit.
    ratios: Vec<f64>,
    decisions: u64,
    hops: u64,
    failed_hops: u64,
    errors: u64,
    added_latency_us: u64,
    /// Durable mode: take-over loads and counters written behind.
    loads: u64,
    writes: u64,
}

struct Sim<'a> {
    w: &'a Workload,
    mode: Mode,
    spread: Spread,
    ring: Ring,
    /// Members at the start; the node at index `initial` joins later.
    initial: usize,
    alive: Vec<bool>,
    /// `view[a][p]`: node `a` believes `p` is up (and knows it).
    view: Vec<Vec<bool>>,
    /// `failing[a][p]`: the time `a`'s first forward to dead `p` times out, while pending.
    failing: Vec<Vec<u64>>,
    pins: Vec<Vec<u16>>,
    counters: HashMap<u64, u64>,
    /// (key, window) -> (offered, admitted).
    windows: HashMap<(u32, u64), (u32, u32)>,
    /// Durable mode: the simulated Redis, (key, window) -> count.
    redis: HashMap<(u32, u64), u64>,
    /// Durable mode: per node, the keys changed since its last flush.
    dirty: Vec<HashSet<u32>>,
    /// Durable mode: per node, when it last saw a change that can move keys to it.
    changed: Vec<u64>,
    queue: BinaryHeap<Reverse<(u64, u64, EventSlot)>>,
    seq: u64,
    rng: Rng,
    out: Outcome,
}

/// An event made orderable for the heap (ties broken by sequence number).
#[derive(Clone, Copy)]
struct EventSlot(Event);

impl PartialEq for EventSlot {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for EventSlot {}
impl PartialOrd for EventSlot {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for EventSlot {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl<'a> Sim<'a> {
    fn new(w: &'a Workload, mode: Mode, spread: Spread, nodes: usize, seed: u64) -> Self {
        let total = nodes + 1;
        let ring = Ring::new((0..total).map(addr));
        // Durable modes share forward's stream, so they meet the same traffic.
        let mode_id = match mode {
            Mode::Forward | Mode::Durable(_) => 0,
            Mode::Divided => 1,
            Mode::Local => 2,
        };
        let mut rng = Rng(seed ^ (nodes as u64) << 32 ^ mode_id ^ (spread as u64) << 8);
        let alive: Vec<bool> = (0..total).map(|i| i < nodes).collect();
        let view = (0..total)
            .map(|a| (0..total).map(|p| p < nodes || p == a).collect())
            .collect();
        let pins = w
            .clients
            .iter()
            .map(|&c| (0..c).map(|_| rng.below(nodes) as u16).collect())
            .collect();
        Sim {
            w,
            mode,
            spread,
            ring,
            initial: nodes,
            alive,
            view,
            failing: vec![vec![0; total]; total],
            pins,
            counters: HashMap::new(),
            windows: HashMap::new(),
            redis: HashMap::new(),
            dirty: vec![HashSet::new(); total],
            changed: vec![0; total],
            queue: BinaryHeap::new(),
            seq: 0,
            rng,
            out: Outcome::default(),
        }
    }

    fn push(&mut self, at: u64, e: Event) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, EventSlot(e))));
    }

    fn owner(&self, from: usize, key: usize) -> usize {
        let view = &self.view[from];
        self.ring
            .owner(self.w.hashes[key], |i| view[i])
            .expect("a node always believes itself up")
    }

    /// Applies one hit for `key` on `node`'s counter at `now`, for a request that arrived at
    /// `sent` and whose answer takes `back` more to return.
    fn decide(&mut self, node: usize, key: usize, now: u64, sent: u64, back: u64) {
        let limit = self.w.limits[key];
        let limit = match self.mode {
            Mode::Forward | Mode::Durable(_) | Mode::Local => limit,
            Mode::Divided => {
                let live = self.view[node].iter().filter(|&&up| up).count() as u32;
                limit.div_ceil(live.max(1))
            }
        };
        let secs = EPOCH_SECS + now / 1_000_000;
        let mut back = back;
        if matches!(self.mode, Mode::Durable(_)) {
            back += self.take_over(node, key, secs);
            self.dirty[node].insert(key as u32);
        }
        let slot = self.counters.entry(counter_id(node, key)).or_default();
        let (d, state) = fixed_window::decide(*slot, secs, Unit::Second, limit, 1);
        *slot = state;
        let w = self.windows.entry((key as u32, secs)).or_default();
        w.0 += 1;
        w.1 += u32::from(!d.over);
        self.out.decisions += 1;
        self.out.added_latency_us += now - sent + back;
    }

    /// Durable mode: loads `key`'s count from Redis before `node` decides, when `node` has no
    /// count for this window and saw a change this window or stands in for another owner.
    /// Returns the time the load adds.
    fn take_over(&mut self, node: usize, key: usize, secs: u64) -> u64 {
        let id = counter_id(node, key);
        let held = self
            .counters
            .get(&id)
            .map_or(0, |s| fixed_window::current_count(*s, secs, Unit::Second));
        let window_start = (secs - EPOCH_SECS) * 1_000_000;
        let elsewhere = self.ring.owner(self.w.hashes[key], |i| self.known(node, i)) != Some(node);
        if held > 0 || (self.changed[node] < window_start && !elsewhere) {
            return 0;
        }
        self.out.loads += 1;
        if let Some(&count) = self.redis.get(&(key as u32, secs)) {
            self.counters.insert(
                id,
                fixed_window::state_with_count(count, secs, Unit::Second),
            );
        }
        self.rng.range(REDIS_US.0, REDIS_US.1)
    }

    /// Durable mode: `node` writes its changed counters (raise-only) and takes back larger ones.
    fn flush(&mut self, node: usize, now: u64) {
        let secs = EPOCH_SECS + now / 1_000_000;
        let keys: Vec<u32> = self.dirty[node].drain().collect();
        for key in keys {
            let id = counter_id(node, key as usize);
            let held = self
                .counters
                .get(&id)
                .map_or(0, |s| fixed_window::current_count(*s, secs, Unit::Second));
            if held == 0 {
                continue;
            }
            self.out.writes += 1;
            let stored = self.redis.entry((key, secs)).or_default();
            if held > *stored {
                *stored = held;
            } else if *stored > held {
                self.counters.insert(
                    id,
                    fixed_window::state_with_count(*stored, secs, Unit::Second),
                );
            }
        }
        // Keys expire with their window.
        self.redis.retain(|&(_, w), _| w >= secs);
    }

    /// The node a request for `key` lands on, given the clients' spread.
    fn entry_node(&mut self, key: usize) -> usize {
        match self.spread {
            Spread::Pinned => {
                let c = self.rng.below(self.pins[key].len());
                usize::from(self.pins[key][c])
            }
            Spread::PerRequest => loop {
                let n = self.rng.below(self.alive.len());
                if self.alive[n] {
                    return n;
                }
            },
        }
    }

    fn hop(&mut self) -> u64 {
        self.rng.range(0, BATCH_WINDOW_US) + self.rng.range(HOP_US.0, HOP_US.1)
    }

    /// Routes a request at `from`; `retry` is the second (last) round.
    fn route(&mut self, from: usize, key: usize, now: u64, sent: u64, retry: bool) {
        if !matches!(self.mode, Mode::Forward | Mode::Durable(_)) {
            self.decide(from, key, now, sent, 0);
            return;
        }
        let owner = self.owner(from, key);
        if owner == from {
            self.decide(from, key, now, sent, 0);
            return;
        }
        self.out.hops += 1;
        if !self.alive[owner] || self.failing[from][owner] > now {
            self.fail(from, owner, key, now, sent, retry);
            return;
        }
        let at = now + self.hop();
        self.push(
            at,
            Event::Deliver {
                owner: owner as u16,
                from: from as u16,
                key: key as u32,
                retry,
                sent,
            },
        );
    }

    /// A forward from `from` to `dead` that will time out.
    fn fail(&mut self, from: usize, dead: usize, key: usize, now: u64, sent: u64, retry: bool) {
        self.out.failed_hops += 1;
        if retry {
            // Both rounds failed: the request gets the failure policy's answer.
            self.out.errors += 1;
            return;
        }
        if self.failing[from][dead] <= now {
            self.failing[from][dead] = now + PEER_TIMEOUT_US;
        }
        let at = self.failing[from][dead];
        self.push(
            at,
            Event::Retry {
                from: from as u16,
                dead: dead as u16,
                key: key as u32,
                sent,
            },
        );
    }

    fn run(mut self, secs: u64) -> Outcome {
        let end = secs * 1_000_000;
        let frac = |f: f64| (end as f64 * f) as u64;
        let victim = self.owner(0, 0) as u16;
        self.push(frac(0.3) + 437_000, Event::Fail { node: victim });
        self.push(frac(0.55) + 291_000, Event::Restart { node: victim });
        self.push(
            frac(0.75) + 613_000,
            Event::Join {
                node: self.initial as u16,
            },
        );
        for n in 0..self.initial {
            let phase = self.rng.range(0, PROBE_EVERY_US - 1);
            self.push(phase, Event::Probe { node: n as u16 });
        }
        if let Mode::Durable(ms) = self.mode {
            for n in 0..=self.initial {
                let phase = self.rng.range(0, ms * 1000 - 1);
                self.push(phase, Event::Flush { node: n as u16 });
            }
        }
        let mut next_arrival = 0u64;
        loop {
            let queued = self.queue.peek().map(|Reverse((t, _, _))| *t);
            let (now, event) = match queued {
                Some(t) if t <= next_arrival => {
                    let Reverse((t, _, EventSlot(e))) = self.queue.pop().unwrap();
                    (t, e)
                }
                _ => {
                    let t = next_arrival;
                    let gap = -(1.0 - self.rng.unit()).ln() / RATE * 1e6;
                    next_arrival += gap.max(1.0) as u64;
                    (t, Event::Arrive)
                }
            };
            if now >= end {
                break;
            }
            self.handle(now, event);
        }
        self.finish(end)
    }

    #[expect(
        clippy::too_many_lines,
        reason = "a one-off report's steps, read top to bottom"
    )]
    fn handle(&mut self, now: u64, event: Event) {
        match event {
            Event::Arrive => {
                let key = self.w.sample(&mut self.rng);
                let node = self.entry_node(key);
                self.route(node, key, now, now, false);
            }
            Event::Deliver {
                owner,
                from,
                key,
                retry,
                sent,
            } => {
                let (owner, from, key) = (usize::from(owner), usize::from(from), key as usize);
                if self.alive[owner] {
                    let back = self.rng.range(HOP_US.0, HOP_US.1);
                    self.decide(owner, key, now, sent, back);
                } else {
                    // It died while the call was in flight: the call times out.
                    self.fail(from, owner, key, now, sent, retry);
                }
            }
            Event::Retry {
                from,
                dead,
                key,
                sent,
            } => {
                let (from, dead) = (usize::from(from), usize::from(dead));
                if !self.alive[from] {
                    return;
                }
                if std::mem::replace(&mut self.view[from][dead], false) {
                    self.changed[from] = now;
                }
                self.route(from, key as usize, now, sent, true);
            }
            Event::Probe { node } => {
                let a = usize::from(node);
                self.push(now + PROBE_EVERY_US, Event::Probe { node });
                if !self.alive[a] {
                    return;
                }
                for p in 0..self.alive.len() {
                    if p == a || !self.known(a, p) {
                        continue;
                    }
                    if self.alive[p] && !self.view[a][p] {
                        let back = now + 2 * self.rng.range(HOP_US.0, HOP_US.1);
                        self.push(
                            back,
                            Event::View {
                                node,
                                peer: p as u16,
                                up: true,
                            },
                        );
                    } else if !self.alive[p] && self.view[a][p] && self.mode == Mode::Divided {
                        // In forward mode only a failed forward marks a peer down.
                        self.push(
                            now + PEER_TIMEOUT_US,
                            Event::View {
                                node,
                                peer: p as u16,
                                up: false,
                            },
                        );
                    }
                }
            }
            Event::Flush { node } => {
                let every = match self.mode {
                    Mode::Durable(ms) => ms * 1000,
                    _ => return,
                };
                self.push(now + every, Event::Flush { node });
                if self.alive[usize::from(node)] {
                    self.flush(usize::from(node), now);
                }
            }
            Event::View { node, peer, up } => {
                let (a, p) = (usize::from(node), usize::from(peer));
                // A probe's answer only counts if the peer is still in that state.
                if self.alive[a] && self.alive[p] == up {
                    self.view[a][p] = up;
                    if up {
                        self.failing[a][p] = 0;
                    }
                }
            }
            Event::Fail { node } => {
                let n = usize::from(node);
                self.alive[n] = false;
                self.counters.retain(|id, _| (id >> 32) as usize != n);
                self.dirty[n].clear();
                // Its clients reconnect to running nodes.
                self.repin(|pin, _| usize::from(pin) == n, None);
            }
            Event::Restart { node } => {
                let n = usize::from(node);
                self.alive[n] = true;
                self.changed[n] = now;
                // A fresh process believes every peer it knows of is up.
                for p in 0..self.alive.len() {
                    self.view[n][p] = self.known(n, p) || p == n;
                    self.failing[n][p] = 0;
                }
            }
            Event::Join { node } => {
                let n = usize::from(node);
                self.alive[n] = true;
                self.changed[n] = now;
                self.view[n] = vec![true; self.alive.len()];
                for a in 0..self.initial {
                    let at = now + self.rng.range(0, DNS_EVERY_US);
                    self.push(
                        at,
                        Event::View {
                            node: a as u16,
                            peer: node,
                            up: true,
                        },
                    );
                }
                let share = 1.0 / self.alive.iter().filter(|&&x| x).count() as f64;
                self.repin(|_, rng| rng.unit() < share, Some(node));
                self.push(now + PROBE_EVERY_US, Event::Probe { node });
            }
        }
    }

    /// Whether `a` knows `p` is a member (the joining node only once its DNS is re-resolved).
    fn known(&self, a: usize, p: usize) -> bool {
        p < self.initial || self.view[a][p] || a == p
    }

    /// Moves the clients for which `pred` holds to `to`, or else to a random running node.
    fn repin(&mut self, pred: impl Fn(u16, &mut Rng) -> bool, to: Option<u16>) {
        let running: Vec<u16> = (0..self.alive.len())
            .filter(|&i| self.alive[i])
            .map(|i| i as u16)
            .collect();
        for pins in &mut self.pins {
            for p in pins.iter_mut() {
                if pred(*p, &mut self.rng) {
                    *p = to.unwrap_or_else(|| running[self.rng.below(running.len())]);
                }
            }
        }
    }

    fn finish(mut self, end: u64) -> Outcome {
        let last = EPOCH_SECS + end / 1_000_000;
        for (&(key, secs), &(offered, admitted)) in &self.windows {
            let limit = self.w.limits[key as usize];
            if secs < last && offered > limit {
                self.out.ratios.push(f64::from(admitted) / f64::from(limit));
            }
        }
        self.out.ratios.sort_by(f64::total_cmp);
        self.out
    }
}

fn addr(i: usize) -> String {
    format!("10.1.{}.{}:8082", i / 256, i % 256)
}

fn counter_id(node: usize, key: usize) -> u64 {
    ((node as u64) << 32) | key as u64
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Fraction of keys whose owner changes when one node leaves (averaged over which one) and
/// when one joins, and keys that moved between two nodes that did not change (always 0).
fn keys_moved(hashes: &[u64], n: usize) -> (f64, f64, f64, usize) {
    let ring = Ring::new((0..=n).map(addr));
    let all = |i: usize| i < n;
    let before: Vec<usize> = hashes
        .iter()
        .map(|&h| ring.owner(h, all).unwrap())
        .collect();
    let mut leave_moved = 0usize;
    let mut stray = 0usize;
    let mut max_owned = 0usize;
    for gone in 0..n {
        let owned = before.iter().filter(|&&o| o == gone).count();
        max_owned = max_owned.max(owned);
        for (&h, &o) in hashes.iter().zip(&before) {
            let after = ring.owner(h, |i| i < n && i != gone).unwrap();
            if after != o {
                leave_moved += 1;
                stray += usize::from(o != gone);
            }
        }
    }
    let join_moved = hashes
        .iter()
        .zip(&before)
        .filter(|&(&h, &o)| {
            let after = ring.owner(h, |_| true).unwrap();
            stray += usize::from(after != o && after != n);
            after != o
        })
        .count();
    let keys = hashes.len() as f64;
    (
        leave_moved as f64 / (keys * n as f64),
        join_moved as f64 / keys,
        max_owned as f64 / keys,
        stray,
    )
}

#[expect(
    clippy::too_many_lines,
    reason = "a one-off report's steps, read top to bottom"
)]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let seed = args
        .iter()
        .position(|a| a == "--seed")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse::<u64>().expect("--seed takes an integer"))
        .unwrap_or(42);
    let secs = if quick { 12 } else { 40 };
    let w = Workload::new();
    let hot = w
        .cdf
        .iter()
        .scan(0.0, |prev, &c| {
            let p = c - *prev;
            *prev = c;
            Some(p)
        })
        .zip(&w.limits)
        .filter(|&(p, &l)| p * RATE > f64::from(l))
        .count();
    println!(
        "cluster_sim: seed {seed}, {secs} s simulated, {RATE} requests/s, {KEYS} keys \
         (Zipf {ZIPF_S}; {hot} keys over their limit on average), limits 10/100/1000 per second, \
         hop {}-{} us + batch window up to {BATCH_WINDOW_US} us, peer timeout {} ms{}",
        HOP_US.0,
        HOP_US.1,
        PEER_TIMEOUT_US / 1000,
        if quick { " (--quick)" } else { "" }
    );
    for spread in [Spread::Pinned, Spread::PerRequest] {
        println!("\n### {}\n", spread.name());
        println!(
            "| mode | nodes | over-limit windows | admitted/limit p5 | p50 | mean | max | \
             hops/decision | failed hops/decision | unanswered | added latency mean | \
             Redis loads/decision | Redis writes/s |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for mode in [
            Mode::Forward,
            Mode::Durable(500),
            Mode::Durable(100),
            Mode::Divided,
            Mode::Local,
        ] {
            for n in NODE_COUNTS {
                let o = Sim::new(&w, mode, spread, n, seed).run(secs);
                let mean = o.ratios.iter().sum::<f64>() / o.ratios.len() as f64;
                let per = |x: u64| x as f64 / o.decisions.max(1) as f64;
                println!(
                    "| {} | {n} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.5} | {} | {:.0} us | {:.5} | {:.0} |",
                    mode.name(),
                    o.ratios.len(),
                    percentile(&o.ratios, 0.05),
                    percentile(&o.ratios, 0.5),
                    mean,
                    o.ratios.last().copied().unwrap_or(f64::NAN),
                    per(o.hops),
                    per(o.failed_hops),
                    o.errors,
                    per(o.added_latency_us),
                    per(o.loads),
                    o.writes as f64 / secs as f64,
                );
            }
        }
    }
    println!("\n### Keys moved per membership change (forward mode's ring, {KEYS} keys)\n");
    println!(
        "| nodes | one leaves: moved | ideal 1/N | one joins: moved | ideal 1/(N+1) | \
         largest owner's share | moved between unchanged nodes |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for n in NODE_COUNTS {
        let (leave, join, max_share, stray) = keys_moved(&w.hashes, n);
        println!(
            "| {n} | {leave:.4} | {:.4} | {join:.4} | {:.4} | {max_share:.4} | {stray} |",
            1.0 / n as f64,
            1.0 / (n + 1) as f64
        );
    }
}
