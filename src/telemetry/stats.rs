//! The counters behind every metric: envoyproxy/ratelimit's per-limit stats with its
//! arithmetic, the service-level counters, and the decision-latency histogram.
//!
//! Recording is a handful of relaxed atomic adds. A configured limit finds its counters through
//! a [`StatsSlot`] in the compiled [`crate::config::Limit`], filled on first use, so the common
//! request path does no hashing and no allocation. Keys that depend on request values
//! (`detailed_metric`, `value_to_metric`, per-request overrides) go through a concurrent map;
//! that map holds at most `max_keys` keys, and a record for a new key beyond the cap is folded
//! into one overflow entry and counted, so a flood of unique values cannot grow memory or the
//! number of exported series (envoyproxy/ratelimit #275, #1132). Such keys are also held to
//! `max_key_bytes` (SLUICE_MAX_KEY_BYTES): a longer one (an unknown domain of 60 KB) is folded
//! the same way, so the map holds at most `max_keys` keys of that size.
//!
//! Counters live as long as the service, across config reloads: a reloaded limit with the same
//! key finds the same counters, so exported counters never go backwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use crate::config::StatsSlot;
use crate::limiter::Unit;
pub use crate::service::observe::Outcome;

/// The stats key that overflowed records are folded into. It sanitises to itself and splits
/// into `domain="_overflow_"` alone.
pub(crate) const OVERFLOW_KEY: &str = "_overflow_";

/// Counters every request adds to are split into shards, one cache line (or more) each, and a
/// thread adds to its own: two cores deciding at once never write the same line (each such
/// write moves the line between the cores). A read sums the shards. There are as many shards
/// as the machine has threads to run, rounded up to a power of two, at most [`MAX_SHARDS`];
/// each thread takes the next one when it first counts.
pub(crate) const MAX_SHARDS: usize = 8;

/// A cache line of its own (64 bytes on x86-64 and most ARM cores).
#[derive(Debug, Default)]
#[repr(align(64))]
struct Line<T>(T);

#[derive(Debug)]
struct Sharded<T>(Box<[Line<T>]>);

impl<T: Default> Default for Sharded<T> {
    fn default() -> Self {
        Sharded((0..shard_count()).map(|_| Line(T::default())).collect())
    }
}

impl<T> Sharded<T> {
    /// This thread's shard.
    #[inline]
    fn local(&self) -> &T {
        &self.0[shard_index() & (self.0.len() - 1)].0
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|l| &l.0)
    }
}

fn shard_count() -> usize {
    static COUNT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *COUNT.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .next_power_of_two()
            .min(MAX_SHARDS)
    })
}

#[inline]
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i)
}

/// A counter every request adds to, sharded (see [`MAX_SHARDS`]).
#[derive(Debug, Default)]
pub struct ShardedCounter(Sharded<AtomicU64>);

impl ShardedCounter {
    #[inline]
    pub fn add(&self, v: u64) {
        self.0.local().fetch_add(v, Ordering::Relaxed);
    }

    /// The sum over the shards.
    pub fn get(&self) -> u64 {
        self.0
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

type FastState = foldhash::fast::RandomState;

/// How stats are kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StatsOptions {
    /// DISABLE_STATS=false: record anything at all.
    pub enabled: bool,
    /// NEAR_LIMIT_RATIO, in (0, 1].
    pub near_limit_ratio: f32,
    /// SLUICE_MAX_STAT_KEYS: the most distinct per-limit stats keys (plus unknown domains) kept.
    pub max_keys: usize,
    /// PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS: the exposition's response-time histogram in
    /// milliseconds (bounds and sum), the Go service's legacy units, under the same name.
    pub response_time_in_millis: bool,
}

impl Default for StatsOptions {
    fn default() -> Self {
        StatsOptions {
            enabled: true,
            near_limit_ratio: 0.8,
            max_keys: 10_000,
            response_time_in_millis: false,
        }
    }
}

/// One stats key's counters: `ratelimit.service.rate_limit.<key>.<stat>`.
#[derive(Debug, Default)]
pub struct LimitCounters(Sharded<LimitCells>);

/// One shard of a limit's counters: Go's six and the refunds' two fill one cache line; a
/// concurrency limit's three slot counters start the next.
#[derive(Debug, Default)]
struct LimitCells {
    total_hits: AtomicU64,
    over_limit: AtomicU64,
    near_limit: AtomicU64,
    within_limit: AtomicU64,
    shadow_mode: AtomicU64,
    over_limit_with_local_cache: AtomicU64,
    total_negative_hits: AtomicU64,
    negative_hits_ignored: AtomicU64,
    slots_taken: AtomicU64,
    slots_given_back: AtomicU64,
    slots_expired: AtomicU64,
    penalties: AtomicU64,
    penalized: AtomicU64,
}

/// What one descriptor's decision adds to its limit's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Increments {
    pub total_hits: u64,
    pub over_limit: u64,
    pub near_limit: u64,
    pub within_limit: u64,
    pub shadow_mode: u64,
    pub over_limit_with_local_cache: u64,
    /// The Go service's `total_negative_hits`: hits a negative descriptor (a refund) sent.
    pub total_negative_hits: u64,
    /// Sluice's: of those, the ones not taken off (SLUICE_NEGATIVE_HITS).
    pub negative_hits_ignored: u64,
    /// A concurrency limit's slots: taken, given back, expired without a refund.
    pub slots_taken: u64,
    pub slots_given_back: u64,
    pub slots_expired: u64,
    /// Penalties started (`penalty_seconds`): refusals by the counter of a limit with one.
    pub penalties: u64,
    /// Hits refused by a penalty in force, uncounted by the counter (also in `over_limit`).
    pub penalized: u64,
}

