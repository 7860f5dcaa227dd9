//! What the Go service's remote stores (Redis, memcached) share for fixed windows: the local
//! over-limit cache (LOCAL_CACHE_SIZE_IN_BYTES) and the decision from the count a store
//! answered. A fixed-window key a store reported over the limit is remembered until its window
//! ends, and later calls on it are answered OVER without a call, so its value stops growing.
//! Its size counts each key's real bytes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use super::{Hit, MemoryLimits, StoreError};
use crate::clock::Timestamp;
use crate::key::go_cache_key;
use crate::limiter::{Algorithm, Decision, Quota, Window, fixed_window};

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
        // A calendar window's key lives until its window ends, as the Go service's calendar
        // month's does (its PR #1206); an epoch window's for one window, as Go's.
        let life = if window.calendar.is_epoch() {
            window.secs()
        } else {
            window.reset_after(now.secs())
        };
        life + jitter
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

/// Whether `quota`'s counter is held to the Go service's shortcuts, which leave some refused
/// hits uncounted: the local over-limit cache (a key known over is answered without a call,
/// and not charged) and STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT. A fixed window is, unless
/// it says `charge_refused: true`: then every one of its hits is counted, as the memory store
/// counts them, so that a refund sent for a refused request gives back only what it took.
pub(super) fn takes_shortcuts(quota: &Quota) -> bool {
    quota.algorithm == Algorithm::FixedWindow && !quota.charge_refused
}

/// [`super::CounterStore::counts_refused`] for a store with the Go service's shortcuts: a
/// fixed window counts every refused hit unless the local cache or the STOP flag is on and
/// the limit takes them ([`takes_shortcuts`]).
pub(super) fn counts_refused(quota: &Quota, stop_when_over: bool, local_cache: bool) -> bool {
    quota.charges_refused() && !(takes_shortcuts(quota) && (stop_when_over || local_cache))
}

/// Whether `hit` is added: as the STOP flag's reading said, unless it counts every hit.
pub(super) fn increments(hit: &Hit<'_>, by_flag: bool) -> bool {
    by_flag || !takes_shortcuts(&hit.quota)
}

