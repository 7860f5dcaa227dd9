//! What a bucket's rule becomes on the wire: a rate split into whole tokens, and the
//! assignment one Envoy receives for its part of it.
//!
//! Envoy 1.39's `rate_limit_quota` filter enforces a `token_bucket` assignment and blanket rules
//! only (it logs and ignores `requests_per_time_unit`), so every algorithm becomes a token
//! bucket: the limit's rate (requests_per_unit over the unit), and a capacity of what the
//! algorithm lets through at once. Envoy refills continuously at `tokens_per_fill /
//! fill_interval`, so the fill interval only sets the precision of the rate: it is the unit made
//! long enough that the limit is at least [`RESOLUTION`] tokens, and stays the same for a bucket
//! whatever its share (Envoy compares only the nanoseconds of two fill intervals).

use crate::config::{Limit, Rule};
use crate::limiter::{Algorithm, Quota};

/// A bucket's rate is split in steps of at most 1/RESOLUTION of its limit.
pub(crate) const RESOLUTION: u64 = 1_000;

/// A limited bucket's capacity, in the units shares are computed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Tokens per fill interval: the whole limit's rate.
    pub tokens: u64,
    /// The fill interval in whole seconds (Envoy reads only the seconds).
    pub fill_secs: u64,
    /// The most the whole limit admits at once (token bucket capacity).
    pub burst: u64,
    /// Tokens per fill interval a node may split among its own Envoys while it reaches no
    /// majority of its peers: the limit's `safe_capacity` at the same scale. `None`: the tokens
    /// over the number of peers ([`Rate::alone`]).
    pub safe_tokens: Option<u64>,
}

impl Rate {
    /// The rate of one quota: `requests_per_unit` per unit, in a fill interval of `m` units with
    /// `m` the smallest that makes the limit [`RESOLUTION`] tokens or more. `None` for a quota
    /// of 0 (a blanket deny).
    pub fn of(quota: &Quota) -> Option<Rate> {
        let rpu = u64::from(quota.requests_per_unit);
        if rpu == 0 {
            return None;
        }
        let m = RESOLUTION.div_ceil(rpu);
        let burst = match quota.algorithm {
            // A window lets its whole limit through at once; so does a concurrency limit,
            // which RLQS (a rate, with no end of a request) can only assign as a rate.
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::Concurrency => rpu,
            Algorithm::TokenBucket => quota.burst.map_or(rpu, |b| u64::from(b.get())),
            // A leaky bucket tolerates `burst` requests beyond the one it admits.
            Algorithm::LeakyBucket => 1 + quota.burst.map_or(0, |b| u64::from(b.get())),
        };
        Some(Rate {
            tokens: rpu * m,
            fill_secs: quota.window().secs() * m,
            burst,
            safe_tokens: quota.safe_capacity.map(|s| u64::from(s.get()) * m),
        })
    }

    /// What a node without a majority of its `peers` may split alone (no split brain, as
    /// `crate::cluster`'s counters do): the safe tokens, or the tokens over the peers.
    pub fn alone(&self, peers: u64) -> u64 {
        self.safe_tokens
            .unwrap_or(self.tokens / peers.max(1))
            .min(self.tokens)
    }

    /// Requests per second, for reports and metrics.
    pub fn per_sec(&self, tokens: u64) -> f64 {
        tokens as f64 / self.fill_secs as f64
    }

    /// Requests per second as tokens per fill interval.
    pub(crate) fn tokens_for(&self, per_sec: f64) -> u64 {
        let t = per_sec * self.fill_secs as f64;
        if t.is_finite() && t > 0.0 {
            t.min(u64::MAX as f64) as u64
        } else {
            0
        }
    }

    /// The assignment for a part of `part` tokens of this rate: a token bucket of that rate and
    /// the same part of the burst (at least one token), or a blanket deny for nothing.
    pub fn assignment(&self, part: u64) -> Assignment {
        let part = part.min(self.tokens);
        if part == 0 {
            return Assignment::DenyAll;
        }
        let burst = u128::from(self.burst) * u128::from(part) / u128::from(self.tokens);
        Assignment::TokenBucket {
            max_tokens: u32::try_from(burst).unwrap_or(u32::MAX).max(1),
            tokens_per_fill: u32::try_from(part).unwrap_or(u32::MAX),
            fill_secs: self.fill_secs,
        }
    }
}

