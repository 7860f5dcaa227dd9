//! Allowances from the shared store (issue 40, SLUICE_REDIS_ALLOWANCE, off by default;
//! docs/redis.md): a replica that sees a fixed-window key often reserves a batch of its hits from
//! Redis at once ([`RESERVE`]: never past the limit), decides locally inside the batch, and
//! reserves again before it runs out; a cold key keeps the Go service's one INCRBY per call.
//! This is the logic, with no I/O; `store/redis.rs` makes the calls (a reservation in the
//! call's pipeline when a batch is needed now, in the background when one runs low).
//!
//! - **Hot or cold**: a key's attempted rate is measured as the lease client measures it (the
//!   hits asked for, admitted or not, averaged per sample); a key whose demand over
//!   [`AllowanceTiming::horizon_us`] is at least [`HOT_HITS`] reserves, others go to Redis.
//! - **Batches**: what the demand asks for over the horizon, at least the hits of the call.
//! - **Ahead**: within a horizon of the window's end a hot key reserves its next window's
//!   first batch, so a new window starts with hits in hand, not with every concurrent call
//!   going to Redis while the first reservation is under way.
//! - **No over-admission**: a batch is counted in Redis when it is reserved, so the key's count
//!   never passes the limit through reservations, and a Go instance sharing the key sees the
//!   reserved hits as used. Once Redis has nothing left for a window, the replica refuses
//!   locally until the window ends.
//! - **Under-admission**: what a replica reserved and did not use by the window's end is lost to
//!   the others; [`Allowances::give_back`] returns a cooled key's unused hits within the window
//!   (`RedisStore::with_give_back`'s task, every horizon).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Hit;
use super::go_fixed::counted;
use crate::charged::{ChargedMap, lock};
use crate::clock::Timestamp;
use crate::limiter::{Algorithm, Decision, Quota};

/// The reservation script: `KEYS[1]` the Go service's fixed-window key, `ARGV` the hits wanted
/// (at least 1), the limit and the key's TTL. Adds at most what is left under the limit, and
/// answers `{granted, count after}`. One command while there is room (`INCRBY`, and `EXPIRE`
/// when it made the key), a second (`DECRBY`) to take back what passed the limit.
pub const RESERVE: &str = r#"
local want = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local count = redis.call('INCRBY', KEYS[1], want)
if count == want then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
local over = count - limit
if over > 0 then
  local back = math.min(over, want)
  count = redis.call('DECRBY', KEYS[1], back)
  return {want - back, count}
end
return {want, count}
"#;

/// A key is hot when its demand over the horizon is at least this many hits.
pub const HOT_HITS: u64 = 4;

/// What a key in the table costs beside its key's bytes (`examples/lease_memory.rs` measures
/// it, and fails past it).
pub const RESERVED_CHARGE: usize = 256;

/// How far ahead batches look, and the table's bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllowanceTiming {
    /// A batch covers the demand over this long (µs); a new one is reserved once what is left
    /// covers less than half of it.
    pub horizon_us: u64,
    /// The memory the table may take, charged per key.
    pub max_bytes: usize,
}

/// A reservation to make: `want` hits of the key's window `window` (this one, or the next one
/// ahead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refill {
    pub window: u64,
    pub want: u64,
    pub ahead: bool,
}

/// What this replica does with one call's hits on a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Decided from the batch held (or refused: Redis has nothing left in the window), with
    /// what to reserve now in the background: more of this window when the batch covers less
    /// than half the horizon of the key's demand, or the next window's first batch within a
    /// horizon of this one's end (marked under way, answered by [`Allowances::reserved`] or
    /// [`Allowances::failed`]).
    Local {
        decision: Decision,
        refill: Option<Refill>,
    },
    /// Reserve with [`RESERVE`] now (in this window), then [`Allowances::reserved`] and decide
    /// again.
    Reserve(Refill),
    /// The store's own path: a cold key or the table full, or (`dry`) the key's batch empty
    /// while a reservation is under way.
    Remote { dry: bool },
}

