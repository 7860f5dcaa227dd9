//! The store contract: what every [`CounterStore`] answers, written once against the trait and
//! run on each backend by [`store_contract!`]: the memory store and an in-process three-node
//! peer cluster (`tests/stores.rs`), a real Redis (`integration/redis.rs`) and real memcached
//! (`integration/memcached.rs`).
//!
//! Every call a case makes is also made on an oracle, and the two answers must be equal, every
//! field of every [`Decision`]: the reference model in `reference_model.rs`, which computes each
//! algorithm from its definition in `docs/algorithms.md` (an exact log of hits for the windows,
//! the GCRA's arithmetic for the buckets), not from `src/limiter/`. So the memory store, which
//! runs the limiter's own functions, is checked against something other than itself, and every
//! other backend against the same. (Comparing a backend with a fresh memory store, as the suite
//! once did as well, would add nothing: every backend, the memory store included, must equal
//! the model.) The model follows the documentation alone, with no switch to follow the
//! limiter where the two differ. Each case then states the few numbers a reader would check by
//! hand.
//!
//! What the contract does not promise: whether one key stem under two different quotas (another
//! unit or algorithm) is one counter or two. The service never does that within one config, and
//! the backends differ (the memory store keeps a table per algorithm and unit, Redis keys fixed
//! windows by window start); the oracle refuses a case that tries.

mod reference_model;

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use reference_model::ReferenceModel;
use sluice::clock::Timestamp;
use sluice::limiter::{Algorithm, Decision, Quota, Unit};
use sluice::store::{CounterStore, Hit};

/// Generates one `#[tokio::test]` per contract case in a module `$name`, each on a fresh store
/// from `$make`: an `async fn() -> Option<impl CounterStore>` (`None`: the backend is missing
/// here and the test skips, as the Redis tests do outside CI).
#[macro_export]
macro_rules! store_contract {
    ($name:ident, $make:path) => {
        mod $name {
            use super::*;
            $crate::store_contract!(@deterministic $make);
            $crate::store_contract!(@threaded $make; random_sequences_answer_as_the_model);
        }
    };
    // Every case but the random sequences, for a store whose state a random sequence may
    // outlast (tests/stores.rs's joining cluster).
    (@deterministic $make:path) => {
        $crate::store_contract!(@cases $make;
            every_algorithm_admits_up_to_its_limit_then_refuses,
            a_peek_of_zero_hits_counts_nothing,
            several_hits_in_one_call_count_together,
            charged_refusals_are_debt_that_later_calls_wait_out,
            a_reset_forgets_a_counter_and_only_that_one,
            windows_of_several_units_last_that_long,
            a_batch_answers_in_order_and_charges_a_repeated_key_twice,
            a_peek_in_a_batch_sees_the_hits_before_it,
            keys_are_independent,
            windows_roll_over_as_now_moves,
            reset_after_counts_down_to_the_end_of_the_window,
            refunds_take_hits_off_floored_at_zero,
            requests_in_flight_are_counted_by_refunds,
            a_limit_of_zero_refuses_every_hit_but_not_a_peek,
            concurrent_callers_get_exactly_the_limit,
            an_irregular_sequence_answers_as_the_model,
        );
    };
    (@cases $make:path; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let Some(store) = $make().await else { return };
                $crate::store_contract::$case(&store).await;
            }
        )+
    };
    // proptest's runner is synchronous: it blocks one worker per sequence while another drives
    // the store's own tasks (connections, peer servers).
    (@threaded $make:path; $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let Some(store) = $make().await else { return };
            $crate::store_contract::$case(&store).await;
        }
    };
}

/// Which store a test's call at `now` goes to: the one store, one of a cluster's nodes in turn,
/// a store swept first. [`Routed`] makes any route a [`CounterStore`], so the wrappers the
/// contract runs on delegate in one place.
pub trait Route: Send + Sync {
    type Store: CounterStore;
    fn route(&self, now: Timestamp) -> &Self::Store;
}

/// A [`Route`] as a store: each call goes to the store its route picks at the call's time.
pub struct Routed<R>(pub R);

impl<R: Route + 'static> CounterStore for Routed<R> {
    fn apply<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> impl std::future::Future<Output = Result<(), sluice::store::StoreError>> + Send + 'a {
        self.0.route(now).apply(now, hits, out)
    }

    fn refund<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> impl std::future::Future<Output = Result<(), sluice::store::StoreError>> + Send + 'a {
        self.0.route(now).refund(now, hits, out)
    }

    fn counts_refused(&self, quota: &Quota) -> bool {
        self.0.route(Timestamp::from_secs(0)).counts_refused(quota)
    }

    fn reset<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
    ) -> impl std::future::Future<Output = Result<(), sluice::store::StoreError>> + Send + 'a {
        self.0.route(now).reset(now, hits)
    }
}

/// A store on a server a test started, kept alive as long as the store: what a remote backend's
/// `$make` returns for [`store_contract!`], as `Routed(UnderTest { .. })`.
pub struct UnderTest<S> {
    pub store: S,
    pub server: Box<dyn std::any::Any + Send + Sync>,
}

impl<S: CounterStore> Route for UnderTest<S> {
    type Store = S;
    fn route(&self, _: Timestamp) -> &S {
        &self.store
    }
}

/// 2023-11-14T22:13:20Z: 20 s into its minute, 800 s into its hour.
pub const T0: u64 = 1_700_000_000;

pub fn at(secs: u64) -> Timestamp {
    Timestamp::from_secs(secs)
}

pub fn quota(algorithm: Algorithm, rpu: u32, unit: Unit, burst: u32) -> Quota {
    Quota {
        penalty: None,
        safe_capacity: None,
        requests_per_unit: rpu,
        unit,
        algorithm,
        burst: NonZeroU32::new(burst),
        charge_refused: false,
        unit_multiplier: 1,
        calendar: sluice::limiter::Calendar::EPOCH,
    }
}

