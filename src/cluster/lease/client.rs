//! The lease client: what this node holds of each key's capacity, and every decision made from
//! it, locally, with no network.
//!
//! - **Windows**: an allowance per window (and the next window's, granted ahead); a hit is
//!   admitted while the node's count in the window plus the hit fits the allowance.
//! - **Buckets**: a local bucket of the node's share: the key's bucket with its emission
//!   interval stretched by `1 / share`, so its rate and its capacity are the share's part of
//!   the key's. A change of share keeps the fraction of the local bucket in use.
//!
//! A hit that does not fit asks the owner for more (an *acquire*, one hop) when
//! [`Held::may_acquire`] allows it; otherwise it is refused locally. Every key held is renewed in the
//! background ([`Held::renewal`]), reporting the attempted demand and what is used, and giving
//! back what the node holds beyond its need.

use super::server::{Ask, Grant, LeaseTiming, PPM, share_need};
use super::window::{epoch_of, is_window, rate_milli, same_counter, window_index, window_left_us};
use crate::limiter::demand::Demand;
use crate::limiter::granted::Granted;
use crate::limiter::{Algorithm, Decision, Quota, bucket};

/// What this node holds of one key.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    quota: Quota,
    /// Windows: the window, the most hits this node may admit in it (`granted`), the hits it
    /// admitted (`used`) and the next window's allowance, granted ahead. Buckets: the share in
    /// ppm (`granted`), in window 0.
    grant: Granted,
    /// Windows: of `used`, the hits admitted in the window from the safe capacity while this
    /// node had no majority ([`Held::admitted_alone`]). They count in `used` and `granted`
    /// alike, so an owner reached again is told of them and grants the window that much less.
    alone: u64,
    /// The lease holds until then (µs).
    valid_until_us: u64,
    /// What the other nodes held or used when the last grant came.
    others: u64,
    /// This node's fair part at the last grant (`Grant::fair`) and the window it is about: at
    /// a renewal in that window the node keeps no more than it (or than it used).
    fair: Option<(u64, u64)>,
    /// Buckets: the local bucket's theoretical arrival time (a [`bucket`] state word).
    tat: u128,
    /// Hits asked for (admitted or not), sampled at each renewal or acquire sent.
    demand: Demand,
    /// When this node last acquired for the key.
    acquired_us: u64,
    /// Windows: an acquire is under way (so its grant says whether the owner had more).
    acquiring: bool,
    /// Windows: the window in which acquires brought nothing more, and how many did in a
    /// row: the next waits a quarter of the renewal interval, doubled for each of them (the
    /// others give back at their renewals; a renewal that brings more ends the wait).
    starved: Option<(u64, u32)>,
    /// When a hit last came.
    touched_us: u64,
    /// A call about this key is under way; its answer will be applied by its sender.
    pub in_flight: bool,
    /// The ring changes this node had seen when it last reported the key.
    reported_changes: u64,
    /// The key is in the renewal rounds' queue ([`super::LeaseClient`]): something happened
    /// since it was last found quiet (a hit, a refund, an acquire), so a round looks at it.
    pub queued: bool,
    /// When the key, quiet, is looked at again to be forgotten (µs, rounded to its tick; 0: not
    /// parked). An earlier parking of the slot with another deadline is stale.
    pub parked_us: u64,
    /// The slot left the table (forgotten, refused a lease, replaced by another counter's): a
    /// queue or a parking still naming it drops it.
    pub gone: bool,
    /// The key's owner recalled its free shares ([`super::free`]) until then (µs; 0: never):
    /// the slot is kept, and reports about the key in every window that begins before it.
    recalled_until_us: u64,
    /// A report is owed to the owner (a recall, or a window begun under one): the next
    /// renewal round sends one even with nothing held.
    report_due: bool,
}

/// A local decision, or the need to ask the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Local {
    Decided(Decision),
    /// The hit does not fit and an acquire may be sent: send `Ask`, then [`Held::grant`] and
    /// [`Held::decide_after_acquire`].
    Acquire(Ask),
    /// The hit does not fit, and a call is under way that may change that.
    Wait,
}

