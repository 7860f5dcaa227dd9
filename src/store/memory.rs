//! The in-memory store: sharded concurrent maps of one atomic word per counter.
//!
//! Each algorithm has its own tables, keyed by the counter key stem:
//! - fixed window: one table per unit of `AtomicU64` (window tag + count, see
//!   [`fixed_window`]), so a new window costs no new map entry;
//! - sliding window: one table per unit of `AtomicU128` (tag + two counts);
//! - windows of several units (`unit_multiplier`): one table per window length, made on its
//!   first counter and kept (their number is bounded by the distinct windows configs name);
//! - token and leaky buckets: one table of `AtomicU128` (the theoretical arrival time, exact
//!   to a fraction of a microsecond, see [`crate::limiter::bucket`]);
//! - concurrency limits: a table per window of slot lists, each behind its own mutex
//!   ([`slots`]: a list cannot be swapped in by one compare-and-swap).
//!
//! The tables are sharded maps of their own ([`table`]: hashbrown tables behind a lock each),
//! not DashMap's, for their sweep: it holds a shard for a slice of it at a time and frees keys
//! with the lock released. Every update is a compare-and-swap loop around the pure function in
//! [`crate::limiter`], under a shard read lock; a shard write lock is taken only to insert a new
//! counter, and by the sweeper for a slice in which it found counters to remove.
//!
//! Memory is bounded twice over ([`MemoryLimits`]): at most `max_counters` live counters across
//! all tables, and at most `max_bytes` accounted bytes, each counter costing its key's bytes
//! plus [`COUNTER_OVERHEAD_BYTES`], so long keys cannot multiply the memory a count allows. A
//! request that needs a new counter past either cap fails with [`StoreError::Full`] or
//! [`StoreError::FullBytes`] (both counted in [`MemoryStats::rejected_full`]) before any of its
//! counters is charged; existing counters keep working, and charging one costs nothing extra.
//! The gRPC answer is then UNKNOWN, like any backend error, so Envoy's `failure_mode_deny`
//! decides whether such requests pass. A sweeper task, owned by the store and stopped when it
//! is dropped, removes counters that no longer hold anything and gives their room back.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dashmap::DashMap;
use portable_atomic::AtomicU128;

use super::penalty::{self, Penalized};
use super::{CounterStore, Hit, StoreError};
use crate::clock::{Clock, Timestamp};
use crate::limiter::concurrency::Slots;
use crate::limiter::{self, Algorithm, CounterKind, Decision, Quota, Unit, Window, fixed_window};

mod slots;
mod table;

use table::{Holds, Table};

/// Shards per table for each thread the machine runs (a power of two). Every access takes its
/// shard's lock word, an atomic write, so two cores working on keys of one shard move that cache
/// line between them; DashMap's default (4 per thread: 8 on 2 cores) made that one access in
/// eight with two cores on distinct keys. An empty shard costs a cache line.
const SHARDS_PER_THREAD: usize = 32;
/// At most this many shards per table, however many threads the machine runs.
const MAX_SHARDS: usize = 1024;

/// Shards per table on this machine: read once per store, for all its tables.
fn shard_amount() -> usize {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    (threads * SHARDS_PER_THREAD)
        .next_power_of_two()
        .min(MAX_SHARDS)
}

/// What a counter costs besides its key's bytes, charged against [`MemoryLimits::max_bytes`]:
/// above the worst case measured, 102 B (`bench/programs/src/bin/counter_memory.rs -- 935000 4
/// sliding_window`, 102.3 B with `token_bucket`: a table of 128-bit words just past doubling,
/// the shortest keys; see docs/hardening.md). A slot is a `(Box<str>, word)` pair plus a
/// control byte, 25 B (33 B for a sliding window's or a bucket's 128-bit word); a table just
/// past doubling is 7/16 full, which makes 57 B (75 B) per counter; the key's heap block adds
/// glibc's header and rounding, up to 31 B. Charged alike whatever the table, so the budget is
/// never less than what it bounds.
pub const COUNTER_OVERHEAD_BYTES: usize = 112;

/// The memory store's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimits {
    /// SLUICE_MAX_COUNTERS: live counters, whatever their size.
    pub max_counters: usize,
    /// SLUICE_MAX_COUNTER_BYTES: the live counters' accounted bytes
    /// ([`MemoryLimits::counter_bytes`] each).
    pub max_bytes: usize,
}

impl MemoryLimits {
    /// A count cap alone (tests and tools); the bytes are still accounted.
    pub const fn counters(max_counters: usize) -> Self {
        MemoryLimits {
            max_counters,
            max_bytes: usize::MAX,
        }
    }

    /// What a counter with this key is charged against `max_bytes`.
    pub const fn counter_bytes(key: &str) -> usize {
        key.len() + COUNTER_OVERHEAD_BYTES
    }
}

/// Room under both caps: a number of counters and their accounted bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Room {
    counters: usize,
    bytes: usize,
}

impl Room {
    fn of(key: &str) -> Self {
        Room {
            counters: 1,
            bytes: MemoryLimits::counter_bytes(key),
        }
    }
    /// What a new counter for `hit` takes: a concurrency counter's slots too.
    fn of_hit(hit: &Hit<'_>) -> Self {
        if is_slots(&hit.quota) {
            slots::room(hit)
        } else {
            Room::of(hit.key)
        }
    }
    fn add(self, other: Room) -> Room {
        Room {
            counters: self.counters + other.counters,
            bytes: self.bytes + other.bytes,
        }
    }
    /// What `self` has beyond `other`, field by field (0 where it has less).
    fn beyond(self, other: Room) -> Room {
        Room {
            counters: self.counters.saturating_sub(other.counters),
            bytes: self.bytes.saturating_sub(other.bytes),
        }
    }
    fn is_empty(self) -> bool {
        self == Room::default()
    }
}

/// One request's room: what it reserved up front (and later, for counters that appeared
/// missing only then), and what its new counters used. The difference goes back at the end.
#[derive(Default)]
struct Reservation {
    reserved: Room,
    used: Room,
}

