//! The concurrency limit's rule, step by step, and its invariants under any order of starts,
//! refunds, lost refunds and expiries (a property test against a log of real requests).

use super::*;
use proptest::prelude::*;

const S: u64 = 1_000_000;

/// `limit` in flight, slots held for 5 s, refused starts kept as a debt.
fn q(limit: u32) -> crate::limiter::Quota {
    crate::limiter::Quota {
        unit_multiplier: 5,
        charge_refused: true,
        ..crate::limiter::Quota::fixed(limit, crate::limiter::Unit::Second)
    }
    .with_algorithm(crate::limiter::Algorithm::Concurrency)
}
const T0: u64 = 1_700_000_000 * S;

fn start(s: &mut Slots, now: u64, hits: u64) -> Decision {
    s.decide(now, &q(3), hits)
}

#[test]
fn a_start_takes_a_free_slot_and_is_refused_when_none_is_free() {
    let mut s = Slots::default();
    let answers: Vec<(bool, u32)> = (0..5)
        .map(|_| start(&mut s, T0, 1))
        .map(|d| (d.over, d.remaining))
        .collect();
    assert_eq!(
        answers,
        [(false, 2), (false, 1), (false, 0), (true, 0), (true, 0)]
    );
    assert_eq!((s.held(), s.refused()), (3, 2));
    // The oldest slot expires 5 s after it was taken: the reset a refusal reports.
    assert_eq!(start(&mut s, T0 + S, 1).reset_after_secs, 4);
}

#[test]
fn refused_starts_and_their_refunds_cancel_out() {
    let mut s = Slots::default();
    for _ in 0..5 {
        start(&mut s, T0, 1);
    }
    // The two refusals' refunds come back: they pay the debt and free nothing.
    for _ in 0..2 {
        let d = s.refund(T0 + 1, &q(3), 1);
        assert_eq!((d.count_before, d.count_after, d.remaining), (3, 3, 0));
    }
    assert!(start(&mut s, T0 + 2, 1).over, "still three in flight");
    // That refusal's refund, then one admitted request's end: one slot free.
    s.refund(T0 + 3, &q(3), 1);
    let d = s.refund(T0 + 4, &q(3), 1);
    assert_eq!((d.count_before, d.count_after, d.remaining), (3, 2, 1));
    assert!(!start(&mut s, T0 + 5, 1).over);
}

#[test]
fn a_slot_never_given_back_frees_itself_one_window_after_it_was_taken() {
    let mut s = Slots::default();
    start(&mut s, T0, 1);
    start(&mut s, T0 + 2 * S, 2);
    assert!(start(&mut s, T0 + 4 * S, 1).over);
    // At T0 + 5 s only the first slot is gone (counted from its own start, not a boundary).
    let step = s.decide(T0 + 5 * S, &q(3), 1);
    assert_eq!((step.over, step.expired), (false, 1));
    assert!(start(&mut s, T0 + 6 * S, 1).over);
    let step = s.decide(T0 + 7 * S, &q(3), 0);
    assert_eq!((step.count_before, step.expired), (1, 2));
    // The refusal at 6 s keeps its debt until 11 s.
    assert!(!s.is_stale(T0 + 10 * S));
    assert!(s.is_stale(T0 + 11 * S));
}

#[test]
fn hits_addend_takes_and_gives_that_many_slots() {
    let mut s = Slots::default();
    assert!(!start(&mut s, T0, 2).over);
    assert!(start(&mut s, T0, 2).over, "2 + 2 > 3: none taken");
    assert_eq!((s.held(), s.refused()), (2, 2));
    // A refund of 3: 2 pay the debt, 1 frees a slot.
    let d = s.refund(T0, &q(3), 3);
    assert_eq!((d.count_after, d.remaining), (1, 2));
    // Never below zero.
    assert_eq!(s.refund(T0, &q(3), 10).count_after, 0);
    assert_eq!(s, Slots::default());
}

#[test]
fn without_charge_refused_a_refusal_keeps_no_debt() {
    // HAProxy refunds admitted requests only: every refund gives back a slot.
    let lean = crate::limiter::Quota {
        charge_refused: false,
        ..q(3)
    };
    let mut s = Slots::default();
    for _ in 0..5 {
        s.decide(T0, &lean, 1);
    }
    assert_eq!((s.held(), s.refused()), (3, 0));
    assert_eq!(s.refund(T0, &lean, 1).count_after, 2);
}

#[test]
fn the_debt_lasts_one_window_after_the_latest_refusal() {
    let mut s = Slots::default();
    for _ in 0..4 {
        start(&mut s, T0, 1);
    }
    start(&mut s, T0 + 3 * S, 1);
    assert_eq!(s.refused(), 2);
    s.decide(T0 + 7 * S, &q(3), 0);
    assert_eq!(s.refused(), 2, "the latest refusal was at 3 s");
    s.decide(T0 + 8 * S, &q(3), 0);
    assert_eq!((s.refused(), s.held()), (0, 0));
}