/// One key's batch in its window.
#[derive(Debug)]
struct Batch {
    quota: Quota,
    window: u64,
    /// Hits reserved in the window, and used of them.
    reserved: u64,
    used: u64,
    /// The key's count in Redis after the last reservation.
    count: u64,
    /// Redis had less left than asked: nothing more in this window.
    exhausted: bool,
    /// A reservation of this window is under way until then (µs; 0: none). Bounded in time,
    /// so one whose answer never comes (a call cancelled while it waited) is given up.
    reserving_until_us: u64,
    /// The next window's first batch, once reserved ahead (`reserved`, `count` and
    /// `exhausted` as above), and whether it was asked for.
    ahead: Ahead,
    ahead_asked: bool,
    /// Hits asked for since the last sample, and the demand (hits per second, thousandths).
    attempted: u64,
    sampled_us: u64,
    demand_milli: u64,
}

/// Hits reserved ahead in the next window.
#[derive(Clone, Copy, Debug, Default)]
struct Ahead {
    reserved: u64,
    count: u64,
    exhausted: bool,
}

/// The keys this replica holds batches of.
pub struct Allowances {
    keys: ChargedMap<Batch>,
    timing: AllowanceTiming,
    stats: AllowanceStats,
}

/// What the table did, for `/metrics` (`sluice_redis_allowance_*`).
#[derive(Debug, Default)]
struct AllowanceStats {
    /// Calls decided from a batch (admitted or refused).
    local: AtomicU64,
    /// Calls that took Redis's own path: the key cold (or the table full), or its batch empty
    /// while a reservation was under way (dry).
    cold: AtomicU64,
    dry: AtomicU64,
    /// Reservations in a call's pipeline (a batch needed now), and in the background (a
    /// refill, or the next window's first batch ahead).
    reserved_now: AtomicU64,
    refills: AtomicU64,
    /// Hits given back by keys gone cold, and keys forgotten once idle.
    given_back: AtomicU64,
    forgotten: AtomicU64,
}

/// A reservation not answered within this long is given up (its hits stay counted in Redis:
/// under-admission, never over); longer than any REDIS_TIMEOUT a reservation should need.
const UNDER_WAY_US: u64 = 2_000_000;

/// Demand samples span at least this long, as in lease mode.
const MIN_SAMPLE_US: u64 = 10_000;

impl Allowances {
    pub fn new(timing: AllowanceTiming) -> Self {
        Allowances {
            keys: ChargedMap::new(RESERVED_CHARGE, timing.max_bytes),
            timing,
            stats: AllowanceStats::default(),
        }
    }

