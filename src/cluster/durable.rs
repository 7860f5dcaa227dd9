//! Durability for the peer cluster (SLUICE_PEER_WRITE_BEHIND): owners write their counters
//! behind to Redis, and a node that takes over a key loads its count from Redis before it
//! answers the key's first hit, so losing, restarting or adding a node does not reset limits.
//!
//! - **Write-behind.** Every hit this node applies as an owner marks its counter dirty (one
//!   map probe; nothing else on the request path). Every SLUICE_PEER_WRITE_BEHIND_MS a task
//!   takes the dirty set and writes the counters' current states with [`WRITE_MAX`], pipelined,
//!   one script call per counter, each key with a TTL that ends with its window. A failed flush
//!   puts its counters back in the dirty set for the next one.
//! - **Take-over load.** Before a hit is applied to a counter this node holds nothing for (no
//!   count of the current window, no bucket in motion), the count is loaded from Redis and
//!   merged in, if either this node saw a change that can move keys to it (its own start, a
//!   peer marked down, a new peer list) since the counter's horizon began (the window's start;
//!   the previous window's for a sliding window; `now - burst time` for a bucket), or the key's
//!   owner among all peers is another node (this node is standing in, perhaps because another
//!   node saw the owner fail first). In a cluster that has not changed since the horizon began,
//!   a counter with no state has had no hits anywhere, so no load is needed: steady-state keys
//!   never pay a Redis round trip. Concurrent first hits on one counter share one load; a load
//!   is bounded by REDIS_TIMEOUT or half of SLUICE_PEER_TIMEOUT_MS, whichever is shorter (a
//!   load runs inside a peer's forwarded call, and a call that outlasts the peer's deadline
//!   gets this node marked down); when Redis fails or is slower than that, the hit is answered
//!   from local state and the failure counted, and loads are skipped for the next second.
//! - **Merging.** A loaded or flushed-back state is merged by taking the larger count per
//!   window (the later arrival time for a bucket), so nothing is counted twice and nothing is
//!   lowered. The flush script answers what Redis holds after the write; when that is more than
//!   this node holds (another node counted the key meanwhile: a returning owner that kept old
//!   counts, or two nodes that disagreed about the owner), it is merged back, so such nodes
//!   converge within one flush interval.
//!
//! **Keys.** `CACHE_KEY_PREFIX + "sluice:wb:{" + stem + "}:" + kind`, where the stem is the
//! counter key without the prefix and the kind is `fw:<unit s>:<window index>` (fixed window:
//! the count), `sw:<unit s>:<window index>` (sliding window: that window's count) or `gcra`
//! (buckets: the theoretical arrival time in whole µs, rounded up), written by
//! [`crate::key::write_behind_key`]. They cannot be taken for the Redis backend's
//! keys (`prefix + domain_...`, Go-compatible). The stem is a hash tag, so all of one
//! descriptor's keys are in one Redis Cluster slot: a sliding window's two keys are read and
//! written by one call, and on Redis Cluster each descriptor's writes are one pipeline.
//!
//! **Concurrency limits** keep slots, not counts: their write-behind is [`slots`]'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dashmap::DashMap;
use redis::Value;

use super::config::WriteBehind;
use crate::clock::{Clock, Timestamp};
use crate::limiter::{CounterKind, Quota, bucket, fixed_window, sliding_window};
use crate::store::{Hit, MemoryStore, RedisLink, StoreError};
use crate::telemetry::LogLimiter;

mod slots;

/// Raises write-behind counters, and lowers them only by the refunds this owner made.
///
/// KEYS: one or more write-behind keys, all with the same hash tag (one descriptor's), each
/// a string holding an integer: a count, or a bucket's arrival time in µs.
/// ARGV: for the i-th key, `ARGV[3i-2]` the value this owner holds, `ARGV[3i-1]` a TTL in ms
/// and `ARGV[3i]` what this owner refunded since its last write (hits, or a bucket's µs).
/// Each key becomes `max(held - refunded, value)`, with its TTL, when that differs from what
/// it holds: with nothing refunded, raised to the value when it holds less, else left (and its
/// TTL) alone, so a stale or slow owner can never undo a newer count; a refund takes off what
/// was refunded and never goes below what this owner holds.
/// Returns what each key holds afterwards.
pub(crate) const WRITE_MAX: &str = r#"
local out = {}
for i, key in ipairs(KEYS) do
  local v = tonumber(ARGV[3 * i - 2])
  local cur = tonumber(redis.call('GET', key) or '0') or 0
  local target = math.max(cur - tonumber(ARGV[3 * i]), v)
  if target ~= cur then
    redis.call('SET', key, string.format('%.0f', target), 'PX', ARGV[3 * i - 1])
    cur = target
  end
  out[i] = cur
