//! Allowances from the shared store (issue 40, SLUICE_REDIS_ALLOWANCE, off by default;
//! docs/redis.md): a replica that sees a fixed-window key often reserves a batch of its hits from
//! Redis at once ([`RESERVE`]: never past the limit), decides locally inside the batch, and
//! reserves again before it runs out; a cold key keeps the Go service's one INCRBY per call.
//! This is the logic, with no I/O; `store/redis.rs` makes the calls (a reservation in the
//! call's pipeline when a batch is needed now, in the background when one runs low).
//!
//! - **Hot or cold**: a key's attempted rate is measured as the lease client measures it (the
//!   hits asked for, admitted or not, averaged per sample); a key whose demand over
//!   [`AllowanceTuning::horizon_us`] is at least [`AllowanceTuning::hot_hits`] reserves, others
//!   go to Redis.
//! - **Batches sized by need** (issue 50): a batch covers the key's demand over
//!   [`AllowanceTuning::period_us`] (1 s), so a steady key reserves about once a period at any
//!   rate (two Redis commands each, EVALSHA and its INCRBY), not once per half horizon; to the
//!   window's end when that is near, at most [`LEFT_SHARE`] of what the window has left (or
//!   what the key's demand here uses in half the time left, if more), at least
//!   [`AllowanceTuning::min_batch`] and the hits of the call.
//! - **Ahead**: within a horizon of the window's end a hot key reserves its next window's
//!   first batch, so a new window starts with hits in hand, not with every concurrent call
//!   going to Redis while the first reservation is under way.
//! - **No over-admission**: a batch is counted in Redis when it is reserved, so the key's count
//!   never passes the limit through reservations, and a Go instance sharing the key sees the
//!   reserved hits as used.
//! - **The store's semantics kept** (issue 48): the key's count the Go service would hold is
//!   Redis's count less the hits batches hold unused, and every answer is decided from that
//!   count. A reservation made for a call that does not fit counts the call's hits instead
//!   (refused, and counted as the Go service counts a refused hit, so a refund sent for it
//!   gives back only what it took) and gives back what the batch held.
//! - **Past the limit** (issue 50): once Redis has nothing left for a window, a hot key's
//!   batches are of refused hits counted ahead ([`Refill::past`]): Redis counts them when
//!   reserved, the replica refuses from them, and gives back what a cooled key did not use.
//!   A spent key's next window's batch, reserved ahead, takes what that window has left and
//!   then refused hits counted ahead; a call stamped in the window before the batch's is
//!   decided from what the batch held of it. So a key past its limit costs a reservation a
//!   period (or a window), not an INCRBY a call, and Redis's count is never below the Go
//!   service's (a refund elsewhere cannot open room that hits refused here and not yet
//!   counted would have filled). A refund through this
//!   replica gives back its batch with the refund, and the key then goes the store's own way
//!   until its window ends. `charge_refused` limits and the other algorithms never take
//!   batches. So one replica answers exactly as without allowances (the store contract runs
//!   with them on), and several differ only by the hits other replicas hold unused: refused
//!   sooner, never admitted past the limit.
//! - **Under-admission**: what a replica reserved and did not use by the window's end is lost to
//!   the others; [`Allowances::give_back`] returns a cooled key's unused hits within the window
//!   (`RedisStore::with_give_back`'s task, every horizon).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Hit;
use super::go_fixed::counted;
use crate::charged::{ChargedMap, lock};
use crate::clock::Timestamp;
use crate::limiter::demand::{Demand, MIN_SAMPLE_US};
use crate::limiter::granted::{Ended, Granted, ahead_due};
use crate::limiter::{Algorithm, Decision, Quota};

