//! The sliding window, approximated from two fixed windows (Cloudflare's method; design note
//! 000): the count of the previous window, weighted by how much of it the sliding window still
//! covers, plus the count of the current one.
//!
//! `estimate(t) = previous * (1 - f) + current`, where `f` is the fraction of the current window
//! elapsed at `t`; a call is admitted when `estimate + hits <= limit`. Rejected calls are not
//! counted, so a client sending twice the limit still gets the limit through, steadily; unless
//! the limit charges refused hits (`charge_refused`), when they are counted all the same and the
//! estimate can pass the limit: the debt is waited out as the window slides (a count of
//! `limit + d` in one window refuses everything until `d / (limit + d)` of the next has passed).
//!
//! **Worst case.** In any interval of length `d <= unit`, at most `limit * (1 + d / unit)` hits
//! are admitted (so strictly less than twice the limit in any one unit), and in any fixed window
//! at most `limit`. The bound is approached only when the previous window's traffic all came at
//! its very end; for traffic spread evenly over the previous window the estimate is exact. A
//! fixed window, by contrast, admits twice the limit within an instant around a boundary.
//! (Proof sketch: the admitted hits of window `k` up to fraction `g` are at most
//! `limit - P * (1 - g)`, with `P <= limit` the previous window's count; the previous window can
//! contribute at most `P` to the interval.)
//!
//! `limit_remaining` is `floor(limit - estimate)` after the call; `duration_until_reset` is the
//! time until the current fixed window ends, as for the fixed window.
//!
//! State: one `u128`: the window tag (index mod 2^32) in the top 32 bits, the current count in
//! the next 48, the previous count in the low 48 (saturating; a count passes the limit only
//! with `charge_refused`).

use super::{Decision, Window};

const COUNT_BITS: u32 = 48;
const COUNT_MASK: u128 = (1 << COUNT_BITS) - 1;
const TAG_SHIFT: u32 = 2 * COUNT_BITS;
const TAG_MASK: u128 = (1 << 32) - 1;

pub const EMPTY: u128 = 0;

fn unpack(state: u128) -> (u128, u128, u128) {
    (
        state >> TAG_SHIFT,
        (state >> COUNT_BITS) & COUNT_MASK,
        state & COUNT_MASK,
    )
}

/// Builds a state word from a window index and its two counts (for a store that keeps them
/// elsewhere, such as a Redis hash).
pub(crate) fn state_from_parts(index: u64, current: u64, previous: u64) -> u128 {
    pack(u128::from(index), u128::from(current), u128::from(previous))
}

fn pack(tag: u128, current: u128, previous: u128) -> u128 {
    ((tag & TAG_MASK) << TAG_SHIFT)
        | (current.min(COUNT_MASK) << COUNT_BITS)
        | previous.min(COUNT_MASK)
}

/// The (current, previous) counts as seen from window `index` (older windows count as 0).
fn rolled(state: u128, index: u64) -> (u128, u128) {
    let (tag, current, previous) = unpack(state);
    let index = u128::from(index) & TAG_MASK;
    if tag == index {
        (current, previous)
    } else if (tag + 1) & TAG_MASK == index {
        (0, current)
    } else {
        (0, 0)
    }
}

/// The index of the window containing `now_micros` ([`Window::index`]).
pub(crate) fn window_index(now_micros: u64, unit: Window) -> u64 {
    unit.index(now_micros / 1_000_000)
}

/// Where `now_micros` falls: the index of its window, the µs of the window elapsed, and the
/// window's length in µs (a calendar window's own: a 23-hour day across a daylight-saving
/// change). What [`decide`] weighs the previous window by, here and in Redis's script.
pub fn position(now_micros: u64, unit: Window) -> (u64, u64, u64) {
    let index = window_index(now_micros, unit);
    let start_us = unit.start(index).saturating_mul(1_000_000);
    let len_us = unit
        .end(index)
        .saturating_mul(1_000_000)
        .saturating_sub(start_us)
        .max(1);
    (
        index,
        now_micros.saturating_sub(start_us).min(len_us),
        len_us,
    )
}

/// The (current, previous) counts a state word holds as seen from the window containing
/// `now_micros` (older windows count as 0).
pub fn counts_at(state: u128, now_micros: u64, unit: Window) -> (u64, u64) {
    let (current, previous) = rolled(state, window_index(now_micros, unit));
    let narrow = |c: u128| u64::try_from(c).unwrap_or(u64::MAX);
    (narrow(current), narrow(previous))
}

/// The state holding, for each of the current and the previous window, the larger of the
/// counts `a` and `b` hold for it. Merging another owner's counts this way never counts a hit
/// twice, and never lowers a count.
pub fn merge_max(a: u128, b: u128, now_micros: u64, unit: Window) -> u128 {
    let index = window_index(now_micros, unit);
    let ((ca, pa), (cb, pb)) = (rolled(a, index), rolled(b, index));
    pack(u128::from(index), ca.max(cb), pa.max(pb))
}

