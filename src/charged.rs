//! A table of per-key state behind a mutex, bounded by the bytes it is charged: each key costs its
//! length plus a fixed charge (measured by `bench/programs/src/bin/lease_memory.rs`), and a new key
//! is refused once the table is at its bound. Redis allowances ([`crate::store::allowance`]) and a
//! child cluster's parent grants ([`crate::cluster::lease::parent`]) keep their keys in one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use dashmap::DashMap;
use dashmap::mapref::one::Ref;

type Keys<T> = DashMap<Box<str>, Mutex<T>, foldhash::fast::RandomState>;

/// The table; see the module doc.
pub(crate) struct ChargedMap<T> {
    keys: Keys<T>,
    bytes: AtomicUsize,
    /// What a key costs beside its length.
    charge: usize,
    max_bytes: usize,
}

/// A key's state, locked (a poisoned lock is taken as it is: the state is plain numbers).
pub(crate) fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<T> ChargedMap<T> {
    pub(crate) fn new(charge: usize, max_bytes: usize) -> Self {
        ChargedMap {
            keys: DashMap::default(),
            bytes: AtomicUsize::new(0),
            charge,
            max_bytes,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The bytes charged for the keys held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// `key`'s state, when the table holds it: one lookup under the map's read guard.
    pub(crate) fn get(&self, key: &str) -> Option<Ref<'_, Box<str>, Mutex<T>>> {
        self.keys.get(key)
    }

    /// `key`'s state, made with `fresh` when the key is new; `None` when it is new and the
    /// table is at its bound.
    pub(crate) fn get_or_insert(
        &self,
        key: &str,
        fresh: impl FnOnce() -> T,
    ) -> Option<Ref<'_, Box<str>, Mutex<T>>> {
        if let Some(e) = self.keys.get(key) {
            return Some(e);
        }
        if self.bytes() >= self.max_bytes {
            return None;
        }
        let entry = self.keys.entry(key.into()).or_insert_with(|| {
            self.bytes
                .fetch_add(self.charge + key.len(), Ordering::Relaxed);
            Mutex::new(fresh())
        });
        Some(entry.downgrade())
    }

    /// Every key and its state, one map shard locked at a time.
    pub(crate) fn iter(
        &self,
    ) -> dashmap::iter::Iter<'_, Box<str>, Mutex<T>, foldhash::fast::RandomState> {
        self.keys.iter()
    }

    /// Removes `key` when `stale` holds of its state (checked under the shard's lock), and
    /// gives its charge back; whether it went.
    pub(crate) fn remove_if(&self, key: &str, stale: impl FnOnce(&T) -> bool) -> bool {
        let gone = self.keys.remove_if(key, |_, state| stale(&lock(state)));
        if gone.is_some() {
            self.bytes
                .fetch_sub(self.charge + key.len(), Ordering::Relaxed);
        }
        gone.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_charged_refused_past_the_bound_and_uncharged_when_removed() {
        let map = ChargedMap::new(100, 200);
        assert_eq!(*lock(&map.get_or_insert("a", || 1).unwrap()), 1);
        // Known keys keep their state; a new one is made while the bound is not reached.
        assert_eq!(*lock(&map.get_or_insert("a", || 2).unwrap()), 1);
        assert!(map.get_or_insert("bb", || 3).is_some());
        assert_eq!(map.bytes(), 101 + 102);
        assert!(map.get_or_insert("ccc", || 4).is_none(), "past the bound");
        assert!(
            map.get_or_insert("a", || 5).is_some(),
            "a known key still is"
        );
        assert!(!map.remove_if("a", |s| *s == 0));
        assert!(map.remove_if("a", |s| *s == 1));
        assert_eq!((map.len(), map.bytes()), (1, 102));
        assert!(map.get_or_insert("ccc", || 4).is_some());
    }
}
