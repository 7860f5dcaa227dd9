//! A plain loop over `RateLimitService::should_rate_limit` on the memory store, for profilers
//! (criterion's own machinery would dominate a profile). Each call gets a fresh clone of one
//! prebuilt request, as the gRPC adapter hands over a freshly decoded one, and each answer's
//! statuses are given back as the adapters do.
//!
//! ```sh
//! cargo build --release --example decision_profile
//! valgrind --tool=callgrind --toggle-collect='*should_rate_limit*' \
//!     target/release/examples/decision_profile 200000
//! callgrind_annotate --inclusive=yes callgrind.out.<pid>
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark's or load generator's own stopwatch, outside Sluice"
)]
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use sluice::clock::SystemClock;
use sluice::config::{ConfigHandle, LoadOptions, parse_files};
use sluice::descriptor::{Descriptor, Entry, Request};
use sluice::service::{RateLimitService, ServiceOptions};
use sluice::store::MemoryStore;
use sluice::telemetry::{DecisionTelemetry, Stats};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(1_000_000, |s| s.parse().expect("N is a count"));
    let yaml = include_str!("../bench/config/bench.yaml");
    let config = parse_files(
        &[("bench.yaml".into(), yaml.into())],
        &LoadOptions::default(),
    )
    .expect("bench config loads");
    let service = RateLimitService::new(
        ConfigHandle::new(Some(config)),
        Arc::new(MemoryStore::new(1_000)),
        Arc::new(SystemClock),
        ServiceOptions::default(),
    )
    // Stats on, as a service runs by default.
    .with_observer(Arc::new(DecisionTelemetry::untraced(Arc::new(
        Stats::default(),
    ))));
    let request = Request {
        domain: "bench".into(),
        descriptors: vec![Descriptor {
            entries: vec![Entry::new("client", "c0")],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let waker = Waker::noop();
    let start = Instant::now();
    let mut ok = 0u64;
    for _ in 0..n {
        let fut = pin!(service.should_rate_limit(request.clone()));
        if let Poll::Ready(Ok(r)) = fut.poll(&mut Context::from_waker(waker)) {
            ok += u64::from(r.statuses[0].current_limit.is_some());
            // As the gRPC and HTTP adapters do once the answer is written.
            r.recycle();
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(ok, n, "every call is counted");
    println!(
        "{n} decisions in {elapsed:?}: {:.0} ns each, request clone included",
        elapsed.as_nanos() as f64 / n as f64
    );
}
