//! One bucket's holders (the Envoys reporting it) and the split of its rate among them. Pure:
//! times are passed in, nothing here does I/O or reads a clock.
//!
//! **Demand** is what an Envoy *attempted*: allowed plus denied requests per second over the
//! time between its reports as this server received them (Ably's lesson: the admitted rate
//! follows the assignment and would make shares oscillate). Envoy's own `time_elapsed` is in
//! whole seconds and is not used. Samples are averaged with the previous estimate (half each);
//! an Envoy not yet measured claims the whole rate, so a new Envoy gets an equal share at once.
//!
//! **The split** is max-min fair ([`crate::limiter::share`], Doorman's algorithm) over
//! claims of demand plus [`HEADROOM_PCT`], so an Envoy asking less than an equal share gets what
//! it asks with room to grow; what nobody claims is spread equally over the live holders.
//!
//! **When.** Not on every report: after every [`SPLITS_PER_ROUND`]th of a round of reports (a
//! round: as many as holders), at once for a new holder or a new rate ([`Bucket::split_due`]),
//! so N Envoys on one bucket cost O(N log N) a round, not N² log N.
//!
//! **Stability.** Envoy starts a new, full token bucket whenever an assignment changes, so each
//! change lets up to one burst through. A holder therefore keeps its assignment while the new
//! fair part is within [`HYSTERESIS_PCT`] of it, unless keeping it would put the sum past the
//! rate, in which case every kept part above its target comes down to it.
//!
//! **Bound.** The holders' assignments never sum past the rate: a holder whose stream ended keeps
//! its assignment (its Envoy enforces it until it expires) and that part is reserved until
//! then; the live holders split the rest.

use std::sync::Arc;

use super::assign::Rate;
use crate::descriptor::Entry;
use crate::limiter::share::max_min_fair;

/// An Envoy's claim is its demand plus this much (percent).
pub(crate) const HEADROOM_PCT: u64 = 5;
/// An assignment is kept while its fair part moves by at most this much (percent).
pub(crate) const HYSTERESIS_PCT: u64 = 5;
/// A bucket is split again after every 1/SPLITS_PER_ROUND of a round of its holders' reports
/// ([`Bucket::split_due`]): a demand change reaches the split within that part of a reporting
/// interval.
pub(crate) const SPLITS_PER_ROUND: u64 = 8;
/// Reports closer together than this are added to the next sample (an Envoy sends a new
/// bucket's first report at once, then the bucket with all the others on its timer).
pub(crate) const MIN_SAMPLE_US: u64 = 250_000;

/// One Envoy's part of a bucket.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Holder {
    /// The node serving the Envoy's stream, when it is another Sluice node (this node owns the
    /// bucket and splits it across every node's Envoys); `None` for this node's own streams.
    pub node: Option<Arc<str>>,
    /// The stream the Envoy reports on (numbered by its node).
    pub stream: u64,
    /// The bucket id as the Envoy sent it (entries in descriptor order), for its assignments.
    pub id: Arc<[Entry]>,
    /// Attempted requests per second, smoothed; `None` until a first sample.
    pub demand: Option<f64>,
    counted: u64,
    since_us: u64,
    /// Tokens per fill interval assigned (0: denied).
    pub assigned: u64,
    /// When the last assignment sent to the Envoy expires there.
    pub expires_us: u64,
    /// The stream ended: the assignment stays reserved until it expires, and claims nothing.
    pub gone: bool,
    /// Since when the Envoy has reported no attempt at all.
    pub quiet_since_us: Option<u64>,
    /// Whether `assigned` was decided by the bucket's owner: false for a new holder of a bucket
    /// another node owns, until the owner's first answer (nothing is sent to the Envoy before).
    pub confirmed: bool,
}

impl Holder {
    pub(crate) fn new(stream: u64, id: Arc<[Entry]>, now_us: u64) -> Self {
        Holder {
            node: None,
            stream,
            id,
            demand: None,
            counted: 0,
            since_us: now_us,
            assigned: 0,
            expires_us: now_us,
            gone: false,
            quiet_since_us: None,
            confirmed: true,
        }
    }

