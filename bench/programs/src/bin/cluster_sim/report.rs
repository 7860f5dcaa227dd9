//! The runs and the tables of `docs/cluster.md`'s "Simulation" section.

use sluice::cluster::lease::LeaseTiming;
use sluice::cluster::ring::Ring;
use sluice::limiter::Unit;

use super::{
    BATCH_WINDOW_US, HOP_US, KEYS, Mode, NODE_COUNTS, Outcome, PEER_TIMEOUT_US, Params, Phase,
    RATE, Sim, Spread, Variant, Workload, ZIPF_S, addr,
};

const SPREADS: [Spread; 2] = [Spread::Pinned, Spread::PerRequest];
const MODES: [Mode; 7] = [
    Mode::Forward,
    Mode::Durable(500),
    Mode::Durable(100),
    Mode::Divided,
    Mode::Local,
    Mode::Global,
    Mode::Lease,
];

/// The command line: `--quick`, `--seed N`, `--only SECTION`; for `--only one` (one run,
/// with lease mode's diagnostics): `--mode NAME --nodes N --spread pinned|per-request
/// --minute --secs N --rate N --keys N --zipf S --renew-ms N --lease-ms N --lease-max-mib N
/// --variants e|j --worst`; for every lease run, `--free-share-percent N` (50; 0: every key
/// leased, as before issue 49's step 2); for `--only lease` (lease mode's rows, to compare
/// builds of the lease logic): `--label TEXT --variants de`.
pub(super) struct Options {
    quick: bool,
    seed: u64,
    /// `--free-share-percent N` (50, as SLUICE_LEASE_FREE_SHARE_PERCENT; 0: every key leased,
    /// as before issue 49's step 2), in parts per million, for every lease run.
    free_share_ppm: u64,
    only: Option<String>,
    args: Vec<String>,
}

impl Options {
    pub(super) fn parse(args: &[String]) -> Self {
        let o = Options {
            quick: args.iter().any(|a| a == "--quick"),
            seed: 42,
            free_share_ppm: LeaseTiming::DEFAULT.free_share_ppm,
            only: None,
            args: args.to_vec(),
        };
        Options {
            seed: o.value("--seed").unwrap_or(42),
            free_share_ppm: o
                .value::<u64>("--free-share-percent")
                .map_or(o.free_share_ppm, |pct| pct.min(90) * 10_000),
            only: o.text("--only"),
            ..o
        }
    }

    fn text(&self, name: &str) -> Option<String> {
        let i = self.args.iter().position(|a| a == name)?;
        self.args.get(i + 1).cloned()
    }

