//! The token bucket and the leaky bucket, both kept as a theoretical arrival time (GCRA): the
//! time at which the bucket would be back to its resting state if no more hits came. `0` (or
//! any time in the past) is a resting bucket, which answers every call as an empty one does:
//! so a store may drop a bucket exactly when its time has passed ([`is_stale`]), and a remote
//! store may let its key expire then.
//!
//! With `T = unit × unit_multiplier / requests_per_unit`, exactly:
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
//! **The state word** is a `u128`: the arrival time's whole microseconds since the epoch in
//! the high 64 bits, and its fraction of a microsecond in the low 64, as a numerator over the
//! bucket's denominator (`requests_per_unit`, see [`Shape`]). Times are counted in those
//! fractions, so `T` is a whole number of them and nothing is rounded until a decision reports
//! whole hits or whole seconds: 3 hits on a token bucket of 3 a second are at rest after
//! exactly 1 s. The whole microseconds mean the same under any rate, so a word read under
//! another rate (a config reload) is off by less than a microsecond; words compare as times
//! (a later arrival time is a larger word), and a time in whole microseconds is a word with no
//! fraction ([`at_micros`], [`rest_micros`]).
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

/// A bucket that was never hit: at rest at any time.
pub const EMPTY: u128 = 0;

const FRACTION_BITS: u32 = 64;
const FRACTION_MASK: u128 = (1 << FRACTION_BITS) - 1;
const MICROS_PER_SEC: u128 = 1_000_000;

/// Whether a bucket is at rest at `now_us`, so that it answers as an empty one and a store may
/// drop it.
pub(crate) fn is_stale(state: u128, now_us: u64) -> bool {
    state <= at_micros(now_us)
}

/// The state of a bucket at rest at `us` microseconds since the epoch (a time kept in whole
/// microseconds, such as the write-behind copy's).
pub const fn at_micros(us: u64) -> u128 {
    (us as u128) << FRACTION_BITS
}

/// The time a bucket is at rest, rounded up to a whole microsecond: for a store that keeps
/// whole microseconds or sets an expiry, which must not end before it.
pub(crate) fn rest_micros(state: u128) -> u64 {
    let whole = u64::try_from(state >> FRACTION_BITS).unwrap_or(u64::MAX);
    whole.saturating_add(u64::from(state & FRACTION_MASK != 0))
}

/// How far ahead of now a bucket's arrival time may lie after an admitted call, in whole
/// microseconds rounded up (`C*T`; `(burst + 1)*T` for a leaky bucket): how far back another
/// owner's state still matters. `None` for a rate of 0.
pub(crate) fn tolerance_micros(quota: &Quota) -> Option<u64> {
    let shape = Shape::of(quota)?;
    let us = shape.tolerance.div_ceil(u128::from(shape.den));
    Some(u64::try_from(us).unwrap_or(u64::MAX))
}

/// A bucket as the algorithm sees it. Its times are counted in ticks of `1 / den` µs, in which
/// the emission interval `t` is a whole number: for a quota, `den` is `requests_per_unit` and
/// `t` the window's length in µs. The tolerance (how far ahead of now the arrival time may run
/// after an admitted call) is `capacity × t`, and a leaky bucket's count leaves out the
/// request being served (nginx's excess).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    den: u64,
    t: u128,
    tolerance: u128,
    leaky: bool,
    charge_refused: bool,
}

impl Shape {
    /// The shape of `quota`'s bucket; `None` for a rate of 0.
    pub fn of(quota: &Quota) -> Option<Shape> {
        let rate = u64::from(quota.requests_per_unit);
        if rate == 0 {
            return None;
        }
        let leaky = quota.algorithm == Algorithm::LeakyBucket;
        let capacity = if leaky {
            u64::from(quota.burst.map_or(0, |b| b.get())) + 1
        } else {
            u64::from(quota.burst.map_or(quota.requests_per_unit, |b| b.get()))
        };
        let t = u128::from(quota.window().secs()) * MICROS_PER_SEC;
        Some(Shape {
            den: rate,
            t,
            tolerance: u128::from(capacity) * t,
            leaky,
            charge_refused: quota.charge_refused,
        })
    }

    /// The bucket of a `part / whole` share of this one (a lease, `crate::cluster::lease`):
    /// the emission interval stretched by `whole / part` and the same tolerance in time, so the
    /// share's part of the rate and of the capacity. Exact: ticks `part` times finer. `part`
    /// must be above 0, and `den × part` within 64 bits (a share is at most a million parts).
    pub fn share(self, part: u64, whole: u64) -> Shape {
        let part = part.max(1);
        Shape {
            den: self.den.saturating_mul(part),
            t: self.t.saturating_mul(u128::from(whole)),
            tolerance: self.tolerance.saturating_mul(u128::from(part)),
            ..self
        }
    }