end
return out
"#;

/// Extra life given to every key past the end of its window, for clocks that disagree.
const GRACE_MS: u64 = 1_000;
/// Counters per pipeline on a single Redis.
const PIPELINE_COUNTERS: usize = 256;

/// When this node last saw a change that can move keys to it: its own start, a peer marked
/// down, a new peer list. (A peer coming back only takes keys away.)
#[derive(Debug, Default)]
pub struct RingChanges {
    epoch: AtomicU64,
    last_us: AtomicU64,
    /// When a peer marked down last answered again (0: never).
    returned_us: AtomicU64,
}

impl RingChanges {
    pub fn new(start: Timestamp) -> Self {
        RingChanges {
            epoch: AtomicU64::new(0),
            last_us: AtomicU64::new(start.micros()),
            returned_us: AtomicU64::new(0),
        }
    }

    /// A peer marked down answers again at `now`: a change, after which an owner may find its
    /// keys granted by a stand-in meanwhile (lease mode rebuilds them).
    pub(crate) fn record_return(&self, now: Timestamp) {
        self.returned_us.fetch_max(now.micros(), Ordering::SeqCst);
        self.record(now);
    }

    /// When a peer marked down last answered again.
    pub(crate) fn last_return(&self) -> Timestamp {
        Timestamp::from_micros(self.returned_us.load(Ordering::SeqCst))
    }

    pub fn record(&self, now: Timestamp) {
        self.last_us.fetch_max(now.micros(), Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// (how many changes so far, when the last one was).
    pub fn last(&self) -> (u64, Timestamp) {
        (
            self.epoch.load(Ordering::SeqCst),
            Timestamp::from_micros(self.last_us.load(Ordering::SeqCst)),
        )
    }
}

/// What the write-behind did, for `/stats` and `/metrics`.
#[derive(Debug, Default)]
pub struct DurableStats {
    /// Flushes that wrote at least one counter.
    pub flushes: AtomicU64,
    /// Counters written (one script call each).
    pub flushed_counters: AtomicU64,
    /// Pipelines that failed; their counters are retried by the next flush.
    pub flush_failures: AtomicU64,
    /// Counters Redis held more for than this node, merged back after a flush.
    pub merged_back: AtomicU64,
    /// Take-over loads made (one Redis round trip each).
    pub loads: AtomicU64,
    /// Loads that found a count in Redis.
    pub loads_found: AtomicU64,
    /// Loads that failed; those hits were answered from local state.
    pub load_failures: AtomicU64,
    /// Loads not tried because Redis failed less than a second before.
    pub loads_skipped: AtomicU64,
}

impl DurableStats {
    /// (name, value) pairs, for the exporters.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("flushes", v(&self.flushes)),
            ("flushed_counters", v(&self.flushed_counters)),
            ("flush_failures", v(&self.flush_failures)),
            ("merged_back", v(&self.merged_back)),
            ("loads", v(&self.loads)),
            ("loads_found", v(&self.loads_found)),
            ("load_failures", v(&self.load_failures)),
            ("loads_skipped", v(&self.loads_skipped)),
        ]
    }
}

/// One counter's take-over load, shared by its concurrent first hits.
struct LoadSlot {
    /// The ring change count when it was made: a later change calls for a new load.
    epoch: u64,
    /// After this (µs) the load no longer says anything about the counter.
    until_us: u64,
    done: tokio::sync::OnceCell<()>,
}

/// One counter's write: per key, its window index (0 for buckets), value, TTL in ms and the
/// refunds it takes off.
struct Write {
    stem: Box<str>,
    kind: CounterKind,
    /// The current window's index when the state was read (0 for buckets).
    window: u64,
    keys: Vec<String>,
    parts: Vec<Part>,
}

