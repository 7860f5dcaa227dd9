//! The allowance logic against a counter standing in for Redis's key (the script's rule:
//! grant at most what is left under the limit): several replicas, hot and cold keys.

use super::*;
use crate::limiter::{Quota, Unit};

const S: u64 = 1_000_000;
const T0: u64 = 1_700_000_000 * S;
const TIMING: AllowanceTuning = AllowanceTuning::new(100_000, 1 << 20);

/// Redis's counts of one key, per window, and what [`RESERVE`] and INCRBY do to them; `count`
/// is the window the test looks at (the first one a replica asked for), `later` the ones after
/// it.
#[derive(Default)]
struct Key {
    window: Option<u64>,
    count: u64,
    later: std::collections::BTreeMap<u64, u64>,
    /// Reservations and INCRBYs sent, in every window.
    calls: u64,
}

impl Key {
    fn slot(&mut self, window: u64) -> &mut u64 {
        let first = *self.window.get_or_insert(window);
        match window.cmp(&first) {
            std::cmp::Ordering::Equal => &mut self.count,
            std::cmp::Ordering::Greater => self.later.entry(window).or_default(),
            std::cmp::Ordering::Less => panic!("a call for a past window: {window}"),
        }
    }

    /// [`RESERVE`]'s rule: a call that does not fit with what its batch held is counted and
    /// the held hits given back (and, `past`, the batch kept as refused hits counted ahead);
    /// else grant at most what is left under the limit (all of it, `past` in the background).
    fn reserve(&mut self, r: Refill, limit: u64) -> Answer {
        self.calls += 1;
        let count = self.slot(r.window);
        let before = *count;
        let granted = if r.past { r.want } else { 0 };
        if r.hits > 0 && before.saturating_sub(r.held) + r.hits > limit {
            *count = before.saturating_sub(r.held) + r.hits + granted;
            return Answer {
                granted,
                count: *count,
                refused: true,
            };
        }
        let granted = match r.past && r.hits == 0 {
            true => r.want,
            false => r.want.min(limit.saturating_sub(before)),
        };
        *count += granted;
        Answer {
            granted,
            count: *count,
            refused: false,
        }
    }

    /// INCRBY on the key of `window`.
    fn incr(&mut self, window: u64, hits: u64) -> u64 {
        self.calls += 1;
        let count = self.slot(window);
        *count += hits;
        *count
    }
}

fn hit(quota: Quota) -> Hit<'static> {
    hits(quota, 1)
}

fn hits(quota: Quota, hits: u64) -> Hit<'static> {
    Hit {
        key: "d_k_v_",
        quota,
        hits,
    }
}

/// A decision, and whether Redis's own path (INCRBY) made it.
#[derive(Debug)]
struct Decided {
    decision: Decision,
    remote: bool,
}

/// Replica `r` decides `h` at `now_us` as the store does, reserving from `key` when told to,
/// refilling when a local decision asks to (at once, as a call answered instantly would), and
/// sending the store's own INCRBY when routed to Redis.
fn decide_hit(r: &Allowances, key: &mut Key, h: Hit<'_>, now_us: u64) -> Decided {
    let now = Timestamp::from_micros(now_us);
    let limit = u64::from(h.quota.requests_per_unit);
    let refill = |refill: Option<Refill>, key: &mut Key| {
        if let Some(refill) = refill {
            let answer = key.reserve(refill, limit);
            r.reserved(&Hit { hits: 0, ..h }, now, refill, answer);
        }
    };
    match r.route(&h, now, false) {
        Route::Local {
            decision,
            refill: f,
        } => {
            refill(f, key);
            Decided {
                decision,
                remote: false,
            }
        }
        Route::Remote { held, ahead } => {
            refill(ahead, key);
            let count = key.incr(window_of(&h, now), h.hits);
            Decided {
                decision: r.remote(&h, now, held, count),
                remote: true,
            }
        }
        Route::Reserve(refill) => {
            assert_eq!(refill.window, window_of(&h, now));
            let answer = key.reserve(refill, limit);
            Decided {
                decision: r.reserved(&h, now, refill, answer),
                remote: false,
            }
        }
        Route::Wait => panic!("told to wait though it may not"),
    }
}

/// [`decide_hit`] for one hit; `None` when Redis's own path decided it.
fn decide(r: &Allowances, key: &mut Key, q: Quota, now_us: u64) -> Option<Decision> {
    let d = decide_hit(r, key, hit(q), now_us);
    (!d.remote).then_some(d.decision)
}