/// envoyproxy/ratelimit's counting rules (reference §5): `n = floor(L × ratio)`, computed in
/// `f32` as Go does. A refund (`is_negative_hits`) adds its hits to `total_negative_hits` and
/// nothing else, as in the Go service (its PR #1140).
pub(crate) fn increments(o: &Outcome, near_limit_ratio: f32) -> Increments {
    let n = o.hits;
    let slots = Increments {
        slots_taken: o.slots.taken,
        slots_given_back: o.slots.given_back,
        slots_expired: o.slots.expired,
        ..Increments::default()
    };
    if o.negative {
        return Increments {
            total_negative_hits: n,
            negative_hits_ignored: if o.negative_ignored { n } else { 0 },
            ..slots
        };
    }
    let mut inc = Increments {
        total_hits: n,
        ..slots
    };
    if o.penalized {
        inc.over_limit = n;
        inc.penalized = n;
        if o.shadow_mode {
            inc.shadow_mode = n;
        }
        return inc;
    }
    inc.penalties = u64::from(o.penalty_started);
    if o.from_local_cache {
        inc.over_limit = n;
        inc.over_limit_with_local_cache = n;
        if o.shadow_mode {
            inc.shadow_mode = n;
        }
        return inc;
    }
    let limit = u64::from(o.limit);
    // Go: uint32(math.Floor(float64(float32(limit) * ratio))).
    let near = (o.limit as f32 * near_limit_ratio).floor() as u64;
    let (before, after) = (o.count_before, o.count_after);
    if o.over {
        if before >= limit {
            inc.over_limit = n;
        } else {
            inc.over_limit = after.saturating_sub(limit);
            inc.near_limit = limit - near.max(before);
        }
        if o.shadow_mode {
            inc.shadow_mode = inc.over_limit;
        }
    } else {
        inc.within_limit = n;
        if after > near {
            inc.near_limit = if before >= near { n } else { after - near };
        }
    }
    inc
}

impl LimitCounters {
    /// Adds to this thread's shard.
    fn add(&self, inc: &Increments) {
        let c = self.0.local();
        let add = |c: &AtomicU64, v: u64| {
            if v != 0 {
                c.fetch_add(v, Ordering::Relaxed);
            }
        };
        add(&c.total_hits, inc.total_hits);
        add(&c.over_limit, inc.over_limit);
        add(&c.near_limit, inc.near_limit);
        add(&c.within_limit, inc.within_limit);
        add(&c.shadow_mode, inc.shadow_mode);
        add(
            &c.over_limit_with_local_cache,
            inc.over_limit_with_local_cache,
        );
        add(&c.total_negative_hits, inc.total_negative_hits);
        add(&c.negative_hits_ignored, inc.negative_hits_ignored);
        add(&c.slots_taken, inc.slots_taken);
        add(&c.slots_given_back, inc.slots_given_back);
        add(&c.slots_expired, inc.slots_expired);
        add(&c.penalties, inc.penalties);
        add(&c.penalized, inc.penalized);
    }

    /// How many counters a limit has: [`LimitCounters::NAMES`]' length.
    pub(crate) const COUNT: usize = 13;

