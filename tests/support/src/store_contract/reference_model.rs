//! The store contract's oracle: a reference model of every algorithm, written from the
//! definitions in `docs/algorithms.md` and envoyproxy/ratelimit's documented fixed window, not
//! from `src/limiter/`, so that a store (the memory store included) is checked against something
//! other than the code it runs.
//!
//! - **Windows** (fixed and sliding) keep an exact log of every charge to a counter, as
//!   `(time, hits)`; a count is a sum over the log between two instants. Nothing is folded into
//!   a state word, so a window rolls over, or a previous window weighs in, only because the sum
//!   is taken over another interval.
//! - **Buckets** (token and leaky) keep one theoretical arrival time, the GCRA's, in exact
//!   integers: time is counted in ticks of `1 / requests_per_unit` µs, so that one hit's
//!   emission interval (`window / requests_per_unit`) is a whole number of ticks and nothing is
//!   rounded until a decision reports whole hits or whole seconds. `n` hits move the arrival
//!   time `n` intervals on, and pass when it then lies no further ahead of now than the bucket
//!   holds. A leaky bucket is the same arithmetic with nginx's excess read off it.
//!
//! Where the documentation leaves a field open, the reading chosen is stated where it is
//! computed. The model follows the documentation only: where the limiter departed from it (a
//! bucket's peek asking for one hit, a leaky bucket's reset one emission interval early, an
//! emission interval rounded up to a microsecond) the limiter was changed, and the switches
//! that once let the model follow it are gone. The model refuses what the contract leaves
//! open: one key under two quotas, and a key's clock going backwards.

use std::collections::BTreeMap;

use sluice::clock::Timestamp;
use sluice::limiter::{Algorithm, Decision, Quota};
use sluice::store::Hit;

/// A fixed window's count saturates here (`Decision::count_after`).
const FIXED_WINDOW_MAX_COUNT: u64 = (1 << 40) - 1;

const MICROS_PER_SEC: u128 = 1_000_000;

/// Every counter the calls so far have touched, by key.
#[derive(Default)]
pub struct ReferenceModel {
    counters: BTreeMap<String, Counter>,
}

struct Counter {
    quota: Quota,
    /// The latest call's time, in microseconds.
    latest: u64,
    history: History,
}

enum History {
    /// Every charge in order: microseconds since the epoch, and hits (a refund is negative).
    Log(Vec<(u64, i128)>),
    /// The theoretical arrival time, in ticks of the bucket's clock ([`BucketClock`]) since the
    /// epoch: the instant at which the bucket is at rest again. At rest it may lie anywhere in
    /// the past (0 at first).
    Tat(u128),
}

