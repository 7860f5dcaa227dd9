//! A deterministic simulation of a Sluice peer cluster past what one machine can run: 3 to 50
//! nodes, skewed keys, a node failing, coming back and a new node joining, on a simulated
//! clock with simulated network latency. Used by `docs/cluster.md` ("Simulation").
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin cluster_sim              # the full run (docs/cluster.md)
//! cargo run --release -p sluice-bench --bin cluster_sim -- --quick   # a shorter run, same shape
//! cargo run --release -p sluice-bench --bin cluster_sim -- --seed 7  # another seed
//! cargo run --release -p sluice-bench --bin cluster_sim -- --only sweep   # one section (`report::run`)
//! cargo run --release -p sluice-bench --bin cluster_sim -- --only burst   # lease mode under bursts ([`burst`])
//! cargo run --release -p sluice-bench --bin cluster_sim -- --only regions # one limit across regions ([`regions`])
//! cargo run --release -p sluice-bench --bin cluster_sim -- --only keys    # 10^4 against 10^6 keys (issue 49)
//! cargo run --release -p sluice-bench --bin cluster_sim -- --only keys --free-share-percent 0  # every key leased
//! cargo run --release -p sluice-bench --bin cluster_sim -- --only one --mode lease --nodes 50 --worst
//! ```
//!
//! **Sluice's own code** does the deciding: [`Ring`] and [`key_hash`] pick owners (among the
//! nodes a given node believes up), [`fixed_window::decide`] is every counter's state machine
//! (one state word per (node, key)), [`divided_node_limit`] is divided mode's part of a limit,
//! [`Joining`] decides a starting node's relays, and lease mode runs Sluice's own lease client,
//! server, free shares and parent link logic (`sluice::cluster::lease`).
//!
//! **A model**, written here after `src/cluster/` (`members.rs`, `route/forward.rs`,
//! `route/leased/driver.rs`, `owner.rs`), is everything asynchronous around them: the network
//! (a hop's latency, a batch's wait), failure detection (a call's timeout, a peer marked down,
//! probes), DNS re-resolution, the clients and the order in which the routes make their calls
//! (`cluster::route` is async code over real connections, which a discrete-event simulation
//! with a simulated clock cannot run). Where the model and the code part, the code is right;
//! `integration/cluster.rs`, `integration/faults/` and `integration/regions.rs` run the real
//! processes:
//!
//! - **forward** (Sluice's default): a non-owner forwards to the owner (one extra hop, after up
//!   to one batch window). A forward to a dead owner fails after SLUICE_PEER_TIMEOUT_MS; only
//!   then does that node (and only that node) mark it down, and every forward it sent the dead
//!   owner meanwhile is retried once on the next owner by its ring. A node brings a peer back at
//!   its next probe (every 500 ms) after the peer answers again. Counters are memory only, so a
//!   new owner starts a key from its own count, except that a node that starts (the restart,
//!   the join) relays the hits of the keys it owns to their previous owner until its join
//!   settles and then takes their counters over (`sluice::cluster::join`, whose `Joining`
//!   decides here too).
//! - **durable**: forward with SLUICE_PEER_WRITE_BEHIND (`src/cluster/durable.rs`), at 500 ms
//!   (the default) and 100 ms: every interval each node writes the counters it changed to a
//!   simulated Redis (raise-only, and it takes back a larger count Redis holds); a node with no
//!   count for a key's current window loads it first (one Redis round trip) if it saw a change
//!   this window (its own start, a peer marked down) or the key's owner among all peers it
//!   knows is another node.
//! - **divided** (Cortex's global limiter): every node enforces `ceil(limit / live peers)`
//!   locally, where live peers is its own view, kept by the same probes (which in this mode also
//!   mark peers down); no hops.
//! - **local**: every node counts alone with the whole limit, as N independent
//!   envoyproxy/ratelimit instances with in-memory counters would.
//! - **lease** (SLUICE_CLUSTER_MODE=lease): [`lease`], Sluice's `LeaseClient` and `LeaseServer`
//!   on every node, driven as `src/cluster/route/leased/driver.rs` drives them, free shares included
//!   (SLUICE_LEASE_FREE_SHARE_PERCENT=50, `--free-share-percent N` for another; 0 leases every
//!   key, as before issue 49's step 2; the regions section's clusters keep 0).
//! - **global**: gubernator's GLOBAL behaviour ([`global`]), for comparison.
//!
//! Traffic: Poisson arrivals over 10,000 keys (`--only keys`: 10^6 too) with Zipf(1.1) popularity; limits of 10, 100 or
//! 1,000 per second by key rank (or 600, 6,000 and 60,000 per minute), so a few dozen hot keys
//! are over their limit. Each key has several clients (more for hotter keys). Two spreads over
//! the nodes: `pinned`, each client keeps one long-lived gRPC connection to one node (as Envoy
//! does behind a Kubernetes Service: connections are balanced, requests are not), and
//! `per-request`, each request goes to a random node (an L7 balancer). Clients only ever reach
//! nodes that are running. Every mode meets the same arrivals (one random stream for the
//! traffic, another for the network).
//!
//! Membership script (times as fractions of the run): at 0.3 the owner of the hottest key dies;
//! at 0.55 it restarts with empty memory; at 0.75 a new node starts and every node discovers it
//! through PEERS_DNS within 5 s (each at its own re-resolution tick), while an even share of the
//! clients open their connections to it.

