//! The memory store's counter tables: a map from counter key to state split into shards, each a
//! hashbrown [`HashTable`] behind its own read-write lock, as DashMap's are, with the one thing
//! DashMap does not offer without `unsafe`: a sweep that holds a shard for a bounded slice of it
//! at a time, never for the whole shard.
//!
//! **Why slices.** DashMap's `retain` held each shard's write lock while it walked the whole
//! shard and freed each removed key's heap block, and every decision on that shard waited: at
//! 10^7 counters, decisions beside the pass that frees a window's counters waited up to 54 to
//! 104 ms, now 50 to 70 µs of the sweeper's CPU per hold (docs/benchmarks.md, "A sweeper
//! without stalls"). [`Table::sweep`] walks [`SLICE`] buckets at
//! a time: it finds the stale ones under the shard's *read* lock (decisions take read locks
//! too, so they do not wait for it), takes the write lock only for a slice where it found some,
//! to look at those again and move them out, and drops them (frees the keys) after releasing
//! the lock.
//!
//! **Exactness.** A slice is named by bucket positions, which stay put between slices unless an
//! insert grows the table or rehashes it in place; a removal never moves another entry. Each
//! shard counts the inserts that may move its entries ([`Shard::moves`]), and a sweep that sees
//! the count change starts the shard again (at most [`MAX_RESTARTS`] times a pass; past that, a
//! counter moved behind the sweep waits for the next pass). A counter is removed only when
//! `stale` holds for it under the write lock, so nothing live is ever removed.

use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use crate::clock::Clock;

/// Buckets a sweep inspects per lock it takes. A write lock over a slice of 1,024 buckets held
/// decisions beside it up to tens of microseconds at 10^7 counters (docs/benchmarks.md, "A
/// sweeper without stalls").
pub(super) const SLICE: usize = 1024;

/// How many times a pass starts a shard again after inserts moved its entries.
const MAX_RESTARTS: u32 = 4;

/// How long a sweep held shards' locks, timed on a clock if it has one (benchmarks: two clock
/// reads a hold); without one it reads no clock and records nothing.
#[derive(Default)]
pub(super) struct Holds<'a> {
    clock: Option<&'a dyn Clock>,
    /// Write locks taken, each for a slice with entries to remove.
    pub(super) writes: u64,
    pub(super) longest_write_ns: u64,
    pub(super) longest_read_ns: u64,
}

impl<'a> Holds<'a> {
    pub(super) fn timed(clock: &'a dyn Clock) -> Self {
        Holds {
            clock: Some(clock),
            ..Holds::default()
        }
    }

    fn now(&self) -> u64 {
        self.clock.map_or(0, |c| c.now_nanos())
    }

    fn read_held(&mut self, since: u64) {
        self.longest_read_ns = self.longest_read_ns.max(self.now().saturating_sub(since));
    }

    fn write_held(&mut self, since: u64) {
        self.writes += 1;
        self.longest_write_ns = self.longest_write_ns.max(self.now().saturating_sub(since));
    }
}

/// A shard's entries and how many times an insert may have moved them.
struct Shard<V> {
    table: HashTable<(Box<str>, V)>,
    /// Inserts that found the table full, so grew it or rehashed it in place.
    moves: u64,
}

/// A shard alone on its cache lines (DashMap's `CachePadded`): two cores on two shards do not
/// share a lock word's line.
#[repr(align(128))]
struct Padded<V>(RwLock<Shard<V>>);

/// A sharded map from counter key to `V`.
pub(super) struct Table<V> {
    shards: Box<[Padded<V>]>,
    /// How far a hash is shifted right to give its shard (64 for one shard).
    shift: u32,
    hasher: foldhash::fast::RandomState,
}