impl ReferenceModel {
    /// `apply` for every hit in turn: one decision each, the counters charged as the
    /// algorithms say.
    pub fn apply(&mut self, now: Timestamp, hits: &[Hit<'_>]) -> Vec<Decision> {
        hits.iter()
            .map(|&Hit { key, quota, hits }| {
                let counter = self.counter(key, quota, now);
                match &mut counter.history {
                    History::Log(log) => match quota.algorithm {
                        Algorithm::FixedWindow => fixed_window(&quota, log, now, hits),
                        _ => sliding_window(&quota, log, now, hits),
                    },
                    History::Tat(tat) => bucket(&quota, tat, now, hits),
                }
            })
            .collect()
    }

    /// Takes hits off at `now` (a refund, `docs/algorithms.md`'s Refunds): the current
    /// window's count (fixed or sliding; the previous window's is not touched) and a bucket's
    /// arrival time go back by the hits, never below nothing (a window's count floored at 0,
    /// a bucket no fuller than at rest). Answers, per hit, what a call of 0 hits answers
    /// after it.
    pub fn refund(&mut self, now: Timestamp, hits: &[Hit<'_>]) -> Vec<Decision> {
        let mut peeks = Vec::with_capacity(hits.len());
        for hit in hits {
            self.take_off(now, hit);
            peeks.extend(self.apply(now, &[Hit { hits: 0, ..*hit }]));
        }
        peeks
    }

    fn take_off(&mut self, now: Timestamp, &Hit { key, quota, hits }: &Hit<'_>) {
        let counter = self.counter(key, quota, now);
        match &mut counter.history {
            History::Log(log) => {
                let (start, _) = window_around(&quota, now);
                let current = sum(log, start, now.micros() + 1);
                let given = current.min(i128::from(hits));
                log.push((now.micros(), -given));
            }
            History::Tat(tat) => {
                if quota.requests_per_unit > 0 {
                    let clock = BucketClock::of(&quota);
                    let back = u128::from(hits) * clock.interval;
                    *tat = tat.saturating_sub(back).max(clock.ticks(now));
                }
            }
        }
    }

    /// Forgets the counters, as if they had never been charged.
    pub fn reset(&mut self, hits: &[Hit<'_>]) {
        for hit in hits {
            self.counters.remove(hit.key);
        }
    }

    fn counter(&mut self, key: &str, quota: Quota, now: Timestamp) -> &mut Counter {
        let counter = self.counters.entry(key.to_owned()).or_insert(Counter {
            quota,
            latest: now.micros(),
            history: match quota.algorithm {
                Algorithm::FixedWindow | Algorithm::SlidingWindow => History::Log(Vec::new()),
                Algorithm::TokenBucket | Algorithm::LeakyBucket => History::Tat(0),
                Algorithm::Concurrency => {
                    panic!("the model has no concurrency limit: slots_contract states its numbers")
                }
            },
        });
        assert_eq!(
            counter.quota, quota,
            "a case reused the key {key} under another quota, which the contract leaves open"
        );
        assert!(
            counter.latest <= now.micros(),
            "a case moved the clock of {key} backwards ({} after {}), which the contract leaves open",
            now.micros(),
            counter.latest
        );
        counter.latest = now.micros();
        counter
    }
}

/// The window's length: `unit_multiplier` units (0 reads as 1).
fn window_micros(quota: &Quota) -> u128 {
    u128::from(quota.unit.secs()) * u128::from(quota.unit_multiplier.max(1)) * MICROS_PER_SEC
}

/// The epoch-aligned window that holds `now`: its start and end, in microseconds.
fn window_around(quota: &Quota, now: Timestamp) -> (u64, u64) {
    let length = window_micros(quota) as u64;
    let start = now.micros() - now.micros() % length;
    (start, start + length)
}

/// The hits logged in `[from, to)`.
fn sum(log: &[(u64, i128)], from: u64, to: u64) -> i128 {
    log.iter()
        .filter(|(at, _)| (from..to).contains(at))
        .map(|(_, hits)| hits)
        .sum()
}

/// Whole seconds from `now` to `end`, rounded up and at least 1 (`docs/algorithms.md`,
/// Durations).
fn secs_until(now_micros: u128, end_micros: u128) -> u64 {
    let secs = end_micros
        .saturating_sub(now_micros)
        .div_ceil(MICROS_PER_SEC);
    secs.max(1) as u64
}

fn remaining(over: bool, limit: u64, count_after: u64) -> u32 {
    if over {
        0
    } else {
        (limit - count_after) as u32
    }
}

/// envoyproxy/ratelimit's window: every call counts, admitted or not, and is over when the
/// count after it passes the limit; `duration_until_reset = window − now % window` in whole
/// seconds.
fn fixed_window(quota: &Quota, log: &mut Vec<(u64, i128)>, now: Timestamp, hits: u64) -> Decision {
    let (start, end) = window_around(quota, now);
    let found = sum(log, start, end) as u64;
    let count_before = found.min(FIXED_WINDOW_MAX_COUNT);
    let count_after = found.saturating_add(hits).min(FIXED_WINDOW_MAX_COUNT);
    log.push((now.micros(), i128::from(hits)));
    let limit = u64::from(quota.requests_per_unit);
    let over = count_after > limit;
    Decision {
        penalized: false,
        count_after,
        count_before,
        over,
        remaining: remaining(over, limit, count_after),
        reset_after_secs: secs_until(u128::from(now.micros()), u128::from(end)),
        expired: 0,
    }
}

/// The two-fixed-window estimate, `previous × (1 − f) + current` with `f` the fraction of the
/// current window elapsed, in exact integers: everything below is multiplied by the window's
/// length in microseconds.
///
/// The docs give `over` (the estimate after the hits passes the limit: a charge with
/// `charge_refused` takes the count past it, and a count of `limit + d` refuses until
/// `d / (limit + d)` of the next window has passed) and `limit_remaining = floor(limit −
/// estimate)`. They are silent on `count_before` and `count_after`; the model reads them as the
/// estimate rounded up, before and after the call's hits (refused or not), which is the one
/// reading that keeps `Decision`'s own definitions: `over = count_after > limit` and
/// `remaining = limit − count_after`.
fn sliding_window(
    quota: &Quota,
    log: &mut Vec<(u64, i128)>,
    now: Timestamp,
    hits: u64,
) -> Decision {
    let length = window_micros(quota);
    let (start, end) = window_around(quota, now);
    let previous = sum(log, start - length as u64, start) as u128;
    let current = sum(log, start, now.micros() + 1) as u128;
    let elapsed = u128::from(now.micros() - start);
    let before = previous * (length - elapsed) + current * length;
    let after = before + u128::from(hits) * length;
    let limit = u64::from(quota.requests_per_unit);
    let over = after > u128::from(limit) * length;
    if !over || quota.charge_refused {
        log.push((now.micros(), i128::from(hits)));
    }
    let count_after = after.div_ceil(length) as u64;
    Decision {
        penalized: false,
        count_after,
        count_before: before.div_ceil(length) as u64,
        over,
        remaining: remaining(over, limit, count_after),
        reset_after_secs: secs_until(u128::from(now.micros()), u128::from(end)),
        expired: 0,
    }
}

/// A bucket's time: ticks of `1 / ticks_per_micro` µs, in which one hit's emission interval
/// `window / requests_per_unit` is `interval` ticks.
struct BucketClock {
    ticks_per_micro: u128,
    interval: u128,
}

impl BucketClock {
    fn of(quota: &Quota) -> Self {
        // Exact: ticks of 1 / rate µs make the interval the window's length in µs.
        BucketClock {
            ticks_per_micro: u128::from(quota.requests_per_unit),
            interval: window_micros(quota),
        }
    }

    fn ticks(&self, now: Timestamp) -> u128 {
        u128::from(now.micros()) * self.ticks_per_micro
    }

    /// Whole seconds from `from` to `to` (ticks), rounded up and at least 1.
    fn secs(&self, from: u128, to: u128) -> u64 {
        let per_sec = self.ticks_per_micro * MICROS_PER_SEC;
        (to.saturating_sub(from).div_ceil(per_sec)).max(1) as u64
    }
}

/// How many hits a bucket holds at once. A token bucket: `burst` tokens (default
/// `requests_per_unit`). A leaky bucket is nginx's `limit_req`: a request is refused when the
/// excess it would leave passes `burst` (default 0), where a request at rest leaves no excess;
/// so `burst + 1` requests pass at once, and it is a GCRA of `burst + 1` hits whose excess is
/// what it holds less the one request being served.
fn capacity(quota: &Quota) -> u128 {
    let burst = quota.burst.map(|b| u128::from(b.get()));
    match quota.algorithm {
        Algorithm::LeakyBucket => burst.unwrap_or(0) + 1,
        _ => burst.unwrap_or(u128::from(quota.requests_per_unit)),
    }
}

/// The GCRA on one theoretical arrival time `tat`, in ticks. `n` hits move it `n`
/// emission intervals past `max(tat, now)` and pass when it then lies at most `capacity`
/// intervals ahead of `now`; a refused call moves it only when it charges refused hits (the
/// debt, waited out at the rate).
///
/// The docs give `over` (the hits do not fit), `limit_remaining` (tokens left; for the leaky
/// bucket, requests that would pass now) and the durations: an admitted call's is until the
/// bucket is at rest again, `limit_remaining` whole (`tat`), a refused one's until the same call
/// would pass, with `charge_refused` until a single hit passes again. They are silent on the
/// counts: the model reads a token bucket's count as the tokens in use and a leaky bucket's as
/// nginx's excess (`over` is then the docs' "the excess it would leave exceeds `burst`"), both
/// rounded up, and `count_after` includes a refused call's hits.
fn bucket(quota: &Quota, tat: &mut u128, now: Timestamp, hits: u64) -> Decision {
    if quota.requests_per_unit == 0 {
        return nothing_passes(quota, hits);
    }
    let leaky = quota.algorithm == Algorithm::LeakyBucket;
    let clock = BucketClock::of(quota);
    let interval = clock.interval;
    let tolerance = capacity(quota) * interval;
    let now = clock.ticks(now);
    let from = (*tat).max(now);
    let probe = from + u128::from(hits) * interval;
    let over = probe - now > tolerance;
    let charged = hits > 0 && (!over || quota.charge_refused);
    if charged {
        *tat = from + u128::from(hits) * interval;
    }
    let at_rest = (*tat).max(now);
    let held = |until: u128| (until - now).div_ceil(interval);
    // nginx's excess leaves out the request being served.
    let count = |until: u128| {
        let held = held(until);
        (if leaky { held.saturating_sub(1) } else { held }) as u64
    };
    let wait_until = if !over {
        at_rest
    } else if quota.charge_refused {
        (at_rest + interval).saturating_sub(tolerance)
    } else {
        probe.saturating_sub(tolerance)
    };
    Decision {
        penalized: false,
        count_after: count(probe),
        count_before: count(from),
        over,
        remaining: if over {
            0
        } else {
            (capacity(quota) - held(at_rest)) as u32
        },
        reset_after_secs: clock.secs(now, wait_until),
        expired: 0,
    }
}

/// A bucket with a rate of 0 never refills: every hit is refused, a peek passes (as a fixed
/// window of 0 does). The docs are silent on its duration; the model answers one window, the
/// bucket's period (it has no epoch-aligned window to end).
fn nothing_passes(quota: &Quota, hits: u64) -> Decision {
    Decision {
        penalized: false,
        count_after: hits,
        count_before: 0,
        over: hits > 0,
        remaining: 0,
        reset_after_secs: (window_micros(quota) / MICROS_PER_SEC) as u64,
        expired: 0,
    }
}
