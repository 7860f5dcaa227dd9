//! The burst workloads of `docs/cluster.md` ("Bursts", issue 34) in lease mode: each key's
//! demand for one window arrives in the window's first 100 ms, 500 ms or 2 s, rather than at
//! a steady rate as in the other sections.
//!
//! One run is one cluster (3, 10 or 50 nodes, fixed membership) and [`KEYS`] keys of one limit
//! (100 per second or 600 per minute), each with one burst in the run's second window: the
//! limit times the offered multiple (3 or 1) of requests at uniform random times in the
//! burst's span, each to a node drawn by the spread: `busy` (90% to one node, the key's own,
//! the rest shared by the N-1 others, as pinned connections do) or `even` (every node alike).
//! A `cold` key is new to every node at its burst; a `warm` key had light steady traffic in
//! the window before (a tenth of its limit, Poisson, with the burst's spread), which stops at
//! the boundary. Per run: utilisation per key (admitted / min(limit, offered)), admitted /
//! limit over every window (at most 1.00), and the acquires sent over the network (hits of the
//! burst that went to the key's owner) per burst and per decision.

use sluice::limiter::Unit;

use super::{EPOCH_SECS, Mode, Params, Rng, Sim, Spread, Workload};

/// Keys per run, each one burst.
const KEYS: usize = 32;
/// The warm keys' traffic in the window before their burst, as a fraction of the limit.
const WARM: f64 = 0.1;
/// The busy node's part of a `busy` burst.
const BUSY: f64 = 0.9;
/// The cluster sizes.
const SIZES: [usize; 3] = [3, 10, 50];
/// The run goes on this long after the last burst ends (every acquire is back long before).
const TAIL_US: u64 = 500_000;

/// One burst workload.
#[derive(Clone, Copy)]
struct Shape {
    unit: Unit,
    limit: u32,
    /// The span of the window's start in which the demand arrives.
    burst_us: u64,
    /// Requests offered per key, as a multiple of the limit.
    offered: u32,
    busy: bool,
    warm: bool,
}

impl Shape {
    /// Every workload: per-second limits with bursts of 100 and 500 ms, per-minute limits
    /// with bursts of 100 ms, 500 ms and 2 s; offered 3x and 1x; busy and even; cold and warm.
    fn all() -> Vec<Shape> {
        let mut shapes = Vec::new();
        let units: [(Unit, u32, &[u64]); 2] = [
            (Unit::Second, 100, &[100_000, 500_000]),
            (Unit::Minute, 600, &[100_000, 500_000, 2_000_000]),
        ];
        for (unit, limit, bursts) in units {
            for &burst_us in bursts {
                for offered in [3, 1] {
                    for busy in [true, false] {
                        for warm in [false, true] {
                            shapes.push(Shape {
                                unit,
                                limit,
                                burst_us,
                                offered,
                                busy,
                                warm,
                            });
                        }
                    }
                }
            }
        }
        shapes
    }

    fn unit_us(&self) -> u64 {
        self.unit.secs() * 1_000_000
    }

    /// The node each of `key`'s requests goes to, among `nodes`: the key's busy node (its
    /// index modulo `nodes`) with [`BUSY`] of them, or any node alike.
    fn node(&self, key: usize, nodes: usize, rng: &mut Rng) -> u16 {
        let busy = key % nodes;
        let n = if !self.busy || nodes == 1 {
            rng.below(nodes)
        } else if rng.unit() < BUSY {
            busy
        } else {
            (busy + 1 + rng.below(nodes - 1)) % nodes
        };
        n as u16
    }

    /// Every request of the run, (time, node, key), sorted by time: the warm traffic in the
    /// first window, the bursts at the start of the second.
    fn arrivals(&self, nodes: usize, rng: &mut Rng) -> Vec<(u64, u16, u32)> {
        let start = self.unit_us();
        let mut hits = Vec::new();
        for key in 0..KEYS {
            for _ in 0..self.offered * self.limit {
                let at = start + rng.range(0, self.burst_us - 1);
                hits.push((at, self.node(key, nodes, rng), key as u32));
            }
            if self.warm {
                let rate = f64::from(self.limit) * WARM / start as f64;
                let mut at = 0u64;
                loop {
                    at += (-(1.0 - rng.unit()).ln() / rate).max(1.0) as u64;
                    if at >= start {
                        break;
                    }
                    hits.push((at, self.node(key, nodes, rng), key as u32));
                }
            }
        }
        hits.sort_unstable();
        hits
    }

    fn label(&self) -> String {
        let unit = if self.unit == Unit::Second {
            "s"
        } else {
            "min"
        };
        let burst = if self.burst_us < 1_000_000 {
            format!("{} ms", self.burst_us / 1000)
        } else {
            format!("{} s", self.burst_us / 1_000_000)
        };
        format!(
            "| {}/{unit} | {burst} | {}x | {} | {} |",
            self.limit,
            self.offered,
            if self.busy { "busy" } else { "even" },
            if self.warm { "warm" } else { "cold" },
        )
    }
}

/// What one run measured.
#[derive(Clone, Copy)]
struct Measure {
    util_mean: f64,
    util_min: f64,
    /// The most any (key, window) admitted, over its limit, and the windows admitting more
    /// than their limit (counted exactly, not rounded).
    max: f64,
    over: usize,
    acquires_per_burst: f64,
    acquires_per_decision: f64,
    /// Requests that got no answer from the cluster (an acquire to a dead owner, or a full
    /// lease table): none expected here.
    errors: u64,
}