impl<V> Table<V> {
    /// A table of `shards` shards (rounded up to a power of two).
    pub(super) fn new(shards: usize) -> Self {
        let shards = shards.max(1).next_power_of_two();
        Table {
            shards: (0..shards)
                .map(|_| {
                    Padded(RwLock::new(Shard {
                        table: HashTable::new(),
                        moves: 0,
                    }))
                })
                .collect(),
            shift: u64::BITS - shards.trailing_zeros(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a hash: bits the shard's table does not use (it takes the low bits for the
    /// bucket and the top seven for its tags), as DashMap picks them.
    fn shard(&self, hash: u64) -> &RwLock<Shard<V>> {
        let index = (hash << 7).checked_shr(self.shift).unwrap_or(0);
        &self.shards[index as usize].0
    }

    /// `f` of `key`'s value under its shard's read lock; `None` if there is no such key.
    pub(super) fn with<T>(&self, key: &str, f: impl FnOnce(&V) -> T) -> Option<T> {
        let hash = self.hash(key);
        let shard = read(self.shard(hash));
        shard
            .table
            .find(hash, |(k, _)| **k == *key)
            .map(|(_, v)| f(v))
    }

    pub(super) fn contains_key(&self, key: &str) -> bool {
        self.with(key, |_| ()).is_some()
    }

    /// `existing` of `key`'s value; if there is none, `make`'s value is inserted and its result
    /// returned. Looks under the read lock first, so an existing key never takes the write lock.
    pub(super) fn with_or_insert<T, E>(
        &self,
        key: &str,
        existing: impl Fn(&V) -> T,
        make: impl FnOnce() -> Result<(V, T), E>,
    ) -> Result<T, E> {
        if let Some(found) = self.with(key, &existing) {
            return Ok(found);
        }
        let hash = self.hash(key);
        let mut shard = write(self.shard(hash));
        let shard = &mut *shard;
        if shard.table.len() == shard.table.capacity() {
            // `entry` makes room first, which moves the entries a sweep may be walking.
            shard.moves += 1;
        }
        let rehash = |(k, _): &(Box<str>, V)| self.hasher.hash_one(&**k);
        match shard.table.entry(hash, |(k, _)| **k == *key, rehash) {
            Entry::Occupied(e) => Ok(existing(&e.get().1)),
            Entry::Vacant(e) => {
                let (value, result) = make()?;
                e.insert((Box::from(key), value));
                Ok(result)
            }
        }
    }

    /// Removes `key`; its value, if it was there. The key is freed after the lock is released.
    pub(super) fn remove(&self, key: &str) -> Option<V> {
        let hash = self.hash(key);
        let removed = {
            let mut shard = write(self.shard(hash));
            let entry = shard.table.find_entry(hash, |(k, _)| **k == *key);
            entry.ok().map(|e| e.remove().0)
        };
        removed.map(|(_, v)| v)
    }

    /// Entries in the table (each shard read in turn, so a moving figure under writers).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| read(&s.0).table.len()).sum()
    }

    /// The keys held, copied (for tests that compare what is accounted with what is held; the
    /// method and its items are named as DashMap's were).
    #[cfg(test)]
    pub(super) fn iter(&self) -> std::vec::IntoIter<Held> {
        let shards = self.shards.iter().map(|s| read(&s.0));
        let keys = shards.flat_map(|s| {
            s.table
                .iter()
                .map(|(k, _)| Held(k.clone()))
                .collect::<Vec<_>>()
        });
        keys.collect::<Vec<_>>().into_iter()
    }

    /// Removes every entry for which `stale` holds, a slice of a shard at a time (module
    /// docs); `gone` sees each one removed, after its shard's lock is released, before it is
    /// freed. The locks' holds are timed into `holds`.
    pub(super) fn sweep(
        &self,
        stale: impl Fn(&V) -> bool,
        mut gone: impl FnMut(&str, &V),
        holds: &mut Holds<'_>,
    ) {
        let mut scratch = Scratch {
            stale_at: Vec::new(),
            garbage: Vec::new(),
        };
        for shard in &self.shards {
            sweep_shard(&shard.0, &stale, &mut scratch, &mut gone, holds);
        }
    }
}

/// What a sweep keeps between slices: room reused from slice to slice.
struct Scratch<V> {
    /// The slice's buckets found stale under the read lock.
    stale_at: Vec<usize>,
    /// The entries removed under the write lock, freed after it.
    garbage: Vec<(Box<str>, V)>,
}

/// [`Table::sweep`] on one shard.
fn sweep_shard<V>(
    shard: &RwLock<Shard<V>>,
    stale: &impl Fn(&V) -> bool,
    scratch: &mut Scratch<V>,
    gone: &mut impl FnMut(&str, &V),
    holds: &mut Holds<'_>,
) {
    let mut at = 0;
    let mut moves = read(shard).moves;
    let mut restarts = 0;
    loop {
        let (end, buckets) = {
            let s = read(shard);
            let since = holds.now();
            if s.moves != moves && restarts < MAX_RESTARTS {
                // Entries moved since the last slice: some may now sit behind `at`.
                (moves, at, restarts) = (s.moves, 0, restarts + 1);
            }
            let end = (at + SLICE).min(s.table.num_buckets());
            let is_stale = |&i: &usize| s.table.get_bucket(i).is_some_and(|(_, v)| stale(v));
            scratch
                .stale_at
                .extend(occupied(&s.table, at..end).filter(is_stale));
            holds.read_held(since);
            (end, s.table.num_buckets())
        };
        if !scratch.stale_at.is_empty() {
            let mut s = write(shard);
            let since = holds.now();
            // Looked at again under the write lock: a decision may have revived one meanwhile,
            // or an insert moved another entry into its bucket.
            for i in scratch.stale_at.drain(..) {
                if let Ok(e) = s.table.get_bucket_entry(i)
                    && stale(&e.get().1)
                {
                    scratch.garbage.push(e.remove().0);
                }
            }
            holds.write_held(since);
        }
        // Freed here, the lock released: freeing the keys was most of what a shard's walk cost.
        for (key, value) in scratch.garbage.drain(..) {
            gone(&key, &value);
        }
        if end >= buckets {
            return;
        }
        at = end;
    }
}

/// The occupied buckets of `range`, in order. Each 64 buckets' occupancy is gathered into a
/// mask first, without a branch per bucket: in a table half full, testing each bucket in turn
/// mispredicted every other one, and made a pass that kept everything slower than DashMap's
/// `retain`.
fn occupied<T>(table: &HashTable<T>, range: Range<usize>) -> impl Iterator<Item = usize> + '_ {
    range.clone().step_by(64).flat_map(move |base| {
        let chunk = base..(base + 64).min(range.end);
        let mut mask = chunk.fold(0u64, |mask, i| {
            mask | u64::from(table.get_bucket(i).is_some()) << (i - base)
        });
        std::iter::from_fn(move || {
            (mask != 0).then(|| {
                let bit = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                base + bit
            })
        })
    })
}

/// A key [`Table::iter`] found.
#[cfg(test)]
pub(super) struct Held(Box<str>);

#[cfg(test)]
impl Held {
    pub(super) fn key(&self) -> &str {
        &self.0
    }
}

/// A shard's read lock. A panic under a lock leaves the table whole (the steps that run under it
/// are pure), so poison is ignored.
fn read<V>(shard: &RwLock<Shard<V>>) -> RwLockReadGuard<'_, Shard<V>> {
    shard.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<V>(shard: &RwLock<Shard<V>>) -> RwLockWriteGuard<'_, Shard<V>> {
    shard.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A value's state in these tests: 0 is stale, anything else live.
    fn stale(v: &AtomicU64) -> bool {
        v.load(Ordering::Relaxed) == 0
    }