/// `limit` per `unit` for `algorithm`; the leaky bucket gets a burst of `limit - 1`, so that it
/// too admits `limit` hits at once (nginx lets `burst + 1` through after idling).
pub fn limit(algorithm: Algorithm, limit: u32, unit: Unit) -> Quota {
    let burst = match algorithm {
        Algorithm::LeakyBucket => limit.saturating_sub(1),
        _ => 0,
    };
    quota(algorithm, limit, unit, burst)
}

pub fn hit(key: &str, quota: Quota, hits: u64) -> Hit<'_> {
    Hit { key, quota, hits }
}

fn admitted(d: &[Decision]) -> Vec<bool> {
    d.iter().map(|d| !d.over).collect()
}

fn remaining(d: &[Decision]) -> Vec<u32> {
    d.iter().map(|d| d.remaining).collect()
}

/// The store under test, with its oracle: every call is made on both, and every decision must
/// be equal, field by field.
pub struct Checked<'s, S> {
    store: &'s S,
    model: ReferenceModel,
}

impl<'s, S: CounterStore> Checked<'s, S> {
    pub fn new(store: &'s S) -> Self {
        Checked {
            store,
            model: ReferenceModel::default(),
        }
    }

    /// One call: the store's decisions, after checking them against the model.
    pub async fn apply(&mut self, now: Timestamp, hits: &[Hit<'_>]) -> Vec<Decision> {
        self.try_apply(now, hits)
            .await
            .unwrap_or_else(|disagreement| panic!("{disagreement}"))
    }

    /// [`Checked::apply`], with a disagreement as an error rather than a panic (for the random
    /// sequences, which shrink a failure).
    pub async fn try_apply(
        &mut self,
        now: Timestamp,
        hits: &[Hit<'_>],
    ) -> Result<Vec<Decision>, String> {
        let mut got = Vec::new();
        self.store
            .apply(now, hits, &mut got)
            .await
            .expect("the store answers");
        let model = self.model.apply(now, hits);
        agree(now, hits, got, &model)
    }

    pub async fn reset(&mut self, now: Timestamp, hits: &[Hit<'_>]) {
        self.store.reset(now, hits).await.expect("the store resets");
        self.model.reset(hits);
    }

    /// A refund: what the store answers (a peek after it, per hit), after checking it against
    /// the model.
    pub async fn refund(&mut self, now: Timestamp, hits: &[Hit<'_>]) -> Vec<Decision> {
        self.try_refund(now, hits)
            .await
            .unwrap_or_else(|disagreement| panic!("{disagreement}"))
    }

    pub async fn try_refund(
        &mut self,
        now: Timestamp,
        hits: &[Hit<'_>],
    ) -> Result<Vec<Decision>, String> {
        let mut got = Vec::new();
        self.store
            .refund(now, hits, &mut got)
            .await
            .expect("the store refunds");
        let model = self.model.refund(now, hits);
        agree(now, hits, got, &model)
    }
}

/// The store's decisions when they are the model's, else a report of where they differ.
fn agree(
    now: Timestamp,
    hits: &[Hit<'_>],
    got: Vec<Decision>,
    model: &[Decision],
) -> Result<Vec<Decision>, String> {
    if got == model {
        return Ok(got);
    }
    let mut report = format!("at {now:?}, the store and the model disagree:");
    for ((hit, got), model) in hits.iter().zip(&got).zip(model) {
        let mark = if got == model { "  " } else { "!=" };
        report.push_str(&format!(
            "\n{mark} {hit:?}\n   store {got:?}\n   model {model:?}"
        ));
    }
    if got.len() != model.len() {
        report.push_str(&format!(
            "\n{} decisions for {} hits",
            got.len(),
            hits.len()
        ));
    }
    Err(report)
}

/// The key a case uses for `algorithm`, distinct per case so stores may be shared.
fn key(case: &str, algorithm: Algorithm) -> String {
    format!("{case}_{}_", algorithm.name())
}

pub async fn every_algorithm_admits_up_to_its_limit_then_refuses<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in Algorithm::RATES {
        let (k, q) = (key("upto", algorithm), limit(algorithm, 3, Unit::Minute));
        let mut d = Vec::new();
        for _ in 0..5 {
            d.extend(c.apply(at(T0), &[hit(&k, q, 1)]).await);
        }
        assert_eq!(
            admitted(&d),
            [true, true, true, false, false],
            "{algorithm:?}"
        );
        assert_eq!(remaining(&d), [2, 1, 0, 0, 0], "{algorithm:?}");
        if algorithm == Algorithm::FixedWindow {
            // envoyproxy/ratelimit counts refused hits too, and resets at the minute's end.
            let counts: Vec<u64> = d.iter().map(|d| d.count_after).collect();
            assert_eq!(counts, [1, 2, 3, 4, 5]);
            assert!(d.iter().all(|d| d.reset_after_secs == 40));
        }
    }
}

pub async fn a_peek_of_zero_hits_counts_nothing<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in Algorithm::RATES {
        let q = limit(algorithm, 3, Unit::Minute);
        let (peeked, plain) = (key("peeked", algorithm), key("plain", algorithm));
        let mut with_peeks = Vec::new();
        for hits in [0, 2, 0, 0, 1, 1] {
            let d = c.apply(at(T0), &[hit(&peeked, q, hits)]).await;
            if hits > 0 {
                with_peeks.extend(d);
            }
        }
        let mut without = Vec::new();
        for hits in [2, 1, 1] {
            without.extend(c.apply(at(T0), &[hit(&plain, q, hits)]).await);
        }
        assert_eq!(
            with_peeks, without,
            "{algorithm:?}: peeks changed what followed"
        );
        assert_eq!(admitted(&without), [true, true, false], "{algorithm:?}");
    }
}

pub async fn several_hits_in_one_call_count_together<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in Algorithm::RATES {
        let (k, q) = (key("several", algorithm), limit(algorithm, 5, Unit::Minute));
        let mut d = Vec::new();
        for hits in [2, 4, 3, 1] {
            d.extend(c.apply(at(T0), &[hit(&k, q, hits)]).await);
        }
        assert_eq!(remaining(&d[..1]), [3], "{algorithm:?}");
        if algorithm == Algorithm::FixedWindow {
            // Refused hits count in a fixed window, so 3 more do not fit after 6.
            assert_eq!(admitted(&d), [true, false, false, false]);
            assert_eq!(d[3].count_after, 10);
        } else {
            // Elsewhere a refused call takes nothing: the 3 fit after the 2.
            assert_eq!(admitted(&d), [true, false, true, false], "{algorithm:?}");
            assert_eq!(d[2].remaining, 0, "{algorithm:?}");
        }
    }
}

/// Costs reported after the response (`charge_refused`): three reports of 40 against 100 per
/// minute are all charged, the third past the limit, so a peek right after is refused where
/// the default (the third dropped) leaves room; and the debt is gone once waited out.
pub async fn charged_refusals_are_debt_that_later_calls_wait_out<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in Algorithm::RATES {
        let base = limit(algorithm, 100, Unit::Minute);
        for charge_refused in [true, false] {
            if algorithm == Algorithm::FixedWindow && !charge_refused {
                continue;
            }
            let q = Quota {
                charge_refused,
                ..base
            };
            let k = format!("{}{charge_refused}", key("debt", algorithm));
            let mut d = Vec::new();
            for _ in 0..3 {
                d.extend(c.apply(at(T0), &[hit(&k, q, 40)]).await);
            }
            assert_eq!(admitted(&d), [true, true, false], "{algorithm:?}");
            let peek = c.apply(at(T0 + 1), &[hit(&k, q, 0)]).await;
            assert_eq!(
                peek[0].over,
                q.charges_refused(),
                "{algorithm:?}, charge_refused: {charge_refused}"
            );
            if q.charges_refused() && !algorithm.takes_burst() {
                // A window holds the whole 120 (a bucket has leaked a little by now).
                assert_eq!(peek[0].count_after, 120, "{algorithm:?}");
            }
            // Two minutes on, every algorithm has its whole limit again.
            let later = c.apply(at(T0 + 120), &[hit(&k, q, 0)]).await;
            assert!(!later[0].over, "{algorithm:?}");
            assert_eq!(later[0].remaining, 100, "{algorithm:?}");
        }
    }
}

/// The counter admin's reset: a counter filled to its limit (or past it, for a fixed window)
/// is whole again after a reset, in every algorithm; a key beside it keeps its count.
pub async fn a_reset_forgets_a_counter_and_only_that_one<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in Algorithm::RATES {
        let q = limit(algorithm, 3, Unit::Minute);
        let (k, other) = (key("reset", algorithm), key("kept", algorithm));
        for _ in 0..4 {
            c.apply(at(T0), &[hit(&k, q, 1), hit(&other, q, 1)]).await;
        }
        let d = c.apply(at(T0), &[hit(&k, q, 0)]).await;
        assert_eq!(d[0].remaining, 0, "{algorithm:?}");
        c.reset(at(T0 + 1), &[hit(&k, q, 0)]).await;
        let d = c
            .apply(at(T0 + 1), &[hit(&k, q, 1), hit(&other, q, 1)])
            .await;
        assert_eq!((d[0].over, d[0].remaining), (false, 2), "{algorithm:?}");
        assert!(d[1].over, "{algorithm:?}: the other key keeps its count");
        // Resetting a key that holds nothing is no error.
        c.reset(at(T0 + 1), &[hit("never_charged_", q, 0)]).await;
    }
}

/// `unit_multiplier`: 3 per 5 minutes in every algorithm. T0 is 20 s into its minute and 200 s
/// into its 5-minute window (epoch-aligned, as one-unit windows are). A minute later, when a
/// one-minute window would have started over, the limit still holds; the next 5-minute window
/// (100 s after T0) starts a fixed window over, a bucket has refilled one hit per 100 s, and a
/// sliding window lets one more through once a third of the next window has passed.
pub async fn windows_of_several_units_last_that_long<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in Algorithm::RATES {
        let q = Quota {
            unit_multiplier: 5,
            ..limit(algorithm, 3, Unit::Minute)
        };
        let k = key("five_minutes", algorithm);
        let mut d = Vec::new();
        for now in [T0, T0, T0, T0, T0 + 60] {
            d.extend(c.apply(at(now), &[hit(&k, q, 1)]).await);
        }
        assert_eq!(
            admitted(&d),
            [true, true, true, false, false],
            "{algorithm:?}"
        );
        if !algorithm.takes_burst() {
            assert_eq!(
                d[0].reset_after_secs, 100,
                "{algorithm:?}: the 5-minute window ends"
            );
            assert_eq!(d[4].reset_after_secs, 40, "{algorithm:?}");
        }
        let later = match algorithm {
            Algorithm::SlidingWindow => T0 + 200,
            _ => T0 + 100,
        };
        if algorithm == Algorithm::SlidingWindow {
            let early = c.apply(at(T0 + 190), &[hit(&k, q, 0)]).await;
            assert_eq!(
                early[0].remaining, 0,
                "3 x 0.7 of the last window is still there"
            );
        }
        let next = c.apply(at(later), &[hit(&k, q, 1)]).await;
        assert!(!next[0].over, "{algorithm:?}");
        // The same descriptor under a one-minute limit is another counter.
        let plain = limit(algorithm, 3, Unit::Minute);
        let other = format!("{k}plain_");
        let d = c.apply(at(T0), &[hit(&other, plain, 3)]).await;
        assert!(!d[0].over, "{algorithm:?}");
    }
}