    /// Another node's Envoy, as that node reported it to this owner: what it holds now is where
    /// the split starts from.
    pub(crate) fn remote(
        node: Arc<str>,
        stream: u64,
        id: Arc<[Entry]>,
        assigned: u64,
        now_us: u64,
    ) -> Self {
        Holder {
            node: Some(node),
            assigned,
            ..Holder::new(stream, id, now_us)
        }
    }

    /// Counts a report of `attempted` requests (allowed plus denied) received at `now_us`.
    pub(crate) fn report(&mut self, attempted: u64, now_us: u64) {
        self.counted = self.counted.saturating_add(attempted);
        if attempted == 0 {
            self.quiet_since_us.get_or_insert(now_us);
        } else {
            self.quiet_since_us = None;
        }
        let elapsed = now_us.saturating_sub(self.since_us);
        if elapsed < MIN_SAMPLE_US {
            return;
        }
        let sample = self.counted as f64 * 1e6 / elapsed as f64;
        self.demand = Some(match self.demand {
            Some(d) => (d + sample) / 2.0,
            None => sample,
        });
        self.counted = 0;
        self.since_us = now_us;
    }

    /// Whether this holder is the Envoy on `stream` of `node` (`None`: this node) with bucket id
    /// `id`.
    pub(crate) fn is(&self, node: Option<&str>, stream: u64, id: &[Entry]) -> bool {
        self.stream == stream && self.node.as_deref() == node && *self.id == *id
    }
}

/// A bucket: its rate and its holders.
#[derive(Clone, Debug)]
pub(crate) struct Bucket {
    pub rate: Rate,
    pub holders: Vec<Holder>,
    /// Reports counted since the last split ([`Bucket::split_due`]).
    reports: u64,
    /// The rate changed since the last split: the next report splits.
    rate_changed: bool,
    /// Splits run so far (counted for tests).
    pub splits: u64,
}

impl Bucket {
    pub(crate) fn new(rate: Rate) -> Self {
        Bucket {
            rate,
            holders: Vec::new(),
            reports: 0,
            rate_changed: false,
            splits: 0,
        }
    }

    /// Counts a report of a holder already in the bucket; whether it should split the rate
    /// again: once every [`SPLITS_PER_ROUND`]th of a round of reports (as many as holders), or
    /// at once after the rate changed. A split costs O(N log N) for N holders and each holder
    /// reports once per round, so the splits cost O(log N) per report, where splitting on every
    /// report cost N² per round. A new holder always splits (it has no part yet).
    pub(crate) fn split_due(&mut self) -> bool {
        self.reports += 1;
        self.rate_changed || self.reports * SPLITS_PER_ROUND >= self.holders.len() as u64
    }

    /// Takes a new rate (a config change), keeping each holder's requests per second, scaled
    /// down in proportion when they no longer fit. A gone holder's Envoy keeps enforcing its old
    /// assignment until it expires: a limit lowered by a reload holds from then on.
    pub(crate) fn set_rate(&mut self, rate: Rate) {
        if rate == self.rate {
            return;
        }
        for h in &mut self.holders {
            h.assigned = rate.tokens_for(self.rate.per_sec(h.assigned));
        }
        // A lower limit: every part shrinks in proportion, so they fit it.
        let sum: u64 = self.holders.iter().map(|h| h.assigned).sum();
        if sum > rate.tokens {
            for h in &mut self.holders {
                h.assigned =
                    (u128::from(h.assigned) * u128::from(rate.tokens) / u128::from(sum)) as u64;
            }
        }
        self.rate = rate;
        self.rate_changed = true;
    }

    pub(crate) fn position(&self, node: Option<&str>, stream: u64, id: &[Entry]) -> Option<usize> {
        self.holders.iter().position(|h| h.is(node, stream, id))
    }

    /// Splits the rate among the live holders; returns the holders whose assignment changed.
    pub(crate) fn split(&mut self) -> Vec<usize> {
        self.split_within(u64::MAX)
    }

