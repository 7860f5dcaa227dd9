//! The in-memory store: sharded concurrent maps of one atomic word per counter.
//!
//! There is one [`DashMap`] per window unit, keyed by the counter key stem; the window a count
//! belongs to lives in the counter word itself (see [`crate::limiter::fixed_window`]). So a new
//! window costs no new map entry, and an expired counter is found by looking at its word.
//!
//! Memory is bounded: at most `max_counters` live counters. A request that needs a new counter
//! when the store is full fails with [`StoreError::Full`] (counted in
//! [`MemoryStats::rejected_full`]); existing counters keep working. The gRPC answer is then
//! UNKNOWN, like any backend error, so Envoy's `failure_mode_deny` decides whether such requests
//! pass. A sweeper task, owned by the store and stopped when it is dropped, removes counters of
//! past windows.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use super::{CounterStore, Hit, StoreError};
use crate::clock::{Clock, Timestamp};
use crate::limiter::Unit;
use crate::limiter::fixed_window::{self, Decision};

type Table = DashMap<Box<str>, AtomicU64, foldhash::fast::RandomState>;

/// Counters of what the store did, for telemetry.
#[derive(Debug, Default)]
pub struct MemoryStats {
    /// Requests refused because a new counter was needed while the store was full.
    pub rejected_full: AtomicU64,
    /// Counters removed by the sweeper.
    pub swept: AtomicU64,
}

