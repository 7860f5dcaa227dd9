//! The memory store's concurrency counters ([`crate::limiter::concurrency`]): one table per
//! window length, made on first use, of [`Slots`] behind a mutex each. A counter's state is a
//! list of expiry times, not one word, so it cannot be swapped in by compare-and-swap as the
//! other algorithms' are; the mutex is per counter, held for the pure step only, under the
//! shard's read lock.
//!
//! **Bounds.** A counter holds at most `requests_per_unit` expiry times (the config caps that at
//! [`concurrency::MAX_SLOTS`]), and it is charged, against SLUICE_MAX_COUNTER_BYTES, its key
//! plus [`COUNTER_OVERHEAD_BYTES`] plus [`SLOT_BYTES`] per slot of the limit it was made
//! under (a reload that raises the limit is not charged again until the counter is swept and
//! made anew). The sweeper drops a counter once its slots have all expired and its debt ended.

use std::sync::{Arc, Mutex, PoisonError};

use dashmap::DashMap;

use super::table::Holds;
use super::{COUNTER_OVERHEAD_BYTES, Room, Table, shared_table};
use crate::clock::Timestamp;
use crate::limiter::concurrency::Slots;
use crate::limiter::{Decision, Quota, Window};
use crate::store::{Hit, StoreError};

/// What one held slot costs in memory: its expiry time.
pub(crate) const SLOT_BYTES: usize = 8;

/// A concurrency counter: its slots, and the bytes it was charged when it was made.
pub(super) struct SlotCounter {
    slots: Mutex<Slots>,
    bytes: usize,
}

impl SlotCounter {
    fn step<T>(&self, f: impl FnOnce(&mut Slots) -> T) -> T {
        // A panic inside a pure step leaves a consistent list: the poison is ignored.
        f(&mut self.slots.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The room a new counter for `hit` takes: its key and overhead, and its slots.
pub(super) fn room(hit: &Hit<'_>) -> Room {
    Room {
        counters: 1,
        bytes: hit.key.len()
            + COUNTER_OVERHEAD_BYTES
            + SLOT_BYTES * hit.quota.requests_per_unit as usize,
    }
}

/// A start (or a peek) of `hit` on `slots` at `now`.
fn start(slots: &mut Slots, hit: &Hit<'_>, now: Timestamp) -> Decision {
    let q = &hit.quota;
    slots.decide(now.micros(), q, hit.hits)
}

/// Every concurrency counter, by window length.
#[derive(Default)]
pub(super) struct SlotTables {
    tables: DashMap<Window, Arc<Table<SlotCounter>>>,
}

impl SlotTables {
    fn table(&self, quota: &Quota, shards: usize) -> Arc<Table<SlotCounter>> {
        shared_table(&self.tables, quota.window(), shards)
    }

    fn existing(&self, quota: &Quota) -> Option<Arc<Table<SlotCounter>>> {
        self.tables.get(&quota.window()).map(|t| t.clone())
    }

    pub(super) fn contains(&self, hit: &Hit<'_>) -> bool {
        self.existing(&hit.quota)
            .is_some_and(|t| t.contains_key(hit.key))
    }

    /// A start on a counter that exists; `None` if it does not.
    pub(super) fn charge_existing(&self, hit: &Hit<'_>, now: Timestamp) -> Option<Decision> {
        let table = self.existing(&hit.quota)?;
        table.with(hit.key, |c| c.step(|s| start(s, hit, now)))
    }

    /// A start, making the counter (within the request's reservation) if needed.
    pub(super) fn apply(
        &self,
        hit: &Hit<'_>,
        now: Timestamp,
        shards: usize,
        claim: impl FnOnce(Room) -> Result<(), StoreError>,
    ) -> Result<Decision, StoreError> {
        let table = self.table(&hit.quota, shards);
        table.with_or_insert(
            hit.key,
            |c| c.step(|s| start(s, hit, now)),
            || {
                let needed = self::room(hit);
                claim(needed)?;
                let mut slots = Slots::default();
                let decision = start(&mut slots, hit, now);
                let counter = SlotCounter {
                    slots: Mutex::new(slots),
                    bytes: needed.bytes,
                };
                Ok((counter, decision))
            },
        )
    }

    /// A refund; a counter that is not there has nothing to give back, and none is made.
    pub(super) fn refund(&self, hit: &Hit<'_>, now: Timestamp) -> Decision {
        let q = &hit.quota;
        let refunded = self
            .existing(q)
            .and_then(|t| t.with(hit.key, |c| c.step(|s| s.refund(now.micros(), q, hit.hits))));
        refunded.unwrap_or_else(|| Slots::default().refund(now.micros(), q, 0))
    }

    /// Forgets a counter; the room it took.
    pub(super) fn remove(&self, hit: &Hit<'_>) -> Room {
        let gone = self.existing(&hit.quota).and_then(|t| t.remove(hit.key));
        gone.map_or(Room::default(), |c| counted(&c))
    }

    /// Drops the counters that hold nothing at `now`; the room they took.
    pub(super) fn sweep(&self, now: Timestamp, holds: &mut Holds<'_>) -> Room {
        let mut removed = Room::default();
        for table in self.tables.iter() {
            table.sweep(
                |c| c.step(|s| s.is_stale(now.micros())),
                |_, c| removed = removed.add(counted(c)),
                holds,
            );
        }
        removed
    }

    /// A counter's slots as they stand at `now` (expired ones dropped from the copy, the
    /// counter left as it is, so its expiries are still reported by the next call).
    pub(super) fn state(&self, quota: &Quota, key: &str, now: Timestamp) -> Option<Slots> {
        let table = self.existing(quota)?;
        table.with(key, |c| {
            c.step(|s| {
                let mut now_view = s.clone();
                now_view.decide(now.micros(), quota, 0);
                now_view
            })
        })
    }

    /// Merges slots kept elsewhere (another owner's, through Redis) into a counter, making it
    /// if needed ([`Slots::merge_max`]: never frees a slot, never counts one twice).
    pub(super) fn merge(
        &self,
        quota: &Quota,
        key: &str,
        other: &Slots,
        shards: usize,
        reserve: impl FnOnce(Room) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let table = self.table(quota, shards);
        let merge = |c: &SlotCounter| c.step(|s| *s = Slots::merge_max(s, other));
        table.with_or_insert(key, merge, || {
            let hit = Hit {
                key,
                quota: *quota,
                hits: 0,
            };
            let needed = room(&hit);
            reserve(needed)?;
            let counter = SlotCounter {
                slots: Mutex::new(other.clone()),
                bytes: needed.bytes,
            };
            Ok((counter, ()))
        })
    }
}

/// The room a counter was charged.
fn counted(c: &SlotCounter) -> Room {
    Room {
        counters: 1,
        bytes: c.bytes,
    }
}