    /// The values summed over the shards, in [`LimitCounters::NAMES`] order.
    pub fn values(&self) -> [u64; Self::COUNT] {
        let mut out = [0u64; Self::COUNT];
        for c in self.0.iter() {
            let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
            let shard = [
                load(&c.total_hits),
                load(&c.over_limit),
                load(&c.near_limit),
                load(&c.within_limit),
                load(&c.shadow_mode),
                load(&c.over_limit_with_local_cache),
                load(&c.total_negative_hits),
                load(&c.negative_hits_ignored),
                load(&c.slots_taken),
                load(&c.slots_given_back),
                load(&c.slots_expired),
                load(&c.penalties),
                load(&c.penalized),
            ];
            for (o, v) in out.iter_mut().zip(shard) {
                *o = o.wrapping_add(v);
            }
        }
        out
    }

    pub(crate) const NAMES: [&'static str; Self::COUNT] = [
        "total_hits",
        "over_limit",
        "near_limit",
        "within_limit",
        "shadow_mode",
        "over_limit_with_local_cache",
        "total_negative_hits",
        "negative_hits_ignored",
        "slots_taken",
        "slots_given_back",
        "slots_expired",
        "penalties",
        "penalized",
    ];

    /// Whether the stat at `index` (of [`LimitCounters::NAMES`]) says anything for a series
    /// with these values, so is exported: the Go service's six always; the refund pair once a
    /// refund arrived; the slot counters once a slot moved, which only a concurrency limit's
    /// do. The values only grow, so a series once exported stays (a counter that vanished and
    /// came back would read as a reset to `rate()`); the series that appear start together,
    /// so the first lost refund (`slots_expired`) is an increase from 0, as alerts need.
    pub fn applies(values: &[u64; Self::COUNT], index: usize) -> bool {
        match index {
            0..Self::REFUNDS => true,
            Self::REFUNDS..Self::SLOTS => values[Self::REFUNDS] > 0,
            Self::SLOTS..Self::PENALTIES => Self::holds_slots(values),
            _ => values[Self::PENALTIES] > 0,
        }
    }

    /// Where the refund pair starts in [`LimitCounters::NAMES`] (`total_negative_hits` first).
    const REFUNDS: usize = 6;
    /// Where the slot counters start in [`LimitCounters::NAMES`].
    pub const SLOTS: usize = 8;
    /// Where the penalty pair starts in [`LimitCounters::NAMES`] (`penalties` first: a hit is
    /// penalized only after a penalty started).
    const PENALTIES: usize = 11;

    /// A concurrency limit's series: a slot was taken, given back or expired.
    pub(crate) fn holds_slots(values: &[u64; Self::COUNT]) -> bool {
        values[Self::SLOTS..Self::PENALTIES].iter().any(|&v| v > 0)
    }

    /// The slots a concurrency limit's series holds, from its values ([`LimitCounters::values`]):
    /// taken less given back less expired. Per replica, so it can be negative where one
    /// replica took a slot and another gave it back: the sum over replicas is the limit's.
    pub fn slots_held(values: &[u64; Self::COUNT]) -> i64 {
        let [taken, given_back, expired] = [
            values[Self::SLOTS],
            values[Self::SLOTS + 1],
            values[Self::SLOTS + 2],
        ];
        taken.wrapping_sub(given_back).wrapping_sub(expired) as i64
    }
}

/// One registered stats key: its sanitised name, its counters and the limit they count against.
#[derive(Debug)]
pub struct Entry {
    /// The key after [`sanitize`], as exported.
    pub name: Box<str>,
    pub counters: LimitCounters,
    pub source: Source,
}

/// The limit a stats key counts against, as the exporters look it up when they report the
/// configured limit beside the counters: by the configured limit's full key in the config
/// loaded at that moment (so a limit changed by a reload reports its new value and a removed
/// one reports none), or, for an override, the last one a request carried.
#[derive(Debug)]
pub enum Source {
    /// The configured limit with this `full_key`.
    Limit(Box<str>),
    /// A per-request override: its requests_per_unit and unit, packed by [`pack_override`].
    Override(AtomicU64),
    /// The overflow entry, which many limits share.
    Overflow,
}

/// Where a request-built stats key's limit comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeySource<'a> {
    /// The configured limit with this `full_key` (`detailed_metric`, `value_to_metric`).
    Limit(&'a str),
    /// A per-request override with this unit (its requests_per_unit is the outcome's limit).
    Override(Unit),
}

