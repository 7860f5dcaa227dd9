//! Items parked until a time, handed back once it has passed, without walking the items not
//! due yet: what lets a lease table of 10^6 quiet keys cost nothing between their deadlines.
//!
//! Deadlines are rounded up to a tick (a renewal interval), so the items due in one tick sit in
//! one vector and a round takes them in one split of the map. An item may be parked more than
//! once; its owner checks, when it comes back, whether the deadline is still its own.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// Items by the tick of their deadline.
pub(crate) struct Deadlines<T> {
    tick_us: u64,
    by_tick: Mutex<BTreeMap<u64, Vec<T>>>,
}

impl<T> Deadlines<T> {
    /// Deadlines rounded up to a multiple of `tick_us` (at least 1).
    pub(crate) fn new(tick_us: u64) -> Self {
        Deadlines {
            tick_us: tick_us.max(1),
            by_tick: Mutex::new(BTreeMap::new()),
        }
    }

    /// The deadline `at_us` rounded up to its tick: what [`Deadlines::park`] keeps it as, and so
    /// what an owner compares with when the item comes back.
    pub(crate) fn rounded(&self, at_us: u64) -> u64 {
        at_us.div_ceil(self.tick_us).saturating_mul(self.tick_us)
    }

    /// Parks `item` until `at_us` (rounded up to its tick).
    pub(crate) fn park(&self, at_us: u64, item: T) {
        let tick = at_us.div_ceil(self.tick_us);
        self.lock().entry(tick).or_default().push(item);
    }

    /// Takes every item whose deadline is at or before `now_us`.
    pub(crate) fn due(&self, now_us: u64) -> Vec<T> {
        let mut by_tick = self.lock();
        let later = by_tick.split_off(&(now_us / self.tick_us + 1));
        let due = std::mem::replace(&mut *by_tick, later);
        drop(by_tick);
        due.into_values().flatten().collect()
    }

    /// How many items are parked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Vec<T>>> {
        self.by_tick.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::Deadlines;

    #[test]
    fn an_item_comes_back_once_its_deadline_has_passed_and_not_before() {
        let d = Deadlines::new(100);
        d.park(250, "a");
        d.park(300, "b");
        d.park(301, "c");
        assert_eq!(d.rounded(250), 300);
        assert!(d.due(299).is_empty());
        let mut due = d.due(300);
        due.sort_unstable();
        assert_eq!(due, ["a", "b"]);
        assert!(d.due(399).is_empty());
        assert_eq!(d.due(10_000), ["c"]);
        assert_eq!(d.len(), 0);
    }
}
