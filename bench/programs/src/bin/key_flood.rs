//! Resident memory under a flood of large distinct descriptor values (issue 14's finding: 8 KB
//! values over gRPC made 100k counters cost 840 MB), with and without Sluice's byte caps.
//!
//! Sends N requests, each with one distinct VALUE_BYTES-long `user` value, through
//! `RateLimitService` on a memory store with Sluice's limits (SLUICE_MAX_COUNTERS 1,000,000 and
//! the given SLUICE_MAX_KEY_BYTES and SLUICE_MAX_COUNTER_BYTES; 0 means no cap, which is how
//! Sluice behaved before the caps), and prints what was admitted and refused, the store's
//! accounted bytes and VmRSS growth. Not a test: a measurement, in release mode.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin key_flood -- 100000 8192 0 0           # no caps (before)
//! cargo run --release -p sluice-bench --bin key_flood -- 100000 8192 4096 268435456 # the defaults
//! cargo run --release -p sluice-bench --bin key_flood -- 100000 8192 16384 268435456 # the budget alone
//! ```

use std::sync::Arc;

use sluice::clock::{ManualClock, Timestamp};
use sluice::config::{ConfigHandle, LoadOptions, parse_files};
use sluice::descriptor::{Descriptor, Entry, Request};
use sluice::service::{RateLimitService, ServiceError, ServiceOptions};
use sluice::store::{MemoryLimits, MemoryStore, StoreError};
use sluice::telemetry::{DecisionTelemetry, Stats};
use sluice_test_support::bench::ready::ready;
use sluice_test_support::bench::rss::rss_bytes;

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

fn arg(args: &[String], i: usize, default: usize) -> usize {
    let n = args
        .get(i)
        .map_or(default, |s| s.parse().expect("arguments are counts"));
    if n == 0 { usize::MAX } else { n }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = arg(&args, 0, 100_000);
    let value_bytes = arg(&args, 1, 8192);
    let max_key_bytes = arg(&args, 2, 4096);
    let max_bytes = arg(&args, 3, 256 << 20);
    let cfg = parse_files(
        &[("edge.yaml".to_string(), CONFIG.to_string())],
        &LoadOptions::default(),
    )
    .expect("config loads");
    let store = Arc::new(MemoryStore::with_limits(MemoryLimits {
        max_counters: 1_000_000,
        max_bytes,
    }));
    let service = RateLimitService::new(
        ConfigHandle::new(Some(cfg)),
        store.clone(),
        Arc::new(ManualClock::new(Timestamp::from_secs(1_700_000_000))),
        ServiceOptions {
            max_key_bytes,
            ..ServiceOptions::default()
        },
    )
    .with_observer(Arc::new(DecisionTelemetry::untraced(Arc::new(
        Stats::default().with_max_key_bytes(max_key_bytes),
    ))));
    let (mut admitted, mut too_long, mut full) = (0, 0, 0);
    let before = rss_bytes();
    for i in 0..n {
        let request = Request {
            domain: "edge".into(),
            descriptors: vec![Descriptor {
                entries: vec![Entry::new("user", format!("{i:0value_bytes$}"))],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        match ready(service.should_rate_limit(request)) {
            Ok(_) => admitted += 1,
            Err(ServiceError::KeyTooLong { .. }) => too_long += 1,
            Err(ServiceError::Store(StoreError::Full { .. } | StoreError::FullBytes { .. })) => {
                full += 1
            }
            Err(e) => panic!("{e}"),
        }
    }
    let after = rss_bytes();
    let cap = |n: usize| {
        if n == usize::MAX {
            "none".to_string()
        } else {
            n.to_string()
        }
    };
    println!("requests {n}, values of {value_bytes} bytes");
    println!(
        "max_key_bytes {}, max_counter_bytes {}",
        cap(max_key_bytes),
        cap(max_bytes)
    );
    println!("admitted {admitted}, refused_key_too_long {too_long}, refused_store_full {full}");
    println!("live_counters {}", store.live_counters());
    println!("accounted_bytes {}", store.counter_bytes());
    println!("rss_before_bytes {before}");
    println!("rss_after_bytes {after}");
    println!(
        "rss_growth_mib {:.1}",
        after.saturating_sub(before) as f64 / f64::from(1 << 20)
    );
}