pub async fn a_batch_answers_in_order_and_charges_a_repeated_key_twice<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    let [fixed, sliding, token, leaky] =
        Algorithm::RATES.map(|a| (key("batch", a), limit(a, 5, Unit::Hour)));
    let d = c
        .apply(
            at(T0),
            &[
                hit(&fixed.0, fixed.1, 1),
                hit(&sliding.0, sliding.1, 2),
                hit(&fixed.0, fixed.1, 1),
                hit(&token.0, token.1, 0),
                hit(&sliding.0, sliding.1, 4),
                hit(&leaky.0, leaky.1, 5),
                hit(&fixed.0, fixed.1, 5),
                hit(&token.0, token.1, 5),
                hit(&leaky.0, leaky.1, 1),
            ],
        )
        .await;
    assert_eq!(d.len(), 9, "one decision per hit");
    assert_eq!(remaining(&d[..4]), [4, 3, 3, 5]);
    assert_eq!(
        admitted(&d),
        [true, true, true, true, false, true, false, true, false]
    );
    assert_eq!((d[6].count_before, d[6].count_after), (2, 7));
    // The next batch sees what the first one charged.
    let d = c
        .apply(
            at(T0 + 1),
            &[hit(&sliding.0, sliding.1, 3), hit(&fixed.0, fixed.1, 0)],
        )
        .await;
    assert_eq!(admitted(&d), [true, false]);
}

