//! The config scale envelope: what a config of N limits costs to load, to hold and to match a
//! request against, for three shapes of domain `scale`:
//!
//! - `flat`: N descriptors `tenant: t<i>`, each with a `rate_limit`;
//! - `nested`: about sqrt(N) `region: r<j>` descriptors (no limit of their own), each with about
//!   sqrt(N) children `tenant: t<i>` with a `rate_limit`: N leaf limits;
//! - `wildcard`: N wildcard descriptors, three in four Go's trailing wildcard `tenant: t<i>_*`,
//!   every fourth Sluice's mid-value wildcard `tenant: t<i>_*_m` (#1085); a request's value
//!   `t<i>_<k>` (or `t<i>_<k>_m`) matches exactly one of them;
//! - `regex`: N `value_regex` descriptors `tenant: t<i>_[0-9]+` (every fourth
//!   `(?:gold|silver)-t<i>-[a-z]{2,8}`, an alternation with no literal prefix); a request's
//!   value `t<i>_<k>` (or `gold-t<i>-<k's letters>`) matches exactly one of them (issue 52).
//!
//! The YAML is built in memory. Load is `parse_files` and a [`ConfigHandle`] over the result,
//! as the service loads a file at start and on reload; the fastest of up to 5 rounds (fewer when
//! they get slow). Memory is the growth of VmRSS from before the YAML is built to after the
//! config is compiled and the text dropped, and the heap bytes the counting allocator
//! (`tests/alloc_counter`) sees held over the same span. Lookups are `Domain::lookup`, what the
//! service matches each request descriptor with, over 4096 pre-built requests for random
//! existing limits (and 4096 that match none), timed in batches: the median batch's ns per
//! lookup. A sample of both is checked first: each hit finds its own limit, each miss none.
//!
//! Human-readable lines go to stderr, one JSON line to stdout.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin scale_config -- 100000 flat
//! cargo run --release -p sluice-bench --bin scale_config -- 100000 nested
//! cargo run --release -p sluice-bench --bin scale_config -- 100000 wildcard
//! cargo run --release -p sluice-bench --bin scale_config -- 10000 regex
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark's own stopwatch, outside Sluice"
)]

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use alloc_counter::{Counting, live_bytes};
use sluice::config::{ConfigHandle, Domain, FileLimits, LoadOptions, parse_files};
use sluice::descriptor::Entry;
use sluice_test_support::bench::rng::SplitMix64 as Rng;
use sluice_test_support::bench::rss::rss_bytes;

#[global_allocator]
static ALLOC: Counting = Counting;

const DOMAIN: &str = "scale";
/// Pre-built requests per kind (hit, miss), cycled through by the timed loops.
const REQUESTS: usize = 4096;
/// Requests of each kind checked before timing.
const CHECKED: usize = 256;
/// Load rounds at most, and the load time after which no further round starts.
const MAX_ROUNDS: usize = 5;
const LOAD_BUDGET: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, PartialEq)]
enum Shape {
    Flat,
    Nested,
    Wildcard,
    Regex,
}

impl Shape {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "flat" => Some(Shape::Flat),
            "nested" => Some(Shape::Nested),
            "wildcard" => Some(Shape::Wildcard),
            "regex" => Some(Shape::Regex),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Shape::Flat => "flat",
            Shape::Nested => "nested",
            Shape::Wildcard => "wildcard",
            Shape::Regex => "regex",
        }
    }
}

/// Where the N limits sit: for `nested`, `per` tenants under each region.
#[derive(Clone, Copy)]
struct Layout {
    shape: Shape,
    n: usize,
    per: usize,
}

impl Layout {
    fn new(shape: Shape, n: usize) -> Self {
        Layout {
            shape,
            n,
            per: n.isqrt().max(1),
        }
    }

    fn region(self, i: usize) -> usize {
        i / self.per
    }

    /// Every fourth wildcard is a mid-value one, every fourth pattern an alternation.
    fn mid(i: usize) -> bool {
        i % 4 == 3
    }

