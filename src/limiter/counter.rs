//! The algorithm dispatch, in one place: which state word a quota's counter keeps
//! ([`CounterKind`]) and each algorithm's steps on that word. Every word is handed over widened
//! to `u128` (a fixed window's fits in 64 bits, a sliding window's and a bucket's take 128), so
//! one signature serves every algorithm. Stores keep the words (the memory store in atomics,
//! the cluster's write-behind in Redis) and call these instead of matching on [`Algorithm`].
//!
//! A concurrency limit keeps no word: its state is a list of slots ([`concurrency::Slots`]),
//! so [`CounterKind::of`] is `None` for it and stores keep its counters apart.

use super::{
    Algorithm, Decision, Quota, Unit, Window, bucket, concurrency, fixed_window, sliding_window,
};
use crate::clock::Timestamp;

/// Which state word a counter keeps: its algorithm's, and for the windows their length. Stores
/// keep one table per kind: the memory store an array for the plain windows (one unit) and
/// tables made on first use for multiplied ones ([`CounterKind::index`] is `None` for those).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CounterKind {
    Fixed(Window),
    Sliding(Window),
    /// Token and leaky buckets share one kind: both keep a theoretical arrival time.
    Bucket,
}

/// A 64-bit word from its widened form (a value past `u64` saturates; none of the 64-bit
/// algorithms makes one).
fn narrow(state: u128) -> u64 {
    u64::try_from(state).unwrap_or(u64::MAX)
}

/// Applies `hits` at `now` to a counter of `quota`: the decision and the new state word.
pub(crate) fn decide(quota: &Quota, state: u128, now: Timestamp, hits: u64) -> (Decision, u128) {
    let (q, n) = (quota, now);
    match quota.algorithm {
        Algorithm::FixedWindow => {
            let (d, s) = fixed_window::decide(
                narrow(state),
                n.secs(),
                q.window(),
                q.requests_per_unit,
                hits,
            );
            (d, u128::from(s))
        }
        Algorithm::SlidingWindow => {
            let rpu = q.requests_per_unit;
            sliding_window::decide(state, n.micros(), q.window(), rpu, hits, q.charge_refused)
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            bucket::decide(state, n.micros(), q, hits)
        }
        // Never reached: a concurrency counter keeps slots, not a word (CounterKind::of is
        // None). Should a store get that wrong, it refuses rather than admits.
        Algorithm::Concurrency => (concurrency::refusal(q, hits), state),
    }
}

