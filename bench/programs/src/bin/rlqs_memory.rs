//! Bytes per bucket of the Rate Limit Quota Service's table, against what SLUICE_RLQS_MAX_BYTES
//! charges: N buckets (`tenant: <id>`, ids of 7 to 11 bytes, key-only rule) each reported by H
//! Envoy streams. Reads resident memory (VmRSS) before and after filling the table, and prints
//! bytes per bucket, keys and bucket ids included, beside the charge; exits 1 when it passes the
//! charge (so `bench/run.sh`, which runs it, fails).
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin rlqs_memory -- 100000 3
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a program measuring memory; it reads no clock"
)]

use std::sync::Arc;

use sluice::clock::{ManualClock, Timestamp};
use sluice::config::{ConfigHandle, LoadOptions, parse_files};
use sluice::descriptor::Entry;
use sluice::rlqs::{RlqsOptions, RlqsService, Usage};
use sluice_test_support::bench::rss::rss_bytes;

const CONFIG: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100}\n";

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let holders: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let config =
        parse_files(&[("m.yaml".into(), CONFIG.into())], &LoadOptions::default()).expect("config");
    let options = RlqsOptions {
        max_bytes: usize::MAX,
        ..RlqsOptions::default()
    };
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_000));
    let service = Arc::new(RlqsService::new(
        ConfigHandle::new(Some(config)),
        Arc::new(clock),
        options,
    ));
    let before = rss_bytes();
    let mut streams: Vec<_> = (0..holders).map(|_| service.open()).collect();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        for s in &mut streams {
            let usages = chunk
                .iter()
                .map(|i| Usage {
                    id: vec![Entry::new("tenant", format!("t{i:06}"))],
                    attempted: 1,
                })
                .collect();
            let actions = s.report("edge", usages).expect("report");
            assert_eq!(actions.len(), chunk.len());
        }
    }
    let used = rss_bytes().saturating_sub(before);
    let gauges = service.gauges();
    assert_eq!((gauges.buckets, gauges.holders), (n, n * holders));
    let per = |bytes: u64| bytes as f64 / n as f64;
    let (measured, charged) = (per(used), per(gauges.bytes as u64));
    println!(
        "rlqs_memory: {n} buckets (keys of 20 to 24 bytes), {holders} Envoys each\n\
         {measured:.0} bytes per bucket with its holders, charged {charged:.0}",
    );
    // SLUICE_RLQS_MAX_BYTES is a bound only while the charge covers the real cost.
    if measured > charged {
        eprintln!(
            "rlqs_memory: the table uses more than it is charged: raise the charges in src/rlqs"
        );
        std::process::exit(1);
    }
}
