//! The concurrency limit (`algorithm: concurrency`): at most `requests_per_unit` requests in
//! flight per counter. A request's start takes a slot, its end's refund (`is_negative_hits`)
//! gives it back, and a slot that is never given back frees itself one window
//! (`unit × unit_multiplier`) after it was taken, counted from its own taking time, not from a
//! window boundary: a lost refund costs one slot for one window, never more.
//!
//! **The rule, exactly.** The state is the expiry time of each held slot (the time it was
//! taken plus one window), and a debt of refused hits. At every step the slots whose expiry is
//! at or before `now` are dropped first (they are *expired*: their refund never came), and
//! the debt is dropped once one window has passed since the latest refusal. Then:
//!
//! - **a start** of `n` hits takes `n` slots if `held + n <= limit`, each expiring at
//!   `now + window`; otherwise it takes none, is refused, and adds `n` to the debt (unless the
//!   limit says `charge_refused: false`: for a proxy that refunds admitted requests only, such
//!   as HAProxy's response event, there is no refund to wait for);
//! - **a refund** of `n` first pays off the debt (up to `n`), and gives back the rest as held
//!   slots, the oldest first, never below zero;
//! - **a peek** (0 hits) changes nothing, and is over only when more than `limit` slots are
//!   held (after a reload lowered the limit).
//!
//! Why the debt: Envoy sends the end-of-request refund for requests it refused too, and the
//! service cannot tell one refund from another. Without the debt, a burst of refusals would
//! give back slots that admitted requests still hold. With it, a refused start and its refund
//! cancel out. A refund of an admitted request that arrives while a refusal's refund is still
//! on its way pays off the debt instead, and its slot is freed by the refusal's refund a moment
//! later (a refused request ends at once): never more in flight than the limit, only a slot
//! held a little longer. A proxy that never refunds refused requests leaves a debt that lasts
//! one window after its latest refusal, and meanwhile slots free themselves by expiry.
//!
//! **The guarantee** (the property test in `concurrency/tests.rs`): whatever order starts,
//! refunds, lost refunds and expiries come in, no more than `limit` slots are held, and every
//! admitted request still running holds one, provided that a refused request's refund comes
//! within some time `p` of its refusal (Envoy sends it as it answers 429) and every admitted
//! request ends within the window less `p`. Choose the window longer than the longest request
//! by far: a refund that comes after its slot expired gives back another request's slot.
//!
//! Why the oldest slot goes back: slots are interchangeable, and keeping the most recent
//! taking times means every request still in flight and younger than a window keeps a slot
//! counted for it whichever request ended.
//!
//! **Bounds.** Only admitted starts add slots, so a counter holds at most `requests_per_unit`
//! expiry times (8 bytes each in memory, at most 17 in the text form) and two numbers for the
//! debt; the config refuses a concurrency limit above [`MAX_SLOTS`]. Every slot, and the debt,
//! is gone one window after the last start (admitted or refused) on the counter.
//!
//! **Answers.** `remaining` is the number of free slots after the call; `duration_until_reset`
//! the time until the oldest held slot expires (a whole window when none is held), at least
//! one second. A refund answers a peek at what it left, as on the other algorithms, with
//! `count_before` the slots held before the refund and `count_after` those held after it.

use std::collections::VecDeque;

use super::{Decision, Quota};

/// The largest `requests_per_unit` a concurrency limit may have: the most slots (each an
/// expiry time) one counter can hold.
pub const MAX_SLOTS: u32 = 65_536;

const MICROS_PER_SEC: u64 = 1_000_000;

/// One counter's slots: the expiry times of the held slots, oldest first, and the debt of
/// refused hits whose refunds have not come back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slots {
    /// Expiry times in µs since the epoch, ascending.
    expiries: VecDeque<u64>,
    /// Refused hits not yet paid off by a refund.
    refused: u64,
    /// When the debt is dropped: one window after the latest refusal (µs).
    refused_until: u64,
}

impl Slots {
    /// Slots held (expired ones included until the next step drops them).
    pub fn held(&self) -> u64 {
        self.expiries.len() as u64
    }

    /// The refused hits still waiting for their refunds.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Whether nothing is held and no debt is kept at `now_us`, so a store may drop it.
    pub(crate) fn is_stale(&self, now_us: u64) -> bool {
        self.expiries.back().is_none_or(|&e| e <= now_us) && self.refused_until <= now_us
    }

    /// When everything this state holds has expired (µs): a remote store's key expiry.
    pub(crate) fn expires_at(&self) -> u64 {
        self.expiries
            .back()
            .copied()
            .unwrap_or(0)
            .max(self.refused_until)
    }

    /// Drops the slots expired at `now_us`, and the debt once its time is up; returns how many
    /// slots expired.
    fn expire(&mut self, now_us: u64) -> u64 {
        let gone = self.expiries.partition_point(|&e| e <= now_us);
        self.expiries.drain(..gone);
        if self.refused_until <= now_us {
            self.refused = 0;
            self.refused_until = 0;
        }
        gone as u64
    }