    /// The state of a bucket of shape `to`, another share of the same bucket (the same
    /// tolerance in time), holding at `now_us` the tokens this one holds in `state`, at most
    /// its capacity: a lease's bucket changing its share keeps its tokens, so a larger share
    /// refills faster but gives no burst.
    pub(crate) fn reshare(self, state: u128, now_us: u64, to: Shape) -> u128 {
        let now = u128::from(now_us) * u128::from(self.den);
        let ahead = (self.ticks(state).max(now) - now).min(self.tolerance);
        // The tokens held, `(tolerance - ahead) / t`, as ticks of `to`. Shares of one bucket
        // count their interval in the same number of ticks.
        let free = self.tolerance - ahead;
        let kept = match free.checked_mul(to.t) {
            Some(scaled) => scaled / self.t,
            None => free / self.t * to.t,
        };
        let to_now = u128::from(now_us) * u128::from(to.den);
        to.word(to_now + to.tolerance.saturating_sub(kept))
    }

    /// Ticks per microsecond: the fractions of a microsecond this bucket's times are counted in.
    pub fn den(self) -> u64 {
        self.den
    }

    /// The emission interval, in ticks.
    pub fn interval(self) -> u128 {
        self.t
    }

    /// How far ahead of now the arrival time may run after an admitted call, in ticks.
    pub fn tolerance(self) -> u128 {
        self.tolerance
    }

    /// `ticks` as whole microseconds and the ticks left over (below [`Shape::den`]).
    pub fn split(self, ticks: u128) -> (u128, u64) {
        let den = u128::from(self.den);
        (ticks / den, (ticks % den) as u64)
    }

    /// A state word as ticks since the epoch. A fraction not below `den` (a word written
    /// under a higher rate) reads as the last tick of its microsecond.
    fn ticks(self, state: u128) -> u128 {
        let fraction = (state & FRACTION_MASK).min(u128::from(self.den - 1));
        (state >> FRACTION_BITS)
            .saturating_mul(u128::from(self.den))
            .saturating_add(fraction)
    }

    /// Ticks since the epoch as a state word (past 2^64 µs, the last microsecond there is).
    fn word(self, ticks: u128) -> u128 {
        let (us, fraction) = self.split(ticks);
        match u64::try_from(us) {
            Ok(us) => at_micros(us) | u128::from(fraction),
            Err(_) => at_micros(u64::MAX),
        }
    }

    /// The text a remote store keeps a state as ([`text`]).
    pub fn text(self, state: u128) -> String {
        text_over(state, self.den)
    }

    /// The state a [`Shape::text`] holds ([`parse`]).
    pub fn parse(self, text: &str) -> Option<u128> {
        parse_over(text, self.den)
    }
}

/// The text a remote store keeps a bucket of `quota` as: its arrival time in µs since the
/// epoch, in decimal, with its fraction of a microsecond to 12 places when it has one
/// (`1700000000333333.333333333333`). A number to anything that reads one (a release that kept
/// whole microseconds reads the whole part), and exact: 12 places tell every numerator apart
/// for a denominator up to 2^32, which `requests_per_unit` is.
pub fn text(quota: &Quota, state: u128) -> String {
    text_over(state, denominator(quota))
}

/// The state a [`text`] holds (a whole number of µs too); `None` if it is not one.
pub fn parse(quota: &Quota, text: &str) -> Option<u128> {
    parse_over(text, denominator(quota))
}

/// The denominator of `quota`'s fractions of a microsecond (1 for a rate of 0, which keeps no
/// state of its own).
fn denominator(quota: &Quota) -> u64 {
    u64::from(quota.requests_per_unit.max(1))
}

fn text_over(state: u128, den: u64) -> String {
    let den = u128::from(den);
    let us = state >> FRACTION_BITS;
    let fraction = (state & FRACTION_MASK).min(den - 1);
    if fraction == 0 {
        return us.to_string();
    }
    let scale = 10u128.pow(12);
    let places = ((fraction * scale + den / 2) / den).min(scale - 1);
    format!("{us}.{places:012}")
}

