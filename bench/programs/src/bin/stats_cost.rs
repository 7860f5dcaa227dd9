//! What recording stats costs a decision: `should_rate_limit` on the memory store in a loop,
//! with stats on and off (DISABLE_STATS), on one thread and on several threads sharing one
//! hot limit. A plain timing loop, not a test; run it in release mode:
//!
//! ```text
//! cargo run --release -p sluice-bench --bin stats_cost [-- ITERATIONS]
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark's or load generator's own stopwatch, outside Sluice"
)]
use std::sync::Arc;
use std::time::Instant;

use sluice::clock::{ManualClock, Timestamp};
use sluice::config::{ConfigHandle, LoadOptions, parse_files};
use sluice::descriptor::{Descriptor, Entry, Request};
use sluice::service::{RateLimitService, ServiceOptions};
use sluice::store::MemoryStore;
use sluice::telemetry::{DecisionTelemetry, Stats};

const CONFIG: &str = r#"
domain: bench
descriptors:
  - key: k
    value: v
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1000000000}
"#;

fn service(stats_on: bool) -> Arc<RateLimitService<MemoryStore>> {
    let cfg = parse_files(
        &[("bench.yaml".to_string(), CONFIG.to_string())],
        &LoadOptions::default(),
    )
    .expect("config loads");
    let stats = if stats_on {
        Stats::default()
    } else {
        Stats::disabled()
    };
    Arc::new(
        RateLimitService::new(
            ConfigHandle::new(Some(cfg)),
            Arc::new(MemoryStore::new(1_000_000)),
            Arc::new(ManualClock::new(Timestamp::from_secs(1_000_000_000))),
            ServiceOptions::default(),
        )
        .with_observer(Arc::new(DecisionTelemetry::untraced(Arc::new(stats)))),
    )
}

fn request(key: &str, value: &str) -> Request {
    Request {
        domain: "bench".into(),
        descriptors: vec![Descriptor {
            entries: vec![Entry::new(key, value)],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

/// Nanoseconds per call over `iterations` calls on each of `threads` threads.
fn run(
    svc: &Arc<RateLimitService<MemoryStore>>,
    threads: usize,
    iterations: usize,
    detailed: bool,
) -> f64 {
    let requests: Vec<Request> = if detailed {
        (0..1000)
            .map(|i| request("user", &format!("u{i}")))
            .collect()
    } else {
        vec![request("k", "v")]
    };
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let svc = Arc::clone(svc);
            let requests = &requests;
            s.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    for i in 0..iterations {
                        let r = requests[i % requests.len()].clone();
                        std::hint::black_box(svc.should_rate_limit(r).await.expect("decides"));
                    }
                });
            });
        }
    });
    started.elapsed().as_nanos() as f64 / iterations as f64
}

fn main() {
    let iterations: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get().min(8));
    println!("{iterations} calls per thread; ns per call (lower is better)");
    println!(
        "{:<34} {:>10} {:>10} {:>8}",
        "scenario", "stats off", "stats on", "cost"
    );
    for (name, threads, detailed) in [
        ("one limit, 1 thread", 1, false),
        ("detailed_metric, 1000 keys, 1 thread", 1, true),
        ("one hot limit, N threads", threads, false),
    ] {
        // Warm up, then take the best of three runs of each.
        let mut best = [f64::MAX; 2];
        for _ in 0..3 {
            for (i, on) in [false, true].into_iter().enumerate() {
                let svc = service(on);
                run(&svc, threads, iterations / 10, detailed);
                best[i] = best[i].min(run(&svc, threads, iterations, detailed));
            }
        }
        let name = if threads > 1 {
            name.replace('N', &threads.to_string())
        } else {
            name.to_owned()
        };
        println!(
            "{name:<34} {:>10.1} {:>10.1} {:>+7.1}%",
            best[0],
            best[1],
            (best[1] / best[0] - 1.0) * 100.0
        );
    }
}