/// The reservation script: `KEYS[1]` the Go service's fixed-window key; `ARGV` the hits wanted
/// (at least 1), the limit, the key's TTL, the hits of the call it is made for (0 for a batch
/// reserved in the background), the hits that call's batch held unused (counted in the key
/// already, and taken by the call) and `past` (1: the window is spent, and the batch is of
/// refused hits counted ahead). Adds at most what is left under the limit and answers
/// `{granted, count after, refused}`. One command while there is room (`INCRBY`, and `EXPIRE`
/// when it made the key), a second (`DECRBY`) to take back what passed the limit. A call that
/// does not fit even with what its batch held (the count the Go service keeps, Redis's less
/// the held hits, plus the call's, passes the limit) is counted as the Go service counts a
/// refused call, its batch's held hits are given back, and nothing is granted (`refused` 1);
/// with `past`, the `want` hits are kept, and granted, as a batch of refused hits counted
/// ahead. A background `past` batch (the next window's, reserved ahead while this one is
/// spent) is granted whole: what is left under the limit, and the rest as refused hits
/// counted ahead.
pub const RESERVE: &str = r#"
local want = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local hits = tonumber(ARGV[4])
local held = tonumber(ARGV[5])
local past = ARGV[6] == '1'
local count = redis.call('INCRBY', KEYS[1], want)
if count == want then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
local before = count - want
if hits > 0 and math.max(before - held, 0) + hits > limit then
  local keep = 0
  if past then keep = want end
  local after = math.max(before - held, 0) + hits + keep
  if after ~= count then
    count = redis.call('DECRBY', KEYS[1], count - after)
  end
  return {keep, count, 1}
end
local over = count - limit
if over > 0 then
  if past and hits == 0 then
    return {want, count, 0}
  end
  local back = math.min(over, want)
  count = redis.call('DECRBY', KEYS[1], back)
  return {want - back, count, 0}
end
return {want, count, 0}
"#;

/// How long of a key's demand a batch covers by default ([`AllowanceTuning::period_us`]).
pub(crate) const PERIOD_US: u64 = 1_000_000;

/// A batch takes at most this share of what the window has left (its limit less the count
/// Redis last answered), unless the key's demand here uses more in half the time left: 1/8,
/// so near the limit batches shrink and replicas strand little (1/4 admitted 284 of 300 in
/// `replicas_offered_twice_the_limit_admit_it_and_no_more`).
pub(crate) const LEFT_SHARE: u64 = 8;

/// A key is hot when its demand over the horizon is at least this many hits, and a batch is at
/// least this many (the defaults of [`AllowanceTuning::hot_hits`] and
/// [`AllowanceTuning::min_batch`]).
pub(crate) const HOT_HITS: u64 = 4;

/// What a key in the table costs beside its key's bytes (`bench/programs/src/bin/lease_memory.rs`
/// measures it, and fails past it).
pub const RESERVED_CHARGE: usize = 352;

/// How far ahead batches look, how big they are, and the table's bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllowanceTuning {
    /// How far ahead a key looks (µs): it is hot once its demand over this long is at least
    /// [`Self::hot_hits`]; it reserves again once what is left covers less than half of it
    /// (time for the reservation to land), and its next window's first batch within it of
    /// the window's end.
    pub horizon_us: u64,
    /// How long of the demand a batch covers (µs, [`PERIOD_US`]), so a steady key reserves
    /// about once per period whatever its rate; capped by the window's end and by
    /// [`LEFT_SHARE`] of what the window has left.
    pub period_us: u64,
    /// The memory the table may take, charged per key.
    pub max_bytes: usize,
    /// A key is hot, and takes batches, once its demand over the horizon is at least this
    /// many hits ([`HOT_HITS`]; 0: every fixed-window key from its first call, as the store
    /// contract runs them).
    pub hot_hits: u64,
    /// The fewest hits a batch asks for ([`HOT_HITS`]).
    pub min_batch: u64,
}

impl AllowanceTuning {
    /// The defaults for a horizon and a bound.
    pub const fn new(horizon_us: u64, max_bytes: usize) -> Self {
        AllowanceTuning {
            horizon_us,
            period_us: PERIOD_US,
            max_bytes,
            hot_hits: HOT_HITS,
            min_batch: HOT_HITS,
        }
    }
}

/// A reservation to make: `want` hits of the key's window `window` (this one, or the next one
/// ahead); for a call's reservation, its `hits` and the unused hits its batch `held`, which
/// the call took (0 and 0 for a batch reserved in the background). `past`: the window is
/// spent, and a batch that finds no room is kept as refused hits counted ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refill {
    pub window: u64,
    pub want: u64,
    pub ahead: bool,
    pub hits: u64,
    pub held: u64,
    pub past: bool,
}