/// Forgets the refunded fixed-window keys in the local over-limit cache (a refund may have
/// taken one back within its limit).
pub(super) fn forget_refunded(cache: Option<&OverLimitCache>, now: Timestamp, hits: &[Hit<'_>]) {
    let Some(cache) = cache else {
        return;
    };
    for hit in hits.iter().filter(|h| h.hits > 0) {
        if hit.quota.algorithm == Algorithm::FixedWindow {
            cache.forget(&go_cache_key(hit.key, now, hit.quota.window()));
        }
    }
}

/// Every decision, in order, into `out`; a missing one is a bad reply.
pub(super) fn push_all(
    expected: usize,
    decisions: Vec<Option<Decision>>,
    out: &mut Vec<Decision>,
) -> Result<(), StoreError> {
    for d in decisions {
        let Some(d) = d else {
            let got = out.len();
            return Err(StoreError::BadReply { expected, got });
        };
        out.push(d);
    }
    Ok(())
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
        if !takes_shortcuts(&q) {
            continue;
        }
        // Over the limit this request holds the key to: the count remembered passes it. A
        // request with its own, higher limit (`descriptor.limit`, envoyproxy/ratelimit #1077)
        // is not answered from a count found over a lower one.
        let count = cache.count_over(&go_cache_key(hit.key, now, q.window()), now);
        if let Some(count) = count.filter(|c| *c > u64::from(q.requests_per_unit)) {
            let state = fixed_window::state_with_count(count, now.secs(), q.window());
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
        && takes_shortcuts(&hit.quota)
        && let Some(cache) = cache
    {
        let window = hit.quota.window();
        let end = window.end(window.index(now.secs()));
        cache.remember(
            &go_cache_key(hit.key, now, window),
            end,
            now,
            decision.count_after,
        );
    }
}

/// Remembers fixed-window keys a remote store (Redis, memcached) found over the limit, with the
/// count it found, until their window ends or `max_age` (SLUICE_LOCAL_CACHE_MAX_AGE_MS) has
/// passed, whichever comes first; a request is answered from it only when that count passes
/// the request's own limit. A refund through this process forgets its key at once; the age bounds how long
/// another replica, which cannot know of the refund, keeps answering OVER from its own cache.
///
/// Held to LOCAL_CACHE_SIZE_IN_BYTES counting each entry as its key's bytes plus the overhead
/// of a `(Box<str>, u64)` map slot, which is what the memory store's fixed-window counters
/// are too ([`MemoryLimits::counter_bytes`]), and the count ([`entry_bytes`]); long keys take
/// room in proportion.
pub(super) struct OverLimitCache {
    /// Full key -> when the entry stops being trusted (µs since the epoch), and the count the
    /// store answered.
    keys: DashMap<Box<str>, (u64, u64), foldhash::fast::RandomState>,
    /// The entries' accounted bytes.
    bytes: AtomicUsize,
    max_bytes: usize,
    max_age_us: u64,
}

impl OverLimitCache {
    pub(super) fn new(size_in_bytes: u64, max_age: Duration) -> Option<Self> {
        let max_bytes = usize::try_from(size_in_bytes).unwrap_or(usize::MAX);
        (max_bytes > 0).then(|| OverLimitCache {
            keys: DashMap::default(),
            bytes: AtomicUsize::new(0),
            max_bytes,
            max_age_us: u64::try_from(max_age.as_micros()).unwrap_or(u64::MAX),
        })
    }

    /// The count `key` was found over its limit at, while the entry is trusted.
    pub(super) fn count_over(&self, key: &str, now: Timestamp) -> Option<u64> {
        let entry = self.keys.get(key)?;
        let (until, count) = *entry;
        (until > now.micros()).then_some(count)
    }

    /// Remembers `key`, found at `count` over the limit of a window ending at `window_end`
    /// (s), if it fits, forgetting ended entries first when it does not.
    pub(super) fn remember(&self, key: &str, window_end: u64, now: Timestamp, count: u64) {
        let until = window_end
            .saturating_mul(1_000_000)
            .min(now.micros().saturating_add(self.max_age_us));
        let cost = entry_bytes(key);
        if !self.reserve(cost) {
            self.forget_ended(now);
            if !self.reserve(cost) {
                return;
            }
        }
        if self.keys.insert(Box::from(key), (until, count)).is_some() {
            // Already remembered (a concurrent call): its room is taken once.
            self.bytes.fetch_sub(cost, Ordering::Relaxed);
        }
    }

    /// Forgets one key (its counter was reset, or hits were refunded).
    pub(super) fn forget(&self, key: &str) {
        if self.keys.remove(key).is_some() {
            let cost = entry_bytes(key);
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

    fn forget_ended(&self, now: Timestamp) {
        let mut freed = 0;
        self.keys.retain(|key, (until, _)| {
            let keep = *until > now.micros();
            if !keep {
                freed += entry_bytes(key);
            }
            keep
        });
        self.bytes.fetch_sub(freed, Ordering::Relaxed);
    }
}

/// What an entry of the over-limit cache is charged: a fixed-window counter's slot and the
/// count it remembers.
fn entry_bytes(key: &str) -> usize {
    MemoryLimits::counter_bytes(key) + std::mem::size_of::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    impl OverLimitCache {
        fn is_over(&self, key: &str, now: Timestamp) -> bool {
            self.count_over(key, now).is_some()
        }
    }

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_secs(secs)
    }

    #[test]
    fn the_over_limit_cache_counts_real_key_bytes() {
        let key = |i: usize| format!("{i:04}{}", "k".repeat(3996));
        let entry = entry_bytes(&key(0));
        let cache = OverLimitCache::new(3 * entry as u64, HOUR).unwrap();
        // Windows ending at 60; 4 KB keys: three fit, where 128 B an entry would have let 96 in.
        for i in 0..10 {
            cache.remember(&key(i), 60, at(0), 11);
        }
        assert_eq!(cache.keys.len(), 3);
        assert_eq!(cache.bytes.load(Ordering::Relaxed), 3 * entry);
        assert!(cache.is_over(&key(2), at(59)) && !cache.is_over(&key(3), at(59)));
        // Remembering a key again takes no more room.
        cache.remember(&key(0), 60, at(0), 11);
        assert_eq!(cache.bytes.load(Ordering::Relaxed), 3 * entry);
        // Once their windows end, full or not, the old entries make room.
        cache.remember(&key(7), 120, at(60), 11);
        assert_eq!(cache.keys.len(), 1);
        assert_eq!(cache.bytes.load(Ordering::Relaxed), entry);
    }

    #[test]
    fn an_entry_is_trusted_for_its_max_age_or_until_its_window_ends() {
        let cache = OverLimitCache::new(1 << 20, Duration::from_millis(1500)).unwrap();
        // An hour's window: trusted 1.5 s, not the hour.
        cache.remember("k_3600", 7200, at(3700), 11);
        assert!(cache.is_over("k_3600", Timestamp::from_micros(3_701_499_999)));
        assert!(!cache.is_over("k_3600", Timestamp::from_micros(3_701_500_000)));
        // A window ending sooner than the age: until it ends.
        cache.remember("k_3700", 3701, at(3700), 11);
        assert!(cache.is_over("k_3700", Timestamp::from_micros(3_700_999_999)));
        assert!(!cache.is_over("k_3700", at(3701)));
        // A refund forgets at once, and gives the room back.
        cache.remember("k_3600", 7200, at(3702), 11);
        cache.forget("k_3600");
        assert!(!cache.is_over("k_3600", at(3702)));
        assert_eq!(cache.bytes.load(Ordering::Relaxed), entry_bytes("k_3700"));
    }
}