    /// The counters (`local_calls`, `cold_calls`, `dry_calls`, `reservations`, `refills`,
    /// `given_back_hits`, `forgotten_keys`) and then the gauges (`keys`, `bytes`), for
    /// `/metrics`.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("local_calls", load(&s.local)),
            ("cold_calls", load(&s.cold)),
            ("dry_calls", load(&s.dry)),
            ("reservations", load(&s.reserved_now)),
            ("refills", load(&s.refills)),
            ("given_back_hits", load(&s.given_back)),
            ("forgotten_keys", load(&s.forgotten)),
            ("keys", self.len() as u64),
            ("bytes", self.bytes() as u64),
        ]
    }

    /// `route` with its outcome counted.
    pub fn route(&self, hit: &Hit<'_>, now: Timestamp) -> Route {
        let route = self.decide(hit, now);
        let s = &self.stats;
        let counter = match route {
            Route::Local { refill, .. } => {
                if refill.is_some() {
                    s.refills.fetch_add(1, Ordering::Relaxed);
                }
                &s.local
            }
            Route::Reserve(_) => &s.reserved_now,
            Route::Remote { dry: true } => &s.dry,
            Route::Remote { dry: false } => &s.cold,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        route
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.keys.bytes()
    }

    pub fn timing(&self) -> &AllowanceTiming {
        &self.timing
    }

    /// How `hit` is decided at `now`.
    fn decide(&self, hit: &Hit<'_>, now: Timestamp) -> Route {
        let (key, quota, hits) = (hit.key, &hit.quota, hit.hits);
        if quota.algorithm != Algorithm::FixedWindow {
            return Route::Remote { dry: false };
        }
        let (window, now_us) = (window_of(hit, now), now.micros());
        let Some(entry) = self
            .keys
            .get_or_insert(key, || Batch::new(*quota, window, now_us))
        else {
            return Route::Remote { dry: false };
        };
        let mut b = lock(&entry);
        if b.quota != *quota {
            *b = Batch::new(*quota, window, now_us);
        }
        // A call from a window the batch has left (it waited, and another call turned the
        // window) is Redis's to decide, on that window's key.
        if window < b.window {
            return Route::Remote { dry: false };
        }
        b.roll(window);
        b.sample(now_us, hits);
        let limit = u64::from(quota.requests_per_unit);
        let left = b.reserved - b.used;
        if left >= hits {
            b.used += hits;
            // What the key counts without this replica's unused hits, and this call's.
            let decision = counted(hit, now, b.count - left + hits);
            let refill = b.refill(now_us, self.timing.horizon_us);
            return Route::Local { decision, refill };
        }
        if b.exhausted {
            let decision = counted(hit, now, b.count.max(limit) + hits);
            // Refused until the window ends, but the next one's batch is still reserved ahead.
            let refill = b.refill(now_us, self.timing.horizon_us);
            return Route::Local { decision, refill };
        }
        if b.reserving(now_us) {
            return Route::Remote { dry: true };
        }
        let want = b.need(self.timing.horizon_us).max(hits);
        if b.need(self.timing.horizon_us) < HOT_HITS {
            return Route::Remote { dry: false };
        }
        b.mark_reserving(now_us);
        Route::Reserve(Refill {
            window,
            want,
            ahead: false,
        })
    }

    /// Redis granted `granted` of `r.want` for `key` in `r.window`, leaving its count at
    /// `count`. A batch reserved ahead is taken up when its window starts (or at once, when
    /// the window started while it was under way).
    pub fn reserved(&self, key: &str, r: Refill, granted: u64, count: u64) {
        if let Some(entry) = self.keys.get(key) {
            let mut b = lock(&entry);
            if !r.ahead {
                b.reserving_until_us = 0;
            }
            let exhausted = granted < r.want;
            if b.window == r.window {
                b.reserved += granted;
                b.count = b.count.max(count);
                b.exhausted = exhausted;
            } else if b.window + 1 == r.window {
                b.ahead = Ahead {
                    reserved: granted,
                    count,
                    exhausted,
                };
            }
        }
    }

    /// A reservation failed: the key goes the store's own way until the next one (a batch
    /// ahead that failed is reserved when its window starts instead).
    pub fn failed(&self, key: &str, r: Refill) {
        if let Some(entry) = self.keys.get(key)
            && !r.ahead
        {
            lock(&entry).reserving_until_us = 0;
        }
    }

    /// The unused hits of keys gone cold at `now` (their demand below [`HOT_HITS`] over the
    /// horizon), taken off their batches: what to give back to Redis (DECRBY on the key of
    /// that window), so the other replicas can use them. Keys with no demand left and nothing
    /// held or under way are forgotten, so the table holds the keys in use, not every key
    /// ever seen (a cold key's entry lives about a horizon).
    pub fn give_back(&self, now: Timestamp) -> Vec<(Box<str>, Quota, u64)> {
        let horizon_us = self.timing.horizon_us;
        let (mut back, mut idle) = (Vec::new(), Vec::new());
        for e in self.keys.iter() {
            let mut b = lock(e.value());
            let window = now.secs() / b.quota.window().secs();
            b.roll(window);
            b.sample(now.micros(), 0);
            let left = b.reserved - b.used;
            let reserving = b.reserving(now.micros());
            if !reserving && left > 0 && b.need(horizon_us) < HOT_HITS {
                b.reserved = b.used;
                self.stats.given_back.fetch_add(left, Ordering::Relaxed);
                back.push((e.key().clone(), b.quota, left));
            }
            if b.idle(now.micros(), horizon_us) {
                idle.push(e.key().clone());
            }
        }
        for key in idle {
            if self
                .keys
                .remove_if(&key, |b| b.idle(now.micros(), horizon_us))
            {
                self.stats.forgotten.fetch_add(1, Ordering::Relaxed);
            }
        }
        back
    }
}