    /// Splits at most `cap` tokens of the rate among the live holders (a node without a
    /// majority, [`crate::rlqs::assign::Rate::alone`]); returns the holders whose assignment
    /// changed.
    pub(crate) fn split_within(&mut self, cap: u64) -> Vec<usize> {
        self.reports = 0;
        self.rate_changed = false;
        self.splits += 1;
        let reserved: u64 = self
            .holders
            .iter()
            .filter(|h| h.gone)
            .map(|h| h.assigned)
            .sum();
        let capacity = self.rate.tokens.min(cap).saturating_sub(reserved);
        let live: Vec<usize> = (0..self.holders.len())
            .filter(|&i| !self.holders[i].gone)
            .collect();
        let claims: Vec<u64> = live.iter().map(|&i| self.claim(&self.holders[i])).collect();
        let mut targets = max_min_fair(capacity, &claims);
        spread(&mut targets, capacity);
        let mut parts: Vec<u64> = live
            .iter()
            .zip(&targets)
            .map(|(&i, &t)| steady(self.holders[i].assigned, t))
            .collect();
        if parts.iter().sum::<u64>() > capacity {
            for (p, &t) in parts.iter_mut().zip(&targets) {
                *p = (*p).min(t);
            }
        }
        let mut changed = Vec::new();
        for (&i, &p) in live.iter().zip(&parts) {
            if self.holders[i].assigned != p {
                self.holders[i].assigned = p;
                changed.push(i);
            }
        }
        changed
    }

    /// A holder's claim in tokens per fill interval: its demand plus the headroom, or the whole
    /// rate before it is measured.
    fn claim(&self, h: &Holder) -> u64 {
        match h.demand {
            None => self.rate.tokens,
            Some(d) => self
                .rate
                .tokens_for(d * (100 + HEADROOM_PCT) as f64 / 100.0),
        }
    }

    /// Removes the holders whose assignment expired by `now_us` (streams ended, or buckets
    /// their Envoy no longer reports), and those quiet since `quiet_before_us` or earlier;
    /// returns the latter (they are told to abandon the bucket).
    pub(crate) fn remove_stale(
        &mut self,
        now_us: u64,
        quiet_before_us: u64,
    ) -> (usize, Vec<Holder>) {
        let before = self.holders.len();
        self.holders.retain(|h| h.expires_us > now_us);
        let expired = before - self.holders.len();
        let mut quiet = Vec::new();
        let mut i = 0;
        while i < self.holders.len() {
            let h = &self.holders[i];
            if !h.gone && h.quiet_since_us.is_some_and(|q| q <= quiet_before_us) {
                quiet.push(self.holders.swap_remove(i));
            } else {
                i += 1;
            }
        }
        (expired, quiet)
    }

    /// The sum of the assignments, in tokens per fill interval.
    pub(crate) fn assigned(&self) -> u64 {
        self.holders.iter().map(|h| h.assigned).sum()
    }

    /// The live holders' demand, in requests per second.
    pub(crate) fn demand(&self) -> f64 {
        self.holders
            .iter()
            .filter(|h| !h.gone)
            .filter_map(|h| h.demand)
            // Not `sum()`: an empty f64 sum is -0.0.
            .fold(0.0, |a, d| a + d)
    }
}

/// Gives what the targets leave of `capacity` to all of them equally (the remainder's units to
/// the first).
fn spread(targets: &mut [u64], capacity: u64) {
    let n = targets.len() as u64;
    let left = capacity.saturating_sub(targets.iter().sum());
    if n == 0 || left == 0 {
        return;
    }
    let (each, extra) = (left / n, left % n);
    for (j, t) in targets.iter_mut().enumerate() {
        *t += each + u64::from((j as u64) < extra);
    }
}

/// The part a holder gets: its current one while the target is within [`HYSTERESIS_PCT`] of it,
/// else the target. A holder with nothing, or a target of nothing, always moves.
fn steady(current: u64, target: u64) -> u64 {
    if current == 0 || target == 0 {
        return target;
    }
    let moved = current.abs_diff(target);
    if u128::from(moved) * 100 <= u128::from(current) * u128::from(HYSTERESIS_PCT) {
        current
    } else {
        target
    }
}

#[cfg(test)]
mod tests;
