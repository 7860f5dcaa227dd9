//! Lease mode (SLUICE_CLUSTER_MODE=lease) in the simulation: every node runs Sluice's own
//! [`LeaseClient`] (a `Held` per key) and [`LeaseServer`], driven as `src/cluster/route/leased/driver.rs`
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
//! - free shares (`sluice::cluster::lease::free`, unless `--free-share-percent 0`): every
//!   Lease call's answer carries the owner's permit (`Permits::give`, its share over the
//!   peers it knows) and the recalls waiting for the caller (`Permits::take_recalls`), taken
//!   when the answer arrives, before its grants, as `Leasing::took_permit` does: recalls
//!   applied, the permit kept as the `Terms` that `route` gets for the key's owner, a new run
//!   converting what was admitted freely. A round also calls, with no asks, each owner up to
//!   which no renewal goes whose permit ends within half a lease duration
//!   (`Leasing::permits_to_renew`; a background call). The first nodes start the traffic with
//!   the permits of the minute they ran before it, so their first windows are free already;
//!   a node that starts during the run (the restart, the join) gets `started_us` then, and
//!   its windows are free from a lease duration after its first permits;
//! - a node that dies loses its leases, its free counts, its permits and its server's state
//!   (the permits it gave); it restarts with none of them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sluice::clock::Timestamp;
use sluice::cluster::lease::free::{Permit, Recall, Terms};
use sluice::cluster::lease::{
    Ask, Grant, LeaseClient, LeaseServer, LeaseTiming, MAX_LEASE_ASKS, Route, Slot,
};

use super::{Call, EPOCH_US, Event, Params, Payload, Phase, Sim, Task, Variant, Workload};

/// One node's lease state: what it holds, what it serves, its permits for free shares and its
/// renewal round.
struct LeaseNode {
    client: LeaseClient,
    server: LeaseServer,
    /// Each owner's permit for free shares, as this node last got it (`Leasing::permits`).
    permits: HashMap<usize, Terms>,
    /// When the running renewal round started, and how many of its calls are still out.
    round_at: u64,
    outstanding: u32,
    /// Hits waiting for the call under way about their key: key -> (arrival, slot).
    waiters: HashMap<u32, Vec<(u64, Arc<Slot>)>>,
}

impl LeaseNode {
    /// A node started at `started_us` (µs since the Unix epoch): its free shares apply to the
    /// windows that begin after.
    fn new(timing: LeaseTiming, started_us: u64) -> Self {
        LeaseNode {
            client: LeaseClient::with_free_shares(timing, started_us),
            server: LeaseServer::new(timing),
            permits: HashMap::new(),
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
    /// `nodes` nodes, of which the first `p.nodes` started a minute before the traffic (as
    /// their ring changes say) and renewed their permits since.
    pub(super) fn new(p: &Params, nodes: usize) -> Self {
        // The defaults, then the settings studied: a field LeaseTiming gains keeps its default.
        let mut timing = LeaseTiming::DEFAULT;
        timing.renew = Duration::from_micros(p.renew_us);
        timing.duration = Duration::from_micros(p.lease_us);
        timing.max_bytes = p.lease_max_bytes;
        timing.free_share_ppm = p.free_share_ppm;
        let started = EPOCH_US - STARTED_BEFORE_US;
        let mut leases = Leases {
            timing,
            nodes: (0..nodes)
                .map(|_| LeaseNode::new(timing, started))
                .collect(),
            names: (0..nodes).map(super::addr).collect(),
        };
        leases.warm(p.nodes);
        leases
    }

    /// The permits the first `initial` nodes hold of each other at the traffic's start: one
    /// run each, begun when they started and renewed every half lease duration since (the
    /// empty calls `Leasing::permits_to_renew` sends), the last half a lease duration ago.
    fn warm(&mut self, initial: usize) {
        let ppm = self.timing.free_share_ppm;
        if ppm == 0 {
            return;
        }
        let half = self.timing.duration_us() / 2;
        let share = ppm / initial as u64;
        for owner in 0..initial {
            for node in 0..initial {
                let mut at = EPOCH_US - STARTED_BEFORE_US;
                let mut last = None;
                while at < EPOCH_US {
                    let permits = &self.nodes[owner].server.permits;
                    last = permits.give(&self.names[node], at, share).map(|p| (at, p));
                    at += half;
                }
                if let Some((sent, p)) = last {
                    let terms = Terms {
                        since_us: p.since_us,
                        until_us: sent + p.valid_us,
                        share_ppm: p.share_ppm,
                    };
                    self.nodes[node].permits.insert(owner, terms);
                }
            }
        }
    }
}

/// How long before the traffic the first nodes started (the ring changes' minute).
const STARTED_BEFORE_US: u64 = 60_000_000;

/// One key a call asks about: the key, the slot its answer goes to, the ask.
type Asked = (u32, Arc<Slot>, Ask);

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
    asks: Vec<Asked>,
    grants: Vec<Grant>,
    /// The owner's answer beside the grants: the permit for free shares, and the recalls.
    permit: Option<Permit>,
    recalls: Vec<Recall>,
}

impl LeaseCall {
    fn new(kind: LeaseKind, asks: Vec<Asked>) -> Self {
        LeaseCall {
            kind,
            asks,
            grants: Vec::new(),
            permit: None,
            recalls: Vec::new(),
        }
    }
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
        let n = &self.lease.as_ref().expect("lease mode").nodes[node];
        // The permit of the key's owner by this node's view (`Leasing::terms`).
        let terms = || n.permits.get(&self.owner(node, key)).copied();
        let route = n
            .client
            .route(name, quota, EPOCH_US + now, 1, || live, terms);
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
            self.permit_here(node, now);
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
        let kind = LeaseKind::Acquire {
            arrival: at.0,
            round: at.1,
        };
        self.send_lease(node, owner, kind, vec![(key as u32, slot, ask)], now);
    }