/// One key of a [`Write`].
#[derive(Clone, Copy, Debug)]
struct Part {
    window: u64,
    value: u64,
    ttl_ms: u64,
    /// Refunded since the last write: hits, or a bucket's µs.
    refunded: u64,
}

/// What one stem's counters refunded since the last flush: per kind and window index (0 for
/// buckets), hits or a bucket's µs.
type Refunds = smallvec::SmallVec<[(CounterKind, u64, u64); 1]>;

/// The write-behind and take-over loads of one node.
pub struct Durable {
    redis: RedisLink,
    local: Arc<MemoryStore>,
    changes: Arc<RingChanges>,
    prefix: String,
    write_sha: String,
    /// Counter stem -> the [`CounterKind`]s changed since the last flush.
    dirty: DashMap<Box<str>, Kinds, foldhash::fast::RandomState>,
    /// Concurrency counter stem -> its quota, changed since the last flush ([`slots`]).
    dirty_slots: DashMap<Box<str>, Quota, foldhash::fast::RandomState>,
    /// Counter stem -> what it refunded since the last flush (also marked dirty).
    refunded: DashMap<Box<str>, Refunds, foldhash::fast::RandomState>,
    /// `<kind>:<stem>` -> its load.
    loads: DashMap<Box<str>, Arc<LoadSlot>, foldhash::fast::RandomState>,
    /// Until when (µs) loads are skipped because Redis just failed.
    redis_down_until: AtomicU64,
    /// The longest a take-over load waits for Redis (see [`Durable::new`]).
    load_timeout: Duration,
    stats: DurableStats,
    failures: LogLimiter,
}

impl Durable {
    /// Connects to Redis (in the background; never waits for it). `load_timeout` bounds each
    /// take-over load, within REDIS_TIMEOUT: the cluster passes half the peers' deadline when
    /// that is shorter, so an owner loading for a forwarded hit still answers in time.
    pub fn new(
        settings: &WriteBehind,
        local: Arc<MemoryStore>,
        changes: Arc<RingChanges>,
        load_timeout: Duration,
    ) -> Result<Self, StoreError> {
        Ok(Durable {
            redis: RedisLink::start("write_behind", &settings.redis, &[WRITE_MAX])?,
            local,
            changes,
            prefix: settings.key_prefix.clone(),
            write_sha: redis::Script::new(WRITE_MAX).get_hash().to_owned(),
            dirty: DashMap::default(),
            dirty_slots: DashMap::default(),
            refunded: DashMap::default(),
            loads: DashMap::default(),
            redis_down_until: AtomicU64::new(0),
            load_timeout: load_timeout.min(settings.redis.timeout),
            stats: DurableStats::default(),
            failures: LogLimiter::new(Duration::from_secs(1)),
        })
    }

