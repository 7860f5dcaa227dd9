//! The memory store at N live counters (issue 40's scale envelope): bytes per counter, the
//! decision's latency on a live counter, and the sweeper's cost.
//!
//! Fills a [`MemoryStore`] with N fixed-window counters whose keys look like the service's
//! counter key stems for an IPv4 `remote_address` descriptor (27 to 35 bytes), reading resident
//! memory (VmRSS) before and after. Then times [`CounterStore::apply`] one call at a time on
//! counters picked at random (SAMPLES calls, default 200,000): p50 and p99 in nanoseconds, the
//! clock's own cost included (about 20 ns here); then the same while another thread sweeps the
//! store in a loop, as SLUICE_SWEEP_INTERVAL_SECS's task does (a sweep holds each map shard
//! while it walks it). Last, the sweeper's pass over the N counters when none has expired (its
//! cost every SLUICE_SWEEP_INTERVAL_SECS, 10 s by default, as a share of one core) and when all
//! have (the pass that frees them). Prints one JSON line on stdout and exits 1 when a counter
//! is missing or a pass removes the wrong number.
//!
//! ```sh
//! cargo run --release --example scale_counters -- 1000000
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark's own stopwatch, outside Sluice"
)]

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice::clock::Timestamp;
use sluice::limiter::{Decision, Quota, Unit};
use sluice::store::{CounterStore, Hit, MemoryStore};

#[path = "support/rss.rs"]
mod rss;
use rss::rss_bytes;

#[path = "support/ready.rs"]
mod ready;
use ready::ready;

/// The memory store's future is always ready.
fn apply(store: &MemoryStore, now: Timestamp, hit: Hit<'_>, out: &mut Vec<Decision>) {
    ready(store.apply(now, &[hit], out)).expect("the store has room for every counter");
}

/// Counter `i`'s key: an address-like stem, distinct for every `i` below 2^32.
fn write_key(key: &mut String, i: u64) {
    key.clear();
    let _ = write!(
        key,
        "edge_remote_address_{}.{}.{}.{}_",
        (i >> 24) & 0xff,
        (i >> 16) & 0xff,
        (i >> 8) & 0xff,
        i & 0xff
    );
}

/// A small, fast generator for the sample's counters (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// p50 and p99 of `samples` (ns), sorted in place.
fn percentiles(samples: &mut [u64]) -> (u64, u64) {
    samples.sort_unstable();
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
    (at(0.50), at(0.99))
}

/// Times `samples` decisions on random live counters, one at a time: p50 and p99 (ns).
fn decisions(
    store: &MemoryStore,
    n: u64,
    samples: usize,
    quota: Quota,
    now: Timestamp,
) -> Vec<u64> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut key = String::with_capacity(40);
    let mut out = Vec::with_capacity(1);
    let mut took = Vec::with_capacity(samples);
    for _ in 0..samples {
        write_key(&mut key, rng.below(n));
        out.clear();
        let hit = Hit {
            key: &key,
            quota,
            hits: 1,
        };
        let t = Instant::now();
        apply(store, now, hit, &mut out);
        took.push(t.elapsed().as_nanos() as u64);
        assert!(
            !out[0].over,
            "a counter at one or two hits of 1000 is not over"
        );
    }
    took
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map_or(1_000_000, |s| s.parse().expect("N is a count"));
    let samples: usize = args
        .next()
        .map_or(200_000, |s| s.parse().expect("SAMPLES is a count"));
    let now = Timestamp::from_secs(1_700_000_040);
    let quota = Quota::fixed(1000, Unit::Minute);
    let store = MemoryStore::new(usize::try_from(n).expect("N fits"));
    let mut out = Vec::with_capacity(1);
    let mut key = String::with_capacity(40);
    let before = rss_bytes();
    let filled = Instant::now();
    for i in 0..n {
        write_key(&mut key, i);
        out.clear();
        let hit = Hit {
            key: &key,
            quota,
            hits: 1,
        };
        apply(&store, now, hit, &mut out);
    }
    let fill_s = filled.elapsed().as_secs_f64();
    let rss = rss_bytes().saturating_sub(before);
    assert_eq!(store.live_counters() as u64, n, "a counter is missing");

    let (p50, p99) = percentiles(&mut decisions(&store, n, samples, quota, now));
    let (sweeping_p50, sweeping_p99, passes) = while_sweeping(&store, n, samples, quota, now);
    // Nothing has expired a second later: the pass walks every counter and keeps it.
    let t = Instant::now();
    assert_eq!(store.sweep(Timestamp::from_secs(1_700_000_041)), 0);
    let keep_ms = t.elapsed().as_secs_f64() * 1e3;
    // Two windows later everything has.
    let t = Instant::now();
    let removed = store.sweep(Timestamp::from_secs(1_700_000_200));
    let free_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(removed as u64, n, "the last pass frees every counter");
    let core_share = keep_ms / 1e3 / 10.0;
    eprintln!(
        "scale_counters: {n} counters in {fill_s:.1} s, {:.1} bytes each (key included); \
         decision p50 {p50} ns, p99 {p99} ns; while sweeping ({passes} passes) p50 \
         {sweeping_p50} ns, p99 {sweeping_p99} ns; a sweep keeping all {keep_ms:.1} ms \
         ({:.4} of a core every 10 s), freeing all {free_ms:.1} ms",
        rss as f64 / n as f64,
        core_share
    );
    println!(
        "{{\"curve\":\"counters\",\"n\":{n},\"rss_bytes\":{rss},\"bytes_per_counter\":{:.1},\
         \"fill_s\":{fill_s:.2},\"decision_p50_ns\":{p50},\"decision_p99_ns\":{p99},\
         \"sweeping_p50_ns\":{sweeping_p50},\"sweeping_p99_ns\":{sweeping_p99},\
         \"sweep_keep_ms\":{keep_ms:.2},\"sweep_free_ms\":{free_ms:.2},\
         \"sweeper_core_share\":{core_share:.6}}}",
        rss as f64 / n as f64
    );
}

/// The decisions' p50 and p99 while another thread sweeps (nothing expired) in a loop, and
/// the passes it made meanwhile.
fn while_sweeping(
    store: &MemoryStore,
    n: u64,
    samples: usize,
    quota: Quota,
    now: Timestamp,
) -> (u64, u64, u64) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sweeper = s.spawn(|| {
            let mut passes = 0;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(store.sweep(now), 0);
                passes += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            passes
        });
        let mut took = decisions(store, n, samples, quota, now);
        stop.store(true, Ordering::Relaxed);
        let passes = sweeper.join().expect("the sweeper thread");
        let (p50, p99) = percentiles(&mut took);
        (p50, p99, passes)
    })
}