    fn value<T: std::str::FromStr>(&self, name: &str) -> Option<T> {
        self.text(name).map(|s| {
            s.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
    }

    fn wants(&self, section: &str) -> bool {
        self.only.as_deref().is_none_or(|s| s == section)
    }

    /// Simulated seconds of a per-second run.
    fn secs(&self) -> u64 {
        if self.quick { 12 } else { 40 }
    }

    /// One run's settings, with the seed and the free shares of the command line.
    fn params(&self, mode: Mode, spread: Spread, nodes: usize, secs: u64) -> Params {
        Params {
            free_share_ppm: self.free_share_ppm,
            ..Params::new(mode, spread, nodes, secs, self.seed)
        }
    }

    /// The cluster sizes of the main tables (`--quick`: two of them).
    fn sizes(&self) -> &'static [usize] {
        if self.quick { &[3, 10] } else { &NODE_COUNTS }
    }
}

/// Every section, in order: `main` (every mode, per-second limits), `sweep` (lease mode's
/// settings), `rate` (peer calls at two request rates), `minute` (per-minute limits),
/// `variants` (changes to lease mode's glue), `burst` (lease mode under bursts), `regions`
/// (one limit across regions) and `ring` (keys moved). Only on request (`--only`): `one`,
/// `lease` and `keys` (10^4 against 10^6 keys, issue 49).
pub(super) fn run(o: &Options) {
    let w = Workload::new(RATE, Unit::Second);
    println!(
        "cluster_sim: seed {}, {} s simulated, {RATE} requests/s, {KEYS} keys (Zipf {ZIPF_S}; \
         {} keys over their limit on average), limits 10/100/1000 per second, hop {}-{} us \
         (+ batch window up to {BATCH_WINDOW_US} us for forwards), peer timeout {} ms{}",
        o.seed,
        o.secs(),
        w.hot(),
        HOP_US.0,
        HOP_US.1,
        PEER_TIMEOUT_US / 1000,
        if o.quick { " (--quick)" } else { "" }
    );
    let timed = |name: &str, f: &dyn Fn()| {
        if o.wants(name) {
            let start = sluice::clock::instant();
            f();
            eprintln!("section {name}: {:.1} s", start.elapsed().as_secs_f64());
        }
    };
    timed("main", &|| main_tables(o, &w));
    timed("sweep", &|| sweep(o, &w));
    timed("rate", &|| rates(o));
    timed("minute", &|| minute(o));
    timed("variants", &|| variant_table(o, &w));
    timed("burst", &|| super::burst::table(o.seed, o.free_share_ppm));
    timed("regions", &|| super::regions::table(o.seed, o.quick));
    timed("ring", &|| ring_table(&w));
    match o.only.as_deref() {
        Some("one") => one(o),
        Some("keys") => timed("keys", &|| cardinality(o)),
        Some("lease") => lease_rows(o, &w),
        _ => {}
    }
}

const HEADER: &str = "| mode | nodes | windows ≥ 2× limit | admitted/limit mean | p99 | max | \
                      utilisation mean | p5 | hops/decision | steady | peer calls/s/node: request path | \
                      background | added latency mean | unanswered |\n\
                      |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

/// One row of the main tables: `label` names the mode or the setting.
fn row(label: &str, nodes: usize, o: &Outcome, secs: u64) -> String {
    let (mean, p99, max, util, util_p5) = ratios(&o.ratios);
    let steady = Phase::ALL
        .iter()
        .position(|&p| p == Phase::Steady)
        .unwrap_or(1);
    let steady_hops = per(o.phase_hops[steady], o.phase_decisions[steady]);
    let _ = secs;
    format!(
        "| {label} | {nodes} | {} | {mean:.3} | {p99:.2} | {max:.2} | {util:.3} | {util_p5:.2} | \
         {:.3} | {steady_hops:.4} | {:.0} | {:.0} | {:.0} us | {} |",
        o.ratios.len(),
        per(o.hops, o.decisions),
        (o.peer_calls - o.background_calls) as f64 / o.node_secs.max(1e-9),
        o.background_calls as f64 / o.node_secs.max(1e-9),
        per(o.added_latency_us, o.decisions),
        o.errors,
    )
}

/// (mean, p99, max, utilisation mean, utilisation p5) of sorted admitted/limit ratios, where
/// utilisation is min(ratio, 1): admitting more in one window does not make up for refusing
/// in another.
fn ratios(sorted: &[f64]) -> (f64, f64, f64, f64, f64) {
    if sorted.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN);
    }
    let n = sorted.len() as f64;
    let mean = sorted.iter().sum::<f64>() / n;
    let util = sorted.iter().map(|r| r.min(1.0)).sum::<f64>() / n;
    (
        mean,
        percentile(sorted, 0.99),
        sorted[sorted.len() - 1],
        util,
        percentile(sorted, 0.05).min(1.0),
    )
}

