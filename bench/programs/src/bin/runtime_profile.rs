//! Plain loops of lookups and decisions on one of 100,000 tenant limits, in the YAML or set at
//! run time (issue 38), for callgrind: on this shared machine criterion's times move by more
//! than the 10% the issue asks about, instruction counts do not.
//!
//! CONFIG is one of `yaml_100k`, `runtime_100k`, `yaml_100k_runtime_miss` (as in
//! `benches/decision.rs`'s `runtime_limits`). Each loop runs N times in a function of its own:
//! `lookup_one` (the same tenant each call), `lookup_all` (the next of the 100,000 tenants in a
//! shuffled order each call) and `decide` (`should_rate_limit` for one tenant on the memory
//! store, stats on, the request cloned each call as in `decision_profile`). Each prints its
//! time per call; callgrind's inclusive count of each function divided by N is its
//! instructions per call.
//!
//! ```sh
//! cargo build --release -p sluice-bench --bin runtime_profile
//! valgrind --tool=callgrind --callgrind-out-file=yaml.out target/release/runtime_profile yaml_100k 100000
//! callgrind_annotate --inclusive=yes yaml.out | grep runtime_profile::
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark's or load generator's own stopwatch, outside Sluice"
)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use sluice::clock::SystemClock;
use sluice::config::{ConfigHandle, Domain};
use sluice::descriptor::{Descriptor, Entry, Request};
use sluice::service::{RateLimitService, ServiceOptions};
use sluice::store::MemoryStore;
use sluice::telemetry::{DecisionTelemetry, Stats};
use sluice_test_support::bench::ready::ready;
use sluice_test_support::bench::tenants;

/// High enough that every decision is OK.
const TENANT_LIMIT: u32 = 1_000_000_000;

#[inline(never)]
fn lookup_one(domain: &Domain, entries: &[Entry], n: u64) -> u64 {
    let mut found = 0;
    for _ in 0..n {
        found += u64::from(domain.lookup(black_box(entries)).is_some());
    }
    found
}

#[inline(never)]
fn lookup_all(domain: &Domain, all: &[Vec<Entry>], n: u64) -> u64 {
    let mut found = 0;
    for e in all
        .iter()
        .cycle()
        .take(usize::try_from(n).unwrap_or(usize::MAX))
    {
        found += u64::from(domain.lookup(black_box(e)).is_some());
    }
    found
}

#[inline(never)]
fn decide(service: &RateLimitService<MemoryStore>, request: &Request, n: u64) -> u64 {
    let mut counted = 0;
    for _ in 0..n {
        if let Ok(r) = ready(service.should_rate_limit(request.clone())) {
            counted += u64::from(r.statuses[0].current_limit.is_some());
            r.recycle();
        }
    }
    counted
}

/// Runs `f`, checks it counted `n`, and prints its time per call.
fn timed(name: &str, n: u64, f: impl FnOnce() -> u64) {
    let t = Instant::now();
    let counted = f();
    let took = t.elapsed();
    assert_eq!(counted, n, "{name}: every call matched");
    println!("{name}: {:.0} ns a call", took.as_nanos() as f64 / n as f64);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "runtime_100k".to_owned());
    let n: u64 = args
        .next()
        .map_or(100_000, |a| a.parse().expect("N: a count"));
    let Some(at) = tenants::CONFIGS.iter().position(|c| *c == which) else {
        eprintln!("runtime_profile: CONFIG is one of {:?}", tenants::CONFIGS);
        std::process::exit(2);
    };
    // All three built, whichever is measured, so that each run's heap is alike.
    let configs = tenants::configs(TENANT_LIMIT);
    let config: &ConfigHandle = &configs[at];
    let served = config.current().expect("a config");
    let domain = served.domain("d").expect("domain d");
    let hit = vec![Entry::new("tenant", "t54321")];
    let all: Vec<Vec<Entry>> = tenants::shuffled()
        .into_iter()
        .map(|t| vec![Entry::new("tenant", t)])
        .collect();
    let service = RateLimitService::new(
        config.clone(),
        Arc::new(MemoryStore::new(1_000)),
        Arc::new(SystemClock),
        ServiceOptions::default(),
    )
    // Stats on, as a service runs by default.
    .with_observer(Arc::new(DecisionTelemetry::untraced(Arc::new(
        Stats::default(),
    ))));
    let request = Request {
        domain: "d".into(),
        descriptors: vec![Descriptor {
            entries: hit.clone(),
            ..Default::default()
        }],
        hits_addend: 1,
    };
    println!("runtime_profile {which}, {n} calls each:");
    timed("lookup_one", n, || lookup_one(domain, &hit, n));
    timed("lookup_all", n, || lookup_all(domain, &all, n));
    timed("decide", n, || decide(&service, &request, n));
}