/// A counter's state word: an atomic the limiter's pure functions read and replace. The
/// limiter's dispatch ([`limiter::counter`]) takes every word widened to `u128`.
trait StateWord: Send + Sync + 'static {
    type Raw: Copy + Eq + Default;
    fn new(raw: Self::Raw) -> Self;
    fn load(&self) -> Self::Raw;
    fn swap_if(&self, current: Self::Raw, new: Self::Raw) -> Result<(), Self::Raw>;
    fn widen(raw: Self::Raw) -> u128;
    /// The inverse of `widen` for the words the limiter makes for this table's kinds.
    fn narrow(wide: u128) -> Self::Raw;
}

impl StateWord for AtomicU64 {
    type Raw = u64;
    fn widen(raw: u64) -> u128 {
        u128::from(raw)
    }
    fn narrow(wide: u128) -> u64 {
        u64::try_from(wide).unwrap_or(u64::MAX)
    }
    fn new(raw: u64) -> Self {
        AtomicU64::new(raw)
    }
    fn load(&self) -> u64 {
        AtomicU64::load(self, Ordering::Acquire)
    }
    fn swap_if(&self, current: u64, new: u64) -> Result<(), u64> {
        self.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
    }
}

impl StateWord for AtomicU128 {
    type Raw = u128;
    fn widen(raw: u128) -> u128 {
        raw
    }
    fn narrow(wide: u128) -> u128 {
        wide
    }
    fn new(raw: u128) -> Self {
        AtomicU128::new(raw)
    }
    fn load(&self) -> u128 {
        AtomicU128::load(self, Ordering::Acquire)
    }
    fn swap_if(&self, current: u128, new: u128) -> Result<(), u128> {
        self.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
    }
}

/// [`charge`] with a step on the widened word.
fn charge_wide<W: StateWord, T>(word: &W, step: impl Fn(u128) -> (T, u128)) -> T {
    charge(word, |s| {
        let (result, next) = step(W::widen(s));
        (result, W::narrow(next))
    })
}

/// The compare-and-swap loop around a pure algorithm step: `step` maps the current state to
/// its result and the new state, and is re-run on the state another thread wrote meanwhile.
fn charge<W: StateWord, T>(word: &W, step: impl Fn(W::Raw) -> (T, W::Raw)) -> T {
    let mut state = word.load();
    loop {
        let (result, new_state) = step(state);
        if new_state == state {
            return result;
        }
        match word.swap_if(state, new_state) {
            Ok(()) => return result,
            Err(actual) => state = actual,
        }
    }
}

/// What a timed sweep pass did ([`MemoryStore::sweep_timed`]): the longest it held a shard's
/// lock, the write lock (decisions on that shard wait) and the read lock (only new counters
/// wait).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub removed: usize,
    /// Write locks taken: one per slice of a shard with counters to remove.
    pub write_holds: u64,
    pub longest_write_hold_ns: u64,
    pub longest_read_hold_ns: u64,
}

/// Counters of what the store did, for telemetry.
#[derive(Debug, Default)]
pub struct MemoryStats {
    /// Requests refused because a new counter was needed while the store was full, in count
    /// (SLUICE_MAX_COUNTERS) or in bytes (SLUICE_MAX_COUNTER_BYTES).
    pub rejected_full: AtomicU64,
    /// Counters removed by the sweeper.
    pub swept: AtomicU64,
    /// Penalties not kept because as many were in force as counters may be live.
    pub penalties_dropped: AtomicU64,
}