    /// Starts the flush task: every `interval`, at the time `clock` says. It stops when the
    /// last `Arc` is dropped.
    pub(crate) fn spawn_flusher(
        self: &Arc<Self>,
        clock: Arc<dyn Clock>,
        interval: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Durable> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            // A flush slower than the interval delays the next one: one flush at a time.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(durable) = weak.upgrade() else {
                    return;
                };
                durable.flush(clock.now()).await;
            }
        })
    }

    /// True once Redis has answered (loads and flushes before that fail and are counted).
    pub fn is_ready(&self) -> bool {
        self.redis.is_ready()
    }

    pub fn stats(&self) -> &DurableStats {
        &self.stats
    }

    /// The breaker of the Redis the counters are written behind to.
    pub(crate) fn redis_breaker(&self) -> crate::store::redis::BreakerStats {
        self.redis.breaker()
    }

    /// Counters changed since the last flush.
    pub fn dirty_counters(&self) -> usize {
        self.dirty.iter().map(|e| e.value().len()).sum::<usize>() + self.dirty_slots.len()
    }

    fn redis_key(&self, stem: &str, kind: CounterKind, window: u64) -> String {
        crate::key::write_behind_key(&self.prefix, stem, kind, window)
    }

    /// Marks the counters of hits this node applied as changed. No I/O, no await.
    pub fn mark_dirty(&self, hits: &[Hit<'_>]) {
        for h in hits {
            let Some(kind) = CounterKind::of_quota(&h.quota) else {
                self.mark_slots_dirty(h);
                continue;
            };
            // Read path first: a counter already dirty needs only a shard read lock.
            let seen = self.dirty.get(h.key).is_some_and(|k| k.contains(&kind));
            if !seen {
                mark(&mut self.dirty.entry(Box::from(h.key)).or_default(), kind);
            }
        }
    }

    /// Records refunds this node made as an owner (after making them), so that the next flush
    /// takes them off the copy in Redis: a write only raises a count, unless it says what the
    /// owner refunded since its last write ([`WRITE_MAX`]). No I/O, no await.
    pub fn mark_refunded(&self, now: Timestamp, hits: &[Hit<'_>]) {
        // Dirty first: a flush takes the refunds before the marks, so a refund it takes always
        // comes with its counter's write.
        self.mark_dirty(hits);
        for h in hits.iter().filter(|h| h.hits > 0) {
            let Some(kind) = CounterKind::of_quota(&h.quota) else {
                continue;
            };
            let (window, amount) = match kind {
                CounterKind::Fixed(u) => (u.index(now.secs()), h.hits),
                CounterKind::Sliding(u) => (sliding_window::window_index(now.micros(), u), h.hits),
                CounterKind::Bucket => {
                    let Some(shape) = bucket::Shape::of(&h.quota) else {
                        continue;
                    };
                    // Whole µs, rounded down: the copy never gets more back than the bucket.
                    let span = u128::from(h.hits).saturating_mul(shape.interval());
                    let us = shape.split(span).0;
                    (0, u64::try_from(us).unwrap_or(u64::MAX))
                }
            };
            add_refund(
                &mut self.refunded.entry(Box::from(h.key)).or_default(),
                (kind, window, amount),
            );
        }
    }

    /// Loads, before they are applied, the counters of `hits` this node may have taken over
    /// (see the module docs). `elsewhere(key)` says whether the key's owner among all peers is
    /// another node. Never fails: a failed load is counted and the hit goes on from local state.
    pub async fn take_over(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        elsewhere: impl Fn(&str) -> bool,
    ) {
        let (epoch, changed) = self.changes.last();
        self.take_over_slots(now, hits, changed, &elsewhere).await;
        let due: Vec<(&Hit<'_>, CounterKind, Timestamp)> = hits
            .iter()
            .filter_map(|h| {
                let kind = CounterKind::of_quota(&h.quota)?;
                if self.local.holds(kind, h.key, now) {
                    return None;
                }
                let (start, until) = horizon(kind, &h.quota, now)?;
                (changed >= start || elsewhere(h.key)).then_some((h, kind, until))
            })
            .collect();
        if due.is_empty() {
            return;
        }
        if now.micros() < self.redis_down_until.load(Ordering::Relaxed) {
            self.stats
                .loads_skipped
                .fetch_add(due.len() as u64, Ordering::Relaxed);
            return;
        }
        let loads = due.into_iter().filter_map(|(h, kind, until)| {
            let id: Box<str> = format!("{kind:?}:{}", h.key).into();
            let fresh = || {
                Arc::new(LoadSlot {
                    epoch,
                    until_us: until.micros(),
                    done: tokio::sync::OnceCell::new(),
                })
            };
            // Bounded like the counters: past that, a load is skipped rather than remembered.
            if self.loads.len() >= self.local.max_counters() && !self.loads.contains_key(&id) {
                self.stats.loads_skipped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            let slot = self
                .loads
                .entry(id)
                .and_modify(|s| {
                    if s.epoch != epoch || s.until_us <= now.micros() {
                        *s = fresh();
                    }
                })
                .or_insert_with(fresh)
                .clone();
            Some(async move {
                slot.done.get_or_init(|| self.load(kind, h.key, now)).await;
            })
        });
        futures_util::future::join_all(loads).await;
    }

    /// One take-over load: reads the counter's keys and merges what they hold.
    async fn load(&self, kind: CounterKind, stem: &str, now: Timestamp) {
        self.stats.loads.fetch_add(1, Ordering::Relaxed);
        let (window, keys) = self.keys_now(kind, stem, now);
        let mut pipe = redis::pipe();
        pipe.cmd("MGET").arg(&keys);
        let reply = tokio::time::timeout(self.load_timeout, self.redis.run(&pipe)).await;
        let values = match reply.unwrap_or_else(|_| Err(self.load_too_slow())) {
            Ok(reply) => reply.first().map(integers).unwrap_or_default(),
            Err(e) => {
                self.stats.load_failures.fetch_add(1, Ordering::Relaxed);
                self.redis_failed(now, "take-over load", &e);
                return;
            }
        };
        let Some(state) = state_from(kind, window, &values, now) else {
            return;
        };
        self.stats.loads_found.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.local.merge_max(kind, stem, state, now) {
            tracing::debug!(error = %e, "cannot keep a loaded count");
        }
    }

    fn load_too_slow(&self) -> StoreError {
        StoreError::Backend {
            message: format!(
                "Redis did not answer a take-over load within {:?} (REDIS_TIMEOUT, or half of SLUICE_PEER_TIMEOUT_MS if shorter)",
                self.load_timeout
            ),
        }
    }

    /// The window index and keys that hold a counter's state at `now`: the window's count
    /// (fixed), the current and previous windows' counts (sliding), the arrival time (bucket).
    fn keys_now(&self, kind: CounterKind, stem: &str, now: Timestamp) -> (u64, Vec<String>) {
        match kind {
            CounterKind::Fixed(u) => {
                let w = u.index(now.secs());
                (w, vec![self.redis_key(stem, kind, w)])
            }
            CounterKind::Sliding(u) => {
                let w = sliding_window::window_index(now.micros(), u);
                let keys = vec![
                    self.redis_key(stem, kind, w),
                    self.redis_key(stem, kind, w.saturating_sub(1)),
                ];
                (w, keys)
            }
            CounterKind::Bucket => (0, vec![self.redis_key(stem, kind, 0)]),
        }
    }

    fn redis_failed(&self, now: Timestamp, what: &str, e: &StoreError) {
        let pause = 1_000_000u64.max(u64::try_from(self.redis.timeout().as_micros()).unwrap_or(0));
        self.redis_down_until
            .fetch_max(now.micros().saturating_add(pause), Ordering::Relaxed);
        if let Some(suppressed) = self.failures.check() {
            tracing::warn!(error = %e, suppressed, "write-behind Redis failed ({what}); deciding from memory");
        }
    }

    /// Writes every counter changed since the last flush; returns how many were written.
    pub async fn flush(&self, now: Timestamp) -> usize {
        let slots = self.flush_slots(now).await;
        let writes = self.take_writes(now);
        // Loads whose horizon has passed, or that a later ring change outdated, say nothing.
        let (epoch, _) = self.changes.last();
        self.loads
            .retain(|_, s| s.epoch == epoch && s.until_us > now.micros());
        if writes.is_empty() {
            self.stats
                .flushed_counters
                .fetch_add(slots as u64, Ordering::Relaxed);
            return slots;
        }
        let groups = self.pipelines(&writes);
        let replies = futures_util::future::join_all(
            groups
                .iter()
                .map(|range| self.send_pipeline(&writes[range.clone()])),
        )
        .await;
        let mut written = slots;
        for (range, reply) in groups.into_iter().zip(replies) {
            written += self.settle(&writes[range], reply, now);
        }
        self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        self.stats
            .flushed_counters
            .fetch_add(written as u64, Ordering::Relaxed);
        written
    }

    /// Takes the dirty marks and makes the write of each marked counter from its state now.
    fn take_writes(&self, now: Timestamp) -> Vec<Write> {
        // The refunds first, then the marks: a refund taken now had its counter marked before.
        let mut refunds: std::collections::HashMap<Box<str>, Refunds> = Default::default();
        self.refunded.retain(|stem, r| {
            refunds.insert(stem.clone(), std::mem::take(r));
            false
        });
        let mut taken: Vec<(Box<str>, Kinds)> = Vec::new();
        // One shard at a time, under its write lock: a hit marking a counter meanwhile lands
        // either in what is taken now or in the next flush, never in neither.
        self.dirty.retain(|stem, kinds| {
            taken.push((stem.clone(), std::mem::take(kinds)));
            false
        });
        taken
            .into_iter()
            .flat_map(|(stem, kinds)| kinds.into_iter().map(move |kind| (stem.clone(), kind)))
            .filter_map(|(stem, kind)| {
                let refunds = refunds.get(&stem).map_or(&[][..], |r| r.as_slice());
                self.write_for(stem.clone(), kind, refunds, now)
            })
            .collect()
    }

    /// How `writes` split into pipelines: one per descriptor on Redis Cluster (its keys share a
    /// slot), else batches of [`PIPELINE_COUNTERS`].
    fn pipelines(&self, writes: &[Write]) -> Vec<std::ops::Range<usize>> {
        let mut groups: Vec<std::ops::Range<usize>> = Vec::new();
        let mut start = 0;
        for i in 1..=writes.len() {
            let split = i == writes.len()
                || if self.redis.is_cluster() {
                    writes[i].stem != writes[start].stem
                } else {
                    i - start >= PIPELINE_COUNTERS
                };
            if split {
                groups.push(start..i);
                start = i;
            }
        }
        groups
    }

    /// One pipeline of write scripts.
    async fn send_pipeline(&self, group: &[Write]) -> Result<Vec<redis::Value>, StoreError> {
        let mut pipe = redis::pipe();
        for w in group {
            let cmd = pipe
                .cmd("EVALSHA")
                .arg(&self.write_sha)
                .arg(w.keys.len())
                .arg(&w.keys);
            for p in &w.parts {
                cmd.arg(p.value).arg(p.ttl_ms).arg(p.refunded);
            }
        }
        self.redis.run(&pipe).await
    }

    /// Merges a pipeline's answers back, or marks its counters dirty again; how many were
    /// written.
    fn settle(
        &self,
        group: &[Write],
        reply: Result<Vec<redis::Value>, StoreError>,
        now: Timestamp,
    ) -> usize {
        match reply {
            Ok(values) if values.len() == group.len() => {
                for (w, v) in group.iter().zip(&values) {
                    self.merge_back(w, &integers(v), now);
                }
                group.len()
            }
            Ok(values) => {
                let e = StoreError::BadReply {
                    expected: group.len(),
                    got: values.len(),
                };
                self.flush_failed(group, now, &e);
                0
            }
            Err(e) => {
                self.flush_failed(group, now, &e);
                0
            }
        }
    }

    fn flush_failed(&self, group: &[Write], now: Timestamp, e: &StoreError) {
        self.stats.flush_failures.fetch_add(1, Ordering::Relaxed);
        self.redis_failed(now, "flush", e);
        for w in group {
            // Refunds back before the mark, as `mark_refunded` does.
            mark(&mut self.dirty.entry(w.stem.clone()).or_default(), w.kind);
            for p in w.parts.iter().filter(|p| p.refunded > 0) {
                let refund = (w.kind, p.window, p.refunded);
                add_refund(
                    &mut self.refunded.entry(w.stem.clone()).or_default(),
                    refund,
                );
            }
        }
    }

    /// What to write for one changed counter, from the state it holds now and what it
    /// refunded since the last flush (`None`: nothing). A refund of a window that no longer
    /// counts (a fixed window's earlier one, a sliding window's older than the previous one)
    /// is dropped: nobody reads that key again.
    fn write_for(
        &self,
        stem: Box<str>,
        kind: CounterKind,
        refunds: &[(CounterKind, u64, u64)],
        now: Timestamp,
    ) -> Option<Write> {
        // A counter swept since its refund holds nothing: its refund still goes out.
        let state = self.local.state(kind, &stem).unwrap_or(0);
        let ms_until = |end_us: u64| end_us.saturating_sub(now.micros()) / 1_000 + GRACE_MS;
        let (window, pairs): (u64, Vec<(u64, u64, u64)>) = match kind {
            CounterKind::Fixed(u) => {
                let count = fixed_window::current_count(state as u64, now.secs(), u);
                let w = u.index(now.secs());
                (w, vec![(w, count, ms_until(u.end_us(w)))])
            }
            CounterKind::Sliding(u) => {
                let (current, previous) = sliding_window::counts_at(state, now.micros(), u);
                let w = sliding_window::window_index(now.micros(), u);
                // A window's count matters until the end of the window after it.
                let current = (w, current, ms_until(u.end_us(w + 1)));
                let previous = (w.saturating_sub(1), previous, ms_until(u.end_us(w)));
                (w, vec![current, previous])
            }
            CounterKind::Bucket => {
                // Whole µs, rounded up: the copy is at rest no sooner than the bucket.
                let tat = bucket::rest_micros(state);
                (0, vec![(0, tat, ms_until(tat))])
            }
        };
        let refunded_in = |window: u64| {
            refunds
                .iter()
                .filter(|&&(k, w, _)| k == kind && w == window)
                .map(|&(_, _, n)| n)
                .fold(0u64, u64::saturating_add)
        };
        let parts: Vec<Part> = pairs
            .into_iter()
            .map(|(window, value, ttl_ms)| Part {
                window,
                value,
                ttl_ms,
                refunded: refunded_in(window),
            })
            .filter(|p| {
                let holds = p.value > 0 && (kind != CounterKind::Bucket || p.value > now.micros());
                holds || p.refunded > 0
            })
            .collect();
        if parts.is_empty() {
            return None;
        }
        Some(Write {
            keys: parts
                .iter()
                .map(|p| self.redis_key(&stem, kind, p.window))
                .collect(),
            parts,
            stem,
            kind,
            window,
        })
    }

    /// Merges what Redis held after a write, when it held more than this node wrote.
    fn merge_back(&self, w: &Write, stored: &[u64], now: Timestamp) {
        let higher = w
            .parts
            .iter()
            .zip(stored)
            .any(|(p, &theirs)| theirs > p.value);
        if !higher || stored.len() != w.parts.len() {
            return;
        }
        // Rebuild the state as Redis holds it, in the write's window (a sliding window's write
        // may have left out a zero count, so each value goes to its own window's place).
        let at = |window: u64| {
            w.parts
                .iter()
                .zip(stored)
                .find(|(p, _)| p.window == window)
                .map_or(0, |(_, &v)| v)
        };
        let values: Vec<u64> = match w.kind {
            CounterKind::Sliding(_) => vec![at(w.window), at(w.window.saturating_sub(1))],
            _ => stored.to_vec(),
        };
        let Some(state) = state_from(w.kind, w.window, &values, now) else {
            return;
        };
        self.stats.merged_back.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.local.merge_max(w.kind, &w.stem, state, now) {
            tracing::debug!(error = %e, "cannot keep a merged-back count");
        }
    }
}

/// The kinds of one stem's counters changed since the last flush (one, almost always).
type Kinds = smallvec::SmallVec<[CounterKind; 2]>;

/// Adds `kind` to `kinds` once.
fn mark(kinds: &mut Kinds, kind: CounterKind) {
    if !kinds.contains(&kind) {
        kinds.push(kind);
    }
}

/// Adds a refund of `(kind, window, amount)` to what a stem refunded.
fn add_refund(refunds: &mut Refunds, (kind, window, amount): (CounterKind, u64, u64)) {
    match refunds
        .iter_mut()
        .find(|(k, w, _)| *k == kind && *w == window)
    {
        Some((_, _, n)) => *n = n.saturating_add(amount),
        None => refunds.push((kind, window, amount)),
    }
}

/// When a counter's horizon began and when it ends: the span in which another owner's count
/// still matters to it at `now` ([`CounterKind::horizon`]).
pub fn horizon(kind: CounterKind, quota: &Quota, now: Timestamp) -> Option<(Timestamp, Timestamp)> {
    kind.horizon(quota, now)
}

/// A state word from the values kept in Redis for `window` (as [`Durable::keys_now`] orders
/// them); `None` when they hold nothing ([`CounterKind::from_parts`]).
pub(crate) fn state_from(
    kind: CounterKind,
    window: u64,
    values: &[u64],
    now: Timestamp,
) -> Option<u128> {
    kind.from_parts(window, values, now)
}

/// The integers of a reply: an integer, a bulk string holding one, or an array of those (nil
/// and anything else read as 0).
fn integers(v: &Value) -> Vec<u64> {
    let one = |v: &Value| match v {
        Value::Int(i) => u64::try_from(*i).unwrap_or(0),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    };
    match v {
        Value::Array(items) => items.iter().map(one).collect(),
        other => vec![one(other)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::write_behind_key;
    use crate::limiter::{Algorithm, Unit};
    use std::num::NonZeroU32;

    #[test]
    fn a_window_of_several_units_is_written_behind_under_its_own_keys_and_horizon() {
        let five = crate::limiter::Window::new(Unit::Minute, 5);
        let plain = Unit::Minute.into();
        assert_eq!(
            write_behind_key("p:", "p:d_k_v_", CounterKind::Fixed(five), 7),
            "p:sluice:wb:{d_k_v_}:fw:300:7"
        );
        assert_ne!(
            write_behind_key("", "d_k_v_", CounterKind::Sliding(five), 7),
            write_behind_key("", "d_k_v_", CounterKind::Sliding(plain), 7)
        );
        // 1234 s is in the 5-minute window [1200, 1500).
        let q = Quota {
            unit_multiplier: 5,
            ..Quota::fixed(10, Unit::Minute)
        };
        let (start, end) = horizon(
            CounterKind::of_quota(&q).unwrap(),
            &q,
            Timestamp::from_secs(1_234),
        )
        .unwrap();
        assert_eq!(
            (start, end),
            (Timestamp::from_secs(1_200), Timestamp::from_secs(1_500))
        );
    }

    #[test]
    fn horizons_cover_what_another_owner_may_have_counted() {
        let now = Timestamp::from_secs(3_725); // 1 h 2 min 5 s
        let q = Quota::fixed(10, Unit::Hour);
        let fixed = horizon(CounterKind::Fixed(Unit::Hour.into()), &q, now).unwrap();
        assert_eq!(
            fixed,
            (Timestamp::from_secs(3_600), Timestamp::from_secs(7_200))
        );
        let sliding = horizon(CounterKind::Sliding(Unit::Minute.into()), &q, now).unwrap();
        assert_eq!(
            sliding,
            (Timestamp::from_secs(3_660), Timestamp::from_secs(3_780))
        );
        // A token bucket of 10 per second with a burst of 5: 500 ms either side.
        let b = Quota {
            penalty: None,
            safe_capacity: None,
            requests_per_unit: 10,
            unit: Unit::Second,
            algorithm: Algorithm::TokenBucket,
            burst: NonZeroU32::new(5),
            charge_refused: false,
            unit_multiplier: 1,
            calendar: crate::limiter::Calendar::EPOCH,
        };
        let (start, end) = horizon(CounterKind::Bucket, &b, now).unwrap();
        assert_eq!(now.micros() - start.micros(), 500_000);
        assert_eq!(end.micros() - now.micros(), 500_000);
        let zero = Quota {
            requests_per_unit: 0,
            ..b
        };
        assert_eq!(horizon(CounterKind::Bucket, &zero, now), None);
    }

    #[test]
    fn states_from_redis_values_belong_to_their_window() {
        let now = Timestamp::from_secs(125);
        let fixed = CounterKind::Fixed(Unit::Minute.into());
        let s = state_from(fixed, 2, &[7], now).unwrap();
        assert_eq!(
            fixed_window::current_count(s as u64, 125, Unit::Minute.into()),
            7
        );
        // A count of another window, or none, is nothing now.
        assert_eq!(state_from(fixed, 1, &[7], now), None);
        assert_eq!(state_from(fixed, 2, &[0], now), None);
        let sliding = CounterKind::Sliding(Unit::Minute.into());
        let s = state_from(sliding, 2, &[3, 9], now).unwrap();
        assert_eq!(
            sliding_window::counts_at(s, now.micros(), Unit::Minute.into()),
            (3, 9)
        );
        // A bucket already at rest holds nothing.
        assert_eq!(
            state_from(CounterKind::Bucket, 0, &[now.micros()], now),
            None
        );
        assert_eq!(
            state_from(CounterKind::Bucket, 0, &[now.micros() + 1], now),
            Some(bucket::at_micros(now.micros() + 1))
        );
    }

    #[test]
    fn replies_read_as_integers() {
        assert_eq!(integers(&Value::Int(4)), vec![4]);
        assert_eq!(
            integers(&Value::Array(vec![
                Value::BulkString(b"12".to_vec()),
                Value::Nil,
                Value::Int(-1)
            ])),
            vec![12, 0, 0]
        );
    }

    #[test]
    fn ring_changes_only_move_forward() {
        let c = RingChanges::new(Timestamp::from_secs(10));
        assert_eq!(c.last(), (0, Timestamp::from_secs(10)));
        c.record(Timestamp::from_secs(20));
        c.record(Timestamp::from_secs(15));
        assert_eq!(c.last(), (2, Timestamp::from_secs(20)));
    }
}