/// [`RESERVE`]'s answer: the hits `granted` (past the limit when the call was refused: refused
/// hits counted ahead), the key's `count` after, and whether the call it was made for was
/// `refused` (counted, and what its batch held given back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub granted: u64,
    pub count: u64,
    pub refused: bool,
}

/// What this replica does with one call's hits on a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Decided from the batch held, with what to reserve now in the background: more of this
    /// window when the batch covers less than half the horizon of the key's demand, or the
    /// next window's first batch within a horizon of this one's end (marked under way,
    /// answered by [`Allowances::reserved`] or [`Allowances::failed`]).
    Local {
        decision: Decision,
        refill: Option<Refill>,
    },
    /// Reserve with [`RESERVE`] now (in this window), then decide from
    /// [`Allowances::reserved`]'s answer.
    Reserve(Refill),
    /// The store's own path (INCRBY): a cold key, the table full, a key refunded in this
    /// window, or another algorithm. `held`: this replica's
    /// unused hits of the key, counted in Redis, which [`Allowances::remote`] takes off the
    /// count Redis answers. `ahead`: the next window's first batch to reserve in the
    /// background, as [`Route::Local`]'s refill.
    Remote { held: u64, ahead: Option<Refill> },
    /// The batch is empty while another call's reservation is under way: wait for it
    /// ([`Allowances::landed`]) and route again, or after a while go the store's own way
    /// ([`Allowances::route`] with `may_wait` false).
    Wait,
}

impl Route {
    /// The store's own path, with nothing held.
    const STORE: Route = Route::Remote {
        held: 0,
        ahead: None,
    };
}

/// One key's batch in its window.
#[derive(Debug)]
struct Batch {
    quota: Quota,
    /// The window, the hits reserved in it and used of them, what Redis last said of it, and
    /// the next window's first batch, once reserved ahead.
    grant: Granted<Seen>,
    /// A refund came through this replica in this window: the store's own path until it ends.
    refunded: bool,
    /// A reservation of this window is under way until then (µs; 0: none). Bounded in time,
    /// so one whose answer never comes (a call cancelled while it waited) is given up.
    reserving_until_us: u64,
    /// Whether the next window's first batch was asked for.
    ahead_asked: bool,
    /// The window before, as it ended: its hits reserved and not used, and its count as last
    /// seen, for its calls that come late ([`Batch::straggler`]).
    last: Ended<Seen>,
    /// Hits asked for, and the demand sampled from them.
    demand: Demand,
}

/// What Redis last said of a window's key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Seen {
    /// The key's count in Redis as last seen (after a reservation, a refund or an INCRBY).
    count: u64,
    /// Redis had less left than asked: nothing more in this window, and batches reserved
    /// from now on are of refused hits counted ahead ([`Refill::past`]).
    exhausted: bool,
}

/// The keys this replica holds batches of.
pub struct Allowances {
    keys: ChargedMap<Batch>,
    tuning: AllowanceTuning,
    stats: AllowanceStats,
    /// Woken whenever a reservation is answered or given up, for the calls that wait.
    landed: tokio::sync::Notify,
}

/// What the table did, for `/metrics` (`sluice_redis_allowance_*`).
#[derive(Debug, Default)]
struct AllowanceStats {
    /// Calls decided from a batch (admitted, or refused from refused hits counted ahead).
    local: AtomicU64,
    /// Calls that took Redis's own path: the key cold (or the table full, refunded, or its
    /// batch spent for the window), or its batch empty while a reservation was under way
    /// (dry: the call waited for it first).
    cold: AtomicU64,
    dry: AtomicU64,
    /// Reservations in a call's pipeline (a batch needed now), and in the background (a
    /// refill, or the next window's first batch ahead).
    reserved_now: AtomicU64,
    refills: AtomicU64,
    /// Hits given back by keys gone cold or refunded, and keys forgotten once idle.
    given_back: AtomicU64,
    forgotten: AtomicU64,
}

