//! The keys closest to or over their limits right now, for the debug port's status page: a
//! bounded table of [`HotKeys::CAPACITY`] entries, written only by decisions that leave a
//! counter at least [`HotKeys::NEAR`] full, and only when its lock is free (a decision never
//! waits for it: under a flood some records are skipped, never the decision). An entry leaves
//! when its counter resets, or when a fuller one needs its place.

use std::sync::Mutex;

use crate::clock::Timestamp;
use crate::limiter::{Decision, Quota};

/// One hot counter.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HotKey {
    pub key: String,
    pub quota: Quota,
    /// What it held after the decision, and whether that decision was refused.
    pub count: u64,
    pub over: bool,
    /// Refused by a penalty in force (`penalty_seconds`): `until` is when it ends, and
    /// `count` what the counter last said.
    pub penalized: bool,
    /// `count / limit` (over 1 when over).
    pub fullness: f64,
    /// When the counter resets (the decision's `duration_until_reset`).
    pub until: Timestamp,
}

#[derive(Debug, Default)]
pub(crate) struct HotKeys {
    entries: Mutex<Vec<HotKey>>,
}

impl HotKeys {
    /// The most entries kept.
    pub(crate) const CAPACITY: usize = 32;
    /// The fullness (count / limit) from which a decision is recorded, as (numerator,
    /// denominator): 4/5, 80%; in integers, so the decision's test is one multiplication a side.
    pub(crate) const NEAR: (u64, u64) = (4, 5);

    /// Records `decision` on `key` at `now` when it leaves the counter at least [`Self::NEAR`]
    /// full, unless another thread holds the table. Most decisions leave a counter cooler: they
    /// return after one integer comparison.
    #[inline]
    pub(crate) fn record(&self, key: &str, quota: &Quota, decision: &Decision, now: Timestamp) {
        let (num, den) = Self::NEAR;
        let limit = u64::from(quota.requests_per_unit);
        if !decision.over && decision.count_after.saturating_mul(den) < limit.saturating_mul(num) {
            return;
        }
        self.record_hot(key, quota, decision, now);
    }

    #[cold]
    fn record_hot(&self, key: &str, quota: &Quota, decision: &Decision, now: Timestamp) {
        let Ok(mut entries) = self.entries.try_lock() else {
            return;
        };
        let limit = f64::from(quota.requests_per_unit.max(1));
        #[allow(clippy::cast_precision_loss, reason = "a ratio for display")]
        let fullness = match decision.penalized {
            // Its counter was not read: at least as hot as any key over its limit.
            true => f64::MAX,
            false => decision.count_after as f64 / limit,
        };
        let until = Timestamp::from_micros(
            now.micros()
                .saturating_add(decision.reset_after_secs.saturating_mul(1_000_000)),
        );
        // A key already listed is updated in place: no allocation while it stays hot.
        let update = |e: &mut HotKey| {
            if !decision.penalized {
                e.count = decision.count_after;
            }
            e.penalized = decision.penalized;
            e.over = decision.over;
            e.fullness = fullness;
            e.until = until;
        };
        if let Some(e) = entries
            .iter_mut()
            .find(|e| e.key == key && e.quota == *quota)
        {
            update(e);
            return;
        }
        entries.retain(|e| e.until > now);
        let place = if entries.len() < Self::CAPACITY {
            entries.push(HotKey {
                key: String::new(),
                quota: *quota,
                count: 0,
                over: false,
                penalized: false,
                fullness,
                until,
            });
            entries.last_mut()
        } else {
            entries
                .iter_mut()
                .min_by(|a, b| a.fullness.total_cmp(&b.fullness))
                .filter(|e| e.fullness < fullness)
        };
        if let Some(e) = place {
            e.key.clear();
            e.key.push_str(key);
            e.quota = *quota;
            update(e);
        }
    }

    /// The entries whose counters have not reset by `now`, fullest first.
    pub(crate) fn snapshot(&self, now: Timestamp) -> Vec<HotKey> {
        let mut out: Vec<HotKey> = self
            .entries
            .lock()
            .map(|e| e.iter().filter(|e| e.until > now).cloned().collect())
            .unwrap_or_default();
        out.sort_by(|a, b| b.fullness.total_cmp(&a.fullness));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Unit;

    fn decision(count: u64, limit: u64, reset: u64) -> Decision {
        Decision {
            penalized: false,
            count_after: count,
            count_before: count.saturating_sub(1),
            over: count > limit,
            remaining: 0,
            reset_after_secs: reset,
            expired: 0,
        }
    }

    #[test]
    fn keeps_the_fullest_keys_until_they_reset() {
        let hot = HotKeys::default();
        let q = Quota::fixed(10, Unit::Minute);
        let t0 = Timestamp::from_secs(1_000);
        hot.record("cold", &q, &decision(5, 10, 30), t0);
        hot.record("warm", &q, &decision(9, 10, 30), t0);
        hot.record("over", &q, &decision(12, 10, 5), t0);
        let keys: Vec<String> = hot.snapshot(t0).into_iter().map(|h| h.key).collect();
        assert_eq!(keys, ["over", "warm"], "below 80% is not recorded");
        // The over key resets after 5 s.
        let later = Timestamp::from_secs(1_006);
        let keys: Vec<String> = hot.snapshot(later).into_iter().map(|h| h.key).collect();
        assert_eq!(keys, ["warm"]);
        // Full table: a fuller key takes the coolest place, a cooler one is dropped.
        for i in 0..HotKeys::CAPACITY {
            hot.record(&format!("k{i}"), &q, &decision(8, 10, 30), t0);
        }
        hot.record("hotter", &q, &decision(20, 10, 30), t0);
        hot.record("cooler", &q, &decision(8, 10, 30), t0);
        let snap = hot.snapshot(t0);
        assert_eq!(snap.len(), HotKeys::CAPACITY);
        assert_eq!(snap[0].key, "hotter");
        assert!(snap.iter().all(|h| h.key != "cooler"));
    }
}