/// A kind's table: of 64-bit words (fixed windows) or of 128-bit ones (sliding, buckets); a
/// multiplied window's is shared (`Arc`) out of its map.
enum TableRef<'a> {
    Narrow(&'a Table<AtomicU64>),
    Wide(&'a Table<AtomicU128>),
    SharedNarrow(Arc<Table<AtomicU64>>),
    SharedWide(Arc<Table<AtomicU128>>),
}

/// Runs `$body` on a kind's table, whichever its word type (the body is generic over it).
macro_rules! with_table {
    ($inner:expr, $kind:expr, |$table:ident| $body:expr) => {
        match $inner.table($kind) {
            TableRef::Narrow($table) => $body,
            TableRef::Wide($table) => $body,
            TableRef::SharedNarrow(shared) => {
                let $table = &*shared;
                $body
            }
            TableRef::SharedWide(shared) => {
                let $table = &*shared;
                $body
            }
        }
    };
}

struct Inner {
    fixed: [Table<AtomicU64>; 7],
    sliding: [Table<AtomicU128>; 7],
    buckets: Table<AtomicU128>,
    /// Multiplied windows' tables, by window.
    fixed_multiplied: DashMap<Window, Arc<Table<AtomicU64>>>,
    sliding_multiplied: DashMap<Window, Arc<Table<AtomicU128>>>,
    /// Concurrency limits' slots, by window.
    slots: slots::SlotTables,
    /// Penalties in force (`penalty_seconds`): each key's [`penalty::penalty_key`] and when
    /// it ends, in microseconds. At most [`MemoryLimits::max_counters`] of them: a penalty is
    /// kept only for a key a counter refused, and past the cap a refusal starts none.
    penalties: DashMap<Box<str>, u64>,
    shards: usize,
    live: AtomicUsize,
    /// The live counters' accounted bytes ([`MemoryLimits::counter_bytes`] each).
    bytes: AtomicUsize,
    limits: MemoryLimits,
    stats: MemoryStats,
}

/// The in-memory counter store. Cheap to share behind an `Arc`.
pub struct MemoryStore {
    inner: Arc<Inner>,
    sweeper: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for MemoryStore {
    fn drop(&mut self) {
        if let Some(task) = self.sweeper.take() {
            task.abort();
        }
    }
}

impl MemoryStore {
    /// A store capped at `max_counters` counters (and no byte budget), with no sweeper; call
    /// [`MemoryStore::sweep`] yourself (tests do).
    pub fn new(max_counters: usize) -> Self {
        MemoryStore::with_limits(MemoryLimits::counters(max_counters))
    }

    /// A store within `limits`, with no sweeper.
    pub fn with_limits(limits: MemoryLimits) -> Self {
        let shards = shard_amount();
        MemoryStore {
            inner: Arc::new(Inner {
                fixed: std::array::from_fn(|_| Table::new(shards)),
                sliding: std::array::from_fn(|_| Table::new(shards)),
                buckets: Table::new(shards),
                fixed_multiplied: DashMap::default(),
                sliding_multiplied: DashMap::default(),
                slots: slots::SlotTables::default(),
                penalties: DashMap::default(),
                shards,
                live: AtomicUsize::new(0),
                bytes: AtomicUsize::new(0),
                limits,
                stats: MemoryStats::default(),
            }),
            sweeper: None,
        }
    }

    /// A store within `limits` whose sweeper runs every `interval` on the current tokio
    /// runtime, reading time from `clock`. The task stops when the store is dropped.
    pub(crate) fn with_sweeper(
        limits: MemoryLimits,
        clock: Arc<dyn Clock>,
        interval: Duration,
    ) -> Self {
        let mut store = MemoryStore::with_limits(limits);
        let weak: Weak<Inner> = Arc::downgrade(&store.inner);
        store.sweeper = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let now = clock.now();
                // A pass walks every counter (0.1 s at 10^7, docs/benchmarks.md): on a blocking
                // thread, not on a runtime worker, whose queued tasks would wait for it.
                let sweep = move || inner.sweep(now, &mut Holds::default());
                let _ = tokio::task::spawn_blocking(sweep).await;
            }
        }));
        store
    }

    /// Removes every counter that no longer holds anything at `now`; returns how many.
    pub fn sweep(&self, now: Timestamp) -> usize {
        self.inner.sweep(now, &mut Holds::default())
    }

    /// [`MemoryStore::sweep`], timing on `clock` each hold of a shard's lock (benchmarks: two
    /// clock reads per hold).
    pub fn sweep_timed(&self, now: Timestamp, clock: &dyn Clock) -> SweepReport {
        let mut holds = Holds::timed(clock);
        let removed = self.inner.sweep(now, &mut holds);
        SweepReport {
            removed,
            write_holds: holds.writes,
            longest_write_hold_ns: holds.longest_write_ns,
            longest_read_hold_ns: holds.longest_read_ns,
        }
    }

    /// When the penalty of `hit`'s key ends, if one is in force at `now`.
    pub(crate) fn penalty_until(&self, hit: &Hit<'_>, now: Timestamp) -> Option<Timestamp> {
        let key = penalty::penalty_key(hit.key, &hit.quota);
        let until = *self.inner.penalties.get(key.as_str())?;
        (until > now.micros()).then(|| Timestamp::from_micros(until))
    }

    /// Keeps a penalty of `hit`'s key until `until` (one handed over by another node), unless
    /// one here ends later.
    pub(crate) fn keep_penalty(&self, hit: &Hit<'_>, until: Timestamp) {
        let record = penalty::Record {
            key: hit.key,
            quota: hit.quota,
            until,
        };
        self.inner
            .keep_penalties(std::slice::from_ref(&record), true);
    }

    /// Penalties held right now, some maybe over and not yet swept.
    #[cfg(test)]
    pub(crate) fn penalties_held(&self) -> usize {
        self.inner.penalties.len()
    }

    /// Live counters right now.
    pub fn live_counters(&self) -> usize {
        self.inner.live.load(Ordering::Relaxed)
    }

    pub fn max_counters(&self) -> usize {
        self.inner.limits.max_counters
    }

    /// The live counters' accounted bytes right now ([`MemoryLimits::counter_bytes`] each).
    pub fn counter_bytes(&self) -> usize {
        self.inner.bytes.load(Ordering::Relaxed)
    }

    pub fn limits(&self) -> MemoryLimits {
        self.inner.limits
    }

    pub fn stats(&self) -> &MemoryStats {
        &self.inner.stats
    }

    /// The fixed-window count a counter holds for the window containing `now` (0 if absent
    /// or stale).
    pub fn count(&self, key: &str, unit: Unit, now: Timestamp) -> u64 {
        self.inner.fixed[unit.index()]
            .with(key, |c| {
                fixed_window::current_count(c.load(Ordering::Acquire), now.secs(), unit.into())
            })
            .unwrap_or(0)
    }

    /// The raw state word of a counter (a `u64` word widened), if it exists.
    pub fn state(&self, kind: CounterKind, key: &str) -> Option<u128> {
        with_table!(self.inner, kind, |table| table
            .with(key, |w| widen_of(w, StateWord::load(w))))
    }

    /// A concurrency counter's slots as they stand at `now`; `None` if there is no such
    /// counter.
    pub fn slots(&self, quota: &Quota, key: &str, now: Timestamp) -> Option<Slots> {
        self.inner.slots.state(quota, key, now)
    }

    /// Merges slots kept elsewhere (another owner's, through Redis) into a concurrency counter,
    /// making it if needed: never frees a slot, never counts one twice. A new counter needs
    /// room like any other ([`StoreError::Full`], [`StoreError::FullBytes`]).
    pub(crate) fn merge_slots(
        &self,
        quota: &Quota,
        key: &str,
        other: &Slots,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        inner
            .slots
            .merge(quota, key, other, inner.shards, |room| inner.reserve(room))
    }

    /// Whether a counter holds anything at `now` ([`CounterKind::holds`]).
    pub fn holds(&self, kind: CounterKind, key: &str, now: Timestamp) -> bool {
        self.state(kind, key).is_some_and(|s| kind.holds(s, now))
    }

    /// Merges a state kept elsewhere (another owner's, through Redis) into a counter, creating
    /// it if needed: the larger count per window, the later bucket arrival time
    /// ([`CounterKind::merge_max`]). Never lowers a count. A new counter needs room like any
    /// other ([`StoreError::Full`], [`StoreError::FullBytes`]).
    pub fn merge_max(
        &self,
        kind: CounterKind,
        key: &str,
        other: u128,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        with_table!(inner, kind, |table| inner
            .merge_in(table, key, |s| { kind.merge_max(s, other, now) }))
    }

    fn apply_now(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        // One hit on an existing counter (the common request): one probe, no reservation.
        if let [hit] = hits
            && let Some(d) = inner.charge_existing(hit, now)
        {
            out.push(d);
            return Ok(());
        }
        inner.apply_reserving(now, hits, out)
    }
}