#[test]
fn a_cold_key_goes_to_redis_and_a_hot_one_is_decided_locally_from_batches() {
    let q = Quota::fixed(1_000, Unit::Minute);
    let r = Allowances::new(TIMING);
    let mut key = Key::default();
    // One hit a second: cold, every hit goes to Redis.
    for i in 0..5 {
        assert_eq!(decide(&r, &mut key, q, T0 + i * S), None);
    }
    // 1,000 hits a second: after a sample or two the key is hot and reserves batches.
    let (mut local, mut remote) = (0, 0);
    for i in 0..500 {
        match decide(&r, &mut key, q, T0 + 5 * S + i * 1_000) {
            Some(d) => {
                assert!(!d.over, "{d:?}");
                local += 1;
            }
            None => remote += 1,
        }
    }
    assert!(local >= 450, "{local} local, {remote} remote");
    assert!(key.count <= 1_000);
}

#[test]
fn replicas_offered_twice_the_limit_admit_it_and_no_more() {
    let q = Quota::fixed(300, Unit::Second);
    let replicas: Vec<Allowances> = (0..3).map(|_| Allowances::new(TIMING)).collect();
    let mut key = Key::default();
    let mut admitted = 0;
    // 600 hits in the window, round-robin over three replicas, 1.6 ms apart.
    for i in 0..600u64 {
        let r = &replicas[(i % 3) as usize];
        let now = T0 + i * 1_600;
        admitted += u64::from(!decide_hit(r, &mut key, hit(q), now).decision.over);
    }
    let held: Vec<(u64, u64, bool, u64)> = replicas
        .iter()
        .map(|r| {
            let e = r.keys.get("d_k_v_").unwrap();
            let b = lock(&e);
            let g = b.grant;
            (g.granted, g.used, g.seen.exhausted, g.seen.count)
        })
        .collect();
    assert!(admitted <= 300, "{admitted} admitted of 300");
    assert!(
        admitted >= 285,
        "only {admitted} admitted of 300, {held:?} {}",
        key.count
    );
}

#[test]
fn a_new_window_starts_with_nothing_reserved_and_a_cooled_key_gives_back() {
    let q = Quota::fixed(1_000, Unit::Second);
    let r = Allowances::new(TIMING);
    let mut first = Key::default();
    for i in 0..900 {
        decide(&r, &mut first, q, T0 + i * 1_000);
    }
    // The next window reserves from its own key, and decides locally from it.
    let mut next = Key::default();
    let local = (0..200)
        .filter(|i| decide(&r, &mut next, q, T0 + S + i * 1_000).is_some())
        .count();
    assert!(
        next.count > 0 && local >= 150,
        "{local} local, {} reserved",
        next.count
    );
    let used = 200;
    assert!(
        next.count >= used,
        "{} reserved for {used} used",
        next.count
    );
    // Quiet for a while: the demand falls and what is left goes back.
    let back: u64 = (0..12)
        .flat_map(|i| r.give_back(Timestamp::from_micros(T0 + S + 300_000 + i * 20_000)))
        .map(|(_, _, n)| n)
        .sum();
    assert_eq!(back, next.count - used, "all that was not used goes back");
}

#[test]
fn other_algorithms_and_a_full_table_go_to_redis() {
    let sliding = Quota::fixed(10, Unit::Second).with_algorithm(Algorithm::SlidingWindow);
    let r = Allowances::new(TIMING);
    assert_eq!(
        r.route(&hit(sliding), Timestamp::from_micros(T0), true),
        Route::STORE
    );
    let full = Allowances::new(AllowanceTuning {
        max_bytes: 0,
        ..TIMING
    });
    let fixed = Quota::fixed(10, Unit::Second);
    assert_eq!(
        full.route(&hit(fixed), Timestamp::from_micros(T0), true),
        Route::STORE
    );
    assert!(full.is_empty());
}

/// What `key` holds in the window after `T0`'s.
fn next_window(key: &Key) -> u64 {
    key.later.get(&(T0 / S + 1)).copied().unwrap_or(0)
}

