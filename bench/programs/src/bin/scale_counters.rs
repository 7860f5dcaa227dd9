//! The memory store at N live counters (issue 40's scale envelope): bytes per counter, the
//! decision's latency on a live counter, and the sweeper's cost.
//!
//! Fills a [`MemoryStore`] with N fixed-window counters whose keys look like the service's
//! counter key stems for an IPv4 `remote_address` descriptor (27 to 35 bytes), reading resident
//! memory (VmRSS) before and after. Then times [`CounterStore::apply`] one call at a time on
//! counters picked at random (SAMPLES calls, default 200,000): p50, p99, p99.9, p99.99 and the
//! longest, in nanoseconds, the clock's own cost included (about 20 ns here); then the same
//! while another thread sweeps the store in a loop, as SLUICE_SWEEP_INTERVAL_SECS's task does.
//! Then the sweeper's pass over the N counters when none has expired (its cost every
//! SLUICE_SWEEP_INTERVAL_SECS, 10 s by default, as a share of one core: its time on the
//! thread's CPU clock, which a shared machine does not stretch), and the pass when all have
//! (the pass that frees them), timing meanwhile decisions on 10,000 live counters of the same
//! table: a decision waits while the sweeper holds its shard, so their tail bounds the holds
//! from above (with the scheduler's own pauses). Each pass is timed on the clock and on the
//! CPU, and the store times its holds of the shards' locks ([`MemoryStore::sweep_timed`]):
//! the longest write hold is the longest a decision on a live counter can wait for it. The
//! holds are timed on the wall clock (HOLD_CLOCK `wall`, the default), or on the sweeping
//! thread's CPU clock (`cpu`), which leaves out the time the scheduler took the thread off a
//! core while it held a lock. Prints one JSON line on stdout and exits 1 when a counter is
//! missing or a pass removes the wrong number.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin scale_counters -- N [SAMPLES [HOLD_CLOCK]]
//! cargo run --release -p sluice-bench --bin scale_counters -- 1000000 200000 cpu
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark's own stopwatch, outside Sluice"
)]

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice::clock::{Clock, SystemClock, Timestamp};
use sluice::limiter::{Decision, Quota, Unit};
use sluice::store::{CounterStore, Hit, MemoryStore};
use sluice_test_support::bench::ready::ready;
use sluice_test_support::bench::rss::rss_bytes;

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

/// A latency distribution (ns).
struct Latency {
    p50: u64,
    p99: u64,
    p999: u64,
    p9999: u64,
    max: u64,
    samples: usize,
}

impl Latency {
    /// The distribution of `took`, sorted in place.
    fn of(took: &mut [u64]) -> Self {
        took.sort_unstable();
        // No sample (none was timed): all 0.
        let at = |p: f64| took.get((took.len().saturating_sub(1) as f64 * p) as usize);
        let at = |p| at(p).copied().unwrap_or(0);
        Latency {
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            p9999: at(0.9999),
            max: at(1.0),
            samples: took.len(),
        }
    }

    /// Its JSON fields, named `<prefix>_p50_ns` and so on.
    fn json(&self, prefix: &str) -> String {
        format!(
            "\"{prefix}_p50_ns\":{},\"{prefix}_p99_ns\":{},\"{prefix}_p999_ns\":{},\
             \"{prefix}_p9999_ns\":{},\"{prefix}_max_ns\":{},\"{prefix}_samples\":{}",
            self.p50, self.p99, self.p999, self.p9999, self.max, self.samples
        )
    }
}

/// Counters picked at random among `count` keys from `first`, charged one hit each under
/// `quota` at `now`.
struct Sample<'a> {
    store: &'a MemoryStore,
    first: u64,
    count: u64,
    quota: Quota,
    now: Timestamp,
}