/// An override's requests_per_unit and unit in one word.
fn pack_override(requests_per_unit: u32, unit: Unit) -> u64 {
    (u64::from(requests_per_unit) << 8) | unit.index() as u64
}

impl Source {
    fn of(key: KeySource<'_>, requests_per_unit: u32) -> Self {
        match key {
            KeySource::Limit(full_key) => Source::Limit(full_key.into()),
            KeySource::Override(unit) => {
                Source::Override(AtomicU64::new(pack_override(requests_per_unit, unit)))
            }
        }
    }

    /// An override's requests_per_unit and unit, as last seen.
    pub(crate) fn override_limit(&self) -> Option<(u32, Unit)> {
        let Source::Override(packed) = self else {
            return None;
        };
        let packed = packed.load(Ordering::Relaxed);
        let unit = Unit::ALL.get((packed & 0xff) as usize).copied()?;
        Some(((packed >> 8) as u32, unit))
    }
}

/// Service-level counters (`ratelimit.service.*` and `ratelimit_server.ShouldRateLimit.*`).
#[derive(Debug, Default)]
pub struct ServiceCounters {
    /// `ratelimit.service.global_shadow_mode`.
    pub global_shadow_mode: AtomicU64,
    /// `ratelimit.service.call.should_rate_limit.service_error`.
    pub service_error: AtomicU64,
    /// `ratelimit.service.call.should_rate_limit.redis_error`: any backend failure.
    pub redis_error: AtomicU64,
    /// `ratelimit_server.ShouldRateLimit.total_requests`: added to by every call, so sharded.
    pub total_requests: ShardedCounter,
    /// Records folded into the overflow entry because the key cap was reached.
    pub folded: AtomicU64,
    /// Reservations (issue 51), one per descriptor: opened by admitted requests, settles
    /// received, and settles that came after a window their estimate was held in had ended (it
    /// kept the estimate).
    pub reservations_opened: AtomicU64,
    pub reservations_settled: AtomicU64,
    pub reservations_settled_late: AtomicU64,
}

/// Upper bounds of the decision-latency histogram, in seconds. Finer than Prometheus's
/// defaults at the low end, where an in-memory decision lives.
pub(crate) const LATENCY_BUCKETS: [f64; 16] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5,
];

/// A fixed-bucket histogram of durations. Buckets are stored non-cumulative (one add per
/// record) and summed when exported.
#[derive(Debug)]
pub struct Histogram {
    bounds_nanos: [u64; LATENCY_BUCKETS.len()],
    cells: Sharded<HistogramCells>,
}

/// One shard of a histogram.
#[derive(Debug)]
struct HistogramCells {
    /// One per bound, plus the +Inf bucket.
    counts: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Default for HistogramCells {
    fn default() -> Self {
        HistogramCells {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            bounds_nanos: LATENCY_BUCKETS.map(|s| (s * 1e9).round() as u64),
            cells: Sharded::default(),
        }
    }
}

/// A histogram's exported values.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound in seconds, cumulative count)`, the +Inf bucket excluded.
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_secs: f64,
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = self
            .bounds_nanos
            .iter()
            .position(|&b| nanos <= b)
            .unwrap_or(self.bounds_nanos.len());
        let cells = self.cells.local();
        cells.counts[i].fetch_add(1, Ordering::Relaxed);
        cells.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let count_of = |i: usize| -> u64 {
            self.cells
                .iter()
                .map(|c| c.counts[i].load(Ordering::Relaxed))
                .fold(0, u64::wrapping_add)
        };
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(LATENCY_BUCKETS.len());
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += count_of(i);
            buckets.push((*bound, cumulative));
        }
        let count = cumulative + count_of(LATENCY_BUCKETS.len());
        let sum_nanos = self
            .cells
            .iter()
            .map(|c| c.sum_nanos.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add);
        HistogramSnapshot {
            buckets,
            count,
            sum_secs: sum_nanos as f64 / 1e9,
        }
    }
}

/// Every stat the service records. One per service; shared with the exporters.
#[derive(Debug)]
pub struct Stats {
    /// Tells this registry's [`StatsSlot`] fills from another's.
    id: u64,
    options: StatsOptions,
    /// Raw (unsanitised) stats key -> entry. Raw, so a lookup never needs to sanitise.
    keys: DashMap<Box<str>, Arc<Entry>, FastState>,
    /// Unknown domain -> `ratelimit.service.rate_limit.<domain>.domain_not_found`.
    not_found: DashMap<Box<str>, Arc<AtomicU64>, FastState>,
    /// Entries in `keys` plus `not_found`, held to `options.max_keys`.
    key_count: AtomicUsize,
    /// The longest request-built key kept; longer ones are folded into the overflow.
    max_key_bytes: usize,
    overflow: Arc<Entry>,
    not_found_overflow: Arc<AtomicU64>,
    pub service: ServiceCounters,
    /// `ratelimit_server.ShouldRateLimit.response_time`.
    pub response_time: Histogram,
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new(StatsOptions::default())
    }
}