#[test]
fn a_hot_key_reserves_its_next_windows_batch_ahead_and_starts_it_with_hits_in_hand() {
    let q = Quota::fixed(1_000_000, Unit::Second);
    let r = Allowances::new(TIMING);
    let mut key = Key::default();
    // 10,000 hits a second to the window's end: within a horizon of it, the next window's
    // first batch (a horizon of demand, about 1,000) is reserved ahead.
    for i in 0..10_000u64 {
        decide(&r, &mut key, q, T0 + i * 100);
    }
    assert!(next_window(&key) >= 900, "{} ahead", next_window(&key));
    // So the next window's calls are decided from it from the first, none by Redis.
    for i in 10_000..15_000u64 {
        let d = decide(&r, &mut key, q, T0 + i * 100);
        assert!(d.is_some_and(|d| !d.over), "hit {i}: {d:?}");
    }
}

#[test]
fn a_key_at_its_limit_still_reserves_the_next_window_ahead() {
    let q = Quota::fixed(500, Unit::Second);
    let r = Allowances::new(TIMING);
    let mut key = Key::default();
    // Three windows at 10,000 hits a second; Redis calls counted from the first window's
    // limit spent, and in each window after (its own and the next one's ahead).
    let (mut admitted, mut spent, mut starts) = ([0u64; 3], None, [None; 3]);
    for i in 0..30_000u64 {
        let now = T0 + i * 100;
        let w = usize::try_from((now - T0) / S).unwrap();
        if admitted[0] == 500 {
            spent.get_or_insert(key.calls);
        }
        starts[w].get_or_insert(key.calls);
        if w == 1 && admitted[1] == 0 {
            assert!(next_window(&key) > 0, "nothing reserved ahead");
        }
        let d = decide_hit(&r, &mut key, hit(q), now);
        // The first calls, before the key is measured hot, take Redis's INCRBY; none after.
        assert!(
            !d.remote || w == 0,
            "hit {i} of window {w} went to Redis with {admitted:?} admitted"
        );
        admitted[w] += u64::from(!d.decision.over);
    }
    // Every refused hit is counted, as the Go service counts it, with at most the unused part
    // of a batch of refused hits counted ahead (a period of demand and half a horizon).
    assert!(
        (10_000..=10_000 + 10_500).contains(&key.count),
        "{}",
        key.count
    );
    // Past the limit, 9,500 refused hits in 0.95 s cost a few reservations, not an INCRBY
    // each (issue 50); and a window spent from its start costs about one: its batch ahead,
    // what the window has left and refused hits counted ahead at once.
    let [_, Some(second), Some(third)] = starts else {
        panic!("{starts:?}");
    };
    let past = second - spent.expect("the limit was spent");
    assert!(past <= 5, "{past} Redis calls past the limit");
    assert!(
        third - second <= 1,
        "{} Redis calls in a window",
        third - second
    );
    assert!(admitted[0] <= 500 && admitted[0] >= 495, "{admitted:?}");
    assert!(admitted[1] >= 495 && admitted[2] >= 495, "{admitted:?}");
}

#[test]
fn keys_with_no_demand_and_nothing_held_are_forgotten_and_uncharged() {
    let q = Quota::fixed(1_000_000, Unit::Second);
    let r = Allowances::new(TIMING);
    let mut key = Key::default();
    // A hot key, reserving, beside 100 cold keys seen once each.
    for i in 0..2_000u64 {
        decide(&r, &mut key, q, T0 + i * 100);
    }
    for i in 0..100 {
        let k = format!("cold_{i}_");
        let h = Hit {
            key: &k,
            quota: q,
            hits: 1,
        };
        assert_eq!(
            r.route(&h, Timestamp::from_micros(T0 + 200_000), true),
            Route::STORE
        );
    }
    assert_eq!(r.len(), 101);
    let charged = r.bytes();
    // A horizon later the cold keys are gone; the hot one holds a batch and stays.
    r.give_back(Timestamp::from_micros(T0 + 300_000));
    assert_eq!(r.len(), 1, "only the hot key is left");
    assert!(
        r.bytes() < charged / 50,
        "{} of {charged} still charged",
        r.bytes()
    );
    // Quiet for a second: its demand gone, its batch given back, it goes too.
    let back: u64 = (0..60)
        .flat_map(|i| r.give_back(Timestamp::from_micros(T0 + 300_000 + i * 20_000)))
        .map(|(_, _, n)| n)
        .sum();
    assert!(back > 0, "the hot key's batch goes back first");
    assert!(r.is_empty());
    assert_eq!(r.bytes(), 0);
}