    /// Sends `node`'s Lease call of `kind` carrying `asks` to `owner` at `now`.
    fn send_lease(
        &mut self,
        node: usize,
        owner: usize,
        kind: LeaseKind,
        asks: Vec<Asked>,
        now: u64,
    ) {
        let call = Call {
            from: node as u16,
            to: owner as u16,
            life: self.life[node],
            sent: now,
            payload: Payload::Lease(LeaseCall::new(kind, asks)),
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
        let (permit, recalls) = self.permit(to, from, now);
        if let Some(Call {
            payload: Payload::Lease(c),
            ..
        }) = self.calls.get_mut(&id)
        {
            c.grants = grants;
            c.permit = permit;
            c.recalls = recalls;
        }
    }

    /// `owner`'s permit for free shares to `node` at `now`, and the recalls waiting for `node`
    /// (the peer server's `lease`, `OwnerStore::permit`): its equal part of the share over the
    /// ring's size (the peers it knows). Nothing with free shares off.
    fn permit(&self, owner: usize, node: usize, now: u64) -> (Option<Permit>, Vec<Recall>) {
        let leases = self.lease.as_ref().expect("lease mode");
        let ppm = leases.timing.free_share_ppm;
        if ppm == 0 {
            return (None, Vec::new());
        }
        let ring = (0..self.alive.len())
            .filter(|&p| self.known(owner, p))
            .count();
        let permits = &leases.nodes[owner].server.permits;
        let name = &leases.names[node];
        let permit = permits.give(name, EPOCH_US + now, ppm / ring.max(1) as u64);
        let recalls = match permit {
            Some(_) => permits.take_recalls(name),
            None => Vec::new(),
        };
        (permit, recalls)
    }

    /// `node`'s own lease server answered it at `now`: its permit and recalls, at once.
    fn permit_here(&mut self, node: usize, now: u64) {
        let (permit, recalls) = self.permit(node, node, now);
        self.took_permit(node, node, now, (permit, recalls), now);
    }

    /// Keeps the permit `owner` answered to `node`'s call sent at `sent` (none: a share of 0,
    /// asked again in half a lease duration) and applies its recalls, at `now`; a new run of
    /// permits converts every key admitted freely (`Leasing::took_permit`).
    fn took_permit(
        &mut self,
        node: usize,
        owner: usize,
        sent: u64,
        (permit, recalls): (Option<Permit>, Vec<Recall>),
        now: u64,
    ) {
        let live = self.live(node);
        let leases = self.lease.as_mut().expect("lease mode");
        let valid_us = leases.timing.duration_us();
        let n = &mut leases.nodes[node];
        if n.client.free().is_none() {
            return;
        }
        self.out.recalls += recalls.len() as u64;
        for r in recalls {
            n.client
                .recall(&r.key, r.quota, r.until_us, EPOCH_US + now, live);
        }
        let p = permit.unwrap_or(Permit {
            since_us: 0,
            valid_us,
            share_ppm: 0,
        });
        let terms = Terms {
            since_us: p.since_us,
            until_us: EPOCH_US + sent + p.valid_us,
            share_ppm: p.share_ppm,
        };
        let before = n.permits.insert(owner, terms);
        if before.is_some_and(|b| b.share_ppm > 0 && b.since_us != p.since_us) {
            n.client.convert_free(EPOCH_US + sent, live);
        }
    }

    /// A lease call's answer from `owner` is back at its sender, `node`, at `now`: the permit
    /// and recalls it answered are taken first, as `Leasing::send` does.
    pub(super) fn lease_answered(
        &mut self,
        (node, owner): (usize, usize),
        sent: u64,
        mut call: LeaseCall,
        now: u64,
    ) {
        let permit = call.permit.take();
        let recalls = std::mem::take(&mut call.recalls);
        self.took_permit(node, owner, sent, (permit, recalls), now);
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
        let due = n.client.renewals(EPOCH_US + now, changes, 3);
        let held = n.client.len() as u64;
        self.out.renewed_keys += due.len() as u64;
        self.out.held_sum += held;
        self.out.held_ticks += 1;
        self.out.held_max = self.out.held_max.max(held);
        let mut by_owner: BTreeMap<usize, Vec<Asked>> = BTreeMap::new();
        for (name, slot, ask) in due {
            let key = Workload::index(&name);
            let owner = self.owner(node, key);
            by_owner
                .entry(owner)
                .or_default()
                .push((key as u32, slot, ask));
        }
        let refresh = self.permits_to_renew(node, now, &by_owner);
        for (owner, items) in by_owner {
            self.send_renewals(node, owner, items, now);
        }
        for owner in refresh {
            self.send_renewals(node, owner, Vec::new(), now);
        }
        if self.leases().nodes[node].outstanding == 0 {
            self.next_round(node, now);
        }
    }

    /// Sends `node`'s renewals of `items` to `owner` at `now`, in calls of at most
    /// [`MAX_LEASE_ASKS`] asks (none: one empty call, for the permit alone), answered at once
    /// when `node` owns them. Every call off the request path is a background call.
    fn send_renewals(&mut self, node: usize, owner: usize, mut items: Vec<Asked>, now: u64) {
        // `renewals` walks a hash map; the order of the asks is made the same every run.
        items.sort_by_key(|i| i.0);
        if owner == node {
            let grants: Vec<Grant> = items
                .iter()
                .map(|(key, _, ask)| self.grant(node, node, *key as usize, ask, now))
                .collect();
            self.permit_here(node, now);
            for ((key, slot, _), grant) in items.into_iter().zip(grants) {
                slot.answer(Some(&grant), EPOCH_US + now);
                self.wake(node, key as usize, now);
            }
            return;
        }
        loop {
            let rest = items.split_off(items.len().min(MAX_LEASE_ASKS));
            let asks = std::mem::replace(&mut items, rest);
            self.leases().nodes[node].outstanding += 1;
            self.out.background_calls += 1;
            self.send_lease(node, owner, LeaseKind::Renewal, asks, now);
            if items.is_empty() {
                return;
            }
        }
    }

    /// The owners `node`'s round at `now` calls only for its permit
    /// (`Leasing::permits_to_renew`): those it believes up (itself included) that it holds
    /// no permit of or whose permit ends within half a lease duration, and that no renewal
    /// goes to this round. None with free shares off.
    fn permits_to_renew(
        &mut self,
        node: usize,
        now: u64,
        calls: &BTreeMap<usize, Vec<Asked>>,
    ) -> Vec<usize> {
        let leases = self.lease.as_ref().expect("lease mode");
        let n = &leases.nodes[node];
        if n.client.free().is_none() {
            return Vec::new();
        }
        let half = leases.timing.duration_us() / 2;
        (0..self.alive.len())
            .filter(|&i| self.view[node][i] && !calls.contains_key(&i))
            .filter(|i| {
                n.permits
                    .get(i)
                    .is_none_or(|t| t.until_us.saturating_sub(EPOCH_US + now) < half)
            })
            .collect()
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
    pub(super) fn lease_lost(&mut self, node: usize, now: u64) {
        let Some(leases) = self.lease.as_mut() else {
            return;
        };
        let fresh = LeaseNode::new(leases.timing, EPOCH_US + now);
        let old = std::mem::replace(&mut leases.nodes[node], fresh);
        self.out.errors += old.waiters.values().map(|w| w.len() as u64).sum::<u64>();
        self.out.free_decisions += free_decisions(&old.client);
    }

    /// At the run's end: the free decisions of the nodes still holding theirs.
    pub(super) fn lease_finish(&mut self) {
        if let Some(leases) = &self.lease {
            let free: u64 = leases.nodes.iter().map(|n| free_decisions(&n.client)).sum();
            self.out.free_decisions += free;
        }
    }
}

/// The hits `client` decided from free shares.
fn free_decisions(client: &LeaseClient) -> u64 {
    client.free().map_or(0, |f| {
        f.decisions.load(std::sync::atomic::Ordering::Relaxed)
    })
}
