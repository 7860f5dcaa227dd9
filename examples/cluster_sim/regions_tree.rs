//! The tree's middle level: a region owner asks the root for each key's capacity on behalf of
//! its nodes' summed demand, and its server hands its nodes at most what the root granted
//! (`LeaseServer::answer_within`), divided by their demand.

use sluice::cluster::lease::{Ask, Capacity, Grant};
use sluice::limiter::{Quota, Unit};

use super::{
    CROSS_TIMEOUT_US, CROSS_US, Ev, NODES, REGIONS, ROOT_LEASE_US, RootCall, Sim, ts, window,
};

impl Sim<'_> {
    /// What region `r` may hand out of `key` in window `win` at `now`: the root's grant for
    /// that window. With none: while the root answers, nothing until it does (its grant for
    /// the next window comes ahead, in the last renewals of this one); once a call to it
    /// failed, the region's last grant while that lease holds, then the safe capacity, the
    /// limit over the regions.
    fn region_capacity(&self, r: usize, key: u32, win: u64, now: u64) -> u64 {
        let owner = &self.regions[r];
        if let Some(&c) = owner.root_caps.get(&(key, win)) {
            return c;
        }
        if !owner.root_unreachable {
            return 0;
        }
        match owner.last_root.get(&key) {
            Some(&(allowance, until)) if now < until => allowance,
            _ => u64::from(self.k.limits[key as usize]) / REGIONS as u64,
        }
    }

    /// Region `r`'s owner answers `node`'s ask about `key` at `now`, handing out at most what
    /// the root granted the region for this window and the next (the library's
    /// [`Capacity`]), and records what the node holds.
    pub(super) fn region_answer(
        &mut self,
        r: usize,
        node: usize,
        key: usize,
        ask: &Ask,
        now: u64,
    ) -> Grant {
        let win = window(now);
        let k = key as u32;
        let capacity = Capacity {
            current: Some(self.region_capacity(r, k, win, now)),
            next: Some(self.region_capacity(r, k, win + 1, now)),
        };
        let owner = &mut self.regions[r];
        let g = owner.server.answer_within(
            &self.nodes[node].name,
            &self.k.names[key],
            ask,
            capacity,
            ts(now),
            ts(0),
            NODES,
        );
        owner.active.insert(k, now);
        let reported = ask.keep.max(ask.used);
        owner
            .handed
            .entry((k, ask.epoch))
            .or_default()
            .insert(node, (reported, ask.used));
        self.record_held(r, node, k, g.epoch, g.allowance);
        if let Some(a) = g.next_allowance {
            self.record_held(r, node, k, g.epoch + 1, a);
        }
        let cold = !self.regions[r].last_root.contains_key(&k);
        if cold && ask.want > 0 && g.allowance <= reported {
            // A key the root never granted the region: ask it now rather than at the next
            // renewal. A key it did grant waits for the renewal (at most 200 ms), so the calls
            // to the root do not grow with the requests.
            self.root_acquire(r, k, ask.want, now);
        }
        g
    }

    /// Records that `node` holds `allowance` of `key` in window `win`.
    fn record_held(&mut self, r: usize, node: usize, key: u32, win: u64, allowance: u64) {
        let held = self.regions[r].handed.entry((key, win)).or_default();
        let used = held.get(&node).map_or(0, |h| h.1);
        held.insert(node, (allowance, used));
    }

    /// What region `r` reports to the root about `key` in the window at `now`, and lowers its
    /// own record to: what its nodes hold, plus their demand until the next renewal, within
    /// the root's fair part.
    fn region_ask(&mut self, r: usize, key: u32, want: u64, now: u64) -> Option<Ask> {
        let win = window(now);
        let limit = self.k.limits[key as usize];
        let owner = &self.regions[r];
        let (held, used) = owner.handed.get(&(key, win)).map_or((0, 0), |h| {
            h.values().fold((0, 0), |a, v| (a.0 + v.0, a.1 + v.1))
        });
        // Attempted demand travels up: the sum of the nodes' demands.
        let name = &self.k.names[key as usize];
        let demand_milli: u64 = owner
            .server
            .holders(name, ts(now))
            .iter()
            .filter(|h| h.epoch == win && h.expires_in_ms > 0)
            .map(|h| h.demand_milli)
            .sum();
        let granted = owner.root_caps.get(&(key, win)).copied().unwrap_or(0);
        if demand_milli == 0 && granted == 0 && held == 0 && want == 0 {
            return None;
        }
        // The need until the next grant arrives: the root's horizon (two renewal intervals)
        // plus a cross-region round trip, which unlike a round trip inside a cluster is no
        // small part of the interval.
        let need = demand_milli * (2 * self.root_renew_us + 2 * CROSS_US.1) / 1_000_000_000;
        let fair = owner
            .root_fair
            .get(&(key, win))
            .copied()
            .unwrap_or(u64::MAX);
        let keep = granted.min(held.max(used + need)).min(fair.max(held));
        if granted > 0 {
            self.regions[r].root_caps.insert((key, win), keep);
        }
        Some(Ask {
            quota: Quota::fixed(limit, Unit::Second),
            epoch: win,
            used,
            keep,
            want,
            demand_milli,
            horizon_us: 0,
        })
    }

    /// Region `r`'s renewal round at the root: one call carrying every key its nodes asked
    /// about within a root lease duration.
    pub(super) fn region_renew(&mut self, r: usize, now: u64) {
        self.regions[r].round_at = now;
        let owner = &self.regions[r];
        let keys: Vec<u32> = owner
            .active
            .keys()
            .filter(|k| !owner.acquiring.contains_key(k))
            .copied()
            .collect();
        let mut asks = Vec::new();
        for key in keys {
            if let Some(ask) = self.region_ask(r, key, 0, now) {
                asks.push((key, ask));
            }
        }
        if asks.is_empty() {
            self.next_region_round(r, now);
            return;
        }
        self.regions[r].outstanding += 1;
        self.send_root_call(r, asks, false, now);
    }

    /// Region `r` asks the root for `want` more of `key` at once.
    fn root_acquire(&mut self, r: usize, key: u32, want: u64, now: u64) {
        if self.regions[r].acquiring.contains_key(&key) {
            return;
        }
        let Some(ask) = self.region_ask(r, key, want, now) else {
            return;
        };
        self.regions[r].acquiring.insert(key, ());
        self.send_root_call(r, vec![(key, ask)], true, now);
    }

    fn send_root_call(&mut self, r: usize, asks: Vec<(u32, Ask)>, acquire: bool, now: u64) {
        let id = self.next_id;
        self.next_id += 1;
        self.out.cross_calls[r] += 1;
        if !self.s.root_down(now) && self.s.reaches(r, 0, now) {
            let at = now + self.latency(r, 0);
            self.push(at, Ev::RootCallArrives { id });
        } else {
            self.push(now + CROSS_TIMEOUT_US, Ev::RootCallFailed { id });
        }
        let call = RootCall {
            region: r,
            sent: now,
            acquire,
            asks,
            grants: Vec::new(),
        };
        self.root_calls.insert(id, call);
    }

    pub(super) fn root_call_arrives(&mut self, id: u32, now: u64) {
        let Some(call) = self.root_calls.get(&id) else {
            return;
        };
        let r = call.region;
        if self.s.root_down(now) || !self.s.reaches(r, 0, now) {
            let at = (call.sent + CROSS_TIMEOUT_US).max(now);
            self.push(at, Ev::RootCallFailed { id });
            return;
        }
        let region = &self.regions[r].name;
        let grants = call
            .asks
            .iter()
            .map(|(key, ask)| {
                let name = &self.k.names[*key as usize];
                let changed = ts(self.root_started);
                self.root
                    .answer(region, name, ask, ts(now), changed, REGIONS)
            })
            .collect();
        if let Some(c) = self.root_calls.get_mut(&id) {
            c.grants = grants;
        }
        let at = now + self.latency(0, r);
        self.push(at, Ev::RootCallAnswered { id });
    }

    pub(super) fn root_call_answered(&mut self, id: u32, now: u64) {
        let Some(call) = self.root_calls.remove(&id) else {
            return;
        };
        let owner = &mut self.regions[call.region];
        owner.root_unreachable = false;
        for ((key, _), g) in call.asks.iter().zip(&call.grants) {
            let caps = &mut owner.root_caps;
            caps.insert((*key, g.epoch), g.allowance);
            if let Some(f) = g.fair {
                owner.root_fair.insert((*key, g.epoch), f);
            }
            let mut last = g.allowance;
            if let Some(a) = g.next_allowance {
                let next = caps.entry((*key, g.epoch + 1)).or_default();
                *next = (*next).max(a);
                last = a;
            }
            owner.last_root.insert(*key, (last, now + ROOT_LEASE_US));
        }
        self.root_call_done(call.region, &call, now);
    }

    pub(super) fn root_call_failed(&mut self, id: u32, now: u64) {
        // The region keeps what it holds: `region_capacity` decides what it may hand out.
        if let Some(call) = self.root_calls.remove(&id) {
            self.regions[call.region].root_unreachable = true;
            self.root_call_done(call.region, &call, now);
        }
    }

    fn root_call_done(&mut self, r: usize, call: &RootCall, now: u64) {
        if call.acquire {
            for (key, _) in &call.asks {
                self.regions[r].acquiring.remove(key);
            }
            return;
        }
        self.regions[r].outstanding -= 1;
        if self.regions[r].outstanding == 0 {
            self.next_region_round(r, now);
        }
    }

    fn next_region_round(&mut self, r: usize, now: u64) {
        let at = (self.regions[r].round_at + self.root_renew_us).max(now);
        self.push(at, Ev::RegionRenew { region: r as u8 });
    }
}