struct Inner {
    tables: [Table; 7],
    live: AtomicUsize,
    max_counters: usize,
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
    /// A store with no sweeper; call [`MemoryStore::sweep`] yourself (tests do).
    pub fn new(max_counters: usize) -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                tables: std::array::from_fn(|_| Table::default()),
                live: AtomicUsize::new(0),
                max_counters,
                stats: MemoryStats::default(),
            }),
            sweeper: None,
        }
    }

    /// A store whose sweeper runs every `interval` on the current tokio runtime, reading time
    /// from `clock`. The task stops when the store is dropped.
    pub fn with_sweeper(max_counters: usize, clock: Arc<dyn Clock>, interval: Duration) -> Self {
        let mut store = MemoryStore::new(max_counters);
        let weak: Weak<Inner> = Arc::downgrade(&store.inner);
        store.sweeper = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                inner.sweep(clock.now());
            }
        }));
        store
    }

    /// Removes every counter of a past window; returns how many were removed.
    pub fn sweep(&self, now: Timestamp) -> usize {
        self.inner.sweep(now)
    }

    /// Live counters right now.
    pub fn live_counters(&self) -> usize {
        self.inner.live.load(Ordering::Relaxed)
    }

    pub fn max_counters(&self) -> usize {
        self.inner.max_counters
    }

    pub fn stats(&self) -> &MemoryStats {
        &self.inner.stats
    }

    /// The count a counter holds for the window containing `now` (0 if absent or stale).
    pub fn count(&self, key: &str, unit: Unit, now: Timestamp) -> u64 {
        self.inner.tables[unit.index()].get(key).map_or(0, |c| {
            fixed_window::current_count(c.load(Ordering::Acquire), now.secs(), unit)
        })
    }

    fn apply_now(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        // Reserve room for every missing counter first, so a full store refuses the whole
        // request before charging any of its counters.
        let missing = hits
            .iter()
            .filter(|h| !inner.tables[h.unit.index()].contains_key(h.key))
            .count();
        let reserved = inner.reserve(missing)?;
        let mut used = 0;
        let now_secs = now.secs();
        for hit in hits {
            let table = &inner.tables[hit.unit.index()];
            // Read path first: an existing counter needs only a shard read lock.
            let decision = if let Some(counter) = table.get(hit.key) {
                charge(&counter, now_secs, hit)
            } else {
                match table.entry(Box::from(hit.key)) {
                    Entry::Occupied(e) => charge(e.get(), now_secs, hit),
                    Entry::Vacant(e) => {
                        used += 1;
                        if used > reserved {
                            // A counter swept between the reservation and here: take a slot.
                            inner.reserve_one()?;
                        }
                        let (d, state) = fixed_window::decide(
                            fixed_window::EMPTY,
                            now_secs,
                            hit.unit,
                            hit.limit,
                            hit.hits,
                        );
                        e.insert(AtomicU64::new(state));
                        d
                    }
                }
            };
            out.push(decision);
        }
        // Slots reserved for counters that another request created meanwhile go back.
        if reserved > used {
            inner.live.fetch_sub(reserved - used, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// The compare-and-swap loop around the pure algorithm.
fn charge(counter: &AtomicU64, now_secs: u64, hit: &Hit<'_>) -> Decision {
    let mut state = counter.load(Ordering::Acquire);
    loop {
        let (decision, new_state) =
            fixed_window::decide(state, now_secs, hit.unit, hit.limit, hit.hits);
        if new_state == state {
            return decision;
        }
        match counter.compare_exchange_weak(state, new_state, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return decision,
            Err(actual) => state = actual,
        }
    }
}

impl Inner {
    fn reserve(&self, n: usize) -> Result<usize, StoreError> {
        if n == 0 {
            return Ok(0);
        }
        let before = self.live.fetch_add(n, Ordering::Relaxed);
        if before + n > self.max_counters {
            self.live.fetch_sub(n, Ordering::Relaxed);
            self.stats.rejected_full.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Full {
                max: self.max_counters,
            });
        }
        Ok(n)
    }

    fn reserve_one(&self) -> Result<(), StoreError> {
        self.reserve(1).map(|_| ())
    }

    fn sweep(&self, now: Timestamp) -> usize {
        let now_secs = now.secs();
        let mut removed = 0;
        for unit in Unit::ALL {
            self.tables[unit.index()].retain(|_, c| {
                let keep = !fixed_window::is_stale(c.load(Ordering::Acquire), now_secs, unit);
                removed += usize::from(!keep);
                keep
            });
        }
        self.live.fetch_sub(removed, Ordering::Relaxed);
        self.stats
            .swept
            .fetch_add(removed as u64, Ordering::Relaxed);
        removed
    }
}

impl CounterStore for MemoryStore {
    fn apply<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        std::future::ready(self.apply_now(now, hits, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(key: &str, limit: u32, hits: u64) -> Hit<'_> {
        Hit {
            key,
            unit: Unit::Minute,
            limit,
            hits,
        }
    }

    fn apply(store: &MemoryStore, now: u64, hits: &[Hit<'_>]) -> Result<Vec<Decision>, StoreError> {
        let mut out = Vec::new();
        store.apply_now(Timestamp::from_secs(now), hits, &mut out)?;
        Ok(out)
    }

    #[test]
    fn counts_per_key_and_unit() {
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
        // The same stem under another unit is another counter.
        let d = apply(
            &store,
            1234,
            &[Hit {
                unit: Unit::Hour,
                ..hit("a_", 2, 1)
            }],
        )
        .unwrap();
        assert_eq!(d[0].count_after, 1);
        assert_eq!(store.live_counters(), 3);
        assert_eq!(
            store.count("a_", Unit::Minute, Timestamp::from_secs(1234)),
            2
        );
    }

    #[test]
    fn sweep_removes_only_past_windows() {
        let store = MemoryStore::new(100);
        apply(&store, 1234, &[hit("old", 5, 1)]).unwrap();
        apply(
            &store,
            1234,
            &[Hit {
                unit: Unit::Hour,
                ..hit("hourly", 5, 1)
            }],
        )
        .unwrap();
        assert_eq!(store.sweep(Timestamp::from_secs(1259)), 0);
        // 1260 starts a new minute but not a new hour.
        assert_eq!(store.sweep(Timestamp::from_secs(1260)), 1);
        assert_eq!(store.live_counters(), 1);
        assert_eq!(store.stats().swept.load(Ordering::Relaxed), 1);
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

    #[test]
    fn many_threads_on_one_key_admit_exactly_the_limit() {
        let store = Arc::new(MemoryStore::new(10));
        let admitted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (store, admitted) = (store.clone(), admitted.clone());
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        let d = apply(&store, 100, &[hit("hot", 1000, 1)]).unwrap();
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
        assert_eq!(admitted.load(Ordering::Relaxed), 1000);
        assert_eq!(
            store.count("hot", Unit::Minute, Timestamp::from_secs(100)),
            4000
        );
    }

    #[test]
    fn counter_state_is_one_word() {
        assert_eq!(std::mem::size_of::<AtomicU64>(), 8);
        assert_eq!(std::mem::size_of::<(Box<str>, AtomicU64)>(), 24);
    }
}