    /// Applies a start of `hits` slots at `now_us` on a counter of `quota` (a peek when `hits`
    /// is 0). The decision's `expired` counts the slots that expired before it (each a lost
    /// refund). A refused start is kept as a debt unless the quota says `charge_refused: false`
    /// (a proxy that refunds admitted requests only).
    pub fn decide(&mut self, now_us: u64, quota: &Quota, hits: u64) -> Decision {
        let (window_secs, limit) = (quota.window().secs(), quota.requests_per_unit);
        let expired = self.expire(now_us);
        let before = self.held();
        let after = before.saturating_add(hits);
        let limit = u64::from(limit);
        let over = if hits == 0 {
            before > limit
        } else {
            after > limit
        };
        let until = now_us.saturating_add(window_secs.saturating_mul(MICROS_PER_SEC));
        if hits > 0 && !over {
            let at = self.expiries.partition_point(|&e| e <= until);
            for _ in 0..hits {
                self.expiries.insert(at, until);
            }
        } else if hits > 0 && quota.charge_refused {
            self.refused = self.refused.saturating_add(hits);
            self.refused_until = self.refused_until.max(until);
        }
        self.answer(now_us, window_secs, limit, (before, after), over, expired)
    }

    /// Gives back `hits` at `now_us`: the debt is paid off first, then the oldest slots.
    /// Answers a peek at what is left (and the slots that expired before it).
    pub fn refund(&mut self, now_us: u64, quota: &Quota, hits: u64) -> Decision {
        let (window_secs, limit) = (quota.window().secs(), quota.requests_per_unit);
        let expired = self.expire(now_us);
        let before = self.held();
        let paid = hits.min(self.refused);
        self.refused -= paid;
        if self.refused == 0 {
            self.refused_until = 0;
        }
        let freed = usize::try_from(hits - paid)
            .unwrap_or(usize::MAX)
            .min(self.expiries.len());
        self.expiries.drain(..freed);
        let after = self.held();
        let limit = u64::from(limit);
        let over = after > limit;
        self.answer(now_us, window_secs, limit, (before, after), over, expired)
    }

    /// The decision after a step that left `self`: `counts` before and after its hits.
    fn answer(
        &self,
        now_us: u64,
        window_secs: u64,
        limit: u64,
        (count_before, count_after): (u64, u64),
        over: bool,
        expired: u64,
    ) -> Decision {
        let held = self.held();
        let remaining = if over {
            0
        } else {
            u32::try_from(limit.saturating_sub(held)).unwrap_or(u32::MAX)
        };
        let reset_after_secs = match self.expiries.front() {
            Some(&oldest) => oldest.saturating_sub(now_us).div_ceil(MICROS_PER_SEC),
            None => window_secs,
        };
        Decision {
            penalized: false,
            count_after,
            count_before,
            over,
            remaining,
            reset_after_secs: reset_after_secs.max(1),
            expired: u32::try_from(expired).unwrap_or(u32::MAX),
        }
    }

    /// The state holding the more slots of `a` and `b` (the latest expiries of both, as many
    /// as the larger holds) and the larger debt with the later end: merging another owner's
    /// state this way never counts a slot twice and never frees one.
    pub fn merge_max(a: &Slots, b: &Slots) -> Slots {
        let keep = a.expiries.len().max(b.expiries.len());
        let mut all: Vec<u64> = a.expiries.iter().chain(&b.expiries).copied().collect();
        all.sort_unstable();
        let expiries = all[all.len() - keep..].iter().copied().collect();
        Slots {
            expiries,
            refused: a.refused.max(b.refused),
            refused_until: a.refused_until.max(b.refused_until),
        }
    }

    /// The text a remote store keeps (Redis, the write-behind copy): decimal numbers separated
    /// by spaces, the debt, its end (µs), then each slot's expiry (µs), oldest first:
    /// `"0 0"` holds nothing; `"2 1700000005000000 1700000003000000"` holds one slot and a
    /// debt of 2.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut out = format!("{} {}", self.refused, self.refused_until);
        for e in &self.expiries {
            let _ = write!(out, " {e}");
        }
        out
    }

    /// The state a [`Slots::text`] holds; `None` if it is not one. Expiries out of order are
    /// sorted (a script appends at the end), and at most `MAX_SLOTS` are read.
    pub fn parse(text: &str) -> Option<Slots> {
        let mut numbers = text.split_ascii_whitespace().map(|n| n.parse::<u64>());
        let refused = numbers.next()?.ok()?;
        let refused_until = numbers.next()?.ok()?;
        let mut expiries: Vec<u64> = numbers
            .take(MAX_SLOTS as usize)
            .collect::<Result<_, _>>()
            .ok()?;
        expiries.sort_unstable();
        Some(Slots {
            expiries: expiries.into(),
            refused,
            refused_until,
        })
    }
}

/// The answer to `hits` on a concurrency limit whose slots could not be read: refused, no
/// slot free (fail closed).
pub fn refusal(quota: &Quota, hits: u64) -> Decision {
    Decision {
        penalized: false,
        count_after: u64::from(quota.requests_per_unit).saturating_add(hits),
        count_before: u64::from(quota.requests_per_unit),
        over: true,
        remaining: 0,
        reset_after_secs: quota.window().secs().max(1),
        expired: 0,
    }
}

#[cfg(test)]
mod tests;