/// Whether a state word says nothing about the window containing `now_micros` or the next one
/// (so a store may drop it).
pub(crate) fn is_stale(state: u128, now_micros: u64, unit: Window) -> bool {
    rolled(state, window_index(now_micros, unit)) == (0, 0)
}

/// Applies `hits` at `now_micros` against `limit` per `unit`; `charge_refused` counts the hits
/// of a refused call too.
pub fn decide(
    state: u128,
    now_micros: u64,
    unit: Window,
    limit: u32,
    hits: u64,
    charge_refused: bool,
) -> (Decision, u128) {
    let (index, elapsed_us, unit_us) = position(now_micros, unit);
    let (elapsed_us, unit_us) = (u128::from(elapsed_us), u128::from(unit_us));
    let (current, previous) = rolled(state, index);
    let limit = u128::from(limit);
    // All in units of 1/unit_us of a hit, so no rounding until the end.
    let weighted_previous = previous * (unit_us - elapsed_us);
    let used_before = weighted_previous + current * unit_us;
    let used_after = used_before + u128::from(hits) * unit_us;
    let over = used_after > limit * unit_us;
    let current_after = if over && !charge_refused {
        current
    } else {
        current + u128::from(hits)
    };
    let used = if over { used_before } else { used_after };
    let remaining = (limit * unit_us).saturating_sub(used) / unit_us;
    let to_count = |scaled: u128| u64::try_from(scaled.div_ceil(unit_us)).unwrap_or(u64::MAX);
    let decision = Decision {
        penalized: false,
        count_before: to_count(used_before),
        count_after: to_count(used_after),
        over,
        remaining: if over {
            0
        } else {
            u32::try_from(remaining).unwrap_or(u32::MAX)
        },
        reset_after_secs: unit.reset_after(now_micros / 1_000_000),
        expired: 0,
    };
    (decision, pack(u128::from(index), current_after, previous))
}