/// Runs `shape` on `nodes` nodes with lease mode's defaults.
fn measure(shape: &Shape, nodes: usize, seed: u64, free_share_ppm: u64) -> Measure {
    let w = Workload::uniform(KEYS, shape.limit, shape.unit);
    let end = shape.unit_us() + shape.burst_us + TAIL_US;
    let p = Params {
        free_share_ppm,
        ..Params::new(
            Mode::Lease,
            Spread::PerRequest,
            nodes,
            end / 1_000_000,
            seed,
        )
    };
    let mut rng = Rng(seed ^ 0xb0b5_7000 ^ (nodes as u64) << 40 ^ shape.burst_us);
    let arrivals = shape.arrivals(nodes, &mut rng);
    let mut sim = Sim::new(&w, p);
    sim.run_arrivals(&arrivals, end);
    let window = (EPOCH_SECS + shape.unit.secs()) / shape.unit.secs();
    let limit = f64::from(shape.limit);
    let max = sim
        .windows
        .values()
        .map(|&(_, admitted, _)| f64::from(admitted) / limit)
        .fold(0.0, f64::max);
    let over = sim
        .windows
        .values()
        .filter(|&&(_, admitted, _)| admitted > shape.limit)
        .count();
    let (mut utils, mut acquires, mut offered) = (Vec::new(), 0u64, 0u64);
    for key in 0..KEYS as u32 {
        let (o, admitted, a) = sim.windows.get(&(key, window)).copied().unwrap_or_default();
        utils.push(f64::from(admitted) / f64::from(o.min(shape.limit)).max(1.0));
        acquires += u64::from(a);
        offered += u64::from(o);
    }
    Measure {
        util_mean: utils.iter().sum::<f64>() / utils.len() as f64,
        util_min: utils.iter().copied().fold(f64::INFINITY, f64::min),
        max,
        over,
        acquires_per_burst: acquires as f64 / KEYS as f64,
        acquires_per_decision: acquires as f64 / offered.max(1) as f64,
        errors: sim.out.errors,
    }
}

/// The section `burst`: one row per workload, the cluster sizes side by side, then the
/// worst of each size against the targets. The same in `--quick` (a few seconds in all).
pub(super) fn table(seed: u64, free_share_ppm: u64) {
    println!(
        "\n### Bursts, lease mode, {KEYS} keys per run, renew 100 ms, lease 1 s\n\n\
         Utilisation per key: admitted / min(limit, offered) in the burst's window, mean \
         (min); max: the most admitted / limit of any window; acquires: calls to the key's \
         owner per burst (per decision).\n"
    );
    let mut header = String::from("| limit | burst | offered | spread | keys |");
    let mut rule = String::from("|---|---|---|---|---|");
    for n in SIZES {
        header += &format!(" {n} nodes: utilisation | max | acquires |");
        rule += "---:|---:|---:|";
    }
    println!("{header}\n{rule}");
    let mut worst: Vec<(Measure, String, usize)> = Vec::new();
    for shape in &Shape::all() {
        let mut line = shape.label();
        for n in SIZES {
            let m = measure(shape, n, seed, free_share_ppm);
            line += &format!(
                " {:.3} ({:.2}) | {:.2} | {:.1} ({:.3}) |",
                m.util_mean, m.util_min, m.max, m.acquires_per_burst, m.acquires_per_decision
            );
            if m.errors > 0 {
                eprintln!(
                    "burst: {} at {n} nodes: {} unanswered",
                    shape.label(),
                    m.errors
                );
            }
            worst.push((m, shape.label(), n));
        }
        println!("{line}");
    }
    summary(&worst);
}

/// Per cluster size: the lowest mean utilisation (3x and 1x offered apart), the workloads
/// under 0.95, and the highest admitted / limit.
fn summary(runs: &[(Measure, String, usize)]) {
    println!(
        "\n| nodes | offered | workloads | utilisation mean < 0.95 | lowest mean | in | lowest \
         min | max admitted/limit | windows over the limit |\n|---:|---|---:|---:|---:|---|---:|---:|---:|"
    );
    for n in SIZES {
        for offered in ["| 3x |", "| 1x |"] {
            let of: Vec<&(Measure, String, usize)> = runs
                .iter()
                .filter(|(_, label, size)| *size == n && label.contains(offered))
                .collect();
            let Some(low) = of
                .iter()
                .min_by(|a, b| a.0.util_mean.total_cmp(&b.0.util_mean))
            else {
                continue;
            };
            let under = of.iter().filter(|r| r.0.util_mean < 0.95).count();
            let min = of
                .iter()
                .map(|r| r.0.util_min)
                .fold(f64::INFINITY, f64::min);
            let max = of.iter().map(|r| r.0.max).fold(0.0, f64::max);
            let over: usize = of.iter().map(|r| r.0.over).sum();
            let label = low
                .1
                .trim_matches(|c| c == '|' || c == ' ')
                .replace(" | ", ", ");
            println!(
                "| {n} {offered} {} | {under} | {:.3} | {label} | {min:.2} | {max:.3} | {over} |",
                of.len(),
                low.0.util_mean,
            );
        }
    }
}