/// A peek (0 hits) after hits of the same key in one call answers the count those hits left,
/// on a window or bucket that did not exist before the call: `[2, 0, 1, 0]` against 5 per
/// minute leaves 3, 3, 2 and 2 remaining (memcached once answered the peeks 0: their `incr 0`
/// ran before the first hit's `add`).
pub async fn a_peek_in_a_batch_sees_the_hits_before_it<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in Algorithm::RATES {
        let (k, q) = (
            key("batch_peek", algorithm),
            limit(algorithm, 5, Unit::Minute),
        );
        let batch: Vec<Hit<'_>> = [2, 0, 1, 0].map(|hits| hit(&k, q, hits)).to_vec();
        let d = c.apply(at(T0), &batch).await;
        assert_eq!(remaining(&d), [3, 3, 2, 2], "{algorithm:?}");
        if !algorithm.takes_burst() {
            let counts: Vec<u64> = d.iter().map(|d| d.count_after).collect();
            assert_eq!(counts, [2, 2, 3, 3], "{algorithm:?}");
        }
    }
}

pub async fn keys_are_independent<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in Algorithm::RATES {
        let q = limit(algorithm, 2, Unit::Minute);
        let (full, other) = (key("full", algorithm), key("other", algorithm));
        let d = c.apply(at(T0), &[hit(&full, q, 3)]).await;
        assert!(d[0].over, "{algorithm:?}");
        let d = c.apply(at(T0), &[hit(&other, q, 1)]).await;
        assert_eq!((d[0].over, d[0].remaining), (false, 1), "{algorithm:?}");
        // A prefix of a key is another key.
        let prefix = &other[..other.len() - 1];
        let d = c.apply(at(T0), &[hit(prefix, q, 2)]).await;
        assert_eq!((d[0].over, d[0].remaining), (false, 0), "{algorithm:?}");
    }
}

pub async fn windows_roll_over_as_now_moves<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    // T0 is 20 s into its minute: the next minute starts at T0 + 40.
    let next_minute = T0 + 40;
    for algorithm in Algorithm::RATES {
        let (k, q) = (key("roll", algorithm), limit(algorithm, 2, Unit::Minute));
        let h = [hit(&k, q, 1)];
        let mut d = Vec::new();
        // Two admitted and one refused at T0; then again along the next two minutes, to the
        // microsecond before and after the boundary.
        for now in [
            at(T0),
            at(T0),
            at(T0),
            Timestamp::from_micros(next_minute * 1_000_000 - 1),
            at(next_minute),
            at(next_minute + 30),
            at(next_minute + 59),
            at(next_minute + 120),
        ] {
            d.extend(c.apply(now, &h).await);
        }
        assert_eq!(admitted(&d[..3]), [true, true, false], "{algorithm:?}");
        match algorithm {
            // A new window starts from nothing, at the microsecond.
            Algorithm::FixedWindow => {
                assert_eq!(admitted(&d[3..]), [false, true, true, false, true]);
                assert_eq!((d[4].remaining, d[4].reset_after_secs), (1, 60));
                assert_eq!(d[5].reset_after_secs, 30);
            }
            // The previous window weighs by what the sliding window still covers of it.
            Algorithm::SlidingWindow => {
                assert_eq!(admitted(&d[3..]), [false, false, true, false, true]);
            }
            // A bucket refills by the hit, one every 30 s: 40 s on, one passes.
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                assert!(!d[3].over, "{algorithm:?}");
            }
            Algorithm::Concurrency => unreachable!("not a rate: see slots_contract"),
        }
        // Two minutes after the last hits, every algorithm is back to a full limit.
        assert_eq!(d[7].remaining, 1, "{algorithm:?}");
    }
}

pub async fn reset_after_counts_down_to_the_end_of_the_window<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        for unit in Unit::ALL {
            let k = format!("reset_{}_{}_", algorithm.name(), unit.name());
            let q = limit(algorithm, 10, unit);
            let now = Timestamp::from_micros(T0 * 1_000_000 + 250_000);
            let d = c.apply(now, &[hit(&k, q, 1)]).await;
            assert_eq!(
                d[0].reset_after_secs,
                unit.secs() - T0 % unit.secs(),
                "{algorithm:?} {unit:?}"
            );
        }
    }
    // A bucket's is the time until it is at rest again (12 s a token at 5 a minute), or
    // until the same call would pass.
    let q = limit(Algorithm::TokenBucket, 5, Unit::Minute);
    let d = c.apply(at(T0), &[hit("reset_bucket_", q, 2)]).await;
    assert_eq!((d[0].over, d[0].reset_after_secs), (false, 24));
    let d = c.apply(at(T0), &[hit("reset_bucket_", q, 4)]).await;
    assert_eq!((d[0].over, d[0].reset_after_secs), (true, 12));
}

