//! Rate-limit algorithms as pure functions of `(state, now, hits, limit) -> (decision, new state)`.
//!
//! Nothing here knows about time sources, locks, maps or I/O: a store owns the state words and
//! calls these functions inside its own compare-and-swap loop, passing the time it read from its
//! injected [`Clock`](crate::clock::Clock).
//!
//! [`share`] is max-min fair sharing of a capacity, which the lease server and the quota service
//! split by. The places that decide from a batch granted by a remote authority (the lease client,
//! the lease parent link, Redis allowances) share [`granted`], the batch, what is used of it and
//! the next window's granted ahead, and [`demand`], the attempted demand they refill ahead by.
//!
//! [`Decision`] is what every algorithm concludes; [`counter`] is the one dispatch from a
//! [`Quota`] to its algorithm and state word, which the stores and the cluster call rather than
//! matching on [`Algorithm`] themselves.

pub mod bucket;
pub mod calendar;
pub mod concurrency;
pub(crate) mod counter;
pub(crate) mod demand;
pub mod fixed_window;
pub(crate) mod granted;
pub(crate) mod share;
pub mod sliding_window;

pub use calendar::Calendar;
pub use counter::CounterKind;

use std::num::NonZeroU32;

/// What one algorithm step concluded for a counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// The count after this call's hits were added (saturating at 2^40 - 1 in a fixed window).
    pub count_after: u64,
    /// The count this call found.
    pub count_before: u64,
    /// `count_after > limit` (for the buckets: the hits did not fit).
    pub over: bool,
    /// `limit - count_after` when not over, else 0.
    pub remaining: u32,
    /// Seconds until the window ends (in `1..=unit`), until a bucket frees room, or until a
    /// concurrency limit's oldest slot expires.
    pub reset_after_secs: u64,
    /// Concurrency slots that expired before this call without being given back (each a lost
    /// refund); 0 for the other algorithms.
    pub expired: u32,
    /// Refused by a penalty already in force (`penalty_seconds`, [`Penalty`]): the counter was
    /// neither charged nor read, and `reset_after_secs` is when the penalty ends.
    pub penalized: bool,
}

/// `penalty_seconds` (issue 52, a Sluice extension): once a limit refuses a key, every request
/// of that key is refused for `secs` seconds from the refusal, across its window's reset. A
/// request during the penalty is not counted and does not lengthen it unless `extends`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Penalty {
    pub secs: NonZeroU32,
    pub extends: bool,
}

/// How a limit counts. `FixedWindow` is envoyproxy/ratelimit's and stays byte-for-byte
/// compatible with it; the others are Sluice extensions (YAML `algorithm:`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    #[default]
    FixedWindow,
    SlidingWindow,
    TokenBucket,
    LeakyBucket,
    /// At most `requests_per_unit` in flight; a slot frees itself one window after it was
    /// taken ([`concurrency`]).
    Concurrency,
}

impl Algorithm {
    pub const ALL: [Algorithm; 5] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Concurrency,
    ];

    /// The algorithms that count hits in time: all but [`Algorithm::Concurrency`], whose
    /// slots are given back by refunds.
    pub const RATES: [Algorithm; 4] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ];

    /// The YAML spelling.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Concurrency => "concurrency",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether `burst` means something for this algorithm.
    pub const fn takes_burst(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::LeakyBucket)
    }
}

/// One rate a counter enforces: `requests_per_unit` per `unit`, counted by `algorithm`.
///
/// `burst` is the bucket capacity for a token bucket (default: `requests_per_unit`) and the
/// number of extra requests tolerated for a leaky bucket, as nginx's `limit_req burst=`
/// (default 0). The config refuses a burst on the window algorithms.
///
/// `charge_refused` (YAML `charge_refused: true`) charges the hits of a refused call too, so a
/// counter can run past its limit into debt that later calls wait out: what a cost reported
/// after the response needs (a report is never refused back to anybody, it must count). A
/// fixed window always charges, as the Go service does; for the others it is off by default,
/// so a client sending twice the rate still gets the rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// `unit_multiplier`: the window is this many units (1 for the Go service's limits).
    pub unit_multiplier: u32,
    /// `time_zone` and `week_start` (or USE_CALENDAR_MONTH_RATE_LIMIT): windows on a calendar.
    pub calendar: Calendar,
    pub algorithm: Algorithm,
    pub burst: Option<NonZeroU32>,
    pub charge_refused: bool,
    /// `safe_capacity`: what one peer may admit per window while it cannot reach a majority of
    /// the cluster (docs/cluster.md), and what a child cluster hands out while its lease
    /// parent is unreachable; `None`: the limit over the number of peers (or of clusters).
    /// Sent with lease asks but never part of a lease's quota.
    pub safe_capacity: Option<NonZeroU32>,
    /// `penalty_seconds` and `penalty_extends`.
    pub penalty: Option<Penalty>,
}