fn per(x: u64, n: u64) -> f64 {
    x as f64 / n.max(1) as f64
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn simulate(w: &Workload, p: Params) -> Outcome {
    Sim::new(w, p).run()
}

/// Every mode at every size, both spreads; then durable mode's Redis traffic and lease
/// mode's phases at 10 nodes, from the same runs.
fn main_tables(o: &Options, w: &Workload) {
    let mut phases = Vec::new();
    for spread in SPREADS {
        println!("\n### {}, limits per second\n\n{HEADER}", spread.name());
        let mut redis = Vec::new();
        for mode in MODES {
            for &n in o.sizes() {
                let out = simulate(w, o.params(mode, spread, n, o.secs()));
                println!("{}", row(&mode.name(), n, &out, o.secs()));
                if matches!(mode, Mode::Durable(_)) {
                    redis.push((mode, n, per(out.loads, out.decisions), out.writes));
                }
                if n == 10 && matches!(mode, Mode::Lease | Mode::Global | Mode::Forward) {
                    phases.push((spread, mode, out));
                }
            }
        }
        println!("\nDurable mode's Redis traffic ({}):\n", spread.name());
        println!("| mode | nodes | Redis loads/decision | Redis writes/s |\n|---|---:|---:|---:|");
        for (mode, n, loads, writes) in redis {
            let writes = writes as f64 / o.secs() as f64;
            println!("| {} | {n} | {loads:.5} | {writes:.0} |", mode.name());
        }
    }
    phase_table(&phases);
}

/// Lease mode (and forward and global for comparison) at 10 nodes, by phase of the run.
fn phase_table(runs: &[(Spread, Mode, Outcome)]) {
    println!("\n### By phase of the run, 10 nodes, limits per second\n");
    println!(
        "| spread | mode | phase | windows ≥ 2× limit | admitted/limit mean | p99 | max | \
         utilisation mean | p5 | hops/decision |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (spread, mode, out) in runs {
        for (i, phase) in Phase::ALL.iter().enumerate() {
            let r = &out.phase_ratios[i];
            let (mean, p99, max, util, p5) = ratios(r);
            println!(
                "| {} | {} | {} | {} | {mean:.3} | {p99:.2} | {max:.2} | {util:.3} | {p5:.2} | \
                 {:.4} |",
                spread.name(),
                mode.name(),
                phase.name(),
                r.len(),
                per(out.phase_hops[i], out.phase_decisions[i]),
            );
        }
    }
}

/// Lease mode at 10 nodes: the renewal interval, then the lease duration.
fn sweep(o: &Options, w: &Workload) {
    for spread in SPREADS {
        println!(
            "\n### Lease mode's settings, 10 nodes, {}, limits per second\n\n{}",
            spread.name(),
            HEADER.replacen("| mode |", "| setting |", 1)
        );
        let renewals: &[u64] = if o.quick {
            &[50, 100, 500]
        } else {
            &[25, 50, 100, 200, 500]
        };
        for &renew_ms in renewals {
            let p = Params {
                renew_us: renew_ms * 1000,
                ..o.params(Mode::Lease, spread, 10, o.secs())
            };
            let label = format!("renew {renew_ms} ms, lease 1 s");
            println!("{}", row(&label, 10, &simulate(w, p), o.secs()));
        }
        let durations: &[u64] = if o.quick { &[5000] } else { &[500, 2000, 5000] };
        for &lease_ms in durations {
            let p = Params {
                lease_us: lease_ms * 1000,
                ..o.params(Mode::Lease, spread, 10, o.secs())
            };
            let label = format!("renew 100 ms, lease {} s", lease_ms as f64 / 1000.0);
            println!("{}", row(&label, 10, &simulate(w, p), o.secs()));
        }
    }
}

/// Peer calls per node per second at two request rates, 10 nodes.
fn rates(o: &Options) {
    println!(
        "\n### Two request rates, 10 nodes, limits per second\n\n{}",
        HEADER.replacen("| mode |", "| mode, spread, requests/s |", 1)
    );
    for rate in [RATE, 4.0 * RATE] {
        let w = Workload::new(rate, Unit::Second);
        let runs: &[(Mode, Spread)] = &[
            (Mode::Lease, Spread::PerRequest),
            (Mode::Lease, Spread::Pinned),
            (Mode::Forward, Spread::PerRequest),
            (Mode::Global, Spread::PerRequest),
        ];
        for &(mode, spread) in &runs[..if o.quick { 2 } else { 4 }] {
            let p = o.params(mode, spread, 10, o.secs());
            let label = format!("{}, {}, {rate}", mode.name(), spread.name());
            println!("{}", row(&label, 10, &simulate(&w, p), o.secs()));
        }
    }
}

/// Per-minute limits: fewer sizes and modes (lease mode's renewals of every key a node holds
/// cost the simulation N times what they cost one node), a longer run (4 minutes: 4 whole
/// windows).
fn minute(o: &Options) {
    let w = Workload::new(RATE, Unit::Minute);
    let secs = if o.quick { 60 } else { 240 };
    let nodes: &[usize] = if o.quick { &[3] } else { &[3, 10] };
    for spread in SPREADS {
        println!(
            "\n### {}, limits per minute (600/6000/60000), {secs} s simulated\n\n{HEADER}",
            spread.name()
        );
        for mode in [
            Mode::Forward,
            Mode::Durable(500),
            Mode::Divided,
            Mode::Local,
            Mode::Global,
            Mode::Lease,
        ] {
            for &n in nodes {
                let out = simulate(&w, o.params(mode, spread, n, secs));
                println!("{}", row(&mode.name(), n, &out, secs));
            }
        }
    }
}

fn ring_table(w: &Workload) {
    println!("\n### Keys moved per membership change (the ring, {KEYS} keys)\n");
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

/// One run (`--only one`), with lease mode's acquires and steady windows by limit, for
/// finding where a target is missed.
fn one(o: &Options) {
    let mode = match o.text("--mode").as_deref().unwrap_or("lease") {
        "forward" => Mode::Forward,
        "durable" => Mode::Durable(500),
        "divided" => Mode::Divided,
        "local" => Mode::Local,
        "global" => Mode::Global,
        _ => Mode::Lease,
    };
    let spread = match o.text("--spread").as_deref() {
        Some("pinned") => Spread::Pinned,
        _ => Spread::PerRequest,
    };
    let unit = if o.args.iter().any(|a| a == "--minute") {
        Unit::Minute
    } else {
        Unit::Second
    };
    let w = Workload::zipf(
        o.value("--keys").unwrap_or(KEYS),
        o.value("--zipf").unwrap_or(ZIPF_S),
        o.value("--rate").unwrap_or(RATE),
        unit,
    );
    let nodes = o.value("--nodes").unwrap_or(10);
    let secs = o.value("--secs").unwrap_or(o.secs());
    let p = Params {
        renew_us: o.value::<u64>("--renew-ms").unwrap_or(100) * 1000,
        lease_us: o.value::<u64>("--lease-ms").unwrap_or(1000) * 1000,
        lease_max_bytes: o
            .value::<usize>("--lease-max-mib")
            .map_or(LeaseTiming::DEFAULT.max_bytes, |m| m << 20),
        variants: o.text("--variants").map_or(0, |v| variants(&v)),
        worst: o.args.iter().any(|a| a == "--worst"),
        ..o.params(mode, spread, nodes, secs)
    };
    let start = sluice::clock::instant();
    let out = simulate(&w, p);
    println!("\n{HEADER}\n{}", row(&mode.name(), nodes, &out, secs));
    eprintln!("run: {:.1} s", start.elapsed().as_secs_f64());
    let steady = Phase::ALL
        .iter()
        .position(|&q| q == Phase::Steady)
        .unwrap_or(1);
    let d = out.phase_decisions[steady];
    println!(
        "\nlease: keys renewed/s/node {:.0}, held keys per node at renewal ticks mean {:.0} max \
         {}, unanswered {}, decided from free shares {:.3} of decisions, recalls/s/node {:.0}",
        out.renewed_keys as f64 / out.node_secs.max(1e-9),
        per(out.held_sum, out.held_ticks),
        out.held_max,
        out.errors,
        per(out.free_decisions, out.decisions),
        out.recalls as f64 / out.node_secs.max(1e-9),
    );
    println!(
        "\nsteady acquires/decision: nothing held {:.4}, all used {:.4}; acquired hits admitted \
         {:.3}",
        per(out.acquires_cold, d),
        per(out.acquires_more, d),
        per(out.acquired_admitted, out.hops),
    );
    println!(
        "steady acquires/decision in windows offered under their limit {:.4}, at least their \
         limit {:.4}; steady windows over their limit {}",
        per(out.steady_acquires[0], d),
        per(out.steady_acquires[1], d),
        out.steady_over,
    );
    for (limit, r) in [10, 100, 1000].iter().zip(&out.class_ratios) {
        let (mean, p99, max, util, p5) = ratios(r);
        println!(
            "steady windows ≥ 2× limit {limit}/unit: {} windows, mean {mean:.3} p99 {p99:.2} \
             max {max:.2} utilisation {util:.3} p5 {p5:.2}",
            r.len()
        );
    }
    phase_table(&[(spread, mode, out)]);
}

/// Variants named by their letters (`e`).
fn variants(letters: &str) -> u8 {
    letters
        .chars()
        .map(|c| match c {
            'e' => Variant::StartRebuild as u8,
            'j' => Variant::JoinRelay as u8,
            _ => 0,
        })
        .fold(0, |a, b| a | b)
}

/// Lease mode at 10 nodes with the changes to its glue under study, by phase.
fn variant_table(o: &Options, w: &Workload) {
    println!(
        "\n### Lease mode with the changes studied, 10 nodes, limits per second\n\n\
         | spread | change | admitted/limit mean | p99 | max | utilisation mean | p5 | steady \
         hops/decision | owner dies: mean | max | owner restarts: utilisation | node joins: \
         mean | max | utilisation |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\
         ---:|---:|"
    );
    let phase = |p: Phase| Phase::ALL.iter().position(|&q| q == p).unwrap_or(0);
    for spread in SPREADS {
        for (label, letters) in [("as built", ""), ("E", "e"), ("J", "j")] {
            let p = Params {
                variants: variants(letters),
                ..o.params(Mode::Lease, spread, 10, o.secs())
            };
            let out = simulate(w, p);
            let (mean, p99, max, util, p5) = ratios(&out.ratios);
            let steady = phase(Phase::Steady);
            let (f_mean, _, f_max, _, _) = ratios(&out.phase_ratios[phase(Phase::Failure)]);
            let (_, _, _, r_util, _) = ratios(&out.phase_ratios[phase(Phase::Restart)]);
            let (j_mean, _, j_max, j_util, _) = ratios(&out.phase_ratios[phase(Phase::Join)]);
            println!(
                "| {} | {label} | {mean:.3} | {p99:.2} | {max:.2} | {util:.3} | {p5:.2} | {:.4} | \
                 {f_mean:.3} | {f_max:.2} | {r_util:.3} | {j_mean:.3} | {j_max:.2} | {j_util:.3} |",
                spread.name(),
                per(out.phase_hops[steady], out.phase_decisions[steady]),
            );
        }
    }
}

/// Lease mode at 10 and 50 nodes, both spreads, per second, and at 10 nodes per minute: one
/// row each, labelled `--label` (the build or the variant under study).
fn lease_rows(o: &Options, w: &Workload) {
    let label = o.text("--label").unwrap_or_else(|| "as built".into());
    let variants = o.text("--variants").map_or(0, |v| variants(&v));
    let minute = Workload::new(RATE, Unit::Minute);
    println!(
        "\n| change | spread | nodes, limits | admitted/limit mean | p99 | max | utilisation mean \
         | p5 | steady hops/decision | peer calls/s/node: request path | background | added \
         latency mean |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for spread in SPREADS {
        for (nodes, w, secs, unit) in [
            (10, w, o.secs(), "per second"),
            (50, w, o.secs(), "per second"),
            (10, &minute, 240, "per minute"),
        ] {
            let p = Params {
                variants,
                ..o.params(Mode::Lease, spread, nodes, secs)
            };
            let out = simulate(w, p);
            let (mean, p99, max, util, p5) = ratios(&out.ratios);
            let steady = Phase::ALL
                .iter()
                .position(|&q| q == Phase::Steady)
                .unwrap_or(1);
            println!(
                "| {label} | {} | {nodes}, {unit} | {mean:.3} | {p99:.2} | {max:.2} | {util:.3} | \
                 {p5:.2} | {:.4} | {:.0} | {:.0} | {:.0} us |",
                spread.name(),
                per(out.phase_hops[steady], out.phase_decisions[steady]),
                (out.peer_calls - out.background_calls) as f64 / out.node_secs.max(1e-9),
                out.background_calls as f64 / out.node_secs.max(1e-9),
                per(out.added_latency_us, out.decisions),
            );
        }
    }
}

/// Issue 49, `--only keys`: 10^4 against 10^6 keys (`--keys` for another count) with Zipf
/// popularity (`--zipf`, 1.1), forward and lease mode, `--nodes` nodes (3), both spreads, per
/// second (40 s simulated) and per minute (240 s; `--quick`: 12 s and 60 s). Lease mode's
/// tables are raised to 4 GiB each, as `bench/lease_keys.py` raises SLUICE_LEASE_MAX_BYTES, so
/// none fills. Besides the main tables' columns: the steady phase's windows (no node lost,
/// restarted or joining), keys carried by renewals per node per second, the keys a node held
/// at its renewal ticks (mean, most), and the run's wall-clock seconds.
fn cardinality(o: &Options) {
    let nodes = o.value("--nodes").unwrap_or(3);
    let s = o.value("--zipf").unwrap_or(ZIPF_S);
    let many = o.value("--keys").unwrap_or(1_000_000);
    println!(
        "\n### {KEYS} against {many} keys (Zipf {s}), {nodes} nodes, {RATE} requests/s\n\n\
         | keys | limits | spread | mode | windows ≥ 2× limit | admitted/limit mean | p99 | max | \
         utilisation mean | p5 | steady phase: admitted/limit mean | max | utilisation mean | \
         hops/decision | steady | peer calls/s/node: request path | background | keys \
         renewed/s/node | held keys/node: mean | most | added latency mean | unanswered | \
         wall s |\n\
         |---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\
         ---:|---:|---:|---:|---:|"
    );
    let (second, minute) = if o.quick { (12, 60) } else { (40, 240) };
    for (unit, secs) in [(Unit::Second, second), (Unit::Minute, minute)] {
        for keys in [KEYS, many] {
            let w = Workload::zipf(keys, s, RATE, unit);
            for spread in SPREADS {
                for mode in [Mode::Forward, Mode::Lease] {
                    let p = Params {
                        lease_max_bytes: 4 << 30,
                        ..o.params(mode, spread, nodes, secs)
                    };
                    let start = sluice::clock::instant();
                    let out = simulate(&w, p);
                    let took = start.elapsed().as_secs_f64();
                    let limits = format!(
                        "per {}",
                        if unit == Unit::Second {
                            "second"
                        } else {
                            "minute"
                        }
                    );
                    println!("{}", keys_row((keys, &limits, spread, mode), &out, took));
                }
            }
        }
    }
}

/// One row of [`cardinality`]'s table.
fn keys_row(run: (usize, &str, Spread, Mode), o: &Outcome, took: f64) -> String {
    let (keys, limits, spread, mode) = run;
    let (mean, p99, max, util, util_p5) = ratios(&o.ratios);
    let steady = Phase::ALL
        .iter()
        .position(|&p| p == Phase::Steady)
        .unwrap_or(1);
    let node_secs = o.node_secs.max(1e-9);
    // A per-minute run has no whole steady window: every minute holds one of the script's events.
    let steady_ratios = match ratios(&o.phase_ratios[steady]) {
        (m, _, _, _, _) if m.is_nan() => "- | - | -".to_owned(),
        (m, _, max, util, _) => format!("{m:.3} | {max:.2} | {util:.3}"),
    };
    format!(
        "| {keys} | {limits} | {} | {} | {} | {mean:.3} | {p99:.2} | {max:.2} | {util:.3} | \
         {util_p5:.2} | {steady_ratios} | {:.3} | {:.4} | {:.0} | {:.0} | {:.0} | {:.0} | {} | \
         {:.0} us | {} | {took:.1} |",
        spread.name(),
        mode.name(),
        o.ratios.len(),
        per(o.hops, o.decisions),
        per(o.phase_hops[steady], o.phase_decisions[steady]),
        (o.peer_calls - o.background_calls) as f64 / node_secs,
        o.background_calls as f64 / node_secs,
        o.renewed_keys as f64 / node_secs,
        per(o.held_sum, o.held_ticks),
        o.held_max,
        per(o.added_latency_us, o.decisions),
        o.errors,
    )
}