#[test]
fn a_peek_is_over_only_past_the_limit_and_changes_nothing() {
    let mut s = Slots::default();
    for _ in 0..3 {
        start(&mut s, T0, 1);
    }
    let before = s.clone();
    let d = start(&mut s, T0, 0);
    assert!(!d.over);
    assert_eq!(s, before);
    // After a reload lowered the limit to 2, three held are over.
    assert!(s.decide(T0, &q(2), 0).over);
    assert!(s.decide(T0, &q(0), 1).over);
}

#[test]
fn text_round_trips_and_merging_keeps_the_latest_slots() {
    let mut a = Slots::default();
    start(&mut a, T0, 2);
    for _ in 0..3 {
        start(&mut a, T0 + S, 1);
    }
    assert_eq!(Slots::parse(&a.text()), Some(a.clone()));
    assert_eq!(Slots::parse("0 0"), Some(Slots::default()));
    assert_eq!(Slots::parse("0"), None);
    assert_eq!(Slots::parse("1 x"), None);
    // Out of order (a script appends at the end) reads sorted.
    assert_eq!(
        Slots::parse("0 0 9 3").map(|s| s.expiries),
        Some(vec![3, 9].into())
    );
    let mut b = Slots::default();
    start(&mut b, T0 + 2 * S, 1);
    let m = Slots::merge_max(&a, &b);
    assert_eq!(m.held(), 3);
    assert_eq!(m.expiries, [T0 + 5 * S, T0 + 6 * S, T0 + 7 * S]);
    assert_eq!((m.refused, m.refused_until), (2, T0 + 6 * S));
    assert_eq!(Slots::merge_max(&b, &a), m);
}

/// One step of a proxy's traffic: a request's start (of `n` slots), the end of a pending one,
/// a pending one whose end is lost (the proxy killed), or time passing.
#[derive(Clone, Debug)]
enum Op {
    Start(u64),
    End(usize),
    Lose(usize),
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..=3).prop_map(Op::Start),
        3 => any::<usize>().prop_map(Op::End),
        1 => any::<usize>().prop_map(Op::Lose),
        2 => (0u64..3 * S).prop_map(Op::Wait),
        2 => (0u64..S / 5).prop_map(Op::Wait),
    ]
}

/// How soon a refused request's refund comes, at most, in the property test.
const PROMPT: u64 = S / 2;

/// A request the proxy has started and not yet ended: when, how many slots, admitted or not.
struct Pending {
    at: u64,
    n: u64,
    admitted: bool,
}

proptest! {
    /// Whatever order starts, refunds, lost refunds and expiries come in: the slots held never
    /// exceed the limit; they always cover the admitted requests still in flight that are
    /// younger than a window (a request never runs uncounted); every held slot is back within
    /// one window; and one window after the last start on the counter, none is held and no
    /// debt is kept.
    #[test]
    fn slots_never_exceed_the_limit_and_every_slot_is_back_within_a_window(
        limit in 0u32..6,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let w = 5 * S;
        let (mut s, mut now, mut pending) = (Slots::default(), T0, Vec::<Pending>::new());
        let mut last_start = None;
        for op in ops {
            match op {
                Op::Start(n) => {
                    let d = s.decide(now, &q(limit), n);
                    pending.push(Pending { at: now, n, admitted: !d.over });
                    last_start = Some(now);
                }
                Op::End(i) if !pending.is_empty() => {
                    let p = pending.remove(i % pending.len());
                    // A refused request's refund comes promptly (Envoy sends it as it answers
                    // 429), within `PROMPT`; an admitted request ends within a window less
                    // that (the window is chosen longer than the longest request). A later
                    // refund is as good as lost.
                    let by = if p.admitted { p.at + w - PROMPT } else { p.at + PROMPT };
                    if now < by {
                        s.refund(now, &q(limit), p.n);
                    }
                }
                Op::Lose(i) if !pending.is_empty() => {
                    pending.remove(i % pending.len());
                }
                Op::Wait(dt) => now += dt,
                _ => {}
            }
            s.decide(now, &q(limit), 0);
            prop_assert!(s.held() <= u64::from(limit), "{} held, limit {limit}", s.held());
            let in_flight: u64 = pending
                .iter()
                .filter(|p| p.admitted && now < p.at + w - PROMPT)
                .map(|p| p.n)
                .sum();
            prop_assert!(s.held() >= in_flight, "{} held for {in_flight} in flight", s.held());
            prop_assert!(s.expiries.iter().all(|&e| e > now && e <= now + w));
            if last_start.is_none_or(|t| now >= t + w) {
                prop_assert_eq!((s.held(), s.refused()), (0, 0));
                prop_assert!(s.is_stale(now));
            }
        }
    }
}