#[test]
fn a_late_call_is_decided_from_what_its_window_held_and_leaves_the_batch_where_it_is() {
    let q = Quota::fixed(1_000_000, Unit::Second);
    let r = Allowances::new(TIMING);
    let mut key = Key::default();
    for i in 0..12_000u64 {
        decide(&r, &mut key, q, T0 + i * 100);
    }
    // The batch is in the second window now; a call stamped in the first (it waited) is
    // decided from what the batch held of the first when it turned (its 10,000 calls and
    // this one), one stamped two windows back is Redis's, and the batch neither turns back
    // nor stops deciding the second window's calls.
    let late = r.route(&hit(q), Timestamp::from_micros(T0 + S - 1), true);
    assert!(
        matches!(late, Route::Local { decision, refill: None }
            if !decision.over && decision.count_after == 10_001),
        "{late:?}"
    );
    let older = r.route(&hit(q), Timestamp::from_micros(T0 - 1), true);
    assert_eq!(older, Route::STORE);
    for i in 12_000..13_000u64 {
        let d = decide(&r, &mut key, q, T0 + i * 100);
        assert!(d.is_some_and(|d| !d.over), "hit {i}: {d:?}");
    }
}

#[test]
fn late_calls_of_a_spent_window_are_refused_from_its_refused_hits_counted_ahead() {
    let q = Quota::fixed(500, Unit::Second);
    let r = Allowances::new(TIMING);
    let mut key = Key::default();
    for i in 0..10_100u64 {
        decide_hit(&r, &mut key, hit(q), T0 + i * 100);
    }
    // The window turned 10 ms ago; calls stamped just before the turn arrive now (as many
    // do, with 100 in flight): each refused, as the Go service would from its count, none
    // sent to Redis.
    let (first, calls) = (key.count, key.calls);
    for k in 0..100u64 {
        let d = decide_hit(&r, &mut key, hit(q), T0 + S - 1 - k);
        assert!(d.decision.over && !d.remote, "late call {k}: {d:?}");
    }
    assert_eq!((key.count, key.calls), (first, calls));
}

#[test]
fn a_reservation_whose_answer_never_comes_is_given_up() {
    let q = Quota::fixed(1_000_000, Unit::Minute);
    let r = Allowances::new(TIMING);
    let mut key = Key::default();
    for i in 0..2_000u64 {
        decide(&r, &mut key, q, T0 + i * 100);
    }
    // Use the batch up without answering the refill it asks for (the call that would have
    // sent it was cancelled): the key's calls wait for it, or go to Redis, dry...
    let mut now = T0 + 200_000;
    let asked = loop {
        now += 100;
        match r.route(&hit(q), Timestamp::from_micros(now), true) {
            Route::Local { refill: None, .. } => {}
            Route::Local {
                refill: Some(refill),
                ..
            } if !refill.ahead => {}
            Route::Reserve(_) => panic!("a refill was under way"),
            other => break other,
        }
    };
    assert_eq!(asked, Route::Wait);
    let dry = r.route(&hit(q), Timestamp::from_micros(now), false);
    assert_eq!(dry, Route::STORE);
    // ... but not for ever: once UNDER_WAY_US has passed, the batch reserves again.
    let later = Timestamp::from_micros(now + UNDER_WAY_US);
    assert!(matches!(r.route(&hit(q), later, true), Route::Reserve(_)));
}

/// Every key taking batches from its first call, in batches of 3 at least: the store contract's
/// tuning, where time does not move enough to measure demand.
const EVERY_KEY: AllowanceTuning = AllowanceTuning {
    hot_hits: 0,
    min_batch: 3,
    ..TIMING
};

/// The Go service's fixed window, as `docs/algorithms.md` defines it: every hit counted, a
/// call admitted when its count stays within the limit, a refund taking the count down,
/// floored at 0.
struct GoWindow {
    count: u64,
    limit: u64,
}

impl GoWindow {
    fn apply(&mut self, hits: u64) -> (bool, u64) {
        self.count += hits;
        (self.count > self.limit, self.count)
    }

    fn refund(&mut self, hits: u64) {
        self.count = self.count.saturating_sub(hits);
    }
}

/// One replica's refund through the store: what the batch holds unused goes back with it.
fn refund(r: &Allowances, key: &mut Key, h: Hit<'_>, now_us: u64) {
    let now = Timestamp::from_micros(now_us);
    let back = h.hits + r.refund(&h, now);
    let count = key.slot(window_of(&h, now));
    *count = count.saturating_sub(back);
}

