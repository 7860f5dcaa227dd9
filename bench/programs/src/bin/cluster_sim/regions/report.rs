//! The regions section's runs and tables.

use super::{
    BIN_US, CROSS_US, Keys, NODE_RENEW_US, NODES, Outcome, Phase, REGIONS, ROOT_RENEW_US, Script,
    Sim, TO, Topology, WEIGHTS_AFTER, WEIGHTS_BEFORE, window,
};
use crate::{EPOCH_US, HOP_US};

/// Requests per second over every region.
const RATE: f64 = 8_000.0;
/// The windows counted are offered at least this many times their limit. The other sections
/// count windows offered twice their limit (`docs/cluster.md`, "Simulation"); here key 0,
/// whose demand moves, is offered 1.7 times its limit, and at 2 no window of a limit of 1,000
/// would count (at 2 the utilisation is higher: 0.85 tree, 0.91 flat, 0.79 static, `--quick`).
const HOT: u32 = 1;
const TOPOLOGIES: [Topology; 3] = [Topology::Tree, Topology::Static, Topology::Flat];

/// The regions section: every topology on the same arrivals, then the tree at four times
/// the request rate (its parent calls must not grow with it).
pub(crate) fn table(seed: u64, quick: bool) {
    let k = Keys::new();
    let s = Script::new(quick);
    let secs = |us: u64| us as f64 / 1e6;
    println!(
        "\n### One limit across regions (issue 39): {REGIONS} regions of {NODES} nodes, \
         {RATE} requests/s, {} keys (Zipf 1.1), limits 1000/100/10 per second\n\n\
         Cross-region latency {}-{} ms one way, in-region {}-{} us; nodes renew every {} ms, \
         region owners at the root every {} ms. Demand per region {WEIGHTS_BEFORE:?}, moved \
         to {WEIGHTS_AFTER:?} at {:.1} s; root lost {:.1}-{:.1} s; region 2 cut off \
         {:.1}-{:.1} s; {:.0} s simulated. Windows counted: whole 1 s windows offered at \
         least {HOT}× their limit.\n",
        super::KEYS,
        CROSS_US.0 / 1000,
        CROSS_US.1 / 1000,
        HOP_US.0,
        HOP_US.1,
        NODE_RENEW_US / 1000,
        ROOT_RENEW_US / 1000,
        secs(s.moved),
        secs(s.root_lost),
        secs(s.root_back),
        secs(s.cut),
        secs(s.healed),
        secs(s.end),
    );
    let (offered, fair) = key0_after(&k, RATE);
    println!(
        "Key 0 (limit {}) after the move: offered {offered:?} per second by region, max-min \
         fair parts {fair:?}; the static split holds {} per region.\n",
        k.limits[0],
        k.limits[0] / REGIONS as u32
    );
    let mut runs = Vec::new();
    for topo in TOPOLOGIES {
        let start = sluice::clock::instant();
        let out = Sim::new(topo, &k, s, RATE, seed).run();
        eprintln!("regions {topo:?}: {:.1} s", start.elapsed().as_secs_f64());
        runs.push((topo, RATE, out));
    }
    let out = Sim::new(Topology::Tree, &k, s, 4.0 * RATE, seed).run();
    runs.push((Topology::Tree, 4.0 * RATE, out));
    summary(&k, s, &runs);
    phases(&k, s, &runs[..TOPOLOGIES.len()]);
    classes(&k, s, &runs[..TOPOLOGIES.len()]);
    if !quick {
        intervals(&k, s, seed);
    }
}

/// The tree with the region owners renewing at the root at other intervals.
fn intervals(k: &Keys, s: Script, seed: u64) {
    println!(
        "\n| tree, region owners renew at the root every | admitted/limit mean | p99 | max | \
         utilisation mean | steady utilisation | cross-region calls/s, region 0 | key 0 moves |\n\
         |---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for ms in [100, 200, 400] {
        let out = Sim::new(Topology::Tree, k, s, RATE, seed)
            .root_renewing(ms * 1000)
            .run();
        let (mean, p99, max, util, _) = stats(&ratios(k, s, &out, |_| true));
        let steady = stats(&ratios(k, s, &out, |p| p == Phase::Steady)).3;
        let moved = move_time(k, s, &out, RATE)
            .map_or_else(|| "never".into(), |t| format!("{:.1} s", t as f64 / 1e6));
        println!(
            "| {ms} ms | {mean:.3} | {p99:.2} | {max:.2} | {util:.3} | {steady:.3} | {:.1} | \
             {moved} |",
            out.cross_calls[0] as f64 / (s.end as f64 / 1e6)
        );
    }
}

/// Steady windows by the key's limit.
fn classes(k: &Keys, s: Script, runs: &[(Topology, f64, Outcome)]) {
    println!(
        "\n| topology | steady windows, limit | windows | admitted/limit mean | p99 | max | \
         utilisation mean | p5 |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (topo, _, out) in runs {
        for limit in [1000, 100, 10] {
            let r = ratios_of(k, s, out, |p, l| p == Phase::Steady && l == limit);
            let (mean, p99, max, util, p5) = stats(&r);
            println!(
                "| {} | {limit} | {} | {mean:.3} | {p99:.2} | {max:.2} | {util:.3} | {p5:.2} |",
                topo.name(),
                r.len()
            );
        }
    }
}