impl Held {
    /// A key this node holds nothing of yet, seen at `now_us`. `live` is the number of live
    /// peers, which sizes the first demand: the key at its full rate, shared equally.
    pub(crate) fn new(quota: Quota, now_us: u64, live: u64) -> Self {
        let demand_milli = rate_milli(&quota) / live.max(1);
        Held {
            quota,
            grant: Granted::new(epoch_of(&quota, now_us)),
            alone: 0,
            valid_until_us: 0,
            others: 0,
            fair: None,
            tat: bucket::EMPTY,
            demand: Demand::new(now_us, demand_milli),
            acquired_us: 0,
            acquiring: false,
            starved: None,
            touched_us: now_us,
            in_flight: false,
            reported_changes: 0,
            queued: false,
            parked_us: 0,
            gone: false,
            recalled_until_us: 0,
            report_due: false,
        }
    }

    pub(crate) fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Moves to `quota`, a reload's, at `now_us`: `false` when it counts in another counter
    /// ([`same_counter`]), which needs a fresh lease. Else only the limit changed, and what is
    /// held and used stays, as the owner keeps its record of them: a window's allowance and
    /// count, a bucket's share and the tokens its local bucket has (at most its new capacity).
    pub(crate) fn requota(&mut self, quota: Quota, now_us: u64) -> bool {
        if !same_counter(&self.quota, &quota) {
            return false;
        }
        let old = self.local_bucket();
        self.quota = quota;
        if let (Some(old), Some(new)) = (old, self.local_bucket()) {
            self.tat = old.reshare(self.tat, now_us, new);
        }
        true
    }

    /// Decides `hits` at `now_us` from what is held, or says to acquire (when no acquire was
    /// sent for the key within `renew_us`) or to wait for the call under way.
    pub(crate) fn decide(&mut self, now_us: u64, hits: u64, renew_us: u64) -> Local {
        self.roll(now_us);
        self.demand.attempt(hits);
        self.touched_us = now_us;
        if let Some(d) = self.try_admit(now_us, hits) {
            return Local::Decided(d);
        }
        if self.in_flight {
            return Local::Wait;
        }
        if !self.may_acquire(now_us, renew_us) {
            return Local::Decided(self.refusal(now_us, hits));
        }
        self.acquired_us = now_us;
        self.acquiring = true;
        self.in_flight = true;
        Local::Acquire(Ask {
            want: hits,
            ..self.report(now_us)
        })
    }

    /// Admits `hits` from what is held, with no call and no acquire: a node that cannot reach a
    /// majority of its peers decides so. `Err` carries what it used of a window's allowance
    /// (0 for a bucket), which its safe capacity then counts.
    pub(crate) fn admit_held(&mut self, now_us: u64, hits: u64) -> Result<Decision, u64> {
        self.roll(now_us);
        self.demand.attempt(hits);
        self.touched_us = now_us;
        // What the safe capacity counts is the lease's part: the memory store it decides on
        // holds the hits admitted alone already.
        self.try_admit(now_us, hits)
            .ok_or(if is_window(&self.quota) {
                self.grant.used.saturating_sub(self.alone)
            } else {
                0
            })
    }

    /// Whether a hit that does not fit may send an acquire at `now_us`. Windows: a burst
    /// acquires again as soon as its last grant is spent, each grant sized by the demand the
    /// burst shows, so it is not refused for a renewal interval while the window still has
    /// capacity; after `n` acquires in a row that brought nothing (the owner has nothing until
    /// others give back at their renewals), only once `renew_us / 4 * 2^(n-1)` has passed, so
    /// an exhausted window costs a few calls, not one per hit. Buckets: once per renewal
    /// interval, since a share refills by itself.
    pub(crate) fn may_acquire(&self, now_us: u64, renew_us: u64) -> bool {
        if is_window(&self.quota) {
            match self.starved {
                Some((epoch, n)) if epoch == self.grant.window => {
                    let wait = (renew_us / 4).saturating_mul(1 << n.saturating_sub(1).min(20));
                    now_us >= self.acquired_us.saturating_add(wait)
                }
                _ => true,
            }
        } else {
            self.acquired_us == 0 || now_us >= self.acquired_us + renew_us
        }
    }

    /// Decides `hits` once the call it waited for is answered: admitted if it fits now,
    /// refused otherwise (no second acquire).
    pub(crate) fn decide_after_acquire(&mut self, now_us: u64, hits: u64) -> Decision {
        self.roll(now_us);
        self.try_admit(now_us, hits)
            .unwrap_or_else(|| self.refusal(now_us, hits))
    }