fn parse_over(text: &str, den: u64) -> Option<u128> {
    let (whole, places) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !(places.is_empty() || digits(places)) {
        return None;
    }
    let us: u64 = whole.parse().ok()?;
    let den = u128::from(den);
    let fraction = match places {
        "" => 0,
        places => {
            let scale = 10u128.pow(places.len() as u32);
            let f: u128 = places.parse().ok()?;
            (f.saturating_mul(den).saturating_add(scale / 2) / scale).min(den - 1)
        }
    };
    Some(at_micros(us) | fraction)
}

/// Applies `hits` at `now_us` to a token or leaky bucket.
pub fn decide(state: u128, now_us: u64, quota: &Quota, hits: u64) -> (Decision, u128) {
    match Shape::of(quota) {
        Some(shape) => decide_shaped(state, now_us, shape, hits),
        None => {
            // A rate of 0 admits nothing and holds nothing (a charged refusal has no rate to
            // be waited out at); a peek still answers OK, as a fixed window of 0 does.
            let d = Decision {
                penalized: false,
                count_before: 0,
                count_after: hits,
                over: hits > 0,
                remaining: 0,
                reset_after_secs: quota.window().secs(),
                expired: 0,
            };
            (d, state)
        }
    }
}

/// Applies `hits` at `now_us` to a bucket of `shape`.
pub(crate) fn decide_shaped(state: u128, now_us: u64, shape: Shape, hits: u64) -> (Decision, u128) {
    let Shape {
        den,
        t,
        tolerance,
        leaky,
        charge_refused,
    } = shape;
    let now = u128::from(now_us) * u128::from(den);
    let tat = shape.ticks(state);
    // Where the bucket would stand after the hits. 0 hits always fit, unless the bucket is
    // already past its tolerance (a charged debt).
    let from = tat.max(now);
    let tat_after = from.saturating_add(u128::from(hits).saturating_mul(t));
    let over = tat_after - now > tolerance;
    // A refused call (unless charged) or a peek leaves the state as it was.
    let charged = hits > 0 && (!over || charge_refused);
    let at_rest = if charged { tat_after } else { from };
    let remaining = if over {
        0
    } else {
        // Another hit needs `ahead + T <= tolerance`.
        u32::try_from((tolerance - (at_rest - now)) / t).unwrap_or(u32::MAX)
    };
    let wait = if !over {
        at_rest - now
    } else if charge_refused {
        // In debt (this call's charge included): a single hit passes once
        // `at_rest + t - later <= tolerance`.
        (at_rest - now + t).saturating_sub(tolerance)
    } else {
        // The same call passes once `tat_after - later <= tolerance`.
        tat_after - now - tolerance
    };
    // Hits in the bucket (a leaky bucket's count is nginx's excess: less the one request being
    // served).
    let count = |until: u128| {
        let held = u64::try_from((until - now).div_ceil(t)).unwrap_or(u64::MAX);
        if leaky { held.saturating_sub(1) } else { held }
    };
    let per_sec = u128::from(den) * MICROS_PER_SEC;
    let decision = Decision {
        penalized: false,
        count_before: count(from),
        count_after: count(tat_after),
        over,
        remaining,
        reset_after_secs: u64::try_from(wait.div_ceil(per_sec))
            .unwrap_or(u64::MAX)
            .max(1),
        expired: 0,
    };
    let next = if charged {
        shape.word(tat_after)
    } else {
        state
    };
    (decision, next)
}

/// Gives `hits` tokens back (a refund): moves the arrival time back by `hits` emission
/// intervals. Never past rest: an arrival time in the past is a bucket at rest, which answers
/// as a full one whatever the time, so a refund larger than what the bucket holds leaves it at
/// rest and no fuller. A refund of hits just admitted decides every later call exactly as the
/// state before the admission would have.
pub fn refund(state: u128, quota: &Quota, hits: u64) -> u128 {
    match Shape::of(quota) {
        None => state,
        Some(shape) => refund_shaped(state, shape, hits),
    }
}