/// Takes `hits` off a counter of `quota` at `now` (a refund): the new state word. One meaning
/// for every algorithm: a window's current count goes down by `hits`, floored at 0 (an earlier
/// window's count is not touched); a bucket's arrival time moves back by `hits` emission
/// intervals, so it holds `hits` more tokens, never more than at rest. Whether a refund should
/// be made at all (a fixed window keeps a refused request's hits, as the Go service does) is
/// the caller's choice, not this function's.
pub(crate) fn refund(quota: &Quota, state: u128, now: Timestamp, hits: u64) -> u128 {
    match quota.algorithm {
        Algorithm::FixedWindow => u128::from(fixed_window::refund(
            narrow(state),
            now.secs(),
            quota.window(),
            hits,
        )),
        Algorithm::SlidingWindow => {
            sliding_window::refund(state, now.micros(), quota.window(), hits)
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => bucket::refund(state, quota, hits),
        Algorithm::Concurrency => state,
    }
}

impl CounterKind {
    /// How many kinds there are: [`CounterKind::index`] is below this.
    pub(crate) const COUNT: usize = 15;

    /// The word kind of `algorithm`'s counters; `None` for a concurrency limit, which keeps
    /// slots rather than a word.
    pub const fn of(algorithm: Algorithm, window: Window) -> Option<Self> {
        Some(match algorithm {
            Algorithm::FixedWindow => CounterKind::Fixed(window),
            Algorithm::SlidingWindow => CounterKind::Sliding(window),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => CounterKind::Bucket,
            Algorithm::Concurrency => return None,
        })
    }

    /// The kind of a quota's counter ([`CounterKind::of`]).
    pub const fn of_quota(quota: &Quota) -> Option<Self> {
        CounterKind::of(quota.algorithm, quota.window())
    }

    /// A dense index in `0..COUNT` for a one-unit epoch window's kind or the buckets'; `None`
    /// for a multiplied or calendar window's.
    pub const fn index(self) -> Option<usize> {
        match self {
            CounterKind::Fixed(w) if w.is_unit() => Some(w.unit.index()),
            CounterKind::Sliding(w) if w.is_unit() => Some(7 + w.unit.index()),
            CounterKind::Fixed(_) | CounterKind::Sliding(_) => None,
            CounterKind::Bucket => Some(14),
        }
    }

    /// The inverse of [`CounterKind::index`].
    pub const fn from_index(i: usize) -> Option<Self> {
        match i {
            0..7 => Some(CounterKind::Fixed(Window::of(Unit::ALL[i]))),
            7..14 => Some(CounterKind::Sliding(Window::of(Unit::ALL[i - 7]))),
            14 => Some(CounterKind::Bucket),
            _ => None,
        }
    }

    /// Whether a word no longer holds anything at `now`, so a store may drop it: a fixed
    /// window of an earlier window, a sliding window two windows old, a bucket at rest.
    pub(crate) fn is_stale(self, state: u128, now: Timestamp) -> bool {
        match self {
            CounterKind::Fixed(u) => fixed_window::is_stale(narrow(state), now.secs(), u),
            CounterKind::Sliding(u) => sliding_window::is_stale(state, now.micros(), u),
            CounterKind::Bucket => bucket::is_stale(state, now.micros()),
        }
    }

    /// Whether a word holds a count at `now`: of the current window (fixed), of the current or
    /// previous one (sliding), or a bucket not at rest. (A counter that only answered peeks
    /// holds nothing.)
    pub fn holds(self, state: u128, now: Timestamp) -> bool {
        match self {
            CounterKind::Fixed(u) => fixed_window::current_count(narrow(state), now.secs(), u) > 0,
            CounterKind::Sliding(u) => sliding_window::counts_at(state, now.micros(), u) != (0, 0),
            CounterKind::Bucket => !bucket::is_stale(state, now.micros()),
        }
    }

    /// The word holding the larger count per window of `a` and `b` (the later arrival time
    /// for a bucket): merging another owner's state this way never counts a hit twice and
    /// never lowers a count.
    pub fn merge_max(self, a: u128, b: u128, now: Timestamp) -> u128 {
        match self {
            CounterKind::Fixed(u) => {
                u128::from(fixed_window::merge_max(narrow(a), narrow(b), now.secs(), u))
            }
            CounterKind::Sliding(u) => sliding_window::merge_max(a, b, now.micros(), u),
            CounterKind::Bucket => a.max(b),
        }
    }

    /// A word from plain values kept elsewhere (Redis) for window index `window`: a fixed
    /// window's count, a sliding window's current and previous counts, a bucket's arrival time
    /// in whole µs ([`bucket::rest_micros`]). `None` when they hold nothing at `now`.
    pub fn from_parts(self, window: u64, values: &[u64], now: Timestamp) -> Option<u128> {
        let first = values.first().copied().unwrap_or(0);
        match self {
            CounterKind::Fixed(u) => (first > 0 && window == u.index(now.secs()))
                .then(|| u128::from(fixed_window::state_with_count(first, now.secs(), u))),
            CounterKind::Sliding(_) => {
                let previous = values.get(1).copied().unwrap_or(0);
                (first > 0 || previous > 0)
                    .then(|| sliding_window::state_from_parts(window, first, previous))
            }
            CounterKind::Bucket => (first > now.micros()).then_some(bucket::at_micros(first)),
        }
    }

    /// The plain values [`CounterKind::from_parts`] reads, and the window index they are
    /// about, for a word at `now`: a fixed window's current count, a sliding window's current
    /// and previous counts, a bucket's arrival time in whole µs (rounded up, so the copy is at
    /// rest no sooner than the bucket; window 0). What one node hands another taking its
    /// counter over (`cluster::join`).
    pub fn parts(self, state: u128, now: Timestamp) -> (u64, Vec<u64>) {
        match self {
            CounterKind::Fixed(u) => (
                u.index(now.secs()),
                vec![fixed_window::current_count(narrow(state), now.secs(), u)],
            ),
            CounterKind::Sliding(u) => {
                let (current, previous) = sliding_window::counts_at(state, now.micros(), u);
                (
                    sliding_window::window_index(now.micros(), u),
                    vec![current, previous],
                )
            }
            CounterKind::Bucket => (0, vec![bucket::rest_micros(state)]),
        }
    }

    /// When a counter's horizon began and when it ends: the span in which another owner's
    /// count still matters to it at `now`. `None` for a bucket with a rate of 0 (it holds
    /// nothing).
    pub fn horizon(self, quota: &Quota, now: Timestamp) -> Option<(Timestamp, Timestamp)> {
        let window = |u: Window, back: u64, ahead: u64| {
            let w = u.index(now.secs());
            (
                Timestamp::from_secs(u.start(w.saturating_sub(back))),
                Timestamp::from_secs(u.start(w + ahead)),
            )
        };
        Some(match self {
            CounterKind::Fixed(u) => window(u, 0, 1),
            CounterKind::Sliding(u) => window(u, 1, 1),
            CounterKind::Bucket => {
                let tolerance = bucket::tolerance_micros(quota)?;
                (
                    Timestamp::from_micros(now.micros().saturating_sub(tolerance)),
                    Timestamp::from_micros(now.micros().saturating_add(tolerance)),
                )
            }
        })
    }
}
