//! What the Go service's remote stores (Redis, memcached) share for fixed windows: the local
//! over-limit cache (LOCAL_CACHE_SIZE_IN_BYTES) and the decision from the count a store
//! answered. A fixed-window key a store reported over the limit is remembered until its window
//! ends, and later calls on it are answered OVER without a call, so its value stops growing.
//! Its size counts each key's real bytes.

use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;

use super::{Hit, MemoryLimits, go_cache_key};
use crate::clock::Timestamp;
use crate::limiter::{Algorithm, Decision, Window, fixed_window};

/// EXPIRATION_JITTER_MAX_SECONDS: a fixed-window key lives its window plus a jitter in
/// `[0, max)`, so keys written together do not all expire at once.
pub(super) struct Jitter {
    pub max_secs: u64,
    seed: foldhash::fast::RandomState,
}

impl Jitter {
    pub(super) fn new(max_secs: u64) -> Self {
        Jitter {
            max_secs,
            seed: foldhash::fast::RandomState::default(),
        }
    }

    /// The TTL of `key`, for a window of `window`, written at `now`.
    pub(super) fn ttl_secs(&self, key: &str, window: Window, now: Timestamp) -> u64 {
        use std::hash::BuildHasher;
        let jitter = match self.max_secs {
            0 => 0,
            max => self.seed.hash_one((key, now.micros())) % max,
        };
        window.secs() + jitter
    }
}

/// The decision for a fixed-window hit whose key holds `after` once its hits are added (the
/// reply of Redis's INCRBY or memcached's `incr`).
pub(super) fn counted(hit: &Hit<'_>, now: Timestamp, after: u64) -> Decision {
    let q = hit.quota;
    let before = after.saturating_sub(hit.hits);
    let state = fixed_window::state_with_count(before, now.secs(), q.window());
    fixed_window::decide(state, now.secs(), q.window(), q.requests_per_unit, hit.hits).0
}

/// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, the part that needs no read: `Some(true)` (add
/// every hit) when the flag is off, `Some(false)` (add none) when a key is already known over
/// the limit, `None` when the counts must be read ([`increments_from_counts`]).
pub(super) fn increments_without_reading(
    stop_when_over: bool,
    decisions: &[Option<Decision>],
) -> Option<bool> {
    if !stop_when_over {
        Some(true)
    } else if decisions.iter().any(|d| d.is_some_and(|d| d.over)) {
        Some(false)
    } else {
        None
    }
}

/// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, given each fixed-window hit's count before this
/// request (`None` for the other algorithms): if any key would go over, only the keys that
/// would go over are added; otherwise every hit is.
pub(super) fn increments_from_counts(hits: &[Hit<'_>], counts: &[Option<u64>]) -> Vec<bool> {
    let over: Vec<bool> = hits
        .iter()
        .zip(counts)
        .map(|(hit, count)| {
            count.is_some_and(|c| {
                c.saturating_add(hit.hits) > u64::from(hit.quota.requests_per_unit)
            })
        })
        .collect();
    if over.iter().any(|o| *o) {
        over
    } else {
        vec![true; hits.len()]
    }
}

/// Over-limit keys remembered locally are answered without a call; `None` for the others.
pub(super) fn cached_decisions(
    cache: Option<&OverLimitCache>,
    now: Timestamp,
    hits: &[Hit<'_>],
) -> Vec<Option<Decision>> {
    let mut decisions: Vec<Option<Decision>> = vec![None; hits.len()];
    let Some(cache) = cache else {
        return decisions;
    };
    for (i, hit) in hits.iter().enumerate() {
        let q = hit.quota;
        if q.algorithm == Algorithm::FixedWindow
            && cache.is_over(&go_cache_key(hit.key, now, q.window()), now.secs())
        {
            let over = u64::from(q.requests_per_unit).saturating_add(1);
            let state = fixed_window::state_with_count(over, now.secs(), q.window());
            decisions[i] =
                Some(fixed_window::decide(state, now.secs(), q.window(), q.requests_per_unit, 0).0);
        }
    }
    decisions
}

/// Remembers `hit`'s key if `decision` found it over the limit of a fixed window.
pub(super) fn remember_if_over(
    cache: Option<&OverLimitCache>,
    now: Timestamp,
    hit: &Hit<'_>,
    decision: &Decision,
) {
    if decision.over
        && hit.quota.algorithm == Algorithm::FixedWindow
        && let Some(cache) = cache
    {
        let window = hit.quota.window();
        let end = fixed_window::window_start(now.secs(), window) + window.secs();
        cache.remember(&go_cache_key(hit.key, now, window), end, now.secs());
    }
}

/// Remembers fixed-window keys a remote store (Redis, memcached) found over the limit, until
/// their window ends.
///
/// Held to LOCAL_CACHE_SIZE_IN_BYTES counting each entry as its key's bytes plus the overhead
/// of a `(Box<str>, u64)` map slot, which is what the memory store's fixed-window counters
/// are too ([`MemoryLimits::counter_bytes`]); long keys take room in proportion.
pub(super) struct OverLimitCache {
    /// Full key -> end of its window (seconds since the epoch).
    keys: DashMap<Box<str>, u64, foldhash::fast::RandomState>,
    /// The entries' accounted bytes.
    bytes: AtomicUsize,
    max_bytes: usize,
}

impl OverLimitCache {
    pub(super) fn new(size_in_bytes: u64) -> Option<Self> {
        let max_bytes = usize::try_from(size_in_bytes).unwrap_or(usize::MAX);
        (max_bytes > 0).then(|| OverLimitCache {
            keys: DashMap::default(),
            bytes: AtomicUsize::new(0),
            max_bytes,
        })
    }

    pub(super) fn is_over(&self, key: &str, now_secs: u64) -> bool {
        self.keys.get(key).is_some_and(|end| *end > now_secs)
    }

    /// Remembers `key` if it fits, forgetting ended windows first when it does not.
    pub(super) fn remember(&self, key: &str, window_end: u64, now_secs: u64) {
        let cost = MemoryLimits::counter_bytes(key);
        if !self.reserve(cost) {
            self.forget_ended(now_secs);
            if !self.reserve(cost) {
                return;
            }
        }
        if self.keys.insert(Box::from(key), window_end).is_some() {
            // Already remembered (a concurrent call): its room is taken once.
            self.bytes.fetch_sub(cost, Ordering::Relaxed);
        }
    }

    /// Forgets one key (its counter was reset).
    pub(super) fn forget(&self, key: &str) {
        if self.keys.remove(key).is_some() {
            let cost = MemoryLimits::counter_bytes(key);
            self.bytes.fetch_sub(cost, Ordering::Relaxed);
        }
    }

    fn reserve(&self, cost: usize) -> bool {
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                (b.saturating_add(cost) <= self.max_bytes).then_some(b + cost)
            })
            .is_ok()
    }

    fn forget_ended(&self, now_secs: u64) {
        let mut freed = 0;
        self.keys.retain(|key, end| {
            let keep = *end > now_secs;
            if !keep {
                freed += MemoryLimits::counter_bytes(key);
            }
            keep
        });
        self.bytes.fetch_sub(freed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_over_limit_cache_counts_real_key_bytes() {
        let key = |i: usize| format!("{i:04}{}", "k".repeat(3996));
        let entry = MemoryLimits::counter_bytes(&key(0));
        let cache = OverLimitCache::new(3 * entry as u64).unwrap();
        // Windows ending at 60; 4 KB keys: three fit, where 128 B an entry would have let 96 in.
        for i in 0..10 {
            cache.remember(&key(i), 60, 0);
        }
        assert_eq!(cache.keys.len(), 3);
        assert_eq!(cache.bytes.load(Ordering::Relaxed), 3 * entry);
        assert!(cache.is_over(&key(2), 59) && !cache.is_over(&key(3), 59));
        // Remembering a key again takes no more room.
        cache.remember(&key(0), 60, 0);
        assert_eq!(cache.bytes.load(Ordering::Relaxed), 3 * entry);
        // Once their windows end, full or not, the old entries make room.
        cache.remember(&key(7), 120, 60);
        assert_eq!(cache.keys.len(), 1);
        assert_eq!(cache.bytes.load(Ordering::Relaxed), entry);
    }
}
