//! Lease mode (SLUICE_CLUSTER_MODE=lease) in the simulation: every node runs Sluice's own
//! [`LeaseClient`] (a `Held` per key) and [`LeaseServer`], driven as `src/cluster/lease_driver.rs`
//! drives them, on the simulated clock and network:
//!
//! - a hit is decided from the node's lease, or sends an *acquire* to the key's owner (one hop
//!   each way; answered at once by the node's own server when it owns the key), whose grant is
//!   applied with `Slot::answer` at the send time and the hit decided with `decide_after`; or
//!   it waits for the call under way about its key and is decided when that call returns;
//! - an acquire whose owner does not answer (a dead node, after SLUICE_PEER_TIMEOUT_MS) marks
//!   the owner down and goes to the next owner once; if that fails too the request fails;
//! - each node's renewal task runs every SLUICE_LEASE_RENEW_MS (the initial nodes at random
//!   phases, since they started at different moments): `LeaseClient::renewals` (which forgets
//!   idle keys), one call per owner carrying every key due (in chunks of `MAX_LEASE_ASKS`), all
//!   owners at once; the next round starts when the period has passed and every call of this
//!   one has returned (tokio's `MissedTickBehavior::Delay`);
//! - the owner's server answers at the moment the call arrives, with the owner's own view: the
//!   last ring change it saw (now, for a key it stands in for: `OwnerStore::answer_leases`) and
//!   the peers it believes up; its sweep runs every lease duration; a ring change is a peer
//!   marked down, a peer answering again, or a PEERS_DNS change;
//! - a node that dies loses its leases and its server's state; it restarts with neither.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sluice::clock::Timestamp;
use sluice::cluster::lease::{
    Ask, Grant, LeaseClient, LeaseServer, LeaseTiming, MAX_LEASE_ASKS, Route, Slot,
};

use super::{Call, EPOCH_US, Event, Params, Payload, Phase, Sim, Task, Variant, Workload};

/// One node's lease state: what it holds, what it serves, and its renewal round.
struct LeaseNode {
    client: LeaseClient,
    server: LeaseServer,
    /// When the running renewal round started, and how many of its calls are still out.
    round_at: u64,
    outstanding: u32,
    /// Hits waiting for the call under way about their key: key -> (arrival, slot).
    waiters: HashMap<u32, Vec<(u64, Arc<Slot>)>>,
}

impl LeaseNode {
    fn new(timing: LeaseTiming) -> Self {
        LeaseNode {
            client: LeaseClient::new(timing),
            server: LeaseServer::new(timing),
            round_at: 0,
            outstanding: 0,
            waiters: HashMap::new(),
        }
    }
}

/// Every node's lease state.
pub(super) struct Leases {
    timing: LeaseTiming,
    nodes: Vec<LeaseNode>,
    names: Vec<String>,
}

impl Leases {
    pub(super) fn new(p: &Params, nodes: usize) -> Self {
        // The defaults, then the settings studied: a field LeaseTiming gains keeps its default.
        let mut timing = LeaseTiming::DEFAULT;
        timing.renew = Duration::from_micros(p.renew_us);
        timing.duration = Duration::from_micros(p.lease_us);
        timing.max_bytes = p.lease_max_bytes;
        Leases {
            timing,
            nodes: (0..nodes).map(|_| LeaseNode::new(timing)).collect(),
            names: (0..nodes).map(super::addr).collect(),
        }
    }
}

/// What a lease call carries.
pub(super) enum LeaseKind {
    /// One hit's acquire, for a request that arrived at `arrival`; `round` 1 is the retry.
    Acquire {
        arrival: u64,
        round: u8,
    },
    Renewal,
}

pub(super) struct LeaseCall {
    kind: LeaseKind,
    asks: Vec<(u32, Arc<Slot>, Ask)>,
    grants: Vec<Grant>,
}