proptest::proptest! {
    /// One replica answers every call exactly as the Go service's window would, whatever the
    /// batches: admitted or not, and the count after, through calls of several hits, refused
    /// calls and refunds; and Redis then holds the Go service's count plus, at most, what the
    /// batch holds unused.
    #[test]
    fn one_replica_answers_as_the_go_service_whatever_the_batches(
        limit in 0u64..20,
        steps in proptest::collection::vec((0u64..6, proptest::bool::weighted(0.2)), 1..80),
    ) {
        let q = Quota::fixed(u32::try_from(limit).unwrap(), Unit::Minute);
        let r = Allowances::new(EVERY_KEY);
        let (mut key, mut go) = (Key::default(), GoWindow { count: 0, limit });
        for (i, (n, is_refund)) in steps.into_iter().enumerate() {
            let now = T0 + i as u64 * 1_000;
            if is_refund {
                refund(&r, &mut key, hits(q, n), now);
                go.refund(n);
                continue;
            }
            let d = decide_hit(&r, &mut key, hits(q, n), now).decision;
            let (over, after) = go.apply(n);
            proptest::prop_assert_eq!((d.over, d.count_after), (over, after), "step {}", i);
        }
        proptest::prop_assert!(key.count >= go.count, "{} in Redis, {} counted", key.count, go.count);
    }
}

#[test]
fn refused_calls_are_counted_in_redis_as_the_go_service_counts_them() {
    let q = Quota::fixed(50, Unit::Minute);
    let r = Allowances::new(EVERY_KEY);
    let mut key = Key::default();
    let admitted = (0..60)
        .filter(|i| {
            !decide_hit(&r, &mut key, hit(q), T0 + i * 1_000)
                .decision
                .over
        })
        .count();
    assert_eq!(admitted, 50);
    // Redis counts the 10 refused, and a batch of refused hits counted ahead, which goes back
    // once the key is quiet: then Redis holds the Go service's count.
    assert!(key.count > 60, "{}", key.count);
    let back: u64 = (0..60)
        .flat_map(|i| r.give_back(Timestamp::from_micros(T0 + 100_000 + i * 20_000)))
        .map(|(_, _, n)| n)
        .sum();
    assert_eq!(key.count - back, 60);
}

#[test]
fn a_refund_gives_the_batch_back_and_the_key_goes_redis_s_way_for_the_window() {
    // The refund recipe for requests in flight: 50 filled, 5 refunds, then 6 calls: 5 pass.
    let q = Quota::fixed(50, Unit::Minute);
    let r = Allowances::new(AllowanceTuning {
        min_batch: 20,
        ..EVERY_KEY
    });
    let mut key = Key::default();
    for i in 0..45 {
        assert!(!decide_hit(&r, &mut key, hit(q), T0 + i).decision.over);
    }
    // 45 used of the 50 reserved in batches of 20: 5 held, given back with the refunds.
    refund(&r, &mut key, hits(q, 5), T0 + 100);
    assert_eq!(key.count, 40);
    let d: Vec<Decided> = (0..16)
        .map(|i| decide_hit(&r, &mut key, hit(q), T0 + 200 + i))
        .collect();
    let admitted = d.iter().filter(|d| !d.decision.over).count();
    assert_eq!(admitted, 10, "{d:?}");
    assert!(
        d.iter().all(|d| d.remote),
        "refunded: Redis decides until the window ends"
    );
    assert_eq!(key.count, 56);
    // The next window takes batches again.
    let next = decide_hit(&r, &mut key, hit(q), T0 + 60 * S);
    assert!(!next.remote && !next.decision.over);
}

#[test]
fn charge_refused_limits_never_take_batches() {
    let q = Quota {
        charge_refused: true,
        ..Quota::fixed(50, Unit::Minute)
    };
    let r = Allowances::new(EVERY_KEY);
    assert_eq!(
        r.route(&hit(q), Timestamp::from_micros(T0), true),
        Route::STORE
    );
    assert!(r.is_empty());
}

#[test]
fn a_call_that_does_not_fit_is_counted_and_its_batch_given_back() {
    let q = Quota::fixed(10, Unit::Minute);
    let r = Allowances::new(AllowanceTuning {
        min_batch: 4,
        ..EVERY_KEY
    });
    let mut key = Key::default();
    // 4 reserved, 1 used: 3 held.
    assert!(!decide_hit(&r, &mut key, hit(q), T0).decision.over);
    assert_eq!(key.count, 4);
    // 10 more do not fit in the Go service's count of 1: counted (11), the 3 held given back.
    let d = decide_hit(&r, &mut key, hits(q, 10), T0 + 1).decision;
    assert!(d.over);
    assert_eq!((d.count_after, key.count), (11, 11));
}