impl Batch {
    fn new(quota: Quota, window: u64, now_us: u64) -> Self {
        Batch {
            quota,
            window,
            reserved: 0,
            used: 0,
            count: 0,
            exhausted: false,
            reserving_until_us: 0,
            ahead: Ahead::default(),
            ahead_asked: false,
            attempted: 0,
            sampled_us: now_us,
            demand_milli: 0,
        }
    }

    /// Moves on to `window` (never back): a new window starts with what was reserved ahead
    /// for it, if it is the next one, else with nothing.
    fn roll(&mut self, window: u64) {
        if window > self.window {
            let ahead = if window == self.window + 1 {
                std::mem::take(&mut self.ahead)
            } else {
                Ahead::default()
            };
            self.window = window;
            self.reserved = ahead.reserved;
            self.used = 0;
            self.count = ahead.count;
            self.exhausted = ahead.exhausted;
            self.ahead = Ahead::default();
            self.ahead_asked = false;
        }
    }

    /// Counts `hits` asked for at `now_us`, and updates the demand once a sample spans
    /// [`MIN_SAMPLE_US`].
    fn sample(&mut self, now_us: u64, hits: u64) {
        self.attempted += hits;
        let span = now_us.saturating_sub(self.sampled_us);
        if span >= MIN_SAMPLE_US {
            let rate = u128::from(self.attempted) * 1_000_000_000 / u128::from(span);
            let rate = u64::try_from(rate).unwrap_or(u64::MAX);
            self.demand_milli = self.demand_milli / 2 + rate / 2;
            self.attempted = 0;
            self.sampled_us = now_us;
        }
    }

    /// The reservation to make now, marked under way: more of this window when what is left
    /// covers less than half `horizon_us` of the demand, else the next window's first batch
    /// (the demand over the horizon) once this window ends within the horizon.
    fn refill(&mut self, now_us: u64, horizon_us: u64) -> Option<Refill> {
        let need = self.need(horizon_us);
        if need < HOT_HITS {
            return None;
        }
        let left = self.reserved - self.used;
        if !self.reserving(now_us) && !self.exhausted && left * 2 < need {
            self.mark_reserving(now_us);
            return Some(Refill {
                window: self.window,
                want: need - left,
                ahead: false,
            });
        }
        let ends_us = (self.window + 1).saturating_mul(self.quota.window().secs() * 1_000_000);
        if self.ahead_asked || ends_us.saturating_sub(now_us) > horizon_us {
            return None;
        }
        self.ahead_asked = true;
        Some(Refill {
            window: self.window + 1,
            want: need,
            ahead: true,
        })
    }

    fn reserving(&self, now_us: u64) -> bool {
        now_us < self.reserving_until_us
    }

    fn mark_reserving(&mut self, now_us: u64) {
        self.reserving_until_us = now_us.saturating_add(UNDER_WAY_US);
    }

    /// No demand left, nothing held, and no reservation under way or reserved ahead.
    fn idle(&self, now_us: u64, horizon_us: u64) -> bool {
        !self.reserving(now_us)
            && !self.ahead_asked
            && self.reserved == self.used
            && self.need(horizon_us) == 0
    }

    /// The demand's hits over `horizon_us`.
    fn need(&self, horizon_us: u64) -> u64 {
        let need = u128::from(self.demand_milli) * u128::from(horizon_us) / 1_000_000_000;
        u64::try_from(need).unwrap_or(u64::MAX)
    }
}

/// The index of `hit`'s window at `now`.
pub fn window_of(hit: &Hit<'_>, now: Timestamp) -> u64 {
    now.secs() / hit.quota.window().secs()
}

#[cfg(test)]
mod tests;
