//! Draws `docs/algorithms.svg`: the same bursty traffic through each algorithm, with the number
//! of requests admitted in the trailing second against the limit.
//!
//! ```sh
//! cargo run -p sluice-bench --bin algorithms_chart            # rewrites docs/algorithms.svg
//! ```
//!
//! Traffic (deterministic): a steady 5 requests per second; a burst of 30 requests in the last
//! 100 ms before the 1 s boundary and another 30 in the first 100 ms after it; and from 3 s to
//! 5 s a client sending 20 per second, twice the limit. The limit is 10 per second; the token
//! bucket holds 10 tokens, the leaky bucket tolerates a burst of 5 (nginx `burst=5 nodelay`).

use std::fmt::Write as _;
use std::num::NonZeroU32;

use sluice::limiter::fixed_window;
use sluice::limiter::{Algorithm, Quota, Unit, bucket, sliding_window};

const LIMIT: u32 = 10;
const START_US: u64 = 1_000_000_000 * 1_000_000; // an epoch-aligned second
const SPAN_US: u64 = 6_000_000;

fn traffic() -> Vec<u64> {
    let mut t = Vec::new();
    for i in 0..30 {
        t.push(i * 200_000 + 100_000); // 5 per second
    }
    for i in 0..30 {
        t.push(900_000 + i * 3_300); // 30 just before 1 s
        t.push(1_000_000 + i * 3_300); // 30 just after
    }
    for i in 0..40 {
        t.push(3_000_000 + i * 50_000); // 20 per second for 2 s
    }
    t.sort_unstable();
    t
}

/// Runs `arrivals` (µs after START) through one algorithm; returns the admitted times.
fn admitted(algorithm: Algorithm, arrivals: &[u64]) -> Vec<u64> {
    let quota = Quota {
        penalty: None,
        safe_capacity: None,
        requests_per_unit: LIMIT,
        unit: Unit::Second,
        algorithm,
        burst: match algorithm {
            Algorithm::TokenBucket => NonZeroU32::new(10),
            Algorithm::LeakyBucket => NonZeroU32::new(5),
            _ => None,
        },
        charge_refused: false,
        unit_multiplier: 1,
        calendar: sluice::limiter::Calendar::EPOCH,
    };
    let (mut s64, mut s128) = (0u64, 0u128);
    let mut out = Vec::new();
    for &dt in arrivals {
        let now = START_US + dt;
        let over = match algorithm {
            Algorithm::FixedWindow => {
                let (d, s) =
                    fixed_window::decide(s64, now / 1_000_000, Unit::Second.into(), LIMIT, 1);
                s64 = s;
                d.over
            }
            Algorithm::SlidingWindow => {
                let (d, s) =
                    sliding_window::decide(s128, now, Unit::Second.into(), LIMIT, 1, false);
                s128 = s;
                d.over
            }
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                let (d, s) = bucket::decide(s128, now, &quota, 1);
                s128 = s;
                d.over
            }
            // Not a rate: its slots come back with refunds (docs/algorithms.md, Concurrency).
            Algorithm::Concurrency => unreachable!("the chart draws Algorithm::RATES"),
        };
        if !over {
            out.push(dt);
        }
    }
    out
}

#[expect(
    clippy::too_many_lines,
    reason = "a one-off report's steps, read top to bottom"
)]
fn main() -> std::io::Result<()> {
    let arrivals = traffic();
    let (w, panel_h, left, top) = (900.0, 150.0, 60.0, 40.0);
    let plot_w = w - left - 20.0;
    let y_max = 2.5 * f64::from(LIMIT);
    let mut svg = String::new();
    let height = top + 4.0 * (panel_h + 30.0) + 20.0;
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{left}" y="22" font-size="15">Requests admitted in the trailing second (limit {LIMIT}/s); ticks: grey offered, colour admitted</text>
"##
    );
    let colours = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];
    for (i, algorithm) in Algorithm::RATES.into_iter().enumerate() {
        let ok = admitted(algorithm, &arrivals);
        let y0 = top + i as f64 * (panel_h + 30.0);
        let x = |t: u64| left + plot_w * t as f64 / SPAN_US as f64;
        let y = |v: f64| y0 + panel_h - panel_h * v.min(y_max) / y_max;
        let _ = write!(
            svg,
            r##"<text x="{left}" y="{}" font-weight="bold">{} ({} of {} admitted)</text>
<rect x="{left}" y="{y0}" width="{plot_w}" height="{panel_h}" fill="none" stroke="#999"/>
<line x1="{left}" x2="{}" y1="{}" y2="{}" stroke="#555" stroke-dasharray="4 3"/>
<text x="8" y="{}">limit</text>
<line x1="{left}" x2="{}" y1="{}" y2="{}" stroke="#bbb" stroke-dasharray="2 4"/>
<text x="8" y="{}">2×</text>
"##,
            y0 - 5.0,
            algorithm.name(),
            ok.len(),
            arrivals.len(),
            left + plot_w,
            y(f64::from(LIMIT)),
            y(f64::from(LIMIT)),
            y(f64::from(LIMIT)) + 4.0,
            left + plot_w,
            y(2.0 * f64::from(LIMIT)),
            y(2.0 * f64::from(LIMIT)),
            y(2.0 * f64::from(LIMIT)) + 4.0,
        );
        for &t in &arrivals {
            let _ = write!(
                svg,
                r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2}" stroke="#ccc"/>"##,
                x(t),
                y0 + panel_h - 8.0,
                y0 + panel_h
            );
        }
        for &t in &ok {
            let _ = write!(
                svg,
                r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2}" stroke="{3}"/>"##,
                x(t),
                y0 + panel_h - 16.0,
                y0 + panel_h - 8.0,
                colours[i]
            );
        }
        // Trailing-second count, sampled every 10 ms.
        let mut points = String::new();
        for step in 0..=(SPAN_US / 10_000) {
            let t = step * 10_000;
            let n = ok.iter().filter(|&&a| a <= t && a + 1_000_000 > t).count();
            let _ = write!(points, "{:.1},{:.1} ", x(t), y(n as f64));
        }
        let _ = writeln!(
            svg,
            r##"<polyline points="{points}" fill="none" stroke="{}" stroke-width="2"/>"##,
            colours[i]
        );
        for s in 0..=6 {
            let _ = write!(
                svg,
                r##"<text x="{:.1}" y="{}" text-anchor="middle" fill="#555">{s}s</text>"##,
                x(s * 1_000_000),
                y0 + panel_h + 14.0
            );
        }
        svg.push('\n');
    }
    svg.push_str("</svg>\n");
    // The repository's root: this package is bench/programs.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2);
    let path = root
        .expect("bench/programs has a grandparent")
        .join("docs/algorithms.svg");
    std::fs::write(&path, svg)?;
    println!("wrote {}", path.display());
    for algorithm in Algorithm::RATES {
        let ok = admitted(algorithm, &arrivals);
        let peak = (0..SPAN_US / 10_000)
            .map(|s| {
                let t = s * 10_000;
                ok.iter().filter(|&&a| a <= t && a + 1_000_000 > t).count()
            })
            .max()
            .unwrap_or(0);
        println!(
            "{:<15} admitted {:>3} of {}, peak in any trailing second {peak}",
            algorithm.name(),
            ok.len(),
            arrivals.len()
        );
    }
    Ok(())
}