// The program's other files, beside this `main.rs`.
mod burst;
mod global;
mod lease;
mod regions;
mod report;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use sluice::clock::Timestamp;
use sluice::cluster::divided_node_limit;
use sluice::cluster::join::{Joining, Relay};
use sluice::cluster::ring::{Ring, key_hash};
use sluice::limiter::fixed_window;
use sluice::limiter::{Quota, Unit, Window};
use sluice_test_support::bench::rng::SplitMix64 as Rng;

/// SLUICE_PEER_TIMEOUT_MS (default 200).
const PEER_TIMEOUT_US: u64 = 200_000;
/// SLUICE_PEER_BATCH_WINDOW_US (default 200): how long a call in flight gathers the forwards
/// behind it. The model keeps the older batcher's wait, up to one window per forward; the
/// batcher now sends a forward at once unless a call to its peer is in flight (docs/cluster.md).
const BATCH_WINDOW_US: u64 = 200;
/// One-way network latency between two nodes, drawn per hop.
const HOP_US: (u64, u64) = (200, 500);
const PROBE_EVERY_US: u64 = 500_000;
const DNS_EVERY_US: u64 = 5_000_000;
const KEYS: usize = 10_000;
const ZIPF_S: f64 = 1.1;
/// Requests per second over the whole cluster, unless a table says otherwise.
const RATE: f64 = 20_000.0;
/// Seconds since the epoch at the start, a whole minute, so window tags look like real ones.
const EPOCH_SECS: u64 = 1_699_999_980;
const EPOCH_US: u64 = EPOCH_SECS * 1_000_000;
const NODE_COUNTS: [usize; 5] = [3, 5, 10, 20, 50];
/// A Redis round trip, for a take-over load.
const REDIS_US: (u64, u64) = (200, 500);
/// Windows starting within this long after a membership event are counted in its phase.
const PHASE_US: u64 = 3_000_000;
/// The first seconds of a run, while every key is new to every node.
const COLD_US: u64 = 2_000_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Forward,
    /// With SLUICE_PEER_WRITE_BEHIND_MS of this many milliseconds.
    Durable(u64),
    Divided,
    Local,
    Lease,
    Global,
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Forward => "forward".into(),
            Mode::Durable(ms) => format!("durable {ms} ms"),
            Mode::Divided => "divided".into(),
            Mode::Local => "local".into(),
            Mode::Lease => "**lease**".into(),
            Mode::Global => "global (gubernator)".into(),
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

/// One run's settings.
#[derive(Clone, Copy)]
struct Params {
    mode: Mode,
    spread: Spread,
    nodes: usize,
    /// Simulated seconds.
    secs: u64,
    seed: u64,
    /// Lease mode: SLUICE_LEASE_RENEW_MS and SLUICE_LEASE_DURATION_MS, in microseconds.
    renew_us: u64,
    lease_us: u64,
    /// Lease mode: SLUICE_LEASE_MAX_BYTES, each of a node's two tables.
    lease_max_bytes: usize,
    /// Lease mode: SLUICE_LEASE_FREE_SHARE_PERCENT, in parts per million (0: off, every key
    /// leased, as before issue 49's step 2).
    free_share_ppm: u64,
    /// Lease mode: changes to the lease logic under study ([`Variant`]), as bits.
    variants: u8,
    /// Print every whole window admitting more than 1.05 times its limit (to stderr).
    worst: bool,
}

/// Changes to lease mode's glue studied with the simulation (`docs/cluster.md`,
/// "Simulation"); changes to the lease logic itself are studied by patching it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    /// E: a node's own start counts as a ring change until every peer can have found it
    /// through PEERS_DNS (5 s later), so it caps the keys it serves for that long plus a lease
    /// duration.
    StartRebuild = 1,
    /// J: a joining (or restarting) lease server serves the keys it owns whose window began
    /// before its join settled through their previous owner, as forward mode relays them
    /// (`cluster::join`), and rebuilds the first window it serves itself.
    JoinRelay = 2,
}

impl Params {
    fn new(mode: Mode, spread: Spread, nodes: usize, secs: u64, seed: u64) -> Self {
        Params {
            mode,
            spread,
            nodes,
            secs,
            seed,
            renew_us: 100_000,
            lease_us: 1_000_000,
            lease_max_bytes: sluice::cluster::lease::LeaseTiming::DEFAULT.max_bytes,
            free_share_ppm: sluice::cluster::lease::LeaseTiming::DEFAULT.free_share_ppm,
            variants: 0,
            worst: false,
        }
    }

    fn has(&self, v: Variant) -> bool {
        self.variants & v as u8 != 0
    }
}

/// The keys: popularity, limit, hash, name and clients, shared by every run at one rate and
/// one unit.
struct Workload {
    rate: f64,
    unit: Unit,
    cdf: Vec<f64>,
    limits: Vec<u32>,
    hashes: Vec<u64>,
    names: Vec<String>,
    clients: Vec<usize>,
}

impl Workload {
    fn new(rate: f64, unit: Unit) -> Self {
        Self::zipf(KEYS, ZIPF_S, rate, unit)
    }

    /// `keys` keys with Zipf(`s`) popularity (the main tables: [`KEYS`], [`ZIPF_S`]).
    fn zipf(keys: usize, s: f64, rate: f64, unit: Unit) -> Self {
        let weights: Vec<f64> = (1..=keys).map(|r| (r as f64).powf(-s)).collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        let per = unit.secs() as u32;
        let limits = (0..keys).map(|r| [10, 100, 1000][r % 3] * per).collect();
        let names: Vec<String> = (0..keys).map(|r| format!("api_key_client{r}_")).collect();
        let hashes = names.iter().map(|n| key_hash(n)).collect();
        // One client per 25 requests/s of the key's expected rate, 1 to 16.
        let clients = weights
            .iter()
            .map(|w| ((rate * w / total / 25.0).ceil() as usize).clamp(1, 16))
            .collect();
        Workload {
            rate,
            unit,
            cdf,
            limits,
            hashes,
            names,
            clients,
        }
    }

