//! The epoch-aligned fixed window of envoyproxy/ratelimit.
//!
//! A window starts at `(now / unit) * unit` seconds since the epoch, or for a calendar window
//! at local midnight of its first day ([`Window::start`]). Every call adds its hits,
//! admitted or not (the Go service's counting, kept for compatibility), and a call is over the
//! limit when the count *after* adding its hits is strictly greater than the limit; so a limit
//! of 0 is always over, and a peek (0 hits) is over only once the count already exceeds it.
//!
//! The state is one `u64`: the low [`COUNT_BITS`] bits hold the count (saturating), the high
//! bits a tag of the window it belongs to (`window index mod 2^24`). A counter whose tag is not
//! the current window's is treated as empty, so a new window needs no reset pass; stores sweep
//! stale counters long before the tag could wrap (2^24 windows: 194 days of one-second windows).

use super::{Decision, Window};

/// Bits of the state word that hold the count. 2^40 exceeds every u32 limit, so saturation
/// never hides an over-limit decision.
pub(crate) const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const TAG_MASK: u64 = (1 << (64 - COUNT_BITS)) - 1;

/// The state of a counter that has never been hit (tag 0, count 0). A real window with tag 0
/// and count 0 means the same thing, so the two need not be told apart.
pub const EMPTY: u64 = 0;

/// The tag of the window that contains `now_secs`.
pub(crate) fn window_tag(now_secs: u64, unit: Window) -> u64 {
    unit.index(now_secs) & TAG_MASK
}

/// The start of the window that contains `now_secs`, in seconds since the epoch.
pub fn window_start(now_secs: u64, unit: Window) -> u64 {
    unit.start(unit.index(now_secs))
}

/// The count a state word holds for the window containing `now_secs` (0 if it is stale).
pub fn current_count(state: u64, now_secs: u64, unit: Window) -> u64 {
    if state >> COUNT_BITS == window_tag(now_secs, unit) {
        state & COUNT_MASK
    } else {
        0
    }
}

/// Whether a state word belongs to an earlier window than the one containing `now_secs`
/// (so a store may drop it).
pub(crate) fn is_stale(state: u64, now_secs: u64, unit: Window) -> bool {
    state >> COUNT_BITS != window_tag(now_secs, unit)
}

/// The state word of a counter holding `count` in the window containing `now_secs` (for a
/// store that keeps plain counts, such as Redis).
pub fn state_with_count(count: u64, now_secs: u64, unit: Window) -> u64 {
    let count = if count > COUNT_MASK {
        COUNT_MASK
    } else {
        count
    };
    (window_tag(now_secs, unit) << COUNT_BITS) | count
}

/// The state holding the larger of the two counts `a` and `b` hold for the window containing
/// `now_secs` (a stale one counts 0). Merging a count another owner kept for the same window
/// this way never counts a hit twice, and never lowers a count.
pub fn merge_max(a: u64, b: u64, now_secs: u64, unit: Window) -> u64 {
    let (ca, cb) = (
        current_count(a, now_secs, unit),
        current_count(b, now_secs, unit),
    );
    state_with_count(if ca > cb { ca } else { cb }, now_secs, unit)
}

/// Applies `hits` at `now_secs` against `limit` per `unit`: returns the decision and the new
/// state word.
pub fn decide(state: u64, now_secs: u64, unit: Window, limit: u32, hits: u64) -> (Decision, u64) {
    let (index, end) = unit.index_and_end(now_secs);
    let tag = index & TAG_MASK;
    let before = if state >> COUNT_BITS == tag {
        state & COUNT_MASK
    } else {
        0
    };
    let after = before.saturating_add(hits).min(COUNT_MASK);
    let over = after > u64::from(limit);
    let remaining = if over {
        0
    } else {
        // `after <= limit` here, so this fits in u32.
        (u64::from(limit) - after) as u32
    };
    let decision = Decision {
        penalized: false,
        count_after: after,
        count_before: before,
        over,
        remaining,
        reset_after_secs: end.saturating_sub(now_secs).max(1),
        expired: 0,
    };
    let new_state = (tag << COUNT_BITS) | after;
    (decision, new_state)
}