    /// Pattern `i` of the `regex` shape.
    fn pattern(i: usize) -> String {
        match Self::mid(i) {
            true => format!("(?:gold|silver)-t{i}-[a-z]{{2,8}}"),
            false => format!("t{i}_[0-9]+"),
        }
    }

    /// The config file's text.
    fn yaml(self) -> String {
        const LIMIT: &str = "rate_limit: {unit: minute, requests_per_unit: 100}";
        let mut out = String::with_capacity(self.n * 96 + 64);
        let _ = writeln!(out, "domain: {DOMAIN}\ndescriptors:");
        for i in 0..self.n {
            match self.shape {
                Shape::Flat => {
                    let _ = writeln!(out, "  - key: tenant\n    value: t{i}\n    {LIMIT}");
                }
                Shape::Wildcard => {
                    let tail = if Self::mid(i) { "_m" } else { "" };
                    let _ = writeln!(
                        out,
                        "  - key: tenant\n    value: \"t{i}_*{tail}\"\n    {LIMIT}"
                    );
                }
                Shape::Regex => {
                    let p = Self::pattern(i);
                    let _ = writeln!(
                        out,
                        "  - key: tenant\n    value_regex: \"{p}\"\n    {LIMIT}"
                    );
                }
                Shape::Nested => {
                    if i % self.per == 0 {
                        let r = self.region(i);
                        let _ = writeln!(out, "  - key: region\n    value: r{r}\n    descriptors:");
                    }
                    let _ = writeln!(
                        out,
                        "      - key: tenant\n        value: t{i}\n        {LIMIT}"
                    );
                }
            }
        }
        out
    }

    /// A request for limit `i`; `salt` varies the part a wildcard matches.
    fn hit(self, i: usize, salt: u64) -> Vec<Entry> {
        match self.shape {
            Shape::Flat => vec![Entry::new("tenant", format!("t{i}"))],
            Shape::Nested => vec![
                Entry::new("region", format!("r{}", self.region(i))),
                Entry::new("tenant", format!("t{i}")),
            ],
            Shape::Wildcard if Self::mid(i) => {
                vec![Entry::new("tenant", format!("t{i}_{}_m", salt % 1000))]
            }
            Shape::Wildcard => vec![Entry::new("tenant", format!("t{i}_{}", salt % 1000))],
            Shape::Regex if Self::mid(i) => {
                let letters: String = (0..2 + salt % 7)
                    .map(|k| char::from(b'a' + ((salt >> (k * 4)) % 26) as u8))
                    .collect();
                vec![Entry::new("tenant", format!("gold-t{i}-{letters}"))]
            }
            Shape::Regex => vec![Entry::new("tenant", format!("t{i}_{}", salt % 1000))],
        }
    }

    /// The full key of the limit [`Layout::hit`] `i` must find.
    fn full_key(self, i: usize) -> String {
        match self.shape {
            Shape::Flat => format!("{DOMAIN}.tenant_t{i}"),
            Shape::Nested => format!("{DOMAIN}.region_r{}.tenant_t{i}", self.region(i)),
            Shape::Wildcard if Self::mid(i) => format!("{DOMAIN}.tenant_t{i}_*_m"),
            Shape::Wildcard => format!("{DOMAIN}.tenant_t{i}_*"),
            Shape::Regex => format!("{DOMAIN}.tenant~{}", Self::pattern(i)),
        }
    }

    /// A request near limit `i` that matches none: an unknown tenant (under a known region for
    /// `nested`, so the walk reaches the second level). For `wildcard` and `regex` it is tried
    /// against every pattern.
    fn miss(self, i: usize) -> Vec<Entry> {
        match self.shape {
            Shape::Flat => vec![Entry::new("tenant", format!("x{i}"))],
            Shape::Nested => vec![
                Entry::new("region", format!("r{}", self.region(i))),
                Entry::new("tenant", format!("x{i}")),
            ],
            Shape::Wildcard | Shape::Regex => vec![Entry::new("tenant", format!("x{i}_0"))],
        }
    }
}

