//! The token bucket and the leaky bucket, both kept as a theoretical arrival time (GCRA): one
//! `u64` of microseconds since the epoch, the time at which the bucket would be back to its
//! resting state if no more hits came. `0` (or any time in the past) is a resting bucket, which
//! answers every call as an empty one does: so a store may drop a bucket exactly when its time
//! has passed ([`is_stale`]), and a remote store may let its key expire then.
//!
//! With `T = unit / requests_per_unit` (rounded up to a whole microsecond, so never faster than
//! configured; rates above a million per second are capped there):
//!
//! - **Token bucket** (Guava's SmoothBursty, design note 002): capacity `C = burst` (default
//!   `requests_per_unit`), refilled at one token per `T`. `n` hits are admitted when
//!   `max(tat, now) + n*T - now <= C*T`; then `tat` moves to that value. In any interval of
//!   length `t`, at most `C + t / T` hits are admitted.
//! - **Leaky bucket**, with nginx `limit_req` semantics (`rate`, `burst`, and `nodelay`, since
//!   an external service admits or refuses but cannot delay): nginx keeps an `excess` that
//!   drains at `rate`; a request is refused when the excess it would leave exceeds `burst`.
//!   A request served at rest leaves no excess, and each one adds `T` of work that drains at
//!   the rate, so the bucket is at rest again one `T` after its excess is 0: its arrival time
//!   is `excess + T` ahead of now, and a request is admitted when the time it would leave is at
//!   most `(burst + 1) * T` ahead. That is the token bucket's rule with a capacity of
//!   `burst + 1`, and nginx's excess is the count less the one request being served. After
//!   idling, `burst + 1` requests pass at once, as in nginx. `n` hits are `n` requests arriving
//!   together.
//!
//! Rejected hits change nothing, so a client sending twice the rate still gets the rate; unless
//! the limit charges refused hits (`charge_refused`, for costs reported after the response):
//! then the arrival time moves as if they had been admitted, past the tolerance, and later
//! calls are refused until it is back within it (a debt of `d` hits is waited out in `d * T`).
//!
//! `limit_remaining` is how many more single hits would be admitted right now. A call that is
//! admitted reports as `duration_until_reset` the time until the bucket is back at rest (full
//! for a token bucket, drained for a leaky one): when `limit_remaining` is whole again. A call
//! that is refused reports the time until the same call would be admitted, which is what a
//! client's Retry-After needs (a charged refusal: until a single hit would be). Both are
//! rounded up to whole seconds, at least 1.
//!
//! A peek (0 hits) asks whether 0 hits fit, as `Decision::over` says ("the hits did not
//! fit") and as a window answers one: always, unless the bucket is already past its tolerance
//! (a debt charged with `charge_refused`), just as a window's peek is over only once the count
//! is above the limit. Its `count_after` is its `count_before`. So the check of 0 hits before a
//! request whose cost is charged afterwards passes while the budget is not overspent, on every
//! algorithm alike; `limit_remaining` still says how many single hits would pass.

use super::{Algorithm, Decision, Quota};

pub const EMPTY: u64 = 0;

/// The two numbers a bucket is defined by, in microseconds: the emission interval `T` and how
/// far ahead of now the arrival time may run (`C*T` for a token bucket, `(burst + 1)*T` for a
/// leaky one). `None` for a rate of 0. A store that runs the algorithm elsewhere (a Redis script)
/// takes them from here so both sides agree.
pub fn params(quota: &Quota) -> Option<(u64, u64)> {
    let shape = Shape::of(quota)?;
    let clamp = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
    Some((clamp(shape.t), clamp(shape.tolerance)))
}

/// Microseconds per hit for `quota`, rounded up; `None` for a rate of 0.
fn emission_interval(quota: &Quota) -> Option<u128> {
    let unit_us = u128::from(quota.window().secs()) * 1_000_000;
    match quota.requests_per_unit {
        0 => None,
        rpu => Some(unit_us.div_ceil(u128::from(rpu))),
    }
}