impl Sample<'_> {
    /// Times one decision after another, each alone, while `more()` says so and at most `most`.
    /// Nothing is allocated meanwhile: a vector growing here once waited seconds in the
    /// allocator while the sweeper freed millions of keys, and that wait was in no sample.
    fn time(&self, most: usize, more: impl Fn() -> bool) -> Vec<u64> {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut key = String::with_capacity(40);
        let mut out = Vec::with_capacity(1);
        let mut took = Vec::with_capacity(most);
        while took.len() < most && more() {
            write_key(&mut key, self.first + rng.below(self.count));
            out.clear();
            let hit = Hit {
                key: &key,
                quota: self.quota,
                hits: 1,
            };
            let t = Instant::now();
            apply(self.store, self.now, hit, &mut out);
            took.push(t.elapsed().as_nanos() as u64);
            assert!(!out[0].over, "no sampled counter reaches its limit");
        }
        took
    }

    /// Makes the sample's counters (those not made yet).
    fn fill(&self) {
        let mut key = String::with_capacity(40);
        let mut out = Vec::with_capacity(1);
        for i in self.first..self.first + self.count {
            write_key(&mut key, i);
            out.clear();
            let hit = Hit {
                key: &key,
                quota: self.quota,
                hits: 1,
            };
            apply(self.store, self.now, hit, &mut out);
        }
    }
}

/// The time a sweep pass took: on the clock, and on the CPU (the sweeping thread's own run
/// time, which other programs on a shared machine do not stretch); and how it held the shards'
/// locks, where the store times that ([`MemoryStore::sweep_timed`]).
#[derive(Clone, Copy)]
struct Pass {
    removed: usize,
    wall_ms: f64,
    cpu_ms: f64,
    /// Write locks taken, the longest write hold and the longest read hold (ns).
    holds: Option<(u64, u64, u64)>,
}

impl Pass {
    /// Its JSON fields, named `sweep_<name>_ms` and so on (null where not timed).
    fn json(&self, name: &str) -> String {
        let holds = self.holds.map_or(
            ["null".to_owned(), "null".to_owned(), "null".to_owned()],
            |h| [h.0.to_string(), h.1.to_string(), h.2.to_string()],
        );
        format!(
            "\"sweep_{name}_ms\":{:.2},\"sweep_{name}_cpu_ms\":{:.2},\"sweep_{name}_write_holds\":{},\
             \"sweep_{name}_write_hold_ns\":{},\"sweep_{name}_read_hold_ns\":{}",
            self.wall_ms, self.cpu_ms, holds[0], holds[1], holds[2]
        )
    }

    fn text(&self) -> String {
        let holds = self.holds.map_or(String::new(), |h| {
            format!(
                ", write locks {} held at most {} ns, read locks at most {} ns",
                h.0, h.1, h.2
            )
        });
        format!("{:.1} ms ({:.1} ms CPU{holds})", self.wall_ms, self.cpu_ms)
    }
}

/// The sweeping thread's CPU clock, for timing holds without the time the thread was off a
/// core: on a shared machine the scheduler preempts a thread holding a lock for milliseconds,
/// which the wall clock counts as a hold.
struct ThreadCpu;

impl Clock for ThreadCpu {
    fn now_nanos(&self) -> u64 {
        thread_cpu_ns()
    }
}

/// One sweep pass at `now`, timed, its holds of the shards' locks timed on `hold_clock`.
fn pass(store: &MemoryStore, now: Timestamp, hold_clock: &dyn Clock) -> Pass {
    let t = Instant::now();
    let cpu = thread_cpu_ns();
    let report = store.sweep_timed(now, hold_clock);
    Pass {
        removed: report.removed,
        wall_ms: t.elapsed().as_secs_f64() * 1e3,
        cpu_ms: thread_cpu_ns().saturating_sub(cpu) as f64 / 1e6,
        holds: Some((
            report.write_holds,
            report.longest_write_hold_ns,
            report.longest_read_hold_ns,
        )),
    }
}

/// This thread's time on a CPU so far (ns).
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

/// At most this many decisions are timed while a pass frees counters: room for 512 MiB of
/// samples, reserved beforehand (a pass over 10^8 counters took 31 s here, room for 30
/// million decisions of 1 µs).
const MOST_WHILE_FREEING: usize = 1 << 26;