/// One load as the service does it: parse and compile, then the handle requests read through.
fn load(yaml: &str) -> (ConfigHandle, Duration) {
    let files = [("scale.yaml".to_owned(), yaml.to_owned())];
    let start = Instant::now();
    let config = parse_files(&files, &LoadOptions::default()).expect("the generated config loads");
    let handle = ConfigHandle::new(Some(config));
    let took = start.elapsed();
    // Not timed: the copy of the text, which a service reads from its file instead.
    drop(files);
    (handle, took)
}

/// The first load, kept: its memory (VmRSS and heap growth) and its time.
fn first_load(layout: Layout) -> (ConfigHandle, usize, u64, i64, Duration) {
    let (rss_before, heap_before) = (rss_bytes(), live_bytes());
    let yaml = layout.yaml();
    let yaml_bytes = yaml.len();
    let (handle, took) = load(&yaml);
    drop(yaml);
    let rss = rss_bytes().saturating_sub(rss_before);
    let heap = live_bytes() - heap_before;
    (handle, yaml_bytes, rss, heap, took)
}

/// Further rounds, each from a fresh text into a fresh handle; the fastest of all.
fn best_load(layout: Layout, first: Duration) -> (Duration, usize) {
    let (mut best, mut spent, mut rounds) = (first, first, 1);
    while rounds < MAX_ROUNDS && spent < LOAD_BUDGET {
        let yaml = layout.yaml();
        let (handle, took) = load(&yaml);
        drop(handle);
        best = best.min(took);
        spent += took;
        rounds += 1;
    }
    (best, rounds)
}

/// One YAML parse into a generic value alone, for where the load time goes (Sluice's own
/// parse runs a counting pass over the text first, `src/config/yaml.rs`).
fn yaml_value_time(layout: Layout) -> Duration {
    let yaml = layout.yaml();
    let start = Instant::now();
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).expect("valid YAML");
    let took = start.elapsed();
    drop(black_box(value));
    took
}

/// A request for an existing limit, with the limit's index.
type Hit = (usize, Vec<Entry>);

/// The pre-built requests: hits for random existing limits, and misses.
fn requests(layout: Layout) -> (Vec<Hit>, Vec<Vec<Entry>>) {
    let mut rng = Rng(0x5eed ^ layout.n as u64);
    let hits = (0..REQUESTS)
        .map(|_| {
            let i = rng.below(layout.n);
            (i, layout.hit(i, rng.next_u64()))
        })
        .collect();
    let misses = (0..REQUESTS)
        .map(|_| layout.miss(rng.below(layout.n)))
        .collect();
    (hits, misses)
}

/// Outside the timed loops: each sampled hit finds its own limit, each sampled miss none.
fn check(layout: Layout, domain: &Domain, hits: &[Hit], misses: &[Vec<Entry>]) {
    for (i, entries) in hits.iter().take(CHECKED) {
        let matched = domain.lookup(entries).expect("a hit finds a limit");
        assert_eq!(matched.limit.full_key, layout.full_key(*i), "{entries:?}");
    }
    for entries in misses.iter().take(CHECKED) {
        let matched = domain.lookup(entries).map(|m| m.limit.full_key.clone());
        assert_eq!(matched, None, "{entries:?} matches nothing");
    }
}

/// ns per lookup: the median over batches of lookups cycling through `requests`, each batch
/// about 200 µs, as many batches as `budget` allows (at least 11).
fn time_lookups(domain: &Domain, requests: &[&[Entry]], budget: Duration) -> f64 {
    let mut next = requests.iter().cycle();
    let mut run = |count: usize| {
        let start = Instant::now();
        for entries in next.by_ref().take(count) {
            black_box(domain.lookup(black_box(entries)));
        }
        start.elapsed()
    };
    // Calibrate: the rough cost of one lookup, over at least 10 ms.
    let (mut done, mut spent) = (0usize, Duration::ZERO);
    while spent < Duration::from_millis(10) {
        spent += run(16);
        done += 16;
    }
    let each = spent.as_secs_f64() / done as f64;
    let batch = ((200e-6 / each) as usize).clamp(1, 1_000_000);
    let batches = ((budget.as_secs_f64() / (each * batch as f64)) as usize).clamp(11, 10_001);
    let mut per: Vec<f64> = (0..batches)
        .map(|_| run(batch).as_nanos() as f64 / batch as f64)
        .collect();
    per.sort_by(f64::total_cmp);
    per[per.len() / 2]
}

