//! Bytes per live counter in the memory store, against what SLUICE_MAX_COUNTER_BYTES charges.
//!
//! Creates N distinct counters (default 1,000,000, SLUICE_MAX_COUNTERS' default) through
//! [`MemoryStore`]'s [`CounterStore::apply`], reading resident memory (VmRSS from
//! `/proc/self/status`) before and after, and prints bytes per counter with and without the
//! key bytes, beside [`COUNTER_OVERHEAD_BYTES`], the overhead the byte budget charges. By
//! default keys look like the service's counter key stems for an IPv4 `remote_address`
//! descriptor (`edge_remote_address_10.1.2.3_`, 27 to 31 bytes); KEY_BYTES makes every key that
//! long instead. ALGORITHM picks the table: `fixed_window` (default), `sliding_window` (a
//! 128-bit word per counter) or `token_bucket`.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin counter_memory -- 1000000
//! cargo run --release -p sluice-bench --bin counter_memory -- 920000 4 sliding_window   # the worst case
//! ```

use std::fmt::Write as _;

use sluice::clock::Timestamp;
use sluice::limiter::{Algorithm, Quota, Unit};
use sluice::store::memory::COUNTER_OVERHEAD_BYTES;
use sluice::store::{CounterStore, Hit, MemoryStore};
use sluice_test_support::bench::ready::ready;
use sluice_test_support::bench::rss::rss_bytes;

/// The memory store's future is always ready.
fn apply(
    store: &MemoryStore,
    now: Timestamp,
    hit: Hit<'_>,
    out: &mut Vec<sluice::limiter::Decision>,
) {
    ready(store.apply(now, &[hit], out)).expect("the store has room for every counter");
}

/// Counter `i`'s key: an address-like stem, or exactly `len` bytes when `len` is given.
fn write_key(key: &mut String, i: usize, len: Option<usize>) {
    key.clear();
    match len {
        None => {
            let _ = write!(
                key,
                "edge_remote_address_10.{}.{}.{}_",
                (i >> 16) & 0xff,
                (i >> 8) & 0xff,
                i & 0xff
            );
        }
        Some(len) => {
            // Base 64 digits, so a 1-byte key space still makes distinct keys for a while.
            let mut n = i;
            loop {
                key.push(char::from(b'0' + (n % 64) as u8));
                n /= 64;
                if n == 0 {
                    break;
                }
            }
            assert!(
                key.len() <= len,
                "KEY_BYTES {len} is too short for {i} keys"
            );
            key.extend(std::iter::repeat_n('x', len - key.len()));
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map_or(1_000_000, |s| s.parse().expect("N is a count"));
    let key_len: Option<usize> = args
        .next()
        .map(|s| s.parse().expect("KEY_BYTES is a count"));
    let algorithm = match args.next().as_deref() {
        None | Some("fixed_window") => Algorithm::FixedWindow,
        Some("sliding_window") => Algorithm::SlidingWindow,
        Some("token_bucket") => Algorithm::TokenBucket,
        Some(other) => panic!("unknown ALGORITHM {other}"),
    };
    let now = Timestamp::from_secs(1_700_000_000);
    let store = MemoryStore::new(n);
    let quota = Quota {
        algorithm,
        ..Quota::fixed(1000, Unit::Minute)
    };
    let mut out = Vec::with_capacity(1);
    let mut key = String::with_capacity(key_len.unwrap_or(64));
    let mut key_bytes = 0u64;
    let before = rss_bytes();
    for i in 0..n {
        write_key(&mut key, i, key_len);
        key_bytes += key.len() as u64;
        out.clear();
        let hit = Hit {
            key: &key,
            quota,
            hits: 1,
        };
        apply(&store, now, hit, &mut out);
    }
    let after = rss_bytes();
    assert_eq!(store.live_counters(), n);
    let grown = after.saturating_sub(before) as f64;
    let per = grown / n as f64;
    let key_avg = key_bytes as f64 / n as f64;
    println!("counters {n}");
    println!("algorithm {algorithm:?}");
    println!("rss_before_bytes {before}");
    println!("rss_after_bytes {after}");
    println!("bytes_per_counter {per:.1}");
    println!("key_bytes_per_counter {key_avg:.1}");
    println!("bytes_per_counter_excluding_key {:.1}", per - key_avg);
    println!("charged_excluding_key {COUNTER_OVERHEAD_BYTES}");
    println!(
        "accounted_bytes {} (rss growth / accounted {:.2})",
        store.counter_bytes(),
        grown / store.counter_bytes() as f64
    );
}