    fn filled(shards: usize, keys: impl Iterator<Item = (String, u64)>) -> Table<AtomicU64> {
        let table = Table::new(shards);
        for (key, value) in keys {
            let made = table.with_or_insert(
                &key,
                |_| false,
                || Ok::<_, ()>((AtomicU64::new(value), true)),
            );
            assert_eq!(made, Ok(true), "{key} is new");
        }
        table
    }

    fn is_write_locked(table: &Table<AtomicU64>) -> bool {
        table.shards.iter().any(|s| s.0.try_read().is_err())
    }

    /// The two things a sweep in slices promises over DashMap's `retain`: it write-locks a shard
    /// for one slice of buckets at a time (here 10,000 stale keys in one shard: `retain` looked at
    /// all 10,000 under one lock), and it frees what it removed with the lock released.
    #[test]
    fn a_sweep_write_locks_a_slice_at_a_time_and_frees_with_the_shard_unlocked() {
        let table = filled(1, (0..10_000).map(|i| (format!("k{i}"), 0)));
        let (under_lock, longest, freed) = (Cell::new(0), Cell::new(0), Cell::new(0));
        table.sweep(
            |v| {
                if is_write_locked(&table) {
                    under_lock.set(under_lock.get() + 1);
                    longest.set(longest.get().max(under_lock.get()));
                }
                stale(v)
            },
            |_, _| {
                assert!(
                    !is_write_locked(&table),
                    "a key is freed under its shard's lock"
                );
                under_lock.set(0);
                freed.set(freed.get() + 1);
            },
            &mut Holds::default(),
        );
        assert_eq!(freed.get(), 10_000);
        assert_eq!(table.len(), 0);
        assert!(
            longest.get() > 0,
            "the removals were decided under the write lock"
        );
        assert!(
            longest.get() <= SLICE,
            "{} entries looked at under one write lock",
            longest.get()
        );
    }

    /// The masks' edges: every range, aligned or not, yields exactly its full buckets, in order.
    #[test]
    fn occupied_yields_the_full_buckets_of_any_range_in_order() {
        let table = filled(1, (0..3_000).map(|i| (format!("k{i}"), 1)));
        let shard = read(&table.shards[0].0);
        let t = &shard.table;
        for range in [
            0..0,
            0..1,
            0..64,
            1..65,
            63..129,
            100..1_000,
            0..t.num_buckets(),
        ] {
            let each: Vec<usize> = range
                .clone()
                .filter(|&i| t.get_bucket(i).is_some())
                .collect();
            assert_eq!(
                occupied(t, range.clone()).collect::<Vec<_>>(),
                each,
                "{range:?}"
            );
        }
        assert_eq!(occupied(t, 0..t.num_buckets()).count(), 3_000);
    }