/// What one run found.
struct Report {
    yaml_bytes: usize,
    load: Duration,
    rounds: usize,
    rss: u64,
    heap: i64,
    lookup_ns: f64,
    miss_ns: f64,
}

fn measure(layout: Layout) -> Report {
    let (handle, yaml_bytes, rss, heap, first) = first_load(layout);
    let (load, rounds) = best_load(layout, first);
    let config = handle.current().expect("a config is served");
    let domain = config.domain(DOMAIN).expect("the domain is loaded");
    let (hits, misses) = requests(layout);
    check(layout, domain, &hits, &misses);
    let hit_refs: Vec<&[Entry]> = hits.iter().map(|(_, e)| e.as_slice()).collect();
    let miss_refs: Vec<&[Entry]> = misses.iter().map(Vec::as_slice).collect();
    let lookup_ns = time_lookups(domain, &hit_refs, Duration::from_secs(2));
    let miss_ns = time_lookups(domain, &miss_refs, Duration::from_secs(1));
    Report {
        yaml_bytes,
        load,
        rounds,
        rss,
        heap,
        lookup_ns,
        miss_ns,
    }
}

fn print(layout: Layout, r: &Report, yaml_value: Duration) {
    let (n, name) = (layout.n, layout.shape.name());
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let per_rss = r.rss as f64 / n as f64;
    let per_heap = r.heap as f64 / n as f64;
    eprintln!(
        "scale_config: {name}, {n} limits, {} bytes of YAML",
        r.yaml_bytes
    );
    eprintln!(
        "  load+compile {:.2} ms (fastest of {}), {:.0} ns per limit; one serde_yaml_ng parse \
         to a Value alone {:.2} ms",
        ms(r.load),
        r.rounds,
        ms(r.load) * 1e6 / n as f64,
        ms(yaml_value)
    );
    eprintln!(
        "  held: VmRSS +{} bytes ({per_rss:.0} per limit), heap +{} bytes ({per_heap:.0} per limit)",
        r.rss, r.heap
    );
    eprintln!(
        "  lookup: hit {:.1} ns, miss {:.1} ns (median batch)",
        r.lookup_ns, r.miss_ns
    );
    if r.yaml_bytes as u64 > FileLimits::DEFAULT_MAX_FILE_BYTES {
        eprintln!(
            "  note: as one file this is over SLUICE_CONFIG_MAX_FILE_BYTES's default ({} bytes)",
            FileLimits::DEFAULT_MAX_FILE_BYTES
        );
    }
    println!(
        "{{\"curve\":\"config\",\"shape\":\"{name}\",\"n\":{n},\"yaml_bytes\":{},\"load_ms\":{:.3},\
         \"rss_bytes\":{},\"bytes_per_descriptor\":{per_rss:.1},\"heap_bytes\":{},\
         \"heap_bytes_per_descriptor\":{per_heap:.1},\"lookup_ns\":{:.1},\"miss_ns\":{:.1}}}",
        r.yaml_bytes,
        ms(r.load),
        r.rss,
        r.heap,
        r.lookup_ns,
        r.miss_ns
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match &args[..] {
        [n, shape] => n
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .zip(Shape::parse(shape)),
        _ => None,
    };
    let Some((n, shape)) = parsed else {
        eprintln!("usage: scale_config N flat|nested|wildcard|regex");
        std::process::exit(2);
    };
    let layout = Layout::new(shape, n);
    let report = measure(layout);
    let yaml_value = yaml_value_time(layout);
    print(layout, &report, yaml_value);
}