/// What one Envoy is told to do with one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assignment {
    AllowAll,
    DenyAll,
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_secs: u64,
    },
    /// The bucket is removed: Envoy forgets it and reports it again with its next request.
    Abandon,
}

impl Assignment {
    /// Requests per second this assignment admits in the long run (`None`: unbounded).
    pub fn per_sec(&self) -> Option<f64> {
        match *self {
            Assignment::AllowAll => None,
            Assignment::DenyAll | Assignment::Abandon => Some(0.0),
            Assignment::TokenBucket {
                tokens_per_fill,
                fill_secs,
                ..
            } => Some(f64::from(tokens_per_fill) / fill_secs as f64),
        }
    }
}

/// What a matched limit (or no match) asks of a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    /// No rule, `unlimited: true`, or shadow mode: a blanket allow.
    AllowAll,
    /// `requests_per_unit: 0`: a blanket deny.
    DenyAll,
    /// A rate to split among the Envoys reporting the bucket.
    Split(Rate),
}

impl Policy {
    /// The policy of a lookup's result. With several `rate_limits` blocks the one with the
    /// lowest rate is assigned (Envoy enforces one bucket per assignment); `shadow` is the
    /// global SHADOW_MODE.
    pub(crate) fn of(limit: Option<&Limit>, shadow: bool) -> Policy {
        let Some(limit) = limit else {
            return Policy::AllowAll;
        };
        let Rule::Limited(blocks) = &limit.rule else {
            return Policy::AllowAll;
        };
        if shadow || limit.shadow_mode {
            return Policy::AllowAll;
        }
        let lowest = blocks.iter().map(|b| &b.quota).min_by(|a, b| {
            // a.rpu / a.unit < b.rpu / b.unit, without division.
            (u64::from(a.requests_per_unit) * b.window().secs())
                .cmp(&(u64::from(b.requests_per_unit) * a.window().secs()))
        });
        match lowest.and_then(Rate::of) {
            Some(rate) => Policy::Split(rate),
            None => Policy::DenyAll,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::limiter::Unit;

    fn quota(rpu: u32, unit: Unit, algorithm: Algorithm, burst: Option<u32>) -> Quota {
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

    #[test]
    fn a_rate_keeps_the_limit_and_its_precision() {
        let r = Rate::of(&quota(100, Unit::Second, Algorithm::FixedWindow, None)).unwrap();
        assert_eq!((r.tokens, r.fill_secs, r.burst), (1_000, 10, 100));
        assert_eq!(r.per_sec(r.tokens), 100.0);
        let r = Rate::of(&quota(
            5_000,
            Unit::Minute,
            Algorithm::TokenBucket,
            Some(50),
        ))
        .unwrap();
        assert_eq!((r.tokens, r.fill_secs, r.burst), (5_000, 60, 50));
        let r = Rate::of(&quota(1, Unit::Day, Algorithm::LeakyBucket, Some(3))).unwrap();
        assert_eq!((r.tokens, r.fill_secs, r.burst), (1_000, 86_400_000, 4));
        // 3 in flight per 5 s: the rate of starts it admits at most, 3 per 5 s, all at once.
        let mut q = quota(3, Unit::Second, Algorithm::Concurrency, None);
        q.unit_multiplier = 5;
        let r = Rate::of(&q).unwrap();
        assert_eq!((r.tokens, r.fill_secs, r.burst), (1_002, 1_670, 3));
        assert_eq!(
            Rate::of(&quota(0, Unit::Second, Algorithm::FixedWindow, None)),
            None
        );
    }

    #[test]
    fn a_part_becomes_a_token_bucket_of_that_part_of_rate_and_burst() {
        let r = Rate::of(&quota(100, Unit::Second, Algorithm::FixedWindow, None)).unwrap();
        assert_eq!(
            r.assignment(420),
            Assignment::TokenBucket {
                max_tokens: 42,
                tokens_per_fill: 420,
                fill_secs: 10
            }
        );
        assert_eq!(r.assignment(420).per_sec(), Some(42.0));
        // A sliver still admits something; nothing is a blanket deny; never past the whole.
        assert!(matches!(
            r.assignment(1),
            Assignment::TokenBucket { max_tokens: 1, .. }
        ));
        assert_eq!(r.assignment(0), Assignment::DenyAll);
        assert_eq!(r.assignment(5_000).per_sec(), Some(100.0));
    }
}