/// [`refund`] for a bucket of `shape`.
pub(crate) fn refund_shaped(state: u128, shape: Shape, hits: u64) -> u128 {
    let back = u128::from(hits).saturating_mul(shape.t);
    shape.word(shape.ticks(state).saturating_sub(back))
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
            penalty: None,
            safe_capacity: None,
            requests_per_unit: rpu,
            unit,
            algorithm,
            burst: burst.and_then(NonZeroU32::new),
            charge_refused: false,
            unit_multiplier: 1,
            calendar: crate::limiter::Calendar::EPOCH,
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

    /// The emission interval is exact however the rate divides the window: 3 a second is
    /// 333333⅓ µs, and 3 hits are at rest after exactly 1 s, not 1.000002 s (which would
    /// report a reset of 2 s).
    #[test]
    fn the_emission_interval_is_exact() {
        let now = 100 * S;
        let q = quota(Algorithm::TokenBucket, 3, Unit::Second, None);
        let (d, s) = decide(EMPTY, now, &q, 3);
        assert_eq!((d.over, d.remaining, d.reset_after_secs), (false, 0, 1));
        assert_eq!(rest_micros(s), now + S);
        assert!(!is_stale(s, now + S - 1));
        assert!(is_stale(s, now + S));
        assert_eq!(decide(s, now + S, &q, 0).0.remaining, 3);
        // One hit frees a token after 333333⅓ µs: not at 333333, at 333334.
        let (_, s) = decide(EMPTY, now, &q, 1);
        let (_, s) = decide(s, now, &q, 2);
        assert!(decide(s, now + 333_333, &q, 1).0.over);
        assert!(!decide(s, now + 333_334, &q, 1).0.over);
        // 7 a minute, emptied, then one call at each emission interval (T = 8_571_428 4/7 µs)
        // rounded up to the microsecond, for a day: every one fits. (An interval rounded up
        // to 8_571_429 µs would refuse them from the third on.)
        let q = quota(Algorithm::TokenBucket, 7, Unit::Minute, None);
        let mut s = decide(EMPTY, now, &q, 7).1;
        let mut admitted = 0;
        for k in 1..=10_080u64 {
            let (d, next) = decide(s, now + (k * 60 * S).div_ceil(7), &q, 1);
            s = next;
            admitted += u32::from(!d.over);
        }
        assert_eq!(admitted, 10_080);
    }

    /// A state word is a time: its whole microseconds mean the same under any rate, so a
    /// reload that changes the rate reads it within a microsecond; a remote store keeps it as
    /// text that reads back exactly.
    #[test]
    fn a_state_is_a_time_under_any_rate_and_as_text() {
        let now = 100 * S;
        let three = quota(Algorithm::TokenBucket, 3, Unit::Second, None);
        let (_, s) = decide(EMPTY, now, &three, 1);
        assert_eq!(s >> 64, u128::from(now + 333_333));
        assert_eq!(text(&three, s), "100333333.333333333333");
        assert_eq!(parse(&three, &text(&three, s)), Some(s));
        assert_eq!(parse(&three, "100333333"), Some(at_micros(100_333_333)));
        assert_eq!(parse(&three, "1.5x"), None);
        assert_eq!(parse(&three, ""), None);
        // Read under 2 a second instead: the same instant, within a microsecond.
        let two = quota(Algorithm::TokenBucket, 2, Unit::Second, None);
        assert_eq!(rest_micros(s), now + 333_334);
        let d = decide(s, now + 333_334, &two, 0).0;
        assert_eq!(d.count_before, 0);
        // Every numerator of the largest denominator reads back from its 12 places.
        let big = quota(Algorithm::TokenBucket, u32::MAX, Unit::Second, None);
        for fraction in [
            1u128,
            2,
            12_345,
            u128::from(u32::MAX) - 2,
            u128::from(u32::MAX) - 1,
        ] {
            let state = at_micros(now) | fraction;
            assert_eq!(parse(&big, &text(&big, state)), Some(state), "{fraction}");
        }
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
    fn a_refund_never_fills_a_bucket_past_rest() {
        for algorithm in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
            let q = quota(algorithm, 2, Unit::Second, Some(3));
            let capacity = decide(EMPTY, 10 * S, &q, 0).0.remaining;
            let (_, held) = decide(EMPTY, 10 * S, &q, 2);
            // Five back where two were taken: at rest, with the capacity and no more.
            let back = refund(held, &q, 5);
            let peek = decide(back, 10 * S, &q, 0).0;
            assert_eq!(peek.remaining, capacity, "{algorithm:?}");
            assert_eq!(peek.count_after, 0);
            assert!(is_stale(back, 10 * S));
            assert!(decide(back, 10 * S, &q, u64::from(capacity) + 1).0.over);
            assert!(!decide(back, 10 * S, &q, u64::from(capacity)).0.over);
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
                    // At most `burst + span / T`, with `T = 1 s / rate` exactly.
                    prop_assert!(
                        admitted * u128::from(S) <= u128::from(burst) * u128::from(S) + span * u128::from(rate),
                        "{admitted} hits in {span} us"
                    );
                }
            }
        }
    }
}