fn summary(k: &Keys, s: Script, runs: &[(Topology, f64, Outcome)]) {
    println!(
        "| topology | requests/s | windows | admitted/limit mean | p99 | max | utilisation \
         mean | p5 | cross-region calls/s: region 0 | 1 | 2 | wait mean | unanswered | \
         key 0 moves to region {TO} (to 90% of its fair part) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    let secs = s.end as f64 / 1e6;
    for (topo, rate, out) in runs {
        let r = ratios(k, s, out, |_| true);
        let (mean, p99, max, util, p5) = stats(&r);
        let calls = out.cross_calls.map(|c| c as f64 / secs);
        let moved = move_time(k, s, out, *rate)
            .map_or_else(|| "never".into(), |t| format!("{:.1} s", t as f64 / 1e6));
        println!(
            "| {} | {rate} | {} | {mean:.3} | {p99:.2} | {max:.2} | {util:.3} | {p5:.2} | \
             {:.1} | {:.1} | {:.1} | {:.1} ms | {} | {moved} |",
            topo.name(),
            r.len(),
            calls[0],
            calls[1],
            calls[2],
            out.waited_us as f64 / out.decisions.max(1) as f64 / 1000.0,
            out.errors,
        );
    }
}

fn phases(k: &Keys, s: Script, runs: &[(Topology, f64, Outcome)]) {
    println!(
        "\n| topology | phase | windows | admitted/limit mean | p99 | max | utilisation mean | \
         p5 |\n|---|---|---:|---:|---:|---:|---:|---:|"
    );
    for (topo, _, out) in runs {
        for phase in Phase::ALL {
            let r = ratios(k, s, out, |p| p == phase);
            let (mean, p99, max, util, p5) = stats(&r);
            println!(
                "| {} | {} | {} | {mean:.3} | {p99:.2} | {max:.2} | {util:.3} | {p5:.2} |",
                topo.name(),
                phase.name(),
                r.len()
            );
        }
    }
}

/// Sorted admitted/limit of the whole windows offered at least [`HOT`] times their limit, in
/// the phases
/// `keep` takes.
fn ratios(k: &Keys, s: Script, out: &Outcome, keep: impl Fn(Phase) -> bool) -> Vec<f64> {
    ratios_of(k, s, out, |p, _| keep(p))
}

/// [`ratios`], `keep` taking the phase and the key's limit.
fn ratios_of(k: &Keys, s: Script, out: &Outcome, keep: impl Fn(Phase, u32) -> bool) -> Vec<f64> {
    let first = window(0);
    let mut r: Vec<f64> = out
        .windows
        .iter()
        .filter_map(|(&(key, win), &(offered, admitted))| {
            let limit = k.limits[key as usize];
            let start = (win * 1_000_000).checked_sub(EPOCH_US)?;
            let whole = win > first && start + 1_000_000 <= s.end;
            (whole && offered >= HOT * limit && keep(s.phase(start), limit))
                .then(|| f64::from(admitted) / f64::from(limit))
        })
        .collect();
    r.sort_by(f64::total_cmp);
    r
}

/// (mean, p99, max, utilisation mean, utilisation p5), utilisation being min(ratio, 1).
fn stats(sorted: &[f64]) -> (f64, f64, f64, f64, f64) {
    if sorted.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN);
    }
    let n = sorted.len() as f64;
    let at = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize];
    (
        sorted.iter().sum::<f64>() / n,
        at(0.99),
        sorted[sorted.len() - 1],
        sorted.iter().map(|r| r.min(1.0)).sum::<f64>() / n,
        at(0.05).min(1.0),
    )
}

/// How long after the demand moved region [`TO`] first admits, within one window, 90% of its
/// max-min fair part of key 0's limit: the time to the bin where it got there (`None`: not
/// before the root is lost). Counted within windows: a sum over any second would straddle
/// two windows' allowances.
fn move_time(k: &Keys, s: Script, out: &Outcome, rate: f64) -> Option<u64> {
    let fair = key0_after(k, rate).1[TO];
    let per_window = (1_000_000 / BIN_US) as usize;
    let first = (s.moved / BIN_US) as usize;
    let last = (s.root_lost / BIN_US) as usize;
    let mut admitted = 0;
    for b in first..last {
        // Bins start at whole seconds of the run, as windows do (the epoch is a whole minute).
        if b % per_window == 0 {
            admitted = 0;
        }
        admitted += u64::from(out.bins[b][TO]);
        if admitted * 10 >= fair * 9 {
            return Some((b as u64 + 1) * BIN_US - s.moved);
        }
    }
    None
}

/// Key 0's offered rate per region after the move, and the regions' max-min fair parts of
/// its limit.
fn key0_after(k: &Keys, rate: f64) -> ([u64; REGIONS], Vec<u64>) {
    let offered = WEIGHTS_AFTER.map(|w| (rate * k.share(0) * w) as u64);
    let fair = max_min_fair(u64::from(k.limits[0]), &offered);
    (offered, fair)
}

/// Max-min fair parts of `capacity` for `demands` (Doorman's rule; the library's own is
/// crate-private).
fn max_min_fair(capacity: u64, demands: &[u64]) -> Vec<u64> {
    let mut parts = vec![0; demands.len()];
    let mut left = capacity;
    let mut open: Vec<usize> = (0..demands.len()).collect();
    open.sort_by_key(|&i| demands[i]);
    while let Some(&i) = open.first() {
        let share = left / open.len() as u64;
        let part = demands[i].min(share);
        parts[i] = part;
        left -= part;
        open.remove(0);
    }
    parts
}