impl Inner {
    /// Keeps each record's penalty, replacing the one in force (or, `later_only`, only when it
    /// ends later); past [`MemoryLimits::max_counters`] penalties a new one is dropped.
    fn keep_penalties(&self, records: &[penalty::Record<'_>], later_only: bool) {
        for r in records {
            let key = penalty::penalty_key(r.key, &r.quota);
            let until = r.until.micros();
            match self.penalties.get_mut(key.as_str()) {
                Some(mut held) if !later_only || *held < until => *held = until,
                Some(_) => {}
                None if self.penalties.len() < self.limits.max_counters => {
                    self.penalties.insert(key.into(), until);
                }
                None => {
                    self.stats.penalties_dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Charges a request that may need new counters. Out of line, so the one-hit path above
    /// stays as small as it was before the byte budget.
    #[inline(never)]
    fn apply_reserving(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        // Reserve room for every missing counter first, so a full store refuses the whole
        // request before charging any of its counters.
        let wanted = hits
            .iter()
            .filter(|h| !self.contains(h))
            .fold(Room::default(), |room, h| room.add(Room::of_hit(h)));
        self.reserve(wanted)?;
        let mut room = Reservation {
            reserved: wanted,
            used: Room::default(),
        };
        let charged = hits.iter().try_for_each(|hit| {
            out.push(self.apply_one(hit, now, &mut room)?);
            Ok(())
        });
        // Room reserved for counters that another request created meanwhile goes back.
        self.release(room.reserved.beyond(room.used));
        charged
    }

    /// The table a kind's counters live in.
    fn table(&self, kind: CounterKind) -> TableRef<'_> {
        let shards = self.shards;
        match kind {
            CounterKind::Fixed(w) if w.is_unit() => TableRef::Narrow(&self.fixed[w.unit.index()]),
            CounterKind::Sliding(w) if w.is_unit() => TableRef::Wide(&self.sliding[w.unit.index()]),
            CounterKind::Fixed(w) => {
                TableRef::SharedNarrow(shared_table(&self.fixed_multiplied, w, shards))
            }
            CounterKind::Sliding(w) => {
                TableRef::SharedWide(shared_table(&self.sliding_multiplied, w, shards))
            }
            CounterKind::Bucket => TableRef::Wide(&self.buckets),
        }
    }

    /// Every kind with a table now: the plain windows', the buckets', and each multiplied
    /// window's made so far.
    fn kinds(&self) -> Vec<CounterKind> {
        let mut kinds: Vec<CounterKind> = (0..CounterKind::COUNT)
            .filter_map(CounterKind::from_index)
            .collect();
        kinds.extend(
            self.fixed_multiplied
                .iter()
                .map(|e| CounterKind::Fixed(*e.key())),
        );
        kinds.extend(
            self.sliding_multiplied
                .iter()
                .map(|e| CounterKind::Sliding(*e.key())),
        );
        kinds
    }

    /// Charges one hit, creating its counter if needed.
    fn apply_one(
        &self,
        hit: &Hit<'_>,
        now: Timestamp,
        room: &mut Reservation,
    ) -> Result<Decision, StoreError> {
        let q = hit.quota;
        let Some(kind) = CounterKind::of_quota(&q) else {
            let claim = |needed| self.claim(room, needed);
            return self.slots.apply(hit, now, self.shards, claim);
        };
        let step = |s| limiter::counter::decide(&q, s, now, hit.hits);
        with_table!(self, kind, |table| self
            .apply_in(table, hit.key, room, step))
    }

    /// Charges a hit whose counter exists; `None` if it does not.
    fn charge_existing(&self, hit: &Hit<'_>, now: Timestamp) -> Option<Decision> {
        let q = hit.quota;
        let Some(kind) = CounterKind::of_quota(&q) else {
            return self.slots.charge_existing(hit, now);
        };
        let step = |s| limiter::counter::decide(&q, s, now, hit.hits);
        with_table!(self, kind, |table| table
            .with(hit.key, |w| charge_wide(w, step)))
    }

    fn contains(&self, hit: &Hit<'_>) -> bool {
        let Some(kind) = CounterKind::of_quota(&hit.quota) else {
            return self.slots.contains(hit);
        };
        with_table!(self, kind, |table| table.contains_key(hit.key))
    }

    /// Takes `needed` for a new counter into a request's reservation: room reserved up front
    /// is used first; a counter swept between the reservation and here (or one longer than
    /// those reserved for) needs room of its own.
    fn claim(&self, room: &mut Reservation, needed: Room) -> Result<(), StoreError> {
        let used = room.used.add(needed);
        let short = used.beyond(room.reserved);
        self.reserve(short)?;
        room.reserved = room.reserved.add(short);
        room.used = used;
        Ok(())
    }

    /// Charges one counter of `table`, creating it (from the zero state, which every
    /// algorithm reads as "nothing counted") if needed.
    fn apply_in<W: StateWord>(
        &self,
        table: &Table<W>,
        key: &str,
        room: &mut Reservation,
        step: impl Fn(u128) -> (Decision, u128),
    ) -> Result<Decision, StoreError> {
        // An existing counter needs only a shard read lock.
        table.with_or_insert(
            key,
            |word| charge_wide(word, &step),
            || {
                self.claim(room, Room::of(key))?;
                let (decision, state) = step(W::widen(W::Raw::default()));
                Ok((W::new(W::narrow(state)), decision))
            },
        )
    }

    /// Replaces a counter's state with `merge(state)`, creating it from the zero state.
    fn merge_in<W: StateWord>(
        &self,
        table: &Table<W>,
        key: &str,
        merge: impl Fn(u128) -> u128,
    ) -> Result<(), StoreError> {
        table.with_or_insert(
            key,
            |word| {
                update(word, &merge);
            },
            || {
                self.reserve(Room::of(key))?;
                Ok((W::new(W::narrow(merge(W::widen(W::Raw::default())))), ()))
            },
        )
    }

    /// Takes `room` under both caps, or none of it. Refusals count in `rejected_full`. Each
    /// total only ever moves to a value within its cap (compare-and-swap, not add-then-undo), so
    /// no reader, and no concurrent reservation, sees it past the cap.
    fn reserve(&self, room: Room) -> Result<(), StoreError> {
        if room.is_empty() {
            return Ok(());
        }
        let limits = self.limits;
        let refused = if !take(&self.live, room.counters, limits.max_counters) {
            StoreError::Full {
                max: limits.max_counters,
            }
        } else if !take(&self.bytes, room.bytes, limits.max_bytes) {
            self.live.fetch_sub(room.counters, Ordering::Relaxed);
            StoreError::FullBytes {
                max: limits.max_bytes,
            }
        } else {
            return Ok(());
        };
        self.stats.rejected_full.fetch_add(1, Ordering::Relaxed);
        Err(refused)
    }

    fn release(&self, room: Room) {
        if room.is_empty() {
            return;
        }
        self.live.fetch_sub(room.counters, Ordering::Relaxed);
        self.bytes.fetch_sub(room.bytes, Ordering::Relaxed);
    }

    fn sweep(&self, now: Timestamp, holds: &mut Holds<'_>) -> usize {
        let mut removed = Room::default();
        // Every kind once: the bucket kind is the buckets' one table.
        for kind in self.kinds() {
            let stale = |s| kind.is_stale(s, now);
            let gone = with_table!(self, kind, |table| sweep(table, stale, holds));
            removed = removed.add(gone);
        }
        removed = removed.add(self.slots.sweep(now, holds));
        self.penalties.retain(|_, until| *until > now.micros());
        self.release(removed);
        self.stats
            .swept
            .fetch_add(removed.counters as u64, Ordering::Relaxed);
        removed.counters
    }
}

/// Whether `quota`'s counters keep slots ([`slots`]) rather than a word.
fn is_slots(quota: &Quota) -> bool {
    quota.algorithm == Algorithm::Concurrency
}

/// A multiplied window's table, made on first use.
fn shared_table<W>(
    map: &DashMap<Window, Arc<Table<W>>>,
    w: Window,
    shards: usize,
) -> Arc<Table<W>> {
    if let Some(t) = map.get(&w) {
        return t.clone();
    }
    map.entry(w)
        .or_insert_with(|| Arc::new(Table::new(shards)))
        .clone()
}

/// Adds `n` to `total` if the sum stays within `max`.
fn take(total: &AtomicUsize, n: usize, max: usize) -> bool {
    total
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
            t.checked_add(n).filter(|&sum| sum <= max)
        })
        .is_ok()
}

/// Removes the counters whose (widened) state is `stale`; returns the room they took.
fn sweep<W: StateWord>(
    table: &Table<W>,
    stale: impl Fn(u128) -> bool,
    holds: &mut Holds<'_>,
) -> Room {
    let mut removed = Room::default();
    table.sweep(
        |w| stale(W::widen(w.load())),
        |key, _| removed = removed.add(Room::of(key)),
        holds,
    );
    removed
}

impl MemoryStore {
    /// Takes each hit's `hits` off its counter, and answers a peek at what is left.
    fn refund_now(&self, now: Timestamp, hits: &[Hit<'_>], out: &mut Vec<Decision>) {
        let inner = &*self.inner;
        for hit in hits {
            let q = hit.quota;
            let Some(kind) = CounterKind::of_quota(&q) else {
                out.push(inner.slots.refund(hit, now));
                continue;
            };
            let step = |s| limiter::counter::refund(&q, s, now, hit.hits);
            // A counter that is not there (never hit, or swept) has nothing to give back, and
            // none is made for the refund.
            let left = with_table!(inner, kind, |table| {
                table.with(hit.key, |word| update(word, step)).unwrap_or(0)
            });
            out.push(limiter::counter::decide(&q, left, now, 0).0);
        }
    }
}

/// A state change that decides nothing (a refund, a merge), on the widened word; the word it
/// left.
fn update<W: StateWord>(word: &W, step: impl Fn(u128) -> u128) -> u128 {
    charge_wide(word, |s| {
        let next = step(s);
        (next, next)
    })
}

/// A loaded word widened (the word only names its type).
fn widen_of<W: StateWord>(_word: &W, raw: W::Raw) -> u128 {
    W::widen(raw)
}

impl MemoryStore {
    fn reset_now(&self, hits: &[Hit<'_>]) {
        let inner = &*self.inner;
        let mut removed = Room::default();
        for hit in hits {
            let Some(kind) = CounterKind::of_quota(&hit.quota) else {
                removed = removed.add(inner.slots.remove(hit));
                continue;
            };
            let gone = with_table!(inner, kind, |table| table.remove(hit.key).is_some());
            if gone {
                removed = removed.add(Room::of(hit.key));
            }
        }
        inner.release(removed);
    }
}

impl CounterStore for MemoryStore {
    fn reset<'a>(
        &'a self,
        _now: Timestamp,
        hits: &'a [Hit<'a>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.reset_now(hits);
        std::future::ready(Ok(()))
    }

    fn refund<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.refund_now(now, hits, out);
        std::future::ready(Ok(()))
    }

    async fn apply<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        match hits.iter().any(|h| h.quota.penalty.is_some()) {
            false => self.apply_now(now, hits, out),
            true => penalty::apply(self, now, hits, out).await,
        }
    }
}

impl Penalized for MemoryStore {
    fn apply_counters<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        std::future::ready(self.apply_now(now, hits, out))
    }