/// Takes `hits` off the count of the window containing `now_secs`, floored at 0 (a refund:
/// hits a request gave back). A count of an earlier window is left as it is: that window has
/// ended, and the refund has nothing to take from the current one.
pub fn refund(state: u64, now_secs: u64, unit: Window, hits: u64) -> u64 {
    if is_stale(state, now_secs, unit) {
        return state;
    }
    let count = state & COUNT_MASK;
    let left = count.saturating_sub(hits);
    (state & !COUNT_MASK) | left
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Unit;
    use proptest::prelude::*;

    #[test]
    fn calls_up_to_the_limit_pass_and_the_next_is_over() {
        let mut state = EMPTY;
        for i in 1..=20u32 {
            let (d, s) = decide(state, 1234, Window::of(Unit::Minute), 20, 1);
            state = s;
            assert!(!d.over, "call {i}");
            assert_eq!(d.remaining, 20 - i);
        }
        let (d, _) = decide(state, 1234, Window::of(Unit::Minute), 20, 1);
        assert!(d.over);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.count_after, 21);
    }

    #[test]
    fn limit_zero_is_always_over_and_peeks_do_not_count() {
        let (d, _) = decide(EMPTY, 10, Window::of(Unit::Second), 0, 1);
        assert!(d.over);
        // A peek at a count equal to the limit is not over, and does not move the count.
        let (_, s) = decide(EMPTY, 10, Window::of(Unit::Second), 3, 3);
        let (peek, s2) = decide(s, 10, Window::of(Unit::Second), 3, 0);
        assert!(!peek.over);
        assert_eq!(peek.remaining, 0);
        assert_eq!(s, s2);
        let (next, _) = decide(s2, 10, Window::of(Unit::Second), 3, 1);
        assert!(next.over);
    }

    #[test]
    fn windows_are_epoch_aligned_and_reset_counts_down() {
        // The reference's example: MINUTE at now=2222 resets in 58 s; window starts at 2220.
        let (d, _) = decide(EMPTY, 2222, Window::of(Unit::Minute), 10, 1);
        assert_eq!(d.reset_after_secs, 58);
        assert_eq!(window_start(1234, Window::of(Unit::Minute)), 1200);
        // At the first second of a window the whole unit remains.
        let (d, _) = decide(EMPTY, 1200, Window::of(Unit::Minute), 10, 1);
        assert_eq!(d.reset_after_secs, 60);
    }

    #[test]
    fn a_new_window_starts_from_zero() {
        let (_, s) = decide(EMPTY, 59, Window::of(Unit::Minute), 1, 5);
        assert!(!is_stale(s, 59, Window::of(Unit::Minute)));
        assert!(is_stale(s, 60, Window::of(Unit::Minute)));
        let (d, _) = decide(s, 60, Window::of(Unit::Minute), 1, 1);
        assert_eq!(d.count_before, 0);
        assert!(!d.over);
    }

    #[test]
    fn huge_addends_saturate_instead_of_wrapping() {
        let (d, s) = decide(EMPTY, 0, Window::of(Unit::Hour), u32::MAX, u64::MAX);
        assert!(d.over);
        let (d2, _) = decide(s, 0, Window::of(Unit::Hour), u32::MAX, u64::MAX);
        assert!(d2.over);
        assert_eq!(d2.count_after, COUNT_MASK);
    }

    #[test]
    fn merging_keeps_the_larger_count_of_the_current_window() {
        let (_, a) = decide(EMPTY, 1234, Window::of(Unit::Minute), 10, 3);
        let (_, b) = decide(EMPTY, 1235, Window::of(Unit::Minute), 10, 5);
        assert_eq!(
            current_count(
                merge_max(a, b, 1236, Window::of(Unit::Minute)),
                1236,
                Window::of(Unit::Minute)
            ),
            5
        );
        assert_eq!(
            merge_max(a, b, 1236, Window::of(Unit::Minute)),
            merge_max(b, a, 1236, Window::of(Unit::Minute))
        );
        // A count of an earlier window is nothing now.
        let (_, old) = decide(EMPTY, 1100, Window::of(Unit::Minute), 10, 9);
        assert_eq!(
            current_count(
                merge_max(a, old, 1236, Window::of(Unit::Minute)),
                1236,
                Window::of(Unit::Minute)
            ),
            3
        );
    }

    #[test]
    fn a_refund_takes_hits_off_the_current_window_floored_at_zero() {
        let w = Window::of(Unit::Hour);
        let (_, mut s) = decide(EMPTY, 7200, w, 3, 3);
        // The fourth is over, and counted (Go's counting).
        let (d, s4) = decide(s, 7201, w, 3, 1);
        assert!(d.over);
        assert_eq!(d.count_after, 4);
        s = refund(s4, 7202, w, 1);
        assert_eq!(current_count(s, 7202, w), 3);
        // Floored at 0: a refund of more than the count leaves 0, never a credit.
        s = refund(s, 7203, w, 5);
        assert_eq!(current_count(s, 7203, w), 0);
        assert!(!is_stale(s, 7203, w));
        for _ in 0..3 {
            let (d, next) = decide(s, 7204, w, 3, 1);
            assert!(!d.over);
            s = next;
        }
        assert!(decide(s, 7205, w, 3, 1).0.over);
        // A refund in a later window leaves the earlier count alone (it is gone anyway).
        let later = refund(s4, 10_800, w, 2);
        assert_eq!(later, s4);
        assert_eq!(current_count(later, 10_800, w), 0);
    }

    proptest! {
        /// A refund of `r` after `n` hits leaves `max(n - r, 0)`, in the window's tag.
        #[test]
        fn a_refund_floors_the_count_at_zero(n in 0u64..100, r in 0u64..200, limit in 0u32..50) {
            let w = Window::of(Unit::Minute);
            let (_, s) = decide(EMPTY, 600, w, limit, n);
            let after = refund(s, 659, w, r);
            prop_assert_eq!(current_count(after, 659, w), n.saturating_sub(r));
            prop_assert_eq!(after >> COUNT_BITS, s >> COUNT_BITS);
        }

        /// For any sequence of (time, hits) on one key, the hits admitted in each window never
        /// exceed the limit, and never fall short of it while hits remain: a call is admitted
        /// exactly when the window's running total including it stays within the limit.
        #[test]
        fn admitted_hits_per_window_match_the_limit(
            limit in 0u32..50,
            steps in proptest::collection::vec((0u64..3, 0u64..6), 1..200),
        ) {
            let unit = Window::of(Unit::Minute);
            let mut now = 1_000_000u64;
            let mut state = EMPTY;
            let mut window = window_start(now, unit);
            let (mut admitted, mut offered) = (0u64, 0u64);
            for (dt_secs, hits) in steps {
                now += dt_secs * 7;
                if window_start(now, unit) != window {
                    window = window_start(now, unit);
                    admitted = 0;
                    offered = 0;
                }
                let (d, s) = decide(state, now, unit, limit, hits);
                state = s;
                offered += hits;
                prop_assert_eq!(d.count_after, offered);
                if !d.over {
                    admitted += hits;
                }
                prop_assert!(admitted <= u64::from(limit));
                // Never short: while the offered total fits, every call was admitted.
                if offered <= u64::from(limit) {
                    prop_assert_eq!(admitted, offered);
                }
            }
        }
    }
}