/// Takes `hits` off the count of the window containing `now_micros`, floored at 0 (a refund).
/// The previous window's count is not touched: hits charged before the current window began
/// have already started to slide out, and are not given back.
pub fn refund(state: u128, now_micros: u64, unit: Window, hits: u64) -> u128 {
    let index = window_index(now_micros, unit);
    let (tag, current, previous) = unpack(state);
    if tag != u128::from(index) & TAG_MASK {
        return state;
    }
    pack(tag, current.saturating_sub(u128::from(hits)), previous)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Unit;
    use proptest::prelude::*;

    const MIN: u64 = 60_000_000;

    #[test]
    fn the_previous_window_weighs_by_the_part_still_covered() {
        // 10 hits in window 0, then at 25% into window 1 the previous counts 7.5.
        let mut s = EMPTY;
        for _ in 0..10 {
            s = decide(s, 1_000_000, Window::of(Unit::Minute), 10, 1, false).1;
        }
        let (d, _) = decide(s, MIN + MIN / 4, Window::of(Unit::Minute), 10, 2, false);
        assert!(!d.over);
        // 7.5 + 2 = 9.5: half a hit left, so 0 whole hits remain.
        assert_eq!(d.remaining, 0);
        let (d, _) = decide(s, MIN + MIN / 4, Window::of(Unit::Minute), 10, 3, false);
        assert!(d.over, "7.5 + 3 > 10");
        // Two windows later the old count no longer matters.
        let (d, s2) = decide(s, 2 * MIN + 1, Window::of(Unit::Minute), 10, 10, false);
        assert!(!d.over);
        assert!(!is_stale(s2, 2 * MIN + 1, Window::of(Unit::Minute)));
        assert!(is_stale(s2, 4 * MIN, Window::of(Unit::Minute)));
    }

    #[test]
    fn rejected_hits_do_not_count() {
        let mut s = EMPTY;
        let mut admitted = 0;
        for _ in 0..100 {
            let (d, n) = decide(s, 5_000_000, Window::of(Unit::Minute), 10, 1, false);
            s = n;
            admitted += u32::from(!d.over);
        }
        assert_eq!(admitted, 10);
        let (_, current, _) = unpack(s);
        assert_eq!(current, 10);
    }

    #[test]
    fn charged_refusals_are_debt_the_sliding_window_waits_out() {
        // 100 per minute; three reports of 40: the third is over and still counted.
        let mut s = EMPTY;
        let mut over = Vec::new();
        for _ in 0..3 {
            let (d, n) = decide(s, 1_000_000, Window::of(Unit::Minute), 100, 40, true);
            s = n;
            over.push(d.over);
        }
        assert_eq!(over, [false, false, true]);
        assert_eq!(counts_at(s, 1_000_000, Window::of(Unit::Minute)), (120, 0));
        assert!(
            decide(s, 2_000_000, Window::of(Unit::Minute), 100, 0, true)
                .0
                .over
        );
        // In the next window 120 weighs 120 * (1 - f): over until f = 1/6 (10 s).
        assert!(
            decide(s, MIN + 9_000_000, Window::of(Unit::Minute), 100, 0, true)
                .0
                .over
        );
        assert!(
            !decide(s, MIN + 10_000_000, Window::of(Unit::Minute), 100, 0, true)
                .0
                .over
        );
        // Without the setting the third report is dropped and the count stays at 80.
        let (_, s) = decide(EMPTY, 1_000_000, Window::of(Unit::Minute), 100, 80, false);
        let (d, s) = decide(s, 1_000_000, Window::of(Unit::Minute), 100, 40, false);
        assert!(d.over);
        assert_eq!(counts_at(s, 1_000_000, Window::of(Unit::Minute)), (80, 0));
    }

    #[test]
    fn a_refund_gives_back_hits_of_the_current_window_only() {
        let (_, s) = decide(EMPTY, 1_000_000, Window::of(Unit::Minute), 10, 4, false);
        let back = refund(s, 2_000_000, Window::of(Unit::Minute), 3);
        assert_eq!(
            decide(back, 2_000_000, Window::of(Unit::Minute), 10, 0, false)
                .0
                .remaining,
            9
        );
        assert_eq!(refund(s, MIN + 1, Window::of(Unit::Minute), 3), s);
        // Floored at 0: a larger refund leaves the current window empty, never in credit.
        let w = Window::of(Unit::Minute);
        let emptied = refund(s, 2_000_000, w, 40);
        assert_eq!(counts_at(emptied, 2_000_000, w), (0, 0));
        assert_eq!(decide(emptied, 2_000_000, w, 10, 0, false).0.remaining, 10);
        assert!(decide(emptied, 2_000_000, w, 10, 11, false).0.over);
    }

    #[test]
    fn limit_zero_admits_nothing_but_peeks() {
        assert!(
            decide(EMPTY, 0, Window::of(Unit::Second), 0, 1, false)
                .0
                .over
        );
        assert!(
            !decide(EMPTY, 0, Window::of(Unit::Second), 0, 0, false)
                .0
                .over
        );
    }

    #[test]
    fn merging_keeps_the_larger_count_of_each_window() {
        // a: 4 in window 0 then 1 in window 1; b: 6 in window 1 (an owner that took over).
        let (_, a) = decide(EMPTY, 1_000_000, Window::of(Unit::Minute), 10, 4, false);
        let (_, a) = decide(a, MIN + 1, Window::of(Unit::Minute), 10, 1, false);
        let (_, b) = decide(EMPTY, MIN + 2, Window::of(Unit::Minute), 10, 6, false);
        let m = merge_max(a, b, MIN + 3, Window::of(Unit::Minute));
        assert_eq!(counts_at(m, MIN + 3, Window::of(Unit::Minute)), (6, 4));
        assert_eq!(m, merge_max(b, a, MIN + 3, Window::of(Unit::Minute)));
        // Seen from the next window the current count becomes the previous one.
        assert_eq!(counts_at(m, 2 * MIN, Window::of(Unit::Minute)), (0, 6));
        assert_eq!(window_index(2 * MIN, Window::of(Unit::Minute)), 2);
    }

    /// An exact log of admitted hits, the oracle for the bound.
    fn admitted_in(log: &[(u64, u64)], from: u64, to: u64) -> u64 {
        log.iter()
            .filter(|(t, _)| *t > from && *t <= to)
            .map(|(_, h)| h)
            .sum()
    }

    proptest! {
        /// Never more than `limit * (1 + d/unit)` in any interval of length d <= unit, and
        /// never more than `limit` in one fixed window.
        #[test]
        fn admitted_hits_respect_the_documented_bound(
            limit in 1u32..40,
            steps in proptest::collection::vec((0u64..4_000_000, 1u64..4), 1..300),
        ) {
            let unit = Window::of(Unit::Second);
            let unit_us = 1_000_000u64;
            let mut now = 10 * unit_us;
            let mut state = EMPTY;
            let mut log = Vec::new();
            for (dt, hits) in steps {
                now += dt / 8;
                let (d, s) = decide(state, now, unit, limit, hits, false);
                state = s;
                if !d.over {
                    log.push((now, hits));
                }
            }
            let l = u64::from(limit);
            for &(t, _) in &log {
                // Intervals ending at each admission, of several lengths.
                for d in [unit_us / 10, unit_us / 2, unit_us] {
                    let n = admitted_in(&log, t.saturating_sub(d), t);
                    prop_assert!(n * unit_us <= l * (unit_us + d), "{n} in {d}us (limit {l})");
                }
                let w = t / unit_us * unit_us;
                prop_assert!(admitted_in(&log, w - 1, w + unit_us - 1) <= l);
            }
        }
    }
}
