//! The allowance logic against a counter standing in for Redis's key (the script's rule:
//! grant at most what is left under the limit): several replicas, hot and cold keys.

use super::*;
use crate::limiter::{Quota, Unit};

const S: u64 = 1_000_000;
const T0: u64 = 1_700_000_000 * S;
const TIMING: AllowanceTiming = AllowanceTiming {
    horizon_us: 100_000,
    max_bytes: 1 << 20,
};

/// Redis's counts of one key, per window, and what [`RESERVE`] does to them; `count` is the
/// window the test looks at (the first one a replica asked for), `later` the ones after it.
#[derive(Default)]
struct Key {
    window: Option<u64>,
    count: u64,
    later: std::collections::BTreeMap<u64, u64>,
}

impl Key {
    fn reserve(&mut self, r: Refill, limit: u64) -> (u64, u64) {
        let first = *self.window.get_or_insert(r.window);
        let count = match r.window.cmp(&first) {
            std::cmp::Ordering::Equal => &mut self.count,
            std::cmp::Ordering::Greater => self.later.entry(r.window).or_default(),
            std::cmp::Ordering::Less => panic!("a reservation for a past window: {r:?}"),
        };
        let grant = r.want.min(limit.saturating_sub(*count));
        *count += grant;
        (grant, *count)
    }
}

fn hit(quota: Quota) -> Hit<'static> {
    Hit {
        key: "d_k_v_",
        quota,
        hits: 1,
    }
}

/// Replica `r` decides one hit at `now_us`, reserving from `key` when told to, and refilling
/// when a local decision asks to (at once, as a call answered instantly would); `None` when
/// the hit goes Redis's own way (INCRBY).
fn decide(r: &Allowances, key: &mut Key, q: Quota, now_us: u64) -> Option<Decision> {
    let h = hit(q);
    let now = Timestamp::from_micros(now_us);
    loop {
        match r.route(&h, now) {
            Route::Local { decision, refill } => {
                if let Some(refill) = refill {
                    let (granted, count) = key.reserve(refill, u64::from(q.requests_per_unit));
                    r.reserved(h.key, refill, granted, count);
                }
                return Some(decision);
            }
            Route::Remote { .. } => return None,
            Route::Reserve(refill) => {
                assert_eq!(refill.window, window_of(&h, now));
                let (granted, count) = key.reserve(refill, u64::from(q.requests_per_unit));
                r.reserved(h.key, refill, granted, count);
            }
        }
    }
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
            None => {
                key.count += 1; // the INCRBY
                remote += 1;
            }
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
        match decide(r, &mut key, q, now) {
            Some(d) => admitted += u64::from(!d.over),
            None => {
                key.count += 1;
                admitted += u64::from(key.count <= 300);
            }
        }
    }
    assert!(admitted <= 300, "{admitted} admitted of 300");
    assert!(admitted >= 285, "only {admitted} admitted of 300");
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
        r.route(&hit(sliding), Timestamp::from_micros(T0)),
        Route::Remote { dry: false }
    );
    let full = Allowances::new(AllowanceTiming {
        max_bytes: 0,
        ..TIMING
    });
    let fixed = Quota::fixed(10, Unit::Second);
    assert_eq!(
        full.route(&hit(fixed), Timestamp::from_micros(T0)),
        Route::Remote { dry: false }
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
    let mut admitted = [0u64; 2];
    for i in 0..15_000u64 {
        let now = T0 + i * 100;
        let w = usize::from(now >= T0 + S);
        if w == 1 && admitted[1] == 0 {
            assert!(next_window(&key) > 0, "nothing reserved ahead");
        }
        match decide(&r, &mut key, q, now) {
            Some(d) => admitted[w] += u64::from(!d.over),
            // The first calls, before the key is measured hot: Redis's INCRBY.
            None if w == 0 => {
                key.count += 1;
                admitted[0] += u64::from(key.count <= 500);
            }
            None => panic!("hit {i} of the next window went to Redis: the key is hot"),
        }
    }
    assert_eq!(key.count, 500);
    assert!(admitted[0] <= 500 && admitted[0] >= 495, "{admitted:?}");
    assert!(admitted[1] >= 495, "{admitted:?}");
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
            r.route(&h, Timestamp::from_micros(T0 + 200_000)),
            Route::Remote { dry: false }
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
fn a_call_from_a_past_window_goes_to_redis_and_leaves_the_batch_where_it_is() {
    let q = Quota::fixed(1_000_000, Unit::Second);
    let r = Allowances::new(TIMING);
    let mut key = Key::default();
    for i in 0..12_000u64 {
        decide(&r, &mut key, q, T0 + i * 100);
    }
    // The batch is in the second window now; a call stamped in the first (it waited) is
    // Redis's, and the batch neither turns back nor stops deciding the second window's calls.
    let late = r.route(&hit(q), Timestamp::from_micros(T0 + S - 1));
    assert_eq!(late, Route::Remote { dry: false });
    for i in 12_000..13_000u64 {
        let d = decide(&r, &mut key, q, T0 + i * 100);
        assert!(d.is_some_and(|d| !d.over), "hit {i}: {d:?}");
    }
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
    // sent it was cancelled): the key's calls go to Redis, dry...
    let mut now = T0 + 200_000;
    let asked = loop {
        now += 100;
        match r.route(&hit(q), Timestamp::from_micros(now)) {
            Route::Local { refill: None, .. } => {}
            Route::Local {
                refill: Some(refill),
                ..
            } if !refill.ahead => {}
            Route::Reserve(_) => panic!("a refill was under way"),
            other => break other,
        }
    };
    assert_eq!(asked, Route::Remote { dry: true });
    // ... but not for ever: once UNDER_WAY_US has passed, the batch reserves again.
    let later = Timestamp::from_micros(now + UNDER_WAY_US);
    assert!(matches!(r.route(&hit(q), later), Route::Reserve(_)));
}
