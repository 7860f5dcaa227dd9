use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::descriptor::Entry;
use crate::limiter::{Quota, Unit};

const SEC: u64 = 1_000_000;

fn rate_100() -> Rate {
    Rate::of(&Quota::fixed(100, Unit::Second)).unwrap()
}

fn id(v: &str) -> Arc<[Entry]> {
    Arc::from(vec![Entry::new("tenant", v)])
}

/// A bucket with one holder per stream `0..n`, all joined at 0.
fn bucket(n: u64) -> Bucket {
    let mut b = Bucket::new(rate_100());
    for s in 0..n {
        b.holders.push(Holder::new(s, id("acme"), 0));
    }
    b
}

/// Every holder reports `offered[i]` requests per second for one second, then the split runs.
fn second(b: &mut Bucket, t: u64, offered: &[u64]) {
    for (h, &o) in b.holders.iter_mut().zip(offered) {
        h.report(o, t * SEC);
    }
    b.split();
}

fn per_sec(b: &Bucket, i: usize) -> f64 {
    b.rate.per_sec(b.holders[i].assigned)
}

#[test]
fn a_lone_envoy_gets_the_whole_rate_and_keeps_it() {
    let mut b = bucket(1);
    for t in 1..10 {
        second(&mut b, t, &[200 + t % 3]);
        assert_eq!(per_sec(&b, 0), 100.0);
    }
}

#[test]
fn the_lighter_envoy_gets_what_it_asks_and_the_heavier_the_rest() {
    let mut b = bucket(2);
    // Unmeasured, both claim everything: an equal split at once.
    assert_eq!(b.split(), vec![0, 1]);
    assert_eq!((per_sec(&b, 0), per_sec(&b, 1)), (50.0, 50.0));
    for t in 1..6 {
        second(&mut b, t, &[120, 40]);
    }
    // The light one asks 40 (+5 % headroom: 42), the heavy one gets the rest.
    assert_eq!(per_sec(&b, 1), 42.0);
    assert_eq!(per_sec(&b, 0), 58.0);
    assert_eq!(b.assigned(), b.rate.tokens);
}

#[test]
fn small_wobbles_in_demand_do_not_change_an_assignment() {
    let mut b = bucket(2);
    for t in 1..6 {
        second(&mut b, t, &[120, 40]);
    }
    let before = (b.holders[0].assigned, b.holders[1].assigned);
    for t in 6..20 {
        let changed = {
            for (h, o) in b.holders.iter_mut().zip([118 + t % 5, 39 + t % 3]) {
                h.report(o, t * SEC);
            }
            b.split()
        };
        assert!(changed.is_empty(), "second {t}: {changed:?}");
    }
    assert_eq!((b.holders[0].assigned, b.holders[1].assigned), before);
}

#[test]
fn a_gone_envoy_keeps_its_part_reserved_until_it_expires() {
    let mut b = bucket(2);
    for t in 1..4 {
        second(&mut b, t, &[100, 100]);
    }
    assert_eq!((per_sec(&b, 0), per_sec(&b, 1)), (50.0, 50.0));
    b.holders[1].gone = true;
    b.holders[1].expires_us = 10 * SEC;
    b.holders[0].expires_us = 100 * SEC;
    second(&mut b, 4, &[100]);
    assert_eq!(per_sec(&b, 0), 50.0, "still reserved for the gone Envoy");
    assert_eq!(b.remove_stale(9 * SEC, 0), (0, vec![]));
    let (expired, quiet) = b.remove_stale(10 * SEC, 0);
    assert_eq!((expired, quiet.len()), (1, 0));
    assert_eq!(b.split(), vec![0]);
    assert_eq!(per_sec(&b, 0), 100.0, "the freed part goes to the one left");
}

#[test]
fn quiet_envoys_are_removed_for_abandon() {
    let mut b = bucket(2);
    for h in &mut b.holders {
        h.expires_us = 100 * SEC;
    }
    second(&mut b, 1, &[0, 10]);
    second(&mut b, 2, &[0, 10]);
    let (expired, quiet) = b.remove_stale(3 * SEC, SEC);
    assert_eq!(expired, 0);
    assert_eq!(quiet.iter().map(|h| h.stream).collect::<Vec<_>>(), vec![0]);
    assert_eq!(b.holders.len(), 1);
}