/// The reservations `r` asks for while one key is offered `rate` hits a second for `secs`
/// seconds, answered at once from `key`: each one's hits wanted, and the count Redis answered
/// before it (what the replica knew of the window when it asked).
fn reservations_at(
    r: &Allowances,
    key: &mut Key,
    q: Quota,
    rate: u64,
    secs: u64,
) -> Vec<(u64, u64)> {
    let (mut asked, mut seen) = (Vec::new(), 0);
    let limit = u64::from(q.requests_per_unit);
    for i in 0..rate * secs {
        let now = Timestamp::from_micros(T0 + i * (S / rate));
        let mut reserve = |f: Refill, h: Hit<'_>, key: &mut Key, seen: &mut u64| {
            asked.push((f.want, *seen));
            let answer = key.reserve(f, limit);
            if !f.ahead {
                *seen = answer.count;
            }
            r.reserved(&h, now, f, answer);
        };
        match r.route(&hit(q), now, false) {
            Route::Local { refill, .. } => {
                if let Some(f) = refill {
                    reserve(f, hits(q, 0), key, &mut seen);
                }
            }
            Route::Remote { held, ahead } => {
                if let Some(f) = ahead {
                    reserve(f, hits(q, 0), key, &mut seen);
                }
                seen = key.incr(window_of(&hit(q), now), 1);
                r.remote(&hit(q), now, held, seen);
            }
            Route::Reserve(f) => reserve(f, hit(q), key, &mut seen),
            Route::Wait => panic!("told to wait though it may not"),
        }
    }
    asked
}

#[test]
fn a_steady_hot_key_reserves_a_few_large_batches_a_second_not_one_per_half_horizon() {
    // 10,000 hits a second for 3 s, on a minute's window and on a second's (which also needs
    // each window's first batch): each reservation costs Redis two commands (EVALSHA and its
    // INCRBY) and a window's first a third (EXPIRE), so 2 a second keep a key under 5 commands.
    for unit in [Unit::Minute, Unit::Second] {
        let q = Quota::fixed(1_000_000_000, unit);
        let r = Allowances::new(TIMING);
        let mut key = Key::default();
        let asked = reservations_at(&r, &mut key, q, 10_000, 3);
        assert!(
            asked.len() <= 2 * 3 + 1,
            "{unit:?}: {} reservations in 3 s: {asked:?}",
            asked.len()
        );
    }
}

#[test]
fn a_key_offered_far_past_what_its_window_has_left_takes_it_in_a_batch_or_two() {
    let q = Quota::fixed(10_000, Unit::Minute);
    let r = Allowances::new(TIMING);
    let mut key = Key::default();
    // Another replica took 9,000 of the window: this one, offered 10,000 a second with 40 s of
    // the window left, would use the 1,000 left in a tenth of a second, so it takes them at
    // once (no hit stranded: it uses them long before the window ends) rather than an eighth
    // of what is left at a time (a descent of about 30 reservations before issue 50's end).
    key.incr(T0 / S / 60, 9_000);
    let asked = reservations_at(&r, &mut key, q, 10_000, 1);
    let before_spent: Vec<_> = asked.iter().filter(|(_, seen)| *seen < 10_000).collect();
    assert!(before_spent.len() <= 3, "{asked:?}");
    // Then batches of refused hits counted ahead, which take nothing from anyone.
    assert!(asked.len() <= before_spent.len() + 2, "{asked:?}");
}