impl Sim<'_> {
    fn leases(&mut self) -> &mut Leases {
        self.lease.as_mut().expect("lease mode")
    }

    /// A request for `key` arrives at `node` at `now` (`ClusterStore::route_lease`).
    pub(super) fn lease_route(&mut self, node: usize, key: usize, now: u64) {
        let quota = self.w.quota(key);
        let live = self.live(node);
        let name = &self.w.names[key];
        let route = self.leases().nodes[node]
            .client
            .route(name, quota, EPOCH_US + now, 1, || live);
        match route {
            Route::Decided(d) => self.record(key, now, !d.over, 0),
            Route::Acquire(slot, ask) => self.acquire(node, key, slot, ask, now, (now, 0)),
            Route::Wait(slot) => self.leases().nodes[node]
                .waiters
                .entry(key as u32)
                .or_default()
                .push((now, slot)),
            // Only when a lease table is full: never here (10,000 keys in 32 MiB; the
            // `keys` section's 10^6 in the larger tables it sets).
            Route::Forward => self.out.errors += 1,
        }
    }

    /// Sends `node`'s acquire for `key` at `now` to the key's owner by `node`'s view, for a
    /// request that arrived at `at.0`, in round `at.1` (`Leasing::acquire`).
    fn acquire(
        &mut self,
        node: usize,
        key: usize,
        slot: Arc<Slot>,
        ask: Ask,
        now: u64,
        at: (u64, u8),
    ) {
        let owner = self.owner(node, key);
        if owner == node {
            let grant = self.grant(node, node, key, &ask, now);
            slot.answer(Some(&grant), EPOCH_US + now);
            let d = slot.decide_after(EPOCH_US + now, 1);
            self.record(key, now, !d.over, now - at.0);
            self.wake(node, key, now);
            return;
        }
        self.hop_taken(now);
        let window = self.window_of(now);
        self.windows.entry((key as u32, window)).or_default().2 += 1;
        if self.script.phase(now, now + 1) == Phase::Steady && at.1 == 0 {
            if ask.keep == 0 {
                self.out.acquires_cold += 1;
            } else {
                self.out.acquires_more += 1;
            }
        }
        let call = Call {
            from: node as u16,
            to: owner as u16,
            life: self.life[node],
            sent: now,
            payload: Payload::Lease(LeaseCall {
                kind: LeaseKind::Acquire {
                    arrival: at.0,
                    round: at.1,
                },
                asks: vec![(key as u32, slot, ask)],
                grants: Vec::new(),
            }),
        };
        self.send_call(call, now);
    }

    /// `owner`'s lease server answers `from`'s ask about `key` at `now`
    /// (`OwnerStore::answer_leases`).
    fn grant(&mut self, owner: usize, from: usize, key: usize, ask: &Ask, now: u64) -> Grant {
        let mut last_change = self.ring_changes[owner].1;
        if self.p.has(Variant::JoinRelay) {
            match self.lease_relay(owner, key, now) {
                // The previous owner serves the window, as its owner.
                Some(Ok(prev)) => return self.grant_as_owner(prev, from, key, ask, now),
                // The first window this node serves: the previous owner may have granted
                // it ahead, so it rebuilds the key from the holders' reports.
                Some(Err(window_start)) => last_change = last_change.max(window_start),
                None => {}
            }
        }
        // A stand-in for the key's owner (the owner among every peer it knows is another one)
        // rebuilds the key as after a ring change.
        if self
            .ring
            .owner(self.w.hashes[key], |i| self.known(owner, i))
            != Some(owner)
        {
            last_change = EPOCH_US + now;
        }
        self.answer_ask(owner, from, key, ask, now, last_change)
    }

    /// Variant J: whether `owner`, the key's owner by its view, serves `key`'s window at
    /// `now` through its previous owner (`Ok`: the window began before `owner`'s join
    /// settled), or serves the first window after those itself (`Err`: that window's start,
    /// µs since the epoch).
    fn lease_relay(&self, owner: usize, key: usize, now: u64) -> Option<Result<usize, u64>> {
        let view = &self.view[owner];
        if self.ring.owner(self.w.hashes[key], |i| view[i]) != Some(owner) {
            return None;
        }
        let quota = self.w.quota(key);
        let at = |us: u64| Timestamp::from_micros(EPOCH_US + us);
        let unit_us = self.w.unit.secs() * 1_000_000;
        let start = (EPOCH_US + now) / unit_us * unit_us;
        if self.joins[owner].relay(&quota, at(now)).is_some() {
            let prev = self
                .ring
                .owner(self.w.hashes[key], |i| i != owner && view[i])?;
            return self.alive[prev].then_some(Ok(prev));
        }
        let before = Timestamp::from_micros(start - 1);
        self.joins[owner].relay(&quota, before).map(|_| Err(start))
    }

    /// `prev` answers an ask `owner` relayed to it, as the key's owner: no stand-in rebuild.
    fn grant_as_owner(
        &mut self,
        prev: usize,
        from: usize,
        key: usize,
        ask: &Ask,
        now: u64,
    ) -> Grant {
        // An acquire waits for it: one more hop on the request path (a renewal does not).
        if ask.want > 0 {
            self.hop_taken(now);
        }
        let last_change = self.ring_changes[prev].1;
        self.answer_ask(prev, from, key, ask, now, last_change)
    }

    /// `owner`'s lease server answers with `last_change` as its last ring change.
    fn answer_ask(
        &mut self,
        owner: usize,
        from: usize,
        key: usize,
        ask: &Ask,
        now: u64,
        last_change: u64,
    ) -> Grant {
        let live = self.live(owner);
        let last_change = Timestamp::from_micros(last_change);
        let leases = self.lease.as_ref().expect("lease mode");
        leases.nodes[owner].server.answer(
            &leases.names[from],
            &self.w.names[key],
            ask,
            Timestamp::from_micros(EPOCH_US + now),
            last_change,
            live,
        )
    }

    /// A lease call reaches its (running) owner: the owner answers every ask in it.
    pub(super) fn lease_serve(&mut self, id: u32, now: u64) {
        let Some(call) = self.calls.get(&id) else {
            return;
        };
        let (to, from) = (usize::from(call.to), usize::from(call.from));
        let Payload::Lease(c) = &call.payload else {
            return;
        };
        let asks: Vec<(usize, Ask)> = c.asks.iter().map(|(k, _, a)| (*k as usize, *a)).collect();
        let grants = asks
            .iter()
            .map(|(key, ask)| self.grant(to, from, *key, ask, now))
            .collect();
        if let Some(Call {
            payload: Payload::Lease(c),
            ..
        }) = self.calls.get_mut(&id)
        {
            c.grants = grants;
        }
    }

    /// A lease call's answer is back at its sender, `node`, at `now`.
    pub(super) fn lease_answered(&mut self, node: usize, sent: u64, call: LeaseCall, now: u64) {
        match call.kind {
            LeaseKind::Acquire { arrival, .. } => {
                let (key, slot, _) = &call.asks[0];
                slot.answer(Some(&call.grants[0]), EPOCH_US + sent);
                // As `Leasing::acquire` does: the hit is decided at the time the ask was sent.
                let d = slot.decide_after(EPOCH_US + sent, 1);
                self.out.acquired_admitted += u64::from(!d.over);
                // Counted in the window the lease charged it to: an acquire sent at a window's
                // end may be answered with the next window's allowance.
                let name = &self.w.names[*key as usize];
                let leases = self.lease.as_ref().expect("lease mode");
                let held = leases.nodes[node].client.holding(name);
                let window = held.map_or_else(|| self.window_of(sent), |h| h.epoch);
                self.record_in(*key as usize, window, now, !d.over, now - arrival);
                self.wake(node, *key as usize, now);
            }
            LeaseKind::Renewal => {
                for ((key, slot, _), grant) in call.asks.iter().zip(&call.grants) {
                    slot.answer(Some(grant), EPOCH_US + sent);
                    self.wake(node, *key as usize, now);
                }
                self.round_done(node, now);
            }
        }
    }

    /// A lease call from `node` failed (its owner is down, already marked so).
    pub(super) fn lease_failed(&mut self, node: usize, mut call: LeaseCall, now: u64) {
        match call.kind {
            LeaseKind::Acquire { arrival, round: 0 } => {
                let (key, slot, ask) = call.asks.pop().expect("one ask");
                self.out.failed_hops += 1;
                self.acquire(node, key as usize, slot, ask, now, (arrival, 1));
            }
            LeaseKind::Acquire { .. } => {
                let (key, slot, _) = &call.asks[0];
                self.out.failed_hops += 1;
                slot.answer(None, EPOCH_US + now);
                // Both owners failed: the request gets the failure policy's answer.
                self.out.errors += 1;
                self.wake(node, *key as usize, now);
            }
            LeaseKind::Renewal => {
                for (key, slot, _) in &call.asks {
                    slot.answer(None, EPOCH_US + now);
                    self.wake(node, *key as usize, now);
                }
                self.round_done(node, now);
            }
        }
    }

    /// Decides the hits waiting on `node` for a call about `key`, now answered.
    fn wake(&mut self, node: usize, key: usize, now: u64) {
        let Some(waiting) = self.leases().nodes[node].waiters.remove(&(key as u32)) else {
            return;
        };
        for (arrival, slot) in waiting {
            let d = slot.decide_after(EPOCH_US + now, 1);
            self.record(key, now, !d.over, now - arrival);
        }
    }

    /// One renewal round of `node` at `now` (`Leasing::renew_once`).
    pub(super) fn lease_renew(&mut self, node: usize, now: u64) {
        let changes = self.ring_changes[node].0;
        let leases = self.leases();
        let n = &mut leases.nodes[node];
        n.round_at = now;
        let due = n.client.renewals(EPOCH_US + now, changes);
        let held = n.client.len() as u64;
        self.out.renewed_keys += due.len() as u64;
        self.out.held_sum += held;
        self.out.held_ticks += 1;
        self.out.held_max = self.out.held_max.max(held);
        let mut by_owner: BTreeMap<usize, Vec<(u32, Arc<Slot>, Ask)>> = BTreeMap::new();
        for (name, slot, ask) in due {
            let key = Workload::index(&name);
            let owner = self.owner(node, key);
            by_owner
                .entry(owner)
                .or_default()
                .push((key as u32, slot, ask));
        }
        for (owner, mut items) in by_owner {
            // `renewals` walks a hash map; the order of the asks is made the same every run.
            items.sort_by_key(|i| i.0);
            if owner == node {
                for (key, slot, ask) in items {
                    let grant = self.grant(node, node, key as usize, &ask, now);
                    slot.answer(Some(&grant), EPOCH_US + now);
                    self.wake(node, key as usize, now);
                }
                continue;
            }
            while !items.is_empty() {
                let rest = items.split_off(items.len().min(MAX_LEASE_ASKS));
                let asks = std::mem::replace(&mut items, rest);
                self.leases().nodes[node].outstanding += 1;
                self.out.background_calls += 1;
                let call = Call {
                    from: node as u16,
                    to: owner as u16,
                    life: self.life[node],
                    sent: now,
                    payload: Payload::Lease(LeaseCall {
                        kind: LeaseKind::Renewal,
                        asks,
                        grants: Vec::new(),
                    }),
                };
                self.send_call(call, now);
            }
        }
        if self.leases().nodes[node].outstanding == 0 {
            self.next_round(node, now);
        }
    }

    /// One of `node`'s renewal calls is back (or failed).
    fn round_done(&mut self, node: usize, now: u64) {
        let n = &mut self.leases().nodes[node];
        n.outstanding -= 1;
        if n.outstanding == 0 {
            self.next_round(node, now);
        }
    }

    /// The round is over at `now`: the next one at the next tick, or at once if it is past.
    fn next_round(&mut self, node: usize, now: u64) {
        let at = (self.leases().nodes[node].round_at + self.p.renew_us).max(now);
        let life = self.life[node];
        self.push(
            at,
            Event::Tick {
                node: node as u16,
                life,
                task: Task::Renew,
            },
        );
    }

    /// The lease server's sweep (`Leasing::sweep_forever`).
    pub(super) fn lease_sweep(&mut self, node: usize, now: u64) {
        self.leases().nodes[node]
            .server
            .sweep(Timestamp::from_micros(EPOCH_US + now));
        let life = self.life[node];
        self.push(
            now + self.p.lease_us,
            Event::Tick {
                node: node as u16,
                life,
                task: Task::Sweep,
            },
        );
    }

    /// `node` died or starts afresh: its leases, its server's state and its waiting requests
    /// are gone (those requests fail).
    pub(super) fn lease_lost(&mut self, node: usize) {
        let Some(leases) = self.lease.as_mut() else {
            return;
        };
        let fresh = LeaseNode::new(leases.timing);
        let old = std::mem::replace(&mut leases.nodes[node], fresh);
        self.out.errors += old.waiters.values().map(|w| w.len() as u64).sum::<u64>();
    }
}