impl Quota {
    /// A fixed-window quota, as envoyproxy/ratelimit has.
    pub const fn fixed(requests_per_unit: u32, unit: Unit) -> Self {
        Quota {
            requests_per_unit,
            unit,
            unit_multiplier: 1,
            calendar: Calendar::EPOCH,
            algorithm: Algorithm::FixedWindow,
            burst: None,
            charge_refused: false,
            safe_capacity: None,
            penalty: None,
        }
    }

    /// This quota counted by `algorithm`.
    pub const fn with_algorithm(self, algorithm: Algorithm) -> Self {
        Quota { algorithm, ..self }
    }

    /// The window this quota counts in: `unit_multiplier` units.
    pub const fn window(&self) -> Window {
        Window::new(self.unit, self.unit_multiplier).on(self.calendar)
    }

    /// Whether a refused call's hits are counted: always for a fixed window (Go's counting),
    /// with `charge_refused` for the others (a concurrency limit's default: refused starts kept
    /// as a debt their refunds pay off, [`concurrency`]).
    pub const fn charges_refused(&self) -> bool {
        self.charge_refused || matches!(self.algorithm, Algorithm::FixedWindow)
    }

    /// Whether a refund (`is_negative_hits`) is always taken off, whatever SLUICE_NEGATIVE_HITS
    /// says: a concurrency limit's, which either keeps refused starts as a debt or was told
    /// (`charge_refused: false`) that its proxy refunds admitted requests only.
    pub const fn takes_every_refund(&self) -> bool {
        matches!(self.algorithm, Algorithm::Concurrency)
    }
}

/// The length of a limit's windows (a bucket's refill period): `multiplier` units, so
/// `100 per 5 minutes` is 100 per `Window { unit: Minute, multiplier: 5, .. }`. Windows are
/// epoch-aligned, as the Go service's are, unless `calendar` puts them on a zone's calendar
/// ([`calendar`]: local days, weeks, months, years). A multiplier of 0 reads as 1.
///
/// Every store finds windows through [`Window::index`], [`Window::start`] and [`Window::end`],
/// never by dividing by [`Window::secs`], so calendar windows of uneven length work everywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window {
    pub unit: Unit,
    pub multiplier: u32,
    pub calendar: Calendar,
}

impl Window {
    /// The most seconds a window may last (about 136 years): the config refuses a longer one.
    pub const MAX_SECS: u64 = u32::MAX as u64;

    pub const fn new(unit: Unit, multiplier: u32) -> Self {
        Window {
            unit,
            multiplier: if multiplier == 0 { 1 } else { multiplier },
            calendar: Calendar::EPOCH,
        }
    }

    /// One `unit`: the Go service's window.
    pub const fn of(unit: Unit) -> Self {
        Window::new(unit, 1)
    }

    /// These windows on `calendar`'s days, weeks, months or years.
    pub const fn on(self, calendar: Calendar) -> Self {
        Window { calendar, ..self }
    }

    /// Nominal length in seconds: exact for epoch windows; for calendar ones, the length of
    /// the units the Go service assumes (a month of 30 days), used only for rates.
    pub const fn secs(self) -> u64 {
        self.unit.secs() * self.multiplier as u64
    }

    /// The longest one of these windows can be: [`Window::secs`], or for a calendar window its
    /// longest month or year, plus an hour a daylight-saving change can add.
    pub const fn max_secs(self) -> u64 {
        if self.calendar.is_epoch() {
            return self.secs();
        }
        let longest = match self.unit {
            Unit::Month => 31 * 86_400,
            Unit::Year => 366 * 86_400,
            unit => unit.secs(),
        };
        (longest + 3_600) * self.multiplier as u64
    }