#[test]
fn many_warm_keys_each_reserve_a_few_times_a_second() {
    // 1,000 keys at 100 calls a second each on one replica (1e5 calls a second in all), for
    // 3 s, each with its own Redis key: the cost per key is what 10^4 keys would pay each
    // (keys are independent), and before issue 50 it was a reservation every half horizon.
    let q = Quota::fixed(1_000_000, Unit::Second);
    let r = Allowances::new(TIMING);
    let names: Vec<String> = (0..1_000).map(|k| format!("warm_{k}_")).collect();
    let mut keys: Vec<Key> = names.iter().map(|_| Key::default()).collect();
    let (mut reservations, mut remote) = (0u64, 0u64);
    for tick in 0..300u64 {
        let now = Timestamp::from_micros(T0 + tick * 10_000);
        for (name, key) in names.iter().zip(&mut keys) {
            let h = Hit {
                key: name,
                quota: q,
                hits: 1,
            };
            let refill = match r.route(&h, now, false) {
                Route::Local { refill, .. } => refill,
                Route::Reserve(f) => Some(f),
                Route::Remote { held, ahead } => {
                    remote += 1;
                    let count = key.incr(window_of(&h, now), 1);
                    r.remote(&h, now, held, count);
                    ahead
                }
                Route::Wait => panic!("told to wait though it may not"),
            };
            if let Some(f) = refill {
                // The first second measures the keys' demand; the two after are steady.
                reservations += u64::from(tick >= 100);
                let answer = key.reserve(f, 1_000_000);
                r.reserved(&Hit { hits: 0, ..h }, now, f, answer);
            }
        }
    }
    // Per key per second: reservations (2 Redis commands each, a window's first 3) and the
    // calls before the key's rate was measured (INCRBY and EXPIRE each).
    let per_key_second = reservations as f64 / 1_000.0 / 2.0;
    // One reservation per window: its first batch, reserved ahead, covers it.
    assert!(
        per_key_second <= 1.0,
        "{per_key_second:.2} reservations a second per key, {remote} calls to Redis"
    );
    eprintln!("{per_key_second:.2} reservations a second per key, {remote} calls to Redis");
}

/// What one replica costs Redis for a key offered one call every `gap_us` (with ±`wobble_us`
/// alternating, as h2load's `--rps` paces a connection) for `secs` seconds while the give-back
/// task runs every horizon, `phase_us` after a call: Redis commands (two for each reservation,
/// call sent to Redis and give-back: EVALSHA and its INCRBY, INCRBY and EXPIRE, EVALSHA and
/// its DECRBY) after the first second, and the give-backs.
fn paced_key_with_give_back(gap_us: u64, wobble_us: u64, phase_us: u64, secs: u64) -> (u64, u64) {
    let q = Quota::fixed(1_000_000_000, Unit::Second);
    let r = Allowances::new(TIMING);
    let mut key = Key::default();
    let (mut commands, mut given_back) = (0, 0);
    let mut next_tick = T0 + phase_us;
    for i in 0..secs * S / gap_us {
        let at = T0 + i * gap_us + if i % 2 == 0 { 0 } else { wobble_us };
        while next_tick <= at {
            let now = Timestamp::from_micros(next_tick);
            for (_, quota, hits) in r.give_back(now) {
                *key.slot(window_of(&hit(quota), now)) -= hits;
                given_back += 1;
                commands += 2 * u64::from(next_tick >= T0 + S);
            }
            next_tick += TIMING.horizon_us;
        }
        let before = r.snapshot();
        let d = decide_hit(&r, &mut key, hit(q), at);
        let after = r.snapshot();
        let count = |s: &[(&str, u64)], name: &str| s.iter().find(|(n, _)| *n == name).unwrap().1;
        let reserved = count(&after, "reservations") + count(&after, "refills")
            - count(&before, "reservations")
            - count(&before, "refills");
        if at >= T0 + S {
            commands += 2 * (reserved + u64::from(d.remote));
        }
    }
    (commands, given_back)
}

#[test]
fn a_key_at_the_hot_thresholds_edge_stays_hot_whatever_the_give_back_tasks_phase() {
    // The `warm` benchmark (issue 50): 50 calls a second at one replica, 5 a horizon (hot at
    // 4), each 19.4 to 20.6 ms after the last; the give-back task every horizon, at whatever
    // phase it started with. Measured before the fix: a tick 10 to 20 ms after a call closed
    // a demand sample of no hits, halving the demand to 25 a second; the key read cold, gave
    // its batch back, sent its next call to Redis and reserved again, every horizon (12 to 42
    // commands a second per replica).
    let flipping: Vec<_> = (0..20_000)
        .step_by(1_000)
        .map(|phase_us| (phase_us, paced_key_with_give_back(20_000, 600, phase_us, 4)))
        .filter(|&(_, (commands, given_back))| commands > 5 * 3 || given_back > 0)
        .collect();
    assert!(
        flipping.is_empty(),
        "(phase µs, (Redis commands in 3 s, give-backs)): {flipping:?}"
    );
}