impl Stats {
    pub fn new(options: StatsOptions) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Stats {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            options,
            keys: DashMap::default(),
            not_found: DashMap::default(),
            key_count: AtomicUsize::new(0),
            max_key_bytes: usize::MAX,
            overflow: Arc::new(Entry {
                name: OVERFLOW_KEY.into(),
                counters: LimitCounters::default(),
                source: Source::Overflow,
            }),
            not_found_overflow: Arc::new(AtomicU64::new(0)),
            service: ServiceCounters::default(),
            response_time: Histogram::default(),
        }
    }

    /// A registry that records nothing (DISABLE_STATS).
    pub fn disabled() -> Self {
        Stats::new(StatsOptions {
            enabled: false,
            ..StatsOptions::default()
        })
    }

    /// Folds request-built keys (and unknown domains) longer than `max` bytes into the
    /// overflow instead of keeping them.
    pub fn with_max_key_bytes(mut self, max: usize) -> Self {
        self.max_key_bytes = max;
        self
    }

    pub fn options(&self) -> &StatsOptions {
        &self.options
    }

    pub fn enabled(&self) -> bool {
        self.options.enabled
    }

    /// Records a decision against a configured limit whose stats key never depends on the
    /// request: its `full_key`, linked once through `slot`.
    pub(crate) fn record_static(&self, slot: &StatsSlot, full_key: &str, outcome: &Outcome) {
        if !self.options.enabled {
            return;
        }
        let inc = increments(outcome, self.options.near_limit_ratio);
        if let Some(entry) = slot.get(self.id).and_then(|l| l.downcast_ref::<Entry>()) {
            entry.counters.add(&inc);
            return;
        }
        let entry = self.entry(full_key, || Source::Limit(full_key.into()));
        entry.counters.add(&inc);
        slot.fill(self.id, entry);
    }

    /// Records a decision against a stats key built from the request (`detailed_metric`,
    /// `value_to_metric`, overrides), whose limit comes from `source`. Held to the key cap.
    pub(crate) fn record_dynamic(&self, key: &str, source: KeySource<'_>, outcome: &Outcome) {
        if !self.options.enabled {
            return;
        }
        let inc = increments(outcome, self.options.near_limit_ratio);
        if key.len() > self.max_key_bytes {
            self.service.folded.fetch_add(1, Ordering::Relaxed);
            self.overflow.counters.add(&inc);
            return;
        }
        let entry = self.entry(key, || Source::of(source, outcome.limit));
        entry.counters.add(&inc);
        if let (KeySource::Override(unit), Source::Override(last)) = (source, &entry.source) {
            // The override a request carries can change from one request to the next; the
            // last one is reported. A read, and a write only when it changed.
            let now = pack_override(outcome.limit, unit);
            if last.load(Ordering::Relaxed) != now {
                last.store(now, Ordering::Relaxed);
            }
        }
    }

    /// The entry for a raw key: found, else added (with the limit `source` gives) while under
    /// the cap, else the overflow.
    fn entry(&self, key: &str, source: impl FnOnce() -> Source) -> Arc<Entry> {
        if let Some(e) = self.keys.get(key) {
            return Arc::clone(e.value());
        }
        if !self.reserve_key() {
            self.service.folded.fetch_add(1, Ordering::Relaxed);
            return Arc::clone(&self.overflow);
        }
        let mut added = false;
        let entry = self
            .keys
            .entry(key.into())
            .or_insert_with(|| {
                added = true;
                Arc::new(Entry {
                    name: sanitize(key).into(),
                    counters: LimitCounters::default(),
                    source: source(),
                })
            })
            .clone();
        if !added {
            // Lost a race to insert the same key: give the reservation back.
            self.key_count.fetch_sub(1, Ordering::Relaxed);
        }
        entry
    }

    /// Takes one place under the cap, if any is left.
    fn reserve_key(&self) -> bool {
        self.key_count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.options.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    /// `ratelimit.service.rate_limit.<domain>.domain_not_found`, held to the key cap.
    pub(crate) fn domain_not_found(&self, domain: &str) {
        if !self.options.enabled {
            return;
        }
        if let Some(c) = self.not_found.get(domain) {
            c.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if domain.len() > self.max_key_bytes || !self.reserve_key() {
            self.service.folded.fetch_add(1, Ordering::Relaxed);
            self.not_found_overflow.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut added = false;
        self.not_found
            .entry(domain.into())
            .or_insert_with(|| {
                added = true;
                Arc::new(AtomicU64::new(0))
            })
            .fetch_add(1, Ordering::Relaxed);
        if !added {
            self.key_count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// One `ShouldRateLimit` call's end: `total_requests`, `response_time`, and its error.
    pub(crate) fn request_done(&self, elapsed: Duration, error: Option<ErrorKind>) {
        if !self.options.enabled {
            return;
        }
        self.service.total_requests.add(1);
        self.response_time.record(elapsed);
        match error {
            None => {}
            Some(ErrorKind::Service) => {
                self.service.service_error.fetch_add(1, Ordering::Relaxed);
            }
            Some(ErrorKind::Backend) => {
                self.service.redis_error.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A backend failure that was answered anyway (fail-open).
    pub(crate) fn backend_error(&self) {
        if self.options.enabled {
            self.service.redis_error.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request's reservations, one per descriptor: those it opened, and its settles, `late`
    /// of them after a window that held their estimate had ended.
    pub fn reservations(&self, opened: u64, settled: u64, late: u64) {
        if self.options.enabled {
            let s = &self.service;
            s.reservations_opened.fetch_add(opened, Ordering::Relaxed);
            s.reservations_settled.fetch_add(settled, Ordering::Relaxed);
            s.reservations_settled_late
                .fetch_add(late, Ordering::Relaxed);
        }
    }

    /// Global SHADOW_MODE turned an OVER_LIMIT answer into OK.
    pub(crate) fn global_shadow_mode(&self) {
        if self.options.enabled {
            self.service
                .global_shadow_mode
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every per-limit entry (the overflow one included when it was used), in no order.
    pub fn entries(&self) -> Vec<Arc<Entry>> {
        let mut out: Vec<Arc<Entry>> = self.keys.iter().map(|e| Arc::clone(e.value())).collect();
        if self.overflow.counters.values()[0] > 0 || self.service.folded.load(Ordering::Relaxed) > 0
        {
            out.push(Arc::clone(&self.overflow));
        }
        out
    }

    /// `(sanitised domain, count)` for every unknown domain seen, the overflow included.
    pub(crate) fn domains_not_found(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .not_found
            .iter()
            .map(|e| (sanitize(e.key()), e.value().load(Ordering::Relaxed)))
            .collect();
        let overflowed = self.not_found_overflow.load(Ordering::Relaxed);
        if overflowed > 0 {
            out.push((OVERFLOW_KEY.to_owned(), overflowed));
        }
        out
    }

    /// Distinct keys held (per-limit keys plus unknown domains).
    pub(crate) fn key_count(&self) -> usize {
        self.key_count.load(Ordering::Relaxed)
    }
}

/// Why a call got no answer, as the Go service counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// `should_rate_limit.service_error`: a bad request or no config.
    Service,
    /// `should_rate_limit.redis_error`: the backend failed.
    Backend,
}

/// The Go service's stat-name sanitising: `:` and `|` become `_`, and so do the dots of an
/// IPv4 address (`10.0.0.1` -> `10_0_0_1`), whose dots would otherwise read as separators.
pub(crate) fn sanitize(key: &str) -> String {
    let mut out: Vec<u8> = key
        .bytes()
        .map(|b| if b == b':' || b == b'|' { b'_' } else { b })
        .collect();
    let mut i = 0;
    while i < out.len() {
        if let Some(len) = ipv4_at(&out[i..])
            && (i == 0 || !out[i - 1].is_ascii_digit())
        {
            for b in &mut out[i..i + len] {
                if *b == b'.' {
                    *b = b'_';
                }
            }
            i += len;
        } else {
            i += 1;
        }
    }
    // Only ASCII bytes were replaced by ASCII bytes, so this is still UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The length of a dotted quad (`d{1,3}` four times, joined by dots) at the start of `s`, if
/// one is there and is not followed by another digit.
fn ipv4_at(s: &[u8]) -> Option<usize> {
    let mut at = 0;
    for part in 0..4 {
        if part > 0 {
            if s.get(at) != Some(&b'.') {
                return None;
            }
            at += 1;
        }
        let digits = s[at..]
            .iter()
            .take(4)
            .take_while(|b| b.is_ascii_digit())
            .count();
        if !(1..=3).contains(&digits) {
            return None;
        }
        at += digits;
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: KeySource<'static> = KeySource::Limit("d.user");

    fn outcome(hits: u64, limit: u32, before: u64) -> Outcome {
        let after = before + hits;
        Outcome {
            hits,
            limit,
            count_before: before,
            count_after: after,
            over: after > u64::from(limit),
            from_local_cache: false,
            shadow_mode: false,
            negative: false,
            negative_ignored: false,
            slots: Default::default(),
            penalized: false,
            penalty_started: false,
        }
    }

    #[test]
    fn go_arithmetic_within_near_and_over() {
        // L = 10, n = 8.
        let i = increments(&outcome(1, 10, 0), 0.8);
        assert_eq!((i.total_hits, i.within_limit, i.near_limit), (1, 1, 0));
        // after = 9 > 8 and before 8 >= 8: near += N.
        let i = increments(&outcome(1, 10, 8), 0.8);
        assert_eq!((i.within_limit, i.near_limit), (1, 1));
        // before 6 < 8, after 10: near += after - n = 2.
        let i = increments(&outcome(4, 10, 6), 0.8);
        assert_eq!((i.within_limit, i.near_limit, i.over_limit), (4, 2, 0));
        // before 6 < L, after 13 > L: over += 3, near += L - max(n, b) = 2.
        let i = increments(&outcome(7, 10, 6), 0.8);
        assert_eq!((i.within_limit, i.near_limit, i.over_limit), (0, 2, 3));
        // before 9 >= n: near += L - 9 = 1.
        let i = increments(&outcome(5, 10, 9), 0.8);
        assert_eq!((i.near_limit, i.over_limit), (1, 4));
        // Already over: over += N.
        let i = increments(&outcome(3, 10, 11), 0.8);
        assert_eq!((i.total_hits, i.near_limit, i.over_limit), (3, 0, 3));
    }

    #[test]
    fn shadow_counts_with_over_and_local_cache_counts_both() {
        let mut o = outcome(7, 10, 6);
        o.shadow_mode = true;
        let i = increments(&o, 0.8);
        assert_eq!((i.over_limit, i.shadow_mode), (3, 3));
        let o = Outcome {
            from_local_cache: true,
            ..outcome(2, 10, 11)
        };
        let i = increments(&o, 0.8);
        assert_eq!(
            (
                i.total_hits,
                i.over_limit,
                i.over_limit_with_local_cache,
                i.near_limit
            ),
            (2, 2, 2, 0)
        );
    }

    #[test]
    fn a_refund_counts_total_negative_hits_and_nothing_else() {
        // A refund of 2 on a counter still over its limit: no over, near or within.
        let o = Outcome {
            negative: true,
            ..outcome(0, 10, 12)
        };
        let o = Outcome { hits: 2, ..o };
        assert_eq!(
            increments(&o, 0.8),
            Increments {
                total_negative_hits: 2,
                ..Increments::default()
            }
        );
        let ignored = increments(
            &Outcome {
                negative_ignored: true,
                slots: Default::default(),
                ..o
            },
            0.8,
        );
        assert_eq!(
            (ignored.total_negative_hits, ignored.negative_hits_ignored),
            (2, 2)
        );
        let counters = LimitCounters::default();
        counters.add(&ignored);
        assert_eq!(counters.values(), [0, 0, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 0]);
    }

    /// A refusal that starts a penalty counts as Go counts any refusal, plus one penalty; a hit
    /// refused by the penalty is over the limit and penalized, never near or within it.
    #[test]
    fn penalties_count_their_starts_and_the_hits_they_refuse() {
        let started = increments(
            &Outcome {
                penalty_started: true,
                ..outcome(1, 3, 3)
            },
            0.8,
        );
        assert_eq!((started.over_limit, started.penalties), (1, 1));
        let held = Outcome {
            penalized: true,
            count_before: 0,
            count_after: 0,
            over: true,
            ..outcome(2, 3, 0)
        };
        let i = increments(&held, 0.8);
        assert_eq!(
            (
                i.total_hits,
                i.over_limit,
                i.penalized,
                i.penalties,
                i.near_limit
            ),
            (2, 2, 2, 0, 0)
        );
        let shadow = increments(
            &Outcome {
                shadow_mode: true,
                ..held
            },
            0.8,
        );
        assert_eq!(shadow.shadow_mode, 2);
        let counters = LimitCounters::default();
        counters.add(&started);
        counters.add(&i);
        let values = counters.values();
        assert_eq!(values[11..], [1, 2]);
        assert!(LimitCounters::applies(&values, 12));
        assert!(!LimitCounters::applies(
            &LimitCounters::default().values(),
            12
        ));
    }

    #[test]
    fn near_threshold_is_floored_in_f32() {
        // floor(3 × 0.8) = 2: hit 3 (before 2) is near.
        let i = increments(&outcome(1, 3, 2), 0.8);
        assert_eq!(i.near_limit, 1);
        let i = increments(&outcome(1, 3, 1), 0.8);
        assert_eq!(i.near_limit, 0);
    }

    #[test]
    fn sanitize_replaces_separators_and_ipv4_dots() {
        assert_eq!(sanitize("d.k_a:b|c"), "d.k_a_b_c");
        assert_eq!(
            sanitize("domain.remote_address_10.0.0.1.path"),
            "domain.remote_address_10_0_0_1.path"
        );
        assert_eq!(sanitize("d.k_192.168.1.254"), "d.k_192_168_1_254");
        // Not an address: too few parts, or a part too long.
        assert_eq!(sanitize("d.v_1.2.3"), "d.v_1.2.3");
        assert_eq!(sanitize("d.v_1234.1.1.1"), "d.v_1234.1.1.1");
    }

    #[test]
    fn keys_past_the_cap_fold_into_the_overflow_entry() {
        let stats = Stats::new(StatsOptions {
            max_keys: 3,
            ..StatsOptions::default()
        });
        for i in 0..100 {
            stats.record_dynamic(&format!("d.user_{i}"), LIMIT, &outcome(1, 10, 0));
        }
        stats.record_dynamic("d.user_0", LIMIT, &outcome(1, 10, 1));
        assert_eq!(stats.key_count(), 3);
        let entries = stats.entries();
        assert_eq!(entries.len(), 4);
        let overflow = entries.iter().find(|e| &*e.name == OVERFLOW_KEY).unwrap();
        assert_eq!(overflow.counters.values()[0], 97);
        assert_eq!(stats.service.folded.load(Ordering::Relaxed), 97);
        for i in 0..20 {
            stats.domain_not_found(&format!("nope{i}"));
        }
        assert_eq!(stats.domains_not_found(), vec![(OVERFLOW_KEY.into(), 20)]);
    }

    #[test]
    fn keys_past_the_byte_cap_fold_into_the_overflow_entry() {
        let stats = Stats::default().with_max_key_bytes(16);
        let long = format!("d.user_{}", "x".repeat(60_000));
        for _ in 0..5 {
            stats.record_dynamic(&long, LIMIT, &outcome(1, 10, 0));
            stats.domain_not_found(&"d".repeat(60_000));
        }
        stats.record_dynamic("d.user_short", LIMIT, &outcome(1, 10, 0));
        stats.domain_not_found("short");
        assert_eq!(stats.key_count(), 2, "only the short keys are kept");
        let overflow = stats.entries();
        let overflow = overflow.iter().find(|e| &*e.name == OVERFLOW_KEY).unwrap();
        assert_eq!(overflow.counters.values()[0], 5);
        assert_eq!(stats.service.folded.load(Ordering::Relaxed), 10);
        assert!(
            stats
                .domains_not_found()
                .contains(&(OVERFLOW_KEY.into(), 5))
        );
    }

    #[test]
    fn a_slot_links_once_and_not_across_registries() {
        let a = Stats::default();
        let b = Stats::default();
        let slot = StatsSlot::default();
        a.record_static(&slot, "d.k", &outcome(1, 10, 0));
        a.record_static(&slot, "d.k", &outcome(1, 10, 1));
        b.record_static(&slot, "d.k", &outcome(1, 10, 0));
        let hits = |s: &Stats| s.entries()[0].counters.values()[0];
        assert_eq!((hits(&a), hits(&b)), (2, 1));
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.record(Duration::from_micros(10));
        h.record(Duration::from_micros(70));
        h.record(Duration::from_secs(5));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets[0], (0.000_025, 1));
        assert_eq!(s.buckets[2], (0.000_1, 2));
        assert_eq!(s.buckets.last().unwrap().1, 2);
        assert!((s.sum_secs - 5.00008).abs() < 1e-9);
    }
}