    fn shard_of<'a>(table: &'a Table<AtomicU64>, key: &str) -> &'a RwLock<Shard<AtomicU64>> {
        table.shard(table.hash(key))
    }

    /// Inserts `n{i}` keys (live) into `key`'s shard, skipping the other shards' keys, until
    /// one moves the shard's entries.
    fn grow_shard_of(table: &Table<AtomicU64>, key: &str, next: &Cell<u64>) {
        let shard = shard_of(table, key);
        let moves = read(shard).moves;
        while read(shard).moves == moves {
            let new = format!("n{}", next.replace(next.get() + 1));
            if std::ptr::eq(shard_of(table, &new), shard) {
                let made =
                    table.with_or_insert(&new, |_| (), || Ok::<_, ()>((AtomicU64::new(1), ())));
                assert_eq!(made, Ok(()));
            }
        }
    }

    /// An insert that grows a shard moves its entries, and an entry that probing had placed
    /// just past the sweep's position can land behind it; the sweep sees the shard's moves and
    /// starts the shard again, so one pass still frees every stale key. Here each of 16 shards
    /// is filled to its capacity (7/8 of its buckets, where probing displaces most) and grown
    /// right after the sweep's first slice of it.
    #[test]
    fn a_sweep_frees_the_stale_keys_an_insert_moved_behind_it() {
        let table = Table::new(16);
        let full =
            |t: &Shard<AtomicU64>| t.table.len() == t.table.capacity() && t.table.len() > 4096;
        let mut made = 0u64;
        while table.shards.iter().any(|s| !full(&read(&s.0))) {
            let key = format!("k{made}");
            if !full(&read(shard_of(&table, &key))) {
                // Even keys are stale, odd ones live.
                let value = AtomicU64::new(made % 2);
                let _ = table.with_or_insert(&key, |_| (), || Ok::<_, ()>((value, ())));
            }
            made += 1;
        }
        let live_before = table.len()
            - table
                .iter()
                .filter(|k| k.key()[1..].parse::<u64>().unwrap() % 2 == 0)
                .count();
        let (grown, next) = (std::cell::RefCell::new(Vec::new()), Cell::new(0));
        let grow = |key: &str, _: &AtomicU64| {
            let shard: *const _ = shard_of(&table, key);
            if !grown.borrow().contains(&shard) {
                grown.borrow_mut().push(shard);
                grow_shard_of(&table, key, &next);
            }
        };
        table.sweep(stale, grow, &mut Holds::default());
        assert_eq!(grown.borrow().len(), 16, "every shard grew under the sweep");
        let missed: Vec<String> = (0..made)
            .step_by(2)
            .map(|i| format!("k{i}"))
            .filter(|k| table.contains_key(k))
            .collect();
        assert!(
            missed.is_empty(),
            "{} stale keys left, e.g. {:?}",
            missed.len(),
            missed.first()
        );
        let inserted = table.iter().filter(|k| k.key().starts_with('n')).count();
        assert_eq!(table.len(), live_before + inserted, "every live key stays");
    }

    /// Decisions (read locks) on live keys and inserts of new ones run on other threads while
    /// the sweep runs: it removes every key stale throughout and nothing live, and a key revived
    /// by a decision before the sweep reached it stays.
    #[test]
    fn a_sweep_under_concurrent_decisions_and_inserts_removes_only_stale_keys() {
        let table = filled(4, (0..40_000).map(|i| (format!("k{i}"), i % 2)));
        let revived = std::thread::scope(|s| {
            let table = &table;
            let reviver = s.spawn(move || {
                // Stale keys 0, 4, 8, ... made live again while the sweep may be on them.
                (0..40_000)
                    .step_by(4)
                    .filter(|i| {
                        table
                            .with(&format!("k{i}"), |v| v.store(1, Ordering::Relaxed))
                            .is_some()
                    })
                    .collect::<Vec<u32>>()
            });
            s.spawn(move || {
                for i in 0..20_000 {
                    let key = format!("new{i}");
                    let _ =
                        table.with_or_insert(&key, |_| (), || Ok::<_, ()>((AtomicU64::new(1), ())));
                }
            });
            table.sweep(stale, |_, _| (), &mut Holds::default());
            reviver.join().expect("the reviver")
        });
        for i in 0..40_000u32 {
            let key = format!("k{i}");
            let kept = table.contains_key(&key);
            match i % 4 {
                1 | 3 => assert!(kept, "{key} was live and is gone"),
                0 if revived.contains(&i) => assert!(kept, "{key} was revived and is gone"),
                _ => assert!(!kept, "{key} was stale throughout and is left"),
            }
        }
        assert_eq!(table.len(), 20_000 + revived.len() + 20_000);
    }
}