    /// `keys` keys of one limit, for scheduled arrivals (no traffic of their own).
    fn uniform(keys: usize, limit: u32, unit: Unit) -> Self {
        let names: Vec<String> = (0..keys).map(|r| format!("api_key_client{r}_")).collect();
        Workload {
            rate: 0.0,
            unit,
            cdf: vec![1.0; keys],
            limits: vec![limit; keys],
            hashes: names.iter().map(|n| key_hash(n)).collect(),
            names,
            clients: vec![1; keys],
        }
    }

    fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }

    fn quota(&self, key: usize) -> Quota {
        Quota::fixed(self.limits[key], self.unit)
    }

    /// The key a name stands for.
    fn index(name: &str) -> usize {
        name.strip_prefix("api_key_client")
            .and_then(|r| r.strip_suffix('_'))
            .and_then(|r| r.parse().ok())
            .expect("a key name of the workload")
    }

    /// How many keys are offered more than their limit, on average.
    fn hot(&self) -> usize {
        let unit = self.unit.secs() as f64;
        self.cdf
            .iter()
            .scan(0.0, |prev, &c| {
                let p = c - *prev;
                *prev = c;
                Some(p)
            })
            .zip(&self.limits)
            .filter(|&(p, &l)| p * self.rate * unit > f64::from(l))
            .count()
    }
}

#[derive(Clone, Copy)]
enum Event {
    Arrive,
    /// A scheduled request for `key` at `node` (the burst workloads).
    Hit {
        node: u16,
        key: u32,
    },
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
    /// `node` learns a view change about `peer`: a probe's answer, or (`dns`) the peer's
    /// address in a re-resolution of PEERS_DNS.
    View {
        node: u16,
        peer: u16,
        up: bool,
        dns: bool,
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
    /// Lease and global modes: a peer call reaches its target, its answer reaches its sender,
    /// or its sender gives up on it.
    CallArrives {
        id: u32,
    },
    CallAnswered {
        id: u32,
    },
    CallFailed {
        id: u32,
    },
    /// A node's periodic task, for the node's `life` (incarnation) that started it.
    Tick {
        node: u16,
        life: u32,
        task: Task,
    },
}

/// The periodic tasks of lease and global modes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Task {
    /// Lease mode: one renewal round.
    Renew,
    /// Lease mode: the lease server's sweep.
    Sweep,
    /// Global mode: the hits queued for their owners (GlobalSyncWait).
    SendHits,
    /// Global mode: the owner's broadcast of its keys' new totals.
    Broadcast,
}

/// A peer call of lease or global mode, while it is out.
struct Call {
    from: u16,
    to: u16,
    /// The sender's incarnation: an answer to a node that restarted since is dropped.
    life: u32,
    sent: u64,
    payload: Payload,
}

enum Payload {
    Lease(lease::LeaseCall),
    /// Global mode: hits per key, for their owner.
    Hits(Vec<(u32, u32)>),
    /// Global mode: an owner's totals, (key, window, remaining).
    Globals(std::rc::Rc<[(u32, u64, u32)]>),
}

/// Phases of a run, for the windows and decisions made in them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Cold,
    Steady,
    Failure,
    Restart,
    Join,
}

impl Phase {
    const ALL: [Phase; 5] = [
        Phase::Cold,
        Phase::Steady,
        Phase::Failure,
        Phase::Restart,
        Phase::Join,
    ];

    fn name(self) -> &'static str {
        match self {
            Phase::Cold => "cold start (first 2 s)",
            Phase::Steady => "steady",
            Phase::Failure => "owner dies (3 s from it)",
            Phase::Restart => "owner restarts empty (3 s)",
            Phase::Join => "node joins (until all know + 3 s)",
        }
    }
}

/// When the membership script's events happen, for the phases.
#[derive(Clone, Copy)]
struct Script {
    fail: u64,
    restart: u64,
    join: u64,
}

impl Script {
    fn new(end: u64) -> Self {
        let frac = |f: f64| (end as f64 * f) as u64;
        Script {
            fail: frac(0.3) + 437_000,
            restart: frac(0.55) + 291_000,
            join: frac(0.75) + 613_000,
        }
    }

    /// The phase of the span [from, to) (simulated µs): the first event it overlaps.
    fn phase(&self, from: u64, to: u64) -> Phase {
        let overlaps = |at: u64, len: u64| from < at + len && to > at;
        if from < COLD_US {
            Phase::Cold
        } else if overlaps(self.fail, PHASE_US) {
            Phase::Failure
        } else if overlaps(self.restart, PHASE_US) {
            Phase::Restart
        } else if overlaps(self.join, DNS_EVERY_US + PHASE_US) {
            Phase::Join
        } else {
            Phase::Steady
        }
    }
}