fn secs_ceil(us: u128) -> u64 {
    u64::try_from(us.div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Whether a bucket is at rest at `now_us`, so that it answers as an empty one and a store may
/// drop it.
pub fn is_stale(state: u64, now_us: u64) -> bool {
    state <= now_us
}

/// A bucket as the algorithm sees it: the emission interval `t` and the tolerance (how far
/// ahead of now the arrival time may run), in microseconds, and whether it leaks (nginx's
/// `limit_req`) or holds tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    t: u128,
    tolerance: u128,
    leaky: bool,
    charge_refused: bool,
}

impl Shape {
    /// The shape of `quota`'s bucket; `None` for a rate of 0.
    pub fn of(quota: &Quota) -> Option<Shape> {
        let t = emission_interval(quota)?;
        let leaky = quota.algorithm == Algorithm::LeakyBucket;
        let slots = if leaky {
            u64::from(quota.burst.map_or(0, |b| b.get())) + 1
        } else {
            u64::from(quota.burst.map_or(quota.requests_per_unit, |b| b.get()))
        };
        Some(Shape {
            t,
            tolerance: u128::from(slots) * t,
            leaky,
            charge_refused: quota.charge_refused,
        })
    }

    /// How far ahead of now the arrival time may run, in microseconds.
    pub fn tolerance(self) -> u128 {
        self.tolerance
    }

    /// The bucket of a `part / whole` share of this one (a lease, `crate::cluster::lease`):
    /// the emission interval stretched by `whole / part` and the same tolerance, so the share's
    /// part of the rate and of the capacity. `part` must be above 0.
    pub fn share(self, part: u64, whole: u64) -> Shape {
        let t = (self.t * u128::from(whole)).div_ceil(u128::from(part.max(1)));
        Shape { t, ..self }
    }
}

/// Applies `hits` at `now_us` to a token or leaky bucket.
pub fn decide(state: u64, now_us: u64, quota: &Quota, hits: u64) -> (Decision, u64) {
    match Shape::of(quota) {
        Some(shape) => decide_shaped(state, now_us, shape, hits),
        None => {
            // A rate of 0 admits nothing; a peek still answers OK, as a fixed window of 0 does.
            let d = Decision {
                count_before: 0,
                count_after: hits,
                over: hits > 0,
                remaining: 0,
                reset_after_secs: quota.window().secs(),
            };
            (d, state)
        }
    }
}

/// Applies `hits` at `now_us` to a bucket of `shape`.
pub fn decide_shaped(state: u64, now_us: u64, shape: Shape, hits: u64) -> (Decision, u64) {
    let now = u128::from(now_us);
    let tat = u128::from(state);
    let Shape {
        t,
        tolerance,
        leaky,
        charge_refused,
    } = shape;
    let n = u128::from(hits);
    // Where the bucket would stand after `n` hits. 0 hits always fit, unless the bucket is
    // already past its tolerance (a charged debt).
    let tat_after = tat.max(now) + n * t;
    let over = tat_after - now > tolerance;
    // A refused call (unless charged) or a peek leaves the state as it was.
    let charged = n > 0 && (!over || charge_refused);
    let (new_tat, ahead) = if charged {
        (tat_after, tat_after - now)
    } else {
        (tat, tat.max(now) - now)
    };
    let remaining = if over {
        0
    } else {
        // Another hit needs `ahead + T <= tolerance`.
        let room = tolerance.saturating_sub(ahead) / t;
        u32::try_from(room).unwrap_or(u32::MAX)
    };
    let reset_us = if over && charge_refused {
        // In debt (this call's charge included): a single hit passes once
        // `new_tat + t - later <= tolerance`.
        (new_tat + t - now).saturating_sub(tolerance)
    } else if over {
        // The same call passes once `tat_after - later <= tolerance`.
        tat_after - now - tolerance
    } else {
        ahead
    };
    // Hits in the bucket (a leaky bucket's count is nginx's excess: less the one request being
    // served).
    let used = |ahead: u128| {
        let held = u64::try_from(ahead.div_ceil(t)).unwrap_or(u64::MAX);
        if leaky { held.saturating_sub(1) } else { held }
    };
    let decision = Decision {
        count_before: used(tat.max(now) - now),
        count_after: used(tat_after - now),
        over,
        remaining,
        reset_after_secs: secs_ceil(reset_us),
    };
    (decision, u64::try_from(new_tat).unwrap_or(u64::MAX))
}

/// Gives back `hits` admitted earlier (for a request that another limit refused): moves the
/// arrival time back by `hits` emission intervals. For both buckets the result decides every
/// later call exactly as the state before the admission would have.
pub fn refund(state: u64, quota: &Quota, hits: u64) -> u64 {
    match Shape::of(quota) {
        None => state,
        Some(shape) => refund_shaped(state, shape, hits),
    }
}

/// [`refund`] for a bucket of `shape`.
pub fn refund_shaped(state: u64, shape: Shape, hits: u64) -> u64 {
    let back = u128::from(state).saturating_sub(u128::from(hits) * shape.t);
    u64::try_from(back).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::limiter::Unit;
    use proptest::prelude::*;

    const S: u64 = 1_000_000;

    fn quota(algorithm: Algorithm, rpu: u32, unit: Unit, burst: Option<u32>) -> Quota {
        Quota {
            requests_per_unit: rpu,
            unit,
            algorithm,
            burst: burst.and_then(NonZeroU32::new),
            charge_refused: false,
            unit_multiplier: 1,
        }
    }

    fn run(q: &Quota, arrivals: &[(u64, u64)]) -> Vec<bool> {
        let mut s = EMPTY;
        arrivals
            .iter()
            .map(|&(t, n)| {
                let (d, next) = decide(s, t, q, n);
                s = next;
                !d.over
            })
            .collect()
    }

    #[test]
    fn token_bucket_allows_a_burst_then_the_rate() {
        // 10/s with a bucket of 20: 20 at once, then one per 100 ms.
        let q = quota(Algorithm::TokenBucket, 10, Unit::Second, Some(20));
        let now = 100 * S;
        let burst = run(&q, &[(now, 1); 21]);
        assert_eq!(burst.iter().filter(|a| **a).count(), 20);
        let mut s = EMPTY;
        for _ in 0..20 {
            s = decide(s, now, &q, 1).1;
        }
        let (d, _) = decide(s, now, &q, 1);
        assert!(d.over);
        assert_eq!(d.reset_after_secs, 1, "next token in 100 ms, rounded up");
        let (d, s2) = decide(s, now + S / 10, &q, 1);
        assert!(!d.over);
        assert_eq!(d.remaining, 0);
        // Full again 2 s after the burst.
        assert_eq!(d.reset_after_secs, 2);
        let (d, _) = decide(s2, now + 3 * S, &q, 0);
        assert_eq!(d.remaining, 20);
    }

    #[test]
    fn token_bucket_capacity_defaults_to_the_rate() {
        let q = quota(Algorithm::TokenBucket, 5, Unit::Minute, None);
        let admitted = run(&q, &[(7 * S, 1); 9]);
        assert_eq!(admitted.iter().filter(|a| **a).count(), 5);
    }

    #[test]
    fn leaky_bucket_passes_burst_plus_one_then_the_rate() {
        // nginx `rate=2r/s burst=3 nodelay`: 4 at once, then one per 500 ms.
        let q = quota(Algorithm::LeakyBucket, 2, Unit::Second, Some(3));
        let now = 50 * S;
        let a = run(&q, &[(now, 1); 6]);
        assert_eq!(a, [true, true, true, true, false, false]);
        let no_burst = quota(Algorithm::LeakyBucket, 2, Unit::Second, None);
        let a = run(&no_burst, &[(now, 1), (now, 1), (now + S / 2, 1)]);
        assert_eq!(a, [true, false, true]);
    }

    #[test]
    fn a_leaky_bucket_resets_when_it_is_at_rest_not_when_its_excess_drains() {
        let now = 100 * S;
        // 3 a minute with a burst of 2: one hit leaves room for 2 more until it has drained,
        // 20 s on; only then is `limit_remaining` whole (3) again.
        let q = quota(Algorithm::LeakyBucket, 3, Unit::Minute, Some(2));
        let (d, s) = decide(EMPTY, now, &q, 1);
        assert_eq!((d.remaining, d.reset_after_secs), (2, 20));
        assert_eq!(decide(s, now + 20 * S - 1, &q, 0).0.remaining, 2);
        assert_eq!(decide(s, now + 20 * S, &q, 0).0.remaining, 3);
        // 1 a minute, no burst: the next hit is refused for 60 s, which is what it reports.
        let q = quota(Algorithm::LeakyBucket, 1, Unit::Minute, None);
        let (d, s) = decide(EMPTY, now, &q, 1);
        assert_eq!((d.over, d.remaining, d.reset_after_secs), (false, 0, 60));
        let (refused, _) = decide(s, now + S, &q, 1);
        assert_eq!((refused.over, refused.reset_after_secs), (true, 59));
        assert!(!is_stale(s, now + 60 * S - 1));
        assert!(is_stale(s, now + 60 * S));
        assert!(!decide(s, now + 60 * S, &q, 1).0.over);
    }

    #[test]
    fn a_refund_undoes_an_admission() {
        for algorithm in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
            let q = quota(algorithm, 2, Unit::Second, Some(2));
            let (_, before) = decide(EMPTY, 10 * S, &q, 1);
            let (d, after) = decide(before, 10 * S, &q, 1);
            assert!(!d.over);
            let back = refund(after, &q, 1);
            let expect = decide(before, 10 * S, &q, 1).0;
            assert_eq!(decide(back, 10 * S, &q, 1).0, expect, "{algorithm:?}");
        }
    }

    #[test]
    fn charged_refusals_are_debt_the_bucket_waits_out() {
        // 100 per minute (T = 600 ms, room for 60 s ahead); three reports of 40 at once: the
        // third is over and still charged, so the bucket runs 12 s (token: 12.6 s, as the
        // first hit of a token bucket is charged from `now`) into debt.
        for (algorithm, clear_us) in [
            (Algorithm::TokenBucket, 12_600_000u64),
            (Algorithm::LeakyBucket, 12_000_000),
        ] {
            let q = Quota {
                charge_refused: true,
                ..quota(algorithm, 100, Unit::Minute, Some(100))
            };
            let now = 100 * S;
            let mut s = EMPTY;
            let mut over = Vec::new();
            for _ in 0..3 {
                let (d, n) = decide(s, now, &q, 40);
                s = n;
                over.push(d.over);
                if d.over {
                    assert_eq!(d.reset_after_secs, clear_us.div_ceil(S), "{algorithm:?}");
                }
            }
            assert_eq!(over, [false, false, true], "{algorithm:?}");
            assert!(decide(s, now + clear_us - 1, &q, 1).0.over, "{algorithm:?}");
            assert!(!decide(s, now + clear_us, &q, 1).0.over, "{algorithm:?}");
            // A check of 0 hits passes one emission interval (600 ms) sooner: once the debt
            // is repaid, with no room yet for a hit.
            let repaid = now + clear_us - 600_000;
            assert!(decide(s, repaid - 1, &q, 0).0.over, "{algorithm:?}");
            let (peek, _) = decide(s, repaid, &q, 0);
            assert_eq!((peek.over, peek.remaining), (false, 0), "{algorithm:?}");
            // Without the setting the third report is dropped: room is left at once.
            let dropped = Quota {
                charge_refused: false,
                ..q
            };
            let s = (0..3).fold(EMPTY, |s, _| decide(s, now, &dropped, 40).1);
            assert!(!decide(s, now, &dropped, 0).0.over, "{algorithm:?}");
        }
    }

    #[test]
    fn a_rate_of_zero_admits_nothing() {
        let q = quota(Algorithm::TokenBucket, 0, Unit::Second, None);
        assert!(decide(EMPTY, S, &q, 1).0.over);
        assert!(!decide(EMPTY, S, &q, 0).0.over);
    }

    /// nginx's `ngx_http_limit_req` decision, written the straightforward way: an excess in
    /// requests that drains at `rate`, in exact rational arithmetic (microsecond times, rates
    /// that divide a second evenly, so both sides are exact).
    fn nginx(rate_per_sec: u64, burst: u64, arrivals: &[u64]) -> Vec<bool> {
        let t = S / rate_per_sec; // µs per request
        // excess kept in µs of backlog (excess_requests * t).
        let (mut excess, mut last): (i128, Option<u64>) = (0, None);
        arrivals
            .iter()
            .map(|&now| {
                let elapsed = last.map_or(i128::MAX / 4, |l| i128::from(now - l));
                let e = (excess - elapsed + i128::from(t)).max(0);
                if e > i128::from(burst * t) {
                    false
                } else {
                    excess = e;
                    last = Some(now);
                    true
                }
            })
            .collect()
    }

    proptest! {
        #[test]
        fn leaky_bucket_matches_nginx(
            rate in prop::sample::select(vec![1u64, 2, 4, 5, 10, 20, 50]),
            burst in 0u32..6,
            gaps in proptest::collection::vec(0u64..400, 1..200),
        ) {
            let mut now = 10 * S;
            let arrivals: Vec<u64> = gaps.iter().map(|g| { now += g * 1_000; now }).collect();
            let q = quota(Algorithm::LeakyBucket, rate as u32, Unit::Second, Some(burst));
            let ours = run(&q, &arrivals.iter().map(|&t| (t, 1)).collect::<Vec<_>>());
            prop_assert_eq!(ours, nginx(rate, u64::from(burst), &arrivals));
        }

        /// In any interval of length t, a token bucket admits at most C + t/T hits.
        #[test]
        fn token_bucket_never_exceeds_burst_plus_rate(
            rate in 1u32..50,
            burst in 1u32..30,
            steps in proptest::collection::vec((0u64..300, 1u64..4), 1..200),
        ) {
            let q = quota(Algorithm::TokenBucket, rate, Unit::Second, Some(burst));
            let t = (S as u128).div_ceil(u128::from(rate));
            let mut now = 5 * S;
            let mut s = EMPTY;
            let mut log = Vec::new();
            for (gap_ms, hits) in steps {
                now += gap_ms * 1_000;
                let (d, next) = decide(s, now, &q, hits);
                s = next;
                if !d.over {
                    log.push((now, hits));
                }
            }
            for (i, &(start, _)) in log.iter().enumerate() {
                let mut admitted = 0u128;
                for &(end, hits) in &log[i..] {
                    admitted += u128::from(hits);
                    let span = u128::from(end - start);
                    prop_assert!(
                        admitted <= u128::from(burst) + span / t,
                        "{admitted} hits in {span} us"
                    );
                }
            }
        }
    }
}