/// A refund takes hits off every algorithm's counter, floored at 0 (a bucket: tokens back, up
/// to a full bucket), and answers what a call of 0 hits would then answer. A fixed window
/// counted the refused hit (Go's counting), so a refund of one only takes that back; the
/// others never counted it.
pub async fn refunds_take_hits_off_floored_at_zero<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in Algorithm::RATES {
        let fixed = algorithm == Algorithm::FixedWindow;
        let (k, q) = (key("refund", algorithm), limit(algorithm, 2, Unit::Minute));
        let h = [hit(&k, q, 1)];
        c.apply(at(T0), &[hit(&k, q, 2)]).await;
        assert!(c.apply(at(T0), &h).await[0].over, "{algorithm:?}");
        // 3 - 1 = 2 counted in the fixed window (at the limit, 0 left), 2 - 1 = 1 elsewhere.
        let back = c.refund(at(T0), &h).await;
        assert!(!back[0].over, "{algorithm:?}");
        assert_eq!(
            back[0].remaining,
            if fixed { 0 } else { 1 },
            "{algorithm:?}"
        );
        let d = c.apply(at(T0), &h).await;
        assert_eq!(d[0].over, fixed, "{algorithm:?}");
        // Giving back more than was taken, or on a counter never charged, adds no credit: the
        // counters are at 0, so two single hits pass and a third does not.
        let fresh = key("refund_fresh", algorithm);
        let back = c
            .refund(at(T0), &[hit(&k, q, 10), hit(&fresh, q, 10)])
            .await;
        assert_eq!(remaining(&back), [2, 2], "{algorithm:?}");
        for key in [&k, &fresh] {
            let one = [hit(key, q, 1)];
            let d = [c.apply(at(T0), &one).await, c.apply(at(T0), &one).await].concat();
            assert_eq!(admitted(&d), [true, true], "{algorithm:?}");
            assert!(c.apply(at(T0), &one).await[0].over, "{algorithm:?}");
        }
    }
}

/// A refund at the limit of 3 per hour, as a proxy counting requests in flight sends one at
/// each request's end: 3 pass, the 4th is over (and counted, in a fixed window), its refund
/// and one more give 2 back, and 2 more pass. A refund of 5 on a count of 2 leaves 0: then 3
/// more pass and the 4th is over.
pub async fn requests_in_flight_are_counted_by_refunds<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in Algorithm::RATES {
        let (k, q) = (key("in_flight", algorithm), limit(algorithm, 3, Unit::Hour));
        let one = [hit(&k, q, 1)];
        let mut d = Vec::new();
        for _ in 0..4 {
            d.extend(c.apply(at(T0), &one).await);
        }
        assert_eq!(admitted(&d), [true, true, true, false], "{algorithm:?}");
        // The refused request's refund, where it was counted (else it is not sent: the service
        // decides which refunds to make), then an admitted one's.
        if algorithm == Algorithm::FixedWindow {
            c.refund(at(T0), &one).await;
        }
        c.refund(at(T0), &one).await;
        assert!(!c.apply(at(T0), &one).await[0].over, "{algorithm:?}");
        assert!(c.apply(at(T0), &one).await[0].over, "{algorithm:?}");
        if algorithm == Algorithm::FixedWindow {
            // The refused one's refund again, to leave 3 in flight: a count of 3.
            c.refund(at(T0), &one).await;
        }
        let back = c.refund(at(T0), &[hit(&k, q, 2)]).await;
        assert_eq!(back[0].remaining, 2, "{algorithm:?}");
        let back = c.refund(at(T0), &[hit(&k, q, 5)]).await;
        assert_eq!(back[0].remaining, 3, "{algorithm:?}");
        let mut d = Vec::new();
        for _ in 0..4 {
            d.extend(c.apply(at(T0), &one).await);
        }
        assert_eq!(admitted(&d), [true, true, true, false], "{algorithm:?}");
    }
}

/// A rate of 0 admits nothing and holds nothing, with or without `charge_refused`: a charged
/// refusal has no rate to be waited out at, so thirty of them in a row answer as the first
/// (Redis once stored each one's arrival time, and failed every call from the 23rd on).
pub async fn a_limit_of_zero_refuses_every_hit_but_not_a_peek<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    for algorithm in Algorithm::RATES {
        for charge_refused in [false, true] {
            let q = Quota {
                charge_refused,
                ..quota(algorithm, 0, Unit::Minute, 0)
            };
            let k = format!("{}{charge_refused}_", key("zero", algorithm));
            let d = c
                .apply(at(T0), &[hit(&k, q, 0), hit(&k, q, 1), hit(&k, q, 3)])
                .await;
            assert_eq!(admitted(&d), [true, false, false], "{algorithm:?}");
            assert_eq!(remaining(&d), [0, 0, 0], "{algorithm:?}");
            for second in 1..=30 {
                let d = c.apply(at(T0 + second), &[hit(&k, q, 2)]).await;
                assert!(d[0].over, "{algorithm:?}");
            }
        }
    }
}

/// Many calls in flight on one key at once admit exactly the limit (each store makes its own
/// updates atomic: a compare-and-swap, a script, one owner).
pub async fn concurrent_callers_get_exactly_the_limit<S: CounterStore>(store: &S) {
    for algorithm in Algorithm::RATES {
        let (k, q) = (
            key("concurrent", algorithm),
            limit(algorithm, 50, Unit::Hour),
        );
        let calls = (0..120).map(|_| async {
            let mut out = Vec::new();
            store
                .apply(at(T0), &[hit(&k, q, 1)], &mut out)
                .await
                .expect("the store answers");
            !out[0].over
        });
        let answers = futures_util::future::join_all(calls).await;
        let admitted = answers.iter().filter(|a| **a).count();
        assert_eq!(admitted, 50, "{algorithm:?}");
    }
}