/// What one run measured.
#[derive(Default)]
struct Outcome {
    /// admitted / limit for every whole (key, window) offered at least twice its limit, sorted,
    /// and the same by phase (in `Phase::ALL`'s order).
    ratios: Vec<f64>,
    phase_ratios: [Vec<f64>; 5],
    decisions: u64,
    hops: u64,
    phase_decisions: [u64; 5],
    phase_hops: [u64; 5],
    failed_hops: u64,
    errors: u64,
    added_latency_us: u64,
    /// Calls between peers (forwards counted per batch; probes not counted).
    peer_calls: u64,
    /// Of which calls off the request path: lease renewals, gubernator's hits and broadcasts.
    background_calls: u64,
    /// Seconds of running node, summed over nodes.
    node_secs: f64,
    /// Durable mode: take-over loads and counters written behind.
    loads: u64,
    writes: u64,
    /// Lease mode: acquires sent holding nothing of the key's window, and holding some (all
    /// used), in the steady phase; and acquired hits admitted.
    acquires_cold: u64,
    acquires_more: u64,
    /// Lease mode: acquires in whole steady windows offered less than their limit, and at
    /// least their limit.
    steady_acquires: [u64; 2],
    acquired_admitted: u64,
    /// Lease mode: keys carried by renewal rounds (asks, whatever the calls), and the keys
    /// each node held at its renewal ticks (sum over ticks, ticks, the most at one).
    renewed_keys: u64,
    held_sum: u64,
    held_ticks: u64,
    held_max: u64,
    /// Whole steady windows (of any offered load) that admitted more than their limit.
    steady_over: u64,
    /// Lease mode: hits decided from free shares (no lease, no call), and recalls received.
    free_decisions: u64,
    recalls: u64,
    /// Steady-phase windows' admitted / limit by limit (10, 100, 1000 per unit).
    class_ratios: [Vec<f64>; 3],
}