    /// Takes `hits` off what this node used at `now_us` (a refund), and answers a peek at what
    /// is left. Windows: the node's count in the window goes down, floored at 0, so it may admit
    /// that many more within its allowance (the owner still charges the node the most it had
    /// used, so refunds never let the allowances pass the limit). Buckets: the local bucket
    /// gets the tokens back, never past rest.
    pub(crate) fn refund(&mut self, now_us: u64, hits: u64) -> Decision {
        self.roll(now_us);
        match self.quota.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                self.grant.used = self.grant.used.saturating_sub(hits);
                self.alone = self.alone.min(self.grant.used);
            }
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                if let Some(shape) = self.local_bucket() {
                    self.tat = bucket::refund_shaped(self.tat, shape, hits);
                }
            }
            // Never leased (`LeaseTable::route` forwards it to its owner).
            Algorithm::Concurrency => {}
        }
        self.peek(now_us)
    }

    /// What a call of 0 hits answers now, counting nothing.
    fn peek(&self, now_us: u64) -> Decision {
        if is_window(&self.quota) {
            let count = self.others + self.grant.used;
            let over = count > u64::from(self.quota.requests_per_unit);
            return self.window_decision(now_us, count, 0, over);
        }
        match self.local_bucket() {
            Some(shape) if now_us < self.valid_until_us => {
                bucket::decide_shaped(self.tat, now_us, shape, 0).0
            }
            _ => Decision {
                penalized: false,
                count_before: 0,
                count_after: 0,
                over: false,
                remaining: 0,
                reset_after_secs: 1,
                expired: 0,
            },
        }
    }

    /// Applies a grant answering an ask sent at `sent_us`.
    pub(crate) fn grant(&mut self, g: &Grant, sent_us: u64) {
        self.in_flight = false;
        self.fair = g.fair.map(|f| (g.epoch, f));
        let acquiring = std::mem::take(&mut self.acquiring);
        if is_window(&self.quota) {
            if acquiring && g.epoch == self.grant.window && g.allowance <= self.grant.granted {
                let n = match self.starved {
                    Some((epoch, n)) if epoch == self.grant.window => n + 1,
                    _ => 1,
                };
                self.starved = Some((self.grant.window, n));
            }
            if g.epoch == self.grant.window {
                // The server only raises; the node lowered its own record when it asked. A
                // renewal that brings more shows the owner has capacity again (given back by
                // others): acquires may go on.
                if !acquiring && g.allowance > self.grant.granted {
                    self.starved = None;
                }
                self.grant.granted = self.grant.granted.max(g.allowance);
                self.grant.ahead = g.next_allowance.map(|a| (a, ()));
            } else if g.epoch > self.grant.window {
                // The owner's clock is in a later window than this node's: count in that one.
                self.grant = Granted {
                    window: g.epoch,
                    granted: g.allowance,
                    ahead: g.next_allowance.map(|a| (a, ())),
                    ..Granted::default()
                };
            } else if let Some(a) = g
                .next_allowance
                .filter(|_| g.epoch + 1 == self.grant.window)
            {
                // This node's clock is a window ahead of the owner's: the grant ahead is for
                // the window this node is in.
                self.grant.granted = self.grant.granted.max(a);
            }
            self.others = g.others;
        } else {
            self.reshare(sent_us, g.allowance);
        }
        self.valid_until_us = sent_us + g.valid_us;
    }

    /// A call about the key failed: keep what is held until the lease ends.
    pub(crate) fn failed(&mut self) {
        self.in_flight = false;
        self.acquiring = false;
        // A report a recall owed may be what was lost.
        self.report_due |= self.recalled_until_us > self.demand.since_us();
    }

    /// The key's owner recalled its free shares at `now_us` until `until_us`: whether a report
    /// is owed (the first recall, or one owed already), for the next renewal round.
    pub(crate) fn recall(&mut self, now_us: u64, until_us: u64) -> bool {
        self.roll(now_us);
        if self.recalled_until_us <= now_us {
            self.report_due = true;
        }
        self.recalled_until_us = self.recalled_until_us.max(until_us);
        self.report_due
    }

    /// Whether a window began at `now_us` that a recall must report about (a quiet key's
    /// renewal round is not looking at it otherwise).
    pub(crate) fn recall_due(&self, now_us: u64) -> bool {
        self.recalled_until_us > now_us && epoch_of(&self.quota, now_us) > self.grant.window
    }

    /// The renewal to send at `now_us`, when the key needs one: something is held, hits came
    /// since the last report, or the ring changed since (a new owner must learn what is held).
    /// Lowers what is held to what the node keeps.
    pub(crate) fn renewal(
        &mut self,
        now_us: u64,
        changes: u64,
        timing: &LeaseTiming,
    ) -> Option<Ask> {
        self.roll(now_us);
        if self.in_flight {
            return None;
        }
        let holds = if is_window(&self.quota) {
            self.grant.granted > self.grant.used || self.grant.ahead.is_some()
        } else {
            self.grant.granted > 0 && now_us < self.valid_until_us
        };
        if !holds
            && self.demand.attempted() == 0
            && changes == self.reported_changes
            && !self.report_due
        {
            return None;
        }
        self.reported_changes = changes;
        self.report_due = false;
        let ask = self.report(now_us);
        let keep = self.keep(now_us, timing);
        if is_window(&self.quota) {
            self.grant.granted = keep;
        } else {
            self.reshare(now_us, keep);
        }
        self.in_flight = true;
        Some(Ask { keep, ..ask })
    }

    /// Whether the key can be forgotten at `now_us`: nothing held, no hit for a lease duration,
    /// and (buckets) the local bucket at rest, so forgetting it gives no burst back.
    pub(crate) fn idle(&self, now_us: u64, timing: &LeaseTiming) -> bool {
        let quiet = now_us >= self.touched_us + timing.duration_us()
            && !self.in_flight
            && now_us >= self.recalled_until_us;
        if is_window(&self.quota) {
            quiet && epoch_of(&self.quota, now_us) > self.grant.window && self.grant.ahead.is_none()
        } else {
            quiet && now_us >= self.valid_until_us && bucket::is_stale(self.tat, now_us)
        }
    }

    /// The earliest time [`Held::idle`] may hold, for a key no hit touches: a lease duration
    /// after its last hit, and no earlier than the end of its window (or of the window granted
    /// ahead), its bucket share's lease and its local bucket's rest.
    pub(crate) fn forget_at(&self, timing: &LeaseTiming) -> u64 {
        let quiet = self.touched_us.saturating_add(timing.duration_us());
        if is_window(&self.quota) {
            let last = self.grant.window + u64::from(self.grant.ahead.is_some());
            quiet.max(self.quota.window().end_us(last))
        } else {
            quiet
                .max(self.valid_until_us)
                .max(bucket::rest_micros(self.tat))
        }
    }

    /// What this node holds, for the debug endpoint: (epoch, allowance or share, used).
    pub(crate) fn holding(&self) -> (u64, u64, u64) {
        (self.grant.window, self.grant.granted, self.grant.used)
    }

    /// The report part of an ask: what is used and held, and the demand (which this updates:
    /// the attempted hits since the last report, averaged with the previous estimate).
    fn report(&mut self, now_us: u64) -> Ask {
        let demand_milli = self.demand.report(now_us);
        Ask {
            quota: self.quota,
            epoch: self.grant.window,
            used: self.grant.used,
            keep: self.grant.granted,
            want: 0,
            demand_milli,
            horizon_us: 0,
        }
    }

    /// What to keep at a renewal: what is used and the need until the next grant arrives
    /// (windows), or the share the demand needs (buckets); never more than is held.
    fn keep(&self, now_us: u64, timing: &LeaseTiming) -> u64 {
        if is_window(&self.quota) {
            let until = timing.horizon_us().min(window_left_us(&self.quota, now_us));
            let need = self.demand.within(until);
            let fair = match self.fair {
                Some((epoch, f)) if epoch == self.grant.window => f.max(self.grant.used),
                _ => u64::MAX,
            };
            self.grant
                .granted
                .min(self.grant.used.saturating_add(need))
                .min(fair)
        } else {
            let need = share_need(self.demand.milli(), &self.quota);
            let fair = self.fair.map_or(u64::MAX, |(_, f)| f.max(1));
            self.grant.granted.min(need.max(1)).min(fair)
        }
    }

    /// Moves a window lease to the window containing `now_us`: the next window's allowance
    /// if it was granted ahead, else nothing held.
    fn roll(&mut self, now_us: u64) {
        if !is_window(&self.quota) {
            return;
        }
        // Granted ahead: the owner counted this node in for the next window's first horizon,
        // and its next renewal (within one interval) brings more, so a steady node sends no
        // acquire at the boundary; a node whose burst spends it acquires at once.
        if self.grant.roll(window_index(&self.quota, now_us)).is_none() {
            return;
        }
        self.alone = 0;
        self.others = 0;
        // Under a recall, the owner charges the node its free share of the new window until it
        // reports.
        self.report_due |= self.recalled_until_us > now_us;
    }

    /// Records `hits` admitted at `now_us` from the safe capacity while this node had no
    /// majority (windows), so its next report tells the owner, who then grants the window
    /// that much less: without it a partition that heals within a window admitted the limit
    /// again on top of what the cut-off nodes had admitted alone (issue 35's 1/1/1 split).
    pub(crate) fn admitted_alone(&mut self, now_us: u64, hits: u64) {
        self.roll(now_us);
        if is_window(&self.quota) {
            self.alone = self.alone.saturating_add(hits);
            self.grant.used = self.grant.used.saturating_add(hits);
            self.grant.granted = self.grant.granted.saturating_add(hits);
        }
    }

    /// Records `hits` admitted at `now_us` from this node's free share of the window before it
    /// took a lease ([`super::free`]): they count as used and held, so the node's first ask
    /// reports them and the owner charges them to it.
    pub(crate) fn took_freely(&mut self, now_us: u64, hits: u64) {
        self.roll(now_us);
        if is_window(&self.quota) {
            self.grant.used = self.grant.used.saturating_add(hits);
            self.grant.granted = self.grant.granted.saturating_add(hits);
        }
    }

    fn try_admit(&mut self, now_us: u64, hits: u64) -> Option<Decision> {
        if is_window(&self.quota) {
            let before = self.others + self.grant.used;
            if !self.grant.take(hits) {
                return None;
            }
            return Some(self.window_decision(now_us, before, hits, false));
        }
        if now_us >= self.valid_until_us {
            return None;
        }
        let shape = self.local_bucket()?;
        let (d, tat) = bucket::decide_shaped(self.tat, now_us, shape, hits);
        if d.over {
            return None;
        }
        self.tat = tat;
        Some(d)
    }

    fn refusal(&self, now_us: u64, hits: u64) -> Decision {
        if is_window(&self.quota) {
            return self.window_decision(now_us, self.others + self.grant.used, hits, true);
        }
        match self.local_bucket() {
            Some(shape) if now_us < self.valid_until_us => {
                let (mut d, _) = bucket::decide_shaped(self.tat, now_us, shape, hits);
                d.over = true;
                d.remaining = 0;
                d
            }
            _ => Decision {
                penalized: false,
                count_before: 0,
                count_after: hits,
                over: true,
                remaining: 0,
                reset_after_secs: 1,
                expired: 0,
            },
        }
    }

    fn window_decision(&self, now_us: u64, before: u64, hits: u64, over: bool) -> Decision {
        let limit = u64::from(self.quota.requests_per_unit);
        let after = before + hits;
        Decision {
            penalized: false,
            count_before: before,
            count_after: after,
            over,
            remaining: if over {
                0
            } else {
                u32::try_from(limit.saturating_sub(after)).unwrap_or(u32::MAX)
            },
            reset_after_secs: window_left_us(&self.quota, now_us).div_ceil(1_000_000),
            expired: 0,
        }
    }

    /// The local bucket of this node's share: the key's bucket with `share / PPM` of its rate
    /// and the same time tolerance, so `share / PPM` of its capacity. `None` for no share (or a
    /// rate of 0).
    fn local_bucket(&self) -> Option<bucket::Shape> {
        self.bucket_of_share(self.grant.granted)
    }

    /// The local bucket of a share of `share` ppm (`None` for 0, or a rate of 0).
    fn bucket_of_share(&self, share: u64) -> Option<bucket::Shape> {
        let shape = bucket::Shape::of(&self.quota)?;
        (share > 0).then(|| shape.share(share, PPM))
    }

    /// Changes a bucket share to `share` at `now_us`, keeping the tokens the local bucket has
    /// now (at most its new capacity): a larger share refills faster but gives no burst, so the
    /// nodes' buckets together never hold more than the key's (shares sum to at most one) and
    /// gain tokens only at the key's rate.
    fn reshare(&mut self, now_us: u64, share: u64) {
        let share = share.min(PPM);
        if share == self.grant.granted {
            return;
        }
        if let (Some(old), Some(new)) = (self.local_bucket(), self.bucket_of_share(share)) {
            self.tat = old.reshare(self.tat, now_us, new);
        } else if share == 0 {
            self.tat = self.tat.max(bucket::at_micros(now_us));
        }
        self.grant.granted = share;
    }
}