/// The contract Redis was first held to: a deterministic, irregular sequence of calls (steps of
/// up to 9 s, 0 to 2 hits, every algorithm), one key per algorithm, answered exactly as the
/// model does; every tenth step refunds what it was admitted, and every third sends all four
/// hits in one batch.
pub async fn an_irregular_sequence_answers_as_the_model<S: CounterStore>(store: &S) {
    let mut c = Checked::new(store);
    let quotas = [
        quota(Algorithm::FixedWindow, 7, Unit::Minute, 0),
        quota(Algorithm::SlidingWindow, 7, Unit::Minute, 0),
        quota(Algorithm::TokenBucket, 7, Unit::Minute, 3),
        quota(Algorithm::LeakyBucket, 7, Unit::Minute, 2),
    ];
    let keys: Vec<String> = (0..quotas.len())
        .map(|i| format!("contract_{i}_"))
        .collect();
    let mut now = T0 * 1_000_000;
    let mut seed = 42u64;
    for step in 0..200 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        now += (seed >> 33) % 9_000_000;
        let hits = (seed >> 20) % 3;
        let t = Timestamp::from_micros(now);
        let all: Vec<Hit<'_>> = keys
            .iter()
            .zip(quotas)
            .map(|(k, q)| hit(k, q, hits))
            .collect();
        let batches: Vec<&[Hit<'_>]> = if step % 3 == 0 {
            vec![all.as_slice()]
        } else {
            all.chunks(1).collect()
        };
        for batch in batches {
            let d = c.apply(t, batch).await;
            if step % 10 == 0 {
                let given: Vec<Hit<'_>> = batch
                    .iter()
                    .zip(&d)
                    .filter(|(_, d)| !d.over)
                    .map(|(h, _)| *h)
                    .collect();
                c.refund(t, &given).await;
            }
        }
    }
}

/// One step of a random sequence. A counter is named by its index among the sequence's
/// counters.
#[derive(Clone, Debug)]
pub enum Step {
    /// The clock moves on by this many microseconds.
    Wait(u64),
    /// One call: a counter and its hits, per hit.
    Apply(Vec<(usize, u64)>),
    /// Hits given back at the current time, whether or not they were admitted.
    Refund(Vec<(usize, u64)>),
    /// The counter admin's reset of one counter.
    Reset(usize),
}

/// A random sequence: up to four counters with their quotas, the clock's start (microseconds
/// after [`T0`]) and the steps.
#[derive(Clone, Debug)]
pub struct Sequence {
    quotas: Vec<Quota>,
    start: u64,
    steps: Vec<Step>,
}

/// Any quota a config can give a counter: every algorithm, a small rate (0 now and then; 7 does
/// not divide a second or a minute), a second or a minute times 1 to 3, a burst on the buckets,
/// with or without `charge_refused`.
fn any_quota() -> impl Strategy<Value = Quota> {
    (
        prop::sample::select(Algorithm::RATES.to_vec()),
        prop_oneof![1 => Just(0u32), 9 => 1..=7u32],
        prop::sample::select(vec![Unit::Second, Unit::Minute]),
        1..=3u32,
        prop::option::of(1..=6u32),
        any::<bool>(),
    )
        .prop_map(
            |(algorithm, rpu, unit, unit_multiplier, burst, charge_refused)| Quota {
                penalty: None,
                safe_capacity: None,
                requests_per_unit: rpu,
                unit,
                unit_multiplier,
                calendar: sluice::limiter::Calendar::EPOCH,
                algorithm,
                burst: burst
                    .filter(|_| algorithm.takes_burst())
                    .and_then(NonZeroU32::new),
                charge_refused,
            },
        )
}

fn any_step() -> impl Strategy<Value = Step> {
    let hits = prop_oneof![4 => 0..=2u64, 1 => 0..=9u64];
    let batch = prop::collection::vec((0..4usize, hits), 1..=4);
    // Sub-second steps, whole seconds (which land on window boundaries when the start does),
    // and single microseconds either side of an instant.
    let wait = prop_oneof![
        3 => 0..1_500_000u64,
        3 => (1..=130u64).prop_map(|secs| secs * 1_000_000),
        1 => Just(1u64),
    ];
    prop_oneof![
        3 => wait.prop_map(Step::Wait),
        5 => batch.clone().prop_map(Step::Apply),
        1 => batch.prop_map(Step::Refund),
        1 => (0..4usize).prop_map(Step::Reset),
    ]
}

fn any_sequence() -> impl Strategy<Value = Sequence> {
    (
        prop::collection::vec(any_quota(), 1..=4),
        prop_oneof![Just(0u64), 0..180_000_000u64],
        prop::collection::vec(any_step(), 1..=40),
    )
        .prop_map(|(quotas, start, mut steps)| {
            for step in &mut steps {
                match step {
                    Step::Apply(batch) | Step::Refund(batch) => {
                        batch.iter_mut().for_each(|(i, _)| *i %= quotas.len());
                    }
                    Step::Reset(i) => *i %= quotas.len(),
                    Step::Wait(_) => {}
                }
            }
            Sequence {
                quotas,
                start,
                steps,
            }
        })
}

/// Plays `sequence` on `store` and the model, on keys of its own (`run` tells them apart).
async fn play<S: CounterStore>(store: &S, run: u64, sequence: &Sequence) -> Result<(), String> {
    let mut c = Checked::new(store);
    let keys: Vec<String> = (0..sequence.quotas.len())
        .map(|i| format!("random_{run}_{i}_"))
        .collect();
    let hits = |batch: &[(usize, u64)]| -> Vec<Hit<'_>> {
        batch
            .iter()
            .map(|&(i, hits)| hit(&keys[i], sequence.quotas[i], hits))
            .collect()
    };
    let mut now = T0 * 1_000_000 + sequence.start;
    for step in &sequence.steps {
        let t = Timestamp::from_micros(now);
        match step {
            Step::Wait(micros) => now += micros,
            Step::Apply(batch) => {
                c.try_apply(t, &hits(batch)).await?;
            }
            Step::Refund(batch) => {
                c.try_refund(t, &hits(batch)).await?;
            }
            Step::Reset(i) => c.reset(t, &hits(&[(*i, 0)])).await,
        }
    }
    Ok(())
}

