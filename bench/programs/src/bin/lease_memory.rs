//! Bytes per key in lease mode's tables, against what SLUICE_LEASE_MAX_BYTES charges: a
//! node's [`LeaseClient`] holding N keys, an owner's [`LeaseServer`] leasing N keys to
//! HOLDERS nodes each, and a child cluster's owner keeping its parent's grants on N keys
//! ([`Upstream`], SLUICE_LEASE_PARENT), and a Redis replica's batches on N keys
//! ([`Allowances`], SLUICE_REDIS_ALLOWANCE), and a node's free-share counts on N keys
//! ([`FreeShares`]). Reads resident memory (VmRSS) before and after filling each table, and prints
//! bytes per key with the key bytes included, and exits 1 when either passes its charge (so
//! `bench/run.sh`, which runs it, fails). Keys look like the service's counter key stems for
//! an IPv4 `remote_address` descriptor (27 to 31 bytes); holders' names like pod addresses.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin lease_memory -- 100000 3
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a program measuring memory; it reads no clock"
)]

use sluice::clock::Timestamp;
use sluice::cluster::lease::free::{FreeRoute, FreeShares, PPM, Terms};
use sluice::cluster::lease::parent::{ParentTiming, Upstream};
use sluice::cluster::lease::{Ask, LeaseClient, LeaseServer, LeaseTiming, Route};
use sluice::limiter::{Quota, Unit};
use sluice::store::Hit;
use sluice::store::allowance::{AllowanceTuning, Allowances};
use sluice_test_support::bench::rss::rss_bytes;

const T0: u64 = 1_700_000_000_000_000;

fn key(i: usize) -> String {
    format!(
        "edge_remote_address_10.{}.{}.{}_",
        (i >> 16) & 0xff,
        (i >> 8) & 0xff,
        i & 0xff
    )
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let holders: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let timing = LeaseTiming {
        max_bytes: usize::MAX,
        ..LeaseTiming::DEFAULT
    };
    let quota = Quota::fixed(100, Unit::Minute);

    let (client, client_bytes) = held_keys(n, quota, timing, holders);

    let before = rss_bytes();
    let server = LeaseServer::new(timing);
    let now = Timestamp::from_micros(T0);
    let ask = Ask {
        quota,
        epoch: T0 / 60_000_000,
        used: 0,
        keep: 0,
        want: 1,
        demand_milli: 1_000,
        horizon_us: 0,
    };
    let names: Vec<String> = (0..holders)
        .map(|h| format!("10.244.{h}.17:8082"))
        .collect();
    for i in 0..n {
        let k = key(i);
        for name in &names {
            server.answer(name, &k, &ask, now, Timestamp::from_micros(0), holders);
        }
    }
    let server_bytes = rss_bytes().saturating_sub(before);
    assert_eq!(server.len(), n);

    let (free, free_bytes) = free_counts(n, quota, &timing);
    let (up, up_bytes) = parent_grants(n, quota, &timing);
    let (batches, batch_bytes) = redis_batches(n, quota);

    let per = |bytes: u64| bytes as f64 / n as f64;
    let measured = (per(client_bytes), per(server_bytes));
    let charged = (per(client.bytes() as u64), per(server.bytes() as u64));
    let parent = (per(up_bytes), per(up.bytes() as u64));
    let batch = (per(batch_bytes), per(batches.bytes() as u64));
    let freely = (per(free_bytes), per(free.bytes() as u64));
    println!(
        "lease_memory: {n} keys of 27 to 31 bytes, {holders} holders per key (names of 16 bytes)\n\
         client: {:.0} bytes per held key, charged {:.0}\n\
         server: {:.0} bytes per leased key, charged {:.0}\n\
         parent grants: {:.0} bytes per key, charged {:.0}\n\
         Redis batches: {:.0} bytes per key, charged {:.0}\n\
         free shares: {:.0} bytes per key, charged {:.0}",
        measured.0,
        charged.0,
        measured.1,
        charged.1,
        parent.0,
        parent.1,
        batch.0,
        batch.1,
        freely.0,
        freely.1,
    );
    // SLUICE_LEASE_MAX_BYTES is a bound only while the charge covers the real cost.
    let pairs = [
        (measured.0, charged.0),
        (measured.1, charged.1),
        parent,
        batch,
        freely,
    ];
    if pairs.iter().any(|(m, c)| m > c) {
        eprintln!(
            "lease_memory: a table uses more than it is charged: raise SLOT_CHARGE, KEY_CHARGE, HOLDER_CHARGE, ABOVE_CHARGE, RESERVED_CHARGE or FREE_CHARGE"
        );
        std::process::exit(1);
    }
}

/// A node's leases on `n` keys, and the resident bytes they took.
fn held_keys(n: usize, quota: Quota, timing: LeaseTiming, holders: usize) -> (LeaseClient, u64) {
    let before = rss_bytes();
    let client = LeaseClient::new(timing);
    for i in 0..n {
        // A new key routes to an acquire; the slot then stays in the table.
        match client.route(&key(i), quota, T0, 1, || holders, || None) {
            Route::Acquire(..) => {}
            _ => panic!("a new key acquires"),
        }
    }
    let bytes = rss_bytes().saturating_sub(before);
    assert_eq!(client.len(), n);
    (client, bytes)
}

/// A node's free-share counts on `n` keys, each admitted once, and the resident bytes they took.
fn free_counts(n: usize, quota: Quota, timing: &LeaseTiming) -> (FreeShares, u64) {
    let before = rss_bytes();
    let renew = u64::try_from(timing.renew.as_micros()).unwrap_or(u64::MAX);
    let free = FreeShares::new(0, timing.duration_us(), renew, usize::MAX);
    let terms = Some(Terms {
        since_us: 0,
        until_us: u64::MAX,
        share_ppm: PPM / 6,
    });
    for i in 0..n {
        let route = free.admit(&key(i), &quota, T0, 1, terms);
        assert!(
            matches!(route, FreeRoute::Admitted(_)),
            "a key's first hit is free"
        );
    }
    let bytes = rss_bytes().saturating_sub(before);
    assert_eq!(free.len(), n);
    (free, bytes)
}

/// A child cluster owner's parent grants on `n` keys, and the resident bytes they took.
fn parent_grants(n: usize, quota: Quota, timing: &LeaseTiming) -> (Upstream, u64) {
    let before = rss_bytes();
    let parent_timing = ParentTiming {
        renew: std::time::Duration::from_millis(200),
        timeout: std::time::Duration::from_secs(1),
        idle: timing.duration,
        max_bytes: usize::MAX,
    };
    let up = Upstream::new(parent_timing, std::num::NonZeroU32::MIN.saturating_add(1));
    for i in 0..n {
        up.capacity(&key(i), &quota, T0);
    }
    let bytes = rss_bytes().saturating_sub(before);
    assert_eq!(up.len(), n);
    (up, bytes)
}

/// A Redis replica's batches on `n` keys, and the resident bytes they took.
fn redis_batches(n: usize, quota: Quota) -> (Allowances, u64) {
    let before = rss_bytes();
    let batches = Allowances::new(AllowanceTuning::new(100_000, usize::MAX));
    for i in 0..n {
        let k = key(i);
        let hit = Hit {
            key: &k,
            quota,
            hits: 1,
        };
        batches.route(&hit, Timestamp::from_micros(T0), true);
    }
    let bytes = rss_bytes().saturating_sub(before);
    assert_eq!(batches.len(), n);
    (batches, bytes)
}