/// Counters made while a pass frees the others: decisions on them share the freed counters'
/// table and shards.
const PROBES: u64 = 10_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map_or(1_000_000, |s| s.parse().expect("N is a count"));
    let samples: usize = args
        .next()
        .map_or(200_000, |s| s.parse().expect("SAMPLES is a count"));
    let hold_clock_name = args.next().unwrap_or_else(|| "wall".to_owned());
    let hold_clock: &dyn Clock = match hold_clock_name.as_str() {
        "wall" => &SystemClock,
        "cpu" => &ThreadCpu,
        other => panic!("HOLD_CLOCK is wall or cpu, not {other}"),
    };
    let now = Timestamp::from_secs(1_700_000_040);
    let store = MemoryStore::new(usize::try_from(n + PROBES).expect("N fits"));
    let all = Sample {
        store: &store,
        first: 0,
        count: n,
        quota: Quota::fixed(1000, Unit::Minute),
        now,
    };
    let before = rss_bytes();
    let filled = Instant::now();
    all.fill();
    let fill_s = filled.elapsed().as_secs_f64();
    let rss = rss_bytes().saturating_sub(before);
    assert_eq!(store.live_counters() as u64, n, "a counter is missing");

    let alone = Latency::of(&mut all.time(samples, || true));
    let (sweeping, passes) = while_sweeping(&all, samples);
    // Nothing has expired a second later: the pass walks every counter and keeps it.
    let keep = pass(&store, Timestamp::from_secs(1_700_000_041), hold_clock);
    assert_eq!(keep.removed, 0);
    // Two windows later everything has.
    let later = Timestamp::from_secs(1_700_000_200);
    let (freeing, free) = while_freeing(&store, n, later, hold_clock);
    let core_share = keep.cpu_ms / 1e3 / 10.0;
    eprintln!(
        "scale_counters: {n} counters in {fill_s:.1} s, {:.1} bytes each (key included); \
         decision p50 {} ns, p99 {} ns; while sweeping ({passes} passes) p99 {} ns, max {} ns; \
         a sweep keeping all {} ({core_share:.4} of a core every 10 s); freeing all {}, \
         meanwhile ({} decisions) p99 {} ns, p99.9 {} ns, p99.99 {} ns, max {} ns",
        rss as f64 / n as f64,
        alone.p50,
        alone.p99,
        sweeping.p99,
        sweeping.max,
        keep.text(),
        free.text(),
        freeing.samples,
        freeing.p99,
        freeing.p999,
        freeing.p9999,
        freeing.max,
    );
    println!(
        "{{\"curve\":\"counters\",\"n\":{n},\"hold_clock\":\"{hold_clock_name}\",\"rss_bytes\":{rss},\"bytes_per_counter\":{:.1},\
         \"fill_s\":{fill_s:.2},{},{},\"sweeping_passes\":{passes},{},{},{},\
         \"sweeper_core_share\":{core_share:.6}}}",
        rss as f64 / n as f64,
        alone.json("decision"),
        sweeping.json("sweeping"),
        keep.json("keep"),
        free.json("free"),
        freeing.json("freeing"),
    );
}

/// The decisions' latency while another thread sweeps (nothing expired) in a loop, as
/// SLUICE_SWEEP_INTERVAL_SECS's task does but without its pause; and the passes it made.
fn while_sweeping(all: &Sample<'_>, samples: usize) -> (Latency, u64) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sweeper = s.spawn(|| {
            let mut passes = 0;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(all.store.sweep(all.now), 0);
                passes += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            passes
        });
        let mut took = all.time(samples, || true);
        stop.store(true, Ordering::Relaxed);
        let passes = sweeper.join().expect("the sweeper thread");
        (Latency::of(&mut took), passes)
    })
}

/// The pass at `later` that frees all `n` counters, and the latency meanwhile of
/// decisions on [`PROBES`] live counters of the same table (so of the same shards).
fn while_freeing(
    store: &MemoryStore,
    n: u64,
    later: Timestamp,
    hold_clock: &dyn Clock,
) -> (Latency, Pass) {
    let probes = Sample {
        store,
        first: n,
        count: PROBES,
        quota: Quota::fixed(u32::MAX, Unit::Minute),
        now: later,
    };
    probes.fill();
    let (started, done) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|s| {
        let sweeper = s.spawn(|| {
            // From the first decision on, so that a short pass does not end before it.
            while !started.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
            let free = pass(store, later, hold_clock);
            done.store(true, Ordering::Relaxed);
            assert_eq!(
                free.removed as u64, n,
                "the pass frees every expired counter"
            );
            free
        });
        let more = || {
            started.store(true, Ordering::Relaxed);
            !done.load(Ordering::Relaxed)
        };
        let mut took = probes.time(MOST_WHILE_FREEING, more);
        let free = sweeper.join().expect("the sweeper thread");
        assert_eq!(
            store.live_counters() as u64,
            PROBES,
            "the live counters stay"
        );
        (Latency::of(&mut took), free)
    })
}