    /// Whether this is one unit, as every envoyproxy/ratelimit limit is.
    pub const fn is_plain(self) -> bool {
        self.multiplier == 1
    }

    /// Whether this is one epoch-aligned unit: one of the seven windows stores keep a table
    /// each for ([`CounterKind::index`]); the others get a table per window.
    pub const fn is_unit(self) -> bool {
        self.is_plain() && self.calendar.is_epoch()
    }

    /// The number of the window containing `now_secs`: consecutive windows have consecutive
    /// numbers.
    #[inline]
    pub fn index(self, now_secs: u64) -> u64 {
        if self.calendar.is_epoch() {
            now_secs / self.secs()
        } else {
            self.calendar.index(self.unit, now_secs) / u64::from(self.multiplier)
        }
    }

    /// The start of window `index`, in seconds since the epoch.
    #[inline]
    pub fn start(self, index: u64) -> u64 {
        if self.calendar.is_epoch() {
            index.saturating_mul(self.secs())
        } else {
            let first = index.saturating_mul(u64::from(self.multiplier));
            self.calendar.start(self.unit, first)
        }
    }

    /// The end of window `index` (the next one's start), in seconds since the epoch.
    #[inline]
    pub fn end(self, index: u64) -> u64 {
        self.start(index.saturating_add(1))
    }

    /// The window containing `now_secs` and its end: [`Window::index`] and [`Window::end`] in
    /// one, with one division for an epoch window (a decision's hot path).
    #[inline]
    pub(crate) fn index_and_end(self, now_secs: u64) -> (u64, u64) {
        if self.calendar.is_epoch() {
            let secs = self.secs();
            let index = now_secs / secs;
            (index, index.saturating_add(1).saturating_mul(secs))
        } else {
            let index = self.index(now_secs);
            (index, self.end(index))
        }
    }

    /// [`Window::index`] of a time in µs since the epoch.
    pub(crate) fn index_us(self, now_us: u64) -> u64 {
        self.index(now_us / 1_000_000)
    }

    /// [`Window::start`] in µs since the epoch.
    pub(crate) fn start_us(self, index: u64) -> u64 {
        self.start(index).saturating_mul(1_000_000)
    }

    /// [`Window::end`] in µs since the epoch.
    pub(crate) fn end_us(self, index: u64) -> u64 {
        self.end(index).saturating_mul(1_000_000)
    }

    /// Seconds from `now_secs` to the end of the window containing it (at least 1).
    pub(crate) fn reset_after(self, now_secs: u64) -> u64 {
        self.end(self.index(now_secs))
            .saturating_sub(now_secs)
            .max(1)
    }
}

impl From<Unit> for Window {
    fn from(unit: Unit) -> Self {
        Window::of(unit)
    }
}

/// The time unit of a limit, as envoyproxy/ratelimit understands it.
///
/// MONTH is 30 days and YEAR 365 days, exactly as in the Go service, so windows line up with
/// counters written by Go instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// Every unit, in index order (see [`Unit::index`]).
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Length of one window in seconds.
    pub const fn secs(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// A dense index in `0..7`, for per-unit tables.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The upper-case protobuf enum name (`SECOND`, `MINUTE`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// Parses a YAML unit the way the Go service does: case-insensitive enum name; `UNKNOWN`
    /// and anything else is `None`.
    pub(crate) fn from_name(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(name))
    }

    /// The `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit` number.
    pub const fn proto_number(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The inverse of [`Unit::proto_number`]; 0 (UNKNOWN) and unknown numbers are `None`.
    pub const fn from_proto_number(n: i32) -> Option<Unit> {
        Some(match n {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_case_insensitively() {
        for u in Unit::ALL {
            assert_eq!(Unit::from_name(u.name()), Some(u));
            assert_eq!(Unit::from_name(&u.name().to_lowercase()), Some(u));
            assert_eq!(Unit::from_proto_number(u.proto_number()), Some(u));
            assert_eq!(Unit::ALL[u.index()], u);
        }
        assert_eq!(Unit::from_name("unknown"), None);
        assert_eq!(Unit::from_name(""), None);
        assert_eq!(Unit::from_proto_number(0), None);
    }

    #[test]
    fn month_and_year_are_fixed_lengths_as_in_go() {
        assert_eq!(Unit::Month.secs(), 30 * 86_400);
        assert_eq!(Unit::Year.secs(), 365 * 86_400);
    }
}