/// Random sequences of calls, refunds, resets and clock steps on counters of random quotas,
/// every decision checked against the model. 32 sequences of up to 40 steps (PROPTEST_CASES
/// sets another number), a few hundred calls: a second or two on a real server. A failure is
/// shrunk to a short sequence and saved in `proptest-regressions/store_contract.txt`, which
/// every backend replays first.
pub async fn random_sequences_answer_as_the_model<S: CounterStore>(store: &S) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/store_contract.txt",
        ))),
        ..Config::default()
    });
    let runs = AtomicU64::new(0);
    let runtime = tokio::runtime::Handle::current();
    let result = tokio::task::block_in_place(|| {
        runner.run(&any_sequence(), |sequence| {
            let run = runs.fetch_add(1, Ordering::Relaxed);
            runtime
                .block_on(play(store, run, &sequence))
                .map_err(TestCaseError::fail)
        })
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// How a remote backend lets a counter's state expire, for
/// [`expiries_outlast_every_state`].
pub trait Expiry {
    /// Called just before the state is written.
    fn before_write(&mut self) {}

    /// How long after the write the backend may drop what it holds for `hit` (charged at
    /// `now`), at the earliest, read from the TTL it set; then drops it at once. `None` when
    /// that could not be told this time (the case is tried again on another key).
    fn earliest_drop(&mut self, hit: &Hit<'_>, now: Timestamp) -> Option<std::time::Duration>;
}

/// One state of every algorithm and shape a remote store lets expire, as a quota and the hits
/// of each call that makes it: leaky buckets (whose state outlives nginx's excess by one
/// emission interval), token buckets, debts charged with `charge_refused`, windows of several
/// units, sliding windows (which need the window after theirs), fixed windows, on units of a
/// minute and a second.
pub fn expiring_states() -> Vec<(Quota, Vec<u64>)> {
    use Algorithm::*;
    let charged = |q: Quota| Quota {
        charge_refused: true,
        ..q
    };
    let times = |q: Quota, unit_multiplier| Quota {
        unit_multiplier,
        ..q
    };
    vec![
        (quota(LeakyBucket, 1, Unit::Minute, 0), vec![1]),
        (quota(LeakyBucket, 3, Unit::Minute, 2), vec![3]),
        (quota(LeakyBucket, 7, Unit::Second, 0), vec![1]),
        (quota(TokenBucket, 5, Unit::Minute, 0), vec![2]),
        (quota(TokenBucket, 7, Unit::Second, 0), vec![7]),
        (
            charged(quota(TokenBucket, 100, Unit::Minute, 0)),
            vec![40; 3],
        ),
        (charged(limit(LeakyBucket, 100, Unit::Minute)), vec![40; 3]),
        (times(quota(TokenBucket, 3, Unit::Minute, 0), 5), vec![1]),
        (times(quota(LeakyBucket, 3, Unit::Minute, 0), 5), vec![1]),
        (quota(SlidingWindow, 10, Unit::Minute, 0), vec![3]),
        (quota(SlidingWindow, 5, Unit::Second, 0), vec![3]),
        (times(quota(SlidingWindow, 10, Unit::Minute, 0), 2), vec![3]),
        (
            charged(quota(SlidingWindow, 100, Unit::Minute, 0)),
            vec![40; 3],
        ),
        (quota(FixedWindow, 10, Unit::Minute, 0), vec![2]),
        (quota(FixedWindow, 5, Unit::Second, 0), vec![2]),
        (times(quota(FixedWindow, 3, Unit::Minute, 0), 5), vec![1]),
    ]
}

/// A remote store's expiries are long enough: for each of [`expiring_states`] on a fresh key,
/// charged at T0 + 0.25 s, the backend's TTL says when at the earliest it may drop the state,
/// the state is dropped, and a call at that time must answer as the model, which still holds
/// it. So the backend never forgets a state that could still change an answer, whatever the
/// algorithm (with no waiting: the TTL is read, not waited out).
pub async fn expiries_outlast_every_state<S: CounterStore>(store: &S, expiry: &mut impl Expiry) {
    let mut c = Checked::new(store);
    let now = Timestamp::from_micros(T0 * 1_000_000 + 250_000);
    for (i, (q, calls)) in expiring_states().into_iter().enumerate() {
        let mut told = None;
        for attempt in 0..5 {
            let k = format!("expiry_{i}_{attempt}_");
            expiry.before_write();
            for &hits in &calls {
                c.apply(now, &[hit(&k, q, hits)]).await;
            }
            if let Some(after) = expiry.earliest_drop(&hit(&k, q, 0), now) {
                told = Some((k, after));
                break;
            }
        }
        let (k, after) = told.expect("the backend's TTL was read");
        let then = Timestamp::from_micros(now.micros() + after.as_micros() as u64);
        c.try_apply(then, &[hit(&k, q, 0), hit(&k, q, 1)])
            .await
            .unwrap_or_else(|e| panic!("{q:?} {calls:?}: dropped {after:?} after: {e}"));
    }
}

/// Generates the concurrency limit's cases ([`slots_contract`]'s functions) in a module
/// `$name`, each on a fresh store from `$make`, for the backends that keep slots (memory, the
/// peer cluster, Redis; memcached is refused at config load). The reference model has no
/// concurrency limit: each case states its numbers, from `docs/algorithms.md`'s Concurrency.
#[macro_export]
macro_rules! slots_contract {
    ($name:ident, $make:path) => {
        mod $name {
            use super::*;
            $crate::store_contract!(@cases $make;
                slots_are_taken_refused_and_given_back,
                refused_starts_and_their_refunds_cancel_out,
                a_slot_never_given_back_frees_itself_one_window_after_it_was_taken,
                concurrent_starts_take_exactly_the_limit,
                without_charge_refused_every_refund_gives_back_a_slot,
            );
        }
    };
}

/// 3 in flight for a window of 5 s (the contract), refused starts kept as a debt (the
/// config's default for a concurrency limit).
pub fn slots_quota() -> Quota {
    Quota {
        unit_multiplier: 5,
        charge_refused: true,
        ..limit(Algorithm::Concurrency, 3, Unit::Second)
    }
}

async fn slot_calls<S: CounterStore>(store: &S, now: Timestamp, hits: &[Hit<'_>]) -> Vec<Decision> {
    let mut out = Vec::new();
    store
        .apply(now, hits, &mut out)
        .await
        .expect("the store answers");
    out
}

async fn slot_refund<S: CounterStore>(store: &S, now: Timestamp, hit: Hit<'_>) -> Decision {
    let mut out = Vec::new();
    store
        .refund(now, &[hit], &mut out)
        .await
        .expect("the store answers");
    out[0]
}

/// Three starts pass (2, 1, 0 free), the fourth is refused; a refund frees one, and a start
/// of 2 (`hits_addend`) does not fit in it; its refund is a debt paid, not a slot freed.
pub async fn slots_are_taken_refused_and_given_back<S: CounterStore>(store: &S) {
    let (k, q) = ("slots_taken_", slots_quota());
    let mut d = Vec::new();
    for _ in 0..4 {
        d.extend(slot_calls(store, at(T0), &[hit(k, q, 1)]).await);
    }
    assert_eq!(admitted(&d), [true, true, true, false]);
    assert_eq!(remaining(&d), [2, 1, 0, 0]);
    assert_eq!(d[3].reset_after_secs, 5, "the oldest slot expires in 5 s");
    // The refused start's refund pays its debt: still 3 held.
    let back = slot_refund(store, at(T0 + 1), hit(k, q, 1)).await;
    assert_eq!((back.count_before, back.count_after), (3, 3));
    let back = slot_refund(store, at(T0 + 1), hit(k, q, 1)).await;
    assert_eq!((back.count_after, back.remaining), (2, 1));
    let two = slot_calls(store, at(T0 + 2), &[hit(k, q, 2)]).await;
    assert!(two[0].over, "2 slots do not fit in 1");
    let back = slot_refund(store, at(T0 + 2), hit(k, q, 2)).await;
    assert_eq!(back.count_after, 2, "the refused 2 were a debt");
    let peek = slot_calls(store, at(T0 + 2), &[hit(k, q, 0)]).await;
    assert_eq!((peek[0].over, peek[0].remaining), (false, 1));
}

/// A burst of refusals frees nothing: five starts against 3, then the two refused ones'
/// refunds: still refused; once the three admitted end, three pass again.
pub async fn refused_starts_and_their_refunds_cancel_out<S: CounterStore>(store: &S) {
    let (k, q) = ("slots_cancel_", slots_quota());
    let five: Vec<Hit<'_>> = (0..5).map(|_| hit(k, q, 1)).collect();
    let d = slot_calls(store, at(T0), &five).await;
    assert_eq!(admitted(&d), [true, true, true, false, false]);
    for _ in 0..2 {
        slot_refund(store, at(T0), hit(k, q, 1)).await;
    }
    assert!(slot_calls(store, at(T0), &[hit(k, q, 1)]).await[0].over);
    for _ in 0..4 {
        slot_refund(store, at(T0 + 1), hit(k, q, 1)).await;
    }
    let d = slot_calls(store, at(T0 + 1), &five[..4]).await;
    assert_eq!(admitted(&d), [true, true, true, false]);
}

/// A slot whose refund never comes frees itself 5 s after it was taken, not at a window
/// boundary, and the call that finds it gone says so (`expired`).
pub async fn a_slot_never_given_back_frees_itself_one_window_after_it_was_taken<S: CounterStore>(
    store: &S,
) {
    let (k, q) = ("slots_expire_", slots_quota());
    slot_calls(store, at(T0), &[hit(k, q, 1)]).await;
    slot_calls(store, at(T0 + 2), &[hit(k, q, 2)]).await;
    let just_before = Timestamp::from_micros((T0 + 5) * 1_000_000 - 1);
    assert!(slot_calls(store, just_before, &[hit(k, q, 1)]).await[0].over);
    let d = slot_calls(store, at(T0 + 5), &[hit(k, q, 1)]).await;
    assert_eq!((d[0].over, d[0].expired, d[0].remaining), (false, 1, 0));
    let d = slot_calls(store, at(T0 + 7), &[hit(k, q, 0)]).await;
    assert_eq!((d[0].count_before, d[0].expired, d[0].remaining), (1, 2, 2));
    let d = slot_calls(store, at(T0 + 10), &[hit(k, q, 0)]).await;
    assert_eq!((d[0].count_before, d[0].expired, d[0].remaining), (0, 1, 3));
}

/// Many starts at once on one key take exactly the limit.
pub async fn concurrent_starts_take_exactly_the_limit<S: CounterStore>(store: &S) {
    let q = Quota {
        requests_per_unit: 50,
        ..slots_quota()
    };
    let calls = (0..120).map(|_| async {
        !slot_calls(store, at(T0), &[hit("slots_concurrent_", q, 1)]).await[0].over
    });
    let answers = futures_util::future::join_all(calls).await;
    assert_eq!(answers.iter().filter(|a| **a).count(), 50);
}

/// `charge_refused: false` (a proxy that refunds admitted requests only, HAProxy's response
/// event): a refusal keeps no debt, so the next refund frees a slot.
pub async fn without_charge_refused_every_refund_gives_back_a_slot<S: CounterStore>(store: &S) {
    let q = Quota {
        charge_refused: false,
        ..slots_quota()
    };
    let k = "slots_lean_";
    let four: Vec<Hit<'_>> = (0..4).map(|_| hit(k, q, 1)).collect();
    assert_eq!(
        admitted(&slot_calls(store, at(T0), &four).await),
        [true, true, true, false]
    );
    let back = slot_refund(store, at(T0), hit(k, q, 1)).await;
    assert_eq!((back.count_after, back.remaining), (2, 1));
}