struct Sim<'a> {
    w: &'a Workload,
    p: Params,
    ring: Ring,
    /// Members at the start; the node at index `initial` joins later.
    initial: usize,
    alive: Vec<bool>,
    /// Each node's incarnation: bumped when it fails, so its pending tasks and answers lapse.
    life: Vec<u32>,
    /// When each running node started running, for `Outcome::node_secs`.
    since: Vec<Option<u64>>,
    /// `view[a][p]`: node `a` believes `p` is up (and knows it).
    view: Vec<Vec<bool>>,
    /// `failing[a][p]`: the time `a`'s first forward to dead `p` times out, while pending.
    failing: Vec<Vec<u64>>,
    /// `batch_until[a][p]`: the end of the batch window of `a`'s latest forward call to `p`.
    batch_until: Vec<Vec<u64>>,
    pins: Vec<Vec<u16>>,
    counters: HashMap<u64, u64>,
    /// (key, window) -> (offered, admitted, acquires sent).
    windows: HashMap<(u32, u64), (u32, u32, u32)>,
    /// Durable mode: the simulated Redis, (key, window) -> count.
    redis: HashMap<(u32, u64), u64>,
    /// Durable mode: per node, the keys changed since its last flush.
    dirty: Vec<HashSet<u32>>,
    /// Durable mode: per node, when it last saw a change that can move keys to it.
    changed: Vec<u64>,
    /// Per node, as `RingChanges` keeps it: ring changes seen since its start, and when the
    /// last one was (µs since the Unix epoch).
    ring_changes: Vec<(u64, u64)>,
    /// Forward and durable modes: each node's join, as `cluster::join` keeps it (PEERS_DNS:
    /// settled `join::DNS_SETTLE` after it starts, its address listed at once).
    joins: Vec<Joining>,
    lease: Option<lease::Leases>,
    global: Option<global::Globals>,
    calls: HashMap<u32, Call>,
    next_call: u32,
    script: Script,
    owner_at_start: usize,
    queue: BinaryHeap<Reverse<(u64, u64, EventSlot)>>,
    seq: u64,
    /// Arrivals, keys, entry nodes and clients: the same for every mode.
    traffic: Rng,
    /// Latencies, phases and everything else.
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
    fn new(w: &'a Workload, p: Params) -> Self {
        let nodes = p.nodes;
        let total = nodes + 1;
        let ring = Ring::new((0..total).map(addr));
        let mut traffic = Rng(p.seed ^ (nodes as u64) << 32 ^ (p.spread as u64) << 8);
        let rng = Rng(traffic.0 ^ 0x5eed_f4e7);
        let alive: Vec<bool> = (0..total).map(|i| i < nodes).collect();
        let view = (0..total)
            .map(|a| (0..total).map(|p| p < nodes || p == a).collect())
            .collect();
        let pins = w
            .clients
            .iter()
            .map(|&c| (0..c).map(|_| traffic.below(nodes) as u16).collect())
            .collect();
        let end = p.secs * 1_000_000;
        Sim {
            w,
            p,
            ring,
            initial: nodes,
            since: alive.iter().map(|&a| a.then_some(0)).collect(),
            alive,
            life: vec![0; total],
            view,
            failing: vec![vec![0; total]; total],
            batch_until: vec![vec![0; total]; total],
            pins,
            counters: HashMap::new(),
            windows: HashMap::new(),
            redis: HashMap::new(),
            dirty: vec![HashSet::new(); total],
            changed: vec![0; total],
            // The nodes started a minute before the traffic: a cluster starting under traffic
            // is a ring change for every key (see the failure phases for what one costs).
            ring_changes: vec![(0, EPOCH_US - 60_000_000); total],
            joins: (0..total)
                .map(|_| Joining::listed_at_start(Timestamp::from_micros(EPOCH_US - 60_000_000)))
                .collect(),
            lease: (p.mode == Mode::Lease).then(|| lease::Leases::new(&p, total)),
            global: (p.mode == Mode::Global).then(|| global::Globals::new(total)),
            calls: HashMap::new(),
            next_call: 0,
            script: Script::new(end),
            owner_at_start: 0,
            queue: BinaryHeap::new(),
            seq: 0,
            traffic,
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

    /// How many nodes `node` believes up, itself included (`Members::live`).
    fn live(&self, node: usize) -> usize {
        self.view[node].iter().filter(|&&up| up).count()
    }

    /// The window containing `now` (simulated µs), as an index since the epoch.
    fn window_of(&self, now: u64) -> u64 {
        (EPOCH_SECS + now / 1_000_000) / self.w.unit.secs()
    }

    fn phase_at(&self, now: u64) -> usize {
        let p = self.script.phase(now, now + 1);
        Phase::ALL.iter().position(|&q| q == p).unwrap_or(0)
    }

    /// Counts one decision about `key`, made with the window of `at`, and the time the
    /// cluster added to it.
    fn record(&mut self, key: usize, at: u64, admitted: bool, latency: u64) {
        self.record_in(key, self.window_of(at), at, admitted, latency);
    }

    /// Counts one decision about `key` in `window`, made at `at`.
    fn record_in(&mut self, key: usize, window: u64, at: u64, admitted: bool, latency: u64) {
        let w = self.windows.entry((key as u32, window)).or_default();
        w.0 += 1;
        w.1 += u32::from(admitted);
        self.out.decisions += 1;
        self.out.phase_decisions[self.phase_at(at)] += 1;
        self.out.added_latency_us += latency;
    }

    /// Counts one extra network hop on a decision's path at `now`.
    fn hop_taken(&mut self, now: u64) {
        self.out.hops += 1;
        self.out.phase_hops[self.phase_at(now)] += 1;
    }

    /// `node` notes a ring change at `now` (`RingChanges::record`).
    fn record_change(&mut self, node: usize, now: u64) {
        let c = &mut self.ring_changes[node];
        c.0 += 1;
        c.1 = c.1.max(EPOCH_US + now);
    }

    /// `node` marks `peer` down after a failed call at `now`.
    fn mark_down(&mut self, node: usize, peer: usize, now: u64) {
        if std::mem::replace(&mut self.view[node][peer], false) {
            self.changed[node] = now;
            self.record_change(node, now);
        }
    }

    /// Applies one hit for `key` on `node`'s counter at `now`, for a request that arrived at
    /// `sent` and whose answer takes `back` more to return.
    fn decide(&mut self, node: usize, key: usize, now: u64, sent: u64, back: u64) {
        match self.relay_to(node, key, now) {
            // Before its join settled: the previous owner counts the hit (one more round trip).
            Some((prev, Relay::Apply)) => {
                self.hop_taken(now);
                let rtt = 2 * self.one_way();
                self.decide_here(prev, key, now, sent, back + rtt);
            }
            // After: it hands its count over, once, and this node counts on from it.
            Some((prev, _)) => {
                self.hop_taken(now);
                let rtt = 2 * self.one_way();
                self.take_counter(prev, node, key, now);
                self.decide_here(node, key, now, sent, back + rtt);
            }
            None => self.decide_here(node, key, now, sent, back),
        }
    }

    /// Forward and durable modes, as `OwnerStore::serve` does: where `node`, the owner of `key`
    /// in its view, sends a hit while its join has not settled or it has not taken the key's
    /// counter over from its previous owner ([`Joining::relay`]). A previous owner that is
    /// down is marked so, and the hit counted here.
    fn relay_to(&mut self, node: usize, key: usize, now: u64) -> Option<(usize, Relay)> {
        if !matches!(self.p.mode, Mode::Forward | Mode::Durable(_)) {
            return None;
        }
        let how = self.joins[node].relay(&self.w.quota(key), sim_time(now))?;
        let secs = EPOCH_SECS + now / 1_000_000;
        let held = self
            .counters
            .get(&counter_id(node, key))
            .is_some_and(|s| fixed_window::current_count(*s, secs, Window::of(self.w.unit)) > 0);
        if held || self.owner(node, key) != node {
            return None;
        }
        let view = &self.view[node];
        let prev = self
            .ring
            .owner(self.w.hashes[key], |i| i != node && view[i])?;
        if !self.alive[prev] {
            self.out.failed_hops += 1;
            self.mark_down(node, prev, now);
            return None;
        }
        Some((prev, how))
    }

    /// `node` takes `key`'s counter over from `prev`, which forgets it.
    fn take_counter(&mut self, prev: usize, node: usize, key: usize, now: u64) {
        let Some(state) = self.counters.remove(&counter_id(prev, key)) else {
            return;
        };
        let secs = EPOCH_SECS + now / 1_000_000;
        let unit = Window::of(self.w.unit);
        let mine = self.counters.entry(counter_id(node, key)).or_default();
        *mine = fixed_window::merge_max(*mine, state, secs, unit);
    }

    /// Applies one hit for `key` on `node`'s own counter.
    fn decide_here(&mut self, node: usize, key: usize, now: u64, sent: u64, back: u64) {
        let limit = self.w.limits[key];
        let limit = match self.p.mode {
            Mode::Divided => divided_node_limit(limit, self.live(node)),
            _ => limit,
        };
        let secs = EPOCH_SECS + now / 1_000_000;
        let mut back = back;
        if matches!(self.p.mode, Mode::Durable(_)) {
            back += self.take_over(node, key, secs);
            self.dirty[node].insert(key as u32);
        }
        let unit = Window::of(self.w.unit);
        let slot = self.counters.entry(counter_id(node, key)).or_default();
        let (d, state) = fixed_window::decide(*slot, secs, unit, limit, 1);
        *slot = state;
        self.record(key, now, !d.over, now - sent + back);
    }

    /// Durable mode: loads `key`'s count from Redis before `node` decides, when `node` has no
    /// count for this window and saw a change this window or stands in for another owner.
    /// Returns the time the load adds.
    fn take_over(&mut self, node: usize, key: usize, secs: u64) -> u64 {
        let id = counter_id(node, key);
        let unit = Window::of(self.w.unit);
        let window = secs / unit.secs();
        let held = self
            .counters
            .get(&id)
            .map_or(0, |s| fixed_window::current_count(*s, secs, unit));
        let window_start = (window * unit.secs()).saturating_sub(EPOCH_SECS) * 1_000_000;
        let elsewhere = self.ring.owner(self.w.hashes[key], |i| self.known(node, i)) != Some(node);
        if held > 0 || (self.changed[node] < window_start && !elsewhere) {
            return 0;
        }
        self.out.loads += 1;
        if let Some(&count) = self.redis.get(&(key as u32, window)) {
            self.counters
                .insert(id, fixed_window::state_with_count(count, secs, unit));
        }
        self.rng.range(REDIS_US.0, REDIS_US.1)
    }

    /// Durable mode: `node` writes its changed counters (raise-only) and takes back larger ones.
    fn flush(&mut self, node: usize, now: u64) {
        let secs = EPOCH_SECS + now / 1_000_000;
        let unit = Window::of(self.w.unit);
        let window = secs / unit.secs();
        let keys: Vec<u32> = self.dirty[node].drain().collect();
        for key in keys {
            let id = counter_id(node, key as usize);
            let held = self
                .counters
                .get(&id)
                .map_or(0, |s| fixed_window::current_count(*s, secs, unit));
            if held == 0 {
                continue;
            }
            self.out.writes += 1;
            let stored = self.redis.entry((key, window)).or_default();
            if held > *stored {
                *stored = held;
            } else if *stored > held {
                self.counters
                    .insert(id, fixed_window::state_with_count(*stored, secs, unit));
            }
        }
        // Keys expire with their window.
        self.redis.retain(|&(_, w), _| w >= window);
    }

    /// The node a request for `key` lands on, given the clients' spread.
    fn entry_node(&mut self, key: usize) -> usize {
        match self.p.spread {
            Spread::Pinned => {
                let c = self.traffic.below(self.pins[key].len());
                usize::from(self.pins[key][c])
            }
            Spread::PerRequest => loop {
                let n = self.traffic.below(self.alive.len());
                if self.alive[n] {
                    return n;
                }
            },
        }
    }

    /// A forward's latency: up to one batch window, then one way.
    fn hop(&mut self) -> u64 {
        self.rng.range(0, BATCH_WINDOW_US) + self.one_way()
    }

    fn one_way(&mut self) -> u64 {
        self.rng.range(HOP_US.0, HOP_US.1)
    }

    /// A request for `key` arrives at `node` at `now`.
    fn arrive(&mut self, node: usize, key: usize, now: u64) {
        match self.p.mode {
            Mode::Forward | Mode::Durable(_) => self.route(node, key, now, now, false),
            Mode::Divided | Mode::Local => self.decide(node, key, now, now, 0),
            Mode::Lease => self.lease_route(node, key, now),
            Mode::Global => self.global_route(node, key, now),
        }
    }

    /// Forward modes: routes a request at `from`; `retry` is the second (last) round.
    fn route(&mut self, from: usize, key: usize, now: u64, sent: u64, retry: bool) {
        let owner = self.owner(from, key);
        if owner == from {
            self.decide(from, key, now, sent, 0);
            return;
        }
        self.hop_taken(now);
        if now >= self.batch_until[from][owner] {
            self.out.peer_calls += 1;
            self.batch_until[from][owner] = now + BATCH_WINDOW_US;
        }
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

    /// Sends a lease or global call at `now`: it reaches its target one hop later, or fails
    /// after the peer timeout if the target is down.
    fn send_call(&mut self, call: Call, now: u64) {
        self.out.peer_calls += 1;
        let id = self.next_call;
        self.next_call = self.next_call.wrapping_add(1);
        if self.alive[usize::from(call.to)] {
            let at = now + self.one_way();
            self.push(at, Event::CallArrives { id });
        } else {
            self.push(now + PEER_TIMEOUT_US, Event::CallFailed { id });
        }
        self.calls.insert(id, call);
    }

    fn call_arrives(&mut self, id: u32, now: u64) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        let to = usize::from(call.to);
        if !self.alive[to] {
            // It died while the call was in flight: the call times out.
            let at = (call.sent + PEER_TIMEOUT_US).max(now);
            self.push(at, Event::CallFailed { id });
            return;
        }
        if matches!(call.payload, Payload::Lease(_)) {
            self.lease_serve(id, now);
            let at = now + self.one_way();
            self.push(at, Event::CallAnswered { id });
        } else if let Some(call) = self.calls.remove(&id) {
            self.global_receive(to, call.payload, now);
        }
    }

    fn call_answered(&mut self, id: u32, now: u64) {
        let Some(call) = self.calls.remove(&id) else {
            return;
        };
        if self.life[usize::from(call.from)] != call.life {
            return;
        }
        if let Payload::Lease(c) = call.payload {
            let ends = (usize::from(call.from), usize::from(call.to));
            self.lease_answered(ends, call.sent, c, now);
        }
    }

    fn call_failed(&mut self, id: u32, now: u64) {
        let Some(call) = self.calls.remove(&id) else {
            return;
        };
        let from = usize::from(call.from);
        if self.life[from] != call.life {
            return;
        }
        self.mark_down(from, usize::from(call.to), now);
        if let Payload::Lease(c) = call.payload {
            self.lease_failed(from, c, now);
        }
    }

    fn run(mut self) -> Outcome {
        let end = self.p.secs * 1_000_000;
        let victim = self.owner(0, 0) as u16;
        self.owner_at_start = usize::from(victim);
        let s = self.script;
        self.push(s.fail, Event::Fail { node: victim });
        self.push(s.restart, Event::Restart { node: victim });
        let joiner = self.initial as u16;
        self.push(s.join, Event::Join { node: joiner });
        self.simulate(end, true);
        self.finish(end)
    }

    /// Runs a cluster of fixed membership until `end` on the hits of `arrivals` (time, node,
    /// key) instead of the workload's traffic: the burst workloads ([`burst`]).
    fn run_arrivals(&mut self, arrivals: &[(u64, u16, u32)], end: u64) {
        for &(at, node, key) in arrivals {
            self.push(at, Event::Hit { node, key });
        }
        self.simulate(end, false);
    }

    /// Handles every event until `end`, with the workload's Poisson traffic if `traffic`.
    fn simulate(&mut self, end: u64, traffic: bool) {
        for n in 0..self.initial {
            let phase = self.rng.range(0, PROBE_EVERY_US - 1);
            self.push(phase, Event::Probe { node: n as u16 });
        }
        if let Mode::Durable(ms) = self.p.mode {
            for n in 0..=self.initial {
                let phase = self.rng.range(0, ms * 1000 - 1);
                self.push(phase, Event::Flush { node: n as u16 });
            }
        }
        for n in 0..self.initial {
            self.start_tasks(n, None);
        }
        let mut next_arrival = if traffic { 0 } else { u64::MAX };
        loop {
            let queued = self.queue.peek().map(|Reverse((t, _, _))| *t);
            let (now, event) = match queued {
                Some(t) if t <= next_arrival => {
                    let Reverse((t, _, EventSlot(e))) = self.queue.pop().unwrap();
                    (t, e)
                }
                _ => {
                    let t = next_arrival;
                    let gap = -(1.0 - self.traffic.unit()).ln() / self.w.rate * 1e6;
                    next_arrival = next_arrival.saturating_add(gap.max(1.0) as u64);
                    (t, Event::Arrive)
                }
            };
            if now >= end {
                break;
            }
            self.handle(now, event);
        }
    }

    /// Starts a node's periodic tasks: at random phases for the initial nodes (they started
    /// at different moments), at `started` for a node that starts during the run.
    fn start_tasks(&mut self, node: usize, started: Option<u64>) {
        let tasks: &[(Task, u64)] = match self.p.mode {
            Mode::Lease => &[
                (Task::Renew, self.p.renew_us),
                (Task::Sweep, self.p.lease_us),
            ],
            _ => &[],
        };
        for &(task, every) in tasks {
            let at = started.unwrap_or_else(|| self.rng.range(0, every - 1));
            let life = self.life[node];
            self.push(
                at,
                Event::Tick {
                    node: node as u16,
                    life,
                    task,
                },
            );
        }
    }

    fn handle(&mut self, now: u64, event: Event) {
        match event {
            Event::Arrive => {
                let key = self.w.sample(&mut self.traffic);
                let node = self.entry_node(key);
                self.arrive(node, key, now);
            }
            Event::Hit { node, key } => self.arrive(usize::from(node), key as usize, now),
            Event::Deliver {
                owner,
                from,
                key,
                retry,
                sent,
            } => {
                let (owner, from, key) = (usize::from(owner), usize::from(from), key as usize);
                if self.alive[owner] {
                    let back = self.one_way();
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
                let from = usize::from(from);
                if self.alive[from] {
                    self.mark_down(from, usize::from(dead), now);
                    self.route(from, key as usize, now, sent, true);
                }
            }
            Event::Probe { node } => self.probe(usize::from(node), now),
            Event::Flush { node } => {
                if let Mode::Durable(ms) = self.p.mode {
                    self.push(now + ms * 1000, Event::Flush { node });
                    if self.alive[usize::from(node)] {
                        self.flush(usize::from(node), now);
                    }
                }
            }
            Event::View {
                node,
                peer,
                up,
                dns,
            } => self.view_change(usize::from(node), usize::from(peer), up, dns, now),
            Event::Fail { node } => self.fail_node(usize::from(node), now),
            Event::Restart { node } => self.restart(usize::from(node), now),
            Event::Join { node } => self.join(usize::from(node), now),
            Event::CallArrives { id } => self.call_arrives(id, now),
            Event::CallAnswered { id } => self.call_answered(id, now),
            Event::CallFailed { id } => self.call_failed(id, now),
            Event::Tick { node, life, task } => {
                let n = usize::from(node);
                if self.alive[n] && self.life[n] == life {
                    self.tick(n, task, now);
                }
            }
        }
    }

    fn tick(&mut self, node: usize, task: Task, now: u64) {
        match task {
            Task::Renew => self.lease_renew(node, now),
            Task::Sweep => self.lease_sweep(node, now),
            Task::SendHits => self.global_send_tick(node, now),
            Task::Broadcast => self.global_broadcast_tick(node, now),
        }
    }

    fn probe(&mut self, a: usize, now: u64) {
        self.push(now + PROBE_EVERY_US, Event::Probe { node: a as u16 });
        if !self.alive[a] {
            return;
        }
        for p in 0..self.alive.len() {
            if p == a || !self.known(a, p) {
                continue;
            }
            if self.alive[p] && !self.view[a][p] {
                let back = now + 2 * self.one_way();
                self.push(
                    back,
                    Event::View {
                        node: a as u16,
                        peer: p as u16,
                        up: true,
                        dns: false,
                    },
                );
            } else if !self.alive[p] && self.view[a][p] && self.p.mode == Mode::Divided {
                // In the other modes a failed call marks a peer down first.
                self.push(
                    now + PEER_TIMEOUT_US,
                    Event::View {
                        node: a as u16,
                        peer: p as u16,
                        up: false,
                        dns: false,
                    },
                );
            }
        }
    }

    fn view_change(&mut self, a: usize, p: usize, up: bool, dns: bool, now: u64) {
        // A probe's answer only counts if the peer is still in that state.
        if !self.alive[a] || self.alive[p] != up {
            return;
        }
        let was = std::mem::replace(&mut self.view[a][p], up);
        if up {
            self.failing[a][p] = 0;
        }
        if dns || (up && !was && self.p.mode == Mode::Lease) {
            // PEERS_DNS changed the membership (`resolve_peers` records it), or in lease mode
            // a peer answers again (`probe_peers`: its keys' holders must report to it).
            self.record_change(a, now);
        }
    }

    fn fail_node(&mut self, n: usize, now: u64) {
        self.alive[n] = false;
        self.life[n] += 1;
        if let Some(since) = self.since[n].take() {
            self.out.node_secs += (now - since) as f64 / 1e6;
        }
        self.counters.retain(|id, _| (id >> 32) as usize != n);
        self.dirty[n].clear();
        self.lease_lost(n, now);
        self.global_lost(n);
        // Its clients reconnect to running nodes.
        self.repin(|pin, _| usize::from(pin) == n, None);
    }

    /// `n` starts at `now` (a restart or a join): a fresh process.
    fn start(&mut self, n: usize, now: u64) {
        self.alive[n] = true;
        self.since[n] = Some(now);
        self.changed[n] = now;
        let found_in = if self.p.has(Variant::StartRebuild) {
            DNS_EVERY_US
        } else {
            0
        };
        self.ring_changes[n] = (0, EPOCH_US + now + found_in);
        self.joins[n] = Joining::awaiting_dns();
        self.joins[n].resolved(true, sim_time(now));
        self.lease_lost(n, now);
        self.global_lost(n);
        self.start_tasks(n, Some(now));
    }

    fn restart(&mut self, n: usize, now: u64) {
        self.start(n, now);
        // A fresh process believes every peer it knows of is up.
        for p in 0..self.alive.len() {
            self.view[n][p] = self.known(n, p) || p == n;
            self.failing[n][p] = 0;
        }
    }

    fn join(&mut self, n: usize, now: u64) {
        self.start(n, now);
        self.view[n] = vec![true; self.alive.len()];
        for a in 0..self.initial {
            let at = now + self.rng.range(0, DNS_EVERY_US);
            self.push(
                at,
                Event::View {
                    node: a as u16,
                    peer: n as u16,
                    up: true,
                    dns: true,
                },
            );
        }
        let share = 1.0 / self.alive.iter().filter(|&&x| x).count() as f64;
        self.repin(|_, rng| rng.unit() < share, Some(n as u16));
        self.push(now + PROBE_EVERY_US, Event::Probe { node: n as u16 });
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
                if pred(*p, &mut self.traffic) {
                    *p = to.unwrap_or_else(|| running[self.traffic.below(running.len())]);
                }
            }
        }
    }

    fn finish(mut self, end: u64) -> Outcome {
        self.lease_finish();
        for since in self.since.iter().flatten() {
            self.out.node_secs += (end - since) as f64 / 1e6;
        }
        let unit_us = self.w.unit.secs() * 1_000_000;
        for (&(key, window), &(offered, admitted, acquires)) in &self.windows {
            let limit = self.w.limits[key as usize];
            // Whole windows inside the run only.
            let start = (window * unit_us).saturating_sub(EPOCH_US);
            if start + unit_us > end {
                continue;
            }
            if self.script.phase(start, start + unit_us) == Phase::Steady {
                let over = usize::from(offered >= limit);
                self.out.steady_acquires[over] += u64::from(acquires);
                self.out.steady_over += u64::from(admitted > limit);
            }
            if offered < 2 * limit {
                continue;
            }
            let ratio = f64::from(admitted) / f64::from(limit);
            if ratio > 1.05 && self.p.worst {
                let all = self.ring.owner(self.w.hashes[key as usize], |_| true);
                let before = self
                    .ring
                    .owner(self.w.hashes[key as usize], |i| i < self.initial);
                eprintln!(
                    "worst: key {key} limit {limit} window at {:.0} s ratio {ratio:.2} offered \
                     {offered} owner {before:?} (with the joiner {all:?}, victim {})",
                    start as f64 / 1e6,
                    self.owner_at_start
                );
            }
            self.out.ratios.push(ratio);
            let phase = self.script.phase(start, start + unit_us);
            let i = Phase::ALL.iter().position(|&q| q == phase).unwrap_or(0);
            self.out.phase_ratios[i].push(ratio);
            if phase == Phase::Steady {
                self.out.class_ratios[key as usize % 3].push(ratio);
            }
        }
        self.out.ratios.sort_by(f64::total_cmp);
        for r in self
            .out
            .phase_ratios
            .iter_mut()
            .chain(&mut self.out.class_ratios)
        {
            r.sort_by(f64::total_cmp);
        }
        self.out
    }
}

fn addr(i: usize) -> String {
    format!("10.1.{}.{}:8082", i / 256, i % 256)
}

/// A simulated time (µs since the run's start) as a timestamp.
fn sim_time(now: u64) -> Timestamp {
    Timestamp::from_micros(EPOCH_US + now)
}

fn counter_id(node: usize, key: usize) -> u64 {
    ((node as u64) << 32) | key as u64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = report::Options::parse(&args);
    report::run(&opts);
}
