//! The tree's middle level: a region owner runs the library's parent link logic
//! ([`Upstream`], what `SLUICE_LEASE_PARENT` runs): it asks the root for each key's capacity on
//! behalf of its nodes' summed demand, and its server hands its nodes at most what the root
//! granted (`LeaseServer::answer_within`), divided by their demand. Only the calls are the
//! simulation's: one per region per renewal round, and one at once for a key with no grant.

use sluice::cluster::lease::parent::{ParentTiming, Upstream};
use sluice::cluster::lease::{Ask, Grant};

use super::{CROSS_TIMEOUT_US, EPOCH_US, Ev, NODE_LEASE_US, NODES, REGIONS, RootCall, Sim, ts};

/// A region owner's link to the root, renewing every `renew_us`.
pub(super) fn upstream(renew_us: u64) -> Upstream {
    let timing = ParentTiming {
        renew: std::time::Duration::from_micros(renew_us),
        timeout: std::time::Duration::from_micros(CROSS_TIMEOUT_US),
        idle: std::time::Duration::from_micros(NODE_LEASE_US),
        max_bytes: 1 << 30,
    };
    let regions = u32::try_from(REGIONS).expect("a few regions");
    Upstream::new(timing, std::num::NonZeroU32::new(regions).expect("regions"))
}

impl Sim<'_> {
    /// Region `r`'s owner answers `node`'s ask about `key` at `now`, handing out at most what
    /// the root granted the region (the parent link's capacity); a key the root granted
    /// nothing for in the window is asked of it at once (the answer does not wait for it here:
    /// the real owner waits at most SLUICE_LEASE_PARENT_TIMEOUT_MS).
    pub(super) fn region_answer(
        &mut self,
        r: usize,
        node: usize,
        key: usize,
        ask: &Ask,
        now: u64,
    ) -> Grant {
        let owner = &self.regions[r];
        let name = &self.k.names[key];
        let (capacity, _, ask_now) = owner.up.capacity(name, &ask.quota, EPOCH_US + now);
        let g = owner.server.answer_within(
            &self.nodes[node].name,
            name,
            ask,
            capacity,
            ts(now),
            ts(0),
            NODES,
        );
        if ask_now {
            let due = owner.up.renewals(
                EPOCH_US + now,
                Some(&[(name, *ask)]),
                |_| true,
                |k| owner.server.summary(k, ts(now)),
            );
            if !due.is_empty() {
                self.send_root_call(r, due, true, now);
            }
        }
        g
    }

    /// Region `r`'s renewal round at the root: one call carrying every key its nodes asked
    /// about within a lease duration.
    pub(super) fn region_renew(&mut self, r: usize, now: u64) {
        self.regions[r].round_at = now;
        let owner = &self.regions[r];
        let due = owner.up.renewals(
            EPOCH_US + now,
            None,
            |_| true,
            |k| owner.server.summary(k, ts(now)),
        );
        if due.is_empty() {
            self.next_region_round(r, now);
            return;
        }
        self.regions[r].outstanding += 1;
        self.send_root_call(r, due, false, now);
    }

    fn send_root_call(&mut self, r: usize, asks: Vec<(Box<str>, Ask)>, acquire: bool, now: u64) {
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
            .map(|(name, ask)| {
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
        let up = &self.regions[call.region].up;
        up.called(true, EPOCH_US + call.sent, EPOCH_US + now);
        for ((name, _), g) in call.asks.iter().zip(&call.grants) {
            up.answer(name, Some(g), EPOCH_US + call.sent);
        }
        self.root_call_done(call.region, &call, now);
    }

    pub(super) fn root_call_failed(&mut self, id: u32, now: u64) {
        // The region keeps what it holds: the parent link decides what it may hand out.
        if let Some(call) = self.root_calls.remove(&id) {
            let up = &self.regions[call.region].up;
            up.called(false, EPOCH_US + call.sent, EPOCH_US + now);
            for (name, _) in &call.asks {
                up.answer(name, None, EPOCH_US + call.sent);
            }
            self.root_call_done(call.region, &call, now);
        }
    }

    fn root_call_done(&mut self, r: usize, call: &RootCall, now: u64) {
        if !call.acquire {
            self.regions[r].outstanding -= 1;
            if self.regions[r].outstanding == 0 {
                self.next_region_round(r, now);
            }
        }
    }

    fn next_region_round(&mut self, r: usize, now: u64) {
        let at = (self.regions[r].round_at + self.root_renew_us).max(now);
        self.push(at, Ev::RegionRenew { region: r as u8 });
    }
}