    fn penalty_ends<'a>(
        &'a self,
        _now: Timestamp,
        hits: &'a [Hit<'a>],
    ) -> impl Future<Output = Result<Vec<Option<Timestamp>>, StoreError>> + Send + 'a {
        let penalties = &self.inner.penalties;
        let ends = hits
            .iter()
            .map(|h| {
                let until = penalties.get(penalty::penalty_key(h.key, &h.quota).as_str())?;
                Some(Timestamp::from_micros(*until))
            })
            .collect();
        std::future::ready(Ok(ends))
    }

    fn record_penalties<'a>(
        &'a self,
        _now: Timestamp,
        records: &'a [penalty::Record<'a>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.inner.keep_penalties(records, false);
        std::future::ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::limiter::{Algorithm, Quota};

    fn hit(key: &str, limit: u32, hits: u64) -> Hit<'_> {
        Hit {
            key,
            quota: Quota::fixed(limit, Unit::Minute),
            hits,
        }
    }

    fn with(h: Hit<'_>, algorithm: Algorithm, unit: Unit) -> Hit<'_> {
        Hit {
            quota: Quota {
                algorithm,
                unit,
                ..h.quota
            },
            ..h
        }
    }

    fn apply(store: &MemoryStore, now: u64, hits: &[Hit<'_>]) -> Result<Vec<Decision>, StoreError> {
        let mut out = Vec::new();
        store.apply_now(Timestamp::from_secs(now), hits, &mut out)?;
        Ok(out)
    }

    #[test]
    fn counts_per_key_unit_and_algorithm() {
        let store = MemoryStore::new(100);
        let d = apply(
            &store,
            1234,
            &[hit("a_", 2, 1), hit("b_", 2, 1), hit("a_", 2, 1)],
        )
        .unwrap();
        assert_eq!(
            d.iter().map(|d| d.count_after).collect::<Vec<_>>(),
            vec![1, 1, 2]
        );
        // The same stem under another unit or algorithm is another counter.
        let d = apply(
            &store,
            1234,
            &[
                with(hit("a_", 2, 1), Algorithm::FixedWindow, Unit::Hour),
                with(hit("a_", 2, 1), Algorithm::SlidingWindow, Unit::Minute),
                with(hit("a_", 2, 1), Algorithm::TokenBucket, Unit::Minute),
            ],
        )
        .unwrap();
        assert!(d.iter().all(|d| !d.over && d.remaining == 1), "{d:?}");
        assert_eq!(store.live_counters(), 5);
        assert_eq!(
            store.count("a_", Unit::Minute, Timestamp::from_secs(1234)),
            2
        );
    }

    #[test]
    fn sweep_removes_only_counters_that_hold_nothing() {
        let store = MemoryStore::new(100);
        let hits = [
            hit("old", 5, 1),
            with(hit("hourly", 5, 1), Algorithm::FixedWindow, Unit::Hour),
            with(hit("sliding", 5, 1), Algorithm::SlidingWindow, Unit::Minute),
            Hit {
                quota: Quota {
                    burst: NonZeroU32::new(10),
                    ..with(hit("bucket", 5, 1), Algorithm::TokenBucket, Unit::Minute).quota
                },
                ..hit("bucket", 5, 3)
            },
        ];
        apply(&store, 1234, &hits).unwrap();
        assert_eq!(store.sweep(Timestamp::from_secs(1259)), 0);
        // 1260: a new minute. The fixed minute counter is done; the sliding one still weighs
        // its previous window; the bucket (5/min: a token per 12 s, 3 taken at 1234) is back
        // at rest only at 1270.
        assert_eq!(store.sweep(Timestamp::from_secs(1260)), 1);
        // 1320: the sliding counter's window is two minutes old, and the bucket is at rest.
        assert_eq!(store.sweep(Timestamp::from_secs(1320)), 2);
        assert_eq!(store.live_counters(), 1);
        assert_eq!(store.stats().swept.load(Ordering::Relaxed), 3);
    }

    /// The sweep walks each table in slices and frees with the shard unlocked
    /// ([`table`](super::table)); with decisions on live counters and new counters made on other
    /// threads meanwhile, it still frees exactly the counters that expired, for every
    /// algorithm, keeps every live one with its count, and gives back exactly the room it freed.
    #[test]
    fn a_sweep_under_concurrent_decisions_frees_every_expired_counter_and_nothing_live() {
        const OLD: usize = 4_000;
        const LIVE: usize = 500;
        let store = MemoryStore::new(100_000);
        let (then, now) = (1234, 1234 + 3600);
        let hit = |a: Algorithm, name: &str, i: usize, hits| {
            let key: &'static str = format!("{a:?}_{name}{i}").leak();
            let quota = Quota {
                algorithm: a,
                burst: NonZeroU32::new(1000),
                ..Quota::fixed(100_000, Unit::Minute)
            };
            Hit { key, quota, hits }
        };
        let each = |name, n| -> Vec<Hit<'static>> {
            Algorithm::ALL
                .iter()
                .flat_map(|&a| (0..n).map(move |i| hit(a, name, i, 1)))
                .collect()
        };
        let (old, live, new) = (each("old", OLD), each("live", LIVE), each("new", LIVE));
        apply(&store, then, &old).unwrap();
        apply(&store, now, &live).unwrap();
        let removed = std::thread::scope(|s| {
            for half in live.chunks(live.len() / 2) {
                let store = &store;
                s.spawn(move || {
                    for _ in 0..20 {
                        assert!(apply(store, now, half).unwrap().iter().all(|d| !d.over));
                    }
                });
            }
            s.spawn(|| apply(&store, now, &new).unwrap());
            store.sweep(Timestamp::from_secs(now))
        });
        assert_eq!(removed, old.len(), "every expired counter, none live");
        let inner = &*store.inner;
        assert!(old.iter().all(|h| !inner.contains(h)));
        assert!(live.iter().chain(&new).all(|h| inner.contains(h)));
        let fixed_live = live
            .iter()
            .filter(|h| h.quota.algorithm == Algorithm::FixedWindow);
        for h in fixed_live {
            assert_eq!(
                store.count(h.key, Unit::Minute, Timestamp::from_secs(now)),
                21
            );
        }
        assert_eq!(store.live_counters(), live.len() + new.len());
        let bytes: usize = live
            .iter()
            .chain(&new)
            .map(Room::of_hit)
            .map(|r| r.bytes)
            .sum();
        assert_eq!(
            store.counter_bytes(),
            bytes,
            "the room freed is the room taken"
        );
    }

    /// A clock that moves 1 µs each time it is read.
    struct Ticking(AtomicU64);

    impl Clock for Ticking {
        fn now_nanos(&self) -> u64 {
            self.0.fetch_add(1_000, Ordering::Relaxed)
        }
    }

    /// A timed pass times each hold of a lock on its own (two reads of the clock, so 1 µs on
    /// this clock), not the pass, and takes a write lock only where it removes counters.
    #[test]
    fn a_timed_sweep_times_each_hold_and_write_locks_only_to_remove() {
        let store = MemoryStore::new(10_000);
        let keys: Vec<String> = (0..5_000).map(|i| format!("k{i}")).collect();
        let hits: Vec<Hit<'_>> = keys.iter().map(|k| hit(k, 5, 1)).collect();
        apply(&store, 1234, &hits).unwrap();
        let clock = Ticking(AtomicU64::new(0));
        let kept = store.sweep_timed(Timestamp::from_secs(1235), &clock);
        assert_eq!((kept.removed, kept.write_holds), (0, 0));
        assert_eq!(kept.longest_read_hold_ns, 1_000);
        let freed = store.sweep_timed(Timestamp::from_secs(1300), &clock);
        assert_eq!(freed.removed, 5_000);
        assert!(freed.write_holds > 0);
        assert_eq!(freed.longest_write_hold_ns, 1_000);
        assert_eq!(store.sweep(Timestamp::from_secs(1300)), 0);
    }

    /// nginx's excess of a leaky bucket's last request lasts one emission interval past the
    /// request; a sweeper that dropped the bucket sooner gave the client its next request at
    /// once. 1 a minute, no burst, a request every second for ten minutes, the production
    /// sweeper every 10 s: 10 admitted (60 when the sweeper dropped a bucket as soon as its
    /// excess was 0).
    #[test]
    fn a_swept_leaky_bucket_still_admits_only_its_rate() {
        let store = MemoryStore::new(10);
        let q = Quota {
            algorithm: Algorithm::LeakyBucket,
            ..Quota::fixed(1, Unit::Minute)
        };
        let start = 1_700_000_000;
        let mut admitted = 0;
        for second in 0..600 {
            let now = start + second;
            if second % 10 == 0 {
                store.sweep(Timestamp::from_secs(now));
            }
            let h = Hit {
                key: "leaky",
                quota: q,
                hits: 1,
            };
            admitted += u32::from(!apply(&store, now, &[h]).unwrap()[0].over);
        }
        assert_eq!(admitted, 10);
    }

    #[test]
    fn windows_of_several_units_are_swept_when_they_end_not_before() {
        let store = MemoryStore::new(100);
        let five = |key, algorithm| Hit {
            quota: Quota {
                unit_multiplier: 5,
                ..with(hit(key, 5, 1), algorithm, Unit::Minute).quota
            },
            ..hit(key, 5, 1)
        };
        // 1234 is in the 5-minute window [1200, 1500).
        let hits = [
            five("fixed", Algorithm::FixedWindow),
            five("sliding", Algorithm::SlidingWindow),
        ];
        apply(&store, 1234, &hits).unwrap();
        // A minute table would have dropped them at 1260.
        assert_eq!(store.sweep(Timestamp::from_secs(1499)), 0);
        // 1500: the fixed window is done; the sliding one still weighs until 1800.
        assert_eq!(store.sweep(Timestamp::from_secs(1500)), 1);
        assert_eq!(store.sweep(Timestamp::from_secs(1799)), 0);
        assert_eq!(store.sweep(Timestamp::from_secs(1800)), 1);
        assert_eq!(store.live_counters(), 0);
    }

    #[test]
    fn a_full_store_refuses_new_counters_whole_and_keeps_old_ones() {
        let store = MemoryStore::new(2);
        apply(&store, 0, &[hit("a", 5, 1), hit("b", 5, 1)]).unwrap();
        // A request touching an existing and a new counter charges neither.
        let err = apply(&store, 0, &[hit("a", 5, 1), hit("c", 5, 1)]).unwrap_err();
        assert_eq!(err, StoreError::Full { max: 2 });
        assert_eq!(store.count("a", Unit::Minute, Timestamp::from_secs(0)), 1);
        assert_eq!(store.stats().rejected_full.load(Ordering::Relaxed), 1);
        // Existing counters still work.
        assert_eq!(
            apply(&store, 0, &[hit("a", 5, 1)]).unwrap()[0].count_after,
            2
        );
        // Once the window passes, the sweeper frees room.
        store.sweep(Timestamp::from_secs(60));
        assert!(apply(&store, 60, &[hit("c", 5, 1)]).is_ok());
        assert_eq!(store.live_counters(), 1);
    }

    fn budget(counters: usize, keys: &[&str]) -> MemoryStore {
        MemoryStore::with_limits(MemoryLimits {
            max_counters: counters,
            max_bytes: keys.iter().map(|k| MemoryLimits::counter_bytes(k)).sum(),
        })
    }

    #[test]
    fn the_byte_budget_refuses_new_counters_whole_and_sweeping_gives_bytes_back() {
        let (a, b) = ("a".repeat(1000), "b".repeat(10));
        // Room in count for many, in bytes for exactly `a` and `b`.
        let store = budget(100, &[&a, &b]);
        apply(&store, 0, &[hit(&a, 5, 1), hit(&b, 5, 1)]).unwrap();
        assert_eq!(store.counter_bytes(), store.limits().max_bytes);
        // One byte more than is left: refused whole, naming the byte budget.
        let err = apply(&store, 0, &[hit(&a, 5, 1), hit("c", 5, 1)]).unwrap_err();
        assert_eq!(
            err,
            StoreError::FullBytes {
                max: store.limits().max_bytes
            }
        );
        assert!(
            err.to_string().contains("SLUICE_MAX_COUNTER_BYTES"),
            "{err}"
        );
        assert_eq!(store.count(&a, Unit::Minute, Timestamp::from_secs(0)), 1);
        assert_eq!(store.stats().rejected_full.load(Ordering::Relaxed), 1);
        assert_eq!(store.live_counters(), 2);
        // Existing counters still work, and cost nothing more.
        assert_eq!(
            apply(&store, 0, &[hit(&a, 5, 1), hit(&b, 5, 1)])
                .unwrap()
                .len(),
            2
        );
        assert_eq!(store.counter_bytes(), store.limits().max_bytes);
        // The sweeper gives the bytes back with the counters.
        store.sweep(Timestamp::from_secs(60));
        assert_eq!((store.live_counters(), store.counter_bytes()), (0, 0));
        // Then one long key fits where the two were; ten short ones would not.
        let long = "l".repeat(1000 + 10 + COUNTER_OVERHEAD_BYTES);
        apply(&store, 60, &[hit(&long, 5, 1)]).unwrap();
        assert_eq!(store.counter_bytes(), store.limits().max_bytes);
    }

    #[test]
    fn merged_counters_take_room_from_the_budget_too() {
        let store = budget(100, &["k"]);
        let now = Timestamp::from_secs(1234);
        let kind = CounterKind::Fixed(Unit::Minute.into());
        let five = u128::from(fixed_window::state_with_count(5, 1234, Unit::Minute.into()));
        store.merge_max(kind, "k", five, now).unwrap();
        assert_eq!(store.counter_bytes(), MemoryLimits::counter_bytes("k"));
        // Merging into an existing counter is free; a new one past the budget is refused.
        store.merge_max(kind, "k", five, now).unwrap();
        let err = store.merge_max(kind, "j", five, now).unwrap_err();
        assert!(matches!(err, StoreError::FullBytes { .. }), "{err}");
        assert_eq!(store.live_counters(), 1);
    }

    #[test]
    fn no_mix_of_key_sizes_goes_past_the_budget_even_racing() {
        let max_bytes = 200_000;
        let store = Arc::new(MemoryStore::with_limits(MemoryLimits {
            max_counters: 1_000_000,
            max_bytes,
        }));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let mut refused = 0;
                    for i in 0..2_000usize {
                        // Keys from 1 byte to 4 KB, some shared between threads.
                        let len = (i * 7919 + t * 13) % 4096 + 1;
                        let key = format!("{}{}", i % 500, "x".repeat(len));
                        let hits = [hit(&key, 100, 1), hit("shared", 100_000, 1)];
                        match apply(&store, 0, &hits) {
                            Ok(_) => {}
                            Err(StoreError::FullBytes { max }) => {
                                assert_eq!(max, max_bytes);
                                refused += 1;
                            }
                            Err(e) => panic!("{e}"),
                        }
                        assert!(store.counter_bytes() <= max_bytes);
                    }
                    refused
                })
            })
            .collect();
        let refused: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(refused > 0, "the budget was reached");
        // What is accounted is exactly what is held.
        let held: usize = store.inner.fixed[Unit::Minute.index()]
            .iter()
            .map(|e| MemoryLimits::counter_bytes(e.key()))
            .sum();
        assert_eq!(store.counter_bytes(), held);
        assert_eq!(
            store.live_counters(),
            store.inner.fixed[Unit::Minute.index()].len()
        );
    }

    #[test]
    fn many_threads_on_one_key_admit_exactly_the_limit_for_every_algorithm() {
        for algorithm in Algorithm::ALL {
            let store = Arc::new(MemoryStore::new(10));
            let admitted = Arc::new(AtomicU64::new(0));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (store, admitted) = (store.clone(), admitted.clone());
                    std::thread::spawn(move || {
                        for _ in 0..500 {
                            let h = with(hit("hot", 1000, 1), algorithm, Unit::Hour);
                            let d = apply(&store, 100, &[h]).unwrap();
                            if !d[0].over {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            // The leaky bucket lets burst + 1 through at once (nginx); burst is 0 here.
            let expected = if algorithm == Algorithm::LeakyBucket {
                1
            } else {
                1000
            };
            assert_eq!(admitted.load(Ordering::Relaxed), expected, "{algorithm:?}");
        }
    }

    #[test]
    fn merged_states_keep_the_larger_count_and_hold_until_their_window_ends() {
        let store = MemoryStore::new(10);
        let now = Timestamp::from_secs(1234);
        let kind = CounterKind::Fixed(Unit::Minute.into());
        assert!(!store.holds(kind, "k", now));
        apply(&store, 1234, &[hit("k", 10, 2)]).unwrap();
        assert!(store.holds(kind, "k", now));
        // Another owner's 5 for this minute wins over our 2; a lower 1 changes nothing.
        let five = fixed_window::state_with_count(5, 1234, Unit::Minute.into());
        store.merge_max(kind, "k", u128::from(five), now).unwrap();
        let one = fixed_window::state_with_count(1, 1234, Unit::Minute.into());
        store.merge_max(kind, "k", u128::from(one), now).unwrap();
        assert_eq!(store.count("k", Unit::Minute, now), 5);
        assert_eq!(
            apply(&store, 1234, &[hit("k", 10, 1)]).unwrap()[0].count_after,
            6
        );
        // A merge creates a missing counter, and counts against the cap.
        store.merge_max(kind, "new", u128::from(five), now).unwrap();
        assert_eq!(store.count("new", Unit::Minute, now), 5);
        assert_eq!(store.live_counters(), 2);
        assert!(!store.holds(kind, "k", Timestamp::from_secs(1260)));
        // Buckets keep the later arrival time.
        let bucket = CounterKind::Bucket;
        let (later, sooner) = (limiter::bucket::at_micros(9_000_000), 2_000_000 << 64 | 1);
        store.merge_max(bucket, "b", later, now).unwrap();
        store.merge_max(bucket, "b", sooner, now).unwrap();
        assert_eq!(store.state(bucket, "b"), Some(later));
        for i in 0..CounterKind::COUNT {
            assert_eq!(
                CounterKind::from_index(i).and_then(CounterKind::index),
                Some(i)
            );
        }
    }

    /// On Tokio's paused clock: the sweeper's interval passes without waiting for it.
    #[tokio::test(start_paused = true)]
    async fn the_sweeper_task_frees_expired_counters_at_each_interval() {
        let clock = crate::clock::ManualClock::new(Timestamp::from_secs(1234));
        let every = Duration::from_secs(10);
        let store =
            MemoryStore::with_sweeper(MemoryLimits::counters(10), Arc::new(clock.clone()), every);
        apply(&store, 1234, &[hit("a", 5, 1), hit("b", 5, 1)]).unwrap();
        // The first sweep runs at once and finds both counting.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(store.live_counters(), 2);
        // Their minute ends; nothing is swept until the next interval.
        clock.set(Timestamp::from_secs(1260));
        tokio::time::sleep(every - Duration::from_millis(2)).await;
        assert_eq!(store.live_counters(), 2);
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(store.live_counters(), 0);
        assert_eq!(store.stats().swept.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn counter_state_is_one_word() {
        assert_eq!(std::mem::size_of::<AtomicU64>(), 8);
        assert_eq!(std::mem::size_of::<(Box<str>, AtomicU64)>(), 24);
        assert_eq!(std::mem::size_of::<AtomicU128>(), 16);
        assert_eq!(std::mem::size_of::<(Box<str>, AtomicU128)>(), 32);
        assert!(AtomicU128::is_lock_free(), "128-bit CAS is native here");
    }
}
