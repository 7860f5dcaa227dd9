//! Bytes per live fixed-window counter in the memory store.
//!
//! Creates N distinct counters (default 1,000,000, SLUICE_MAX_COUNTERS' default) through
//! [`MemoryStore`]'s [`CounterStore::apply`], reading resident memory (VmRSS from
//! `/proc/self/status`) before and after, and prints bytes per counter with and without the
//! key bytes. Keys look like the service's counter key stems for an IPv4 `remote_address`
//! descriptor (`edge_remote_address_10.1.2.3_`, 27 to 31 bytes).
//!
//! ```sh
//! cargo run --release --example counter_memory -- 1000000
//! ```

use std::pin::pin;
use std::task::{Context, Poll, Waker};

use sluice::clock::Timestamp;
use sluice::limiter::{Quota, Unit};
use sluice::store::{CounterStore, Hit, MemoryStore};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The memory store's future is always ready; poll it once.
fn apply(
    store: &MemoryStore,
    now: Timestamp,
    hit: Hit<'_>,
    out: &mut Vec<sluice::limiter::fixed_window::Decision>,
) {
    let hits = [hit];
    let mut fut = pin!(store.apply(now, &hits, out));
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(r) => r.expect("the store has room for every counter"),
        Poll::Pending => unreachable!("the memory store never waits"),
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |s| s.parse().expect("N is a count"));
    let now = Timestamp::from_secs(1_700_000_000);
    let store = MemoryStore::new(n);
    let mut out = Vec::with_capacity(1);
    let mut key = String::with_capacity(64);
    let mut key_bytes = 0u64;
    let before = rss_bytes();
    for i in 0..n {
        key.clear();
        use std::fmt::Write as _;
        let _ = write!(
            key,
            "edge_remote_address_10.{}.{}.{}_",
            (i >> 16) & 0xff,
            (i >> 8) & 0xff,
            i & 0xff
        );
        key_bytes += key.len() as u64;
        out.clear();
        apply(
            &store,
            now,
            Hit {
                key: &key,
                quota: Quota::fixed(1000, Unit::Minute),
                hits: 1,
            },
            &mut out,
        );
    }
    let after = rss_bytes();
    assert_eq!(store.live_counters(), n);
    let grown = after.saturating_sub(before) as f64;
    let per = grown / n as f64;
    let key_avg = key_bytes as f64 / n as f64;
    println!("counters {n}");
    println!("rss_before_bytes {before}");
    println!("rss_after_bytes {after}");
    println!("bytes_per_counter {per:.1}");
    println!("key_bytes_per_counter {key_avg:.1}");
    println!("bytes_per_counter_excluding_key {:.1}", per - key_avg);
}