/// A reservation not answered within this long is given up (its hits stay counted in Redis:
/// under-admission, never over); longer than any REDIS_TIMEOUT a reservation should need.
const UNDER_WAY_US: u64 = 2_000_000;

/// A key is quiet, for the give-back task's demand sample, after this many of its demand's
/// gaps between calls with none ([`Batch::quiet_us`]): far past the jitter of a paced client.
const QUIET_GAPS: u64 = 4;

impl Allowances {
    pub fn new(tuning: AllowanceTuning) -> Self {
        Allowances {
            keys: ChargedMap::new(RESERVED_CHARGE, tuning.max_bytes),
            tuning,
            stats: AllowanceStats::default(),
            landed: tokio::sync::Notify::new(),
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

    /// How `hit` is decided at `now`, counted. A call that may not wait is never told to
    /// ([`Route::Wait`] becomes the store's own path).
    pub fn route(&self, hit: &Hit<'_>, now: Timestamp, may_wait: bool) -> Route {
        let route = self.decide(hit, now, may_wait);
        let s = &self.stats;
        let counter = match route {
            Route::Local { refill, .. } | Route::Remote { ahead: refill, .. } => {
                if refill.is_some() {
                    s.refills.fetch_add(1, Ordering::Relaxed);
                }
                if matches!(route, Route::Local { .. }) {
                    &s.local
                } else if may_wait {
                    &s.cold
                } else {
                    &s.dry
                }
            }
            Route::Reserve(_) => &s.reserved_now,
            // Counted once the wait ends, as dry or not.
            Route::Wait => return route,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        route
    }

    /// Resolves when a reservation is answered or given up; [`tokio::sync::Notified::enable`]
    /// it before routing, so an answer that lands in between is not missed.
    pub(crate) fn landed(&self) -> tokio::sync::futures::Notified<'_> {
        self.landed.notified()
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

    pub(crate) fn tuning(&self) -> &AllowanceTuning {
        &self.tuning
    }

    /// How `hit` is decided at `now`.
    fn decide(&self, hit: &Hit<'_>, now: Timestamp, may_wait: bool) -> Route {
        let (key, quota, hits) = (hit.key, &hit.quota, hit.hits);
        if !batched(quota) {
            return Route::STORE;
        }
        let (window, now_us) = (window_of(hit, now), now.micros());
        let Some(entry) = self
            .keys
            .get_or_insert(key, || Batch::new(*quota, window, now_us))
        else {
            return Route::STORE;
        };
        let mut b = lock(&entry);
        if b.quota != *quota {
            *b = Batch::new(*quota, window, now_us);
        }
        // A call from a window the batch has left (it waited, or was stamped just before
        // another call turned the window) is decided from what the batch held of that window
        // when it turned (at a spent window's end, refused hits counted ahead), else by Redis,
        // on that window's key.
        if window < b.grant.window {
            return b.straggler(hit, now, window).unwrap_or(Route::STORE);
        }
        b.roll(window);
        b.demand.sample(now_us, hits, MIN_SAMPLE_US);
        let left = b.grant.left();
        // A peek is decided from the count last seen, once there is one.
        if b.refunded || (hits == 0 && b.grant.granted == 0) {
            return Route::Remote {
                held: left,
                ahead: None,
            };
        }
        if b.grant.take(hits) {
            let decision = counted(hit, now, b.grant.seen.count.saturating_sub(left) + hits);
            let refill = b.refill(now_us, &self.tuning);
            return Route::Local { decision, refill };
        }
        if b.reserving(now_us) {
            return match may_wait {
                true => Route::Wait,
                false => Route::Remote {
                    held: left,
                    ahead: None,
                },
            };
        }
        if b.demand.whole_within(self.tuning.horizon_us) < self.tuning.hot_hits {
            return Route::Remote {
                held: left,
                ahead: None,
            };
        }
        b.mark_reserving(now_us);
        // The call takes what the batch holds, and asks Redis for the rest; once the window is
        // spent, for a batch of refused hits counted ahead (issue 50: a hot key past its limit
        // costs a reservation a period, not an INCRBY a call).
        b.grant.used += left;
        Route::Reserve(Refill {
            window,
            want: b.size(now_us, &self.tuning, false).max(hits),
            ahead: false,
            hits,
            held: left,
            past: b.grant.seen.exhausted,
        })
    }

    /// Redis answered `a` for `r`, on `hit`'s key. A batch reserved ahead is taken up when its
    /// window starts (or at once, when the window started while it was under way). For a
    /// call's reservation, the call's decision: admitted from what its batch held and what
    /// was granted, the rest left in the batch; or refused, with what was granted (refused
    /// hits counted ahead) left in the batch.
    pub fn reserved(&self, hit: &Hit<'_>, now: Timestamp, r: Refill, a: Answer) -> Decision {
        let (granted, count, refused) = (a.granted, a.count, a.refused);
        let spare = match refused {
            true => granted,
            false => (r.held + granted).saturating_sub(r.hits),
        };
        if let Some(entry) = self.keys.get(hit.key) {
            let mut b = lock(&entry);
            if !r.ahead {
                b.reserving_until_us = 0;
            }
            let limit = u64::from(b.quota.requests_per_unit);
            let exhausted = refused || granted < r.want || count >= limit;
            let seen = Seen { count, exhausted };
            let g = &mut b.grant;
            if g.window == r.window {
                if refused {
                    // Redis gave back what the call had taken of the batch, and kept what it
                    // granted past the limit.
                    g.granted = g.granted.saturating_sub(r.held) + granted;
                    g.used = g.used.saturating_sub(r.held);
                } else {
                    g.granted += granted;
                    // The call took `held` when it was routed; it used `hits`.
                    g.used = g.used.saturating_sub(r.held) + r.hits;
                }
                g.seen = seen;
            } else if g.window + 1 == r.window {
                g.ahead = Some((granted, seen));
            }
        }
        self.landed.notify_waiters();
        // What the Go service would count: Redis's less what this call left unused.
        counted(hit, now, count.saturating_sub(spare))
    }

    /// A reservation failed: the key goes the store's own way until the next one (a batch
    /// ahead that failed is reserved when its window starts instead). What a call's
    /// reservation took of its batch stays taken: Redis may have counted the call and given
    /// it back, so using it again could pass the limit.
    pub fn failed(&self, key: &str, r: Refill) {
        if let Some(entry) = self.keys.get(key)
            && !r.ahead
        {
            lock(&entry).reserving_until_us = 0;
        }
        self.landed.notify_waiters();
    }

    /// The decision for `hit` sent the store's own way with `held` of its batch unused, from
    /// the count Redis answered: the count the Go service would hold is Redis's less `held`.
    pub fn remote(&self, hit: &Hit<'_>, now: Timestamp, held: u64, count: u64) -> Decision {
        self.seen(hit, now, count);
        counted(hit, now, count.saturating_sub(held))
    }

    /// A refund of `hit` through this replica: what its batch holds unused in the refund's
    /// window, taken off it to be given back with the refund (so Redis's count is the Go
    /// service's again); the key then goes the store's own way until the window ends.
    pub fn refund(&self, hit: &Hit<'_>, now: Timestamp) -> u64 {
        if !batched(&hit.quota) {
            return 0;
        }
        let Some(entry) = self.keys.get(hit.key) else {
            return 0;
        };
        let mut b = lock(&entry);
        let window = window_of(hit, now);
        if window < b.grant.window || b.quota != hit.quota {
            return 0;
        }
        b.roll(window);
        b.refunded = true;
        let left = b.grant.left();
        b.grant.granted = b.grant.used;
        self.stats.given_back.fetch_add(left, Ordering::Relaxed);
        left
    }

    /// The counter admin reset `key`: what its batch held is gone with Redis's key.
    pub(crate) fn forget(&self, key: &str) {
        if self.keys.remove_if(key, |_| true) {
            self.stats.forgotten.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Redis answered `count` for `hit`'s key in its window (the store's own path).
    fn seen(&self, hit: &Hit<'_>, now: Timestamp, count: u64) {
        if let Some(entry) = self.keys.get(hit.key) {
            let mut b = lock(&entry);
            if b.grant.window == window_of(hit, now) && b.quota == hit.quota {
                b.grant.seen.count = count;
            }
        }
    }

    /// The unused hits of keys gone cold at `now` (their demand below
    /// [`AllowanceTuning::hot_hits`] over the horizon) or refunded, taken off their batches:
    /// what to give back to Redis (DECRBY on the key of that window), so the other replicas
    /// can use them. Keys with no demand left and nothing held or under way are forgotten, so
    /// the table holds the keys in use, not every key ever seen (a cold key's entry lives
    /// about a horizon).
    pub(crate) fn give_back(&self, now: Timestamp) -> Vec<(Box<str>, Quota, u64)> {
        let horizon_us = self.tuning.horizon_us;
        let (mut back, mut idle) = (Vec::new(), Vec::new());
        for e in self.keys.iter() {
            let mut b = lock(e.value());
            let window = b.quota.window().index(now.secs());
            b.roll(window);
            let quiet_us = b.quiet_us(horizon_us);
            b.demand.sample(now.micros(), 0, quiet_us);
            let left = b.grant.left();
            let cold =
                b.demand.whole_within(horizon_us) < self.tuning.hot_hits.max(1) || b.refunded;
            if !b.reserving(now.micros()) && left > 0 && cold {
                b.grant.granted = b.grant.used;
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

/// Whether `quota`'s counter may be decided from batches: a fixed window that does not count
/// refused hits past the Go service's rule (`charge_refused` limits take the store's own way).
fn batched(quota: &Quota) -> bool {
    quota.algorithm == Algorithm::FixedWindow && !quota.charge_refused
}

impl Batch {
    fn new(quota: Quota, window: u64, now_us: u64) -> Self {
        Batch {
            quota,
            grant: Granted::new(window),
            refunded: false,
            reserving_until_us: 0,
            ahead_asked: false,
            last: Ended::default(),
            demand: Demand::new(now_us, 0),
        }
    }

    /// Moves on to `window` (never back): a new window starts with what was reserved ahead
    /// for it, if it is the next one, else with nothing.
    fn roll(&mut self, window: u64) {
        if let Some(ended) = self.grant.roll(window) {
            self.last = ended;
            self.refunded = false;
            self.ahead_asked = false;
        }
    }

    /// A call stamped in `window`, which this batch has left: decided from the hits it still
    /// held of that window when it turned, if it was the one before and they cover the call
    /// (at a spent window's end, refused hits counted ahead: a hot key past its limit sends
    /// none of the calls stamped just before the turn to Redis), else `None`.
    fn straggler(&mut self, hit: &Hit<'_>, now: Timestamp, window: u64) -> Option<Route> {
        let covered = window + 1 == self.grant.window && hit.hits > 0 && self.last.left >= hit.hits;
        if !covered {
            return None;
        }
        self.last.left -= hit.hits;
        let count = self.last.seen.count.saturating_sub(self.last.left);
        Some(Route::Local {
            decision: counted(hit, now, count),
            refill: None,
        })
    }

    /// How long the give-back task's look waits after the last sample before it closes one with
    /// no hits: [`QUIET_GAPS`] of the demand's gaps between calls, within [`MIN_SAMPLE_US`] and
    /// the horizon. Closed sooner, between two calls of a steady key, it would read no demand
    /// where the next call was simply not due yet: a key at 50 calls a second (hot at 40) read
    /// 25 whenever the task looked 10 to 20 ms after a call, went cold, gave its batch back
    /// and reserved again, every horizon (issue 50's `warm` benchmark).
    fn quiet_us(&self, horizon_us: u64) -> u64 {
        let gap_us = 1_000_000_000u64.checked_div(self.demand.milli());
        let gaps = gap_us.map_or(u64::MAX, |g| g.saturating_mul(QUIET_GAPS));
        gaps.clamp(MIN_SAMPLE_US, horizon_us.max(MIN_SAMPLE_US))
    }

    /// The reservation to make now, marked under way: more of this window when what is left
    /// covers less than half the horizon of the demand (or of what is left of the window,
    /// near its end), else the next window's first batch once this window ends within the
    /// horizon. Each is [`Batch::size`]d. Once the window is spent, none of it: a batch of
    /// refused hits is reserved by the call the batch cannot cover, once the hits it holds
    /// are used, since its answer's count (the others' unused hits included) would refuse
    /// the hits this batch still holds under the limit.
    fn refill(&mut self, now_us: u64, tuning: &AllowanceTuning) -> Option<Refill> {
        let need = self.demand.whole_within(tuning.horizon_us);
        if need == 0 || need < tuning.hot_hits {
            return None;
        }
        let until_end = self.ends_us().saturating_sub(now_us);
        let low = self
            .grant
            .low(self.demand.whole_within(tuning.horizon_us.min(until_end)));
        if !self.reserving(now_us) && !self.grant.seen.exhausted && low {
            self.mark_reserving(now_us);
            return Some(Refill {
                window: self.grant.window,
                want: self.size(now_us, tuning, false),
                ahead: false,
                hits: 0,
                held: 0,
                past: false,
            });
        }
        if self.ahead_asked || !ahead_due(until_end, tuning.horizon_us) {
            return None;
        }
        self.ahead_asked = true;
        // A key spent in this window is likely spent in the next: its batch ahead takes
        // what the next window has left and, past that, refused hits counted ahead, so each
        // replica touches Redis about once a window for it.
        Some(Refill {
            window: self.grant.window + 1,
            want: self.size(now_us, tuning, true),
            ahead: true,
            hits: 0,
            held: 0,
            past: self.grant.seen.exhausted,
        })
    }

    /// The hits a batch of this window (or, `ahead`, of the next one) asks for at `now_us`:
    /// the demand over the period, so a steady key reserves about once a period whatever its
    /// rate. Within this window, to its end when that comes within half a period more, so no
    /// sliver is left for another reservation; and half a horizon more. At most
    /// [`LEFT_SHARE`] of what the window has left as Redis last counted it (for the next
    /// window, of its limit), or what the key's demand here uses in half the time left if
    /// more, so near the limit batches shrink and what one replica holds unused is little (a
    /// batch of a spent window, and the next one's ahead, is not capped); at least
    /// [`AllowanceTuning::min_batch`].
    fn size(&self, now_us: u64, tuning: &AllowanceTuning, ahead: bool) -> u64 {
        let w = self.quota.window();
        let next = self.grant.window.saturating_add(1);
        let window_us = w
            .end(next)
            .saturating_sub(w.start(next))
            .saturating_mul(1_000_000);
        let (until_end, count) = match ahead {
            true => (window_us, 0),
            false => (self.ends_us().saturating_sub(now_us), self.grant.seen.count),
        };
        let mut span = tuning.period_us.min(until_end);
        if until_end - span < tuning.period_us / 2 {
            span = until_end;
        }
        let left = u64::from(self.quota.requests_per_unit).saturating_sub(count);
        let share = match self.grant.seen.exhausted {
            true => u64::MAX,
            // Or what this replica's own demand uses in half the time the window has left,
            // which strands nothing: a key offered far past what is left takes it in a batch
            // or two, not in a descent of ever smaller ones.
            false => (left / LEFT_SHARE)
                .max(self.demand.whole_within(until_end) / 2)
                .min(left)
                .max(tuning.min_batch),
        };
        // Half a horizon more, so a batch that matches the demand does not run dry at the
        // window's last calls and ask for a sliver.
        let span = span.saturating_add(tuning.horizon_us / 2);
        self.demand
            .whole_within(span)
            .min(share)
            .max(tuning.min_batch)
    }

    /// When this window ends (µs since the epoch).
    fn ends_us(&self) -> u64 {
        self.quota
            .window()
            .end(self.grant.window)
            .saturating_mul(1_000_000)
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
            && self.grant.left() == 0
            && self.demand.whole_within(horizon_us) == 0
    }
}

/// The index of `hit`'s window at `now`.
pub fn window_of(hit: &Hit<'_>, now: Timestamp) -> u64 {
    hit.quota.window().index(now.secs())
}

#[cfg(test)]
mod tests;