#[test]
fn a_new_rate_keeps_each_envoys_requests_per_second_within_it() {
    let mut b = bucket(2);
    second(&mut b, 1, &[100, 100]);
    b.set_rate(Rate::of(&Quota::fixed(60, Unit::Minute)).unwrap());
    assert!(b.assigned() <= b.rate.tokens);
    b.split();
    assert_eq!(b.assigned(), b.rate.tokens);
}

#[test]
fn a_split_is_due_every_eighth_of_a_round_and_at_once_after_a_new_rate() {
    // Up to 8 holders: every report.
    let mut b = bucket(8);
    b.split();
    assert!(b.split_due());
    // 64 holders: every 8th report since the last split, whoever splits.
    let mut b = bucket(64);
    b.split();
    let due: Vec<bool> = (0..16)
        .map(|_| {
            let due = b.split_due();
            if due {
                b.split();
            }
            due
        })
        .collect();
    let at: Vec<usize> = (0..16).filter(|&i| due[i]).collect();
    assert_eq!(at, vec![7, 15]);
    b.split_due();
    b.set_rate(Rate::of(&Quota::fixed(60, Unit::Minute)).unwrap());
    assert!(b.split_due(), "a new rate splits at once");
    b.split();
    assert!(!b.split_due());
}

#[derive(Clone, Debug)]
enum Op {
    /// Holder i reports this many attempts, `dt` tenths of a second later.
    Report(usize, u64, u64),
    Join(u64),
    Leave(usize),
    Expire(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..8, 0u64..400, 1u64..20).prop_map(|(i, n, dt)| Op::Report(i, n, dt)),
        1 => (0u64..50).prop_map(Op::Join),
        1 => (0usize..8).prop_map(Op::Leave),
        1 => (0u64..50).prop_map(Op::Expire),
    ]
}

proptest! {
    /// Whatever Envoys join, report, leave and expire, the assignments never sum past the
    /// rate, and a gone Envoy's assignment never changes.
    #[test]
    fn assignments_never_sum_past_the_rate(
        rpu in 1u32..5_000,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let rate = Rate::of(&Quota::fixed(rpu, Unit::Second)).unwrap();
        let mut b = Bucket::new(rate);
        let mut now = 0u64;
        for op in ops {
            match op {
                Op::Report(i, n, dt) => {
                    now += dt * SEC / 10;
                    if let Some(h) = b.holders.iter_mut().filter(|h| !h.gone).nth(i) {
                        h.report(n, now);
                    }
                }
                Op::Join(s) => {
                    let mut h = Holder::new(s, id("acme"), now);
                    h.expires_us = now + 3 * SEC;
                    b.holders.push(h);
                }
                Op::Leave(i) => {
                    if let Some(h) = b.holders.get_mut(i) {
                        h.gone = true;
                    }
                }
                Op::Expire(dt) => {
                    now += dt * SEC / 10;
                    b.remove_stale(now, 0);
                }
            }
            let gone_before: Vec<u64> = b.holders.iter().filter(|h| h.gone).map(|h| h.assigned).collect();
            b.split();
            let gone_after: Vec<u64> = b.holders.iter().filter(|h| h.gone).map(|h| h.assigned).collect();
            prop_assert_eq!(gone_before, gone_after);
            prop_assert!(b.assigned() <= rate.tokens, "{} > {}", b.assigned(), rate.tokens);
        }
    }

    /// With steady demands, the split settles on the max-min fair split of the claims (demand
    /// plus headroom), each part within the hysteresis of it, and the whole rate is given out.
    #[test]
    fn steady_demands_settle_on_the_fair_split(
        offered in proptest::collection::vec(1u64..300, 1..6),
    ) {
        let mut b = bucket(offered.len() as u64);
        for t in 1..12 {
            second(&mut b, t, &offered);
        }
        let claims: Vec<u64> = offered
            .iter()
            .map(|&o| b.rate.tokens_for(o as f64 * 1.05))
            .collect();
        let mut fair = max_min_fair(b.rate.tokens, &claims);
        spread(&mut fair, b.rate.tokens);
        for (i, &f) in fair.iter().enumerate() {
            let a = b.holders[i].assigned;
            prop_assert!(
                a.abs_diff(f) * 100 <= f.max(1) * (HYSTERESIS_PCT + 1),
                "holder {i}: {a} vs fair {f} (offered {offered:?})"
            );
        }
        prop_assert!(b.assigned() <= b.rate.tokens);
    }
}
